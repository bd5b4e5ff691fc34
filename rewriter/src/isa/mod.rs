//! The instruction-set backends. Everything ISA-specific (decoding, deciding whether a
//! site can be patched, relocating displaced instructions, emitting stubs and the
//! injected run-time code) sits behind [`Isa`]; the ELF layout code is shared.
//!
//! Here: the `Isa` trait and `isa::of` (machine → backend, `machine.rs` the one
//! `e_machine` match); the generic `sites_of` over per-instruction facts (`InsnFacts`:
//! return, direct target, transfer, memory access, call); branch targets and window
//! merging; `arg.rs` `<sys/sdt.h>` argument specs, `operands.rs` uprobe operand sets,
//! `linux.rs` the Linux ABI constants both runtimes use. Each backend folder has the
//! same file names: `mod.rs` decode and plan, `flow.rs` jump tables and tail calls,
//! `usdt.rs` the argument syntax, `stub.rs` the inline stub, `runtime.rs` flush /
//! register / pre-TLS shim / user drain, `wait.rs` the flush's back-pressure path.
//!
//! Branch targets come from function symbols, a linear sweep of direct branches and
//! `flow` (jump tables, landing pads, FDE starts). A target is *local*
//! (`Targets::local_jumps`: a window may hold it and re-point its jumps) when only
//! direct jumps from the same function reach it. A backend plans a function's sites
//! into **windows**: ranges of original code moved into one trampoline, the stubs of
//! the sites inside placed before their instructions, then a branch back (none after a
//! `ret`/`jmp`). Every known way into a displaced range leads to its trampoline: the
//! range's first instruction becomes the jump there; a known target inside is reached
//! only by jumps moved into the same window (re-pointed at the copy) or gets a
//! **landing**, a jump written in the displaced bytes to the copy, and so does the
//! return address of a call moved into it; every other byte is `int3`. Windows that
//! overlap merge (entry and exit of a tiny function share one) and get their landings
//! as merged. In a function with an indirect jump `flow` could not explain, only
//! windows with no reachable interior are used. Tests `tests/tests/windows.rs` (against
//! kernel uprobes on the original), `matrix.rs`, `real_programs.rs` (whole programs
//! against the original).
//!
//! A split-off part with no room for any window (a `.cold` part of 1 to 4 bytes, e.g.
//! `xor %eax,%eax; ret`, with another function right after it) is **entered by its jumps**:
//! when only direct jumps with a 32-bit displacement from outside it reach its start and no
//! branch lands inside, those jumps are re-pointed at a trampoline holding the whole part
//! (`Window::entered_by`), unless one of them lies in bytes another window moves
//! (`emit::repoint`); the part's bytes stay, so a way in not seen runs the original code,
//! untraced (test `cold_parts::a_part_too_short_for_a_jump_is_entered_by_its_jumps`).

use crate::elf::read::{Function, Input};
use crate::isa::arg::Arg;
use tracer_common::meta::{FallbackReason, SiteKind, TimeMode};

pub(crate) mod aarch64;
pub(crate) mod arg;
pub(crate) mod linux;
pub(crate) mod machine;
pub(crate) mod operands;
pub(crate) mod runs;
pub(crate) mod x86_64;

use machine::Machine;

/// The backend for an ELF `e_machine`, or None when there is none (adding an ISA is a
/// folder, a `Machine` and an arm here).
pub(crate) fn of(e_machine: u16) -> Option<&'static dyn Isa> {
    Some(match Machine::of(e_machine)? {
        Machine::X86_64 => &x86_64::X86_64,
        Machine::Aarch64 => &aarch64::Aarch64,
    })
}

/// Where the new code and data will live, fixed before any code is emitted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Link-time address of the RW area (`RwHeader`).
    pub rw_vaddr: u64,
    pub nslots: u32,
    pub buf_bytes: u64,
    pub binary_id: u64,
    /// Install the pre-TLS thread pointer in an entry shim (static executables).
    pub pre_tls: bool,
    /// Whether stubs read the cycle counter.
    pub time_mode: TimeMode,
    /// `BUF_*`: what a stub does when the buffer is full.
    pub buf_kind: u32,
    /// How stubs find their thread's slot (`SlotLookup::ThreadWord`: the thread-pointer
    /// offset of the word that holds it).
    pub slot_lookup: SlotLookup,
}

