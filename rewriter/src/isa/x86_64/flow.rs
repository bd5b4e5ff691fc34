//! x86-64 jump-table dispatch recognition and tail-call classification (iced-x86).
//!
//! The patterns gcc and clang emit, in any order and with unrelated instructions in
//! between:
//! - PIC: `lea T(%rip),%rB; movslq (%rB,%rI,4),%rE; add %rB,%rE; (notrack) jmp *%rE`
//!   (`-O0`: `lea 0(,%rI,4)`, `mov (%rX,%rY),%eE`, `cdqe`);
//! - non-PIC: `jmp *T(,%rI,8)` or `mov T(,%rI,8),%rE; jmp *%rE`;
//! - the bound: `cmp $N,%rI` (or `cmpl $N,-d(%rbp)` at `-O0`) + `ja`/`jbe`/`jae`/`jb`,
//!   or a zero-extended byte index (`movzbl`: 256 entries, computed gotos), or the size
//!   another dispatch of the same table proved (`flow::resolve`).
//!
//! Each sweep piece (code between two function starts) is decoded once, marking
//! instruction starts; a piece with an indirect jump is split into basic blocks and
//! the abstract register state of [`Val`] is propagated over its control-flow graph
//! to a fixpoint (a worklist; at a join a register keeps its value only if every way
//! in agrees). A compare bound holds only on the edge of the conditional branch where
//! it is true. Edges from outside the piece (jump-table targets, landing pads, other
//! functions) are not seen, so a recovered table is only a candidate: `resolve` checks
//! every entry.
//!
//! The same data flow tracks the stack pointer (`Val::Stack`) and where a value came
//! from, to classify an indirect jump that is not a table as a tail call (see
//! [`crate::flow::Flow::tail_calls`]).
//!
//! An indirect jump to a function pointer in a split-off part (a `.cold` symbol or an FDE
//! that starts mid-frame) is a tail call when the CFI says the stack is back at entry
//! height. An unbounded table is read while its entries are instruction starts, anywhere
//! (BOLT puts the first in `.warm`/`.cold`), and believed if one is a label rather than a
//! function start.

use std::collections::BTreeSet;

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};

use super::spill::{self, Spills};
use crate::flow::{Code, CodeSec, Dispatch, FlowArch, Functions, Scan, Slots, Val};

impl FlowArch for super::X86_64 {
    fn fixed_width(&self) -> bool {
        false
    }

    fn relative_reloc(&self) -> u32 {
        object::elf::R_X86_64_RELATIVE
    }

    fn entry_cfa(&self) -> (gimli::Register, i64, Option<gimli::Register>) {
        (gimli::X86_64::RSP, 8, None)
    }

    fn frame_pointer(&self) -> gimli::Register {
        gimli::X86_64::RBP
    }

    fn scan(&self, code: &mut Code, funcs: &Functions, slots: &Slots, out: &mut Scan) {
        scan(code, funcs, slots, out)
    }
}

fn scan(code: &mut Code, funcs: &Functions, slots: &Slots, out: &mut Scan) {
    let mut cx = Cx {
        factory: InstructionInfoFactory::new(),
        insns: Vec::new(),
        slots,
    };
    for sec in &mut code.secs {
        let end = sec.addr + sec.bytes.len() as u64;
        let lo = funcs.starts.partition_point(|&s| s <= sec.addr);
        // An empty section starting at a function: no piece (lo would pass hi).
        let hi = funcs.starts.partition_point(|&s| s < end).max(lo);
        let mut from = sec.addr;
        for &to in funcs.starts[lo..hi].iter().chain(std::iter::once(&end)) {
            if from < to {
                piece(sec, from, to, funcs.is_entry(from), &mut cx, out);
            }
            from = to;
        }
    }
}

/// Scratch reused across pieces.
struct Cx<'s, 'a> {
    factory: InstructionInfoFactory,
    insns: Vec<Instruction>,
    slots: &'s Slots<'a>,
}

/// Decode `[from, to)` of `sec`: mark instruction starts, then analyse if it holds an
/// indirect jump. `entry`: `from` is a function entry (the stack holds only the
/// return address).
fn piece(sec: &mut CodeSec, from: u64, to: u64, entry: bool, cx: &mut Cx, out: &mut Scan) {
    let (a, b) = ((from - sec.addr) as usize, (to - sec.addr) as usize);
    let bytes = &sec.bytes[a..b];
    let mut dec = Decoder::with_ip(64, bytes, from, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    let mut indirect = false;
    while dec.can_decode() {
        dec.decode_out(&mut ins);
        if !ins.is_invalid() {
            sec.mark_insn_start(a + (ins.ip() - from) as usize);
            indirect |= is_indirect_jmp(&ins);
        }
    }
    if indirect && !sec.plt {
        let mut insns = std::mem::take(&mut cx.insns);
        insns.clear();
        insns.extend(Decoder::with_ip(64, bytes, from, DecoderOptions::NONE));
        analyse(&insns, from, to, entry, cx, out);
        cx.insns = insns;
    }
}

fn is_indirect_jmp(ins: &Instruction) -> bool {
    ins.mnemonic() == Mnemonic::Jmp && matches!(ins.op0_kind(), OpKind::Register | OpKind::Memory)
}

/// Index of a general-purpose register (0..16) and its size in bytes.
fn gpr(r: Register) -> Option<(usize, u32)> {
    let full = r.full_register();
    if !full.is_gpr64() {
        return None;
    }
    Some((full.number(), r.size() as u32))
}

const RSP: usize = 4;
const RBP: usize = 5;

/// A memory operand `disp(%base[,%index,scale])` by register numbers: the same
/// operand while neither register gets a new origin.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Slot {
    base: usize,
    index: Option<(usize, u8)>,
    disp: u64,
    /// Bytes accessed: a bound learnt by a compare holds for loads no wider.
    width: u8,
}

