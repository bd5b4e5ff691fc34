//! Calls left by unwinding end where control lands (issue 30). An exception's landing
//! pad (a catch or a cleanup, from the LSDA), a call to `_Unwind_Resume` and the return
//! of a `setjmp` call are sites planned with the exits; a landing ends every call above
//! the frame it landed in, found among a recursive function's open calls by the frame
//! address its entry and landing records carry.
//!
//! The oracle: kernel uprobes on the original at every function's entry and at every
//! exit `objdump` finds (returns and tail jumps, in the function and its `.cold` part).
//! A call that entered and never returned was left by unwinding. Under `tracer record`
//! each function has the entries and exit records the oracle counted, `tracer report`
//! counts as many calls, of which entries − returns left by unwinding, and no call is
//! left open or exit unmatched. g++ -O2 exceptions (cleanups, rethrow, a catch at every
//! level of a recursion) and gcc -O2 `longjmp`/`siglongjmp`, on x86-64 and on AArch64
//! under qemu.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use tests::oracle::{exit_addresses, run_with_probes_at};
use tests::*;
use tracer_common::meta::{Metadata, SiteKind};

const N: &str = "3000";

struct Program {
    source: &'static str,
    /// (x86-64, AArch64) compilers.
    cc: (&'static str, &'static str),
    /// The functions the oracle probes, as their symbols.
    functions: &'static [&'static str],
}

const EXCEPTIONS: Program = Program {
    source: "unwind.cpp",
    cc: ("g++", "aarch64-linux-gnu-g++"),
    functions: &[
        "_Z7uw_leafl",
        "_Z10uw_cleanupl",
        "_Z7uw_passl",
        "_Z8uw_catchl",
        "_Z10uw_rethrowl",
        "_Z8uw_outerl",
        "_Z10uw_recursell",
    ],
};

const LONGJMP: Program = Program {
    source: "unwind_jmp.c",
    cc: ("gcc", "aarch64-linux-gnu-gcc"),
    functions: &[
        "lj_leaf",
        "lj_mid",
        "lj_catcher",
        "lj_sigleaf",
        "lj_sigmid",
        "lj_sigcatcher",
    ],
};

/// (entries, returns) per function of the original, by kernel uprobes.
fn oracle(orig: &Path, p: &Program, want: &Out) -> HashMap<String, (u64, u64)> {
    let mut probes: Vec<(&Path, String, u64)> = Vec::new();
    for f in p.functions {
        let sym = function_symbol(orig, f);
        probes.push((
            orig,
            f.to_string(),
            sym.file_off.expect("entry in a segment"),
        ));
        for a in exit_addresses("objdump", orig, f) {
            let off = file_offset(orig, a).expect("exit in a segment");
            probes.push((orig, format!("{f}/return"), off));
        }
    }
    let (out, events) = run_with_probes_at(&probes, Command::new(orig).arg(N), RUN_TIMEOUT);
    assert_same_behaviour(p.source, &out, want);
    let mut per: HashMap<String, (u64, u64)> = HashMap::new();
    for e in events {
        match e.symbol.strip_suffix("/return") {
            Some(f) => per.entry(f.to_string()).or_default().1 += 1,
            None => per.entry(e.symbol).or_default().0 += 1,
        }
    }
    per
}

/// The name `tracer report` gives a symbol (demangled by binutils' `c++filt`).
fn demangled(symbol: &str) -> String {
    let out = run(Command::new("c++filt").arg(symbol), RUN_TIMEOUT).ok();
    out.stdout_str().trim().to_string()
}

