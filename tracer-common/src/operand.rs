//! Operand descriptors: where a value is at a probed instruction, in a form the eBPF
//! `site` program evaluates from the probe's registers and the thread's memory. They
//! let a uprobe site record what the inline stub would: the effective address of a
//! memory access, the arguments of a USDT probe.
//!
//! The rewriter describes every uprobe site of kind memory or USDT with an
//! [`OperandSet`] (stored in the metadata, `meta::SiteOperands`); the tracer copies the
//! sets into the `OPERANDS` map (`ebpf::MAP_OPERANDS`) before attaching.
//!
//! Registers are numbered in the order the eBPF side builds its register file from
//! `pt_regs`: x86-64 `rax rcx rdx rbx rsp rbp rsi rdi r8..r15` (the instruction
//! encoding's order) then `rip` ([`X86_REG_PC`]); AArch64 `x0..x30`, `sp`
//! ([`A64_REG_SP`]), `pc` ([`A64_REG_PC`]). The pc is the probed instruction's run-time
//! address (a uprobe runs before the instruction), so a link-time address `A` of the
//! binary is described as `pc + (A - probe address)`: PC-relative, which adds the load
//! bias without the eBPF side having to know it.

/// Operands per site at most: `<sys/sdt.h>` probes take up to 12 arguments.
pub const MAX_OPERANDS: usize = 12;
/// Records of one uprobe-site event at most: two USDT arguments per record.
pub const MAX_OPERAND_RECORDS: usize = MAX_OPERANDS / 2;

/// No register (an absent base or index; also AArch64 `xzr` as an index).
pub const REG_NONE: u8 = 0xff;
/// x86-64 `rip` in the register numbering.
pub const X86_REG_PC: u8 = 16;
/// x86-64 registers in the register file.
pub const X86_NREGS: usize = 17;
/// AArch64 `sp` (register number 31 in a base-register field).
pub const A64_REG_SP: u8 = 31;
/// AArch64 `pc`.
pub const A64_REG_PC: u8 = 32;
/// AArch64 registers in the register file.
pub const A64_NREGS: usize = 33;

/// Unused operand: evaluates to 0.
pub const OP_NONE: u8 = 0;
/// `disp` itself.
pub const OP_IMM: u8 = 1;
/// The low `size` bytes of register `base` (bits 8..16 with [`OPF_HIGH8`]).
pub const OP_REG: u8 = 2;
/// The effective address `base + (index << shift) + disp` (+ the thread pointer with
/// [`OPF_TP`]): what a memory site records.
pub const OP_ADDR: u8 = 3;
/// `size` bytes loaded from the effective address (as [`OP_ADDR`]).
pub const OP_LOAD: u8 = 4;

/// [`OP_REG`]/[`OP_LOAD`]: sign-extend the `size`-byte value (else zero-extend).
pub const OPF_SIGNED: u8 = 1;
/// [`OP_REG`]: x86 `%ah`..`%bh`, the value is bits 8..16 of the register.
pub const OPF_HIGH8: u8 = 2;
/// Add the thread pointer to the address (x86-64 `%fs:` operands).
pub const OPF_TP: u8 = 4;
/// The index is the low 32 bits of its register, zero-extended (AArch64 `uxtw`).
pub const OPF_INDEX_UXTW: u8 = 8;
/// The index is the low 32 bits of its register, sign-extended (AArch64 `sxtw`).
pub const OPF_INDEX_SXTW: u8 = 16;
/// The base register holds a signed pointer (AArch64 `ldraa`/`ldrab`): clear the
/// pointer-authentication code (bits 48..56) first, as the instruction does.
pub const OPF_STRIP_PAC: u8 = 32;

/// Bits of a pointer that hold the pointer-authentication code of a user data pointer
/// (48-bit VA, top byte ignored).
pub const PAC_BITS: u64 = 0x00ff_0000_0000_0000;

/// One value's location. 16 bytes, little-endian.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Operand {
    /// `OP_*`.
    pub kind: u8,
    /// Base register, or [`REG_NONE`].
    pub base: u8,
    /// Index register, or [`REG_NONE`].
    pub index: u8,
    /// The index is shifted left by this much (x86 scale 1/2/4/8 = 0..3).
    pub shift: u8,
    /// Bytes of the value: 1, 2, 4 or 8 ([`OP_REG`], [`OP_LOAD`]).
    pub size: u8,
    /// `OPF_*`.
    pub flags: u8,
    pub _pad: [u8; 2],
    /// Displacement ([`OP_ADDR`], [`OP_LOAD`]) or the value ([`OP_IMM`]).
    pub disp: i64,
}

