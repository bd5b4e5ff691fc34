//! What the eBPF programs put into the BPF ring buffer: a [`ChunkHeader`] followed by
//! `count` [`crate::Record`]s (the used part of a thread's buffer, cut into chunks of at
//! most [`CHUNK_RECORDS`]).

/// Records per ring-buffer entry at most. 128 × 32 B = 4 KiB per entry.
pub const CHUNK_RECORDS: usize = 128;
/// Bytes of the largest ring-buffer entry (header + full payload). The drain reserves
/// entries of a few fixed sizes (room for 4, 16 or 128 records, whichever fits) so that
/// small drains do not waste ring space; `count` says how many records are valid.
pub const CHUNK_BYTES: usize =
    core::mem::size_of::<ChunkHeader>() + CHUNK_RECORDS * crate::RECORD_SIZE;

/// Records drained from a thread's buffer (full buffer, thread exit, or before a
/// uprobe-site record so that order is kept).
pub const CHUNK_KIND_RECORDS: u32 = 1;
/// One event emitted directly by the uprobe fallback program: one record, or up to
/// `operand::MAX_OPERAND_RECORDS` for a USDT probe with more than two arguments (the
/// `FLAG_USDT_MORE` records follow the first, as an inline stub writes them).
pub const CHUNK_KIND_UPROBE: u32 = 2;
/// User-space drain only: a thread registered a slot. `count` = 0; the header is
/// followed by the slot's address and its RW area's address (two u64). Not written to
/// trace files.
pub const CHUNK_KIND_SLOT: u32 = 3;

/// The thread's name (`comm`) changed or was not sent yet: `count` = 0, the header is
/// followed by the 16 bytes of `comm` (NUL-padded). Sent before the records of a drain.
pub const CHUNK_KIND_COMM: u32 = 4;
/// Not written to trace files: a process mapped an executable file (`pid`; `tid`
/// = the thread) or exec'd (`cause` = `CAUSE_EXEC`): the tracer looks for instrumented
/// binaries it does not trace yet (system-wide sessions, `dlopen`).
pub const CHUNK_KIND_MAPPED: u32 = 5;

/// Why a drain happened (`ChunkHeader::cause`).
pub const CAUSE_FULL: u32 = 1;
pub const CAUSE_THREAD_EXIT: u32 = 2;
pub const CAUSE_TASK_EXIT: u32 = 3;
pub const CAUSE_UPROBE_SITE: u32 = 4;
pub const CAUSE_REGISTER: u32 = 5;
/// The thread took a crash signal (SIGSEGV, SIGABRT, ...).
pub const CAUSE_CRASH: u32 = 6;
/// `CHUNK_KIND_MAPPED`: the process exec'd (else: it mmap'ed an executable file).
pub const CAUSE_EXEC: u32 = 7;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkHeader {
    /// `CHUNK_KIND_*`.
    pub kind: u32,
    /// Valid records following the header.
    pub count: u32,
    /// Process id (tgid) and thread id of the thread whose records these are.
    pub pid: u32,
    pub tid: u32,
    /// Global sequence number of this chunk (one counter per session, in the
    /// `SEQ` map): the consumer can tell a missing chunk from a late one.
    pub seq: u64,
    /// Identity of the binary the sites belong to (`RwHeader::binary_id`).
    pub binary_id: u64,
    /// `CAUSE_*`.
    pub cause: u32,
    pub _pad: u32,
    /// CLOCK_MONOTONIC ns when the drain ran (`bpf_ktime_get_ns`; the user-space drain:
    /// `clock_gettime` when the records arrived). Every chunk of one drain carries the
    /// same value: the clock sample that coarse-timestamp traces interpolate between.
    pub time: u64,
}

const _: () = assert!(core::mem::size_of::<ChunkHeader>() == 48);

/// Indices into the per-CPU `STATS` array map.
pub const STAT_RECORDS_DELIVERED: u32 = 0;
/// Records that were in a buffer but found no room in the ring buffer.
pub const STAT_RECORDS_DROPPED: u32 = 1;
pub const STAT_CHUNKS: u32 = 2;
/// Drains that could not read the user buffer (bad pointer, page not present).
pub const STAT_READ_ERRORS: u32 = 3;
/// Records skipped because an earlier drain already delivered them.
pub const STAT_RECORDS_SKIPPED: u32 = 4;
/// Records a filter (`filter::FilterConfig`) did not keep.
pub const STAT_RECORDS_FILTERED: u32 = 6;
/// Records taken out of buffers (or emitted at uprobe sites): each one is then
/// delivered, filtered or dropped (also when its buffer could not be read).
pub const STAT_RECORDS_PRODUCED: u32 = 7;
pub const STAT_COUNT: u32 = 8;
