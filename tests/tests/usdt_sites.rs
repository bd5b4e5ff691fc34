//! USDT probes (`--sites usdt`): tests/fixtures/usdt.c's probes become inline stores of
//! their arguments (registers of every width, memory operands, RIP-relative globals,
//! immediates; up to six arguments, two per record). Every probe fires exactly as
//! often as the program says, with the argument values it prints; a probe guarded by a
//! semaphore fires (and its guarded code runs) only while a tracer holds the semaphore.
//! x86-64 through the kernel; AArch64 under qemu-user with the user-space drain (which
//! does not raise semaphores).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use tests::site_checks::{check_usdt_events, usdt_events};
use tests::*;
use tracer_common::meta::SiteMode;

const SYSROOT: &str = "/usr/aarch64-linux-gnu";
const COUNTS: [&str; 3] = ["4", "6", "5"];

fn x86_case(cc: &str, opt: &str) {
    let what = format!("usdt x86-64 {cc} {opt}");
    let tmp = TempDir::new(&format!("usdt-{cc}{opt}"));
    let (orig, traced, trace) = (
        tmp.join("usdt"),
        tmp.join("usdt.traced"),
        tmp.join("t.utrace"),
    );
    compile(cc, &[fixture("usdt.c")], &[opt], &orig);
    let out = rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--sites".as_ref(),
        "usdt".as_ref(),
        "-v".as_ref(),
    ])
    .ok();
    let meta = metadata(&traced);
    assert_eq!(meta.sites.len(), 10, "{what}: {}", out.stdout_str());
    assert_eq!(meta.semaphores.len(), 1, "{what}: semaphores");
    let want = run(Command::new(&orig).args(COUNTS), RUN_TIMEOUT).ok();
    // Without a tracer the semaphore stays 0: same behaviour.
    assert_same_behaviour(
        &what,
        &run(Command::new(&traced).args(COUNTS), RUN_TIMEOUT),
        &want,
    );

    let got = tracer_record(&trace, &traced, &COUNTS, &[]);
    let text = got.stdout_str();
    // Under the tracer the guarded probe's code runs: "guarded i v" after each
    // "global1" line, the rest unchanged.
    let stripped: String = text
        .lines()
        .filter(|l| !l.starts_with("guarded "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        stripped,
        want.stdout_str(),
        "{what}: output under the tracer"
    );
    let guarded = text.lines().filter(|l| l.starts_with("guarded ")).count();
    assert_eq!(guarded, 5, "{what}: the semaphore was not raised:\n{text}");
    let recs = dump(&trace);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0);
    check_report_matches_dump(&rep, &recs);
    let evs = usdt_events(&recs, &meta);
    check_usdt_events(&what, &evs, &text);
    let inline = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Inline)
        .count();
    eprintln!(
        "{what}: {} probes, {inline} inline, {} events",
        meta.sites.len(),
        evs.len()
    );
}

#[test]
fn gcc_o0() {
    x86_case("gcc", "-O0");
}

#[test]
fn gcc_o2() {
    x86_case("gcc", "-O2");
}

#[test]
fn clang_o2() {
    x86_case("clang", "-O2");
}

fn a64_case(opt: &str) {
    let what = format!("usdt AArch64 gcc {opt}");
    if !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("usdt-a64{opt}"));
    let (orig, traced, trace) = (
        tmp.join("usdt"),
        tmp.join("usdt.traced"),
        tmp.join("t.utrace"),
    );
    let incf = a64_sdt_include(tmp.path());
    compile(
        "aarch64-linux-gnu-gcc",
        &[fixture("usdt.c")],
        &[opt, &incf],
        &orig,
    );
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--sites".as_ref(),
        "usdt".as_ref(),
    ])
    .ok();
    let meta = metadata(&traced);
    assert!(
        meta.sites.iter().all(|s| s.mode == SiteMode::Inline),
        "{what}: {:?}",
        meta.sites
    );
    let q = |p: &Path| {
        let mut c = Command::new("qemu-aarch64");
        c.arg("-L").arg(SYSROOT).arg(p).args(COUNTS);
        run(&mut c, RUN_TIMEOUT)
    };
    let want = q(&orig).ok();
    assert_same_behaviour(&what, &q(&traced), &want);
    let got = tracer_record_qemu(&trace, &traced, &COUNTS);
    assert_same_behaviour(&what, &without_tracer_lines(&got), &want);
    let recs = dump(&trace);
    let evs = usdt_events(&recs, &meta);
    check_usdt_events(&what, &evs, &want.stdout_str());
    let per: HashMap<&str, usize> = evs.iter().fold(HashMap::new(), |mut m, e| {
        *m.entry(e.probe.as_str()).or_default() += 1;
        m
    });
    assert_eq!(
        per.get("fx:guarded"),
        None,
        "{what}: guarded fired without its semaphore"
    );
}

#[test]
fn aarch64_o0() {
    a64_case("-O0");
}

#[test]
fn aarch64_o2() {
    a64_case("-O2");
}
