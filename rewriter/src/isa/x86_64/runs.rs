//! x86-64 access runs (`isa::runs`): which registers an address reads and an instruction
//! writes (iced's register use, implicit ones included: `push` writes %rsp, `cmpxchg`
//! %rax, `wrfsbase` the thread pointer a `%fs:` operand adds).

use iced_x86::{
    Code, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};

use super::super::runs::{self, RegSet, RunInsn, RunStats};
use super::PlanCx;
use crate::isa::Candidate;
use tracer_common::meta::{FallbackReason, SiteKind};

/// The bit of `%fs`'s base (the thread pointer a `%fs:` operand adds).
const FS_BASE: RegSet = 1 << 16;

/// The bit number of a 64-bit general-purpose register.
fn bit_no(r: Register) -> Option<u32> {
    r.is_gpr64().then(|| r as u32 - Register::RAX as u32)
}

/// The bit of a general-purpose register (any width), 0 for the others.
fn bit(r: Register) -> RegSet {
    let full = r.full_register();
    if full.is_gpr64() {
        1 << (full as u32 - Register::RAX as u32)
    } else {
        0
    }
}

/// The registers `ins`'s memory operand's address uses.
fn address_regs(ins: &Instruction) -> RegSet {
    let fs = if ins.memory_segment() == Register::FS {
        FS_BASE
    } else {
        0
    };
    bit(ins.memory_base()) | bit(ins.memory_index()) | fs
}

/// The registers `ins` writes, implicit ones included.
fn writes(factory: &mut InstructionInfoFactory, ins: &Instruction) -> RegSet {
    let mut set = factory
        .info(ins)
        .used_registers()
        .iter()
        .filter(|u| !matches!(u.access(), OpAccess::Read | OpAccess::CondRead))
        .fold(0, |s, u| s | bit(u.register()));
    if ins.mnemonic() == Mnemonic::Wrfsbase {
        set |= FS_BASE;
    }
    set
}

/// The 64-bit register `ins` moves by a known number of bytes, writing nothing else
/// (flags apart): `add`/`sub` of an immediate, `inc`/`dec`, `lea d(%r),%r`, and %rsp by
/// `push`/`pop` (a `pop`'s destination is written: `writes` has it).
fn shift(ins: &Instruction) -> Option<(u32, i64)> {
    let reg0 = (ins.op_count() > 0 && ins.op0_kind() == OpKind::Register)
        .then(|| ins.op0_register())
        .filter(|r| r.is_gpr64());
    let imm = || ins.immediate(1) as i64;
    let (r, d) = match ins.code() {
        Code::Add_rm64_imm8 | Code::Add_rm64_imm32 => (reg0?, imm()),
        Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 => (reg0?, imm().wrapping_neg()),
        Code::Inc_rm64 => (reg0?, 1),
        Code::Dec_rm64 => (reg0?, -1),
        Code::Lea_r64_m
            if ins.memory_base() == ins.op0_register()
                && ins.memory_index() == Register::None
                && ins.memory_segment() == Register::DS =>
        {
            (ins.op0_register(), ins.memory_displacement64() as i64)
        }
        Code::Push_r64 | Code::Pushq_imm8 | Code::Pushq_imm32 => (Register::RSP, -8),
        Code::Pop_r64 if ins.op0_register() != Register::RSP => (Register::RSP, 8),
        _ => return None,
    };
    // Small moves only: the displacements they add up to stay far from i32's edge.
    (d.unsigned_abs() < 1 << 20).then_some((bit_no(r)?, d))
}

/// The bytes `m`'s operand moves by under `shifts` (register bit, bytes).
fn ea_shift(m: &Instruction, shifts: &[(u32, i64)]) -> i64 {
    let of = |r: Register| {
        bit_no(r)
            .and_then(|b| shifts.iter().find(|s| s.0 == b))
            .map_or(0, |s| s.1)
    };
    of(m.memory_base())
        .wrapping_add(of(m.memory_index()).wrapping_mul(i64::from(m.memory_index_scale())))
}

/// Group `cands`' memory sites into runs of at most `cap` accesses: each member gets
/// its stub placed at the head's instruction (`Candidate::at`; `insn` stays its own) and
/// needs no window of its own.
pub(super) fn batch(cx: &PlanCx, cands: &mut [Candidate], cap: usize) -> RunStats {
    let mut factory = InstructionInfoFactory::new();
    // Memory candidates by instruction index.
    let mut site_of = vec![None; cx.insns.len()];
    for (k, c) in cands.iter().enumerate() {
        if c.req.kind == SiteKind::Memory
            && c.flags != 0
            && let Some(i) = cx.index_of(c.insn)
        {
            site_of[i] = Some(k);
        }
    }
    let facts: Vec<RunInsn> = cx
        .insns
        .iter()
        .zip(&site_of)
        .map(|(ins, site)| {
            let shift = shift(ins);
            let mut writes = writes(&mut factory, ins);
            if let Some((b, _)) = shift {
                writes &= !(1 << b);
            }
            RunInsn {
                target: super::is_target(&cx.targets.all, ins.ip()),
                leaves: ins.flow_control() != FlowControl::Next,
                member: site.map(|_| address_regs(ins)),
                head: site.is_some_and(|k| cands[k].window.is_ok()),
                writes,
                shift,
            }
        })
        .collect();
    let (found, stats) = runs::find(&facts, cap);
    for run in found {
        let head = site_of[run[0].at].map(|k| cands[k].at);
        for m in &run[1..] {
            if let (Some(k), Some(at)) = (site_of[m.at], head) {
                cands[k].at = at;
                cands[k].ea_shift = ea_shift(&cx.insns[m.at], &m.shifts);
                cands[k].window = Err(FallbackReason::NoWindow);
            }
        }
    }
    stats
}
