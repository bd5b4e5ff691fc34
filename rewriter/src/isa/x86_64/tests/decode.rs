//! What the backend reads off single instructions: the facts site selection uses,
//! memory operands (the uprobe descriptors and record flags), call targets, PLT slots
//! and direct branches. Every input is written by hand and checked once against objdump.

use iced_x86::{Decoder, DecoderOptions, Register};

use super::super::{X86_64, call_target};
use super::{GOT, Image, TEXT, func, objdump_or_skip};
use crate::isa::Isa;
use crate::isa::arg::{Arg, ArgLoc, Reg};
use tracer_common::meta::SiteKind;
use tracer_common::operand::{OP_ADDR, OPF_TP, REG_NONE, X86_REG_PC};
use tracer_common::{FLAG_MEM_READ, FLAG_MEM_SIZE_SHIFT, FLAG_MEM_WRITE};

/// Concatenate `cases`' bytes at `TEXT` and check each disassembles as its text.
fn layout<T>(cases: &[(&[u8], &str, T)]) -> Option<(Vec<u8>, Vec<u64>)> {
    let mut code = Vec::new();
    let mut at = Vec::new();
    for c in cases {
        at.push(TEXT + code.len() as u64);
        code.extend_from_slice(c.0);
    }
    let got = super::objdump(&code, TEXT)?;
    let want: Vec<&str> = cases.iter().map(|c| c.1).collect();
    assert_eq!(got, want);
    Some((code, at))
}

const R: u32 = FLAG_MEM_READ;
const W: u32 = FLAG_MEM_WRITE;
const RW: u32 = FLAG_MEM_READ | FLAG_MEM_WRITE;

/// `(access, size, base, index, shift, disp, descriptor flags)` of a memory site.
type Mem = Option<(u32, u32, u8, u8, u8, i64, u8)>;

#[test]
fn memory_operands_and_their_record_flags() {
    let n = REG_NONE;
    // The rip-relative load sits at TEXT + 0x11 (after the cases before it), its
    // operand at TEXT + 0x11 + 7 + 0x100: the descriptor holds the distance from the
    // instruction (the load bias is added at run time through the pc).
    let cases: &[(&[u8], &str, Mem)] = &[
        (
            &[0x8b, 0x07],
            "mov (%rdi),%eax",
            Some((R, 4, 7, n, 0, 0, 0)),
        ),
        (
            &[0x89, 0x47, 0x10],
            "mov %eax,0x10(%rdi)",
            Some((W, 4, 7, n, 0, 16, 0)),
        ),
        (
            &[0x48, 0x8b, 0x04, 0xc8],
            "mov (%rax,%rcx,8),%rax",
            Some((R, 8, 0, 1, 3, 0, 0)),
        ),
        (
            &[0xf0, 0x83, 0x07, 0x01],
            "lock addl $0x1,(%rdi)",
            Some((RW, 4, 7, n, 0, 0, 0)),
        ),
        (
            &[0x0f, 0xb6, 0x04, 0x0f],
            "movzbl (%rdi,%rcx,1),%eax",
            Some((R, 1, 7, 1, 0, 0, 0)),
        ),
        (
            &[0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00],
            "mov 0x100(%rip),%rax # 0x401118",
            Some((R, 8, X86_REG_PC, n, 0, 0x107, 0)),
        ),
        (
            &[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0],
            "mov %fs:0x28,%rax",
            Some((R, 8, n, n, 0, 0x28, OPF_TP)),
        ),
        (
            &[0x65, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0],
            "mov %gs:0x28,%rax",
            None,
        ),
        (&[0x48, 0x8d, 0x47, 0x08], "lea 0x8(%rdi),%rax", None),
        (&[0xa4], "movsb %ds:(%rsi),%es:(%rdi)", None),
        (&[0xff, 0x37], "push (%rdi)", Some((R, 8, 7, n, 0, 0, 0))),
        (&[0x8f, 0x07], "pop (%rdi)", Some((W, 8, 7, n, 0, 0, 0))),
        (
            &[0x48, 0x87, 0x07],
            "xchg %rax,(%rdi)",
            Some((RW, 8, 7, n, 0, 0, 0)),
        ),
        (
            &[0xf0, 0x48, 0x0f, 0xb1, 0x0e],
            "lock cmpxchg %rcx,(%rsi)",
            Some((RW, 8, 6, n, 0, 0, 0)),
        ),
        (
            &[0x0f, 0x29, 0x04, 0x24],
            "movaps %xmm0,(%rsp)",
            Some((W, 16, 4, n, 0, 0, 0)),
        ),
        (&[0x67, 0x8b, 0x07], "mov (%edi),%eax", None),
        (&[0x0f, 0x1f, 0x40, 0x00], "nopl 0x0(%rax)", None),
        (
            &[0x41, 0x80, 0x7c, 0x24, 0xf8, 0x07],
            "cmpb $0x7,-0x8(%r12)",
            Some((R, 1, 12, n, 0, -8, 0)),
        ),
        (&[0x50], "push %rax", None),
        (&[0xc3], "ret", None),
    ];
    let Some((code, at)) = layout(cases) else {
        eprintln!("objdump not installed; skipped");
        return;
    };
    let img = Image::function(&code);
    let input = img.input();
    let facts = X86_64.insn_facts(&input, func(&input), true);
    assert_eq!(facts.iter().map(|f| f.addr).collect::<Vec<_>>(), at);
    for ((c, &a), fact) in cases.iter().zip(&at).zip(&facts) {
        let set = X86_64.uprobe_operands(&input, SiteKind::Memory, a, &[]);
        let got = set.map(|s| {
            assert_eq!((s.count, s.ops[0].kind), (1, OP_ADDR), "{}", c.1);
            let o = s.ops[0];
            let access = s.flags & (R | W);
            let size = s.flags >> FLAG_MEM_SIZE_SHIFT;
            (access, size, o.base, o.index, o.shift, o.disp, o.flags)
        });
        assert_eq!(got, c.2, "{}", c.1);
        // Site selection picks exactly the instructions the stubs can take.
        assert_eq!(fact.memory, c.2.is_some(), "{}", c.1);
    }
}

