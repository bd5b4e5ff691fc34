//! Function calls from entry/exit pairs: per-function call counts, total and self
//! time and latency histograms (`tracer report`), and each completed call as a slice
//! (`tracer export`).
//!
//! Per thread a stack of open calls: an entry pushes; an exit pops down to the nearest
//! open call of the same function (calls above it never returned through a traced
//! exit: an untraced exit, or unwinding the trace did not see land; they are dropped
//! and counted). Unwinding ends calls where control lands: a landing record (an
//! exception's landing pad, a `setjmp` return) ends every call above its function's
//! innermost open call, a resume record (`_Unwind_Resume`) that call too, each as a
//! call left by unwinding whose time runs to the landing. Each record costs the same
//! however many calls are left open below (see [`Stack`]). A
//! call's self time is its total minus its children's totals; a recursive function's
//! total time counts its outermost calls only, so no time is counted twice.
//!
//! Calls of an interpreted program (`lang`: Python's function__entry/return) share the
//! stack with the interpreter's functions, but the two do not nest strictly: the probe
//! that begins a Python call fires inside a C helper (CPython's
//! `dtrace_function_entry`) that returns while the call goes on. So an exit gives up
//! only open calls of its own kind above it; those of the other kind move down to its
//! caller. Each kind on its own nests strictly, and a C function called by Python code
//! is the child of that Python call.
//!
//! A landing looks through at most 256 open calls of its function for its frame
//! (`FLAG_FRAME`): a program writes its own records, and forged landings must not make
//! reading quadratic. A Python return ends the innermost Python call.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use serde::Serialize;

use crate::read::{
    events::Event,
    lang::{Lang, LangCall, StringStats},
};

/// Marks a [`Frame::key`] of an interpreted program's call (function indices stay
/// below it).
const LANG_KEY: u64 = 1 << 63;

/// Latency histogram buckets: bucket i counts calls of [2^i, 2^(i+1)) ns (bucket 0
/// also 0 ns).
pub(crate) const BUCKETS: usize = 40;

#[derive(Clone, Debug, Serialize)]
pub(crate) struct FunctionTime {
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
    /// Of `calls`, those left by unwinding (an exception, a `longjmp`): they end
    /// where control landed.
    pub unwound: u64,
    /// `file:line` of the function (empty without debug information).
    pub location: String,
    /// (binary id, site) of an entry site of the function.
    #[serde(skip)]
    pub entry_site: Option<(u64, u32)>,
}

impl FunctionTime {
    /// A function of `binary` not called yet.
    fn new(binary: &str, function: String, location: String) -> FunctionTime {
        FunctionTime {
            binary: binary.to_string(),
            function,
            calls: 0,
            total_ns: 0,
            self_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            histogram: vec![0; BUCKETS],
            unwound: 0,
            location,
            entry_site: None,
        }
    }
}

/// What one record did to its thread's calls.
#[derive(Default)]
pub(crate) struct Step {
    /// An entry: the function whose call began.
    pub began: Option<usize>,
    /// Open calls above the one this exit completes, given up (never exited through a
    /// traced exit); they end here.
    pub abandoned: usize,
    /// An exit: the call it completes.
    pub completed: Option<Slice>,
    /// A landing or resume: the calls left by unwinding that end here, innermost
    /// first.
    pub unwound: Vec<Slice>,
}

/// A completed call.
pub(crate) struct Slice {
    pub pid: u32,
    pub tid: u32,
    pub function: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The call's time minus its children's.
    pub self_ns: u64,
    /// Open calls below it on its thread's stack (0: a thread's outermost call).
    pub depth: u32,
    /// The function of the open call below it.
    pub caller: Option<usize>,
    /// An outer call of the same function is still open: this call's time is inside
    /// that one's (the function's total time leaves it out).
    pub reentrant: bool,
}

struct Frame {
    function: usize,
    /// What an exit must name to complete this call: the function, or for a call of
    /// an interpreted program its (file, function) strings (its return's line is not
    /// its entry's).
    key: u64,
    start_ns: u64,
    child_ns: u64,
    /// Its time already counted in a caller's `child_ns`: a call moved down when the
    /// call below it ended (see the module docs), the part inside that one.
    credited: u64,
    /// With [`Calls::folding`]: this call's node in the call-stack tree.
    node: usize,
    /// The index of the next open call below it with the same key, and (a call of an
    /// interpreted program) of the next one of that kind, or [`NONE`]: set by
    /// [`Stack::push`]. (u32: the pile of calls left open stays small.)
    below: u32,
    lang_below: u32,
    /// The low bits of its frame address, when its entry record has them
    /// (`FLAG_FRAME`): a landing in a recursive function ends the calls above the
    /// one whose frame it landed in.
    frame: Option<u16>,
}

