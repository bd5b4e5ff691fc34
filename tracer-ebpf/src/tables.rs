//! A process's RW areas (its `TABLES` entry): learning them at flushes, and the walks
//! over them (exit drains, uprobe sites, forks). One `bpf_loop` callback per walk rather
//! than an unrolled loop: the verifier then checks the body once instead of once per
//! table entry.
//!
//! In a system-wide session (`SYSTEM_WIDE`: every process a target) `fork` copies a
//! parent's entry to the child and `exec` forgets it. One uid's processes hold at most
//! half of `TABLES` (`TABLES_PER_UID`): every new entry, the tracer's seed, one learned
//! at a flush or copied at `fork`, is charged to the process's real uid (`TABLE_OWNERS`
//! tgid → uid, `TABLE_UIDS` uid → count, given back wherever an entry is removed: exec,
//! a thread's or process's exit) and refused past the share (such a process is not
//! drained at exit; counted, `STAT_TABLE_SHARE`; test `trust_tables`). The charges here
//! are atomic; the tracer's seeds are not, so a race with a flush may leave a count off
//! by one, never below 0.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_uid_gid, generated::bpf_loop},
};
use tracer_common::{
    KEY_CLAIMING, RW_MAGIC, RWH_BINARY_ID, SLOT_KEY, SLOT_OWNER_TID,
    ebpf::{TABLE_BINARIES, TABLES_PER_UID},
};

use crate::{
    arch::{THREAD_POINTER_MAY_BE_STALE, thread_pointer},
    atomic,
    maps::{
        EXIT_DRAINED, EXIT_STEPS, EXIT_WORK, ExitWork, SYSTEM_WIDE, TABLE_OWNERS, TABLE_UIDS,
        TABLES,
    },
    slots::{AFTER_RELEASE, drain_slot, find_slot, find_slot_by_tid, inherit, pre_tls_slot},
    user::read_user,
};

const INDEX_MASK: u64 = TABLE_BINARIES as u64 - 1;
const _: () = assert!(TABLE_BINARIES.is_power_of_two());

/// Error of [`remember_rw_base`] (reported by the caller): no room for one more RW
/// area in the process's entry.
pub(crate) const E_TABLE_FULL: i64 = -1000;
/// Error of [`remember_rw_base`]: the address is not an RW area (no `RW_MAGIC`).
pub(crate) const E_BAD_RW: i64 = -1001;
/// Error of [`remember_rw_base`] and [`claim_table`]: the process has no entry and its
/// user holds `TABLES_PER_UID` entries already.
pub(crate) const E_TABLE_SHARE: i64 = -1002;

/// Record that process `tgid` has an instrumented binary whose RW area is at `rw_base`.
/// Called on every flush (cheap when already known), so a process that was running
/// before the session started is learned at its first flush.
#[inline(never)]
pub(crate) fn remember_rw_base(tgid: u32, rw_base: u64) -> i64 {
    if let Some(p) = TABLES.get_ptr(tgid) {
        // SAFETY: p points at a live TABLES value.
        let known = unsafe { *p };
        for v in known {
            if v == rw_base {
                return 0;
            }
        }
    }
    // New: make sure it is an RW area before trusting it.
    if read_user::<u64>(rw_base) != Ok(RW_MAGIC) {
        return E_BAD_RW;
    }
    if TABLES.get_ptr(tgid).is_none() {
        // A new entry is charged to the user first (0 = charged; 1 = another thread of
        // the process charged it: add to its entry below).
        let charged = claim_table(tgid, bpf_get_current_uid_gid() as u32);
        if charged < 0 {
            return charged;
        }
        let mut v = [0u64; TABLE_BINARIES];
        v[0] = rw_base;
        if TABLES.insert(tgid, v, BPF_NOEXIST as u64).is_ok() {
            return 0;
        }
        if charged == 0 && TABLES.get_ptr(tgid).is_none() {
            // No room in TABLES: the charge goes back.
            release_owner(tgid);
            return E_TABLE_FULL;
        }
        // Lost a race with another thread of the process: add to its entry below.
    }
    let Some(p) = TABLES.get_ptr_mut(tgid) else {
        return E_TABLE_FULL;
    };
    for i in 0..TABLE_BINARIES {
        // SAFETY: p points at TABLE_BINARIES u64s of a live map value; i is in bounds.
        let old = unsafe { atomic::cmpxchg(p.cast::<u64>().add(i), 0, rw_base) };
        if old == 0 || old == rw_base {
            return 0;
        }
    }
    E_TABLE_FULL
}

