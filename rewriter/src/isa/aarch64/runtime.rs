//! Code injected once per binary (AArch64): flush (uprobe point), register (a
//! thread's first record) and, for static executables, the entry shim. Same protocol
//! as the x86-64 runtime; see that module and `tracer-common/src/layout.rs`.
//!
//! `flush`: a `nop` for the uprobe, then the same reset rule, clobbering x10/x11 only.
//! `register`: x10 = tp → x9 = slot or 0; the x86-64 protocol with an exclusive-pair
//! CAS, `clrex` when a CAS is abandoned, arm64 syscall numbers, NZCV saved with
//! `mrs`/`msr`. The user-space drain (`user_drain`/`user_send`, the same messages as on
//! x86-64): `user_drain` saves x0..x8, x12..x14, x30 and NZCV so that `flush` still
//! clobbers only x10/x11; frames are 16-byte multiples. The static entry shim: `msr
//! tpidr_el0` = the pre-TLS TCB.

use super::enc::*;
use super::slot::reset_buffer;
use super::sys::*;
use super::wait;
use crate::isa::linux::*;
use crate::isa::{Layout, Runtime, SlotLookup};
use tracer_common::*;

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
    let l = FlushLabels::new(&mut a);
    emit_flush(&mut a, layout, &l)?;
    wait::emit_armed(&mut a, &l.armed, l.again, l.flush_done, l.take_hold);
    wait::emit_take_hold(&mut a, l.take_hold);

    emit_user_drain(&mut a, l.user_drain, l.user_send);
    emit_user_send(&mut a, l.user_send);

    let calls = RegisterCalls {
        flush: l.flush,
        hello: l.hello,
        take_hold: l.take_hold,
        user_drain: l.user_drain,
        user_send: l.user_send,
    };
    emit_register(&mut a, layout, l.register, &calls)?;
    if layout.pre_tls {
        emit_shim(&mut a, layout, l.shim, original_entry)?;
    }

    let rt = Runtime {
        flush: a.addr_of(l.flush).ok_or("flush unbound")?,
        flush_probe: a.addr_of(l.probe).ok_or("flush probe unbound")?,
        register: a.addr_of(l.register).ok_or("register unbound")?,
        entry_shim: if layout.pre_tls {
            a.addr_of(l.shim)
        } else {
            None
        },
    };
    Ok((a.finish()?, rt))
}

/// The runtime's routines and the flush's inner points.
struct FlushLabels {
    flush: Label,
    register: Label,
    shim: Label,
    flush_done: Label,
    flush_user: Label,
    user_drain: Label,
    user_send: Label,
    again: Label,
    probe: Label,
    hello: Label,
    take_hold: Label,
    armed: wait::Labels,
}

impl FlushLabels {
    fn new(a: &mut Asm) -> Self {
        FlushLabels {
            flush: a.label(),
            register: a.label(),
            shim: a.label(),
            flush_done: a.label(),
            flush_user: a.label(),
            user_drain: a.label(),
            user_send: a.label(),
            again: a.label(),
            probe: a.label(),
            hello: a.label(),
            take_hold: a.label(),
            armed: wait::Labels::new(a),
        }
    }
}

/// flush(x9 = slot): the uprobe sits on the NOP; the eBPF program drains the
/// buffer; x11 tells it what the flush may do (`FLUSH_*`, 0 = plain). Plain: then,
/// with no tracer, discard the records: reset unless a record is still being
/// written (`inflight`) or the buffer is no longer full. With the user-space drain
/// on, send the records instead (user_drain saves what it uses). Armed
/// (`RwHeader::on_full`, see `wait.rs`): signals held, and the flush repeats while
/// the drain holds the buffer. Clobbers x10, x11 only; flags untouched.
fn emit_flush(a: &mut Asm, layout: &Layout, l: &FlushLabels) -> Result<(), String> {
    a.bind(l.flush);
    // This binary's own header, not the slot's `rw_base` (a program may scribble there).
    a.addr(10, layout.rw_vaddr)?;
    a.put(ldr_w(10, 10, RWH_ON_FULL as u32));
    a.put(sub_imm(10, 10, ON_FULL_WAIT, false));
    a.cbz_l(true, false, 10, l.armed.enter);
    a.put(movz(11, 0, 0));
    a.bind(l.again);
    a.bind(l.probe);
    a.put(NOP);
    a.cbz_l(true, true, 11, l.armed.after);
    a.put(ldr_x(10, 9, SLOT_INFLIGHT as u32));
    a.cbz_l(true, true, 10, l.flush_done);
    a.put(ldr_x(10, 9, SLOT_CUR as u32));
    a.put(ldr_x(11, 9, SLOT_END as u32));
    a.put(sub_reg(10, 10, 11));
    a.tbz_l(true, 10, 63, l.flush_done);
    a.put(ldr_x(10, 9, SLOT_RW_BASE as u32));
    a.put(ldr_w(10, 10, RWH_USER_STATE as u32));
    a.put(sub_imm(10, 10, USER_ON, false));
    a.cbz_l(true, false, 10, l.flush_user);
    reset_buffer(a);
    a.bind(l.flush_done);
    a.put(RET);
    a.bind(l.flush_user);
    // Tail call: user_drain returns to flush's caller (x30 is still its return).
    a.put_all(&mov_imm64(
        10,
        chunk_kind_cause(CHUNK_KIND_RECORDS, CAUSE_FULL),
    ));
    a.b_l(l.user_drain);
    // register's flush: the drain answers whether the tracer waits (signals are
    // held in register).
    a.bind(l.hello);
    a.put_all(&mov_imm64(11, FLUSH_HELLO));
    a.b_l(l.again);
    Ok(())
}

