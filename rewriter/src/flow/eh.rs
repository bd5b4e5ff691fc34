//! Exception-handling data: the FDEs of `.eh_frame` (function ranges and LSDA pointers)
//! and the landing pads of each LSDA (`.gcc_except_table`).
//!
//! A landing pad is entered by the unwinder, never by a branch the disassembler sees,
//! so overwriting one with the middle of a patched range would break exceptions.
//! Malformed EH data is therefore an error, not a warning: silently missing pads would
//! make every later patching decision unsafe.

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, EhFrame, EhFrameOffset, EndianSlice,
    FrameDescriptionEntry, LittleEndian, Pointer, RegisterRule, UnwindContext, UnwindSection,
};
use object::elf;

use super::FlowError;
use crate::elf::read::{Input, in_user_space};

// DW_EH_PE_* pointer encodings (format in the low nibble, application in bits 4..6).
const PE_OMIT: u8 = 0xff;
const PE_INDIRECT: u8 = 0x80;
const PE_PCREL: u8 = 0x10;
const PE_TEXTREL: u8 = 0x20;
const PE_DATAREL: u8 = 0x30;
const PE_FUNCREL: u8 = 0x40;
const PE_ALIGNED: u8 = 0x50;

pub(crate) struct Eh {
    /// `(start, size)` of every FDE with a non-zero size.
    pub fdes: Vec<(u64, u64)>,
    /// `(start, end, offset in .eh_frame)` of every FDE with a non-zero size, sorted.
    pub fde_offsets: Vec<(u64, u64, usize)>,
    pub landing_pads: Vec<u64>,
    pub warnings: Vec<String>,
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Locate `.eh_frame`: by section name, else (no section headers) through
/// `PT_GNU_EH_FRAME` → `.eh_frame_hdr` → `eh_frame_ptr`.
fn locate<'a>(input: &Input<'a>) -> Result<Option<(u64, &'a [u8])>, FlowError> {
    if let Some((s, bytes)) = input.section_data(".eh_frame") {
        return Ok(Some((s.addr, bytes)));
    }
    let Some(hdr) = input
        .phdrs
        .iter()
        .find(|p| p.p_type == elf::PT_GNU_EH_FRAME)
    else {
        return Ok(None);
    };
    let err = |what: String| FlowError::EhFrame {
        file: input.name.clone(),
        what,
    };
    let bytes = input.bytes_at(hdr.vaddr).ok_or_else(|| {
        err(format!(
            "PT_GNU_EH_FRAME at {:#x} is not in the file",
            hdr.vaddr
        ))
    })?;
    let mut c = Cursor::new(bytes, hdr.vaddr);
    let addr = (|| {
        let version = c.u8()?;
        if version != 1 {
            return Err(format!("version {version}"));
        }
        let ptr_enc = c.u8()?;
        c.skip(2)?;
        c.encoded(input, ptr_enc, None)
    })()
    .map_err(|e| err(format!(".eh_frame_hdr: {e}")))?;
    let bytes = input
        .bytes_at(addr)
        .ok_or_else(|| err(format!(".eh_frame at {addr:#x} is not in the file")))?;
    Ok(Some((addr, bytes)))
}

/// Where `.eh_frame` pointer encodings are relative to: the section itself, `.text`,
/// `.got`.
fn bases(input: &Input, eh_addr: u64) -> BaseAddresses {
    let mut bases = BaseAddresses::default().set_eh_frame(eh_addr);
    if let Some(t) = input.sections.iter().find(|s| s.name == ".text") {
        bases = bases.set_text(t.addr);
    }
    if let Some(g) = input.sections.iter().find(|s| s.name == ".got") {
        bases = bases.set_got(g.addr);
    }
    bases
}

