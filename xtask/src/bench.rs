//! `cargo xtask bench`: ns per event, side by side, for
//! 1. the untraced loop (bench.c calling a noinline function N times),
//! 2. the rewritten loop (inline stubs, no tracer: the flush just resets the buffer),
//! 3. the rewritten loop under `tracer record`,
//! 4. a hand-written inline store of the same 32-byte record (bench.c -DHANDWRITTEN),
//! 5. a plain kernel uprobe + eBPF program on the same function (`rewriter
//!    --force-uprobe --functions hit`: the site is left untouched and the tracer attaches
//!    its `site` program there), with fewer iterations.
//!
//! Every fixture measures itself (clock_gettime around the loop); we take the best of
//! `--runs` runs.

use std::process::Command;

use anyhow::Result;

use crate::util::{self, cmd};

#[derive(clap::Args)]
pub struct Args {
    /// Loop iterations of the untraced, inline and hand-written runs.
    #[arg(long, default_value_t = 20_000_000)]
    iterations: u64,
    /// Iterations of the run under `tracer record` (every one is delivered and stored).
    #[arg(long, default_value_t = 5_000_000)]
    tracer_iterations: u64,
    /// Iterations of the plain-uprobe run.
    #[arg(long, default_value_t = 200_000)]
    uprobe_iterations: u64,
    /// Runs per variant; the best is reported.
    #[arg(long, default_value_t = 3)]
    runs: u32,
}

type Measure = std::result::Result<f64, String>;

struct Row {
    name: &'static str,
    iterations: u64,
    ns: Measure,
}

pub fn bench(args: &Args) -> Result<()> {
    crate::build()?;
    println!("== cargo xtask bench");
    let dir = util::scratch_dir("bench")?;
    let src = util::workspace_root().join("xtask/bench/bench.c");
    let plain = dir.join("bench");
    let hand = dir.join("bench_hand");
    let traced = dir.join("bench.traced");
    util::run(cmd("gcc").arg("-O2").arg(&src).arg("-o").arg(&plain))?;
    util::run(
        cmd("gcc")
            .args(["-O2", "-DHANDWRITTEN"])
            .arg(&src)
            .arg("-o")
            .arg(&hand),
    )?;
    let rewritten = util::run(
        cmd(crate::rewriter_bin())
            .arg(&plain)
            .arg("-o")
            .arg(&traced),
    )
    .map_err(|e| format!("rewriter failed: {e:#}"));
    let uprobed = dir.join("bench.uprobe");
    let uprobe_rewritten = util::run(
        cmd(crate::rewriter_bin())
            .args(["--force-uprobe", "--functions", "hit", "-o"])
            .arg(&uprobed)
            .arg(&plain),
    )
    .map_err(|e| format!("rewriter --force-uprobe failed: {e:#}"));
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
    let under_tracer = |fixture: &std::path::Path, iterations: u64| {
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

    print_table(&rows);
    aarch64_smoke(&dir, &src)?;
    Ok(())
}

/// AArch64 under qemu-user, as a correctness smoke only (qemu timings mean nothing):
/// the bench fixture cross-built, rewritten, traced with the user-space drain; every
/// call of hit() must be in the trace.
fn aarch64_smoke(dir: &std::path::Path, src: &std::path::Path) -> Result<()> {
    let n: u64 = 100_000;
    let plain = dir.join("bench-a64");
    let traced = dir.join("bench-a64.traced");
    let trace = dir.join("bench-a64.utrace");
    util::run(
        cmd("aarch64-linux-gnu-gcc")
            .arg("-O2")
            .arg(src)
            .arg("-o")
            .arg(&plain),
    )?;
    util::run(
        cmd(crate::rewriter_bin())
            .arg(&plain)
            .arg("-o")
            .arg(&traced),
    )?;
    util::run(
        cmd(crate::tracer_bin())
            .args(["record", "--user", "--binary"])
            .arg(&traced)
            .arg("-o")
            .arg(&trace)
            .args(["--", "qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])
            .arg(&traced)
            .arg(n.to_string()),
    )?;
    let out = util::output(
        cmd(crate::tracer_bin())
            .arg("report")
            .arg("--json")
            .arg(&trace),
    )?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    // The warm-up adds 4096 calls (bench.c).
    let want = n + 4096;
    let count = json["functions"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["symbol"] == "hit"))
        .and_then(|f| f["count"].as_u64());
    match count {
        Some(c) if c == want => {
            println!("aarch64 (qemu-user, smoke): {c} records of hit, as expected");
            Ok(())
        }
        other => anyhow::bail!("aarch64 smoke: expected {want} records of hit, got {other:?}"),
    }
}

/// Best (lowest) of `runs` measurements; the first error ends the series.
fn best(runs: u32, mut f: impl FnMut() -> Measure) -> Measure {
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        best = best.min(f()?);
    }
    Ok(best)
}

/// Run a fixture (possibly under the tracer) and read its "ns_per_iter" line.
fn measure(c: &mut Command) -> Measure {
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

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

fn print_table(rows: &[Row]) {
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
    }
}
