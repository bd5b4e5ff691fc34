//! The RW area and record layout as a C header (`utrace_layout.h`), for the C code that
//! repeats it by hand (`tests/fixtures/own_slot.h`, `xtask/arm64-vm/standin.c`): they
//! `_Static_assert` their copies against it, so a layout change breaks their build
//! rather than their runs. Values are plain decimal (usable in `#` stringified asm
//! operands) except the magic.

use core::mem::{offset_of, size_of};
use std::fmt::Write;

use crate::layout::*;
use crate::record::{RECORD_SIZE, Record};

/// The header's text.
pub fn render() -> String {
    let mut s = String::from(
        "/* Generated from tracer-common (layout.rs, record.rs) by\n \
         * tracer_common::c_header::render(): do not edit. */\n\
         #ifndef UTRACE_LAYOUT_H\n#define UTRACE_LAYOUT_H\n\n",
    );
    let _ = writeln!(s, "#define UTRACE_RW_MAGIC {RW_MAGIC:#x}ULL");
    for (name, v) in values() {
        let _ = writeln!(s, "#define UTRACE_{name} {v}");
    }
    s.push_str("\n#endif\n");
    s
}

/// (name, value) of every constant the header defines, magic apart.
fn values() -> Vec<(&'static str, u64)> {
    let r = |off: usize| off as u64;
    vec![
        ("RW_VERSION", RW_VERSION.into()),
        ("PRE_TLS_OFF", PRE_TLS_OFF),
        ("INDEX_OFF", INDEX_OFF),
        ("INDEX_ENTRIES", INDEX_ENTRIES),
        ("SLOTS_OFF", SLOTS_OFF),
        ("SLOT_SIZE", SLOT_SIZE),
        ("BUF_ALIGN", BUF_ALIGN),
        ("BUF_SLACK_RECORDS", BUF_SLACK_RECORDS),
        ("KEY_FREE", KEY_FREE),
        ("KEY_TOMBSTONE", KEY_TOMBSTONE),
        ("RWH_MAGIC", RWH_MAGIC),
        ("RWH_VERSION", r(offset_of!(RwHeader, version))),
        ("RWH_NSLOTS", RWH_NSLOTS),
        ("RWH_BUF_BYTES", RWH_BUF_BYTES),
        ("RWH_BUFS_OFF", RWH_BUFS_OFF),
        ("RWH_BINARY_ID", RWH_BINARY_ID),
        ("RWH_NO_SLOT_DROPS", RWH_NO_SLOT_DROPS),
        ("RWH_REGISTRATIONS", RWH_REGISTRATIONS),
        ("RWH_PRE_TLS", r(offset_of!(RwHeader, pre_tls))),
        ("RWH_USER_STATE", RWH_USER_STATE),
        ("RWH_SIZE", r(size_of::<RwHeader>())),
        ("SLOT_KEY", SLOT_KEY),
        ("SLOT_CUR", SLOT_CUR),
        ("SLOT_END", SLOT_END),
        ("SLOT_START", SLOT_START),
        ("SLOT_RW_BASE", SLOT_RW_BASE),
        ("SLOT_BINARY_ID", SLOT_BINARY_ID),
        ("SLOT_OWNER_TID", SLOT_OWNER_TID),
        ("SLOT_GENERATION", SLOT_GENERATION),
        ("SLOT_INFLIGHT", SLOT_INFLIGHT),
        ("RECORD_SIZE", r(RECORD_SIZE)),
        ("RECORD_SITE", r(offset_of!(Record, site))),
        ("RECORD_FLAGS", r(offset_of!(Record, flags))),
        ("RECORD_TIME", r(offset_of!(Record, time))),
        ("RECORD_VALUE", r(offset_of!(Record, value))),
        ("RECORD_AUX", r(offset_of!(Record, aux))),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_offsets_as_plain_numbers() {
        let h = super::render();
        assert!(h.contains("#define UTRACE_SLOTS_OFF 270336\n"));
        assert!(h.contains("#define UTRACE_SLOT_INFLIGHT 56\n"));
        assert!(h.contains("#define UTRACE_RW_MAGIC 0x3130575243525455ULL\n"));
    }
}
