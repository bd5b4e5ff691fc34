//! The report as plain, serialisable data (what `--json` prints and the text view
//! lays out), built by reading the trace: calls and times, then counts and `--last`.

use std::{
    collections::{HashMap, VecDeque},
    path::Path,
    rc::Rc,
};

use anyhow::Result;
use serde::Serialize;
use tracer_common::{
    ChunkHeader, FLAG_UPROBE, FLAG_USDT_MORE, Record,
    meta::{FallbackReason, Metadata, SiteMode},
};

use crate::{
    debuginfo::DebugSource,
    read::{
        accesses,
        calls::{Calls, FunctionTime},
        coarse::Timeline,
        events::{each_record, time_ns, truncation_warning},
        lang::StringStats,
        names::{Names, kind_is_call_edge},
        range::{RangeSkip, TimeRange, Window},
        symbols::{Frame, describe},
    },
    tracefile::{BinaryInfo, FinalStats, Next, Reader, Section, SessionInfo, clock::Calibration},
    views::memory::{Memory, MemoryCounts},
};

#[derive(Serialize)]
pub(crate) struct FunctionCount {
    pub binary: String,
    /// The site's symbol as the binary has it (mangled, as `tracer dump` prints it).
    pub symbol: String,
    /// The site's name demangled: its function (a USDT site: its probe).
    pub function: String,
    pub site: u32,
    /// Site kind: "entry", "exit".
    pub kind: String,
    pub count: u64,
    /// `file:line` of the site (innermost frame); empty without debug information.
    pub location: String,
    /// Source frames at the site, innermost first (more than one: inlined code).
    pub frames: Vec<Frame>,
}

#[derive(Serialize)]
pub(crate) struct BinaryTime {
    pub binary: String,
    /// "record" (a cycle-counter read per record) or "coarse" (interpolated).
    pub time_mode: String,
}

#[derive(Serialize)]
pub(crate) struct ThreadCount {
    pub pid: u32,
    pub tid: u32,
    /// The thread's name when its records were drained.
    pub comm: String,
    pub count: u64,
    /// CLOCK_MONOTONIC ns of its first and last record.
    pub first_ns: u64,
    pub last_ns: u64,
    /// Completed calls (entry/exit pairs).
    pub calls: u64,
    /// The function it spent most self time in, and that time.
    pub top_function: String,
    pub top_self_ns: u64,
}

#[derive(Serialize)]
pub(crate) struct BinarySummary {
    pub path: String,
    pub binary_id: u64,
    /// GNU build-id of the original binary, hex.
    pub build_id: String,
    /// Where its debug information came from (none: names from the site table only).
    pub debug: Option<DebugSource>,
}

/// A site the rewriter could not patch inline: the tracer attached a uprobe there.
#[derive(Serialize)]
pub(crate) struct UprobeSite {
    pub binary: String,
    pub site: u32,
    /// The site's function (a USDT site: its probe), demangled.
    pub function: String,
    pub kind: String,
    /// Why it is not inline, as `rewriter -v` says it.
    pub reason: String,
    /// Records it delivered: each one was a kernel trap.
    pub records: u64,
}

/// `calls` of the report.
#[derive(Serialize, Default)]
pub(crate) struct CallTimes {
    pub functions: Vec<FunctionTime>,
    /// Exits with no open call of their function (e.g. the call began before the
    /// session).
    pub unmatched_exits: u64,
    /// Calls that never exited through a traced exit.
    pub unfinished: u64,
    /// Calls left by unwinding (an exception, a `longjmp`), ended where control
    /// landed (counted in `functions` too).
    pub unwound: u64,
    /// Returns of an interpreted program's calls that named another function than
    /// their entry: a string that changed before its buffer was drained.
    pub renamed_returns: u64,
    /// The strings of USDT arguments (`read/lang.rs`).
    pub strings: StringStats,
}

