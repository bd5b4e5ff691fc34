//! The drain section's report: the session's fixed cost, a row per case, the filters'
//! cost per record, and the target.

use super::session::Session;
use super::{BUFFER_RECORDS, Case, RING};

/// A case's result: its best session, or why there is none.
type CaseRow<'a> = (&'a Case, std::result::Result<Session, String>);

/// Print the section: `empty` is the empty session, `rows` a result per case.
pub(super) fn print_drain(empty: &Session, rows: &[CaseRow], n: u64, runs: u32, total_s: f64) {
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
    let base = print_rows(empty, rows);
    print_filter_cost(rows, base);
    print_target(rows);
    println!("drain section: {total_s:.1} s");
}

/// `records / s` in millions, or "-" without time.
fn m(records: u64, s: f64) -> String {
    if s > 0.0 {
        format!("{:.1}", records as f64 / s / 1e6)
    } else {
        "-".into()
    }
}

/// The table, two lines per case; returns the unfiltered 1-thread session (the filters'
/// baseline).
fn print_rows<'a>(empty: &Session, rows: &'a [CaseRow]) -> Option<&'a Session> {
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
        print_session(case.name, s, empty);
    }

    base
}

/// A session's two lines: its rates, then where its CPU went.
fn print_session(name: &str, s: &Session, empty: &Session) {
    let p = s.produced();
    let opt = |k: &str| s.stat(k).map_or("-".to_string(), |v| v.to_string());
    println!(
        "{:<27} {:>9} {:>6.3} {:>6} {:>7} {:>7.2} {:>6} {:>8.3} {:>6} {:>9} {:>9} {:>9}  {}",
        name,
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

/// Filtering cost per record, against the unfiltered 1-thread row `base`.
fn print_filter_cost(rows: &[CaseRow], base: Option<&Session>) {
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
}

/// The target, on the record path's CPU.
fn print_target(rows: &[CaseRow]) {
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
}
