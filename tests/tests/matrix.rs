//! Build matrix: gcc and clang × {PIE (default), -no-pie, -static, -static-pie,
//! -fcf-protection=full} × {-O0, -O2} of fixtures/matrix.c, every defined function
//! instrumented. For each build:
//! 1. the original prints the expected text and exits with the expected code;
//! 2. kernel uprobes on the original confirm the expected entry sequences (the oracle);
//! 3. the rewriter's site table covers every defined function;
//! 4. the rewritten binary, alone and under `tracer record`, prints the same bytes and
//!    exits with the same code as the original;
//! 5. the trace holds exactly the expected records per thread, in order, with valid
//!    sites, consistent return addresses and monotonic times; the report agrees.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use tests::fixture_oracle::matrix::{
    FOLLOWED, expected_main_thread, expected_output, expected_worker_thread,
};
use tests::*;

/// One thread's followed entries: (symbol, value, aux).
type Seq = Vec<(String, u64, u64)>;

/// Check the per-thread sequences of followed entries: exactly a main thread (`main_tid`)
/// and one worker, with exactly the expected (symbol, value) sequences; fx_mid's two
/// calls of fx_leaf have two distinct return addresses, the same at every iteration.
fn check_sequences(threads: &[(u32, Seq)], main_tid: u32, what: &str) {
    let tids: Vec<u32> = threads.iter().map(|t| t.0).collect();
    assert_eq!(
        threads.len(),
        2,
        "{what}: followed functions ran on threads {tids:?}, expected 2 (main {main_tid} + worker)"
    );
    let main = &threads
        .iter()
        .find(|t| t.0 == main_tid)
        .unwrap_or_else(|| {
            panic!("{what}: no records of the main thread {main_tid} (threads {tids:?})")
        })
        .1;
    let worker = &threads.iter().find(|t| t.0 != main_tid).unwrap().1;
    let sv = |s: &Seq| {
        s.iter()
            .map(|(n, v, _)| (n.clone(), *v))
            .collect::<Vec<_>>()
    };
    assert_seq_eq(
        &sv(main),
        &expected_main_thread(),
        &format!("{what}: main thread"),
    );
    assert_seq_eq(
        &sv(worker),
        &expected_worker_thread(),
        &format!("{what}: worker thread"),
    );
    // fx_mid(i) is followed by fx_leaf from its first call site, then from its second.
    let mut first = HashSet::new();
    let mut second = HashSet::new();
    for w in main.windows(3) {
        if w[0].0 == "fx_mid" {
            first.insert(w[1].2);
            second.insert(w[2].2);
        }
    }
    assert_eq!(
        (first.len(), second.len()),
        (1, 1),
        "{what}: return addresses of fx_leaf from fx_mid: {first:x?} / {second:x?}"
    );
    assert_ne!(
        first, second,
        "{what}: fx_mid's two call sites have the same return address"
    );
}

fn run_case(cc: &str, link: &[&str], opt: &str) {
    run_case_with(cc, link, opt, &[]);
}

