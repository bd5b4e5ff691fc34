//! x86-64 backend: iced-x86 decodes the input and encodes stubs and relocated
//! instructions.
//!
//! Register and flag discipline of the inline stub: it moves below the red zone
//! (`lea -128(%rsp)`) and saves the registers it uses with push/pop; where the status
//! flags may be live it saves them (`lahf`/`seto`, `stub.rs`), elsewhere (entries and
//! exits, where the psABI makes them dead, and sites whose flags are written before
//! they are read) it clobbers them. The out-of-line register routine saves RFLAGS
//! itself. Memory sites in one block may share a stub (`runs.rs`: access runs).
//!
//! Windows. An entry window runs forward from the site (a direct `call` may only end
//! it: it becomes `push <original return address>; jmp callee`, so the callee returns
//! behind the window and unwinders see the real caller) and may take the int3/nop
//! padding after a function shorter than 5 bytes; an exit window runs backward over the
//! instructions before the `ret` or forward into the padding. Where those hold a branch
//! target, a window may still start a few instructions earlier and grow over the jumps
//! to its inside (`isa::Targets::local_jumps`, counted by the sweep) and end a few
//! instructions later than it must, for room: those jumps move along and are re-pointed
//! at the copy (labels in `stub::emit_window`); targets that code outside still jumps
//! to get a landing (5 bytes, or a 2-byte hop to a 5-byte jump in unused bytes). Such a
//! window may hold calls anywhere: the callee returns to the original address after the
//! call, which gets a landing. A jump in a window to a `ret` outside it goes to a
//! **tail**, the trampoline's own copy of that `ret` after the stubs of its sites, so
//! an exit with no room for a window of its own is still recorded inline on that way.
//! There is no `reloc.rs`: iced-x86's block encoder relocates a window's instructions
//! where the stub is emitted.
//!
//! Exits that stay uprobes (issue 30's 99.9 % inline target is met on libstdc++, not yet on
//! python3.11 or librustc_driver): an indirect jump the scanner cannot explain makes its
//! whole function's interior unsure (a jump whose value comes from registers live into a
//! split-off part, a reload from a frame whose address was passed out); a function of 1 to
//! 4 bytes with no padding after it that is called (python3.11 exports a dozen, such as
//! `PyEval_InitThreads`, a lone `ret`: callers through the dynamic symbol cannot be
//! re-pointed); a branch target inside the bytes a window needs that a jump from outside
//! the window reaches. No return trampolines: a swapped return address breaks the program's
//! own unwinder (a uretprobe on a throwing function aborts a C++ program).

mod flow;
mod runs;
mod runtime;
mod slot;
mod spill;
mod stub;
mod sys;
mod usdt;
mod wait;

#[cfg(test)]
mod tests;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};

use std::collections::HashMap;

use super::{
    Branch, Candidate, Entered, FunctionPlan, InsnFacts, Isa, Landing, Layout, PlacedSite, Runtime,
    SiteReq, Span, Tail, Targets, Trampoline, Window, merge_windows,
};
use crate::elf::read::{Function, Input};
use crate::isa::arg::{Arg, Reg as UsdtReg};
use tracer_common::meta::{FallbackReason, SiteKind};
use tracer_common::operand::{OP_ADDR, OPF_TP, Operand, OperandSet, REG_NONE, X86_REG_PC};

pub(crate) struct X86_64;

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// `jmp rel32`.
pub(crate) const JMP_LEN: usize = 5;

/// The function's instructions from a linear sweep (compilers put no data in x86-64
/// code), or why it cannot be decoded.
fn decode_function(input: &Input, f: &Function) -> Result<Vec<Instruction>, FallbackReason> {
    if f.size == 0 {
        return Err(FallbackReason::NoSize);
    }
    let bytes = input
        .bytes_at(f.addr)
        .ok_or(FallbackReason::NotFileBacked)?;
    let n = (f.size as usize).min(bytes.len());
    let mut dec = Decoder::with_ip(64, &bytes[..n], f.addr, DecoderOptions::NONE);
    let mut out = Vec::new();
    while dec.can_decode() {
        let ins = dec.decode();
        if ins.is_invalid() {
            return Err(FallbackReason::Undecodable { at: ins.ip() });
        }
        out.push(ins);
    }
    Ok(out)
}

/// The record flags of a memory site at `ins` (read/write, size), or None if it is
/// not one we trace: no explicit memory operand (implicit stack and string accesses
/// are not sites), `lea`/hint nops (no access), vector gathers/scatters, `%gs`, or
/// 32-bit addressing.
fn mem_flags(ins: &Instruction) -> Option<u32> {
    use iced_x86::{InstructionInfoFactory, OpAccess};
    if !(0..ins.op_count()).any(|k| ins.op_kind(k) == OpKind::Memory) || ins.is_vsib() {
        return None;
    }
    if !matches!(
        ins.memory_segment(),
        Register::DS | Register::SS | Register::ES | Register::CS | Register::FS
    ) || matches!(ins.memory_base(), b if b != Register::None && b != Register::RIP && !b.is_gpr64())
    {
        return None;
    }
    let mut factory = InstructionInfoFactory::new();
    let info = factory.info(ins);
    // The explicit operand among the used memory (a `push (%rax)` also writes the
    // stack); iced reports a RIP-relative operand with no base and the absolute
    // address as displacement.
    let explicit_base = match ins.memory_base() {
        Register::RIP => Register::None,
        b => b,
    };
    let m = info.used_memory().iter().find(|m| {
        m.base() == explicit_base
            && m.index() == ins.memory_index()
            && m.displacement() == ins.memory_displacement64()
    })?;
    let (read, write) = match m.access() {
        OpAccess::Read | OpAccess::CondRead => (true, false),
        OpAccess::Write | OpAccess::CondWrite => (false, true),
        OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
        _ => return None,
    };
    let size = ins.memory_size().size() as u32;
    if size == 0 {
        return None;
    }
    let mut flags = size.min(0xffff) << tracer_common::FLAG_MEM_SIZE_SHIFT;
    if read {
        flags |= tracer_common::FLAG_MEM_READ;
    }
    if write {
        flags |= tracer_common::FLAG_MEM_WRITE;
    }
    Some(flags)
}

