//! AArch64 under qemu-user: the fixtures of matrix.rs, shared_lib.rs and stress.rs built
//! with aarch64-linux-gnu-gcc and clang --target=aarch64-linux-gnu × {PIE, -no-pie,
//! -static, -static-pie, -mbranch-protection=standard} × {-O0, -O2}, rewritten with
//! 1024-record buffers, and traced with the user-space drain:
//! `tracer record --user --binary PROG.traced -- qemu-aarch64 -L SYSROOT PROG.traced`
//! (binfmt is off, so qemu is named; qemu itself is not instrumented). Full buffers go
//! over the socket from the injected AArch64 code; what is left at a thread's exit is
//! read by the tracer with ptrace. Checked from `tracer dump`: identical stdout and exit
//! code, and per thread exactly the expected entries with their first argument (x0) and
//! a return address (x30) inside the program.
//!
//! The relocation and signal cases still read the buffers back in-process
//! (fixtures/inspect.c dumps them at exit, the binaries get a buffer larger than the
//! run): they test the stub and the relocated instructions, not the drain.
//!
//! Skipped (with a message) when qemu-aarch64 or the cross compiler is missing.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::fixture_oracle::app_so;
use tests::fixture_oracle::matrix::{
    FOLLOWED, expected_main_thread, expected_output, expected_worker_thread,
};
use tests::*;

const SYSROOT: &str = "/usr/aarch64-linux-gnu";
const GCC: &str = "aarch64-linux-gnu-gcc";
/// For the inspect.c cases: large enough for every record of a fixture run, so nothing
/// is flushed (and discarded).
const BUF_RECORDS: &str = "65536";

/// (compiler, its target flags), or None when the toolchain or qemu is missing and
/// the run allows that (`tests::skip`; otherwise the test fails).
fn toolchain(cc: &str, dir: &Path, flags: &[&str]) -> Option<Vec<String>> {
    if !have_qemu_aarch64(&format!("AArch64 {cc} {}", flags.join(" "))) {
        return None;
    }
    let mut f: Vec<String> = match cc {
        "clang" => vec!["--target=aarch64-linux-gnu".into()],
        _ => vec![],
    };
    f.extend(flags.iter().map(|s| s.to_string()));
    let probe: Vec<&str> = f.iter().map(String::as_str).collect();
    let what = format!("{cc} {} linking an AArch64 program", probe.join(" "));
    if !tests::skip::require(cc, can_link(cc, &probe, dir), &what) {
        return None;
    }
    Some(f)
}

fn qemu(prog: &Path, env: &[(&str, &OsStr)]) -> Out {
    qemu_args(prog, &[], env)
}

fn qemu_args(prog: &Path, args: &[&str], env: &[(&str, &OsStr)]) -> Out {
    let mut c = Command::new("qemu-aarch64");
    c.arg("-L").arg(SYSROOT).arg(prog).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c, RUN_TIMEOUT)
}

/// `tracer record --user --binary B... -o TRACE -- qemu-aarch64 -L SYSROOT PROG ARGS`;
/// the tracer's output (the command's stdout and status) and the records.
fn trace_qemu(
    trace: &Path,
    binaries: &[&Path],
    prog: &Path,
    args: &[&str],
    env: &[(&str, &OsStr)],
) -> (Out, Vec<Rec>) {
    let mut flags: Vec<&str> = vec!["--user"];
    for b in binaries {
        flags.push("--binary");
        flags.push(b.to_str().expect("UTF-8 temp path"));
    }
    let mut qargs: Vec<&str> = vec!["-L", SYSROOT, prog.to_str().expect("UTF-8 temp path")];
    qargs.extend(args);
    let out = tracer_record_with(&flags, trace, Path::new("qemu-aarch64"), &qargs, env);
    let recs = dump(trace);
    let rep = report(trace);
    assert_eq!(rep.dropped, 0, "dropped records: {}", out.describe());
    check_report_matches_dump(&rep, &recs);
    // The user-space drain counts what it takes out of buffers: all delivered.
    let books = &rep.raw["books"];
    // (Records as the drains moved them: a memory pair is one, two dump lines.)
    assert_eq!(books["produced"], rep.records, "{books}");
    assert_eq!(books["balanced"], true, "{books}");
    (out, recs)
}

