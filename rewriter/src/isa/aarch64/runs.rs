//! AArch64 access runs (`isa::runs`): which registers an address reads and a word
//! writes. Registers: x0..x30 are bits 0..30, sp bit 31 (a base field's numbering; an
//! index or a destination field's 31 is xzr, never written).
//!
//! There is no full decoder of what a word writes: a load/store writes its loaded
//! register(s) and a written-back base; a data-processing word of the classes below
//! writes its first operand when that is a general register (`Rd`, `Rd_SP`: bits 0..4;
//! a comparison's first operand is a source, an FP/SIMD destination no general
//! register); any other word is taken to write every register. Exclusive and atomic
//! accesses are never members and end runs, like every branch, call, trap and word
//! that `reloc::classify` refuses.

use disarm64::InsnOpcode;
use disarm64::decoder;

use super::super::runs::{self, RegSet, RunInsn, RunStats};
use super::reloc::{self, Class};
use super::{Body, INSN, mem, word_at};
use crate::isa::{Candidate, Targets};
use tracer_common::meta::{FallbackReason, SiteKind};

/// Every register: what a word not understood writes.
const ALL: RegSet = (1 << 32) - 1;

/// A base field's register: x0..x30 or sp.
fn base_bit(r: u32) -> RegSet {
    1 << (r & 31)
}

/// A field where 31 is xzr.
fn zr_bit(r: u32) -> RegSet {
    if r & 31 == 31 { 0 } else { 1 << (r & 31) }
}

/// Data-processing classes whose only register written (flags aside) is the first
/// operand, when it is a general register, at bits 0..4.
const RD_CLASSES: &[&str] = &[
    "ADDSUB_CARRY",
    "ADDSUB_EXT",
    "ADDSUB_IMM",
    "ADDSUB_SHIFT",
    "BITFIELD",
    "CONDCMP_IMM",
    "CONDCMP_REG",
    "CONDSEL",
    "CSSC",
    "DP_1SRC",
    "DP_2SRC",
    "DP_3SRC",
    "EXTRACT",
    "FLOAT2FIX",
    "FLOAT2INT",
    "FLOATCCMP",
    "FLOATCMP",
    "FLOATDP1",
    "FLOATDP2",
    "FLOATDP3",
    "FLOATIMM",
    "FLOATSEL",
    "LOG_IMM",
    "LOG_SHIFT",
    "MOVEWIDE",
    "PCRELADDR",
    "ASIMDALL",
    "ASIMDDIFF",
    "ASIMDELEM",
    "ASIMDEXT",
    "ASIMDIMM",
    "ASIMDINS",
    "ASIMDMISC",
    "ASIMDPERM",
    "ASIMDSAME",
    "ASIMDSHF",
    "ASIMDTBL",
    "ASISDDIFF",
    "ASISDELEM",
    "ASISDMISC",
    "ASISDONE",
    "ASISDPAIR",
    "ASISDSAME",
    "ASISDSHF",
];

/// The disarm64 class name of `w`, if it decodes.
fn class_of(w: u32) -> Option<&'static str> {
    Some(decoder::decode(w)?.definition().class.into())
}

/// Exclusive and atomic accesses: never in a run.
fn exclusive_or_atomic(class: &str) -> bool {
    matches!(class, "LDSTEXCL" | "LSE_ATOMIC" | "LSE128_ATOMIC" | "RCPC3")
}

/// The registers the word `w` at `pc` writes (a superset; see the module comment).
pub(super) fn writes(w: u32, pc: u64) -> RegSet {
    let Some(op) = decoder::decode(w) else {
        return ALL;
    };
    let def = op.definition();
    let class: &'static str = def.class.into();
    if exclusive_or_atomic(class) {
        return ALL;
    }
    if let Some(m) = mem::classify(w, pc) {
        return mem_writes(w, &m, class);
    }
    if let Some(set) = system_writes(w, def.mnemonic) {
        return set;
    }
    if !RD_CLASSES.contains(&class) {
        return ALL;
    }
    let first: Option<&'static str> = def.operands.first().map(|o| o.kind.into());
    match first {
        Some("Rd") => zr_bit(w),
        Some("Rd_SP") => base_bit(w),
        _ => 0,
    }
}

