//! Loading the eBPF object (this machine's globals, room for operand sets) and
//! attaching it: the flush and site uprobes of each traced binary, its semaphores, the
//! tracepoints; detaching at the end.
//!
//! Which file is which binary: files are told apart by `(st_dev, st_ino)`. Two copies of one
//! binary (same binary_id and note) at different inodes are both traced, under one ordinal;
//! a file with a traced binary_id but another note is refused (its records could not be
//! told apart: chunks carry the binary_id), so whichever file claims an id first keeps it: a
//! hostile file claiming a victim's id before the victim's file is seen leaves the victim's
//! untraced (a warning, counted), never misnamed (`trust_files::a_file_with_a_victims_binary_id_is_not_taken_for_it`).
//! The programs of a refused binary are told to go on untraced (up to 128 refused files are
//! held open for that; past them a refused file is forgotten and its later programs wait
//! out their 10 s). Uprobes are attached in descending site id (`tracer-ebpf/src/programs/site.rs`);
//! a site uprobe the kernel refuses costs that site (a warning), not the binary.
//! `preload` verifies the three slow programs (`flush_s`, `site`, `exit_step`, 0.2–0.3 s
//! each on Linux 6.18) in parallel threads.

use std::{collections::HashSet, time::Instant};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, ProgramArray},
    programs::{
        Program, ProgramError, TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use tracer_common::{
    ebpf::{
        GLOBAL_EXIT_GROUP_DEAD_OFF, GLOBAL_FORK_CHILD_PID_OFF, GLOBAL_ON_FULL, GLOBAL_SMALL_CHUNKS,
        GLOBAL_SYSTEM_WIDE, GLOBAL_TP_OFFSET, GLOBAL_WRITE_USER, MAP_BINARIES, MAP_CALL_SITES,
        MAP_CALL_STACKS, MAP_EVENTS, MAP_EXIT_STEPS, MAP_OPERANDS, MAP_STRING_SITES, MAP_TARGETS,
        MAX_BINARIES, MAX_CALL_STACKS, PROG_EXEC, PROG_EXIT_STEP, PROG_FLUSH, PROG_FLUSH_SLEEPABLE,
        PROG_FORK, PROG_GROUP_EXIT, PROG_KILLED, PROG_MMAP, PROG_SITE, PROG_TASK_EXIT,
        PROG_THREAD_EXIT, SEL_BLOCK, SEL_CALL, SEL_ENTRY, SEL_EXIT, SEL_MEMORY, SEL_USDT,
        SMALL_RING_BYTES, SPARE_CALL_SITES, STRING_SITES_ANY, operand_key, site_cookie,
    },
    meta::{SiteKind, SiteMode},
    operand::OperandSet,
};

use crate::{
    probes,
    record::{
        drain::consumer::Pipeline,
        host::{btf, kernel},
    },
    tracefile::encode_binary,
};

use super::{
    binaries::{FileId, Instrumented},
    discover::{Traced, binary_info},
    filters::Filters,
    semaphores::Raised,
    shares::{BinaryRefusal, Shares},
    target::OnFull,
};

/// The loaded eBPF object and what the session traces.
pub(super) struct Live {
    pub(super) ebpf: Ebpf,
    pub(super) write_user: bool,
    /// `--on-full wait`.
    pub(super) wait: bool,
    /// The flush program in use (sleepable or not).
    pub(super) flush: &'static str,
    /// Ordinal = index.
    pub(super) binaries: Vec<Instrumented>,
    pub(super) raised: Raised,
    pub(super) filters: Filters,
    pub(super) filter_changes: u64,
    /// (pid, rw_base) already in `TABLES`.
    pub(super) seeded: HashSet<(u32, u64)>,
    /// (pid, binary id, bias) written to the trace file.
    pub(super) loads: HashSet<(u32, u64, u64)>,
    /// Every traced file (`(st_dev, st_ino)`) and its ordinal: a binary is a file, not
    /// a binary_id.
    pub(super) files: std::collections::HashMap<FileId, u32>,
    /// Copies of traced binaries (same binary_id and note, another file), held open
    /// with their uprobes.
    pub(super) copies: Vec<Instrumented>,
    /// Per-uid shares of a system-wide session, and what was refused.
    pub(super) shares: Shares,
    /// Every process runs the programs, not only `TARGETS`.
    pub(super) system_wide: bool,
}

/// How a binary joins the session.
enum Admit {
    /// This very file is traced already, as this ordinal.
    Known(u32),
    /// Another file with the same binary_id and note: its uprobes under that ordinal.
    Copy(u32),
    New,
}

/// Which registers the eBPF `site` program records for a uprobe site of this kind.
fn site_selector(kind: SiteKind) -> u8 {
    match kind {
        SiteKind::FunctionEntry => SEL_ENTRY,
        SiteKind::FunctionExit => SEL_EXIT,
        // The pad's (or the call's) address, like a block.
        SiteKind::Block | SiteKind::Landing | SiteKind::Resume => SEL_BLOCK,
        SiteKind::Memory => SEL_MEMORY,
        SiteKind::Usdt => SEL_USDT,
        SiteKind::Call => SEL_CALL,
    }
}

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

/// Room in `OPERANDS` for the uprobe sites of binaries that join a running session (a
/// static executable with every site kind has thousands: difftest's csmith programs
/// with libc, 6,807 memory sites alone, were not traced at all with 4,096).
pub(super) const SPARE_OPERAND_SETS: usize = 1 << 20;

impl Live {
    /// Load the object and its programs (attached per binary by `add_binary`).
    pub(super) fn load(
        ring_bytes: u32,
        on_full: OnFull,
        system_wide: bool,
        initial: &[Traced],
        durations: bool,
    ) -> Result<Self> {
        let write_user = kernel::probe_write_user_allowed();
        if !write_user {
            log::info!(
                "the kernel refuses bpf_probe_write_user (lockdown?): slots are not reset or released in place"
            );
        }
        let sets: usize = initial
            .iter()
            .map(|t| operand_sets(&[&t.binary], 0).len())
            .sum::<usize>()
            + SPARE_OPERAND_SETS;
        // The duration filter's maps are sized only for a session that asks for it.
        let call_sites = durations.then(|| {
            initial
                .iter()
                .map(|t| tracer_common::duration::call_sites(&t.binary.meta).len() as u32)
                .sum::<u32>()
                .saturating_add(SPARE_CALL_SITES)
        });
        let globals = Globals {
            ring_bytes,
            write_user,
            wait: on_full == OnFull::Wait,
            system_wide,
            call_sites,
        };
        let mut ebpf = load(&globals, sets)?;
        // The sleepable flush where the kernel has sleepable uprobes, else the plain one.
        let sleepable = match preload(&mut ebpf).remove(PROG_FLUSH_SLEEPABLE) {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                log::info!("no sleepable flush program ({e}); using the plain one");
                false
            }
            None => bail!("no program {PROG_FLUSH_SLEEPABLE}"),
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
                verified(name, || p.load())?;
            }
        }
        let filters = Filters::take(&mut ebpf, durations)?;
        Ok(Live {
            ebpf,
            write_user,
            wait: globals.wait,
            flush,
            binaries: Vec::new(),
            raised: Raised::default(),
            filters,
            filter_changes: 0,
            seeded: HashSet::new(),
            loads: HashSet::new(),
            files: std::collections::HashMap::new(),
            copies: Vec::new(),
            shares: Shares::new(system_wide),
            system_wide,
        })
    }
}

