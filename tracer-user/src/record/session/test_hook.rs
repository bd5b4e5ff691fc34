//! A pause for the trust-boundary tests (`tests/tests/trust_*.rs`): with
//! `UTRACE_TEST_PAUSE=POINT:FIFO` in the tracer's environment, the tracer stops the first
//! time it reaches `POINT` until the test has opened the FIFO for writing and closed it.
//! A race between two of the tracer's steps (a file swapped after it was parsed, a
//! process that execs between the check of its memory and the write) is then
//! deterministic. Only whoever sets the root tracer's environment can use it, it only
//! waits, and only at a FIFO owned by root (a user's variable passed on by `sudo -E`
//! makes the tracer open nothing of theirs).

use std::{
    io,
    sync::atomic::{AtomicBool, Ordering},
};

/// Binaries were found and parsed, nothing is attached yet.
pub(super) const PARSED: &str = "parsed";
/// A process's RW area magic was checked, nothing is written yet.
pub(super) const SEED_CHECKED: &str = "seed-checked";

static DONE: AtomicBool = AtomicBool::new(false);

/// Wait at `point` if the test asked for it (once per session).
pub(super) fn pause(point: &str) {
    let Some(v) = std::env::var_os("UTRACE_TEST_PAUSE") else {
        return;
    };
    let Some((p, fifo)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return;
    };
    if p != point || DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let Some(mut f) = root_fifo(fifo) else {
        return;
    };
    log::info!("test pause at {point} ({fifo})");
    // Reading ends at the test's close of the writing end.
    let _ = io::copy(&mut f, &mut io::sink());
}

/// `path` opened for reading if it is a FIFO owned by root, else None (said): under
/// `sudo -E`, a user's `UTRACE_TEST_PAUSE` must not make root open a device, or wait
/// at a FIFO the user holds. Opened `O_PATH` first (opens nothing for real), checked
/// with `fstat`, then opened for reading through that descriptor (`/proc/self/fd/N`),
/// which blocks until the test opens the writing end.
fn root_fifo(path: &str) -> Option<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let m = held.metadata().ok()?;
    if !m.file_type().is_fifo() || m.uid() != 0 {
        eprintln!("utrace: warning: UTRACE_TEST_PAUSE ignored: {path} is not a FIFO owned by root");
        return None;
    }
    let through = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&held));
    std::fs::File::open(through).ok()
}
