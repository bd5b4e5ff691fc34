//! Reading and checking the input binary: ELF header, segments, sections, function
//! symbols. Nothing here writes.
//!
//! What the reader hands out is consistent: it refuses as "malformed" what no loader
//! maps or what would make the rewriter write elsewhere than it read: a PT_LOAD past
//! the file, below its own offset, larger in the file than in memory or past the 48-bit
//! user space (`USER_END`); sections, function symbols and FDEs ending past it; a code
//! section whose file offset is not where its segment maps it. Downstream, `addr +
//! size` never overflows and a patch lands on the bytes that were decoded (`cargo xtask
//! fuzz rewrite_elf`: an output must read back as rewritten; past findings in
//! `fuzz/findings/rewrite_elf`, replayed by `rewriter/tests/fuzz_findings.rs`). It also
//! reads the file's kind and build-id, and refuses a binary that is already rewritten.

use object::LittleEndian as LE;
use object::elf;
use object::read::elf::{
    Dyn as _, FileHeader as _, ProgramHeader as _, SectionHeader as _, Sym as _,
};

use crate::error::{Error, Result};
use crate::isa::machine::Machine;
use tracer_common::meta::META_SECTION;

type Fh = elf::FileHeader64<LE>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Dynamically linked, fixed address (`-no-pie`).
    Exec,
    /// Dynamically linked position-independent executable.
    Pie,
    /// Statically linked, fixed address.
    StaticExec,
    /// Statically linked, self-relocating.
    StaticPie,
    SharedLib,
}

impl Kind {
    pub fn is_static(self) -> bool {
        matches!(self, Kind::StaticExec | Kind::StaticPie)
    }
    pub fn is_pic(self) -> bool {
        !matches!(self, Kind::Exec | Kind::StaticExec)
    }
    pub fn name(self) -> &'static str {
        match self {
            Kind::Exec => "executable (non-PIE)",
            Kind::Pie => "PIE executable",
            Kind::StaticExec => "static executable",
            Kind::StaticPie => "static-pie executable",
            Kind::SharedLib => "shared library",
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Phdr {
    pub p_type: u32,
    pub p_flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub paddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub align: u64,
}

#[derive(Clone, Debug)]
pub struct Section {
    pub name: String,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
}

/// A defined function: one address, maybe several names (aliases), best name first.
#[derive(Clone, Debug)]
pub struct Function {
    pub addr: u64,
    pub size: u64,
    pub names: Vec<String>,
}

pub struct Input<'a> {
    pub name: String,
    pub data: &'a [u8],
    /// `e_machine`: selects the backend (`isa::of`, which rejects machines it has none
    /// for).
    pub machine: u16,
    pub kind: Kind,
    pub entry: u64,
    pub phdrs: Vec<Phdr>,
    pub phoff: u64,
    pub shoff: u64,
    pub shnum: u16,
    pub shstrndx: u16,
    pub sections: Vec<Section>,
    pub functions: Vec<Function>,
    pub build_id: Option<Vec<u8>>,
}

fn malformed(name: &str, what: impl std::fmt::Display) -> Error {
    Error::Malformed(name.to_string(), what.to_string())
}

impl<'a> Input<'a> {
    /// Check the identification bytes first so that each kind of wrong input gets its
    /// own message, then parse everything with `object`.
    pub fn parse(name: &str, data: &'a [u8]) -> Result<Self> {
        check_ident(name, data)?;
        let fh = Fh::parse(data).map_err(|e| malformed(name, e))?;
        let e = LE;
        let machine = fh.e_machine.get(e);
        if Machine::of(machine).is_none() {
            return Err(Error::UnsupportedMachine(name.into(), machine));
        }
        let e_type = fh.e_type.get(e);
        if e_type != elf::ET_EXEC && e_type != elf::ET_DYN {
            return Err(Error::UnsupportedType(name.into(), e_type));
        }
        let phdrs = program_headers(name, fh, data)?;
        let sections_tab = fh.sections(e, data).map_err(|e| malformed(name, e))?;
        let sections = sections(name, &sections_tab, data)?;
        check_code_mapping(name, &phdrs, &sections)?;
        if sections.iter().any(|s| s.name == META_SECTION) {
            return Err(Error::AlreadyRewritten(name.into(), META_SECTION));
        }
        let kind = kind_of(e_type, &phdrs, data, &sections_tab);
        let functions = function_symbols(name, &sections_tab, data, &sections)?;
        let build_id = find_build_id(data, &sections);
        Ok(Input {
            name: name.into(),
            data,
            machine,
            kind,
            entry: fh.e_entry.get(e),
            phdrs,
            phoff: fh.e_phoff.get(e),
            shoff: fh.e_shoff.get(e),
            shnum: fh.e_shnum.get(e),
            shstrndx: fh.e_shstrndx.get(e),
            sections,
            functions,
            build_id,
        })
    }

