//! The control socket's protocol (`tracer filter` → a session): a request line is
//! refused with a reason or accepted with a filter that describes itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_user::record::control::parse_request;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = parse_request(data)
        && let Some(f) = req.filter
    {
        let _ = f.describe();
    }
});
