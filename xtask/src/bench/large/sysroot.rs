//! The rewritten driver in a private sysroot must behave like the original: `rustc
//! --version --verbose`, and a small program compiled by each (and, with
//! `--large-trace`, compiled under `tracer record`).

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use anyhow::{Result, bail};

use crate::bench::measure::first_line;
use crate::util::{self, cmd};

/// A small program with generics, traits and closures for the rewritten compiler.
const HELLO_RS: &str = include_str!("../../../bench/hello.rs");

/// Where the original and the private sysroot are.
pub(super) struct Sysroots<'a> {
    pub original: &'a Path,
    pub private: &'a Path,
    /// The file name of `librustc_driver-*.so`.
    pub driver_name: &'a OsStr,
    /// The rewritten driver, in `private/lib`.
    pub rewritten: &'a Path,
    /// The scratch directory the compilers run in.
    pub dir: &'a Path,
}

impl Sysroots<'_> {
    fn orig_rustc(&self) -> std::path::PathBuf {
        self.original.join("bin/rustc")
    }
    fn priv_rustc(&self) -> std::path::PathBuf {
        self.private.join("bin/rustc")
    }
    /// `which` run in the scratch directory without LD_LIBRARY_PATH (cargo sets one for
    /// xtask): it would win over RUNPATH.
    fn rustc(&self, which: &Path) -> Command {
        let mut c = cmd(which);
        c.env_remove("LD_LIBRARY_PATH").current_dir(self.dir);
        c
    }
}

/// Differences found between the original and the rewritten compiler.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    /// Whether `a` (original) and `b` (rewritten) both succeeded with the same output;
    /// if not, the difference is noted.
    fn compare(&mut self, what: &str, a: &Output, b: &Output) -> bool {
        if a.status.code() != b.status.code()
            || a.stdout != b.stdout
            || a.stderr != b.stderr
            || !a.status.success()
        {
            self.0.push(format!(
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
    }
}

/// Build the private sysroot, check that it loads the rewritten driver, and compare the
/// two compilers.
pub(super) fn check_private_sysroot(s: &Sysroots, trace: bool) -> Result<()> {
    make_private(s)?;
    check_loads_rewritten(s)?;
    let mut problems = Problems::default();
    let vo = util::output(s.rustc(&s.orig_rustc()).args(["--version", "--verbose"]))?;
    let vp = util::output(s.rustc(&s.priv_rustc()).args(["--version", "--verbose"]))?;
    if problems.compare("rustc --version --verbose", &vo, &vp) {
        println!(
            "rustc --version --verbose: identical ({})",
            first_line(&String::from_utf8_lossy(&vp.stdout))
        );
    }
    std::fs::write(s.dir.join("hello.rs"), HELLO_RS)?;
    for (label, flags) in [
        ("-O", &["-O"][..]),
        ("-g", &["-C", "opt-level=0", "-g"][..]),
    ] {
        compare_hello(s, label, flags, &mut problems)?;
    }
    if trace {
        trace_hello(s, &mut problems)?;
    }
    if !problems.0.is_empty() {
        bail!(
            "the rewritten librustc_driver does not behave like the original (private sysroot {}):\n{}",
            s.private.display(),
            problems.0.join("\n")
        );
    }
    println!("rewritten librustc_driver: rustc works identically");
    Ok(())
}

/// A private sysroot: rustc finds its driver through RUNPATH $ORIGIN/../lib (so a copy
/// of the executable, not a link), and derives the sysroot from the driver's path; the
/// rest (LLVM, rustlib) can be links to the original.
fn make_private(s: &Sysroots) -> Result<()> {
    std::fs::copy(s.orig_rustc(), s.priv_rustc())?;
    for e in std::fs::read_dir(s.original.join("lib"))? {
        let p = e?.path();
        let n = p.file_name().unwrap();
        let link = s.private.join("lib").join(n);
        // Made once per run: the second check (exits too) finds them.
        if n != s.driver_name && std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(&p, link)?;
        }
    }
    Ok(())
}

/// The private rustc reports the private sysroot and ld.so maps the rewritten driver.
fn check_loads_rewritten(s: &Sysroots) -> Result<()> {
    let priv_rustc = s.priv_rustc();
    let got = util::output_ok(s.rustc(&priv_rustc).args(["--print", "sysroot"]))?;
    if Path::new(got.trim()) != s.private {
        bail!(
            "the private rustc uses the sysroot {} instead of {}: not the rewritten driver",
            got.trim(),
            s.private.display()
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
        .find(|(n, _)| Path::new(n.trim()) == Path::new(s.driver_name))
        .and_then(|(_, p)| std::fs::canonicalize(p.split(" (").next()?.trim()).ok());
    if loaded != Some(std::fs::canonicalize(s.rewritten)?) {
        bail!("ld.so --list does not load the rewritten driver:\n{listed}");
    }
    Ok(())
}

/// hello.rs compiled with `flags` by each compiler: the same compiler output, and the
/// programs print the same.
fn compare_hello(s: &Sysroots, label: &str, flags: &[&str], problems: &mut Problems) -> Result<()> {
    let mut outs = Vec::new();
    let mut secs = Vec::new();
    for (tag, r) in [("orig", s.orig_rustc()), ("rewritten", s.priv_rustc())] {
        let exe = s.dir.join(format!("hello-{tag}{label}"));
        let mut c = s.rustc(&r);
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
    if !problems.compare(&what, &outs[0].0, &outs[1].0) {
        return Ok(());
    }
    let ro = util::output(&mut cmd(&outs[0].1))?;
    let rp = util::output(&mut cmd(&outs[1].1))?;
    let same_program = problems.compare(&format!("the program compiled with {label}"), &ro, &rp);
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
    Ok(())
}

/// hello.rs compiled by the rewritten compiler under `tracer record`.
fn trace_hello(s: &Sysroots, problems: &mut Problems) -> Result<()> {
    let trace = s.dir.join("rustc.utrace");
    let mut c = s.rustc(&crate::tracer_bin());
    c.arg("record")
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(s.priv_rustc())
        .args(["--edition", "2021", "-O", "hello.rs", "-o"])
        .arg(s.dir.join("hello-traced"));
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
        problems.0.push(format!(
            "rustc under tracer record failed ({}): {:?}",
            util::describe(o.status),
            tail(&o.stderr)
        ));
    }
    Ok(())
}

/// The last 1500 bytes of an output, as text.
fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let n = s.len();
    let mut i = n.saturating_sub(1500);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    s[i..].to_string()
}
