//! x86-64 backend: iced-x86 decodes the input and encodes stubs and relocated
//! instructions.
//!
//! Register and flag discipline of the inline stub: it moves below the red zone
//! (`lea -128(%rsp)`), saves the five registers it uses with push/pop, and only uses
//! instructions that leave RFLAGS alone (`mov`, `lea`, `not`, `movzx`, `push`, `pop`,
//! `rdtsc`, `jrcxz`, `jmp`, `call`): comparisons are `not` + `lea` + `jrcxz`. The
//! out-of-line register routine saves RFLAGS itself.

mod runtime;
mod stub;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind};

use super::{EntryPatch, Isa, Layout, Runtime};
use crate::input::{Function, Input};

pub struct X86_64;

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// `jmp rel32`.
pub const JMP_LEN: usize = 5;

/// Decode the instructions that a patch at `at` would displace (at least `JMP_LEN`
/// bytes), never past `limit`.
fn displaced(bytes: &[u8], at: u64, limit: u64) -> Result<Vec<Instruction>, String> {
    let avail = (limit.saturating_sub(at) as usize).min(bytes.len());
    let mut dec = Decoder::with_ip(64, &bytes[..avail], at, DecoderOptions::NONE);
    let mut out = Vec::new();
    let mut len = 0usize;
    while len < JMP_LEN {
        if !dec.can_decode() {
            return Err(format!("function too short to patch ({len} bytes)"));
        }
        let ins = dec.decode();
        if ins.is_invalid() {
            return Err(format!("undecodable instruction at {:#x}", ins.ip()));
        }
        match ins.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => {
                // The callee would return into the trampoline, where no unwind
                // information describes the frame.
                return Err(format!("call at {:#x} in the displaced bytes", ins.ip()));
            }
            FlowControl::Interrupt | FlowControl::Exception => {
                return Err(format!(
                    "trap instruction at {:#x} in the displaced bytes",
                    ins.ip()
                ));
            }
            _ => {}
        }
        len += ins.len();
        out.push(ins);
    }
    Ok(out)
}

impl Isa for X86_64 {
    fn arch(&self) -> u32 {
        tracer_common::ARCH_X86_64
    }

    fn probe_addr(&self, input: &Input, f: &Function) -> u64 {
        match input.bytes_at(f.addr) {
            Some(b) if b.starts_with(&ENDBR64) => f.addr + 4,
            _ => f.addr,
        }
    }

    fn direct_branch_targets(&self, addr: u64, bytes: &[u8], out: &mut Vec<u64>) {
        let mut dec = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
        let mut ins = Instruction::default();
        while dec.can_decode() {
            dec.decode_out(&mut ins);
            match ins.flow_control() {
                FlowControl::UnconditionalBranch
                | FlowControl::ConditionalBranch
                | FlowControl::Call
                | FlowControl::XbeginXabortXend => {
                    if matches!(ins.op0_kind(), OpKind::NearBranch64) {
                        out.push(ins.near_branch_target());
                    }
                }
                _ => {}
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
        let bytes = input
            .bytes_at(f.addr)
            .ok_or("not in a file-backed segment")?;
        let end = f.addr + f.size;
        let at = if bytes.starts_with(&ENDBR64) {
            f.addr + 4
        } else {
            f.addr
        };
        let skip = (at - f.addr) as usize;
        let ins = displaced(&bytes[skip..], at, end)?;
        let len: usize = ins.iter().map(|i| i.len()).sum();
        let lo = targets.partition_point(|&t| t <= at);
        if let Some(&t) = targets.get(lo).filter(|&&t| t < at + len as u64) {
            return Err(format!("branch target {t:#x} inside the displaced bytes"));
        }
        Ok(EntryPatch {
            patch_at: at,
            len,
            signed_lr: false,
        })
    }

    fn emit_runtime(
        &self,
        layout: &Layout,
        at: u64,
        original_entry: u64,
    ) -> Result<(Vec<u8>, Runtime), String> {
        runtime::emit(layout, at, original_entry).map_err(|e| e.to_string())
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
        let bytes = input
            .bytes_at(patch.patch_at)
            .ok_or("site not in a file-backed segment")?;
        let ins = displaced(bytes, patch.patch_at, patch.patch_at + patch.len as u64)?;
        stub::emit_entry(
            layout,
            rt,
            site_id,
            &ins,
            patch.patch_at + patch.len as u64,
            at,
        )
        .map_err(|e| e.to_string())
    }

    fn patch_bytes(&self, from: u64, to: u64, len: usize) -> Result<Vec<u8>, String> {
        let rel = to.wrapping_sub(from + JMP_LEN as u64) as i64;
        let rel32 = i32::try_from(rel)
            .map_err(|_| format!("trampoline at {to:#x} out of jmp rel32 range from {from:#x}"))?;
        let mut out = vec![0xe9];
        out.extend_from_slice(&rel32.to_le_bytes());
        // Nothing can land in the rest of the displaced range (checked), so trap there.
        out.resize(len, 0xcc);
        Ok(out)
    }

    fn code_fill(&self) -> u8 {
        0xcc // int3
    }

    fn segment_align(&self) -> u64 {
        0x1000
    }
}
