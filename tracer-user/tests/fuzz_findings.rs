//! Every trace file the fuzzer found a failure with (`fuzz/findings/trace_views/`, one
//! file each, named for the bug) goes through every view, with overflow checks on (the
//! release profile the tests use has them): the report, its JSON and the dump agree on
//! the records, the exports are written, and the flame graph either draws or says why
//! it cannot.

use std::path::{Path, PathBuf};

use tracer_user::views;

/// (finding, records in it): the count the readers must agree on.
const FINDINGS: &[(&str, u64)] = &[
    ("site_above_user_space", 67),
    ("times_summing_past_u64", 265),
];

fn findings_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/findings/trace_views")
}

#[test]
fn every_finding_is_listed() {
    let mut on_disk: Vec<String> = std::fs::read_dir(findings_dir())
        .expect("the findings directory")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = FINDINGS.iter().map(|f| f.0).collect();
    assert_eq!(on_disk, listed, "a new finding needs its line in FINDINGS");
}

#[test]
fn fuzz_findings_pass_every_view() {
    let out = std::env::temp_dir().join(format!("utrace-findings-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    for &(name, records) in FINDINGS {
        let trace = findings_dir().join(name);
        check_readers(&trace, records);
        check_exports(&trace, &out);
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// The text report, the JSON report and the dump read `records` records, no error.
fn check_readers(trace: &Path, records: u64) {
    let what = trace.display();
    let mut text = Vec::new();
    views::report(
        trace,
        &tracer_user::TimeRange::ALL,
        false,
        3,
        &[],
        &mut text,
    )
    .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains(&format!("records: {records} ")),
        "{what}: {text}"
    );
    let mut json = Vec::new();
    views::report(trace, &tracer_user::TimeRange::ALL, true, 3, &[], &mut json)
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let json: serde_json::Value = serde_json::from_slice(&json).expect("report --json");
    assert_eq!(json["records"], records, "{what}");
    assert_eq!(json["read_errors"], 0, "{what}");
    let mut dump = Vec::new();
    views::dump::dump(trace, &tracer_user::TimeRange::ALL, &mut dump)
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let lines = dump
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(lines as u64, records, "{what}: dump lines");
}

/// Chrome and Perfetto exports are written; the flame graph draws, or refuses with its
/// reason (these findings have no completed call).
fn check_exports(trace: &Path, out: &Path) {
    let what = trace.display();
    for format in ["chrome", "perfetto"] {
        let file = out.join(format);
        views::export::export(trace, &tracer_user::TimeRange::ALL, format, &file, &[])
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert!(
            std::fs::metadata(&file).unwrap().len() > 0,
            "{what}: {format}"
        );
    }
    let chrome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("chrome")).unwrap()).expect("chrome JSON");
    assert!(chrome.is_object() || chrome.is_array(), "{what}");
    let svg = out.join("svg");
    match views::flamegraph::flamegraph(trace, &tracer_user::TimeRange::ALL, &svg, None, &[]) {
        Ok(()) => assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg")),
        Err(e) => assert!(
            format!("{e:#}").contains("no completed function calls"),
            "{what}: {e:#}"
        ),
    }
}
