//! `tracer record --min-duration`: the duration filter in both drains, checked against
//! the unfiltered trace of the same program (tests/fixtures/min_duration.c), read by
//! `tracer dump`.
//!
//! A session has one filter, so the unfiltered trace is another run of the same
//! deterministic program: the same calls with the same arguments, in the same order. Its
//! calls are 2 ms and more (slow() sleeps) or well under a microsecond, against a
//! threshold of 500 us, so each call is on the same side of it in both runs. The
//! expected calls are those of the unfiltered trace that lasted at least the threshold,
//! or that began deeper than the filter's stacks (`CALL_DEPTH` open calls below them),
//! by their first argument and order; each kept call's own times (this run's) must show
//! it lasted the threshold. The books must count what was not kept: every record of the
//! short calls, and the deep entries passed unjudged.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tests::*;
use tracer_common::duration::CALL_DEPTH;
use tracer_common::meta::{Metadata, SiteKind};

const THRESHOLD: &str = "500us";
const THRESHOLD_NS: u64 = 500_000;
const ROUNDS: &str = "6";

/// One call of a trace: its function, first argument, times, and how many calls were
/// open below it.
#[derive(Debug, Clone)]
struct Call {
    function: String,
    arg: u64,
    start: u64,
    end: u64,
    depth: usize,
}

/// The calls of a trace, in the order they began; every exit must close the innermost
/// open call, of its own function.
fn calls(recs: &[Rec], meta: &Metadata) -> Vec<Call> {
    let kind: std::collections::HashMap<u32, (SiteKind, &str)> = meta
        .sites
        .iter()
        .map(|s| (s.id, (s.kind, s.name.as_str())))
        .collect();
    let mut out: Vec<Call> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for r in recs {
        let t = r.time_ns.expect("a time on every record");
        match kind[&r.site] {
            (SiteKind::FunctionEntry, name) => {
                open.push(out.len());
                out.push(Call {
                    function: name.to_string(),
                    arg: r.value,
                    start: t,
                    end: 0,
                    depth: open.len() - 1,
                });
            }
            (SiteKind::FunctionExit, name) => {
                let i = open
                    .pop()
                    .unwrap_or_else(|| panic!("{name}: an exit with no entry"));
                assert_eq!(
                    out[i].function, name,
                    "an exit of {name} closes {:?}",
                    out[i]
                );
                out[i].end = t;
            }
            other => panic!("unexpected site {other:?}"),
        }
    }
    assert!(open.is_empty(), "calls left open: {open:?}");
    out
}

/// The fixture, and its rewritten copy with entry and exit sites in its functions
/// (`time`: the rewriter's `--time`; `extra`: more rewriter options).
fn build(dir: &Path, time: &str, extra: &[&str]) -> (PathBuf, PathBuf, Metadata) {
    let (orig, traced) = (
        dir.join("min_duration"),
        dir.join(format!("md_{time}.traced")),
    );
    if !orig.exists() {
        compile("gcc", &[fixture("min_duration.c")], &["-O2"], &orig);
    }
    let mut args: Vec<std::ffi::OsString> =
        vec![orig.clone().into(), "-o".into(), traced.clone().into()];
    for f in ["quick", "slow", "mid", "deep", "wait_for", "main"] {
        args.extend(["--functions".into(), f.into()]);
    }
    args.extend(["--sites", "entry,exit", "--time", time].map(Into::into));
    args.extend(extra.iter().map(Into::into));
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    rewriter(&args).ok();
    let meta = metadata(&traced);
    (orig, traced, meta)
}

/// Record `traced` with `flags`; its output must be the original's.
fn record(dir: &Path, orig: &Path, traced: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let trace = dir.join(name);
    record_as_original(flags, &trace, orig, traced, &[ROUNDS], name);
    trace
}

/// The calls of `all` the filter must keep.
fn expected(all: &[Call]) -> Vec<&Call> {
    all.iter()
        .filter(|c| c.end - c.start >= THRESHOLD_NS || c.depth >= CALL_DEPTH)
        .collect()
}

/// Check the filtered trace `kept_trace` against the unfiltered `all_trace`.
fn check(all_trace: &Path, kept_trace: &Path, meta: &Metadata, what: &str) {
    let all = calls(&dump(all_trace), meta);
    let kept = calls(&dump(kept_trace), meta);
    let want = expected(&all);
    let key = |c: &Call| (c.function.clone(), c.arg);
    assert_eq!(
        kept.iter().map(key).collect::<Vec<_>>(),
        want.iter().map(|c| key(c)).collect::<Vec<_>>(),
        "{what}: the calls kept"
    );
    // Every kind of call on both sides of the threshold, and deep ones.
    let short = all.len() - want.len();
    let deep = want.iter().filter(|c| c.depth >= CALL_DEPTH).count();
    assert!(
        short > 50 && deep >= 8,
        "{what}: {short} short, {deep} deep"
    );
    for f in ["slow", "main"] {
        assert!(want.iter().any(|c| c.function == f), "{what}: no long {f}");
    }
    for (k, w) in kept.iter().zip(&want) {
        if w.depth < CALL_DEPTH {
            assert!(
                k.end - k.start >= THRESHOLD_NS,
                "{what}: kept {k:?} lasted {} ns",
                k.end - k.start
            );
        }
    }
    // The books: every record of the short calls filtered, the deep entries counted.
    let b = &report_json(kept_trace)["books"];
    let produced = report_json(all_trace)["books"]["produced"]
        .as_u64()
        .unwrap();
    let n = |k: &str| b[k].as_u64().unwrap_or_else(|| panic!("{k}: {b}"));
    assert_eq!(n("produced"), produced, "{what}: {b}");
    assert_eq!(n("delivered"), 2 * kept.len() as u64, "{what}: {b}");
    assert_eq!(n("filtered"), 2 * short as u64, "{what}: {b}");
    assert_eq!(
        (n("dropped"), b["balanced"].as_bool()),
        (0, Some(true)),
        "{what}: {b}"
    );
    assert_eq!(n("calls_short"), short as u64, "{what}: {b}");
    assert_eq!(n("calls_deep"), deep as u64, "{what}: {b}");
}

