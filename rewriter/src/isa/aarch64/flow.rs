//! AArch64 jump-table dispatch recognition (disarm64).
//!
//! gcc: `cmp wI, #N; b.hi default; adrp xT, T; add xT, xT, :lo12:T;
//! ldrb|ldrh|ldr wE, [xT, wI, uxtw #s]; adr xA, anchor; add xA, xA, wE, sxtb|sxth|sxtw #2;
//! br xA`. clang: the same with `ldrb wE, [xT, xI]` / `ldrsw xE, [xT, xI, lsl #2]` and
//! `add xA, xA|xT, xE, lsl #2|#0`; non-PIC: `ldr xE, [xT, xI, lsl #3]; br xE`.
//!
//! As on x86-64, each piece between function starts that holds an indirect branch is
//! interpreted forward in address order over [`Val`]; instructions not modelled kill
//! the registers their encoding class can write.

use std::collections::HashMap;

use disarm64::decoder::{self, InsnId};

use crate::flow::{Code, Dispatch, FlowArch, Functions, Scan, Slots, Val};

impl FlowArch for super::Aarch64 {
    fn fixed_width(&self) -> bool {
        true
    }

    fn relative_reloc(&self) -> u32 {
        object::elf::R_AARCH64_RELATIVE
    }

    fn entry_cfa(&self) -> (gimli::Register, i64, Option<gimli::Register>) {
        (gimli::AArch64::SP, 0, Some(gimli::AArch64::X30))
    }

    fn frame_pointer(&self) -> gimli::Register {
        gimli::AArch64::X29
    }

    fn scan(&self, code: &mut Code, funcs: &Functions, slots: &Slots, out: &mut Scan) {
        scan(code, funcs, slots, out)
    }
}

fn scan(code: &Code, funcs: &Functions, _slots: &Slots, out: &mut Scan) {
    for sec in code.secs.iter().filter(|s| !s.plt) {
        let end = sec.addr + sec.bytes.len() as u64;
        let lo = funcs.starts.partition_point(|&s| s <= sec.addr);
        // An empty section starting at a function: no piece (lo would pass hi).
        let hi = funcs.starts.partition_point(|&s| s < end).max(lo);
        let mut from = sec.addr;
        for &to in funcs.starts[lo..hi].iter().chain(std::iter::once(&end)) {
            if from < to {
                let bytes = &sec.bytes[(from - sec.addr) as usize..(to - sec.addr) as usize];
                if words(bytes, from).any(|(_, w)| is_indirect_branch(w)) {
                    analyse(bytes, from, out);
                }
            }
            from = to;
        }
    }
}

/// The aligned instruction words of `bytes` (code at `addr`) with their addresses.
fn words(bytes: &[u8], addr: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
    let skip = (addr.wrapping_neg() % 4) as usize;
    bytes
        .get(skip..)
        .unwrap_or_default()
        .chunks_exact(4)
        .enumerate()
        .map(move |(i, c)| {
            (
                addr + (skip + 4 * i) as u64,
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            )
        })
}

/// BR, BRAA, BRAB, BRAAZ, BRABZ (not RET, not BLR).
pub(super) fn is_indirect_branch(w: u32) -> bool {
    (w & 0xfe1f_0000) == 0xd61f_0000 && (w >> 21) & 0xf == 0
}

#[derive(Clone)]
struct State {
    /// x0..x30; index 31 (sp or zr) is never tracked.
    regs: [Val; 32],
    /// Registers with the same origin hold the same value (`mov` copies).
    origin: [u32; 32],
    next_origin: u32,
    /// `cmp xN, #imm` (or against a register holding a constant).
    flags: Option<(usize, u64)>,
}

impl Default for State {
    fn default() -> Self {
        State {
            regs: [Val::Unknown; 32],
            origin: [0; 32],
            next_origin: 0,
            flags: None,
        }
    }
}

impl State {
    fn get(&self, r: u32) -> Val {
        self.regs[r as usize & 31]
    }

    /// Write `v` to `r`; `sf`: 64-bit destination (a 32-bit write zero-extends).
    fn set(&mut self, r: u32, sf: bool, v: Val) {
        self.next_origin += 1;
        self.set_with_origin(r, sf, v, self.next_origin);
    }