impl Live {
    /// Trace binary `b`: its id for the uprobe-site cookies, the operand sets of its
    /// sites (before they are attached, so that their first hits find them), the flush
    /// and site uprobes, its USDT semaphores, its sites under the filter. With a
    /// pipeline (a binary joining a running session) its section goes into the file
    /// first. Returns its ordinal. Binaries are told apart by file (`(st_dev,
    /// st_ino)`): a file already traced keeps its ordinal; a copy (another file with the
    /// same binary_id and the same note) gets uprobes under the same ordinal; another
    /// file with that binary_id but other contents is refused ([`BinaryRefusal`]: its
    /// records could not be told from the first one's), as are binaries past the
    /// session's or their owner's share.
    pub(super) fn add_binary(
        &mut self,
        b: Instrumented,
        pipeline: Option<&Pipeline>,
    ) -> Result<u32> {
        let admit = match self.admit(&b) {
            Ok(a) => a,
            Err(why) => {
                if self.shares.refuse_binary(b.file.id, b.meta.binary_id, why) {
                    log::warn!(
                        "{} (uid {}): not traced: {why}",
                        b.path.display(),
                        b.file.uid
                    );
                }
                return Err(why.into());
            }
        };
        let ordinal = match admit {
            Admit::Known(ordinal) => return Ok(ordinal),
            Admit::Copy(ordinal) => {
                // Charged once attached: a copy that could not be is not its owner's.
                self.attach_file(ordinal, &b)?;
                self.shares.charge_binary(b.file.uid);
                log::info!(
                    "tracing {} as a copy of {} (binary_id {:#x})",
                    b.path.display(),
                    self.binaries[ordinal as usize].path.display(),
                    b.meta.binary_id
                );
                self.copies.push(b.clone());
                ordinal
            }
            Admit::New => {
                let ordinal = self.binaries.len() as u32;
                self.fill_binary_maps(ordinal, &b)?;
                if let Some(p) = pipeline {
                    let info = binary_info(ordinal, &b);
                    p.write_sections(encode_binary(&info))?;
                }
                // The ordinal is taken from here on, even if an attach below fails:
                // uprobes already attached carry it in their cookies. The filter first,
                // so that its first drains are judged by the filter in force.
                self.filters.add_binary(&b)?;
                self.binaries.push(b.clone());
                self.files.insert(b.file.id, ordinal);
                self.shares.charge_binary(b.file.uid);
                self.attach_file(ordinal, &b)?;
                if pipeline.is_some() {
                    log::info!(
                        "tracing {} (binary_id {:#x}) from now on",
                        b.path.display(),
                        b.meta.binary_id
                    );
                }
                ordinal
            }
        };
        self.files.insert(b.file.id, ordinal);
        Ok(ordinal)
    }