/// Rewrite with 1024-record buffers (a quarter of the default: runs flush many times).
fn rewrite_a64_default(
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> (SiteCounts, tracer_common::meta::Metadata) {
    let mut e = vec!["--buffer-records", "1024"];
    e.extend(extra);
    rewrite_a64_with(input, output, &e)
}

/// Rewrite (with the large inspect.c buffer unless `extra` sets one); the rewriter's
/// counts and the metadata.
fn rewrite_a64_with(
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> (SiteCounts, tracer_common::meta::Metadata) {
    let mut args: Vec<&OsStr> = vec![input.as_os_str(), "-o".as_ref(), output.as_os_str()];
    if !extra.contains(&"--buffer-records") {
        args.extend([OsStr::new("--buffer-records"), OsStr::new(BUF_RECORDS)]);
    }
    args.push("-v".as_ref());
    args.extend(extra.iter().map(OsStr::new));
    let out = rewriter(&args).ok();
    let counts = parse_site_counts(&out.stdout_str())
        .unwrap_or_else(|| panic!("no site-count line: {}", out.describe()));
    let meta = metadata(output);
    assert_eq!(meta.arch, tracer_common::ARCH_AARCH64, "metadata arch");
    assert_eq!(meta.sites.len() as u64, counts.total);
    (counts, meta)
}

/// One record of the inspect dump (object slot tid site value aux; only what the
/// remaining inspect.c cases check).
#[derive(Debug, Clone)]
struct Dumped {
    site: u32,
    value: u64,
}

fn read_dump(path: &Path) -> Vec<Dumped> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 6, "bad dump line {l:?}");
            Dumped {
                site: f[3].parse().unwrap(),
                value: f[4].parse().unwrap(),
            }
        })
        .collect()
}

// ---- matrix.c (the sequences: tests::fixture_oracle::matrix)

fn site_names(meta: &tracer_common::meta::Metadata) -> HashMap<u32, String> {
    meta.sites.iter().map(|s| (s.id, s.name.clone())).collect()
}

/// Load range of an ELF file's PT_LOADs (link-time addresses).
fn text_range(path: &Path) -> (u64, u64) {
    use object::{Object, ObjectSegment};
    let data = std::fs::read(path).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let lo = f.segments().map(|s| s.address()).min().unwrap_or(0);
    let hi = f
        .segments()
        .map(|s| s.address() + s.size())
        .max()
        .unwrap_or(0);
    (lo, hi)
}

/// One thread's followed (function, x0) sequence and its records.
type ThreadSeq<'a> = (u32, Vec<(String, u64)>, Vec<&'a Rec>);

/// The followed (function, x0) sequence of each thread that has one, in order of first
/// appearance, and the records themselves.
fn followed_by_thread<'a>(recs: &'a [Rec], followed: &[&str]) -> Vec<ThreadSeq<'a>> {
    let mine = recs.iter().filter(|r| followed.contains(&&*r.symbol));
    by_tid(mine)
        .into_iter()
        .map(|(tid, rs)| {
            let seq = rs.iter().map(|r| (r.symbol.to_string(), r.value)).collect();
            (tid, seq, rs)
        })
        .collect()
}

