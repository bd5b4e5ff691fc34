//! The LTTng-UST row: its function tracing (`liblttng-ust-cyg-profile-fast`, preloaded
//! into the `-finstrument-functions` build) in a session with LTTng's default channel
//! (per-CPU sub-buffers in discard mode: what finds no room is counted, not waited for).
//! Records are counted by babeltrace2's counter sink, losses are what `lttng stop`
//! reports, and the tracer's CPU is the session and consumer daemons' (they are not the
//! command's children), read from `/proc` before and after.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::super::process::{measured, own_cpu};
use super::Row;
use crate::util::{self, cmd};

const SESSION: &str = "utrace-bench";
const CYG_FAST: &str = "/usr/lib/x86_64-linux-gnu/liblttng-ust-cyg-profile-fast.so";

/// The row, or None (with a line saying why) where LTTng is not installed.
pub(super) fn row(dir: &Path, fi: &Path, args: impl Fn(&mut Command)) -> Result<Option<Row>> {
    if util::which("lttng").is_none() || !Path::new(CYG_FAST).exists() {
        println!("lttng: not installed (apt-get install lttng-tools liblttng-ust-dev babeltrace2)");
        return Ok(None);
    }
    if daemon_cpu_s().1 == 0 {
        util::run(cmd("lttng-sessiond").arg("--daemonize"))?;
    }
    let out = dir.join("lttng-trace");
    let _ = std::fs::remove_dir_all(&out);
    let _ = util::output(cmd("lttng").args(["destroy", SESSION]));
    util::run(cmd("lttng").args(["create", SESSION, "--output"]).arg(&out))?;
    util::run(cmd("lttng").args([
        "enable-event",
        "--userspace",
        "lttng_ust_cyg_profile_fast:*",
    ]))?;
    util::run(cmd("lttng").arg("start"))?;
    let (cpu0, _) = daemon_cpu_s();
    let mut c = cmd(fi);
    c.env("LD_PRELOAD", CYG_FAST);
    args(&mut c);
    let mut run = measured(&mut c)?;
    let stop = util::output_ok(cmd("lttng").arg("stop"))?;
    let (cpu1, _) = daemon_cpu_s();
    util::run(cmd("lttng").args(["destroy", SESSION]))?;
    run.own_cpu_s = cpu1 - cpu0;
    let bytes = tree_bytes(&out)?;
    let records = count_events(&out);
    let _ = std::fs::remove_dir_all(&out);
    Ok(Some(Row {
        name: "LTTng-UST cyg-profile-fast, entry+exit".into(),
        run,
        records,
        lost: Some(discarded(&stop)),
        trace_bytes: Some(bytes),
    }))
}

/// CPU seconds of the running LTTng daemons, and how many there are.
fn daemon_cpu_s() -> (f64, usize) {
    let mut sum = 0.0;
    let mut n = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.starts_with("lttng-sessiond") || comm.starts_with("lttng-consumerd") {
            sum += own_cpu(pid).unwrap_or(0.0);
            n += 1;
        }
    }
    (sum, n)
}

/// Bytes of the files under `dir`.
fn tree_bytes(dir: &Path) -> Result<u64> {
    let mut n = 0;
    let mut todo: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("{}", d.display()))? {
            let e = e?;
            let m = e.metadata()?;
            if m.is_dir() {
                todo.push(e.path());
            } else {
                n += m.len();
            }
        }
    }
    Ok(n)
}

/// Events in the trace (babeltrace2's counter sink, which prints its counts every
/// 10,000 messages and at the end: the last "N Event messages"), if it ran.
fn count_events(trace: &Path) -> Option<u64> {
    let out = util::output(
        cmd("babeltrace2")
            .arg(trace)
            .args(["--component", "sink.utils.counter"]),
    )
    .ok()
    .filter(|o| o.status.success())?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find(|l| l.trim_end().ends_with(" Event messages"))
        .and_then(|l| l.split_whitespace().next()?.replace(',', "").parse().ok())
}

/// "N events were discarded" in `lttng stop`'s warnings, summed.
fn discarded(stop: &str) -> u64 {
    stop.lines()
        .filter(|l| l.contains("discarded"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.replace(',', "").parse::<u64>().ok())
        })
        .sum()
}
