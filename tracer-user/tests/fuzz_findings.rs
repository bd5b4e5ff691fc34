//! Every trace file the fuzzer found a failure with (`fuzz/findings/trace_views/`, one
//! file each, named for the bug) goes through every view without a panic. (Overflow
//! checks are on only in the fuzz build, which `cargo xtask test` replays these with.)

use std::{io, path::PathBuf};

use tracer_user::views;

#[test]
fn fuzz_findings_pass_every_view() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/findings/trace_views");
    let out = std::env::temp_dir().join(format!("utrace-findings-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let none: &[PathBuf] = &[];
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the findings directory") {
        let trace = entry.unwrap().path();
        for json in [false, true] {
            let _ = views::report(&trace, json, 3, none, &mut io::sink());
        }
        let _ = views::dump::dump(&trace, &mut io::sink());
        for format in ["chrome", "perfetto"] {
            let _ = views::export::export(&trace, format, &out.join(format), none);
        }
        let _ = views::flamegraph::flamegraph(&trace, &out.join("svg"), None, none);
        n += 1;
    }
    std::fs::remove_dir_all(&out).unwrap();
    assert!(n >= 1);
}