/// The session's books: every record taken out of a buffer (or emitted at a uprobe
/// site) was delivered, filtered or dropped.
#[derive(Serialize, Default)]
pub(crate) struct Books {
    /// The session's end was written (its counters are in the file); false: every
    /// number below is unknown (0) and `balanced` false.
    pub known: bool,
    pub produced: u64,
    pub delivered: u64,
    pub filtered: u64,
    pub dropped: u64,
    pub dropped_per_cpu: Vec<u64>,
    /// Records in the file (equals delivered unless the file is truncated).
    pub received: u64,
    /// produced == delivered + filtered + dropped, and received == delivered.
    pub balanced: bool,
    pub filter: String,
    pub filter_changes: u64,
    /// Flushes that waited for room in the ring buffer (`--on-full wait`).
    pub holds: u64,
    /// Of the delivered: collected from the buffers of a process still running when a
    /// `record -p` session ended.
    pub at_stop: u64,
    /// Lost before attach: programs that waited in vain for the tracer to attach their
    /// binary (their records are in none of the counters above).
    pub unattached: u64,
    /// Of `received`: in the segments removed to keep under `--max-size`.
    pub rotated_out: u64,
    pub segments_rotated_out: u64,
    /// The duration filter: calls dropped as shorter than its threshold (their entries
    /// and exits are in `filtered`), and entries passed unjudged (deeper than its
    /// stacks).
    pub calls_short: u64,
    pub calls_deep: u64,
}

/// How a trace's session ended, as far as its file says.
#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum SessionEnd {
    /// The end was written; the traced command's exit code (128 + signal if it was
    /// killed), None when the session attached to running processes.
    Finished { exit_code: Option<i32> },
    /// The file says its session did not finish: the tracer was killed or crashed (or
    /// is still running).
    DidNotFinish,
    /// No end and no such flag: a truncated copy.
    Truncated,
    /// A segment of a trace written in segments, not its last: the session goes on in
    /// the next.
    Continued { segment: u32 },
}

#[derive(Serialize)]
pub(crate) struct Summary {
    /// Records as the drains moved them (the books' unit; a memory pair is one).
    pub records: u64,
    /// Memory accesses (a pair holds two); only when there are any.
    #[serde(skip_serializing_if = "is_zero")]
    pub accesses: u64,
    /// Of `records`, memory pairs: `records + pairs` events, as `dump` lists them.
    #[serde(skip_serializing_if = "is_zero")]
    pub pairs: u64,
    pub dropped: u64,
    pub inline: u64,
    pub uprobe: u64,
    pub read_errors: u64,
    /// Chunks the kernel numbered but that never reached the file.
    pub chunks_lost: u64,
    pub truncated: bool,
    pub functions: Vec<FunctionCount>,
    /// Calls from entry/exit pairs, by total time.
    pub calls: CallTimes,
    pub threads: Vec<ThreadCount>,
    pub binaries: Vec<BinarySummary>,
    /// Every uprobe site, most records first.
    pub uprobe_sites: Vec<UprobeSite>,
    /// Sites the rewriter left untraced (a stub or trap there would break the
    /// program); their `records` are 0.
    pub untraced_sites: Vec<UprobeSite>,
    pub books: Books,
    /// How the session ended.
    pub end: SessionEnd,
    pub time_modes: Vec<BinaryTime>,
    /// What the memory sites' accesses touched (only with memory accesses).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// `--last N`: each thread's last records, newest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub last: Vec<LastRecords>,
}

#[derive(Serialize)]
pub(crate) struct LastRecords {
    pub pid: u32,
    pub tid: u32,
    pub records: Vec<LastRecord>,
}

#[derive(Serialize)]
pub(crate) struct LastRecord {
    pub binary: String,
    pub site: u32,
    pub symbol: String,
    pub kind: String,
    pub value: u64,
    pub aux: u64,
    pub flags: u32,
    /// The site: function (file:line), inlined frames inside.
    pub at: String,
    /// Entry/exit: the caller at the return address; call sites: the call's target.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub other: String,
}

