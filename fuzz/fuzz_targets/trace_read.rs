//! The trace-file reader: every section of any bytes reads or fails with an error,
//! and a truncation is reported inside the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_user::tracefile::Reader;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(mut r) = Reader::from_bytes("fuzz", data.to_vec()) else {
        return;
    };
    while let Ok(Some(_)) = r.next_section() {
        assert!(r.offset() <= len);
    }
    if let Some(t) = r.truncated() {
        assert!(t.offset <= len, "truncated at {} of {len}", t.offset);
    }
});
