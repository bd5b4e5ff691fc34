//! The new code and the metadata: run-time routines, USDT semaphore anchors, one
//! trampoline per window (or uprobe sites when its branch cannot reach), the site table
//! and operands of the `.note.utrace` metadata, the RwHeader page, and the [`Report`].

use crate::Options;
use crate::elf::read::{Function, Input, Kind};
use crate::error::{Error, Result};
use crate::isa::{FunctionPlan, Isa, Runtime, SiteReq, SlotLookup};
use crate::layout::{RW_FILESZ, Segments};
use crate::plan::Sites;
use crate::select::Selection;
use tracer_common::meta::{self, FallbackReason, Metadata, Site, SiteKind, SiteMode, SiteReason};
use tracer_common::*;

/// What the rewrite did, for the user.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub kind: &'static str,
    pub sites: usize,
    pub inline: usize,
    pub uprobe: usize,
    /// Sites neither patched nor probed (a stub or trap there would break the program).
    pub untraced: usize,
    /// (site, reason) for every uprobe site.
    pub uprobe_reasons: Vec<(String, FallbackReason)>,
    /// (site, reason) for every untraced site.
    pub untraced_reasons: Vec<(String, FallbackReason)>,
    /// (inline, uprobe, untraced) per site kind.
    pub per_kind: std::collections::BTreeMap<SiteKind, (usize, usize, usize)>,
    pub input_size: u64,
    pub output_size: u64,
    /// How the stubs find their thread's slot.
    pub slot_lookup: SlotLookup,
    /// Split-off parts (`.cold`) planned as their functions' (their exits are): the
    /// part's address and its function's name.
    pub parts: Vec<(u64, String)>,
    /// Memory sites recorded together (access runs) and why runs ended.
    pub runs: crate::RunStats,
}

/// The emitted RX segment contents and what goes into the metadata.
pub(crate) struct Emitted {
    /// The code after the program header table (at `Segments::code_at`).
    pub code: Vec<u8>,
    pub rt: Runtime,
    /// (site address, bytes written over the original code).
    pub patches: Vec<(u64, Vec<u8>)>,
    pub semaphores: Vec<meta::Semaphore>,
    /// Every site's mode and probe address, by id.
    modes: Vec<Option<(SiteMode, u64)>>,
    /// Where the eBPF `site` program finds what a uprobe memory or USDT site records.
    operands: Vec<meta::SiteOperands>,
    /// Why each uprobe site is one, for the metadata.
    pub reasons: Vec<SiteReason>,
    pub report: Report,
}

/// The patches that re-point the jumps into window `w` (entered only by them) at its
/// trampoline at `to`; none if one of them lies in bytes a window overwrites.
fn repoint(
    isa: &dyn Isa,
    w: &crate::isa::Window,
    to: u64,
    taken: &[(u64, u64)],
) -> std::result::Result<Vec<(u64, Vec<u8>)>, String> {
    w.entered_by
        .iter()
        .map(|e| {
            let end = e.at + u64::from(e.len);
            let i = taken.partition_point(|t| t.1 <= e.at);
            if taken.get(i).is_some_and(|t| t.0 < end) {
                return Err(format!(
                    "the jump at {:#x} into it is moved by a window",
                    e.at
                ));
            }
            isa.repoint(e, to)
        })
        .collect()
}

/// Emit the run-time code, the anchors and every function's trampolines.
pub(crate) fn code(
    input: &Input,
    isa: &dyn Isa,
    seg: &Segments,
    sel: &Selection,
    sites: &Sites,
    plans: Vec<FunctionPlan>,
    opts: &Options,
) -> Result<Emitted> {
    let (code, rt) = isa
        .emit_runtime(&seg.layout, seg.code_at, input.entry)
        .map_err(|m| Error::Encode(input.name.clone(), m))?;
    let mut out = Emitted {
        code,
        rt,
        patches: Vec::new(),
        semaphores: Vec::new(),
        modes: vec![None; sites.info.len()],
        operands: Vec::new(),
        reasons: Vec::new(),
        report: Report {
            kind: input.kind.name(),
            sites: sites.info.len(),
            input_size: input.data.len() as u64,
            slot_lookup: seg.layout.slot_lookup,
            parts: sel
                .chosen
                .iter()
                .filter(|c| c.part_of.is_some())
                .map(|c| (c.f.addr, c.name.clone()))
                .collect(),
            ..Default::default()
        },
    };
    out.anchors(input, isa, seg, &sites.semaphores);
    // The bytes every window overwrites: a jump there cannot be re-pointed.
    let mut taken: Vec<(u64, u64)> = plans
        .iter()
        .flat_map(|p| &p.windows)
        .map(|w| (w.start, w.start + w.len as u64))
        .collect();
    taken.sort_unstable();
    let total = sel.chosen.len() as u64;
    for (i, ((c, plan), reqs)) in sel.chosen.iter().zip(plans).zip(&sites.reqs_of).enumerate() {
        opts.progress.report("writing", i as u64, total);
        out.report.runs.add(&plan.runs);
        out.function(input, isa, seg, &c.f, plan, reqs, sites, &taken)?;
    }
    Ok(out)
}

