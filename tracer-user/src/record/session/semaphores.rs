//! USDT semaphores: while a session runs, the kernel keeps every semaphore of the
//! traced binaries raised, in every process that maps them (now or later), so that
//! probes guarded by `if (PROVIDER_NAME_ENABLED())` fire.
//!
//! The rewriter left one never-executed instruction (an anchor, `meta::Semaphore`) per
//! semaphore. We open a perf uprobe event on each anchor with the semaphore as its
//! reference counter (`ref_ctr_offset`, Linux ≥ 4.20): the kernel increments the
//! counter in every mapping of the file while the event exists, and decrements it when
//! we close it (also when the tracer dies). No BPF program is attached: the anchor is
//! never executed anyway.
//!
//! For untouched binaries (`--usdt PATH`) the reference-counting uprobe goes right after a
//! probe's nop, not on it: the kernel refuses two uprobes at one place with different
//! counters. The user-space drain (`--user`) does not raise semaphores.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use anyhow::{Context, Result, bail};
use tracer_common::meta::Semaphore;

use crate::record::session::binaries::HeldFile;

const PMU: &str = "/sys/bus/event_source/devices/uprobe";
/// perf_event_open flag (linux/perf_event.h; not in the libc crate).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// Raised semaphores; dropping this lowers them.
#[derive(Default)]
pub(crate) struct Raised(Vec<OwnedFd>);

impl Raised {
    /// Raise the semaphores of the held file `file` (the event names it by
    /// `/proc/self/fd/N`: the very file whose note gave the offsets, whatever its path
    /// names now).
    pub(crate) fn raise(&mut self, file: &HeldFile, sems: &[Semaphore]) -> Result<()> {
        if sems.is_empty() {
            return Ok(());
        }
        let pmu_type: u32 = std::fs::read_to_string(format!("{PMU}/type"))
            .context("no uprobe PMU in sysfs (needed for USDT semaphores)")?
            .trim()
            .parse()
            .context("uprobe PMU type")?;
        let shift = ref_ctr_shift()?;
        let path = file.proc_path();
        let cpath = CString::new(path.as_os_str().as_bytes())
            .with_context(|| format!("{}: path contains NUL", path.display()))?;
        for s in sems {
            // perf_event_attr (PERF_ATTR_SIZE_VER5 = 112 bytes, zeroed): type, size,
            // config = ref_ctr_offset << shift, config1 = path, config2 = offset;
            // disabled (bit 0 of the flags word): nothing to count.
            let mut attr = [0u64; 14];
            attr[0] = u64::from(pmu_type) | (112u64 << 32);
            attr[1] = s.semaphore_file_off << shift;
            attr[5] = 1;
            attr[7] = cpath.as_ptr() as u64;
            attr[8] = s.anchor_file_off;
            // SAFETY: attr is a valid perf_event_attr of the size it declares, cpath
            // outlives the call; pid -1 with cpu 0: every process (uprobes are global).
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    attr.as_ptr(),
                    -1i32,
                    0i32,
                    -1i32,
                    PERF_FLAG_FD_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                bail!(
                    "cannot raise the USDT semaphore at file offset {:#x} of {}: {e}",
                    s.semaphore_file_off,
                    path.display()
                );
            }
            // SAFETY: a new descriptor we own.
            self.0.push(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        Ok(())
    }
}

/// Bit position of `ref_ctr_offset` in `config` ("config:32-63").
fn ref_ctr_shift() -> Result<u32> {
    let f = std::fs::read_to_string(format!("{PMU}/format/ref_ctr_offset")).context(
        "this kernel's uprobe PMU has no ref_ctr_offset (Linux >= 4.20 needed for USDT semaphores)",
    )?;
    f.trim()
        .strip_prefix("config:")
        .and_then(|r| r.split('-').next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected ref_ctr_offset format {f:?}"))
}
