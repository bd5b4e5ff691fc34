//! Planning: which instructions a site's window displaces, the landings left in a
//! displaced range, the bytes written over it, and re-pointed jumps (checked against
//! objdump).

use super::super::{X86_64, jmp_rel32, place_landings, rel32_jump};
use super::{Image, TEXT, func, objdump_or_skip};
use crate::flow::Flow;
use crate::isa::{Entered, FunctionPlan, Isa, Landing, SiteReq, Window};
use tracer_common::meta::{FallbackReason, SiteKind};

pub(super) fn req(id: u32, kind: SiteKind, addr: u64) -> SiteReq {
    SiteReq {
        id,
        kind,
        addr,
        args: Vec::new(),
        frame: None,
    }
}

/// Plan `reqs` in the image's first function, its targets from a sweep.
pub(super) fn plan(img: &Image, reqs: &[SiteReq]) -> FunctionPlan {
    let input = img.input();
    let targets = X86_64.branch_targets(&input, &Flow::default());
    X86_64.plan_function(&input, func(&input), reqs, &targets, None, false, 0)
}

/// `(start, len, code_len)` of each window.
fn spans(p: &FunctionPlan) -> Vec<(u64, usize, usize)> {
    p.windows
        .iter()
        .map(|w| (w.start, w.len, w.code_len))
        .collect()
}

#[test]
fn an_entry_window_covers_whole_instructions_after_the_landing_pad() {
    // push %rbp; mov %rsp,%rbp; mov %edi,%eax; pop %rbp; ret
    let body = [0x55, 0x48, 0x89, 0xe5, 0x89, 0xf8, 0x5d, 0xc3];
    let p = plan(
        &Image::function(&body),
        &[req(1, SiteKind::FunctionEntry, TEXT)],
    );
    assert_eq!(spans(&p), vec![(TEXT, 6, 6)]);
    let s = &p.windows[0].sites[0];
    assert_eq!((s.id, s.at), (1, TEXT));
    // The function writes neither RFLAGS nor %r11: its callers may keep values there.
    assert!(s.keep_flags && s.keep_r11);
    // With endbr64 first, the window starts after it.
    let ibt = [&[0xf3, 0x0f, 0x1e, 0xfa][..], &body].concat();
    let p = plan(
        &Image::function(&ibt),
        &[req(1, SiteKind::FunctionEntry, TEXT)],
    );
    assert_eq!(spans(&p), vec![(TEXT + 4, 6, 6)]);
    assert_eq!(p.windows[0].sites[0].at, TEXT + 4);
    let input = Image::function(&ibt);
    let input = input.input();
    let r = req(1, SiteKind::FunctionEntry, TEXT);
    assert_eq!(X86_64.probe_addr(&input, func(&input), &r), TEXT + 4);
}

#[test]
fn a_last_ret_takes_the_padding_after_the_function() {
    // xor %eax,%eax; ret; then int3 up to the next function at TEXT + 0x10.
    let mut img = Image::function(&[0x31, 0xc0, 0xc3]);
    img.functions.push((TEXT + 0x10, 1, "g"));
    let p = plan(&img, &[req(7, SiteKind::FunctionExit, TEXT + 2)]);
    assert_eq!(spans(&p), vec![(TEXT + 2, 5, 1)]);
    // xor writes the flags: the exit stub may clobber them.
    assert!(!p.windows[0].sites[0].keep_flags);
    // Without padding (the next function right after), no room; and backwards, the
    // function's start comes first.
    let mut img = Image::function(&[0x31, 0xc0, 0xc3]);
    img.functions.push((TEXT + 3, 1, "g"));
    let p = plan(&img, &[req(7, SiteKind::FunctionExit, TEXT + 2)]);
    assert!(p.windows.is_empty());
    assert_eq!(p.uprobes.len(), 1);
    assert!(
        matches!(&p.uprobes[0].1, FallbackReason::Detail(d) if d.contains("too few bytes before it"))
    );
}

