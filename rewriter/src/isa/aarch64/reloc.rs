//! Classifying A64 instructions (disarm64) and re-creating a displaced instruction at
//! its trampoline address.
//!
//! The trampoline is far from the site (after the end of the binary), so every
//! PC-relative form is rebuilt from the absolute address it refers to: `adrp`+`add`
//! into the destination register, then the load or branch from there. Conditional
//! branches become "condition → far branch, else fall through" pairs. Nothing here
//! touches NZCV or a register the original instruction would not have written, except
//! `x30` for BL, which gets the ORIGINAL return address so that the callee returns
//! behind the site.
//!
//! Per form: ADR → `adrp`+`add` into the same register; ADRP → `adrp` from the new PC;
//! LDR/LDRSW (literal) → `adrp`+`add` into the destination register, then the load
//! through it; PRFM (literal) → `nop` (a hint); B → `b`; BL → `adrp`+`add x30` = the
//! original return address, then `b` (unwinders see the real caller); B.cond / CBZ /
//! CBNZ / TBZ / TBNZ → the same test re-pointed at +8, `b back`, `b target`. Every
//! class is checked against objdump in the unit tests and run under qemu by
//! `tests/fixtures/reloc_a64.S`.

use disarm64::decoder::{self, InsnId};

use super::enc::{self, Asm, RET, RETAA, RETAB};