/// Process entry of a static executable: a stand-in thread pointer until libc sets the
/// real one. x0 (rtld_fini) and sp must survive; x9 is scratch.
fn emit_shim(a: &mut Asm, layout: &Layout, shim: Label, original_entry: u64) -> Result<(), String> {
    a.bind(shim);
    a.addr(9, layout.rw_vaddr + PRE_TLS_OFF)?;
    a.put(str_x(9, 9, 0)); // TCB self pointer, as on x86-64
    a.put(msr(TPIDR_EL0, 9));
    a.b_to(false, original_entry)
}

/// register(x10 = thread pointer) → x9 = the thread's slot, or 0.
///
/// Called from a stub that saved x9..x13 and x30; everything else, NZCV included, is
/// preserved. Frame: x0..x8, x14, x30 and NZCV, then the new and old signal masks.
/// The routines `register` calls.
struct RegisterCalls {
    flush: Label,
    hello: Label,
    take_hold: Label,
    user_drain: Label,
    user_send: Label,
}

fn emit_register(
    a: &mut Asm,
    l: &Layout,
    register: Label,
    c: &RegisterCalls,
) -> Result<(), String> {
    let lb = RegisterLabels {
        scan: a.label(),
        claim: a.label(),
        claim_next_clrex: a.label(),
        reclaim: a.label(),
        reclaim_cas: a.label(),
        reclaim_next: a.label(),
        reclaim_next_clrex: a.label(),
        claimed: a.label(),
        found: a.label(),
        done: a.label(),
        pre_tls_slot: a.label(),
        no_handover: a.label(),
    };
    a.bind(register);
    register_enter(a, l, &lb)?;
    register_own_or_claim(a, l, &lb);
    register_reclaim(a, l, &lb);
    register_init(a, l, &lb);
    if l.pre_tls {
        register_handover(a, &lb, c.flush, c.user_drain);
    }
    emit_user_discovery(a, c.user_send);
    emit_attach_wait(a)?;
    // An empty drain: tells the tracer about this slot; a tracer that waits for room
    // answers with HOLD_SIGNAL (signals are held here).
    a.bl_l(c.hello);
    a.bl_l(c.take_hold);
    a.cbz_l(true, false, 0, lb.found);
    a.put(movz(0, ON_FULL_WAIT, 0));
    a.put(str_w(0, 6, RWH_ON_FULL as u32));
    register_index(a, l, &lb);
    register_leave(a, &lb);
    Ok(())
}

/// The branch targets inside `register`.
struct RegisterLabels {
    scan: Label,
    claim: Label,
    claim_next_clrex: Label,
    reclaim: Label,
    reclaim_cas: Label,
    reclaim_next: Label,
    reclaim_next_clrex: Label,
    claimed: Label,
    found: Label,
    done: Label,
    pre_tls_slot: Label,
    no_handover: Label,
}

/// Stack frame of `register`: saved registers, then the new and old signal masks.
const NEWMASK: u32 = 96;
const OLDMASK: u32 = 104;
const FRAME: i32 = 112;

/// x9 = the first claimable slot, x4 = how many there are.
fn first_slot(a: &mut Asm, l: &Layout) {
    add_big(a, 9, 6, SLOTS_OFF + u64::from(FIRST_FREE_SLOT) * SLOT_SIZE);
    a.put_all(&mov_imm64(4, u64::from(l.nslots - FIRST_FREE_SLOT)));
}

