//! `cargo xtask modgraph` (and the first step of `cargo xtask test`): ARCHITECTURE.md's
//! invariant "dependencies point forward", checked on the sources. For each crate the
//! modules and the paths they name (`use` trees, inline `crate::`/`super::`/`self::`
//! paths; comments, strings and `#[cfg(test)]` items skipped) give, per folder, a graph
//! of sibling modules. It fails on a cycle among siblings, or on a module naming one of
//! a later layer of `LAYERS`.

mod check;
mod lex;
mod model;
mod parse;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};

use crate::util;
use check::{Breach, Folder};
use model::{CrateModel, Ref};

/// The crate roots checked: (name, root file relative to the workspace).
const CRATES: &[(&str, &str)] = &[
    ("tracer-common", "tracer-common/src/lib.rs"),
    ("rewriter", "rewriter/src/lib.rs"),
    ("rewriter (bin)", "rewriter/src/main.rs"),
    ("tracer-ebpf", "tracer-ebpf/src/main.rs"),
    ("tracer-user", "tracer-user/src/lib.rs"),
    ("tracer-user (bin)", "tracer-user/src/main.rs"),
    ("xtask", "xtask/src/main.rs"),
    ("tests", "tests/src/lib.rs"),
];

/// The declared layer orders: ARCHITECTURE.md, "Invariant: dependencies point forward"
/// (and the code map). Per crate, from the lowest layer up; a module may name modules of
/// its own layer or an earlier one, never a later one. An entry names a module and its
/// subtree; the longest matching entry decides (`isa::machine` is not `isa`). Modules in
/// no entry are not checked for order (only for cycles); entries naming no module are
/// ignored, so old and new names can both be listed.
const LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "rewriter",
        &[
            // The one `e_machine` match: a leaf, so that `elf::read` refuses other
            // machines before anything else runs.
            &["isa::machine"],
            &["elf::read"],
            &["flow"],
            &["isa"],
            &["select"],
            &["plan"],
            &["layout"],
            &["emit"],
            &["elf::write"],
        ],
    ),
    (
        "tracer-ebpf",
        &[
            &["atomic", "user"],
            &["maps"],
            &["books"],
            &["arch"],
            &["filter"],
            &["strings"],
            &["drain"],
            &["slots"],
            &["tables"],
            &["programs"],
        ],
    ),
    (
        "tracer-user",
        &[
            // Below both stages: `record` writes them, `read` reads them.
            &["tracefile", "debuginfo", "probes", "wording"],
            // Stage 1: host facts, the drains (ring, user drain, stop drain) under
            // the session that runs them.
            &["record::host"],
            &["record::drain"],
            &["record::session", "record"],
            // Stage 2, a trace read back; stage 3, views.
            &["read"],
            &["views"],
        ],
    ),
];

/// Checks every crate; the error names each cycle and broken order with its files.
pub(crate) fn modgraph() -> Result<()> {
    println!("== cargo xtask modgraph");
    let root = util::workspace_root();
    let mut problems = Vec::new();
    for &(name, file) in CRATES {
        let m = model::load(&root.join(file))?;
        let layers = LAYERS
            .iter()
            .find(|(c, _)| *c == name)
            .map_or(&[][..], |l| l.1);
        let folders = check::sibling_edges(&m, layers);
        let edges: usize = folders.values().map(BTreeMap::len).sum();
        println!(
            "{name}: {} modules, {} references, {edges} sibling edges",
            m.modules.len(),
            m.refs.len()
        );
        for (folder, graph) in &folders {
            for cycle in check::cycles(graph) {
                problems.push(cycle_report(&root, &m, folder, graph, &cycle));
            }
        }
        problems.extend(order_reports(
            &root,
            name,
            layers,
            &check::breaches(&m, layers),
        ));
    }
    if problems.is_empty() {
        println!("== module graph: no cycle, every declared order kept");
        return Ok(());
    }
    for p in &problems {
        println!("{p}");
    }
    bail!(
        "module graph: {} problems (see above; orders in xtask/src/modgraph/mod.rs, LAYERS)",
        problems.len()
    )
}

