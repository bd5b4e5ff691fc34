//! What `tracer report --json` of a batch session must say: balanced books, nothing
//! dropped, every entry paired with its exit; and per binary, entries per function.

use std::collections::HashMap;

use anyhow::{Context, Result};
use serde_json::Value;

/// Session-wide faults (each names what is wrong); empty when the session is clean.
pub(super) fn session_faults(report: &Value) -> Vec<String> {
    let n = |path: &[&str]| -> u64 {
        path.iter()
            .try_fold(report, |v, k| v.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX)
    };
    let mut faults = Vec::new();
    if report.pointer("/books/balanced") != Some(&Value::Bool(true)) {
        faults.push(format!("books not balanced: {}", report["books"]));
    }
    for (what, path) in [
        ("records dropped", &["dropped"][..]),
        ("chunks lost", &["chunks_lost"]),
        ("read errors", &["read_errors"]),
        ("lost before attach", &["books", "unattached"]),
        ("exits without their entry", &["calls", "unmatched_exits"]),
        ("calls without their exit", &["calls", "unfinished"]),
    ] {
        let v = n(path);
        if v != 0 {
            faults.push(format!("{what}: {v}"));
        }
    }
    faults
}

/// Entry records per function, per binary (file name).
pub(super) fn entries(report: &Value) -> Result<HashMap<String, HashMap<String, u64>>> {
    let mut out: HashMap<String, HashMap<String, u64>> = HashMap::new();
    let sites = report["functions"]
        .as_array()
        .context("the report has no functions")?;
    for s in sites.iter().filter(|s| s["kind"] == "entry") {
        let (Some(bin), Some(sym), Some(count)) = (
            s["binary"].as_str(),
            s["symbol"].as_str(),
            s["count"].as_u64(),
        ) else {
            continue;
        };
        *out.entry(bin.to_string())
            .or_default()
            .entry(sym.to_string())
            .or_default() += count;
    }
    Ok(out)
}
