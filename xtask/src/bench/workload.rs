//! The bench fixtures: a C program of `xtask/bench/` compiled and rewritten into a fresh
//! scratch directory (the drain and readers sections' producers).

use std::path::PathBuf;

use anyhow::Result;

use crate::util::{self, cmd};

/// Compile `xtask/bench/<name>.c` with `cflags` into a fresh `target/xtask/bench-<name>`
/// and rewrite it with `rewrite` (rewriter arguments): (the directory, the rewritten
/// program).
pub(super) fn build_workload(
    name: &str,
    cflags: &[&str],
    rewrite: &[&str],
) -> Result<(PathBuf, PathBuf)> {
    let dir = util::scratch_dir(&format!("bench-{name}"))?;
    let src = util::workspace_root().join(format!("xtask/bench/{name}.c"));
    let plain = dir.join(name);
    let traced = dir.join(format!("{name}.traced"));
    util::run(cmd("gcc").args(cflags).arg(&src).arg("-o").arg(&plain))?;
    util::run(
        cmd(crate::rewriter_bin())
            .arg(&plain)
            .arg("-o")
            .arg(&traced)
            .args(rewrite),
    )?;
    Ok((dir, traced))
}
