//! Circular buffers (`--buffer-kind circular | fast-circular`): nothing is flushed;
//! when a thread exits, or takes a crash signal, its buffer is delivered whole, oldest
//! first, and the trace holds exactly its last records (the ring's size: 1024 records
//! here, 2048 for the 64 KiB fast ring). A SIGSEGV shows the calls leading up to it
//! (`tracer report --last N`, newest first). x86-64 through the kernel; AArch64 under
//! qemu-user with the user-space drain. A stub that reserves several records at once
//! (an entry and a block at one instruction) keeps them in its own fast ring when the
//! reservation meets the ring's end (`ring_threads.c`). The bbbuf case: blocks and
//! memory accesses (access runs, pairs) in a circular buffer, the last of them checked
//! against the addresses the program prints, down to the faulting store.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use tracer_common::meta::SiteKind;

use tests::*;
use tracer_common::{FLAG_MEM_READ, FLAG_MEM_WRITE};

const N: u64 = 5000;

fn rewrite_ring(orig: &Path, traced: &Path, kind: &str) -> tracer_common::meta::Metadata {
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--buffer-kind".as_ref(),
        kind.as_ref(),
        "--buffer-records".as_ref(),
        if kind == "circular" { "1024" } else { "2048" }.as_ref(),
        "--functions".as_ref(),
        "step".as_ref(),
        "crash_here".as_ref(),
    ])
    .ok();
    metadata(traced)
}

/// The ring's records: the last `size` calls of step(), then crash_here(NULL) if it
/// crashed.
fn check_ring(recs: &[Rec], size: u64, crashed: bool, what: &str) {
    let mut want: Vec<(String, u64)> = Vec::new();
    let steps = if crashed { size - 1 } else { size };
    want.extend((N - steps..N).map(|i| ("step".to_string(), i)));
    if crashed {
        want.push(("crash_here".into(), 0));
    }
    let got: Vec<(String, u64)> = recs
        .iter()
        .map(|r| (r.symbol.to_string(), r.value))
        .collect();
    assert_seq_eq(&got, &want, what);
}

