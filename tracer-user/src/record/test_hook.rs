//! A pause for the trust-boundary tests (`tests/tests/trust_*.rs`): with
//! `UTRACE_TEST_PAUSE=POINT:FIFO` in the tracer's environment, the tracer stops the first
//! time it reaches `POINT` until the test has opened the FIFO for writing and closed it.
//! A race between two of the tracer's steps (a file swapped after it was parsed, a
//! process that execs between the check of its memory and the write) is then
//! deterministic. Only whoever sets the root tracer's environment can use it; it only
//! waits.

use std::{
    io,
    sync::atomic::{AtomicBool, Ordering},
};

/// Binaries were found and parsed, nothing is attached yet.
pub const PARSED: &str = "parsed";
/// A process's RW area magic was checked, nothing is written yet.
pub const SEED_CHECKED: &str = "seed-checked";

static DONE: AtomicBool = AtomicBool::new(false);

/// Wait at `point` if the test asked for it (once per session).
pub fn pause(point: &str) {
    let Some(v) = std::env::var_os("UTRACE_TEST_PAUSE") else {
        return;
    };
    let Some((p, fifo)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return;
    };
    if p != point || DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    log::info!("test pause at {point} ({fifo})");
    // Opening blocks until the test opens the writing end; reading ends at its close.
    if let Ok(mut f) = std::fs::File::open(fifo) {
        let _ = io::copy(&mut f, &mut io::sink());
    }
}
