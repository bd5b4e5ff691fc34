//! The aarch64 `tracer` (aarch64-unknown-linux-musl, its eBPF object built for arm64).

use std::path::PathBuf;

use anyhow::Result;

use super::MUSL_TARGET;
use crate::util::{self, cmd};

/// `cargo build --release -p tracer-user --target aarch64-unknown-linux-musl`, linked
/// with rust-lld (the linker is set for this target only, in this command's
/// environment: host builds are unaffected). tracer-user's build script builds the
/// eBPF object for the target's architecture.
pub(crate) fn cross_build_tracer() -> Result<PathBuf> {
    let var = format!(
        "CARGO_TARGET_{}_LINKER",
        MUSL_TARGET.to_uppercase().replace('-', "_")
    );
    util::run(
        cmd("cargo")
            .args([
                "build",
                "--release",
                "-p",
                "tracer-user",
                "--target",
                MUSL_TARGET,
            ])
            .env(var, "rust-lld")
            .current_dir(util::workspace_root()),
    )?;
    Ok(util::target_dir()
        .join(MUSL_TARGET)
        .join("release")
        .join("tracer"))
}