/// No call: [`Frame::below`], [`Stack::fns`].
const NONE: u32 = u32::MAX;

/// The most open calls of one function a landing looks through for its frame: a
/// traced program writes its own records, and landings that match no frame must not
/// make reading quadratic in its recursion depth. Deeper, the landing takes the
/// innermost call.
const LANDING_SEARCH: usize = 256;

/// One thread's open calls, innermost last, with what an exit looks up kept at hand:
/// each record costs the same however deep the stack (calls left by an exception or a
/// `longjmp` pile up under the function that caught it until it returns).
#[derive(Default)]
struct Stack {
    frames: Vec<Frame>,
    /// Per function with open calls: the index of its innermost one, and how many. (A
    /// map, not a table by function: memory stays with the open calls, whatever the
    /// number of threads and functions.)
    fns: HashMap<usize, (u32, u32), BuildHasherDefault<IndexHash>>,
    /// The innermost open call of each interpreted program's key, and of any of them.
    top_key: HashMap<u64, u32>,
    top_lang: Option<u32>,
}

/// A hash for the function indices of [`Stack::fns`] (small integers, no attacker
/// choosing them): one multiply.
#[derive(Default)]
struct IndexHash(u64);

impl std::hash::Hasher for IndexHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Stack {
    fn push(&mut self, mut fr: Frame) {
        let at = self.frames.len() as u32;
        let f = self.fns.entry(fr.function).or_insert((NONE, 0));
        f.1 += 1;
        if fr.key & LANG_KEY != 0 {
            fr.below = self.top_key.insert(fr.key, at).unwrap_or(NONE);
            fr.lang_below = self.top_lang.replace(at).unwrap_or(NONE);
        } else {
            fr.below = std::mem::replace(&mut f.0, at);
        }
        self.frames.push(fr);
    }

    fn pop(&mut self) -> Option<Frame> {
        let fr = self.frames.pop()?;
        if fr.key & LANG_KEY != 0 {
            match fr.below {
                NONE => self.top_key.remove(&fr.key),
                b => self.top_key.insert(fr.key, b),
            };
            self.top_lang = (fr.lang_below != NONE).then_some(fr.lang_below);
        }
        if let Some(f) = self.fns.get_mut(&fr.function) {
            if fr.key & LANG_KEY == 0 {
                f.0 = fr.below;
            }
            f.1 -= 1;
            if f.1 == 0 {
                self.fns.remove(&fr.function);
            }
        }
        Some(fr)
    }

    /// The calls from index `at` up, taken off, outermost first.
    fn split_off(&mut self, at: usize) -> Vec<Frame> {
        let mut above = Vec::with_capacity(self.frames.len().saturating_sub(at));
        while self.frames.len() > at {
            above.extend(self.pop());
        }
        above.reverse();
        above
    }

    /// The innermost open call named `key`.
    fn innermost(&self, key: u64) -> Option<usize> {
        let at = if key & LANG_KEY != 0 {
            *self.top_key.get(&key)?
        } else {
            self.fns.get(&(key as usize))?.0
        };
        (at != NONE).then_some(at as usize)
    }

    /// The innermost open call of function `f` whose frame address bits are `bits`
    /// among its [`LANDING_SEARCH`] innermost, else its innermost (a recursive
    /// function's calls share their sites; unwinding lands in the frame that catches,
    /// not always the innermost).
    fn landed(&self, f: usize, bits: Option<u16>) -> Option<usize> {
        let top = self.innermost(f as u64)?;
        let Some(bits) = bits else {
            return Some(top);
        };
        let mut at = top as u32;
        for _ in 0..LANDING_SEARCH {
            if at == NONE {
                break;
            }
            let fr = &self.frames[at as usize];
            if fr.frame == Some(bits) {
                return Some(at as usize);
            }
            at = fr.below;
        }
        Some(top)
    }

    /// The innermost open call of an interpreted program.
    fn innermost_lang(&self) -> Option<usize> {
        self.top_lang.map(|i| i as usize)
    }

    fn is_open(&self, function: usize) -> bool {
        self.fns.contains_key(&function)
    }

    fn last(&self) -> Option<&Frame> {
        self.frames.last()
    }

