//! `export --format perfetto`: Perfetto's protobuf trace format, written as a stream
//! (a `Trace` is only its repeated `packet` field 1, so packets are appended one by one
//! and memory stays flat however long the trace).
//!
//! Layout: a process track per process and a thread track under it per thread (named
//! after the thread); per function call a `TYPE_SLICE_BEGIN` at its entry and a
//! `TYPE_SLICE_END` at its exit (calls given up by an exit of a caller, and calls open at
//! the end, end there too, so slices nest); the calls of an interpreted program (Python,
//! `read/lang.rs`) as slices on a child track of the thread, "interpreted calls" (they
//! do not nest strictly with the interpreter's own functions, see `read/calls.rs`); an
//! instant per other record (blocks, memory accesses, USDT probes, calls); counter tracks "records dropped" and "records
//! filtered". Names and source locations are interned (sent once per trace on one
//! sequence), so an event is ~25 bytes.
//!
//! The messages below are the subset of Perfetto's `protos/perfetto/trace/` this writer
//! uses, with Perfetto's field numbers.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result};
use prost::Message;

use crate::read::{
    calls::Calls,
    events::{Event, each_record},
    names::Names,
    range::TimeRange,
    symbols::Frame,
};

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
}

/// `TracePacket.SequenceFlags`.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ThreadDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(int64, optional, tag = "2")]
    pub tid: Option<i64>,
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct CounterDescriptor {}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TrackEvent {
    #[prost(uint64, repeated, packed = "false", tag = "3")]
    pub category_iids: Vec<u64>,
    /// `TrackEvent.Type`.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
    #[prost(uint64, optional, tag = "34")]
    pub source_location_iid: Option<u64>,
}

const TYPE_SLICE_BEGIN: i32 = 1;
const TYPE_SLICE_END: i32 = 2;
const TYPE_INSTANT: i32 = 3;
const TYPE_COUNTER: i32 = 4;

#[derive(Clone, PartialEq, Message)]
pub(crate) struct InternedData {
    #[prost(message, repeated, tag = "1")]
    pub event_categories: Vec<InternedString>,
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<InternedString>,
    #[prost(message, repeated, tag = "4")]
    pub source_locations: Vec<SourceLocation>,
}

/// `EventName` and `EventCategory` (same shape).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct InternedString {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct SourceLocation {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub file_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub function_name: Option<String>,
    #[prost(uint32, optional, tag = "4")]
    pub line_number: Option<u32>,
}

/// The one packet sequence of an export.
const SEQUENCE: u32 = 1;
/// Track uuids: processes `PROCESS | pid`, threads `THREAD | n` (n-th thread seen: a
/// tid reused by another process is another track), counters below.
const PROCESS: u64 = 1 << 40;
const THREAD: u64 = 2 << 40;
/// A thread's track of the calls of its interpreted program: `THREAD | n` + LANG.
const LANG: u64 = 4 << 40;
const DROPPED_TRACK: u64 = 1;
const FILTERED_TRACK: u64 = 2;

/// Streams packets into `w`.
pub(crate) struct Writer<W: Write> {
    w: W,
    buf: Vec<u8>,
    names: HashMap<String, u64>,
    categories: HashMap<&'static str, u64>,
    locations: HashMap<(String, String, u32), u64>,
    processes: HashMap<u32, ()>,
    /// Threads seen, but the current one (in `current`: records come a chunk, one
    /// thread, at a time).
    threads: HashMap<(u32, u32), ThreadTrack>,
    current: Option<((u32, u32), ThreadTrack)>,
    first: bool,
    /// (binary id, site) → interned (name, category, location).
    by_site: HashMap<(u64, u32), (u64, u64, Option<u64>)>,
    pub packets: u64,
}

struct ThreadTrack {
    uuid: u64,
    /// Its child track of interpreted calls has been described.
    lang: bool,
    comm: String,
    /// Its latest event: its events never go back in time (trace processor sorts by
    /// time, and a begin after its end would close the wrong slice).
    last_ns: u64,
}