/// What the hints, `mrs` and prefetches write (None: not one of them). Hints: only
/// the pointer-authentication ones write a register (x17 or x30); unknown hints all.
fn system_writes(w: u32, mnemonic: &str) -> Option<RegSet> {
    if w & 0xffff_f01f == 0xd503_201f {
        return Some(match (w >> 5) & 0x7f {
            // nop, yield, wfe, wfi, sev, sevl, dgh; esb, psb, tsb, csdb; bti.
            0..=6 | 16..=18 | 20 | 32 | 34 | 36 | 38 => 0,
            // xpaclri, [pac|aut][ia|ib]1716, [pac|aut][ia|ib][z|sp].
            7 | 8 | 10 | 12 | 14 | 24..=31 => 1 << 17 | 1 << 30,
            _ => ALL,
        });
    }
    match mnemonic {
        "mrs" => Some(zr_bit(w)),
        "prfm" | "prfum" => Some(0),
        _ => None,
    }
}

/// What a load/store writes: its loaded general register(s) and a written-back base.
fn mem_writes(w: u32, m: &mem::MemAccess, class: &str) -> RegSet {
    let simd = class.starts_with("ASISD") || (class != "LDST_IMM10" && w >> 26 & 1 == 1);
    let pair = matches!(
        class,
        "LDSTPAIR_OFF" | "LDSTPAIR_INDEXED" | "LDSTNAPAIR_OFFS"
    );
    let mut set = 0;
    if m.read && !simd {
        set |= zr_bit(w);
        if pair {
            set |= zr_bit(w >> 10);
        }
    }
    let writeback = match class {
        "LDST_IMM9" | "LDSTPAIR_INDEXED" | "ASISDLSEP" | "ASISDLSOP" => true,
        "LDST_IMM10" => w >> 11 & 1 == 1,
        _ => m.addr == mem::Addr::PostIndex,
    };
    if writeback {
        set |= base_bit(u32::from(m.base));
    }
    set
}

/// The registers the address of `m` reads.
fn address_regs(m: &mem::MemAccess) -> RegSet {
    match m.addr {
        mem::Addr::Literal(_) => 0,
        mem::Addr::Reg { rm, .. } => base_bit(u32::from(m.base)) | zr_bit(u32::from(rm)),
        mem::Addr::Offset(_) | mem::Addr::PostIndex => base_bit(u32::from(m.base)),
    }
}

/// Control may not fall through `w`, or it is an access that no run holds.
fn leaves(w: u32, pc: u64) -> bool {
    let stops = matches!(
        reloc::classify(w, pc),
        Class::Refuse(_)
            | Class::Bl { .. }
            | Class::Blr { .. }
            | Class::LoadExclusive
            | Class::StoreExclusive
    );
    stops || reloc::transfers(w, pc) || class_of(w).is_none_or(exclusive_or_atomic)
}

/// The run facts of the word `w` at `pc`; `site`: the memory candidate there, if any.
fn fact(w: u32, pc: u64, targets: &Targets, site: Option<&Candidate>) -> RunInsn {
    let leaves = leaves(w, pc);
    let member = site
        .filter(|c| c.window.is_ok() && !leaves)
        .and_then(|_| mem::classify(w, pc))
        .map(|m| address_regs(&m));
    RunInsn {
        target: targets.all.binary_search(&pc).is_ok(),
        leaves,
        member,
        head: member.is_some(),
        writes: writes(w, pc),
        // No shifts: a register moved by an `add` counts as written.
        shift: None,
    }
}

