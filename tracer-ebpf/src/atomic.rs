//! 64-bit atomics on map values. The bpf target has no `AtomicU64::fetch_add` or
//! `compare_exchange` (it reports no compare-and-swap), but the instruction set has had
//! both since kernel 5.12 (BPF_ATOMIC with BPF_FETCH / BPF_CMPXCHG), so: inline asm.

use core::arch::asm;

/// `*p += v`, returning the old value.
///
/// # Safety
/// `p` must be a valid, 8-byte aligned pointer to a map value.
#[inline(always)]
pub(crate) unsafe fn fetch_add(p: *mut u64, v: u64) -> u64 {
    let mut old = v;
    // SAFETY: the caller guarantees p; the instruction only touches *p.
    unsafe {
        asm!(
            "{old} = atomic_fetch_add((u64 *)({p} + 0), {old})",
            p = in(reg) p,
            old = inout(reg) old,
            options(nostack),
        );
    }
    old
}

/// If `*p == expected` then `*p = new`; returns the old value either way.
///
/// # Safety
/// As [`fetch_add`].
#[inline(always)]
pub(crate) unsafe fn cmpxchg(p: *mut u64, expected: u64, new: u64) -> u64 {
    let old: u64;
    // SAFETY: as above; BPF_CMPXCHG compares with and returns in r0.
    unsafe {
        asm!(
            "r0 = cmpxchg_64({p} + 0, r0, {new})",
            p = in(reg) p,
            new = in(reg) new,
            inout("r0") expected => old,
            options(nostack),
        );
    }
    old
}
