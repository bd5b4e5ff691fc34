//! The duration filter (`tracer record --min-duration`): keep a call's entry and exit
//! only when the call lasted at least a threshold (uftrace's `-t`). One algorithm,
//! [`judge`], run by both drains: the eBPF drain (`tracer-ebpf/src/drain.rs`) and the
//! user-space drain (`tracer-user/src/record/drain/duration.rs`).
//!
//! Per thread and binary a [`CallStack`] of open calls: an entry is held there (not
//! written) until its exit is drained, across buffers. An exit pops down to the
//! innermost open call of its function (as the readers pair calls). A call that lasted
//! at least the threshold releases the held entries below it first (its callers last at
//! least as long, so they pass too): `emitted` is always a prefix of the stack, and an
//! entry once written always gets its exit written. A short call's entry and exit are
//! both dropped. Landings and resumes (unwinding) end the calls above their function's
//! innermost open call at their time: those that lasted long enough are released, and
//! the record is kept when a released call ends there. Records of other kinds pass.
//!
//! Bounds: `CALL_DEPTH` open calls per stack; deeper entries pass unjudged (counted,
//! `STAT_CALLS_DEEP`) with their exits. Calls whose entry is at a uprobe site are not
//! seen by the drains (their records go straight to the ring) and pass. Time is the
//! records' cycle counter, so binaries rewritten with `--time coarse` or `block`
//! (entries without a clock) are not judged. Entries still held when their thread
//! exits (calls that never returned) are not written: they stay counted filtered.
//!
//! Books: a held entry is counted filtered when it is drained; when it is released
//! later it is counted again in `STAT_RECORDS_RELEASED`, and then delivered or dropped
//! like any record, so `filtered = STAT_RECORDS_FILTERED - STAT_RECORDS_RELEASED`.

use crate::record::Record;

/// Open calls a stack holds (a power of two).
pub const CALL_DEPTH: usize = 64;

/// `CALL_SITES` kinds: the site begins a call (of a function with exit sites).
pub const CALL_ENTRY: u64 = 1;
/// The site ends its function's innermost open call.
pub const CALL_EXIT: u64 = 2;
/// Unwinding landed in the function: the calls above its innermost open call end.
pub const CALL_LANDING: u64 = 3;
/// Unwinding goes on past the function: its innermost open call ends too.
pub const CALL_RESUME: u64 = 4;

/// Functions of a binary the filter numbers (a `CALL_SITES` value fits 32 bits).
pub const MAX_FUNCTIONS: u32 = 1 << 24;

/// `CALL_SITES` value: kind in the low byte, the binary's function number above.
pub const fn call_site_info(kind: u64, function: u32) -> u64 {
    kind | (function as u64) << 8
}

/// `CALL_SITES` key.
pub const fn call_site_key(binary_id: u64, site: u32) -> [u64; 2] {
    [binary_id, site as u64]
}

/// `CALL_STACKS` key: one stack per thread and binary (a thread's buffers of different
/// binaries are drained apart, and each binary's calls nest among themselves).
pub const fn call_stack_key(pid_tid: u64, binary_id: u64) -> [u64; 2] {
    [pid_tid, binary_id]
}

/// The open calls of one thread in one binary.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CallStack {
    /// Open calls on the stack.
    pub depth: u64,
    /// The first `emitted` of them have had their entry written.
    pub emitted: u64,
    /// Open calls deeper than `CALL_DEPTH` (passed unjudged).
    pub over: u64,
    pub _pad: u64,
    /// Function number of each open call.
    pub funcs: [u64; CALL_DEPTH],
    /// Entry record of each open call.
    pub entries: [Record; CALL_DEPTH],
}

impl CallStack {
    pub const EMPTY: CallStack = CallStack {
        depth: 0,
        emitted: 0,
        over: 0,
        _pad: 0,
        funcs: [0; CALL_DEPTH],
        entries: [Record {
            site: 0,
            flags: 0,
            time: 0,
            value: 0,
            aux: 0,
        }; CALL_DEPTH],
    };
}

/// What to do with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write it (not a call record, or a call not judged).
    Keep,
    /// An entry deeper than `CALL_DEPTH`: written unjudged (counted).
    Deep,
    /// An entry now held on the stack: not written (yet).
    Hold,
    /// The exit of a call shorter than the threshold: neither it nor its entry is written.
    Short,
    /// Write the held entries `entries[from..to]` (in order), then the record if `keep`.
    Release { from: u64, to: u64, keep: bool },
}

const MASK: u64 = CALL_DEPTH as u64 - 1;

