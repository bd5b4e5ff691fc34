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

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use object::{Object, ObjectSection, ObjectSymbol};
use tracer_common::meta::{META_FLAG_PIC, Metadata, Site, SiteKind, SiteMode};

use crate::util::{self, cmd};

/// The CPUs every run boots: a plain ARMv8.0 core, then one with PAC and BTI.
pub const DEFAULT_CPUS: &[&str] = &["cortex-a72", "max,pauth-impdef=on"];
pub const MUSL_TARGET: &str = "aarch64-unknown-linux-musl";
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
pub struct Args {
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

pub fn test_arm64_vm(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    println!("== cargo xtask test-arm64-vm");
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
        let tb = Instant::now();
        let log = work.join(format!(
            "console-{}.log",
            cpu.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        let console = boot(
            &kernel,
            &initrd,
            cpu,
            Duration::from_secs(args.timeout),
            &log,
        )?;
        let errs = check_console(&console, &programs);
        let secs = tb.elapsed().as_secs_f64();
        if errs.is_empty() {
            println!(
                "arm64-vm: PASS -cpu {cpu} ({secs:.1}s, console: {})",
                log.display()
            );
        } else {
            println!(
                "arm64-vm: FAIL -cpu {cpu} ({secs:.1}s, console: {}):",
                log.display()
            );
            for e in &errs {
                println!("    {e}");
            }
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

// ---------------------------------------------------------------------------------
// Kernel and busybox from Debian (arm64), cached.

/// An apt configuration of its own: architecture arm64, the host's sources, state and
/// cache under `dir`. Only used for `apt-get download`; nothing is installed.
fn apt_config(dir: &Path) -> Result<PathBuf> {
    for d in [
        "etc/apt.conf.d",
        "etc/preferences.d",
        "state/lists/partial",
        "cache/archives/partial",
    ] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    let status = dir.join("state/status");
    if !status.exists() {
        std::fs::write(&status, "")?;
    }
    let conf = dir.join("apt.conf");
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            "APT::Architecture \"arm64\";\n\
             APT::Architectures {{ \"arm64\"; }};\n\
             APT::Sandbox::User \"root\";\n\
             Dir::Etc \"{d}/etc\";\n\
             Dir::Etc::sourcelist \"/etc/apt/sources.list\";\n\
             Dir::Etc::sourceparts \"/etc/apt/sources.list.d\";\n\
             Dir::Etc::trusted \"/etc/apt/trusted.gpg\";\n\
             Dir::Etc::trustedparts \"/etc/apt/trusted.gpg.d\";\n\
             Dir::State \"{d}/state\";\n\
             Dir::State::status \"{d}/state/status\";\n\
             Dir::Cache \"{d}/cache\";\n"
        ),
    )?;
    Ok(conf)
}

fn find_deb(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with("_arm64.deb"))
        })
        .collect();
    v.sort();
    v.pop()
}

