//! Readers independent of the tracer: Perfetto's own protos, DuckDB, tagged fixture lines.

use std::path::Path;
use std::process::Command;

use crate::command::{RUN_TIMEOUT, run};
use crate::paths::{fixture, workspace_root};

/// What a Perfetto protobuf trace holds, read by Perfetto's own generated protos
/// (`tests/tools/perfetto_summary.py`, PyPI package `perfetto`).
pub fn perfetto_summary(trace: &Path) -> serde_json::Value {
    python_tool("perfetto_summary.py", "perfetto", trace.as_os_str())
}

/// The rows of a DuckDB query (`tests/tools/duckdb_query.py`, PyPI package `duckdb`),
/// each a list of strings, numbers, booleans and nulls.
pub fn duckdb_rows(query: &str) -> Vec<Vec<serde_json::Value>> {
    let rows = python_tool("duckdb_query.py", "duckdb", query.as_ref());
    serde_json::from_value(rows.clone())
        .unwrap_or_else(|e| panic!("duckdb_query.py printed no rows ({e}): {rows}"))
}

/// The frames of an inferno flame graph (SVG text): each frame's name and its ns, from
/// the titles "name (N ns, P%)".
pub fn flamegraph_frames(svg: &str) -> Vec<(String, u64)> {
    svg.split("<title>")
        .skip(1)
        .filter_map(|t| {
            let t = &t[..t.find("</title>")?];
            let (name, rest) = t.rsplit_once(" (")?;
            let ns: String = rest
                .split(' ')
                .next()?
                .chars()
                .filter(char::is_ascii_digit)
                .collect();
            Some((name.to_string(), ns.parse().ok()?))
        })
        .collect()
}

/// The JSON that `tests/tools/SCRIPT ARG` prints, with the PyPI packages that `cargo
/// xtask setup` installs into `target/xtask/python` (`package` among them).
fn python_tool(script: &str, package: &str, arg: &std::ffi::OsStr) -> serde_json::Value {
    let py = workspace_root().join("target/xtask/python");
    assert!(
        py.join(package).is_dir(),
        "{} has no {package} package: run `cargo xtask setup`",
        py.display()
    );
    let mut c = Command::new("python3");
    c.arg(workspace_root().join("tests/tools").join(script))
        .arg(arg)
        .env("PYTHONPATH", &py);
    let out = run(&mut c, RUN_TIMEOUT).ok();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}): {}", out.describe()))
}

/// The line of `fixture` whose text contains `// @tag` (1-based).
pub fn tagged_line(fixture_name: &str, tag: &str) -> u32 {
    let text = std::fs::read_to_string(fixture(fixture_name)).unwrap();
    let marker = format!("// @{tag}");
    let hits: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(&marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(hits.len(), 1, "{fixture_name}: tag {tag} on lines {hits:?}");
    hits[0] as u32
}
