//! Writing the rewritten binary. Append-only: the input's bytes stay where they are
//! (except the patched sites and a few header fields); everything new goes after them:
//!
//! ```text
//! [original file, sites patched] [pad]
//! [RX segment: new program header table | runtime | trampolines]   PT_LOAD R+X
//! [RW segment: RwHeader page (file) + index, slots, buffers (bss)]  PT_LOAD R+W
//! [.note.utrace] [.shstrtab with the new names] [section header table]
//! ```

use object::elf;

use super::read::{Input, Phdr};
use crate::error::{Error, Result};
use crate::isa::SlotLookup;
use crate::layout::{PHDR_SIZE, RW_FILESZ, Segments, align_up};
use tracer_common::meta;

/// The new parts, placed.
pub(crate) struct NewParts<'a> {
    pub seg: &'a Segments,
    /// RX segment contents after the program header table.
    pub code: &'a [u8],
    pub tx_size: u64,
    pub rw_off: u64,
    pub rw_size: u64,
    /// The RwHeader page.
    pub rw_header: &'a [u8],
    /// (site address, bytes written over the original code).
    pub patches: &'a [(u64, Vec<u8>)],
    pub note: &'a [u8],
    /// The new ELF entry point.
    pub entry: u64,
}

/// The output file: the input with `new` appended and the sites patched.
pub(crate) fn write(input: &Input, new: &NewParts) -> Result<Vec<u8>> {
    let seg = new.seg;
    let mut out = input.data.to_vec();
    out.resize(seg.tx_off as usize, 0);
    let phdrs = program_headers(input, new);
    for p in &phdrs {
        put_phdr(&mut out, p);
    }
    out.resize(seg.tx_file_off(seg.code_at) as usize, 0);
    out.extend_from_slice(new.code);
    out.resize(new.rw_off as usize, 0);
    out.extend_from_slice(new.rw_header);
    for (vaddr, bytes) in new.patches {
        let off = input.vaddr_to_offset(*vaddr).ok_or_else(|| {
            Error::Layout(
                input.name.clone(),
                format!("site {vaddr:#x} not file-backed"),
            )
        })? as usize;
        out[off..off + bytes.len()].copy_from_slice(bytes);
    }
    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    let note_off = out.len() as u64;
    out.extend_from_slice(new.note);
    let (shdrs, shstrndx) = section_headers(input, new, &mut out, note_off)?;
    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    let shoff = out.len() as u64;
    for s in &shdrs {
        out.extend_from_slice(s);
    }
    out[24..32].copy_from_slice(&new.entry.to_le_bytes());
    out[32..40].copy_from_slice(&seg.tx_off.to_le_bytes());
    out[40..48].copy_from_slice(&shoff.to_le_bytes());
    out[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
    out[60..62].copy_from_slice(&(shdrs.len() as u16).to_le_bytes());
    out[62..64].copy_from_slice(&(shstrndx as u16).to_le_bytes());
    Ok(out)
}

/// The new program header table: old entries (PT_PHDR moved), new PT_LOADs after the
/// last PT_LOAD so that PT_LOADs stay sorted by address.
fn program_headers(input: &Input, new: &NewParts) -> Vec<Phdr> {
    let seg = new.seg;
    let mut phdrs = input.phdrs.clone();
    for p in phdrs.iter_mut().filter(|p| p.p_type == elf::PT_PHDR) {
        p.offset = seg.tx_off;
        p.vaddr = seg.tx_vaddr;
        p.paddr = seg.tx_vaddr;
        p.filesz = seg.new_phnum * PHDR_SIZE;
        p.memsz = seg.new_phnum * PHDR_SIZE;
    }
    let last_load = phdrs
        .iter()
        .rposition(|p| p.p_type == elf::PT_LOAD)
        .unwrap_or(0);
    let rw_vaddr = seg.layout.rw_vaddr;
    let new_loads = [
        Phdr {
            p_type: elf::PT_LOAD,
            p_flags: elf::PF_R | elf::PF_X,
            offset: seg.tx_off,
            vaddr: seg.tx_vaddr,
            paddr: seg.tx_vaddr,
            filesz: new.tx_size,
            memsz: new.tx_size,
            align: seg.align,
        },
        Phdr {
            p_type: elf::PT_LOAD,
            p_flags: elf::PF_R | elf::PF_W,
            offset: new.rw_off,
            vaddr: rw_vaddr,
            paddr: rw_vaddr,
            filesz: RW_FILESZ,
            memsz: new.rw_size,
            align: seg.rw_align(),
        },
    ];
    phdrs.splice(last_load + 1..last_load + 1, new_loads);
    if let SlotLookup::ThreadWord(_) = seg.layout.slot_lookup {
        // The executable's TLS block: the thread word alone, zero in every new thread.
        phdrs.push(Phdr {
            p_type: elf::PT_TLS,
            p_flags: elf::PF_R,
            offset: seg.tx_off,
            vaddr: seg.tx_vaddr,
            paddr: seg.tx_vaddr,
            filesz: 0,
            memsz: 8,
            align: 8,
        });
    }
    phdrs
}

/// Section headers: the old ones, then ours; `.shstrtab` rewritten (appended to
/// `out`) with the new names. Returns the headers and the `.shstrtab` index.
fn section_headers(
    input: &Input,
    new: &NewParts,
    out: &mut Vec<u8>,
    note_off: u64,
) -> Result<(Vec<[u8; 64]>, usize)> {
    let (mut shdrs, mut strtab, old_shstrndx) = old_sections(input, out)?;
    let seg = new.seg;
    let rw_vaddr = seg.layout.rw_vaddr;
    let x = u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR);
    let w = u64::from(elf::SHF_ALLOC | elf::SHF_WRITE);
    let n1 = add_name(&mut strtab, ".utrace.text");
    let n2 = add_name(&mut strtab, ".utrace.data");
    let n3 = add_name(&mut strtab, ".utrace.bss");
    let n4 = add_name(&mut strtab, meta::META_SECTION);
    let (tx_vaddr, tx_off, rw_off) = (seg.tx_vaddr, seg.tx_off, new.rw_off);
    shdrs.push(shdr(
        n1,
        elf::SHT_PROGBITS,
        x,
        tx_vaddr,
        tx_off,
        new.tx_size,
        16,
    ));
    shdrs.push(shdr(
        n2,
        elf::SHT_PROGBITS,
        w,
        rw_vaddr,
        rw_off,
        RW_FILESZ,
        64,
    ));
    let bss_size = new.rw_size - RW_FILESZ;
    let (bss_at, bss_off) = (rw_vaddr + RW_FILESZ, rw_off + RW_FILESZ);
    shdrs.push(shdr(n3, elf::SHT_NOBITS, w, bss_at, bss_off, bss_size, 64));
    let note_len = new.note.len() as u64;
    shdrs.push(shdr(n4, elf::SHT_NOTE, 0, 0, note_off, note_len, 4));
    let shstrndx = old_shstrndx.unwrap_or_else(|| {
        let n = add_name(&mut strtab, ".shstrtab");
        shdrs.push(shdr(n, elf::SHT_STRTAB, 0, 0, 0, 0, 1));
        shdrs.len() - 1
    });
    let strtab_off = out.len() as u64;
    out.extend_from_slice(&strtab);
    shdrs[shstrndx][24..32].copy_from_slice(&strtab_off.to_le_bytes());
    shdrs[shstrndx][32..40].copy_from_slice(&(strtab.len() as u64).to_le_bytes());
    Ok((shdrs, shstrndx))
}

