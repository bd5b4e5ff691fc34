//! `bench --only memtrace`: the bench's sqlite3 (`sqlite.rs`, the plain gcc build) with
//! every memory access traced (`rewriter --sites memory --time coarse`), side by side in
//! one run, in interleaved rounds (each row its median): untraced; the `--no-batch`
//! stubs (one stub and one record an access) alone (no tracer: the flush resets the
//! buffer) and under `tracer record`; the default stubs (access runs) alone and under
//! `tracer record`; valgrind's lackey with `--trace-mem=yes` on the untraced build
//! (`lackey.rs`; fewer rows, beside an untraced run of the same rows; first round only).
//!
//! Per row: wall time, slowdown over the untraced run of the same rows, accesses (utrace:
//! the lines of `tracer dump`, which shows one line an access however records pack them,
//! counted once per binary; lackey: its data lines in sqlite's own code), records and
//! records lost (the tracer's summary line), bytes an access on disk, the binary's size
//! and growth, ns an access over untraced, and the output checked against the untraced
//! run's. Then issue 32's targets for the default stubs under the tracer, and the ns an
//! access once the cost of an empty session (`select 1` under `tracer record`: loading and
//! verifying the eBPF programs) is taken away too.

use std::cell::Cell;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::super::process::measured;
use super::{Timed, lackey, record_args, sqlite, summary_line};
use crate::util::{self, cmd};

/// `bench --only memtrace`'s sizes.
pub(crate) struct Options {
    pub rows: u64,
    pub lackey_rows: u64,
    pub rounds: usize,
}

/// The two stub modes: (row label, rewriter flags).
const MODES: [(&str, &[&str]); 2] = [
    ("--no-batch (a stub an access)", &["--no-batch"]),
    ("access runs (the default)", &[]),
];

/// One row of the table.
struct Row {
    name: String,
    rows: u64,
    wall_s: f64,
    stdout: String,
    /// Index into [`MODES`] of a rewritten binary's row.
    mode: Option<usize>,
    accesses: Option<u64>,
    records: Option<u64>,
    lost: Option<u64>,
    trace_bytes: Option<u64>,
    binary_bytes: Option<u64>,
}

impl Timed for Row {
    fn wall_s(&self) -> f64 {
        self.wall_s
    }
}

impl Row {
    fn new(name: &str, rows: u64, wall_s: f64, stdout: String) -> Row {
        Row {
            name: name.into(),
            rows,
            wall_s,
            stdout,
            mode: None,
            accesses: None,
            records: None,
            lost: None,
            trace_bytes: None,
            binary_bytes: None,
        }
    }
}

type Case<'a> = super::Case<'a, Row>;

pub(crate) fn memtrace(o: &Options) -> Result<()> {
    println!();
    println!(
        "== memtrace: sqlite3 {} INSERTs + queries, every memory access traced \
         (--sites memory --time coarse); lackey {} rows",
        o.rows, o.lackey_rows
    );
    if !util::is_root() {
        println!("skipped: `tracer record` needs root (BPF, uprobes)");
        return Ok(());
    }
    let dir = util::target_dir().join("xtask/bench-real");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let plain = sqlite::plain(&dir)?;
    let mut reads = Vec::new();
    for (name, rows) in [
        ("memtrace.sql", o.rows),
        ("memtrace-lackey.sql", o.lackey_rows),
    ] {
        let sql = dir.join(name);
        std::fs::write(&sql, sqlite::script(rows)).context("workload")?;
        reads.push(format!(".read {}", sql.display()));
    }
    let tracer = util::release_dir().join("tracer");
    let mut bins = Vec::new();
    for (i, (_, flags)) in MODES.iter().enumerate() {
        let out = dir.join(format!("sqlite3.memory.coarse.{i}"));
        util::run(
            cmd(util::release_dir().join("rewriter"))
                .arg(&plain)
                .arg("-o")
                .arg(&out)
                .args(["--sites", "memory", "--time", "coarse"])
                .args(*flags),
        )?;
        bins.push(out);
    }
    let counts = [Cell::new(None), Cell::new(None)];
    let env = Env {
        dir: &dir,
        tracer: &tracer,
        read: &reads[0],
    };
    let cases = cases(&env, &plain, &bins, &counts, o, &reads[1]);
    let mut table = super::rounds_of(&cases, o.rounds)?;
    for r in &mut table {
        if let Some(m) = r.mode {
            r.accesses = counts[m].get();
        }
    }
    print(&table, std::fs::metadata(&plain)?.len());
    marginal(&table, session_cost(&env, &bins[1], o.rounds)?);
    check_outputs(&table)
}