    fn last_mut(&mut self) -> Option<&mut Frame> {
        self.frames.last_mut()
    }

    fn len(&self) -> usize {
        self.frames.len()
    }
}

#[derive(Default)]
pub(crate) struct Calls {
    index: HashMap<(u64, String), usize>,
    /// (binary id, site) → function: one lookup per record, no string hashing.
    by_site: HashMap<(u64, u32), usize>,
    /// (binary id, file, function, line) of an interpreted program → function.
    by_lang: HashMap<(u64, u32, u32, u32), usize>,
    pub functions: Vec<FunctionTime>,
    stacks: HashMap<(u32, u32), Stack>,
    /// Exits with no open call of their function.
    pub unmatched_exits: u64,
    /// Returns of an interpreted program's calls that name another function than the
    /// call they end (its entry's name is kept).
    pub renamed_returns: u64,
    /// What the trace's string sections said, as of the last record.
    pub strings: StringStats,
    /// Calls left open: never exited through a traced exit (dropped from their
    /// stack by a later exit of a caller, or still open at the end).
    pub unfinished: u64,
    /// Calls left by unwinding, ended by a landing or resume record.
    pub unwound: u64,
    /// With [`Calls::folding`]: the call-stack tree with self time per node, for
    /// flame graphs (a tree, not a map of whole stacks: deep recursion stays linear).
    pub folded: Option<StackTree>,
}

/// Call stacks as a tree: node 0 is the root; each other node is a function called
/// from its parent node. Stacks deeper than [`MAX_STACK_DEPTH`] (deep recursion) end
/// in their frame at that depth, which takes the time of the calls below it.
#[derive(Default)]
pub(crate) struct StackTree {
    /// (parent node, function, self time ns, depth) per node; node 0 is the root.
    pub nodes: Vec<(usize, usize, u64, u32)>,
    children: HashMap<(usize, usize), usize>,
}

pub(crate) const MAX_STACK_DEPTH: u32 = 512;

impl StackTree {
    fn child(&mut self, parent: usize, function: usize) -> usize {
        if self.nodes.is_empty() {
            self.nodes.push((0, usize::MAX, 0, 0));
        }
        let depth = self.nodes[parent].3 + 1;
        if depth > MAX_STACK_DEPTH {
            return parent;
        }
        *self.children.entry((parent, function)).or_insert_with(|| {
            self.nodes.push((parent, function, 0, depth));
            self.nodes.len() - 1
        })
    }

    /// The functions of `node`'s stack, outermost first.
    pub(crate) fn path(&self, mut node: usize) -> Vec<usize> {
        let mut path = Vec::new();
        while node != 0 {
            let (parent, function, ..) = self.nodes[node];
            path.push(function);
            node = parent;
        }
        path.reverse();
        path
    }
}

/// End `frame`, just taken off `stack`, at `time_ns`: its function's counts and times,
/// its time into its caller's children and (folding) its stack's self time.
fn end_call(
    functions: &mut [FunctionTime],
    folded: &mut Option<StackTree>,
    stack: &mut Stack,
    frame: Frame,
    ev: &Event,
    time_ns: u64,
) -> Slice {
    let f = frame.function;
    let total = time_ns.saturating_sub(frame.start_ns);
    if let Some(tree) = folded {
        let n = &mut tree.nodes[frame.node].2;
        *n = n.saturating_add(total.saturating_sub(frame.child_ns));
    }
    if let Some(parent) = stack.last_mut() {
        // Saturating: a corrupt trace's times may sum past u64.
        parent.child_ns = parent
            .child_ns
            .saturating_add(total.saturating_sub(frame.credited));
    }
    // A recursive function's total counts its outermost calls only (the inner ones
    // are inside it already); each call still has its own latency.
    let outermost = !stack.is_open(f);
    let t = &mut functions[f];
    t.calls += 1;
    if outermost {
        t.total_ns = t.total_ns.saturating_add(total);
    }
    let own = total.saturating_sub(frame.child_ns);
    t.self_ns = t.self_ns.saturating_add(own);
    t.min_ns = t.min_ns.min(total);
    t.max_ns = t.max_ns.max(total);
    let bucket = (63 - total.max(1).leading_zeros() as usize).min(BUCKETS - 1);
    t.histogram[bucket] += 1;
    Slice {
        pid: ev.pid,
        tid: ev.tid,
        function: f,
        start_ns: frame.start_ns,
        end_ns: time_ns,
        self_ns: own,
        depth: stack.len() as u32,
        caller: stack.last().map(|fr| fr.function),
        reentrant: !outermost,
    }
}

