//! The traced process: starting a command held at a gate until the tracer is ready,
//! waiting for it, and waiting for a process we did not start.
//!
//! The gate also places the session's descriptor (`USER_DRAIN_FD`) in the command and reports
//! its exit status.

use std::{
    ffi::{CString, OsStr, OsString},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{Context, Result, bail};

use crate::record::session::credentials::{ChildError, ChildStep, Launch, RunAs};

/// Find `cmd` the way execvp does: as given if it contains a slash, else in $PATH.
pub(crate) fn resolve_command(cmd: &OsStr) -> Result<PathBuf> {
    let is_exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        })
    };
    if cmd.as_bytes().contains(&b'/') {
        let p = PathBuf::from(cmd);
        if !is_exec(&p) {
            bail!("{}: no such executable file", p.display());
        }
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|dir| dir.join(cmd))
        .find(|p| is_exec(p))
        .with_context(|| format!("{}: command not found in PATH", cmd.to_string_lossy()))
}

fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these two descriptors; nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A connected pair of Unix sockets of type `kind`, close-on-exec.
pub(crate) fn socket_pair(kind: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid out-array of two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            kind | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair just returned these two descriptors; nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A forked child that waits at a gate (blocked reading a pipe) before it execs the
/// command, so the tracer can make it a target first. Stdio is inherited untouched; the
/// command starts as it would have without the tracer (`credentials::Launch`: the
/// inherited rlimits, signals and nice value, no other descriptor than the session's),
/// as the `--run-as` user if one is given.
pub(crate) struct GatedChild {
    pub pid: u32,
    go: Option<OwnedFd>,
    exec_error: OwnedFd,
    /// The session's end of the stream socket the command has as USER_DRAIN_FD: while
    /// it is open, a rewritten program the command starts waits at its first record
    /// until the tracer has attached its binary (`tracer_common::USER_SESSION`).
    session: Option<OwnedFd>,
}

impl GatedChild {
    /// Spawn `exe` for a session that drains through the kernel, as `run_as` (None:
    /// as the tracer).
    pub(crate) fn spawn(exe: &Path, argv: &[OsString], run_as: Option<&RunAs>) -> Result<Self> {
        let (ours, theirs) = socket_pair(libc::SOCK_STREAM).context("socketpair")?;
        let mut c = Self::spawn_with_drain(exe, argv, Some(theirs.as_raw_fd()), run_as)?;
        c.session = Some(ours);
        Ok(c)
    }

    /// Like `spawn`; `drain_fd`, if given, becomes descriptor USER_DRAIN_FD of the
    /// command (the user-space drain's socket, or the session's: see `spawn`).
    pub(crate) fn spawn_with_drain(
        exe: &Path,
        argv: &[OsString],
        drain_fd: Option<RawFd>,
        run_as: Option<&RunAs>,
    ) -> Result<Self> {
        // Everything the child needs is prepared before fork: after it, only
        // async-signal-safe calls.
        let c_exe = CString::new(exe.as_os_str().as_bytes())
            .with_context(|| format!("{}: NUL in path", exe.display()))?;
        let c_args = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .context("NUL in an argument")?;
        let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        c_argv.push(std::ptr::null());
        let (gate_r, gate_w) = pipe_cloexec().context("pipe")?;
        let (err_r, err_w) = pipe_cloexec().context("pipe")?;
        let launch = Launch::new(run_as);

        // SAFETY: the child only calls async-signal-safe functions (read, write,
        // dup2, the system calls of `Launch::apply`, execv, _exit) on memory prepared
        // above.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error()).context("fork");
        }
        if pid == 0 {
            // SAFETY: child side, see above; never returns.
            unsafe {
                child_after_fork(
                    [gate_r.as_raw_fd(), err_w.as_raw_fd()],
                    [gate_w.as_raw_fd(), err_r.as_raw_fd()],
                    drain_fd,
                    &launch,
                    &c_exe,
                    &c_argv,
                )
            }
        }
        drop((gate_r, err_w));
        Ok(GatedChild {
            pid: pid as u32,
            go: Some(gate_w),
            exec_error: err_r,
            session: None,
        })
    }

    /// The session's end of the command's USER_DRAIN_FD (`spawn`), to be read and,
    /// closed, to end the waits.
    pub(crate) fn take_session(&mut self) -> Option<OwnedFd> {
        self.session.take()
    }

    /// Open the gate; returns once the child has exec'd (or reports why it could not).
    pub(crate) fn release(&mut self) -> Result<()> {
        let go = self.go.take().context("child already released")?;
        // SAFETY: writing one byte from a valid buffer to our pipe descriptor.
        if unsafe { libc::write(go.as_raw_fd(), b"g".as_ptr().cast(), 1) } != 1 {
            return Err(io::Error::last_os_error()).context("cannot release the child");
        }
        drop(go);
        // The error pipe is close-on-exec: EOF means exec succeeded.
        let mut report = [0u8; 8];
        let mut n = 0;
        while n < report.len() {
            // SAFETY: reading into the valid remainder of `report`.
            let r = unsafe {
                libc::read(
                    self.exec_error.as_raw_fd(),
                    report[n..].as_mut_ptr().cast(),
                    report.len() - n,
                )
            };
            match r {
                0 => return Ok(()),
                r if r > 0 => n += r as usize,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                _ => return Err(io::Error::last_os_error()).context("reading exec status"),
            }
        }
        Err(ChildError::from_bytes(report).into())
    }
}

