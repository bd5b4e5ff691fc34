//! A thread's slot in an RW area (see tracer_common::layout): finding it (index, then
//! scan), draining it from where the last drain stopped, resetting or releasing it.
//!
//! Where the kernel allows `bpf_probe_write_user` (the tracer probes it at start and
//! records `write_user` in the trace file) a drain resets the buffer it drained (`cur =
//! start`) and, at thread exit, tombstones and unindexes the slot. Under kernel
//! lockdown (this project's machines, so write-user is not exercised by the tests) the
//! programs never write user memory: `DRAINED` remembers, per (process, slot), where
//! the last drain stopped and the stamp of the record just before; the next drain
//! starts there while that stamp is unchanged (the program has not reset the buffer
//! since). Slots of dead threads are then reused through thread-pointer reuse or
//! `register`'s dead-owner reclaim. Several sessions at once each keep their own
//! `DRAINED`, so each gets every record of its targets (with write-user the first
//! session's reset would hide the buffer from the second: not supported).
//!
//! A forked child (fork, vfork, posix_spawn) starts with a copy of the forking thread's
//! buffer: [`inherit`] marks those records delivered for the child (a `DRAINED` position),
//! so each comes once, under the process that made it (test `forks.rs`).
//!
//! A drain that fails to read part of a buffer (a non-resident page where the program
//! cannot sleep) counts the rest dropped but does not move the slot on: a later drain
//! of the same buffer (`task_exit` after `thread_exit`, the next flush) tries again, so
//! those records may be counted dropped twice, or the part delivered before the failure
//! delivered twice if the page is readable by then (the books balance either way). A
//! hostile process can so make its own records be delivered twice or not at all (e.g. a
//! forged `rw_base` whose buffer kind reads as circular), never affect other processes
//! or the tracer (`tests/tests/hostile.rs`).

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_loop;
use tracer_common::{
    BUF_TRACE, FIRST_FREE_SLOT, INDEX_OFF, KEY_CLAIMING, KEY_TOMBSTONE, PRE_TLS_OFF, RECORD_SIZE,
    RECORD_TIME_OFF, RWH_BUF_KIND, RWH_NSLOTS, SLOT_CUR, SLOT_KEY, SLOT_OWNER_TID, SLOT_PRE_TLS,
    SLOT_SIZE, SLOTS_OFF, STAT_READ_ERRORS, STAT_RECORDS_SKIPPED, Slot, index_of,
};

use crate::{
    books::stat_add,
    drain::{DrainReq, E_BAD_SPAN, drain},
    maps::{DRAINED, WRITE_USER},
    user::{read_user, write_user},
};

/// Upper bound on the slot scan (the table is nslots long, 1024 by default).
const MAX_SCAN: u32 = 1 << 20;

/// Address of the slot owned by thread pointer `tp` in the RW area at `rw`, 0 if none.
/// Fast path through the index; on a miss (index collision, or the thread has no slot)
/// a scan of the table.
#[inline(never)]
pub(crate) fn find_slot(rw: u64, tp: u64) -> u64 {
    if tp <= KEY_CLAIMING {
        return 0;
    }
    // A static executable's pre-TLS phase: %fs points into the RW area itself.
    if tp == rw + PRE_TLS_OFF {
        return pre_tls_slot(rw);
    }
    let h = index_of(tp);
    if let Ok(off) = read_user::<u32>(rw + INDEX_OFF + h * 4) {
        let slot = rw + SLOTS_OFF + off as u64;
        if read_user::<u64>(slot + SLOT_KEY) == Ok(tp) {
            return slot;
        }
    }
    let n = scan_len(rw);
    if n == 0 {
        return 0;
    }
    let mut s = ScanCtx { rw, tp, found: 0 };
    scan(n, scan_slot, &mut s);
    s.found
}