#[test]
fn sites_that_are_not_what_they_claim_fall_back_to_uprobes() {
    // lea 8(%rdi),%rax; int3; ret — and the next function right after.
    let body = [0x48, 0x8d, 0x47, 0x08, 0xcc, 0xc3];
    let mut img = Image::function(&body);
    img.functions.push((TEXT + 6, 1, "g"));
    let p = plan(
        &img,
        &[
            req(1, SiteKind::Memory, TEXT),
            req(2, SiteKind::Block, TEXT + 1),
            req(3, SiteKind::FunctionExit, TEXT + 5),
        ],
    );
    assert!(p.windows.is_empty());
    assert_eq!(p.uprobes[0], (1, FallbackReason::NotMemoryAccess));
    assert!(matches!(&p.uprobes[1].1, FallbackReason::Detail(d) if d.contains("boundary")));
    assert!(matches!(&p.uprobes[2].1, FallbackReason::Detail(d) if d.contains("trap")));
}

#[test]
fn a_call_may_only_end_a_window() {
    // call g; mov %eax,%ebx; ret — the entry window is the call alone.
    let body = [0xe8, 0xfb, 0x00, 0x00, 0x00, 0x89, 0xc3, 0xc3];
    let p = plan(
        &Image::function(&body),
        &[req(1, SiteKind::FunctionEntry, TEXT)],
    );
    assert_eq!(spans(&p), vec![(TEXT, 5, 5)]);
    // nop; call g; nop; ret: the entry window ends with the call.
    let body = [0x90, 0xe8, 0xfa, 0x00, 0x00, 0x00, 0x90, 0xc3];
    let mut img = Image::function(&body);
    img.functions.push((TEXT + 8, 1, "g"));
    let p = plan(&img, &[req(1, SiteKind::FunctionEntry, TEXT)]);
    assert_eq!(spans(&p), vec![(TEXT, 6, 6)]);
    // Backward from the ret: the call would not be last, and its return address has
    // no room for a landing.
    let p = plan(&img, &[req(2, SiteKind::FunctionExit, TEXT + 7)]);
    assert!(p.windows.is_empty());
    assert!(matches!(&p.uprobes[0].1, FallbackReason::Detail(d) if d.contains("call at 0x401001")));
}

/// `xor %eax,%eax; L1: inc %eax; nop; L2: cmp $10,%eax; jne L1; ret`, and `g` at
/// TEXT + 0x20: `jmp L2`.
pub(super) fn loop_with_a_way_in() -> Image {
    let f = [
        0x31, 0xc0, 0xff, 0xc0, 0x90, 0x83, 0xf8, 0x0a, 0x75, 0xf8, 0xc3,
    ];
    let mut img = Image::function(&f);
    // jmp L2 from TEXT + 0x20: rel = 0x401005 - 0x401025.
    img.put(TEXT + 0x20, &[0xe9, 0xe0, 0xff, 0xff, 0xff]);
    img.functions.push((TEXT + 0x20, 5, "g"));
    img
}

#[test]
fn a_window_grows_over_a_local_loop_and_lands_the_jump_from_outside() {
    let img = loop_with_a_way_in();
    let code = &img.bytes[..0x25];
    let lines = objdump_or_skip!(&code[..11], TEXT);
    assert_eq!(
        lines,
        [
            "xor %eax,%eax",
            "inc %eax",
            "nop",
            "cmp $0xa,%eax",
            "jne 0x401002",
            "ret"
        ]
    );
    assert_eq!(
        objdump_or_skip!(&code[0x20..], TEXT + 0x20),
        ["jmp 0x401005"]
    );
    let p = plan(&img, &[req(1, SiteKind::FunctionEntry, TEXT)]);
    // [xor .. jne]: the loop's own jump moves with its target; the jump from g
    // lands at L2.
    assert_eq!(spans(&p), vec![(TEXT, 10, 10)]);
    assert_eq!(
        p.windows[0].landings,
        vec![Landing {
            target: TEXT + 5,
            hop: None
        }]
    );
}

