//! The large-binary section: every function of the toolchain's `librustc_driver` rewritten,
//! timed and sized, then a private sysroot with it must compile like the original.
//!
//! Rewritten twice: entries only, then entries and exits.

mod sysroot;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::Args;
use crate::util::{self, cmd};

/// Rewrite every function of librustc_driver, measure, and check that a private sysroot
/// with the rewritten library compiles like the original.
///
/// `--large-trace` is slow: the tracer attaches one perf-event uprobe per uprobe site
/// (hundreds here) and closing each costs the kernel ~0.1 s at the end of the session.
pub(super) fn large_binary(args: &Args) -> Result<()> {
    println!();
    println!("== large binary: the toolchain's librustc_driver, every function");
    let sysroot = PathBuf::from(
        util::output_ok(cmd("rustc").args(["--print", "sysroot"]))?
            .trim()
            .to_string(),
    );
    let lib_dir = sysroot.join("lib");
    let driver = find_driver(&lib_dir)?;
    let name = driver.file_name().unwrap().to_owned();
    let dir = util::scratch_dir("bench-large")?;
    let private = dir.join("sysroot");
    std::fs::create_dir_all(private.join("bin"))?;
    std::fs::create_dir_all(private.join("lib"))?;
    let rewritten = private.join("lib").join(&name);

    let runs = args.large_runs.max(1);
    let (best_s, summary) = time_rewrite(&driver, &rewritten, runs, &[])?;
    print_figures(&driver, &rewritten, best_s, &summary, runs)?;
    let sysroots = sysroot::Sysroots {
        original: &sysroot,
        private: &private,
        driver_name: &name,
        rewritten: &rewritten,
        dir: &dir,
    };
    sysroot::check_private_sysroot(&sysroots, args.large_trace)?;
    // Exits too: their windows hold calls, landings and jump tables that entries do
    // not need (a missed jump-table target traps here).
    let (_, summary) = time_rewrite(&driver, &rewritten, 1, &["--sites", "entry,exit"])?;
    for line in summary.lines() {
        println!("rewriter --sites entry,exit: {}", line.trim());
    }
    sysroot::check_private_sysroot(&sysroots, false)
}

/// `lib_dir/librustc_driver-*.so`.
fn find_driver(lib_dir: &Path) -> Result<PathBuf> {
    std::fs::read_dir(lib_dir)
        .with_context(|| format!("cannot list {}", lib_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"))
        })
        .with_context(|| format!("no librustc_driver-*.so in {}", lib_dir.display()))
}

/// The rewrite (`extra` flags), best of `runs`: (seconds, the rewriter's summary of the
/// last run).
fn time_rewrite(
    driver: &Path,
    rewritten: &Path,
    runs: u32,
    extra: &[&str],
) -> Result<(f64, String)> {
    let mut best_s = f64::INFINITY;
    let mut summary = String::new();
    for _ in 0..runs {
        let _ = std::fs::remove_file(rewritten);
        let mut c = cmd(crate::rewriter_bin());
        c.arg(driver).arg("-o").arg(rewritten).args(extra);
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
    Ok((best_s, summary))
}

/// The rewriter's summary, the rewrite time and the output size against the goals.
fn print_figures(
    driver: &Path,
    rewritten: &Path,
    best_s: f64,
    summary: &str,
    runs: u32,
) -> Result<()> {
    let in_bytes = std::fs::metadata(driver)?.len();
    let out_bytes = std::fs::metadata(rewritten)?.len();
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
        runs,
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
    Ok(())
}
