//! The TOML instrumentation spec (`rewriter --spec`) and the CLI's site and value
//! names: an error or options the rewriter's own check accepts or refuses, no panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewriter::{Options, spec};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut opts = Options::default();
    let _ = spec::apply("fuzz.toml", text, &mut opts);
    for word in text.split([',', '\n']) {
        let _ = spec::parse_kind(word);
        let _ = spec::parse_value(word);
        let _ = spec::parse_buf_kind(word);
        let _ = spec::parse_time(word);
    }
});