/// Address of the slot that thread `tid` claimed in the RW area at `rw` (a scan of the
/// table for `owner_tid`), 0 if none. Only for when the thread pointer the kernel
/// keeps is not the live one (see `arch::THREAD_POINTER_MAY_BE_STALE`).
#[inline(never)]
pub(crate) fn find_slot_by_tid(rw: u64, tid: u32) -> u64 {
    let n = scan_len(rw);
    if n == 0 {
        return 0;
    }
    let mut s = TidScanCtx {
        rw,
        tid: tid as u64,
        found: 0,
    };
    scan(n, scan_slot_tid, &mut s);
    s.found
}

/// Slots past the reserved ones in the RW area at `rw` (0 if unreadable), at most
/// MAX_SCAN: the length of a scan of the table.
#[inline(always)]
fn scan_len(rw: u64) -> u32 {
    let nslots = read_user::<u32>(rw + RWH_NSLOTS).unwrap_or(0);
    if nslots <= FIRST_FREE_SLOT {
        return 0;
    }
    let n = nslots - FIRST_FREE_SLOT;
    if n > MAX_SCAN { MAX_SCAN } else { n }
}

/// Run `step` over `n` slots of the table under `bpf_loop` (index 0 = the first free
/// slot), with `ctx` as its state.
#[inline(always)]
fn scan<T>(n: u32, step: extern "C" fn(u64, *mut c_void) -> i64, ctx: &mut T) {
    // SAFETY: callback and context as bpf_loop expects; `ctx` outlives the call.
    unsafe {
        bpf_loop(
            n,
            step as *const () as *mut c_void,
            (ctx as *mut T).cast(),
            0,
        );
    }
}

/// Address of slot `FIRST_FREE_SLOT + index` of the RW area at `rw`.
#[inline(always)]
fn free_slot(rw: u64, index: u64) -> u64 {
    rw + SLOTS_OFF + (index + FIRST_FREE_SLOT as u64) * SLOT_SIZE
}

#[repr(C)]
struct TidScanCtx {
    rw: u64,
    tid: u64,
    found: u64,
}

#[inline(never)]
extern "C" fn scan_slot_tid(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the TidScanCtx pointer that find_slot_by_tid() passed in.
    let s = unsafe { &mut *ctx.cast::<TidScanCtx>() };
    let slot = free_slot(s.rw, index);
    match (
        read_user::<u64>(slot + SLOT_KEY),
        read_user::<u32>(slot + SLOT_OWNER_TID),
    ) {
        (Ok(key), Ok(tid)) if key > KEY_CLAIMING && tid as u64 == s.tid => {
            s.found = slot;
            1
        }
        (Ok(_), Ok(_)) => 0,
        _ => 1,
    }
}

#[inline(always)]
pub(crate) fn pre_tls_slot(rw: u64) -> u64 {
    rw + SLOTS_OFF + SLOT_PRE_TLS as u64 * SLOT_SIZE
}

#[repr(C)]
struct ScanCtx {
    rw: u64,
    tp: u64,
    found: u64,
}

#[inline(never)]
extern "C" fn scan_slot(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the ScanCtx pointer that find_slot() passed in.
    let s = unsafe { &mut *ctx.cast::<ScanCtx>() };
    let slot = free_slot(s.rw, index);
    match read_user::<u64>(slot + SLOT_KEY) {
        Ok(key) if key == s.tp => {
            s.found = slot;
            1
        }
        Ok(_) => 0,
        Err(_) => 1,
    }
}

/// What [`drain_slot`] does after draining a slot.
///
/// With `WRITE_USER` (the kernel allows bpf_probe_write_user) the slot itself is
/// updated, as the design says. Without it (kernel lockdown) the programs never write
/// user memory; the `DRAINED` map remembers how far each slot was delivered instead
/// (see [`delivered_up_to`]).
///
/// The thread goes on using the buffer (flush, uprobe site): reset it (`cur = start`).
/// The flush function's own reset then sees a buffer that is no longer full and keeps
/// whatever a signal handler recorded in between.
pub(crate) const AFTER_RESET: u32 = 1;
/// The thread is exiting (sys_enter_exit): reset, unindex and tombstone the slot, so
/// that a new thread with the same thread pointer registers afresh.
pub(crate) const AFTER_RELEASE: u32 = 2;
/// With `AFTER_RESET`: records that find no room in the ring buffer stay in the
/// buffer (the flush comes back for them), see [`held`].
pub(crate) const HOLD: u32 = 0x100;
/// The task is dying (sched_process_exit, no user writes possible): nothing.
pub(crate) const AFTER_EXIT: u32 = 3;
/// The thread takes a fatal signal (a crash, or SIGKILL): like `AFTER_RESET`, and
/// circular buffers are delivered too (their last records lead up to the crash).
pub(crate) const AFTER_SIGNAL: u32 = 4;