/// The wall time of `tracer record` around the access-runs binary running `select 1`
/// (median of `rounds`): what a session costs whatever the workload (loading and
/// verifying the eBPF programs, attaching, the end), not a cost per access.
fn session_cost(env: &Env, bin: &Path, rounds: usize) -> Result<f64> {
    let trace = env.dir.join("memtrace-empty.utrace");
    let mut walls = Vec::new();
    for _ in 0..rounds.max(1) {
        let mut c = cmd(env.tracer);
        record_args(&mut c, env.dir, &trace, bin, &[]);
        c.args([":memory:", "select 1;"]);
        walls.push(measured(&mut c)?.wall_s);
        let _ = std::fs::remove_file(&trace);
    }
    walls.sort_by(f64::total_cmp);
    Ok(walls[walls.len() / 2])
}

/// ns an access of the rows under `tracer record` over the untraced run once the
/// session's fixed cost is taken away too: what the stubs and the drain cost an access.
fn marginal(table: &[Row], session_s: f64) {
    println!("an empty session (tracer record, `select 1`): {session_s:.2} s");
    for r in table.iter().filter(|r| r.name.starts_with("tracer record")) {
        if let Some(n) = r.accesses.filter(|&n| n > 0) {
            let ns = (r.wall_s - session_s - base_of(table, r).wall_s) * 1e9 / n as f64;
            println!("{}: {ns:.2} ns/access over an empty session", r.name);
        }
    }
}

/// Where the utrace rows run.
struct Env<'a> {
    dir: &'a Path,
    tracer: &'a Path,
    /// `.read FILE` of the workload.
    read: &'a str,
}

impl Env<'_> {
    fn args(&self, c: &mut Command) {
        c.arg(":memory:").arg(self.read);
    }
}

/// Every row, in the order of the table.
fn cases<'a>(
    env: &'a Env<'a>,
    plain: &'a Path,
    bins: &'a [PathBuf],
    counts: &'a [Cell<Option<u64>>; 2],
    o: &'a Options,
    lackey_read: &'a str,
) -> Vec<Case<'a>> {
    let alone = move |name: String, bin: &'a Path, mode: Option<usize>| -> Case<'a> {
        let n = name.clone();
        let f = move || {
            let mut c = cmd(bin);
            env.args(&mut c);
            let run = measured(&mut c)?;
            let mut r = Row::new(&n, o.rows, run.wall_s, run.stdout);
            r.mode = mode;
            r.binary_bytes = Some(std::fs::metadata(bin)?.len());
            Ok(Some(r))
        };
        (name, Box::new(f))
    };
    let mut cases = vec![alone("untraced".into(), plain, None)];
    for (m, (label, _)) in MODES.iter().enumerate() {
        let bin = &bins[m];
        cases.push(alone(format!("stubs alone, {label}"), bin, Some(m)));
        let name = format!("tracer record, {label}");
        let n = name.clone();
        let f = move || Ok(Some(traced(env, bin, &n, o.rows, m, &counts[m])?));
        cases.push((name, Box::new(f)));
    }
    let untraced_l = move || {
        let mut c = cmd(plain);
        c.arg(":memory:").arg(lackey_read);
        let run = measured(&mut c)?;
        Ok(Some(Row::new(
            "untraced",
            o.lackey_rows,
            run.wall_s,
            run.stdout,
        )))
    };
    cases.push(("untraced (lackey's rows)".into(), Box::new(untraced_l)));
    // Lackey runs in the first round only: it takes a thousand times longer than the
    // untraced run, so rounds would change nothing but the section's length.
    let lackey_done = Cell::new(false);
    let lackey = move || {
        if lackey_done.replace(true) {
            return Ok(None);
        }
        let l = lackey::run(env.dir, plain, &[":memory:", lackey_read])?;
        let mut r = Row::new(
            "valgrind lackey --trace-mem=yes",
            o.lackey_rows,
            l.wall_s,
            l.stdout,
        );
        r.accesses = Some(l.accesses);
        println!(
            "lackey: {} instructions, {} accesses in sqlite's code",
            l.instructions, l.accesses
        );
        Ok(Some(r))
    };
    cases.push(("lackey".into(), Box::new(lackey)));
    cases
}

/// A rewritten binary under `tracer record`; its accesses are counted (`tracer dump`
/// lines) the first time.
fn traced(
    env: &Env,
    bin: &Path,
    name: &str,
    rows: u64,
    mode: usize,
    count: &Cell<Option<u64>>,
) -> Result<Row> {
    let trace = env.dir.join("memtrace.utrace");
    let _ = std::fs::remove_file(&trace);
    let mut c = cmd(env.tracer);
    record_args(&mut c, env.dir, &trace, bin, &[]);
    env.args(&mut c);
    let run = measured(&mut c)?;
    let (records, lost) = summary_line(&run.stderr)?;
    let mut r = Row::new(name, rows, run.wall_s, run.stdout);
    r.mode = Some(mode);
    r.records = Some(records);
    r.lost = Some(lost);
    r.trace_bytes = Some(std::fs::metadata(&trace)?.len());
    r.binary_bytes = Some(std::fs::metadata(bin)?.len());
    if count.get().is_none() {
        count.set(Some(dump_lines(env.tracer, &trace)?));
    }
    let _ = std::fs::remove_file(&trace);
    Ok(r)
}

