//! A recording session: load and attach the eBPF programs for the instrumented
//! binaries, run or attach to the traced process, consume until it is gone, write the
//! trace file.

use std::{
    ffi::OsString,
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{
        TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use aya_log::EbpfLogger;
use tracer_common::{
    RECORD_VERSION, RW_MAGIC, STAT_CHUNKS, STAT_COUNT, STAT_READ_ERRORS, STAT_RECORDS_DELIVERED,
    STAT_RECORDS_DROPPED, STAT_RECORDS_SKIPPED,
    ebpf::{
        DEFAULT_RING_BYTES, GLOBAL_EXIT_GROUP_DEAD_OFF, GLOBAL_FORK_CHILD_PID_OFF,
        GLOBAL_SYSTEM_WIDE, GLOBAL_TP_OFFSET, GLOBAL_WRITE_USER, MAP_BINARIES, MAP_EVENTS,
        MAP_OPERANDS, MAP_SEQ, MAP_STATS, MAP_TABLES, MAP_TARGETS, MAX_BINARIES, PROG_FLUSH,
        PROG_FORK, PROG_GROUP_EXIT, PROG_KILLED, PROG_SITE, PROG_TASK_EXIT, PROG_THREAD_EXIT,
        SEL_BLOCK, SEL_CALL, SEL_ENTRY, SEL_EXIT, SEL_MEMORY, SEL_USDT, STAT_TABLE_FULL,
        TABLE_BINARIES, operand_key, site_cookie,
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
    binaries::{self, Instrumented},
    btf, clock,
    consumer::{Consumed, Pipeline},
    kernel,
    process::{self, GatedChild, WaitEnd},
    tracefile::{BinaryInfo, FinalStats, SessionInfo, Writer},
};

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

const TRACEPOINTS: [(&str, &str, &str); 7] = [
    (PROG_THREAD_EXIT, "syscalls", "sys_enter_exit"),
    (PROG_GROUP_EXIT, "syscalls", "sys_enter_exit_group"),
    // exec replaces the image the buffers live in: the thread calling it drains them
    // first (its other threads are killed: `killed`).
    (PROG_GROUP_EXIT, "syscalls", "sys_enter_execve"),
    (PROG_GROUP_EXIT, "syscalls", "sys_enter_execveat"),
    (PROG_KILLED, "signal", "signal_deliver"),
    (PROG_TASK_EXIT, "sched", "sched_process_exit"),
    (PROG_FORK, "sched", "sched_process_fork"),
];

pub enum Target {
    /// Run a command (argv[0] is resolved through PATH).
    Exec(Vec<OsString>),
    /// Attach to a running process until it exits, Ctrl-C, or the duration passes.
    Attach {
        pid: u32,
        duration: Option<Duration>,
    },
}

pub struct RecordOptions {
    pub output: PathBuf,
    pub ring_bytes: u32,
    pub target: Target,
    /// `--binary`: instrumented binaries to trace besides those found from the target
    /// (e.g. the program run by an uninstrumented loader such as qemu-user).
    pub binaries: Vec<PathBuf>,
}

/// An instrumented binary to trace and, when attaching, its load bias in the process.
pub type Traced = (Instrumented, Option<u64>);

/// Record a trace; returns the exit code for the tracer (the command's, when it ran one).
pub fn record(opts: RecordOptions) -> Result<i32> {
    check_ring_bytes(opts.ring_bytes)?;
    kernel::ensure_tracefs()?;
    kernel::raise_memlock();

    let (binaries, exe) = discover(&opts.target, &opts.binaries)?;
    let list: Vec<&Instrumented> = binaries.iter().map(|(b, _)| b).collect();
    let (mut ebpf, write_user) = load_and_attach(opts.ring_bytes, &list)?;
    // Kept until the session ends: USDT probes guarded by a semaphore fire meanwhile.
    let mut raised = crate::semaphores::Raised::default();
    for b in &list {
        raised.raise(&b.path, &b.meta.semaphores)?;
    }
    if raised.len() > 0 {
        log::info!("{} USDT semaphore(s) raised", raised.len());
    }
    let logger = match EbpfLogger::init(&mut ebpf) {
        Ok(l) => Some(l),
        Err(e) => {
            log::warn!("no eBPF log output: {e}");
            None
        }
    };
    let ring = RingBuf::try_from(
        ebpf.take_map(MAP_EVENTS)
            .with_context(|| format!("no {MAP_EVENTS} map"))?,
    )?;

    let mut session = SessionInfo {
        command: Vec::new(),
        pids: Vec::new(),
        mode: String::new(),
        arch: std::env::consts::ARCH.into(),
        record_version: RECORD_VERSION,
        ring_bytes: opts.ring_bytes,
        write_user,
        clock: clock::calibrate(Duration::from_millis(20)),
        start_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let infos = binary_infos(&binaries);
    let start_writer = |session: &SessionInfo| -> Result<Writer> {
        let mut w = Writer::create(&opts.output)?;
        w.write_session(session)?;
        for b in &infos {
            w.write_binary(b)?;
        }
        Ok(w)
    };

    let (exit_code, pipeline) = match (&opts.target, exe) {
        (Target::Exec(argv), Some(exe)) => {
            // Dropped before release (any error below), the child exits unexecuted.
            let mut child = GatedChild::spawn(&exe, argv)?;
            add_target(&mut ebpf, child.pid)?;
            session.mode = "exec".into();
            session.pids = vec![child.pid];
            session.command = argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let pipeline = Pipeline::start(ring, logger, start_writer(&session)?)?;
            process::ignore_terminal_signals();
            if let Err(e) = child.release() {
                let _ = process::wait_child(child.pid);
                let _ = pipeline.finish();
                return Err(e.context(exe.display().to_string()));
            }
            (Some(process::wait_child(child.pid)?), pipeline)
        }
        (Target::Attach { pid, duration }, _) => {
            add_target(&mut ebpf, *pid)?;
            seed_tables(&mut ebpf, *pid, &binaries)?;
            session.mode = "attach".into();
            session.pids = vec![*pid];
            session.command = process::cmdline(*pid);
            process::catch_stop_signals();
            let pipeline = Pipeline::start(ring, logger, start_writer(&session)?)?;
            match process::wait_process(*pid, *duration)? {
                WaitEnd::Exited => log::info!("process {pid} exited"),
                WaitEnd::Interrupted => log::info!("interrupted; detaching from {pid}"),
                WaitEnd::Timeout => log::info!("duration over; detaching from {pid}"),
            }
            (None, pipeline)
        }
        (Target::Exec(_), None) => bail!("no executable to run"),
    };

    // Nothing new after this point, so the last drain of the ring buffer is complete
    // and the kernel counters match the file.
    detach(&mut ebpf);
    let (consumed, writer) = pipeline.finish()?;
    let stats = final_stats(&ebpf, &consumed, clock::anchor(), exit_code)?;
    let path = writer.finish(&stats)?;
    print_summary(&consumed, &stats, &path);
    Ok(exit_code.unwrap_or(0))
}

/// What the trace file says about each traced binary (ordinal = position).
pub fn binary_infos(binaries: &[Traced]) -> Vec<BinaryInfo> {
    binaries
        .iter()
        .enumerate()
        .map(|(i, (b, _))| BinaryInfo {
            ordinal: i as u32,
            binary_id: b.meta.binary_id,
            path: b.path.to_string_lossy().into_owned(),
            note: b.note.clone(),
        })
        .collect()
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
            let exe = process::resolve_command(cmd)?;
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
    };
    if binaries.is_empty() {
        let what = match (target, &exe) {
            (Target::Attach { pid, .. }, _) => format!("the files mapped by process {pid}"),
            (_, Some(exe)) => format!("{} and the shared libraries it links", exe.display()),
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

/// Load and attach everything; returns whether the programs may write user memory.
/// They do when the kernel allows bpf_probe_write_user (the design's way: slots are
/// reset and released in place); a kernel in lockdown does not, then the programs keep
/// delivery positions in a map instead.
fn load_and_attach(ring_bytes: u32, list: &[&Instrumented]) -> Result<(Ebpf, bool)> {
    let write_user = kernel::probe_write_user_allowed();
    if !write_user {
        log::info!(
            "the kernel refuses bpf_probe_write_user (lockdown?): slots are not reset or released in place"
        );
    }
    let sets = operand_sets(list);
    let mut ebpf = load(ring_bytes, write_user, sets.len())?;
    attach(&mut ebpf, list, &sets)?;
    Ok((ebpf, write_user))
}

/// The `OPERANDS` entries: the operand sets of the binaries' uprobe sites of kind
/// memory and USDT (what the `site` program computes their records from).
fn operand_sets(list: &[&Instrumented]) -> Vec<(u64, OperandSet)> {
    let mut out = Vec::new();
    for (ordinal, b) in list.iter().enumerate() {
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
fn load(ring_bytes: u32, write_user: bool, operand_sets: usize) -> Result<Ebpf> {
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
        .override_global(GLOBAL_SYSTEM_WIDE, &0u8, true)
        .override_global(GLOBAL_WRITE_USER, &u8::from(write_user), true)
        .override_global(GLOBAL_FORK_CHILD_PID_OFF, &fork_child, true)
        .override_global(GLOBAL_EXIT_GROUP_DEAD_OFF, &group_dead, true)
        .map_max_entries(MAP_EVENTS, ring_bytes)
        .map_max_entries(MAP_OPERANDS, operand_entries)
        .load(EBPF_OBJECT)
        .context("cannot load the eBPF object")
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    let p: &mut UProbe = ebpf
        .program_mut(name)
        .with_context(|| format!("no program {name} in the eBPF object"))?
        .try_into()?;
    p.load()
        .with_context(|| format!("the kernel rejected program {name}"))?;
    Ok(p)
}

/// Attach every program; record the binaries' ids for the uprobe-site cookies and the
/// operand sets of their sites (before the sites are attached, so that their first
/// hits find them).
fn attach(ebpf: &mut Ebpf, list: &[&Instrumented], sets: &[(u64, OperandSet)]) -> Result<()> {
    {
        let mut ids: Array<_, u64> = Array::try_from(
            ebpf.map_mut(MAP_BINARIES)
                .with_context(|| format!("no {MAP_BINARIES} map"))?,
        )?;
        for (i, b) in list.iter().enumerate() {
            ids.set(i as u32, b.meta.binary_id, 0)?;
        }
    }
    {
        let mut map: HashMap<_, u64, OperandSet> = HashMap::try_from(
            ebpf.map_mut(MAP_OPERANDS)
                .with_context(|| format!("no {MAP_OPERANDS} map"))?,
        )?;
        for (key, set) in sets {
            map.insert(key, set, 0)
                .with_context(|| format!("cannot fill {MAP_OPERANDS}"))?;
        }
    }
    let flush = uprobe(ebpf, PROG_FLUSH)?;
    for b in list {
        flush
            .attach(b.meta.flush_file_off, &b.path, UProbeScope::AllProcesses)
            .with_context(|| {
                format!(
                    "cannot attach the flush uprobe to {} at file offset {:#x}",
                    b.path.display(),
                    b.meta.flush_file_off
                )
            })?;
    }
    let site = uprobe(ebpf, PROG_SITE)?;
    for (ordinal, b) in list.iter().enumerate() {
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
                cookie: Some(site_cookie(ordinal as u32, site_selector(s.kind), s.id)),
            };
            site.attach(point, &b.path, UProbeScope::AllProcesses)
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
    }
    for (name, category, event) in TRACEPOINTS {
        let tp: &mut TracePoint = ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name} in the eBPF object"))?
            .try_into()?;
        if tp.fd().is_err() {
            tp.load()
                .with_context(|| format!("the kernel rejected program {name}"))?;
        }
        tp.attach(category, event)
            .with_context(|| format!("cannot attach {name} to {category}:{event}"))?;
    }
    Ok(())
}

/// Detach (unload) all programs; best effort, errors only logged.
fn detach(ebpf: &mut Ebpf) {
    for name in [PROG_FLUSH, PROG_SITE] {
        if let Some(Ok(p)) = ebpf.program_mut(name).map(<&mut UProbe>::try_from)
            && let Err(e) = p.unload()
        {
            log::warn!("cannot detach {name}: {e}");
        }
    }
    // One program may sit on several tracepoints: unload each once.
    let mut names: Vec<&str> = TRACEPOINTS.iter().map(|t| t.0).collect();
    names.dedup();
    for name in names {
        if let Some(Ok(p)) = ebpf.program_mut(name).map(<&mut TracePoint>::try_from)
            && let Err(e) = p.unload()
        {
            log::warn!("cannot detach {name}: {e}");
        }
    }
}

fn add_target(ebpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut targets: HashMap<_, u32, u8> = HashMap::try_from(
        ebpf.map_mut(MAP_TARGETS)
            .with_context(|| format!("no {MAP_TARGETS} map"))?,
    )?;
    targets
        .insert(pid, 1, 0)
        .with_context(|| format!("cannot add pid {pid} to {MAP_TARGETS}"))
}

/// For a process that was running before the session: tell eBPF where its RW areas
/// are, so threads that registered long ago are drained at exit too.
fn seed_tables(ebpf: &mut Ebpf, pid: u32, binaries: &[Traced]) -> Result<()> {
    let mem_path = format!("/proc/{pid}/mem");
    let mem = File::open(&mem_path).with_context(|| format!("cannot open {mem_path}"))?;
    let mut table = [0u64; TABLE_BINARIES];
    let mut n = 0;
    for (b, bias) in binaries {
        let Some(bias) = bias else { continue };
        let rw_base = bias.wrapping_add(b.meta.rw_vaddr);
        let mut magic = [0u8; 8];
        match mem.read_exact_at(&mut magic, rw_base) {
            Ok(()) if u64::from_le_bytes(magic) == RW_MAGIC => {}
            _ => {
                log::warn!(
                    "{}: no RW area at {rw_base:#x} in process {pid}; its threads are learned at their next flush",
                    b.path.display()
                );
                continue;
            }
        }
        if n < TABLE_BINARIES {
            table[n] = rw_base;
            n += 1;
        }
    }
    if n > 0 {
        let mut tables: HashMap<_, u32, [u64; TABLE_BINARIES]> = HashMap::try_from(
            ebpf.map_mut(MAP_TABLES)
                .with_context(|| format!("no {MAP_TABLES} map"))?,
        )?;
        tables
            .insert(pid, table, 0)
            .with_context(|| format!("cannot add pid {pid} to {MAP_TABLES}"))?;
    }
    Ok(())
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
    Ok(FinalStats {
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