impl Slot {
    fn uses(&self, i: usize) -> bool {
        self.base == i || self.index.is_some_and(|(x, _)| x == i)
    }

    fn same_place(&self, o: &Slot) -> bool {
        (self.base, self.index, self.disp) == (o.base, o.index, o.disp)
    }
}

/// What the last flag-setting instruction compared against an immediate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Reg(usize, u64),
    /// The switch value is in memory (`-O0` frame slots, `cmpb $7,(%rbx)`).
    Mem(Slot, u64),
}

/// A spilled value as a reload brings it back: what the function received stays a
/// clean pointer (a result written to a register would otherwise read as tainted).
fn unspilled(v: Val) -> Val {
    match v {
        Val::Unknown => Val::Loaded,
        v => v,
    }
}

/// What the analysis of a piece learns besides the states.
struct Piece<'s, 'a> {
    from: u64,
    to: u64,
    slots: &'s Slots<'a>,
    /// A table entry or target was stored to memory: a later load of it would look
    /// like a function pointer.
    escaped: bool,
    /// The stack's address stays in the stack pointers: spill slots are tracked
    /// ([`spill`]).
    private: bool,
}

#[derive(Clone, PartialEq)]
struct State {
    regs: [Val; 16],
    /// Registers with the same origin hold the same value (copies): a bound learnt
    /// on one holds for all. Deterministic: `ip << 4 | reg` of the defining
    /// instruction, or a join's (bit 63).
    origin: [u64; 16],
    flags: Option<Cmp>,
    /// Memory operands `(slot, bound)` known to hold a bounded value, sorted.
    slots: Vec<(Slot, u64)>,
    /// What the function's own frame holds (only where it is private).
    spills: Spills,
}

impl State {
    /// At a function entry (`entry`) or a block reached only from outside the piece.
    fn new(entry: bool) -> Self {
        let mut st = State {
            regs: [if entry { Val::Unknown } else { Val::Tainted }; 16],
            origin: std::array::from_fn(|i| i as u64),
            flags: None,
            slots: Vec::new(),
            spills: Spills::default(),
        };
        if entry {
            st.regs[RSP] = Val::Stack(0);
        }
        st
    }

    /// Write `v` computed by the instruction at `ip` (an unknown result is tainted).
    fn set(&mut self, ip: u64, r: Register, v: Val) {
        let Some((i, _)) = gpr(r) else { return };
        let v = if v == Val::Unknown { Val::Tainted } else { v };
        self.set_with_origin(r, v, ip << 4 | i as u64);
    }

    /// A call clobbered register `i`: it holds something the function received.
    fn clobber(&mut self, ip: u64, i: usize) {
        self.set_origin(i, ip << 4 | i as u64);
        self.regs[i] = Val::Unknown;
    }

    fn set_origin(&mut self, i: usize, origin: u64) {
        if self.origin[i] != origin && matches!(self.flags, Some(Cmp::Reg(j, _)) if j == i) {
            self.flags = None;
        }
        self.origin[i] = origin;
        // A new base or index register: what its memory operands held is unknown now.
        self.slots.retain(|s| !s.0.uses(i));
    }

    fn copy(&mut self, ip: u64, dst: Register, src: Register) {
        match gpr(src) {
            Some((s, _)) => self.set_with_origin(dst, self.regs[s], self.origin[s]),
            None => self.set(ip, dst, Val::Tainted),
        }
    }

    fn set_with_origin(&mut self, r: Register, v: Val, origin: u64) {
        let Some((i, size)) = gpr(r) else { return };
        self.set_origin(i, origin);
        self.regs[i] = match (size, v) {
            (8, v) => v,
            // A 32-bit write zero-extends: constants are truncated; an index keeps its
            // bound; 32-bit entries stay what they are; nothing else is a pointer.
            (4, Val::Const(c)) => Val::Const(c & 0xffff_ffff),
            (4, v @ Val::Index { .. }) => v,
            (4, Val::Entry(e)) if e.size <= 4 => v,
            _ => Val::Tainted,
        };
    }

    fn get(&self, r: Register) -> Val {
        gpr(r).map_or(Val::Tainted, |(i, _)| self.regs[i])
    }

