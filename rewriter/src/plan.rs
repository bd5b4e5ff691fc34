//! Sites to patch decisions: each chosen function's site requests (by kind, in the order
//! their stubs run), then the ISA's plan of which sites share an inline window and
//! which fall back to uprobes (and why).
//!
//! Site kinds (`--sites entry,exit,block,memory,usdt,call`, or the spec). An entry site
//! is the function's first instruction after an optional landing pad (`endbr64`, `bti`,
//! `paciasp`, which stays first). Exit sites are every `ret` and every unconditional
//! direct jump to another function's start, to a PLT entry (`jmp free@plt`) or back to
//! its own start (a tail call: the entry stub runs again), in the function and in its
//! split-off parts (jumps between them are neither). Block sites are the first
//! instruction, every branch target inside the function and every instruction after a
//! control transfer. Memory sites are instructions with an explicit memory operand they
//! read or write (x86-64: not `lea`/hint nops, gathers, `%gs` or 32-bit addressing;
//! AArch64: `isa/aarch64/mem.rs`). USDT sites are the probes of `.note.stapsdt`. Call
//! sites are call instructions (they record the target, computed from the operand for
//! an indirect call, and the return address; a call uprobe site records the
//! instruction's address instead). A chosen value (`--value entry=%rsi`, `[values]` in
//! the spec) is computed like a USDT argument for entry, exit and block records. All
//! stubs at one instruction (an entry, its first block, a memory access, ...) are one
//! stub: one reservation of all their records, one full-check.
//!
//! Exits bring landing and resume sites: each exception landing pad of the LSDAs and the
//! return of each `setjmp`/`sigsetjmp` call land; calls to `_Unwind_Resume` resume (callees
//! named through the PLT and GOT, `elf/imports.rs`). Entries, landings and resumes of
//! functions unwinding lands in carry the low 16 bits of the frame's CFA (`FLAG_FRAME`, the
//! rule from the CFI at the site, `flow`), so a reader ends exactly the calls above the
//! frame landed in, and a catch in an outer instance of a recursive function ends the inner
//! ones. A landing in a function that is not traced is not seen: the calls it leaves end at
//! the next exit below them, counted as calls without their exit (trace the functions that
//! catch). Tests `tests/tests/unwinding.rs` (g++ -O2 exceptions through cleanups, rethrows
//! and a recursion, gcc -O2 `longjmp`/`siglongjmp`, x86-64 and AArch64, against kernel
//! uprobes on the original) and `cargo xtask difftest --lang cxx`.
//!
//! A site without a window is a uprobe site; why is its `FallbackReason`
//! (`tracer-common/src/meta.rs`). A landing pad with no room for a stub is untraced rather
//! than a uprobe (`LandingNotPatched`: Rust's pads are 2-byte jumps side by side, 41,663 of
//! them in librustc_driver, and every uprobe costs its attach).

use std::collections::HashMap;

use crate::Options;
use crate::elf::imports::Callees;
use crate::elf::read::Input;
use crate::error::{Error, Result};
use crate::flow::{Flow, FrameRule};
use crate::isa::arg::{Arg, ArgError, parse_arg};
use crate::isa::{FlowFacts, FunctionPlan, Isa, SiteReq, Targets};
use crate::select::{Chosen, Selection};
use tracer_common::meta::{FallbackReason, SiteKind};

/// One site, by id: what the metadata and the report say of it.
pub(crate) struct SiteInfo {
    /// The function's name (USDT: `provider:name`).
    pub name: String,
    pub kind: SiteKind,
    pub addr: u64,
    /// USDT: the probe's argument count (at most 255).
    pub nargs: u8,
}

/// Every site asked for.
pub(crate) struct Sites {
    /// The requests of each chosen function (same order), ids ascending.
    pub reqs_of: Vec<Vec<SiteReq>>,
    /// Every site, indexed by id.
    pub info: Vec<SiteInfo>,
    /// USDT semaphore addresses, sorted and deduplicated.
    pub semaphores: Vec<u64>,
}

