//! What a trace shows to a person or another tool: the report (a model with its memory
//! section, then text or JSON), the dump, exports (Chrome, Perfetto, Parquet), flame graphs and the live view of a session. May use `read`,
//! `tracefile` and `debuginfo`; nothing else uses it but `main`.

pub(crate) mod chrome;
pub mod diff;
pub mod dump;
pub mod export;
pub mod flamegraph;
pub(crate) mod json;
pub(crate) mod memory;
pub(crate) mod model;
pub(crate) mod parquet;
pub(crate) mod perfetto;
pub(crate) mod text;
pub mod top;

use std::{io::Write, path::Path, path::PathBuf};

use anyhow::Result;

use crate::read::range::TimeRange;

/// `tracer report`: per-function and per-thread counts, as text or one JSON object.
pub fn report(
    path: &Path,
    range: &TimeRange,
    json: bool,
    last: usize,
    debug_dirs: &[PathBuf],
    out: &mut impl Write,
) -> Result<()> {
    let r = model::build(path, range, last, debug_dirs)?;
    if json {
        json::write(out, &r)
    } else {
        text::write(out, path, &r)
    }
}
