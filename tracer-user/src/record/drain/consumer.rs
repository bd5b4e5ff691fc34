//! Getting chunks out of the `EVENTS` ring buffer and into the trace file.
//!
//! Two threads: the consumer polls the ring buffer (and the aya-log buffer) with a
//! short timeout, turns entries into chunk sections and hands batches to the writer
//! over a bounded channel; the writer appends them to the file. The ring buffer is
//! emptied quickly even when the disk is slow, until the channel fills up. Both threads
//! run at real-time priority when allowed (see `raise_priority`).
//!
//! The consumer copies up to `GROUP_CHUNKS` consecutive chunks out of the ring (`RawGroup`)
//! and hands them to the packer threads (`packers.rs`), which pack each group as one stream
//! (`tracefile/pack/`: about 4 of their 32 bytes on sqlite) while the consumer goes on: the
//! writer gets, in ring order, batches of sections and the receiving ends of packed groups,
//! and waits for each group in turn. Any other section first sends the pending group, so
//! the file keeps the ring's order, and a group waits at most 200 ms for more chunks. Besides record chunks it turns thread names, strings and
//! `CHUNK_KIND_MAPPED` notices (handed to the session loop) into their sections. The file
//! starts with the session header and the metadata of every traced binary, so it is
//! self-contained; where the session sees a traced binary loaded in a process (its scan of
//! `/proc/PID/maps`) it writes a load section (pid, binary, bias).

use std::{
    collections::HashSet,
    os::fd::{AsRawFd, RawFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, sync_channel},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result, anyhow};
use aya::maps::{MapData, RingBuf};
use aya_log::EbpfLogger;

use tracer_common::{CHUNK_KIND_COMM, CHUNK_KIND_MAPPED, CHUNK_KIND_RECORDS, CHUNK_KIND_STRING};

use super::packers::{Batch, Packers};
use crate::tracefile::{
    CHECKPOINT_EVERY, RawGroup, Writer, encode_chunk, encode_comm, encode_string,
};

/// Batches handed to the writer at once (bytes, soft limit).
const BATCH_BYTES: usize = 1 << 20;
/// A batch's allocation: the soft limit and room for one more packed chunk (512
/// records of at most 51 bytes).
const BATCH_CAPACITY: usize = BATCH_BYTES + (32 << 10);
/// Batches in flight between consumer and writer.
const CHANNEL_BATCHES: usize = 64;
/// How long the consumer sleeps at most: drains wake it only when the ring fills up
/// (see the eBPF `drain::wakeup`).
const POLL_MS: i32 = 10;
/// How long chunks wait for more of a group (the live view sees them this late).
const GROUP_WAIT: Duration = Duration::from_millis(200);

pub(crate) type Logger = EbpfLogger<&'static dyn log::Log>;

/// What the consumer saw.
#[derive(Debug, Default)]
pub(crate) struct Consumed {
    pub records: u64,
    pub chunks: u64,
    pub bad_entries: u64,
    pub threads: HashSet<(u32, u32)>,
}

pub(crate) struct Pipeline {
    stop: Arc<AtomicBool>,
    /// For sections that do not come from the ring buffer (binaries joining later).
    sections: SyncSender<Batch>,
    consumer: JoinHandle<Result<Consumed>>,
    writer: JoinHandle<Result<Writer>>,
}

impl Pipeline {
    /// Start consuming `ring` into `writer` (which already holds the file's head).
    /// `CHUNK_KIND_MAPPED` notices go to `mapped` as (pid, cause), not to the file.
    pub(crate) fn start(
        ring: RingBuf<MapData>,
        logger: Option<Logger>,
        writer: Writer,
        mapped: Option<Sender<(u32, u32)>>,
    ) -> Result<Self> {
        let (tx, rx) = sync_channel::<Batch>(CHANNEL_BATCHES);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = std::thread::Builder::new()
            .name("utrace-writer".into())
            .spawn(move || write_loop(writer, rx))
            .context("cannot start the writer thread")?;
        let stop2 = stop.clone();
        let sections = tx.clone();
        let consumer = std::thread::Builder::new()
            .name("utrace-consumer".into())
            .spawn(move || consume_loop(ring, logger, tx, mapped, &stop2))
            .context("cannot start the consumer thread")?;
        Ok(Pipeline {
            stop,
            sections,
            consumer,
            writer,
        })
    }