impl Emitted {
    /// USDT semaphore anchors (meta::Semaphore): one never-executed instruction each.
    fn anchors(&mut self, input: &Input, isa: &dyn Isa, seg: &Segments, semaphores: &[u64]) {
        for &sem in semaphores {
            let Some(sem_off) = input.vaddr_to_offset(sem) else {
                log::warn!(
                    "{}: USDT semaphore at {sem:#x} is not in the file (.bss?): its guarded probes stay off",
                    input.name
                );
                continue;
            };
            let anchor = seg.code_at + self.code.len() as u64;
            self.code.extend_from_slice(isa.anchor());
            self.semaphores.push(meta::Semaphore {
                anchor_file_off: seg.tx_file_off(anchor),
                semaphore_file_off: sem_off,
            });
        }
    }

    /// One function: its windows' trampolines, then its uprobe sites.
    #[allow(clippy::too_many_arguments)]
    fn function(
        &mut self,
        input: &Input,
        isa: &dyn Isa,
        seg: &Segments,
        f: &Function,
        plan: FunctionPlan,
        reqs: &[SiteReq],
        sites: &Sites,
        taken: &[(u64, u64)],
    ) -> Result<()> {
        let mut uprobes = plan.uprobes;
        for w in &plan.windows {
            // The branch to the trampoline is encoded before the trampoline is kept:
            // when it is out of the backend's branch range the window's sites become
            // uprobe sites (the original code stays as it was).
            // Function entries start on 16 bytes (the hot way in); other trampolines
            // only on an instruction boundary of both ISAs: a memory trace has tens of
            // thousands, and their padding was 4 % of the binary.
            let entry = w.sites.iter().any(|s| s.kind == SiteKind::FunctionEntry);
            let align = if entry { 16 } else { 4 };
            while !self.code.len().is_multiple_of(align) {
                self.code.push(isa.code_fill());
            }
            let at = seg.code_at + self.code.len() as u64;
            let tramp = isa
                .emit_window(input, &seg.layout, &self.rt, w, at)
                .map_err(|m| Error::Encode(input.name.clone(), m))?;
            let patches = if w.entered_by.is_empty() {
                isa.patch_bytes(w, at, &tramp.landed)
                    .map(|bytes| vec![(w.start, bytes)])
            } else {
                repoint(isa, w, at, taken)
            };
            match patches {
                Ok(patches) => {
                    self.code.extend_from_slice(&tramp.code);
                    self.patches.extend(patches);
                    for s in &w.sites {
                        self.modes[s.id as usize] = Some((SiteMode::Inline, s.insn));
                    }
                }
                Err(why) => uprobes.extend(
                    w.sites
                        .iter()
                        .map(|s| (s.id, FallbackReason::Detail(why.clone()))),
                ),
            }
        }
        for (id, why) in uprobes {
            let req = reqs
                .iter()
                .find(|r| r.id == id)
                .expect("plan of this function");
            self.uprobe(input, isa, f, req);
            let said = self.reason(sites, id, why);
            self.report.uprobe_reasons.push(said);
        }
        for (id, why) in plan.untraced {
            let s = &sites.info[id as usize];
            self.modes[id as usize] = Some((SiteMode::Untraced, s.addr));
            let said = self.reason(sites, id, why);
            self.report.untraced_reasons.push(said);
        }
        Ok(())
    }

    /// Keep why site `id` is not inline, for the metadata; returns it as the report
    /// words it.
    fn reason(&mut self, sites: &Sites, id: u32, why: FallbackReason) -> (String, FallbackReason) {
        let s = &sites.info[id as usize];
        self.reasons.push(SiteReason {
            site: id,
            reason: why.clone(),
        });
        (
            format!("{} ({} at {:#x})", s.name, s.kind.name(), s.addr),
            why,
        )
    }

    /// A uprobe site: where its probe goes and, for memory and USDT sites, its operands.
    fn uprobe(&mut self, input: &Input, isa: &dyn Isa, f: &Function, req: &SiteReq) {
        let probe_at = isa.probe_addr(input, f, req);
        self.modes[req.id as usize] = Some((SiteMode::Uprobe, probe_at));
        if !matches!(req.kind, SiteKind::Memory | SiteKind::Usdt) {
            return;
        }
        match isa.uprobe_operands(input, req.kind, probe_at, &req.args) {
            Some(set) => self.operands.push(meta::SiteOperands { site: req.id, set }),
            None => log::warn!(
                "{}: {} site at {:#x}: operands not describable, its uprobe records carry zeros",
                input.name,
                req.kind.name(),
                req.addr
            ),
        }
    }

