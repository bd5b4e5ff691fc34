//! `.note.utrace`, which the tracer (as root) reads from every binary it traces:
//! an error, or metadata that encodes to a note reading back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_common::meta::Metadata;

fuzz_target!(|data: &[u8]| {
    let reasons = Metadata::reasons_from_note_section(data);
    let Some(Ok(meta)) = Metadata::from_note_section(data) else {
        return;
    };
    let reasons = match reasons {
        Some(Ok(r)) => r,
        _ => Vec::new(),
    };
    let again = meta.to_note_with(&reasons);
    let back = Metadata::from_note_section(&again)
        .expect("our own note")
        .expect("our own note parses");
    assert_eq!(back, meta);
});