/// The instructions of the access-run members placed in `w` that are not among its
/// own `insns` (`isa::runs`: a member needs no window).
fn run_members(
    input: &Input,
    w: &Window,
    insns: &[Instruction],
) -> Result<Vec<Instruction>, String> {
    let mut out = Vec::new();
    for s in w.sites.iter().filter(|s| s.insn != s.at) {
        if insns.iter().any(|i| i.ip() == s.insn) {
            continue;
        }
        let b = input
            .bytes_at(s.insn)
            .ok_or("memory site not in a file-backed segment")?;
        let ins =
            Decoder::with_ip(64, &b[..b.len().min(16)], s.insn, DecoderOptions::NONE).decode();
        if ins.is_invalid() {
            return Err(format!("undecodable memory site at {:#x}", s.insn));
        }
        out.push(ins);
    }
    Ok(out)
}

/// Where a call site's target comes from: None for a direct call (the stub takes its
/// address), else the register or memory operand as a value to load.
fn call_target(ins: &Instruction) -> Result<Option<crate::isa::arg::Arg>, String> {
    use crate::isa::arg::{Arg, ArgLoc, Reg};
    let reg = |r: Register| Reg::X86 {
        reg: r,
        high8: false,
    };
    let loc = match ins.op0_kind() {
        OpKind::NearBranch64 => return Ok(None),
        OpKind::Register => ArgLoc::Reg(reg(ins.op0_register())),
        OpKind::Memory if ins.memory_base() == Register::RIP => ArgLoc::Static {
            addr: ins.memory_displacement64(),
        },
        OpKind::Memory
            if matches!(ins.memory_segment(), Register::DS | Register::SS)
                && ins.memory_base() != Register::RIP =>
        {
            ArgLoc::Mem {
                base: Some(ins.memory_base())
                    .filter(|&b| b != Register::None)
                    .map(reg),
                index: Some(ins.memory_index())
                    .filter(|&i| i != Register::None)
                    .map(|i| (reg(i), ins.memory_index_scale() as u8)),
                disp: ins.memory_displacement64() as i64,
            }
        }
        _ => return Err(format!("call at {:#x}: operand not re-created", ins.ip())),
    };
    Ok(Some(Arg {
        size: 8,
        signed: false,
        float: false,
        loc,
    }))
}

/// Bytes after the function up to `limit` that are only inter-function padding
/// (`int3`, `nop` forms): a window may overwrite them.
fn padding_after(input: &Input, end: u64, limit: u64) -> usize {
    let Some(bytes) = input.bytes_at(end) else {
        return 0;
    };
    let n = (limit.saturating_sub(end) as usize)
        .min(bytes.len())
        .min(16);
    let mut dec = Decoder::with_ip(64, &bytes[..n], end, DecoderOptions::NONE);
    let mut len = 0;
    while dec.can_decode() {
        let ins = dec.decode();
        if ins.is_invalid()
            || !(ins.mnemonic() == Mnemonic::Int3 || ins.mnemonic() == Mnemonic::Nop)
        {
            break;
        }
        len += ins.len();
    }
    len
}

/// Why an instruction cannot be moved into a trampoline as instruction `i` of a window
/// of `n` (None: it can).
fn unmovable(ins: &Instruction, last: bool) -> Option<String> {
    match ins.flow_control() {
        // The callee would return into the overwritten range, unless the call ends
        // the window (its return address is then the window's end; the trampoline
        // pushes it and jumps, see stub::emit_window). An indirect call through
        // `%fs:`/`%gs:` or with `%rsp` as index is not re-created.
        FlowControl::Call if last && ins.op0_kind() == OpKind::NearBranch64 => None,
        FlowControl::IndirectCall
            if last
                && (ins.op0_kind() == OpKind::Register
                    || ins.op0_kind() == OpKind::Memory
                        && matches!(ins.memory_segment(), Register::DS | Register::SS)
                        && ins.memory_index() != Register::RSP) =>
        {
            None
        }
        FlowControl::Call | FlowControl::IndirectCall => {
            Some(format!("call at {:#x} in the displaced bytes", ins.ip()))
        }
        FlowControl::Interrupt | FlowControl::Exception => Some(format!(
            "trap instruction at {:#x} in the displaced bytes",
            ins.ip()
        )),
        _ => None,
    }
}

fn is_call(ins: &Instruction) -> bool {
    matches!(
        ins.flow_control(),
        FlowControl::Call | FlowControl::IndirectCall
    )
}

/// The direct jump at `from` to `to` if its displacement is its last 4 bytes.
fn rel32_jump(input: &Input, from: u64, to: u64) -> Option<Entered> {
    let bytes = input.bytes_at(from)?;
    let ins = Decoder::with_ip(
        64,
        &bytes[..bytes.len().min(16)],
        from,
        DecoderOptions::NONE,
    )
    .decode();
    let len = ins.len();
    let is_jump = matches!(
        ins.flow_control(),
        FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
    ) && ins.op0_kind() == OpKind::NearBranch64;
    // Not a rel8 form padded with prefixes: the last 4 bytes are the displacement.
    let rel = i32::from_le_bytes(bytes.get(len.checked_sub(4)?..len)?.try_into().ok()?);
    let lands = (from + len as u64).wrapping_add(rel as i64 as u64) == to;
    (is_jump && lands).then_some(Entered {
        at: from,
        len: len as u8,
    })
}

