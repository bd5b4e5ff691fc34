//! Function calls from entry/exit pairs: per-function call counts, total and self
//! time and latency histograms (`tracer report`), and each completed call as a slice
//! (`tracer export`).
//!
//! Per thread a stack of open calls: an entry pushes; an exit pops down to the nearest
//! open call of the same function (calls above it never returned through a traced
//! exit: longjmp, an exception, an untraced exit; they are dropped and counted). A
//! call's self time is its total minus its children's totals.

use std::collections::HashMap;

use serde::Serialize;

use crate::report::Event;

/// Latency histogram buckets: bucket i counts calls of [2^i, 2^(i+1)) ns (bucket 0
/// also 0 ns).
pub const BUCKETS: usize = 40;

#[derive(Clone, Debug, Serialize)]
pub struct FunctionTime {
    pub binary: String,
    pub function: String,
    /// Calls with both their entry and their exit.
    pub calls: u64,
    pub total_ns: u64,
    pub self_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// Calls per power-of-two latency bucket (see [`BUCKETS`]), trailing zeros cut.
    pub histogram: Vec<u64>,
    /// `file:line` of the function (empty without debug information).
    pub location: String,
    /// (binary id, site) of an entry site of the function.
    #[serde(skip)]
    pub entry_site: Option<(u64, u32)>,
}

/// What one record did to its thread's calls.
#[derive(Default)]
pub struct Step {
    /// An entry: the function whose call began.
    pub began: Option<usize>,
    /// Open calls above the one this exit completes, given up (never exited through a
    /// traced exit); they end here.
    pub abandoned: usize,
    /// An exit: the call it completes.
    pub completed: Option<Slice>,
}

/// A completed call.
pub struct Slice {
    pub pid: u32,
    pub tid: u32,
    pub function: usize,
    pub start_ns: u64,
    pub end_ns: u64,
}

struct Frame {
    function: usize,
    start_ns: u64,
    child_ns: u64,
}

#[derive(Default)]
pub struct Calls {
    index: HashMap<(String, String), usize>,
    /// (binary id, site) → function: one lookup per record, no string hashing.
    by_site: HashMap<(u64, u32), usize>,
    pub functions: Vec<FunctionTime>,
    stacks: HashMap<(u32, u32), Vec<Frame>>,
    /// Exits with no open call of their function.
    pub unmatched_exits: u64,
    /// Calls left open: never exited through a traced exit (dropped from their
    /// stack by a later exit of a caller, or still open at the end).
    pub unfinished: u64,
    /// With [`Calls::folding`]: self time (ns) per call stack (functions, outermost
    /// first), for flame graphs.
    pub folded: Option<HashMap<Vec<usize>, u64>>,
}

impl Calls {
    /// Also sum self time per call stack ([`Calls::folded`]).
    pub fn folding() -> Calls {
        Calls {
            folded: Some(HashMap::new()),
            ..Calls::default()
        }
    }

    fn function(&mut self, binary: &str, name: &str) -> usize {
        let key = (binary.to_string(), name.to_string());
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        self.functions.push(FunctionTime {
            binary: key.0.clone(),
            function: key.1.clone(),
            calls: 0,
            total_ns: 0,
            self_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            histogram: vec![0; BUCKETS],
            location: String::new(),
            entry_site: None,
        });
        self.index.insert(key, self.functions.len() - 1);
        self.functions.len() - 1
    }

    /// Take one record.
    pub fn event(&mut self, ev: &Event) -> Step {
        let entry = match ev.kind {
            "entry" => true,
            "exit" => false,
            _ => return Step::default(),
        };
        let f = match self.by_site.get(&(ev.binary_id, ev.rec.site)) {
            Some(&f) => f,
            None => {
                let f = self.function(ev.binary, ev.symbol);
                self.by_site.insert((ev.binary_id, ev.rec.site), f);
                f
            }
        };
        if entry && self.functions[f].entry_site.is_none() {
            self.functions[f].entry_site = Some((ev.binary_id, ev.rec.site));
        }
        let stack = self.stacks.entry((ev.pid, ev.tid)).or_default();
        if entry {
            stack.push(Frame {
                function: f,
                start_ns: ev.time_ns,
                child_ns: 0,
            });
            return Step {
                began: Some(f),
                ..Step::default()
            };
        }
        let Some(at) = stack.iter().rposition(|fr| fr.function == f) else {
            self.unmatched_exits += 1;
            return Step::default();
        };
        let abandoned = stack.len() - at - 1;
        self.unfinished += abandoned as u64;
        stack.truncate(at + 1);
        let Some(frame) = stack.pop() else {
            return Step::default();
        };
        let total = ev.time_ns.saturating_sub(frame.start_ns);
        if let Some(folded) = &mut self.folded {
            let path: Vec<usize> = stack.iter().map(|fr| fr.function).chain([f]).collect();
            *folded.entry(path).or_default() += total.saturating_sub(frame.child_ns);
        }
        if let Some(parent) = stack.last_mut() {
            parent.child_ns += total;
        }
        let t = &mut self.functions[f];
        t.calls += 1;
        t.total_ns += total;
        t.self_ns += total.saturating_sub(frame.child_ns);
        t.min_ns = t.min_ns.min(total);
        t.max_ns = t.max_ns.max(total);
        let bucket = (63 - total.max(1).leading_zeros() as usize).min(BUCKETS - 1);
        t.histogram[bucket] += 1;
        Step {
            began: None,
            abandoned,
            completed: Some(Slice {
                pid: ev.pid,
                tid: ev.tid,
                function: f,
                start_ns: frame.start_ns,
                end_ns: ev.time_ns,
            }),
        }
    }

    /// Calls still open per thread (for closing them at the end of a trace).
    pub fn open_calls(&self) -> impl Iterator<Item = ((u32, u32), usize)> + '_ {
        self.stacks.iter().map(|(&t, s)| (t, s.len()))
    }

    /// Close the books: calls still open count as unfinished; the functions that were
    /// called, by total time (largest first), histograms trimmed.
    pub fn finish(mut self) -> (Vec<FunctionTime>, u64, u64) {
        self.unfinished += self.stacks.values().map(|s| s.len() as u64).sum::<u64>();
        let mut fs: Vec<FunctionTime> = self
            .functions
            .into_iter()
            .filter(|f| f.calls > 0)
            .map(|mut f| {
                let keep = f
                    .histogram
                    .iter()
                    .rposition(|&n| n != 0)
                    .map_or(0, |i| i + 1);
                f.histogram.truncate(keep);
                f
            })
            .collect();
        fs.sort_by(|a, b| {
            b.total_ns
                .cmp(&a.total_ns)
                .then_with(|| a.function.cmp(&b.function))
        });
        (fs, self.unmatched_exits, self.unfinished)
    }
}