/// # Safety
/// Only in the child right after fork; `argv` is NULL-terminated and points into
/// strings that live in the (copied) parent memory. `[gate, err]` are the ends the
/// child uses, `parent_ends` the ones it must not keep.
unsafe fn child_after_fork(
    [gate, err]: [RawFd; 2],
    parent_ends: [RawFd; 2],
    drain_fd: Option<RawFd>,
    launch: &Launch,
    exe: &CString,
    argv: &[*const libc::c_char],
) -> ! {
    // Our copy of the gate's write end would keep the read below from ever seeing EOF.
    for fd in parent_ends {
        // SAFETY: closing descriptors of this (child) process; async-signal-safe.
        unsafe { libc::close(fd) };
    }
    let mut b = 0u8;
    loop {
        // SAFETY: one byte into a valid local.
        let r = unsafe { libc::read(gate, (&raw mut b).cast(), 1) };
        if r == 1 {
            break;
        }
        // EOF: the tracer gave up before releasing us; do not run the command untraced.
        // SAFETY: __errno_location is async-signal-safe; _exit never returns.
        if r == 0 || unsafe { *libc::__errno_location() } != libc::EINTR {
            // SAFETY: _exit is async-signal-safe and takes no pointers.
            unsafe { libc::_exit(127) };
        }
    }
    let drain = tracer_common::USER_DRAIN_FD as RawFd;
    // SAFETY: async-signal-safe calls on this process's descriptors and on memory
    // prepared before the fork; `fail` never returns.
    unsafe {
        if let Some(fd) = drain_fd {
            // dup2 leaves the copy without close-on-exec (a no-op if it is the same).
            let r = if fd == drain {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, drain)
            };
            if r < 0 {
                fail(err, ChildError::now(ChildStep::Drain));
            }
        }
        if let Err(e) = launch.apply(drain_fd.map(|_| drain)) {
            fail(err, e);
        }
        libc::execv(exe.as_ptr(), argv.as_ptr());
        fail(err, ChildError::now(ChildStep::Exec))
    }
}

/// Report `e` to the parent over `err`, then exit.
///
/// # Safety
/// In the child only; write and _exit are async-signal-safe.
unsafe fn fail(err: RawFd, e: ChildError) -> ! {
    let b = e.to_bytes();
    // SAFETY: writing 8 bytes from a valid local; _exit never returns.
    unsafe {
        libc::write(err, b.as_ptr().cast(), b.len());
        libc::_exit(127)
    }
}

/// Wait for child `pid`; its exit code, 128+signal if it was killed.
pub(crate) fn wait_child(pid: u32) -> Result<i32> {
    let mut status = 0;
    loop {
        // SAFETY: status is a valid int; pid is our child.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        if r == pid as libc::pid_t {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("waitpid({pid})"));
        }
    }
    Ok(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    })
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// While a command runs in the foreground, Ctrl-C and Ctrl-\ are for it: the tracer
/// ignores them so it can still write the trace when the command dies of them. (The
/// command starts with the dispositions the tracer inherited: `credentials::Launch`.)
pub(crate) fn ignore_terminal_signals() {
    // SAFETY: SIG_IGN is a valid disposition for these signals.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
}

/// Ctrl-C / SIGTERM end an attach session (checked by [`wait_process`]).
pub(crate) fn catch_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a valid handler that only stores an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Why [`wait_process`] returned.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    Exited,
    Interrupted,
    Timeout,
}

/// Our child `pid`'s exit code (128+signal if killed) if it has exited, without
/// blocking.
pub(crate) fn try_wait_child(pid: u32) -> Result<Option<i32>> {
    let mut status = 0;
    // SAFETY: status is a valid int; pid is our child.
    let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    if r == 0 {
        return Ok(None);
    }
    if r != pid as libc::pid_t {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(None);
        }
        return Err(e).with_context(|| format!("waitpid({pid})"));
    }
    Ok(Some(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }))
}

/// Whether Ctrl-C / SIGTERM arrived (after [`catch_stop_signals`]).
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Watches a process that is not our child (a pidfd).
pub(crate) struct PidWatch(OwnedFd);

