//! Maps, globals and the small helpers around them.

use aya_ebpf::{
    Global,
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use tracer_common::{
    RW_MAGIC, STAT_COUNT,
    ebpf::{
        DEFAULT_FILTER_SITE_WORDS, DEFAULT_RING_BYTES, MAX_BINARIES, MAX_DRAINED, MAX_EXIT_WORK,
        MAX_FILTER_IDS, MAX_PROCESSES, MAX_TARGETS, TABLE_BINARIES,
    },
    filter::{COMM_LEN, FilterConfig},
    operand::OperandSet,
};

use crate::{atomic, drain::Scratch, tables::ExitWork, user::read_user};

/// Exit drains in progress, by pid_tid (see `tables::ExitWork`).
#[map]
pub static EXIT_WORK: HashMap<u64, ExitWork> = HashMap::with_max_entries(MAX_EXIT_WORK, 0);

/// Entry 0: the `exit_step` program (set by the loader).
#[map]
pub static EXIT_STEPS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The two filter configurations (see `tracer_common::filter`).
#[map]
pub static FILTER: Array<FilterConfig> = Array::with_max_entries(2, 0);

/// Which `FILTER` entry is in force.
#[map]
pub static FILTER_ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

/// `filter::id_key(..)` → 1: the pids and tids that pass.
#[map]
pub static FILTER_IDS: HashMap<u64, u8> = HashMap::with_max_entries(MAX_FILTER_IDS, 0);

/// `filter::site_key(..)` → 64 bits, one per site: the sites that pass (size set by
/// the loader).
#[map]
pub static FILTER_SITES: HashMap<[u64; 2], u64> =
    HashMap::with_max_entries(DEFAULT_FILTER_SITE_WORDS, 0);

/// pid_tid → the thread name last announced (`CHUNK_KIND_COMM`).
#[map]
pub static COMMS: LruHashMap<u64, [u8; COMM_LEN]> = LruHashMap::with_max_entries(MAX_TARGETS, 0);

/// Per-CPU scratch of filtered drains.
#[map]
pub static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Chunks for the tracer (size overridden by the loader, `--ring-bytes`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// One counter: the sequence number of the next chunk.
#[map]
pub static SEQ: Array<u64> = Array::with_max_entries(1, 0);

/// Per-CPU counters indexed by `STAT_*`.
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// tgid → rw_bases of the instrumented binaries registered in that process.
#[map]
pub static TABLES: HashMap<u32, [u64; TABLE_BINARIES]> =
    HashMap::with_max_entries(MAX_PROCESSES, 0);

/// pid_tid → 1: the thread's exit() drain delivered everything (`tables::exit_step`);
/// its `task_exit` skips the fallback drain.
#[map]
pub static EXIT_DRAINED: LruHashMap<u64, u8> = LruHashMap::with_max_entries(MAX_TARGETS, 0);

/// The traced processes.
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TARGETS, 0);

/// Binary ordinal (high half of a site cookie) → binary_id.
#[map]
pub static BINARIES: Array<u64> = Array::with_max_entries(MAX_BINARIES, 0);

/// operand_key(binary ordinal, site id) → where a uprobe memory or USDT site's values
/// are; filled by the loader, which also sizes the map (one entry per such site).
#[map]
pub static OPERANDS: HashMap<u64, OperandSet> = HashMap::with_max_entries(1, 0);

/// [tgid, slot address] → [position, stamp]: how far the slot's buffer has been
/// delivered, for kernels where the programs cannot write user memory (see
/// `slots::delivered_up_to`).
#[map]
pub static DRAINED: LruHashMap<[u64; 2], [u64; 2]> = LruHashMap::with_max_entries(MAX_DRAINED, 0);

/// 1 = bpf_probe_write_user is allowed (no kernel lockdown): slots are reset and
/// tombstoned in place. 0 = positions are kept in DRAINED instead.
#[unsafe(no_mangle)]
pub static WRITE_USER: Global<u8> = Global::new(0);

/// Offset of the thread pointer in `task_struct` (x86-64 `thread.fsbase`, AArch64
/// `thread.uw.tp_value`), from BTF by the loader. 0 = unknown: no slot lookups by
/// thread pointer (flush still works, it gets the slot in a register).
#[unsafe(no_mangle)]
pub static FSBASE_OFFSET: Global<u64> = Global::new(0);

/// 1 = trace every process that runs an instrumented binary (TARGETS not consulted).
#[unsafe(no_mangle)]
pub static SYSTEM_WIDE: Global<u8> = Global::new(0);

/// Offset of `child_pid` in the sched_process_fork record (from its tracefs format).
#[unsafe(no_mangle)]
pub static FORK_CHILD_PID_OFF: Global<u32> = Global::new(20);

/// Offset of `group_dead` in the sched_process_exit record; 0 when the kernel lacks it.
#[unsafe(no_mangle)]
pub static EXIT_GROUP_DEAD_OFF: Global<u32> = Global::new(0);

/// Errors of [`remember_rw_base`], reported by the caller.
pub const E_TABLE_FULL: i64 = -1000;
pub const E_BAD_RW: i64 = -1001;

#[inline(always)]
pub fn stat_add(index: u32, n: u64) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU array value. Atomic all the same: a program may be
        // preempted by another on the same CPU (sleepable ones, PREEMPT_RCU), and the
        // books must balance exactly.
        unsafe { atomic::fetch_add(p, n) };
    }
}

/// Sequence number for the next chunk; shared by all CPUs, so an atomic add.
#[inline(always)]
pub fn next_seq() -> u64 {
    match SEQ.get_ptr_mut(0) {
        // SAFETY: the map value is a live, 8-byte aligned u64 for the map's lifetime.
        Some(p) => unsafe { atomic::fetch_add(p, 1) },
        None => 0,
    }
}

#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    SYSTEM_WIDE.load() != 0 || TARGETS.get_ptr(tgid).is_some()
}

/// Record that process `tgid` has an instrumented binary whose RW area is at `rw_base`.
/// Called on every flush (cheap when already known), so a process that was running
/// before the session started is learned at its first flush.
#[inline(never)]
pub fn remember_rw_base(tgid: u32, rw_base: u64) -> i64 {
    if let Some(p) = TABLES.get_ptr(tgid) {
        // SAFETY: p points at a live TABLES value.
        let known = unsafe { *p };
        for v in known {
            if v == rw_base {
                return 0;
            }
        }
    }
    // New: make sure it is an RW area before trusting it.
    if read_user::<u64>(rw_base) != Ok(RW_MAGIC) {
        return E_BAD_RW;
    }
    if TABLES.get_ptr(tgid).is_none() {
        let mut v = [0u64; TABLE_BINARIES];
        v[0] = rw_base;
        if TABLES.insert(tgid, v, BPF_NOEXIST as u64).is_ok() {
            return 0;
        }
        // Lost a race with another thread of the process: add to its entry below.
    }
    let Some(p) = TABLES.get_ptr_mut(tgid) else {
        return E_TABLE_FULL;
    };
    for i in 0..TABLE_BINARIES {
        // SAFETY: p points at TABLE_BINARIES u64s of a live map value; i is in bounds.
        let old = unsafe { atomic::cmpxchg(p.cast::<u64>().add(i), 0, rw_base) };
        if old == 0 || old == rw_base {
            return 0;
        }
    }
    E_TABLE_FULL
}
