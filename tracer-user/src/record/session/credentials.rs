//! Who a command the tracer runs runs as, and what it starts with.
//!
//! `record --run-as USER[:GROUP]` (under sudo: the invoking user by default) is resolved
//! here before any fork; the process attributes the tracer inherited (rlimits, signal
//! mask, ignored signals, nice) are saved before the tracer changes any. Between fork
//! and exec, [`Launch::apply`] puts them back, changes the credentials and drops every
//! capability of a non-root command, with async-signal-safe calls only: the command and
//! the loader asked for its libraries (`ld.so --list`) start as they would have without
//! the tracer, with no more privilege than the user they run as.
//!
//! The attributes are saved at the tracer's start, from `.init_array`; the command starts
//! with no descriptor but 0-2 and the session's (1021), and with no capability unless it runs
//! as root. Tests `trust_run_as::*`.

use std::{
    ffi::{CStr, CString},
    io,
    os::fd::RawFd,
    sync::OnceLock,
};

/// The identity a command runs as: uid, gid and supplementary groups (what
/// `initgroups` would set), resolved from the user database before the fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// The account's name (or the uid in decimal when it has none), for messages.
    pub name: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
}

/// Why `--run-as` (or the sudo default) names no identity.
#[derive(Debug, thiserror::Error)]
pub enum RunAsError {
    #[error("--run-as {0}: no such user")]
    NoUser(String),
    #[error("--run-as {0}: no such group")]
    NoGroup(String),
    #[error("--run-as {0}: uid {0} has no account: give its group too (--run-as UID:GID)")]
    NoAccount(libc::uid_t),
    #[error("{var}={value:?} is not a number")]
    BadSudoVar { var: &'static str, value: String },
    #[error("cannot read the user database: {0}")]
    Database(io::Error),
    /// (uid_t)-1 or (gid_t)-1: "leave unchanged" to setresuid/setresgid, so the
    /// command would keep root.
    #[error("{what} {id} cannot be run as (the kernel reads it as \"no change\")")]
    NoChangeId { what: &'static str, id: u32 },
}

impl RunAs {
    /// The identity for `record`: `--run-as SPEC` if given; else, for a tracer run as
    /// root by sudo, the user who ran sudo (`SUDO_UID`, `SUDO_GID`); else None (the
    /// command runs as the tracer does).
    pub fn for_record(spec: Option<&str>) -> Result<Option<RunAs>, RunAsError> {
        match spec {
            Some(s) => RunAs::parse(s).map(Some),
            // SAFETY: geteuid has no preconditions.
            None if unsafe { libc::geteuid() } == 0 => {
                let r = RunAs::from_sudo(
                    std::env::var("SUDO_UID").ok().as_deref(),
                    std::env::var("SUDO_GID").ok().as_deref(),
                )?;
                if let Some(r) = &r {
                    // Always said: a root shell reached by `sudo -i` or `sudo su` still
                    // carries SUDO_UID, and its user may not expect to lose root.
                    eprintln!(
                        "utrace: running the command as {} (the sudo user); --run-as root keeps root",
                        r.name
                    );
                }
                Ok(r)
            }
            None => Ok(None),
        }
    }

    /// `USER[:GROUP]`, each a name or a number.
    pub fn parse(spec: &str) -> Result<RunAs, RunAsError> {
        // Said before any lookup (u32::MAX has no account, which would hide why).
        let (user, group) = spec.split_once(':').unwrap_or((spec, ""));
        for (what, part) in [("uid", user), ("gid", group)] {
            if part.parse::<u32>() == Ok(u32::MAX) {
                return Err(RunAsError::NoChangeId { what, id: u32::MAX });
            }
        }
        RunAs::parse_any(spec)?.representable()
    }

    /// This identity, unless one of its ids is `u32::MAX`, which the kernel's
    /// set*id calls take for "no change" (the command would stay root).
    fn representable(self) -> Result<RunAs, RunAsError> {
        let bad = |what, id: u32| (id == u32::MAX).then_some(RunAsError::NoChangeId { what, id });
        if let Some(e) = bad("uid", self.uid)
            .or_else(|| bad("gid", self.gid))
            .or_else(|| self.groups.iter().find_map(|&g| bad("group", g)))
        {
            return Err(e);
        }
        Ok(self)
    }

    fn parse_any(spec: &str) -> Result<RunAs, RunAsError> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let account = match user.parse::<libc::uid_t>() {
            Ok(uid) => passwd_by_uid(uid)?,
            Err(_) => Some(passwd_by_name(user)?.ok_or_else(|| RunAsError::NoUser(user.into()))?),
        };
        let gid = match group {
            Some(g) => Some(group_id(g)?),
            None => None,
        };
        match (account, gid) {
            (Some(a), gid) => a.with_groups(gid),
            (None, Some(gid)) => {
                let uid = user.parse::<libc::uid_t>().unwrap_or_default();
                Ok(RunAs {
                    name: uid.to_string(),
                    uid,
                    gid,
                    groups: vec![gid],
                })
            }
            (None, None) => Err(RunAsError::NoAccount(
                user.parse::<libc::uid_t>().unwrap_or_default(),
            )),
        }
    }

    /// The user who ran `sudo` (from sudo's `SUDO_UID` and `SUDO_GID`), None when
    /// not under sudo or when that user is root.
    pub fn from_sudo(uid: Option<&str>, gid: Option<&str>) -> Result<Option<RunAs>, RunAsError> {
        for (what, v) in [("uid", uid), ("gid", gid)] {
            if v.and_then(|v| v.parse::<u32>().ok()) == Some(u32::MAX) {
                return Err(RunAsError::NoChangeId { what, id: u32::MAX });
            }
        }
        RunAs::from_sudo_any(uid, gid)?
            .map(RunAs::representable)
            .transpose()
    }

    fn from_sudo_any(uid: Option<&str>, gid: Option<&str>) -> Result<Option<RunAs>, RunAsError> {
        let Some(uid) = uid else {
            return Ok(None);
        };
        let number = |var, value: &str| {
            value.parse::<u32>().map_err(|_| RunAsError::BadSudoVar {
                var,
                value: value.into(),
            })
        };
        let uid = number("SUDO_UID", uid)?;
        if uid == 0 {
            return Ok(None);
        }
        let gid = gid.map(|g| number("SUDO_GID", g)).transpose()?;
        match (passwd_by_uid(uid)?, gid) {
            (Some(a), gid) => a.with_groups(gid).map(Some),
            (None, Some(gid)) => Ok(Some(RunAs {
                name: uid.to_string(),
                uid,
                gid,
                groups: vec![gid],
            })),
            (None, None) => Err(RunAsError::NoAccount(uid)),
        }
    }

    /// Whether this identity is root's (the command keeps root's capabilities).
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Become this identity: supplementary groups, then gid, then uid (real, effective
    /// and saved, so none can be taken back); then check with getresuid/getresgid that
    /// all three of each are the ones asked for (a call that "succeeded" without
    /// changing them must not leave the command root).
    ///
    /// # Safety
    /// Only in a child between fork and exec: raw system calls, which change the one
    /// thread there is (glibc's wrappers would signal threads that the child has not).
    unsafe fn become_it(&self) -> Result<(), ChildError> {
        let step = |r: libc::c_long, step| {
            if r == 0 {
                Ok(())
            } else {
                Err(ChildError::now(step))
            }
        };
        // SAFETY: groups is a valid array of groups.len() gids, alive in this child.
        let r =
            unsafe { libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr()) };
        step(r, ChildStep::Groups)?;
        // SAFETY: setresgid/setresuid take integers only.
        let r = unsafe { libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) };
        step(r, ChildStep::Gid)?;
        // SAFETY: as above.
        let r = unsafe { libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) };
        step(r, ChildStep::Uid)?;
        let (mut a, mut b, mut c) = (0 as libc::uid_t, 0, 0);
        // SAFETY: three valid out-pointers to uid_t (the raw call: async-signal-safe).
        let r = unsafe { libc::syscall(libc::SYS_getresuid, &mut a, &mut b, &mut c) };
        if r != 0 || [a, b, c] != [self.uid; 3] {
            return Err(ChildError {
                step: ChildStep::UidCheck,
                errno: libc::EPERM,
            });
        }
        let (mut a, mut b, mut c) = (0 as libc::gid_t, 0, 0);
        // SAFETY: three valid out-pointers to gid_t.
        let r = unsafe { libc::syscall(libc::SYS_getresgid, &mut a, &mut b, &mut c) };
        if r != 0 || [a, b, c] != [self.gid; 3] {
            return Err(ChildError {
                step: ChildStep::GidCheck,
                errno: libc::EPERM,
            });
        }
        Ok(())
    }
}

