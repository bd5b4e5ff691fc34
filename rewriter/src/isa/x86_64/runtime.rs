//! Code injected once per binary: the flush function (uprobe point), the register
//! routine (a thread's first record) and, for static executables, the entry shim that
//! installs a stand-in thread pointer until libc sets the real one.
//!
//! `register` (a thread's first record, an index miss): finds the thread's slot after
//! an index collision, or claims a free or tombstoned one with `lock cmpxchg` (key →
//! `KEY_CLAIMING` while initialising, then the thread pointer), reclaims a dead
//! thread's slot (`tgkill(pid, tid, 0)` = ESRCH) when none is free, or counts the
//! record in `RwHeader::no_slot_drops`. A fresh slot is announced with an empty flush,
//! so the tracer learns the process's RW areas before they hold anything. Signals are
//! blocked while it runs, so a handler cannot claim a second slot for the thread. Its
//! system calls are the only ones a rewritten program adds: per thread signal masking,
//! `gettid` and the empty flush's zero-timeout `rt_sigtimedwait`; per binary
//! `prctl(PR_GET_DUMPABLE)`, one `getsockopt` and, without the session descriptor,
//! `socket`, `connect` and `close` to look for a session; `tgkill(pid, tid, 0)` when it
//! reclaims a slot (test
//! `trust_runtime::without_a_tracer_the_runtime_adds_only_registers_calls`;
//! `short_lived.rs` checks with strace that a program without a session never polls or
//! sleeps).
//!
//! `flush` starts with a NOP, where the tracer's uprobe sits: after one load of `cur`, so
//! that a signal handler recording between the drain and the flush's own reset is seen and
//! its records kept for the next flush; a 4-byte NOP, which the kernel emulates, not nop5,
//! whose uprobe Linux 6.18 turns into a call to a per-process trampoline that fork()ed
//! children lack (their first flush crashed). With no tracer attached the flush resets the
//! buffer itself and the program runs on. The user-space drain, the session wait and the
//! pre-TLS shim follow `tracer-common/src/layout.rs`.

use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Register};

use super::super::{Layout, Runtime, SlotLookup};
use super::slot::reset_buffer;
use super::stub::lea_rip;
use super::sys::*;
use super::wait;
use crate::isa::linux::*;
use tracer_common::*;

pub(super) fn emit(
    layout: &Layout,
    at: u64,
    original_entry: u64,
) -> Result<(Vec<u8>, Runtime), IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut l = FlushLabels::new(&mut a);
    emit_flush(&mut a, layout, &mut l)?;
    wait::emit_armed(&mut a, &mut l.armed, l.again, l.flush_done, l.take_hold)?;
    wait::emit_take_hold(&mut a, &mut l.take_hold)?;
    a.int3()?;

    emit_user_drain(&mut a, &mut l.user_drain, l.user_send)?;
    emit_user_send(&mut a, &mut l.user_send)?;

    let calls = RegisterCalls {
        flush: l.flush,
        hello: l.hello,
        take_hold: l.take_hold,
        user_drain: l.user_drain,
        user_send: l.user_send,
    };
    emit_register(&mut a, layout, &mut l.register, &calls)?;
    if layout.pre_tls {
        emit_shim(&mut a, layout, &mut l.shim, original_entry)?;
    }

    let res = a.assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let rt = Runtime {
        flush: res.label_ip(&l.flush)?,
        flush_probe: res.label_ip(&l.probe)?,
        register: res.label_ip(&l.register)?,
        entry_shim: if layout.pre_tls {
            Some(res.label_ip(&l.shim)?)
        } else {
            None
        },
    };
    Ok((res.inner.code_buffer, rt))
}

/// The runtime's routines and the flush's inner points.
struct FlushLabels {
    flush: CodeLabel,
    probe: CodeLabel,
    register: CodeLabel,
    shim: CodeLabel,
    flush_done: CodeLabel,
    flush_user: CodeLabel,
    user_drain: CodeLabel,
    user_send: CodeLabel,
    again: CodeLabel,
    hello: CodeLabel,
    take_hold: CodeLabel,
    armed: wait::Labels,
}

impl FlushLabels {
    fn new(a: &mut CodeAssembler) -> Self {
        FlushLabels {
            flush: a.create_label(),
            probe: a.create_label(),
            register: a.create_label(),
            shim: a.create_label(),
            flush_done: a.create_label(),
            flush_user: a.create_label(),
            user_drain: a.create_label(),
            user_send: a.create_label(),
            again: a.create_label(),
            hello: a.create_label(),
            take_hold: a.create_label(),
            armed: wait::Labels::new(a),
        }
    }
}

