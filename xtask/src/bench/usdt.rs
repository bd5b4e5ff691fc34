//! The events section's USDT rows: the same probe through the inline stub, our uprobe
//! fallback and bpftrace.

use std::path::Path;

use super::Args;
use super::measure::{best, measure};
use super::table::Row;
use crate::util::{self, cmd};

/// USDT: the same probe through the inline stub, our uprobe fallback (eBPF `site`
/// program) and bpftrace's `usdt:` probe (when bpftrace is installed).
pub(super) fn usdt_rows(dir: &Path, src: &Path, args: &Args, rows: &mut Vec<Row>) {
    let runs = args.runs.max(1);
    let plain = dir.join("bench-usdt");
    let built = util::run(
        cmd("gcc")
            .args(["-O2", "-DUSDT"])
            .arg(src)
            .arg("-o")
            .arg(&plain),
    )
    .map_err(|e| format!("gcc -DUSDT failed: {e:#}"));
    let rewrite = |out: &Path, extra: &[&str]| {
        built.clone().and_then(|()| {
            util::run(
                cmd(crate::rewriter_bin())
                    .arg(&plain)
                    .arg("-o")
                    .arg(out)
                    .args(["--sites", "usdt"])
                    .args(extra),
            )
            .map_err(|e| format!("rewriter failed: {e:#}"))
        })
    };
    let n = args.iterations;
    rows.push(Row {
        name: "usdt: untraced (nop)",
        iterations: n,
        ns: built
            .clone()
            .and_then(|()| best(runs, || measure(cmd(&plain).arg(n.to_string())))),
    });
    let inline = dir.join("bench-usdt.inline");
    rows.push(Row {
        name: "usdt: inline stub",
        iterations: n,
        ns: rewrite(&inline, &[])
            .and_then(|()| best(runs, || measure(cmd(&inline).arg(n.to_string())))),
    });
    let nu = args.uprobe_iterations;
    let uprobed = dir.join("bench-usdt.uprobe");
    let trace_file = dir.join("bench-usdt.utrace");
    rows.push(Row {
        name: "usdt: uprobe + eBPF (ours)",
        iterations: nu,
        ns: rewrite(&uprobed, &["--force-uprobe"]).and_then(|()| {
            best(runs, || {
                let r = measure(
                    cmd(crate::tracer_bin())
                        .arg("record")
                        .arg("-o")
                        .arg(&trace_file)
                        .arg("--")
                        .arg(&uprobed)
                        .arg(nu.to_string()),
                );
                let _ = std::fs::remove_file(&trace_file);
                r
            })
        }),
    });
    let bpftrace = util::which("bpftrace")
        .ok_or_else(|| "bpftrace not installed (apt-get install bpftrace)".to_string());
    rows.push(Row {
        name: "usdt: bpftrace usdt probe",
        iterations: nu,
        ns: built.and(bpftrace).and_then(|bt| {
            best(runs, || {
                let prog = format!("usdt:{}:bench:hit {{ @c = count(); }}", plain.display());
                measure(
                    cmd(&bt)
                        .arg("-e")
                        .arg(&prog)
                        .arg("-c")
                        .arg(format!("{} {nu}", plain.display())),
                )
            })
        }),
    });
}
