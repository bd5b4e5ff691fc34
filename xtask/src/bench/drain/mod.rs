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

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::util::{self, cmd};

/// Records per thread buffer of the rewritten producer (512 KiB): one flush (uprobe hit)
/// per 16 Ki records, so the uprobe's fixed cost is spread thin.
const BUFFER_RECORDS: u32 = 16384;
/// Ring buffer of the sessions: 8 Mi records of slack before the consumer must keep up.
const RING: &str = "256M";

/// Options of this section (from `cargo xtask bench`).
pub struct Options {
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

/// What one session measured.
struct Session {
    threads: u32,
    /// Records the fixture makes: threads × (iterations + 1 call of `rare()`).
    expected: u64,
    loop_s: f64,
    wall_s: f64,
    prod_user_s: f64,
    prod_sys_s: f64,
    tracer_s: f64,
    /// CPU seconds of the tracer's threads other than its main thread (the consumer and
    /// the writer: the per-record work, no startup), by thread name.
    workers: Vec<(String, f64)>,
    stats: Value,
}

impl Session {
    /// Every CPU second of the session: producer and tracer, startup included.
    fn cpu_s(&self) -> f64 {
        self.prod_user_s + self.prod_sys_s + self.tracer_s
    }
    /// CPU seconds of the record path only: the producer (loop, stubs, flush, eBPF) and
    /// the tracer's consumer and writer threads.
    fn pipe_s(&self) -> f64 {
        self.prod_user_s + self.prod_sys_s + self.workers.iter().map(|w| w.1).sum::<f64>()
    }
    fn stat(&self, k: &str) -> Option<u64> {
        self.stats.get(k).and_then(Value::as_u64)
    }
    /// Records that went through flush → eBPF: `records_produced` when the tracer
    /// counts it, else what the fixture makes.
    fn produced(&self) -> u64 {
        self.stat("records_produced").unwrap_or(self.expected)
    }
    /// Every record accounted for? And the text: `ok` / what does not add up.
    fn check(&self) -> (bool, String) {
        let g = |k| self.stat(k).unwrap_or(0);
        let (delivered, dropped, received) = (
            g("records_delivered"),
            g("records_dropped"),
            g("records_received"),
        );
        let mut bad = Vec::new();
        match (self.stat("records_produced"), self.stat("records_filtered")) {
            (Some(p), Some(f)) => {
                if p != delivered + f + dropped {
                    bad.push(format!(
                        "produced {p} != delivered {delivered} + filtered {f} + dropped {dropped}"
                    ));
                }
                if p != self.expected {
                    bad.push(format!("produced {p} != {} made", self.expected));
                }
            }
            // An older tracer: no filters, so made = delivered + dropped.
            _ => {
                if delivered + dropped != self.expected {
                    bad.push(format!(
                        "delivered {delivered} + dropped {dropped} != {} made",
                        self.expected
                    ));
                }
            }
        }
        if received != delivered {
            bad.push(format!("received {received} != delivered {delivered}"));
        }
        // (`records_skipped` is not a loss: records an earlier drain already delivered.)
        for k in ["read_errors", "bad_entries", "table_full"] {
            if g(k) != 0 {
                bad.push(format!("{k} {}", g(k)));
            }
        }
        let mut text = if bad.is_empty() {
            let how = if self.stats.get("records_produced").is_some() {
                "ok: produced = delivered + filtered + dropped"
            } else {
                "ok: made = delivered + dropped (no produced/filtered counters)"
            };
            how.to_string()
        } else {
            format!("MISMATCH: {}", bad.join("; "))
        };
        // Sequence numbers without a chunk (what `tracer report` calls chunks lost): a
        // chunk that never reached the ring buffer; its records, if any, should be in
        // `records_dropped`, so this alone does not unbalance the records.
        let (issued, chunks) = (g("seq_issued"), g("chunks_received"));
        if issued > chunks {
            text.push_str(&format!(
                "; but seq_issued {issued} > chunks_received {chunks} ({} chunk(s) lost)",
                issued - chunks
            ));
        }
        (bad.is_empty(), text)
    }
}

pub fn drain_throughput(opts: &Options) -> Result<()> {
    println!();
    println!("== drain throughput: flush -> eBPF (filter) -> ring buffer -> tracer -> trace file");
    if !util::is_root() {
        println!("skipped: `tracer record` needs root (BPF, uprobes)");
        return Ok(());
    }
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
        let mut best: Option<Session> = None;
        let mut err = None;
        for _ in 0..runs {
            match session(
                &traced,
                &trace,
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
        rows.push((case, best.ok_or_else(|| err.unwrap_or_default())));
    }
    let _ = std::fs::remove_file(&trace);
    print_drain(&empty, &rows, n, runs, t0.elapsed().as_secs_f64());
    Ok(())
}

/// One `tracer record` session of `drain T N`.
fn session(traced: &Path, trace: &Path, threads: u32, n: u64, filter: &[&str]) -> Result<Session> {
    let _ = std::fs::remove_file(trace);
    let mut c = cmd(crate::tracer_bin());
    c.args(["record", "--ring-bytes", RING])
        .args(filter)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(traced)
        .arg(threads.to_string())
        .arg(n.to_string());
    // Output into files (no pipe to drain while we poll).
    let out_path = trace.with_extension("stdout");
    let err_path = trace.with_extension("stderr");
    c.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?);
    util::announce(&c);
    let before = children_cpu_s();
    let t = Instant::now();
    let mut child = c
        .spawn()
        .with_context(|| format!("cannot run {}", util::show(&c)))?;
    // The tracer's threads' CPU time, sampled until it exits (the consumer and writer
    // end after the producer; the last sample misses at most one period of them).
    let mut tasks = BTreeMap::new();
    let status = loop {
        sample_threads(child.id(), &mut tasks);
        if let Some(st) = child.try_wait()? {
            break st;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let wall_s = t.elapsed().as_secs_f64();
    let total_s = children_cpu_s() - before;
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    let main_tid = child.id();
    let mut workers: BTreeMap<String, f64> = BTreeMap::new();
    for (tid, (name, ns)) in tasks {
        if tid != main_tid {
            *workers.entry(name).or_default() += ns as f64 / 1e9;
        }
    }
    if !status.success() {
        let _ = std::fs::remove_file(trace);
        bail!(
            "{} ({}): {}",
            util::show(&c),
            util::describe(status),
            stderr.lines().take(3).collect::<Vec<_>>().join(" | ")
        );
    }
    for l in stderr.lines().filter(|l| l.contains("warning")) {
        println!("   {l}");
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with("drain_loop_ns "))
        .with_context(|| format!("no drain_loop_ns line in the output of {}", util::show(&c)))?;
    let field = |k: &str| -> Result<f64> {
        let mut it = line.split_whitespace();
        while let Some(w) = it.next() {
            if w == k {
                return it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("bad {k} in {line:?}"));
            }
        }
        bail!("no {k} in {line:?}")
    };
    let loop_s = field("drain_loop_ns")? / 1e9;
    let prod_user_s = field("user_us")? / 1e6;
    let prod_sys_s = field("sys_us")? / 1e6;
    let stats = read_stats(trace);
    let _ = std::fs::remove_file(trace);
    let stats = stats?;
    // RUSAGE_CHILDREN holds the producer once the tracer has waited for it; if it
    // somehow does not (total below the producer's own time), count the producer on top.
    let tracer_s = if total_s >= prod_user_s + prod_sys_s {
        total_s - prod_user_s - prod_sys_s
    } else {
        total_s
    };
    Ok(Session {
        threads,
        expected: u64::from(threads) * (n + 1),
        loop_s,
        wall_s,
        prod_user_s,
        prod_sys_s,
        tracer_s,
        workers: workers.into_iter().collect(),
        stats,
    })
}

/// Latest CPU time (ns, `/proc/PID/task/TID/schedstat`: time on the CPU) and name of
/// every thread of `pid`, into `seen` (threads that have exited keep their last sample).
fn sample_threads(pid: u32, seen: &mut BTreeMap<u32, (String, u64)>) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let p = e.path();
        let Some(ns) = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        let name = std::fs::read_to_string(p.join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        seen.insert(tid, (name, ns));
    }
}

/// CPU time (user + system, seconds) of this process's waited-for children and their
/// waited-for descendants.
fn children_cpu_s() -> f64 {
    // SAFETY: a zeroed rusage is a valid out-parameter for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The JSON of a trace file's stats section (tracer-user `tracefile.rs`: a 16-byte file
/// header, then sections of `u32 kind, u32 0, u64 length` + payload; stats = kind 4,
/// last). Chunk sections are skipped with seeks.
fn read_stats(path: &Path) -> Result<Value> {
    const SECTION_STATS: u32 = 4;
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut r = BufReader::with_capacity(1 << 16, f);
    let mut h = [0u8; 16];
    r.read_exact(&mut h)
        .with_context(|| format!("{}: no file header", path.display()))?;
    if &h[..8] != b"UTRCTRAC" {
        bail!("{}: not a trace file", path.display());
    }
    let mut stats = None;
    loop {
        match r.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e).context(format!("cannot read {}", path.display())),
        }
        let kind = u32::from_le_bytes(h[..4].try_into().unwrap());
        let len = u64::from_le_bytes(h[8..].try_into().unwrap());
        if kind == SECTION_STATS {
            let mut payload = vec![0u8; usize::try_from(len)?];
            r.read_exact(&mut payload)
                .with_context(|| format!("{}: truncated stats section", path.display()))?;
            stats = Some(
                serde_json::from_slice(&payload)
                    .with_context(|| format!("{}: bad stats JSON", path.display()))?,
            );
        } else {
            r.seek(SeekFrom::Current(i64::try_from(len)?))?;
        }
    }
    stats.with_context(|| format!("{}: no stats section (truncated?)", path.display()))
}

