//! Writing a trace file: sections appended as the session runs, under the name asked
//! for from the session's start, flagged `FILE_INCOMPLETE` until its end is written (a
//! tracer killed mid-session leaves a readable trace that says so).
//!
//! The file is created 0600 with `O_EXCL` as a temporary in the destination directory
//! (never written through a planted file or link) and renamed into place by
//! [`Writer::publish`] once the session's first sections are in it: a session that fails
//! before that leaves nothing, and an older trace at the name is replaced only by a
//! session that started. `record` refuses a directory at the trace's name before the
//! session starts (`trust_limits::a_directory_at_the_trace_name_loses_nothing`). Writes
//! go through `direct.rs`, put into the file at least every [`CHECKPOINT_EVERY`]; a
//! `Tee` copies every section to a live view (`views/top.rs`).

use std::{
    io::Write,
    mem::offset_of,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use tracer_common::{
    CHUNK_HEADER_BYTES, CHUNK_KIND_RECORDS, CHUNK_KIND_UPROBE, CHUNK_RECORDS, ChunkHeader,
    RECORD_SIZE, Record, STRING_BYTES, STRING_CHUNK_FIXED, StringChunk,
};

use super::direct::DirectWriter;
use super::index::IndexBuilder;
use super::{
    BinaryInfo, FILE_FLAGS_AT, FILE_HEADER_LEN, FILE_INCOMPLETE, FORMAT_VERSION, FinalStats,
    GROUP_CHUNKS, MAGIC, SECTION_BINARY, SECTION_CHUNK_PACKED, SECTION_CHUNKS_PACKED, SECTION_COMM,
    SECTION_HEADER_LEN, SECTION_INDEX, SECTION_LOAD, SECTION_SEGMENT, SECTION_SESSION,
    SECTION_STATS, SECTION_STRING, STRING_SECTION_FIXED, SessionInfo, chunk_header,
    pack::{GroupPacker, pack},
    segments::{Replay, Rotation, SegmentInfo, segment_path, segments_of},
    u32_at, u64_at,
};

/// A well-formed ring-buffer entry of records: its header and its records.
fn chunk_records(entry: &[u8]) -> Option<(ChunkHeader, impl ExactSizeIterator<Item = Record>)> {
    let h = chunk_header(entry)?;
    let max = match h.kind {
        CHUNK_KIND_RECORDS => CHUNK_RECORDS,
        // A uprobe-site event: its record, plus the argument records of a USDT probe.
        CHUNK_KIND_UPROBE => tracer_common::operand::MAX_OPERAND_RECORDS,
        _ => return None,
    };
    let len = CHUNK_HEADER_BYTES + h.count as usize * RECORD_SIZE;
    if h.count as usize > max || entry.len() < len {
        return None;
    }
    let records = entry[CHUNK_HEADER_BYTES..len]
        .chunks_exact(RECORD_SIZE)
        .map(|r| Record::from_bytes(r.try_into().expect("RECORD_SIZE bytes")));
    Some((h, records))
}

/// Consecutive chunks of records copied out of the ring buffer, to be packed as one
/// stream into one `SECTION_CHUNKS_PACKED` (up to `GROUP_CHUNKS`), by whichever thread
/// ([`RawGroup::pack`]): groups are independent streams, so packer threads can pack
/// several at once while the consumer keeps emptying the ring.
#[derive(Default)]
pub struct RawGroup {
    headers: Vec<u8>,
    records: Vec<u8>,
    n: u32,
    /// When the first chunk of the pending group came.
    since: Option<std::time::Instant>,
}

impl RawGroup {
    /// Add a ring-buffer entry of `CHUNK_KIND_RECORDS`: its header and whether the
    /// group is now full, or None if the entry is not one or is malformed (nothing
    /// added).
    pub fn add(&mut self, entry: &[u8]) -> Option<(ChunkHeader, bool)> {
        let (h, _) = chunk_records(entry).filter(|(h, _)| h.kind == CHUNK_KIND_RECORDS)?;
        if self.n == 0 {
            self.since = Some(std::time::Instant::now());
        }
        let len = h.count as usize * RECORD_SIZE;
        self.headers.extend_from_slice(&entry[..CHUNK_HEADER_BYTES]);
        self.records
            .extend_from_slice(&entry[CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + len]);
        self.n += 1;
        Some((h, self.n as usize == GROUP_CHUNKS))
    }

    /// How long the pending chunks have waited (None: no chunk pending).
    pub fn age(&self) -> Option<std::time::Duration> {
        self.since.map(|t| t.elapsed())
    }

    /// The pending chunks (None: none), leaving the group empty.
    pub fn take(&mut self) -> Option<RawGroup> {
        (self.n > 0).then(|| std::mem::take(self))
    }

    /// The chunks as one section, packed with `packer`, appended to `out`.
    pub fn pack(&self, packer: &mut GroupPacker, out: &mut Vec<u8>) {
        if self.n == 0 {
            return;
        }
        let at = out.len();
        push_section_header(out, SECTION_CHUNKS_PACKED, 0);
        out.extend_from_slice(&self.n.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.headers);
        packer.start();
        let records = self
            .records
            .chunks_exact(RECORD_SIZE)
            .map(|r| Record::from_bytes(r.try_into().expect("RECORD_SIZE bytes")));
        packer.pack(records, out);
        let payload = (out.len() - at - SECTION_HEADER_LEN) as u64;
        out[at + 8..at + 16].copy_from_slice(&payload.to_le_bytes());
    }
}

/// A [`RawGroup`] packed on the spot: `add` appends full groups to `out`.
#[derive(Default)]
pub struct ChunkGroup {
    raw: RawGroup,
    packer: GroupPacker,
}

impl ChunkGroup {
    /// Add a ring-buffer entry of `CHUNK_KIND_RECORDS`; its header, or None if the
    /// entry is not one or is malformed (nothing added). Full groups go to `out`.
    pub fn add(&mut self, entry: &[u8], out: &mut Vec<u8>) -> Option<ChunkHeader> {
        let (h, full) = self.raw.add(entry)?;
        if full {
            self.flush(out);
        }
        Some(h)
    }

    /// The chunks added so far as one section, appended to `out` (none: nothing).
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        if let Some(g) = self.raw.take() {
            g.pack(&mut self.packer, out);
        }
    }
}

