//! `bench` real section: a real program with every function's entry and exit traced,
//! end to end, against the hand-written limit and the peers in one run. The program is
//! the sqlite3 CLI (`sqlite.rs`) running `--real-rows` single-row INSERTs and queries on
//! `:memory:`. Rows: untraced (gcc, and clang for the limit rows); the limit
//! (`limit_hooks.c`: clang's `-finstrument-functions-after-inlining` hooks storing
//! 16-byte records through an initial-exec TLS pointer, with and without the TSC, no
//! drain); per mode (entry+exit with time stamps, coarse time, entries only) the
//! rewritten binary with no tracer (its stubs alone: the flush code resets the buffer)
//! and under `tracer record`; the headline mode under `--min-duration 0` and `10us`
//! (the duration filter judging every call); `uftrace record` of a `-pg` build (its default lossless
//! mode); LTTng-UST's cyg-profile-fast (`lttng.rs`); LLVM XRay in FDR and basic modes
//! (`xray.rs`). Every row runs `--real-rounds` times, interleaved, and shows its median.
//! Per row: wall time, slowdown, records, records lost, trace bytes per record, the
//! tracer's own CPU seconds, and the program's output checked against the untraced
//! run's; then the issue-29 figures (`ratios.rs`): ns a record over the untraced build
//! of the same compiler, stubs ÷ limit, traced ÷ stubs, slowdowns of the peers ÷ ours.
//! `--real-baseline DIR` adds the rewritten rows of another build (its
//! `target/release`), so a change is measured against its base in one run.
//! `--real-profile` then profiles one more session of each mode (`breakdown.rs`): ns a
//! record per stage of the record's path.
//! The python section (`python.rs`): python3.11's own functions by name, beside
//! bpftrace. The memtrace section (`memtrace.rs`, `lackey.rs`): every memory access of
//! the same sqlite3 traced, beside valgrind's lackey.

mod breakdown;
mod lackey;
mod lttng;
mod memtrace;
mod python;
mod ratios;
mod sqlite;
mod xray;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::process::{Run, measured};
use crate::util::{self, cmd};

pub(crate) use memtrace::{Options as MemtraceOptions, memtrace};

/// The bench's plain sqlite3 (built and cached in `target/xtask/bench-real`).
pub(crate) fn sqlite3() -> Result<PathBuf> {
    let dir = util::target_dir().join("xtask/bench-real");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    sqlite::plain(&dir)
}

/// One row of the table.
pub(super) struct Row {
    pub(super) name: String,
    pub(super) run: Run,
    pub(super) records: Option<u64>,
    pub(super) lost: Option<u64>,
    pub(super) trace_bytes: Option<u64>,
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

pub(super) fn real(rows: u64, rounds: usize, baseline: Option<&Path>, profile: bool) -> Result<()> {
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
    let read = format!(".read {}", sql.display());
    let read = read.as_str();
    let args = move |c: &mut Command| {
        c.arg(":memory:").arg(read);
    };
    let mut builds = vec![Tools::of(&util::release_dir(), "")?];
    if let Some(d) = baseline {
        builds.push(Tools::of(d, " (baseline)")?);
    }
    let mut stubs = Vec::new();
    for (mode, sites, time) in ratios::MODES {
        for t in &builds {
            stubs.push((mode, t, rewritten(&dir, t, &b.plain, (sites, time))?));
        }
    }
    let cases = cases(&dir, &b, &stubs, args);
    let table = rounds_of(&cases, rounds)?;
    check_outputs(&table)?;
    print(&table);
    ratios::print(&table);
    if profile {
        for (mode, t, bin) in stubs.iter().filter(|(_, t, _)| t.label.is_empty()) {
            let name = format!("{}{mode}", ratios::TRACED);
            breakdown::print(&dir, &t.tracer, bin, &name, &args)?;
        }
    }
    Ok(())
}

/// A row's name and how to run it once.
type Case<'a, T = Row> = (String, Box<dyn Fn() -> Result<Option<T>> + 'a>);

/// A row's wall time (the rounds keep each row's median).
trait Timed {
    fn wall_s(&self) -> f64;
}

impl Timed for Row {
    fn wall_s(&self) -> f64 {
        self.run.wall_s
    }
}

/// A mode's binary rewritten by one build's rewriter.
type Rewritten<'a> = (&'static str, &'a Tools, PathBuf);