    fn set_with_origin(&mut self, r: u32, sf: bool, v: Val, origin: u32) {
        let r = r as usize & 31;
        if r == 31 {
            return;
        }
        self.origin[r] = origin;
        self.regs[r] = match (sf, v) {
            (true, v) => v,
            (false, Val::Const(c)) => Val::Const(c & 0xffff_ffff),
            (false, v @ Val::Index { .. }) => v,
            (false, Val::Entry(e)) if e.size <= 4 => v,
            _ => Val::Unknown,
        };
        if self.flags.is_some_and(|f| f.0 == r) {
            self.flags = None;
        }
    }

    fn kill(&mut self, r: u32) {
        self.set(r, true, Val::Unknown);
    }

    /// Value `< bound` learnt for register `r` and every copy of it.
    fn bound_reg(&mut self, r: usize, bound: u64) {
        let o = self.origin[r];
        for j in 0..31 {
            if self.origin[j] == o
                && matches!(self.regs[j], Val::Unknown | Val::Index { scale: 1, .. })
            {
                self.regs[j] = Val::Index {
                    bound: Some(bound),
                    scale: 1,
                };
            }
        }
    }

    /// Keep only what both states agree on (a join point).
    fn meet(&mut self, o: &State) {
        for j in 0..32 {
            if self.regs[j] != o.regs[j] {
                self.regs[j] = Val::Unknown;
                self.next_origin += 1;
                self.origin[j] = self.next_origin;
            }
        }
        self.flags = None;
    }
}

/// Forward interpretation in address order, except that a block only reached by
/// forward branches (the word before it never falls through) starts from the states
/// at those branches: gcc places the dispatch after the default case.
fn analyse(bytes: &[u8], from: u64, out: &mut Scan) {
    let mut st = State::default();
    let mut pending: HashMap<u64, State> = HashMap::new();
    let mut falls_in = true;
    for (pc, w) in words(bytes, from) {
        if let Some(p) = pending.remove(&pc) {
            if falls_in {
                st.meet(&p);
            } else {
                st = p;
            }
        }
        if let Some((target, taken)) = forward_branch(&st, pc, w)
            && target > pc
        {
            match pending.get_mut(&target) {
                Some(p) => p.meet(&taken),
                None => {
                    pending.insert(target, taken);
                }
            }
        }
        step(&mut st, pc, w, out);
        falls_in = !(is_indirect_branch(w)
            || w & 0xfc00_0000 == 0x1400_0000
            || w & 0xffff_fc1f == 0xd65f_0000);
    }
}

/// A direct branch's target and the state on its taken edge (with the bound a
/// `b.ls`/`b.lo` after a compare implies).
fn forward_branch(st: &State, pc: u64, w: u32) -> Option<(u64, State)> {
    let off19 = || pc.wrapping_add_signed(sext((w >> 5) & 0x7ffff, 19) << 2);
    let mut taken = st.clone();
    let target = if w & 0xff00_0010 == 0x5400_0000 {
        if let Some((r, imm)) = st.flags {
            let bound = match w & 15 {
                9 => imm.checked_add(1),
                3 => Some(imm),
                _ => None,
            };
            if let Some(b) = bound {
                taken.bound_reg(r, b);
            }
        }
        off19()
    } else if w & 0x7e00_0000 == 0x3400_0000 {
        off19()
    } else if w & 0x7e00_0000 == 0x3600_0000 {
        pc.wrapping_add_signed(sext((w >> 5) & 0x3fff, 14) << 2)
    } else if w & 0xfc00_0000 == 0x1400_0000 {
        pc.wrapping_add_signed(sext(w & 0x3ff_ffff, 26) << 2)
    } else {
        return None;
    };
    Some((target, taken))
}

fn sext(v: u32, bits: u32) -> i64 {
    let s = 64 - bits;
    (i64::from(v) << s) >> s
}

