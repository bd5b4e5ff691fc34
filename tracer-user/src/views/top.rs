//! `tracer record --live`: a terminal view of a session while it runs, redrawn about
//! once a second on stderr: records per second, drops, the top functions by records
//! and by self time (entry/exit pairs, as `report` pairs them), the busiest threads.
//!
//! The view is one more reader of the trace: the session's writer hands it a copy of
//! the file as it is written ([`crate::tracefile::Tee`]), which it reads with the
//! streaming [`Reader`] like a file, so what it shows is what the file holds (coarse
//! times are not interpolated live: such calls show no time). One thread reads, one
//! draws; the last frame is drawn when the copy ends, with the file.
//!
//! ```text
//! let (view, tee) = views::top::start(dropped.clone())?;
//! let done = Box::new(move || view.finish());
//! record::record(RecordOptions { live: Some(LiveFeed { tee, dropped, done }), .. })
//! ```

use std::{
    collections::HashMap,
    io::{Read, Write},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc::{Receiver, sync_channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    read::{
        accesses,
        calls::Calls,
        events::{Threads, chunk_events},
        names::Names,
    },
    tracefile::{Reader, Section, Tee, clock::Calibration},
};

/// Batches of records the view may lag behind the writer (about 1 MiB each).
const LAG_BATCHES: usize = 64;
/// Rows per table.
const ROWS: usize = 10;
const REDRAW: Duration = Duration::from_secs(1);
/// The last line of a frame: what to do with the trace (and how to keep it small).
const HELP: &str = "\nthen: tracer report [--since S --until U] TRACE; tracer report --diff OLD NEW; \
                    smaller: record --split SIZE|TIME, --max-size SIZE, --min-duration T\n";

/// What the reader thread has counted so far.
#[derive(Default)]
struct Tally {
    records: u64,
    /// Bytes of the trace file written so far (what the copy brought).
    bytes: u64,
    /// (binary id, site) → records.
    sites: HashMap<(u64, u32), u64>,
    /// (binary id, site) → (binary, kind, function), for the frames.
    site_names: HashMap<(u64, u32), (String, &'static str, String)>,
    /// (pid, tid) → (name, records).
    threads: HashMap<(u32, u32), (String, u64)>,
    calls: Calls,
    /// The copy ended (the session's file is complete).
    ended: bool,
}

/// The copy of the trace as a byte stream.
struct Feed {
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    at: usize,
}

impl Read for Feed {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            match self.rx.recv() {
                Ok(b) => (self.buf, self.at) = (b, 0),
                // The writer finished (or stopped): the end of the trace.
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A running view: [`View::finish`] waits for its last frame.
pub struct View {
    reader: JoinHandle<()>,
    drawer: JoinHandle<()>,
}

impl View {
    pub fn finish(self) {
        let _ = self.reader.join();
        let _ = self.drawer.join();
    }
}

/// Start a view drawing on stderr; `dropped` is the session's drop count. Returns
/// the view and the tee for the session's writer.
pub fn start(dropped: Arc<AtomicU64>) -> std::io::Result<(View, Tee)> {
    let (tx, rx) = sync_channel(LAG_BATCHES);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t = tally.clone();
    let reader = std::thread::Builder::new()
        .name("utrace-live-read".into())
        .spawn(move || read_loop(rx, &t))?;
    let drawer = std::thread::Builder::new()
        .name("utrace-live-draw".into())
        .spawn(move || draw_loop(&tally, &dropped))?;
    let tee = Tee { bytes: tx };
    Ok((View { reader, drawer }, tee))
}

fn read_loop(rx: Receiver<Vec<u8>>, tally: &Mutex<Tally>) {
    let feed = Feed {
        rx,
        buf: Vec::new(),
        at: 0,
    };
    let mut names = Names::new(&[]);
    let mut clock: Option<Calibration> = None;
    let mut threads = Threads::default();
    if let Ok(mut r) = Reader::from_stream("live", feed) {
        while let Ok(Some(section)) = r.next_section() {
            match section {
                Section::Session(s) => clock = Some(s.clock),
                Section::Binary(b) => names.add(&b),
                s @ (Section::Comm(..) | Section::String(_)) => threads.section(s),
                Section::Load(pid, id, bias) => names.loaded_at(pid, id, bias),
                Section::Chunk(mut c) => {
                    accesses::expand(&mut c, &names);
                    let Ok(mut t) = tally.lock() else { return };
                    chunk_events(&c, &mut threads, &names, clock.as_ref(), &mut |ev, _| {
                        t.records += 1;
                        let key = (ev.binary_id, ev.rec.site);
                        let n = t.sites.entry(key).or_default();
                        *n += 1;
                        if *n == 1 {
                            let name = (ev.binary.to_string(), ev.kind, ev.symbol.to_string());
                            t.site_names.insert(key, name);
                        }
                        let th = t.threads.entry((ev.pid, ev.tid)).or_default();
                        th.1 += 1;
                        if th.0 != ev.comm {
                            th.0 = ev.comm.to_string();
                        }
                        t.calls.event(ev);
                    });
                }
                Section::Stats(_) | Section::Unknown(_) => {}
            }
            if let Ok(mut t) = tally.lock() {
                t.bytes = r.offset();
            }
        }
    }
    if let Ok(mut t) = tally.lock() {
        t.ended = true;
    }
}

/// The previous frame's counts, for rates.
#[derive(Default)]
struct Before {
    at: Option<Instant>,
    records: u64,
    sites: HashMap<(u64, u32), u64>,
    threads: HashMap<(u32, u32), u64>,
}

fn draw_loop(tally: &Mutex<Tally>, dropped: &AtomicU64) {
    let start = Instant::now();
    let mut before = Before::default();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let due = before.at.is_none_or(|at| at.elapsed() >= REDRAW);
        let Ok(t) = tally.lock() else { return };
        if !due && !t.ended {
            continue;
        }
        let frame = render(&t, &mut before, start, dropped.load(Ordering::Relaxed));
        let ended = t.ended;
        drop(t);
        let mut err = std::io::stderr().lock();
        // Home, clear to the end of the screen, the frame.
        let _ = write!(err, "\x1b[H\x1b[J{frame}");
        let _ = err.flush();
        if ended {
            return;
        }
    }
}

/// One frame: the header, top functions by records and by self time, threads.
fn render(t: &Tally, before: &mut Before, start: Instant, dropped: u64) -> String {
    let now = Instant::now();
    let dt = before
        .at
        .map_or(now.duration_since(start), |at| now.duration_since(at))
        .as_secs_f64()
        .max(1e-3);
    let rate = |now: u64, then: u64| (now.saturating_sub(then)) as f64 / dt;
    let mut out = format!(
        "utrace live  {:.0} s  {} records  {:.0}/s  {} dropped  {:.1} MB written{}\n\n",
        start.elapsed().as_secs_f64(),
        t.records,
        rate(t.records, before.records),
        dropped,
        t.bytes as f64 / 1e6,
        if t.ended { "  (session ended)" } else { "" }
    );
    out += &format!(
        "{:>12} {:>10}  {:<6} function (binary)\n",
        "records", "per s", "kind"
    );
    let mut sites: Vec<(&(u64, u32), &u64)> = t.sites.iter().collect();
    sites.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    for (key, n) in sites.into_iter().take(ROWS) {
        let then = before.sites.get(key).copied();
        let Some((bin, kind, f)) = t.site_names.get(key) else {
            continue;
        };
        out += &format!(
            "{n:>12} {:>10.0}  {kind:<6} {} ({bin})\n",
            rate(*n, then.unwrap_or(0)),
            clip(f)
        );
    }
    out += &format!(
        "\n{:>12} {:>12} {:>12}  function (binary)\n",
        "calls", "self ms", "total ms"
    );
    let mut fs: Vec<_> = t.calls.functions.iter().filter(|f| f.calls > 0).collect();
    fs.sort_by(|a, b| {
        b.self_ns
            .cmp(&a.self_ns)
            .then_with(|| a.function.cmp(&b.function))
    });
    for f in fs.into_iter().take(ROWS) {
        out += &format!(
            "{:>12} {:>12.3} {:>12.3}  {} ({})\n",
            f.calls,
            f.self_ns as f64 / 1e6,
            f.total_ns as f64 / 1e6,
            clip(&f.function),
            f.binary
        );
    }
    out += &format!(
        "\n{:>8} {:>8} {:>12} {:>10}  thread\n",
        "pid", "tid", "records", "per s"
    );
    let mut threads: Vec<_> = t.threads.iter().collect();
    threads.sort_by(|a, b| b.1.1.cmp(&a.1.1).then_with(|| a.0.cmp(b.0)));
    for (&(pid, tid), (comm, n)) in threads.into_iter().take(ROWS) {
        let then = before.threads.get(&(pid, tid)).copied().unwrap_or(0);
        out += &format!(
            "{pid:>8} {tid:>8} {n:>12} {:>10.0}  {comm}\n",
            rate(*n, then)
        );
    }
    out += HELP;
    *before = Before {
        at: Some(now),
        records: t.records,
        sites: t.sites.clone(),
        threads: t.threads.iter().map(|(k, v)| (*k, v.1)).collect(),
    };
    out
}

/// A long (C++, Rust) name cut to fit a line.
fn clip(name: &str) -> String {
    const MAX: usize = 60;
    if name.chars().count() <= MAX {
        return name.to_string();
    }
    let cut: String = name.chars().take(MAX - 1).collect();
    format!("{cut}…")
}