/// Save registers and NZCV, block signals; x7 = tp, x6 = rw_base, x5 = KEY_CLAIMING.
fn register_enter(a: &mut Asm, l: &Layout, lb: &RegisterLabels) -> Result<(), String> {
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
    block_signals(a, NEWMASK, OLDMASK);
    a.addr(6, l.rw_vaddr)?; // x6 = rw_base
    a.put(movz(5, KEY_CLAIMING as u32, 0)); // x5 = KEY_CLAIMING

    // Static executables before libc's TLS: the stand-in TCB always maps to slot 1.
    if l.pre_tls {
        add_big(a, 0, 6, PRE_TLS_OFF);
        a.put(sub_reg(0, 0, 7));
        a.cbz_l(true, false, 0, lb.pre_tls_slot);
    }

    Ok(())
}

/// (1) a slot this thread already owns (→ `found`), (2) claim a free or tombstoned
/// one (→ `claimed`).
fn register_own_or_claim(a: &mut Asm, l: &Layout, lb: &RegisterLabels) {
    // (1) already own a slot (index collision)?
    first_slot(a, l);
    a.bind(lb.scan);
    a.put(ldr_x(0, 9, 0));
    a.put(sub_reg(0, 0, 7));
    a.cbz_l(true, false, 0, lb.found);
    a.put(add_imm(9, 9, SLOT_SIZE as u32, false));
    a.put(sub_imm(4, 4, 1, false));
    a.cbz_l(true, true, 4, lb.scan);

    // (2) claim a free or tombstoned slot: exclusive CAS key ∈ {FREE, TOMBSTONE} →
    // CLAIMING.
    first_slot(a, l);
    a.bind(lb.claim);
    a.put(ldxr(0, 9));
    a.put(cmp_imm(0, KEY_TOMBSTONE as u32));
    a.bcond_l(HI, lb.claim_next_clrex);
    a.put(stxr(1, 5, 9));
    a.cbz_l(false, true, 1, lb.claim); // lost the monitor: look again
    a.b_l(lb.claimed);
    a.bind(lb.claim_next_clrex);
    a.put(CLREX);
    a.put(add_imm(9, 9, SLOT_SIZE as u32, false));
    a.put(sub_imm(4, 4, 1, false));
    a.cbz_l(true, true, 4, lb.claim);
}

/// (3) reclaim a slot of a dead thread (→ `claimed`), (4) else count a drop and fail.
fn register_reclaim(a: &mut Asm, l: &Layout, lb: &RegisterLabels) {
    // (3) reclaim a slot whose owner died without a tracer releasing it.
    a.put(movz(8, SYS_GETPID, 0));
    a.put(SVC0);
    a.put(mov_reg(3, 0)); // x3 = pid
    first_slot(a, l);
    a.bind(lb.reclaim);
    a.put(mov_reg(0, 3));
    a.put(ldr_w(1, 9, SLOT_OWNER_TID as u32));
    a.put(movz(2, 0, 0));
    a.put(movz(8, SYS_TGKILL, 0));
    a.put(SVC0);
    a.put(cmn_imm(0, ESRCH));
    a.bcond_l(NE, lb.reclaim_next);
    a.bind(lb.reclaim_cas);
    a.put(ldxr(0, 9));
    a.put(cmp_imm(0, KEY_CLAIMING as u32));
    a.bcond_l(LS, lb.reclaim_next_clrex);
    a.put(stxr(1, 5, 9));
    a.cbz_l(false, true, 1, lb.reclaim_cas);
    a.b_l(lb.claimed);
    a.bind(lb.reclaim_next_clrex);
    a.put(CLREX);
    a.bind(lb.reclaim_next);
    a.put(add_imm(9, 9, SLOT_SIZE as u32, false));
    a.put(sub_imm(4, 4, 1, false));
    a.cbz_l(true, true, 4, lb.reclaim);

    // (4) no slot: count the dropped record.
    add_big(a, 0, 6, RWH_NO_SLOT_DROPS);
    atomic_inc(a, 0);
    a.put(movz(9, 0, 0));
    a.b_l(lb.done);
}

/// Initialise the claimed slot (x9) and publish its key.
fn register_init(a: &mut Asm, l: &Layout, lb: &RegisterLabels) {
    if l.pre_tls {
        a.bind(lb.pre_tls_slot);
        add_big(a, 9, 6, SLOTS_OFF + u64::from(SLOT_PRE_TLS) * SLOT_SIZE);
        a.put(ldr_x(0, 9, 0));
        a.put(sub_reg(0, 0, 7));
        a.cbz_l(true, false, 0, lb.found);
        a.put(str_x(5, 9, 0));
        // fall through into `claimed` with x9 = slot 1
    }

    // x9 = claimed slot: initialise it.
    a.bind(lb.claimed);
    a.put(sub_reg(0, 9, 6));
    a.put(sub_imm(0, 0, (SLOTS_OFF >> 12) as u32, true));
    a.put(lsr(0, 0, 6)); // slot number (SLOT_SIZE = 64)
    a.put_all(&mov_imm64(1, buf_stride(l.buf_kind, l.buf_bytes)));
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
    a.put(movz(8, SYS_GETTID, 0));
    a.put(SVC0);
    a.put(str_w(0, 9, SLOT_OWNER_TID as u32)); // w0 = tid, kept for the hand-over
    a.put(ldr_w(1, 9, SLOT_GENERATION as u32));
    a.put(add_w_imm(1, 1, 1));
    a.put(str_w(1, 9, SLOT_GENERATION as u32));
    a.put(str_x(XZR, 9, SLOT_INFLIGHT as u32));
    a.put(str_x(7, 9, 0)); // publish: now the thread's stubs can hit it
    add_big(a, 1, 6, RWH_REGISTRATIONS);
    atomic_inc(a, 1);
}

