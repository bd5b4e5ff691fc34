//! `cargo xtask difftest [--programs N] [--seed S] [--arch A] [--lang L]`: differential
//! testing of the rewriter on random C programs (csmith) and random C++ programs that
//! throw, catch and rethrow through cleanups (`cxx.rs`). Each program is built six ways
//! (gcc and clang at -O0, -O2, -O3; link and time modes rotate with the seed),
//! rewritten with every site kind (entry, exit, block, memory, call), and must print
//! the same checksum and exit with the same code as its original: untraced, and under
//! `tracer record` (AArch64: under qemu-user with the user drain), where the session's
//! books must balance with nothing dropped and every call closed exactly once (by its
//! exit, or where an exception landed). On
//! x86-64 the entries of each of the program's functions must also equal what kernel
//! uprobes (tracefs) count on the original. A batch of programs shares one session;
//! a faulty session is re-run per program to name the one at fault.
//!
//! Every verdict is appended to `target/difftest/log.tsv` (totals accumulate across
//! runs); a difference keeps its source and binaries in `target/difftest/failures/`.

mod check;
mod cxx;
mod oracle;
mod run;
mod variant;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::util::{self, cmd};
use run::{Outcome, Script};
pub(crate) use variant::{Arch, Lang};
use variant::{Build, Variant};

/// The rewriter's site kinds, all at once.
const SITES: &str = "entry,exit,block,memory,call";
/// Originals that run longer are skipped.
const MAX_ORIGINAL_MS: u64 = 1000;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Programs per architecture (csmith seeds SEED, SEED+1, ...), six builds each.
    #[arg(long, default_value_t = 20)]
    pub programs: u64,
    /// The first csmith seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Architectures to test (default: both).
    #[arg(long, value_enum)]
    pub arch: Vec<Arch>,
    /// Programs per tracer session.
    #[arg(long, default_value_t = 4)]
    pub batch: u64,
    /// Languages to test (default: both).
    #[arg(long, value_enum)]
    pub lang: Vec<Lang>,
}

#[derive(Clone, Debug)]
enum Verdict {
    /// Same outputs; whether entry counts were checked against the kernel's.
    Same {
        counted: bool,
    },
    /// Not a test of the rewriter (the original does not build or finish).
    Skipped(String),
    Different(Vec<String>),
}

impl Verdict {
    fn tag(&self) -> &'static str {
        match self {
            Verdict::Same { .. } => "same",
            Verdict::Skipped(_) => "skipped",
            Verdict::Different(_) => "different",
        }
    }

    fn detail(&self) -> String {
        match self {
            Verdict::Same { counted: true } => "entry counts checked".into(),
            Verdict::Same { counted: false } => String::new(),
            Verdict::Skipped(why) => why.clone(),
            Verdict::Different(d) => d.join("; "),
        }
    }
}

fn log_dir() -> PathBuf {
    util::target_dir().join("difftest")
}

pub(crate) fn difftest(args: &Args) -> Result<()> {
    for tool in [
        "csmith",
        "timeout",
        "clang",
        "clang++",
        "g++",
        "aarch64-linux-gnu-gcc",
        "aarch64-linux-gnu-g++",
        "qemu-aarch64",
    ] {
        if util::which(tool).is_none() {
            bail!("{tool} is not installed (cargo xtask setup installs it)");
        }
    }
    let arches = if args.arch.is_empty() {
        vec![Arch::X86_64, Arch::Aarch64]
    } else {
        args.arch.clone()
    };
    let work = util::scratch_dir("difftest")?;
    std::fs::create_dir_all(log_dir())?;
    let mut results: Vec<(Variant, Verdict)> = Vec::new();
    let langs = if args.lang.is_empty() {
        vec![Lang::C, Lang::Cxx]
    } else {
        args.lang.clone()
    };
    let seeds: Vec<u64> = (args.seed..args.seed + args.programs).collect();
    for arch in arches {
        for &lang in &langs {
            for chunk in seeds.chunks(args.batch.max(1) as usize) {
                let dir = work.join(format!("{}-{}-{}", arch.name(), lang.name(), chunk[0]));
                std::fs::create_dir_all(&dir)?;
                println!(
                    "== difftest {} {}: programs {chunk:?}",
                    arch.name(),
                    lang.name()
                );
                for (v, verdict) in chunk_verdicts(arch, lang, chunk, &dir)? {
                    log_verdict(&v, &verdict, &dir)?;
                    results.push((v, verdict));
                }
            }
        }
    }
    summary(&results)
}

