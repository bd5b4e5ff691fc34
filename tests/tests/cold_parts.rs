//! Split-off parts of functions (issue 30): gcc moves unlikely code (catch blocks,
//! paths to cold calls) into `FUNC.cold`, which FUNC enters by a jump and which leaves
//! by a return, a tail call or a jump back into FUNC. A function and its parts are one
//! function: on tests/fixtures/cold.cpp, where every cp_* function but the leaves has a
//! `.cold` part, the rewriter joins each part to its function, and under `tracer
//! record` every function has as many entries as kernel uprobes count on the original
//! and, unless an exception leaves it, exactly as many exits; no function has more
//! exits than entries. g++ -O2 on x86-64 with the symbols and stripped (parts found
//! from the CFI and the jumps), and AArch64 (under qemu-user, user-space drain).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use tests::*;
use tracer_common::meta::{Metadata, SiteKind};

const N: u64 = 7000;
/// The fixture's functions (mangled), as the oracle probes them.
const FUNCTIONS: &[&str] = &[
    "_Z7cp_notel",
    "_Z7cp_slowl",
    "_Z8cp_otherl",
    "_Z8cp_innerl",
    "_Z9cp_middlel",
    "_Z8cp_outerl",
    "_Z13cp_loop_catchl",
    "_Z10cp_checkedl",
    "_Z12cp_cold_taill",
];
/// Left by an exception (cp_inner throws, cp_middle does not catch): fewer exits.
const UNWOUND: &[&str] = &["_Z8cp_innerl", "_Z9cp_middlel"];
/// Functions with a `.cold` part in every build here.
const SPLIT: &[&str] = &[
    "_Z8cp_innerl",
    "_Z8cp_outerl",
    "_Z13cp_loop_catchl",
    "_Z10cp_checkedl",
    "_Z12cp_cold_taill",
];

/// `(part address, function)` of every `FUNC.cold` symbol of `bin` (`nm`).
fn cold_symbols(nm: &str, bin: &Path) -> Vec<(u64, String)> {
    let out = run(Command::new(nm).arg(bin), RUN_TIMEOUT).ok();
    let mut v: Vec<(u64, String)> = out
        .stdout_str()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (addr, _, name) = (it.next()?, it.next()?, it.next()?);
            let base = name.strip_suffix(".cold")?;
            Some((u64::from_str_radix(addr, 16).ok()?, base.to_string()))
        })
        .collect();
    v.sort();
    v
}

/// `split-off part at 0xADDR of NAME` lines of `rewriter -v`.
fn joined_parts(stdout: &str) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("split-off part at 0x")?;
            let (addr, name) = rest.split_once(" of ")?;
            Some((u64::from_str_radix(addr, 16).ok()?, name.to_string()))
        })
        .collect();
    v.sort();
    v
}

fn rewrite_entry_exit(orig: &Path, traced: &Path) -> (String, Metadata) {
    let args: Vec<&OsStr> = vec![
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--sites".as_ref(),
        "entry,exit".as_ref(),
        "-v".as_ref(),
    ];
    let out = rewriter(&args).ok();
    (out.stdout_str(), metadata(traced))
}

/// Entries and exits per function of the trace: site names are the functions'.
fn entries_exits(trace: &Path, meta: &Metadata) -> HashMap<String, (u64, u64)> {
    let kind: HashMap<u32, SiteKind> = meta.sites.iter().map(|s| (s.id, s.kind)).collect();
    let mut per: HashMap<String, (u64, u64)> = HashMap::new();
    for r in dump(trace) {
        let e = per.entry(r.symbol.to_string()).or_default();
        match kind.get(&r.site) {
            Some(SiteKind::FunctionEntry) => e.0 += 1,
            Some(SiteKind::FunctionExit) => e.1 += 1,
            Some(SiteKind::Landing | SiteKind::Resume) => {}
            k => panic!("record of an unexpected site {k:?}: {r:?}"),
        }
    }
    per
}

