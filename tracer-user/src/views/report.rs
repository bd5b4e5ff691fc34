//! `tracer report` and `tracer dump`: reading a trace file back.

use std::{
    cell::RefCell,
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    rc::Rc,
};

use anyhow::{Context, Result};
use serde::Serialize;
use tracer_common::{
    FLAG_KTIME, FLAG_RING, FLAG_UPROBE, FLAG_USDT_MORE, Record,
    meta::{SiteKind, TimeMode},
};

use crate::{
    read::symbols::{Frame, Symbolizer},
    tracefile::clock::Calibration,
    tracefile::{self, BinaryInfo, FinalStats, Reader, Section, SessionInfo, Truncation},
};

/// One site of a binary: its raw symbol, the readable (demangled) name, kind, address.
struct SiteName {
    raw: String,
    name: String,
    kind: SiteKind,
    vaddr: u64,
    /// Its function has exit sites (entry records can be paired).
    paired: bool,
}

/// Names for the (binary_id, site id) pairs of a trace, from its binary sections, and
/// source locations of code addresses (DWARF, see [`crate::read::symbols`]).
pub struct Names {
    /// Per binary: its name and its sites, indexed by site id.
    binaries: HashMap<u64, (String, Vec<Option<SiteName>>)>,
    /// (binary name, time mode) per binary.
    time_modes: Vec<(String, TimeMode)>,
    /// Binaries with circular buffers: their never-written records are skipped.
    rings: Vec<u64>,
    symbols: RefCell<Symbolizer>,
    /// Load bias of a binary in a process, learned from records holding both a site's
    /// run-time address and its site (blocks, memory accesses).
    biases: RefCell<HashMap<(u32, u64), u64>>,
}

impl Names {
    pub fn new(debug_dirs: &[PathBuf]) -> Names {
        Names {
            binaries: HashMap::new(),
            time_modes: Vec::new(),
            rings: Vec::new(),
            symbols: RefCell::new(Symbolizer::new(debug_dirs)),
            biases: RefCell::new(HashMap::new()),
        }
    }

