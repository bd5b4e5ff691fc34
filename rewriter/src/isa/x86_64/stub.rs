//! The inline stubs of function entries and exits, and the trampoline of a window.
//!
//! ```text
//!   [lea -128(%rsp),%rsp]          ; below the red zone (sites inside a function)
//!   push  %rcx,%rsi[,%rax,%rdx]    ; %rax/%rdx only when the stub reads the TSC
//! retry:
//!   mov   %fs:0,%r11               ; thread pointer
//!   mov   %r11,%rcx ; shr $16,%rcx ; movzwl %cx,%ecx    ; h
//!   lea   INDEX(%rip),%rsi ; mov (%rsi,%rcx,4),%ecx
//!   lea   SLOTS(%rip),%rsi ; add %rcx,%rsi               ; slot
//!   cmp   (%rsi),%r11 ; jne miss
//!   incq  56(%rsi)                                       ; inflight
//!   mov   $32,%r11d ; xadd %r11,8(%rsi)                  ; reserve: one instruction,
//!                                                        ; so a signal cannot split it
//!   movq  $site,(%r11)                                   ; site, flags = 0
//!   mov   %rdi|%rax,16(%r11)                             ; argument | return value
//!   mov   FRAME(%rsp),%rcx ; mov %rcx,24(%r11)           ; return address
//!   [rdtsc ; mov %eax,8(%r11) ; mov %edx,12(%r11)]       ; TimeMode::Record
//!   [mov 52(%rsi),%ecx ; mov %rcx,8(%r11)]               ; Coarse: buffer epoch
//!   decq  56(%rsi)
//!   add   $32,%r11 ; cmp 16(%rsi),%r11 ; jae full
//! out:
//!   pop   ... ; [lea 128(%rsp),%rsp]
//! miss:
//!   [push %rax,%rdx] call register [pop] ; test %rcx,%rcx ; jz out ; jmp retry
//! full:
//!   [push %rax,%rdx] call flush [pop] ; jmp out
//! ```
//!
//! Entries and exits sit where the psABI makes RFLAGS and %r11 dead (a function's
//! first instruction, a `ret`, a direct tail-call `jmp`: status flags are not preserved
//! across calls and %r11 is a scratch register that carries nothing in or out), so the
//! stub uses and clobbers them freely — unless the function never writes them itself
//! (then gcc's -fipa-ra may have let its callers keep values there across the call:
//! `PlacedSite::keep_flags`/`keep_r11`), or an indirect tail call jumps through %r11. That is what makes it cheap: no flag save, no
//! `%r11` save; with coarse timestamps only two registers are saved.
//!
//! Fast rings (`BUF_FAST_CIRCULAR`) reserve with `xadd %r11w` on the low 16 bits of
//! `cur` and address the records from the ring's start, with no full check; a stub of
//! several records also compares the old offset with `0x10000 - 32 * nrec` and, past
//! it, takes a cold path that clears those records' flags and reserves again, so none
//! lands in the next thread's ring (`tracer-common/src/layout.rs`).
//!
//! The entry/exit stub is 29 instructions with coarse timestamps, 34 with `rdtsc`. The
//! `-fipa-ra` case was found on Debian's libbz2 and static glibc. Blocks, memory
//! accesses and USDT probes sit anywhere, so their stubs also save RFLAGS
//! (`lahf`/`seto`, restored with `add $0x7f,%al; sahf`; not where every status flag is
//! written before it is read in straight-line code after the site) and `%r11`. A
//! memory stub placed at the head of an access run (`runs.rs`) records every access of
//! the run, two to a record (`FLAG_MEM_PAIR`), each address computed from the head's
//! registers plus the moves between. A memory stub first
//! computes the operand's effective address from the original registers (`lea` with
//! `%rsp`-relative displacements corrected, RIP-relative ones re-based, `%fs:` adding
//! the thread pointer from `%fs:0`) and records it with the size, the read/write flags
//! and the instruction's address. A USDT stub first computes every argument (registers
//! of any width, memory operands, RIP-relative globals, immediates, sign- or
//! zero-extended as the note says) and reserves `ceil(n/2)` records with one `xadd`:
//! arguments 1–2 in the first record, the rest in records flagged `FLAG_USDT_MORE`. A
//! chosen value (`[values]`) is computed the same way.

use iced_x86::code_asm::*;
use std::collections::{HashMap, HashSet};

use iced_x86::{
    BlockEncoderOptions, Code, FlowControl, Instruction, MemoryOperand, Mnemonic, OpKind, Register,
};

use super::super::{Layout, PlacedSite, Runtime, SlotLookup, Trampoline, Window, slot_mask};
use crate::isa::arg::{Arg, ArgLoc, Reg as UsdtReg};
use tracer_common::meta::{SiteKind, TimeMode};
use tracer_common::{
    BUF_CIRCULAR, BUF_FAST_CIRCULAR, BUF_TRACE, FAST_RING_BYTES, FLAG_RING, FLAG_USDT_INDEX_SHIFT,
    FLAG_USDT_MORE, INDEX_OFF, RECORD_FLAGS_OFF, RECORD_SIZE, SLOT_CUR, SLOT_END, SLOT_GENERATION,
    SLOT_INFLIGHT, SLOT_START, SLOTS_OFF, pair_flags,
};

