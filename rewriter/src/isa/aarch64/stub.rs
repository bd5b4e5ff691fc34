//! The inline stub of function entries and exits (AArch64); exits record x0 (the
//! return value) where entries record the first argument.
//!
//! ```text
//!   stp   x9, x10, [sp, #-64]!      ; no red zone on Linux arm64: store below sp,
//!   stp   x11, x12, [sp, #16]       ; sp stays 16-byte aligned
//!   str   x13, [sp, #32]            ; [sp, #40] holds x30 around calls, [sp, #48]
//!   [memory sites: EA of each access → x10 → [sp, #48], more after the values: an
//!    access run's members' too, from the registers here (mem.rs, isa::runs)]
//! retry:
//!   mrs   x10, tpidr_el0 ; cbz x10, out          ; no thread pointer yet: skip
//!   ldr   w11, [x10, #16] ; and w11, w11, #MASK   ; thread word: byte offset of the slot
//!   adrp  x9, SLOTS ; add x9, x9, :lo12:SLOTS ; add x9, x9, x11   ; slot
//!   (the index, where there is no thread word: `isa::SlotLookup`:
//!   ubfx  x11, x10, #16, #16                      ; h
//!   adrp  x9, INDEX ; add x9, x9, :lo12:INDEX
//!   ldr   w11, [x9, x11, lsl #2]                  ; byte offset of the slot
//!   add   x9, x9, #(SLOTS-INDEX) ; add x9, x9, x11)       ; slot
//!   ldr   x12, [x9] ; sub x12, x12, x10 ; cbnz x12, miss  ; key == tp, flags untouched
//!   ldr   x12, [x9, #56] ; add x12, x12, #1 ; str x12, [x9, #56]   ; inflight += 1
//!   add   x13, x9, #8
//! 1: ldxr x11, [x13] ; add x12, x11, #32 ; stxr w10, x12, [x13] ; cbnz w10, 1b
//!                                                 ; reserve: a signal handler's stub on
//!                                                 ; this thread clears the monitor
//!   mov   x10, #site ; mrs x13, cntvct_el0
//!   stp   x10, x13, [x11]           ; site | flags 0, time (cntvct_el0; coarse
//!                                   ; timestamps: `ldr w13, [x9, #52]`, the epoch)
//!   stp   x0, x30, [x11, #16]       ; value, aux (after paciasp/pacibsp: x30 saved,
//!                                   ; `xpaclri`, stored, reloaded: aux is unsigned;
//!                                   ; a memory site: its address and its instruction's,
//!                                   ; a pair `FLAG_MEM_PAIR`: both addresses)
//!   ldr   x10, [x9, #56] ; sub x10, x10, #1 ; str x10, [x9, #56]   ; inflight -= 1
//!   ldr   x10, [x9, #16] ; sub x10, x12, x10 ; tbz x10, #63, full   ; cur >= end
//! out:
//!   ldp   x11, x12, [sp, #16] ; ldr x13, [sp, #32] ; ldp x9, x10, [sp], #64
//!   <displaced instruction, relocated> ; b back   (no `b back` after ret / b)
//! miss:                             ; slow paths after the window
//!   str x30, [sp, #40] ; bl register ; ldr x30, [sp, #40] ; cbnz x9, retry ; b out
//! full:
//!   str x30, [sp, #40] ; bl flush ; ldr x30, [sp, #40] ; b out
//! ```
//! No instruction on any path writes NZCV (comparisons are `sub` + `cbnz`/`tbz`);
//! `register` saves NZCV itself. Fast rings reserve with `ldxrh`/`stxrh` and add the
//! ring's start; a stub of several records also tests bit 16 of `old + 32(nrec - 1)`
//! (`add` + `tbnz`) and, set, takes a cold path that clears those records' flags and
//! reserves again, so none lands in the next thread's ring.
//!
//! 35 instructions on the fast path; 45 in all plus the relocated instruction and the
//! branch back: 188 bytes per site for a plain instruction, 192 with the 16-byte
//! alignment. The thread word is `ldr w11, [x10, #16]` because TLS variant I puts the
//! executable's block after the 16-byte TCB. After `paciasp`/`pacibsp` x30 is signed:
//! the stub stores an `xpaclri`-stripped copy (a hint, a NOP without PAuth).