#[test]
fn only_calls_at_least_this_long_are_kept_in_both_drains() {
    let tmp = TempDir::new("min-duration");
    let (orig, traced, meta) = build(tmp.path(), "record", &[]);
    let d = tmp.path();
    let all = record(d, &orig, &traced, "all.utrace", &[]);
    let kept = record(
        d,
        &orig,
        &traced,
        "kept.utrace",
        &["--min-duration", THRESHOLD],
    );
    check(&all, &kept, &meta, "eBPF drain");

    let all = record(d, &orig, &traced, "all_user.utrace", &["--user"]);
    let flags = ["--user", "--min-duration", THRESHOLD];
    let kept = record(d, &orig, &traced, "kept_user.utrace", &flags);
    check(&all, &kept, &meta, "user drain");

    // 0 keeps every call, each entry written as it is drained.
    let every = record(d, &orig, &traced, "zero.utrace", &["--min-duration", "0"]);
    let n = calls(&dump(&every), &meta).len();
    assert_eq!(n, calls(&dump(&all), &meta).len());
}

#[test]
fn binaries_without_a_clock_at_calls_are_refused() {
    let tmp = TempDir::new("min-duration-coarse");
    let (_, traced, _) = build(tmp.path(), "coarse", &[]);
    let trace = tmp.join("t.utrace");
    for flags in [
        &["--min-duration", "1ms"][..],
        &["--user", "--min-duration", "1ms"],
    ] {
        let _g = tracing_lock();
        let out = run(
            record_command(flags, &trace, &traced).arg(ROUNDS),
            TRACE_TIMEOUT,
        );
        assert!(!out.success(), "{flags:?}: {}", out.describe());
        let err = out.stderr_str();
        assert!(
            err.contains("md_coarse.traced") && err.contains("--time coarse"),
            "{flags:?}: {err}"
        );
        assert!(!trace.exists(), "{flags:?}: a trace was left");
    }
}

/// A running session of `traced ROUNDS GO` (waiting for GO); its control socket ready.
fn waiting_session(flags: &[&str], trace: &Path, traced: &Path, go: &Path) -> std::process::Child {
    let mut tracer = record_command(flags, trace, traced)
        .arg(ROUNDS)
        .arg(go)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(tracer.stdout.as_mut().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "waiting");
    wait_for_control_socket(&tracer);
    tracer
}

fn filter(session: u32, args: &[&str]) -> Out {
    run(
        Command::new(tracer_bin())
            .args(["filter", "--session", &session.to_string()])
            .args(args),
        RUN_TIMEOUT,
    )
}

#[test]
fn the_threshold_changes_while_the_session_runs() {
    let tmp = TempDir::new("min-duration-live");
    // 64-record buffers: main's entry and 31 quick() calls, then wait_for()'s entry
    // fills the first buffer, drained under the first filter before the change.
    let (_, traced, meta) = build(tmp.path(), "record", &["--buffer-records", "64"]);
    let (trace, go) = (tmp.join("t.utrace"), tmp.join("go"));
    std::fs::write(&go, "").unwrap();
    let all = tmp.join("all.utrace");
    let args = [ROUNDS, go.to_str().unwrap()];
    tracer_record_with(&[], &all, &traced, &args, &[]).ok();
    std::fs::remove_file(&go).unwrap();
    let _g = tracing_lock();
    // Nothing lasts 10 s: the 31 quick() calls go, main's entry is held. The filter
    // cleared, the stacks go on with threshold 0: every later call is kept, and main's
    // entry is written before its exit, not lost.
    let mut tracer = waiting_session(&["--min-duration", "10s"], &trace, &traced, &go);
    let out = filter(tracer.id(), &["--clear"]).ok();
    assert!(
        out.stdout_str().contains("filter: none"),
        "{}",
        out.describe()
    );
    std::fs::write(&go, "").unwrap();
    assert!(tracer.wait().unwrap().success());
    let (a, b) = (calls(&dump(&all), &meta), calls(&dump(&trace), &meta));
    // wait_for's argument is a pointer (to GO, on the stack).
    let key = |c: &Call| {
        (
            c.function.clone(),
            if c.function == "wait_for" { 0 } else { c.arg },
        )
    };
    let warmup = |c: &&Call| c.function == "quick" && c.arg < 31;
    assert_eq!(a.iter().filter(warmup).count(), 31);
    assert_eq!(
        b.iter().map(key).collect::<Vec<_>>(),
        a.iter().filter(|c| !warmup(c)).map(key).collect::<Vec<_>>()
    );
    let r = report_json(&trace);
    assert_eq!(r["books"]["filter_changes"], 1, "{}", r["books"]);
    assert_eq!(r["books"]["calls_short"], 31, "{}", r["books"]);

    // A session started without it has no room for it: said, and nothing changes.
    std::fs::remove_file(&go).unwrap();
    let plain = tmp.join("plain.utrace");
    let mut tracer = waiting_session(&[], &plain, &traced, &go);
    let out = filter(tracer.id(), &["--min-duration", "1ms"]);
    assert!(
        !out.success() && out.stderr_str().contains("started without"),
        "{}",
        out.describe()
    );
    std::fs::write(&go, "").unwrap();
    assert!(tracer.wait().unwrap().success());
    assert_eq!(calls(&dump(&plain), &meta).len(), a.len());
}