pub(super) fn lea_rip(a: &mut CodeAssembler, reg: Register, addr: u64) -> Result<(), IcedError> {
    a.add_instruction(Instruction::with2(
        Code::Lea_r64_m,
        reg,
        MemoryOperand::with_base_displ(Register::RIP, addr as i64),
    )?)
}

/// The slow paths of a stub, emitted after the trampoline's last instruction so that
/// the fast path falls straight through.
struct SlowPaths {
    retry: CodeLabel,
    out: CodeLabel,
    miss: CodeLabel,
    full: CodeLabel,
    /// Registers to keep around the calls.
    wrap: Vec<AsmRegister64>,
    /// A full circular buffer wraps (no flush).
    circular: bool,
    /// A fast ring's reservation of several records that crossed the ring's end.
    straddle: Option<Straddle>,
}

/// The cold path of a fast-ring reservation of `nrec` records that crossed the ring's
/// end (`emit_reserve`): %r11d = its old offset, %rsi = the slot.
struct Straddle {
    label: CodeLabel,
    nrec: i32,
}

/// Put the effective address of `ins`'s memory operand, plus `shift` (an access run's
/// member: what its registers move by before it), into %rax, the registers being as
/// the original code had them except %rsp, which is `depth` bytes lower.
fn emit_ea(
    a: &mut CodeAssembler,
    ins: &Instruction,
    shift: i64,
    depth: i32,
) -> Result<(), IcedError> {
    let base = ins.memory_base();
    let mut disp = (ins.memory_displacement64() as i64).wrapping_add(shift);
    if base == Register::RSP {
        disp += i64::from(depth);
    }
    let mem = MemoryOperand::new(
        base,
        ins.memory_index(),
        ins.memory_index_scale(),
        disp,
        // iced: 1 = try disp8, else the address size in bytes.
        if base != Register::RIP && i8::try_from(disp).is_ok() {
            1
        } else {
            8
        },
        false,
        Register::None,
    );
    a.add_instruction(Instruction::with2(Code::Lea_r64_m, Register::RAX, mem)?)?;
    if ins.memory_segment() == Register::FS {
        // %fs:0 holds the thread pointer itself (the TLS ABI): EA = fs base + offset.
        a.add(rax, qword_ptr(0u64).fs())?;
    }
    Ok(())
}

/// Put USDT argument `arg` into %rax (extended to 64 bits as its size and sign say),
/// the registers being as the original code had them except %rsp (`depth` bytes lower)
/// and %rax (saved at `[%rsp + rax_at]`).
fn emit_usdt_arg(
    a: &mut CodeAssembler,
    arg: &Arg,
    depth: i32,
    rax_at: i32,
) -> Result<(), IcedError> {
    match &arg.loc {
        ArgLoc::Imm(v) => a.mov(rax, *v as u64)?,
        ArgLoc::Reg(r) => usdt_reg_arg(a, arg, r, depth, rax_at)?,
        ArgLoc::Mem { base, index, disp } => {
            let base = base.as_ref().map_or(Register::None, x86);
            let (index, scale) = match index {
                Some((r, s)) => (x86(r), u32::from(*s)),
                None => (Register::None, 1),
            };
            // %rax is about to be overwritten: address through its original value.
            if base == Register::RAX || index == Register::RAX {
                a.mov(rax, qword_ptr(rsp + rax_at))?;
            }
            let mut disp = *disp;
            if base == Register::RSP {
                disp += i64::from(depth);
            }
            let mem = MemoryOperand::new(base, index, scale, disp, 8, false, Register::None);
            a.add_instruction(Instruction::with2(Code::Lea_r64_m, Register::RAX, mem)?)?;
            load_at_rax(a, arg)?;
        }
        ArgLoc::Static { addr } => {
            lea_rip(a, Register::RAX, *addr)?;
            load_at_rax(a, arg)?;
        }
    }
    Ok(())
}

/// The notes of an x86-64 binary are parsed as x86-64 (usdt::probes checks the
/// machine), so every register is an x86 one.
fn x86(r: &UsdtReg) -> Register {
    match r {
        UsdtReg::X86 { reg, .. } => *reg,
        UsdtReg::A64(_) => Register::None,
    }
}

/// %rax = the original value of register `r`, widened as `arg` says.
fn usdt_reg_arg(
    a: &mut CodeAssembler,
    arg: &Arg,
    r: &UsdtReg,
    depth: i32,
    rax_at: i32,
) -> Result<(), IcedError> {
    match x86(r) {
        Register::RAX => a.mov(rax, qword_ptr(rsp + rax_at))?,
        Register::RSP => a.lea(rax, ptr(rsp + depth))?,
        r => a.add_instruction(Instruction::with2(Code::Mov_r64_rm64, Register::RAX, r)?)?,
    }
    if matches!(r, UsdtReg::X86 { high8: true, .. }) {
        a.movzx(eax, ah)?;
        if arg.signed {
            a.movsx(rax, al)?;
        }
        return Ok(());
    }
    match (arg.size, arg.signed) {
        (1, false) => a.movzx(rax, al),
        (1, true) => a.movsx(rax, al),
        (2, false) => a.movzx(rax, ax),
        (2, true) => a.movsx(rax, ax),
        (4, false) => a.mov(eax, eax),
        (4, true) => a.movsxd(rax, eax),
        _ => Ok(()),
    }
}

