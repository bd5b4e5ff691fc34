//! Static ELF rewriter: inserts inline buffer-store stubs at function entries and exits.
//!
//! Read side: [`input`] parses and checks the binary. Decide: [`sites`] picks the
//! sites, the [`isa`] backend decides inline vs uprobe and emits code. Write side:
//! [`output`] appends the new segments, program header table, metadata note and
//! section headers to an unmodified copy of the input and patches the sites.

pub mod error;
pub mod flow;
pub mod input;
pub mod isa;
pub mod output;
pub mod progress;
pub mod sites;
pub mod spec;
pub mod usdt;

use std::io::Write as _;
use std::path::Path;

pub use error::{Error, Result};
pub use output::Report;
pub use sites::demangle;
pub use tracer_common::meta::{SiteKind, TimeMode};

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
            kinds: vec![SiteKind::FunctionEntry],
            time_mode: TimeMode::Record,
            buf_kind: tracer_common::BUF_TRACE,
            values: Vec::new(),
            progress: Progress::default(),
        }
    }
}

/// Rewrite an in-memory image. `name` is used in messages.
pub fn rewrite(name: &str, data: &[u8], opts: &Options) -> Result<(Vec<u8>, Report)> {
    let input = input::Input::parse(name, data)?;
    let isa: &dyn isa::Isa = match input.machine {
        object::elf::EM_AARCH64 => &isa::aarch64::Aarch64,
        _ => &isa::x86_64::X86_64,
    };
    output::build(&input, isa, opts)
}

/// The metadata (`.note.utrace` section contents) describing an UNTOUCHED binary for
/// tracing by uprobes only: the sites of `opts` (functions, kinds) as uprobe sites with
/// their operand sets, at the file offsets of the original (a rewrite with every site a
/// uprobe changes none of the original bytes). The binary itself is not written: the
/// tracer attaches its uprobe fallback to the original file, so one session can mix
/// rewritten and untouched programs. The metadata's flush and semaphore anchors point
/// into code the original does not have; users must not attach there.
pub fn uprobe_metadata(name: &str, data: &[u8], opts: &Options) -> Result<Vec<u8>> {
    let opts = Options {
        force_uprobe: true,
        ..opts.clone()
    };
    let (bytes, _) = rewrite(name, data, &opts)?;
    let bad = |why: String| Error::Layout(name.into(), why);
    let file = object::File::parse(&*bytes).map_err(|e| bad(e.to_string()))?;
    let section = object::Object::section_by_name(&file, tracer_common::meta::META_SECTION)
        .ok_or_else(|| bad("no metadata section in the output".into()))?;
    let note = object::ObjectSection::data(&section).map_err(|e| bad(e.to_string()))?;
    Ok(note.to_vec())
}

/// Rewrite `input` into `output` atomically (temp file + rename), with the input's
/// permission bits. The input is only read.
pub fn rewrite_file(input: &Path, output: &Path, opts: &Options) -> Result<Report> {
    let data = std::fs::read(input).map_err(|e| Error::Read(input.into(), e))?;
    let meta = std::fs::metadata(input).map_err(|e| Error::Read(input.into(), e))?;
    let (bytes, report) = rewrite(&input.display().to_string(), &data, opts)?;
    write_atomically(output, &bytes, meta.permissions())?;
    Ok(report)
}

fn write_atomically(path: &Path, bytes: &[u8], perms: std::fs::Permissions) -> Result<()> {
    let werr = |e| Error::Write(path.into(), e);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| werr(std::io::Error::other("no file name")))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(perms)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(werr)
}
