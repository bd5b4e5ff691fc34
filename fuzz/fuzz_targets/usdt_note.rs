//! `.note.stapsdt` in any bytes (an ELF file): probes or an error, for both ISAs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use object::elf::{EM_AARCH64, EM_X86_64};

fuzz_target!(|data: &[u8]| {
    for machine in [EM_X86_64, EM_AARCH64] {
        let _ = rewriter::usdt::probes(data, machine);
    }
});
