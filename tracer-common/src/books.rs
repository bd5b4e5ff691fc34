//! The books: what the eBPF programs count in the per-CPU `STATS` map (one index per
//! counter, `STAT_*`), and the rule they keep: every record produced is delivered,
//! filtered or dropped, exactly once.
//!
//! One definition of the counter indices and of the rule (`Books::balanced`): the eBPF
//! drains count, the report checks. The user-space drain counts every record it takes out
//! of a buffer produced and delivered. What never reached a drain is counted apart: a
//! program that waited in vain for the tracer to attach its binary (its 10 s ran out, e.g.
//! a qemu-user guest under a kernel session) is "lost before attach"
//! (`FinalStats::unattached`: programs, not records).

/// Records sent to the ring buffer.
pub const STAT_RECORDS_DELIVERED: u32 = 0;
/// Records that were in a buffer but found no room in the ring buffer.
pub const STAT_RECORDS_DROPPED: u32 = 1;
/// Chunks of records sent to the ring buffer.
pub const STAT_CHUNKS: u32 = 2;
/// Drains that could not read the user buffer (bad pointer, page not present).
pub const STAT_READ_ERRORS: u32 = 3;
/// Records skipped because an earlier drain already delivered them.
pub const STAT_RECORDS_SKIPPED: u32 = 4;
/// Flushes of a process that has more than `ebpf::TABLE_BINARIES` instrumented
/// binaries, whose extra RW areas the exit and uprobe-site programs cannot find.
pub const STAT_TABLE_FULL: u32 = 5;
/// Records a filter (`filter::FilterConfig`) did not keep.
pub const STAT_RECORDS_FILTERED: u32 = 6;
/// Records taken out of buffers (or emitted at uprobe sites): each one is then
/// delivered, filtered or dropped (also when its buffer could not be read).
pub const STAT_RECORDS_PRODUCED: u32 = 7;
/// Flushes the drain held back for want of room in the ring buffer (`--on-full
/// wait`): the thread waited and flushed again.
pub const STAT_HOLDS: u32 = 8;
/// Flushes that found no `TABLES` entry for their process and could not add one: the
/// process's user already holds `ebpf::TABLES_PER_UID` entries (its threads are not
/// drained at exit; counted at each such flush).
pub const STAT_TABLE_SHARE: u32 = 9;
/// Entries held by the duration filter (counted filtered when drained) and written
/// later, when a call that lasted long enough ended (`duration`): delivered or dropped
/// then, so the records filtered are `STAT_RECORDS_FILTERED` minus these.
pub const STAT_RECORDS_RELEASED: u32 = 10;
/// Calls the duration filter dropped (entry and exit) as shorter than its threshold.
pub const STAT_CALLS_SHORT: u32 = 11;
/// Entries the duration filter passed unjudged: deeper than `duration::CALL_DEPTH`.
pub const STAT_CALLS_DEEP: u32 = 12;
/// Entries of `STATS`.
pub const STAT_COUNT: u32 = 13;

/// The record counters of a session, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Books {
    pub produced: u64,
    pub delivered: u64,
    pub filtered: u64,
    pub dropped: u64,
}

impl Books {
    /// The books rule: produced = delivered + filtered + dropped.
    pub const fn balanced(&self) -> bool {
        match self.delivered.checked_add(self.filtered) {
            Some(out) => match out.checked_add(self.dropped) {
                Some(out) => out == self.produced,
                None => false,
            },
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_books() {
        let books = Books {
            produced: 10,
            delivered: 6,
            filtered: 3,
            dropped: 1,
        };
        assert!(books.balanced());
        assert!(
            !Books {
                dropped: 2,
                ..books
            }
            .balanced()
        );
        assert!(
            !Books {
                delivered: u64::MAX,
                ..books
            }
            .balanced()
        );
    }
}