/// `(kernel Image, busybox)`, downloading and extracting the .debs on first use.
fn kernel_and_busybox(cache: &Path) -> Result<(PathBuf, PathBuf)> {
    let kernel = cache.join("Image");
    let busybox = cache.join("busybox");
    if kernel.exists() && busybox.exists() {
        println!(
            "arm64-vm: cached kernel {} and busybox",
            std::fs::read_to_string(cache.join("Image.version"))
                .unwrap_or_default()
                .trim()
        );
        return Ok((kernel, busybox));
    }
    let apt = cache.join("apt");
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs)?;
    let conf = apt_config(&apt)?;
    let apt_cmd = |prog: &str| {
        let mut c = cmd(prog);
        c.env("APT_CONFIG", &conf).current_dir(&debs);
        c
    };
    let image_deb = find_deb(&debs, "linux-image-").filter(|p| {
        !p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("linux-image-arm64_")
    });
    let busybox_deb = find_deb(&debs, &format!("{BUSYBOX_PACKAGE}_"));
    let (image_deb, busybox_deb) = match (image_deb, busybox_deb) {
        (Some(i), Some(b)) => (i, b),
        _ => {
            util::run(apt_cmd("apt-get").args(["update", "-q"]))?;
            // linux-image-arm64 depends on the versioned image package.
            let deps =
                util::output_ok(apt_cmd("apt-cache").args(["depends", KERNEL_META_PACKAGE]))?;
            let image = deps
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Depends: "))
                .find(|p| p.starts_with("linux-image-") && !p.contains("unsigned"))
                .with_context(|| {
                    format!(
                        "no image package in `apt-cache depends {KERNEL_META_PACKAGE}`:\n{deps}"
                    )
                })?
                .to_string();
            util::run(apt_cmd("apt-get").args(["download", &image, BUSYBOX_PACKAGE]))?;
            (
                find_deb(&debs, &format!("{image}_")).context("kernel .deb not downloaded")?,
                find_deb(&debs, &format!("{BUSYBOX_PACKAGE}_"))
                    .context("busybox .deb not downloaded")?,
            )
        }
    };
    let x = cache.join("extract");
    if x.exists() {
        std::fs::remove_dir_all(&x)?;
    }
    std::fs::create_dir_all(&x)?;
    for (deb, what) in [(&image_deb, "./boot/"), (&busybox_deb, "./bin/busybox")] {
        let tar = util::output(cmd("dpkg-deb").arg("--fsys-tarfile").arg(deb))?;
        ensure!(
            tar.status.success(),
            "dpkg-deb --fsys-tarfile {} failed",
            deb.display()
        );
        let mut c = cmd("tar");
        c.arg("-x")
            .arg("-C")
            .arg(&x)
            .arg(what)
            .stdin(Stdio::piped());
        util::announce(&c);
        let mut child = c.spawn().context("cannot run tar")?;
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&tar.stdout)?;
        ensure!(child.wait()?.success(), "tar failed on {}", deb.display());
    }
    let vmlinuz = std::fs::read_dir(x.join("boot"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .context("no /boot/vmlinuz-* in the kernel package")?;
    let version = vmlinuz.file_name().unwrap().to_string_lossy()["vmlinuz-".len()..].to_string();
    let data = std::fs::read(&vmlinuz)?;
    // Debian ships an uncompressed arm64 Image (older ones gzip it; qemu takes both).
    std::fs::write(&kernel, &data)?;
    std::fs::write(cache.join("Image.version"), format!("{version}\n"))?;
    std::fs::copy(x.join("bin/busybox"), &busybox)?;
    std::fs::remove_dir_all(&x).ok();
    println!(
        "arm64-vm: kernel {version} and busybox extracted into {}",
        cache.display()
    );
    Ok((kernel, busybox))
}

// ---------------------------------------------------------------------------------
// The aarch64 tracer.

/// `cargo build --release -p tracer-user --target aarch64-unknown-linux-musl`, linked
/// with rust-lld (the linker is set for this target only, in this command's
/// environment: host builds are unaffected). tracer-user's build script builds the
/// eBPF object for the target's architecture.
pub fn cross_build_tracer() -> Result<PathBuf> {
    let var = format!(
        "CARGO_TARGET_{}_LINKER",
        MUSL_TARGET.to_uppercase().replace('-', "_")
    );
    util::run(
        cmd("cargo")
            .args([
                "build",
                "--release",
                "-p",
                "tracer-user",
                "--target",
                MUSL_TARGET,
            ])
            .env(var, "rust-lld")
            .current_dir(util::workspace_root()),
    )?;
    Ok(util::target_dir()
        .join(MUSL_TARGET)
        .join("release")
        .join("tracer"))
}

// ---------------------------------------------------------------------------------
// Test programs.

fn src(name: &str) -> PathBuf {
    util::workspace_root().join("xtask/arm64-vm").join(name)
}

struct Elf {
    data: Vec<u8>,
}

impl Elf {
    fn read(path: &Path) -> Result<Self> {
        Ok(Elf {
            data: std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
        })
    }
    fn file(&self) -> Result<object::File<'_>> {
        Ok(object::File::parse(&*self.data)?)
    }
    /// (address, size, file offset) of a symbol.
    fn symbol(&self, name: &str) -> Result<(u64, u64, u64)> {
        let f = self.file()?;
        let s = f
            .symbols()
            .find(|s| s.name() == Ok(name))
            .with_context(|| format!("no symbol {name}"))?;
        let sec = f.section_by_index(s.section_index().context("undefined symbol")?)?;
        let (off, _) = sec.file_range().context("symbol in a NOBITS section")?;
        Ok((s.address(), s.size(), s.address() - sec.address() + off))
    }
    fn word_at_file(&self, off: u64) -> Option<u32> {
        let b = self.data.get(off as usize..off as usize + 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }
    fn is_pic(&self) -> Result<bool> {
        Ok(self.file()?.kind() != object::ObjectKind::Executable)
    }
}

/// `bti c`, `bti jc`, `paciasp`, `pacibsp`: landing pads a uprobe site goes after (as the
/// rewriter places them).
const LANDING_PADS: &[u32] = &[0xd503_245f, 0xd503_24df, 0xd503_233f, 0xd503_237f];

fn cross_gcc(out: &Path, source: &Path, flags: &[&str]) -> Result<()> {
    util::run(
        cmd(CROSS_GCC)
            .args(["-O2", "-g", "-pthread"])
            .args(flags)
            .arg(source)
            .arg("-o")
            .arg(out),
    )
}

/// The hand-made stand-in, with its `.note.utrace`.
fn standin(work: &Path) -> Result<Program> {
    let raw = work.join("standin.raw");
    let out = work.join("standin");
    // BTI + PAC code (NOPs on cores without them): probe_target starts with paciasp.
    cross_gcc(
        &raw,
        &src("standin.c"),
        &["-static", "-mbranch-protection=standard"],
    )?;
    let elf = Elf::read(&raw)?;
    let (flush_vaddr, _, flush_file_off) = elf.symbol("utrace_flush")?;
    let (rw_vaddr, _, _) = elf.symbol("utrace_rw")?;
    let mut sites = Vec::new();
    for (id, sym, mode) in [
        (0, "work", SiteMode::Inline),
        (1, "probe_target", SiteMode::Uprobe),
        (2, "main", SiteMode::Inline),
    ] {
        let (mut vaddr, _, mut file_off) = elf.symbol(sym)?;
        if mode == SiteMode::Uprobe
            && elf
                .word_at_file(file_off)
                .is_some_and(|w| LANDING_PADS.contains(&w))
        {
            vaddr += 4;
            file_off += 4;
        }
        sites.push(Site {
            id,
            vaddr,
            file_off,
            name: sym.into(),
            kind: SiteKind::FunctionEntry,
            mode,
            nargs: 0,
        });
    }
    const NSLOTS: u32 = 64;
    const BUF_RECORDS: u32 = 16;
    let meta = Metadata {
        arch: tracer_common::ARCH_AARCH64,
        record_version: tracer_common::RECORD_VERSION,
        record_size: tracer_common::RECORD_SIZE as u32,
        build_id: vec![],
        nslots: NSLOTS,
        buf_records: BUF_RECORDS,
        flags: if elf.is_pic()? { META_FLAG_PIC } else { 0 },
        binary_id: 0x4152_3634_5654_0001,
        flush_vaddr,
        flush_file_off,
        rw_vaddr,
        rw_size: tracer_common::rw_size(
            tracer_common::BUF_TRACE,
            NSLOTS,
            u64::from(BUF_RECORDS) * 32,
        ),
        text_vaddr: 0,
        text_size: 0,
        original_size: elf.data.len() as u64,
        time_mode: Default::default(),
        semaphores: Vec::new(),
        operands: Vec::new(),
        sites,
    };
    let note = work.join("standin.note");
    std::fs::write(&note, meta.to_note())?;
    util::run(
        cmd(CROSS_OBJCOPY)
            .arg(format!("--add-section=.note.utrace={}", note.display()))
            .arg("--set-section-flags=.note.utrace=contents,readonly")
            .arg(&raw)
            .arg(&out),
    )?;
    let (ta, ts, _) = elf.symbol("thread_main")?;
    let seq = |no: u64, n: u64, every: u64| -> Vec<u64> {
        (0..n)
            .filter(|i| i % every == 0)
            .map(|i| no << 20 | i)
            .collect()
    };
    let mut expect = vec![Expect {
        who: Who::Main,
        symbol: "main",
        uprobe: false,
        values: (0..50).collect(),
        aux: None,
    }];
    for t in 1..=3u64 {
        let n = 100 * t + 7;
        expect.push(Expect {
            who: Who::Thread(t as u32),
            symbol: "work",
            uprobe: false,
            values: seq(t, n, 1),
            aux: None,
        });
        expect.push(Expect {
            who: Who::Thread(t as u32),
            symbol: "probe_target",
            uprobe: true,
            values: seq(t, n, 50),
            aux: Some((ta, ta + ts)),
        });
    }
    expect.push(Expect {
        who: Who::Thread(4),
        symbol: "work",
        uprobe: false,
        values: seq(4, 5, 1),
        aux: None,
    });
    Ok(Program {
        name: "standin".into(),
        host_path: out,
        binary: "standin".into(),
        args: vec![],
        exit_code: 3,
        expect,
    })
}

/// fixture.c built as `(name, gcc flags, rewriter flags)`.
const FIXTURES: &[(&str, &[&str], &[&str])] = &[
    ("fx-static", &["-static"], &["--buffer-records", "16"]),
    (
        "fx-static-pac",
        &["-static", "-mbranch-protection=standard"],
        &["--buffer-records", "16"],
    ),
    ("fx-static-pie", &["-static-pie", "-fPIE"], &[]),
    ("fx-pie", &["-fPIE", "-pie"], &["--buffer-records", "64"]),
    (
        "fx-static-pac-uprobe",
        &["-static", "-mbranch-protection=standard"],
        &["--force-uprobe"],
    ),
];

/// Rewritten fixtures, or none when `rewriter` cannot rewrite AArch64 (yet).
fn rewritten_fixtures(work: &Path) -> Result<Vec<Program>> {
    let rewriter = util::release_dir().join("rewriter");
    let mut out = Vec::new();
    for (name, cflags, rflags) in FIXTURES {
        let raw = work.join(format!("{name}.raw"));
        let traced = work.join(name);
        cross_gcc(&raw, &src("fixture.c"), cflags)?;
        let o = util::output(
            cmd(&rewriter)
                .arg(&raw)
                .arg("-o")
                .arg(&traced)
                .args(["--functions", "fx_*", "--functions", "main"])
                .args(*rflags),
        )?;
        print!("{}", String::from_utf8_lossy(&o.stdout));
        if !o.status.success() {
            println!(
                "arm64-vm: rewriter cannot rewrite {name} ({}), left out: {}",
                util::describe(o.status),
                String::from_utf8_lossy(&o.stderr).trim()
            );
            continue;
        }
        let elf = Elf::read(&raw)?;
        // Return addresses are link-time addresses only in a non-PIE executable.
        let range = |sym: &str| -> Result<Option<(u64, u64)>> {
            if elf.is_pic()? {
                return Ok(None);
            }
            let (a, s, _) = elf.symbol(sym)?;
            Ok(Some((a, a + s)))
        };
        let uprobe = rflags.contains(&"--force-uprobe");
        let mut expect = vec![Expect {
            who: Who::Main,
            symbol: "main",
            uprobe,
            values: vec![1], // argc
            aux: None,
        }];
        let mains: Vec<u64> = (0..13).collect();
        for (sym, caller) in [("fx_mid", "main"), ("fx_leaf", "fx_mid")] {
            expect.push(Expect {
                who: Who::Main,
                symbol: sym,
                uprobe,
                values: mains.clone(),
                aux: range(caller)?,
            });
        }
        for t in 1..=3u64 {
            let vals: Vec<u64> = (0..50 * t + 7).map(|i| t << 20 | i).collect();
            expect.push(Expect {
                who: Who::Thread(t as u32),
                symbol: "fx_worker",
                uprobe,
                values: vec![t],
                aux: None,
            });
            for (sym, caller) in [("fx_mid", "fx_worker"), ("fx_leaf", "fx_mid")] {
                expect.push(Expect {
                    who: Who::Thread(t as u32),
                    symbol: sym,
                    uprobe,
                    values: vals.clone(),
                    aux: range(caller)?,
                });
            }
        }
        if *name == "fx-static" {
            // The main thread alone, exec to exit_group (see fixture.c).
            let vals: Vec<u64> = (0..20).collect();
            let mut solo = vec![Expect {
                who: Who::Main,
                symbol: "main",
                uprobe,
                values: vec![2], // argc
                aux: None,
            }];
            for (sym, caller) in [("fx_mid", "main"), ("fx_leaf", "fx_mid")] {
                solo.push(Expect {
                    who: Who::Main,
                    symbol: sym,
                    uprobe,
                    values: vals.clone(),
                    aux: range(caller)?,
                });
            }
            out.push(Program {
                name: format!("{name}-solo"),
                host_path: traced.clone(),
                binary: name.to_string(),
                args: vec!["solo".into()],
                exit_code: 0,
                expect: solo,
            });
        }
        out.push(Program {
            name: name.to_string(),
            host_path: traced,
            binary: name.to_string(),
            args: vec![],
            exit_code: 0,
            expect,
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------
// Initramfs (cpio, newc format) and /init.

struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn new() -> Self {
        Cpio {
            out: Vec::new(),
            ino: 1,
        }
    }
    fn pad4(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.ino += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad4();
        self.out.extend_from_slice(data);
        self.pad4();
    }
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }
    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | mode, (0, 0), data);
    }
    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, (0, 0), target.as_bytes());
    }
    fn chardev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }
    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

