//! Python by name: Debian's python3.11 rewritten with `--sites usdt` records its
//! `function__entry`/`function__return` probes inline; the drains read the strings
//! behind their pointers (`tracer-ebpf/src/strings.rs`) and the readers show Python
//! functions as `file:function:line` (`read/lang.rs`). The oracle is bpftrace on the
//! untouched interpreter, reading the same probes' strings at each event.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::*;

const PYTHON: &str = "/usr/bin/python3.11";
/// Calls of each of the script's small functions (its argument).
const ROUNDS: u64 = 100;
/// Records per thread buffer: a smaller buffer is drained sooner, so fewer strings are
/// freed between a probe and the drain that reads them (interpreter start-up frees
/// many).
const BUFFER_RECORDS: &str = "256";

fn script() -> PathBuf {
    fixture("calls.py")
}

/// The interpreter rewritten with `sites` (and `extra` rewriter flags).
fn rewritten(tmp: &TempDir, sites: &str, extra: &[&str]) -> PathBuf {
    let out = tmp.join("python3.11");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        PYTHON.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--sites".as_ref(),
        sites.as_ref(),
        "--buffer-records".as_ref(),
        BUFFER_RECORDS.as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    rewriter(&args).ok();
    out
}

/// What bpftrace counts on the untouched interpreter running the script: calls per
/// `file:function:line` (function__entry), and entries of the uprobe `extra` if given.
/// Every probe of the interpreter is enabled, as the tracer raises every semaphore
/// (CPython 3.11 fires function__entry for Python-to-Python calls only while the
/// `line` probe is enabled).
fn bpftrace_oracle(extra: Option<&str>) -> (BTreeMap<String, u64>, u64) {
    let mut prog = String::from(
        "usdt:PY:python:function__entry { @[str(arg0), str(arg1), arg2] = count(); } \
         usdt:PY:python:function__return, usdt:PY:python:line, usdt:PY:python:audit, \
         usdt:PY:python:gc__start, usdt:PY:python:gc__done, \
         usdt:PY:python:import__find__load__start, \
         usdt:PY:python:import__find__load__done { }",
    );
    if let Some(f) = extra {
        prog.push_str(&format!(" uprobe:PY:{f} {{ @c = count(); }}"));
    }
    let prog = prog.replace("PY", PYTHON);
    let cmd = format!("{PYTHON} {} {ROUNDS}", script().display());
    let _g = tracing_lock();
    let out = run(
        Command::new("bpftrace")
            .args(["-q", "-e", &prog, "-c", &cmd])
            // Room for the paths of the fixture (bpftrace's stack allows ~120 a string).
            .env("BPFTRACE_STRLEN", "120"),
        RUN_TIMEOUT,
    )
    .ok();
    let (mut calls, mut c) = (BTreeMap::new(), 0);
    for line in out.stdout_str().lines() {
        if let Some(n) = line.strip_prefix("@c: ") {
            c = n.parse().unwrap();
        } else if let Some(rest) = line.strip_prefix("@[") {
            let (key, n) = rest.rsplit_once("]: ").unwrap();
            let mut parts = key.splitn(3, ", ");
            let (file, function, l) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            calls.insert(format!("{file}:{function}:{l}"), n.parse().unwrap());
        }
    }
    assert!(
        !calls.is_empty(),
        "bpftrace counted nothing: {}",
        out.describe()
    );
    (calls, c)
}

/// The script's own functions (start-up differs: the rewritten interpreter lives
/// elsewhere, so its path search calls other functions).
fn script_calls(all: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let prefix = format!("{}:", script().display());
    all.iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(k, &n)| (k.clone(), n))
        .collect()
}

/// `tracer record` of the script under `python`; its printed line is the original's.
fn record(python: &Path, trace: &Path) {
    let out = tracer_record(
        trace,
        python,
        &[script().to_str().unwrap(), &ROUNDS.to_string()],
        &[],
    )
    .ok();
    let want = run(
        Command::new(PYTHON).arg(script()).arg(ROUNDS.to_string()),
        RUN_TIMEOUT,
    )
    .ok();
    assert_eq!(out.stdout_str(), want.stdout_str(), "the script's output");
}

/// `tracer ARGS OUT TRACE` (an export or a flame graph), which must succeed.
fn tracer_writes(args: &[&str], out: &Path, trace: &Path) {
    run(
        Command::new(tracer_bin()).args(args).arg(out).arg(trace),
        TRACE_TIMEOUT,
    )
    .ok();
}

