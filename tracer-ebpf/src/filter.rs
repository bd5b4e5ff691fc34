//! In-kernel filters (`tracer_common::filter`): the per-thread tests of a drain, the
//! per-record tests, and the thread-name announcements (`CHUNK_KIND_COMM`).
//!
//! Thread names: every drain checks the thread's `comm` against `COMMS` and sends a
//! `CHUNK_KIND_COMM` entry when it is new or changed (a comm section in the file).

use aya_ebpf::helpers::{
    bpf_get_current_comm, bpf_get_current_uid_gid, generated::bpf_get_current_cgroup_id,
};
use tracer_common::{
    CHUNK_KIND_COMM, ChunkHeader, FLAG_MEM_PAIR, FLAG_USDT_MORE, Record,
    filter::{
        COMM_LEN, F_CGROUP, F_COMM, F_PER_RECORD, F_PER_THREAD, F_PID, F_SAMPLE, F_SITES, F_TID,
        F_UID, F_VALUE, FilterConfig, ID_PID, ID_TID, id_key, site_key,
    },
};

use crate::{
    atomic,
    maps::{COMMS, EVENTS, FILTER, FILTER_ACTIVE, FILTER_IDS, FILTER_SITES, RecordFilter, SCRATCH},
};

/// The configuration in force and its generation (`FILTER` index), if any test is on.
#[inline(always)]
pub(crate) fn active() -> Option<(*const FilterConfig, u32)> {
    let generation = FILTER_ACTIVE.get(0).copied().unwrap_or(0) & 1;
    let cfg = FILTER.get_ptr(generation)?;
    // SAFETY: a live map value.
    (unsafe { (*cfg).flags } != 0).then_some((cfg, generation))
}

/// Whether the current thread passes the per-thread tests of `cfg`.
#[inline(never)]
pub(crate) fn thread_passes(cfg: &FilterConfig, pid_tid: u64) -> bool {
    let f = cfg.flags & F_PER_THREAD;
    if f == 0 {
        return true;
    }
    let (pid, tid) = ((pid_tid >> 32) as u32, pid_tid as u32);
    if f & F_PID != 0 && FILTER_IDS.get_ptr(id_key(ID_PID, pid)).is_none() {
        return false;
    }
    if f & F_TID != 0 && FILTER_IDS.get_ptr(id_key(ID_TID, tid)).is_none() {
        return false;
    }
    if f & F_UID != 0 && bpf_get_current_uid_gid() as u32 != cfg.uid {
        return false;
    }
    // SAFETY: no preconditions.
    if f & F_CGROUP != 0 && unsafe { bpf_get_current_cgroup_id() } != cfg.cgroup {
        return false;
    }
    if f & F_COMM != 0 {
        let c = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
        let word = |w: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&c[w * 8..w * 8 + 8]);
            u64::from_le_bytes(a)
        };
        let comm = [word(0), word(1)];
        let n = cfg.ncomm as usize;
        let any = (n > 0 && cfg.comm_matches(0, &comm))
            || (n > 1 && cfg.comm_matches(1, &comm))
            || (n > 2 && cfg.comm_matches(2, &comm))
            || (n > 3 && cfg.comm_matches(3, &comm));
        if !any {
            return false;
        }
    }
    true
}

/// Whether site `site` is selected (`FILTER_SITES`), through the one-word cache. Not
/// inlined: the values a map lookup keeps across it, twice over (a pair's two sites),
/// would grow the per-record callback's frame past the verifier's 512-byte chain.
#[inline(never)]
fn site_selected(f: &mut RecordFilter, site: u32) -> bool {
    let word = (site / 64) as u64 + 1;
    if f.word != word {
        // The key in the scratch, not on the stack: the drain's call chain is nearly
        // at the verifier's 512 bytes.
        f.key = site_key(f.binary_id, f.generation as u32, site);
        f.bits = match FILTER_SITES.get_ptr(&f.key) {
            // SAFETY: a live map value, read at once.
            Some(p) => unsafe { *p },
            None => 0,
        };
        f.word = word;
    }
    f.bits & (1u64 << (site % 64)) != 0
}