    fn add(&mut self, b: &BinaryInfo) {
        if self.binaries.contains_key(&b.binary_id) {
            return;
        }
        let sites = match b.metadata() {
            Ok(m) => {
                self.time_modes.push((b.name().to_string(), m.time_mode));
                if m.buf_kind() != tracer_common::BUF_TRACE {
                    self.rings.push(b.binary_id);
                }
                self.symbols
                    .borrow_mut()
                    .add_binary(b.binary_id, &b.path, &m.build_id);
                // Site ids are indices into the site table (a bad one is not a site).
                let mut table: Vec<Option<SiteName>> = Vec::new();
                table.resize_with(m.sites.len(), || None);
                let with_exits: std::collections::HashSet<&str> = m
                    .sites
                    .iter()
                    .filter(|s| s.kind == SiteKind::FunctionExit)
                    .map(|s| s.name.as_str())
                    .collect();
                let paired: Vec<bool> = m
                    .sites
                    .iter()
                    .map(|s| with_exits.contains(s.name.as_str()))
                    .collect();
                for (s, paired) in m.sites.into_iter().zip(paired) {
                    let Some(slot) = table.get_mut(s.id as usize) else {
                        log::warn!("{}: site id {} out of range", b.path, s.id);
                        continue;
                    };
                    *slot = Some(SiteName {
                        name: crate::read::symbols::demangle(&s.name).into_owned(),
                        raw: s.name,
                        kind: s.kind,
                        vaddr: s.vaddr,
                        paired,
                    });
                }
                table
            }
            Err(e) => {
                log::warn!("{}: cannot parse its metadata: {e}", b.path);
                Vec::new()
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

    fn site(&self, id: u64, site: u32) -> Option<&SiteName> {
        self.binaries
            .get(&id)
            .and_then(|(_, s)| s.get(site as usize))
            .and_then(Option::as_ref)
    }

    /// The site's symbol as the binary spells it (mangled).
    fn raw_symbol(&self, id: u64, site: u32) -> &str {
        self.site(id, site).map_or("?", |s| s.raw.as_str())
    }

    /// The site's function, demangled.
    fn symbol(&self, id: u64, site: u32) -> &str {
        self.site(id, site).map_or("?", |s| s.name.as_str())
    }

    fn kind(&self, id: u64, site: u32) -> &'static str {
        self.site(id, site).map_or("?", |s| s.kind.name())
    }

    /// Source frames of a site, innermost first (empty: no debug information).
    pub fn site_frames(&self, id: u64, site: u32) -> Rc<[Frame]> {
        match self.site(id, site) {
            Some(s) => self.symbols.borrow_mut().frames(id, s.vaddr),
            None => Rc::from([]),
        }
    }

    /// Binary `id` is at `bias` in process `pid` (a load section).
    fn loaded_at(&self, pid: u32, id: u64, bias: u64) {
        self.biases.borrow_mut().insert((pid, id), bias);
    }

    /// Learn load biases from a record that holds its own site's run-time address.
    fn learn_at(&self, pid: u32, id: u64, s: &SiteName, rec: &Record) {
        let at = match s.kind {
            SiteKind::Memory if rec.flags & FLAG_UPROBE == 0 => rec.aux,
            SiteKind::Block => rec.value,
            _ => return,
        };
        // A bias is a whole number of pages (modulo 2^64: a library may load below its
        // link address); anything else is not an address (a damaged record, or a block
        // record carrying a chosen value).
        let bias = at.wrapping_sub(s.vaddr);
        if bias & 0xfff == 0 {
            self.biases.borrow_mut().entry((pid, id)).or_insert(bias);
        }
    }

    /// Frames of a run-time code address of process `pid` (e.g. a return address), in
    /// binary `id` or another traced binary of that process whose load bias is known;
    /// empty when none has code there. `call_return`: the address follows a call (its
    /// line is the call's).
    pub fn code_frames(&self, pid: u32, id: u64, addr: u64, call_return: bool) -> Rc<[Frame]> {
        let mut candidates: Vec<(u64, u64)> = Vec::new();
        {
            let biases = self.biases.borrow();
            candidates.extend(biases.get(&(pid, id)).map(|&b| (id, b)));
            let mut others: Vec<(u64, u64)> = biases
                .iter()
                .filter(|&(&(p, other), _)| p == pid && other != id)
                .map(|(&(_, other), &b)| (other, b))
                .collect();
            others.sort_unstable();
            candidates.extend(others);
        }
        let mut sym = self.symbols.borrow_mut();
        let mut fixed: Vec<u64> = self.binaries.keys().copied().collect();
        fixed.sort_unstable_by_key(|&b| (b != id, b));
        for b in fixed {
            if !candidates.iter().any(|&(c, _)| c == b) && sym.fixed_address(b) {
                candidates.push((b, 0));
            }
        }
        for (b, bias) in candidates {
            let at = addr.wrapping_sub(bias);
            if sym.is_code(b, at) {
                return sym.frames(b, at.saturating_sub(u64::from(call_return)));
            }
        }
        Rc::from([])
    }

    /// Where the debug information of each binary came from.
    fn debug_source(&self, id: u64) -> Option<crate::debuginfo::DebugSource> {
        self.symbols.borrow_mut().source(id)
    }
}

/// Entry and exit sites stand for their function.
fn kind_is_call_edge(kind: &str) -> bool {
    matches!(kind, "entry" | "exit")
}

/// "function (file:line)" of the outermost frame, with the inlined ones inside it:
/// "inner (a.c:3) inlined in outer (b.c:9)".
pub fn describe(frames: &[Frame]) -> String {
    let one = |f: &Frame| {
        let loc = f.location();
        if loc.is_empty() {
            f.function.clone()
        } else {
            format!("{} ({loc})", f.function)
        }
    };
    frames
        .iter()
        .map(one)
        .collect::<Vec<_>>()
        .join(" inlined in ")
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
    let mut timeline = crate::read::coarse::Timeline::scan(path)?;
    let mut r = Reader::open(path)?;
    let mut names = Names::new(&[]);
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
                        names.raw_symbol(h.binary_id, rec.site),
                        rec.value,
                        rec.aux,
                        time_ns(rec, clock.as_ref()),
                        rec.flags
                    )?;
                }
            }
            Section::Stats(s) => stats = Some(s),
            Section::Comm(..) | Section::Load(..) => {}
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
    pub binary_id: u64,
    /// The thread's name (empty when the trace has none).
    pub comm: &'a str,
    pub binary: &'a str,
    /// The site's function, demangled.
    pub symbol: &'a str,
    /// The site's symbol as the binary has it.
    pub raw_symbol: &'a str,
    /// An entry site of a function that has exit sites too (its calls can complete).
    pub paired: bool,
    /// Site kind name: "entry", "exit", "block", ...
    pub kind: &'static str,
    pub rec: &'a Record,
    /// CLOCK_MONOTONIC ns (interpolated in coarse mode).
    pub time_ns: u64,
}