    /// File offset of a virtual address inside a PT_LOAD's file-backed part.
    pub fn vaddr_to_offset(&self, vaddr: u64) -> Option<u64> {
        self.phdrs
            .iter()
            .find(|p| p.p_type == elf::PT_LOAD && vaddr >= p.vaddr && vaddr < p.vaddr + p.filesz)
            .map(|p| vaddr - p.vaddr + p.offset)
    }

    /// Bytes of the file from `vaddr` to the end of its segment's file part.
    pub fn bytes_at(&self, vaddr: u64) -> Option<&'a [u8]> {
        let p = self
            .phdrs
            .iter()
            .find(|p| p.p_type == elf::PT_LOAD && vaddr >= p.vaddr && vaddr < p.vaddr + p.filesz)?;
        let off = (vaddr - p.vaddr + p.offset) as usize;
        let end = (p.offset + p.filesz) as usize;
        self.data.get(off..end)
    }

    /// Executable PROGBITS sections with their address and bytes (what a linear sweep
    /// for branch targets decodes).
    pub fn code_sections(&self) -> impl Iterator<Item = (u64, &'a [u8])> + '_ {
        self.sections
            .iter()
            .filter(|s| {
                s.flags & u64::from(elf::SHF_EXECINSTR) != 0 && s.sh_type == elf::SHT_PROGBITS
            })
            .filter_map(|s| {
                let bytes = self
                    .data
                    .get(s.offset as usize..(s.offset + s.size) as usize)?;
                Some((s.addr, bytes))
            })
    }

    pub fn loads(&self) -> impl Iterator<Item = &Phdr> {
        self.phdrs.iter().filter(|p| p.p_type == elf::PT_LOAD)
    }

    /// The first section called `name` with its file bytes (none for `SHT_NOBITS`).
    pub fn section_data(&self, name: &str) -> Option<(&Section, &'a [u8])> {
        let s = self.sections.iter().find(|s| s.name == name)?;
        if s.sh_type == elf::SHT_NOBITS {
            return None;
        }
        let bytes = self
            .data
            .get(s.offset as usize..s.offset.checked_add(s.size)? as usize)?;
        Some((s, bytes))
    }

    /// Executable PROGBITS sections themselves, in section-header order.
    pub fn code_section_headers(&self) -> impl Iterator<Item = &Section> {
        self.sections.iter().filter(|s| {
            s.flags & u64::from(elf::SHF_EXECINSTR) != 0 && s.sh_type == elf::SHT_PROGBITS
        })
    }
}

type SectionTable<'a> = object::read::elf::SectionTable<'a, Fh>;

/// Magic, class and data encoding: each wrong one with its own message.
fn check_ident(name: &str, data: &[u8]) -> Result<()> {
    if data.len() < 4 || &data[..4] != b"\x7fELF" {
        return Err(Error::NotElf(name.into()));
    }
    if data.len() < 64 {
        return Err(malformed(name, "file is shorter than an ELF64 header"));
    }
    match data[4] {
        elf::ELFCLASS64 => {}
        elf::ELFCLASS32 => return Err(Error::Elf32(name.into())),
        c => return Err(malformed(name, format!("unknown ELF class {c}"))),
    }
    match data[5] {
        elf::ELFDATA2LSB => {}
        elf::ELFDATA2MSB => return Err(Error::BigEndian(name.into())),
        d => return Err(malformed(name, format!("unknown ELF data encoding {d}"))),
    }
    Ok(())
}

/// The program headers; every PT_LOAD inside the file, at least one.
fn program_headers(name: &str, fh: &Fh, data: &[u8]) -> Result<Vec<Phdr>> {
    let e = LE;
    let raw_phdrs = fh
        .program_headers(e, data)
        .map_err(|e| malformed(name, e))?;
    let phdrs: Vec<Phdr> = raw_phdrs
        .iter()
        .map(|p| Phdr {
            p_type: p.p_type(e),
            p_flags: p.p_flags(e),
            offset: p.p_offset(e),
            vaddr: p.p_vaddr(e),
            paddr: p.p_paddr(e),
            filesz: p.p_filesz(e),
            memsz: p.p_memsz(e),
            align: p.p_align(e),
        })
        .collect();
    for p in phdrs.iter().filter(|p| p.p_type == elf::PT_LOAD) {
        if let Some(why) = bad_load(p, data.len() as u64) {
            return Err(malformed(name, why));
        }
    }
    if !phdrs.iter().any(|p| p.p_type == elf::PT_LOAD) {
        return Err(malformed(name, "no PT_LOAD segment"));
    }
    Ok(phdrs)
}

/// Every code section lies in a segment's file image where the segment maps it: the
/// rewriter decodes a section's bytes but patches through the segment, so a mismatch
/// would have it write over other bytes (a fuzzed one: the ELF header); and code at
/// an address no segment maps is no code a process runs (its new segments could
/// even be placed over that address).
fn check_code_mapping(name: &str, phdrs: &[Phdr], sections: &[Section]) -> Result<()> {
    let code = sections
        .iter()
        .filter(|s| s.flags & u64::from(elf::SHF_EXECINSTR) != 0 && s.sh_type == elf::SHT_PROGBITS);
    for s in code.filter(|s| s.size > 0) {
        let in_load = phdrs
            .iter()
            .find(|p| p.p_type == elf::PT_LOAD && s.addr >= p.vaddr && s.addr - p.vaddr < p.filesz);
        let Some(p) = in_load else {
            return Err(malformed(
                name,
                format!("code section {} lies in no PT_LOAD segment", s.name),
            ));
        };
        if s.addr - p.vaddr != s.offset.wrapping_sub(p.offset)
            || s.addr - p.vaddr + s.size > p.filesz
        {
            return Err(malformed(
                name,
                format!("code section {} is not where its segment maps it", s.name),
            ));
        }
    }
    Ok(())
}

/// Whether `addr..addr + size` ends inside the user address space: every range the
/// reader hands out (segments, allocated sections, function symbols, FDEs) does, so
/// `addr + size` never overflows downstream.
pub fn in_user_space(addr: u64, size: u64) -> bool {
    addr.checked_add(size)
        .is_some_and(|end| end <= tracer_common::USER_END)
}

/// What no loader maps: a PT_LOAD past the file's end, below its own file offset
/// (the image would start below address 0), larger in the file than in memory, or
/// outside a 48-bit user address space.
fn bad_load(p: &Phdr, file_len: u64) -> Option<&'static str> {
    if p.offset
        .checked_add(p.filesz)
        .is_none_or(|end| end > file_len)
    {
        Some("a PT_LOAD segment extends past the end of the file")
    } else if p.vaddr < p.offset {
        Some("a PT_LOAD segment's address is below its file offset")
    } else if p.filesz > p.memsz {
        Some("a PT_LOAD segment is larger in the file than in memory")
    } else if !in_user_space(p.vaddr, p.memsz) {
        Some("a PT_LOAD segment ends outside the user address space")
    } else {
        None
    }
}