/// flush(%rsi = slot): the uprobe sits on the 4-byte NOP. Not a 5-byte one:
/// Linux 6.18 optimises a uprobe on nop5 into a call to a per-process trampoline
/// that a fork()ed child does not inherit, so the child's first flush jumps into
/// nothing (SIGSEGV; tests/fixtures/callers.c). A NOP uprobe is emulated, without a
/// single-step: ~3 ns/event more than nop5 under `tracer record` (xtask bench).
/// The tracer's eBPF program drains the buffer; %rdx tells it what the flush may do
/// (`FLUSH_*`, 0 = plain). Plain: then, with no tracer, discard the records: reset
/// unless a record is still being written (`inflight`, a signal handler interrupted
/// a stub) or the buffer is no longer full (the tracer reset it). With the
/// user-space drain on, send the records instead. A signal handler that records
/// between the drain and the reset (a signal pending during the uprobe is delivered
/// right after it) moved `cur` on: no reset then, its records stay for the next
/// flush (the tracer drains from where it stopped; they stay in the slack after
/// `end`). Armed (`RwHeader::on_full`, see `wait.rs`): signals held, and the flush
/// repeats while the drain holds the buffer. Clobbers %rax %rcx and flags.
fn emit_flush(
    a: &mut CodeAssembler,
    layout: &Layout,
    l: &mut FlushLabels,
) -> Result<(), IcedError> {
    a.set_label(&mut l.flush)?;
    a.push(rdx)?;
    // This binary's own header, not the slot's `rw_base` (a program may scribble there).
    lea_rip(a, Register::RCX, layout.rw_vaddr)?;
    a.cmp(dword_ptr(rcx + RWH_ON_FULL as i32), ON_FULL_WAIT)?;
    a.je(l.armed.enter)?;
    a.xor(edx, edx)?;
    a.set_label(&mut l.again)?;
    a.mov(rax, qword_ptr(rsi + SLOT_CUR as i32))?;
    a.set_label(&mut l.probe)?;
    a.db(&[0x0f, 0x1f, 0x40, 0x00])?;
    a.test(rdx, rdx)?;
    a.jne(l.armed.after)?;
    a.cmp(qword_ptr(rsi + SLOT_INFLIGHT as i32), 0)?;
    a.jne(l.flush_done)?;
    a.mov(rcx, qword_ptr(rsi + SLOT_CUR as i32))?;
    a.cmp(rcx, qword_ptr(rsi + SLOT_END as i32))?;
    a.jb(l.flush_done)?;
    a.mov(rcx, qword_ptr(rsi + SLOT_RW_BASE as i32))?;
    a.cmp(dword_ptr(rcx + RWH_USER_STATE as i32), USER_ON)?;
    a.je(l.flush_user)?;
    // Kept only while half the slack is still free (then reset as before: lost).
    let mut reset = a.create_label();
    a.cmp(rax, qword_ptr(rsi + SLOT_CUR as i32))?;
    a.je(reset)?;
    a.mov(rcx, qword_ptr(rsi + SLOT_END as i32))?;
    a.add(rcx, (BUF_SLACK_RECORDS / 2 * RECORD_SIZE as u64) as i32)?;
    a.cmp(qword_ptr(rsi + SLOT_CUR as i32), rcx)?;
    a.jb(l.flush_done)?;
    a.set_label(&mut reset)?;
    reset_buffer(a)?;
    a.set_label(&mut l.flush_done)?;
    a.pop(rdx)?;
    a.ret()?;
    a.set_label(&mut l.flush_user)?;
    a.mov(r10, chunk_kind_cause(CHUNK_KIND_RECORDS, CAUSE_FULL))?;
    a.call(l.user_drain)?;
    a.pop(rdx)?;
    a.ret()?;
    // register's flush: the drain answers whether the tracer waits (signals are
    // held in register).
    a.set_label(&mut l.hello)?;
    a.push(rdx)?;
    a.mov(rdx, FLUSH_HELLO)?;
    a.jmp(l.again)?;
    Ok(())
}

/// Process entry of a static executable: a stand-in thread pointer until libc sets the
/// real one. %rdx (rtld_fini) and %rsp must survive; the rest is scratch.
fn emit_shim(
    a: &mut CodeAssembler,
    layout: &Layout,
    shim: &mut CodeLabel,
    original_entry: u64,
) -> Result<(), IcedError> {
    a.set_label(shim)?;
    lea_rip(a, Register::RSI, layout.rw_vaddr + PRE_TLS_OFF)?;
    a.mov(qword_ptr(rsi), rsi)?; // TCB self pointer: %fs:0 reads the TCB address
    a.mov(edi, ARCH_SET_FS)?;
    a.mov(eax, SYS_ARCH_PRCTL)?;
    a.syscall()?;
    a.jmp(original_entry)
}

/// register(%r11 = thread pointer) → %rcx != 0 when the thread now owns a slot.
///
/// Called from a stub that saved %rax %rcx %rdx %rsi %r11; everything else, flags
/// included, is preserved. Signals are blocked while it runs (two rt_sigprocmask
/// calls, once per thread). Steps: (1) a slot already keyed by this thread pointer
/// (index collision) → just re-point the index; (2) claim a free or tombstoned slot
/// with `lock cmpxchg`; (3) else reclaim a slot whose owner thread is dead (`tgkill(pid,
/// tid, 0)` = -ESRCH); (4) else count a dropped record and fail. A claimed slot is
/// initialised, the index entry installed, and the flush function called once on the
/// empty buffer so that a tracer learns about the slot.
/// The routines `register` calls.
struct RegisterCalls {
    flush: CodeLabel,
    hello: CodeLabel,
    take_hold: CodeLabel,
    user_drain: CodeLabel,
    user_send: CodeLabel,
}

