//! Issue 28, row 3 (privileges): `tracer record` runs as root, but the command it runs,
//! and the loader it asks for the command's libraries (`PT_INTERP --list`), run as the
//! user (`--run-as USER`, or under sudo the user who ran it) with no capability; and the
//! command starts with what it would have had without the tracer (rlimits, signal mask
//! and ignored signals, nice value, no descriptor but the session's).
//!
//! Before the fix, every session ran the command as root, with the tracer's raised
//! RLIMIT_MEMLOCK, Rust's ignored SIGPIPE and every descriptor the tracer inherited, and
//! ran the file's PT_INTERP as root: a user who asked root (say, through sudo) to trace
//! their program had root run a program and a loader they control.

use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::*;

/// Calls of hot() the `who` run makes.
const CALLS: u64 = 5000;

/// The fixture, built and rewritten (hot traced), in a directory every user can enter.
fn build(tmp: &TempDir) -> PathBuf {
    open_to_all(tmp.path());
    let (orig, traced) = (tmp.join("trust_run_as"), tmp.join("trust_run_as.traced"));
    compile("gcc", &[fixture("trust_run_as.c")], &["-O2"], &orig);
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "hot".as_ref(),
    ])
    .ok();
    traced
}

/// `tracer record FLAGS -o TRACE -- PROG ARGS` with `env` set, and `before` run in the
/// tracer's process before it execs (what its parent leaves it).
fn record(
    flags: &[&str],
    env: &[(&str, &str)],
    trace: &Path,
    prog: &Path,
    args: &[&OsStr],
    before: Option<Start>,
) -> Out {
    let _g = tracing_lock();
    let mut c = record_command(flags, trace, prog);
    c.args(args).envs(env.iter().copied());
    if let Some(s) = before {
        s.install(&mut c);
    }
    run(&mut c, TRACE_TIMEOUT)
}

/// The lines of `out` that start with `prefix` (the prefix cut off, trimmed).
fn field(out: &Out, prefix: &str) -> String {
    let s = out.stdout_str();
    s.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {prefix:?} in {}", out.describe()))
}

/// What `who` must print when run as `u` by `--run-as` (initgroups: the user's own
/// group only, for a system user), and the records it must leave.
fn check_runs_as(what: &str, u: &LocalUser, out: &Out, trace: &Path, forbidden: &Path) {
    assert_eq!(out.status(), 7, "{what}: exit status: {}", out.describe());
    assert_eq!(field(out, "uid "), u.uid.to_string(), "{what}");
    assert_eq!(field(out, "gid "), u.gid.to_string(), "{what}");
    let (uid, gid) = (u.uid.to_string(), u.gid.to_string());
    assert_eq!(field(out, "Uid:"), [&*uid; 4].join("\t"), "{what}: Uid");
    assert_eq!(field(out, "Gid:"), [&*gid; 4].join("\t"), "{what}: Gid");
    assert_eq!(field(out, "Groups:"), gid, "{what}: Groups");
    for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
        assert_eq!(field(out, cap), "0000000000000000", "{what}: {cap}");
    }
    assert_eq!(
        field(out, "write "),
        format!("denied {}", libc::EACCES),
        "{what}: write to a root-owned file"
    );
    assert_eq!(std::fs::read(forbidden).unwrap(), b"root's\n", "{what}");
    check_records(what, out, trace);
}

/// Every hot(i) call, in order, and the books balanced.
fn check_records(what: &str, out: &Out, trace: &Path) {
    assert_eq!(field(out, "calls "), CALLS.to_string(), "{what}");
    let got: Vec<u64> = dump(trace)
        .iter()
        .filter(|r| &*r.symbol == "hot")
        .map(|r| r.value)
        .collect();
    assert_seq_eq(&got, &(0..CALLS).collect::<Vec<_>>(), what);
    let b = report_json(trace)["books"].clone();
    assert_eq!(b["produced"].as_u64(), Some(CALLS), "{what}: {b}");
    assert_eq!(b["delivered"].as_u64(), Some(CALLS), "{what}: {b}");
    assert_eq!(b["dropped"].as_u64(), Some(0), "{what}: {b}");
}

/// A session's flags and environment.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);

/// A root-owned file every user can read but not write.
fn forbidden_file(tmp: &TempDir) -> PathBuf {
    let f = tmp.join("root-owned");
    std::fs::write(&f, "root's\n").unwrap();
    f
}