/// Error: the slot could not be read or written back.
pub(crate) const E_SLOT_IO: i64 = -3000;
/// Error: the DRAINED map could not be updated (records may be delivered twice).
pub(crate) const E_DRAINED_MAP: i64 = -3001;
/// [`drain_slot`] with `hold` stopped for want of room: `HELD_BASE - r` records are
/// still in the buffer, past the position remembered in `DRAINED` (see [`held`]).
const HELD_BASE: i64 = -(1 << 40);

/// Records a holding drain left in the buffer, if `r` (from [`drain_slot`]) says it held.
#[inline(always)]
pub(crate) fn held(r: i64) -> Option<u64> {
    (r <= HELD_BASE).then(|| (HELD_BASE - r) as u64)
}

/// Where the previous drain of `slot` stopped, if that is still meaningful.
///
/// `DRAINED[tgid, slot]` holds `[pos, stamp]`: `cur` after that drain and the time field
/// of the record just before it. The user code resets `cur` behind our back, and a reset
/// buffer may well fill up to `pos` again, so `pos` only counts while the record before
/// it is still the one we delivered (its rdtsc stamp is unchanged).
#[inline(always)]
fn delivered_up_to(key: [u64; 2], slot: &Slot) -> Option<u64> {
    let p = DRAINED.get_ptr(key)?;
    // SAFETY: p points at a live map value, copied at once.
    let [pos, stamp] = unsafe { *p };
    let valid = pos > slot.start
        && pos <= slot.cur
        && read_user::<u64>(pos - RECORD_SIZE as u64 + RECORD_TIME_OFF) == Ok(stamp);
    valid.then_some(pos)
}

/// A forked child (process `child`) starts with a copy of the slot at `slot_addr` (in
/// the RW area at `rw`) that the forking thread was using: the records in it are the
/// parent's, which delivers them itself. The child's drains of the slot start after
/// them (its `DRAINED` position), so each record is delivered once, under its own
/// process (they count as skipped there, never as produced). Trace buffers only: a
/// circular buffer is delivered whole at its thread's end.
#[inline(always)]
pub(crate) fn inherit(slot_addr: u64, rw: u64, child: u32) {
    if read_user::<u32>(rw + RWH_BUF_KIND) != Ok(BUF_TRACE) {
        return;
    }
    let Ok(slot) = read_user::<Slot>(slot_addr) else {
        return;
    };
    if slot.cur <= slot.start || slot.cur > slot.end {
        return;
    }
    let stamp = read_user::<u64>(slot.cur - RECORD_SIZE as u64 + RECORD_TIME_OFF).unwrap_or(0);
    let _ = DRAINED.insert([child as u64, slot_addr], [slot.cur, stamp], 0);
}

/// A ring's drain: its spans (as `DrainReq::spans`) and the `DRAINED` entry to store
/// once they are delivered.
type RingDrain = ([u64; 4], [u64; 2]);

