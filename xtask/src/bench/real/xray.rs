//! The LLVM XRay rows: clang's `-fxray-instrument -fxray-instruction-threshold=1` build
//! (every function's entry and exit sled patched at start, `patch_premain`) in FDR mode
//! (per-thread buffers in memory, a flight recorder: nothing is written unless the
//! program finalizes and flushes the log itself) and in basic mode (a log file
//! written as it goes). Only the time is compared: XRay counts no records here.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use super::super::process::measured;
use super::Row;
use crate::util::cmd;

/// One run of the XRay build in `mode` ("fdr" or "basic").
pub(super) fn row(dir: &Path, xray: &Path, mode: &str, args: impl Fn(&mut Command)) -> Result<Row> {
    let logs = dir.join("xray-logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let mut c = cmd(xray);
    c.env(
        "XRAY_OPTIONS",
        format!(
            "patch_premain=true xray_mode=xray-{mode} verbosity=0 xray_logfile_base={}/",
            logs.display()
        ),
    );
    args(&mut c);
    let run = measured(&mut c)?;
    let bytes = std::fs::read_dir(&logs)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum::<u64>();
    let _ = std::fs::remove_dir_all(&logs);
    Ok(Row {
        name: format!("{}{mode}", super::ratios::XRAY),
        run,
        records: None,
        lost: None,
        trace_bytes: (bytes > 0).then_some(bytes),
    })
}