/// A report: the summary (what `--json` prints) and the session it was recorded in.
pub(crate) struct Report {
    pub summary: Summary,
    pub session: Option<SessionInfo>,
}

/// Read the trace twice: first calls and times (each record with its time), then the
/// counts and `--last` records (whose callers need the load biases the first pass
/// learned).
pub(crate) fn build(
    path: &Path,
    range: &TimeRange,
    last: usize,
    debug_dirs: &[std::path::PathBuf],
) -> Result<Report> {
    let mut names = Names::new(debug_dirs);
    let mut calls = Calls::default();
    let times = ThreadTimes::read(path, range, &mut names, &mut calls)?;
    let (mut summary, session) = summarize(path, range, last, &mut names)?;
    times.fill(&mut summary.threads, &calls);
    summary.calls = call_times(calls, &names);
    Ok(Report { summary, session })
}

/// Per thread: time span, completed calls, self time per function.
#[derive(Default)]
struct Times {
    first_ns: u64,
    last_ns: u64,
    calls: u64,
    self_by_function: HashMap<usize, u64>,
}

/// [`Times`] of every thread, from the first pass.
struct ThreadTimes {
    times: Vec<Times>,
    index: HashMap<(u32, u32), usize>,
}

impl ThreadTimes {
    fn read(
        path: &Path,
        range: &TimeRange,
        names: &mut Names,
        calls: &mut Calls,
    ) -> Result<ThreadTimes> {
        let mut times: Vec<Times> = Vec::new();
        let mut index: HashMap<(u32, u32), usize> = HashMap::new();
        let mut recent: Option<((u32, u32), usize)> = None;
        each_record(path, range, names, |ev, _| {
            let key = (ev.pid, ev.tid);
            // Records come a chunk (one thread) at a time.
            let i = match recent {
                Some((k, i)) if k == key => i,
                _ => {
                    let i = *index.entry(key).or_insert_with(|| {
                        times.push(Times {
                            first_ns: u64::MAX,
                            ..Times::default()
                        });
                        times.len() - 1
                    });
                    recent = Some((key, i));
                    i
                }
            };
            let t = &mut times[i];
            t.first_ns = t.first_ns.min(ev.time_ns);
            t.last_ns = t.last_ns.max(ev.time_ns);
            let step = calls.event(ev);
            for c in step.completed.iter().chain(&step.unwound) {
                t.calls += 1;
                let s = t.self_by_function.entry(c.function).or_default();
                *s = s.saturating_add(c.self_ns);
            }
        })?;
        Ok(ThreadTimes { times, index })
    }

    fn fill(&self, threads: &mut [ThreadCount], calls: &Calls) {
        for th in threads {
            let Some(t) = self.index.get(&(th.pid, th.tid)).map(|&i| &self.times[i]) else {
                continue;
            };
            (th.first_ns, th.last_ns, th.calls) = (t.first_ns, t.last_ns, t.calls);
            if let Some((&f, &own)) = t
                .self_by_function
                .iter()
                .max_by_key(|&(&f, &own)| (own, std::cmp::Reverse(f)))
            {
                th.top_function = calls.functions[f].function.clone();
                th.top_self_ns = own;
            }
        }
    }
}

/// The calls table: finished calls with the location of their function's entry.
fn call_times(calls: Calls, names: &Names) -> CallTimes {
    let (renamed_returns, strings, unwound) = (calls.renamed_returns, calls.strings, calls.unwound);
    let (mut functions, unmatched_exits, unfinished) = calls.finish();
    for f in &mut functions {
        if let Some((bin, site)) = f.entry_site {
            f.location = names
                .site_frames(bin, site)
                .last()
                .map(Frame::location)
                .unwrap_or_default();
        }
    }
    CallTimes {
        functions,
        unmatched_exits,
        unfinished,
        unwound,
        renamed_returns,
        strings,
    }
}

