//! Ending a session quickly. Taking a probe down waits for an RCU grace period in the
//! kernel, one probe after another (about 110 ms per uprobe and 50 to 200 ms per
//! tracepoint here: two seconds for sqlite's 13 uprobes and 8 tracepoints), and the
//! session would sit through all of them before its command returns.
//!
//! Instead: [`stop`] marks the session ended (`TARGETS_ENDED`: from then on every
//! program returns at once) and takes down one probe of each kind, so that the
//! programs already running have finished (their grace periods) and the last drain
//! of the ring buffer is complete. Where every traced process is gone (a command
//! session whose processes have all exited and been reaped) none of them can be in a
//! program, and programs of other processes write nothing: no grace period is waited
//! for (the sleepable flush's took 150 ms of every session here). The tracer then
//! writes the file and prints its summary; [`release`] hands the remaining probes to
//! a child process that drops them after the tracer has exited.
//!
//! `stop` puts `TARGETS_ENDED` into `TARGETS` and takes down the flush uprobe and two
//! tracepoints at the same time, a thread each (the sleepable `flush_s`'s tasks-trace grace
//! period, 0.15–0.3 s, is the longest); their grace periods also cover the programs still
//! running. `release` forks a child that holds the remaining probes' descriptors, closes its
//! stdio and exits once the tracer has. Figures (sqlite entry+exit): 2.1 s before the
//! program ran and 2.3 s after it exited → 1.2 s and 0.3 s; with the global drain functions
//! 0.2 s before; a one-statement sqlite session under `tracer record`: 2.09 s → 0.45 s with
//! the global chunk copy and string read and no wait at the end.

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
pub(super) fn stop(ebpf: &mut Ebpf, system_wide: bool) -> Result<()> {
    let t = Instant::now();
    let mut targets: HashMap<_, u32, u8> = HashMap::try_from(
        ebpf.map_mut(MAP_TARGETS)
            .with_context(|| format!("no {MAP_TARGETS} map"))?,
    )?;
    targets
        .insert(TARGETS_ENDED, 1, 0)
        .context("cannot end the session in the TARGETS map")?;
    // A program runs in the thread that hit its probe: a process that no longer
    // exists is in none. Read after TARGETS_ENDED: a target added later stops at once.
    let gone = !system_wide && targets.keys().all(|pid| pid.is_ok_and(process_gone));
    if gone {
        log::debug!("every traced process is gone: no grace period to wait for");
        return Ok(());
    }
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

/// Whether no process has id `pid` (not even a zombie); `TARGETS_ENDED` is none.
fn process_gone(pid: u32) -> bool {
    if pid == TARGETS_ENDED {
        return true;
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
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
