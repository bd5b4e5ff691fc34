//! AArch64 access runs (`isa::runs`): which registers an address reads and a word
//! writes. Registers: x0..x30 are bits 0..30, sp bit 31 (a base field's numbering; an
//! index or a destination field's 31 is xzr, never written).
//!
//! There is no full decoder of what a word writes: a load/store writes its loaded
//! register(s) and a written-back base; a data-processing word of the classes below
//! writes its first operand when that is a general register (`Rd`, `Rd_SP`: bits 0..4;
//! a comparison's first operand is a source, an FP/SIMD destination no general
//! register); any other word is taken to write every register. Exclusive and atomic
//! accesses are never members and end runs, like every branch, call, trap and word
//! that `reloc::classify` refuses.

use disarm64::InsnOpcode;
use disarm64::decoder;

use super::super::runs::{self, RegSet, RunInsn, RunStats};
use super::reloc::{self, Class};
use super::{Body, INSN, mem, word_at};
use crate::isa::{Candidate, Targets};
use tracer_common::meta::{FallbackReason, SiteKind};

/// Every register: what a word not understood writes.
const ALL: RegSet = (1 << 32) - 1;

/// A base field's register: x0..x30 or sp.
fn base_bit(r: u32) -> RegSet {
    1 << (r & 31)
}

/// A field where 31 is xzr.
fn zr_bit(r: u32) -> RegSet {
    if r & 31 == 31 { 0 } else { 1 << (r & 31) }
}

/// Data-processing classes whose only register written (flags aside) is the first
/// operand, when it is a general register, at bits 0..4.
const RD_CLASSES: &[&str] = &[
    "ADDSUB_CARRY",
    "ADDSUB_EXT",
    "ADDSUB_IMM",
    "ADDSUB_SHIFT",
    "BITFIELD",
    "CONDCMP_IMM",
    "CONDCMP_REG",
    "CONDSEL",
    "CSSC",
    "DP_1SRC",
    "DP_2SRC",
    "DP_3SRC",
    "EXTRACT",
    "FLOAT2FIX",
    "FLOAT2INT",
    "FLOATCCMP",
    "FLOATCMP",
    "FLOATDP1",
    "FLOATDP2",
    "FLOATDP3",
    "FLOATIMM",
    "FLOATSEL",
    "LOG_IMM",
    "LOG_SHIFT",
    "MOVEWIDE",
    "PCRELADDR",
    "ASIMDALL",
    "ASIMDDIFF",
    "ASIMDELEM",
    "ASIMDEXT",
    "ASIMDIMM",
    "ASIMDINS",
    "ASIMDMISC",
    "ASIMDPERM",
    "ASIMDSAME",
    "ASIMDSHF",
    "ASIMDTBL",
    "ASISDDIFF",
    "ASISDELEM",
    "ASISDMISC",
    "ASISDONE",
    "ASISDPAIR",
    "ASISDSAME",
    "ASISDSHF",
];

/// The disarm64 class name of `w`, if it decodes.
fn class_of(w: u32) -> Option<&'static str> {
    Some(decoder::decode(w)?.definition().class.into())
}

/// Exclusive and atomic accesses: never in a run.
fn exclusive_or_atomic(class: &str) -> bool {
    matches!(class, "LDSTEXCL" | "LSE_ATOMIC" | "LSE128_ATOMIC" | "RCPC3")
}

/// The registers the word `w` at `pc` writes (a superset; see the module comment).
pub(super) fn writes(w: u32, pc: u64) -> RegSet {
    let Some(op) = decoder::decode(w) else {
        return ALL;
    };
    let def = op.definition();
    let class: &'static str = def.class.into();
    if exclusive_or_atomic(class) {
        return ALL;
    }
    if let Some(m) = mem::classify(w, pc) {
        return mem_writes(w, &m, class);
    }
    if !RD_CLASSES.contains(&class) {
        return ALL;
    }
    let first: Option<&'static str> = def.operands.first().map(|o| o.kind.into());
    match first {
        Some("Rd") => zr_bit(w),
        Some("Rd_SP") => base_bit(w),
        _ => 0,
    }
}

