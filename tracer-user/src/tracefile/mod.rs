//! The trace file (`tracer record` writes it, `tracer report` / `tracer dump` read it):
//! the format here, [`write`] and [`read`] apart. The layer `record` and `read` share;
//! it uses nothing else of this crate.
//!
//! Little-endian throughout. A file header, then a sequence of length-prefixed
//! sections, in this order:
//!
//! ```text
//! file header (16 bytes)
//!   0   [u8; 8]  magic "UTRCTRAC"
//!   8   u32      format version (FORMAT_VERSION = 6; readers take 2 to 6)
//!   12  u32      flags: FILE_INCOMPLETE (1) until the session's end is written
//! section (16-byte header + payload), repeated
//!   0   u32      kind (SECTION_*)
//!   4   u32      reserved, 0
//!   8   u64      payload length in bytes
//!   16  ...      payload
//! ```
//!
//! Sections:
//! - `SECTION_SESSION` (1, first, once): JSON [`SessionInfo`] — command line, traced
//!   pids, architecture, record layout version, ring-buffer size, whether the eBPF
//!   programs could write user memory (`write_user`), and the clock
//!   calibration at the start: counter frequency `tsc_hz` and an anchor
//!   `{tsc, monotonic_ns}`.
//! - `SECTION_BINARY` (2, one per traced binary, before its first chunk): `u32 ordinal`
//!   (index used in uprobe-site cookies), `u32 path_len`, `u64 binary_id`, `path_len`
//!   bytes of path, then the raw contents of the binary's `.note.utrace` section (a
//!   complete ELF note, parse with `Metadata::from_note_section`), so that a trace can be
//!   reported without the binaries.
//! - `SECTION_CHUNK_PACKED` (7, any number): a ring-buffer entry of records: its 48-byte
//!   `ChunkHeader` (tracer-common `chunk.rs`) as eBPF wrote it, then its `count`
//!   records packed on their own (`pack/`: a tag byte and varints per record, about
//!   6 bytes instead of 32). Chunks are in delivery order.
//! - `SECTION_CHUNKS_PACKED` (9, any number, version 5): consecutive ring-buffer
//!   entries of records (1 to `GROUP_CHUNKS_MAX`): `u32 n`, `u32` 0, their `n` 48-byte
//!   headers, then all their records packed as one stream in the same coding (the
//!   predictions carry over from one chunk to the next: about 4 bytes a record; 2 to 3
//!   bytes a memory access in version 6). The tracer groups consecutive chunks this way
//!   (up to `GROUP_CHUNKS`); single chunks (uprobe sites, the user-space drain) stay
//!   `SECTION_CHUNK_PACKED`. A memory pair (`FLAG_MEM_PAIR`) is one record here;
//!   readers expand it into its two accesses.
//! - `SECTION_CHUNK` (3, version 2 files): the same with the records as they are,
//!   `count` 32-byte `Record`s (`record.rs`).
//! - `SECTION_COMM` (5, any number): a thread's name as the kernel had it when its
//!   records were drained (`u32 pid`, `u32 tid`, 16 bytes of `comm`, NUL-padded), before
//!   that thread's chunks; again when it changes. Also `SECTION_BINARY` may come later
//!   than the first chunk: a binary that joined a running session (system-wide, or
//!   loaded with `dlopen`) is written before its first chunk.
//! - `SECTION_LOAD` (6, any number): where a traced binary is loaded in a process, as the
//!   session saw it (`u32 pid`, `u32` 0, `u64 binary_id`, `u64 bias` = run-time address
//!   minus file address), so readers can symbolize run-time code addresses in records
//!   (return addresses, call targets).
//! - `SECTION_STRING` (8, any number): what a USDT string argument pointed at in a
//!   process when a thread's records were drained (`u32 pid`, `u32 tid`, `u32 status`
//!   = `tracer_common::STRING_*`, `u32` 0, `u64 pointer`, `u64` the drain's time as in
//!   its chunk headers, then the bytes before the NUL, at most `STRING_BYTES` − 1),
//!   before the first chunk that uses it; again, marked `STRING_CHANGED`, when they
//!   change.
//! - `SECTION_SEGMENT` (10, first, in a trace written in segments): JSON `SegmentInfo`,
//!   then the sections it repeats (`segments.rs`).
//! - `SECTION_STATS` (4, once, at the end): JSON [`FinalStats`] — kernel-side counters
//!   (delivered, dropped, read errors), what the consumer received, the end clock anchor
//!   and the traced command's exit status.
//! - `SECTION_INDEX` (11, last, after the stats, in a trace written as one file): each
//!   section of chunks with its offset and the times its records can have, and a
//!   trailer that ends the file (`index.rs`): a range, or the stats, read without
//!   walking the file.
//!
//! Unknown section kinds are skipped by readers (forward compatibility within a
//! version). The tracer creates the file as a temporary in the destination directory
//! and renames it into place as the session starts (`Writer::publish`), with
//! `FILE_INCOMPLETE` set; it clears the flag after the stats section, at the end. A
//! tracer killed mid-session leaves its trace under the name asked for, flagged: readers
//! say the session did not finish and read up to its last complete section (the writer
//! puts what it holds into the file every second). A file without the flag but without
//! a stats section, or that ends inside a section, is a truncated copy, read the same
//! way.
//!
//! Portable: a file is little-endian throughout and carries its session header
//! (architecture, clock calibration) and the metadata of every traced binary, so any host
//! reads any trace: `tests/tests/portable.rs` checks that an x86-64 trace and an AArch64
//! trace give byte-identical `report --json` and `dump` output from the x86-64 tracer and
//! from the aarch64 tracer (under qemu-user). Chunk groups: sqlite takes 3.8 bytes a record
//! where single chunks took 5.9. `FinalStats::unattached` counts the programs "lost before
//! attach" (`tracer-common/src/books.rs`).