/// Judge record `r`, whose site's `CALL_SITES` value is `info` (0: not a call site),
/// against `threshold` cycle-counter ticks (0: every call passes, none waits).
#[inline(always)]
pub fn judge(stack: &mut CallStack, r: &Record, info: u64, threshold: u64) -> Verdict {
    let kind = info & 0xff;
    let func = info >> 8;
    if kind == CALL_ENTRY {
        return push(stack, r, func, threshold);
    }
    if kind == CALL_EXIT {
        if stack.over > 0 {
            stack.over -= 1;
            return Verdict::Keep;
        }
        let Some(k) = innermost(stack, func) else {
            return Verdict::Keep;
        };
        let long = r.time.wrapping_sub(stack.entries[(k & MASK) as usize].time) >= threshold;
        if long || k < stack.emitted {
            let from = stack.emitted;
            let to = if k + 1 > from { k + 1 } else { from };
            stack.depth = k;
            stack.emitted = k;
            return Verdict::Release {
                from,
                to,
                keep: true,
            };
        }
        stack.depth = k;
        return Verdict::Short;
    }
    if kind == CALL_LANDING || kind == CALL_RESUME {
        let deep = stack.over > 0;
        stack.over = 0;
        let Some(k) = innermost(stack, func) else {
            return Verdict::Keep;
        };
        // Calls [top, depth) end here.
        let top = if kind == CALL_RESUME { k } else { k + 1 };
        let from = stack.emitted;
        let to = long_prefix(stack, r.time, threshold);
        stack.depth = top;
        stack.emitted = if to < top { to } else { top };
        return Verdict::Release {
            from,
            to,
            keep: deep || to > top,
        };
    }
    Verdict::Keep
}

/// An entry: held on the stack, or passed unjudged when the stack is full.
#[inline(always)]
fn push(stack: &mut CallStack, r: &Record, func: u64, threshold: u64) -> Verdict {
    if stack.over > 0 || stack.depth >= CALL_DEPTH as u64 {
        stack.over = stack.over.saturating_add(1);
        return Verdict::Deep;
    }
    let d = (stack.depth & MASK) as usize;
    stack.entries[d] = *r;
    stack.funcs[d] = func;
    stack.depth += 1;
    if threshold == 0 {
        // Nothing waits: the entry (and any held under it) is written at once.
        let from = stack.emitted;
        stack.emitted = stack.depth;
        return Verdict::Release {
            from,
            to: stack.depth - 1,
            keep: true,
        };
    }
    Verdict::Hold
}

/// Index of the innermost open call of function `func`.
#[inline(always)]
fn innermost(stack: &CallStack, func: u64) -> Option<u64> {
    let mut i = 0;
    while i < CALL_DEPTH as u64 {
        if i >= stack.depth {
            return None;
        }
        let k = (stack.depth - 1 - i) & MASK;
        if stack.funcs[k as usize] == func {
            return Some(k);
        }
        i += 1;
    }
    None
}

/// The open calls that have lasted at least `threshold` at time `now`: a prefix of the
/// stack (entries are in time order), returned as its length (at least `emitted`, at
/// most `depth`). A binary search: a few branches for the eBPF verifier to walk, where
/// a scan gives it one per open call.
#[inline(always)]
fn long_prefix(stack: &CallStack, now: u64, threshold: u64) -> u64 {
    let (mut lo, mut hi) = (stack.emitted, stack.depth);
    let mut step = 0;
    // ceil(log2(CALL_DEPTH + 1)) halvings.
    while step < 7 && lo < hi {
        let mid = lo + (hi - lo) / 2;
        if now.wrapping_sub(stack.entries[(mid & MASK) as usize].time) >= threshold {
            lo = mid + 1;
        } else {
            hi = mid;
        }
        step += 1;
    }
    lo
}

