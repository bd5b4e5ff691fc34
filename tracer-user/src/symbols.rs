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
}

/// Resolves code addresses of the binaries of one trace.
pub struct Symbolizer {
    dirs: Vec<PathBuf>,
    cache: Option<PathBuf>,
    binaries: HashMap<u64, Option<Rc<Loaded>>>,
    /// Where each binary (by binary id) is and which build-id it was recorded with.
    known: HashMap<u64, (PathBuf, Vec<u8>)>,
    memo: HashMap<(u64, u64), Rc<[Frame]>>,
    layouts: HashMap<u64, Layout>,
}

#[derive(Default)]
struct Layout {
    fixed: bool,
    code: Vec<(u64, u64)>,
}

fn read_layout(path: &Path) -> Option<Layout> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let data = std::fs::read(path).ok()?;
    let h = object::elf::FileHeader64::<object::Endianness>::parse(&*data).ok()?;
    let e = h.endian().ok()?;
    let code = h
        .program_headers(e, &*data)
        .ok()?
        .iter()
        .filter(|p| p.p_type(e) == object::elf::PT_LOAD && p.p_flags(e) & object::elf::PF_X != 0)
        .map(|p| (p.p_vaddr(e), p.p_vaddr(e) + p.p_memsz(e)))
        .collect();
    Some(Layout {
        fixed: h.e_type(e) == object::elf::ET_EXEC,
        code,
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
            layouts: HashMap::new(),
        }
    }

    pub fn add_binary(&mut self, binary_id: u64, path: &str, build_id: &[u8]) {
        self.known
            .insert(binary_id, (PathBuf::from(path), build_id.to_vec()));
    }

    /// Whether `binary_id` loads at its link-time addresses (ELF `ET_EXEC`: bias 0),
    /// and the file addresses of its code (executable `PT_LOAD`s).
    fn layout(&mut self, binary_id: u64) -> &Layout {
        if !self.layouts.contains_key(&binary_id) {
            let l = self
                .known
                .get(&binary_id)
                .and_then(|(path, _)| read_layout(path))
                .unwrap_or_default();
            self.layouts.insert(binary_id, l);
        }
        &self.layouts[&binary_id]
    }

    pub fn fixed_address(&mut self, binary_id: u64) -> bool {
        self.layout(binary_id).fixed
    }

    /// Whether file address `vaddr` is in `binary_id`'s code.
    pub fn is_code(&mut self, binary_id: u64, vaddr: u64) -> bool {
        self.layout(binary_id)
            .code
            .iter()
            .any(|&(lo, hi)| (lo..hi).contains(&vaddr))
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
            Some(l) => resolve(&l.loader, vaddr).into(),
            None => Rc::from([]),
        };
        self.memo.insert((binary_id, vaddr), frames.clone());
        frames
    }
}

fn resolve(loader: &addr2line::Loader, vaddr: u64) -> Vec<Frame> {
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
    // No DWARF function (or no DWARF): the symbol table names the function.
    if (out.is_empty() || out.iter().all(|f| f.function.is_empty()))
        && let Some(name) = loader.find_symbol(vaddr)
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

fn facts(path: &Path) -> Option<FileFacts> {
    let data = std::fs::read(path).ok()?;
    let obj = object::File::parse(&*data).ok()?;
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

/// The file to read `path`'s debug information from, and how it was found.
fn locate(
    path: &Path,
    build_id: &[u8],
    cache: Option<&Path>,
    dirs: &[PathBuf],
) -> Option<(PathBuf, &'static str)> {
    let same_build = |f: &FileFacts| build_id.is_empty() || f.build_id.as_deref() == Some(build_id);
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
        let name =
            PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name));
        let dir = path.parent().unwrap_or(Path::new("/"));
        let mut candidates = vec![dir.join(&name), dir.join(".debug").join(&name)];
        if let Ok(rel) = dir.strip_prefix("/") {
            candidates.push(Path::new("/usr/lib/debug").join(rel).join(&name));
        }
        candidates.extend(dirs.iter().map(|d| d.join(&name)));
        for c in candidates {
            if c != path
                && std::fs::read(&c).is_ok_and(|d| crc32(&d) == crc)
                && facts(&c).is_some_and(|f| f.dwarf)
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
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let tmp = crate::tracefile::temporary_for(&dest)?;
    // A copy, not a hard link: a binary rewritten in place must not change the cache.
    std::fs::copy(&src, &tmp)
        .with_context(|| format!("cannot copy {} to {}", src.display(), tmp.display()))?;
    std::fs::rename(&tmp, &dest).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot rename {} to {}", tmp.display(), dest.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
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
