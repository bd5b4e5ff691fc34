//! The duration filter in the eBPF drain (`tracer_common::duration` has the algorithm
//! and the rules): a filtered drain copies its thread's stack of open calls from
//! `CALL_STACKS` into the per-CPU scratch ([`load`]), judges each record there
//! ([`duration_step`]) and copies the stack back ([`store`]); the stack goes with its thread
//! ([`forget`]). A call that lasted long enough releases held entries: they are copied
//! from the stack into the chunk being built, before the record that released them.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_probe_read_kernel;
use tracer_common::{
    CAUSE_CRASH, CAUSE_EXEC, CAUSE_TASK_EXIT, CAUSE_THREAD_EXIT, RECORD_SIZE, STAT_CALLS_DEEP,
    STAT_CALLS_SHORT, STAT_RECORDS_RELEASED,
    duration::{CALL_DEPTH, CallStack, Verdict, call_site_key, call_stack_key, judge},
};

use crate::{
    books::stat_add,
    maps::{CALL_SITE_CACHE, CALL_SITES, CALL_STACKS, CallState, FILTER_BLOCK, SCRATCH, Scratch},
};

/// Begin a drain of `pid_tid`'s buffer of `binary_id`: its stack into the scratch.
///
/// # Safety
/// `s` is this CPU's scratch, held by the caller (busy).
#[inline(always)]
pub(crate) unsafe fn load(s: *mut Scratch, pid_tid: u64, binary_id: u64) {
    // SAFETY: per the caller; the map value is a CallStack.
    unsafe {
        let c = &raw mut (*s).calls;
        (*c).released = 0;
        (*c).short = 0;
        (*c).deep = 0;
        let key = call_stack_key(pid_tid, binary_id);
        match CALL_STACKS.get_ptr(&key) {
            Some(p) => {
                bpf_probe_read_kernel(
                    (&raw mut (*c).stack).cast(),
                    size_of::<CallStack>() as u32,
                    p.cast::<c_void>(),
                );
            }
            None => {
                (*c).stack.depth = 0;
                (*c).stack.emitted = 0;
                (*c).stack.over = 0;
            }
        }
    }
}

/// End a drain: the stack back into `CALL_STACKS` (not for a drain that ends its
/// thread: it goes), the counts into the books.
///
/// # Safety
/// As [`load`].
#[inline(always)]
pub(crate) unsafe fn store(s: *mut Scratch, pid_tid: u64, binary_id: u64, cause: u32) {
    // SAFETY: per the caller.
    unsafe {
        let c = &raw mut (*s).calls;
        stat_add(STAT_RECORDS_RELEASED, (*c).released);
        stat_add(STAT_CALLS_SHORT, (*c).short);
        stat_add(STAT_CALLS_DEEP, (*c).deep);
        if ends_thread(cause) {
            forget(pid_tid, binary_id);
            return;
        }
        let key = call_stack_key(pid_tid, binary_id);
        let stack = &raw const (*c).stack;
        match CALL_STACKS.get_ptr_mut(&key) {
            Some(p) => {
                bpf_probe_read_kernel(
                    p.cast::<c_void>(),
                    size_of::<CallStack>() as u32,
                    stack.cast(),
                );
            }
            None if (*stack).depth != 0 || (*stack).over != 0 => {
                // A full map evicts the stack used least lately (counted nowhere: its
                // held entries stay filtered, its calls' exits pass unmatched).
                let _ = CALL_STACKS.insert(&key, &*stack, 0);
            }
            None => {}
        }
    }
}

/// Whether a drain of this cause is its thread's last (of this image).
#[inline(always)]
fn ends_thread(cause: u32) -> bool {
    matches!(
        cause,
        CAUSE_THREAD_EXIT | CAUSE_TASK_EXIT | CAUSE_CRASH | CAUSE_EXEC
    )
}

/// At a thread's last drain (by `cause`), its stack goes with it.
#[inline(always)]
pub(crate) fn forget_at(cause: u32, pid_tid: u64, binary_id: u64) {
    if ends_thread(cause) {
        forget(pid_tid, binary_id);
    }
}

/// The thread's stack goes with it (a new thread with its id starts empty).
#[inline(always)]
fn forget(pid_tid: u64, binary_id: u64) {
    let _ = CALL_STACKS.remove(&call_stack_key(pid_tid, binary_id));
}

/// Judge record `input[index]` of the scratch (a filtered drain's, held busy by it):
/// 1 = keep it, 0 = not. Held entries it releases are appended to the chunk being
/// built first: the caller leaves room for `CALL_DEPTH` of them and the record.
///
/// A BPF global function (exported by build.rs): the verifier checks its loops once,
/// not in every state of the per-record callback that calls it.
#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) extern "C" fn duration_step(index: u64) -> i64 {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's scratch, held by the drain that calls; indices are masked.
    unsafe {
        let r = &raw const (*s).input[(index & (FILTER_BLOCK as u64 - 1)) as usize];
        let info = site_info(&raw mut (*s).calls, (*s).filter.binary_id, (*r).site);
        if info == 0 {
            return 1;
        }
        let threshold = (*s).filter.cfg.min_duration;
        let c = &raw mut (*s).calls;
        match judge(&mut (*c).stack, &*r, info, threshold) {
            Verdict::Keep => 1,
            Verdict::Deep => {
                (*c).deep += 1;
                1
            }
            Verdict::Hold => 0,
            Verdict::Short => {
                (*c).short += 1;
                0
            }
            Verdict::Release { from, to, keep } => {
                let n = to.saturating_sub(from);
                let kept = (*s).kept;
                if n != 0 && kept + n < FILTER_BLOCK as u64 {
                    let dst = &raw mut (*s).records[(kept & (FILTER_BLOCK as u64 - 1)) as usize];
                    let from = from & (CALL_DEPTH as u64 - 1);
                    let src = &raw const (*c).stack.entries[from as usize];
                    let len = ((n - 1) & (CALL_DEPTH as u64 - 1)) + 1;
                    bpf_probe_read_kernel(
                        dst.cast(),
                        (len * RECORD_SIZE as u64) as u32,
                        src.cast(),
                    );
                    (*s).kept = kept + len;
                    (*c).released += len;
                }
                keep as i64
            }
        }
    }
}

/// Room the chunk being built must have before [`duration_step`]: the held entries
/// one record can release, and the record.
pub(crate) const STEP_ROOM: u64 = CALL_DEPTH as u64 + 1;

/// The `CALL_SITES` value of `site` (0: not a call site), through the CPU's cache.
///
/// # Safety
/// `c` is the scratch's call state.
#[inline(always)]
unsafe fn site_info(c: *mut CallState, binary_id: u64, site: u32) -> u64 {
    // SAFETY: per the caller; the index is masked.
    unsafe {
        let tag = (site as u64 + 1) << 32;
        let slot = &raw mut (*c).sites[site as usize & (CALL_SITE_CACHE - 1)];
        if (*slot)[0] == binary_id && (*slot)[1] >> 32 == site as u64 + 1 {
            return (*slot)[1] & 0xffff_ffff;
        }
        // The key in the scratch: the stack of the drain's call chain is nearly full.
        (*c).key = call_site_key(binary_id, site);
        let info = match CALL_SITES.get_ptr(&(*c).key) {
            Some(p) => *p & 0xffff_ffff,
            None => 0,
        };
        *slot = [binary_id, tag | info];
        info
    }
}
