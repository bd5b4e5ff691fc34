//! Running commands: capture stdout/stderr with a process-group timeout, and describe
//! a finished command in a failure message.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Default timeout of a fixture run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// What a finished command did.
#[derive(Debug, Clone, Default)]
pub struct Out {
    pub cmdline: String,
    /// Exit code, or None when killed by a signal.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Out {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// Exit status as one comparable value: the code, or 128 + signal.
    pub fn status(&self) -> i32 {
        self.code.unwrap_or(128 + self.signal.unwrap_or(0))
    }
    /// Panic (with the command's output) unless it exited with code 0.
    pub fn ok(self) -> Out {
        if !self.success() {
            panic!("command failed: {}", self.describe());
        }
        self
    }
    pub fn describe(&self) -> String {
        format!(
            "{}\n  status: {}\n  stdout: {}\n  stderr: {}",
            self.cmdline,
            match (self.code, self.signal) {
                (Some(c), _) => format!("exit code {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                _ => "?".into(),
            },
            tail(&self.stdout_str(), 2000),
            tail(&self.stderr_str(), 4000)
        )
    }
}

fn tail(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut i = s.len() - n;
        while !s.is_char_boundary(i) {
            i += 1;
        }
        format!("...{}", &s[i..])
    }
}

pub fn cmdline(c: &Command) -> String {
    let mut s = String::new();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&c.get_program().to_string_lossy());
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run with stdin closed, capturing stdout and stderr. The command gets its own process
/// group; after `timeout` that group (the command and what it started, e.g. the program
/// under `tracer record`) is killed and the test panics.
pub fn run(c: &mut Command, timeout: Duration) -> Out {
    let mut stdout = Vec::new();
    let mut out = run_streaming(c, timeout, |line| stdout.extend_from_slice(line));
    out.stdout = stdout;
    out
}

/// Start `c` in its own process group (a timeout kills the whole group), stdin closed,
/// stdout and stderr piped.
pub fn spawn_piped(c: &mut Command) -> Child {
    use std::os::unix::process::CommandExt;
    let line = cmdline(c);
    c.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {line}: {e}"))
}

/// Like [`run`], but hands stdout to `on_line` line by line (each with its '\n')
/// instead of storing it.
pub fn run_streaming(
    c: &mut Command,
    timeout: Duration,
    mut on_line: impl FnMut(&[u8]) + Send,
) -> Out {
    let line = cmdline(c);
    let mut child = spawn_piped(c);
    let pid = child.id();
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (stderr, status) = std::thread::scope(|s| {
        let err = s.spawn(move || {
            let mut v = Vec::new();
            let _ = se.read_to_end(&mut v);
            v
        });
        let watchdog = s.spawn(|| {
            let start = Instant::now();
            while !done.load(Ordering::Relaxed) {
                if start.elapsed() > timeout {
                    // Only the process group of the child we started.
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        });
        let mut r = BufReader::with_capacity(1 << 20, &mut so);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => on_line(&buf),
            }
        }
        let status = child.wait().expect("wait");
        done.store(true, Ordering::Relaxed);
        let timed_out = watchdog.join().unwrap();
        let stderr = err.join().unwrap();
        if timed_out {
            panic!(
                "timed out after {timeout:?}: {line}\n  stderr: {}",
                tail(&String::from_utf8_lossy(&stderr), 4000)
            );
        }
        (stderr, status)
    });
    use std::os::unix::process::ExitStatusExt;
    Out {
        cmdline: line,
        code: status.code(),
        signal: status.signal(),
        stdout: Vec::new(),
        stderr,
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn timeout_kills_the_whole_group() {
        let start = Instant::now();
        // The background sleep keeps stdout open: only killing the group ends the read.
        let r = std::panic::catch_unwind(|| {
            run(
                Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
                Duration::from_millis(300),
            )
        });
        let msg = r.expect_err("must time out");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("timed out"), "{msg}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        let o = run(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 7"]),
            RUN_TIMEOUT,
        );
        assert_eq!(
            (o.stdout_str().as_str(), o.stderr_str().as_str(), o.status()),
            ("out\n", "err\n", 7)
        );
    }
}
