//! The instruction-set backends. Everything ISA-specific (decoding, deciding whether a
//! site can be patched, relocating displaced instructions, emitting stubs and the
//! injected run-time code) sits behind [`Isa`]; the ELF layout code is shared.

use crate::input::{Function, Input};

pub mod aarch64;
pub mod x86_64;

/// Where the new code and data will live, fixed before any code is emitted.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Link-time address of the RW area (`RwHeader`).
    pub rw_vaddr: u64,
    pub nslots: u32,
    pub buf_bytes: u64,
    pub binary_id: u64,
    /// Install the pre-TLS thread pointer in an entry shim (static executables).
    pub pre_tls: bool,
}

/// How a function entry is patched inline.
#[derive(Clone, Debug)]
pub struct EntryPatch {
    /// Address where the branch to the trampoline is written (after a landing pad:
    /// `endbr64`, `bti c`, `paciasp`).
    pub patch_at: u64,
    /// Bytes overwritten there (the displaced instructions).
    pub len: usize,
    /// The return address register holds a signed pointer at the patch point (AArch64:
    /// after `paciasp`/`pacibsp`); the stub strips the signature before recording it.
    pub signed_lr: bool,
}

/// Addresses of the injected run-time routines.
#[derive(Clone, Copy, Debug)]
pub struct Runtime {
    pub flush: u64,
    pub register: u64,
    /// Entry shim, when the binary needs one.
    pub entry_shim: Option<u64>,
}

pub trait Isa {
    /// `ARCH_*` code stored in the metadata.
    fn arch(&self) -> u32;
    /// Push the targets of the direct branches in `bytes` (code at `addr`).
    fn direct_branch_targets(&self, addr: u64, bytes: &[u8], out: &mut Vec<u64>);
    /// Sorted, deduplicated addresses that some known branch can land on: function
    /// symbols and the direct branches of a linear sweep of every code section.
    fn branch_targets(&self, input: &Input) -> Vec<u64> {
        let mut targets: Vec<u64> = input.functions.iter().map(|f| f.addr).collect();
        for (addr, bytes) in input.code_sections() {
            self.direct_branch_targets(addr, bytes, &mut targets);
        }
        targets.sort_unstable();
        targets.dedup();
        targets
    }
    /// Can this function's entry take an inline stub? `Err` says why not (→ uprobe site).
    fn plan_entry(
        &self,
        input: &Input,
        f: &Function,
        targets: &[u64],
    ) -> Result<EntryPatch, String>;
    /// Where a uprobe goes for a function that is not patched inline: after a
    /// landing pad (`endbr64`, `bti c`, `paciasp`), where the inline branch would go.
    fn probe_addr(&self, input: &Input, f: &Function) -> u64;
    /// Emit flush, register and (if `layout.pre_tls`) the entry shim at `at`.
    fn emit_runtime(
        &self,
        layout: &Layout,
        at: u64,
        original_entry: u64,
    ) -> Result<(Vec<u8>, Runtime), String>;
    /// Emit the trampoline of one function-entry site at `at`: stub, displaced
    /// instructions relocated, branch back.
    fn emit_entry_stub(
        &self,
        input: &Input,
        layout: &Layout,
        rt: &Runtime,
        site_id: u32,
        patch: &EntryPatch,
        at: u64,
    ) -> Result<Vec<u8>, String>;
    /// The bytes written over the displaced range: a branch to `to`, then padding.
    fn patch_bytes(&self, from: u64, to: u64, len: usize) -> Result<Vec<u8>, String>;
    /// Byte that pads between trampolines (never executed): a trap where possible.
    fn code_fill(&self) -> u8;
    /// Alignment the new segments need (page size the binaries assume).
    fn segment_align(&self) -> u64;
}
