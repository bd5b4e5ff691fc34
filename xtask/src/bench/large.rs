//! The large-binary section: every function of the toolchain's `librustc_driver` rewritten,
//! timed and sized, then a private sysroot with it must compile like the original.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::Args;
use super::measure::first_line;
use crate::util::{self, cmd};

/// A small program with generics, traits and closures for the rewritten compiler.
const HELLO_RS: &str = include_str!("../../bench/hello.rs");

/// Rewrite every function of librustc_driver, measure, and check that a private sysroot
/// with the rewritten library compiles like the original.
///
/// `--large-trace` is slow: the tracer attaches one perf-event uprobe per uprobe site
/// (hundreds here) and closing each costs the kernel ~0.1 s at the end of the session.
pub fn large_binary(args: &Args) -> Result<()> {
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