/// The trace against the oracle: entry and exit records per function, the report's
/// calls and calls left by unwinding, nothing left open.
fn check(
    what: &str,
    trace: &Path,
    meta: &Metadata,
    p: &Program,
    want: &HashMap<String, (u64, u64)>,
) {
    let kind: HashMap<u32, SiteKind> = meta.sites.iter().map(|s| (s.id, s.kind)).collect();
    let mut records: HashMap<String, (u64, u64)> = HashMap::new();
    for r in dump(trace) {
        let e = records.entry(r.symbol.to_string()).or_default();
        match kind.get(&r.site) {
            Some(SiteKind::FunctionEntry) => e.0 += 1,
            Some(SiteKind::FunctionExit) => e.1 += 1,
            _ => {}
        }
    }
    let rep = report_json(trace);
    let calls = &rep["calls"];
    let row = |name: &str| {
        calls["functions"]
            .as_array()
            .expect("calls.functions")
            .iter()
            .find(|f| f["function"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{what}: no calls of {name} in the report"))
    };
    let mut unwound_total = 0;
    for f in p.functions {
        let (entries, returns) = want[*f];
        assert!(entries > 0, "{what}: the oracle saw no call of {f}");
        assert_eq!(
            records.get(*f).map(|r| r.0),
            Some(entries),
            "{what}: entries of {f}"
        );
        assert_eq!(records[*f].1, returns, "{what}: exit records of {f}");
        let r = row(&demangled(f));
        assert_eq!(r["calls"], entries, "{what}: calls of {f}: {r}");
        assert_eq!(
            r["unwound"],
            entries - returns,
            "{what}: calls of {f} left by unwinding: {r}"
        );
        unwound_total += entries - returns;
    }
    assert!(unwound_total > 0, "{what}: the fixture unwound nothing");
    assert_eq!(
        calls["unwound"], unwound_total,
        "{what}: calls left by unwinding"
    );
    assert_eq!(calls["unfinished"], 0, "{what}: calls left open");
    assert_eq!(
        calls["unmatched_exits"], 0,
        "{what}: exits without their entry"
    );
}

/// `rewriter --sites entry,exit`: the landing and resume sites come with the exits.
fn rewrite(orig: &Path, traced: &Path, resumes: bool) -> Metadata {
    let out = rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--sites".as_ref(),
        "entry,exit".as_ref(),
    ])
    .ok();
    let meta = metadata(traced);
    let count = |k| meta.sites.iter().filter(|s| s.kind == k).count();
    assert!(
        count(SiteKind::Landing) > 0,
        "no landing site: {}",
        out.stdout_str()
    );
    assert_eq!(
        count(SiteKind::Resume) > 0,
        resumes,
        "resume sites: {}",
        out.stdout_str()
    );
    meta
}

fn x86_64(p: &Program, resumes: bool) {
    let tmp = TempDir::new("unwinding-x86");
    let orig = tmp.join("prog");
    compile(p.cc.0, &[fixture(p.source)], &["-O2"], &orig);
    let want = run(Command::new(&orig).arg(N), RUN_TIMEOUT).ok();
    let counts = oracle(&orig, p, &want);
    let traced = tmp.join("prog.traced");
    let meta = rewrite(&orig, &traced, resumes);
    let trace = tmp.join("prog.utrace");
    let out = tracer_record(&trace, &traced, &[N], &[]);
    assert_same_behaviour(p.source, &without_tracer_lines(&out), &want);
    check(&format!("{} x86-64", p.source), &trace, &meta, p, &counts);
}

/// The same program for AArch64 under qemu-user against the oracle's counts on the
/// x86-64 build (the calls do not depend on the ISA; the outputs must agree).
fn aarch64(p: &Program, resumes: bool) {
    let what = format!("{} AArch64", p.source);
    assert!(have_qemu_aarch64(&what), "{what}: qemu-aarch64 is missing");
    let tmp = TempDir::new("unwinding-a64");
    let (orig, x86) = (tmp.join("prog"), tmp.join("prog.x86"));
    compile(p.cc.1, &[fixture(p.source)], &["-O2"], &orig);
    compile(p.cc.0, &[fixture(p.source)], &["-O2"], &x86);
    let want = run_qemu_aarch64(&orig, &[N]).ok();
    let x86_want = run(Command::new(&x86).arg(N), RUN_TIMEOUT).ok();
    assert_eq!(want.stdout_str(), x86_want.stdout_str(), "{what}: output");
    let counts = oracle(&x86, p, &x86_want);
    let traced = tmp.join("prog.traced");
    let meta = rewrite(&orig, &traced, resumes);
    let trace = tmp.join("prog.utrace");
    let out = tracer_record_qemu(&trace, &traced, &[N]);
    assert_same_behaviour(&what, &without_tracer_lines(&out), &want);
    check(&what, &trace, &meta, p, &counts);
}

#[test]
fn exceptions_end_calls_where_they_land_x86_64() {
    x86_64(&EXCEPTIONS, true);
}

#[test]
fn longjmp_ends_calls_where_it_lands_x86_64() {
    x86_64(&LONGJMP, false);
}

#[test]
fn exceptions_end_calls_where_they_land_aarch64() {
    aarch64(&EXCEPTIONS, true);
}

#[test]
fn longjmp_ends_calls_where_it_lands_aarch64() {
    aarch64(&LONGJMP, false);
}
