//! A session in named steps: find the binaries, load and attach the eBPF programs,
//! start or attach to the target, serve until it ends, finish the file (`user.rs`: the
//! same for `--user`, without eBPF). Uses the drains (`record::drain`), `record::host`,
//! `tracefile` and `debuginfo`; no drain uses the session.
//!
//! The kinds of session:
//! - **Command** (`record -- CMD`): the command's instrumented binaries (`ld.so --list`, run
//!   as the command will be: `--run-as`, under sudo the invoking user) are attached before
//!   it runs; `TARGETS` holds its pid and `fork` adds children. The command gets one end of
//!   a stream socket pair as descriptor `USER_DRAIN_FD` (the session holds the other until
//!   it ends). A rewritten program it starts, directly or through shells, `make` or
//!   `xargs`, finds that socket at its first record and waits there
//!   (`tracer-common/src/layout.rs`, "Waiting for the session") while the tracer, told by
//!   the `exec` and `mmap` notices, attaches its binary (flush and site uprobes) and writes
//!   `ATTACHED` through `/proc/PID/mem` (`seed.rs`): a program that would otherwise end
//!   before that delivers its records. Not the flush instruction turning into a breakpoint:
//!   the kernel writes it tens of milliseconds before the eBPF program is linked to the
//!   probe (programs that ran in that gap delivered nothing, uncounted; `cargo xtask
//!   difftest` found it), and a uprobe on a file a live process maps takes ~0.3 s here. A
//!   program whose descriptor was closed on the way (Python's `subprocess` closes all above
//!   2) connects to the session socket (`announce.rs`), which the command's session also
//!   serves when the name is free, holding only the command's descendants (`SO_PEERCRED`,
//!   `/proc` parent links). Test `tests/tests/short_lived.rs`: 100 programs through `sh -c`,
//!   30 through `xargs -P2` and 10 through Python's `subprocess`, exact per process against
//!   kernel uprobes on the original; a qemu-user guest counted lost before attach.
//! - **Process** (`record -p PID`): its mapped instrumented binaries; `TABLES` is seeded
//!   from `/proc/PID/mem` so threads that registered long ago are drained at exit. It cannot
//!   tell records a dead thread left in a slot before the attach from those of a new thread
//!   reusing its thread pointer. When it stops early (Ctrl-C, `--duration`) the stop drain
//!   (`record/drain/stop_drain.rs`) collects what live threads still buffer.
//! - **System-wide** (`record --system-wide`): the `SYSTEM_WIDE` global makes every process
//!   a target. The tracer scans `/proc/*/maps` (each mapped file checked once, lazily: only
//!   headers and `.note.utrace` are read), attaches every instrumented binary it finds with
//!   all-processes scope and seeds `TABLES` of the processes mapping it (`fork` and `exec`:
//!   `tracer-ebpf/src/tables.rs`). Fair shares per uid: `shares.rs`.
//! - **Binaries that appear later.** The `exec` and `mmap` programs send a
//!   `CHUNK_KIND_MAPPED` notice for target processes; the consumer hands it to the session
//!   loop, which scans that process's maps within about a millisecond (and once more 10 ms
//!   later: `mmap` is announced on entry, possibly before the mapping exists), attaches new
//!   instrumented binaries (their binary section goes into the file before their first
//!   chunk; ordinals go on from the session's) and seeds `TABLES`.
//! - **Untouched binaries** (`--uprobe PATH[:GLOB,...]`, `--usdt PATH`): the rewriter run as
//!   a library with every site a uprobe (`rewriter::uprobe_metadata`); the `site` program is
//!   attached there like at any uprobe site (no flush, no RW area).
//! - **Several sessions at once** each load their own object (maps, ring, counters) and
//!   attach their own uprobes; the kernel runs every session's program at a flush. Without
//!   write-user each session's `DRAINED` keeps its own position and each gets every record
//!   of its targets (with write-user the first session's reset would hide the buffer from
//!   the second: not supported).
//!
//! The control socket (`control.rs`) appears once the session is set up. A tracer killed
//! with SIGKILL leaves nothing attached (links and perf events are file descriptors) and its
//! targets run on; only its unrenamed temporary trace file (0600) stays
//! (`tracer_kill::tracer_killed_target_runs_on_and_nothing_stays_attached`).