pub mod clock;
mod direct;
mod index;
mod pack;
mod read;
mod segments;
mod write;

pub use index::{Drains, IndexEntry};
pub use pack::GroupPacker;
pub use read::*;
pub use segments::{Rotation, SegmentInfo, segment_path, segments_of};
pub use write::*;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use tracer_common::{
    CHUNK_HEADER_BYTES, ChunkHeader,
    meta::{MetaError, Metadata},
};

use clock::{Anchor, Calibration};

pub const MAGIC: [u8; 8] = *b"UTRCTRAC";
/// 2: chunk headers carry the drain's clock sample (48 bytes). 3: chunks are written
/// packed (`SECTION_CHUNK_PACKED`); version 2 files still read. 4: chunks of up to
/// 512 records, not 128, packed against a 256-entry site table, not 64 (`pack/`);
/// versions 2 and 3 still read. 5: consecutive chunks packed as one stream
/// (`SECTION_CHUNKS_PACKED`); earlier versions still read. 6: packed records may say
/// "same time as the previous record" in their tag, and groups pack against a 65,536-entry
/// table (`pack/`); earlier versions still read.
pub const FORMAT_VERSION: u32 = 6;
/// The oldest version readers accept (older ones are refused, naming both).
pub const OLDEST_READABLE: u32 = 2;
const FILE_HEADER_LEN: usize = 16;
/// Where the file header's flags are.
const FILE_FLAGS_AT: usize = 12;
/// File header flag: the session writing the file has not finished (yet, or ever).
pub const FILE_INCOMPLETE: u32 = 1;
const SECTION_HEADER_LEN: usize = 16;

pub const SECTION_SESSION: u32 = 1;
pub const SECTION_BINARY: u32 = 2;
pub const SECTION_CHUNK: u32 = 3;
pub const SECTION_STATS: u32 = 4;
pub const SECTION_COMM: u32 = 5;
pub const SECTION_LOAD: u32 = 6;
pub const SECTION_CHUNK_PACKED: u32 = 7;
pub const SECTION_STRING: u32 = 8;
pub const SECTION_CHUNKS_PACKED: u32 = 9;
/// A segment's number and repeated sections (`segments.rs`).
pub const SECTION_SEGMENT: u32 = 10;
/// Where the sections of chunks are and their times (`index.rs`), after the stats.
pub const SECTION_INDEX: u32 = 11;
/// Most chunks in one `SECTION_CHUNKS_PACKED` (the tracer writes up to `GROUP_CHUNKS`).
pub const GROUP_CHUNKS_MAX: usize = 64;
/// Chunks the tracer packs together at most: eight flushes of the default 4,096-record
/// buffer (a sqlite memory trace: 6.2 bytes an access in groups of 8 chunks, 4.5 in
/// groups of 64 with version 5's table). A drain's last group is written when the
/// consumer finds no more chunks or the group has waited (`ChunkGroup::age`).
pub const GROUP_CHUNKS: usize = 64;
/// Bytes of a string section's payload before its text.
pub const STRING_SECTION_FIXED: usize = 32;

