//! Which functions become sites (never `__restore_rt`, never split-off `.cold`/`.warm`
//! parts).

use crate::error::{Error, Result};
use crate::input::{Function, Input};

/// Functions that must never be patched: the unwinder recognises the signal-return
/// trampoline by its exact bytes.
const NEVER: &[&str] = &["__restore_rt"];

/// A symbol naming a split-off part of a function rather than a function.
pub fn is_fragment(name: &str) -> bool {
    name.contains(".cold") || name.contains(".warm")
}

/// The selected functions with the name to report (the alias that matched).
pub fn select<'i>(input: &'i Input, globs: &[String]) -> Result<Vec<(&'i Function, String)>> {
    if input.functions.is_empty() {
        return Err(Error::NoSymbols(input.name.clone()));
    }
    let patterns = globs
        .iter()
        .map(|g| glob::Pattern::new(g).map_err(|e| Error::BadGlob(g.clone(), e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for f in &input.functions {
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
            f.names
                .iter()
                .find(|n| patterns.iter().any(|p| p.matches(n)))
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
