//! Hand encoders for the few A64 instruction forms the backend emits, and a tiny
//! assembler with forward labels. Registers are plain numbers (0..=30; 31 is `xzr` or
//! `sp` depending on the form, as in the architecture). Every encoder is checked
//! against `aarch64-linux-gnu-objdump` in the tests below.

pub(super) const SP: u32 = 31;
pub(super) const XZR: u32 = 31;
pub(super) const LR: u32 = 30;

pub(super) const NOP: u32 = 0xd503_201f;
pub(super) const RET: u32 = 0xd65f_03c0;
pub(super) const RETAA: u32 = 0xd65f_0bff;
pub(super) const RETAB: u32 = 0xd65f_0fff;
pub(super) const SVC0: u32 = 0xd400_0001;
pub(super) const CLREX: u32 = 0xd503_3f5f;
/// Landing pads that must stay first in a function: `bti c`, `bti j`, `bti jc`,
/// `paciasp`, `pacibsp`.
pub(super) const LANDING_PADS: [u32; 5] = [
    0xd503_245f,
    0xd503_249f,
    0xd503_24df,
    0xd503_233f,
    0xd503_237f,
];

/// `paciasp`, `pacibsp`: after them x30 carries a pointer authentication code.
pub(super) const PAC_PADS: [u32; 2] = [LANDING_PADS[3], LANDING_PADS[4]];
/// `xpaclri`: strip the authentication code from x30. A hint: a NOP without PAuth
/// (cortex-a72), so it needs no feature check.
pub(super) const XPACLRI: u32 = 0xd503_20ff;

/// System registers as bits 5..=19 of MRS/MSR (`op0<0>:op1:CRn:CRm:op2`; op0<1> is in
/// the base opcode).
pub(super) const TPIDR_EL0: u32 = 0x5e82;
pub(super) const CNTVCT_EL0: u32 = 0x5f02;
pub(super) const NZCV: u32 = 0x5a10;

/// Signed PC-relative word offset from `from` to `to` if it fits `bits` bits.
fn rel(from: u64, to: u64, bits: u32) -> Option<u32> {
    let d = to.wrapping_sub(from) as i64;
    if d & 3 != 0 {
        return None;
    }
    let w = d >> 2;
    let lim = 1i64 << (bits - 1);
    (-lim..lim)
        .contains(&w)
        .then_some((w as u32) & ((1u32 << bits) - 1))
}