/// What every function's site search shares.
struct Ctx<'a> {
    input: &'a Input<'a>,
    isa: &'a dyn Isa,
    facts: FlowFacts<'a>,
    fn_starts: &'a [u64],
    sel: &'a Selection,
    probes: &'a [crate::select::usdt::Probe],
    values: HashMap<SiteKind, Arg>,
}

/// Find the sites of every chosen function. `targets`: every known branch target.
pub(crate) fn sites(
    input: &Input,
    isa: &dyn Isa,
    flow: &Flow,
    targets: &Targets,
    sel: &Selection,
    opts: &Options,
) -> Result<Sites> {
    let fn_starts: Vec<u64> = sel.functions.iter().map(|f| f.addr).collect();
    let plt: Vec<std::ops::Range<u64>> = input
        .sections
        .iter()
        .filter(|s| matches!(s.name.as_str(), ".plt" | ".plt.sec" | ".plt.got"))
        .map(|s| s.addr..s.addr + s.size)
        .collect();
    let callees = Callees::new(input, &isa.plt_slots(input));
    let cx = Ctx {
        input,
        isa,
        facts: FlowFacts {
            targets: &targets.all,
            tail_calls: &flow.tail_calls,
            plt: &plt,
            landing_pads: &flow.landing_pads,
            callees: &callees,
        },
        fn_starts: &fn_starts,
        sel,
        probes: &sel.probes,
        values: values(input, opts)?,
    };
    let kinds = stub_order(&opts.kinds);
    let unwinding = Unwinding::find(&cx, flow, &kinds);
    let mut sites = Sites {
        reqs_of: Vec::with_capacity(sel.chosen.len()),
        info: Vec::new(),
        semaphores: Vec::new(),
    };
    let total = sel.chosen.len() as u64;
    for (i, c) in sel.chosen.iter().enumerate() {
        opts.progress.report("finding sites", i as u64, total);
        let reqs = cx.function_sites(c, &kinds, &unwinding, i, &mut sites);
        sites.reqs_of.push(reqs);
    }
    sites.semaphores.sort_unstable();
    sites.semaphores.dedup();
    Ok(sites)
}

/// Stubs at one instruction run in this order: entry, landing, block, USDT, memory,
/// call, resume, exit. Exits bring landings and resumes: the calls that unwinding
/// leaves end where it lands.
fn stub_order(kinds: &[SiteKind]) -> Vec<SiteKind> {
    let mut kinds = kinds.to_vec();
    if kinds.contains(&SiteKind::FunctionExit) {
        kinds.extend([SiteKind::Landing, SiteKind::Resume]);
    }
    kinds.sort_by_key(|k| match k {
        SiteKind::FunctionEntry => 0,
        SiteKind::Landing => 1,
        SiteKind::Block => 2,
        SiteKind::Usdt => 3,
        SiteKind::Memory => 4,
        SiteKind::Call => 5,
        SiteKind::Resume => 6,
        SiteKind::FunctionExit => 7,
    });
    kinds.dedup();
    kinds
}

/// Where unwinding lands in the chosen functions, found before any site is numbered:
/// a function that it lands in gets its frame address in its entry records too.
struct Unwinding {
    /// Per chosen function: its landing and resume sites.
    sites: Vec<(Vec<u64>, Vec<u64>)>,
    /// Entries of the functions (with their parts) that have some.
    lands_in: std::collections::HashSet<u64>,
    /// The frame rule of each landing and resume site (and entries: `entry`).
    rules: HashMap<u64, FrameRule>,
    entry: Option<FrameRule>,
}

