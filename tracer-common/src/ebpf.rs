//! The interface between the eBPF object (`tracer-ebpf`) and the tracer that loads it:
//! program, map and global names, map sizes and the uprobe-site cookie encoding.
//!
//! Only names and sizes live here; the map value layouts are the types of the other
//! modules (`ChunkHeader`, `Record`, `u64` counters).

/// Uprobe on the injected flush function (drains a full buffer, learns rw_bases).
pub const PROG_FLUSH: &str = "flush";
/// The same as [`PROG_FLUSH`], sleepable: a buffer page that is not resident (swapped
/// out, never touched) is faulted in with `bpf_copy_from_user` where the plain read
/// fails. Used when the kernel accepts it.
pub const PROG_FLUSH_SLEEPABLE: &str = "flush_s";
/// Tracepoint `sched:sched_process_exec`: tells the tracer a process exec'd
/// (`CHUNK_KIND_MAPPED`), for system-wide sessions.
pub const PROG_EXEC: &str = "exec";
/// Tracepoint `syscalls:sys_enter_mmap` with `PROT_EXEC` and a file: tells the tracer a traced process maps code (`dlopen`), `CHUNK_KIND_MAPPED`.
pub const PROG_MMAP: &str = "mmap";
/// Uprobe on an unpatchable site (cookie = [`site_cookie`]).
pub const PROG_SITE: &str = "site";
/// Tracepoint `syscalls:sys_enter_exit`: drain and release the exiting thread's slots.
pub const PROG_THREAD_EXIT: &str = "thread_exit";
/// Tracepoint `sched:sched_process_exit`: read-only drain of whatever is left.
pub const PROG_TASK_EXIT: &str = "task_exit";
/// Tracepoint `sched:sched_process_fork`: children of targets become targets.
pub const PROG_FORK: &str = "fork";
/// Tracepoint `syscalls:sys_enter_exit_group`: the calling thread drains its slots while
/// its memory is still there (kernels before 6.16 fire `sched_process_exit` after
/// `exit_mm`, when user memory can no longer be read).
pub const PROG_GROUP_EXIT: &str = "group_exit";
/// Tracepoint `signal:signal_deliver`: a thread taking SIGKILL (killed, or zapped by
/// another thread's exit_group) drains its slots before `do_exit`, for the same reason.
pub const PROG_KILLED: &str = "killed";

/// Tracepoint program reached only by tail calls (`MAP_EXIT_STEPS`): one step of an
/// exit drain.
pub const PROG_EXIT_STEP: &str = "exit_step";
/// `ProgramArray`, entry 0 = `exit_step`.
pub const MAP_EXIT_STEPS: &str = "EXIT_STEPS";
/// Exit drains in progress at once (threads exiting at the same time).
pub const MAX_EXIT_WORK: u32 = 4096;

/// Ring buffer of chunks (`ChunkHeader` + records).
pub const MAP_EVENTS: &str = "EVENTS";
/// `Array<u64>`, one entry: the session's chunk sequence counter.
pub const MAP_SEQ: &str = "SEQ";
/// `PerCpuArray<u64>` indexed by `STAT_*`.
pub const MAP_STATS: &str = "STATS";
/// `HashMap<u32 tgid, [u64; TABLE_BINARIES]>`: the rw_bases of the instrumented binaries
/// mapped into a process (0 = unused entry).
pub const MAP_TABLES: &str = "TABLES";
/// `HashMap<u32 tgid, u32 uid>`: whose share a `TABLES` entry is charged to.
pub const MAP_TABLE_OWNERS: &str = "TABLE_OWNERS";
/// `HashMap<u32 uid, u64>`: `TABLES` entries charged to a uid.
pub const MAP_TABLE_UIDS: &str = "TABLE_UIDS";
/// `HashMap<u32 tgid, u8>`: the traced processes (ignored when `SYSTEM_WIDE` != 0).
pub const MAP_TARGETS: &str = "TARGETS";
/// The `TARGETS` key (no process has pid 0) that ends a session: once it is there,
/// every program returns at once (the tracer then takes them down in the background).
pub const TARGETS_ENDED: u32 = 0;
/// `Array<u64>`: binary ordinal (the high half of a site cookie) → binary_id.
pub const MAP_BINARIES: &str = "BINARIES";