/// Generate, build and test programs `seeds` for `arch` in `dir`.
fn chunk_verdicts(
    arch: Arch,
    lang: Lang,
    seeds: &[u64],
    dir: &Path,
) -> Result<Vec<(Variant, Verdict)>> {
    let mut out = Vec::new();
    let mut built = Vec::new();
    for &seed in seeds {
        let src = match lang {
            Lang::C => generate(seed, dir)?,
            Lang::Cxx => cxx::generate(seed, dir)?,
        };
        for v in Variant::all(arch, lang, seed) {
            match v.build(&src, dir) {
                Ok(b) => built.push((v, b)),
                Err(e) => out.push((v, Verdict::Skipped(format!("does not build: {e:#}")))),
            }
        }
    }
    let verdicts = batch(arch, &built, dir, true)?;
    out.extend(built.into_iter().map(|(v, _)| v).zip(verdicts));
    Ok(out)
}

/// `csmith --seed SEED` into `dir/sSEED.c`.
fn generate(seed: u64, dir: &Path) -> Result<PathBuf> {
    let src = dir.join(format!("s{seed}.c"));
    // csmith leaves platform.info in its working directory.
    util::output_ok(
        cmd("csmith")
            .current_dir(dir)
            .arg("--seed")
            .arg(seed.to_string())
            .arg("-o")
            .arg(&src),
    )?;
    Ok(src)
}

/// Entry counts per (binary, function) from kernel uprobes on the originals.
type KernelCounts = std::collections::HashMap<(PathBuf, String), u64>;

/// The verdict on each build: originals (under the kernel oracle on x86-64), then
/// rewritten untraced, then rewritten under one `tracer record` session. `attribute`:
/// a faulty session is re-run per build.
fn batch(
    arch: Arch,
    builds: &[(Variant, Build)],
    dir: &Path,
    attribute: bool,
) -> Result<Vec<Verdict>> {
    let (expected, counts) = originals(arch, builds, dir)?;
    let (mut verdicts, live) = rewrite_all(builds, &expected);
    let traced: Vec<PathBuf> = live.iter().map(|(_, t)| t.traced.clone()).collect();
    let every: Vec<(usize, PathBuf)> = live
        .iter()
        .filter_map(|(i, t)| Some((*i, t.every.clone()?)))
        .collect();
    let live: Vec<(usize, PathBuf)> = live.into_iter().map(|(i, t)| (i, t.traced)).collect();
    let mut diffs: Vec<Vec<String>> = vec![Vec::new(); builds.len()];
    let untraced: Vec<PathBuf> = traced
        .iter()
        .chain(every.iter().map(|(_, p)| p))
        .cloned()
        .collect();
    let rw = Script::new(dir, "rw", arch.runner(), &untraced, 60)?;
    run_script(&rw)?;
    let mut got = rw.outcomes();
    let got_every = got.split_off(traced.len());
    compare(&live, &expected, &got, "untraced", &mut diffs);
    compare(
        &every,
        &expected,
        &got_every,
        "untraced, every function",
        &mut diffs,
    );
    let session = Script::new(dir, "traced", arch.runner(), &traced, 120)?;
    let report = record(arch, &session, dir)?;
    compare(&live, &expected, &session.outcomes(), "traced", &mut diffs);
    let faults = check::session_faults(&report);
    if !faults.is_empty() && attribute && live.len() > 1 {
        // Which build is at fault: each alone in a session of its own.
        for &(i, _) in &live {
            let sub = dir.join(builds[i].0.name() + ".alone");
            std::fs::create_dir_all(&sub)?;
            let one = [(builds[i].0.clone(), copy_build(&builds[i].1, &sub)?)];
            verdicts[i] = batch(arch, &one, &sub, false)?.pop();
        }
    } else {
        let ours = check::entries(&report)?;
        for &(i, ref t) in &live {
            let name = t
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let mine = ours.get(&name).cloned().unwrap_or_default();
            diffs[i].extend(faults.iter().cloned());
            diffs[i].extend(entry_diffs(&builds[i].1, counts.as_ref(), &mine));
        }
    }
    Ok(verdicts
        .into_iter()
        .zip(diffs)
        .map(|(v, d)| match v {
            Some(v) => v,
            None if d.is_empty() => Verdict::Same {
                counted: counts.is_some(),
            },
            None => Verdict::Different(d),
        })
        .collect())
}

/// The originals run from one script, under kernel uprobes on x86-64: their outcomes
/// and (when the oracle ran) entry counts.
fn originals(
    arch: Arch,
    builds: &[(Variant, Build)],
    dir: &Path,
) -> Result<(Vec<Option<Outcome>>, Option<KernelCounts>)> {
    let exes: Vec<PathBuf> = builds.iter().map(|(_, b)| b.exe.clone()).collect();
    let orig = Script::new(dir, "orig", arch.runner(), &exes, 2)?;
    let counts = if arch == Arch::X86_64 {
        let mut probes = Vec::new();
        for (_, b) in builds {
            for (function, offset) in variant::function_offsets(&b.exe, &b.functions)? {
                probes.push(oracle::Probe {
                    binary: b.exe.clone(),
                    function,
                    offset,
                });
            }
        }
        oracle::count_entries(&probes, || run_script(&orig))?
    } else {
        run_script(&orig)?;
        None
    };
    Ok((orig.outcomes(), counts))
}