/// Every function: entries as the oracle counted; exits equal to them, fewer where an
/// exception leaves it (`exact`: which functions must pair exactly). `name`: the
/// function's name in the trace.
fn check_counts(
    what: &str,
    per: &HashMap<String, (u64, u64)>,
    oracle: &HashMap<String, u64>,
    name: &dyn Fn(&str) -> String,
    exact: &dyn Fn(&str) -> bool,
) {
    for (f, (entries, exits)) in per {
        assert!(
            exits <= entries,
            "{what}: {f}: {exits} exits, {entries} entries"
        );
    }
    for f in FUNCTIONS {
        let want = oracle[*f];
        assert!(want > 0, "{what}: the oracle saw no call of {f}");
        let (entries, exits) = per.get(&name(f)).copied().unwrap_or_default();
        assert_eq!(entries, want, "{what}: entries of {f} ({})", name(f));
        if UNWOUND.contains(f) {
            assert!(
                exits < entries,
                "{what}: {f} is left by exceptions: {exits} exits"
            );
        } else if exact(f) {
            assert_eq!(exits, entries, "{what}: exits of {f} ({})", name(f));
        }
    }
}

/// The original's entries per function, counted by kernel uprobes.
fn oracle(orig: &Path, want: &Out) -> HashMap<String, u64> {
    let probes: Vec<(&Path, &str)> = FUNCTIONS.iter().map(|f| (orig, *f)).collect();
    let (out, counts) = oracle_counts(&probes, Command::new(orig).arg(N.to_string()), RUN_TIMEOUT);
    assert_same_behaviour("cold parts: the original under the oracle", &out, want);
    counts
}

#[test]
fn gcc_o2_parts_are_their_functions() {
    let tmp = TempDir::new("cold-parts-x86");
    let (orig, stripped) = (tmp.join("cold"), tmp.join("cold.stripped"));
    compile("g++", &[fixture("cold.cpp")], &["-O2"], &orig);
    compile("g++", &[fixture("cold.cpp")], &["-O2", "-s"], &stripped);
    let cold = cold_symbols("nm", &orig);
    let parents: Vec<&str> = cold.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(parents, SPLIT, "the fixture's .cold parts");
    let n = N.to_string();
    let want = run(Command::new(&orig).arg(&n), RUN_TIMEOUT).ok();
    let counts = oracle(&orig, &want);

    // With the symbols: every part joined by its name, every function exact.
    let traced = tmp.join("cold.traced");
    let (line, meta) = rewrite_entry_exit(&orig, &traced);
    assert_eq!(joined_parts(&line), cold, "{line}");
    let trace = tmp.join("cold.utrace");
    let out = tracer_record(&trace, &traced, &[&n], &[]);
    assert_same_behaviour("cold parts", &without_tracer_lines(&out), &want);
    let per = entries_exits(&trace, &meta);
    check_counts("g++ -O2", &per, &counts, &|f| f.to_string(), &|_| true);

    // Stripped: the parts entered mid-frame or jumping back are found (cp_outer's
    // catch, cp_loop_catch's), and pair exactly; a frameless part that only returns
    // stays a region of its own, whose exits are missed, never doubled.
    let addr: HashMap<String, u64> = FUNCTIONS
        .iter()
        .map(|f| (f.to_string(), function_symbol(&orig, f).addr))
        .collect();
    let traced = tmp.join("cold.stripped.traced");
    let (line, meta) = rewrite_entry_exit(&stripped, &traced);
    let joined = joined_parts(&line);
    let by_name: Vec<(u64, String)> = joined
        .iter()
        .map(|(a, f)| {
            let f = addr.iter().find(|e| format!("sub_{:x}", e.1) == *f);
            (*a, f.map_or_else(String::new, |e| e.0.clone()))
        })
        .collect();
    for must in ["_Z8cp_outerl", "_Z13cp_loop_catchl"] {
        let part = cold.iter().find(|c| c.1 == must).unwrap();
        assert!(by_name.contains(part), "{must}'s part: {line}");
    }
    assert!(
        by_name.iter().all(|p| cold.contains(p)),
        "only .cold parts are joined, to their functions: {by_name:?} {cold:?}"
    );
    let trace = tmp.join("stripped.utrace");
    let out = tracer_record(&trace, &traced, &[&n], &[]);
    assert_same_behaviour("cold parts, stripped", &without_tracer_lines(&out), &want);
    let per = entries_exits(&trace, &meta);
    let counts: HashMap<String, u64> = counts
        .into_iter()
        .filter(|(f, _)| f != "_Z8cp_otherl") // only tail-called: no entry site
        .collect();
    let joined_to: Vec<String> = by_name.iter().map(|p| p.1.clone()).collect();
    let sub = |f: &str| format!("sub_{:x}", addr[f]);
    for f in FUNCTIONS.iter().filter(|f| counts.contains_key(**f)) {
        let (entries, exits) = per.get(&sub(f)).copied().unwrap_or_default();
        assert_eq!(entries, counts[*f], "stripped: entries of {f}");
        assert!(exits <= entries, "stripped: {f}: {exits} exits");
        if joined_to.iter().any(|j| j == f) && !UNWOUND.contains(f) {
            assert_eq!(exits, entries, "stripped: exits of {f}");
        }
    }
    for (f, (entries, exits)) in &per {
        assert!(
            exits <= entries,
            "stripped: {f}: {exits} exits, {entries} entries"
        );
    }
}

