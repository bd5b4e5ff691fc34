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

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::{
    read::names::Names,
    views::{chrome, perfetto},
};

/// Write `out` atomically: `write` fills a temporary file next to it, which replaces
/// `out` only when complete and synced.
pub(super) fn write_atomically(
    out: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let tmp = crate::tracefile::temporary_for(out)?;
    // 0600 like the trace: exports carry the records' values.
    let file = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(&tmp)
    .with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let result = write(&mut w)
        .and_then(|()| {
            w.flush()?;
            w.get_ref().sync_all()?;
            Ok(())
        })
        .and_then(|()| {
            std::fs::rename(&tmp, out)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Write `trace` as `format` to `out`.
pub fn export(trace: &Path, format: &str, out: &Path, debug_dirs: &[PathBuf]) -> Result<()> {
    let mut names = Names::new(debug_dirs);
    match format {
        "chrome" => write_atomically(out, |w| chrome::write(trace, &mut names, w)),
        "perfetto" => write_atomically(out, |w| perfetto::write(trace, &mut names, w)),
        _ => bail!("unknown export format {format:?} (supported: chrome, perfetto)"),
    }
}
