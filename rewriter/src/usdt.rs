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

/// One probe argument: how many bytes of the location are the value, and where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    /// Width of the value in bytes: 1, 2, 4 or 8. It governs even when the register
    /// named in the operand is wider or narrower (sdt.h, gdb PR24541): on AArch64 gcc
    /// names `x19` for an `int`, and a `-1@%al` value is the low byte of RAX.
    pub size: u8,
    /// The value should be sign-extended from `size` bytes (`-` prefix).
    pub signed: bool,
    /// The value is a float/double (`f` suffix). Compilers still place it in an integer
    /// register or in memory (the "nor" constraint), so `loc` reads its bit pattern.
    pub float: bool,
    pub loc: ArgLoc,
}

/// Where an argument's value is at the probe pc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgLoc {
    /// A constant (x86-64 `$-5`, AArch64 `-5` or `#-5`; `xzr`/`wzr` read as 0).
    Imm(i64),
    /// The low `size` bytes of a register (above bit 8 for x86 `%ah`..`%bh`, see
    /// [`Reg::X86`]).
    Reg(Reg),
    /// `size` bytes at `base + index * scale + disp`. At least one of `base` and
    /// `index` is present; an operand without registers is [`ArgLoc::Static`]. A
    /// symbolic displacement (`sym+8(%rbx)`, position-dependent code only) is resolved
    /// into `disp`.
    Mem {
        base: Option<Reg>,
        index: Option<(Reg, u8)>,
        disp: i64,
    },
    /// `size` bytes at a fixed link-time virtual address: add the load bias at run time.
    /// x86-64 RIP-relative operands land here, as gcc names the object (`g(%rip)`,
    /// `8+g(%rip)`, `g+8(%rip)`) and the symbol table gives its address. A purely
    /// numeric `N(%rip)` (no compiler emits one) is taken relative to the probe pc,
    /// which is what RIP holds when a debugger stops on the probe. Absolute operands
    /// (`g`, `0x601040`) land here too.
    Static { addr: u64 },
}

/// A register named in an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// x86-64: always the 64-bit register that holds the named one (`%edi`, `%di`,
    /// `%dil` → RDI); the width comes from [`Arg::size`]. `high8` is set for the legacy
    /// high-byte registers `%ah`, `%bh`, `%ch`, `%dh` (value in bits 8..16 of the
    /// parent). Compilers do not allocate those for sdt.h operands ("r" never picks a
    /// high-byte register), but hand-written `STAP_PROBE_ASM` arguments can name them.
    X86 {
        reg: iced_x86::Register,
        high8: bool,
    },
    /// AArch64 general register: `x0`..`x30` (and `w0`..`w30`, `fp`, `lr`) = 0..30,
    /// `sp`/`wsp` = 31.
    A64(u8),
}

/// Why one argument operand was not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("bad size prefix `{0}` (want [-]1|2|4|8[f]@)")]
    Size(String),
    #[error("unknown register `{0}`")]
    Register(String),
    #[error("bad number `{0}`")]
    Number(String),
    #[error("unsupported operand form `{0}`")]
    Form(String),
    #[error("symbol `{0}` is not defined in the symbol table (.symtab/.dynsym)")]
    UnknownSymbol(String),
    #[error("symbol `{0}` has {1} definitions at different addresses")]
    AmbiguousSymbol(String, usize),
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
    if machine != elf::EM_X86_64 && machine != elf::EM_AARCH64 {
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

/// Parse one argument, `[-]SIZE[f]@OPERAND`.
///
/// Without a size prefix (notes older than sdt.h v3) the value is taken as 8 bytes,
/// unsigned: the whole register or word, which needs no extension either way.
///
/// x86-64 operands (AT&T): `%reg` (any width of a general register, `%ah`..`%dh`);
/// `$N`; `(%base)`, `D(%base)`, `D(%base,%index[,scale])`, `D(,%index[,scale])`;
/// `D(%rip)`; bare `D` (absolute). D is a sum like `-8`, `0x10`, `sym`, `sym+8`,
/// `8+sym`, `sym-8`, with at most one symbol. Base and index are 64-bit registers.
///
/// AArch64 operands: `xN`, `wN`, `sp`, `wsp`, `fp`, `lr`, `xzr`/`wzr` (immediate 0);
/// `N`/`#N`; `[xN]`, `[xN, #?N]`, `[xN, #?:lo12:sym[+N]]` (base holds the page
/// address from `adrp`), `[xN, xM]`, `[xN, xM, lsl #?K]`.
///
/// Numbers are decimal or `0x` hex, optionally negative.
pub fn parse_arg(
    text: &str,
    machine: u16,
    pc: u64,
    resolve: &dyn Fn(&str) -> Result<u64, ArgError>,
) -> Result<Arg, ArgError> {
    let (size, signed, float, operand) = match split_size(text)? {
        Some(s) => s,
        None => (8, false, false, text),
    };
    let loc = match machine {
        elf::EM_X86_64 => x86::operand(operand, pc, resolve)?,
        elf::EM_AARCH64 => a64::operand(operand, resolve)?,
        _ => return Err(ArgError::Form(text.into())),
    };
    Ok(Arg {
        size,
        signed,
        float,
        loc,
    })
}

/// `Some((size, signed, float, operand))` when `text` has a `[-]N[f]@` prefix.
fn split_size(text: &str) -> Result<Option<(u8, bool, bool, &str)>, ArgError> {
    let Some((prefix, operand)) = text.split_once('@') else {
        return Ok(None);
    };
    let (signed, rest) = match prefix.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, prefix),
    };
    let (float, digits) = match rest.strip_suffix('f') {
        Some(d) => (true, d),
        None => (false, rest),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        // Not a size: an old-style operand that itself contains '@' (a relocation
        // specifier such as `sym@GOTPCREL(%rip)`), rejected by the operand parser.
        return Ok(None);
    }
    match digits.parse::<u8>() {
        Ok(size @ (1 | 2 | 4 | 8)) if !float || size >= 4 => {
            Ok(Some((size, signed, float, operand)))
        }
        _ => Err(ArgError::Size(format!("{prefix}@"))),
    }
}