fn emit_register(
    a: &mut CodeAssembler,
    l: &Layout,
    register: &mut CodeLabel,
    c: &RegisterCalls,
) -> Result<(), IcedError> {
    let mut lb = RegisterLabels {
        scan: a.create_label(),
        claim: a.create_label(),
        claim_next: a.create_label(),
        reclaim: a.create_label(),
        reclaim_next: a.create_label(),
        claimed: a.create_label(),
        found: a.create_label(),
        done: a.create_label(),
        pre_tls_slot: a.create_label(),
        no_handover: a.create_label(),
    };
    a.set_label(register)?;
    register_enter(a, l, &mut lb)?;
    register_own_or_claim(a, l, &mut lb)?;
    register_reclaim(a, l, &mut lb)?;
    register_init(a, l, &mut lb)?;
    if l.pre_tls {
        register_handover(a, &mut lb, c.flush, c.user_drain)?;
    }
    emit_user_discovery(a, c.user_send)?;
    emit_attach_wait(a)?;
    // An empty drain: tells the tracer about this slot; a tracer that waits for room
    // answers with HOLD_SIGNAL (signals are held here).
    a.call(c.hello)?;
    a.call(c.take_hold)?;
    a.test(eax, eax)?;
    a.je(lb.found)?; // register_index follows
    a.mov(dword_ptr(rdx + RWH_ON_FULL as i32), ON_FULL_WAIT)?;
    register_index(a, l, &mut lb)?;
    register_leave(a, &mut lb)
}

/// The jump targets inside `register`.
struct RegisterLabels {
    scan: CodeLabel,
    claim: CodeLabel,
    claim_next: CodeLabel,
    reclaim: CodeLabel,
    reclaim_next: CodeLabel,
    claimed: CodeLabel,
    found: CodeLabel,
    done: CodeLabel,
    pre_tls_slot: CodeLabel,
    no_handover: CodeLabel,
}

/// Offset of a slot from the RW base.
fn slot_at(n: u32) -> i32 {
    (SLOTS_OFF + n as u64 * SLOT_SIZE) as i32
}

/// Offset of the stand-in TCB key of static executables from the RW base.
const PRE_TLS_KEY_OFF: i32 = PRE_TLS_OFF as i32;

/// Save registers and flags, block signals; %r8 = tp, %r13 = KEY_CLAIMING, %rdx =
/// rw_base.
fn register_enter(
    a: &mut CodeAssembler,
    l: &Layout,
    lb: &mut RegisterLabels,
) -> Result<(), IcedError> {
    a.pushfq()?;
    for r in [rdi, r8, r9, r10, r12, r13] {
        a.push(r)?;
    }
    a.mov(r8, r11)?; // r8 = tp (before any syscall clobbers r11)
    // Block signals: a handler that records while we hold a half-made claim would
    // claim a second slot for this thread. [rsp] = all signals, [rsp+8] = old mask.
    a.sub(rsp, 16)?;
    a.mov(qword_ptr(rsp), -1)?;
    a.mov(edi, SIG_BLOCK)?;
    a.mov(rsi, rsp)?;
    a.lea(rdx, ptr(rsp + 8))?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()?;
    a.mov(r13d, KEY_CLAIMING as u32)?;
    lea_rip(a, Register::RDX, l.rw_vaddr)?; // rdx = rw_base

    // Static executables before libc's TLS: the stand-in TCB always maps to slot 1.
    if l.pre_tls {
        a.lea(rax, ptr(rdx + PRE_TLS_KEY_OFF))?;
        a.cmp(r8, rax)?;
        a.je(lb.pre_tls_slot)?;
    }

    Ok(())
}

/// (1) a slot this thread already owns (→ `found`), (2) claim a free or tombstoned
/// one (→ `claimed`).
fn register_own_or_claim(
    a: &mut CodeAssembler,
    l: &Layout,
    lb: &mut RegisterLabels,
) -> Result<(), IcedError> {
    // (1) already own a slot?
    a.lea(rsi, ptr(rdx + slot_at(FIRST_FREE_SLOT)))?;
    a.mov(ecx, l.nslots - FIRST_FREE_SLOT)?;
    a.set_label(&mut lb.scan)?;
    a.cmp(qword_ptr(rsi), r8)?;
    a.je(lb.found)?;
    a.add(rsi, SLOT_SIZE as i32)?;
    a.dec(ecx)?;
    a.jnz(lb.scan)?;

    // (2) claim a free or tombstoned slot.
    a.lea(rsi, ptr(rdx + slot_at(FIRST_FREE_SLOT)))?;
    a.mov(r9d, l.nslots - FIRST_FREE_SLOT)?;
    a.set_label(&mut lb.claim)?;
    a.mov(rax, qword_ptr(rsi))?;
    a.cmp(rax, KEY_TOMBSTONE as i32)?;
    a.ja(lb.claim_next)?;
    a.lock().cmpxchg(qword_ptr(rsi), r13)?;
    a.je(lb.claimed)?;
    a.set_label(&mut lb.claim_next)?;
    a.add(rsi, SLOT_SIZE as i32)?;
    a.dec(r9d)?;
    a.jnz(lb.claim)?;

    Ok(())
}

