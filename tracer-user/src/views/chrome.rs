//! `tracer export --format chrome`: Chrome trace event JSON (a complete event per call,
//! an instant per other record, thread names, drops as a counter), for small traces.

use std::{
    collections::HashSet,
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result};
use serde_json::json;

use crate::read::{
    calls::Calls, events::each_record, names::Names, range::TimeRange, symbols::describe,
};

/// The thread of a thread's interpreted calls: above every Linux tid (pid_max ≤ 2^22).
const LANG_TID: u32 = 1 << 22;

pub(crate) fn write(
    trace: &Path,
    range: &TimeRange,
    names: &mut Names,
    w: &mut BufWriter<File>,
) -> Result<()> {
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
    let stats = each_record(trace, range, names, |ev, names| {
        last_ns = last_ns.max(ev.time_ns);
        if named.insert((ev.pid, ev.tid)) && !ev.comm.is_empty() {
            put(
                w,
                json!({"name": "thread_name", "ph": "M", "pid": ev.pid, "tid": ev.tid,
                       "args": {"name": ev.comm}}),
            );
        }
        match ev.kind {
            _ if ev.lang.is_some() || matches!(ev.kind, "entry" | "exit") => {
                // Calls of an interpreted program do not nest with the interpreter's
                // own (read/calls.rs): a thread of their own, as complete events on one
                // thread must nest.
                let tid = match ev.lang {
                    Some(_) => {
                        if named.insert((ev.pid, LANG_TID | ev.tid)) {
                            put(
                                w,
                                json!({"name": "thread_name", "ph": "M", "pid": ev.pid,
                                       "tid": LANG_TID | ev.tid,
                                       "args": {"name": format!("{} (interpreted calls)", ev.comm)}}),
                            );
                        }
                        LANG_TID | ev.tid
                    }
                    None => ev.tid,
                };
                let step = calls.event(ev);
                for s in step.completed.iter().chain(&step.unwound) {
                    let f = &calls.functions[s.function];
                    put(
                        w,
                        json!({"name": f.function, "cat": f.binary, "ph": "X",
                               "ts": us(s.start_ns), "dur": us(s.end_ns.saturating_sub(s.start_ns)),
                               "pid": s.pid, "tid": tid}),
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
