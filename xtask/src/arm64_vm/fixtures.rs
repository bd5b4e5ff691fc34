//! `xtask/arm64-vm/fixture.c` built several ways and rewritten, with what each trace must
//! hold.
//!
//! Expected records are exact, except for the atomics program with block and memory sites:
//! its printed sums and its report's untraced sites (the exclusive sequences).

use std::path::Path;

use anyhow::Result;

use super::programs::{Elf, cross_gcc, src};
use super::{Expect, Loose, Program, Who};
use crate::util::{self, cmd};

/// fixture.c built as `(name, gcc flags, rewriter flags)`.
const FIXTURES: &[(&str, &[&str], &[&str])] = &[
    ("fx-static", &["-static"], &["--buffer-records", "16"]),
    (
        "fx-static-pac",
        &["-static", "-mbranch-protection=standard"],
        &["--buffer-records", "16"],
    ),
    ("fx-static-pie", &["-static-pie", "-fPIE"], &[]),
    ("fx-pie", &["-fPIE", "-pie"], &["--buffer-records", "64"]),
    (
        "fx-static-pac-uprobe",
        &["-static", "-mbranch-protection=standard"],
        &["--force-uprobe"],
    ),
];

/// Rewritten fixtures, or none when `rewriter` cannot rewrite AArch64 (yet).
pub(super) fn rewritten_fixtures(work: &Path) -> Result<Vec<Program>> {
    let mut out = Vec::new();
    for (name, cflags, rflags) in FIXTURES {
        let raw = work.join(format!("{name}.raw"));
        let traced = work.join(name);
        if !build(&raw, &traced, name, cflags, rflags)? {
            continue;
        }
        let elf = Elf::read(&raw)?;
        let uprobe = rflags.contains(&"--force-uprobe");
        let mut expect = main_thread(&elf, uprobe, 1, 13)?;
        for t in 1..=3u64 {
            expect.extend(worker(&elf, uprobe, t)?);
        }
        if *name == "fx-static" {
            // The main thread alone, exec to exit_group (see fixture.c).
            out.push(Program {
                name: format!("{name}-solo"),
                host_path: traced.clone(),
                binary: name.to_string(),
                args: vec!["solo".into()],
                exit_code: 0,
                expect: main_thread(&elf, uprobe, 2, 20)?,
                loose: None,
            });
        }
        out.push(Program {
            name: name.to_string(),
            host_path: traced,
            binary: name.to_string(),
            args: vec![],
            exit_code: 0,
            expect,
            loose: None,
        });
    }
    out.push(atomics(work)?);
    Ok(out)
}

/// Rounds of each of the 4 threads of tests/fixtures/atomics.c.
const ATOMICS_ROUNDS: u64 = 2000;

/// tests/fixtures/atomics.c with load/store-exclusive loops, every entry, exit, block
/// and memory access of its `at_*` functions traced through the kernel drain: no site
/// may sit inside an exclusive sequence (its stores or trap would clear the monitor and
/// the store-exclusive would fail forever), so the program must end with the right
/// sums. `at_add` starts with its load-exclusive: its entry runs after the sequence (a
/// uprobe there is one the kernel refuses).
fn atomics(work: &Path) -> Result<Program> {
    let raw = work.join("atomics.raw");
    let traced = work.join("atomics");
    let source = util::workspace_root().join("tests/fixtures/atomics.c");
    cross_gcc(&raw, &source, &["-march=armv8-a", "-mno-outline-atomics"])?;
    let o = util::output(
        cmd(util::release_dir().join("rewriter"))
            .arg(&raw)
            .arg("-o")
            .arg(&traced)
            .args(["--functions", "at_*", "--sites", "entry,exit,block,memory"])
            .arg("-v"),
    )?;
    print!("{}", String::from_utf8_lossy(&o.stdout));
    if !o.status.success() {
        anyhow::bail!(
            "rewriter on atomics.c: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let n = ATOMICS_ROUNDS;
    Ok(Program {
        name: "atomics".into(),
        host_path: traced,
        binary: "atomics".into(),
        args: vec![n.to_string()],
        exit_code: 0,
        expect: Vec::new(),
        loose: Some(Loose {
            prints: format!(
                "UTPROG atomics counter {} max {} locked {}",
                4 * n,
                4 * n - 1,
                8 * n
            ),
            // The store-exclusives' sites (and a block starting at one).
            reported: "untraced sites: ".into(),
        }),
    })
}

/// fixture.c cross-built into `raw` and rewritten into `traced`; false (said why) when
/// the rewriter cannot rewrite it.
fn build(raw: &Path, traced: &Path, name: &str, cflags: &[&str], rflags: &[&str]) -> Result<bool> {
    let rewriter = util::release_dir().join("rewriter");
    cross_gcc(raw, &src("fixture.c"), cflags)?;
    let o = util::output(
        cmd(&rewriter)
            .arg(raw)
            .arg("-o")
            .arg(traced)
            .args(["--functions", "fx_*", "--functions", "main"])
            .args(rflags),
    )?;
    print!("{}", String::from_utf8_lossy(&o.stdout));
    if !o.status.success() {
        println!(
            "arm64-vm: rewriter cannot rewrite {name} ({}), left out: {}",
            util::describe(o.status),
            String::from_utf8_lossy(&o.stderr).trim()
        );
        return Ok(false);
    }
    Ok(true)
}

/// Where calls from `sym` return to: its range, known only in a non-PIE executable
/// (link-time addresses).
fn range(elf: &Elf, sym: &str) -> Result<Option<(u64, u64)>> {
    if elf.is_pic()? {
        return Ok(None);
    }
    let (a, s, _) = elf.symbol(sym)?;
    Ok(Some((a, a + s)))
}

/// The main thread: `main(argc)`, then `calls` calls of fx_mid and fx_leaf (0..calls).
fn main_thread(elf: &Elf, uprobe: bool, argc: u64, calls: u64) -> Result<Vec<Expect>> {
    let mut expect = vec![Expect {
        who: Who::Main,
        symbol: "main",
        uprobe,
        values: vec![argc],
        aux: None,
    }];
    let vals: Vec<u64> = (0..calls).collect();
    for (sym, caller) in [("fx_mid", "main"), ("fx_leaf", "fx_mid")] {
        expect.push(Expect {
            who: Who::Main,
            symbol: sym,
            uprobe,
            values: vals.clone(),
            aux: range(elf, caller)?,
        });
    }
    Ok(expect)
}

/// Worker thread `t`: `fx_worker(t)`, then 50t + 7 calls of fx_mid and fx_leaf.
fn worker(elf: &Elf, uprobe: bool, t: u64) -> Result<Vec<Expect>> {
    let vals: Vec<u64> = (0..50 * t + 7).map(|i| t << 20 | i).collect();
    let mut expect = vec![Expect {
        who: Who::Thread(t as u32),
        symbol: "fx_worker",
        uprobe,
        values: vec![t],
        aux: None,
    }];
    for (sym, caller) in [("fx_mid", "fx_worker"), ("fx_leaf", "fx_mid")] {
        expect.push(Expect {
            who: Who::Thread(t as u32),
            symbol: sym,
            uprobe,
            values: vals.clone(),
            aux: range(elf, caller)?,
        });
    }
    Ok(expect)
}
