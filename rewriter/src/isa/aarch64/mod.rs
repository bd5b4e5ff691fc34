//! AArch64 backend: disarm64 decodes the input, `enc` hand-encodes the few forms we
//! emit.
//!
//! A site displaces exactly one instruction (after a `bti`/`paci[ab]sp` landing pad,
//! which stays first so that indirect calls and return-address signing work as
//! before) and gets a single `B` to its trampoline (±128 MiB). Register and flag
//! discipline of the stub: it stores x9..x13 below sp (Linux arm64 has no red zone,
//! sp stays 16-byte aligned), never writes NZCV (comparisons are `sub` + `cbz`/`tbz`),
//! and reserves a record with an exclusive load/store pair (no LSE on cortex-a72; the
//! kernel clears the exclusive monitor on exception return, so a signal handler
//! recording in between makes the interrupted `stxr` fail and retry).
//!
//! Same spine as x86-64: the ELF writer, the RW layout, the record and the metadata
//! (`arch` = `ARCH_AARCH64`) are shared. Exits are `ret`, `retaa`/`retab` (x30 still
//! signed: the stub strips a copy) and `b` to another function's start. A window is
//! always the site's single instruction, so a branch landing on a block start, a `ret`
//! or a memory access simply runs its stub; entry and exit stubs are the same code (x0
//! is the argument at an entry, the return value at an exit), and since the stub never
//! writes NZCV it is the same for every kind. No padding is needed; new segments are 64
//! KiB aligned (the page size AArch64 binaries are linked for).
//!
//! **Untraced** (`SiteMode::Untraced`, reason `ExclusiveSequence`): a site after a
//! load-exclusive and up to its store-exclusive; a stub's stores and its own exclusive
//! pair, like a uprobe's trap, clear the monitor, and the store-exclusive would fail on
//! every retry (after a load-exclusive no store-exclusive follows, a wait on the
//! monitor, sites stay uprobe sites). `rewriter -v` and `tracer report` list them. A
//! site at the load-exclusive itself is inline: its stub runs before the load, and a
//! retry runs it again as the load runs again. An entry there (a function that starts
//! with its load-exclusive, the retry's target) runs after the sequence and its retry
//! branch if every way out of the sequence goes there and nothing else does
//! (`entry_after_sequence`; the sequence moves no stack pointer and calls nothing);
//! otherwise, or when it records a value, it stays a uprobe site. Tests
//! `tests/tests/exclusive.rs` (the bytes of every sequence of a `-mno-outline-atomics`
//! build are the original's, against objdump) and `cargo xtask test-arm64-vm` (4
//! threads end with the right sums under the kernel drain).
//!
//! **Access runs** (`runs.rs`, `isa::runs`): a memory site's stub also records the memory
//! sites after it in its basic block whose address registers nothing writes from it up
//! to them (two accesses a record); their words stay where they are, with no window of
//! their own. Not with unsure branch targets; exclusive and atomic accesses never join.
//!
//! **Uprobe instead** when the trampoline is out of `B`'s range, or the displaced
//! instruction is a known branch target (direct branches from a linear sweep, function
//! symbols) other than the function start, an indirect call (`blr*`), a trap (`svc`, `brk`,
//! `hlt`, `udf`), undecodable, or a PC-relative form not relocated (SIMD literal loads,
//! compare-and-branch, `bc.cond`).

mod enc;
mod flow;
mod mem;
mod reloc;
mod runs;
mod runtime;
mod slot;
mod stub;
mod sys;
mod usdt;
mod wait;

use super::{
    Branch, Candidate, FunctionPlan, InsnFacts, Isa, Layout, Runtime, SiteReq, Span, Targets,
    Trampoline, Window, merge_windows,
};
use crate::elf::read::{Function, Input};
use crate::isa::arg::{Arg, Reg as UsdtReg};
use reloc::Class;
use tracer_common::meta::{FallbackReason, SiteKind};
use tracer_common::operand::{
    A64_REG_PC, OP_ADDR, OPF_INDEX_SXTW, OPF_INDEX_UXTW, OPF_STRIP_PAC, Operand, OperandSet,
    REG_NONE,
};

