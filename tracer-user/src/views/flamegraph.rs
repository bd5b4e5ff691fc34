//! `tracer flamegraph`: an SVG (inferno) of self time per call stack, from the
//! entry/exit pairs of a trace.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::{
    read::{calls::Calls, events::each_record, names::Names, range::TimeRange},
    views::export::write_atomically,
};

/// Largest total drawn in nanoseconds (2^53: sums stay exact and far from overflow).
const MAX_TOTAL: u64 = 1 << 53;

/// `tracer flamegraph`: an SVG of self time per call stack (entry/exit pairs).
pub fn flamegraph(
    trace: &Path,
    range: &TimeRange,
    out: &Path,
    title: Option<&str>,
    debug_dirs: &[PathBuf],
) -> Result<()> {
    let mut names = Names::new(debug_dirs);
    let mut calls = Calls::folding();
    each_record(trace, range, &mut names, |ev, _| {
        calls.event(ev);
    })?;
    let tree = calls.folded.take().unwrap_or_default();
    if tree.nodes.iter().all(|n| n.2 == 0) {
        bail!(
            "{} has no completed function calls (a flame graph needs entry and exit sites)",
            trace.display()
        );
    }
    // inferno sums the counts: a corrupt trace's times could overflow it, so a total
    // past MAX_TOTAL ns (104 days) is drawn in units of `scale` ns.
    let total = tree.nodes.iter().fold(0u64, |a, n| a.saturating_add(n.2));
    let scale = total.div_ceil(MAX_TOTAL).max(1);
    // inferno wants "a;b;c N" lines; frames may not contain ';' (C++ templates can't,
    // but be safe) and are sorted for a stable layout.
    let mut lines: Vec<String> = (1..tree.nodes.len())
        .filter(|&n| tree.nodes[n].2 / scale > 0)
        .map(|n| {
            let stack: Vec<String> = tree
                .path(n)
                .iter()
                .map(|&f| calls.functions[f].function.replace(';', ":"))
                .collect();
            format!("{} {}", stack.join(";"), tree.nodes[n].2 / scale)
        })
        .collect();
    lines.sort();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title
        .unwrap_or("utrace: self time per call stack")
        .to_string();
    opts.count_name = if scale == 1 {
        "ns".to_string()
    } else {
        format!("× {scale} ns")
    };
    write_atomically(out, |w| {
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w)
            .context("cannot draw the flame graph")
    })
}
