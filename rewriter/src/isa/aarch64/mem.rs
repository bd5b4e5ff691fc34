//! Memory-access sites: what a load/store instruction accesses (`classify`) and the
//! code that recomputes its effective address in front of it (`emit_ea`).
//!
//! disarm64 recognises the instruction (class + mnemonic, so that only the
//! ARMv8.0–8.5 forms that compilers emit for Linux user code are accepted); the
//! operand values come from the encoding fields (Arm ARM, "Loads and Stores"), since
//! disarm64 describes operand kinds but not their decoded values.
//!
//! Not accesses (`None`): PRFM/PRFUM (hints), MTE tag instructions (LDG, STG, ST2G,
//! STZG, STZ2G, LDGM, STGM, STZGM), cache maintenance (`dc zva` zeroes a block, but is
//! a system instruction), and every form newer than ARMv8.5 (LSE128, RCPC3, LSUI
//! unprivileged atomics, LSFE floating-point atomics, LS64, MOPS, SVE/SME).

use disarm64::InsnOpcode;
use disarm64::decoder;

use super::enc::{self, Asm, SP};

/// What a load/store instruction accesses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MemAccess {
    /// 0..=30 = xN, 31 = sp; unused for literal loads.
    pub base: u8,
    pub addr: Addr,
    /// Total bytes accessed (pairs: 2 × element; `ld1 {v0-v3}`: 4 × 16, ...).
    pub size: u32,
    pub read: bool,
    pub write: bool,
    /// LDRAA/LDRAB: the base register carries a pointer authentication code, which the
    /// instruction checks and removes before adding the offset; `emit_ea` strips it
    /// (XPACD) so that the recorded address is the one accessed.
    pub auth: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Addr {
    /// `[base, #imm]` and pre-index `[base, #imm]!`: EA = base + imm.
    Offset(i64),
    /// `[base], #imm` / `[base], xm`: EA = base.
    PostIndex,
    /// `[base, xm/wm {, extend #shift}]`: EA = base + (extend(rm) << shift); rm 31 is
    /// xzr.
    Reg { rm: u8, extend: Extend, shift: u8 },
    /// PC-relative literal load: the absolute target address.
    Literal(u64),
}

/// Extension of the index register of a register-offset access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Extend {
    Uxtw,
    /// `lsl` (UXTX): the 64-bit register as is.
    Lsl,
    Sxtw,
    Sxtx,
}

impl Extend {
    /// The `option` field (bits 15:13), shared by load/store register offset and ADD
    /// (extended register).
    fn option(self) -> u32 {
        match self {
            Extend::Uxtw => 0b010,
            Extend::Lsl => 0b011,
            Extend::Sxtw => 0b110,
            Extend::Sxtx => 0b111,
        }
    }
    fn from_option(o: u32) -> Option<Self> {
        match o {
            0b010 => Some(Extend::Uxtw),
            0b011 => Some(Extend::Lsl),
            0b110 => Some(Extend::Sxtw),
            0b111 => Some(Extend::Sxtx),
            _ => None,
        }
    }
}

fn sext(v: u32, bits: u32) -> i64 {
    let s = 64 - bits;
    (i64::from(v) << s) >> s
}

fn field(w: u32, lsb: u32, width: u32) -> u32 {
    (w >> lsb) & ((1 << width) - 1)
}

/// Element size and direction of the single-register LDR/STR family (immediate,
/// unscaled, pre/post-index, register offset, unprivileged, LDAPUR/STLUR) from
/// size (31:30), V (26) and opc (23:22). `None` for unallocated combinations and
/// for PRFM (size 11, opc 10, V 0), which accesses nothing.
fn ldst_size(w: u32) -> Option<(u32, bool, bool)> {
    let (size, v, opc) = (field(w, 30, 2), field(w, 26, 1), field(w, 22, 2));
    if v == 1 {
        // opc<1> set selects the 128-bit Q form, only with size 00.
        let bytes = match (opc >> 1, size) {
            (0, _) => 1 << size,
            (1, 0) => 16,
            _ => return None,
        };
        let load = opc & 1 == 1;
        Some((bytes, load, !load))
    } else {
        match (size, opc) {
            // PRFM (11, 10); unallocated: sign-extending loads of a word into a
            // word (10, 11) and of a doubleword (11, 11).
            (3, 2) | (3, 3) | (2, 3) => None,
            (_, 0) => Some((1 << size, false, true)),
            _ => Some((1 << size, true, false)),
        }
    }
}

/// Mnemonic suffixes of the LSE atomics accepted (acquire/release, byte/halfword).
const LSE_SUFFIXES: [&str; 12] = [
    "", "a", "al", "l", "b", "ab", "alb", "lb", "h", "ah", "alh", "lh",
];
const LSE_OPS: [&str; 8] = ["add", "clr", "eor", "set", "smax", "smin", "umax", "umin"];

/// Load/store exclusive, load-acquire/store-release and RCpc loads of ARMv8.0–8.4
/// (not the LSUI `ldtxr` family nor the MTE `ldgm` family of the same class).
const EXCLUSIVE: &[&str] = &[
    "ldxr", "ldxrb", "ldxrh", "ldaxr", "ldaxrb", "ldaxrh", "stxr", "stxrb", "stxrh", "stlxr",
    "stlxrb", "stlxrh", "ldxp", "ldaxp", "stxp", "stlxp", "ldar", "ldarb", "ldarh", "stlr",
    "stlrb", "stlrh", "ldlar", "ldlarb", "ldlarh", "stllr", "stllrb", "stllrh", "ldapr", "ldaprb",
    "ldaprh",
];

fn access(base: u32, addr: Addr, size: u32, read: bool, write: bool) -> MemAccess {
    MemAccess {
        base: base as u8,
        addr,
        size,
        read,
        write,
        auth: false,
    }
}