const _: () = assert!(core::mem::size_of::<Operand>() == 16);

/// What a uprobe site records beyond the selector's registers: operand `k` goes to
/// value (`k` even) or aux (`k` odd) of record `k / 2`; records after the first are
/// `FLAG_USDT_MORE` records. A memory site has one operand (the effective address; aux
/// stays the instruction's address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OperandSet {
    /// Operands used (at most [`MAX_OPERANDS`]).
    pub count: u8,
    pub _pad: [u8; 3],
    /// OR-ed into the first record's flags (memory sites: `FLAG_MEM_READ`,
    /// `FLAG_MEM_WRITE` and the size in bits 16..32).
    pub flags: u32,
    pub ops: [Operand; MAX_OPERANDS],
}

/// Bytes of an [`OperandSet`] (the `OPERANDS` map's value size).
pub const OPERAND_SET_SIZE: usize = 8 + 16 * MAX_OPERANDS;
const _: () = assert!(core::mem::size_of::<OperandSet>() == OPERAND_SET_SIZE);

// SAFETY: plain old data without padding holes (explicit `_pad`), any bit pattern is
// valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for OperandSet {}

impl OperandSet {
    /// The records an event of this set fills: `ceil(count / 2)`, at least 1.
    pub const fn records(&self) -> usize {
        let n = if (self.count as usize) < MAX_OPERANDS {
            self.count as usize
        } else {
            MAX_OPERANDS
        };
        if n <= 2 { 1 } else { n.div_ceil(2) }
    }
}

impl Operand {
    /// Sign- or zero-extend the low `size` bytes of `v` as this operand says (sizes
    /// other than 1, 2 and 4 keep all 64 bits).
    #[inline(always)]
    pub const fn extend(&self, v: u64) -> u64 {
        let signed = self.flags & OPF_SIGNED != 0;
        match (self.size, signed) {
            (1, false) => v as u8 as u64,
            (1, true) => v as i8 as i64 as u64,
            (2, false) => v as u16 as u64,
            (2, true) => v as i16 as i64 as u64,
            (4, false) => v as u32 as u64,
            (4, true) => v as i32 as i64 as u64,
            _ => v,
        }
    }

    /// The index register's contribution, extended as the flags say.
    #[inline(always)]
    pub const fn scaled_index(&self, index: u64) -> u64 {
        let v = if self.flags & OPF_INDEX_UXTW != 0 {
            index as u32 as u64
        } else if self.flags & OPF_INDEX_SXTW != 0 {
            index as u32 as i32 as i64 as u64
        } else {
            index
        };
        v << (self.shift & 7)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_and_index() {
        let op = |size, flags| Operand {
            size,
            flags,
            ..Default::default()
        };
        assert_eq!(op(1, 0).extend(0x1ff), 0xff);
        assert_eq!(op(1, OPF_SIGNED).extend(0x1ff), u64::MAX);
        assert_eq!(op(2, OPF_SIGNED).extend(0x8000), 0xffff_ffff_ffff_8000);
        assert_eq!(op(4, 0).extend(u64::MAX), 0xffff_ffff);
        assert_eq!(op(8, OPF_SIGNED).extend(7), 7);
        let ix = Operand {
            shift: 3,
            flags: OPF_INDEX_SXTW,
            ..Default::default()
        };
        assert_eq!(ix.scaled_index(0xffff_ffff), (-8i64) as u64);
        let ux = Operand {
            shift: 2,
            flags: OPF_INDEX_UXTW,
            ..Default::default()
        };
        assert_eq!(ux.scaled_index(0x1_ffff_ffff), 0x3_ffff_fffc);
        let set = |count| OperandSet {
            count,
            ..Default::default()
        };
        assert_eq!(
            [0, 1, 2, 3, 5, 6, 12, 200].map(|n| set(n).records()),
            [1, 1, 1, 2, 3, 3, 6, 6]
        );
    }
}