fn matrix_case(cc: &str, variant: &str, flags: &[&str]) {
    let tmp = TempDir::new(&format!("a64-{cc}-{variant}"));
    let Some(target_flags) = toolchain(cc, tmp.path(), flags) else {
        return;
    };
    let (want_stdout, want_code) = expected_output();
    for opt in ["-O0", "-O2"] {
        let what = format!("{cc} {variant} {opt}");
        let orig = tmp.join(format!("matrix{opt}"));
        let traced = tmp.join(format!("matrix{opt}.traced"));
        let mut all: Vec<&str> = target_flags.iter().map(String::as_str).collect();
        all.extend([opt, "-pthread"]);
        compile(cc, &[fixture("matrix.c")], &all, &orig);
        let (counts, meta) = rewrite_a64_default(&orig, &traced, &[]);
        for f in FOLLOWED {
            let s = meta.sites.iter().find(|s| s.name == f);
            assert!(
                s.is_some_and(|s| s.mode == tracer_common::meta::SiteMode::Inline),
                "{what}: {f} is not an inline site ({counts:?})"
            );
        }

        let o = qemu(&orig, &[]);
        assert_eq!(
            (o.stdout_str(), o.status()),
            (want_stdout.clone(), want_code),
            "{what}: original: {}",
            o.describe()
        );
        let t = qemu(&traced, &[]);
        assert_same_output(
            &t,
            &o,
            &format!("{what}: rewritten differs from the original"),
        );
        let trace = tmp.join(format!("matrix{opt}.utrace"));
        let (r, recs) = trace_qemu(&trace, &[&traced], &traced, &[], &[]);
        assert_same_output(&r, &o, &format!("{what}: under tracer record --user"));
        check_sites_valid(&recs, &[&meta]);

        let threads = followed_by_thread(&recs, &FOLLOWED);
        assert_eq!(threads.len(), 2, "{what}: threads with followed records");
        let main = threads
            .iter()
            .find(|(_, v, _)| v.first().is_some_and(|e| e.0 == "main"))
            .unwrap_or_else(|| panic!("{what}: no thread starts with main"));
        let worker = threads
            .iter()
            .find(|(t, _, _)| *t != main.0)
            .expect("worker thread");
        assert_eq!(
            main.2[0].tid, main.2[0].pid,
            "{what}: main runs in the main thread"
        );
        assert_seq_eq(
            &main.1,
            &expected_main_thread(),
            &format!("{what}: main thread"),
        );
        assert_seq_eq(
            &worker.1,
            &expected_worker_thread(),
            &format!("{what}: worker thread"),
        );
        // Return addresses: non-zero, and inside the program's link-time image when it
        // is not position independent.
        // (Only followed functions: `_start` is entered from the kernel with x30 = 0.)
        let (lo, hi) = text_range(&orig);
        for r in threads.iter().flat_map(|t| &t.2) {
            let n = &*r.symbol;
            assert!(r.aux != 0, "{what}: {n} without return address: {r:?}");
            // No pointer-authentication code (BTI+PAC builds sign x30 before the site).
            assert!(
                r.aux < 1 << 48,
                "{what}: {n}: return address {:#x} still signed",
                r.aux
            );
            let in_libc = n == "main" || n == "fx_worker"; // called from libc
            if !matches!(variant, "pie" | "bti" | "static-pie") && !in_libc {
                assert!(
                    (lo..hi).contains(&r.aux),
                    "{what}: {n} returns to {:#x}, outside {lo:#x}..{hi:#x}",
                    r.aux
                );
            }
        }
        eprintln!(
            "{what}: {} records under qemu, main {} / worker {} followed",
            recs.len(),
            main.1.len(),
            worker.1.len()
        );
    }
}

macro_rules! matrix {
    ($name:ident, $cc:expr, $variant:expr, [$($flag:expr),*]) => {
        #[test]
        fn $name() {
            matrix_case($cc, $variant, &[$($flag),*]);
        }
    };
}

matrix!(gcc_pie, GCC, "pie", []);
matrix!(gcc_no_pie, GCC, "no-pie", ["-no-pie"]);
matrix!(gcc_static, GCC, "static", ["-static"]);
matrix!(gcc_static_pie, GCC, "static-pie", ["-static-pie"]);
matrix!(gcc_bti_pac, GCC, "bti", ["-mbranch-protection=standard"]);
matrix!(clang_pie, "clang", "pie", []);
matrix!(clang_no_pie, "clang", "no-pie", ["-no-pie"]);
matrix!(clang_static, "clang", "static", ["-static"]);
matrix!(clang_static_pie, "clang", "static-pie", ["-static-pie"]);
matrix!(
    clang_bti_pac,
    "clang",
    "bti",
    ["-mbranch-protection=standard"]
);

// ---- shared library (see shared_lib.rs)

