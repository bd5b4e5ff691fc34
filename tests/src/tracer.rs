//! The tracer: `tracer record` sessions (native and under qemu-aarch64), serialised
//! within a test binary.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::command::{Out, run};
use crate::paths::tracer_bin;

/// Timeout of a `tracer record` session or a `tracer dump`.
pub const TRACE_TIMEOUT: Duration = Duration::from_secs(300);

static TRACER_LOCK: Mutex<()> = Mutex::new(());

/// Serialises tracing sessions (and oracle runs) inside one test binary: they are
/// timing sensitive and share the machine's 2 cores.
pub fn tracing_lock() -> MutexGuard<'static, ()> {
    TRACER_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `tracer record -o TRACE -- PROG ARGS...` with extra environment for the tracer (and
/// so for PROG).
pub fn tracer_record(trace: &Path, prog: &Path, args: &[&str], env: &[(&str, &OsStr)]) -> Out {
    tracer_record_with(&[], trace, prog, args, env)
}

/// Whether qemu-aarch64 can run; if not, the test fails unless the run allows it to
/// skip (`crate::skip`).
pub fn have_qemu_aarch64(what: &str) -> bool {
    crate::skip::require("qemu-aarch64", crate::skip::runs("qemu-aarch64"), what)
}

/// The arm64 sysroot of Debian's cross toolchain, for qemu-aarch64 `-L`.
pub const A64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// An AArch64 program under qemu-user, no tracer: `qemu-aarch64 -L A64_SYSROOT PROG
/// ARGS`.
pub fn run_qemu_aarch64(prog: &Path, args: &[&str]) -> Out {
    let mut c = Command::new("qemu-aarch64");
    c.arg("-L").arg(A64_SYSROOT).arg(prog).args(args);
    run(&mut c, crate::RUN_TIMEOUT)
}

/// An AArch64 program under qemu-user with the user-space drain: `tracer record --user
/// --binary PROG -o TRACE -- qemu-aarch64 -L A64_SYSROOT PROG ARGS` (binfmt is off, so
/// qemu is named; qemu itself is not instrumented).
pub fn tracer_record_qemu(trace: &Path, prog: &Path, args: &[&str]) -> Out {
    let p = prog.to_str().expect("UTF-8 temp path");
    let mut qargs = vec!["-L", A64_SYSROOT, p];
    qargs.extend(args);
    tracer_record_with(
        &["--user", "--binary", p],
        trace,
        Path::new("qemu-aarch64"),
        &qargs,
        &[],
    )
}

/// The command `tracer record FLAGS -o TRACE -- PROG` (arguments to add), its debug
/// information cached in [`scratch_debug_cache`], not root's cache.
pub fn record_command(flags: &[&str], trace: &Path, prog: &Path) -> Command {
    let mut c = Command::new(tracer_bin());
    c.arg("record")
        .args(flags)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(prog)
        .env("UTRACE_DEBUG_CACHE", scratch_debug_cache());
    c
}

/// `tracer record FLAGS -o TRACE -- PROG ARGS` (e.g. FLAGS = ["--user"]).
pub fn tracer_record_with(
    flags: &[&str],
    trace: &Path,
    prog: &Path,
    args: &[&str],
    env: &[(&str, &OsStr)],
) -> Out {
    let _g = tracing_lock();
    let mut c = record_command(flags, trace, prog);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(&mut c, TRACE_TIMEOUT);
    assert!(
        trace.is_file(),
        "tracer record wrote no trace file {}: {}",
        trace.display(),
        out.describe()
    );
    out
}

/// A running `tracer record` with extra flags (a system-wide one, say); ready once its
/// control socket exists. The caller holds [`tracing_lock`].
pub fn start_session(flags: &[&str], trace: &Path) -> Child {
    let child = Command::new(tracer_bin())
        .arg("record")
        .args(flags)
        .arg("-o")
        .arg(trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_control_socket(&child);
    child
}

/// Wait until the control socket of session `tracer` (a `tracer record` child) exists:
/// the session is set up (at most 60 s).
pub fn wait_for_control_socket(tracer: &Child) {
    let sock = PathBuf::from(format!("/run/utrace/{}.sock", tracer.id()));
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "session did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `tracer record FLAGS -o TRACE -- TRACED ARGS`, whose output and exit status must be
/// those of `ORIG ARGS` run alone (`what` names the case in messages).
pub fn record_as_original(
    flags: &[&str],
    trace: &Path,
    orig: &Path,
    traced: &Path,
    args: &[&str],
    what: &str,
) -> Out {
    let want = run(Command::new(orig).args(args), crate::command::RUN_TIMEOUT).ok();
    let got = tracer_record_with(flags, trace, traced, args, &[]);
    assert_eq!(
        (got.stdout_str(), got.status()),
        (want.stdout_str(), want.status()),
        "{what}: {}",
        got.describe()
    );
    got
}

/// Wait for a session from [`start_session`]; it must succeed.
pub fn finish_session(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The debug cache of sessions a test starts by hand (outside [`tracer_record`]).
pub fn scratch_debug_cache() -> PathBuf {
    std::env::temp_dir().join("utrace-test-debug-cache")
}

/// A `tracer record --system-wide -o TRACE` session, started and ready (its control
/// socket exists); its stderr goes to `TRACE.err` (a pipe nobody reads while it runs
/// could fill and stop it). A session of another test binary holding the session name
/// is waited out, up to [`crate::RUN_TIMEOUT`]. The caller holds [`tracing_lock`].
pub fn system_wide_session(trace: &Path) -> Child {
    let t0 = Instant::now();
    loop {
        let err = std::fs::File::create(trace.with_extension("err")).unwrap();
        let mut c = Command::new(tracer_bin())
            .args(["record", "--system-wide", "-o"])
            .arg(trace)
            .env("UTRACE_DEBUG_CACHE", scratch_debug_cache())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        let sock = PathBuf::from(format!("/run/utrace/{}.sock", c.id()));
        while !sock.exists() && c.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if sock.exists() {
            return c;
        }
        let err = std::fs::read_to_string(trace.with_extension("err")).unwrap();
        assert!(
            err.contains("cannot listen on the session socket")
                && t0.elapsed() < crate::RUN_TIMEOUT,
            "the session ended before it started: {err}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The writing end of a `UTRACE_TEST_PAUSE` FIFO once the tracer `t` waits at it (it
/// opened the reading end); panics if the tracer ends first. Writing a byte (or
/// dropping it) lets the tracer go on.
pub fn paused(fifo: &Path, t: &mut Child) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let t0 = Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(f) => return f,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
            Err(e) => panic!("{}: {e}", fifo.display()),
        }
        if let Some(st) = t.try_wait().unwrap() {
            let out = t.stderr.take().map(std::io::read_to_string);
            panic!("the tracer ended before its pause ({st}): {out:?}");
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no pause");
        std::thread::sleep(Duration::from_millis(10));
    }
}
