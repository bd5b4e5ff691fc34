//! The rewriter: run it, check its summary line against the metadata note it wrote,
//! and read the function symbols of ELF files.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use tracer_common::meta::{META_SECTION, Metadata, SiteMode};

use crate::command::{Out, RUN_TIMEOUT, run};
use crate::paths::rewriter_bin;

/// `N sites: I inline, U uprobe` from the rewriter's stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteCounts {
    pub total: u64,
    pub inline: u64,
    pub uprobe: u64,
    /// `, N untraced` (a stub or trap there would break the program); 0 when absent.
    pub untraced: u64,
}

pub fn parse_site_counts(stdout: &str) -> Option<SiteCounts> {
    for line in stdout.lines() {
        let Some(i) = line.find(" sites: ") else {
            continue;
        };
        let total = line[..i].split_whitespace().last()?.parse().ok()?;
        let rest = &line[i + " sites: ".len()..];
        let mut nums = rest
            .split(',')
            .map(|p| p.split_whitespace().collect::<Vec<_>>());
        let a = nums.next()?;
        let b = nums.next()?;
        if a.get(1) != Some(&"inline")
            || b.get(1)
                .map(|s| s.trim_end_matches(|c: char| !c.is_alphanumeric()))
                != Some("uprobe")
        {
            continue;
        }
        let untraced = match nums.next() {
            Some(c)
                if c.get(1)
                    .map(|s| s.trim_end_matches(|c: char| !c.is_alphanumeric()))
                    == Some("untraced") =>
            {
                c[0].parse().ok()?
            }
            _ => 0,
        };
        return Some(SiteCounts {
            total,
            inline: a[0].parse().ok()?,
            uprobe: b[0].parse().ok()?,
            untraced,
        });
    }
    None
}

/// Run the rewriter with raw arguments.
pub fn rewriter(args: &[&OsStr]) -> Out {
    let mut c = Command::new(rewriter_bin());
    c.args(args);
    run(&mut c, RUN_TIMEOUT)
}

/// Rewrite `input` into `output` (None: the default `INPUT.traced`, which is returned),
/// restricted to `functions` globs if any. Asserts success, the site-count line, that the
/// input file is unchanged and that the output has a metadata note agreeing with the line.
pub fn rewrite(
    input: &Path,
    output: Option<&Path>,
    functions: &[&str],
) -> (PathBuf, SiteCounts, Metadata) {
    let before = std::fs::read(input).unwrap();
    let mut args: Vec<&OsStr> = vec![input.as_os_str()];
    if let Some(o) = output {
        args.push("-o".as_ref());
        args.push(o.as_os_str());
    }
    for f in functions {
        args.push("--functions".as_ref());
        args.push(f.as_ref());
    }
    let out = rewriter(&args).ok();
    let path = match output {
        Some(o) => o.to_path_buf(),
        None => {
            let mut s = input.as_os_str().to_owned();
            s.push(".traced");
            PathBuf::from(s)
        }
    };
    assert!(
        path.is_file(),
        "the rewriter did not write {}: {}",
        path.display(),
        out.describe()
    );
    assert_eq!(
        std::fs::read(input).unwrap(),
        before,
        "the rewriter modified its input {}",
        input.display()
    );
    let counts = parse_site_counts(&out.stdout_str())
        .unwrap_or_else(|| panic!("no `N sites: I inline, U uprobe` line: {}", out.describe()));
    assert_eq!(
        counts.total,
        counts.inline + counts.uprobe + counts.untraced,
        "site counts: {counts:?}"
    );
    let meta = metadata(&path);
    let n_inline = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Inline)
        .count() as u64;
    let n_uprobe = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Uprobe)
        .count() as u64;
    let n_untraced = meta.sites.len() as u64 - n_inline - n_uprobe;
    assert_eq!(
        (meta.sites.len() as u64, n_inline, n_uprobe, n_untraced),
        (counts.total, counts.inline, counts.uprobe, counts.untraced),
        "the site table in {META_SECTION} of {} disagrees with the rewriter's summary line",
        path.display()
    );
    let mut ids: Vec<u32> = meta.sites.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        meta.sites.len(),
        "duplicate site ids in {}",
        path.display()
    );
    (path, counts, meta)
}

