//! Which functions become sites.

use crate::error::{Error, Result};
use crate::input::{Function, Input};

/// Functions that must never be patched: the unwinder recognises the signal-return
/// trampoline by its exact bytes.
const NEVER: &[&str] = &["__restore_rt"];

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
        if f.names.iter().any(|n| NEVER.contains(&n.as_str())) {
            continue;
        }
        let name = if patterns.is_empty() {
            // Split-off cold blocks are entered by jumps, not calls: not function entries.
            Some(f.names[0].clone()).filter(|n| !n.contains(".cold"))
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