/// %rax = the `arg.size` bytes at %rax, widened as `arg` says.
fn load_at_rax(a: &mut CodeAssembler, arg: &Arg) -> Result<(), IcedError> {
    match (arg.size, arg.signed) {
        (1, false) => a.movzx(rax, byte_ptr(rax)),
        (1, true) => a.movsx(rax, byte_ptr(rax)),
        (2, false) => a.movzx(rax, word_ptr(rax)),
        (2, true) => a.movsx(rax, word_ptr(rax)),
        (4, false) => a.mov(eax, dword_ptr(rax)),
        (4, true) => a.movsxd(rax, dword_ptr(rax)),
        _ => a.mov(rax, qword_ptr(rax)),
    }
}

/// What the sites of one stub need, decided before any code is emitted.
struct Shape<'s> {
    /// The stub reads the cycle counter.
    tsc: bool,
    /// A live-site frame: flags and %rax saved, below the red zone.
    live: bool,
    /// The frame saves the status flags (`lahf`/`seto`): not where they are dead.
    save_flags: bool,
    /// The instruction of each memory site (by site index): its effective address is
    /// computed first, from the registers as they are at the stub (an access run's
    /// members: the head's registers, which their addresses do not depend on).
    mem: Vec<Option<&'s Instruction>>,
    /// A memory site whose access goes into another's record (a pair): the index of
    /// the site that takes it in its `aux`.
    pair: Vec<Option<usize>>,
    /// Every site's values, in site order; site i's start at `arg_base[i]`.
    args: Vec<&'s Arg>,
    arg_base: Vec<usize>,
    /// Records per site (a USDT probe: its arguments two per record) and in all.
    per: Vec<i32>,
    nrec: i32,
    /// Bytes skipped below %rsp first (the red zone at a live site).
    red_zone: i32,
}

/// The stack frame the prologue built.
struct Frame {
    /// Bytes between the stub's %rsp and the original %rsp.
    depth: i32,
    /// Depth of each memory site's effective address (by site index).
    ea_depth: Vec<i32>,
    /// Depth of each value of `Shape::args`.
    arg_depth: Vec<i32>,
    /// Registers pushed last (popped first).
    saved: Vec<AsmRegister64>,
}

