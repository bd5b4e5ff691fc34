//! `tracer export`: a trace in another tool's format, written atomically (a temporary
//! file renamed when complete; `flamegraph` uses the same).
//!
//! - `chrome`: the Chrome trace event JSON that chrome://tracing and the Perfetto UI
//!   open — a complete ("X") event per function call (entry/exit pair), an instant
//!   event per other record (blocks, memory accesses, USDT probes, calls), thread
//!   names, and the session's drops as a counter. For small traces (it is one JSON
//!   document).
//! - `perfetto`: Perfetto's protobuf trace (see [`crate::views::perfetto`]), streamed, for
//!   traces of any size.
//! - `parquet`: two Parquet tables in a directory, records and calls, for SQL engines
//!   (see [`crate::views::parquet`]), streamed.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::{
    read::{names::Names, range::TimeRange},
    views::{chrome, parquet, perfetto},
};

/// Write `out` atomically: `write` fills a temporary file next to it, which replaces
/// `out` only when complete and synced.
pub(super) fn write_atomically(
    out: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    write_all_atomically(&[out.to_path_buf()], |ws| match ws {
        [w] => write(w),
        _ => bail!("internal error: one output expected"),
    })
}

/// Write every file of `outs` atomically: `write` fills a temporary file next to each,
/// in order; they replace their outputs (one rename each) only once every one is
/// complete and synced, and no output is touched if writing any of them fails.
pub(super) fn write_all_atomically(
    outs: &[PathBuf],
    write: impl FnOnce(&mut [BufWriter<File>]) -> Result<()>,
) -> Result<()> {
    let mut tmps: Vec<PathBuf> = Vec::new();
    let result = stage(outs, &mut tmps, write);
    if result.is_err() {
        for t in &tmps {
            let _ = std::fs::remove_file(t);
        }
    }
    result
}

fn stage(
    outs: &[PathBuf],
    tmps: &mut Vec<PathBuf>,
    write: impl FnOnce(&mut [BufWriter<File>]) -> Result<()>,
) -> Result<()> {
    let mut ws = Vec::new();
    for out in outs {
        let tmp = crate::tracefile::temporary_for(out)?;
        // 0600 like the trace: exports carry the records' values.
        let file = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().write(true).create_new(true),
            0o600,
        )
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
        tmps.push(tmp);
        ws.push(BufWriter::with_capacity(1 << 20, file));
    }
    write(&mut ws)?;
    for w in &mut ws {
        w.flush()?;
        w.get_ref().sync_all()?;
    }
    for (tmp, out) in tmps.iter().zip(outs) {
        std::fs::rename(tmp, out)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))?;
    }
    Ok(())
}

/// `parquet`'s output: a directory (made if missing) of `records.parquet` and
/// `calls.parquet`.
fn parquet_files(out: &Path) -> Result<Vec<PathBuf>> {
    if out.exists() && !out.is_dir() {
        bail!(
            "{} is not a directory (the Parquet export writes records.parquet and calls.parquet into one)",
            out.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    Ok(vec![out.join("records.parquet"), out.join("calls.parquet")])
}

/// Write `trace` as `format` to `out`.
pub fn export(
    trace: &Path,
    range: &TimeRange,
    format: &str,
    out: &Path,
    debug_dirs: &[PathBuf],
) -> Result<()> {
    let mut names = Names::new(debug_dirs);
    match format {
        "chrome" => write_atomically(out, |w| chrome::write(trace, range, &mut names, w)),
        "perfetto" => write_atomically(out, |w| perfetto::write(trace, range, &mut names, w)),
        "parquet" => write_all_atomically(&parquet_files(out)?, |ws| match ws {
            [records, calls] => parquet::write(trace, range, &mut names, records, calls),
            _ => bail!("internal error: two outputs expected"),
        }),
        _ => bail!("unknown export format {format:?} (supported: chrome, perfetto, parquet)"),
    }
}