/// The section headers, each inside the file.
fn sections(name: &str, sections_tab: &SectionTable, data: &[u8]) -> Result<Vec<Section>> {
    let e = LE;
    let mut sections = Vec::new();
    for s in sections_tab.iter() {
        let sname = sections_tab
            .section_name(e, s)
            .map_err(|e| malformed(name, e))?;
        let sec = Section {
            name: String::from_utf8_lossy(sname).into_owned(),
            sh_type: s.sh_type(e),
            flags: s.sh_flags(e),
            addr: s.sh_addr(e),
            offset: s.sh_offset(e),
            size: s.sh_size(e),
        };
        if sec.sh_type != elf::SHT_NOBITS
            && sec.sh_type != elf::SHT_NULL
            && sec
                .offset
                .checked_add(sec.size)
                .is_none_or(|end| end > data.len() as u64)
        {
            return Err(malformed(
                name,
                format!("section {} extends past the end of the file", sec.name),
            ));
        }
        if sec.flags & u64::from(elf::SHF_ALLOC) != 0 && !in_user_space(sec.addr, sec.size) {
            return Err(malformed(
                name,
                format!("section {} ends outside the user address space", sec.name),
            ));
        }
        sections.push(sec);
    }
    Ok(sections)
}

fn kind_of(e_type: u16, phdrs: &[Phdr], data: &[u8], sections_tab: &SectionTable) -> Kind {
    let has_interp = phdrs.iter().any(|p| p.p_type == elf::PT_INTERP);
    if e_type == elf::ET_EXEC {
        if has_interp {
            Kind::Exec
        } else {
            Kind::StaticExec
        }
    } else if has_interp {
        Kind::Pie
    } else if dyn_flags_1(data, sections_tab) & elf::DF_1_PIE != 0 {
        Kind::StaticPie
    } else {
        Kind::SharedLib
    }
}

