//! Code addresses → function, file and line, with inlined frames (DWARF through
//! addr2line), names demangled (C++ and Rust).
//!
//! A traced binary's debug information is looked for, in this order, in: the binary
//! itself (when its build-id is still the recorded one), the tracer's debug cache
//! (`~/.cache/utrace/debug/.build-id/xx/yyyy.debug`, filled by `tracer record`, so
//! reports work after the binary is rebuilt or deleted), `DIR/.build-id/xx/yyyy.debug`
//! for each `--debug-dir` and `/usr/lib/debug`, then the binary's `.gnu_debuglink`
//! (next to it, in its `.debug/`, under `/usr/lib/debug/` + its directory, in each
//! `--debug-dir`; CRC checked). Each binary is loaded once and each address resolved
//! once per run.

use std::{
    borrow::Cow,
    collections::HashMap,
    path::{Path, PathBuf},
    rc::Rc,
};

use anyhow::{Context as _, Result};
use object::{Object, ObjectSection};
use serde::Serialize;

/// One frame at a code address: the innermost (possibly inlined) function first.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Inlined into the next frame.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

impl Frame {
    /// `file:line` (file name only), or "" when unknown.
    pub fn location(&self) -> String {
        match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{}:{l}", short(f)),
            (Some(f), None) => short(f).to_string(),
            _ => String::new(),
        }
    }
}

fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Demangle a C++ or Rust symbol name (others unchanged).
pub fn demangle(name: &str) -> Cow<'_, str> {
    rewriter::demangle(name).map_or(Cow::Borrowed(name), Cow::Owned)
}

/// Where a binary's debug information came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DebugSource {
    pub path: String,
    /// "binary", "cache", "build-id", "debuglink", or "symbols" (no DWARF found: names
    /// from the binary's symbol table only).
    pub how: &'static str,
}

struct Loaded {
    loader: addr2line::Loader,
    source: DebugSource,
    /// Read from the same (build-id checked) file as the DWARF.
    layout: Layout,
}

/// Resolves code addresses of the binaries of one trace.
pub struct Symbolizer {
    dirs: Vec<PathBuf>,
    cache: Option<PathBuf>,
    binaries: HashMap<u64, Option<Rc<Loaded>>>,
    /// Where each binary (by binary id) is and which build-id it was recorded with.
    known: HashMap<u64, (PathBuf, Vec<u8>)>,
    memo: HashMap<(u64, u64), Rc<[Frame]>>,
}

/// What the ELF headers and symbol table of a binary say.
#[derive(Default)]
struct Layout {
    /// `ET_EXEC`: loaded at its link-time addresses.
    fixed: bool,
    /// File addresses of its code (executable `PT_LOAD`s).
    code: Vec<(u64, u64)>,
    /// Function symbols: (start, end, name), sorted; a symbol of size 0 covers only
    /// its address.
    functions: Vec<(u64, u64, String)>,
}

impl Layout {
    fn function_at(&self, vaddr: u64) -> Option<&str> {
        let i = self.functions.partition_point(|f| f.0 <= vaddr);
        // Symbols starting at or below vaddr, nearest first: the first that covers it
        // (a few: symbols nest only as aliases and local labels).
        self.functions[..i]
            .iter()
            .rev()
            .take(64)
            .find(|f| vaddr < f.1 || f.0 == vaddr)
            .map(|f| f.2.as_str())
    }
}

fn read_layout(data: &[u8]) -> Option<Layout> {
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::{ObjectSymbol, SymbolKind};
    let h = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let e = h.endian().ok()?;
    let code = h
        .program_headers(e, data)
        .ok()?
        .iter()
        .filter(|p| p.p_type(e) == object::elf::PT_LOAD && p.p_flags(e) & object::elf::PF_X != 0)
        .filter_map(|p| Some((p.p_vaddr(e), p.p_vaddr(e).checked_add(p.p_memsz(e))?)))
        .collect();
    let obj = object::File::parse(data).ok()?;
    let mut functions: Vec<(u64, u64, String)> = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter_map(|s| {
            let end = s.address().checked_add(s.size())?;
            Some((s.address(), end, s.name().ok()?.to_string()))
        })
        .collect();
    functions.sort();
    functions.dedup();
    Some(Layout {
        fixed: h.e_type(e) == object::elf::ET_EXEC,
        code,
        functions,
    })
}