pub(crate) struct Aarch64;

/// Width of the `B` written over the site.
const INSN: usize = 4;

/// The record flags of a memory site (read/write, size).
fn mem_flags(m: &mem::MemAccess) -> u32 {
    let mut flags = m.size.min(0xffff) << tracer_common::FLAG_MEM_SIZE_SHIFT;
    if m.read {
        flags |= tracer_common::FLAG_MEM_READ;
    }
    if m.write {
        flags |= tracer_common::FLAG_MEM_WRITE;
    }
    flags
}

fn word_at(bytes: &[u8], i: usize) -> Option<u32> {
    let b = bytes.get(i..i + INSN)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

/// The function's LDXR … STXR ranges, both included: a stub's stores and its own
/// exclusive pair, like a uprobe's trap, clear the monitor of a sequence they run
/// inside, and the store-exclusive then fails on every retry. A site at the
/// load-exclusive itself is fine: its stub runs before the load. Also the ranges from
/// a load-exclusive that no store-exclusive follows (a wait on the monitor, `ldaxr;
/// cbnz; wfe`): no store can fail there, so their sites stay uprobe sites as before.
struct Exclusive {
    closed: Vec<std::ops::RangeInclusive<u64>>,
    open: Vec<std::ops::RangeInclusive<u64>>,
}

fn exclusive_ranges(bytes: &[u8], addr: u64, size: usize) -> Exclusive {
    let mut x = Exclusive {
        closed: Vec::new(),
        open: Vec::new(),
    };
    let mut load: Option<u64> = None;
    for i in (0..size).step_by(INSN) {
        let pc = addr + i as u64;
        let Some(wi) = word_at(bytes, i) else { break };
        match reloc::classify(wi, pc) {
            Class::LoadExclusive => {
                if let Some(start) = load.replace(pc) {
                    x.open.push(start..=pc - INSN as u64);
                }
            }
            Class::StoreExclusive => {
                if let Some(start) = load.take() {
                    x.closed.push(start..=pc);
                }
            }
            _ => {}
        }
    }
    if let Some(start) = load {
        x.open.push(start..=addr + size as u64);
    }
    x
}

/// A function's code as `plan_function` sees it: its words, its first instruction and
/// its exclusive sequences.
struct Body<'a> {
    addr: u64,
    bytes: &'a [u8],
    /// Whole instructions in the function and the file.
    size: usize,
    first: Option<u32>,
    /// The function starts with a landing pad (`bti`, `paciasp`...).
    pad: bool,
    exclusive: Exclusive,
}

impl<'a> Body<'a> {
    fn new(addr: u64, bytes: &'a [u8], f_size: u64) -> Self {
        let size = (f_size as usize).min(bytes.len()) / INSN * INSN;
        let first = word_at(bytes, 0).filter(|_| size >= INSN);
        Body {
            addr,
            bytes,
            size,
            first,
            pad: first.is_some_and(|w| enc::LANDING_PADS.contains(&w)),
            exclusive: exclusive_ranges(bytes, addr, size),
        }
    }

    /// A site inside an exclusive sequence: untraced, with the sequence's start.
    fn untraced(&self, r: &SiteReq) -> (u32, FallbackReason) {
        let x = self.exclusive.closed.iter().find(|x| x.contains(&r.addr));
        let at = x.map_or(r.addr, |x| *x.start());
        (r.id, FallbackReason::ExclusiveSequence { at })
    }

