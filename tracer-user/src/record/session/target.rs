//! What `tracer record` is asked to do: the target (a command, a process, every
//! process), the output, the ring size, extra and untouched binaries, the filter.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Result, bail};
use tracer_common::ebpf::DEFAULT_RING_BYTES;

use crate::record::session::filters::FilterSpec;

pub enum Target {
    /// Run a command (argv[0] is resolved through PATH).
    Exec(Vec<OsString>),
    /// Attach to a running process until it exits, Ctrl-C, or the duration passes.
    Attach {
        pid: u32,
        duration: Option<Duration>,
    },
    /// Every process that runs an instrumented binary, until Ctrl-C or the duration.
    SystemWide { duration: Option<Duration> },
}

pub struct RecordOptions {
    pub output: PathBuf,
    /// `--split`, `--max-size`: the trace in segments (`tracefile::Rotation`).
    pub rotation: crate::tracefile::Rotation,
    pub ring_bytes: u32,
    pub on_full: OnFull,
    pub target: Target,
    /// `--binary`: instrumented binaries to trace besides those found from the target
    /// (e.g. the program run by an uninstrumented loader such as qemu-user).
    pub binaries: Vec<PathBuf>,
    /// In-kernel filters at the start (`tracer filter` changes them later).
    pub filter: FilterSpec,
    /// Untouched binaries traced by uprobes only.
    pub untouched: Vec<Untouched>,
    /// `--live`: a view of the session as it runs.
    pub live: Option<LiveFeed>,
    /// `--run-as` (or the sudo default): who the command, and its loader asked for its
    /// libraries, run as; None: as the tracer.
    pub run_as: Option<crate::record::session::credentials::RunAs>,
}

/// What a live view of the session (`record --live`) is fed: a copy of the trace as it
/// is written, the records dropped so far (updated about once a second), and how to
/// wait for the view to finish (before the session's summary is printed).
pub struct LiveFeed {
    pub tee: crate::tracefile::Tee,
    pub dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub done: Box<dyn FnOnce() + Send>,
}

/// `record --on-full`: what a full buffer does when the ring buffer has no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnFull {
    /// The thread waits (bounded) and flushes again: back-pressure, nothing lost.
    Wait,
    /// The records are dropped and counted.
    Drop,
}

/// `record --uprobe PATH[:GLOB,...]` / `--usdt PATH`.
pub struct Untouched {
    pub path: PathBuf,
    pub functions: Vec<String>,
    pub usdt: bool,
}

impl Untouched {
    /// `PATH[:GLOB,...]` (a `:` followed by no `/` starts the globs).
    pub fn parse_uprobe(spec: &str) -> Untouched {
        let (path, globs) = match spec.rsplit_once(':') {
            Some((p, g)) if !g.contains('/') && !p.is_empty() => (p, g),
            _ => (spec, ""),
        };
        Untouched {
            path: PathBuf::from(path),
            functions: globs
                .split(',')
                .filter(|g| !g.is_empty())
                .map(String::from)
                .collect(),
            usdt: false,
        }
    }
}

pub(super) fn check_ring_bytes(n: u32) -> Result<()> {
    let page = 4096;
    if n < page || !n.is_power_of_two() {
        bail!(
            "--ring-bytes {n}: must be a power of two and at least {page} (default {DEFAULT_RING_BYTES})"
        );
    }
    Ok(())
}

/// `-o` default.
pub fn default_output() -> &'static Path {
    Path::new("trace.utrace")
}
