//! USDT probes: the `<sys/sdt.h>` probe sites of a binary, read from its `.note.stapsdt`
//! notes, with each argument's location parsed into a typed, ISA-tagged form.
//!
//! A note (owner `stapsdt`, type 3) describes one probe site. Its descriptor holds three
//! address-sized words — the probe pc, the link-time address of `.stapsdt.base`, the
//! semaphore address (0 if none) — then three NUL-terminated strings: provider, name and
//! the argument specification. The pc marks a `nop` the compiler emitted (1 byte on
//! x86-64, 4 on AArch64).
//!
//! The specification is a space-separated list of `[-]SIZE[f]@OPERAND`: `-` means
//! signed, `f` floating point, and OPERAND is the operand string the compiler printed
//! for an `asm` input with constraint "nor" (immediate, offsettable memory, register),
//! in the target assembler's syntax. The forms accepted are listed at [`parse_arg`].
//!
//! A probe's semaphore (a `u16` in `.probes` that the program tests before computing
//! the arguments) is never written by the rewriter, so a rewritten program without a
//! tracer behaves exactly like the original: `emit` adds one never-executed `nop` per
//! semaphore (an anchor, listed in the metadata) on which the tracer opens a perf
//! uprobe event with the semaphore as its reference counter.

pub use crate::isa::arg::{Arg, ArgError, ArgLoc, Reg, parse_arg};
use object::elf;
use object::read::elf::{ElfFile, FileHeader, SectionHeader as _, Sym as _};
use object::{Endian as _, FileKind};

/// Note owner and type of a probe descriptor (`_SDT_NOTE_NAME`, `_SDT_NOTE_TYPE`).
const NOTE_NAME: &[u8] = b"stapsdt";
const NOTE_TYPE: u32 = 3;
/// The section whose address the notes record, to detect prelink-style relocation.
const BASE_SECTION: &[u8] = b".stapsdt.base";

/// One probe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub provider: String,
    pub name: String,
    /// Link-time virtual address of the probe's `nop`, adjusted for prelink (see
    /// [`probes`]).
    pub pc: u64,
    /// Link-time virtual address of the probe's semaphore (a `u16` a tracer increments
    /// while attached), or `None` when the probe has none.
    pub semaphore: Option<u64>,
    pub args: Vec<Arg>,
    /// The argument specification exactly as the note holds it.
    pub arg_text: String,
}

/// Why a binary's probes could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsdtError {
    #[error("malformed ELF: {0}")]
    Elf(#[from] object::Error),
    #[error("not an ELF file")]
    NotElf,
    #[error("e_machine is {actual:#x}, but {expected:#x} was asked for")]
    MachineMismatch { expected: u16, actual: u16 },
    #[error("USDT arguments are not supported for e_machine {0:#x} (only x86-64 and AArch64)")]
    UnsupportedMachine(u16),
    #[error("stapsdt note #{index}: {reason}")]
    Note { index: usize, reason: String },
    /// Boxed: the context is large and errors are rare.
    #[error(transparent)]
    Arg(Box<ArgFailure>),
}

/// An argument of a probe that [`parse_arg`] rejected, with where it came from.
#[derive(Debug, thiserror::Error)]
#[error("probe {provider}:{name} at {pc:#x}: argument {arg} `{text}` (of `{arg_text}`): {source}")]
pub struct ArgFailure {
    pub provider: String,
    pub name: String,
    pub pc: u64,
    /// 1-based, like `$arg1` in tracers.
    pub arg: usize,
    pub text: String,
    pub arg_text: String,
    pub source: ArgError,
}

/// All USDT probes of `data`, an ELF image whose `e_machine` is `machine`
/// (`object::elf::EM_X86_64` or `EM_AARCH64`; it selects the operand syntax), in note
/// order.
///
/// Addresses are link-time virtual addresses. When `.stapsdt.base` is not where the
/// notes say (the file was prelinked after the notes were written), pc and semaphore are
/// moved by the same amount, as sdt.h consumers do. Without section headers there are no
/// notes to read and the result is empty. Symbolic operands are resolved through
/// `.symtab`, falling back to `.dynsym`.
pub fn probes(data: &[u8], machine: u16) -> Result<Vec<Probe>, UsdtError> {
    match FileKind::parse(data)? {
        FileKind::Elf32 => probes_in::<elf::FileHeader32<object::Endianness>>(data, machine),
        FileKind::Elf64 => probes_in::<elf::FileHeader64<object::Endianness>>(data, machine),
        _ => Err(UsdtError::NotElf),
    }
}

