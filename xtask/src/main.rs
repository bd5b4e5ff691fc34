//! `cargo xtask <task>`: setup, build, rewrite, demo, test, test-arm64-vm, bench, sqlite3,
//! fuzz, difftest, modgraph.
//!
//! Every external command is printed (`$ ...`) before it runs.

#![warn(unreachable_pub)]

mod arm64_vm;
mod bench;
mod difftest;
mod fuzz;
mod modgraph;
mod setup;
mod util;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use util::cmd;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Developer tasks for utrace (run as root)"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the build and the tests need (apt packages, rust-src, bpf-linker),
    /// mount tracefs. Idempotent.
    Setup,
    /// setup, then `cargo build --release` (rewriter, tracer with its eBPF object).
    Build,
    /// build, then run the rewriter on BINARY with the same arguments.
    Rewrite {
        binary: PathBuf,
        /// Output file (default: BINARY.traced).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// Only instrument functions whose symbol matches GLOB (repeatable).
        #[arg(long = "functions", value_name = "GLOB")]
        functions: Vec<String>,
    },
    /// build, then compile xtask/demo/demo.c, rewrite it, trace it and report.
    Demo,
    /// build, then modgraph, `cargo test --release` (the integration tests need root), the fuzz
    /// targets (replay, then 20 s each), difftest of seeds 1 and 2 (csmith C and C++), and
    /// test-arm64-vm. Arguments after `--` go to cargo test, e.g.
    /// `cargo xtask test -- --test matrix`. A test that lacks a tool fails, unless
    /// `--allow-skip TOOL` lets it skip; the summary line counts the skips.
    Test {
        /// Skip the arm64 VM test (the summary line says so).
        #[arg(long)]
        no_arm64_vm: bool,
        /// Let the tests that need TOOL skip when it is missing (repeatable; the name a
        /// failing test gives, e.g. qemu-aarch64).
        #[arg(long = "allow-skip", value_name = "TOOL")]
        allow_skip: Vec<String>,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// build, then boot Debian's arm64 kernel under qemu-system-aarch64 and trace
    /// AArch64 programs there with an aarch64 tracer (real uprobes, eBPF, ring buffer);
    /// passes on exact counts read from the console.
    TestArm64Vm(arm64_vm::Args),
    /// Compare ns/event: untraced, inline stub, under the tracer, hand-written store, uprobe;
    /// drain throughput (records/s through eBPF, ring buffer, tracer); the large binary.
    Bench(bench::Args),
    /// Build the bench's sqlite3 CLI (Debian's sqlite 3.40.1 source, gcc -O2 -g; cached
    /// in target/xtask/bench-real) and print its path: the memtrace tests' real program.
    Sqlite3,
    /// Run the libFuzzer targets of fuzz/ (cargo-fuzz, nightly).
    Fuzz(fuzz::Args),
    /// build, then differential testing of the rewriter on random C programs (csmith):
    /// same output and exit code rewritten, untraced and traced; exact pairing, and
    /// entry counts equal to kernel uprobes on the originals.
    Difftest(difftest::Args),
    /// Check ARCHITECTURE.md's "dependencies point forward": no cycle among sibling
    /// modules, no module naming a later layer of the declared orders.
    Modgraph,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.task {
        Task::Setup => setup::setup(),
        Task::Build => build(),
        Task::Rewrite {
            binary,
            output,
            functions,
        } => rewrite(&binary, output.as_deref(), &functions),
        Task::Demo => demo(),
        Task::Test {
            no_arm64_vm,
            allow_skip,
            args,
        } => test(&args, !no_arm64_vm, &allow_skip),
        Task::TestArm64Vm(args) => build().and_then(|()| arm64_vm::test_arm64_vm(&args)),
        Task::Bench(args) => bench::bench(&args),
        Task::Sqlite3 => bench::sqlite3().map(|p| println!("{}", p.display())),
        Task::Fuzz(args) => setup::setup().and_then(|()| fuzz::fuzz(&args)),
        Task::Difftest(args) => build().and_then(|()| difftest::difftest(&args)),
        Task::Modgraph => modgraph::modgraph(),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// `cargo build --release` of the default members, with `~/.cargo/bin` (bpf-linker) on PATH.
fn build() -> Result<()> {
    setup::setup()?;
    println!("== cargo xtask build");
    util::run(
        cmd("cargo")
            .args(["build", "--release"])
            .current_dir(util::workspace_root()),
    )
}

fn rewriter_bin() -> PathBuf {
    util::release_dir().join("rewriter")
}

fn tracer_bin() -> PathBuf {
    util::release_dir().join("tracer")
}

fn rewrite(binary: &Path, output: Option<&Path>, functions: &[String]) -> Result<()> {
    build()?;
    let mut c = cmd(rewriter_bin());
    c.arg(binary);
    if let Some(o) = output {
        c.arg("-o").arg(o);
    }
    for f in functions {
        c.arg("--functions").arg(f);
    }
    let st = util::status(&mut c)?;
    if !st.success() {
        bail!("rewriter failed ({})", util::describe(st));
    }
    Ok(())
}

fn demo() -> Result<()> {
    if !util::is_root() {
        println!("warning: not root: `tracer record` needs root (BPF, uprobes)");
    }
    build()?;
    println!("== cargo xtask demo");
    let dir = util::scratch_dir("demo")?;
    let src = util::workspace_root().join("xtask/demo/demo.c");
    let exe = dir.join("demo");
    let traced = dir.join("demo.traced");
    let trace = dir.join("demo.utrace");
    util::run(
        cmd("gcc")
            .args(["-O2", "-g", "-pthread"])
            .arg(&src)
            .arg("-o")
            .arg(&exe),
    )?;
    println!("-- the original program:");
    util::run(&mut cmd(&exe))?;
    println!("-- rewrite it:");
    util::run(
        cmd(rewriter_bin())
            .arg(&exe)
            .arg("-o")
            .arg(&traced)
            .args(["--sites", "entry,exit"]),
    )?;
    println!("-- run the rewritten program under the tracer:");
    util::run(
        cmd(tracer_bin())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&traced),
    )?;
    println!("-- report (names and lines from DWARF, call times from entry/exit pairs):");
    util::run(cmd(tracer_bin()).arg("report").arg(&trace))?;
    println!("-- export for ui.perfetto.dev, and a flame graph:");
    let pftrace = dir.join("demo.pftrace");
    let svg = dir.join("demo.svg");
    util::run(
        cmd(tracer_bin())
            .arg("export")
            .arg(&trace)
            .args(["--format", "perfetto", "-o"])
            .arg(&pftrace),
    )?;
    util::run(
        cmd(tracer_bin())
            .arg("flamegraph")
            .arg(&trace)
            .arg("-o")
            .arg(&svg),
    )?;
    println!(
        "-- files in {}: demo (original), demo.traced (rewritten), demo.utrace (trace), \
         demo.pftrace (open it in ui.perfetto.dev), demo.svg (flame graph); try `{} dump {}`",
        dir.display(),
        tracer_bin().display(),
        trace.display()
    );
    Ok(())
}

fn test(args: &[String], arm64_vm: bool, allow_skip: &[String]) -> Result<()> {
    if !util::is_root() {
        bail!(
            "`cargo xtask test` must run as root: the integration tests load eBPF programs, \
             attach uprobes and use tracefs (try: sudo -E cargo xtask test)"
        );
    }
    build()?;
    modgraph::modgraph()?;
    // The portability test reads traces with the aarch64 tracer too.
    let a64_tracer = arm64_vm::cross_build_tracer()?;
    println!("== cargo xtask test");
    // tests/tests/memtrace.rs traces the bench's sqlite3; without it (no network, say)
    // those tests fail unless `--allow-skip bench-sqlite3`.
    let sqlite3 = bench::sqlite3().unwrap_or_else(|e| {
        println!("== the bench's sqlite3 is missing: {e:#}");
        PathBuf::new()
    });
    let skip_log = util::target_dir().join("xtask/skipped.tsv");
    if skip_log.exists() {
        std::fs::remove_file(&skip_log).context("old skip log")?;
    }
    let st = util::status(
        cmd("cargo")
            // Run every test binary even after a failure; the exit code still says.
            .args(["test", "--release", "--no-fail-fast"])
            .args(args)
            .env("UTRACE_AARCH64_TRACER", &a64_tracer)
            .env("UTRACE_BENCH_SQLITE3", &sqlite3)
            // A test that lacks a tool fails unless it is allowed here (tests::skip).
            .env("UTRACE_ALLOW_SKIP", allow_skip.join(","))
            .env("UTRACE_SKIP_LOG", &skip_log)
            // The tests' sessions cache debug information in a scratch cache.
            .env(
                "UTRACE_DEBUG_CACHE",
                util::target_dir().join("xtask/test-debug-cache"),
            )
            .current_dir(util::workspace_root()),
    )
    .context("cannot run cargo test")?;
    if st.success() {
        println!("== host tests passed");
    }
    // Every fuzz target over its seeds and past findings (deterministic), then 20 s of
    // fuzzing each from its corpus; the rewriter on random programs (fixed seeds).
    let fuzz = fuzz::fuzz(&fuzz::Args {
        seconds: 0,
        replay: true,
        targets: Vec::new(),
    })
    .and_then(|()| {
        fuzz::fuzz(&fuzz::Args {
            seconds: 20,
            replay: false,
            targets: Vec::new(),
        })
    })
    .and_then(|()| {
        difftest::difftest(&difftest::Args {
            programs: 2,
            seed: 1,
            arch: Vec::new(),
            batch: 2,
            lang: Vec::new(),
        })
    });
    // The VM test runs even after a host failure: its result is independent.
    let vm = if arm64_vm {
        arm64_vm::test_arm64_vm(&arm64_vm::Args::default())
    } else {
        Ok(())
    };
    if !st.success() {
        for e in [&fuzz, &vm].into_iter().filter_map(|r| r.as_ref().err()) {
            println!("== {e:#}");
        }
        bail!("tests failed ({})", util::describe(st));
    }
    if let (Err(e), Err(_)) = (&fuzz, &vm) {
        println!("== {e:#}");
    }
    vm?;
    fuzz?;
    println!("== all tests passed; {}", skipped(&skip_log, arm64_vm)?);
    Ok(())
}

/// What the run skipped: the tests the allowed tools let skip (from the log the tests
/// append to, `tests::skip`), and the arm64 VM if it was left out.
fn skipped(log: &Path, arm64_vm: bool) -> Result<String> {
    let text = match std::fs::read_to_string(log) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).context("skip log"),
    };
    let mut by_tool = std::collections::BTreeMap::<&str, usize>::new();
    for line in text.lines() {
        *by_tool
            .entry(line.split('\t').next().unwrap_or(line))
            .or_default() += 1;
    }
    let n: usize = by_tool.values().sum();
    let mut s = if n == 0 {
        "0 skipped".to_string()
    } else {
        let tools: Vec<String> = by_tool.iter().map(|(t, k)| format!("{t}: {k}")).collect();
        format!("{n} SKIPPED (allowed: {})", tools.join(", "))
    };
    if !arm64_vm {
        s.push_str("; the arm64 VM test SKIPPED (--no-arm64-vm)");
    }
    Ok(s)
}
