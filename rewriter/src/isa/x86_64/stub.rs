//! The inline function-entry stub.
//!
//! ```text
//!   lea   -128(%rsp),%rsp          ; below the red zone
//!   push  %rax,%rcx,%rdx,%rsi,%r11
//! retry:
//!   mov   %fs:0,%r11               ; thread pointer
//!   push  %r11 ; movzwl 2(%rsp),%ecx ; lea 8(%rsp),%rsp   ; h = (tp>>16)&0xffff, no flags
//!   lea   INDEX(%rip),%rsi ; mov (%rsi,%rcx,4),%ecx
//!   lea   SLOTS(%rip),%rsi ; lea (%rsi,%rcx),%rsi          ; slot
//!   mov   (%rsi),%rcx ; not %rcx ; lea 1(%rcx,%r11),%rcx   ; tp - key
//!   jrcxz hit
//!   call  register ; jrcxz out ; jmp retry                  ; first record of a thread
//! hit:
//!   mov   8(%rsi),%r11 ; lea 32(%r11),%rcx ; mov %rcx,8(%rsi)   ; reserve first
//!   rdtsc ; mov %eax,8(%r11) ; mov %edx,12(%r11)
//!   movl  $site,(%r11) ; movl $0,4(%r11) ; mov %rdi,16(%r11)
//!   mov   168(%rsp),%rax ; mov %rax,24(%r11)                 ; return address
//!   mov   16(%rsi),%rax ; not %rcx ; lea 1(%rcx,%rax),%rcx ; jrcxz full   ; end - cur
//! out:
//!   pop   ... ; lea 128(%rsp),%rsp
//!   <displaced instructions> ; jmp back
//! full:
//!   call  flush ; jmp out
//! ```

use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Code, Instruction, MemoryOperand, Register};

use super::super::{Layout, Runtime};
use tracer_common::{INDEX_OFF, SLOT_CUR, SLOT_END, SLOTS_OFF};

/// Bytes between the stub's `%rsp` after its pushes and the original `%rsp`.
const FRAME: i32 = 128 + 5 * 8;

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
    let mut hit = a.create_label();
    let mut out = a.create_label();
    let mut full = a.create_label();

    a.lea(rsp, ptr(rsp - 128))?;
    for r in [rax, rcx, rdx, rsi, r11] {
        a.push(r)?;
    }
    a.set_label(&mut retry)?;
    a.mov(r11, qword_ptr(0u64).fs())?;
    a.push(r11)?;
    a.movzx(ecx, word_ptr(rsp + 2))?;
    a.lea(rsp, ptr(rsp + 8))?;
    lea_rip(&mut a, Register::RSI, layout.rw_vaddr + INDEX_OFF)?;
    a.mov(ecx, dword_ptr(rsi + rcx * 4))?;
    lea_rip(&mut a, Register::RSI, layout.rw_vaddr + SLOTS_OFF)?;
    a.lea(rsi, ptr(rsi + rcx))?;
    a.mov(rcx, qword_ptr(rsi))?;
    a.not(rcx)?;
    a.lea(rcx, ptr(rcx + r11 + 1))?;
    a.jrcxz(hit)?;
    a.call(rt.register)?;
    a.jrcxz(out)?;
    a.jmp(retry)?;

    a.set_label(&mut hit)?;
    a.mov(r11, qword_ptr(rsi + SLOT_CUR as i32))?;
    a.lea(rcx, ptr(r11 + 32))?;
    a.mov(qword_ptr(rsi + SLOT_CUR as i32), rcx)?;
    a.rdtsc()?;
    a.mov(dword_ptr(r11 + 8), eax)?;
    a.mov(dword_ptr(r11 + 12), edx)?;
    a.mov(dword_ptr(r11), site_id)?;
    a.mov(dword_ptr(r11 + 4), 0u32)?;
    a.mov(qword_ptr(r11 + 16), rdi)?;
    a.mov(rax, qword_ptr(rsp + FRAME))?;
    a.mov(qword_ptr(r11 + 24), rax)?;
    a.mov(rax, qword_ptr(rsi + SLOT_END as i32))?;
    a.not(rcx)?;
    a.lea(rcx, ptr(rcx + rax + 1))?;
    a.jrcxz(full)?;

    a.set_label(&mut out)?;
    for r in [r11, rsi, rdx, rcx, rax] {
        a.pop(r)?;
    }
    a.lea(rsp, ptr(rsp + 128))?;
    for ins in displaced {
        let mut ins = *ins;
        // Label ids are small integers; keep original addresses out of their way.
        ins.set_ip(0);
        a.add_instruction(ins)?;
    }
    a.jmp(back)?;

    a.set_label(&mut full)?;
    a.call(rt.flush)?;
    a.jmp(out)?;

    Ok(a.assemble_options(at, BlockEncoderOptions::NONE)?
        .inner
        .code_buffer)
}
