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
//! drain (`tracer record --user`: socket + ptrace, no eBPF). The fixture has no TLS of
//! its own, so its stubs find their slot through the thread word the rewriter adds (a
//! `PT_TLS` of 8 bytes, read at `%fs:-8`); the `own_tls` tests build it with a
//! `__thread` variable, which keeps the index (readelf and objdump tell which).

use std::path::{Path, PathBuf};
use std::process::Command;

use tests::*;

struct Built {
    _tmp: TempDir,
    orig: PathBuf,
    traced: PathBuf,
    trace: PathBuf,
    meta: Metadata,
}

fn build(tag: &str, own_tls: bool) -> Built {
    let tmp = TempDir::new(tag);
    let orig = tmp.join("stress");
    let mut flags = vec!["-O2", "-g", "-pthread"];
    if own_tls {
        flags.push("-DOWN_TLS");
    }
    compile("gcc", &[fixture("stress.c")], &flags, &orig);
    let (traced, _, meta) = rewrite(&orig, None, &[]);
    assert_eq!(traced, tmp.join("stress.traced"), "default output path");
    check_slot_lookup(&orig, &traced, own_tls);
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

/// `readelf -lW`'s TLS lines.
fn tls_headers(bin: &Path) -> Vec<String> {
    let o = run(Command::new("readelf").arg("-lW").arg(bin), TRACE_TIMEOUT);
    assert_eq!(o.status(), 0, "{}", o.describe());
    o.stdout_str()
        .lines()
        .filter(|l| l.trim_start().starts_with("TLS "))
        .map(str::to_string)
        .collect()
}

/// Without TLS of its own the rewritten executable gets a `PT_TLS` of 8 bytes and its
/// stubs read `%fs:-8`; with its own, its TLS header is unchanged and no stub does.
fn check_slot_lookup(orig: &Path, traced: &Path, own_tls: bool) {
    let (before, after) = (tls_headers(orig), tls_headers(traced));
    let dis = run(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(traced),
        TRACE_TIMEOUT,
    );
    let word_loads = dis
        .stdout_str()
        .lines()
        .filter(|l| l.contains("mov    %fs:0xfffffffffffffff8,%esi"))
        .count();
    if own_tls {
        assert_eq!((before.len(), &after), (1, &before), "TLS headers");
        assert_eq!(word_loads, 0, "stubs reading a thread word");
    } else {
        assert!(before.is_empty(), "TLS of its own: {before:?}");
        let f: Vec<&str> = after.iter().flat_map(|l| l.split_whitespace()).collect();
        // Type Offset VirtAddr PhysAddr FileSiz MemSiz Flg Align
        assert_eq!(
            (f.len(), f.get(4), f.get(5), f.last()),
            (8, Some(&"0x000000"), Some(&"0x000008"), Some(&"0x8")),
            "the added TLS header: {after:?}"
        );
        assert!(word_loads >= 2, "{word_loads} stubs read the thread word");
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
    let b = build("stress-one", false);
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

fn eight_threads_100k_calls_each(flags: &[&str], own_tls: bool) {
    let b = build("stress-threads", own_tls);
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

fn two_thousand_short_lived_threads(flags: &[&str], own_tls: bool) {
    let b = build("stress-churn", own_tls);
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
    eight_threads_100k_calls_each(&[], false);
}

#[test]
fn kernel_two_thousand_short_lived_threads() {
    two_thousand_short_lived_threads(&[], false);
}

#[test]
fn user_one_thread_million_calls() {
    one_thread_million_calls(&["--user"]);
}

#[test]
fn user_eight_threads_100k_calls_each() {
    eight_threads_100k_calls_each(&["--user"], false);
}

#[test]
fn user_two_thousand_short_lived_threads() {
    two_thousand_short_lived_threads(&["--user"], false);
}

#[test]
fn kernel_eight_threads_100k_calls_each_own_tls() {
    eight_threads_100k_calls_each(&[], true);
}

#[test]
fn kernel_two_thousand_short_lived_threads_own_tls() {
    two_thousand_short_lived_threads(&[], true);
}
