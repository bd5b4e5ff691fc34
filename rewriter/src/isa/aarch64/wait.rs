//! Back-pressure in the flush function (AArch64): the armed path, taken while
//! `RwHeader::on_full` says the tracer waits for room in its ring buffer. The same
//! protocol as x86-64 (see that `wait.rs`), with the flush mode in x11.

use super::enc::*;
use super::slot::reset_buffer;
use super::sys::*;
use tracer_common::*;

/// Answers `take_hold` takes at most (one per tracer in a session on the process).
const MAX_ANSWERS: u32 = 8;
/// take_hold's frame.
const FRAME_TAKE: i32 = 208;

/// Armed frame: x0-x3, x8, x12 (flushes left), x30, then the signal masks and the
/// sleep's timespec.
const ALL: u32 = 64;
const OLD: u32 = 72;
const SLEEP: u32 = 80;
const FRAME: i32 = 96;

/// Entry and re-entry points of the armed path.
pub(super) struct Labels {
    /// From `flush` (x9 = slot): block signals, flush armed.
    pub enter: Label,
    /// After the probe when x11 is not 0.
    pub after: Label,
}

impl Labels {
    pub(super) fn new(a: &mut Asm) -> Self {
        Labels {
            enter: a.label(),
            after: a.label(),
        }
    }
}

/// x10 = x11 - `v` (0 when the flush mode is `v`). Flag-free.
fn mode_minus(a: &mut Asm, v: u64) {
    a.put_all(&mov_imm64(10, v));
    a.put(sub_reg(10, 11, 10));
}

/// The armed path: `again` reaches the probe; `done` is the plain path's `ret` (for a
/// registration's flush, `FLUSH_HELLO`). Flag-free, as the flush must be.
pub(super) fn emit_armed(a: &mut Asm, l: &Labels, again: Label, done: Label, take_hold: Label) {
    let (sleep, retry, last, drained, leave) =
        (a.label(), a.label(), a.label(), a.label(), a.label());
    a.bind(l.enter);
    a.put(stp_pre(0, 1, SP, -FRAME));
    a.put(stp(2, 3, SP, 16));
    a.put(stp(8, 12, SP, 32));
    a.put(str_x(LR, SP, 48));
    block_signals(a, ALL, OLD);
    a.put(str_x(XZR, SP, SLEEP));
    a.put_all(&mov_imm64(0, FLUSH_WAIT_NS));
    a.put(str_x(0, SP, SLEEP + 8));
    a.put_all(&mov_imm64(12, u64::from(FLUSH_TRIES)));
    a.put_all(&mov_imm64(11, FLUSH_ARMED));
    a.b_l(again);

    a.bind(l.after);
    mode_minus(a, FLUSH_HELLO);
    a.cbz_l(true, false, 10, done);
    a.bl_l(take_hold);
    a.cbz_l(true, false, 0, drained);
    mode_minus(a, FLUSH_FINAL);
    a.cbz_l(true, false, 10, drained);
    a.put(sub_imm(12, 12, 1, false));
    a.cbz_l(true, false, 12, last);
    a.put_all(&mov_imm64(10, u64::from(FLUSH_TRIES - FLUSH_YIELDS)));
    a.put(sub_reg(10, 12, 10));
    a.tbz_l(true, 10, 63, sleep);
    a.put(movz(8, SYS_SCHED_YIELD, 0));
    a.put(SVC0);
    a.b_l(retry);
    a.bind(sleep);
    a.put(add_imm(0, SP, SLEEP, false));
    a.put(movz(1, 0, 0));
    a.put(movz(8, SYS_NANOSLEEP, 0));
    a.put(SVC0);
    a.bind(retry);
    a.put_all(&mov_imm64(11, FLUSH_ARMED));
    a.b_l(again);
    a.bind(last);
    a.put_all(&mov_imm64(11, FLUSH_FINAL));
    a.b_l(again);

    // Drained (or dropped at the last try): reset a full buffer whose records are
    // all written. Signals are still blocked, so `cur` moved only by this thread.
    a.bind(drained);
    a.put(ldr_x(10, 9, SLOT_INFLIGHT as u32));
    a.cbz_l(true, true, 10, leave);
    a.put(ldr_x(10, 9, SLOT_CUR as u32));
    a.put(ldr_x(11, 9, SLOT_END as u32));
    a.put(sub_reg(10, 10, 11));
    a.tbz_l(true, 10, 63, leave);
    reset_buffer(a);
    a.bind(leave);
    restore_signals(a, OLD);
    a.put(ldr_x(LR, SP, 48));
    a.put(ldp(8, 12, SP, 32));
    a.put(ldp(2, 3, SP, 16));
    a.put(ldp_post(0, 1, SP, FRAME));
    a.put(RET);
}

/// take_hold() → x0 = 1 if the kernel's `HOLD_SIGNAL` was pending, else 0; as on
/// x86-64 (every answer taken, a signal of the program's own queued again). Preserves
/// everything but x0; flag-free. Frame: x1-x5, x8, [sp+48] the set, [sp+56] zero
/// timeout, [sp+80] siginfo (128 bytes); x4 = looks left, x5 = the answer.
pub(super) fn emit_take_hold(a: &mut Asm, label: Label) {
    let (look, foreign, out) = (a.label(), a.label(), a.label());
    a.bind(label);
    a.put(stp_pre(1, 2, SP, -FRAME_TAKE));
    a.put(stp(3, 4, SP, 16));
    a.put(stp(5, 8, SP, 32));
    a.put(movz(4, MAX_ANSWERS, 0));
    a.put(movz(5, 0, 0));
    a.bind(look);
    a.put_all(&mov_imm64(0, 1u64 << (HOLD_SIGNAL - 1)));
    a.put(str_x(0, SP, 48));
    a.put(str_x(XZR, SP, 56));
    a.put(str_x(XZR, SP, 64));
    a.put(add_imm(0, SP, 48, false));
    a.put(add_imm(1, SP, 80, false));
    a.put(add_imm(2, SP, 56, false));
    a.put(movz(3, 8, 0));
    a.put(movz(8, SYS_RT_SIGTIMEDWAIT, 0));
    a.put(SVC0);
    a.put(sub_imm(1, 0, HOLD_SIGNAL, false));
    a.cbz_l(true, true, 1, out);
    a.put(ldr_w(1, SP, 80 + 8)); // si_code
    a.put(sub_imm(1, 1, SI_KERNEL as u32, false));
    a.cbz_l(true, true, 1, foreign);
    a.put(movz(5, 1, 0));
    a.put(sub_imm(4, 4, 1, false));
    a.cbz_l(true, true, 4, look);
    a.b_l(out);
    // The program's own: queue it again.
    a.bind(foreign);
    a.put(movz(8, SYS_GETPID, 0));
    a.put(SVC0);
    a.put(str_x(0, SP, 48));
    a.put(movz(8, SYS_GETTID, 0));
    a.put(SVC0);
    a.put(mov_reg(1, 0));
    a.put(ldr_x(0, SP, 48));
    a.put(movz(2, HOLD_SIGNAL, 0));
    a.put(add_imm(3, SP, 80, false));
    a.put(movz(8, SYS_RT_TGSIGQUEUEINFO, 0));
    a.put(SVC0);
    a.bind(out);
    a.put(mov_reg(0, 5));
    a.put(ldp(5, 8, SP, 32));
    a.put(ldp(3, 4, SP, 16));
    a.put(ldp_post(1, 2, SP, FRAME_TAKE));
    a.put(RET);
}
