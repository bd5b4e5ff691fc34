//! Flow recovery on hand-assembled functions (iced's assembler, checked against
//! objdump): jump tables found and read, tail calls told from computed gotos,
//! spill slots (`spill.rs`) followed through the control-flow graph.

use iced_x86::code_asm::*;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

use super::super::X86_64;
use super::{DATA, GOT, Image, RODATA, TEXT, asm, asm_labels};
use crate::flow::{Flow, JumpTable, recover};

fn flow(img: &Image) -> Flow {
    recover(&img.input(), &X86_64).unwrap()
}

/// `code` `reg, [rip + addr]` (iced makes the displacement relative).
fn rip_op(a: &mut CodeAssembler, code: Code, reg: Register, addr: u64) -> Result<(), IcedError> {
    let m = MemoryOperand::with_base_displ(Register::RIP, addr as i64);
    a.add_instruction(Instruction::with2(code, reg, m)?)
}

/// `jmp *[rip + addr]`.
fn jmp_rip(a: &mut CodeAssembler, addr: u64) -> Result<(), IcedError> {
    let m = MemoryOperand::with_base_displ(Register::RIP, addr as i64);
    a.add_instruction(Instruction::with1(Code::Jmp_rm64, m)?)
}

/// Four cases returning 1..=4 and a default returning 0; labels: the cases, the
/// default, and last the dispatching jump.
fn cases(a: &mut CodeAssembler, mut dflt: CodeLabel) -> Result<Vec<CodeLabel>, IcedError> {
    let mut out = Vec::new();
    for k in 1..=4u32 {
        let mut l = a.create_label();
        a.set_label(&mut l)?;
        a.mov(eax, k)?;
        a.ret()?;
        out.push(l);
    }
    a.set_label(&mut dflt)?;
    a.xor(eax, eax)?;
    a.ret()?;
    out.push(dflt);
    Ok(out)
}

#[test]
fn pic_switch_table_bounded_by_cmp_ja() {
    let (code, l) = asm_labels(TEXT, |a| {
        let dflt = a.create_label();
        let mut jmp = a.create_label();
        a.cmp(edi, 3)?;
        a.ja(dflt)?;
        rip_op(a, Code::Lea_r64_m, Register::RDX, RODATA)?;
        a.movsxd(rax, dword_ptr(rdx + rdi * 4))?;
        a.add(rax, rdx)?;
        a.set_label(&mut jmp)?;
        a.jmp(rax)?;
        let mut l = cases(a, dflt)?;
        l.push(jmp);
        Ok(l)
    });
    let text = super::objdump(&code[..0x15], TEXT);
    if let Some(text) = text {
        assert_eq!(
            text,
            [
                "cmp $0x3,%edi",
                "ja 0x40102d",
                "lea 0xff4(%rip),%rdx # 0x402000",
                "movslq (%rdx,%rdi,4),%rax",
                "add %rdx,%rax",
                "jmp *%rax",
            ]
        );
    }
    let mut img = Image::function(&code);
    // The table: each case's offset from the table.
    let table: Vec<u8> = l[..4]
        .iter()
        .flat_map(|&t| (t.wrapping_sub(RODATA) as i32).to_le_bytes())
        .collect();
    img.put(RODATA, &table);
    let fl = flow(&img);
    assert_eq!(
        fl.tables,
        vec![JumpTable {
            table: RODATA,
            entry_size: 4,
            dispatch: l[5],
            targets: l[..4].to_vec(),
            bounded: true,
        }]
    );
    assert_eq!(fl.jump_table_targets, l[..4].to_vec());
    assert!(fl.unresolved_indirect_jumps.is_empty() && fl.tail_calls.is_empty());
}

