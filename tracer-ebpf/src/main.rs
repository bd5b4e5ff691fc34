//! eBPF side of utrace: drains the per-thread record buffers of instrumented binaries
//! into the `EVENTS` ring buffer (see the design notes in tracer-common).
//!
//! Programs (user space loads them by these names, `tracer_common::ebpf::PROG_*`):
//! - `flush`: uprobe on the injected flush function, slot pointer in the second
//!   argument register; drains `[start, cur)` and resets the buffer (the flush code
//!   resets it too if we did not), and learns the process's RW area on the registration
//!   call (`cur == start`).
//! - `site`: uprobe on an unpatchable site, cookie = (binary ordinal << 32) | site id;
//!   drains and resets the thread's buffer of that binary (keeps order), then emits one
//!   record of its own.
//!
//! Flush and site leave a buffer alone while `slot.inflight != 0` (a signal handler
//! interrupted a stub that is still writing its record).
//! - `thread_exit` (syscalls:sys_enter_exit): drains and releases the thread's slots.
//! - `group_exit` (syscalls:sys_enter_exit_group) and `killed` (signal:signal_deliver,
//!   SIGKILL): drain the thread's slots before do_exit, while user memory is still
//!   mapped (kernels before 6.16 run `sched_process_exit` after `exit_mm`).
//! - `task_exit` (sched:sched_process_exit): read-only drain of what is left (threads
//!   killed by exit_group or a signal), and forgets finished processes.
//! - `fork` (sched:sched_process_fork): children of traced processes are traced.
//!
//! "Reset" and "release" write the slot in user memory (bpf_probe_write_user) when the
//! loader sets `WRITE_USER`; kernels in lockdown (integrity) refuse that helper, and
//! then the programs never write user memory: the `DRAINED` map remembers how far each
//! slot was delivered and the next drain starts there (see `slots::drain_slot`).
#![no_std]
#![no_main]
// Inline asm for the atomics (src/atomic.rs); this crate is only built with nightly.
#![feature(asm_experimental_arch)]

mod arch;
mod atomic;
mod drain;
mod maps;
mod slots;
mod tables;
mod user;

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_attach_cookie, bpf_ktime_get_ns},
    },
    macros::{tracepoint, uprobe},
    programs::{ProbeContext, TracePointContext},
};
use aya_log_ebpf::error;
use tracer_common::{
    CAUSE_FULL, CAUSE_REGISTER, CAUSE_TASK_EXIT, CAUSE_THREAD_EXIT, CAUSE_UPROBE_SITE,
    CHUNK_KIND_UPROBE, ChunkHeader, FLAG_KTIME, FLAG_UPROBE, Record, STAT_CHUNKS, STAT_READ_ERRORS,
    STAT_RECORDS_DELIVERED, STAT_RECORDS_DROPPED, Slot,
    ebpf::{
        SEL_BLOCK, SEL_EXIT, SEL_MEMORY, SEL_USDT, STAT_TABLE_FULL, cookie_ordinal, cookie_selector,
    },
};
use tracer_common::{RWH_USER_STATE, USER_ON};

use crate::{
    arch::thread_pointer,
    maps::{
        BINARIES, E_BAD_RW, EVENTS, EXIT_GROUP_DEAD_OFF, FORK_CHILD_PID_OFF, SYSTEM_WIDE, TABLES,
        TARGETS, is_target, next_seq, remember_rw_base, stat_add,
    },
    slots::{AFTER_EXIT, AFTER_RELEASE, AFTER_RESET, drain_slot},
    tables::{drain_exiting, find_binary_slot},
    user::read_user,
};

