//! `tracer report` as text: the model of [`crate::views::model`] laid out for a
//! terminal (header, functions, memory, calls, threads, `--last` records).

use std::{io::Write, path::Path};

use anyhow::Result;

use crate::{
    read::{calls::FunctionTime, names::kind_is_call_edge, symbols::describe},
    views::{
        memory::{Memory, site_place},
        model::{
            BinarySummary, Books, CallTimes, FunctionCount, LastRecords, Report, SessionEnd,
            Summary, ThreadCount, UprobeSite,
        },
    },
    wording::programs,
};

/// The report of trace `path` as text.
pub(crate) fn write(out: &mut impl Write, path: &Path, r: &Report) -> Result<()> {
    write_header(out, path, r)?;
    write_functions(out, &r.summary.functions)?;
    if let Some(m) = &r.summary.memory {
        write_memory(out, m)?;
    }
    if !r.summary.calls.functions.is_empty() {
        write_calls(out, &r.summary.calls)?;
    }
    write_threads(out, &r.summary.threads)?;
    write_last(out, &r.summary.last)
}

/// The session, the record counts and books, the binaries and their time modes.
fn write_header(out: &mut impl Write, path: &Path, r: &Report) -> Result<()> {
    let s = &r.summary;
    writeln!(out, "trace: {}", path.display())?;
    if let Some(session) = &r.session {
        let pids: Vec<String> = session.pids.iter().map(u32::to_string).collect();
        if session.command.is_empty() && pids.is_empty() {
            writeln!(out, "session: {}", session.mode)?;
        } else {
            writeln!(
                out,
                "command: {} ({} pid {})",
                session.command.join(" "),
                session.mode,
                pids.join(",")
            )?;
        }
    }
    writeln!(
        out,
        "records: {} ({} inline, {} uprobe), dropped: {}, read errors: {}",
        s.records, s.inline, s.uprobe, s.dropped, s.read_errors
    )?;
    if s.accesses > 0 {
        writeln!(
            out,
            "memory accesses: {} (a pair record holds two)",
            s.accesses
        )?;
    }
    if s.chunks_lost > 0 {
        writeln!(out, "chunks lost: {}", s.chunks_lost)?;
    }
    write_end(out, s.end, s)?;
    write_books(out, &s.books)?;
    write_binaries(out, &s.binaries)?;
    write_uprobe_sites(out, &s.uprobe_sites)?;
    write_untraced_sites(out, &s.untraced_sites)?;
    for t in &s.time_modes {
        let how = match t.time_mode.as_str() {
            "coarse" => "coarse (no clock in the stubs; times interpolated between drains)",
            "block" => "block (cycle counter per basic block; other records take their block's)",
            _ => "record (cycle counter per record)",
        };
        writeln!(out, "timestamps of {}: {how}", t.binary)?;
    }
    Ok(())
}

/// How the session ended; where it did not, its books are unknown.
fn write_end(out: &mut impl Write, end: SessionEnd, s: &Summary) -> Result<()> {
    let how = match end {
        SessionEnd::Finished {
            exit_code: Some(c @ 129..=192),
        } => format!("finished; the command was killed by signal {}", c - 128),
        SessionEnd::Finished { exit_code: Some(c) } => {
            format!("finished; the command exited with status {c}")
        }
        SessionEnd::Finished { exit_code: None } => "finished".into(),
        SessionEnd::DidNotFinish => format!(
            "did not finish (the tracer was killed or crashed, or is still running); \
             the file holds {} records",
            s.records
        ),
        SessionEnd::Continued { segment } => format!(
            "goes on in the next segment (this is segment {segment}; the trace's name \
             without `.{segment}` reads all of it)"
        ),
        SessionEnd::Truncated => format!(
            "unknown: the file has no end (a truncated copy); it holds {} records",
            s.records
        ),
    };
    writeln!(out, "session: {how}")?;
    Ok(())
}

