//! `tracer export`: a trace in another tool's format. `chrome`: the Chrome trace event
//! JSON that chrome://tracing and the Perfetto UI open — a complete ("X") event per
//! function call (entry/exit pair), an instant event per other record (blocks, memory
//! accesses, USDT probes, calls), thread names, and the session's drops as a counter.

use std::{
    collections::HashSet,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::{calls::Calls, report::each_record};

/// Write `trace` as `format` to `out` (atomically: a temporary file renamed when done).
pub fn export(trace: &Path, format: &str, out: &Path) -> Result<()> {
    if format != "chrome" {
        bail!("unknown export format {format:?} (supported: chrome)");
    }
    let tmp = crate::tracefile::temporary_for(out)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    let result = write_chrome(trace, &mut BufWriter::with_capacity(1 << 20, file));
    match result.and_then(|()| {
        std::fs::rename(&tmp, out)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))
    }) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn write_chrome(trace: &Path, w: &mut BufWriter<std::fs::File>) -> Result<()> {
    let mut calls = Calls::default();
    let mut named: HashSet<(u32, u32)> = HashSet::new();
    let mut first = true;
    let mut err: Option<std::io::Error> = None;
    let mut last_ns = 0u64;
    w.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut put = |w: &mut BufWriter<std::fs::File>, v: serde_json::Value| {
        let sep = if first { "" } else { ",\n" };
        first = false;
        if let Err(e) = write!(w, "{sep}{v}") {
            err.get_or_insert(e);
        }
    };
    let us = |ns: u64| ns as f64 / 1000.0;
    let stats = each_record(trace, |ev| {
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
                if let Some(s) = calls.event(ev) {
                    let f = &calls.functions[s.function];
                    put(
                        w,
                        json!({"name": f.function, "cat": f.binary, "ph": "X",
                               "ts": us(s.start_ns), "dur": us(s.end_ns - s.start_ns),
                               "pid": s.pid, "tid": s.tid}),
                    );
                }
            }
            kind => put(
                w,
                json!({"name": ev.symbol, "cat": kind, "ph": "i", "s": "t",
                       "ts": us(ev.time_ns), "pid": ev.pid, "tid": ev.tid,
                       "args": {"value": format!("{:#x}", ev.rec.value),
                                "aux": format!("{:#x}", ev.rec.aux)}}),
            ),
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
    w.flush()?;
    w.get_ref().sync_all()?;
    Ok(())
}
