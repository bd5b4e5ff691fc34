//! Control flow that a linear sweep for direct branches does not see: jump-table
//! targets, exception landing pads, and function ranges from `.eh_frame` FDEs.
//!
//! Patching overwrites an instruction range with a branch; that is only correct if no
//! branch lands inside the range. Jump tables are found by a per-function forward
//! scan (each ISA's `isa/*/flow.rs`, behind [`FlowArch`]) that tracks a few abstract register values (table
//! address, bounded index, loaded entry, entry added to a base) up to each indirect
//! jump. A table is only accepted when every entry read lands on an instruction
//! boundary (the first in its function); a table with no bound is read until an entry
//! does not, or the next table starts: reading too far only adds targets, stopping too
//! early would lose some. Every indirect jump not explained so is reported in
//! [`Flow::unresolved_indirect_jumps`], because a missed table makes patching unsafe.

mod eh;

use std::collections::HashMap;

use object::elf;

use crate::elf::read::Input;

/// One recovered jump table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JumpTable {
    /// Link-time address of entry 0.
    pub table: u64,
    /// Bytes per entry (1, 2, 4 or 8).
    pub entry_size: u8,
    /// The indirect jump that dispatches through it.
    pub dispatch: u64,
    /// Sorted, deduplicated targets.
    pub targets: Vec<u64>,
    /// The number of entries came from a dominating compare (else: read while valid).
    pub bounded: bool,
}

/// Everything recovered; all vectors sorted and deduplicated, link-time addresses.
#[derive(Clone, Debug, Default)]
pub struct Flow {
    pub jump_table_targets: Vec<u64>,
    pub landing_pads: Vec<u64>,
    /// `(start, size)` of each `.eh_frame` FDE (function starts of stripped binaries).
    pub fde_functions: Vec<(u64, u64)>,
    pub tables: Vec<JumpTable>,
    /// Indirect jumps (`jmp r/m`, `br`) explained neither as a jump-table dispatch nor
    /// as a tail call: unrecognised tables, tail calls not proven, hand-written code.
    /// PLT sections are not scanned.
    pub unresolved_indirect_jumps: Vec<u64>,
    /// Indirect jumps that leave the function (tail calls through a register or a
    /// memory slot): the stack is back at its height at function entry (data flow and,
    /// where an FDE covers the jump, its CFI), and the target is a pointer the function
    /// received or loaded without an index (an argument, a call result, a field, a GOT
    /// or data slot not holding an address inside the function), in a function that
    /// never materialises an address inside itself. Never a jump-table dispatch, never
    /// in `unresolved_indirect_jumps`; their targets are not recovered.
    pub tail_calls: Vec<u64>,
    /// FDE starts whose CFI does not have the stack at its height at function entry:
    /// code entered mid-frame, as a split-off part of a function is (sorted).
    pub mid_frame: Vec<u64>,
    /// Oddities that did not stop the recovery (rejected tables, missing `.eh_frame`).
    pub warnings: Vec<String>,
    /// `(start, end, offset in .eh_frame)` of every FDE, for [`Flow::frame_rules`].
    fde_offsets: Vec<(u64, u64, usize)>,
}

/// Where a stub finds the canonical frame address of the frame it runs in: DWARF
/// register `reg` (the stack or the frame pointer) plus `off`. A record flagged
/// `FLAG_FRAME` carries its low bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRule {
    pub reg: gimli::Register,
    pub off: i64,
}

impl Flow {
    /// The frame rule at each of `addrs`, by the CFI: `None` where no FDE covers it or
    /// the CFA is not the stack or frame pointer plus a small offset.
    pub fn frame_rules(
        &self,
        input: &Input,
        arch: &dyn FlowArch,
        addrs: &[u64],
    ) -> Vec<Option<FrameRule>> {
        let (sp, ..) = arch.entry_cfa();
        eh::cfa_rules(input, &self.fde_offsets, addrs)
            .into_iter()
            .map(|r| {
                let (reg, off) = r?;
                ((reg == sp || reg == arch.frame_pointer()) && (0..=2048).contains(&off))
                    .then_some(FrameRule { reg, off })
            })
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("{file}: .eh_frame: {what}")]
    EhFrame { file: String, what: String },
    #[error("{file}: LSDA at {lsda:#x} (FDE for {fde:#x}): {what}")]
    Lsda {
        file: String,
        lsda: u64,
        fde: u64,
        what: String,
    },
}

