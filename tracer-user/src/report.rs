//! `tracer report` and `tracer dump`: reading a trace file back.

use std::{collections::HashMap, io::Write, path::Path};

use anyhow::{Context, Result};
use serde::Serialize;
use tracer_common::{
    FLAG_KTIME, FLAG_RING, FLAG_UPROBE, FLAG_USDT_MORE, Record,
    meta::{SiteKind, TimeMode},
};

use crate::{
    clock::Calibration,
    tracefile::{self, BinaryInfo, FinalStats, Reader, Section, SessionInfo, Truncation},
};

/// Site id → (name, kind) of one binary.
type SiteNames = HashMap<u32, (String, SiteKind)>;

/// Names for the (binary_id, site id) pairs of a trace, from its binary sections.
#[derive(Default)]
struct Names {
    binaries: HashMap<u64, (String, SiteNames)>,
    /// (binary name, time mode) per binary.
    time_modes: Vec<(String, TimeMode)>,
    /// Binaries with circular buffers: their never-written records are skipped.
    rings: Vec<u64>,
}

impl Names {
    fn add(&mut self, b: &BinaryInfo) {
        let sites = match b.metadata() {
            Ok(m) => {
                self.time_modes.push((b.name().to_string(), m.time_mode));
                if m.buf_kind() != tracer_common::BUF_TRACE {
                    self.rings.push(b.binary_id);
                }
                m.sites
                    .into_iter()
                    .map(|s| (s.id, (s.name, s.kind)))
                    .collect()
            }
            Err(e) => {
                log::warn!("{}: cannot parse its metadata: {e}", b.path);
                HashMap::new()
            }
        };
        self.binaries
            .insert(b.binary_id, (b.name().to_string(), sites));
    }

    /// Whether a record is real: circular buffers are delivered whole, and the records
    /// never written there have flags 0 (a written one has `FLAG_RING`).
    fn is_record(&self, binary_id: u64, rec: &Record) -> bool {
        rec.flags & FLAG_RING != 0 || !self.rings.contains(&binary_id)
    }

    fn binary(&self, id: u64) -> &str {
        self.binaries.get(&id).map_or("?", |(n, _)| n)
    }

    fn symbol(&self, id: u64, site: u32) -> &str {
        self.binaries
            .get(&id)
            .and_then(|(_, s)| s.get(&site))
            .map_or("?", |(n, _)| n.as_str())
    }

    fn kind(&self, id: u64, site: u32) -> &'static str {
        self.binaries
            .get(&id)
            .and_then(|(_, s)| s.get(&site))
            .map_or("?", |(_, k)| k.name())
    }
}

fn truncation_warning(path: &Path, t: Option<&Truncation>, stats: Option<&FinalStats>) {
    if let Some(t) = t {
        eprintln!(
            "utrace: warning: {} is truncated: incomplete {} at byte {}; reading what precedes it",
            path.display(),
            t.what,
            t.offset
        );
    } else if stats.is_none() {
        eprintln!(
            "utrace: warning: {} has no stats section (the recording did not finish)",
            path.display()
        );
    }
}

/// Print one line per record, in delivery order:
/// `pid tid binary site symbol value aux time_ns flags` (tab separated; value and aux
/// in 0x-hex; time in CLOCK_MONOTONIC ns; flags in decimal).
pub fn dump(path: &Path, out: &mut impl Write) -> Result<()> {
    let end = tracefile::read_stats(path)?.and_then(|s| s.clock_end);
    let mut timeline = crate::coarse::Timeline::scan(path)?;
    let mut r = Reader::open(path)?;
    let mut names = Names::default();
    let mut clock: Option<Calibration> = None;
    let mut stats = None;
    while let Some(section) = r.next_section()? {
        match section {
            Section::Session(s) => clock = Some(s.clock.refined(end)),
            Section::Binary(b) => names.add(&b),
            Section::Chunk(mut c) => {
                timeline.apply(&mut c);
                let h = c.header;
                let bin = names.binary(h.binary_id);
                for rec in c.records.iter().filter(|r| names.is_record(h.binary_id, r)) {
                    writeln!(
                        out,
                        "{}\t{}\t{}\t{}\t{}\t{:#x}\t{:#x}\t{}\t{}",
                        h.pid,
                        h.tid,
                        bin,
                        rec.site,
                        names.symbol(h.binary_id, rec.site),
                        rec.value,
                        rec.aux,
                        time_ns(rec, clock.as_ref()),
                        rec.flags
                    )?;
                }
            }
            Section::Stats(s) => stats = Some(s),
            Section::Comm(..) => {}
            Section::Unknown(kind) => log::debug!("skipping section of unknown kind {kind}"),
        }
    }
    out.flush()?;
    truncation_warning(path, r.truncated(), stats.as_ref());
    Ok(())
}

