//! Which binaries of a command or process are instrumented, and their metadata
//! (the `.note.utrace` section the rewriter adds).
//!
//! Every file is opened once ([`HeldFile`]: `fstat`ed, a regular file of bounded size,
//! its `(st_dev, st_ino)` and owner remembered) and used by that descriptor only: the
//! headers and the note are read from it with bounded reads, and the uprobes and
//! semaphores go on it through `/proc/self/fd/N`. A path swapped after the check (a
//! symlink to libc put in its place) cannot point root's breakpoints elsewhere.
//!
//! A `HeldFile` is a regular file of at most 4 GiB; its headers and a note of at most
//! 256 MiB are read. Every binary, a command's and `--binary`'s too, is opened this way, so
//! processes in other mount namespaces get their own files (`trust_files::a_library_swapped_for_libc_after_parsing_puts_nothing_into_libc`).

use std::{
    collections::BTreeSet,
    fs::File,
    os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

use anyhow::{Context, Result, bail};
use object::{
    Endianness, LittleEndian as LE,
    elf::{ELFCLASS64, ELFDATA2LSB, FileHeader64, PT_INTERP, SectionHeader64},
    pod,
    read::elf::{ElfFile64, ProgramHeader},
};
use tracer_common::meta::{META_SECTION, Metadata};

/// Largest file looked at as a binary: a huge (say, sparse) file is refused before
/// more than its ELF header is read.
pub(crate) const MAX_BINARY_BYTES: u64 = 4 << 30;
/// Largest `.note.utrace` section read.
pub(crate) const MAX_NOTE_BYTES: u64 = 256 << 20;
/// Largest program or section header table, and section name table, read.
const MAX_TABLE_BYTES: u64 = 16 << 20;
/// Largest untouched binary (`--uprobe`, `--usdt`): the rewriter reads it whole.
pub(crate) const MAX_UNTOUCHED_BYTES: u64 = 1 << 30;

/// Why a file is not looked at as a binary.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("not a regular file")]
    NotRegular,
    #[error("{size} bytes, more than the {limit} a binary may have")]
    TooLarge { size: u64, limit: u64 },
    #[error("its {what} ({size} bytes) is larger than {limit} bytes")]
    PartTooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("its {0} lies outside the file")]
    OutsideFile(&'static str),
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
}

/// A file's identity: `(st_dev, st_ino)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// A file opened once and checked (`fstat`: a regular file, at most a size limit);
/// every later use goes through this descriptor, never the path again.
#[derive(Clone, Debug)]
pub struct HeldFile {
    file: Arc<File>,
    pub id: FileId,
    /// The file's owner (whose share of the session it takes).
    pub uid: u32,
    pub size: u64,
}

