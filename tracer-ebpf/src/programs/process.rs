//! The process programs: `fork` (sched_process_fork) makes children of traced
//! processes traced; `exec` (sched_process_exec) and `mmap` (sys_enter_mmap of an
//! executable file) tell the tracer a process has new code to look at
//! (`CHUNK_KIND_MAPPED`).
//!
//! `mmap` is announced on entry, possibly before the mapping exists (the tracer looks again
//! 10 ms later). At a fork the child also gets the parent's `TABLES` entry and the forking
//! thread's inherited records are marked delivered for it (`slots::inherit`).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_uid_gid, generated::bpf_ktime_get_ns},
    programs::TracePointContext,
};
use tracer_common::{CAUSE_EXEC, CHUNK_KIND_MAPPED, ChunkHeader, STAT_TABLE_SHARE};

use super::is_target;
use crate::books::stat_add;
use crate::maps::{EVENTS, FORK_CHILD_PID_OFF, SYSTEM_WIDE, TABLES, TARGETS};
use crate::tables::{claim_table, forget_table, inherit_at_fork, release_owner};

/// A traced process forked: the child is traced too, and starts with its parent's RW
/// areas.
#[inline(always)]
pub(crate) fn fork(ctx: &TracePointContext) -> u32 {
    let system_wide = SYSTEM_WIDE.load() != 0;
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !system_wide && TARGETS.get_ptr(tgid).is_none() {
        return 0;
    }
    // System-wide, only the RW areas matter (every process is a target): a child that
    // records into its parent's slot without registering is drained at exit too.
    if system_wide && TABLES.get_ptr(tgid).is_none() {
        return 0;
    }
    // SAFETY: read_at checks the access (bpf_probe_read_kernel).
    let Ok(child) = (unsafe { ctx.read_at::<u32>(FORK_CHILD_PID_OFF.load() as usize) }) else {
        log_error!(ctx, "fork: cannot read child_pid");
        return 0;
    };
    if !system_wide && let Err(e) = TARGETS.insert(child, 1u8, 0) {
        log_error!(ctx, "fork: cannot add pid {} to TARGETS: {}", child, e);
    }
    // The child starts with a copy of the parent's memory, RW areas included, and the
    // forking thread's undelivered records in it.
    if let Some(p) = TABLES.get_ptr(tgid) {
        // SAFETY: p points at a live TABLES value; copied to the stack at once.
        let table = unsafe { *p };
        copy_table(child, &table);
        inherit_at_fork(table, child);
    }
    0
}

/// Give `child` a copy of its parent's entry, charged to the forking user (the
/// child's) within its share; refused, the child is not drained at exit.
#[inline(never)]
fn copy_table(child: u32, table: &[u64; tracer_common::ebpf::TABLE_BINARIES]) {
    let charged = claim_table(child, bpf_get_current_uid_gid() as u32);
    if charged < 0 {
        stat_add(STAT_TABLE_SHARE, 1);
        return;
    }
    if TABLES.insert(child, *table, 0).is_err() && charged == 0 {
        release_owner(child);
    }
}

/// `prot` and `fd` in the sys_enter_mmap record (8 bytes of common fields, the
/// syscall number padded to 8, then the six arguments as u64; stable ABI).
const MMAP_PROT_OFF: usize = 32;
const MMAP_FD_OFF: usize = 48;
const PROT_EXEC: u64 = 4;

/// Tell the tracer that process `pid` has new code to look at.
#[inline(always)]
fn announce_mapped(pid_tid: u64, cause: u32) {
    let Some(mut entry) = EVENTS.reserve::<ChunkHeader>(0) else {
        return;
    };
    // SAFETY: no preconditions.
    let time = unsafe { bpf_ktime_get_ns() };
    let header = ChunkHeader::new(CHUNK_KIND_MAPPED, pid_tid, 0, cause, time);
    // SAFETY: the reservation has room for one ChunkHeader.
    unsafe { entry.as_mut_ptr().write(header) };
    entry.submit(0);
}

/// A process exec'd: a system-wide session looks for instrumented binaries in it
/// (its executable is mapped by now; the libraries come with `mmap`).
#[inline(always)]
pub(crate) fn exec() -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    if is_target(tgid) {
        // The old image's RW areas are gone (their buffers were drained at
        // sys_enter_execve); the new image's are learned afresh.
        forget_table(tgid);
        announce_mapped(pid_tid, CAUSE_EXEC);
    }
    0
}

/// A traced process maps a file executable (the loader, or `dlopen`): the tracer
/// looks for an instrumented binary it does not trace yet.
#[inline(always)]
pub(crate) fn mmap(ctx: &TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    if !is_target((pid_tid >> 32) as u32) {
        return 0;
    }
    // SAFETY: read_at checks the access (bpf_probe_read_kernel).
    let (prot, fd) = unsafe {
        (
            ctx.read_at::<u64>(MMAP_PROT_OFF).unwrap_or(0),
            ctx.read_at::<i64>(MMAP_FD_OFF).unwrap_or(-1),
        )
    };
    if prot & PROT_EXEC != 0 && fd >= 0 {
        announce_mapped(pid_tid, 0);
    }
    0
}
