//! `flush` and `flush_s`: the uprobe on the injected flush function drains a full
//! buffer (and learns the process's RW area on the registration call, `cur == start`).
//!
//! Under `--on-full wait` (`ON_FULL`) an armed flush (`FLUSH_ARMED` in the flush
//! register) whose drain finds no room is held: the buffer stays as it is, from where
//! the drain stopped, and `HOLD_SIGNAL` tells the flush function to wait and flush
//! again. A registration's flush (`FLUSH_HELLO`) gets the same signal as the answer
//! that this tracer waits. If the signal cannot be sent, the held records are counted
//! dropped: the flush function resets the buffer.
//!
//! `flush_s`, where the kernel has sleepable uprobes: a buffer page that is not resident
//! (swapped out, a file page never touched) makes `bpf_probe_read_user` fail, and the drain
//! retries with `bpf_copy_from_user`, which faults it in (test `nonresident`).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_send_signal_thread},
    programs::ProbeContext,
};
use tracer_common::{
    CAUSE_FULL, CAUSE_REGISTER, FLUSH_ARMED, FLUSH_HELLO, HOLD_SIGNAL, RWH_USER_STATE, STAT_HOLDS,
    STAT_READ_ERRORS, STAT_RECORDS_DROPPED, STAT_RECORDS_PRODUCED, STAT_TABLE_FULL,
    STAT_TABLE_SHARE, Slot, USER_ON,
};

use super::is_target;
use crate::{
    arch,
    books::stat_add,
    maps::ON_FULL,
    slots::{AFTER_RESET, HOLD, drain_slot, held},
    tables::{E_BAD_RW, E_TABLE_SHARE, remember_rw_base},
    user::read_user,
};

/// The flush uprobe; `S` = the sleepable variant (`flush_s`), which faults
/// non-resident buffer pages in.
#[inline(always)]
pub(crate) fn flush<const S: bool>(ctx: &ProbeContext) -> u32 {
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
            log_error!(ctx, "flush: cannot read slot at {:x}: {}", slot_addr, e);
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
        log_error!(
            ctx,
            "flush: slot {:x} names rw_base {:x} without an RW header",
            slot_addr,
            slot.rw_base
        );
    } else if r == E_TABLE_SHARE {
        // Its user holds its share of TABLES: not drained at exit. Not logged either.
        stat_add(STAT_TABLE_SHARE, 1);
    } else if r < 0 {
        // Not logged: it would repeat at every flush.
        stat_add(STAT_TABLE_FULL, 1);
    }
    let cause = if slot.cur == slot.start {
        CAUSE_REGISTER
    } else {
        CAUSE_FULL
    };
    let waits = ON_FULL.load() != 0;
    let mode = arch::flush_mode(ctx);
    if waits && mode == FLUSH_HELLO {
        let _ = hold_signal();
    }
    let after = if waits && mode == FLUSH_ARMED {
        AFTER_RESET | HOLD
    } else {
        AFTER_RESET
    };
    let r = drain_slot::<S>(slot_addr, slot.rw_base, pid_tid, cause, after);
    if let Some(left) = held(r) {
        if hold_signal() {
            stat_add(STAT_HOLDS, 1);
        } else {
            stat_add(STAT_RECORDS_PRODUCED, left);
            stat_add(STAT_RECORDS_DROPPED, left);
        }
    } else if r < 0 {
        log_error!(ctx, "flush: drain of slot {:x} failed: {}", slot_addr, r);
    }
    0
}

/// Send `HOLD_SIGNAL` to the flushing thread (which has it blocked).
#[inline(always)]
fn hold_signal() -> bool {
    // SAFETY: no pointers; the kernel checks the target (the current thread).
    unsafe { bpf_send_signal_thread(HOLD_SIGNAL) == 0 }
}
