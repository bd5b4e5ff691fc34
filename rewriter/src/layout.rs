//! Where the new segments go, fixed before any code is emitted: the RX segment (new
//! program header table, run-time code, trampolines) after the input's last segment,
//! the RW segment (RwHeader page, then slots and buffers) after the RX bound.
//!
//! The RX segment gets `vaddr = base + offset` (the first PT_LOAD's `vaddr - offset`)
//! whenever the padding that needs stays small, because qemu-user computes AT_PHDR as
//! load base + e_phoff.

use crate::elf::read::{Input, Kind, Phdr, in_user_space};
use crate::isa::{FunctionPlan, IndexWhy, Isa, Layout, SlotLookup};
use crate::plan::SiteInfo;
use crate::{Error, Options, Result};
use tracer_common::{BUF_ALIGN, BUF_FAST_CIRCULAR, FAST_RING_BYTES, RECORD_SIZE, rw_size};

pub(crate) const PHDR_SIZE: u64 = 56;
/// Upper bound of a trampoline without its stubs (relocated instructions, branch back,
/// alignment), and of one stub (x86-64: ~150 bytes, AArch64: ~200); only address space
/// is reserved, so be generous.
const MAX_TRAMPOLINE: u64 = 256;
const MAX_STUB: u64 = 320;
/// Largest padding we accept to keep `vaddr = base + offset` for the new segments.
const MAX_QEMU_PAD: u64 = 64 << 20;
/// File part of the RW segment: the RwHeader page.
pub(crate) const RW_FILESZ: u64 = 0x1000;

/// The addresses and file offsets of the new segments.
pub(crate) struct Segments {
    /// What the emitted code needs to know (RW address, buffer geometry, ...).
    pub layout: Layout,
    /// Alignment of the new segments.
    pub align: u64,
    /// File offset and address of the RX segment (it starts with the program headers).
    pub tx_off: u64,
    pub tx_vaddr: u64,
    /// Where the code starts, after the program header table.
    pub code_at: u64,
    /// Entries of the new program header table.
    pub new_phnum: u64,
}

pub(crate) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Place the new segments, reserving room for the windows and stubs of `plans`.
pub(crate) fn place(
    input: &Input,
    isa: &dyn Isa,
    opts: &Options,
    plans: &[FunctionPlan],
    sites: &[SiteInfo],
) -> Result<Segments> {
    let n_windows = plans.iter().map(|p| p.windows.len()).sum::<usize>() as u64;
    let n_inline = plans
        .iter()
        .flat_map(|p| &p.windows)
        .map(|w| w.sites.len() as u64)
        .sum::<u64>();
    let a = isa.segment_align();
    let loads: Vec<&Phdr> = input.loads().collect();
    let base = loads[0].vaddr - loads[0].offset;
    let max_vend = loads.iter().map(|p| p.vaddr + p.memsz).max().unwrap_or(0);
    let lookup = slot_lookup(input, isa, opts.nslots);
    // Two PT_LOADs, and a PT_TLS for a thread word.
    let word = matches!(lookup, SlotLookup::ThreadWord(_));
    let new_phnum = input.phdrs.len() as u64 + 2 + u64::from(word);
    let tx_vaddr_min = align_up(max_vend, a);
    let mut tx_off = align_up(input.data.len() as u64, a);
    let tx_vaddr = if base + tx_off >= tx_vaddr_min {
        base + tx_off
    } else if tx_vaddr_min - base - tx_off <= MAX_QEMU_PAD {
        tx_off = tx_vaddr_min - base;
        tx_vaddr_min
    } else {
        tx_vaddr_min
    };
    let code_at = tx_vaddr + align_up(new_phnum * PHDR_SIZE, 16);
    let tx_bound = (code_at - tx_vaddr) + 4096 + n_windows * MAX_TRAMPOLINE + n_inline * MAX_STUB;
    let layout = Layout {
        rw_vaddr: align_up(tx_vaddr + tx_bound, BUF_ALIGN),
        nslots: opts.nslots,
        buf_bytes: u64::from(opts.buf_records) * RECORD_SIZE as u64,
        binary_id: binary_id(input, sites),
        pre_tls: input.kind.is_static(),
        time_mode: opts.time_mode,
        buf_kind: opts.buf_kind,
        slot_lookup: lookup,
    };
    // The RW area past its 64 KiB-aligned start: everything must stay a user address.
    let rw_end =
        layout.rw_vaddr + rw_size(layout.buf_kind, layout.nslots, layout.buf_bytes) + BUF_ALIGN;
    if !in_user_space(rw_end, 0) {
        return Err(Error::NoRoom(input.name.clone(), max_vend));
    }
    Ok(Segments {
        layout,
        align: a,
        tx_off,
        tx_vaddr,
        code_at,
        new_phnum,
    })
}

impl Segments {
    /// The file offset of an address in the RX segment.
    pub(crate) fn tx_file_off(&self, vaddr: u64) -> u64 {
        vaddr - self.tx_vaddr + self.tx_off
    }

    /// Alignment of the RW segment: fast rings must be 64 KiB aligned at run time, and
    /// the loader aligns a segment's load address to its p_align (the kernel for
    /// executables, ld.so for libraries).
    pub(crate) fn rw_align(&self) -> u64 {
        if self.layout.buf_kind == BUF_FAST_CIRCULAR {
            self.align.max(FAST_RING_BYTES)
        } else {
            self.align
        }
    }

    /// File offset of the RW segment once the RX segment is `tx_size` bytes.
    pub(crate) fn rw_off(&self, tx_size: u64) -> u64 {
        let rw_align = self.rw_align();
        align_up(self.tx_off + tx_size, rw_align) + (self.layout.rw_vaddr % rw_align)
    }
}

/// A thread word where the executable's TLS block is ours alone: a dynamically linked
/// executable without `PT_TLS` (its block is then the 8 bytes next to the thread
/// pointer; libraries' blocks lie beyond it).
fn slot_lookup(input: &Input, isa: &dyn Isa, nslots: u32) -> SlotLookup {
    let why = match input.kind {
        _ if !nslots.is_power_of_two() => IndexWhy::SlotCount,
        Kind::SharedLib => IndexWhy::SharedLibrary,
        Kind::StaticExec | Kind::StaticPie => IndexWhy::StaticExecutable,
        Kind::Exec | Kind::Pie if input.phdrs.iter().any(|p| p.p_type == object::elf::PT_TLS) => {
            IndexWhy::OwnTls
        }
        Kind::Exec | Kind::Pie => return SlotLookup::ThreadWord(isa.thread_word_offset()),
    };
    SlotLookup::Index(why)
}

/// binary_id: the original's identity plus what was chosen (FNV-1a).
fn binary_id(input: &Input, sites: &[SiteInfo]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    match &input.build_id {
        Some(b) => fnv1a(&mut h, b),
        None => fnv1a(&mut h, input.data),
    }
    for s in sites {
        fnv1a(&mut h, &s.addr.to_le_bytes());
        fnv1a(&mut h, &[s.kind as u8]);
    }
    h
}

fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}