#[test]
fn absolute_table_of_non_pic_code() {
    let (code, l) = asm_labels(TEXT, |a| {
        let dflt = a.create_label();
        let mut jmp = a.create_label();
        a.cmp(rdi, 3)?;
        a.ja(dflt)?;
        a.set_label(&mut jmp)?;
        let m = MemoryOperand::new(
            Register::None,
            Register::RDI,
            8,
            RODATA as i64,
            4,
            false,
            Register::None,
        );
        a.add_instruction(Instruction::with1(Code::Jmp_rm64, m)?)?;
        let mut l = cases(a, dflt)?;
        l.push(jmp);
        Ok(l)
    });
    if let Some(text) = super::objdump(&code[..13], TEXT) {
        assert_eq!(text[2], "jmp *0x402000(,%rdi,8)");
    }
    let mut img = Image::function(&code);
    let table: Vec<u8> = l[..4].iter().flat_map(|t| t.to_le_bytes()).collect();
    img.put(RODATA, &table);
    let fl = flow(&img);
    assert_eq!(fl.tables.len(), 1);
    let t = &fl.tables[0];
    assert_eq!(
        (t.table, t.entry_size, t.dispatch, t.bounded),
        (RODATA, 8, l[5], true)
    );
    assert_eq!(t.targets, l[..4].to_vec());
}

#[test]
fn a_table_whose_first_entry_misses_every_instruction_is_rejected() {
    let (code, l) = asm_labels(TEXT, |a| {
        let dflt = a.create_label();
        let mut jmp = a.create_label();
        a.cmp(edi, 3)?;
        a.ja(dflt)?;
        rip_op(a, Code::Lea_r64_m, Register::RDX, RODATA)?;
        a.movsxd(rax, dword_ptr(rdx + rdi * 4))?;
        a.add(rax, rdx)?;
        a.set_label(&mut jmp)?;
        a.jmp(rax)?;
        let mut l = cases(a, dflt)?;
        l.push(jmp);
        Ok(l)
    });
    let mut img = Image::function(&code);
    // Entry 0 points into the middle of `mov $1,%eax`.
    let table: Vec<u8> = l[..4]
        .iter()
        .enumerate()
        .flat_map(|(k, &t)| ((t + u64::from(k == 0)).wrapping_sub(RODATA) as i32).to_le_bytes())
        .collect();
    img.put(RODATA, &table);
    let fl = flow(&img);
    assert!(fl.tables.is_empty());
    assert_eq!(fl.unresolved_indirect_jumps, vec![l[5]]);
    assert!(
        fl.warnings
            .iter()
            .any(|w| w.contains("entry 0 is not an instruction start")),
        "{:?}",
        fl.warnings
    );
}

