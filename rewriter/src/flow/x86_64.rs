//! x86-64 jump-table dispatch recognition (iced-x86).
//!
//! The patterns gcc and clang emit, in any order and with unrelated instructions in
//! between:
//! - PIC: `lea T(%rip),%rB; movslq (%rB,%rI,4),%rE; add %rB,%rE; (notrack) jmp *%rE`
//!   (`-O0`: `lea 0(,%rI,4)`, `mov (%rX,%rY),%eE`, `cdqe`);
//! - non-PIC: `jmp *T(,%rI,8)` or `mov T(,%rI,8),%rE; jmp *%rE`;
//! - the bound: `cmp $N,%rI` (or `cmpl $N,-d(%rbp)` at `-O0`) + `ja`/`jbe`/`jae`/`jb`.
//!
//! Each sweep piece (code between two function starts) is first decoded quickly, only
//! marking instruction starts; pieces with an indirect jump are decoded again with the
//! abstract register state of [`Val`], forward and in address order. That order is
//! not the control flow, so a recovered table is only a candidate: `resolve` checks
//! every entry.

use iced_x86::{
    Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    Register,
};

use super::{Code, CodeSec, Dispatch, Functions, Scan, Val};

pub(super) fn scan(code: &mut Code, funcs: &Functions, out: &mut Scan) {
    let mut factory = InstructionInfoFactory::new();
    for sec in &mut code.secs {
        let end = sec.addr + sec.bytes.len() as u64;
        let lo = funcs.starts.partition_point(|&s| s <= sec.addr);
        let hi = funcs.starts.partition_point(|&s| s < end);
        let mut from = sec.addr;
        for &to in funcs.starts[lo..hi].iter().chain(std::iter::once(&end)) {
            if from < to {
                piece(sec, from, to, &mut factory, out);
            }
            from = to;
        }
    }
}