fn x86_case(kind: &str, crash: bool) {
    let what = format!(
        "circular x86-64 {kind} {}",
        if crash { "segv" } else { "exit" }
    );
    let tmp = TempDir::new(&format!("ring-{kind}{crash}"));
    let (orig, traced, trace) = (
        tmp.join("crash"),
        tmp.join("crash.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("crash.c")], &["-O2"], &orig);
    let meta = rewrite_ring(&orig, &traced, kind);
    let size = u64::from(meta.buf_records);
    let mode = if crash { "segv" } else { "exit" };
    let n = N.to_string();
    let want = run(Command::new(&orig).args([n.as_str(), mode]), RUN_TIMEOUT);
    assert_eq!(
        want.signal.is_some() || want.status() > 128,
        crash,
        "{what}: {}",
        want.describe()
    );
    assert_same_behaviour(
        &what,
        &run(Command::new(&traced).args([n.as_str(), mode]), RUN_TIMEOUT),
        &want,
    );
    let out = tracer_record(&trace, &traced, &[&n, mode], &[]);
    assert_eq!(out.stdout_str(), want.stdout_str(), "{what}: output");
    let recs = dump(&trace);
    let rep = report(&trace);
    check_report_matches_dump(&rep, &recs);
    check_ring(&recs, size, crash, &what);
    if crash {
        // The report's view: newest first, the crash site on top.
        let mut c = Command::new(tracer_bin());
        c.args(["report", "--last", "3"]).arg(&trace);
        let text = run(&mut c, TRACE_TIMEOUT).ok().stdout_str();
        let lines: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("last 3 records"))
            .collect();
        assert!(lines.len() >= 4, "{what}: no --last section:\n{text}");
        // "site function <- caller": both called from main (the caller is known once
        // the session saw where the binary is loaded).
        let split = |l: &str| {
            let l = l.trim_end();
            l.split_once(" <- ")
                .map_or((l.to_string(), "main".to_string()), |(a, b)| {
                    (a.to_string(), b.to_string())
                })
        };
        let ((at1, from1), (at2, from2)) = (split(lines[1]), split(lines[2]));
        assert!(
            at1.ends_with("crash_here") && from1 == "main",
            "{what}: {text}"
        );
        assert!(
            lines[2].contains(&format!("{:#x}", N - 1)) && at2.ends_with("step") && from2 == "main",
            "{what}: {text}"
        );
    }
}

#[test]
fn circular_exit() {
    x86_case("circular", false);
}

#[test]
fn circular_segv() {
    x86_case("circular", true);
}

#[test]
fn fast_circular_exit() {
    x86_case("fast-circular", false);
}

#[test]
fn fast_circular_segv() {
    x86_case("fast-circular", true);
}

/// DynamoRIO's bbbuf sample, with memory accesses: `bbbuf.c`'s walk() over its items,
/// then the crash; the ring ends with the last item's three loads (one run: a pair and
/// a single, the last two addresses shifted by the `add $0x20,%rdi` between), the load
/// of its `next` and the store through it (address 0).
#[test]
fn bbbuf_last_blocks_and_accesses_before_a_crash() {
    let tmp = TempDir::new("bbbuf");
    let (orig, traced, trace) = (
        tmp.join("bbbuf"),
        tmp.join("bbbuf.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("bbbuf.c")], &["-O2"], &orig);
    let out = rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--sites".as_ref(),
        "block,memory".as_ref(),
        "--buffer-kind".as_ref(),
        "circular".as_ref(),
        "--buffer-records".as_ref(),
        "1024".as_ref(),
        "--functions".as_ref(),
        "walk".as_ref(),
        "crash_at".as_ref(),
    ]);
    let text = out.ok().stdout_str();
    assert!(text.contains("memory runs: 3 sites in 1 runs"), "{text}");
    let args = ["5000", "segv"];
    let want = run(Command::new(&orig).args(args), RUN_TIMEOUT);
    assert!(
        want.signal.is_some() || want.status() > 128,
        "{}",
        want.describe()
    );
    let got = tracer_record(&trace, &traced, &args, &[]);
    // The items' address differs from run to run (ASLR): the sum must not.
    let sum = |o: &str| {
        o.lines()
            .find(|l| l.starts_with("sum="))
            .map(str::to_string)
    };
    assert_eq!(
        sum(&got.stdout_str()),
        sum(&want.stdout_str()),
        "bbbuf: output"
    );
    assert!(sum(&want.stdout_str()).is_some());
    // "items=0x... size=32 n=5000": where the loads and the stores go.
    let line = got.stdout_str();
    let items = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("items="))
        .and_then(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).ok())
        .expect("the program prints its items");
    let recs = dump(&trace);
    let mem: Vec<(String, u64, u32)> = recs
        .iter()
        .filter(|r| r.flags & (FLAG_MEM_READ | FLAG_MEM_WRITE) != 0)
        .map(|r| {
            (
                r.symbol.to_string(),
                r.value,
                r.flags & (FLAG_MEM_READ | FLAG_MEM_WRITE),
            )
        })
        .collect();
    let item = |i: u64, field: u64| items + 32 * i + 8 * field;
    let mut tail: Vec<(String, u64, u32)> = (4990..5000)
        .flat_map(|i| (0..3).map(move |f| ("walk".to_string(), item(i, f), FLAG_MEM_READ)))
        .collect();
    tail.push(("crash_at".into(), item(4999, 3), FLAG_MEM_READ));
    tail.push(("crash_at".into(), 0, FLAG_MEM_WRITE));
    assert!(mem.len() > tail.len(), "bbbuf: {} accesses", mem.len());
    assert_seq_eq(
        &mem[mem.len() - tail.len()..],
        &tail,
        "bbbuf: the last accesses",
    );
    // Every block and access fits the ring: 1024 records.
    assert!(recs.len() >= 1024, "bbbuf: {} records", recs.len());
}