/// Whether record `r` passes the per-record tests. A memory pair (`FLAG_MEM_PAIR`,
/// sites `s` and `s + 1`) is kept whole when either access passes the site and value
/// tests; the second site costs a map lookup only when it starts the next word.
#[inline(always)]
pub(crate) fn record_passes(f: &mut RecordFilter, r: &Record) -> bool {
    if r.flags & FLAG_USDT_MORE != 0 {
        return f.last_keep != 0;
    }
    let pair = r.flags & FLAG_MEM_PAIR != 0;
    let flags = f.cfg.flags & F_PER_RECORD;
    let mut keep = true;
    if flags & F_SITES != 0 {
        keep = site_selected(f, r.site) || (pair && site_selected(f, r.site.wrapping_add(1)));
    }
    if keep && flags & F_VALUE != 0 {
        let (lo, hi) = (f.cfg.value_min, f.cfg.value_max);
        keep = (r.value >= lo && r.value <= hi) || (pair && r.aux >= lo && r.aux <= hi);
    }
    if keep && flags & F_SAMPLE != 0 && f.cfg.sample > 1 {
        f.sampled += 1;
        keep = f.sampled.is_multiple_of(f.cfg.sample);
    }
    f.last_keep = keep as u64;
    keep
}

/// Comm announcement as it goes into the ring buffer.
#[repr(C)]
struct CommChunk {
    header: ChunkHeader,
    comm: [u8; COMM_LEN],
}

/// Tell the tracer the current thread's name if it has not been told it yet (or it
/// changed): a `CHUNK_KIND_COMM` entry before the thread's records.
#[inline(never)]
pub(crate) fn announce_comm(pid_tid: u64, binary_id: u64, time: u64) {
    let comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    if let Some(known) = COMMS.get_ptr(pid_tid) {
        // SAFETY: a live map value, copied at once.
        if unsafe { *known } == comm {
            return;
        }
    }
    let Some(mut entry) = EVENTS.reserve::<CommChunk>(0) else {
        // Try again at the next drain.
        return;
    };
    // No sequence number: readers count chunks of records against the numbers issued.
    let chunk = CommChunk {
        header: ChunkHeader::new(CHUNK_KIND_COMM, pid_tid, binary_id, 0, time),
        comm,
    };
    // SAFETY: the reservation has room for one CommChunk.
    unsafe { entry.as_mut_ptr().write(chunk) };
    entry.submit(0);
    let _ = COMMS.insert(pid_tid, comm, 0);
}

/// The filters for a record emitted at a uprobe site (its thread, then its site and
/// value), evaluated in the per-CPU scratch. Kept when the scratch is held by a
/// preempted drain on this CPU (it cannot be evaluated then; rare).
#[inline(never)]
pub(crate) fn uprobe_record_passes(pid_tid: u64, binary_id: u64, site: u32, value: u64) -> bool {
    let Some((cfg, generation)) = active() else {
        return true;
    };
    // SAFETY: a live FILTER value.
    let cfg = unsafe { &*cfg };
    if !thread_passes(cfg, pid_tid) {
        return false;
    }
    if cfg.flags & F_PER_RECORD == 0 {
        return true;
    }
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: this CPU's scratch, taken with its busy flag.
    unsafe {
        if atomic::cmpxchg(&raw mut (*s).busy, 0, 1) != 0 {
            return true;
        }
        let f = &mut (*s).filter;
        f.cfg = *cfg;
        f.generation = generation as u64;
        f.binary_id = binary_id;
        f.word = 0;
        let r = Record {
            site,
            flags: 0,
            time: 0,
            value,
            aux: 0,
        };
        let keep = record_passes(f, &r);
        (*s).busy = 0;
        keep
    }
}