    /// The value loaded by the memory operand of `ins` (`size` bytes).
    fn load(&self, ins: &Instruction, size: u8, signed: bool, p: &Piece) -> Val {
        if let Some(b) = self.slot_bound(ins) {
            return Val::Index {
                bound: Some(b),
                scale: 1,
            };
        }
        if !matches!(ins.memory_segment(), Register::DS | Register::SS) {
            // %fs/%gs: thread-local data.
            return Val::Tainted;
        }
        if let Some(v) = self.reload(ins, size) {
            return v;
        }
        if ins.memory_index() == Register::None {
            // One slot: a function pointer if it comes from a clean pointer or from a
            // global slot that does not hold a label of this piece.
            let clean = match ins.memory_base() {
                Register::RIP | Register::None => {
                    let addr = if ins.memory_base() == Register::RIP {
                        ins.ip_rel_memory_address()
                    } else {
                        ins.memory_displacement64()
                    };
                    !p.slots.may_hold_label(addr, p.from, p.to)
                }
                r => matches!(self.get(r), Val::Unknown | Val::Loaded),
            };
            return if clean && size == 8 {
                Val::Loaded
            } else {
                Val::Tainted
            };
        }
        let base = match ins.memory_base() {
            Register::None => None,
            Register::RIP => return Val::Tainted,
            r => Some(self.get(r)),
        };
        match Val::load(
            base,
            self.get(ins.memory_index()),
            u64::from(ins.memory_index_scale()),
            ins.memory_displacement64(),
            size,
            signed,
        ) {
            Val::Unknown => Val::Tainted,
            v => v,
        }
    }

    /// The offset from the stack pointer at entry of the memory operand of `ins`:
    /// `Some(None)` when it is relative to a stack pointer whose height is unknown or
    /// indexed, None when it is not relative to one.
    fn frame_offset(&self, ins: &Instruction) -> Option<Option<i64>> {
        let base = ins.memory_base();
        let v = gpr(base).map(|(i, _)| self.regs[i]);
        let disp = ins.memory_displacement64() as i64;
        match v {
            Some(Val::Stack(h)) if ins.memory_index() == Register::None => {
                Some(Some(h.wrapping_add(disp)))
            }
            Some(Val::Stack(_)) => Some(None),
            _ if matches!(base, Register::RSP | Register::RBP) => Some(None),
            _ => None,
        }
    }

    /// An 8-byte reload of a spill slot: the value stored there.
    fn reload(&self, ins: &Instruction, size: u8) -> Option<Val> {
        match self.frame_offset(ins) {
            Some(Some(off)) if size == 8 => self.spills.load(off).map(unspilled),
            _ => None,
        }
    }

    /// `ins` wrote memory through its memory operand (`value`: the 64-bit register an
    /// 8-byte `mov` stored), or somewhere else (`ins` None).
    fn frame_written(&mut self, ins: Option<&Instruction>, value: Option<Val>, private: bool) {
        if !private {
            self.spills.clear();
            return;
        }
        match ins.map(|i| (i, self.frame_offset(i))) {
            Some((i, Some(Some(off)))) => {
                let width = i.memory_size().size() as i64;
                // An unknown width (a string or vector form) may cover anything.
                if width == 0 {
                    self.spills.clear();
                } else {
                    self.spills.store(off, width, value);
                }
            }
            // Not the frame: a private frame is out of reach of other pointers.
            Some((_, None)) => {}
            _ => self.spills.clear(),
        }
    }

    fn slot(ins: &Instruction) -> Option<Slot> {
        let (base, _) = gpr(ins.memory_base())?;
        let index = match ins.memory_index() {
            Register::None => None,
            // `cmpb $30,(%rcx,%rax)` then `movzbl (%rcx,%rax),%eax`: a bounded byte
            // of a table reloaded as the switch index (sqlite's tokenizer).
            r => Some((gpr(r)?.0, ins.memory_index_scale() as u8)),
        };
        Some(Slot {
            base,
            index,
            disp: ins.memory_displacement64(),
            width: ins.memory_size().size() as u8,
        })
    }

    fn slot_bound(&self, ins: &Instruction) -> Option<u64> {
        let d = Self::slot(ins)?;
        let s = self.slots.iter().find(|s| s.0.same_place(&d))?;
        (d.width <= s.0.width).then_some(s.1)
    }

    /// Memory was written: only frame slots not written survive (they do not alias
    /// other memory in the code that spills switch values).
    fn memory_written(&mut self, ins: Option<&Instruction>) {
        let hit = ins.and_then(Self::slot);
        self.slots.retain(|s| {
            s.0.base == RBP && s.0.index.is_none() && !hit.is_some_and(|h| h.same_place(&s.0))
        });
    }

    /// Value `< bound` learnt for register `i` and every copy of it.
    fn bound_reg(&mut self, i: usize, bound: u64) {
        let o = self.origin[i];
        for j in 0..16 {
            if self.origin[j] == o
                && matches!(
                    self.regs[j],
                    Val::Unknown | Val::Tainted | Val::Loaded | Val::Index { scale: 1, .. }
                )
            {
                // Both bounds hold on this way.
                let bound = match self.regs[j] {
                    Val::Index { bound: Some(b), .. } => b.min(bound),
                    _ => bound,
                };
                self.regs[j] = Val::Index {
                    bound: Some(bound),
                    scale: 1,
                };
            }
        }
    }

    fn bound_slot(&mut self, d: Slot, bound: u64) {
        self.slots.retain(|s| !s.0.same_place(&d));
        let i = self.slots.partition_point(|s| s.0 < d);
        self.slots.insert(i, (d, bound));
    }

