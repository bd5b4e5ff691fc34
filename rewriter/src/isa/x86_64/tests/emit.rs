//! Emitted code disassembled by objdump: trampolines (relocated instructions and
//! stubs) and the run-time routines, with the properties that matter checked on the
//! disassembly (addresses reached, record and slot field offsets).

use std::mem::offset_of;

use super::super::X86_64;
use super::plan::{loop_with_a_way_in, plan, req};
use super::{Image, TEXT, objdump_at};
use crate::isa::arg::{ArgError, parse_arg};
use crate::isa::{
    IndexWhy, Isa, Landing, Layout, PlacedSite, Runtime, SlotLookup, Trampoline, Window,
};
use tracer_common::meta::{SiteKind, TimeMode};
use tracer_common::*;

const RW: u64 = 0x60_0000;
const AT: u64 = 0x50_0000;

fn layout() -> Layout {
    Layout {
        rw_vaddr: RW,
        nslots: 64,
        buf_bytes: 0x1_0000,
        binary_id: 0x1234,
        pre_tls: false,
        time_mode: TimeMode::Coarse,
        buf_kind: BUF_TRACE,
        slot_lookup: SlotLookup::Index(IndexWhy::SharedLibrary),
    }
}

const RT: Runtime = Runtime {
    flush: 0x70_0000,
    flush_probe: 0x70_0010,
    register: 0x70_0100,
    entry_shim: None,
};

/// The trampoline of `w` at AT and its disassembly; None without objdump.
fn tramp(img: &Image, l: &Layout, w: &Window) -> Option<(Trampoline, Vec<(u64, String)>)> {
    let t = X86_64.emit_window(&img.input(), l, &RT, w, AT).unwrap();
    let lines = objdump_at(&t.code, AT)?;
    assert!(!lines.iter().any(|l| l.1.contains("bad")), "{lines:?}");
    Some((t, lines))
}

macro_rules! or_skip {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => {
                eprintln!("objdump not installed; skipped");
                return;
            }
        }
    };
}

fn text(lines: &[(u64, String)]) -> Vec<&str> {
    lines.iter().map(|l| l.1.as_str()).collect()
}

/// A window over `[start, start + len)` with `sites`.
fn window(start: u64, len: usize, sites: Vec<PlacedSite>) -> Window {
    Window {
        start,
        len,
        code_len: len,
        sites,
        landings: Vec::new(),
        tails: Vec::new(),
        entered_by: Vec::new(),
    }
}

#[test]
fn entry_stub_then_the_relocated_loop() {
    let img = loop_with_a_way_in();
    let p = plan(&img, &[req(1, SiteKind::FunctionEntry, TEXT)]);
    let (t, lines) = or_skip!(tramp(&img, &layout(), &p.windows[0]));
    // The stub of the module docs (index lookup, coarse time, %r11 kept: the function
    // never writes it), then the window's code, the way back, the slow paths.
    assert_eq!(
        text(&lines),
        [
            "push %rcx",
            "push %rsi",
            "push %r11",
            "mov %fs:0x0,%r11",
            "mov %r11,%rcx",
            "shr $0x10,%rcx",
            "movzwl %cx,%ecx",
            "lea 0x101fe2(%rip),%rsi # 0x602000",
            "mov (%rsi,%rcx,4),%esi",
            "lea 0x141fd8(%rip),%rcx # 0x642000",
            "add %rcx,%rsi",
            "cmp %r11,(%rsi)",
            "jne 0x50007b",
            "incq 0x38(%rsi)",
            "mov $0x20,%r11d",
            "xadd %r11,0x8(%rsi)",
            "movq $0x1,(%r11)",
            "mov %rdi,0x10(%r11)",
            "mov 0x18(%rsp),%rcx",
            "mov %rcx,0x18(%r11)",
            "mov 0x34(%rsi),%ecx",
            "mov %rcx,0x8(%r11)",
            "decq 0x38(%rsi)",
            "add $0x20,%r11",
            "cmp 0x10(%rsi),%r11",
            "jae 0x50008e",
            "pop %r11",
            "pop %rsi",
            "pop %rcx",
            "xor %eax,%eax",
            "inc %eax",
            "nop",
            "cmp $0xa,%eax",
            "jne 0x50006e",
            "jmp 0x40100a",
            "push %rax",
            "push %rdx",
            "call 0x700100",
            "pop %rdx",
            "pop %rax",
            "test %rcx,%rcx",
            "je 0x500068",
            "jmp 0x500004",
            "push %rax",
            "push %rdx",
            "call 0x700000",
            "pop %rdx",
            "pop %rax",
            "jmp 0x500068",
        ]
    );
    let at = |s: &str| lines.iter().find(|l| l.1 == s).unwrap().0;
    // The index and the slots where the layout has them.
    assert_eq!(RW + INDEX_OFF, 0x60_2000);
    assert_eq!(RW + SLOTS_OFF, 0x64_2000);
    // The slot's fields: key (cmp), cur (xadd), end, generation, inflight.
    assert_eq!(
        (SLOT_KEY, SLOT_CUR, SLOT_END, SLOT_GENERATION, SLOT_INFLIGHT),
        (0, 0x8, 0x10, 0x34, 0x38)
    );
    // The record's: site and flags (one movq), time, value (%rdi), aux (return
    // address, 3 pushes up).
    assert_eq!(
        (
            offset_of!(Record, site),
            offset_of!(Record, flags),
            offset_of!(Record, time),
            offset_of!(Record, value),
            offset_of!(Record, aux),
            RECORD_SIZE,
        ),
        (0, 4, 0x8, 0x10, 0x18, 0x20)
    );
    // The loop's jump goes to the copy of its target; the landing of the jump from
    // outside is the copy of `cmp`.
    assert_eq!(t.landed, vec![at("cmp $0xa,%eax")]);
    assert_eq!(at("inc %eax"), 0x50_006e);
}