/// Decimal or `0x` hex, optionally negative; `0x8000000000000000`..`0xffff..` wrap to
/// negative (an address-sized displacement written unsigned).
fn number(s: &str) -> Result<i64, ArgError> {
    let bad = || ArgError::Number(s.into());
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let magnitude = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) if !hex.is_empty() => u64::from_str_radix(hex, 16).map_err(|_| bad())?,
        Some(_) => return Err(bad()),
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            digits.parse::<u64>().map_err(|_| bad())?
        }
        None => return Err(bad()),
    };
    if neg {
        // -(2^63) is the most negative value; anything larger does not fit.
        if magnitude > 1 << 63 {
            return Err(bad());
        }
        Ok((magnitude as i64).wrapping_neg())
    } else {
        Ok(magnitude as i64)
    }
}

fn is_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '.')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$')
}

/// An address expression: terms joined by `+`/`-`, at most one a symbol (added).
/// Returns the numeric sum and the symbol, if any.
fn expression(s: &str) -> Result<(i64, Option<&str>), ArgError> {
    let form = || ArgError::Form(s.into());
    if s.contains('@') {
        // `sym@GOTPCREL` and friends: the operand is a GOT slot, not the object.
        return Err(form());
    }
    let mut sum = 0i64;
    let mut symbol = None;
    let mut rest = s;
    let mut negative = false;
    // The first term may carry its own sign: `-8`, `-8+sym`.
    if let Some(r) = rest.strip_prefix('-') {
        negative = true;
        rest = r;
    }
    loop {
        let end = rest.find(['+', '-']).unwrap_or(rest.len());
        let term = &rest[..end];
        if is_symbol(term) {
            if negative || symbol.is_some() {
                return Err(form());
            }
            symbol = Some(term);
        } else {
            let v = number(term)?;
            sum = if negative {
                sum.checked_sub(v)
            } else {
                sum.checked_add(v)
            }
            .ok_or_else(form)?;
        }
        if end == rest.len() {
            return Ok((sum, symbol));
        }
        negative = rest.as_bytes()[end] == b'-';
        rest = &rest[end + 1..];
    }
}

mod x86 {
    use super::{ArgError, ArgLoc, Reg, expression, number};
    use iced_x86::Register as R;

    /// `(name, 64-bit parent, high8)` for every general-register name.
    const REGS: &[(&str, R, bool)] = &[
        ("rax", R::RAX, false),
        ("eax", R::RAX, false),
        ("ax", R::RAX, false),
        ("al", R::RAX, false),
        ("ah", R::RAX, true),
        ("rbx", R::RBX, false),
        ("ebx", R::RBX, false),
        ("bx", R::RBX, false),
        ("bl", R::RBX, false),
        ("bh", R::RBX, true),
        ("rcx", R::RCX, false),
        ("ecx", R::RCX, false),
        ("cx", R::RCX, false),
        ("cl", R::RCX, false),
        ("ch", R::RCX, true),
        ("rdx", R::RDX, false),
        ("edx", R::RDX, false),
        ("dx", R::RDX, false),
        ("dl", R::RDX, false),
        ("dh", R::RDX, true),
        ("rsi", R::RSI, false),
        ("esi", R::RSI, false),
        ("si", R::RSI, false),
        ("sil", R::RSI, false),
        ("rdi", R::RDI, false),
        ("edi", R::RDI, false),
        ("di", R::RDI, false),
        ("dil", R::RDI, false),
        ("rbp", R::RBP, false),
        ("ebp", R::RBP, false),
        ("bp", R::RBP, false),
        ("bpl", R::RBP, false),
        ("rsp", R::RSP, false),
        ("esp", R::RSP, false),
        ("sp", R::RSP, false),
        ("spl", R::RSP, false),
    ];
    const NUMBERED: [R; 8] = [R::R8, R::R9, R::R10, R::R11, R::R12, R::R13, R::R14, R::R15];

