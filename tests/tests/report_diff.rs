//! `tracer report --diff OLD NEW`: two runs of tests/fixtures/diff_runs.c (`A B C`:
//! fa() A times, fb() B times, fc() C times), old `100 10 0`, new `300 0 20`. Checked
//! against each run's own trace read by `tracer dump` (entries counted, each call's time
//! its exit's time minus its entry's, main's self time its total minus its callees'):
//! calls, total and self time of both runs and their change, fb listed as old only, fc as
//! new only, the order by the change of total time; then the text.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use tests::*;
use tracer_common::meta::{Metadata, SiteKind};

const OLD: [&str; 3] = ["100", "10", "0"];
const NEW: [&str; 3] = ["300", "0", "20"];

/// (calls, total ns, self ns) per function, from a trace's dump.
fn from_dump(recs: &[Rec], meta: &Metadata) -> HashMap<String, (u64, u64, u64)> {
    let kind: HashMap<u32, (SiteKind, &str)> = meta
        .sites
        .iter()
        .map(|s| (s.id, (s.kind, s.name.as_str())))
        .collect();
    let mut out: HashMap<String, (u64, u64, u64)> = HashMap::new();
    for (_, recs) in by_tid(recs) {
        // (function, entry time, time of the callees that ended inside it)
        let mut stack: Vec<(&str, u64, u64)> = Vec::new();
        for r in recs {
            let t = r.time_ns.expect("a time on every record");
            match kind[&r.site] {
                (SiteKind::FunctionEntry, name) => stack.push((name, t, 0)),
                (SiteKind::FunctionExit, name) => {
                    let (f, t0, inner) = stack.pop().expect("an exit with no entry");
                    assert_eq!(f, name, "exit of {name} closes {f}");
                    let total = t - t0;
                    let e = out.entry(name.to_string()).or_default();
                    *e = (e.0 + 1, e.1 + total, e.2 + total - inner);
                    if let Some(parent) = stack.last_mut() {
                        parent.2 += total;
                    }
                }
                other => panic!("unexpected site {other:?}"),
            }
        }
        assert!(stack.is_empty(), "calls left open: {stack:?}");
    }
    out
}

fn record(
    tmp: &TempDir,
    orig: &Path,
    traced: &Path,
    name: &str,
    args: &[&str],
) -> std::path::PathBuf {
    let trace = tmp.join(name);
    record_as_original(&[], &trace, orig, traced, args, name);
    trace
}

#[test]
fn two_runs_compared_function_by_function() {
    let tmp = TempDir::new("report-diff");
    let (orig, traced, meta) = diff_runs_traced(tmp.path());
    let old = record(&tmp, &orig, &traced, "old.utrace", &OLD);
    let new = record(&tmp, &orig, &traced, "new.utrace", &NEW);
    let (a, b) = (from_dump(&dump(&old), &meta), from_dump(&dump(&new), &meta));
    assert_eq!(
        [
            a["fa"].0,
            a["fb"].0,
            a["main"].0,
            b["fa"].0,
            b["fc"].0,
            b["main"].0
        ],
        [100, 10, 1, 300, 20, 1],
        "calls in the dumps"
    );
    assert!(!a.contains_key("fc") && !b.contains_key("fb"));

    let o = run(
        Command::new(tracer_bin())
            .args(["report", "--diff", "--json"])
            .arg(&old)
            .arg(&new),
        TRACE_TIMEOUT,
    )
    .ok();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let functions = v["functions"].as_array().expect("functions");
    let side = |s: &serde_json::Value| -> Option<(u64, u64, u64)> {
        s.as_object().map(|_| {
            let n = |k: &str| s[k].as_u64().unwrap();
            (n("calls"), n("total_ns"), n("self_ns"))
        })
    };
    let mut order = Vec::new();
    for f in functions {
        let name = f["function"].as_str().unwrap();
        assert_eq!(f["binary"], "diff_runs.traced", "{f}");
        let (o, n) = (side(&f["old"]), side(&f["new"]));
        assert_eq!(
            (o, n),
            (a.get(name).copied(), b.get(name).copied()),
            "{name}: {f}"
        );
        let presence = match (o, n) {
            (Some(_), Some(_)) => "both",
            (Some(_), None) => "old_only",
            _ => "new_only",
        };
        assert_eq!(f["presence"], presence, "{f}");
        let (o, n) = (o.unwrap_or_default(), n.unwrap_or_default());
        let ch = |k: &str| f["change"][k].as_i64().unwrap();
        assert_eq!(
            (ch("calls"), ch("total_ns"), ch("self_ns")),
            (
                n.0 as i64 - o.0 as i64,
                n.1 as i64 - o.1 as i64,
                n.2 as i64 - o.2 as i64
            ),
            "{name}: {f}"
        );
        order.push(ch("total_ns").unsigned_abs());
    }
    assert_eq!(functions.len(), 4, "fa, fb, fc, main: {v}");
    assert!(
        order.is_sorted_by(|x, y| x >= y),
        "not by change: {order:?}"
    );

    let text = run(
        Command::new(tracer_bin())
            .args(["report", "--diff"])
            .arg(&old)
            .arg(&new),
        TRACE_TIMEOUT,
    )
    .ok()
    .stdout_str();
    let line = |f: &str| {
        text.lines()
            .find(|l| l.contains(&format!("  {f} (diff_runs.traced)")))
            .unwrap_or_else(|| panic!("no line for {f}:\n{text}"))
            .to_string()
    };
    assert!(line("fb").ends_with("[old only]"), "{text}");
    assert!(line("fc").ends_with("[new only]"), "{text}");
    let fa: Vec<String> = line("fa").split_whitespace().map(String::from).collect();
    assert_eq!(fa[..3], ["100", "300", "+200"], "{text}");
    assert!(
        text.contains("4 functions: 2 in both, 1 in old only, 1 in new only"),
        "{text}"
    );
}