#[test]
fn relocated_rip_relative_operands_and_branches_reach_the_same_addresses() {
    // mov 0x100(%rip),%rax; cmpl $0x0,0x20(%rip); je +0x30; call TEXT + 0x80
    let code = [
        0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x83, 0x3d, 0x20, 0x00, 0x00, 0x00, 0x00, 0x74,
        0x30, 0xe8, 0x6b, 0x00, 0x00, 0x00,
    ];
    let orig = or_skip!(super::objdump(&code, TEXT));
    assert_eq!(
        orig,
        [
            "mov 0x100(%rip),%rax # 0x401107",
            "cmpl $0x0,0x20(%rip) # 0x40102e",
            "je 0x401040",
            "call 0x401080",
        ]
    );
    let img = Image::function(&code);
    let (_, lines) = or_skip!(tramp(&img, &layout(), &window(TEXT, code.len(), vec![])));
    // Same absolute operands from 1 MiB away; a short `je` becomes a near one; the
    // call pushes its original return address (flags and registers untouched) and
    // jumps: nothing comes back to the trampoline.
    assert_eq!(
        text(&lines),
        [
            "mov -0xfef00(%rip),%rax # 0x401107",
            "cmpl $0x0,-0xfefe0(%rip) # 0x40102e",
            "je 0x401040",
            "lea -0x8(%rsp),%rsp",
            "push %rax",
            "lea -0xff00c(%rip),%rax # 0x401015",
            "mov %rax,0x8(%rsp)",
            "pop %rax",
            "jmp 0x401080",
        ]
    );
}

#[test]
fn an_indirect_call_through_the_stack_reads_its_slot_one_word_further() {
    // nop; nop; call *0x8(%rsp)
    let code = [0x90, 0x90, 0xff, 0x54, 0x24, 0x08];
    let img = Image::function(&code);
    let (_, lines) = or_skip!(tramp(&img, &layout(), &window(TEXT, code.len(), vec![])));
    assert_eq!(
        text(&lines),
        [
            "nop",
            "nop",
            "lea -0x8(%rsp),%rsp",
            "push %rax",
            "lea -0xff009(%rip),%rax # 0x401006",
            "mov %rax,0x8(%rsp)",
            "pop %rax",
            "jmp *0x10(%rsp)",
        ]
    );
}

fn site(id: u32, kind: SiteKind, at: u64, flags: u32) -> PlacedSite {
    PlacedSite {
        id,
        kind,
        at,
        insn: at,
        ea_shift: 0,
        signed_lr: false,
        flags,
        args: Vec::new(),
        keep_flags: false,
        keep_r11: false,
        flags_dead: false,
        frame: None,
    }
}

/// The lines from the first that starts with `from`, `n` of them.
fn run<'a>(lines: &'a [(u64, String)], from: &str, n: usize) -> Vec<&'a str> {
    let k = lines.iter().position(|l| l.1.starts_with(from)).unwrap();
    lines[k..k + n].iter().map(|l| l.1.as_str()).collect()
}

