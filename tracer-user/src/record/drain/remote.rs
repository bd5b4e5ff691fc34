//! Another process's memory and threads: `process_vm_readv`/`writev` and the ptrace
//! requests the user drain and the stop drain use.

use std::io;

/// The type of ptrace requests: glibc declares them `c_uint`, musl `c_int`.
#[cfg(target_env = "musl")]
pub(super) type PtraceRequest = libc::c_int;
#[cfg(not(target_env = "musl"))]
pub(super) type PtraceRequest = libc::c_uint;

pub(super) fn ptrace(req: PtraceRequest, pid: u32, data: usize) -> io::Result<()> {
    // SAFETY: the requests used here take an integer `data` and no address.
    let r = unsafe { libc::ptrace(req, pid as libc::pid_t, 0usize, data) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `PTRACE_GETEVENTMSG` of a stopped tracee: the new task's id at a clone, fork or
/// vfork stop, the former thread id at an exec stop.
pub(super) fn event_msg(tid: u32) -> io::Result<u64> {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: GETEVENTMSG writes one unsigned long to the address we own.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            tid as libc::pid_t,
            0usize,
            &raw mut msg,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        // c_ulong: 64 bits on the targets the tracer runs on.
        Ok(msg as u64)
    }
}

pub(super) fn read_mem(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: local covers our buffer; the kernel checks the remote range.
    let n = unsafe {
        libc::process_vm_readv(
            pid as libc::pid_t,
            &local,
            1,
            &remote(addr, buf.len()),
            1,
            0,
        )
    };
    whole(n, buf.len(), "short read")
}

pub(super) fn write_mem(pid: u32, addr: u64, buf: &[u8]) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: local covers our buffer (only read); the kernel checks the remote range.
    let n = unsafe {
        libc::process_vm_writev(
            pid as libc::pid_t,
            &local,
            1,
            &remote(addr, buf.len()),
            1,
            0,
        )
    };
    whole(n, buf.len(), "short write")
}

/// `len` bytes at `addr` in the other process.
fn remote(addr: u64, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    }
}

/// A process_vm_* result: all `len` bytes moved, or why not.
fn whole(n: isize, len: usize, short: &str) -> io::Result<()> {
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize != len => Err(io::Error::other(short.to_string())),
        _ => Ok(()),
    }
}