use super::enc::*;
use super::{mem, reloc};
use crate::isa::arg::{Arg, ArgLoc, Reg as UsdtReg};
use crate::isa::{Layout, PlacedSite, Runtime, SlotLookup, slot_mask};
use tracer_common::meta::{SiteKind, TimeMode};
use tracer_common::{
    BUF_CIRCULAR, BUF_FAST_CIRCULAR, BUF_TRACE, FLAG_RING, FLAG_USDT_INDEX_SHIFT, FLAG_USDT_MORE,
    INDEX_OFF, RECORD_FLAGS_OFF, RECORD_SIZE, SLOT_CUR, SLOT_END, SLOT_GENERATION, SLOT_INFLIGHT,
    SLOT_START, SLOTS_OFF, pair_flags,
};

/// Stack bytes the stub uses below the caller's sp (16-byte multiple).
const FRAME: i32 = 64;
const LR_SAVE: u32 = 40;
/// The first memory site's effective address, computed before anything is clobbered
/// (an access run's others: after the values, `Shape::ea_slot`).
const EA_SAVE: u32 = 48;

/// The trampoline of a one-instruction window: the stubs of its sites (an entry, an
/// exit, or both when a function is a single `ret`; a memory site and the members of
/// its access run, whose words `members` has by address), the instruction relocated,
/// and a branch back unless the instruction leaves anyway.
pub(super) fn emit_window(
    layout: &Layout,
    rt: &Runtime,
    (displaced, pc): (u32, u64),
    sites: &[PlacedSite],
    members: &[(u64, u32)],
    at: u64,
) -> Result<Vec<u8>, String> {
    let mut a = Asm::new(at);
    let mut slow = Vec::new();
    if !sites.is_empty() {
        let all: Vec<&PlacedSite> = sites.iter().collect();
        let word_of = |at: u64| match at == pc {
            true => Some(displaced),
            false => members.iter().find(|m| m.0 == at).map(|m| m.1),
        };
        let shape = Shape::new(&all, word_of)?;
        slow.push(emit_stub(&mut a, layout, &shape, &all, displaced, pc)?);
    }
    reloc::relocate(&mut a, displaced, pc)?;
    if !reloc::leaves(displaced) {
        a.b_to(false, pc + 4)?;
    }
    for (retry, out, miss, full, straddle) in slow {
        if let Some(s) = straddle {
            emit_straddle(&mut a, s, retry);
        }
        a.bind(miss);
        a.put(str_x(LR, SP, LR_SAVE));
        a.b_to(true, rt.register)?;
        a.put(ldr_x(LR, SP, LR_SAVE));
        a.cbz_l(true, true, 9, retry);
        a.b_l(out);

        a.bind(full);
        if layout.buf_kind == BUF_CIRCULAR {
            // Wrap: the next record overwrites the oldest; a new buffer epoch.
            a.put(ldr_x(10, 9, SLOT_START as u32));
            a.put(str_x(10, 9, SLOT_CUR as u32));
            a.put(ldr_w(10, 9, SLOT_GENERATION as u32));
            a.put(add_imm(10, 10, 1, false));
            a.put(str_w(10, 9, SLOT_GENERATION as u32));
        } else {
            a.put(str_x(LR, SP, LR_SAVE));
            a.b_to(true, rt.flush)?;
            a.put(ldr_x(LR, SP, LR_SAVE));
        }
        a.b_l(out);
    }
    a.finish()
}