impl<W: Write> Writer<W> {
    pub(crate) fn new(w: W) -> Writer<W> {
        Writer {
            w,
            buf: Vec::with_capacity(256),
            names: HashMap::new(),
            categories: HashMap::new(),
            locations: HashMap::new(),
            processes: HashMap::new(),
            threads: HashMap::new(),
            current: None,
            first: true,
            by_site: HashMap::new(),
            packets: 0,
        }
    }

    fn put(&mut self, mut p: TracePacket) -> Result<()> {
        p.trusted_packet_sequence_id = Some(SEQUENCE);
        if p.track_event.is_some() || p.interned_data.is_some() {
            p.sequence_flags = Some(if std::mem::take(&mut self.first) {
                SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE
            } else {
                SEQ_NEEDS_INCREMENTAL_STATE
            });
        }
        self.buf.clear();
        // `Trace.packet` (field 1, length-delimited).
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut self.buf);
        p.encode_length_delimited(&mut self.buf)?;
        self.w.write_all(&self.buf)?;
        self.packets += 1;
        Ok(())
    }

    /// The counter tracks; first, before any event.
    pub(crate) fn start(&mut self) -> Result<()> {
        for (uuid, name) in [
            (DROPPED_TRACK, "records dropped"),
            (FILTERED_TRACK, "records filtered"),
        ] {
            self.put(TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(uuid),
                    name: Some(name.into()),
                    counter: Some(CounterDescriptor {}),
                    ..Default::default()
                }),
                ..Default::default()
            })?;
        }
        Ok(())
    }

    /// Make thread (pid, tid) the current one, describing its process and thread
    /// tracks first (once; the thread's again when its name changes).
    fn thread(&mut self, pid: u32, tid: u32, comm: &str) -> Result<()> {
        if let Some((k, t)) = &self.current
            && *k == (pid, tid)
            && t.comm == comm
        {
            return Ok(());
        }
        if let Some((k, t)) = self.current.take() {
            self.threads.insert(k, t);
        }
        if self.processes.insert(pid, ()).is_none() {
            self.put(TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(PROCESS | u64::from(pid)),
                    process: Some(ProcessDescriptor {
                        pid: Some(pid as i32),
                        process_name: (pid == tid && !comm.is_empty()).then(|| comm.into()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })?;
        }
        let next = THREAD | (self.threads.len() as u64 + 1);
        let mut t = self.threads.remove(&(pid, tid)).unwrap_or(ThreadTrack {
            uuid: next,
            lang: false,
            comm: String::new(),
            last_ns: 0,
        });
        if t.uuid == next || t.comm != comm {
            t.comm = comm.to_string();
            self.put(TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(t.uuid),
                    parent_uuid: Some(PROCESS | u64::from(pid)),
                    thread: Some(ThreadDescriptor {
                        pid: Some(pid as i32),
                        tid: Some(i64::from(tid)),
                        thread_name: (!comm.is_empty()).then(|| comm.into()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })?;
        }
        self.current = Some(((pid, tid), t));
        Ok(())
    }

    /// The name and latest event time of thread (pid, tid).
    fn thread_state(&self, pid: u32, tid: u32) -> Option<(&str, u64)> {
        match &self.current {
            Some((k, t)) if *k == (pid, tid) => Some((t.comm.as_str(), t.last_ns)),
            _ => self
                .threads
                .get(&(pid, tid))
                .map(|t| (t.comm.as_str(), t.last_ns)),
        }
    }

    /// End `n` slices still open on thread (pid, tid) at its latest event (calls that
    /// never exited before the trace ended), on its track of interpreted calls if `lang`.
    pub(crate) fn end_open(&mut self, pid: u32, tid: u32, n: usize, lang: bool) -> Result<()> {
        let Some((comm, at)) = self.thread_state(pid, tid) else {
            return Ok(());
        };
        let comm = comm.to_string();
        for _ in 0..n {
            self.event((pid, tid, &comm), at, EventKind::End, (0, 0), lang, || {
                (String::new(), "", None)
            })?;
        }
        Ok(())
    }

    /// The current thread's track of interpreted calls, described the first time.
    fn lang_track(&mut self) -> Result<u64> {
        let Some((_, t)) = self.current.as_mut() else {
            return Ok(0);
        };
        let (uuid, parent) = (t.uuid | LANG, t.uuid);
        if !std::mem::replace(&mut t.lang, true) {
            self.put(TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(uuid),
                    parent_uuid: Some(parent),
                    name: Some("interpreted calls".into()),
                    ..Default::default()
                }),
                ..Default::default()
            })?;
        }
        Ok(uuid)
    }

    /// Interned ids of an event's name, category and source location; new ones go into
    /// `interned`.
    fn intern(
        &mut self,
        name: &str,
        category: &'static str,
        at: Option<&Frame>,
        interned: &mut InternedData,
    ) -> (u64, u64, Option<u64>) {
        let name_iid = match self.names.get(name) {
            Some(&i) => i,
            None => {
                let i = self.names.len() as u64 + 1;
                self.names.insert(name.to_string(), i);
                interned.event_names.push(InternedString {
                    iid: Some(i),
                    name: Some(name.to_string()),
                });
                i
            }
        };
        let cat_iid = match self.categories.get(category) {
            Some(&i) => i,
            None => {
                let i = self.categories.len() as u64 + 1;
                self.categories.insert(category, i);
                interned.event_categories.push(InternedString {
                    iid: Some(i),
                    name: Some(category.to_string()),
                });
                i
            }
        };
        let loc_iid = at.and_then(|f| {
            let file = f.file.clone()?;
            let key = (file, f.function.clone(), f.line.unwrap_or(0));
            Some(match self.locations.get(&key) {
                Some(&i) => i,
                None => {
                    let i = self.locations.len() as u64 + 1;
                    interned.source_locations.push(SourceLocation {
                        iid: Some(i),
                        file_name: Some(key.0.clone()),
                        function_name: Some(key.1.clone()),
                        line_number: f.line,
                    });
                    self.locations.insert(key, i);
                    i
                }
            })
        });
        (name_iid, cat_iid, loc_iid)
    }

    /// A slice begin or end, or an instant, on thread `tid`'s track (`lang`: its track
    /// of interpreted calls). `key` names the event's site (binary id, site id; a call
    /// of an interpreted program: `(function, u32::MAX)`): its name, category and source
    /// location (`describe`) are asked for and interned once per key.
    pub(crate) fn event(
        &mut self,
        (pid, tid, comm): (u32, u32, &str),
        time_ns: u64,
        kind: EventKind,
        key: (u64, u32),
        lang: bool,
        describe: impl FnOnce() -> (String, &'static str, Option<Frame>),
    ) -> Result<()> {
        self.thread(pid, tid, comm)?;
        let lang_track = if lang { self.lang_track()? } else { 0 };
        let Some((_, t)) = self.current.as_mut() else {
            return Ok(());
        };
        let track = if lang { lang_track } else { t.uuid };
        let time_ns = time_ns.max(t.last_ns);
        t.last_ns = time_ns;
        let mut interned = InternedData::default();
        let mut ev = TrackEvent {
            track_uuid: Some(track),
            r#type: Some(match kind {
                EventKind::Begin => TYPE_SLICE_BEGIN,
                EventKind::End => TYPE_SLICE_END,
                EventKind::Instant => TYPE_INSTANT,
            }),
            ..Default::default()
        };
        if kind != EventKind::End {
            let (n, c, l) = match self.by_site.get(&key) {
                Some(&ids) => ids,
                None => {
                    let (name, category, at) = describe();
                    let ids = self.intern(&name, category, at.as_ref(), &mut interned);
                    self.by_site.insert(key, ids);
                    ids
                }
            };
            ev.name_iid = Some(n);
            ev.category_iids = vec![c];
            ev.source_location_iid = l;
        }
        let has_interned = !(interned.event_names.is_empty()
            && interned.event_categories.is_empty()
            && interned.source_locations.is_empty());
        self.put(TracePacket {
            timestamp: Some(time_ns),
            track_event: Some(ev),
            interned_data: has_interned.then_some(interned),
            ..Default::default()
        })
    }

    /// A value of the "records dropped" / "records filtered" counters.
    pub(crate) fn counters(&mut self, time_ns: u64, dropped: u64, filtered: u64) -> Result<()> {
        for (track, v) in [(DROPPED_TRACK, dropped), (FILTERED_TRACK, filtered)] {
            self.put(TracePacket {
                timestamp: Some(time_ns),
                track_event: Some(TrackEvent {
                    track_uuid: Some(track),
                    r#type: Some(TYPE_COUNTER),
                    counter_value: Some(v as i64),
                    ..Default::default()
                }),
                ..Default::default()
            })?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Begin,
    End,
    Instant,
}

/// `tracer export --format perfetto`: every record of `trace` through a [`Writer`].
pub(crate) fn write(
    trace: &Path,
    range: &TimeRange,
    names: &mut Names,
    w: &mut BufWriter<File>,
) -> Result<()> {
    let mut calls = Calls::default();
    let mut p = Writer::new(w);
    p.start()?;
    let mut err: Option<anyhow::Error> = None;
    let (mut first_ns, mut last_ns) = (u64::MAX, 0u64);
    let stats = each_record(trace, range, names, |ev, names| {
        if err.is_some() {
            return;
        }
        first_ns = first_ns.min(ev.time_ns);
        last_ns = last_ns.max(ev.time_ns);
        if let Err(e) = record_events(&mut p, &mut calls, ev, names) {
            err = Some(e);
        }
    })?;
    if let Some(e) = err {
        return Err(e).context("cannot write the export");
    }
    // Calls still open at the end of the trace end with their thread's last event.
    let mut open: Vec<((u32, u32), usize, usize)> = calls.open_calls().collect();
    open.sort_unstable();
    for ((pid, tid), n, lang) in open {
        p.end_open(pid, tid, n, false)?;
        p.end_open(pid, tid, lang, true)?;
    }
    if let Some(st) = stats
        && first_ns <= last_ns
    {
        p.counters(first_ns, 0, 0)?;
        p.counters(last_ns, st.records_dropped, st.records_filtered)?;
    }
    log::info!("{} packets", p.packets);
    Ok(())
}

/// The events of one record: its interpreted call's begin and ends, then its site's.
fn record_events<W: Write>(
    p: &mut Writer<W>,
    calls: &mut Calls,
    ev: &Event,
    names: &Names,
) -> Result<()> {
    let thread = (ev.pid, ev.tid, ev.comm);
    let r = match ev.lang {
        Some(c) => lang_events(p, calls, ev, c.time_ns),
        None => Ok(()),
    };
    match ev.kind {
        "entry" | "exit" | "landing" | "resume" => call_events(p, calls, ev, names, r),
        kind => {
            let category = match kind {
                "block" => "block",
                "memory" => "memory",
                "usdt" => "usdt",
                "call" => "call site",
                _ => "other",
            };
            let key = (ev.binary_id, ev.rec.site);
            r.and_then(|()| {
                p.event(thread, ev.time_ns, EventKind::Instant, key, false, || {
                    describe(names, ev, category, true)
                })
            })
        }
    }
}

/// A call of the interpreted program, on its own track (the probe's record is an
/// instant too): its begin and the ends of the calls it completes or abandons, at
/// `time_ns`.
fn lang_events<W: Write>(
    p: &mut Writer<W>,
    calls: &mut Calls,
    ev: &Event,
    time_ns: u64,
) -> Result<()> {
    let thread = (ev.pid, ev.tid, ev.comm);
    let step = calls.event(ev);
    let mut r = Ok(());
    if let Some(f) = step.began {
        let name = calls.functions[f].function.clone();
        r = p.event(
            thread,
            time_ns,
            EventKind::Begin,
            (f as u64, u32::MAX),
            true,
            || (name, "interpreted call", None),
        );
    }
    for _ in 0..step.abandoned + usize::from(step.completed.is_some()) {
        r = r.and_then(|()| {
            p.event(thread, time_ns, EventKind::End, (0, 0), true, || {
                (String::new(), "", None)
            })
        });
    }
    r
}

/// A call's slice: its begin, the ends of the calls it completes, abandons or unwinds;
/// `r` what the record's interpreted call gave (a begin here replaces it, as before).
fn call_events<W: Write>(
    p: &mut Writer<W>,
    calls: &mut Calls,
    ev: &Event,
    names: &Names,
    mut r: Result<()>,
) -> Result<()> {
    let thread = (ev.pid, ev.tid, ev.comm);
    let key = (ev.binary_id, ev.rec.site);
    let step = calls.event(ev);
    if step.began.is_some() {
        r = p.event(thread, ev.time_ns, EventKind::Begin, key, false, || {
            describe(names, ev, "call", false)
        });
    }
    let ends = step.abandoned + usize::from(step.completed.is_some()) + step.unwound.len();
    for _ in 0..ends {
        r = r.and_then(|()| {
            p.event(thread, ev.time_ns, EventKind::End, key, false, || {
                (String::new(), "", None)
            })
        });
    }
    r
}

/// The site's name and source line, asked for once per site: a call's slice shows its
/// function (outermost frame), an instant its innermost line.
fn describe(
    names: &Names,
    ev: &Event,
    category: &'static str,
    innermost: bool,
) -> (String, &'static str, Option<Frame>) {
    let frames = names.site_frames(ev.binary_id, ev.rec.site);
    let at = if innermost {
        frames.first()
    } else {
        frames.last()
    };
    (ev.symbol.to_string(), category, at.cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Trace.packet` entries back from the bytes.
    fn packets(bytes: &[u8]) -> Vec<TracePacket> {
        #[derive(Clone, PartialEq, Message)]
        struct Trace {
            #[prost(message, repeated, tag = "1")]
            packet: Vec<TracePacket>,
        }
        Trace::decode(bytes).unwrap().packet
    }

    fn name() -> (String, &'static str, Option<Frame>) {
        ("f".into(), "call", None)
    }

    #[test]
    fn a_thread_never_goes_back_in_time_and_tids_of_two_processes_differ() {
        let mut w = Writer::new(Vec::new());
        w.start().unwrap();
        w.event((1, 7, "a"), 100, EventKind::Begin, (0, 0), false, name)
            .unwrap();
        // Earlier than the begin (TSC vs ktime): clamped to it.
        w.event((1, 7, "a"), 90, EventKind::End, (0, 0), false, name)
            .unwrap();
        // The same tid in another process: another track.
        w.event((2, 7, "b"), 50, EventKind::Instant, (0, 0), false, name)
            .unwrap();
        w.event((1, 7, "a"), 120, EventKind::Instant, (0, 0), false, name)
            .unwrap();
        assert_eq!(w.thread_state(1, 7), Some(("a", 120)));
        assert_eq!(w.thread_state(2, 7), Some(("b", 50)));
        let ps = packets(&w.w);
        let threads: Vec<(u64, i32)> = ps
            .iter()
            .filter_map(|p| p.track_descriptor.as_ref())
            .filter_map(|d| Some((d.uuid?, d.thread.as_ref()?.pid?)))
            .collect();
        assert_eq!(threads.len(), 2, "{threads:?}");
        assert_ne!(threads[0].0, threads[1].0);
        let events: Vec<(u64, u64, i32)> = ps
            .iter()
            .filter_map(|p| {
                let e = p.track_event.as_ref()?;
                Some((e.track_uuid?, p.timestamp?, e.r#type?))
            })
            .collect();
        let t1 = threads.iter().find(|t| t.1 == 1).unwrap().0;
        let t2 = threads.iter().find(|t| t.1 == 2).unwrap().0;
        assert_eq!(
            events,
            [
                (t1, 100, TYPE_SLICE_BEGIN),
                (t1, 100, TYPE_SLICE_END),
                (t2, 50, TYPE_INSTANT),
                (t1, 120, TYPE_INSTANT)
            ]
        );
        // The name is interned once and referred to by every named event.
        let names: Vec<&InternedString> = ps
            .iter()
            .filter_map(|p| p.interned_data.as_ref())
            .flat_map(|i| &i.event_names)
            .collect();
        assert_eq!(names.len(), 1);
        assert_eq!(ps.iter().filter(|p| p.sequence_flags == Some(3)).count(), 1);
    }
}