/// What a decoded instruction means for patching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// Position independent: copy it.
    Plain,
    /// `blr xN`: re-created as a jump through x16 with x30 = the original return
    /// address.
    Blr {
        rn: u32,
    },
    Adr {
        rd: u32,
        target: u64,
    },
    Adrp {
        rd: u32,
        target: u64,
    },
    B {
        target: u64,
    },
    Bl {
        target: u64,
    },
    /// B.cond; `raw` keeps the condition.
    BCond {
        cond: u32,
        target: u64,
    },
    Cbz {
        raw: u32,
        target: u64,
    },
    Tbz {
        raw: u32,
        target: u64,
    },
    /// LDR (literal) to a general register, 32- or 64-bit, or LDRSW (literal).
    LdrLit {
        rt: u32,
        kind: LitKind,
        target: u64,
    },
    /// PRFM (literal): a hint; re-created as a NOP.
    PrfmLit,
    /// Load-exclusive (opens an exclusive sequence).
    LoadExclusive,
    /// Store-exclusive (closes it).
    StoreExclusive,
    /// Never displaced: a reason.
    Refuse(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LitKind {
    W,
    X,
    Sw,
}

fn sext(v: u32, bits: u32) -> i64 {
    let s = 64 - bits;
    (i64::from(v) << s) >> s
}

/// Decode and classify the instruction `w` at `pc`.
pub(super) fn classify(w: u32, pc: u64) -> Class {
    let Some(op) = decoder::decode(w) else {
        return Class::Refuse("undecodable instruction");
    };
    pc_relative(op.id(), w, pc).unwrap_or_else(|| not_pc_relative(op.id(), w))
}

/// The PC-relative forms that are relocated: address computations, branches, literal
/// loads.
fn pc_relative(id: InsnId, w: u32, pc: u64) -> Option<Class> {
    let rd = w & 31;
    let off19 = || pc.wrapping_add_signed(sext((w >> 5) & 0x7ffff, 19) << 2);
    Some(match id {
        InsnId::ADR_Rd_ADDR_PCREL21 => {
            let imm = ((w >> 5) & 0x7ffff) << 2 | (w >> 29) & 3;
            Class::Adr {
                rd,
                target: pc.wrapping_add_signed(sext(imm, 21)),
            }
        }
        InsnId::ADRP_Rd_ADDR_ADRP => {
            let imm = ((w >> 5) & 0x7ffff) << 2 | (w >> 29) & 3;
            Class::Adrp {
                rd,
                target: (pc & !0xfff).wrapping_add_signed(sext(imm, 21) << 12),
            }
        }
        InsnId::B_ADDR_PCREL26 | InsnId::BL_ADDR_PCREL26 => {
            let target = pc.wrapping_add_signed(sext(w & 0x3ff_ffff, 26) << 2);
            if id == InsnId::B_ADDR_PCREL26 {
                Class::B { target }
            } else {
                Class::Bl { target }
            }
        }
        InsnId::B_C_ADDR_PCREL19 => Class::BCond {
            cond: w & 15,
            target: off19(),
        },
        InsnId::CBZ_Rt_ADDR_PCREL19 | InsnId::CBNZ_Rt_ADDR_PCREL19 => Class::Cbz {
            raw: w,
            target: off19(),
        },
        InsnId::TBZ_Rt_BIT_NUM_ADDR_PCREL14 | InsnId::TBNZ_Rt_BIT_NUM_ADDR_PCREL14 => Class::Tbz {
            raw: w,
            target: pc.wrapping_add_signed(sext((w >> 5) & 0x3fff, 14) << 2),
        },
        InsnId::LDR_Rt_ADDR_PCREL19 | InsnId::LDRSW_Rt_ADDR_PCREL19 => {
            if rd == 31 {
                return Some(Class::Refuse("literal load into xzr"));
            }
            let kind = match (id, w >> 30) {
                (InsnId::LDRSW_Rt_ADDR_PCREL19, _) => LitKind::Sw,
                (_, 0) => LitKind::W,
                _ => LitKind::X,
            };
            Class::LdrLit {
                rt: rd,
                kind,
                target: off19(),
            }
        }
        InsnId::PRFM_PRFOP_ADDR_PCREL19 => Class::PrfmLit,
        _ => return None,
    })
}

/// Every other instruction: exclusive accesses, indirect calls, traps, and plain ones
/// (unless of a PC-relative form not relocated).
fn not_pc_relative(id: InsnId, w: u32) -> Class {
    match id {
        InsnId::LDXR_Rt_ADDR_SIMPLE
        | InsnId::LDXRB_Rt_ADDR_SIMPLE
        | InsnId::LDXRH_Rt_ADDR_SIMPLE
        | InsnId::LDAXR_Rt_ADDR_SIMPLE
        | InsnId::LDAXRB_Rt_ADDR_SIMPLE
        | InsnId::LDAXRH_Rt_ADDR_SIMPLE
        | InsnId::LDXP_Rt_Rt2_ADDR_SIMPLE
        | InsnId::LDAXP_Rt_Rt2_ADDR_SIMPLE => Class::LoadExclusive,
        InsnId::STXR_Rs_Rt_ADDR_SIMPLE
        | InsnId::STXRB_Rs_Rt_ADDR_SIMPLE
        | InsnId::STXRH_Rs_Rt_ADDR_SIMPLE
        | InsnId::STLXR_Rs_Rt_ADDR_SIMPLE
        | InsnId::STLXRB_Rs_Rt_ADDR_SIMPLE
        | InsnId::STLXRH_Rs_Rt_ADDR_SIMPLE
        | InsnId::STXP_Rs_Rt_Rt2_ADDR_SIMPLE
        | InsnId::STLXP_Rs_Rt_Rt2_ADDR_SIMPLE => Class::StoreExclusive,
        InsnId::BLR_Rn => Class::Blr { rn: (w >> 5) & 31 },
        InsnId::BLRAA_Rn_Rd_SP | InsnId::BLRAB_Rn_Rd_SP => {
            // The callee would return into the trampoline, where no unwind
            // information describes the frame.
            Class::Refuse("indirect call in the displaced instruction")
        }
        InsnId::BLRAAZ_Rn | InsnId::BLRABZ_Rn => {
            Class::Refuse("indirect call in the displaced instruction")
        }
        InsnId::SVC_EXCEPTION
        | InsnId::BRK_EXCEPTION
        | InsnId::HLT_EXCEPTION
        | InsnId::UDF_UNDEFINED => Class::Refuse("trap instruction in the displaced instruction"),
        id => {
            // Any other PC-relative form (SIMD literal loads, compare-and-branch,
            // BC.cond, ...) is not re-created: name-based catch-all on the id.
            let name = format!("{id:?}");
            if name.contains("PCREL") || name.contains("ADRP") {
                Class::Refuse("PC-relative instruction of a form not relocated")
            } else {
                Class::Plain
            }
        }
    }
}

/// `ret` (through x30), `retaa`, `retab`: a function return. The second value says
/// whether x30 still holds a signed pointer there.
pub(super) fn is_return(w: u32) -> Option<bool> {
    match w {
        RET => Some(false),
        RETAA | RETAB => Some(true),
        _ => None,
    }
}

/// Whether control never falls through `w` (a return, an unconditional branch).
pub(super) fn leaves(w: u32) -> bool {
    // b imm26; br xN.
    is_return(w).is_some() || w & 0xfc00_0000 == 0x1400_0000 || w & 0xffff_fc1f == 0xd61f_0000
}

/// Whether `w` can transfer control (ends a basic block): branches, calls, returns,
/// traps.
pub(super) fn transfers(w: u32, pc: u64) -> bool {
    leaves(w)
        || branch_target(w, pc).is_some()
        || w & 0xfe00_0000 == 0xd600_0000 // br/blr/ret and their PAC forms
        || matches!(classify(w, pc), Class::Refuse(_)) && w & 0xff00_0000 == 0xd400_0000
}

/// Direct branch target of `w` at `pc`, if it is a direct branch.
pub(super) fn branch_target(w: u32, pc: u64) -> Option<u64> {
    match classify(w, pc) {
        Class::B { target }
        | Class::Bl { target }
        | Class::BCond { target, .. }
        | Class::Cbz { target, .. }
        | Class::Tbz { target, .. } => Some(target),
        _ => None,
    }
}

/// Append the re-creation of `w` (originally at `pc`) to `a`, then fall through to
/// what follows in `a` (the caller appends the branch back to `pc + 4`).
pub(super) fn relocate(a: &mut Asm, w: u32, pc: u64) -> Result<(), String> {
    let next = pc + 4;
    // `short` is the original conditional branch re-pointed at +8: taken → the far
    // `b target` two words on; not taken → `b next`.
    let cond_pair = |a: &mut Asm, short: u32, target: u64| -> Result<(), String> {
        a.put(short);
        a.b_to(false, next)?;
        a.b_to(false, target)
    };
    match classify(w, pc) {
        Class::Plain | Class::LoadExclusive | Class::StoreExclusive => a.put(w),
        Class::Refuse(why) => return Err(format!("{why} at {pc:#x}")),
        Class::Adr { rd, target } => {
            if rd == 31 {
                a.put(enc::NOP);
            } else {
                a.addr(rd, target)?;
            }
        }
        Class::Adrp { rd, target } => {
            let from = a.pc();
            if rd == 31 {
                a.put(enc::NOP);
            } else {
                a.put(enc::adrp(rd, from, target).ok_or_else(|| {
                    format!("adrp at {pc:#x}: page {target:#x} out of reach from {from:#x}")
                })?);
            }
        }
        Class::B { target } => a.b_to(false, target)?,
        Class::Bl { target } => {
            // The callee must return to the instruction after the site, and unwinders
            // must see the original caller: x30 = the original return address.
            a.addr(enc::LR, next)?;
            a.b_to(false, target)?;
            return Ok(());
        }
        Class::Blr { rn } => {
            // Same for an indirect call, through x16 (an intra-procedure-call scratch
            // register, free at a call; `bti c` accepts `br x16`), since x30 may be the
            // target register itself.
            if rn != 16 {
                a.put(enc::mov_reg(16, rn));
            }
            a.addr(enc::LR, next)?;
            a.put(0xd61f_0000 | 16 << 5); // br x16
            return Ok(());
        }
        Class::BCond { cond, target } => {
            cond_pair(a, 0x5400_0000 | 2 << 5 | cond, target)?;
            return Ok(());
        }
        Class::Cbz { raw, target } => {
            cond_pair(a, (raw & !(0x7ffff << 5)) | 2 << 5, target)?;
            return Ok(());
        }
        Class::Tbz { raw, target } => {
            cond_pair(a, (raw & !(0x3fff << 5)) | 2 << 5, target)?;
            return Ok(());
        }
        Class::LdrLit { rt, kind, target } => {
            a.addr(rt, target)?;
            a.put(match kind {
                LitKind::W => enc::ldr_w(rt, rt, 0),
                LitKind::X => enc::ldr_x(rt, rt, 0),
                LitKind::Sw => enc::ldrsw(rt, rt, 0),
            });
        }
        Class::PrfmLit => a.put(enc::NOP),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::enc::tests::objdump;
    use super::*;

    const PC: u64 = 0x41_0000;
    const AT: u64 = 0x80_0000;

    fn words(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Relocate `w` from PC to AT, append `b PC+4` like the stub does, disassemble.
    fn reloc(w: u32) -> Option<(Vec<String>, Vec<String>)> {
        let orig = objdump(&[w], PC)?;
        let mut a = Asm::new(AT);
        relocate(&mut a, w, PC).unwrap();
        a.b_to(false, PC + 4).unwrap();
        let out = words(&a.finish().unwrap());
        Some((orig, objdump(&out, AT)?))
    }

    macro_rules! check {
        ($name:ident, $w:expr, $orig:expr, [$($want:expr),* $(,)?]) => {
            #[test]
            fn $name() {
                let Some((orig, got)) = reloc($w) else {
                    eprintln!("aarch64-linux-gnu-objdump not installed; skipped");
                    return;
                };
                assert_eq!(orig, vec![$orig.to_string()]);
                let want: Vec<String> = vec![$($want.to_string()),*];
                assert_eq!(got, want);
            }
        };
    }

    // Original encodings assembled by hand and confirmed by the `orig` objdump line.
    check!(
        adr,
        0x1000_0100 | 3 << 29 | 5,
        "adr x5, 0x410023",
        ["adrp x5, 0x410000", "add x5, x5, #0x23", "b 0x410004"]
    );
    check!(
        adrp,
        0x9000_0000 | 1 << 29 | 7,
        "adrp x7, 0x411000",
        ["adrp x7, 0x411000", "b 0x410004"]
    );
    check!(b, 0x1400_0010, "b 0x410040", ["b 0x410040", "b 0x410004"]);
    check!(
        bl,
        0x9400_0010,
        "bl 0x410040",
        [
            "adrp x30, 0x410000",
            "add x30, x30, #0x4",
            "b 0x410040",
            "b 0x410004"
        ]
    );
    check!(
        blr,
        0xd63f_0020,
        "blr x1",
        [
            "mov x16, x1",
            "adrp x30, 0x410000",
            "add x30, x30, #0x4",
            "br x16",
            "b 0x410004"
        ]
    );
    check!(
        blr_x30,
        0xd63f_03c0,
        "blr x30",
        [
            "mov x16, x30",
            "adrp x30, 0x410000",
            "add x30, x30, #0x4",
            "br x16",
            "b 0x410004"
        ]
    );
    check!(
        b_cond,
        0x5400_0101,
        "b.ne 0x410020",
        ["b.ne 0x800008", "b 0x410004", "b 0x410020", "b 0x410004"]
    );
    check!(
        cbz,
        0xb400_0102,
        "cbz x2, 0x410020",
        ["cbz x2, 0x800008", "b 0x410004", "b 0x410020", "b 0x410004"]
    );
    check!(
        cbnz_w,
        0x3500_0102,
        "cbnz w2, 0x410020",
        [
            "cbnz w2, 0x800008",
            "b 0x410004",
            "b 0x410020",
            "b 0x410004"
        ]
    );
    check!(
        tbnz,
        0xb7f8_0103,
        "tbnz x3, #63, 0x410020",
        [
            "tbnz x3, #63, 0x800008",
            "b 0x410004",
            "b 0x410020",
            "b 0x410004"
        ]
    );
    check!(
        tbz,
        0x3618_0103,
        "tbz w3, #3, 0x410020",
        [
            "tbz w3, #3, 0x800008",
            "b 0x410004",
            "b 0x410020",
            "b 0x410004"
        ]
    );
    check!(
        ldr_x_lit,
        0x5800_0101,
        "ldr x1, 0x410020",
        [
            "adrp x1, 0x410000",
            "add x1, x1, #0x20",
            "ldr x1, [x1]",
            "b 0x410004"
        ]
    );
    check!(
        ldr_w_lit,
        0x1800_0101,
        "ldr w1, 0x410020",
        [
            "adrp x1, 0x410000",
            "add x1, x1, #0x20",
            "ldr w1, [x1]",
            "b 0x410004"
        ]
    );
    check!(
        ldrsw_lit,
        0x9800_0101,
        "ldrsw x1, 0x410020",
        [
            "adrp x1, 0x410000",
            "add x1, x1, #0x20",
            "ldrsw x1, [x1]",
            "b 0x410004"
        ]
    );
    check!(
        prfm_lit,
        0xd800_0100,
        "prfm pldl1keep, 0x410020",
        ["nop", "b 0x410004"]
    );
    check!(
        plain,
        0xa9bf_7bfd,
        "stp x29, x30, [sp, #-16]!",
        ["stp x29, x30, [sp, #-16]!", "b 0x410004"]
    );

    #[test]
    fn refused_and_exclusive() {
        assert_eq!(classify(0xd63f_0020, PC), Class::Blr { rn: 1 }); // blr x1
        assert!(matches!(classify(0xd63f_083f, PC), Class::Refuse(_))); // blraaz x1
        assert!(matches!(classify(0xd400_0001, PC), Class::Refuse(_))); // svc #0
        assert!(matches!(classify(0x1c00_0100, PC), Class::Refuse(_))); // ldr s0, lit
        assert_eq!(classify(0xc85f_7c20, PC), Class::LoadExclusive); // ldxr x0, [x1]
        assert_eq!(classify(0x885f_fc20, PC), Class::LoadExclusive); // ldaxr w0, [x1]
        assert_eq!(classify(0xc802_7c20, PC), Class::StoreExclusive); // stxr w2, x0, [x1]
        assert_eq!(classify(0x8802_fc20, PC), Class::StoreExclusive); // stlxr w2, w0, [x1]
    }
}
