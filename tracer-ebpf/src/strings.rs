//! String arguments of USDT probes (Python's `function__entry(filename, funcname,
//! lineno)`): a record holds only the pointers, so the drain, which runs while the
//! process lives, reads what they point at and sends it (`CHUNK_KIND_STRING`) before
//! the chunk that holds the record: once per (process, pointer) while the first
//! `STRING_PROBE_BYTES` − 1 there stay the same (`STRINGS`, an LRU map).
//!
//! What is sent is what a pointer held when the buffer was drained, not when the probe
//! fired: a pointer freed and reused for a string with the same first bytes in between
//! cannot be told apart (Python's code objects hold their names while they live); one
//! that became unreadable keeps the string it was sent with, and so does any pointer
//! named before at a thread's exit (a program frees much before it exits); one whose
//! bytes changed is sent again marked `STRING_CHANGED`.
//! Drains of binaries with string arguments take the per-record path of a filtered
//! drain (`drain::filtered_drain`), where each kept record passes through here; a
//! pointer is read once per drain (the thread is stopped while its buffer is drained),
//! and sites and pointers are cached for the drain in the per-CPU scratch.
//!
//! The read is `bpf_probe_read_user_str` of `STRING_PROBE_BYTES` − 1 bytes and the NUL,
//! compared with what `STRINGS[tgid, ptr]` last sent; a difference sends a
//! `StringChunk` of up to 256 bytes. `tracer-user/src/probes.rs` says which arguments
//! are strings; the loader fills `STRING_SITES`. Test
//! `python::python_functions_by_name_as_bpftrace_counts_them`.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_probe_read_user_str;
use tracer_common::{
    CAUSE_TASK_EXIT, CAUSE_THREAD_EXIT, CHUNK_KIND_STRING, FLAG_USDT_INDEX_SHIFT, FLAG_USDT_MORE,
    Record, STRING_BYTES, STRING_CHANGED, STRING_OK, STRING_TRUNCATED, STRING_UNREADABLE,
    StringChunk,
    ebpf::{STRING_PROBE_BYTES, STRING_SITES_ANY},
};

use crate::maps::{
    EVENTS, SCRATCH, STRING_SEEN_CACHE, STRING_SITE_CACHE, STRING_SITES, STRINGS, StringState,
};

/// Whether sites of `binary_id` have string arguments (one lookup per drain).
#[inline(always)]
pub(crate) fn binary_has_strings(binary_id: u64) -> bool {
    // The marker's value (1), not the pointer: LLVM would otherwise fold the null test
    // into arithmetic on the pointer, which the verifier refuses.
    match STRING_SITES.get_ptr(&[binary_id, STRING_SITES_ANY]) {
        // SAFETY: a live map value.
        Some(p) => (unsafe { core::ptr::read_volatile(p) }) != 0,
        None => false,
    }
}

/// Start the string pass of a drain (`cause`: `CAUSE_*`, `time`: its clock sample) of
/// thread `pid_tid`'s records of `binary_id`.
#[inline(always)]
pub(crate) fn begin(st: &mut StringState, pid_tid: u64, binary_id: u64, (cause, time): (u32, u64)) {
    st.at_exit = (cause == CAUSE_THREAD_EXIT || cause == CAUSE_TASK_EXIT) as u64;
    st.pid_tid = pid_tid;
    st.binary_id = binary_id;
    st.time = time;
    st.generation += 1;
    st.mask = 0;
}

/// Send the strings behind record `r`'s string arguments that this process has not
/// sent yet (a record the drain keeps, before the chunk holding it is written).
///
/// # Safety
/// `st` and `r` point into this CPU's scratch, held by the drain (its busy flag).
#[inline(always)]
pub(crate) unsafe fn name_strings(st: *mut StringState, r: *const Record) {
    // SAFETY: the caller's promise.
    let (st, r) = unsafe { (&mut *st, &*r) };
    // A probe's first record holds arguments 1 and 2; record k after it (flagged
    // FLAG_USDT_MORE) arguments 2k + 3 and 2k + 4.
    let first_bit = if r.flags & FLAG_USDT_MORE != 0 {
        2 * (r.flags >> FLAG_USDT_INDEX_SHIFT) as u64 + 2
    } else {
        st.mask = site_mask(st, r.site);
        0
    };
    if first_bit >= 64 {
        return;
    }
    let bits = (st.mask >> first_bit) & 3;
    let (value, aux) = (r.value, r.aux);
    // `st` is not used past here: name_string reaches the scratch itself.
    if bits & 1 != 0 {
        name_string(value);
    }
    if bits & 2 != 0 {
        name_string(aux);
    }
}

/// String arguments of `site` (bit i = argument i + 1), cached for the drain (a
/// probe's sites alternate: Python's entry, line, return).
#[inline(always)]
fn site_mask(st: &mut StringState, site: u32) -> u64 {
    let i = site as usize & (STRING_SITE_CACHE - 1);
    // Element by element: no array copy on the stack (the drain's call chain has
    // little left).
    if st.sites[i][0] == site as u64 + 1 && st.sites[i][2] == st.generation {
        return st.sites[i][1];
    }
    st.key[0] = st.binary_id;
    st.key[1] = site as u64;
    let mask = match STRING_SITES.get_ptr(&st.key) {
        // SAFETY: a live map value, read at once.
        Some(p) => unsafe { *p },
        None => 0,
    };
    st.sites[i][0] = site as u64 + 1;
    st.sites[i][1] = mask;
    st.sites[i][2] = st.generation;
    mask
}