/// Charge a new `TABLES` entry of process (or thread) `id` to `uid`, within its share
/// (`TABLES_PER_UID`, the tracer's seeds counted too): 0 = charged (the caller adds the
/// entry, or calls [`release_owner`] if it cannot), 1 = `id` is charged already,
/// [`E_TABLE_SHARE`] = refused.
#[inline(never)]
pub(crate) fn claim_table(id: u32, uid: u32) -> i64 {
    if TABLE_UIDS.get_ptr(uid).is_none() {
        let _ = TABLE_UIDS.insert(uid, 0u64, BPF_NOEXIST as u64);
    }
    let Some(count) = TABLE_UIDS.get_ptr_mut(uid) else {
        return E_TABLE_SHARE;
    };
    // SAFETY: count points at a live u64 map value.
    let before = unsafe { atomic::fetch_add(count, 1) };
    // Capped in system-wide sessions only (one user's session may use all of TABLES).
    if before >= TABLES_PER_UID as u64 && SYSTEM_WIDE.load() != 0 {
        uncharge(uid);
        return E_TABLE_SHARE;
    }
    if TABLE_OWNERS.insert(id, uid, BPF_NOEXIST as u64).is_err() {
        uncharge(uid);
        return 1;
    }
    0
}

/// Forget process (or thread) `id`'s `TABLES` entry, and give its charge back.
#[inline(never)]
pub(crate) fn forget_table(id: u32) {
    let _ = TABLES.remove(id);
    release_owner(id);
}

/// Give back the charge of `id`'s entry to the uid stored with it (once: only the
/// remover of the owner entry does).
#[inline(never)]
pub(crate) fn release_owner(id: u32) {
    let Some(p) = TABLE_OWNERS.get_ptr(id) else {
        return;
    };
    // SAFETY: p points at a live TABLE_OWNERS value; copied at once.
    let uid = unsafe { *p };
    if TABLE_OWNERS.remove(id).is_ok() {
        uncharge(uid);
    }
}

/// One entry less for `uid`, never below 0 (the tracer's seeds update the counter
/// without atomics, so it may be off by one after a race; it never wraps).
#[inline(never)]
fn uncharge(uid: u32) {
    let Some(count) = TABLE_UIDS.get_ptr_mut(uid) else {
        return;
    };
    for _ in 0..4 {
        // SAFETY: count points at a live u64 map value.
        let now = unsafe { core::ptr::read_volatile(count) };
        if now == 0 {
            return;
        }
        // SAFETY: as above.
        if unsafe { atomic::cmpxchg(count, now, now - 1) } == now {
            return;
        }
    }
}

/// Drain the current thread's slot in every RW area of its process, and its pre-TLS
/// slot (a static executable's main thread may still hold records there from before
/// libc installed its own thread pointer): tail-calls `exit_step`, so it only returns
/// if there is nothing to drain (0) or the walk cannot start (an error).
#[inline(always)]
pub(crate) fn drain_exiting<C: EbpfContext>(ctx: &C, pid_tid: u64, cause: u32, after: u32) -> i64 {
    match plan_exit_drain(pid_tid, cause, after) {
        1 => run_exit_drain(ctx, pid_tid),
        r => r,
    }
}

/// Tail-call the exit drain planned by [`plan_exit_drain`]; returns only on failure.
#[inline(always)]
pub(crate) fn run_exit_drain<C: EbpfContext>(ctx: &C, pid_tid: u64) -> i64 {
    // SAFETY: ctx is the calling program's context; EXIT_STEPS holds exit_step.
    unsafe { EXIT_STEPS.tail_call(ctx, 0) };
    let _ = EXIT_WORK.remove(pid_tid);
    E_EXIT_WORK
}

/// Record the exit drain of the current thread in `EXIT_WORK` (its process's RW areas
/// copied, so the caller may forget them before running it): 1 = planned, 0 = nothing
/// to drain, < 0 = error.
#[inline(always)]
pub(crate) fn plan_exit_drain(pid_tid: u64, cause: u32, after: u32) -> i64 {
    let Some(p) = TABLES.get_ptr((pid_tid >> 32) as u32) else {
        return 0;
    };
    let work = ExitWork {
        // SAFETY: p points at a live TABLES value; copied at once.
        table: unsafe { *p },
        tp: thread_pointer(),
        cause,
        after,
        step: 0,
        failed: 0,
        slot: 0,
    };
    if EXIT_WORK.insert(pid_tid, work, 0).is_err() {
        return E_EXIT_WORK;
    }
    1
}

/// Error of [`drain_exiting`]: no room in `EXIT_WORK`, or `exit_step` not installed.
pub(crate) const E_EXIT_WORK: i64 = -4000;

