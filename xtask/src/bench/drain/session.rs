//! One `tracer record` session of the drain producer: run it, sample the tracer's threads'
//! CPU time, read the producer's figures and the trace file's stats section.

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::RING;
use crate::util::{self, cmd};

/// What one session measured.
pub(super) struct Session {
    pub threads: u32,
    /// Records the fixture makes: threads × (iterations + 1 call of `rare()`).
    pub expected: u64,
    pub loop_s: f64,
    pub wall_s: f64,
    pub prod_user_s: f64,
    pub prod_sys_s: f64,
    pub tracer_s: f64,
    /// CPU seconds of the tracer's threads other than its main thread (the consumer and
    /// the writer: the per-record work, no startup), by thread name.
    pub workers: Vec<(String, f64)>,
    pub stats: Value,
}

impl Session {
    /// Every CPU second of the session: producer and tracer, startup included.
    pub(super) fn cpu_s(&self) -> f64 {
        self.prod_user_s + self.prod_sys_s + self.tracer_s
    }
    /// CPU seconds of the record path only: the producer (loop, stubs, flush, eBPF) and
    /// the tracer's consumer and writer threads.
    pub(super) fn pipe_s(&self) -> f64 {
        self.prod_user_s + self.prod_sys_s + self.workers.iter().map(|w| w.1).sum::<f64>()
    }
    pub(super) fn stat(&self, k: &str) -> Option<u64> {
        self.stats.get(k).and_then(Value::as_u64)
    }
    /// Records that went through flush → eBPF: `records_produced` when the tracer
    /// counts it, else what the fixture makes.
    pub(super) fn produced(&self) -> u64 {
        self.stat("records_produced").unwrap_or(self.expected)
    }
    /// Every record accounted for? And the text: `ok` / what does not add up.
    pub(super) fn check(&self) -> (bool, String) {
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

/// One `tracer record` session of `drain T N`.
pub(super) fn session(
    traced: &Path,
    trace: &Path,
    threads: u32,
    n: u64,
    filter: &[&str],
) -> Result<Session> {
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
    let Ran {
        status,
        wall_s,
        total_s,
        stdout,
        stderr,
        workers,
    } = run_sampled(&mut c, trace)?;
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
    let loop_s = field(line, "drain_loop_ns")? / 1e9;
    let prod_user_s = field(line, "user_us")? / 1e6;
    let prod_sys_s = field(line, "sys_us")? / 1e6;
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

/// A finished session's process facts.
struct Ran {
    status: std::process::ExitStatus,
    wall_s: f64,
    /// CPU time of the tracer and what it waited for.
    total_s: f64,
    stdout: String,
    stderr: String,
    /// CPU seconds of the tracer's threads but its main one, by name.
    workers: BTreeMap<String, f64>,
}

/// Runs `c` (a `tracer record` writing `trace`) with its output in files, sampling its
/// threads' CPU time until it exits.
fn run_sampled(c: &mut Command, trace: &Path) -> Result<Ran> {
    // Output into files (no pipe to drain while we poll).
    let out_path = trace.with_extension("stdout");
    let err_path = trace.with_extension("stderr");
    c.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?);
    util::announce(c);
    let before = children_cpu_s();
    let t = Instant::now();
    let mut child = c
        .spawn()
        .with_context(|| format!("cannot run {}", util::show(c)))?;
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
    Ok(Ran {
        status,
        wall_s,
        total_s,
        stdout,
        stderr,
        workers,
    })
}

/// The number after `k` on the producer's `drain_loop_ns ...` line.
fn field(line: &str, k: &str) -> Result<f64> {
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

/// The JSON of a trace file's stats section (tracer-user `tracefile/`: a 16-byte file
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