/// What the instruction `w` at `pc` accesses; `None` when it accesses no data memory
/// (including prefetches) or is a form not supported (see the module comment).
pub(super) fn classify(w: u32, pc: u64) -> Option<MemAccess> {
    let op = decoder::decode(w)?;
    let def = op.definition();
    let m = def.mnemonic;
    let rn = field(w, 5, 5);
    let imm9 = sext(field(w, 12, 9), 9);
    // disarm64 does not re-export its class enum: match on the class name.
    let class: &'static str = def.class.into();
    match class {
        "LDST_POS" => {
            let (bytes, r, wr) = ldst_size(w)?;
            let off = i64::from(field(w, 10, 12)) * i64::from(bytes);
            Some(access(rn, Addr::Offset(off), bytes, r, wr))
        }
        "LDST_IMM9" | "LDST_UNSCALED" | "LDST_UNPRIV" => {
            // MTE tag stores/loads share the classes; PRFUM is a hint.
            if matches!(m, "stg" | "st2g" | "stzg" | "stz2g" | "ldg" | "prfum") {
                return None;
            }
            let (bytes, r, wr) = ldst_size(w)?;
            // Bits 11:10: 00 unscaled, 01 post-index, 10 unprivileged, 11 pre-index.
            let addr = if field(w, 10, 2) == 0b01 {
                Addr::PostIndex
            } else {
                Addr::Offset(imm9)
            };
            Some(access(rn, addr, bytes, r, wr))
        }
        "LDST_REGOFF" => {
            let (bytes, r, wr) = ldst_size(w)?;
            let extend = Extend::from_option(field(w, 13, 3))?;
            let shift = if field(w, 12, 1) == 1 {
                bytes.trailing_zeros() as u8
            } else {
                0
            };
            let rm = field(w, 16, 5) as u8;
            Some(access(rn, Addr::Reg { rm, extend, shift }, bytes, r, wr))
        }
        "LDST_IMM10" => {
            // LDRAA/LDRAB: S (22) : imm9 (20:12), scaled by 8; W (11) writes the EA
            // back (pre-index), the EA itself is the same.
            let off = sext(field(w, 22, 1) << 9 | field(w, 12, 9), 10) << 3;
            Some(MemAccess {
                auth: true,
                ..access(rn, Addr::Offset(off), 8, true, false)
            })
        }
        "LDSTPAIR_OFF" | "LDSTPAIR_INDEXED" | "LDSTNAPAIR_OFFS" => pair(w, m, rn),
        "LOADLIT" => {
            let bytes = match (field(w, 26, 1), field(w, 30, 2)) {
                (0, 0) | (0, 2) => 4,
                (0, 1) => 8,
                (1, opc @ 0..=2) => 4 << opc,
                // PRFM (literal) and unallocated.
                _ => return None,
            };
            let target = pc.wrapping_add_signed(sext(field(w, 5, 19), 19) << 2);
            Some(access(0, Addr::Literal(target), bytes, true, false))
        }
        "LDSTEXCL" => exclusive(w, m, rn),
        "LSE_ATOMIC" => atomic(w, m, rn),
        "ASISDLSE" | "ASISDLSEP" => simd_multiple(w, class, rn),
        "ASISDLSO" | "ASISDLSOP" => simd_single(w, class, rn),
        _ => None,
    }
}

/// Load/store pair (LDP, STP, LDPSW, LDNP, STNP, STGP).
fn pair(w: u32, m: &str, rn: u32) -> Option<MemAccess> {
    // Not the RCPC3 (ldap/ldapp/stlp) nor the LSUI (ldtp/sttp/ldtnp/sttnp)
    // pairs of the same classes.
    if !matches!(m, "ldp" | "stp" | "ldpsw" | "ldnp" | "stnp" | "stgp") {
        return None;
    }
    let (opc, v, load) = (field(w, 30, 2), field(w, 26, 1), field(w, 22, 1) == 1);
    // (element bytes, offset scale)
    let (elem, scale) = match (v, opc) {
        (1, 0..=2) => (4 << opc, 4 << opc),
        (0, 0) => (4, 4),
        (0, 2) => (8, 8),
        // LDPSW; STGP stores two X registers with the offset in granules.
        (0, 1) if m == "ldpsw" => (4, 4),
        (0, 1) if m == "stgp" => (8, 16),
        _ => return None,
    };
    let off = sext(field(w, 15, 7), 7) * scale;
    // Bits 24:23: 00 non-temporal, 01 post-index, 10 offset, 11 pre-index.
    let addr = if field(w, 23, 2) == 0b01 {
        Addr::PostIndex
    } else {
        Addr::Offset(off)
    };
    Some(access(rn, addr, 2 * elem, load, !load))
}

/// Exclusive and acquire/release loads and stores.
fn exclusive(w: u32, m: &str, rn: u32) -> Option<MemAccess> {
    if !EXCLUSIVE.contains(&m) {
        return None;
    }
    let size = field(w, 30, 2);
    let bytes = if m.ends_with('p') {
        // Pairs: size<0> selects 32- or 64-bit registers.
        2 * (4 << (size & 1))
    } else {
        1 << size
    };
    let load = m.starts_with("ld");
    Some(access(rn, Addr::Offset(0), bytes, load, !load))
}

/// LSE atomics: compare-and-swap, swap, load-and-op.
fn atomic(w: u32, m: &str, rn: u32) -> Option<MemAccess> {
    let size = field(w, 30, 2);
    let bytes = if let Some(rest) = m.strip_prefix("casp") {
        if !matches!(rest, "" | "a" | "al" | "l") {
            return None;
        }
        2 * (4 << (size & 1))
    } else {
        let rest = m
            .strip_prefix("cas")
            .or_else(|| m.strip_prefix("swp"))
            .or_else(|| {
                let r = m.strip_prefix("ld")?;
                LSE_OPS.iter().find_map(|op| r.strip_prefix(op))
            })?;
        if !LSE_SUFFIXES.contains(&rest) {
            return None;
        }
        1 << size
    };
    // Compare-and-swap writes only on a match, but may: both.
    Some(access(rn, Addr::Offset(0), bytes, true, true))
}

/// SIMD LD1-4/ST1-4 (multiple structures).
fn simd_multiple(w: u32, class: &str, rn: u32) -> Option<MemAccess> {
    // LD1-4/ST1-4 (multiple structures): opcode (15:12) gives the register
    // count, Q (30) the register width.
    let regs = match field(w, 12, 4) {
        0b0000 | 0b0010 => 4,
        0b0100 | 0b0110 => 3,
        0b1000 | 0b1010 => 2,
        0b0111 => 1,
        _ => return None,
    };
    let bytes = regs * (8 << field(w, 30, 1));
    let load = field(w, 22, 1) == 1;
    // Post-index by #imm (Rm = 31) or by a register: the access is at base.
    let addr = if class == "ASISDLSEP" {
        Addr::PostIndex
    } else {
        Addr::Offset(0)
    };
    Some(access(rn, addr, bytes, load, !load))
}

/// SIMD LD1-4/ST1-4 (single structure) and LDnR.
fn simd_single(w: u32, class: &str, rn: u32) -> Option<MemAccess> {
    // Single structure / replicate: opcode (15:13), R (21), S (12), size
    // (11:10). selem = opcode<0>:R + 1 registers, one element each.
    let opcode = field(w, 13, 3);
    let selem = ((opcode & 1) << 1 | field(w, 21, 1)) + 1;
    let size = field(w, 10, 2);
    let elem = match opcode >> 1 {
        0 => 1,
        1 => 2,
        2 if size & 1 == 1 => 8,
        2 => 4,
        // LDnR: one element of `size`, replicated.
        _ => 1 << size,
    };
    let load = field(w, 22, 1) == 1;
    let addr = if class == "ASISDLSOP" {
        Addr::PostIndex
    } else {
        Addr::Offset(0)
    };
    Some(access(rn, addr, selem * elem, load, !load))
}

/// Registers the stub saved at `[sp + 8 * (n - 9)]`.
fn saved_slot(r: u8) -> Option<u32> {
    (9..=13).contains(&r).then(|| 8 * (u32::from(r) - 9))
}

/// `rd = rn + imm` (rn may be sp) in one or two instructions; ±16 MiB, which covers
/// every load/store offset plus the stub's frame.
fn add_const(a: &mut Asm, rd: u32, rn: u32, imm: i64) -> Result<(), String> {
    let mag = imm.unsigned_abs();
    if mag >= 1 << 24 {
        return Err(format!("offset {imm:#x} out of ±16 MiB"));
    }
    let (hi, lo) = ((mag >> 12) as u32, (mag & 0xfff) as u32);
    let op = if imm < 0 { enc::sub_imm } else { enc::add_imm };
    let mut src = rn;
    if hi != 0 {
        a.put(op(rd, src, hi, true));
        src = rd;
    }
    if lo != 0 || src != rd {
        a.put(op(rd, src, lo, false));
    }
    Ok(())
}