/// One step of an exit drain (see [`ExitWork`]); tail-calls itself for the next.
#[inline(always)]
pub(crate) fn exit_step<C: EbpfContext>(ctx: &C) -> i64 {
    let pid_tid = bpf_get_current_pid_tgid();
    let Some(w) = EXIT_WORK.get_ptr_mut(pid_tid) else {
        return 0;
    };
    // SAFETY: w is this thread's live EXIT_WORK value (no other thread uses the key).
    let (step, rw) = unsafe {
        let step = (*w).step;
        (*w).step = step + 1;
        (step, (*w).table[((step >> 1) as u64 & INDEX_MASK) as usize])
    };
    if step >= 2 * TABLE_BINARIES as u32 || rw == 0 {
        // SAFETY: as above.
        let (after, failed) = unsafe { ((*w).after, (*w).failed) };
        // A thread that leaves through exit() has delivered everything: its task_exit
        // must not drain again. In lockdown its slot cannot be released, so a new
        // thread with the same thread pointer records into it, and a late
        // sched_process_exit of the old thread would deliver the new one's records
        // under the old tid.
        if after == AFTER_RELEASE && failed == 0 {
            let _ = EXIT_DRAINED.insert(pid_tid, 1u8, 0);
        }
        let _ = EXIT_WORK.remove(pid_tid);
        return 0;
    }
    // SAFETY: as above.
    let (tp, cause, after, last) = unsafe { ((*w).tp, (*w).cause, (*w).after, (*w).slot) };
    let slot = if step & 1 == 0 {
        let mut slot = find_slot(rw, tp);
        if THREAD_POINTER_MAY_BE_STALE && (slot == 0 || slot == pre_tls_slot(rw)) {
            let own = find_slot_by_tid(rw, pid_tid as u32);
            if own != 0 {
                slot = own;
            }
        }
        // SAFETY: as above.
        unsafe { (*w).slot = slot };
        slot
    } else {
        let pre = pre_tls_slot(rw);
        let mine = pre != last
            && read_user::<u32>(pre + SLOT_OWNER_TID) == Ok(pid_tid as u32)
            && read_user::<u64>(pre + SLOT_KEY).is_ok_and(|k| k > KEY_CLAIMING);
        if mine { pre } else { 0 }
    };
    let r = if slot != 0 {
        drain_slot::<false>(slot, rw, pid_tid, cause, after)
    } else {
        0
    };
    if r < 0 {
        // SAFETY: as above.
        unsafe { (*w).failed = 1 };
    }
    // SAFETY: ctx is this program's context; EXIT_STEPS holds this program.
    unsafe { EXIT_STEPS.tail_call(ctx, 0) };
    // Out of tail calls (cannot happen: 2 * TABLE_BINARIES < 33 steps).
    let _ = EXIT_WORK.remove(pid_tid);
    r
}

#[repr(C)]
struct ForkCtx {
    table: [u64; TABLE_BINARIES],
    tp: u64,
    tid: u32,
    child: u32,
}

/// A thread of a process whose RW areas are `table` forked process `child`: its slot
/// in each area holds records the child must not deliver again (`slots::inherit`).
#[inline(never)]
pub(crate) fn inherit_at_fork(table: [u64; TABLE_BINARIES], child: u32) {
    let mut c = ForkCtx {
        table,
        tp: thread_pointer(),
        tid: bpf_get_current_pid_tgid() as u32,
        child,
    };
    // SAFETY: callback and context as bpf_loop expects; `c` outlives the call.
    unsafe {
        bpf_loop(
            TABLE_BINARIES as u32,
            inherit_one as *const () as *mut c_void,
            (&raw mut c).cast(),
            0,
        );
    }
}

#[inline(never)]
extern "C" fn inherit_one(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the ForkCtx pointer that inherit_at_fork() passed in.
    let c = unsafe { &mut *ctx.cast::<ForkCtx>() };
    let rw = c.table[(index & INDEX_MASK) as usize];
    if rw == 0 {
        return 1;
    }
    let mut slot = find_slot(rw, c.tp);
    if THREAD_POINTER_MAY_BE_STALE && slot == 0 {
        slot = find_slot_by_tid(rw, c.tid);
    }
    if slot != 0 {
        inherit(slot, rw, c.child);
    }
    0
}

#[repr(C)]
struct FindCtx {
    table: [u64; TABLE_BINARIES],
    binary_id: u64,
    tp: u64,
    rw: u64,
    slot: u64,
    tid: u32,
}

/// The current thread's slot in the RW area of binary `binary_id` in process `tgid`:
/// `(rw_base, slot address)`, or None if the process has no such area or the thread no
/// slot in it.
#[inline(never)]
pub(crate) fn find_binary_slot(tgid: u32, binary_id: u64, tp: u64) -> Option<(u64, u64)> {
    let p = TABLES.get_ptr(tgid)?;
    let mut c = FindCtx {
        // SAFETY: p points at a live TABLES value; copied to the stack at once.
        table: unsafe { *p },
        binary_id,
        tp,
        rw: 0,
        slot: 0,
        tid: bpf_get_current_pid_tgid() as u32,
    };
    // SAFETY: callback and context as bpf_loop expects; `c` outlives the call.
    unsafe {
        bpf_loop(
            TABLE_BINARIES as u32,
            find_one as *const () as *mut c_void,
            (&raw mut c).cast(),
            0,
        );
    }
    (c.slot != 0).then_some((c.rw, c.slot))
}

#[inline(never)]
extern "C" fn find_one(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the FindCtx pointer that find_binary_slot() passed in.
    let c = unsafe { &mut *ctx.cast::<FindCtx>() };
    let rw = c.table[(index & INDEX_MASK) as usize];
    if rw == 0 {
        return 1;
    }
    if read_user::<u64>(rw + RWH_BINARY_ID) != Ok(c.binary_id) {
        return 0;
    }
    c.rw = rw;
    c.slot = find_slot(rw, c.tp);
    if THREAD_POINTER_MAY_BE_STALE && c.slot == 0 {
        c.slot = find_slot_by_tid(rw, c.tid);
    }
    1
}