fn step(st: &mut State, pc: u64, w: u32, out: &mut Scan) {
    let (rd, rn, rm) = (w & 31, (w >> 5) & 31, (w >> 16) & 31);
    let sf = w >> 31 == 1;
    if is_indirect_branch(w) {
        match Dispatch::from_val(pc, st.get(rn)) {
            Some(d) => out.dispatches.push(d),
            None => out.unresolved.push(pc),
        }
        return;
    }
    let Some(op) = decoder::decode(w) else {
        kill_by_class(st, w);
        return;
    };
    match op.id() {
        InsnId::ADRP_Rd_ADDR_ADRP => {
            let imm = ((w >> 5) & 0x7ffff) << 2 | (w >> 29) & 3;
            let t = (pc & !0xfff).wrapping_add_signed(sext(imm, 21) << 12);
            st.set(rd, true, Val::Const(t));
        }
        InsnId::ADR_Rd_ADDR_PCREL21 => {
            let imm = ((w >> 5) & 0x7ffff) << 2 | (w >> 29) & 3;
            st.set(rd, true, Val::Const(pc.wrapping_add_signed(sext(imm, 21))));
        }
        InsnId::ADD_Rd_SP_Rn_SP_AIMM => {
            let imm = u64::from((w >> 10) & 0xfff) << (12 * ((w >> 22) & 1));
            let v = match st.get(rn) {
                Val::Const(c) if rn != 31 => Val::Const(c.wrapping_add(imm)),
                _ => Val::Unknown,
            };
            st.set(rd, sf, v);
        }
        InsnId::ADD_Rd_SP_Rn_SP_Rm_EXT | InsnId::ADD_Rd_Rn_Rm_SFT => add_register(st, op.id(), w),
        InsnId::LDR_Rt_ADDR_REGOFF
        | InsnId::LDRB_Rt_ADDR_REGOFF
        | InsnId::LDRH_Rt_ADDR_REGOFF
        | InsnId::LDRSB_Rt_ADDR_REGOFF
        | InsnId::LDRSH_Rt_ADDR_REGOFF
        | InsnId::LDRSW_Rt_ADDR_REGOFF => load_register_offset(st, op.id(), w),
        InsnId::SUBS_Rd_Rn_SP_AIMM | InsnId::SUBS_Rd_Rn_Rm_SFT => compare(st, op.id(), w),
        InsnId::B_C_ADDR_PCREL19 => bound_by_branch(st, w),
        InsnId::ORR_Rd_Rn_Rm_SFT if rn == 31 && (w >> 10) & 63 == 0 => {
            // `mov xD, xM` / `mov wD, wM`.
            let (v, o) = (st.get(rm), st.origin[rm as usize]);
            st.set_with_origin(rd, sf, v, o);
        }
        InsnId::MOVZ_Rd_HALF => {
            let v = u64::from((w >> 5) & 0xffff) << (16 * ((w >> 21) & 3));
            st.set(rd, sf, Val::Const(v));
        }
        InsnId::UBFM_Rd_Rn_IMMR_IMMS | InsnId::SBFM_Rd_Rn_IMMR_IMMS => extend(st, op.id(), w),
        InsnId::BL_ADDR_PCREL26 | InsnId::BLR_Rn => call(st),
        _ => {
            if (w & 0xfeff_f800) == 0xd63f_0800 {
                // BLRAA/BLRAB/BLRAAZ/BLRABZ
                call(st);
            } else {
                kill_by_class(st, w);
            }
        }
    }
}

/// A conditional branch after an unsigned compare: HI/LS → value <= imm on one way,
/// HS/LO → value < imm. B.HI/B.HS: the bound holds on the fall-through (this state);
/// B.LS/B.LO: on the taken edge (`forward_branch`).
fn bound_by_branch(st: &mut State, w: u32) {
    let bound = match (w & 15, st.flags) {
        (8, Some((r, imm))) => imm.checked_add(1).map(|b| (r, b)),
        (2, Some((r, imm))) => Some((r, imm)),
        _ => None,
    };
    if let Some((r, b)) = bound {
        st.bound_reg(r, b);
    }
}

