//! The cycle counter the inline stubs store (`rdtsc` on x86-64, `cntvct_el0` on
//! AArch64) against CLOCK_MONOTONIC, which is what `bpf_ktime_get_ns()` (uprobe-site
//! records) returns and what reports show.
//!
//! A session takes an anchor (a simultaneous (counter, monotonic ns) pair) and a short
//! calibration of the counter frequency at the start, and another anchor at the end;
//! with both anchors the frequency over the whole session is used.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A counter reading and the CLOCK_MONOTONIC time taken at the same moment.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Anchor {
    pub tsc: u64,
    pub monotonic_ns: u64,
}

/// Counter frequency and one anchor: enough to convert any counter value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub tsc_hz: f64,
    pub anchor: Anchor,
}

/// Sessions shorter than this keep the start calibration rather than the end-to-end one.
const MIN_REFINE_NS: u64 = 200_000_000;

#[cfg(target_arch = "x86_64")]
pub fn read_counter() -> u64 {
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

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The tightest of a few (counter, clock, counter) brackets, counter at the midpoint.
pub fn anchor() -> Anchor {
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

fn hz_between(a: Anchor, b: Anchor) -> Option<f64> {
    let dt = b.tsc.checked_sub(a.tsc)?;
    let dns = b.monotonic_ns.checked_sub(a.monotonic_ns)?;
    (dns > 0 && dt > 0).then(|| dt as f64 * 1e9 / dns as f64)
}

/// Measure the counter frequency over `interval` (blocking).
pub fn calibrate(interval: Duration) -> Calibration {
    let a = anchor();
    std::thread::sleep(interval);
    let b = anchor();
    Calibration {
        tsc_hz: hz_between(a, b).unwrap_or(1e9),
        anchor: b,
    }
}

impl Calibration {
    /// Use the frequency between the start anchor and `end` when the session was long
    /// enough for that to beat the short start calibration.
    pub fn refined(&self, end: Option<Anchor>) -> Calibration {
        match end {
            Some(end) if end.monotonic_ns >= self.anchor.monotonic_ns + MIN_REFINE_NS => {
                Calibration {
                    tsc_hz: hz_between(self.anchor, end).unwrap_or(self.tsc_hz),
                    anchor: self.anchor,
                }
            }
            _ => *self,
        }
    }

    /// CLOCK_MONOTONIC nanoseconds of a counter value (saturating at 0).
    pub fn monotonic_ns_of(&self, tsc: u64) -> u64 {
        let dt = tsc as i128 - self.anchor.tsc as i128;
        let dns = (dt as f64 * 1e9 / self.tsc_hz).round() as i128;
        (self.anchor.monotonic_ns as i128 + dns).clamp(0, u64::MAX as i128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion() {
        let c = Calibration {
            tsc_hz: 2e9,
            anchor: Anchor {
                tsc: 1_000_000,
                monotonic_ns: 5_000,
            },
        };
        assert_eq!(c.monotonic_ns_of(1_000_000), 5_000);
        assert_eq!(c.monotonic_ns_of(1_002_000), 6_000);
        assert_eq!(c.monotonic_ns_of(998_000), 4_000);
        assert_eq!(c.monotonic_ns_of(0), 0);
        let end = Anchor {
            tsc: 1_000_000 + 3_000_000_000,
            monotonic_ns: 5_000 + 1_000_000_000,
        };
        assert_eq!(c.refined(Some(end)).tsc_hz, 3e9);
        assert_eq!(c.refined(None), c);
    }

    #[test]
    fn counter_runs_with_the_clock() {
        let c = calibrate(Duration::from_millis(20));
        assert!(c.tsc_hz > 1e6, "{}", c.tsc_hz);
        let now = c.monotonic_ns_of(read_counter());
        let mono = monotonic_ns();
        assert!(now.abs_diff(mono) < 5_000_000, "{now} vs {mono}");
    }
}
