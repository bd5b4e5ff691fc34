//! Processes already running: their mappings scanned for instrumented binaries, each
//! binary's RW area seeded into `TABLES` (so exits drain it) and its load noted in the file.
//!
//! A process's memory is written through one `/proc/PID/mem` descriptor opened relative to
//! the held `/proc/PID` (`procdir.rs`) before its `maps` is read, for the check and the
//! write; `-p` reads `maps` again through it and wants the binary at the same bias. Through
//! it the RW header is checked before its area is seeded into `TABLES`, and two words are
//! written: `RwHeader::attached` (`ATTACHED`, ending a waiting program's wait) and
//! `RwHeader::on_full` (back-pressure for processes that registered before the session). A seed is charged to the process's uid
//! like the eBPF side's entries (`charge_table`; the tracer's count is not atomic: a race
//! with a flush may leave it off by one, never below 0). Tests
//! `trust_seed::a_process_that_execs_between_check_and_write_gets_nothing_written`,
//! `a_process_that_execs_between_maps_read_and_check_gets_nothing_written`.

use std::{fs::File, os::unix::fs::FileExt};

use anyhow::{Context, Result, bail};
use aya::maps::HashMap;
use tracer_common::{
    ATTACHED, ON_FULL_WAIT, RW_MAGIC, RWH_ATTACHED, RWH_ON_FULL,
    ebpf::{MAP_TABLES, TABLE_BINARIES},
};

use crate::{record::drain::consumer::Pipeline, tracefile::encode_load};

use super::{
    attach::Live,
    binaries::{self, Instrumented},
    procdir::ProcDir,
    shares::{self, BinaryRefusal},
};

pub(super) fn all_pids() -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != me)
        .collect()
}

/// A process as the tracer looks at it: its `/proc/PID` held, and its `mem` opened
/// before its `maps` is read. A `mem` descriptor is bound to the address space it was
/// opened on: if the process execs after that, the RW areas found in `maps` (of
/// either image) cannot be reached through it, and root writes nothing into the new
/// image.
pub(super) struct Image {
    proc: ProcDir,
    mem: File,
    start: u64,
}

impl Image {
    pub(super) fn open(pid: u32) -> Result<Self> {
        let proc = ProcDir::open(pid)?;
        let mem = proc.mem()?;
        let start = proc.start_time()?;
        Ok(Image { proc, mem, start })
    }
}

/// Tell the RW area at `rw_base` that its binary is attached (`RwHeader::attached`: a
/// program waiting in `register` goes on) and, with `wait`, arm `--on-full wait` for
/// threads that registered before the session (their flush function looks at
/// `RwHeader::on_full`; new threads are told at registration). A program that is not
/// told waits until it gives up, and is counted lost before attach. `mem` is the
/// descriptor the magic was checked through: after an exec its writes fail.
fn tell(mem: &File, rw_base: u64, wait: bool) -> Result<()> {
    if wait {
        mem.write_all_at(&ON_FULL_WAIT.to_le_bytes(), rw_base + RWH_ON_FULL)?;
    }
    mem.write_all_at(&ATTACHED.to_le_bytes(), rw_base + RWH_ATTACHED)
        .with_context(|| format!("cannot write the RW area at {rw_base:#x}"))
}

fn tables_map(
    ebpf: &mut aya::Ebpf,
) -> Result<HashMap<&mut aya::maps::MapData, u32, [u64; TABLE_BINARIES]>> {
    let map = ebpf
        .map_mut(MAP_TABLES)
        .with_context(|| format!("no {MAP_TABLES} map"))?;
    Ok(HashMap::try_from(map)?)
}

/// `b` is mapped at `bias` in the image (its `maps` read through its held
/// `/proc/PID`, after its `mem` was opened).
fn still_mapped(image: &Image, b: &Instrumented, bias: u64) -> Result<()> {
    let maps = binaries::mappings_of(&image.proc)?;
    let now = binaries::load_bias_in(&image.proc, b, &maps)?;
    if now != bias {
        bail!("mapped at bias {now:#x} now, not {bias:#x} (the process exec'd)");
    }
    Ok(())
}

/// What is done at a process's RW area.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seeding {
    /// Told it is attached and put in `TABLES`.
    Traced,
    /// Only told to stop waiting: its binary is refused (not traced).
    Released,
}

impl Live {
    /// Tell eBPF where `b`'s RW area is in process `pid` (loaded at `bias`), so that its
    /// threads are drained at exit even if they never flush. Best effort. The process
    /// was looked at earlier (`-p`): its `mem` is opened now, then its `maps` read again
    /// through the same `/proc/PID`, and `b` must still be mapped at `bias` (an exec in
    /// between is another image).
    pub(super) fn seed_table(&mut self, pid: u32, b: &Instrumented, bias: u64) {
        match Image::open(pid).and_then(|image| still_mapped(&image, b, bias).map(|()| image)) {
            Ok(image) => self.seed(&image, b, bias, Seeding::Traced),
            Err(e) => log::info!(
                "{} in process {pid}: {e:#}; its threads are learned at their next flush",
                b.path.display()
            ),
        }
    }

