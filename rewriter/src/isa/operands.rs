//! Operand descriptors of uprobe sites (`tracer_common::operand`), the parts shared by
//! the backends: USDT arguments and the set of a memory site. Each backend maps its
//! registers to the descriptor numbering and decodes its memory operands
//! (`Isa::uprobe_operands`).

use crate::isa::arg::{Arg, ArgLoc, Reg};
use tracer_common::operand::{
    MAX_OPERANDS, OP_ADDR, OP_IMM, OP_LOAD, OP_REG, OPF_HIGH8, OPF_SIGNED, Operand, OperandSet,
    REG_NONE,
};

/// An address of the binary as seen from the uprobe at `at`: the pc register plus the
/// link-time distance, which adds the load bias at run time without the eBPF side
/// knowing it.
pub(crate) fn pc_relative(kind: u8, target: u64, at: u64, pc: u8) -> Operand {
    Operand {
        kind,
        base: pc,
        index: REG_NONE,
        disp: target.wrapping_sub(at) as i64,
        ..Default::default()
    }
}

/// The set of a memory site: its effective address and its record flags.
pub(crate) fn memory_set(ea: Operand, flags: u32) -> OperandSet {
    debug_assert_eq!(ea.kind, OP_ADDR);
    let mut set = OperandSet {
        count: 1,
        flags,
        ..Default::default()
    };
    set.ops[0] = ea;
    set
}

/// The set of a USDT probe whose uprobe sits at `at` (the probe's `nop`): one operand
/// per argument, extended as the note says (the inline stubs' semantics). `reg` gives
/// a register's number and whether it is an x86 high-byte register; `pc` is the
/// backend's pc register. None if an argument cannot be described.
pub(crate) fn usdt_set(
    args: &[Arg],
    at: u64,
    pc: u8,
    reg: impl Fn(&Reg) -> Option<(u8, bool)>,
) -> Option<OperandSet> {
    if args.len() > MAX_OPERANDS {
        return None;
    }
    let mut set = OperandSet {
        count: args.len() as u8,
        ..Default::default()
    };
    for (op, arg) in set.ops.iter_mut().zip(args) {
        let signed = if arg.signed { OPF_SIGNED } else { 0 };
        *op = match arg.loc {
            ArgLoc::Imm(v) => Operand {
                kind: OP_IMM,
                base: REG_NONE,
                index: REG_NONE,
                size: arg.size,
                disp: v,
                ..Default::default()
            },
            ArgLoc::Reg(r) => {
                let (n, high8) = reg(&r)?;
                Operand {
                    kind: OP_REG,
                    base: n,
                    index: REG_NONE,
                    size: arg.size,
                    flags: signed | if high8 { OPF_HIGH8 } else { 0 },
                    ..Default::default()
                }
            }
            ArgLoc::Mem { base, index, disp } => {
                let base = match base {
                    Some(b) => reg(&b)?.0,
                    None => REG_NONE,
                };
                let (index, shift) = match index {
                    Some((r, scale)) if scale.is_power_of_two() && scale <= 8 => {
                        (reg(&r)?.0, scale.trailing_zeros() as u8)
                    }
                    Some(_) => return None,
                    None => (REG_NONE, 0),
                };
                Operand {
                    kind: OP_LOAD,
                    base,
                    index,
                    shift,
                    size: arg.size,
                    flags: signed,
                    disp,
                    ..Default::default()
                }
            }
            ArgLoc::Static { addr } => Operand {
                size: arg.size,
                flags: signed,
                ..pc_relative(OP_LOAD, addr, at, pc)
            },
        };
    }
    Some(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::operand::*;

    #[test]
    fn usdt_forms() {
        let arg = |size, signed, loc| Arg {
            size,
            signed,
            float: false,
            loc,
        };
        let args = [
            arg(4, true, ArgLoc::Reg(Reg::A64(19))),
            arg(8, false, ArgLoc::Imm(-3)),
            arg(
                2,
                true,
                ArgLoc::Mem {
                    base: Some(Reg::A64(31)),
                    index: Some((Reg::A64(2), 4)),
                    disp: -8,
                },
            ),
            arg(8, false, ArgLoc::Static { addr: 0x1000 }),
        ];
        let set = usdt_set(&args, 0x1800, A64_REG_PC, |r| match r {
            Reg::A64(n) => Some((*n, false)),
            Reg::X86 { .. } => None,
        })
        .unwrap();
        assert_eq!(set.count, 4);
        assert_eq!(
            (set.ops[0].kind, set.ops[0].base, set.ops[0].flags),
            (OP_REG, 19, OPF_SIGNED)
        );
        assert_eq!((set.ops[1].kind, set.ops[1].disp), (OP_IMM, -3));
        let m = set.ops[2];
        assert_eq!(
            (m.kind, m.base, m.index, m.shift, m.size, m.disp),
            (OP_LOAD, 31, 2, 2, 2, -8)
        );
        let s = set.ops[3];
        assert_eq!((s.kind, s.base, s.disp), (OP_LOAD, A64_REG_PC, -0x800));
        assert_eq!(set.records(), 2);
        let bad_scale = [arg(
            8,
            false,
            ArgLoc::Mem {
                base: None,
                index: Some((Reg::A64(1), 3)),
                disp: 0,
            },
        )];
        assert!(usdt_set(&bad_scale, 0, A64_REG_PC, |_| Some((1, false))).is_none());
    }
}