/// (3) reclaim a slot of a dead thread (→ `claimed`), (4) else count a drop and fail.
fn register_reclaim(
    a: &mut CodeAssembler,
    l: &Layout,
    lb: &mut RegisterLabels,
) -> Result<(), IcedError> {
    // (3) reclaim a slot whose owner died without a tracer releasing it.
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(r12d, eax)?; // r12 = pid (rdx survives syscalls)
    a.lea(rsi, ptr(rdx + slot_at(FIRST_FREE_SLOT)))?;
    a.mov(r9d, l.nslots - FIRST_FREE_SLOT)?;
    a.set_label(&mut lb.reclaim)?;
    a.push(rdx)?;
    a.mov(edi, r12d)?;
    a.mov(r10d, dword_ptr(rsi + SLOT_OWNER_TID as i32))?;
    a.mov(eax, SYS_TGKILL)?;
    a.push(rsi)?;
    a.mov(esi, r10d)?;
    a.xor(edx, edx)?;
    a.syscall()?;
    a.pop(rsi)?;
    a.pop(rdx)?;
    a.cmp(eax, -(ESRCH as i32))?;
    a.jne(lb.reclaim_next)?;
    a.mov(rax, qword_ptr(rsi))?;
    a.cmp(rax, KEY_CLAIMING as i32)?;
    a.jbe(lb.reclaim_next)?;
    a.lock().cmpxchg(qword_ptr(rsi), r13)?;
    a.je(lb.claimed)?;
    a.set_label(&mut lb.reclaim_next)?;
    a.add(rsi, SLOT_SIZE as i32)?;
    a.dec(r9d)?;
    a.jnz(lb.reclaim)?;

    a.lock().inc(qword_ptr(rdx + RWH_NO_SLOT_DROPS as i32))?;
    a.xor(ecx, ecx)?;
    a.jmp(lb.done)?;

    Ok(())
}

/// Initialise the claimed slot (%rsi) and publish its key.
fn register_init(
    a: &mut CodeAssembler,
    l: &Layout,
    lb: &mut RegisterLabels,
) -> Result<(), IcedError> {
    if l.pre_tls {
        a.set_label(&mut lb.pre_tls_slot)?;
        a.lea(rsi, ptr(rdx + slot_at(SLOT_PRE_TLS)))?;
        a.cmp(qword_ptr(rsi), r8)?;
        a.je(lb.found)?;
        a.mov(qword_ptr(rsi), KEY_CLAIMING as i32)?;
        // fall through into `claimed` with rsi = slot 1
    }

    // rsi = claimed slot: initialise it.
    a.set_label(&mut lb.claimed)?;
    a.mov(rax, rsi)?;
    a.sub(rax, rdx)?;
    a.sub(rax, SLOTS_OFF as i32)?;
    a.shr(rax, 6)?; // slot number (SLOT_SIZE = 64)
    a.mov(rcx, buf_stride(l.buf_kind, l.buf_bytes))?;
    a.imul_2(rax, rcx)?;
    a.add(rax, rdx)?;
    a.mov(rcx, bufs_off(l.nslots))?;
    a.add(rax, rcx)?;
    a.mov(qword_ptr(rsi + SLOT_START as i32), rax)?;
    a.mov(qword_ptr(rsi + SLOT_CUR as i32), rax)?;
    a.mov(rcx, l.buf_bytes)?;
    a.add(rax, rcx)?;
    a.mov(qword_ptr(rsi + SLOT_END as i32), rax)?;
    a.mov(qword_ptr(rsi + SLOT_RW_BASE as i32), rdx)?;
    a.mov(rax, l.binary_id)?;
    a.mov(qword_ptr(rsi + SLOT_BINARY_ID as i32), rax)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(dword_ptr(rsi + SLOT_OWNER_TID as i32), eax)?;
    a.inc(dword_ptr(rsi + SLOT_GENERATION as i32))?;
    a.mov(qword_ptr(rsi + SLOT_INFLIGHT as i32), 0)?;
    a.mov(qword_ptr(rsi), r8)?; // publish: now the thread's stubs can hit it
    a.lock().inc(qword_ptr(rdx + RWH_REGISTRATIONS as i32))?;
    Ok(())
}

/// Static executables: hand what the thread recorded in the pre-TLS slot over.
fn register_handover(
    a: &mut CodeAssembler,
    lb: &mut RegisterLabels,
    flush: CodeLabel,
    user_drain: CodeLabel,
) -> Result<(), IcedError> {
    // The thread got its real thread pointer: hand over what it recorded before
    // (slot 1) and release slot 1.
    a.lea(rdi, ptr(rdx + slot_at(SLOT_PRE_TLS)))?;
    a.cmp(rdi, rsi)?;
    a.je(lb.no_handover)?;
    a.lea(rcx, ptr(rdx + PRE_TLS_KEY_OFF))?;
    a.cmp(qword_ptr(rdi), rcx)?;
    a.jne(lb.no_handover)?;
    a.cmp(dword_ptr(rdi + SLOT_OWNER_TID as i32), eax)?;
    a.jne(lb.no_handover)?;
    a.push(rsi)?;
    a.mov(rsi, rdi)?;
    let mut handover_probe = a.create_label();
    let mut handover_done = a.create_label();
    a.cmp(dword_ptr(rdx + RWH_USER_STATE as i32), USER_ON)?;
    a.jne(handover_probe)?;
    a.push(rdx)?;
    a.push(r8)?;
    a.mov(r10, chunk_kind_cause(CHUNK_KIND_RECORDS, CAUSE_FULL))?;
    a.call(user_drain)?;
    a.pop(r8)?;
    a.pop(rdx)?;
    a.jmp(handover_done)?;
    a.set_label(&mut handover_probe)?;
    a.call(flush)?;
    a.set_label(&mut handover_done)?;
    a.mov(qword_ptr(rsi), KEY_TOMBSTONE as i32)?;
    a.pop(rsi)?;
    a.set_label(&mut lb.no_handover)?;
    Ok(())
}

