//! Traces that fit: `record --split SIZE|TIME` and `--max-size SIZE` write the trace in
//! segments `T.1`, `T.2`, ... (tests/fixtures/diff_runs.c: 2,000,000 and more records of
//! one thread, the same sites in the same order in every run).
//! - Split by size: every segment reads on its own (`report --json`: all but the last
//!   "continued", the last "finished"); the segments' dumps one after another are the
//!   dump of `T` (the set read as one), whose sites are those of an unsplit run; a new
//!   session into the same name in fewer segments leaves none of the older ones; a
//!   segment another user plants after the last, or one past a gap, is not read.
//! - `--max-size`: the segments left hold at most the maximum plus one segment; they
//!   are the newest: `T` dumps as the tail of the unsplit run, its records plus the
//!   books' "rotated out" are the records delivered, and no chunk counts as lost.
//! - Split by time: several segments, every record in them.

use std::path::{Path, PathBuf};
use std::process::Command;

use tests::*;

const ARGS: [&str; 3] = ["1000000", "300", "300"];

/// `dump` lines as (site, symbol): what runs of the program share.
fn sites(trace: &Path) -> Vec<(u32, String)> {
    dump(trace)
        .iter()
        .map(|r| (r.site, r.symbol.to_string()))
        .collect()
}

/// The segments of `base` there, in order.
fn segments(base: &Path) -> Vec<PathBuf> {
    let dir = base.parent().unwrap();
    let name = base.file_name().unwrap().to_str().unwrap();
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let f = e.file_name().into_string().ok()?;
            let n = f.strip_prefix(&format!("{name}."))?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

fn record(traced: &Path, trace: &Path, flags: &[&str], args: &[&str]) {
    let _g = tracing_lock();
    let mut c = record_command(flags, trace, traced);
    c.args(args);
    let o = run(&mut c, TRACE_TIMEOUT);
    assert_eq!(o.status(), 0, "{}", o.describe());
}

#[test]
fn traces_in_segments_read_alone_and_as_one() {
    let tmp = TempDir::new("segments");
    let (_, traced, _) = diff_runs_traced(tmp.path());
    let whole = tmp.join("whole.utrace");
    record(&traced, &whole, &[], &ARGS);
    let all = sites(&whole);

    // By size.
    let split = tmp.join("split.utrace");
    record(&traced, &split, &["--split", "1M"], &ARGS);
    assert!(!split.exists(), "a file at the set's own name");
    let parts = segments(&split);
    assert!(parts.len() >= 3, "{parts:?}");
    let mut joined = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let v = report_json(p);
        let want = if i + 1 == parts.len() {
            "finished"
        } else {
            "continued"
        };
        assert_eq!(v["end"]["state"], want, "{}: {}", p.display(), v["end"]);
        let s = sites(p);
        assert_eq!(
            v["records"].as_u64(),
            Some(s.len() as u64),
            "{}",
            p.display()
        );
        joined.extend(s);
    }
    assert_eq!(
        joined,
        sites(&split),
        "segments one after another = the set"
    );
    assert_eq!(joined, all, "the set's sites = an unsplit run's");
    let stats = trace_stats(parts.last().unwrap()).expect("stats in the last segment");
    assert_eq!(
        stats["segments"].as_u64(),
        Some(parts.len() as u64),
        "{stats}"
    );
    // Again into the same name, in fewer segments: the older ones are gone.
    record(&traced, &split, &["--split", "4M"], &ARGS);
    let fewer = segments(&split);
    assert!(fewer.len() < parts.len(), "{fewer:?} after {parts:?}");
    assert_eq!(sites(&split), all, "the set after a second session");
    // Segments planted beside it: one by another user right after the last, one of
    // root's past a gap. Neither is read, and each is named in a warning.
    let n = fewer.len();
    let planted = tmp.join(format!("split.utrace.{}", n + 1));
    std::fs::copy(&fewer[0], &planted).unwrap();
    LocalUser::hostile().own(&planted);
    let stray = tmp.join(format!("split.utrace.{}", n + 5));
    std::fs::copy(&fewer[0], &stray).unwrap();
    assert_eq!(
        sites(&split),
        all,
        "the set with planted segments beside it"
    );
    let o = run(
        Command::new(tracer_bin()).arg("report").arg(&split),
        TRACE_TIMEOUT,
    )
    .ok();
    for (p, why) in [(&planted, "its owner"), (&stray, "does not follow")] {
        let said = format!("{} is not read as part of the trace: ", p.display());
        assert!(
            o.stderr_str()
                .lines()
                .any(|l| l.contains(&said) && l.contains(why)),
            "no warning for {}: {}",
            p.display(),
            o.describe()
        );
    }

    // Within a maximum size.
    let kept = tmp.join("kept.utrace");
    let max = 2u64 << 20;
    record(
        &traced,
        &kept,
        &["--max-size", "2M", "--split", "512K"],
        &ARGS,
    );
    let parts = segments(&kept);
    let bytes: u64 = parts
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        bytes <= max + (512 << 10) + (64 << 10),
        "{bytes} bytes in {parts:?}"
    );
    let v = report_json(&kept);
    let books = &v["books"];
    let (rotated, delivered) = (
        books["rotated_out"].as_u64().unwrap(),
        books["delivered"].as_u64().unwrap(),
    );
    let tail = sites(&kept);
    assert!(rotated > 0, "nothing rotated out: {books}");
    assert_eq!(tail.len() as u64 + rotated, delivered, "{books}");
    assert_eq!(delivered, all.len() as u64, "{books}");
    assert_eq!(
        tail[..],
        all[all.len() - tail.len()..],
        "the newest records kept"
    );
    assert_eq!(v["chunks_lost"], 0, "{v}");
    let first: u64 = parts[0]
        .extension()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        first,
        books["segments_rotated_out"].as_u64().unwrap() + 1,
        "{parts:?}"
    );

    // By time: a longer run.
    let timed = tmp.join("timed.utrace");
    let long = ["3000000", "300", "300"];
    record(&traced, &timed, &["--split", "0.2s"], &long);
    let parts = segments(&timed);
    assert!(parts.len() >= 3, "{parts:?}");
    let v = report_json(&timed);
    assert_eq!(v["records"], v["books"]["delivered"], "{}", v["books"]);
    let bad = run(
        Command::new(tracer_bin()).args(["record", "--split", "0s", "--", "true"]),
        RUN_TIMEOUT,
    );
    assert_ne!(bad.code, Some(0), "{}", bad.describe());
    assert!(bad.stderr_str().contains("0s"), "{}", bad.describe());
}