/// An account from the user database.
struct Account {
    name: String,
    c_name: CString,
    uid: libc::uid_t,
    gid: libc::gid_t,
}

impl Account {
    /// As `initgroups(name, gid)` would: the account's groups plus `gid` (its primary
    /// group unless one is given).
    fn with_groups(self, gid: Option<libc::gid_t>) -> Result<RunAs, RunAsError> {
        let gid = gid.unwrap_or(self.gid);
        let mut groups = vec![0 as libc::gid_t; 64];
        loop {
            let mut n = groups.len() as libc::c_int;
            // SAFETY: c_name is a C string; groups has room for n gids; n is updated
            // to the count needed when -1 is returned.
            let r = unsafe {
                libc::getgrouplist(self.c_name.as_ptr(), gid, groups.as_mut_ptr(), &mut n)
            };
            if r >= 0 {
                groups.truncate(n.max(0) as usize);
                break;
            }
            if groups.len() >= 1 << 16 {
                return Err(RunAsError::Database(io::Error::other("too many groups")));
            }
            groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
        }
        Ok(RunAs {
            name: self.name,
            uid: self.uid,
            gid,
            groups,
        })
    }
}

/// Calls `f` (a getpw*_r / getgr*_r call) with a growing buffer until it fits; the
/// entry it filled in, if there is one.
fn lookup<T>(
    mut f: impl FnMut(&mut T, &mut [libc::c_char], &mut *mut T) -> libc::c_int,
) -> Result<Option<(T, Vec<libc::c_char>)>, RunAsError> {
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        // SAFETY: T is a plain C struct (passwd or group) the call fills in.
        let mut entry: T = unsafe { std::mem::zeroed() };
        let mut found: *mut T = std::ptr::null_mut();
        match f(&mut entry, &mut buf, &mut found) {
            0 if found.is_null() => return Ok(None),
            0 => return Ok(Some((entry, buf))),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            // Not found is 0 with no entry, but some backends say ENOENT and the like.
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            e => return Err(RunAsError::Database(io::Error::from_raw_os_error(e))),
        }
    }
}