/// Check a ring-buffer entry and append it to `out` as a packed chunk section: its
/// header, then its `count` records packed (`pack`). Returns the header, or None if
/// the entry is malformed.
pub fn encode_chunk(entry: &[u8], out: &mut Vec<u8>) -> Option<ChunkHeader> {
    let (h, records) = chunk_records(entry)?;
    let at = out.len();
    push_section_header(out, SECTION_CHUNK_PACKED, 0);
    out.extend_from_slice(&entry[..CHUNK_HEADER_BYTES]);
    pack(records, out);
    let payload = (out.len() - at - SECTION_HEADER_LEN) as u64;
    out[at + 8..at + 16].copy_from_slice(&payload.to_le_bytes());
    Some(h)
}

/// A `CHUNK_KIND_COMM` ring-buffer entry as a comm section; false if malformed.
pub fn encode_comm(entry: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(h) = chunk_header(entry) else {
        return false;
    };
    let Some(comm) = entry.get(CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + 16) else {
        return false;
    };
    push_section_header(out, SECTION_COMM, 24);
    out.extend_from_slice(&h.pid.to_le_bytes());
    out.extend_from_slice(&h.tid.to_le_bytes());
    out.extend_from_slice(comm);
    true
}

/// A `CHUNK_KIND_STRING` ring-buffer entry as a string section; false if malformed.
pub fn encode_string(entry: &[u8], out: &mut Vec<u8>) -> bool {
    let (Some(h), Some(fixed)) = (chunk_header(entry), entry.get(..STRING_CHUNK_FIXED)) else {
        return false;
    };
    let at = |o: usize| u64_at(fixed, o);
    let ptr = at(offset_of!(StringChunk, ptr));
    let len = u32_at(fixed, offset_of!(StringChunk, len)) as usize;
    let status = u32_at(fixed, offset_of!(StringChunk, status));
    // The bytes before the NUL (the helper counts it).
    let Some(bytes) = entry.get(STRING_CHUNK_FIXED..STRING_CHUNK_FIXED + len.min(STRING_BYTES))
    else {
        return false;
    };
    let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
    push_section_header(
        out,
        SECTION_STRING,
        (STRING_SECTION_FIXED + text.len()) as u64,
    );
    out.extend_from_slice(&h.pid.to_le_bytes());
    out.extend_from_slice(&h.tid.to_le_bytes());
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&ptr.to_le_bytes());
    out.extend_from_slice(&h.time.to_le_bytes());
    out.extend_from_slice(text);
    true
}

/// A load section as bytes: binary `binary_id` is at `bias` in process `pid`.
pub fn encode_load(pid: u32, binary_id: u64, bias: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(SECTION_HEADER_LEN + 24);
    push_section_header(&mut out, SECTION_LOAD, 24);
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&binary_id.to_le_bytes());
    out.extend_from_slice(&bias.to_le_bytes());
    out
}