/// What flow recovery needs from an instruction set (implemented in `isa/*/flow.rs`).
pub trait FlowArch {
    /// Every instruction is 4 bytes (no instruction-start bitmap needed).
    fn fixed_width(&self) -> bool;
    /// The `R_*_RELATIVE` relocation type (data slots that may hold code addresses).
    fn relative_reloc(&self) -> u32;
    /// The CFI that means "the stack is at its height at function entry": CFA =
    /// `register + offset`, and (AArch64) the return-address register not saved.
    fn entry_cfa(&self) -> (gimli::Register, i64, Option<gimli::Register>);
    /// The frame pointer (`%rbp`, x29): with the stack pointer, the CFA registers a
    /// stub can compute a frame address from ([`FrameRule`]).
    fn frame_pointer(&self) -> gimli::Register;
    /// The per-function forward scan for jump-table dispatches and tail calls.
    fn scan(&self, code: &mut Code, funcs: &Functions, slots: &Slots, scan: &mut Scan);
}

/// Recover jump tables, landing pads and FDE function ranges of `input`, whose
/// instruction set is `arch`.
pub fn recover(input: &Input, arch: &dyn FlowArch) -> Result<Flow, FlowError> {
    let eh = eh::read(input)?;
    // FDEs that start with a frame live: split-off parts, not entries.
    let starts: Vec<u64> = eh.fdes.iter().map(|&(start, _)| start).collect();
    let heights = eh::at_entry_height(input, &eh, &starts, arch.entry_cfa());
    let mut mid_frame: Vec<u64> = starts
        .iter()
        .zip(heights)
        .filter(|(_, h)| *h == Some(false))
        .map(|(&a, _)| a)
        .collect();
    mid_frame.sort_unstable();
    mid_frame.dedup();
    let funcs = Functions::new(input, &eh.fdes, &mid_frame);
    let mut code = Code::new(input, arch.fixed_width());
    let slots = Slots::new(input, arch.relative_reloc());
    let mut scan = Scan::default();
    arch.scan(&mut code, &funcs, &slots, &mut scan);
    let mut tail_calls = Vec::with_capacity(scan.tail_calls.len());
    // A tail call must also be one by the compiler's own account of the stack; in a
    // part, where the scan does not know the stack's height, by that account alone.
    for (calls, sure) in [
        (&mut scan.tail_calls, false),
        (&mut scan.part_tail_calls, true),
    ] {
        calls.sort_unstable();
        calls.dedup();
        let cfi = eh::at_entry_height(input, &eh, calls, arch.entry_cfa());
        for (&at, ok) in calls.iter().zip(cfi) {
            if ok == Some(false) || sure && ok != Some(true) {
                scan.unresolved.push(at);
            } else {
                tail_calls.push(at);
            }
        }
    }
    tail_calls.sort_unstable();
    let mut flow = Flow {
        mid_frame,
        landing_pads: eh.landing_pads,
        fde_functions: eh.fdes,
        fde_offsets: eh.fde_offsets,
        warnings: eh.warnings,
        unresolved_indirect_jumps: scan.unresolved,
        tail_calls,
        ..Flow::default()
    };
    resolve(input, &code, &funcs, scan.dispatches, &mut flow);
    flow.tables.sort_by_key(|t| (t.table, t.dispatch));
    flow.jump_table_targets = flow
        .tables
        .iter()
        .flat_map(|t| t.targets.iter().copied())
        .collect();
    flow.jump_table_targets.sort_unstable();
    flow.jump_table_targets.dedup();
    flow.unresolved_indirect_jumps.sort_unstable();
    flow.unresolved_indirect_jumps.dedup();
    Ok(flow)
}

/// An abstract register value, as far as jump-table dispatch cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Val {
    #[default]
    Unknown,
    /// Some unknown value times `scale`; `bound`: the unscaled value is known to be
    /// `< bound` (unsigned) from a compare and conditional branch seen before.
    Index { bound: Option<u64>, scale: u64 },
    /// A link-time address or constant.
    Const(u64),
    /// An entry loaded from a table.
    Entry(Elem),
    /// `base + (entry << shift)`: a relative-table target.
    Target { base: u64, elem: Elem, shift: u8 },
    /// x86-64: unknown, and possibly derived from an address (a constant, a table
    /// entry, the stack pointer) or a reload of a spill. [`Val::Unknown`] there is
    /// only what a function receives (arguments, results of calls): never a code
    /// address the function made itself.
    Tainted,
    /// x86-64: an 8-byte value loaded without an index from a clean pointer (an
    /// argument, a call result, another such load) or from a GOT/data slot that does
    /// not hold an address inside the function: a function pointer, not a table entry.
    Loaded,
    /// x86-64: the stack pointer at function entry plus this offset.
    Stack(i64),
}

