//! `bench` readers section: how fast and in how much memory a big trace is read back —
//! `tracer report`, `tracer export --format perfetto` and `--format parquet` (streamed:
//! memory must stay flat whatever the trace's size) and `tracer flamegraph`, on one trace of
//! `--readers-records` records (xtask/bench/calls.c: nested calls, every entry and exit
//! traced). Per reader: wall time, CPU time, peak RSS (the child's own `wait4` rusage),
//! records per second and output bytes per record; then `tracer report --since --until`
//! of the middle tenth of the records' time span (its records a second per row: how much
//! of the full read a range costs). Then `tracer report` of a trace of as
//! many records where 10 % of the calls are left by a `longjmp` and end where it lands
//! (the landing record at `setjmp`'s return in `main`; xtask/bench/unwind.c): target
//! ≥ 5 M records/s.

use std::path::Path;

use anyhow::{Context, Result};

use super::process::measured;
use crate::util::{self, cmd};

/// Records per iteration of calls.c (outer, inner, inner: an entry and an exit each).
const RECORDS_PER_ITERATION: u64 = 6;

pub(super) fn readers(records: u64) -> Result<()> {
    println!();
    println!("== readers: report, Perfetto export and flame graph of a big trace");
    if !util::is_root() {
        println!("skipped: `tracer record` needs root (BPF, uprobes)");
        return Ok(());
    }
    let (dir, traced) = super::workload::build_workload(
        "calls",
        &["-O2", "-g"],
        &["--sites", "entry,exit", "--functions", "inner", "outer"],
    )?;
    let trace = dir.join("calls.utrace");
    let iterations = records.div_ceil(RECORDS_PER_ITERATION);
    record(&trace, &traced, iterations)?;
    let report = util::output_ok(
        cmd(crate::tracer_bin())
            .arg("report")
            .arg("--json")
            .arg(&trace),
    )?;
    let v: serde_json::Value = serde_json::from_str(&report).context("report --json")?;
    let n = v["records"].as_u64().unwrap_or(0);
    let dropped = v["dropped"].as_u64().unwrap_or(0);
    let trace_bytes = std::fs::metadata(&trace)?.len();
    println!(
        "trace: {n} records ({dropped} dropped), {:.1} MB, {} calls",
        trace_bytes as f64 / 1e6,
        iterations * 3
    );
    let span = v["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| Some((t["first_ns"].as_u64()?, t["last_ns"].as_u64()?)))
        .fold(None, |acc: Option<(u64, u64)>, (a, b)| {
            Some(acc.map_or((a, b), |(x, y)| (x.min(a), y.max(b))))
        })
        .context("report --json: no thread time span")?;
    time_readers(&dir, &trace, n, span)?;
    unwound(records)
}

/// `tracer report` of the middle tenth of `span` (CLOCK_MONOTONIC ns): wall and CPU
/// time, and its records (from its `--json`).
fn time_range(trace: &Path, (first, last): (u64, u64), n: u64) -> Result<()> {
    let tenth = (last - first) / 10;
    let (since, until) = (
        format!("@{}", first + 9 * tenth / 2),
        format!("@{}", first + 11 * tenth / 2),
    );
    let mut c = cmd(crate::tracer_bin());
    c.args(["report", "--json", "--since", &since, "--until", &until])
        .arg(trace);
    let u = measured(&mut c)?;
    let v: serde_json::Value = serde_json::from_str(&u.stdout).context("report --json")?;
    let k = v["records"].as_u64().unwrap_or(0);
    println!(
        "{:<22} {:>9.2} {:>9.2} {:>12.2} {:>12.1} {:>12}",
        "report, a tenth",
        u.wall_s,
        u.all_cpu_s,
        k as f64 / u.wall_s / 1e6,
        u.max_rss_kib as f64 / 1024.0,
        "-"
    );
    println!(
        "  (--since/--until: {k} of {n} records, {:.1} %)",
        k as f64 * 100.0 / n.max(1) as f64
    );
    Ok(())
}

/// Each reader of `trace` (`n` records) timed, a row each; the big outputs removed.
fn time_readers(dir: &Path, trace: &Path, n: u64, span: (u64, u64)) -> Result<()> {
    println!(
        "{:<22} {:>9} {:>9} {:>12} {:>12} {:>12}",
        "reader", "wall s", "CPU s", "M rec/s", "peak RSS MB", "out B/rec"
    );
    let pftrace = dir.join("calls.pftrace");
    let svg = dir.join("calls.svg");
    let parquet = dir.join("calls.parquet");
    let rows: [(&str, Vec<&std::ffi::OsStr>, Option<&Path>); 4] = [
        ("report", vec!["report".as_ref(), trace.as_os_str()], None),
        (
            "export --format perfetto",
            vec![
                "export".as_ref(),
                trace.as_os_str(),
                "--format".as_ref(),
                "perfetto".as_ref(),
                "-o".as_ref(),
                pftrace.as_os_str(),
            ],
            Some(&pftrace),
        ),
        (
            "export --format parquet",
            vec![
                "export".as_ref(),
                trace.as_os_str(),
                "--format".as_ref(),
                "parquet".as_ref(),
                "-o".as_ref(),
                parquet.as_os_str(),
            ],
            Some(&parquet),
        ),
        (
            "flamegraph",
            vec![
                "flamegraph".as_ref(),
                trace.as_os_str(),
                "-o".as_ref(),
                svg.as_os_str(),
            ],
            Some(&svg),
        ),
    ];
    for (name, args, out) in rows {
        let u = measured(cmd(crate::tracer_bin()).args(&args))?;
        let out_per_rec = match out {
            Some(p) => format!("{:.1}", bytes_of(p)? as f64 / n.max(1) as f64),
            None => "-".into(),
        };
        println!(
            "{name:<22} {:>9.2} {:>9.2} {:>12.2} {:>12.1} {:>12}",
            u.wall_s,
            u.all_cpu_s,
            n as f64 / u.wall_s / 1e6,
            u.max_rss_kib as f64 / 1024.0,
            out_per_rec
        );
    }
    time_range(trace, span, n)?;
    // The big outputs are not kept.
    for p in [trace, pftrace.as_path()] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(&parquet);
    Ok(())
}

/// Records per iteration of unwind.c, on average: 8 and a landing (`setjmp` returns),
/// or 6 and two landings in the 3 of 20 that longjmp.
const UNWIND_RECORDS_PER_ITERATION: f64 = (17.0 * 9.0 + 3.0 * 8.0) / 20.0;
/// The readers' target on it, M records/s.
const UNWIND_TARGET: f64 = 5.0;

/// `tracer report` of a trace with calls left by a `longjmp`.
fn unwound(records: u64) -> Result<()> {
    let (dir, traced) = super::workload::build_workload(
        "unwind",
        &["-O2", "-g"],
        &[
            "--sites",
            "entry,exit",
            "--functions",
            "inner",
            "outer",
            "note",
            "main",
        ],
    )?;
    let trace = dir.join("unwind.utrace");
    let iterations = (records as f64 / UNWIND_RECORDS_PER_ITERATION) as u64;
    record(&trace, &traced, iterations)?;
    let u = measured(
        cmd(crate::tracer_bin())
            .args(["report", "--json"])
            .arg(&trace),
    )?;
    let v: serde_json::Value = serde_json::from_str(&u.stdout).context("report --json")?;
    let n = v["records"].as_u64().unwrap_or(0);
    let rate = n as f64 / u.wall_s / 1e6;
    println!(
        "report, 10 % of calls unwound: {n} records ({} calls left by unwinding, {} left open), {:.2} s, {rate:.2} M rec/s, peak RSS {:.1} MB (target >= {UNWIND_TARGET} M rec/s: {})",
        v["calls"]["unwound"],
        v["calls"]["unfinished"],
        u.wall_s,
        u.max_rss_kib as f64 / 1024.0,
        if rate >= UNWIND_TARGET {
            "met"
        } else {
            "NOT MET"
        }
    );
    let _ = std::fs::remove_file(&trace);
    Ok(())
}

/// `tracer record` of `traced ITERATIONS` into `trace`, with a ring buffer that takes
/// the flood.
fn record(trace: &Path, traced: &Path, iterations: u64) -> Result<()> {
    util::run(
        cmd(crate::tracer_bin())
            .args(["record", "--ring-bytes", "256M", "-o"])
            .arg(trace)
            .arg("--")
            .arg(traced)
            .arg(iterations.to_string()),
    )
}

/// Bytes of a file, or of the files in a directory (the Parquet export).
fn bytes_of(p: &Path) -> Result<u64> {
    if !p.is_dir() {
        return Ok(std::fs::metadata(p)?.len());
    }
    let mut n = 0;
    for e in std::fs::read_dir(p)? {
        n += e?.metadata()?.len();
    }
    Ok(n)
}