    /// Where `r`'s stub goes and whether it can: a one-instruction window or a uprobe.
    fn candidate(&self, r: &SiteReq, targets: &Targets) -> Candidate {
        let entry = r.kind == SiteKind::FunctionEntry;
        let at = if entry && self.pad {
            self.addr + INSN as u64
        } else {
            r.addr
        };
        // An entry at a load-exclusive runs after its sequence (unless it
        // records a value, which the sequence may have overwritten).
        let moved = (self.exclusive.closed.iter())
            .find(|x| entry && r.args.is_empty() && *x.start() == at)
            .and_then(|x| entry_after_sequence(self.bytes, self.addr, self.size, x, targets));
        let at = moved.unwrap_or(at);
        let c = |why: String| Candidate::uprobe(r, at, FallbackReason::Detail(why));
        let Some(w) = word_at(self.bytes, (at - self.addr) as usize)
            .filter(|_| at + INSN as u64 <= self.addr + self.size as u64)
        else {
            return c("function too short to patch".into());
        };
        if let Some(why) = self.refusal(r, at, w, moved.is_some(), targets) {
            return c(why);
        }
        let flags = match (r.kind, mem::classify(w, at)) {
            (SiteKind::Memory, Some(m)) => mem_flags(&m),
            (SiteKind::Memory, None) => {
                return Candidate::uprobe(r, at, FallbackReason::NotMemoryAccess);
            }
            _ => 0,
        };
        Candidate {
            req: r.clone(),
            at,
            insn: at,
            ea_shift: 0,
            signed_lr: self.signed_lr(r.kind, w),
            flags,
            // The AArch64 stub never writes NZCV and saves what it uses.
            keep_flags: false,
            keep_r11: false,
            flags_dead: false,
            window: Ok(Span {
                start: at,
                len: INSN,
                code_len: INSN,
            }),
        }
    }

    /// Why the instruction `w` at `at` cannot be displaced for `r`'s stub, if it cannot.
    fn refusal(
        &self,
        r: &SiteReq,
        at: u64,
        w: u32,
        moved: bool,
        targets: &Targets,
    ) -> Option<String> {
        let entry = r.kind == SiteKind::FunctionEntry;
        if let Class::Refuse(why) = reloc::classify(w, at) {
            return Some(format!("{why} at {at:#x}"));
        }
        // A branch landing on an entry's displaced instruction after a landing
        // pad would run the entry stub; landing on an exit (the `ret` itself)
        // is that exit.
        if entry && !moved && at != self.addr && targets.all.binary_search(&at).is_ok() {
            return Some(format!(
                "branch target {at:#x} is the displaced instruction"
            ));
        }
        // An entry at a load-exclusive that the sequence's retry branches back
        // to would run the entry stub at every retry; after a load-exclusive
        // with no store-exclusive, a stub's own pair would still clear the
        // monitor a wait relies on.
        let open = self.exclusive.open.iter().find(|x| x.contains(&at));
        let entry_at_load = (self.exclusive.closed.iter()).find(|x| entry && x.contains(&at));
        open.or(entry_at_load).map(|x| {
            format!(
                "inside an exclusive load/store sequence ({:#x}..{:#x})",
                x.start(),
                x.end()
            )
        })
    }

    /// Whether the return address is signed at the site (an entry's PAC pad, an
    /// authenticating return).
    fn signed_lr(&self, kind: SiteKind, w: u32) -> bool {
        match kind {
            SiteKind::FunctionEntry => self.first.is_some_and(|w| enc::PAC_PADS.contains(&w)),
            SiteKind::FunctionExit => reloc::is_return(w) == Some(true),
            SiteKind::Block
            | SiteKind::Memory
            | SiteKind::Usdt
            | SiteKind::Call
            | SiteKind::Landing
            | SiteKind::Resume => false,
        }
    }
}

