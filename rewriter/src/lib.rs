//! Static ELF rewriter: inserts inline buffer-store stubs at function entries and exits.
//!
//! [`rewrite`] is the pipeline, one stage per module: [`elf::read`] parses and checks
//! the binary, [`options`] checks the buffer geometry, [`flow`] recovers indirect
//! control flow, [`select`] chooses the functions (globs, USDT probes), [`plan`] finds
//! their sites and asks the [`isa`] backend which get inline windows and which fall
//! back to uprobes, [`layout`] places the new segments, [`emit`] emits the code and
//! the metadata, and [`elf::write`] appends it all to an unmodified copy of the input.
//!
//! [`rewrite_file`] writes the output next to the input under a temporary name with the
//! input's mode and renames it into place: the input is never modified.
//! [`uprobe_metadata`] serves untouched binaries (`tracer record --uprobe
//! PATH[:GLOB,...]`, `--usdt PATH`): the metadata of a rewrite that changes none of the
//! original bytes, every site a uprobe, so its site offsets and operand sets are the
//! original file's.

#![warn(unreachable_pub)]

pub mod elf;
mod emit;
mod error;
pub mod flow;
pub(crate) mod isa;
pub(crate) mod layout;
mod options;
pub(crate) mod plan;
pub(crate) mod select;

use std::io::Write as _;
use std::path::Path;

pub use emit::Report;
pub use error::{Error, Result};
pub use isa::runs::{RunEnd, RunStats};
pub use options::{Options, Progress};
pub use select::{spec, usdt};
pub use tracer_common::meta::{FallbackReason, SiteKind, TimeMode};

/// Rewrite an in-memory image. `name` is used in messages.
pub fn rewrite(name: &str, data: &[u8], opts: &Options) -> Result<(Vec<u8>, Report)> {
    let input = elf::read::Input::parse(name, data)?;
    let isa = isa_of(&input)?;
    options::check(name, opts)?;
    let (flow, eh_problem) = recover_or_warn(&input, isa);
    let targets = isa.branch_targets(&input, &flow);
    let sel = select::select(&input, isa, &flow, &targets, opts)?;
    let sites = plan::sites(&input, isa, &flow, &targets, &sel, opts)?;
    let eh_problem = eh_problem.as_deref();
    let plans = plan::plan(&input, isa, &flow, eh_problem, &targets, &sel, &sites, opts);
    let seg = layout::place(&input, isa, opts, &plans, &sites.info)?;
    let mut code = emit::code(&input, isa, &seg, &sel, &sites, plans, opts)?;
    write(&input, isa, &seg, &sites, &mut code, opts)
}

/// The backend for `input`'s machine.
fn isa_of(input: &elf::read::Input) -> Result<&'static dyn isa::Isa> {
    isa::of(input.machine)
        .ok_or_else(|| Error::UnsupportedMachine(input.name.clone(), input.machine))
}

/// Control-flow recovery of a parsed input (jump tables, landing pads, FDE ranges).
pub fn recover_flow(input: &elf::read::Input) -> Result<flow::Flow> {
    flow::recover(input, isa_of(input)?)
        .map_err(|e| Error::Layout(input.name.clone(), e.to_string()))
}

/// Indirect control flow. Unreadable exception tables are not fatal, but then no
/// function's interior is trusted (the reason is returned).
fn recover_or_warn(input: &elf::read::Input, isa: &dyn isa::Isa) -> (flow::Flow, Option<String>) {
    let (flow, eh_problem) = match flow::recover(input, isa) {
        Ok(f) => (f, None),
        Err(e) => {
            log::warn!("{e}: only function starts and last returns are patched inline");
            (flow::Flow::default(), Some(e.to_string()))
        }
    };
    for w in &flow.warnings {
        log::info!("{}: {w}", input.name);
    }
    (flow, eh_problem)
}

/// The last stage: the metadata, the RW header, and the output file.
fn write(
    input: &elf::read::Input,
    isa: &dyn isa::Isa,
    seg: &layout::Segments,
    sites: &plan::Sites,
    code: &mut emit::Emitted,
    opts: &Options,
) -> Result<(Vec<u8>, Report)> {
    let tx_size = (seg.code_at - seg.tx_vaddr) + code.code.len() as u64;
    let rw_size = tracer_common::rw_size(opts.buf_kind, opts.nslots, seg.layout.buf_bytes);
    // The site table's own errors come first, as they always did.
    let metadata = code.metadata(input, isa, seg, sites, opts, (tx_size, rw_size))?;
    if seg.tx_vaddr + tx_size > seg.layout.rw_vaddr {
        return Err(Error::Layout(
            input.name.clone(),
            "trampolines larger than planned".into(),
        ));
    }
    code.reasons.sort_by_key(|r| r.site);
    let note = metadata.to_note_with(&code.reasons);
    let rw_header = emit::rw_header(seg);
    let parts = elf::write::NewParts {
        seg,
        code: &code.code,
        tx_size,
        rw_off: seg.rw_off(tx_size),
        rw_size,
        rw_header: &rw_header,
        patches: &code.patches,
        note: &note,
        entry: code.rt.entry_shim.unwrap_or(input.entry),
    };
    let out = elf::write::write(input, &parts)?;
    let mut report = std::mem::take(&mut code.report);
    report.output_size = out.len() as u64;
    Ok((out, report))
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
