//! `tracer record --user -- CMD`: the session of the user-space drain, no eBPF and no
//! privileges: find the command's binaries, start it gated with one end of a socket pair,
//! seize it, and let the drain ([`userdrain`]) serve it until every task it made is gone.

use std::{
    ffi::OsString,
    os::fd::{AsRawFd, OwnedFd},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use tracer_common::{RECORD_SIZE, RECORD_VERSION};

use super::{
    binaries::{self, Instrumented},
    discover::{binary_info, binary_infos, discover_command},
    gate::{self, GatedChild},
    summary::print_summary,
    target::RecordOptions,
};
use crate::{
    record::{
        drain::{
            consumer::Consumed,
            duration::DurationFilter,
            userdrain::{self, Drained, Found, UserDrain},
        },
        host::clock,
    },
    tracefile::{FinalStats, SessionInfo, Writer},
};

/// Run `argv` under the user drain; returns the command's exit code.
pub fn record(opts: RecordOptions, argv: Vec<OsString>) -> Result<i32> {
    crate::tracefile::check_destination(&opts.output)?;
    let run_as = opts.run_as.as_ref();
    let (binaries, exe) = discover_command(&argv, &opts.binaries, run_as)?;
    let session = session_info(&argv);
    let duration = duration_filter(&opts, &binaries, session.clock.tsc_hz)?;
    let (ours, theirs) = seqpacket_pair()?;
    userdrain::pass_credentials(&ours)?;
    let mut child = GatedChild::spawn_with_drain(&exe, &argv, Some(theirs.as_raw_fd()), run_as)?;
    drop(theirs);
    userdrain::seize(child.pid)?;

    let mut writer = Writer::create_with(&opts.output, opts.rotation)?;
    writer.write_session(&SessionInfo {
        pids: vec![child.pid],
        ..session
    })?;
    for b in binary_infos(binaries.iter().map(|t| &t.binary)) {
        writer.write_binary(&b)?;
    }
    writer.publish()?;
    let known: Vec<(u64, u64)> = binaries.iter().map(|t| geometry(&t.binary)).collect();
    let mut drain = UserDrain::new(writer, &known, Box::new(mapped_in), duration);

    drain.hold(child.pid);
    gate::ignore_terminal_signals();
    child.release().with_context(|| exe.display().to_string())?;
    let drained = drain.serve(&ours, child.pid)?;
    finish(drained, opts.filter.describe())
}

/// `--min-duration`'s filter for the command's `binaries`, with the threshold in ticks
/// of a counter running at `tsc_hz`.
fn duration_filter(
    opts: &RecordOptions,
    binaries: &[super::discover::Traced],
    tsc_hz: f64,
) -> Result<Option<DurationFilter>> {
    let Some(ns) = opts.filter.min_duration_ns()? else {
        return Ok(None);
    };
    let mut filter = DurationFilter::new((ns as f64 * tsc_hz / 1e9).ceil() as u64);
    for t in binaries {
        let b = &t.binary;
        if let Err(mode) = filter.add_binary(b.meta.binary_id, &b.meta) {
            return Err(super::filters::NoCallTimes {
                path: b.path.display().to_string(),
                mode: mode.name(),
            }
            .into());
        }
    }
    Ok(Some(filter))
}

/// What the trace file says about the session of `argv` (its pid once it runs).
fn session_info(argv: &[OsString]) -> SessionInfo {
    SessionInfo {
        command: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pids: Vec::new(),
        mode: "user".into(),
        arch: std::env::consts::ARCH.into(),
        record_version: RECORD_VERSION,
        ring_bytes: 0,
        write_user: false,
        clock: clock::calibrate(Duration::from_millis(20)),
        start_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

/// The file's stats and the summary; returns the command's exit code.
fn finish(mut d: Drained, filter: String) -> Result<i32> {
    if d.duration.unjudged > 0 {
        eprintln!(
            "utrace: warning: {} records of threads beyond the duration filter's {} stacks passed unjudged",
            d.duration.unjudged,
            tracer_common::ebpf::MAX_CALL_STACKS
        );
    }
    // Every record taken out of a buffer (sent, or read at a thread's exit) is
    // delivered or filtered (`--min-duration`): this drain never drops.
    let stats = FinalStats {
        records_produced: d.produced,
        records_delivered: d.records,
        records_filtered: d.duration.filtered - d.duration.released,
        calls_short: d.duration.calls_short,
        calls_deep: d.duration.calls_deep,
        filter,
        chunks: d.chunks,
        records_received: d.records,
        chunks_received: d.chunks,
        bad_entries: d.bad_entries,
        threads: d.threads.len() as u64,
        clock_end: Some(clock::anchor()),
        exit_code: Some(d.exit_code),
        ..Default::default()
    };
    let consumed = Consumed {
        records: d.records,
        chunks: d.chunks,
        bad_entries: d.bad_entries,
        threads: std::mem::take(&mut d.threads),
    };
    let path = d.writer.finish(&stats)?;
    print_summary(&consumed, &stats, &path);
    Ok(d.exit_code)
}

/// The instrumented binaries process `pid` maps (qemu-user's guest program, a
/// `dlopen`ed library), for the drain.
fn mapped_in(pid: u32) -> Vec<(Found, u64)> {
    let found = binaries::for_process(pid).unwrap_or_else(|e| {
        log::warn!("{e:#}");
        Vec::new()
    });
    found
        .into_iter()
        .map(|(b, bias)| {
            let (_, buf_bytes) = geometry(&b);
            let info = binary_info(0, &b);
            (Found { info, buf_bytes }, bias)
        })
        .collect()
}

/// The largest buffer of binary `b` in bytes, from its metadata: (binary id, bytes).
fn geometry(b: &Instrumented) -> (u64, u64) {
    let bytes = if b.meta.buf_kind() == tracer_common::BUF_FAST_CIRCULAR {
        tracer_common::FAST_RING_BYTES
    } else {
        u64::from(b.meta.buf_records) * RECORD_SIZE as u64
    };
    (b.meta.binary_id, bytes)
}

/// The socket pair the command sends its buffers through, with large buffers.
fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    let pair = super::gate::socket_pair(libc::SOCK_SEQPACKET).context("socketpair")?;
    let big: libc::c_int = 8 << 20;
    for (fd, opt) in [(&pair.0, libc::SO_RCVBUF), (&pair.1, libc::SO_SNDBUF)] {
        // SAFETY: a valid int option value of the right size. Best effort (capped by
        // net.core.*mem_max); a small buffer only makes senders wait.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&raw const big).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    Ok(pair)
}