impl HeldFile {
    /// Open `path` and check what was opened: first as `O_PATH`, which opens nothing
    /// (a device node or FIFO a user put in its place is never opened for real: a
    /// watchdog or tape device acts on open, a FIFO would block), then, once `fstat`
    /// says it is a regular file, for reading through that very descriptor.
    pub fn open(path: &Path, limit: u64) -> Result<HeldFile> {
        let at = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOCTTY)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Self::reopen(&at, limit)
            .map_err(|e| anyhow::Error::from(e).context(format!("{}: refused", path.display())))
    }

    /// The file `at` (an `O_PATH` descriptor) if `fstat` says it is a regular file of at
    /// most `limit` bytes, opened for reading through that very descriptor
    /// (`/proc/self/fd/N`): nothing else is ever opened for real.
    pub fn reopen(at: &File, limit: u64) -> Result<HeldFile, Refused> {
        let md = at.metadata()?;
        if !md.is_file() {
            return Err(Refused::NotRegular);
        }
        if md.len() > limit {
            return Err(Refused::TooLarge {
                size: md.len(),
                limit,
            });
        }
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(format!("/proc/self/fd/{}", at.as_raw_fd()))?;
        Self::check(f, limit)
    }

    /// `f` if it is a regular file of at most `limit` bytes.
    pub fn check(f: File, limit: u64) -> Result<HeldFile, Refused> {
        let md = f.metadata()?;
        if !md.file_type().is_file() {
            return Err(Refused::NotRegular);
        }
        if md.len() > limit {
            return Err(Refused::TooLarge {
                size: md.len(),
                limit,
            });
        }
        Ok(HeldFile {
            file: Arc::new(f),
            id: FileId {
                dev: md.dev(),
                ino: md.ino(),
            },
            uid: md.uid(),
            size: md.len(),
        })
    }

    /// `/proc/self/fd/N` of the held descriptor: the file itself for the kernel's
    /// interfaces that take a path (uprobes, perf uprobe events).
    pub fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// `len` bytes at `offset`, which must lie inside the file (`what` names the part).
    fn read_at(&self, offset: u64, len: u64, what: &'static str) -> Result<Vec<u8>, Refused> {
        let end = offset.checked_add(len).ok_or(Refused::OutsideFile(what))?;
        if end > self.size {
            return Err(Refused::OutsideFile(what));
        }
        let mut buf = vec![0u8; usize::try_from(len).map_err(|_| Refused::OutsideFile(what))?];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// The whole file (at most the limit it was opened with).
    fn read_all(&self) -> Result<Vec<u8>, Refused> {
        self.read_at(0, self.size, "contents")
    }
}

/// An instrumented binary.
#[derive(Clone, Debug)]
pub struct Instrumented {
    pub path: PathBuf,
    pub meta: Metadata,
    /// Raw contents of the note section (stored in the trace file).
    pub note: Vec<u8>,
    /// Not rewritten: traced by uprobes only (`record --uprobe/--usdt`); the metadata
    /// describes the original file, it has no flush function, RW area or anchors.
    pub untouched: bool,
    /// The file the metadata was read from, held open: its uprobes and semaphores go
    /// on it (`HeldFile::proc_path`), its identity tells copies apart.
    pub file: HeldFile,
    /// The first PT_LOAD segment's (p_vaddr, p_offset): where the load bias is read.
    first_load: Option<(u64, u64)>,
}

impl Instrumented {
    /// Where uprobes and semaphore events are attached: the held file.
    pub fn attach_path(&self) -> PathBuf {
        self.file.proc_path()
    }
}

/// The metadata of `path` if it is an instrumented binary. Files that are not ELF or
/// have no note give None; a note that does not parse gives None and a warning.
pub(crate) fn read_instrumented(path: &Path) -> Result<Option<Instrumented>> {
    let f = HeldFile::open(path, MAX_BINARY_BYTES)?;
    read_instrumented_file(f, path)
}

/// [`read_instrumented`] of a held file (named `path` in messages and traces).
fn read_instrumented_file(f: HeldFile, path: &Path) -> Result<Option<Instrumented>> {
    // Only the headers and the note are read, each bounded (system-wide sessions look
    // at every file every process maps).
    let parts = elf_parts(&f).with_context(|| format!("{}: refused", path.display()))?;
    let Some(parts) = parts else {
        return Ok(None);
    };
    let Some(note) = parts.note else {
        return Ok(None);
    };
    match Metadata::from_note_section(&note) {
        Some(Ok(meta)) => Ok(Some(Instrumented {
            path: path.to_path_buf(),
            meta,
            note,
            untouched: false,
            file: f,
            first_load: parts.first_load,
        })),
        Some(Err(e)) => {
            log::warn!("{}: ignoring broken {META_SECTION}: {e}", path.display());
            Ok(None)
        }
        None => {
            log::warn!(
                "{}: {META_SECTION} holds no utrace note; ignoring",
                path.display()
            );
            Ok(None)
        }
    }
}

/// What the tracer reads of an ELF file: its note and first loadable segment.
struct ElfParts {
    note: Option<Vec<u8>>,
    first_load: Option<(u64, u64)>,
}

