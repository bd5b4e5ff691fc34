//! `tracer report --diff OLD NEW`: two runs compared function by function (uftrace's
//! `report --diff`): calls, total and self time in each run and their change, sorted
//! by the change of total time (largest first, either way); functions called in one run
//! only are listed as such. As text or one JSON object.
//!
//! A function is its (binary file name, name) pair, so runs of the same program
//! compare, and `main` of two programs of one session stay apart. The numbers are the
//! report's calls (entry/exit pairs, `read/calls.rs`) of each trace.
//!
//! ```text
//! $ tracer report --diff before.utrace after.utrace
//! ```

use std::{collections::BTreeMap, io::Write, path::Path, path::PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{
    read::{calls::FunctionTime, range::TimeRange},
    views::model,
};

/// One run's numbers of a function.
#[derive(Serialize, Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Side {
    pub calls: u64,
    pub total_ns: u64,
    pub self_ns: u64,
}

/// NEW minus OLD (a function missing from a run counts as 0 calls there).
#[derive(Serialize, Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    pub calls: i64,
    pub total_ns: i64,
    pub self_ns: i64,
}

/// In which runs a function was called.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Presence {
    Both,
    OldOnly,
    NewOnly,
}

#[derive(Serialize, Debug)]
pub(crate) struct FunctionDiff {
    pub binary: String,
    pub function: String,
    pub presence: Presence,
    pub old: Option<Side>,
    pub new: Option<Side>,
    pub change: Change,
}

#[derive(Serialize, Debug)]
pub(crate) struct Diff {
    pub old: PathBuf,
    pub new: PathBuf,
    pub functions: Vec<FunctionDiff>,
}

/// `tracer report --diff OLD NEW`.
pub fn report_diff(
    old: &Path,
    new: &Path,
    range: &TimeRange,
    json: bool,
    debug_dirs: &[PathBuf],
    out: &mut impl Write,
) -> Result<()> {
    let read = |p: &Path| -> Result<Vec<FunctionTime>> {
        let r = model::build(p, range, 0, debug_dirs).with_context(|| p.display().to_string())?;
        Ok(r.summary.calls.functions)
    };
    let d = diff(old, new, read(old)?, read(new)?);
    if json {
        serde_json::to_writer(&mut *out, &d).context("cannot write JSON")?;
        writeln!(out)?;
        Ok(())
    } else {
        write_text(out, &d)
    }
}

/// The functions of both runs, matched and sorted.
fn diff(old: &Path, new: &Path, a: Vec<FunctionTime>, b: Vec<FunctionTime>) -> Diff {
    type Key = (String, String);
    let mut both: BTreeMap<Key, (Option<Side>, Option<Side>)> = BTreeMap::new();
    let side = |f: &FunctionTime| Side {
        calls: f.calls,
        total_ns: f.total_ns,
        self_ns: f.self_ns,
    };
    for f in &a {
        both.entry((f.binary.clone(), f.function.clone()))
            .or_default()
            .0 = Some(side(f));
    }
    for f in &b {
        both.entry((f.binary.clone(), f.function.clone()))
            .or_default()
            .1 = Some(side(f));
    }
    let mut functions: Vec<FunctionDiff> = both
        .into_iter()
        .map(|((binary, function), (o, n))| {
            let (x, y) = (o.unwrap_or_default(), n.unwrap_or_default());
            let d = |a: u64, b: u64| b as i64 - a as i64;
            FunctionDiff {
                binary,
                function,
                presence: match (o, n) {
                    (Some(_), None) => Presence::OldOnly,
                    (None, Some(_)) => Presence::NewOnly,
                    _ => Presence::Both,
                },
                old: o,
                new: n,
                change: Change {
                    calls: d(x.calls, y.calls),
                    total_ns: d(x.total_ns, y.total_ns),
                    self_ns: d(x.self_ns, y.self_ns),
                },
            }
        })
        .collect();
    functions.sort_by(|a, b| {
        b.change
            .total_ns
            .unsigned_abs()
            .cmp(&a.change.total_ns.unsigned_abs())
            .then_with(|| a.function.cmp(&b.function))
            .then_with(|| a.binary.cmp(&b.binary))
    });
    Diff {
        old: old.to_path_buf(),
        new: new.to_path_buf(),
        functions,
    }
}

fn write_text(out: &mut impl Write, d: &Diff) -> Result<()> {
    writeln!(out, "old: {}", d.old.display())?;
    writeln!(out, "new: {}", d.new.display())?;
    let only = |p: Presence| d.functions.iter().filter(|f| f.presence == p).count();
    writeln!(
        out,
        "{} functions: {} in both, {} in old only, {} in new only; by change of total time",
        d.functions.len(),
        only(Presence::Both),
        only(Presence::OldOnly),
        only(Presence::NewOnly)
    )?;
    writeln!(
        out,
        "{:>10} {:>10} {:>10}  {:>10} {:>10} {:>11} {:>7}  {:>10} {:>10} {:>11}  function",
        "calls old",
        "new",
        "change",
        "total old",
        "new",
        "change",
        "%",
        "self old",
        "new",
        "change"
    )?;
    for f in &d.functions {
        let old_total = f.old.map_or(0, |s| s.total_ns);
        let pct = match (f.presence, old_total) {
            (Presence::Both, t) if t > 0 => {
                format!("{:+.1}", f.change.total_ns as f64 * 100.0 / t as f64)
            }
            _ => "-".into(),
        };
        let cell = |s: Option<Side>, v: fn(&Side) -> String| s.as_ref().map_or("-".into(), v);
        writeln!(
            out,
            "{:>10} {:>10} {:>+10}  {:>10} {:>10} {:>11} {:>7}  {:>10} {:>10} {:>11}  {} ({}){}",
            cell(f.old, |s| s.calls.to_string()),
            cell(f.new, |s| s.calls.to_string()),
            f.change.calls,
            cell(f.old, |s| ns(s.total_ns)),
            cell(f.new, |s| ns(s.total_ns)),
            signed_ns(f.change.total_ns),
            pct,
            cell(f.old, |s| ns(s.self_ns)),
            cell(f.new, |s| ns(s.self_ns)),
            signed_ns(f.change.self_ns),
            f.function,
            f.binary,
            match f.presence {
                Presence::Both => "",
                Presence::OldOnly => "  [old only]",
                Presence::NewOnly => "  [new only]",
            }
        )?;
    }
    Ok(())
}

/// Human-readable nanoseconds (as the report's).
fn ns(v: u64) -> String {
    super::text::ns(v)
}

/// A change of time, signed.
fn signed_ns(v: i64) -> String {
    let sign = if v < 0 { "-" } else { "+" };
    format!("{sign}{}", ns(v.unsigned_abs()))
}