impl<'s> Shape<'s> {
    /// `insn`: the instruction of each memory site.
    fn new(
        layout: &Layout,
        sites: &[&'s PlacedSite],
        insn: impl Fn(u64) -> Option<&'s Instruction>,
    ) -> Self {
        let tsc = match layout.time_mode {
            TimeMode::Record => true,
            TimeMode::Block => sites.iter().any(|s| s.kind == SiteKind::Block),
            TimeMode::Coarse => false,
        };
        // Entries and exits sit where RFLAGS and %r11 are dead (psABI); blocks, memory
        // accesses and USDT probes can be anywhere: save both there.
        // Values computed before anything is clobbered (a USDT probe's arguments, an
        // indirect call's target, a chosen value): that needs the live-site frame.
        let live = sites.iter().any(|s| {
            !s.args.is_empty()
                || s.keep_flags
                || matches!(
                    s.kind,
                    SiteKind::Block | SiteKind::Memory | SiteKind::Usdt | SiteKind::Call
                )
        });
        let arg_base: Vec<usize> = sites
            .iter()
            .scan(0, |n, s| {
                let b = *n;
                *n += s.args.len();
                Some(b)
            })
            .collect();
        let pair = crate::isa::runs::pairs(sites);
        let per: Vec<i32> = sites
            .iter()
            .enumerate()
            .map(|(i, s)| match s.kind {
                SiteKind::Usdt => s.args.len().div_ceil(2).max(1) as i32,
                _ if pair.contains(&Some(i)) => 0,
                _ => 1,
            })
            .collect();
        Shape {
            tsc,
            live,
            save_flags: live && sites.iter().any(|s| s.keep_flags || !s.flags_dead),
            mem: sites
                .iter()
                .map(|s| (s.kind == SiteKind::Memory).then(|| insn(s.insn)).flatten())
                .collect(),
            pair,
            args: sites.iter().flat_map(|s| &s.args).collect(),
            arg_base,
            nrec: per.iter().sum(),
            per,
            // Below the red zone, which a leaf function may be using. Entries and exits
            // need not: only a function that makes no call has a red zone, so at an
            // entry nobody does (the caller just called), and at a return or tail call
            // it is dead.
            red_zone: if live { 128 } else { 0 },
        }
    }
}

/// The fast path of the stub for every site placed before `ins` (several stores, one
/// pointer bump and one full-check: e.g. an entry, its first block and a memory access
/// at the same instruction).
fn emit_stub(
    a: &mut CodeAssembler,
    layout: &Layout,
    sites: &[&PlacedSite],
    ins: &Instruction,
    members: &HashMap<u64, Instruction>,
) -> Result<SlowPaths, IcedError> {
    let mut retry = a.create_label();
    let miss = a.create_label();
    let mut out = a.create_label();
    let full = a.create_label();
    let insn = |at: u64| {
        if at == ins.ip() {
            Some(ins)
        } else {
            members.get(&at)
        }
    };
    let shape = Shape::new(layout, sites, insn);
    let frame = emit_prologue(a, &shape, sites, ins)?;
    a.set_label(&mut retry)?;
    let straddle = emit_reserve(a, layout, shape.nrec, miss)?;
    let ring_flag = if layout.buf_kind != BUF_TRACE {
        FLAG_RING
    } else {
        0
    };
    let mut first = 0;
    for (k, ((site, &n), &base)) in sites
        .iter()
        .zip(&shape.per)
        .zip(&shape.arg_base)
        .enumerate()
    {
        if n == 0 {
            continue;
        }
        let site_args = &frame.arg_depth[base..base + site.args.len()];
        emit_site_store(
            a,
            &shape,
            &frame,
            (sites, k),
            ins,
            (first, n),
            site_args,
            ring_flag,
        )?;
        first += n;
    }
    emit_times_and_check(a, layout, &shape, full)?;
    a.set_label(&mut out)?;
    emit_epilogue(a, &shape, &frame)?;
    // register and flush clobber %rax %rcx %rdx %rsi %r11 (and flags): keep what the
    // fast path did not save itself.
    let wrap = [rax, rdx]
        .into_iter()
        .filter(|r| !(frame.saved.contains(r) || shape.live && *r == rax))
        .collect();
    Ok(SlowPaths {
        retry,
        out,
        miss,
        full,
        wrap,
        circular: layout.buf_kind == BUF_CIRCULAR,
        straddle,
    })
}

/// Save what the stores clobber and compute the values needed from the original
/// registers (a memory site's address, USDT and chosen values).
fn emit_prologue(
    a: &mut CodeAssembler,
    shape: &Shape,
    sites: &[&PlacedSite],
    ins: &Instruction,
) -> Result<Frame, IcedError> {
    let (live, red_zone) = (shape.live, shape.red_zone);
    let mut depth = red_zone;
    if red_zone > 0 {
        a.lea(rsp, ptr(rsp - red_zone))?;
    }
    let mut ea_depth = vec![0; shape.mem.len()];
    if live {
        a.push(rax)?;
        if shape.save_flags {
            a.lahf()?;
            a.seto(al)?;
        }
        a.push(rax)?;
        depth += 16;
        for (k, m) in shape.mem.iter().enumerate() {
            let Some(m) = m else { continue };
            // %rax holds the saved flags: an address through it takes the original,
            // pushed first.
            if uses_rax(m) {
                a.mov(rax, qword_ptr(rsp + (depth - red_zone - 8)))?;
            }
            emit_ea(a, m, sites[k].ea_shift, depth)?;
            a.push(rax)?;
            depth += 8;
            ea_depth[k] = depth;
        }
    }
    // USDT arguments, computed from the original registers before any is clobbered;
    // argument i ends up at depth arg_depth[i].
    let mut arg_depth = Vec::new();
    for &arg in &shape.args {
        // Original %rax: pushed first, at depth 136.
        emit_usdt_arg(a, arg, depth, depth - 136)?;
        a.push(rax)?;
        depth += 8;
        arg_depth.push(depth);
    }
    // rdtsc writes %rax/%rdx; %rax is already saved at a live site.
    let mut saved: Vec<AsmRegister64> = vec![rcx, rsi];
    // %r11 also carries the target of an indirect tail call (`jmp *%r11`, retpolines).
    if live || sites.iter().any(|s| s.keep_r11) || ins.flow_control() == FlowControl::IndirectBranch
    {
        saved.push(r11);
    }
    if shape.tsc {
        if !live {
            saved.push(rax);
        }
        saved.push(rdx);
    }
    for &r in &saved {
        a.push(r)?;
    }
    depth += 8 * saved.len() as i32;
    Ok(Frame {
        depth,
        ea_depth,
        arg_depth,
        saved,
    })
}

/// Does `ins`'s memory operand's address use %rax?
fn uses_rax(ins: &Instruction) -> bool {
    [ins.memory_base(), ins.memory_index()]
        .iter()
        .any(|r| r.full_register() == Register::RAX)
}

/// Find the thread's slot (`miss` when the thread word or the index does not name
/// this thread) and reserve `nrec` records: %r11 = the first, %rsi = the slot. A fast
/// ring's reservation of several records that would cross the ring's end goes to the
/// returned cold path instead.
fn emit_reserve(
    a: &mut CodeAssembler,
    layout: &Layout,
    nrec: i32,
    miss: CodeLabel,
) -> Result<Option<Straddle>, IcedError> {
    a.mov(r11, qword_ptr(0u64).fs())?;
    match layout.slot_lookup {
        SlotLookup::ThreadWord(off) => {
            // Whatever the word holds stays among the slots (a thread whose TLS is
            // not libc's: a miss, never a stray store).
            a.mov(esi, dword_ptr(i64::from(off) as u64).fs())?;
            a.and(esi, slot_mask(layout.nslots))?;
        }
        SlotLookup::Index(_) => {
            a.mov(rcx, r11)?;
            a.shr(rcx, 16)?;
            a.movzx(ecx, cx)?;
            lea_rip(a, Register::RSI, layout.rw_vaddr + INDEX_OFF)?;
            a.mov(esi, dword_ptr(rsi + rcx * 4))?;
        }
    }
    lea_rip(a, Register::RCX, layout.rw_vaddr + SLOTS_OFF)?;
    a.add(rsi, rcx)?;
    a.cmp(qword_ptr(rsi), r11)?;
    a.jne(miss)?;
    // Circular buffers are only read at thread exit and on a crash, never reset under
    // a writer: no `inflight` bracket.
    if layout.buf_kind == BUF_TRACE {
        a.inc(qword_ptr(rsi + SLOT_INFLIGHT as i32))?;
    }
    a.mov(r11d, (RECORD_SIZE as i32 * nrec) as u32)?;
    if layout.buf_kind == BUF_FAST_CIRCULAR {
        // Bump the low 16 bits only: the 64 KiB ring wraps by itself. The record's
        // address is the ring's (64 KiB aligned) start plus the old offset.
        a.xadd(word_ptr(rsi + SLOT_CUR as i32), r11w)?;
        a.movzx(r11d, r11w)?;
        // Records are stored at %r11 + 32j: several must not run past the ring's end
        // into the next thread's ring (one compare, only in stubs of several records).
        let straddle = (nrec > 1).then(|| Straddle {
            label: a.create_label(),
            nrec,
        });
        if let Some(s) = &straddle {
            a.cmp(
                r11d,
                (FAST_RING_BYTES as i64 - i64::from(RECORD_SIZE as i32 * nrec)) as i32,
            )?;
            a.ja(s.label)?;
        }
        a.add(r11, qword_ptr(rsi + SLOT_START as i32))?;
        return Ok(straddle);
    }
    a.xadd(qword_ptr(rsi + SLOT_CUR as i32), r11)?;
    Ok(None)
}

/// A fast-ring reservation that crossed the ring's end: its records (at the ring's
/// end and start) are marked never written (flags 0, which readers skip) and the stub
/// reserves again, from the ring's start.
fn emit_straddle(a: &mut CodeAssembler, s: Straddle, retry: CodeLabel) -> Result<(), IcedError> {
    let Straddle { mut label, nrec } = s;
    a.set_label(&mut label)?;
    for j in 0..nrec {
        a.lea(ecx, ptr(r11 + RECORD_SIZE as i32 * j))?;
        a.movzx(ecx, cx)?;
        a.add(rcx, qword_ptr(rsi + SLOT_START as i32))?;
        a.mov(dword_ptr(rcx + RECORD_FLAGS_OFF as i32), 0)?;
    }
    a.jmp(retry)
}

/// Store one site's records (`first`, `n`: its records among the reserved ones) but
/// their times. `site_args`: the depths of its values.
#[allow(clippy::too_many_arguments)]
fn emit_site_store(
    a: &mut CodeAssembler,
    shape: &Shape,
    frame: &Frame,
    (sites, k): (&[&PlacedSite], usize),
    ins: &Instruction,
    (first, n): (i32, i32),
    site_args: &[i32],
    ring_flag: u32,
) -> Result<(), IcedError> {
    let at = |j: i32, field: i32| r11 + (RECORD_SIZE as i32 * (first + j) + field);
    let site = sites[k];
    let partner = shape.pair[k];
    let flags = match partner {
        // `pairs` checked that the flags pair.
        Some(p) => pair_flags(site.flags, sites[p].flags).unwrap_or(site.flags),
        None => site.flags,
    };
    match flags | ring_flag {
        // site in the low dword, flags = 0 in the high one (sign extension of a
        // non-negative imm32).
        0 => a.mov(qword_ptr(at(0, 0)), site.id as i32)?,
        flags => {
            a.mov(dword_ptr(at(0, 0)), site.id)?;
            a.mov(dword_ptr(at(0, 4)), flags)?;
        }
    }
    // The frame address's low bits over the flags' high half (`FLAG_FRAME`).
    if let Some(rule) = site.frame {
        let off = rule.off as i32;
        match rule.reg {
            gimli::X86_64::RBP => a.lea(rcx, qword_ptr(rbp + off))?,
            _ => a.lea(rcx, qword_ptr(rsp + (frame.depth + off)))?,
        }
        a.mov(word_ptr(at(0, 6)), cx)?;
    }
    for j in 1..n {
        a.mov(dword_ptr(at(j, 0)), site.id)?;
        a.mov(
            dword_ptr(at(j, 4)),
            FLAG_USDT_MORE | (j as u32 - 1) << FLAG_USDT_INDEX_SHIFT | ring_flag,
        )?;
    }
    emit_site_value(a, shape, frame, site, ins, at, n, site_args)?;
    match site.kind {
        SiteKind::FunctionEntry | SiteKind::FunctionExit => {
            a.mov(rcx, qword_ptr(rsp + frame.depth))?;
            a.mov(qword_ptr(at(0, 24)), rcx)?;
        }
        SiteKind::Block | SiteKind::Landing | SiteKind::Resume => a.mov(qword_ptr(at(0, 24)), 0)?,
        SiteKind::Memory => {
            // value: the address; aux: the partner's address, or the instruction's.
            let ea = |k: usize| qword_ptr(rsp + (frame.depth - frame.ea_depth[k]));
            a.mov(rcx, ea(k))?;
            a.mov(qword_ptr(at(0, 16)), rcx)?;
            match partner {
                Some(p) => a.mov(rcx, ea(p))?,
                None => lea_rip(a, Register::RCX, site.insn)?,
            }
            a.mov(qword_ptr(at(0, 24)), rcx)?;
        }
        SiteKind::Usdt | SiteKind::Call => {}
    }
    Ok(())
}

/// The `value` field of a site's records (a call: also its `aux`).
#[allow(clippy::too_many_arguments)]
fn emit_site_value(
    a: &mut CodeAssembler,
    shape: &Shape,
    frame: &Frame,
    site: &PlacedSite,
    ins: &Instruction,
    at: impl Fn(i32, i32) -> AsmMemoryOperand,
    n: i32,
    site_args: &[i32],
) -> Result<(), IcedError> {
    let depth = frame.depth;
    match site.kind {
        // A chosen value (`--value`): computed up front.
        SiteKind::FunctionEntry | SiteKind::FunctionExit | SiteKind::Block
            if !site_args.is_empty() =>
        {
            a.mov(rcx, qword_ptr(rsp + (depth - site_args[0])))?;
            a.mov(qword_ptr(at(0, 16)), rcx)?;
        }
        SiteKind::FunctionEntry => a.mov(qword_ptr(at(0, 16)), rdi)?,
        // In a live-site frame %rax holds the saved flags: the original is the
        // first register pushed (depth 136).
        SiteKind::FunctionExit if shape.live => {
            a.mov(rcx, qword_ptr(rsp + (depth - 136)))?;
            a.mov(qword_ptr(at(0, 16)), rcx)?;
        }
        SiteKind::FunctionExit => a.mov(qword_ptr(at(0, 16)), rax)?,
        SiteKind::Block | SiteKind::Landing | SiteKind::Resume => {
            lea_rip(a, Register::RCX, ins.ip())?;
            a.mov(qword_ptr(at(0, 16)), rcx)?;
        }
        // Its address and its partner's: `emit_site_store`.
        SiteKind::Memory => {}
        SiteKind::Call => {
            match site_args.first() {
                Some(&d) => a.mov(rcx, qword_ptr(rsp + (depth - d)))?,
                None => lea_rip(a, Register::RCX, ins.near_branch_target())?,
            }
            a.mov(qword_ptr(at(0, 16)), rcx)?;
            lea_rip(a, Register::RCX, ins.next_ip())?;
            a.mov(qword_ptr(at(0, 24)), rcx)?;
        }
        SiteKind::Usdt => {
            // value and aux of record j: arguments 2j and 2j + 1.
            for k in 0..2 * n {
                let field = at(k / 2, 16 + 8 * (k % 2));
                match site_args.get(k as usize) {
                    Some(&d) => {
                        a.mov(rcx, qword_ptr(rsp + (depth - d)))?;
                        a.mov(qword_ptr(field), rcx)?;
                    }
                    None => a.mov(qword_ptr(field), 0)?,
                }
            }
        }
    }
    Ok(())
}

/// Every record's `time`, the end of the `inflight` bracket, and the full check.
fn emit_times_and_check(
    a: &mut CodeAssembler,
    layout: &Layout,
    shape: &Shape,
    full: CodeLabel,
) -> Result<(), IcedError> {
    let nrec = shape.nrec;
    if !shape.tsc {
        // No clock: `time` is the buffer epoch (Slot::generation, bumped at every
        // reset), so a drain can tell a refilled buffer from the one it read.
        a.mov(ecx, dword_ptr(rsi + SLOT_GENERATION as i32))?;
        for j in 0..nrec {
            a.mov(qword_ptr(r11 + RECORD_SIZE as i32 * j + 8), rcx)?;
        }
    }
    if shape.tsc {
        a.rdtsc()?;
        for j in 0..nrec {
            a.mov(dword_ptr(r11 + RECORD_SIZE as i32 * j + 8), eax)?;
            a.mov(dword_ptr(r11 + RECORD_SIZE as i32 * j + 12), edx)?;
        }
    }
    if layout.buf_kind == BUF_TRACE {
        a.dec(qword_ptr(rsi + SLOT_INFLIGHT as i32))?;
    }
    if layout.buf_kind != BUF_FAST_CIRCULAR {
        a.add(r11, RECORD_SIZE as i32 * nrec)?;
        a.cmp(r11, qword_ptr(rsi + SLOT_END as i32))?;
        a.jae(full)?;
    }
    Ok(())
}

/// Restore what the prologue saved.
fn emit_epilogue(a: &mut CodeAssembler, shape: &Shape, frame: &Frame) -> Result<(), IcedError> {
    for &r in frame.saved.iter().rev() {
        a.pop(r)?;
    }
    let scratch = 8 * (shape.mem.iter().flatten().count() + shape.args.len()) as i32;
    if scratch > 0 {
        a.lea(rsp, ptr(rsp + scratch))?;
    }
    if shape.live {
        a.pop(rax)?;
        if shape.save_flags {
            a.add(al, 0x7f)?; // OF again from seto's 0/1
            a.sahf()?;
        }
        a.pop(rax)?;
    }
    if shape.red_zone > 0 {
        a.lea(rsp, ptr(rsp + shape.red_zone))?;
    }
    Ok(())
}

fn emit_slow_paths(a: &mut CodeAssembler, rt: &Runtime, p: SlowPaths) -> Result<(), IcedError> {
    let SlowPaths {
        retry,
        out,
        mut miss,
        mut full,
        wrap,
        circular,
        straddle,
    } = p;
    let call_saving = |a: &mut CodeAssembler, target: u64| -> Result<(), IcedError> {
        for &r in &wrap {
            a.push(r)?;
        }
        a.call(target)?;
        for &r in wrap.iter().rev() {
            a.pop(r)?;
        }
        Ok(())
    };
    if let Some(s) = straddle {
        emit_straddle(a, s, retry)?;
    }
    a.set_label(&mut miss)?;
    call_saving(a, rt.register)?;
    a.test(rcx, rcx)?;
    a.jz(out)?;
    a.jmp(retry)?;

    a.set_label(&mut full)?;
    if circular {
        // Wrap: the next record overwrites the oldest; a new buffer epoch.
        a.mov(rcx, qword_ptr(rsi + SLOT_START as i32))?;
        a.mov(qword_ptr(rsi + SLOT_CUR as i32), rcx)?;
        a.inc(dword_ptr(rsi + SLOT_GENERATION as i32))?;
    } else {
        call_saving(a, rt.flush)?;
    }
    a.jmp(out)
}

/// The trampoline of a window: for each instruction, the stubs of the sites placed
/// before it, then the instruction re-encoded for its new address (iced's block
/// encoder fixes RIP-relative operands and branches); a branch back at the end unless
/// the last instruction leaves anyway. A direct `call` can only be last (the planner
/// checks): it becomes `push <original return address>; jmp callee`, so the callee
/// returns behind the window and unwinders see the real caller.
/// A jump a window may hold together with its target: `jmp` or `jcc` with a
/// relative target (not `loop`, `jrcxz`: they have no near form).
pub(super) fn is_internal_jump(ins: &Instruction) -> bool {
    ins.op0_kind() == OpKind::NearBranch64 && jump_to_label(ins.mnemonic()).is_some()
}

/// How the assembler writes jump `m` to a label, if a window can re-point it.
type JumpToLabel = fn(&mut CodeAssembler, CodeLabel) -> Result<(), IcedError>;

fn jump_to_label(m: Mnemonic) -> Option<JumpToLabel> {
    Some(match m {
        Mnemonic::Jmp => CodeAssembler::jmp::<CodeLabel>,
        Mnemonic::Ja => CodeAssembler::ja::<CodeLabel>,
        Mnemonic::Jae => CodeAssembler::jae::<CodeLabel>,
        Mnemonic::Jb => CodeAssembler::jb::<CodeLabel>,
        Mnemonic::Jbe => CodeAssembler::jbe::<CodeLabel>,
        Mnemonic::Je => CodeAssembler::je::<CodeLabel>,
        Mnemonic::Jne => CodeAssembler::jne::<CodeLabel>,
        Mnemonic::Jg => CodeAssembler::jg::<CodeLabel>,
        Mnemonic::Jge => CodeAssembler::jge::<CodeLabel>,
        Mnemonic::Jl => CodeAssembler::jl::<CodeLabel>,
        Mnemonic::Jle => CodeAssembler::jle::<CodeLabel>,
        Mnemonic::Jo => CodeAssembler::jo::<CodeLabel>,
        Mnemonic::Jno => CodeAssembler::jno::<CodeLabel>,
        Mnemonic::Jp => CodeAssembler::jp::<CodeLabel>,
        Mnemonic::Jnp => CodeAssembler::jnp::<CodeLabel>,
        Mnemonic::Js => CodeAssembler::js::<CodeLabel>,
        Mnemonic::Jns => CodeAssembler::jns::<CodeLabel>,
        _ => return None,
    })
}

/// A label for each instruction of the window that a jump inside it goes to.
fn internal_targets(a: &mut CodeAssembler, insns: &[Instruction]) -> HashMap<u64, CodeLabel> {
    let ips: HashSet<u64> = insns.iter().map(Instruction::ip).collect();
    let mut labels = HashMap::new();
    for ins in insns.iter().filter(|i| is_internal_jump(i)) {
        let t = ins.near_branch_target();
        if ips.contains(&t) {
            labels.entry(t).or_insert_with(|| a.create_label());
        }
    }
    labels
}

/// Every label the window needs: jumps inside it, landing pads and tail calls.
fn window_labels(
    a: &mut CodeAssembler,
    insns: &[Instruction],
    w: &Window,
) -> HashMap<u64, CodeLabel> {
    let mut labels = internal_targets(a, insns);
    for t in w
        .landings
        .iter()
        .map(|l| l.target)
        .chain(w.tails.iter().map(|t| t.at))
    {
        labels.entry(t).or_insert_with(|| a.create_label());
    }
    labels
}

/// A displaced call: push the original return address without touching flags or
/// registers, then jump where the call would go (an operand relative to %rsp is 8 bytes
/// further now).
fn emit_call_as_jump(a: &mut CodeAssembler, ins: &Instruction) -> Result<(), IcedError> {
    a.lea(rsp, ptr(rsp - 8))?;
    a.push(rax)?;
    lea_rip(a, Register::RAX, ins.next_ip())?;
    a.mov(qword_ptr(rsp + 8), rax)?;
    a.pop(rax)?;
    match ins.op0_kind() {
        OpKind::NearBranch64 => a.jmp(ins.near_branch_target())?,
        OpKind::Register => {
            a.add_instruction(Instruction::with1(Code::Jmp_rm64, ins.op0_register())?)?
        }
        _ => {
            let base = ins.memory_base();
            let mut disp = ins.memory_displacement64() as i64;
            if base == Register::RSP {
                disp += 8;
            }
            let mem = MemoryOperand::new(
                base,
                ins.memory_index(),
                ins.memory_index_scale(),
                disp,
                8,
                false,
                Register::None,
            );
            a.add_instruction(Instruction::with1(Code::Jmp_rm64, mem)?)?;
        }
    }
    Ok(())
}

/// Each tail call's stub and its `ret`, after the window's code.
fn emit_tails(
    a: &mut CodeAssembler,
    layout: &Layout,
    w: &Window,
    rets: &[Instruction],
    labels: &mut HashMap<u64, CodeLabel>,
    slow: &mut Vec<SlowPaths>,
) -> Result<(), IcedError> {
    for (t, ret) in w.tails.iter().zip(rets) {
        if let Some(l) = labels.get_mut(&t.at) {
            a.set_label(l)?;
            a.zero_bytes()?;
        }
        let here: Vec<&PlacedSite> = t.sites.iter().collect();
        slow.push(emit_stub(a, layout, &here, ret, &HashMap::new())?);
        let mut ret = *ret;
        ret.set_ip(0);
        a.add_instruction(ret)?;
    }
    Ok(())
}

/// The trampoline of window `w` (its instructions `insns`, the `ret`s of its tails
/// `rets`) at `at`. `members`: the instructions of access-run members outside `insns`.
pub(super) fn emit_window(
    layout: &Layout,
    rt: &Runtime,
    insns: &[Instruction],
    w: &Window,
    (rets, members): (&[Instruction], &[Instruction]),
    at: u64,
) -> Result<Trampoline, IcedError> {
    let members: HashMap<u64, Instruction> =
        insns.iter().chain(members).map(|i| (i.ip(), *i)).collect();
    let mut a = CodeAssembler::new(64)?;
    let mut leaves = false;
    let mut slow = Vec::new();
    let mut labels = window_labels(&mut a, insns, w);
    let sites = &w.sites;
    for ins in insns {
        if let Some(l) = labels.get_mut(&ins.ip()) {
            // Before the stubs: a jump here runs them, as the original instruction
            // would. On a zero-length instruction, whose address the encoder keeps.
            a.set_label(l)?;
            a.zero_bytes()?;
        }
        let here: Vec<&PlacedSite> = sites.iter().filter(|s| s.at == ins.ip()).collect();
        if !here.is_empty() {
            slow.push(emit_stub(&mut a, layout, &here, ins, &members)?);
        }
        let internal = (ins.op0_kind() == OpKind::NearBranch64).then(|| {
            Some((
                jump_to_label(ins.mnemonic())?,
                labels.get(&ins.near_branch_target())?,
            ))
        });
        if let Some((jump, &l)) = internal.flatten() {
            jump(&mut a, l)?;
            leaves = ins.flow_control() == FlowControl::UnconditionalBranch;
            continue;
        }
        let mut ins = *ins;
        leaves = matches!(
            ins.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        );
        if matches!(
            ins.flow_control(),
            FlowControl::Call | FlowControl::IndirectCall
        ) {
            emit_call_as_jump(&mut a, &ins)?;
            leaves = true;
            continue;
        }
        // Label ids are small integers; keep original addresses out of their way.
        ins.set_ip(0);
        a.add_instruction(ins)?;
    }
    if !leaves {
        a.jmp(w.start + w.code_len as u64)?;
    }
    emit_tails(&mut a, layout, w, rets, &mut labels, &mut slow)?;
    for p in slow {
        emit_slow_paths(&mut a, rt, p)?;
    }
    let r = a.assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let landed = w
        .landings
        .iter()
        .map(|l| r.label_ip(&labels[&l.target]))
        .collect::<Result<_, _>>()?;
    Ok(Trampoline {
        code: r.inner.code_buffer,
        landed,
    })
}
