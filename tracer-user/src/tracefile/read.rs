//! Reading a trace file section by section; a truncated file (a crashed tracer) reads
//! up to its last whole section and says where it stopped.

use std::{
    fs::File,
    io::{BufReader, Cursor, ErrorKind, Read, Seek},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail, ensure};
use tracer_common::{
    CHUNK_HEADER_BYTES, CHUNK_KIND_RECORDS, CHUNK_RECORDS, ChunkHeader, RECORD_SIZE, Record,
    STRING_BYTES, STRING_CHANGED, STRING_TRUNCATED, STRING_UNREADABLE,
    operand::MAX_OPERAND_RECORDS,
};

use super::{
    BinaryInfo, FILE_FLAGS_AT, FILE_HEADER_LEN, FILE_INCOMPLETE, FORMAT_VERSION, FinalStats,
    GROUP_CHUNKS_MAX, MAGIC, MAX_SECTION, OLDEST_READABLE, SECTION_BINARY, SECTION_CHUNK,
    SECTION_CHUNK_PACKED, SECTION_CHUNKS_PACKED, SECTION_COMM, SECTION_HEADER_LEN, SECTION_INDEX,
    SECTION_LOAD, SECTION_SEGMENT, SECTION_SESSION, SECTION_STATS, SECTION_STRING,
    STRING_SECTION_FIXED, SessionInfo, chunk_header, chunk_headers_of,
    index::{self, IndexEntry},
    pack::{GroupUnpacker, unpack_version},
    segments::Source,
    u32_at, u64_at,
};

/// One chunk as stored: header and its valid records.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub header: ChunkHeader,
    pub records: Vec<Record>,
}

pub enum Section {
    Session(SessionInfo),
    /// A thread's name: pid, tid, name.
    Comm(u32, u32, String),
    /// A binary's load bias in a process: pid, binary id, bias.
    Load(u32, u64, u64),
    Binary(BinaryInfo),
    Chunk(Chunk),
    /// What a USDT string argument pointed at.
    String(StringAt),
    Stats(FinalStats),
    Unknown(u32),
}

/// What [`Reader::next_section_unless`] hands out: a section, or the headers of a
/// section of chunks it did not decode.
#[expect(
    clippy::large_enum_variant,
    reason = "handed out one at a time, like `Section`; a box would cost an allocation per chunk"
)]
pub enum Next {
    Section(Section),
    Skipped(Vec<ChunkHeader>),
    /// Sections holding this many chunks passed over by the file's index (see
    /// [`Reader::only`]): not a byte of them read.
    Unread(u64),
}

/// A string section: in process `pid`, `ptr` held `text` when thread `tid`'s records
/// were drained at `drain_time` (`status`: `STRING_OK`, `STRING_TRUNCATED` to its first
/// bytes, `STRING_UNREADABLE` with no text; or'ed with `STRING_CHANGED`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StringAt {
    pub pid: u32,
    pub tid: u32,
    pub ptr: u64,
    pub status: u32,
    pub drain_time: u64,
    pub text: String,
}

/// Where and why reading stopped early.
#[derive(Clone, Debug)]
pub struct Truncation {
    pub offset: u64,
    pub what: &'static str,
}

/// How a reader of a file moves forward in it (`BufReader::seek_relative`).
type SeekFn<R> = fn(&mut R, i64) -> std::io::Result<()>;

/// Streaming reader: sections one at a time, so huge traces need no memory.
pub struct Reader<R = BufReader<Source>> {
    r: R,
    path: PathBuf,
    offset: u64,
    truncated: Option<Truncation>,
    /// The file's format version (packed chunks differ between 3 and 4).
    version: u32,
    /// The header's flags (`FILE_INCOMPLETE`).
    flags: u32,
    /// The first segment section's number (a trace written in segments).
    segment: Option<u32>,
    /// Chunks of a `SECTION_CHUNKS_PACKED` not handed out yet, in order.
    pending: std::collections::VecDeque<Chunk>,
    /// Made at the first chunk group (its table is large).
    groups: Option<GroupUnpacker>,
    /// A file: its length and how to move forward in it, for payloads not decoded (other
    /// readers read them through).
    seek: Option<(u64, SeekFn<R>)>,
    /// The file's index and which of its sections to read ([`Reader::only`]).
    index: Option<IndexCursor>,
}