/// `table[index]`, each entry `size` bytes, sign- or zero-extended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Elem {
    pub table: u64,
    pub size: u8,
    pub signed: bool,
    pub bound: Option<u64>,
}

impl Val {
    /// The index part of an address computation: any non-constant value, with its
    /// bound and scale.
    pub(crate) fn as_index(self) -> Option<(Option<u64>, u64)> {
        match self {
            Val::Unknown | Val::Tainted | Val::Loaded => Some((None, 1)),
            Val::Index { bound, scale } => Some((bound, scale)),
            _ => None,
        }
    }

    /// Loading `size` bytes from `base + index * scale + disp` (a missing base is 0).
    pub(crate) fn load(
        base: Option<Val>,
        index: Val,
        scale: u64,
        disp: u64,
        size: u8,
        signed: bool,
    ) -> Val {
        let (table, bound, stride) = match (base, index) {
            (None, idx) | (Some(Val::Const(0)), idx) => match idx.as_index() {
                Some((bound, s)) if disp != 0 => (disp, bound, s * scale),
                _ => return Val::Unknown,
            },
            (Some(Val::Const(c)), idx) => match idx.as_index() {
                Some((bound, s)) => (c.wrapping_add(disp), bound, s * scale),
                None => return Val::Unknown,
            },
            // `[index + table]` with the roles swapped (scale 1 only).
            (Some(b), Val::Const(c)) if scale == 1 => match b.as_index() {
                Some((bound, s)) => (c.wrapping_add(disp), bound, s),
                None => return Val::Unknown,
            },
            _ => return Val::Unknown,
        };
        if stride != u64::from(size) {
            return Val::Unknown;
        }
        Val::Entry(Elem {
            table,
            size,
            signed,
            bound,
        })
    }

    /// Reinterpret the low `bits` of the value with the given signedness (a sign- or
    /// zero-extension applied to a loaded entry).
    pub(crate) fn extend(self, bits: u8, signed: bool) -> Val {
        match self {
            Val::Entry(e) if bits > e.size * 8 => {
                // Wider than the entry: the load's own extension decides.
                Val::Entry(e)
            }
            Val::Entry(e) => Val::Entry(Elem {
                size: bits / 8,
                signed,
                ..e
            }),
            Val::Index { bound, scale: 1 } => Val::Index { bound, scale: 1 },
            _ => Val::Unknown,
        }
    }
}

/// How the target is computed from an entry.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// The entry is the absolute target (8-byte entries).
    Abs,
    /// `base + (entry << shift)`.
    Rel { base: u64, shift: u8 },
}

/// An indirect jump explained as a table dispatch, before its entries are read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dispatch {
    pub at: u64,
    pub elem: Elem,
    pub kind: Kind,
}

impl Dispatch {
    /// The dispatch a jump to value `v` at `at` stands for, if any.
    pub(crate) fn from_val(at: u64, v: Val) -> Option<Dispatch> {
        match v {
            Val::Entry(elem) if elem.size == 8 => Some(Dispatch {
                at,
                elem,
                kind: Kind::Abs,
            }),
            Val::Target { base, elem, shift } => Some(Dispatch {
                at,
                elem,
                kind: Kind::Rel { base, shift },
            }),
            _ => None,
        }
    }
}

/// What a scan of the code produces.
#[derive(Default)]
pub struct Scan {
    pub(crate) dispatches: Vec<Dispatch>,
    pub(crate) unresolved: Vec<u64>,
    /// Indirect jumps classified as tail calls (before the CFI check).
    pub(crate) tail_calls: Vec<u64>,
    /// Indirect jumps to a function pointer in a split-off part, where the stack's
    /// height is unknown to the scan: tail calls if the CFI says the stack is back at
    /// its entry height.
    pub(crate) part_tail_calls: Vec<u64>,
}