/// `found`: point index[h(tp)] (and the thread word) at the slot, %rcx = 1.
fn register_index(
    a: &mut CodeAssembler,
    l: &Layout,
    lb: &mut RegisterLabels,
) -> Result<(), IcedError> {
    // rsi = this thread's slot: point index[h(tp)] at it. The index stays the way
    // the eBPF exit drains find a slot from the task's FS base.
    a.set_label(&mut lb.found)?;
    a.mov(rax, r8)?;
    a.shr(rax, 16)?;
    a.movzx(eax, ax)?;
    a.mov(rcx, rsi)?;
    a.sub(rcx, rdx)?;
    a.sub(rcx, SLOTS_OFF as i32)?;
    a.mov(dword_ptr(rdx + rax * 4 + INDEX_OFF as i32), ecx)?;
    if let SlotLookup::ThreadWord(off) = l.slot_lookup {
        a.mov(dword_ptr(i64::from(off) as u64).fs(), ecx)?;
    }
    a.mov(ecx, 1)?;

    Ok(())
}

/// `done`: restore the signal mask, registers and flags; return %rcx.
fn register_leave(a: &mut CodeAssembler, lb: &mut RegisterLabels) -> Result<(), IcedError> {
    a.set_label(&mut lb.done)?;
    a.mov(r12d, ecx)?;
    a.mov(edi, SIG_SETMASK)?;
    a.lea(rsi, ptr(rsp + 8))?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()?;
    a.mov(ecx, r12d)?;
    a.add(rsp, 16)?;
    for r in [r13, r12, r10, r9, r8, rdi] {
        a.pop(r)?;
    }
    a.popfq()?;
    a.ret()?;
    Ok(())
}

const fn chunk_kind_cause(kind: u32, cause: u32) -> u64 {
    kind as u64 | (cause as u64) << 32
}

/// In `register` after a slot was claimed (%rsi = slot, %rdx = rw_base, %r8 = tp):
/// decide once per process whether the user-space drain is on (descriptor
/// USER_DRAIN_FD is a SOCK_SEQPACKET socket; a SOCK_STREAM one: `USER_SESSION`), and
/// if so tell the tracer about the slot. Only a process that is dumpable joins
/// (`prctl(PR_GET_DUMPABLE)` = 1: not setuid, setgid or given file capabilities at exec)
/// and only a peer that is root or this process's effective user
/// ([`emit_peer_trusted`]): else whoever put a socket at that descriptor would read a
/// privileged program's records, or make it wait. Refused: `USER_OFF`, no wait.
/// Clobbers %rax %rcx %rdi %r9 %r10 %r11.
fn emit_user_discovery(a: &mut CodeAssembler, user_send: CodeLabel) -> Result<(), IcedError> {
    let mut known = a.create_label();
    let mut decided = a.create_label();
    let mut off = a.create_label();
    a.cmp(dword_ptr(rdx + RWH_USER_STATE as i32), USER_UNKNOWN)?;
    a.jne(known)?;
    for r in [rdx, rsi, r8] {
        a.push(r)?;
    }
    a.sub(rsp, 16)?; // [rsp] = option value, [rsp+8] = its length
    a.mov(edi, PR_GET_DUMPABLE)?;
    for r in [esi, edx, r10d, r8d] {
        a.xor(r, r)?;
    }
    a.mov(eax, SYS_PRCTL)?;
    a.syscall()?;
    a.mov(ecx, USER_OFF)?;
    a.cmp(rax, SUID_DUMP_USER as i32)?;
    a.jne(decided)?;
    a.mov(dword_ptr(rsp + 8), 4)?;
    a.mov(edi, USER_DRAIN_FD)?;
    a.mov(esi, SOL_SOCKET)?;
    a.mov(edx, SO_TYPE)?;
    a.mov(r10, rsp)?;
    a.lea(r8, ptr(rsp + 8))?;
    a.mov(eax, SYS_GETSOCKOPT)?;
    a.syscall()?;
    a.mov(ecx, USER_OFF)?;
    let mut is_socket = a.create_label();
    let mut check_peer = a.create_label();
    a.test(rax, rax)?;
    a.je(is_socket)?;
    a.cmp(rax, -(EBADF as i32))?;
    a.jne(decided)?;
    emit_session_connect(a)?;
    a.jmp(decided)?;
    a.set_label(&mut is_socket)?;
    a.mov(ecx, USER_ON)?;
    a.cmp(dword_ptr(rsp), SOCK_SEQPACKET)?;
    a.je(check_peer)?;
    a.mov(ecx, USER_SESSION)?;
    a.cmp(dword_ptr(rsp), SOCK_STREAM)?;
    a.je(check_peer)?;
    a.mov(ecx, USER_OFF)?;
    a.jmp(decided)?;
    a.set_label(&mut check_peer)?;
    a.mov(r9d, ecx)?;
    a.mov(edi, USER_DRAIN_FD)?;
    emit_peer_trusted(a)?;
    a.mov(ecx, r9d)?;
    a.test(eax, eax)?;
    a.je(decided)?;
    a.mov(ecx, USER_OFF)?;
    a.set_label(&mut decided)?;
    a.add(rsp, 16)?;
    for r in [r8, rsi, rdx] {
        a.pop(r)?;
    }
    a.mov(dword_ptr(rdx + RWH_USER_FD as i32), USER_DRAIN_FD)?;
    a.mov(dword_ptr(rdx + RWH_USER_STATE as i32), ecx)?;
    a.set_label(&mut known)?;
    a.cmp(dword_ptr(rdx + RWH_USER_STATE as i32), USER_ON)?;
    a.jne(off)?;
    // Payload [slot, rw_base] on the stack.
    a.push(r8)?;
    a.push(rdx)?;
    a.push(rsi)?;
    a.mov(r8, rsp)?;
    a.mov(r9d, 16u32)?;
    a.mov(r10, chunk_kind_cause(CHUNK_KIND_SLOT, CAUSE_REGISTER))?;
    a.xor(ecx, ecx)?;
    a.call(user_send)?;
    a.pop(rsi)?;
    a.pop(rdx)?;
    a.pop(r8)?;
    a.set_label(&mut off)?;
    Ok(())
}

