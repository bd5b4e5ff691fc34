//! A recording session: load and attach the eBPF programs for the instrumented
//! binaries, run or attach to the traced process, consume until it is gone, write the
//! trace file.

pub mod binaries;
pub mod consumer;
pub mod control;
pub mod filters;
pub mod gate;
pub mod host;
pub mod semaphores;
pub mod userdrain;

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    ffi::OsString,
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::mpsc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, PerCpuArray, ProgramArray, RingBuf},
    programs::{
        TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use aya_log::EbpfLogger;
use tracer_common::{
    RECORD_VERSION, RW_MAGIC, STAT_CHUNKS, STAT_COUNT, STAT_READ_ERRORS, STAT_RECORDS_DELIVERED,
    STAT_RECORDS_DROPPED, STAT_RECORDS_FILTERED, STAT_RECORDS_PRODUCED, STAT_RECORDS_SKIPPED,
    ebpf::{
        DEFAULT_RING_BYTES, GLOBAL_EXIT_GROUP_DEAD_OFF, GLOBAL_FORK_CHILD_PID_OFF,
        GLOBAL_SYSTEM_WIDE, GLOBAL_TP_OFFSET, GLOBAL_WRITE_USER, MAP_BINARIES, MAP_EVENTS,
        MAP_EXIT_STEPS, MAP_OPERANDS, MAP_SEQ, MAP_STATS, MAP_TABLES, MAP_TARGETS, MAX_BINARIES,
        PROG_EXEC, PROG_EXIT_STEP, PROG_FLUSH, PROG_FLUSH_SLEEPABLE, PROG_FORK, PROG_GROUP_EXIT,
        PROG_KILLED, PROG_MMAP, PROG_SITE, PROG_TASK_EXIT, PROG_THREAD_EXIT, SEL_BLOCK, SEL_CALL,
        SEL_ENTRY, SEL_EXIT, SEL_MEMORY, SEL_USDT, STAT_TABLE_FULL, TABLE_BINARIES, operand_key,
        site_cookie,
    },
    meta::{SiteKind, SiteMode},
    operand::OperandSet,
};

/// Which registers the eBPF `site` program records for a uprobe site of this kind.
fn site_selector(kind: SiteKind) -> u8 {
    match kind {
        SiteKind::FunctionEntry => SEL_ENTRY,
        SiteKind::FunctionExit => SEL_EXIT,
        SiteKind::Block => SEL_BLOCK,
        SiteKind::Memory => SEL_MEMORY,
        SiteKind::Usdt => SEL_USDT,
        SiteKind::Call => SEL_CALL,
    }
}

use crate::{
    record::binaries::Instrumented,
    record::consumer::{Consumed, Pipeline},
    record::control::{Control, Reply, Request},
    record::filters::{FilterSpec, Filters},
    record::gate::{GatedChild, WaitEnd},
    record::host::btf,
    record::host::clock,
    record::host::kernel,
    record::semaphores::Raised,
    tracefile::{BinaryInfo, FinalStats, SessionInfo, Writer, encode_binary, encode_load},
};

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

const TRACEPOINTS: [(&str, &str, &str); 9] = [
    (PROG_THREAD_EXIT, "syscalls", "sys_enter_exit"),
    (PROG_GROUP_EXIT, "syscalls", "sys_enter_exit_group"),
    // exec replaces the image the buffers live in: the thread calling it drains them
    // first (its other threads are killed: `killed`).
    (PROG_GROUP_EXIT, "syscalls", "sys_enter_execve"),
    (PROG_GROUP_EXIT, "syscalls", "sys_enter_execveat"),
    (PROG_KILLED, "signal", "signal_deliver"),
    (PROG_TASK_EXIT, "sched", "sched_process_exit"),
    (PROG_FORK, "sched", "sched_process_fork"),
    // New code in a traced process (exec, dlopen): the tracer looks for instrumented
    // binaries it does not trace yet.
    (PROG_EXEC, "sched", "sched_process_exec"),
    (PROG_MMAP, "syscalls", "sys_enter_mmap"),
];

/// Room in `OPERANDS` for the uprobe sites of binaries that join a running session.
const SPARE_OPERAND_SETS: usize = 4096;

pub enum Target {
    /// Run a command (argv[0] is resolved through PATH).
    Exec(Vec<OsString>),
    /// Attach to a running process until it exits, Ctrl-C, or the duration passes.
    Attach {
        pid: u32,
        duration: Option<Duration>,
    },
    /// Every process that runs an instrumented binary, until Ctrl-C or the duration.
    SystemWide { duration: Option<Duration> },
}

pub struct RecordOptions {
    pub output: PathBuf,
    pub ring_bytes: u32,
    pub target: Target,
    /// `--binary`: instrumented binaries to trace besides those found from the target
    /// (e.g. the program run by an uninstrumented loader such as qemu-user).
    pub binaries: Vec<PathBuf>,
    /// In-kernel filters at the start (`tracer filter` changes them later).
    pub filter: FilterSpec,
    /// Untouched binaries traced by uprobes only.
    pub untouched: Vec<Untouched>,
}

/// `record --uprobe PATH[:GLOB,...]` / `--usdt PATH`.
pub struct Untouched {
    pub path: PathBuf,
    pub functions: Vec<String>,
    pub usdt: bool,
}

impl Untouched {
    /// `PATH[:GLOB,...]` (a `:` followed by no `/` starts the globs).
    pub fn parse_uprobe(spec: &str) -> Untouched {
        let (path, globs) = match spec.rsplit_once(':') {
            Some((p, g)) if !g.contains('/') && !p.is_empty() => (p, g),
            _ => (spec, ""),
        };
        Untouched {
            path: PathBuf::from(path),
            functions: globs
                .split(',')
                .filter(|g| !g.is_empty())
                .map(String::from)
                .collect(),
            usdt: false,
        }
    }
}

/// An instrumented binary to trace and, when attaching, its load bias in the process.
pub type Traced = (Instrumented, Option<u64>);

/// Record a trace; returns the exit code for the tracer (the command's, when it ran one).
pub fn record(opts: RecordOptions) -> Result<i32> {
    check_ring_bytes(opts.ring_bytes)?;
    opts.filter.validate()?;
    kernel::ensure_tracefs()?;
    kernel::raise_memlock();

    let system_wide = matches!(opts.target, Target::SystemWide { .. });
    let (mut initial, exe) = discover(&opts.target, &opts.binaries)?;
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
        initial.push((b, None));
    }
    let mut live = Live::load(opts.ring_bytes, system_wide, &initial)?;
    let mut seen_files: StdHashMap<(PathBuf, u64), Option<Instrumented>> = StdHashMap::new();
    for (b, _) in &initial {
        live.add_binary(b.clone(), None)?;
        if let Ok(md) = std::fs::metadata(&b.path) {
            use std::os::unix::fs::MetadataExt;
            seen_files.insert((b.path.clone(), md.ino()), Some(b.clone()));
        }
    }
    live.attach_tracepoints()?;
    let list: Vec<Instrumented> = live.binaries.iter().map(|(b, _)| b.clone()).collect();
    let matched = live
        .filters
        .set(&opts.filter, &list.iter().collect::<Vec<_>>())?;
    if !opts.filter.is_empty() {
        log::info!("filter: {} ({matched} sites)", opts.filter.describe());
    }
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

    let mut session = SessionInfo {
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
    let infos = binary_infos(&live.binaries);
    let start_writer = |session: &SessionInfo| -> Result<Writer> {
        let mut w = Writer::create(&opts.output)?;
        w.write_session(session)?;
        for b in &infos {
            w.write_binary(b)?;
        }
        Ok(w)
    };
    let (mapped_tx, mapped_rx) = mpsc::channel::<(u32, u32)>();

    let mut child = None;
    let (ending, deadline, pipeline) = match (&opts.target, exe) {
        (Target::Exec(argv), Some(exe)) => {
            // Dropped before release (any error below), the child exits unexecuted.
            let mut c = GatedChild::spawn(&exe, argv)?;
            live.add_target(c.pid)?;
            session.mode = "exec".into();
            session.pids = vec![c.pid];
            session.command = argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let pipeline = Pipeline::start(ring, logger, start_writer(&session)?, Some(mapped_tx))?;
            gate::ignore_terminal_signals();
            if let Err(e) = c.release() {
                let _ = gate::wait_child(c.pid);
                let _ = pipeline.finish();
                return Err(e.context(exe.display().to_string()));
            }
            let pid = c.pid;
            child = Some(c);
            (Ending::Child(pid), None, pipeline)
        }
        (Target::Attach { pid, duration }, _) => {
            live.add_target(*pid)?;
            for (b, bias) in &initial {
                if let Some(bias) = bias {
                    live.seed_table(*pid, b, *bias);
                }
            }
            session.mode = "attach".into();
            session.pids = vec![*pid];
            session.command = gate::cmdline(*pid);
            gate::catch_stop_signals();
            let pipeline = Pipeline::start(ring, logger, start_writer(&session)?, Some(mapped_tx))?;
            for (b, bias) in &initial {
                if let Some(bias) = bias {
                    live.note_load(*pid, b, *bias, &pipeline);
                }
            }
            (
                Ending::Process(gate::PidWatch::open(*pid)?),
                duration.map(|d| Instant::now() + d),
                pipeline,
            )
        }
        (Target::SystemWide { duration }, _) => {
            session.mode = "system-wide".into();
            gate::catch_stop_signals();
            let pipeline = Pipeline::start(ring, logger, start_writer(&session)?, Some(mapped_tx))?;
            // Processes already running: their RW areas, so exits drain them.
            for pid in all_pids() {
                live.scan_process(pid, &mut seen_files, &pipeline);
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
            (
                Ending::Never,
                duration.map(|d| Instant::now() + d),
                pipeline,
            )
        }
        (Target::Exec(_), None) => bail!("no executable to run"),
    };
    // Opened once the session is set up (what is running is traced): its appearance
    // tells scripts that the session is ready.
    let control = match Control::open() {
        Ok(c) => {
            log::info!("control socket {}", c.path().display());
            Some(c)
        }
        Err(e) => {
            log::warn!("no control socket (`tracer filter` cannot reach this session): {e:#}");
            None
        }
    };

    // The session's loop: new code mapped by traced processes, filter requests, the end.
    let mut pending: HashSet<u32> = HashSet::new();
    // Each notice is looked at again a little later: `mmap` is announced on entry to
    // the system call, so the first look may come before the mapping exists.
    let mut again: Vec<(Instant, u32)> = Vec::new();
    let (end, exit_code) = loop {
        if let Some(end) = ending.check(deadline)? {
            break end;
        }
        // Waiting on the notices themselves: a process that just exec'd or mapped code
        // is looked at within a millisecond or so, before it has run far.
        if let Ok((pid, _cause)) = mapped_rx.recv_timeout(Duration::from_millis(5)) {
            pending.insert(pid);
            while let Ok((pid, _)) = mapped_rx.try_recv() {
                pending.insert(pid);
            }
        }
        let now = Instant::now();
        for pid in pending.drain() {
            live.scan_process(pid, &mut seen_files, &pipeline);
            if !again.iter().any(|&(_, p)| p == pid) {
                again.push((now + Duration::from_millis(10), pid));
            }
        }
        // Second looks, once each.
        again.retain(|&(at, pid)| {
            if at <= now {
                live.scan_process(pid, &mut seen_files, &pipeline);
            }
            at > now
        });
        if let Some(c) = &control {
            c.serve(|req| live.handle(req));
        }
    };
    match end {
        WaitEnd::Exited => log::info!("the traced process exited"),
        WaitEnd::Interrupted => log::info!("interrupted; ending the session"),
        WaitEnd::Timeout => log::info!("duration over; ending the session"),
    }
    drop(child);
    drop(control);

    // Nothing new after this point, so the last drain of the ring buffer is complete
    // and the kernel counters match the file.
    detach(&mut live.ebpf);
    let (consumed, writer) = pipeline.finish()?;
    let mut stats = final_stats(&live.ebpf, &consumed, clock::anchor(), exit_code)?;
    stats.filter = live.filters.spec().describe();
    stats.filter_changes = live.filter_changes;
    stats.binaries_added = live.binaries.len().saturating_sub(initial.len()) as u64;
    let path = writer.finish(&stats)?;
    print_summary(&consumed, &stats, &path);
    for (b, _) in &live.binaries {
        cache_debug_info(b);
    }
    Ok(exit_code.unwrap_or(0))
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

fn all_pids() -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != me)
        .collect()
}

/// The loaded eBPF object and what the session traces.
struct Live {
    ebpf: Ebpf,
    write_user: bool,
    /// The flush program in use (sleepable or not).
    flush: &'static str,
    /// Ordinal = index.
    binaries: Vec<Traced>,
    raised: Raised,
    filters: Filters,
    filter_changes: u64,
    /// (pid, rw_base) already in `TABLES`.
    seeded: HashSet<(u32, u64)>,
    /// (pid, binary id, bias) written to the trace file.
    loads: HashSet<(u32, u64, u64)>,
}

impl Live {
    /// Load the object and its programs (attached per binary by `add_binary`).
    fn load(ring_bytes: u32, system_wide: bool, initial: &[Traced]) -> Result<Self> {
        let write_user = kernel::probe_write_user_allowed();
        if !write_user {
            log::info!(
                "the kernel refuses bpf_probe_write_user (lockdown?): slots are not reset or released in place"
            );
        }
        let sets: usize = initial
            .iter()
            .map(|(b, _)| operand_sets(&[b], 0).len())
            .sum::<usize>()
            + SPARE_OPERAND_SETS;
        let mut ebpf = load(ring_bytes, write_user, system_wide, sets)?;
        // The sleepable flush where the kernel has sleepable uprobes, else the plain one.
        let sleepable = {
            let p: &mut UProbe = ebpf
                .program_mut(PROG_FLUSH_SLEEPABLE)
                .with_context(|| format!("no program {PROG_FLUSH_SLEEPABLE}"))?
                .try_into()?;
            let t = Instant::now();
            let r = p.load();
            log::debug!("{PROG_FLUSH_SLEEPABLE} verified in {:?}", t.elapsed());
            match r {
                Ok(()) => true,
                Err(e) => {
                    log::info!("no sleepable flush program ({e}); using the plain one");
                    false
                }
            }
        };
        let flush = if sleepable {
            PROG_FLUSH_SLEEPABLE
        } else {
            PROG_FLUSH
        };
        for name in [flush, PROG_SITE] {
            let p: &mut UProbe = ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name} in the eBPF object"))?
                .try_into()?;
            if p.fd().is_err() {
                let t = Instant::now();
                p.load()
                    .with_context(|| format!("the kernel rejected program {name}"))?;
                log::debug!("{name} verified in {:?}", t.elapsed());
            }
        }
        let filters = Filters::take(&mut ebpf)?;
        Ok(Live {
            ebpf,
            write_user,
            flush,
            binaries: Vec::new(),
            raised: Raised::default(),
            filters,
            filter_changes: 0,
            seeded: HashSet::new(),
            loads: HashSet::new(),
        })
    }

    /// Trace binary `b`: its id for the uprobe-site cookies, the operand sets of its
    /// sites (before they are attached, so that their first hits find them), the flush
    /// and site uprobes, its USDT semaphores, its sites under the filter. With a
    /// pipeline (a binary joining a running session) its section goes into the file
    /// first. Returns its ordinal; a binary already traced (same id) is not added twice.
    fn add_binary(&mut self, b: Instrumented, pipeline: Option<&Pipeline>) -> Result<u32> {
        if let Some(i) = self
            .binaries
            .iter()
            .position(|(o, _)| o.meta.binary_id == b.meta.binary_id)
        {
            return Ok(i as u32);
        }
        let ordinal = self.binaries.len() as u32;
        if ordinal >= MAX_BINARIES {
            bail!(
                "{}: already {MAX_BINARIES} instrumented binaries in this session",
                b.path.display()
            );
        }
        {
            let mut ids: Array<_, u64> = Array::try_from(
                self.ebpf
                    .map_mut(MAP_BINARIES)
                    .with_context(|| format!("no {MAP_BINARIES} map"))?,
            )?;
            ids.set(ordinal, b.meta.binary_id, 0)?;
        }
        {
            let mut map: HashMap<_, u64, OperandSet> = HashMap::try_from(
                self.ebpf
                    .map_mut(MAP_OPERANDS)
                    .with_context(|| format!("no {MAP_OPERANDS} map"))?,
            )?;
            for (key, set) in operand_sets(&[&b], ordinal) {
                map.insert(key, set, 0)
                    .with_context(|| format!("cannot fill {MAP_OPERANDS}"))?;
            }
        }
        if let Some(p) = pipeline {
            let info = binary_info(ordinal, &b);
            p.write_sections(encode_binary(&info))?;
        }
        // The ordinal is taken from here on, even if an attach below fails: uprobes
        // already attached carry it in their cookies. The filter first, so that its
        // first drains are judged by the filter in force.
        self.filters.add_binary(&b)?;
        self.binaries.push((b.clone(), None));
        if !b.untouched {
            let flush: &mut UProbe = self
                .ebpf
                .program_mut(self.flush)
                .with_context(|| format!("no program {}", self.flush))?
                .try_into()?;
            flush
                .attach(b.meta.flush_file_off, &b.attach, UProbeScope::AllProcesses)
                .with_context(|| {
                    format!(
                        "cannot attach the flush uprobe to {} at file offset {:#x}",
                        b.path.display(),
                        b.meta.flush_file_off
                    )
                })?;
        }
        let site: &mut UProbe = self
            .ebpf
            .program_mut(PROG_SITE)
            .with_context(|| format!("no program {PROG_SITE}"))?
            .try_into()?;
        // Descending ids: the kernel runs the consumers of one probe address last
        // attached first, and sites sharing an instruction (a block that is also an
        // exit) must record in id order, as their inline stub would.
        for s in b
            .meta
            .sites
            .iter()
            .rev()
            .filter(|s| s.mode == SiteMode::Uprobe)
        {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(s.file_off),
                cookie: Some(site_cookie(ordinal, site_selector(s.kind), s.id)),
            };
            site.attach(point, &b.attach, UProbeScope::AllProcesses)
                .with_context(|| {
                    format!(
                        "cannot attach a uprobe to {} site {} ({}) at file offset {:#x}",
                        b.path.display(),
                        s.id,
                        s.name,
                        s.file_off
                    )
                })?;
        }
        // Kept until the session ends: USDT probes guarded by a semaphore fire meanwhile.
        if b.untouched {
            // No anchors in an untouched file: each semaphore's reference-counting
            // uprobe sits right after a different probe's nop (an instruction
            // boundary; not on a site, nor two at one place: the kernel refuses two
            // uprobes at one address with different reference counters).
            let nop = if b.meta.arch == tracer_common::ARCH_AARCH64 {
                4
            } else {
                1
            };
            let taken: HashSet<u64> = b.meta.sites.iter().map(|s| s.file_off).collect();
            let mut anchors: Vec<u64> = b
                .meta
                .sites
                .iter()
                .filter(|s| s.kind == SiteKind::Usdt)
                .map(|s| s.file_off + nop)
                .filter(|off| !taken.contains(off))
                .collect();
            anchors.dedup();
            if anchors.len() < b.meta.semaphores.len() {
                log::warn!(
                    "{}: {} USDT semaphores but {} places to raise them from; some stay 0",
                    b.path.display(),
                    b.meta.semaphores.len(),
                    anchors.len()
                );
            }
            let sems: Vec<_> = b
                .meta
                .semaphores
                .iter()
                .zip(anchors)
                .map(|(s, anchor)| tracer_common::meta::Semaphore {
                    anchor_file_off: anchor,
                    semaphore_file_off: s.semaphore_file_off,
                })
                .collect();
            self.raised.raise(&b.attach, &sems)?;
        } else {
            self.raised.raise(&b.attach, &b.meta.semaphores)?;
        }
        if pipeline.is_some() {
            log::info!(
                "tracing {} (binary_id {:#x}) from now on",
                b.path.display(),
                b.meta.binary_id
            );
        }
        Ok(ordinal)
    }

    fn attach_tracepoints(&mut self) -> Result<()> {
        // The exit programs tail-call exit_step: installed before they are attached.
        {
            let step: &mut TracePoint = self
                .ebpf
                .program_mut(PROG_EXIT_STEP)
                .with_context(|| format!("no program {PROG_EXIT_STEP} in the eBPF object"))?
                .try_into()?;
            let t = Instant::now();
            step.load()
                .with_context(|| format!("the kernel rejected program {PROG_EXIT_STEP}"))?;
            log::debug!("{PROG_EXIT_STEP} verified in {:?}", t.elapsed());
            let fd = step.fd()?.try_clone()?;
            let mut steps = ProgramArray::try_from(
                self.ebpf
                    .map_mut(MAP_EXIT_STEPS)
                    .with_context(|| format!("no {MAP_EXIT_STEPS} map"))?,
            )?;
            steps
                .set(0, &fd, 0)
                .with_context(|| format!("cannot install {PROG_EXIT_STEP}"))?;
        }
        for (name, category, event) in TRACEPOINTS {
            let tp: &mut TracePoint = self
                .ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name} in the eBPF object"))?
                .try_into()?;
            if tp.fd().is_err() {
                let t = Instant::now();
                tp.load()
                    .with_context(|| format!("the kernel rejected program {name}"))?;
                log::debug!("{name} verified in {:?}", t.elapsed());
            }
            tp.attach(category, event)
                .with_context(|| format!("cannot attach {name} to {category}:{event}"))?;
        }
        Ok(())
    }

    fn add_target(&mut self, pid: u32) -> Result<()> {
        let mut targets: HashMap<_, u32, u8> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_TARGETS)
                .with_context(|| format!("no {MAP_TARGETS} map"))?,
        )?;
        targets
            .insert(pid, 1, 0)
            .with_context(|| format!("cannot add pid {pid} to {MAP_TARGETS}"))
    }

    /// Tell eBPF where `b`'s RW area is in process `pid` (loaded at `bias`), so that its
    /// threads are drained at exit even if they never flush. Best effort.
    fn seed_table(&mut self, pid: u32, b: &Instrumented, bias: u64) {
        let rw_base = bias.wrapping_add(b.meta.rw_vaddr);
        if self.seeded.contains(&(pid, rw_base)) {
            return;
        }
        if let Err(e) = self.try_seed_table(pid, rw_base) {
            log::info!(
                "{} in process {pid}: {e:#}; its threads are learned at their next flush",
                b.path.display()
            );
            return;
        }
        self.seeded.insert((pid, rw_base));
    }

    fn try_seed_table(&mut self, pid: u32, rw_base: u64) -> Result<()> {
        let mem_path = format!("/proc/{pid}/mem");
        let mem = File::open(&mem_path).with_context(|| format!("cannot open {mem_path}"))?;
        let mut magic = [0u8; 8];
        mem.read_exact_at(&mut magic, rw_base)
            .with_context(|| format!("cannot read the RW area at {rw_base:#x}"))?;
        if u64::from_le_bytes(magic) != RW_MAGIC {
            bail!("no RW area at {rw_base:#x}");
        }
        let mut tables: HashMap<_, u32, [u64; TABLE_BINARIES]> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_TABLES)
                .with_context(|| format!("no {MAP_TABLES} map"))?,
        )?;
        // Merged with what eBPF may have learned meanwhile (a race with a flush only
        // loses an entry that the next flush adds again).
        let mut table = tables.get(&pid, 0).unwrap_or([0; TABLE_BINARIES]);
        if table.contains(&rw_base) {
            return Ok(());
        }
        let free = table.iter().position(|&v| v == 0).with_context(|| {
            format!("process {pid} has {TABLE_BINARIES} instrumented binaries already")
        })?;
        table[free] = rw_base;
        tables
            .insert(pid, table, 0)
            .with_context(|| format!("cannot add pid {pid} to {MAP_TABLES}"))
    }

    /// Look at process `pid`'s mappings: trace instrumented binaries not traced yet and
    /// tell eBPF where their RW areas are. Best effort (the process may be gone).
    fn scan_process(
        &mut self,
        pid: u32,
        seen: &mut StdHashMap<(PathBuf, u64), Option<Instrumented>>,
        pipeline: &Pipeline,
    ) {
        let found = match binaries::for_process_cached(pid, seen) {
            Ok(f) => f,
            Err(e) => {
                log::debug!("{e:#}");
                return;
            }
        };
        for (b, bias) in found {
            let path = b.path.clone();
            let known = self
                .binaries
                .iter()
                .any(|(o, _)| o.meta.binary_id == b.meta.binary_id);
            if !known && let Err(e) = self.add_binary(b.clone(), Some(pipeline)) {
                log::warn!("{}: {e:#}", path.display());
                continue;
            }
            self.seed_table(pid, &b, bias);
            self.note_load(pid, &b, bias, pipeline);
        }
    }

    /// Tell the trace file where `b` is in process `pid` (once per process and binary),
    /// so readers can symbolize its run-time code addresses.
    fn note_load(&mut self, pid: u32, b: &Instrumented, bias: u64, pipeline: &Pipeline) {
        if self.loads.insert((pid, b.meta.binary_id, bias))
            && let Err(e) = pipeline.write_sections(encode_load(pid, b.meta.binary_id, bias))
        {
            log::warn!("{e:#}");
        }
    }

    /// A control-socket request.
    fn handle(&mut self, req: Request) -> Reply {
        if let Some(spec) = req.filter {
            let list: Vec<Instrumented> = self.binaries.iter().map(|(b, _)| b.clone()).collect();
            let refs: Vec<&Instrumented> = list.iter().collect();
            return match self.filters.set(&spec, &refs) {
                Ok(n) => {
                    self.filter_changes += 1;
                    log::info!("filter now: {}", spec.describe());
                    Reply {
                        ok: true,
                        message: format!("filter: {} ({n} sites matched)", spec.describe()),
                    }
                }
                Err(e) => Reply {
                    ok: false,
                    message: format!("{e:#}"),
                },
            };
        }
        Reply {
            ok: true,
            message: format!(
                "filter: {}; {} binaries traced",
                self.filters.spec().describe(),
                self.binaries.len()
            ),
        }
    }
}
/// Keep `b`'s debug information in the tracer's cache (by build-id), so the trace can
/// be symbolized after the binary changes. Best effort.
pub fn cache_debug_info(b: &Instrumented) {
    if let Err(e) = crate::debuginfo::cache_debug_info(&b.path, &b.meta.build_id, &[]) {
        log::warn!("{}: debug information not cached: {e:#}", b.path.display());
    }
}