    /// Whether `b` may be traced, and how.
    fn admit(&self, b: &Instrumented) -> Result<Admit, BinaryRefusal> {
        if let Some(&ordinal) = self.files.get(&b.file.id) {
            return Ok(Admit::Known(ordinal));
        }
        let same_id = self
            .binaries
            .iter()
            .position(|o| o.meta.binary_id == b.meta.binary_id);
        let admit = match same_id {
            // Copies hold files and uprobes too: as many as binaries at most.
            Some(_) if self.copies.len() >= MAX_BINARIES as usize => {
                return Err(BinaryRefusal::TooManyCopies);
            }
            Some(i) if self.binaries[i].note == b.note => Admit::Copy(i as u32),
            Some(_) => {
                return Err(BinaryRefusal::SameIdOtherContents {
                    id: b.meta.binary_id,
                });
            }
            None if self.binaries.len() >= MAX_BINARIES as usize => {
                return Err(BinaryRefusal::SessionFull);
            }
            None => Admit::New,
        };
        self.shares.may_add_binary(b.file.uid)?;
        Ok(admit)
    }

    /// The uprobes and semaphores of file `b`, traced as `ordinal`; kept until the
    /// session ends (USDT probes guarded by a semaphore fire meanwhile).
    fn attach_file(&mut self, ordinal: u32, b: &Instrumented) -> Result<()> {
        self.attach_uprobes(ordinal, b)?;
        if b.untouched {
            self.raised.raise(&b.file, &untouched_semaphores(b))
        } else {
            self.raised.raise(&b.file, &b.meta.semaphores)
        }
    }

