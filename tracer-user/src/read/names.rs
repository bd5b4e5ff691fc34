//! Names of a trace's sites (binary, symbol, kind, source frames), from its binary
//! sections, and the load biases that turn run-time code addresses back into frames.

use std::{
    cell::RefCell,
    collections::{HashMap, HashSet},
    path::PathBuf,
    rc::Rc,
};

use tracer_common::{
    FLAG_MEM_PAIR, FLAG_RING, FLAG_UPROBE, Record,
    meta::{SiteKind, TimeMode},
};

use crate::{
    debuginfo::DebugSource,
    probes::{self, CallProbe},
    read::symbols::{Frame, Symbolizer, demangle},
    tracefile::BinaryInfo,
};

/// One site of a binary: its raw symbol, the readable (demangled) name, kind, address.
pub(crate) struct SiteName {
    pub(super) raw: String,
    pub(super) name: String,
    pub(super) kind: SiteKind,
    pub(super) vaddr: u64,
    /// Its function has exit sites (entry records can be paired).
    pub(super) paired: bool,
    /// A USDT probe that opens or closes a call of an interpreted program.
    pub(super) call: Option<CallProbe>,
}

/// Names for the (binary_id, site id) pairs of a trace, from its binary sections, and
/// source locations of code addresses (DWARF, see [`crate::read::symbols`]).
pub(crate) struct Names {
    /// Per binary: its name and its sites, indexed by site id.
    pub(super) binaries: HashMap<u64, (String, Vec<Option<SiteName>>)>,
    /// (binary name, time mode) per binary.
    pub(super) time_modes: Vec<(String, TimeMode)>,
    /// Binaries with circular buffers: their never-written records are skipped.
    pub(super) rings: Vec<u64>,
    /// Build-id per binary, in hex.
    build_ids: HashMap<u64, String>,
    pub(super) symbols: RefCell<Symbolizer>,
    /// Load bias of a binary in a process, learned from records holding both a site's
    /// run-time address and its site (blocks, memory accesses).
    pub(super) biases: RefCell<HashMap<(u32, u64), u64>>,
}

impl Names {
    pub(crate) fn new(debug_dirs: &[PathBuf]) -> Names {
        Names {
            binaries: HashMap::new(),
            time_modes: Vec::new(),
            rings: Vec::new(),
            build_ids: HashMap::new(),
            symbols: RefCell::new(Symbolizer::new(debug_dirs)),
            biases: RefCell::new(HashMap::new()),
        }
    }

    pub(crate) fn add(&mut self, b: &BinaryInfo) {
        if self.binaries.contains_key(&b.binary_id) {
            return;
        }
        let sites = match b.metadata() {
            Ok(m) => {
                self.time_modes.push((b.name().to_string(), m.time_mode));
                if m.buf_kind() != tracer_common::BUF_TRACE {
                    self.rings.push(b.binary_id);
                }
                self.symbols
                    .borrow_mut()
                    .add_binary(b.binary_id, &b.path, &m.build_id);
                let hex = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
                self.build_ids.insert(b.binary_id, hex);
                // Site ids are indices into the site table (a bad one is not a site).
                let mut table: Vec<Option<SiteName>> = Vec::new();
                table.resize_with(m.sites.len(), || None);
                let with_exits: HashSet<&str> = m
                    .sites
                    .iter()
                    .filter(|s| s.kind == SiteKind::FunctionExit)
                    .map(|s| s.name.as_str())
                    .collect();
                let paired: Vec<bool> = m
                    .sites
                    .iter()
                    .map(|s| with_exits.contains(s.name.as_str()))
                    .collect();
                for (s, paired) in m.sites.into_iter().zip(paired) {
                    let Some(slot) = table.get_mut(s.id as usize) else {
                        log::warn!("{}: site id {} out of range", b.path, s.id);
                        continue;
                    };
                    let call = (s.kind == SiteKind::Usdt)
                        .then(|| probes::known(&s.name).and_then(|p| p.call))
                        .flatten();
                    *slot = Some(SiteName {
                        call,
                        name: demangle(&s.name).into_owned(),
                        raw: s.name,
                        kind: s.kind,
                        vaddr: s.vaddr,
                        paired,
                    });
                }
                table
            }
            Err(e) => {
                log::warn!("{}: cannot parse its metadata: {e}", b.path);
                Vec::new()
            }
        };
        self.binaries
            .insert(b.binary_id, (b.name().to_string(), sites));
    }

    /// Whether a record is real: circular buffers are delivered whole, and the records
    /// never written there have flags 0 (a written one has `FLAG_RING`).
    pub(crate) fn is_record(&self, binary_id: u64, rec: &Record) -> bool {
        rec.flags & FLAG_RING != 0 || !self.rings.contains(&binary_id)
    }

    pub(crate) fn binary(&self, id: u64) -> &str {
        self.binaries.get(&id).map_or("?", |(n, _)| n)
    }

    /// The binary's build-id in hex ("" when unknown).
    pub(crate) fn build_id(&self, id: u64) -> &str {
        self.build_ids.get(&id).map_or("", String::as_str)
    }

    pub(crate) fn site(&self, id: u64, site: u32) -> Option<&SiteName> {
        self.binaries
            .get(&id)
            .and_then(|(_, s)| s.get(site as usize))
            .and_then(Option::as_ref)
    }