/// Largest section a reader accepts (a JSON blob or a note; chunks are at most ~16 KiB).
const MAX_SECTION: u64 = 1 << 30;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Command line as given (`record -- CMD ARGS`), or the attached process's cmdline.
    pub command: Vec<String>,
    /// Processes traced from the start (children are added as they fork).
    pub pids: Vec<u32>,
    /// "exec" or "attach".
    pub mode: String,
    pub arch: String,
    pub record_version: u32,
    pub ring_bytes: u32,
    /// Whether the eBPF programs could reset/release slots in user memory (false on
    /// kernels in lockdown; then delivery positions are kept in a map).
    #[serde(default)]
    pub write_user: bool,
    /// Counter frequency and anchor measured at the start of the session.
    pub clock: Calibration,
    /// Wall-clock start, seconds since the epoch (for humans).
    pub start_unix_s: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FinalStats {
    /// Kernel counters (`STAT_*`, summed over CPUs).
    pub records_delivered: u64,
    pub records_dropped: u64,
    pub chunks: u64,
    pub read_errors: u64,
    pub records_skipped: u64,
    /// Flushes of processes with more instrumented binaries than the eBPF side tracks.
    #[serde(default)]
    pub table_full: u64,
    /// Flushes of processes left without a `TABLES` entry (not drained at thread exit):
    /// their user holds its share (`ebpf::TABLES_PER_UID`).
    #[serde(default)]
    pub table_share: u64,
    /// Flushes held back for want of room in the ring buffer (`--on-full wait`): each
    /// time the thread waited and flushed again.
    #[serde(default)]
    pub holds: u64,
    /// Sequence numbers the kernel handed out (one per chunk it tried to emit).
    pub seq_issued: u64,
    /// What the consumer wrote into this file.
    pub records_received: u64,
    pub chunks_received: u64,
    /// Ring-buffer entries the consumer could not make sense of.
    pub bad_entries: u64,
    /// Records taken out of buffers or emitted at uprobe sites; each was delivered,
    /// filtered or dropped: produced = delivered + filtered + dropped.
    #[serde(default)]
    pub records_produced: u64,
    /// Records the in-kernel filters did not keep.
    #[serde(default)]
    pub records_filtered: u64,
    /// Of the produced and delivered records: those the tracer collected from the
    /// buffers of a process still running when a `record -p` session ended.
    #[serde(default)]
    pub records_at_stop: u64,
    /// `records_dropped` per CPU (index = CPU).
    #[serde(default)]
    pub dropped_per_cpu: Vec<u64>,
    /// The filter in force at the end (`FilterSpec::describe`).
    #[serde(default)]
    pub filter: String,
    /// Filter changes made while the session ran (`tracer filter`).
    #[serde(default)]
    pub filter_changes: u64,
    /// Programs that waited in vain for the tracer to attach their binary ("lost before
    /// attach"): the wait ran out, or the session let them go first, so their records
    /// never reached a drain and are in none of the other counters.
    #[serde(default)]
    pub unattached: u64,
    /// Instrumented binaries that joined the running session.
    #[serde(default)]
    pub binaries_added: u64,
    /// Segments of a trace written in segments (`segments.rs`; 0: one file).
    #[serde(default)]
    pub segments: u32,
    /// Of `records_received`: those in segments removed to keep under `--max-size`.
    #[serde(default)]
    pub records_rotated_out: u64,
    #[serde(default)]
    pub segments_rotated_out: u64,
    #[serde(default)]
    pub chunks_rotated_out: u64,
    /// The duration filter (`--min-duration`): calls it dropped as shorter than its
    /// threshold (entry and exit, within `records_filtered`), and entries it passed
    /// unjudged as deeper than its stacks.
    #[serde(default)]
    pub calls_short: u64,
    #[serde(default)]
    pub calls_deep: u64,
    pub threads: u64,
    /// Counter/clock anchor at the end of the session.
    pub clock_end: Option<Anchor>,
    /// Exit code of the traced command (128+signal if killed); None when attached.
    pub exit_code: Option<i32>,
}

