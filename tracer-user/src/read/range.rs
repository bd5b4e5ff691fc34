//! `--since/--until` of `report`, `export`, `flamegraph` and `dump`: the records whose
//! time (as `dump` prints it, CLOCK_MONOTONIC ns) is in `[since, until)`. A point is
//! seconds from the session's start (`1.5`, `1.5s`, `250ms`, `40us`, `100ns`; the
//! start is the clock anchor of the session header) or an absolute CLOCK_MONOTONIC time
//! in ns after `@` (`@123456789000`). A call cut by a bound keeps its part inside (an
//! exit without its entry counts as the report's "exits with no open call").
//!
//!
//! Reading a range decodes only the sections of chunks that may hold a record inside
//! it ([`RangeSkip`]; the others a file reader seeks over): a chunk's records were
//! written between its thread's previous drain and its own (the drains' clock samples
//! are in the chunk headers, which are read without unpacking), give or take
//! [`margin_ns`] for the cycle counter's calibration. A finished trace in one file has
//! that span of every section of chunks in its index (`tracefile/index.rs`): those
//! outside the range are passed over without reading even their headers, so a range
//! costs its own sections, the file's other sections (binaries, names) and the index.
//! Binaries whose record times come from the drains (coarse, block) are always decoded.
//!
//! ```text
//! $ tracer report --since 2s --until 2.5s app.utrace
//! ```

use anyhow::{Result, bail};
use tracer_common::ChunkHeader;

use crate::tracefile::{Drains, IndexEntry};

/// One bound of a range, as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimePoint {
    /// ns after the session's start.
    FromStart(u64),
    /// CLOCK_MONOTONIC ns.
    Monotonic(u64),
}

impl std::str::FromStr for TimePoint {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<TimePoint> {
        let s = s.trim();
        if let Some(abs) = s.strip_prefix('@') {
            return match abs.parse() {
                Ok(ns) => Ok(TimePoint::Monotonic(ns)),
                Err(_) => bail!("{s:?}: expected @ and CLOCK_MONOTONIC nanoseconds"),
            };
        }
        let (num, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
            .iter()
            .find_map(|(unit, scale)| s.strip_suffix(unit).map(|n| (n, *scale)))
            .unwrap_or((s, 1e9));
        match num.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(TimePoint::FromStart((v * scale) as u64)),
            _ => bail!(
                "{s:?}: expected a time from the session's start (1.5, 1.5s, 250ms, 40us, \
                 100ns) or @ and CLOCK_MONOTONIC nanoseconds"
            ),
        }
    }
}

/// `--since/--until` as given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeRange {
    pub since: Option<TimePoint>,
    pub until: Option<TimePoint>,
}

impl TimeRange {
    /// Every record.
    pub const ALL: TimeRange = TimeRange {
        since: None,
        until: None,
    };

    /// The range in CLOCK_MONOTONIC ns for a session that started at `start_ns`.
    pub(crate) fn window(&self, start_ns: u64) -> Window {
        let abs = |p: TimePoint| match p {
            TimePoint::FromStart(ns) => start_ns.saturating_add(ns),
            TimePoint::Monotonic(ns) => ns,
        };
        Window {
            lo: self.since.map_or(0, abs),
            hi: self.until.map_or(u64::MAX, abs),
        }
    }
}

/// A range in CLOCK_MONOTONIC ns, `[lo, hi)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    lo: u64,
    hi: u64,
}

impl Window {
    /// Every time (before the session header says when the session started).
    pub(crate) const ALL: Window = Window {
        lo: 0,
        hi: u64::MAX,
    };

    pub(crate) fn contains(&self, t: u64) -> bool {
        self.lo <= t && t < self.hi
    }

    /// Whether `[lo, hi]` meets the window.
    fn meets(&self, lo: u64, hi: u64) -> bool {
        lo < self.hi && hi >= self.lo
    }
}

