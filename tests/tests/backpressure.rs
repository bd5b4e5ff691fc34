//! Back-pressure: fixtures/stress.c with 64 threads × 100,000 calls of hit(tag << 32 |
//! i), 128-record buffers (4 KiB), into a 64 KiB ring buffer that cannot take what
//! they produce.
//! - `--on-full wait` (the default): every thread's 100,000 records arrive, values in
//!   order, nothing dropped, and the books show flushes that waited;
//! - `--on-full drop`: the books balance exactly, produced is what the program made
//!   (the waiting run's count), and each thread's records are an ordered subset.

use std::path::PathBuf;
use std::process::Command;

use tests::*;

const THREADS: u64 = 64;
const CALLS: u64 = 100_000;

struct Built {
    _tmp: TempDir,
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
    let traced = tmp.join("stress.traced");
    let (_, _, meta, _) = rewrite_args(&orig, &traced, &["--buffer-records", "128"]);
    let trace = tmp.join("stress.utrace");
    Built {
        _tmp: tmp,
        traced,
        trace,
        meta,
    }
}

/// Records the flood with `flags`; returns hit's records by thread and the books.
fn flood(b: &Built, flags: &[&str]) -> (Vec<(u32, Vec<Rec>)>, serde_json::Value) {
    let args = ["threads", "64", "100000"];
    let want = format!("threads total={}\n", THREADS * CALLS);
    let o = run(Command::new(&b.traced).args(args), TRACE_TIMEOUT);
    assert_eq!(
        (o.stdout_str(), o.status()),
        (want.clone(), 0),
        "{}",
        o.describe()
    );
    let mut all = vec!["--ring-bytes", "64K"];
    all.extend_from_slice(flags);
    let r = tracer_record_with(&all, &b.trace, &b.traced, &args, &[]);
    assert_eq!(
        (r.stdout_str(), r.status()),
        (want, 0),
        "under tracer record: {}",
        r.describe()
    );
    let recs = dump(&b.trace);
    check_sites_valid(&recs, &[&b.meta]);
    let books = report_json(&b.trace)["books"].clone();
    assert_eq!(books["balanced"], true, "books: {books}");
    assert_eq!(
        books["received"].as_u64(),
        Some(recs.len() as u64),
        "records in the file: {books}"
    );
    let hits = recs
        .into_iter()
        .filter(|r| &*r.symbol == "hit")
        .collect::<Vec<_>>();
    let threads = by_tid(hits.iter())
        .into_iter()
        .map(|(tid, rs)| (tid, rs.into_iter().cloned().collect()))
        .collect();
    (threads, books)
}

/// Each thread's values are its tag << 32 | i, i increasing (all of them if `exact`).
fn check_threads(threads: &[(u32, Vec<Rec>)], exact: bool) {
    let mut tags = Vec::new();
    for (tid, rs) in threads {
        let tag = rs[0].value >> 32;
        let mut last = None;
        for (i, r) in rs.iter().enumerate() {
            let n = r.value & 0xffff_ffff;
            assert_eq!(r.value >> 32, tag, "thread {tid} record #{i}: {r:?}");
            if exact {
                assert_eq!(n, i as u64, "thread {tid} record #{i}: {r:?}");
            }
            assert!(
                last < Some(n),
                "thread {tid} record #{i} out of order: {r:?}"
            );
            last = Some(n);
        }
        if exact {
            assert_eq!(rs.len() as u64, CALLS, "records of thread {tid}");
        }
        tags.push(tag);
    }
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), threads.len(), "one tag per thread");
}

fn num(books: &serde_json::Value, field: &str) -> u64 {
    books[field]
        .as_u64()
        .unwrap_or_else(|| panic!("books.{field}: {books}"))
}

#[test]
fn flood_into_small_ring_waits_and_loses_nothing() {
    let b = build("bp-wait");
    let (threads, books) = flood(&b, &[]);
    assert_eq!(threads.len() as u64, THREADS, "threads with hit records");
    check_threads(&threads, true);
    assert_eq!(num(&books, "dropped"), 0, "books: {books}");
    assert!(num(&books, "holds") > 0, "no flush waited: {books}");

    // `--on-full drop`: the same program loses records, and says exactly how many.
    let produced = num(&books, "produced");
    let (threads, books) = flood(&b, &["--on-full", "drop"]);
    check_threads(&threads, false);
    assert_eq!(num(&books, "produced"), produced, "produced: {books}");
    assert_eq!(num(&books, "holds"), 0, "books: {books}");
    assert_eq!(
        num(&books, "delivered") + num(&books, "dropped"),
        produced,
        "books: {books}"
    );
}