/// Put USDT argument `arg` into x10 (extended to 64 bits as its size and sign say):
/// x9..x13 are read from the stub's save slots, sp is `frame` bytes higher. Uses x11.
fn emit_usdt_arg(a: &mut Asm, arg: &Arg, frame: u32) -> Result<(), String> {
    let reg = |a: &mut Asm, dst: u32, r: &UsdtReg| -> Result<(), String> {
        match r {
            UsdtReg::A64(n @ 9..=13) => a.put(ldr_x(dst, SP, 8 * (u32::from(*n) - 9))),
            UsdtReg::A64(31) => a.put(add_imm(dst, SP, frame, false)),
            UsdtReg::A64(n) => a.put(mov_reg(dst, u32::from(*n))),
            UsdtReg::X86 { .. } => return Err("x86-64 register in an AArch64 probe".into()),
        }
        Ok(())
    };
    let extend = |a: &mut Asm| {
        let bits = u32::from(arg.size) * 8;
        if bits < 64 {
            a.put(if arg.signed {
                sbfx(10, 10, 0, bits)
            } else {
                ubfx(10, 10, 0, bits)
            });
        }
    };
    let load = |a: &mut Asm| {
        match arg.size {
            1 => a.put(ldrb(10, 10)),
            2 => a.put(ldrh(10, 10)),
            4 if arg.signed => a.put(ldrsw(10, 10, 0)),
            4 => a.put(ldr_w(10, 10, 0)),
            _ => a.put(ldr_x(10, 10, 0)),
        }
        if arg.size < 4 {
            extend(a);
        }
    };
    match &arg.loc {
        ArgLoc::Imm(v) => a.put_all(&mov_imm64(10, *v as u64)),
        ArgLoc::Reg(r) => {
            reg(a, 10, r)?;
            extend(a);
        }
        ArgLoc::Mem { base, index, disp } => {
            match base {
                Some(b) => reg(a, 10, b)?,
                None => a.put(movz(10, 0, 0)),
            }
            if let Some((r, scale)) = index {
                reg(a, 11, r)?;
                a.put(add_ext(10, 10, 11, 3, scale.trailing_zeros()));
            }
            match *disp {
                0 => {}
                d @ 1..4096 => a.put(add_imm(10, 10, d as u32, false)),
                d @ -4095..0 => a.put(sub_imm(10, 10, (-d) as u32, false)),
                d => {
                    a.put_all(&mov_imm64(11, d as u64));
                    a.put(add_reg(10, 10, 11));
                }
            }
            load(a);
        }
        ArgLoc::Static { addr } => {
            a.addr(10, *addr)?;
            load(a);
        }
    }
    Ok(())
}

/// What the sites of one stub need, decided before any code is emitted.
struct Shape<'s> {
    /// Values computed up front (a USDT probe's arguments, a chosen value), every
    /// site's in order at [sp, #FRAME + 8i]; site i's start at index `arg_base[i]`.
    args: Vec<&'s Arg>,
    arg_base: Vec<u32>,
    /// Each memory site's access (by site index), its address computed up front from
    /// the registers as they are at the stub (an access run's members: the head's,
    /// which their addresses do not depend on), and where that address is saved.
    mem: Vec<Option<mem::MemAccess>>,
    ea_slot: Vec<u32>,
    /// A memory site whose access goes into another's record (a pair): the index of
    /// the site that takes it in its `aux` (`isa::runs::pairs`).
    pair: Vec<Option<usize>>,
    /// The stub's stack frame.
    frame: i32,
    /// Records per site (a USDT probe: its arguments two per record) and in all.
    per: Vec<u32>,
    nrec: u32,
}

