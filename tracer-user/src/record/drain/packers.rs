//! The packer threads: chunk groups (`RawGroup`) packed in parallel, as many at once as
//! there are CPUs. Packing is the consumer's costliest step (a memory trace is ~20 ns a
//! record of it); done on the consumer's thread it paced every traced thread that waits
//! for room in the ring (`--on-full wait`), while the CPU those threads left idle stayed
//! idle. The packers run at normal priority, so they share that CPU with the program
//! rather than preempt it.
//!
//! Order: each group gets its own reply channel, and the writer receives the channels in
//! ring order (`Batch::Packed`) and waits on each in turn, so the file's sections keep
//! the ring's order whichever packer finishes first.

use std::sync::{
    Arc, Mutex,
    mpsc::{Receiver, SyncSender, sync_channel},
};
use std::thread::JoinHandle;

use anyhow::{Context, Result, anyhow};

use crate::tracefile::{GroupPacker, RawGroup};

/// What the writer thread gets, in ring order.
pub(crate) enum Batch {
    /// Complete sections.
    Sections(Vec<u8>),
    /// A chunk group's section, when its packer is done.
    Packed(Receiver<Vec<u8>>),
}

impl Batch {
    /// The batch's bytes (waiting for a packed group).
    pub(crate) fn bytes(self) -> Result<Vec<u8>> {
        match self {
            Batch::Sections(b) => Ok(b),
            Batch::Packed(rx) => rx.recv().map_err(|_| anyhow!("a packer thread stopped")),
        }
    }
}

type Job = (RawGroup, SyncSender<Vec<u8>>);

/// The packer threads; dropping them lets each finish its queue and stop.
pub(crate) struct Packers {
    jobs: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Packers {
    pub(crate) fn start() -> Result<Packers> {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 8));
        // Two groups queued a thread: enough to keep them busy, bounded memory (a group
        // is at most GROUP_CHUNKS × 16 KiB of records).
        let (tx, rx) = sync_channel::<Job>(2 * n);
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..n)
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("utrace-pack{i}"))
                    .spawn(move || pack_loop(&rx))
                    .context("cannot start a packer thread")
            })
            .collect::<Result<_>>()?;
        Ok(Packers {
            jobs: Some(tx),
            threads,
        })
    }

    /// Queue `group` for packing: the receiver yields its section.
    pub(crate) fn pack(&self, group: RawGroup) -> Result<Receiver<Vec<u8>>> {
        let (tx, rx) = sync_channel(1);
        self.jobs
            .as_ref()
            .context("packers stopped")?
            .send((group, tx))
            .map_err(|_| anyhow!("the packer threads stopped"))?;
        Ok(rx)
    }
}

impl Drop for Packers {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn pack_loop(jobs: &Mutex<Receiver<Job>>) {
    let mut packer = GroupPacker::default();
    loop {
        // The lock is held only while waiting for a job, never while packing.
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((group, reply)) = job else {
            return;
        };
        let mut out = Vec::new();
        group.pack(&mut packer, &mut out);
        // The writer gone: the session is failing anyway.
        let _ = reply.send(out);
    }
}