/// The parts of `f` the tracer needs, each read with a bounded read; None if `f` is
/// not a 64-bit little-endian ELF file (instrumented binaries are).
fn elf_parts(f: &HeldFile) -> Result<Option<ElfParts>, Refused> {
    let Some(layout) = elf_layout(f)? else {
        return Ok(None);
    };
    let note = match layout.note {
        Some((offset, size)) => Some(f.read_at(offset, size, META_SECTION)?),
        None => None,
    };
    Ok(Some(ElfParts {
        note,
        first_load: layout.first_load,
    }))
}

/// Whether `f` is an ELF file with a `.note.utrace` section (of at most
/// `MAX_NOTE_BYTES`): only its headers and section names are read, each bounded; the
/// note itself is not.
pub(crate) fn has_utrace_note(f: &HeldFile) -> bool {
    matches!(elf_layout(f), Ok(Some(ElfLayout { note: Some(_), .. })))
}

/// Where an ELF file's note is (offset, size) and its first loadable segment.
struct ElfLayout {
    note: Option<(u64, u64)>,
    first_load: Option<(u64, u64)>,
}

/// The layout of `f` from its headers and section name table (each read once, with
/// a bounded read); None if `f` is not a 64-bit little-endian ELF file.
fn elf_layout(f: &HeldFile) -> Result<Option<ElfLayout>, Refused> {
    let Some(h) = elf_header(f)? else {
        return Ok(None);
    };
    let e = LE;
    // Section 0 holds the real counts when the header's overflow (extended numbering).
    let (shoff, shentsize) = (h.e_shoff.get(e), u64::from(h.e_shentsize.get(e)));
    let first = if shoff != 0 && shentsize == SH_SIZE {
        let raw = f.read_at(shoff, SH_SIZE, "section headers")?;
        pod::from_bytes::<SectionHeader64<LE>>(&raw)
            .ok()
            .map(|(s, _)| *s)
    } else {
        None
    };
    let phnum = match u64::from(h.e_phnum.get(e)) {
        0xffff => first.map_or(0, |s| u64::from(s.sh_info.get(e))),
        n => n,
    };
    let first_load = first_load(f, h.e_phoff.get(e), u64::from(h.e_phentsize.get(e)), phnum)?;
    let note = match first {
        Some(first) => note_section(f, &h, &first)?,
        None => None,
    };
    Ok(Some(ElfLayout { note, first_load }))
}

/// The size of a section header.
const SH_SIZE: u64 = size_of::<SectionHeader64<LE>>() as u64;

/// `f`'s ELF header; None if it is not a 64-bit little-endian ELF file.
fn elf_header(f: &HeldFile) -> Result<Option<FileHeader64<LE>>, Refused> {
    const EHDR: u64 = size_of::<FileHeader64<LE>>() as u64;
    if f.size < EHDR {
        return Ok(None);
    }
    let raw = f.read_at(0, EHDR, "ELF header")?;
    let Ok((h, _)) = pod::from_bytes::<FileHeader64<LE>>(&raw) else {
        return Ok(None);
    };
    let id = h.e_ident;
    if id.magic != object::elf::ELFMAG || id.class != ELFCLASS64 || id.data != ELFDATA2LSB {
        return Ok(None);
    }
    Ok(Some(*h))
}

