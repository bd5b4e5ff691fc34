//! The inline function-entry stub (AArch64).
//!
//! ```text
//!   stp   x9, x10, [sp, #-48]!      ; no red zone on Linux arm64: store below sp,
//!   stp   x11, x12, [sp, #16]       ; sp stays 16-byte aligned
//!   str   x13, [sp, #32]            ; [sp, #40] holds x30 around calls
//! retry:
//!   mrs   x10, tpidr_el0 ; cbz x10, out          ; no thread pointer yet: skip
//!   ubfx  x11, x10, #16, #16                      ; h
//!   adrp  x9, INDEX ; add x9, x9, :lo12:INDEX
//!   ldr   w11, [x9, x11, lsl #2]                  ; byte offset of the slot
//!   add   x9, x9, #(SLOTS-INDEX) ; add x9, x9, x11        ; slot
//!   ldr   x12, [x9] ; sub x12, x12, x10 ; cbnz x12, miss  ; key == tp, flags untouched
//!   ldr   x12, [x9, #56] ; add x12, x12, #1 ; str x12, [x9, #56]   ; inflight += 1
//!   add   x13, x9, #8
//! 1: ldxr x11, [x13] ; add x12, x11, #32 ; stxr w10, x12, [x13] ; cbnz w10, 1b
//!                                                 ; reserve: a signal handler's stub on
//!                                                 ; this thread clears the monitor
//!   mov   x10, #site ; mrs x13, cntvct_el0
//!   stp   x10, x13, [x11]           ; site | flags 0, time (cntvct_el0)
//!   stp   x0, x30, [x11, #16]       ; value, aux (after paciasp/pacibsp: x30 saved,
//!                                   ; `xpaclri`, stored, reloaded: aux is unsigned)
//!   ldr   x10, [x9, #56] ; sub x10, x10, #1 ; str x10, [x9, #56]   ; inflight -= 1
//!   ldr   x10, [x9, #16] ; sub x10, x12, x10 ; tbz x10, #63, full   ; cur >= end
//! out:
//!   ldp   x11, x12, [sp, #16] ; ldr x13, [sp, #32] ; ldp x9, x10, [sp], #48
//!   <displaced instruction, relocated> ; b back
//! miss:
//!   str x30, [sp, #40] ; bl register ; ldr x30, [sp, #40] ; cbnz x9, retry ; b out
//! full:
//!   str x30, [sp, #40] ; bl flush ; ldr x30, [sp, #40] ; b out
//! ```
//! No instruction on any path writes NZCV (comparisons are `sub` + `cbnz`/`tbz`);
//! `register` saves NZCV itself.

use super::enc::*;
use super::reloc;
use crate::isa::{EntryPatch, Layout, Runtime};
use tracer_common::{INDEX_OFF, RECORD_SIZE, SLOT_CUR, SLOT_END, SLOT_INFLIGHT, SLOTS_OFF};

/// Stack bytes the stub uses below the caller's sp (16-byte multiple).
const FRAME: i32 = 48;
const LR_SAVE: u32 = 40;

pub(super) fn emit_entry(
    layout: &Layout,
    rt: &Runtime,
    site_id: u32,
    displaced: u32,
    patch: &EntryPatch,
    at: u64,
) -> Result<Vec<u8>, String> {
    let site = patch.patch_at;
    let mut a = Asm::new(at);
    let (retry, out, miss, full, reserve) = (a.label(), a.label(), a.label(), a.label(), a.label());

    a.put(stp_pre(9, 10, SP, -FRAME));
    a.put(stp(11, 12, SP, 16));
    a.put(str_x(13, SP, 32));
    a.bind(retry);
    a.put(mrs(10, TPIDR_EL0));
    a.cbz_l(true, false, 10, out);
    a.put(ubfx(11, 10, 16, 16));
    a.addr(9, layout.rw_vaddr + INDEX_OFF)?;
    a.put(ldr_w_idx(11, 9, 11));
    let slots_from_index = SLOTS_OFF - INDEX_OFF;
    debug_assert!(slots_from_index & 0xfff == 0 && slots_from_index >> 12 < 0x1000);
    a.put(add_imm(9, 9, (slots_from_index >> 12) as u32, true));
    a.put(add_reg(9, 9, 11));
    a.put(ldr_x(12, 9, 0));
    a.put(sub_reg(12, 12, 10));
    a.cbz_l(true, true, 12, miss);

    a.put(ldr_x(12, 9, SLOT_INFLIGHT as u32));
    a.put(add_imm(12, 12, 1, false));
    a.put(str_x(12, 9, SLOT_INFLIGHT as u32));
    a.put(add_imm(13, 9, SLOT_CUR as u32, false));
    a.bind(reserve);
    a.put(ldxr(11, 13));
    a.put(add_imm(12, 11, RECORD_SIZE as u32, false));
    a.put(stxr(10, 12, 13));
    a.cbz_l(false, true, 10, reserve);
    // site in the low word, flags = 0 in the high word: one 64-bit store.
    a.put_all(&mov_imm64(10, u64::from(site_id)));
    a.put(mrs(13, CNTVCT_EL0));
    a.put(stp(10, 13, 11, 0));
    if patch.signed_lr {
        // aux is the plain return address: strip the PAC from a copy of x30.
        a.put(str_x(LR, SP, LR_SAVE));
        a.put(XPACLRI);
        a.put(stp(0, LR, 11, 16));
        a.put(ldr_x(LR, SP, LR_SAVE));
    } else {
        a.put(stp(0, LR, 11, 16));
    }
    a.put(ldr_x(10, 9, SLOT_INFLIGHT as u32));
    a.put(sub_imm(10, 10, 1, false));
    a.put(str_x(10, 9, SLOT_INFLIGHT as u32));
    a.put(ldr_x(10, 9, SLOT_END as u32));
    a.put(sub_reg(10, 12, 10));
    a.tbz_l(false, 10, 63, full);

    a.bind(out);
    a.put(ldp(11, 12, SP, 16));
    a.put(ldr_x(13, SP, 32));
    a.put(ldp_post(9, 10, SP, FRAME));
    reloc::relocate(&mut a, displaced, site)?;
    a.b_to(false, site + 4)?;

    a.bind(miss);
    a.put(str_x(LR, SP, LR_SAVE));
    a.b_to(true, rt.register)?;
    a.put(ldr_x(LR, SP, LR_SAVE));
    a.cbz_l(true, true, 9, retry);
    a.b_l(out);

    a.bind(full);
    a.put(str_x(LR, SP, LR_SAVE));
    a.b_to(true, rt.flush)?;
    a.put(ldr_x(LR, SP, LR_SAVE));
    a.b_l(out);
    a.finish()
}