#[test]
fn memory_site_stub_computes_the_address_from_the_original_registers() {
    // mov 0x8(%rsp),%eax; mov %eax,0x10(%rdi,%rcx,8)
    let code = [0x8b, 0x44, 0x24, 0x08, 0x89, 0x44, 0xcf, 0x10];
    let orig = or_skip!(super::objdump(&code, TEXT));
    assert_eq!(orig, ["mov 0x8(%rsp),%eax", "mov %eax,0x10(%rdi,%rcx,8)"]);
    let r4 = FLAG_MEM_READ | 4 << FLAG_MEM_SIZE_SHIFT;
    let w4 = FLAG_MEM_WRITE | 4 << FLAG_MEM_SIZE_SHIFT;
    let img = Image::function(&code);
    let w = window(
        TEXT,
        code.len(),
        vec![
            site(3, SiteKind::Memory, TEXT, r4),
            site(4, SiteKind::Memory, TEXT + 4, w4),
        ],
    );
    let (_, lines) = or_skip!(tramp(&img, &layout(), &w));
    // Below the red zone, %rax and the flags saved: the operand relative to %rsp is
    // 0x80 + 0x10 further.
    assert_eq!(
        run(&lines, "lea -0x80(%rsp),%rsp", 8),
        [
            "lea -0x80(%rsp),%rsp",
            "push %rax",
            "lahf",
            "seto %al",
            "push %rax",
            "lea 0x98(%rsp),%rax",
            "push %rax",
            "push %rcx",
        ]
    );
    assert_eq!(run(&lines, "lea 0x10(%rdi,%rcx,8),%rax", 2)[1], "push %rax");
    // Site and flags in two stores; value: the saved address; aux: the instruction.
    assert_eq!(
        run(&lines, "movl $0x3,(%r11)", 6),
        [
            "movl $0x3,(%r11)",
            "movl $0x40004,0x4(%r11)",
            "mov 0x18(%rsp),%rcx",
            "mov %rcx,0x10(%r11)",
            "lea -0xff076(%rip),%rcx # 0x401000",
            "mov %rcx,0x18(%r11)",
        ]
    );
    assert_eq!(
        run(&lines, "movl $0x4,(%r11)", 2)[1],
        "movl $0x40008,0x4(%r11)"
    );
    // Restored: the scratch word, flags (OF from seto's byte), %rax, the red zone.
    assert_eq!(
        run(&lines, "pop %r11", 10),
        [
            "pop %r11",
            "pop %rsi",
            "pop %rcx",
            "lea 0x8(%rsp),%rsp",
            "pop %rax",
            "add $0x7f,%al",
            "sahf",
            "pop %rax",
            "lea 0x80(%rsp),%rsp",
            "mov 0x8(%rsp),%eax",
        ]
    );
}

#[test]
fn usdt_stub_loads_each_argument_as_its_spec_says() {
    let resolve = |s: &str| match s {
        "foo" => Ok(0x40_3800),
        _ => Err(ArgError::UnknownSymbol(s.into())),
    };
    let args = ["-4@%eax", "8@16(%rbp)", "8@foo(%rip)", "1@%ah"]
        .iter()
        .map(|t| parse_arg(t, object::elf::EM_X86_64, TEXT, &resolve).unwrap())
        .collect();
    let img = Image::function(&[0x90, 0x90, 0x90, 0x90, 0x90, 0xc3]);
    let mut s = site(9, SiteKind::Usdt, TEXT, 0);
    s.args = args;
    let (_, lines) = or_skip!(tramp(&img, &layout(), &window(TEXT, 5, vec![s])));
    // Each argument from the original registers (%rax: its saved copy, 0x10 up).
    assert_eq!(
        run(&lines, "lea -0x80(%rsp),%rsp", 17),
        [
            "lea -0x80(%rsp),%rsp",
            "push %rax",
            "lahf",
            "seto %al",
            "push %rax",
            "mov 0x8(%rsp),%rax",
            "movslq %eax,%rax",
            "push %rax",
            "lea 0x10(%rbp),%rax",
            "mov (%rax),%rax",
            "push %rax",
            "lea -0xfc826(%rip),%rax # 0x403800",
            "mov (%rax),%rax",
            "push %rax",
            "mov 0x20(%rsp),%rax",
            "movzbl %ah,%eax",
            "push %rax",
        ]
    );
    // Two records: the second says it carries arguments 3 and 4.
    assert!(lines.iter().any(|l| l.1 == "mov $0x40,%r11d"));
    assert_eq!(
        run(&lines, "movl $0x9,0x20(%r11)", 2),
        ["movl $0x9,0x20(%r11)", "movl $0x10,0x24(%r11)"]
    );
    assert_eq!(FLAG_USDT_MORE, 0x10);
}

/// The run-time routines at 0x70_0000 (original entry TEXT) and their disassembly.
fn runtime(pre_tls: bool) -> Option<(Runtime, Vec<(u64, String)>)> {
    let l = Layout {
        pre_tls,
        ..layout()
    };
    let (code, rt) = X86_64.emit_runtime(&l, 0x70_0000, TEXT).unwrap();
    let lines = objdump_at(&code, 0x70_0000)?;
    assert!(!lines.iter().any(|l| l.1.contains("bad")));
    Some((rt, lines))
}

fn from(lines: &[(u64, String)], at: u64, n: usize) -> Vec<&str> {
    let k = lines.iter().position(|l| l.0 == at).unwrap();
    lines[k..k + n].iter().map(|l| l.1.as_str()).collect()
}