/// What the second pass counts.
#[derive(Default)]
struct Counts {
    session: Option<SessionInfo>,
    stats: Option<FinalStats>,
    /// Each thread's last records (`--last`), oldest first.
    recent: HashMap<(u32, u32), VecDeque<(u64, Record)>>,
    functions: HashMap<(u64, u32), u64>,
    /// Records that came through a uprobe, per site (a uprobe site's records may
    /// also come inline: from a trampoline's copy of its `ret`).
    through_uprobes: HashMap<(u64, u32), u64>,
    threads: HashMap<(u32, u32), u64>,
    comms: HashMap<(u32, u32), String>,
    binaries: Vec<BinarySummary>,
    /// (binary id, site id, fallback reason) of every uprobe site.
    uprobe_sites: Vec<(u64, u32, FallbackReason)>,
    /// The same of every untraced site.
    untraced_sites: Vec<(u64, u32, FallbackReason)>,
    records: u64,
    /// Memory accesses (a pair holds two).
    accesses: u64,
    /// Records that held two accesses.
    pairs: u64,
    memory: MemoryCounts,
    inline: u64,
    uprobe: u64,
    chunks: u64,
    truncated: bool,
    /// The header says the session did not finish.
    unfinished: bool,
    /// The first segment's number (a trace in segments).
    segment: Option<u32>,
}

impl Counts {
    fn read(path: &Path, range: &TimeRange, last: usize, names: &mut Names) -> Result<Counts> {
        let mut c = Counts::default();
        let mut within = Within::new(path, range)?;
        let mut r = Reader::open(path)?;
        while let Some(next) = r.next_section_unless(|hs| within.skip(hs))? {
            let section = match next {
                Next::Section(s) => s,
                // Counted, for the chunks the kernel numbered that never arrived.
                Next::Skipped(hs) => {
                    c.chunks += hs.len() as u64;
                    continue;
                }
                Next::Unread(n) => {
                    c.chunks += n;
                    continue;
                }
            };
            match section {
                Section::Session(s) => {
                    within.session(&s);
                    if let Some(keep) = within.keeps() {
                        r.only(keep);
                    }
                    c.session = Some(s);
                }
                Section::Binary(b) => {
                    names.add(&b);
                    let meta = b.metadata().ok();
                    if let Some(m) = &meta {
                        c.uprobe_sites
                            .extend(sites_of_mode(&b, m, SiteMode::Uprobe));
                        c.untraced_sites
                            .extend(sites_of_mode(&b, m, SiteMode::Untraced));
                    }
                    c.binaries.push(BinarySummary {
                        path: b.path.clone(),
                        binary_id: b.binary_id,
                        build_id: meta
                            .map(|m| m.build_id.iter().map(|x| format!("{x:02x}")).collect())
                            .unwrap_or_default(),
                        debug: None,
                    });
                }
                Section::Comm(pid, tid, name) => {
                    c.comms.insert((pid, tid), name);
                }
                Section::Load(pid, id, bias) => names.loaded_at(pid, id, bias),
                // Named in the call pass (`each_record`).
                Section::String(_) => {}
                Section::Chunk(mut chunk) => {
                    let mut pairs = accesses::expand(&mut chunk, names);
                    if within.cut(&mut chunk) {
                        // A pair's accesses are two records from here on.
                        pairs = 0;
                    }
                    c.chunk(&chunk, pairs, last, names);
                }
                Section::Stats(s) => c.stats = Some(s),
                Section::Unknown(kind) => log::debug!("skipping section of unknown kind {kind}"),
            }
        }
        truncation_warning(path, &r, c.stats.as_ref());
        c.truncated = r.truncated().is_some();
        c.unfinished = r.incomplete();
        c.segment = r.segment();
        Ok(c)
    }

