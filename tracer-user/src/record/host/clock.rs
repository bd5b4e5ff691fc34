//! The cycle counter the inline stubs store (`rdtsc` on x86-64, `cntvct_el0` on
//! AArch64) against CLOCK_MONOTONIC, which is what `bpf_ktime_get_ns()` (uprobe-site
//! records) returns and what reports show.
//!
//! A session takes an anchor (a simultaneous (counter, monotonic ns) pair) and a short
//! calibration of the counter frequency at the start, and another anchor at the end;
//! with both anchors the frequency over the whole session is used.

use std::time::Duration;

use crate::tracefile::clock::hz_between;
pub(crate) use crate::tracefile::clock::{Anchor, Calibration};

#[cfg(target_arch = "x86_64")]
pub(crate) fn read_counter() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(target_arch = "aarch64")]
pub fn read_counter() -> u64 {
    let v: u64;
    // SAFETY: cntvct_el0 is readable from EL0 on Linux.
    unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) v, options(nomem, nostack)) };
    v
}

pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The tightest of a few (counter, clock, counter) brackets, counter at the midpoint.
pub(crate) fn anchor() -> Anchor {
    let mut best = (
        u64::MAX,
        Anchor {
            tsc: 0,
            monotonic_ns: 0,
        },
    );
    for _ in 0..16 {
        let t0 = read_counter();
        let ns = monotonic_ns();
        let t1 = read_counter();
        let width = t1.wrapping_sub(t0);
        if width < best.0 {
            best = (
                width,
                Anchor {
                    tsc: t0 + width / 2,
                    monotonic_ns: ns,
                },
            );
        }
    }
    best.1
}

/// Measure the counter frequency over `interval` (blocking).
pub(crate) fn calibrate(interval: Duration) -> Calibration {
    let a = anchor();
    std::thread::sleep(interval);
    let b = anchor();
    Calibration {
        tsc_hz: hz_between(a, b).unwrap_or(1e9),
        anchor: b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_runs_with_the_clock() {
        let c = calibrate(Duration::from_millis(20));
        assert!(c.tsc_hz > 1e6, "{}", c.tsc_hz);
        let now = c.monotonic_ns_of(read_counter());
        let mono = monotonic_ns();
        assert!(now.abs_diff(mono) < 5_000_000, "{now} vs {mono}");
    }
}