    /// Keep what `self` and `o` agree on (the join at the block starting at `ip`);
    /// returns whether `self` changed.
    fn meet(&mut self, o: &State, ip: u64) -> bool {
        if self == o {
            return false;
        }
        let mut changed = false;
        let pairs: [(u64, u64); 16] = std::array::from_fn(|j| (self.origin[j], o.origin[j]));
        for j in 0..16 {
            let (a, b) = (self.regs[j], o.regs[j]);
            if a != b {
                let v = match (a, b) {
                    (Val::Unknown | Val::Loaded, Val::Unknown | Val::Loaded) => Val::Unknown,
                    _ => Val::Tainted,
                };
                changed |= v != a;
                self.regs[j] = v;
            }
            if pairs[j].0 != pairs[j].1 {
                // Registers that are copies of each other on both ways stay copies.
                let k = (0..j).find(|&k| pairs[k] == pairs[j]).unwrap_or(j);
                let origin = 1 << 63 | ip << 4 | k as u64;
                changed |= origin != self.origin[j];
                self.origin[j] = origin;
            }
        }
        if self.flags != o.flags && self.flags.is_some() {
            self.flags = None;
            changed = true;
        }
        let n = self.slots.len();
        self.slots.retain(|s| o.slots.contains(s));
        changed |= self.spills.meet(&o.spills);
        changed || n != self.slots.len()
    }
}

impl Cmp {
    fn imm(self) -> u64 {
        match self {
            Cmp::Reg(_, i) | Cmp::Mem(_, i) => i,
        }
    }
}

/// Basic blocks of a piece: `[start, end)` instruction indices.
struct Cfg {
    blocks: Vec<(usize, usize)>,
    /// Successors of each block: fall-through and taken (block indices).
    succ: Vec<[Option<usize>; 2]>,
    has_pred: Vec<bool>,
    /// A direct branch into the piece lands inside an instruction, or code is
    /// undecodable: some edge is missing.
    incomplete: bool,
    /// The piece materialises an address inside itself (`lea L(%rip)`, an immediate):
    /// labels as values, a computed goto may jump anywhere.
    own_address: bool,
}

fn cfg(insns: &[Instruction], from: u64, to: u64) -> Cfg {
    let n = insns.len();
    let l = leaders(insns, from, to);
    let mut block_of = vec![usize::MAX; n];
    let mut blocks = Vec::new();
    for (k, b) in block_of.iter_mut().enumerate() {
        if l.leader[k] {
            blocks.push((k, k));
        }
        *b = blocks.len() - 1;
        blocks.last_mut().unwrap().1 = k + 1;
    }
    let mut succ = vec![[None, None]; blocks.len()];
    let mut has_pred = vec![false; blocks.len()];
    for (b, &(_, end)) in blocks.iter().enumerate() {
        let last = &insns[end - 1];
        let falls = !last.is_invalid()
            && !matches!(
                last.flow_control(),
                FlowControl::UnconditionalBranch
                    | FlowControl::IndirectBranch
                    | FlowControl::Return
                    | FlowControl::Exception
            );
        if falls && end < n {
            succ[b][0] = Some(block_of[end]);
        }
        succ[b][1] = l.target[end - 1].map(|j| block_of[j]);
        for s in succ[b].into_iter().flatten() {
            has_pred[s] = true;
        }
    }
    Cfg {
        blocks,
        succ,
        has_pred,
        incomplete: l.incomplete,
        own_address: l.own_address,
    }
}

/// Where a piece's blocks start and where its direct branches go.
struct Leaders {
    /// Instruction k starts a block (one more entry than instructions).
    leader: Vec<bool>,
    /// The instruction index a direct branch at k goes to, inside the piece.
    target: Vec<Option<usize>>,
    incomplete: bool,
    own_address: bool,
}

fn leaders(insns: &[Instruction], from: u64, to: u64) -> Leaders {
    let n = insns.len();
    let index_of = |ip: u64| insns.binary_search_by_key(&ip, |i| i.ip()).ok();
    let mut l = Leaders {
        leader: vec![false; n + 1],
        target: vec![None; n],
        incomplete: false,
        own_address: false,
    };
    l.leader[0] = true;
    for (k, ins) in insns.iter().enumerate() {
        if ins.is_invalid() {
            l.incomplete = true;
            l.leader[k] = true;
            l.leader[k + 1] = true;
            continue;
        }
        match ins.flow_control() {
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch => {
                if ins.op0_kind() == OpKind::NearBranch64 {
                    let t = ins.near_branch_target();
                    if from <= t && t < to {
                        match index_of(t) {
                            Some(j) => {
                                l.leader[j] = true;
                                l.target[k] = Some(j);
                            }
                            None => l.incomplete = true,
                        }
                    }
                }
                l.leader[k + 1] = true;
            }
            FlowControl::IndirectBranch | FlowControl::Return | FlowControl::Exception => {
                l.leader[k + 1] = true;
            }
            _ => {}
        }
        if names_address_inside(ins, from, to) {
            l.own_address = true;
        }
    }
    l
}

/// `ins` materialises an address strictly inside `(from, to)` (RIP-relative or an
/// immediate).
fn names_address_inside(ins: &Instruction, from: u64, to: u64) -> bool {
    let inside = |a: u64| from < a && a < to;
    (ins.is_ip_rel_memory_operand() && inside(ins.ip_rel_memory_address()))
        || (0..ins.op_count()).any(|o| {
            matches!(
                ins.op_kind(o),
                OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
            ) && inside(ins.immediate(o))
        })
}