/// Where an entry at the load-exclusive `x.start()` of a closed sequence `x` runs
/// instead: its retry branches back to the load, and a stub there would run at every
/// retry (a uprobe there the kernel refuses on hardware). The first instruction after
/// the sequence and its retry branch, if every way out of the sequence goes there and
/// nothing else does: the entry is recorded once, a few instructions late (the
/// sequence moves no stack pointer and calls nothing).
fn entry_after_sequence(
    bytes: &[u8],
    f_addr: u64,
    size: usize,
    x: &std::ops::RangeInclusive<u64>,
    targets: &Targets,
) -> Option<u64> {
    let word = |pc: u64| word_at(bytes, usize::try_from(pc.checked_sub(f_addr)?).ok()?);
    let start = *x.start();
    let mut after = *x.end() + INSN as u64;
    if reloc::branch_target(word(after)?, after) == Some(start) {
        after += INSN as u64;
    }
    if after >= f_addr + size as u64 {
        return None;
    }
    let mut into_after = 0;
    for pc in (start..after).step_by(INSN) {
        let w = word(pc)?;
        // Branches to a register (`br`, `blr`, `ret`) and calls leave some other way.
        if w & 0xfe00_0000 == 0xd600_0000 || matches!(reloc::classify(w, pc), Class::Bl { .. }) {
            return None;
        }
        match reloc::branch_target(w, pc) {
            Some(t) if t == after => into_after += 1,
            Some(t) if !(start..after).contains(&t) => return None,
            _ => {}
        }
    }
    let reached = targets.all.binary_search(&after).is_ok();
    (!reached || targets.local_jumps(after) == Some(into_after)).then_some(after)
}

impl Isa for Aarch64 {
    fn arch(&self) -> u32 {
        tracer_common::ARCH_AARCH64
    }

    fn usdt_operand(
        &self,
        operand: &str,
        _pc: u64,
        resolve: &dyn Fn(&str) -> Result<u64, crate::isa::arg::ArgError>,
    ) -> Result<crate::isa::arg::ArgLoc, crate::isa::arg::ArgError> {
        usdt::operand(operand, resolve)
    }

    fn direct_call_targets(&self, addr: u64, bytes: &[u8], out: &mut Vec<u64>) {
        for (i, c) in bytes.chunks_exact(INSN).enumerate() {
            let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if let Class::Bl { target } = reloc::classify(w, addr + (i * INSN) as u64) {
                out.push(target);
            }
        }
    }

    fn direct_branches(&self, addr: u64, bytes: &[u8], out: &mut Vec<Branch>) {
        for (i, c) in bytes.chunks_exact(INSN).enumerate() {
            let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let from = addr + (i * INSN) as u64;
            if let Some(to) = reloc::branch_target(w, from) {
                let call = matches!(reloc::classify(w, from), Class::Bl { .. });
                out.push(Branch { from, to, call });
            }
        }
    }

    fn insn_facts(&self, input: &Input, f: &Function, memory: bool) -> Vec<InsnFacts> {
        let Some(bytes) = input.bytes_at(f.addr) else {
            return Vec::new();
        };
        let n = (f.size as usize).min(bytes.len()) / INSN * INSN;
        (0..n)
            .step_by(INSN)
            .filter_map(|i| Some((f.addr + i as u64, word_at(bytes, i)?)))
            .map(|(pc, w)| {
                let class = reloc::classify(w, pc);
                InsnFacts {
                    addr: pc,
                    is_return: reloc::is_return(w).is_some(),
                    direct_jump: match class {
                        Class::B { target } => Some(target),
                        _ => None,
                    },
                    indirect_jump: flow::is_indirect_branch(w),
                    transfers: reloc::transfers(w, pc),
                    memory: memory && mem::classify(w, pc).is_some(),
                    call: matches!(class, Class::Bl { .. } | Class::Blr { .. }),
                    callee: match class {
                        Class::Bl { target } => Some(target),
                        _ => None,
                    },
                    next: pc + INSN as u64,
                    landing_pad: enc::LANDING_PADS.contains(&w),
                    padding: w == enc::NOP,
                }
            })
            .collect()
    }