/// UBFM/SBFM: uxtb/uxth/uxtw, sxtb/sxth/sxtw (immr == 0, imms = width - 1) extend
/// the value; any other bitfield move is unknown.
fn extend(st: &mut State, id: InsnId, w: u32) {
    let (rd, rn) = (w & 31, (w >> 5) & 31);
    let sf = w >> 31 == 1;
    let (immr, imms) = ((w >> 16) & 63, (w >> 10) & 63);
    let v = match imms {
        7 | 15 | 31 if immr == 0 => st
            .get(rn)
            .extend((imms + 1) as u8, id == InsnId::SBFM_Rd_Rn_IMMR_IMMS),
        _ => Val::Unknown,
    };
    st.set(rd, sf, v);
}

/// `add` of two registers: a relative-table target (table base plus an entry).
fn add_register(st: &mut State, id: InsnId, w: u32) {
    let (rd, rn, rm) = (w & 31, (w >> 5) & 31, (w >> 16) & 31);
    let sf = w >> 31 == 1;
    match id {
        InsnId::ADD_Rd_SP_Rn_SP_Rm_EXT => {
            // `add xA, xA, wE, sxtb #2`: option picks the extension, imm3 the shift.
            let option = (w >> 13) & 7;
            let shift = ((w >> 10) & 7) as u8;
            let bits = [8, 16, 32, 64][(option & 3) as usize];
            let v = match (rn, st.get(rn), st.get(rm)) {
                (31, ..) => Val::Unknown,
                (_, Val::Const(base), e @ Val::Entry(_)) if sf => {
                    match e.extend(bits, option >= 4) {
                        Val::Entry(elem) => Val::Target { base, elem, shift },
                        _ => Val::Unknown,
                    }
                }
                _ => Val::Unknown,
            };
            st.set(rd, sf, v);
        }
        InsnId::ADD_Rd_Rn_Rm_SFT => {
            let (kind, amount) = ((w >> 22) & 3, ((w >> 10) & 63) as u8);
            let v = match (st.get(rn), st.get(rm)) {
                (Val::Const(base), Val::Entry(elem)) if sf && kind == 0 => Val::Target {
                    base,
                    elem,
                    shift: amount,
                },
                (Val::Entry(elem), Val::Const(base)) if sf && amount == 0 => Val::Target {
                    base,
                    elem,
                    shift: 0,
                },
                _ => Val::Unknown,
            };
            st.set(rd, sf, v);
        }
        _ => {}
    }
}

/// A load with a register offset: a table entry when the base is a table address.
fn load_register_offset(st: &mut State, id: InsnId, w: u32) {
    let (rd, rn, rm) = (w & 31, (w >> 5) & 31, (w >> 16) & 31);
    match id {
        InsnId::LDR_Rt_ADDR_REGOFF
        | InsnId::LDRB_Rt_ADDR_REGOFF
        | InsnId::LDRH_Rt_ADDR_REGOFF
        | InsnId::LDRSB_Rt_ADDR_REGOFF
        | InsnId::LDRSH_Rt_ADDR_REGOFF
        | InsnId::LDRSW_Rt_ADDR_REGOFF => {
            let size: u8 = 1 << (w >> 30);
            let signed = !matches!(
                id,
                InsnId::LDR_Rt_ADDR_REGOFF
                    | InsnId::LDRB_Rt_ADDR_REGOFF
                    | InsnId::LDRH_Rt_ADDR_REGOFF
            );
            let option = (w >> 13) & 7;
            let scale = if (w >> 12) & 1 == 1 {
                u64::from(size)
            } else {
                1
            };
            // The index is extended from 32 bits (uxtw/sxtw) or used whole (lsl/sxtx);
            // either keeps a compare bound on it.
            let v = if rn == 31 || !matches!(option, 2 | 3 | 6 | 7) {
                Val::Unknown
            } else {
                Val::load(Some(st.get(rn)), st.get(rm), scale, 0, size, signed)
            };
            // LDR Wt/LDRB/LDRH write a W register, LDRS* to X when opc == 10.
            let x = size == 8 || (signed && (w >> 22) & 3 == 2);
            st.set(rd, x, v);
        }
        _ => {}
    }
}

