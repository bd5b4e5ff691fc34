//! Code injected once per binary (AArch64): flush (uprobe point), register (a
//! thread's first record) and, for static executables, the entry shim. Same protocol
//! as the x86-64 runtime; see that module and ARCHITECTURE.md.

use super::enc::*;
use crate::isa::{Layout, Runtime};
use tracer_common::*;

const SYS_GETPID: u64 = 172;
const SYS_GETTID: u64 = 178;
const SYS_TGKILL: u64 = 131;
const SYS_RT_SIGPROCMASK: u64 = 135;
const SIG_BLOCK: u64 = 0;
const SIG_SETMASK: u64 = 2;
const ESRCH: u32 = 3;

/// `add rd, rn, #v` for any v < 2^24 (one or two instructions).
fn add_big(a: &mut Asm, rd: u32, rn: u32, v: u64) {
    debug_assert!(v < 1 << 24);
    let (hi, lo) = ((v >> 12) as u32, (v & 0xfff) as u32);
    let mut src = rn;
    if hi != 0 {
        a.put(add_imm(rd, src, hi, true));
        src = rd;
    }
    if lo != 0 || src != rd {
        a.put(add_imm(rd, src, lo, false));
    }
}

/// Atomic `[xn] += 1` with an exclusive pair (no LSE on cortex-a72). Clobbers x12, x13.
fn atomic_inc(a: &mut Asm, rn: u32) {
    let l = a.label();
    a.bind(l);
    a.put(ldxr(12, rn));
    a.put(add_imm(12, 12, 1, false));
    a.put(stxr(13, 12, rn));
    a.cbz_l(false, true, 13, l);
}

pub(super) fn emit(
    layout: &Layout,
    at: u64,
    original_entry: u64,
) -> Result<(Vec<u8>, Runtime), String> {
    let mut a = Asm::new(at);
    let (flush, register, shim) = (a.label(), a.label(), a.label());

    // flush(x9 = slot): the uprobe sits on the leading NOP; the eBPF program drains
    // and resets the buffer. Then, with no tracer, discard the records: reset unless
    // a record is still being written (`inflight`) or the buffer is no longer full.
    // Clobbers x10, x11 only; flags untouched.
    let flush_done = a.label();
    a.bind(flush);
    a.put(NOP);
    a.put(ldr_x(10, 9, SLOT_INFLIGHT as u32));
    a.cbz_l(true, true, 10, flush_done);
    a.put(ldr_x(10, 9, SLOT_CUR as u32));
    a.put(ldr_x(11, 9, SLOT_END as u32));
    a.put(sub_reg(10, 10, 11));
    a.tbz_l(true, 10, 63, flush_done);
    a.put(ldr_x(10, 9, SLOT_START as u32));
    a.put(str_x(10, 9, SLOT_CUR as u32));
    a.bind(flush_done);
    a.put(RET);

    emit_register(&mut a, layout, register, flush)?;

    if layout.pre_tls {
        // Process entry: x0 (rtld_fini) and sp must survive; x9 is scratch.
        a.bind(shim);
        a.addr(9, layout.rw_vaddr + PRE_TLS_OFF)?;
        a.put(str_x(9, 9, 0)); // TCB self pointer, as on x86-64
        a.put(msr(TPIDR_EL0, 9));
        a.b_to(false, original_entry)?;
    }

    let rt = Runtime {
        flush: a.addr_of(flush).ok_or("flush unbound")?,
        register: a.addr_of(register).ok_or("register unbound")?,
        entry_shim: if layout.pre_tls {
            a.addr_of(shim)
        } else {
            None
        },
    };
    Ok((a.finish()?, rt))
}