fn a64_case(kind: &str, crash: bool) {
    let what = format!(
        "circular AArch64 {kind} {}",
        if crash { "segv" } else { "exit" }
    );
    if !have_qemu_aarch64(&what) {
        return;
    }
    let tmp = TempDir::new(&format!("ring-a64-{kind}{crash}"));
    let (orig, traced, trace) = (
        tmp.join("crash"),
        tmp.join("crash.traced"),
        tmp.join("t.utrace"),
    );
    compile(
        "aarch64-linux-gnu-gcc",
        &[fixture("crash.c")],
        &["-O2"],
        &orig,
    );
    let meta = rewrite_ring(&orig, &traced, kind);
    let size = u64::from(meta.buf_records);
    let n = N.to_string();
    let mode = if crash { "segv" } else { "exit" };
    let out = tracer_record_qemu(&trace, &traced, &[&n, mode]);
    assert!(
        out.stdout_str().starts_with("crash n=5000 "),
        "{what}: {}",
        out.describe()
    );
    let recs = dump(&trace);
    check_ring(&recs, size, crash, &what);
}

#[test]
fn aarch64_circular_exit() {
    a64_case("circular", false);
}

#[test]
fn aarch64_fast_circular_segv() {
    a64_case("fast-circular", true);
}

/// Calls of ring_a by thread A and of ring_b by thread B (`ring_threads.c`): A's 3 records
/// a call (2 in one reservation, then its exit's) meet its ring's end inside a
/// reservation at calls 1365 + 2048k; B fills its ring first.
const RING_A_CALLS: u64 = 5000;
const RING_B_CALLS: u64 = 1000;

/// What makes a reservation of two records in ring_a and ring_b.
#[derive(Clone, Copy, Debug)]
enum TwoRecords {
    /// `--sites entry,exit,block`: the entry and the first block share a stub.
    EntryAndBlock,
    /// `--sites usdt,exit`: a probe of 3 arguments (i, i + 1, i + 2).
    Usdt3,
}

impl TwoRecords {
    fn sites(self) -> &'static str {
        match self {
            TwoRecords::EntryAndBlock => "entry,exit,block",
            TwoRecords::Usdt3 => "usdt,exit",
        }
    }

    /// (symbol, kind, value) of the records of one call `f(i)` that returned `ret`; a
    /// block's value (its run-time address) is left out as 0.
    fn call(self, f: &str, i: u64, ret: u64) -> [(String, SiteKind, u64); 3] {
        let exit = (f.to_string(), SiteKind::FunctionExit, ret);
        match self {
            TwoRecords::EntryAndBlock => [
                (f.to_string(), SiteKind::FunctionEntry, i),
                (f.to_string(), SiteKind::Block, 0),
                exit,
            ],
            TwoRecords::Usdt3 => {
                // Arguments 1-2 in the first record, 3 in the second.
                let probe = f.replacen('_', ":", 1);
                [
                    (probe.clone(), SiteKind::Usdt, i),
                    (probe, SiteKind::Usdt, i + 2),
                    exit,
                ]
            }
        }
    }

    /// That ring_a's two records come from one stub.
    fn check_sites(self, meta: &Metadata, what: &str) {
        let site = |name: &str, kind| meta.sites.iter().find(|s| s.name == name && s.kind == kind);
        match self {
            TwoRecords::EntryAndBlock => {
                let entry = site("ring_a", SiteKind::FunctionEntry).map(|s| s.vaddr);
                let block = site("ring_a", SiteKind::Block).map(|s| s.vaddr);
                assert!(entry.is_some() && entry == block, "{what}: {meta:?}");
            }
            TwoRecords::Usdt3 => {
                let probe = site("ring:a", SiteKind::Usdt).map(|s| s.nargs);
                assert_eq!(probe, Some(3), "{what}: {meta:?}");
            }
        }
    }
}