/// Function symbols, aliases merged, sizes filled in.
fn function_symbols(
    name: &str,
    sections_tab: &SectionTable,
    data: &[u8],
    sections: &[Section],
) -> Result<Vec<Function>> {
    let raw = raw_function_symbols(name, sections_tab, data, sections)?;
    let mut functions = merge_aliases(raw);
    fill_sizes(&mut functions, sections);
    Ok(functions)
}

/// A function symbol as the table has it: address, size, binding, name.
type RawSymbol = (u64, u64, u8, String);

/// The named function symbols in code sections (of .symtab when present, else of
/// .dynsym).
fn raw_function_symbols(
    name: &str,
    sections_tab: &SectionTable,
    data: &[u8],
    sections: &[Section],
) -> Result<Vec<RawSymbol>> {
    let e = LE;
    // Function symbols: .symtab when present, else .dynsym.
    let mut syms = sections_tab
        .symbols(e, data, elf::SHT_SYMTAB)
        .map_err(|e| malformed(name, e))?;
    if syms.is_empty() {
        syms = sections_tab
            .symbols(e, data, elf::SHT_DYNSYM)
            .map_err(|e| malformed(name, e))?;
    }
    let mut raw: Vec<RawSymbol> = Vec::new();
    for sym in syms.iter() {
        let st_type = sym.st_type();
        if st_type != elf::STT_FUNC && st_type != elf::STT_GNU_IFUNC {
            continue;
        }
        let shndx = sym.st_shndx(e);
        if shndx == elf::SHN_UNDEF || shndx >= elf::SHN_LORESERVE {
            continue;
        }
        let Some(sec) = sections.get(shndx as usize) else {
            continue;
        };
        // A function in code, and where its section is: bytes elsewhere (a fuzzed
        // one: the ELF header) are no code this binary runs.
        let at = sym.st_value(e);
        if sec.flags & u64::from(elf::SHF_EXECINSTR) == 0
            || at < sec.addr
            || at - sec.addr >= sec.size
        {
            continue;
        }
        let Ok(n) = syms.symbol_name(e, sym) else {
            continue;
        };
        if n.is_empty() {
            continue;
        }
        if !in_user_space(sym.st_value(e), sym.st_size(e)) {
            return Err(malformed(
                name,
                format!(
                    "function {} ends outside the user address space",
                    String::from_utf8_lossy(n)
                ),
            ));
        }
        raw.push((
            sym.st_value(e),
            sym.st_size(e),
            sym.st_bind(),
            String::from_utf8_lossy(n).into_owned(),
        ));
    }
    Ok(raw)
}