/// Decode `[from, to)` of `sec`: mark instruction starts, then analyse if it holds an
/// indirect jump.
fn piece(
    sec: &mut CodeSec,
    from: u64,
    to: u64,
    factory: &mut InstructionInfoFactory,
    out: &mut Scan,
) {
    let (a, b) = ((from - sec.addr) as usize, (to - sec.addr) as usize);
    let bytes = &sec.bytes[a..b];
    let mut dec = Decoder::with_ip(64, bytes, from, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    let mut indirect = false;
    while dec.can_decode() {
        dec.decode_out(&mut ins);
        if ins.is_invalid() {
            continue;
        }
        sec.mark_insn_start(a + (ins.ip() - from) as usize);
        indirect |= is_indirect_jmp(&ins);
    }
    if indirect && !sec.plt {
        analyse(bytes, from, factory, out);
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

/// A memory operand `disp(%base)` (no index).
type Slot = (usize, u64);

/// What the last flag-setting instruction compared against an immediate.
#[derive(Clone, Copy)]
enum Cmp {
    Reg(usize, u64),
    /// The switch value is in memory (`-O0` frame slots, `cmpb $7,(%rbx)`).
    Mem(Slot, u64),
}

#[derive(Default)]
struct State {
    regs: [Val; 16],
    /// Registers with the same origin hold the same value (copies): a bound learnt
    /// on one holds for all.
    origin: [u32; 16],
    next_origin: u32,
    flags: Option<Cmp>,
    /// Memory operands `(slot, bound)` known to hold a bounded value.
    slots: Vec<(Slot, u64)>,
}

impl State {
    fn set(&mut self, r: Register, v: Val) {
        self.next_origin += 1;
        self.set_with_origin(r, v, self.next_origin);
    }

    fn kill(&mut self, i: usize) {
        self.next_origin += 1;
        self.origin[i] = self.next_origin;
        self.regs[i] = Val::Unknown;
        self.slots.retain(|s| s.0.0 != i);
    }

    fn copy(&mut self, dst: Register, src: Register) {
        match gpr(src) {
            Some((s, _)) => self.set_with_origin(dst, self.regs[s], self.origin[s]),
            None => self.set(dst, Val::Unknown),
        }
    }

    fn set_with_origin(&mut self, r: Register, v: Val, origin: u32) {
        let Some((i, size)) = gpr(r) else { return };
        self.origin[i] = origin;
        // A new base register: what its memory operands held is unknown now.
        self.slots.retain(|s| s.0.0 != i);
        self.regs[i] = match (size, v) {
            (8, v) => v,
            // A 32-bit write zero-extends: constants are truncated; an index keeps its
            // bound; 32-bit entries stay what they are.
            (4, Val::Const(c)) => Val::Const(c & 0xffff_ffff),
            (4, v @ Val::Index { .. }) => v,
            (4, Val::Entry(e)) if e.size <= 4 => v,
            _ => Val::Unknown,
        };
    }

    fn get(&self, r: Register) -> Val {
        gpr(r).map_or(Val::Unknown, |(i, _)| self.regs[i])
    }

    /// The value loaded by the memory operand of `ins` (`size` bytes).
    fn load(&self, ins: &Instruction, size: u8, signed: bool) -> Val {
        if let Some(b) = self.slot_bound(ins) {
            return Val::Index {
                bound: Some(b),
                scale: 1,
            };
        }
        if ins.memory_index() == Register::None {
            return Val::Unknown;
        }
        let base = match ins.memory_base() {
            Register::None => None,
            Register::RIP => return Val::Unknown,
            r => Some(self.get(r)),
        };
        Val::load(
            base,
            self.get(ins.memory_index()),
            u64::from(ins.memory_index_scale()),
            ins.memory_displacement64(),
            size,
            signed,
        )
    }

    fn slot(ins: &Instruction) -> Option<Slot> {
        if ins.memory_index() != Register::None {
            return None;
        }
        let (b, _) = gpr(ins.memory_base())?;
        Some((b, ins.memory_displacement64()))
    }

    fn slot_bound(&self, ins: &Instruction) -> Option<u64> {
        let d = Self::slot(ins)?;
        self.slots.iter().find(|s| s.0 == d).map(|s| s.1)
    }

    /// Memory was written: only frame slots not written survive (they do not alias
    /// other memory in the code that spills switch values).
    fn memory_written(&mut self, ins: Option<&Instruction>) {
        let hit = ins.and_then(Self::slot);
        self.slots.retain(|s| s.0.0 == 5 && Some(s.0) != hit);
    }

    /// Value `< bound` learnt for register `i` and every copy of it.
    fn bound_reg(&mut self, i: usize, bound: u64) {
        let o = self.origin[i];
        for j in 0..16 {
            if self.origin[j] == o
                && matches!(self.regs[j], Val::Unknown | Val::Index { scale: 1, .. })
            {
                self.regs[j] = Val::Index {
                    bound: Some(bound),
                    scale: 1,
                };
            }
        }
    }
}

/// Forward abstract interpretation of one piece; records a dispatch or an unresolved
/// jump for each indirect `jmp`.
fn analyse(bytes: &[u8], from: u64, factory: &mut InstructionInfoFactory, out: &mut Scan) {
    let mut st = State::default();
    let mut dec = Decoder::with_ip(64, bytes, from, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while dec.can_decode() {
        dec.decode_out(&mut ins);
        if ins.is_invalid() {
            st = State::default();
            continue;
        }
        step(&mut st, &ins, factory, out);
    }
}

fn step(st: &mut State, ins: &Instruction, factory: &mut InstructionInfoFactory, out: &mut Scan) {
    let m = ins.mnemonic();
    let op0 = if ins.op0_kind() == OpKind::Register {
        ins.op0_register()
    } else {
        Register::None
    };
    let dst_gpr = gpr(op0).is_some();
    let imm1 = matches!(
        ins.op1_kind(),
        OpKind::Immediate8
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate32to64
            | OpKind::Immediate64
    );
    let handled = match m {
        Mnemonic::Lea if dst_gpr => {
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
                    None => Val::Unknown,
                }
            } else {
                Val::Unknown
            };
            st.set(op0, v);
            true
        }
        Mnemonic::Mov if dst_gpr => {
            match ins.op1_kind() {
                OpKind::Register => st.copy(op0, ins.op1_register()),
                OpKind::Memory => {
                    let v = st.load(ins, op0.size() as u8, false);
                    st.set(op0, v);
                }
                _ if imm1 => st.set(op0, Val::Const(ins.immediate(1))),
                _ => st.set(op0, Val::Unknown),
            }
            true
        }
        Mnemonic::Movsxd if dst_gpr => {
            let v = match ins.op1_kind() {
                OpKind::Register => st.get(ins.op1_register()).extend(32, true),
                OpKind::Memory => st.load(ins, 4, true),
                _ => Val::Unknown,
            };
            st.set(op0, v);
            true
        }
        Mnemonic::Movzx | Mnemonic::Movsx if dst_gpr => {
            let signed = m == Mnemonic::Movsx;
            let v = match ins.op1_kind() {
                OpKind::Register => {
                    let src = ins.op1_register();
                    st.get(src).extend(8 * src.size() as u8, signed)
                }
                OpKind::Memory => st.load(ins, ins.memory_size().size() as u8, signed),
                _ => Val::Unknown,
            };
            st.set(op0, v);
            true
        }
        Mnemonic::Cdqe => {
            let v = st.get(Register::RAX).extend(32, true);
            st.set(Register::RAX, v);
            true
        }
        Mnemonic::Add if dst_gpr && op0.size() == 8 => {
            let a = st.get(op0);
            let v = match ins.op1_kind() {
                OpKind::Register => match (a, st.get(ins.op1_register())) {
                    (Val::Const(base), Val::Entry(elem)) | (Val::Entry(elem), Val::Const(base)) => {
                        Val::Target {
                            base,
                            elem,
                            shift: 0,
                        }
                    }
                    _ => Val::Unknown,
                },
                _ if imm1 => match a {
                    Val::Const(c) => Val::Const(c.wrapping_add(ins.immediate(1))),
                    _ => Val::Unknown,
                },
                _ => Val::Unknown,
            };
            st.set(op0, v);
            st.flags = None;
            true
        }
        Mnemonic::Cmp if imm1 => {
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
            true
        }
        Mnemonic::Ja | Mnemonic::Jbe | Mnemonic::Jae | Mnemonic::Jb => {
            // Unsigned compares only: on one of the two ways on, value <= N (ja/jbe)
            // or < N (jae/jb). Address order decides which way is assumed.
            let inclusive = matches!(m, Mnemonic::Ja | Mnemonic::Jbe);
            let n = |imm: u64| {
                if inclusive {
                    imm.checked_add(1)
                } else {
                    Some(imm)
                }
            };
            match st.flags {
                Some(Cmp::Reg(i, imm)) => {
                    if let Some(b) = n(imm) {
                        st.bound_reg(i, b);
                    }
                }
                Some(Cmp::Mem(d, imm)) => {
                    if let Some(b) = n(imm) {
                        st.slots.retain(|s| s.0 != d);
                        st.slots.push((d, b));
                    }
                }
                None => {}
            }
            true
        }
        Mnemonic::Jmp if is_indirect_jmp(ins) => {
            let v = match ins.op0_kind() {
                OpKind::Register => st.get(op0),
                _ => st.load(ins, 8, false),
            };
            match Dispatch::from_val(ins.ip(), v) {
                Some(d) => out.dispatches.push(d),
                None => out.unresolved.push(ins.ip()),
            }
            true
        }
        Mnemonic::Call => {
            // The SysV ABI's caller-saved registers.
            for r in [0, 1, 2, 6, 7, 8, 9, 10, 11] {
                st.kill(r);
            }
            st.memory_written(None);
            st.flags = None;
            true
        }
        _ => false,
    };
    if !handled {
        let info = factory.info(ins);
        let writes = |a: OpAccess| {
            matches!(
                a,
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
        };
        for u in info.used_registers() {
            if writes(u.access()) && gpr(u.register()).is_some() {
                st.set(u.register().full_register(), Val::Unknown);
            }
        }
        if info.used_memory().iter().any(|u| writes(u.access())) {
            st.memory_written((ins.op0_kind() == OpKind::Memory).then_some(ins));
        }
    }
    if !matches!(m, Mnemonic::Cmp) && ins.rflags_modified() != 0 {
        st.flags = None;
    }
}
