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
//!
//! Then a very large real binary (`--large-only`: just this part; `--no-large`: skip
//! it): every function entry of the toolchain's own `librustc_driver-*.so` (~150 MB)
//! rewritten, wall time (best of `--large-runs`) and size against the goals (under 2 s
//! per 50 MB of input, under 1.3x the input size), the coverage line; then a private
//! copy of the sysroot (a copy of `bin/rustc`, the rewritten driver, symlinks to the
//! rest) must behave like the original: `rustc --version --verbose`, and a small program
//! compiled by each (compiler output and the program's output identical).
//! `--large-trace` also compiles it under `tracer record` (slow: see [`large_binary`]).
//!
//! Between the two: drain throughput (`bench_drain.rs`): records per second through
//! flush → eBPF (filter) → ring buffer → tracer → trace file, 1 and 2 producing threads,
//! and the per-record cost of the in-kernel filters (`--no-drain`: skip it).
//!
//! Then the readers (`bench_readers.rs`): `report`, `export --format perfetto` and
//! `flamegraph` of a trace of `--readers-records` records: time, records/s, peak memory
//! (`--no-readers`: skip it).
//!
//! `--only events|drain|readers|large` runs one section alone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use anyhow::{Context, Result, bail};

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
    /// Only the large-binary part (rewriting the toolchain's librustc_driver).
    #[arg(long, conflicts_with = "no_large")]
    large_only: bool,
    /// Skip the large-binary part.
    #[arg(long)]
    no_large: bool,
    /// Rewrites of the large binary; the best time is reported.
    #[arg(long, default_value_t = 3)]
    large_runs: u32,
    /// Also compile with the rewritten rustc under `tracer record`.
    #[arg(long)]
    large_trace: bool,
    /// Run only this section.
    #[arg(long, value_enum, conflicts_with_all = ["large_only", "no_large", "no_drain", "no_readers"])]
    only: Option<Section>,
    /// Skip the drain-throughput section.
    #[arg(long)]
    no_drain: bool,
    /// Records per session of the drain section (calls of the instrumented function,
    /// shared by the producing threads).
    #[arg(long, default_value_t = 20_000_000)]
    drain_records: u64,
    /// Skip the readers section.
    #[arg(long)]
    no_readers: bool,
    /// Records of the trace the readers section reads.
    #[arg(long, default_value_t = 30_000_000)]
    readers_records: u64,
    /// Sessions per row of the drain section; the least disturbed one (least CPU on the
    /// record path) is reported.
    #[arg(long, default_value_t = 2)]
    drain_runs: u32,
}

/// The sections of the bench.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    /// ns per event of the stubs (and the other site kinds, USDT, the AArch64 smoke).
    Events,
    /// Drain throughput: records/s through flush, eBPF, ring buffer, tracer, file.
    Drain,
    /// Reading a big trace back: report, Perfetto export, flame graph.
    Readers,
    /// The large binary (librustc_driver).
    Large,
}

type Measure = std::result::Result<f64, String>;

/// Compile `xtask/bench/<name>.c` with `cflags` into a fresh `target/xtask/bench-<name>`
/// and rewrite it with `rewrite` (rewriter arguments): (the directory, the rewritten
/// program).
pub fn build_workload(name: &str, cflags: &[&str], rewrite: &[&str]) -> Result<(PathBuf, PathBuf)> {
    let dir = util::scratch_dir(&format!("bench-{name}"))?;
    let src = util::workspace_root().join(format!("xtask/bench/{name}.c"));
    let plain = dir.join(name);
    let traced = dir.join(format!("{name}.traced"));
    util::run(cmd("gcc").args(cflags).arg(&src).arg("-o").arg(&plain))?;
    util::run(
        cmd(crate::rewriter_bin())
            .arg(&plain)
            .arg("-o")
            .arg(&traced)
            .args(rewrite),
    )?;
    Ok((dir, traced))
}

struct Row {
    name: &'static str,
    iterations: u64,
    ns: Measure,
}

pub fn bench(args: &Args) -> Result<()> {
    crate::build()?;
    println!("== cargo xtask bench");
    let run = |s: Section| match args.only {
        Some(only) => only == s,
        None => match s {
            Section::Events => !args.large_only,
            Section::Drain => !args.large_only && !args.no_drain,
            Section::Readers => !args.large_only && !args.no_readers,
            Section::Large => !args.no_large,
        },
    };
    if run(Section::Events) {
        ns_per_event(args)?;
    }
    if run(Section::Drain) {
        crate::bench_drain::drain_throughput(&crate::bench_drain::Options {
            records: args.drain_records,
            runs: args.drain_runs,
        })?;
    }
    if run(Section::Readers) {
        crate::bench_readers::readers(args.readers_records)?;
    }
    if run(Section::Large) {
        large_binary(args)?;
    }
    Ok(())
}