pub(crate) fn read(input: &Input) -> Result<Eh, FlowError> {
    let mut eh = Eh {
        fdes: Vec::new(),
        fde_offsets: Vec::new(),
        landing_pads: Vec::new(),
        warnings: Vec::new(),
    };
    let Some((eh_addr, bytes)) = locate(input)? else {
        eh.warnings
            .push("no .eh_frame: no FDE function ranges, no landing pads".into());
        return Ok(eh);
    };
    let lsdas = read_fdes(input, eh_addr, bytes, &mut eh)?;
    read_landing_pads(input, &lsdas, &mut eh)?;
    eh.fdes.sort_unstable();
    eh.fdes.dedup();
    eh.fde_offsets.sort_unstable();
    eh.landing_pads.sort_unstable();
    eh.landing_pads.dedup();
    Ok(eh)
}

/// A malformed `.eh_frame`.
fn eh_err(input: &Input, what: String) -> FlowError {
    FlowError::EhFrame {
        file: input.name.clone(),
        what,
    }
}

/// Every FDE's range into `eh`; the LSDAs, with their FDE's start and size.
fn read_fdes(
    input: &Input,
    eh_addr: u64,
    bytes: &[u8],
    eh: &mut Eh,
) -> Result<Vec<(u64, u64, u64)>, FlowError> {
    let bases = bases(input, eh_addr);
    let section = EhFrame::new(bytes, LittleEndian);
    // Most FDEs share a handful of CIEs: parse each once.
    let mut cies: HashMap<usize, CommonInformationEntry<Slice>> = HashMap::new();
    let mut lsdas: Vec<(u64, u64, u64)> = Vec::new();
    let mut entries = section.entries(&bases);
    loop {
        let entry = entries
            .next()
            .map_err(|e| eh_err(input, format!("entry list: {e}")))?;
        let Some(entry) = entry else { break };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial
            .parse(|s, b, off| {
                if let Some(c) = cies.get(&off.0) {
                    return Ok(c.clone());
                }
                let c = s.cie_from_offset(b, off)?;
                cies.insert(off.0, c.clone());
                Ok(c)
            })
            .map_err(|e| eh_err(input, format!("FDE at offset {:#x}: {e}", partial.offset())))?;
        let start = fde.initial_address();
        let size = fde.len();
        if !in_user_space(start, size) {
            return Err(eh_err(
                input,
                format!(
                    "FDE at offset {:#x} ends outside the user address space",
                    partial.offset()
                ),
            ));
        }
        if size != 0 {
            eh.fdes.push((start, size));
            eh.fde_offsets
                .push((start, start.saturating_add(size), partial.offset()));
        }
        if let Some(lsda) = lsda_of(input, &fde, start)? {
            lsdas.push((lsda, start, size));
        }
    }
    Ok(lsdas)
}

/// Where an FDE's LSDA is, if it has one (`None`: none, or a null pointer).
fn lsda_of(
    input: &Input,
    fde: &FrameDescriptionEntry<Slice>,
    start: u64,
) -> Result<Option<u64>, FlowError> {
    let lsda = match fde.lsda() {
        None => return Ok(None),
        Some(Pointer::Direct(a)) => a,
        Some(Pointer::Indirect(a)) => read_u64(input, a).ok_or_else(|| {
            eh_err(
                input,
                format!("FDE for {start:#x}: indirect LSDA pointer at {a:#x} is not in the file"),
            )
        })?,
    };
    Ok(Some(lsda).filter(|&l| l != 0))
}

/// The landing pads of each LSDA into `eh` (and a warning for pads outside their FDE).
fn read_landing_pads(
    input: &Input,
    lsdas: &[(u64, u64, u64)],
    eh: &mut Eh,
) -> Result<(), FlowError> {
    for &(lsda, start, size) in lsdas {
        let before = eh.landing_pads.len();
        parse_lsda(input, lsda, start, &mut eh.landing_pads).map_err(|what| FlowError::Lsda {
            file: input.name.clone(),
            lsda,
            fde: start,
            what,
        })?;
        // Pads outside the FDE are legal in the format but unusual: say so.
        if let Some(&p) = eh.landing_pads[before..]
            .iter()
            .find(|&&p| p < start || p >= start + size)
        {
            eh.warnings.push(format!(
                "landing pad {p:#x} lies outside its FDE {start:#x}..{:#x}",
                start + size
            ));
        }
    }
    Ok(())
}