impl Symbolizer {
    /// `dirs`: extra debug directories (`--debug-dir`), searched before
    /// `/usr/lib/debug`.
    pub fn new(dirs: &[PathBuf]) -> Symbolizer {
        Symbolizer {
            dirs: dirs.to_vec(),
            cache: cache_dir(),
            binaries: HashMap::new(),
            known: HashMap::new(),
            memo: HashMap::new(),
        }
    }

    pub fn add_binary(&mut self, binary_id: u64, path: &str, build_id: &[u8]) {
        self.known
            .insert(binary_id, (PathBuf::from(path), build_id.to_vec()));
    }

    /// Whether `binary_id` loads at its link-time addresses (ELF `ET_EXEC`: bias 0).
    pub fn fixed_address(&mut self, binary_id: u64) -> bool {
        self.loaded(binary_id).is_some_and(|l| l.layout.fixed)
    }

    /// Whether file address `vaddr` is in `binary_id`'s code.
    pub fn is_code(&mut self, binary_id: u64, vaddr: u64) -> bool {
        self.loaded(binary_id).is_some_and(|l| {
            l.layout
                .code
                .iter()
                .any(|&(lo, hi)| (lo..hi).contains(&vaddr))
        })
    }

    /// Where the debug information of `binary_id` comes from (None: nothing usable).
    pub fn source(&mut self, binary_id: u64) -> Option<DebugSource> {
        self.loaded(binary_id).map(|l| l.source.clone())
    }

    fn loaded(&mut self, binary_id: u64) -> Option<Rc<Loaded>> {
        if let Some(l) = self.binaries.get(&binary_id) {
            return l.clone();
        }
        let l = self.known.get(&binary_id).and_then(|(path, build_id)| {
            let found = locate(path, build_id, self.cache.as_deref(), &self.dirs);
            let (file, how) = found?;
            let layout = map_regular(&file)
                .and_then(|m| read_layout(&m))
                .unwrap_or_default();
            match addr2line::Loader::new(&file) {
                Ok(loader) => {
                    log::debug!(
                        "{}: debug info from {} ({how})",
                        path.display(),
                        file.display()
                    );
                    Some(Rc::new(Loaded {
                        loader,
                        source: DebugSource {
                            path: file.to_string_lossy().into_owned(),
                            how,
                        },
                        layout,
                    }))
                }
                Err(e) => {
                    log::warn!("{}: cannot read {}: {e}", path.display(), file.display());
                    None
                }
            }
        });
        self.binaries.insert(binary_id, l.clone());
        l
    }

    /// The frames at file address `vaddr` of `binary_id`, innermost first; empty when
    /// nothing is known about it.
    pub fn frames(&mut self, binary_id: u64, vaddr: u64) -> Rc<[Frame]> {
        if let Some(f) = self.memo.get(&(binary_id, vaddr)) {
            return f.clone();
        }
        let frames: Rc<[Frame]> = match self.loaded(binary_id) {
            Some(l) => resolve(&l.loader, &l.layout, vaddr).into(),
            None => Rc::from([]),
        };
        self.memo.insert((binary_id, vaddr), frames.clone());
        frames
    }
}

fn resolve(loader: &addr2line::Loader, layout: &Layout, vaddr: u64) -> Vec<Frame> {
    let mut out = Vec::new();
    if let Ok(mut it) = loader.find_frames(vaddr) {
        while let Ok(Some(f)) = it.next() {
            let function = f
                .function
                .as_ref()
                .and_then(|n| n.demangle().ok())
                .map(|n| n.into_owned());
            let (file, line) = f
                .location
                .map_or((None, None), |l| (l.file.map(str::to_string), l.line));
            out.push(Frame {
                function: function.unwrap_or_default(),
                file,
                line,
                inlined: true,
            });
        }
    }
    if let Some(last) = out.last_mut() {
        last.inlined = false;
    }
    // No DWARF function (or no DWARF): the symbol that covers the address (by its
    // size: the nearest one below may be another function's) names the function.
    if (out.is_empty() || out.iter().all(|f| f.function.is_empty()))
        && let Some(name) = layout.function_at(vaddr)
    {
        let name = demangle(name).into_owned();
        match out.last_mut() {
            Some(last) => last.function = name,
            None => out.push(Frame {
                function: name,
                file: None,
                line: None,
                inlined: false,
            }),
        }
    }
    out
}