/// `rd = original value of r`: from the stub's save slot for x9..x13, sp + the
/// stub's adjustment for sp.
fn load_orig(a: &mut Asm, rd: u32, r: u8, sp_adjust: u32) -> Result<(), String> {
    if r == 31 {
        add_const(a, rd, SP, i64::from(sp_adjust))
    } else if let Some(slot) = saved_slot(r) {
        a.put(enc::ldr_x(rd, SP, slot));
        Ok(())
    } else {
        a.put(enc::mov_reg(rd, u32::from(r)));
        Ok(())
    }
}

/// Append code computing the effective address of `m` into `dst` (x10..=x13), given
/// that the stub has moved sp down by `sp_adjust` bytes and saved x9..x13 at
/// `[sp + 8 * (n - 9)]`. Only `dst` changes (a spilled helper is restored; sp ends
/// where it started); NZCV is never written.
pub(super) fn emit_ea(a: &mut Asm, m: &MemAccess, dst: u8, sp_adjust: u32) -> Result<(), String> {
    if !(10..=13).contains(&dst) {
        return Err(format!("EA destination x{dst} is not one of x10..x13"));
    }
    if m.base > 31 {
        return Err(format!("base register {} out of range", m.base));
    }
    let d = u32::from(dst);
    match m.addr {
        Addr::Literal(target) => a.addr(d, target),
        Addr::Offset(_) | Addr::PostIndex => {
            let imm = match m.addr {
                Addr::Offset(imm) => imm,
                _ => 0,
            };
            if m.auth {
                // The offset applies to the authenticated (stripped) pointer.
                load_orig(a, d, m.base, sp_adjust)?;
                a.put(enc::xpacd(d));
                return add_const(a, d, d, imm);
            }
            match (m.base, saved_slot(m.base)) {
                (31, _) => add_const(a, d, SP, i64::from(sp_adjust).saturating_add(imm)),
                (_, Some(_)) => {
                    load_orig(a, d, m.base, sp_adjust)?;
                    add_const(a, d, d, imm)
                }
                (b, None) if imm == 0 => {
                    a.put(enc::mov_reg(d, u32::from(b)));
                    Ok(())
                }
                (b, None) => add_const(a, d, u32::from(b), imm),
            }
        }
        Addr::Reg { rm, extend, shift } => {
            if shift > 4 || rm > 31 {
                return Err(format!("index x{rm} shift {shift} not encodable"));
            }
            if m.auth {
                return Err("authenticated base with a register offset".into());
            }
            let (opt, sh) = (extend.option(), u32::from(shift));
            let base = u32::from(m.base);
            match (saved_slot(m.base), saved_slot(rm)) {
                // Index live in its register (or xzr).
                (None, None) => {
                    a.put(enc::add_ext(d, base, u32::from(rm), opt, sh));
                }
                (Some(slot), None) => {
                    a.put(enc::ldr_x(d, SP, slot));
                    a.put(enc::add_ext(d, d, u32::from(rm), opt, sh));
                }
                // Index saved: its original value into dst, then extend it there.
                (None, Some(slot)) => {
                    a.put(enc::ldr_x(d, SP, slot));
                    a.put(enc::add_ext(d, base, d, opt, sh));
                }
                (Some(slot), Some(_)) if m.base == rm => {
                    a.put(enc::ldr_x(d, SP, slot));
                    a.put(enc::add_ext(d, d, d, opt, sh));
                }
                (Some(bslot), Some(rslot)) => {
                    // Two saved values need a second register: x9 (never dst),
                    // spilled below sp and restored; sp stays 16-byte aligned.
                    a.put(enc::str_x_pre(9, SP, -16));
                    a.put(enc::ldr_x(9, SP, bslot + 16));
                    a.put(enc::ldr_x(d, SP, rslot + 16));
                    a.put(enc::add_ext(d, 9, d, opt, sh));
                    a.put(enc::ldr_x_post(9, SP, 16));
                }
            }
            if base == SP {
                add_const(a, d, d, i64::from(sp_adjust))?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::process::Command;

    /// A fresh scratch directory per call (tests run in parallel).
    fn scratch(tag: &str) -> PathBuf {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("utrace-mem-{tag}-{}-{seq}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Assemble one instruction per line with aarch64-linux-gnu-as (ARMv8.5 + MTE);
    /// the words in order. `None` when binutils for AArch64 are not installed.
    pub(in super::super) fn assemble(lines: &[&str]) -> Option<Vec<u32>> {
        Command::new("aarch64-linux-gnu-as")
            .arg("--version")
            .output()
            .ok()?;
        let dir = scratch("as");
        let src: String = std::iter::once(".text\n".to_string())
            .chain(lines.iter().map(|l| format!("{l}\n")))
            .collect();
        std::fs::write(dir.join("t.s"), src).unwrap();
        let out = Command::new("aarch64-linux-gnu-as")
            .args(["-march=armv8.5-a+memtag", "-o"])
            .arg(dir.join("t.o"))
            .arg(dir.join("t.s"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "as failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new("aarch64-linux-gnu-objcopy")
            .args(["-O", "binary", "-j", ".text"])
            .arg(dir.join("t.o"))
            .arg(dir.join("t.bin"))
            .output()
            .unwrap();
        assert!(out.status.success());
        let bytes = std::fs::read(dir.join("t.bin")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(words.len(), lines.len(), "one word per line expected");
        Some(words)
    }

    const R: (bool, bool) = (true, false);
    const W: (bool, bool) = (false, true);
    const RW: (bool, bool) = (true, true);
    const SP8: u8 = 31;

    fn off(b: u8, i: i64) -> (u8, Addr) {
        (b, Addr::Offset(i))
    }
    fn post(b: u8) -> (u8, Addr) {
        (b, Addr::PostIndex)
    }
    fn reg(b: u8, rm: u8, extend: Extend, shift: u8) -> (u8, Addr) {
        (b, Addr::Reg { rm, extend, shift })
    }
    /// Literal at `. + delta` (made absolute with the pc in the test).
    fn lit(delta: i64) -> (u8, Addr) {
        (0, Addr::Literal(delta as u64))
    }

    type Row = (&'static str, (u8, Addr), u32, (bool, bool));

    fn table() -> Vec<Row> {
        use super::Extend::{Lsl, Sxtw, Sxtx, Uxtw};
        vec![
            // LDR/STR, unsigned offset, all sizes, sign-extending loads.
            ("ldr x0, [x1]", off(1, 0), 8, R),
            ("ldr x0, [x1, #32760]", off(1, 32760), 8, R),
            ("ldr w0, [sp, #16380]", off(SP8, 16380), 4, R),
            ("ldrb w0, [x2, #4095]", off(2, 4095), 1, R),
            ("ldrh w0, [x2, #8190]", off(2, 8190), 2, R),
            ("ldrsb x0, [x2, #1]", off(2, 1), 1, R),
            ("ldrsb w0, [x2, #1]", off(2, 1), 1, R),
            ("ldrsh x0, [x2, #2]", off(2, 2), 2, R),
            ("ldrsh w0, [x2, #2]", off(2, 2), 2, R),
            ("ldrsw x0, [x2, #4]", off(2, 4), 4, R),
            ("str x0, [x3, #8]", off(3, 8), 8, W),
            ("strb w0, [x3]", off(3, 0), 1, W),
            ("strh wzr, [x3, #2]", off(3, 2), 2, W),
            ("str w0, [x30, #4]", off(30, 4), 4, W),
            // Unscaled.
            ("ldur x0, [x1, #-8]", off(1, -8), 8, R),
            ("ldur w0, [x1, #3]", off(1, 3), 4, R),
            ("ldurb w0, [x1, #-256]", off(1, -256), 1, R),
            ("ldurh w0, [x1, #255]", off(1, 255), 2, R),
            ("ldursb x0, [x1, #-1]", off(1, -1), 1, R),
            ("ldursh w0, [x1, #-2]", off(1, -2), 2, R),
            ("ldursw x0, [x1, #-4]", off(1, -4), 4, R),
            ("stur x0, [sp, #-8]", off(SP8, -8), 8, W),
            ("sturb w0, [x9, #1]", off(9, 1), 1, W),
            ("sturh w0, [x13, #-3]", off(13, -3), 2, W),
            // Pre/post-index.
            ("ldr x0, [x1, #16]!", off(1, 16), 8, R),
            ("ldr x0, [x1], #16", post(1), 8, R),
            ("str x0, [sp, #-16]!", off(SP8, -16), 8, W),
            ("ldrb w0, [x1], #-1", post(1), 1, R),
            ("strh w0, [x1, #-2]!", off(1, -2), 2, W),
            ("ldrsw x0, [x1], #4", post(1), 4, R),
            ("ldrsb w0, [x1, #-256]!", off(1, -256), 1, R),
            // Unprivileged (behave as ordinary accesses at EL0).
            ("ldtr x0, [x1, #8]", off(1, 8), 8, R),
            ("sttrb w0, [x1, #-1]", off(1, -1), 1, W),
            ("ldtrsw x0, [x1]", off(1, 0), 4, R),
            // Register offset.
            ("ldr x0, [x1, x2]", reg(1, 2, Lsl, 0), 8, R),
            ("ldr x0, [x1, x2, lsl #3]", reg(1, 2, Lsl, 3), 8, R),
            ("ldr w0, [x1, w2, uxtw]", reg(1, 2, Uxtw, 0), 4, R),
            ("ldr w0, [x1, w2, uxtw #2]", reg(1, 2, Uxtw, 2), 4, R),
            ("ldr x0, [x1, w2, sxtw #3]", reg(1, 2, Sxtw, 3), 8, R),
            ("ldr x0, [x1, x2, sxtx]", reg(1, 2, Sxtx, 0), 8, R),
            ("ldrb w0, [x1, x2, lsl #0]", reg(1, 2, Lsl, 0), 1, R),
            ("ldrsb x0, [x1, w2, sxtw]", reg(1, 2, Sxtw, 0), 1, R),
            ("ldrsh x0, [sp, x2, lsl #1]", reg(SP8, 2, Lsl, 1), 2, R),
            ("ldrsw x0, [x1, x2, lsl #2]", reg(1, 2, Lsl, 2), 4, R),
            ("strh w0, [x1, w2, sxtw #1]", reg(1, 2, Sxtw, 1), 2, W),
            ("str x0, [x9, x13]", reg(9, 13, Lsl, 0), 8, W),
            // SIMD&FP single register.
            ("ldr b0, [x1, #1]", off(1, 1), 1, R),
            ("ldr h0, [x1, #2]", off(1, 2), 2, R),
            ("ldr s0, [x1, #4]", off(1, 4), 4, R),
            ("ldr d0, [x1, #8]", off(1, 8), 8, R),
            ("ldr q0, [x1, #16]", off(1, 16), 16, R),
            ("str q0, [sp, #65520]", off(SP8, 65520), 16, W),
            ("str b0, [x1]", off(1, 0), 1, W),
            ("ldur q0, [x1, #-16]", off(1, -16), 16, R),
            ("stur h0, [x1, #-1]", off(1, -1), 2, W),
            ("str d0, [x1], #8", post(1), 8, W),
            ("ldr q1, [x1, #-32]!", off(1, -32), 16, R),
            ("ldr q0, [x1, x2, lsl #4]", reg(1, 2, Lsl, 4), 16, R),
            ("str s0, [x1, w2, sxtw #2]", reg(1, 2, Sxtw, 2), 4, W),
            ("ldr b0, [x1, x2]", reg(1, 2, Lsl, 0), 1, R),
            ("ldr d0, [x1, w2, uxtw]", reg(1, 2, Uxtw, 0), 8, R),
            // Pairs.
            ("ldp x0, x1, [x2]", off(2, 0), 16, R),
            ("ldp x0, x1, [sp, #-512]", off(SP8, -512), 16, R),
            ("stp x29, x30, [sp, #-16]!", off(SP8, -16), 16, W),
            ("ldp x29, x30, [sp], #16", post(SP8), 16, R),
            ("ldp w0, w1, [x2, #252]", off(2, 252), 8, R),
            ("stp w0, w1, [x2, #-256]!", off(2, -256), 8, W),
            ("ldpsw x0, x1, [x2, #-256]", off(2, -256), 8, R),
            ("ldpsw x0, x1, [x2], #8", post(2), 8, R),
            ("ldpsw x0, x1, [x2, #8]!", off(2, 8), 8, R),
            ("ldnp x0, x1, [x2, #16]", off(2, 16), 16, R),
            ("stnp w0, w1, [x2, #-4]", off(2, -4), 8, W),
            ("ldp s0, s1, [x2, #4]", off(2, 4), 8, R),
            ("stp d0, d1, [x2, #-8]!", off(2, -8), 16, W),
            ("ldp q0, q1, [x2, #1008]", off(2, 1008), 32, R),
            ("stp q0, q1, [x2], #-1024", post(2), 32, W),
            ("ldnp q0, q1, [x2, #32]", off(2, 32), 32, R),
            ("stnp d0, d1, [x2]", off(2, 0), 16, W),
            ("ldnp s0, s1, [x2, #-256]", off(2, -256), 8, R),
            ("stgp x0, x1, [x2, #32]", off(2, 32), 16, W),
            ("stgp x0, x1, [x2], #-16", post(2), 16, W),
            // Literals.
            ("ldr x0, . + 0x100", lit(0x100), 8, R),
            ("ldr w0, . - 4", lit(-4), 4, R),
            ("ldrsw x0, . + 8", lit(8), 4, R),
            ("ldr s0, . + 16", lit(16), 4, R),
            ("ldr d0, . + 1048572", lit(1048572), 8, R),
            ("ldr q0, . - 1048576", lit(-1048576), 16, R),
            // Exclusive, acquire/release, RCpc.
            ("ldxr x0, [x1]", off(1, 0), 8, R),
            ("ldxrb w0, [x1]", off(1, 0), 1, R),
            ("ldxrh w0, [sp]", off(SP8, 0), 2, R),
            ("ldaxr w0, [x1]", off(1, 0), 4, R),
            ("stxr w2, x0, [x1]", off(1, 0), 8, W),
            ("stlxrb w2, w0, [x1]", off(1, 0), 1, W),
            ("stlxr w2, w0, [x1]", off(1, 0), 4, W),
            ("ldxp x0, x1, [x2]", off(2, 0), 16, R),
            ("ldaxp w0, w1, [x2]", off(2, 0), 8, R),
            ("stxp w3, x0, x1, [x2]", off(2, 0), 16, W),
            ("stlxp w3, w0, w1, [x2]", off(2, 0), 8, W),
            ("ldar x0, [x1]", off(1, 0), 8, R),
            ("ldarb w0, [x1]", off(1, 0), 1, R),
            ("stlr w0, [x1]", off(1, 0), 4, W),
            ("stlrh w0, [x1]", off(1, 0), 2, W),
            ("ldapr x0, [x1]", off(1, 0), 8, R),
            ("ldaprb w0, [x1]", off(1, 0), 1, R),
            ("ldaprh w0, [x1]", off(1, 0), 2, R),
            ("ldlar x0, [x1]", off(1, 0), 8, R),
            ("stllr w0, [x1]", off(1, 0), 4, W),
            ("ldapur x0, [x1, #-8]", off(1, -8), 8, R),
            ("ldapursw x0, [x1, #4]", off(1, 4), 4, R),
            ("ldapurb w0, [x1]", off(1, 0), 1, R),
            ("ldapursb x0, [x1, #1]", off(1, 1), 1, R),
            ("ldapursh w0, [x1, #2]", off(1, 2), 2, R),
            ("stlur w0, [x1, #255]", off(1, 255), 4, W),
            ("stlurh w0, [x1, #-256]", off(1, -256), 2, W),
            ("stlur x0, [sp, #8]", off(SP8, 8), 8, W),
            // LSE atomics (stadd etc. are ldadd with xzr).
            ("ldadd x0, x1, [x2]", off(2, 0), 8, RW),
            ("ldaddalb w0, w1, [x2]", off(2, 0), 1, RW),
            ("ldclrh w0, w1, [sp]", off(SP8, 0), 2, RW),
            ("ldeora w0, w1, [x2]", off(2, 0), 4, RW),
            ("ldset x0, x1, [x2]", off(2, 0), 8, RW),
            ("ldsmaxl x0, x1, [x2]", off(2, 0), 8, RW),
            ("ldsminab w0, w1, [x2]", off(2, 0), 1, RW),
            ("ldumaxlh w0, w1, [x2]", off(2, 0), 2, RW),
            ("lduminal w0, w1, [x2]", off(2, 0), 4, RW),
            ("stadd x0, [x1]", off(1, 0), 8, RW),
            ("stsetlb w0, [x1]", off(1, 0), 1, RW),
            ("swp x0, x1, [x2]", off(2, 0), 8, RW),
            ("swpalh w0, w1, [x2]", off(2, 0), 2, RW),
            ("cas x0, x1, [x2]", off(2, 0), 8, RW),
            ("casalb w0, w1, [x2]", off(2, 0), 1, RW),
            ("casah w0, w1, [x2]", off(2, 0), 2, RW),
            ("casl w0, w1, [x2]", off(2, 0), 4, RW),
            ("casp x0, x1, x2, x3, [x4]", off(4, 0), 16, RW),
            ("caspal w0, w1, w2, w3, [x4]", off(4, 0), 8, RW),
            // Pointer-authenticated loads.
            ("ldraa x0, [x1]", off(1, 0), 8, R),
            ("ldraa x0, [x1, #-4096]", off(1, -4096), 8, R),
            ("ldrab x0, [x1, #4088]!", off(1, 4088), 8, R),
            ("ldraa x0, [sp, #8]", off(SP8, 8), 8, R),
            // LD1-4/ST1-4, multiple structures.
            ("ld1 {v0.16b}, [x0]", off(0, 0), 16, R),
            ("ld1 {v0.8b}, [x1]", off(1, 0), 8, R),
            ("ld1 {v0.4s, v1.4s}, [x1]", off(1, 0), 32, R),
            ("ld1 {v0.2d, v1.2d, v2.2d}, [x1]", off(1, 0), 48, R),
            (
                "ld1 {v0.16b, v1.16b, v2.16b, v3.16b}, [x1]",
                off(1, 0),
                64,
                R,
            ),
            ("ld1 {v0.1d, v1.1d, v2.1d, v3.1d}, [x1]", off(1, 0), 32, R),
            ("ld2 {v0.4s, v1.4s}, [x1]", off(1, 0), 32, R),
            ("ld3 {v0.8b, v1.8b, v2.8b}, [x1]", off(1, 0), 24, R),
            ("ld4 {v0.8h, v1.8h, v2.8h, v3.8h}, [sp]", off(SP8, 0), 64, R),
            ("st1 {v0.2s}, [x1]", off(1, 0), 8, W),
            ("st1 {v0.2s, v1.2s, v2.2s}, [x1]", off(1, 0), 24, W),
            (
                "st4 {v0.16b, v1.16b, v2.16b, v3.16b}, [x1]",
                off(1, 0),
                64,
                W,
            ),
            ("ld1 {v0.16b}, [x1], #16", post(1), 16, R),
            ("ld1 {v0.16b}, [x1], x2", post(1), 16, R),
            ("st2 {v0.2d, v1.2d}, [x1], #32", post(1), 32, W),
            ("ld1 {v0.16b, v1.16b}, [x1], x3", post(1), 32, R),
            ("st3 {v0.4h, v1.4h, v2.4h}, [x1], #24", post(1), 24, W),
            // Single structure.
            ("ld1 {v0.b}[15], [x1]", off(1, 0), 1, R),
            ("ld1 {v0.h}[7], [x1]", off(1, 0), 2, R),
            ("ld1 {v0.s}[3], [x1]", off(1, 0), 4, R),
            ("ld1 {v0.d}[1], [x1]", off(1, 0), 8, R),
            ("ld2 {v0.s, v1.s}[1], [x1]", off(1, 0), 8, R),
            ("ld3 {v0.h, v1.h, v2.h}[2], [x1]", off(1, 0), 6, R),
            ("ld4 {v0.d, v1.d, v2.d, v3.d}[0], [x1]", off(1, 0), 32, R),
            ("st1 {v0.s}[1], [x1]", off(1, 0), 4, W),
            ("st2 {v0.h, v1.h}[3], [x1]", off(1, 0), 4, W),
            ("st4 {v0.b, v1.b, v2.b, v3.b}[3], [x1], #4", post(1), 4, W),
            ("ld1 {v0.d}[1], [x1], x2", post(1), 8, R),
            ("ld3 {v0.s, v1.s, v2.s}[0], [x1], #12", post(1), 12, R),
            // Load and replicate.
            ("ld1r {v0.4s}, [x1]", off(1, 0), 4, R),
            ("ld1r {v0.16b}, [x1], #1", post(1), 1, R),
            ("ld2r {v0.2d, v1.2d}, [x1]", off(1, 0), 16, R),
            ("ld3r {v0.8h, v1.8h, v2.8h}, [x1]", off(1, 0), 6, R),
            (
                "ld4r {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], x2",
                post(1),
                16,
                R,
            ),
            ("ld4r {v0.1d, v1.1d, v2.1d, v3.1d}, [x1]", off(1, 0), 32, R),
        ]
    }

    /// Not memory accesses, or not supported.
    const NONE: &[&str] = &[
        "prfm pldl1keep, [x0]",
        "prfm pstl2strm, [x0, #8]",
        "prfm pldl1keep, [x0, x1, lsl #3]",
        "prfum pldl1keep, [x0, #-1]",
        "prfm pldl1keep, . + 8",
        "add x0, x1, x2",
        "mov x0, sp",
        "nop",
        "b . + 8",
        "ret",
        "adrp x0, . + 4096",
        "svc #0",
        "dc zva, x0",
        "ldg x0, [x1]",
        "stg x0, [x1]",
        "st2g x0, [x1, #16]!",
        "stzg x0, [x1], #32",
        "stz2g x0, [x1, #-16]",
        "ldgm x0, [x1]",
        "stgm x0, [x1]",
    ];

    const PC: u64 = 0x10_0000;

    #[test]
    fn classification_table() {
        let rows = table();
        let lines: Vec<&str> = rows
            .iter()
            .map(|r| r.0)
            .chain(NONE.iter().copied())
            .collect();
        let Some(words) = assemble(&lines) else {
            eprintln!("aarch64-linux-gnu-as not installed; skipped");
            return;
        };
        for (i, ((asm, (base, addr), size, (read, write)), &w)) in
            rows.iter().zip(&words).enumerate()
        {
            let pc = PC + 4 * i as u64;
            let (base, addr) = match *addr {
                Addr::Literal(d) => (0, Addr::Literal(pc.wrapping_add(d))),
                a => (*base, a),
            };
            let want = MemAccess {
                base,
                addr,
                size: *size,
                read: *read,
                write: *write,
                auth: asm.starts_with("ldra"),
            };
            assert_eq!(classify(w, pc), Some(want), "{asm} ({w:#010x})");
        }
        for (asm, &w) in NONE.iter().zip(&words[rows.len()..]) {
            assert_eq!(classify(w, PC), None, "{asm} ({w:#010x})");
        }
    }

    #[test]
    fn random_words_never_panic() {
        // xorshift64*: a few million words through classify, and every access it
        // returns through emit_ea.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut hits = 0u32;
        for _ in 0..3_000_000 {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let w = (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32;
            if let Some(m) = classify(w, 0x40_0000) {
                hits += 1;
                let mut a = Asm::new(0x40_1000);
                emit_ea(&mut a, &m, 10 + (w & 3) as u8, 64).unwrap();
                assert!(m.size > 0 && m.size <= 64 && (m.read || m.write));
            }
        }
        assert!(hits > 10_000, "only {hits} accesses among random words");
    }

    /// One execution case: registers, the instruction, the EA expected, and whether
    /// (and how) the instruction itself is run as an independent check.
    struct Exec {
        /// The instruction (assembled), or a literal load made at its final pc.
        insn: Insn,
        regs: Vec<(u8, u64)>,
        /// Initial sp; `STACK` when `None`.
        sp: Option<u64>,
        /// Instructions run after the registers are set, before the stub frame.
        pre: &'static [&'static str],
        dst: u8,
        ea: u64,
        /// Run the load: it leaves in `rt` a value whose low `n` bytes must be the
        /// table's bytes at `ea` (after the `post` instructions, e.g. `fmov x0, d0`).
        run: Option<(u8, u32, &'static [&'static str])>,
    }

    enum Insn {
        Asm(String),
        /// (base opcode of the literal form, rt, target)
        Lit(u32, u32, u64),
    }

    const LOAD: u64 = 0x40_0000;
    const CODE: u64 = LOAD + 0x80;
    /// Every u64 of the table holds its own address (refilled before each run).
    const T: u64 = 0x48_0000;
    const T_SIZE: u64 = 0x1_0000;
    const OUT: u64 = 0x49_0000;
    const STACK: u64 = 0x4a_1000;
    const MEM_END: u64 = 0x4b_0000;
    const FRAME: u32 = 64;

    fn garbage(r: u32) -> u64 {
        0xdead_0000_0000_0000 | u64::from(r)
    }

    fn exec_cases() -> Vec<Exec> {
        const REGS: &[(u8, u64)] = &[
            (1, T + 0x1000),
            (2, 0x40),
            // uxtw of w3 = 0x10; sxtw of w4 = -16; sxtx of x5 = -24.
            (3, 0xffff_ffff_0000_0010),
            (4, 0x0000_0000_ffff_fff0),
            (5, -24i64 as u64),
            (6, 1),
            (9, T + 0x2000),
            (10, T + 0x3000),
            (11, 8),
            // sxtw of w12 = -4.
            (12, 0x1234_5678_ffff_fffc),
            (13, T + 0x4000),
            (30, T + 0x5000),
        ];
        let e = |insn: &'static str, dst: u8, ea: u64| Exec {
            insn: Insn::Asm(insn.to_string()),
            regs: REGS.to_vec(),
            sp: None,
            pre: &[],
            dst,
            ea,
            run: None,
        };
        let x0 = |mut c: Exec, n: u32| {
            c.run = Some((0, n, &[]));
            c
        };
        let post = |mut c: Exec, n: u32, post: &'static [&'static str]| {
            c.run = Some((0, n, post));
            c
        };
        let sp = |mut c: Exec, v: u64| {
            c.sp = Some(v);
            c
        };
        let lit = |opc: u32, n: u32, target: u64, dst: u8| Exec {
            insn: Insn::Lit(opc, 0, target),
            regs: REGS.to_vec(),
            sp: None,
            pre: &[],
            dst,
            ea: target,
            run: Some((
                0,
                n,
                if opc == 0x9c00_0000 {
                    &["fmov x0, d0"]
                } else {
                    &[]
                },
            )),
        };
        let st = T + 0x8000;
        vec![
            x0(e("ldr x0, [x1, #8]", 10, T + 0x1008), 8),
            x0(e("ldr x0, [x1, #32760]", 11, T + 0x1000 + 32760), 8),
            x0(e("ldur w0, [x1, #-3]", 12, T + 0x1000 - 3), 4),
            x0(e("ldrb w0, [x1, #4095]", 13, T + 0x1000 + 4095), 1),
            x0(e("ldrsh x0, [x1, #-256]!", 10, T + 0x1000 - 256), 2),
            x0(e("ldr x0, [x1], #-16", 10, T + 0x1000), 8),
            x0(e("ldr x0, [x1, x2, lsl #3]", 10, T + 0x1200), 8),
            x0(e("ldr w0, [x1, w3, uxtw #2]", 11, T + 0x1040), 4),
            x0(e("ldr x0, [x1, w4, sxtw #3]", 12, T + 0x1000 - 128), 8),
            x0(e("ldrb w0, [x1, x5, sxtx]", 13, T + 0x1000 - 24), 1),
            post(
                e("ldr q0, [x1, x2, lsl #4]", 10, T + 0x1400),
                8,
                &["fmov x0, d0"],
            ),
            x0(e("ldr x0, [x30, #8]", 10, T + 0x5008), 8),
            x0(e("ldapur x0, [x1, #-8]", 10, T + 0x1000 - 8), 8),
            x0(e("ldp x0, x6, [x1, #-512]", 11, T + 0x1000 - 512), 8),
            // sp-based (the stub's frame is below sp: those EAs are not run).
            x0(sp(e("ldr x0, [sp, #16]", 10, st + 16), st), 8),
            sp(e("ldp x0, x6, [sp, #-16]!", 11, st - 16), st),
            e("stp x29, x30, [sp, #-16]!", 12, STACK - 16),
            x0(sp(e("ldr x0, [sp], #32", 13, st), st), 8),
            x0(sp(e("ldrsw x0, [sp, x2]", 10, st + 0x40), st), 4),
            sp(e("ldr x0, [sp, w4, sxtw]", 11, st - 16), st),
            x0(sp(e("ldr x0, [sp, x11, lsl #3]", 12, st + 0x40), st), 8),
            x0(sp(e("swp x6, x0, [sp]", 13, st), st), 8),
            e("st1 {v0.2d}, [sp]", 10, STACK),
            e("stlr x0, [sp]", 10, STACK),
            // Bases and indexes among the registers the stub saved.
            x0(e("ldr x0, [x9]", 10, T + 0x2000), 8),
            x0(e("ldr x0, [x10, #-8]", 10, T + 0x3000 - 8), 8),
            x0(e("ldr x0, [x13, #4096]", 11, T + 0x5000), 8),
            x0(e("ldr x0, [x1, x11, lsl #3]", 12, T + 0x1040), 8),
            x0(e("ldr w0, [x9, w12, sxtw #2]", 13, T + 0x2000 - 16), 4),
            x0(e("ldr w0, [x13, w12, sxtw #2]", 10, T + 0x4000 - 16), 4),
            x0(e("ldr x0, [x10, x11]", 11, T + 0x3008), 8),
            e("ldr x0, [x10, x10]", 12, 2 * (T + 0x3000)),
            e("ldr x0, [x13, x1]", 13, (T + 0x4000) + (T + 0x1000)),
            e("str x0, [x11, #-8]!", 10, 0),
            post(
                e("ldp q0, q1, [x9, #1008]", 10, T + 0x2000 + 1008),
                8,
                &["fmov x0, d0"],
            ),
            post(e("ldxr x0, [x13]", 12, T + 0x4000), 8, &["clrex"]),
            post(e("ldaxp x0, x6, [x10]", 13, T + 0x3000), 8, &["clrex"]),
            // Atomics return the old value.
            x0(e("ldadd x6, x0, [x1]", 10, T + 0x1000), 8),
            x0(e("casal x0, x6, [x1]", 11, T + 0x1000), 8),
            // SIMD structures: the first element of v0 (de-interleaved for LD2).
            post(
                e("ld1 {v0.16b, v1.16b}, [x1], x2", 10, T + 0x1000),
                8,
                &["fmov x0, d0"],
            ),
            post(
                e("ld2 {v0.4s, v1.4s}, [x9]", 11, T + 0x2000),
                4,
                &["fmov w0, s0"],
            ),
            post(
                e("ld1 {v0.s}[1], [x13]", 12, T + 0x4000),
                4,
                &["mov w0, v0.s[1]"],
            ),
            post(
                e("ld1r {v0.8h}, [x1], #2", 13, T + 0x1000),
                2,
                &["umov w0, v0.h[5]"],
            ),
            // Literals (the table is within ±1 MiB of the code).
            lit(0x5800_0000, 8, T + 0x100, 10),
            lit(0x1800_0000, 4, T + 0x204, 11),
            lit(0x9800_0000, 4, T + 0x30c, 12),
            lit(0x9c00_0000, 8, T + 0x404, 13),
            // PAC: x1 signed (zero modifier), stripped by the EA code, authenticated
            // by the load itself.
            Exec {
                pre: &["pacdza x1"],
                ..x0(e("ldraa x0, [x1, #8]", 10, T + 0x1008), 8)
            },
            e("ldraa x0, [sp, #8]", 12, STACK + 8),
            Exec {
                pre: &["pacdza x9"],
                ..x0(e("ldraa x0, [x9, #-8]!", 11, T + 0x2000 - 8), 8)
            },
        ]
    }

    /// Every base × index register pairing (incl. sp, xzr and the saved x9..x13) with
    /// every extend, and every base with a few offsets: EA only (not run).
    fn sweep_cases() -> Vec<Exec> {
        // Arbitrary bit patterns, different in both halves and in sign.
        let val = |r: u8| (u64::from(r) + 1).wrapping_mul(0x0123_4567_89ab_cdef);
        let all: Vec<(u8, u64)> = (0..=30).map(|r| (r, val(r))).collect();
        let name = |r: u8, w: bool| match (r, w) {
            (31, false) => "sp".to_string(),
            (31, true) => "wzr".to_string(),
            (r, true) => format!("w{r}"),
            (r, false) => format!("x{r}"),
        };
        let bases = [0u8, 1, 8, 9, 10, 11, 12, 13, 14, 29, 30, 31];
        let mut out = Vec::new();
        let mut dst = 10u8;
        let mut next_dst = || {
            dst = if dst == 13 { 10 } else { dst + 1 };
            dst
        };
        for (k, &b) in bases.iter().enumerate() {
            let bv = if b == 31 { STACK } else { val(b) };
            for (j, &rm) in [2u8, 9, 10, 11, 12, 13, 31, b].iter().enumerate() {
                if rm == 31 && b == 31 {
                    continue;
                }
                let rv = if rm == 31 { 0 } else { val(rm) };
                // (syntax, 32-bit index, extended index, shift)
                let (ext, wide, x, sh) = match (k + j) % 4 {
                    0 => ("lsl #3", false, rv, 3),
                    1 => ("uxtw #3", true, rv & 0xffff_ffff, 3),
                    2 => ("sxtw", true, rv as i32 as i64 as u64, 0),
                    _ => ("sxtx #3", false, rv, 3),
                };
                let rmn = if rm == 31 {
                    if wide { "wzr".into() } else { "xzr".into() }
                } else {
                    name(rm, wide)
                };
                out.push(Exec {
                    insn: Insn::Asm(format!("ldr x0, [{}, {rmn}, {ext}]", name(b, false))),
                    regs: all.clone(),
                    sp: None,
                    pre: &[],
                    dst: next_dst(),
                    ea: bv.wrapping_add(x << sh),
                    run: None,
                });
            }
            for imm in [0i64, -256, 255, 32760] {
                let syntax = if (0..=32760).contains(&imm) && imm % 8 == 0 {
                    "ldr"
                } else {
                    "ldur"
                };
                out.push(Exec {
                    insn: Insn::Asm(format!("{syntax} x0, [{}, #{imm}]", name(b, false))),
                    regs: all.clone(),
                    sp: None,
                    pre: &[],
                    dst: next_dst(),
                    ea: bv.wrapping_add_signed(imm),
                    run: None,
                });
            }
            out.push(Exec {
                insn: Insn::Asm(format!("ldp x0, x1, [{}], #-512", name(b, false))),
                regs: all.clone(),
                sp: None,
                pre: &[],
                dst: next_dst(),
                ea: bv,
                run: None,
            });
        }
        out
    }

    /// A static ELF with one RWX PT_LOAD at `LOAD` holding `code` at `CODE`.
    fn elf(code: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        f.extend_from_slice(&183u16.to_le_bytes()); // EM_AARCH64
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&CODE.to_le_bytes());
        f.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
        f.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
        f.extend_from_slice(&0u32.to_le_bytes());
        for v in [64u16, 56, 1, 64, 0, 0] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        let filesz = (CODE - LOAD) + code.len() as u64;
        f.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        f.extend_from_slice(&7u32.to_le_bytes()); // RWX
        for v in [0, LOAD, LOAD, filesz, MEM_END - LOAD, 0x1000] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.resize((CODE - LOAD) as usize, 0);
        f.extend_from_slice(code);
        f
    }

    #[test]
    fn ea_code_runs_under_qemu() {
        use enc::*;
        if Command::new("qemu-aarch64")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("qemu-aarch64 not installed; skipped");
            return;
        }
        let mut cases = exec_cases();
        cases.extend(sweep_cases());
        // Every assembled snippet in one batch: they are position independent.
        let mut lines: Vec<&str> = vec![
            "str x14, [x14]",
            "add x14, x14, #8",
            "cmp x14, x15",
            "b.ne . - 12",
            "ret",
        ];
        for c in &cases {
            if let Insn::Asm(s) = &c.insn {
                lines.push(s);
            }
            lines.extend(c.pre);
            if let Some((_, _, post)) = c.run {
                lines.extend(post);
            }
        }
        let Some(words) = assemble(&lines) else {
            eprintln!("aarch64-linux-gnu-as not installed; skipped");
            return;
        };
        let word: std::collections::HashMap<&str, u32> =
            lines.iter().copied().zip(words.iter().copied()).collect();

        let mut a = Asm::new(CODE);
        let fill = a.label();
        for (i, c) in cases.iter().enumerate() {
            let sp_val = c.sp.unwrap_or(STACK);
            if c.run.is_some() {
                a.bl_l(fill);
            }
            a.put_all(&mov_imm64(16, sp_val));
            a.put(add_imm(SP, 16, 0, false));
            for &(r, v) in &c.regs {
                a.put_all(&mov_imm64(u32::from(r), v));
            }
            for p in c.pre {
                a.put(word[p]);
            }
            // The stub's frame, then x9..x13 trashed as the stub would.
            a.put(stp_pre(9, 10, SP, -(FRAME as i32)));
            a.put(stp(11, 12, SP, 16));
            a.put(str_x(13, SP, 32));
            for r in 9..=13 {
                a.put_all(&mov_imm64(r, garbage(r)));
            }
            // Pass 1 at the same address sizes the EA code, which places the
            // instruction (a literal's word depends on its pc).
            let ea_at = a.pc();
            let provisional = match &c.insn {
                Insn::Asm(s) => word[s.as_str()],
                &Insn::Lit(opc, rt, _) => opc | rt,
            };
            let m0 = classify(provisional, ea_at).expect("a memory access");
            let mut probe = Asm::new(ea_at);
            emit_ea(&mut probe, &m0, c.dst, FRAME).unwrap();
            let ea_words = (probe.pc() - ea_at) / 4;
            let insn_pc = ea_at + 4 * (ea_words + 7);
            let w = match &c.insn {
                Insn::Asm(s) => word[s.as_str()],
                &Insn::Lit(opc, rt, target) => {
                    let d = (target.wrapping_sub(insn_pc) as i64) >> 2;
                    opc | ((d as u32) & 0x7ffff) << 5 | rt
                }
            };
            let m = classify(w, insn_pc).expect("a memory access");
            emit_ea(&mut a, &m, c.dst, FRAME).unwrap();
            assert_eq!(a.pc(), ea_at + 4 * ea_words, "EA code length depends on pc");
            // Results: EA at [sp, #48], x13 at [sp, #40], x9..x12 below the frame.
            a.put(str_x(u32::from(c.dst), SP, 48));
            a.put(str_x(13, SP, 40));
            a.put(stp(9, 10, SP, -32));
            a.put(stp(11, 12, SP, -16));
            a.put(ldp(11, 12, SP, 16));
            a.put(ldr_x(13, SP, 32));
            a.put(ldp_post(9, 10, SP, FRAME as i32));
            assert_eq!(a.pc(), insn_pc);
            let rt = match c.run {
                Some((rt, _, post)) => {
                    a.put(w);
                    for p in post {
                        a.put(word[p]);
                    }
                    u32::from(rt)
                }
                None => XZR,
            };
            // out[i] = { ea, loaded, x9..x13 after the EA code }.
            let frame = sp_val - u64::from(FRAME);
            a.put_all(&mov_imm64(15, OUT + 64 * i as u64));
            a.put(str_x(rt, 15, 8));
            a.put_all(&mov_imm64(14, frame));
            a.put(ldr_x(16, 14, 48));
            a.put(str_x(16, 15, 0));
            a.put(ldp(16, 17, 14, -32));
            a.put(stp(16, 17, 15, 16));
            a.put(ldp(16, 17, 14, -16));
            a.put(stp(16, 17, 15, 32));
            a.put(ldr_x(16, 14, 40));
            a.put(str_x(16, 15, 48));
        }
        // write(1, OUT, 64 * n); exit(0)
        a.put_all(&mov_imm64(0, 1));
        a.put_all(&mov_imm64(1, OUT));
        a.put_all(&mov_imm64(2, 64 * cases.len() as u64));
        a.put(movz(8, 64, 0));
        a.put(SVC0);
        a.put(movz(0, 0, 0));
        a.put(movz(8, 93, 0));
        a.put(SVC0);
        a.bind(fill);
        a.put_all(&mov_imm64(14, T));
        a.put_all(&mov_imm64(15, T + T_SIZE));
        a.put_all(&words[..5]);
        let code = a.finish().unwrap();
        assert!(CODE + (code.len() as u64) < T, "code overlaps the table");

        let dir = scratch("qemu");
        let prog = dir.join("ea");
        std::fs::write(&prog, elf(&code)).unwrap();
        // qemu-user refuses (silently, status 1) a file without the execute bit.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = Command::new("qemu-aarch64")
            .args(["-L", "/usr/aarch64-linux-gnu"])
            .arg(&prog)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "harness failed: {out:?}");
        let vals: Vec<u64> = out
            .stdout
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals.len(), 8 * cases.len());

        // The table's byte at `a`.
        let byte = |a: u64| (a & !7).to_le_bytes()[(a & 7) as usize];
        for (i, (c, r)) in cases.iter().zip(vals.chunks_exact(8)).enumerate() {
            let name = match &c.insn {
                Insn::Asm(s) => s.clone(),
                &Insn::Lit(opc, _, t) => format!("literal {opc:#x} → {t:#x}"),
            };
            assert_eq!(
                r[0], c.ea,
                "case {i} `{name}`: EA {:#x}, want {:#x}",
                r[0], c.ea
            );
            for (k, &v) in r[2..7].iter().enumerate() {
                let reg = 9 + k as u32;
                if reg != u32::from(c.dst) {
                    assert_eq!(v, garbage(reg), "case {i} `{name}` clobbered x{reg}");
                }
            }
            if let Some((_, n, _)) = c.run {
                assert!(
                    (T..T + T_SIZE - 8).contains(&c.ea),
                    "case {i}: run outside the table"
                );
                let want =
                    (0..u64::from(n)).fold(0u64, |v, k| v | u64::from(byte(c.ea + k)) << (8 * k));
                let mask = if n == 8 {
                    u64::MAX
                } else {
                    (1u64 << (8 * n)) - 1
                };
                assert_eq!(
                    r[1] & mask,
                    want,
                    "case {i} `{name}`: the instruction loaded {:#x}, the table holds {want:#x} at the EA",
                    r[1]
                );
            }
        }
    }
}
