//! Function exits (`--sites entry,exit`): every return path and tail call of
//! tests/fixtures/exits.c is recorded, once per call, with the right return value;
//! entries and exits nest like a call stack on every thread. Both ISAs (x86-64 through
//! the kernel, AArch64 under qemu-user with the user-space drain), both timestamp modes
//! (cycle counter per record, coarse), and the instrumentation spec file.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use tests::*;
use tracer_common::meta::{Metadata, SiteKind, SiteMode};

const ROUNDS: u64 = 3000;
const A64_ROUNDS: u64 = 500;

/// What the fixture's functions return for argument `x` (see exits.c).
fn expected_return(f: &str, x: u64) -> Option<u64> {
    let x = x as i64;
    let v = match f {
        "leaf" => 3 * x,
        "multi" => match x % 3 {
            0 => x + 100,
            1 => -x,
            _ => 3 * x + 1,
        },
        "tail" => 3 * (x + 1),
        "tiny2" => 7,
        _ => return None,
    };
    Some(v as u64)
}

fn expected_output(n: u64) -> String {
    let acc: i64 = (0..n)
        .map(|i| {
            ["leaf", "multi", "tail", "tiny2"]
                .iter()
                .map(|f| expected_return(f, i).unwrap() as i64)
                .sum::<i64>()
        })
        .sum();
    format!("exits n={n} acc={acc}\n")
}

/// Whether the exit site `s` is a return (not a tail call, whose value is whatever
/// the return register held before the jump), from the original binary's bytes (the
/// rewritten file keeps the original's offsets).
fn is_return(orig: &[u8], s: &tracer_common::meta::Site, arch: u32) -> bool {
    let at = &orig[s.file_off as usize..];
    if arch == tracer_common::ARCH_AARCH64 {
        let w = u32::from_le_bytes(at[..4].try_into().unwrap());
        [0xd65f_03c0, 0xd65f_0bff, 0xd65f_0fff].contains(&w)
    } else {
        let at = at
            .strip_prefix(&[0xf3])
            .or(at.strip_prefix(&[0xf2]))
            .unwrap_or(at);
        matches!(at[0], 0xc3 | 0xc2)
    }
}

/// Pair exits with entries per thread (a call stack), check each fixture function's
/// return value (at returns) and its number of calls. Returns the calls per function.
fn check_nesting(
    recs: &[Rec],
    meta: &Metadata,
    orig: &Path,
    n: u64,
    what: &str,
) -> HashMap<String, u64> {
    let orig = std::fs::read(orig).unwrap();
    let kind: HashMap<u32, (SiteKind, &str, bool)> = meta
        .sites
        .iter()
        .map(|s| {
            (
                s.id,
                (s.kind, s.name.as_str(), is_return(&orig, s, meta.arch)),
            )
        })
        .collect();
    let tail_calls = kind
        .values()
        .filter(|(k, _, ret)| *k == SiteKind::FunctionExit && !ret)
        .count();
    assert!(
        tail_calls <= 1,
        "{what}: {tail_calls} tail-call exits (only `tail` can have one)"
    );
    let mut calls: HashMap<String, u64> = HashMap::new();
    for (tid, recs) in by_tid(recs) {
        let mut stack: Vec<(&str, u64)> = Vec::new();
        for r in recs {
            let (k, name, ret) = kind[&r.site];
            match k {
                SiteKind::FunctionEntry => stack.push((name, r.value)),
                SiteKind::Block
                | SiteKind::Memory
                | SiteKind::Usdt
                | SiteKind::Call
                | SiteKind::Landing
                | SiteKind::Resume => {}
                SiteKind::FunctionExit => {
                    let Some((top, arg)) = stack.pop() else {
                        panic!("{what}: thread {tid}: exit of {name} with no entry before it");
                    };
                    assert_eq!(
                        top, name,
                        "{what}: thread {tid}: exit of {name} while in {top}"
                    );
                    *calls.entry(name.to_string()).or_default() += 1;
                    if let Some(want) = expected_return(name, arg).filter(|_| ret) {
                        // 32-bit returns (tiny2) leave the upper half of rax/x0 open.
                        let mask = if name == "tiny2" {
                            0xffff_ffff
                        } else {
                            u64::MAX
                        };
                        assert_eq!(
                            r.value & mask,
                            want & mask,
                            "{what}: {name}({arg}) returned {:#x}, expected {want:#x}",
                            r.value
                        );
                    }
                }
            }
        }
    }
    let twos = (0..n).filter(|i| i % 3 == 2).count() as u64;
    for (f, want) in [
        ("leaf", 2 * n + twos),
        ("multi", n),
        ("tail", n),
        ("tiny", n),
        ("tiny2", n),
        ("main", 1),
    ] {
        assert_eq!(
            calls.get(f).copied().unwrap_or(0),
            want,
            "{what}: calls of {f}"
        );
    }
    calls
}