    /// The metadata site table (and the report's counts).
    fn site_table(&mut self, input: &Input, sites: &Sites) -> Result<Vec<Site>> {
        let layout_err = |m: String| Error::Layout(input.name.clone(), m);
        let mut table = Vec::with_capacity(sites.info.len());
        for (id, (s, mode)) in sites.info.iter().zip(&self.modes).enumerate() {
            let (mode, probe_at) =
                mode.ok_or_else(|| layout_err(format!("site {id} was not planned")))?;
            let counts = self.report.per_kind.entry(s.kind).or_default();
            match mode {
                SiteMode::Inline => {
                    self.report.inline += 1;
                    counts.0 += 1;
                }
                SiteMode::Uprobe => {
                    self.report.uprobe += 1;
                    counts.1 += 1;
                }
                SiteMode::Untraced => {
                    self.report.untraced += 1;
                    counts.2 += 1;
                }
            }
            let file_off = input
                .vaddr_to_offset(probe_at)
                .ok_or_else(|| layout_err(format!("function {} is not file-backed", s.name)))?;
            table.push(Site {
                id: id as u32,
                vaddr: s.addr,
                file_off,
                name: s.name.clone(),
                kind: s.kind,
                mode,
                nargs: s.nargs,
            });
        }
        Ok(table)
    }

    /// The `.note.utrace` metadata. `tx_size`, `rw_size`: the final segment sizes.
    pub(crate) fn metadata(
        &mut self,
        input: &Input,
        isa: &dyn Isa,
        seg: &Segments,
        sites: &Sites,
        opts: &Options,
        (tx_size, rw_size): (u64, u64),
    ) -> Result<Metadata> {
        let sites = self.site_table(input, sites)?;
        let mut operands = std::mem::take(&mut self.operands);
        operands.sort_unstable_by_key(|o| o.site);
        Ok(Metadata {
            arch: isa.arch(),
            record_version: RECORD_VERSION,
            record_size: RECORD_SIZE as u32,
            build_id: input.build_id.clone().unwrap_or_default(),
            nslots: opts.nslots,
            buf_records: opts.buf_records,
            flags: meta_flags(input, opts),
            binary_id: seg.layout.binary_id,
            flush_vaddr: self.rt.flush,
            flush_file_off: seg.tx_file_off(self.rt.flush_probe),
            rw_vaddr: seg.layout.rw_vaddr,
            rw_size,
            text_vaddr: seg.tx_vaddr,
            text_size: tx_size,
            original_size: input.data.len() as u64,
            time_mode: opts.time_mode,
            sites,
            semaphores: std::mem::take(&mut self.semaphores),
            operands,
        })
    }
}

fn meta_flags(input: &Input, opts: &Options) -> u32 {
    let mut flags = 0;
    if input.kind.is_static() {
        flags |= meta::META_FLAG_PRE_TLS;
    }
    if input.kind == Kind::SharedLib {
        flags |= meta::META_FLAG_SHARED_LIB;
    }
    if input.kind.is_pic() {
        flags |= meta::META_FLAG_PIC;
    }
    flags
        | match opts.buf_kind {
            BUF_CIRCULAR => meta::META_FLAG_CIRCULAR,
            BUF_FAST_CIRCULAR => meta::META_FLAG_FAST_CIRCULAR,
            _ => 0,
        }
}

/// The RwHeader page: what the run-time code and the tracer read before any slot.
pub(crate) fn rw_header(seg: &Segments) -> Vec<u8> {
    let l = &seg.layout;
    let mut page = vec![0u8; RW_FILESZ as usize];
    let mut put = |o: usize, v: &[u8]| page[o..o + v.len()].copy_from_slice(v);
    put(0, &RW_MAGIC.to_le_bytes());
    put(8, &RW_VERSION.to_le_bytes());
    put(RWH_NSLOTS as usize, &l.nslots.to_le_bytes());
    put(RWH_BUF_BYTES as usize, &l.buf_bytes.to_le_bytes());
    put(RWH_BUFS_OFF as usize, &bufs_off(l.nslots).to_le_bytes());
    put(RWH_BINARY_ID as usize, &l.binary_id.to_le_bytes());
    put(56, &u64::from(l.pre_tls).to_le_bytes());
    put(RWH_BUF_KIND as usize, &l.buf_kind.to_le_bytes());
    page
}
