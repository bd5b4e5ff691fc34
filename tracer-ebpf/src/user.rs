//! Access to the traced thread's memory.

use aya_ebpf::helpers::{bpf_probe_read_user, bpf_probe_write_user};

/// Read a `T` at user address `addr` of the current process.
#[inline(always)]
pub(crate) fn read_user<T>(addr: u64) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_user validates the address; a bad one is an Err, not a fault.
    unsafe { bpf_probe_read_user(addr as *const T) }
}

/// Write `v` at user address `addr` of the current process.
#[inline(always)]
pub(crate) fn write_user<T>(addr: u64, v: T) -> Result<(), i32> {
    // SAFETY: bpf_probe_write_user checks the address is a user address of the current
    // task; the RW areas we write to belong to the instrumented binary's protocol.
    unsafe { bpf_probe_write_user(addr as *mut T, &v as *const T) }
}
