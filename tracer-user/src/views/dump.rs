//! `tracer dump`: one tab-separated line per record, in delivery order; a memory pair is
//! two lines, one per access, as a stub per instruction would have written them.

use std::{io::Write, path::Path};

use anyhow::Result;

use crate::{
    read::{
        accesses,
        coarse::Timeline,
        events::{time_ns, truncation_warning},
        names::Names,
        range::{RangeSkip, TimeRange, Window},
    },
    tracefile::{self, Next, Reader, Section, clock::Calibration},
};

/// Print one line per record, in delivery order:
/// `pid tid binary site symbol value aux time_ns flags` (tab separated; value and aux
/// in 0x-hex; time in CLOCK_MONOTONIC ns; flags in decimal).
/// Only the records in `range`.
pub fn dump(path: &Path, range: &TimeRange, out: &mut impl Write) -> Result<()> {
    let end = tracefile::read_stats(path)?.and_then(|s| s.clock_end);
    let mut timeline = Timeline::scan(path)?;
    let mut r = Reader::open(path)?;
    let mut names = Names::new(&[]);
    let mut clock: Option<Calibration> = None;
    let mut stats = None;
    let mut window = Window::ALL;
    let mut skip = RangeSkip::new(range);
    let (mut skipped, mut unread) = (0usize, 0u64);
    while let Some(next) =
        r.next_section_unless(|hs| skip.skip(hs, |b| timeline.interpolated(b)))?
    {
        let section = match next {
            Next::Section(s) => s,
            Next::Skipped(hs) => {
                skipped += hs.len();
                continue;
            }
            Next::Unread(n) => {
                skipped += n as usize;
                unread += n;
                continue;
            }
        };
        match section {
            Section::Session(s) => {
                skip.session(s.clock.anchor.monotonic_ns);
                if let Some(keep) = skip.keeps() {
                    r.only(keep);
                }
                window = range.window(s.clock.anchor.monotonic_ns);
                clock = Some(s.clock.refined(end));
            }
            Section::Binary(b) => names.add(&b),
            Section::Load(pid, id, bias) => names.loaded_at(pid, id, bias),
            Section::Chunk(mut c) => {
                skip.note(&c.header);
                accesses::expand(&mut c, &names);
                timeline.apply(&mut c);
                let h = c.header;
                let bin = names.binary(h.binary_id);
                for rec in c.records.iter().filter(|r| names.is_record(h.binary_id, r)) {
                    let t = time_ns(rec, clock.as_ref());
                    if !window.contains(t) {
                        continue;
                    }
                    writeln!(
                        out,
                        "{}\t{}\t{}\t{}\t{}\t{:#x}\t{:#x}\t{}\t{}",
                        h.pid,
                        h.tid,
                        bin,
                        rec.site,
                        names.raw_symbol(h.binary_id, rec.site),
                        rec.value,
                        rec.aux,
                        t,
                        rec.flags
                    )?;
                }
            }
            Section::Stats(s) => stats = Some(s),
            Section::Comm(..) | Section::String(_) => {}
            Section::Unknown(kind) => log::debug!("skipping section of unknown kind {kind}"),
        }
    }
    out.flush()?;
    log::debug!("{skipped} chunks outside the range not decoded");
    log::debug!("{unread} of them passed over unread by the file's index");
    truncation_warning(path, &r, stats.as_ref());
    Ok(())
}