/// The flow of a function whose code is `f`'s, with its indirect jump last.
fn classify(f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> (Flow, u64) {
    let code = asm(TEXT, f);
    let lines = super::objdump_at(&code, TEXT);
    let img = Image::function(&code);
    let fl = flow(&img);
    // The last instruction is the jump.
    let at = lines.and_then(|l| l.last().map(|l| l.0));
    (fl, at.unwrap_or(0))
}

#[test]
fn tail_call_through_an_argument_register() {
    let (fl, at) = classify(|a| a.jmp(rdi));
    assert_eq!(fl.tail_calls, vec![TEXT]);
    assert!(fl.unresolved_indirect_jumps.is_empty());
    assert_eq!(at, TEXT);
}

#[test]
fn tail_call_through_a_loaded_function_pointer() {
    // mov 0x10(%rdi),%rax; jmp *%rax: a field of an argument.
    let (fl, at) = classify(|a| {
        a.mov(rax, qword_ptr(rdi + 0x10))?;
        a.jmp(rax)
    });
    assert_eq!(fl.tail_calls, vec![at]);
    assert!(fl.unresolved_indirect_jumps.is_empty());
}

#[test]
fn tail_call_through_a_got_slot() {
    let (fl, at) = classify(|a| jmp_rip(a, GOT + 8));
    assert_eq!(fl.tail_calls, vec![at]);
}

#[test]
fn a_data_slot_holding_a_label_is_a_computed_goto() {
    let code = asm(TEXT, |a| {
        a.test(edi, edi)?;
        a.nop()?;
        jmp_rip(a, DATA)
    });
    let mut img = Image::function(&code);
    // The slot holds the address of the function's `nop`: a label.
    img.put(DATA, &(TEXT + 2).to_le_bytes());
    let fl = flow(&img);
    let jmp = TEXT + 3;
    assert_eq!(fl.unresolved_indirect_jumps, vec![jmp]);
    assert!(fl.tail_calls.is_empty());
    // The same slot holding another function's address: a tail call.
    img.functions.push((TEXT + 0x800, 1, "g"));
    img.put(DATA, &(TEXT + 0x800).to_le_bytes());
    let fl = flow(&img);
    assert_eq!(fl.tail_calls, vec![jmp]);
}

#[test]
fn a_jump_with_the_frame_still_pushed_is_no_tail_call() {
    let (fl, at) = classify(|a| {
        a.push(rbx)?;
        a.jmp(rdi)
    });
    assert_eq!(fl.unresolved_indirect_jumps, vec![at]);
    assert!(fl.tail_calls.is_empty());
    // Popped again: back at the entry height.
    let (fl, at) = classify(|a| {
        a.push(rbx)?;
        a.pop(rbx)?;
        a.jmp(rdi)
    });
    assert_eq!(fl.tail_calls, vec![at]);
}

#[test]
fn a_jump_to_an_address_of_the_function_itself_is_unresolved() {
    // lea L(%rip),%rax; jmp *%rax; L: ret — a computed goto.
    let (fl, _) = classify(|a| {
        let mut l = a.create_label();
        a.lea(rax, ptr(l))?;
        a.jmp(rax)?;
        a.set_label(&mut l)?;
        a.ret()
    });
    assert_eq!(fl.unresolved_indirect_jumps, vec![TEXT + 7]);
    assert!(fl.tail_calls.is_empty() && fl.tables.is_empty());
}

/// `sub $0x18,%rsp; [test %esi,%esi; je B]; mov %rdi,8(%rsp); [jmp J; B: mov
/// %rdx,%rax; add $1,%rax; mov %rax,8(%rsp)]; J: call g; [leak]; mov 8(%rsp),%rax;
/// add $0x18,%rsp; jmp *%rax`.
fn spilled(two_ways: bool, leak: bool) -> (Flow, u64) {
    classify(|a| {
        let mut b = a.create_label();
        let mut j = a.create_label();
        a.sub(rsp, 0x18)?;
        if two_ways {
            a.test(esi, esi)?;
            a.je(b)?;
        }
        a.mov(qword_ptr(rsp + 8), rdi)?;
        if two_ways {
            a.jmp(j)?;
            a.set_label(&mut b)?;
            a.mov(rax, rdx)?;
            a.add(rax, 1)?;
            a.mov(qword_ptr(rsp + 8), rax)?;
        }
        a.set_label(&mut j)?;
        a.call(TEXT + 0x800)?;
        if leak {
            // The frame's address goes to a callee: anything may write the slot.
            a.lea(rdi, ptr(rsp + 8))?;
            a.call(TEXT + 0x800)?;
        }
        a.mov(rax, qword_ptr(rsp + 8))?;
        a.add(rsp, 0x18)?;
        a.jmp(rax)
    })
}

#[test]
fn tail_call_through_a_spilled_argument() {
    let (fl, at) = spilled(false, false);
    assert_eq!(fl.tail_calls, vec![at]);
    assert!(fl.unresolved_indirect_jumps.is_empty());
}

#[test]
fn a_spill_slot_of_a_frame_whose_address_leaks_is_not_trusted() {
    let (fl, at) = spilled(false, true);
    assert_eq!(fl.unresolved_indirect_jumps, vec![at]);
    assert!(fl.tail_calls.is_empty());
}

#[test]
fn a_slot_stored_differently_on_two_ways_is_not_trusted() {
    let (fl, at) = spilled(true, false);
    assert_eq!(fl.unresolved_indirect_jumps, vec![at]);
    assert!(fl.tail_calls.is_empty());
}

/// gcc 12 `-O0` for `switch (x) { case 0..=4: return …; default: return 0; }`, its
/// two `lea T(%rip)` pointed at RODATA: the switch value spilled to the frame and
/// compared there, `lea 0(,%rax,4)`, `mov (%rdx,%rax,1),%eax`, `cltq`.
#[test]
fn gcc_o0_switch_through_a_frame_slot() {
    let mut code = vec![
        0x55, 0x48, 0x89, 0xe5, 0x89, 0x7d, 0xfc, 0x83, 0x7d, 0xfc, 0x04, 0x77, 0x46, 0x8b, 0x45,
        0xfc, 0x48, 0x8d, 0x14, 0x85, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8d, 0x05, 0x00, 0x00, 0x00,
        0x00, 0x8b, 0x04, 0x02, 0x48, 0x98, 0x48, 0x8d, 0x15, 0x00, 0x00, 0x00, 0x00, 0x48, 0x01,
        0xd0, 0xff, 0xe0, 0xb8, 0x0b, 0x00, 0x00, 0x00, 0xeb, 0x21, 0xb8, 0x16, 0x00, 0x00, 0x00,
        0xeb, 0x1a, 0xb8, 0x21, 0x00, 0x00, 0x00, 0xeb, 0x13, 0xb8, 0x2c, 0x00, 0x00, 0x00, 0xeb,
        0x0c, 0xb8, 0x37, 0x00, 0x00, 0x00, 0xeb, 0x05, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x5d, 0xc3,
    ];
    for (field, end) in [(0x1b, 0x1f), (0x27, 0x2b)] {
        let rel = (RODATA - (TEXT + end)) as u32;
        code[field..field + 4].copy_from_slice(&rel.to_le_bytes());
    }
    if let Some(text) = super::objdump(&code[..0x30], TEXT) {
        assert_eq!(
            text[3..],
            [
                "cmpl $0x4,-0x4(%rbp)",
                "ja 0x401053",
                "mov -0x4(%rbp),%eax",
                "lea 0x0(,%rax,4),%rdx",
                "lea 0xfe1(%rip),%rax # 0x402000",
                "mov (%rdx,%rax,1),%eax",
                "cltq",
                "lea 0xfd5(%rip),%rdx # 0x402000",
                "add %rdx,%rax",
                "jmp *%rax",
            ]
        );
    }
    let cases: Vec<u64> = (0..5).map(|k| TEXT + 0x30 + 7 * k).collect();
    let mut img = Image::function(&code);
    let table: Vec<u8> = cases
        .iter()
        .flat_map(|&t| (t.wrapping_sub(RODATA) as i32).to_le_bytes())
        .collect();
    img.put(RODATA, &table);
    let fl = flow(&img);
    assert_eq!(
        fl.tables,
        vec![JumpTable {
            table: RODATA,
            entry_size: 4,
            dispatch: TEXT + 0x2e,
            targets: cases,
            bounded: true,
        }]
    );
    assert!(fl.unresolved_indirect_jumps.is_empty());
}

#[test]
fn a_byte_index_bounds_a_table_of_labels_at_256() {
    // movzbl (%rdi),%eax; jmp *T(,%rax,8); four labels, T's 256 entries cycling them.
    let (code, l) = asm_labels(TEXT, |a| {
        let mut jmp = a.create_label();
        a.movzx(eax, byte_ptr(rdi))?;
        a.set_label(&mut jmp)?;
        let m = MemoryOperand::new(
            Register::None,
            Register::RAX,
            8,
            RODATA as i64,
            4,
            false,
            Register::None,
        );
        a.add_instruction(Instruction::with1(Code::Jmp_rm64, m)?)?;
        let mut out = Vec::new();
        for k in 0..4u32 {
            let mut t = a.create_label();
            a.set_label(&mut t)?;
            a.mov(eax, k)?;
            a.ret()?;
            out.push(t);
        }
        out.push(jmp);
        Ok(out)
    });
    let mut img = Image::function(&code);
    let table: Vec<u8> = (0..256).flat_map(|k| l[k % 4].to_le_bytes()).collect();
    img.put(RODATA, &table);
    // What follows the table is no label: a bound, not the entries, stops the read.
    img.put(RODATA + 256 * 8, &l[0].to_le_bytes());
    let fl = flow(&img);
    assert_eq!(fl.tables.len(), 1);
    let t = &fl.tables[0];
    assert_eq!((t.dispatch, t.bounded, t.entry_size), (l[4], true, 8));
    assert_eq!(t.targets, l[..4].to_vec());
}

#[test]
fn no_tail_call_in_a_function_that_takes_its_own_addresses() {
    // lea L(%rip),%rax; mov %rax,(%rsi); jmp *%rdi; L: ret — a label escapes, so a
    // jump through an argument may be a computed goto back in.
    let (fl, _) = classify(|a| {
        let mut l = a.create_label();
        a.lea(rax, ptr(l))?;
        a.mov(qword_ptr(rsi), rax)?;
        a.jmp(rdi)?;
        a.set_label(&mut l)?;
        a.ret()
    });
    let jmp = TEXT + 10;
    assert_eq!(fl.unresolved_indirect_jumps, vec![jmp]);
    assert!(fl.tail_calls.is_empty());
}
