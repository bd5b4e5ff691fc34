//! The rewritten program behaves like the original (stdout and exit status), alone and
//! under `tracer record`: the check the matrix, shared-library and AArch64 runs share.

use std::ffi::OsStr;
use std::path::Path;

use crate::command::Out;
use crate::tracer::tracer_record_with;

/// Assert that `got` printed what `want` printed and exited the same way.
pub fn assert_same_output(got: &Out, want: &Out, what: &str) {
    assert_eq!(
        (got.stdout_str(), got.status()),
        (want.stdout_str(), want.status()),
        "{what}: {}",
        got.describe()
    );
}

/// `tracer record TFLAGS -o TRACE -- PROG` with `env`, asserting that it behaves like
/// `want` (the original).
pub fn record_same_output(
    tflags: &[&str],
    trace: &Path,
    prog: &Path,
    env: &[(&str, &OsStr)],
    want: &Out,
    what: &str,
) -> Out {
    let r = tracer_record_with(tflags, trace, prog, &[], env);
    assert_same_output(&r, want, &format!("{what}: under tracer record"));
    r
}
