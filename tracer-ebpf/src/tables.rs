//! Walks over a process's RW areas (its `TABLES` entry). One `bpf_loop` callback per
//! walk rather than an unrolled loop: the verifier then checks the body once instead
//! of once per table entry.

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, generated::bpf_loop};
use tracer_common::{KEY_CLAIMING, RWH_BINARY_ID, SLOT_KEY, SLOT_OWNER_TID, ebpf::TABLE_BINARIES};

use crate::{
    arch::{THREAD_POINTER_MAY_BE_STALE, thread_pointer},
    maps::TABLES,
    slots::{drain_slot, find_slot, find_slot_by_tid, pre_tls_slot},
    user::read_user,
};

const INDEX_MASK: u64 = TABLE_BINARIES as u64 - 1;
const _: () = assert!(TABLE_BINARIES.is_power_of_two());

/// Small on purpose: the chain task_exit → drain_exiting → exit_one (bpf_loop callback)
/// → drain_slot → drain → drain_chunk must fit the verifier's 512-byte combined stack,
/// which Linux 6.1 also charges for callbacks; so no copy of the table here, the
/// callback looks it up.
#[repr(C)]
struct ExitCtx {
    pid_tid: u64,
    tp: u64,
    cause: u64,
    after: u64,
    total: i64,
}

/// Drain the current thread's slot in every RW area of its process, and its pre-TLS
/// slot (a static executable's main thread may still hold records there from before
/// libc installed its own thread pointer). Returns the records delivered or the last
/// error.
#[inline(never)]
pub fn drain_exiting(pid_tid: u64, cause: u32, after: u32) -> i64 {
    if TABLES.get_ptr((pid_tid >> 32) as u32).is_none() {
        return 0;
    }
    let mut c = ExitCtx {
        pid_tid,
        tp: thread_pointer(),
        cause: cause as u64,
        after: after as u64,
        total: 0,
    };
    // SAFETY: callback and context as bpf_loop expects; `c` outlives the call.
    unsafe {
        bpf_loop(
            TABLE_BINARIES as u32,
            exit_one as *const () as *mut c_void,
            (&raw mut c).cast(),
            0,
        );
    }
    c.total
}

#[inline(never)]
extern "C" fn exit_one(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the ExitCtx pointer that drain_exiting() passed in.
    let c = unsafe { &mut *ctx.cast::<ExitCtx>() };
    let Some(p) = TABLES.get_ptr((c.pid_tid >> 32) as u32) else {
        return 1;
    };
    // SAFETY: p points at a live TABLES value; one entry is read at once.
    let rw = unsafe { (*p)[(index & INDEX_MASK) as usize] };
    if rw == 0 {
        return 1;
    }
    let (cause, after) = (c.cause as u32, c.after as u32);
    let mut slot = find_slot(rw, c.tp);
    if THREAD_POINTER_MAY_BE_STALE && (slot == 0 || slot == pre_tls_slot(rw)) {
        let own = find_slot_by_tid(rw, c.pid_tid as u32);
        if own != 0 {
            slot = own;
        }
    }
    if slot != 0 {
        let r = drain_slot(slot, rw, c.pid_tid, cause, after);
        c.total = if r < 0 { r } else { c.total + r };
    }
    let pre = pre_tls_slot(rw);
    if pre != slot
        && read_user::<u32>(pre + SLOT_OWNER_TID) == Ok(c.pid_tid as u32)
        && read_user::<u64>(pre + SLOT_KEY).is_ok_and(|k| k > KEY_CLAIMING)
    {
        let r = drain_slot(pre, rw, c.pid_tid, cause, after);
        c.total = if r < 0 { r } else { c.total + r };
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
pub fn find_binary_slot(tgid: u32, binary_id: u64, tp: u64) -> Option<(u64, u64)> {
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