/// For each of `addrs`: is the stack back at its height at function entry there, by
/// the CFI of the FDE covering it (x86-64: CFA = %rsp + 8; AArch64: CFA = sp and x30
/// not saved)? `None` where no FDE covers the address or its CFI cannot be evaluated.
pub(crate) fn at_entry_height(
    input: &Input,
    eh: &Eh,
    addrs: &[u64],
    (cfa_reg, cfa_off, ra): (gimli::Register, i64, Option<gimli::Register>),
) -> Vec<Option<bool>> {
    let mut out = vec![None; addrs.len()];
    each_row(input, &eh.fde_offsets, addrs, |i, row| {
        out[i] = Some(match *row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                register == cfa_reg
                    && offset == cfa_off
                    && ra.is_none_or(|ra| {
                        matches!(
                            row.register(ra),
                            RegisterRule::Undefined | RegisterRule::SameValue
                        )
                    })
            }
            CfaRule::Expression(_) => false,
        });
    });
    out
}

/// For each of `addrs`: the canonical frame address there as register + offset, by the
/// CFI of the FDE covering it (`fde_offsets`: [`Eh::fde_offsets`]). `None` where no FDE
/// covers it or the CFA is an expression.
pub(crate) fn cfa_rules(
    input: &Input,
    fde_offsets: &[(u64, u64, usize)],
    addrs: &[u64],
) -> Vec<Option<(gimli::Register, i64)>> {
    let mut out = vec![None; addrs.len()];
    each_row(input, fde_offsets, addrs, |i, row| {
        if let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() {
            out[i] = Some((register, offset));
        }
    });
    out
}

/// Call `f(i, row)` with the CFI row at `addrs[i]`, for each address an FDE covers.
fn each_row(
    input: &Input,
    fde_offsets: &[(u64, u64, usize)],
    addrs: &[u64],
    mut f: impl FnMut(usize, &gimli::UnwindTableRow<usize>),
) {
    let Ok(Some((eh_addr, bytes))) = locate(input) else {
        return;
    };
    let bases = bases(input, eh_addr);
    let section = EhFrame::new(bytes, LittleEndian);
    let mut ctx = Box::new(UnwindContext::new());
    for (i, &addr) in addrs.iter().enumerate() {
        // The innermost FDE containing `addr` (FDEs do not nest in practice).
        let k = fde_offsets.partition_point(|f| f.0 <= addr);
        let Some(&(_, end, off)) = fde_offsets[..k].last() else {
            continue;
        };
        if addr >= end {
            continue;
        }
        let Ok(fde) = section.fde_from_offset(&bases, EhFrameOffset(off), EhFrame::cie_from_offset)
        else {
            continue;
        };
        if let Ok(row) = fde.unwind_info_for_address(&section, &bases, &mut ctx, addr) {
            f(i, row);
        }
    }
}

