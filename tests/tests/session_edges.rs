//! Session edge cases: records still buffered when the program calls exec are
//! delivered (the image they live in is about to go); trace files are private (0600); a
//! trace asked for in a directory that does not exist is refused before anything runs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use tests::*;

#[test]
fn exec_delivers_buffered_records() {
    let tmp = TempDir::new("exec");
    let (orig, traced, trace) = (
        tmp.join("exec"),
        tmp.join("exec.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("exec.c")], &["-O2"], &orig);
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "step".as_ref(),
    ])
    .ok();
    let want = run(Command::new(&orig).arg("100"), RUN_TIMEOUT).ok();
    let out = tracer_record(&trace, &traced, &["100"], &[]);
    assert_eq!(out.stdout_str(), want.stdout_str());
    assert_eq!(out.status(), 0, "{}", out.describe());
    let recs = dump(&trace);
    let got: Vec<u64> = recs
        .iter()
        .filter(|r| &*r.symbol == "step")
        .map(|r| r.value)
        .collect();
    assert_seq_eq(
        &got,
        &(0..100).collect::<Vec<u64>>(),
        "step() calls before exec",
    );
    let mode = std::fs::metadata(&trace).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "trace file mode {mode:o}");
}

#[test]
fn a_trace_in_a_missing_directory_is_refused_before_the_command_runs() {
    let tmp = TempDir::new("missing-dir");
    let (trace, marker) = (tmp.join("no/such/dir/t.utrace"), tmp.join("ran"));
    for flags in [&[][..], &["--user"]] {
        let _g = tracing_lock();
        let mut c = record_command(flags, &trace, Path::new("touch"));
        let o = run(c.arg(&marker), RUN_TIMEOUT);
        assert_ne!(o.code, Some(0), "{flags:?}: {}", o.describe());
        let err = o.stderr_str();
        assert!(
            err.contains("there is no directory") && err.contains("no/such/dir"),
            "{flags:?}: {err}"
        );
        assert!(!marker.exists(), "{flags:?}: the command ran");
    }
}
