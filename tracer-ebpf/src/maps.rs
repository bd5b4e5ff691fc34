//! Maps and globals of the eBPF object, and the types of their values: declarations
//! only (the loader finds them by the names in `tracer_common::ebpf`), no logic, so that
//! every other module can depend on this one.
//!
//! So the map value types live here too (`RecordFilter`, `ExitWork`, `Scratch`): this
//! module imports nothing above it.

use aya_ebpf::{
    Global,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use tracer_common::{
    ChunkHeader, Record, STAT_COUNT,
    duration::CallStack,
    ebpf::{
        DEFAULT_FILTER_SITE_WORDS, DEFAULT_RING_BYTES, MAX_BINARIES, MAX_DRAINED, MAX_EXIT_WORK,
        MAX_FILTER_IDS, MAX_PROCESSES, MAX_STRING_SITES, MAX_STRINGS, MAX_TARGETS,
        STRING_PROBE_BYTES, TABLE_BINARIES,
    },
    filter::{COMM_LEN, FilterConfig},
    operand::OperandSet,
};

/// Exit drains in progress, by pid_tid (see [`ExitWork`]).
#[map]
pub(crate) static EXIT_WORK: HashMap<u64, ExitWork> = HashMap::with_max_entries(MAX_EXIT_WORK, 0);

/// Entry 0: the `exit_step` program (set by the loader).
#[map]
pub(crate) static EXIT_STEPS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The two filter configurations (see `tracer_common::filter`).
#[map]
pub(crate) static FILTER: Array<FilterConfig> = Array::with_max_entries(2, 0);

/// Which `FILTER` entry is in force.
#[map]
pub(crate) static FILTER_ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

/// `filter::id_key(..)` → 1: the pids and tids that pass.
#[map]
pub(crate) static FILTER_IDS: HashMap<u64, u8> = HashMap::with_max_entries(MAX_FILTER_IDS, 0);

/// `filter::site_key(..)` → 64 bits, one per site: the sites that pass (size set by
/// the loader).
#[map]
pub(crate) static FILTER_SITES: HashMap<[u64; 2], u64> =
    HashMap::with_max_entries(DEFAULT_FILTER_SITE_WORDS, 0);

/// `[binary_id, site]` → string arguments of a USDT site (bit i = argument i + 1);
/// `[binary_id, STRING_SITES_ANY]` → 1 (filled by the loader).
#[map]
pub(crate) static STRING_SITES: HashMap<[u64; 2], u64> =
    HashMap::with_max_entries(MAX_STRING_SITES, 0);

/// `[tgid, pointer]` → the first bytes of the string last sent for it.
#[map]
pub(crate) static STRINGS: LruHashMap<[u64; 2], [u64; STRING_PROBE_BYTES / 8]> =
    LruHashMap::with_max_entries(MAX_STRINGS, 0);

/// pid_tid → the thread name last announced (`CHUNK_KIND_COMM`).
#[map]
pub(crate) static COMMS: LruHashMap<u64, [u8; COMM_LEN]> =
    LruHashMap::with_max_entries(MAX_TARGETS, 0);

/// `duration::call_site_key(..)` → `duration::call_site_info(..)`: the call sites of
/// the binaries the duration filter judges (filled and sized by the loader).
#[map]
pub(crate) static CALL_SITES: HashMap<[u64; 2], u64> = HashMap::with_max_entries(1, 0);

/// `duration::call_stack_key(..)` → the open calls of a thread in a binary (sized by
/// the loader; removed at the thread's exit).
#[map]
pub(crate) static CALL_STACKS: LruHashMap<[u64; 2], CallStack> = LruHashMap::with_max_entries(1, 0);

/// Per-CPU scratch of filtered drains.
#[map]
pub(crate) static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Chunks for the tracer (size overridden by the loader, `--ring-bytes`).
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// One counter: the sequence number of the next chunk.
#[map]
pub(crate) static SEQ: Array<u64> = Array::with_max_entries(1, 0);

/// Per-CPU counters indexed by `STAT_*`.
#[map]
pub(crate) static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// tgid → rw_bases of the instrumented binaries registered in that process.
#[map]
pub(crate) static TABLES: HashMap<u32, [u64; TABLE_BINARIES]> =
    HashMap::with_max_entries(MAX_PROCESSES, 0);

/// tgid → the uid its `TABLES` entry is charged to (`tables::claim_table`); written
/// with each new entry, removed with it.
#[map]
pub(crate) static TABLE_OWNERS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_PROCESSES, 0);

