//! Volume and threads, fixtures/stress.c (gcc -O2, PIE, every function instrumented),
//! rewritten to the default output path (INPUT.traced).
//! - one thread × 1,000,000 calls of hit(i): exactly 1,000,000 records, values 0..999999
//!   in order;
//! - 8 threads × 100,000 calls: 8 distinct tids, 100,000 records each, values in order;
//! - 2,000 short-lived threads (at most 64 alive), thread k calls hit 100 + k times:
//!   exact counts per thread, values in order, no record of thread k under another tid
//!   (more threads than buffer slots: slots must be released and reused).
//!
//! Each runs twice: through the kernel (flush uprobe + eBPF) and with the user-space
//! drain (`tracer record --user`: socket + ptrace, no eBPF).

use std::path::PathBuf;
use std::process::Command;

use tests::*;

struct Built {
    _tmp: TempDir,
    orig: PathBuf,
    traced: PathBuf,
    trace: PathBuf,
    meta: Metadata,
}

fn build(tag: &str) -> Built {
    let tmp = TempDir::new(tag);
    let orig = tmp.join("stress");
    compile(
        "gcc",
        &[fixture("stress.c")],
        &["-O2", "-g", "-pthread"],
        &orig,
    );
    let (traced, _, meta) = rewrite(&orig, None, &[]);
    assert_eq!(traced, tmp.join("stress.traced"), "default output path");
    assert!(
        meta.sites.iter().any(|s| s.name == "hit"),
        "no site for hit"
    );
    let trace = tmp.join("stress.utrace");
    Built {
        _tmp: tmp,
        orig,
        traced,
        trace,
        meta,
    }
}

/// Runs original, rewritten and rewritten-under-tracer with `args`; all must print
/// `want` and exit 0. Returns the records of `hit` and all records.
fn run_all(b: &Built, flags: &[&str], args: &[&str], want: &str) -> Vec<Rec> {
    for bin in [&b.orig, &b.traced] {
        let o = run(Command::new(bin).args(args), TRACE_TIMEOUT);
        assert_eq!(
            (o.stdout_str().as_str(), o.status()),
            (want, 0),
            "{}",
            o.describe()
        );
    }
    let r = tracer_record_with(flags, &b.trace, &b.traced, args, &[]);
    assert_eq!(
        (r.stdout_str().as_str(), r.status()),
        (want, 0),
        "under tracer record: {}",
        r.describe()
    );
    let recs = dump(&b.trace);
    check_sites_valid(&recs, &[&b.meta]);
    let rep = report(&b.trace);
    assert_eq!(rep.dropped, 0, "dropped records");
    check_report_matches_dump(&rep, &recs);
    recs
}

fn one_thread_million_calls(flags: &[&str]) {
    let b = build("stress-one");
    let n = 1_000_000u64;
    let recs = run_all(&b, flags, &["one", "1000000"], "one total=1000000\n");
    let hits: Vec<&Rec> = recs.iter().filter(|r| &*r.symbol == "hit").collect();
    assert_eq!(hits.len() as u64, n, "records of hit");
    let pid = hits[0].pid;
    for (i, r) in hits.iter().enumerate() {
        assert_eq!(
            (r.pid, r.tid, r.value),
            (pid, pid, i as u64),
            "record #{i} of hit: {r:?}"
        );
    }
    check_times_monotonic(&hits, "hit records");
    let rep = report(&b.trace);
    assert_eq!(rep.count_of("hit"), n, "report count of hit");
}

fn eight_threads_100k_calls_each(flags: &[&str]) {
    let b = build("stress-threads");
    let n = 100_000u64;
    let recs = run_all(
        &b,
        flags,
        &["threads", "8", "100000"],
        "threads total=800000\n",
    );
    let pid = recs[0].pid;
    let hits: Vec<&Rec> = recs.iter().filter(|r| &*r.symbol == "hit").collect();
    let threads = by_tid(hits.iter().copied());
    let tids: Vec<u32> = threads.iter().map(|t| t.0).collect();
    assert_eq!(threads.len(), 8, "threads with hit records: {tids:?}");
    let mut tags = Vec::new();
    for (tid, rs) in &threads {
        assert_ne!(*tid, pid, "the main thread does not call hit");
        assert_eq!(rs.len() as u64, n, "records of thread {tid}");
        let tag = rs[0].value >> 32;
        for (i, r) in rs.iter().enumerate() {
            assert_eq!(
                r.value,
                tag << 32 | i as u64,
                "thread {tid} record #{i}: {r:?}"
            );
        }
        check_times_monotonic(rs, &format!("thread {tid}"));
        tags.push(tag);
    }
    tags.sort_unstable();
    assert_eq!(tags, (0..8).collect::<Vec<u64>>(), "thread tags");
}

fn two_thousand_short_lived_threads(flags: &[&str]) {
    let b = build("stress-churn");
    let (k_threads, base) = (2000u64, 100u64);
    let total: u64 = (0..k_threads).map(|k| base + k).sum();
    let recs = run_all(
        &b,
        flags,
        &["churn", "2000", "64", "100"],
        &format!("churn total={total}\n"),
    );
    check_thread_runs(recs.iter().filter(|r| &*r.symbol == "hit"), k_threads, base);
}

#[test]
fn kernel_one_thread_million_calls() {
    one_thread_million_calls(&[]);
}

#[test]
fn kernel_eight_threads_100k_calls_each() {
    eight_threads_100k_calls_each(&[]);
}

#[test]
fn kernel_two_thousand_short_lived_threads() {
    two_thousand_short_lived_threads(&[]);
}

#[test]
fn user_one_thread_million_calls() {
    one_thread_million_calls(&["--user"]);
}

#[test]
fn user_eight_threads_100k_calls_each() {
    eight_threads_100k_calls_each(&["--user"]);
}

#[test]
fn user_two_thousand_short_lived_threads() {
    two_thousand_short_lived_threads(&["--user"]);
}
