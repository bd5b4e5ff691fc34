//! Tests that cannot run here. A missing tool is a setup bug (`cargo xtask setup`
//! installs every tool the tests use), so a test that lacks one fails, unless the run
//! allows that tool to be missing: `cargo xtask test --allow-skip TOOL` sets
//! `UTRACE_ALLOW_SKIP` (a comma-separated list) and `UTRACE_SKIP_LOG`, a file each
//! allowed skip is appended to, for the run's summary line.
//!
//! ```no_run
//! if !tests::skip::require("qemu-aarch64", tests::skip::runs("qemu-aarch64"), "aarch64 entries") {
//!     return; // allowed to skip, and logged
//! }
//! ```

use std::io::Write;
use std::process::Command;

/// Environment variable: the tools a run may lack (comma-separated).
pub const ALLOW_ENV: &str = "UTRACE_ALLOW_SKIP";
/// Environment variable: the file allowed skips are appended to (`TOOL\tWHAT` lines).
pub const LOG_ENV: &str = "UTRACE_SKIP_LOG";

/// Whether `tool --version` runs and succeeds.
pub fn runs(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `present` when the tool is there; otherwise false if this run allows `tool` to be
/// missing (the skip is logged), else the test fails here, naming the tool.
pub fn require(tool: &str, present: bool, what: &str) -> bool {
    if present {
        return true;
    }
    let allowed = std::env::var(ALLOW_ENV).is_ok_and(|v| v.split(',').any(|t| t.trim() == tool));
    assert!(
        allowed,
        "{what}: {tool} is missing. A missing tool is a setup bug: `cargo xtask setup` \
         installs it (`cargo xtask test --allow-skip {tool}` lets this test skip)"
    );
    eprintln!("SKIP {what}: {tool} is missing (allowed by --allow-skip {tool})");
    if let Some(path) = std::env::var_os(LOG_ENV) {
        let line = format!("{tool}\t{what}\n");
        let logged = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        logged.unwrap_or_else(|e| panic!("cannot log a skip to {}: {e}", path.to_string_lossy()));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "A missing tool is a setup bug")]
    fn a_missing_tool_fails_the_test() {
        let tool = "utrace-no-such-tool";
        require(tool, runs(tool), "the skip test");
    }

    #[test]
    fn a_present_tool_passes() {
        assert!(runs("ls"));
        assert!(require("cc", true, "the skip test"));
    }
}
