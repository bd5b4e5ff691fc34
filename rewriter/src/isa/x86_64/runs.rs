//! x86-64 access runs (`isa::runs`): which registers an address reads and an instruction
//! writes (iced's register use, implicit ones included: `push` writes %rsp, `cmpxchg`
//! %rax, `wrfsbase` the thread pointer a `%fs:` operand adds).

use iced_x86::{FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, Register};

use super::super::runs::{self, RegSet, RunInsn, RunStats};
use super::PlanCx;
use crate::isa::Candidate;
use tracer_common::meta::{FallbackReason, SiteKind};

/// The bit of `%fs`'s base (the thread pointer a `%fs:` operand adds).
const FS_BASE: RegSet = 1 << 16;

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

/// Group `cands`' memory sites into runs of at most `cap` accesses: each member gets
/// its stub placed at the head's instruction (`Candidate::at`; `insn` stays its own) and
/// needs no window of its own.
pub(super) fn batch(cx: &PlanCx, cands: &mut [Candidate], cap: usize) -> RunStats {
    let mut factory = InstructionInfoFactory::new();
    // Memory candidates by instruction index.
    let mut site_of = vec![None; cx.insns.len()];
    for (k, c) in cands.iter().enumerate() {
        if c.req.kind == SiteKind::Memory && c.flags != 0 {
            if let Some(i) = cx.index_of(c.insn) {
                site_of[i] = Some(k);
            }
        }
    }
    let facts: Vec<RunInsn> = cx
        .insns
        .iter()
        .zip(&site_of)
        .map(|(ins, site)| RunInsn {
            target: super::is_target(&cx.targets.all, ins.ip()),
            leaves: ins.flow_control() != FlowControl::Next,
            member: site.map(|_| address_regs(ins)),
            head: site.is_some_and(|k| cands[k].window.is_ok()),
            writes: writes(&mut factory, ins),
        })
        .collect();
    let (found, stats) = runs::find(&facts, cap);
    for run in found {
        let head = site_of[run[0]].map(|k| cands[k].at);
        for &i in &run[1..] {
            if let (Some(k), Some(at)) = (site_of[i], head) {
                cands[k].at = at;
                cands[k].window = Err(FallbackReason::NoWindow);
            }
        }
    }
    stats
}
