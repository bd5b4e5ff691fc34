//! The AArch64 Linux system call numbers of the injected runtime (flush, its armed wait
//! path `wait.rs`, register, the user drain) and the `rt_sigprocmask` calls that hold
//! signals off while it works. The constants that are the same on every ISA are in
//! `isa::linux`.

use super::enc::*;

pub(super) const SYS_GETPID: u32 = 172;
pub(super) const SYS_GETTID: u32 = 178;
pub(super) const SYS_TGKILL: u32 = 131;
pub(super) const SYS_RT_SIGPROCMASK: u32 = 135;
pub(super) const SIG_BLOCK: u32 = 0;
pub(super) const SIG_SETMASK: u32 = 2;
pub(super) const SYS_SENDMSG: u32 = 211;
pub(super) const SYS_SENDTO: u32 = 206;
pub(super) const SYS_GETSOCKOPT: u32 = 209;
pub(super) const SYS_SOCKET: u32 = 198;
pub(super) const SYS_CONNECT: u32 = 203;
pub(super) const SYS_DUP3: u32 = 24;
pub(super) const SYS_CLOSE: u32 = 57;
pub(super) const SYS_PPOLL: u32 = 73;
pub(super) const SYS_PRCTL: u32 = 167;
pub(super) const SYS_GETEUID: u32 = 175;
pub(super) const SYS_SCHED_YIELD: u32 = 124;
pub(super) const SYS_NANOSLEEP: u32 = 101;
pub(super) const SYS_RT_SIGTIMEDWAIT: u32 = 137;
pub(super) const SYS_RT_TGSIGQUEUEINFO: u32 = 240;

/// Block every signal; the mask words live at `[sp + new_off]` and `[sp + old_off]`
/// (the old mask is saved there). Clobbers x0-x3 and x8.
pub(super) fn block_signals(a: &mut Asm, new_off: u32, old_off: u32) {
    a.put_all(&mov_imm64(0, u64::MAX));
    a.put(str_x(0, SP, new_off));
    a.put(movz(0, SIG_BLOCK, 0));
    a.put(add_imm(1, SP, new_off, false));
    a.put(add_imm(2, SP, old_off, false));
    a.put(movz(3, 8, 0));
    a.put(movz(8, SYS_RT_SIGPROCMASK, 0));
    a.put(SVC0);
}

/// Put back the mask that [`block_signals`] saved at `[sp + old_off]`. Clobbers x0-x3
/// and x8.
pub(super) fn restore_signals(a: &mut Asm, old_off: u32) {
    a.put(movz(0, SIG_SETMASK, 0));
    a.put(add_imm(1, SP, old_off, false));
    a.put(movz(2, 0, 0));
    a.put(movz(3, 8, 0));
    a.put(movz(8, SYS_RT_SIGPROCMASK, 0));
    a.put(SVC0);
}