/// uid → `TABLES` entries charged to it (at most `TABLES_PER_UID`). A uid's counter
/// stays at 0 when its entries are gone (uids with traced processes are few).
#[map]
pub(crate) static TABLE_UIDS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_PROCESSES, 0);

/// pid_tid → 1: the thread's exit() drain delivered everything (`tables::exit_step`);
/// its `task_exit` skips the fallback drain.
#[map]
pub(crate) static EXIT_DRAINED: LruHashMap<u64, u8> = LruHashMap::with_max_entries(MAX_TARGETS, 0);

/// The traced processes.
#[map]
pub(crate) static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TARGETS, 0);

/// Binary ordinal (high half of a site cookie) → binary_id.
#[map]
pub(crate) static BINARIES: Array<u64> = Array::with_max_entries(MAX_BINARIES, 0);

/// operand_key(binary ordinal, site id) → where a uprobe memory or USDT site's values
/// are; filled by the loader, which also sizes the map (one entry per such site, and
/// room for binaries that join). Not preallocated: that room costs nothing unused.
#[map]
pub(crate) static OPERANDS: HashMap<u64, OperandSet> =
    HashMap::with_max_entries(1, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// [tgid, slot address] → [position, stamp]: how far the slot's buffer has been
/// delivered, for kernels where the programs cannot write user memory (see
/// `slots::delivered_up_to`).
#[map]
pub(crate) static DRAINED: LruHashMap<[u64; 2], [u64; 2]> =
    LruHashMap::with_max_entries(MAX_DRAINED, 0);

/// 1 = bpf_probe_write_user is allowed (no kernel lockdown): slots are reset and
/// tombstoned in place. 0 = positions are kept in DRAINED instead.
#[unsafe(no_mangle)]
pub(crate) static WRITE_USER: Global<u8> = Global::new(0);

/// 1 = a flush that finds no room in the ring buffer waits and flushes again
/// (`--on-full wait`, see `tracer_common::HOLD_SIGNAL`); 0 = what finds no room is
/// dropped.
#[unsafe(no_mangle)]
pub(crate) static ON_FULL: Global<u8> = Global::new(0);

/// 1 = the ring buffer is small (`tracer_common::SMALL_RING_BYTES`): drains cut
/// buffers into chunks of SMALL_CHUNK_RECORDS, not CHUNK_RECORDS.
#[unsafe(no_mangle)]
pub(crate) static SMALL_CHUNKS: Global<u8> = Global::new(0);

/// Offset of the thread pointer in `task_struct` (x86-64 `thread.fsbase`, AArch64
/// `thread.uw.tp_value`), from BTF by the loader. 0 = unknown: no slot lookups by
/// thread pointer (flush still works, it gets the slot in a register).
#[unsafe(no_mangle)]
pub(crate) static FSBASE_OFFSET: Global<u64> = Global::new(0);

/// 1 = trace every process that runs an instrumented binary (TARGETS not consulted).
#[unsafe(no_mangle)]
pub(crate) static SYSTEM_WIDE: Global<u8> = Global::new(0);

/// Offset of `child_pid` in the sched_process_fork record (from its tracefs format).
#[unsafe(no_mangle)]
pub(crate) static FORK_CHILD_PID_OFF: Global<u32> = Global::new(20);

/// Offset of `group_dead` in the sched_process_exit record; 0 when the kernel lacks it.
#[unsafe(no_mangle)]
pub(crate) static EXIT_GROUP_DEAD_OFF: Global<u32> = Global::new(0);

/// An exit drain in progress (`EXIT_WORK`, keyed by pid_tid): the exiting thread's
/// RW areas and where the walk is. The walk runs as a chain of tail calls of the
/// `exit_step` program, one slot per step, instead of a loop inside the exit
/// programs: a drain under a loop under a loop costs the verifier seconds per
/// program, a drain in a program of its own a tenth of that.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ExitWork {
    pub table: [u64; TABLE_BINARIES],
    pub tp: u64,
    pub cause: u32,
    pub after: u32,
    /// Next step: RW area `step / 2`, the thread's slot (even) or its pre-TLS slot (odd).
    pub step: u32,
    /// Some step's drain failed.
    pub failed: u32,
    /// The thread's slot in the current RW area (even step), for the odd step.
    pub slot: u64,
}

