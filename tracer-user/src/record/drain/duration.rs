//! The duration filter (`--min-duration`) of the `--user` drain: the eBPF drain's
//! algorithm (`tracer_common::duration::judge`) run on the records a thread hands
//! over, with a stack per thread and binary kept here.

use std::collections::HashMap;

use tracer_common::{
    RECORD_SIZE, Record,
    duration::{CallStack, Verdict, call_sites, judge},
    ebpf::MAX_CALL_STACKS,
    meta::{Metadata, TimeMode},
};

/// What the filter counted (the eBPF drain's `STAT_*` of the same names).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DurationCounts {
    /// Records not written: held entries (until released) and short calls' exits.
    pub filtered: u64,
    /// Held entries written later.
    pub released: u64,
    pub calls_short: u64,
    pub calls_deep: u64,
    /// Records passed unjudged: their thread found the stacks full.
    pub unjudged: u64,
}

pub(crate) struct DurationFilter {
    /// Cycle-counter ticks.
    threshold: u64,
    /// binary_id → site → `call_site_info`.
    sites: HashMap<u64, HashMap<u32, u64>>,
    /// (pid_tid, binary_id) → open calls.
    stacks: HashMap<(u64, u64), Box<CallStack>>,
    pub counts: DurationCounts,
}

impl DurationFilter {
    pub(crate) fn new(threshold: u64) -> DurationFilter {
        DurationFilter {
            threshold,
            sites: HashMap::new(),
            stacks: HashMap::new(),
            counts: DurationCounts::default(),
        }
    }

    /// Judge the calls of `binary_id` (described by `meta`); `Err`: its time mode, whose
    /// entries carry no clock (its calls then pass).
    pub(crate) fn add_binary(&mut self, binary_id: u64, meta: &Metadata) -> Result<(), TimeMode> {
        if meta.time_mode != TimeMode::Record {
            return Err(meta.time_mode);
        }
        self.sites
            .insert(binary_id, call_sites(meta).into_iter().collect());
        Ok(())
    }

    /// The records of `records` (whole records of thread `pid_tid` in binary
    /// `binary_id`, in order) to write, with the held entries they release.
    pub(crate) fn filter(&mut self, pid_tid: u64, binary_id: u64, records: &[u8]) -> Vec<u8> {
        let Some(sites) = self.sites.get(&binary_id) else {
            return records.to_vec();
        };
        let key = (pid_tid, binary_id);
        // A message's tid is the sender's label: a hostile program could name a new
        // thread in each. Beyond the eBPF drain's bound, new threads pass unjudged.
        if !self.stacks.contains_key(&key) && self.stacks.len() >= MAX_CALL_STACKS as usize {
            self.counts.unjudged += (records.len() / RECORD_SIZE) as u64;
            return records.to_vec();
        }
        let stack = self
            .stacks
            .entry(key)
            .or_insert_with(|| Box::new(CallStack::EMPTY));
        let mut out = Vec::with_capacity(records.len());
        for raw in records.chunks_exact(RECORD_SIZE) {
            // SAFETY: Record is repr(C) plain data of RECORD_SIZE bytes, any bits valid.
            let r: Record = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
            let info = sites.get(&r.site).copied().unwrap_or(0);
            let keep = match judge(stack, &r, info, self.threshold) {
                Verdict::Keep => true,
                Verdict::Deep => {
                    self.counts.calls_deep += 1;
                    true
                }
                Verdict::Hold => false,
                Verdict::Short => {
                    self.counts.calls_short += 1;
                    false
                }
                Verdict::Release { from, to, keep } => {
                    let held = stack.entries.get(from as usize..to as usize).unwrap_or(&[]);
                    for e in held {
                        out.extend_from_slice(record_bytes(e));
                    }
                    self.counts.released += held.len() as u64;
                    keep
                }
            };
            if keep {
                out.extend_from_slice(raw);
            } else {
                self.counts.filtered += 1;
            }
        }
        out
    }

    /// Process `pid` exec'ed: its threads' stacks go (their held entries stay filtered).
    pub(crate) fn forget_process(&mut self, pid: u32) {
        self.stacks
            .retain(|&(pid_tid, _), _| (pid_tid >> 32) as u32 != pid);
    }

    /// Thread `tid` is gone: its stacks go (their held entries stay filtered).
    pub(crate) fn forget_thread(&mut self, tid: u32) {
        self.stacks.retain(|&(pid_tid, _), _| pid_tid as u32 != tid);
    }
}

fn record_bytes(r: &Record) -> &[u8] {
    // SAFETY: Record is repr(C) plain data without padding, RECORD_SIZE bytes.
    unsafe { std::slice::from_raw_parts((r as *const Record).cast(), RECORD_SIZE) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::meta::{Site, SiteKind, SiteMode};

    fn record(site: u32, time: u64) -> [u8; RECORD_SIZE] {
        let r = Record {
            site,
            flags: 0,
            time,
            value: 0,
            aux: 0,
        };
        record_bytes(&r).try_into().unwrap()
    }

    #[test]
    fn thread_labels_cannot_grow_the_stacks_without_bound() {
        let site = |id, kind| Site {
            id,
            vaddr: 0,
            file_off: 0,
            name: "f".into(),
            kind,
            mode: SiteMode::Inline,
            nargs: 0,
        };
        let meta = Metadata {
            sites: vec![
                site(0, SiteKind::FunctionEntry),
                site(1, SiteKind::FunctionExit),
            ],
            ..Default::default()
        };
        let mut d = DurationFilter::new(100);
        d.add_binary(7, &meta).unwrap();
        // An entry held per label, 10,000 labels.
        for tid in 0..10_000u64 {
            assert!(d.filter(tid, 7, &record(0, 1)).is_empty() || tid >= MAX_CALL_STACKS as u64);
        }
        assert_eq!(d.stacks.len(), MAX_CALL_STACKS as usize);
        assert_eq!(d.counts.unjudged, 10_000 - u64::from(MAX_CALL_STACKS));
        // A known thread goes on: its long call releases its entry before the exit.
        let out = d.filter(3, 7, &record(1, 500));
        assert_eq!(out.len(), 2 * RECORD_SIZE);
        d.forget_thread(3);
        assert_eq!(d.stacks.len(), MAX_CALL_STACKS as usize - 1);
    }
}