/// The lines of `tracer dump TRACE`: one an access.
fn dump_lines(tracer: &Path, trace: &Path) -> Result<u64> {
    let mut c = cmd(tracer);
    c.arg("dump").arg(trace);
    util::announce(&c);
    let mut child = c.stdout(Stdio::piped()).spawn().context("tracer dump")?;
    let mut out = child.stdout.take().context("stdout")?;
    let (mut n, mut buf) = (0u64, vec![0u8; 1 << 20]);
    loop {
        let k = out.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += buf[..k].iter().filter(|&&b| b == b'\n').count() as u64;
    }
    if !child.wait()?.success() {
        bail!("tracer dump {} failed", trace.display());
    }
    Ok(n)
}

/// The untraced row of `r`'s row count.
fn base_of<'a>(table: &'a [Row], r: &Row) -> &'a Row {
    table
        .iter()
        .find(|b| b.rows == r.rows && b.name == "untraced")
        .unwrap_or(&table[0])
}

fn print(table: &[Row], plain_bytes: u64) {
    println!(
        "{:<46} {:>6} {:>8} {:>9} {:>11} {:>11} {:>6} {:>6} {:>8} {:>7} {:>9} {:>7}",
        "run",
        "rows",
        "wall s",
        "slowdown",
        "accesses",
        "records",
        "lost",
        "B/acc",
        "bin MB",
        "growth",
        "ns/acc",
        "output"
    );
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for r in table {
        let base = base_of(table, r);
        let per = |x: Option<f64>| match (x, r.accesses) {
            (Some(x), Some(n)) if n > 0 => format!("{:.2}", x / n as f64),
            _ => "-".into(),
        };
        let over = (!std::ptr::eq(r, base)).then_some((r.wall_s - base.wall_s) * 1e9);
        println!(
            "{:<46} {:>6} {:>8.2} {:>8.1}x {:>11} {:>11} {:>6} {:>6} {:>8} {:>7} {:>9} {:>7}",
            r.name,
            r.rows,
            r.wall_s,
            r.wall_s / base.wall_s,
            opt(r.accesses),
            opt(r.records),
            opt(r.lost),
            per(r.trace_bytes.map(|b| b as f64)),
            r.binary_bytes
                .map_or("-".into(), |b| format!("{:.1}", b as f64 / 1e6)),
            r.binary_bytes.map_or("-".into(), |b| format!(
                "{:.2}x",
                b as f64 / plain_bytes as f64
            )),
            per(over),
            if r.stdout == base.stdout {
                "same"
            } else {
                "DIFFERS"
            }
        );
    }
    targets(table);
}

/// Issue 32's targets, for the default stubs under the tracer; lackey beside it.
fn targets(table: &[Row]) {
    let find = |p: &str| table.iter().find(|r| r.name.starts_with(p));
    let ns_of = |r: &Row| {
        let b = base_of(table, r);
        r.accesses
            .filter(|&n| n > 0)
            .map(|n| (r.wall_s - b.wall_s) * 1e9 / n as f64)
    };
    let runs = find("tracer record, access runs");
    let lackey = find("valgrind lackey");
    let verdict = |ok: bool| if ok { "met" } else { "NOT MET" };
    if let Some(r) = runs
        && let (Some(ns), Some(n), Some(bytes), Some(bin)) =
            (ns_of(r), r.accesses, r.trace_bytes, r.binary_bytes)
    {
        let plain = bin as f64 / table[0].binary_bytes.unwrap_or(bin).max(1) as f64;
        println!(
            "targets (access runs, under tracer record): <= 1.5 ns/access: {} ({ns:.2}); 0 lost: {}; \
             <= 4 B/access: {} ({:.2}); growth <= 3x: {} ({plain:.2}x)",
            verdict(ns <= 1.5),
            verdict(r.lost == Some(0)),
            verdict(bytes as f64 <= 4.0 * n as f64),
            bytes as f64 / n as f64,
            verdict(plain <= 3.0),
        );
        if let Some(l) = lackey.and_then(ns_of) {
            println!(
                "lackey ns/access / utrace's (access runs, under tracer record) = {:.0}x",
                l / ns
            );
        }
    }
    let acc: Vec<Option<u64>> = (0..MODES.len())
        .map(|m| {
            table
                .iter()
                .find(|r| r.mode == Some(m))
                .and_then(|r| r.accesses)
        })
        .collect();
    println!(
        "accesses: --no-batch {} and access runs {}: {}",
        acc[0].map_or("-".into(), |v| v.to_string()),
        acc[1].map_or("-".into(), |v| v.to_string()),
        if acc[0] == acc[1] {
            "equal"
        } else {
            "DIFFERENT"
        }
    );
}

/// Every row must print what the untraced run of its rows printed.
fn check_outputs(table: &[Row]) -> Result<()> {
    for r in table {
        if r.stdout != base_of(table, r).stdout {
            bail!("{}: output differs from the untraced run's", r.name);
        }
    }
    println!("output of every run identical to the untraced run's");
    Ok(())
}