/// register(x10 = thread pointer) → x9 = the thread's slot, or 0.
///
/// Called from a stub that saved x9..x13 and x30; everything else, NZCV included, is
/// preserved. Frame: x0..x8, x14, x30 and NZCV, then the new and old signal masks.
fn emit_register(a: &mut Asm, l: &Layout, register: Label, flush: Label) -> Result<(), String> {
    const NEWMASK: u32 = 96;
    const OLDMASK: u32 = 104;
    const FRAME: i32 = 112;
    let (scan, claim, claim_next, claim_next_clrex) = (a.label(), a.label(), a.label(), a.label());
    let (reclaim, reclaim_cas, reclaim_next, reclaim_next_clrex) =
        (a.label(), a.label(), a.label(), a.label());
    let (claimed, found, done, pre_tls_slot, no_handover) =
        (a.label(), a.label(), a.label(), a.label(), a.label());
    let slots = SLOTS_OFF;
    let n_scan = u64::from(l.nslots - FIRST_FREE_SLOT);

    a.bind(register);
    a.put(stp_pre(0, 1, SP, -FRAME));
    a.put(stp(2, 3, SP, 16));
    a.put(stp(4, 5, SP, 32));
    a.put(stp(6, 7, SP, 48));
    a.put(stp(8, 14, SP, 64));
    a.put(mrs(14, NZCV));
    a.put(stp(LR, 14, SP, 80));
    a.put(mov_reg(7, 10)); // x7 = tp (flush clobbers x10)

    // Block signals: a handler that records while we hold a half-made claim would
    // claim a second slot for this thread.
    a.put(movz(0, 0, 0));
    a.put(sub_imm(0, 0, 1, false)); // x0 = -1: all signals
    a.put(str_x(0, SP, NEWMASK));
    a.put_all(&mov_imm64(0, SIG_BLOCK));
    a.put(add_imm(1, SP, NEWMASK, false));
    a.put(add_imm(2, SP, OLDMASK, false));
    a.put(movz(3, 8, 0));
    a.put(movz(8, SYS_RT_SIGPROCMASK as u32, 0));
    a.put(SVC0);
    a.addr(6, l.rw_vaddr)?; // x6 = rw_base
    a.put(movz(5, KEY_CLAIMING as u32, 0)); // x5 = KEY_CLAIMING

    // Static executables before libc's TLS: the stand-in TCB always maps to slot 1.
    if l.pre_tls {
        add_big(a, 0, 6, PRE_TLS_OFF);
        a.put(sub_reg(0, 0, 7));
        a.cbz_l(true, false, 0, pre_tls_slot);
    }

    let first_slot = |a: &mut Asm| {
        add_big(a, 9, 6, slots + u64::from(FIRST_FREE_SLOT) * SLOT_SIZE);
        a.put_all(&mov_imm64(4, n_scan));
    };

    // (1) already own a slot (index collision)?
    first_slot(a);
    a.bind(scan);
    a.put(ldr_x(0, 9, 0));
    a.put(sub_reg(0, 0, 7));
    a.cbz_l(true, false, 0, found);
    a.put(add_imm(9, 9, SLOT_SIZE as u32, false));
    a.put(sub_imm(4, 4, 1, false));
    a.cbz_l(true, true, 4, scan);

    // (2) claim a free or tombstoned slot: exclusive CAS key ∈ {FREE, TOMBSTONE} →
    // CLAIMING.
    first_slot(a);
    a.bind(claim);
    a.put(ldxr(0, 9));
    a.put(cmp_imm(0, KEY_TOMBSTONE as u32));
    a.bcond_l(HI, claim_next_clrex);
    a.put(stxr(1, 5, 9));
    a.cbz_l(false, true, 1, claim); // lost the monitor: look again
    a.b_l(claimed);
    a.bind(claim_next_clrex);
    a.put(CLREX);
    a.bind(claim_next);
    a.put(add_imm(9, 9, SLOT_SIZE as u32, false));
    a.put(sub_imm(4, 4, 1, false));
    a.cbz_l(true, true, 4, claim);

    // (3) reclaim a slot whose owner died without a tracer releasing it.
    a.put(movz(8, SYS_GETPID as u32, 0));
    a.put(SVC0);
    a.put(mov_reg(3, 0)); // x3 = pid
    first_slot(a);
    a.bind(reclaim);
    a.put(mov_reg(0, 3));
    a.put(ldr_w(1, 9, SLOT_OWNER_TID as u32));
    a.put(movz(2, 0, 0));
    a.put(movz(8, SYS_TGKILL as u32, 0));
    a.put(SVC0);
    a.put(cmn_imm(0, ESRCH));
    a.bcond_l(NE, reclaim_next);
    a.bind(reclaim_cas);
    a.put(ldxr(0, 9));
    a.put(cmp_imm(0, KEY_CLAIMING as u32));
    a.bcond_l(LS, reclaim_next_clrex);
    a.put(stxr(1, 5, 9));
    a.cbz_l(false, true, 1, reclaim_cas);
    a.b_l(claimed);
    a.bind(reclaim_next_clrex);
    a.put(CLREX);
    a.bind(reclaim_next);
    a.put(add_imm(9, 9, SLOT_SIZE as u32, false));
    a.put(sub_imm(4, 4, 1, false));
    a.cbz_l(true, true, 4, reclaim);

    // (4) no slot: count the dropped record.
    add_big(a, 0, 6, RWH_NO_SLOT_DROPS);
    atomic_inc(a, 0);
    a.put(movz(9, 0, 0));
    a.b_l(done);

    if l.pre_tls {
        a.bind(pre_tls_slot);
        add_big(a, 9, 6, slots + u64::from(SLOT_PRE_TLS) * SLOT_SIZE);
        a.put(ldr_x(0, 9, 0));
        a.put(sub_reg(0, 0, 7));
        a.cbz_l(true, false, 0, found);
        a.put(str_x(5, 9, 0));
        // fall through into `claimed` with x9 = slot 1
    }

    // x9 = claimed slot: initialise it.
    a.bind(claimed);
    a.put(sub_reg(0, 9, 6));
    a.put(sub_imm(0, 0, (slots >> 12) as u32, true));
    a.put(lsr(0, 0, 6)); // slot number (SLOT_SIZE = 64)
    a.put_all(&mov_imm64(1, buf_stride(l.buf_bytes)));
    a.put(mul(0, 0, 1));
    a.put(add_reg(0, 0, 6));
    a.put_all(&mov_imm64(1, bufs_off(l.nslots)));
    a.put(add_reg(0, 0, 1));
    a.put(str_x(0, 9, SLOT_START as u32));
    a.put(str_x(0, 9, SLOT_CUR as u32));
    a.put_all(&mov_imm64(1, l.buf_bytes));
    a.put(add_reg(0, 0, 1));
    a.put(str_x(0, 9, SLOT_END as u32));
    a.put(str_x(6, 9, SLOT_RW_BASE as u32));
    a.put_all(&mov_imm64(0, l.binary_id));
    a.put(str_x(0, 9, SLOT_BINARY_ID as u32));
    a.put(movz(8, SYS_GETTID as u32, 0));
    a.put(SVC0);
    a.put(str_w(0, 9, SLOT_OWNER_TID as u32)); // w0 = tid, kept for the hand-over
    a.put(ldr_w(1, 9, SLOT_GENERATION as u32));
    a.put(add_w_imm(1, 1, 1));
    a.put(str_w(1, 9, SLOT_GENERATION as u32));
    a.put(str_x(XZR, 9, SLOT_INFLIGHT as u32));
    a.put(str_x(7, 9, 0)); // publish: now the thread's stubs can hit it
    add_big(a, 1, 6, RWH_REGISTRATIONS);
    atomic_inc(a, 1);
    if l.pre_tls {
        // The thread got its real thread pointer: hand over what it recorded before
        // (slot 1) and release slot 1.
        add_big(a, 1, 6, slots + u64::from(SLOT_PRE_TLS) * SLOT_SIZE);
        a.put(sub_reg(2, 1, 9));
        a.cbz_l(true, false, 2, no_handover);
        a.put(ldr_x(2, 1, 0));
        add_big(a, 3, 6, PRE_TLS_OFF);
        a.put(sub_reg(2, 2, 3));
        a.cbz_l(true, true, 2, no_handover);
        a.put(ldr_w(2, 1, SLOT_OWNER_TID as u32));
        a.put(sub_w_reg(2, 2, 0));
        a.cbz_l(false, true, 2, no_handover);
        a.put(mov_reg(4, 9));
        a.put(mov_reg(9, 1));
        a.bl_l(flush);
        a.put(movz(2, KEY_TOMBSTONE as u32, 0));
        a.put(str_x(2, 9, 0));
        a.put(mov_reg(9, 4));
        a.bind(no_handover);
    }
    a.bl_l(flush); // empty drain: tells the tracer about this slot

    // x9 = this thread's slot: point index[h(tp)] at it.
    a.bind(found);
    a.put(ubfx(0, 7, 16, 16));
    a.put(sub_reg(1, 9, 6));
    a.put(sub_imm(1, 1, (slots >> 12) as u32, true));
    add_big(a, 2, 6, INDEX_OFF);
    a.put(str_w_idx(1, 2, 0));

    a.bind(done);
    a.put(mov_reg(4, 9));
    a.put(movz(0, SIG_SETMASK as u32, 0));
    a.put(add_imm(1, SP, OLDMASK, false));
    a.put(movz(2, 0, 0));
    a.put(movz(3, 8, 0));
    a.put(movz(8, SYS_RT_SIGPROCMASK as u32, 0));
    a.put(SVC0);
    a.put(mov_reg(9, 4));
    a.put(ldp(LR, 14, SP, 80));
    a.put(msr(NZCV, 14));
    a.put(ldp(8, 14, SP, 64));
    a.put(ldp(6, 7, SP, 48));
    a.put(ldp(4, 5, SP, 32));
    a.put(ldp(2, 3, SP, 16));
    a.put(ldp_post(0, 1, SP, FRAME));
    a.put(RET);
    Ok(())
}
