//! Programs that may end before the tracer has attached their binary
//! (tests/fixtures/short.c): started by a session's command through `sh -c` and
//! `xargs -P2`, through Python's subprocess (which closes the session descriptor), and
//! by a shell script during a system-wide session. A rewritten
//! program waits at its first record until the flush uprobe is in place
//! (`tracer_common::USER_SESSION`), so every process delivers exactly the calls kernel
//! uprobes count in it on the original; one the tracer cannot attach (an AArch64 guest
//! of qemu-user) is counted "lost before attach"; one started without a session does
//! not wait at all (strace: no `ppoll`).

use std::path::Path;
use std::process::Command;

use tests::*;

/// short.c built (with `flags`) and rewritten (`sh_call` traced) in a new directory.
fn build(tag: &str, flags: &[&str]) -> (TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = TempDir::new(tag);
    let (orig, traced) = (tmp.join("short"), tmp.join("short.traced"));
    compile("gcc", &[fixture("short.c")], flags, &orig);
    rewrite(&orig, Some(&traced), &["sh_call"]);
    (tmp, orig, traced)
}

/// `script` run by `sh -c` with `$P` the program: the original under kernel uprobes,
/// then the rewritten one under `tracer record`; the calls per process must agree and
/// equal `want` (sorted).
fn check(tag: &str, script: &str, want: &[u64]) {
    check_built(build(tag, &["-O2"]), tag, script, want);
}

