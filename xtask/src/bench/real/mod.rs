//! `bench` real section: a real program with every function's entry and exit traced,
//! end to end, side by side with uftrace in one run. The program is the sqlite3 CLI
//! (`sqlite.rs`) running `--real-rows` single-row INSERTs and queries on `:memory:`;
//! rows: untraced, `tracer record` (entries and exits; entries only), `uftrace record`
//! of a `-pg` build (entries and exits, its default lossless mode), LTTng-UST's
//! cyg-profile-fast where it is installed (`lttng.rs`). Per row: wall time,
//! slowdown, records, records lost, trace bytes per record, the tracer's own CPU
//! seconds (its threads, not the program's), and the program's output checked against
//! the untraced run's. `--real-baseline DIR` adds the `tracer record` rows of another
//! build (its `target/release`), so a change is measured against its base in one run.
//! The python section (`python.rs`): python3.11's own functions by name, beside
//! bpftrace.

mod lttng;
mod python;
mod sqlite;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::process::{Run, measured};
use crate::util::{self, cmd};

/// One row of the table.
struct Row {
    name: String,
    run: Run,
    records: Option<u64>,
    lost: Option<u64>,
    trace_bytes: Option<u64>,
}

/// The rewriter and tracer of one build.
struct Tools {
    rewriter: PathBuf,
    tracer: PathBuf,
    /// Appended to the row names ("" for this build).
    label: String,
}

impl Tools {
    fn of(dir: &Path, label: &str) -> Result<Tools> {
        let t = Tools {
            rewriter: dir.join("rewriter"),
            tracer: dir.join("tracer"),
            label: label.into(),
        };
        for p in [&t.rewriter, &t.tracer] {
            if !util::is_executable(p) {
                bail!(
                    "{}: no such program (--real-baseline wants a target/release)",
                    p.display()
                );
            }
        }
        Ok(t)
    }
}

pub fn real(rows: u64, baseline: Option<&Path>) -> Result<()> {
    println!();
    println!("== real program: sqlite3 {rows} INSERTs + queries, every function traced");
    if !util::is_root() {
        println!("skipped: `tracer record` needs root (BPF, uprobes)");
        return Ok(());
    }
    let dir = util::target_dir().join("xtask/bench-real");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let b = sqlite::build(&dir)?;
    let sql = dir.join("workload.sql");
    std::fs::write(&sql, sqlite::script(rows)).context("workload.sql")?;
    let args = |c: &mut Command| {
        c.arg(":memory:").arg(format!(".read {}", sql.display()));
    };
    let base = program(&b.plain, args)?;
    let mut table = vec![Row {
        name: "untraced".into(),
        run: base,
        records: None,
        lost: None,
        trace_bytes: None,
    }];
    let mut builds = vec![Tools::of(&util::release_dir(), "")?];
    if let Some(d) = baseline {
        builds.push(Tools::of(d, " (baseline)")?);
    }
    for (name, sites, time) in [
        ("tracer record, entry+exit", "entry,exit", "record"),
        (
            "tracer record, entry+exit, coarse time",
            "entry,exit",
            "coarse",
        ),
        ("tracer record, entries only", "entry", "record"),
    ] {
        for t in &builds {
            let row = utrace(&dir, t, &b.plain, (sites, time), args)?;
            table.push(Row {
                name: format!("{name}{}", t.label),
                ..row
            });
        }
    }
    match util::which("uftrace") {
        Some(_) => table.push(uftrace(&dir, &b.pg, args)?),
        None => println!("uftrace: not installed (cargo xtask setup installs it)"),
    }
    table.extend(lttng::row(&dir, &b.fi, args)?);
    check_outputs(&table)?;
    print(&table);
    Ok(())
}

/// The python section (`python.rs`): fib.py's argument, about 0.6 M calls.
pub fn python() -> Result<()> {
    python::rows(27)
}

fn program(bin: &Path, args: impl Fn(&mut Command)) -> Result<Run> {
    let mut c = cmd(bin);
    args(&mut c);
    measured(&mut c)
}