fn write_books(out: &mut impl Write, b: &Books) -> Result<()> {
    if !b.known {
        writeln!(
            out,
            "books: unknown here: the session's counters are written at its end"
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "books: produced {} = delivered {} + filtered {} + dropped {} ({})",
        b.produced,
        b.delivered,
        b.filtered,
        b.dropped,
        if b.balanced {
            "balanced"
        } else {
            "NOT balanced"
        }
    )?;
    if b.rotated_out > 0 {
        writeln!(
            out,
            "rotated out: {} records of the delivered, in the {} oldest segments (--max-size)",
            b.rotated_out, b.segments_rotated_out
        )?;
    }
    if b.unattached > 0 {
        writeln!(
            out,
            "lost before attach: {} waited in vain for the tracer to attach their binary; \
             their records are not in the books",
            programs(b.unattached)
        )?;
    }
    if b.at_stop > 0 {
        writeln!(
            out,
            "collected at the stop: {} records still in the buffers of the running process",
            b.at_stop
        )?;
    }
    if b.calls_short > 0 || b.calls_deep > 0 {
        writeln!(
            out,
            "duration filter: {} calls shorter than --min-duration not kept (in filtered); \
             {} entries deeper than {} open calls kept unjudged",
            b.calls_short,
            b.calls_deep,
            tracer_common::duration::CALL_DEPTH
        )?;
    }
    if b.holds > 0 {
        writeln!(
            out,
            "back-pressure: {} flushes waited for room in the ring buffer",
            b.holds
        )?;
    }
    if b.dropped > 0 {
        let per = nonzero(&b.dropped_per_cpu, |cpu, n| format!("cpu{cpu} {n}"));
        writeln!(out, "dropped per CPU: {}", per.join(", "))?;
    }
    if !b.filter.is_empty() {
        writeln!(
            out,
            "filter: {} ({} changes during the session)",
            b.filter, b.filter_changes
        )?;
    }
    Ok(())
}

fn write_binaries(out: &mut impl Write, binaries: &[BinarySummary]) -> Result<()> {
    for bin in binaries {
        let debug = match &bin.debug {
            Some(d) if d.how == "symbols" => "symbol table only, no DWARF".to_string(),
            Some(d) if d.how == "binary" => "DWARF in the binary".to_string(),
            Some(d) => format!("DWARF from {} ({})", d.path, d.how),
            None => "no debug information".to_string(),
        };
        writeln!(
            out,
            "binary: {} (build-id {}; {debug})",
            bin.path,
            if bin.build_id.is_empty() {
                "none"
            } else {
                &bin.build_id
            }
        )?;
    }
    Ok(())
}

/// Uprobe sites shown by name: the hottest ones cost a kernel trap per record.
const UPROBE_SITES_SHOWN: usize = 10;

fn write_uprobe_sites(out: &mut impl Write, sites: &[UprobeSite]) -> Result<()> {
    if sites.is_empty() {
        return Ok(());
    }
    let records: u64 = sites.iter().map(|s| s.records).sum();
    writeln!(
        out,
        "uprobe sites: {} (not patchable inline), {records} records through them",
        sites.len()
    )?;
    for s in sites.iter().take(UPROBE_SITES_SHOWN) {
        writeln!(
            out,
            "  {:>10}  {} ({}, {} site {}): {}",
            s.records, s.function, s.kind, s.binary, s.site, s.reason
        )?;
    }
    write_more(out, sites.len())
}

/// `... N more` when a list of `n` sites was cut at `UPROBE_SITES_SHOWN`.
fn write_more(out: &mut impl Write, n: usize) -> Result<()> {
    if n > UPROBE_SITES_SHOWN {
        writeln!(
            out,
            "  ... {} more (--json lists all)",
            n - UPROBE_SITES_SHOWN
        )?;
    }
    Ok(())
}

fn write_untraced_sites(out: &mut impl Write, sites: &[UprobeSite]) -> Result<()> {
    if sites.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "untraced sites: {} (a stub or a trap there would break the program)",
        sites.len()
    )?;
    for s in sites.iter().take(UPROBE_SITES_SHOWN) {
        writeln!(
            out,
            "  {} ({}, {} site {}): {}",
            s.function, s.kind, s.binary, s.site, s.reason
        )?;
    }
    write_more(out, sites.len())
}

fn write_functions(out: &mut impl Write, functions: &[FunctionCount]) -> Result<()> {
    writeln!(out, "\nfunctions ({}):", functions.len())?;
    writeln!(
        out,
        "{:>12}  {:<24} {:>6}  {:<6}  function (file:line)",
        "count", "binary", "site", "kind"
    )?;
    for f in functions {
        // Inlined code: the chain of frames; otherwise the function and its line.
        let what = if f.frames.len() > 1 && !kind_is_call_edge(&f.kind) {
            describe(&f.frames)
        } else if f.location.is_empty() {
            f.function.clone()
        } else {
            format!("{} ({})", f.function, f.location)
        };
        writeln!(
            out,
            "{:>12}  {:<24} {:>6}  {:<6}  {what}",
            f.count, f.binary, f.site, f.kind
        )?;
    }
    Ok(())
}

fn write_threads(out: &mut impl Write, threads: &[ThreadCount]) -> Result<()> {
    writeln!(out, "\nthreads ({}):", threads.len())?;
    writeln!(
        out,
        "{:>8} {:>8} {:>12} {:>10} {:>10}  {:<16} most self time in",
        "pid", "tid", "count", "span", "calls", "name"
    )?;
    for t in threads {
        let top = if t.top_function.is_empty() {
            String::new()
        } else {
            format!("{} ({})", t.top_function, ns(t.top_self_ns))
        };
        writeln!(
            out,
            "{:>8} {:>8} {:>12} {:>10} {:>10}  {:<16} {top}",
            t.pid,
            t.tid,
            t.count,
            ns(t.last_ns.saturating_sub(t.first_ns)),
            t.calls,
            t.comm
        )?;
    }
    Ok(())
}

