//! One measured run of a command: wall time, the CPU time of the process itself (its
//! threads, sampled from `/proc/PID/stat` while it runs, so a tracer's own work is told
//! apart from the program it runs) and of everything it waited for (its own `wait4`
//! rusage, not other children's), peak RSS, its output.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::util;

pub(super) struct Run {
    pub wall_s: f64,
    /// CPU of the process itself (a tracer: its own threads, not the traced program).
    pub own_cpu_s: f64,
    /// CPU of the process and the children it waited for.
    pub all_cpu_s: f64,
    /// Peak resident set of the process (or its largest waited-for child), KiB.
    pub max_rss_kib: u64,
    pub stdout: String,
    pub stderr: String,
}

/// How often the process's own CPU time is read while it runs.
const SAMPLE: Duration = Duration::from_millis(20);

/// Run `c` to completion (a non-zero exit is an error) and measure it.
pub(super) fn measured(c: &mut Command) -> Result<Run> {
    util::announce(c);
    let t0 = Instant::now();
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", util::show(c)))?;
    let pid = child.id() as i32;
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let so = std::thread::spawn(move || read_all(&mut out));
    let se = std::thread::spawn(move || read_all(&mut err));
    let mut own_cpu_s = 0.0;
    let (status, ru) = loop {
        own_cpu_s = own_cpu(pid).unwrap_or(own_cpu_s);
        if let Some(done) = reap(pid)? {
            break done;
        }
        std::thread::sleep(SAMPLE);
    };
    let wall_s = t0.elapsed().as_secs_f64();
    let stdout = so.join().unwrap_or_default();
    let stderr = se.join().unwrap_or_default();
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!(
            "{} failed (wait status {status:#x}): {stderr}",
            util::show(c)
        );
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Run {
        wall_s,
        own_cpu_s,
        all_cpu_s: secs(ru.ru_utime) + secs(ru.ru_stime),
        max_rss_kib: ru.ru_maxrss as u64,
        stdout,
        stderr,
    })
}

fn read_all(r: &mut impl Read) -> String {
    let mut b = Vec::new();
    let _ = r.read_to_end(&mut b);
    String::from_utf8_lossy(&b).into_owned()
}

/// The wait status and rusage of `pid` once it has exited.
fn reap(pid: i32) -> Result<Option<(i32, libc::rusage)>> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter for wait4.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child without blocking; status and ru are writable.
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
    match r {
        0 => Ok(None),
        r if r == pid => Ok(Some((status, ru))),
        _ => bail!("wait4({pid}): {}", std::io::Error::last_os_error()),
    }
}

/// utime + stime of `pid`'s own threads, seconds (`/proc/PID/stat` fields 14 and 15).
pub(super) fn own_cpu(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}