/// Every row of the table.
fn cases<'a>(
    dir: &'a Path,
    b: &'a sqlite::Builds,
    stubs: &'a [Rewritten<'a>],
    args: impl Fn(&mut Command) + Copy + 'a,
) -> Vec<Case<'a>> {
    let plain = |name: &str, bin: &'a Path| -> Case<'a> {
        let name = name.to_string();
        (
            name.clone(),
            Box::new(move || Ok(Some(plain_row(&name, bin, args)?))),
        )
    };
    let mut cases = vec![
        plain(ratios::UNTRACED, &b.plain),
        plain(ratios::UNTRACED_CLANG, &b.clang),
        plain(ratios::LIMIT_TSC, &b.limit),
        plain(ratios::LIMIT_NO_TSC, &b.limit_no_tsc),
    ];
    for (mode, t, bin) in stubs {
        cases.push(plain(&format!("{}{mode}{}", ratios::STUBS, t.label), bin));
        let name = format!("{}{mode}{}", ratios::TRACED, t.label);
        cases.push((
            name.clone(),
            Box::new(move || Ok(Some(utrace(dir, t, bin, &name, &[], args)?))),
        ));
    }
    // The duration filter on the headline binary: judging every call (0 keeps them
    // all), and keeping the calls of 10 us and more.
    if let Some((mode, t, bin)) = stubs.first() {
        for threshold in ["0", "10us"] {
            let name = format!("{}{mode}, --min-duration {threshold}", ratios::TRACED);
            cases.push((
                name.clone(),
                Box::new(move || {
                    let flags = ["--min-duration", threshold];
                    Ok(Some(utrace(dir, t, bin, &name, &flags, args)?))
                }),
            ));
        }
    }
    match util::which("uftrace") {
        Some(_) => cases.push((
            ratios::UFTRACE.into(),
            Box::new(move || Ok(Some(uftrace(dir, &b.pg, args)?))),
        )),
        None => println!("uftrace: not installed (cargo xtask setup installs it)"),
    }
    cases.push((
        "LTTng".into(),
        Box::new(move || lttng::row(dir, &b.fi, args)),
    ));
    for mode in ["fdr", "basic"] {
        cases.push((
            format!("{}{mode}", ratios::XRAY),
            Box::new(move || Ok(Some(xray::row(dir, &b.xray, mode, args)?))),
        ));
    }
    cases
}

/// Run every case `rounds` times, interleaved (round by round, so a slow phase of the
/// machine touches every row alike); each row is its run of median wall time.
fn rounds_of<T: Timed>(cases: &[Case<T>], rounds: usize) -> Result<Vec<T>> {
    let mut runs: Vec<Vec<T>> = cases.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds.max(1) {
        println!("round {} of {}", round + 1, rounds.max(1));
        for ((_, run), got) in cases.iter().zip(&mut runs) {
            got.extend(run()?);
        }
    }
    Ok(runs
        .into_iter()
        .filter_map(|mut got| {
            got.sort_by(|a, b| a.wall_s().total_cmp(&b.wall_s()));
            let mid = got.len() / 2;
            (!got.is_empty()).then(|| got.swap_remove(mid))
        })
        .collect())
}

/// The python section (`python.rs`): fib.py's argument, about 0.6 M calls.
pub(super) fn python() -> Result<()> {
    python::rows(27)
}

/// A program run on its own: records are what it says it made (the limit's
/// "limit: N records"), if anything.
fn plain_row(name: &str, bin: &Path, args: impl Fn(&mut Command)) -> Result<Row> {
    let mut c = cmd(bin);
    args(&mut c);
    let run = measured(&mut c)?;
    let records = run.stderr.lines().find_map(|l| {
        l.strip_prefix("limit: ")?
            .strip_suffix(" records")?
            .parse()
            .ok()
    });
    Ok(Row {
        name: name.into(),
        run,
        records,
        lost: None,
        trace_bytes: None,
    })
}

/// `plain` rewritten by `tools` with `sites` and timestamps `time`.
fn rewritten(
    dir: &Path,
    tools: &Tools,
    plain: &Path,
    (sites, time): (&str, &str),
) -> Result<PathBuf> {
    let slug = tools.label.trim().trim_matches(['(', ')']);
    let traced = dir.join(format!("sqlite3.{}.{time}{slug}", sites.replace(',', "-")));
    util::run(
        cmd(&tools.rewriter)
            .arg(plain)
            .arg("-o")
            .arg(&traced)
            .args(["--sites", sites, "--time", time]),
    )?;
    Ok(traced)
}

/// The rewritten program under `tracer record`.
fn utrace(
    dir: &Path,
    tools: &Tools,
    traced: &Path,
    name: &str,
    flags: &[&str],
    args: impl Fn(&mut Command),
) -> Result<Row> {
    let trace = dir.join("sqlite3.utrace");
    let _ = std::fs::remove_file(&trace);
    let mut c = cmd(&tools.tracer);
    record_args(&mut c, dir, &trace, traced, flags);
    args(&mut c);
    let run = measured(&mut c)?;
    let (records, dropped) = summary_line(&run.stderr)?;
    let trace_bytes = std::fs::metadata(&trace).map(|m| m.len()).ok();
    let _ = std::fs::remove_file(&trace);
    Ok(Row {
        name: name.into(),
        run,
        records: Some(records),
        lost: Some(dropped),
        trace_bytes,
    })
}

/// `record FLAGS -o TRACE -- TRACED` (the program's arguments follow), for a tracer
/// command.
fn record_args(c: &mut Command, dir: &Path, trace: &Path, traced: &Path, flags: &[&str]) {
    c.arg("record")
        .args(flags)
        .arg("-o")
        .arg(trace)
        .env("UTRACE_DEBUG_CACHE", dir.join("debug-cache"))
        .arg("--")
        .arg(traced);
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
        name: ratios::UFTRACE.into(),
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
        "{:<58} {:>8} {:>9} {:>12} {:>10} {:>9} {:>6} {:>11} {:>10}",
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
        // Rows with books of their own are a tracer's: its CPU apart from the program's.
        let tracer_cpu = if r.lost.is_some() {
            format!("{:.2}", r.run.own_cpu_s)
        } else {
            "-".into()
        };
        println!(
            "{:<58} {:>8.2} {:>8.1}x {:>12} {:>10} {:>9} {:>6} {:>11} {:>10.2}",
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
    println!("targets: 0 lost, <= 6 B/record, tracer CPU < the program's");
}
