//! Basic-block and memory-access sites (`--sites block`, `--sites memory`).
//!
//! Blocks: every block of tests/fixtures/blocks.c (dense switches: jump tables) is
//! recorded exactly when it runs: the per-thread sequence of block sites equals the
//! sequence of an independent oracle (kernel uprobes via tracefs at the same block
//! addresses of the ORIGINAL binary). Memory: tests/fixtures/memtrace.c's loads and
//! stores of known arrays (sizes 1..16, read / write / read-modify-write, `%fs`
//! thread-local) are recorded with their exact effective addresses, sizes and flags,
//! and the report's memory section counts them as the dump shows them.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use tests::site_checks::{
    MEMTRACE_FUNCTIONS, check_memory_section, check_memtrace, printed_addresses,
};
use tests::*;
use tracer_common::meta::{Metadata, SiteKind};

fn rewrite_sites(input: &Path, output: &Path, extra: &[&str]) -> (String, Metadata) {
    let mut args: Vec<&OsStr> = vec![
        input.as_os_str(),
        "-o".as_ref(),
        output.as_os_str(),
        "-v".as_ref(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    let out = rewriter(&args).ok();
    (out.stdout_str(), metadata(output))
}

fn block_case(cc: &str, opt: &str, time: &str) {
    let what = format!("blocks x86-64 {cc} {opt} --time {time}");
    let tmp = TempDir::new(&format!("blocks-{cc}{opt}{time}"));
    let (orig, traced, trace) = (
        tmp.join("blocks"),
        tmp.join("blocks.traced"),
        tmp.join("t.utrace"),
    );
    compile(cc, &[fixture("blocks.c")], &[opt], &orig);
    // The fixture's own functions (each oracle probe costs ~0.1 s to set up and tear
    // down).
    let (line, meta) = rewrite_sites(
        &orig,
        &traced,
        &[
            "--sites",
            "block",
            "--time",
            time,
            "--functions",
            "sw_*",
            "mark",
            "run_switches",
            "main",
        ],
    );
    let blocks: Vec<_> = meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::Block)
        .collect();
    assert!(
        blocks.len() > 60,
        "{what}: only {} block sites\n{line}",
        blocks.len()
    );

    let n = "40";
    let want = run(Command::new(&orig).arg(n), RUN_TIMEOUT);
    assert!(
        want.stdout_str().starts_with("blocks n=40 "),
        "{what}: {}",
        want.describe()
    );
    assert_same_behaviour(
        &what,
        &run(Command::new(&traced).arg(n), RUN_TIMEOUT),
        &want,
    );

    // The oracle: a uprobe at every block of the original.
    let probes: Vec<(&Path, String, u64)> = blocks
        .iter()
        .map(|s| (orig.as_path(), s.id.to_string(), s.file_off))
        .collect();
    let (o, events) = oracle::run_with_probes_at(&probes, Command::new(&orig).arg(n), RUN_TIMEOUT);
    assert_same_behaviour(&format!("{what} (oracle run)"), &o, &want);

    let out = tracer_record(&trace, &traced, &[n], &[]);
    assert_same_behaviour(&what, &without_tracer_lines(&out), &want);
    let recs = dump(&trace);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped");
    check_report_matches_dump(&rep, &recs);
    let got: Vec<u32> = recs.iter().map(|r| r.site).collect();
    let expected: Vec<u32> = events.iter().map(|e| e.symbol.parse().unwrap()).collect();
    assert_seq_eq(&got, &expected, &format!("{what}: block sequence"));
    // Inline records carry the block's run-time address: the same offset from the
    // load base for every record of a site.
    let base = recs
        .iter()
        .find(|r| r.flags & tracer_common::FLAG_UPROBE == 0)
        .map(|r| r.value - meta.sites[r.site as usize].vaddr)
        .unwrap();
    for r in &recs {
        assert_eq!(
            r.value - base,
            meta.sites[r.site as usize].vaddr,
            "{what}: block address of {r:?}"
        );
    }
    let inline = blocks
        .iter()
        .filter(|s| s.mode == tracer_common::meta::SiteMode::Inline)
        .count();
    eprintln!(
        "{what}: {} block sites, {inline} inline, {} records",
        blocks.len(),
        recs.len()
    );
}

#[test]
fn blocks_gcc_o0() {
    block_case("gcc", "-O0", "record");
}

#[test]
fn blocks_gcc_o2() {
    block_case("gcc", "-O2", "record");
}

#[test]
fn blocks_clang_o2_coarse() {
    block_case("clang", "-O2", "coarse");
}

#[test]
fn blocks_gcc_o3_static() {
    block_case("gcc", "-O3", "record");
}

fn memory_case(cc: &str, opt: &str) {
    let what = format!("memory x86-64 {cc} {opt}");
    let tmp = TempDir::new(&format!("mem-{cc}{opt}"));
    let (orig, traced, trace) = (
        tmp.join("memtrace"),
        tmp.join("memtrace.traced"),
        tmp.join("t.utrace"),
    );
    let novec: &[&str] = if cc == "clang" {
        &["-fno-vectorize", "-fno-slp-vectorize"]
    } else {
        &["-fno-tree-vectorize"]
    };
    let mut flags = vec![opt];
    flags.extend(novec);
    compile(cc, &[fixture("memtrace.c")], &flags, &orig);
    let fns = MEMTRACE_FUNCTIONS;
    let mut extra = vec!["--sites", "memory"];
    for f in fns {
        extra.extend(["--functions", f]);
    }
    let (line, meta) = rewrite_sites(&orig, &traced, &extra);
    let mem: Vec<_> = meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::Memory)
        .collect();
    assert!(
        mem.iter()
            .all(|s| s.mode == tracer_common::meta::SiteMode::Inline),
        "{what}: memory sites left to uprobes:\n{line}"
    );
    let n = 100u64;
    let want = run(Command::new(&orig).arg(n.to_string()), RUN_TIMEOUT).ok();
    let got = run(Command::new(&traced).arg(n.to_string()), RUN_TIMEOUT);
    // Addresses differ between runs (ASLR): compare from the second line on.
    let tail = |o: &Out| {
        o.stdout_str()
            .lines()
            .skip(1)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(tail(&got), tail(&want), "{what}: output");
    assert_eq!(got.status(), want.status(), "{what}: status");

    let out = tracer_record(&trace, &traced, &[&n.to_string()], &[]);
    assert_eq!(tail(&out), tail(&want), "{what}: output under the tracer");
    let addr = printed_addresses(&out.stdout_str());
    let recs = dump(&trace);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped");
    let recs: Vec<&Rec> = recs.iter().collect();
    // Every record's aux is its instruction's run-time address.
    let bias = recs[0].aux - meta.sites[recs[0].site as usize].vaddr;
    for r in &recs {
        assert_eq!(
            r.aux - bias,
            meta.sites[r.site as usize].vaddr,
            "{what}: pc of {r:?}"
        );
    }
    check_memtrace(&recs, &addr, n, &what);
    // The report's memory section counts what the dump shows.
    let known = (opt == "-O2").then_some(n);
    check_memory_section(&report_json(&trace)["memory"], &recs, known, &what);
    eprintln!("{what}: {} memory sites, {} records", mem.len(), recs.len());
}

#[test]
fn memory_gcc_o0() {
    memory_case("gcc", "-O0");
}

#[test]
fn memory_gcc_o2() {
    memory_case("gcc", "-O2");
}

#[test]
fn memory_clang_o2() {
    memory_case("clang", "-O2");
}

const SYSROOT: &str = "/usr/aarch64-linux-gnu";
const A64_CC: &str = "aarch64-linux-gnu-gcc";

/// `tracer record --user --binary PROG -- qemu-aarch64 -L SYSROOT PROG ARGS`.
fn trace_a64(trace: &Path, prog: &Path, args: &[&str]) -> (Out, Vec<Rec>) {
    let out = tracer_record_qemu(trace, prog, args);
    let recs = dump(trace);
    assert_eq!(report(trace).dropped, 0, "dropped: {}", out.describe());
    (out, recs)
}

/// AArch64 blocks under qemu-user: the sequence of block records equals the sequence in
/// which qemu executes the blocks' first instructions (`-singlestep -d exec,nochain`
/// logs every instruction executed: an oracle independent of the rewriter).
fn a64_block_case(opt: &str) {
    let what = format!("blocks AArch64 gcc {opt}");
    if !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("blocks-a64{opt}"));
    let (orig, traced, trace, log) = (
        tmp.join("blocks"),
        tmp.join("blocks.traced"),
        tmp.join("t.utrace"),
        tmp.join("exec.log"),
    );
    // Fixed addresses, so that the log's pcs are link-time addresses.
    compile(
        A64_CC,
        &[fixture("blocks.c")],
        &[opt, "-no-pie", "-mbranch-protection=standard"],
        &orig,
    );
    let (line, meta) = rewrite_sites(
        &orig,
        &traced,
        &[
            "--sites",
            "block",
            "--functions",
            "sw_*",
            "mark",
            "run_switches",
            "main",
        ],
    );
    let blocks: HashMap<u64, u32> = meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::Block)
        .map(|s| (s.vaddr, s.id))
        .collect();
    assert!(
        blocks.len() > 60,
        "{what}: only {} block sites\n{line}",
        blocks.len()
    );
    let n = "12";
    let mut q = Command::new("qemu-aarch64");
    q.args(["-L", SYSROOT, "-singlestep", "-d", "exec,nochain", "-D"])
        .arg(&log)
        .arg(&orig)
        .arg(n);
    let want = run(&mut q, RUN_TIMEOUT).ok();
    assert!(
        want.stdout_str().starts_with("blocks n=12 "),
        "{what}: {}",
        want.describe()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let expected: Vec<u32> = text
        .lines()
        .filter_map(|l| {
            let pc = l.split('[').nth(1)?.split('/').nth(1)?;
            blocks.get(&u64::from_str_radix(pc, 16).ok()?).copied()
        })
        .collect();
    let (out, recs) = trace_a64(&trace, &traced, &[n]);
    assert_same_behaviour(&what, &without_tracer_lines(&out), &want);
    let got: Vec<u32> = recs.iter().map(|r| r.site).collect();
    assert_seq_eq(&got, &expected, &format!("{what}: block sequence"));
    for r in &recs {
        assert_eq!(
            r.value, meta.sites[r.site as usize].vaddr,
            "{what}: block address of {r:?}"
        );
    }
}