/// Send the string at `ptr` unless this process sent the same first bytes for it: a
/// BPF global function (exported by build.rs), checked once by the verifier, not again
/// in every state of the drain's per-record callback, which it walks until they
/// converge (about 100,000 instructions a program when it was a static function).
/// Scalars only: it finds the string state in this CPU's scratch, which the calling
/// drain holds (its busy flag). Its frame is at most 32 bytes, called from the drain's
/// callback (at most 64): Linux 6.1 counts callback frames, rounded up to 32 bytes,
/// into the verifier's 512-byte chain, and the flush's chain has 96 bytes left for
/// both.
#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) extern "C" fn name_string(ptr: u64) -> i64 {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch, held by the drain that calls (see above).
    name_one(unsafe { &mut (*s).strings }, ptr);
    0
}

#[inline(always)]
fn name_one(st: &mut StringState, ptr: u64) {
    if ptr == 0 {
        return;
    }
    // Read once per drain: the thread is stopped in it, its strings stay as they are.
    let i = ((ptr >> 4) ^ (ptr >> 10)) as usize & (STRING_SEEN_CACHE - 1);
    if st.seen[i][0] == ptr && st.seen[i][1] == st.generation {
        return;
    }
    st.key[0] = st.pid_tid >> 32;
    st.key[1] = ptr;
    // At exit a program has freed much of what its last records named (an
    // interpreter its code): a pointer named before keeps its string.
    if st.at_exit != 0 && STRINGS.get_ptr(&st.key).is_some() {
        remember(st, i, ptr);
        return;
    }
    if !probe(st, ptr) {
        remember(st, i, ptr);
        return;
    }
    if send(st, ptr) {
        let _ = STRINGS.insert(&st.key, &st.probe, 0);
        remember(st, i, ptr);
    }
}

/// Read the first bytes at `ptr` into the probe and its status; false when they are
/// what this process sent for `ptr` before (or it is unreadable now and was not then).
#[inline(always)]
fn probe(st: &mut StringState, ptr: u64) -> bool {
    fill(&mut st.probe, 0);
    // SAFETY: the probe is STRING_PROBE_BYTES of map memory; the helper checks `ptr`.
    let n = unsafe {
        bpf_probe_read_user_str(
            st.probe.as_mut_ptr().cast(),
            STRING_PROBE_BYTES as u32,
            ptr as *const c_void,
        )
    };
    // Kept in the scratch, not in registers: this frame must stay within 32 bytes.
    st.status = if n < 0 { STRING_UNREADABLE } else { STRING_OK } as u64;
    if let Some(seen) = STRINGS.get_ptr(&st.key) {
        // A pointer read before and unmapped since (an interpreter freeing its code at
        // exit, before the last drain) keeps the string it held: nothing is there now.
        // SAFETY: `seen` is a live map value, compared at once.
        if n < 0 || unsafe { same(seen, &st.probe) } {
            return false;
        }
        st.status |= STRING_CHANGED as u64;
    }
    if n < 0 {
        // No string reads as all ones (its last byte would be the NUL).
        fill(&mut st.probe, u64::MAX);
    }
    true
}

/// Send the string at `ptr` as a `StringChunk`; false when it was not sent (no room,
/// or the memory changed since [`probe`]).
#[inline(always)]
fn send(st: &mut StringState, ptr: u64) -> bool {
    let Some(mut entry) = EVENTS.reserve::<StringChunk>(0) else {
        // Not remembered: a later drain sends it.
        return false;
    };
    let p = entry.as_mut_ptr();
    // SAFETY: the reservation is one StringChunk; the helper writes at most
    // STRING_BYTES into its bytes.
    unsafe {
        // Field by field: a whole header would be built on the stack first.
        let h = &raw mut (*p).header;
        (*h).kind = CHUNK_KIND_STRING;
        (*h).count = 0;
        (*h).pid = (st.pid_tid >> 32) as u32;
        (*h).tid = st.pid_tid as u32;
        (*h).seq = 0;
        (*h).binary_id = st.binary_id;
        (*h).cause = 0;
        (*h)._pad = 0;
        (*h).time = st.time;
        (*p).ptr = ptr;
        let full = bpf_probe_read_user_str(
            (&raw mut (*p).bytes).cast(),
            STRING_BYTES as u32,
            ptr as *const c_void,
        );
        // The memory changed between the two reads (mapped or unmapped): what is
        // remembered must be what is sent, so try again at the next drain.
        let first = st.status as u32;
        if (full < 0) != (first & STRING_UNREADABLE != 0) {
            entry.discard(0);
            return false;
        }
        (*p).len = if full > 0 { full as u32 } else { 0 };
        (*p).status = if full as usize >= STRING_BYTES {
            first | STRING_TRUNCATED
        } else {
            first
        };
    }
    entry.submit(0);
    true
}

/// `ptr` was read in this drain.
#[inline(always)]
fn remember(st: &mut StringState, i: usize, ptr: u64) {
    st.seen[i][0] = ptr;
    st.seen[i][1] = st.generation;
}

const _: () = assert!(STRING_PROBE_BYTES == 32, "fill and same take four words");

// Word by word, in place: an array temporary would take stack the drain's call chain
// does not have (the verifier's 512 bytes).
#[inline(always)]
fn fill(probe: &mut [u64; STRING_PROBE_BYTES / 8], v: u64) {
    probe[0] = v;
    probe[1] = v;
    probe[2] = v;
    probe[3] = v;
}

/// # Safety
/// `seen` points at a live `STRINGS` value.
#[inline(always)]
unsafe fn same(
    seen: *const [u64; STRING_PROBE_BYTES / 8],
    probe: &[u64; STRING_PROBE_BYTES / 8],
) -> bool {
    // SAFETY: the caller's promise.
    let s = unsafe { &*seen };
    s[0] == probe[0] && s[1] == probe[1] && s[2] == probe[2] && s[3] == probe[3]
}