    /// Count chunk `c`, whose `pairs` memory pairs are expanded already.
    fn chunk(&mut self, c: &crate::tracefile::Chunk, pairs: u64, last: usize, names: &Names) {
        self.chunks += 1;
        let h = c.header;
        let mut n = 0;
        for rec in c.records.iter().filter(|r| names.is_record(h.binary_id, r)) {
            n += 1;
            if names.is_memory(h.binary_id, rec.site) {
                self.accesses += 1;
                self.memory.access(h.pid, h.binary_id, rec);
            }
            if last > 0 {
                let q = self.recent.entry((h.pid, h.tid)).or_default();
                if q.len() == last {
                    q.pop_front();
                }
                q.push_back((h.binary_id, *rec));
            }
            self.records += 1;
            if rec.flags & FLAG_UPROBE != 0 {
                self.uprobe += 1;
                if rec.flags & FLAG_USDT_MORE == 0 {
                    *self
                        .through_uprobes
                        .entry((h.binary_id, rec.site))
                        .or_default() += 1;
                }
            } else {
                self.inline += 1;
            }
            // A USDT probe's arguments 3.. ride in extra records: a site's count is
            // its events.
            if rec.flags & FLAG_USDT_MORE == 0 {
                *self.functions.entry((h.binary_id, rec.site)).or_default() += 1;
            }
        }
        // The drains moved records: a pair is one (and inline).
        self.records = self.records.saturating_sub(pairs);
        self.inline = self.inline.saturating_sub(pairs);
        self.pairs += pairs;
        *self.threads.entry((h.pid, h.tid)).or_default() += n;
    }
}

/// The sites of a binary in `mode` (uprobe, untraced) with their reasons (`Unknown`
/// where the metadata predates them).
fn sites_of_mode(
    b: &BinaryInfo,
    meta: &Metadata,
    mode: SiteMode,
) -> Vec<(u64, u32, FallbackReason)> {
    let mut reasons: HashMap<u32, FallbackReason> = Metadata::reasons_from_note_section(&b.note)
        .and_then(Result::ok)
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.site, r.reason))
        .collect();
    meta.sites
        .iter()
        .filter(|s| s.mode == mode)
        .map(|s| {
            let why = reasons.remove(&s.id).unwrap_or(FallbackReason::Unknown);
            (b.binary_id, s.id, why)
        })
        .collect()
}

/// Every site of `of` (uprobe or untraced sites) with what it delivered, most records
/// first.
fn sites_with_reasons(
    c: &Counts,
    of: &[(u64, u32, FallbackReason)],
    names: &Names,
) -> Vec<UprobeSite> {
    let mut sites: Vec<UprobeSite> = of
        .iter()
        .map(|(bin, site, why)| UprobeSite {
            binary: names.binary(*bin).to_string(),
            site: *site,
            function: names.symbol(*bin, *site).to_string(),
            kind: names.kind(*bin, *site).to_string(),
            reason: why.to_string(),
            records: c.through_uprobes.get(&(*bin, *site)).copied().unwrap_or(0),
        })
        .collect();
    sites.sort_by(|a, b| (b.records, &a.binary, a.site).cmp(&(a.records, &b.binary, b.site)));
    sites
}

/// Records per site, most first.
fn function_counts(counts: &HashMap<(u64, u32), u64>, names: &Names) -> Vec<FunctionCount> {
    let mut functions: Vec<FunctionCount> = counts
        .iter()
        .map(|(&(bin, site), &count)| {
            let frames = names.site_frames(bin, site);
            FunctionCount {
                binary: names.binary(bin).to_string(),
                symbol: names.raw_symbol(bin, site).to_string(),
                // The site table's name (the calls table's too): a function, or a
                // USDT probe; the DWARF frames add where in it.
                function: names.symbol(bin, site).to_string(),
                site,
                kind: names.kind(bin, site).to_string(),
                count,
                // A function's entry or exit is the function's (the instruction may
                // belong to code inlined there); other sites are their innermost line.
                location: match kind_is_call_edge(names.kind(bin, site)) {
                    true => frames.last(),
                    false => frames.first(),
                }
                .map(Frame::location)
                .unwrap_or_default(),
                frames: frames.to_vec(),
            }
        })
        .collect();
    functions.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.binary.cmp(&b.binary))
            .then(a.site.cmp(&b.site))
    });
    functions
}