/// Calls per Python function (`file:function:line`) in `tracer report --json`.
fn reported_calls(v: &serde_json::Value) -> BTreeMap<String, u64> {
    v["calls"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["function"].as_str().unwrap().to_string(),
                f["calls"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn python_functions_by_name_as_bpftrace_counts_them() {
    let tmp = TempDir::new("python");
    let python = rewritten(&tmp, "usdt", &[]);
    let (oracle, _) = bpftrace_oracle(None);
    let want = script_calls(&oracle);
    assert_eq!(want[&format!("{}:fib:7", script().display())], 1973);
    let trace = tmp.join("t.utrace");
    record(&python, &trace);

    let v = report_json(&trace);
    let got = reported_calls(&v);
    assert_eq!(script_calls(&got), want, "the script's functions");
    // Start-up and shutdown: most functions are named as bpftrace names them; the rest
    // are said to be stale, never named after another function.
    let same = oracle
        .iter()
        .filter(|(k, n)| got.get(*k) == Some(n))
        .count();
    assert!(
        same * 10 >= oracle.len() * 9,
        "{same} of {} the same",
        oracle.len()
    );
    for k in got.keys().filter(|k| !oracle.contains_key(*k)) {
        assert!(
            k.contains("<stale ") || k.contains("getpath"),
            "{k}: named, but not by bpftrace"
        );
    }
    let strings = &v["calls"]["strings"];
    assert_eq!(strings["unreadable"], 0, "{strings}");

    // A Perfetto slice per Python call, on the thread's "interpreted calls" track.
    let pf = tmp.join("t.pftrace");
    tracer_writes(&["export", "--format", "perfetto", "-o"], &pf, &trace);
    let summary = perfetto_summary(&pf);
    let lang_track = summary["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "interpreted calls")
        .expect("an interpreted-calls track")["uuid"]
        .to_string();
    let mut slices: BTreeMap<String, u64> = BTreeMap::new();
    for s in summary["slices"][&lang_track].as_array().unwrap() {
        *slices
            .entry(s["name"].as_str().unwrap().into())
            .or_default() += 1;
    }
    assert_eq!(script_calls(&slices), want, "Perfetto slices");

    // The flame graph has the script's recursion by name: its outermost frame holds all
    // of fib's self time (fib calls nothing else).
    let svg = tmp.join("t.svg");
    tracer_writes(&["flamegraph", "-o"], &svg, &trace);
    let fib = format!("{}:fib:7", script().display());
    let frames = flamegraph_frames(&std::fs::read_to_string(&svg).unwrap());
    let widest = frames.iter().filter(|(n, _)| *n == fib).map(|f| f.1).max();
    let fib_self = v["calls"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == fib.as_str())
        .and_then(|f| f["self_ns"].as_u64());
    assert_eq!(widest, fib_self, "fib's frames: {frames:?}");
}

/// Python calls and the interpreter's own C functions in one trace: each C function
/// the Python code calls nests under that Python call (`abs()` goes through
/// `PyObject_Vectorcall`), although the probes' C helpers do not nest with the calls.
#[test]
fn mixed_python_and_c_calls_nest() {
    let tmp = TempDir::new("python-mixed");
    let c_function = "PyObject_Vectorcall";
    let python = rewritten(&tmp, "usdt,entry,exit", &["--functions", c_function]);
    let (oracle, c_calls) = bpftrace_oracle(Some(c_function));
    let trace = tmp.join("m.utrace");
    record(&python, &trace);

    let v = report_json(&trace);
    let got = reported_calls(&v);
    assert_eq!(
        script_calls(&got),
        script_calls(&oracle),
        "the script's functions"
    );
    // The interpreter's start-up differs a little (its path search): the C function's
    // calls agree with bpftrace's uprobe to a few.
    let c_got = got[c_function];
    assert!(
        c_got.abs_diff(c_calls) * 100 <= c_calls,
        "{c_function}: {c_got} calls, bpftrace {c_calls}"
    );
    assert_eq!(
        v["calls"]["unfinished"], 0,
        "no call given up: {}",
        v["calls"]
    );

    let pq = tmp.join("pq");
    tracer_writes(&["export", "--format", "parquet", "-o"], &pq, &trace);
    let calls = pq.join("calls.parquet");
    let magnitude = format!("{}:magnitude:29", script().display());
    let rows = duckdb_rows(&format!(
        "select caller, count(*) from '{}' where function = '{c_function}' \
         group by all order by 2 desc",
        calls.display()
    ));
    let under = |name: &str| {
        rows.iter()
            .find(|r| r[0] == name)
            .and_then(|r| r[1].as_u64())
            .unwrap_or(0)
    };
    assert_eq!(
        under(&magnitude),
        ROUNDS,
        "{c_function} under magnitude: {rows:?}"
    );
    let rows = duckdb_rows(&format!(
        "select caller, depth, count(*) from '{}' where function = '{magnitude}' group by all",
        calls.display()
    ));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][0], format!("{}:main:33", script().display()));
    assert_eq!(rows[0][2], ROUNDS);
}