/// %edi = a connected Unix socket: %eax = 0 when the process at its other end
/// (`SO_PEERCRED`: its effective uid when it made the socket) is root or this process's
/// effective user, else non-zero. `getsockopt`, and `geteuid` unless the peer is root.
/// Clobbers %rax %rcx %rdx %rsi %rdi %r8 %r10 %r11; keeps %r9.
fn emit_peer_trusted(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let (mut refuse, mut done) = (a.create_label(), a.create_label());
    a.sub(rsp, 32)?; // [rsp] = struct ucred, [rsp+16] = its length
    a.mov(dword_ptr(rsp + 16), UCRED_SIZE)?;
    a.mov(esi, SOL_SOCKET)?;
    a.mov(edx, SO_PEERCRED)?;
    a.mov(r10, rsp)?;
    a.lea(r8, ptr(rsp + 16))?;
    a.mov(eax, SYS_GETSOCKOPT)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jne(refuse)?;
    a.mov(eax, dword_ptr(rsp + UCRED_UID as i32))?;
    a.test(eax, eax)?;
    a.je(done)?; // root
    a.mov(r8d, eax)?;
    a.mov(eax, SYS_GETEUID)?;
    a.syscall()?;
    a.xor(eax, r8d)?; // 0: ourselves
    a.jmp(done)?;
    a.set_label(&mut refuse)?;
    a.mov(eax, 1)?;
    a.set_label(&mut done)?;
    a.add(rsp, 32)?;
    Ok(())
}

