//! The trace file (`tracer record` writes it, `tracer report` / `tracer dump` read it).
//!
//! Little-endian throughout. A file header, then a sequence of length-prefixed
//! sections, in this order:
//!
//! ```text
//! file header (16 bytes)
//!   0   [u8; 8]  magic "UTRCTRAC"
//!   8   u32      format version (FORMAT_VERSION = 2)
//!   12  u32      reserved, 0
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
//! - `SECTION_CHUNK` (3, any number): exactly what eBPF put in the ring buffer, trimmed
//!   to its valid part: a 48-byte `ChunkHeader` followed by `count` 32-byte `Record`s
//!   (tracer-common `chunk.rs` / `record.rs`). Chunks are in delivery order.
//! - `SECTION_COMM` (5, any number): a thread's name as the kernel had it when its
//!   records were drained (`u32 pid`, `u32 tid`, 16 bytes of `comm`, NUL-padded), before
//!   that thread's chunks; again when it changes. Also `SECTION_BINARY` may come later
//!   than the first chunk: a binary that joined a running session (system-wide, or
//!   loaded with `dlopen`) is written before its first chunk.
//! - `SECTION_LOAD` (6, any number): where a traced binary is loaded in a process, as the
//!   session saw it (`u32 pid`, `u32` 0, `u64 binary_id`, `u64 bias` = run-time address
//!   minus file address), so readers can symbolize run-time code addresses in records
//!   (return addresses, call targets).
//! - `SECTION_STATS` (4, last, once): JSON [`FinalStats`] — kernel-side counters
//!   (delivered, dropped, read errors), what the consumer received, the end clock anchor
//!   and the traced command's exit status.
//!
//! Unknown section kinds are skipped by readers (forward compatibility within a
//! version). The tracer writes to a temporary file in the destination directory and
//! renames it when complete; a file without a stats section, or that ends inside a
//! section, is reported as truncated and read up to its last complete section.

