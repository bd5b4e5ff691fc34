//! The counter calibration a trace file keeps: an anchor (a simultaneous (counter,
//! CLOCK_MONOTONIC) pair) and a frequency, enough to turn any stub timestamp into
//! monotonic nanoseconds. Measured by `record::host::clock`.

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

/// Counter ticks per second between two anchors (none if time did not advance).
pub fn hz_between(a: Anchor, b: Anchor) -> Option<f64> {
    let dt = b.tsc.checked_sub(a.tsc)?;
    let dns = b.monotonic_ns.checked_sub(a.monotonic_ns)?;
    (dns > 0 && dt > 0).then(|| dt as f64 * 1e9 / dns as f64)
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
}
