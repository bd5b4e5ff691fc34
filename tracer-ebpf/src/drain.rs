//! Moving records from a thread's buffer into the ring buffer.
//!
//! A buffer holds up to thousands of records, more than the verifier accepts in a
//! plain loop, so the copy runs under `bpf_loop`, one ring-buffer entry of up to
//! CHUNK_RECORDS records per iteration (SMALL_CHUNK_RECORDS in small rings, see
//! `tracer_common::SMALL_RING_BYTES`).
//! Unfiltered, a chunk is read with `bpf_probe_read_user` straight into the
//! reservation; entries are reserved in four sizes (room for 4, 16,
//! SMALL_CHUNK_RECORDS or CHUNK_RECORDS records; `count` says how many are valid),
//! so that the many small drains do not take 16 KiB of ring buffer each. With
//! per-record filters a chunk is read into a per-CPU scratch entry, compacted there
//! (one `bpf_loop` step per record) and written with `bpf_ringbuf_output` at its
//! exact size. Drains of binaries whose USDT sites have string arguments take that
//! path too: each kept record's strings are sent before its chunk (`strings`).
//!
//! Books: every record taken out of a buffer is counted produced, then delivered,
//! filtered or dropped (no room in the ring buffer, or its chunk could not be read).
//!
//! A drain that may hold (`DrainReq::hold`: an armed flush under `--on-full wait`)
//! stops at the first chunk that finds no room, or that would leave less than a
//! quarter of the ring free (room kept for exit drains and uprobe sites, which cannot
//! wait); the records from there on are not taken (`DrainReq::taken` says how many
//! were) and the flush comes back for them. Per-record filters keep state across
//! records, so filtered drains never hold.
//!
//! `S` = the program is sleepable: where the plain read fails (a page that is not
//! resident), `bpf_copy_from_user` faults it in. Non-sleepable programs get a copy of
//! this code without that helper (the verifier refuses it there).
//!
//! Chunks are tagged with pid, tid, a global sequence number and the binary id. Rings
//! under 256 KiB take chunks of at most 128 records (`SMALL_CHUNKS`, a frozen global
//! the verifier reads as a constant). Only the chunk that fills the ring past an eighth
//! of its size wakes the consumer (`wakeup`; the consumer also looks every 10 ms and
//! reads on while it finds entries): a wakeup is an irq_work self-IPI and an IPI, VM
//! exits here (forced at every chunk past the eighth they cost a traced loop 12 ns per
//! record), and full buffers come by the thousand a second. The per-CPU scratch has a
//! busy flag against a preempted sleepable drain: a drain that finds it held drops all
//! of its records (counted). Drains of binaries with string arguments never hold
//! either: they drop as under `--on-full drop`.

use core::ffi::c_void;

use aya_ebpf::bindings::{
    BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
};
use aya_ebpf::helpers::generated::{
    bpf_copy_from_user, bpf_ktime_get_ns, bpf_loop, bpf_probe_read_user,
};
use tracer_common::{
    CHUNK_HEADER_BYTES, CHUNK_KIND_RECORDS, CHUNK_RECORDS, ChunkHeader, RECORD_SIZE,
    SMALL_CHUNK_RECORDS, STAT_READ_ERRORS, STAT_RECORDS_FILTERED, STAT_RECORDS_PRODUCED,
    ebpf::MAX_DRAIN_BYTES,
    filter::{F_DURATION, F_PER_RECORD, FilterConfig},
};

use crate::{
    atomic,
    books::{next_seq, settle, stat_add},
    duration,
    filter::{active, announce_comm, record_passes, thread_passes},
    maps::{EVENTS, FILTER_BLOCK, SCRATCH, SMALL_CHUNKS, Scratch},
    strings,
};

/// `drain` error: `[start, cur)` is not a valid span of records.
pub(crate) const E_BAD_SPAN: i64 = -2000;
/// `drain` error: the user buffer could not be read (the helper's error is lost).
pub(crate) const E_READ: i64 = -2001;