impl Calls {
    /// Also sum self time per call stack ([`Calls::folded`]).
    pub(crate) fn folding() -> Calls {
        Calls {
            folded: Some(StackTree::default()),
            ..Calls::default()
        }
    }

    /// The function of `ev`'s site: one per binary and symbol (the raw one: Rust
    /// instantiations differing only in their hash demangle alike).
    fn function(&mut self, ev: &Event) -> usize {
        let key = (ev.binary_id, ev.raw_symbol.to_string());
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        self.functions.push(FunctionTime::new(
            ev.binary,
            ev.symbol.to_string(),
            String::new(),
        ));
        self.index.insert(key, self.functions.len() - 1);
        self.functions.len() - 1
    }

    /// The function of a call of an interpreted program (`file:function:line`).
    fn lang_function(&mut self, ev: &Event, c: &LangCall, lang: &Lang) -> usize {
        let key = (ev.binary_id, c.file, c.function, c.line);
        if let Some(&f) = self.by_lang.get(&key) {
            return f;
        }
        let (file, function) = (lang.text(c.file), lang.text(c.function));
        self.functions.push(FunctionTime::new(
            ev.binary,
            format!("{file}:{function}:{}", c.line),
            format!("{file}:{}", c.line),
        ));
        let f = self.functions.len() - 1;
        self.by_lang.insert(key, f);
        f
    }

    /// Take one record.
    pub(crate) fn event(&mut self, ev: &Event) -> Step {
        self.strings = ev.strings.stats;
        if let Some(c) = ev.lang {
            let key = LANG_KEY | u64::from(c.file) << 32 | u64::from(c.function);
            let f = if c.entry {
                self.lang_function(ev, &c, ev.strings)
            } else {
                usize::MAX
            };
            return self.step(ev, f, key, c.entry, c.time_ns);
        }
        let entry = match ev.kind {
            // An entry of a function without exit sites never completes: not a call.
            "entry" if ev.paired => true,
            "exit" | "landing" | "resume" => false,
            _ => return Step::default(),
        };
        let f = match self.by_site.get(&(ev.binary_id, ev.rec.site)) {
            Some(&f) => f,
            None => {
                let f = self.function(ev);
                self.by_site.insert((ev.binary_id, ev.rec.site), f);
                f
            }
        };
        if entry && self.functions[f].entry_site.is_none() {
            self.functions[f].entry_site = Some((ev.binary_id, ev.rec.site));
        }
        match ev.kind {
            "landing" => self.land(ev, f, false),
            "resume" => self.land(ev, f, true),
            _ => self.step(ev, f, f as u64, entry, ev.time_ns),
        }
    }

    /// Unwinding landed in function `f` (`resume`: and goes on past it): the calls
    /// above its innermost open call (and that one too) end here. Nothing when `f`
    /// has no open call (a `setjmp` returning the first time in an untraced caller).
    fn land(&mut self, ev: &Event, f: usize, resume: bool) -> Step {
        let stack = self.stacks.entry((ev.pid, ev.tid)).or_default();
        let Some(at) = stack.landed(f, tracer_common::frame_bits(ev.rec.flags)) else {
            return Step::default();
        };
        let keep = if resume { at } else { at + 1 };
        let mut unwound = Vec::with_capacity(stack.len() - keep);
        while stack.len() > keep {
            let Some(frame) = stack.pop() else { break };
            let (function, folded) = (&mut self.functions, &mut self.folded);
            let s = end_call(function, folded, stack, frame, ev, ev.time_ns);
            function[s.function].unwound += 1;
            unwound.push(s);
        }
        self.unwound += unwound.len() as u64;
        Step {
            unwound,
            ..Step::default()
        }
    }

    /// An entry of function `f` or an exit of the open call named `key`, at `time_ns`.
    fn step(&mut self, ev: &Event, f: usize, key: u64, entry: bool, time_ns: u64) -> Step {
        if entry {
            self.enter(ev, f, key, time_ns)
        } else {
            self.exit(ev, key, time_ns)
        }
    }