fn init_script(programs: &[Program]) -> String {
    let mut s = String::from(
        r#"#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tracefs nodev /sys/kernel/tracing
mount -t tmpfs tmpfs /tmp
ulimit -l unlimited
# A hung test still ends the boot.
(sleep 200; echo "UTRACE-VM: TIMEOUT"; poweroff -f) &
echo "UTRACE-VM: START kernel $(uname -r) $(grep -m1 Features /proc/cpuinfo | tr -s ' \t' ' ')"
fails=0
"#,
    );
    for p in programs {
        let n = &p.name;
        let cmd = std::iter::once(format!("/progs/{}", p.binary))
            .chain(p.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        s.push_str(&format!(
            r#"echo "UTRACE-VM: RUN {n}"
/tracer record -o /tmp/{n}.utrace -- {cmd}
rc=$?
echo "UTRACE-VM: EXIT {n} $rc"
/tracer report /tmp/{n}.utrace | sed 's/^/UTRACE-REPORT {n} /'
/tracer dump /tmp/{n}.utrace | sed 's/^/UTRACE-DUMP {n} /'
if [ "$rc" = {code} ] && /tracer report /tmp/{n}.utrace | grep -q ", dropped: 0, read errors: 0"; then
    echo "UTRACE-VM: RESULT {n} ok"
else
    echo "UTRACE-VM: RESULT {n} bad"; fails=$((fails+1))
fi
"#,
            code = p.exit_code
        ));
    }
    s.push_str(
        r#"if [ $fails = 0 ]; then echo "UTRACE-VM: GUEST PASS"; else echo "UTRACE-VM: GUEST FAIL $fails"; fi
echo "UTRACE-VM: DONE"
poweroff -f
"#,
    );
    s
}

fn write_initramfs(out: &Path, busybox: &Path, tracer: &Path, programs: &[Program]) -> Result<()> {
    let mut c = Cpio::new();
    for d in ["bin", "dev", "proc", "sys", "tmp", "progs", "lib"] {
        c.dir(d);
    }
    c.chardev("dev/console", 5, 1);
    c.chardev("dev/null", 1, 3);
    c.file("bin/busybox", 0o755, &std::fs::read(busybox)?);
    c.symlink("bin/sh", "busybox");
    c.file("init", 0o755, init_script(programs).as_bytes());
    c.file("tracer", 0o755, &std::fs::read(tracer)?);
    // For dynamically linked fixtures (PT_INTERP /lib/ld-linux-aarch64.so.1).
    for lib in ["ld-linux-aarch64.so.1", "libc.so.6"] {
        let p = Path::new(CROSS_LIB).join(lib);
        if p.exists() {
            c.file(&format!("lib/{lib}"), 0o755, &std::fs::read(&p)?);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in programs {
        if seen.insert(p.binary.clone()) {
            c.file(
                &format!("progs/{}", p.binary),
                0o755,
                &std::fs::read(&p.host_path)?,
            );
        }
    }
    let bytes = c.finish();
    std::fs::write(out, &bytes)?;
    println!(
        "arm64-vm: initramfs {} ({} KiB)",
        out.display(),
        bytes.len() / 1024
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Boot and check.

/// Boot, wait for poweroff (or kill qemu after `timeout`); the console text, also
/// saved to `log`.
fn boot(kernel: &Path, initrd: &Path, cpu: &str, timeout: Duration, log: &Path) -> Result<String> {
    let mut c = cmd("qemu-system-aarch64");
    c.args(["-M", "virt", "-cpu", cpu, "-smp", "2", "-m", "1024"])
        .args(["-nic", "none", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            "console=ttyAMA0 rdinit=/init panic=-1 loglevel=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    util::announce(&c);
    let start = Instant::now();
    let mut child = c.spawn().context("cannot start qemu-system-aarch64")?;
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let out = reader.join().unwrap_or_default();
    let text = String::from_utf8_lossy(&out).replace('\r', "");
    std::fs::write(log, &text)?;
    println!(
        "arm64-vm: qemu -cpu {cpu}: {} after {:.1}s, {} console lines{}",
        util::describe(status),
        start.elapsed().as_secs_f64(),
        text.lines().count(),
        if timed_out {
            " (TIMED OUT, killed)"
        } else {
            ""
        }
    );
    if !err.trim().is_empty() {
        println!("arm64-vm: qemu stderr: {}", err.trim());
    }
    for l in text.lines().filter(|l| l.starts_with(P_VM)) {
        println!("  | {l}");
    }
    Ok(text)
}

/// One dump line: pid tid binary site symbol value aux time_ns flags.
struct DumpRec {
    tid: u32,
    symbol: String,
    value: u64,
    aux: u64,
    flags: u32,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

fn parse_dump(rest: &str) -> Option<DumpRec> {
    let f: Vec<&str> = rest.split('\t').collect();
    if f.len() != 9 {
        return None;
    }
    Some(DumpRec {
        tid: f[1].parse().ok()?,
        symbol: f[4].to_string(),
        value: hex(f[5])?,
        aux: hex(f[6])?,
        flags: f[8].parse().ok()?,
    })
}

/// Everything wrong with the console text; empty = pass.
fn check_console(text: &str, programs: &[Program]) -> Vec<String> {
    let mut errs = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    if !lines.contains(&"UTRACE-VM: DONE") {
        errs.push("no `UTRACE-VM: DONE` line: the guest did not finish".into());
    }
    if !lines.contains(&"UTRACE-VM: GUEST PASS") {
        errs.push("no `UTRACE-VM: GUEST PASS` line".into());
    }
    for p in programs {
        let e0 = errs.len();
        check_program(&lines, p, &mut errs);
        if errs.len() == e0 {
            let n: usize = p.expect.iter().map(|e| e.values.len()).sum();
            println!("arm64-vm:   {}: {n} records exactly as expected", p.name);
        }
    }
    errs
}

fn check_program(lines: &[&str], p: &Program, errs: &mut Vec<String>) {
    let name = &p.name;
    // Program output between RUN and EXIT.
    let Some(run) = lines
        .iter()
        .position(|l| *l == format!("{P_VM} RUN {name}"))
    else {
        errs.push(format!("{name}: never ran"));
        return;
    };
    let exit_prefix = format!("{P_VM} EXIT {name} ");
    let Some(exit_at) = lines[run..]
        .iter()
        .position(|l| l.starts_with(&exit_prefix))
        .map(|i| i + run)
    else {
        errs.push(format!("{name}: no EXIT line"));
        return;
    };
    let code = lines[exit_at][exit_prefix.len()..].trim();
    if code != p.exit_code.to_string() {
        errs.push(format!(
            "{name}: exit status {code}, expected {}",
            p.exit_code
        ));
    }
    if !lines.contains(&format!("{P_VM} RESULT {name} ok").as_str()) {
        errs.push(format!(
            "{name}: guest-side check failed (exit status, drops or read errors)"
        ));
    }
    let mut tids: BTreeMap<Who, u32> = BTreeMap::new();
    for l in &lines[run..exit_at] {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            [P_PROG, "thread", no, "tid", tid, ..] => {
                if let (Ok(no), Ok(tid)) = (no.parse(), tid.parse()) {
                    tids.insert(Who::Thread(no), tid);
                }
            }
            [P_PROG, "main", "tid", tid, ..] => {
                if let Ok(tid) = tid.parse() {
                    tids.insert(Who::Main, tid);
                }
            }
            _ => {}
        }
    }
    // Records from the dump.
    let prefix = format!("{P_DUMP} {name} ");
    let mut got: BTreeMap<(u32, String, bool), Vec<(u64, u64)>> = BTreeMap::new();
    let mut total = 0usize;
    for l in lines {
        if let Some(rest) = l.strip_prefix(&prefix) {
            match parse_dump(rest) {
                Some(r) => {
                    total += 1;
                    got.entry((r.tid, r.symbol, r.flags & tracer_common::FLAG_UPROBE != 0))
                        .or_default()
                        .push((r.value, r.aux));
                }
                None => errs.push(format!("{name}: unparsable dump line {l:?}")),
            }
        }
    }
    if let std::collections::btree_map::Entry::Vacant(main) = tids.entry(Who::Main) {
        // A program that prints nothing (fx-static-solo) is single-threaded: its main
        // thread's tid is its pid.
        let pids: std::collections::BTreeSet<u32> = lines
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|r| r.split('\t').next()?.parse().ok())
            .collect();
        if let [pid] = pids.into_iter().collect::<Vec<_>>()[..] {
            main.insert(pid);
        }
    }
    let mut expected_total = 0usize;
    for e in &p.expect {
        expected_total += e.values.len();
        let Some(&tid) = tids.get(&e.who) else {
            let msg = format!("{name}: the program did not print the tid of {:?}", e.who);
            if !errs.contains(&msg) {
                errs.push(msg);
            }
            continue;
        };
        let key = (tid, e.symbol.to_string(), e.uprobe);
        let recs = got.remove(&key).unwrap_or_default();
        let mut values: Vec<u64> = recs.iter().map(|r| r.0).collect();
        values.sort_unstable();
        let mut want = e.values.clone();
        want.sort_unstable();
        let mode = if e.uprobe { "uprobe" } else { "inline" };
        if values != want {
            errs.push(format!(
                "{name}: {:?} (tid {tid}) {} {mode}: {} records, expected {}{}",
                e.who,
                e.symbol,
                values.len(),
                want.len(),
                if values.len() == want.len() {
                    " (values differ)"
                } else {
                    ""
                }
            ));
        }
        if let Some((lo, hi)) = e.aux
            && let Some(bad) = recs.iter().find(|r| !(lo..hi).contains(&r.1))
        {
            errs.push(format!(
                "{name}: {:?} {} {mode}: return address {:#x} not in [{lo:#x}, {hi:#x})",
                e.who, e.symbol, bad.1
            ));
        }
    }
    for ((tid, sym, up), recs) in &got {
        errs.push(format!(
            "{name}: {} unexpected records: tid {tid} {sym} {}",
            recs.len(),
            if *up { "uprobe" } else { "inline" }
        ));
    }
    if total != expected_total {
        errs.push(format!(
            "{name}: {total} records in the dump, expected {expected_total}"
        ));
    }
}