/// Function ranges from symbols and FDEs: where the sweep restarts, and the bounds a
/// jump-table target must stay in.
pub struct Functions {
    /// Sorted by start; may nest or overlap (aliases, symbols inside FDEs).
    ranges: Vec<(u64, u64)>,
    /// Sorted, deduplicated starts.
    pub(crate) starts: Vec<u64>,
    /// Sorted starts of split-off parts (`foo.cold`, `foo.cold.1`, or an FDE starting
    /// with a frame live): entered by a jump from their parent with its frame, not
    /// called.
    split: Vec<u64>,
}

impl Functions {
    fn new(input: &Input, fdes: &[(u64, u64)], mid_frame: &[u64]) -> Self {
        let mut ranges: Vec<(u64, u64)> = input
            .functions
            .iter()
            .filter(|f| f.size != 0)
            .map(|f| (f.addr, f.addr.saturating_add(f.size)))
            .chain(fdes.iter().map(|&(s, n)| (s, s.saturating_add(n))))
            .collect();
        ranges.sort_unstable();
        ranges.dedup();
        let mut starts: Vec<u64> = ranges.iter().map(|r| r.0).collect();
        starts.extend(input.functions.iter().map(|f| f.addr));
        starts.sort_unstable();
        starts.dedup();
        let mut split: Vec<u64> = input
            .functions
            .iter()
            .filter(|f| f.names.iter().any(|n| n.contains(".cold")))
            .map(|f| f.addr)
            .chain(mid_frame.iter().copied())
            .collect();
        split.sort_unstable();
        split.dedup();
        Functions {
            ranges,
            starts,
            split,
        }
    }

    /// Is `addr` a function start where the stack holds just the return address? (Not
    /// a section start nobody named, not a split-off `.cold` part.)
    pub(crate) fn is_entry(&self, addr: u64) -> bool {
        self.starts.binary_search(&addr).is_ok() && self.split.binary_search(&addr).is_err()
    }

    /// Does a function region (a symbol's or an FDE's) start at `addr`?
    pub(crate) fn is_start(&self, addr: u64) -> bool {
        self.starts.binary_search(&addr).is_ok()
    }

    /// The smallest known range containing `addr`.
    pub(crate) fn containing(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        // Nested ranges start at or after their parent: look back a little for the
        // innermost one containing `addr`.
        self.ranges[..i]
            .iter()
            .rev()
            .take(64)
            .filter(|r| addr < r.1)
            .min_by_key(|r| r.1 - r.0)
            .copied()
    }
}

/// The code sections and which of their bytes start an instruction (x86-64: recorded
/// by the sweep; AArch64: every aligned word).
pub struct Code<'a> {
    pub(crate) secs: Vec<CodeSec<'a>>,
    fixed_width: bool,
}

pub(crate) struct CodeSec<'a> {
    pub addr: u64,
    pub bytes: &'a [u8],
    /// PLT stubs: every indirect jump is a call through the GOT, not worth reporting.
    pub plt: bool,
    /// One bit per byte: an instruction starts here.
    starts: Vec<u64>,
}

impl<'a> Code<'a> {
    fn new(input: &Input<'a>, fixed_width: bool) -> Self {
        let mut secs: Vec<CodeSec<'a>> = input
            .code_section_headers()
            .filter_map(|s| {
                let bytes = input
                    .data
                    .get(s.offset as usize..s.offset.checked_add(s.size)? as usize)?;
                Some(CodeSec {
                    addr: s.addr,
                    bytes,
                    plt: s.name.starts_with(".plt") || s.name == ".iplt",
                    starts: if fixed_width {
                        Vec::new()
                    } else {
                        vec![0; bytes.len().div_ceil(64)]
                    },
                })
            })
            .collect();
        secs.sort_by_key(|s| s.addr);
        Code { secs, fixed_width }
    }

    fn section_of(&self, addr: u64) -> Option<&CodeSec<'a>> {
        let i = self.secs.partition_point(|s| s.addr <= addr);
        let s = self.secs[..i].last()?;
        (addr - s.addr < s.bytes.len() as u64).then_some(s)
    }

    /// Is `addr` the first byte of an instruction in a (non-PLT) code section?
    pub(crate) fn is_insn_start(&self, addr: u64) -> bool {
        let Some(s) = self.section_of(addr) else {
            return false;
        };
        if s.plt {
            return false;
        }
        let off = addr - s.addr;
        if self.fixed_width {
            return addr.is_multiple_of(4);
        }
        s.starts[(off / 64) as usize] & (1 << (off % 64)) != 0
    }
}

impl CodeSec<'_> {
    pub(crate) fn mark_insn_start(&mut self, off: usize) {
        if let Some(w) = self.starts.get_mut(off / 64) {
            *w |= 1 << (off % 64);
        }
    }
}