    /// Empty the ring buffer one last time, stop both threads and return the writer.
    /// Call when nothing more is produced (the traced processes are gone).
    pub(crate) fn finish(self) -> Result<(Consumed, Writer)> {
        drop(self.sections);
        self.stop.store(true, Ordering::SeqCst);
        let consumed = self
            .consumer
            .join()
            .map_err(|_| anyhow!("the consumer thread panicked"))?;
        let writer = self
            .writer
            .join()
            .map_err(|_| anyhow!("the writer thread panicked"))?;
        // A write error explains a consumer error ("writer stopped"), so it goes first.
        let writer = writer?;
        let consumed = consumed?;
        Ok((consumed, writer))
    }
}

impl Pipeline {
    /// Queue complete sections for the file, in order with the chunks consumed so far.
    pub(crate) fn write_sections(&self, bytes: Vec<u8>) -> Result<()> {
        self.sections
            .send(Batch::Sections(bytes))
            .map_err(|_| anyhow!("the writer thread stopped"))
    }
}

fn poll_readable(fds: &[RawFd], timeout_ms: i32) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: p is a valid array of p.len() pollfds. Errors (EINTR) just mean "look again".
    unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
}

/// The cause of a notice sent for a process's first records (not a `CAUSE_*`).
pub(crate) const FIRST_RECORDS: u32 = u32::MAX;

fn consume_loop(
    mut ring: RingBuf<MapData>,
    mut logger: Option<Logger>,
    tx: SyncSender<Batch>,
    mapped: Option<Sender<(u32, u32)>>,
    stop: &AtomicBool,
) -> Result<Consumed> {
    raise_priority();
    let packers = Packers::start()?;
    let mut fds = vec![ring.as_raw_fd()];
    fds.extend(logger.as_ref().map(|l| l.as_raw_fd()));
    let mut c = Consuming {
        seen: Consumed::default(),
        batch: Vec::with_capacity(BATCH_CAPACITY),
        pids: HashSet::new(),
        last_pid: 0,
        group: RawGroup::default(),
        packers,
        tx,
        mapped,
    };
    loop {
        // Read the flag before draining: entries produced before it was set are in
        // the buffer by now, so one more full drain gets everything.
        let stopping = stop.load(Ordering::SeqCst);
        if !stopping {
            poll_readable(&fds, POLL_MS);
        }
        while let Some(item) = ring.next() {
            let counted = c.entry(&item)?;
            drop(item);
            if counted && c.batch.len() >= BATCH_BYTES {
                c.send()?;
            }
        }
        if stopping || c.group.age().is_some_and(|a| a >= GROUP_WAIT) {
            c.send_group()?;
        }
        if !c.batch.is_empty() {
            c.send()?;
        }
        if let Some(l) = logger.as_mut() {
            l.flush();
        }
        if stopping {
            return Ok(c.seen);
        }
    }
}

/// The consumer thread's state between ring buffer entries.
struct Consuming {
    seen: Consumed,
    /// Sections for the writer thread, sent when BATCH_BYTES full or at each poll's end.
    batch: Vec<u8>,
    /// Processes whose records arrived: the first chunk of each is announced like a
    /// mapping, so the session looks at the process (where its binaries are loaded:
    /// return addresses of forked children and static programs become readable).
    pids: HashSet<u32>,
    last_pid: u32,
    /// Chunks of records to be packed together; any other section first sends them, so
    /// the file keeps the ring buffer's order. A group waits for more chunks across
    /// polls, at most GROUP_WAIT.
    group: RawGroup,
    packers: Packers,
    tx: SyncSender<Batch>,
    mapped: Option<Sender<(u32, u32)>>,
}