/// `--run-as utrace-hostile`: the command runs as that user (uid, gid, groups) with no
/// capability, cannot write a root-owned file, and is traced exactly, in both drains
/// and when a shell of the user's starts it; its exit status is the tracer's. Before: it ran as root (uid 0, every capability)
/// and appended to the root-owned file.
#[test]
fn run_as_user() {
    let tmp = TempDir::new("runas");
    let traced = build(&tmp);
    let forbidden = forbidden_file(&tmp);
    let u = LocalUser::hostile();
    let args = [OsStr::new("who"), forbidden.as_os_str(), OsStr::new("5000")];
    for (i, flags) in [&[][..], &["--user"][..]].iter().enumerate() {
        let trace = tmp.join(format!("t{i}.utrace"));
        let mut all = flags.to_vec();
        all.extend(["--run-as", &u.name]);
        let out = record(&all, &[], &trace, &traced, &args, None);
        check_runs_as(&format!("--run-as {flags:?}"), &u, &out, &trace, &forbidden);
    }
    // Started by a shell (not instrumented) that the user runs: the program waits at
    // its first record until root has attached its binary and written ATTACHED into
    // the user's process (/proc/PID/mem).
    let trace = tmp.join("sh.utrace");
    let script = "\"$1\" who \"$2\" 5000; exit $?";
    let sh_args = [
        OsStr::new("-c"),
        OsStr::new(script),
        OsStr::new("sh"),
        traced.as_os_str(),
        forbidden.as_os_str(),
    ];
    let out = record(
        &["--run-as", &u.name],
        &[],
        &trace,
        Path::new("/bin/sh"),
        &sh_args,
        None,
    );
    check_runs_as("--run-as, through sh", &u, &out, &trace, &forbidden);
}

/// Under sudo (SUDO_UID, SUDO_GID, SUDO_USER set, the tracer root) the command runs as
/// the user who ran sudo by default; `--run-as root` keeps root. Before: root always.
#[test]
fn sudo_runs_the_invoking_user() {
    let tmp = TempDir::new("sudo");
    let traced = build(&tmp);
    let forbidden = forbidden_file(&tmp);
    let u = LocalUser::hostile();
    let (uid, gid) = (u.uid.to_string(), u.gid.to_string());
    let sudo = [
        ("SUDO_UID", &*uid),
        ("SUDO_GID", &*gid),
        ("SUDO_USER", &*u.name),
    ];
    let args = [OsStr::new("who"), forbidden.as_os_str(), OsStr::new("5000")];
    let trace = tmp.join("sudo.utrace");
    let out = record(&[], &sudo, &trace, &traced, &args, None);
    check_runs_as("under sudo", &u, &out, &trace, &forbidden);
    // Said on stderr whatever the log level (a root shell reached by `sudo -i` still
    // carries SUDO_UID). Before: only at the info log level, so never by default.
    let notice = format!(
        "utrace: running the command as {} (the sudo user); --run-as root keeps root",
        u.name
    );
    let said = out.stderr_str().lines().filter(|l| *l == notice).count();
    assert_eq!(said, 1, "{}", out.describe());

    let trace = tmp.join("root.utrace");
    let out = record(&["--run-as", "root"], &sudo, &trace, &traced, &args, None);
    assert!(
        !out.stderr_str().contains("(the sudo user)"),
        "{}",
        out.describe()
    );
    assert_eq!(out.status(), 7, "{}", out.describe());
    assert_eq!(field(&out, "uid "), "0");
    assert_ne!(field(&out, "CapEff:"), "0000000000000000");
    assert_eq!(field(&out, "write "), "ok");
    check_records("--run-as root under sudo", &out, &trace);
}

/// `--run-as 4294967295:GID`, or `SUDO_UID=4294967295`: uid (and gid) `u32::MAX` is
/// `-1` to setresuid/setresgid, "no change". Before: the child's setresuid(-1,-1,-1)
/// "succeeded", its euid was still 0 so no capability was dropped, and the command ran
/// as root with every capability (it wrote the root-owned file). Now such an id is
/// refused with an error naming it, before anything runs; and the child checks with
/// getresuid/getresgid that the ids it got are the ones asked for.
#[test]
fn an_id_the_kernel_reads_as_no_change_is_refused() {
    let tmp = TempDir::new("runas-max");
    let traced = build(&tmp);
    let forbidden = forbidden_file(&tmp);
    let u = LocalUser::hostile();
    let gid = u.gid.to_string();
    let args = [OsStr::new("who"), forbidden.as_os_str(), OsStr::new("5000")];
    let max = u32::MAX.to_string();
    let cases: [(&str, Case, &str); 4] = [
        ("uid", (&["--run-as", &format!("{max}:{gid}")], &[]), "uid"),
        (
            "gid",
            (&["--run-as", &format!("{}:{max}", u.uid)], &[]),
            "gid",
        ),
        (
            "SUDO_UID",
            (&[], &[("SUDO_UID", &max), ("SUDO_GID", &gid)]),
            "uid",
        ),
        (
            "SUDO_GID",
            (&[], &[("SUDO_UID", &u.uid.to_string()), ("SUDO_GID", &max)]),
            "gid",
        ),
    ];
    for (what, (flags, env), id) in cases {
        let trace = tmp.join(format!("{what}.utrace"));
        let out = record(flags, env, &trace, &traced, &args, None);
        assert_ne!(
            out.status(),
            7,
            "{what}: the command ran: {}",
            out.describe()
        );
        assert!(!out.success(), "{what}: {}", out.describe());
        let said = format!("{id} {max} cannot be run as");
        assert!(
            out.stderr_str().contains(&said),
            "{what}: {}",
            out.describe()
        );
        assert!(
            !out.stdout_str().contains("uid "),
            "{what}: {}",
            out.describe()
        );
        assert_eq!(std::fs::read(&forbidden).unwrap(), b"root's\n", "{what}");
    }
}