/// CLOCK_MONOTONIC ns of a record: uprobe records already are; inline records carry
/// the cycle counter.
/// One record as [`each_record`] hands it out.
pub struct Event<'a> {
    pub pid: u32,
    pub tid: u32,
    /// The thread's name (empty when the trace has none).
    pub comm: &'a str,
    pub binary: &'a str,
    pub symbol: &'a str,
    /// Site kind name: "entry", "exit", "block", ...
    pub kind: &'static str,
    pub rec: &'a Record,
    /// CLOCK_MONOTONIC ns (interpolated in coarse mode).
    pub time_ns: u64,
}

/// Every real record of a trace, in delivery order, with its names and time; the
/// file's stats section (if any) at the end.
pub fn each_record(path: &Path, mut f: impl FnMut(&Event)) -> Result<Option<FinalStats>> {
    let end = tracefile::read_stats(path)?.and_then(|s| s.clock_end);
    let mut timeline = crate::coarse::Timeline::scan(path)?;
    let mut r = Reader::open(path)?;
    let mut names = Names::default();
    let mut clock: Option<Calibration> = None;
    let mut comms: HashMap<(u32, u32), String> = HashMap::new();
    let mut stats = None;
    while let Some(section) = r.next_section()? {
        match section {
            Section::Session(s) => clock = Some(s.clock.refined(end)),
            Section::Binary(b) => names.add(&b),
            Section::Comm(pid, tid, name) => {
                comms.insert((pid, tid), name);
            }
            Section::Chunk(mut c) => {
                timeline.apply(&mut c);
                let h = c.header;
                let comm = comms.get(&(h.pid, h.tid)).map_or("", String::as_str);
                for rec in c.records.iter().filter(|r| names.is_record(h.binary_id, r)) {
                    f(&Event {
                        pid: h.pid,
                        tid: h.tid,
                        comm,
                        binary: names.binary(h.binary_id),
                        symbol: names.symbol(h.binary_id, rec.site),
                        kind: names.kind(h.binary_id, rec.site),
                        rec,
                        time_ns: time_ns(rec, clock.as_ref()),
                    });
                }
            }
            Section::Stats(s) => stats = Some(s),
            Section::Unknown(kind) => log::debug!("skipping section of unknown kind {kind}"),
        }
    }
    truncation_warning(path, r.truncated(), stats.as_ref());
    Ok(stats)
}

fn time_ns(rec: &Record, clock: Option<&Calibration>) -> u64 {
    if rec.flags & FLAG_KTIME != 0 {
        rec.time
    } else {
        clock.map_or(rec.time, |c| c.monotonic_ns_of(rec.time))
    }
}

#[derive(Serialize)]
struct FunctionCount {
    binary: String,
    symbol: String,
    site: u32,
    /// Site kind: "entry", "exit".
    kind: String,
    count: u64,
}

#[derive(Serialize)]
struct BinaryTime {
    binary: String,
    /// "record" (a cycle-counter read per record) or "coarse" (interpolated).
    time_mode: String,
}

#[derive(Serialize)]
struct ThreadCount {
    pid: u32,
    tid: u32,
    /// The thread's name when its records were drained.
    comm: String,
    count: u64,
}

#[derive(Serialize)]
struct BinarySummary {
    path: String,
    binary_id: u64,
    /// GNU build-id of the original binary, hex.
    build_id: String,
}

/// `calls` of the report.
#[derive(Serialize, Default)]
struct CallTimes {
    functions: Vec<crate::calls::FunctionTime>,
    /// Exits with no open call of their function (e.g. the call began before the
    /// session).
    unmatched_exits: u64,
    /// Calls that never exited through a traced exit.
    unfinished: u64,
}

/// The session's books: every record taken out of a buffer (or emitted at a uprobe
/// site) was delivered, filtered or dropped.
#[derive(Serialize, Default)]
struct Books {
    produced: u64,
    delivered: u64,
    filtered: u64,
    dropped: u64,
    dropped_per_cpu: Vec<u64>,
    /// Records in the file (equals delivered unless the file is truncated).
    received: u64,
    /// produced == delivered + filtered + dropped, and received == delivered.
    balanced: bool,
    filter: String,
    filter_changes: u64,
}

#[derive(Serialize)]
struct Summary {
    records: u64,
    dropped: u64,
    inline: u64,
    uprobe: u64,
    read_errors: u64,
    /// Chunks the kernel numbered but that never reached the file.
    chunks_lost: u64,
    truncated: bool,
    functions: Vec<FunctionCount>,
    /// Calls from entry/exit pairs, by total time.
    calls: CallTimes,
    threads: Vec<ThreadCount>,
    binaries: Vec<BinarySummary>,
    books: Books,
    time_modes: Vec<BinaryTime>,
    /// `--last N`: each thread's last records, newest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    last: Vec<LastRecords>,
}