/// How a stub finds its thread's `Slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotLookup {
    /// One load at this offset from the thread pointer: a word of the executable's own
    /// static TLS block (a `PT_TLS` the rewriter adds) holding the slot's offset from
    /// `SLOTS_OFF`, like an index entry (0: the sentinel); `register` writes it.
    ThreadWord(i32),
    /// The index, by a hash of the thread pointer (`tracer_common::layout`).
    Index(IndexWhy),
}

/// Why a binary's stubs use the index rather than a thread word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexWhy {
    /// A library's TLS block is not at a fixed offset from the thread pointer.
    SharedLibrary,
    /// Stubs run before libc installs the thread pointer (the pre-TLS slot).
    StaticExecutable,
    /// The executable has its own `PT_TLS`, which a word cannot be added to without
    /// moving its variables.
    OwnTls,
    /// The slot count is not a power of two, so no mask keeps a thread word's value
    /// among the slots.
    SlotCount,
}

/// The mask that keeps any 32-bit value the byte offset of one of `nslots` slots
/// (a power of two) from `SLOTS_OFF`.
pub(crate) fn slot_mask(nslots: u32) -> u32 {
    let size = tracer_common::SLOT_SIZE as u32;
    (nslots * size - 1) & !(size - 1)
}

/// The index: what every binary's stubs can use (a report before the layout is known).
impl Default for SlotLookup {
    fn default() -> Self {
        SlotLookup::Index(IndexWhy::SharedLibrary)
    }
}

impl SlotLookup {
    pub fn describe(self) -> &'static str {
        match self {
            SlotLookup::ThreadWord(_) => "thread word",
            SlotLookup::Index(IndexWhy::SharedLibrary) => "index (a shared library)",
            SlotLookup::Index(IndexWhy::StaticExecutable) => "index (a static executable)",
            SlotLookup::Index(IndexWhy::OwnTls) => "index (the executable has its own TLS)",
            SlotLookup::Index(IndexWhy::SlotCount) => {
                "index (the slot count is not a power of two)"
            }
        }
    }
}

/// A site asked for, before planning.
#[derive(Clone, Debug)]
pub(crate) struct SiteReq {
    pub id: u32,
    pub kind: SiteKind,
    /// Entry: the function's address. Others: the instruction (exit: the `ret` or
    /// tail-call branch; USDT: the probe's `nop`).
    pub addr: u64,
    /// USDT: where the probe's arguments are.
    pub args: Vec<Arg>,
    /// Entries, landings and resumes of a function that unwinding lands in: where its
    /// frame address is (the record then carries it, `FLAG_FRAME`).
    pub frame: Option<crate::flow::FrameRule>,
}

/// A site placed in a window: its stub runs just before the instruction at `at`.
#[derive(Clone, Debug)]
pub(crate) struct PlacedSite {
    pub id: u32,
    pub kind: SiteKind,
    pub at: u64,
    /// The site's own instruction: `at`, except for a memory site recorded by the stub
    /// of its access run's head (`runs.rs`), whose address is computed at `at`.
    pub insn: u64,
    /// Such a member's address at `insn` less what its operand gives at `at` (a
    /// register moved in between: `add $0x20,%rdi`), added to the displacement.
    pub ea_shift: i64,
    /// The return-address register holds a signed pointer there (AArch64: after
    /// `paciasp`/`pacibsp`, at `retaa`/`retab`); the stub strips it before recording.
    pub signed_lr: bool,
    /// The record's `flags` (memory sites: read/write and size).
    pub flags: u32,
    /// USDT: the probe's arguments.
    pub args: Vec<Arg>,
    /// x86-64 entry/exit: the function never writes RFLAGS (resp. %r11) itself, so a
    /// caller compiled with interprocedural register allocation (gcc -fipa-ra) may keep
    /// a value there across the call: the stub saves it.
    pub keep_flags: bool,
    pub keep_r11: bool,
    /// x86-64: no status flag is read before all are written again after `at` (in the
    /// straight line from there): a stub there need not save them.
    pub flags_dead: bool,
    /// See `SiteReq::frame`; `flags` has `FLAG_FRAME` then.
    pub frame: Option<crate::flow::FrameRule>,
}