#[test]
fn control_flow_facts() {
    let got_slot = GOT + 0x18;
    // call *slot(%rip) at TEXT + 0xd: displacement to the slot from its end.
    let rel = (got_slot - (TEXT + 0xd + 6)) as u32;
    let r = rel.to_le_bytes();
    let cases: &[(&[u8], &str, ())] = &[
        (&[0xf3, 0x0f, 0x1e, 0xfa], "endbr64", ()),
        (&[0x55], "push %rbp", ()),
        (&[0xe8, 0xfb, 0x00, 0x00, 0x00], "call 0x401105", ()),
        (&[0x74, 0x02], "je 0x40100e", ()),
        (&[0x90], "nop", ()),
        (
            &[0xff, 0x15, r[0], r[1], r[2], r[3]],
            "call *0x2005(%rip) # 0x403018",
            (),
        ),
        (&[0xff, 0xd0], "call *%rax", ()),
        (&[0xff, 0xe0], "jmp *%rax", ()),
        (&[0xe9, 0xe4, 0xef, 0xff, 0xff], "jmp 0x400000", ()),
        (&[0xc3], "ret", ()),
        (&[0xcc], "int3", ()),
    ];
    let Some((code, at)) = layout(cases) else {
        eprintln!("objdump not installed; skipped");
        return;
    };
    let img = Image::function(&code);
    let input = img.input();
    let f = X86_64.insn_facts(&input, func(&input), false);
    assert_eq!(f.len(), cases.len());
    let pad = |i: usize| f[i].landing_pad;
    assert!(pad(0) && !pad(1));
    // A direct call: its target; through a GOT slot: the slot (named by imports).
    assert_eq!((f[2].call, f[2].callee), (true, Some(0x40_1105)));
    assert_eq!((f[5].call, f[5].callee), (true, Some(got_slot)));
    assert_eq!((f[6].call, f[6].callee), (true, None));
    // A conditional branch transfers but is no jump for exits.
    assert!(f[3].transfers && f[3].direct_jump.is_none() && !f[3].is_return);
    assert!(!f[1].transfers && !f[1].call);
    assert!(f[7].indirect_jump && f[7].direct_jump.is_none() && f[7].transfers);
    assert_eq!(f[8].direct_jump, Some(0x40_0000));
    assert!(f[9].is_return && f[9].transfers);
    assert!(f[4].padding && f[10].padding && !f[9].padding);
    assert_eq!(f[2].next, at[3]);
}