#[derive(Serialize)]
struct LastRecords {
    pid: u32,
    tid: u32,
    records: Vec<LastRecord>,
}

#[derive(Serialize)]
struct LastRecord {
    binary: String,
    site: u32,
    symbol: String,
    kind: String,
    value: u64,
    aux: u64,
    flags: u32,
}

fn summarize(path: &Path, last: usize) -> Result<(Summary, Option<SessionInfo>)> {
    let mut recent: HashMap<(u32, u32), std::collections::VecDeque<(u64, Record)>> = HashMap::new();
    let mut r = Reader::open(path)?;
    let mut names = Names::default();
    let mut session = None;
    let mut stats: Option<FinalStats> = None;
    let mut functions: HashMap<(u64, u32), u64> = HashMap::new();
    let mut threads: HashMap<(u32, u32), u64> = HashMap::new();
    let mut comms: HashMap<(u32, u32), String> = HashMap::new();
    let mut binaries: Vec<BinarySummary> = Vec::new();
    let (mut records, mut inline, mut uprobe, mut chunks) = (0u64, 0u64, 0u64, 0u64);
    while let Some(section) = r.next_section()? {
        match section {
            Section::Session(s) => session = Some(s),
            Section::Binary(b) => {
                names.add(&b);
                binaries.push(BinarySummary {
                    path: b.path.clone(),
                    binary_id: b.binary_id,
                    build_id: b
                        .metadata()
                        .map(|m| m.build_id.iter().map(|x| format!("{x:02x}")).collect())
                        .unwrap_or_default(),
                });
            }
            Section::Comm(pid, tid, name) => {
                comms.insert((pid, tid), name);
            }
            Section::Chunk(c) => {
                chunks += 1;
                let h = c.header;
                let mut n = 0;
                for rec in c.records.iter().filter(|r| names.is_record(h.binary_id, r)) {
                    n += 1;
                    if last > 0 {
                        let q = recent.entry((h.pid, h.tid)).or_default();
                        if q.len() == last {
                            q.pop_front();
                        }
                        q.push_back((h.binary_id, *rec));
                    }
                    records += 1;
                    if rec.flags & FLAG_UPROBE != 0 {
                        uprobe += 1;
                    } else {
                        inline += 1;
                    }
                    // A USDT probe's arguments 3.. ride in extra records: a site's
                    // count is its events.
                    if rec.flags & FLAG_USDT_MORE == 0 {
                        *functions.entry((h.binary_id, rec.site)).or_default() += 1;
                    }
                }
                *threads.entry((h.pid, h.tid)).or_default() += n;
            }
            Section::Stats(s) => stats = Some(s),
            Section::Unknown(kind) => log::debug!("skipping section of unknown kind {kind}"),
        }
    }
    truncation_warning(path, r.truncated(), stats.as_ref());
    let mut functions: Vec<FunctionCount> = functions
        .into_iter()
        .map(|((bin, site), count)| FunctionCount {
            binary: names.binary(bin).to_string(),
            symbol: names.symbol(bin, site).to_string(),
            site,
            kind: names.kind(bin, site).to_string(),
            count,
        })
        .collect();
    functions.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.binary.cmp(&b.binary))
            .then(a.site.cmp(&b.site))
    });
    let mut threads: Vec<ThreadCount> = threads
        .into_iter()
        .map(|((pid, tid), count)| ThreadCount {
            pid,
            tid,
            comm: comms.get(&(pid, tid)).cloned().unwrap_or_default(),
            count,
        })
        .collect();
    threads.sort_by_key(|t| (t.pid, t.tid));
    let mut last: Vec<LastRecords> = recent
        .into_iter()
        .map(|((pid, tid), q)| LastRecords {
            pid,
            tid,
            records: q
                .iter()
                .rev()
                .map(|(bin, r)| LastRecord {
                    binary: names.binary(*bin).to_string(),
                    site: r.site,
                    symbol: names.symbol(*bin, r.site).to_string(),
                    kind: names.kind(*bin, r.site).to_string(),
                    value: r.value,
                    aux: r.aux,
                    flags: r.flags,
                })
                .collect(),
        })
        .collect();
    last.sort_by_key(|l| (l.pid, l.tid));
    let st = stats.unwrap_or_default();
    Ok((
        Summary {
            records,
            dropped: st.records_dropped,
            inline,
            uprobe,
            read_errors: st.read_errors,
            chunks_lost: st.seq_issued.saturating_sub(chunks),
            truncated: r.truncated().is_some(),
            functions,
            calls: CallTimes::default(),
            threads,
            binaries,
            books: Books {
                produced: st.records_produced,
                delivered: st.records_delivered,
                filtered: st.records_filtered,
                dropped: st.records_dropped,
                dropped_per_cpu: st.dropped_per_cpu.clone(),
                received: st.records_received,
                balanced: st.records_produced
                    == st.records_delivered + st.records_filtered + st.records_dropped
                    && st.records_received == st.records_delivered,
                filter: st.filter.clone(),
                filter_changes: st.filter_changes,
            },
            last,
            time_modes: names
                .time_modes
                .iter()
                .map(|(b, m)| BinaryTime {
                    binary: b.clone(),
                    time_mode: m.name().to_string(),
                })
                .collect(),
        },
        session,
    ))
}

