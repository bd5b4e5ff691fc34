//! Split-off parts of functions. gcc moves unlikely code (exception landing pads,
//! paths to `noreturn` calls, `__builtin_expect`) into `FUNC.cold`, which FUNC reaches
//! by a jump with its frame live and which often jumps back. A part and its parent are
//! one function: jumps between them are neither exits nor entries, and the part's
//! returns and tail calls are the parent's exits.
//!
//! A part is a function region (a symbol or an FDE range) that no direct call reaches
//! and that is either named as one (`.cold`, `.warm`) or, in a stripped binary, has
//! one function alone as the one it is jumped to from or jumps back into, and either
//! its CFI starts mid-frame (a function starts with the stack at its entry height) or
//! it is both jumped to from and jumps back into that function's interior (a function
//! entered by tail calls never jumps into the middle of its caller). A region only
//! jumping into another function, or only jumped to, at entry height, stays a
//! function of its own: it may be called through a pointer.
//!
//! The part's returns and tail calls are its function's exits only when the function has
//! exits, and are recorded under its name; its other sites are planned with the function's.
//! A part that cannot be told from a function (stripped, frameless, never jumping back)
//! stays a region of its own: its function then misses exits, never gets extra ones. Test
//! `tests/tests/cold_parts.rs`: exact entries against kernel uprobes and exact exits on g++
//! -O2 builds, with symbols and stripped, x86-64 and AArch64; Debian's python3.11 and
//! libstdc++ never exit more than they enter.

use std::collections::HashSet;
use std::ops::Range;

use super::functions::is_fragment;
use crate::elf::read::{Function, Input};
use crate::flow::Flow;
use crate::isa::{Branch, Isa, Targets};

/// Which regions are parts of which functions.
#[derive(Debug, Default)]
pub(crate) struct Parts {
    /// `(part start, parent start)`, sorted by part start.
    of: Vec<(u64, u64)>,
    /// The same as `(parent start, part start)`, sorted by parent: a function's parts
    /// in one search (every function asks, several times).
    by_parent: Vec<(u64, u64)>,
}

impl Parts {
    /// The parts of `all` (every function region, sorted). `named`: starts of the
    /// symbols' functions; `calls`: every direct call's target, sorted.
    pub(crate) fn find(
        input: &Input,
        isa: &dyn Isa,
        all: &[Function],
        flow: &Flow,
        targets: &Targets,
        named: &HashSet<u64>,
        calls: &[u64],
    ) -> Parts {
        let mut of: Vec<(u64, u64)> = all
            .iter()
            .filter(|r| calls.binary_search(&r.addr).is_err())
            .filter_map(|r| {
                let fragment = r.names.iter().any(|n| is_fragment(n));
                if !fragment && named.contains(&r.addr) {
                    return None;
                }
                let mid_frame = flow.mid_frame.binary_search(&r.addr).is_ok();
                parent(input, isa, all, targets, r, fragment, mid_frame).map(|p| (r.addr, p))
            })
            .collect();
        of.sort_unstable();
        // A part of a part (`f.cold.1` jumping into `f.cold`) belongs to the root.
        let direct = of.clone();
        for (_, p) in &mut of {
            for _ in 0..8 {
                match lookup(&direct, *p) {
                    Some(up) => *p = up,
                    None => break,
                }
            }
        }
        // Parts of each other, with no root: none of them is believed.
        of.retain(|&(part, parent)| part != parent && lookup(&direct, parent).is_none());
        let mut by_parent: Vec<(u64, u64)> = of.iter().map(|&(part, p)| (p, part)).collect();
        by_parent.sort_unstable();
        Parts { of, by_parent }
    }

    /// The function `start` is a part of, if it is one.
    pub(crate) fn parent_of(&self, start: u64) -> Option<u64> {
        lookup(&self.of, start)
    }

    /// The starts of `parent`'s parts.
    pub(crate) fn parts_of(&self, parent: u64) -> impl Iterator<Item = u64> + '_ {
        let lo = self.by_parent.partition_point(|e| e.0 < parent);
        self.by_parent[lo..]
            .iter()
            .take_while(move |e| e.0 == parent)
            .map(|&(_, part)| part)
    }
}

