//! Circular buffers (`--buffer-kind circular | fast-circular`): nothing is flushed;
//! when a thread exits, or takes a crash signal, its buffer is delivered whole, oldest
//! first, and the trace holds exactly its last records (the ring's size: 1024 records
//! here, 2048 for the 64 KiB fast ring). A SIGSEGV shows the calls leading up to it
//! (`tracer report --last N`, newest first). x86-64 through the kernel; AArch64 under
//! qemu-user with the user-space drain. The bbbuf case: blocks and memory accesses
//! (access runs, pairs) in a circular buffer, the last of them checked against the
//! addresses the program prints, down to the faulting store.

use std::path::Path;
use std::process::Command;

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