/// State shared with the bpf_loop callback (lives on the caller's stack).
#[repr(C)]
struct DrainCtx {
    /// First span: `n1` records at `a`; second span: `n - n1` records at `b`.
    a: u64,
    b: u64,
    n1: u64,
    n: u64,
    pid_tid: u64,
    binary_id: u64,
    cause: u32,
    /// A chunk could not be read (the rest of the drain is dropped).
    failed: u8,
    /// 1 = stop at the first chunk without room (see `DrainReq::hold`).
    hold: u8,
    /// Stopped there.
    held: u8,
    /// Records of the chunks done (delivered or dropped).
    taken: u64,
    /// The drain's clock sample, the same in all of its chunks.
    time: u64,
    delivered: u64,
    dropped: u64,
    chunks: u64,
    /// Held entries written (counted filtered when held, see `duration`).
    released: u64,
}

/// What to drain: the records `[spans[0], spans[1])` then `[spans[2], spans[3])` of
/// the current thread's buffer (a ring is delivered as its older part, then its newer
/// part; a trace buffer has an empty second span) of binary `binary_id`. One request,
/// so that every program has a single call of `drain` to verify.
#[repr(C)]
pub(crate) struct DrainReq {
    pub spans: [u64; 4],
    pub binary_id: u64,
    /// `bpf_get_current_pid_tgid()`.
    pub pid_tid: u64,
    pub cause: u64,
    /// In: 1 = records that find no room are left in the buffer, not dropped.
    pub hold: u64,
    /// Out: records taken (all of them unless the drain held).
    pub taken: u64,
}

/// Records per chunk: CHUNK_RECORDS, or SMALL_CHUNK_RECORDS in a small ring. A
/// constant to the verifier (a frozen global), read where it is used: it walks one
/// chunk size only.
#[inline(always)]
fn per_chunk() -> u64 {
    if SMALL_CHUNKS.load() != 0 {
        SMALL_CHUNK_RECORDS as u64
    } else {
        CHUNK_RECORDS as u64
    }
}

/// Records in `[from, to)`, or None if that is not a valid span.
#[inline(always)]
fn span_records(from: u64, to: u64) -> Option<u64> {
    if to < from || !(to - from).is_multiple_of(RECORD_SIZE as u64) || to - from > MAX_DRAIN_BYTES {
        return None;
    }
    Some((to - from) / RECORD_SIZE as u64)
}

/// Copy the records of `req` into `EVENTS`, through the filters. Returns the number
/// of records taken (delivered, filtered or dropped), or a negative error (`E_*`).
/// Does not touch the slot. Plain values, no `Slot`: the exit programs' call chain
/// must stay within the verifier's 512-byte combined stack: inlined into its one
/// caller (`slots::drain_slot`), one frame less (Linux 6.1 counts callbacks too).
#[inline(always)]
pub(crate) fn drain<const S: bool>(req: &mut DrainReq) -> i64 {
    let [a0, a1, b0, b1] = req.spans;
    let (Some(n1), Some(n2)) = (span_records(a0, a1), span_records(b0, b1)) else {
        stat_add(STAT_READ_ERRORS, 1);
        return E_BAD_SPAN;
    };
    let n = n1 + n2;
    req.taken = n;
    drain_records::<S>(req, n, n1, n2)
}