/// Where `f`'s `.note.utrace` section is (offset, size), from its section header table
/// (`first`: its section 0) and section names.
fn note_section(
    f: &HeldFile,
    h: &FileHeader64<LE>,
    first: &SectionHeader64<LE>,
) -> Result<Option<(u64, u64)>, Refused> {
    let e = LE;
    let shnum = match u64::from(h.e_shnum.get(e)) {
        0 => first.sh_size.get(e),
        n => n,
    };
    let strndx = match u64::from(h.e_shstrndx.get(e)) {
        0xffff => u64::from(first.sh_link.get(e)),
        n => n,
    };
    if strndx >= shnum {
        return Ok(None);
    }
    // The whole table in one bounded read (not one read per section).
    let table_size = bounded(
        "section header table",
        shnum.saturating_mul(SH_SIZE),
        MAX_TABLE_BYTES,
    )?;
    let table = f.read_at(h.e_shoff.get(e), table_size, "section headers")?;
    let Ok((sections, _)) = pod::slice_from_bytes::<SectionHeader64<LE>>(&table, shnum as usize)
    else {
        return Ok(None);
    };
    let strtab = &sections[strndx as usize];
    let names_size = bounded("section name table", strtab.sh_size.get(e), MAX_TABLE_BYTES)?;
    let names = f.read_at(strtab.sh_offset.get(e), names_size, "section name table")?;
    let wanted = META_SECTION.as_bytes();
    for s in sections.iter().skip(1) {
        let at = s.sh_name.get(e) as usize;
        let name = names.get(at..).unwrap_or_default();
        let name = name.split(|&c| c == 0).next().unwrap_or_default();
        if name != wanted || s.sh_type.get(e) == object::elf::SHT_NOBITS {
            continue;
        }
        let size = bounded(META_SECTION, s.sh_size.get(e), MAX_NOTE_BYTES)?;
        let offset = s.sh_offset.get(e);
        if offset.checked_add(size).is_none_or(|end| end > f.size) {
            return Err(Refused::OutsideFile(META_SECTION));
        }
        return Ok(Some((offset, size)));
    }
    Ok(None)
}

/// `size` if at most `limit`.
fn bounded(what: &'static str, size: u64, limit: u64) -> Result<u64, Refused> {
    if size > limit {
        return Err(Refused::PartTooLarge { what, size, limit });
    }
    Ok(size)
}

/// The lowest PT_LOAD's (p_vaddr, p_offset), from a bounded read of the program headers.
fn first_load(
    f: &HeldFile,
    phoff: u64,
    phentsize: u64,
    phnum: u64,
) -> Result<Option<(u64, u64)>, Refused> {
    use object::elf::ProgramHeader64;
    let ph_size = size_of::<ProgramHeader64<LE>>() as u64;
    if phnum == 0 || phentsize != ph_size {
        return Ok(None);
    }
    let total = bounded(
        "program header table",
        phnum.saturating_mul(ph_size),
        MAX_TABLE_BYTES,
    )?;
    let raw = f.read_at(phoff, total, "program headers")?;
    let Ok((phs, _)) = pod::slice_from_bytes::<ProgramHeader64<LE>>(&raw, phnum as usize) else {
        return Ok(None);
    };
    Ok(phs
        .iter()
        .filter(|ph| ph.p_type.get(LE) == object::elf::PT_LOAD)
        .map(|ph| (ph.p_vaddr.get(LE), ph.p_offset.get(LE)))
        .min_by_key(|&(vaddr, _)| vaddr))
}

/// An untouched binary traced by uprobes only: the sites the rewriter would place
/// (function entries of `functions`, or its USDT probes with `usdt`), all as uprobes.
pub(crate) fn untouched(path: &Path, functions: &[String], usdt: bool) -> Result<Instrumented> {
    let file = HeldFile::open(path, MAX_UNTOUCHED_BYTES)?;
    let data = file
        .read_all()
        .with_context(|| format!("cannot read {}", path.display()))?;
    let kinds = if usdt {
        vec![rewriter::SiteKind::Usdt]
    } else {
        vec![rewriter::SiteKind::FunctionEntry]
    };
    let opts = rewriter::Options {
        functions: functions.to_vec(),
        kinds,
        ..Default::default()
    };
    let name = path.display().to_string();
    let note = rewriter::uprobe_metadata(&name, &data, &opts)?;
    let meta = Metadata::from_note_section(&note)
        .context("no utrace note")?
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    if meta.sites.is_empty() {
        bail!("{name}: nothing to probe (no USDT probes)");
    }
    Ok(Instrumented {
        path: path.to_path_buf(),
        meta,
        note,
        untouched: true,
        file,
        first_load: None,
    })
}

use super::{credentials::RunAs, procdir::ProcDir};