/// `jmp rel32` at `from` to `to`.
fn jmp_rel32(from: u64, to: u64) -> Result<[u8; JMP_LEN], String> {
    let rel = to.wrapping_sub(from + JMP_LEN as u64) as i64;
    let rel32 = i32::try_from(rel)
        .map_err(|_| format!("trampoline at {to:#x} out of jmp rel32 range from {from:#x}"))?;
    let r = rel32.to_le_bytes();
    Ok([0xe9, r[0], r[1], r[2], r[3]])
}

/// Landings for the targets `outside` (sorted) of a window over `[start, end)` that
/// code outside it jumps to: a 5-byte jump where there is room before the next one,
/// else a 2-byte hop to a 5-byte jump in unused bytes within reach. None if they do
/// not fit (a target among the first 5 bytes, or less than 2 bytes of room).
fn place_landings(start: u64, end: u64, outside: &[u64]) -> Option<Vec<Landing>> {
    let jmp = JMP_LEN as u64;
    let mut used = vec![(start, start + jmp)];
    let mut out = Vec::new();
    let mut hops = Vec::new();
    for (n, &t) in outside.iter().enumerate() {
        let room = outside.get(n + 1).copied().unwrap_or(end).checked_sub(t)?;
        if t < start + jmp || room < 2 {
            return None;
        }
        if room >= jmp {
            used.push((t, t + jmp));
            out.push(Landing {
                target: t,
                hop: None,
            });
        } else {
            used.push((t, t + 2));
            hops.push(t);
        }
    }
    for t in hops {
        let reach =
            (t + 2).saturating_sub(128).max(start)..=(t + 2 + 127).min(end.checked_sub(jmp)?);
        let hop = reach
            .into_iter()
            .find(|&h| used.iter().all(|&(a, b)| h + jmp <= a || h >= b))?;
        used.push((hop, hop + jmp));
        out.push(Landing {
            target: t,
            hop: Some(hop),
        });
    }
    Some(out)
}

/// The most bytes a window grown over jumps to its inside moves.
const CLOSED_MAX: u64 = 512;
/// How many instructions before its site a window grown over jumps may start.
const CLOSED_BACK: usize = 8;
/// How many instructions past its shortest end a window grown over jumps may run.
const CLOSED_FORWARD: usize = 8;

/// The jumps of `insns` that a window can re-point, by target.
fn jumps_by_target(insns: &[Instruction]) -> HashMap<u64, Vec<usize>> {
    let mut by = HashMap::<u64, Vec<usize>>::new();
    for (k, ins) in insns.iter().enumerate() {
        if stub::is_internal_jump(ins) {
            by.entry(ins.near_branch_target()).or_default().push(k);
        }
    }
    by
}

fn is_target(targets: &[u64], a: u64) -> bool {
    targets.binary_search(&a).is_ok()
}

/// The window for a site at instruction `s` of `insns`: forward from `s` (an entry,
/// or a site that is itself a branch target), else backward over the instructions
/// before it. Instructions other than the window's first must not be branch targets.
fn window_for(
    insns: &[Instruction],
    s: usize,
    first_allowed: usize,
    pad: usize,
    targets: &[u64],
    backward: bool,
) -> Result<(usize, usize, usize), FallbackReason> {
    let mut why = None;
    if backward && !is_target(targets, insns[s].ip()) {
        // [i..=s], extending i down while shorter than a jmp.
        let mut i = s;
        let mut len = insns[s].len();
        let mut ok = true;
        if let Some(w) = unmovable(&insns[s], true) {
            ok = false;
            why = Some(FallbackReason::Detail(w));
        }
        while ok && len < JMP_LEN {
            if i == first_allowed {
                ok = false;
                why = Some(FallbackReason::Detail(
                    "too few bytes before it in the function".into(),
                ));
                break;
            }
            i -= 1;
            if let Some(w) = unmovable(&insns[i], false) {
                ok = false;
                why = Some(FallbackReason::Detail(w));
                break;
            }
            if is_target(targets, insns[i + 1].ip()) {
                ok = false;
                why = Some(FallbackReason::BranchTargetInside {
                    target: insns[i + 1].ip(),
                });
                break;
            }
            len += insns[i].len();
        }
        if ok {
            return Ok((i, s, len));
        }
    }
    // Forward: [s..=j], then the padding after the function.
    let mut j = s;
    let mut len = 0;
    loop {
        if j > s && is_target(targets, insns[j].ip()) {
            return Err(FallbackReason::BranchTargetInside {
                target: insns[j].ip(),
            });
        }
        len += insns[j].len();
        if let Some(w) = unmovable(&insns[j], len >= JMP_LEN || j + 1 == insns.len()) {
            return Err(FallbackReason::Detail(w));
        }
        if len >= JMP_LEN {
            return Ok((s, j, len));
        }
        if j + 1 == insns.len() {
            if len + pad >= JMP_LEN {
                return Ok((s, j, len));
            }
            return Err(why.unwrap_or_else(|| {
                FallbackReason::Detail(format!("function too short to patch ({len} bytes)"))
            }));
        }
        j += 1;
    }
}

