//! Architecture-specific access: registers of a uprobe context and the thread pointer.
//!
//! x86-64: slot in %rsi, first argument %rdi, return address at [%rsp], thread pointer
//! `thread.fsbase`. AArch64 (the rewriter's convention): slot in x9, first argument x0,
//! return address x30 (PAC bits stripped), thread pointer `thread.uw.tp_value` (which
//! the kernel only refreshes at context switch, see [`THREAD_POINTER_MAY_BE_STALE`]).
//!
//! AArch64 uprobe sites clear x30's PAC bits with a 48-bit user-VA mask. Since
//! `thread.uw.tp_value` is refreshed only at context switch (user space sets
//! `tpidr_el0` with `msr`), a main thread not switched out since it installed its TLS
//! shows 0 there: exit drains then find the slot by `owner_tid`. Tested on a real arm64
//! kernel (6.1) by `cargo xtask test-arm64-vm`, in write-user mode (no lockdown in the
//! VM).

use aya_ebpf::{helpers::bpf_probe_read_kernel, helpers::generated::bpf_get_current_task};

use crate::maps::FSBASE_OFFSET;

#[cfg(bpf_target_arch = "x86_64")]
mod regs {
    use aya_ebpf::programs::ProbeContext;

    use crate::user::read_user;

    /// The slot pointer the stub passes to the flush function (%rsi).
    #[inline(always)]
    pub(crate) fn slot_arg(ctx: &ProbeContext) -> u64 {
        // SAFETY: ctx.regs is the program's pt_regs context, readable for its lifetime.
        unsafe { (*ctx.regs).rsi }
    }

    /// First integer argument (%rdi).
    #[inline(always)]
    pub(crate) fn first_arg(ctx: &ProbeContext) -> u64 {
        // SAFETY: as above.
        unsafe { (*ctx.regs).rdi }
    }

    /// What the flush function allows its drain (`FLUSH_*`, %rdx).
    #[inline(always)]
    pub(crate) fn flush_mode(ctx: &ProbeContext) -> u64 {
        // SAFETY: as above.
        unsafe { (*ctx.regs).rdx }
    }

    /// The probed instruction's address (a uprobe runs before it executes).
    #[inline(always)]
    pub(crate) fn pc(ctx: &ProbeContext) -> u64 {
        // SAFETY: as above.
        unsafe { (*ctx.regs).rip }
    }

    /// Return value register (%rax) at a return.
    #[inline(always)]
    pub(crate) fn return_value(ctx: &ProbeContext) -> u64 {
        // SAFETY: as above.
        unsafe { (*ctx.regs).rax }
    }

    /// Return address at function entry, at a `ret` and at a tail call: the word at %rsp.
    #[inline(always)]
    pub(crate) fn return_address(ctx: &ProbeContext) -> u64 {
        // SAFETY: as above.
        let sp = unsafe { (*ctx.regs).rsp };
        read_user::<u64>(sp).unwrap_or(0)
    }

    pub(crate) const NREGS: usize = tracer_common::operand::X86_NREGS;

    /// Fill `out` with the register file in the operand descriptors' numbering (`rax
    /// rcx rdx rbx rsp rbp rsi rdi r8..r15 rip`). Every field is its own volatile load
    /// at a constant offset (the verifier refuses context accesses at variable offsets)
    /// stored at once with a volatile store (else LLVM loads them all first and spills
    /// them, doubling the stack this needs).
    #[inline(always)]
    pub(crate) fn registers(ctx: &ProbeContext, out: &mut [u64; NREGS]) {
        let r = ctx.regs;
        let o = out.as_mut_ptr();
        macro_rules! rd {
            ($($n:literal $f:ident),*) => {
                $(
                    // SAFETY: ctx.regs is the program's pt_regs context, readable for
                    // its lifetime; $n < NREGS.
                    unsafe {
                        core::ptr::write_volatile(
                            o.add($n),
                            core::ptr::read_volatile(&raw const (*r).$f),
                        )
                    };
                )*
            };
        }
        rd!(
            0 rax, 1 rcx, 2 rdx, 3 rbx, 4 rsp, 5 rbp, 6 rsi, 7 rdi, 8 r8, 9 r9, 10 r10, 11 r11,
            12 r12, 13 r13, 14 r14, 15 r15, 16 rip
        );
    }
}

#[cfg(bpf_target_arch = "aarch64")]
mod regs {
    use aya_ebpf::programs::ProbeContext;

    /// The start of the kernel's arm64 `struct pt_regs` (`user_pt_regs`).
    #[repr(C)]
    struct UserPtRegs {
        regs: [u64; 31],
        sp: u64,
        pc: u64,
        pstate: u64,
    }

    #[inline(always)]
    fn reg(ctx: &ProbeContext, n: usize) -> u64 {
        // SAFETY: ctx.regs is the program's pt_regs context, which starts with user_pt_regs.
        unsafe { (*ctx.regs.cast::<UserPtRegs>()).regs[n] }
    }