#[uprobe]
pub fn flush(ctx: ProbeContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let slot_addr = arch::slot_arg(&ctx);
    let slot = match read_user::<Slot>(slot_addr) {
        Ok(s) => s,
        Err(e) => {
            stat_add(STAT_READ_ERRORS, 1);
            error!(&ctx, "flush: cannot read slot at {:x}: {}", slot_addr, e);
            return 0;
        }
    };
    // Never both drains for one buffer: with the user-space drain on, the injected
    // code sends this buffer itself.
    if read_user::<u32>(slot.rw_base + RWH_USER_STATE) == Ok(USER_ON) {
        return 0;
    }
    let r = remember_rw_base(tgid, slot.rw_base);
    if r == E_BAD_RW {
        error!(
            &ctx,
            "flush: slot {:x} names rw_base {:x} without an RW header", slot_addr, slot.rw_base
        );
    } else if r < 0 {
        // Not logged: it would repeat at every flush.
        stat_add(STAT_TABLE_FULL, 1);
    }
    let cause = if slot.cur == slot.start {
        CAUSE_REGISTER
    } else {
        CAUSE_FULL
    };
    let r = drain_slot(slot_addr, slot.rw_base, pid_tid, cause, AFTER_RESET);
    if r < 0 {
        error!(&ctx, "flush: drain of slot {:x} failed: {}", slot_addr, r);
    }
    0
}

/// One uprobe-site record as it goes into the ring buffer.
#[repr(C)]
struct UprobeChunk {
    header: ChunkHeader,
    record: Record,
}

#[uprobe]
pub fn site(ctx: ProbeContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    // SAFETY: ctx is this program's context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let binary_id = BINARIES.get(cookie_ordinal(cookie)).copied().unwrap_or(0);

    // Records the inline stubs of this binary buffered before this site come first.
    let tp = thread_pointer();
    if binary_id != 0
        && tp != 0
        && let Some((rw, slot)) = find_binary_slot(tgid, binary_id, tp)
    {
        let r = drain_slot(slot, rw, pid_tid, CAUSE_UPROBE_SITE, AFTER_RESET);
        if r < 0 {
            error!(&ctx, "site: drain of slot {:x} failed: {}", slot, r);
        }
    }

    // Every register is read unconditionally: the verifier refuses a context access
    // through a pointer that depends on the selector.
    let (arg, ret, pc) = (
        arch::first_arg(&ctx),
        arch::return_value(&ctx),
        arch::pc(&ctx),
    );
    let ra = arch::return_address(&ctx);
    // SAFETY: reading a local; keeps LLVM from turning the choice into a ctx offset.
    let (value, aux) = match unsafe { core::ptr::read_volatile(&cookie_selector(cookie)) } {
        SEL_EXIT => (ret, ra),
        SEL_BLOCK => (pc, 0),
        // The effective address is not computed here (yet): 0, with the instruction.
        SEL_MEMORY => (0, pc),
        // The arguments are not computed here (yet).
        SEL_USDT => (0, 0),
        _ => (arg, ra),
    };
    let seq = next_seq();
    // SAFETY: no preconditions.
    let time = unsafe { bpf_ktime_get_ns() };
    let Some(mut entry) = EVENTS.reserve::<UprobeChunk>(0) else {
        stat_add(STAT_RECORDS_DROPPED, 1);
        return 0;
    };
    entry.write(UprobeChunk {
        header: ChunkHeader {
            kind: CHUNK_KIND_UPROBE,
            count: 1,
            pid: tgid,
            tid: pid_tid as u32,
            seq,
            binary_id,
            cause: CAUSE_UPROBE_SITE,
            _pad: 0,
            time,
        },
        record: Record {
            site: cookie as u32,
            flags: FLAG_KTIME | FLAG_UPROBE,
            time,
            value,
            aux,
        },
    });
    entry.submit(0);
    stat_add(STAT_RECORDS_DELIVERED, 1);
    stat_add(STAT_CHUNKS, 1);
    0
}

#[tracepoint]
pub fn thread_exit(ctx: TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    if is_target((pid_tid >> 32) as u32) {
        let r = drain_exiting(pid_tid, CAUSE_THREAD_EXIT, AFTER_RELEASE);
        if r < 0 {
            error!(&ctx, "thread_exit: drain failed: {}", r);
        }
    }
    0
}

