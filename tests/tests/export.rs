//! Reading traces as people do: call statistics from entry/exit pairs in `tracer
//! report`, and `tracer export --format chrome` (a trace-event JSON that an
//! independent parser, serde_json, reads; calls as nested slices).

use std::collections::HashMap;
use std::process::Command;

use tests::*;

const N: u64 = 1000;
const FUNCTIONS: [&str; 5] = ["leaf", "multi", "tail", "tiny", "tiny2"];

/// Calls of each function in `exits N` (tests/fixtures/exits.c): leaf directly, from
/// multi when i % 3 == 2, and from tail (a tail call: its own entry and exit).
fn expected_calls(f: &str) -> u64 {
    match f {
        "leaf" => N + (0..N).filter(|i| i % 3 == 2).count() as u64 + N,
        _ => N,
    }
}

fn traced_exits(tmp: &TempDir) -> std::path::PathBuf {
    let (orig, traced, trace) = (
        tmp.join("exits"),
        tmp.join("exits.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("exits.c")], &["-O2"], &orig);
    let mut args: Vec<&std::ffi::OsStr> = vec![
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--sites".as_ref(),
        "entry,exit".as_ref(),
    ];
    for f in FUNCTIONS {
        args.extend(["--functions".as_ref(), std::ffi::OsStr::new(f)]);
    }
    rewriter(&args).ok();
    let out = tracer_record(&trace, &traced, &[&N.to_string()], &[]);
    assert_eq!(out.status(), 0, "{}", out.describe());
    trace
}

#[test]
fn call_times_in_the_report() {
    let tmp = TempDir::new("calltimes");
    let trace = traced_exits(&tmp);
    let v = report_json(&trace);
    let calls = &v["calls"];
    assert_eq!(calls["unmatched_exits"], 0, "{calls}");
    assert_eq!(calls["unfinished"], 0, "{calls}");
    let fs = calls["functions"].as_array().unwrap();
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut last_total = u64::MAX;
    for f in fs {
        let name = f["function"].as_str().unwrap().to_string();
        let n = |k: &str| f[k].as_u64().unwrap();
        assert!(n("total_ns") <= last_total, "sorted by total time: {fs:?}");
        last_total = n("total_ns");
        assert!(
            n("self_ns") <= n("total_ns") && n("min_ns") <= n("max_ns"),
            "{f}"
        );
        assert!(n("max_ns") <= n("total_ns"), "{f}");
        let hist: u64 = f["histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum();
        assert_eq!(hist, n("calls"), "histogram of {name}");
        seen.insert(name, n("calls"));
    }
    for f in FUNCTIONS {
        assert_eq!(
            seen.get(f).copied(),
            Some(expected_calls(f)),
            "calls of {f}"
        );
    }
    // multi calls leaf: its children's time is not its own.
    let get = |name: &str| fs.iter().find(|f| f["function"] == name).unwrap();
    let multi = get("multi");
    assert!(
        multi["total_ns"].as_u64() > multi["self_ns"].as_u64(),
        "{multi}"
    );
    let text = run(
        Command::new(tracer_bin()).arg("report").arg(&trace),
        TRACE_TIMEOUT,
    )
    .ok();
    assert!(
        text.stdout_str().contains("by total time"),
        "{}",
        text.stdout_str()
    );
}

#[test]
fn chrome_trace_export() {
    let tmp = TempDir::new("chrome");
    let trace = traced_exits(&tmp);
    let json = tmp.join("t.json");
    run(
        Command::new(tracer_bin())
            .arg("export")
            .arg(&trace)
            .args(["--format", "chrome", "-o"])
            .arg(&json),
        TRACE_TIMEOUT,
    )
    .ok();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    for f in FUNCTIONS {
        let n = slices.iter().filter(|e| e["name"] == f).count() as u64;
        assert_eq!(n, expected_calls(f), "slices of {f}");
    }
    // Slices of a thread nest: each starts and ends within any slice it starts in.
    let mut by_tid: HashMap<u64, Vec<(f64, f64)>> = HashMap::new();
    for e in &slices {
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(dur >= 0.0, "{e}");
        by_tid
            .entry(e["tid"].as_u64().unwrap())
            .or_default()
            .push((ts, ts + dur));
    }
    for spans in by_tid.values_mut() {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<(f64, f64)> = Vec::new();
        for &(s, e) in spans.iter() {
            // Times are µs with ns fractions: allow a float rounding of a nanosecond.
            const NS: f64 = 0.001;
            while open.last().is_some_and(|&(_, oe)| oe <= s + NS) {
                open.pop();
            }
            if let Some(&(_, oe)) = open.last() {
                assert!(
                    e <= oe + NS,
                    "slice {s}..{e} overlaps its parent ending at {oe}"
                );
            }
            open.push((s, e));
        }
    }
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exits.traced"]);
    let drops = events
        .iter()
        .find(|e| e["ph"] == "C")
        .expect("drop counter");
    assert_eq!(drops["args"]["dropped"], 0);
    // Only the output file, no temporary left.
    let mut left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json") || n.ends_with(".tmp"))
        .collect();
    left.sort();
    assert_eq!(left, ["t.json"]);
    // An unknown format is an error naming it, and writes nothing.
    let bad = run(
        Command::new(tracer_bin())
            .arg("export")
            .arg(&trace)
            .args(["--format", "nope", "-o"])
            .arg(tmp.join("x.json")),
        TRACE_TIMEOUT,
    );
    assert_eq!(bad.status(), 1, "{}", bad.describe());
    assert!(
        bad.stderr_str().contains("unknown export format \"nope\""),
        "{}",
        bad.describe()
    );
    assert!(!tmp.join("x.json").exists());
}