mod announce;
mod attach;
pub(crate) mod binaries;
pub mod control;
pub mod credentials;
mod discover;
pub mod filters;
pub(crate) mod gate;
mod live;
mod procdir;
mod seed;
pub(crate) mod semaphores;
mod shares;
mod summary;
mod target;
mod teardown;
mod test_hook;
pub(super) mod user;

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use aya::maps::{MapData, RingBuf};
use aya_log::EbpfLogger;
use tracer_common::{CAUSE_EXEC, RECORD_VERSION, ebpf::MAP_EVENTS};

use discover::{Traced, binary_infos};
use summary::print_summary;
pub use target::{LiveFeed, OnFull, RecordOptions, Target, Untouched, default_output};

use crate::{
    record::{
        drain::{
            consumer::{Logger, Pipeline},
            stop_drain,
        },
        host::{clock, kernel},
    },
    tracefile::{BinaryInfo, SessionInfo, Writer},
};
use attach::Live;
use binaries::SeenFiles;
use control::Control;
use gate::{GatedChild, WaitEnd};
use seed::all_pids;

/// Record a trace; returns the exit code for the tracer (the command's, when it ran one).
pub fn record(mut opts: RecordOptions) -> Result<i32> {
    target::check_ring_bytes(opts.ring_bytes)?;
    opts.filter.validate()?;
    crate::tracefile::check_destination(&opts.output)?;
    kernel::ensure_tracefs()?;
    kernel::raise_memlock();

    let system_wide = matches!(opts.target, Target::SystemWide { .. });
    let (initial, exe) = initial_binaries(&opts)?;
    let durations = opts.filter.min_duration.is_some();
    let mut live = Live::load(
        opts.ring_bytes,
        opts.on_full,
        system_wide,
        &initial,
        durations,
    )?;
    let mut seen = live.add_initial(&initial)?;
    live.attach_tracepoints()?;
    live.set_initial_filter(&opts)?;
    let live_feed = opts.live.take();
    let (tee, live_dropped, live_done) = match live_feed {
        Some(f) => (Some(f.tee), Some(f.dropped), Some(f.done)),
        None => (None, None, None),
    };
    let (mut outputs, mut session) = outputs(&opts, &mut live)?;
    outputs.tee = tee;
    let (mapped_tx, mapped_rx) = mpsc::channel::<(u32, u32)>();
    outputs.mapped = Some(mapped_tx);
    let started = match (&opts.target, exe) {
        (Target::Exec(argv), Some(exe)) => {
            let run_as = opts.run_as.as_ref();
            start_exec(&exe, argv, run_as, &mut live, &mut session, outputs)?
        }
        (Target::Attach { pid, duration }, _) => {
            start_attach(*pid, *duration, &initial, &mut live, &mut session, outputs)?
        }
        (Target::SystemWide { duration }, _) => {
            start_system_wide(*duration, &mut live, &mut session, &mut seen, outputs)?
        }
        (Target::Exec(_), None) => bail!("no executable to run"),
    };
    let control = open_control();
    let (end, exit_code) = serve(
        &mut live,
        &started,
        &mapped_rx,
        control.as_ref(),
        &mut seen,
        live_dropped.as_deref(),
    )?;
    match &end {
        WaitEnd::Exited => log::info!("the traced process exited"),
        WaitEnd::Interrupted => log::info!("interrupted; ending the session"),
        WaitEnd::Timeout => log::info!("duration over; ending the session"),
    }
    drop(started.child);
    let waits = started
        .announcement
        .map_or_else(announce::Waits::default, announce::Announcement::finish);
    drop(control);
    // A process still running when the session ends: its buffers are collected.
    let stop_pid = match (&opts.target, end) {
        (Target::Attach { pid, .. }, WaitEnd::Interrupted | WaitEnd::Timeout) => Some(*pid),
        _ => None,
    };
    let close = Close {
        exit_code,
        initial: initial.len(),
        waits,
        stop_pid,
        live_done,
    };
    finish(live, started.pipeline, close)?;
    Ok(exit_code.unwrap_or(0))
}

/// The target's instrumented binaries, then the untouched ones (`--uprobe`, `--usdt`).
fn initial_binaries(opts: &RecordOptions) -> Result<(Vec<Traced>, Option<PathBuf>)> {
    let (mut initial, exe) =
        discover::discover(&opts.target, &opts.binaries, opts.run_as.as_ref())?;
    for u in &opts.untouched {
        let b = binaries::untouched(&u.path, &u.functions, u.usdt).with_context(|| {
            format!(
                "--{} {}",
                if u.usdt { "usdt" } else { "uprobe" },
                u.path.display()
            )
        })?;
        log::info!(
            "tracing untouched {} by uprobes ({} sites)",
            b.path.display(),
            b.meta.sites.len()
        );
        initial.push(Traced {
            binary: b,
            load_bias: None,
        });
    }
    Ok((initial, exe))
}

