//! Session edge cases: records still buffered when the program calls exec are
//! delivered (the image they live in is about to go); trace files are private (0600).

use std::os::unix::fs::PermissionsExt;
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