/// The thread calling exit_group drains (and resets) its own slots while its memory is
/// still mapped: before Linux 6.16 `sched_process_exit` fires after `exit_mm`, too late
/// to read user memory, so `task_exit` alone would lose what the buffers hold.
#[tracepoint]
pub fn group_exit(ctx: TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    if is_target((pid_tid >> 32) as u32) {
        let r = drain_exiting(pid_tid, CAUSE_THREAD_EXIT, AFTER_RESET);
        if r < 0 {
            error!(&ctx, "group_exit: drain failed: {}", r);
        }
    }
    0
}

/// `int sig` in the signal_deliver record (after the 8 bytes of common fields; stable
/// since the tracepoint exists).
const SIGNAL_DELIVER_SIG_OFF: usize = 8;
const SIGKILL: i32 = 9;

/// A thread dequeuing SIGKILL (a kill, or another thread's exit_group zapping it) is
/// about to run do_exit: drain its slots now, while its memory is still mapped (see
/// `group_exit`). SIGKILL cannot be caught, so the thread never records again.
#[tracepoint]
pub fn killed(ctx: TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    if !is_target((pid_tid >> 32) as u32) {
        return 0;
    }
    // SAFETY: read_at checks the access (bpf_probe_read_kernel).
    if unsafe { ctx.read_at::<i32>(SIGNAL_DELIVER_SIG_OFF) } != Ok(SIGKILL) {
        return 0;
    }
    let r = drain_exiting(pid_tid, CAUSE_TASK_EXIT, AFTER_RESET);
    if r < 0 {
        error!(&ctx, "killed: drain failed: {}", r);
    }
    0
}

#[tracepoint]
pub fn task_exit(ctx: TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    let tid = pid_tid as u32;
    if !is_target(tgid) && TARGETS.get_ptr(tid).is_none() {
        return 0;
    }
    // The task is PF_EXITING: user memory is still readable, not writable.
    let r = drain_exiting(pid_tid, CAUSE_TASK_EXIT, AFTER_EXIT);
    if r < 0 {
        error!(&ctx, "task_exit: drain failed: {}", r);
    }
    if tid != tgid {
        // `fork` cannot tell threads from processes and adds both; a thread's entries go
        // with the thread.
        let _ = TARGETS.remove(tid);
        let _ = TABLES.remove(tid);
    }
    let off = EXIT_GROUP_DEAD_OFF.load();
    // SAFETY: read_at checks the access (bpf_probe_read_kernel).
    if off != 0 && unsafe { ctx.read_at::<u8>(off as usize) } == Ok(1) {
        // Last thread of the process: its tgid may be reused by an unrelated process.
        let _ = TABLES.remove(tgid);
        let _ = TARGETS.remove(tgid);
    }
    0
}

#[tracepoint]
pub fn fork(ctx: TracePointContext) -> u32 {
    if SYSTEM_WIDE.load() != 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if TARGETS.get_ptr(tgid).is_none() {
        return 0;
    }
    // SAFETY: read_at checks the access (bpf_probe_read_kernel).
    let Ok(child) = (unsafe { ctx.read_at::<u32>(FORK_CHILD_PID_OFF.load() as usize) }) else {
        error!(&ctx, "fork: cannot read child_pid");
        return 0;
    };
    if let Err(e) = TARGETS.insert(child, 1u8, 0) {
        error!(&ctx, "fork: cannot add pid {} to TARGETS: {}", child, e);
    }
    // The child starts with a copy of the parent's memory, RW areas included.
    if let Some(p) = TABLES.get_ptr(tgid) {
        // SAFETY: p points at a live TABLES value; copied to the stack at once.
        let table = unsafe { *p };
        let _ = TABLES.insert(child, table, 0);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// bpf_probe_write_user and bpf_probe_read_user are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
