//! The rewriter's ELF input: any bytes give a clear error or an output that is a
//! rewritten ELF (refused as input again, its metadata note readable), never a panic
//! or a hang. Every site kind, so every planner runs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewriter::{Error, Options, SiteKind, elf::read::Input};
use tracer_common::meta::{META_SECTION, Metadata};

fuzz_target!(|data: &[u8]| {
    let opts = Options {
        kinds: SiteKind::ALL.to_vec(),
        ..Options::default()
    };
    let Ok((out, _report)) = rewriter::rewrite("fuzz", data, &opts) else {
        return;
    };
    match Input::parse("out", &out) {
        Err(Error::AlreadyRewritten(..)) => {}
        Err(e) => panic!("the output does not read back: {e}"),
        Ok(_) => panic!("the output is accepted as an original"),
    }
    let file = object::File::parse(&*out).expect("the output is ELF");
    let note = object::Object::section_by_name(&file, META_SECTION).expect("a metadata section");
    let note = object::ObjectSection::data(&note).expect("its bytes");
    Metadata::from_note_section(note)
        .expect("a utrace note")
        .expect("a metadata note that parses");
});