#[test]
fn indirect_call_targets_as_values_to_load() {
    let x = |reg| Reg::X86 { reg, high8: false };
    let arg = |loc| {
        Some(Arg {
            size: 8,
            signed: false,
            float: false,
            loc,
        })
    };
    let cases: &[(&[u8], &str, Option<Arg>)] = &[
        (&[0xe8, 0x00, 0x00, 0x00, 0x00], "call 0x401005", None),
        (
            &[0x41, 0xff, 0xd3],
            "call *%r11",
            arg(ArgLoc::Reg(x(Register::R11))),
        ),
        (
            &[0xff, 0x15, 0xf8, 0x0f, 0x00, 0x00],
            "call *0xff8(%rip) # 0x402006",
            arg(ArgLoc::Static { addr: 0x40_2006 }),
        ),
        (
            &[0xff, 0x54, 0xf7, 0x08],
            "call *0x8(%rdi,%rsi,8)",
            arg(ArgLoc::Mem {
                base: Some(x(Register::RDI)),
                index: Some((x(Register::RSI), 8)),
                disp: 8,
            }),
        ),
        (
            &[0xff, 0x14, 0x24],
            "call *(%rsp)",
            arg(ArgLoc::Mem {
                base: Some(x(Register::RSP)),
                index: None,
                disp: 0,
            }),
        ),
    ];
    let Some((code, at)) = layout(cases) else {
        eprintln!("objdump not installed; skipped");
        return;
    };
    let mut dec = Decoder::with_ip(64, &code, TEXT, DecoderOptions::NONE);
    for (c, &a) in cases.iter().zip(&at) {
        let ins = dec.decode();
        assert_eq!(ins.ip(), a);
        assert_eq!(call_target(&ins).unwrap(), c.2, "{}", c.1);
    }
    // Through %fs: not re-created.
    let fs = [0x64, 0xff, 0x14, 0x25, 0x10, 0, 0, 0];
    let ins = Decoder::with_ip(64, &fs, TEXT, DecoderOptions::NONE).decode();
    assert!(call_target(&ins).is_err());
}

#[test]
fn plt_entries_start_at_their_landing_pad() {
    // .plt.sec: endbr64; bnd jmp *slot(%rip); nopl 0(%rax,%rax,1) — twice.
    let sec = TEXT + 0x100;
    let entry = |k: u64| {
        let rel = (GOT + 0x18 + 8 * k - (sec + 16 * k + 4 + 7)) as u32;
        let r = rel.to_le_bytes();
        let mut b = vec![
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, r[0], r[1], r[2], r[3],
        ];
        b.extend_from_slice(&[0x0f, 0x1f, 0x44, 0x00, 0x00]);
        b
    };
    let code: Vec<u8> = [entry(0), entry(1)].concat();
    let lines = objdump_or_skip!(&code, sec);
    assert_eq!(lines[1], "bnd jmp *0x1f0d(%rip) # 0x403018");
    assert_eq!(lines[4], "bnd jmp *0x1f05(%rip) # 0x403020");
    let mut img = Image::new(&[]);
    img.put(sec, &code);
    img.extra.push((".plt.sec", sec, code.len() as u64, true));
    let input = img.input();
    assert_eq!(
        X86_64.plt_slots(&input),
        vec![(sec, GOT + 0x18), (sec + 16, GOT + 0x20)]
    );
}

#[test]
fn direct_branches_and_calls_of_a_sweep() {
    let cases: &[(&[u8], &str, ())] = &[
        (&[0x75, 0x10], "jne 0x401012", ()),
        (&[0xe8, 0x10, 0x00, 0x00, 0x00], "call 0x401017", ()),
        (&[0xc7, 0xf8, 0x20, 0x00, 0x00, 0x00], "xbegin 0x40102d", ()),
        (&[0xff, 0xe0], "jmp *%rax", ()),
        (&[0xe3, 0x00], "jrcxz 0x401011", ()),
        (&[0xeb, 0xed], "jmp 0x401000", ()),
    ];
    let Some((code, _)) = layout(cases) else {
        eprintln!("objdump not installed; skipped");
        return;
    };
    let mut out = Vec::new();
    X86_64.direct_branches(TEXT, &code, &mut out);
    let got: Vec<(u64, u64, bool)> = out.iter().map(|b| (b.from, b.to, b.call)).collect();
    // xbegin's abort path counts as a call's return (never moved); jrcxz is a
    // conditional branch like any other for targets.
    assert_eq!(
        got,
        vec![
            (0x40_1000, 0x40_1012, false),
            (0x40_1002, 0x40_1017, true),
            (0x40_1007, 0x40_102d, true),
            (0x40_100f, 0x40_1011, false),
            (0x40_1011, 0x40_1000, false),
        ]
    );
    let mut calls = Vec::new();
    X86_64.direct_call_targets(TEXT, &code, &mut calls);
    assert_eq!(calls, vec![0x40_1017]);
}
