//! The independent oracle for entry counts: kernel uprobe events (tracefs, a private
//! ftrace instance) on the ORIGINAL binaries' functions, counted from the trace text.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

const TRACING: &str = "/sys/kernel/tracing";
/// Per CPU: room for ~8 M events, more than any batch's originals make.
const BUFFER_KB: &str = "262144";

/// A function entry to count.
pub(super) struct Probe {
    pub binary: PathBuf,
    pub function: String,
    pub offset: u64,
}

/// Entries per (binary, function) while `run` runs; none when the kernel's buffer
/// overflowed (then nothing can be said about counts).
pub(super) fn count_entries(
    probes: &[Probe],
    run: impl FnOnce() -> Result<()>,
) -> Result<Option<HashMap<(PathBuf, String), u64>>> {
    let root = Path::new(TRACING);
    if !root.join("uprobe_events").exists() {
        bail!("tracefs is not mounted at {TRACING} (cargo xtask setup mounts it)");
    }
    let group = format!("utdiff{}", std::process::id());
    let session = Session {
        group: group.clone(),
        events: probes.len(),
        instance: root.join("instances").join(&group),
    };
    let mut defs = String::new();
    for (i, p) in probes.iter().enumerate() {
        defs.push_str(&format!(
            "p:{group}/e{i} {}:0x{:x}\n",
            p.binary.display(),
            p.offset
        ));
    }
    append(&root.join("uprobe_events"), &defs)?;
    std::fs::create_dir(&session.instance)
        .with_context(|| format!("cannot create {}", session.instance.display()))?;
    write(&session.instance.join("buffer_size_kb"), BUFFER_KB)?;
    let enable = session.instance.join("events").join(&group).join("enable");
    write(&enable, "1")?;
    let ran = run();
    write(&enable, "0")?;
    ran?;
    if lost(&session.instance)? {
        return Ok(None);
    }
    let text = std::fs::read_to_string(session.instance.join("trace"))?;
    let mut counts = vec![0u64; probes.len()];
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some(c) = event_index(line).and_then(|i| counts.get_mut(i)) {
            *c += 1;
        }
    }
    Ok(Some(
        probes
            .iter()
            .zip(counts)
            .map(|(p, n)| ((p.binary.clone(), p.function.clone()), n))
            .collect(),
    ))
}

/// `eN` of a trace line `task-pid [cpu] flags time: eN: (address)`.
fn event_index(line: &str) -> Option<usize> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix('e')?.strip_suffix(':')?.parse().ok())
}

/// Whether any CPU's buffer overwrote or dropped events.
fn lost(instance: &Path) -> Result<bool> {
    for cpu in std::fs::read_dir(instance.join("per_cpu"))? {
        let stats = std::fs::read_to_string(cpu?.path().join("stats"))?;
        for l in stats.lines() {
            if let Some((k, v)) = l.split_once(':') {
                let bad = matches!(k.trim(), "overrun" | "commit overrun" | "dropped events");
                if bad && v.trim().parse::<u64>().unwrap_or(0) > 0 {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// The probes and their instance, removed however the run ended.
struct Session {
    group: String,
    events: usize,
    instance: PathBuf,
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.instance);
        let root = Path::new(TRACING);
        let undo: String = (0..self.events)
            .map(|i| format!("-:{}/e{i}\n", self.group))
            .collect();
        let _ = append(&root.join("uprobe_events"), &undo);
    }
}

fn write(path: &Path, s: &str) -> Result<()> {
    std::fs::write(path, s).with_context(|| format!("cannot write {s:?} to {}", path.display()))
}

fn append(path: &Path, s: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // tracefs takes one definition per write.
    for line in s.lines() {
        f.write_all(format!("{line}\n").as_bytes())
            .with_context(|| format!("cannot write {line:?} to {}", path.display()))?;
    }
    Ok(())
}