/// A range of original code moved into one trampoline: the branch to the trampoline
/// goes at `start` (nothing may branch into the rest of the range), the instructions of
/// `[start, start + code_len)` are relocated there with the stubs of `sites` in front
/// of theirs, and the trampoline branches back to `start + code_len` unless its last
/// instruction leaves anyway (`ret`, `jmp`). `[start + code_len, start + len)` is
/// padding between functions that the branch may overwrite.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    pub start: u64,
    pub len: usize,
    pub code_len: usize,
    pub sites: Vec<PlacedSite>,
    /// Branch targets inside the window that code outside it still jumps to: a jump
    /// written there leads to the trampoline's copy (x86-64).
    pub landings: Vec<Landing>,
    /// Returns outside the window that jumps inside it go to (x86-64).
    pub tails: Vec<Tail>,
    /// Not empty: the window is a split-off part too short for a jump, entered only by
    /// these jumps, which are re-pointed at the trampoline; nothing is written at
    /// `start` (`len` is 0) and the part's own bytes stay as they were (x86-64).
    pub entered_by: Vec<Entered>,
}

/// A direct jump with a 32-bit displacement (its last 4 bytes) that is re-pointed at a
/// trampoline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entered {
    pub at: u64,
    pub len: u8,
}

/// A `ret` outside a window that a jump inside the window goes to: the trampoline
/// holds its own copy of it, after the stubs of its sites, and the jump goes there.
/// A `ret` does the same wherever it runs, so the record is the same whichever way
/// the function returns, even where the `ret` itself has no window.
#[derive(Clone, Debug)]
pub(crate) struct Tail {
    pub at: u64,
    pub sites: Vec<PlacedSite>,
}

/// A jump written inside a window's displaced range at a branch target: to the
/// trampoline's copy of `target`, directly (5 bytes), or by a 2-byte hop to a 5-byte
/// jump at `hop` in the range's unused bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Landing {
    pub target: u64,
    pub hop: Option<u64>,
}

/// What the sites need from control-flow recovery (all sorted).
pub(crate) struct FlowFacts<'a> {
    /// Every known branch target.
    pub targets: &'a [u64],
    /// Indirect jumps that are tail calls (exits).
    pub tail_calls: &'a [u64],
    /// The procedure linkage table's sections (`.plt`, `.plt.sec`, `.plt.got`): a jump
    /// there is a tail call into another object (`jmp free@plt`).
    pub plt: &'a [std::ops::Range<u64>],
    /// Exception landing pads (from the LSDAs), sorted.
    pub landing_pads: &'a [u64],
    /// The names of call targets.
    pub callees: &'a crate::elf::imports::Callees,
}

/// Functions that return a second time when a `longjmp` (or `siglongjmp`) lands.
const SETJMPS: [&str; 5] = ["setjmp", "_setjmp", "__setjmp", "sigsetjmp", "__sigsetjmp"];

/// The function through which a cleanup passes unwinding on (it does not return).
const UNWIND_RESUME: &str = "_Unwind_Resume";

/// A window's trampoline: its code, and where the copy of each of its landings'
/// targets is (in `Window::landings` order).
pub(crate) struct Trampoline {
    pub code: Vec<u8>,
    pub landed: Vec<u64>,
}

/// A direct branch found by the linear sweep.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Branch {
    pub from: u64,
    pub to: u64,
    pub call: bool,
}

