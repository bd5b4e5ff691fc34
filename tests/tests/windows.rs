//! Windows that hold branch targets (tests/fixtures/windows.c): a loop label inside a
//! function's first 5 bytes, a `ret` at a branch target with a target right after it,
//! a `ret` that a jump from behind a call reaches (a landing in the displaced bytes),
//! a `ret` with no room at all that a jump over a call reaches (one window holds the
//! jump, the call and the `ret`; the call's return address is a landing), and exits
//! after a jump table indexed by a table byte bounded in memory. Every entry and exit
//! must be inline and every record come inline, the program must behave as the original, and the trace
//! must hold exactly the entries kernel uprobes see on the original, each paired with
//! its exit and the function's return value.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::process::Command;

use tests::*;
use tracer_common::meta::{SiteKind, SiteMode};

const N: u64 = 3000;
const FUNCTIONS: [&str; 6] = [
    "fx_loop", "fx_pick", "fx_land", "fx_after", "fx_tail", "fx_class",
];
const CLASSES: [u64; 8] = [2, 0, 9, 3, 1, 1, 200, 0];

/// What each fixture function returns (see windows.c), as the 32-bit `%eax`.
fn returns(f: &str, x: u64) -> u32 {
    match f {
        "fx_loop" => 0,
        "fx_pick" if x == 0 => 7,
        "fx_pick" if x & 1 == 1 => 5,
        "fx_pick" => 3,
        "fx_land" => x.min(2) as u32,
        "fx_after" => 5,
        // At the `ret` for 0, at the tail call (before fx_after runs) for 1.
        "fx_tail" => x as u32,
        _ if CLASSES[x as usize] <= 3 => 10 + CLASSES[x as usize] as u32,
        _ => u32::MAX,
    }
}

fn expected_output() -> String {
    let acc: i64 = (0..N)
        .map(|i| {
            [
                ("fx_pick", i % 3),
                ("fx_class", i % 8),
                ("fx_land", i % 3),
                ("fx_after", 0),
            ]
            .into_iter()
            .map(|(f, x)| i64::from(returns(f, x) as i32))
            .sum::<i64>()
                // fx_tail: fx_after's 5 for odd i.
                + 5 * (i % 2) as i64
        })
        .sum();
    format!("windows n={N} acc={acc}\n")
}

#[test]
fn windows_hold_branch_targets() {
    check_windows("windows", false);
}

/// The same, stripped: the functions are known by their FDEs alone (`sub_<address>`),
/// and a window grown over jumps needs to know that its jumps are the function's own.
#[test]
fn windows_hold_branch_targets_in_a_stripped_binary() {
    check_windows("windows-stripped", true);
}

/// The fixture's names by address (a stripped binary's records name `sub_<address>`).
fn fixture_names(bin: &std::path::Path) -> HashMap<String, String> {
    let data = std::fs::read(bin).unwrap();
    let file = object::File::parse(&*data).unwrap();
    object::Object::symbols(&file)
        .filter_map(|s| {
            let name = object::ObjectSymbol::name(&s).ok()?;
            FUNCTIONS.contains(&name).then(|| {
                let a = object::ObjectSymbol::address(&s);
                (format!("sub_{a:x}"), name.to_string())
            })
        })
        .collect()
}

fn check_windows(tag: &str, strip: bool) {
    let tmp = TempDir::new(tag);
    let (orig, traced, trace) = (
        tmp.join("windows"),
        tmp.join("windows.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("windows.c")], &["-O2"], &orig);
    let names = fixture_names(&orig);
    assert_eq!(names.len(), FUNCTIONS.len(), "fixture symbols {names:?}");
    let input = if strip {
        let stripped = tmp.join("windows.stripped");
        let st = Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&orig)
            .status()
            .expect("strip");
        assert!(st.success(), "strip");
        stripped
    } else {
        orig.clone()
    };
    let name = |s: &str| names.get(s).cloned().unwrap_or_else(|| s.to_string());
    let n = N.to_string();
    let probes: Vec<_> = FUNCTIONS.iter().map(|f| (orig.as_path(), *f)).collect();
    let (want, events) = oracle::run_with_probes(&probes, Command::new(&orig).arg(&n), RUN_TIMEOUT);
    assert_eq!(want.stdout_str(), expected_output(), "original output");
    let oracle: Vec<(String, u64)> = events.iter().map(|e| (e.symbol.clone(), e.value)).collect();
    assert_eq!(
        oracle.len() as u64,
        6 * N + N / 2,
        "kernel uprobes on the original"
    );

    let mut args: Vec<&OsStr> = vec![input.as_os_str(), "-o".as_ref(), traced.as_os_str()];
    args.extend(["--sites", "entry,exit", "-v"].map(OsStr::new));
    if !strip {
        args.extend(["--functions", "fx_*"].map(OsStr::new));
    }
    let line = rewriter(&args).ok().stdout_str();
    let meta = metadata(&traced);
    let uprobes: Vec<_> = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Uprobe)
        .collect();
    assert!(uprobes.is_empty(), "uprobe sites {uprobes:?}\n{line}");
    // Entries, and exits: one each but fx_class's five and fx_tail's two.
    assert_eq!(meta.sites.len(), 6 + 4 + 5 + 2, "sites: {line}");

    assert_same_behaviour(
        "rewritten",
        &run(Command::new(&traced).arg(&n), RUN_TIMEOUT),
        &want,
    );
    let out = tracer_record(&trace, &traced, &[&n], &[]);
    assert_same_behaviour("under tracer record", &without_tracer_lines(&out), &want);
    let recs = dump(&trace);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "dropped");
    let through: Vec<&Rec> = recs.iter().filter(|r| r.flags & FLAG_UPROBE != 0).collect();
    assert!(
        through.is_empty(),
        "records through uprobes: {:?}",
        &through[..through.len().min(3)]
    );
    check_report_matches_dump(&rep, &recs);

    let kind: HashMap<u32, SiteKind> = meta.sites.iter().map(|s| (s.id, s.kind)).collect();
    let entries: Vec<(String, u64)> = recs
        .iter()
        .filter(|r| kind[&r.site] == SiteKind::FunctionEntry)
        .map(|r| (name(&r.symbol), r.value))
        .collect();
    assert_seq_eq(
        &entries,
        &oracle,
        "entries against kernel uprobes on the original",
    );
    // Each entry is followed by its own exit (the functions call nothing).
    let mut exits = 0;
    for pair in recs.chunks(2) {
        let [e, x] = pair else {
            panic!("odd record count")
        };
        assert_eq!(
            (kind[&e.site], kind[&x.site], &*x.symbol),
            (SiteKind::FunctionEntry, SiteKind::FunctionExit, &*e.symbol),
            "entry then exit: {e:?} {x:?}"
        );
        assert_eq!(
            x.value as u32,
            returns(&name(&e.symbol), e.value),
            "{}({}) returned {:#x}",
            e.symbol,
            e.value,
            x.value
        );
        exits += 1;
    }
    assert_eq!(exits, 6 * N + N / 2, "exits");
}
