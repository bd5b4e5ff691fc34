//! The x86-64 Linux system call numbers (and ISA-specific arguments) of the injected
//! runtime: flush, its armed wait path (`wait.rs`), register, the user drain. The
//! constants that are the same on every ISA are in `isa::linux`.

pub(super) const SYS_GETPID: u32 = 39;
pub(super) const SYS_GETTID: u32 = 186;
pub(super) const SYS_TGKILL: u32 = 234;
pub(super) const SYS_ARCH_PRCTL: u32 = 158;
pub(super) const ARCH_SET_FS: u32 = 0x1002;
pub(super) const SYS_RT_SIGPROCMASK: u32 = 14;
pub(super) const SIG_BLOCK: u32 = 0;
pub(super) const SIG_SETMASK: u32 = 2;
pub(super) const SYS_SENDMSG: u32 = 46;
pub(super) const SYS_SENDTO: u32 = 44;
pub(super) const SYS_GETSOCKOPT: u32 = 55;
pub(super) const SYS_SOCKET: u32 = 41;
pub(super) const SYS_CONNECT: u32 = 42;
pub(super) const SYS_CLOSE: u32 = 3;
pub(super) const SYS_DUP3: u32 = 292;
pub(super) const SYS_PPOLL: u32 = 271;
pub(super) const SYS_PRCTL: u32 = 157;
pub(super) const SYS_GETEUID: u32 = 107;
pub(super) const SYS_SCHED_YIELD: u32 = 24;
pub(super) const SYS_NANOSLEEP: u32 = 35;
pub(super) const SYS_RT_SIGTIMEDWAIT: u32 = 128;
pub(super) const SYS_RT_TGSIGQUEUEINFO: u32 = 297;