fn probes_in<Elf: FileHeader<Endian = object::Endianness>>(
    data: &[u8],
    machine: u16,
) -> Result<Vec<Probe>, UsdtError> {
    let file = ElfFile::<Elf>::parse(data)?;
    let endian = file.endian();
    let actual = file.elf_header().e_machine(endian);
    if actual != machine {
        return Err(UsdtError::MachineMismatch {
            expected: machine,
            actual,
        });
    }
    if crate::isa::of(machine).is_none() {
        return Err(UsdtError::UnsupportedMachine(machine));
    }
    let sections = file.elf_section_table();
    let base_addr: Option<u64> = sections
        .section_by_name(endian, BASE_SECTION)
        .map(|(_, s)| s.sh_addr(endian).into());
    let symbols = Symbols::new(&file);
    let word = if file.elf_header().is_class_64() {
        8
    } else {
        4
    };

    let mut out = Vec::new();
    let mut index = 0;
    for section in sections.iter() {
        let Some(mut notes) = section.notes(endian, data)? else {
            continue;
        };
        while let Some(note) = notes.next()? {
            if note.name() != NOTE_NAME || note.n_type(endian) != NOTE_TYPE {
                continue;
            }
            let raw = parse_desc(note.desc(), word, endian)
                .map_err(|reason| UsdtError::Note { index, reason })?;
            index += 1;
            // Prelink moves every section but cannot rewrite the notes (they are not
            // allocated); the distance .stapsdt.base moved is the distance everything moved.
            let adjust = base_addr.map_or(0, |b| b.wrapping_sub(raw.base));
            let pc = raw.pc.wrapping_add(adjust);
            let semaphore = (raw.semaphore != 0).then(|| raw.semaphore.wrapping_add(adjust));
            let resolve = |sym: &str| symbols.resolve(sym);
            let args =
                parse_args(raw.args, machine, pc, &resolve).map_err(|(arg, text, source)| {
                    UsdtError::Arg(Box::new(ArgFailure {
                        provider: raw.provider.into(),
                        name: raw.name.into(),
                        pc,
                        arg,
                        text,
                        arg_text: raw.args.into(),
                        source,
                    }))
                })?;
            out.push(Probe {
                provider: raw.provider.into(),
                name: raw.name.into(),
                pc,
                semaphore,
                args,
                arg_text: raw.args.into(),
            });
        }
    }
    Ok(out)
}

/// A note descriptor before address adjustment and argument parsing.
struct RawNote<'a> {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: &'a str,
    name: &'a str,
    args: &'a str,
}

fn parse_desc(desc: &[u8], word: usize, endian: object::Endianness) -> Result<RawNote<'_>, String> {
    if desc.len() < 3 * word {
        return Err(format!(
            "descriptor is {} bytes, shorter than its three {word}-byte addresses",
            desc.len()
        ));
    }
    // `word` is 4 or 8 and the length was checked, so one of the conversions succeeds.
    let read = |i: usize| -> u64 {
        let b = &desc[i * word..(i + 1) * word];
        if let Ok(b8) = <[u8; 8]>::try_from(b) {
            endian.read_u64_bytes(b8)
        } else if let Ok(b4) = <[u8; 4]>::try_from(b) {
            u64::from(endian.read_u32_bytes(b4))
        } else {
            0
        }
    };
    let (pc, base, semaphore) = (read(0), read(1), read(2));
    let mut strings = desc[3 * word..].split(|&b| b == 0);
    let mut next = |what: &str| -> Result<&str, String> {
        let s = strings.next().unwrap_or_default();
        std::str::from_utf8(s).map_err(|_| format!("{what} is not UTF-8: {s:?}"))
    };
    let provider = next("provider")?;
    let name = next("name")?;
    // Notes written before argument support end after the name: no arguments.
    let args = next("argument string")?;
    if provider.is_empty() || name.is_empty() {
        return Err(format!("empty provider or name ({provider:?}:{name:?})"));
    }
    Ok(RawNote {
        pc,
        base,
        semaphore,
        provider,
        name,
        args,
    })
}