/// A binary section as bytes (for a binary that joins a running session).
pub fn encode_binary(b: &BinaryInfo) -> Vec<u8> {
    let payload = b.encode();
    let mut out = Vec::with_capacity(SECTION_HEADER_LEN + payload.len());
    push_section_header(&mut out, SECTION_BINARY, payload.len() as u64);
    out.extend_from_slice(&payload);
    out
}

pub(crate) fn push_section_header(out: &mut Vec<u8>, kind: u32, len: u64) {
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
}

/// Where an output `dest` is written before it is renamed into place:
/// `<dir>/.<name>.<pid>.tmp`.
pub fn temporary_for(dest: &Path) -> Result<PathBuf> {
    let name = dest
        .file_name()
        .with_context(|| format!("{} is not a file name", dest.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    Ok(dest.with_file_name(tmp_name))
}

/// Temporary files of earlier sessions writing `dest` whose tracer is gone (killed
/// before it could rename or remove them): `.<name>.<pid>.tmp` with a dead pid.
fn remove_stale_temporaries(dest: &Path, name: &std::ffi::OsStr) {
    let (Some(dir), Some(name)) = (dest.parent(), name.to_str()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|f| f.strip_suffix(".tmp"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The file header: magic, format version, flags.
fn file_header(flags: u32) -> Vec<u8> {
    let mut header = Vec::with_capacity(FILE_HEADER_LEN);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&flags.to_le_bytes());
    header
}

/// How long written sections may wait in the writer before they are put into the file.
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes a trace to `<dir>/.<name>.<pid>.tmp`, renamed to the destination by
/// [`Writer::publish`]; [`Writer::finish`] ends it. Dropped before it was published, it
/// removes the temporary file; after, the trace stays, flagged incomplete.
pub struct Writer {
    out: DirectWriter,
    tmp: PathBuf,
    dest: PathBuf,
    /// Renamed into place.
    published: bool,
    done: bool,
    /// When the bytes held back were last put into the file.
    checkpointed: std::time::Instant,
    /// A copy of the file's bytes for a live view, whole sections at a time.
    tee: Option<Tee>,
    /// A trace in segments (`segments.rs`): None for one file.
    segments: Option<Segments>,
    /// The index of a trace in one file (`index.rs`), written after the stats.
    index: Option<IndexBuilder>,
}

/// The state of a trace written in segments.
struct Segments {
    /// The name asked for: segments are `base.N`.
    base: PathBuf,
    rotation: Rotation,
    /// The current segment's number.
    index: u32,
    started: std::time::Instant,
    /// Bytes, chunks and records of the current segment.
    bytes: u64,
    chunks: u64,
    records: u64,
    replay: Replay,
    /// Finished segments still on disk, oldest first: (path, bytes, chunks, records).
    kept: std::collections::VecDeque<(PathBuf, u64, u64, u64)>,
    /// Removed: (segments, chunks, records).
    rotated_out: (u64, u64, u64),
}

impl Segments {
    /// Sections written to the current segment.
    fn note(&mut self, bytes: &[u8]) {
        let (chunks, records) = self.replay.note(bytes);
        self.chunks += chunks;
        self.records += records;
    }
}

/// A new file at `dest`: created 0600 with `O_EXCL` at its temporary name.
fn create_file(dest: &Path) -> Result<(DirectWriter, PathBuf)> {
    let tmp = temporary_for(dest)?;
    refuse_directory(dest)?;
    if let Some(name) = dest.file_name() {
        remove_stale_temporaries(dest, name);
    }
    // 0600: a trace holds arguments, return values and memory addresses of the
    // traced programs. create_new: never write through a planted file or link.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
    }
    .with_context(|| format!("cannot create {}", tmp.display()))?;
    Ok((DirectWriter::new(file), tmp))
}

/// The bytes a segment starts with after its file header: its segment section, then
/// the sections it repeats.
fn segment_start(index: u32, replay: &[u8]) -> Result<Vec<u8>> {
    let info = serde_json::to_vec(&SegmentInfo {
        index,
        replay_bytes: replay.len() as u64,
    })?;
    let mut out = Vec::with_capacity(SECTION_HEADER_LEN + info.len() + replay.len());
    push_section_header(&mut out, SECTION_SEGMENT, info.len() as u64);
    out.extend_from_slice(&info);
    out.extend_from_slice(replay);
    Ok(out)
}

/// Where a live view (`record --live`) gets a copy of the trace as it is written:
/// the file header, then whole sections, all of them (a view that missed some would
/// pair calls wrongly), closed when the file is finished. The channel is bounded: a
/// view that falls that far behind holds the writer back (and so the session).
pub struct Tee {
    pub bytes: std::sync::mpsc::SyncSender<Vec<u8>>,
}

impl Tee {
    fn send(&mut self, bytes: &[u8]) {
        // A view that stopped is no reason to stop writing the file.
        let _ = self.bytes.send(bytes.to_vec());
    }
}

impl Writer {
    pub fn create(dest: &Path) -> Result<Self> {
        Self::create_with(dest, Rotation::default())
    }

    /// A trace at `dest`, in segments `dest.1`, `dest.2`, ... if `rotation` is on.
    pub fn create_with(dest: &Path, rotation: Rotation) -> Result<Self> {
        let first = if rotation.on() {
            segment_path(dest, 1)
        } else {
            dest.to_path_buf()
        };
        let (out, tmp) = create_file(&first)?;
        let mut w = Writer {
            out,
            tmp,
            dest: first,
            published: false,
            done: false,
            checkpointed: std::time::Instant::now(),
            tee: None,
            segments: rotation.on().then(|| Segments {
                base: dest.to_path_buf(),
                rotation,
                index: 1,
                started: std::time::Instant::now(),
                bytes: 0,
                chunks: 0,
                records: 0,
                replay: Replay::default(),
                kept: Default::default(),
                rotated_out: (0, 0, 0),
            }),
            index: (!rotation.on()).then(IndexBuilder::default),
        };
        w.put(&file_header(FILE_INCOMPLETE))?;
        if w.segments.is_some() {
            w.put(&segment_start(1, &[])?)?;
        }
        Ok(w)
    }

    /// Copy everything from here on to `tee` (a live view), starting with the file
    /// header; call before any section is written.
    pub fn tee_to(&mut self, mut tee: Tee) {
        tee.send(&file_header(FILE_INCOMPLETE));
        self.tee = Some(tee);
    }

    /// Put the trace under its name (the sections so far into the file first): from
    /// here on a session that dies leaves it there, flagged incomplete. A rename over
    /// a link replaces the link.
    pub fn publish(&mut self) -> Result<()> {
        self.checkpoint()?;
        std::fs::rename(&self.tmp, &self.dest)
            .with_context(|| format!("cannot put the trace at {}", self.dest.display()))?;
        self.published = true;
        if let Some(s) = &self.segments
            && s.index == 1
        {
            // This trace replaces an older one of the name: its file or its other
            // segments would be read with it.
            let _ = std::fs::remove_file(&s.base);
            for (n, path) in segments_of(&s.base) {
                if n > 1 {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        Ok(())
    }

    /// Put what the writer holds into the file if it has waited [`CHECKPOINT_EVERY`].
    pub fn checkpoint_if_due(&mut self) -> Result<()> {
        if self.checkpointed.elapsed() >= CHECKPOINT_EVERY {
            self.checkpoint()?;
        }
        self.rotate_if_due()
    }

    fn checkpoint(&mut self) -> Result<()> {
        self.checkpointed = std::time::Instant::now();
        self.out
            .checkpoint()
            .with_context(|| format!("cannot write {}", self.path().display()))
    }

    /// Where the file is now.
    fn path(&self) -> &Path {
        if self.published {
            &self.dest
        } else {
            &self.tmp
        }
    }

    fn section(&mut self, kind: u32, payload: &[u8]) -> Result<()> {
        let mut h = Vec::with_capacity(SECTION_HEADER_LEN + payload.len());
        push_section_header(&mut h, kind, payload.len() as u64);
        h.extend_from_slice(payload);
        if let Some(t) = &mut self.tee {
            t.send(&h);
        }
        if let Some(s) = &mut self.segments {
            s.note(&h);
        }
        if let Some(ix) = &mut self.index {
            ix.note(&h);
        }
        self.put(&h)
    }

    pub fn write_session(&mut self, s: &SessionInfo) -> Result<()> {
        self.section(SECTION_SESSION, &serde_json::to_vec(s)?)
    }

    pub fn write_binary(&mut self, b: &BinaryInfo) -> Result<()> {
        self.section(SECTION_BINARY, &b.encode())
    }

    /// Bytes that are already complete sections (from [`encode_chunk`]).
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        if let Some(t) = &mut self.tee {
            t.send(bytes);
        }
        if let Some(s) = &mut self.segments {
            s.note(bytes);
        }
        if let Some(ix) = &mut self.index {
            ix.note(bytes);
        }
        self.put(bytes)?;
        self.rotate_if_due()
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(e) = self.out.write_all(bytes) {
            return Err(e).with_context(|| format!("cannot write {}", self.path().display()));
        }
        if let Some(s) = &mut self.segments {
            s.bytes += bytes.len() as u64;
        }
        Ok(())
    }

    /// Go on in a new segment if the current one is full or old enough.
    fn rotate_if_due(&mut self) -> Result<()> {
        let Some(s) = &self.segments else {
            return Ok(());
        };
        let full = s.rotation.segment_bytes().is_some_and(|b| s.bytes >= b);
        let old = s
            .rotation
            .split_every
            .is_some_and(|d| s.started.elapsed() >= d);
        if full || old { self.rotate() } else { Ok(()) }
    }

    /// End the current segment (complete, no stats) and start the next one, which
    /// repeats the sections readers need; then remove the oldest while over the size.
    fn rotate(&mut self) -> Result<()> {
        let Some(mut s) = self.segments.take() else {
            return Ok(());
        };
        let at = self.path().to_path_buf();
        let end = |w: &mut Self| -> std::io::Result<()> {
            w.out.finish()?;
            w.out.patch(FILE_FLAGS_AT as u64, &0u32.to_le_bytes())
        };
        end(self).with_context(|| format!("cannot write {}", at.display()))?;
        s.kept.push_back((at, s.bytes, s.chunks, s.records));
        s.index += 1;
        let next = segment_path(&s.base, s.index);
        let (out, tmp) = create_file(&next)?;
        (self.out, self.tmp, self.dest, self.published) = (out, tmp, next, false);
        let start = segment_start(s.index, &s.replay.bytes())?;
        (s.bytes, s.chunks, s.records) = (0, 0, 0);
        s.started = std::time::Instant::now();
        self.segments = Some(s);
        self.put(&file_header(FILE_INCOMPLETE))?;
        self.put(&start)?;
        self.publish()?;
        self.remove_oldest()
    }

    /// `--max-size`: the oldest segments removed while all of them hold more.
    fn remove_oldest(&mut self) -> Result<()> {
        let Some(s) = &mut self.segments else {
            return Ok(());
        };
        let Some(max) = s.rotation.max_bytes else {
            return Ok(());
        };
        let mut total: u64 = s.bytes + s.kept.iter().map(|k| k.1).sum::<u64>();
        while total > max
            && let Some((path, bytes, chunks, records)) = s.kept.pop_front()
        {
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
            total -= bytes;
            s.rotated_out.0 += 1;
            s.rotated_out.1 += chunks;
            s.rotated_out.2 += records;
        }
        Ok(())
    }

    /// Append the stats section, clear the incomplete flag, and put the file in place
    /// if it is not yet.
    pub fn finish(mut self, stats: &FinalStats) -> Result<PathBuf> {
        let mut stats = stats.clone();
        if let Some(s) = &self.segments {
            stats.segments = s.index;
            (
                stats.segments_rotated_out,
                stats.chunks_rotated_out,
                stats.records_rotated_out,
            ) = s.rotated_out;
        }
        self.section(SECTION_STATS, &serde_json::to_vec(&stats)?)?;
        // The view's copy ends with the file.
        self.tee = None;
        if let Some(index) = self.index.take().and_then(|ix| ix.payload()) {
            self.section(SECTION_INDEX, &index)?;
        }
        let at = self.path().to_path_buf();
        let complete = |w: &mut Self| -> std::io::Result<()> {
            w.out.finish()?;
            w.out.patch(FILE_FLAGS_AT as u64, &0u32.to_le_bytes())
        };
        complete(&mut self).with_context(|| format!("cannot write {}", at.display()))?;
        // Whatever happens now, the finished trace is not removed.
        self.done = true;
        if !self.published {
            std::fs::rename(&self.tmp, &self.dest).with_context(|| {
                format!(
                    "cannot rename the trace to {}; it is kept in {}",
                    self.dest.display(),
                    self.tmp.display()
                )
            })?;
        }
        Ok(match &self.segments {
            Some(s) => s.base.clone(),
            None => self.dest.clone(),
        })
    }
}

/// Check, before a session loads anything, that a trace can be written at `dest`: its
/// directory exists, and `dest` is not a directory.
pub fn check_destination(dest: &Path) -> Result<()> {
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "cannot write the trace to {}: there is no directory {}",
            dest.display(),
            dir.display()
        );
    }
    refuse_directory(dest)
}

/// Fail before a session starts when `dest` is a directory (the rename at the end
/// could not replace it). A symbolic link there is replaced, not followed.
fn refuse_directory(dest: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => bail!(
            "cannot write the trace to {}: it is a directory",
            dest.display()
        ),
        _ => Ok(()),
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.published {
            // The trace so far, flagged incomplete: what a session that failed got.
            let _ = self.out.checkpoint();
        } else if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