fn shlib_case(cc: &str) {
    let tmp = TempDir::new(&format!("a64-shlib-{cc}"));
    let Some(target_flags) = toolchain(cc, tmp.path(), &[]) else {
        return;
    };
    let tf: Vec<&str> = target_flags.iter().map(String::as_str).collect();
    for opt in ["-O0", "-O2"] {
        let what = format!("{cc} shared library {opt}");
        let (od, td) = (
            tmp.join(format!("orig{opt}")),
            tmp.join(format!("traced{opt}")),
        );
        std::fs::create_dir_all(&od).unwrap();
        std::fs::create_dir_all(&td).unwrap();
        let mut f = tf.clone();
        f.push(opt);
        let (lib, app) = app_so::build(cc, &f, &od);
        let (tlib, tapp) = (td.join("libfx.so"), td.join("app"));
        let (_, lib_meta) = rewrite_a64_default(&lib, &tlib, &[]);
        let (_, app_meta) = rewrite_a64_default(&app, &tapp, &[]);

        let run_in = |dir: &Path| {
            let mut c = Command::new("qemu-aarch64");
            c.arg("-L")
                .arg(SYSROOT)
                .arg(dir.join("app"))
                .env("LD_LIBRARY_PATH", dir);
            run(&mut c, RUN_TIMEOUT)
        };
        let o = run_in(&od);
        assert!(
            o.stdout_str().starts_with("app_so r="),
            "{what}: {}",
            o.describe()
        );
        let trace = tmp.join(format!("shlib{opt}.utrace"));
        let (t, recs) = trace_qemu(
            &trace,
            &[&tapp, &tlib],
            &tapp,
            &[],
            &[("LD_LIBRARY_PATH", td.as_os_str())],
        );
        assert_same_output(
            &t,
            &o,
            &format!("{what}: rewritten under the tracer differs"),
        );
        check_sites_valid(&recs, &[&app_meta, &lib_meta]);
        let threads = followed_by_thread(&recs, &["main", "fx_app", "fxlib_square", "fxlib_sum"]);
        assert_eq!(threads.len(), 1, "{what}: one thread");
        // Records of the two objects live in two RW areas, delivered buffer by buffer:
        // compare each object's part of the expected sequence.
        let (app_part, lib_part): (Vec<_>, Vec<_>) = app_so::expected()
            .into_iter()
            .partition(|(n, _)| n == "main" || n == "fx_app");
        let rs = &threads[0].2;
        let of = |bin: &str| -> Vec<(String, u64)> {
            rs.iter()
                .filter(|r| r.binary.ends_with(bin))
                .map(|r| (r.symbol.to_string(), r.value))
                .collect()
        };
        assert_seq_eq(&of("app"), &app_part, &format!("{what}: app records"));
        assert_seq_eq(
            &of("libfx.so"),
            &lib_part,
            &format!("{what}: libfx records"),
        );
    }
}

#[test]
fn gcc_shared_lib() {
    shlib_case(GCC);
}

#[test]
fn clang_shared_lib() {
    shlib_case("clang");
}

/// A machine the rewriter does not support is still refused (bad_input.rs covers the
/// message); AArch64 itself is accepted and its metadata says so.
#[test]
fn aarch64_accepted() {
    let tmp = TempDir::new("a64-accepted");
    if toolchain(GCC, tmp.path(), &[]).is_none() {
        return;
    }
    let p = tmp.join("tiny");
    compile(GCC, &[fixture("tiny.c")], &["-O2"], &p);
    let (_, counts, meta) = rewrite(&p, None, &[]);
    assert!(counts.inline >= 1, "{counts:?}");
    assert_eq!(meta.arch, tracer_common::ARCH_AARCH64);
}

