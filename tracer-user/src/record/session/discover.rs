//! Which instrumented binaries a session starts with: the command's (and `--binary`),
//! or the attached process's with their load biases; what the file says about each.
//!
//! A mapped file is opened through `/proc/PID/map_files/…` (the inode mapped there, `O_PATH`;
//! its `fstat` must show the maps line's inode, while the maps line's device, the
//! superblock's, is not `st_dev` on btrfs or overlayfs), remembered by `(st_dev, st_ino)` and
//! path; its load bias is read from a mapping of that same file (`trust_seed::a_file_with_a_known_files_inode_on_another_device_is_not_taken_for_it`,
//! `a_program_on_overlayfs_is_traced_with_p`). A command's binaries come from `ld.so --list`
//! run as the command will be (`credentials.rs`); `Traced` is a binary and its load bias.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use tracer_common::{
    ebpf::{MAX_BINARIES, TABLE_BINARIES},
    meta::SiteMode,
};

use crate::tracefile::BinaryInfo;

use super::{
    binaries::{self, Instrumented},
    credentials::RunAs,
    gate,
    target::Target,
};

/// An instrumented binary to trace and, when attaching, where it is loaded.
pub(super) struct Traced {
    pub binary: Instrumented,
    /// Its load bias in the attached process (None: not attaching, or not known yet).
    pub load_bias: Option<u64>,
}

/// What the trace file says about each traced binary (ordinal = position).
pub(super) fn binary_infos<'a>(
    binaries: impl IntoIterator<Item = &'a Instrumented>,
) -> Vec<BinaryInfo> {
    binaries
        .into_iter()
        .enumerate()
        .map(|(i, b)| binary_info(i as u32, b))
        .collect()
}

/// What the trace file says about binary `b` traced as `ordinal`.
pub(super) fn binary_info(ordinal: u32, b: &Instrumented) -> BinaryInfo {
    BinaryInfo {
        ordinal,
        binary_id: b.meta.binary_id,
        path: b.path.to_string_lossy().into_owned(),
        note: b.note.clone(),
    }
}

/// The instrumented binaries of a command (plus `extra`) and its resolved path; its
/// loader is asked for its libraries as `run_as`.
pub(super) fn discover_command(
    argv: &[OsString],
    extra: &[PathBuf],
    run_as: Option<&RunAs>,
) -> Result<(Vec<Traced>, PathBuf)> {
    let (binaries, exe) = discover(&Target::Exec(argv.to_vec()), extra, run_as)?;
    Ok((binaries, exe.context("no executable to run")?))
}

/// The instrumented binaries of the target plus `extra` (`--binary`), and the resolved
/// command when running one (its loader run as `run_as`); an error if there are none,
/// or too many.
pub(super) fn discover(
    target: &Target,
    extra: &[PathBuf],
    run_as: Option<&RunAs>,
) -> Result<(Vec<Traced>, Option<PathBuf>)> {
    let named = binaries::named(extra)?;
    let (binaries, exe): (Vec<Traced>, _) = match target {
        Target::Exec(argv) => {
            let (found, exe) = of_command(argv, named, run_as)?;
            (found, Some(exe))
        }
        Target::Attach { .. } if !named.is_empty() => {
            bail!("--binary is only for running a command, not with -p")
        }
        Target::Attach { pid, .. } => {
            let found = binaries::for_process(*pid)?;
            let found = found.into_iter().map(|(binary, bias)| Traced {
                binary,
                load_bias: Some(bias),
            });
            (found.collect(), None)
        }
        Target::SystemWide { .. } if !named.is_empty() => {
            bail!("--binary is only for running a command, not with --system-wide")
        }
        // Found by scanning the processes once the session is set up.
        Target::SystemWide { .. } => (Vec::new(), None),
    };
    check_found(target, &binaries, exe.as_deref())?;
    super::test_hook::pause(super::test_hook::PARSED);
    check_count(&binaries)?;
    Ok((binaries, exe))
}

/// The instrumented binaries of command `argv` (its loader run as `run_as`) plus
/// `named`, and the command's resolved path.
fn of_command(
    argv: &[OsString],
    named: Vec<Instrumented>,
    run_as: Option<&RunAs>,
) -> Result<(Vec<Traced>, PathBuf)> {
    let cmd = argv.first().context("no command given")?;
    let exe = gate::resolve_command(cmd)?;
    let mut found = match binaries::for_command(&exe, run_as) {
        Ok(found) => found,
        // The command may be a loader we cannot inspect (say, a foreign or
        // static one); the named binaries are what the user wants traced.
        Err(e) if !named.is_empty() => {
            log::warn!("{}: cannot list its libraries: {e:#}", exe.display());
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    binaries::merge(&mut found, named);
    let found = found
        .into_iter()
        .map(|binary| Traced {
            binary,
            load_bias: None,
        })
        .collect();
    Ok((found, exe))
}

/// None found: a command may load some later (a warning), a process has none (an error).
fn check_found(target: &Target, binaries: &[Traced], exe: Option<&Path>) -> Result<()> {
    if binaries.is_empty() && matches!(target, Target::Exec(_)) {
        log::warn!(
            "{}: nothing instrumented yet (no {} note); libraries it loads later (dlopen) are traced",
            exe.unwrap_or(Path::new("?")).display(),
            tracer_common::meta::META_SECTION
        );
    } else if binaries.is_empty() && matches!(target, Target::Attach { .. }) {
        let what = match target {
            Target::Attach { pid, .. } => format!("the files mapped by process {pid}"),
            _ => "the target".into(),
        };
        bail!(
            "nothing to trace: none of {what} is instrumented (no {} note; run the rewriter on them first)",
            tracer_common::meta::META_SECTION
        );
    }
    Ok(())
}

/// At most MAX_BINARIES (a warning past TABLE_BINARIES); each one logged.
fn check_count(binaries: &[Traced]) -> Result<()> {
    if binaries.len() > MAX_BINARIES as usize {
        bail!(
            "{} instrumented binaries; at most {MAX_BINARIES} per session",
            binaries.len()
        );
    }
    if binaries.len() > TABLE_BINARIES {
        log::warn!(
            "{} instrumented binaries; a process can only have {TABLE_BINARIES} drained at thread exit",
            binaries.len()
        );
    }
    for b in binaries.iter().map(|t| &t.binary) {
        let uprobes = b.meta.sites.iter().filter(|s| s.mode == SiteMode::Uprobe);
        log::info!(
            "tracing {} (binary_id {:#x}, {} sites, {} by uprobe)",
            b.path.display(),
            b.meta.binary_id,
            b.meta.sites.len(),
            uprobes.count()
        );
    }
    Ok(())
}