/// Where the records go: the ring buffer, the eBPF log, the trace file to create.
struct Outputs {
    ring: RingBuf<MapData>,
    logger: Option<Logger>,
    output: PathBuf,
    rotation: crate::tracefile::Rotation,
    infos: Vec<BinaryInfo>,
    /// "New code mapped" notices to the session loop.
    mapped: Option<mpsc::Sender<(u32, u32)>>,
    /// `--live`: the view's copy of the file.
    tee: Option<crate::tracefile::Tee>,
}

impl Outputs {
    /// Create the file (session and binary sections) and start consuming.
    fn start(self, session: &SessionInfo) -> Result<Pipeline> {
        let mut w = Writer::create_with(&self.output, self.rotation)?;
        if let Some(t) = self.tee {
            w.tee_to(t);
        }
        w.write_session(session)?;
        for b in &self.infos {
            w.write_binary(b)?;
        }
        w.publish()?;
        Pipeline::start(self.ring, self.logger, w, self.mapped)
    }
}

/// The session's outputs and its description (the target's part filled in by `start_*`).
fn outputs(opts: &RecordOptions, live: &mut Live) -> Result<(Outputs, SessionInfo)> {
    let logger = match EbpfLogger::init(&mut live.ebpf) {
        Ok(l) => Some(l),
        Err(e) => {
            log::warn!("no eBPF log output: {e}");
            None
        }
    };
    let ring = RingBuf::try_from(
        live.ebpf
            .take_map(MAP_EVENTS)
            .with_context(|| format!("no {MAP_EVENTS} map"))?,
    )?;
    let session = SessionInfo {
        command: Vec::new(),
        pids: Vec::new(),
        mode: String::new(),
        arch: std::env::consts::ARCH.into(),
        record_version: RECORD_VERSION,
        ring_bytes: opts.ring_bytes,
        write_user: live.write_user,
        clock: clock::calibrate(Duration::from_millis(20)),
        start_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let outputs = Outputs {
        ring,
        logger,
        output: opts.output.clone(),
        rotation: opts.rotation,
        infos: binary_infos(&live.binaries),
        mapped: None,
        tee: None,
    };
    Ok((outputs, session))
}

/// A started session: what ends it, when, and the consumer.
struct Started {
    /// The command run by `record -- CMD` (dropped before release: it exits unexecuted).
    child: Option<GatedChild>,
    /// The programs' waits for the tracer (`announce`): the command's session socket,
    /// the system-wide listening socket.
    announcement: Option<announce::Announcement>,
    ending: Ending,
    deadline: Option<Instant>,
    pipeline: Pipeline,
}

/// `record -- CMD`: the command behind its gate, released once everything is attached.
fn start_exec(
    exe: &Path,
    argv: &[std::ffi::OsString],
    run_as: Option<&credentials::RunAs>,
    live: &mut Live,
    session: &mut SessionInfo,
    outputs: Outputs,
) -> Result<Started> {
    // Dropped before release (any error below), the child exits unexecuted.
    let mut c = GatedChild::spawn(exe, argv, run_as)?;
    live.add_target(c.pid)?;
    session.mode = "exec".into();
    session.pids = vec![c.pid];
    session.command = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let announcement = c
        .take_session()
        .map(|s| announce::Announcement::command(s, c.pid))
        .transpose()
        .context("session socket")?;
    let pipeline = outputs.start(session)?;
    gate::ignore_terminal_signals();
    if let Err(e) = c.release() {
        let _ = gate::wait_child(c.pid);
        let _ = pipeline.finish();
        return Err(e.context(exe.display().to_string()));
    }
    Ok(Started {
        ending: Ending::Child(c.pid),
        child: Some(c),
        announcement,
        deadline: None,
        pipeline,
    })
}

/// `record -p PID`: its binaries' RW areas seeded and their loads noted.
fn start_attach(
    pid: u32,
    duration: Option<Duration>,
    initial: &[Traced],
    live: &mut Live,
    session: &mut SessionInfo,
    outputs: Outputs,
) -> Result<Started> {
    live.add_target(pid)?;
    for t in initial {
        if let Some(bias) = t.load_bias {
            live.seed_table(pid, &t.binary, bias);
        }
    }
    session.mode = "attach".into();
    session.pids = vec![pid];
    session.command = gate::cmdline(pid);
    gate::catch_stop_signals();
    let pipeline = outputs.start(session)?;
    for t in initial {
        if let Some(bias) = t.load_bias {
            live.note_load(pid, &t.binary, bias, &pipeline);
        }
    }
    Ok(Started {
        child: None,
        announcement: None,
        ending: Ending::Process(gate::PidWatch::open(pid)?),
        deadline: duration.map(|d| Instant::now() + d),
        pipeline,
    })
}

/// `record --system-wide`: every running process scanned once started.
fn start_system_wide(
    duration: Option<Duration>,
    live: &mut Live,
    session: &mut SessionInfo,
    seen: &mut SeenFiles,
    outputs: Outputs,
) -> Result<Started> {
    session.mode = "system-wide".into();
    gate::catch_stop_signals();
    // Before the scan: a program started from now on waits for the tracer. Without
    // the name, whoever holds it would be the one programs connect to: refuse.
    let announcement = Some(announce::Announcement::system_wide().map_err(rendezvous_taken)?);
    let pipeline = outputs.start(session)?;
    // Processes already running: their RW areas, so exits drain them.
    for pid in all_pids() {
        live.scan_process(pid, seen, &pipeline);
    }
    log::info!(
        "system-wide: {} instrumented binaries in {} processes",
        live.binaries.len(),
        live.seeded
            .iter()
            .map(|(p, _)| p)
            .collect::<HashSet<_>>()
            .len()
    );
    Ok(Started {
        child: None,
        announcement,
        ending: Ending::Never,
        deadline: duration.map(|d| Instant::now() + d),
        pipeline,
    })
}

/// Why a system-wide session cannot start: the session name is not ours (naming who
/// holds it when that can be found out).
fn rendezvous_taken(e: std::io::Error) -> anyhow::Error {
    let name = String::from_utf8_lossy(&tracer_common::SESSION_SOCKET[1..]).into_owned();
    let who = match announce::name_holder() {
        Some(h) => format!("it is held by {h}"),
        None => "its holder is unknown".to_string(),
    };
    anyhow::anyhow!(
        "cannot listen on the session socket @{name} ({e}): {who}. A system-wide session \
         must own it (rewritten programs connect there); stop that process and try again"
    )
}

/// Opened once the session is set up (what is running is traced): its appearance tells
/// scripts that the session is ready.
fn open_control() -> Option<Control> {
    match Control::open() {
        Ok(c) => {
            log::info!("control socket {}", c.path().display());
            Some(c)
        }
        Err(e) => {
            log::warn!("no control socket (`tracer filter` cannot reach this session): {e:#}");
            None
        }
    }
}

/// The session's loop: new code mapped by traced processes, filter requests, the end.
fn serve(
    live: &mut Live,
    started: &Started,
    mapped_rx: &mpsc::Receiver<(u32, u32)>,
    control: Option<&Control>,
    seen: &mut SeenFiles,
    live_dropped: Option<&AtomicU64>,
) -> Result<(WaitEnd, Option<i32>)> {
    let mut pending: HashSet<u32> = HashSet::new();
    let mut counted = Instant::now();
    // Each notice is looked at again a little later: `mmap` is announced on entry to
    // the system call, so the first look may come before the mapping exists.
    let mut again: Vec<(Instant, u32)> = Vec::new();
    loop {
        if let Some(end) = started.ending.check(started.deadline)? {
            return Ok(end);
        }
        // Waiting on the notices themselves: a process that just exec'd or mapped code
        // is looked at within a millisecond or so, before it has run far.
        if let Ok(first) = mapped_rx.recv_timeout(Duration::from_millis(5)) {
            for (pid, cause) in std::iter::once(first).chain(mapped_rx.try_iter()) {
                if cause == CAUSE_EXEC {
                    // A new image: its RW areas are new, even at the old addresses.
                    live.seeded.retain(|&(p, _)| p != pid);
                }
                pending.insert(pid);
            }
        }
        let now = Instant::now();
        for pid in pending.drain() {
            live.scan_process(pid, seen, &started.pipeline);
            if !again.iter().any(|&(_, p)| p == pid) {
                again.push((now + Duration::from_millis(10), pid));
            }
        }
        // Second looks, once each.
        again.retain(|&(at, pid)| {
            if at <= now {
                live.scan_process(pid, seen, &started.pipeline);
            }
            at > now
        });
        if let Some(d) = live_dropped
            && now.duration_since(counted) >= Duration::from_secs(1)
        {
            counted = now;
            d.store(summary::dropped_so_far(&live.ebpf), Ordering::Relaxed);
        }
        if let Some(c) = control {
            c.serve(|req| live.handle(req));
        }
    }
}

/// How a session ended, for [`finish`].
struct Close {
    exit_code: Option<i32>,
    initial: usize,
    /// How programs' waits went (lost before attach) and connections refused.
    waits: announce::Waits,
    /// `-p PID` stopped before the process ended: collect what its buffers hold.
    stop_pid: Option<u32>,
    live_done: Option<Box<dyn FnOnce() + Send>>,
}

/// Nothing new once the session is stopped, so the last drain of the ring buffer is complete and
/// the kernel counters match the file: stats, the summary, the debug cache.
fn finish(mut live: Live, pipeline: Pipeline, end: Close) -> Result<()> {
    let frozen = end.stop_pid.and_then(|pid| stop_drain_frozen(&live, pid));
    if let Err(e) = teardown::stop(&mut live.ebpf, live.system_wide) {
        log::warn!("{e:#}; taking every probe down now");
        attach::detach(&mut live.ebpf);
    }
    // Collected while the threads are frozen; dropping `f` lets them run on.
    let mut at_stop = frozen.map(|(f, rw)| f.collect(&rw, &live.ebpf, live.write_user));
    if let Some(c) = &mut at_stop {
        pipeline.write_sections(std::mem::take(&mut c.sections))?;
    }
    let (mut consumed, writer) = pipeline.finish()?;
    let mut stats = summary::final_stats(&live.ebpf, &consumed, clock::anchor(), end.exit_code)?;
    if let Some(c) = at_stop {
        summary::add_stop_drain(&mut stats, &mut consumed, &c);
    }
    stats.filter = live.filters.spec().describe();
    stats.filter_changes = live.filter_changes;
    stats.binaries_added = live.binaries.len().saturating_sub(end.initial) as u64;
    stats.unattached = end.waits.unattached;
    let path = writer.finish(&stats)?;
    // The live view has had the whole file (its copy ends with the file): its last
    // frame goes before the summary.
    if let Some(done) = end.live_done {
        done();
    }
    print_summary(&consumed, &stats, &path);
    if end.waits.refused > 0 {
        eprintln!(
            "utrace: warning: {} connections to the session socket refused (over {} held \
             for one user or {} in all, or no descriptor left: {}); their programs did not \
             wait for the tracer",
            end.waits.refused,
            announce::MAX_HELD_PER_UID,
            announce::MAX_HELD,
            end.waits.refused_no_fd
        );
    }
    live.print_refusals();
    for b in &live.binaries {
        summary::cache_debug_info(b);
    }
    teardown::release(live.ebpf);
    Ok(())
}

/// The threads of `pid` frozen and its RW areas, unless a filter is in force (the
/// records would have to be judged as the drain judges them: not done in user space).
fn stop_drain_frozen(live: &Live, pid: u32) -> Option<(stop_drain::Frozen, Vec<u64>)> {
    if !live.filters.spec().is_empty() {
        eprintln!(
            "utrace: warning: with a filter, the records still in process {pid}'s buffers \
             are not collected"
        );
        return None;
    }
    let rw: Vec<u64> = live
        .seeded
        .iter()
        .filter(|&&(p, _)| p == pid)
        .map(|&(_, rw)| rw)
        .collect();
    stop_drain::Frozen::freeze(pid).map(|f| (f, rw))
}

/// What ends a session.
enum Ending {
    /// Our child exited: its exit code.
    Child(u32),
    /// The attached process exited.
    Process(gate::PidWatch),
    /// Only Ctrl-C or the duration.
    Never,
}

impl Ending {
    /// Why the session ends now, with the command's exit code, or None to go on.
    fn check(&self, deadline: Option<Instant>) -> Result<Option<(WaitEnd, Option<i32>)>> {
        if let Ending::Child(pid) = self {
            return Ok(gate::try_wait_child(*pid)?.map(|code| (WaitEnd::Exited, Some(code))));
        }
        if gate::interrupted() {
            return Ok(Some((WaitEnd::Interrupted, None)));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Some((WaitEnd::Timeout, None)));
        }
        if let Ending::Process(w) = self
            && w.exited()?
        {
            return Ok(Some((WaitEnd::Exited, None)));
        }
        Ok(None)
    }
}