/// Records per thread (times and calls come from the first pass).
fn thread_counts(c: &Counts) -> Vec<ThreadCount> {
    let mut threads: Vec<ThreadCount> = c
        .threads
        .iter()
        .map(|(&(pid, tid), &count)| ThreadCount {
            pid,
            tid,
            comm: c.comms.get(&(pid, tid)).cloned().unwrap_or_default(),
            count,
            first_ns: 0,
            last_ns: 0,
            calls: 0,
            top_function: String::new(),
            top_self_ns: 0,
        })
        .collect();
    threads.sort_by_key(|t| (t.pid, t.tid));
    threads
}

/// One of a thread's last records, with its site and the code it came from or goes to.
fn last_record(names: &Names, pid: u32, bin: u64, r: &Record) -> LastRecord {
    let kind = names.kind(bin, r.site);
    let other = match kind {
        "entry" | "exit" => names.code_frames(pid, bin, r.aux, true),
        "call" => names.code_frames(pid, bin, r.value, false),
        _ => Rc::from([]),
    };
    LastRecord {
        binary: names.binary(bin).to_string(),
        site: r.site,
        symbol: names.raw_symbol(bin, r.site).to_string(),
        kind: kind.to_string(),
        value: r.value,
        aux: r.aux,
        flags: r.flags,
        at: {
            let frames = names.site_frames(bin, r.site);
            match (kind_is_call_edge(kind), frames.last()) {
                (true, Some(f)) => describe(std::slice::from_ref(f)),
                _ => describe(&frames),
            }
        },
        other: describe(&other),
    }
}

/// `--last N`: each thread's last records, newest first.
fn last_records(
    recent: &HashMap<(u32, u32), VecDeque<(u64, Record)>>,
    names: &Names,
) -> Vec<LastRecords> {
    let mut last: Vec<LastRecords> = recent
        .iter()
        .map(|(&(pid, tid), q)| LastRecords {
            pid,
            tid,
            records: q
                .iter()
                .rev()
                .map(|(bin, r)| last_record(names, pid, *bin, r))
                .collect(),
        })
        .collect();
    last.sort_by_key(|l| (l.pid, l.tid));
    last
}

fn books(st: Option<&FinalStats>) -> Books {
    let Some(st) = st else {
        // The session's end was never written: what the kernel counted is unknown.
        return Books::default();
    };
    Books {
        known: true,
        produced: st.records_produced,
        delivered: st.records_delivered,
        filtered: st.records_filtered,
        dropped: st.records_dropped,
        dropped_per_cpu: st.dropped_per_cpu.clone(),
        received: st.records_received,
        balanced: tracer_common::Books {
            produced: st.records_produced,
            delivered: st.records_delivered,
            filtered: st.records_filtered,
            dropped: st.records_dropped,
        }
        .balanced()
            && st.records_received == st.records_delivered,
        filter: st.filter.clone(),
        filter_changes: st.filter_changes,
        holds: st.holds,
        at_stop: st.records_at_stop,
        unattached: st.unattached,
        rotated_out: st.records_rotated_out,
        segments_rotated_out: st.segments_rotated_out,
        calls_short: st.calls_short,
        calls_deep: st.calls_deep,
    }
}

/// The count pass's `--since/--until`: records outside are cut from each chunk (with
/// their times as `dump` gives them).
struct Within {
    range: TimeRange,
    window: Window,
    clock: Option<Calibration>,
    end: Option<crate::tracefile::clock::Anchor>,
    /// Made only for a range.
    timeline: Option<Timeline>,
    sections: RangeSkip,
}

