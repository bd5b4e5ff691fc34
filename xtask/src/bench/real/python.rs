//! `bench` python section: Debian's python3.11 running `xtask/bench/fib.py`, its USDT
//! probes (every function entry and return, every line) named by the tracer (`--sites
//! usdt`: inline records, strings read by the drains) and by bpftrace (a uprobe per
//! probe, strings read at each event, as `bpftrace -e 'usdt:… { @[str(arg0),
//! str(arg1), arg2] = count() }'` names them). Every run is made twice, with fib(N)
//! and with fib(1), so that start-up (attaching, loading, verifying) is apart from the
//! cost per probe event; both must count the same calls of `fib`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::super::process::{Run, measured};
use crate::util::{self, cmd};

const PYTHON: &str = "/usr/bin/python3.11";

/// A way of running the script: its runs with fib(N) and fib(1), and what it counted.
struct Row {
    name: String,
    full: Run,
    small: Run,
    /// Calls of fib, as the tool counted them.
    fib: Option<u64>,
}

/// The rows, printed; skipped (saying so) without python3.11 or root.
pub(super) fn rows(n: u32) -> Result<()> {
    println!();
    println!("== python3.11 fib({n}): every Python call and line by name");
    if !Path::new(PYTHON).is_file() || !util::is_root() {
        println!("skipped: needs {PYTHON} and root");
        return Ok(());
    }
    let dir = util::target_dir().join("xtask/bench-python");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let script = util::workspace_root().join("xtask/bench/fib.py");
    let base = Row {
        name: "untraced".into(),
        full: measured(cmd(PYTHON).arg(&script).arg(n.to_string()))?,
        small: measured(cmd(PYTHON).arg(&script).arg("1"))?,
        fib: None,
    };
    let mut table = vec![];
    for records in ["4096", "256"] {
        table.push(utrace(&dir, &script, n, records)?);
    }
    let mut events = None;
    match util::which("bpftrace") {
        Some(bt) => {
            let (row, e) = bpftrace(&bt, &script, n)?;
            table.push(row);
            events = Some(e);
        }
        None => println!("bpftrace: not installed (cargo xtask setup installs it)"),
    }
    print(&base, &table, events)
}

fn print(base: &Row, table: &[Row], events: Option<u64>) -> Result<()> {
    let fibs: Vec<u64> = table.iter().filter_map(|r| r.fib).collect();
    if fibs.windows(2).any(|w| w[0] != w[1]) {
        bail!("the runs count different calls of fib: {fibs:?}");
    }
    println!(
        "{:<38} {:>7} {:>9} {:>9} {:>7} {:>10} {:>9} {:>9}",
        "run", "wall s", "slowdown", "start-up", "fib s", "fib calls", "ns/event", "session"
    );
    let (base_s, base_fib) = (
        base.full.wall_s - base.small.wall_s,
        fib_seconds(&base.full)?,
    );
    for r in std::iter::once(base).chain(table) {
        // bpftrace adds blank lines of its own.
        if r.full.stdout.trim() != base.full.stdout.trim() {
            bail!(
                "{}: output differs: {} vs {}",
                r.name,
                r.full.stdout,
                base.full.stdout
            );
        }
        let fib_s = fib_seconds(&r.full)?;
        let per_event = |s: f64| match events {
            Some(e) if r.fib.is_some() => format!("{:.0}", s * 1e9 / e as f64),
            _ => "-".into(),
        };
        println!(
            "{:<38} {:>7.2} {:>8.1}x {:>9.2} {:>7.2} {:>10} {:>9} {:>9}",
            r.name,
            r.full.wall_s,
            r.full.wall_s / base.full.wall_s,
            r.small.wall_s,
            fib_s,
            r.fib.map_or("-".into(), |f| f.to_string()),
            per_event(fib_s - base_fib),
            per_event(r.full.wall_s - r.small.wall_s - base_s),
        );
    }
    if let Some(e) = events {
        println!(
            "ns/event: the calls' own time over the untraced run's, per probe firing ({e}: \
             function entries, returns and lines, bpftrace's count); session: the same for \
             the whole wall time less start-up (the fib(1) run), so with the tracer's end; \
             both include the interpreter's own work for each enabled probe"
        );
    }
    Ok(())
}

