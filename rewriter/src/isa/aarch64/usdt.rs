//! AArch64 `<sys/sdt.h>` operand syntax: registers, immediates, memory.

use crate::isa::arg::{ArgError, ArgLoc, Reg, expression, number};

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

pub(crate) fn operand(
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