#[test]
fn aarch64_parts_are_their_functions() {
    let what = "cold parts AArch64 g++ -O2";
    assert!(have_qemu_aarch64(what), "{what}: qemu-aarch64 is missing");
    let tmp = TempDir::new("cold-parts-a64");
    let orig = tmp.join("cold");
    // gcc partitions hot and cold code at -O2 on x86-64 only unless asked.
    compile(
        "aarch64-linux-gnu-g++",
        &[fixture("cold.cpp")],
        &["-O2", "-freorder-blocks-and-partition"],
        &orig,
    );
    let cold = cold_symbols("aarch64-linux-gnu-nm", &orig);
    let parents: Vec<&str> = cold.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(parents, SPLIT, "{what}: the fixture's .cold parts");
    let traced = tmp.join("cold.traced");
    let (line, meta) = rewrite_entry_exit(&orig, &traced);
    assert_eq!(joined_parts(&line), cold, "{line}");
    let n = N.to_string();
    let want = run_qemu_aarch64(&orig, &[&n]).ok();
    // The x86-64 build's output: the same program.
    let x86 = tmp.join("cold.x86");
    compile("g++", &[fixture("cold.cpp")], &["-O2"], &x86);
    let x86_out = run(Command::new(&x86).arg(&n), RUN_TIMEOUT).ok();
    assert_eq!(want.stdout_str(), x86_out.stdout_str(), "{what}: output");
    let trace = tmp.join("cold.utrace");
    let out = tracer_record_qemu(&trace, &traced, &[&n]);
    assert_same_behaviour(what, &without_tracer_lines(&out), &want);
    let per = entries_exits(&trace, &meta);
    // The oracle: kernel uprobes on the x86-64 build of the same source (the calls
    // do not depend on the ISA).
    let counts = oracle(&x86, &x86_out);
    check_counts(what, &per, &counts, &|f| f.to_string(), &|_| true);
}

/// Calls per function of a trace, from `tracer report --json`: (entries, exits), and
/// the report's unmatched exits.
fn report_calls(trace: &Path) -> (HashMap<String, (u64, u64)>, u64) {
    let rep = report_json(trace);
    let mut per: HashMap<String, (u64, u64)> = HashMap::new();
    for f in rep["functions"].as_array().expect("functions") {
        let e = per
            .entry(f["function"].as_str().unwrap().to_string())
            .or_default();
        let n = f["count"].as_u64().unwrap();
        match f["kind"].as_str() {
            Some("entry") => e.0 += n,
            Some("exit") => e.1 += n,
            Some("landing" | "resume") => {}
            k => panic!("a function row of kind {k:?}"),
        }
    }
    let unmatched = rep["calls"]["unmatched_exits"]
        .as_u64()
        .expect("unmatched_exits");
    (per, unmatched)
}