/// How far a record's time, from the cycle counter and the session's calibration, may
/// stray from the drain samples around it (kernel time): 50 ms and 0.1 % of the time
/// since the start (clock slew).
fn margin_ns(t: u64, start_ns: u64) -> u64 {
    50_000_000 + t.saturating_sub(start_ns) / 1000
}

/// Which sections of chunks a reader of a range need not decode (see the module
/// documentation). Sees every chunk header of the file in order, decoded or not, except
/// those of sections the file's index let the reader pass over ([`RangeSkip::keeps`]):
/// a drain it does not see leaves the next chunk of its thread an older drain before
/// it, so a wider span, never a narrower one.
pub(crate) struct RangeSkip {
    range: TimeRange,
    window: Window,
    start_ns: u64,
    drains: Drains,
}

impl RangeSkip {
    pub(crate) fn new(range: &TimeRange) -> RangeSkip {
        RangeSkip {
            range: *range,
            window: Window::ALL,
            start_ns: 0,
            drains: Drains::default(),
        }
    }

    /// The session header: when the session started.
    pub(crate) fn session(&mut self, start_ns: u64) {
        self.start_ns = start_ns;
        self.window = self.range.window(start_ns);
    }

    /// A chunk read: its drain is its thread's last.
    pub(crate) fn note(&mut self, h: &ChunkHeader) {
        self.drains.note(h);
    }

    /// Whether no chunk of `headers` (a section, noted here) can hold a record in the
    /// range; `interpolated(binary)`: its records take their times from the drains.
    pub(crate) fn skip(
        &mut self,
        headers: &[ChunkHeader],
        interpolated: impl Fn(u64) -> bool,
    ) -> bool {
        let mut skip = self.range != TimeRange::ALL;
        for h in headers {
            let (lo, hi) = self.drains.span(h);
            if interpolated(h.binary_id) || self.meets(lo, hi) {
                skip = false;
            }
        }
        skip
    }

    /// Whether records of times `[lo, hi]` (drain samples) may be in the range.
    fn meets(&self, lo: u64, hi: u64) -> bool {
        let m = margin_ns(hi, self.start_ns);
        self.window
            .meets(lo.saturating_sub(m), hi.saturating_add(m))
    }

    /// For [`crate::tracefile::Reader::only`], once the session header is read: the sections of chunks
    /// of a file's index to read (None: all of them, no range).
    pub(crate) fn keeps(&self) -> Option<impl Fn(&IndexEntry) -> bool + 'static> {
        let (window, start_ns) = (self.window, self.start_ns);
        (self.range != TimeRange::ALL).then_some(move |e: &IndexEntry| {
            let m = margin_ns(e.hi, start_ns);
            e.interpolated() || window.meets(e.lo.saturating_sub(m), e.hi.saturating_add(m))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse_in_their_units() {
        let p = |s: &str| s.parse::<TimePoint>().unwrap();
        assert_eq!(p("1.5"), TimePoint::FromStart(1_500_000_000));
        assert_eq!(p("1.5s"), TimePoint::FromStart(1_500_000_000));
        assert_eq!(p("250ms"), TimePoint::FromStart(250_000_000));
        assert_eq!(p("40us"), TimePoint::FromStart(40_000));
        assert_eq!(p("100ns"), TimePoint::FromStart(100));
        assert_eq!(p("@123"), TimePoint::Monotonic(123));
        for bad in ["", "-1", "x", "1.5m", "@1.5", "inf"] {
            assert!(bad.parse::<TimePoint>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_window_is_half_open_from_the_start() {
        let r = TimeRange {
            since: Some(TimePoint::FromStart(10)),
            until: Some(TimePoint::Monotonic(1030)),
        };
        let w = r.window(1000);
        assert!(!w.contains(1009) && w.contains(1010) && w.contains(1029) && !w.contains(1030));
        assert!(TimeRange::ALL.window(5).contains(0));
    }
}
