//! `cargo xtask test-arm64-vm`: the AArch64 uprobe + eBPF + ring-buffer path on a real
//! arm64 kernel.
//!
//! Boots Debian's arm64 kernel under `qemu-system-aarch64 -M virt` with an initramfs
//! that holds busybox, an aarch64 `tracer` (aarch64-unknown-linux-musl, linked with
//! rust-lld; its eBPF object is built for `bpf_target_arch = "aarch64"`) and test
//! programs; `/init` runs `tracer record` on each and prints the trace (`tracer dump`)
//! on the console, and this task checks exact per-thread counts, argument values and
//! return addresses. qemu exits 0 whatever happened, so only the console counts.
//!
//! Programs: `standin` (xtask/arm64-vm/standin.c, a hand-made stand-in for a rewritten
//! binary: RW area, flush with a leading NOP taking the slot in x9, stub-like record
//! writes, `.note.utrace` written here) and, when `rewriter` can rewrite AArch64,
//! xtask/arm64-vm/fixture.c built several ways and rewritten.
//!
//! Cached under `target/arm64-vm/`: the .debs (private apt configuration for arm64:
//! the host's dpkg architectures are not touched), the kernel image and busybox.

mod boot;
mod console;
mod cross_tracer;
mod debian;
mod fixtures;
mod initramfs;
mod programs;
mod standin;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::util;
use boot::boot;
use console::check_console;
pub(crate) use cross_tracer::cross_build_tracer;
use debian::kernel_and_busybox;
use fixtures::rewritten_fixtures;
use initramfs::write_initramfs;
use standin::standin;

/// The CPUs every run boots: a plain ARMv8.0 core, then one with PAC and BTI.
const DEFAULT_CPUS: &[&str] = &["cortex-a72", "max,pauth-impdef=on"];
pub(crate) const MUSL_TARGET: &str = "aarch64-unknown-linux-musl";
/// Debian packages (arm64) fetched with `apt-get download`.
const KERNEL_META_PACKAGE: &str = "linux-image-arm64";
const BUSYBOX_PACKAGE: &str = "busybox-static";
const CROSS_GCC: &str = "aarch64-linux-gnu-gcc";
const CROSS_OBJCOPY: &str = "aarch64-linux-gnu-objcopy";
/// aarch64 glibc for the dynamically linked fixture (from libc6-dev-arm64-cross).
const CROSS_LIB: &str = "/usr/aarch64-linux-gnu/lib";

/// Console line prefixes written by /init.
const P_VM: &str = "UTRACE-VM:";
const P_DUMP: &str = "UTRACE-DUMP";
/// Lines the test programs print about themselves.
const P_PROG: &str = "UTPROG";

#[derive(clap::Args)]
pub(crate) struct Args {
    /// qemu `-cpu` model to boot (repeatable; default: cortex-a72, then
    /// max,pauth-impdef=on).
    #[arg(long = "cpu")]
    cpus: Vec<String>,
    /// Seconds one boot may take before qemu is killed.
    #[arg(long, default_value_t = 240)]
    timeout: u64,
    /// Only the hand-made stand-in, not the rewritten fixtures.
    #[arg(long)]
    standin_only: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            cpus: Vec::new(),
            timeout: 240,
            standin_only: false,
        }
    }
}

/// A program run in the VM and what its trace must contain.
struct Program {
    name: String,
    host_path: PathBuf,
    /// Name of the binary in /progs (programs may share one) and its arguments.
    binary: String,
    args: Vec<String>,
    /// Exit status `tracer record` must pass through.
    exit_code: i32,
    expect: Vec<Expect>,
    /// What the records must be: exactly `expect`, or (a program whose records are too
    /// many to list) at least one, the program printing `Loose::prints`.
    loose: Option<Loose>,
}

/// A program checked by what it prints and its report says, with records but no list
/// of them.
struct Loose {
    prints: String,
    /// A line of `tracer report` (its console lines are `UTRACE-REPORT NAME LINE`).
    reported: String,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Who {
    Main,
    Thread(u32),
}

/// Records of one (thread, symbol, mode) in a trace.
struct Expect {
    who: Who,
    symbol: &'static str,
    uprobe: bool,
    /// The first arguments, in any order (exact multiset).
    values: Vec<u64>,
    /// When known: [lo, hi) every return address must be in.
    aux: Option<(u64, u64)>,
}

fn check_tools() -> Result<()> {
    for tool in [
        "qemu-system-aarch64",
        CROSS_GCC,
        CROSS_OBJCOPY,
        "dpkg-deb",
        "apt-get",
    ] {
        if util::which(tool).is_none() {
            bail!("{tool} not found: run `cargo xtask setup` (as root)");
        }
    }
    Ok(())
}

/// One boot on `cpu` and the console's checks, said; whether they passed.
fn boot_and_check(
    args: &Args,
    cpu: &str,
    work: &Path,
    (kernel, initrd): (&Path, &Path),
    programs: &[Program],
) -> Result<bool> {
    let tb = Instant::now();
    let log = work.join(format!(
        "console-{}.log",
        cpu.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    let console = boot(kernel, initrd, cpu, Duration::from_secs(args.timeout), &log)?;
    let errs = check_console(&console, programs);
    let secs = tb.elapsed().as_secs_f64();
    if errs.is_empty() {
        println!(
            "arm64-vm: PASS -cpu {cpu} ({secs:.1}s, console: {})",
            log.display()
        );
        return Ok(true);
    }
    println!(
        "arm64-vm: FAIL -cpu {cpu} ({secs:.1}s, console: {}):",
        log.display()
    );
    for e in &errs {
        println!("    {e}");
    }
    Ok(false)
}

pub(crate) fn test_arm64_vm(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    println!("== cargo xtask test-arm64-vm");
    check_tools()?;
    let cache = util::target_dir().join("arm64-vm");
    let (kernel, busybox) = kernel_and_busybox(&cache)?;
    let tracer = cross_build_tracer()?;
    let work = util::scratch_dir("arm64-vm")?;
    let mut programs = vec![standin(&work)?];
    if !args.standin_only {
        programs.extend(rewritten_fixtures(&work)?);
    }
    let initrd = work.join("initramfs.cpio");
    write_initramfs(&initrd, &busybox, &tracer, &programs)?;
    let prep = t0.elapsed();
    println!(
        "arm64-vm: prepared {} program(s) in {:.1}s: {}",
        programs.len(),
        prep.as_secs_f64(),
        programs
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let cpus: Vec<String> = if args.cpus.is_empty() {
        DEFAULT_CPUS.iter().map(|s| s.to_string()).collect()
    } else {
        args.cpus.clone()
    };
    let mut failures = Vec::new();
    for cpu in &cpus {
        if !boot_and_check(args, cpu, &work, (&kernel, &initrd), &programs)? {
            failures.push(cpu.clone());
        }
    }
    println!(
        "arm64-vm: total {:.1}s (preparation {:.1}s)",
        t0.elapsed().as_secs_f64(),
        prep.as_secs_f64()
    );
    if !failures.is_empty() {
        bail!("arm64 VM test failed on -cpu {}", failures.join(", "));
    }
    Ok(())
}
