//! The events section: ns per event of the untraced loop, the inline stub (alone and
//! under the tracer), a hand-written store, a kernel uprobe, the other site kinds and USDT.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::Args;
use super::aarch64_smoke::aarch64_smoke;
use super::measure::{best, measure};
use super::table::{Row, print_table};
use super::usdt::usdt_rows;
use crate::util::{self, cmd};

/// The events section: the table, then the AArch64 smoke test.
pub(super) fn ns_per_event(args: &Args) -> Result<()> {
    let dir = util::scratch_dir("bench")?;
    let src = util::workspace_root().join("xtask/bench/bench.c");
    let plain = dir.join("bench");
    let hand = dir.join("bench_hand");
    util::run(cmd("gcc").arg("-O2").arg(&src).arg("-o").arg(&plain))?;
    util::run(
        cmd("gcc")
            .args(["-O2", "-DHANDWRITTEN"])
            .arg(&src)
            .arg("-o")
            .arg(&hand),
    )?;
    let Rewrites {
        traced,
        rewritten,
        uprobed,
        uprobe_rewritten,
    } = rewrites(&dir, &plain);
    let tracer = crate::tracer_bin();
    let trace_file = dir.join("bench.utrace");
    let n = args.iterations;
    let runs = args.runs.max(1);

    let mut rows = vec![Row {
        name: "untraced loop",
        iterations: n,
        ns: best(runs, || measure(cmd(&plain).arg(n.to_string()))),
    }];
    rows.push(Row {
        name: "inline stub, no tracer",
        iterations: n,
        ns: match &rewritten {
            Ok(()) => best(runs, || measure(cmd(&traced).arg(n.to_string()))),
            Err(e) => Err(e.clone()),
        },
    });
    // One fixture run under `tracer record`, the trace file thrown away.
    let under_tracer = |fixture: &Path, iterations: u64| {
        let mut c = cmd(&tracer);
        c.arg("record")
            .arg("-o")
            .arg(&trace_file)
            .arg("--")
            .arg(fixture)
            .arg(iterations.to_string());
        let r = measure(&mut c);
        let _ = std::fs::remove_file(&trace_file);
        r
    };
    let nt = args.tracer_iterations;
    rows.push(Row {
        name: "inline stub, under tracer record",
        iterations: nt,
        ns: rewritten
            .clone()
            .and_then(|()| best(runs, || under_tracer(&traced, nt))),
    });
    rows.push(Row {
        name: "hand-written inline store (limit)",
        iterations: n,
        ns: best(runs, || measure(cmd(&hand).arg(n.to_string()))),
    });
    let nu = args.uprobe_iterations;
    rows.push(Row {
        name: "kernel uprobe + eBPF",
        iterations: nu,
        ns: uprobe_rewritten
            .clone()
            .and_then(|()| best(runs, || under_tracer(&uprobed, nu))),
    });

    variant_rows(&dir, &plain, n, runs, &mut rows);

    usdt_rows(&dir, &src, args, &mut rows);

    print_table(&rows);
    aarch64_smoke(&dir, &src)?;
    Ok(())
}

/// bench rewritten with inline stubs, and with `hit` a forced uprobe; a failure is a
/// row's error, not the section's.
struct Rewrites {
    traced: PathBuf,
    rewritten: Result<(), String>,
    uprobed: PathBuf,
    uprobe_rewritten: Result<(), String>,
}

fn rewrites(dir: &Path, plain: &Path) -> Rewrites {
    let traced = dir.join("bench.traced");
    let rewritten = util::run(cmd(crate::rewriter_bin()).arg(plain).arg("-o").arg(&traced))
        .map_err(|e| format!("rewriter failed: {e:#}"));
    let uprobed = dir.join("bench.uprobe");
    let uprobe_rewritten = util::run(
        cmd(crate::rewriter_bin())
            .args(["--force-uprobe", "--functions", "hit", "-o"])
            .arg(&uprobed)
            .arg(plain),
    )
    .map_err(|e| format!("rewriter --force-uprobe failed: {e:#}"));
    Rewrites {
        traced,
        rewritten,
        uprobed,
        uprobe_rewritten,
    }
}

/// Other site kinds and the coarse timestamps, on the same loop: hit() is one basic
/// block with one memory access (`sink += i`), so each variant adds one event per
/// iteration, comparable with the same hand-written 32-byte store.
fn variant_rows(dir: &Path, plain: &Path, n: u64, runs: u32, rows: &mut Vec<Row>) {
    for &(name, extra) in VARIANTS {
        let out = dir.join(format!("bench.{}", name.replace([' ', ','], "_")));
        let rewritten = util::run(
            cmd(crate::rewriter_bin())
                .arg(plain)
                .arg("-o")
                .arg(&out)
                .args(extra),
        )
        .map_err(|e| format!("rewriter failed: {e:#}"));
        rows.push(Row {
            name,
            iterations: n,
            ns: rewritten.and_then(|()| best(runs, || measure(cmd(&out).arg(n.to_string())))),
        });
    }
}

/// Extra rows: (name, rewriter flags). Run without a tracer, like "inline stub, no
/// tracer".
const VARIANTS: &[(&str, &[&str])] = &[
    ("entry stub, coarse timestamps", &["--time", "coarse"]),
    (
        "entry stub, coarse, fast circular",
        &["--time", "coarse", "--buffer-kind", "fast-circular"],
    ),
    ("block stub", &["--sites", "block", "--functions", "hit"]),
    (
        "block stub, coarse timestamps",
        &["--sites", "block", "--functions", "hit", "--time", "coarse"],
    ),
    ("memory stub", &["--sites", "memory", "--functions", "hit"]),
    (
        "memory stub, coarse timestamps",
        &[
            "--sites",
            "memory",
            "--functions",
            "hit",
            "--time",
            "coarse",
        ],
    ),
];
