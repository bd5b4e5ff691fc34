//! `cargo xtask setup`: make a fresh Debian 12 machine (root, crates.io + Debian apt
//! reachable) able to build, test, demo and bench. Idempotent: every step first checks
//! whether there is anything to do and says what it did or skipped.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::util::{self, cmd};

/// Every Debian package the build, the tests, the demo and the bench need: the one place
/// to add more.
pub(crate) const APT_PACKAGES: &[&str] = &[
    "gcc",
    // C++ fixtures (exceptions, `.cold` parts, demangling).
    "g++",
    "clang",
    "binutils",
    // Headers, crt files and libc.a (static fixtures); only a Recommends of gcc.
    "libc6-dev",
    // bpf-linker links libz next to libLLVM.
    "zlib1g-dev",
    // AArch64 fixtures (tests/tests/aarch64.rs): cross gcc + binutils (objdump checks
    // the hand encoders), the arm64 sysroot, and qemu-user to run them.
    "gcc-aarch64-linux-gnu",
    // C++ fixtures with exceptions and `.cold` parts (tests/tests/cold_parts.rs).
    "g++-aarch64-linux-gnu",
    "binutils-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user",
    // `cargo xtask test-arm64-vm`: qemu-system-aarch64 boots Debian's arm64 kernel
    // (fetched with `apt-get download` under a private arm64 apt configuration).
    "qemu-system-arm",
    // USDT fixtures (<sys/sdt.h>) and real programs rewritten by the tests.
    "systemtap-sdt-dev",
    "sqlite3",
    "jq",
    "bzip2",
    // tests/tests/tracer_kill.rs: what a killed tracer left in the kernel.
    "bpftool",
    // tests/tests/short_lived.rs: the system calls of a program started without a tracer.
    "strace",
    // tests/tests/trust_limits.rs: the tracer's peak RSS (`/usr/bin/time -f %M`).
    "time",
    // tests/tests/trust_runtime.rs: setcap/getcap (a program given a file capability).
    "libcap2-bin",
    // `cargo xtask bench --only real`: the peers it is measured against (LTTng-UST's
    // function tracing, its trace counted by babeltrace2).
    "uftrace",
    "lttng-tools",
    "liblttng-ust-dev",
    "babeltrace2",
    // tests/tests/memtrace.rs and `bench --only memtrace`: lackey counts every access.
    "valgrind",
    // `--real-profile`: where a traced record's nanoseconds go (perf record).
    "linux-perf",
    // tests/tests/python.rs: the oracle of Python's USDT probes, on the untouched
    // interpreter (python3 itself is in every Debian install).
    "bpftrace",
    // `cargo xtask difftest`: random C programs (generator and its headers).
    "csmith",
    "libcsmith-dev",
];

/// `cargo xtask fuzz` drives libFuzzer through cargo-fuzz (crates.io), on nightly.
pub(crate) const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// The Rust target of the aarch64 tracer run in the arm64 VM (linked with rust-lld).
pub(crate) const RUST_CROSS_TARGETS: &[&str] = &[crate::arm64_vm::MUSL_TARGET];

pub(crate) const BPF_LINKER_VERSION: &str = "0.13.0";
/// bpf-linker cargo features that select an LLVM major ("llvm-<major>").
const BPF_LINKER_LLVM_FEATURES: &[u32] = &[21, 22, 23];

pub(crate) const TRACEFS: &str = "/sys/kernel/tracing";

struct Log(Vec<String>);

impl Log {
    fn did(&mut self, s: impl Into<String>) {
        let s = s.into();
        println!("setup: did: {s}");
        self.0.push(format!("did      {s}"));
    }
    fn skipped(&mut self, s: impl Into<String>) {
        let s = s.into();
        println!("setup: skipped: {s}");
        self.0.push(format!("skipped  {s}"));
    }
}

pub(crate) fn setup() -> Result<()> {
    println!("== cargo xtask setup");
    let mut log = Log(Vec::new());
    apt(&mut log)?;
    tracefs(&mut log)?;
    let nightly_llvm = rust_src(&mut log)?;
    bpf_linker(&mut log, &nightly_llvm)?;
    rust_targets(&mut log)?;
    python_packages(&mut log)?;
    cargo_fuzz(&mut log)?;
    println!("== setup summary");
    for l in &log.0 {
        println!("   {l}");
    }
    Ok(())
}