    /// `name` without `%` → (64-bit parent, high8, named width in bytes).
    fn reg(name: &str) -> Option<(R, bool, u8)> {
        if let Some(&(_, r, high)) = REGS.iter().find(|(n, _, _)| *n == name) {
            let width = match name.len() {
                _ if high => 1,
                3 if name.starts_with('r') => 8,
                3 if name.starts_with('e') => 4,
                2 if !name.ends_with('l') => 2,
                _ => 1, // al, sil, dil, bpl, spl
            };
            return Some((r, high, width));
        }
        // r8..r15 with an optional width suffix: none, d, w, b.
        let rest = name.strip_prefix('r')?;
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (digits, suffix) = rest.split_at(split);
        if digits.starts_with('0') {
            return None;
        }
        let n: usize = digits.parse().ok()?;
        let r = *NUMBERED.get(n.checked_sub(8)?)?;
        let width = match suffix {
            "" => 8,
            "d" => 4,
            "w" => 2,
            "b" => 1,
            _ => return None,
        };
        Some((r, false, width))
    }

    fn named(text: &str) -> Result<(R, bool, u8), ArgError> {
        let name = text
            .strip_prefix('%')
            .ok_or_else(|| ArgError::Form(text.into()))?;
        reg(name).ok_or_else(|| ArgError::Register(text.into()))
    }

    /// A base or index register: 64-bit only (32-bit addressing needs an address-size
    /// prefix no compiler uses for these operands).
    fn address_reg(text: &str) -> Result<R, ArgError> {
        match named(text)? {
            (r, false, 8) => Ok(r),
            _ => Err(ArgError::Form(format!("{text} as an address register"))),
        }
    }

    pub(super) fn operand(
        op: &str,
        pc: u64,
        resolve: &dyn Fn(&str) -> Result<u64, ArgError>,
    ) -> Result<ArgLoc, ArgError> {
        if op.starts_with('%') {
            let (reg, high8, _) = named(op)?;
            return Ok(ArgLoc::Reg(Reg::X86 { reg, high8 }));
        }
        if let Some(imm) = op.strip_prefix('$') {
            // `$sym` (an address constant) would need the load bias; "n" never yields it.
            return number(imm)
                .map(ArgLoc::Imm)
                .map_err(|_| ArgError::Form(op.into()));
        }
        let (disp_text, regs) = match op.find('(') {
            Some(open) => {
                let inner = op[open + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| ArgError::Form(op.into()))?;
                (&op[..open], Some(inner))
            }
            None => (op, None),
        };
        let (num, sym) = if disp_text.is_empty() {
            (0, None)
        } else {
            expression(disp_text)?
        };
        let sym_addr = sym.map(resolve).transpose()?;
        let disp = match sym_addr {
            Some(a) => num.wrapping_add(a as i64),
            None => num,
        };
        let Some(inner) = regs else {
            if disp_text.is_empty() {
                return Err(ArgError::Form(op.into()));
            }
            return Ok(ArgLoc::Static { addr: disp as u64 });
        };
        let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
        if parts.first() == Some(&"%rip") {
            if parts.len() != 1 {
                return Err(ArgError::Form(op.into()));
            }
            let addr = match sym_addr {
                Some(_) => disp as u64,
                None => pc.wrapping_add(disp as u64),
            };
            return Ok(ArgLoc::Static { addr });
        }
        let (base, index) = match parts[..] {
            [b] => (Some(b), None),
            [b, i] => (Some(b).filter(|b| !b.is_empty()), Some((i, "1"))),
            [b, i, s] => (Some(b).filter(|b| !b.is_empty()), Some((i, s))),
            _ => return Err(ArgError::Form(op.into())),
        };
        let base = base.map(address_reg).transpose()?;
        let index = match index {
            Some((i, s)) => {
                let r = address_reg(i)?;
                if r == R::RSP {
                    return Err(ArgError::Form(format!("{i} as an index register")));
                }
                let scale = match s {
                    "1" => 1,
                    "2" => 2,
                    "4" => 4,
                    "8" => 8,
                    _ => return Err(ArgError::Form(format!("scale `{s}` in {op}"))),
                };
                Some((r, scale))
            }
            None => None,
        };
        if base.is_none() && index.is_none() {
            return Err(ArgError::Form(op.into()));
        }
        let x = |reg| Reg::X86 { reg, high8: false };
        Ok(ArgLoc::Mem {
            base: base.map(x),
            index: index.map(|(r, s)| (x(r), s)),
            disp,
        })
    }
}