impl Within {
    fn new(path: &Path, range: &TimeRange) -> Result<Within> {
        let cut = *range != TimeRange::ALL;
        Ok(Within {
            range: *range,
            window: Window::ALL,
            clock: None,
            end: if cut {
                crate::tracefile::read_stats(path)?.and_then(|s| s.clock_end)
            } else {
                None
            },
            timeline: if cut {
                Some(Timeline::scan(path)?)
            } else {
                None
            },
            sections: RangeSkip::new(range),
        })
    }

    /// Whether a section of chunks with these headers can be left undecoded.
    fn skip(&mut self, headers: &[ChunkHeader]) -> bool {
        let Some(t) = &self.timeline else {
            return false;
        };
        self.sections.skip(headers, |b| t.interpolated(b))
    }

    /// The sections of chunks of the file's index to read (see [`RangeSkip::keeps`]).
    fn keeps(&self) -> Option<impl Fn(&crate::tracefile::IndexEntry) -> bool + 'static> {
        self.timeline.as_ref()?;
        self.sections.keeps()
    }

    fn session(&mut self, s: &SessionInfo) {
        self.sections.session(s.clock.anchor.monotonic_ns);
        self.window = self.range.window(s.clock.anchor.monotonic_ns);
        self.clock = Some(s.clock.refined(self.end));
    }

    /// Cut the records of `c` (pairs expanded) outside the range; whether it could have.
    fn cut(&mut self, c: &mut crate::tracefile::Chunk) -> bool {
        let Some(t) = &mut self.timeline else {
            return false;
        };
        self.sections.note(&c.header);
        t.apply(c);
        let (w, clock) = (self.window, self.clock.as_ref());
        c.records.retain(|r| w.contains(time_ns(r, clock)));
        true
    }
}

/// How the session ended, as far as the file says.
fn session_end(c: &Counts) -> SessionEnd {
    match &c.stats {
        Some(st) => SessionEnd::Finished {
            exit_code: st.exit_code,
        },
        None if c.unfinished => SessionEnd::DidNotFinish,
        None if c.truncated => SessionEnd::Truncated,
        None => match c.segment {
            Some(segment) => SessionEnd::Continued { segment },
            None => SessionEnd::Truncated,
        },
    }
}

/// The second pass: counts per site and thread, `--last` records, books, binaries.
fn summarize(
    path: &Path,
    range: &TimeRange,
    last: usize,
    names: &mut Names,
) -> Result<(Summary, Option<SessionInfo>)> {
    let mut c = Counts::read(path, range, last, names)?;
    let functions = function_counts(&c.functions, names);
    let threads = thread_counts(&c);
    let last = last_records(&c.recent, names);
    let uprobe_sites = sites_with_reasons(&c, &c.uprobe_sites, names);
    let untraced_sites = sites_with_reasons(&c, &c.untraced_sites, names);
    for b in &mut c.binaries {
        b.debug = names.debug_source(b.binary_id);
    }
    let books = books(c.stats.as_ref());
    let end = session_end(&c);
    let st = c.stats.unwrap_or_default();
    let memory = std::mem::take(&mut c.memory).finish(names);
    let summary = Summary {
        memory,
        records: c.records,
        accesses: c.accesses,
        pairs: c.pairs,
        dropped: st.records_dropped,
        inline: c.inline,
        uprobe: c.uprobe,
        read_errors: st.read_errors,
        // Known when the file read starts at the first segment kept (or is one file).
        chunks_lost: if c
            .segment
            .is_none_or(|n| n as u64 == st.segments_rotated_out + 1)
        {
            st.seq_issued
                .saturating_sub(c.chunks + st.chunks_rotated_out)
        } else {
            0
        },
        truncated: c.truncated,
        functions,
        calls: CallTimes::default(),
        threads,
        binaries: c.binaries,
        uprobe_sites,
        untraced_sites,
        books,
        end,
        last,
        time_modes: names
            .time_modes()
            .iter()
            .map(|(b, m)| BinaryTime {
                binary: b.clone(),
                time_mode: m.name().to_string(),
            })
            .collect(),
    };
    Ok((summary, c.session))
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