/// The state on the way out of a block that ends in `last`, on its fall-through
/// (`taken` false) or taken edge, if it differs from `st`: a compare bound holds on
/// the edge where the branch says so (unsigned compares only: `ja`/`jbe`: value
/// `<= N`, `jae`/`jb`: `< N`).
fn edge(st: &State, last: &Instruction, taken: bool) -> Option<State> {
    let m = last.mnemonic();
    if !matches!(
        m,
        Mnemonic::Ja | Mnemonic::Jbe | Mnemonic::Jae | Mnemonic::Jb
    ) {
        return None;
    }
    let cmp = st.flags?;
    // ja/jae: the bound holds when the branch is not taken; jbe/jb: when it is.
    if matches!(m, Mnemonic::Ja | Mnemonic::Jae) == taken {
        return None;
    }
    let bound = if matches!(m, Mnemonic::Ja | Mnemonic::Jbe) {
        cmp.imm().checked_add(1)?
    } else {
        cmp.imm()
    };
    let mut on = st.clone();
    match cmp {
        Cmp::Reg(i, _) => on.bound_reg(i, bound),
        Cmp::Mem(d, _) => on.bound_slot(d, bound),
    }
    Some(on)
}

/// Merge `e` into the state at the start of block `s`; queue `s` if that changed.
fn flow_into(
    ins_of: &mut [Option<State>],
    queue: &mut BTreeSet<usize>,
    s: usize,
    ip: u64,
    e: &State,
) {
    let changed = match &mut ins_of[s] {
        Some(cur) => cur.meet(e, ip),
        slot @ None => {
            *slot = Some(e.clone());
            true
        }
    };
    if changed {
        queue.insert(s);
    }
}

/// Data flow over one piece to a fixpoint, then a dispatch, a tail call or an
/// unresolved jump for each indirect `jmp`.
///
/// Blocks no direct branch or fall-through reaches (jump-table targets, landing pads)
/// start from the join of the states at the piece's indirect jumps: a table base
/// hoisted out of a loop whose body is the switch's cases stays known.
fn analyse(insns: &[Instruction], from: u64, to: u64, entry: bool, cx: &mut Cx, out: &mut Scan) {
    let mut p = Piece {
        from,
        to,
        slots: cx.slots,
        escaped: false,
        // Not in the pass in address order: a slot stored on one way would be read
        // back on another.
        private: false,
    };
    // Cheap first: most pieces are explained by one pass in address order.
    let linear = linear(insns, entry, cx, &mut p);
    if linear.iter().all(Option::is_some) {
        out.dispatches.extend(linear.into_iter().flatten());
        return;
    }
    let mut linear = linear.into_iter();
    p.escaped = false;
    p.private = spill::private_frame(insns);
    let g = cfg(insns, from, to);
    let (ins_of, converged) = fixpoint(insns, &g, entry, from, cx, &mut p);
    let tail_ok = entry && converged && !g.incomplete && !g.own_address;
    // A part's stack height is the CFI's to say (`recover`).
    let part_ok = !entry && converged && !g.incomplete && !g.own_address;
    for (b, &(start, end)) in g.blocks.iter().enumerate() {
        let last = &insns[end - 1];
        if !is_indirect_jmp(last) {
            continue;
        }
        let mut st = ins_of[b].clone().unwrap_or_else(|| State::new(false));
        for ins in &insns[start..end - 1] {
            step(&mut st, ins, &mut cx.factory, &mut p);
        }
        let v = jump_value(&st, last, &p);
        let tail = is_pointer(v, last);
        // A dispatch by either pass is a candidate (`resolve` checks it): the data
        // flow is more precise, address order sometimes luckier.
        let early = linear.next().flatten();
        if let Some(d) = Dispatch::from_val(last.ip(), v).or(early) {
            out.dispatches.push(d);
        } else if tail && tail_ok && !p.escaped && st.regs[RSP] == Val::Stack(0) {
            out.tail_calls.push(last.ip());
        } else if tail && part_ok && !p.escaped {
            out.part_tail_calls.push(last.ip());
        } else {
            out.unresolved.push(last.ip());
        }
    }
}

