//! Checks on records shared by the test files: report vs dump, valid sites, per-thread
//! runs, sequences and monotonic times.

use std::collections::HashMap;
use std::sync::Arc;

use tracer_common::FLAG_KTIME;
use tracer_common::meta::Metadata;

use crate::dump::Rec;
use crate::report::Report;

/// The report agrees with the dump: total, per-thread and per-function counts.
pub fn check_report_matches_dump(rep: &Report, recs: &[Rec]) {
    assert_eq!(
        rep.records + rep.pairs,
        recs.len() as u64,
        "report.records + pairs vs dump lines"
    );
    let mut per_tid: HashMap<(u32, u32), u64> = HashMap::new();
    let mut per_sym_arc: HashMap<(Arc<str>, u32), u64> = HashMap::new();
    for r in recs {
        *per_tid.entry((r.pid, r.tid)).or_default() += 1;
        // Per site: events (a USDT probe's extra argument records do not count).
        if r.flags & tracer_common::FLAG_USDT_MORE == 0 {
            *per_sym_arc.entry((r.symbol.clone(), r.site)).or_default() += 1;
        }
    }
    let per_sym: HashMap<(String, u32), u64> = per_sym_arc
        .into_iter()
        .map(|((s, id), c)| ((s.to_string(), id), c))
        .collect();
    let rep_tid: HashMap<(u32, u32), u64> = rep.threads.iter().map(|t| ((t.0, t.1), t.2)).collect();
    assert_eq!(rep_tid, per_tid, "report.threads vs dump");
    let mut rep_sym: HashMap<(String, u32), u64> = HashMap::new();
    for f in &rep.functions {
        *rep_sym.entry((f.1.clone(), f.2)).or_default() += f.3;
    }
    rep_sym.retain(|_, c| *c > 0);
    assert_eq!(rep_sym, per_sym, "report.functions vs dump");
}

/// Every record names a site of `meta` by id, with that site's symbol.
pub fn check_sites_valid(recs: &[Rec], meta: &[&Metadata]) {
    let mut names: HashMap<u32, Vec<&str>> = HashMap::new();
    for m in meta {
        for s in &m.sites {
            names.entry(s.id).or_default().push(&s.name);
        }
    }
    for (i, r) in recs.iter().enumerate() {
        let ok = names.get(&r.site).is_some_and(|n| n.contains(&&*r.symbol));
        assert!(
            ok,
            "record #{i} has site {} / symbol {:?}, which is not a site of the binary: {r:?}",
            r.site, r.symbol
        );
    }
}

/// Per-thread records in delivery order.
pub fn by_tid<'a>(recs: impl IntoIterator<Item = &'a Rec>) -> Vec<(u32, Vec<&'a Rec>)> {
    let mut order: Vec<u32> = Vec::new();
    let mut m: HashMap<u32, Vec<&'a Rec>> = HashMap::new();
    for r in recs {
        m.entry(r.tid).or_insert_with(|| {
            order.push(r.tid);
            Vec::new()
        });
        m.get_mut(&r.tid).unwrap().push(r);
    }
    order
        .into_iter()
        .map(|t| (t, m.remove(&t).unwrap()))
        .collect()
}

/// Records of many short-lived threads, values `k << 32 | i` (thread tag k, call i):
/// exactly tags 0..k_threads, thread k under one tid with values 0..base+k in order,
/// and under each tid (tids are reused) every thread's records form one run.
pub fn check_thread_runs<'a>(recs: impl IntoIterator<Item = &'a Rec>, k_threads: u64, base: u64) {
    let mut per_k: HashMap<u64, (Vec<u32>, Vec<u64>)> = HashMap::new();
    let mut per_tid: HashMap<u32, Vec<u64>> = HashMap::new();
    for r in recs {
        let k = r.value >> 32;
        let e = per_k.entry(k).or_default();
        if !e.0.contains(&r.tid) {
            e.0.push(r.tid);
        }
        e.1.push(r.value & 0xffff_ffff);
        let ks = per_tid.entry(r.tid).or_default();
        if ks.last() != Some(&k) {
            ks.push(k);
        }
    }
    let missing: Vec<u64> = (0..k_threads).filter(|k| !per_k.contains_key(k)).collect();
    assert!(missing.is_empty(), "no records of threads {missing:?}");
    let mut unexpected: Vec<u64> = per_k.keys().copied().filter(|k| *k >= k_threads).collect();
    unexpected.sort_unstable();
    assert!(
        unexpected.is_empty(),
        "unexpected thread tags {unexpected:?}"
    );
    for k in 0..k_threads {
        let (tids, vals) = &per_k[&k];
        assert_eq!(
            tids.len(),
            1,
            "records of thread {k} under several tids {tids:?}"
        );
        assert_seq_eq(
            vals,
            &(0..base + k).collect::<Vec<_>>(),
            &format!("thread {k}"),
        );
    }
    for (tid, ks) in &per_tid {
        let mut sorted = ks.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            ks.len(),
            "tid {tid}: records of threads {ks:?} interleaved"
        );
    }
}

