//! Every real record of a trace in delivery order, with its names and its
//! CLOCK_MONOTONIC time (coarse times interpolated): what calls and the views consume.
//!
//! Readers (`report`, `export`, `flamegraph`) walk the file once (`each_record`): per record
//! the site's demangled name (a site table indexed by site id), its time, and through
//! `Calls` the calls it opens or closes; source lines come from `Symbolizer` once per site;
//! run-time code addresses (return addresses, call targets) are mapped to file addresses
//! with the process's load bias (load sections, else block/memory records, which hold their
//! own site's address). Memory pairs become two records first (`accesses`), so an event
//! is one access. `Threads` is what a reader keeps between sections.

use std::{collections::HashMap, path::Path};

use anyhow::Result;
use tracer_common::{FLAG_KTIME, FLAG_USDT_MORE, Record};

use crate::{
    read::{
        accesses,
        coarse::Timeline,
        lang::{Lang, LangCall},
        names::Names,
        range::{RangeSkip, TimeRange, Window},
    },
    tracefile::{self, Chunk, FinalStats, Next, Reader, Section, clock::Calibration},
};

/// Say on stderr what a trace without its end is: the file of a session that did not
/// finish (killed, or still running), or a truncated copy; its books are unknown.
pub(crate) fn truncation_warning<R: std::io::Read>(
    path: &Path,
    r: &Reader<R>,
    stats: Option<&FinalStats>,
) {
    let unfinished = r.incomplete() && stats.is_none();
    if let (Some(n), None, false, None) = (r.segment(), stats, unfinished, r.truncated()) {
        eprintln!(
            "utrace: note: {} is segment {n} of a trace that goes on in the next; the trace's \
             name without `.{n}` reads all of it",
            path.display()
        );
        return;
    }
    let what = if unfinished {
        "the session writing it did not finish (the tracer was killed, or is still running)"
    } else {
        "it has no end (a truncated copy)"
    };
    if let Some(t) = r.truncated() {
        eprintln!(
            "utrace: warning: {}: {what}: incomplete {} at byte {}; reading what precedes it",
            path.display(),
            t.what,
            t.offset
        );
    } else if stats.is_none() {
        eprintln!(
            "utrace: warning: {}: {what}; reading all it holds",
            path.display()
        );
    }
}

/// One record as [`each_record`] hands it out.
pub(crate) struct Event<'a> {
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
    /// The call of an interpreted program this record opens or closes (a call probe's
    /// record that completes its arguments).
    pub lang: Option<LangCall>,
    /// The texts of [`LangCall`]'s string ids.
    pub strings: &'a Lang,
}

/// What a reader keeps from one section to the next: thread names, the strings of
/// USDT arguments, call probes under way.
#[derive(Default)]
pub(crate) struct Threads {
    comms: HashMap<(u32, u32), String>,
    pub lang: Lang,
}

impl Threads {
    /// Take a comm or string section (others are not for it).
    pub(crate) fn section(&mut self, s: Section) {
        match s {
            Section::Comm(pid, tid, name) => {
                self.comms.insert((pid, tid), name);
            }
            Section::String(s) => self.lang.learn(s),
            _ => {}
        }
    }
}

/// Every real record of a trace in `range`, in delivery order, with its names and time;
/// the file's stats section (if any) at the end. `names` also learns load biases.
pub(crate) fn each_record(
    path: &Path,
    range: &TimeRange,
    names: &mut Names,
    mut f: impl FnMut(&Event, &Names),
) -> Result<Option<FinalStats>> {
    // Known once the session header (its start) is read.
    let window = std::cell::Cell::new(Window::ALL);
    let mut f = |ev: &Event, names: &Names| {
        if window.get().contains(ev.time_ns) {
            f(ev, names)
        }
    };
    let end = tracefile::read_stats(path)?.and_then(|s| s.clock_end);
    let mut timeline = Timeline::scan(path)?;
    let mut r = Reader::open(path)?;
    let mut bar = present::progress::Bar::new(
        std::fs::metadata(path).map_or(0, |m| m.len()),
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        format!("reading {}", path.display()),
    );
    let mut clock: Option<Calibration> = None;
    let mut threads = Threads::default();
    let mut stats = None;
    let mut skip = RangeSkip::new(range);
    while let Some(next) =
        r.next_section_unless(|hs| skip.skip(hs, |b| timeline.interpolated(b)))?
    {
        let Next::Section(section) = next else {
            continue;
        };
        match section {
            Section::Session(s) => {
                skip.session(s.clock.anchor.monotonic_ns);
                if let Some(keep) = skip.keeps() {
                    r.only(keep);
                }
                window.set(range.window(s.clock.anchor.monotonic_ns));
                clock = Some(s.clock.refined(end));
            }
            Section::Binary(b) => names.add(&b),
            s @ (Section::Comm(..) | Section::String(_)) => threads.section(s),
            Section::Load(pid, id, bias) => names.loaded_at(pid, id, bias),
            Section::Chunk(mut c) => {
                skip.note(&c.header);
                bar.set_position(r.offset());
                accesses::expand(&mut c, names);
                timeline.apply(&mut c);
                chunk_events(&c, &mut threads, names, clock.as_ref(), &mut f);
            }
            Section::Stats(s) => stats = Some(s),
            Section::Unknown(kind) => log::debug!("skipping section of unknown kind {kind}"),
        }
    }
    bar.finish();
    truncation_warning(path, &r, stats.as_ref());
    Ok(stats)
}

/// Every real record of chunk `c` (its pairs expanded: [`accesses::expand`]) as an
/// [`Event`], in order.
pub(crate) fn chunk_events(
    c: &Chunk,
    threads: &mut Threads,
    names: &Names,
    clock: Option<&Calibration>,
    f: &mut impl FnMut(&Event, &Names),
) {
    let h = c.header;
    // One binary lookup per chunk, an index per record.
    let bin = names.binaries.get(&h.binary_id);
    let bin_name = bin.map_or("?", |(n, _)| n.as_str());
    let comm = threads
        .comms
        .get(&(h.pid, h.tid))
        .map_or("", String::as_str);
    for rec in c.records.iter().filter(|r| names.is_record(h.binary_id, r)) {
        let site = bin
            .and_then(|(_, s)| s.get(rec.site as usize))
            .and_then(Option::as_ref);
        let time_ns = time_ns(rec, clock);
        let call = site.and_then(|s| s.call);
        let lang = if call.is_some() || rec.flags & FLAG_USDT_MORE != 0 {
            threads.lang.step((h.pid, h.tid), call, rec, time_ns)
        } else {
            threads.lang.other_record((h.pid, h.tid));
            None
        };
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
                time_ns,
                lang,
                strings: &threads.lang,
            },
            names,
        );
    }
}

/// CLOCK_MONOTONIC ns of a record: uprobe records already are; inline records carry
/// the cycle counter.
pub(crate) fn time_ns(rec: &Record, clock: Option<&Calibration>) -> u64 {
    if rec.flags & FLAG_KTIME != 0 {
        rec.time
    } else {
        clock.map_or(rec.time, |c| c.monotonic_ns_of(rec.time))
    }
}