/// `HashMap<u64 = operand_key(ordinal, site id), OperandSet>`: the operand descriptors
/// of the uprobe sites of kind memory and USDT (`operand::OperandSet`), filled by the
/// tracer before it attaches them. Sized by the tracer to the sites it has.
pub const MAP_OPERANDS: &str = "OPERANDS";

/// `LruHashMap<[u64; 2] = [tgid, slot address], u64>`: how far a slot's buffer was
/// delivered, used when the kernel forbids `bpf_probe_write_user` (lockdown).
pub const MAP_DRAINED: &str = "DRAINED";

/// `Array<FilterConfig>`, 2 entries: the filter configurations (see `filter`).
pub const MAP_FILTER: &str = "FILTER";
/// `Array<u32>`, 1 entry: which `FILTER` entry is in force.
pub const MAP_FILTER_ACTIVE: &str = "FILTER_ACTIVE";
/// `HashMap<u64 = filter::id_key(..), u8>`: pids and tids that pass.
pub const MAP_FILTER_IDS: &str = "FILTER_IDS";
/// `HashMap<[u64; 2] = filter::site_key(..), u64>`: site sets, 64 sites per entry.
pub const MAP_FILTER_SITES: &str = "FILTER_SITES";
/// Entries of `FILTER_IDS`.
pub const MAX_FILTER_IDS: u32 = 4096;
/// `HashMap<[u64; 2], u64>`: `[binary_id, site]` → which arguments of a USDT site are
/// strings (bit `i` = argument `i + 1`); `[binary_id, STRING_SITES_ANY]` → 1: the
/// binary has such sites.
pub const MAP_STRING_SITES: &str = "STRING_SITES";
/// The site of `STRING_SITES`' per-binary marker.
pub const STRING_SITES_ANY: u64 = u64::MAX;
/// Entries of `STRING_SITES`.
pub const MAX_STRING_SITES: u32 = 4096;
/// `LruHashMap<[u64; 2], [u64; 4]>`: `[tgid, pointer]` → the string's first bytes
/// last read there (`STRING_PROBE_BYTES`, the NUL included): a string is sent again
/// only when they change.
pub const MAP_STRINGS: &str = "STRINGS";
/// Entries of `STRINGS`.
pub const MAX_STRINGS: u32 = 32768;
/// Bytes read to tell whether a string changed: 31 and the NUL.
pub const STRING_PROBE_BYTES: usize = 32;
/// `HashMap<[u64; 2] = duration::call_site_key(..), u64>`: the call sites the duration
/// filter judges (`duration::call_site_info`), filled by the tracer; sized by it (1
/// entry without `--min-duration`).
pub const MAP_CALL_SITES: &str = "CALL_SITES";
/// `LruHashMap<[u64; 2] = duration::call_stack_key(..), duration::CallStack>`: the
/// open calls of each thread and binary; `MAX_CALL_STACKS` entries with
/// `--min-duration`, else 1.
pub const MAP_CALL_STACKS: &str = "CALL_STACKS";
/// Threads (times binaries) the duration filter follows at once (2.3 KiB each); beyond,
/// the stack used least lately is evicted.
pub const MAX_CALL_STACKS: u32 = 4096;
/// Room in `CALL_SITES` beyond the first binaries' sites, for binaries that join.
pub const SPARE_CALL_SITES: u32 = 1 << 18;
/// Entries of `FILTER_SITES` by default (both generations; 64 sites each).
pub const DEFAULT_FILTER_SITE_WORDS: u32 = 1 << 16;

/// Instrumented binaries per process that the eBPF side can track.
pub const TABLE_BINARIES: usize = 8;
/// Entries of `BINARIES` (instrumented binaries per session).
pub const MAX_BINARIES: u32 = 64;
/// Entries of `TABLES`.
pub const MAX_PROCESSES: u32 = 4096;
/// `TABLES` entries one uid may hold in a system-wide session, seeded by the tracer and
/// learned by the eBPF side alike (counted in `TABLE_UIDS`): one user cannot leave
/// another's processes without an entry (undrained at thread exit).
pub const TABLES_PER_UID: u32 = MAX_PROCESSES / 2;
/// Entries of `TARGETS` (processes, plus threads until they exit, see `fork`).
pub const MAX_TARGETS: u32 = 65536;
/// Entries of `DRAINED` (slots with a partly delivered buffer).
pub const MAX_DRAINED: u32 = 65536;
/// Default size of `EVENTS` in bytes (a power of two, multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 16 << 20;
/// Upper bound on one drain (bytes between `start` and `cur`), a sanity limit against a
/// corrupt slot; larger spans are counted as read errors.
pub const MAX_DRAIN_BYTES: u64 = 64 << 20;