/// `subs`/`cmp`: the compare a following `b.cond` may take a bound from.
fn compare(st: &mut State, id: InsnId, w: u32) {
    let (rd, rn, rm) = (w & 31, (w >> 5) & 31, (w >> 16) & 31);
    match id {
        InsnId::SUBS_Rd_Rn_SP_AIMM => {
            let imm = u64::from((w >> 10) & 0xfff) << (12 * ((w >> 22) & 1));
            let flags = (rn != 31 && rd != rn).then_some((rn as usize, imm));
            st.kill(rd);
            st.flags = flags;
        }
        InsnId::SUBS_Rd_Rn_Rm_SFT => {
            let flags = match st.get(rm) {
                Val::Const(c) if rn != 31 && rd != rn && (w >> 10) & 63 == 0 => {
                    Some((rn as usize, c))
                }
                _ => None,
            };
            st.kill(rd);
            st.flags = flags;
        }
        _ => {}
    }
}

/// A call clobbers the AAPCS64 caller-saved registers and the flags.
fn call(st: &mut State) {
    for r in (0..=18).chain([30]) {
        st.kill(r);
    }
    st.flags = None;
}

/// The registers an unmodelled instruction may write, by encoding class (Arm ARM,
/// "Top-level encodings"); the flags are dropped whenever any might be set.
fn kill_by_class(st: &mut State, w: u32) {
    let rt = w & 31;
    let op0 = (w >> 25) & 0xf;
    match op0 {
        // Data processing (immediate): writes Rd.
        0b1000 | 0b1001 => {
            st.kill(rt);
            st.flags = None;
        }
        // Branches, exceptions, system: only MRS/SYSL write a register (Rt).
        0b1010 | 0b1011 => {
            if w & 0xffe0_0000 == 0xd520_0000 || w & 0xfff0_0000 == 0xd530_0000 {
                st.kill(rt);
            }
            if w & 0xffc0_0000 == 0xd500_0000 {
                // MSR NZCV and friends
                st.flags = None;
            }
        }
        // Loads and stores.
        o if o & 0b0101 == 0b0100 => kill_load_store(st, w),
        // Data processing (register) and SIMD/FP (FMOV/UMOV/FCVTZS to Rd, FCMP).
        _ => {
            st.kill(rt);
            st.flags = None;
        }
    }
}

/// A load or store: the registers it loads and the base it writes back.
fn kill_load_store(st: &mut State, w: u32) {
    let (rt, rn, rt2, rs) = (w & 31, (w >> 5) & 31, (w >> 10) & 31, (w >> 16) & 31);
    let simd = (w >> 26) & 1 == 1;
    let load = (w >> 22) & 3 != 0;
    match (w >> 27) & 7 {
        0b001 if simd => {
            // SIMD structure loads/stores: post-index writes Rn.
            if (w >> 23) & 1 == 1 {
                st.kill(rn);
            }
        }
        0b001 => {
            // Exclusives, acquire/release, compare-and-swap.
            st.kill(rt);
            st.kill(rs);
            st.kill(rt2);
        }
        0b011 => {
            if !simd {
                st.kill(rt);
            }
        }
        0b101 => {
            // Pairs: L is bit 22; pre/post-index write Rn.
            if !simd && (w >> 22) & 1 == 1 {
                st.kill(rt);
                st.kill(rt2);
            }
            if matches!((w >> 23) & 3, 1 | 3) {
                st.kill(rn);
            }
        }
        // Single register.
        _ => kill_single(st, w, simd, load),
    }
}

/// A single-register load or store (unsigned offset, unscaled, pre/post-index,
/// register offset, atomics, LDRAA/LDRAB).
fn kill_single(st: &mut State, w: u32, simd: bool, load: bool) {
    let (rt, rn) = (w & 31, (w >> 5) & 31);
    if (w >> 24) & 1 == 1 {
        if !simd && load {
            st.kill(rt);
        }
    } else if (w >> 21) & 1 == 0 {
        if !simd && load {
            st.kill(rt);
        }
        if matches!((w >> 10) & 3, 1 | 3) {
            st.kill(rn);
        }
    } else {
        match (w >> 10) & 3 {
            0b10 => {
                if !simd && load {
                    st.kill(rt);
                }
            }
            // Atomic memory operations write Rt whatever opc says.
            0b00 => st.kill(rt),
            _ => {
                // LDRAA/LDRAB; bit 11: writeback.
                st.kill(rt);
                if (w >> 11) & 1 == 1 {
                    st.kill(rn);
                }
            }
        }
    }
}