fn cargo_fuzz(log: &mut Log) -> Result<()> {
    let have = cmd("cargo")
        .args(["fuzz", "--version"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if have.contains(CARGO_FUZZ_VERSION) {
        log.skipped(format!("cargo-fuzz {CARGO_FUZZ_VERSION} already installed"));
        return Ok(());
    }
    util::run(cmd("cargo").args([
        "install",
        "--locked",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))?;
    log.did(format!("installed cargo-fuzz {CARGO_FUZZ_VERSION}"));
    Ok(())
}

/// Python packages of the tests (PyPI), installed into [`PYTHON_DIR`]: Perfetto's own
/// generated protos (`perfetto_trace_pb2`) read the Perfetto exports independently,
/// DuckDB the Parquet exports.
pub(crate) const PYTHON_PACKAGES: &[&str] =
    &["perfetto==0.59.1", "protobuf==7.36.2", "duckdb==2.0.1"];
/// Where [`PYTHON_PACKAGES`] go (PYTHONPATH of the tests that use them).
pub(crate) const PYTHON_DIR: &str = "target/xtask/python";

fn python_packages(log: &mut Log) -> Result<()> {
    let dir = util::workspace_root().join(PYTHON_DIR);
    let check = cmd("python3")
        .args([
            "-c",
            "from perfetto.protos.perfetto.trace import perfetto_trace_pb2; import duckdb",
        ])
        .env("PYTHONPATH", &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if check.is_ok_and(|s| s.success()) {
        log.skipped(format!(
            "python: already in {}: {}",
            dir.display(),
            PYTHON_PACKAGES.join(" ")
        ));
        return Ok(());
    }
    util::run(
        cmd("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--upgrade",
                "--target",
            ])
            .arg(&dir)
            .args(PYTHON_PACKAGES),
    )?;
    log.did(format!(
        "python: installed {} into {}",
        PYTHON_PACKAGES.join(" "),
        dir.display()
    ));
    Ok(())
}

fn apt(log: &mut Log) -> Result<()> {
    let missing = missing_packages()?;
    if missing.is_empty() {
        log.skipped(format!(
            "apt: already installed: {}",
            APT_PACKAGES.join(" ")
        ));
        return Ok(());
    }
    if !util::is_root() {
        bail!(
            "missing Debian packages: {} (run `cargo xtask setup` as root, or apt-get install them)",
            missing.join(" ")
        );
    }
    util::run(
        cmd("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    util::run(
        cmd("apt-get")
            .args(["install", "-y", "-q"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    let still = missing_packages()?;
    if !still.is_empty() {
        bail!("apt-get install did not install: {}", still.join(" "));
    }
    log.did(format!("apt: installed {}", missing.join(" ")));
    Ok(())
}

/// Packages of `APT_PACKAGES` that dpkg does not report as installed.
fn missing_packages() -> Result<Vec<String>> {
    if util::which("dpkg-query").is_none() {
        bail!("dpkg-query not found: `cargo xtask setup` supports Debian only");
    }
    // Non-zero exit when a package is unknown to dpkg; we only read what it prints.
    let o = util::output(
        cmd("dpkg-query")
            .arg("-W")
            .arg("-f=${Package} ${Status}\n")
            .args(APT_PACKAGES),
    )?;
    let text = String::from_utf8_lossy(&o.stdout);
    let installed: Vec<&str> = text
        .lines()
        .filter(|l| l.ends_with("install ok installed"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    Ok(APT_PACKAGES
        .iter()
        .filter(|p| !installed.contains(p))
        .map(|p| p.to_string())
        .collect())
}

fn tracefs(log: &mut Log) -> Result<()> {
    if Path::new(TRACEFS).join("events").is_dir() {
        log.skipped(format!("tracefs already mounted at {TRACEFS}"));
        return Ok(());
    }
    if !util::is_root() {
        println!(
            "setup: warning: {TRACEFS} is not mounted and we are not root; the tracer mounts it itself"
        );
        log.skipped("tracefs mount (not root)");
        return Ok(());
    }
    std::fs::create_dir_all(TRACEFS).ok();
    util::run(cmd("mount").args(["-t", "tracefs", "nodev", TRACEFS]))?;
    log.did(format!("mounted tracefs at {TRACEFS}"));
    Ok(())
}

/// `rustup target add` for the cross targets (RUSTUP_AUTO_INSTALL=0: nothing adds them
/// implicitly), for the default toolchain that `cargo build` uses.
fn rust_targets(log: &mut Log) -> Result<()> {
    let installed = util::output_ok(cmd("rustup").args(["target", "list", "--installed"]))?;
    let missing: Vec<&str> = RUST_CROSS_TARGETS
        .iter()
        .copied()
        .filter(|t| !installed.lines().any(|l| l.trim() == *t))
        .collect();
    if missing.is_empty() {
        log.skipped(format!(
            "rustup: targets already installed: {}",
            RUST_CROSS_TARGETS.join(" ")
        ));
        return Ok(());
    }
    util::run(cmd("rustup").args(["target", "add"]).args(&missing))?;
    log.did(format!("rustup: added targets {}", missing.join(" ")));
    Ok(())
}

/// LLVM version of a toolchain component.
#[derive(Clone, Debug)]
pub(crate) struct LlvmVersion {
    pub full: String,
    pub major: u32,
}

fn parse_llvm_version(text: &str, marker: &str) -> Option<LlvmVersion> {
    let i = text.find(marker)? + marker.len();
    let full: String = text[i..]
        .trim_start()
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    let major = full.split('.').next()?.parse().ok()?;
    Some(LlvmVersion { full, major })
}

/// Nightly toolchain with rust-src (needed by `-Z build-std` for the eBPF crate).
/// Returns the LLVM version of `rustc +nightly`.
fn rust_src(log: &mut Log) -> Result<LlvmVersion> {
    let toolchains = util::output_ok(cmd("rustup").args(["toolchain", "list"]))?;
    let have_nightly = toolchains
        .lines()
        .any(|l| l.starts_with("nightly-") || l.starts_with("nightly "));
    if !have_nightly {
        // RUSTUP_AUTO_INSTALL=0: nothing installs a toolchain implicitly.
        util::run(cmd("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
        log.did("rustup: installed toolchain nightly with rust-src");
    } else {
        let comps = util::output_ok(cmd("rustup").args([
            "component",
            "list",
            "--installed",
            "--toolchain",
            "nightly",
        ]))?;
        if comps
            .lines()
            .any(|l| l.trim() == "rust-src" || l.starts_with("rust-src"))
        {
            log.skipped("rustup: rust-src already installed for nightly");
        } else {
            util::run(cmd("rustup").args([
                "component",
                "add",
                "rust-src",
                "--toolchain",
                "nightly",
            ]))?;
            log.did("rustup: added rust-src to nightly");
        }
    }
    let vv = util::output_ok(cmd("rustc").args(["+nightly", "-vV"]))?;
    parse_llvm_version(&vv, "LLVM version:")
        .with_context(|| format!("cannot find the LLVM version in `rustc +nightly -vV`:\n{vv}"))
}

/// What a bpf-linker binary says about itself.
struct BpfLinkerInfo {
    version: String,
    llvm: LlvmVersion,
}

fn probe_bpf_linker(path: &Path) -> Result<BpfLinkerInfo> {
    let o = util::output(cmd(path).arg("--version"))?;
    if !o.status.success() {
        bail!(
            "`{} --version` failed: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let version = text
        .split_whitespace()
        .nth(1)
        .context("unexpected `bpf-linker --version` output")?
        .to_string();
    // LLVM's own option parser answers --version (and exits) before any input is read.
    let dir = util::target_dir().join("xtask");
    std::fs::create_dir_all(&dir)?;
    let o = util::output(
        cmd(path)
            .arg("--llvm-args=--version")
            .arg("-o")
            .arg(dir.join("bpf-linker-probe.o"))
            .arg("/dev/null"),
    )?;
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let llvm = parse_llvm_version(&all, "LLVM version")
        .with_context(|| format!("cannot find bpf-linker's LLVM version in:\n{all}"))?;
    Ok(BpfLinkerInfo { version, llvm })
}

fn bpf_linker(log: &mut Log, nightly: &LlvmVersion) -> Result<()> {
    let installed = util::cargo_bin_dir().join("bpf-linker");
    let candidate = if installed.exists() {
        Some(installed.clone())
    } else {
        util::which("bpf-linker")
    };
    if let Some(path) = &candidate {
        match probe_bpf_linker(path) {
            Ok(info) if info.version == BPF_LINKER_VERSION && info.llvm.major == nightly.major => {
                println!(
                    "setup: rustc +nightly LLVM {} / bpf-linker ({}) LLVM {}: majors match",
                    nightly.full,
                    path.display(),
                    info.llvm.full
                );
                log.skipped(format!(
                    "bpf-linker {} already works: {} (LLVM {})",
                    info.version,
                    path.display(),
                    info.llvm.full
                ));
                return Ok(());
            }
            Ok(info) => println!(
                "setup: {} is bpf-linker {} with LLVM {}; need {} with LLVM {}: reinstalling",
                path.display(),
                info.version,
                info.llvm.full,
                BPF_LINKER_VERSION,
                nightly.major
            ),
            Err(e) => println!(
                "setup: {} does not work ({e:#}): reinstalling",
                path.display()
            ),
        }
    }
    install_bpf_linker(nightly)?;
    let info =
        probe_bpf_linker(&installed).context("the freshly installed bpf-linker does not run")?;
    println!(
        "setup: rustc +nightly LLVM {} / bpf-linker LLVM {}",
        nightly.full, info.llvm.full
    );
    if info.llvm.major != nightly.major {
        bail!(
            "bpf-linker uses LLVM {} but rustc +nightly uses LLVM {}",
            info.llvm.full,
            nightly.full
        );
    }
    log.did(format!(
        "installed bpf-linker {} into {} (LLVM {})",
        info.version,
        installed.display(),
        info.llvm.full
    ));
    Ok(())
}

/// Build bpf-linker against the nightly toolchain's own libLLVM.
///
/// The prefix only holds `lib/libLLVM.so` and `lib/<soname>`, both symlinks to the
/// sysroot's `libLLVM.so.*`. The build bakes the prefix's lib/ into bpf-linker's RUNPATH,
/// so the prefix lives next to the installed binary (`$CARGO_HOME`), not in `target/`
/// (a `cargo clean` would otherwise break bpf-linker).
fn install_bpf_linker(nightly: &LlvmVersion) -> Result<()> {
    if !BPF_LINKER_LLVM_FEATURES.contains(&nightly.major) {
        bail!(
            "rustc +nightly uses LLVM {}, bpf-linker {} supports LLVM {:?}",
            nightly.full,
            BPF_LINKER_VERSION,
            BPF_LINKER_LLVM_FEATURES
        );
    }
    let sysroot = util::output_ok(cmd("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let libdir = PathBuf::from(sysroot.trim()).join("lib");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(&libdir)
        .with_context(|| format!("cannot read {}", libdir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .collect();
    libs.sort();
    let lib = match libs.as_slice() {
        [one] => one.clone(),
        [] => bail!(
            "no libLLVM.so.* in {} (the nightly toolchain ships LLVM as a shared library)",
            libdir.display()
        ),
        many => bail!("several libLLVM.so.* in {}: {many:?}", libdir.display()),
    };
    let soname = lib.file_name().unwrap().to_owned();
    let prefix = util::cargo_home().join("bpf-linker-llvm-prefix");
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)?;
    for name in [std::ffi::OsStr::new("libLLVM.so"), soname.as_os_str()] {
        let link = prefix_lib.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(lib.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link)
                .with_context(|| format!("cannot create symlink {}", link.display()))?;
            println!("setup: symlink {} -> {}", link.display(), lib.display());
        }
    }
    let mut c = cmd("cargo");
    c.args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--no-default-features",
        "--features",
    ])
    .arg(format!("llvm-{}", nightly.major))
    .arg("--force")
    .env("LLVM_PREFIX", &prefix);
    // llvm-sys reads LLVM_SYS_<its crate major>_PREFIX, e.g. 221 for llvm-sys 221.x (LLVM 22).
    for minor in 0..3 {
        c.env(
            format!("LLVM_SYS_{}{}_PREFIX", nightly.major, minor),
            &prefix,
        );
    }
    println!(
        "setup: building bpf-linker against {} (takes a few minutes)",
        lib.display()
    );
    util::run(&mut c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_versions() {
        let v = parse_llvm_version("rustc 1.97\nLLVM version: 22.1.4\n", "LLVM version:").unwrap();
        assert_eq!((v.full.as_str(), v.major), ("22.1.4", 22));
        let v = parse_llvm_version(
            "LLVM (http://llvm.org/):\n  LLVM version 22.1.4-rust-1.97.0-nightly\n",
            "LLVM version",
        )
        .unwrap();
        assert_eq!(
            (v.full.as_str(), v.major),
            ("22.1.4-rust-1.97.0-nightly", 22)
        );
        assert!(parse_llvm_version("nothing", "LLVM version").is_none());
    }
}
