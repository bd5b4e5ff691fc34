//! Shared library: libfx.so and a program linking it, both rewritten; the rewritten
//! program runs with LD_LIBRARY_PATH pointing at the rewritten library. Same output and
//! exit code as the original; exactly the expected records, each attributed to the
//! right binary.

use std::path::Path;
use std::process::Command;

use tests::fixture_oracle::app_so::{APP_FNS, LIB_FNS, build, expected, expected_output};
use tests::*;

fn run_case(cc: &str, opt: &str) {
    run_case_with(cc, opt, &[]);
}

/// `tflags`: extra `tracer record` flags (`--user`: the user-space drain).
fn run_case_with(cc: &str, opt: &str, tflags: &[&str]) {
    let what = format!("shared library, {cc} {opt} {}", tflags.join(" "));
    let tmp = TempDir::new(&format!("shlib-{cc}{opt}{}", tflags.join("")));
    let (od, td) = (tmp.join("orig"), tmp.join("traced"));
    std::fs::create_dir_all(&od).unwrap();
    std::fs::create_dir_all(&td).unwrap();
    let (lib, app) = build(cc, &[opt, "-g"], &od);
    let with_lib = |c: &mut Command, dir: &Path| {
        c.env("LD_LIBRARY_PATH", dir);
    };

    let (want_stdout, want_code) = expected_output();
    let mut c = Command::new(&app);
    with_lib(&mut c, &od);
    let o = run(&mut c, RUN_TIMEOUT);
    assert_eq!(
        (o.stdout_str(), o.status()),
        (want_stdout, want_code),
        "{what}: original: {}",
        o.describe()
    );

    // The fixture really makes these entries (kernel uprobes on the original files).
    let mut probes: Vec<(&Path, &str)> = APP_FNS.iter().map(|f| (app.as_path(), *f)).collect();
    probes.extend(LIB_FNS.iter().map(|f| (lib.as_path(), *f)));
    let mut c = Command::new(&app);
    with_lib(&mut c, &od);
    let (_, events) = oracle::run_with_probes(&probes, &mut c, RUN_TIMEOUT);
    let seq: Vec<(String, u64)> = events.iter().map(|e| (e.symbol.clone(), e.value)).collect();
    assert_seq_eq(
        &seq,
        &expected(),
        &format!("{what}: FIXTURE CHECK (kernel uprobes on the original build)"),
    );

    let (tlib, tapp) = (td.join("libfx.so"), td.join("app"));
    let (_, _, lib_meta) = rewrite(&lib, Some(&tlib), &[]);
    let (_, _, app_meta) = rewrite(&app, Some(&tapp), &[]);
    for (m, names) in [(&lib_meta, &LIB_FNS[..]), (&app_meta, &APP_FNS[..])] {
        for n in names {
            assert!(m.sites.iter().any(|s| s.name == *n), "{what}: no site {n}");
        }
    }

    let mut c = Command::new(&tapp);
    with_lib(&mut c, &td);
    let t = run(&mut c, RUN_TIMEOUT);
    assert_same_output(&t, &o, &format!("{what}: rewritten"));

    let trace = tmp.join("app.utrace");
    let env = [("LD_LIBRARY_PATH", td.as_os_str())];
    record_same_output(tflags, &trace, &tapp, &env, &o, &what);

    let recs = dump(&trace);
    for r in &recs {
        let is_lib = r.binary.ends_with("libfx.so");
        assert!(
            is_lib || r.binary.ends_with("app"),
            "{what}: record of an unknown binary: {r:?}"
        );
        let m = if is_lib { &lib_meta } else { &app_meta };
        assert!(
            m.sites
                .iter()
                .any(|s| s.id == r.site && *s.name == *r.symbol),
            "{what}: record with a site that {} does not have: {r:?}",
            r.binary
        );
        if APP_FNS.contains(&&*r.symbol) {
            assert!(!is_lib, "{what}: {r:?} attributed to the library");
        }
        if LIB_FNS.contains(&&*r.symbol) {
            assert!(is_lib, "{what}: {r:?} not attributed to the library");
        }
    }
    let followed: Vec<&Rec> = recs
        .iter()
        .filter(|r| APP_FNS.contains(&&*r.symbol) || LIB_FNS.contains(&&*r.symbol))
        .collect();
    let tids = by_tid(followed.iter().copied());
    assert_eq!(
        tids.len(),
        1,
        "{what}: followed functions on several threads"
    );
    assert_eq!(tids[0].0, followed[0].pid, "{what}: not the main thread");
    // Each binary has its own per-thread buffer, so delivery order is program order only
    // within a binary: check each binary's records in delivery order...
    let mut per_bin: Vec<Vec<&Rec>> = Vec::new();
    for (names, bin) in [(&APP_FNS[..], "app"), (&LIB_FNS[..], "libfx.so")] {
        let recs: Vec<&Rec> = followed
            .iter()
            .copied()
            .filter(|r| names.contains(&&*r.symbol))
            .collect();
        let got: Vec<(String, u64)> = recs
            .iter()
            .map(|r| (r.symbol.to_string(), r.value))
            .collect();
        let want: Vec<(String, u64)> = expected()
            .into_iter()
            .filter(|(n, _)| names.contains(&n.as_str()))
            .collect();
        assert_seq_eq(
            &got,
            &want,
            &format!("{what}: trace, records of {bin} in delivery order"),
        );
        per_bin.push(recs);
    }
    // ...then the interleaving: walking the expected program order, the time stamps
    // never decrease (ties are possible: the TSC can advance by less than 1 ns).
    let mut next = [0usize; 2];
    let mut last: Option<&Rec> = None;
    for (name, _) in expected() {
        let b = if APP_FNS.contains(&name.as_str()) {
            0
        } else {
            1
        };
        let r = per_bin[b][next[b]];
        next[b] += 1;
        if let Some(l) = last {
            let (lt, t) = (l.time_ns.expect("time"), r.time_ns.expect("time"));
            assert!(
                t >= lt,
                "{what}: {r:?} comes after {l:?} in the program but has an earlier time"
            );
        }
        last = Some(r);
    }
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped records");
    check_report_matches_dump(&rep, &recs);
}

#[test]
fn shared_lib_gcc_o0() {
    run_case("gcc", "-O0");
}
#[test]
fn shared_lib_gcc_o2() {
    run_case("gcc", "-O2");
}
#[test]
fn shared_lib_clang_o0() {
    run_case("clang", "-O0");
}
#[test]
fn shared_lib_clang_o2() {
    run_case("clang", "-O2");
}
/// The user-space drain: two RW areas (app and library) send over the same socket.
#[test]
fn user_shared_lib_gcc_o2() {
    run_case_with("gcc", "-O2", &["--user"]);
}