/// What a circular buffer (`BUF_CIRCULAR`, `BUF_FAST_CIRCULAR`) delivers: the whole
/// ring, oldest record first (`[cur, end)` then `[start, cur)`; never-written records
/// have flags 0 and readers skip them), only when the thread exits or takes a fatal
/// signal (`after` is not `AFTER_RESET`). A ring unchanged since its last delivery
/// (same `cur`, same record before it, remembered in `DRAINED`) is not delivered
/// again. The slot is not touched: rings are never reset. Returns the spans and the
/// `DRAINED` entry to store once delivered, or None (nothing to deliver), or an error.
#[inline(always)]
fn ring_spans(slot: &Slot, key: [u64; 2], after: u32) -> Result<Option<RingDrain>, i64> {
    if after == AFTER_RESET {
        return Ok(None);
    }
    let cur = slot.cur;
    if cur < slot.start || cur >= slot.end {
        return Err(E_SLOT_IO);
    }
    let before = if cur > slot.start { cur } else { slot.end } - RECORD_SIZE as u64;
    let stamp = read_user::<[u64; 2]>(before).unwrap_or([0, 0]);
    let seen = stamp[0] ^ stamp[1].rotate_left(17);
    if let Some(p) = DRAINED.get_ptr(key) {
        // SAFETY: p points at a live map value, copied at once.
        if unsafe { *p } == [cur, seen] {
            return Ok(None);
        }
    }
    Ok(Some(([cur, slot.end, slot.start, cur], [cur, seen])))
}

/// Drain the slot at `slot_addr` (in the RW area at `rw`) from where the last drain
/// stopped, then do what `after` says (`AFTER_*`). Returns records taken or a
/// negative error (or, with [`HOLD`] in `after`, that it held: see [`held`]). `S`:
/// the caller is a sleepable program (see `drain`).
#[inline(always)]
pub(crate) fn drain_slot<const S: bool>(
    slot_addr: u64,
    rw: u64,
    pid_tid: u64,
    cause: u32,
    after: u32,
) -> i64 {
    if S {
        drain_slot_sleepable(slot_addr, rw, pid_tid, cause, after)
    } else {
        drain_slot_atomic(slot_addr, rw, pid_tid, cause, after)
    }
}

// The drain as two BPF global functions (exported by build.rs): the verifier checks a
// global function once, for any arguments, where it walks a static one again for
// every state its callers reach it in (flush_s: 412,000 instructions, 1.1 s, before;
// 76,000, 0.13 s, after). Scalars only: the verifier knows a global function's
// arguments by their type alone, not by what its callers pass. Two symbols, not one
// generic: an exported function has one body.

global_pair!(
    /// [`drain_slot`] as a global function.
    drain_slot_sleepable, drain_slot_atomic
        => drain_slot_in(slot_addr: u64, rw: u64, pid_tid: u64, cause: u32, after: u32)
);

#[inline(always)]
fn drain_slot_in<const S: bool>(
    slot_addr: u64,
    rw: u64,
    pid_tid: u64,
    cause: u32,
    after: u32,
) -> i64 {
    let hold = (after & HOLD != 0) as u64;
    let after = after & !HOLD;
    let Ok(slot) = read_user::<Slot>(slot_addr) else {
        return E_SLOT_IO;
    };
    let key = [pid_tid >> 32, slot_addr];
    let mut req = DrainReq {
        spans: [0; 4],
        binary_id: slot.binary_id,
        pid_tid,
        cause: cause as u64,
        hold: 0,
        taken: 0,
    };
    // One call of `drain` for both kinds of buffer: each call site costs the verifier
    // the whole drain again.
    let mut ring_state = [0u64; 2];
    let ring = read_user::<u32>(rw + RWH_BUF_KIND).is_ok_and(|k| k != BUF_TRACE);
    if ring {
        match ring_spans(&slot, key, after) {
            Ok(Some((spans, state))) => {
                req.spans = spans;
                ring_state = state;
            }
            Ok(None) => return 0,
            Err(e) => return e,
        }
    } else {
        match trace_from(&slot, key, after) {
            Ok(from) => req.spans = [from, slot.cur, 0, 0],
            Err(r) => return r,
        }
        req.hold = hold;
    }
    let delivered = drain::<S>(&mut req);
    if ring {
        if delivered >= 0 {
            let _ = DRAINED.insert(key, ring_state, 0);
        }
        return delivered;
    }
    if delivered < 0 {
        return delivered;
    }
    let stop = req.spans[0] + req.taken * RECORD_SIZE as u64;
    if stop < slot.cur {
        return hold_at(
            key,
            req.spans[0],
            stop,
            (slot.cur - stop) / RECORD_SIZE as u64,
        );
    }
    finish_trace(&slot, slot_addr, rw, key, after, delivered)
}

