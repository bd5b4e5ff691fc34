//! For the fixtures that reach into their own RW area (`hostile.c`, `nonresident.c`,
//! both on `fixtures/own_slot.h`): building them and reading their tagged values; the
//! layout header that `own_slot.h` checks its hand-written offsets against.

use std::path::PathBuf;

use tracer_common::meta::Metadata;

use crate::compile::compile;
use crate::dump::Rec;
use crate::paths::{TempDir, fixture};
use crate::rewriter::{metadata, rewriter};

/// The value of record `i` of tagged case `tag` (the fixtures' `tagged()`).
pub fn tag_value(tag: u64, i: u64) -> u64 {
    (0x7a9 << 48) | (tag << 32) | i
}

/// The values of `recs` in `base..base + n`, less `base`, in order.
pub fn values_in(recs: &[&Rec], base: u64, n: u64) -> Vec<u64> {
    recs.iter()
        .filter(|r| (base..base + n).contains(&r.value))
        .map(|r| r.value - base)
        .collect()
}

/// `fixtures/NAME.c` compiled (-O2 -pthread) and rewritten into `NAME.traced` (only
/// `rec`, `buffer_records`-record buffers); with its metadata and the address of its
/// flush function as the fixture's argument.
pub fn build_rec_only(
    tmp: &TempDir,
    name: &str,
    buffer_records: &str,
) -> (PathBuf, String, Metadata) {
    check_layout_header();
    let (orig, traced) = (tmp.join(name), tmp.join(format!("{name}.traced")));
    compile(
        "gcc",
        &[fixture(&format!("{name}.c"))],
        &["-O2", "-pthread"],
        &orig,
    );
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "rec".as_ref(),
        "--buffer-records".as_ref(),
        buffer_records.as_ref(),
    ])
    .ok();
    let meta = metadata(&traced);
    let flush = format!("{:x}", meta.flush_vaddr);
    (traced, flush, meta)
}

/// Panics unless `fixtures/utrace_layout.h` is what tracer-common renders now (the C
/// fixtures `_Static_assert` their copies of the layout against it; any compile finds it
/// next to them). `UTRACE_BLESS=1` rewrites it.
pub fn check_layout_header() {
    let path = fixture("utrace_layout.h");
    let want = tracer_common::c_header::render();
    if std::env::var_os("UTRACE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not tracer-common's layout: rerun with UTRACE_BLESS=1",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout_header_is_current() {
        super::check_layout_header();
    }
}
