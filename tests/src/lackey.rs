//! An independent oracle of memory sites: valgrind's lackey (`--tool=lackey
//! --trace-mem=yes`) on the ORIGINAL binary. Lackey prints `I  <hex>,<len>` for every
//! guest instruction executed, then ` L`/` S`/` M <hex>,<size>` for its data accesses.
//! A memory site's count is the number of `I` lines at its address plus lackey's load
//! bias (executions, not data lines: immune to VEX splits and implicit accesses).
//!
//! The bias: valgrind loads a PIE at a fixed address; `LD_SHOW_AUXV=1` makes the
//! program's loader print its auxiliary vector, whose last `AT_ENTRY` (the first ones
//! come from valgrind's own launcher) minus the ELF entry point is the bias.
//!
//! Lackey's output is parsed as it streams from a pipe, never stored (a few seconds of
//! sqlite is ~10 M lines).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use object::{Object, ObjectSegment};

use crate::command::{Out, run, run_streaming};

/// Timeout of a lackey run.
pub const LACKEY_TIMEOUT: Duration = Duration::from_secs(600);

/// Whether valgrind runs; if not, the test fails unless the run allows it to skip.
pub fn have_valgrind(what: &str) -> bool {
    crate::skip::require("valgrind", crate::skip::runs("valgrind"), what)
}

/// The link-time entry point and the end of the highest loaded segment of an ELF file.
pub fn entry_and_image_end(path: &Path) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let end = file
        .segments()
        .map(|s| s.address() + s.size())
        .max()
        .unwrap_or(0);
    (file.entry(), end)
}

/// The load bias lackey runs `prog` at (see the module doc).
pub fn lackey_bias(prog: &Path) -> u64 {
    let mut c = Command::new("valgrind");
    c.arg("--tool=lackey").arg(prog).env("LD_SHOW_AUXV", "1");
    let out = run(&mut c, LACKEY_TIMEOUT);
    let entry = out
        .stdout_str()
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("AT_ENTRY:"))
        .find_map(|v| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| panic!("no AT_ENTRY from LD_SHOW_AUXV: {}", out.describe()));
    entry - entry_and_image_end(prog).0
}

/// What lackey saw of the watched instructions.
#[derive(Debug, Default)]
pub struct LackeyTrace {
    /// Executions per watched link-time address.
    pub executions: HashMap<u64, u64>,
    /// Per address of `data_of`: the multiset (address - bias -> times) of the data
    /// addresses inside the image, each counted once an execution.
    pub data: HashMap<u64, HashMap<u64, u64>>,
    /// Every `I` line (guest instructions executed, all of the process).
    pub instructions: u64,
    /// Every ` L`/` S`/` M` line.
    pub data_lines: u64,
    /// Data lines of executions of watched instructions.
    pub watched_data_lines: u64,
    /// The program's own stdout (lackey's log goes to the pipe instead).
    pub program: Out,
}

/// Where lackey's parser is: the watched instruction whose data lines follow.
struct Parser<'a> {
    bias: u64,
    image: (u64, u64),
    watch: &'a HashMap<u64, bool>,
    current: Option<(u64, bool)>,
    seen: Vec<u64>,
    t: LackeyTrace,
}

fn hex_before_comma(s: &[u8]) -> Option<u64> {
    let s = &s[..s.iter().position(|&c| c == b',')?];
    let s = std::str::from_utf8(s).ok()?;
    u64::from_str_radix(s.trim(), 16).ok()
}

impl Parser<'_> {
    fn line(&mut self, l: &[u8]) {
        if let Some(rest) = l.strip_prefix(b"I  ") {
            self.t.instructions += 1;
            self.current = None;
            let Some(addr) = hex_before_comma(rest).and_then(|a| a.checked_sub(self.bias)) else {
                return;
            };
            if let Some(&data) = self.watch.get(&addr) {
                *self.t.executions.entry(addr).or_default() += 1;
                self.current = Some((addr, data));
                self.seen.clear();
            }
        } else if l.len() > 3 && l[0] == b' ' && matches!(l[1], b'L' | b'S' | b'M') {
            self.t.data_lines += 1;
            let Some((site, data)) = self.current else {
                return;
            };
            self.t.watched_data_lines += 1;
            let Some(a) = hex_before_comma(&l[3..]).and_then(|a| a.checked_sub(self.bias)) else {
                return;
            };
            if data && a >= self.image.0 && a < self.image.1 && !self.seen.contains(&a) {
                self.seen.push(a);
                *self.t.data.entry(site).or_default().entry(a).or_default() += 1;
            }
        }
    }
}

/// Run `prog args` (stdin closed) under lackey with `bias` from [`lackey_bias`]; count
/// the executions of every address of `watch` (link-time addresses), and for those whose
/// value is true the in-image data addresses of each execution.
pub fn lackey_trace(
    prog: &Path,
    args: &[&str],
    bias: u64,
    watch: &HashMap<u64, bool>,
) -> LackeyTrace {
    let (_, end) = entry_and_image_end(prog);
    // The program's stdout goes to stderr (captured), lackey's log to the stdout pipe.
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("exec 3>&1 1>&2; exec valgrind --tool=lackey --trace-mem=yes --log-fd=3 \"$@\"")
        .arg("sh")
        .arg(prog)
        .args(args);
    let mut p = Parser {
        bias,
        image: (0, end),
        watch,
        current: None,
        seen: Vec::new(),
        t: LackeyTrace::default(),
    };
    let out = run_streaming(&mut c, LACKEY_TIMEOUT, |l| p.line(l));
    let mut t = p.t;
    t.program = out;
    t
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn lackey_lines() {
        let watch: HashMap<u64, bool> = [(0x1000, true), (0x1010, false)].into();
        let mut p = Parser {
            bias: 0x108000,
            image: (0, 0x5000),
            watch: &watch,
            current: None,
            seen: Vec::new(),
            t: LackeyTrace::default(),
        };
        for l in [
            "==1== Lackey",
            "I  00109000,7",
            " L 0010c000,8",
            " S 1ffefff000,8",
            " M 0010c000,8",
            "I  00109010,3",
            " L 0010c008,4",
            "I  00109000,7",
            " S 0010c010,8",
            "I  00109020,2",
            " L 0010c000,8",
        ] {
            p.line(l.as_bytes());
        }
        let t = p.t;
        assert_eq!(t.instructions, 4);
        assert_eq!(t.data_lines, 6);
        assert_eq!(t.watched_data_lines, 5);
        assert_eq!(t.executions, [(0x1000, 2), (0x1010, 1)].into());
        assert_eq!(t.data.len(), 1);
        assert_eq!(t.data[&0x1000], [(0x4000, 1), (0x4010, 1)].into());
    }
}