/// Records per block of a filtered drain (read, and written as a chunk): fewer than
/// `CHUNK_RECORDS`, as two blocks must fit a per-CPU map value (32 KiB at most).
pub(crate) const FILTER_BLOCK: usize = 128;

/// Per-CPU scratch of filtered drains (`SCRATCH`): a chunk (header and records
/// contiguous, as `bpf_ringbuf_output` takes them), the filter state, and a busy flag
/// (a sleepable program may be preempted while it holds the scratch).
#[repr(C)]
pub(crate) struct Scratch {
    pub header: ChunkHeader,
    /// The chunk being built from the records that pass.
    pub records: [Record; FILTER_BLOCK],
    /// The records read from the buffer, FILTER_BLOCK at a time.
    pub input: [Record; FILTER_BLOCK],
    pub filter: RecordFilter,
    pub strings: StringState,
    pub calls: CallState,
    pub kept: u64,
    pub busy: u64,
}

/// Entries of [`CallState::sites`] (a power of two).
pub(crate) const CALL_SITE_CACHE: usize = 512;

/// The duration filter's state in a drain (`duration.rs`): the thread's stack, copied
/// in from `CALL_STACKS` and back, a cache of `CALL_SITES`, and what to count.
#[repr(C)]
pub(crate) struct CallState {
    pub stack: CallStack,
    /// `CALL_SITES` as looked up on this CPU, direct-mapped by site: `[binary_id,
    /// (site + 1) << 32 | info]` (an entry never changes once the loader wrote it, so
    /// the cache lasts across drains).
    pub sites: [[u64; 2]; CALL_SITE_CACHE],
    /// A `CALL_SITES` key (map keys must be in memory, and the stack is full).
    pub key: [u64; 2],
    pub released: u64,
    pub short: u64,
    pub deep: u64,
}

/// Per-record state of a filtered drain (lives in the per-CPU scratch, not on the
/// stack: the exit programs' call chain has little stack left).
#[repr(C)]
pub(crate) struct RecordFilter {
    pub cfg: FilterConfig,
    pub generation: u64,
    pub binary_id: u64,
    /// Cached `FILTER_SITES` word: key word index + 1 (0 = none) and its bits.
    pub word: u64,
    pub bits: u64,
    /// Decision for the last first record (argument records of a USDT probe follow it).
    pub last_keep: u64,
    /// Records seen on this CPU, for 1-in-N sampling.
    pub sampled: u64,
    /// A `FILTER_SITES` key (map keys must be in memory).
    pub key: [u64; 2],
}

/// Entries of [`StringState::sites`] and [`StringState::seen`] (powers of two).
pub(crate) const STRING_SITE_CACHE: usize = 16;
pub(crate) const STRING_SEEN_CACHE: usize = 64;

/// Per-record state of the string pass of a drain (`strings::name_strings`), in the
/// per-CPU scratch: map keys and values must live in memory, and the stack has no room.
#[repr(C)]
pub(crate) struct StringState {
    /// 1 = the drain's binary has string arguments (the pass runs).
    pub on: u64,
    /// 1 = a drain at the thread's exit: pointers named before keep their strings.
    pub at_exit: u64,
    /// The drain's thread (`bpf_get_current_pid_tgid`), binary and clock sample.
    pub pid_tid: u64,
    pub binary_id: u64,
    pub time: u64,
    /// This drain's number on this CPU: cache entries of other drains are stale.
    pub generation: u64,
    /// Sites looked up in this drain: [site + 1, its string arguments, generation],
    /// direct-mapped by site.
    pub sites: [[u64; 3]; STRING_SITE_CACHE],
    /// Pointers this drain read already (their strings cannot have changed within
    /// it): [pointer, generation], direct-mapped by pointer.
    pub seen: [[u64; 2]; STRING_SEEN_CACHE],
    /// String arguments of the probe whose records these are (its first record's).
    pub mask: u64,
    /// The `STRING_*` status of the string being read (its first read, whether it
    /// changed).
    pub status: u64,
    /// `STRINGS` key and the bytes just read at its pointer.
    pub key: [u64; 2],
    pub probe: [u64; STRING_PROBE_BYTES / 8],
}
