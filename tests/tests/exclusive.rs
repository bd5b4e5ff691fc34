//! AArch64 exclusive sequences (issue 30): no stub and no trap between a load-exclusive
//! and its store-exclusive. A stub's stores, its own exclusive pair, or a uprobe's trap
//! there clear the exclusive monitor, so the store-exclusive would fail on every retry
//! (on hardware; qemu does not model the monitor).
//!
//! tests/fixtures/atomics.c, built with `-march=armv8-a -mno-outline-atomics`, has
//! `ldaxr … stlxr` loops. It is rewritten with block and memory sites, and checked
//! against objdump of the original, which names every exclusive pair:
//! - the rewritten binary's bytes, from after each load-exclusive through its
//!   store-exclusive, are the original's;
//! - every site there is untraced, with the sequence's start as its reason, and
//!   `rewriter -v` and the report list them;
//! - the sites at the load-exclusives are inline (their stubs run before the load).
//!
//! Under the tracer (qemu-user, user-space drain), the 4 threads end with the right
//! sums. The kernel drain on a real arm64 kernel runs in `cargo xtask test-arm64-vm`.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use object::{Object, ObjectSegment};
use tests::*;
use tracer_common::meta::{FallbackReason, SiteKind};

const ROUNDS: u64 = 2000;

/// `(load-exclusive, store-exclusive)` addresses of `bin`, from objdump: each load and
/// the next store after it.
fn exclusive_pairs(bin: &Path) -> Vec<(u64, u64)> {
    let out = run(
        Command::new("aarch64-linux-gnu-objdump").arg("-d").arg(bin),
        RUN_TIMEOUT,
    )
    .ok();
    let mut pairs = Vec::new();
    let mut open = None;
    for l in out.stdout_str().lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(addr), Some(m)) = (f.first(), f.get(2)) else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr.trim_end_matches(':'), 16) else {
            continue;
        };
        let base = m.trim_end_matches(['b', 'h']);
        if matches!(base, "ldxr" | "ldaxr" | "ldxp" | "ldaxp") {
            open = Some(addr);
        } else if matches!(base, "stxr" | "stlxr" | "stxp" | "stlxp")
            && let Some(l) = open.take()
        {
            pairs.push((l, addr));
        }
    }
    pairs
}

/// The bytes of `data` (an ELF file) at link-time addresses `[from, to)`.
fn bytes_at(data: &[u8], from: u64, to: u64) -> Vec<u8> {
    let f = object::File::parse(data).unwrap();
    let seg = f
        .segments()
        .find(|s| (s.address()..s.address() + s.size()).contains(&from))
        .unwrap_or_else(|| panic!("{from:#x} in no segment"));
    let (off, _) = seg.file_range();
    let at = (off + from - seg.address()) as usize;
    data[at..at + (to - from) as usize].to_vec()
}

/// atomics.c built with load/store-exclusive loops in `tmp`: (the binary, where its
/// rewritten copy goes).
fn build_atomics(what: &str, tmp: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    assert!(have_qemu_aarch64(what), "{what}: qemu-aarch64 is missing");
    let (orig, traced) = (tmp.join("atomics"), tmp.join("atomics.traced"));
    compile(
        "aarch64-linux-gnu-gcc",
        &[fixture("atomics.c")],
        &["-O2", "-march=armv8-a", "-mno-outline-atomics", "-pthread"],
        &orig,
    );
    (orig, traced)
}