/// Each build rewritten when its original ran well: a verdict already (skipped, or a
/// rewriter failure) or its rewritten files, by index.
fn rewrite_all(
    builds: &[(Variant, Build)],
    expected: &[Option<Outcome>],
) -> (Vec<Option<Verdict>>, Vec<(usize, Rewritten)>) {
    let mut verdicts: Vec<Option<Verdict>> = vec![None; builds.len()];
    let mut live = Vec::new();
    for (i, (v, b)) in builds.iter().enumerate() {
        verdicts[i] = match &expected[i] {
            // The rewritten program runs ten times slower or more (every site kind,
            // qemu): a longer original would only test the time limits.
            Some(o) if o.code == 0 && o.millis > MAX_ORIGINAL_MS => Some(Verdict::Skipped(
                format!("the original runs {} ms", o.millis),
            )),
            Some(o) if o.code == 0 => match rewrites(v, b) {
                Ok(t) => {
                    live.push((i, t));
                    None
                }
                Err(e) => Some(Verdict::Different(vec![format!("{e:#}")])),
            },
            Some(o) => Some(Verdict::Skipped(format!("the original: {}", o.describe()))),
            None => Some(Verdict::Skipped("the original did not run".into())),
        };
    }
    (verdicts, live)
}

/// A build's recorded entries against the kernel's counts, or without them (AArch64)
/// against one entry of `main`.
fn entry_diffs(
    b: &Build,
    kernel: Option<&KernelCounts>,
    mine: &std::collections::HashMap<String, u64>,
) -> Vec<String> {
    match kernel {
        Some(kernel) => count_diffs(b, kernel, mine),
        None if mine.get("main") != Some(&1) => vec![format!(
            "main: {} entries recorded (1 expected)",
            mine.get("main").copied().unwrap_or(0)
        )],
        None => Vec::new(),
    }
}

/// The build's files in `dir` (a re-run must not overwrite the batch's outcomes).
fn copy_build(b: &Build, dir: &Path) -> Result<Build> {
    let exe = dir.join(b.exe.file_name().context("a build has a file name")?);
    std::fs::copy(&b.exe, &exe)?;
    Ok(Build {
        exe,
        functions: b.functions.clone(),
    })
}

/// Entries recorded per program function against the kernel's count on the original.
/// Names of one address (C++ constructors' `C1`/`C2`, destructors' `D1`/`D2`) are one
/// function: the trace names it once, the kernel counts it under each.
fn count_diffs(
    b: &Build,
    kernel: &std::collections::HashMap<(PathBuf, String), u64>,
    mine: &std::collections::HashMap<String, u64>,
) -> Vec<String> {
    let mut at: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (f, off) in variant::function_offsets(&b.exe, &b.functions).unwrap_or_default() {
        at.entry(off).or_default().push(f);
    }
    let mut d = Vec::new();
    for names in at.values() {
        let Some(&k) = kernel.get(&(b.exe.clone(), names[0].clone())) else {
            continue;
        };
        let m: u64 = names.iter().filter_map(|f| mine.get(f)).sum();
        if m != k {
            d.push(format!(
                "{}: {m} entries recorded, the kernel saw {k}",
                names.join(" = ")
            ));
        }
    }
    d
}

fn compare(
    live: &[(usize, PathBuf)],
    expected: &[Option<Outcome>],
    got: &[Option<Outcome>],
    stage: &str,
    diffs: &mut [Vec<String>],
) {
    for ((i, _), got) in live.iter().zip(got) {
        let want = expected[*i].as_ref();
        match got {
            Some(g) if want.is_some_and(|w| w.same(g)) => {}
            Some(g) => diffs[*i].push(format!(
                "{stage}: {} (the original: {})",
                g.describe(),
                want.map_or(String::new(), Outcome::describe)
            )),
            None => diffs[*i].push(format!("{stage}: did not run")),
        }
    }
}

/// A build rewritten with every site kind: what runs under the tracer, and for a
/// static executable also every function of it (libc too) run untraced.
struct Rewritten {
    traced: PathBuf,
    every: Option<PathBuf>,
}

/// Rewrite a build: `exe.t` (a static one: only the program's functions, as libc's
/// thousands of uprobe sites would take minutes to attach), `exe.all.t` for a static
/// one.
fn rewrites(v: &Variant, b: &Build) -> Result<Rewritten> {
    let traced = b.exe.with_extension("t");
    if !v.link.starts_with("static") {
        rewrite(v, &b.exe, &traced, &[])?;
        return Ok(Rewritten {
            traced,
            every: None,
        });
    }
    rewrite(v, &b.exe, &traced, &b.functions)?;
    let every = b.exe.with_extension("all.t");
    rewrite(v, &b.exe, &every, &[])?;
    Ok(Rewritten {
        traced,
        every: Some(every),
    })
}

