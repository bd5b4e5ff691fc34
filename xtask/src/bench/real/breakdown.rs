//! `--real-profile`: where each nanosecond of a traced record goes. One more session
//! of a rewritten mode under `perf record -a -e cpu-clock` (this VM has no hardware
//! counters: the sampled clock is what there is), its samples sorted by thread, binary
//! and symbol into the record path's stages and divided by the records the session
//! delivered. The traced program's own work is a stage too: beside the untraced run it
//! shows what the drain costs it in caches.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::util::{self, cmd};

/// Samples per second and CPU: enough for 0.1 ns a record over ~3 s and 200 M records.
const FREQ: &str = "4000";

/// The stages, in the record's order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Program,
    Stubs,
    Trap,
    Ebpf,
    Copy,
    Consumer,
    Packer,
    Writer,
    Session,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Program => "program (its code, libc)",
            Stage::Stubs => "stubs (trampolines, register, flush)",
            Stage::Trap => "flush trap and kernel (uprobe, syscalls)",
            Stage::Ebpf => "eBPF programs and helpers",
            Stage::Copy => "eBPF copy (bpf_probe_read_user)",
            Stage::Consumer => "consumer (ring buffer to sections)",
            Stage::Packer => "packer",
            Stage::Writer => "writer",
            Stage::Session => "session (load, verify, attach, end)",
        }
    }
}

/// Kernel functions that do `bpf_probe_read_user`'s copying.
const COPY: &[&str] = &[
    "copy_from_user_nofault",
    "rep_movs_alternative",
    "copy_user_generic",
    "__pi_memcpy",
];

/// Profile `tracer record` of `traced` (run with `args`) and print the breakdown.
pub(super) fn print(
    dir: &Path,
    tracer: &Path,
    traced: &Path,
    name: &str,
    args: &dyn Fn(&mut std::process::Command),
) -> Result<()> {
    if util::which("perf").is_none() {
        bail!("perf is not installed (cargo xtask setup installs linux-perf)");
    }
    let data = dir.join("profile.data");
    let trace = dir.join("profile.utrace");
    let mut c = cmd("perf");
    c.args(["record", "-q", "-a", "-e", "cpu-clock", "-F", FREQ, "-o"])
        .arg(&data)
        .arg("--")
        .arg(tracer);
    super::record_args(&mut c, dir, &trace, traced, &[]);
    args(&mut c);
    let out = c.output().context("perf record")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (records, _) = super::summary_line(&stderr)?;
    let _ = std::fs::remove_file(&trace);
    let report = util::output_ok(
        cmd("perf")
            .args(["report", "--stdio", "--sort", "comm,dso,sym"])
            .args(["-F", "period,comm,dso,sym", "-t", "|", "-i"])
            .arg(&data),
    )?;
    let _ = std::fs::remove_file(&data);
    let file = traced
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A thread's name is the first 15 bytes of its file's.
    let comm: String = file.chars().take(15).collect();
    let ns = stages(&report, &comm, &file);
    println!();
    println!("per record: {name} ({records} records; perf cpu-clock, {FREQ} Hz, both CPUs)");
    println!("{:<42} {:>10} {:>8}", "stage", "ns/record", "CPU s");
    for (stage, ns) in &ns {
        let per = if *stage == Stage::Session {
            "-".to_string()
        } else {
            format!("{:.2}", ns / records.max(1) as f64)
        };
        println!("{:<42} {per:>10} {:>8.2}", stage.name(), ns / 1e9);
    }
    Ok(())
}

/// Nanoseconds of samples per stage, from `perf report`'s `period|comm|dso|sym` lines;
/// the traced program runs as `comm` from the file `file`.
fn stages(report: &str, program_comm: &str, file: &str) -> BTreeMap<Stage, f64> {
    let mut ns = BTreeMap::new();
    for line in report.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split('|').map(str::trim).collect();
        let [period, comm, dso, sym] = f[..] else {
            continue;
        };
        let Ok(period) = period.parse::<f64>() else {
            continue;
        };
        if let Some(stage) = stage_of((comm, dso, sym), (program_comm, file)) {
            *ns.entry(stage).or_insert(0.0) += period;
        }
    }
    ns
}

/// The stage of a sample of thread `comm` in `dso` at `sym`; `program`: the traced
/// program's (comm, file).
fn stage_of((comm, dso, sym): (&str, &str, &str), program: (&str, &str)) -> Option<Stage> {
    let sym = sym.trim_start_matches("[.] ").trim_start_matches("[k] ");
    Some(match comm {
        "utrace-consumer" if sym.contains("tracefile::pack::") => Stage::Packer,
        "utrace-consumer" => Stage::Consumer,
        "utrace-writer" => Stage::Writer,
        c if c.starts_with("utrace-") || c == "tracer" => Stage::Session,
        c if c == program.0 => match dso {
            // Trampolines and the injected runtime have no symbol.
            d if d == program.1 => {
                if sym.starts_with("0x") {
                    Stage::Stubs
                } else {
                    Stage::Program
                }
            }
            d if d.starts_with("bpf_prog_") => Stage::Ebpf,
            "[kernel.kallsyms]" if COPY.contains(&sym) => Stage::Copy,
            "[kernel.kallsyms]" if sym.contains("bpf") || sym.contains("ringbuf") => Stage::Ebpf,
            "[kernel.kallsyms]" => Stage::Trap,
            _ => Stage::Program,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_go_to_their_stages() {
        let report = "\
# comment
 627500000  |sqlite3.entry-e|[kernel.kallsyms]   |[k] copy_from_user_nofault
 70750000   |sqlite3.entry-e|sqlite3.entry-exit.coarse |[.] sqlite3RunParser
 6250000    |sqlite3.entry-e|sqlite3.entry-exit.coarse |[.] 0x0000000000551ee6
 19000000   |sqlite3.entry-e|bpf_prog_a087_emit_chunk_sleepable|[k] bpf_prog_a087_emit
 17500000   |sqlite3.entry-e|[kernel.kallsyms]   |[k] bpf_probe_read_user
 38500000   |sqlite3.entry-e|[kernel.kallsyms]   |[k] irqentry_exit_to_user_mode
 38250000   |sqlite3.entry-e|libc.so.6           |[.] __memmove_avx512_unaligned_erms
 2720000000 |utrace-consumer|tracer              |[.] tracer_user::tracefile::pack::pack_with
 9000000    |utrace-consumer|tracer              |[.] tracer_user::tracefile::write::encode_chunk
 3000000    |utrace-writer  |libc.so.6           |[.] __memmove_avx512_unaligned_erms
 8000000    |tracer         |[kernel.kallsyms]   |[k] do_check_common
 5000000    |swapper        |[kernel.kallsyms]   |[k] default_idle
";
        let ns = stages(report, "sqlite3.entry-e", "sqlite3.entry-exit.coarse");
        let at = |s| ns.get(&s).copied().unwrap_or(0.0);
        assert_eq!(at(Stage::Copy), 627.5e6);
        assert_eq!(at(Stage::Program), 70.75e6 + 38.25e6);
        assert_eq!(at(Stage::Stubs), 6.25e6);
        assert_eq!(at(Stage::Ebpf), 19e6 + 17.5e6);
        assert_eq!(at(Stage::Trap), 38.5e6);
        assert_eq!(at(Stage::Packer), 2720e6);
        assert_eq!(at(Stage::Consumer), 9e6);
        assert_eq!(at(Stage::Writer), 3e6);
        assert_eq!(at(Stage::Session), 8e6);
        assert_eq!(
            ns.values().sum::<f64>(),
            3_557_750_000.0,
            "swapper left out"
        );
    }
}