#[test]
fn runtime_entry_points_flush_probe_and_shim() {
    let (rt, lines) = or_skip!(runtime(true));
    assert_eq!(rt.flush, 0x70_0000);
    // flush: this binary's header, armed or not, then `cur` and the 4-byte NOP the
    // uprobe sits on (not a nop5, see runtime.rs).
    assert_eq!(
        from(&lines, rt.flush, 7),
        [
            "push %rdx",
            "lea -0x100008(%rip),%rcx # 0x600000",
            &format!("cmpl ${ON_FULL_WAIT:#x},{RWH_ON_FULL:#x}(%rcx)"),
            "je 0x70007e",
            "xor %edx,%edx",
            &format!("mov {SLOT_CUR:#x}(%rsi),%rax"),
            "nopl 0x0(%rax)",
        ]
    );
    assert_eq!(from(&lines, rt.flush_probe, 1), ["nopl 0x0(%rax)"]);
    // register saves the flags and what the system calls clobber, first thing.
    assert_eq!(
        from(&lines, rt.register, 8),
        [
            "pushf",
            "push %rdi",
            "push %r8",
            "push %r9",
            "push %r10",
            "push %r12",
            "push %r13",
            "mov %r11,%r8",
        ]
    );
    // The static executable's entry shim: the stand-in TCB points at itself,
    // arch_prctl(ARCH_SET_FS), on to the original entry.
    let shim = rt.entry_shim.unwrap();
    assert_eq!(
        from(&lines, shim, 6),
        [
            &format!("lea -0xff8d7(%rip),%rsi # {:#x}", RW + PRE_TLS_OFF),
            "mov %rsi,(%rsi)",
            "mov $0x1002,%edi",
            "mov $0x9e,%eax",
            "syscall",
            "jmp 0x401000",
        ]
    );
    // ... and register ends just before it, restoring in reverse.
    let k = lines.iter().position(|l| l.0 == shim).unwrap();
    assert_eq!(
        text(&lines[k - 8..k]),
        [
            "pop %r13", "pop %r12", "pop %r10", "pop %r9", "pop %r8", "pop %rdi", "popf", "ret"
        ]
    );
    let (rt, _) = or_skip!(runtime(false));
    assert!(rt.entry_shim.is_none());
}

#[test]
fn every_runtime_branch_lands_on_an_instruction_and_every_syscall_is_known() {
    let (_, lines) = or_skip!(runtime(true));
    let starts: std::collections::HashSet<u64> = lines.iter().map(|l| l.0).collect();
    let mut branches = 0;
    for (at, l) in &lines {
        let mut parts = l.split(' ');
        let m = parts.next().unwrap();
        let Some(t) = parts.next().and_then(|t| t.strip_prefix("0x")) else {
            continue;
        };
        if !(m.starts_with('j') || m == "call") {
            continue;
        }
        let t = u64::from_str_radix(t, 16).unwrap();
        branches += 1;
        assert!(starts.contains(&t) || t == TEXT, "{at:#x}: {l}");
    }
    assert!(branches > 50, "{branches}");
    // The last `mov $N,%eax` before each `syscall`.
    let known = [
        3, 14, 24, 35, 39, 41, 42, 44, 46, 55, 107, 128, 157, 158, 186, 234, 271, 292, 297,
    ];
    let mut nr = None;
    let mut calls = 0;
    for (at, l) in &lines {
        if let Some(n) = l
            .strip_prefix("mov $0x")
            .and_then(|r| r.strip_suffix(",%eax"))
        {
            nr = u32::from_str_radix(n, 16).ok();
        }
        if l == "syscall" {
            calls += 1;
            assert!(nr.is_some_and(|n| known.contains(&n)), "{at:#x}: {nr:?}");
            nr = None;
        }
    }
    assert!(calls >= 20, "{calls}");
    // Claims are atomic; the counters too.
    let count = |s: &str| lines.iter().filter(|l| l.1 == s).count();
    assert_eq!(count("lock cmpxchg %r13,(%rsi)"), 2);
    assert_eq!(count(&format!("lock incq {RWH_NO_SLOT_DROPS:#x}(%rdx)")), 1);
    assert_eq!(count(&format!("lock incq {RWH_REGISTRATIONS:#x}(%rdx)")), 1);
    assert_eq!(count(&format!("lock xadd %rax,{RWH_USER_SEQ:#x}(%rdx)")), 1);
}

/// `nop; nop; nop; jmp *%r11` with an exit site at the tail call.
fn tail_call_window() -> (Image, Window) {
    let img = Image::function(&[0x90, 0x90, 0x90, 0x41, 0xff, 0xe3]);
    let w = window(TEXT, 6, vec![site(5, SiteKind::FunctionExit, TEXT + 3, 0)]);
    (img, w)
}

