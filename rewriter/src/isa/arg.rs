//! USDT argument values: the ISA-neutral form of a `<sys/sdt.h>` argument (size, sign,
//! location) and the parts of its syntax every ISA shares (size prefix, numbers,
//! address expressions); each ISA's operand grammar is in its `usdt.rs`.

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
    let isa = super::of(machine).ok_or_else(|| ArgError::Form(text.into()))?;
    let loc = isa.usdt_operand(operand, pc, resolve)?;
    Ok(Arg {
        size,
        signed,
        float,
        loc,
    })
}

/// `Some((size, signed, float, operand))` when `text` has a `[-]N[f]@` prefix.
pub(crate) fn split_size(text: &str) -> Result<Option<(u8, bool, bool, &str)>, ArgError> {
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
pub(crate) fn number(s: &str) -> Result<i64, ArgError> {
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

pub(crate) fn is_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '.')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$')
}

/// An address expression: terms joined by `+`/`-`, at most one a symbol (added).
/// Returns the numeric sum and the symbol, if any.
pub(crate) fn expression(s: &str) -> Result<(i64, Option<&str>), ArgError> {
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
