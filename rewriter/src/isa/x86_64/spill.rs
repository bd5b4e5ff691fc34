//! Spill slots for the x86-64 data flow ([`super::flow`]): what 8-byte values a
//! function stored in its own stack frame, so that a reload brings back the value
//! itself (a function pointer received as an argument, a table base) instead of an
//! unknown one.
//!
//! Only where the frame is private: a function that never lets its stack's address
//! out of `%rsp` and its frame pointer (no `lea d(%rsp),%rdi`, no `mov %rsp,%rax`)
//! can have its frame written only by its own stack-relative stores and by what runs
//! below `%rsp` (its callees). A function that lets it out keeps no slot: any store,
//! anywhere, may hit one. Only the data flow over the control-flow graph keeps slots;
//! the first pass in address order would read back a slot stored on another way.

use iced_x86::{Instruction, Mnemonic, OpKind, Register};

use crate::flow::Val;

/// The slots known to hold a value: `(offset from the stack pointer at entry, value)`,
/// sorted by offset, each 8 bytes wide.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Spills(Vec<(i64, Val)>);

impl Spills {
    /// The value an 8-byte load at `off` brings back, if known.
    pub(super) fn load(&self, off: i64) -> Option<Val> {
        let i = self.0.binary_search_by_key(&off, |s| s.0).ok()?;
        Some(self.0[i].1)
    }

    /// `width` bytes at `off` were written: with `v` (an 8-byte store of a known
    /// value) or with something unknown.
    pub(super) fn store(&mut self, off: i64, width: i64, v: Option<Val>) {
        self.0
            .retain(|&(o, _)| o.saturating_add(8) <= off || o >= off.saturating_add(width));
        if let Some(v) = v.filter(|_| width == 8) {
            let i = self.0.partition_point(|s| s.0 < off);
            self.0.insert(i, (off, v));
        }
    }

