//! Support for running real (distribution) programs: same-behaviour checks, the
//! program interpreter and loader list, mapped files, oracle entry counts.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::command::{Out, RUN_TIMEOUT, run};
use crate::oracle;

/// Panic unless two runs behaved the same: exit status, stdout and stderr, byte for byte.
/// The message names the first differing byte, with the line around it.
pub fn assert_same_behaviour(what: &str, got: &Out, want: &Out) {
    fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
        let n = a.len().min(b.len());
        (0..n)
            .find(|&i| a[i] != b[i])
            .or((a.len() != b.len()).then_some(n))
    }
    fn line_at(s: &[u8], i: usize) -> String {
        let i = i.min(s.len());
        let lo = s[..i]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |p| p + 1);
        let hi = s[i..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(s.len(), |p| i + p);
        String::from_utf8_lossy(&s[lo..hi.min(lo + 300)]).into_owned()
    }
    let mut problems = Vec::new();
    if got.status() != want.status() {
        problems.push(format!(
            "exit status {} instead of {}",
            got.status(),
            want.status()
        ));
    }
    for (name, g, w) in [
        ("stdout", &got.stdout, &want.stdout),
        ("stderr", &got.stderr, &want.stderr),
    ] {
        if let Some(i) = first_diff(g, w) {
            problems.push(format!(
                "{name} differs at byte {i} (lengths {} and {}):\n    got:  {:?}\n    want: {:?}",
                g.len(),
                w.len(),
                line_at(g, i),
                line_at(w, i)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{what}: not the same behaviour as the original:\n  {}\n  run: {}\n  original: {}",
        problems.join("\n  "),
        got.describe(),
        want.describe()
    );
}

/// A `tracer record` run's output as the traced command's own: stderr without the
/// tracer's `utrace: ...` lines.
pub fn without_tracer_lines(out: &Out) -> Out {
    let mut o = out.clone();
    o.stderr = out
        .stderr
        .split_inclusive(|&c| c == b'\n')
        .filter(|l| !l.starts_with(b"utrace: "))
        .flatten()
        .copied()
        .collect();
    o
}

/// The program interpreter (PT_INTERP) of a dynamically linked ELF program.
pub fn interpreter(prog: &Path) -> Option<PathBuf> {
    let data = std::fs::read(prog).ok()?;
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    use object::read::elf::ProgramHeader;
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .find(|p| p.p_type(endian) == object::elf::PT_INTERP)
        .and_then(|p| p.data(endian, &*data).ok())
        .map(|d| {
            let d = d.split(|&c| c == 0).next().unwrap_or(d);
            PathBuf::from(String::from_utf8_lossy(d).into_owned())
        })
}

/// What the dynamic loader maps for `prog` with the extra environment `env`
/// (`ld.so --list PROG`): (name as needed, resolved path) per library found.
pub fn loader_list(prog: &Path, env: &[(&str, &OsStr)]) -> Vec<(String, PathBuf)> {
    let ld = interpreter(prog)
        .unwrap_or_else(|| panic!("{} has no program interpreter", prog.display()));
    let mut c = Command::new(ld);
    c.arg("--list").arg(prog);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(&mut c, RUN_TIMEOUT).ok();
    out.stdout_str()
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split(" (").next()?.trim();
            (!path.is_empty() && path != "not found")
                .then(|| (name.trim().to_string(), PathBuf::from(path)))
        })
        .collect()
}

/// The files mapped by a running process (`/proc/PID/maps`), each once.
pub fn mapped_files(pid: u32) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut v: Vec<PathBuf> = Vec::new();
    for l in maps.lines() {
        if let Some(p) = l.split_whitespace().nth(5).filter(|p| p.starts_with('/')) {
            let p = PathBuf::from(p);
            if !v.contains(&p) {
                v.push(p);
            }
        }
    }
    v
}

/// Entries per function of one run of `cmd`, counted by the oracle (kernel uprobes on
/// `probes`, functions of unmodified binaries); every probed function has an entry,
/// possibly 0.
pub fn oracle_counts(
    probes: &[(&Path, &str)],
    cmd: &mut Command,
    timeout: Duration,
) -> (Out, HashMap<String, u64>) {
    let (out, events) = oracle::run_with_probes(probes, cmd, timeout);
    let mut counts: HashMap<String, u64> = probes.iter().map(|p| (p.1.to_string(), 0)).collect();
    for e in &events {
        *counts.entry(e.symbol.clone()).or_default() += 1;
    }
    (out, counts)
}