/// Group `cands`' memory sites into runs of at most `cap` accesses: each member gets
/// its stub placed at the head's instruction (`Candidate::at`; `insn` stays its own) and
/// needs no window of its own.
pub(super) fn batch(
    body: &Body,
    targets: &Targets,
    cands: &mut [Candidate],
    cap: usize,
) -> RunStats {
    let n = body.size / INSN;
    let mut site_of = vec![None; n];
    for (k, c) in cands.iter().enumerate() {
        let i = c.insn.checked_sub(body.addr).map(|d| d as usize / INSN);
        if let Some(i) = i.filter(|&i| c.req.kind == SiteKind::Memory && c.flags != 0 && i < n) {
            site_of[i] = Some(k);
        }
    }
    let facts: Vec<RunInsn> = (0..n)
        .map(|i| {
            let pc = body.addr + (i * INSN) as u64;
            match word_at(body.bytes, i * INSN) {
                Some(w) => fact(w, pc, targets, site_of[i].map(|k| &cands[k])),
                None => RunInsn {
                    leaves: true,
                    writes: ALL,
                    ..RunInsn::default()
                },
            }
        })
        .collect();
    let (found, stats) = runs::find(&facts, cap);
    for run in found {
        let Some(head) = site_of[run[0].at].map(|k| cands[k].at) else {
            continue;
        };
        for m in &run[1..] {
            if let Some(k) = site_of[m.at] {
                cands[k].at = head;
                cands[k].window = Err(FallbackReason::NoWindow);
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::super::enc::tests::objdump;
    use super::super::mem::tests::assemble;
    use super::super::stub;
    use super::*;
    use crate::isa::{IndexWhy, Layout, PlacedSite, Runtime, SiteReq, SlotLookup, merge_windows};
    use tracer_common::meta::TimeMode;
    use tracer_common::{BUF_TRACE, FLAG_MEM_PAIR, FLAG_MEM_READ, FLAG_MEM_WRITE, FLAG_MEM2_READ};

    const PC: u64 = 0x40_1000;

    fn x(regs: &[u32]) -> RegSet {
        regs.iter().fold(0, |s, r| s | 1 << r)
    }

    macro_rules! words_or_skip {
        ($lines:expr) => {
            match assemble($lines) {
                Some(w) => w,
                None => {
                    eprintln!("aarch64-linux-gnu-as not installed; skipped");
                    return;
                }
            }
        };
    }

    #[test]
    fn what_a_word_writes() {
        const SP: u32 = 31;
        let rows: &[(&str, RegSet)] = &[
            ("add x1, x2, #8", x(&[1])),
            ("add sp, sp, #16", x(&[SP])),
            ("mov x4, sp", x(&[4])),
            ("mov sp, x4", x(&[SP])),
            ("cmp x1, #3", 0),
            ("subs x3, x1, x2", x(&[3])),
            ("tst w1, #0xff", 0),
            ("and sp, x1, #0xff", x(&[SP])),
            ("mov x4, x5", x(&[4])),
            ("movz w4, #1, lsl #16", x(&[4])),
            ("adrp x6, .", x(&[6])),
            ("adr x6, .", x(&[6])),
            ("lsl x7, x8, #3", x(&[7])),
            ("madd x7, x1, x2, x3", x(&[7])),
            ("udiv w8, w1, w2", x(&[8])),
            ("rev x9, x9", x(&[9])),
            ("csel w8, w1, w2, eq", x(&[8])),
            ("ccmp x1, x2, #0, ne", 0),
            ("adc x3, x3, xzr", x(&[3])),
            ("fadd d0, d1, d2", 0),
            ("fcmp d0, d1", 0),
            ("fmov d0, x10", 0),
            ("fmov x10, d0", x(&[10])),
            ("fcvtzs w11, s0", x(&[11])),
            ("umov w9, v0.s[1]", x(&[9])),
            ("add v0.4s, v1.4s, v2.4s", 0),
            ("irg sp, x1", x(&[SP])),
            // Loads: the loaded registers and a written-back base; stores: the base.
            ("ldr x1, [x2, #8]", x(&[1])),
            ("ldr x1, [x2], #8", x(&[1, 2])),
            ("ldr x1, [x2, #8]!", x(&[1, 2])),
            ("ldrsw x1, [x2, x3, lsl #2]", x(&[1])),
            ("ldp x1, x3, [sp, #16]", x(&[1, 3])),
            ("ldp x29, x30, [sp], #16", x(&[29, 30, SP])),
            ("stp x29, x30, [sp, #-16]!", x(&[SP])),
            ("str x1, [x2, x3, lsl #3]", 0),
            ("ldr d0, [x1, #8]", 0),
            ("ldp q0, q1, [x1]", 0),
            ("ldr q0, [x1], #16", x(&[1])),
            ("ld1 {v0.16b}, [x1], #16", x(&[1])),
            ("ldraa x0, [x1, #8]!", x(&[0, 1])),
            ("ldraa x0, [x1, #8]", x(&[0])),
            ("ldr x0, . + 8", x(&[0])),
            ("ldr wzr, [x1]", 0),
            // Not understood: everything.
            ("nop", 0),
            ("bti c", 0),
            ("paciasp", x(&[17, 30])),
            ("autia1716", x(&[17, 30])),
            ("mrs x0, tpidr_el0", x(&[0])),
            ("prfm pldl1keep, [x1, #64]", 0),
            ("prfm pldl1keep, [x1, x2]", 0),
            ("hint #40", ALL),
            ("msr tpidr_el0, x0", ALL),
            ("ldxr x0, [x1]", ALL),
            ("ldadd x0, x1, [x2]", ALL),
            ("bl .", ALL),
            ("svc #0", ALL),
        ];
        let lines: Vec<&str> = rows.iter().map(|r| r.0).collect();
        let words = words_or_skip!(&lines);
        for ((line, want), w) in rows.iter().zip(words) {
            assert_eq!(writes(w, PC), *want, "{line}: {:#x}", writes(w, PC));
        }
    }

    #[test]
    fn branches_calls_traps_and_exclusive_or_atomic_accesses_end_runs() {
        let rows: &[(&str, bool)] = &[
            ("b .", true),
            ("bl .", true),
            ("ret", true),
            ("br x1", true),
            ("blr x1", true),
            ("cbz x0, .", true),
            ("tbnz w0, #3, .", true),
            ("b.ne .", true),
            ("svc #0", true),
            ("brk #1", true),
            ("udf #0", true),
            ("ldxr x0, [x1]", true),
            ("stlxr w2, x0, [x1]", true),
            ("ldar x0, [x1]", true),
            ("ldadd x0, x1, [x2]", true),
            ("cas x0, x1, [x2]", true),
            ("ldr q0, . + 8", true),
            ("ldr x0, [x1]", false),
            ("add x0, x0, #1", false),
            ("nop", false),
        ];
        let lines: Vec<&str> = rows.iter().map(|r| r.0).collect();
        let words = words_or_skip!(&lines);
        for ((line, want), w) in rows.iter().zip(words) {
            assert_eq!(leaves(w, PC), *want, "{line}");
        }
    }

    fn req(id: u32, addr: u64) -> SiteReq {
        SiteReq {
            id,
            kind: SiteKind::Memory,
            addr,
            args: Vec::new(),
            frame: None,
        }
    }

    /// `lines` as a function at PC with a memory site at each word of `at` (ids from
    /// 1), batched with `cap`: the candidates and what was found.
    fn batched(
        words: &[u32],
        at: &[usize],
        targets: &Targets,
        cap: usize,
    ) -> (Vec<Candidate>, RunStats) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let body = Body::new(PC, &bytes, bytes.len() as u64);
        let mut cands: Vec<Candidate> = (at.iter().zip(1..))
            .map(|(&i, id)| body.candidate(&req(id, PC + 4 * i as u64), targets))
            .collect();
        let stats = batch(&body, targets, &mut cands, cap);
        (cands, stats)
    }

    const LOOP: &[&str] = &[
        "ldr w1, [x0]",             // 0: head (site 1)
        "ldr w2, [x0, #4]",         // 1: member (site 2)
        "add w1, w1, w2",           // 2
        "str w1, [x3, x4, lsl #2]", // 3: member (site 3)
        "add x0, x0, #8",           // 4: writes x0
        "ldr w5, [x0]",             // 5: a run starts (site 4)
        "ldr x6, [sp, #8]",         // 6: member (site 5)
        "ret",                      // 7
    ];

    #[test]
    fn members_are_recorded_at_the_head_until_an_address_register_is_written() {
        let words = words_or_skip!(LOOP);
        let (cands, stats) = batched(&words, &[0, 1, 3, 5, 6], &Targets::default(), 4);
        let at: Vec<(u32, u64, u64, bool)> = (cands.iter())
            .map(|c| (c.req.id, c.at, c.insn, c.window.is_ok()))
            .collect();
        assert_eq!(
            at,
            [
                (1, PC, PC, true),
                (2, PC, PC + 4, false),
                (3, PC, PC + 12, false),
                (4, PC + 20, PC + 20, true),
                (5, PC + 20, PC + 24, false),
            ]
        );
        assert_eq!(stats.by_len.get(&3), Some(&1));
        assert_eq!(stats.by_len.get(&2), Some(&1));
        assert_eq!(stats.ends.get(&runs::RunEnd::AddressWritten), Some(&1));
        // A branch target at site 2's word: it starts a run of its own; the cap.
        let t = Targets {
            all: vec![PC + 4],
            ..Targets::default()
        };
        let (cands, stats) = batched(&words, &[0, 1, 3, 5, 6], &t, 4);
        let heads: Vec<u64> = cands.iter().map(|c| c.at).collect();
        assert_eq!(heads, [PC, PC + 4, PC + 4, PC + 20, PC + 20]);
        assert_eq!(stats.ends.get(&runs::RunEnd::BranchTarget), Some(&1));
        let (_, stats) = batched(&words, &[0, 1, 3, 5, 6], &Targets::default(), 2);
        assert_eq!(stats.ends.get(&runs::RunEnd::Cap), Some(&1));
    }

    #[test]
    fn a_run_stops_at_a_call_and_skips_exclusive_accesses() {
        let words = words_or_skip!(&[
            "ldr x1, [x0]",
            "bl .",
            "ldr x2, [x0, #8]",
            "ldar x3, [x0]",
            "ldr x4, [x0, #16]",
        ]);
        let (cands, stats) = batched(&words, &[0, 2, 3, 4], &Targets::default(), 4);
        assert!(cands.iter().all(|c| c.at == c.insn), "no run");
        assert_eq!(stats.runs(), 0);
    }

    fn layout() -> Layout {
        Layout {
            rw_vaddr: 0x80_0000,
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

    #[test]
    fn the_heads_stub_records_the_run_two_accesses_a_record() {
        let words = words_or_skip!(LOOP);
        let (cands, _) = batched(&words, &[0, 1, 3, 5, 6], &Targets::default(), 4);
        let plan = merge_windows(cands, |_| None);
        assert!(plan.uprobes.is_empty());
        assert_eq!(plan.windows.len(), 2, "members need no window");
        let w = &plan.windows[0];
        let sites: Vec<&PlacedSite> = w.sites.iter().collect();
        assert_eq!(sites.len(), 3);
        let members: Vec<(u64, u32)> = (sites.iter().skip(1))
            .map(|s| (s.insn, words[((s.insn - PC) / 4) as usize]))
            .collect();
        const AT: u64 = 0x60_0000;
        let code =
            stub::emit_window(&layout(), &RT, (words[0], PC), &w.sites, &members, AT).unwrap();
        let ws: Vec<u32> = code
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let Some(l) = objdump(&ws, AT) else { return };
        // A frame with one more slot; every address from the registers at the head.
        assert_eq!(
            l[..9],
            [
                "stp x9, x10, [sp, #-80]!",
                "stp x11, x12, [sp, #16]",
                "str x13, [sp, #32]",
                "mov x10, x0",
                "str x10, [sp, #48]",
                "add x10, x0, #0x4",
                "str x10, [sp, #64]",
                "add x10, x3, x4, uxtx #2",
                "str x10, [sp, #72]",
            ]
        );
        // One reservation of two records.
        assert_eq!(l.iter().filter(|l| l.starts_with("ldxr")).count(), 1);
        assert!(l.iter().any(|l| l == "add x12, x11, #0x40"), "{l:#?}");
        // A pair (sites 1 and 2: both addresses), then site 3 alone (its address, its
        // instruction's).
        let pair = FLAG_MEM_PAIR | FLAG_MEM_READ | FLAG_MEM2_READ | 4 << 16 | 4 << 24;
        let single = FLAG_MEM_WRITE | 4 << 16;
        let k = l.iter().position(|l| l == "ldr x10, [sp, #48]").unwrap();
        assert_eq!(
            l[k..k + 6],
            [
                "ldr x10, [sp, #48]",
                "ldr x13, [sp, #64]",
                "stp x10, x13, [x11, #16]",
                "ldr x10, [sp, #72]",
                "adrp x13, 0x401000",
                "add x13, x13, #0xc",
            ]
        );
        assert_eq!(l[k + 6], "stp x10, x13, [x11, #48]");
        // Site and flags (a pair's: both accesses' sizes and directions), then time.
        let k = l.iter().position(|l| l == "ldr w13, [x9, #52]").unwrap();
        let head = |site: u32, flags: u32, rec: &str| {
            [
                format!("mov x10, #{site:#x}"),
                format!("movk x10, #{:#x}, lsl #32", flags & 0xffff),
                format!("movk x10, #{:#x}, lsl #48", flags >> 16),
                format!("stp x10, x13, [x11{rec}]"),
            ]
        };
        assert_eq!(l[k + 1..k + 5], head(1, pair, ""));
        assert_eq!(l[k + 5..k + 9], head(3, single, ", #32"));
        // The frame is released and the head's own word runs, then back.
        assert!(l.contains(&"ldp x9, x10, [sp], #80".to_string()));
        assert!(l.contains(&"ldr w1, [x0]".to_string()));
    }
}