/// Assert two sequences are equal, reporting the first difference with context.
pub fn assert_seq_eq<T: PartialEq + std::fmt::Debug>(actual: &[T], expected: &[T], what: &str) {
    let first = actual.iter().zip(expected).position(|(a, e)| a != e);
    if first.is_none() && actual.len() == expected.len() {
        return;
    }
    let i = first.unwrap_or(actual.len().min(expected.len()));
    let lo = i.saturating_sub(3);
    panic!(
        "{what}: sequences differ at index {i} (actual length {}, expected {}).\n  actual[{lo}..]:   {:?}\n  expected[{lo}..]: {:?}",
        actual.len(),
        expected.len(),
        &actual[lo..actual.len().min(i + 4)],
        &expected[lo..expected.len().min(i + 4)]
    );
}

/// Inline records (rdtsc based) of one thread carry non-decreasing times.
pub fn check_times_monotonic(recs: &[&Rec], what: &str) {
    let mut last: Option<(usize, u64)> = None;
    for (i, r) in recs.iter().enumerate() {
        if r.flags & FLAG_KTIME != 0 {
            continue;
        }
        let Some(t) = r.time_ns else { continue };
        if let Some((j, lt)) = last {
            assert!(
                t >= lt,
                "{what}: time goes backwards: record {j} at {lt} ns, record {i} at {t} ns ({r:?})"
            );
        }
        last = Some((i, t));
    }
}

/// How many of `pids` each process has, sorted: per-process counts to compare across
/// runs, whose pids differ.
pub fn counts_per_process(pids: impl Iterator<Item = u32>) -> Vec<u64> {
    let mut n: HashMap<u32, u64> = HashMap::new();
    for p in pids {
        *n.entry(p).or_default() += 1;
    }
    let mut v: Vec<u64> = n.into_values().collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::dump::parse_dump_line;
    use crate::report::Report;

    #[test]
    fn sequences() {
        assert_seq_eq(&[1, 2, 3], &[1, 2, 3], "equal");
        let r = std::panic::catch_unwind(|| assert_seq_eq(&[1, 2, 4], &[1, 2, 3], "differ"));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| assert_seq_eq(&[1, 2], &[1, 2, 3], "shorter"));
        assert!(r.is_err());
    }

    #[test]
    fn report_vs_dump() {
        let mut intern = HashMap::new();
        let recs: Vec<Rec> = [
            "1\t1\tb\t0\tmain\t0x1\t0x0\t1\t0",
            "1\t2\tb\t1\tf\t0x1\t0x0\t2\t0",
            "1\t2\tb\t1\tf\t0x2\t0x0\t3\t0",
        ]
        .iter()
        .map(|l| parse_dump_line(l, &mut intern).unwrap())
        .collect();
        let raw: serde_json::Value = serde_json::from_str(
            r#"{"records":3,"dropped":0,
                "functions":[{"binary":"b","symbol":"main","site":0,"count":1},{"binary":"b","symbol":"f","site":1,"count":2},{"binary":"b","symbol":"g","site":2,"count":0}],
                "threads":[{"pid":1,"tid":1,"count":1},{"pid":1,"tid":2,"count":2}]}"#,
        )
        .unwrap();
        let rep = Report {
            records: 3,
            pairs: 0,
            dropped: 0,
            functions: vec![
                ("b".into(), "main".into(), 0, 1),
                ("b".into(), "f".into(), 1, 2),
                ("b".into(), "g".into(), 2, 0),
            ],
            threads: vec![(1, 1, 1), (1, 2, 2)],
            raw,
        };
        check_report_matches_dump(&rep, &recs);
        assert_eq!(rep.count_of("f"), 2);
        let t = by_tid(&recs);
        assert_eq!(
            t.iter()
                .map(|(tid, rs)| (*tid, rs.len()))
                .collect::<Vec<_>>(),
            vec![(1, 1), (2, 2)]
        );
        let refs: Vec<&Rec> = recs.iter().collect();
        check_times_monotonic(&refs, "times");
    }
}