/// Static executables: hand what the thread recorded in the pre-TLS slot over.
fn register_handover(a: &mut Asm, lb: &RegisterLabels, flush: Label, user_drain: Label) {
    // The thread got its real thread pointer: hand over what it recorded before
    // (slot 1) and release slot 1.
    add_big(a, 1, 6, SLOTS_OFF + u64::from(SLOT_PRE_TLS) * SLOT_SIZE);
    a.put(sub_reg(2, 1, 9));
    a.cbz_l(true, false, 2, lb.no_handover);
    a.put(ldr_x(2, 1, 0));
    add_big(a, 3, 6, PRE_TLS_OFF);
    a.put(sub_reg(2, 2, 3));
    a.cbz_l(true, true, 2, lb.no_handover);
    a.put(ldr_w(2, 1, SLOT_OWNER_TID as u32));
    a.put(sub_w_reg(2, 2, 0));
    a.cbz_l(false, true, 2, lb.no_handover);
    a.put(mov_reg(4, 9));
    a.put(mov_reg(9, 1));
    // The user-space drain was decided at slot 1's own registration: send slot 1's
    // records over the socket, else let the flush uprobe (or the reset) have them.
    let (handover_probe, handover_done) = (a.label(), a.label());
    a.put(ldr_w(2, 6, RWH_USER_STATE as u32));
    a.put(sub_imm(2, 2, USER_ON, false));
    a.cbz_l(true, true, 2, handover_probe);
    a.put_all(&mov_imm64(
        10,
        chunk_kind_cause(CHUNK_KIND_RECORDS, CAUSE_FULL),
    ));
    a.bl_l(user_drain); // preserves x0..x8
    a.b_l(handover_done);
    a.bind(handover_probe);
    a.bl_l(flush);
    a.bind(handover_done);
    a.put(movz(2, KEY_TOMBSTONE as u32, 0));
    a.put(str_x(2, 9, 0));
    a.put(mov_reg(9, 4));
    a.bind(lb.no_handover);
}

/// `found`: point index[h(tp)] (and the thread word) at the slot (x9).
fn register_index(a: &mut Asm, l: &Layout, lb: &RegisterLabels) {
    // x9 = this thread's slot: point index[h(tp)] at it.
    a.bind(lb.found);
    a.put(ubfx(0, 7, 16, 16));
    a.put(sub_reg(1, 9, 6));
    a.put(sub_imm(1, 1, (SLOTS_OFF >> 12) as u32, true));
    add_big(a, 2, 6, INDEX_OFF);
    a.put(str_w_idx(1, 2, 0));
    if let SlotLookup::ThreadWord(off) = l.slot_lookup {
        a.put(str_w(1, 7, off as u32));
    }
}

/// `done`: restore the signal mask, registers and NZCV; return x9.
fn register_leave(a: &mut Asm, lb: &RegisterLabels) {
    a.bind(lb.done);
    a.put(mov_reg(4, 9));
    restore_signals(a, OLDMASK);
    a.put(mov_reg(9, 4));
    a.put(ldp(LR, 14, SP, 80));
    a.put(msr(NZCV, 14));
    a.put(ldp(8, 14, SP, 64));
    a.put(ldp(6, 7, SP, 48));
    a.put(ldp(4, 5, SP, 32));
    a.put(ldp(2, 3, SP, 16));
    a.put(ldp_post(0, 1, SP, FRAME));
    a.put(RET);
}

const fn chunk_kind_cause(kind: u32, cause: u32) -> u64 {
    kind as u64 | (cause as u64) << 32
}

