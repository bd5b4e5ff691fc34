//! Uprobe sites of kind memory and USDT record what inline stubs record: the eBPF
//! `site` program evaluates the operand descriptors the rewriter left in the metadata
//! (effective address and access flags of a memory site, every argument of a USDT
//! probe, arguments 3.. in `FLAG_USDT_MORE` records of the same chunk).
//!
//! Each fixture is rewritten twice with the same sites: inline, and with
//! `--force-uprobe` (every site a uprobe site). Both are traced through the kernel with
//! address-space randomisation off (`setarch -R`, inherited by the traced command), so
//! that the stack, TLS and load addresses are the same in both runs: the sequences of
//! (site, flags, value, aux) must be equal but for FLAG_UPROBE / FLAG_KTIME (and the
//! times). The uprobe traces also pass the same checks against the fixtures' output as
//! the inline ones (tests/tests/blocks.rs, tests/tests/usdt_sites.rs).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use tests::site_checks::{
    MEMTRACE_FUNCTIONS, check_memtrace, check_usdt_events, printed_addresses, usdt_events,
};
use tests::*;
use tracer_common::meta::SiteKind;

/// Rewrite `input` into `output` with `extra` options; its metadata.
fn rewrite_with(input: &Path, output: &Path, extra: &[&str]) -> Metadata {
    std::fs::create_dir_all(output.parent().unwrap()).unwrap();
    let mut args: Vec<&OsStr> = vec![input.as_os_str(), "-o".as_ref(), output.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    rewriter(&args).ok();
    metadata(output)
}

/// `setarch -R tracer record -o TRACE -- PROG ARGS`: the traced command inherits the
/// personality, so its addresses are the same from run to run.
fn record_no_aslr(trace: &Path, prog: &Path, args: &[&str]) -> Out {
    let _g = tracing_lock();
    let mut c = Command::new("setarch");
    c.arg("-R")
        .arg(tracer_bin())
        .arg("record")
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(prog)
        .args(args);
    let out = run(&mut c, TRACE_TIMEOUT);
    assert!(
        trace.is_file(),
        "tracer record wrote no trace file {}: {}",
        trace.display(),
        out.describe()
    );
    out
}

/// A record as both kinds of site must write it: all but the time and the flags that
/// say how it was made.
fn essence(r: &Rec) -> (u32, u32, u64, u64) {
    (
        r.site,
        r.flags & !(FLAG_UPROBE | FLAG_KTIME),
        r.value,
        r.aux,
    )
}

/// One traced build: its metadata, output and records.
struct Run {
    meta: Metadata,
    out: Out,
    recs: Vec<Rec>,
}

/// Rewrite `orig` inline and with `--force-uprobe` (into directories of the same name
/// length, so that argv and the stack are the same size), trace both with `args`.
fn both(tmp: &TempDir, orig: &Path, extra: &[&str], args: &[&str], what: &str) -> (Run, Run) {
    let name = orig.file_name().unwrap();
    let mut runs = Vec::new();
    for dir in ["inline", "uprobe"] {
        let prog = tmp.join(dir).join(name);
        let mut opts = extra.to_vec();
        if dir == "uprobe" {
            opts.push("--force-uprobe");
        }
        let meta = rewrite_with(orig, &prog, &opts);
        let trace = tmp.join(dir).join("t.utrace");
        let out = record_no_aslr(&trace, &prog, args);
        assert_eq!(out.status(), 0, "{what} {dir}: {}", out.describe());
        let recs = dump(&trace);
        let rep = report(&trace);
        assert_eq!(rep.dropped, 0, "{what} {dir}: dropped records");
        assert_eq!(
            rep.raw["read_errors"].as_u64(),
            Some(0),
            "{what} {dir}: read errors"
        );
        check_report_matches_dump(&rep, &recs);
        runs.push(Run { meta, out, recs });
    }
    let uprobe = runs.pop().unwrap();
    let inline = runs.pop().unwrap();
    assert_eq!(
        inline.meta.sites.len(),
        uprobe.meta.sites.len(),
        "{what}: the same sites"
    );
    assert!(
        uprobe.meta.sites.iter().all(|s| s.mode == SiteMode::Uprobe),
        "{what}: --force-uprobe left inline sites"
    );
    // Every uprobe site is described (the fixtures only use describable operands).
    let described: Vec<u32> = uprobe.meta.operands.iter().map(|o| o.site).collect();
    let all: Vec<u32> = uprobe.meta.sites.iter().map(|s| s.id).collect();
    assert_eq!(described, all, "{what}: uprobe sites with operand sets");
    assert!(
        inline.meta.operands.len()
            == inline
                .meta
                .sites
                .iter()
                .filter(|s| s.mode == SiteMode::Uprobe)
                .count(),
        "{what}: operand sets of the inline build"
    );
    for r in &uprobe.recs {
        assert_eq!(
            r.flags & (FLAG_UPROBE | FLAG_KTIME),
            FLAG_UPROBE | FLAG_KTIME,
            "{what}: uprobe record {r:?}"
        );
    }
    assert_eq!(
        inline.out.stdout_str(),
        uprobe.out.stdout_str(),
        "{what}: outputs (with randomisation off, addresses included)"
    );
    (inline, uprobe)
}

/// Compare the two traces record by record (the inline build's uprobe sites, if any,
/// record the same too).
fn compare(inline: &Run, uprobe: &Run, what: &str) {
    let a: Vec<_> = inline.recs.iter().map(essence).collect();
    let b: Vec<_> = uprobe.recs.iter().map(essence).collect();
    assert_seq_eq(
        &b,
        &a,
        &format!("{what}: (site, flags, value, aux) of the force-uprobe trace vs the inline one"),
    );
}

fn memory_case(cc: &str, opt: &str) {
    let what = format!("uprobe memory sites x86-64 {cc} {opt}");
    let tmp = TempDir::new(&format!("upops-mem-{cc}{opt}"));
    let orig = tmp.join("memtrace");
    let mut flags = vec![opt];
    flags.extend(if cc == "clang" {
        &["-fno-vectorize", "-fno-slp-vectorize"][..]
    } else {
        &["-fno-tree-vectorize"][..]
    });
    compile(cc, &[fixture("memtrace.c")], &flags, &orig);
    let mut extra = vec!["--sites", "memory"];
    for f in MEMTRACE_FUNCTIONS {
        extra.extend(["--functions", f]);
    }
    let n = 100u64;
    let (inline, uprobe) = both(&tmp, &orig, &extra, &[&n.to_string()], &what);
    let want = run(Command::new(&orig).arg(n.to_string()), RUN_TIMEOUT).ok();
    let tail = |s: String| s.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(
        tail(uprobe.out.stdout_str()),
        tail(want.stdout_str()),
        "{what}: output"
    );
    let addr = printed_addresses(&uprobe.out.stdout_str());
    let recs: Vec<&Rec> = uprobe.recs.iter().collect();
    assert!(
        recs.iter()
            .all(|r| uprobe.meta.sites[r.site as usize].kind == SiteKind::Memory),
        "{what}: records of other sites"
    );
    // aux: the instruction's run-time address, as inline.
    let bias = recs[0].aux - uprobe.meta.sites[recs[0].site as usize].vaddr;
    for r in &recs {
        assert_eq!(
            r.aux - bias,
            uprobe.meta.sites[r.site as usize].vaddr,
            "{what}: pc of {r:?}"
        );
    }
    check_memtrace(&recs, &addr, n, &what);
    let inline_recs: Vec<&Rec> = inline.recs.iter().collect();
    check_memtrace(&inline_recs, &addr, n, &format!("{what} (inline build)"));
    compare(&inline, &uprobe, &what);
    eprintln!(
        "{what}: {} memory sites, {} records",
        uprobe.meta.sites.len(),
        recs.len()
    );
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

/// Probe counts of usdt.c (N1 N2 N3).
const COUNTS: [&str; 3] = ["4", "6", "5"];

fn usdt_case(cc: &str, opt: &str) {
    let what = format!("uprobe USDT sites x86-64 {cc} {opt}");
    let tmp = TempDir::new(&format!("upops-usdt-{cc}{opt}"));
    let orig = tmp.join("usdt");
    compile(cc, &[fixture("usdt.c")], &[opt], &orig);
    let (inline, uprobe) = both(&tmp, &orig, &["--sites", "usdt"], &COUNTS, &what);
    assert_eq!(uprobe.meta.sites.len(), 10, "{what}: probes");
    // The semaphore is raised for uprobe sites too: the guarded probe's code runs.
    let text = uprobe.out.stdout_str();
    let guarded = text.lines().filter(|l| l.starts_with("guarded ")).count();
    assert_eq!(guarded, 5, "{what}: the semaphore was not raised:\n{text}");
    let evs = usdt_events(&uprobe.recs, &uprobe.meta);
    assert!(evs.iter().all(|e| e.mode == SiteMode::Uprobe));
    check_usdt_events(&what, &evs, &text);
    let inline_evs = usdt_events(&inline.recs, &inline.meta);
    check_usdt_events(&format!("{what} (inline build)"), &inline_evs, &text);
    // Probes of more than two arguments: their records arrive together.
    let more = uprobe
        .recs
        .iter()
        .filter(|r| r.flags & tracer_common::FLAG_USDT_MORE != 0)
        .count();
    assert!(more > 0, "{what}: no argument records");
    compare(&inline, &uprobe, &what);
    eprintln!(
        "{what}: {} probes, {} events, {more} argument records",
        uprobe.meta.sites.len(),
        evs.len()
    );
}

#[test]
fn usdt_gcc_o0() {
    usdt_case("gcc", "-O0");
}

#[test]
fn usdt_gcc_o2() {
    usdt_case("gcc", "-O2");
}

#[test]
fn usdt_clang_o2() {
    usdt_case("clang", "-O2");
}