fn account(pw: &libc::passwd) -> Account {
    // SAFETY: pw_name of an entry getpw*_r filled is a C string inside its buffer,
    // which the caller still holds.
    let c_name = unsafe { CStr::from_ptr(pw.pw_name) }.to_owned();
    Account {
        name: c_name.to_string_lossy().into_owned(),
        c_name,
        uid: pw.pw_uid,
        gid: pw.pw_gid,
    }
}

fn passwd_by_name(name: &str) -> Result<Option<Account>, RunAsError> {
    let Ok(c) = CString::new(name) else {
        return Ok(None);
    };
    let found = lookup::<libc::passwd>(|pw, buf, out| {
        // SAFETY: valid name, entry, buffer of buf.len() bytes and out-pointer.
        unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf.as_mut_ptr(), buf.len(), out) }
    })?;
    Ok(found.map(|(pw, _buf)| account(&pw)))
}

fn passwd_by_uid(uid: libc::uid_t) -> Result<Option<Account>, RunAsError> {
    let found = lookup::<libc::passwd>(|pw, buf, out| {
        // SAFETY: valid entry, buffer of buf.len() bytes and out-pointer.
        unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr(), buf.len(), out) }
    })?;
    Ok(found.map(|(pw, _buf)| account(&pw)))
}

/// A group by name or number (a number needs no entry).
fn group_id(group: &str) -> Result<libc::gid_t, RunAsError> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let no_group = || RunAsError::NoGroup(group.into());
    let c = CString::new(group).map_err(|_| no_group())?;
    let found = lookup::<libc::group>(|gr, buf, out| {
        // SAFETY: valid name, entry, buffer of buf.len() bytes and out-pointer.
        unsafe { libc::getgrnam_r(c.as_ptr(), gr, buf.as_mut_ptr(), buf.len(), out) }
    })?;
    found.map(|(gr, _buf)| gr.gr_gid).ok_or_else(no_group)
}

/// Linux's resource limits: 0..=RLIMIT_RTTIME (15).
const RLIMITS: usize = 16;

/// Signals 1..=64 (bit `n - 1` of a mask is signal `n`).
const SIGNALS: libc::c_int = 64;