    /// `b`'s id at `ordinal` in `BINARIES` and its operand sets in `OPERANDS`.
    fn fill_binary_maps(&mut self, ordinal: u32, b: &Instrumented) -> Result<()> {
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
            for (key, set) in operand_sets(&[b], ordinal) {
                map.insert(key, set, 0)
                    .with_context(|| format!("cannot fill {MAP_OPERANDS}"))?;
            }
        }
        let strings = string_sites(b);
        if !strings.is_empty() {
            let mut map: HashMap<_, [u64; 2], u64> = HashMap::try_from(
                self.ebpf
                    .map_mut(MAP_STRING_SITES)
                    .with_context(|| format!("no {MAP_STRING_SITES} map"))?,
            )?;
            for (key, mask) in strings {
                map.insert(key, mask, 0)
                    .with_context(|| format!("cannot fill {MAP_STRING_SITES}"))?;
            }
        }
        Ok(())
    }

    /// The flush uprobe (an instrumented binary) and the uprobes of `b`'s uprobe sites.
    fn attach_uprobes(&mut self, ordinal: u32, b: &Instrumented) -> Result<()> {
        // The held file itself (`/proc/self/fd/N`), never its path again.
        let path = b.attach_path();
        if !b.untouched {
            let flush: &mut UProbe = self
                .ebpf
                .program_mut(self.flush)
                .with_context(|| format!("no program {}", self.flush))?
                .try_into()?;
            flush
                .attach(b.meta.flush_file_off, &path, UProbeScope::AllProcesses)
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
        // One site the kernel refuses (say, an instruction with a segment prefix)
        // costs that site, not the binary: with a process already running the refusal
        // is an error here, before it is silently skipped at map time.
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
            if let Err(e) = site.attach(point, &path, UProbeScope::AllProcesses) {
                log::warn!(
                    "{} site {} ({}) at file offset {:#x}: no uprobe: {:#}",
                    b.path.display(),
                    s.id,
                    s.name,
                    s.file_off,
                    anyhow::Error::new(e)
                );
            }
        }
        Ok(())
    }

    pub(super) fn attach_tracepoints(&mut self) -> Result<()> {
        // The exit programs tail-call exit_step: installed before they are attached.
        {
            let step: &mut TracePoint = self
                .ebpf
                .program_mut(PROG_EXIT_STEP)
                .with_context(|| format!("no program {PROG_EXIT_STEP} in the eBPF object"))?
                .try_into()?;
            if step.fd().is_err() {
                verified(PROG_EXIT_STEP, || step.load())?;
            }
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
                verified(name, || tp.load())?;
            }
            tp.attach(category, event)
                .with_context(|| format!("cannot attach {name} to {category}:{event}"))?;
        }
        Ok(())
    }

    pub(super) fn add_target(&mut self, pid: u32) -> Result<()> {
        let mut targets: HashMap<_, u32, u8> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_TARGETS)
                .with_context(|| format!("no {MAP_TARGETS} map"))?,
        )?;
        targets
            .insert(pid, 1, 0)
            .with_context(|| format!("cannot add pid {pid} to {MAP_TARGETS}"))
    }
}

/// The `STRING_SITES` entries of `b`: its inline USDT sites with string arguments
/// (`probes::known`), and the binary's marker; none if it has no such site.
fn string_sites(b: &Instrumented) -> Vec<([u64; 2], u64)> {
    let id = b.meta.binary_id;
    let mut v: Vec<([u64; 2], u64)> = b
        .meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::Usdt && s.mode == SiteMode::Inline)
        .filter_map(|s| Some(([id, u64::from(s.id)], probes::known(&s.name)?.strings)))
        .filter(|&(_, mask)| mask != 0)
        .collect();
    if !v.is_empty() {
        v.push(([id, STRING_SITES_ANY], 1));
    }
    v
}