/// Longest PT_INTERP read (a path).
const MAX_INTERP_BYTES: u64 = 4096;
/// Most output read from `ld.so --list` (the loader is the user's program: bounded).
const MAX_LD_LIST_BYTES: u64 = 1 << 20;
/// Most of its error output kept for the message.
const MAX_LD_ERR_BYTES: u64 = 16 << 10;

/// The program interpreter (PT_INTERP) of an ELF executable, None for static ones.
/// Only the headers and the interpreter's name are read (lazily, bounded).
fn interpreter(exe: &Path) -> Result<Option<PathBuf>> {
    let f = std::fs::File::open(exe).with_context(|| format!("cannot read {}", exe.display()))?;
    if !f.metadata()?.is_file() {
        bail!("{}: not a regular file", exe.display());
    }
    let data = object::read::ReadCache::new(f);
    let elf = ElfFile64::<Endianness, _>::parse(&data)
        .with_context(|| format!("{} is not a 64-bit ELF file", exe.display()))?;
    let endian = elf.endian();
    let Some(ph) = elf
        .elf_program_headers()
        .iter()
        .find(|ph| ph.p_type(endian) == PT_INTERP)
    else {
        return Ok(None);
    };
    if ph.p_filesz(endian) > MAX_INTERP_BYTES {
        bail!("{}: PT_INTERP longer than a path", exe.display());
    }
    let raw = ph
        .data(endian, &data)
        .map_err(|()| anyhow::anyhow!("{}: bad PT_INTERP", exe.display()))?;
    let raw = raw.split(|&c| c == 0).next().unwrap_or(raw);
    let s = std::str::from_utf8(raw)
        .with_context(|| format!("{}: PT_INTERP is not UTF-8", exe.display()))?;
    Ok(Some(PathBuf::from(s)))
}

/// Parse `ld.so --list` output: the resolved path of every loaded object.
fn parse_ld_list(out: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for line in out.lines().map(str::trim) {
        let target = match line.split_once(" => ") {
            Some((name, rest)) => {
                if rest.starts_with("not found") {
                    log::warn!("{name}: not found by the dynamic loader");
                    continue;
                }
                rest
            }
            None => line,
        };
        if !target.starts_with('/') {
            continue; // vdso, or "statically linked" and the like
        }
        let path = target.rsplit_once(" (0x").map_or(target, |(p, _)| p);
        paths.push(PathBuf::from(path.trim_end()));
    }
    paths
}

/// The objects `exe` loads, resolved the way the dynamic loader does (it is asked:
/// `<PT_INTERP> --list exe`, honouring LD_LIBRARY_PATH and friends). The loader is
/// named by the file, so it is run as the command will be (`run_as`, no capability
/// unless root) and started as the command is (`credentials::Launch`); its output is
/// bounded.
fn shared_libraries(exe: &Path, run_as: Option<&RunAs>) -> Result<Vec<PathBuf>> {
    use std::{os::unix::process::CommandExt, process::Stdio};

    use crate::record::session::credentials::{ChildError, Launch};
    let Some(interp) = interpreter(exe)? else {
        return Ok(Vec::new());
    };
    let mut cmd = Command::new(&interp);
    cmd.arg("--list")
        .arg(exe)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let launch = Launch::new(run_as);
    // SAFETY: `Launch::apply` makes async-signal-safe calls only, on memory prepared
    // before the fork (what pre_exec requires).
    unsafe {
        cmd.pre_exec(move || launch.apply(None).map_err(ChildError::into_io));
    }
    let who = run_as.map_or(String::new(), |r| format!(" as {}", r.name));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {} --list{who}", interp.display()))?;
    let (out, err) = bounded_output(&mut child);
    let status = child.wait().context("waiting for the loader")?;
    let out = out.with_context(|| format!("{} --list {}", interp.display(), exe.display()))?;
    if !status.success() {
        bail!(
            "{} --list {} failed ({status}): {}",
            interp.display(),
            exe.display(),
            String::from_utf8_lossy(&err).trim()
        );
    }
    Ok(parse_ld_list(&String::from_utf8_lossy(&out)))
}

