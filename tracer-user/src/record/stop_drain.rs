//! `record -p PID` ended before the process did (Ctrl-C, `--duration`): the records its
//! live threads still hold in their buffers are collected, as their exit drains would
//! have, so that the trace ends with everything recorded up to the stop.
//!
//! 1. [`Frozen::freeze`], before the session stops: every thread of the process is
//!    ptrace-seized and interrupted (invisible to the program); one caught inside a
//!    stub (its slot's `inflight` non-zero: a record reserved, not yet written) is
//!    single-stepped until the record is complete.
//! 2. The session stops (`teardown::stop`): no drain runs any more, and the frozen
//!    threads cannot reset their buffers.
//! 3. [`Frozen::collect`]: each slot of the process's RW areas owned by one of its
//!    threads, from where the last drain stopped (its `DRAINED` position while the
//!    record before it is still the one delivered, as the eBPF drain decides) to its
//!    cursor; a circular buffer whole. They go to the file as chunks of cause
//!    `CAUSE_STOP` and into the books as produced and delivered.
//! 4. Dropping [`Frozen`] detaches: the threads run on, their buffers untouched.
//!
//! A process that cannot be ptraced (another tracer, Yama) keeps its records; the
//! tracer says so.

use std::collections::HashSet;

use aya::{Ebpf, maps::HashMap};
use tracer_common::{
    BUF_TRACE, CAUSE_STOP, CHUNK_KIND_RECORDS, ChunkHeader, KEY_CLAIMING, KEY_FREE, KEY_TOMBSTONE,
    RECORD_SIZE, RECORD_TIME_OFF, RW_MAGIC, RwHeader, SLOT_SIZE, SLOTS_OFF, Slot,
    ebpf::MAP_DRAINED,
};

use crate::record::{
    host::clock,
    remote::{ptrace, read_mem},
    target_data::{Encoded, SlotSpan, encode_records, slot_span},
};

/// Single steps allowed to finish a record a thread was writing.
const MAX_STEPS: u32 = 100_000;
/// More slots than any rewriter makes: a header claiming more is not believed.
const MAX_SLOTS: u32 = 1 << 20;

/// The threads of a process, stopped.
pub(super) struct Frozen {
    pid: u32,
    tids: Vec<u32>,
}

/// What [`Frozen::collect`] found.
#[derive(Default)]
pub(super) struct Collected {
    /// Chunk sections for the trace file.
    pub sections: Vec<u8>,
    pub encoded: Encoded,
    pub threads: HashSet<(u32, u32)>,
}

fn threads_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Wait for a ptrace stop of `tid`; false if it did not stop (it exited).
fn wait_stop(tid: u32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid writes only the status integer we own.
    let r = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
    r == tid as libc::pid_t && libc::WIFSTOPPED(status)
}

