//! Back-pressure in the flush function (x86-64): the armed path, taken while
//! `RwHeader::on_full` says the tracer waits for room in its ring buffer.
//!
//! The eBPF side may not write user memory (kernel lockdown), so the protocol runs on
//! registers and a signal (see `tracer_common::HOLD_SIGNAL`): with every signal
//! blocked, the flush hands the drain `FLUSH_ARMED` in %rdx; a drain that finds no
//! room leaves the buffer as it is and sends `HOLD_SIGNAL`; the flush takes it
//! (`take_hold`), waits (`sched_yield`, then short sleeps) and flushes again. The last
//! of `FLUSH_TRIES` flushes says `FLUSH_FINAL`: the drain then drops what finds no
//! room (counted), so a stopped tracer stalls the program for seconds, not forever.
//! Blocked signals also keep handlers from recording into a buffer that is waiting.

use iced_x86::IcedError;
use iced_x86::code_asm::*;
use tracer_common::*;

use super::slot::reset_buffer;
use super::sys::*;

/// Answers `take_hold` takes at most (one per tracer in a session on the process).
const MAX_ANSWERS: u32 = 8;

/// Entry and re-entry points of the armed path.
pub(super) struct Labels {
    /// From `flush` (%rdx saved, %rsi = slot): block signals, flush armed.
    pub enter: CodeLabel,
    /// After the probe when %rdx is not 0.
    pub after: CodeLabel,
}

impl Labels {
    pub(super) fn new(a: &mut CodeAssembler) -> Self {
        Labels {
            enter: a.create_label(),
            after: a.create_label(),
        }
    }
}

/// The armed path: `again` loads `cur` and reaches the probe; `done` is the plain
/// path's exit (pops %rdx, returns) for a registration's flush (`FLUSH_HELLO`).
/// Frame: %rdi %r8-%r11, then [rsp] = all signals, [rsp+8] = old mask, [rsp+16] = the
/// sleep's timespec. %r8 = slot across system calls, %r9 = flushes left.
pub(super) fn emit_armed(
    a: &mut CodeAssembler,
    l: &mut Labels,
    again: CodeLabel,
    done: CodeLabel,
    take_hold: CodeLabel,
) -> Result<(), IcedError> {
    let (mut sleep, mut retry, mut last, mut drained, mut leave) = (
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
    );
    a.set_label(&mut l.enter)?;
    for r in [rdi, r8, r9, r10, r11] {
        a.push(r)?;
    }
    a.sub(rsp, 32)?;
    a.mov(qword_ptr(rsp), -1)?;
    a.mov(qword_ptr(rsp + 16), 0)?;
    a.mov(qword_ptr(rsp + 24), FLUSH_WAIT_NS as i32)?;
    a.mov(r8, rsi)?;
    sigprocmask(a, SIG_BLOCK, 0, 8)?;
    a.mov(r9d, FLUSH_TRIES)?;
    a.mov(rdx, FLUSH_ARMED)?;
    a.jmp(again)?;

    a.set_label(&mut l.after)?;
    a.mov(rcx, FLUSH_HELLO)?;
    a.cmp(rdx, rcx)?;
    a.je(done)?;
    a.call(take_hold)?;
    a.test(eax, eax)?;
    a.je(drained)?;
    a.mov(rcx, FLUSH_FINAL)?;
    a.cmp(rdx, rcx)?;
    a.je(drained)?;
    a.dec(r9d)?;
    a.je(last)?;
    a.cmp(r9d, FLUSH_TRIES - FLUSH_YIELDS)?;
    a.jb(sleep)?;
    a.mov(eax, SYS_SCHED_YIELD)?;
    a.syscall()?;
    a.jmp(retry)?;
    a.set_label(&mut sleep)?;
    a.lea(rdi, ptr(rsp + 16))?;
    a.xor(esi, esi)?;
    a.mov(eax, SYS_NANOSLEEP)?;
    a.syscall()?;
    a.mov(rsi, r8)?;
    a.set_label(&mut retry)?;
    a.mov(rdx, FLUSH_ARMED)?;
    a.jmp(again)?;
    a.set_label(&mut last)?;
    a.mov(rdx, FLUSH_FINAL)?;
    a.jmp(again)?;

    // Drained (or dropped at the last try): reset a full buffer whose records are
    // all written. Signals are still blocked, so `cur` moved only by this thread.
    a.set_label(&mut drained)?;
    a.cmp(qword_ptr(rsi + SLOT_INFLIGHT as i32), 0)?;
    a.jne(leave)?;
    a.mov(rcx, qword_ptr(rsi + SLOT_CUR as i32))?;
    a.cmp(rcx, qword_ptr(rsi + SLOT_END as i32))?;
    a.jb(leave)?;
    reset_buffer(a)?;
    a.set_label(&mut leave)?;
    sigprocmask(a, SIG_SETMASK, 8, -1)?;
    a.add(rsp, 32)?;
    for r in [r11, r10, r9, r8, rdi] {
        a.pop(r)?;
    }
    a.pop(rdx)?;
    a.ret()
}

