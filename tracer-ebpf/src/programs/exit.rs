//! The exit programs: a thread's buffers are delivered before its memory goes.
//! `thread_exit` (sys_enter_exit) drains and releases its slots; `group_exit`
//! (sys_enter_exit_group) and `killed` (signal_deliver: SIGKILL or a crash signal)
//! drain them before do_exit; `task_exit` (sched_process_exit) drains what is left,
//! read-only, and forgets finished processes; `exit_step` is one step of those drains.
//!
//! A thread's slot is found from the task's thread pointer
//! (`task_struct.thread.fsbase`, its offset read from kernel BTF by the tracer). The
//! drains before do_exit exist because before Linux 6.16 (Debian 12 runs 6.1)
//! `sched_process_exit` fires after `exit_mm`, when user memory can no longer be read;
//! `task_exit` then drains whatever is still left (newer kernels, other fatal signals).
//! A thread calling `execve`/`execveat` drains its slots first (the image they live in
//! is going; an exec that fails goes on from there), and crash signals (SIGSEGV,
//! SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS) deliver the thread's buffers at
//! `signal_deliver`. Records are attributed to the tid running when they are drained,
//! so a new thread that later reuses the same thread pointer (and, silently, the same
//! slot) never gets the old thread's records.
//!
//! Tail calls: a drain under the exit walk's loop under the chunk loop cost the
//! verifier seconds per program, so the exit programs store the walk
//! (`EXIT_WORK[pid_tid]`: the process's RW areas, copied, and the step) and tail-call
//! `exit_step`, which drains one slot per call and tail-calls itself (16 steps < the
//! 33-call limit). Tracepoints cannot sleep: a non-resident buffer page is a read error
//! there (its records counted dropped).

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, programs::TracePointContext};
use tracer_common::{CAUSE_CRASH, CAUSE_TASK_EXIT, CAUSE_THREAD_EXIT};

use super::{ended, is_target};
use crate::{
    maps::{EXIT_DRAINED, EXIT_GROUP_DEAD_OFF, TARGETS},
    slots::{AFTER_EXIT, AFTER_RELEASE, AFTER_SIGNAL},
    tables::{self, drain_exiting, forget_table, plan_exit_drain, run_exit_drain},
};

/// Drain the current thread's slots (see `tables::drain_exiting`) if its process is
/// traced; 0 if not.
#[inline(always)]
fn drain_if_target(ctx: &TracePointContext, cause: u32, after: u32) -> i64 {
    let pid_tid = bpf_get_current_pid_tgid();
    if !is_target((pid_tid >> 32) as u32) {
        return 0;
    }
    drain_exiting(ctx, pid_tid, cause, after)
}

/// The thread leaves through exit(): drain and release its slots.
#[inline(always)]
pub(crate) fn thread_exit(ctx: &TracePointContext) -> u32 {
    let r = drain_if_target(ctx, CAUSE_THREAD_EXIT, AFTER_RELEASE);
    if r < 0 {
        log_error!(ctx, "thread_exit: drain failed: {}", r);
    }
    0
}

/// The thread calling exit_group (or execve) drains (and resets) its own slots while
/// its memory is still mapped: before Linux 6.16 `sched_process_exit` fires after
/// `exit_mm`, too late to read user memory, so `task_exit` alone would lose what the
/// buffers hold. Circular buffers are delivered too (an exec that fails leaves the
/// process running: trace buffers go on from where this drain stopped).
#[inline(always)]
pub(crate) fn group_exit(ctx: &TracePointContext) -> u32 {
    let r = drain_if_target(ctx, CAUSE_THREAD_EXIT, AFTER_SIGNAL);
    if r < 0 {
        log_error!(ctx, "group_exit: drain failed: {}", r);
    }
    0
}

/// `int sig` in the signal_deliver record (after the 8 bytes of common fields; stable
/// since the tracepoint exists).
const SIGNAL_DELIVER_SIG_OFF: usize = 8;
const SIGKILL: i32 = 9;
/// SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS: a crash (or a handler
/// the program installed for one).
const CRASH_SIGNALS: [i32; 7] = [4, 5, 6, 7, 8, 11, 31];

/// A thread dequeuing SIGKILL (a kill, or another thread's exit_group zapping it) is
/// about to run do_exit: drain its slots now, while its memory is still mapped (see
/// `group_exit`). SIGKILL cannot be caught, so the thread never records again. A
/// thread taking a crash signal has its buffers delivered too (circular buffers: the
/// records leading up to the crash); if it survives (a handler), it goes on recording.
#[inline(always)]
pub(crate) fn killed(ctx: &TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    if !is_target((pid_tid >> 32) as u32) {
        return 0;
    }
    // SAFETY: read_at checks the access (bpf_probe_read_kernel).
    let sig = unsafe { ctx.read_at::<i32>(SIGNAL_DELIVER_SIG_OFF) }.unwrap_or(0);
    let cause = if sig == SIGKILL {
        CAUSE_TASK_EXIT
    } else if CRASH_SIGNALS.contains(&sig) {
        CAUSE_CRASH
    } else {
        return 0;
    };
    let r = drain_exiting(ctx, pid_tid, cause, AFTER_SIGNAL);
    if r < 0 {
        log_error!(ctx, "killed: drain failed: {}", r);
    }
    0
}

/// The task is gone from user space (PF_EXITING): a read-only drain of what its
/// exit-time programs left (threads killed by exit_group or a signal), and the maps
/// forget it.
#[inline(always)]
pub(crate) fn task_exit(ctx: &TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    let tid = pid_tid as u32;
    if !is_target(tgid) && (ended() || TARGETS.get_ptr(tid).is_none()) {
        return 0;
    }
    // The task is PF_EXITING: user memory is still readable, not writable. The walk
    // over its RW areas (copied now) runs after the maps below forget the task. Not
    // when its exit() drain already delivered everything (see `EXIT_DRAINED`).
    let drained = EXIT_DRAINED.get_ptr(pid_tid).is_some();
    let _ = EXIT_DRAINED.remove(pid_tid);
    let planned = if drained {
        0
    } else {
        plan_exit_drain(pid_tid, CAUSE_TASK_EXIT, AFTER_EXIT)
    };
    if planned < 0 {
        log_error!(ctx, "task_exit: drain failed: {}", planned);
    }
    if tid != tgid {
        // `fork` cannot tell threads from processes and adds both; a thread's entries go
        // with the thread.
        let _ = TARGETS.remove(tid);
        forget_table(tid);
    }
    let off = EXIT_GROUP_DEAD_OFF.load();
    // SAFETY: read_at checks the access (bpf_probe_read_kernel).
    if off != 0 && unsafe { ctx.read_at::<u8>(off as usize) } == Ok(1) {
        // Last thread of the process: its tgid may be reused by an unrelated process.
        forget_table(tgid);
        let _ = TARGETS.remove(tgid);
    }
    if planned == 1 {
        let r = run_exit_drain(ctx, pid_tid);
        log_error!(ctx, "task_exit: drain failed: {}", r);
    }
    0
}

/// One step of an exit drain, reached by tail calls only (see `maps::ExitWork`).
#[inline(always)]
pub(crate) fn exit_step(ctx: &TracePointContext) -> u32 {
    let r = tables::exit_step(ctx);
    if r < 0 {
        log_error!(ctx, "exit drain step failed: {}", r);
    }
    0
}
