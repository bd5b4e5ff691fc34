//! Buffer pages that are not resident when they are drained (tests/fixtures/
//! nonresident.c). The fixture writes known records into its own thread buffer and
//! maps a copy of those pages over them (a private file mapping nothing has touched:
//! no page-table entry, the data in the page cache), so `bpf_probe_read_user` (a
//! no-fault read) fails there.
//!
//! - Flush: the flush uprobe program is sleepable where the kernel allows it
//!   (`flush_s`); it retries with `bpf_copy_from_user`, which faults the pages in.
//!   Every record arrives, exactly as written and in order, with no read error and
//!   nothing dropped; the fixture sees the pages resident afterwards (nothing of its
//!   own touched them).
//! - Thread exit: the exit tracepoints cannot sleep, so the same kind of records left
//!   there are not delivered; they are counted (read error, dropped), never silently
//!   lost, and the books still balance.

use std::path::{Path, PathBuf};
use std::process::Command;

use tests::own_slot::{build_rec_only, tag_value, values_in};
use tests::*;

// Value ranges and tags of tests/fixtures/nonresident.c.
const PRE_BASE: u64 = 0x9e_0000_0000;
const PRE_N: u64 = 10;
const AFTER_BASE: u64 = 0xaf_7e00_0000;
const AFTER_N: u64 = 100;
const THREAD_BASE: u64 = 0x7e_ad00_0000;
const THREAD_N: u64 = 10;
const TAG_FLUSH: u64 = 1;
const TAG_EXIT: u64 = 2;
const FLUSH_N: u64 = 640;
const EXIT_N: u64 = 300;

/// nonresident.c compiled and rewritten (only `rec`, 1024-record buffers), and the
/// address of its flush function as the fixture's argument.
fn build(tmp: &TempDir) -> (PathBuf, String) {
    let (traced, flush, _) = build_rec_only(tmp, "nonresident", "1024");
    (traced, flush)
}

/// The numbers after `key` on the fixture's output line starting with `line`.
fn field(stdout: &str, line: &str, key: &str) -> u64 {
    let l = stdout
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no line {line:?} in {stdout:?}"));
    let w: Vec<&str> = l.split_whitespace().collect();
    let i = w
        .iter()
        .position(|x| *x == key)
        .unwrap_or_else(|| panic!("no {key:?} in {l:?}"));
    w[i + 1].parse().unwrap()
}

struct Run {
    out: Out,
    recs: Vec<Rec>,
    rep: Report,
    stats: serde_json::Value,
}

/// Record the fixture in `mode`; None when the kernel has no sleepable uprobes (the
/// flush program is then the plain one) and the run allows that (`tests::skip`).
fn record(tmp: &TempDir, traced: &Path, flush: &str, mode: &str) -> Option<Run> {
    let trace = tmp.join(format!("{mode}.utrace"));
    let out = tracer_record(
        &trace,
        traced,
        &[mode, flush],
        &[("RUST_LOG", "info".as_ref())],
    );
    assert_eq!(out.status(), 0, "{}", out.describe());
    let sleepable = !out.stderr_str().contains("no sleepable flush program");
    if !tests::skip::require(
        "sleepable-uprobes",
        sleepable,
        &format!("nonresident {mode}"),
    ) {
        return None;
    }
    let recs = dump(&trace);
    let rep = report(&trace);
    check_report_matches_dump(&rep, &recs);
    let stats = trace_stats(&trace).expect("stats section");
    eprintln!(
        "{mode}: stdout {:?}\n  books {}\n  read_errors {}",
        out.stdout_str(),
        rep.raw["books"],
        stats["read_errors"]
    );
    Some(Run {
        out,
        recs,
        rep,
        stats,
    })
}

/// The records of `tag`, checked field by field (site, unknown symbol, value, aux,
/// flags) and returned as their indices, in delivery order.
fn tagged(recs: &[&Rec], tag: u64) -> Vec<u64> {
    recs.iter()
        .filter(|r| r.value >> 32 == (0x7a9 << 16) | tag)
        .map(|r| {
            let i = r.value & 0xffff_ffff;
            let v = tag_value(tag, i);
            assert_eq!(
                (r.site, &*r.symbol, r.value, r.aux, r.flags),
                (0x7fff_0000 | tag as u32, "?", v, !v, 0),
                "tag {tag} record {i}: {r:?}"
            );
            i
        })
        .collect()
}

fn books(run: &Run) -> (u64, u64, u64, u64, u64, bool) {
    let b = &run.rep.raw["books"];
    let n = |k: &str| b[k].as_u64().unwrap_or_else(|| panic!("books.{k}: {b}"));
    (
        n("produced"),
        n("delivered"),
        n("filtered"),
        n("dropped"),
        n("received"),
        b["balanced"].as_bool().unwrap(),
    )
}

