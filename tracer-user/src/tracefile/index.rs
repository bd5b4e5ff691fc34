//! The index at the end of a trace file (`SECTION_INDEX`): where each section of
//! chunks is and the times its records can have, so that a reader of a time range (or
//! of the coarse binaries only) passes over the others without reading a byte of them,
//! and finds the stats without walking the file.
//!
//! ```text
//! SECTION_INDEX payload, after SECTION_STATS, last in the file
//!   entries, 40 bytes each, in file order, one per section of chunks:
//!     0   u64  offset of the section's header in the file
//!     8   u64  payload length
//!     16  u32  chunks in it
//!     20  u32  flags: INDEX_INTERPOLATED (its records' times come from the drains
//!              around them: never passed over by time)
//!     24  u64  lo: CLOCK_MONOTONIC ns, no record in it is older (the drain before
//!              each chunk's, on its thread; 0 for a thread's first)
//!     32  u64  hi: none is newer (its chunks' drain times)
//!   trailer, the file's last 24 bytes:
//!     u64  offset of the SECTION_INDEX header; u64  offset of the SECTION_STATS
//!     header; [u8; 8] INDEX_MAGIC
//! ```
//!
//! Written by [`IndexBuilder`] as the writer puts sections out, for a trace in one file
//! (not in segments); a file without it (killed session, older tracer, segments) is
//! read section by section as before. A reader believes an index only if it is
//! well-formed (entries in order, inside the file); it is the reader's own file, so a
//! lying one costs wrong answers, never a crash.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use tracer_common::{CHUNK_KIND_RECORDS, ChunkHeader, meta::TimeMode};

use super::{
    BinaryInfo, FILE_HEADER_LEN, FORMAT_VERSION, SECTION_BINARY, SECTION_HEADER_LEN, SECTION_INDEX,
    chunk_headers_of, u32_at, u64_at,
};

const INDEX_MAGIC: [u8; 8] = *b"UTRCINDX";
const ENTRY_LEN: usize = 40;
const TRAILER_LEN: usize = 24;
/// The entry's chunks have records whose times are interpolated (coarse or block
/// binaries, or a binary the index did not see described).
const INDEX_INTERPOLATED: u32 = 1;

/// One section of chunks, as the index lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub len: u64,
    pub chunks: u32,
    pub flags: u32,
    pub lo: u64,
    pub hi: u64,
}

impl IndexEntry {
    pub fn interpolated(&self) -> bool {
        self.flags & INDEX_INTERPOLATED != 0
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.chunks.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.lo.to_le_bytes());
        out.extend_from_slice(&self.hi.to_le_bytes());
    }

    fn decode(b: &[u8]) -> IndexEntry {
        IndexEntry {
            offset: u64_at(b, 0),
            len: u64_at(b, 8),
            chunks: u32_at(b, 16),
            flags: u32_at(b, 20),
            lo: u64_at(b, 24),
            hi: u64_at(b, 32),
        }
    }
}

/// Per thread and binary, the times of its last drain and of the one before: the
/// records of a chunk are no older than its thread's previous drain.
#[derive(Default)]
pub struct Drains {
    last: HashMap<(u32, u32, u64), (u64, u64)>,
}

impl Drains {
    /// A chunk, in file order: its drain is now its thread's last. Returns the time of
    /// the drain before it (None: its thread's first).
    pub fn note(&mut self, h: &ChunkHeader) -> Option<u64> {
        let key = (h.pid, h.tid, h.binary_id);
        let (last, before) = self.last.get(&key).copied().map_or((None, None), |(l, b)| {
            (Some(l), (b != u64::MAX).then_some(b))
        });
        // Chunks of one drain share its time: the drain before is the one before that.
        let prev = if last == Some(h.time) { before } else { last };
        self.last.insert(key, (h.time, prev.unwrap_or(u64::MAX)));
        prev
    }

    /// The oldest and newest times records of chunk `h` (noted now) can have.
    pub fn span(&mut self, h: &ChunkHeader) -> (u64, u64) {
        let prev = self.note(h);
        let lo = match (h.kind == CHUNK_KIND_RECORDS, prev) {
            (true, Some(p)) => p,
            // A uprobe site's chunk: its records are of its own time.
            (false, _) => h.time,
            (true, None) => 0,
        };
        (lo, h.time)
    }
}

/// Builds the index from the bytes the writer puts out, whole sections at a time.
pub(super) struct IndexBuilder {
    /// File offset of the next section.
    offset: u64,
    entries: Vec<u8>,
    drains: Drains,
    /// Binaries whose records carry their own times.
    timed: HashSet<u64>,
    stats_at: Option<u64>,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        IndexBuilder {
            offset: FILE_HEADER_LEN as u64,
            entries: Vec::new(),
            drains: Drains::default(),
            timed: HashSet::new(),
            stats_at: None,
        }
    }
}