/// What fixed 8-byte memory slots (GOT entries, function-pointer variables) hold, as
/// far as telling a tail call through a slot from a computed goto goes.
pub struct Slots<'a> {
    input: &'a Input<'a>,
    /// `.got`, `.got.plt`: addresses of symbols, never of a label inside a function.
    got: Vec<(u64, u64)>,
    /// Executable sections: a slot there is not data.
    exec: Vec<(u64, u64)>,
    /// `(offset, addend)` of the `R_*_RELATIVE` relocations, sorted; read on first use.
    relative: std::cell::OnceCell<Vec<(u64, u64)>>,
    /// The ISA's `R_*_RELATIVE` type.
    relative_type: u32,
}

impl<'a> Slots<'a> {
    fn new(input: &'a Input<'a>, relative_type: u32) -> Self {
        let range = |s: &crate::elf::read::Section| (s.addr, s.addr.saturating_add(s.size));
        Slots {
            input,
            relative_type,
            got: input
                .sections
                .iter()
                .filter(|s| s.name == ".got" || s.name == ".got.plt")
                .map(range)
                .collect(),
            exec: input
                .sections
                .iter()
                .filter(|s| s.flags & u64::from(elf::SHF_EXECINSTR) != 0 && s.addr != 0)
                .map(range)
                .collect(),
            relative: std::cell::OnceCell::new(),
        }
    }

    fn relative(&self) -> &[(u64, u64)] {
        self.relative.get_or_init(|| {
            let ty = self.relative_type;
            let mut out = Vec::new();
            for s in self
                .input
                .sections
                .iter()
                .filter(|s| s.sh_type == elf::SHT_RELA)
            {
                let Some(bytes) = usize::try_from(s.offset)
                    .ok()
                    .and_then(|o| self.input.data.get(o..o.checked_add(s.size as usize)?))
                else {
                    continue;
                };
                for r in bytes.chunks_exact(24) {
                    let word = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap());
                    if word(8) & 0xffff_ffff == u64::from(ty) {
                        out.push((word(0), word(16)));
                    }
                }
            }
            out.sort_unstable();
            out
        })
    }

    /// May the 8-byte slot at `addr` hold an address inside `[from, to)` other than
    /// `from` itself (a label: a computed goto, not a call)? GOT slots never do; a slot
    /// in code is not believed to be data; otherwise its link-time value (its
    /// `R_*_RELATIVE` addend, else the file's bytes) decides, and a slot with no value
    /// in the file (`.bss`) is set at run time by code, which the caller checks.
    pub(crate) fn may_hold_label(&self, addr: u64, from: u64, to: u64) -> bool {
        let inside = |v: u64| from < v && v < to;
        let within = |rs: &[(u64, u64)]| rs.iter().any(|&(s, e)| s <= addr && addr < e);
        if within(&self.got) {
            return false;
        }
        if within(&self.exec) {
            return true;
        }
        let rel = self.relative();
        let i = rel.partition_point(|r| r.0 < addr);
        if let Some(&(_, addend)) = rel.get(i).filter(|r| r.0 == addr) {
            return inside(addend);
        }
        match self.input.bytes_at(addr).and_then(|b| b.get(..8)) {
            Some(b) => inside(u64::from_le_bytes(b.try_into().unwrap())),
            None => false,
        }
    }
}

/// Without a bound, stop reading entries here at the latest.
const MAX_UNBOUNDED: u64 = 4096;
/// A compare bound above this is not believed to describe a jump table.
const MAX_BOUND: u64 = 1 << 16;

/// Read the entries of each dispatch's table and keep the tables whose entries are all
/// instruction starts of the dispatching function.
/// A table as its dispatches read it: address, entry size, and the base and shift of a
/// relative table.
type TableKey = (u64, u8, Option<(u64, u8)>);