/// The state at the start of each block, to a fixpoint (or the visit budget: then
/// `false`).
fn fixpoint(
    insns: &[Instruction],
    g: &Cfg,
    entry: bool,
    from: u64,
    cx: &mut Cx,
    p: &mut Piece,
) -> (Vec<Option<State>>, bool) {
    let nb = g.blocks.len();
    // Alignment padding after a `ret` or `jmp` is never entered.
    let padding = |b: usize| {
        let (start, end) = g.blocks[b];
        insns[start..end]
            .iter()
            .all(|i| matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3))
    };
    let orphans: Vec<usize> = (1..nb).filter(|&b| !g.has_pred[b] && !padding(b)).collect();
    let mut ins_of: Vec<Option<State>> = vec![None; nb];
    let mut queue = BTreeSet::new();
    ins_of[0] = Some(State::new(entry));
    queue.insert(0);
    let mut hub: Option<State> = None;
    // Values only ever get less precise at joins: a few passes reach the fixpoint.
    let budget = 8 * nb + 64;
    let mut visits = 0;
    let mut converged = true;
    while let Some(b) = queue.pop_first() {
        visits += 1;
        if visits > budget {
            converged = false;
            break;
        }
        let mut st = ins_of[b].clone().unwrap();
        let (start, end) = g.blocks[b];
        for ins in &insns[start..end] {
            step(&mut st, ins, &mut cx.factory, p);
        }
        let last = &insns[end - 1];
        for (k, s) in g.succ[b].iter().enumerate() {
            let Some(s) = *s else { continue };
            let ip = insns[g.blocks[s].0].ip();
            match edge(&st, last, k == 1) {
                Some(e) => flow_into(&mut ins_of, &mut queue, s, ip, &e),
                None => flow_into(&mut ins_of, &mut queue, s, ip, &st),
            }
        }
        // A tail call's state does not reach the table's targets: it would make the
        // stack height unknown there (and so at every tail call after them).
        if is_indirect_jmp(last) && !leaves(&st, last, p) {
            let changed = match &mut hub {
                Some(h) => h.meet(&st, from),
                h @ None => {
                    *h = Some(st);
                    true
                }
            };
            if changed {
                let h = hub.as_ref().unwrap();
                for &o in &orphans {
                    ins_of[o] = Some(h.clone());
                    queue.insert(o);
                }
            }
        }
    }
    (ins_of, converged)
}

/// Whether an indirect jump to `v` goes through a pointer the function received or
/// loaded (a tail call's target), not a table entry.
fn is_pointer(v: Val, ins: &Instruction) -> bool {
    match ins.op0_kind() {
        OpKind::Register => matches!(v, Val::Unknown | Val::Loaded),
        _ => v == Val::Loaded,
    }
}

/// Whether the indirect jump `ins` in state `st` looks like a tail call: a pointer
/// target, the stack at its height at entry.
fn leaves(st: &State, ins: &Instruction, p: &Piece) -> bool {
    st.regs[RSP] == Val::Stack(0) && is_pointer(jump_value(st, ins, p), ins)
}

/// The value an indirect jump goes to.
fn jump_value(st: &State, ins: &Instruction, p: &Piece) -> Val {
    match ins.op0_kind() {
        OpKind::Register => st.get(ins.op0_register()),
        _ => st.load(ins, 8, false, p),
    }
}

/// One pass in address order with one state, a compare bound assumed on both ways
/// of its branch: the dispatch each indirect jump stands for, if any, in order.
fn linear(insns: &[Instruction], entry: bool, cx: &mut Cx, p: &mut Piece) -> Vec<Option<Dispatch>> {
    let mut st = State::new(entry);
    let mut found = Vec::new();
    for ins in insns {
        if ins.is_invalid() {
            st = State::new(false);
            continue;
        }
        if is_indirect_jmp(ins) {
            found.push(Dispatch::from_val(ins.ip(), jump_value(&st, ins, p)));
        }
        step(&mut st, ins, &mut cx.factory, p);
        if let Some(e) = edge(&st, ins, false).or_else(|| edge(&st, ins, true)) {
            st = e;
        }
    }
    found
}

/// The facts of one instruction the transfer functions share.
#[derive(Clone, Copy)]
struct Op {
    ip: u64,
    m: Mnemonic,
    /// The first operand when it is a register (else `Register::None`).
    op0: Register,
    /// `op0` is a general register.
    dst_gpr: bool,
    /// The second operand is an immediate.
    imm1: bool,
}

impl Op {
    fn of(ins: &Instruction) -> Op {
        let op0 = if ins.op0_kind() == OpKind::Register {
            ins.op0_register()
        } else {
            Register::None
        };
        Op {
            ip: ins.ip(),
            m: ins.mnemonic(),
            op0,
            dst_gpr: gpr(op0).is_some(),
            imm1: matches!(
                ins.op1_kind(),
                OpKind::Immediate8
                    | OpKind::Immediate8to32
                    | OpKind::Immediate8to64
                    | OpKind::Immediate16
                    | OpKind::Immediate32
                    | OpKind::Immediate32to64
                    | OpKind::Immediate64
            ),
        }
    }
}

/// The abstract effect of one instruction on `st` (the transfer function of the scan).
fn step(st: &mut State, ins: &Instruction, factory: &mut InstructionInfoFactory, p: &mut Piece) {
    let o = Op::of(ins);
    let m = o.m;
    if ins.op0_kind() == OpKind::Memory
        && ins.op1_kind() == OpKind::Register
        && matches!(
            st.get(ins.op1_register()),
            Val::Entry(_) | Val::Target { .. }
        )
    {
        p.escaped = true;
    }
    let handled = match m {
        Mnemonic::Lea if o.dst_gpr => {
            lea(st, ins, o);
            true
        }
        Mnemonic::Mov if o.dst_gpr => {
            mov(st, ins, o, p);
            true
        }
        Mnemonic::Movsxd if o.dst_gpr => {
            movsxd(st, ins, o, p);
            true
        }
        Mnemonic::Movzx | Mnemonic::Movsx if o.dst_gpr => {
            movx(st, ins, o, p);
            true
        }
        Mnemonic::Cdqe => {
            let v = st.get(Register::RAX).extend(32, true);
            st.set(o.ip, Register::RAX, v);
            true
        }
        Mnemonic::Add | Mnemonic::Sub if o.dst_gpr && o.op0.size() == 8 => {
            add_sub(st, ins, o);
            true
        }
        Mnemonic::Push | Mnemonic::Pop => {
            push_pop(st, ins, o, p.private);
            true
        }
        Mnemonic::Leave => {
            leave(st, o);
            true
        }
        Mnemonic::Cmp if o.imm1 => {
            cmp(st, ins, o);
            true
        }
        // Bounds are learnt on the edges (`edges`); an indirect jump ends its block.
        Mnemonic::Ja | Mnemonic::Jbe | Mnemonic::Jae | Mnemonic::Jb => true,
        Mnemonic::Jmp if is_indirect_jmp(ins) => true,
        Mnemonic::Call => {
            call(st, o);
            true
        }
        _ => false,
    };
    if !handled {
        other(st, ins, factory, p.private);
    }
    if !matches!(m, Mnemonic::Cmp) && ins.rflags_modified() != 0 {
        st.flags = None;
    }
}

