//! Writing the rewritten binary. Append-only: the input's bytes stay where they are
//! (except the patched sites and a few header fields); everything new goes after them:
//!
//! ```text
//! [original file, sites patched] [pad]
//! [RX segment: new program header table | runtime | trampolines]   PT_LOAD R+X
//! [RW segment: RwHeader page (file) + index, slots, buffers (bss)]  PT_LOAD R+W
//! [.note.utrace] [.shstrtab with the new names] [section header table]
//! ```
//!
//! The RX segment gets `vaddr = base + offset` (the first PT_LOAD's `vaddr - offset`)
//! whenever the padding that needs stays small, because qemu-user computes AT_PHDR as
//! load base + e_phoff.

use object::elf;

use crate::error::{Error, Result};
use crate::input::{Function, Input, Phdr};
use crate::isa::{FunctionPlan, Isa, Layout, SiteReq};
use crate::{Options, sites};
use tracer_common::meta::{self, Metadata, Site, SiteKind, SiteMode};
use tracer_common::*;

const PHDR_SIZE: u64 = 56;
/// Upper bound of a trampoline without its stubs (relocated instructions, branch back,
/// alignment), and of one stub (x86-64: ~150 bytes, AArch64: ~200); only address space
/// is reserved, so be generous.
const MAX_TRAMPOLINE: u64 = 256;
const MAX_STUB: u64 = 320;
/// Largest padding we accept to keep `vaddr = base + offset` for the new segments.
const MAX_QEMU_PAD: u64 = 64 << 20;
/// File part of the RW segment: the RwHeader page.
const RW_FILESZ: u64 = 0x1000;

/// What the rewrite did, for the user.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub kind: &'static str,
    pub sites: usize,
    pub inline: usize,
    pub uprobe: usize,
    /// (site, reason) for every uprobe site.
    pub uprobe_reasons: Vec<(String, String)>,
    /// (inline, uprobe) per site kind.
    pub per_kind: std::collections::BTreeMap<SiteKind, (usize, usize)>,
    pub input_size: u64,
    pub output_size: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

