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
    calls_in(f, N)
}

/// Calls of `f` in `exits n`.
fn calls_in(f: &str, n: u64) -> u64 {
    match f {
        "leaf" => n + (0..n).filter(|i| i % 3 == 2).count() as u64 + n,
        _ => n,
    }
}

fn traced_exits(tmp: &TempDir) -> std::path::PathBuf {
    traced_exits_n(tmp, N)
}

fn traced_exits_n(tmp: &TempDir, n: u64) -> std::path::PathBuf {
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
    let out = tracer_record(&trace, &traced, &[&n.to_string()], &[]);
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
    // Per thread: its completed calls, time span, and where its self time went.
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{threads:?}");
    let t = &threads[0];
    let all: u64 = FUNCTIONS.iter().map(|f| expected_calls(f)).sum();
    assert_eq!(t["calls"], all, "{t}");
    assert_eq!(t["count"], 2 * all, "an entry and an exit per call: {t}");
    assert!(t["first_ns"].as_u64() < t["last_ns"].as_u64(), "{t}");
    let top = t["top_function"].as_str().unwrap();
    let most = fs
        .iter()
        .map(|f| f["self_ns"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(
        fs.iter().find(|f| f["function"] == top).unwrap()["self_ns"],
        most,
        "one thread: its top function is the report's: {t}"
    );
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

/// Slices of one thread nest: each starts and ends within any slice it starts in.
fn check_nesting(spans: &mut [(u64, u64)]) {
    spans.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut open: Vec<(u64, u64)> = Vec::new();
    for &(s, e) in spans.iter() {
        while open.last().is_some_and(|&(_, oe)| oe <= s) {
            open.pop();
        }
        if let Some(&(_, oe)) = open.last() {
            assert!(e <= oe, "slice {s}..{e} overlaps its parent ending at {oe}");
        }
        open.push((s, e));
    }
}

#[test]
fn perfetto_export_read_by_perfettos_protos() {
    let tmp = TempDir::new("perfetto");
    let trace = traced_exits(&tmp);
    let pf = tmp.join("t.pftrace");
    // Perfetto is the default format.
    let out = run(
        Command::new(tracer_bin())
            .arg("export")
            .arg(&trace)
            .arg("-o")
            .arg(&pf),
        TRACE_TIMEOUT,
    )
    .ok();
    assert_eq!(out.stderr_str(), "", "quiet when not on a terminal");
    let s = perfetto_summary(&pf);
    assert_eq!(s["first_sequence_cleared"], true, "{}", s["packets"]);
    assert_eq!(s["open"], serde_json::json!({}), "every slice ends");
    // One process track and one thread track named after the thread, plus the two
    // counter tracks.
    let tracks = s["tracks"].as_array().unwrap();
    let threads: Vec<&serde_json::Value> =
        tracks.iter().filter(|t| t.get("tid").is_some()).collect();
    assert_eq!(threads.len(), 1, "{tracks:?}");
    assert_eq!(threads[0]["thread_name"], "exits.traced");
    let process = tracks
        .iter()
        .find(|t| t.get("process_name").is_some())
        .expect("a process track");
    assert_eq!(threads[0]["parent"], process["uuid"]);
    assert_eq!(threads[0]["pid"], process["pid"]);
    let counters: Vec<&str> = tracks
        .iter()
        .filter(|t| t.get("counter").is_some())
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(counters, ["records dropped", "records filtered"]);
    assert_eq!(s["counters"]["records dropped"], serde_json::json!([0, 0]));
    assert_eq!(s["counters"]["records filtered"], serde_json::json!([0, 0]));
    // Exactly the calls of the program, nested.
    let slices = s["slices"].as_object().unwrap();
    assert_eq!(slices.len(), 1);
    let list = slices.values().next().unwrap().as_array().unwrap();
    for f in FUNCTIONS {
        let n = list.iter().filter(|x| x["name"] == f).count() as u64;
        assert_eq!(n, expected_calls(f), "slices of {f}");
    }
    let mut spans: Vec<(u64, u64)> = list
        .iter()
        .map(|x| (x["start"].as_u64().unwrap(), x["end"].as_u64().unwrap()))
        .collect();
    check_nesting(&mut spans);
    // leaf is called by multi (depth one deeper than multi's).
    let depth_of = |name: &str| -> Vec<u64> {
        let mut d: Vec<u64> = list
            .iter()
            .filter(|x| x["name"] == name)
            .map(|x| x["depth"].as_u64().unwrap())
            .collect();
        d.sort();
        d.dedup();
        d
    };
    let multi = depth_of("multi");
    assert_eq!(multi.len(), 1, "{multi:?}");
    assert!(
        depth_of("leaf").contains(&(multi[0] + 1)),
        "{:?}",
        depth_of("leaf")
    );
}

/// `export --format parquet` read by DuckDB: per site the report's record counts, per
/// function its calls and times, per function the calls the program makes; more rows
/// than a row group holds; an output that is a file is refused and left alone.
#[test]
fn parquet_export_read_by_duckdb() {
    let tmp = TempDir::new("parquet");
    // About 150,000 records: several row groups.
    let n = 20_000;
    let trace = traced_exits_n(&tmp, n);
    let dir = tmp.join("pq");
    run(
        Command::new(tracer_bin())
            .args(["export", "--format", "parquet", "-o"])
            .arg(&dir)
            .arg(&trace),
        TRACE_TIMEOUT,
    )
    .ok();
    let (records, calls) = (dir.join("records.parquet"), dir.join("calls.parquet"));
    let v = report_json(&trace);
    let q = |sql: String| duckdb_rows(&sql);
    let total = q(format!("select count(*) from '{}'", records.display()));
    assert_eq!(total[0][0], v["records"], "records");
    assert!(
        v["records"].as_u64().unwrap() > 2 * 65536,
        "{}",
        v["records"]
    );
    // Per site: binary, site, kind, function, count, as the report counts them.
    let mut by_site = q(format!(
        "select \"binary\", site, kind, function, count(*) from '{}' group by all",
        records.display()
    ));
    let mut want: Vec<Vec<serde_json::Value>> = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            ["binary", "site", "kind", "function", "count"]
                .iter()
                .map(|k| f[k].clone())
                .collect()
        })
        .collect();
    by_site.sort_by_key(|r| r[1].as_u64());
    want.sort_by_key(|r| r[1].as_u64());
    assert_eq!(by_site, want, "records per site");
    // Per function: calls, total (outermost calls), self, min and max.
    let mut by_function = q(format!(
        "select \"binary\", function, count(*), \
                sum(duration_ns) filter (where not reentrant), sum(self_ns), \
                min(duration_ns), max(duration_ns) from '{}' group by all",
        calls.display()
    ));
    let mut want: Vec<Vec<serde_json::Value>> = v["calls"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            [
                "binary", "function", "calls", "total_ns", "self_ns", "min_ns", "max_ns",
            ]
            .iter()
            .map(|k| f[k].clone())
            .collect()
        })
        .collect();
    by_function.sort_by(|a, b| a[1].as_str().cmp(&b[1].as_str()));
    want.sort_by(|a, b| a[1].as_str().cmp(&b[1].as_str()));
    assert_eq!(by_function, want, "calls per function");
    for f in FUNCTIONS {
        let row = by_function.iter().find(|r| r[1] == f);
        assert_eq!(
            row.map(|r| r[2].clone()),
            Some(calls_in(f, n).into()),
            "{f}"
        );
    }
    // leaf's callers: multi for every third call (main and tail are not traced).
    let from_multi = q(format!(
        "select count(*) from '{}' where function = 'leaf' and caller = 'multi' and depth = 1",
        calls.display()
    ));
    assert_eq!(
        from_multi[0][0],
        (0..n).filter(|i| i % 3 == 2).count() as u64
    );
    // An output that is a file is refused, untouched.
    let file = tmp.join("not-a-dir");
    std::fs::write(&file, b"keep").unwrap();
    let out = run(
        Command::new(tracer_bin())
            .args(["export", "--format", "parquet", "-o"])
            .arg(&file)
            .arg(&trace),
        TRACE_TIMEOUT,
    );
    assert_ne!(out.status(), 0, "{}", out.describe());
    assert!(
        out.stderr_str().contains("not a directory"),
        "{}",
        out.describe()
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

/// `record --live` on a terminal (a pty from `script`): frames of the session, the
/// last one (drawn when the file is complete) with every record of the trace and the
/// calls the program makes; not on a terminal, nothing but the summary.
#[test]
fn live_view_on_a_terminal_only() {
    let tmp = TempDir::new("live");
    let n = 200_000;
    let traced = traced_exits_n(&tmp, 10).with_file_name("exits.traced");
    let trace = tmp.join("live.utrace");
    let cmd = format!(
        "{} record --live -o {} -- {} {n}",
        tracer_bin().display(),
        trace.display(),
        traced.display()
    );
    let tty = run(
        Command::new("script").args(["-qec", &cmd, "/dev/null"]),
        TRACE_TIMEOUT,
    )
    .ok();
    let shown = tty.stdout_str();
    let last = shown
        .rsplit("utrace live")
        .next()
        .filter(|_| shown.contains("utrace live"))
        .unwrap_or_else(|| panic!("no frame: {}", tty.describe()));
    assert!(last.contains("(session ended)"), "{last}");
    let v = report_json(&trace);
    let records = format!(" {} records ", v["records"]);
    assert!(
        last.contains(&records),
        "{records:?} in the last frame: {last}"
    );
    assert!(
        last.contains("then: tracer report [--since S --until U] TRACE; tracer report --diff")
            && last.contains("--split SIZE|TIME, --max-size SIZE, --min-duration T"),
        "no help line in the last frame: {last}"
    );
    let size = std::fs::metadata(&trace).unwrap().len();
    let written = format!(" {:.1} MB written", size as f64 / 1e6);
    assert!(
        last.contains(&written),
        "{written:?} (the file's size) in the last frame: {last}"
    );
    // The calls table: calls, self, total, function (binary).
    let calls_table: Vec<&str> = last
        .split("self ms")
        .nth(1)
        .unwrap_or_else(|| panic!("no calls table: {last}"))
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    for f in FUNCTIONS {
        let row = calls_table
            .iter()
            .find(|l| l.trim_end().ends_with(&format!(" {f} (exits.traced)")))
            .unwrap_or_else(|| panic!("no calls row of {f}: {last}"));
        let calls: u64 = row.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(calls, calls_in(f, n), "{row}");
    }
    // Not on a terminal: the summary line only.
    let quiet = run(
        Command::new(tracer_bin())
            .args(["record", "--live", "-o"])
            .arg(tmp.join("quiet.utrace"))
            .arg("--")
            .arg(&traced)
            .arg("10"),
        TRACE_TIMEOUT,
    )
    .ok();
    assert!(
        !quiet.stderr_str().contains("utrace live"),
        "{}",
        quiet.describe()
    );
    assert!(
        quiet.stderr_str().starts_with("utrace: "),
        "{}",
        quiet.describe()
    );
}

#[test]
fn flamegraph_svg_sums_self_time() {
    let tmp = TempDir::new("flamegraph");
    let trace = traced_exits(&tmp);
    let svg = tmp.join("t.svg");
    run(
        Command::new(tracer_bin())
            .arg("flamegraph")
            .arg(&trace)
            .arg("-o")
            .arg(&svg),
        TRACE_TIMEOUT,
    )
    .ok();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"));
    let titles = flamegraph_frames(&text);
    // The whole graph is the self time of every call: what the report sums.
    let v = report_json(&trace);
    let self_total: u64 = v["calls"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["self_ns"].as_u64().unwrap())
        .sum();
    let all = titles.iter().find(|(n, _)| n == "all").expect("root frame");
    assert_eq!(all.1, self_total, "{titles:?}");
    // Every function with at least 1% of the time has a frame (inferno leaves out frames
    // narrower than 0.1 pixel).
    for f in v["calls"]["functions"].as_array().unwrap() {
        let (name, own) = (
            f["function"].as_str().unwrap(),
            f["self_ns"].as_u64().unwrap(),
        );
        if own * 100 >= self_total {
            assert!(
                titles.iter().any(|(n, _)| n == name),
                "{name} not in {titles:?}"
            );
        }
    }
    assert!(titles.iter().any(|(n, _)| n == "multi"), "{titles:?}");
    // A trace without entry/exit pairs is refused with a reason, and nothing written.
    let tmp2 = TempDir::new("flamegraph-none");
    let bad = run(
        Command::new(tracer_bin())
            .arg("flamegraph")
            .arg(tmp2.join("missing.utrace"))
            .arg("-o")
            .arg(tmp2.join("x.svg")),
        TRACE_TIMEOUT,
    );
    assert_eq!(bad.status(), 1, "{}", bad.describe());
    assert!(!tmp2.join("x.svg").exists());
}

#[test]
fn progress_bar_on_a_terminal_only() {
    let tmp = TempDir::new("progress");
    let trace = traced_exits(&tmp);
    // On a terminal (a pty from `script`): a bar naming the job.
    let cmd = format!(
        "{} export {} -o {}",
        tracer_bin().display(),
        trace.display(),
        tmp.join("a.pftrace").display()
    );
    // (Shown at once here: normally only after 0.7 s, so short jobs draw nothing.)
    let tty = run(
        Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("UTRACE_PROGRESS_AFTER_MS", "0"),
        TRACE_TIMEOUT,
    )
    .ok();
    let shown = tty.stdout_str();
    assert!(
        shown.contains(&format!("reading {}", trace.display())),
        "{}",
        tty.describe()
    );
    // A short job on a terminal: nothing (the bar waits 0.7 s).
    let short = run(
        Command::new("script").args(["-qec", &cmd, "/dev/null"]),
        TRACE_TIMEOUT,
    )
    .ok();
    assert!(
        !short.stdout_str().contains("reading"),
        "{}",
        short.describe()
    );
    // Not on a terminal: nothing on stderr, same output.
    let quiet = run(
        Command::new(tracer_bin())
            .arg("export")
            .arg(&trace)
            .arg("-o")
            .arg(tmp.join("b.pftrace")),
        TRACE_TIMEOUT,
    )
    .ok();
    assert_eq!(quiet.stderr_str(), "");
    assert_eq!(
        std::fs::read(tmp.join("a.pftrace")).unwrap(),
        std::fs::read(tmp.join("b.pftrace")).unwrap()
    );
    // The rewriter's bar names its stages and counts functions (on a pty, shown at once).
    let rewrite = format!(
        "{} {} -o {} --sites entry,exit",
        rewriter_bin().display(),
        tmp.join("exits").display(),
        tmp.join("exits.again").display()
    );
    let tty = run(
        Command::new("script")
            .args(["-qec", &rewrite, "/dev/null"])
            .env("UTRACE_PROGRESS_AFTER_MS", "0"),
        TRACE_TIMEOUT,
    )
    .ok();
    let shown = tty.stdout_str();
    for stage in ["finding sites", "planning", "writing"] {
        assert!(shown.contains(stage), "{stage}: {}", tty.describe());
    }
    assert!(shown.contains(" functions"), "{}", tty.describe());
}