/// Rewrite `exe` with every site kind into `out` (`functions`: only those).
fn rewrite(v: &Variant, exe: &Path, out: &Path, functions: &[String]) -> Result<()> {
    let mut c = cmd(util::release_dir().join("rewriter"));
    c.arg(exe)
        .arg("-o")
        .arg(out)
        .args(["--sites", SITES, "--time", v.time]);
    for f in functions {
        c.arg("--functions").arg(f);
    }
    let o = util::output(&mut c)?;
    if !o.status.success() {
        bail!(
            "the rewriter failed ({}): {}",
            util::describe(o.status),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

fn run_script(s: &Script) -> Result<()> {
    let argv = s.argv();
    util::output_ok(cmd(&argv[0]).args(&argv[1..]))?;
    Ok(())
}

/// Run `session` under `tracer record`; its `report --json`.
fn record(arch: Arch, session: &Script, dir: &Path) -> Result<serde_json::Value> {
    let tracer = util::release_dir().join("tracer");
    let trace = dir.join("traced.utrace");
    let mut c = cmd(&tracer);
    c.arg("record").arg("-o").arg(&trace);
    if arch == Arch::Aarch64 {
        c.arg("--user");
    }
    c.arg("--").args(session.argv());
    util::output_ok(&mut c)?;
    let json = util::output_ok(cmd(&tracer).arg("report").arg("--json").arg(&trace))?;
    serde_json::from_str(&json).context("tracer report --json printed no JSON")
}

/// Log a verdict; keep a difference's files.
fn log_verdict(v: &Variant, verdict: &Verdict, dir: &Path) -> Result<()> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir().join("log.tsv"))?;
    writeln!(
        log,
        "{}\t{}\t{}\t{}",
        v.name(),
        v.arch.name(),
        verdict.tag(),
        verdict.detail()
    )?;
    if let Verdict::Different(d) = verdict {
        println!("   DIFFERENT {}: {}", v.name(), d.join("; "));
        let keep = log_dir().join("failures").join(v.name());
        std::fs::create_dir_all(&keep)?;
        let exe = dir.join(v.name());
        for f in [
            dir.join(v.lang.source(v.seed)),
            exe.clone(),
            exe.with_extension("t"),
        ] {
            if let Some(name) = f.file_name() {
                let _ = std::fs::copy(&f, keep.join(name));
            }
        }
        std::fs::write(keep.join("differences.txt"), d.join("\n") + "\n")?;
    }
    Ok(())
}

/// This run's verdicts per architecture, then the log's totals; an error if anything
/// differed.
fn summary(results: &[(Variant, Verdict)]) -> Result<()> {
    let mut now: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    for (v, verdict) in results {
        let e = now.entry(v.arch.name()).or_default();
        match verdict {
            Verdict::Same { counted } => {
                e[0] += 1;
                e[1] += usize::from(*counted);
            }
            Verdict::Skipped(_) => e[2] += 1,
            Verdict::Different(_) => e[3] += 1,
        }
    }
    println!("== difftest: this run");
    println!(
        "   {:<8} {:>6} {:>14} {:>8} {:>10}",
        "arch", "same", "counts checked", "skipped", "different"
    );
    for (a, [s, c, k, d]) in &now {
        println!("   {a:<8} {s:>6} {c:>14} {k:>8} {d:>10}");
    }
    totals()?;
    let bad: Vec<String> = results
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Different(_)))
        .map(|(v, _)| v.name())
        .collect();
    if !bad.is_empty() {
        bail!(
            "{} builds behaved differently once rewritten: {} (kept under {})",
            bad.len(),
            bad.join(", "),
            log_dir().join("failures").display()
        );
    }
    Ok(())
}

/// Distinct builds ever tested, by their latest verdict, per architecture.
fn totals() -> Result<()> {
    let text = std::fs::read_to_string(log_dir().join("log.tsv")).unwrap_or_default();
    let mut latest: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for l in text.lines() {
        if let [name, arch, tag, ..] = l.split('\t').collect::<Vec<_>>()[..] {
            latest.insert((arch, name), tag);
        }
    }
    let mut per: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for ((arch, _), tag) in latest {
        *per.entry((arch, tag)).or_default() += 1;
    }
    println!(
        "== difftest totals (distinct builds in {})",
        log_dir().join("log.tsv").display()
    );
    for ((arch, tag), n) in per {
        println!("   {arch:<8} {tag:<10} {n:>6}");
    }
    Ok(())
}
