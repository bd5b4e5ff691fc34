//! An independent oracle for what a fixture build executes: kernel uprobe events
//! (tracefs `uprobe_events`, a private ftrace instance) on the ORIGINAL binary, recording
//! tid, first argument and return address of every entry of the probed functions.
//!
//! The tests use it to confirm their expected record sequences against the compiled
//! fixture (compiler, flags) before comparing the rewritten binary's trace with them, so
//! that a failure says whether the fixture or the rewriter/tracer is wrong.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::command::{Out, run};
use crate::rewriter::function_symbol;
use crate::tracer::tracing_lock;

const TRACING: &str = "/sys/kernel/tracing";

/// One function entry seen by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub tid: u32,
    pub symbol: String,
    pub value: u64,
    pub aux: u64,
}

struct Session {
    group: String,
    events: Vec<String>,
    instance: PathBuf,
}

fn write_file(path: &Path, s: &str, append: bool) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)?;
    f.write_all(s.as_bytes())
}

fn ensure_tracefs() {
    if !Path::new(TRACING).join("uprobe_events").exists() {
        let _ = Command::new("mount")
            .args(["-t", "tracefs", "nodev", TRACING])
            .status();
    }
    assert!(
        Path::new(TRACING).join("uprobe_events").exists(),
        "tracefs is not available at {TRACING} (the tests need root)"
    );
}

impl Drop for Session {
    fn drop(&mut self) {
        let root = Path::new(TRACING);
        let _ = write_file(
            &self
                .instance
                .join("events")
                .join(&self.group)
                .join("enable"),
            "0",
            false,
        );
        let _ = std::fs::remove_dir(&self.instance);
        for e in &self.events {
            let _ = write_file(
                &root.join("uprobe_events"),
                &format!("-:{}/{}\n", self.group, e),
                true,
            );
        }
    }
}

/// Run `cmd` with uprobes on `probes` (binary, function symbol); return its output and
/// the entries, in time order.
pub fn run_with_probes(
    probes: &[(&Path, &str)],
    cmd: &mut Command,
    timeout: Duration,
) -> (Out, Vec<Event>) {
    let at: Vec<(&Path, String, u64)> = probes
        .iter()
        .map(|(bin, sym)| {
            let f = function_symbol(bin, sym);
            let off = f
                .file_off
                .unwrap_or_else(|| panic!("{sym} in {} is not in a loaded segment", bin.display()));
            (*bin, sym.to_string(), off)
        })
        .collect();
    run_with_probes_at(&at, cmd, timeout)
}

/// Like [`run_with_probes`], for probes at file offsets (e.g. basic blocks); each
/// event's `symbol` is the probe's label.
pub fn run_with_probes_at(
    probes: &[(&Path, String, u64)],
    cmd: &mut Command,
    timeout: Duration,
) -> (Out, Vec<Event>) {
    static N: AtomicU32 = AtomicU32::new(0);
    let _g = tracing_lock();
    ensure_tracefs();
    let root = Path::new(TRACING);
    let group = format!(
        "utt{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let mut s = Session {
        group: group.clone(),
        events: Vec::new(),
        instance: root.join("instances").join(&group),
    };
    let mut names = Vec::new();
    for (i, (bin, sym, off)) in probes.iter().enumerate() {
        let ev = format!("e{i}");
        let def = format!(
            "p:{group}/{ev} {}:0x{off:x} value=%di:u64 aux=+0(%sp):u64\n",
            bin.display()
        );
        write_file(&root.join("uprobe_events"), &def, true)
            .unwrap_or_else(|e| panic!("cannot add uprobe event {def:?}: {e}"));
        s.events.push(ev.clone());
        names.push((format!(" {ev}: "), sym.to_string()));
    }
    std::fs::create_dir(&s.instance)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", s.instance.display()));
    let _ = write_file(&s.instance.join("buffer_size_kb"), "8192", false);
    write_file(
        &s.instance.join("events").join(&group).join("enable"),
        "1",
        false,
    )
    .expect("enable uprobe events");
    let out = run(cmd, timeout);
    write_file(
        &s.instance.join("events").join(&group).join("enable"),
        "0",
        false,
    )
    .expect("disable uprobe events");
    let text = std::fs::read_to_string(s.instance.join("trace")).expect("read trace");
    drop(s);
    let mut events = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        assert!(
            !line.contains("LOST"),
            "the oracle's ftrace buffer lost events: {line}"
        );
        let Some((tag, sym)) = names.iter().find(|(tag, _)| line.contains(tag.as_str())) else {
            panic!("unexpected ftrace line: {line}")
        };
        let head = &line[..line.find(tag.as_str()).unwrap()];
        let task = &head[..head
            .find(" [")
            .unwrap_or_else(|| panic!("no cpu field in {line}"))];
        let tid = task
            .trim()
            .rsplit_once('-')
            .and_then(|(_, t)| t.parse().ok())
            .unwrap_or_else(|| panic!("no tid in {line}"));
        let field = |k: &str| -> u64 {
            let i = line.find(k).unwrap_or_else(|| panic!("no {k} in {line}")) + k.len();
            line[i..]
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("bad {k} in {line}"))
        };
        events.push(Event {
            tid,
            symbol: sym.clone(),
            value: field(" value="),
            aux: field(" aux="),
        });
    }
    (out, events)
}

/// `function`'s exits in `bin`, decoded by `objdump` (independent of the rewriter's
/// decoder): the link-time addresses of its returns and of its jumps to the start of
/// another function or PLT entry (tail calls), in it and in its split-off `.cold` part.
/// Jumps between the function and its part, or within either, are not exits.
pub fn exit_addresses(objdump: &str, bin: &Path, function: &str) -> Vec<u64> {
    let cold = format!("{function}.cold");
    let mut out = Vec::new();
    for sym in [function, cold.as_str()] {
        let o = run(
            Command::new(objdump)
                .args(["-d", "--no-show-raw-insn"])
                .arg(format!("--disassemble={sym}"))
                .arg(bin),
            Duration::from_secs(60),
        )
        .ok();
        for line in o.stdout_str().lines() {
            let Some((addr, insn)) = line.trim_start().split_once(":\t") else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            let mut words = insn.split_whitespace();
            let Some(mnemonic) = words.next() else {
                continue;
            };
            let mnemonic = match mnemonic {
                "repz" | "bnd" | "notrack" => words.next().unwrap_or(""),
                m => m,
            };
            let target = insn
                .rsplit_once('<')
                .and_then(|(_, t)| t.strip_suffix('>'))
                .filter(|t| !t.contains("+0x"));
            let leaves = match mnemonic {
                "ret" | "retq" | "retaa" | "retab" => true,
                "jmp" | "b" => target.is_some_and(|t| t != function && t != cold),
                _ => false,
            };
            if leaves {
                out.push(addr);
            }
        }
    }
    assert!(!out.is_empty(), "objdump found no exit of {function}");
    out
}