/// What the tracer inherited from its parent and later changes for itself: restored in
/// the commands it runs.
#[derive(Clone, Copy)]
pub struct Inherited {
    limits: [libc::rlimit; RLIMITS],
    mask: libc::sigset_t,
    /// Signals the parent left ignored (the only dispositions that survive an exec).
    ignored: u64,
    nice: libc::c_int,
}

static INHERITED: OnceLock<Inherited> = OnceLock::new();

/// Save what the tracer inherited, before it changes anything (the first call wins).
/// `main` calls it before Rust's runtime starts (`.init_array`: the runtime ignores
/// SIGPIPE before `main`), and again first thing in `main`.
pub fn save_inherited() {
    INHERITED.get_or_init(Inherited::now);
}

impl Inherited {
    fn now() -> Inherited {
        // SAFETY: rlimit, sigset_t and sigaction are plain C structs; every call below
        // only fills in the out-parameter given.
        unsafe {
            let mut limits = [std::mem::zeroed::<libc::rlimit>(); RLIMITS];
            for (r, lim) in limits.iter_mut().enumerate() {
                if libc::getrlimit(r as _, lim) != 0 {
                    *lim = libc::rlimit {
                        rlim_cur: libc::RLIM_INFINITY,
                        rlim_max: libc::RLIM_INFINITY,
                    };
                }
            }
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut mask);
            let mut ignored = 0u64;
            for sig in 1..=SIGNALS {
                let mut sa: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut sa) == 0
                    && sa.sa_sigaction == libc::SIG_IGN
                {
                    ignored |= 1 << (sig - 1);
                }
            }
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            let nice = if nice == -1 && *libc::__errno_location() != 0 {
                0
            } else {
                nice
            };
            Inherited {
                limits,
                mask,
                ignored,
                nice,
            }
        }
    }

    /// Put back the rlimits, nice value and signal dispositions (not the mask: see
    /// [`Inherited::restore_mask`]).
    ///
    /// # Safety
    /// Only in a child between fork and exec (async-signal-safe calls only).
    unsafe fn restore(&self) -> Result<(), ChildError> {
        // SAFETY: get/setrlimit, get/setpriority and sigaction with valid structs are
        // async-signal-safe system calls.
        unsafe {
            for (r, want) in self.limits.iter().enumerate() {
                let mut now: libc::rlimit = std::mem::zeroed();
                if libc::getrlimit(r as _, &mut now) == 0
                    && (now.rlim_cur, now.rlim_max) != (want.rlim_cur, want.rlim_max)
                    && libc::setrlimit(r as _, want) != 0
                {
                    return Err(ChildError::now(ChildStep::Limits));
                }
            }
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            if nice != self.nice && libc::setpriority(libc::PRIO_PROCESS, 0, self.nice) != 0 {
                return Err(ChildError::now(ChildStep::Nice));
            }
            for sig in 1..=SIGNALS {
                if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                    continue;
                }
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = if self.ignored & (1 << (sig - 1)) != 0 {
                    libc::SIG_IGN
                } else {
                    libc::SIG_DFL
                };
                // The C library's own signals (32, 33) refuse: EINVAL, left alone.
                if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0
                    && *libc::__errno_location() != libc::EINVAL
                {
                    return Err(ChildError::now(ChildStep::Signals));
                }
            }
        }
        Ok(())
    }

    /// The inherited signal mask, last before exec (so nothing is blocked sooner).
    ///
    /// # Safety
    /// As [`Inherited::restore`].
    unsafe fn restore_mask(&self) -> Result<(), ChildError> {
        // SAFETY: sigprocmask with a valid set is async-signal-safe.
        if unsafe { libc::sigprocmask(libc::SIG_SETMASK, &self.mask, std::ptr::null_mut()) } != 0 {
            return Err(ChildError::now(ChildStep::Mask));
        }
        Ok(())
    }
}

/// How a command starts: the inherited attributes (when saved) and the identity to
/// run as (None: the tracer's own). Prepared before the fork, applied after it.
#[derive(Clone)]
pub struct Launch {
    inherited: Option<Inherited>,
    run_as: Option<RunAs>,
}

impl Launch {
    pub fn new(run_as: Option<&RunAs>) -> Launch {
        Launch {
            inherited: INHERITED.get().copied(),
            run_as: run_as.cloned(),
        }
    }