impl Unwinding {
    fn find(cx: &Ctx, flow: &Flow, kinds: &[SiteKind]) -> Unwinding {
        let mut u = Unwinding {
            sites: Vec::new(),
            lands_in: Default::default(),
            rules: HashMap::new(),
            entry: None,
        };
        if !kinds.contains(&SiteKind::Landing) {
            return u;
        }
        let (sp, off, _) = cx.isa.entry_cfa();
        u.entry = Some(FrameRule { reg: sp, off });
        for c in &cx.sel.chosen {
            let (landings, resumes) = match c.selected && c.callable {
                true => crate::isa::unwind_sites(cx.isa, cx.input, &c.f, &cx.facts),
                false => (Vec::new(), Vec::new()),
            };
            if !landings.is_empty() || !resumes.is_empty() {
                u.lands_in.insert(c.part_of.unwrap_or(c.f.addr));
            }
            u.sites.push((landings, resumes));
        }
        let addrs: Vec<u64> = u
            .sites
            .iter()
            .flat_map(|(l, r)| l.iter().chain(r))
            .copied()
            .collect();
        let rules = flow.frame_rules(cx.input, cx.isa, &addrs);
        u.rules = addrs
            .into_iter()
            .zip(rules)
            .filter_map(|(a, r)| Some((a, r?)))
            .collect();
        u
    }
}

/// The chosen record values (`--value`, `[values]`), parsed for this binary's ISA.
fn values(input: &Input, opts: &Options) -> Result<HashMap<SiteKind, Arg>> {
    let mut values = HashMap::new();
    for (kind, text) in &opts.values {
        let arg = parse_arg(text, input.machine, 0, &|s| {
            Err(ArgError::UnknownSymbol(s.to_string()))
        })
        .map_err(|e| {
            Error::Spec(
                input.name.clone(),
                format!("value of {} records {text:?}: {e}", kind.name()),
            )
        })?;
        values.insert(*kind, arg);
    }
    Ok(values)
}

impl Ctx<'_> {
    /// The requests of chosen function `i`, numbered on from `sites.info`.
    fn function_sites(
        &self,
        c: &Chosen,
        kinds: &[SiteKind],
        unwinding: &Unwinding,
        i: usize,
        sites: &mut Sites,
    ) -> Vec<SiteReq> {
        let f = &c.f;
        let mut reqs = Vec::new();
        let in_f = |pc: u64| (f.addr..f.addr + f.size).contains(&pc);
        for &kind in kinds {
            if kind == SiteKind::Usdt {
                for p in self.probes.iter().filter(|p| in_f(p.pc)) {
                    let label = format!("{}:{}", p.provider, p.name);
                    add_site(&mut reqs, sites, kind, p.pc, &label, p.args.clone(), None);
                    sites.semaphores.extend(p.semaphore);
                }
                continue;
            }
            let value: Vec<Arg> = self.values.get(&kind).cloned().into_iter().collect();
            for (addr, frame) in self.kind_sites(c, kind, unwinding, i) {
                add_site(&mut reqs, sites, kind, addr, &c.name, value.clone(), frame);
            }
        }
        reqs
    }

    /// The addresses of chosen function `i`'s sites of a `kind` other than USDT, each
    /// with its frame rule when its record carries the frame.
    fn kind_sites(
        &self,
        c: &Chosen,
        kind: SiteKind,
        unwinding: &Unwinding,
        i: usize,
    ) -> Vec<(u64, Option<FrameRule>)> {
        let f = &c.f;
        if !c.selected {
            return Vec::new(); // planned only for its USDT probes
        }
        // A part has its function's exits, never an entry.
        let whole = match (kind, c.part_of) {
            (SiteKind::FunctionEntry, Some(_)) => return Vec::new(),
            (
                SiteKind::FunctionEntry
                | SiteKind::FunctionExit
                | SiteKind::Landing
                | SiteKind::Resume,
                _,
            ) if !c.callable => return Vec::new(),
            (_, Some(parent)) => self.sel.whole(parent),
            (_, None) => self.sel.whole(f.addr),
        };
        let of = match kind {
            SiteKind::Landing => unwinding.sites[i].0.clone(),
            SiteKind::Resume => unwinding.sites[i].1.clone(),
            _ => crate::isa::sites_of(
                self.isa,
                self.input,
                f,
                &whole,
                kind,
                self.fn_starts,
                &self.facts,
            ),
        };
        let frame = |addr: u64| match kind {
            SiteKind::FunctionEntry if unwinding.lands_in.contains(&f.addr) => unwinding.entry,
            SiteKind::Landing | SiteKind::Resume => unwinding.rules.get(&addr).copied(),
            _ => None,
        };
        of.into_iter().map(|addr| (addr, frame(addr))).collect()
    }
}