/// Every known branch target, and which of them a window may hold inside.
#[derive(Debug, Default)]
pub(crate) struct Targets {
    /// Sorted, deduplicated.
    pub all: Vec<u64>,
    /// Sorted by target: targets reached only by direct jumps from inside the
    /// function symbol that holds them, with the number of such jumps. A window may
    /// hold one inside if it holds all those jumps too: they are re-pointed at the
    /// trampoline's copy. Never a symbol, a call's target, a jump-table target, a
    /// landing pad or an FDE start.
    pub local: Vec<(u64, u32)>,
    /// `(to, from)` of every direct jump (not a call) to a function start (a symbol's
    /// or an FDE's), sorted: who enters a split-off part.
    entry_jumps: Vec<(u64, u64)>,
    /// Jump-table targets and landing pads, sorted: reached by no direct branch.
    indirect: Vec<u64>,
}

impl Targets {
    /// `fdes`: the FDEs' `(start, length)`, functions that stripped binaries name
    /// nowhere else.
    fn new(
        input: &Input,
        pinned: Vec<u64>,
        function_starts: &[u64],
        fdes: &[(u64, u64)],
        branches: &[Branch],
        indirect: Vec<u64>,
    ) -> Self {
        let mut fns: Vec<(u64, u64)> = input
            .functions
            .iter()
            .map(|f| (f.addr, f.addr + f.size))
            .chain(fdes.iter().map(|&(s, n)| (s, s.saturating_add(n))))
            .collect();
        fns.sort_unstable();
        let starts: Vec<u64> = fns.iter().map(|f| f.0).collect();
        // Within one function: the last symbol starting at or before both ends holds
        // them, and no symbol starts between them.
        let same_function = |a: u64, b: u64| {
            let (lo, hi) = (a.min(b), a.max(b));
            let k = starts.partition_point(|&s| s <= lo);
            k > 0 && hi < fns[k - 1].1 && starts.get(k).is_none_or(|&s| s > hi)
        };
        let mut all: Vec<u64> = pinned.clone();
        all.extend(branches.iter().map(|b| b.to));
        all.sort_unstable();
        all.dedup();
        let mut by_target: Vec<(u64, bool)> = branches
            .iter()
            .map(|b| (b.to, !b.call && same_function(b.from, b.to)))
            .collect();
        by_target.sort_unstable_by_key(|t| t.0);
        let mut local = Vec::new();
        for group in by_target.chunk_by(|a, b| a.0 == b.0) {
            let t = group[0].0;
            if group.iter().all(|g| g.1) && pinned.binary_search(&t).is_err() {
                local.push((t, group.len() as u32));
            }
        }
        let mut entry_jumps: Vec<(u64, u64)> = branches
            .iter()
            .filter(|b| !b.call && function_starts.binary_search(&b.to).is_ok())
            .map(|b| (b.to, b.from))
            .collect();
        entry_jumps.sort_unstable();
        Targets {
            all,
            local,
            entry_jumps,
            indirect,
        }
    }

    /// Where the direct jumps to function start `start` are.
    pub(crate) fn jumps_to(&self, start: u64) -> impl Iterator<Item = u64> + '_ {
        let lo = self.entry_jumps.partition_point(|j| j.0 < start);
        self.entry_jumps[lo..]
            .iter()
            .take_while(move |j| j.0 == start)
            .map(|j| j.1)
    }

    /// Is `t` a jump-table target or a landing pad?
    pub(crate) fn reached_indirectly(&self, t: u64) -> bool {
        self.indirect.binary_search(&t).is_ok()
    }

    /// The number of jumps to `t` if it is local (see `local`).
    pub(crate) fn local_jumps(&self, t: u64) -> Option<u32> {
        self.local
            .binary_search_by_key(&t, |l| l.0)
            .ok()
            .map(|i| self.local[i].1)
    }
}

/// How a function's sites are patched: windows, the sites left to uprobes, and those
/// neither a stub nor a trap may touch (why, each).
#[derive(Clone, Debug, Default)]
pub(crate) struct FunctionPlan {
    pub windows: Vec<Window>,
    pub uprobes: Vec<(u32, FallbackReason)>,
    pub untraced: Vec<(u32, FallbackReason)>,
    /// What access runs were found (`runs.rs`).
    pub runs: runs::RunStats,
}

impl FunctionPlan {
    pub(crate) fn all_uprobes(reqs: &[SiteReq], why: FallbackReason) -> Self {
        FunctionPlan {
            uprobes: reqs.iter().map(|r| (r.id, why.clone())).collect(),
            ..FunctionPlan::default()
        }
    }
}