/// [`drain`] once its spans are known good: `n` records, `n1` in the first span.
#[inline(always)]
fn drain_records<const S: bool>(req: &mut DrainReq, n: u64, n1: u64, n2: u64) -> i64 {
    let (binary_id, pid_tid) = (req.binary_id, req.pid_tid);
    let cfg = active();
    if n == 0 {
        // A thread's last drain with nothing left: its stack of open calls goes (a
        // drain with records does that in `duration::store`).
        // SAFETY: a live FILTER value.
        if cfg.is_some_and(|(cfg, _)| unsafe { (*cfg).flags } & F_DURATION != 0) {
            duration::forget_at(req.cause as u32, pid_tid, binary_id);
        }
        return 0;
    }
    let [a0, _, b0, _] = req.spans;
    let mut per_record = false;
    if let Some((cfg, _)) = cfg {
        // SAFETY: a live FILTER value.
        let cfg = unsafe { &*cfg };
        if !thread_passes(cfg, pid_tid) {
            stat_add(STAT_RECORDS_PRODUCED, n);
            stat_add(STAT_RECORDS_FILTERED, n);
            return n as i64;
        }
        per_record = cfg.flags & F_PER_RECORD != 0;
    }
    // String arguments are read record by record, as filters judge them.
    let with_strings = strings::binary_has_strings(binary_id);
    per_record |= with_strings;
    // SAFETY: no preconditions.
    let time = unsafe { bpf_ktime_get_ns() };
    announce_comm(pid_tid, binary_id, time);
    let per_chunk = per_chunk();
    let chunks1 = n1.div_ceil(per_chunk);
    let chunks = chunks1 + n2.div_ceil(per_chunk);
    let mut c = DrainCtx {
        a: a0,
        b: b0,
        n1,
        n,
        pid_tid,
        binary_id,
        cause: req.cause as u32,
        failed: 0,
        hold: (req.hold != 0 && !per_record) as u8,
        held: 0,
        taken: 0,
        time,
        delivered: 0,
        dropped: 0,
        chunks: 0,
        released: 0,
    };
    if per_record {
        filtered_drain::<S>(&mut c, with_strings);
    } else {
        // SAFETY: the callback has the signature bpf_loop expects and receives `c`,
        // which outlives the call.
        unsafe {
            bpf_loop(
                chunks as u32,
                drain_chunk::<S> as *const () as *mut c_void,
                (&raw mut c).cast(),
                0,
            );
        }
    }
    // Every record taken was delivered, dropped (a failed read counts the rest) or
    // filtered.
    let taken = if c.held != 0 { c.taken } else { n };
    req.taken = taken;
    stat_add(STAT_RECORDS_PRODUCED, taken);
    settle(taken + c.released, c.delivered, c.dropped, c.chunks);
    if c.failed != 0 {
        stat_add(STAT_READ_ERRORS, 1);
        return E_READ;
    }
    n as i64
}

/// One bpf_loop iteration: chunk `index` of the span described by `ctx`.
/// Returns 0 to go on, 1 to stop.
#[inline(never)]
extern "C" fn drain_chunk<const S: bool>(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the DrainCtx pointer that drain() passed in.
    let c = unsafe { &mut *ctx.cast::<DrainCtx>() };
    // Computed, not kept: the context lives on a stack the verifier limits.
    let per_chunk = per_chunk();
    let chunks1 = c.n1.div_ceil(per_chunk);
    let (base, span_n, first) = if index < chunks1 {
        (c.a, c.n1, index * per_chunk)
    } else {
        (c.b, c.n - c.n1, (index - chunks1) * per_chunk)
    };
    if first >= span_n {
        return 1;
    }
    let left = span_n - first;
    let count = if left > per_chunk { per_chunk } else { left };
    let src = base + first * RECORD_SIZE as u64;
    let how = count | (c.hold as u64) << HOW_HOLD_SHIFT | (c.cause as u64) << HOW_CAUSE_SHIFT;
    let r = Emit::from_code(if S {
        emit_chunk_sleepable(src, how, c.pid_tid, c.binary_id, c.time)
    } else {
        emit_chunk_atomic(src, how, c.pid_tid, c.binary_id, c.time)
    });
    match r {
        Emit::Done { kept, lost } => {
            c.delivered += kept;
            c.dropped += lost;
            c.chunks += (kept != 0) as u64;
            c.taken += count;
            0
        }
        Emit::NoRoom => {
            c.held = 1;
            1
        }
        Emit::ReadFailed => {
            // This chunk and the ones after it are not delivered.
            c.dropped += c.n - (if index < chunks1 { 0 } else { c.n1 } + first);
            c.failed = 1;
            1
        }
    }
}

enum Emit {
    /// `kept` records delivered, `lost` found no room; the rest were filtered.
    Done {
        kept: u64,
        lost: u64,
    },
    /// No room, and the drain holds: nothing taken.
    NoRoom,
    ReadFailed,
}

const EMIT_NO_ROOM: i64 = -1;
const EMIT_READ_FAILED: i64 = -2;
/// `how` of [`emit_chunk`]: the record count in the low bits, then these.
const HOW_HOLD_SHIFT: u32 = 16;
const HOW_CAUSE_SHIFT: u32 = 32;