/// reloc_a64.S: a function per relocated class (its first instruction, or the one after
/// a landing pad, is ADR / ADRP / LDR / LDRSW / PRFM literal / B / BL / B.cond / CBZ /
/// CBNZ / TBZ / TBNZ), run from the trampolines under qemu: same results as the
/// original, one record per call. r_excl starts with LDXR…STXR: its entry runs inline
/// after the sequence. r_loop (displaced instruction is a branch target) must be a
/// uprobe site with that reason.
#[test]
fn relocation_classes_run() {
    let tmp = TempDir::new("a64-reloc");
    let Some(_) = toolchain(GCC, tmp.path(), &[]) else {
        return;
    };
    for pie in ["-pie", "-no-pie"] {
        let what = format!("reloc_a64 {pie}");
        let (orig, traced) = (tmp.join(format!("rl{pie}")), tmp.join(format!("rl{pie}.t")));
        compile(
            GCC,
            &[
                fixture("reloc_a64.c"),
                fixture("reloc_a64.S"),
                fixture("inspect.c"),
            ],
            &["-O2", pie],
            &orig,
        );
        let out = rewriter(&[
            orig.as_os_str(),
            "-o".as_ref(),
            traced.as_os_str(),
            "--buffer-records".as_ref(),
            BUF_RECORDS.as_ref(),
            "-v".as_ref(),
        ])
        .ok();
        let text = out.stdout_str() + &out.stderr_str();
        assert!(
            text.lines()
                .any(|l| l.contains("uprobe site r_loop (entry at") && l.contains("branch target")),
            "{what}: {text}"
        );
        let meta = metadata(&traced);
        for s in &meta.sites {
            if s.name.starts_with("r_") || s.name.starts_with("t_") {
                let want = if s.name == "r_loop" {
                    tracer_common::meta::SiteMode::Uprobe
                } else {
                    tracer_common::meta::SiteMode::Inline
                };
                assert_eq!(s.mode, want, "{what}: {}", s.name);
            }
        }
        let d = tmp.join(format!("rl{pie}.dump"));
        let o = qemu(&orig, &[]);
        let t = qemu(&traced, &[("UTRACE_INSPECT", d.as_os_str())]);
        assert!(
            o.stdout_str().contains("bl 0x33\n"),
            "{what}: {}",
            o.describe()
        );
        assert_same_output(&t, &o, &format!("{what}: rewritten differs"));
        let names = site_names(&meta);
        let recs = read_dump(&d);
        let count = |n: &str| recs.iter().filter(|r| names[&r.site] == n).count();
        for (n, calls) in [
            ("r_adr", 1),
            ("r_adrp", 1),
            ("r_ldr", 1),
            ("r_ldrw", 1),
            ("r_ldrsw", 1),
            ("r_prfm", 1),
            ("r_b", 1),
            ("r_bl", 1),
            ("t_bl", 1),
            ("r_bcond", 2),
            ("t_bcond", 2),
            ("r_cbz", 2),
            ("r_cbnzw", 2),
            ("r_tbz", 2),
            ("r_tbnz", 2),
            ("r_bti_adr", 1),
            ("r_pac", 1),
            ("r_excl", 1),
            ("r_loop", 0),
        ] {
            assert_eq!(count(n), calls, "{what}: records of {n}");
        }
    }
}