/// The range one site's patch covers: the branch goes at `start` and overwrites `len`
/// bytes, of which the first `code_len` are instructions that are relocated (the rest
/// padding after the function).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Span {
    pub start: u64,
    pub len: usize,
    pub code_len: usize,
}

/// One site's own window, before windows that overlap are merged, or why it has none.
#[derive(Clone)]
pub(crate) struct Candidate {
    pub req: SiteReq,
    /// The instruction the stub runs before.
    pub at: u64,
    /// See `PlacedSite::insn`, `ea_shift`.
    pub insn: u64,
    pub ea_shift: i64,
    pub signed_lr: bool,
    pub flags: u32,
    /// See `PlacedSite::keep_flags` / `keep_r11` / `flags_dead`.
    pub keep_flags: bool,
    pub keep_r11: bool,
    pub flags_dead: bool,
    pub window: Result<Span, FallbackReason>,
}

impl Candidate {
    /// The site as a stub places it.
    pub(crate) fn placed(&self) -> PlacedSite {
        PlacedSite {
            id: self.req.id,
            kind: self.req.kind,
            at: self.at,
            insn: self.insn,
            ea_shift: self.ea_shift,
            signed_lr: self.signed_lr,
            flags: match self.req.frame {
                Some(_) => self.flags | tracer_common::FLAG_FRAME,
                None => self.flags,
            },
            args: self.req.args.clone(),
            keep_flags: self.keep_flags,
            keep_r11: self.keep_r11,
            flags_dead: self.flags_dead,
            frame: self.req.frame,
        }
    }

    pub(crate) fn uprobe(req: &SiteReq, at: u64, why: FallbackReason) -> Self {
        Candidate {
            req: req.clone(),
            at,
            insn: at,
            ea_shift: 0,
            signed_lr: false,
            flags: 0,
            keep_flags: false,
            keep_r11: false,
            flags_dead: false,
            window: Err(why),
        }
    }
}

/// Merge overlapping candidate windows into one trampoline each. A site without a
/// window of its own whose instruction lies inside a window is placed there (its
/// original address would never run again); the rest become uprobe sites. `bad` vets
/// a merged window (e.g. an x86-64 `call` that is no longer last) and may complete it
/// (its landings): a rejected window is dropped and its sites become uprobe sites, the
/// code left untouched.
pub(crate) fn merge_windows(
    cands: Vec<Candidate>,
    mut bad: impl FnMut(&mut Window) -> Option<String>,
) -> FunctionPlan {
    let mut spans: Vec<Span> = cands.iter().filter_map(|c| c.window.clone().ok()).collect();
    spans.sort_unstable();
    let mut windows: Vec<Window> = Vec::new();
    for Span {
        start,
        len,
        code_len,
    } in spans
    {
        match windows.last_mut() {
            Some(w) if start < w.start + w.len as u64 => {
                let end = (w.start + w.len as u64).max(start + len as u64);
                let code_end = (w.start + w.code_len as u64).max(start + code_len as u64);
                w.len = (end - w.start) as usize;
                w.code_len = (code_end - w.start) as usize;
            }
            _ => windows.push(Window {
                start,
                len,
                code_len,
                sites: Vec::new(),
                landings: Vec::new(),
                tails: Vec::new(),
                entered_by: Vec::new(),
            }),
        }
    }
    let mut plan = FunctionPlan::default();
    for c in cands {
        let placed = c.placed();
        match windows
            .iter_mut()
            .find(|w| (w.start..w.start + w.code_len as u64).contains(&c.at))
        {
            Some(w) => w.sites.push(placed),
            None => plan
                .uprobes
                .push((c.req.id, c.window.err().unwrap_or(FallbackReason::NoWindow))),
        }
    }
    for mut w in windows {
        match bad(&mut w) {
            None if !w.sites.is_empty() => plan.windows.push(w),
            None => {}
            Some(why) => plan.uprobes.extend(
                w.sites
                    .iter()
                    .map(|s| (s.id, FallbackReason::Overlapping(why.clone()))),
            ),
        }
    }
    plan
}

