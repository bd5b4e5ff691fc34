//! The hand-made stand-in for a rewritten binary (`xtask/arm64-vm/standin.c`), with the
//! `.note.utrace` written here.

use std::path::Path;

use anyhow::Result;
use tracer_common::meta::{META_FLAG_PIC, Metadata, Site, SiteKind, SiteMode};

use super::programs::{Elf, LANDING_PADS, cross_gcc, src};
use super::{CROSS_OBJCOPY, Expect, Program, Who};
use crate::util::{self, cmd};

/// The hand-made stand-in, with its `.note.utrace`.
pub(super) fn standin(work: &Path) -> Result<Program> {
    let raw = work.join("standin.raw");
    let out = work.join("standin");
    // standin.c checks its copy of the layout against tracer-common's.
    std::fs::write(
        work.join("utrace_layout.h"),
        tracer_common::c_header::render(),
    )?;
    let include = format!("-I{}", work.display());
    // BTI + PAC code (NOPs on cores without them): probe_target starts with paciasp.
    cross_gcc(
        &raw,
        &src("standin.c"),
        &["-static", "-mbranch-protection=standard", &include],
    )?;
    let elf = Elf::read(&raw)?;
    let meta = metadata(&elf)?;
    let note = work.join("standin.note");
    std::fs::write(&note, meta.to_note())?;
    util::run(
        cmd(CROSS_OBJCOPY)
            .arg(format!("--add-section=.note.utrace={}", note.display()))
            .arg("--set-section-flags=.note.utrace=contents,readonly")
            .arg(&raw)
            .arg(&out),
    )?;
    let (ta, ts, _) = elf.symbol("thread_main")?;
    Ok(Program {
        name: "standin".into(),
        host_path: out,
        binary: "standin".into(),
        args: vec![],
        exit_code: 3,
        expect: expected(ta, ts),
        loose: None,
    })
}

/// The sites: `work` and `main` inline, `probe_target` a uprobe (after its landing pad).
fn sites(elf: &Elf) -> Result<Vec<Site>> {
    let mut sites = Vec::new();
    for (id, sym, mode) in [
        (0, "work", SiteMode::Inline),
        (1, "probe_target", SiteMode::Uprobe),
        (2, "main", SiteMode::Inline),
    ] {
        let (mut vaddr, _, mut file_off) = elf.symbol(sym)?;
        if mode == SiteMode::Uprobe
            && elf
                .word_at_file(file_off)
                .is_some_and(|w| LANDING_PADS.contains(&w))
        {
            vaddr += 4;
            file_off += 4;
        }
        sites.push(Site {
            id,
            vaddr,
            file_off,
            name: sym.into(),
            kind: SiteKind::FunctionEntry,
            mode,
            nargs: 0,
        });
    }
    Ok(sites)
}

/// The stand-in's metadata note, as the rewriter would write it.
fn metadata(elf: &Elf) -> Result<Metadata> {
    let (flush_vaddr, _, flush_file_off) = elf.symbol("utrace_flush")?;
    let (rw_vaddr, _, _) = elf.symbol("utrace_rw")?;
    let sites = sites(elf)?;
    const NSLOTS: u32 = 64;
    const BUF_RECORDS: u32 = 16;
    Ok(Metadata {
        arch: tracer_common::ARCH_AARCH64,
        record_version: tracer_common::RECORD_VERSION,
        record_size: tracer_common::RECORD_SIZE as u32,
        build_id: vec![],
        nslots: NSLOTS,
        buf_records: BUF_RECORDS,
        flags: if elf.is_pic()? { META_FLAG_PIC } else { 0 },
        binary_id: 0x4152_3634_5654_0001,
        flush_vaddr,
        flush_file_off,
        rw_vaddr,
        rw_size: tracer_common::rw_size(
            tracer_common::BUF_TRACE,
            NSLOTS,
            u64::from(BUF_RECORDS) * 32,
        ),
        text_vaddr: 0,
        text_size: 0,
        original_size: elf.data.len() as u64,
        time_mode: Default::default(),
        semaphores: Vec::new(),
        operands: Vec::new(),
        sites,
    })
}

/// What the trace must hold; `thread_main` is at [ta, ta + ts).
fn expected(ta: u64, ts: u64) -> Vec<Expect> {
    let seq = |no: u64, n: u64, every: u64| -> Vec<u64> {
        (0..n)
            .filter(|i| i % every == 0)
            .map(|i| no << 20 | i)
            .collect()
    };
    let mut expect = vec![Expect {
        who: Who::Main,
        symbol: "main",
        uprobe: false,
        values: (0..50).collect(),
        aux: None,
    }];
    for t in 1..=3u64 {
        let n = 100 * t + 7;
        expect.push(Expect {
            who: Who::Thread(t as u32),
            symbol: "work",
            uprobe: false,
            values: seq(t, n, 1),
            aux: None,
        });
        expect.push(Expect {
            who: Who::Thread(t as u32),
            symbol: "probe_target",
            uprobe: true,
            values: seq(t, n, 50),
            aux: Some((ta, ta + ts)),
        });
    }
    expect.push(Expect {
        who: Who::Thread(4),
        symbol: "work",
        uprobe: false,
        values: seq(4, 5, 1),
        aux: None,
    });
    expect
}
