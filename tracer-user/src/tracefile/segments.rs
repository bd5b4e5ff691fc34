//! Traces written in segments (`record --split SIZE|TIME`, `--max-size SIZE`): the
//! trace `T` is the files `T.1`, `T.2`, ... Each is a trace file of its own: after its
//! file header a `SECTION_SEGMENT` (JSON [`SegmentInfo`]: its number and how many bytes
//! of sections follow that repeat what came before it: the session, every binary, the
//! load biases, the latest name of each thread, the strings), then its records. Only
//! the last has the stats section. With `--max-size` the oldest segments are removed
//! whole while the set is over the size; the stats count their records
//! (`records_rotated_out`). Readers given `T` read the segments there as one trace
//! (`Reader::open`: the first with its repeated sections, the others without).

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    time::Duration,
};

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tracer_common::CHUNK_HEADER_BYTES;

use super::{
    FILE_FLAGS_AT, FILE_HEADER_LEN, SECTION_BINARY, SECTION_CHUNK, SECTION_CHUNK_PACKED,
    SECTION_CHUNKS_PACKED, SECTION_COMM, SECTION_HEADER_LEN, SECTION_LOAD, SECTION_SEGMENT,
    SECTION_SESSION, SECTION_STRING, chunk_header, u32_at, u64_at,
};

/// When a trace goes on in a new segment, and how much of it is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rotation {
    /// A new segment once the current one holds this many bytes.
    pub split_bytes: Option<u64>,
    /// A new segment once the current one is this old.
    pub split_every: Option<Duration>,
    /// The oldest segments are removed while all of them hold more.
    pub max_bytes: Option<u64>,
}

impl Rotation {
    /// Whether the trace is written in segments.
    pub fn on(&self) -> bool {
        self.split_bytes.is_some() || self.split_every.is_some() || self.max_bytes.is_some()
    }

    /// Bytes of a segment: as split, or a quarter of the maximum (at least 1 MiB).
    pub(super) fn segment_bytes(&self) -> Option<u64> {
        self.split_bytes
            .or(self.max_bytes.map(|m| (m / 4).max(1 << 20)))
    }
}

/// `SECTION_SEGMENT`'s payload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// 1, 2, ...
    pub index: u32,
    /// Bytes of sections after this one that repeat what earlier segments said.
    pub replay_bytes: u64,
}

/// Segment `index` of trace `base`: `base.index`.
pub fn segment_path(base: &Path, index: u32) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(format!(".{index}"));
    PathBuf::from(s)
}