/// The `CALL_SITES` entries of a binary: (site id, `call_site_info`). A function is
/// judged when it has exit sites (else its entries never end a call) and every one of
/// its sites is an inline stub (a uprobe site's record goes to the ring without the
/// drain, and the stack would miss it). Functions are numbered by name, as readers
/// pair calls (one function per binary and symbol).
#[cfg(feature = "std")]
pub fn call_sites(meta: &crate::meta::Metadata) -> std::vec::Vec<(u32, u64)> {
    use crate::meta::{SiteKind, SiteMode};
    use std::collections::{HashMap, HashSet};
    let kind = |k: SiteKind| match k {
        SiteKind::FunctionEntry => Some(CALL_ENTRY),
        SiteKind::FunctionExit => Some(CALL_EXIT),
        SiteKind::Landing => Some(CALL_LANDING),
        SiteKind::Resume => Some(CALL_RESUME),
        _ => None,
    };
    let mut exits = HashSet::new();
    let mut unjudged = HashSet::new();
    for s in &meta.sites {
        if s.kind == SiteKind::FunctionExit {
            exits.insert(s.name.as_str());
        }
        if kind(s.kind).is_some() && s.mode != SiteMode::Inline {
            unjudged.insert(s.name.as_str());
        }
    }
    let mut numbers: HashMap<&str, u32> = HashMap::new();
    let mut out = std::vec::Vec::new();
    for s in &meta.sites {
        let Some(k) = kind(s.kind) else { continue };
        let name = s.name.as_str();
        if !exits.contains(name) || unjudged.contains(name) {
            continue;
        }
        let next = numbers.len() as u32;
        let f = *numbers.entry(name).or_insert(next);
        if f >= MAX_FUNCTIONS {
            continue; // passes unjudged (the drain's cache keeps 32 bits of a value)
        }
        out.push((s.id, call_site_info(k, f)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(site: u32, time: u64) -> Record {
        Record {
            site,
            flags: 0,
            time,
            value: 0,
            aux: 0,
        }
    }

    /// Run `events` (kind, function, time) through a stack; the records written, as
    /// (kind, function, time).
    fn run(events: &[(u64, u32, u64)], threshold: u64) -> Vec<(u64, u32, u64)> {
        let mut stack = CallStack::EMPTY;
        let mut out = Vec::new();
        for &(kind, func, time) in events {
            let r = rec(kind as u32 * 1000 + func, time);
            let mut keep = false;
            match judge(&mut stack, &r, call_site_info(kind, func), threshold) {
                Verdict::Keep | Verdict::Deep => keep = true,
                Verdict::Hold | Verdict::Short => {}
                Verdict::Release { from, to, keep: k } => {
                    for e in &stack.entries[from as usize..to as usize] {
                        out.push((CALL_ENTRY, e.site % 1000, e.time));
                    }
                    keep = k;
                }
            }
            if keep {
                out.push((kind, func, time));
            }
        }
        out
    }

    const E: u64 = CALL_ENTRY;
    const X: u64 = CALL_EXIT;

    #[test]
    fn long_calls_keep_their_callers_and_short_ones_go() {
        // main(1) { a(2) short; b(3) { c(4) long } }
        let ev = [
            (E, 1, 0),
            (E, 2, 10),
            (X, 2, 12),
            (E, 3, 20),
            (E, 4, 21),
            (X, 4, 200),
            (X, 3, 201),
            (X, 1, 300),
        ];
        let kept = run(&ev, 100);
        assert_eq!(
            kept,
            vec![
                (E, 1, 0),
                (E, 3, 20),
                (E, 4, 21),
                (X, 4, 200),
                (X, 3, 201),
                (X, 1, 300)
            ]
        );
        assert_eq!(run(&ev, 0), ev.to_vec());
        assert_eq!(run(&ev, 1000), vec![]);
    }

    #[test]
    fn an_exit_pops_to_its_function_and_deep_calls_pass() {
        // f's entry, g's entry whose exit is never seen, then f's exit.
        let kept = run(&[(E, 1, 0), (E, 2, 5), (X, 1, 500)], 100);
        assert_eq!(kept, vec![(E, 1, 0), (X, 1, 500)]);
        // CALL_DEPTH + 2 nested short calls: the two deepest pass.
        let n = CALL_DEPTH as u32 + 2;
        let mut ev: Vec<_> = (0..n).map(|i| (E, i, i as u64)).collect();
        ev.extend((0..n).rev().map(|i| (X, i, 100 + i as u64)));
        let kept = run(&ev, 1000);
        let funcs: Vec<u32> = kept.iter().map(|k| k.1).collect();
        assert_eq!(funcs, vec![64, 65, 65, 64]);
    }

    #[test]
    fn a_landing_ends_the_calls_above_its_function() {
        // f { g { h (throws) } } lands in f: g and h end at the landing.
        let ev = [
            (E, 1, 0),
            (E, 2, 10),
            (E, 3, 20),
            (CALL_LANDING, 1, 150),
            (X, 1, 160),
        ];
        // g lasted 140, h 130: with 135 only g is written and ends at the landing.
        let kept = run(&ev, 135);
        assert_eq!(
            kept,
            vec![(E, 1, 0), (E, 2, 10), (CALL_LANDING, 1, 150), (X, 1, 160)]
        );
        // Nothing above f lasted 145: the landing is not kept, f is.
        let kept = run(&ev, 145);
        assert_eq!(kept, vec![(E, 1, 0), (X, 1, 160)]);
        // Everything lasted 125: all of it is written.
        assert_eq!(run(&ev, 125), ev.to_vec());
    }
}