fn check_built(
    (tmp, orig, traced): (TempDir, std::path::PathBuf, std::path::PathBuf),
    tag: &str,
    script: &str,
    want: &[u64],
) {
    let trace = tmp.join("t.utrace");
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
    assert_eq!(books["unattached"], 0, "{tag}: {books}");
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
fn the_first_program_of_a_session_in_every_link_mode() {
    // One program that runs for milliseconds, the first of its binary in the session,
    // forked by the shell or exec'd in its place. It must wait until the tracer says
    // its binary is attached: the breakpoint the kernel writes comes tens of
    // milliseconds before the drain is linked to it (found by `cargo xtask difftest`:
    // such programs delivered nothing, and were not counted lost either). Non-PIE
    // mappings are named without zero padding in /proc/PID/map_files (they were never
    // attached).
    for (link, flags) in [
        ("pie", &["-O2", "-fPIE", "-pie"][..]),
        ("no-pie", &["-O2", "-fno-pie", "-no-pie"]),
        ("static", &["-O2", "-static"]),
        ("static-pie", &["-O2", "-fPIE", "-static-pie"]),
    ] {
        for (how, script) in [
            ("fork", r#""$P" 100000; true"#),
            ("exec", r#"exec "$P" 100000"#),
        ] {
            let tag = format!("short-first-{link}-{how}");
            check_built(build(&tag, flags), &tag, script, &[100000]);
        }
    }
}

#[test]
fn a_process_tree_through_xargs() {
    // 30 programs, two at a time, each with its own count of calls.
    let want: Vec<u64> = (1..=30).collect();
    check("short-xargs", r#"seq 1 30 | xargs -P2 -n1 "$P""#, &want);
}

#[test]
fn programs_that_lost_the_session_descriptor_still_wait() {
    // Python's subprocess closes every descriptor above 2 (close_fds): the programs
    // find the session by its socket name instead, as the command's descendants.
    let py = r#"import os, subprocess
for n in range(1, 11): subprocess.run([os.environ["P"], str(n)], check=True)"#;
    let want: Vec<u64> = (1..=10).collect();
    check("short-closefds", &format!("python3 -c '{py}'"), &want);
}

/// short.c for AArch64, rewritten: a program a native session cannot attach (qemu-user
/// runs it; the kernel's uprobes do not reach the guest), or None (skip).
fn build_aarch64(tmp: &TempDir) -> Option<std::path::PathBuf> {
    if !have_qemu_aarch64("lost before attach") {
        return None;
    }
    let (orig, traced) = (tmp.join("short.a64"), tmp.join("short.a64.traced"));
    compile(
        "aarch64-linux-gnu-gcc",
        &[fixture("short.c")],
        &["-O2"],
        &orig,
    );
    rewrite(&orig, Some(&traced), &["sh_call"]);
    Some(traced)
}

#[test]
fn programs_that_wait_in_vain_are_counted_lost_before_attach() {
    let tmp = TempDir::new("short-unattached");
    let Some(guest) = build_aarch64(&tmp) else {
        return;
    };
    let (_native_dir, _, native) = build("short-unattached-native", &["-O2"]);
    let qemu = |prog: &Path| {
        let mut c = Command::new("qemu-aarch64");
        c.args(["-L", A64_SYSROOT]).arg(prog).arg("20");
        c
    };
    let want = run(&mut qemu(&guest), RUN_TIMEOUT);
    // Under record -- CMD: the guest waits its 10 s, gives up, runs on untraced.
    let trace = tmp.join("cmd.utrace");
    let g = guest.to_str().unwrap();
    let out = tracer_record_with(
        &[],
        &trace,
        Path::new("qemu-aarch64"),
        &["-L", A64_SYSROOT, g, "20"],
        &[],
    );
    // (Its stderr holds the tracer's warnings that it cannot attach the guest.)
    assert_eq!(out.stdout_str(), want.stdout_str(), "{}", out.describe());
    assert_eq!(out.code, want.code, "{}", out.describe());
    assert!(
        out.stderr_str().contains("1 program waited in vain"),
        "{}",
        out.describe()
    );
    let books = &report_json(&trace)["books"];
    assert_eq!(books["unattached"], 1, "{books}");
    assert_eq!(books["produced"], 0, "{books}");
    let text = run(
        Command::new(tracer_bin()).arg("report").arg(&trace),
        RUN_TIMEOUT,
    )
    .ok();
    assert!(
        text.stdout_str()
            .contains("lost before attach: 1 program waited in vain"),
        "{}",
        text.describe()
    );
    // System-wide: a native program in the session is attached and delivers every
    // call; the guest after it is held until the session ends (before the 10 s hold).
    let trace = tmp.join("sw.utrace");
    let _g = tracing_lock();
    let session = start_session(&["--system-wide", "--duration", "3"], &trace);
    let _ = run(Command::new(&native).arg("7"), RUN_TIMEOUT).ok();
    assert_same_behaviour(
        "guest in a system-wide session",
        &run(&mut qemu(&guest), RUN_TIMEOUT),
        &want,
    );
    finish_session(session, "system-wide session");
    let recs = dump(&trace);
    let ours: Vec<&Rec> = recs.iter().filter(|r| &*r.symbol == "sh_call").collect();
    assert_eq!(
        counts_per_process(ours.iter().map(|r| r.pid)),
        [7],
        "native records"
    );
    let books = &report_json(&trace)["books"];
    assert_eq!(books["unattached"], 1, "{books}");
    assert_eq!(books["balanced"], true, "{books}");
}

#[test]
fn a_system_wide_session_catches_programs_a_script_starts() {
    let (tmp, orig, traced) = build("short-sw", &["-O2"]);
    let trace = tmp.join("t.utrace");
    const COUNTS: [u64; 8] = [3, 5, 7, 11, 13, 17, 19, 23];
    let sh = |script: &str, prog: &Path| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script).env("P", prog);
        c
    };
    let (want, events) = oracle::run_with_probes(
        &[(orig.as_path(), "sh_call")],
        &mut sh(r#"for n in 3 5 7 11 13 17 19 23; do "$P" $n; done"#, &orig),
        RUN_TIMEOUT,
    );
    let oracle = counts_per_process(events.iter().map(|e| e.tid));
    assert_eq!(oracle, COUNTS, "kernel uprobes");
    // A copy of the rewritten program per run: each is a binary the session has not
    // attached yet when it starts.
    for n in COUNTS {
        std::fs::copy(&traced, tmp.join(format!("short.traced.{n}"))).unwrap();
    }
    let _g = tracing_lock();
    let session = start_session(&["--system-wide", "--duration", "4"], &trace);
    let out = run(
        &mut sh(
            r#"for n in 3 5 7 11 13 17 19 23; do "$P.$n" $n || exit 1; done"#,
            &traced,
        ),
        RUN_TIMEOUT,
    );
    assert_same_behaviour("during a system-wide session", &out, &want);
    finish_session(session, "system-wide session");
    let recs = dump(&trace);
    let ours: Vec<&Rec> = recs.iter().filter(|r| &*r.symbol == "sh_call").collect();
    assert_eq!(
        counts_per_process(ours.iter().map(|r| r.pid)),
        oracle,
        "records per process"
    );
    let v = report_json(&trace);
    assert_eq!(v["books"]["balanced"], true, "{}", v["books"]);
}

#[test]
fn a_program_without_a_session_does_not_wait() {
    let (tmp, orig, traced) = build("short-nowait", &["-O2"]);
    // No session may be listening (a command's session would let the program go at
    // once, but with a poll).
    let _g = tracing_lock();
    let log = tmp.join("strace");
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