#[test]
fn blocks_aarch64_o0() {
    a64_block_case("-O0");
}

#[test]
fn blocks_aarch64_o2() {
    a64_block_case("-O2");
}

fn a64_memory_case(opt: &str) {
    let what = format!("memory AArch64 gcc {opt}");
    if !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("mem-a64{opt}"));
    let (orig, traced, trace) = (
        tmp.join("memtrace"),
        tmp.join("memtrace.traced"),
        tmp.join("t.utrace"),
    );
    compile(
        A64_CC,
        &[fixture("memtrace.c")],
        &[opt, "-fno-tree-vectorize"],
        &orig,
    );
    let mut extra = vec!["--sites", "memory"];
    for f in MEMTRACE_FUNCTIONS {
        extra.extend(["--functions", f]);
    }
    let (line, meta) = rewrite_sites(&orig, &traced, &extra);
    assert!(
        meta.sites
            .iter()
            .all(|s| s.mode == tracer_common::meta::SiteMode::Inline),
        "{what}: memory sites left to uprobes:\n{line}"
    );
    let n = 100u64;
    let (out, recs) = trace_a64(&trace, &traced, &[&n.to_string()]);
    let addr = printed_addresses(&out.stdout_str());
    let recs: Vec<&Rec> = recs.iter().collect();
    let bias = recs[0].aux - meta.sites[recs[0].site as usize].vaddr;
    for r in &recs {
        assert_eq!(
            r.aux - bias,
            meta.sites[r.site as usize].vaddr,
            "{what}: pc of {r:?}"
        );
    }
    check_memtrace(&recs, &addr, n, &what);
}

