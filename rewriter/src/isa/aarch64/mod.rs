//! AArch64 backend: disarm64 decodes the input, `enc` hand-encodes the few forms we
//! emit.
//!
//! A site displaces exactly one instruction (after a `bti`/`paci[ab]sp` landing pad,
//! which stays first so that indirect calls and return-address signing work as
//! before) and gets a single `B` to its trampoline (±128 MiB). Register and flag
//! discipline of the stub: it stores x9..x13 below sp (Linux arm64 has no red zone,
//! sp stays 16-byte aligned), never writes NZCV (comparisons are `sub` + `cbz`/`tbz`),
//! and reserves a record with an exclusive load/store pair (no LSE on cortex-a72; the
//! kernel clears the exclusive monitor on exception return, so a signal handler
//! recording in between makes the interrupted `stxr` fail and retry).

mod enc;
mod reloc;
mod runtime;
mod stub;

use super::{EntryPatch, Isa, Layout, Runtime};
use crate::input::{Function, Input};
use reloc::Class;

pub struct Aarch64;

/// Width of the `B` written over the site.
const INSN: usize = 4;

fn word_at(bytes: &[u8], i: usize) -> Option<u32> {
    let b = bytes.get(i..i + INSN)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

impl Isa for Aarch64 {
    fn arch(&self) -> u32 {
        tracer_common::ARCH_AARCH64
    }

    fn direct_branch_targets(&self, addr: u64, bytes: &[u8], out: &mut Vec<u64>) {
        for (i, c) in bytes.chunks_exact(INSN).enumerate() {
            let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if let Some(t) = reloc::branch_target(w, addr + (i * INSN) as u64) {
                out.push(t);
            }
        }
    }

    fn plan_entry(
        &self,
        input: &Input,
        f: &Function,
        targets: &[u64],
    ) -> Result<EntryPatch, String> {
        if f.size == 0 {
            return Err("symbol has no size".into());
        }
        if !f.addr.is_multiple_of(4) {
            return Err("function address not 4-byte aligned".into());
        }
        let bytes = input
            .bytes_at(f.addr)
            .ok_or("not in a file-backed segment")?;
        let size = (f.size as usize).min(bytes.len());
        let first = word_at(bytes, 0)
            .filter(|_| size >= INSN)
            .ok_or("function too short")?;
        let skip = if enc::LANDING_PADS.contains(&first) {
            INSN
        } else {
            0
        };
        let at = f.addr + skip as u64;
        let w = word_at(bytes, skip)
            .filter(|_| size >= skip + INSN)
            .ok_or("function too short to patch after its landing pad")?;
        if let Class::Refuse(why) = reloc::classify(w, at) {
            return Err(format!("{why} at {at:#x}"));
        }
        // Another branch landing on the displaced instruction would run the `B` over
        // it; landing on the site itself (the function start) is fine.
        if at != f.addr && targets.binary_search(&at).is_ok() {
            return Err(format!(
                "branch target {at:#x} is the displaced instruction"
            ));
        }
        // The stub runs its own exclusive pair, which would clear the monitor of a
        // sequence the site sits inside: scan the function for LDXR … STXR ranges.
        let mut open: Option<u64> = None;
        for i in (0..size / INSN * INSN).step_by(INSN) {
            let pc = f.addr + i as u64;
            let Some(wi) = word_at(bytes, i) else { break };
            match reloc::classify(wi, pc) {
                Class::LoadExclusive => open = Some(pc),
                Class::StoreExclusive => {
                    if let Some(start) = open.take()
                        && (start..=pc).contains(&at)
                    {
                        return Err(format!(
                            "inside an exclusive load/store sequence ({start:#x}..{pc:#x})"
                        ));
                    }
                }
                _ => {}
            }
        }
        if open.is_some_and(|start| start <= at) {
            return Err("after a load-exclusive with no store-exclusive".into());
        }
        Ok(EntryPatch {
            patch_at: at,
            len: INSN,
            signed_lr: enc::PAC_PADS.contains(&first),
        })
    }

    fn probe_addr(&self, input: &Input, f: &Function) -> u64 {
        match input.bytes_at(f.addr).and_then(|b| word_at(b, 0)) {
            Some(w) if enc::LANDING_PADS.contains(&w) => f.addr + INSN as u64,
            _ => f.addr,
        }
    }

    fn emit_runtime(
        &self,
        layout: &Layout,
        at: u64,
        original_entry: u64,
    ) -> Result<(Vec<u8>, Runtime), String> {
        runtime::emit(layout, at, original_entry)
    }

    fn emit_entry_stub(
        &self,
        input: &Input,
        layout: &Layout,
        rt: &Runtime,
        site_id: u32,
        patch: &EntryPatch,
        at: u64,
    ) -> Result<Vec<u8>, String> {
        let w = input
            .bytes_at(patch.patch_at)
            .and_then(|b| word_at(b, 0))
            .ok_or("site not in a file-backed segment")?;
        stub::emit_entry(layout, rt, site_id, w, patch, at)
            .map_err(|e| format!("site {:#x}: {e}", patch.patch_at))
    }

    fn patch_bytes(&self, from: u64, to: u64, len: usize) -> Result<Vec<u8>, String> {
        if len != INSN {
            return Err(format!(
                "AArch64 sites displace one instruction, not {len} bytes"
            ));
        }
        let w = enc::b(from, to).ok_or_else(|| {
            format!("trampoline at {to:#x} out of B range (±128 MiB) from {from:#x}")
        })?;
        Ok(w.to_le_bytes().to_vec())
    }

    fn code_fill(&self) -> u8 {
        0 // trampolines are whole words, so the padding is whole `udf #0` words
    }

    fn segment_align(&self) -> u64 {
        // AArch64 binaries are linked for (and kernels may run with) 64 KiB pages.
        0x10000
    }
}
