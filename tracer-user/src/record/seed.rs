//! Processes already running: their mappings scanned for instrumented binaries, each
//! binary's RW area seeded into `TABLES` (so exits drain it) and its load noted in the file.

use std::{collections::HashMap as StdHashMap, fs::File, os::unix::fs::FileExt, path::PathBuf};

use anyhow::{Context, Result, bail};
use aya::maps::HashMap;
use tracer_common::{
    ATTACHED, ON_FULL_WAIT, RW_MAGIC, RWH_ATTACHED, RWH_ON_FULL,
    ebpf::{MAP_TABLES, TABLE_BINARIES},
};

use crate::{
    record::{
        binaries::{self, Instrumented},
        consumer::Pipeline,
        live::Live,
    },
    tracefile::encode_load,
};

/// Files already looked at by (path, inode): instrumented or not.
pub(super) type SeenFiles = StdHashMap<(PathBuf, u64), Option<Instrumented>>;

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

/// Tell the RW area at `rw_base` that its binary is attached (`RwHeader::attached`: a
/// program waiting in `register` goes on) and, with `wait`, arm `--on-full wait` for
/// threads that registered before the session (their flush function looks at
/// `RwHeader::on_full`; new threads are told at registration). A program that is not
/// told waits until it gives up, and is counted lost before attach.
fn tell(mem_path: &str, rw_base: u64, wait: bool) {
    let r = std::fs::OpenOptions::new()
        .write(true)
        .open(mem_path)
        .and_then(|f| {
            if wait {
                f.write_all_at(&ON_FULL_WAIT.to_le_bytes(), rw_base + RWH_ON_FULL)?;
            }
            f.write_all_at(&ATTACHED.to_le_bytes(), rw_base + RWH_ATTACHED)
        });
    if let Err(e) = r {
        log::info!("cannot write the RW area at {rw_base:#x} in {mem_path}: {e}");
    }
}

impl Live {
    /// Tell eBPF where `b`'s RW area is in process `pid` (loaded at `bias`), so that its
    /// threads are drained at exit even if they never flush. Best effort.
    pub(super) fn seed_table(&mut self, pid: u32, b: &Instrumented, bias: u64) {
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
        tell(&mem_path, rw_base, self.wait);
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
    pub(super) fn scan_process(&mut self, pid: u32, seen: &mut SeenFiles, pipeline: &Pipeline) {
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
                .any(|o| o.meta.binary_id == b.meta.binary_id);
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
    pub(super) fn note_load(&mut self, pid: u32, b: &Instrumented, bias: u64, pipeline: &Pipeline) {
        if self.loads.insert((pid, b.meta.binary_id, bias))
            && let Err(e) = pipeline.write_sections(encode_load(pid, b.meta.binary_id, bias))
        {
            log::warn!("{e:#}");
        }
    }
}
