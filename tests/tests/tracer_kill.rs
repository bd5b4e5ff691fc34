//! SIGKILL in the middle of a session (fixtures/longrun.c: T threads, thread t calls
//! work(t<<32 | i) for i = 0,1,2,... and the program prints a checksum).
//! - The tracer killed: the target runs on untraced and prints the untraced checksum
//!   with status 0; every BPF program, link and map the tracer held is gone from the
//!   kernel (bpftool); the output directory holds the trace under its name (0600),
//!   flagged incomplete in its header, a consistent prefix of the calls up to about a
//!   second before the kill, which `report` says did not finish (books unknown, never
//!   "balanced"); a new session on the same binary records exact counts and values.
//! - The target killed while 64-record buffers flush all the time: the tracer exits with
//!   128+9, the trace file is complete (stats section; `report --json` not truncated, no
//!   chunk lost), every record is a site of the binary, each thread's work() values are
//!   0,1,2,...,k with no gap or duplicate, and the kernel and consumer counters balance.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::*;

/// Our eBPF programs (tracer-common `ebpf.rs`), but the flush program: `flush_s`
/// (sleepable) where the kernel has sleepable uprobes, else `flush`.
const OUR_PROGS: [&str; 9] = [
    "site",
    "thread_exit",
    "group_exit",
    "killed",
    "task_exit",
    "fork",
    "exec",
    "mmap",
    "exit_step",
];
/// Threads and calls per thread of the killed runs; ROUNDS makes one call cost a few
/// microseconds, so the run lasts seconds with a few hundred thousand records.
const THREADS: u64 = 4;
const CALLS: u64 = 100_000;
const ROUNDS: &str = "8000";
/// How long the session runs before the kill (the untraced run takes several seconds
/// here; the test also checks the target had not finished at the kill).
const BEFORE_KILL: Duration = Duration::from_millis(500);
/// The tracer's kill comes later: its writer has put what it holds into the file once
/// (`tracefile::CHECKPOINT_EVERY`, 1 s).
const TRACER_KILLED_AFTER: Duration = Duration::from_millis(1500);
/// Tracer start-up (the verifier takes seconds on a busy 2-core machine).
const START_TIMEOUT: Duration = Duration::from_secs(120);

struct Built {
    tmp: TempDir,
    orig: PathBuf,
    traced: PathBuf,
    meta: Metadata,
}

/// longrun built with gcc, rewritten (every function's entry) with `extra` options.
fn build(tag: &str, extra: &[&str]) -> Built {
    let tmp = TempDir::new(tag);
    let orig = tmp.join("longrun");
    compile(
        "gcc",
        &[fixture("longrun.c")],
        &["-O2", "-g", "-pthread"],
        &orig,
    );
    let traced = tmp.join("longrun.traced");
    let mut args = vec![orig.as_os_str(), "-o".as_ref(), traced.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    rewriter(&args).ok();
    let meta = metadata(&traced);
    assert!(
        meta.sites.iter().any(|s| s.name == "work"),
        "no site for work"
    );
    Built {
        tmp,
        orig,
        traced,
        meta,
    }
}

/// A `tracer record` running in the background: its stdout (which the target inherits)
/// is collected to EOF, its stderr line by line.
struct Session {
    child: Child,
    cmdline: String,
    stdout: Arc<Mutex<Vec<u8>>>,
    stdout_done: Option<std::thread::JoinHandle<()>>,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
}

impl Session {
    fn start(trace: &Path, prog: &Path, args: &[&str]) -> Session {
        let mut c = Command::new(tracer_bin());
        c.arg("record")
            .arg("-o")
            .arg(trace)
            .arg("--")
            .arg(prog)
            .args(args);
        let cmdline = cmdline(&c);
        let mut child = spawn_piped(&mut c);
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let mut so = child.stdout.take().unwrap();
        let buf = stdout.clone();
        let stdout_done = std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            while let Ok(n @ 1..) = so.read(&mut b) {
                buf.lock().unwrap().extend_from_slice(&b[..n]);
            }
        });
        let (tx, lines) = mpsc::channel();
        let se = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(se).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Session {
            child,
            cmdline,
            stdout,
            stdout_done: Some(stdout_done),
            lines,
            stderr: Vec::new(),
        }
    }

    /// The next stderr line satisfying `f`; panics at EOF or after `timeout`.
    fn wait_line(&mut self, timeout: Duration, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.stderr.push(l.clone());
                    if f(&l) {
                        return l;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    panic!(
                        "{}: no expected stderr line ({e:?}); stderr so far:\n{}",
                        self.cmdline,
                        self.stderr.join("\n")
                    );
                }
            }
        }
    }

    /// Waits for `pid=N` and `started` (every thread running); returns the target's pid.
    fn wait_started(&mut self) -> u32 {
        let l = self.wait_line(START_TIMEOUT, |l| l.starts_with("pid="));
        let pid = l["pid=".len()..].parse().unwrap();
        self.wait_line(START_TIMEOUT, |l| l == "started");
        pid
    }

    fn stdout_now(&self) -> Vec<u8> {
        self.stdout.lock().unwrap().clone()
    }

    /// The tracer's exit status, after at most `timeout`.
    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                // Only the group of the tracer we started (the target is in it).
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
                panic!("{}: still running after {timeout:?}", self.cmdline);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything written to stdout, once every writer (tracer and target) closed it.
    fn stdout_to_eof(&mut self) -> Vec<u8> {
        if let Some(h) = self.stdout_done.take() {
            h.join().unwrap();
        }
        self.stdout_now()
    }

    /// Remaining stderr lines (up to EOF, at most `timeout`).
    fn stderr_to_eof(&mut self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while let Ok(l) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.stderr.push(l);
        }
        self.stderr.join("\n")
    }
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        // The state follows the parenthesised command name.
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
    })
}