/// One function per address, its names best first.
fn merge_aliases(mut raw: Vec<RawSymbol>) -> Vec<Function> {
    // Aliases share an address: best name first (global, then weak, then local; shorter).
    raw.sort_by(|a, b| {
        let rank = |bind: u8| match bind {
            elf::STB_GLOBAL => 0,
            elf::STB_WEAK => 1,
            _ => 2,
        };
        (a.0, rank(a.2), a.3.len(), &a.3).cmp(&(b.0, rank(b.2), b.3.len(), &b.3))
    });
    let mut functions: Vec<Function> = Vec::new();
    for (addr, size, _, n) in raw {
        match functions.last_mut() {
            Some(f) if f.addr == addr => {
                f.size = f.size.max(size);
                if !f.names.contains(&n) {
                    f.names.push(n);
                }
            }
            _ => functions.push(Function {
                addr,
                size,
                names: vec![n],
            }),
        }
    }
    functions
}

/// Symbols without a size (hand-written assembly, crt files) extend to the next
/// function or the end of their section.
fn fill_sizes(functions: &mut [Function], sections: &[Section]) {
    for i in 0..functions.len() {
        if functions[i].size != 0 {
            continue;
        }
        let addr = functions[i].addr;
        let sec_end = sections
            .iter()
            .filter(|s| {
                s.flags & u64::from(elf::SHF_EXECINSTR) != 0
                    && s.addr <= addr
                    && addr < s.addr + s.size
            })
            .map(|s| s.addr + s.size)
            .next()
            .unwrap_or(addr);
        let next = functions
            .get(i + 1)
            .map_or(sec_end, |f| f.addr.min(sec_end));
        functions[i].size = next.saturating_sub(addr);
    }
}

fn dyn_flags_1(data: &[u8], sections: &object::read::elf::SectionTable<'_, Fh>) -> u32 {
    let e = LE;
    for s in sections.iter() {
        if s.sh_type(e) != elf::SHT_DYNAMIC {
            continue;
        }
        let Ok(Some((dyns, _))) = s.dynamic(e, data) else {
            continue;
        };
        for d in dyns {
            if d.tag32(e) == Some(elf::DT_FLAGS_1) {
                return d.val32(e).unwrap_or(0);
            }
        }
    }
    0
}

fn find_build_id(data: &[u8], sections: &[Section]) -> Option<Vec<u8>> {
    let s = sections.iter().find(|s| s.name == ".note.gnu.build-id")?;
    let d = data.get(s.offset as usize..(s.offset + s.size) as usize)?;
    let mut o = 0;
    while o + 12 <= d.len() {
        let namesz = u32::from_le_bytes(d[o..o + 4].try_into().ok()?) as usize;
        let descsz = u32::from_le_bytes(d[o + 4..o + 8].try_into().ok()?) as usize;
        let ty = u32::from_le_bytes(d[o + 8..o + 12].try_into().ok()?);
        let desc = o + 12 + namesz.div_ceil(4) * 4;
        if desc + descsz > d.len() {
            return None;
        }
        if ty == elf::NT_GNU_BUILD_ID {
            return Some(d[desc..desc + descsz].to_vec());
        }
        o = desc + descsz.div_ceil(4) * 4;
    }
    None
}