#[derive(Clone, Debug)]
pub struct BinaryInfo {
    pub ordinal: u32,
    pub binary_id: u64,
    pub path: String,
    /// Raw `.note.utrace` section contents.
    pub note: Vec<u8>,
}

impl BinaryInfo {
    pub fn metadata(&self) -> Result<Metadata, MetaError> {
        Metadata::from_note_section(&self.note).unwrap_or(Err(MetaError::Truncated("note")))
    }

    /// File name part of the path (what dump and report show).
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.path.len() + self.note.len());
        out.extend_from_slice(&self.ordinal.to_le_bytes());
        out.extend_from_slice(&(self.path.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.binary_id.to_le_bytes());
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(&self.note);
        out
    }

    fn decode(b: &[u8]) -> Result<Self> {
        ensure!(b.len() >= 16, "binary section too short");
        let path_len = u32_at(b, 4) as usize;
        let path = b
            .get(16..16 + path_len)
            .with_context(|| format!("path of {path_len} bytes runs past the section's end"))?;
        Ok(BinaryInfo {
            ordinal: u32_at(b, 0),
            binary_id: u64_at(b, 8),
            path: String::from_utf8_lossy(path).into_owned(),
            note: b[16 + path_len..].to_vec(),
        })
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// The chunk headers of a section of `kind` in a file of format `version` (None:
/// another kind, or malformed).
fn chunk_headers_of(kind: u32, version: u32, payload: &[u8]) -> Option<Vec<ChunkHeader>> {
    match kind {
        SECTION_CHUNK | SECTION_CHUNK_PACKED => Some(vec![chunk_header(payload)?]),
        SECTION_CHUNKS_PACKED if version >= 5 => {
            let n = u32_at(payload.get(..4)?, 0) as usize;
            if !(1..=GROUP_CHUNKS_MAX).contains(&n) {
                return None;
            }
            payload
                .get(8..8 + n * CHUNK_HEADER_BYTES)?
                .chunks_exact(CHUNK_HEADER_BYTES)
                .map(chunk_header)
                .collect()
        }
        _ => None,
    }
}

/// Decode a `ChunkHeader` from the start of `b` (at least 48 bytes).
pub fn chunk_header(b: &[u8]) -> Option<ChunkHeader> {
    Some(ChunkHeader::from_bytes(
        b.get(..CHUNK_HEADER_BYTES)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracefile::clock::Anchor;
    use tracer_common::{CHUNK_KIND_RECORDS, CHUNK_KIND_UPROBE, RECORD_SIZE};

    fn session() -> SessionInfo {
        SessionInfo {
            command: vec!["/bin/true".into()],
            pids: vec![42],
            mode: "exec".into(),
            arch: "x86_64".into(),
            record_version: 1,
            ring_bytes: 4096,
            write_user: false,
            clock: Calibration {
                tsc_hz: 1e9,
                anchor: Anchor {
                    tsc: 1,
                    monotonic_ns: 2,
                },
            },
            start_unix_s: 0,
        }
    }

    fn entry(kind: u32, count: u32, reserved: usize) -> Vec<u8> {
        let mut e = vec![0u8; reserved];
        e[0..4].copy_from_slice(&kind.to_le_bytes());
        e[4..8].copy_from_slice(&count.to_le_bytes());
        e[8..12].copy_from_slice(&7u32.to_le_bytes());
        // Number the records that fit (a short entry is one of the malformed cases).
        for i in 0..count as usize {
            let o = CHUNK_HEADER_BYTES + i * RECORD_SIZE;
            if let Some(site) = e.get_mut(o..o + 4) {
                site.copy_from_slice(&(i as u32).to_le_bytes());
            }
        }
        e
    }

    /// A version 2 file (records as they are, `SECTION_CHUNK`) still reads, with the
    /// same records as the packed chunk of a current file; version 1 is refused.
    #[test]
    fn version_2_chunks_read() {
        let dir = std::env::temp_dir().join(format!("utrace-v2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = entry(CHUNK_KIND_RECORDS, 3, tracer_common::CHUNK_BYTES);
        let raw = &e[..CHUNK_HEADER_BYTES + 3 * RECORD_SIZE];
        let mut packed = Vec::new();
        encode_chunk(&e, &mut packed).unwrap();
        let read = |version: u32, section: &[u8]| {
            let path = dir.join(format!("v{version}.utrace"));
            let mut b = MAGIC.to_vec();
            b.extend_from_slice(&version.to_le_bytes());
            b.extend_from_slice(&[0; 4]);
            b.extend_from_slice(section);
            std::fs::write(&path, b).unwrap();
            let mut r = Reader::open(&path)?;
            match r.next_section()? {
                Some(Section::Chunk(c)) => Ok(c.records),
                _ => anyhow::bail!("no chunk"),
            }
        };
        let mut v2 = Vec::new();
        push_section_header(&mut v2, SECTION_CHUNK, raw.len() as u64);
        v2.extend_from_slice(raw);
        let old = read(2, &v2).unwrap();
        assert_eq!(old.iter().map(|r| r.site).collect::<Vec<_>>(), [0, 1, 2]);
        // Packed chunks of versions 3 to 5 are pinned by `pack`'s golden bytes.
        assert_eq!(read(FORMAT_VERSION, &packed).unwrap(), old);
        let e = read(1, &v2).unwrap_err().to_string();
        assert!(e.contains("version 1 is not supported"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Chunks packed as a group (version 5) read back as the chunks they were, in
    /// order, beside a single packed chunk; a group of the wrong size or kind, or with
    /// bytes missing, is an error.
    #[test]
    fn chunk_groups_read_back_as_their_chunks() {
        let mut sections = Vec::new();
        let mut group = ChunkGroup::default();
        let mut want = Vec::new();
        for (i, n) in [3u32, 512, 1, 9].into_iter().enumerate() {
            let mut e = entry(CHUNK_KIND_RECORDS, n, tracer_common::CHUNK_BYTES);
            e[16..24].copy_from_slice(&(i as u64).to_le_bytes()); // seq
            let h = group.add(&e, &mut sections).unwrap();
            want.push((h.seq, n));
        }
        assert!(
            group
                .add(&entry(CHUNK_KIND_UPROBE, 1, 80), &mut sections)
                .is_none()
        );
        group.flush(&mut sections);
        let one = entry(CHUNK_KIND_RECORDS, 2, tracer_common::CHUNK_BYTES);
        encode_chunk(&one, &mut sections).unwrap();
        want.push((0, 2));
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        let file = |body: &[u8]| [&b[..], body].concat();
        let mut r = Reader::from_bytes("groups", file(&sections)).unwrap();
        let mut got = Vec::new();
        while let Some(Section::Chunk(c)) = r.next_section().unwrap() {
            let sites: Vec<u32> = c.records.iter().map(|r| r.site).collect();
            assert_eq!(sites, (0..c.header.count).collect::<Vec<_>>());
            got.push((c.header.seq, c.header.count));
        }
        assert_eq!(got, want);
        assert!(r.truncated().is_none());
        // Damaged groups: too many chunks, a record count past the bytes.
        let bad = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut s = sections.clone();
            edit(&mut s);
            let mut r = Reader::from_bytes("bad", file(&s)).unwrap();
            r.next_section().map(|_| ()).unwrap_err().to_string()
        };
        let e = bad(&|s| s[16..20].copy_from_slice(&65u32.to_le_bytes()));
        assert!(e.contains("bad chunk group section"), "{e}");
        let e = bad(&|s| s[24 + 4..24 + 8].copy_from_slice(&600u32.to_le_bytes()));
        assert!(e.contains("bad chunk group section"), "{e}");
    }

    #[test]
    fn roundtrip_and_truncation() {
        let dir = std::env::temp_dir().join(format!("utrace-tf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("t.utrace");
        let mut w = Writer::create(&dest).unwrap();
        w.write_session(&session()).unwrap();
        w.write_binary(&BinaryInfo {
            ordinal: 0,
            binary_id: 9,
            path: "/x/prog".into(),
            note: vec![1, 2, 3],
        })
        .unwrap();
        let mut buf = Vec::new();
        assert!(
            encode_chunk(
                &entry(CHUNK_KIND_RECORDS, 3, tracer_common::CHUNK_BYTES),
                &mut buf
            )
            .is_some()
        );
        let one = CHUNK_HEADER_BYTES + RECORD_SIZE;
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 1, one), &mut buf).is_some());
        // A USDT probe's event: up to 6 records in one uprobe chunk.
        let six = CHUNK_HEADER_BYTES + 6 * RECORD_SIZE;
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 2, six), &mut buf).is_some());
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 3, one + RECORD_SIZE), &mut buf).is_none());
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 7, six + RECORD_SIZE), &mut buf).is_none());
        assert!(encode_chunk(&entry(9, 1, one), &mut buf).is_none());
        assert!(encode_chunk(&entry(CHUNK_KIND_RECORDS, 3, 100), &mut buf).is_none());
        // A string as eBPF sends it: the helper's length counts the NUL.
        let mut s = entry(
            tracer_common::CHUNK_KIND_STRING,
            0,
            tracer_common::STRING_CHUNK_FIXED,
        );
        s[48..56].copy_from_slice(&0x1234u64.to_le_bytes());
        s[56..60].copy_from_slice(&5u32.to_le_bytes());
        s.extend_from_slice(b"a.py\0garbage");
        assert!(encode_string(&s, &mut buf));
        assert!(!encode_string(&s[..40], &mut buf));
        w.write_raw(&buf).unwrap();
        w.finish(&FinalStats {
            records_received: 4,
            ..Default::default()
        })
        .unwrap();

        let mut r = Reader::open(&dest).unwrap();
        let mut kinds = Vec::new();
        while let Some(s) = r.next_section().unwrap() {
            kinds.push(match s {
                Section::Session(s) => {
                    assert_eq!(s.pids, vec![42]);
                    "session"
                }
                Section::Binary(b) => {
                    assert_eq!(
                        (b.binary_id, b.name(), &b.note[..]),
                        (9, "prog", &[1u8, 2, 3][..])
                    );
                    "binary"
                }
                Section::Comm(..) => "comm",
                Section::Load(..) => "load",
                Section::String(s) => {
                    assert_eq!(
                        (s.pid, s.tid, s.ptr, s.status, &s.text[..]),
                        (7, 0, 0x1234, 0, "a.py")
                    );
                    "string"
                }
                Section::Chunk(c) => {
                    assert_eq!(c.header.pid, 7);
                    assert_eq!(c.records.len(), c.header.count as usize);
                    assert_eq!(c.records.last().unwrap().site, c.header.count - 1);
                    "chunk"
                }
                Section::Stats(s) => {
                    assert_eq!(s.records_received, 4);
                    "stats"
                }
                Section::Unknown(_) => "unknown",
            });
        }
        assert_eq!(
            kinds,
            [
                "session", "binary", "chunk", "chunk", "chunk", "string", "stats"
            ]
        );
        assert!(r.truncated().is_none());

        // The index ends the file; cut inside the stats before it: everything before
        // them still reads.
        let full = std::fs::read(&dest).unwrap();
        assert_eq!(&full[full.len() - 8..], b"UTRCINDX");
        let index_at = u64_at(&full, full.len() - 24) as usize;
        let cut = dir.join("cut.utrace");
        std::fs::write(&cut, &full[..index_at - 3]).unwrap();
        let mut r = Reader::open(&cut).unwrap();
        let mut n = 0;
        while r.next_section().unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 6);
        assert_eq!(r.truncated().unwrap().what, "section payload");

        // Wrong magic and version are refused with a clear error.
        std::fs::write(&cut, b"NOTATRACEFILE...").unwrap();
        let e = Reader::open(&cut).err().unwrap().to_string();
        assert!(e.contains("not a utrace trace file"), "{e}");
        let mut other = full.clone();
        other[8] = 9;
        std::fs::write(&cut, &other).unwrap();
        let e = Reader::open(&cut).err().unwrap().to_string();
        assert!(e.contains("version 9 is not supported"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