fn write_last(out: &mut impl Write, last: &[LastRecords]) -> Result<()> {
    for l in last {
        writeln!(
            out,
            "\nlast {} records of thread {} (pid {}), newest first:",
            l.records.len(),
            l.tid,
            l.pid
        )?;
        for r in &l.records {
            let at = if r.at.is_empty() { &r.symbol } else { &r.at };
            let other = match (r.other.is_empty(), r.kind.as_str()) {
                (true, _) => String::new(),
                (false, "call") => format!(" -> {}", r.other),
                (false, _) => format!(" <- {}", r.other),
            };
            writeln!(
                out,
                "  {:<6} {:<24} {:>6}  {:#18x} {:#18x}  {at}{other}",
                r.kind, r.binary, r.site, r.value, r.aux
            )?;
        }
    }
    Ok(())
}

/// `label(i, n)` of each nonzero count `n` at index `i`.
fn nonzero(counts: &[u64], label: impl Fn(usize, u64) -> String) -> Vec<String> {
    counts
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, &n)| label(i, n))
        .collect()
}

/// Human-readable nanoseconds.
pub(crate) fn ns(v: u64) -> String {
    match v {
        0..1_000 => format!("{v}ns"),
        1_000..1_000_000 => format!("{:.1}us", v as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}ms", v as f64 / 1e6),
        _ => format!("{:.2}s", v as f64 / 1e9),
    }
}

fn write_calls(out: &mut impl Write, c: &CallTimes) -> Result<()> {
    writeln!(
        out,
        "\ncalls ({} functions with entry/exit pairs), by total time:",
        c.functions.len()
    )?;
    writeln!(
        out,
        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  function",
        "calls", "total", "self", "avg", "min", "max"
    )?;
    for f in &c.functions {
        writeln!(
            out,
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {} ({}{}{})",
            f.calls,
            ns(f.total_ns),
            ns(f.self_ns),
            ns(f.total_ns / f.calls.max(1)),
            ns(f.min_ns),
            ns(f.max_ns),
            f.function,
            f.binary,
            if f.location.is_empty() { "" } else { ", " },
            f.location
        )?;
    }
    let mut by_self: Vec<&FunctionTime> = c.functions.iter().collect();
    by_self.sort_by(|a, b| {
        b.self_ns
            .cmp(&a.self_ns)
            .then_with(|| a.function.cmp(&b.function))
    });
    let top: Vec<String> = by_self
        .iter()
        .take(10)
        .map(|f| format!("{} {}", f.function, ns(f.self_ns)))
        .collect();
    writeln!(out, "top by self time: {}", top.join(", "))?;
    for f in c.functions.iter().take(5) {
        let buckets = nonzero(&f.histogram, |i, n| format!("<{} {n}", ns(1u64 << (i + 1))));
        writeln!(out, "latency of {}: {}", f.function, buckets.join(", "))?;
    }
    if c.unwound > 0 {
        writeln!(
            out,
            "calls left by unwinding: {} (an exception or a longjmp; each ends where control landed)",
            c.unwound
        )?;
    }
    if c.unmatched_exits + c.unfinished > 0 {
        writeln!(
            out,
            "unpaired: {} exits without their entry, {} calls without their exit",
            c.unmatched_exits, c.unfinished
        )?;
    }
    let st = &c.strings;
    if st.sent > 0 {
        writeln!(
            out,
            "strings of USDT arguments: {} sent, {} again as they changed (freed and reused \
             while recorded: the drain that saw it names its records by the newer one), {} \
             stale (no string when drained), {} unreadable; {} returns of interpreted calls \
             named another function than their entry (the entry's name is kept)",
            st.sent, st.changed, st.stale, st.unreadable, c.renamed_returns
        )?;
    }
    Ok(())
}

/// The memory section: totals, hottest sites, bytes per function, hottest lines and pages.
fn write_memory(out: &mut impl Write, m: &Memory) -> Result<()> {
    writeln!(
        out,
        "\nmemory: {} accesses, {} bytes ({} reads, {} writes, {} modifies)",
        m.accesses, m.bytes, m.kinds.reads, m.kinds.writes, m.kinds.modifies
    )?;
    writeln!(
        out,
        "{:>12} {:>12} {:>5}  site  where",
        "accesses", "bytes", "r/w/m"
    )?;
    for s in &m.sites {
        let rwm = match (s.kinds.reads, s.kinds.writes, s.kinds.modifies) {
            (_, 0, 0) => "r",
            (0, _, 0) => "w",
            (0, 0, _) => "m",
            _ => "mixed",
        };
        writeln!(
            out,
            "{:>12} {:>12} {rwm:>5}  {:>4}  {} [{}]",
            s.accesses,
            s.bytes,
            s.site,
            site_place(s),
            s.binary
        )?;
    }
    writeln!(
        out,
        "{:>12} {:>12}  function (bytes moved)",
        "bytes", "accesses"
    )?;
    for f in &m.functions {
        writeln!(
            out,
            "{:>12} {:>12}  {} [{}]",
            f.bytes, f.accesses, f.function, f.binary
        )?;
    }
    for (what, spots) in [("64-byte line", &m.lines), ("4 KiB page", &m.pages)] {
        writeln!(out, "{:>12} {:>8}  hottest {what}s", "accesses", "pid")?;
        for h in spots {
            writeln!(out, "{:>12} {:>8}  {:#x}", h.accesses, h.pid, h.address)?;
        }
    }
    Ok(())
}