fn ns_per_event(args: &Args) -> Result<()> {
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

    // Other site kinds and the coarse timestamps, on the same loop: hit() is one basic
    // block with one memory access (`sink += i`), so each variant adds one event per
    // iteration, comparable with the same hand-written 32-byte store.
    for &(name, extra) in VARIANTS {
        let out = dir.join(format!("bench.{}", name.replace([' ', ','], "_")));
        let rewritten = util::run(
            cmd(crate::rewriter_bin())
                .arg(&plain)
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

    usdt_rows(&dir, &src, args, &mut rows);

    print_table(&rows);
    aarch64_smoke(&dir, &src)?;
    Ok(())
}

/// USDT: the same probe through the inline stub, our uprobe fallback (eBPF `site`
/// program) and bpftrace's `usdt:` probe (when bpftrace is installed).
fn usdt_rows(dir: &std::path::Path, src: &std::path::Path, args: &Args, rows: &mut Vec<Row>) {
    let runs = args.runs.max(1);
    let plain = dir.join("bench-usdt");
    let built = util::run(
        cmd("gcc")
            .args(["-O2", "-DUSDT"])
            .arg(src)
            .arg("-o")
            .arg(&plain),
    )
    .map_err(|e| format!("gcc -DUSDT failed: {e:#}"));
    let rewrite = |out: &std::path::Path, extra: &[&str]| {
        built.clone().and_then(|()| {
            util::run(
                cmd(crate::rewriter_bin())
                    .arg(&plain)
                    .arg("-o")
                    .arg(out)
                    .args(["--sites", "usdt"])
                    .args(extra),
            )
            .map_err(|e| format!("rewriter failed: {e:#}"))
        })
    };
    let n = args.iterations;
    rows.push(Row {
        name: "usdt: untraced (nop)",
        iterations: n,
        ns: built
            .clone()
            .and_then(|()| best(runs, || measure(cmd(&plain).arg(n.to_string())))),
    });
    let inline = dir.join("bench-usdt.inline");
    rows.push(Row {
        name: "usdt: inline stub",
        iterations: n,
        ns: rewrite(&inline, &[])
            .and_then(|()| best(runs, || measure(cmd(&inline).arg(n.to_string())))),
    });
    let nu = args.uprobe_iterations;
    let uprobed = dir.join("bench-usdt.uprobe");
    let trace_file = dir.join("bench-usdt.utrace");
    rows.push(Row {
        name: "usdt: uprobe + eBPF (ours)",
        iterations: nu,
        ns: rewrite(&uprobed, &["--force-uprobe"]).and_then(|()| {
            best(runs, || {
                let r = measure(
                    cmd(crate::tracer_bin())
                        .arg("record")
                        .arg("-o")
                        .arg(&trace_file)
                        .arg("--")
                        .arg(&uprobed)
                        .arg(nu.to_string()),
                );
                let _ = std::fs::remove_file(&trace_file);
                r
            })
        }),
    });
    let bpftrace = util::which("bpftrace")
        .ok_or_else(|| "bpftrace not installed (apt-get install bpftrace)".to_string());
    rows.push(Row {
        name: "usdt: bpftrace usdt probe",
        iterations: nu,
        ns: built.and(bpftrace).and_then(|bt| {
            best(runs, || {
                let prog = format!("usdt:{}:bench:hit {{ @c = count(); }}", plain.display());
                measure(
                    cmd(&bt)
                        .arg("-e")
                        .arg(&prog)
                        .arg("-c")
                        .arg(format!("{} {nu}", plain.display())),
                )
            })
        }),
    });
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

// ---------------------------------------------------------------------------------------
// A very large real binary: the toolchain's librustc_driver

/// A small program with generics, traits and closures for the rewritten compiler.
const HELLO_RS: &str = r#"use std::collections::BTreeMap;
use std::fmt::Display;

trait Shape {
    fn area(&self) -> f64;
    fn name(&self) -> String;
}
struct Square<T>(T);
struct Rect<T> {
    w: T,
    h: T,
}
impl<T: Into<f64> + Copy + Display> Shape for Square<T> {
    fn area(&self) -> f64 {
        let s: f64 = self.0.into();
        s * s
    }
    fn name(&self) -> String {
        format!("square({})", self.0)
    }
}
impl<T: Into<f64> + Copy + Display> Shape for Rect<T> {
    fn area(&self) -> f64 {
        self.w.into() * self.h.into()
    }
    fn name(&self) -> String {
        format!("rect({}x{})", self.w, self.h)
    }
}
fn largest<T: PartialOrd + Copy>(xs: &[T]) -> Option<T> {
    let mut it = xs.iter().copied();
    let mut m = it.next()?;
    for x in it {
        if x > m {
            m = x;
        }
    }
    Some(m)
}
fn main() {
    let shapes: Vec<Box<dyn Shape>> = vec![
        Box::new(Square(3u8)),
        Box::new(Rect { w: 2.5f32, h: 4.0 }),
        Box::new(Square(1.5f64)),
    ];
    let by_name: BTreeMap<String, f64> = shapes.iter().map(|s| (s.name(), s.area())).collect();
    for (k, v) in &by_name {
        println!("hello {k} = {v:.3}");
    }
    println!("largest {:?} {:?}", largest(&[3, 9, -2, 7]), largest(&['x', 'b', 'z']));
    let v: Vec<u64> = (1..=20u64).map(|i| i * i).filter(|x| x % 3 != 0).collect();
    println!("sum {} of {:?}", v.iter().sum::<u64>(), v);
}
"#;

/// Rewrite every function of librustc_driver, measure, and check that a private sysroot
/// with the rewritten library compiles like the original.
///
/// `--large-trace` is slow: the tracer attaches one perf-event uprobe per uprobe site
/// (hundreds here) and closing each costs the kernel ~0.1 s at the end of the session.
fn large_binary(args: &Args) -> Result<()> {
    println!();
    println!("== large binary: the toolchain's librustc_driver, every function");
    let sysroot = PathBuf::from(
        util::output_ok(cmd("rustc").args(["--print", "sysroot"]))?
            .trim()
            .to_string(),
    );
    let lib_dir = sysroot.join("lib");
    let driver = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("cannot list {}", lib_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"))
        })
        .with_context(|| format!("no librustc_driver-*.so in {}", lib_dir.display()))?;
    let name = driver.file_name().unwrap().to_owned();
    let dir = util::scratch_dir("bench-large")?;
    let private = dir.join("sysroot");
    std::fs::create_dir_all(private.join("bin"))?;
    std::fs::create_dir_all(private.join("lib"))?;
    let rewritten = private.join("lib").join(&name);

    // The rewrite, best of N.
    let mut best_s = f64::INFINITY;
    let mut summary = String::new();
    for _ in 0..args.large_runs.max(1) {
        let _ = std::fs::remove_file(&rewritten);
        let mut c = cmd(crate::rewriter_bin());
        c.arg(&driver).arg("-o").arg(&rewritten);
        let t = Instant::now();
        let o = util::output(&mut c)?;
        let s = t.elapsed().as_secs_f64();
        if !o.status.success() {
            bail!(
                "the rewriter failed on {} ({}): {}",
                driver.display(),
                util::describe(o.status),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        best_s = best_s.min(s);
        summary = String::from_utf8_lossy(&o.stdout).trim().to_string();
    }
    let in_bytes = std::fs::metadata(&driver)?.len();
    let out_bytes = std::fs::metadata(&rewritten)?.len();
    let mb = |b: u64| b as f64 / 1e6;
    let per_50mb = best_s / (mb(in_bytes) / 50.0);
    let growth = out_bytes as f64 / in_bytes as f64;
    let verdict = |ok: bool| if ok { "met" } else { "NOT MET" };
    println!();
    for l in summary.lines() {
        println!("rewriter: {}", l.trim());
    }
    println!(
        "{:<36} {:.2} s for {:.1} MB (best of {}) = {:.2} s per 50 MB; goal < 2 s per 50 MB: {}",
        "rewrite time",
        best_s,
        mb(in_bytes),
        args.large_runs.max(1),
        per_50mb,
        verdict(per_50mb < 2.0)
    );
    println!(
        "{:<36} {:.1} MB -> {:.1} MB = {:.3}x; goal < 1.3x: {}",
        "output size",
        mb(in_bytes),
        mb(out_bytes),
        growth,
        verdict(growth < 1.3)
    );

    // A private sysroot: rustc finds its driver through RUNPATH $ORIGIN/../lib (so a
    // copy of the executable, not a link), and derives the sysroot from the driver's
    // path; the rest (LLVM, rustlib) can be links to the original.
    std::fs::copy(sysroot.join("bin/rustc"), private.join("bin/rustc"))?;
    for e in std::fs::read_dir(&lib_dir)? {
        let p = e?.path();
        let n = p.file_name().unwrap();
        if n != name.as_os_str() {
            std::os::unix::fs::symlink(&p, private.join("lib").join(n))?;
        }
    }
    let orig_rustc = sysroot.join("bin/rustc");
    let priv_rustc = private.join("bin/rustc");
    // No LD_LIBRARY_PATH (cargo sets one for xtask): it would win over RUNPATH.
    let rustc = |which: &Path| {
        let mut c = cmd(which);
        c.env_remove("LD_LIBRARY_PATH").current_dir(&dir);
        c
    };
    let got = util::output_ok(rustc(&priv_rustc).args(["--print", "sysroot"]))?;
    if Path::new(got.trim()) != private {
        bail!(
            "the private rustc uses the sysroot {} instead of {}: not the rewritten driver",
            got.trim(),
            private.display()
        );
    }
    let listed = util::output_ok(
        cmd("/lib64/ld-linux-x86-64.so.2")
            .env_remove("LD_LIBRARY_PATH")
            .arg("--list")
            .arg(&priv_rustc),
    )?;
    let loaded = listed
        .lines()
        .filter_map(|l| l.trim().split_once(" => "))
        .find(|(n, _)| Path::new(n.trim()) == Path::new(&name))
        .and_then(|(_, p)| std::fs::canonicalize(p.split(" (").next()?.trim()).ok());
    if loaded != Some(std::fs::canonicalize(&rewritten)?) {
        bail!("ld.so --list does not load the rewritten driver:\n{listed}");
    }

    let mut problems: Vec<String> = Vec::new();
    let mut compare = |what: &str, a: &Output, b: &Output| {
        if a.status.code() != b.status.code()
            || a.stdout != b.stdout
            || a.stderr != b.stderr
            || !a.status.success()
        {
            problems.push(format!(
                "{what}: original ({}) vs rewritten ({})\n  stdout: {:?}\n      vs: {:?}\n  stderr: {:?}\n      vs: {:?}",
                util::describe(a.status),
                util::describe(b.status),
                tail(&a.stdout),
                tail(&b.stdout),
                tail(&a.stderr),
                tail(&b.stderr)
            ));
            false
        } else {
            true
        }
    };
    let vo = util::output(rustc(&orig_rustc).args(["--version", "--verbose"]))?;
    let vp = util::output(rustc(&priv_rustc).args(["--version", "--verbose"]))?;
    if compare("rustc --version --verbose", &vo, &vp) {
        println!(
            "rustc --version --verbose: identical ({})",
            first_line(&String::from_utf8_lossy(&vp.stdout))
        );
    }
    std::fs::write(dir.join("hello.rs"), HELLO_RS)?;
    for (label, flags) in [
        ("-O", &["-O"][..]),
        ("-g", &["-C", "opt-level=0", "-g"][..]),
    ] {
        let mut outs = Vec::new();
        let mut secs = Vec::new();
        for (tag, r) in [("orig", &orig_rustc), ("rewritten", &priv_rustc)] {
            let exe = dir.join(format!("hello-{tag}{label}"));
            let mut c = rustc(r);
            c.args(["--edition", "2021"])
                .args(flags)
                .arg("hello.rs")
                .arg("-o")
                .arg(&exe);
            let t = Instant::now();
            let o = util::output(&mut c)?;
            secs.push(t.elapsed().as_secs_f64());
            outs.push((o, exe));
        }
        let what = format!("rustc {label} hello.rs");
        if !compare(&what, &outs[0].0, &outs[1].0) {
            continue;
        }
        let ro = util::output(&mut cmd(&outs[0].1))?;
        let rp = util::output(&mut cmd(&outs[1].1))?;
        let same_program = compare(&format!("the program compiled with {label}"), &ro, &rp);
        let same_bytes = std::fs::read(&outs[0].1)? == std::fs::read(&outs[1].1)?;
        if same_program {
            println!(
                "{what}: identical compiler output and program output ({} lines); executables {}; compile {:.2} s original, {:.2} s rewritten",
                ro.stdout
                    .split(|&c| c == b'\n')
                    .filter(|l| !l.is_empty())
                    .count(),
                if same_bytes {
                    "byte-identical"
                } else {
                    "differ in bytes"
                },
                secs[0],
                secs[1]
            );
        }
    }
    if args.large_trace {
        let trace = dir.join("rustc.utrace");
        let mut c = rustc(&crate::tracer_bin());
        c.arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&priv_rustc)
            .args(["--edition", "2021", "-O", "hello.rs", "-o"])
            .arg(dir.join("hello-traced"));
        let t = Instant::now();
        let o = util::output(&mut c)?;
        println!(
            "under tracer record ({:.1} s, {}): {}",
            t.elapsed().as_secs_f64(),
            util::describe(o.status),
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .filter(|l| l.starts_with("utrace:"))
                .collect::<Vec<_>>()
                .join("; ")
        );
        if !o.status.success() {
            problems.push(format!(
                "rustc under tracer record failed ({}): {:?}",
                util::describe(o.status),
                tail(&o.stderr)
            ));
        }
    }
    if !problems.is_empty() {
        bail!(
            "the rewritten librustc_driver does not behave like the original (private sysroot {}):\n{}",
            private.display(),
            problems.join("\n")
        );
    }
    println!("rewritten librustc_driver: rustc works identically");
    Ok(())
}

fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let n = s.len();
    let mut i = n.saturating_sub(1500);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    s[i..].to_string()
}