/// Debian's binaries as they ship (stripped: their parts are found from the CFI and
/// the jumps), every function's entry and exit traced: python3.11 running a script
/// that raises and catches, and libstdc++ under a C++ program that throws and catches.
/// The output is the original's, no exit lacks its entry, and no function has more
/// exits than entries (before parts were joined, python3.11 gave 67 exits without
/// their entry and two functions more exits than entries on this script).
#[test]
fn debian_binaries_never_exit_more_than_they_enter() {
    let tmp = TempDir::new("cold-parts-debian");
    let check = |what: &str, trace: &Path, line: &str| {
        let (per, unmatched) = report_calls(trace);
        assert!(per.len() > 100, "{what}: {} functions", per.len());
        assert_eq!(unmatched, 0, "{what}: exits without their entry");
        let over: Vec<_> = per.iter().filter(|(_, (e, x))| x > e).collect();
        assert!(over.is_empty(), "{what}: more exits than entries: {over:?}");
        let parts = line
            .lines()
            .find_map(|l| l.split("split-off parts: ").nth(1))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{what}: no parts count: {line}"));
        eprintln!("{what}: {parts} parts joined, {} functions", per.len());
        assert!(parts > 0, "{what}: no split-off part found");
    };

    let python = Path::new("/usr/bin/python3.11");
    let traced = tmp.join("python3.11");
    let (line, _) = rewrite_entry_exit(python, &traced);
    let script = fixture("cold_work.py");
    let s = script.to_str().unwrap();
    let want = run(Command::new(python).arg(s), RUN_TIMEOUT).ok();
    let trace = tmp.join("python.utrace");
    let out = tracer_record(&trace, &traced, &[s], &[]);
    assert_same_behaviour("python3.11", &without_tracer_lines(&out), &want);
    check("python3.11", &trace, &line);

    let lib = std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libstdc++.so.6").unwrap();
    let ld = tmp.join("lib");
    std::fs::create_dir_all(&ld).unwrap();
    let (line, _) = rewrite_entry_exit(&lib, &ld.join("libstdc++.so.6"));
    let prog = tmp.join("stl");
    compile("g++", &[fixture("cold_stl.cpp")], &["-O2"], &prog);
    let want = run(&mut Command::new(&prog), RUN_TIMEOUT).ok();
    let trace = tmp.join("stl.utrace");
    let env: [(&str, &OsStr); 1] = [("LD_LIBRARY_PATH", ld.as_os_str())];
    let out = tracer_record(&trace, &prog, &[], &env);
    assert_same_behaviour("libstdc++", &without_tracer_lines(&out), &want);
    check("libstdc++", &trace, &line);
}

/// A part too short for a jump and no padding after it (tinycold.c: `xor; ret`, then
/// another function), entered by two jumps with 32-bit displacements: those jumps are
/// re-pointed at the part's trampoline, the part's bytes stay the original's, and its
/// `ret` is an inline exit. Kernel uprobes on the original count the calls and the
/// ways into the part; the trace has an entry and an exit per call, as many exits from
/// the part's `ret` as the part was entered, and no record through a uprobe.
#[test]
fn a_part_too_short_for_a_jump_is_entered_by_its_jumps() {
    let what = "tiny part";
    let tmp = TempDir::new("tiny-part");
    let (orig, traced, trace) = (
        tmp.join("tinycold"),
        tmp.join("tinycold.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("tinycold.c")], &["-O2"], &orig);
    let n = N.to_string();
    let probes = [
        (orig.as_path(), "tc_tiny"),
        (orig.as_path(), "tc_tiny.cold"),
    ];
    let (want, counts) = oracle_counts(&probes, Command::new(&orig).arg(&n), RUN_TIMEOUT);
    assert_eq!(counts["tc_tiny"], N, "{what}: the oracle's calls");
    assert_eq!(
        counts["tc_tiny.cold"],
        2 * N / 5,
        "{what}: the oracle's ways in"
    );

    let (line, meta) = rewrite_entry_exit(&orig, &traced);
    let part = function_symbol(&orig, "tc_tiny.cold");
    let exit = meta
        .sites
        .iter()
        .find(|s| s.kind == SiteKind::FunctionExit && s.vaddr == part.addr + 2)
        .unwrap_or_else(|| panic!("{what}: no exit site at the part's ret: {line}"));
    assert_eq!(exit.mode, SiteMode::Inline, "{what}: {exit:?}\n{line}");
    let (a, b) = (
        std::fs::read(&orig).unwrap(),
        std::fs::read(&traced).unwrap(),
    );
    let off = part.file_off.expect("the part in the file") as usize;
    assert_eq!(
        &b[off..off + 3],
        &a[off..off + 3],
        "{what}: the part was patched"
    );

    let out = tracer_record(&trace, &traced, &[&n], &[]);
    assert_same_behaviour(what, &without_tracer_lines(&out), &want);
    let recs = dump(&trace);
    assert!(
        recs.iter().all(|r| r.flags & FLAG_UPROBE == 0),
        "{what}: records through uprobes"
    );
    let per = entries_exits(&trace, &meta);
    assert_eq!(
        per["tc_tiny"],
        (N, N),
        "{what}: entries and exits of tc_tiny"
    );
    let from_part = recs.iter().filter(|r| r.site == exit.id).count() as u64;
    assert_eq!(
        from_part, counts["tc_tiny.cold"],
        "{what}: exits from the part"
    );
}