/// A drain that held at `stop` (it started at `from`; `left` records remain): the
/// next one starts at `stop`.
#[inline(always)]
fn hold_at(key: [u64; 2], from: u64, stop: u64, left: u64) -> i64 {
    if stop > from {
        let stamp = read_user::<u64>(stop - RECORD_SIZE as u64 + RECORD_TIME_OFF).unwrap_or(0);
        if DRAINED.insert(key, [stop, stamp], 0).is_err() {
            return E_DRAINED_MAP;
        }
    }
    HELD_BASE - left as i64
}

/// Where a trace buffer's drain starts (`Err`: a result to return at once, nothing
/// to drain).
#[inline(always)]
fn trace_from(slot: &Slot, key: [u64; 2], after: u32) -> Result<u64, i64> {
    let after = if after == AFTER_SIGNAL {
        AFTER_RESET
    } else {
        after
    };
    // A stub interrupted by a signal handler is still writing a record: leave the
    // buffer alone (it has slack after `end`); the thread's next flush drains it.
    if slot.inflight != 0 && after == AFTER_RESET {
        return Err(0);
    }
    // Positions are kept in DRAINED without WRITE_USER, and after a drain that held.
    let mut from = slot.start;
    if let Some(pos) = delivered_up_to(key, slot) {
        from = pos;
        stat_add(
            STAT_RECORDS_SKIPPED,
            (pos - slot.start) / RECORD_SIZE as u64,
        );
    }
    if from < slot.start {
        stat_add(STAT_READ_ERRORS, 1);
        return Err(E_BAD_SPAN);
    }
    Ok(from)
}

/// After a trace buffer's drain: remember the position, or reset/release the slot
/// in place (`WRITE_USER`).
#[inline(always)]
fn finish_trace(
    slot: &Slot,
    slot_addr: u64,
    rw: u64,
    key: [u64; 2],
    after: u32,
    delivered: i64,
) -> i64 {
    let after = if after == AFTER_SIGNAL {
        AFTER_RESET
    } else {
        after
    };
    if WRITE_USER.load() == 0 {
        let r = if slot.cur == slot.start {
            match DRAINED.get_ptr(key) {
                Some(_) => DRAINED.remove(key),
                None => Ok(()),
            }
        } else {
            // Unreadable stamp: 0, so the position is not trusted later (duplicates
            // rather than losses).
            let stamp =
                read_user::<u64>(slot.cur - RECORD_SIZE as u64 + RECORD_TIME_OFF).unwrap_or(0);
            DRAINED.insert(key, [slot.cur, stamp], 0)
        };
        return if r.is_err() { E_DRAINED_MAP } else { delivered };
    }
    if DRAINED.get_ptr(key).is_some() {
        let _ = DRAINED.remove(key);
    }
    if after == AFTER_EXIT {
        return delivered;
    }
    if slot.cur != slot.start && write_user(slot_addr + SLOT_CUR, slot.start).is_err() {
        return E_SLOT_IO;
    }
    if after == AFTER_RELEASE {
        // Unindex first, tombstone last: once the key is a tombstone another thread
        // may claim the slot and install its own index entry.
        let idx = rw + INDEX_OFF + index_of(slot.key) * 4;
        let off = slot_addr.wrapping_sub(rw + SLOTS_OFF);
        if read_user::<u32>(idx).map(u64::from) == Ok(off) {
            let _ = write_user::<u32>(idx, 0);
        }
        if write_user(slot_addr + SLOT_KEY, KEY_TOMBSTONE).is_err() {
            return E_SLOT_IO;
        }
    }
    delivered
}
