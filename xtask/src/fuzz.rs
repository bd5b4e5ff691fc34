//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the libFuzzer targets of `fuzz/`
//! (cargo-fuzz, nightly, no sanitizer: the code is safe Rust, what is hunted is a
//! panic, a hang, an overflow or a runaway allocation). Each target starts from its
//! committed seeds (`fuzz/seeds/TARGET`) and the corpus it grew before
//! (`target/fuzz/corpus/TARGET`, kept across runs); a crash is saved under
//! `target/fuzz/artifacts/TARGET` and fails the run. Every run's executions and
//! coverage are appended to `target/fuzz/log.tsv`, and the totals per target printed.
//!
//! `fuzz/` holds one target per input parser (`fuzz_targets/`: the rewriter's ELF input,
//! the trace reader and every view, the TOML spec, USDT argument specs and `.note.stapsdt`,
//! `.note.utrace`, the control protocol, the user drain's target data), `seeds/TARGET` the
//! committed seeds from the fixtures and `findings/TARGET` every input that once failed. It
//! is its own workspace, excluded from the main one. `--replay` runs every seed and past
//! finding once, as `cargo xtask test` does; `rewriter/tests/fuzz_findings.rs` replays the
//! rewriter's findings too.

use std::{collections::BTreeMap, io::Write as _, path::PathBuf};

use anyhow::{Context, Result, bail};

use crate::util::{self, cmd};

/// Every target (file `fuzz/fuzz_targets/NAME.rs`).
pub(crate) const TARGETS: &[&str] = &[
    "rewrite_elf",
    "trace_read",
    "trace_views",
    "spec",
    "usdt_args",
    "usdt_note",
    "utrace_note",
    "control",
    "target_data",
];

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Run each target once over its seeds and past findings (`fuzz/findings/TARGET`)
    /// instead of fuzzing: deterministic, what `cargo xtask test` does.
    #[arg(long)]
    pub replay: bool,
    /// Targets to run (default: all).
    pub targets: Vec<String>,
}

fn fuzz_dir() -> PathBuf {
    util::workspace_root().join("fuzz")
}

fn work_dir() -> PathBuf {
    util::target_dir().join("fuzz")
}

pub(crate) fn fuzz(args: &Args) -> Result<()> {
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in &args.targets {
            if !TARGETS.contains(&t.as_str()) {
                bail!("no fuzz target {t:?} (targets: {})", TARGETS.join(", "));
            }
        }
        args.targets.iter().map(String::as_str).collect()
    };
    for t in &targets {
        seeds(t)?;
    }
    build()?;
    for t in targets {
        if args.replay {
            replay(t)?;
        } else {
            run(t, args.seconds)?;
        }
    }
    if args.replay { Ok(()) } else { totals() }
}

/// The committed seeds of `target`: a target without any would start from nothing
/// (and libFuzzer refuses a corpus directory that does not exist).
fn seeds(target: &str) -> Result<PathBuf> {
    let dir = fuzz_dir().join("seeds").join(target);
    let n = std::fs::read_dir(&dir).map_or(0, |d| d.count());
    if n == 0 {
        bail!(
            "fuzz target {target} has no seeds in {} (commit some inputs there)",
            dir.display()
        );
    }
    Ok(dir)
}

fn exe(target: &str) -> PathBuf {
    fuzz_dir()
        .join("target/x86_64-unknown-linux-gnu/release")
        .join(target)
}

/// Every seed and past finding of `target`, once each.
fn replay(target: &str) -> Result<()> {
    println!("== fuzz {target}: replay seeds and findings");
    let mut c = cmd(exe(target));
    c.arg(seeds(target)?);
    let findings = fuzz_dir().join("findings").join(target);
    if findings.is_dir() {
        c.arg(findings);
    }
    util::run(c.args([
        "-runs=0",
        "-timeout=10",
        "-rss_limit_mb=4096",
        "-close_fd_mask=1",
    ]))
}

fn build() -> Result<()> {
    println!("== cargo xtask fuzz: build");
    util::run(
        cmd("cargo")
            .args(["+nightly", "fuzz", "build", "--sanitizer", "none"])
            .current_dir(fuzz_dir()),
    )
}

/// One target for `seconds`; its executions and coverage go to the log.
fn run(target: &str, seconds: u64) -> Result<()> {
    let corpus = work_dir().join("corpus").join(target);
    let artifacts = work_dir().join("artifacts").join(target);
    for d in [&corpus, &artifacts] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let exe = exe(target);
    println!("== fuzz {target} for {seconds} s");
    let out = cmd(&exe)
        .arg(&corpus)
        .arg(seeds(target)?)
        .args(Some(fuzz_dir().join("findings").join(target)).filter(|d| d.is_dir()))
        .arg(format!("-max_total_time={seconds}"))
        .args(["-timeout=10", "-rss_limit_mb=4096", "-max_len=262144"])
        .args(["-print_final_stats=1", "-close_fd_mask=1"])
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let stat = |name: &str| -> u64 {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let execs = stat("number_of_executed_units");
    let cov = log
        .lines()
        .rev()
        .find_map(|l| {
            l.split_once(" cov: ")
                .map(|(_, r)| r.split_whitespace().next())
        })
        .flatten()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    println!("   {execs} executions, coverage {cov} edges");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(work_dir().join("log.tsv"))?;
    writeln!(
        f,
        "{target}\t{seconds}\t{execs}\t{cov}\t{}",
        out.status.success()
    )?;
    if !out.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for l in tail.into_iter().rev() {
            println!("   | {l}");
        }
        bail!(
            "fuzz target {target} found a failure ({}); the input is under {}",
            util::describe(out.status),
            artifacts.display()
        );
    }
    Ok(())
}

/// Executions summed over every run in the log, and the best coverage, per target.
fn totals() -> Result<()> {
    let text = std::fs::read_to_string(work_dir().join("log.tsv")).unwrap_or_default();
    let mut sum: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        if let [t, secs, execs, cov, ..] = f[..] {
            let e = sum.entry(t).or_default();
            e.0 += secs.parse::<u64>().unwrap_or(0);
            e.1 += execs.parse::<u64>().unwrap_or(0);
            e.2 = e.2.max(cov.parse().unwrap_or(0));
        }
    }
    println!(
        "== fuzz totals (every run logged in {})",
        work_dir().join("log.tsv").display()
    );
    println!(
        "   {:<12} {:>8} {:>14} {:>8}",
        "target", "seconds", "executions", "cov"
    );
    for (t, (s, e, c)) in sum {
        println!("   {t:<12} {s:>8} {e:>14} {c:>8}");
    }
    Ok(())
}
