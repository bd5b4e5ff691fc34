//! USDT argument specs as the x86-64 backend takes them: the AT&T operand parsed
//! (`parse_arg`, whose grammar `select::usdt`'s tests cover at length) into the
//! operand descriptors of a uprobe site, in the x86 register numbering.

use super::super::X86_64;
use super::{Image, TEXT};
use crate::isa::Isa;
use crate::isa::arg::{Arg, ArgError, parse_arg};
use object::elf;
use tracer_common::meta::SiteKind;
use tracer_common::operand::*;

/// The probe's address.
const PC: u64 = TEXT + 0x40;

fn parse(specs: &[&str]) -> Vec<Arg> {
    let resolve = |s: &str| match s {
        "foo" => Ok(0x40_3800),
        _ => Err(ArgError::UnknownSymbol(s.into())),
    };
    specs
        .iter()
        .map(|t| parse_arg(t, elf::EM_X86_64, PC, &resolve).unwrap())
        .collect()
}

/// `(kind, base, index, shift, size, flags, disp)` of an operand.
type Desc = (u8, u8, u8, u8, u8, u8, i64);

fn descriptors(specs: &[&str]) -> Option<Vec<Desc>> {
    let img = Image::new(&[0x90]);
    let set = X86_64.uprobe_operands(&img.input(), SiteKind::Usdt, PC, &parse(specs))?;
    assert_eq!(set.count as usize, specs.len());
    Some(
        set.ops[..specs.len()]
            .iter()
            .map(|o| (o.kind, o.base, o.index, o.shift, o.size, o.flags, o.disp))
            .collect(),
    )
}

#[test]
fn registers_in_the_encoding_numbering() {
    let n = REG_NONE;
    assert_eq!(
        descriptors(&[
            "-4@%eax", "8@%rsp", "2@%r9w", "-1@%r15b", "1@%ah", "-1@%dh", "8@%rdi"
        ]),
        Some(vec![
            (OP_REG, 0, n, 0, 4, OPF_SIGNED, 0),
            (OP_REG, 4, n, 0, 8, 0, 0),
            (OP_REG, 9, n, 0, 2, 0, 0),
            (OP_REG, 15, n, 0, 1, OPF_SIGNED, 0),
            // High-byte registers: the parent's number and a flag.
            (OP_REG, 0, n, 0, 1, OPF_HIGH8, 0),
            (OP_REG, 2, n, 0, 1, OPF_SIGNED | OPF_HIGH8, 0),
            (OP_REG, 7, n, 0, 8, 0, 0),
        ])
    );
}

#[test]
fn immediates_and_memory_operands() {
    let n = REG_NONE;
    assert_eq!(
        descriptors(&[
            "-4@$-5",
            "8@16(%rbp)",
            "-8@-8(%r13,%rbx,8)",
            "4@(,%rcx,4)",
            "8@foo(%rip)",
            "-4@16(%rip)",
            "2@foo",
        ]),
        Some(vec![
            (OP_IMM, n, n, 0, 4, 0, -5),
            (OP_LOAD, 5, n, 0, 8, 0, 16),
            (OP_LOAD, 13, 3, 3, 8, OPF_SIGNED, -8),
            (OP_LOAD, n, 1, 2, 4, 0, 0),
            // Static addresses: relative to the pc at the probe (the load bias
            // comes with the pc at run time).
            (OP_LOAD, X86_REG_PC, n, 0, 8, 0, 0x40_3800 - PC as i64),
            (OP_LOAD, X86_REG_PC, n, 0, 4, OPF_SIGNED, 16),
            (OP_LOAD, X86_REG_PC, n, 0, 2, 0, 0x40_3800 - PC as i64),
        ])
    );
}

#[test]
fn two_arguments_a_record() {
    let img = Image::new(&[0x90]);
    let args = parse(&["8@%rdi", "8@%rsi", "8@%rdx", "8@%rcx", "8@%r8"]);
    let set = X86_64
        .uprobe_operands(&img.input(), SiteKind::Usdt, PC, &args)
        .unwrap();
    assert_eq!((set.count, set.records()), (5, 3));
    // Other kinds have no operands of their own.
    for kind in [SiteKind::FunctionEntry, SiteKind::Block] {
        assert!(
            X86_64
                .uprobe_operands(&img.input(), kind, PC, &args)
                .is_none()
        );
    }
}

#[test]
fn the_backend_parses_operands_after_the_size_prefix() {
    let resolve = |_: &str| Err(ArgError::UnknownSymbol("x".into()));
    use crate::isa::arg::{ArgLoc, Reg};
    use iced_x86::Register as R;
    let x = |reg| Reg::X86 { reg, high8: false };
    assert_eq!(
        X86_64.usdt_operand("-0x10(%rsp,%r10,2)", PC, &resolve),
        Ok(ArgLoc::Mem {
            base: Some(x(R::RSP)),
            index: Some((x(R::R10), 2)),
            disp: -16,
        })
    );
    assert_eq!(
        X86_64.usdt_operand("%r11d", PC, &resolve),
        Ok(ArgLoc::Reg(x(R::R11)))
    );
    assert!(X86_64.usdt_operand("8(%rbp,%rsp)", PC, &resolve).is_err());
    assert!(X86_64.usdt_operand("%r16", PC, &resolve).is_err());
    assert!(X86_64.usdt_operand("%r08", PC, &resolve).is_err());
}