/// Every real record of a trace, in delivery order, with its names and time; the
/// file's stats section (if any) at the end. `names` also learns load biases.
pub fn each_record(
    path: &Path,
    names: &mut Names,
    mut f: impl FnMut(&Event, &Names),
) -> Result<Option<FinalStats>> {
    let end = tracefile::read_stats(path)?.and_then(|s| s.clock_end);
    let mut timeline = crate::read::coarse::Timeline::scan(path)?;
    let mut r = Reader::open(path)?;
    let mut bar = rewriter::progress::Bar::new(
        std::fs::metadata(path).map_or(0, |m| m.len()),
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        format!("reading {}", path.display()),
    );
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
            Section::Load(pid, id, bias) => names.loaded_at(pid, id, bias),
            Section::Chunk(mut c) => {
                bar.set_position(r.offset());
                timeline.apply(&mut c);
                let h = c.header;
                let comm = comms.get(&(h.pid, h.tid)).map_or("", String::as_str);
                // One binary lookup per chunk, an index per record.
                let bin = names.binaries.get(&h.binary_id);
                let bin_name = bin.map_or("?", |(n, _)| n.as_str());
                for rec in c.records.iter().filter(|r| names.is_record(h.binary_id, r)) {
                    let site = bin
                        .and_then(|(_, s)| s.get(rec.site as usize))
                        .and_then(Option::as_ref);
                    if let Some(s) = site
                        && matches!(s.kind, SiteKind::Memory | SiteKind::Block)
                    {
                        names.learn_at(h.pid, h.binary_id, s, rec);
                    }
                    f(
                        &Event {
                            pid: h.pid,
                            tid: h.tid,
                            binary_id: h.binary_id,
                            comm,
                            binary: bin_name,
                            symbol: site.map_or("?", |s| s.name.as_str()),
                            raw_symbol: site.map_or("?", |s| s.raw.as_str()),
                            paired: site.is_some_and(|s| s.paired),
                            kind: site.map_or("?", |s| s.kind.name()),
                            rec,
                            time_ns: time_ns(rec, clock.as_ref()),
                        },
                        names,
                    );
                }
            }
            Section::Stats(s) => stats = Some(s),
            Section::Unknown(kind) => log::debug!("skipping section of unknown kind {kind}"),
        }
    }
    bar.finish();
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
    /// The site's symbol as the binary has it (mangled, as `tracer dump` prints it).
    symbol: String,
    /// The site's name demangled: its function (a USDT site: its probe).
    function: String,
    site: u32,
    /// Site kind: "entry", "exit".
    kind: String,
    count: u64,
    /// `file:line` of the site (innermost frame); empty without debug information.
    location: String,
    /// Source frames at the site, innermost first (more than one: inlined code).
    frames: Vec<Frame>,
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
    /// CLOCK_MONOTONIC ns of its first and last record.
    first_ns: u64,
    last_ns: u64,
    /// Completed calls (entry/exit pairs).
    calls: u64,
    /// The function it spent most self time in, and that time.
    top_function: String,
    top_self_ns: u64,
}

#[derive(Serialize)]
struct BinarySummary {
    path: String,
    binary_id: u64,
    /// GNU build-id of the original binary, hex.
    build_id: String,
    /// Where its debug information came from (none: names from the site table only).
    debug: Option<crate::debuginfo::DebugSource>,
}