fn read_u64(input: &Input, addr: u64) -> Option<u64> {
    let b = input.bytes_at(addr)?.get(..8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The LSDA header and call-site table, as the GCC personality routine reads them
/// (`parse_lsda_header` in libgcc): landing pad = LPStart + lp, with LPStart the
/// function start unless given; lp == 0 means "no landing pad".
fn parse_lsda(input: &Input, lsda: u64, func: u64, pads: &mut Vec<u64>) -> Result<(), String> {
    let bytes = input
        .bytes_at(lsda)
        .ok_or_else(|| "the LSDA address is not in the file".to_string())?;
    let mut c = Cursor::new(bytes, lsda);
    let lp_enc = c.u8()?;
    let lpstart = if lp_enc == PE_OMIT {
        func
    } else {
        c.encoded(input, lp_enc, Some(func))?
    };
    let tt_enc = c.u8()?;
    if tt_enc != PE_OMIT {
        c.uleb()?;
    }
    let cs_enc = c.u8()?;
    if cs_enc == PE_OMIT {
        return Err("call-site encoding is DW_EH_PE_omit".into());
    }
    let cs_len = c.uleb()?;
    let end = c
        .pos
        .checked_add(usize::try_from(cs_len).map_err(|_| "call-site table too long")?)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| format!("call-site table ({cs_len} bytes) runs past the file"))?;
    while c.pos < end {
        let _start = c.encoded(input, cs_enc, Some(func))?;
        let _len = c.encoded(input, cs_enc, Some(func))?;
        let lp = c.encoded(input, cs_enc, Some(func))?;
        let _action = c.uleb()?;
        if lp != 0 {
            pads.push(lpstart.wrapping_add(lp));
        }
    }
    if c.pos != end {
        return Err("the last call-site entry runs past the call-site table".into());
    }
    Ok(())
}

/// A bounds-checked little-endian reader that knows the address of each byte (for
/// `DW_EH_PE_pcrel`).
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    addr: u64,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8], addr: u64) -> Self {
        Cursor {
            bytes,
            pos: 0,
            addr,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let s = self
            .pos
            .checked_add(n)
            .and_then(|e| self.bytes.get(self.pos..e))
            .ok_or_else(|| format!("truncated at {:#x}", self.addr + self.pos as u64))?;
        self.pos += n;
        Ok(s)
    }

    fn skip(&mut self, n: usize) -> Result<(), String> {
        self.take(n).map(|_| ())
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn fixed(&mut self, n: usize) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(self.take(n)?);
        Ok(u64::from_le_bytes(b))
    }

    /// A LEB128 number's low 64 bits, how many bits it had, and its last byte.
    fn leb(&mut self) -> Result<(u64, u32, u8), String> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                return Ok((v, shift, b));
            }
        }
    }

    fn uleb(&mut self) -> Result<u64, String> {
        Ok(self.leb()?.0)
    }

    fn sleb(&mut self) -> Result<u64, String> {
        let (mut v, shift, last) = self.leb()?;
        if shift < 64 && last & 0x40 != 0 {
            v |= !0u64 << shift;
        }
        Ok(v)
    }

    /// One `DW_EH_PE_*`-encoded value. `func` is the base of `DW_EH_PE_funcrel`.
    fn encoded(&mut self, input: &Input, enc: u8, func: Option<u64>) -> Result<u64, String> {
        let here = self.addr.wrapping_add(self.pos as u64);
        if enc & 0x70 == PE_ALIGNED {
            let a = here.next_multiple_of(8);
            self.skip((a - here) as usize)?;
            let v = self.fixed(8)?;
            return self.deref(input, enc, v);
        }
        let raw = match enc & 0x0f {
            0x00 => self.fixed(8)?,
            0x01 => self.uleb()?,
            0x02 => self.fixed(2)?,
            0x03 => self.fixed(4)?,
            0x04 => self.fixed(8)?,
            0x09 => self.sleb()?,
            0x0a => self.fixed(2)? as u16 as i16 as i64 as u64,
            0x0b => self.fixed(4)? as u32 as i32 as i64 as u64,
            0x0c => self.fixed(8)?,
            f => return Err(format!("unknown pointer format {f:#x} (encoding {enc:#x})")),
        };
        let v = match enc & 0x70 {
            0 => raw,
            PE_PCREL => here.wrapping_add(raw),
            PE_FUNCREL => func
                .ok_or("DW_EH_PE_funcrel outside a function")?
                .wrapping_add(raw),
            PE_TEXTREL | PE_DATAREL => {
                // The GCC personality cannot resolve these on x86-64 or AArch64 either.
                return Err(format!(
                    "unsupported pointer application in encoding {enc:#x}"
                ));
            }
            a => return Err(format!("unknown pointer application {a:#x}")),
        };
        self.deref(input, enc, v)
    }

    fn deref(&self, input: &Input, enc: u8, v: u64) -> Result<u64, String> {
        if enc & PE_INDIRECT == 0 || enc == PE_OMIT {
            return Ok(v);
        }
        read_u64(input, v).ok_or_else(|| format!("indirect pointer at {v:#x} is not in the file"))
    }
}
