//! Processes that start with a copy of a traced thread's buffer (tests/fixtures/forks.c):
//! fork, a fork of a fork, vfork + exec and posix_spawn. Each process's records come
//! exactly once, under its own pid: its entries are the calls the kernel's uprobes
//! count in that process of the original program (110, 55, 20, 30, 40), and the
//! books balance.

use std::process::Command;

use tests::*;

#[test]
fn each_process_delivers_its_own_records_once() {
    let tmp = TempDir::new("forks");
    let (orig, traced, trace) = (
        tmp.join("forks"),
        tmp.join("forks.traced"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("forks.c")], &["-O2"], &orig);
    let (want, events) = oracle::run_with_probes(
        &[(orig.as_path(), "fk_call")],
        &mut Command::new(&orig),
        RUN_TIMEOUT,
    );
    // Each process is single-threaded: tid = pid.
    let oracle = counts_per_process(events.iter().map(|e| e.tid));
    assert_eq!(
        oracle,
        [20, 30, 40, 55, 110],
        "kernel uprobes on the original"
    );

    rewrite(&orig, Some(&traced), &["fk_call"]);
    let out = tracer_record(&trace, &traced, &[], &[]);
    assert_same_behaviour("under tracer record", &without_tracer_lines(&out), &want);
    let recs = dump(&trace);
    assert!(
        recs.iter().all(|r| r.symbol.as_ref() == "fk_call"),
        "only fk_call"
    );
    assert_eq!(
        counts_per_process(recs.iter().map(|r| r.pid)),
        oracle,
        "records per process"
    );
    let v = report_json(&trace);
    let books = &v["books"];
    assert_eq!(books["dropped"], 0, "{books}");
    assert_eq!(books["delivered"], 255, "{books}");
    assert_eq!(books["balanced"], true, "{books}");
}