fn lookup(of: &[(u64, u64)], start: u64) -> Option<u64> {
    of.binary_search_by_key(&start, |e| e.0)
        .ok()
        .map(|i| of[i].1)
}

/// The function region `r` is a part of. `fragment`: named as a part; `mid_frame`:
/// its CFI starts mid-frame.
fn parent(
    input: &Input,
    isa: &dyn Isa,
    all: &[Function],
    targets: &Targets,
    r: &Function,
    fragment: bool,
    mid_frame: bool,
) -> Option<u64> {
    let inside = r.addr..r.addr.saturating_add(r.size);
    let outside = |a: u64| !inside.contains(&a);
    // Functions jumping to its start, and functions whose interior it jumps into.
    let into: Vec<u64> = targets
        .jumps_to(r.addr)
        .filter(|&from| outside(from))
        .filter_map(|from| super::function_at(all, from).map(|f| f.addr))
        .collect();
    let back: Vec<u64> = jumps_out(input, isa, &inside)
        .filter_map(|to| super::function_at(all, to).filter(|f| f.addr != to))
        .map(|f| f.addr)
        .collect();
    let mut candidates: Vec<u64> = into.iter().chain(&back).copied().collect();
    candidates.sort_unstable();
    candidates.dedup();
    if fragment {
        let base = r.names.iter().find_map(|n| base_name(n))?;
        let named_base = |a: &u64| {
            super::function_at(all, *a).is_some_and(|f| f.names.iter().any(|n| n == base))
        };
        return match candidates.iter().filter(|a| named_base(a)).count() {
            1 => candidates.into_iter().find(named_base),
            0 if candidates.len() == 1 => candidates.pop(),
            // Reached only by the unwinder (a landing pad that ends in
            // `_Unwind_Resume`): the one function of that name.
            0 if candidates.is_empty() => unique_named(all, base),
            _ => None,
        };
    }
    let linked = !into.is_empty() && !back.is_empty();
    let evidence = linked || (mid_frame && (!into.is_empty() || !back.is_empty()));
    (evidence && candidates.len() == 1).then(|| candidates[0])
}

/// The targets of `range`'s direct jumps (not calls) that leave it.
fn jumps_out(input: &Input, isa: &dyn Isa, range: &Range<u64>) -> impl Iterator<Item = u64> {
    let mut branches: Vec<Branch> = Vec::new();
    let len = (range.end - range.start) as usize;
    if let Some(bytes) = input.bytes_at(range.start).and_then(|b| b.get(..len)) {
        isa.direct_branches(range.start, bytes, &mut branches);
    }
    let range = range.clone();
    branches
        .into_iter()
        .filter(move |b| !b.call && !range.contains(&b.to))
        .map(|b| b.to)
}

/// `f` of `f.cold`, `f.cold.1`, `f.part.0.cold` (`f.part.0`), `f.warm`.
fn base_name(name: &str) -> Option<&str> {
    [".cold", ".warm"]
        .iter()
        .filter_map(|s| name.find(s))
        .min()
        .map(|i| &name[..i])
        .filter(|b| !b.is_empty())
}

/// The start of the one function of `all` named `name`.
fn unique_named(all: &[Function], name: &str) -> Option<u64> {
    let mut it = all
        .iter()
        .filter(|f| f.names.iter().any(|n| n == name))
        .map(|f| f.addr);
    let first = it.next()?;
    it.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names() {
        assert_eq!(base_name("f.cold"), Some("f"));
        assert_eq!(base_name("f.cold.1"), Some("f"));
        assert_eq!(base_name("_ZN1a1bEv.cold"), Some("_ZN1a1bEv"));
        assert_eq!(base_name("f.part.0.cold"), Some("f.part.0"));
        assert_eq!(base_name("f.warm"), Some("f"));
        assert_eq!(base_name(".cold"), None);
        assert_eq!(base_name("f"), None);
    }
}
