//! The end of a session: the kernel's counters into the file's stats, the one-line
//! summary on stderr, the debug information kept in the cache.

use std::path::Path;

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, PerCpuArray},
};
use tracer_common::{
    STAT_CALLS_DEEP, STAT_CALLS_SHORT, STAT_CHUNKS, STAT_COUNT, STAT_HOLDS, STAT_READ_ERRORS,
    STAT_RECORDS_DELIVERED, STAT_RECORDS_DROPPED, STAT_RECORDS_FILTERED, STAT_RECORDS_PRODUCED,
    STAT_RECORDS_RELEASED, STAT_RECORDS_SKIPPED, STAT_TABLE_FULL, STAT_TABLE_SHARE,
    ebpf::{MAP_SEQ, MAP_STATS, TABLE_BINARIES, TABLES_PER_UID},
};

use super::binaries::Instrumented;
use crate::{
    record::{drain::consumer::Consumed, host::clock},
    tracefile::FinalStats,
};

/// Keep `b`'s debug information in the tracer's cache (by build-id), so the trace can
/// be symbolized after the binary changes. Best effort.
pub(super) fn cache_debug_info(b: &Instrumented) {
    let held = b.file.proc_path();
    if let Err(e) = crate::debuginfo::cache_debug_info(&b.path, &held, &b.meta.build_id, &[]) {
        log::warn!("{}: debug information not cached: {e:#}", b.path.display());
    }
}

/// The one-line summary on stderr, and warnings about lost records.
pub(super) fn print_summary(consumed: &Consumed, stats: &FinalStats, path: &Path) {
    eprintln!(
        "utrace: {} records from {} threads, {} dropped -> {}",
        consumed.records,
        consumed.threads.len(),
        stats.records_dropped,
        path.display()
    );
    let segments = crate::tracefile::segments_of(path);
    if let (false, Some(first), Some(last)) = (path.exists(), segments.first(), segments.last()) {
        eprintln!(
            "utrace: in {} segments, {} to {} (readers given {} read them as one)",
            segments.len(),
            first.1.display(),
            last.1.display(),
            path.display()
        );
    }
    if stats.read_errors > 0 {
        eprintln!(
            "utrace: warning: {} buffer reads failed (records lost)",
            stats.read_errors
        );
    }
    if stats.unattached > 0 {
        eprintln!(
            "utrace: warning: {} waited in vain for the tracer to attach; \
             their records are lost (not in the books)",
            crate::wording::programs(stats.unattached)
        );
    }
    if stats.table_full > 0 {
        eprintln!(
            "utrace: warning: a process has more than {TABLE_BINARIES} instrumented binaries; \
             records left in the extra ones at thread exit are lost"
        );
    }
    if stats.table_share > 0 {
        eprintln!(
            "utrace: warning: {} flushes of processes not drained at exit: their user's share \
             of TABLES ({TABLES_PER_UID}) is full",
            stats.table_share
        );
    }
}

/// The records the stop drain collected (`record -p` ended early): produced,
/// delivered and received, in the books like any drain's.
pub(super) fn add_stop_drain(
    stats: &mut FinalStats,
    consumed: &mut Consumed,
    c: &crate::record::drain::stop_drain::Collected,
) {
    let n = c.encoded.records;
    stats.records_at_stop = n;
    stats.records_produced += n;
    stats.records_delivered += n;
    stats.records_received += n;
    consumed.records += n;
    consumed.threads.extend(c.threads.iter().copied());
    stats.threads = consumed.threads.len() as u64;
}

/// Records dropped so far (for the live view); 0 if the counters cannot be read.
pub(super) fn dropped_so_far(ebpf: &Ebpf) -> u64 {
    ebpf.map(MAP_STATS)
        .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
        .and_then(|m| m.get(&STAT_RECORDS_DROPPED, 0).ok())
        .map_or(0, |v| v.iter().sum())
}

pub(super) fn final_stats(
    ebpf: &Ebpf,
    consumed: &Consumed,
    clock_end: clock::Anchor,
    exit_code: Option<i32>,
) -> Result<FinalStats> {
    let stats: PerCpuArray<_, u64> = PerCpuArray::try_from(
        ebpf.map(MAP_STATS)
            .with_context(|| format!("no {MAP_STATS} map"))?,
    )?;
    let mut sums = [0u64; STAT_COUNT as usize];
    for (i, sum) in sums.iter_mut().enumerate() {
        *sum = stats.get(&(i as u32), 0)?.iter().sum();
    }
    let seq: Array<_, u64> = Array::try_from(
        ebpf.map(MAP_SEQ)
            .with_context(|| format!("no {MAP_SEQ} map"))?,
    )?;
    let stat = |i: u32| sums[i as usize];
    // Drops per CPU: where a flood overran the ring buffer.
    let dropped_per_cpu: Vec<u64> = stats
        .get(&STAT_RECORDS_DROPPED, 0)?
        .iter()
        .copied()
        .collect();
    Ok(FinalStats {
        records_produced: stat(STAT_RECORDS_PRODUCED),
        // Entries the duration filter held (counted filtered) and wrote later.
        records_filtered: stat(STAT_RECORDS_FILTERED).wrapping_sub(stat(STAT_RECORDS_RELEASED)),
        calls_short: stat(STAT_CALLS_SHORT),
        calls_deep: stat(STAT_CALLS_DEEP),
        records_at_stop: 0,
        dropped_per_cpu,
        filter: String::new(),
        filter_changes: 0,
        binaries_added: 0,
        unattached: 0,
        records_delivered: stat(STAT_RECORDS_DELIVERED),
        records_dropped: stat(STAT_RECORDS_DROPPED),
        chunks: stat(STAT_CHUNKS),
        read_errors: stat(STAT_READ_ERRORS),
        records_skipped: stat(STAT_RECORDS_SKIPPED),
        table_full: stat(STAT_TABLE_FULL),
        table_share: stat(STAT_TABLE_SHARE),
        holds: stat(STAT_HOLDS),
        seq_issued: seq.get(&0, 0)?,
        records_received: consumed.records,
        chunks_received: consumed.chunks,
        bad_entries: consumed.bad_entries,
        threads: consumed.threads.len() as u64,
        clock_end: Some(clock_end),
        exit_code,
        // The writer's to say.
        segments: 0,
        records_rotated_out: 0,
        segments_rotated_out: 0,
        chunks_rotated_out: 0,
    })
}