/// `rt_sigprocmask(how, rsp + set, rsp + old or NULL if < 0)`, then %rsi = %r8.
fn sigprocmask(a: &mut CodeAssembler, how: u32, set: i32, old: i32) -> Result<(), IcedError> {
    a.mov(edi, how)?;
    a.lea(rsi, ptr(rsp + set))?;
    if old < 0 {
        a.xor(edx, edx)?;
    } else {
        a.lea(rdx, ptr(rsp + old))?;
    }
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()?;
    a.mov(rsi, r8)
}

/// take_hold() → %eax = 1 if the kernel's `HOLD_SIGNAL` was pending, else 0. The
/// caller has it blocked. Takes every one the kernel sent (each tracer in a session on
/// this process answers: one left pending would kill the program once unblocked); one
/// the program sent itself is queued again, and ends the look. Preserves everything but
/// %rax and flags. Frame: [rsp] = the set, [rsp+8] = zero timeout, [rsp+32] = siginfo
/// (128 bytes); %r8 = looks left, %r9 = the answer.
pub(super) fn emit_take_hold(
    a: &mut CodeAssembler,
    label: &mut CodeLabel,
) -> Result<(), IcedError> {
    let saved = [rcx, rdx, rsi, rdi, r8, r9, r10, r11];
    let (mut look, mut foreign, mut out) = (a.create_label(), a.create_label(), a.create_label());
    a.set_label(label)?;
    for r in saved {
        a.push(r)?;
    }
    a.sub(rsp, 160)?;
    a.mov(r8d, MAX_ANSWERS)?;
    a.xor(r9d, r9d)?;
    a.set_label(&mut look)?;
    a.mov(rax, 1u64 << (HOLD_SIGNAL - 1))?;
    a.mov(qword_ptr(rsp), rax)?;
    a.xor(eax, eax)?;
    a.mov(qword_ptr(rsp + 8), rax)?;
    a.mov(qword_ptr(rsp + 16), rax)?;
    a.mov(rdi, rsp)?;
    a.lea(rsi, ptr(rsp + 32))?;
    a.lea(rdx, ptr(rsp + 8))?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGTIMEDWAIT)?;
    a.syscall()?;
    a.cmp(eax, HOLD_SIGNAL)?;
    a.jne(out)?;
    a.cmp(dword_ptr(rsp + 32 + 8), SI_KERNEL)?; // si_code
    a.jne(foreign)?;
    a.mov(r9d, 1)?;
    a.dec(r8d)?;
    a.jne(look)?;
    a.jmp(out)?;
    a.set_label(&mut foreign)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(edi, eax)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(esi, eax)?;
    a.mov(edx, HOLD_SIGNAL)?;
    a.lea(r10, ptr(rsp + 32))?;
    a.mov(eax, SYS_RT_TGSIGQUEUEINFO)?;
    a.syscall()?;
    a.set_label(&mut out)?;
    a.mov(eax, r9d)?;
    a.add(rsp, 160)?;
    for r in saved.into_iter().rev() {
        a.pop(r)?;
    }
    a.ret()
}