#[test]
fn thread_word_fast_ring_and_cycle_counter_stub_at_a_tail_call() {
    let (img, w) = tail_call_window();
    let l = Layout {
        slot_lookup: SlotLookup::ThreadWord(-8),
        buf_kind: BUF_FAST_CIRCULAR,
        time_mode: TimeMode::Record,
        ..layout()
    };
    let (_, lines) = or_skip!(tramp(&img, &l, &w));
    assert_eq!(crate::isa::slot_mask(64), 0xfc0);
    assert_eq!(
        text(&lines),
        [
            "nop",
            "nop",
            "nop",
            // %r11 holds the tail call's target: saved too; rdtsc needs %rax, %rdx.
            "push %rcx",
            "push %rsi",
            "push %r11",
            "push %rax",
            "push %rdx",
            "mov %fs:0x0,%r11",
            "mov %fs:0xfffffffffffffff8,%esi",
            "and $0xfc0,%esi",
            "lea 0x141fd9(%rip),%rcx # 0x642000",
            "add %rcx,%rsi",
            "cmp %r11,(%rsi)",
            "jne 0x500072",
            // The 64 KiB ring: only the low 16 bits of `cur` move; no inflight
            // bracket, no full check.
            "mov $0x20,%r11d",
            "xadd %r11w,0x8(%rsi)",
            "movzwl %r11w,%r11d",
            "add 0x18(%rsi),%r11",
            "movl $0x5,(%r11)",
            "movl $0x20,0x4(%r11)",
            "mov %rax,0x10(%r11)",
            "mov 0x28(%rsp),%rcx",
            "mov %rcx,0x18(%r11)",
            "rdtsc",
            "mov %eax,0x8(%r11)",
            "mov %edx,0xc(%r11)",
            "pop %rdx",
            "pop %rax",
            "pop %r11",
            "pop %rsi",
            "pop %rcx",
            "jmp *%r11",
            "call 0x700100",
            "test %rcx,%rcx",
            "je 0x500069",
            "jmp 0x500009",
            "call 0x700000",
            "jmp 0x500069",
        ]
    );
    // The ring flag on every record; the start field the ring's base.
    assert_eq!((FLAG_RING, SLOT_START), (0x20, 0x18));
}

/// Two records in one fast-ring reservation: one compare sends a reservation that
/// would run past the ring's end to a cold path, which marks both records never
/// written (flags 0), wherever the ring wraps between them, and reserves again.
#[test]
fn a_fast_ring_reservation_of_two_records_never_crosses_the_ring_end() {
    let img = Image::function(&[0x90, 0x90, 0x90, 0x41, 0xff, 0xe3]);
    let w = window(
        TEXT,
        6,
        vec![
            site(5, SiteKind::FunctionExit, TEXT + 3, 0),
            site(6, SiteKind::Block, TEXT + 3, 0),
        ],
    );
    let l = Layout {
        buf_kind: BUF_FAST_CIRCULAR,
        ..layout()
    };
    let (_, lines) = or_skip!(tramp(&img, &l, &w));
    let reserve = run(&lines, "xadd", 5);
    assert_eq!(
        reserve[..3],
        [
            "xadd %r11w,0x8(%rsi)",
            "movzwl %r11w,%r11d",
            "cmp $0xffc0,%r11d"
        ]
    );
    assert_eq!(reserve[4], "add 0x18(%rsi),%r11");
    let cold = lines
        .iter()
        .find(|l| l.0 == jump_target(reserve[3], "ja"))
        .map(|l| l.1.as_str());
    assert_eq!(cold, Some("lea (%r11),%ecx"));
    let cold = run(&lines, "lea (%r11),%ecx", 9);
    assert_eq!(
        cold[..8],
        [
            "lea (%r11),%ecx",
            "movzwl %cx,%ecx",
            "add 0x18(%rsi),%rcx",
            "movl $0x0,0x4(%rcx)",
            "lea 0x20(%r11),%ecx",
            "movzwl %cx,%ecx",
            "add 0x18(%rsi),%rcx",
            "movl $0x0,0x4(%rcx)",
        ]
    );
    // Back to the slot lookup.
    let back = jump_target(cold[8], "jmp");
    let at = lines.iter().find(|l| l.0 == back).map(|l| l.1.as_str());
    assert_eq!(at, Some("mov %fs:0x0,%r11"));
    // One record: no compare (the 16-bit offset wraps between records, never inside one).
    let one = Layout {
        buf_kind: BUF_FAST_CIRCULAR,
        ..layout()
    };
    let (img, w) = tail_call_window();
    let (_, lines) = or_skip!(tramp(&img, &one, &w));
    assert_eq!(run(&lines, "movzwl %r11w", 2)[1], "add 0x18(%rsi),%r11");
}

