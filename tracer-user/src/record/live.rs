//! The session's live state: the loaded eBPF object, the binaries it traces, their
//! filters and semaphores, what was seeded and noted; and its answers to `tracer filter`.

use std::{collections::HashSet, os::unix::fs::MetadataExt, time::Instant};

use anyhow::{Context, Result};
use aya::{Ebpf, programs::UProbe};
use tracer_common::ebpf::{PROG_FLUSH, PROG_FLUSH_SLEEPABLE, PROG_SITE};

use crate::record::{
    RecordOptions, SeenFiles,
    attach::{SPARE_OPERAND_SETS, load, operand_sets, verified},
    binaries::Instrumented,
    control::{Reply, Request},
    discover::Traced,
    filters::{FilterSpec, Filters},
    host::kernel,
    semaphores::Raised,
};

/// The loaded eBPF object and what the session traces.
pub(super) struct Live {
    pub(super) ebpf: Ebpf,
    pub(super) write_user: bool,
    /// The flush program in use (sleepable or not).
    pub(super) flush: &'static str,
    /// Ordinal = index.
    pub(super) binaries: Vec<Instrumented>,
    pub(super) raised: Raised,
    pub(super) filters: Filters,
    pub(super) filter_changes: u64,
    /// (pid, rw_base) already in `TABLES`.
    pub(super) seeded: HashSet<(u32, u64)>,
    /// (pid, binary id, bias) written to the trace file.
    pub(super) loads: HashSet<(u32, u64, u64)>,
}

impl Live {
    /// Load the object and its programs (attached per binary by `add_binary`).
    pub(super) fn load(ring_bytes: u32, system_wide: bool, initial: &[Traced]) -> Result<Self> {
        let write_user = kernel::probe_write_user_allowed();
        if !write_user {
            log::info!(
                "the kernel refuses bpf_probe_write_user (lockdown?): slots are not reset or released in place"
            );
        }
        let sets: usize = initial
            .iter()
            .map(|t| operand_sets(&[&t.binary], 0).len())
            .sum::<usize>()
            + SPARE_OPERAND_SETS;
        let mut ebpf = load(ring_bytes, write_user, system_wide, sets)?;
        // The sleepable flush where the kernel has sleepable uprobes, else the plain one.
        let sleepable = {
            let p: &mut UProbe = ebpf
                .program_mut(PROG_FLUSH_SLEEPABLE)
                .with_context(|| format!("no program {PROG_FLUSH_SLEEPABLE}"))?
                .try_into()?;
            let t = Instant::now();
            let r = p.load();
            log::debug!("{PROG_FLUSH_SLEEPABLE} verified in {:?}", t.elapsed());
            match r {
                Ok(()) => true,
                Err(e) => {
                    log::info!("no sleepable flush program ({e}); using the plain one");
                    false
                }
            }
        };
        let flush = if sleepable {
            PROG_FLUSH_SLEEPABLE
        } else {
            PROG_FLUSH
        };
        for name in [flush, PROG_SITE] {
            let p: &mut UProbe = ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name} in the eBPF object"))?
                .try_into()?;
            if p.fd().is_err() {
                verified(name, || p.load())?;
            }
        }
        let filters = Filters::take(&mut ebpf)?;
        Ok(Live {
            ebpf,
            write_user,
            flush,
            binaries: Vec::new(),
            raised: Raised::default(),
            filters,
            filter_changes: 0,
            seeded: HashSet::new(),
            loads: HashSet::new(),
        })
    }
}

impl Live {
    /// A control-socket request.
    pub(super) fn handle(&mut self, req: Request) -> Reply {
        if let Some(spec) = req.filter {
            return match self.set_filter(&spec) {
                Ok(n) => {
                    self.filter_changes += 1;
                    log::info!("filter now: {}", spec.describe());
                    Reply {
                        ok: true,
                        message: format!("filter: {} ({n} sites matched)", spec.describe()),
                    }
                }
                Err(e) => Reply {
                    ok: false,
                    message: format!("{e:#}"),
                },
            };
        }
        Reply {
            ok: true,
            message: format!(
                "filter: {}; {} binaries traced",
                self.filters.spec().describe(),
                self.binaries.len()
            ),
        }
    }

    /// Put `spec` in force for every traced binary; the number of sites it matched.
    fn set_filter(&mut self, spec: &FilterSpec) -> Result<usize> {
        let refs: Vec<&Instrumented> = self.binaries.iter().collect();
        self.filters.set(spec, &refs)
    }

    /// The filter of `record`'s options.
    pub(super) fn set_initial_filter(&mut self, opts: &RecordOptions) -> Result<()> {
        let matched = self.set_filter(&opts.filter)?;
        if !opts.filter.is_empty() {
            log::info!("filter: {} ({matched} sites)", opts.filter.describe());
        }
        Ok(())
    }

    /// Trace the session's first binaries; the files seen so far (for later scans).
    pub(super) fn add_initial(&mut self, initial: &[Traced]) -> Result<SeenFiles> {
        let mut seen = SeenFiles::new();
        for t in initial {
            let b = &t.binary;
            self.add_binary(b.clone(), None)?;
            if let Ok(md) = std::fs::metadata(&b.path) {
                seen.insert((b.path.clone(), md.ino()), Some(b.clone()));
            }
        }
        Ok(seen)
    }
}