    /// The slot pointer the stub passes to the flush function (x9, an intra-procedure
    /// scratch register: the stub saved it, so no argument register is disturbed).
    #[inline(always)]
    pub(crate) fn slot_arg(ctx: &ProbeContext) -> u64 {
        reg(ctx, 9)
    }

    /// What the flush function allows its drain (`FLUSH_*`, x11).
    #[inline(always)]
    pub(crate) fn flush_mode(ctx: &ProbeContext) -> u64 {
        reg(ctx, 11)
    }

    #[inline(always)]
    pub(crate) fn first_arg(ctx: &ProbeContext) -> u64 {
        reg(ctx, 0)
    }

    /// The probed instruction's address (a uprobe runs before it executes).
    #[inline(always)]
    pub(crate) fn pc(ctx: &ProbeContext) -> u64 {
        // SAFETY: ctx.regs is the program's pt_regs context, which starts with user_pt_regs.
        unsafe { (*ctx.regs.cast::<UserPtRegs>()).pc }
    }

    /// Return value register (x0) at a return.
    #[inline(always)]
    pub(crate) fn return_value(ctx: &ProbeContext) -> u64 {
        reg(ctx, 0)
    }

    /// User addresses are below 2^48 (Debian's arm64 kernels: 48-bit VA); the bits
    /// above hold a pointer-authentication code when x30 was signed.
    const USER_VA_MASK: u64 = (1 << 48) - 1;

    /// At function entry (and at a `ret` or tail call) the return address is in the link register. A uprobe
    /// site sits after a `paciasp`/`pacibsp` landing pad, so x30 may carry a PAC:
    /// strip it (as `xpaclri` would) so that aux is the plain return address.
    #[inline(always)]
    pub(crate) fn return_address(ctx: &ProbeContext) -> u64 {
        reg(ctx, 30) & USER_VA_MASK
    }

    pub(crate) const NREGS: usize = tracer_common::operand::A64_NREGS;

    /// Fill `out` with the register file in the operand descriptors' numbering (`x0..x30
    /// sp pc`). Every register is its own volatile load at a constant offset (the
    /// verifier refuses context accesses at variable offsets) stored at once with a
    /// volatile store (else LLVM loads them all first and spills them, and the frame
    /// no longer fits under the drain's in 512 bytes).
    #[inline(always)]
    pub(crate) fn registers(ctx: &ProbeContext, out: &mut [u64; NREGS]) {
        let r = ctx.regs.cast::<UserPtRegs>();
        let o = out.as_mut_ptr();
        macro_rules! rd {
            ($($n:literal),*) => {
                $(
                    // SAFETY: ctx.regs is the program's pt_regs context, which starts
                    // with user_pt_regs; $n < 31 < NREGS.
                    unsafe {
                        core::ptr::write_volatile(
                            o.add($n),
                            core::ptr::read_volatile(&raw const (*r).regs[$n]),
                        )
                    };
                )*
            };
        }
        rd!(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30
        );
        // SAFETY: as above; 31 and 32 < NREGS.
        unsafe {
            core::ptr::write_volatile(o.add(31), core::ptr::read_volatile(&raw const (*r).sp));
            core::ptr::write_volatile(o.add(32), core::ptr::read_volatile(&raw const (*r).pc));
        }
    }
}

pub(crate) use regs::{
    NREGS, first_arg, flush_mode, pc, registers, return_address, return_value, slot_arg,
};

/// AArch64 user space sets its thread pointer with `msr tpidr_el0` (no system call), and
/// the kernel copies the register into `thread.uw.tp_value` only when the task is
/// switched out (or at clone with CLONE_SETTLS). A main thread that installed its TLS
/// after exec and has not been switched out since still shows 0 (or a static
/// executable's pre-TLS TCB) there, so lookups by thread pointer fall back to the
/// slot's `owner_tid`.
pub(crate) const THREAD_POINTER_MAY_BE_STALE: bool = cfg!(bpf_target_arch = "aarch64");

/// The current thread's thread pointer (the key of its slots), 0 if unknown. Read from
/// `task_struct` at the offset the loader found in BTF. The kernel sets that field at
/// clone (CLONE_SETTLS) and arch_prctl(ARCH_SET_FS) and saves it on context switch, so
/// it is the thread pointer unless the program changes it with `wrfsbase` behind the
/// kernel's back (libc does not).
#[inline(always)]
pub(crate) fn thread_pointer() -> u64 {
    let off = FSBASE_OFFSET.load();
    if off == 0 {
        return 0;
    }
    // SAFETY: bpf_get_current_task has no preconditions.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: bpf_probe_read_kernel validates the address.
    unsafe { bpf_probe_read_kernel((task + off) as *const u64) }.unwrap_or(0)
}
