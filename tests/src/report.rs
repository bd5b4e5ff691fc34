//! `tracer report --json` parsed into counts.

use std::path::Path;
use std::process::Command;

use crate::command::run;
use crate::paths::tracer_bin;
use crate::tracer::TRACE_TIMEOUT;

/// `tracer report FILE --json`.
#[derive(Debug, Clone)]
pub struct Report {
    pub records: u64,
    /// Of `records`, memory pairs (each two accesses, two `dump` lines).
    pub pairs: u64,
    pub dropped: u64,
    /// (binary, symbol, site, count)
    pub functions: Vec<(String, String, u32, u64)>,
    /// (pid, tid, count)
    pub threads: Vec<(u32, u32, u64)>,
    pub raw: serde_json::Value,
}

impl Report {
    /// Sum of the counts of `symbol` over all binaries.
    pub fn count_of(&self, symbol: &str) -> u64 {
        self.functions
            .iter()
            .filter(|f| f.1 == symbol)
            .map(|f| f.3)
            .sum()
    }
}

/// `tracer report --json TRACE` as parsed JSON (the command must succeed).
pub fn report_json(trace: &Path) -> serde_json::Value {
    let mut c = Command::new(tracer_bin());
    c.arg("report").arg(trace).arg("--json");
    let out = run(&mut c, TRACE_TIMEOUT).ok();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("tracer report --json is not JSON ({e}): {}", out.describe()))
}

pub fn report(trace: &Path) -> Report {
    let v = report_json(trace);
    let num = |v: &serde_json::Value, k: &str| -> u64 {
        v.get(k)
            .and_then(|x| x.as_u64())
            .unwrap_or_else(|| panic!("report: missing number {k:?} in {v}"))
    };
    let arr = |k: &str| -> Vec<serde_json::Value> {
        v.get(k)
            .and_then(|x| x.as_array())
            .cloned()
            .unwrap_or_else(|| panic!("report: missing array {k:?}"))
    };
    let functions = arr("functions")
        .iter()
        .map(|f| {
            (
                f.get("binary")
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
                    .to_string(),
                f.get("symbol")
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
                    .to_string(),
                num(f, "site") as u32,
                num(f, "count"),
            )
        })
        .collect();
    let threads = arr("threads")
        .iter()
        .map(|t| (num(t, "pid") as u32, num(t, "tid") as u32, num(t, "count")))
        .collect();
    Report {
        records: num(&v, "records"),
        pairs: v.get("pairs").and_then(|x| x.as_u64()).unwrap_or(0),
        dropped: num(&v, "dropped"),
        functions,
        threads,
        raw: v,
    }
}