/// The tracer's debug cache: `$XDG_CACHE_HOME/utrace/debug` or `~/.cache/utrace/debug`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("UTRACE_DEBUG_CACHE") {
        return (!d.is_empty()).then(|| PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("utrace").join("debug"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `.build-id/xx/yyyy.debug` under `root`.
fn build_id_path(root: &Path, build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    Some(
        root.join(".build-id")
            .join(hex(&[*first]))
            .join(format!("{}.debug", hex(rest))),
    )
}

/// What a candidate file holds.
struct FileFacts {
    build_id: Option<Vec<u8>>,
    dwarf: bool,
    debuglink: Option<(Vec<u8>, u32)>,
}

/// `path` mapped read-only, if it is a regular file (not a FIFO or device a hostile
/// debuglink or trace could name).
fn map_regular(path: &Path) -> Option<memmap2::Mmap> {
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking: opening a FIFO for reading would wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        log::warn!("{}: not a regular file; ignored", path.display());
        return None;
    }
    // SAFETY: a read-only private mapping of a regular file; a file truncated by
    // someone else while mapped faults like any reader's would (addr2line maps the
    // same files the same way).
    unsafe { memmap2::Mmap::map(&f) }.ok()
}

fn facts_of(data: &[u8]) -> Option<FileFacts> {
    let obj = object::File::parse(data).ok()?;
    Some(FileFacts {
        build_id: obj.build_id().ok().flatten().map(<[u8]>::to_vec),
        dwarf: obj
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0),
        debuglink: obj
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(n, crc)| (n.to_vec(), crc)),
    })
}

fn facts(path: &Path) -> Option<FileFacts> {
    facts_of(&map_regular(path)?)
}

/// A `.gnu_debuglink` name is a file name: one normal path component (not absolute,
/// no `..`), else it could point anywhere.
fn debuglink_name(name: &[u8]) -> Option<PathBuf> {
    use std::path::Component;
    let p = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name));
    let mut c = p.components();
    match (c.next(), c.next()) {
        (Some(Component::Normal(_)), None) => Some(p.to_path_buf()),
        _ => None,
    }
}

/// The file to read `path`'s debug information from, and how it was found.
fn locate(
    path: &Path,
    build_id: &[u8],
    cache: Option<&Path>,
    dirs: &[PathBuf],
) -> Option<(PathBuf, &'static str)> {
    // No recorded build-id: any file at the path is taken, with a note.
    let same_build = |f: &FileFacts| build_id.is_empty() || f.build_id.as_deref() == Some(build_id);
    if build_id.is_empty() {
        log::info!(
            "{}: no build-id recorded; the file there now is taken as the traced one",
            path.display()
        );
    }
    let own = facts(path).filter(|f| {
        let ok = same_build(f);
        if !ok {
            log::warn!(
                "{}: not the binary that was traced (build-id differs); looking elsewhere",
                path.display()
            );
        }
        ok
    });
    if own.as_ref().is_some_and(|f| f.dwarf) {
        return Some((path.to_path_buf(), "binary"));
    }
    let with_dwarf = |p: &Path| facts(p).is_some_and(|f| f.dwarf && same_build(&f));
    if !build_id.is_empty() {
        if let Some(p) = cache.and_then(|c| build_id_path(c, build_id))
            && with_dwarf(&p)
        {
            return Some((p, "cache"));
        }
        for root in dirs
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new("/usr/lib/debug")])
        {
            if let Some(p) = build_id_path(root, build_id)
                && with_dwarf(&p)
            {
                return Some((p, "build-id"));
            }
        }
    }
    if let Some((name, crc)) = own.as_ref().and_then(|f| f.debuglink.clone()) {
        let Some(name) = debuglink_name(&name) else {
            log::warn!(
                "{}: ignoring debuglink {:?} (not a plain file name)",
                path.display(),
                String::from_utf8_lossy(&name)
            );
            return own.map(|_| (path.to_path_buf(), "symbols"));
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        let mut candidates = vec![dir.join(&name), dir.join(".debug").join(&name)];
        if let Ok(rel) = dir.strip_prefix("/") {
            candidates.push(Path::new("/usr/lib/debug").join(rel).join(&name));
        }
        candidates.extend(dirs.iter().map(|d| d.join(&name)));
        for c in candidates {
            if c != path
                && map_regular(&c)
                    .is_some_and(|m| crc32(&m) == crc && facts_of(&m).is_some_and(|f| f.dwarf))
            {
                return Some((c, "debuglink"));
            }
        }
    }
    own.map(|_| (path.to_path_buf(), "symbols"))
}

