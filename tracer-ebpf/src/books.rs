//! The books: per-CPU counters (`STATS`, indexed by `STAT_*`) and the chunk sequence
//! number. Every record taken out of a buffer (or emitted at a uprobe site) is counted
//! produced, then exactly once delivered, filtered or dropped (`tracer_common::Books`).
//!
//! Produced counts records when they are taken, so records a held flush leaves behind are
//! counted once, when they finally go; `STAT_HOLDS` counts the waits (the report's
//! "back-pressure" line). A chunk sequence number is taken once a ring entry is reserved (a
//! dropped chunk still takes one), so chunks lost stays issued − received.

use tracer_common::{
    STAT_CHUNKS, STAT_RECORDS_DELIVERED, STAT_RECORDS_DROPPED, STAT_RECORDS_FILTERED,
};

use crate::{
    atomic,
    maps::{SEQ, STATS},
};

/// `STATS[index] += n` on this CPU.
#[inline(always)]
pub(crate) fn stat_add(index: u32, n: u64) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU array value. Atomic all the same: a program may be
        // preempted by another on the same CPU (sleepable ones, PREEMPT_RCU), and the
        // books must balance exactly.
        unsafe { atomic::fetch_add(p, n) };
    }
}

/// Sequence number for the next chunk; shared by all CPUs, so an atomic add.
#[inline(always)]
pub(crate) fn next_seq() -> u64 {
    match SEQ.get_ptr_mut(0) {
        // SAFETY: the map value is a live, 8-byte aligned u64 for the map's lifetime.
        Some(p) => unsafe { atomic::fetch_add(p, 1) },
        None => 0,
    }
}

/// Close the books of a drain of `n` produced records: `delivered` went out in
/// `chunks` chunks, `dropped` found no room (or could not be read), the rest were
/// filtered.
#[inline(always)]
pub(crate) fn settle(n: u64, delivered: u64, dropped: u64, chunks: u64) {
    stat_add(STAT_RECORDS_DELIVERED, delivered);
    stat_add(STAT_CHUNKS, chunks);
    let removed = n - delivered - dropped;
    if removed != 0 {
        stat_add(STAT_RECORDS_FILTERED, removed);
    }
    if dropped != 0 {
        stat_add(STAT_RECORDS_DROPPED, dropped);
    }
}
