//! eBPF side of utrace: drains the per-thread record buffers of instrumented binaries
//! into the `EVENTS` ring buffer (see the design notes in tracer-common).
//!
//! Programs (user space loads them by these names, `tracer_common::ebpf::PROG_*`):
//! - `flush`: uprobe on the injected flush function, slot pointer in the second
//!   argument register; drains `[start, cur)` and resets the buffer (the flush code
//!   resets it too if we did not), and learns the process's RW area on the registration
//!   call (`cur == start`).
//! - `site`: uprobe on an unpatchable site, cookie = `ebpf::site_cookie` (binary
//!   ordinal, record selector, site id); drains and resets the thread's buffer of that
//!   binary (keeps order), then emits the record an inline stub would (a memory site's
//!   effective address and a USDT probe's arguments from its `OPERANDS` descriptors,
//!   the arguments after the second in `FLAG_USDT_MORE` records of the same chunk).
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
mod filter;
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
    CAUSE_CRASH, CAUSE_FULL, CAUSE_REGISTER, CAUSE_TASK_EXIT, CAUSE_THREAD_EXIT, CAUSE_UPROBE_SITE,
    CHUNK_KIND_UPROBE, ChunkHeader, FLAG_KTIME, FLAG_UPROBE, FLAG_USDT_INDEX_SHIFT, FLAG_USDT_MORE,
    Record, STAT_CHUNKS, STAT_READ_ERRORS, STAT_RECORDS_DELIVERED, STAT_RECORDS_DROPPED,
    STAT_RECORDS_FILTERED, STAT_RECORDS_PRODUCED, Slot,
    ebpf::{
        SEL_BLOCK, SEL_CALL, SEL_EXIT, SEL_MEMORY, SEL_USDT, STAT_TABLE_FULL, cookie_ordinal,
        cookie_selector, operand_key,
    },
    operand::{
        MAX_OPERAND_RECORDS, MAX_OPERANDS, OP_ADDR, OP_IMM, OP_LOAD, OP_REG, OPF_HIGH8, OPF_SIGNED,
        OPF_STRIP_PAC, OPF_TP, Operand, OperandSet, PAC_BITS,
    },
};
use tracer_common::{RWH_USER_STATE, USER_ON};

use crate::{
    arch::{NREGS, thread_pointer},
    maps::{
        BINARIES, E_BAD_RW, EVENTS, EXIT_DRAINED, EXIT_GROUP_DEAD_OFF, FORK_CHILD_PID_OFF,
        OPERANDS, SYSTEM_WIDE, TABLES, TARGETS, is_target, next_seq, remember_rw_base, stat_add,
    },
    slots::{AFTER_EXIT, AFTER_RELEASE, AFTER_RESET, AFTER_SIGNAL, drain_slot},
    tables::{drain_exiting, find_binary_slot, plan_exit_drain, run_exit_drain},
    user::read_user,
};

#[uprobe]
pub fn flush(ctx: ProbeContext) -> u32 {
    flush_impl::<false>(&ctx)
}

/// `flush` as a sleepable program: non-resident buffer pages are faulted in.
#[uprobe(sleepable)]
pub fn flush_s(ctx: ProbeContext) -> u32 {
    flush_impl::<true>(&ctx)
}