impl PidWatch {
    pub(crate) fn open(pid: u32) -> Result<Self> {
        // SAFETY: pidfd_open takes a pid and flags, returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error()).with_context(|| format!("pidfd_open({pid})"));
        }
        // SAFETY: a descriptor pidfd_open just returned, owned by nobody else.
        Ok(PidWatch(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    /// Whether the process has exited (never blocks).
    pub(crate) fn exited(&self) -> Result<bool> {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        Ok(r > 0)
    }
}

/// A process's command line from /proc, for the session record.
pub(crate) fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_execvp() {
        assert!(resolve_command(OsStr::new("sh")).unwrap().is_absolute());
        assert!(resolve_command(OsStr::new("no-such-command-xyz")).is_err());
        assert!(resolve_command(OsStr::new("./no/such")).is_err());
    }

    #[test]
    fn gate_and_exit_codes() {
        let sh = resolve_command(OsStr::new("sh")).unwrap();
        let args = |s: &str| vec![OsString::from("sh"), "-c".into(), s.into()];
        let mut c = GatedChild::spawn(&sh, &args("exit 3"), None).unwrap();
        c.release().unwrap();
        assert_eq!(wait_child(c.pid).unwrap(), 3);
        let mut c = GatedChild::spawn(&sh, &args("kill -9 $$"), None).unwrap();
        c.release().unwrap();
        assert_eq!(wait_child(c.pid).unwrap(), 128 + 9);
        // Dropped without release: the child exits without running the command.
        let c = GatedChild::spawn(&sh, &args("exit 0"), None).unwrap();
        let pid = c.pid;
        drop(c);
        assert_eq!(wait_child(pid).unwrap(), 127);
        let mut c = GatedChild::spawn(Path::new("/nonexistent"), &args(""), None).unwrap();
        assert!(c.release().is_err());
        assert_eq!(wait_child(c.pid).unwrap(), 127);
    }

    /// The command starts without the tracer's descriptors but the session's, with the
    /// RLIMIT_MEMLOCK saved before the tracer changed it (`--run-as`: see
    /// `command_runs_as_asked`).
    #[test]
    fn command_starts_clean() {
        crate::record::session::credentials::save_inherited();
        let sh = resolve_command(OsStr::new("sh")).unwrap();
        // The tracer changes a limit after saving (lowered here: raising may need
        // CAP_SYS_RESOURCE); the command gets the saved one back.
        let mut saved = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: valid out-parameter.
        let got = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut saved) };
        assert_eq!(got, 0);
        let lowered = libc::rlimit {
            rlim_cur: saved.rlim_cur.min(saved.rlim_max) / 2,
            rlim_max: saved.rlim_max,
        };
        // SAFETY: a valid rlimit, lower than the current one.
        let set = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lowered) };
        assert_eq!(set, 0);
        let shown = |v: libc::rlim_t| {
            if v == libc::RLIM_INFINITY {
                "unlimited".to_string()
            } else {
                v.to_string()
            }
        };
        let limit = format!(
            "grep -q '^Max locked memory *{} *{} ' /proc/self/limits",
            shown(saved.rlim_cur),
            shown(saved.rlim_max)
        );
        let args = vec![OsString::from("sh"), "-c".into(), limit.into()];
        let mut c = GatedChild::spawn(&sh, &args, None).unwrap();
        c.release().unwrap();
        assert_eq!(wait_child(c.pid).unwrap(), 0, "RLIMIT_MEMLOCK restored");
        // SAFETY: back to the saved limit (raising the soft one up to the hard one).
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &saved) }, 0);
        // A descriptor without close-on-exec, as a parent may leave one.
        // SAFETY: dup of stderr; the copy is closed below.
        let leaked = unsafe { libc::dup(2) };
        assert!(leaked > 2);
        let script = format!(
            "test ! -e /proc/self/fd/{leaked} && test -e /proc/self/fd/{drain} && \
             test -e /proc/self/fd/2 || exit 9",
            drain = tracer_common::USER_DRAIN_FD
        );
        let args = vec![OsString::from("sh"), "-c".into(), script.into()];
        let mut c = GatedChild::spawn(&sh, &args, None).unwrap();
        c.release().unwrap();
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(leaked) };
        assert_eq!(wait_child(c.pid).unwrap(), 0);
    }

    /// The command runs as `--run-as` says: uid, gid, groups, no capability. Needs
    /// root (the tests run as root): as another user it fails, it does not skip.
    #[test]
    fn command_runs_as_asked() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "this test changes credentials: run it as root");
        crate::record::session::credentials::save_inherited();
        let sh = resolve_command(OsStr::new("sh")).unwrap();
        let nobody = RunAs::parse("65534:65534").unwrap();
        let check = "test \"$(id -u):$(id -g):$(id -G)\" = 65534:65534:65534 && \
                     grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status || exit 9";
        let args = vec![OsString::from("sh"), "-c".into(), check.into()];
        let mut c = GatedChild::spawn(&sh, &args, Some(&nobody)).unwrap();
        c.release().unwrap();
        assert_eq!(wait_child(c.pid).unwrap(), 0);
    }
}