fn fixture_functions() -> Vec<&'static str> {
    vec!["leaf", "multi", "tail", "tiny", "tiny2", "main"]
}

fn rewrite_exits(input: &Path, output: &Path, extra: &[&str]) -> (String, Metadata) {
    let mut args: Vec<&OsStr> = vec![input.as_os_str(), "-o".as_ref(), output.as_os_str()];
    for f in fixture_functions() {
        args.extend([OsStr::new("--functions"), OsStr::new(f)]);
    }
    args.extend(["--sites", "entry,exit", "-v"].map(OsStr::new));
    args.extend(extra.iter().map(OsStr::new));
    let out = rewriter(&args).ok();
    (out.stdout_str(), metadata(output))
}

fn x86_case(cc: &str, opt: &str, time: &str) {
    let what = format!("exits x86-64 {cc} {opt} --time {time}");
    let tmp = TempDir::new(&format!("exits-{cc}{opt}{time}"));
    let (orig, traced, trace) = (
        tmp.join("exits"),
        tmp.join("exits.traced"),
        tmp.join("t.utrace"),
    );
    compile(cc, &[fixture("exits.c")], &[opt], &orig);
    let (line, meta) = rewrite_exits(&orig, &traced, &["--time", time]);
    let exits = meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::FunctionExit)
        .count();
    assert!(exits >= 6, "{what}: only {exits} exit sites: {line}");
    // Entries all go inline (tiny functions through the padding after them); an exit
    // may be a uprobe site (e.g. -O0's `call f; leave; ret`: the call cannot be moved,
    // `leave; ret` is too short), recorded the same way.
    let uprobes: Vec<_> = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Uprobe && s.kind == SiteKind::FunctionEntry)
        .collect();
    assert!(
        uprobes.is_empty(),
        "{what}: uprobe entry sites {uprobes:?}\n{line}"
    );

    let n = ROUNDS.to_string();
    let want = run(Command::new(&orig).arg(&n), RUN_TIMEOUT).ok();
    assert_eq!(
        want.stdout_str(),
        expected_output(ROUNDS),
        "{what}: original output"
    );
    let got = run(Command::new(&traced).arg(&n), RUN_TIMEOUT);
    assert_same_behaviour(&what, &got, &want);

    let out = tracer_record(&trace, &traced, &[&n], &[]);
    assert_same_behaviour(&what, &without_tracer_lines(&out), &want);
    let recs = dump(&trace);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped");
    check_report_matches_dump(&rep, &recs);
    check_nesting(&recs, &meta, &orig, ROUNDS, &what);
    let modes = rep.raw["time_modes"].to_string();
    assert!(
        modes.contains(&format!("\"time_mode\":\"{time}\"")),
        "{what}: {modes}"
    );
    let main: Vec<&Rec> = recs.iter().collect();
    check_times_monotonic(&main, &what);
    if time == "coarse" {
        assert!(
            recs.iter().all(|r| r.flags & 0x100 != 0),
            "{what}: coarse records must be marked interpolated"
        );
    }
}

#[test]
fn gcc_o0() {
    x86_case("gcc", "-O0", "record");
}

#[test]
fn gcc_o2() {
    x86_case("gcc", "-O2", "record");
}

#[test]
fn clang_o2() {
    x86_case("clang", "-O2", "record");
}

#[test]
fn gcc_o2_coarse() {
    x86_case("gcc", "-O2", "coarse");
}

#[test]
fn clang_o0_coarse() {
    x86_case("clang", "-O0", "coarse");
}

fn a64_case(opt: &str, time: &str) {
    let what = format!("exits AArch64 gcc {opt} --time {time}");
    if !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("exits-a64{opt}{time}"));
    let (orig, traced, trace) = (
        tmp.join("exits"),
        tmp.join("exits.traced"),
        tmp.join("t.utrace"),
    );
    compile(
        "aarch64-linux-gnu-gcc",
        &[fixture("exits.c")],
        &[opt, "-mbranch-protection=standard"],
        &orig,
    );
    let (line, meta) = rewrite_exits(&orig, &traced, &["--time", time]);
    let uprobes: Vec<_> = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Uprobe)
        .collect();
    assert!(
        uprobes.is_empty(),
        "{what}: uprobe sites {uprobes:?}\n{line}"
    );
    let n = A64_ROUNDS.to_string();
    let qemu = |prog: &Path| run_qemu_aarch64(prog, &[&n]);
    let want = qemu(&orig).ok();
    assert_eq!(
        want.stdout_str(),
        expected_output(A64_ROUNDS),
        "{what}: original output"
    );
    assert_same_behaviour(&what, &qemu(&traced), &want);
    let out = tracer_record_qemu(&trace, &traced, &[&n]);
    assert_same_behaviour(&what, &without_tracer_lines(&out), &want);
    let recs = dump(&trace);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped");
    check_nesting(&recs, &meta, &orig, A64_ROUNDS, &what);
}