pub(super) fn b(from: u64, to: u64) -> Option<u32> {
    Some(0x1400_0000 | rel(from, to, 26)?)
}
pub(super) fn bl(from: u64, to: u64) -> Option<u32> {
    Some(0x9400_0000 | rel(from, to, 26)?)
}
pub(super) fn b_cond(cond: u32, from: u64, to: u64) -> Option<u32> {
    Some(0x5400_0000 | rel(from, to, 19)? << 5 | (cond & 15))
}
/// `cbz`/`cbnz` (`nz`), 64-bit when `sf`.
pub(super) fn cbz(sf: bool, nz: bool, rt: u32, from: u64, to: u64) -> Option<u32> {
    Some(0x3400_0000 | u32::from(sf) << 31 | u32::from(nz) << 24 | rel(from, to, 19)? << 5 | rt)
}
/// `tbz`/`tbnz` (`nz`) on bit `bit` (0..=63) of `rt`.
pub(super) fn tbz(nz: bool, rt: u32, bit: u32, from: u64, to: u64) -> Option<u32> {
    Some(
        0x3600_0000
            | (bit >> 5) << 31
            | u32::from(nz) << 24
            | (bit & 31) << 19
            | rel(from, to, 14)? << 5
            | rt,
    )
}
/// `adrp rd, target` placed at `from` (±4 GiB).
pub(super) fn adrp(rd: u32, from: u64, target: u64) -> Option<u32> {
    let pages = ((target >> 12) as i64).wrapping_sub((from >> 12) as i64);
    if !(-(1i64 << 20)..(1i64 << 20)).contains(&pages) {
        return None;
    }
    let p = pages as u32;
    Some(0x9000_0000 | (p & 3) << 29 | ((p >> 2) & 0x7ffff) << 5 | rd)
}
pub(super) fn add_imm(rd: u32, rn: u32, imm12: u32, lsl12: bool) -> u32 {
    0x9100_0000 | u32::from(lsl12) << 22 | (imm12 & 0xfff) << 10 | rn << 5 | rd
}
pub(super) fn sub_imm(rd: u32, rn: u32, imm12: u32, lsl12: bool) -> u32 {
    0xd100_0000 | u32::from(lsl12) << 22 | (imm12 & 0xfff) << 10 | rn << 5 | rd
}
pub(super) fn add_w_imm(rd: u32, rn: u32, imm12: u32) -> u32 {
    0x1100_0000 | (imm12 & 0xfff) << 10 | rn << 5 | rd
}
/// `cmp xn, #imm` (sets flags; only in code that saved NZCV).
pub(super) fn cmp_imm(rn: u32, imm12: u32) -> u32 {
    0xf100_0000 | (imm12 & 0xfff) << 10 | rn << 5 | XZR
}
/// `cmn xn, #imm`.
pub(super) fn cmn_imm(rn: u32, imm12: u32) -> u32 {
    0xb100_0000 | (imm12 & 0xfff) << 10 | rn << 5 | XZR
}
pub(super) fn add_reg(rd: u32, rn: u32, rm: u32) -> u32 {
    0x8b00_0000 | rm << 16 | rn << 5 | rd
}
pub(super) fn sub_reg(rd: u32, rn: u32, rm: u32) -> u32 {
    0xcb00_0000 | rm << 16 | rn << 5 | rd
}
pub(super) fn sub_w_reg(rd: u32, rn: u32, rm: u32) -> u32 {
    0x4b00_0000 | rm << 16 | rn << 5 | rd
}
pub(super) fn mul(rd: u32, rn: u32, rm: u32) -> u32 {
    0x9b00_7c00 | rm << 16 | rn << 5 | rd
}
/// `mov xd, xm` (ORR with xzr; not for sp).
pub(super) fn mov_reg(rd: u32, rm: u32) -> u32 {
    0xaa00_03e0 | rm << 16 | rd
}
pub(super) fn movz(rd: u32, imm16: u32, hw: u32) -> u32 {
    0xd280_0000 | hw << 21 | (imm16 & 0xffff) << 5 | rd
}
pub(super) fn movk(rd: u32, imm16: u32, hw: u32) -> u32 {
    0xf280_0000 | hw << 21 | (imm16 & 0xffff) << 5 | rd
}
/// `movz` + `movk`s for any 64-bit constant (1 to 4 instructions).
pub(super) fn mov_imm64(rd: u32, v: u64) -> Vec<u32> {
    let mut out = vec![movz(rd, (v & 0xffff) as u32, 0)];
    for hw in 1..4 {
        let part = ((v >> (16 * hw)) & 0xffff) as u32;
        if part != 0 {
            out.push(movk(rd, part, hw));
        }
    }
    out
}
/// `ldr xt, [xn, #off]` (unsigned offset, multiple of 8).
pub(super) fn ldr_x(rt: u32, rn: u32, off: u32) -> u32 {
    0xf940_0000 | (off / 8) << 10 | rn << 5 | rt
}
pub(super) fn str_x(rt: u32, rn: u32, off: u32) -> u32 {
    0xf900_0000 | (off / 8) << 10 | rn << 5 | rt
}
pub(super) fn ldr_w(rt: u32, rn: u32, off: u32) -> u32 {
    0xb940_0000 | (off / 4) << 10 | rn << 5 | rt
}
/// `strh wT, [xN, #off]` (unsigned offset, a multiple of 2).
pub(super) fn strh(rt: u32, rn: u32, off: u32) -> u32 {
    0x7900_0000 | (off / 2) << 10 | rn << 5 | rt
}
pub(super) fn str_w(rt: u32, rn: u32, off: u32) -> u32 {
    0xb900_0000 | (off / 4) << 10 | rn << 5 | rt
}
pub(super) fn ldrsw(rt: u32, rn: u32, off: u32) -> u32 {
    0xb980_0000 | (off / 4) << 10 | rn << 5 | rt
}
/// `and wd, wn, #mask`, the mask `width` ones from bit `lsb` (1 <= width < 32).
pub(super) fn and_w_ones(rd: u32, rn: u32, lsb: u32, width: u32) -> u32 {
    0x1200_0000 | ((32 - lsb) % 32) << 16 | (width - 1) << 10 | rn << 5 | rd
}
/// `ldr wt, [xn, xm, lsl #2]`.
pub(super) fn ldr_w_idx(rt: u32, rn: u32, rm: u32) -> u32 {
    0xb860_7800 | rm << 16 | rn << 5 | rt
}
/// `str wt, [xn, xm, lsl #2]`.
pub(super) fn str_w_idx(rt: u32, rn: u32, rm: u32) -> u32 {
    0xb820_7800 | rm << 16 | rn << 5 | rt
}
fn imm7(off: i32) -> u32 {
    ((off / 8) as u32 & 0x7f) << 15
}
/// `stp xt, xt2, [xn, #off]!`.
pub(super) fn stp_pre(rt: u32, rt2: u32, rn: u32, off: i32) -> u32 {
    0xa980_0000 | imm7(off) | rt2 << 10 | rn << 5 | rt
}
/// `ldp xt, xt2, [xn], #off`.
pub(super) fn ldp_post(rt: u32, rt2: u32, rn: u32, off: i32) -> u32 {
    0xa8c0_0000 | imm7(off) | rt2 << 10 | rn << 5 | rt
}
pub(super) fn stp(rt: u32, rt2: u32, rn: u32, off: i32) -> u32 {
    0xa900_0000 | imm7(off) | rt2 << 10 | rn << 5 | rt
}
pub(super) fn ldp(rt: u32, rt2: u32, rn: u32, off: i32) -> u32 {
    0xa940_0000 | imm7(off) | rt2 << 10 | rn << 5 | rt
}
pub(super) fn ldxr(rt: u32, rn: u32) -> u32 {
    0xc85f_7c00 | rn << 5 | rt
}
/// `stxr ws, xt, [xn]`.
pub(super) fn stxr(ws: u32, rt: u32, rn: u32) -> u32 {
    0xc800_7c00 | ws << 16 | rn << 5 | rt
}
pub(super) fn mrs(rt: u32, sysreg: u32) -> u32 {
    0xd530_0000 | sysreg << 5 | rt
}
pub(super) fn msr(sysreg: u32, rt: u32) -> u32 {
    0xd510_0000 | sysreg << 5 | rt
}
/// `ubfx xd, xn, #lsb, #width`.
pub(super) fn ubfx(rd: u32, rn: u32, lsb: u32, width: u32) -> u32 {
    0xd340_0000 | lsb << 16 | (lsb + width - 1) << 10 | rn << 5 | rd
}
/// `sbfx xd, xn, #lsb, #width` (sign-extending bitfield extract).
pub(super) fn sbfx(rd: u32, rn: u32, lsb: u32, width: u32) -> u32 {
    0x9340_0000 | lsb << 16 | (lsb + width - 1) << 10 | rn << 5 | rd
}
/// `ldxrh wt, [xn]`.
pub(super) fn ldxrh(rt: u32, rn: u32) -> u32 {
    0x485f_7c00 | rn << 5 | rt
}
/// `stxrh ws, wt, [xn]`.
pub(super) fn stxrh(ws: u32, rt: u32, rn: u32) -> u32 {
    0x4800_7c00 | ws << 16 | rn << 5 | rt
}
/// `ldrb wt, [xn]`.
pub(super) fn ldrb(rt: u32, rn: u32) -> u32 {
    0x3940_0000 | rn << 5 | rt
}
/// `ldrh wt, [xn]`.
pub(super) fn ldrh(rt: u32, rn: u32) -> u32 {
    0x7940_0000 | rn << 5 | rt
}
/// `lsr xd, xn, #sh`.
pub(super) fn lsr(rd: u32, rn: u32, sh: u32) -> u32 {
    0xd340_0000 | sh << 16 | 63 << 10 | rn << 5 | rd
}