/// No descriptor USER_DRAIN_FD: connect to a system-wide session's socket
/// (`SESSION_SOCKET`, abstract: any user may have bound the name); connected to a
/// trusted listener ([`emit_peer_trusted`]), the socket becomes USER_DRAIN_FD
/// (close-on-exec) and %ecx = `USER_SESSION`, else it is closed and %ecx = `USER_OFF`.
/// Three system calls when no session listens. Clobbers %rax %rcx %rdx %rsi %rdi %r8
/// %r9 %r10 %r11 (the caller saved %rdx %rsi %r8).
fn emit_session_connect(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let (mut close, mut off, mut done) = (a.create_label(), a.create_label(), a.create_label());
    a.mov(edi, AF_UNIX)?;
    a.mov(esi, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_SOCKET)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(off)?;
    a.mov(r9, rax)?;
    // struct sockaddr_un: the family, then the abstract name.
    a.sub(rsp, 32)?;
    a.mov(word_ptr(rsp), AF_UNIX)?;
    let name = |from: usize| {
        let mut b = [0u8; 8];
        for (d, s) in b.iter_mut().zip(&SESSION_SOCKET[from..]) {
            *d = *s;
        }
        u64::from_le_bytes(b)
    };
    a.mov(rax, name(0))?;
    a.mov(qword_ptr(rsp + 2), rax)?;
    a.mov(rax, name(8))?;
    a.mov(qword_ptr(rsp + 10), rax)?;
    a.mov(edi, r9d)?;
    a.mov(rsi, rsp)?;
    a.mov(edx, (2 + SESSION_SOCKET.len()) as u32)?;
    a.mov(eax, SYS_CONNECT)?;
    a.syscall()?;
    a.add(rsp, 32)?;
    a.test(rax, rax)?;
    a.jne(close)?;
    a.mov(edi, r9d)?;
    emit_peer_trusted(a)?;
    a.test(eax, eax)?;
    a.jne(close)?;
    a.mov(edi, r9d)?;
    a.mov(esi, USER_DRAIN_FD)?;
    a.mov(edx, O_CLOEXEC)?;
    a.mov(eax, SYS_DUP3)?;
    a.syscall()?;
    a.mov(r10, rax)?;
    a.mov(edi, r9d)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.test(r10, r10)?;
    a.js(off)?;
    a.mov(ecx, USER_SESSION)?;
    a.jmp(done)?;
    a.set_label(&mut close)?;
    a.mov(edi, r9d)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.set_label(&mut off)?;
    a.mov(ecx, USER_OFF)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// In `register`, a process that a session started (`USER_SESSION`): wait until the
/// tracer has attached this binary (`RwHeader::attached`), polling the
/// session's descriptor (`ATTACH_POLLS` × `ATTACH_POLL_NS`), then tell the session how
/// it went (`ATTACH_DONE`, or `ATTACH_GAVE_UP` when the time ran out; nothing when its
/// end closed) and stop looking (`USER_OFF`): one such system call per binary and
/// process. Keeps %rdx %rsi %r8; clobbers %rax %rcx %rdi %r9 %r10 %r11.
fn emit_attach_wait(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let (mut poll, mut tell, mut attached, mut off, mut done) = (
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
    );
    a.cmp(dword_ptr(rdx + RWH_USER_STATE as i32), USER_SESSION)?;
    a.jne(done)?;
    for r in [rdx, rsi, r8] {
        a.push(r)?;
    }
    // [rsp] = struct pollfd, [rsp+8] = struct timespec, [rsp+24] = the outcome byte
    a.sub(rsp, 32)?;
    a.cmp(dword_ptr(rdx + RWH_ATTACHED as i32), ATTACHED)?;
    a.je(attached)?;
    a.mov(r9d, ATTACH_POLLS)?;
    a.set_label(&mut poll)?;
    a.mov(dword_ptr(rsp), USER_DRAIN_FD)?;
    a.mov(dword_ptr(rsp + 4), POLLIN)?; // events; revents = 0
    a.mov(qword_ptr(rsp + 8), 0)?;
    a.mov(qword_ptr(rsp + 16), ATTACH_POLL_NS as i32)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, 1)?;
    a.lea(rdx, ptr(rsp + 8))?;
    a.xor(r10d, r10d)?;
    a.xor(r8d, r8d)?;
    a.mov(eax, SYS_PPOLL)?;
    a.syscall()?;
    // The tracer never writes: ready means its end closed (or an error).
    a.test(rax, rax)?;
    a.jne(off)?;
    a.mov(rax, qword_ptr(rsp + 48))?; // rw_base, pushed first
    a.cmp(dword_ptr(rax + RWH_ATTACHED as i32), ATTACHED)?;
    a.je(attached)?;
    a.dec(r9d)?;
    a.jne(poll)?;
    a.mov(byte_ptr(rsp + 24), ATTACH_GAVE_UP as u32)?;
    a.jmp(tell)?;
    a.set_label(&mut attached)?;
    a.mov(byte_ptr(rsp + 24), ATTACH_DONE as u32)?;
    a.set_label(&mut tell)?;
    a.mov(edi, USER_DRAIN_FD)?;
    a.lea(rsi, ptr(rsp + 24))?;
    a.mov(edx, 1)?;
    a.mov(r10d, MSG_NOSIGNAL | MSG_DONTWAIT)?;
    a.xor(r8d, r8d)?;
    a.xor(r9d, r9d)?;
    a.mov(eax, SYS_SENDTO)?;
    a.syscall()?;
    a.set_label(&mut off)?;
    a.add(rsp, 32)?;
    for r in [r8, rsi, rdx] {
        a.pop(r)?;
    }
    a.mov(dword_ptr(rdx + RWH_USER_STATE as i32), USER_OFF)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// user_drain(%rsi = slot, %r10 = kind | cause << 32): send `[start, cur)` in messages of
/// at most USER_MSG_RECORDS records, then reset the buffer. Preserves %rsi, %rdi,
/// %r8-%r10; clobbers %rax %rcx %rdx %r11 and flags.
fn emit_user_drain(
    a: &mut CodeAssembler,
    label: &mut CodeLabel,
    user_send: CodeLabel,
) -> Result<(), IcedError> {
    let mut next = a.create_label();
    let mut small = a.create_label();
    let mut done = a.create_label();
    let max = (USER_MSG_RECORDS * RECORD_SIZE as u64) as i32;
    a.set_label(label)?;
    for r in [rdi, r8, r9, r10, r12, r13] {
        a.push(r)?;
    }
    // Block signals while sending: a handler that filled the buffer again would send
    // the records we are sending a second time. [rsp] = all signals, [rsp+8] = old mask.
    a.sub(rsp, 16)?;
    a.mov(qword_ptr(rsp), -1)?;
    a.push(rsi)?;
    a.mov(edi, SIG_BLOCK)?;
    a.lea(rsi, ptr(rsp + 8))?;
    a.lea(rdx, ptr(rsp + 16))?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()?;
    a.pop(rsi)?;
    a.mov(r12, qword_ptr(rsp + 32))?; // kind | cause: the caller's %r10, saved above
    a.mov(r13, qword_ptr(rsi + SLOT_START as i32))?; // next record to send
    a.set_label(&mut next)?;
    a.mov(r9, qword_ptr(rsi + SLOT_CUR as i32))?;
    a.sub(r9, r13)?;
    a.jbe(done)?;
    a.cmp(r9, max)?;
    a.jbe(small)?;
    a.mov(r9d, max as u32)?;
    a.set_label(&mut small)?;
    a.mov(r8, r13)?;
    a.add(r13, r9)?;
    a.mov(rcx, r9)?;
    a.shr(rcx, 5)?; // RECORD_SIZE = 32
    a.mov(r10, r12)?;
    a.call(user_send)?;
    a.jmp(next)?;
    a.set_label(&mut done)?;
    a.mov(rcx, qword_ptr(rsi + SLOT_START as i32))?;
    a.mov(qword_ptr(rsi + SLOT_CUR as i32), rcx)?;
    a.push(rsi)?;
    a.mov(edi, SIG_SETMASK)?;
    a.lea(rsi, ptr(rsp + 16))?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()?;
    a.pop(rsi)?;
    a.add(rsp, 16)?;
    for r in [r13, r12, r10, r9, r8, rdi] {
        a.pop(r)?;
    }
    a.ret()?;
    a.int3()?;
    Ok(())
}

/// user_send(%rsi = slot, %r8 = payload, %r9 = payload bytes, %r10 = kind | cause << 32,
/// %ecx = record count): one `sendmsg(USER_DRAIN_FD, [ChunkHeader, payload],
/// MSG_NOSIGNAL)`, retried on EINTR. Any other failure (the tracer is gone) turns the
/// drain off for the process. Preserves %rsi; clobbers %rax %rcx %rdx %rdi %r8-%r11.
fn emit_user_send(a: &mut CodeAssembler, label: &mut CodeLabel) -> Result<(), IcedError> {
    let mut retry = a.create_label();
    let mut sent = a.create_label();
    a.set_label(label)?;
    a.sub(rsp, 144)?;
    a.mov(qword_ptr(rsp + 136), rsi)?;
    // ChunkHeader at [rsp]: kind, count, pid, tid, seq, binary_id, cause, pad, time.
    const HDR_LEN: i32 = 48;
    const _: () = assert!(core::mem::size_of::<tracer_common::ChunkHeader>() == HDR_LEN as usize);
    a.mov(dword_ptr(rsp), r10d)?;
    a.mov(dword_ptr(rsp + 4), ecx)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(dword_ptr(rsp + 8), eax)?;
    a.mov(eax, dword_ptr(rsi + SLOT_OWNER_TID as i32))?;
    a.mov(dword_ptr(rsp + 12), eax)?;
    a.mov(rdx, qword_ptr(rsi + SLOT_RW_BASE as i32))?;
    a.mov(eax, 1)?;
    a.lock().xadd(qword_ptr(rdx + RWH_USER_SEQ as i32), rax)?;
    a.mov(qword_ptr(rsp + 16), rax)?;
    a.mov(rax, qword_ptr(rsi + SLOT_BINARY_ID as i32))?;
    a.mov(qword_ptr(rsp + 24), rax)?;
    a.mov(rax, r10)?;
    a.shr(rax, 32)?;
    a.mov(qword_ptr(rsp + 32), rax)?; // cause, pad = 0
    a.mov(qword_ptr(rsp + 40), 0)?; // time: the tracer stamps it on receipt
    // iovec[2] at [rsp+48]
    a.mov(qword_ptr(rsp + 48), rsp)?;
    a.mov(qword_ptr(rsp + 56), HDR_LEN)?;
    a.mov(qword_ptr(rsp + 64), r8)?;
    a.mov(qword_ptr(rsp + 72), r9)?;
    // msghdr at [rsp+80]: name, namelen, iov, iovlen, control, controllen, flags
    a.xor(eax, eax)?;
    a.mov(qword_ptr(rsp + 80), rax)?;
    a.mov(qword_ptr(rsp + 88), rax)?;
    a.lea(rax, ptr(rsp + 48))?;
    a.mov(qword_ptr(rsp + 96), rax)?;
    a.mov(qword_ptr(rsp + 104), 2)?;
    a.mov(qword_ptr(rsp + 112), 0)?;
    a.mov(qword_ptr(rsp + 120), 0)?;
    a.mov(qword_ptr(rsp + 128), 0)?;
    a.mov(r8, rdx)?; // rw_base
    a.set_label(&mut retry)?;
    a.mov(edi, dword_ptr(r8 + RWH_USER_FD as i32))?;
    a.lea(rsi, ptr(rsp + 80))?;
    a.mov(edx, MSG_NOSIGNAL)?;
    a.mov(eax, SYS_SENDMSG)?;
    a.syscall()?;
    a.cmp(rax, -(EINTR as i32))?;
    a.je(retry)?;
    a.test(rax, rax)?;
    a.jns(sent)?;
    a.mov(dword_ptr(r8 + RWH_USER_STATE as i32), USER_OFF)?;
    a.set_label(&mut sent)?;
    a.mov(rsi, qword_ptr(rsp + 136))?;
    a.add(rsp, 144)?;
    a.ret()?;
    a.int3()?;
    Ok(())
}