/// In `register` after a slot was claimed (x9 = slot, x6 = rw_base, x7 = tp): decide
/// once per process whether the user-space drain is on (descriptor USER_DRAIN_FD is a
/// SOCK_SEQPACKET socket; a SOCK_STREAM one: `USER_SESSION`), and if so tell the tracer
/// about the slot. Only a dumpable process joins (`prctl(PR_GET_DUMPABLE)` = 1: not
/// setuid, setgid or given file capabilities at exec), and only a peer that is root or
/// this process's effective user ([`emit_peer_trusted`]); refused: `USER_OFF`, no
/// wait. Clobbers x0..x4, x8, x10, x11 (register saved them); keeps x5..x7, x9.
/// Flag-free.
fn emit_user_discovery(a: &mut Asm, user_send: Label) {
    let (known, decided, off) = (a.label(), a.label(), a.label());
    a.put(ldr_w(0, 6, RWH_USER_STATE as u32));
    const _: () = assert!(USER_UNKNOWN == 0);
    a.cbz_l(false, true, 0, known);
    a.put(sub_imm(SP, SP, 16, false)); // [sp] = option value, [sp+8] = its length
    a.put(movz(0, PR_GET_DUMPABLE, 0));
    for r in 1..=4 {
        a.put(movz(r, 0, 0));
    }
    a.put(movz(8, SYS_PRCTL, 0));
    a.put(SVC0);
    a.put(sub_imm(0, 0, SUID_DUMP_USER, false));
    a.put(movz(1, USER_OFF, 0));
    a.cbz_l(true, true, 0, decided);
    a.put(movz(0, 4, 0));
    a.put(str_w(0, SP, 8));
    a.put(movz(0, USER_DRAIN_FD, 0));
    a.put(movz(1, SOL_SOCKET, 0));
    a.put(movz(2, SO_TYPE, 0));
    a.put(add_imm(3, SP, 0, false));
    a.put(add_imm(4, SP, 8, false));
    a.put(movz(8, SYS_GETSOCKOPT, 0));
    a.put(SVC0);
    a.put(movz(1, USER_OFF, 0));
    let (is_socket, check_peer) = (a.label(), a.label());
    a.cbz_l(true, false, 0, is_socket);
    // No such descriptor: a system-wide session's socket, if one listens.
    a.put(add_imm(2, 0, EBADF, false));
    a.cbz_l(true, true, 2, decided); // not a socket
    emit_session_connect(a);
    a.b_l(decided);
    a.bind(is_socket);
    a.put(ldr_w(2, SP, 0));
    a.put(movz(1, USER_ON, 0));
    a.put(movz(3, SOCK_SEQPACKET, 0));
    a.put(sub_w_reg(3, 2, 3));
    a.cbz_l(false, false, 3, check_peer);
    a.put(movz(1, USER_SESSION, 0));
    a.put(movz(3, SOCK_STREAM, 0));
    a.put(sub_w_reg(3, 2, 3));
    a.cbz_l(false, false, 3, check_peer);
    a.put(movz(1, USER_OFF, 0));
    a.b_l(decided);
    a.bind(check_peer);
    a.put(mov_reg(10, 1));
    a.put(movz(0, USER_DRAIN_FD, 0));
    emit_peer_trusted(a);
    a.put(mov_reg(1, 10));
    a.cbz_l(true, false, 0, decided);
    a.put(movz(1, USER_OFF, 0));
    a.bind(decided);
    a.put(add_imm(SP, SP, 16, false));
    a.put(movz(2, USER_DRAIN_FD, 0));
    a.put(str_w(2, 6, RWH_USER_FD as u32));
    a.put(str_w(1, 6, RWH_USER_STATE as u32));
    a.bind(known);
    a.put(ldr_w(0, 6, RWH_USER_STATE as u32));
    a.put(sub_imm(0, 0, USER_ON, false));
    a.cbz_l(true, true, 0, off);
    // Payload [slot, rw_base] on the stack, then x5 and x7, which user_send clobbers
    // (register's rw_base and tp: the index and the thread word are written with
    // them afterwards).
    a.put(sub_imm(SP, SP, 32, false));
    a.put(stp(9, 6, SP, 0));
    a.put(stp(5, 7, SP, 16));
    a.put_all(&mov_imm64(
        0,
        chunk_kind_cause(CHUNK_KIND_SLOT, CAUSE_REGISTER),
    ));
    a.put(movz(1, 0, 0));
    a.put(add_imm(2, SP, 0, false));
    a.put(movz(3, 16, 0));
    a.bl_l(user_send);
    a.put(ldp(5, 7, SP, 16));
    a.put(ldr_x(6, SP, 8));
    a.put(add_imm(SP, SP, 32, false));
    a.bind(off);
}