#[test]
fn nonresident_pages() {
    let tmp = TempDir::new("nonresident");
    let (traced, flush) = build(&tmp);

    // Untraced: the program itself never touches the evicted pages (so any page found
    // resident after a traced flush was faulted in by the tracer's drain).
    let plain = run(Command::new(&traced).args(["both", &flush]), RUN_TIMEOUT).ok();
    let s = plain.stdout_str();
    let pages = field(&s, "flush ", "pages");
    assert!(pages >= 4, "{s}");
    assert_eq!(field(&s, "flush ", "resident_before"), 0, "{s}");
    assert_eq!(field(&s, "flush ", "resident_after"), 0, "{s}");
    let exit_pages = field(&s, "exit pages", "pages");
    assert!(exit_pages >= 2, "{s}");
    assert_eq!(field(&s, "exit pages", "resident_before"), 0, "{s}");
    assert_eq!(field(&s, "exit resident_after", "resident_after"), 0, "{s}");

    // Flush only: every record arrives, no read error, nothing dropped.
    let Some(r) = record(&tmp, &traced, &flush, "flush") else {
        return;
    };
    let s = r.out.stdout_str();
    assert_eq!(field(&s, "flush ", "resident_before"), 0, "{s}");
    assert_eq!(
        field(&s, "flush ", "resident_after"),
        pages,
        "the sleepable flush faulted every page in: {s}"
    );
    let all: Vec<&Rec> = r.recs.iter().collect();
    assert!(all.iter().all(|x| x.tid == all[0].tid), "one thread");
    assert_seq_eq(
        &tagged(&all, TAG_FLUSH),
        &(0..FLUSH_N).collect::<Vec<_>>(),
        "records on non-resident pages, drained by the flush",
    );
    let rec_only: Vec<&Rec> = all
        .iter()
        .copied()
        .filter(|x| &*x.symbol == "rec")
        .collect();
    assert_seq_eq(
        &values_in(&rec_only, PRE_BASE, PRE_N),
        &(0..PRE_N).collect::<Vec<_>>(),
        "records before",
    );
    assert_seq_eq(
        &values_in(&rec_only, AFTER_BASE, AFTER_N),
        &(0..AFTER_N).collect::<Vec<_>>(),
        "records after",
    );
    // Order: the records before, the tagged ones, the records after.
    let order: Vec<u64> = all.iter().map(|x| x.value).collect();
    let mut want: Vec<u64> = (0..PRE_N).map(|i| PRE_BASE + i).collect();
    want.extend((0..FLUSH_N).map(|i| tag_value(TAG_FLUSH, i)));
    want.extend((0..AFTER_N).map(|i| AFTER_BASE + i));
    assert_seq_eq(&order, &want, "delivery order");
    assert_eq!(r.stats["read_errors"], 0, "read errors: {}", r.stats);
    assert_eq!(r.rep.raw["read_errors"], 0);
    let (produced, delivered, filtered, dropped, received, balanced) = books(&r);
    let n = PRE_N + FLUSH_N + AFTER_N;
    assert_eq!(
        (produced, delivered, filtered, dropped, received, balanced),
        (n, n, 0, 0, n, true),
        "books {}",
        r.rep.raw["books"]
    );

    // Both: the same, and a worker thread exits with records on non-resident pages.
    let Some(r) = record(&tmp, &traced, &flush, "both") else {
        return;
    };
    let s = r.out.stdout_str();
    assert_eq!(field(&s, "flush ", "resident_after"), pages, "{s}");
    assert_eq!(field(&s, "exit pages", "resident_before"), 0, "{s}");
    assert_eq!(
        field(&s, "exit resident_after", "resident_after"),
        0,
        "the exit drain cannot fault pages in: {s}"
    );
    let pid = r.recs[0].pid;
    let main: Vec<&Rec> = r.recs.iter().filter(|x| x.tid == pid).collect();
    let worker: Vec<&Rec> = r.recs.iter().filter(|x| x.tid != pid).collect();
    let order: Vec<u64> = main.iter().map(|x| x.value).collect();
    assert_seq_eq(&order, &want, "main thread: delivery order");
    assert_seq_eq(
        &worker.iter().map(|x| x.value).collect::<Vec<_>>(),
        &(0..THREAD_N).map(|i| THREAD_BASE + i).collect::<Vec<_>>(),
        "worker: only its flushed records",
    );
    assert!(tagged(&worker, TAG_EXIT).is_empty());
    let read_errors = r.stats["read_errors"].as_u64().unwrap();
    let (produced, delivered, filtered, dropped, received, balanced) = books(&r);
    let delivered_want = n + THREAD_N;
    assert_eq!(delivered, delivered_want, "books {}", r.rep.raw["books"]);
    assert_eq!(received, delivered_want);
    assert_eq!(filtered, 0);
    // Each exit drain that meets them (sys_enter_exit, then sched_process_exit: the
    // first one failed, so the slot was not released) counts a read error and all
    // EXIT_N records dropped.
    assert!(
        dropped >= EXIT_N && dropped % EXIT_N == 0,
        "the exit records are counted dropped: {}",
        r.rep.raw["books"]
    );
    assert!(
        read_errors >= dropped / EXIT_N,
        "exit drain read errors: {}",
        r.stats
    );
    assert_eq!(produced, delivered + dropped);
    assert!(balanced, "books {}", r.rep.raw["books"]);
}