/// SIGALRM every 20 µs while the main loop records: the handler's records interrupt
/// stubs mid-reservation (the exclusive pair retries). Exactly N loop records in order,
/// exactly H handler records with distinct tags, nothing torn.
#[test]
fn signals_under_qemu() {
    const N: u64 = 20_000;
    const TAG: u64 = 0x51_0000_0000;
    let tmp = TempDir::new("a64-signals");
    let Some(_) = toolchain(GCC, tmp.path(), &[]) else {
        return;
    };
    let (orig, traced) = (tmp.join("signal"), tmp.join("signal.t"));
    compile(
        GCC,
        &[fixture("signal.c"), fixture("inspect.c")],
        &["-O2"],
        &orig,
    );
    let (_, meta) = rewrite_a64_with(
        &orig,
        &traced,
        &[
            "--functions",
            "fx_*",
            "--buffer-records",
            "1048576",
            "--slots",
            "8",
        ],
    );
    let names = site_names(&meta);
    let d = tmp.join("signal.dump");
    let n = N.to_string();
    let o = qemu_args(&orig, &[&n], &[]);
    let t = qemu_args(&traced, &[&n], &[("UTRACE_INSPECT", d.as_os_str())]);
    assert_same_output(&t, &o, "rewritten differs");
    let h: u64 = t
        .stderr_str()
        .lines()
        .find_map(|l| l.strip_prefix("handler_calls="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no handler_calls: {}", t.describe()));
    let recs = read_dump(&d);
    let loop_vals: Vec<u64> = recs
        .iter()
        .filter(|r| names.get(&r.site).is_some_and(|n| n == "fx_in_loop"))
        .map(|r| r.value)
        .collect();
    assert_seq_eq(&loop_vals, &(0..N).collect::<Vec<_>>(), "fx_in_loop values");
    let mut hv: Vec<u64> = recs
        .iter()
        .filter(|r| names.get(&r.site).is_some_and(|n| n == "fx_in_handler"))
        .map(|r| r.value)
        .collect();
    assert_eq!(hv.len() as u64, h, "handler records vs handler calls");
    hv.sort_unstable();
    assert_eq!(
        hv,
        (0..h).map(|k| TAG | k).collect::<Vec<_>>(),
        "handler values"
    );
    assert_eq!(recs.len() as u64, N + h, "records of other sites");
    eprintln!("signals under qemu: {N} loop records, {h} handler records");
}

// ---- stress.c (see stress.rs) under the tracer

/// stress.c built with gcc -O2 -pthread, only `hit` instrumented, 1024-record buffers.
/// It has no TLS of its own: with a power-of-two slot count its stubs read the thread
/// word at `tpidr_el0 + 16` (a `PT_TLS` of 8 bytes added), else the index.
fn stress_build(tag: &str, slots: &str) -> Option<(TempDir, PathBuf, PathBuf)> {
    let tmp = TempDir::new(tag);
    toolchain(GCC, tmp.path(), &[])?;
    let (orig, traced) = (tmp.join("stress"), tmp.join("stress.traced"));
    compile(GCC, &[fixture("stress.c")], &["-O2", "-pthread"], &orig);
    rewrite_a64_default(&orig, &traced, &["--functions", "hit", "--slots", slots]);
    let word = slots.parse::<u32>().is_ok_and(u32::is_power_of_two);
    let readelf = run(
        Command::new("aarch64-linux-gnu-readelf")
            .arg("-lW")
            .arg(&traced),
        TRACE_TIMEOUT,
    );
    let tls: Vec<String> = readelf
        .stdout_str()
        .lines()
        .filter(|l| l.trim_start().starts_with("TLS "))
        .map(|l| l.split_whitespace().skip(4).collect::<Vec<_>>().join(" "))
        .collect();
    let dis = run(
        Command::new("aarch64-linux-gnu-objdump")
            .arg("-d")
            .arg(&traced),
        TRACE_TIMEOUT,
    );
    let loads = dis
        .stdout_str()
        .lines()
        .filter(|l| l.contains("ldr\tw11, [x10, #16]"))
        .count();
    if word {
        assert_eq!(tls, ["0x000000 0x000008 R 0x8"], "the added TLS header");
        assert!(loads >= 1, "no stub reads the thread word");
    } else {
        assert!(tls.is_empty(), "TLS headers: {tls:?}");
        assert_eq!(loads, 0, "stubs reading a thread word");
    }
    Some((tmp, orig, traced))
}

/// Runs the original under qemu and the rewritten one under the tracer with `args`
/// (no `--binary`: the tracer finds the guest program among qemu's mappings); both
/// must print `want` and exit 0. The records of `hit`, by thread.
fn stress_run(tmp: &TempDir, orig: &Path, traced: &Path, args: &[&str], want: &str) -> Vec<Rec> {
    let o = qemu_args(orig, args, &[]);
    assert_eq!(
        (o.stdout_str().as_str(), o.status()),
        (want, 0),
        "original: {}",
        o.describe()
    );
    let trace = tmp.join(format!("{}.utrace", args[0]));
    let (t, recs) = trace_qemu(&trace, &[], traced, args, &[]);
    assert_eq!(
        (t.stdout_str().as_str(), t.status()),
        (want, 0),
        "under tracer record --user: {}",
        t.describe()
    );
    recs.into_iter().filter(|r| &*r.symbol == "hit").collect()
}

/// One thread × 200,000 calls: exactly 200,000 records, values in order (195 full
/// buffers sent by the injected code, the rest collected at exit).
#[test]
fn one_thread_many_calls_under_qemu() {
    let Some((tmp, orig, traced)) = stress_build("a64-one", "1024") else {
        return;
    };
    let n = 200_000u64;
    let recs = stress_run(
        &tmp,
        &orig,
        &traced,
        &["one", "200000"],
        "one total=200000\n",
    );
    assert_eq!(recs.len() as u64, n, "records of hit");
    let pid = recs[0].pid;
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(
            (r.pid, r.tid, r.value),
            (pid, pid, i as u64),
            "record #{i} of hit: {r:?}"
        );
    }
}

/// 8 threads × 30,000 calls, 14 usable slots (found through the thread word): 8
/// distinct tids, exactly 30,000 records each, values in order, one tag per thread.
#[test]
fn threads_under_qemu() {
    let Some((tmp, orig, traced)) = stress_build("a64-threads", "16") else {
        return;
    };
    let n = 30_000u64;
    let recs = stress_run(
        &tmp,
        &orig,
        &traced,
        &["threads", "8", "30000"],
        "threads total=240000\n",
    );
    let threads = by_tid(&recs);
    assert_eq!(threads.len(), 8, "threads with records");
    let mut tags: Vec<u64> = Vec::new();
    for (tid, rs) in &threads {
        assert_ne!(*tid, rs[0].pid, "the main thread does not call hit");
        assert_eq!(rs.len() as u64, n, "records of thread {tid}");
        let tag = rs[0].value >> 32;
        for (i, r) in rs.iter().enumerate() {
            assert_eq!(r.value, tag << 32 | i as u64, "thread {tid} record #{i}");
        }
        tags.push(tag);
    }
    tags.sort_unstable();
    assert_eq!(tags, (0..8).collect::<Vec<u64>>(), "thread tags");
}

/// 300 short-lived threads, at most 6 alive, 10 usable slots (found through the index):
/// the tracer releases each
/// exiting thread's slot, so slots are reused; thread k has exactly 2000 + k records,
/// in order, under one tid, and no tid mixes two threads' records.
///
/// Each thread runs on its own stack (`churn-stacks`): under qemu-user a new thread
/// may otherwise get a joined thread's thread pointer, and so its slot, before the
/// tracer has collected that thread at its exit (see ARCHITECTURE.md, limits).
#[test]
fn churn_under_qemu() {
    let Some((tmp, orig, traced)) = stress_build("a64-churn", "12") else {
        return;
    };
    let (k_threads, base) = (300u64, 2000u64);
    let total: u64 = (0..k_threads).map(|k| base + k).sum();
    let recs = stress_run(
        &tmp,
        &orig,
        &traced,
        &["churn-stacks", "300", "6", "2000"],
        &format!("churn-stacks total={total}\n"),
    );
    check_thread_runs(&recs, k_threads, base);
}

/// `--binary` with a file that is not instrumented is refused with a clear message.
#[test]
fn binary_option_refuses_uninstrumented() {
    let Some((tmp, orig, _)) = stress_build("a64-binary-refused", "1024") else {
        return;
    };
    let trace = tmp.join("refused.utrace");
    let mut c = Command::new(tracer_bin());
    c.args(["record", "--user", "--binary"])
        .arg(&orig)
        .arg("-o")
        .arg(&trace)
        .args(["--", "qemu-aarch64", "-L", SYSROOT])
        .arg(&orig)
        .args(["one", "1"]);
    let out = run(&mut c, RUN_TIMEOUT);
    assert_ne!(out.status(), 0, "{}", out.describe());
    assert!(
        out.stderr_str().contains("not an instrumented binary"),
        "{}",
        out.describe()
    );
}

// ---- access runs (runs.c)

/// Every access of a trace as (site, address), in order: a memory pair
/// (`FLAG_MEM_PAIR`, `Record::split_pair`) is two, sites `site` and `site + 1`. The
/// memory sites' by site, and how many times each other site was recorded.
fn accesses(
    recs: &[Rec],
    meta: &tracer_common::meta::Metadata,
) -> (HashMap<u32, Vec<u64>>, HashMap<u32, usize>) {
    use tracer_common::meta::SiteKind;
    let (mut mem, mut other): (HashMap<u32, Vec<u64>>, HashMap<u32, usize>) = Default::default();
    for r in recs {
        let rec = tracer_common::Record {
            site: r.site,
            flags: r.flags,
            time: 0,
            value: r.value,
            aux: r.aux,
        };
        match rec.split_pair() {
            Some(two) => two
                .iter()
                .for_each(|a| mem.entry(a.site).or_default().push(a.value)),
            None if meta.sites[r.site as usize].kind == SiteKind::Memory => {
                mem.entry(r.site).or_default().push(r.value)
            }
            None => *other.entry(r.site).or_default() += 1,
        }
    }
    (mem, other)
}

/// Access runs on AArch64 (one stub records a run of memory sites, two accesses a
/// record) under qemu, against two oracles independent of the batching: each memory
/// site is recorded as often as the block site that holds it (blocks have stubs of
/// their own), and the same binary rewritten with `--no-batch` records the same
/// addresses per site. The program's output is unchanged.
fn a64_runs_case(opt: &str) {
    use tracer_common::meta::SiteKind;
    let what = format!("access runs AArch64 gcc {opt}");
    let tmp = TempDir::new(&format!("runs-a64{opt}"));
    let orig = tmp.join("runs");
    let Some(flags) = toolchain(GCC, tmp.path(), &[opt, "-fno-tree-vectorize"]) else {
        return;
    };
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    compile(GCC, &[fixture("runs.c")], &flags, &orig);
    let want = qemu_args(&orig, &["50"], &[]).ok();
    // Each variant in a directory of its own under the same file name.
    let mut traced = Vec::new();
    for (dir, extra) in [("batch", None), ("plain", Some("--no-batch"))] {
        std::fs::create_dir_all(tmp.join(dir)).unwrap();
        let prog = tmp.join(dir).join("runs");
        let mut args: Vec<&OsStr> = vec![orig.as_os_str(), "-o".as_ref(), prog.as_os_str()];
        args.extend(
            [
                "-v",
                "--sites",
                "block,memory",
                "--functions",
                "fill",
                "walk",
                "check",
            ]
            .map(OsStr::new),
        );
        args.extend(extra.map(OsStr::new));
        let line = rewriter(&args).ok().stdout_str();
        let meta = metadata(&prog);
        assert!(
            meta.sites
                .iter()
                .all(|s| s.mode == tracer_common::meta::SiteMode::Inline),
            "{what}: sites left to uprobes:\n{line}"
        );
        let batched = line.contains("memory runs:");
        assert_eq!(batched, extra.is_none(), "{what} {dir}: {line}");
        let (out, recs) = trace_qemu(
            &tmp.join(dir).join("t.utrace"),
            &[&prog],
            &prog,
            &["50"],
            &[],
        );
        assert_same_behaviour(&format!("{what} {dir}"), &without_tracer_lines(&out), &want);
        traced.push((meta, recs, line));
    }
    let (meta, recs, line) = &traced[0];
    let (mem, blocks) = accesses(recs, meta);
    // The readers expand pairs: the report counts the records that held two.
    let pairs = report(&tmp.join("batch").join("t.utrace")).pairs;
    assert!(pairs > 0, "{what}: no pair records\n{line}");
    // The block that holds each memory site: the last block site at or before it.
    let block_of = |m: &tracer_common::meta::Site| {
        (meta.sites.iter())
            .filter(|b| b.kind == SiteKind::Block && b.name == m.name && b.vaddr <= m.vaddr)
            .max_by_key(|b| b.vaddr)
            .map(|b| b.id)
    };
    let mut n = 0;
    for m in meta.sites.iter().filter(|s| s.kind == SiteKind::Memory) {
        let b = block_of(m).unwrap_or_else(|| panic!("{what}: no block before {m:?}"));
        let got = mem.get(&m.id).map_or(0, Vec::len);
        assert_eq!(
            got,
            blocks.get(&b).copied().unwrap_or(0),
            "{what}: accesses of {m:?}"
        );
        n += got;
    }
    // The same addresses per site as without runs (the stack may sit elsewhere: the
    // code segment's size differs; one offset per site).
    let (plain, _) = accesses(&traced[1].1, &traced[1].0);
    assert_eq!(mem.len(), plain.len(), "{what}: sites recorded");
    let mut exact = 0;
    for (site, addrs) in &mem {
        let p = &plain[site];
        assert_eq!(addrs.len(), p.len(), "{what}: accesses of site {site}");
        let d: std::collections::BTreeSet<u64> = addrs
            .iter()
            .zip(p)
            .map(|(a, b)| a.wrapping_sub(*b))
            .collect();
        assert_eq!(d.len(), 1, "{what}: addresses of site {site}");
        exact += usize::from(d.contains(&0));
    }
    assert!(exact > 0, "{what}: no site with the same addresses");
    eprintln!(
        "{what}: {n} accesses, {} records ({pairs} pairs) vs {} without runs; {}",
        recs.len() as u64 - pairs,
        traced[1].1.len(),
        line.lines()
            .find(|l| l.contains("memory runs:"))
            .unwrap_or_default()
            .trim()
    );
}

#[test]
fn access_runs_o0() {
    a64_runs_case("-O0");
}

#[test]
fn access_runs_o2() {
    a64_runs_case("-O2");
}