    /// An entry of function `f`: a call named `key` opens at `time_ns`.
    fn enter(&mut self, ev: &Event, f: usize, key: u64, time_ns: u64) -> Step {
        let stack = self.stacks.entry((ev.pid, ev.tid)).or_default();
        let node = match &mut self.folded {
            Some(tree) => tree.child(stack.last().map_or(0, |fr| fr.node), f),
            None => 0,
        };
        stack.push(Frame {
            function: f,
            key,
            start_ns: time_ns,
            child_ns: 0,
            credited: 0,
            node,
            below: NONE,
            lang_below: NONE,
            frame: match key & LANG_KEY {
                0 => tracer_common::frame_bits(ev.rec.flags),
                _ => None,
            },
        });
        Step {
            began: Some(f),
            ..Step::default()
        }
    }

    /// An exit of the open call named `key`, at `time_ns`.
    fn exit(&mut self, ev: &Event, key: u64, time_ns: u64) -> Step {
        let stack = self.stacks.entry((ev.pid, ev.tid)).or_default();
        // The nearest open call of the same name; for a return of an interpreted
        // program with none, its innermost open call (their calls nest strictly: a
        // string that changed before the return's buffer was drained renamed it).
        let lang = key & LANG_KEY != 0;
        let found = stack.innermost(key).or_else(|| {
            let innermost = stack.innermost_lang();
            self.renamed_returns += u64::from(lang && innermost.is_some());
            innermost.filter(|_| lang)
        });
        let Some(at) = found else {
            self.unmatched_exits += 1;
            return Step::default();
        };
        // Open calls above it of its own kind never exited; those of the other kind
        // (an interpreter's C code around the probes of a call of its program) are
        // still open, and move down to its caller.
        let (moved, given_up): (Vec<Frame>, Vec<Frame>) = stack
            .split_off(at + 1)
            .into_iter()
            .partition(|fr| (fr.key & LANG_KEY != 0) != lang);
        let abandoned = given_up.len();
        self.unfinished += abandoned as u64;
        let Some(mut frame) = stack.pop() else {
            return Step::default();
        };
        // The lowest moved call is this one's child until now: its part inside this
        // call counts here, and not again in the caller it moves to.
        if let Some(m) = moved.first() {
            let inside = time_ns.saturating_sub(m.start_ns);
            frame.child_ns = frame
                .child_ns
                .saturating_add(inside.saturating_sub(m.credited));
        }
        let completed = end_call(
            &mut self.functions,
            &mut self.folded,
            stack,
            frame,
            ev,
            time_ns,
        );
        for (i, mut fr) in moved.into_iter().enumerate() {
            if i == 0 {
                fr.credited = time_ns.saturating_sub(fr.start_ns);
            }
            if let Some(tree) = &mut self.folded {
                fr.node = tree.child(stack.last().map_or(0, |p| p.node), fr.function);
            }
            stack.push(fr);
        }
        Step {
            began: None,
            abandoned,
            completed: Some(completed),
            unwound: Vec::new(),
        }
    }

