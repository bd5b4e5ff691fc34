//! Checking the console: each program's dump against its exact expected records.

use std::collections::BTreeMap;

use super::{Expect, P_DUMP, P_PROG, P_VM, Program, Who};

/// One dump line: pid tid binary site symbol value aux time_ns flags.
struct DumpRec {
    tid: u32,
    symbol: String,
    value: u64,
    aux: u64,
    flags: u32,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

fn parse_dump(rest: &str) -> Option<DumpRec> {
    let f: Vec<&str> = rest.split('\t').collect();
    if f.len() != 9 {
        return None;
    }
    Some(DumpRec {
        tid: f[1].parse().ok()?,
        symbol: f[4].to_string(),
        value: hex(f[5])?,
        aux: hex(f[6])?,
        flags: f[8].parse().ok()?,
    })
}

/// Everything wrong with the console text; empty = pass.
pub(super) fn check_console(text: &str, programs: &[Program]) -> Vec<String> {
    let mut errs = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    if !lines.contains(&"UTRACE-VM: DONE") {
        errs.push("no `UTRACE-VM: DONE` line: the guest did not finish".into());
    }
    if !lines.contains(&"UTRACE-VM: GUEST PASS") {
        errs.push("no `UTRACE-VM: GUEST PASS` line".into());
    }
    for p in programs {
        let e0 = errs.len();
        check_program(&lines, p, &mut errs);
        if errs.len() == e0 {
            match &p.loose {
                Some(l) => println!("arm64-vm:   {}: printed {:?}, records", p.name, l.prints),
                None => {
                    let n: usize = p.expect.iter().map(|e| e.values.len()).sum();
                    println!("arm64-vm:   {}: {n} records exactly as expected", p.name);
                }
            }
        }
    }
    errs
}

/// Records of one (tid, symbol, uprobe?) in a dump: (value, aux) each.
type Dumped = BTreeMap<(u32, String, bool), Vec<(u64, u64)>>;

fn check_program(lines: &[&str], p: &Program, errs: &mut Vec<String>) {
    let name = &p.name;
    let Some((run, exit_at)) = run_span(lines, p, errs) else {
        return;
    };
    let mut tids = program_tids(&lines[run..exit_at]);
    // Records from the dump.
    let prefix = format!("{P_DUMP} {name} ");
    let (mut got, total) = dumped(lines, &prefix, name, errs);
    if let Some(l) = &p.loose {
        if !lines[run..exit_at].contains(&l.prints.as_str()) {
            errs.push(format!("{name}: did not print {:?}", l.prints));
        }
        if total == 0 {
            errs.push(format!("{name}: no records in the dump"));
        }
        let report = format!("UTRACE-REPORT {name} {}", l.reported);
        if !lines.iter().any(|x| x.starts_with(&report)) {
            errs.push(format!("{name}: the report has no line {:?}", l.reported));
        }
        return;
    }
    if let std::collections::btree_map::Entry::Vacant(main) = tids.entry(Who::Main) {
        // A program that prints nothing (fx-static-solo) is single-threaded: its main
        // thread's tid is its pid.
        let pids: std::collections::BTreeSet<u32> = lines
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|r| r.split('\t').next()?.parse().ok())
            .collect();
        if let [pid] = pids.into_iter().collect::<Vec<_>>()[..] {
            main.insert(pid);
        }
    }
    let mut expected_total = 0usize;
    for e in &p.expect {
        expected_total += e.values.len();
        check_expect(e, &tids, &mut got, name, errs);
    }
    for ((tid, sym, up), recs) in &got {
        errs.push(format!(
            "{name}: {} unexpected records: tid {tid} {sym} {}",
            recs.len(),
            if *up { "uprobe" } else { "inline" }
        ));
    }
    if total != expected_total {
        errs.push(format!(
            "{name}: {total} records in the dump, expected {expected_total}"
        ));
    }
}

