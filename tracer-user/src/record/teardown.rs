//! Ending a session quickly. Taking a probe down waits for an RCU grace period in the
//! kernel, one probe after another (about 110 ms per uprobe and 50 to 200 ms per
//! tracepoint here: two seconds for sqlite's 13 uprobes and 8 tracepoints), and the
//! session would sit through all of them before its command returns.
//!
//! Instead: [`stop`] marks the session ended (`TARGETS_ENDED`: from then on every
//! program returns at once) and takes down one probe of each kind, so that the
//! programs already running have finished (their grace periods) and the last drain
//! of the ring buffer is complete. The tracer then writes the file and prints its
//! summary; [`release`] hands the remaining probes to a child process that drops them
//! after the tracer has exited.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aya::{Ebpf, maps::HashMap};
use tracer_common::ebpf::{
    MAP_TARGETS, PROG_FLUSH, PROG_FLUSH_SLEEPABLE, PROG_TASK_EXIT, PROG_THREAD_EXIT, TARGETS_ENDED,
};

use super::attach;

/// How long the child waits for the tracer to exit before it lets go anyway.
const WAIT_FOR_TRACER: Duration = Duration::from_secs(30);

/// End the session: no program produces anything once this returns.
pub(super) fn stop(ebpf: &mut Ebpf) -> Result<()> {
    let t = Instant::now();
    let mut targets: HashMap<_, u32, u8> = HashMap::try_from(
        ebpf.map_mut(MAP_TARGETS)
            .with_context(|| format!("no {MAP_TARGETS} map"))?,
    )?;
    targets
        .insert(TARGETS_ENDED, 1, 0)
        .context("cannot end the session in the TARGETS map")?;
    // The flush uprobe's grace period covers every uprobe handler (flush and sites);
    // a syscall and a sched tracepoint cover the exit, fork and exec programs.
    attach::unload(
        ebpf,
        &[
            PROG_FLUSH,
            PROG_FLUSH_SLEEPABLE,
            PROG_THREAD_EXIT,
            PROG_TASK_EXIT,
        ],
    );
    log::debug!("session stopped in {:?}", t.elapsed());
    Ok(())
}

/// Let the remaining probes go without waiting for the kernel: a child process
/// inherits their descriptors and exits once the tracer has (the last close is the
/// slow one). If it cannot be started, they are dropped here, slowly.
pub(super) fn release(ebpf: Ebpf) {
    // SAFETY: getpid has no preconditions.
    let tracer = unsafe { libc::getpid() };
    // SAFETY: the child only makes async-signal-safe calls (close, getppid,
    // nanosleep, _exit), as a fork of a multi-threaded process must.
    match unsafe { libc::fork() } {
        0 => wait_then_exit(tracer),
        pid if pid < 0 => {
            log::debug!("cannot fork: {}", std::io::Error::last_os_error());
            drop(ebpf);
        }
        // Our copies of the descriptors close as the tracer exits, quickly.
        _ => drop(ebpf),
    }
}

/// The child: no stdio (whoever reads the tracer's output sees its end now), then wait
/// until the tracer is gone (this process is reparented) and exit.
fn wait_then_exit(tracer: libc::pid_t) -> ! {
    let step = libc::timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    // SAFETY: async-signal-safe system calls on our own descriptors and memory.
    unsafe {
        for fd in 0..3 {
            libc::close(fd);
        }
        let steps = WAIT_FOR_TRACER.as_millis() / 10;
        for _ in 0..steps {
            if libc::getppid() != tracer {
                break;
            }
            libc::nanosleep(&step, std::ptr::null_mut());
        }
        libc::_exit(0)
    }
}
