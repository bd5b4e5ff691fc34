//! Every reader of a trace file (report as text and JSON, with a time range, against
//! itself; dump, Chrome, Perfetto and Parquet exports, flame graph) on any bytes: an error
//! or a result, never a panic or a hang.
#![no_main]

use std::{io, path::PathBuf, sync::OnceLock};

use libfuzzer_sys::fuzz_target;
use tracer_user::{TimePoint, TimeRange, views};

/// A directory of this process's own (tmpfs when there is one).
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = ["/dev/shm", "/tmp"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let d = base.join(format!("utrace-fuzz-views-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch directory");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let trace = dir().join("in.utrace");
    std::fs::write(&trace, data).expect("the input written");
    let none: &[PathBuf] = &[];
    let all = &TimeRange::ALL;
    // A range that cuts somewhere: from 1 us after the start to an absolute time.
    let cut = &TimeRange {
        since: Some(TimePoint::FromStart(1_000)),
        until: Some(TimePoint::Monotonic(u64::from(data.len() as u32) << 20)),
    };
    for json in [false, true] {
        let _ = views::report(&trace, all, json, 3, none, &mut io::sink());
    }
    let _ = views::report(&trace, cut, true, 3, none, &mut io::sink());
    let _ = views::diff::report_diff(&trace, &trace, all, false, none, &mut io::sink());
    let _ = views::dump::dump(&trace, all, &mut io::sink());
    let _ = views::dump::dump(&trace, cut, &mut io::sink());
    for format in ["chrome", "perfetto"] {
        let out = dir().join(format!("out.{format}"));
        let _ = views::export::export(&trace, all, format, &out, none);
        let _ = std::fs::remove_file(&out);
    }
    let parquet = dir().join("out.parquet");
    let _ = views::export::export(&trace, all, "parquet", &parquet, none);
    let _ = std::fs::remove_dir_all(&parquet);
    let svg = dir().join("out.svg");
    let _ = views::flamegraph::flamegraph(&trace, all, &svg, None, none);
    let _ = std::fs::remove_file(&svg);
});