impl Emit {
    /// As a global function returns it: a scalar.
    #[inline(always)]
    fn code(self) -> i64 {
        match self {
            Emit::Done { kept, lost } => (kept | lost << 16) as i64,
            Emit::NoRoom => EMIT_NO_ROOM,
            Emit::ReadFailed => EMIT_READ_FAILED,
        }
    }

    #[inline(always)]
    fn from_code(code: i64) -> Emit {
        match code {
            EMIT_NO_ROOM => Emit::NoRoom,
            c if c < 0 => Emit::ReadFailed,
            c => Emit::Done {
                kept: c as u64 & 0xffff,
                lost: (c as u64 >> 16) & 0xffff,
            },
        }
    }
}

// The chunk copy as two BPF global functions (exported by build.rs), like the drain
// itself (`slots::drain_slot_*`): the verifier walks a bpf_loop callback until its
// states converge (Linux 6.7 on), and every size class of the copy inlined there
// cost it about 25,000 instructions per program; a global function is checked once,
// for any arguments. Scalars only (see there), at most five: `how` packs the count,
// the hold flag and the cause.

global_pair!(
    /// [`emit_chunk`] as a global function.
    emit_chunk_sleepable, emit_chunk_atomic
        => emit_chunk(src: u64, how: u64, pid_tid: u64, binary_id: u64, time: u64)
);

/// One chunk of `count` records at `src` (`how`: count, hold, cause) into the ring
/// buffer, as [`Emit::code`]. Small drains (uprobe sites, thread exits) get a smaller
/// ring-buffer entry: the reservation size must be a constant, hence a few size
/// classes.
#[inline(always)]
fn emit_chunk<const S: bool>(src: u64, how: u64, pid_tid: u64, binary_id: u64, time: u64) -> i64 {
    let h = Head {
        pid_tid,
        binary_id,
        cause: (how >> HOW_CAUSE_SHIFT) as u32,
        time,
        hold: (how >> HOW_HOLD_SHIFT) & 1 != 0,
    };
    let count = how & 0xffff;
    if count == 0 || count > per_chunk() {
        return EMIT_READ_FAILED;
    }
    let r = if count <= 4 {
        emit::<S, 4>(&h, src, count)
    } else if count <= 16 {
        emit::<S, 16>(&h, src, count)
    } else if count <= SMALL_CHUNK_RECORDS as u64 {
        emit::<S, SMALL_CHUNK_RECORDS>(&h, src, count)
    } else {
        emit::<S, CHUNK_RECORDS>(&h, src, count)
    };
    r.code()
}

/// What every chunk header of a drain says, and whether the drain holds.
struct Head {
    pid_tid: u64,
    binary_id: u64,
    cause: u32,
    time: u64,
    hold: bool,
}

/// `count` in [1, max] (a power of two) in a form the verifier can bound: the
/// volatile read keeps LLVM from proving the mask redundant (it knows the caller's
/// `count <= max`) and dropping it; older verifiers (Linux 6.1) do not carry that
/// comparison over to this register.
#[inline(always)]
fn bounded(count: u64, max: u64) -> u64 {
    // SAFETY: reading a local.
    let count = unsafe { core::ptr::read_volatile(&count) };
    ((count - 1) & (max - 1)) + 1
}

/// Read `len` bytes of the traced thread's memory at `src` into `dst`; sleepable
/// programs fault a missing page in where the plain read fails.
#[inline(always)]
fn read_records<const S: bool>(dst: *mut u8, len: u32, src: u64) -> bool {
    // SAFETY: the caller makes `dst` valid for `len` bytes; the helpers validate src.
    unsafe {
        if bpf_probe_read_user(dst.cast(), len, src as *const c_void) == 0 {
            return true;
        }
        S && bpf_copy_from_user(dst.cast(), len, src as *const c_void) == 0
    }
}