/// What site selection needs to know about one instruction.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct InsnFacts {
    pub addr: u64,
    /// A return (`ret`, `retaa`).
    pub is_return: bool,
    /// The target of a direct unconditional jump (`jmp rel`, `b`).
    pub direct_jump: Option<u64>,
    /// An indirect jump (`jmp r/m`, `br`): an exit when flow recovery found it to be a
    /// tail call.
    pub indirect_jump: bool,
    /// Control may not fall through to the next instruction: the next one starts a block.
    pub transfers: bool,
    /// An explicit memory operand that is read or written (when asked for).
    pub memory: bool,
    /// A call, direct or indirect.
    pub call: bool,
    /// What a call goes to, when the instruction says: a direct call's target, or the
    /// GOT slot an x86-64 `call *slot(%rip)` reads (see `elf::imports::Callees`).
    pub callee: Option<u64>,
    /// The next instruction's address.
    pub next: u64,
    /// A landing pad (`endbr64`, `bti c`, `paciasp`): not a block of its own when first.
    pub landing_pad: bool,
    /// A NOP or trap (`nop`, `int3`): after a return or jump, alignment padding that
    /// never runs unless something branches there.
    pub padding: bool,
}

/// Addresses of `f`'s sites of one kind. `whole`: the ranges of the function `f` is
/// or is a split-off part of (`whole[0]` starts at its entry; the rest are its parts).
/// Entries: the function's address. Exits: returns, direct jumps that leave the
/// function for another function's start (tail calls; `fn_starts`: every function
/// address, sorted) or for its own entry, and indirect jumps that `flow` found to be
/// tail calls; jumps between the function and its parts are neither. Blocks: the first
/// instruction (after a landing pad), branch targets inside, and instructions after a
/// control transfer (but not padding after a return or jump). Memory: instructions with
/// an explicit memory operand that they read or write. Calls: every call. Landings:
/// exception landing pads, and the returns of `setjmp` calls. Resumes: calls to
/// `_Unwind_Resume`. (USDT sites come from the probe notes, not from here.)
pub(crate) fn sites_of(
    isa: &dyn Isa,
    input: &Input,
    f: &Function,
    whole: &[std::ops::Range<u64>],
    kind: SiteKind,
    fn_starts: &[u64],
    flow: &FlowFacts,
) -> Vec<u64> {
    let keep = |pred: &dyn Fn(&InsnFacts) -> bool| -> Vec<u64> {
        let facts = isa.insn_facts(input, f, kind == SiteKind::Memory);
        facts.iter().filter(|i| pred(i)).map(|i| i.addr).collect()
    };
    let entry = whole.first().map_or(f.addr, |r| r.start);
    let inside =
        |t: u64| whole.iter().any(|r| r.contains(&t)) || (f.addr..f.addr + f.size).contains(&t);
    let is = |set: &[u64], a: u64| set.binary_search(&a).is_ok();
    match kind {
        SiteKind::FunctionEntry => vec![f.addr],
        SiteKind::Usdt => Vec::new(),
        SiteKind::FunctionExit => keep(&|i| {
            i.is_return
                || i.direct_jump.is_some_and(|t| {
                    // A jump back to the function's own start runs its entry stub
                    // again: a tail call to itself.
                    t == entry
                        || !inside(t)
                            && (is(fn_starts, t) || flow.plt.iter().any(|p| p.contains(&t)))
                })
                || i.indirect_jump && is(flow.tail_calls, i.addr)
        }),
        SiteKind::Block => {
            let mut out = Vec::new();
            let (mut after_transfer, mut after_stop) = (true, false);
            for (k, i) in isa.insn_facts(input, f, false).iter().enumerate() {
                if k == 0 && i.landing_pad {
                    continue;
                }
                let target = is(flow.targets, i.addr);
                // Padding is no block: a uprobe site there is refused by the kernel
                // when it has a segment prefix (`cs nopw`), and could never fire.
                if after_stop && i.padding && !target {
                    continue;
                }
                if after_transfer || target {
                    out.push(i.addr);
                }
                after_transfer = i.transfers;
                after_stop = i.is_return || i.direct_jump.is_some() || i.indirect_jump;
            }
            out
        }
        SiteKind::Memory => keep(&|i| i.memory),
        SiteKind::Call => keep(&|i| i.call),
        SiteKind::Landing => unwind_sites(isa, input, f, flow).0,
        SiteKind::Resume => unwind_sites(isa, input, f, flow).1,
    }
}