/// `calls` of the report.
#[derive(Serialize, Default)]
struct CallTimes {
    functions: Vec<crate::read::calls::FunctionTime>,
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
    /// The site: function (file:line), inlined frames inside.
    at: String,
    /// Entry/exit: the caller at the return address; call sites: the call's target.
    #[serde(skip_serializing_if = "String::is_empty")]
    other: String,
}

fn summarize(
    path: &Path,
    last: usize,
    names: &mut Names,
) -> Result<(Summary, Option<SessionInfo>)> {
    let mut recent: HashMap<(u32, u32), std::collections::VecDeque<(u64, Record)>> = HashMap::new();
    let mut r = Reader::open(path)?;
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
                    debug: None,
                });
            }
            Section::Comm(pid, tid, name) => {
                comms.insert((pid, tid), name);
            }
            Section::Load(pid, id, bias) => names.loaded_at(pid, id, bias),
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
        .map(|((bin, site), count)| {
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
    let mut threads: Vec<ThreadCount> = threads
        .into_iter()
        .map(|((pid, tid), count)| ThreadCount {
            pid,
            tid,
            comm: comms.get(&(pid, tid)).cloned().unwrap_or_default(),
            count,
            first_ns: 0,
            last_ns: 0,
            calls: 0,
            top_function: String::new(),
            top_self_ns: 0,
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
                .map(|(bin, r)| {
                    let kind = names.kind(*bin, r.site);
                    let other = match kind {
                        "entry" | "exit" => names.code_frames(pid, *bin, r.aux, true),
                        "call" => names.code_frames(pid, *bin, r.value, false),
                        _ => Rc::from([]),
                    };
                    LastRecord {
                        binary: names.binary(*bin).to_string(),
                        site: r.site,
                        symbol: names.raw_symbol(*bin, r.site).to_string(),
                        kind: kind.to_string(),
                        value: r.value,
                        aux: r.aux,
                        flags: r.flags,
                        at: {
                            let frames = names.site_frames(*bin, r.site);
                            match (kind_is_call_edge(kind), frames.last()) {
                                (true, Some(f)) => describe(std::slice::from_ref(f)),
                                _ => describe(&frames),
                            }
                        },
                        other: describe(&other),
                    }
                })
                .collect(),
        })
        .collect();
    for b in &mut binaries {
        b.debug = names.debug_source(b.binary_id);
    }
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
pub fn report(
    path: &Path,
    json: bool,
    last: usize,
    debug_dirs: &[PathBuf],
    out: &mut impl Write,
) -> Result<()> {
    let mut names = Names::new(debug_dirs);
    let mut calls = crate::read::calls::Calls::default();
    // First: calls and times (each record with its time). Per thread: time span,
    // completed calls, self time per function.
    #[derive(Default)]
    struct Times {
        first_ns: u64,
        last_ns: u64,
        calls: u64,
        self_by_function: HashMap<usize, u64>,
    }
    let mut times: Vec<Times> = Vec::new();
    let mut index: HashMap<(u32, u32), usize> = HashMap::new();
    let mut recent: Option<((u32, u32), usize)> = None;
    each_record(path, &mut names, |ev, _| {
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
        if let Some(c) = calls.event(ev).completed {
            t.calls += 1;
            *t.self_by_function.entry(c.function).or_default() += c.self_ns;
        }
    })?;
    // Second: the counts and `--last` records (whose callers need the load biases the
    // first pass learned).
    let (mut s, session) = summarize(path, last, &mut names)?;
    for th in &mut s.threads {
        let Some(t) = index.get(&(th.pid, th.tid)).map(|&i| &times[i]) else {
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
        "{:>12}  {:<24} {:>6}  {:<6}  function (file:line)",
        "count", "binary", "site", "kind"
    )?;
    for f in &s.functions {
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
    if !s.calls.functions.is_empty() {
        write_calls(out, &s.calls)?;
    }
    writeln!(out, "\nthreads ({}):", s.threads.len())?;
    writeln!(
        out,
        "{:>8} {:>8} {:>12} {:>10} {:>10}  {:<16} most self time in",
        "pid", "tid", "count", "span", "calls", "name"
    )?;
    for t in &s.threads {
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
    for l in &s.last {
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
    let mut by_self: Vec<&crate::read::calls::FunctionTime> = c.functions.iter().collect();
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