/// What a load/store writes: its loaded general register(s) and a written-back base.
fn mem_writes(w: u32, m: &mem::MemAccess, class: &str) -> RegSet {
    let simd = class.starts_with("ASISD") || (class != "LDST_IMM10" && w >> 26 & 1 == 1);
    let pair = matches!(
        class,
        "LDSTPAIR_OFF" | "LDSTPAIR_INDEXED" | "LDSTNAPAIR_OFFS"
    );
    let mut set = 0;
    if m.read && !simd {
        set |= zr_bit(w);
        if pair {
            set |= zr_bit(w >> 10);
        }
    }
    let writeback = match class {
        "LDST_IMM9" | "LDSTPAIR_INDEXED" | "ASISDLSEP" | "ASISDLSOP" => true,
        "LDST_IMM10" => w >> 11 & 1 == 1,
        _ => m.addr == mem::Addr::PostIndex,
    };
    if writeback {
        set |= base_bit(u32::from(m.base));
    }
    set
}

/// The registers the address of `m` reads.
fn address_regs(m: &mem::MemAccess) -> RegSet {
    match m.addr {
        mem::Addr::Literal(_) => 0,
        mem::Addr::Reg { rm, .. } => base_bit(u32::from(m.base)) | zr_bit(u32::from(rm)),
        mem::Addr::Offset(_) | mem::Addr::PostIndex => base_bit(u32::from(m.base)),
    }
}

/// Control may not fall through `w`, or it is an access that no run holds.
fn leaves(w: u32, pc: u64) -> bool {
    let stops = matches!(
        reloc::classify(w, pc),
        Class::Refuse(_)
            | Class::Bl { .. }
            | Class::Blr { .. }
            | Class::LoadExclusive
            | Class::StoreExclusive
    );
    stops || reloc::transfers(w, pc) || class_of(w).is_none_or(exclusive_or_atomic)
}

/// The run facts of the word `w` at `pc`; `site`: the memory candidate there, if any.
fn fact(w: u32, pc: u64, targets: &Targets, site: Option<&Candidate>) -> RunInsn {
    let leaves = leaves(w, pc);
    let member = site
        .filter(|c| c.window.is_ok() && !leaves)
        .and_then(|_| mem::classify(w, pc))
        .map(|m| address_regs(&m));
    RunInsn {
        target: targets.all.binary_search(&pc).is_ok(),
        leaves,
        member,
        head: member.is_some(),
        writes: writes(w, pc),
    }
}

/// Group `cands`' memory sites into runs of at most `cap` accesses: each member gets
/// its stub placed at the head's instruction (`Candidate::at`; `insn` stays its own) and
/// needs no window of its own.
pub(super) fn batch(
    body: &Body,
    targets: &Targets,
    cands: &mut [Candidate],
    cap: usize,
) -> RunStats {
    let n = body.size / INSN;
    let mut site_of = vec![None; n];
    for (k, c) in cands.iter().enumerate() {
        if c.req.kind == SiteKind::Memory && c.flags != 0 {
            if let Some(i) = c.insn.checked_sub(body.addr).map(|d| d as usize / INSN) {
                if i < n {
                    site_of[i] = Some(k);
                }
            }
        }
    }
    let facts: Vec<RunInsn> = (0..n)
        .map(|i| {
            let pc = body.addr + (i * INSN) as u64;
            match word_at(body.bytes, i * INSN) {
                Some(w) => fact(w, pc, targets, site_of[i].map(|k| &cands[k])),
                None => RunInsn {
                    leaves: true,
                    writes: ALL,
                    ..RunInsn::default()
                },
            }
        })
        .collect();
    let (found, stats) = runs::find(&facts, cap);
    for run in found {
        let Some(head) = site_of[run[0]].map(|k| cands[k].at) else {
            continue;
        };
        for &i in &run[1..] {
            if let Some(k) = site_of[i] {
                cands[k].at = head;
                cands[k].window = Err(FallbackReason::NoWindow);
            }
        }
    }
    stats
}