    /// Calls still open per thread (for closing them at the end of a trace): of
    /// functions, and of interpreted programs.
    pub(crate) fn open_calls(&self) -> impl Iterator<Item = ((u32, u32), usize, usize)> + '_ {
        self.stacks.iter().map(|(&t, s)| {
            let lang = s.frames.iter().filter(|fr| fr.key & LANG_KEY != 0).count();
            (t, s.len() - lang, lang)
        })
    }

    /// Close the books: calls still open count as unfinished; the functions that were
    /// called, by total time (largest first), histograms trimmed.
    pub(crate) fn finish(mut self) -> (Vec<FunctionTime>, u64, u64) {
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

#[cfg(test)]
mod tests {
    use tracer_common::Record;

    use super::*;

    fn run(events: &[(&'static str, u32, u64)]) -> (Calls, Vec<Step>) {
        run_paired(events, true)
    }

    fn run_paired(events: &[(&'static str, u32, u64)], paired: bool) -> (Calls, Vec<Step>) {
        let mut c = Calls::default();
        let steps = feed(&mut c, events, paired);
        (c, steps)
    }

    /// Feed (kind, site, time) records of one thread to `c`: site 0 = "f", 1 = "g".
    fn feed(c: &mut Calls, events: &[(&'static str, u32, u64)], paired: bool) -> Vec<Step> {
        let events: Vec<_> = events.iter().map(|&(k, s, t)| (k, s, t, None)).collect();
        feed_frames(c, &events, paired)
    }

    /// Feed (kind, site, time, frame address bits) records: site 0 = "f", 1 = "g".
    fn feed_frames(
        c: &mut Calls,
        events: &[(&'static str, u32, u64, Option<u16>)],
        paired: bool,
    ) -> Vec<Step> {
        events
            .iter()
            .map(|&(kind, site, t, frame)| {
                let flags = frame.map_or(0, |b| {
                    tracer_common::FLAG_FRAME | u32::from(b) << tracer_common::FLAG_FRAME_SHIFT
                });
                let rec = Record {
                    site,
                    flags,
                    ..Record::default()
                };
                let name = ["f", "g"][site as usize];
                c.event(&Event {
                    pid: 1,
                    tid: 1,
                    binary_id: 7,
                    comm: "t",
                    binary: "b",
                    symbol: name,
                    raw_symbol: name,
                    paired,
                    kind,
                    rec: &rec,
                    time_ns: t,
                    lang: None,
                    strings: &Lang::default(),
                })
            })
            .collect()
    }

    #[test]
    fn a_landing_ends_the_calls_above_the_frame_it_landed_in() {
        // f (frame 0x100) calls f (0x80), which calls g; an exception thrown in g is
        // caught by the outer f (landing at frame 0x100): g and the inner f end there.
        // Without frame bits the landing would keep the inner f open.
        let mut c = Calls::default();
        let steps = feed_frames(
            &mut c,
            &[
                ("entry", 0, 0, Some(0x100)),
                ("entry", 0, 10, Some(0x80)),
                ("entry", 1, 20, None),
                ("landing", 0, 50, Some(0x100)),
                ("exit", 0, 70, None),
            ],
            true,
        );
        let ended: Vec<(usize, u64, u64)> = steps[3]
            .unwound
            .iter()
            .map(|s| (s.function, s.start_ns, s.end_ns))
            .collect();
        let (f, g) = (0, 1);
        assert_eq!(ended, [(g, 20, 50), (f, 10, 50)]);
        let done = steps[4].completed.as_ref().unwrap();
        assert_eq!((done.start_ns, done.end_ns), (0, 70));
        assert_eq!(c.unwound, 2);
        let (fs, unmatched, unfinished) = c.finish();
        assert_eq!((unmatched, unfinished), (0, 0));
        assert_eq!((get(&fs, "f").calls, get(&fs, "f").unwound), (2, 1));
        assert_eq!((get(&fs, "g").calls, get(&fs, "g").unwound), (1, 1));
        assert_eq!(get(&fs, "f").total_ns, 70);
    }

    #[test]
    fn a_landing_searches_a_bounded_number_of_frames() {
        // 1,000 nested calls of f, frame bits 0..1000 (outermost first). A landing
        // naming a frame within LANDING_SEARCH of the innermost ends the calls above
        // it; one naming a deeper frame (or none: records a program forged) takes the
        // innermost and ends nothing, after looking at LANDING_SEARCH frames at most.
        let mut events: Vec<(&'static str, u32, u64, Option<u16>)> =
            (0..1000).map(|i| ("entry", 0, i, Some(i as u16))).collect();
        events.push(("landing", 0, 2000, Some(0)));
        events.push(("landing", 0, 2001, Some(5000)));
        events.push(("landing", 0, 2002, Some(999 - 100)));
        let mut c = Calls::default();
        let steps = feed_frames(&mut c, &events, true);
        let ended: Vec<usize> = steps[1000..].iter().map(|s| s.unwound.len()).collect();
        assert_eq!(ended, [0, 0, 100]);
        assert!(steps[1002].unwound.iter().all(|s| s.end_ns == 2002));
        assert_eq!(c.unwound, 100);
    }

    #[test]
    fn a_resume_ends_its_own_call_too() {
        // f calls g; g's cleanup runs and resumes unwinding (g ends), then f catches.
        let mut c = Calls::default();
        let steps = feed_frames(
            &mut c,
            &[
                ("entry", 0, 0, Some(0x100)),
                ("entry", 1, 10, Some(0x80)),
                ("resume", 1, 30, Some(0x80)),
                ("landing", 0, 40, Some(0x100)),
                ("exit", 0, 60, None),
            ],
            true,
        );
        assert_eq!(steps[2].unwound.len(), 1);
        assert_eq!(steps[2].unwound[0].end_ns, 30);
        assert!(steps[3].unwound.is_empty());
        let (fs, unmatched, unfinished) = c.finish();
        assert_eq!((unmatched, unfinished), (0, 0));
        assert_eq!((get(&fs, "g").calls, get(&fs, "g").unwound), (1, 1));
        assert_eq!(get(&fs, "f").unwound, 0);
    }

    fn get<'a>(fs: &'a [FunctionTime], name: &str) -> &'a FunctionTime {
        fs.iter().find(|f| f.function == name).unwrap()
    }

    #[test]
    fn nested_calls_self_and_total() {
        // f [0, 100) calls g [10, 40) and g [50, 60).
        let (c, _) = run(&[
            ("entry", 0, 0),
            ("entry", 1, 10),
            ("exit", 1, 40),
            ("entry", 1, 50),
            ("exit", 1, 60),
            ("exit", 0, 100),
        ]);
        let (fs, unmatched, unfinished) = c.finish();
        let (f, g) = (get(&fs, "f"), get(&fs, "g"));
        assert_eq!((f.calls, f.total_ns, f.self_ns), (1, 100, 60));
        assert_eq!((g.calls, g.total_ns, g.self_ns), (2, 40, 40));
        assert_eq!((g.min_ns, g.max_ns), (10, 30));
        assert_eq!(g.histogram, [0, 0, 0, 1, 1]); // 10 in [8,16), 30 in [16,32)
        assert_eq!((unmatched, unfinished), (0, 0));
        assert_eq!(fs[0].function, "f", "sorted by total time");
    }

    #[test]
    fn recursion_counts_the_outermost_call_once() {
        // f [0, 100) → f [10, 90) → f [20, 30).
        let (c, _) = run(&[
            ("entry", 0, 0),
            ("entry", 0, 10),
            ("entry", 0, 20),
            ("exit", 0, 30),
            ("exit", 0, 90),
            ("exit", 0, 100),
        ]);
        let (fs, _, _) = c.finish();
        let f = get(&fs, "f");
        assert_eq!((f.calls, f.total_ns, f.self_ns), (3, 100, 100));
        assert_eq!((f.min_ns, f.max_ns), (10, 100));
    }

    #[test]
    fn slices_know_their_depth_caller_and_reentry() {
        // f [0, 100) → g [10, 90) → f [20, 30).
        let (_, steps) = run(&[
            ("entry", 0, 0),
            ("entry", 1, 10),
            ("entry", 0, 20),
            ("exit", 0, 30),
            ("exit", 1, 90),
            ("exit", 0, 100),
        ]);
        let s: Vec<&Slice> = steps.iter().filter_map(|s| s.completed.as_ref()).collect();
        let got: Vec<(usize, u32, Option<usize>, bool)> = s
            .iter()
            .map(|s| (s.function, s.depth, s.caller, s.reentrant))
            .collect();
        assert_eq!(
            got,
            [
                (0, 2, Some(1), true),
                (1, 1, Some(0), false),
                (0, 0, None, false)
            ]
        );
    }

    #[test]
    fn an_exit_of_a_caller_abandons_the_calls_above_it() {
        // f calls g, g never exits (longjmp), f exits; then an exit with no entry.
        let (c, steps) = run(&[
            ("entry", 0, 0),
            ("entry", 1, 10),
            ("exit", 0, 50),
            ("exit", 1, 60),
        ]);
        assert_eq!(steps[0].began, Some(0));
        assert_eq!(steps[2].abandoned, 1);
        let s = steps[2].completed.as_ref().unwrap();
        assert_eq!((s.start_ns, s.end_ns), (0, 50));
        assert!(steps[3].completed.is_none());
        let (fs, unmatched, unfinished) = c.finish();
        assert_eq!((unmatched, unfinished), (1, 1));
        assert_eq!(get(&fs, "f").total_ns, 50);
        assert!(fs.iter().all(|f| f.function != "g"), "g never completed");
    }

    /// Calls left by a `longjmp` pile up under the function that set the jump: an
    /// exit still finds its own call on top of them, knows the open ones below, and the
    /// caller's exit gives the whole pile up at once.
    #[test]
    fn calls_left_open_pile_up_under_their_caller() {
        let mut events = vec![("entry", 0, 0)];
        events.extend((0..1000).map(|i| ("entry", 1, 1 + i)));
        events.extend([("entry", 1, 2000), ("exit", 1, 2010)]);
        events.extend([("exit", 0, 3000), ("exit", 1, 3010)]);
        let (c, steps) = run(&events);
        let s = steps[1002].completed.as_ref().expect("g's last call");
        assert_eq!((s.start_ns, s.end_ns, s.depth), (2000, 2010, 1001));
        assert!(s.reentrant, "1,000 calls of g are still open below it");
        assert_eq!(steps[1003].abandoned, 1000);
        assert!(steps[1004].completed.is_none());
        let (fs, unmatched, unfinished) = c.finish();
        assert_eq!((unmatched, unfinished), (1, 1000));
        let g = get(&fs, "g");
        assert_eq!((g.calls, g.total_ns), (1, 0), "inside an open call of g");
        assert_eq!(get(&fs, "f").total_ns, 3000);
    }

    #[test]
    fn entries_of_functions_without_exit_sites_are_not_calls() {
        let (c, steps) = run_paired(&[("entry", 0, 0), ("entry", 0, 10)], false);
        assert!(steps.iter().all(|s| s.began.is_none()));
        assert_eq!(c.open_calls().map(|(_, n, l)| n + l).sum::<usize>(), 0);
        let (fs, _, unfinished) = c.finish();
        assert!(fs.is_empty());
        assert_eq!(unfinished, 0);
    }

    #[test]
    fn the_stack_tree_stays_linear_in_deep_recursion() {
        let mut c = Calls::folding();
        let depth = 2000u64;
        let mut events: Vec<(&'static str, u32, u64)> =
            (0..depth).map(|i| ("entry", 0, i)).collect();
        events.extend((0..depth).map(|i| ("exit", 0, depth + i)));
        feed(&mut c, &events, true);
        let tree = c.folded.as_ref().unwrap();
        // Root + one node per depth, capped.
        assert_eq!(tree.nodes.len() as u32, MAX_STACK_DEPTH + 1);
        let total: u64 = tree.nodes.iter().map(|n| n.2).sum();
        assert_eq!(
            total,
            2 * depth - 1,
            "all self time kept: the outermost call's length"
        );
    }

    /// A Python call whose probes fire inside C helpers that return while it runs,
    /// and a C function it calls: each kind nests, the C function is the call's child.
    #[test]
    fn interpreted_calls_and_the_interpreters_functions_interleave() {
        let lang = Lang::default();
        let mut c = Calls::folding();
        // (kind, site, time, Python call: entry?)
        let trace: [(&'static str, u32, u64, Option<bool>); 8] = [
            ("entry", 0, 0, None), // helper of function__entry
            ("usdt", 9, 10, Some(true)),
            ("exit", 0, 20, None), // the helper returns, the Python call goes on
            ("entry", 1, 30, None), // a C function the Python code calls
            ("exit", 1, 60, None),
            ("entry", 0, 70, None), // helper of function__return
            ("usdt", 9, 80, Some(false)),
            ("exit", 0, 90, None),
        ];
        let steps: Vec<Step> = trace
            .iter()
            .map(|&(kind, site, t, py)| {
                let rec = Record {
                    site,
                    ..Record::default()
                };
                let name = ["helper", "abs"]
                    .get(site as usize)
                    .copied()
                    .unwrap_or("probe");
                c.event(&Event {
                    pid: 1,
                    tid: 1,
                    binary_id: 7,
                    comm: "t",
                    binary: "python",
                    symbol: name,
                    raw_symbol: name,
                    paired: true,
                    kind,
                    rec: &rec,
                    time_ns: t,
                    lang: py.map(|entry| LangCall {
                        entry,
                        file: 0,
                        function: 0,
                        line: if entry { 3 } else { 5 },
                        time_ns: t,
                    }),
                    strings: &lang,
                })
            })
            .collect();
        assert!(steps.iter().all(|s| s.abandoned == 0), "nothing given up");
        let abs = steps[4].completed.as_ref().unwrap();
        let py = steps[6].completed.as_ref().unwrap();
        assert_eq!(
            Some(py.function),
            abs.caller,
            "the C function is the call's child"
        );
        // py's 70 ns less abs's 30 and the part of the return's helper inside it (10).
        assert_eq!(
            (py.start_ns, py.end_ns, py.self_ns, py.depth),
            (10, 80, 30, 0)
        );
        assert_eq!(c.renamed_returns, 0);
        let tree = c.folded.as_ref().unwrap();
        let names = |n: usize| -> Vec<String> {
            tree.path(n)
                .iter()
                .map(|&f| c.functions[f].function.clone())
                .collect()
        };
        let abs_node = (1..tree.nodes.len())
            .find(|&n| tree.nodes[n].1 == abs.function)
            .unwrap();
        assert_eq!(names(abs_node), ["?:?:3", "abs"]);
        let (fs, unmatched, unfinished) = c.finish();
        assert_eq!((unmatched, unfinished, fs.len()), (0, 0, 3));
        // No time counted twice: the self times add up to the 90 ns traced.
        assert_eq!(fs.iter().map(|f| f.self_ns).sum::<u64>(), 90);
    }
}