/// Makes this test process the reaper of orphans it started (the target, once its
/// tracer is killed), so that its exit status can be collected.
fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(r, 0, "PR_SET_CHILD_SUBREAPER");
}

/// The wait status of `pid` (a child or an orphan we reap), after at most `timeout`.
fn reap(pid: u32, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: status is a valid int.
        let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
        assert!(
            r >= 0,
            "waitpid({pid}): {} (not reparented to us?)",
            std::io::Error::last_os_error()
        );
        if r == pid as i32 {
            return std::process::ExitStatus::from_raw(status);
        }
        if Instant::now() > deadline {
            // SAFETY: as above; pid is the target we started, still unreaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("process {pid} still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ids of `kind` objects bpftool lists now (`prog`, `link`, `map`) with their JSON.
fn listed(kind: &str) -> HashMap<u64, serde_json::Value> {
    let v = bpftool_json(&[kind, "show"]);
    v.as_array()
        .unwrap_or_else(|| panic!("bpftool {kind} show: not an array: {v}"))
        .iter()
        .filter_map(|o| Some((o.get("id")?.as_u64()?, o.clone())))
        .collect()
}

/// The BPF objects of a running tracer, checked against bpftool: its programs are
/// exactly ours by name, and each tracepoint program and the flush uprobe has a link.
fn tracer_bpf_objects(tracer: u32) -> BpfIds {
    let ids = bpf_ids_of(tracer);
    let progs = listed("prog");
    let names: BTreeSet<&str> = ids
        .progs
        .iter()
        .map(|id| {
            progs
                .get(id)
                .and_then(|p| p["name"].as_str())
                .unwrap_or_else(|| panic!("program {id} of the tracer not listed by bpftool"))
        })
        .collect();
    let flush = if names.contains("flush_s") {
        "flush_s"
    } else {
        "flush"
    };
    let ours: BTreeSet<&str> = OUR_PROGS.into_iter().chain([flush]).collect();
    assert_eq!(names, ours, "programs held by tracer {tracer}: {ids:?}");
    let links = listed("link");
    let linked: BTreeSet<&str> = ids
        .links
        .iter()
        .map(|id| {
            let l = links
                .get(id)
                .unwrap_or_else(|| panic!("link {id} of the tracer not listed by bpftool"));
            let prog = l["prog_id"].as_u64().unwrap();
            assert!(ids.progs.contains(&prog), "link {l} to a foreign program");
            progs[&prog]["name"].as_str().unwrap()
        })
        .collect();
    // `site` has nothing to attach to: longrun has no uprobe site; `exit_step` is
    // reached by tail calls only.
    let want: BTreeSet<&str> = ours
        .into_iter()
        .filter(|p| *p != "site" && *p != "exit_step")
        .collect();
    assert_eq!(linked, want, "programs with a link");
    assert!(!ids.maps.is_empty(), "no maps held by tracer {tracer}");
    ids
}

/// Waits until none of `ids` is listed by bpftool any more (freeing is deferred in the
/// kernel) and no perf event of `tracer` or of one of its programs is; returns how
/// long that took.
fn assert_bpf_gone(ids: &BpfIds, tracer: u32, traced: &Path) -> Duration {
    let start = Instant::now();
    loop {
        let progs: Vec<u64> = listed("prog")
            .into_keys()
            .filter(|i| ids.progs.contains(i))
            .collect();
        let links: Vec<u64> = listed("link")
            .into_keys()
            .filter(|i| ids.links.contains(i))
            .collect();
        let maps: Vec<u64> = listed("map")
            .into_keys()
            .filter(|i| ids.maps.contains(i))
            .collect();
        let perf = bpftool_json(&["perf", "show"]);
        let traced = traced.to_string_lossy();
        let perf: Vec<&serde_json::Value> = perf
            .as_array()
            .map(|a| a.iter().collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| {
                p["pid"].as_u64() == Some(tracer.into())
                    || p["prog_id"]
                        .as_u64()
                        .is_some_and(|i| ids.progs.contains(&i))
                    || p["filename"].as_str() == Some(&traced)
            })
            .collect();
        if progs.is_empty() && links.is_empty() && maps.is_empty() && perf.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still in the kernel 30 s after tracer {tracer} died: programs {progs:?}, links {links:?}, maps {maps:?}, perf events {perf:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Names in `dir` and their modes.
fn dir_entries(dir: &Path) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let mode = e.metadata().unwrap().permissions().mode() & 0o777;
            (e.file_name().to_string_lossy().into_owned(), mode)
        })
        .collect();
    v.sort();
    v
}

/// Per thread of `pid`: the work() values must be tag<<32 | 0, 1, 2, ..., k-1 (a
/// prefix of the thread's calls: no gap, no duplicate, no reordering) after exactly one
/// thread_main(tag) record. Returns (tag, k) per worker thread, sorted by tag.
fn check_prefixes(recs: &[Rec], pid: u32, what: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mine: Vec<&Rec> = recs.iter().filter(|r| r.pid == pid).collect();
    assert_eq!(mine.len(), recs.len(), "{what}: records of other processes");
    for (tid, rs) in by_tid(mine) {
        let Some(first) = rs.iter().position(|r| &*r.symbol == "thread_main") else {
            assert!(
                rs.iter().all(|r| &*r.symbol != "work"),
                "{what}: tid {tid} calls work() without thread_main"
            );
            continue;
        };
        let tag = rs[first].value;
        let rest = &rs[first + 1..];
        let got: Vec<u64> = rest.iter().map(|r| r.value).collect();
        for (i, r) in rest.iter().enumerate() {
            assert!(
                &*r.symbol == "work" && r.value == tag << 32 | i as u64,
                "{what}: tid {tid} (tag {tag}): record #{i} after thread_main is {r:?}, want work({:#x}); values {:x?}",
                tag << 32 | i as u64,
                &got[i.saturating_sub(3)..(i + 3).min(got.len())]
            );
        }
        assert!(
            rs[..first].iter().all(|r| &*r.symbol != "work"),
            "{what}: tid {tid}: work() before thread_main"
        );
        out.push((tag, rest.len() as u64));
    }
    out.sort_unstable();
    out
}

fn stat(stats: &serde_json::Value, k: &str) -> u64 {
    stats[k]
        .as_u64()
        .unwrap_or_else(|| panic!("stats: no number {k:?} in {stats}"))
}

/// The kernel and the consumer agree and nothing was lost on the way.
fn check_stats_balance(stats: &serde_json::Value, what: &str) {
    for (a, b) in [
        ("records_received", "records_delivered"),
        ("chunks_received", "chunks"),
        ("seq_issued", "chunks"),
    ] {
        assert_eq!(
            stat(stats, a),
            stat(stats, b),
            "{what}: {a} vs {b}: {stats}"
        );
    }
    for k in ["bad_entries", "records_dropped", "read_errors"] {
        assert_eq!(stat(stats, k), 0, "{what}: {k}: {stats}");
    }
}

#[test]
fn tracer_killed_target_runs_on_and_nothing_stays_attached() {
    let b = build("kill-tracer", &[]);
    let (threads, calls) = (THREADS.to_string(), CALLS.to_string());
    // Twice the rounds of the other test: the kill comes later.
    let args = [threads.as_str(), calls.as_str(), "16000"];
    let t0 = Instant::now();
    let want = run(Command::new(&b.orig).args(args), RUN_TIMEOUT).ok();
    let untraced = t0.elapsed();
    eprintln!("untraced run: {untraced:?}");
    assert!(
        untraced > TRACER_KILLED_AFTER * 2,
        "the untraced run ({untraced:?}) is too short to kill the tracer in its middle"
    );

    let outdir = b.tmp.join("out");
    std::fs::create_dir(&outdir).unwrap();
    let trace = outdir.join("t.utrace");
    let (tracer, ids) = {
        let _g = tracing_lock();
        become_subreaper();
        let mut s = Session::start(&trace, &b.traced, &args);
        let tracer = s.child.id();
        let target = s.wait_started();
        let ids = tracer_bpf_objects(tracer);
        std::thread::sleep(TRACER_KILLED_AFTER);
        assert!(alive(target), "target {target} gone before the kill");
        assert!(
            s.stdout_now().is_empty(),
            "target printed its result before the kill"
        );
        // SAFETY: kill has no memory-safety preconditions; tracer is our child.
        assert_eq!(unsafe { libc::kill(tracer as i32, libc::SIGKILL) }, 0);
        let st = s.wait(Duration::from_secs(60));
        assert_eq!(st.signal(), Some(libc::SIGKILL), "tracer: {st:?}");
        let killed_at = Instant::now();

        // The target is now ours (subreaper): its exit status and, through the
        // inherited pipe, its stdout. It printed nothing before the kill, so exiting
        // 0 with the original's output is running on. (It may have finished already:
        // a killed tracer takes ~2 s to die here, one RCU tasks-trace grace period per
        // eBPF link it releases.)
        let st = reap(target, RUN_TIMEOUT);
        eprintln!(
            "target ran {:?} after the tracer was killed",
            killed_at.elapsed()
        );
        let out = s.stdout_to_eof();
        let err = s.stderr_to_eof(Duration::from_secs(10));
        assert_eq!(
            (st.code(), String::from_utf8_lossy(&out).into_owned()),
            (Some(0), want.stdout_str()),
            "target after its tracer was killed; stderr:\n{err}"
        );
        assert!(
            !err.contains("utrace:"),
            "a killed tracer printed a summary:\n{err}"
        );
        (tracer, ids)
    };
    let took = assert_bpf_gone(&ids, tracer, &b.traced);
    eprintln!(
        "tracer {tracer}: {} programs, {} links, {} maps gone {took:?} after it was reaped",
        ids.progs.len(),
        ids.links.len(),
        ids.maps.len()
    );

    // The trace under its name, flagged incomplete: what reached the file (put there
    // at least every second) is a readable, consistent prefix.
    let left = dir_entries(&outdir);
    assert_eq!(
        left,
        [("t.utrace".to_string(), 0o600)],
        "left in the output directory"
    );
    assert_eq!(
        trace_header_flags(&trace) & 1,
        1,
        "header of a killed session"
    );
    assert!(trace_stats(&trace).is_none(), "stats in a killed session");
    let recs = dump(&trace);
    check_sites_valid(&recs, &[&b.meta]);
    let pid = recs
        .first()
        .map(|r| r.pid)
        .expect("no record in the killed session's trace");
    let runs = check_prefixes(&recs, pid, "partial trace");
    let n: u64 = runs.iter().map(|r| r.1).sum();
    eprintln!(
        "killed session's trace: {} records, work() calls {runs:?}",
        recs.len()
    );
    assert!(
        n > 0 && n < THREADS * CALLS,
        "partial trace: work() calls {runs:?}"
    );
    let rep = report(&trace);
    check_report_matches_dump(&rep, &recs);
    assert_eq!(
        (
            &rep.raw["end"]["state"],
            &rep.raw["books"]["known"],
            &rep.raw["books"]["balanced"]
        ),
        (
            &serde_json::json!("did_not_finish"),
            &serde_json::json!(false),
            &serde_json::json!(false)
        ),
        "report of a killed session: {}",
        rep.raw["end"]
    );
    let text = run(
        Command::new(tracer_bin()).arg("report").arg(&trace),
        TRACE_TIMEOUT,
    )
    .ok();
    let (out, err) = (text.stdout_str(), text.stderr_str());
    assert!(
        out.contains("session: did not finish")
            && out.contains("books: unknown")
            && !out.contains("balanced"),
        "report of a killed session:\n{out}"
    );
    assert!(
        err.contains("did not finish"),
        "no warning on stderr: {err}"
    );

    // A new session on the same binary and output path: exact counts and values.
    let (t, n) = (3u64, 20_000u64);
    let small = [t.to_string(), n.to_string(), "100".to_string()];
    let small: Vec<&str> = small.iter().map(|s| s.as_str()).collect();
    let want = run(Command::new(&b.orig).args(&small), RUN_TIMEOUT).ok();
    let r = tracer_record(&trace, &b.traced, &small, &[]);
    assert_eq!(
        (r.stdout_str(), r.status()),
        (want.stdout_str(), 0),
        "new session: {}",
        r.describe()
    );
    let recs = dump(&trace);
    check_sites_valid(&recs, &[&b.meta]);
    let rep = report(&trace);
    check_report_matches_dump(&rep, &recs);
    assert_eq!(
        (
            rep.count_of("work"),
            rep.count_of("thread_main"),
            rep.count_of("main")
        ),
        (t * n, t, 1),
        "new session: calls of work, thread_main, main"
    );
    let runs = check_prefixes(&recs, recs[0].pid, "new session");
    assert_eq!(
        runs,
        (0..t).map(|tag| (tag, n)).collect::<Vec<_>>(),
        "new session: (tag, work() records) per thread"
    );
    let stats = trace_stats(&trace).expect("new session: no stats section");
    check_stats_balance(&stats, "new session");
    assert_eq!(stats["exit_code"].as_i64(), Some(0), "{stats}");
    assert_eq!(
        stat(&stats, "records_received"),
        recs.len() as u64,
        "new session: records in the file"
    );
    assert_eq!(
        trace_header_flags(&trace),
        0,
        "header of a finished session"
    );
    let want_left = vec![("t.utrace".to_string(), 0o600)];
    assert_eq!(dir_entries(&outdir), want_left, "after the new session");
}

#[test]
fn target_killed_during_flushes_ends_a_complete_trace() {
    let b = build("kill-target", &["--buffer-records", "64"]);
    assert_eq!(b.meta.buf_records, 64, "buffer geometry");
    let (threads, calls) = (THREADS.to_string(), CALLS.to_string());
    let args = [threads.as_str(), calls.as_str(), ROUNDS];
    let outdir = b.tmp.join("out");
    std::fs::create_dir(&outdir).unwrap();
    let trace = outdir.join("t.utrace");

    let _g = tracing_lock();
    let mut s = Session::start(&trace, &b.traced, &args);
    let tracer = s.child.id();
    let target = s.wait_started();
    let ids = tracer_bpf_objects(tracer);
    std::thread::sleep(BEFORE_KILL);
    assert!(alive(target), "target {target} gone before the kill");
    // SAFETY: kill has no memory-safety preconditions; target is our tracer's child.
    assert_eq!(unsafe { libc::kill(target as i32, libc::SIGKILL) }, 0);
    let st = s.wait(TRACE_TIMEOUT);
    let out = s.stdout_to_eof();
    let err = s.stderr_to_eof(Duration::from_secs(10));
    assert_eq!(
        (st.code(), out.as_slice()),
        (Some(128 + libc::SIGKILL), &b""[..]),
        "tracer status and target output; stderr:\n{err}"
    );
    drop(_g);
    let took = assert_bpf_gone(&ids, tracer, &b.traced);
    eprintln!("tracer {tracer}: BPF objects gone {took:?} after it exited");

    assert_eq!(
        dir_entries(&outdir),
        [("t.utrace".to_string(), 0o600)],
        "output directory"
    );
    let stats = trace_stats(&trace).expect("no stats section");
    check_stats_balance(&stats, "killed target");
    assert_eq!(
        stats["exit_code"].as_i64(),
        Some(128 + i64::from(libc::SIGKILL)),
        "{stats}"
    );
    let recs = dump(&trace);
    let rep = report(&trace);
    assert_eq!(
        (
            rep.raw["truncated"].as_bool(),
            rep.raw["chunks_lost"].as_u64()
        ),
        (Some(false), Some(0)),
        "report: {}",
        rep.raw
    );
    check_report_matches_dump(&rep, &recs);
    check_sites_valid(&recs, &[&b.meta]);
    assert_eq!(
        stat(&stats, "records_received"),
        recs.len() as u64,
        "records in the file"
    );
    assert!(recs.iter().all(|r| r.pid == target), "foreign pid");

    let runs = check_prefixes(&recs, target, "killed target");
    eprintln!(
        "work() records per thread (tag, count): {runs:?}; {} chunks",
        stat(&stats, "chunks")
    );
    assert_eq!(
        runs.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..THREADS).collect::<Vec<_>>(),
        "worker threads with records"
    );
    // Killed in the middle: every thread flushed many full buffers, none finished.
    for &(tag, k) in &runs {
        assert!(
            (64 * 10..CALLS).contains(&k),
            "thread {tag}: {k} work() records, expected between 640 and {CALLS}"
        );
    }
    let total: u64 = runs.iter().map(|r| r.1).sum();
    assert!(
        stat(&stats, "chunks") >= total / 64,
        "{} chunks for {total} records in 64-record buffers",
        stat(&stats, "chunks")
    );
    assert_eq!(
        (rep.count_of("main"), rep.count_of("thread_main")),
        (1, THREADS),
        "main and thread_main entries"
    );
}