/// The seconds fib.py says its calls took (its last `fib_seconds=` line on stderr).
fn fib_seconds(r: &Run) -> Result<f64> {
    r.stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("fib_seconds="))
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("fib.py printed no time: {}", r.stderr))
}

/// The interpreter rewritten with `--sites usdt --buffer-records records`, under
/// `tracer record`.
fn utrace(dir: &Path, script: &Path, n: u32, records: &str) -> Result<Row> {
    let traced = dir.join(format!("python3.11.usdt.{records}"));
    util::run(
        cmd(util::release_dir().join("rewriter"))
            .arg(PYTHON)
            .arg("-o")
            .arg(&traced)
            .args(["--sites", "usdt", "--buffer-records", records]),
    )?;
    let tracer = util::release_dir().join("tracer");
    let trace = dir.join("python.utrace");
    let run = |arg: String| -> Result<Run> {
        let _ = std::fs::remove_file(&trace);
        measured(
            cmd(&tracer)
                .arg("record")
                .arg("-o")
                .arg(&trace)
                .arg("--")
                .arg(&traced)
                .arg(script)
                .arg(arg),
        )
    };
    let small = run("1".into())?;
    let full = run(n.to_string())?;
    let fib = fib_calls(&tracer, &trace, script)?;
    let _ = std::fs::remove_file(&trace);
    Ok(Row {
        name: format!("tracer record, --buffer-records {records}"),
        full,
        small,
        fib: Some(fib),
    })
}

/// Completed calls of `fib` in the trace's report.
fn fib_calls(tracer: &PathBuf, trace: &Path, script: &Path) -> Result<u64> {
    let out = util::output_ok(cmd(tracer).arg("report").arg("--json").arg(trace))?;
    let v: serde_json::Value = serde_json::from_str(&out).context("report --json")?;
    let name = format!("{}:fib:8", script.display());
    v["calls"]["functions"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["function"] == name.as_str()))
        .and_then(|f| f["calls"].as_u64())
        .with_context(|| format!("no {name} in the report"))
}

/// bpftrace on the untouched interpreter: every probe enabled (as the tracer raises
/// every semaphore; CPython 3.11 fires function__entry for Python-to-Python calls only
/// while `line` is enabled), calls counted by their strings; its maps go to stderr.
/// Also the probe firings of the fib(N) run beyond the fib(1) run's.
fn bpftrace(bt: &Path, script: &Path, n: u32) -> Result<(Row, u64)> {
    let p = PYTHON;
    let prog = format!(
        "usdt:{p}:python:function__entry {{ @[str(arg0), str(arg1), arg2] = count(); \
         @events = count(); }} \
         usdt:{p}:python:function__return, usdt:{p}:python:line, usdt:{p}:python:audit, \
         usdt:{p}:python:gc__start, usdt:{p}:python:gc__done, \
         usdt:{p}:python:import__find__load__start, \
         usdt:{p}:python:import__find__load__done {{ @events = count(); }}"
    );
    let run = |arg: u32| -> Result<Run> {
        measured(
            cmd(bt)
                .args(["-q", "-o", "/dev/stderr", "-e", &prog, "-c"])
                .arg(format!("{p} {} {arg}", script.display()))
                .env("BPFTRACE_STRLEN", "120"),
        )
    };
    let count = |r: &Run, what: &str| -> Result<u64> {
        r.stderr
            .lines()
            .find(|l| l.starts_with(what))
            .and_then(|l| l.rsplit(": ").next()?.trim().parse().ok())
            .with_context(|| format!("bpftrace printed no {what}: {}", r.stderr))
    };
    let (small, full) = (run(1)?, run(n)?);
    let fib = count(&full, &format!("@[{}, fib, 8]", script.display()))?;
    let events = count(&full, "@events")? - count(&small, "@events")?;
    let row = Row {
        name: "bpftrace, str() of file and function".into(),
        full,
        small,
        fib: Some(fib),
    };
    Ok((row, events))
}