fn resolve(input: &Input, code: &Code, funcs: &Functions, mut ds: Vec<Dispatch>, flow: &mut Flow) {
    ds.sort_by_key(|d| (d.elem.table, d.at));
    // Unbounded reads stop at the next table: its entries are not ours.
    let table_starts: Vec<u64> = ds.iter().map(|d| d.elem.table).collect();
    // A table that a bounded dispatch indexes has that many entries for its other
    // dispatches too (CPython's opcode_targets: one dispatch indexes it by a byte,
    // others by a wider opcode value); the bounded ones go first.
    ds.sort_by_key(|d| d.elem.bound.is_none());
    let mut sizes: HashMap<TableKey, u64> = HashMap::new();
    for mut d in ds {
        let key = (
            d.elem.table,
            d.elem.size,
            match d.kind {
                Kind::Abs => None,
                Kind::Rel { base, shift } => Some((base, shift)),
            },
        );
        if d.elem.bound.is_none() {
            d.elem.bound = sizes.get(&key).copied();
        }
        let owner = funcs.containing(d.at);
        let next_table = table_starts[table_starts.partition_point(|&t| t <= d.elem.table)..]
            .first()
            .copied()
            .unwrap_or(u64::MAX);
        match read_table(input, code, funcs, owner, &d, next_table) {
            Ok((targets, bounded)) => {
                if bounded {
                    sizes.entry(key).or_insert(targets.len() as u64);
                }
                let mut targets = targets;
                targets.sort_unstable();
                targets.dedup();
                flow.tables.push(JumpTable {
                    table: d.elem.table,
                    entry_size: d.elem.size,
                    dispatch: d.at,
                    targets,
                    bounded,
                });
            }
            Err(why) => {
                flow.warnings.push(format!(
                    "indirect jump at {:#x}: table at {:#x} rejected: {why}",
                    d.at, d.elem.table
                ));
                flow.unresolved_indirect_jumps.push(d.at);
            }
        }
    }
}

fn read_table(
    input: &Input,
    code: &Code,
    funcs: &Functions,
    owner: Option<(u64, u64)>,
    d: &Dispatch,
    next_table: u64,
) -> Result<(Vec<u64>, bool), String> {
    let e = d.elem;
    let size = u64::from(e.size);
    let bytes = input
        .bytes_at(e.table)
        .ok_or_else(|| "not in the file".to_string())?;
    let in_owner = |t: u64| owner.is_some_and(|(s, end)| s <= t && t < end);
    let target_of = |i: u64| -> Option<u64> {
        let off = usize::try_from(i.checked_mul(size)?).ok()?;
        let raw = bytes.get(off..off.checked_add(e.size as usize)?)?;
        let mut b = [0u8; 8];
        b[..raw.len()].copy_from_slice(raw);
        let mut v = u64::from_le_bytes(b);
        if e.signed && size < 8 {
            let sh = 64 - 8 * size as u32;
            v = (((v << sh) as i64) >> sh) as u64;
        }
        Some(match d.kind {
            Kind::Abs => v,
            Kind::Rel { base, shift } => base.wrapping_add(v.wrapping_shl(u32::from(shift))),
        })
    };
    let read_unbounded = || -> Result<(Vec<u64>, bool), String> {
        if owner.is_none() {
            return Err("no bound and no function range to check entries against".into());
        }
        let mut targets = Vec::new();
        for i in 0..MAX_UNBOUNDED {
            if i > 0 && e.table + i * size >= next_table {
                break;
            }
            // Any instruction start, not only the function's own: a table may reach a
            // split-off part (`.cold`, BOLT's `.warm`), even with its first entry, and
            // stopping there would miss the entries after it. Reading on past the
            // table's end only adds targets (more care), never loses one.
            match target_of(i) {
                Some(t) if code.is_insn_start(t) => targets.push(t),
                _ => break,
            }
        }
        if targets.is_empty() {
            return Err("entry 0 is not an instruction start".into());
        }
        // A table of function starts is one of function pointers, not of labels.
        if !targets.iter().any(|&t| in_owner(t) || !funcs.is_start(t)) {
            return Err("every entry is a function start".into());
        }
        Ok((targets, false))
    };
    let mut targets = Vec::new();
    match e.bound {
        Some(n) if n <= MAX_BOUND => {
            for i in 0..n {
                let t = target_of(i).ok_or_else(|| format!("entry {i} is not in the file"))?;
                // A compare-bounded table may reach a split-off part of its function
                // (`.cold`): any instruction start in code is believed.
                if !code.is_insn_start(t) {
                    if owner.is_some() {
                        // The bound came from a compare of a wider value (or another
                        // way in): read the entries as without one.
                        return read_unbounded();
                    }
                    return Err(format!("entry {i} ({t:#x}) is not an instruction start"));
                }
                targets.push(t);
            }
            Ok((targets, true))
        }
        Some(n) => Err(format!("bound {n} is implausibly large")),
        None => read_unbounded(),
    }
}