fn print_drain(
    empty: &Session,
    rows: &[(&Case, std::result::Result<Session, String>)],
    n: u64,
    runs: u32,
    total_s: f64,
) {
    let m = |records: u64, s: f64| {
        if s > 0.0 {
            format!("{:.1}", records as f64 / s / 1e6)
        } else {
            "-".into()
        }
    };
    println!();
    println!(
        "{n} calls of hot() per session (shared by the threads), {BUFFER_RECORDS} records per \
         buffer, ring {RING}, best of {runs} (least record-path CPU); {} cores",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!(
        "empty session (drain 1 0): {:.2} s wall, {:.2} s CPU (tracer {:.2} s, of which \
         consumer/writer threads {:.3} s): the fixed cost of a session (load, verify, attach, \
         finish)",
        empty.wall_s,
        empty.cpu_s(),
        empty.tracer_s,
        empty.pipe_s() - empty.prod_user_s - empty.prod_sys_s
    );
    // Columns:
    //   records    produced: went through flush → eBPF (records_produced, or what the
    //              fixture makes when the tracer does not count it);
    //   loop s     the producing phase (producer's clock: first call → last thread
    //              joined, its last partial buffer drained at its exit);
    //   M/s        records / loop s: the rate the producers pushed records through the
    //              stub, flush and eBPF (the ring absorbs what the consumer lags behind);
    //   e2e M/s    records / (session wall − empty session wall): until the last record
    //              is in the file (noisy: the difference of two ~6 s sessions);
    //   all CPU    CPU seconds of the session: producer (user: loop + stubs; sys: flush
    //              uprobe + eBPF) + the whole tracer (startup included), from
    //              getrusage(RUSAGE_CHILDREN);
    //   /core      records / all CPU;
    //   pipe CPU   the record path only: producer + the tracer's consumer and writer
    //              threads (their schedstat run time; ring reads, file writes);
    //   /core      records / pipe CPU.
    // "Per busy core" is records ÷ CPU seconds, not ÷ (wall time × cores): the consumer's
    // core counts for what it ran, an idle core for nothing, and with 2 cores shared by
    // producers, consumer, writer (and other users) wall time says little about cost.
    println!();
    println!(
        "{:<27} {:>9} {:>6} {:>6} {:>7} {:>7} {:>6} {:>8} {:>6} {:>9} {:>9} {:>9}  check",
        "variant",
        "records",
        "loop s",
        "M/s",
        "e2e M/s",
        "all CPU",
        "/core",
        "pipe CPU",
        "/core",
        "delivered",
        "filtered",
        "dropped"
    );
    let mut base: Option<&Session> = None;
    for (case, r) in rows {
        let s = match r {
            Ok(s) => s,
            Err(e) => {
                println!("{:<27} {e}", case.name);
                continue;
            }
        };
        if case.threads == 1 && case.filter.is_empty() {
            base = Some(s);
        }
        let p = s.produced();
        let opt = |k: &str| s.stat(k).map_or("-".to_string(), |v| v.to_string());
        println!(
            "{:<27} {:>9} {:>6.3} {:>6} {:>7} {:>7.2} {:>6} {:>8.3} {:>6} {:>9} {:>9} {:>9}  {}",
            case.name,
            p,
            s.loop_s,
            m(p, s.loop_s),
            m(p, s.wall_s - empty.wall_s),
            s.cpu_s(),
            m(p, s.cpu_s()),
            s.pipe_s(),
            m(p, s.pipe_s()),
            opt("records_delivered"),
            opt("records_filtered"),
            opt("records_dropped"),
            s.check().1
        );
        let workers: Vec<String> = s
            .workers
            .iter()
            .map(|(name, t)| format!("{name} {t:.3}"))
            .collect();
        println!(
            "{:<27}   producer {:.3} user + {:.3} sys ({} thread{}); tracer {:.2} ({}); \
             session {:.2} s wall; {} records skipped (already delivered)",
            "",
            s.prod_user_s,
            s.prod_sys_s,
            s.threads,
            if s.threads == 1 { "" } else { "s" },
            s.tracer_s,
            workers.join(", "),
            s.wall_s,
            opt("records_skipped")
        );
    }

    // Filtering cost per record, against the unfiltered 1-thread row: positive = the
    // filter costs more than it saves downstream (fewer records copied and written).
    let filtered: Vec<_> = rows
        .iter()
        .filter_map(|(c, r)| Some((c, r.as_ref().ok()?)))
        .filter(|(c, _)| !c.filter.is_empty())
        .collect();
    if let (Some(b), false) = (base, filtered.is_empty()) {
        println!();
        println!(
            "filter cost per record against '1 thread' = (time filtered − time unfiltered) / \
             records, ns (negative: filtering saves more downstream than it costs):"
        );
        for (c, s) in filtered {
            let p = s.produced() as f64;
            let ns = |a: f64, b: f64| (a - b) * 1e9 / p;
            println!(
                "  {:<26} producing phase {:+.2}, producer sys (flush + eBPF) {:+.2}, pipe CPU {:+.2}",
                c.name,
                ns(s.loop_s, b.loop_s),
                ns(s.prod_sys_s, b.prod_sys_s),
                ns(s.pipe_s(), b.pipe_s())
            );
        }
    }

    // The target, on the record path's CPU (a session's fixed startup cost is not per
    // record); the all-CPU figure is shown next to it.
    let unfiltered: Vec<&Session> = rows
        .iter()
        .filter(|(c, _)| c.filter.is_empty())
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect();
    let clean = |s: &Session| s.stat("records_dropped") == Some(0) && s.check().0;
    let rate = |s: &Session, cpu: f64| s.produced() as f64 / cpu / 1e6;
    let verdict = if unfiltered.is_empty() {
        "n/a"
    } else if unfiltered
        .iter()
        .all(|s| clean(s) && rate(s, s.pipe_s()) >= 50.0)
    {
        "met"
    } else {
        "NOT MET"
    };
    let detail: Vec<String> = unfiltered
        .iter()
        .map(|s| {
            format!(
                "{} thread{}: {:.1} M/s/core on the record path, {:.1} with startup{}",
                s.threads,
                if s.threads == 1 { "" } else { "s" },
                rate(s, s.pipe_s()),
                rate(s, s.cpu_s()),
                if clean(s) {
                    ""
                } else {
                    ", NOT all delivered/accounted"
                }
            )
        })
        .collect();
    println!();
    println!(
        "target: >= 50 M records/s per busy core, none dropped, all accounted for: {verdict} ({})",
        detail.join("; ")
    );
    println!("drain section: {total_s:.1} s");
}