pub fn build(input: &Input, isa: &dyn Isa, opts: &Options) -> Result<(Vec<u8>, Report)> {
    let layout_err = |m: String| Error::Layout(input.name.clone(), m);
    if opts.nslots < FIRST_FREE_SLOT + 1 || opts.nslots > 1 << 20 {
        return Err(layout_err(format!(
            "--slots must be between 3 and {}",
            1 << 20
        )));
    }
    if opts.buf_records < 2 || opts.buf_records > 1 << 24 {
        return Err(layout_err(
            "--buffer-records must be between 2 and 16777216".into(),
        ));
    }
    if opts.buf_kind == BUF_FAST_CIRCULAR
        && u64::from(opts.buf_records) * RECORD_SIZE as u64 != FAST_RING_BYTES
    {
        return Err(layout_err(format!(
            "fast circular buffers are {} records (64 KiB), not {}",
            FAST_RING_BYTES / RECORD_SIZE as u64,
            opts.buf_records
        )));
    }
    // Indirect control flow. Unreadable exception tables are not fatal, but then no
    // function's interior is trusted.
    let (flow, eh_problem) = match crate::flow::recover(input) {
        Ok(f) => (f, None),
        Err(e) => {
            log::warn!("{e}: only function starts and last returns are patched inline");
            (crate::flow::Flow::default(), Some(e.to_string()))
        }
    };
    for w in &flow.warnings {
        log::info!("{}: {w}", input.name);
    }
    // Functions: symbols, and FDE ranges without one (stripped binaries).
    let functions = sites::functions(input, &flow.fde_functions);
    let from_fde: std::collections::HashSet<u64> = {
        let named: std::collections::HashSet<u64> =
            input.functions.iter().map(|f| f.addr).collect();
        functions
            .iter()
            .map(|f| f.addr)
            .filter(|a| !named.contains(a))
            .collect()
    };
    // An FDE range with no symbol may be a split-off part of a function (entered by a
    // jump, registers live): it gets entry and exit sites only if a direct call
    // reaches it.
    let call_targets = isa.call_targets(input);
    let callable =
        |f: &Function| !from_fde.contains(&f.addr) || call_targets.binary_search(&f.addr).is_ok();
    let mut chosen = sites::select(input, &functions, &opts.functions)?;
    // USDT probes (every probe of the binary when asked): their functions are planned
    // too, even when no glob selected them.
    let probes = if opts.kinds.contains(&SiteKind::Usdt) {
        crate::usdt::probes(input.data, input.machine)
            .map_err(|e| Error::Layout(input.name.clone(), format!("USDT probes: {e}")))?
    } else {
        Vec::new()
    };
    let probe_fn = |pc: u64| {
        let i = functions.partition_point(|f| f.addr <= pc);
        i.checked_sub(1)
            .map(|i| &functions[i])
            .filter(|f| pc < f.addr + f.size)
    };
    let selected: std::collections::HashSet<u64> = chosen.iter().map(|(f, _)| f.addr).collect();
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
    for p in &probes {
        if let Some(f) = probe_fn(p.pc)
            && !chosen.iter().any(|(c, _)| std::ptr::eq(*c, f))
        {
            chosen.push((f, f.names[0].clone()));
        }
    }
    chosen.sort_by_key(|(f, _)| f.addr);
    let unplaced: Vec<&crate::usdt::Probe> =
        probes.iter().filter(|p| probe_fn(p.pc).is_none()).collect();
    if let Some(p) = unplaced.first() {
        return Err(Error::Layout(
            input.name.clone(),
            format!(
                "USDT probe {}:{} at {:#x} is not inside a function symbol",
                p.provider, p.name, p.pc
            ),
        ));
    }
    let targets = isa.branch_targets(input, &flow);
    let fn_starts: Vec<u64> = functions.iter().map(|f| f.addr).collect();
    // Site requests per function, ids in order.
    let mut reqs_of: Vec<Vec<SiteReq>> = Vec::with_capacity(chosen.len());
    let mut names: Vec<(String, SiteKind, u64, u8)> = Vec::new();
    // Stubs at one instruction run in this order: entry, block, USDT, memory, exit.
    let mut kinds = opts.kinds.clone();
    kinds.sort_by_key(|k| match k {
        SiteKind::FunctionEntry => 0,
        SiteKind::Block => 1,
        SiteKind::Usdt => 2,
        SiteKind::Memory => 3,
        SiteKind::Call => 4,
        SiteKind::FunctionExit => 5,
    });
    kinds.dedup();
    // Chosen record values (`--value`, `[values]`): parsed for this binary's ISA.
    let mut values: std::collections::HashMap<SiteKind, crate::usdt::Arg> = Default::default();
    for (kind, text) in &opts.values {
        let arg = crate::usdt::parse_arg(text, input.machine, 0, &|s| {
            Err(crate::usdt::ArgError::UnknownSymbol(s.to_string()))
        })
        .map_err(|e| {
            Error::Spec(
                input.name.clone(),
                format!("value of {} records {text:?}: {e}", kind.name()),
            )
        })?;
        values.insert(*kind, arg);
    }
    let mut semaphores = Vec::new();
    let total = chosen.len() as u64;
    for (i, (f, name)) in chosen.iter().enumerate() {
        opts.progress.report("finding sites", i as u64, total);
        let mut reqs = Vec::new();
        let mut add = |kind, addr, label: &str, args: Vec<crate::usdt::Arg>| {
            reqs.push(SiteReq {
                id: names.len() as u32,
                kind,
                addr,
                args: args.clone(),
            });
            let nargs = if kind == SiteKind::Usdt {
                args.len().min(255) as u8
            } else {
                0
            };
            names.push((label.to_string(), kind, addr, nargs));
        };
        let in_f = |pc: u64| (f.addr..f.addr + f.size).contains(&pc);
        for &kind in &kinds {
            if kind == SiteKind::Usdt {
                for p in probes.iter().filter(|p| in_f(p.pc)) {
                    add(
                        kind,
                        p.pc,
                        &format!("{}:{}", p.provider, p.name),
                        p.args.clone(),
                    );
                    semaphores.extend(p.semaphore);
                }
                continue;
            }
            if !selected.contains(&f.addr) {
                continue; // planned only for its USDT probes
            }
            if matches!(kind, SiteKind::FunctionEntry | SiteKind::FunctionExit) && !callable(f) {
                continue;
            }
            let facts = crate::isa::FlowFacts {
                targets: &targets,
                tail_calls: &flow.tail_calls,
            };
            let value: Vec<crate::usdt::Arg> = values.get(&kind).cloned().into_iter().collect();
            for addr in isa.sites_of(input, f, kind, &fn_starts, &facts) {
                add(kind, addr, name, value.clone());
            }
        }
        reqs_of.push(reqs);
    }
    semaphores.sort_unstable();
    semaphores.dedup();
    let plans: Vec<FunctionPlan> = chosen
        .iter()
        .zip(&reqs_of)
        .enumerate()
        .map(|(i, ((f, _), reqs))| {
            opts.progress.report("planning", i as u64, total);
            (f, reqs)
        })
        .map(|(f, reqs)| match opts.force_uprobe {
            true => FunctionPlan::all_uprobes(reqs, "--force-uprobe"),
            false => {
                let end = f.addr + f.size;
                let lo = flow
                    .unresolved_indirect_jumps
                    .partition_point(|&a| a < f.addr);
                let unresolved = flow
                    .unresolved_indirect_jumps
                    .get(lo)
                    .filter(|&&a| a < end)
                    .map(|a| format!("indirect jump at {a:#x} not explained as a jump table"));
                let unsure = eh_problem.clone().or(unresolved);
                isa.plan_function(input, f, reqs, &targets, unsure.as_deref())
            }
        })
        .collect();
    let n_windows = plans.iter().map(|p| p.windows.len()).sum::<usize>() as u64;
    let n_inline = plans
        .iter()
        .flat_map(|p| &p.windows)
        .map(|w| w.sites.len() as u64)
        .sum::<u64>();

    // binary_id: the original's identity plus what was chosen.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    match &input.build_id {
        Some(b) => fnv1a(&mut h, b),
        None => fnv1a(&mut h, input.data),
    }
    for (_, kind, addr, _) in &names {
        fnv1a(&mut h, &addr.to_le_bytes());
        fnv1a(&mut h, &[*kind as u8]);
    }
    let binary_id = h;

    // ---- Layout of the new segments.
    let a = isa.segment_align();
    let loads: Vec<&Phdr> = input.loads().collect();
    let base = loads[0].vaddr - loads[0].offset;
    let max_vend = loads.iter().map(|p| p.vaddr + p.memsz).max().unwrap_or(0);
    let file_len = input.data.len() as u64;
    let new_phnum = input.phdrs.len() as u64 + 2;
    let tx_vaddr_min = align_up(max_vend, a);
    let mut tx_off = align_up(file_len, a);
    let tx_vaddr = if base + tx_off >= tx_vaddr_min {
        base + tx_off
    } else if tx_vaddr_min - base - tx_off <= MAX_QEMU_PAD {
        tx_off = tx_vaddr_min - base;
        tx_vaddr_min
    } else {
        tx_vaddr_min
    };
    let code_at = tx_vaddr + align_up(new_phnum * PHDR_SIZE, 16);
    let tx_bound = (code_at - tx_vaddr) + 4096 + n_windows * MAX_TRAMPOLINE + n_inline * MAX_STUB;
    let rw_vaddr = align_up(tx_vaddr + tx_bound, BUF_ALIGN);
    let buf_bytes = u64::from(opts.buf_records) * RECORD_SIZE as u64;
    let layout = Layout {
        rw_vaddr,
        nslots: opts.nslots,
        buf_bytes,
        binary_id,
        pre_tls: input.kind.is_static(),
        time_mode: opts.time_mode,
        buf_kind: opts.buf_kind,
    };

    // ---- Code.
    let enc_err = |m: String| Error::Encode(input.name.clone(), m);
    let (mut code, rt) = isa
        .emit_runtime(&layout, code_at, input.entry)
        .map_err(enc_err)?;
    // USDT semaphore anchors (meta::Semaphore): one never-executed instruction each.
    let mut semaphore_meta = Vec::new();
    for &sem in &semaphores {
        let Some(sem_off) = input.vaddr_to_offset(sem) else {
            log::warn!(
                "{}: USDT semaphore at {sem:#x} is not in the file (.bss?): its guarded probes stay off",
                input.name
            );
            continue;
        };
        let anchor = code_at + code.len() as u64;
        code.extend_from_slice(isa.anchor());
        semaphore_meta.push(meta::Semaphore {
            anchor_file_off: anchor - tx_vaddr + tx_off,
            semaphore_file_off: sem_off,
        });
    }
    let mut patches: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut modes: Vec<Option<(SiteMode, u64)>> = vec![None; names.len()];
    // Where the eBPF `site` program finds what a uprobe memory or USDT site records.
    let mut operands: Vec<meta::SiteOperands> = Vec::new();
    let mut report = Report {
        kind: input.kind.name(),
        sites: names.len(),
        input_size: file_len,
        ..Default::default()
    };
    for (i, ((f, _), (plan, reqs))) in chosen
        .iter()
        .zip(plans.into_iter().zip(&reqs_of))
        .enumerate()
    {
        opts.progress.report("writing", i as u64, total);
        let mut uprobes = plan.uprobes;
        for w in &plan.windows {
            // The branch to the trampoline is encoded first: when the trampoline is
            // out of the backend's branch range the window's sites become uprobe
            // sites (the original code stays as it was).
            while code.len() % 16 != 0 {
                code.push(isa.code_fill());
            }
            let at = code_at + code.len() as u64;
            match isa.patch_bytes(w.start, at, w.len) {
                Ok(bytes) => {
                    let tramp = isa
                        .emit_window(input, &layout, &rt, w, at)
                        .map_err(enc_err)?;
                    code.extend_from_slice(&tramp);
                    patches.push((w.start, bytes));
                    for s in &w.sites {
                        modes[s.id as usize] = Some((SiteMode::Inline, s.at));
                    }
                }
                Err(why) => uprobes.extend(w.sites.iter().map(|s| (s.id, why.clone()))),
            }
        }
        for (id, why) in uprobes {
            let req = reqs
                .iter()
                .find(|r| r.id == id)
                .expect("plan of this function");
            let probe_at = isa.probe_addr(input, f, req);
            modes[id as usize] = Some((SiteMode::Uprobe, probe_at));
            if matches!(req.kind, SiteKind::Memory | SiteKind::Usdt) {
                match isa.uprobe_operands(input, req.kind, probe_at, &req.args) {
                    Some(set) => operands.push(meta::SiteOperands { site: id, set }),
                    None => log::warn!(
                        "{}: {} site at {:#x}: operands not describable, its uprobe records carry zeros",
                        input.name,
                        req.kind.name(),
                        req.addr
                    ),
                }
            }
            let (name, kind, addr, _) = &names[id as usize];
            report
                .uprobe_reasons
                .push((format!("{name} ({} at {addr:#x})", kind.name()), why));
        }
    }
    let mut sites_meta = Vec::with_capacity(names.len());
    for (id, ((name, kind, addr, nargs), mode)) in names.iter().zip(modes).enumerate() {
        let (mode, probe_at) =
            mode.ok_or_else(|| layout_err(format!("site {id} was not planned")))?;
        match mode {
            SiteMode::Inline => report.inline += 1,
            SiteMode::Uprobe => report.uprobe += 1,
        }
        let counts = report.per_kind.entry(*kind).or_default();
        match mode {
            SiteMode::Inline => counts.0 += 1,
            SiteMode::Uprobe => counts.1 += 1,
        }
        let file_off = input
            .vaddr_to_offset(probe_at)
            .ok_or_else(|| layout_err(format!("function {name} is not file-backed")))?;
        sites_meta.push(Site {
            id: id as u32,
            vaddr: *addr,
            file_off,
            name: name.clone(),
            kind: *kind,
            mode,
            nargs: *nargs,
        });
    }
    operands.sort_unstable_by_key(|o| o.site);
    let tx_size = (code_at - tx_vaddr) + code.len() as u64;
    if tx_vaddr + tx_size > rw_vaddr {
        return Err(layout_err("trampolines larger than planned".into()));
    }

    // ---- File offsets of the RW segment and the trailing parts.
    // Fast rings must be 64 KiB aligned at run time: the loader aligns a segment's
    // load address to its p_align (the kernel for executables, ld.so for libraries).
    let rw_align = if opts.buf_kind == BUF_FAST_CIRCULAR {
        a.max(FAST_RING_BYTES)
    } else {
        a
    };
    let rw_off = align_up(tx_off + tx_size, rw_align) + (rw_vaddr % rw_align);
    let rw_size = rw_size(opts.buf_kind, opts.nslots, buf_bytes);
    let mut out = input.data.to_vec();
    out.resize(tx_off as usize, 0);

    // New program header table: old entries (PT_PHDR moved), new PT_LOADs after the
    // last PT_LOAD so that PT_LOADs stay sorted by address.
    let mut phdrs = input.phdrs.clone();
    for p in phdrs.iter_mut().filter(|p| p.p_type == elf::PT_PHDR) {
        p.offset = tx_off;
        p.vaddr = tx_vaddr;
        p.paddr = tx_vaddr;
        p.filesz = new_phnum * PHDR_SIZE;
        p.memsz = new_phnum * PHDR_SIZE;
    }
    let last_load = phdrs
        .iter()
        .rposition(|p| p.p_type == elf::PT_LOAD)
        .unwrap_or(0);
    let new_loads = [
        Phdr {
            p_type: elf::PT_LOAD,
            p_flags: elf::PF_R | elf::PF_X,
            offset: tx_off,
            vaddr: tx_vaddr,
            paddr: tx_vaddr,
            filesz: tx_size,
            memsz: tx_size,
            align: a,
        },
        Phdr {
            p_type: elf::PT_LOAD,
            p_flags: elf::PF_R | elf::PF_W,
            offset: rw_off,
            vaddr: rw_vaddr,
            paddr: rw_vaddr,
            filesz: RW_FILESZ,
            memsz: rw_size,
            align: rw_align,
        },
    ];
    phdrs.splice(last_load + 1..last_load + 1, new_loads);
    for p in &phdrs {
        put_phdr(&mut out, p);
    }
    out.resize((code_at - tx_vaddr + tx_off) as usize, 0);
    out.extend_from_slice(&code);

    // RW header page.
    out.resize(rw_off as usize, 0);
    let hdr_at = out.len();
    out.resize(hdr_at + RW_FILESZ as usize, 0);
    let mut put = |o: usize, v: &[u8]| out[hdr_at + o..hdr_at + o + v.len()].copy_from_slice(v);
    put(0, &RW_MAGIC.to_le_bytes());
    put(8, &RW_VERSION.to_le_bytes());
    put(RWH_NSLOTS as usize, &opts.nslots.to_le_bytes());
    put(RWH_BUF_BYTES as usize, &buf_bytes.to_le_bytes());
    put(RWH_BUFS_OFF as usize, &bufs_off(opts.nslots).to_le_bytes());
    put(RWH_BINARY_ID as usize, &binary_id.to_le_bytes());
    put(56, &u64::from(layout.pre_tls).to_le_bytes());
    put(RWH_BUF_KIND as usize, &opts.buf_kind.to_le_bytes());

    // Patch the sites.
    for (vaddr, bytes) in &patches {
        let off = input
            .vaddr_to_offset(*vaddr)
            .ok_or_else(|| layout_err(format!("site {vaddr:#x} not file-backed")))?
            as usize;
        out[off..off + bytes.len()].copy_from_slice(bytes);
    }

    // Metadata note.
    let mut flags = 0;
    if layout.pre_tls {
        flags |= meta::META_FLAG_PRE_TLS;
    }
    if input.kind == crate::input::Kind::SharedLib {
        flags |= meta::META_FLAG_SHARED_LIB;
    }
    if input.kind.is_pic() {
        flags |= meta::META_FLAG_PIC;
    }
    flags |= match opts.buf_kind {
        BUF_CIRCULAR => meta::META_FLAG_CIRCULAR,
        BUF_FAST_CIRCULAR => meta::META_FLAG_FAST_CIRCULAR,
        _ => 0,
    };
    let metadata = Metadata {
        arch: isa.arch(),
        record_version: RECORD_VERSION,
        record_size: RECORD_SIZE as u32,
        build_id: input.build_id.clone().unwrap_or_default(),
        nslots: opts.nslots,
        buf_records: opts.buf_records,
        flags,
        binary_id,
        flush_vaddr: rt.flush,
        flush_file_off: rt.flush - tx_vaddr + tx_off,
        rw_vaddr,
        rw_size,
        text_vaddr: tx_vaddr,
        text_size: tx_size,
        original_size: file_len,
        time_mode: opts.time_mode,
        sites: sites_meta,
        semaphores: semaphore_meta,
        operands,
    };
    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    let note_off = out.len() as u64;
    let note = metadata.to_note();
    out.extend_from_slice(&note);

    // Section headers: the old ones, then ours; .shstrtab rewritten with the new names.
    let mut shdrs: Vec<[u8; 64]> = Vec::new();
    let mut strtab: Vec<u8>;
    let shstrndx: usize;
    if input.shnum == 0 {
        shdrs.push([0u8; 64]);
        strtab = vec![0];
        shstrndx = usize::MAX;
    } else {
        let so = input.shoff as usize;
        for i in 0..input.shnum as usize {
            let b = out.get(so + i * 64..so + i * 64 + 64).ok_or_else(|| {
                Error::Malformed(input.name.clone(), "section header table truncated".into())
            })?;
            shdrs.push(b.try_into().unwrap());
        }
        let s = &input.sections[input.shstrndx as usize];
        strtab = input.data[s.offset as usize..(s.offset + s.size) as usize].to_vec();
        shstrndx = input.shstrndx as usize;
    }
    let add_name = |strtab: &mut Vec<u8>, n: &str| {
        let o = strtab.len() as u32;
        strtab.extend_from_slice(n.as_bytes());
        strtab.push(0);
        o
    };
    let x = u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR);
    let w = u64::from(elf::SHF_ALLOC | elf::SHF_WRITE);
    let n1 = add_name(&mut strtab, ".utrace.text");
    let n2 = add_name(&mut strtab, ".utrace.data");
    let n3 = add_name(&mut strtab, ".utrace.bss");
    let n4 = add_name(&mut strtab, meta::META_SECTION);
    shdrs.push(shdr(
        n1,
        elf::SHT_PROGBITS,
        x,
        tx_vaddr,
        tx_off,
        tx_size,
        16,
    ));
    shdrs.push(shdr(
        n2,
        elf::SHT_PROGBITS,
        w,
        rw_vaddr,
        rw_off,
        RW_FILESZ,
        64,
    ));
    shdrs.push(shdr(
        n3,
        elf::SHT_NOBITS,
        w,
        rw_vaddr + RW_FILESZ,
        rw_off + RW_FILESZ,
        rw_size - RW_FILESZ,
        64,
    ));
    shdrs.push(shdr(
        n4,
        elf::SHT_NOTE,
        0,
        0,
        note_off,
        note.len() as u64,
        4,
    ));
    let shstrndx = if shstrndx == usize::MAX {
        let n = add_name(&mut strtab, ".shstrtab");
        shdrs.push(shdr(n, elf::SHT_STRTAB, 0, 0, 0, 0, 1));
        shdrs.len() - 1
    } else {
        shstrndx
    };
    let strtab_off = out.len() as u64;
    out.extend_from_slice(&strtab);
    shdrs[shstrndx][24..32].copy_from_slice(&strtab_off.to_le_bytes());
    shdrs[shstrndx][32..40].copy_from_slice(&(strtab.len() as u64).to_le_bytes());
    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    let shoff = out.len() as u64;
    for s in &shdrs {
        out.extend_from_slice(s);
    }

    // ELF header.
    out[24..32].copy_from_slice(&rt.entry_shim.unwrap_or(input.entry).to_le_bytes());
    out[32..40].copy_from_slice(&tx_off.to_le_bytes());
    out[40..48].copy_from_slice(&shoff.to_le_bytes());
    out[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
    out[60..62].copy_from_slice(&(shdrs.len() as u16).to_le_bytes());
    out[62..64].copy_from_slice(&(shstrndx as u16).to_le_bytes());

    report.output_size = out.len() as u64;
    Ok((out, report))
}

fn put_phdr(out: &mut Vec<u8>, p: &Phdr) {
    out.extend_from_slice(&p.p_type.to_le_bytes());
    out.extend_from_slice(&p.p_flags.to_le_bytes());
    for v in [p.offset, p.vaddr, p.paddr, p.filesz, p.memsz, p.align] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn shdr(name: u32, ty: u32, flags: u64, addr: u64, off: u64, size: u64, align: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(&name.to_le_bytes());
    b[4..8].copy_from_slice(&ty.to_le_bytes());
    b[8..16].copy_from_slice(&flags.to_le_bytes());
    b[16..24].copy_from_slice(&addr.to_le_bytes());
    b[24..32].copy_from_slice(&off.to_le_bytes());
    b[32..40].copy_from_slice(&size.to_le_bytes());
    b[48..56].copy_from_slice(&align.to_le_bytes());
    b
}
