//! x86-64 (AT&T) `<sys/sdt.h>` operand syntax: registers, immediates, memory.

use crate::isa::arg::{ArgError, ArgLoc, Reg, expression, number};
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

pub(crate) fn operand(
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
    registers(op, &parts, disp)
}

/// `base`, `base, index[, scale]` or `, index[, scale]` between the parentheses of a
/// memory operand.
fn registers(op: &str, parts: &[&str], disp: i64) -> Result<ArgLoc, ArgError> {
    let (base, index) = match *parts {
        [b] => (Some(b), None),
        [b, i] => (Some(b).filter(|b| !b.is_empty()), Some((i, "1"))),
        [b, i, s] => (Some(b).filter(|b| !b.is_empty()), Some((i, s))),
        _ => return Err(ArgError::Form(op.into())),
    };
    let base = base.map(address_reg).transpose()?;
    let index = index.map(|(i, s)| index_reg(op, i, s)).transpose()?;
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

/// An index register and its scale.
fn index_reg(op: &str, i: &str, s: &str) -> Result<(R, u8), ArgError> {
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
    Ok((r, scale))
}
