//! `<sys/sdt.h>` argument specifications of both ISAs: an error naming the argument,
//! or arguments of a width the stubs can read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use object::elf::{EM_AARCH64, EM_X86_64};
use rewriter::usdt::{ArgError, parse_args};

/// Symbols starting with `g` resolve (to an address derived from the name).
fn resolve(name: &str) -> Result<u64, ArgError> {
    if name.starts_with('g') {
        Ok(0x4000 + name.len() as u64 * 8)
    } else {
        Err(ArgError::UnknownSymbol(name.into()))
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for machine in [EM_X86_64, EM_AARCH64] {
        if let Ok(args) = parse_args(text, machine, 0x1000, &resolve) {
            for a in args {
                assert!(matches!(a.size, 1 | 2 | 4 | 8), "size {}", a.size);
            }
        }
    }
});
