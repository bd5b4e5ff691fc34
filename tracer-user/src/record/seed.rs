//! Processes already running: their mappings scanned for instrumented binaries, each
//! binary's RW area seeded into `TABLES` (so exits drain it) and its load noted in the file.

use std::{
    ffi::{CStr, CString},
    fs::File,
    io::Read,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::FileExt,
    },
};

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
        shares::{self, BinaryRefusal},
    },
    tracefile::encode_load,
};

pub(super) use binaries::SeenFiles;

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

/// A process's `/proc/PID` directory, opened once: what is read or written below it is
/// opened relative to it (`openat`), so it is this process, never a later one that got
/// its pid.
struct ProcDir {
    dir: OwnedFd,
}

impl ProcDir {
    fn open(pid: u32) -> Result<Self> {
        let path = CString::new(format!("/proc/{pid}")).context("pid path")?;
        // SAFETY: a valid C string; the result is checked and owned below.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot open /proc/{pid}"));
        }
        // SAFETY: a new descriptor we own.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ProcDir { dir })
    }

    /// `name` in this process's directory, opened with `flags`.
    fn open_at(&self, name: &CStr, flags: libc::c_int) -> Result<File> {
        // SAFETY: a directory descriptor we hold and a valid C string; the result is
        // checked and owned below.
        let fd =
            unsafe { libc::openat(self.dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot open {}", name.to_string_lossy()));
        }
        // SAFETY: a new descriptor we own.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// A small text file of the directory (at most 64 KiB read).
    fn read(&self, name: &CStr) -> Result<String> {
        let mut text = String::new();
        self.open_at(name, libc::O_RDONLY)?
            .take(64 << 10)
            .read_to_string(&mut text)?;
        Ok(text)
    }

    /// The process's start time (field 22 of `stat`, after the command's closing
    /// parenthesis): another process that got the pid has another.
    fn start_time(&self) -> Result<u64> {
        let stat = self.read(c"stat")?;
        let (_, rest) = stat.rsplit_once(')').context("stat without a command")?;
        rest.split_whitespace()
            .nth(19)
            .and_then(|f| f.parse().ok())
            .context("stat without a start time")
    }

    /// The process's real uid (`status`).
    fn real_uid(&self) -> Result<u32> {
        let status = self.read(c"status")?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .context("status without a Uid line")
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
    /// threads are drained at exit even if they never flush. Best effort.
    pub(super) fn seed_table(&mut self, pid: u32, b: &Instrumented, bias: u64) {
        self.seed(pid, b, bias, Seeding::Traced);
    }

    fn seed(&mut self, pid: u32, b: &Instrumented, bias: u64, how: Seeding) {
        let rw_base = bias.wrapping_add(b.meta.rw_vaddr);
        if self.seeded.contains(&(pid, rw_base)) {
            return;
        }
        if let Err(e) = self.try_seed_table(pid, rw_base, how) {
            log::info!(
                "{} in process {pid}: {e:#}; its threads are learned at their next flush",
                b.path.display()
            );
            return;
        }
        self.seeded.insert((pid, rw_base));
    }

    /// Check the magic and write through one descriptor of `/proc/PID/mem`, opened
    /// relative to the process's held directory: the descriptor stays on the image it
    /// was opened on (after an exec, writes through it fail instead of landing in the
    /// new image), and the start time shows the pid was not taken by another process.
    fn try_seed_table(&mut self, pid: u32, rw_base: u64, how: Seeding) -> Result<()> {
        let proc = ProcDir::open(pid)?;
        let start = proc.start_time()?;
        let uid = proc.real_uid()?;
        let mem = proc.open_at(c"mem", libc::O_RDWR)?;
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
            return tell(&mem, rw_base, false);
        }
        tell(&mem, rw_base, self.wait)?;
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
    pub(super) fn scan_process(&mut self, pid: u32, seen: &mut SeenFiles, pipeline: &Pipeline) {
        let found = match binaries::for_process_cached(pid, seen) {
            Ok(f) => f,
            Err(e) => {
                log::debug!("{e:#}");
                return;
            }
        };
        for (b, bias) in found {
            match self.add_binary(b.clone(), Some(pipeline)) {
                Ok(_) => {
                    self.seed(pid, &b, bias, Seeding::Traced);
                    self.note_load(pid, &b, bias, pipeline);
                }
                Err(e) if e.is::<BinaryRefusal>() => {
                    self.seed(pid, &b, bias, Seeding::Released);
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