/// A child's stdout (an error past `MAX_LD_LIST_BYTES`: the child is killed) and the
/// start of its stderr, read side by side so that neither pipe can fill and block it.
fn bounded_output(child: &mut std::process::Child) -> (Result<Vec<u8>>, Vec<u8>) {
    use std::io::Read;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (out, err) = std::thread::scope(|s| {
        let err = s.spawn(|| {
            let mut buf = Vec::new();
            if let Some(e) = stderr {
                let _ = e.take(MAX_LD_ERR_BYTES).read_to_end(&mut buf);
            }
            buf
        });
        let mut out = Vec::new();
        let read = match stdout {
            Some(o) => o
                .take(MAX_LD_LIST_BYTES + 1)
                .read_to_end(&mut out)
                .map(|_| ()),
            None => Ok(()),
        };
        (read.map(|()| out), err.join().unwrap_or_default())
    });
    let out = match out {
        Ok(out) if out.len() as u64 > MAX_LD_LIST_BYTES => {
            let _ = child.kill();
            Err(anyhow::anyhow!(
                "more than {MAX_LD_LIST_BYTES} bytes of output"
            ))
        }
        Ok(out) => Ok(out),
        Err(e) => Err(anyhow::Error::new(e).context("reading its output")),
    };
    (out, err)
}

/// The instrumented binaries among `exe` and the shared libraries it links (listed by
/// its loader run as `run_as`).
pub(crate) fn for_command(exe: &Path, run_as: Option<&RunAs>) -> Result<Vec<Instrumented>> {
    let mut candidates = vec![exe.to_path_buf()];
    candidates.extend(shared_libraries(exe, run_as)?);
    collect(candidates)
}

/// Binaries named on the command line (`tracer record --binary PATH`): each must be an
/// instrumented binary, since the user asked for it by name.
pub(crate) fn named(paths: &[PathBuf]) -> Result<Vec<Instrumented>> {
    let mut found = Vec::with_capacity(paths.len());
    for path in paths {
        match read_instrumented(path).with_context(|| format!("--binary {}", path.display()))? {
            Some(b) => found.push(b),
            None => bail!(
                "--binary {}: not an instrumented binary (no {META_SECTION} note; run the rewriter on it first)",
                path.display()
            ),
        }
    }
    Ok(found)
}

/// `extra` appended to `found`, skipping files already there (the same file: same
/// `(st_dev, st_ino)`). Two files with one binary_id are the session's to judge
/// (`Live::add_binary`: a copy is traced under the same ordinal, other contents refused).
pub(crate) fn merge(found: &mut Vec<Instrumented>, extra: Vec<Instrumented>) {
    for b in extra {
        if !found.iter().any(|o| o.file.id == b.file.id) {
            found.push(b);
        }
    }
}

fn collect(candidates: Vec<PathBuf>) -> Result<Vec<Instrumented>> {
    let mut found: Vec<Instrumented> = Vec::new();
    for path in candidates {
        // A file the loader lists but that is refused (too large, not a regular file)
        // is not traced; the others still are.
        match read_instrumented(&path) {
            Ok(Some(b)) => merge(&mut found, vec![b]),
            Ok(None) => {}
            Err(e) => log::warn!("not traced: {e:#}"),
        }
    }
    Ok(found)
}

/// A file mapping of a process.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Mapping {
    pub start: u64,
    pub offset: u64,
    pub path: PathBuf,
    pub end: u64,
    /// The mapped file's device as `maps` shows it (the superblock's: on btrfs or
    /// overlayfs not the `st_dev` that `fstat` gives) and inode: a hint only, the
    /// file's identity is the `fstat` of its `map_files` descriptor.
    pub dev: u64,
    pub inode: u64,
}