/// A file's index as a reader walks it.
struct IndexCursor {
    entries: Vec<IndexEntry>,
    /// The first entry not behind the reader.
    next: usize,
    keep: Box<dyn Fn(&IndexEntry) -> bool>,
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
    /// The trace at `path`: a file, or the segments `path.1`, `path.2`, ... of a trace
    /// written in segments, read as one.
    pub fn open(path: &Path) -> Result<Self> {
        let source = Source::open(path)?;
        let len = match &source {
            Source::File(f) => Some(f.metadata()?.len()),
            Source::Segments(_) => None,
        };
        let mut r = Self::from_reader(path, BufReader::with_capacity(1 << 20, source))?;
        r.seek = len.map(|l| (l, BufReader::seek_relative as SeekFn<_>));
        Ok(r)
    }

    /// Read only the sections of chunks that `keep` answers true for, by the file's
    /// index; the others are passed over unread ([`Next::Unread`]). Whether the file
    /// has an index (a trace in one file whose session finished): without one every
    /// section is read.
    pub fn only(&mut self, keep: impl Fn(&IndexEntry) -> bool + 'static) -> bool {
        if let Some(ix) = &mut self.index {
            ix.keep = Box::new(keep);
            return true;
        }
        let Some((len, _)) = self.seek else {
            return false;
        };
        let Some(index) = File::open(&self.path)
            .ok()
            .and_then(|mut f| index::read_index(&mut f, len))
        else {
            return false;
        };
        log::debug!(
            "{}: an index of {} sections of chunks",
            self.path.display(),
            index.entries.len()
        );
        self.index = Some(IndexCursor {
            entries: index.entries,
            next: 0,
            keep: Box::new(keep),
        });
        true
    }
}

impl Reader<Cursor<Vec<u8>>> {
    /// A trace held in memory (`name` is used in messages).
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Self::from_reader(Path::new(name), Cursor::new(bytes))
    }
}

impl<R: Read> Reader<R> {
    /// A trace arriving as a stream (`name` is used in messages): a section is
    /// returned once all of it has arrived, and the end of the stream ends the trace.
    pub fn from_stream(name: &str, r: R) -> Result<Self> {
        Self::from_reader(Path::new(name), r)
    }

    fn from_reader(path: &Path, mut r: R) -> Result<Self> {
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
        if !(OLDEST_READABLE..=FORMAT_VERSION).contains(&version) {
            bail!(
                "{}: trace format version {version} is not supported (this tracer reads versions {OLDEST_READABLE} to {FORMAT_VERSION})",
                path.display()
            );
        }
        Ok(Reader {
            r,
            path: path.to_path_buf(),
            offset: FILE_HEADER_LEN as u64,
            truncated: None,
            version,
            flags: u32_at(&h, FILE_FLAGS_AT),
            segment: None,
            pending: Default::default(),
            groups: None,
            seek: None,
            index: None,
        })
    }

    /// Set when the file ended inside a section.
    /// Bytes of the file read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the header says the session writing the file did not finish (it was
    /// killed, or is still running).
    pub fn incomplete(&self) -> bool {
        self.flags & FILE_INCOMPLETE != 0
    }

    /// The number of the segment the trace starts with, if it was written in segments
    /// (`segments.rs`).
    pub fn segment(&self) -> Option<u32> {
        self.segment
    }

    pub fn truncated(&self) -> Option<&Truncation> {
        self.truncated.as_ref()
    }

    fn stop<T>(&mut self, what: &'static str) -> Result<Option<T>> {
        self.truncated = Some(Truncation {
            offset: self.offset,
            what,
        });
        Ok(None)
    }

    /// The next complete section, or None at the end (check [`Reader::truncated`]);
    /// sections [`Reader::only`] passes over are not handed out.
    pub fn next_section(&mut self) -> Result<Option<Section>> {
        loop {
            return Ok(match self.next_section_unless(|_| false)? {
                Some(Next::Section(s)) => Some(s),
                Some(Next::Unread(_)) => continue,
                // Nothing is skipped here.
                Some(Next::Skipped(_)) | None => None,
            });
        }
    }

