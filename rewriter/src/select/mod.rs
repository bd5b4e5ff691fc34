//! Which functions and sites are instrumented: the symbol and FDE function list and the
//! `--functions` globs ([`functions`]), the TOML spec ([`spec`]), USDT probe notes
//! ([`usdt`]) and symbol demangling ([`demangle`]).

pub mod demangle;
pub mod functions;
pub mod spec;
pub mod usdt;

use std::collections::HashSet;

use crate::Options;
use crate::elf::read::{Function, Input};
use crate::error::{Error, Result};
use crate::flow::Flow;
use crate::isa::Isa;
use tracer_common::BUF_FAST_CIRCULAR;
use tracer_common::meta::SiteKind;

/// A function to plan, with the name its sites report.
pub struct Chosen {
    pub f: Function,
    pub name: String,
    /// Matched by the globs (else: planned only for its USDT probes).
    pub selected: bool,
    /// May get entry and exit sites: a symbol's function, or an FDE range that a
    /// direct call reaches (an unnamed FDE range may be a split-off part of a function,
    /// entered by a jump with live registers).
    pub callable: bool,
}

/// What the selection stage found.
pub struct Selection {
    /// Every function of the binary (symbols and unnamed FDE ranges), sorted.
    pub functions: Vec<Function>,
    /// The functions to plan, sorted by address.
    pub chosen: Vec<Chosen>,
    /// The binary's USDT probes, when USDT sites were asked for.
    pub probes: Vec<usdt::Probe>,
}

/// Choose the functions to plan: the globs' matches, and those holding a USDT probe.
pub fn select(input: &Input, isa: &dyn Isa, flow: &Flow, opts: &Options) -> Result<Selection> {
    let all = functions::functions(input, &flow.fde_functions);
    let named: HashSet<u64> = input.functions.iter().map(|f| f.addr).collect();
    let call_targets = isa.call_targets(input);
    let callable =
        |f: &Function| named.contains(&f.addr) || call_targets.binary_search(&f.addr).is_ok();
    let mut chosen: Vec<Chosen> = functions::select(input, &all, &opts.functions)?
        .into_iter()
        .map(|(f, name)| Chosen {
            callable: callable(f),
            f: f.clone(),
            name,
            selected: true,
        })
        .collect();
    let probes = probes(input, opts)?;
    for p in &probes {
        let f = function_at(&all, p.pc).ok_or_else(|| unplaced(input, p))?;
        if !chosen.iter().any(|c| c.f.addr == f.addr) {
            chosen.push(Chosen {
                callable: callable(f),
                f: f.clone(),
                name: f.names[0].clone(),
                selected: false,
            });
        }
    }
    chosen.sort_by_key(|c| c.f.addr);
    Ok(Selection {
        functions: all,
        chosen,
        probes,
    })
}

/// Every USDT probe of the binary when USDT sites are asked for (none otherwise).
fn probes(input: &Input, opts: &Options) -> Result<Vec<usdt::Probe>> {
    if !opts.kinds.contains(&SiteKind::Usdt) {
        return Ok(Vec::new());
    }
    let probes = usdt::probes(input.data, input.machine)
        .map_err(|e| Error::Layout(input.name.clone(), format!("USDT probes: {e}")))?;
    if opts.buf_kind == BUF_FAST_CIRCULAR
        && let Some(p) = probes.iter().find(|p| p.args.len() > 2)
    {
        // Its records would be reserved together and could run past the ring's end.
        return Err(Error::Layout(
            input.name.clone(),
            format!(
                "USDT probe {}:{} has {} arguments: fast circular buffers take probes of at most 2",
                p.provider,
                p.name,
                p.args.len()
            ),
        ));
    }
    Ok(probes)
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
pub fn function_at(functions: &[Function], pc: u64) -> Option<&Function> {
    let i = functions.partition_point(|f| f.addr <= pc);
    i.checked_sub(1)
        .map(|i| &functions[i])
        .filter(|f| pc < f.addr + f.size)
}