/// The loader asked for the command's libraries is the file's PT_INTERP, which the
/// user chooses: here a script of theirs that writes a marker. It runs as the user
/// (the marker is theirs), with --run-as and under sudo. Before: root ran it (the
/// marker was root's and said uid 0).
#[test]
fn loader_runs_as_the_user() {
    let tmp = TempDir::new("interp");
    open_to_all(tmp.path());
    let u = LocalUser::hostile();
    let theirs = tmp.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    u.own(&theirs);
    let interp = theirs.join("ld.so");
    let marker = theirs.join("marker");
    std::fs::write(
        &interp,
        format!("#!/bin/sh\nid -u >> {}\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&interp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    u.own(&interp);
    let prog = theirs.join("prog");
    let flag = format!("-Wl,--dynamic-linker={}", interp.display());
    compile("gcc", &[fixture("trust_run_as.c")], &["-O2", &flag], &prog);
    u.own(&prog);
    let (uid, gid) = (u.uid.to_string(), u.gid.to_string());
    let sudo = [
        ("SUDO_UID", &*uid),
        ("SUDO_GID", &*gid),
        ("SUDO_USER", &*u.name),
    ];
    let cases: [Case; 2] = [(&["--run-as", &u.name], &[]), (&[], &sudo)];
    for (i, (flags, env)) in cases.iter().enumerate() {
        let _ = std::fs::remove_file(&marker);
        let trace = tmp.join(format!("t{i}.utrace"));
        // The command itself cannot start (its interpreter is no ELF loader): only
        // what ran before matters here.
        let out = record(flags, env, &trace, &prog, &[OsStr::new("env")], None);
        let md = std::fs::metadata(&marker)
            .unwrap_or_else(|e| panic!("{flags:?}: no marker ({e}): {}", out.describe()));
        assert_eq!(md.uid(), u.uid, "{flags:?}: marker's owner");
        assert_eq!(
            std::fs::read_to_string(&marker).unwrap().trim(),
            uid,
            "{flags:?}: the loader's uid"
        );
    }
}

/// What the tests' parent leaves the tracer (and an untraced run): RLIMIT_MEMLOCK
/// 1 MiB soft (the hard limit as it is: a container's root may lack CAP_SYS_RESOURCE,
/// and then the tracer can raise it only that far), SIGUSR2 blocked, SIGUSR1 ignored, nice 3, and for the tracer also
/// a descriptor without close-on-exec at 9.
#[derive(Clone, Copy)]
struct Start {
    leak_fd: bool,
}

impl Start {
    fn install(self, c: &mut Command) {
        let null = c"/dev/null";
        // SAFETY: only async-signal-safe calls (get/setrlimit, sigprocmask, signal,
        // setpriority, open, dup2) on locals and a static C string.
        unsafe {
            c.pre_exec(move || {
                let mut lim: libc::rlimit = std::mem::zeroed();
                if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) != 0 {
                    return Err(io::Error::last_os_error());
                }
                lim.rlim_cur = lim.rlim_max.min(1 << 20);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR2);
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0
                    || libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0
                    || libc::signal(libc::SIGUSR1, libc::SIG_IGN) == libc::SIG_ERR
                    || libc::setpriority(libc::PRIO_PROCESS, 0, 3) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                if self.leak_fd {
                    let fd = libc::open(null.as_ptr(), libc::O_RDONLY);
                    if fd < 0 || libc::dup2(fd, 9) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
}

/// The command sees the rlimits, blocked and ignored signals and nice value of an
/// untraced run of it from the same parent, and no descriptor but 0-2 and the
/// session's (1021), whatever the tracer inherited. Before: RLIMIT_MEMLOCK unlimited
/// (the tracer's), SIGPIPE ignored (Rust's, in the tracer), and the tracer's inherited
/// descriptor 9 (with those its parent left, 10 and 251 here).
#[test]
fn command_starts_as_without_the_tracer() {
    let tmp = TempDir::new("env");
    let traced = build(&tmp);
    let u = LocalUser::hostile();
    let mut c = u.command(&traced);
    c.arg("env");
    Start { leak_fd: false }.install(&mut c);
    let want = run(&mut c, RUN_TIMEOUT).ok();
    let trace = tmp.join("env.utrace");
    let got = record(
        &["--run-as", &u.name],
        &[],
        &trace,
        &traced,
        &[OsStr::new("env")],
        Some(Start { leak_fd: true }),
    );
    assert_eq!(got.status(), 0, "{}", got.describe());
    assert!(field(&want, "memlock ").starts_with("1048576 "), "untraced");
    for f in ["memlock ", "SigBlk:", "SigIgn:", "nice "] {
        assert_eq!(field(&got, f), field(&want, f), "{f} traced vs untraced");
    }
    // Descriptors the tracer's parent left open (9 here, and whatever the test harness
    // inherited, which the untraced run shows) are not the command's.
    assert!(field(&want, "fds").starts_with("0 1 2"), "untraced");
    assert_eq!(
        field(&got, "fds"),
        format!("0 1 2 {}", tracer_common::USER_DRAIN_FD),
        "traced"
    );
}