#[test]
fn no_site_inside_an_exclusive_sequence() {
    let what = "exclusive sequences";
    let tmp = TempDir::new("exclusive");
    let (orig, traced) = build_atomics(what, &tmp);
    let pairs = exclusive_pairs(&orig);
    assert!(pairs.len() >= 3, "{what}: exclusive pairs {pairs:x?}");
    let out = rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        OsStr::new("--sites"),
        OsStr::new("block,memory"),
        OsStr::new("-v"),
    ])
    .ok();
    let line = out.stdout_str();
    let meta = metadata(&traced);
    let reasons = {
        let data = std::fs::read(&traced).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let sec = object::ObjectSection::data(
            &object::Object::section_by_name(&file, META_SECTION).expect("metadata"),
        )
        .unwrap()
        .to_vec();
        Metadata::reasons_from_note_section(&sec)
            .expect("reasons")
            .unwrap()
    };
    let (a, b) = (
        std::fs::read(&orig).unwrap(),
        std::fs::read(&traced).unwrap(),
    );
    let mut untraced = 0;
    for &(load, store) in &pairs {
        assert_eq!(
            bytes_at(&b, load + 4, store + 4),
            bytes_at(&a, load + 4, store + 4),
            "{what}: code inside {load:#x}..={store:#x} was patched"
        );
        for s in &meta.sites {
            if s.vaddr == load {
                assert_eq!(s.mode, SiteMode::Inline, "{what}: {s:?} at the load");
            }
            if load < s.vaddr && s.vaddr <= store {
                untraced += 1;
                assert_eq!(s.mode, SiteMode::Untraced, "{what}: {s:?}\n{line}");
                let why = reasons.iter().find(|r| r.site == s.id).map(|r| &r.reason);
                assert_eq!(
                    why,
                    Some(&FallbackReason::ExclusiveSequence { at: load }),
                    "{what}: {s:?}"
                );
                let said = format!("{} ({} at {:#x})", s.name, s.kind.name(), s.vaddr);
                assert!(
                    line.contains(&format!("untraced site {said}: inside the exclusive")),
                    "{what}: rewriter -v does not say {said}:\n{line}"
                );
            }
        }
    }
    assert!(
        untraced >= 3,
        "{what}: {untraced} sites inside the sequences"
    );
    assert!(
        meta.sites
            .iter()
            .filter(|s| s.mode == SiteMode::Untraced)
            .all(|s| pairs.iter().any(|p| p.0 < s.vaddr && s.vaddr <= p.1)),
        "{what}: untraced sites outside every sequence"
    );
    assert!(
        meta.sites.iter().all(|s| s.mode != SiteMode::Uprobe
            || s.kind != SiteKind::Memory
            || !pairs.iter().any(|p| p.0 == s.vaddr)),
        "{what}: a load-exclusive left to a uprobe"
    );

    let n = ROUNDS.to_string();
    let want = run_qemu_aarch64(&orig, &[&n]).ok();
    let sums = format!(
        "UTPROG atomics counter {} max {} locked {}\n",
        4 * ROUNDS,
        4 * ROUNDS - 1,
        8 * ROUNDS
    );
    assert_eq!(want.stdout_str(), sums, "{what}: the original's output");
    let trace = tmp.join("atomics.utrace");
    let out = tracer_record_qemu(&trace, &traced, &[&n]);
    assert_same_behaviour(what, &without_tracer_lines(&out), &want);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped");
    let threads: std::collections::HashSet<u32> = dump(&trace).iter().map(|r| r.tid).collect();
    assert_eq!(threads.len(), 5, "{what}: threads with records");
    let listed = rep.raw["untraced_sites"]
        .as_array()
        .expect("untraced_sites");
    assert_eq!(
        listed.len(),
        untraced,
        "{what}: untraced sites in the report"
    );
}

/// A function that starts with its load-exclusive (`at_add`: the retry branches back to
/// the function's first instruction) gets its entry stub after the sequence, inline:
/// no trap the kernel would refuse on hardware, no stub at every retry. Under the tracer
/// it has one entry and one exit per call: the counter it adds 1 to, which the program
/// prints.
#[test]
fn an_entry_at_a_load_exclusive_runs_after_its_sequence() {
    let what = "entry at a load-exclusive";
    let tmp = TempDir::new("exclusive-entry");
    let (orig, traced) = build_atomics(what, &tmp);
    let data = std::fs::read(&orig).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let add = object::Object::symbols(&file)
        .find(|s| object::ObjectSymbol::name(s) == Ok("at_add"))
        .map(|s| object::ObjectSymbol::address(&s))
        .expect("at_add");
    let (_, store) = *exclusive_pairs(&orig)
        .iter()
        .find(|p| p.0 == add)
        .unwrap_or_else(|| panic!("{what}: at_add does not start with its load-exclusive"));
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        OsStr::new("--sites"),
        OsStr::new("entry,exit"),
    ])
    .ok();
    let meta = metadata(&traced);
    let entry = meta
        .sites
        .iter()
        .find(|s| s.name == "at_add" && s.kind == SiteKind::FunctionEntry)
        .expect("at_add's entry site");
    assert_eq!(entry.mode, SiteMode::Inline, "{what}: {entry:?}");
    // Named by the function's address, run after the store-exclusive and the retry
    // branch.
    assert_eq!(entry.vaddr, add, "{what}: {entry:?}");
    assert_eq!(
        Some(entry.file_off),
        file_offset(&orig, store + 8),
        "{what}: {entry:?}"
    );
    let b = std::fs::read(&traced).unwrap();
    assert_eq!(
        bytes_at(&b, add, store + 8),
        bytes_at(&data, add, store + 8),
        "{what}: the sequence was patched"
    );

    let n = ROUNDS.to_string();
    let want = run_qemu_aarch64(&orig, &[&n]).ok();
    let trace = tmp.join("atomics.utrace");
    let out = tracer_record_qemu(&trace, &traced, &[&n]);
    assert_same_behaviour(what, &without_tracer_lines(&out), &want);
    let calls = 4 * ROUNDS;
    assert!(
        want.stdout_str().contains(&format!("counter {calls} ")),
        "{what}: {}",
        want.stdout_str()
    );
    let rep = report_json(&trace);
    let count = |kind: &str| -> u64 {
        rep["functions"]
            .as_array()
            .expect("functions")
            .iter()
            .filter(|f| f["function"] == "at_add" && f["kind"] == kind)
            .map(|f| f["count"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(count("entry"), calls, "{what}: entries");
    assert_eq!(count("exit"), calls, "{what}: exits");
}