/// gcc's interprocedural register allocation (-fipa-ra, on at -O2) lets a caller keep a
/// value in a call-clobbered register across a call to a function known not to write
/// it, directly or through its own callees: the stubs of this function's entry and
/// exits may only clobber RFLAGS and %r11 if the function itself writes them (then no
/// caller can count on them). Returns (keep RFLAGS, keep %r11).
fn preserved(insns: &[Instruction]) -> (bool, bool) {
    let mut factory = iced_x86::InstructionInfoFactory::new();
    let writes_r11 = insns.iter().any(|i| {
        factory.info(i).used_registers().iter().any(|u| {
            u.register().full_register() == Register::R11
                && !matches!(
                    u.access(),
                    iced_x86::OpAccess::Read | iced_x86::OpAccess::CondRead
                )
        })
    });
    let writes_flags = insns.iter().any(|i| i.rflags_modified() != 0);
    (!writes_flags, !writes_r11)
}

/// What planning one function's sites shares.
struct PlanCx<'a> {
    insns: &'a [Instruction],
    f_addr: u64,
    /// 1 when the function starts with a landing pad (`endbr64`).
    first: usize,
    /// Padding bytes after the function that a patch may overwrite.
    pad: usize,
    targets: &'a Targets,
    /// The jumps inside the function to each of its local targets (instruction indices).
    jumps: HashMap<u64, Vec<usize>>,
    unsure: Option<&'a FallbackReason>,
    keep_flags: bool,
    keep_r11: bool,
}