/// Global (u64): byte offset of the thread pointer inside `task_struct`
/// (x86-64: `thread.fsbase`; AArch64: `thread.uw.tp_value`). 0 = unknown.
pub const GLOBAL_TP_OFFSET: &str = "FSBASE_OFFSET";
/// Global (u8): 1 = the programs may use `bpf_probe_write_user` to reset and release
/// slots in place; 0 = they keep delivery positions in `DRAINED` instead (for kernels
/// in lockdown, where that helper is unavailable).
pub const GLOBAL_WRITE_USER: &str = "WRITE_USER";
/// `ON_FULL` (u8): 1 = full buffers wait for room in the ring buffer (`--on-full wait`).
pub const GLOBAL_ON_FULL: &str = "ON_FULL";
/// Global (u8): 1 = the ring buffer is smaller than [`SMALL_RING_BYTES`].
pub const GLOBAL_SMALL_CHUNKS: &str = "SMALL_CHUNKS";
/// Rings under 256 KiB (16 × CHUNK_RECORDS records) get chunks of `SMALL_CHUNK_RECORDS`: a holding
/// drain keeps a quarter of the ring free, and a 16 KiB ring could take no full chunk.
pub const SMALL_RING_BYTES: u32 = (16 * crate::CHUNK_RECORDS * crate::RECORD_SIZE) as u32;
/// Global (u8): 1 = trace every process that runs an instrumented binary.
pub const GLOBAL_SYSTEM_WIDE: &str = "SYSTEM_WIDE";
/// Global (u32): offset of `child_pid` in the `sched_process_fork` record.
pub const GLOBAL_FORK_CHILD_PID_OFF: &str = "FORK_CHILD_PID_OFF";
/// Global (u32): offset of `group_dead` in the `sched_process_exit` record (0 = absent).
pub const GLOBAL_EXIT_GROUP_DEAD_OFF: &str = "EXIT_GROUP_DEAD_OFF";

/// Uprobe-site record selector: value = first argument, aux = return address (a
/// function entry).
pub const SEL_ENTRY: u8 = 0;
/// Value = return value register, aux = return address (a return or a tail call).
pub const SEL_EXIT: u8 = 1;
/// Value = the probed instruction's address, aux = 0 (a basic block).
pub const SEL_BLOCK: u8 = 2;
/// Value = the effective address, aux = the instruction's address, flags = size and
/// read/write, from the site's `OPERANDS` entry (a memory access; value 0 and no
/// flags without one).
pub const SEL_MEMORY: u8 = 3;
/// Value, aux and the `FLAG_USDT_MORE` records after them = the arguments, from the
/// site's `OPERANDS` entry (a USDT probe; one record of zeros without one).
pub const SEL_USDT: u8 = 4;
/// Value = 0 (the target is not computed by the uprobe program), aux = the call
/// instruction's address (a call site).
pub const SEL_CALL: u8 = 5;

/// The attach cookie of a uprobe site: binary ordinal (index into `BINARIES`) in bits
/// 40..64, the record selector (`SEL_*`: which registers the record takes) in bits
/// 32..40, site id in the low half.
pub const fn site_cookie(ordinal: u32, selector: u8, site_id: u32) -> u64 {
    ((ordinal as u64) << 40) | ((selector as u64) << 32) | site_id as u64
}

/// The `OPERANDS` key of a site: binary ordinal in the high half, site id in the low.
pub const fn operand_key(ordinal: u32, site_id: u32) -> u64 {
    ((ordinal as u64) << 32) | site_id as u64
}

/// Binary ordinal of a site cookie.
pub const fn cookie_ordinal(cookie: u64) -> u32 {
    (cookie >> 40) as u32
}

/// Record selector of a site cookie.
pub const fn cookie_selector(cookie: u64) -> u8 {
    (cookie >> 32) as u8
}