/// Each thread's records are the last ones of its own calls, in order, with at most
/// the 2 records a reservation abandoned at its ring's end missing from the ring's
/// 2048; the thread ids come from the program itself.
fn check_ring_threads(case: TwoRecords, recs: &[Rec], meta: &Metadata, stdout: &str, what: &str) {
    let tid = |name: &str| -> u32 {
        let key = format!("{name}=");
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&key)?.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no {name} in {stdout:?}"))
    };
    case.check_sites(meta, what);
    let kinds: HashMap<u32, SiteKind> = meta.sites.iter().map(|s| (s.id, s.kind)).collect();
    let size = meta.buf_records as usize;
    let stream = |f: &str, calls: u64, ret: fn(u64) -> u64| -> Vec<(String, SiteKind, u64)> {
        (0..calls).flat_map(|i| case.call(f, i, ret(i))).collect()
    };
    let threads = [
        ("tid_a", stream("ring_a", RING_A_CALLS, |i| i * 7 % 13)),
        ("tid_b", stream("ring_b", RING_B_CALLS, |i| i * 5 % 11)),
    ];
    for (name, want) in threads {
        let t = tid(name);
        let got: Vec<(String, SiteKind, u64)> = recs
            .iter()
            .filter(|r| r.tid == t)
            .map(|r| {
                let kind = kinds[&r.site];
                let value = if kind == SiteKind::Block { 0 } else { r.value };
                (r.symbol.to_string(), kind, value)
            })
            .collect();
        let what = format!("{what}: thread {name} ({t})");
        assert!(
            (size - 2..=size).contains(&got.len()),
            "{what}: {} records in a ring of {size}",
            got.len()
        );
        assert_seq_eq(&got, &want[want.len() - got.len()..], &what);
    }
}

fn rewrite_ring_threads(orig: &Path, traced: &Path, case: TwoRecords) -> Metadata {
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--buffer-kind".as_ref(),
        "fast-circular".as_ref(),
        "--sites".as_ref(),
        case.sites().as_ref(),
        "--functions".as_ref(),
        "ring_a".as_ref(),
        "--functions".as_ref(),
        "ring_b".as_ref(),
    ])
    .ok();
    metadata(traced)
}

const RING_CASES: [TwoRecords; 2] = [TwoRecords::EntryAndBlock, TwoRecords::Usdt3];

/// Before the fix, the second record of A's reservation at ring offset 0xffe0 went to
/// offset 0x10000: B's ring, which then held a ring_a record (and a probe of more than
/// 2 arguments was refused in fast rings for that reason).
#[test]
fn fast_ring_reservations_of_two_records_stay_in_their_ring() {
    let tmp = TempDir::new("ring-threads");
    let orig = tmp.join("ring_threads");
    compile(
        "gcc",
        &[fixture("ring_threads.c")],
        &["-O2", "-pthread"],
        &orig,
    );
    for case in RING_CASES {
        let what = format!("fast ring, two-record stubs ({case:?}), x86-64");
        let (traced, trace) = (
            tmp.join(format!("{case:?}.traced")),
            tmp.join(format!("{case:?}.utrace")),
        );
        let meta = rewrite_ring_threads(&orig, &traced, case);
        let (na, nb) = (RING_A_CALLS.to_string(), RING_B_CALLS.to_string());
        let out = tracer_record(&trace, &traced, &[&na, &nb], &[]);
        check_ring_threads(case, &dump(&trace), &meta, &out.stdout_str(), &what);
    }
}

#[test]
fn aarch64_fast_ring_reservations_of_two_records_stay_in_their_ring() {
    if !have_qemu_aarch64("fast ring, two-record stubs, AArch64") {
        return;
    }
    let tmp = TempDir::new("ring-threads-a64");
    let orig = tmp.join("ring_threads");
    let incf = a64_sdt_include(tmp.path());
    compile(
        "aarch64-linux-gnu-gcc",
        &[fixture("ring_threads.c")],
        &["-O2", "-pthread", &incf],
        &orig,
    );
    for case in RING_CASES {
        let what = format!("fast ring, two-record stubs ({case:?}), AArch64");
        let (traced, trace) = (
            tmp.join(format!("{case:?}.traced")),
            tmp.join(format!("{case:?}.utrace")),
        );
        let meta = rewrite_ring_threads(&orig, &traced, case);
        let (na, nb) = (RING_A_CALLS.to_string(), RING_B_CALLS.to_string());
        let out = tracer_record_qemu(&trace, &traced, &[&na, &nb]);
        check_ring_threads(case, &dump(&trace), &meta, &out.stdout_str(), &what);
    }
}