/// The address of a `mnemonic ADDR` line.
fn jump_target(line: &str, mnemonic: &str) -> u64 {
    let hex = line.strip_prefix(mnemonic).unwrap().trim();
    u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn a_full_circular_buffer_wraps_in_the_stub() {
    let (img, w) = tail_call_window();
    let l = Layout {
        buf_kind: BUF_CIRCULAR,
        ..layout()
    };
    let (_, lines) = or_skip!(tramp(&img, &l, &w));
    // No inflight bracket (never reset under a writer); the full path: cur = start,
    // a new epoch, back out.
    assert!(!lines.iter().any(|l| l.1.contains("0x38(%rsi)")));
    let jae = lines.iter().find(|l| l.1.starts_with("jae ")).unwrap();
    let full = u64::from_str_radix(&jae.1[6..], 16).unwrap();
    assert_eq!(
        from(&lines, full, 4),
        [
            "mov 0x18(%rsi),%rcx",
            "mov %rcx,0x8(%rsi)",
            "incl 0x34(%rsi)",
            "jmp 0x50006b"
        ]
    );
    assert_eq!(from(&lines, 0x50_006b, 4)[3], "jmp *%r11");
}

#[test]
fn a_jump_to_a_return_outside_the_window_runs_that_returns_stub() {
    // test %edi,%edi; je R; mov $1,%eax; R: ret
    let code = [0x85, 0xff, 0x74, 0x05, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3];
    let orig = or_skip!(super::objdump(&code, TEXT));
    assert_eq!(
        orig,
        ["test %edi,%edi", "je 0x401009", "mov $0x1,%eax", "ret"]
    );
    let img = Image::function(&code);
    let p = plan(
        &img,
        &[
            req(1, SiteKind::FunctionEntry, TEXT),
            req(2, SiteKind::FunctionExit, TEXT + 9),
        ],
    );
    // Two windows: the entry's over [test .. mov], the ret's with the padding.
    let w: Vec<(u64, usize, usize)> = p
        .windows
        .iter()
        .map(|w| (w.start, w.len, w.code_len))
        .collect();
    assert_eq!(w, [(TEXT, 9, 9), (TEXT + 9, 5, 1)]);
    let tails = &p.windows[0].tails;
    assert_eq!(tails.len(), 1);
    assert_eq!(tails[0].at, TEXT + 9);
    assert_eq!(tails[0].sites[0].id, 2);
    let (_, lines) = or_skip!(tramp(&img, &layout(), &p.windows[0]));
    // The relocated `je` goes to the trampoline's own copy of the return, after the
    // exit stub (value %rax at 0x10, return address 3 pushes up); the fall-through
    // path goes back to the original ret (and its own window).
    let je = lines.iter().find(|l| l.1.starts_with("je ")).unwrap();
    let copy = u64::from_str_radix(&je.1[5..], 16).unwrap();
    let tail = from(&lines, copy, 31);
    assert_eq!(tail[..3], ["push %rcx", "push %rsi", "push %r11"]);
    assert!(tail.contains(&"movq $0x2,(%r11)"));
    assert!(tail.contains(&"mov %rax,0x10(%r11)"));
    assert!(tail.contains(&"mov 0x18(%rsp),%rcx"));
    let k = tail.iter().position(|l| *l == "pop %rcx").unwrap();
    assert_eq!(tail[k + 1], "ret");
    assert!(lines.iter().any(|l| l.1 == "jmp 0x401009"));
}

/// The disassembly without rip-relative displacements (`lea -0x…(%rip),%rax #
/// 0x401110` → `lea (%rip),%rax # 0x401110`): what they reach is what counts.
fn reach(lines: &[(u64, String)]) -> Vec<String> {
    lines
        .iter()
        .map(|(_, l)| match (l.find(' '), l.find("(%rip)")) {
            (Some(a), Some(b)) if a < b => {
                let start = l[..b].rfind([' ', ',']).unwrap() + 1;
                format!("{}{}", &l[..start], &l[b..])
            }
            _ => l.clone(),
        })
        .collect()
}

#[test]
fn memory_sites_through_fs_and_rip_and_an_indirect_call_site() {
    // mov %fs:0x28,%rax; mov 0x100(%rip),%rcx; call *0x10(%rdi); ret
    let code = [
        0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0, 0x48, 0x8b, 0x0d, 0x00, 0x01, 0x00, 0x00,
        0xff, 0x57, 0x10, 0xc3,
    ];
    let orig = or_skip!(super::objdump(&code, TEXT));
    assert_eq!(
        orig,
        [
            "mov %fs:0x28,%rax",
            "mov 0x100(%rip),%rcx # 0x401110",
            "call *0x10(%rdi)",
            "ret"
        ]
    );
    let mut img = Image::function(&code);
    img.functions.push((TEXT + 0x20, 1, "g"));
    let p = plan(
        &img,
        &[
            req(1, SiteKind::Memory, TEXT),
            req(2, SiteKind::Memory, TEXT + 9),
            req(3, SiteKind::Call, TEXT + 16),
        ],
    );
    assert!(p.uprobes.is_empty());
    let w: Vec<(u64, usize)> = p.windows.iter().map(|w| (w.start, w.code_len)).collect();
    assert_eq!(w, [(TEXT, 9), (TEXT + 9, 10)]);
    let (_, lines) = or_skip!(tramp(&img, &layout(), &p.windows[0]));
    // The thread pointer's base plus the offset: %fs:0 holds the TCB's address.
    let l = reach(&lines);
    let k = l.iter().position(|l| l == "lea 0x28,%rax").unwrap();
    // (No reload of the original %rax: the address does not use it.)
    assert_eq!(
        l[k - 1..k + 3],
        [
            "push %rax",
            "lea 0x28,%rax",
            "add %fs:0x0,%rax",
            "push %rax"
        ]
    );
    assert!(l.contains(&"lea (%rip),%rcx # 0x401000".to_string()));
    assert_eq!(l.last().unwrap(), "jmp 0x500094");
    let (_, lines) = or_skip!(tramp(&img, &layout(), &p.windows[1]));
    let l = reach(&lines);
    // The rip-relative operand's address, as the original reaches it.
    let k = l
        .iter()
        .position(|l| l == "lea (%rip),%rax # 0x401110")
        .unwrap();
    assert_eq!(l[k + 1], "push %rax");
    let k = l.iter().position(|l| l == "movl $0x2,(%r11)").unwrap();
    assert_eq!(
        l[k..k + 6],
        [
            "movl $0x2,(%r11)",
            "movl $0x80004,0x4(%r11)",
            "mov 0x18(%rsp),%rcx",
            "mov %rcx,0x10(%r11)",
            "lea (%rip),%rcx # 0x401009",
            "mov %rcx,0x18(%r11)"
        ]
    );
    // The call site: its target loaded through the original %rdi, the return address
    // as aux; then the call itself, re-created.
    let k = l.iter().position(|l| l == "lea 0x10(%rdi),%rax").unwrap();
    assert_eq!(l[k + 1..k + 3], ["mov (%rax),%rax", "push %rax"]);
    let k = l.iter().position(|l| l == "movq $0x3,(%r11)").unwrap();
    assert_eq!(
        l[k + 1..k + 5],
        [
            "mov 0x18(%rsp),%rcx",
            "mov %rcx,0x10(%r11)",
            "lea (%rip),%rcx # 0x401013",
            "mov %rcx,0x18(%r11)"
        ]
    );
    let k = l.iter().position(|l| l == "jmp *0x10(%rdi)").unwrap();
    assert_eq!(
        l[k - 5..k],
        [
            "lea -0x8(%rsp),%rsp",
            "push %rax",
            "lea (%rip),%rax # 0x401013",
            "mov %rax,0x8(%rsp)",
            "pop %rax"
        ]
    );
}

#[test]
fn an_access_run_is_recorded_by_its_heads_stub_two_accesses_a_record() {
    let code = [
        0x48, 0x8b, 0x0f, // mov (%rdi),%rcx
        0x4c, 0x8b, 0x40, 0x10, // mov 0x10(%rax),%r8
        0x49, 0x01, 0xc8, // add %rcx,%r8
        0x44, 0x89, 0x04, 0x96, // mov %r8d,(%rsi,%rdx,4)
        0x48, 0x8b, 0x51, 0x08, // mov 0x8(%rcx),%rdx
        0xc3,
    ];
    let img = Image::function(&code);
    let reqs: Vec<_> = [0, 3, 10, 14]
        .iter()
        .zip(1..)
        .map(|(&off, id)| req(id, SiteKind::Memory, TEXT + off))
        .collect();
    let input = img.input();
    let targets = X86_64.branch_targets(&input, &crate::flow::Flow::default());
    let p = X86_64.plan_function(&input, super::func(&input), &reqs, &targets, None, false, 4);
    assert!(p.uprobes.is_empty());
    // Sites 2 and 3 ride on site 1's stub; site 4's address uses %rcx, which the head
    // writes: a window of its own.
    let at: Vec<(u32, u64, u64)> = p
        .windows
        .iter()
        .flat_map(|w| &w.sites)
        .map(|s| (s.id, s.at, s.insn))
        .collect();
    assert_eq!(
        at,
        [
            (1, TEXT, TEXT),
            (2, TEXT, TEXT + 3),
            (3, TEXT, TEXT + 10),
            (4, TEXT + 14, TEXT + 14)
        ]
    );
    assert_eq!(p.runs.by_len.get(&3), Some(&1));
    assert_eq!(
        p.runs.ends.get(&crate::isa::runs::RunEnd::AddressWritten),
        Some(&1)
    );
    let (_, lines) = or_skip!(tramp(&img, &layout(), &p.windows[0]));
    let l = reach(&lines);
    let k = l.iter().position(|l| l == "lea 0x0(%rdi),%rax").unwrap();
    // `add %rcx,%r8` writes every status flag before anything reads one: no flag save
    // (%rax still pushed twice, the frame's layout).
    assert_eq!(l[k - 2..k], ["push %rax", "push %rax"]);
    assert!(!l.iter().any(|l| l == "sahf" || l == "lahf"), "{l:?}");
    // Every address from the registers at the head; %rax's original reloaded (the
    // frame holds it): it is 0x10 above after one address was pushed.
    assert_eq!(
        l[k..k + 7],
        [
            "lea 0x0(%rdi),%rax",
            "push %rax",
            "mov 0x10(%rsp),%rax",
            "lea 0x10(%rax),%rax",
            "push %rax",
            "lea 0x0(%rsi,%rdx,4),%rax",
            "push %rax",
        ]
    );
    // One reservation of two records.
    assert_eq!(l.iter().filter(|l| l.starts_with("xadd")).count(), 1);
    assert!(l.contains(&"mov $0x40,%r11d".to_string()), "{l:?}");
    // A pair (sites 1 and 2: both addresses) and a single (site 3: its instruction).
    let pair = FLAG_MEM_PAIR | FLAG_MEM_READ | FLAG_MEM2_READ | 8 << 16 | 8 << 24;
    let k = l.iter().position(|l| l == "movl $0x1,(%r11)").unwrap();
    assert_eq!(
        l[k..k + 6],
        [
            "movl $0x1,(%r11)".to_string(),
            format!("movl ${pair:#x},0x4(%r11)"),
            "mov 0x28(%rsp),%rcx".into(),
            "mov %rcx,0x10(%r11)".into(),
            "mov 0x20(%rsp),%rcx".into(),
            "mov %rcx,0x18(%r11)".into(),
        ]
    );
    let k = l.iter().position(|l| l == "movl $0x3,0x20(%r11)").unwrap();
    assert_eq!(l[k + 1], "movl $0x40008,0x24(%r11)");
    assert_eq!(l[k + 4], "lea (%rip),%rcx # 0x40100a");
    // The scratch is 3 words; the window's instructions follow unchanged, and site
    // 3's instruction runs where it is (a member needs no window).
    assert!(l.contains(&"lea 0x18(%rsp),%rsp".to_string()));
    assert!(l.contains(&"mov 0x10(%rax),%r8".to_string()));
    assert!(l.contains(&format!("jmp {:#x}", TEXT + 7)));
}

#[test]
fn a_jrcxz_inside_a_window_reaches_its_target_through_a_landing() {
    // xor %eax,%eax; L1: inc %eax; jrcxz L2; nop; L2: cmp $10,%eax; jne L1; ret
    let code = [
        0x31, 0xc0, 0xff, 0xc0, 0xe3, 0x01, 0x90, 0x83, 0xf8, 0x0a, 0x75, 0xf6, 0xc3,
    ];
    let orig = or_skip!(super::objdump(&code, TEXT));
    assert_eq!(orig[2], "jrcxz 0x401007");
    let img = Image::function(&code);
    let p = plan(&img, &[req(1, SiteKind::FunctionEntry, TEXT)]);
    let w = &p.windows[0];
    // The loop's jne moves with its target; jrcxz has no near form to re-point, so
    // its target keeps a landing.
    assert_eq!((w.start, w.len, w.code_len), (TEXT, 12, 12));
    assert_eq!(
        w.landings,
        [Landing {
            target: TEXT + 7,
            hop: None
        }]
    );
    let (t, lines) = or_skip!(tramp(&img, &layout(), w));
    let k = lines.iter().position(|l| l.1 == "xor %eax,%eax").unwrap();
    let at = |i: usize| lines[k + i].0;
    assert_eq!(
        text(&lines[k..k + 9]),
        [
            "xor %eax,%eax",
            "inc %eax",
            &format!("jrcxz {:#x}", at(4)),
            &format!("jmp {:#x}", at(5)),
            "jmp 0x401007",
            "nop",
            "cmp $0xa,%eax",
            &format!("jne {:#x}", at(1)),
            "jmp 0x40100c",
        ]
    );
    assert_eq!(t.landed, [at(6)]);
    // The original range: the jump in, traps, the landing to the copy of L2.
    let patch = X86_64.patch_bytes(w, AT, &t.landed).unwrap();
    let lines = or_skip!(super::objdump(&patch, TEXT));
    assert_eq!(
        lines,
        ["jmp 0x500000", "int3", "int3", &format!("jmp {:#x}", at(6))]
    );
}

#[test]
fn an_exit_stub_that_must_keep_the_flags_reads_rax_from_its_saved_copy() {
    // mov %rdi,%rax; ret — no instruction writes RFLAGS or %r11: both kept.
    let mut img = Image::function(&[0x48, 0x89, 0xf8, 0xc3]);
    img.functions.push((TEXT + 0x10, 1, "g"));
    let p = plan(&img, &[req(4, SiteKind::FunctionExit, TEXT + 3)]);
    let w = &p.windows[0];
    // The ret with the padding after it (the mov before it would make 4 bytes only).
    assert_eq!((w.start, w.len, w.code_len), (TEXT + 3, 5, 1));
    assert!(w.sites[0].keep_flags && w.sites[0].keep_r11);
    let (_, lines) = or_skip!(tramp(&img, &layout(), w));
    let l = reach(&lines);
    assert_eq!(
        l[..10],
        [
            "lea -0x80(%rsp),%rsp",
            "push %rax",
            "lahf",
            "seto %al",
            "push %rax",
            "push %rcx",
            "push %rsi",
            "push %r11",
            "mov %fs:0x0,%r11",
            "mov %r11,%rcx",
        ]
    );
    // 0x80 + 2 + 3 words down: the original %rax 0x20 up, the return address 0xa8 up.
    let k = l.iter().position(|l| l == "movq $0x4,(%r11)").unwrap();
    assert_eq!(
        l[k + 1..k + 5],
        [
            "mov 0x20(%rsp),%rcx",
            "mov %rcx,0x10(%r11)",
            "mov 0xa8(%rsp),%rcx",
            "mov %rcx,0x18(%r11)"
        ]
    );
    let k = l.iter().position(|l| l == "sahf").unwrap();
    assert_eq!(l[k + 1..k + 4], ["pop %rax", "lea 0x80(%rsp),%rsp", "ret"]);
}