/// Request a site, numbered on from `sites.info`, and describe it there.
fn add_site(
    reqs: &mut Vec<SiteReq>,
    sites: &mut Sites,
    kind: SiteKind,
    addr: u64,
    label: &str,
    args: Vec<Arg>,
    frame: Option<FrameRule>,
) {
    let nargs = if kind == SiteKind::Usdt {
        args.len().min(255) as u8
    } else {
        0
    };
    reqs.push(SiteReq {
        id: sites.info.len() as u32,
        kind,
        addr,
        args,
        frame,
    });
    sites.info.push(SiteInfo {
        name: label.to_string(),
        kind,
        addr,
        nargs,
    });
}

/// Plan every chosen function: windows for inline stubs, uprobes for the rest.
/// `eh_problem`: why the exception tables could not be read (then no function's
/// interior is trusted).
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan(
    input: &Input,
    isa: &dyn Isa,
    flow: &Flow,
    eh_problem: Option<&str>,
    targets: &Targets,
    sel: &Selection,
    sites: &Sites,
    opts: &Options,
) -> Vec<FunctionPlan> {
    let total = sel.chosen.len() as u64;
    sel.chosen
        .iter()
        .zip(&sites.reqs_of)
        .enumerate()
        .map(|(i, (c, reqs))| {
            opts.progress.report("planning", i as u64, total);
            if opts.force_uprobe {
                return FunctionPlan::all_uprobes(reqs, FallbackReason::Forced);
            }
            let unsure = eh_problem
                .map(|e| FallbackReason::ExceptionTables(e.to_string()))
                .or_else(|| unresolved_jump(flow, c.f.addr, c.f.addr + c.f.size));
            let part = c.part_of.is_some();
            let mut p = isa.plan_function(
                input,
                &c.f,
                reqs,
                targets,
                unsure.as_ref(),
                part,
                run_cap(opts),
            );
            untrace_landings(&mut p, reqs);
            p
        })
        .collect()
}

/// The most memory accesses one stub records (`isa::runs`): within the buffer's slack
/// (`BUF_SLACK_RECORDS` records after its end, shared with nested signal handlers'
/// stubs); a fast ring's stub writes one pair.
fn run_cap(opts: &Options) -> usize {
    match (opts.batch, opts.buf_kind) {
        (false, _) => 0,
        (true, tracer_common::BUF_FAST_CIRCULAR) => 2,
        (true, _) => 4,
    }
}

/// Landing sites left to uprobes are untraced instead (`LandingNotPatched`): Rust's
/// dense pads (a 2-byte `jmp` each) would make tens of thousands of uprobes.
fn untrace_landings(p: &mut FunctionPlan, reqs: &[SiteReq]) {
    let landings: std::collections::HashSet<u32> = reqs
        .iter()
        .filter(|r| r.kind == SiteKind::Landing)
        .map(|r| r.id)
        .collect();
    let (moved, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut p.uprobes)
        .into_iter()
        .partition(|(id, _)| landings.contains(id));
    p.uprobes = kept;
    p.untraced.extend(
        moved
            .into_iter()
            .map(|(id, why)| (id, FallbackReason::LandingNotPatched(why.to_string()))),
    );
}

/// Why `[start, end)` may have branch targets flow recovery missed: an indirect jump in
/// it that is not explained as a jump table.
fn unresolved_jump(flow: &Flow, start: u64, end: u64) -> Option<FallbackReason> {
    let jumps = &flow.unresolved_indirect_jumps;
    let lo = jumps.partition_point(|&a| a < start);
    jumps
        .get(lo)
        .filter(|&&a| a < end)
        .map(|&at| FallbackReason::UnresolvedJump { at })
}
