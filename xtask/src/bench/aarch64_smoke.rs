//! The events section's AArch64 smoke test under qemu-user (correctness only).

use std::path::Path;

use anyhow::Result;

use crate::util::{self, cmd};

/// AArch64 under qemu-user, as a correctness smoke only (qemu timings mean nothing):
/// the bench fixture cross-built, rewritten, traced with the user-space drain; every
/// call of hit() must be in the trace.
pub(super) fn aarch64_smoke(dir: &Path, src: &Path) -> Result<()> {
    let n: u64 = 100_000;
    let plain = dir.join("bench-a64");
    let traced = dir.join("bench-a64.traced");
    let trace = dir.join("bench-a64.utrace");
    util::run(
        cmd("aarch64-linux-gnu-gcc")
            .arg("-O2")
            .arg(src)
            .arg("-o")
            .arg(&plain),
    )?;
    util::run(
        cmd(crate::rewriter_bin())
            .arg(&plain)
            .arg("-o")
            .arg(&traced),
    )?;
    util::run(
        cmd(crate::tracer_bin())
            .args(["record", "--user", "--binary"])
            .arg(&traced)
            .arg("-o")
            .arg(&trace)
            .args(["--", "qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])
            .arg(&traced)
            .arg(n.to_string()),
    )?;
    let out = util::output(
        cmd(crate::tracer_bin())
            .arg("report")
            .arg("--json")
            .arg(&trace),
    )?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    // The warm-up adds 4096 calls (bench.c).
    let want = n + 4096;
    let count = json["functions"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["symbol"] == "hit"))
        .and_then(|f| f["count"].as_u64());
    match count {
        Some(c) if c == want => {
            println!("aarch64 (qemu-user, smoke): {c} records of hit, as expected");
            Ok(())
        }
        other => anyhow::bail!("aarch64 smoke: expected {want} records of hit, got {other:?}"),
    }
}