/// Section headers as written, a string table, and the index of `.shstrtab`.
type Sections = (Vec<[u8; 64]>, Vec<u8>, Option<usize>);

/// The input's section headers and `.shstrtab` (a null header and an empty table when
/// it has none), and the index of its `.shstrtab`.
fn old_sections(input: &Input, out: &[u8]) -> Result<Sections> {
    if input.shnum == 0 {
        return Ok((vec![[0u8; 64]], vec![0], None));
    }
    let so = input.shoff as usize;
    let mut shdrs = Vec::with_capacity(input.shnum as usize);
    for i in 0..input.shnum as usize {
        let b = out.get(so + i * 64..so + i * 64 + 64).ok_or_else(|| {
            Error::Malformed(input.name.clone(), "section header table truncated".into())
        })?;
        shdrs.push(b.try_into().unwrap());
    }
    let bad = || Error::Malformed(input.name.clone(), "no section name table".into());
    let s = input
        .sections
        .get(input.shstrndx as usize)
        .ok_or_else(bad)?;
    let end = s.offset.checked_add(s.size).ok_or_else(bad)?;
    let strtab = input
        .data
        .get(s.offset as usize..end as usize)
        .ok_or_else(bad)?
        .to_vec();
    Ok((shdrs, strtab, Some(input.shstrndx as usize)))
}

fn add_name(strtab: &mut Vec<u8>, n: &str) -> u32 {
    let o = strtab.len() as u32;
    strtab.extend_from_slice(n.as_bytes());
    strtab.push(0);
    o
}

fn put_phdr(out: &mut Vec<u8>, p: &Phdr) {
    out.extend_from_slice(&p.p_type.to_le_bytes());
    out.extend_from_slice(&p.p_flags.to_le_bytes());
    for v in [p.offset, p.vaddr, p.paddr, p.filesz, p.memsz, p.align] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn shdr(name: u32, ty: u32, flags: u64, addr: u64, off: u64, size: u64, align: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(&name.to_le_bytes());
    b[4..8].copy_from_slice(&ty.to_le_bytes());
    b[8..16].copy_from_slice(&flags.to_le_bytes());
    b[16..24].copy_from_slice(&addr.to_le_bytes());
    b[24..32].copy_from_slice(&off.to_le_bytes());
    b[32..40].copy_from_slice(&size.to_le_bytes());
    b[48..56].copy_from_slice(&align.to_le_bytes());
    b
}