/// The program's console lines between RUN and EXIT (as indices), its exit status and
/// the guest-side verdict checked.
fn run_span(lines: &[&str], p: &Program, errs: &mut Vec<String>) -> Option<(usize, usize)> {
    let name = &p.name;
    let Some(run) = lines
        .iter()
        .position(|l| *l == format!("{P_VM} RUN {name}"))
    else {
        errs.push(format!("{name}: never ran"));
        return None;
    };
    let exit_prefix = format!("{P_VM} EXIT {name} ");
    let Some(exit_at) = lines[run..]
        .iter()
        .position(|l| l.starts_with(&exit_prefix))
        .map(|i| i + run)
    else {
        errs.push(format!("{name}: no EXIT line"));
        return None;
    };
    let code = lines[exit_at][exit_prefix.len()..].trim();
    if code != p.exit_code.to_string() {
        errs.push(format!(
            "{name}: exit status {code}, expected {}",
            p.exit_code
        ));
    }
    if !lines.contains(&format!("{P_VM} RESULT {name} ok").as_str()) {
        errs.push(format!(
            "{name}: guest-side check failed (exit status, drops or read errors)"
        ));
    }
    Some((run, exit_at))
}

/// The tids the program printed about itself (`UTPROG main tid N`, `UTPROG thread K tid N`).
fn program_tids(output: &[&str]) -> BTreeMap<Who, u32> {
    let mut tids: BTreeMap<Who, u32> = BTreeMap::new();
    for l in output {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            [P_PROG, "thread", no, "tid", tid, ..] => {
                if let (Ok(no), Ok(tid)) = (no.parse(), tid.parse()) {
                    tids.insert(Who::Thread(no), tid);
                }
            }
            [P_PROG, "main", "tid", tid, ..] => {
                if let Ok(tid) = tid.parse() {
                    tids.insert(Who::Main, tid);
                }
            }
            _ => {}
        }
    }
    tids
}

/// The program's dump lines (`prefix`) parsed: the records and their number.
fn dumped(lines: &[&str], prefix: &str, name: &str, errs: &mut Vec<String>) -> (Dumped, usize) {
    let mut got: Dumped = BTreeMap::new();
    let mut total = 0usize;
    for l in lines {
        if let Some(rest) = l.strip_prefix(prefix) {
            match parse_dump(rest) {
                Some(r) => {
                    total += 1;
                    got.entry((r.tid, r.symbol, r.flags & tracer_common::FLAG_UPROBE != 0))
                        .or_default()
                        .push((r.value, r.aux));
                }
                None => errs.push(format!("{name}: unparsable dump line {l:?}")),
            }
        }
    }
    (got, total)
}

/// One expectation against the records (taken out of `got`): exact values, return
/// addresses in range.
fn check_expect(
    e: &Expect,
    tids: &BTreeMap<Who, u32>,
    got: &mut Dumped,
    name: &str,
    errs: &mut Vec<String>,
) {
    let Some(&tid) = tids.get(&e.who) else {
        let msg = format!("{name}: the program did not print the tid of {:?}", e.who);
        if !errs.contains(&msg) {
            errs.push(msg);
        }
        return;
    };
    let key = (tid, e.symbol.to_string(), e.uprobe);
    let recs = got.remove(&key).unwrap_or_default();
    let mut values: Vec<u64> = recs.iter().map(|r| r.0).collect();
    values.sort_unstable();
    let mut want = e.values.clone();
    want.sort_unstable();
    let mode = if e.uprobe { "uprobe" } else { "inline" };
    if values != want {
        errs.push(format!(
            "{name}: {:?} (tid {tid}) {} {mode}: {} records, expected {}{}",
            e.who,
            e.symbol,
            values.len(),
            want.len(),
            if values.len() == want.len() {
                " (values differ)"
            } else {
                ""
            }
        ));
    }
    if let Some((lo, hi)) = e.aux
        && let Some(bad) = recs.iter().find(|r| !(lo..hi).contains(&r.1))
    {
        errs.push(format!(
            "{name}: {:?} {} {mode}: return address {:#x} not in [{lo:#x}, {hi:#x})",
            e.who, e.symbol, bad.1
        ));
    }
}