/// What the trace file says about each traced binary (ordinal = position).
pub fn binary_infos(binaries: &[Traced]) -> Vec<BinaryInfo> {
    binaries
        .iter()
        .enumerate()
        .map(|(i, (b, _))| binary_info(i as u32, b))
        .collect()
}

/// What the trace file says about binary `b` traced as `ordinal`.
fn binary_info(ordinal: u32, b: &Instrumented) -> BinaryInfo {
    BinaryInfo {
        ordinal,
        binary_id: b.meta.binary_id,
        path: b.path.to_string_lossy().into_owned(),
        note: b.note.clone(),
    }
}

/// The instrumented binaries of a command (plus `extra`) and its resolved path.
pub fn discover_command(argv: &[OsString], extra: &[PathBuf]) -> Result<(Vec<Traced>, PathBuf)> {
    let (binaries, exe) = discover(&Target::Exec(argv.to_vec()), extra)?;
    Ok((binaries, exe.context("no executable to run")?))
}

/// The instrumented binaries of the target plus `extra` (`--binary`), and the resolved
/// command when running one; an error if there are none, or too many.
fn discover(target: &Target, extra: &[PathBuf]) -> Result<(Vec<Traced>, Option<PathBuf>)> {
    let named = binaries::named(extra)?;
    let (binaries, exe): (Vec<Traced>, _) = match target {
        Target::Exec(argv) => {
            let cmd = argv.first().context("no command given")?;
            let exe = gate::resolve_command(cmd)?;
            let mut found = match binaries::for_command(&exe) {
                Ok(found) => found,
                // The command may be a loader we cannot inspect (say, a foreign or
                // static one); the named binaries are what the user wants traced.
                Err(e) if !named.is_empty() => {
                    log::warn!("{}: cannot list its libraries: {e:#}", exe.display());
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            binaries::merge(&mut found, named);
            (found.into_iter().map(|b| (b, None)).collect(), Some(exe))
        }
        Target::Attach { .. } if !named.is_empty() => {
            bail!("--binary is only for running a command, not with -p")
        }
        Target::Attach { pid, .. } => {
            let found = binaries::for_process(*pid)?;
            let found = found.into_iter().map(|(b, bias)| (b, Some(bias)));
            (found.collect(), None)
        }
        Target::SystemWide { .. } if !named.is_empty() => {
            bail!("--binary is only for running a command, not with --system-wide")
        }
        // Found by scanning the processes once the session is set up.
        Target::SystemWide { .. } => (Vec::new(), None),
    };
    if binaries.is_empty() && matches!(target, Target::Exec(_)) {
        log::warn!(
            "{}: nothing instrumented yet (no {} note); libraries it loads later (dlopen) are traced",
            exe.as_deref().unwrap_or(Path::new("?")).display(),
            tracer_common::meta::META_SECTION
        );
    } else if binaries.is_empty() && matches!(target, Target::Attach { .. }) {
        let what = match target {
            Target::Attach { pid, .. } => format!("the files mapped by process {pid}"),
            _ => "the target".into(),
        };
        bail!(
            "nothing to trace: none of {what} is instrumented (no {} note; run the rewriter on them first)",
            tracer_common::meta::META_SECTION
        );
    }
    if binaries.len() > MAX_BINARIES as usize {
        bail!(
            "{} instrumented binaries; at most {MAX_BINARIES} per session",
            binaries.len()
        );
    }
    if binaries.len() > TABLE_BINARIES {
        log::warn!(
            "{} instrumented binaries; a process can only have {TABLE_BINARIES} drained at thread exit",
            binaries.len()
        );
    }
    for (b, _) in &binaries {
        let uprobes = b.meta.sites.iter().filter(|s| s.mode == SiteMode::Uprobe);
        log::info!(
            "tracing {} (binary_id {:#x}, {} sites, {} by uprobe)",
            b.path.display(),
            b.meta.binary_id,
            b.meta.sites.len(),
            uprobes.count()
        );
    }
    Ok((binaries, exe))
}

/// The one-line summary on stderr, and warnings about lost records.
pub fn print_summary(consumed: &Consumed, stats: &FinalStats, path: &Path) {
    eprintln!(
        "utrace: {} records from {} threads, {} dropped -> {}",
        consumed.records,
        consumed.threads.len(),
        stats.records_dropped,
        path.display()
    );
    if stats.read_errors > 0 {
        eprintln!(
            "utrace: warning: {} buffer reads failed (records lost)",
            stats.read_errors
        );
    }
    if stats.table_full > 0 {
        eprintln!(
            "utrace: warning: a process has more than {TABLE_BINARIES} instrumented binaries; \
             records left in the extra ones at thread exit are lost"
        );
    }
}

fn check_ring_bytes(n: u32) -> Result<()> {
    let page = 4096;
    if n < page || !n.is_power_of_two() {
        bail!(
            "--ring-bytes {n}: must be a power of two and at least {page} (default {DEFAULT_RING_BYTES})"
        );
    }
    Ok(())
}

/// The `OPERANDS` entries: the operand sets of the binaries' uprobe sites of kind
/// memory and USDT (what the `site` program computes their records from).
fn operand_sets(list: &[&Instrumented], first_ordinal: u32) -> Vec<(u64, OperandSet)> {
    let mut out = Vec::new();
    for (i, b) in list.iter().enumerate() {
        let ordinal = first_ordinal as usize + i;
        for so in &b.meta.operands {
            let wanted = b.meta.sites.get(so.site as usize).is_some_and(|s| {
                s.id == so.site
                    && s.mode == SiteMode::Uprobe
                    && matches!(s.kind, SiteKind::Memory | SiteKind::Usdt)
            });
            if wanted {
                out.push((operand_key(ordinal as u32, so.site), so.set));
            }
        }
    }
    out
}

/// Load the eBPF object with this machine's globals; `OPERANDS` gets room for
/// `operand_sets` entries (at least one: a map cannot be empty).
fn load(ring_bytes: u32, write_user: bool, system_wide: bool, operand_sets: usize) -> Result<Ebpf> {
    let operand_entries = u32::try_from(operand_sets.max(1))
        .context("too many uprobe sites with operands for one session")?;
    let tp_offset =
        btf::thread_pointer_offset().context("cannot find the thread pointer in task_struct")?;
    let fork_child = kernel::tracepoint_field_offset("sched", "sched_process_fork", "child_pid")?
        .context("sched_process_fork has no child_pid field")?;
    let group_dead =
        kernel::tracepoint_field_offset("sched", "sched_process_exit", "group_dead")?.unwrap_or(0);
    log::debug!(
        "task_struct thread pointer at {tp_offset}, fork child_pid at {fork_child}, exit group_dead at {group_dead}"
    );
    EbpfLoader::new()
        .override_global(GLOBAL_TP_OFFSET, &tp_offset, true)
        .override_global(GLOBAL_SYSTEM_WIDE, &u8::from(system_wide), true)
        .override_global(GLOBAL_WRITE_USER, &u8::from(write_user), true)
        .override_global(GLOBAL_FORK_CHILD_PID_OFF, &fork_child, true)
        .override_global(GLOBAL_EXIT_GROUP_DEAD_OFF, &group_dead, true)
        .map_max_entries(MAP_EVENTS, ring_bytes)
        .map_max_entries(MAP_OPERANDS, operand_entries)
        .load(EBPF_OBJECT)
        .context("cannot load the eBPF object")
}

/// Detach (unload) all programs; best effort, errors only logged.
fn detach(ebpf: &mut Ebpf) {
    for name in [PROG_FLUSH, PROG_FLUSH_SLEEPABLE, PROG_SITE] {
        if let Some(Ok(p)) = ebpf.program_mut(name).map(<&mut UProbe>::try_from)
            && p.fd().is_ok()
            && let Err(e) = p.unload()
        {
            log::warn!("cannot detach {name}: {e}");
        }
    }
    // One program may sit on several tracepoints: unload each once.
    let mut names: Vec<&str> = TRACEPOINTS.iter().map(|t| t.0).collect();
    names.dedup();
    names.push(PROG_EXIT_STEP);
    for name in names {
        if let Some(Ok(p)) = ebpf.program_mut(name).map(<&mut TracePoint>::try_from)
            && p.fd().is_ok()
            && let Err(e) = p.unload()
        {
            log::warn!("cannot detach {name}: {e}");
        }
    }
}

fn final_stats(
    ebpf: &Ebpf,
    consumed: &Consumed,
    clock_end: clock::Anchor,
    exit_code: Option<i32>,
) -> Result<FinalStats> {
    let stats: PerCpuArray<_, u64> = PerCpuArray::try_from(
        ebpf.map(MAP_STATS)
            .with_context(|| format!("no {MAP_STATS} map"))?,
    )?;
    let mut sums = [0u64; STAT_COUNT as usize];
    for (i, sum) in sums.iter_mut().enumerate() {
        *sum = stats.get(&(i as u32), 0)?.iter().sum();
    }
    let seq: Array<_, u64> = Array::try_from(
        ebpf.map(MAP_SEQ)
            .with_context(|| format!("no {MAP_SEQ} map"))?,
    )?;
    let stat = |i: u32| sums[i as usize];
    // Drops per CPU: where a flood overran the ring buffer.
    let dropped_per_cpu: Vec<u64> = stats
        .get(&STAT_RECORDS_DROPPED, 0)?
        .iter()
        .copied()
        .collect();
    Ok(FinalStats {
        records_produced: stat(STAT_RECORDS_PRODUCED),
        records_filtered: stat(STAT_RECORDS_FILTERED),
        dropped_per_cpu,
        filter: String::new(),
        filter_changes: 0,
        binaries_added: 0,
        records_delivered: stat(STAT_RECORDS_DELIVERED),
        records_dropped: stat(STAT_RECORDS_DROPPED),
        chunks: stat(STAT_CHUNKS),
        read_errors: stat(STAT_READ_ERRORS),
        records_skipped: stat(STAT_RECORDS_SKIPPED),
        table_full: stat(STAT_TABLE_FULL),
        seq_issued: seq.get(&0, 0)?,
        records_received: consumed.records,
        chunks_received: consumed.chunks,
        bad_entries: consumed.bad_entries,
        threads: consumed.threads.len() as u64,
        clock_end: Some(clock_end),
        exit_code,
    })
}

/// `-o` default.
pub fn default_output() -> &'static Path {
    Path::new("trace.utrace")
}