/// `lea`: an address, a scaled index, or a stack address.
fn lea(st: &mut State, ins: &Instruction, o: Op) {
    let Op { ip, op0, .. } = o;
    let v = if ins.is_ip_rel_memory_operand() {
        Val::Const(ins.ip_rel_memory_address())
    } else if ins.memory_base() == Register::None
        && ins.memory_displacement64() == 0
        && ins.memory_index() != Register::None
    {
        // `lea 0(,%rI,4),%rX`: the scaled index of `-O0` code.
        match st.get(ins.memory_index()).as_index() {
            Some((bound, s)) => Val::Index {
                bound,
                scale: s * u64::from(ins.memory_index_scale()),
            },
            None => Val::Tainted,
        }
    } else if ins.memory_index() == Register::None {
        match st.get(ins.memory_base()) {
            Val::Stack(h) => Val::Stack(h.wrapping_add(ins.memory_displacement64() as i64)),
            _ => Val::Tainted,
        }
    } else {
        Val::Tainted
    };
    st.set(ip, op0, v);
}

/// `mov` into a register: a copy, a load or a constant.
fn mov(st: &mut State, ins: &Instruction, o: Op, p: &mut Piece) {
    let Op { ip, op0, imm1, .. } = o;
    match ins.op1_kind() {
        OpKind::Register => st.copy(ip, op0, ins.op1_register()),
        OpKind::Memory => {
            let v = st.load(ins, op0.size() as u8, false, p);
            st.set(ip, op0, v);
        }
        _ if imm1 => st.set(ip, op0, Val::Const(ins.immediate(1))),
        _ => st.set(ip, op0, Val::Tainted),
    }
}

/// `movsxd`: a sign-extended 32-bit value.
fn movsxd(st: &mut State, ins: &Instruction, o: Op, p: &mut Piece) {
    let Op { ip, op0, .. } = o;
    let v = match ins.op1_kind() {
        OpKind::Register => st.get(ins.op1_register()).extend(32, true),
        OpKind::Memory => st.load(ins, 4, true, p),
        _ => Val::Tainted,
    };
    st.set(ip, op0, v);
}

/// How many values a byte holds.
const BYTE_VALUES: u64 = 256;

/// `movzx`/`movsx`: an extended register or load.
fn movx(st: &mut State, ins: &Instruction, o: Op, p: &mut Piece) {
    let Op { ip, m, op0, .. } = o;
    let signed = m == Mnemonic::Movsx;
    match ins.op1_kind() {
        OpKind::Register => {
            let src = ins.op1_register();
            let v = match st.get(src).extend(8 * src.size() as u8, signed) {
                Val::Unknown => Val::Tainted,
                v => v,
            };
            let v = if signed || src.size() != 1 {
                v
            } else {
                byte_index(v)
            };
            match (v, gpr(src)) {
                // `movzbl %dl,%ebx`: the same number as far as a compare of
                // either says (the compare decides the width that counts).
                (Val::Index { .. } | Val::Tainted, Some((s, _))) if !signed => {
                    st.set_with_origin(op0, v, st.origin[s])
                }
                _ => st.set(ip, op0, v),
            }
        }
        OpKind::Memory => {
            let size = ins.memory_size().size() as u8;
            let v = match st.load(ins, size, signed, p) {
                v if signed || size != 1 => v,
                v => byte_index(v),
            };
            st.set(ip, op0, v);
        }
        _ => st.set(ip, op0, Val::Tainted),
    }
}

/// A zero-extended byte is below 256 whatever it held: the bound of a table it
/// indexes (CPython's computed gotos: `movzbl %sil,%eax`, or a byte of the bytecode,
/// then `jmp *T(,%rax,8)` over its 256 opcode labels). A byte table's entry stays one.
fn byte_index(v: Val) -> Val {
    match v {
        Val::Tainted | Val::Unknown => Val::Index {
            bound: Some(BYTE_VALUES),
            scale: 1,
        },
        Val::Index { bound, scale: 1 } => Val::Index {
            bound: Some(bound.map_or(BYTE_VALUES, |b| b.min(BYTE_VALUES))),
            scale: 1,
        },
        v => v,
    }
}