/// Where a module's children live, for messages: `rewriter/src/isa/x86_64`.
fn folder_name(root: &Path, m: &CrateModel, folder: &[String]) -> String {
    let file = m
        .modules
        .get(folder)
        .map_or_else(Default::default, |f| rel(root, f));
    match file
        .strip_suffix("/mod.rs")
        .or(file.strip_suffix("/lib.rs"))
    {
        Some(dir) => dir.to_string(),
        None => file.strip_suffix("/main.rs").unwrap_or(&file).to_string(),
    }
}

fn rel(root: &Path, f: &Path) -> String {
    f.strip_prefix(root).unwrap_or(f).display().to_string()
}

/// One evidence line per reference, at most three, and how many more.
fn evidence(root: &Path, refs: &[&Ref]) -> String {
    let mut s: Vec<String> = refs
        .iter()
        .take(3)
        .map(|r| format!("{}:{} `{}`", rel(root, &r.file), r.line, r.text))
        .collect();
    if refs.len() > 3 {
        s.push(format!("and {} more", refs.len() - 3));
    }
    s.join("; ")
}

fn cycle_report(
    root: &Path,
    m: &CrateModel,
    folder: &[String],
    graph: &Folder<'_>,
    cycle: &[String],
) -> String {
    let mut out = format!(
        "cycle in {}: {{{}}} depend on each other",
        folder_name(root, m, folder),
        cycle.join(", ")
    );
    for ((a, b), refs) in graph {
        if cycle.contains(a) && cycle.contains(b) {
            out += &format!("\n    {a} -> {b}: {}", evidence(root, refs));
        }
    }
    out
}

/// Broken orders, grouped by (naming module, named module).
fn order_reports(root: &Path, name: &str, layers: &[&[&str]], b: &[Breach<'_>]) -> Vec<String> {
    let mut groups: BTreeMap<(String, String), Vec<&Breach<'_>>> = BTreeMap::new();
    for x in b {
        let key = (x.r.from.join("::"), x.r.to.join("::"));
        groups.entry(key).or_default().push(x);
    }
    let layer = |i: usize| layers[i].join("/");
    groups
        .into_iter()
        .map(|((from, to), xs)| {
            let refs: Vec<&Ref> = xs.iter().map(|x| x.r).collect();
            format!(
                "order broken in {name}: {from} (layer {}) names {to} (layer {}, later): {}",
                layer(xs[0].from_layer),
                layer(xs[0].to_layer),
                evidence(root, &refs)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn layers(krate: &str) -> &'static [&'static [&'static str]] {
        LAYERS.iter().find(|(c, _)| *c == krate).unwrap().1
    }

    fn breaks(krate: &str, from: &str, to: &str) -> bool {
        let p = |s: &str| s.split("::").map(String::from).collect();
        let m = CrateModel {
            modules: BTreeMap::new(),
            refs: vec![Ref {
                from: p(from),
                to: p(to),
                file: PathBuf::new(),
                line: 1,
                text: String::new(),
            }],
        };
        !check::breaches(&m, layers(krate)).is_empty()
    }

    #[test]
    fn tracer_user_order() {
        assert!(!breaks(
            "tracer-user",
            "record::session::x",
            "record::drain::y"
        ));
        assert!(breaks(
            "tracer-user",
            "record::drain::y",
            "record::session::x"
        ));
        assert!(!breaks(
            "tracer-user",
            "record::drain::y",
            "record::host::clock"
        ));
        assert!(breaks(
            "tracer-user",
            "record::host::clock",
            "record::drain::y"
        ));
        assert!(breaks(
            "tracer-user",
            "record::session::summary",
            "views::text"
        ));
        assert!(breaks("tracer-user", "record::drain::y", "read::calls"));
        assert!(!breaks("tracer-user", "views::top", "tracefile::write"));
        assert!(!breaks("tracer-user", "read::names", "debuginfo"));
    }

    #[test]
    fn rewriter_order() {
        assert!(!breaks("rewriter", "elf::read", "isa::machine"));
        assert!(breaks("rewriter", "elf::read", "isa::x86_64"));
        assert!(!breaks("rewriter", "elf::write", "layout"));
        assert!(breaks("rewriter", "flow", "select"));
    }
}
