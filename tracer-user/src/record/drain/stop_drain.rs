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
//!
//! The process may be hostile (its RW areas are its own memory): the work is bounded
//! ([`Budget`]: slots walked per process, single steps per thread and in all, bytes
//! buffered, a deadline), a slot's buffer is no larger than its RW header says buffers
//! are, and what was given up is counted and said.
//!
//! `Budget`'s figures: 2^20 slots walked per process, 100,000 single steps per thread and
//! 200,000 in all, 128 MiB of records, 5 s (test
//! `trust_limits::the_stop_drain_of_a_hostile_process_is_bounded`). Not run with a filter in
//! force: it would have to judge the records as the eBPF drain does.

use std::collections::{HashMap as StdHashMap, HashSet};
use std::time::{Duration, Instant};

use aya::{Ebpf, maps::HashMap};
use tracer_common::{
    BUF_TRACE, CAUSE_STOP, CHUNK_KIND_RECORDS, ChunkHeader, KEY_CLAIMING, KEY_FREE, KEY_TOMBSTONE,
    RECORD_SIZE, RECORD_TIME_OFF, RW_MAGIC, RwHeader, SLOT_SIZE, SLOTS_OFF, Slot,
    ebpf::MAP_DRAINED,
};

use super::{
    remote::{ptrace, read_mem},
    target_data::{Encoded, SlotSpan, encode_records, slot_span_within},
};
use crate::record::host::clock;

/// Single steps allowed to finish the records one thread was writing (a stub is tens of
/// instructions; a signal handler that records may run in between).
const MAX_STEPS: u32 = 100_000;
/// Single steps in all, over every thread.
const MAX_STEPS_TOTAL: u32 = 200_000;
/// More slots than any rewriter makes: a header claiming more is not believed. Also
/// the most slots walked per process, over all its RW areas.
const MAX_SLOTS: u32 = 1 << 20;
/// Bytes of records buffered for the file in all.
const MAX_BYTES: u64 = 128 << 20;
/// How long the whole collection may take.
const DEADLINE: Duration = Duration::from_secs(5);
/// Slots read with one system call while walking an RW area.
const SLOT_BATCH: u64 = 4096;

/// What the stop drain gave up on, to stay bounded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct GivenUp {
    /// Slots not looked at (past [`MAX_SLOTS`] per process, or past the deadline).
    pub slots: u64,
    /// Threads whose record in progress was left out (their steps ran out).
    pub unsettled: u64,
    /// Bytes of records not collected (past [`MAX_BYTES`]).
    pub bytes: u64,
}

impl GivenUp {
    fn any(&self) -> bool {
        *self != GivenUp::default()
    }
}

/// What the collection may still spend.
struct Budget {
    slots: u64,
    steps: u32,
    /// Steps left per thread.
    thread_steps: StdHashMap<u32, u32>,
    bytes: u64,
    until: Instant,
}

impl Budget {
    fn new() -> Budget {
        Budget {
            slots: u64::from(MAX_SLOTS),
            steps: MAX_STEPS_TOTAL,
            thread_steps: StdHashMap::new(),
            bytes: MAX_BYTES,
            until: Instant::now() + DEADLINE,
        }
    }
    /// One single step of `tid`, if both its own and the total allow it.
    fn step(&mut self, tid: u32) -> bool {
        let left = self.thread_steps.entry(tid).or_insert(MAX_STEPS);
        if *left == 0 || self.steps == 0 || Instant::now() >= self.until {
            return false;
        }
        *left -= 1;
        self.steps -= 1;
        true
    }
    fn out_of_time(&self) -> bool {
        Instant::now() >= self.until
    }
}

/// The threads of a process, stopped.
pub(crate) struct Frozen {
    pid: u32,
    tids: Vec<u32>,
}