/// Put `count` (1..=RECORDS, RECORDS a power of two) records at `src` into one
/// ring-buffer entry with room for RECORDS records.
#[inline(always)]
fn emit<const S: bool, const RECORDS: usize>(h: &Head, src: u64, count: u64) -> Emit {
    let bytes = CHUNK_HEADER_BYTES + RECORDS * RECORD_SIZE;
    if h.hold && !room_to_spare(bytes as u64) {
        return Emit::NoRoom;
    }
    let Some(mut entry) = EVENTS.reserve_bytes(bytes, 0) else {
        if h.hold {
            return Emit::NoRoom;
        }
        // A chunk lost to a full ring buffer leaves a gap in the sequence.
        next_seq();
        return Emit::Done {
            kept: 0,
            lost: count,
        };
    };
    let seq = next_seq();
    let base = entry.as_mut_ptr();
    let header = ChunkHeader::new(CHUNK_KIND_RECORDS, h.pid_tid, h.binary_id, h.cause, h.time)
        .with_records(count as u32, seq);
    // SAFETY: the reservation is at least CHUNK_HEADER_BYTES bytes long and 8-byte aligned.
    unsafe { base.cast::<ChunkHeader>().write(header) };
    let len = bounded(count, RECORDS as u64) * RECORD_SIZE as u64;
    // SAFETY: CHUNK_HEADER_BYTES + len <= the reserved size.
    if !read_records::<S>(unsafe { base.add(CHUNK_HEADER_BYTES) }, len as u32, src) {
        entry.discard(0);
        return Emit::ReadFailed;
    }
    entry.submit(wakeup(bytes as u64, true));
    Emit::Done {
        kept: count,
        lost: 0,
    }
}

/// Whether `bytes` more leave a quarter of the ring free (what a holding drain keeps
/// for the drains that cannot wait).
#[inline(always)]
fn room_to_spare(bytes: u64) -> bool {
    let avail = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    let size = EVENTS.query(BPF_RB_RING_SIZE as u64);
    avail + bytes + size / 4 <= size
}

/// How a drain's chunk of `bytes` (`reserved`: already counted in the ring) wakes the
/// consumer: only the chunk that fills the ring past an eighth of its size (the
/// consumer also looks every `POLL_MS`, and reads on while it finds entries), not
/// every chunk while it is past that: a wakeup is an irq_work self-IPI and an IPI, VM
/// exits on virtual machines (forced at every chunk they cost a traced loop 12 ns per
/// record), and full buffers come by the thousand a second.
#[inline(always)]
fn wakeup(bytes: u64, reserved: bool) -> u64 {
    let avail = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    let size = EVENTS.query(BPF_RB_RING_SIZE as u64);
    let before = if reserved {
        avail.saturating_sub(bytes)
    } else {
        avail
    };
    if before <= size / 8 && before + bytes > size / 8 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// The header of a chunk of `count` records of this drain, chunk number `seq`.
#[inline(always)]
fn header(c: &DrainCtx, count: u64, seq: u64) -> ChunkHeader {
    ChunkHeader::new(CHUNK_KIND_RECORDS, c.pid_tid, c.binary_id, c.cause, c.time)
        .with_records(count as u32, seq)
}

/// The filtered drain: one `bpf_loop` step per record (not nested in the chunk loop:
/// nested callbacks multiply the verifier's work), reading the buffer FILTER_BLOCK
/// records at a time into the per-CPU scratch and writing the records that pass as
/// chunks of their exact size with `bpf_ringbuf_output`. Inlined: one frame less for
/// the verifier's 512-byte combined stack limit (Linux 6.1 counts callbacks too).
#[inline(always)]
fn filtered_drain<const S: bool>(c: &mut DrainCtx, with_strings: bool) {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        c.dropped += c.n;
        return;
    };
    // SAFETY: s is this CPU's scratch entry; busy keeps a preempted sleepable
    // program's drain from being overwritten (this drain's records count as dropped);
    // cfg is a live FILTER value.
    unsafe {
        if atomic::cmpxchg(&raw mut (*s).busy, 0, 1) != 0 {
            c.dropped += c.n;
            // The thread's stack goes all the same at its last drain (its held
            // entries, never released, stay filtered).
            duration::forget_at(c.cause, c.pid_tid, c.binary_id);
            return;
        }
        match active() {
            Some((cfg, generation)) => {
                (*s).filter.cfg = *cfg;
                (*s).filter.generation = generation as u64;
            }
            None => (*s).filter.cfg = FilterConfig::default(),
        }
        (*s).filter.binary_id = c.binary_id;
        (*s).filter.word = 0;
        let durations = (*s).filter.cfg.flags & F_DURATION != 0;
        if durations {
            duration::load(s, c.pid_tid, c.binary_id);
        }
        (*s).strings.on = with_strings as u64;
        strings::begin(&mut (*s).strings, c.pid_tid, c.binary_id, (c.cause, c.time));
        (*s).kept = 0;
        bpf_loop(
            c.n as u32,
            filter_one::<S> as *const () as *mut c_void,
            (c as *mut DrainCtx).cast(),
            0,
        );
        if durations {
            duration::store(s, c.pid_tid, c.binary_id, c.cause);
            c.released = (*s).calls.released;
        }
        (*s).busy = 0;
    }
}