/// `tflags`: extra `tracer record` flags (`--user`: the user-space drain).
fn run_case_with(cc: &str, link: &[&str], opt: &str, tflags: &[&str]) {
    let tag = format!("{cc}{}{opt}{}", link.join(""), tflags.join("")).replace(['=', '-'], "_");
    let tmp = TempDir::new(&format!("matrix-{tag}"));
    let orig = tmp.join("matrix");
    let mut flags = vec![opt, "-g", "-pthread"];
    flags.extend_from_slice(link);
    compile(cc, &[fixture("matrix.c")], &flags, &orig);
    let what = format!(
        "{cc} {} {opt} {}",
        if link.is_empty() {
            "(PIE)".to_string()
        } else {
            link.join(" ")
        },
        tflags.join(" ")
    );

    // 1. The original.
    let (want_stdout, want_code) = expected_output();
    let o = run(&mut Command::new(&orig), RUN_TIMEOUT);
    assert_eq!(
        (o.stdout_str(), o.status()),
        (want_stdout.clone(), want_code),
        "{what}: original output: {}",
        o.describe()
    );

    // 2. Oracle: kernel uprobes on the original.
    let probes: Vec<(&Path, &str)> = FOLLOWED.iter().map(|s| (orig.as_path(), *s)).collect();
    let (oo, events) = oracle::run_with_probes(&probes, &mut Command::new(&orig), RUN_TIMEOUT);
    assert_eq!(oo.stdout, o.stdout, "{what}: output under the oracle");
    let main_tid = events.first().map(|e| e.tid).unwrap_or(0);
    let mut threads: Vec<(u32, Seq)> = Vec::new();
    for e in &events {
        match threads.iter_mut().find(|t| t.0 == e.tid) {
            Some(t) => t.1.push((e.symbol.clone(), e.value, e.aux)),
            None => threads.push((e.tid, vec![(e.symbol.clone(), e.value, e.aux)])),
        }
    }
    check_sequences(
        &threads,
        main_tid,
        &format!("{what}: FIXTURE CHECK (kernel uprobes on the original build)"),
    );

    // 3. Rewrite, every defined function.
    let traced = tmp.join("matrix.traced");
    let (_, counts, meta) = rewrite(&orig, Some(&traced), &[]);
    let syms = function_symbols(&orig);
    // Every defined function (size > 0) is a site, except the cold parts gcc splits off
    // a function (`f.cold`: reached by jumps from f, never called) and glibc's signal
    // return trampoline `__restore_rt` (entered by returning from a handler).
    let missing: Vec<String> = syms
        .iter()
        .filter(|f| f.size > 0 && !f.name.contains(".cold") && f.name != "__restore_rt")
        .filter(|f| !meta.sites.iter().any(|s| s.vaddr == f.addr))
        .map(|f| format!("{}@{:#x}", f.name, f.addr))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: {} defined functions have no site ({counts:?}): {missing:?}",
        missing.len()
    );
    for name in FOLLOWED {
        let f = syms.iter().find(|f| f.name == name).unwrap();
        let s = meta
            .sites
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{what}: no site named {name}"));
        assert_eq!(s.vaddr, f.addr, "{what}: site {name} vaddr");
    }

    // 4. Same behaviour, alone and under the tracer.
    let t = run(&mut Command::new(&traced), RUN_TIMEOUT);
    assert_same_output(&t, &o, &format!("{what}: rewritten binary"));
    let trace = tmp.join("matrix.utrace");
    record_same_output(tflags, &trace, &traced, &[], &o, &what);

    // 5. The records.
    let recs = dump(&trace);
    check_sites_valid(&recs, &[&meta]);
    let pids: HashSet<u32> = recs.iter().map(|r| r.pid).collect();
    assert_eq!(
        pids.len(),
        1,
        "{what}: records of several processes: {pids:?}"
    );
    let pid = *pids.iter().next().unwrap();
    for r in &recs {
        assert!(
            r.binary.contains("matrix"),
            "{what}: record names binary {:?}",
            r.binary
        );
        assert_eq!(
            r.flags & FLAG_UPROBE != 0,
            meta.sites
                .iter()
                .any(|s| s.id == r.site && s.mode == SiteMode::Uprobe),
            "{what}: flags of {r:?}"
        );
    }
    let threads: Vec<(u32, Seq)> = by_tid(recs.iter().filter(|r| FOLLOWED.contains(&&*r.symbol)))
        .into_iter()
        .map(|(tid, rs)| {
            (
                tid,
                rs.iter()
                    .map(|r| (r.symbol.to_string(), r.value, r.aux))
                    .collect(),
            )
        })
        .collect();
    check_sequences(&threads, pid, &format!("{what}: trace"));
    for (tid, rs) in by_tid(&recs) {
        check_times_monotonic(&rs, &format!("{what}: thread {tid}"));
    }
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped records");
    check_report_matches_dump(&rep, &recs);
}

const PIE: &[&str] = &[];
const NO_PIE: &[&str] = &["-no-pie"];
const STATIC: &[&str] = &["-static"];
const STATIC_PIE: &[&str] = &["-static-pie"];
const CET: &[&str] = &["-fcf-protection=full"];

macro_rules! case {
    ($name:ident, $cc:expr, $link:expr, $opt:expr) => {
        #[test]
        fn $name() {
            run_case($cc, $link, $opt);
        }
    };
}

case!(gcc_pie_o0, "gcc", PIE, "-O0");
case!(gcc_pie_o2, "gcc", PIE, "-O2");
case!(gcc_no_pie_o0, "gcc", NO_PIE, "-O0");
case!(gcc_no_pie_o2, "gcc", NO_PIE, "-O2");
case!(gcc_static_o0, "gcc", STATIC, "-O0");
case!(gcc_static_o2, "gcc", STATIC, "-O2");
case!(gcc_static_pie_o0, "gcc", STATIC_PIE, "-O0");
case!(gcc_static_pie_o2, "gcc", STATIC_PIE, "-O2");
case!(gcc_cet_o0, "gcc", CET, "-O0");
case!(gcc_cet_o2, "gcc", CET, "-O2");
case!(clang_pie_o0, "clang", PIE, "-O0");
case!(clang_pie_o2, "clang", PIE, "-O2");
case!(clang_no_pie_o0, "clang", NO_PIE, "-O0");
case!(clang_no_pie_o2, "clang", NO_PIE, "-O2");
case!(clang_static_o0, "clang", STATIC, "-O0");
case!(clang_static_o2, "clang", STATIC, "-O2");
case!(clang_static_pie_o0, "clang", STATIC_PIE, "-O0");
case!(clang_static_pie_o2, "clang", STATIC_PIE, "-O2");
case!(clang_cet_o0, "clang", CET, "-O0");
case!(clang_cet_o2, "clang", CET, "-O2");

// The user-space drain (`tracer record --user`) on static executables: records of the
// pre-TLS phase (slot 1) are handed over through the socket.
#[test]
fn user_gcc_static_o2() {
    run_case_with("gcc", STATIC, "-O2", &["--user"]);
}
#[test]
fn user_gcc_static_pie_o2() {
    run_case_with("gcc", STATIC_PIE, "-O2", &["--user"]);
}
