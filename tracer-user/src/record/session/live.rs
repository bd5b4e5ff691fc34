//! The session's live state ([`Live`], defined where it is loaded: `attach.rs`): the
//! binaries it traces, their filters and semaphores, what was seeded and noted; and its
//! answers to `tracer filter`.

use anyhow::Result;

use super::{
    attach::Live,
    binaries::{Instrumented, SeenFiles},
    control::{Reply, Request},
    discover::Traced,
    filters::FilterSpec,
    target::RecordOptions,
};

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
            match self.add_binary(b.clone(), None) {
                Ok(_) => {}
                // Said once by `add_binary`; the other binaries are traced.
                Err(e) if e.is::<crate::record::session::shares::BinaryRefusal>() => continue,
                Err(e) => return Err(e),
            }
            seen.insert((b.file.id, b.path.clone()), Some(b.clone()));
        }
        Ok(seen)
    }

    /// The summary's warnings about binaries and processes refused.
    pub(super) fn print_refusals(&self) {
        for line in self.shares.summary_lines() {
            eprintln!("utrace: warning: {line}");
        }
    }
}