/// x0 = a connected Unix socket: x0 = 0 when the process at its other end
/// (`SO_PEERCRED`: its effective uid when it made the socket) is root or this process's
/// effective user, else non-zero. `getsockopt`, and `geteuid` unless the peer is root.
/// Clobbers x0..x4, x8, x11; keeps x10.
fn emit_peer_trusted(a: &mut Asm) {
    let (refuse, done) = (a.label(), a.label());
    a.put(sub_imm(SP, SP, 16, false)); // [sp] = struct ucred, [sp+12] = its length
    a.put(movz(1, UCRED_SIZE, 0));
    a.put(str_w(1, SP, UCRED_SIZE));
    a.put(movz(1, SOL_SOCKET, 0));
    a.put(movz(2, SO_PEERCRED, 0));
    a.put(add_imm(3, SP, 0, false));
    a.put(add_imm(4, SP, UCRED_SIZE, false));
    a.put(movz(8, SYS_GETSOCKOPT, 0));
    a.put(SVC0);
    a.cbz_l(true, true, 0, refuse);
    a.put(ldr_w(11, SP, UCRED_UID));
    a.cbz_l(false, false, 11, done); // root (x0 = 0)
    a.put(movz(8, SYS_GETEUID, 0));
    a.put(SVC0);
    a.put(sub_w_reg(0, 0, 11)); // 0: ourselves
    a.b_l(done);
    a.bind(refuse);
    a.put(movz(0, 1, 0));
    a.bind(done);
    a.put(add_imm(SP, SP, 16, false));
}

/// No descriptor USER_DRAIN_FD: connect to a system-wide session's socket
/// (`SESSION_SOCKET`, abstract: any user may have bound the name); connected to a
/// trusted listener ([`emit_peer_trusted`]), the socket becomes USER_DRAIN_FD
/// (close-on-exec) and x1 = `USER_SESSION`, else it is closed and x1 = `USER_OFF`.
/// Three system calls when no session listens. Clobbers x0..x4, x8, x10, x11.
fn emit_session_connect(a: &mut Asm) {
    let (close, off, done) = (a.label(), a.label(), a.label());
    a.put(movz(0, AF_UNIX, 0));
    a.put_all(&mov_imm64(
        1,
        u64::from(SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC),
    ));
    a.put(movz(2, 0, 0));
    a.put(movz(8, SYS_SOCKET, 0));
    a.put(SVC0);
    a.tbz_l(true, 0, 63, off);
    a.put(mov_reg(10, 0));
    // struct sockaddr_un: the family, then the abstract name.
    let mut addr = [0u8; 24];
    addr[..2].copy_from_slice(&(AF_UNIX as u16).to_le_bytes());
    addr[2..2 + SESSION_SOCKET.len()].copy_from_slice(SESSION_SOCKET);
    a.put(sub_imm(SP, SP, 32, false));
    for (i, w) in addr.chunks(8).enumerate() {
        let v = u64::from_le_bytes(w.try_into().unwrap_or_default());
        a.put_all(&mov_imm64(0, v));
        a.put(str_x(0, SP, 8 * i as u32));
    }
    a.put(mov_reg(0, 10));
    a.put(add_imm(1, SP, 0, false));
    a.put(movz(2, (2 + SESSION_SOCKET.len()) as u32, 0));
    a.put(movz(8, SYS_CONNECT, 0));
    a.put(SVC0);
    a.put(add_imm(SP, SP, 32, false));
    a.cbz_l(true, true, 0, close);
    a.put(mov_reg(0, 10));
    emit_peer_trusted(a);
    a.cbz_l(true, true, 0, close);
    a.put(mov_reg(0, 10));
    a.put(movz(1, USER_DRAIN_FD, 0));
    a.put_all(&mov_imm64(2, u64::from(O_CLOEXEC)));
    a.put(movz(8, SYS_DUP3, 0));
    a.put(SVC0);
    a.put(mov_reg(11, 0));
    a.put(mov_reg(0, 10));
    a.put(movz(8, SYS_CLOSE, 0));
    a.put(SVC0);
    a.tbz_l(true, 11, 63, off);
    a.put(movz(1, USER_SESSION, 0));
    a.b_l(done);
    a.bind(close);
    a.put(mov_reg(0, 10));
    a.put(movz(8, SYS_CLOSE, 0));
    a.put(SVC0);
    a.bind(off);
    a.put(movz(1, USER_OFF, 0));
    a.bind(done);
}

