//! Which functions and sites are instrumented: the symbol and FDE function list and the
//! `--functions` globs ([`functions`]), the TOML spec ([`spec`]), USDT probe notes
//! ([`usdt`]); globs also match demangled names (`present::demangle`).

pub(crate) mod functions;
pub(crate) mod parts;
pub mod spec;
pub mod usdt;

use std::collections::HashSet;

use crate::Options;
use crate::elf::read::{Function, Input};
use crate::error::{Error, Result};
use crate::flow::Flow;
use crate::isa::{Isa, Targets};
use tracer_common::meta::SiteKind;

/// A function to plan, with the name its sites report.
pub(crate) struct Chosen {
    pub f: Function,
    pub name: String,
    /// Matched by the globs (else: planned only for its USDT probes).
    pub selected: bool,
    /// May get entry and exit sites: a symbol's function, or an FDE range that a
    /// direct call reaches (an unnamed FDE range may be a split-off part of a function,
    /// entered by a jump with live registers).
    pub callable: bool,
    /// A split-off part of the function starting here ([`parts`]): no entry, its
    /// exits are that function's (if `callable`, the function's), and its sites
    /// report that function's name.
    pub part_of: Option<u64>,
}

/// What the selection stage found.
pub(crate) struct Selection {
    /// Every function of the binary (symbols and unnamed FDE ranges), sorted.
    pub functions: Vec<Function>,
    /// The functions to plan, sorted by address.
    pub chosen: Vec<Chosen>,
    /// The binary's USDT probes, when USDT sites were asked for.
    pub probes: Vec<usdt::Probe>,
    /// Which regions of `functions` are split-off parts of which.
    pub parts: parts::Parts,
}

impl Selection {
    /// Every range of the function starting at `entry`: its own, then its parts'.
    pub(crate) fn whole(&self, entry: u64) -> Vec<std::ops::Range<u64>> {
        std::iter::once(entry)
            .chain(self.parts.parts_of(entry))
            .filter_map(|a| function_at(&self.functions, a).filter(|f| f.addr == a))
            .map(|f| f.addr..f.addr.saturating_add(f.size))
            .collect()
    }
}

/// Choose the functions to plan: the globs' matches with their split-off parts, and
/// those holding a USDT probe.
pub(crate) fn select(
    input: &Input,
    isa: &dyn Isa,
    flow: &Flow,
    targets: &Targets,
    opts: &Options,
) -> Result<Selection> {
    let all = functions::functions(input, &flow.fde_functions);
    let named: HashSet<u64> = input.functions.iter().map(|f| f.addr).collect();
    let call_targets = isa.call_targets(input);
    let parts = parts::Parts::find(input, isa, &all, flow, targets, &named, &call_targets);
    let callable =
        |f: &Function| named.contains(&f.addr) || call_targets.binary_search(&f.addr).is_ok();
    let mut chosen: Vec<Chosen> = functions::select(input, &all, &opts.functions)?
        .into_iter()
        .filter(|(f, _)| parts.parent_of(f.addr).is_none())
        .map(|(f, name)| Chosen {
            callable: callable(f),
            f: f.clone(),
            name,
            selected: true,
            part_of: None,
        })
        .collect();
    // A part is planned with its function: exits only if the function may have them
    // (`callable`), its other sites always.
    let mut split = Vec::new();
    for c in &chosen {
        for part in parts.parts_of(c.f.addr) {
            if let Some(f) = function_at(&all, part).filter(|f| f.addr == part) {
                split.push(Chosen {
                    f: f.clone(),
                    name: c.name.clone(),
                    selected: true,
                    callable: c.callable,
                    part_of: Some(c.f.addr),
                });
            }
        }
    }
    chosen.extend(split);
    let probes = probes(input, opts)?;
    for p in &probes {
        let f = function_at(&all, p.pc).ok_or_else(|| unplaced(input, p))?;
        if !chosen.iter().any(|c| c.f.addr == f.addr) {
            chosen.push(Chosen {
                callable: callable(f),
                f: f.clone(),
                name: f.names[0].clone(),
                selected: false,
                part_of: None,
            });
        }
    }
    chosen.sort_by_key(|c| c.f.addr);
    Ok(Selection {
        functions: all,
        chosen,
        probes,
        parts,
    })
}

/// Every USDT probe of the binary when USDT sites are asked for (none otherwise).
fn probes(input: &Input, opts: &Options) -> Result<Vec<usdt::Probe>> {
    if !opts.kinds.contains(&SiteKind::Usdt) {
        return Ok(Vec::new());
    }
    // A probe of more than 2 arguments reserves several records at once; in a fast
    // ring the stub keeps them from crossing the ring's end (`isa/*/stub.rs`).
    usdt::probes(input.data, input.machine)
        .map_err(|e| Error::Layout(input.name.clone(), format!("USDT probes: {e}")))
}

fn unplaced(input: &Input, p: &usdt::Probe) -> Error {
    Error::Layout(
        input.name.clone(),
        format!(
            "USDT probe {}:{} at {:#x} is not inside a function symbol",
            p.provider, p.name, p.pc
        ),
    )
}

/// The function of `functions` (sorted) containing `pc`.
pub(crate) fn function_at(functions: &[Function], pc: u64) -> Option<&Function> {
    let i = functions.partition_point(|f| f.addr <= pc);
    i.checked_sub(1)
        .map(|i| &functions[i])
        .filter(|f| pc < f.addr + f.size)
}