/// The `OPERANDS` entries: the operand sets of the binaries' uprobe sites of kind
/// memory and USDT (what the `site` program computes their records from).
pub(super) fn operand_sets(list: &[&Instrumented], first_ordinal: u32) -> Vec<(u64, OperandSet)> {
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

/// The session's settings the eBPF object is loaded with.
pub(super) struct Globals {
    pub ring_bytes: u32,
    pub write_user: bool,
    /// `--on-full wait`.
    pub wait: bool,
    pub system_wide: bool,
    /// `--min-duration`: room for this many call sites (and `MAX_CALL_STACKS` stacks).
    pub call_sites: Option<u32>,
}

/// Load the eBPF object with this machine's globals; `OPERANDS` gets room for
/// `operand_sets` entries (at least one: a map cannot be empty).
pub(super) fn load(g: &Globals, operand_sets: usize) -> Result<Ebpf> {
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
        .override_global(GLOBAL_SYSTEM_WIDE, &u8::from(g.system_wide), true)
        .override_global(GLOBAL_WRITE_USER, &u8::from(g.write_user), true)
        .override_global(GLOBAL_ON_FULL, &u8::from(g.wait), true)
        .override_global(
            GLOBAL_SMALL_CHUNKS,
            &u8::from(g.ring_bytes < SMALL_RING_BYTES),
            true,
        )
        .override_global(GLOBAL_FORK_CHILD_PID_OFF, &fork_child, true)
        .override_global(GLOBAL_EXIT_GROUP_DEAD_OFF, &group_dead, true)
        .map_max_entries(MAP_EVENTS, g.ring_bytes)
        .map_max_entries(MAP_OPERANDS, operand_entries)
        .map_max_entries(MAP_CALL_SITES, g.call_sites.unwrap_or(1))
        .map_max_entries(
            MAP_CALL_STACKS,
            if g.call_sites.is_some() {
                MAX_CALL_STACKS
            } else {
                1
            },
        )
        .load(EBPF_OBJECT)
        .context("cannot load the eBPF object")
}

/// Detach (unload) all programs; best effort, errors only logged.
pub(super) fn detach(ebpf: &mut Ebpf) {
    unload(ebpf, &[PROG_FLUSH, PROG_FLUSH_SLEEPABLE, PROG_SITE]);
    // One program may sit on several tracepoints: unload each once.
    let mut names: Vec<&str> = TRACEPOINTS.iter().map(|t| t.0).collect();
    names.dedup();
    names.push(PROG_EXIT_STEP);
    unload(ebpf, &names);
}

/// Unload (detach) the loaded programs among `names`; errors only logged.
pub(super) fn unload(ebpf: &mut Ebpf, names: &[&str]) {
    // A thread each: every detach waits for its own RCU grace period, and waited for
    // one after another they were most of a session's end (flush_s, thread_exit and
    // task_exit: 0.26 s).
    let progs: Vec<(&str, &mut Program)> = ebpf
        .programs_mut()
        .filter(|(name, _)| names.contains(name))
        .collect();
    let n = progs.len();
    let queue = std::sync::Mutex::new(progs);
    let work = || {
        while let Some((name, p)) = queue.lock().ok().and_then(|mut q| q.pop()) {
            detach_one(name, p);
        }
    };
    std::thread::scope(|s| {
        // Where no thread can be started, this one detaches what is left.
        for _ in 1..n {
            if std::thread::Builder::new().spawn_scoped(s, work).is_err() {
                break;
            }
        }
        work();
    });
}

/// Unload one program, saying how long its grace period took; errors only logged.
fn detach_one(name: &str, p: &mut Program) {
    let t = Instant::now();
    let r = match p {
        Program::UProbe(p) if p.fd().is_ok() => p.unload(),
        Program::TracePoint(p) if p.fd().is_ok() => p.unload(),
        _ => Ok(()),
    };
    if let Err(e) = r {
        log::warn!("cannot detach {name}: {e}");
    }
    log::debug!("{name} detached in {:?}", t.elapsed());
}

/// The semaphores of an untouched binary, each with an anchor for its
/// reference-counting uprobe.
fn untouched_semaphores(b: &Instrumented) -> Vec<tracer_common::meta::Semaphore> {
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
    b.meta
        .semaphores
        .iter()
        .zip(anchors)
        .map(|(s, anchor)| tracer_common::meta::Semaphore {
            anchor_file_off: anchor,
            semaphore_file_off: s.semaphore_file_off,
        })
        .collect()
}

/// The programs that take the verifier longest (about 0.5 to 1 s each here).
const SLOW_TO_VERIFY: [&str; 3] = [PROG_FLUSH_SLEEPABLE, PROG_SITE, PROG_EXIT_STEP];

/// Load the programs of `SLOW_TO_VERIFY` at the same time, a thread each: the
/// verifier runs on every core, and the session starts that much sooner. Returns
/// each one's result; a failure is only reported by the caller that needs the program
/// (loading it again gives the error).
fn preload(ebpf: &mut Ebpf) -> std::collections::HashMap<String, Result<(), ProgramError>> {
    let slow: Vec<(&str, &mut Program)> = ebpf
        .programs_mut()
        .filter(|(name, _)| SLOW_TO_VERIFY.contains(name))
        .collect();
    std::thread::scope(|s| {
        let loads: Vec<_> = slow
            .into_iter()
            .map(|(name, p)| {
                s.spawn(move || {
                    let t = Instant::now();
                    let r = match p {
                        Program::UProbe(p) => p.load(),
                        Program::TracePoint(p) => p.load(),
                        _ => Ok(()),
                    };
                    let insns = p.info().ok().and_then(|i| i.verified_instruction_count());
                    log::debug!(
                        "{name} verified in {:?} (in parallel, {insns:?} instructions processed)",
                        t.elapsed()
                    );
                    (name.to_string(), r)
                })
            })
            .collect();
        loads.into_iter().filter_map(|h| h.join().ok()).collect()
    })
}

/// Load a program into the kernel (`load`), saying how long the verifier took.
pub(super) fn verified(
    name: &str,
    load: impl FnOnce() -> Result<(), aya::programs::ProgramError>,
) -> Result<()> {
    let t = Instant::now();
    load().with_context(|| format!("the kernel rejected program {name}"))?;
    log::debug!("{name} verified in {:?}", t.elapsed());
    Ok(())
}