/// What [`Frozen::collect`] found.
#[derive(Default)]
pub(crate) struct Collected {
    /// Chunk sections for the trace file.
    pub sections: Vec<u8>,
    pub encoded: Encoded,
    pub threads: HashSet<(u32, u32)>,
    pub given_up: GivenUp,
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
    pub(crate) fn freeze(pid: u32) -> Option<Frozen> {
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

    /// Let `slot`'s thread finish the record it is writing, if it is writing one, within
    /// the budget's steps.
    fn settle(&self, slot_addr: u64, tid: u32, budget: &mut Budget) -> bool {
        let inflight = |pid: u32| {
            let mut b = [0u8; 8];
            let at = slot_addr + core::mem::offset_of!(Slot, inflight) as u64;
            read_mem(pid, at, &mut b).map_or(1, |()| u64::from_le_bytes(b))
        };
        loop {
            if inflight(self.pid) == 0 {
                return true;
            }
            if !budget.step(tid) {
                return false;
            }
            if ptrace(libc::PTRACE_SINGLESTEP, tid, 0).is_err() || !wait_stop(tid) {
                return false;
            }
        }
    }

    /// The records the process's slots in the RW areas at `rw_bases` hold past their
    /// last drain (`write_user`: drains reset the slot, so from its start).
    pub(crate) fn collect(&self, rw_bases: &[u64], ebpf: &Ebpf, write_user: bool) -> Collected {
        let drained: Option<HashMap<_, [u64; 2], [u64; 2]>> = ebpf
            .map(MAP_DRAINED)
            .and_then(|m| HashMap::try_from(m).ok());
        let mut out = Collected::default();
        let mut budget = Budget::new();
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
            let area = Area {
                rw,
                nslots: u64::from(h.nslots),
                ring: h.buf_kind != BUF_TRACE,
                buf_bytes: h.buf_bytes,
            };
            self.collect_area(&area, &drained, write_user, &mut budget, &mut out);
        }
        if out.given_up.any() {
            let g = &out.given_up;
            eprintln!(
                "utrace: warning: the stop drain of process {} gave up on {} slots, {} records \
                 being written and {} bytes of records (bounds: {MAX_SLOTS} slots, {MAX_STEPS} \
                 steps per thread, {MAX_BYTES} bytes, {DEADLINE:?})",
                self.pid, g.slots, g.unsettled, g.bytes
            );
        }
        out
    }

    /// The slots of one RW area, read a batch at a time, within the budget.
    fn collect_area(
        &self,
        area: &Area,
        drained: &Option<HashMap<&aya::maps::MapData, [u64; 2], [u64; 2]>>,
        write_user: bool,
        budget: &mut Budget,
        out: &mut Collected,
    ) {
        let mut batch = Vec::new();
        let mut i = 1;
        while i < area.nslots {
            let n = SLOT_BATCH.min(area.nslots - i);
            if budget.out_of_time() || budget.slots < n {
                out.given_up.slots += area.nslots - i;
                return;
            }
            budget.slots -= n;
            batch.resize((n * SLOT_SIZE) as usize, 0);
            let first = area.rw + SLOTS_OFF + i * SLOT_SIZE;
            if read_mem(self.pid, first, &mut batch).is_ok() {
                for (k, raw) in batch.chunks_exact(SLOT_SIZE as usize).enumerate() {
                    if !self.owned(raw) {
                        continue;
                    }
                    let addr = first + k as u64 * SLOT_SIZE;
                    let from = |slot: &Slot| match drained {
                        Some(m) if !write_user => delivered_up_to(self.pid, m, addr, slot),
                        _ => None,
                    };
                    self.collect_slot(addr, area, from, budget, out);
                }
            }
            i += n;
        }
    }

    /// Whether the slot in `raw` belongs to one of the frozen threads.
    fn owned(&self, raw: &[u8]) -> bool {
        // SAFETY: Slot is repr(C) plain data of exactly SLOT_SIZE bytes (`raw`'s length).
        let slot: Slot = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        !matches!(slot.key, KEY_FREE | KEY_TOMBSTONE | KEY_CLAIMING)
            && self.tids.contains(&slot.owner_tid)
    }

    fn collect_slot(
        &self,
        addr: u64,
        area: &Area,
        from: impl Fn(&Slot) -> Option<u64>,
        budget: &mut Budget,
        out: &mut Collected,
    ) {
        let ring = area.ring;
        let mut raw = [0u8; SLOT_SIZE as usize];
        if read_mem(self.pid, addr, &mut raw).is_err() || !self.owned(&raw) {
            return;
        }
        // SAFETY: Slot is repr(C) plain data of exactly SLOT_SIZE bytes.
        let slot: Slot = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        let tid = slot.owner_tid;
        let settled = self.settle(addr, tid, budget);
        if !settled {
            out.given_up.unsettled += 1;
        }
        // The cursor as it is now that the record is complete.
        let mut slot = slot;
        let mut again = [0u8; SLOT_SIZE as usize];
        if read_mem(self.pid, addr, &mut again).is_ok() {
            // SAFETY: as above.
            slot = unsafe { std::ptr::read_unaligned(again.as_ptr().cast()) };
        }
        let max = if ring && area.buf_bytes == 0 {
            tracer_common::FAST_RING_BYTES
        } else {
            area.buf_bytes
        };
        let SlotSpan::Collect { bytes, rotate } = slot_span_within(&slot, tid, ring, max) else {
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
        if len > budget.bytes {
            out.given_up.bytes += len;
            return;
        }
        budget.bytes -= len;
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

/// One RW area of the process, as its header describes it.
struct Area {
    rw: u64,
    nslots: u64,
    ring: bool,
    /// Bytes of one buffer.
    buf_bytes: u64,
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
