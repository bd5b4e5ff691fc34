//! Linux user ABI constants that are the same on x86-64 and AArch64 (the injected
//! runtimes' system calls; the syscall numbers themselves differ and stay with each
//! backend).

pub(crate) const ESRCH: u32 = 3;
pub(crate) const EINTR: u32 = 4;
pub(crate) const EBADF: u32 = 9;
pub(crate) const AF_UNIX: u32 = 1;
pub(crate) const SOCK_STREAM: u32 = 1;
pub(crate) const SOCK_SEQPACKET: u32 = 5;
pub(crate) const SOCK_NONBLOCK: u32 = 0o4000;
pub(crate) const SOCK_CLOEXEC: u32 = 0o2000000;
pub(crate) const O_CLOEXEC: u32 = 0o2000000;
pub(crate) const SOL_SOCKET: u32 = 1;
pub(crate) const SO_TYPE: u32 = 3;
pub(crate) const SO_PEERCRED: u32 = 17;
/// `struct ucred { pid, uid, gid }`: its size and where the uid is.
pub(crate) const UCRED_SIZE: u32 = 12;
pub(crate) const UCRED_UID: u32 = 4;
/// `prctl(PR_GET_DUMPABLE)`: 1 unless the process gained privileges at exec (setuid,
/// setgid, file capabilities: `AT_SECURE`) or changed its credentials since.
pub(crate) const PR_GET_DUMPABLE: u32 = 3;
pub(crate) const SUID_DUMP_USER: u32 = 1;
pub(crate) const MSG_NOSIGNAL: u32 = 0x4000;
pub(crate) const MSG_DONTWAIT: u32 = 0x40;
pub(crate) const POLLIN: u32 = 1;