impl IndexBuilder {
    /// Sections put into the file (whole ones, in order).
    pub(super) fn note(&mut self, mut bytes: &[u8]) {
        while bytes.len() >= SECTION_HEADER_LEN {
            let (kind, len) = (u32_at(bytes, 0), u64_at(bytes, 8));
            let end = SECTION_HEADER_LEN
                .saturating_add(len as usize)
                .min(bytes.len());
            let payload = &bytes[SECTION_HEADER_LEN..end];
            if kind == super::SECTION_STATS {
                self.stats_at = Some(self.offset);
            }
            if kind == SECTION_BINARY {
                self.binary(payload);
            }
            if let Some(headers) = chunk_headers_of(kind, FORMAT_VERSION, payload) {
                self.chunks(len, &headers);
            }
            self.offset += (SECTION_HEADER_LEN as u64).saturating_add(len);
            bytes = &bytes[end..];
        }
    }

    fn binary(&mut self, payload: &[u8]) {
        let Ok(b) = BinaryInfo::decode(payload) else {
            return;
        };
        if b.metadata().is_ok_and(|m| m.time_mode == TimeMode::Record) {
            self.timed.insert(b.binary_id);
        }
    }

    fn chunks(&mut self, len: u64, headers: &[ChunkHeader]) {
        let (mut lo, mut hi, mut flags) = (u64::MAX, 0, 0);
        for h in headers {
            let (l, t) = self.drains.span(h);
            (lo, hi) = (lo.min(l), hi.max(t));
            if h.kind == CHUNK_KIND_RECORDS && !self.timed.contains(&h.binary_id) {
                flags |= INDEX_INTERPOLATED;
            }
        }
        IndexEntry {
            offset: self.offset,
            len,
            chunks: headers.len() as u32,
            flags,
            lo,
            hi,
        }
        .encode(&mut self.entries);
    }

    /// The payload of the `SECTION_INDEX` that comes next, once the stats are written
    /// (None before).
    pub(super) fn payload(&self) -> Option<Vec<u8>> {
        let stats = self.stats_at?;
        let mut payload = Vec::with_capacity(self.entries.len() + TRAILER_LEN);
        payload.extend_from_slice(&self.entries);
        payload.extend_from_slice(&self.offset.to_le_bytes());
        payload.extend_from_slice(&stats.to_le_bytes());
        payload.extend_from_slice(&INDEX_MAGIC);
        Some(payload)
    }
}

/// A file's index, as read.
pub(super) struct Index {
    pub(super) entries: Vec<IndexEntry>,
    /// Offset of the stats section's header.
    pub(super) stats_at: u64,
}

/// The index of the trace file `f` (`len` bytes), if it has a well-formed one.
pub(super) fn read_index(f: &mut File, len: u64) -> Option<Index> {
    if len < (FILE_HEADER_LEN + SECTION_HEADER_LEN + TRAILER_LEN) as u64 {
        return None;
    }
    let mut trailer = [0u8; TRAILER_LEN];
    f.seek(SeekFrom::Start(len - TRAILER_LEN as u64)).ok()?;
    f.read_exact(&mut trailer).ok()?;
    if trailer[16..] != INDEX_MAGIC {
        return None;
    }
    let (at, stats_at) = (u64_at(&trailer, 0), u64_at(&trailer, 8));
    let mut head = [0u8; SECTION_HEADER_LEN];
    f.seek(SeekFrom::Start(at)).ok()?;
    f.read_exact(&mut head).ok()?;
    let payload = u64_at(&head, 8);
    let end = at
        .checked_add(SECTION_HEADER_LEN as u64)?
        .checked_add(payload)?;
    if u32_at(&head, 0) != SECTION_INDEX
        || end != len
        || (payload as usize) < TRAILER_LEN
        || !(payload as usize - TRAILER_LEN).is_multiple_of(ENTRY_LEN)
        || stats_at >= at
    {
        return None;
    }
    let mut bytes = vec![0u8; payload as usize - TRAILER_LEN];
    f.read_exact(&mut bytes).ok()?;
    let entries: Vec<IndexEntry> = bytes
        .chunks_exact(ENTRY_LEN)
        .map(IndexEntry::decode)
        .collect();
    // In order, each inside the file before the stats.
    let mut next = FILE_HEADER_LEN as u64;
    for e in &entries {
        let end = e
            .offset
            .checked_add(SECTION_HEADER_LEN as u64)?
            .checked_add(e.len)?;
        if e.offset < next || end > stats_at {
            return None;
        }
        next = end;
    }
    Some(Index { entries, stats_at })
}
