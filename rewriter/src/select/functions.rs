//! Which functions become sites (never `__restore_rt`, never split-off `.cold`/`.warm`
//! parts).
//!
//! Functions are the symbols' ranges and the `.eh_frame` FDEs' (stripped binaries name most
//! functions only there: an FDE range with no symbol becomes `sub_<addr>`); `--functions`
//! globs match their demangled names.

use crate::elf::read::{Function, Input};
use crate::error::{Error, Result};
use present::demangle;

/// Functions that must never be patched: the unwinder recognises the signal-return
/// trampoline by its exact bytes.
const NEVER: &[&str] = &["__restore_rt"];

/// A symbol naming a split-off part of a function rather than a function.
pub(crate) fn is_fragment(name: &str) -> bool {
    name.contains(".cold") || name.contains(".warm")
}

/// Every function of the binary: its symbols, plus the `.eh_frame` FDE ranges no
/// symbol covers (a stripped binary's functions) and that start in code, named
/// `sub_<address>`. PLT sections (FDEs for the whole PLT) are not functions. Sorted
/// by address.
pub(crate) fn functions(input: &Input, fdes: &[(u64, u64)]) -> Vec<Function> {
    let mut all = input.functions.clone();
    let plt: Vec<(u64, u64)> = input
        .sections
        .iter()
        .filter(|s| s.name.starts_with(".plt"))
        .map(|s| (s.addr, s.addr + s.size))
        .collect();
    for &(start, size) in fdes {
        let covered = {
            let i = input.functions.partition_point(|f| f.addr <= start);
            i.checked_sub(1)
                .is_some_and(|i| start < input.functions[i].addr + input.functions[i].size.max(1))
        };
        // Only code: an FDE elsewhere (a corrupt one) names no function.
        let in_code = input
            .code_section_headers()
            .any(|s| start >= s.addr && start - s.addr < s.size);
        if size == 0 || covered || !in_code || plt.iter().any(|&(a, b)| (a..b).contains(&start)) {
            continue;
        }
        all.push(Function {
            addr: start,
            size,
            names: vec![format!("sub_{start:x}")],
        });
    }
    all.sort_by_key(|f| f.addr);
    all.dedup_by_key(|f| f.addr);
    all
}

/// The selected functions of `functions` with the name to report (the alias that
/// matched).
pub(crate) fn select<'i>(
    input: &Input,
    functions: &'i [Function],
    globs: &[String],
) -> Result<Vec<(&'i Function, String)>> {
    if functions.is_empty() {
        return Err(Error::NoSymbols(input.name.clone()));
    }
    let patterns = globs
        .iter()
        .map(|g| glob::Pattern::new(g).map_err(|e| Error::BadGlob(g.clone(), e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for f in functions {
        // Split-off parts of a function (gcc `.cold`, LLVM/BOLT `.warm`) are entered by
        // jumps with live registers and flags, not by calls: never function entries
        // (the entry stub relies on the psABI making both dead there).
        if f.names
            .iter()
            .any(|n| NEVER.contains(&n.as_str()) || is_fragment(n))
        {
            continue;
        }
        let name = if patterns.is_empty() {
            Some(f.names[0].clone())
        } else {
            // A glob matches the symbol or its demangled name (`shapes::*`).
            f.names
                .iter()
                .find(|n| {
                    let readable = demangle(n);
                    patterns
                        .iter()
                        .any(|p| p.matches(n) || readable.as_deref().is_some_and(|d| p.matches(d)))
                })
                .cloned()
        };
        if let Some(name) = name {
            out.push((f, name));
        }
    }
    if out.is_empty() {
        return Err(Error::NoMatch {
            path: input.name.clone(),
            globs: globs.join(" "),
        });
    }
    Ok(out)
}
