//! A SIGALRM handler (setitimer every 20 us) calls a traced function while the main loop
//! calls another one (fixtures/signal.c): the rewritten program's output is identical,
//! every delivered record has a valid site and a value from the expected set, and the
//! main loop's records are complete up to the bound explained below (and, as the
//! current stub promises, exactly complete and in order).

use std::collections::HashSet;
use std::process::Command;

use tests::*;

const N: u64 = 1_000_000;
const HANDLER_TAG: u64 = 0x51_0000_0000;

fn handler_calls(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("handler_calls="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no handler_calls= line in stderr: {stderr}"))
}

#[test]
fn signal_handler_records() {
    let tmp = TempDir::new("signal");
    let orig = tmp.join("signal");
    compile("gcc", &[fixture("signal.c")], &["-O2", "-g"], &orig);
    let want = format!("signal n={N} sum={}\n", N * (N - 1) / 2);
    let o = run(&mut Command::new(&orig), RUN_TIMEOUT);
    assert_eq!(
        (o.stdout_str(), o.status()),
        (want.clone(), 0),
        "original: {}",
        o.describe()
    );
    assert!(handler_calls(&o.stderr_str()) > 0, "the timer never fired");

    let traced = tmp.join("signal.traced");
    let (_, _, meta) = rewrite(&orig, Some(&traced), &[]);
    let t = run(&mut Command::new(&traced), RUN_TIMEOUT);
    assert_eq!(
        (t.stdout_str(), t.status()),
        (want.clone(), 0),
        "rewritten: {}",
        t.describe()
    );

    let trace = tmp.join("signal.utrace");
    let r = tracer_record(&trace, &traced, &[], &[]);
    assert_eq!(
        (r.stdout_str(), r.status()),
        (want, 0),
        "under tracer record: {}",
        r.describe()
    );
    let h = handler_calls(&r.stderr_str());
    assert!(h > 0, "the timer never fired under the tracer");

    let recs = dump(&trace);
    check_sites_valid(&recs, &[&meta]);
    let mut loop_vals = Vec::new();
    let mut handler_vals = Vec::new();
    for r in &recs {
        match &*r.symbol {
            "fx_in_loop" => {
                assert!(
                    r.value < N,
                    "fx_in_loop record with a value never passed: {r:?}"
                );
                loop_vals.push(r.value);
            }
            "fx_in_handler" => {
                assert!(
                    r.value & !0xffff_ffff == HANDLER_TAG && r.value & 0xffff_ffff < h,
                    "fx_in_handler record with a value never passed ({h} handler calls): {r:?}"
                );
                handler_vals.push(r.value & 0xffff_ffff);
            }
            _ => {}
        }
    }
    let distinct = |v: &[u64]| v.iter().collect::<HashSet<_>>().len() as u64;
    // The bound any design must meet: a stub reserves its record by moving the slot's
    // buffer pointer on by 32 and then writes the record. With a non-atomic reservation
    // (load the pointer, store it + 32), a handler that records while the interrupted
    // stub is between that load and that store reserves the same 32 bytes; the stub then
    // stores the same pointer again and writes over that one record. An invocation
    // interrupts at most one stub, so it costs at most one record:
    // main-loop records >= N - handler invocations (counted as distinct values, so that a
    // record delivered twice cannot hide a lost one).
    let loop_distinct = distinct(&loop_vals);
    assert!(
        loop_distinct + h >= N,
        "only {loop_distinct} of {N} distinct main-loop records with {h} handler invocations"
    );
    assert!(
        !handler_vals.is_empty(),
        "no record of {h} handler invocations"
    );
    // What the current stub promises (tracer-common/src/layout.rs, Signals: the
    // reservation is one xadd, an in-flight counter defers flushes): nothing lost, torn
    // or duplicated, and each kind of record in program order (a handler's record may
    // precede the one it interrupted, never the records before it).
    assert_eq!(
        loop_vals.len() as u64,
        N,
        "main-loop records ({loop_distinct} distinct)"
    );
    assert!(
        loop_vals.iter().enumerate().all(|(i, v)| *v == i as u64),
        "main-loop records out of order or missing: first bad index {:?}",
        loop_vals
            .iter()
            .enumerate()
            .position(|(i, v)| *v != i as u64)
    );
    assert_eq!(
        handler_vals.len() as u64,
        h,
        "handler records ({} distinct)",
        distinct(&handler_vals)
    );
    assert!(
        handler_vals.iter().enumerate().all(|(i, v)| *v == i as u64),
        "handler records out of order or missing"
    );
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "dropped records");
    check_report_matches_dump(&rep, &recs);
}
