//! `tracer export` and `tracer flamegraph`: a trace in another tool's format, written
//! atomically (a temporary file renamed when complete).
//!
//! - `chrome`: the Chrome trace event JSON that chrome://tracing and the Perfetto UI
//!   open — a complete ("X") event per function call (entry/exit pair), an instant
//!   event per other record (blocks, memory accesses, USDT probes, calls), thread
//!   names, and the session's drops as a counter. For small traces (it is one JSON
//!   document).
//! - `perfetto`: Perfetto's protobuf trace (see [`crate::views::perfetto`]), streamed, for
//!   traces of any size.
//! - flame graph: an SVG (inferno) of self time per call stack, from entry/exit pairs.

use std::{
    collections::HashSet,
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::{
    read::calls::Calls,
    read::{events::each_record, names::Names, symbols::describe},
    views::perfetto::{self, EventKind},
};

/// Write `out` atomically: `write` fills a temporary file next to it, which replaces
/// `out` only when complete and synced.
fn write_atomically(
    out: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let tmp = crate::tracefile::temporary_for(out)?;
    // 0600 like the trace: exports carry the records' values.
    let file = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(&tmp)
    .with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let result = write(&mut w)
        .and_then(|()| {
            w.flush()?;
            w.get_ref().sync_all()?;
            Ok(())
        })
        .and_then(|()| {
            std::fs::rename(&tmp, out)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Write `trace` as `format` to `out`.
pub fn export(trace: &Path, format: &str, out: &Path, debug_dirs: &[PathBuf]) -> Result<()> {
    let mut names = Names::new(debug_dirs);
    match format {
        "chrome" => write_atomically(out, |w| write_chrome(trace, &mut names, w)),
        "perfetto" => write_atomically(out, |w| write_perfetto(trace, &mut names, w)),
        _ => bail!("unknown export format {format:?} (supported: chrome, perfetto)"),
    }
}

fn write_chrome(trace: &Path, names: &mut Names, w: &mut BufWriter<File>) -> Result<()> {
    let mut calls = Calls::default();
    let mut named: HashSet<(u32, u32)> = HashSet::new();
    let mut first = true;
    let mut err: Option<std::io::Error> = None;
    let mut last_ns = 0u64;
    w.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut put = |w: &mut BufWriter<File>, v: serde_json::Value| {
        let sep = if first { "" } else { ",\n" };
        first = false;
        if let Err(e) = write!(w, "{sep}{v}") {
            err.get_or_insert(e);
        }
    };
    let us = |ns: u64| ns as f64 / 1000.0;
    let stats = each_record(trace, names, |ev, names| {
        last_ns = last_ns.max(ev.time_ns);
        if named.insert((ev.pid, ev.tid)) && !ev.comm.is_empty() {
            put(
                w,
                json!({"name": "thread_name", "ph": "M", "pid": ev.pid, "tid": ev.tid,
                       "args": {"name": ev.comm}}),
            );
        }
        match ev.kind {
            "entry" | "exit" => {
                if let Some(s) = calls.event(ev).completed {
                    let f = &calls.functions[s.function];
                    put(
                        w,
                        json!({"name": f.function, "cat": f.binary, "ph": "X",
                               "ts": us(s.start_ns), "dur": us(s.end_ns.saturating_sub(s.start_ns)),
                               "pid": s.pid, "tid": s.tid}),
                    );
                }
            }
            kind => {
                let frames = names.site_frames(ev.binary_id, ev.rec.site);
                put(
                    w,
                    json!({"name": ev.symbol, "cat": kind, "ph": "i", "s": "t",
                           "ts": us(ev.time_ns), "pid": ev.pid, "tid": ev.tid,
                           "args": {"value": format!("{:#x}", ev.rec.value),
                                    "aux": format!("{:#x}", ev.rec.aux),
                                    "at": describe(&frames)}}),
                )
            }
        }
    })?;
    if let Some(st) = stats {
        put(
            w,
            json!({"name": "records dropped", "ph": "C", "ts": us(last_ns), "pid": 0,
                   "args": {"dropped": st.records_dropped, "filtered": st.records_filtered}}),
        );
    }
    if let Some(e) = err {
        return Err(e).context("cannot write the export");
    }
    w.write_all(b"\n]}\n")?;
    Ok(())
}

fn write_perfetto(trace: &Path, names: &mut Names, w: &mut BufWriter<File>) -> Result<()> {
    let mut calls = Calls::default();
    let mut p = perfetto::Writer::new(w);
    p.start()?;
    let mut err: Option<anyhow::Error> = None;
    let (mut first_ns, mut last_ns) = (u64::MAX, 0u64);
    let stats = each_record(trace, names, |ev, names| {
        if err.is_some() {
            return;
        }
        first_ns = first_ns.min(ev.time_ns);
        last_ns = last_ns.max(ev.time_ns);
        let thread = (ev.pid, ev.tid, ev.comm);
        let key = (ev.binary_id, ev.rec.site);
        // The site's name and source line, asked for once per site: a call's slice
        // shows its function (outermost frame), an instant its innermost line.
        let describe = |category: &'static str, innermost: bool| {
            let frames = names.site_frames(ev.binary_id, ev.rec.site);
            let at = if innermost {
                frames.first()
            } else {
                frames.last()
            };
            (ev.symbol.to_string(), category, at.cloned())
        };
        let mut r = Ok(());
        match ev.kind {
            "entry" | "exit" => {
                let step = calls.event(ev);
                if step.began.is_some() {
                    r = p.event(thread, ev.time_ns, EventKind::Begin, key, || {
                        describe("call", false)
                    });
                }
                for _ in 0..step.abandoned + usize::from(step.completed.is_some()) {
                    r = r.and_then(|()| {
                        p.event(thread, ev.time_ns, EventKind::End, key, || {
                            (String::new(), "", None)
                        })
                    });
                }
            }
            kind => {
                let category = match kind {
                    "block" => "block",
                    "memory" => "memory",
                    "usdt" => "usdt",
                    "call" => "call site",
                    _ => "other",
                };
                r = p.event(thread, ev.time_ns, EventKind::Instant, key, || {
                    describe(category, true)
                });
            }
        }
        if let Err(e) = r {
            err = Some(e);
        }
    })?;
    if let Some(e) = err {
        return Err(e).context("cannot write the export");
    }
    // Calls still open at the end of the trace end with their thread's last event.
    let mut open: Vec<((u32, u32), usize)> = calls.open_calls().collect();
    open.sort_unstable();
    for ((pid, tid), n) in open {
        p.end_open(pid, tid, n)?;
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

/// `tracer flamegraph`: an SVG of self time per call stack (entry/exit pairs).
pub fn flamegraph(
    trace: &Path,
    out: &Path,
    title: Option<&str>,
    debug_dirs: &[PathBuf],
) -> Result<()> {
    let mut names = Names::new(debug_dirs);
    let mut calls = Calls::folding();
    each_record(trace, &mut names, |ev, _| {
        calls.event(ev);
    })?;
    let tree = calls.folded.take().unwrap_or_default();
    if tree.nodes.iter().all(|n| n.2 == 0) {
        bail!(
            "{} has no completed function calls (a flame graph needs entry and exit sites)",
            trace.display()
        );
    }
    // inferno wants "a;b;c N" lines; frames may not contain ';' (C++ templates can't,
    // but be safe) and are sorted for a stable layout.
    let mut lines: Vec<String> = (1..tree.nodes.len())
        .filter(|&n| tree.nodes[n].2 > 0)
        .map(|n| {
            let stack: Vec<String> = tree
                .path(n)
                .iter()
                .map(|&f| calls.functions[f].function.replace(';', ":"))
                .collect();
            format!("{} {}", stack.join(";"), tree.nodes[n].2)
        })
        .collect();
    lines.sort();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title
        .unwrap_or("utrace: self time per call stack")
        .to_string();
    opts.count_name = "ns".to_string();
    write_atomically(out, |w| {
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w)
            .context("cannot draw the flame graph")
    })
}