#[test]
fn landings_direct_or_by_a_hop() {
    // Room for a 5-byte jump at 0x1008, not at 0x1005 (the next target is 3 bytes on):
    // a 2-byte hop there to a jump in the unused bytes after 0x1008's.
    assert_eq!(
        place_landings(0x1000, 0x1014, &[0x1005, 0x1008]),
        Some(vec![
            Landing {
                target: 0x1008,
                hop: None
            },
            Landing {
                target: 0x1005,
                hop: Some(0x100d)
            },
        ])
    );
    // A target among the first 5 bytes (the jump to the trampoline) or with less
    // than 2 bytes of room: none.
    assert_eq!(place_landings(0x1000, 0x1010, &[0x1004]), None);
    assert_eq!(place_landings(0x1000, 0x1010, &[0x1005, 0x1006]), None);
    // No unused 5 bytes left for the hop's jump.
    assert_eq!(place_landings(0x1000, 0x100c, &[0x1005, 0x1008]), None);
}

#[test]
fn patch_bytes_jump_land_and_trap() {
    let w = Window {
        start: 0x1000,
        len: 0x14,
        code_len: 0x14,
        sites: Vec::new(),
        landings: vec![
            Landing {
                target: 0x1008,
                hop: None,
            },
            Landing {
                target: 0x1005,
                hop: Some(0x100d),
            },
        ],
        tails: Vec::new(),
        entered_by: Vec::new(),
    };
    let bytes = X86_64
        .patch_bytes(&w, 0x50_0000, &[0x50_0100, 0x50_0200])
        .unwrap();
    assert_eq!(bytes.len(), 0x14);
    let lines = objdump_or_skip!(&bytes, 0x1000);
    assert_eq!(
        lines,
        [
            "jmp 0x500000",
            "jmp 0x100d",
            "int3",
            "jmp 0x500100",
            "jmp 0x500200",
            "int3",
            "int3"
        ]
    );
    // Out of rel32 range.
    assert!(jmp_rel32(0x1000, 0x1000 + (1 << 32)).is_err());
    assert_eq!(jmp_rel32(0x1000, 0x1005).unwrap(), [0xe9, 0, 0, 0, 0]);
}

#[test]
fn jumps_with_a_rel32_are_repointed_in_place() {
    // jmp rel32 to L; jne rel32 to L; jmp rel8 to L (no room to re-point); L: ret.
    let code = [
        0xe9, 0x08, 0x00, 0x00, 0x00, 0x0f, 0x85, 0x02, 0x00, 0x00, 0x00, 0xeb, 0x00, 0xc3,
    ];
    let l = TEXT + 13;
    let lines = objdump_or_skip!(&code, TEXT);
    assert_eq!(
        lines,
        ["jmp 0x40100d", "jne 0x40100d", "jmp 0x40100d", "ret"]
    );
    let img = Image::new(&code);
    let input = img.input();
    let e = rel32_jump(&input, TEXT, l).unwrap();
    assert_eq!(e, Entered { at: TEXT, len: 5 });
    let e2 = rel32_jump(&input, TEXT + 5, l).unwrap();
    assert_eq!(
        e2,
        Entered {
            at: TEXT + 5,
            len: 6
        }
    );
    assert_eq!(rel32_jump(&input, TEXT + 11, l), None);
    // A jump elsewhere is not one to `l`.
    assert_eq!(rel32_jump(&input, TEXT, l + 1), None);
    let mut patched = code.to_vec();
    for e in [e, e2] {
        let (at, bytes) = X86_64.repoint(&e, 0x50_0000).unwrap();
        let off = (at - TEXT) as usize;
        patched[off..off + bytes.len()].copy_from_slice(&bytes);
    }
    let lines = objdump_or_skip!(&patched, TEXT);
    assert_eq!(
        lines,
        ["jmp 0x500000", "jne 0x500000", "jmp 0x40100d", "ret"]
    );
    assert!(X86_64.repoint(&e, TEXT + (1 << 32)).is_err());
}