    fn seed(&mut self, image: &Image, b: &Instrumented, bias: u64, how: Seeding) {
        let pid = image.proc.pid;
        let rw_base = bias.wrapping_add(b.meta.rw_vaddr);
        if self.seeded.contains(&(pid, rw_base)) {
            return;
        }
        if let Err(e) = self.try_seed_table(image, rw_base, how) {
            log::info!(
                "{} in process {pid}: {e:#}; its threads are learned at their next flush",
                b.path.display()
            );
            return;
        }
        self.seeded.insert((pid, rw_base));
    }

    /// Check the magic and write through the image's one descriptor of
    /// `/proc/PID/mem`, opened before its maps were read: it stays on the image it was
    /// opened on (after an exec, reads and writes through it fail instead of reaching
    /// the new image), and the start time shows the pid was not taken by another
    /// process.
    fn try_seed_table(&mut self, image: &Image, rw_base: u64, how: Seeding) -> Result<()> {
        let (proc, mem, start) = (&image.proc, &image.mem, image.start);
        let pid = proc.pid;
        let uid = proc.real_uid()?;
        let mut magic = [0u8; 8];
        mem.read_exact_at(&mut magic, rw_base)
            .with_context(|| format!("cannot read the RW area at {rw_base:#x}"))?;
        if u64::from_le_bytes(magic) != RW_MAGIC {
            bail!("no RW area at {rw_base:#x}");
        }
        super::test_hook::pause(super::test_hook::SEED_CHECKED);
        if proc.start_time()? != start {
            bail!("process {pid} is another process now");
        }
        if how == Seeding::Released {
            return tell(mem, rw_base, false);
        }
        tell(mem, rw_base, self.wait)?;
        if !self.shares.may_seed(pid, uid) {
            bail!("its user (uid {uid}) has its share of TABLES entries");
        }
        // Merged with what eBPF may have learned meanwhile (a race with a flush only
        // loses an entry that the next flush adds again).
        let mut table = tables_map(&mut self.ebpf)?
            .get(&pid, 0)
            .unwrap_or([0; TABLE_BINARIES]);
        if table.contains(&rw_base) {
            return Ok(());
        }
        let new_entry = table == [0; TABLE_BINARIES];
        let free = table.iter().position(|&v| v == 0).with_context(|| {
            format!("process {pid} has {TABLE_BINARIES} instrumented binaries already")
        })?;
        table[free] = rw_base;
        // A new entry counts in the uid's share of the eBPF side's counters too.
        if new_entry && !shares::charge_table(&mut self.ebpf, pid, uid, self.shares.capped())? {
            bail!("its user (uid {uid}) has its share of TABLES entries");
        }
        let added = tables_map(&mut self.ebpf)?.insert(pid, table, 0);
        if added.is_err() && new_entry {
            shares::uncharge_table(&mut self.ebpf, pid)?;
        }
        added.with_context(|| format!("cannot add pid {pid} to {MAP_TABLES}"))
    }

    /// Look at process `pid`'s mappings: trace instrumented binaries not traced yet and
    /// tell eBPF where their RW areas are. A binary the session refuses
    /// (`BinaryRefusal`) is only told to stop waiting, in every process that maps it;
    /// past `shares::MAX_HELD_REFUSED` refused files, one is forgotten as not traced (`seen`:
    /// neither held open nor read again; its later programs wait out their time and
    /// count as lost before attach). Best effort (the process may be gone).
    pub(super) fn scan_process(
        &mut self,
        pid: u32,
        seen: &mut binaries::SeenFiles,
        pipeline: &Pipeline,
    ) {
        let found = Image::open(pid).and_then(|image| {
            let found = binaries::for_process_in(&image.proc, seen)?;
            Ok((image, found))
        });
        let (image, found) = match found {
            Ok(f) => f,
            Err(e) => {
                log::debug!("{e:#}");
                return;
            }
        };
        for (b, bias) in found {
            match self.add_binary(b.clone(), Some(pipeline)) {
                Ok(_) => {
                    self.seed(&image, &b, bias, Seeding::Traced);
                    self.note_load(pid, &b, bias, pipeline);
                }
                Err(e) if e.is::<BinaryRefusal>() => {
                    self.seed(&image, &b, bias, Seeding::Released);
                    if self.shares.keep_refused(b.file.id) {
                        continue;
                    }
                    for v in seen.values_mut() {
                        if v.as_ref().is_some_and(|o| o.file.id == b.file.id) {
                            *v = None;
                        }
                    }
                }
                Err(e) => log::warn!("{}: {e:#}", b.path.display()),
            }
        }
    }

    /// Tell the trace file where `b` is in process `pid` (once per process and binary),
    /// so readers can symbolize its run-time code addresses.
    pub(super) fn note_load(&mut self, pid: u32, b: &Instrumented, bias: u64, pipeline: &Pipeline) {
        if self.loads.insert((pid, b.meta.binary_id, bias))
            && let Err(e) = pipeline.write_sections(encode_load(pid, b.meta.binary_id, bias))
        {
            log::warn!("{e:#}");
        }
    }
}
