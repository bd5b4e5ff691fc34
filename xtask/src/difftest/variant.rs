//! A program's builds: compiler × optimisation level, each with a link mode and a
//! time mode chosen from the seed (so every combination comes up across seeds).
//!
//! The program's functions (what the oracle and the checks count per function) come from
//! its object file.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

use crate::util::{self, cmd};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    Aarch64,
}

impl Arch {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// How to run one of its programs on this host.
    pub(crate) fn runner(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &[],
            Arch::Aarch64 => &["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"],
        }
    }
}

/// The language of a program: csmith's C, or the C++ of `cxx.rs` (which throws).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Lang {
    C,
    Cxx,
}

impl Lang {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Lang::C => "c",
            Lang::Cxx => "cxx",
        }
    }

    /// The source file of program `seed`.
    pub(crate) fn source(self, seed: u64) -> String {
        match self {
            Lang::C => format!("s{seed}.c"),
            Lang::Cxx => format!("x{seed}.cpp"),
        }
    }
}

const COMPILERS: [&str; 2] = ["gcc", "clang"];
const OPTS: [&str; 3] = ["-O0", "-O2", "-O3"];
const LINKS: [&str; 4] = ["pie", "no-pie", "static", "static-pie"];
/// The rewriter's `--time` modes.
const TIMES: [&str; 3] = ["record", "block", "coarse"];

#[derive(Clone, Debug)]
pub(super) struct Variant {
    pub arch: Arch,
    pub lang: Lang,
    pub seed: u64,
    pub cc: &'static str,
    pub opt: &'static str,
    pub link: &'static str,
    pub time: &'static str,
}

impl Variant {
    /// The six builds of program `seed`.
    pub(super) fn all(arch: Arch, lang: Lang, seed: u64) -> Vec<Variant> {
        let mut v = Vec::new();
        for (i, cc) in COMPILERS.into_iter().enumerate() {
            for (j, opt) in OPTS.into_iter().enumerate() {
                let k = (i * OPTS.len() + j) as u64;
                v.push(Variant {
                    arch,
                    lang,
                    seed,
                    cc,
                    opt,
                    link: LINKS[((seed + k) % LINKS.len() as u64) as usize],
                    time: TIMES[((seed / 4 + k) % TIMES.len() as u64) as usize],
                });
            }
        }
        v
    }

    /// A file name: `s17-x86_64-gcc-O2-pie-record` (C++: `x17-…`).
    pub(super) fn name(&self) -> String {
        format!(
            "{}{}-{}-{}{}-{}-{}",
            match self.lang {
                Lang::C => "s",
                Lang::Cxx => "x",
            },
            self.seed,
            self.arch.name(),
            self.cc,
            self.opt,
            self.link,
            self.time
        )
    }

    fn compiler(&self) -> Vec<&'static str> {
        match (self.arch, self.lang, self.cc) {
            (Arch::X86_64, Lang::C, cc) => vec![cc],
            (Arch::X86_64, Lang::Cxx, "gcc") => vec!["g++"],
            (Arch::X86_64, Lang::Cxx, _) => vec!["clang++"],
            (Arch::Aarch64, Lang::C, "gcc") => vec!["aarch64-linux-gnu-gcc"],
            (Arch::Aarch64, Lang::Cxx, "gcc") => vec!["aarch64-linux-gnu-g++"],
            (Arch::Aarch64, Lang::C, _) => vec!["clang", "--target=aarch64-linux-gnu"],
            (Arch::Aarch64, Lang::Cxx, _) => vec!["clang++", "--target=aarch64-linux-gnu"],
        }
    }

    fn flags(&self) -> (&'static [&'static str], &'static [&'static str]) {
        match self.link {
            "pie" => (&["-fPIE"], &["-pie"]),
            "no-pie" => (&["-fno-pie"], &["-no-pie"]),
            "static" => (&["-fno-pie"], &["-static", "-no-pie"]),
            _ => (&["-fPIE"], &["-static-pie"]),
        }
    }

    /// Compile `src` (object, then link) into `dir`; the program's own functions are
    /// those its object file defines.
    pub(super) fn build(&self, src: &Path, dir: &Path) -> Result<Build> {
        let exe = dir.join(self.name());
        let obj = exe.with_extension("o");
        let cc = self.compiler();
        let (compile, link) = self.flags();
        let mut c = cmd(cc[0]);
        c.args(&cc[1..])
            .args([self.opt, "-g", "-w", "-I/usr/include/csmith", "-c"])
            .args(compile)
            .arg(src)
            .arg("-o")
            .arg(&obj);
        util::output_ok(&mut c)?;
        let mut l = cmd(cc[0]);
        l.args(&cc[1..]).args(link).arg(&obj).arg("-o").arg(&exe);
        util::output_ok(&mut l)?;
        let functions = defined_functions(&obj)?;
        Ok(Build { exe, functions })
    }
}

/// A built variant: the executable and its program's function names.
pub(super) struct Build {
    pub exe: PathBuf,
    pub functions: Vec<String>,
}

/// Functions an object file defines in its code, with gcc's clones (`f.constprop.0`,
/// `f.isra.0`, `f.part.0`: a call of the program may run in one, and an exception may
/// land there) but not its `.cold` parts (parts of their functions).
fn defined_functions(obj: &Path) -> Result<Vec<String>> {
    let data = std::fs::read(obj)?;
    let file = object::File::parse(&*data)?;
    let mut names: Vec<String> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter(|s| {
            s.section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .is_some_and(|sec| sec.kind() == SectionKind::Text)
        })
        .filter_map(|s| s.name().ok().map(str::to_string))
        .filter(|n| !n.is_empty() && !n.split('.').any(|p| p == "cold"))
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        bail!("{} defines no function", obj.display());
    }
    Ok(names)
}

/// File offsets of `functions` in the linked `exe` (names defined more than once, or
/// not at all, are left out).
pub(super) fn function_offsets(exe: &Path, functions: &[String]) -> Result<Vec<(String, u64)>> {
    let data = std::fs::read(exe)?;
    let file = object::File::parse(&*data)?;
    let mut out = Vec::new();
    for f in functions {
        let mut hits = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.name() == Ok(f.as_str()));
        let (Some(sym), None) = (hits.next(), hits.next()) else {
            continue;
        };
        let Some(sec) = sym
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
        else {
            continue;
        };
        let Some((sec_off, _)) = sec.file_range() else {
            continue;
        };
        out.push((f.clone(), sym.address() - sec.address() + sec_off));
    }
    Ok(out)
}
