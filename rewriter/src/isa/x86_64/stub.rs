//! The inline function-entry stub.
//!
//! ```text
//!   lea   -128(%rsp),%rsp          ; below the red zone
//!   push  %rax ; lahf ; seto %al ; push %rax        ; save RFLAGS (cheaper than pushf/popf)
//!   push  %rcx,%rdx,%rsi,%r11
//! retry:
//!   mov   %fs:0,%r11               ; thread pointer
//!   mov   %r11,%rcx ; shr $16,%rcx ; movzwl %cx,%ecx    ; h
//!   lea   INDEX(%rip),%rsi ; mov (%rsi,%rcx,4),%ecx
//!   lea   SLOTS(%rip),%rsi ; add %rcx,%rsi               ; slot
//!   cmp   (%rsi),%r11 ; jne miss
//!   incq  56(%rsi)                                       ; inflight
//!   mov   $32,%r11d ; xadd %r11,8(%rsi)                  ; reserve: one instruction,
//!                                                        ; so a signal cannot split it
//!   rdtsc ; mov %eax,8(%r11) ; mov %edx,12(%r11)
//!   movl  $site,(%r11) ; movl $0,4(%r11) ; mov %rdi,16(%r11)
//!   mov   176(%rsp),%rax ; mov %rax,24(%r11)             ; return address
//!   decq  56(%rsi)
//!   add   $32,%r11 ; cmp 16(%rsi),%r11 ; jae full
//! out:
//!   pop   %r11,%rsi,%rdx,%rcx ; pop %rax ; add $0x7f,%al ; sahf ; pop %rax
//!   lea   128(%rsp),%rsp
//!   <displaced instructions> ; jmp back
//! miss:
//!   call  register ; test %rcx,%rcx ; jz out ; jmp retry   ; first record of a thread
//! full:
//!   call  flush ; jmp out
//! ```

use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Code, Instruction, MemoryOperand, Register};

use super::super::{Layout, Runtime};
use tracer_common::{INDEX_OFF, RECORD_SIZE, SLOT_CUR, SLOT_END, SLOT_INFLIGHT, SLOTS_OFF};

/// Bytes between the stub's `%rsp` after its pushes and the original `%rsp`.
const FRAME: i32 = 128 + 6 * 8;

pub(super) fn lea_rip(a: &mut CodeAssembler, reg: Register, addr: u64) -> Result<(), IcedError> {
    a.add_instruction(Instruction::with2(
        Code::Lea_r64_m,
        reg,
        MemoryOperand::with_base_displ(Register::RIP, addr as i64),
    )?)
}

pub(super) fn emit_entry(
    layout: &Layout,
    rt: &Runtime,
    site_id: u32,
    displaced: &[Instruction],
    back: u64,
    at: u64,
) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut retry = a.create_label();
    let mut miss = a.create_label();
    let mut out = a.create_label();
    let mut full = a.create_label();

    a.lea(rsp, ptr(rsp - 128))?;
    a.push(rax)?;
    a.lahf()?;
    a.seto(al)?;
    a.push(rax)?;
    for r in [rcx, rdx, rsi, r11] {
        a.push(r)?;
    }
    a.set_label(&mut retry)?;
    a.mov(r11, qword_ptr(0u64).fs())?;
    a.mov(rcx, r11)?;
    a.shr(rcx, 16)?;
    a.movzx(ecx, cx)?;
    lea_rip(&mut a, Register::RSI, layout.rw_vaddr + INDEX_OFF)?;
    a.mov(ecx, dword_ptr(rsi + rcx * 4))?;
    lea_rip(&mut a, Register::RSI, layout.rw_vaddr + SLOTS_OFF)?;
    a.add(rsi, rcx)?;
    a.cmp(qword_ptr(rsi), r11)?;
    a.jne(miss)?;

    a.inc(qword_ptr(rsi + SLOT_INFLIGHT as i32))?;
    a.mov(r11d, RECORD_SIZE as u32)?;
    a.xadd(qword_ptr(rsi + SLOT_CUR as i32), r11)?;
    a.rdtsc()?;
    a.mov(dword_ptr(r11 + 8), eax)?;
    a.mov(dword_ptr(r11 + 12), edx)?;
    a.mov(dword_ptr(r11), site_id)?;
    a.mov(dword_ptr(r11 + 4), 0u32)?;
    a.mov(qword_ptr(r11 + 16), rdi)?;
    a.mov(rax, qword_ptr(rsp + FRAME))?;
    a.mov(qword_ptr(r11 + 24), rax)?;
    a.dec(qword_ptr(rsi + SLOT_INFLIGHT as i32))?;
    a.add(r11, RECORD_SIZE as i32)?;
    a.cmp(r11, qword_ptr(rsi + SLOT_END as i32))?;
    a.jae(full)?;

    a.set_label(&mut out)?;
    for r in [r11, rsi, rdx, rcx] {
        a.pop(r)?;
    }
    a.pop(rax)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    a.pop(rax)?;
    a.lea(rsp, ptr(rsp + 128))?;
    for ins in displaced {
        let mut ins = *ins;
        // Label ids are small integers; keep original addresses out of their way.
        ins.set_ip(0);
        a.add_instruction(ins)?;
    }
    a.jmp(back)?;

    a.set_label(&mut miss)?;
    a.call(rt.register)?;
    a.test(rcx, rcx)?;
    a.jz(out)?;
    a.jmp(retry)?;

    a.set_label(&mut full)?;
    a.call(rt.flush)?;
    a.jmp(out)?;

    Ok(a.assemble_options(at, BlockEncoderOptions::NONE)?
        .inner
        .code_buffer)
}