    /// The next section, except that a section of chunks whose headers `skip` answers
    /// true for is not decoded (unpacking is what reading costs): its headers instead.
    /// The chunks of a group already decoded come one by one, never skipped.
    pub fn next_section_unless(
        &mut self,
        skip: impl FnOnce(&[ChunkHeader]) -> bool,
    ) -> Result<Option<Next>> {
        if let Some(c) = self.pending.pop_front() {
            return Ok(Some(Next::Section(Section::Chunk(c))));
        }
        if self.truncated.is_some() {
            return Ok(None);
        }
        if let Some(chunks) = self.pass_unkept()? {
            return Ok(Some(Next::Unread(chunks)));
        }
        let (kind, len) = loop {
            let Some((kind, len)) = self.next_header()? else {
                return Ok(None);
            };
            if kind != SECTION_INDEX {
                break (kind, len);
            }
            // The index serves `only` and `read_stats`, which find it by the trailer.
            if !self.pass_over(len, 0)? {
                return self.stop("section payload");
            }
            self.offset += SECTION_HEADER_LEN as u64 + len;
        };
        let at = format!("{} at byte {}", self.path.display(), self.offset);
        // The chunk headers first: a section left undecoded need not be read.
        let Some(mut payload) = self.payload_part(len, self.first_part(kind))? else {
            return Ok(None);
        };
        if kind == SECTION_CHUNKS_PACKED && self.version >= 5 && payload.len() == 8 {
            let n = (u32_at(&payload, 0) as usize).min(GROUP_CHUNKS_MAX);
            let Some(heads) = self.payload_part(len - 8, n * CHUNK_HEADER_BYTES)? else {
                return Ok(None);
            };
            payload.extend_from_slice(&heads);
        }
        if let Some(headers) = self.chunk_headers(kind, &payload)
            && skip(&headers)
        {
            if !self.pass_over(len, payload.len() as u64)? {
                return self.stop("section payload");
            }
            self.offset += SECTION_HEADER_LEN as u64 + len;
            return Ok(Some(Next::Skipped(headers)));
        }
        let Some(rest) = self.payload_part(len - payload.len() as u64, usize::MAX)? else {
            return Ok(None);
        };
        payload.extend_from_slice(&rest);
        self.offset += SECTION_HEADER_LEN as u64 + len;
        self.decode(kind, &payload, &at)
            .map(|s| Some(Next::Section(s)))
    }

    /// Pass over the sections of chunks at the reader's position that the index says
    /// not to read; the chunks they hold (None: none passed over).
    fn pass_unkept(&mut self) -> Result<Option<u64>> {
        let (Some(ix), Some((_, seek))) = (&mut self.index, self.seek) else {
            return Ok(None);
        };
        let (mut to, mut chunks) = (self.offset, 0u64);
        while let Some(e) = ix.entries.get(ix.next) {
            if e.offset < to {
                ix.next += 1;
                continue;
            }
            if e.offset > to || (ix.keep)(e) {
                break;
            }
            to = e.offset + SECTION_HEADER_LEN as u64 + e.len;
            chunks += u64::from(e.chunks);
            ix.next += 1;
        }
        if to == self.offset {
            return Ok(None);
        }
        let at = self.offset;
        seek(&mut self.r, (to - at) as i64)
            .with_context(|| format!("{} at byte {at}", self.path.display()))?;
        self.offset = to;
        Ok(Some(chunks))
    }

    /// How much of a payload of `kind` to read first: a chunk's header, a group's count
    /// (its headers next); all of other sections.
    fn first_part(&self, kind: u32) -> usize {
        match kind {
            SECTION_CHUNK | SECTION_CHUNK_PACKED => CHUNK_HEADER_BYTES,
            SECTION_CHUNKS_PACKED if self.version >= 5 => 8,
            _ => usize::MAX,
        }
    }

    /// The chunk headers of a section of chunks (None: another kind, or malformed, which
    /// decoding will report).
    fn chunk_headers(&self, kind: u32, payload: &[u8]) -> Option<Vec<ChunkHeader>> {
        chunk_headers_of(kind, self.version, payload)
    }

    /// The next section's kind and payload length; None at the end of the file or at a
    /// truncated header (then [`Reader::truncated`] says so).
    fn next_header(&mut self) -> Result<Option<(u32, u64)>> {
        let ctx = |r: &Self| format!("{} at byte {}", r.path.display(), r.offset);
        let mut h = [0u8; SECTION_HEADER_LEN];
        let n = read_full(&mut self.r, &mut h).with_context(|| ctx(self))?;
        if n == 0 {
            return Ok(None);
        }
        if n < SECTION_HEADER_LEN {
            return self.stop("section header");
        }
        let (kind, len) = (u32_at(&h, 0), u64_at(&h, 8));
        ensure!(
            len <= MAX_SECTION,
            "{}: section of {len} bytes is implausible (corrupt file)",
            ctx(self)
        );
        Ok(Some((kind, len)))
    }