/// Record `index` of a filtered drain: read its block of records at the block's
/// first, keep it if it passes, write the chunk when it is full or the span ends.
#[inline(never)]
extern "C" fn filter_one<const S: bool>(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the DrainCtx pointer that filtered_drain() passed in.
    let c = unsafe { &mut *ctx.cast::<DrainCtx>() };
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    let mask = FILTER_BLOCK as u64 - 1;
    // SAFETY: s is this CPU's scratch entry, held by this drain (busy); indices masked.
    unsafe {
        // Position in its span: blocks are read per span.
        let (base, span_n, j) = if index < c.n1 {
            (c.a, c.n1, index)
        } else {
            (c.b, c.n - c.n1, index - c.n1)
        };
        if j & mask == 0 {
            let left = span_n - j;
            let count = if left > FILTER_BLOCK as u64 {
                FILTER_BLOCK as u64
            } else {
                left
            };
            let len = bounded(count, FILTER_BLOCK as u64) * RECORD_SIZE as u64;
            let src = base + j * RECORD_SIZE as u64;
            if !read_records::<S>((&raw mut (*s).input).cast(), len as u32, src) {
                // This block and the ones after it are not delivered, nor the
                // records kept and not yet written.
                c.dropped += c.n - index + (*s).kept;
                (*s).kept = 0;
                c.failed = 1;
                return 1;
            }
        }
        // The record stays in the scratch (no copy on the stack: the verifier's
        // 512-byte chain, callbacks included on Linux 6.1, is nearly full here).
        let r = &raw const (*s).input[(j & mask) as usize];
        let mut keep = record_passes(&mut (*s).filter, &*r);
        // The flags are read again where needed, not kept: this frame is in the
        // verifier's 512-byte chain (Linux 6.1 rounds each frame up to 32 bytes).
        if keep && (*s).filter.cfg.flags & F_DURATION != 0 {
            keep = duration::duration_step(j) != 0;
        }
        if keep {
            if (*s).strings.on != 0 {
                strings::name_strings(&raw mut (*s).strings, r);
            }
            let k = (*s).kept;
            (*s).records[(k & mask) as usize] = *r;
            (*s).kept = k + 1;
        }
        // With the duration filter the next record may release up to STEP_ROOM - 1
        // held entries before itself: the chunk is written while it lacks that room.
        let full = if (*s).filter.cfg.flags & F_DURATION != 0 {
            FILTER_BLOCK as u64 - duration::STEP_ROOM
        } else {
            FILTER_BLOCK as u64 - 1
        };
        let kept = (*s).kept;
        if kept > full || (index + 1 == c.n && kept != 0) {
            write_chunk(c, s);
        }
    }
    0
}

/// Write the scratch's chunk of kept records into the ring buffer.
///
/// # Safety
/// `s` is this CPU's scratch, held by the drain `c` (busy).
#[inline(always)]
unsafe fn write_chunk(c: &mut DrainCtx, s: *mut Scratch) {
    // SAFETY: per the caller.
    unsafe {
        let kept = (*s).kept;
        if kept == 0 {
            return;
        }
        (*s).kept = 0;
        (*s).header = header(c, kept, next_seq());
        let size = CHUNK_HEADER_BYTES + (bounded(kept, FILTER_BLOCK as u64) as usize) * RECORD_SIZE;
        let bytes = core::slice::from_raw_parts((&raw const (*s).header).cast::<u8>(), size);
        if EVENTS
            .output::<[u8]>(bytes, wakeup(size as u64, false))
            .is_ok()
        {
            c.delivered += kept;
            c.chunks += 1;
        } else {
            c.dropped += kept;
        }
    }
}
