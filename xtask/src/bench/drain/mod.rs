//! `cargo xtask bench`, drain throughput: records per second through the whole path
//! flush (uprobe) → eBPF (filter, copy) → BPF ring buffer → `tracer record`'s consumer
//! and writer threads → trace file, with 1 and 2 producing threads, and what the
//! in-kernel filters cost per record. Target (issue): ≥ 50 M records/s per busy core,
//! with every record accounted for.
//!
//! The producer is `xtask/bench/drain.c` (T threads, each calling the empty noinline
//! `hot()` N times), rewritten with `--functions hot rare --time coarse` and large
//! buffers, so the loop is a call, the inline stub and, every `BUFFER_RECORDS` calls,
//! the flush. Each session is `tracer record --ring-bytes 256M -o /tmp/… -- drain T N`;
//! the figures come from
//! - the producer: wall time of its producing phase (barrier → every thread joined,
//!   `CLOCK_MONOTONIC`) and its own CPU time (`getrusage(RUSAGE_SELF)`: user = loop +
//!   stubs, system = mostly the flush uprobe and the eBPF drain, which run in the
//!   producing thread's context);
//! - us: wall time of the whole session, and the CPU time of the tracer *and* the
//!   producer (`getrusage(RUSAGE_CHILDREN)` before and after: the tracer waits for the
//!   producer, so its time is included); tracer CPU = that − the producer's own;
//! - the trace file's stats section (`FinalStats`, JSON, read directly from the file:
//!   `tracer report --json` prints a summary without the kernel counters); fields the
//!   tracer does not write yet (`records_produced`, `records_filtered`) are optional.
//!
//! An empty session (`drain 1 0`) is measured first: its wall and CPU time are the fixed
//! cost of a session (loading and verifying the eBPF programs, attaching, finishing the
//! file), shown separately so that the per-record figures can leave it out.

mod print;
mod session;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::util::{self, cmd};
use print::print_drain;
use session::{Session, session};

/// Records per thread buffer of the rewritten producer (512 KiB): one flush (uprobe hit)
/// per 16 Ki records, so the uprobe's fixed cost is spread thin.
const BUFFER_RECORDS: u32 = 16384;
/// Ring buffer of the sessions: 8 Mi records of slack before the consumer must keep up.
const RING: &str = "256M";

/// Options of this section (from `cargo xtask bench`).
pub(super) struct Options {
    /// Calls of `hot()` per session, shared by the producing threads (so every row
    /// moves the same number of records).
    pub records: u64,
    /// Sessions per row; the one whose record path used the least CPU is reported (the
    /// least disturbed by other load: the writer's page-cache time varies most).
    pub runs: u32,
}

/// One row: producing threads and extra `tracer record` flags.
struct Case {
    name: &'static str,
    threads: u32,
    filter: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "1 thread",
        threads: 1,
        filter: &[],
    },
    Case {
        name: "2 threads",
        threads: 2,
        filter: &[],
    },
    Case {
        name: "1 thread, --sample 2",
        threads: 1,
        filter: &["--sample", "2"],
    },
    // `rare` is an instrumented function (one call per thread), so the glob matches a
    // site, but no record of `hot()` passes: every one is filtered.
    Case {
        name: "1 thread, --functions rare",
        threads: 1,
        filter: &["--functions", "rare"],
    },
];

/// The drain section: the empty session, then the best of `opts.runs` sessions per case.
pub(super) fn drain_throughput(opts: &Options) -> Result<()> {
    println!();
    println!("== drain throughput: flush -> eBPF (filter) -> ring buffer -> tracer -> trace file");
    if !util::is_root() {
        println!("skipped: `tracer record` needs root (BPF, uprobes)");
        return Ok(());
    }
    let traced = build_producer()?;
    let help = util::output_ok(cmd(crate::tracer_bin()).args(["record", "--help"]))?;
    let has_filters = help.contains("--sample") && help.contains("--functions");
    let trace =
        std::env::temp_dir().join(format!("utrace-bench-drain-{}.utrace", std::process::id()));
    let n = opts.records;
    let runs = opts.runs.max(1);

    let t0 = Instant::now();
    let empty =
        session(&traced, &trace, 1, 0, &[]).context("the empty session (drain 1 0) failed")?;
    let mut rows: Vec<(&Case, std::result::Result<Session, String>)> = Vec::new();
    for case in CASES {
        if !case.filter.is_empty() && !has_filters {
            rows.push((
                case,
                Err("skipped: tracer has no --sample/--functions".into()),
            ));
            continue;
        }
        rows.push((case, best_session(&traced, &trace, case, n, runs)));
    }
    let _ = std::fs::remove_file(&trace);
    print_drain(&empty, &rows, n, runs, t0.elapsed().as_secs_f64());
    Ok(())
}

/// `xtask/bench/drain.c` rewritten for the sessions (`hot` and `rare`, coarse time,
/// `BUFFER_RECORDS`-record buffers).
fn build_producer() -> Result<PathBuf> {
    let buffer_records = BUFFER_RECORDS.to_string();
    let (_, traced) = super::workload::build_workload(
        "drain",
        &["-O2", "-pthread"],
        &[
            "--functions",
            "hot",
            "rare",
            "--time",
            "coarse",
            "--slots",
            "8",
            "--buffer-records",
            &buffer_records,
        ],
    )?;
    Ok(traced)
}

/// Of `runs` sessions of `case` (`n` records shared by its threads), the one whose record
/// path used the least CPU; the first failure ends the series.
fn best_session(
    traced: &Path,
    trace: &Path,
    case: &Case,
    n: u64,
    runs: u32,
) -> std::result::Result<Session, String> {
    let mut best: Option<Session> = None;
    let mut err = None;
    for _ in 0..runs {
        match session(
            traced,
            trace,
            case.threads,
            n / u64::from(case.threads),
            case.filter,
        ) {
            Ok(s) => {
                if best.as_ref().is_none_or(|b| s.pipe_s() < b.pipe_s()) {
                    best = Some(s);
                }
            }
            Err(e) => {
                err = Some(format!("{e:#}"));
                break;
            }
        }
    }
    best.ok_or_else(|| err.unwrap_or_default())
}