    /// The next `min(len, most)` bytes of a payload with `len` bytes left; None (and
    /// truncated) when the file ends first.
    fn payload_part(&mut self, len: u64, most: usize) -> Result<Option<Vec<u8>>> {
        let want = len.min(most as u64);
        // Grown as bytes arrive: a corrupt length costs no memory the file lacks.
        let mut part = Vec::with_capacity((want as usize).min(1 << 20));
        let at = self.offset;
        (&mut self.r)
            .take(want)
            .read_to_end(&mut part)
            .with_context(|| format!("{} at byte {at}", self.path.display()))?;
        if part.len() as u64 != want {
            return self.stop("section payload");
        }
        Ok(Some(part))
    }

    /// Move over the rest of the payload of `len` bytes of the section at `offset`,
    /// `done` of them read, without decoding it: a seek in a file, a read elsewhere.
    /// False when the file ends first.
    fn pass_over(&mut self, len: u64, done: u64) -> Result<bool> {
        let at = self.offset;
        let ctx = || format!("{} at byte {at}", self.path.display());
        let n = len - done;
        if let Some((total, seek)) = self.seek {
            // The payload ends within the file, or the file is truncated there.
            if at + SECTION_HEADER_LEN as u64 + len > total {
                return Ok(false);
            }
            seek(&mut self.r, n as i64).with_context(ctx)?;
            return Ok(true);
        }
        let got =
            std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink()).with_context(ctx)?;
        Ok(got == n)
    }

    /// The section of `kind` whose payload is `payload`, found `at` (for messages).
    fn decode(&mut self, kind: u32, payload: &[u8], at: &str) -> Result<Section> {
        Ok(match kind {
            SECTION_SESSION => Section::Session(
                serde_json::from_slice(payload)
                    .with_context(|| format!("{at}: bad session section"))?,
            ),
            SECTION_BINARY => Section::Binary(
                BinaryInfo::decode(payload).with_context(|| format!("{at}: bad binary section"))?,
            ),
            SECTION_CHUNK | SECTION_CHUNK_PACKED => Section::Chunk(
                chunk(kind, payload, self.version)
                    .with_context(|| format!("{at}: bad chunk section"))?,
            ),
            SECTION_CHUNKS_PACKED if self.version >= 5 => {
                let version = self.version;
                let groups = self
                    .groups
                    .get_or_insert_with(|| GroupUnpacker::for_version(version));
                self.pending = chunk_group(payload, groups)
                    .with_context(|| format!("{at}: bad chunk group section"))?
                    .into();
                match self.pending.pop_front() {
                    Some(c) => Section::Chunk(c),
                    None => bail!("{at}: empty chunk group section"),
                }
            }
            SECTION_COMM => comm_section(payload, at)?,
            SECTION_LOAD => load_section(payload, at)?,
            SECTION_STRING => string_section(payload, at)?,
            SECTION_SEGMENT => {
                if self.segment.is_none() {
                    self.segment = serde_json::from_slice::<super::SegmentInfo>(payload)
                        .ok()
                        .map(|s| s.index);
                }
                Section::Unknown(kind)
            }
            SECTION_STATS => Section::Stats(
                serde_json::from_slice(payload)
                    .with_context(|| format!("{at}: bad stats section"))?,
            ),
            other => Section::Unknown(other),
        })
    }
}

/// A comm section: (pid, tid, thread name).
fn comm_section(payload: &[u8], at: &str) -> Result<Section> {
    ensure!(
        payload.len() == 24,
        "{at}: comm section of {} bytes",
        payload.len()
    );
    let name = payload[8..].split(|&c| c == 0).next().unwrap_or_default();
    Ok(Section::Comm(
        u32_at(payload, 0),
        u32_at(payload, 4),
        String::from_utf8_lossy(name).into_owned(),
    ))
}

/// A load section: (pid, binary id, load bias).
fn load_section(payload: &[u8], at: &str) -> Result<Section> {
    ensure!(
        payload.len() == 24,
        "{at}: load section of {} bytes",
        payload.len()
    );
    Ok(Section::Load(
        u32_at(payload, 0),
        u64_at(payload, 8),
        u64_at(payload, 16),
    ))
}

/// A string section: what a USDT string argument's pointer held when drained.
fn string_section(payload: &[u8], at: &str) -> Result<Section> {
    let n = payload.len();
    ensure!(
        (STRING_SECTION_FIXED..STRING_SECTION_FIXED + STRING_BYTES).contains(&n),
        "{at}: string section of {n} bytes"
    );
    let status = u32_at(payload, 8);
    ensure!(
        status & !STRING_CHANGED <= STRING_UNREADABLE,
        "{at}: string section of status {status:#x}"
    );
    Ok(Section::String(StringAt {
        pid: u32_at(payload, 0),
        tid: u32_at(payload, 4),
        status,
        ptr: u64_at(payload, 16),
        drain_time: u64_at(payload, 24),
        text: string_text(&payload[STRING_SECTION_FIXED..], status),
    }))
}

