//! What the eBPF programs put into the BPF ring buffer: a [`ChunkHeader`] followed by
//! `count` [`crate::Record`]s (the used part of a thread's buffer, cut into chunks of at
//! most [`CHUNK_RECORDS`]).
//!
//! A header is built by `ChunkHeader::new` / `with_records` and read by `from_bytes`; it
//! names the entry's kind (`CHUNK_KIND_*`: records, a uprobe site's records, a user
//! drain's slot, a thread's name, a newly mapped binary, a string) and its drain's cause
//! (`CAUSE_*`). A USDT string argument travels as a [`StringChunk`] (up to 256 bytes)
//! before the records that use it.

use crate::record::{le_u32, le_u64};

/// Records per ring-buffer entry at most: 512 × 32 B = 16 KiB per entry. Fewer
/// chunks per buffer mean fewer ring operations in the drain, and fewer headers and
/// packing models restarted in the trace file (sqlite, every entry and exit: 7.2 B
/// per record with chunks of 128, 6.5 with chunks of 512).
pub const CHUNK_RECORDS: usize = 512;
/// Records per chunk in rings under `ebpf::SMALL_RING_BYTES` (`--ring-bytes` under 256K).
pub const SMALL_CHUNK_RECORDS: usize = 128;
/// Bytes of the largest ring-buffer entry (header + full payload). The drain reserves
/// entries of a few fixed sizes (room for 4, 16, 128 or 512 records, whichever fits) so
/// that small drains do not waste ring space; `count` says how many records are valid.
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

/// What a USDT string argument points at, read by a drain while the process lives: a
/// [`StringChunk`] (`count` = 0). Sent before the chunk that holds the record, once
/// per (process, pointer) until the bytes there change.
pub const CHUNK_KIND_STRING: u32 = 6;

/// Bytes of a string argument kept ([`StringChunk::bytes`], the NUL included).
pub const STRING_BYTES: usize = 256;
/// [`StringChunk::status`]: the string, NUL-terminated within [`STRING_BYTES`].
pub const STRING_OK: u32 = 0;
/// The string filled the [`STRING_BYTES`] − 1 bytes kept: its first bytes (it may be
/// exactly that long).
pub const STRING_TRUNCATED: u32 = 1;
/// The pointer could not be read (unmapped, or a page that is not resident).
pub const STRING_UNREADABLE: u32 = 2;
/// Or'ed into the status: this process sent another string for the pointer before, so
/// its memory changed while the records of this drain were being written (readers name
/// the pointer by the newer string from here on, and count the change).
pub const STRING_CHANGED: u32 = 1 << 8;

/// A `CHUNK_KIND_STRING` entry: in process `header.pid`, `ptr` held `bytes` (`len`
/// of them, the NUL included) when the drain read it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StringChunk {
    pub header: ChunkHeader,
    pub ptr: u64,
    pub len: u32,
    /// `STRING_*`.
    pub status: u32,
    pub bytes: [u8; STRING_BYTES],
}

/// Bytes of a [`StringChunk`] before its `bytes`.
pub const STRING_CHUNK_FIXED: usize = core::mem::offset_of!(StringChunk, bytes);
const _: () = assert!(STRING_CHUNK_FIXED == CHUNK_HEADER_BYTES + 16);

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
/// A session on a running process (`record -p`) ended while the thread lived: what
/// its buffer still held, collected by the tracer.
pub const CAUSE_STOP: u32 = 8;

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

/// Bytes of a [`ChunkHeader`].
pub const CHUNK_HEADER_BYTES: usize = core::mem::size_of::<ChunkHeader>();

impl ChunkHeader {
    /// The header of a chunk of kind `kind` from thread `pid_tid` (`tgid << 32 | tid`,
    /// as `bpf_get_current_pid_tgid` gives it), with no records and no sequence number
    /// (announcements: `CHUNK_KIND_COMM`, `CHUNK_KIND_MAPPED`); see [`Self::with_records`].
    pub const fn new(kind: u32, pid_tid: u64, binary_id: u64, cause: u32, time: u64) -> Self {
        ChunkHeader {
            kind,
            count: 0,
            pid: (pid_tid >> 32) as u32,
            tid: pid_tid as u32,
            seq: 0,
            binary_id,
            cause,
            _pad: 0,
            time,
        }
    }

    /// The same header for `count` records, chunk number `seq` (from the `SEQ` map, or
    /// the user-space drain's own counter).
    pub const fn with_records(self, count: u32, seq: u64) -> Self {
        ChunkHeader { count, seq, ..self }
    }

    /// Decode a header from its 48 little-endian bytes.
    pub fn from_bytes(b: &[u8; CHUNK_HEADER_BYTES]) -> Self {
        ChunkHeader {
            kind: le_u32(b, 0),
            count: le_u32(b, 4),
            pid: le_u32(b, 8),
            tid: le_u32(b, 12),
            seq: le_u64(b, 16),
            binary_id: le_u64(b, 24),
            cause: le_u32(b, 32),
            _pad: le_u32(b, 36),
            time: le_u64(b, 40),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = ChunkHeader::new(CHUNK_KIND_RECORDS, (7 << 32) | 9, 0xabc, CAUSE_FULL, 42)
            .with_records(3, 11);
        assert_eq!((h.pid, h.tid, h.count, h.seq, h._pad), (7, 9, 3, 11, 0));
        let mut b = [0u8; CHUNK_HEADER_BYTES];
        // SAFETY: ChunkHeader is repr(C) plain data of exactly CHUNK_HEADER_BYTES bytes.
        unsafe { core::ptr::write_unaligned(b.as_mut_ptr().cast::<ChunkHeader>(), h) };
        assert_eq!(ChunkHeader::from_bytes(&b), h);
    }
}