impl PlanCx<'_> {
    /// A window with branch targets inside, holding every jump to them (re-pointed at
    /// the trampoline's copies by `stub::emit_window`): the smallest of the windows
    /// around the site grown until no branch from outside lands inside.
    fn closed_window(&self, s: usize) -> Option<(usize, usize, usize)> {
        let insns = self.insns;
        let bytes = |i: usize, j: usize| (insns[j].next_ip() - insns[i].ip()) as usize;
        // Start at the site or up to a few instructions before it (the start may be a
        // target itself), end at the first instruction that makes the window long
        // enough.
        let lowest = s.saturating_sub(CLOSED_BACK).max(self.first);
        (lowest..=s)
            .flat_map(|i| {
                let mut j = s;
                while bytes(i, j) < JMP_LEN && j + 1 < insns.len() {
                    j += 1;
                }
                // And the padding after a `ret` or `jmp` there: room for landings.
                while j + 1 < insns.len() && self.dead_after(j) {
                    j += 1;
                }
                // Or a few instructions more: room for a landing on the last target.
                (j..insns.len().min(j + 1 + CLOSED_FORWARD)).map(move |j| (i, j))
            })
            .filter_map(|(i, j)| self.close(i, j))
            .min_by_key(|&(i, j)| bytes(i, j))
            .map(|(i, j)| (i, j, bytes(i, j)))
    }

    /// `[i, j]` grown over the jumps to the targets inside it while that keeps a
    /// window (movable instructions, at most `CLOSED_MAX` bytes), if the targets that
    /// code outside still jumps to then fit landings and the window is long enough.
    fn close(&self, mut i: usize, mut j: usize) -> Option<(usize, usize)> {
        let insns = self.insns;
        loop {
            let (i0, j0) = (i, j);
            for k in i0 + 1..=j0 {
                let ip = insns[k].ip();
                if !is_target(&self.targets.all, ip) || self.closed_inside(ip, i, j) {
                    continue;
                }
                let Some(from) = self.jumps.get(&ip).filter(|f| self.all_local(ip, f)) else {
                    continue;
                };
                let gi = from.iter().fold(i, |i, &f| i.min(f));
                let gj = from.iter().fold(j, |j, &f| j.max(f));
                if gi >= self.first
                    && insns[gj].next_ip() - insns[gi].ip() <= CLOSED_MAX
                    && self.movable(gi, gj)
                {
                    (i, j) = (gi, gj);
                }
            }
            if (i, j) == (i0, j0) {
                break;
            }
        }
        let len = (insns[j].next_ip() - insns[i].ip()) as usize;
        let ends = j + 1 == insns.len();
        if !self.movable(i, j) || !(len >= JMP_LEN || ends && len + self.pad >= JMP_LEN) {
            return None;
        }
        let start = insns[i].ip();
        place_landings(start, start + len.max(JMP_LEN) as u64, &self.outside(i, j))?;
        Some((i, j))
    }

    /// Whether the instruction after `j` is padding nothing reaches: a nop after an
    /// instruction that does not fall through (or after such padding).
    fn dead_after(&self, j: usize) -> bool {
        let (ins, next) = (&self.insns[j], &self.insns[j + 1]);
        let stops = matches!(
            ins.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        ) || ins.mnemonic() == Mnemonic::Nop;
        stops && next.mnemonic() == Mnemonic::Nop && !is_target(&self.targets.all, next.ip())
    }

    /// Whether `from` are all the jumps to the local target `ip`.
    fn all_local(&self, ip: u64, from: &[usize]) -> bool {
        self.targets.local_jumps(ip) == Some(from.len() as u32)
    }

    /// Whether every jump to `ip` is inside `[i, j]`.
    fn closed_inside(&self, ip: u64, i: usize, j: usize) -> bool {
        self.jumps
            .get(&ip)
            .is_some_and(|f| self.all_local(ip, f) && f.iter().all(|k| (i..=j).contains(k)))
    }

    /// The branch targets inside `[i, j]` that code outside it jumps to.
    /// And the return address of every call inside it but the last instruction: the
    /// callee returns there (the trampoline pushes the original address, see
    /// `stub::emit_window`).
    fn outside(&self, i: usize, j: usize) -> Vec<u64> {
        self.insns[i + 1..=j]
            .iter()
            .zip(&self.insns[i..j])
            .filter(|(ins, before)| {
                let ip = ins.ip();
                is_call(before) || is_target(&self.targets.all, ip) && !self.closed_inside(ip, i, j)
            })
            .map(|(ins, _)| ins.ip())
            .collect()
    }

    /// Whether `[i, j]` can move into a trampoline with landings (a call anywhere: its
    /// return address gets one).
    fn movable(&self, i: usize, j: usize) -> bool {
        (i..=j).all(|k| unmovable(&self.insns[k], true).is_none())
    }

    /// The returns outside `w` that its jumps go to, each with the sites at it.
    fn tails(&self, w: &Window, placed: &[PlacedSite]) -> Vec<Tail> {
        let code = w.start..w.start + w.code_len as u64;
        let mut tails: Vec<Tail> = Vec::new();
        for ins in self.insns.iter().filter(|i| code.contains(&i.ip())) {
            if !stub::is_internal_jump(ins) {
                continue;
            }
            let t = ins.near_branch_target();
            let is_ret = self
                .insns
                .binary_search_by_key(&t, Instruction::ip)
                .is_ok_and(|k| self.insns[k].flow_control() == FlowControl::Return);
            if code.contains(&t) || !is_ret || tails.iter().any(|x| x.at == t) {
                continue;
            }
            let sites: Vec<PlacedSite> = placed.iter().filter(|p| p.at == t).cloned().collect();
            if !sites.is_empty() {
                tails.push(Tail { at: t, sites });
            }
        }
        tails
    }

    /// A merged window's landings, or why it has none (a call no longer last, a
    /// target inside without room).
    fn finish(&self, w: &mut Window) -> Option<String> {
        let i = self.insns.partition_point(|x| x.ip() < w.start);
        let end = self
            .insns
            .partition_point(|x| x.ip() < w.start + w.code_len as u64);
        let j = end.checked_sub(1).filter(|&j| j >= i)?;
        if let Some(why) = (i..=j).find_map(|k| unmovable(&self.insns[k], true)) {
            return Some(why);
        }
        let outside = self.outside(i, j);
        match place_landings(w.start, w.start + w.len as u64, &outside) {
            Some(l) => {
                w.landings = l;
                None
            }
            None => Some(format!(
                "no room to land the jumps to {outside:#x?} inside the window"
            )),
        }
    }

    /// Where a split-off part's first run of instructions ends: after its first `ret`
    /// or jump, if no direct branch lands inside the run and it calls nothing (a callee
    /// would return to the original bytes, past the run's stubs).
    fn entered_run(&self) -> Option<u64> {
        let insns = self.insns;
        let k = insns.iter().position(|i| {
            matches!(
                i.flow_control(),
                FlowControl::Return
                    | FlowControl::UnconditionalBranch
                    | FlowControl::IndirectBranch
            )
        })?;
        let ok = self.first == 0
            && !self.targets.reached_indirectly(self.f_addr)
            && !insns[1..=k]
                .iter()
                .any(|i| is_target(&self.targets.all, i.ip()))
            && !insns[..=k].iter().any(is_call)
            && self.movable(0, k);
        ok.then(|| insns[k].next_ip())
    }

    /// The first run of a split-off part (up to `end`, see `entered_run`) as a window
    /// entered only by its jumps ([`Window::entered_by`]): when none but direct jumps
    /// with a 32-bit displacement from outside the run reach the part's start. The
    /// part's bytes stay: a way in not seen here runs them, untraced.
    fn entered_window(&self, input: &Input, end: u64, sites: Vec<PlacedSite>) -> Option<Window> {
        let inside = |a: u64| (self.f_addr..end).contains(&a);
        let mut entered_by = Vec::new();
        for from in self.targets.jumps_to(self.f_addr) {
            if inside(from) {
                return None;
            }
            entered_by.push(rel32_jump(input, from, self.f_addr)?);
        }
        (!entered_by.is_empty()).then(|| Window {
            start: self.f_addr,
            len: 0,
            code_len: (end - self.f_addr) as usize,
            sites,
            landings: Vec::new(),
            tails: Vec::new(),
            entered_by,
        })
    }

    /// A part whose first run has uprobe sites and no window, for want of room: entered
    /// by its jumps instead.
    fn enter_by_jumps(&self, input: &Input, plan: &mut FunctionPlan, placed: &[PlacedSite]) {
        let Some(end) = self.entered_run() else {
            return;
        };
        let run = self.f_addr..end;
        let overlaps =
            |w: &Window| w.start < end && w.start + w.len.max(w.code_len) as u64 > self.f_addr;
        if plan.windows.iter().any(overlaps) {
            return;
        }
        let at = |id: u32| placed.iter().find(|p| p.id == id);
        let (inside, outside): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.uprobes)
            .into_iter()
            .partition(|u| at(u.0).is_some_and(|p| run.contains(&p.at)));
        plan.uprobes = outside;
        let sites = inside.iter().filter_map(|u| at(u.0)).cloned().collect();
        match (inside.is_empty(), self.entered_window(input, end, sites)) {
            (false, Some(w)) => plan.windows.push(w),
            _ => plan.uprobes.extend(inside),
        }
    }

    /// Merge the candidates' windows into a plan.
    fn plan(&self, input: &Input, mut cands: Vec<Candidate>, part: bool) -> FunctionPlan {
        for c in &mut cands {
            c.flags_dead = self.flags_dead_at(c.at);
        }
        let placed: Vec<PlacedSite> = cands.iter().map(Candidate::placed).collect();
        let mut plan = merge_windows(cands, |w| self.finish(w));
        if part {
            self.enter_by_jumps(input, &mut plan, &placed);
        }
        for w in &mut plan.windows {
            w.tails = self.tails(w, &placed);
        }
        plan
    }

    /// Are the status flags dead at `at`: written whole by an instruction of the
    /// straight line from there before any reads one? (A branch, call or return on the
    /// way: unknown, so live; gcc's -fipa-ra may keep flags across a call.)
    fn flags_dead_at(&self, at: u64) -> bool {
        use iced_x86::RflagsBits;
        const STATUS: u32 = RflagsBits::OF
            | RflagsBits::SF
            | RflagsBits::ZF
            | RflagsBits::AF
            | RflagsBits::CF
            | RflagsBits::PF;
        let Some(i) = self.index_of(at) else {
            return false;
        };
        for ins in self.insns[i..].iter().take(32) {
            if ins.rflags_read() & STATUS != 0 {
                return false;
            }
            if ins.rflags_modified() & STATUS == STATUS {
                return true;
            }
            if ins.flow_control() != FlowControl::Next {
                return false;
            }
        }
        false
    }

    /// The index of the instruction at `at` (the instructions are in address order).
    fn index_of(&self, at: u64) -> Option<usize> {
        self.insns.binary_search_by_key(&at, Instruction::ip).ok()
    }

    fn insn_at(&self, at: u64) -> Option<&Instruction> {
        self.index_of(at).map(|i| &self.insns[i])
    }

    /// One site's own window, or why it has none.
    fn candidate(&self, r: &SiteReq) -> Candidate {
        let at = match r.kind {
            SiteKind::FunctionEntry => self.f_addr + 4 * self.first as u64,
            _ => r.addr,
        };
        let mut req = r.clone();
        if r.kind == SiteKind::Call {
            match self.insn_at(at).map(call_target) {
                Some(Ok(arg)) => req.args = arg.into_iter().collect(),
                Some(Err(why)) => {
                    return Candidate::uprobe(r, at, FallbackReason::Detail(why));
                }
                None => {}
            }
        }
        let r = &req;
        let flags = match r.kind {
            SiteKind::Memory => match self.insn_at(at).and_then(mem_flags) {
                Some(f) => f,
                None => {
                    return Candidate::uprobe(r, at, FallbackReason::NotMemoryAccess);
                }
            },
            _ => 0,
        };
        let Some(s) = self.index_of(at) else {
            return Candidate::uprobe(
                r,
                at,
                FallbackReason::Detail("not an instruction boundary".into()),
            );
        };
        if s < self.first {
            return Candidate::uprobe(r, at, FallbackReason::InLandingPad);
        }
        // A block at the function's start is entered like the function.
        let entry = at == self.f_addr + 4 * self.first as u64;
        // With the function's branch targets unsure, only a window whose interior
        // nothing can reach: the first instructions (entered by calls only), or a last
        // instruction with the padding after it.
        if let Some(why) = self.unsure.filter(|_| !entry && s + 1 != self.insns.len()) {
            return Candidate::uprobe(r, at, why.clone());
        }
        let window = self.window_at(s, entry);
        self.with_window(r, at, flags, window)
    }

    /// The instructions `[i..=j]` (and their length) of site `s`'s window: around it,
    /// or else (the function's branch targets known) one the targets leave closed.
    fn window_at(&self, s: usize, entry: bool) -> Result<(usize, usize, usize), FallbackReason> {
        window_for(
            self.insns,
            s,
            self.first,
            self.pad,
            &self.targets.all,
            !entry && self.unsure.is_none(),
        )
        .or_else(|why| match self.unsure {
            None => self.closed_window(s).ok_or(why),
            Some(_) => Err(why),
        })
    }

    /// The candidate of request `r` at `at` with its window or why it has none.
    fn with_window(
        &self,
        r: &SiteReq,
        at: u64,
        flags: u32,
        window: Result<(usize, usize, usize), FallbackReason>,
    ) -> Candidate {
        match window {
            Ok((i, j, len)) => {
                let start = self.insns[i].ip();
                let code_len = (self.insns[j].next_ip() - start) as usize;
                debug_assert!(len == code_len);
                Candidate {
                    req: r.clone(),
                    at,
                    insn: at,
                    ea_shift: 0,
                    signed_lr: false,
                    flags,
                    keep_flags: self.keep_flags,
                    keep_r11: self.keep_r11,
                    flags_dead: false,
                    // Shorter than a jmp only when the padding after the function
                    // makes up the rest.
                    window: Ok(Span {
                        start,
                        len: code_len.max(JMP_LEN),
                        code_len,
                    }),
                }
            }
            // Its flags go along: merge_windows may still place it inside a
            // neighbour's window.
            Err(why) => Candidate {
                flags,
                keep_flags: self.keep_flags,
                keep_r11: self.keep_r11,
                ..Candidate::uprobe(r, at, why)
            },
        }
    }
}