/// Name → defined addresses, from `.symtab`, else `.dynsym`.
struct Symbols<'data> {
    defs: Vec<(&'data [u8], u64)>,
}

impl<'data> Symbols<'data> {
    fn new<Elf: FileHeader>(file: &ElfFile<'data, Elf>) -> Self {
        let endian = file.endian();
        let table = if file.elf_symbol_table().is_empty() {
            file.elf_dynamic_symbol_table()
        } else {
            file.elf_symbol_table()
        };
        let defs = table
            .symbols()
            .iter()
            .filter(|s| {
                // A TLS symbol's value is an offset, not an address.
                !s.is_undefined(endian)
                    && !matches!(s.st_type(), elf::STT_SECTION | elf::STT_FILE | elf::STT_TLS)
            })
            .filter_map(|s| {
                Some((
                    table.symbol_name(endian, s).ok()?,
                    s.st_value(endian).into(),
                ))
            })
            .collect();
        Symbols { defs }
    }

    /// The one address `name` is defined at. Two TU-local objects may share a name
    /// (`static int count;` in two files); the note text cannot say which one it
    /// means, so that is an error rather than a guess.
    fn resolve(&self, name: &str) -> Result<u64, ArgError> {
        let mut addrs: Vec<u64> = self
            .defs
            .iter()
            .filter(|(n, _)| *n == name.as_bytes())
            .map(|&(_, a)| a)
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        match addrs[..] {
            [a] => Ok(a),
            [] => Err(ArgError::UnknownSymbol(name.into())),
            _ => Err(ArgError::AmbiguousSymbol(name.into(), addrs.len())),
        }
    }
}

/// Parse a whole argument specification. `pc` is the probe's address (for numeric
/// `N(%rip)`), `resolve` maps a symbol name to its link-time address. On error, returns
/// the 1-based argument number, its text and the reason.
pub fn parse_args(
    spec: &str,
    machine: u16,
    pc: u64,
    resolve: &dyn Fn(&str) -> Result<u64, ArgError>,
) -> Result<Vec<Arg>, (usize, String, ArgError)> {
    split_args(spec)
        .enumerate()
        .map(|(i, text)| {
            parse_arg(text, machine, pc, resolve).map_err(|e| (i + 1, text.to_string(), e))
        })
        .collect()
}

