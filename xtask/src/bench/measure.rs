//! Measuring a fixture run: its own "ns_per_iter" line, the best of several runs, and the
//! error text a row shows instead of a figure.

use std::process::Command;

use crate::util;

/// ns per iteration, or why there is no figure.
pub(super) type Measure = std::result::Result<f64, String>;

/// Best (lowest) of `runs` measurements; the first error ends the series.
pub(super) fn best(runs: u32, mut f: impl FnMut() -> Measure) -> Measure {
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        best = best.min(f()?);
    }
    Ok(best)
}

/// Run a fixture (possibly under the tracer) and read its "ns_per_iter" line.
pub(super) fn measure(c: &mut Command) -> Measure {
    let o = util::output(c).map_err(|e| format!("{e:#}"))?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            util::show(c),
            util::describe(o.status),
            first_line(&stderr)
        ));
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_iter "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no ns_per_iter line in the output of {}", util::show(c)))
}

pub(super) fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}