use std::{
    fs::File,
    io::{BufReader, BufWriter, ErrorKind, Read, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use tracer_common::{
    CHUNK_KIND_RECORDS, CHUNK_KIND_UPROBE, CHUNK_RECORDS, ChunkHeader, RECORD_SIZE, Record,
    meta::{MetaError, Metadata},
};

use crate::record::host::clock::{Anchor, Calibration};

pub const MAGIC: [u8; 8] = *b"UTRCTRAC";
/// 2: chunk headers carry the drain's clock sample (48 bytes).
pub const FORMAT_VERSION: u32 = 2;
const FILE_HEADER_LEN: usize = 16;
const SECTION_HEADER_LEN: usize = 16;

pub const SECTION_SESSION: u32 = 1;
pub const SECTION_BINARY: u32 = 2;
pub const SECTION_CHUNK: u32 = 3;
pub const SECTION_STATS: u32 = 4;
pub const SECTION_COMM: u32 = 5;
pub const SECTION_LOAD: u32 = 6;

/// Largest section a reader accepts (a JSON blob or a note; chunks are ~4 KiB).
const MAX_SECTION: u64 = 1 << 30;
const CHUNK_HEADER_LEN: usize = size_of::<ChunkHeader>();

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
    /// `records_dropped` per CPU (index = CPU).
    #[serde(default)]
    pub dropped_per_cpu: Vec<u64>,
    /// The filter in force at the end (`FilterSpec::describe`).
    #[serde(default)]
    pub filter: String,
    /// Filter changes made while the session ran (`tracer filter`).
    #[serde(default)]
    pub filter_changes: u64,
    /// Instrumented binaries that joined the running session.
    #[serde(default)]
    pub binaries_added: u64,
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

/// One chunk as stored: header and its valid records.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub header: ChunkHeader,
    pub records: Vec<Record>,
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

/// Decode a `ChunkHeader` from the start of `b` (at least 48 bytes).
pub fn chunk_header(b: &[u8]) -> Option<ChunkHeader> {
    (b.len() >= CHUNK_HEADER_LEN).then(|| ChunkHeader {
        kind: u32_at(b, 0),
        count: u32_at(b, 4),
        pid: u32_at(b, 8),
        tid: u32_at(b, 12),
        seq: u64_at(b, 16),
        binary_id: u64_at(b, 24),
        cause: u32_at(b, 32),
        _pad: u32_at(b, 36),
        time: u64_at(b, 40),
    })
}

/// Check a ring-buffer entry and append it to `out` as a chunk section, trimmed to
/// header + `count` records. Returns the header, or None if the entry is malformed.
pub fn encode_chunk(entry: &[u8], out: &mut Vec<u8>) -> Option<ChunkHeader> {
    let h = chunk_header(entry)?;
    let max = match h.kind {
        CHUNK_KIND_RECORDS => CHUNK_RECORDS,
        // A uprobe-site event: its record, plus the argument records of a USDT probe.
        CHUNK_KIND_UPROBE => tracer_common::operand::MAX_OPERAND_RECORDS,
        _ => return None,
    };
    let len = CHUNK_HEADER_LEN + h.count as usize * RECORD_SIZE;
    if h.count as usize > max || entry.len() < len {
        return None;
    }
    push_section_header(out, SECTION_CHUNK, len as u64);
    out.extend_from_slice(&entry[..len]);
    Some(h)
}

/// A `CHUNK_KIND_COMM` ring-buffer entry as a comm section; false if malformed.
pub fn encode_comm(entry: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(h) = chunk_header(entry) else {
        return false;
    };
    let Some(comm) = entry.get(CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + 16) else {
        return false;
    };
    push_section_header(out, SECTION_COMM, 24);
    out.extend_from_slice(&h.pid.to_le_bytes());
    out.extend_from_slice(&h.tid.to_le_bytes());
    out.extend_from_slice(comm);
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

fn push_section_header(out: &mut Vec<u8>, kind: u32, len: u64) {
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

/// Writes a trace to `<dir>/.<name>.<pid>.tmp` and renames it to the destination in
/// [`Writer::finish`]; dropped unfinished, it removes the temporary file.
pub struct Writer {
    out: BufWriter<File>,
    tmp: PathBuf,
    dest: PathBuf,
    done: bool,
}

impl Writer {
    pub fn create(dest: &Path) -> Result<Self> {
        let tmp = temporary_for(dest)?;
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
        let mut w = Writer {
            out: BufWriter::with_capacity(1 << 20, file),
            tmp,
            dest: dest.to_path_buf(),
            done: false,
        };
        let mut header = Vec::with_capacity(FILE_HEADER_LEN);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        w.write_raw(&header)?;
        Ok(w)
    }

    fn section(&mut self, kind: u32, payload: &[u8]) -> Result<()> {
        let mut h = Vec::with_capacity(SECTION_HEADER_LEN);
        push_section_header(&mut h, kind, payload.len() as u64);
        self.write_raw(&h)?;
        self.write_raw(payload)
    }

    pub fn write_session(&mut self, s: &SessionInfo) -> Result<()> {
        self.section(SECTION_SESSION, &serde_json::to_vec(s)?)
    }

    pub fn write_binary(&mut self, b: &BinaryInfo) -> Result<()> {
        self.section(SECTION_BINARY, &b.encode())
    }

    /// Bytes that are already complete sections (from [`encode_chunk`]).
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .with_context(|| format!("cannot write {}", self.tmp.display()))
    }

    /// Append the stats section and move the file into place.
    pub fn finish(mut self, stats: &FinalStats) -> Result<PathBuf> {
        self.section(SECTION_STATS, &serde_json::to_vec(stats)?)?;
        self.out
            .flush()
            .and_then(|()| self.out.get_ref().sync_all())
            .with_context(|| format!("cannot write {}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.dest).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.tmp.display(),
                self.dest.display()
            )
        })?;
        self.done = true;
        Ok(self.dest.clone())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

pub enum Section {
    Session(SessionInfo),
    /// A thread's name: pid, tid, name.
    Comm(u32, u32, String),
    /// A binary's load bias in a process: pid, binary id, bias.
    Load(u32, u64, u64),
    Binary(BinaryInfo),
    Chunk(Chunk),
    Stats(FinalStats),
    Unknown(u32),
}

/// Where and why reading stopped early.
#[derive(Clone, Debug)]
pub struct Truncation {
    pub offset: u64,
    pub what: &'static str,
}

/// Streaming reader: sections one at a time, so huge traces need no memory.
pub struct Reader {
    r: BufReader<File>,
    path: PathBuf,
    offset: u64,
    truncated: Option<Truncation>,
}

/// Read exactly `buf.len()` bytes; Ok(false) on a clean or partial end of file.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Reader {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut r = BufReader::with_capacity(1 << 20, file);
        let mut h = [0u8; FILE_HEADER_LEN];
        let n =
            read_full(&mut r, &mut h).with_context(|| format!("cannot read {}", path.display()))?;
        if n < 8 || h[..8] != MAGIC {
            bail!(
                "{} is not a utrace trace file (bad magic; expected {:?})",
                path.display(),
                String::from_utf8_lossy(&MAGIC)
            );
        }
        ensure!(
            n == FILE_HEADER_LEN,
            "{}: file header truncated",
            path.display()
        );
        let version = u32_at(&h, 8);
        if version != FORMAT_VERSION {
            bail!(
                "{}: trace format version {version} is not supported (this tracer reads version {FORMAT_VERSION})",
                path.display()
            );
        }
        Ok(Reader {
            r,
            path: path.to_path_buf(),
            offset: FILE_HEADER_LEN as u64,
            truncated: None,
        })
    }

    /// Set when the file ended inside a section.
    /// Bytes of the file read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn truncated(&self) -> Option<&Truncation> {
        self.truncated.as_ref()
    }

    fn stop(&mut self, what: &'static str) -> Result<Option<Section>> {
        self.truncated = Some(Truncation {
            offset: self.offset,
            what,
        });
        Ok(None)
    }

    /// The next complete section, or None at the end (check [`Reader::truncated`]).
    pub fn next_section(&mut self) -> Result<Option<Section>> {
        if self.truncated.is_some() {
            return Ok(None);
        }
        let ctx = |r: &Reader| format!("{} at byte {}", r.path.display(), r.offset);
        let mut h = [0u8; SECTION_HEADER_LEN];
        let n = read_full(&mut self.r, &mut h).with_context(|| ctx(self))?;
        if n == 0 {
            return Ok(None);
        }
        if n < SECTION_HEADER_LEN {
            return self.stop("section header");
        }
        let kind = u32_at(&h, 0);
        let len = u64_at(&h, 8);
        ensure!(
            len <= MAX_SECTION,
            "{}: section of {len} bytes is implausible (corrupt file)",
            ctx(self)
        );
        let mut payload = vec![0u8; len as usize];
        let n = read_full(&mut self.r, &mut payload).with_context(|| ctx(self))?;
        if n < payload.len() {
            return self.stop("section payload");
        }
        let at = ctx(self);
        self.offset += (SECTION_HEADER_LEN + payload.len()) as u64;
        let section = match kind {
            SECTION_SESSION => Section::Session(
                serde_json::from_slice(&payload)
                    .with_context(|| format!("{at}: bad session section"))?,
            ),
            SECTION_BINARY => Section::Binary(
                BinaryInfo::decode(&payload)
                    .with_context(|| format!("{at}: bad binary section"))?,
            ),
            SECTION_CHUNK => {
                let header = chunk_header(&payload)
                    .with_context(|| format!("{at}: chunk section too short"))?;
                let body = &payload[CHUNK_HEADER_LEN..];
                ensure!(
                    body.len() == header.count as usize * RECORD_SIZE,
                    "{at}: chunk of {} records has {} bytes of records",
                    header.count,
                    body.len()
                );
                let records = body
                    .chunks_exact(RECORD_SIZE)
                    .map(|r| {
                        let mut a = [0u8; RECORD_SIZE];
                        a.copy_from_slice(r);
                        Record::from_bytes(&a)
                    })
                    .collect();
                Section::Chunk(Chunk { header, records })
            }
            SECTION_COMM => {
                ensure!(
                    payload.len() == 24,
                    "{at}: comm section of {} bytes",
                    payload.len()
                );
                let name = payload[8..].split(|&c| c == 0).next().unwrap_or_default();
                Section::Comm(
                    u32_at(&payload, 0),
                    u32_at(&payload, 4),
                    String::from_utf8_lossy(name).into_owned(),
                )
            }
            SECTION_LOAD => {
                ensure!(
                    payload.len() == 24,
                    "{at}: load section of {} bytes",
                    payload.len()
                );
                Section::Load(
                    u32_at(&payload, 0),
                    u64_at(&payload, 8),
                    u64_at(&payload, 16),
                )
            }
            SECTION_STATS => Section::Stats(
                serde_json::from_slice(&payload)
                    .with_context(|| format!("{at}: bad stats section"))?,
            ),
            other => Section::Unknown(other),
        };
        Ok(Some(section))
    }
}

/// The stats section of a trace, found by skipping over all other payloads (so a
/// streaming pass can use the end-of-session clock anchor from the start).
pub fn read_stats(path: &Path) -> Result<Option<FinalStats>> {
    let mut r = Reader::open(path)?;
    let mut stats = None;
    loop {
        let at = r.offset;
        let ctx = || format!("{} at byte {at}", path.display());
        let mut h = [0u8; SECTION_HEADER_LEN];
        if read_full(&mut r.r, &mut h).with_context(ctx)? < SECTION_HEADER_LEN {
            return Ok(stats);
        }
        let (kind, len) = (u32_at(&h, 0), u64_at(&h, 8));
        // The reader's limit: a longer section is corruption (and seeking past it
        // could overflow the file offset).
        ensure!(
            len <= MAX_SECTION,
            "{}: section of {len} bytes is implausible (corrupt file)",
            ctx()
        );
        if kind == SECTION_STATS {
            let mut payload = vec![0u8; len as usize];
            if read_full(&mut r.r, &mut payload).with_context(ctx)? < payload.len() {
                return Ok(stats);
            }
            stats = serde_json::from_slice(&payload).ok();
        } else {
            r.r.seek_relative(len as i64).with_context(ctx)?;
        }
        r.offset += SECTION_HEADER_LEN as u64 + len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::host::clock::Anchor;

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
            let o = CHUNK_HEADER_LEN + i * RECORD_SIZE;
            if let Some(site) = e.get_mut(o..o + 4) {
                site.copy_from_slice(&(i as u32).to_le_bytes());
            }
        }
        e
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
        let one = CHUNK_HEADER_LEN + RECORD_SIZE;
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 1, one), &mut buf).is_some());
        // A USDT probe's event: up to 6 records in one uprobe chunk.
        let six = CHUNK_HEADER_LEN + 6 * RECORD_SIZE;
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 2, six), &mut buf).is_some());
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 3, one + RECORD_SIZE), &mut buf).is_none());
        assert!(encode_chunk(&entry(CHUNK_KIND_UPROBE, 7, six + RECORD_SIZE), &mut buf).is_none());
        assert!(encode_chunk(&entry(9, 1, one), &mut buf).is_none());
        assert!(encode_chunk(&entry(CHUNK_KIND_RECORDS, 3, 100), &mut buf).is_none());
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
            ["session", "binary", "chunk", "chunk", "chunk", "stats"]
        );
        assert!(r.truncated().is_none());

        // Cut inside the last section: everything before it still reads.
        let full = std::fs::read(&dest).unwrap();
        let cut = dir.join("cut.utrace");
        std::fs::write(&cut, &full[..full.len() - 3]).unwrap();
        let mut r = Reader::open(&cut).unwrap();
        let mut n = 0;
        while r.next_section().unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 5);
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