/// In `register`, a process that a session started (`USER_SESSION`): wait until the
/// tracer has attached the flush uprobe (the instruction at `probe` is its `brk`),
/// polling the session's descriptor (`ATTACH_POLLS` × `ATTACH_POLL_NS`), then tell the
/// session how it went (`ATTACH_DONE`, or `ATTACH_GAVE_UP` when the time ran out;
/// nothing when its end closed) and stop looking (`USER_OFF`): one such system call
/// per binary and process. Clobbers x0..x4, x8, x10, x11; keeps x5..x7, x9.
fn emit_attach_wait(a: &mut Asm) -> Result<(), String> {
    let (poll, tell, attached, off, done) = (a.label(), a.label(), a.label(), a.label(), a.label());
    // x0 = 0 when the tracer has attached the binary (x6 = rw_base).
    let is_attached = |a: &mut Asm| {
        a.put(ldr_w(0, 6, RWH_ATTACHED as u32));
        a.put(sub_imm(0, 0, ATTACHED, false));
    };
    a.put(ldr_w(0, 6, RWH_USER_STATE as u32));
    a.put(sub_imm(0, 0, USER_SESSION, false));
    a.cbz_l(true, true, 0, done);
    // [sp] = struct pollfd, [sp+8] = struct timespec, [sp+24] = the outcome byte
    a.put(sub_imm(SP, SP, 32, false));
    is_attached(a);
    a.cbz_l(false, false, 0, attached);
    a.put(movz(10, ATTACH_POLLS, 0));
    a.bind(poll);
    a.put(movz(0, USER_DRAIN_FD, 0));
    a.put(str_w(0, SP, 0));
    a.put(movz(0, POLLIN, 0)); // events; revents = 0
    a.put(str_w(0, SP, 4));
    a.put(movz(0, 0, 0));
    a.put(str_x(0, SP, 8));
    a.put_all(&mov_imm64(0, u64::from(ATTACH_POLL_NS)));
    a.put(str_x(0, SP, 16));
    a.put(add_imm(0, SP, 0, false));
    a.put(movz(1, 1, 0));
    a.put(add_imm(2, SP, 8, false));
    a.put(movz(3, 0, 0));
    a.put(movz(4, 0, 0));
    a.put(movz(8, SYS_PPOLL, 0));
    a.put(SVC0);
    // The tracer never writes: ready means its end closed (or an error).
    a.cbz_l(true, true, 0, off);
    is_attached(a);
    a.cbz_l(false, false, 0, attached);
    a.put(sub_imm(10, 10, 1, false));
    a.cbz_l(true, true, 10, poll);
    a.put(movz(0, u32::from(ATTACH_GAVE_UP), 0));
    a.b_l(tell);
    a.bind(attached);
    a.put(movz(0, u32::from(ATTACH_DONE), 0));
    a.bind(tell);
    a.put(str_w(0, SP, 24));
    a.put(movz(0, USER_DRAIN_FD, 0));
    a.put(add_imm(1, SP, 24, false));
    a.put(movz(2, 1, 0));
    a.put(movz(3, MSG_NOSIGNAL | MSG_DONTWAIT, 0));
    a.put(movz(4, 0, 0)); // no address: the kernel ignores x5, the length
    a.put(movz(8, SYS_SENDTO, 0));
    a.put(SVC0);
    a.bind(off);
    a.put(add_imm(SP, SP, 32, false));
    a.put(movz(0, USER_OFF, 0));
    a.put(str_w(0, 6, RWH_USER_STATE as u32));
    a.bind(done);
    Ok(())
}

/// user_drain(x9 = slot, x10 = kind | cause << 32): send `[start, cur)` in messages of at
/// most USER_MSG_RECORDS records, then reset the buffer. Reached from flush (whose
/// callers expect only x10, x11 to change) and from register: clobbers x10, x11 only,
/// NZCV included (saved, though the body is flag-free).
fn emit_user_drain(a: &mut Asm, label: Label, user_send: Label) {
    // [sp+112] = all signals, [sp+120] = the old mask.
    const FRAME: i32 = 128;
    let (next, small, done) = (a.label(), a.label(), a.label());
    let max = USER_MSG_RECORDS * RECORD_SIZE as u64;
    a.bind(label);
    a.put(stp_pre(0, 1, SP, -FRAME));
    a.put(stp(2, 3, SP, 16));
    a.put(stp(4, 5, SP, 32));
    a.put(stp(6, 7, SP, 48));
    a.put(stp(8, 12, SP, 64));
    a.put(stp(13, 14, SP, 80));
    a.put(mrs(14, NZCV));
    a.put(stp(LR, 14, SP, 96));
    // Block signals while sending: a handler that filled the buffer again would send
    // the records we are sending a second time.
    block_signals(a, 112, 120);
    a.put(mov_reg(12, 10)); // x12 = kind | cause << 32
    a.put(ldr_x(13, 9, SLOT_START as u32)); // x13 = next record to send
    a.bind(next);
    a.put(ldr_x(3, 9, SLOT_CUR as u32));
    a.put(sub_reg(3, 3, 13)); // x3 = bytes left
    a.cbz_l(true, false, 3, done);
    a.tbz_l(true, 3, 63, done);
    a.put_all(&mov_imm64(4, max));
    a.put(sub_reg(5, 3, 4));
    a.tbz_l(true, 5, 63, small); // fewer than max left
    a.put(mov_reg(3, 4));
    a.bind(small);
    a.put(mov_reg(2, 13));
    a.put(add_reg(13, 13, 3));
    a.put(lsr(1, 3, 5)); // RECORD_SIZE = 32
    a.put(mov_reg(0, 12));
    a.bl_l(user_send);
    a.b_l(next);
    a.bind(done);
    a.put(ldr_x(10, 9, SLOT_START as u32));
    a.put(str_x(10, 9, SLOT_CUR as u32));
    restore_signals(a, 120);
    a.put(ldp(LR, 14, SP, 96));
    a.put(msr(NZCV, 14));
    a.put(ldp(13, 14, SP, 80));
    a.put(ldp(8, 12, SP, 64));
    a.put(ldp(6, 7, SP, 48));
    a.put(ldp(4, 5, SP, 32));
    a.put(ldp(2, 3, SP, 16));
    a.put(ldp_post(0, 1, SP, FRAME));
    a.put(RET);
}