    /// In the child: every descriptor but 0-2 and `keep` closed at exec, the inherited
    /// attributes back, the identity changed, no capability left unless the command
    /// runs as root, and the inherited signal mask. `keep` must not be close-on-exec.
    ///
    /// # Safety
    /// Only in a child between fork and exec: async-signal-safe calls only, on memory
    /// prepared before the fork.
    pub unsafe fn apply(&self, keep: Option<RawFd>) -> Result<(), ChildError> {
        // SAFETY: the caller is such a child; each call below is async-signal-safe.
        unsafe {
            close_on_exec_from(3, keep)?;
            if let Some(i) = &self.inherited {
                i.restore()?;
            }
            if let Some(r) = &self.run_as {
                r.become_it()?;
            }
            if libc::geteuid() != 0 {
                drop_capabilities()?;
            }
            if let Some(i) = &self.inherited {
                i.restore_mask()?;
            }
        }
        Ok(())
    }
}

/// Mark every descriptor from `first` on close-on-exec, except `keep`.
///
/// # Safety
/// Async-signal-safe; for a child between fork and exec.
unsafe fn close_on_exec_from(first: RawFd, keep: Option<RawFd>) -> Result<(), ChildError> {
    let ranges = match keep {
        Some(k) if k >= first => [(first, k - 1), (k + 1, RawFd::MAX)],
        _ => [(first, RawFd::MAX), (0, -1)],
    };
    for (lo, hi) in ranges {
        if lo > hi {
            continue;
        }
        // SAFETY: close_range only changes this process's descriptor flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                lo as libc::c_uint,
                hi as libc::c_uint,
                libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        if r != 0 {
            // SAFETY: as the caller's.
            unsafe { close_on_exec_each(lo, hi)? };
        }
    }
    Ok(())
}

/// [`close_on_exec_from`] one descriptor at a time (kernels before 5.11), up to the
/// descriptor limit.
///
/// # Safety
/// As [`close_on_exec_from`].
unsafe fn close_on_exec_each(lo: RawFd, hi: RawFd) -> Result<(), ChildError> {
    // SAFETY: getrlimit and fcntl on this process's descriptors are async-signal-safe.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(ChildError::now(ChildStep::Descriptors));
        }
        let end = RawFd::try_from(lim.rlim_cur).unwrap_or(RawFd::MAX).min(hi);
        for fd in lo..=end {
            if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0
                && *libc::__errno_location() != libc::EBADF
            {
                return Err(ChildError::now(ChildStep::Descriptors));
            }
        }
    }
    Ok(())
}

/// Linux capability sets, version 3 (two 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// Drop every capability: ambient, then effective, permitted and inheritable (a
/// non-root tracer given some, e.g. CAP_BPF, must not hand them to the command).
///
/// # Safety
/// Async-signal-safe; for a child between fork and exec.
unsafe fn drop_capabilities() -> Result<(), ChildError> {
    // SAFETY: prctl and capset with valid arguments are plain system calls.
    unsafe {
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        ) != 0
            && *libc::__errno_location() != libc::EINVAL
        {
            return Err(ChildError::now(ChildStep::Capabilities));
        }
        let mut header = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
            return Err(ChildError::now(ChildStep::Capabilities));
        }
    }
    Ok(())
}

/// What the child was doing when it failed to start the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ChildStep {
    Exec = 0,
    Descriptors,
    Drain,
    Limits,
    Nice,
    Signals,
    Groups,
    Gid,
    Uid,
    Capabilities,
    Mask,
    UidCheck,
    GidCheck,
}

impl ChildStep {
    const ALL: [ChildStep; 13] = [
        ChildStep::Exec,
        ChildStep::Descriptors,
        ChildStep::Drain,
        ChildStep::Limits,
        ChildStep::Nice,
        ChildStep::Signals,
        ChildStep::Groups,
        ChildStep::Gid,
        ChildStep::Uid,
        ChildStep::Capabilities,
        ChildStep::Mask,
        ChildStep::UidCheck,
        ChildStep::GidCheck,
    ];

    fn from_u32(n: u32) -> ChildStep {
        ChildStep::ALL
            .get(n as usize)
            .copied()
            .unwrap_or(ChildStep::Exec)
    }
}