/// Per-function and per-thread counts, as text or one JSON object.
pub fn report(path: &Path, json: bool, last: usize, out: &mut impl Write) -> Result<()> {
    let (mut s, session) = summarize(path, last)?;
    let mut calls = crate::calls::Calls::default();
    each_record(path, |ev| {
        calls.event(ev);
    })?;
    let (functions, unmatched_exits, unfinished) = calls.finish();
    s.calls = CallTimes {
        functions,
        unmatched_exits,
        unfinished,
    };
    if json {
        serde_json::to_writer(&mut *out, &s).context("cannot write JSON")?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "trace: {}", path.display())?;
    if let Some(session) = &session {
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
    if s.chunks_lost > 0 {
        writeln!(out, "chunks lost: {}", s.chunks_lost)?;
    }
    let b = &s.books;
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
    if b.dropped > 0 {
        let per: Vec<String> = b
            .dropped_per_cpu
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(cpu, n)| format!("cpu{cpu} {n}"))
            .collect();
        writeln!(out, "dropped per CPU: {}", per.join(", "))?;
    }
    if !b.filter.is_empty() {
        writeln!(
            out,
            "filter: {} ({} changes during the session)",
            b.filter, b.filter_changes
        )?;
    }
    for bin in &s.binaries {
        writeln!(
            out,
            "binary: {} (build-id {})",
            bin.path,
            if bin.build_id.is_empty() {
                "none"
            } else {
                &bin.build_id
            }
        )?;
    }
    for t in &s.time_modes {
        let how = match t.time_mode.as_str() {
            "coarse" => "coarse (no clock in the stubs; times interpolated between drains)",
            "block" => "block (cycle counter per basic block; other records take their block's)",
            _ => "record (cycle counter per record)",
        };
        writeln!(out, "timestamps of {}: {how}", t.binary)?;
    }
    writeln!(out, "\nfunctions ({}):", s.functions.len())?;
    writeln!(
        out,
        "{:>12}  {:<24} {:>6}  {:<5}  symbol",
        "count", "binary", "site", "kind"
    )?;
    for f in &s.functions {
        writeln!(
            out,
            "{:>12}  {:<24} {:>6}  {:<5}  {}",
            f.count, f.binary, f.site, f.kind, f.symbol
        )?;
    }
    if !s.calls.functions.is_empty() {
        write_calls(out, &s.calls)?;
    }
    writeln!(out, "\nthreads ({}):", s.threads.len())?;
    writeln!(out, "{:>8} {:>8} {:>12}  name", "pid", "tid", "count")?;
    for t in &s.threads {
        writeln!(out, "{:>8} {:>8} {:>12}  {}", t.pid, t.tid, t.count, t.comm)?;
    }
    for l in &s.last {
        writeln!(
            out,
            "\nlast {} records of thread {} (pid {}), newest first:",
            l.records.len(),
            l.tid,
            l.pid
        )?;
        for r in &l.records {
            writeln!(
                out,
                "  {:<6} {:<24} {:>6}  {:#18x} {:#18x}  {}",
                r.kind, r.binary, r.site, r.value, r.aux, r.symbol
            )?;
        }
    }
    Ok(())
}

/// Human-readable nanoseconds.
fn ns(v: u64) -> String {
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
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {} ({})",
            f.calls,
            ns(f.total_ns),
            ns(f.self_ns),
            ns(f.total_ns / f.calls.max(1)),
            ns(f.min_ns),
            ns(f.max_ns),
            f.function,
            f.binary
        )?;
    }
    for f in c.functions.iter().take(5) {
        let buckets: Vec<String> = f
            .histogram
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| format!("<{} {n}", ns(1u64 << (i + 1))))
            .collect();
        writeln!(out, "latency of {}: {}", f.function, buckets.join(", "))?;
    }
    if c.unmatched_exits + c.unfinished > 0 {
        writeln!(
            out,
            "unpaired: {} exits without their entry, {} calls without their exit",
            c.unmatched_exits, c.unfinished
        )?;
    }
    Ok(())
}
