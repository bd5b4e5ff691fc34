//! The events section's table: a row per variant, ns/event, the ratios and the targets.

use super::measure::Measure;

/// One variant of the events table.
pub(super) struct Row {
    pub name: &'static str,
    pub iterations: u64,
    pub ns: Measure,
}

pub(super) fn print_table(rows: &[Row]) {
    let base = rows[0].ns.as_ref().ok().copied();
    println!();
    println!(
        "{:<36} {:>12} {:>16} {:>12}",
        "variant", "ns/event", "minus untraced", "iterations"
    );
    for r in rows {
        match &r.ns {
            Ok(ns) => {
                let over = base
                    .map(|b| format!("{:.2}", ns - b))
                    .unwrap_or_else(|| "-".into());
                println!(
                    "{:<36} {:>12.2} {:>16} {:>12}",
                    r.name, ns, over, r.iterations
                );
            }
            Err(e) => println!(
                "{:<36} {:>12} {:>16} {:>12}  {e}",
                r.name, "n/a", "-", r.iterations
            ),
        }
    }
    let get = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| r.ns.as_ref().ok().copied())
    };
    let inline = get("inline stub, no tracer");
    let hand = get("hand-written inline store (limit)");
    let uprobe = get("kernel uprobe + eBPF");
    let ratio = |a: Option<f64>, b: Option<f64>, sub: f64| match (a, b) {
        (Some(a), Some(b)) if b - sub > 0.0 => format!("{:.2}x", (a - sub) / (b - sub)),
        _ => "n/a".into(),
    };
    println!();
    println!(
        "ratios of ns/event:               inline / hand-written = {}, uprobe / inline = {}",
        ratio(inline, hand, 0.0),
        ratio(uprobe, inline, 0.0)
    );
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "met",
        Some(false) => "NOT MET",
        None => "n/a",
    };
    println!(
        "targets: inline <= 1.3x hand-written: {}; uprobe >= 500x inline: {}",
        verdict(inline.zip(hand).map(|(i, h)| i <= 1.3 * h)),
        verdict(uprobe.zip(inline).map(|(u, i)| u >= 500.0 * i))
    );
    if let Some(b) = base {
        println!(
            "ratios of ns/event minus untraced: inline / hand-written = {}, uprobe / inline = {}",
            ratio(inline, hand, b),
            ratio(uprobe, inline, b)
        );
        let coarse = get("entry stub, coarse timestamps");
        println!(
            "target: coarse entry event <= 1.5 ns (minus untraced): {} ({})",
            verdict(coarse.map(|c| c - b <= 1.5)),
            coarse.map_or("n/a".into(), |c| format!("{:.2} ns", c - b))
        );
        // Per event: the memory rows record two events per call.
        for (kind, row, events) in [
            ("block", "block stub", 1.0),
            ("memory", "memory stubs (2 per call)", 2.0),
        ] {
            let k = get(row).map(|ns| b + (ns - b) / events);
            println!(
                "{kind} event / hand-written store (minus untraced, per event) = {}",
                ratio(k, hand, b)
            );
        }
    }
}