impl Consuming {
    /// Take one ring buffer entry; returns whether it was a chunk (counted, good or bad),
    /// after which a full batch is sent.
    fn entry(&mut self, item: &[u8]) -> Result<bool> {
        let kind = item
            .get(..4)
            .map(|k| u32::from_le_bytes([k[0], k[1], k[2], k[3]]));
        if kind == Some(CHUNK_KIND_MAPPED) {
            if let (Some(tx), Some(h)) = (&self.mapped, crate::tracefile::chunk_header(item)) {
                let _ = tx.send((h.pid, h.cause));
            }
            return Ok(false);
        }
        let grouped = match kind {
            Some(CHUNK_KIND_RECORDS) => self.group.add(item),
            _ => None,
        };
        if grouped.is_none_or(|(_, full)| full) {
            self.send_group()?;
        }
        let grouped = grouped.map(|(h, _)| h);
        // Announcements: a section each, no records.
        let announced = match kind {
            Some(CHUNK_KIND_COMM) => Some(encode_comm(item, &mut self.batch)),
            Some(CHUNK_KIND_STRING) => Some(encode_string(item, &mut self.batch)),
            _ => None,
        };
        if let Some(ok) = announced {
            self.seen.bad_entries += u64::from(!ok);
            return Ok(false);
        }
        match grouped.or_else(|| encode_chunk(item, &mut self.batch)) {
            Some(h) => self.chunk(h.pid, h.tid, h.count),
            None => self.seen.bad_entries += 1,
        }
        Ok(true)
    }

    /// Hand the pending group to the packers, after the sections before it.
    fn send_group(&mut self) -> Result<()> {
        let Some(g) = self.group.take() else {
            return Ok(());
        };
        if !self.batch.is_empty() {
            self.send()?;
        }
        let packed = self.packers.pack(g)?;
        self.tx
            .send(Batch::Packed(packed))
            .map_err(|_| anyhow!("the writer thread stopped"))
    }

    /// A chunk of `count` records of thread (pid, tid) went into the batch.
    fn chunk(&mut self, pid: u32, tid: u32, count: u32) {
        self.seen.records += u64::from(count);
        self.seen.chunks += 1;
        self.seen.threads.insert((pid, tid));
        if pid != self.last_pid {
            self.last_pid = pid;
            if self.pids.insert(pid)
                && let Some(tx) = &self.mapped
            {
                let _ = tx.send((pid, FIRST_RECORDS));
            }
        }
    }

    /// Hand the batch to the writer thread.
    fn send(&mut self) -> Result<()> {
        let full = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH_CAPACITY));
        self.tx
            .send(Batch::Sections(full))
            .map_err(|_| anyhow!("the writer thread stopped"))
    }
}

/// Traced threads can fill the ring buffer much faster than a fair share of the CPU
/// lets us empty it (an instrumented tight loop makes GB/s of records). The consumer
/// and the writer therefore run SCHED_FIFO (lowest real-time priority): whenever they
/// have work they run ahead of the traced threads, so a burst slows the program down
/// instead of being dropped. Both block (poll, channel, write) when idle, and the
/// kernel's real-time throttling bounds them anyway. Best effort (needs CAP_SYS_NICE).
fn raise_priority() {
    // Zeroed, then set: musl's sched_param has more fields than glibc's.
    // SAFETY: sched_param is plain integers; all-zero is a valid value.
    let mut p: libc::sched_param = unsafe { std::mem::zeroed() };
    p.sched_priority = 1;
    // SAFETY: p is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
        log::debug!(
            "cannot make {:?} real-time: {}",
            std::thread::current().name(),
            std::io::Error::last_os_error()
        );
    }
}

/// Writes batches in order; what the writer holds goes into the file at least every
/// `CHECKPOINT_EVERY`, so that a tracer killed mid-session leaves all but that.
fn write_loop(mut writer: Writer, rx: Receiver<Batch>) -> Result<Writer> {
    raise_priority();
    loop {
        match rx.recv_timeout(CHECKPOINT_EVERY) {
            Ok(batch) => writer.write_raw(&batch.bytes()?)?,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Ok(writer),
        }
        writer.checkpoint_if_due()?;
    }
}