/// A maps line's `MAJOR:MINOR` (hex) as an `st_dev`.
fn parse_dev(s: &str) -> Option<u64> {
    let (major, minor) = s.split_once(':')?;
    let (major, minor) = (
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    Some(libc::makedev(major, minor))
}

/// File-backed mappings from the `maps` of a held `/proc/PID`.
pub(crate) fn mappings_of(proc: &ProcDir) -> Result<Vec<Mapping>> {
    let text = proc.read(c"maps")?;
    Ok(text.lines().filter_map(parse_maps_line).collect())
}

/// One line of `maps` (`start-end perms offset dev inode path`), if a file's.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut f = line.splitn(6, ' ');
    let (range, _perms, offset, dev, inode, path) = (
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
    );
    let path = path.trim_start();
    if !path.starts_with('/') || path.ends_with(" (deleted)") {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: PathBuf::from(path),
        dev: parse_dev(dev).unwrap_or(0),
        inode: inode.parse().unwrap_or(0),
    })
}

/// The instrumented binaries mapped into process `pid`, each with its load bias
/// (run-time address − link-time address).
pub(crate) fn for_process(pid: u32) -> Result<Vec<(Instrumented, u64)>> {
    for_process_in(&ProcDir::open(pid)?, &mut Default::default())
}

/// Files already looked at, instrumented or not, by identity (`(st_dev, st_ino)` of
/// the mapped file, from `fstat` of its `map_files` descriptor) and path. An
/// instrumented one is held open, so its inode number cannot be reused meanwhile.
pub(crate) type SeenFiles = std::collections::HashMap<(FileId, PathBuf), Option<Instrumented>>;

/// [`for_process`] of a held `/proc/PID` (its `maps` and `map_files` read through
/// it), for sessions that look at many processes: what each file is (instrumented or
/// not) is remembered in `seen`, and files already there that are instrumented are
/// returned again (their bias differs per process).
pub(crate) fn for_process_in(
    proc: &ProcDir,
    seen: &mut SeenFiles,
) -> Result<Vec<(Instrumented, u64)>> {
    let maps = mappings_of(proc)?;
    let mut out = Vec::new();
    let mut done = BTreeSet::new();
    for m in &maps {
        if !done.insert((m.dev, m.inode, &m.path)) {
            continue;
        }
        let at = match mapped_file(proc, m) {
            Ok(at) => at,
            Err(e) => {
                log::debug!("{e:#}");
                continue;
            }
        };
        let key = (at.1, m.path.clone());
        let b = match seen.get(&key) {
            Some(b) => b.clone(),
            // Only what the file says is remembered: a file that could not be read
            // is looked at again next time.
            None => match read_mapped(&at.0, &m.path) {
                Ok(b) => {
                    seen.insert(key, b.clone());
                    b
                }
                Err(e) => {
                    log::debug!("{e:#}");
                    None
                }
            },
        };
        if let Some(b) = b {
            match load_bias_in(proc, &b, &maps) {
                Ok(bias) => out.push((b, bias)),
                // A process that exits or execs while it is read loses its mappings:
                // nothing to warn about (its exec is seen on its own).
                Err(e) if mappings_of(proc).is_ok_and(|now| now == maps) => {
                    log::warn!("{} in process {}: {e:#}", b.path.display(), proc.pid)
                }
                Err(e) => log::debug!("process {} changed while read: {e:#}", proc.pid),
            }
        }
    }
    Ok(out)
}

/// The file mapped at `m` (an `O_PATH` descriptor through `map_files`: the mapped
/// inode itself, not whatever its path names now, also right for processes in other
/// mount namespaces) and its identity, if it is still inode `m.inode`. Only the inode
/// is compared: the device `maps` shows is the superblock's, which is not `st_dev` on
/// btrfs or overlayfs.
fn mapped_file(proc: &ProcDir, m: &Mapping) -> Result<(File, FileId)> {
    let at = proc.map_file(m.start, m.end)?;
    let md = at.metadata().context("fstat of a mapped file")?;
    if md.ino() != m.inode {
        bail!(
            "/proc/{}/map_files/{:x}-{:x} is not inode {} any more",
            proc.pid,
            m.start,
            m.end,
            m.inode
        );
    }
    Ok((
        at,
        FileId {
            dev: md.dev(),
            ino: md.ino(),
        },
    ))
}