mod a64 {
    use super::{ArgError, ArgLoc, Reg, expression, number};

    /// A general register name → (number, is the zero register). 31 is sp.
    fn reg(name: &str) -> Option<(u8, bool)> {
        match name {
            "sp" | "wsp" => return Some((31, false)),
            "xzr" | "wzr" => return Some((31, true)),
            "fp" => return Some((29, false)),
            "lr" => return Some((30, false)),
            _ => {}
        }
        let digits = name.strip_prefix('x').or_else(|| name.strip_prefix('w'))?;
        if digits.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || (digits.len() > 1 && digits.starts_with('0'))
        {
            return None;
        }
        let n: u8 = digits.parse().ok()?;
        (n <= 30).then_some((n, false))
    }

    fn looks_like_reg(s: &str) -> bool {
        s.starts_with(['x', 'w']) || matches!(s, "sp" | "fp" | "lr")
    }

    /// Base or index register of an address: an x register or sp, not xzr.
    fn address_reg(s: &str, op: &str) -> Result<u8, ArgError> {
        match reg(s) {
            Some((n, false)) if !s.starts_with('w') => Ok(n),
            Some(_) => Err(ArgError::Form(format!(
                "{s} as an address register in {op}"
            ))),
            None => Err(ArgError::Register(s.into())),
        }
    }

    fn imm(s: &str) -> Result<i64, ArgError> {
        number(s.strip_prefix('#').unwrap_or(s))
    }

    pub(super) fn operand(
        op: &str,
        resolve: &dyn Fn(&str) -> Result<u64, ArgError>,
    ) -> Result<ArgLoc, ArgError> {
        if let Some(inner) = op.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| ArgError::Form(op.into()))?;
            return memory(inner, op, resolve);
        }
        if let Some((n, zero)) = reg(op) {
            return Ok(match zero {
                true => ArgLoc::Imm(0),
                false => ArgLoc::Reg(Reg::A64(n)),
            });
        }
        match imm(op) {
            Ok(v) => Ok(ArgLoc::Imm(v)),
            Err(_) if looks_like_reg(op) => Err(ArgError::Register(op.into())),
            Err(_) => Err(ArgError::Form(op.into())),
        }
    }

    fn memory(
        inner: &str,
        op: &str,
        resolve: &dyn Fn(&str) -> Result<u64, ArgError>,
    ) -> Result<ArgLoc, ArgError> {
        let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
        let base = Some(Reg::A64(address_reg(parts[0], op)?));
        let (index, disp) = match parts[1..] {
            [] => (None, 0),
            [second] => {
                let second_bare = second.strip_prefix('#').unwrap_or(second);
                if let Some(expr) = second_bare.strip_prefix(":lo12:") {
                    // The low 12 bits of the symbol's address; the base register holds
                    // its 4 KiB page (adrp). Add the pieces, then take the low bits.
                    let (num, sym) = expression(expr)?;
                    let sym = sym.ok_or_else(|| ArgError::Form(op.into()))?;
                    let addr = resolve(sym)?.wrapping_add(num as u64);
                    (None, (addr & 0xfff) as i64)
                } else if second_bare.starts_with(':') {
                    return Err(ArgError::Form(op.into()));
                } else if looks_like_reg(second) {
                    (Some((Reg::A64(index_reg(second, op)?), 1)), 0)
                } else {
                    (None, imm(second)?)
                }
            }
            [second, shift] => {
                let amount = shift
                    .strip_prefix("lsl")
                    .map(str::trim)
                    .ok_or_else(|| ArgError::Form(op.into()))?;
                let k = imm(amount)?;
                if !(0..=3).contains(&k) {
                    return Err(ArgError::Form(op.into()));
                }
                (Some((Reg::A64(index_reg(second, op)?), 1u8 << k)), 0)
            }
            _ => return Err(ArgError::Form(op.into())),
        };
        Ok(ArgLoc::Mem { base, index, disp })
    }

    /// Index registers are x registers (extended w forms such as `sxtw` are rejected by
    /// the caller's shift parsing); sp cannot index.
    fn index_reg(s: &str, op: &str) -> Result<u8, ArgError> {
        match address_reg(s, op)? {
            31 => Err(ArgError::Form(format!("sp as an index register in {op}"))),
            n => Ok(n),
        }
    }
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