impl std::fmt::Display for ChildStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChildStep::Exec => "cannot execute",
            ChildStep::Descriptors => "cannot close the tracer's descriptors",
            ChildStep::Drain => "cannot pass the session's descriptor",
            ChildStep::Limits => "cannot restore the resource limits",
            ChildStep::Nice => "cannot restore the nice value",
            ChildStep::Signals => "cannot restore the signal dispositions",
            ChildStep::Groups => "cannot set the supplementary groups",
            ChildStep::Gid => "cannot change group",
            ChildStep::Uid => "cannot change user",
            ChildStep::Capabilities => "cannot drop capabilities",
            ChildStep::Mask => "cannot restore the signal mask",
            ChildStep::UidCheck => "the user ids after the change are not the ones asked for",
            ChildStep::GidCheck => "the group ids after the change are not the ones asked for",
        })
    }
}

/// A child's failure to start the command: the step and its errno.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {}", io::Error::from_raw_os_error(*errno))]
pub struct ChildError {
    pub step: ChildStep,
    pub errno: i32,
}

impl ChildError {
    /// `step` failed with the current errno (async-signal-safe).
    pub fn now(step: ChildStep) -> ChildError {
        // SAFETY: __errno_location is async-signal-safe and always valid.
        let errno = unsafe { *libc::__errno_location() };
        ChildError { step, errno }
    }

    /// The 8 bytes a child writes to its parent.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&(self.step as u32).to_ne_bytes());
        b[4..].copy_from_slice(&self.errno.to_ne_bytes());
        b
    }

    pub fn from_bytes(b: [u8; 8]) -> ChildError {
        let [s0, s1, s2, s3, e0, e1, e2, e3] = b;
        ChildError {
            step: ChildStep::from_u32(u32::from_ne_bytes([s0, s1, s2, s3])),
            errno: i32::from_ne_bytes([e0, e1, e2, e3]),
        }
    }

    /// As an `io::Error` (for a `Command::pre_exec` closure).
    pub fn into_io(self) -> io::Error {
        io::Error::from_raw_os_error(self.errno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_users_and_groups() {
        let root = RunAs::parse("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert_eq!(RunAs::parse("0").unwrap(), root);
        let r = RunAs::parse("root:5").unwrap();
        assert_eq!((r.uid, r.gid), (0, 5));
        assert!(r.groups.contains(&5));
        assert!(matches!(
            RunAs::parse("no-such-user-xyz"),
            Err(RunAsError::NoUser(_))
        ));
        assert!(matches!(
            RunAs::parse("root:no-such-group-xyz"),
            Err(RunAsError::NoGroup(_))
        ));
        // A uid with no account runs with the group given, and only that one.
        let n = RunAs::parse("4000123:4000124").unwrap();
        assert_eq!((n.uid, n.gid, n.groups), (4000123, 4000124, vec![4000124]));
        assert!(matches!(
            RunAs::parse("4000123"),
            Err(RunAsError::NoAccount(4000123))
        ));
    }

    #[test]
    fn ids_the_kernel_reads_as_no_change_are_refused() {
        for spec in [
            "4294967295:5",
            "4294967295",
            "root:4294967295",
            "5:4294967295",
        ] {
            assert!(
                matches!(RunAs::parse(spec), Err(RunAsError::NoChangeId { .. })),
                "{spec}: {:?}",
                RunAs::parse(spec)
            );
        }
        for (u, g) in [("4294967295", Some("5")), ("5", Some("4294967295"))] {
            assert!(matches!(
                RunAs::from_sudo(Some(u), g),
                Err(RunAsError::NoChangeId { .. })
            ));
        }
        let e = RunAs::parse("4294967295:5").unwrap_err().to_string();
        assert_eq!(
            e,
            "uid 4294967295 cannot be run as (the kernel reads it as \"no change\")"
        );
    }

    #[test]
    fn sudo_default() {
        assert_eq!(RunAs::from_sudo(None, None).unwrap(), None);
        assert_eq!(RunAs::from_sudo(Some("0"), Some("0")).unwrap(), None);
        let n = RunAs::from_sudo(Some("4000123"), Some("4000124"))
            .unwrap()
            .unwrap();
        assert_eq!((n.uid, n.gid), (4000123, 4000124));
        assert!(matches!(
            RunAs::from_sudo(Some("x"), None),
            Err(RunAsError::BadSudoVar { .. })
        ));
    }

    #[test]
    fn child_errors_round_trip() {
        for step in ChildStep::ALL {
            let e = ChildError { step, errno: 13 };
            let back = ChildError::from_bytes(e.to_bytes());
            assert_eq!((back.step, back.errno), (step, 13));
        }
    }
}
