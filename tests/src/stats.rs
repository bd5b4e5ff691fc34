//! Trace-file stats (read without tracer code) and the kernel BPF objects a process holds.

use std::io::Read;
use std::path::Path;
use std::process::Command;

use crate::command::{RUN_TIMEOUT, run};

/// The JSON of the stats section (`FinalStats`, tracer-user/src/tracefile/) of a trace
/// file, or None when it has none (the recording did not finish). Walks the sections by
/// their length prefixes, so it needs no tracer code.
pub fn trace_stats(trace: &Path) -> Option<serde_json::Value> {
    use std::io::{Seek, SeekFrom};
    const SECTION_STATS: u32 = 4;
    let mut f = std::fs::File::open(trace)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", trace.display()));
    let mut header = [0u8; 16];
    f.read_exact(&mut header)
        .unwrap_or_else(|e| panic!("{}: no file header: {e}", trace.display()));
    assert_eq!(&header[..8], b"UTRCTRAC", "{}: magic", trace.display());
    let mut stats = None;
    loop {
        let mut h = [0u8; 16];
        if f.read_exact(&mut h).is_err() {
            return stats;
        }
        let kind = u32::from_le_bytes(h[..4].try_into().unwrap());
        let len = u64::from_le_bytes(h[8..].try_into().unwrap());
        if kind == SECTION_STATS {
            let mut payload = vec![0u8; len as usize];
            if f.read_exact(&mut payload).is_err() {
                return stats;
            }
            stats =
                Some(serde_json::from_slice(&payload).unwrap_or_else(|e| {
                    panic!("{}: stats section is not JSON: {e}", trace.display())
                }));
        } else {
            f.seek(SeekFrom::Current(len as i64)).unwrap();
        }
    }
}

/// The file header's flags word (bytes 12..16; bit 0: the session writing the file had
/// not finished), read from the bytes.
pub fn trace_header_flags(trace: &Path) -> u32 {
    let mut header = [0u8; 16];
    std::fs::File::open(trace)
        .and_then(|mut f| f.read_exact(&mut header))
        .unwrap_or_else(|e| panic!("{}: no file header: {e}", trace.display()));
    assert_eq!(&header[..8], b"UTRCTRAC", "{}: magic", trace.display());
    u32::from_le_bytes(header[12..].try_into().unwrap())
}

/// `bpftool ... --json` (from /usr/sbin when it is not on PATH).
pub fn bpftool_json(args: &[&str]) -> serde_json::Value {
    let prog = if Path::new("/usr/sbin/bpftool").is_file() {
        "/usr/sbin/bpftool"
    } else {
        "bpftool"
    };
    let out = run(Command::new(prog).args(args).arg("--json"), RUN_TIMEOUT).ok();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bpftool output is not JSON ({e}): {}", out.describe()))
}

/// The kernel BPF objects a process holds descriptors of (from /proc/PID/fdinfo: a
/// program's or link's `prog_id`, a link's `link_id`, a map's `map_id`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BpfIds {
    pub progs: std::collections::BTreeSet<u64>,
    pub links: std::collections::BTreeSet<u64>,
    pub maps: std::collections::BTreeSet<u64>,
}

pub fn bpf_ids_of(pid: u32) -> BpfIds {
    let mut ids = BpfIds::default();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for e in dir.flatten() {
        // A descriptor closed meanwhile is simply not listed.
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for line in text.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let Ok(v) = v.trim().parse::<u64>() else {
                continue;
            };
            match k {
                "prog_id" => ids.progs.insert(v),
                "link_id" => ids.links.insert(v),
                "map_id" => ids.maps.insert(v),
                _ => false,
            };
        }
    }
    ids
}