    /// Each `adrp x16, PAGE; ldr x17, [x16, #OFF]` of `.plt` (then `add`, `br x17`);
    /// the entry starts at a `bti c` (`LANDING_PADS[0]`) right before.
    fn plt_slots(&self, input: &Input) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for sec in input.sections.iter().filter(|s| s.name == ".plt") {
            let Some(bytes) = input.bytes_at(sec.addr) else {
                continue;
            };
            let n = (sec.size as usize).min(bytes.len()) / INSN;
            let word = |k: usize| word_at(bytes, k * INSN);
            for k in 0..n.saturating_sub(1) {
                let pc = sec.addr + (k * INSN) as u64;
                let (Some(w), Some(next)) = (word(k), word(k + 1)) else {
                    continue;
                };
                let Class::Adrp { rd: 16, target } = reloc::classify(w, pc) else {
                    continue;
                };
                // LDR Xt, [X16, #imm12 * 8] into x17.
                if next & 0xffc0_03ff != 0xf940_0000 | 16 << 5 | 17 {
                    continue;
                }
                let slot = target + u64::from((next >> 10) & 0xfff) * 8;
                let entry = match k.checked_sub(1).and_then(word) {
                    Some(b) if b == enc::LANDING_PADS[0] => pc - INSN as u64,
                    _ => pc,
                };
                out.push((entry, slot));
            }
        }
        out
    }

    fn plan_function(
        &self,
        input: &Input,
        f: &Function,
        reqs: &[SiteReq],
        targets: &Targets,
        // Windows are single instructions: no interior that a branch could land in;
        // access runs need every branch target known.
        unsure: Option<&FallbackReason>,
        _part: bool,
        run_cap: usize,
    ) -> FunctionPlan {
        if f.size == 0 {
            return FunctionPlan::all_uprobes(reqs, FallbackReason::NoSize);
        }
        if !f.addr.is_multiple_of(4) {
            return FunctionPlan::all_uprobes(reqs, FallbackReason::Unaligned);
        }
        let Some(bytes) = input.bytes_at(f.addr) else {
            return FunctionPlan::all_uprobes(reqs, FallbackReason::NotFileBacked);
        };
        let body = Body::new(f.addr, bytes, f.size);
        let (inside, reqs): (Vec<&SiteReq>, Vec<&SiteReq>) = reqs.iter().partition(|r| {
            r.kind != SiteKind::FunctionEntry
                && (body.exclusive.closed.iter()).any(|x| *x.start() < r.addr && r.addr <= *x.end())
        });
        let untraced = inside.iter().map(|r| body.untraced(r)).collect();
        let mut cands: Vec<Candidate> = reqs
            .into_iter()
            .map(|r| body.candidate(r, targets))
            .collect();
        // A member needs no window: nothing can fail that the plain plan would not.
        let runs = match (run_cap, unsure) {
            (2.., None) => runs::batch(&body, targets, &mut cands, run_cap),
            _ => Default::default(),
        };
        FunctionPlan {
            untraced,
            runs,
            ..merge_windows(cands, |_| None)
        }
    }

    fn probe_addr(&self, input: &Input, f: &Function, req: &SiteReq) -> u64 {
        if req.kind != SiteKind::FunctionEntry {
            return req.addr;
        }
        match input.bytes_at(f.addr).and_then(|b| word_at(b, 0)) {
            Some(w) if enc::LANDING_PADS.contains(&w) => f.addr + INSN as u64,
            _ => f.addr,
        }
    }

    fn emit_runtime(
        &self,
        layout: &Layout,
        at: u64,
        original_entry: u64,
    ) -> Result<(Vec<u8>, Runtime), String> {
        runtime::emit(layout, at, original_entry)
    }

    fn emit_window(
        &self,
        input: &Input,
        layout: &Layout,
        rt: &Runtime,
        w: &Window,
        at: u64,
    ) -> Result<Trampoline, String> {
        let word = input
            .bytes_at(w.start)
            .and_then(|b| word_at(b, 0))
            .ok_or("site not in a file-backed segment")?;
        // Access-run members: their own words, outside the one-word window.
        let members = (w.sites.iter().filter(|s| s.insn != w.start))
            .map(|s| {
                let word = input.bytes_at(s.insn).and_then(|b| word_at(b, 0));
                Ok((
                    s.insn,
                    word.ok_or("memory site not in a file-backed segment")?,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let code = stub::emit_window(layout, rt, (word, w.start), &w.sites, &members, at)
            .map_err(|e| format!("site {:#x}: {e}", w.start))?;
        Ok(Trampoline {
            code,
            landed: Vec::new(),
        })
    }

    fn patch_bytes(&self, w: &Window, to: u64, _landed: &[u64]) -> Result<Vec<u8>, String> {
        let (from, len) = (w.start, w.len);
        if len != INSN {
            return Err(format!(
                "AArch64 sites displace one instruction, not {len} bytes"
            ));
        }
        let w = enc::b(from, to).ok_or_else(|| {
            format!("trampoline at {to:#x} out of B range (±128 MiB) from {from:#x}")
        })?;
        Ok(w.to_le_bytes().to_vec())
    }

    fn anchor(&self) -> &'static [u8] {
        &[0x1f, 0x20, 0x03, 0xd5] // nop
    }

    fn code_fill(&self) -> u8 {
        0 // trampolines are whole words, so the padding is whole `udf #0` words
    }

    fn segment_align(&self) -> u64 {
        // AArch64 binaries are linked for (and kernels may run with) 64 KiB pages.
        0x10000
    }

    fn thread_word_offset(&self) -> i32 {
        // TLS variant I: the executable's block follows the 16-byte TCB.
        16
    }

    fn uprobe_operands(
        &self,
        input: &Input,
        kind: SiteKind,
        addr: u64,
        args: &[Arg],
    ) -> Option<OperandSet> {
        match kind {
            SiteKind::Memory => {
                let w = input.bytes_at(addr).and_then(|b| word_at(b, 0))?;
                let m = mem::classify(w, addr)?;
                // Descriptor numbering = the base field's (x0..x30, 31 = sp).
                let strip = if m.auth { OPF_STRIP_PAC } else { 0 };
                let at_base = |disp| Operand {
                    kind: OP_ADDR,
                    base: m.base,
                    index: REG_NONE,
                    flags: strip,
                    disp,
                    ..Default::default()
                };
                let ea = match m.addr {
                    // Pre-index too: the access is at base + imm, written back after.
                    mem::Addr::Offset(imm) => at_base(imm),
                    // The access is at the base; the offset is added after.
                    mem::Addr::PostIndex => at_base(0),
                    // The stub refuses an authenticated base with a register offset.
                    mem::Addr::Reg { .. } if m.auth => return None,
                    mem::Addr::Reg { rm, extend, shift } => Operand {
                        // Index 31 is xzr here, not sp.
                        index: if rm == 31 { REG_NONE } else { rm },
                        shift,
                        flags: match extend {
                            mem::Extend::Uxtw => OPF_INDEX_UXTW,
                            mem::Extend::Sxtw => OPF_INDEX_SXTW,
                            mem::Extend::Lsl | mem::Extend::Sxtx => 0,
                        },
                        ..at_base(0)
                    },
                    mem::Addr::Literal(target) => {
                        super::operands::pc_relative(OP_ADDR, target, addr, A64_REG_PC)
                    }
                };
                Some(super::operands::memory_set(ea, mem_flags(&m)))
            }
            SiteKind::Usdt => super::operands::usdt_set(args, addr, A64_REG_PC, |r| match *r {
                // x0..x30, 31 = sp: the descriptor numbering.
                UsdtReg::A64(n) if n <= 31 => Some((n, false)),
                _ => None,
            }),
            _ => None,
        }
    }
}