/// `f`'s landing sites (its exception landing pads, the returns of its `setjmp`
/// calls) and resume sites (its calls to `_Unwind_Resume`), from one decode.
pub(crate) fn unwind_sites(
    isa: &dyn Isa,
    input: &Input,
    f: &Function,
    flow: &FlowFacts,
) -> (Vec<u64>, Vec<u64>) {
    let own = f.addr..f.addr + f.size;
    let from = flow.landing_pads.partition_point(|&p| p < own.start);
    let mut landings: Vec<u64> = flow.landing_pads[from..]
        .iter()
        .copied()
        .take_while(|p| own.contains(p))
        .collect();
    let mut resumes = Vec::new();
    for i in isa.insn_facts(input, f, false).iter().filter(|i| i.call) {
        match i.callee.and_then(|c| flow.callees.name(c)) {
            Some(n) if SETJMPS.contains(&n) && own.contains(&i.next) => landings.push(i.next),
            Some(UNWIND_RESUME) => resumes.push(i.addr),
            _ => {}
        }
    }
    landings.sort_unstable();
    landings.dedup();
    (landings, resumes)
}

/// Addresses of the injected run-time routines.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Runtime {
    pub flush: u64,
    /// Where the flush uprobe goes (the flush code's NOP).
    pub flush_probe: u64,
    pub register: u64,
    /// Entry shim, when the binary needs one.
    pub entry_shim: Option<u64>,
}

