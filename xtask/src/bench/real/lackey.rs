//! valgrind's lackey (`--tool=lackey --trace-mem=yes`) on the untraced sqlite3, its log
//! piped into a counter (never stored: ~30 M lines a thousand rows): the guest
//! instructions and the data accesses (` L`/` S`/` M` lines) of instructions in the
//! binary's own code, which is what utrace's memory sites see. The load bias comes from
//! `LD_SHOW_AUXV=1`: the last `AT_ENTRY` (the first ones are valgrind's launcher's)
//! minus the ELF entry point.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use object::{Object, ObjectSegment};

use crate::util::{self, cmd};

/// What one lackey run counted.
pub(super) struct Counted {
    pub wall_s: f64,
    /// Data lines of instructions in the binary's executable segments.
    pub accesses: u64,
    /// `I` lines in those segments.
    pub instructions: u64,
    /// The program's stdout.
    pub stdout: String,
}

/// The link-time entry point and the executable segments' range of an ELF file.
fn entry_and_code(bin: &Path) -> Result<(u64, (u64, u64))> {
    let data = std::fs::read(bin).with_context(|| bin.display().to_string())?;
    let file = object::File::parse(&*data).context("ELF")?;
    let mut range = (u64::MAX, 0);
    for s in file.segments() {
        if let object::SegmentFlags::Elf { p_flags } = s.flags()
            && p_flags & object::elf::PF_X != 0
        {
            range = (
                range.0.min(s.address()),
                range.1.max(s.address() + s.size()),
            );
        }
    }
    Ok((file.entry(), range))
}

/// The load bias of `bin` under lackey.
fn bias(bin: &Path) -> Result<u64> {
    let out = util::output(
        cmd("valgrind")
            .arg("--tool=lackey")
            .arg(bin)
            .env("LD_SHOW_AUXV", "1"),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    let entry = text
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("AT_ENTRY:"))
        .find_map(|v| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
        .with_context(|| format!("no AT_ENTRY from LD_SHOW_AUXV: {text}"))?;
    Ok(entry - entry_and_code(bin)?.0)
}

/// Counts lackey's lines of instructions in `code` (run-time addresses).
struct Counter {
    code: (u64, u64),
    inside: bool,
    accesses: u64,
    instructions: u64,
}

impl Counter {
    fn line(&mut self, l: &[u8]) {
        let hex = |s: &[u8]| {
            let end = s.iter().position(|&c| c == b',')?;
            u64::from_str_radix(std::str::from_utf8(&s[..end]).ok()?.trim(), 16).ok()
        };
        if let Some(rest) = l.strip_prefix(b"I  ") {
            self.inside = hex(rest).is_some_and(|a| a >= self.code.0 && a < self.code.1);
            self.instructions += u64::from(self.inside);
        } else if self.inside && l.len() > 3 && l[0] == b' ' && matches!(l[1], b'L' | b'S' | b'M') {
            self.accesses += 1;
        }
    }
}

/// `valgrind --tool=lackey --trace-mem=yes BIN ARGS`, the program's stdout to
/// `dir/lackey.out`, lackey's log counted from a pipe.
pub(super) fn run(dir: &Path, bin: &Path, args: &[&str]) -> Result<Counted> {
    let b = bias(bin)?;
    let (_, code) = entry_and_code(bin)?;
    let out = dir.join("lackey.out");
    let mut c = cmd("sh");
    c.arg("-c")
        .arg("exec 3>&1 1>\"$0\"; exec valgrind --tool=lackey --trace-mem=yes --log-fd=3 \"$@\"")
        .arg(&out)
        .arg(bin)
        .args(args);
    util::announce(&c);
    let t0 = Instant::now();
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run valgrind")?;
    let mut counter = Counter {
        code: (code.0 + b, code.1 + b),
        inside: false,
        accesses: 0,
        instructions: 0,
    };
    let mut r = BufReader::with_capacity(1 << 20, child.stdout.take().context("stdout")?);
    let mut line = Vec::new();
    while r.read_until(b'\n', &mut line)? > 0 {
        counter.line(&line);
        line.clear();
    }
    let st = child.wait()?;
    let wall_s = t0.elapsed().as_secs_f64();
    if !st.success() {
        bail!("lackey failed ({})", util::describe(st));
    }
    Ok(Counted {
        wall_s,
        accesses: counter.accesses,
        instructions: counter.instructions,
        stdout: std::fs::read_to_string(&out).context("lackey.out")?,
    })
}