/// Split at whitespace outside brackets: AArch64 memory operands contain a space
/// (`[sp, 16]`).
fn split_args(spec: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0i32;
    let mut start = None;
    let mut parts = Vec::new();
    for (i, c) in spec.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            _ => {}
        }
        if c.is_whitespace() && depth <= 0 {
            if let Some(s) = start.take() {
                parts.push(&spec[s..i]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        parts.push(&spec[s..]);
    }
    parts.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::Register as R;

    const X86: u16 = elf::EM_X86_64;
    const A64: u16 = elf::EM_AARCH64;
    const PC: u64 = 0x1000;

    fn syms(name: &str) -> Result<u64, ArgError> {
        match name {
            "g_counter" => Ok(0x4010),
            "gs" => Ok(0x4020),
            "counter.0" => Ok(0x4ffc),
            "dup" => Err(ArgError::AmbiguousSymbol("dup".into(), 2)),
            _ => Err(ArgError::UnknownSymbol(name.into())),
        }
    }

    fn arg(text: &str, machine: u16) -> Result<Arg, ArgError> {
        parse_arg(text, machine, PC, &syms)
    }

    fn loc(text: &str, machine: u16) -> ArgLoc {
        match arg(text, machine) {
            Ok(a) => a.loc,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn x(reg: R) -> Reg {
        Reg::X86 { reg, high8: false }
    }

    fn mem(base: Option<Reg>, index: Option<(Reg, u8)>, disp: i64) -> ArgLoc {
        ArgLoc::Mem { base, index, disp }
    }

    #[test]
    fn size_prefix() {
        let a = arg("-4@%eax", X86).unwrap();
        assert_eq!((a.size, a.signed, a.float), (4, true, false));
        let a = arg("1@%al", X86).unwrap();
        assert_eq!((a.size, a.signed, a.float), (1, false, false));
        let a = arg("8f@%rcx", X86).unwrap();
        assert_eq!((a.size, a.signed, a.float), (8, false, true));
        let a = arg("-4f@x2", A64).unwrap();
        assert_eq!((a.size, a.signed, a.float), (4, true, true));
        // No size: an old note; the whole register, unsigned.
        let a = arg("%rdi", X86).unwrap();
        assert_eq!(
            (a.size, a.signed, a.loc),
            (8, false, ArgLoc::Reg(x(R::RDI)))
        );
        let a = arg("x3", A64).unwrap();
        assert_eq!(
            (a.size, a.signed, a.loc),
            (8, false, ArgLoc::Reg(Reg::A64(3)))
        );
        for bad in [
            "3@%eax", "16@%rax", "-0@%eax", "1f@%al", "2f@%ax", "256@%eax",
        ] {
            assert!(
                matches!(arg(bad, X86), Err(ArgError::Size(_))),
                "{bad}: {:?}",
                arg(bad, X86)
            );
        }
    }

    #[test]
    fn x86_registers() {
        let cases = [
            ("8@%rax", R::RAX, false),
            ("-4@%edi", R::RDI, false),
            ("-2@%ax", R::RAX, false),
            ("1@%al", R::RAX, false),
            ("1@%ah", R::RAX, true),
            ("1@%bh", R::RBX, true),
            ("1@%sil", R::RSI, false),
            ("1@%dil", R::RDI, false),
            ("1@%bpl", R::RBP, false),
            ("1@%spl", R::RSP, false),
            ("-2@%sp", R::RSP, false),
            ("8@%rbp", R::RBP, false),
            ("-8@%r8", R::R8, false),
            ("-4@%r9d", R::R9, false),
            ("-2@%r12w", R::R12, false),
            ("-1@%r13b", R::R13, false),
            ("8@%r15", R::R15, false),
        ];
        for (text, reg, high8) in cases {
            assert_eq!(
                loc(text, X86),
                ArgLoc::Reg(Reg::X86 { reg, high8 }),
                "{text}"
            );
        }
        for bad in [
            "4@%xmm0", "8@%r16", "8@%r7", "8@%r08", "4@%r8x", "8@%rip", "4@%", "4@%foo",
        ] {
            assert!(
                matches!(arg(bad, X86), Err(ArgError::Register(_))),
                "{bad}: {:?}",
                arg(bad, X86)
            );
        }
    }

    #[test]
    fn x86_immediates() {
        assert_eq!(loc("-4@$0", X86), ArgLoc::Imm(0));
        assert_eq!(loc("-4@$-1", X86), ArgLoc::Imm(-1));
        assert_eq!(loc("-4@$-100000", X86), ArgLoc::Imm(-100000));
        assert_eq!(loc("-8@$4886718345", X86), ArgLoc::Imm(0x1_2345_6789));
        assert_eq!(loc("8@$0x10", X86), ArgLoc::Imm(16));
        assert_eq!(loc("8@$-9223372036854775808", X86), ArgLoc::Imm(i64::MIN));
        assert_eq!(loc("8@$0xffffffffffffffff", X86), ArgLoc::Imm(-1));
        for bad in [
            "4@$",
            "4@$g_counter",
            "4@$1x",
            "8@$99999999999999999999",
            "4@$--1",
        ] {
            assert!(
                matches!(arg(bad, X86), Err(ArgError::Form(_))),
                "{bad}: {:?}",
                arg(bad, X86)
            );
        }
    }

    #[test]
    fn x86_memory() {
        let rbp = Some(x(R::RBP));
        assert_eq!(loc("-4@-20(%rbp)", X86), mem(rbp, None, -20));
        assert_eq!(loc("-8@0(%rbp)", X86), mem(rbp, None, 0));
        assert_eq!(loc("-4@(%r12)", X86), mem(Some(x(R::R12)), None, 0));
        assert_eq!(loc("-1@(%rsp)", X86), mem(Some(x(R::RSP)), None, 0));
        assert_eq!(loc("8@0x18(%rsp)", X86), mem(Some(x(R::RSP)), None, 24));
        assert_eq!(
            loc("-8@0(%r13,%rbx,8)", X86),
            mem(Some(x(R::R13)), Some((x(R::RBX), 8)), 0)
        );
        assert_eq!(
            loc("-8@16(%rax,%rcx)", X86),
            mem(Some(x(R::RAX)), Some((x(R::RCX), 1)), 16)
        );
        assert_eq!(
            loc("-8@-4(,%rcx,4)", X86),
            mem(None, Some((x(R::RCX), 4)), -4)
        );
        // A symbolic displacement with registers (position-dependent code).
        assert_eq!(
            loc("-8@gs+8(,%rax,8)", X86),
            mem(None, Some((x(R::RAX), 8)), 0x4028)
        );
        for bad in [
            "4@8(%eax)",
            "4@8(%rbp,%rsp)",
            "4@8(%rbp,%rcx,3)",
            "4@8(%rbp,%rcx,8,1)",
            "4@8(%rbp",
            "4@8()",
            "4@8(,)",
            "4@(%rip,%rax)",
            "4@8(%al)",
            "4@8(%ah)",
        ] {
            assert!(
                matches!(arg(bad, X86), Err(ArgError::Form(_))),
                "{bad}: {:?}",
                arg(bad, X86)
            );
        }
        assert_eq!(
            arg("4@8(%foo)", X86),
            Err(ArgError::Register("%foo".into()))
        );
    }

    #[test]
    fn x86_rip_relative_and_absolute() {
        let st = |addr| ArgLoc::Static { addr };
        assert_eq!(loc("-4@g_counter(%rip)", X86), st(0x4010));
        assert_eq!(loc("-8@8+gs(%rip)", X86), st(0x4028));
        assert_eq!(loc("-8@gs+8(%rip)", X86), st(0x4028));
        assert_eq!(loc("-8@gs-8(%rip)", X86), st(0x4018));
        assert_eq!(loc("-8@-8+gs(%rip)", X86), st(0x4018));
        assert_eq!(loc("-4@counter.0(%rip)", X86), st(0x4ffc));
        // Numeric: relative to the probe pc.
        assert_eq!(loc("-4@16(%rip)", X86), st(PC + 16));
        assert_eq!(loc("-4@-16(%rip)", X86), st(PC - 16));
        // Absolute.
        assert_eq!(loc("-4@g_counter", X86), st(0x4010));
        assert_eq!(loc("-4@0x601040", X86), st(0x601040));
        assert_eq!(
            arg("4@nosuch(%rip)", X86),
            Err(ArgError::UnknownSymbol("nosuch".into()))
        );
        assert_eq!(
            arg("4@dup+4(%rip)", X86),
            Err(ArgError::AmbiguousSymbol("dup".into(), 2))
        );
        for bad in [
            "8@g_counter@GOTPCREL(%rip)",
            "g_counter@GOTPCREL(%rip)",
            "4@gs+g_counter(%rip)",
            "4@-gs(%rip)",
            "4@gs+(%rip)",
            "4@1+2+(%rip)",
        ] {
            assert!(
                matches!(arg(bad, X86), Err(ArgError::Form(_) | ArgError::Number(_))),
                "{bad}: {:?}",
                arg(bad, X86)
            );
        }
    }

    #[test]
    fn a64_registers_and_immediates() {
        assert_eq!(loc("-4@x19", A64), ArgLoc::Reg(Reg::A64(19)));
        assert_eq!(loc("-4@w19", A64), ArgLoc::Reg(Reg::A64(19)));
        assert_eq!(loc("8@x0", A64), ArgLoc::Reg(Reg::A64(0)));
        assert_eq!(loc("8@x30", A64), ArgLoc::Reg(Reg::A64(30)));
        assert_eq!(loc("8@lr", A64), ArgLoc::Reg(Reg::A64(30)));
        assert_eq!(loc("8@fp", A64), ArgLoc::Reg(Reg::A64(29)));
        assert_eq!(loc("8@sp", A64), ArgLoc::Reg(Reg::A64(31)));
        assert_eq!(loc("-8@xzr", A64), ArgLoc::Imm(0));
        assert_eq!(loc("-4@wzr", A64), ArgLoc::Imm(0));
        assert_eq!(loc("-4@42", A64), ArgLoc::Imm(42));
        assert_eq!(loc("-4@-1", A64), ArgLoc::Imm(-1));
        assert_eq!(loc("-4@#-100000", A64), ArgLoc::Imm(-100000));
        assert_eq!(loc("-8@4886718345", A64), ArgLoc::Imm(0x1_2345_6789));
        assert_eq!(loc("8@0x20", A64), ArgLoc::Imm(32));
        for bad in ["8@x31", "8@x01", "4@w32", "8@xsp", "8@x"] {
            assert!(
                matches!(arg(bad, A64), Err(ArgError::Register(_))),
                "{bad}: {:?}",
                arg(bad, A64)
            );
        }
        for bad in ["8@d0", "8@v1", "8@#", "8@foo", "8@%rax", "8@$1"] {
            assert!(
                matches!(arg(bad, A64), Err(ArgError::Form(_))),
                "{bad}: {:?}",
                arg(bad, A64)
            );
        }
    }

    #[test]
    fn a64_memory() {
        let r = |n| Some(Reg::A64(n));
        assert_eq!(loc("-8@[x20]", A64), mem(r(20), None, 0));
        assert_eq!(loc("-4@[x20, 8]", A64), mem(r(20), None, 8));
        assert_eq!(loc("-4@[sp, 28]", A64), mem(r(31), None, 28));
        assert_eq!(loc("-8@[x29, -8]", A64), mem(r(29), None, -8));
        assert_eq!(loc("-8@[x29,#-8]", A64), mem(r(29), None, -8));
        assert_eq!(loc("-8@[x1, #0x10]", A64), mem(r(1), None, 16));
        assert_eq!(
            loc("-8@[x1, x2]", A64),
            mem(r(1), Some((Reg::A64(2), 1)), 0)
        );
        assert_eq!(
            loc("-8@[x1, x2, lsl 3]", A64),
            mem(r(1), Some((Reg::A64(2), 8)), 0)
        );
        assert_eq!(
            loc("-4@[x1, x2, lsl #2]", A64),
            mem(r(1), Some((Reg::A64(2), 4)), 0)
        );
        // :lo12: g_counter = 0x4010 → offset 0x010 from the page in x0.
        assert_eq!(loc("-4@[x0, #:lo12:g_counter]", A64), mem(r(0), None, 0x10));
        assert_eq!(loc("-4@[x0, :lo12:gs+8]", A64), mem(r(0), None, 0x28));
        assert_eq!(loc("-4@[x0, #:lo12:counter.0+4]", A64), mem(r(0), None, 0));
        assert_eq!(
            arg("-4@[x0, #:lo12:nosuch]", A64),
            Err(ArgError::UnknownSymbol("nosuch".into()))
        );
        for bad in [
            "8@[x1",
            "8@[x1, 8]!",
            "8@[x1], 8",
            "8@[w1]",
            "8@[xzr]",
            "8@[x1, sp]",
            "8@[x1, w2, sxtw 2]",
            "8@[x1, x2, lsl 4]",
            "8@[x1, #:got:g_counter]",
            "8@[x1, #:lo12:8]",
            "8@[x1, 8, 8]",
            "8@[x1, 1, 2, 3]",
        ] {
            assert!(
                matches!(arg(bad, A64), Err(ArgError::Form(_))),
                "{bad}: {:?}",
                arg(bad, A64)
            );
        }
        assert_eq!(arg("8@[q1]", A64), Err(ArgError::Register("q1".into())));
        assert_eq!(arg("8@[]", A64), Err(ArgError::Register("".into())));
    }

    #[test]
    fn whole_specs() {
        let args = parse_args("-4@[x20, 8]  -2@[x20, 12] -8@x0 -4@42", A64, PC, &syms).unwrap();
        assert_eq!(args.len(), 4);
        assert_eq!(args[1].loc, mem(Some(Reg::A64(20)), None, 12));
        assert_eq!(args[3].loc, ArgLoc::Imm(42));
        assert_eq!(parse_args("", X86, PC, &syms).unwrap(), vec![]);
        assert_eq!(parse_args("  ", X86, PC, &syms).unwrap(), vec![]);
        let err = parse_args("-4@%eax -4@%bogus 8@%rdi", X86, PC, &syms).unwrap_err();
        assert_eq!(
            err,
            (
                2,
                "-4@%bogus".to_string(),
                ArgError::Register("%bogus".into())
            )
        );
        // Other machines have no operand grammar here.
        assert!(parse_args("4@r0", elf::EM_RISCV, PC, &syms).is_err());
    }
}