/// A string section's text. A truncated string may end inside a character: that
/// partial character is cut, not replaced (a replacement character says "not UTF-8").
fn string_text(bytes: &[u8], status: u32) -> String {
    let cut = match std::str::from_utf8(bytes) {
        Err(e) if status & !STRING_CHANGED == STRING_TRUNCATED && e.error_len().is_none() => {
            e.valid_up_to()
        }
        _ => bytes.len(),
    };
    String::from_utf8_lossy(&bytes[..cut]).into_owned()
}

/// A chunk section: the header, then its records as they are (`SECTION_CHUNK`,
/// format version 2) or packed (`SECTION_CHUNK_PACKED`) as format `version` packs.
fn chunk(kind: u32, payload: &[u8], version: u32) -> Result<Chunk> {
    let header = chunk_header(payload).context("shorter than a chunk header")?;
    let body = &payload[CHUNK_HEADER_BYTES..];
    let count = header.count as usize;
    ensure!(
        count <= CHUNK_RECORDS.max(MAX_OPERAND_RECORDS),
        "chunk of {count} records"
    );
    let records = if kind == SECTION_CHUNK_PACKED {
        unpack_version(body, count, version)?
    } else {
        ensure!(
            body.len() == count * RECORD_SIZE,
            "chunk of {count} records has {} bytes of records",
            body.len()
        );
        body.chunks_exact(RECORD_SIZE)
            .map(|r| Record::from_bytes(r.try_into().expect("RECORD_SIZE bytes")))
            .collect()
    };
    Ok(Chunk { header, records })
}

/// A chunk group section: `n`, their headers, then all their records packed as one
/// stream (`pack/`).
fn chunk_group(payload: &[u8], unpacker: &mut GroupUnpacker) -> Result<Vec<Chunk>> {
    ensure!(payload.len() >= 8, "shorter than its count");
    let n = u32_at(payload, 0) as usize;
    ensure!(
        (1..=GROUP_CHUNKS_MAX).contains(&n),
        "a group of {n} chunks (1 to {GROUP_CHUNKS_MAX})"
    );
    let heads = payload
        .get(8..8 + n * CHUNK_HEADER_BYTES)
        .context("shorter than its chunk headers")?;
    let headers: Vec<ChunkHeader> = heads
        .chunks_exact(CHUNK_HEADER_BYTES)
        .map(|h| chunk_header(h).context("bad chunk header"))
        .collect::<Result<_>>()?;
    for h in &headers {
        ensure!(
            h.kind == CHUNK_KIND_RECORDS && h.count as usize <= CHUNK_RECORDS,
            "a grouped chunk of kind {} and {} records",
            h.kind,
            h.count
        );
    }
    let total = headers.iter().map(|h| h.count as usize).sum();
    let mut records = unpacker
        .unpack(&payload[8 + heads.len()..], total)?
        .into_iter();
    Ok(headers
        .into_iter()
        .map(|header| Chunk {
            records: records.by_ref().take(header.count as usize).collect(),
            header,
        })
        .collect())
}

/// The stats section of a trace: where its index says, or found by skipping over all
/// other payloads (so a streaming pass can use the end-of-session clock anchor from the
/// start).
pub fn read_stats(path: &Path) -> Result<Option<FinalStats>> {
    if let Some(stats) = indexed_stats(path) {
        return Ok(Some(stats));
    }
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

/// The stats of a trace file with an index, read where it says.
fn indexed_stats(path: &Path) -> Option<FinalStats> {
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let index = index::read_index(&mut f, len)?;
    let mut h = [0u8; SECTION_HEADER_LEN];
    f.seek(std::io::SeekFrom::Start(index.stats_at)).ok()?;
    f.read_exact(&mut h).ok()?;
    let n = u64_at(&h, 8);
    if u32_at(&h, 0) != SECTION_STATS || n > MAX_SECTION {
        return None;
    }
    let mut payload = vec![0u8; n as usize];
    f.read_exact(&mut payload).ok()?;
    serde_json::from_slice(&payload).ok()
}

#[cfg(test)]
mod tests {
    use tracer_common::{STRING_OK, STRING_TRUNCATED};

    #[test]
    fn a_truncated_string_loses_its_partial_character() {
        let t = "é".repeat(3);
        let cut = &t.as_bytes()[..5];
        assert_eq!(super::string_text(cut, STRING_TRUNCATED), "éé");
        assert_eq!(super::string_text(cut, STRING_OK), "éé\u{FFFD}");
    }
}