/// Branch forms whose target a label can fill in.
#[derive(Clone, Copy)]
enum Fix {
    /// B / BL: imm26 at bit 0.
    Imm26,
    /// B.cond / CBZ / CBNZ: imm19 at bit 5.
    Imm19,
    /// TBZ / TBNZ: imm14 at bit 5.
    Imm14,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Label(usize);

/// Sequential code at a known address, with forward/backward labels.
pub(super) struct Asm {
    pub base: u64,
    words: Vec<u32>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label, Fix)>,
}

impl Asm {
    pub(super) fn new(base: u64) -> Self {
        Asm {
            base,
            words: Vec::new(),
            labels: Vec::new(),
            fixups: Vec::new(),
        }
    }
    pub(super) fn pc(&self) -> u64 {
        self.base + 4 * self.words.len() as u64
    }
    pub(super) fn put(&mut self, w: u32) {
        self.words.push(w);
    }
    pub(super) fn put_all(&mut self, ws: &[u32]) {
        self.words.extend_from_slice(ws);
    }
    pub(super) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    pub(super) fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.words.len());
    }
    pub(super) fn addr_of(&self, l: Label) -> Option<u64> {
        self.labels[l.0].map(|i| self.base + 4 * i as u64)
    }
    /// `b`/`bl` to an absolute address.
    pub(super) fn b_to(&mut self, link: bool, to: u64) -> Result<(), String> {
        let from = self.pc();
        let w = if link { bl(from, to) } else { b(from, to) };
        self.put(w.ok_or_else(|| format!("branch {from:#x} → {to:#x} out of ±128 MiB"))?);
        Ok(())
    }
    /// `adrp rd, addr ; add rd, rd, :lo12:addr`.
    pub(super) fn addr(&mut self, rd: u32, addr: u64) -> Result<(), String> {
        let from = self.pc();
        let w = adrp(rd, from, addr)
            .ok_or_else(|| format!("adrp {from:#x} → {addr:#x} out of ±4 GiB"))?;
        self.put(w);
        self.put(add_imm(rd, rd, (addr & 0xfff) as u32, false));
        Ok(())
    }
    fn fix(&mut self, w: u32, l: Label, f: Fix) {
        self.fixups.push((self.words.len(), l, f));
        self.put(w);
    }
    pub(super) fn b_l(&mut self, l: Label) {
        self.fix(0x1400_0000, l, Fix::Imm26);
    }
    pub(super) fn bl_l(&mut self, l: Label) {
        self.fix(0x9400_0000, l, Fix::Imm26);
    }
    // The label forms encode with offset 0 and let `finish` fill the offset in.
    pub(super) fn bcond_l(&mut self, cond: u32, l: Label) {
        let w = b_cond(cond, 0, 0).unwrap_or_default();
        self.fix(w, l, Fix::Imm19);
    }
    pub(super) fn cbz_l(&mut self, sf: bool, nz: bool, rt: u32, l: Label) {
        let w = cbz(sf, nz, rt, 0, 0).unwrap_or_default();
        self.fix(w, l, Fix::Imm19);
    }
    pub(super) fn tbz_l(&mut self, nz: bool, rt: u32, bit: u32, l: Label) {
        let w = tbz(nz, rt, bit, 0, 0).unwrap_or_default();
        self.fix(w, l, Fix::Imm14);
    }
    /// Resolve the labels; the little-endian bytes.
    pub(super) fn finish(mut self) -> Result<Vec<u8>, String> {
        for &(i, l, f) in &self.fixups {
            let to = self.labels[l.0].ok_or("unbound label")?;
            let (from, to) = (self.base + 4 * i as u64, self.base + 4 * to as u64);
            let (bits, shift) = match f {
                Fix::Imm26 => (26, 0),
                Fix::Imm19 => (19, 5),
                Fix::Imm14 => (14, 5),
            };
            let r = rel(from, to, bits).ok_or("label out of branch range")?;
            self.words[i] |= r << shift;
        }
        Ok(self.words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }
}