/// user_send(x9 = slot, x0 = kind | cause << 32, w1 = record count, x2 = payload,
/// x3 = payload bytes): one `sendmsg(USER_DRAIN_FD, [ChunkHeader, payload],
/// MSG_NOSIGNAL)`, retried on EINTR. Any other failure (the tracer is gone) turns the
/// drain off for the process. Clobbers x0..x8, x10, x11; keeps x9, x12.., x30 (a leaf);
/// flag-free.
fn emit_user_send(a: &mut Asm, label: Label) {
    const FRAME: u32 = 144;
    const _: () = assert!(RECORD_SIZE == 32 && core::mem::size_of::<ChunkHeader>() == 48);
    let (seq, retry, sent) = (a.label(), a.label(), a.label());
    a.bind(label);
    a.put(sub_imm(SP, SP, FRAME, false));
    // ChunkHeader at [sp]: kind, count, pid, tid, seq, binary_id, cause, pad, time
    // (0: the tracer stamps it on receipt).
    a.put(str_w(0, SP, 0));
    a.put(str_w(1, SP, 4));
    a.put(lsr(4, 0, 32));
    a.put(str_x(4, SP, 32)); // cause, pad = 0
    a.put(str_x(XZR, SP, 40));
    a.put(movz(8, SYS_GETPID, 0));
    a.put(SVC0);
    a.put(str_w(0, SP, 8));
    a.put(ldr_w(4, 9, SLOT_OWNER_TID as u32));
    a.put(str_w(4, SP, 12));
    a.put(ldr_x(5, 9, SLOT_RW_BASE as u32)); // x5 = rw_base
    a.put(add_imm(6, 5, RWH_USER_SEQ as u32, false));
    a.bind(seq);
    a.put(ldxr(4, 6));
    a.put(add_imm(7, 4, 1, false));
    a.put(stxr(8, 7, 6));
    a.cbz_l(false, true, 8, seq);
    a.put(str_x(4, SP, 16));
    a.put(ldr_x(4, 9, SLOT_BINARY_ID as u32));
    a.put(str_x(4, SP, 24));
    // iovec[2] at [sp+48]
    a.put(add_imm(4, SP, 0, false));
    a.put(str_x(4, SP, 48));
    a.put(movz(4, 48, 0));
    a.put(str_x(4, SP, 56));
    a.put(str_x(2, SP, 64));
    a.put(str_x(3, SP, 72));
    // msghdr at [sp+80]: name, namelen, iov, iovlen, control, controllen, flags
    a.put(stp(XZR, XZR, SP, 80));
    a.put(add_imm(4, SP, 48, false));
    a.put(movz(7, 2, 0));
    a.put(stp(4, 7, SP, 96));
    a.put(stp(XZR, XZR, SP, 112));
    a.put(str_x(XZR, SP, 128));
    a.bind(retry);
    a.put(ldr_w(0, 5, RWH_USER_FD as u32));
    a.put(add_imm(1, SP, 80, false));
    a.put(movz(2, MSG_NOSIGNAL, 0));
    a.put(movz(8, SYS_SENDMSG, 0));
    a.put(SVC0);
    a.put(add_imm(4, 0, EINTR, false)); // x0 == -EINTR?
    a.cbz_l(true, false, 4, retry);
    a.tbz_l(false, 0, 63, sent);
    a.put(movz(4, USER_OFF, 0));
    a.put(str_w(4, 5, RWH_USER_STATE as u32));
    a.bind(sent);
    a.put(add_imm(SP, SP, FRAME, false));
    a.put(RET);
}