pub(crate) trait Isa: crate::flow::FlowArch + Sync {
    /// `ARCH_*` code stored in the metadata.
    fn arch(&self) -> u32;
    /// Parse a `<sys/sdt.h>` argument operand (after its size prefix) in this ISA's
    /// assembler syntax. `pc`: the probe's address (x86-64 numeric `N(%rip)`).
    fn usdt_operand(
        &self,
        operand: &str,
        pc: u64,
        resolve: &dyn Fn(&str) -> Result<u64, arg::ArgError>,
    ) -> Result<arg::ArgLoc, arg::ArgError>;
    /// Push the direct branches (jumps, conditional branches, calls) in `bytes` (code
    /// at `addr`).
    fn direct_branches(&self, addr: u64, bytes: &[u8], out: &mut Vec<Branch>);
    /// Push the targets of the direct calls in `bytes` (code at `addr`).
    fn direct_call_targets(&self, addr: u64, bytes: &[u8], out: &mut Vec<u64>);
    /// Sorted, deduplicated targets of every direct call in the code sections.
    fn call_targets(&self, input: &Input) -> Vec<u64> {
        let mut out = Vec::new();
        for (addr, bytes) in input.code_sections() {
            self.direct_call_targets(addr, bytes, &mut out);
        }
        out.sort_unstable();
        out.dedup();
        out
    }
    /// Every address that some known branch can land on: function symbols, the
    /// direct branches of a linear sweep of every code section, and what `flow`
    /// recovered (jump-table targets, exception landing pads, FDE starts).
    fn branch_targets(&self, input: &Input, flow: &crate::flow::Flow) -> Targets {
        let mut branches = Vec::new();
        for (addr, bytes) in input.code_sections() {
            self.direct_branches(addr, bytes, &mut branches);
        }
        let mut starts: Vec<u64> = input.functions.iter().map(|f| f.addr).collect();
        starts.extend(flow.fde_functions.iter().map(|&(start, _)| start));
        starts.sort_unstable();
        starts.dedup();
        let mut indirect: Vec<u64> = flow.jump_table_targets.clone();
        indirect.extend(&flow.landing_pads);
        indirect.sort_unstable();
        indirect.dedup();
        let mut pinned = starts.clone();
        pinned.extend(&indirect);
        pinned.sort_unstable();
        pinned.dedup();
        Targets::new(
            input,
            pinned,
            &starts,
            &flow.fde_functions,
            &branches,
            indirect,
        )
    }
    /// `f`'s instructions in address order, with what site selection needs of each
    /// (empty when `f` cannot be decoded). `memory`: also classify memory accesses
    /// (costly; only memory sites need it).
    fn insn_facts(&self, input: &Input, f: &Function, memory: bool) -> Vec<InsnFacts>;
    /// (entry, GOT slot) of each entry of the procedure linkage table: a call to the
    /// entry is a call to the symbol bound to the slot.
    fn plt_slots(&self, input: &Input) -> Vec<(u64, u64)>;
    /// Decide which of `f`'s sites get inline stubs (grouped into windows) and which
    /// become uprobe sites. `targets`: every known branch target. `unsure`:
    /// why the targets inside `f` may be incomplete (an indirect jump not explained as
    /// a jump table, unreadable exception tables); then only windows whose interior
    /// cannot be a branch target are allowed (a function's first instructions, a last
    /// `ret` with the padding after it). `run_cap`: the most memory sites one stub may
    /// record (`runs.rs`; below 2: one stub each).
    #[allow(clippy::too_many_arguments)]
    fn plan_function(
        &self,
        input: &Input,
        f: &Function,
        reqs: &[SiteReq],
        targets: &Targets,
        unsure: Option<&FallbackReason>,
        part: bool,
        run_cap: usize,
    ) -> FunctionPlan;
    /// Where a uprobe goes for a site that is not patched inline: after a landing pad
    /// (`endbr64`, `bti c`, `paciasp`) for an entry, the instruction itself for an exit.
    fn probe_addr(&self, input: &Input, f: &Function, req: &SiteReq) -> u64;
    /// Emit flush, register and (if `layout.pre_tls`) the entry shim at `at`.
    fn emit_runtime(
        &self,
        layout: &Layout,
        at: u64,
        original_entry: u64,
    ) -> Result<(Vec<u8>, Runtime), String>;
    /// Emit the trampoline of one window at `at`: stubs and relocated instructions,
    /// branch back.
    fn emit_window(
        &self,
        input: &Input,
        layout: &Layout,
        rt: &Runtime,
        w: &Window,
        at: u64,
    ) -> Result<Trampoline, String>;
    /// The bytes written over the window's displaced range: a branch to the trampoline
    /// at `to`, its landings (to `landed`, the trampoline addresses of their targets),
    /// traps in the rest.
    fn patch_bytes(&self, w: &Window, to: u64, landed: &[u64]) -> Result<Vec<u8>, String>;
    /// The bytes that re-point jump `e` at `to`: (address, bytes).
    fn repoint(&self, e: &Entered, to: u64) -> Result<(u64, Vec<u8>), String> {
        let _ = to;
        Err(format!("no re-pointed jumps on this ISA ({:#x})", e.at))
    }
    /// Byte that pads between trampolines (never executed): a trap where possible.
    fn code_fill(&self) -> u8;
    /// One instruction that is never executed, where a uprobe can sit (the anchor of a
    /// USDT semaphore, see `meta::Semaphore`).
    fn anchor(&self) -> &'static [u8];
    /// Alignment the new segments need (page size the binaries assume).
    fn segment_align(&self) -> u64;
    /// Where an executable's static TLS block of 8 bytes (its only one) lies from the
    /// thread pointer, by this ISA's TLS variant.
    fn thread_word_offset(&self) -> i32;
    /// Where the values of a uprobe site's record are, for the eBPF `site` program:
    /// a memory site's effective address (and its record flags), a USDT probe's
    /// arguments. `addr` is where the uprobe sits (the site's instruction). None for
    /// other kinds, and for an operand the descriptors cannot express (the record then
    /// carries zeros).
    fn uprobe_operands(
        &self,
        input: &Input,
        kind: SiteKind,
        addr: u64,
        args: &[Arg],
    ) -> Option<tracer_common::operand::OperandSet>;
}
