//! Trace files are portable between architectures: a trace recorded from x86-64 binaries
//! (kernel path) and one recorded from AArch64 binaries (user-space drain under
//! qemu-user) give byte-identical `report --json` and `dump` output whether read by the
//! x86-64 `tracer` or by the aarch64 one (run under qemu-user).
//!
//! The aarch64 tracer is built by `cargo xtask test` (aarch64-unknown-linux-musl), which
//! passes its path in UTRACE_AARCH64_TRACER.

use std::path::{Path, PathBuf};
use std::process::Command;

use tests::*;

fn aarch64_tracer() -> PathBuf {
    let p = std::env::var_os("UTRACE_AARCH64_TRACER")
        .map(PathBuf::from)
        .expect(
            "UTRACE_AARCH64_TRACER is not set: run the tests with `cargo xtask test`, which \
         builds the aarch64 tracer",
        );
    assert!(p.is_file(), "no aarch64 tracer at {}", p.display());
    p
}

/// stdout of `tracer ARGS` with the host tracer and with the aarch64 one under qemu.
fn both(args: &[&Path]) -> (String, String) {
    let host = run(Command::new(tracer_bin()).args(args), TRACE_TIMEOUT);
    assert_eq!(host.status(), 0, "host tracer: {}", host.describe());
    let a64 = run(
        Command::new("qemu-aarch64")
            .arg(aarch64_tracer())
            .args(args),
        TRACE_TIMEOUT,
    );
    assert_eq!(a64.status(), 0, "aarch64 tracer: {}", a64.describe());
    (host.stdout_str(), a64.stdout_str())
}

fn check(trace: &Path, calls: u64) {
    for cmd in ["report", "dump"] {
        let mut args: Vec<&Path> = vec![Path::new(cmd), trace];
        if cmd == "report" {
            args.insert(1, Path::new("--json"));
        }
        let (host, a64) = both(&args);
        assert!(!host.is_empty(), "{cmd}: no output");
        assert_eq!(
            host,
            a64,
            "{cmd} of {} differs between hosts",
            trace.display()
        );
    }
    let rep = report(trace);
    assert_eq!(
        rep.count_of("hit"),
        calls,
        "records of hit in {}",
        trace.display()
    );
}

#[test]
fn traces_read_the_same_on_both_architectures() {
    let tmp = TempDir::new("portable");
    let calls = 5000u64;
    let arg = calls.to_string();
    let want = format!("one total={calls}\n");

    // Recorded from x86-64 binaries through the kernel.
    let x86 = tmp.join("stress-x86");
    compile("gcc", &[fixture("stress.c")], &["-O2", "-pthread"], &x86);
    let (x86_traced, _, _) = rewrite(&x86, Some(&tmp.join("stress-x86.traced")), &[]);
    let x86_trace = tmp.join("x86.utrace");
    let r = tracer_record(&x86_trace, &x86_traced, &["one", &arg], &[]);
    assert_eq!(
        (r.stdout_str(), r.status()),
        (want.clone(), 0),
        "{}",
        r.describe()
    );
    check(&x86_trace, calls);

    // Recorded from AArch64 binaries with the user-space drain under qemu-user.
    let a64 = tmp.join("stress-a64");
    compile(
        "aarch64-linux-gnu-gcc",
        &[fixture("stress.c")],
        &["-O2", "-pthread"],
        &a64,
    );
    let (a64_traced, _, _) = rewrite(&a64, Some(&tmp.join("stress-a64.traced")), &[]);
    let a64_trace = tmp.join("a64.utrace");
    let traced = a64_traced.as_os_str().to_str().unwrap();
    let r = tracer_record_with(
        &["--user", "--binary", traced],
        &a64_trace,
        Path::new("qemu-aarch64"),
        &["-L", "/usr/aarch64-linux-gnu", traced, "one", &arg],
        &[],
    );
    assert_eq!((r.stdout_str(), r.status()), (want, 0), "{}", r.describe());
    check(&a64_trace, calls);
}
