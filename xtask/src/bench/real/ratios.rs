//! The figures of issue 29 from the rows of one run: nanoseconds a record over the
//! untraced build of the same compiler (the limit is built by clang, the rewritten
//! program by gcc, and they record different counts), the stubs against the limit,
//! the drain on top of the stubs, and the peers' slowdowns against ours.

use super::Row;

pub(super) const UNTRACED: &str = "untraced (gcc)";
pub(super) const UNTRACED_CLANG: &str = "untraced (clang)";
pub(super) const LIMIT_TSC: &str = "limit: hand-written hooks, TSC";
pub(super) const LIMIT_NO_TSC: &str = "limit: hand-written hooks, no clock";
pub(super) const STUBS: &str = "rewritten, no tracer: ";
pub(super) const TRACED: &str = "tracer record: ";
pub(super) const UFTRACE: &str = "uftrace record (-pg), entry+exit";
pub(super) const XRAY: &str = "LLVM XRay, ";

/// (row name, `--sites`, `--time`) of each rewritten mode; the first is the headline.
pub(super) const MODES: [(&str, &str, &str); 3] = [
    ("entry+exit", "entry,exit", "record"),
    ("entry+exit, coarse time", "entry,exit", "coarse"),
    ("entries only", "entry", "record"),
];

/// The limit row a mode compares with: the one with the same clock.
fn limit_of(time: &str) -> &'static str {
    if time == "coarse" {
        LIMIT_NO_TSC
    } else {
        LIMIT_TSC
    }
}

fn row<'a>(table: &'a [Row], name: &str) -> Option<&'a Row> {
    table.iter().find(|r| r.name == name)
}

/// ns a record of `r` over `base` (`records` of `r`, or of `counted` where `r` counts none).
fn ns_per_record(r: &Row, base: &Row, counted: &Row) -> Option<f64> {
    let n = r.records.or(counted.records)? + counted.lost.unwrap_or(0);
    (n > 0).then(|| (r.run.wall_s - base.run.wall_s) * 1e9 / n as f64)
}

pub(super) fn print(table: &[Row]) {
    let (Some(gcc), Some(clang)) = (row(table, UNTRACED), row(table, UNTRACED_CLANG)) else {
        return;
    };
    println!();
    println!("per record (ns over the untraced build of the same compiler; targets of issue 29)");
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>13} {:>13} {:>9}",
        "mode", "limit", "stubs", "traced", "stubs÷limit", "traced÷stubs", "slowdown"
    );
    for (mode, _, time) in MODES {
        let limit = row(table, limit_of(time)).and_then(|l| ns_per_record(l, clang, l));
        let traced = row(table, &format!("{TRACED}{mode}"));
        let stubs = row(table, &format!("{STUBS}{mode}"));
        let (Some(limit), Some(traced), Some(stubs)) = (limit, traced, stubs) else {
            continue;
        };
        let (Some(s), Some(t)) = (
            ns_per_record(stubs, gcc, traced),
            ns_per_record(traced, gcc, traced),
        ) else {
            continue;
        };
        println!(
            "{:<26} {:>9.2} {:>9.2} {:>9.2} {:>13.2} {:>13.2} {:>8.1}x",
            mode,
            limit,
            s,
            t,
            s / limit,
            traced.run.wall_s / stubs.run.wall_s,
            traced.run.wall_s / gcc.run.wall_s
        );
    }
    println!("targets: stubs÷limit <= 1.0, traced÷stubs <= 1.15 (wall), every mode");
    let ours = row(table, &format!("{TRACED}{}", MODES[0].0));
    for (peer, target) in [(UFTRACE, 4.0), (&*format!("{XRAY}fdr"), 3.0)] {
        if let (Some(p), Some(o)) = (row(table, peer), ours) {
            println!(
                "{peer}: slowdown {:.1}x, ÷ ours ({:.1}x) = {:.2} (target >= {target})",
                p.run.wall_s / gcc.run.wall_s,
                o.run.wall_s / gcc.run.wall_s,
                p.run.wall_s / o.run.wall_s
            );
        }
    }
}