/// Condition codes.
pub(super) const NE: u32 = 1;
pub(super) const HI: u32 = 8;
pub(super) const LS: u32 = 9;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Disassemble raw little-endian words at `base` with aarch64-linux-gnu-objdump:
    /// one "mnemonic operands" string per word (comments dropped). `None` when objdump
    /// is missing and the run allows that (`tests::skip`).
    pub(crate) fn objdump(words: &[u32], base: u64) -> Option<Vec<String>> {
        use std::process::Command;
        // A missing objdump fails the test unless the run allows the skip.
        let tool = "aarch64-linux-gnu-objdump";
        if !::tests::skip::require(tool, ::tests::skip::runs(tool), "AArch64 unit tests") {
            return None;
        }
        // Tests run in parallel: one directory per call.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("utrace-enc-{}-{seq}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let f = dir.join("code.bin");
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(&f, bytes).ok()?;
        let out = Command::new("aarch64-linux-gnu-objdump")
            .args(["-D", "-b", "binary", "-m", "aarch64"])
            .arg(format!("--adjust-vma={base:#x}"))
            .arg(&f)
            .output()
            .ok()?;
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&out.stdout);
        let lines = text
            .lines()
            .filter_map(|l| {
                // "   1000:\td503201f \tnop"
                let mut parts = l.splitn(3, '\t');
                let addr = parts.next()?.trim();
                if !addr.ends_with(':') {
                    return None;
                }
                parts.next()?;
                let ins = parts.next()?;
                let ins = ins.split("//").next().unwrap_or(ins);
                Some(ins.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .collect();
        Some(lines)
    }

    #[test]
    fn encoders_match_objdump() {
        let base = 0x40_0000u64;
        let cases: Vec<(u32, &str)> = vec![
            (b(base, base + 0x100).unwrap(), "b 0x400100"),
            (bl(base + 4, base).unwrap(), "bl 0x400000"),
            (b_cond(NE, base + 8, base + 0x40).unwrap(), "b.ne 0x400040"),
            (
                cbz(true, true, 3, base + 12, base).unwrap(),
                "cbnz x3, 0x400000",
            ),
            (
                cbz(false, false, 4, base + 16, base + 0x20).unwrap(),
                "cbz w4, 0x400020",
            ),
            (
                tbz(true, 10, 63, base + 20, base + 0x40).unwrap(),
                "tbnz x10, #63, 0x400040",
            ),
            (
                tbz(false, 1, 3, base + 24, base + 0x40).unwrap(),
                "tbz w1, #3, 0x400040",
            ),
            (
                adrp(9, base + 28, 0x1234_5678).unwrap(),
                "adrp x9, 0x12345000",
            ),
            (add_imm(9, 9, 0x678, false), "add x9, x9, #0x678"),
            (add_imm(9, 6, 0x42, true), "add x9, x6, #0x42, lsl #12"),
            (sub_imm(SP, SP, 16, false), "sub sp, sp, #0x10"),
            (add_w_imm(1, 1, 1), "add w1, w1, #0x1"),
            (cmp_imm(0, 1), "cmp x0, #0x1"),
            (cmn_imm(0, 3), "cmn x0, #0x3"),
            (add_reg(9, 9, 11), "add x9, x9, x11"),
            (sub_reg(12, 12, 10), "sub x12, x12, x10"),
            (sub_w_reg(2, 2, 0), "sub w2, w2, w0"),
            (mul(0, 0, 1), "mul x0, x0, x1"),
            (mov_reg(7, 10), "mov x7, x10"),
            (movz(10, 0x1234, 0), "mov x10, #0x1234"),
            (movk(10, 0x5, 1), "movk x10, #0x5, lsl #16"),
            (ldr_x(12, 9, 56), "ldr x12, [x9, #56]"),
            (str_x(12, 9, 56), "str x12, [x9, #56]"),
            (ldr_w(1, 9, 52), "ldr w1, [x9, #52]"),
            (str_w(0, 9, 48), "str w0, [x9, #48]"),
            (ldrsw(3, 3, 0), "ldrsw x3, [x3]"),
            (ldr_w_idx(11, 9, 11), "ldr w11, [x9, x11, lsl #2]"),
            (str_w_idx(1, 2, 0), "str w1, [x2, x0, lsl #2]"),
            (stp_pre(9, 10, SP, -48), "stp x9, x10, [sp, #-48]!"),
            (ldp_post(9, 10, SP, 48), "ldp x9, x10, [sp], #48"),
            (stp(11, 12, SP, 16), "stp x11, x12, [sp, #16]"),
            (ldp(11, 12, SP, 16), "ldp x11, x12, [sp, #16]"),
            (ldxr(11, 13), "ldxr x11, [x13]"),
            (stxr(10, 12, 13), "stxr w10, x12, [x13]"),
            (mrs(10, TPIDR_EL0), "mrs x10, tpidr_el0"),
            (mrs(13, CNTVCT_EL0), "mrs x13, cntvct_el0"),
            (mrs(14, NZCV), "mrs x14, nzcv"),
            (msr(NZCV, 14), "msr nzcv, x14"),
            (msr(TPIDR_EL0, 9), "msr tpidr_el0, x9"),
            (ubfx(11, 10, 16, 16), "ubfx x11, x10, #16, #16"),
            (and_w_ones(11, 11, 6, 10), "and w11, w11, #0xffc0"),
            (ldr_w(11, 10, 16), "ldr w11, [x10, #16]"),
            (str_w(1, 7, 16), "str w1, [x7, #16]"),
            (lsr(0, 0, 6), "lsr x0, x0, #6"),
            (NOP, "nop"),
            (RET, "ret"),
            (SVC0, "svc #0x0"),
            (CLREX, "clrex"),
            (XPACLRI, "xpaclri"),
            (LANDING_PADS[0], "bti c"),
            (LANDING_PADS[2], "bti jc"),
            (LANDING_PADS[3], "paciasp"),
            (LANDING_PADS[4], "pacibsp"),
        ];
        let words: Vec<u32> = cases.iter().map(|c| c.0).collect();
        let Some(got) = objdump(&words, base) else {
            eprintln!("aarch64-linux-gnu-objdump not installed; skipped");
            return;
        };
        assert_eq!(got.len(), cases.len(), "{got:?}");
        for ((w, want), got) in cases.iter().zip(&got) {
            assert_eq!(got, want, "encoding {w:#010x}");
        }
    }

    #[test]
    fn out_of_range_is_refused() {
        assert!(b(0, 128 << 20).is_none());
        assert!(b(0, (128 << 20) - 4).is_some());
        assert!(b(0, 2).is_none());
        assert!(tbz(false, 0, 0, 0, 1 << 15).is_none());
        assert!(adrp(0, 0, 1 << 33).is_none());
    }

    #[test]
    fn labels_resolve() {
        let mut a = Asm::new(0x1000);
        let l = a.label();
        a.cbz_l(true, false, 0, l);
        a.put(NOP);
        a.bind(l);
        a.b_l(l);
        let bytes = a.finish().unwrap();
        let w = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(w(0), cbz(true, false, 0, 0x1000, 0x1008).unwrap());
        assert_eq!(w(2), b(0x1008, 0x1008).unwrap());
    }
}

// Encoders for the effective-address code of memory-access sites (`mem.rs`).

/// `add xd, xn|sp, {w|x}m, <extend> #imm3` (ADD, extended register): `option` is the
/// load/store register-offset `option` field (010 uxtw, 011 lsl/uxtx, 110 sxtw,
/// 111 sxtx), `imm3` a left shift of 0..=4; rm 31 is xzr.
pub(super) fn add_ext(rd: u32, rn: u32, rm: u32, option: u32, imm3: u32) -> u32 {
    0x8b20_0000 | rm << 16 | (option & 7) << 13 | (imm3 & 7) << 10 | rn << 5 | rd
}
/// `xpacd xd`: strip the pointer authentication code of a data pointer (PAuth; only
/// emitted in front of LDRAA/LDRAB, which need PAuth themselves).
pub(super) fn xpacd(rd: u32) -> u32 {
    0xdac1_47e0 | rd
}
/// `str xt, [xn, #off]!` (pre-index, -256..=255).
pub(super) fn str_x_pre(rt: u32, rn: u32, off: i32) -> u32 {
    0xf800_0c00 | (off as u32 & 0x1ff) << 12 | rn << 5 | rt
}
/// `ldr xt, [xn], #off` (post-index, -256..=255).
pub(super) fn ldr_x_post(rt: u32, rn: u32, off: i32) -> u32 {
    0xf840_0400 | (off as u32 & 0x1ff) << 12 | rn << 5 | rt
}

#[cfg(test)]
mod mem_encoder_tests {
    use super::tests::objdump;
    use super::*;

    #[test]
    fn mem_encoders_match_objdump() {
        let cases: Vec<(u32, &str)> = vec![
            (add_ext(10, 1, 2, 0b011, 3), "add x10, x1, x2, uxtx #3"),
            (add_ext(10, SP, 2, 0b011, 0), "add x10, sp, x2"),
            (add_ext(11, 10, 3, 0b010, 2), "add x11, x10, w3, uxtw #2"),
            (add_ext(12, SP, 12, 0b110, 4), "add x12, sp, w12, sxtw #4"),
            (add_ext(13, 4, 5, 0b111, 1), "add x13, x4, x5, sxtx #1"),
            (add_ext(10, 1, XZR, 0b011, 0), "add x10, x1, xzr, uxtx"),
            (xpacd(10), "xpacd x10"),
            (str_x_pre(9, SP, -16), "str x9, [sp, #-16]!"),
            (ldr_x_post(9, SP, 16), "ldr x9, [sp], #16"),
        ];
        let words: Vec<u32> = cases.iter().map(|c| c.0).collect();
        let Some(got) = objdump(&words, 0) else {
            eprintln!("aarch64-linux-gnu-objdump not installed; skipped");
            return;
        };
        assert_eq!(got.len(), cases.len(), "{got:?}");
        for ((w, want), got) in cases.iter().zip(&got) {
            assert_eq!(got, want, "encoding {w:#010x}");
        }
    }
}
