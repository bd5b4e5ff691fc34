//! Moving records from a thread's buffer into the ring buffer.
//!
//! A buffer holds up to thousands of records, more than the verifier accepts in a
//! plain loop, so the copy runs under `bpf_loop`, one ring-buffer entry of up to
//! CHUNK_RECORDS records per iteration, read with `bpf_probe_read_user` straight into
//! the reservation. Entries are reserved in three sizes (room for 4, 16 or
//! CHUNK_RECORDS records; `count` says how many are valid), so that the many small
//! drains do not take 4 KiB of ring buffer each.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::{bpf_ktime_get_ns, bpf_loop, bpf_probe_read_user};
use tracer_common::{
    CHUNK_KIND_RECORDS, CHUNK_RECORDS, ChunkHeader, RECORD_SIZE, STAT_CHUNKS, STAT_READ_ERRORS,
    STAT_RECORDS_DELIVERED, STAT_RECORDS_DROPPED, ebpf::MAX_DRAIN_BYTES,
};

use crate::maps::{EVENTS, next_seq, stat_add};

/// `drain` error: `[start, cur)` is not a valid span of records.
pub const E_BAD_SPAN: i64 = -2000;
/// `drain` error: the user buffer could not be read (the helper's error is lost).
pub const E_READ: i64 = -2001;

const HDR: usize = core::mem::size_of::<ChunkHeader>();

/// State shared with the bpf_loop callback (lives on the caller's stack).
#[repr(C)]
struct DrainCtx {
    start: u64,
    n: u64,
    pid_tid: u64,
    binary_id: u64,
    cause: u64,
    /// The drain's clock sample, the same in all of its chunks.
    time: u64,
    delivered: u64,
    dropped: u64,
    chunks: u64,
    failed: u64,
}

/// Copy the records `[from, to)` of the current thread's buffer (of binary
/// `binary_id`) into `EVENTS`. `pid_tid` is `bpf_get_current_pid_tgid()`. Returns the
/// number of records delivered, or a negative error (`E_*`). Does not touch the slot.
/// Plain values, no `Slot`: the exit programs' call chain must stay within the
/// verifier's 512-byte combined stack.
#[inline(never)]
pub fn drain(from: u64, to: u64, binary_id: u64, pid_tid: u64, cause: u32) -> i64 {
    let (start, cur) = (from, to);
    if cur < start || (cur - start) % RECORD_SIZE as u64 != 0 || cur - start > MAX_DRAIN_BYTES {
        stat_add(STAT_READ_ERRORS, 1);
        return E_BAD_SPAN;
    }
    let n = (cur - start) / RECORD_SIZE as u64;
    if n == 0 {
        return 0;
    }
    let chunks = n.div_ceil(CHUNK_RECORDS as u64);
    let mut c = DrainCtx {
        start,
        n,
        pid_tid,
        binary_id,
        cause: cause as u64,
        // SAFETY: no preconditions.
        time: unsafe { bpf_ktime_get_ns() },
        delivered: 0,
        dropped: 0,
        chunks: 0,
        failed: 0,
    };
    // SAFETY: the callback has the signature bpf_loop expects and receives `c`, which
    // outlives the call.
    unsafe {
        bpf_loop(
            chunks as u32,
            drain_chunk as *const () as *mut c_void,
            (&raw mut c).cast(),
            0,
        );
    }
    stat_add(STAT_RECORDS_DELIVERED, c.delivered);
    stat_add(STAT_CHUNKS, c.chunks);
    if c.dropped != 0 {
        stat_add(STAT_RECORDS_DROPPED, c.dropped);
    }
    if c.failed != 0 {
        stat_add(STAT_READ_ERRORS, 1);
        return E_READ;
    }
    c.delivered as i64
}

/// One bpf_loop iteration: chunk `index` of the span described by `ctx`.
/// Returns 0 to go on, 1 to stop.
#[inline(never)]
extern "C" fn drain_chunk(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the DrainCtx pointer that drain() passed in.
    let c = unsafe { &mut *ctx.cast::<DrainCtx>() };
    let first = index * CHUNK_RECORDS as u64;
    if first >= c.n {
        return 1;
    }
    let left = c.n - first;
    let count = if left > CHUNK_RECORDS as u64 {
        CHUNK_RECORDS as u64
    } else {
        left
    };
    // Small drains (uprobe sites, thread exits) get a smaller ring-buffer entry: the
    // reservation size must be a constant, hence a few size classes.
    let r = if count <= 4 {
        emit::<4>(c, first, count)
    } else if count <= 16 {
        emit::<16>(c, first, count)
    } else {
        emit::<CHUNK_RECORDS>(c, first, count)
    };
    match r {
        Emit::Delivered => {
            c.delivered += count;
            c.chunks += 1;
            0
        }
        Emit::Dropped => {
            c.dropped += count;
            0
        }
        Emit::ReadFailed => {
            c.failed = 1;
            1
        }
    }
}

enum Emit {
    Delivered,
    Dropped,
    ReadFailed,
}

/// Put `count` (1..=RECORDS, RECORDS a power of two) records starting at record `first`
/// of the span into one ring-buffer entry with room for RECORDS records.
#[inline(always)]
fn emit<const RECORDS: usize>(c: &DrainCtx, first: u64, count: u64) -> Emit {
    // Taken before the reservation: a chunk lost to a full ring buffer leaves a gap.
    let seq = next_seq();
    let Some(mut entry) = EVENTS.reserve_bytes(HDR + RECORDS * RECORD_SIZE, 0) else {
        return Emit::Dropped;
    };
    let base = entry.as_mut_ptr();
    let header = ChunkHeader {
        kind: CHUNK_KIND_RECORDS,
        count: count as u32,
        pid: (c.pid_tid >> 32) as u32,
        tid: c.pid_tid as u32,
        seq,
        binary_id: c.binary_id,
        cause: c.cause as u32,
        _pad: 0,
        time: c.time,
    };
    // SAFETY: the reservation is at least HDR bytes long and 8-byte aligned.
    unsafe { base.cast::<ChunkHeader>().write(header) };
    // count is in [1, RECORDS]; the mask spells that out for the verifier, which must
    // see that the copy stays inside the reservation. The volatile read keeps LLVM from
    // proving the mask redundant (it knows the caller's `count <= RECORDS`) and
    // dropping it: older verifiers (Linux 6.1) do not carry that comparison over to
    // this register and reject the program.
    // SAFETY: reading a local.
    let count = unsafe { core::ptr::read_volatile(&count) };
    let len = (((count - 1) & (RECORDS as u64 - 1)) + 1) * RECORD_SIZE as u64;
    let src = c.start + first * RECORD_SIZE as u64;
    // SAFETY: dst is HDR + len <= the reserved size; the helper validates src.
    let r = unsafe { bpf_probe_read_user(base.add(HDR).cast(), len as u32, src as *const c_void) };
    if r != 0 {
        entry.discard(0);
        return Emit::ReadFailed;
    }
    entry.submit(0);
    Emit::Delivered
}