    /// A call: the callee's frame and the return address overwrite what lies below
    /// the stack pointer (`sp`, None when unknown: everything).
    pub(super) fn below(&mut self, sp: Option<i64>) {
        match sp {
            Some(sp) => self.0.retain(|s| s.0 >= sp),
            None => self.0.clear(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// Keep what both ways agree on (function pointers of either way stay pointers);
    /// returns whether `self` changed.
    pub(super) fn meet(&mut self, o: &Spills) -> bool {
        let n = self.0.len();
        let mut changed = false;
        self.0.retain_mut(|(off, v)| match o.load(*off) {
            Some(w) if w == *v => true,
            Some(Val::Unknown | Val::Loaded) if matches!(v, Val::Unknown | Val::Loaded) => {
                changed |= *v != Val::Unknown;
                *v = Val::Unknown;
                true
            }
            _ => false,
        });
        changed || n != self.0.len()
    }
}

/// Whether the piece `insns` keeps its stack's address to `%rsp` and its frame pointer
/// (`%rbp` after `mov %rsp,%rbp`): then only stores relative to them write its frame.
pub(super) fn private_frame(insns: &[Instruction]) -> bool {
    let frame_pointer = insns.iter().any(|i| moves(i, Register::RBP, Register::RSP));
    insns.iter().all(|i| !lets_out(i, frame_pointer))
}

/// `mov %src,%dst` (64-bit registers).
fn moves(ins: &Instruction, dst: Register, src: Register) -> bool {
    ins.mnemonic() == Mnemonic::Mov
        && ins.op_count() == 2
        && ins.op0_kind() == OpKind::Register
        && ins.op1_kind() == OpKind::Register
        && ins.op0_register() == dst
        && ins.op1_register() == src
}

/// Whether `ins` may copy a stack address out of `%rsp` (and `%rbp`, the frame
/// pointer when `fp`).
fn lets_out(ins: &Instruction, fp: bool) -> bool {
    let stack = |r: Register| {
        let r = r.full_register();
        r == Register::RSP || fp && r == Register::RBP
    };
    if ins.mnemonic() == Mnemonic::Lea {
        // An address relative to the stack, kept in the stack pointers only.
        return (stack(ins.memory_base()) || stack(ins.memory_index()))
            && !stack(ins.op0_register());
    }
    // Register operands: only the stack pointers' own arithmetic and the frame set-up
    // and tear-down read them (push/pop/call/ret/leave use them implicitly).
    let reads_stack = (0..ins.op_count()).any(|k| {
        ins.op_kind(k) == OpKind::Register && stack(ins.op_register(k)) && k > 0
            || k == 0
                && ins.op_kind(0) == OpKind::Register
                && stack(ins.op0_register())
                && matches!(ins.mnemonic(), Mnemonic::Push | Mnemonic::Xchg)
    });
    if !reads_stack {
        return false;
    }
    let own_arith = matches!(
        ins.mnemonic(),
        Mnemonic::Add | Mnemonic::Sub | Mnemonic::And
    ) && ins.op0_kind() == OpKind::Register
        && stack(ins.op0_register())
        && ins.op1_kind() != OpKind::Register;
    let push_fp = ins.mnemonic() == Mnemonic::Push && ins.op0_register() == Register::RBP;
    !(own_arith
        || push_fp
        || moves(ins, Register::RBP, Register::RSP)
        || moves(ins, Register::RSP, Register::RBP))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn insns(bytes: &[u8]) -> Vec<Instruction> {
        Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE)
            .iter()
            .collect()
    }

    #[test]
    fn a_frame_is_private_until_its_address_leaves_the_stack_pointers() {
        // push %rbp; mov %rsp,%rbp; sub $0x20,%rsp; mov %rdi,-8(%rbp); leave; ret
        let own = [
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0x48, 0x89, 0x7d, 0xf8, 0xc9, 0xc3,
        ];
        assert!(private_frame(&insns(&own)));
        // sub $0x18,%rsp; lea 8(%rsp),%rdi; call .; add $0x18,%rsp; ret
        let lea = [
            0x48, 0x83, 0xec, 0x18, 0x48, 0x8d, 0x7c, 0x24, 0x08, 0xe8, 0x00, 0x00, 0x00, 0x00,
            0x48, 0x83, 0xc4, 0x18, 0xc3,
        ];
        assert!(!private_frame(&insns(&lea)));
        // mov %rsp,%rax; ret
        assert!(!private_frame(&insns(&[0x48, 0x89, 0xe0, 0xc3])));
        // push %rbp; mov %rsp,%rbp; mov %rbp,%rdi; ret: the frame pointer let out
        let fp = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0xef, 0xc3];
        assert!(!private_frame(&insns(&fp)));
        // mov %rbp,%rdi with no frame pointer: %rbp is any register
        assert!(private_frame(&insns(&[0x48, 0x89, 0xef, 0xc3])));
        // push %rsp
        assert!(!private_frame(&insns(&[0x54, 0xc3])));
    }

    #[test]
    fn stores_overwrite_the_slots_they_touch() {
        let mut s = Spills::default();
        s.store(-16, 8, Some(Val::Unknown));
        s.store(-8, 8, Some(Val::Const(7)));
        assert_eq!(s.load(-16), Some(Val::Unknown));
        // A 4-byte store into the upper half of the slot at -16.
        s.store(-12, 4, None);
        assert_eq!(s.load(-16), None);
        assert_eq!(s.load(-8), Some(Val::Const(7)));
        s.below(Some(-8));
        assert_eq!(s.load(-8), Some(Val::Const(7)));
        s.below(Some(0));
        assert_eq!(s.load(-8), None);
    }

    #[test]
    fn a_join_keeps_what_both_ways_agree_on() {
        let mut a = Spills::default();
        a.store(-8, 8, Some(Val::Loaded));
        a.store(-16, 8, Some(Val::Const(1)));
        a.store(-24, 8, Some(Val::Const(2)));
        let mut b = Spills::default();
        b.store(-8, 8, Some(Val::Unknown));
        b.store(-16, 8, Some(Val::Const(1)));
        b.store(-24, 8, Some(Val::Const(3)));
        assert!(a.meet(&b));
        assert_eq!(a.load(-8), Some(Val::Unknown));
        assert_eq!(a.load(-16), Some(Val::Const(1)));
        assert_eq!(a.load(-24), None);
        assert!(!a.meet(&b));
    }
}