impl<'s> Shape<'s> {
    /// `word_of`: the word of each memory site's instruction.
    fn new(sites: &[&'s PlacedSite], word_of: impl Fn(u64) -> Option<u32>) -> Result<Self, String> {
        let args: Vec<&Arg> = sites.iter().flat_map(|s| &s.args).collect();
        let arg_base: Vec<u32> = sites
            .iter()
            .scan(0u32, |n, s| {
                let b = *n;
                *n += s.args.len() as u32;
                Some(b)
            })
            .collect();
        let mem = sites
            .iter()
            .map(|s| match s.kind {
                SiteKind::Memory => word_of(s.insn)
                    .and_then(|w| mem::classify(w, s.insn))
                    .map(Some)
                    .ok_or_else(|| format!("no memory access at {:#x}", s.insn)),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>, String>>()?;
        // The first address at EA_SAVE (a lone memory site's stub as before runs), the
        // others after the values.
        let mut extra = 0;
        let ea_slot = (mem.iter())
            .map(|m| match (m, extra) {
                (None, _) => 0,
                (Some(_), 0) => {
                    extra += 1;
                    EA_SAVE
                }
                (Some(_), _) => {
                    extra += 1;
                    FRAME as u32 + 8 * (args.len() as u32 + extra - 2)
                }
            })
            .collect();
        let slots = args.len() as u32 + extra.saturating_sub(1);
        let frame = FRAME + (8 * slots).div_ceil(16) as i32 * 16;
        let pair = crate::isa::runs::pairs(sites);
        let per: Vec<u32> = sites
            .iter()
            .enumerate()
            .map(|(i, s)| match s.kind {
                SiteKind::Usdt => (s.args.len() as u32).div_ceil(2).max(1),
                _ if pair.contains(&Some(i)) => 0,
                _ => 1,
            })
            .collect();
        Ok(Shape {
            args,
            arg_base,
            mem,
            ea_slot,
            pair,
            frame,
            nrec: per.iter().sum(),
            per,
        })
    }

    /// Where value `i` of `args` is saved.
    fn slot(&self, i: u32) -> u32 {
        FRAME as u32 + 8 * i
    }
}

/// The labels of a stub's slow paths, emitted after the window: (retry, out, miss,
/// full, a fast ring's crossing reservation).
type SlowLabels = (Label, Label, Label, Label, Option<Straddle>);

/// The fast path of the stub for every site placed before the instruction `word` at
/// `pc` (several stores, one reservation, one full-check); returns its slow paths'
/// labels.
fn emit_stub(
    a: &mut Asm,
    layout: &Layout,
    shape: &Shape,
    sites: &[&PlacedSite],
    word: u32,
    pc: u64,
) -> Result<SlowLabels, String> {
    let (retry, out, miss, full) = (a.label(), a.label(), a.label(), a.label());
    let frame = shape.frame;
    emit_prologue(a, shape)?;
    a.bind(retry);
    let straddle = emit_reserve(a, layout, shape.nrec, out, miss)?;
    emit_heads(a, layout, shape, sites);
    // value, aux: x0 is the first argument at an entry and the return value at an
    // exit; a block records its own address.
    let mut first = 0;
    for (k, &n) in shape.per.iter().enumerate().filter(|(_, n)| **n > 0) {
        emit_site_value(
            a,
            shape,
            (sites, k),
            word,
            pc,
            (RECORD_SIZE as u32 * first, n),
        )?;
        first += n;
    }
    let ring = layout.buf_kind != BUF_TRACE;
    if !ring {
        a.put(ldr_x(10, 9, SLOT_INFLIGHT as u32));
        a.put(sub_imm(10, 10, 1, false));
        a.put(str_x(10, 9, SLOT_INFLIGHT as u32));
    }
    if layout.buf_kind != BUF_FAST_CIRCULAR {
        a.put(ldr_x(10, 9, SLOT_END as u32));
        a.put(sub_reg(10, 12, 10));
        a.tbz_l(false, 10, 63, full);
    }

    a.bind(out);
    a.put(ldp(11, 12, SP, 16));
    a.put(ldr_x(13, SP, 32));
    a.put(ldp_post(9, 10, SP, frame));
    Ok((retry, out, miss, full, straddle))
}

/// Save x9..x13 and compute the values needed from the original registers.
fn emit_prologue(a: &mut Asm, shape: &Shape) -> Result<(), String> {
    let frame = shape.frame;
    a.put(stp_pre(9, 10, SP, -frame));
    a.put(stp(11, 12, SP, 16));
    a.put(str_x(13, SP, 32));
    for (m, &slot) in shape.mem.iter().zip(&shape.ea_slot) {
        if let Some(m) = m {
            mem::emit_ea(a, m, 10, frame as u32)?;
            a.put(str_x(10, SP, slot));
        }
    }
    for (i, &arg) in shape.args.iter().enumerate() {
        emit_usdt_arg(a, arg, frame as u32)?;
        a.put(str_x(10, SP, shape.slot(i as u32)));
    }
    Ok(())
}

/// Find the thread's slot (x9; `out` before TLS, `miss` when the index does not name
/// this thread) and reserve `nrec` records (x11 = the first, x12 = the end). A fast
/// ring's reservation of several records that would cross the ring's end goes to the
/// returned cold path instead.
fn emit_reserve(
    a: &mut Asm,
    layout: &Layout,
    nrec: u32,
    out: Label,
    miss: Label,
) -> Result<Option<Straddle>, String> {
    let reserve = a.label();
    a.put(mrs(10, TPIDR_EL0));
    a.cbz_l(true, false, 10, out);
    match layout.slot_lookup {
        SlotLookup::ThreadWord(off) => {
            // Whatever the word holds stays among the slots: a miss, never a stray
            // store.
            let mask = slot_mask(layout.nslots);
            a.put(ldr_w(11, 10, off as u32));
            a.put(and_w_ones(11, 11, mask.trailing_zeros(), mask.count_ones()));
            a.addr(9, layout.rw_vaddr + SLOTS_OFF)?;
        }
        SlotLookup::Index(_) => {
            a.put(ubfx(11, 10, 16, 16));
            a.addr(9, layout.rw_vaddr + INDEX_OFF)?;
            a.put(ldr_w_idx(11, 9, 11));
            let slots_from_index = SLOTS_OFF - INDEX_OFF;
            debug_assert!(slots_from_index & 0xfff == 0 && slots_from_index >> 12 < 0x1000);
            a.put(add_imm(9, 9, (slots_from_index >> 12) as u32, true));
        }
    }
    a.put(add_reg(9, 9, 11));
    a.put(ldr_x(12, 9, 0));
    a.put(sub_reg(12, 12, 10));
    a.cbz_l(true, true, 12, miss);

    // Circular buffers are only read at thread exit and on a crash, never reset under
    // a writer: no `inflight` bracket.
    let ring = layout.buf_kind != BUF_TRACE;
    if !ring {
        a.put(ldr_x(12, 9, SLOT_INFLIGHT as u32));
        a.put(add_imm(12, 12, 1, false));
        a.put(str_x(12, 9, SLOT_INFLIGHT as u32));
    }
    // `32 * nrec` is an add's 12-bit immediate (a USDT probe of up to 252 arguments).
    if RECORD_SIZE as u32 * nrec > 0xfff {
        return Err(format!("{nrec} records in one stub: at most 127"));
    }
    a.put(add_imm(13, 9, SLOT_CUR as u32, false));
    a.bind(reserve);
    if layout.buf_kind == BUF_FAST_CIRCULAR {
        // Bump the low 16 bits of `cur` only: the 64 KiB ring wraps by itself; the
        // record is at the ring's (64 KiB aligned) start plus the old offset.
        a.put(ldxrh(11, 13));
        a.put(add_w_imm(12, 11, RECORD_SIZE as u32 * nrec));
        a.put(stxrh(10, 12, 13));
        a.cbz_l(false, true, 10, reserve);
        // Records are stored at x11 + 32j: several must not run past the ring's end
        // into the next thread's ring. The old offset w11 is a multiple of 32 below
        // 64 KiB: the last record passes the end iff w11 + 32(nrec - 1) reaches bit 16.
        let straddle = (nrec > 1).then(|| Straddle {
            label: a.label(),
            nrec,
        });
        if let Some(s) = &straddle {
            a.put(add_imm(10, 11, RECORD_SIZE as u32 * (nrec - 1), false));
            a.tbz_l(true, 10, 16, s.label);
        }
        a.put(ldr_x(10, 9, SLOT_START as u32));
        a.put(add_reg(11, 10, 11));
        return Ok(straddle);
    }
    a.put(ldxr(11, 13));
    a.put(add_imm(12, 11, RECORD_SIZE as u32 * nrec, false));
    a.put(stxr(10, 12, 13));
    a.cbz_l(false, true, 10, reserve);
    Ok(None)
}

/// The cold path of a fast-ring reservation of `nrec` records that crossed the ring's
/// end (`emit_reserve`): w11 = its old offset, x9 = the slot.
struct Straddle {
    label: Label,
    nrec: u32,
}

/// A fast-ring reservation that crossed the ring's end: its records (at the ring's
/// end and start) are marked never written (flags 0, which readers skip) and the stub
/// reserves again, from the ring's start.
fn emit_straddle(a: &mut Asm, s: Straddle, retry: Label) {
    a.bind(s.label);
    a.put(ldr_x(10, 9, SLOT_START as u32));
    for j in 0..s.nrec {
        a.put(add_imm(12, 11, RECORD_SIZE as u32 * j, false));
        a.put(ubfx(12, 12, 0, 16));
        a.put(add_reg(12, 10, 12));
        a.put(str_w(XZR, 12, RECORD_FLAGS_OFF as u32));
    }
    a.b_l(retry);
}

/// Every record's first half: site and flags, then the time (x13 is free afterwards).
fn emit_heads(a: &mut Asm, layout: &Layout, shape: &Shape, sites: &[&PlacedSite]) {
    let ring_flag = if layout.buf_kind != BUF_TRACE {
        FLAG_RING
    } else {
        0
    };
    let clock = match layout.time_mode {
        TimeMode::Record => true,
        TimeMode::Block => sites.iter().any(|s| s.kind == SiteKind::Block),
        TimeMode::Coarse => false,
    };
    if clock {
        a.put(mrs(13, CNTVCT_EL0));
    } else {
        // No clock: `time` is the buffer epoch (Slot::generation, bumped at every
        // reset), so a drain can tell a refilled buffer from the one it read.
        a.put(ldr_w(13, 9, SLOT_GENERATION as u32));
    }
    // Site in the low word and flags in the high word, then the time: one pair store
    // per record, for every record first (x13 is free afterwards).
    let mut first = 0;
    for (k, (site, &n)) in sites.iter().zip(&shape.per).enumerate() {
        // A pair's flags (`pairs` checked that they pair).
        let own = match shape.pair[k] {
            Some(p) => pair_flags(site.flags, sites[p].flags).unwrap_or(site.flags),
            None => site.flags,
        };
        for j in 0..n {
            let flags = match j {
                0 => own | ring_flag,
                _ => FLAG_USDT_MORE | (j - 1) << FLAG_USDT_INDEX_SHIFT | ring_flag,
            };
            a.put_all(&mov_imm64(10, u64::from(site.id) | u64::from(flags) << 32));
            let rec = RECORD_SIZE as u32 * (first + j);
            a.put(stp(10, 13, 11, rec as i32));
            // The frame address's low bits over the flags' high half (`FLAG_FRAME`;
            // the rule's offset is at most 2048).
            if let (0, Some(rule)) = (j, site.frame) {
                let off = rule.off as u32;
                match rule.reg {
                    gimli::AArch64::X29 => a.put(add_imm(10, 29, off, false)),
                    _ => a.put(add_imm(10, SP, shape.frame as u32 + off, false)),
                }
                a.put(strh(10, 11, rec + 6));
            }
        }
        first += n;
    }
}

/// The `value` and `aux` fields of site `k`'s records (at `rec`, `n` of them).
fn emit_site_value(
    a: &mut Asm,
    shape: &Shape,
    (sites, k): (&[&PlacedSite], usize),
    word: u32,
    pc: u64,
    (rec, n): (u32, u32),
) -> Result<(), String> {
    let (site, base) = (sites[k], shape.arg_base[k]);
    let nargs = site.args.len() as u32;
    match site.kind {
        SiteKind::Usdt => {
            for k in 0..2 * n {
                let at = rec + RECORD_SIZE as u32 * (k / 2) + 16 + 8 * (k % 2);
                if k < nargs {
                    a.put(ldr_x(10, SP, shape.slot(base + k)));
                    a.put(str_x(10, 11, at));
                } else {
                    a.put(str_x(XZR, 11, at));
                }
            }
        }
        // A chosen value (`--value`) instead of x0 / the block's address.
        SiteKind::Block if nargs > 0 => {
            a.put(ldr_x(10, SP, shape.slot(base)));
            a.put(stp(10, XZR, 11, rec as i32 + 16));
        }
        SiteKind::FunctionEntry | SiteKind::FunctionExit if nargs > 0 => {
            a.put(ldr_x(10, SP, shape.slot(base)));
            if site.signed_lr {
                a.put(str_x(LR, SP, LR_SAVE));
                a.put(XPACLRI);
                a.put(stp(10, LR, 11, rec as i32 + 16));
                a.put(ldr_x(LR, SP, LR_SAVE));
            } else {
                a.put(stp(10, LR, 11, rec as i32 + 16));
            }
        }
        SiteKind::Block | SiteKind::Landing | SiteKind::Resume => {
            a.addr(10, pc)?;
            a.put(stp(10, XZR, 11, rec as i32 + 16));
        }
        SiteKind::Call => {
            // value: where the call goes; aux: the original return address.
            match reloc::classify(word, pc) {
                reloc::Class::Bl { target } => a.addr(10, target)?,
                reloc::Class::Blr { rn: n @ 9..=13 } => a.put(ldr_x(10, SP, 8 * (n - 9))),
                reloc::Class::Blr { rn } => a.put(mov_reg(10, rn)),
                _ => return Err("not a call".into()),
            }
            a.addr(13, pc + 4)?;
            a.put(stp(10, 13, 11, rec as i32 + 16));
        }
        SiteKind::Memory => {
            // value: the address; aux: the partner's address, or the instruction's.
            a.put(ldr_x(10, SP, shape.ea_slot[k]));
            match shape.pair[k] {
                Some(p) => a.put(ldr_x(13, SP, shape.ea_slot[p])),
                None => a.addr(13, site.insn)?,
            }
            a.put(stp(10, 13, 11, rec as i32 + 16));
        }
        SiteKind::FunctionEntry | SiteKind::FunctionExit if site.signed_lr => {
            // aux is the plain return address: strip the PAC from a copy of x30.
            a.put(str_x(LR, SP, LR_SAVE));
            a.put(XPACLRI);
            a.put(stp(0, LR, 11, rec as i32 + 16));
            a.put(ldr_x(LR, SP, LR_SAVE));
        }
        SiteKind::FunctionEntry | SiteKind::FunctionExit => {
            a.put(stp(0, LR, 11, rec as i32 + 16));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::enc::tests::objdump;
    use super::*;
    use crate::isa::IndexWhy;

    const AT: u64 = 0x50_0000;
    const PC: u64 = 0x40_1000;

    fn site(id: u32, kind: SiteKind) -> PlacedSite {
        PlacedSite {
            id,
            kind,
            at: PC,
            insn: PC,
            ea_shift: 0,
            signed_lr: false,
            flags: 0,
            args: Vec::new(),
            keep_flags: false,
            keep_r11: false,
            flags_dead: false,
            frame: None,
        }
    }

    /// The trampoline of `sites` at a `nop`, in a fast ring, disassembled.
    fn fast_ring_window(sites: &[PlacedSite]) -> Option<Vec<String>> {
        let layout = Layout {
            rw_vaddr: 0x60_0000,
            nslots: 64,
            buf_bytes: tracer_common::FAST_RING_BYTES,
            binary_id: 0x1234,
            pre_tls: false,
            time_mode: TimeMode::Coarse,
            buf_kind: BUF_FAST_CIRCULAR,
            slot_lookup: SlotLookup::Index(IndexWhy::SharedLibrary),
        };
        let rt = Runtime {
            flush: 0x70_0000,
            flush_probe: 0x70_0010,
            register: 0x70_0100,
            entry_shim: None,
        };
        let code = emit_window(&layout, &rt, (NOP, PC), sites, &[], AT).unwrap();
        let words: Vec<u32> = code
            .chunks(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
            .collect();
        objdump(&words, AT)
    }

    /// Two records in one fast-ring reservation: `add` + `tbnz` send a reservation that
    /// would cross the ring's end to a cold path that clears both records' flags
    /// (wherever the ring wraps between them) and reserves again; one record: no test.
    #[test]
    fn a_fast_ring_reservation_of_two_records_never_crosses_the_ring_end() {
        let two = [site(1, SiteKind::FunctionEntry), site(2, SiteKind::Block)];
        let Some(lines) = fast_ring_window(&two) else {
            return;
        };
        let k = lines.iter().position(|l| l.starts_with("stxrh")).unwrap();
        assert_eq!(lines[k - 1], "add w12, w11, #0x40");
        assert_eq!(lines[k + 2], "add x10, x11, #0x20");
        let (tbnz, cold) = lines[k + 3].split_once(", 0x").unwrap();
        assert_eq!(tbnz, "tbnz w10, #16");
        assert_eq!(
            lines[k + 4..k + 6],
            ["ldr x10, [x9, #24]", "add x11, x10, x11"]
        );
        let cold = ((u64::from_str_radix(cold, 16).unwrap() - AT) / 4) as usize;
        assert_eq!(
            lines[cold..cold + 9],
            [
                "ldr x10, [x9, #24]",
                "add x12, x11, #0x0",
                "ubfx x12, x12, #0, #16",
                "add x12, x10, x12",
                "str wzr, [x12, #4]",
                "add x12, x11, #0x20",
                "ubfx x12, x12, #0, #16",
                "add x12, x10, x12",
                "str wzr, [x12, #4]",
            ]
        );
        // Back to the slot lookup.
        let back = lines[cold + 9].strip_prefix("b 0x").unwrap();
        let back = ((u64::from_str_radix(back, 16).unwrap() - AT) / 4) as usize;
        assert_eq!(lines[back], "mrs x10, tpidr_el0");

        let one = [site(1, SiteKind::FunctionEntry)];
        let lines = fast_ring_window(&one).unwrap();
        assert!(!lines.iter().any(|l| l.starts_with("tbnz")), "{lines:?}");
    }
}
