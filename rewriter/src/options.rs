//! What to instrument and how big the buffers are ([`Options`]), the progress callback,
//! and the check of the options before any work.

use crate::error::{Error, Result};
use tracer_common::meta::{SiteKind, TimeMode};
use tracer_common::{BUF_FAST_CIRCULAR, FAST_RING_BYTES, FIRST_FREE_SLOT, RECORD_SIZE};

/// What to instrument and how big the buffers are.
#[derive(Clone, Debug)]
pub struct Options {
    /// Function-name globs; empty means every function.
    pub functions: Vec<String>,
    /// Per-thread buffer slots (maximum threads alive at once, per binary).
    pub nslots: u32,
    /// Records per thread buffer.
    pub buf_records: u32,
    /// Make every site a uprobe site (for comparisons and as an escape hatch).
    pub force_uprobe: bool,
    /// Record the memory accesses of a run of adjacent memory instructions with one
    /// stub (one reservation, two accesses a record); `false`: one stub per instruction.
    pub batch: bool,
    /// Site kinds to instrument in the selected functions.
    pub kinds: Vec<SiteKind>,
    /// Whether stubs read the cycle counter (`Record`) or not (`Coarse`).
    pub time_mode: TimeMode,
    /// `BUF_*`: trace (flushed when full), circular, fast circular (64 KiB rings).
    pub buf_kind: u32,
    /// What entry, exit and block records carry as their value instead of the
    /// default: (kind, an argument spec in `<sys/sdt.h>` syntax for the binary's ISA:
    /// a register `%rsi` / `x1`, an immediate `$42` / `42`, memory `8@-16(%rbp)` /
    /// `8@[sp, 16]`).
    pub values: Vec<(SiteKind, String)>,
    /// Told how far the rewrite is (the CLI draws a progress bar on a terminal).
    pub progress: Progress,
}

/// A progress callback: `(stage, done, total)`, called once per function of each stage.
#[derive(Clone, Default)]
pub struct Progress(Option<std::sync::Arc<ProgressFn>>);

type ProgressFn = dyn Fn(&'static str, u64, u64) + Send + Sync;

impl Progress {
    pub fn new(f: impl Fn(&'static str, u64, u64) + Send + Sync + 'static) -> Progress {
        Progress(Some(std::sync::Arc::new(f)))
    }

    pub(crate) fn report(&self, stage: &'static str, done: u64, total: u64) {
        if let Some(f) = &self.0 {
            f(stage, done, total);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Progress(..)"
        } else {
            "Progress(none)"
        })
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            functions: Vec::new(),
            nslots: tracer_common::DEFAULT_SLOTS,
            buf_records: tracer_common::DEFAULT_BUF_RECORDS,
            force_uprobe: false,
            batch: true,
            kinds: vec![SiteKind::FunctionEntry],
            time_mode: TimeMode::Record,
            buf_kind: tracer_common::BUF_TRACE,
            values: Vec::new(),
            progress: Progress::default(),
        }
    }
}

/// Reject buffer geometries the run-time code cannot handle (`name`: for messages).
pub(crate) fn check(name: &str, opts: &Options) -> Result<()> {
    let layout_err = |m: String| Error::Layout(name.into(), m);
    if opts.nslots < FIRST_FREE_SLOT + 1 || opts.nslots > 1 << 20 {
        return Err(layout_err(format!(
            "--slots must be between 3 and {}",
            1 << 20
        )));
    }
    if opts.buf_records < 2 || opts.buf_records > tracer_common::MAX_BUF_RECORDS {
        return Err(layout_err(format!(
            "--buffer-records must be between 2 and {}",
            tracer_common::MAX_BUF_RECORDS
        )));
    }
    if opts.buf_kind == BUF_FAST_CIRCULAR
        && u64::from(opts.buf_records) * RECORD_SIZE as u64 != FAST_RING_BYTES
    {
        return Err(layout_err(format!(
            "fast circular buffers are {} records (64 KiB), not {}",
            FAST_RING_BYTES / RECORD_SIZE as u64,
            opts.buf_records
        )));
    }
    Ok(())
}