#[inline(always)]
fn flush_impl<const S: bool>(ctx: &ProbeContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let slot_addr = arch::slot_arg(ctx);
    let slot = match read_user::<Slot>(slot_addr) {
        Ok(s) => s,
        Err(e) => {
            stat_add(STAT_READ_ERRORS, 1);
            error!(ctx, "flush: cannot read slot at {:x}: {}", slot_addr, e);
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
            ctx,
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
    let r = drain_slot::<S>(slot_addr, slot.rw_base, pid_tid, cause, AFTER_RESET);
    if r < 0 {
        error!(ctx, "flush: drain of slot {:x} failed: {}", slot_addr, r);
    }
    0
}

/// One uprobe-site event as it goes into the ring buffer: its record and, for a USDT
/// probe of more than two arguments, the `FLAG_USDT_MORE` records after it (the
/// header's `count` says how many are valid).
#[repr(C)]
struct UprobeChunk<const N: usize> {
    header: ChunkHeader,
    records: [Record; N],
}

/// What every record of a uprobe-site event shares, and the first record's values
/// from the selector's registers.
struct Event {
    pid_tid: u64,
    binary_id: u64,
    site: u32,
    value: u64,
    aux: u64,
    /// The thread pointer (`%fs:`-relative operands).
    tp: u64,
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
        let r = drain_slot::<false>(slot, rw, pid_tid, CAUSE_UPROBE_SITE, AFTER_RESET);
        if r < 0 {
            error!(&ctx, "site: drain of slot {:x} failed: {}", slot, r);
        }
    }

    site_event(&ctx, pid_tid, cookie, binary_id, tp);
    0
}

/// The record of a uprobe site. Its own frame: the event's locals must not sit under
/// the drain's frames (the verifier's 512-byte combined stack, callbacks included on
/// Linux 6.1).
#[inline(never)]
fn site_event(ctx: &ProbeContext, pid_tid: u64, cookie: u64, binary_id: u64, tp: u64) {
    // Every register is read unconditionally: the verifier refuses a context access
    // through a pointer that depends on the selector.
    let (arg, ret, pc) = (arch::first_arg(ctx), arch::return_value(ctx), arch::pc(ctx));
    let ra = arch::return_address(ctx);
    // SAFETY: reading a local; keeps LLVM from turning the choice into a ctx offset.
    let selector = unsafe { core::ptr::read_volatile(&cookie_selector(cookie)) };
    let (value, aux) = match selector {
        SEL_EXIT => (ret, ra),
        SEL_BLOCK => (pc, 0),
        // The effective address comes from the site's operands.
        SEL_MEMORY => (0, pc),
        // The arguments come from the site's operands.
        SEL_USDT => (0, 0),
        SEL_CALL => (0, pc),
        _ => (arg, ra),
    };
    let ops = match selector {
        SEL_MEMORY | SEL_USDT => {
            OPERANDS.get_ptr(operand_key(cookie_ordinal(cookie), cookie as u32))
        }
        _ => None,
    };
    let ev = Event {
        pid_tid,
        binary_id,
        site: cookie as u32,
        value,
        aux,
        tp,
    };
    match ops {
        // SAFETY: a live OPERANDS value.
        Some(set) if unsafe { (*set).count } > 2 => {
            emit::<MAX_OPERAND_RECORDS>(ctx, &ev, Some(set));
        }
        set => emit::<1>(ctx, &ev, set),
    }
}

/// Reserve room for `N` records, write the event (values from `set` when there is
/// one) and submit it. `N` = 1 unless `set` has more than two operands.
#[inline(always)]
fn emit<const N: usize>(ctx: &ProbeContext, ev: &Event, set: Option<*const OperandSet>) {
    let nrec = match set {
        // SAFETY: a live OPERANDS value.
        Some(s) => unsafe { (*s).records() }.min(N),
        None => 1,
    };
    stat_add(STAT_RECORDS_PRODUCED, nrec as u64);
    // SAFETY: no preconditions.
    let time = unsafe { bpf_ktime_get_ns() };
    if !filter::uprobe_record_passes(ev.pid_tid, ev.binary_id, ev.site, ev.value) {
        stat_add(STAT_RECORDS_FILTERED, nrec as u64);
        return;
    }
    filter::announce_comm(ev.pid_tid, ev.binary_id, time);
    let seq = next_seq();
    let Some(mut entry) = EVENTS.reserve::<UprobeChunk<N>>(0) else {
        stat_add(STAT_RECORDS_DROPPED, nrec as u64);
        return;
    };
    let p = entry.as_mut_ptr();
    let flags = FLAG_KTIME | FLAG_UPROBE;
    // SAFETY: p is the reservation, room for one UprobeChunk<N>; set is a live
    // OPERANDS value.
    unsafe {
        (*p).header = ChunkHeader {
            kind: CHUNK_KIND_UPROBE,
            count: nrec as u32,
            pid: (ev.pid_tid >> 32) as u32,
            tid: ev.pid_tid as u32,
            seq,
            binary_id: ev.binary_id,
            cause: CAUSE_UPROBE_SITE,
            _pad: 0,
            time,
        };
        (*p).records[0] = Record {
            site: ev.site,
            flags: flags | set.map_or(0, |s| (*s).flags),
            time,
            value: ev.value,
            aux: ev.aux,
        };
        // The records an inline USDT stub reserves after the first: arguments 2k+3
        // and 2k+4, zeros where the probe has fewer.
        for j in 1..N {
            (*p).records[j] = Record {
                site: ev.site,
                flags: flags | FLAG_USDT_MORE | ((j as u32 - 1) << FLAG_USDT_INDEX_SHIFT),
                time,
                value: 0,
                aux: 0,
            };
        }
        if let Some(s) = set {
            fill::<N>(ctx, s, &raw mut (*p).records, ev.tp);
        }
    }
    entry.submit(0);
    stat_add(STAT_RECORDS_DELIVERED, nrec as u64);
    stat_add(STAT_CHUNKS, 1);
}

/// Evaluate the operands of `set` into `recs`: operand k → value (k even) or aux (k
/// odd) of record k / 2. Its own function, so that the register file (up to 264
/// bytes) is on the stack only while it runs, not under the drain's frames.
#[inline(never)]
fn fill<const N: usize>(
    ctx: &ProbeContext,
    set: *const OperandSet,
    recs: *mut [Record; N],
    tp: u64,
) {
    let mut regs = [0u64; NREGS];
    arch::registers(ctx, &mut regs);
    // SAFETY: a live OPERANDS value.
    let n = usize::from(unsafe { (*set).count });
    // A constant bound, so that the verifier sees every store inside the reservation.
    let bound = if 2 * N < MAX_OPERANDS {
        2 * N
    } else {
        MAX_OPERANDS
    };
    for k in 0..bound {
        if k >= n {
            break;
        }
        // SAFETY: k < MAX_OPERANDS; k / 2 < N.
        unsafe {
            let v = eval(&regs, &(*set).ops[k], tp);
            let r = recs.cast::<Record>().add(k / 2);
            if k % 2 == 0 {
                (*r).value = v;
            } else {
                (*r).aux = v;
            }
        }
    }
}

/// The value an operand describes, from the register file `regs` (descriptor
/// numbering) and the thread's memory. A load that fails gives 0 and counts a read
/// error.
#[inline(never)]
fn eval(regs: &[u64; NREGS], op: &Operand, tp: u64) -> u64 {
    // A register number from the map is checked against the file (REG_NONE → 0).
    let reg = |r: u8| regs.get(usize::from(r)).copied().unwrap_or(0);
    match op.kind {
        OP_IMM => op.disp as u64,
        OP_REG if op.flags & OPF_HIGH8 != 0 => {
            let v = reg(op.base) >> 8;
            if op.flags & OPF_SIGNED != 0 {
                v as i8 as i64 as u64
            } else {
                v as u8 as u64
            }
        }
        OP_REG => op.extend(reg(op.base)),
        OP_ADDR | OP_LOAD => {
            let mut base = reg(op.base);
            if op.flags & OPF_STRIP_PAC != 0 {
                base &= !PAC_BITS;
            }
            let mut ea = base
                .wrapping_add(op.scaled_index(reg(op.index)))
                .wrapping_add(op.disp as u64);
            if op.flags & OPF_TP != 0 {
                ea = ea.wrapping_add(tp);
            }
            if op.kind == OP_ADDR {
                return ea;
            }
            let v = match op.size {
                1 => read_user::<u8>(ea).map(u64::from),
                2 => read_user::<u16>(ea).map(u64::from),
                4 => read_user::<u32>(ea).map(u64::from),
                _ => read_user::<u64>(ea),
            };
            match v {
                Ok(v) => op.extend(v),
                Err(_) => {
                    stat_add(STAT_READ_ERRORS, 1);
                    0
                }
            }
        }
        _ => 0,
    }
}

#[tracepoint]
pub fn thread_exit(ctx: TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    if is_target((pid_tid >> 32) as u32) {
        let r = drain_exiting(&ctx, pid_tid, CAUSE_THREAD_EXIT, AFTER_RELEASE);
        if r < 0 {
            error!(&ctx, "thread_exit: drain failed: {}", r);
        }
    }
    0
}

/// The thread calling exit_group (or execve) drains (and resets) its own slots while
/// its memory is still mapped: before Linux 6.16 `sched_process_exit` fires after
/// `exit_mm`, too late to read user memory, so `task_exit` alone would lose what the
/// buffers hold. Circular buffers are delivered too (an exec that fails leaves the
/// process running: trace buffers go on from where this drain stopped).
#[tracepoint]
pub fn group_exit(ctx: TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    if is_target((pid_tid >> 32) as u32) {
        let r = drain_exiting(&ctx, pid_tid, CAUSE_THREAD_EXIT, AFTER_SIGNAL);
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
/// SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS: a crash (or a handler
/// the program installed for one).
const CRASH_SIGNALS: [i32; 7] = [4, 5, 6, 7, 8, 11, 31];

/// A thread dequeuing SIGKILL (a kill, or another thread's exit_group zapping it) is
/// about to run do_exit: drain its slots now, while its memory is still mapped (see
/// `group_exit`). SIGKILL cannot be caught, so the thread never records again. A
/// thread taking a crash signal has its buffers delivered too (circular buffers: the
/// records leading up to the crash); if it survives (a handler), it goes on recording.
#[tracepoint]
pub fn killed(ctx: TracePointContext) -> u32 {
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
    let r = drain_exiting(&ctx, pid_tid, cause, AFTER_SIGNAL);
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
        error!(&ctx, "task_exit: drain failed: {}", planned);
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
    if planned == 1 {
        let r = run_exit_drain(&ctx, pid_tid);
        error!(&ctx, "task_exit: drain failed: {}", r);
    }
    0
}

/// One step of an exit drain, reached by tail calls only (see `tables::ExitWork`).
#[tracepoint]
pub fn exit_step(ctx: TracePointContext) -> u32 {
    let r = tables::exit_step(&ctx);
    if r < 0 {
        error!(&ctx, "exit drain step failed: {}", r);
    }
    0
}

#[tracepoint]
pub fn fork(ctx: TracePointContext) -> u32 {
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
        error!(&ctx, "fork: cannot read child_pid");
        return 0;
    };
    if !system_wide && let Err(e) = TARGETS.insert(child, 1u8, 0) {
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
    let header = ChunkHeader {
        kind: tracer_common::CHUNK_KIND_MAPPED,
        count: 0,
        pid: (pid_tid >> 32) as u32,
        tid: pid_tid as u32,
        seq: 0,
        binary_id: 0,
        cause,
        _pad: 0,
        // SAFETY: no preconditions.
        time: unsafe { bpf_ktime_get_ns() },
    };
    // SAFETY: the reservation has room for one ChunkHeader.
    unsafe { entry.as_mut_ptr().write(header) };
    entry.submit(0);
}

/// A process exec'd: a system-wide session looks for instrumented binaries in it
/// (its executable is mapped by now; the libraries come with `mmap`).
#[tracepoint]
pub fn exec(_ctx: TracePointContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    if is_target(tgid) {
        // The old image's RW areas are gone (their buffers were drained at
        // sys_enter_execve); the new image's are learned afresh.
        let _ = TABLES.remove(tgid);
        announce_mapped(pid_tid, tracer_common::CAUSE_EXEC);
    }
    0
}

/// A traced process maps a file executable (the loader, or `dlopen`): the tracer
/// looks for an instrumented binary it does not trace yet.
#[tracepoint]
pub fn mmap(ctx: TracePointContext) -> u32 {
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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// bpf_probe_write_user and bpf_probe_read_user are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