#[test]
fn memory_aarch64_o0() {
    a64_memory_case("-O0");
}

#[test]
fn memory_aarch64_o2() {
    a64_memory_case("-O2");
}

/// Every kind at once on memtrace.c: stubs at one instruction share one reservation
/// (an entry, its first block, a memory access). Memory records as when traced alone;
/// one entry, one exit and one first-block record per call, in that order.
fn all_kinds_case(a64: bool, opt: &str, time: &str) {
    let what = format!(
        "all kinds {} {opt} --time {time}",
        if a64 { "AArch64" } else { "x86-64" }
    );
    if a64 && !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("allkinds-{a64}{opt}"));
    let (orig, traced, trace) = (
        tmp.join("memtrace"),
        tmp.join("memtrace.traced"),
        tmp.join("t.utrace"),
    );
    let cc = if a64 { A64_CC } else { "gcc" };
    compile(
        cc,
        &[fixture("memtrace.c")],
        &[opt, "-fno-tree-vectorize"],
        &orig,
    );
    let fns = MEMTRACE_FUNCTIONS;
    let mut extra = vec!["--sites", "entry,exit,block,memory", "--time", time];
    for f in fns {
        extra.extend(["--functions", f]);
    }
    let (_, meta) = rewrite_sites(&orig, &traced, &extra);
    let n = 100u64;
    let (out, recs) = if a64 {
        trace_a64(&trace, &traced, &[&n.to_string()])
    } else {
        let out = tracer_record(&trace, &traced, &[&n.to_string()], &[]);
        (out, dump(&trace))
    };
    let addr = printed_addresses(&out.stdout_str());
    let kind = |r: &Rec| meta.sites[r.site as usize].kind;
    let mem: Vec<&Rec> = recs
        .iter()
        .filter(|r| kind(r) == SiteKind::Memory)
        .collect();
    check_memtrace(&mem, &addr, n, &what);
    for f in fns {
        let mine: Vec<&Rec> = recs.iter().filter(|r| &*r.symbol == f).collect();
        let count = |k: SiteKind| mine.iter().filter(|r| kind(r) == k).count();
        assert_eq!(count(SiteKind::FunctionEntry), 1, "{what}: {f} entries");
        assert_eq!(count(SiteKind::FunctionExit), 1, "{what}: {f} exits");
        assert_eq!(
            kind(mine[0]),
            SiteKind::FunctionEntry,
            "{what}: {f} starts with its entry"
        );
        assert_eq!(
            kind(mine[1]),
            SiteKind::Block,
            "{what}: {f}: its first block next"
        );
        assert_eq!(
            kind(mine.last().unwrap()),
            SiteKind::FunctionExit,
            "{what}: {f} ends with its exit"
        );
    }
}

#[test]
fn all_kinds_x86_o2() {
    all_kinds_case(false, "-O2", "coarse");
}

#[test]
fn all_kinds_x86_o0_block_time() {
    all_kinds_case(false, "-O0", "block");
}

#[test]
fn all_kinds_x86_o2_record_time() {
    all_kinds_case(false, "-O2", "record");
}

#[test]
fn all_kinds_aarch64_o2() {
    all_kinds_case(true, "-O2", "block");
}
