//! Programs a session's command starts that may end before the tracer has attached
//! their binary (tests/fixtures/short.c): through `sh -c` and through `xargs -P2`. A
//! rewritten program started by `tracer record -- CMD` waits at its first record
//! until the flush uprobe is in place (`tracer_common::USER_SESSION`), so every
//! process delivers exactly the calls kernel uprobes count in it on the original; one
//! started without a session does not wait at all (strace: no `ppoll`).

use std::path::Path;
use std::process::Command;

use tests::*;

/// `script` run by `sh -c` with `$P` the program: the original under kernel uprobes,
/// then the rewritten one under `tracer record`; the calls per process must agree and
/// equal `want` (sorted).
fn check(tag: &str, script: &str, want: &[u64]) {
    let tmp = TempDir::new(tag);
    let (orig, traced, trace) = (
        tmp.join("short"),
        tmp.join("short.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("short.c")], &["-O2"], &orig);
    rewrite(&orig, Some(&traced), &["sh_call"]);
    let sh = |prog: &Path| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script).env("P", prog);
        c
    };
    let (want_out, events) =
        oracle::run_with_probes(&[(orig.as_path(), "sh_call")], &mut sh(&orig), RUN_TIMEOUT);
    let oracle = counts_per_process(events.iter().map(|e| e.tid));
    assert_eq!(oracle, want, "{tag}: kernel uprobes on the original");
    let out = tracer_record_with(
        &[],
        &trace,
        Path::new("/bin/sh"),
        &["-c", script],
        &[("P", traced.as_os_str())],
    );
    let mut got = without_tracer_lines(&out)
        .stdout_str()
        .lines()
        .map(String::from)
        .collect::<Vec<_>>();
    let mut expect = want_out
        .stdout_str()
        .lines()
        .map(String::from)
        .collect::<Vec<_>>();
    got.sort();
    expect.sort();
    assert_eq!(got, expect, "{tag}: output\n{}", out.describe());
    let recs = dump(&trace);
    assert_eq!(
        counts_per_process(recs.iter().map(|r| r.pid)),
        oracle,
        "{tag}: records per process"
    );
    let v = report_json(&trace);
    let books = &v["books"];
    assert_eq!(books["dropped"], 0, "{tag}: {books}");
    assert_eq!(books["balanced"], true, "{tag}: {books}");
}

#[test]
fn a_hundred_short_programs_through_a_shell() {
    check(
        "short-sh",
        r#"i=0; while [ $i -lt 100 ]; do "$P" 20 || exit 1; i=$((i+1)); done"#,
        &[20; 100],
    );
}

#[test]
fn a_process_tree_through_xargs() {
    // 30 programs, two at a time, each with its own count of calls.
    let want: Vec<u64> = (1..=30).collect();
    check("short-xargs", r#"seq 1 30 | xargs -P2 -n1 "$P""#, &want);
}

#[test]
fn a_program_without_a_session_does_not_wait() {
    let tmp = TempDir::new("short-nowait");
    let (orig, traced, log) = (
        tmp.join("short"),
        tmp.join("short.traced"),
        tmp.join("strace"),
    );
    compile("gcc", &[fixture("short.c")], &["-O2"], &orig);
    rewrite(&orig, Some(&traced), &["sh_call"]);
    let want = run(Command::new(&orig).arg("5000"), RUN_TIMEOUT);
    // Alone: not one poll or sleep. With descriptor USER_DRAIN_FD a stream socket
    // whose other end is closed (a session that ended): one poll, which returns at
    // once.
    let ended = "import os, socket, sys\n\
                 a, b = socket.socketpair()\n\
                 a.close()\n\
                 os.dup2(b.fileno(), 1021)\n\
                 os.execv(sys.argv[1], sys.argv[1:])";
    for (how, polls) in [(None, 0), (Some(ended), 1)] {
        let mut c = Command::new("strace");
        c.args([
            "-f",
            "-qq",
            "-e",
            "signal=none",
            "-e",
            "trace=ppoll,poll,nanosleep,clock_nanosleep",
            "-o",
        ])
        .arg(&log);
        if let Some(py) = how {
            c.args(["python3", "-c", py]);
        }
        let out = run(c.arg(&traced).arg("5000"), RUN_TIMEOUT);
        assert_same_behaviour("rewritten, no session", &out, &want);
        let calls = std::fs::read_to_string(&log).unwrap();
        let waits: Vec<&str> = calls.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            waits.len(),
            polls,
            "{how:?}: system calls that may wait:\n{calls}"
        );
        assert!(
            waits
                .iter()
                .all(|l| l.contains("ppoll(") && l.contains("POLLHUP")),
            "{calls}"
        );
    }
}