#[test]
fn aarch64_o0() {
    a64_case("-O0", "record");
}

#[test]
fn aarch64_o2_coarse() {
    a64_case("-O2", "coarse");
}

/// A spec file selects the same sites as the equivalent flags; a bad one is refused
/// with a message naming the file and the problem, and nothing is written.
#[test]
fn spec_file() {
    let tmp = TempDir::new("exits-spec");
    let orig = tmp.join("exits");
    compile("gcc", &[fixture("exits.c")], &["-O2"], &orig);
    let spec = tmp.join("spec.toml");
    let globs = fixture_functions()
        .iter()
        .map(|f| format!("{f:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(
        &spec,
        format!(
            "functions = [{globs}]\nsites = [\"entry\", \"exit\"]\ntime = \"coarse\"\n[buffer]\nrecords = 2048\nslots = 16\n"
        ),
    )
    .unwrap();
    let (a, b) = (tmp.join("a"), tmp.join("b"));
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        a.as_os_str(),
        "--spec".as_ref(),
        spec.as_os_str(),
    ])
    .ok();
    let (_, mb) = rewrite_exits(
        &orig,
        &b,
        &[
            "--time",
            "coarse",
            "--buffer-records",
            "2048",
            "--slots",
            "16",
        ],
    );
    let ma = metadata(&a);
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        "spec file and flags give different binaries"
    );
    assert_eq!((ma.buf_records, ma.nslots), (2048, 16));
    assert_eq!(ma.time_mode, tracer_common::meta::TimeMode::Coarse);
    assert_eq!(ma.sites, mb.sites);

    for (text, needle) in [
        (
            "sites = [\"entry\", \"loops\"]",
            "unknown site kind \"loops\"",
        ),
        ("time = 3", "invalid type"),
        (
            "buffer = { records = 10, colour = 2 }",
            "unknown field `colour`",
        ),
    ] {
        std::fs::write(&spec, text).unwrap();
        let out_path = tmp.join("bad.traced");
        let out = rewriter(&[
            orig.as_os_str(),
            "-o".as_ref(),
            out_path.as_os_str(),
            "--spec".as_ref(),
            spec.as_os_str(),
        ]);
        assert!(!out.success(), "bad spec {text:?} accepted");
        let err = out.stderr_str();
        assert!(
            err.contains("spec.toml") && err.contains(needle),
            "bad spec {text:?}: message does not name the problem: {err}"
        );
        assert!(
            !out_path.exists(),
            "bad spec {text:?}: an output was written"
        );
    }
}