/// The metadata note of a rewritten binary.
pub fn metadata(path: &Path) -> Metadata {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data)
        .unwrap_or_else(|e| panic!("{} is not a readable ELF file: {e}", path.display()));
    let sec = file
        .section_by_name(META_SECTION)
        .unwrap_or_else(|| panic!("{} has no {META_SECTION} section", path.display()));
    let bytes = sec.data().unwrap();
    Metadata::from_note_section(bytes)
        .unwrap_or_else(|| panic!("no utrace note in {META_SECTION} of {}", path.display()))
        .unwrap_or_else(|e| panic!("bad utrace note in {}: {e}", path.display()))
}

/// A defined function symbol of an ELF file.
#[derive(Debug, Clone)]
pub struct FuncSym {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    /// File offset of the first byte.
    pub file_off: Option<u64>,
}

/// The defined function symbols (.symtab, else .dynsym) of an ELF file.
pub fn function_symbols(path: &Path) -> Vec<FuncSym> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let segs: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| (s.address(), s.file_range().0, s.file_range().1))
        .collect();
    let to_off = |addr: u64| {
        segs.iter()
            .find(|(va, _, sz)| addr >= *va && addr < va + sz)
            .map(|(va, off, _)| addr - va + off)
    };
    let mut syms: Vec<FuncSym> = Vec::new();
    let mut push = |s: object::Symbol<'_, '_>| {
        if s.kind() == SymbolKind::Text
            && s.is_definition()
            && s.address() != 0
            && let Ok(name) = s.name()
        {
            syms.push(FuncSym {
                name: name.to_string(),
                addr: s.address(),
                size: s.size(),
                file_off: to_off(s.address()),
            });
        }
    };
    if file.symbols().next().is_some() {
        file.symbols().for_each(&mut push);
    } else {
        file.dynamic_symbols().for_each(&mut push);
    }
    syms
}

/// The file offset of the link-time address `vaddr` of `path`, through the segment
/// that holds it.
pub fn file_offset(path: &Path, vaddr: u64) -> Option<u64> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.segments().find_map(|s| {
        let (off, size) = s.file_range();
        (vaddr >= s.address() && vaddr < s.address() + size).then(|| vaddr - s.address() + off)
    })
}

pub fn function_symbol(path: &Path, name: &str) -> FuncSym {
    function_symbols(path)
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no function symbol {name} in {}", path.display()))
}

/// tests/fixtures/diff_runs.c built with gcc -O2 into `dir` and rewritten with entry
/// and exit sites of fa, fb, fc and main: (original, rewritten, its metadata).
pub fn diff_runs_traced(dir: &Path) -> (PathBuf, PathBuf, Metadata) {
    let (orig, traced) = (dir.join("diff_runs"), dir.join("diff_runs.traced"));
    crate::compile::compile(
        "gcc",
        &[crate::paths::fixture("diff_runs.c")],
        &["-O2"],
        &orig,
    );
    let mut args: Vec<&OsStr> = vec![orig.as_os_str(), "-o".as_ref(), traced.as_os_str()];
    for f in ["fa", "fb", "fc", "main"] {
        args.extend([OsStr::new("--functions"), OsStr::new(f)]);
    }
    args.extend(["--sites", "entry,exit"].map(OsStr::new));
    rewriter(&args).ok();
    let meta = metadata(&traced);
    (orig, traced, meta)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn site_counts_line() {
        let s = "wrote out.traced\n1154 sites: 1120 inline, 34 uprobe\n";
        assert_eq!(
            parse_site_counts(s),
            Some(SiteCounts {
                total: 1154,
                inline: 1120,
                uprobe: 34,
                untraced: 0
            })
        );
        assert_eq!(
            parse_site_counts("rewriter: 2 sites: 1 inline, 1 uprobe (0.1 s)"),
            Some(SiteCounts {
                total: 2,
                inline: 1,
                uprobe: 1,
                untraced: 0
            })
        );
        assert_eq!(
            parse_site_counts("  block  12 sites: 9 inline (75.00%), 1 uprobe, 2 untraced"),
            Some(SiteCounts {
                total: 12,
                inline: 9,
                uprobe: 1,
                untraced: 2
            })
        );
        assert_eq!(parse_site_counts("no sites here"), None);
    }
}