impl Isa for X86_64 {
    fn arch(&self) -> u32 {
        tracer_common::ARCH_X86_64
    }

    fn usdt_operand(
        &self,
        operand: &str,
        pc: u64,
        resolve: &dyn Fn(&str) -> Result<u64, crate::isa::arg::ArgError>,
    ) -> Result<crate::isa::arg::ArgLoc, crate::isa::arg::ArgError> {
        usdt::operand(operand, pc, resolve)
    }

    fn probe_addr(&self, input: &Input, f: &Function, req: &SiteReq) -> u64 {
        match (req.kind, input.bytes_at(f.addr)) {
            (SiteKind::FunctionEntry, Some(b)) if b.starts_with(&ENDBR64) => f.addr + 4,
            (SiteKind::FunctionEntry, _) => f.addr,
            _ => req.addr,
        }
    }

    fn insn_facts(&self, input: &Input, f: &Function, memory: bool) -> Vec<InsnFacts> {
        let Ok(insns) = decode_function(input, f) else {
            return Vec::new();
        };
        insns
            .iter()
            .map(|i| {
                let fc = i.flow_control();
                InsnFacts {
                    addr: i.ip(),
                    is_return: fc == FlowControl::Return,
                    direct_jump: (fc == FlowControl::UnconditionalBranch
                        && i.op0_kind() == OpKind::NearBranch64)
                        .then(|| i.near_branch_target()),
                    indirect_jump: fc == FlowControl::IndirectBranch,
                    transfers: fc != FlowControl::Next,
                    memory: memory && mem_flags(i).is_some(),
                    call: matches!(fc, FlowControl::Call | FlowControl::IndirectCall),
                    callee: match (fc, i.op0_kind()) {
                        (FlowControl::Call, OpKind::NearBranch64) => Some(i.near_branch_target()),
                        // iced gives a RIP-relative operand's absolute address.
                        (FlowControl::IndirectCall, OpKind::Memory)
                            if i.memory_base() == Register::RIP =>
                        {
                            Some(i.memory_displacement64())
                        }
                        _ => None,
                    },
                    next: i.next_ip(),
                    landing_pad: i.code() == Code::Endbr64,
                    padding: matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3),
                }
            })
            .collect()
    }

    /// Each `jmp *slot(%rip)` of the PLT sections; the entry starts at its `endbr64`
    /// when one comes right before (`.plt.sec`, IBT `.plt.got`).
    fn plt_slots(&self, input: &Input) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let plt = input
            .sections
            .iter()
            .filter(|s| matches!(s.name.as_str(), ".plt" | ".plt.sec" | ".plt.got"));
        for sec in plt {
            let Some(bytes) = input.bytes_at(sec.addr) else {
                continue;
            };
            let bytes = &bytes[..(sec.size as usize).min(bytes.len())];
            let mut dec = Decoder::with_ip(64, bytes, sec.addr, DecoderOptions::NONE);
            while dec.can_decode() {
                let ins = dec.decode();
                if ins.code() != Code::Jmp_rm64 || ins.memory_base() != Register::RIP {
                    continue;
                }
                let off = (ins.ip() - sec.addr) as usize;
                let entry = match off.checked_sub(4).map(|o| &bytes[o..off]) {
                    Some(b) if b == ENDBR64 => ins.ip() - 4,
                    _ => ins.ip(),
                };
                out.push((entry, ins.memory_displacement64()));
            }
        }
        out
    }

    fn direct_call_targets(&self, addr: u64, bytes: &[u8], out: &mut Vec<u64>) {
        let mut dec = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
        let mut ins = Instruction::default();
        while dec.can_decode() {
            dec.decode_out(&mut ins);
            if ins.flow_control() == FlowControl::Call && ins.op0_kind() == OpKind::NearBranch64 {
                out.push(ins.near_branch_target());
            }
        }
    }

    fn direct_branches(&self, addr: u64, bytes: &[u8], out: &mut Vec<Branch>) {
        let mut dec = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
        let mut ins = Instruction::default();
        while dec.can_decode() {
            dec.decode_out(&mut ins);
            let fc = ins.flow_control();
            if matches!(
                fc,
                FlowControl::UnconditionalBranch
                    | FlowControl::ConditionalBranch
                    | FlowControl::Call
                    | FlowControl::XbeginXabortXend
            ) && ins.op0_kind() == OpKind::NearBranch64
            {
                out.push(Branch {
                    from: ins.ip(),
                    to: ins.near_branch_target(),
                    // xbegin's abort path is entered like a call's return: never moved.
                    call: matches!(fc, FlowControl::Call | FlowControl::XbeginXabortXend),
                });
            }
        }
    }

    fn plan_function(
        &self,
        input: &Input,
        f: &Function,
        reqs: &[SiteReq],
        targets: &Targets,
        unsure: Option<&FallbackReason>,
        part: bool,
        run_cap: usize,
    ) -> FunctionPlan {
        let insns = match decode_function(input, f) {
            Ok(i) if !i.is_empty() => i,
            Ok(_) => return FunctionPlan::all_uprobes(reqs, FallbackReason::EmptyFunction),
            Err(why) => return FunctionPlan::all_uprobes(reqs, why),
        };
        let end = f.addr + f.size;
        let next = targets.all.partition_point(|&t| t < end);
        let limit = targets.all.get(next).copied().unwrap_or(u64::MAX);
        let (keep_flags, keep_r11) = preserved(&insns);
        let cx = PlanCx {
            insns: &insns,
            f_addr: f.addr,
            // The landing pad stays first: nothing is displaced before it.
            first: usize::from(
                input
                    .bytes_at(f.addr)
                    .is_some_and(|b| b.starts_with(&ENDBR64)),
            ),
            pad: padding_after(input, end, limit),
            targets,
            jumps: jumps_by_target(&insns),
            unsure,
            keep_flags,
            keep_r11,
        };
        let cands: Vec<Candidate> = reqs.iter().map(|r| cx.candidate(r)).collect();
        if run_cap < 2 || unsure.is_some() {
            return cx.plan(input, cands, part);
        }
        let mut batched = cands.clone();
        let stats = runs::batch(&cx, &mut batched, run_cap);
        let mut plan = cx.plan(input, batched, part);
        plan.runs = stats;
        // A run's window merged into one `finish` rejects takes every member with it:
        // then the plan without runs, if it has fewer uprobes.
        if plan.runs.runs() > 0 && !plan.uprobes.is_empty() {
            let plain = cx.plan(input, cands, part);
            if plain.uprobes.len() < plan.uprobes.len() {
                return plain;
            }
        }
        plan
    }

    fn emit_runtime(
        &self,
        layout: &Layout,
        at: u64,
        original_entry: u64,
    ) -> Result<(Vec<u8>, Runtime), String> {
        runtime::emit(layout, at, original_entry).map_err(|e| e.to_string())
    }

    fn emit_window(
        &self,
        input: &Input,
        layout: &Layout,
        rt: &Runtime,
        w: &Window,
        at: u64,
    ) -> Result<Trampoline, String> {
        let bytes = input
            .bytes_at(w.start)
            .ok_or("site not in a file-backed segment")?;
        let n = w.code_len.min(bytes.len());
        let mut dec = Decoder::with_ip(64, &bytes[..n], w.start, DecoderOptions::NONE);
        let insns: Vec<Instruction> = dec.iter().collect();
        if insns.iter().any(|i| i.is_invalid()) {
            return Err(format!(
                "undecodable instruction in the window at {:#x}",
                w.start
            ));
        }
        let mut rets = Vec::with_capacity(w.tails.len());
        for t in &w.tails {
            let b = input
                .bytes_at(t.at)
                .ok_or("return not in a file-backed segment")?;
            let ins =
                Decoder::with_ip(64, &b[..b.len().min(16)], t.at, DecoderOptions::NONE).decode();
            rets.push(ins);
        }
        let members = run_members(input, w, &insns)?;
        stub::emit_window(layout, rt, &insns, w, (&rets, &members), at)
            .map_err(|e| format!("window at {:#x}: {e}", w.start))
    }

    fn repoint(&self, e: &Entered, to: u64) -> Result<(u64, Vec<u8>), String> {
        let next = e.at + u64::from(e.len);
        let rel = i32::try_from(to.wrapping_sub(next) as i64)
            .map_err(|_| format!("trampoline at {to:#x} out of rel32 range from {:#x}", e.at))?;
        Ok((next - 4, rel.to_le_bytes().to_vec()))
    }

    fn patch_bytes(&self, w: &Window, to: u64, landed: &[u64]) -> Result<Vec<u8>, String> {
        // Nothing else can land in the displaced range (checked), so trap there.
        let mut out = vec![0xcc; w.len];
        let mut put = |at: u64, bytes: &[u8]| {
            let off = (at - w.start) as usize;
            out[off..off + bytes.len()].copy_from_slice(bytes);
        };
        put(w.start, &jmp_rel32(w.start, to)?);
        for (l, &to) in w.landings.iter().zip(landed) {
            match l.hop {
                None => put(l.target, &jmp_rel32(l.target, to)?),
                Some(hop) => {
                    let rel8 = i8::try_from(hop as i64 - (l.target as i64 + 2))
                        .map_err(|_| format!("landing hop at {hop:#x} out of reach"))?;
                    put(l.target, &[0xeb, rel8 as u8]);
                    put(hop, &jmp_rel32(hop, to)?);
                }
            }
        }
        Ok(out)
    }

    fn code_fill(&self) -> u8 {
        0xcc // int3
    }

    fn anchor(&self) -> &'static [u8] {
        &[0x90] // nop
    }

    fn segment_align(&self) -> u64 {
        0x1000
    }

    fn thread_word_offset(&self) -> i32 {
        // TLS variant II: the executable's block ends at the thread pointer.
        -8
    }

    fn uprobe_operands(
        &self,
        input: &Input,
        kind: SiteKind,
        addr: u64,
        args: &[Arg],
    ) -> Option<OperandSet> {
        // Descriptor numbering: the encoding's (rax = 0 .. r15 = 15), then rip.
        let num = |r: Register| match r {
            Register::RIP => Some(X86_REG_PC),
            r if r.is_gpr64() => Some(r.number() as u8),
            _ => None,
        };
        match kind {
            SiteKind::Memory => {
                let bytes = input.bytes_at(addr)?;
                let n = bytes.len().min(15);
                let ins = Decoder::with_ip(64, &bytes[..n], addr, DecoderOptions::NONE).decode();
                if ins.is_invalid() {
                    return None;
                }
                // The same operands the inline stub takes (mem_flags refuses the rest).
                let flags = mem_flags(&ins)?;
                let tp = if ins.memory_segment() == Register::FS {
                    OPF_TP
                } else {
                    0
                };
                let index = match ins.memory_index() {
                    Register::None => REG_NONE,
                    r => num(r).filter(|&n| n != X86_REG_PC)?,
                };
                let shift = ins.memory_index_scale().trailing_zeros() as u8;
                let ea = match ins.memory_base() {
                    // iced gives the absolute target as the displacement.
                    Register::RIP => Operand {
                        flags: tp,
                        ..super::operands::pc_relative(
                            OP_ADDR,
                            ins.memory_displacement64(),
                            addr,
                            X86_REG_PC,
                        )
                    },
                    base => Operand {
                        kind: OP_ADDR,
                        base: match base {
                            Register::None => REG_NONE,
                            r => num(r)?,
                        },
                        index,
                        shift,
                        flags: tp,
                        disp: ins.memory_displacement64() as i64,
                        ..Default::default()
                    },
                };
                Some(super::operands::memory_set(ea, flags))
            }
            SiteKind::Usdt => super::operands::usdt_set(args, addr, X86_REG_PC, |r| match *r {
                UsdtReg::X86 { reg, high8 } => Some((num(reg)?, high8)),
                UsdtReg::A64(_) => None,
            }),
            _ => None,
        }
    }
}