/// Call sites (`--sites entry,call`): every call of exits.c records where it goes and
/// where it returns to; a call to an instrumented function is followed by that
/// function's entry, whose address is the call's target and whose return address is
/// the call's.
fn call_case(a64: bool, opt: &str) {
    let what = format!("calls {} gcc {opt}", if a64 { "AArch64" } else { "x86-64" });
    if a64 && !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("calls-{a64}{opt}"));
    let (orig, traced, trace) = (
        tmp.join("exits"),
        tmp.join("exits.traced"),
        tmp.join("t.utrace"),
    );
    let cc = if a64 { "aarch64-linux-gnu-gcc" } else { "gcc" };
    compile(cc, &[fixture("exits.c")], &[opt], &orig);
    let mut args: Vec<&OsStr> = vec![orig.as_os_str(), "-o".as_ref(), traced.as_os_str()];
    for f in fixture_functions() {
        args.extend([OsStr::new("--functions"), OsStr::new(f)]);
    }
    args.extend(["--sites", "entry,call"].map(OsStr::new));
    rewriter(&args).ok();
    let meta = metadata(&traced);
    let n = "200";
    let recs = if a64 {
        tracer_record_qemu(&trace, &traced, &[n]);
        dump(&trace)
    } else {
        tracer_record(&trace, &traced, &[n], &[]);
        dump(&trace)
    };
    let kind = |r: &Rec| meta.sites[r.site as usize].kind;
    let entry_addr = |r: &Rec| meta.sites[r.site as usize].vaddr;
    let mut checked = 0;
    let mut calls_in_main = 0;
    for w in recs.windows(2) {
        if kind(&w[0]) != SiteKind::Call {
            continue;
        }
        if &*w[0].symbol == "main" {
            calls_in_main += 1;
        }
        if kind(&w[1]) == SiteKind::FunctionEntry {
            // Same load bias for both: target - entry = aux bias check.
            let bias = w[0].value.wrapping_sub(entry_addr(&w[1]));
            assert_eq!(w[0].value, entry_addr(&w[1]).wrapping_add(bias), "{what}");
            assert_eq!(
                w[1].aux, w[0].aux,
                "{what}: return address of {:?} after {:?}",
                w[1], w[0]
            );
            checked += 1;
        }
    }
    // main calls leaf, multi, tail, tiny, tiny2 each round, plus atol and printf.
    assert!(
        calls_in_main >= 5 * 200,
        "{what}: {calls_in_main} calls from main"
    );
    assert!(
        checked >= 5 * 200,
        "{what}: only {checked} call/entry pairs"
    );
    let biases: std::collections::HashSet<u64> = recs
        .windows(2)
        .filter(|w| kind(&w[0]) == SiteKind::Call && kind(&w[1]) == SiteKind::FunctionEntry)
        .map(|w| w[0].value.wrapping_sub(entry_addr(&w[1])))
        .collect();
    assert_eq!(
        biases.len(),
        1,
        "{what}: call targets are not the entries' addresses: {biases:?}"
    );
}

#[test]
fn calls_x86_o2() {
    call_case(false, "-O2");
}

#[test]
fn calls_x86_o0() {
    call_case(false, "-O0");
}

#[test]
fn calls_aarch64_o2() {
    call_case(true, "-O2");
}

/// Chosen values (`--value KIND=SPEC`): entries record an immediate, first blocks a
/// register or memory operand — at a function's first instruction, the return address
/// (x86-64 `8@(%rsp)`, AArch64 `x30`), which the entry records as its aux.
fn value_case(a64: bool) {
    let what = format!("values {}", if a64 { "AArch64" } else { "x86-64" });
    if a64 && !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("values-{a64}"));
    let (orig, traced, trace) = (
        tmp.join("exits"),
        tmp.join("exits.traced"),
        tmp.join("t.utrace"),
    );
    let cc = if a64 { "aarch64-linux-gnu-gcc" } else { "gcc" };
    compile(cc, &[fixture("exits.c")], &["-O2"], &orig);
    let (imm, ra) = if a64 {
        ("entry=77", "block=x30")
    } else {
        ("entry=$77", "block=8@(%rsp)")
    };
    let mut args: Vec<&OsStr> = vec![orig.as_os_str(), "-o".as_ref(), traced.as_os_str()];
    for f in fixture_functions() {
        args.extend([OsStr::new("--functions"), OsStr::new(f)]);
    }
    args.extend(["--sites", "entry,block", "--value", imm, "--value", ra].map(OsStr::new));
    rewriter(&args).ok();
    let meta = metadata(&traced);
    let n = "50";
    let recs = if a64 {
        tracer_record_qemu(&trace, &traced, &[n]);
        dump(&trace)
    } else {
        tracer_record(&trace, &traced, &[n], &[]);
        dump(&trace)
    };
    let kind = |r: &Rec| meta.sites[r.site as usize].kind;
    let mut pairs = 0;
    for w in recs.windows(2) {
        if kind(&w[0]) == SiteKind::FunctionEntry {
            assert_eq!(w[0].value, 77, "{what}: entry value {:?}", w[0]);
            assert_eq!(
                kind(&w[1]),
                SiteKind::Block,
                "{what}: {:?} then {:?}",
                w[0],
                w[1]
            );
            assert_eq!(
                w[1].value, w[0].aux,
                "{what}: first block's value is the return address"
            );
            pairs += 1;
        }
    }
    assert!(pairs >= 5 * 50, "{what}: {pairs} entries");
    // A spec that does not parse for this ISA is refused, naming it.
    let bad = rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        tmp.join("bad").as_os_str(),
        "--value".as_ref(),
        "entry=%nope".as_ref(),
    ]);
    assert!(
        !bad.success() && bad.stderr_str().contains("%nope"),
        "{what}: {}",
        bad.describe()
    );
}

#[test]
fn values_x86() {
    value_case(false);
}

#[test]
fn values_aarch64() {
    value_case(true);
}