#[test]
fn with_unsure_targets_only_the_entry_and_a_last_ret_get_windows() {
    // push %rbx; mov %rdi,%rbx; mov (%rbx),%eax; add $1,%eax; pop %rbx; ret
    let body = [
        0x53, 0x48, 0x89, 0xfb, 0x8b, 0x03, 0x83, 0xc0, 0x01, 0x5b, 0xc3,
    ];
    let img = Image::function(&body);
    let input = img.input();
    let targets = X86_64.branch_targets(&input, &Flow::default());
    let why = FallbackReason::UnresolvedJump { at: 0x40_2000 };
    let reqs = [
        req(1, SiteKind::FunctionEntry, TEXT),
        req(2, SiteKind::Block, TEXT + 6),
        req(3, SiteKind::FunctionExit, TEXT + 10),
    ];
    let p = X86_64.plan_function(&input, func(&input), &reqs, &targets, Some(&why), false, 0);
    // The ret's window is forward, over the padding: nothing inside can be entered.
    assert_eq!(spans(&p), vec![(TEXT, 6, 6), (TEXT + 10, 5, 1)]);
    assert_eq!(p.uprobes, vec![(2, why.clone())]);
    // Sure of the targets, the block gets its window too.
    let p = X86_64.plan_function(&input, func(&input), &reqs, &targets, None, false, 0);
    assert!(p.uprobes.is_empty());
    assert!(p.windows.iter().any(|w| w.sites.iter().any(|s| s.id == 2)));
}

#[test]
fn a_short_split_off_part_is_entered_by_its_rel32_jumps() {
    // f.cold: mov %eax,%ebx; ret — and right after it g: jmp f.cold
    let code = [0x89, 0xc3, 0xc3, 0xe9, 0xf8, 0xff, 0xff, 0xff];
    let lines = objdump_or_skip!(&code, TEXT);
    assert_eq!(lines, ["mov %eax,%ebx", "ret", "jmp 0x401000"]);
    let mut img = Image::new(&code);
    img.functions.push((TEXT, 3, "f.cold"));
    img.functions.push((TEXT + 3, 5, "g"));
    let input = img.input();
    let targets = X86_64.branch_targets(&input, &Flow::default());
    let reqs = [req(1, SiteKind::Block, TEXT)];
    let f = func(&input);
    let p = X86_64.plan_function(&input, f, &reqs, &targets, None, false, 0);
    assert_eq!(p.windows.len(), 0);
    // As a part: a window over the run that nothing is written at, its jumps
    // re-pointed.
    let p = X86_64.plan_function(&input, f, &reqs, &targets, None, true, 0);
    assert_eq!(spans(&p), vec![(TEXT, 0, 3)]);
    let w = &p.windows[0];
    assert_eq!(
        w.entered_by,
        vec![Entered {
            at: TEXT + 3,
            len: 5
        }]
    );
    assert_eq!((w.sites[0].id, w.sites[0].at), (1, TEXT));
    assert!(p.uprobes.is_empty());
    // A rel8 jump to it cannot be re-pointed: the site stays a uprobe.
    let mut img = Image::new(&[0x89, 0xc3, 0xc3, 0xeb, 0xfb]);
    img.functions.push((TEXT, 3, "f.cold"));
    img.functions.push((TEXT + 3, 2, "g"));
    let input = img.input();
    let targets = X86_64.branch_targets(&input, &Flow::default());
    let p = X86_64.plan_function(&input, func(&input), &reqs, &targets, None, true, 0);
    assert!(p.windows.is_empty());
    assert_eq!(p.uprobes.len(), 1);
}