/// The segments of `base` that exist, in order (empty: none).
pub fn segments_of(base: &Path) -> Vec<(u32, PathBuf)> {
    let (Some(dir), Some(name)) = (base.parent(), base.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let prefix = format!("{name}.");
    let mut found: Vec<(u32, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let f = e.file_name();
            let n = f.to_str()?.strip_prefix(&prefix)?;
            // Digits only: `T.1`, not `T.1.tmp`.
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((n.parse().ok()?, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The sections a new segment repeats, kept as they were written.
#[derive(Default)]
pub(super) struct Replay {
    session: Vec<u8>,
    binaries: Vec<u8>,
    loads: Vec<u8>,
    /// (pid, tid) → its latest comm section.
    comms: BTreeMap<(u32, u32), Vec<u8>>,
    /// (pid, tid, pointer) → its latest string section.
    strings: HashMap<(u32, u32, u64), Vec<u8>>,
}

impl Replay {
    /// Note whole sections `bytes` (as written); returns the chunks and records in them.
    pub(super) fn note(&mut self, bytes: &[u8]) -> (u64, u64) {
        let (mut chunks, mut records) = (0, 0);
        let mut at = 0;
        while let Some(h) = bytes.get(at..at + SECTION_HEADER_LEN) {
            let (kind, len) = (u32_at(h, 0), u64_at(h, 8) as usize);
            let Some(section) = bytes.get(at..at + SECTION_HEADER_LEN + len) else {
                break;
            };
            let payload = &section[SECTION_HEADER_LEN..];
            match kind {
                SECTION_SESSION => self.session = section.to_vec(),
                SECTION_BINARY => self.binaries.extend_from_slice(section),
                SECTION_LOAD => self.loads.extend_from_slice(section),
                SECTION_COMM if payload.len() >= 8 => {
                    let key = (u32_at(payload, 0), u32_at(payload, 4));
                    self.comms.insert(key, section.to_vec());
                }
                SECTION_STRING if payload.len() >= 24 => {
                    let key = (u32_at(payload, 0), u32_at(payload, 4), u64_at(payload, 16));
                    self.strings.insert(key, section.to_vec());
                }
                SECTION_CHUNK | SECTION_CHUNK_PACKED => {
                    chunks += 1;
                    records += chunk_header(payload).map_or(0, |h| h.count as u64);
                }
                SECTION_CHUNKS_PACKED if payload.len() >= 8 => {
                    let n = u32_at(payload, 0) as usize;
                    chunks += n as u64;
                    records += (0..n)
                        .filter_map(|i| payload.get(8 + i * CHUNK_HEADER_BYTES..))
                        .filter_map(chunk_header)
                        .map(|h| h.count as u64)
                        .sum::<u64>();
                }
                _ => {}
            }
            at += SECTION_HEADER_LEN + len;
        }
        (chunks, records)
    }

    /// The sections to repeat at the start of a segment, in an order readers take.
    pub(super) fn bytes(&self) -> Vec<u8> {
        let mut out = self.session.clone();
        out.extend_from_slice(&self.binaries);
        out.extend_from_slice(&self.loads);
        for c in self.comms.values() {
            out.extend_from_slice(c);
        }
        for s in self.strings.values() {
            out.extend_from_slice(s);
        }
        out
    }
}

/// A trace's bytes: one file, or its segments read as one stream.
pub enum Source {
    File(File),
    Segments(Chain),
}

impl Source {
    /// `path`, or its segments when there is no file there but `path.1`, ...
    pub fn open(path: &Path) -> Result<Source> {
        match File::open(path) {
            Ok(f) => Ok(Source::File(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let segments = segments_of(path);
                if segments.is_empty() {
                    return Err(e).with_context(|| format!("cannot open {}", path.display()));
                }
                Ok(Source::Segments(Chain::open(&segments)?))
            }
            Err(e) => Err(e).with_context(|| format!("cannot open {}", path.display())),
        }
    }
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::File(f) => f.read(buf),
            Source::Segments(c) => c.read(buf),
        }
    }
}

/// Segments as one trace: a file header (the first's, with the last's flags), all of the
/// first segment after its header, then each later one from where its repeated
/// sections end.
pub struct Chain {
    header: [u8; FILE_HEADER_LEN],
    /// Bytes of the header handed out.
    at: usize,
    /// Bytes of the files after it handed out or skipped.
    pos: u64,
    /// Files still to read, each already at its first byte to read.
    files: std::collections::VecDeque<File>,
}

impl Chain {
    fn open(segments: &[(u32, PathBuf)]) -> Result<Chain> {
        let mut header = [0u8; FILE_HEADER_LEN];
        let mut files = std::collections::VecDeque::new();
        for (i, path) in one_set(segments)?.iter().enumerate() {
            let mut f =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            let mut h = [0u8; FILE_HEADER_LEN];
            f.read_exact(&mut h)
                .with_context(|| format!("{}: no file header", path.display()))?;
            if i == 0 {
                header = h;
            } else {
                // Past its segment section and the sections it repeats.
                let skip = repeated_bytes(&mut f)
                    .with_context(|| format!("{}: bad segment section", path.display()))?;
                f.seek(SeekFrom::Current(skip as i64))?;
            }
            // The session is complete or not as its last segment says.
            header[FILE_FLAGS_AT..].copy_from_slice(&h[FILE_FLAGS_AT..]);
            files.push_back(f);
        }
        Ok(Chain {
            header,
            at: 0,
            pos: 0,
            files,
        })
    }
}

/// The segments of one trace: those the reader owns (if it owns none, those of the
/// first segment's owner), numbered on without a gap from the first of them. A segment
/// someone else put in the directory, or one of another session past a gap, is not
/// read, and a warning says so.
fn one_set(segments: &[(u32, PathBuf)]) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let mut owned = Vec::with_capacity(segments.len());
    for (n, p) in segments {
        let m =
            std::fs::symlink_metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
        owned.push((*n, p, m.uid()));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let uid = if owned.iter().any(|o| o.2 == me) {
        me
    } else {
        owned.first().map_or(me, |o| o.2)
    };
    let mut set: Vec<PathBuf> = Vec::new();
    let mut next = None;
    for (n, p, owner) in owned {
        let why = if owner != uid {
            "its owner is not the trace's"
        } else if next.is_some_and(|want| n != want) {
            "it does not follow the segment before it"
        } else {
            set.push(p.clone());
            next = Some(n + 1);
            continue;
        };
        eprintln!(
            "utrace: warning: {} is not read as part of the trace: {why}",
            p.display()
        );
    }
    Ok(set)
}

/// Read a segment's segment section (at the file's position); the bytes of sections
/// it repeats that follow.
fn repeated_bytes(f: &mut File) -> Result<u64> {
    let mut h = [0u8; SECTION_HEADER_LEN];
    f.read_exact(&mut h)?;
    let (kind, len) = (u32_at(&h, 0), u64_at(&h, 8));
    if kind != SECTION_SEGMENT || len > 4096 {
        bail!("not a segment of a trace (section kind {kind}, {len} bytes)");
    }
    let mut info = vec![0u8; len as usize];
    f.read_exact(&mut info)?;
    let info: SegmentInfo = serde_json::from_slice(&info)?;
    Ok(info.replay_bytes)
}

impl Seek for Source {
    /// Files seek as files; segments only forward from where they are (what
    /// `read_stats` does), the position counted from the stream's start.
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        match (self, to) {
            (Source::File(f), to) => f.seek(to),
            (Source::Segments(c), SeekFrom::Current(n)) if n >= 0 => c.skip(n as u64),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "segments are read forward only",
            )),
        }
    }
}

impl Chain {
    /// Skip `n` bytes forward; the position after them.
    fn skip(&mut self, mut n: u64) -> std::io::Result<u64> {
        let header = (FILE_HEADER_LEN - self.at).min(n as usize);
        self.at += header;
        n -= header as u64;
        while n > 0 {
            let Some(f) = self.files.front_mut() else {
                break;
            };
            let (pos, len) = (f.stream_position()?, f.metadata()?.len());
            let step = n.min(len.saturating_sub(pos));
            f.seek(SeekFrom::Current(step as i64))?;
            n -= step;
            self.pos += step;
            if n > 0 {
                self.files.pop_front();
            }
        }
        Ok(self.at as u64 + self.pos)
    }
}

impl Read for Chain {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at < FILE_HEADER_LEN {
            let n = buf.len().min(FILE_HEADER_LEN - self.at);
            buf[..n].copy_from_slice(&self.header[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        while let Some(f) = self.files.front_mut() {
            let n = f.read(buf)?;
            if n > 0 {
                self.pos += n as u64;
                return Ok(n);
            }
            self.files.pop_front();
        }
        Ok(0)
    }
}