impl Frozen {
    /// Stop every thread of `pid`; None (after saying why) if it cannot be ptraced.
    pub(super) fn freeze(pid: u32) -> Option<Frozen> {
        let mut f = Frozen {
            pid,
            tids: Vec::new(),
        };
        for tid in threads_of(pid) {
            match ptrace(libc::PTRACE_SEIZE, tid, 0) {
                Ok(()) => f.tids.push(tid),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    eprintln!(
                        "utrace: warning: cannot stop process {pid} (ptrace: {e}): the records \
                         still in its threads' buffers are not collected"
                    );
                    return None;
                }
            }
        }
        f.tids
            .retain(|&t| ptrace(libc::PTRACE_INTERRUPT, t, 0).is_ok() && wait_stop(t));
        Some(f)
    }

    /// Let `slot`'s thread finish the record it is writing, if it is writing one.
    fn settle(&self, slot_addr: u64, tid: u32) -> bool {
        let inflight = |pid: u32| {
            let mut b = [0u8; 8];
            let at = slot_addr + core::mem::offset_of!(Slot, inflight) as u64;
            read_mem(pid, at, &mut b).map_or(1, |()| u64::from_le_bytes(b))
        };
        for _ in 0..MAX_STEPS {
            if inflight(self.pid) == 0 {
                return true;
            }
            if ptrace(libc::PTRACE_SINGLESTEP, tid, 0).is_err() || !wait_stop(tid) {
                return false;
            }
        }
        inflight(self.pid) == 0
    }

    /// The records the process's slots in the RW areas at `rw_bases` hold past their
    /// last drain (`write_user`: drains reset the slot, so from its start).
    pub(super) fn collect(&self, rw_bases: &[u64], ebpf: &Ebpf, write_user: bool) -> Collected {
        let drained: Option<HashMap<_, [u64; 2], [u64; 2]>> = ebpf
            .map(MAP_DRAINED)
            .and_then(|m| HashMap::try_from(m).ok());
        let mut out = Collected::default();
        for &rw in rw_bases {
            let mut raw = [0u8; core::mem::size_of::<RwHeader>()];
            if read_mem(self.pid, rw, &mut raw).is_err() {
                continue;
            }
            // SAFETY: RwHeader is repr(C) plain data of exactly this many bytes.
            let h: RwHeader = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
            if h.magic != RW_MAGIC || h.nslots > MAX_SLOTS {
                continue;
            }
            for i in 1..u64::from(h.nslots) {
                let addr = rw + SLOTS_OFF + i * SLOT_SIZE;
                let from = |slot: &Slot| match &drained {
                    Some(m) if !write_user => delivered_up_to(self.pid, m, addr, slot),
                    _ => None,
                };
                self.collect_slot(addr, h.buf_kind != BUF_TRACE, from, &mut out);
            }
        }
        out
    }

    fn collect_slot(
        &self,
        addr: u64,
        ring: bool,
        from: impl Fn(&Slot) -> Option<u64>,
        out: &mut Collected,
    ) {
        let mut raw = [0u8; SLOT_SIZE as usize];
        if read_mem(self.pid, addr, &mut raw).is_err() {
            return;
        }
        // SAFETY: Slot is repr(C) plain data of exactly SLOT_SIZE bytes.
        let slot: Slot = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        let tid = slot.owner_tid;
        if matches!(slot.key, KEY_FREE | KEY_TOMBSTONE | KEY_CLAIMING) || !self.tids.contains(&tid)
        {
            return;
        }
        let settled = self.settle(addr, tid);
        // The cursor as it is now that the record is complete.
        let mut slot = slot;
        let mut again = [0u8; SLOT_SIZE as usize];
        if read_mem(self.pid, addr, &mut again).is_ok() {
            // SAFETY: as above.
            slot = unsafe { std::ptr::read_unaligned(again.as_ptr().cast()) };
        }
        let SlotSpan::Collect { bytes, rotate } = slot_span(&slot, tid, ring) else {
            return;
        };
        let (start, mut len) = match (ring, from(&slot)) {
            (false, Some(pos)) => (pos, slot.cur - pos),
            _ => (slot.start, bytes),
        };
        // A record still being written is left out, never read half-written.
        if !settled && !ring {
            len = len.saturating_sub(RECORD_SIZE as u64);
        }
        if len == 0 {
            return;
        }
        let mut records = vec![0u8; len as usize];
        if read_mem(self.pid, start, &mut records).is_err() {
            return;
        }
        if ring {
            records.rotate_left(rotate as usize);
        }
        let h = ChunkHeader::new(
            CHUNK_KIND_RECORDS,
            (u64::from(self.pid) << 32) | u64::from(tid),
            slot.binary_id,
            CAUSE_STOP,
            clock::monotonic_ns(),
        );
        let n = encode_records(h, &records, &mut out.sections);
        out.encoded.records += n.records;
        out.encoded.chunks += n.chunks;
        out.encoded.bad += n.bad;
        out.threads.insert((self.pid, tid));
    }
}

/// Where the last drain of the slot at `addr` stopped, while the record before that
/// position is still the one it delivered (the eBPF `slots::delivered_up_to`).
fn delivered_up_to(
    pid: u32,
    drained: &HashMap<&aya::maps::MapData, [u64; 2], [u64; 2]>,
    addr: u64,
    slot: &Slot,
) -> Option<u64> {
    let [pos, stamp] = drained.get(&[u64::from(pid), addr], 0).ok()?;
    if pos <= slot.start || pos > slot.cur {
        return None;
    }
    let mut b = [0u8; 8];
    read_mem(pid, pos - RECORD_SIZE as u64 + RECORD_TIME_OFF, &mut b).ok()?;
    (u64::from_le_bytes(b) == stamp).then_some(pos)
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &t in &self.tids {
            let _ = ptrace(libc::PTRACE_DETACH, t, 0);
        }
    }
}