/// CRC-32 (IEEE) as `.gnu_debuglink` uses it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (!(crc & 1)).wrapping_add(1));
        }
    }
    !crc
}

/// Keep the debug information of a traced binary in the cache, under its build-id
/// (what `tracer record` does at the end of a session): the binary itself when it has
/// DWARF, else the debug file found for it. Nothing to do when already cached.
pub fn cache_debug_info(path: &Path, build_id: &[u8], dirs: &[PathBuf]) -> Result<()> {
    let Some(cache) = cache_dir() else {
        return Ok(());
    };
    let Some(dest) = build_id_path(&cache, build_id) else {
        return Ok(());
    };
    if dest.exists() {
        return Ok(());
    }
    let Some((src, how)) = locate(path, build_id, None, dirs) else {
        return Ok(());
    };
    if how == "symbols" {
        return Ok(());
    }
    let parent = dest.parent().context("cache path has no parent")?;
    if !safe_cache_dir(&cache, parent)? {
        return Ok(());
    }
    // The bytes written are the bytes checked: the build-id again, on this mapping.
    let data = map_regular(&src).with_context(|| format!("cannot read {}", src.display()))?;
    if facts_of(&data).and_then(|f| f.build_id).as_deref() != Some(build_id) {
        return Ok(()); // changed since located
    }
    let tmp = crate::tracefile::temporary_for(&dest)?;
    let written = (|| {
        use std::os::unix::fs::OpenOptionsExt;
        // A new file (never through a link planted at the name), readable by all: the
        // debug information of a binary that was readable.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        std::io::Write::write_all(&mut f, &data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &dest)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", dest.display()));
    }
    Ok(())
}

/// Make `dir` (inside `cache`) and check that nobody else could have steered it: the
/// cache must be ours (as root, a cache under another user's home is skipped: `sudo -E`
/// keeps `HOME`), and no directory on the way may be a symbolic link.
fn safe_cache_dir(cache: &Path, dir: &Path) -> Result<bool> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let mut existing = cache;
    while !existing.exists() {
        match existing.parent() {
            Some(p) => existing = p,
            None => break,
        }
    }
    if let Ok(m) = std::fs::metadata(existing)
        && m.uid() != euid
    {
        log::info!(
            "not caching debug information in {}: owned by uid {}, not {euid}",
            existing.display(),
            m.uid()
        );
        return Ok(false);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mut d = dir;
    while d.starts_with(cache) {
        let m = std::fs::symlink_metadata(d)?;
        if m.file_type().is_symlink() || m.uid() != euid {
            log::warn!(
                "not caching debug information: {} is a link or not ours",
                d.display()
            );
            return Ok(false);
        }
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn debuglink_names_are_plain_file_names() {
        assert_eq!(debuglink_name(b"x.debug"), Some(PathBuf::from("x.debug")));
        for bad in [&b"/dev/zero"[..], b"../x.debug", b"a/b.debug", b"..", b"."] {
            assert_eq!(
                debuglink_name(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn symbols_cover_their_size_only() {
        let l = Layout {
            functions: vec![
                (0x10, 0x20, "f".into()),
                (0x30, 0x30, "marker".into()),
                (0x40, 0x80, "g".into()),
                (0x40, 0x44, "g_alias".into()),
            ],
            ..Layout::default()
        };
        assert_eq!(l.function_at(0x18), Some("f"));
        assert_eq!(l.function_at(0x20), None, "past f's end");
        assert_eq!(l.function_at(0x30), Some("marker"));
        assert_eq!(l.function_at(0x31), None);
        assert_eq!(l.function_at(0x50), Some("g"));
        assert_eq!(l.function_at(0x8), None);
    }

    #[test]
    fn build_id_paths() {
        assert_eq!(
            build_id_path(Path::new("/d"), &[0xab, 0xcd, 0xef]).unwrap(),
            PathBuf::from("/d/.build-id/ab/cdef.debug")
        );
        assert!(build_id_path(Path::new("/d"), &[]).is_none());
    }

    #[test]
    fn demangles_cpp_and_rust() {
        assert_eq!(demangle("_ZN2ns6Widget4stepEi"), "ns::Widget::step(int)");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("main"), "main");
    }
}