/// 64-bit `add`/`sub`: relative-table targets, constants and stack heights.
fn add_sub(st: &mut State, ins: &Instruction, o: Op) {
    let Op {
        ip, m, op0, imm1, ..
    } = o;
    let a = st.get(op0);
    let sub = m == Mnemonic::Sub;
    let v = match ins.op1_kind() {
        OpKind::Register if !sub => match (a, st.get(ins.op1_register())) {
            (Val::Const(base), Val::Entry(elem)) | (Val::Entry(elem), Val::Const(base)) => {
                Val::Target {
                    base,
                    elem,
                    shift: 0,
                }
            }
            _ => Val::Tainted,
        },
        _ if imm1 => {
            let k = if sub {
                ins.immediate(1).wrapping_neg()
            } else {
                ins.immediate(1)
            };
            match a {
                Val::Const(c) => Val::Const(c.wrapping_add(k)),
                Val::Stack(h) => Val::Stack(h.wrapping_add(k as i64)),
                _ => Val::Tainted,
            }
        }
        _ => Val::Tainted,
    };
    st.set(ip, op0, v);
    st.flags = None;
}

/// `push`/`pop`: the stack height, and what a pop may have brought back.
fn push_pop(st: &mut State, ins: &Instruction, o: Op, private: bool) {
    let Op {
        ip,
        m,
        op0,
        dst_gpr,
        ..
    } = o;
    let delta = i64::from(ins.stack_pointer_increment());
    let sp = match st.regs[RSP] {
        Val::Stack(h) if delta.abs() == 8 => Val::Stack(h.wrapping_add(delta)),
        _ => Val::Tainted,
    };
    let top = match st.regs[RSP] {
        Val::Stack(h) => Some(h),
        _ => None,
    };
    if m == Mnemonic::Pop {
        // What was pushed may have been anything, a table address included, unless
        // the frame's slot says what.
        if dst_gpr {
            let v = top.and_then(|h| st.spills.load(h)).map(unspilled);
            st.set(ip, op0, v.unwrap_or(Val::Tainted));
        } else if ins.op0_kind() == OpKind::Memory {
            st.memory_written(Some(ins));
            st.frame_written(Some(ins), None, private);
        }
    } else {
        st.memory_written(None);
        let pushed = (dst_gpr && op0.size() == 8).then(|| st.get(op0));
        match sp {
            Val::Stack(h) if private => st.spills.store(h, 8, pushed),
            _ => st.spills.clear(),
        }
    }
    st.set(ip, Register::RSP, sp);
}

/// `leave`: the stack pointer from the frame pointer.
fn leave(st: &mut State, o: Op) {
    let Op { ip, .. } = o;
    let sp = match st.regs[RBP] {
        Val::Stack(h) => Val::Stack(h.wrapping_add(8)),
        _ => Val::Tainted,
    };
    st.set(ip, Register::RBP, Val::Tainted);
    st.set(ip, Register::RSP, sp);
}

/// `cmp` with an immediate: the bound a following conditional branch may assume.
fn cmp(st: &mut State, ins: &Instruction, o: Op) {
    let Op { op0, dst_gpr, .. } = o;
    let mask = match ins.op0_kind() {
        OpKind::Register => op0.size(),
        _ => ins.memory_size().size(),
    };
    let imm = match mask {
        8 => ins.immediate(1),
        n => ins.immediate(1) & ((1u64 << (8 * n)) - 1),
    };
    st.flags = if dst_gpr {
        gpr(op0).map(|(i, _)| Cmp::Reg(i, imm))
    } else if ins.op0_kind() == OpKind::Memory {
        State::slot(ins).map(|d| Cmp::Mem(d, imm))
    } else {
        None
    };
}

/// `call`: the results are unknown, memory may be written, the stack is back.
fn call(st: &mut State, o: Op) {
    let Op { ip, .. } = o;
    // The results. The other caller-saved registers keep what they held:
    // code that reads one after the call without writing it knows the callee
    // preserves it (gcc's IPA-RA keeps table bases in %r8 across calls of
    // functions of the same unit). The stack pointer is back.
    for r in [0, 2] {
        st.clobber(ip, r);
    }
    st.memory_written(None);
    // The callee's frame and the return address are below the stack pointer.
    let sp = match st.regs[RSP] {
        Val::Stack(h) => Some(h),
        _ => None,
    };
    st.spills.below(sp);
    st.flags = None;
}

/// Any other instruction: what it writes becomes unknown (tainted).
fn other(st: &mut State, ins: &Instruction, factory: &mut InstructionInfoFactory, private: bool) {
    let ip = ins.ip();
    // An 8-byte `mov` of a register to memory: the value a reload brings back. (Read
    // before the registers it writes change.)
    let stored = (ins.mnemonic() == Mnemonic::Mov
        && ins.op0_kind() == OpKind::Memory
        && ins.op1_kind() == OpKind::Register
        && ins.op1_register().size() == 8)
        .then(|| st.get(ins.op1_register()));
    let info = factory.info(ins);
    let writes = |a: OpAccess| {
        matches!(
            a,
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        )
    };
    for u in info.used_registers() {
        if writes(u.access()) && gpr(u.register()).is_some() {
            st.set(ip, u.register().full_register(), Val::Tainted);
        }
    }
    if info.used_memory().iter().any(|u| writes(u.access())) {
        let explicit = (ins.op0_kind() == OpKind::Memory).then_some(ins);
        st.memory_written(explicit);
        st.frame_written(explicit, stored, private);
    }
}