    /// Whether a site is a memory access.
    pub(crate) fn is_memory(&self, id: u64, site: u32) -> bool {
        self.site(id, site)
            .is_some_and(|s| s.kind == SiteKind::Memory)
    }

    /// The site's symbol as the binary spells it (mangled).
    pub(crate) fn raw_symbol(&self, id: u64, site: u32) -> &str {
        self.site(id, site).map_or("?", |s| s.raw.as_str())
    }

    /// The site's function, demangled.
    pub(crate) fn symbol(&self, id: u64, site: u32) -> &str {
        self.site(id, site).map_or("?", |s| s.name.as_str())
    }

    pub(crate) fn kind(&self, id: u64, site: u32) -> &'static str {
        self.site(id, site).map_or("?", |s| s.kind.name())
    }

    /// Source frames of a site, innermost first (empty: no debug information).
    pub(crate) fn site_frames(&self, id: u64, site: u32) -> Rc<[Frame]> {
        match self.site(id, site) {
            Some(s) => self.symbols.borrow_mut().frames(id, s.vaddr),
            None => Rc::from([]),
        }
    }

    /// Binary `id` is at `bias` in process `pid` (a load section).
    pub(crate) fn loaded_at(&self, pid: u32, id: u64, bias: u64) {
        self.biases.borrow_mut().insert((pid, id), bias);
    }

    /// The load bias of binary `id` in process `pid`, if known.
    pub(crate) fn bias(&self, pid: u32, id: u64) -> Option<u64> {
        self.biases.borrow().get(&(pid, id)).copied()
    }

    /// Run-time address of a site's instruction: its file address plus `bias`; 0 when
    /// either is unknown.
    pub(crate) fn run_time_address(&self, id: u64, site: u32, bias: Option<u64>) -> u64 {
        match (self.site(id, site), bias) {
            (Some(s), Some(b)) => s.vaddr.wrapping_add(b),
            _ => 0,
        }
    }

    /// Learn the load bias of binary `id` in process `pid` from the first of `records`
    /// (one chunk, before its pairs are expanded) that holds its own site's run-time
    /// address, unless it is known already.
    pub(crate) fn learn_from(&self, pid: u32, id: u64, records: &[Record]) {
        if self.biases.borrow().contains_key(&(pid, id)) {
            return;
        }
        let Some((_, sites)) = self.binaries.get(&id) else {
            return;
        };
        for rec in records.iter().filter(|r| self.is_record(id, r)) {
            if let Some(s) = sites.get(rec.site as usize).and_then(Option::as_ref)
                && self.learn_at(pid, id, s, rec)
            {
                return;
            }
        }
    }

    /// Learn a load bias from a record that holds its own site's run-time address
    /// (a block, a lone inline memory access; never a memory pair, whose `aux` is a
    /// data address). Whether it did.
    fn learn_at(&self, pid: u32, id: u64, s: &SiteName, rec: &Record) -> bool {
        let at = match s.kind {
            SiteKind::Memory if rec.flags & (FLAG_UPROBE | FLAG_MEM_PAIR) == 0 => rec.aux,
            SiteKind::Block => rec.value,
            _ => return false,
        };
        // A bias is a whole number of pages (modulo 2^64: a library may load below its
        // link address); anything else is not an address (a damaged record, or a block
        // record carrying a chosen value).
        let bias = at.wrapping_sub(s.vaddr);
        if bias & 0xfff != 0 {
            return false;
        }
        self.biases.borrow_mut().entry((pid, id)).or_insert(bias);
        true
    }

    /// Frames of a run-time code address of process `pid` (e.g. a return address), in
    /// binary `id` or another traced binary of that process whose load bias is known;
    /// empty when none has code there. `call_return`: the address follows a call (its
    /// line is the call's).
    pub(crate) fn code_frames(
        &self,
        pid: u32,
        id: u64,
        addr: u64,
        call_return: bool,
    ) -> Rc<[Frame]> {
        let mut candidates: Vec<(u64, u64)> = Vec::new();
        {
            let biases = self.biases.borrow();
            candidates.extend(biases.get(&(pid, id)).map(|&b| (id, b)));
            let mut others: Vec<(u64, u64)> = biases
                .iter()
                .filter(|&(&(p, other), _)| p == pid && other != id)
                .map(|(&(_, other), &b)| (other, b))
                .collect();
            others.sort_unstable();
            candidates.extend(others);
        }
        let mut sym = self.symbols.borrow_mut();
        let mut fixed: Vec<u64> = self.binaries.keys().copied().collect();
        fixed.sort_unstable_by_key(|&b| (b != id, b));
        for b in fixed {
            if !candidates.iter().any(|&(c, _)| c == b) && sym.fixed_address(b) {
                candidates.push((b, 0));
            }
        }
        for (b, bias) in candidates {
            let at = addr.wrapping_sub(bias);
            if sym.is_code(b, at) {
                return sym.frames(b, at.saturating_sub(u64::from(call_return)));
            }
        }
        Rc::from([])
    }

    /// (binary name, time mode) of each binary, in file order.
    pub(crate) fn time_modes(&self) -> &[(String, TimeMode)] {
        &self.time_modes
    }

    /// Where the debug information of each binary came from.
    pub(crate) fn debug_source(&self, id: u64) -> Option<DebugSource> {
        self.symbols.borrow_mut().source(id)
    }
}

/// Entry and exit sites stand for their function.
pub(crate) fn kind_is_call_edge(kind: &str) -> bool {
    matches!(kind, "entry" | "exit")
}