/// Rewrite with `sites` and timestamps `time` and run under `tracer record`.
fn utrace(
    dir: &Path,
    tools: &Tools,
    plain: &Path,
    (sites, time): (&str, &str),
    args: impl Fn(&mut Command),
) -> Result<Row> {
    let traced = dir.join(format!("sqlite3.{}.{time}", sites.replace(',', "-")));
    util::run(
        cmd(&tools.rewriter)
            .arg(plain)
            .arg("-o")
            .arg(&traced)
            .args(["--sites", sites, "--time", time]),
    )?;
    let trace = dir.join("sqlite3.utrace");
    let _ = std::fs::remove_file(&trace);
    let mut c = cmd(&tools.tracer);
    c.arg("record")
        .arg("-o")
        .arg(&trace)
        .env("UTRACE_DEBUG_CACHE", dir.join("debug-cache"))
        .arg("--")
        .arg(&traced);
    args(&mut c);
    let run = measured(&mut c)?;
    let (records, dropped) = summary_line(&run.stderr)?;
    let trace_bytes = std::fs::metadata(&trace).map(|m| m.len()).ok();
    let _ = std::fs::remove_file(&trace);
    Ok(Row {
        name: String::new(),
        run,
        records: Some(records),
        lost: Some(dropped),
        trace_bytes,
    })
}

/// `utrace: N records from T threads, D dropped -> FILE` (the tracer's last words).
fn summary_line(stderr: &str) -> Result<(u64, u64)> {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("utrace: ") && l.contains(" records from "))
        .with_context(|| format!("no summary line from tracer record: {stderr}"))?;
    let num = |w: &str| -> Option<u64> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words.iter().position(|x| *x == w)?;
        words
            .get(i.checked_sub(1)?)?
            .trim_end_matches(',')
            .parse()
            .ok()
    };
    match (num("records"), num("dropped")) {
        (Some(r), Some(d)) => Ok((r, d)),
        _ => bail!("cannot read the summary line {line:?}"),
    }
}

/// `uftrace record` of the `-pg` build: records = data bytes / 16 (its record size:
/// time and packed type/depth/address, no arguments recorded); losses are what its
/// record command reports.
fn uftrace(dir: &Path, pg: &Path, args: impl Fn(&mut Command)) -> Result<Row> {
    let data = dir.join("uftrace.data");
    let _ = std::fs::remove_dir_all(&data);
    let mut c = cmd("uftrace");
    c.arg("record").arg("-d").arg(&data).arg(pg);
    args(&mut c);
    let run = measured(&mut c)?;
    let bytes = dat_bytes(&data)?;
    let lost = lost_records(&run.stderr);
    let _ = std::fs::remove_dir_all(&data);
    Ok(Row {
        name: "uftrace record (-pg), entry+exit".into(),
        run,
        records: Some(bytes / 16),
        lost: Some(lost),
        trace_bytes: Some(bytes),
    })
}

fn dat_bytes(data: &Path) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(data).with_context(|| format!("{}", data.display()))? {
        let p: PathBuf = e?.path();
        if p.extension().is_some_and(|x| x == "dat") {
            n += std::fs::metadata(&p)?.len();
        }
    }
    Ok(n)
}

/// uftrace's "LOST N records" messages, summed.
fn lost_records(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|x| x.eq_ignore_ascii_case("lost"))?;
            w.get(i + 1)?.parse::<u64>().ok()
        })
        .sum()
}

/// Every traced run must print what the untraced one printed.
fn check_outputs(table: &[Row]) -> Result<()> {
    let want = &table[0].run.stdout;
    for r in &table[1..] {
        if &r.run.stdout != want {
            bail!(
                "{}: output differs from the untraced run:\n{}\n---\n{want}",
                r.name,
                r.run.stdout
            );
        }
    }
    Ok(())
}

fn print(table: &[Row]) {
    let base = table[0].run.wall_s;
    println!(
        "{:<45} {:>8} {:>9} {:>12} {:>10} {:>9} {:>6} {:>11} {:>10}",
        "run",
        "wall s",
        "slowdown",
        "records",
        "lost",
        "trace MB",
        "B/rec",
        "tracer CPU",
        "all CPU"
    );
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for r in table {
        let per_rec = match (r.trace_bytes, r.records) {
            (Some(b), Some(n)) if n > 0 => format!("{:.1}", b as f64 / n as f64),
            _ => "-".into(),
        };
        let tracer_cpu = if r.trace_bytes.is_some() {
            format!("{:.2}", r.run.own_cpu_s)
        } else {
            "-".into()
        };
        println!(
            "{:<45} {:>8.2} {:>8.1}x {:>12} {:>10} {:>9} {:>6} {:>11} {:>10.2}",
            r.name,
            r.run.wall_s,
            r.run.wall_s / base,
            opt(r.records),
            opt(r.lost),
            r.trace_bytes
                .map_or("-".into(), |b| format!("{:.0}", b as f64 / 1e6)),
            per_rec,
            tracer_cpu,
            r.run.all_cpu_s
        );
    }
    println!("output of every traced run identical to the untraced run's");
    println!(
        "targets (issue 13): slowdown <= 3x, 0 lost, <= 8 B/record, tracer CPU <= the program's"
    );
}