/// The mapped file `at` (`O_PATH`), if it is instrumented: checked and held
/// ([`HeldFile::reopen`]: a regular file of bounded size, never a device opened).
fn read_mapped(at: &File, path: &Path) -> Result<Option<Instrumented>> {
    let held = HeldFile::reopen(at, MAX_BINARY_BYTES)
        .map_err(|e| anyhow::Error::from(e).context(format!("{}: refused", path.display())))?;
    read_instrumented_file(held, path)
}

/// Load bias of `b` in a process: where its first PT_LOAD segment was mapped (the
/// mapping of that very file: same inode in `maps`, and the same `(st_dev, st_ino)`
/// through its `map_files` descriptor).
pub(crate) fn load_bias_in(proc: &ProcDir, b: &Instrumented, maps: &[Mapping]) -> Result<u64> {
    let (vaddr, offset) = b.first_load.context("no PT_LOAD segment")?;
    let page = 4096u64;
    let m = maps
        .iter()
        .filter(|m| m.inode == b.file.id.ino && m.offset == offset & !(page - 1))
        .find(|m| mapped_file(proc, m).is_ok_and(|(_, id)| id == b.file.id))
        .context("first segment not found in /proc/PID/maps")?;
    Ok(m.start.wrapping_sub(vaddr & !(page - 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ld_list_output() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd5c9f2000)\n\
                   \tlibtraced.so => /opt/lib/libtraced.so (0x00007f2a1c000000)\n\
                   \tlibmissing.so => not found\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2a1be00000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f2a1c200000)\n";
        assert_eq!(
            parse_ld_list(out),
            [
                "/opt/lib/libtraced.so",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn uninstrumented_system_binary() {
        let sh = Path::new("/bin/sh");
        assert!(read_instrumented(sh).unwrap().is_none());
        assert!(for_command(sh, None).unwrap().is_empty());
        // The oracle: the files `ldd` lists with a path (libraries and the loader).
        let ldd = std::process::Command::new("ldd").arg(sh).output().unwrap();
        let want = String::from_utf8(ldd.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.contains("=> /") || l.trim_start().starts_with('/'))
            .count();
        assert!(want > 0);
        assert_eq!(shared_libraries(sh, None).unwrap().len(), want);
    }

    /// Row 5 of issue 28: a sparse 100 GiB file was read whole (`std::fs::read`) by
    /// `untouched` and `load_bias`; now it is refused from its size alone.
    #[test]
    fn a_sparse_huge_file_is_refused_unread() {
        let path = std::env::temp_dir().join(format!("utrace-sparse-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(100 << 30).unwrap();
        drop(f);
        let t = std::time::Instant::now();
        let e = read_instrumented(&path).unwrap_err();
        assert!(format!("{e:#}").contains("more than the"), "{e:#}");
        let e = untouched(&path, &[], true).unwrap_err();
        assert!(format!("{e:#}").contains("more than the"), "{e:#}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_directory_is_refused() {
        let e = read_instrumented(Path::new("/")).unwrap_err();
        assert!(format!("{e:#}").contains("not a regular file"), "{e:#}");
    }

    #[test]
    fn own_mappings() {
        let maps = mappings_of(&ProcDir::open(std::process::id()).unwrap()).unwrap();
        assert!(!maps.is_empty());
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let held = HeldFile::open(&exe, MAX_BINARY_BYTES).unwrap();
        let parts = elf_parts(&held).unwrap().unwrap();
        let b = Instrumented {
            path: exe,
            meta: Metadata::default(),
            note: Vec::new(),
            untouched: false,
            file: held,
            first_load: parts.first_load,
        };
        let bias = load_bias_in(&ProcDir::open(std::process::id()).unwrap(), &b, &maps).unwrap();
        // PIE test binaries load high, non-PIE at bias 0.
        assert!(bias == 0 || bias > 0x1000);
    }
}
