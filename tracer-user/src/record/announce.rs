//! The session's announcement, and how programs' waits went. A system-wide session
//! listens on a Unix socket under the abstract name `tracer_common::SESSION_SOCKET`: a
//! rewritten program without a session descriptor connects to it at its first record;
//! connected (`USER_SESSION`), it waits there until the tracer has attached its binary,
//! so that a program which starts and ends between two looks of the tracer still
//! delivers its records. `record -- CMD` listens there too when the name is free,
//! holding only the command's descendants (a program whose descriptor a `close_fds`
//! took away). A connection is held for at most `HOLD` (attaching takes milliseconds to
//! seconds; a program the tracer cannot attach, such as a guest of qemu-user, waits no
//! longer than that); ending the session closes them all, and an abstract name leaves
//! nothing behind when the tracer dies. Each wait ends with one byte from the program (attached, or
//! gave up): the programs that waited in vain are the books' "lost before attach".

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tracer_common::{ATTACH_DONE, ATTACH_GAVE_UP, SESSION_SOCKET};

/// How often the holder looks for new connections and closed ones.
const POLL_MS: i32 = 20;
/// How long a connection is held: as long as a program waits (`ATTACH_POLLS`).
const HOLD: Duration = Duration::from_secs(10);
/// How far up the parent chain a connecting process is looked for in a command's family.
const MAX_DEPTH: usize = 64;

/// Holds the listening socket and its connections while alive, and hears how the waits
/// went (`tracer_common::ATTACH_DONE`, `ATTACH_GAVE_UP`).
pub struct Announcement {
    stop: Arc<AtomicBool>,
    holder: Option<JoinHandle<u64>>,
}

impl Announcement {
    /// A system-wide session: listen under the session name (an error if another
    /// session already does) and hold every program that connects.
    pub fn system_wide() -> io::Result<Self> {
        Self::start(Some(listen()?), None, None)
    }

    /// `record -- CMD`: read the outcomes the command's programs send on `session` (its
    /// end of their USER_DRAIN_FD), and, if the name is free, also hold the programs of
    /// the command's family (descendants of `root`) that lost that descriptor (a
    /// `close_fds` or `closefrom` on the way); anyone else is let go at once.
    pub fn command(session: OwnedFd, root: u32) -> io::Result<Self> {
        let listener = listen()
            .map_err(|e| {
                log::info!("programs that close their descriptors are not waited for: {e}")
            })
            .ok();
        Self::start(listener, Some(session), Some(root))
    }

    fn start(
        listener: Option<OwnedFd>,
        session: Option<OwnedFd>,
        root: Option<u32>,
    ) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let holder = std::thread::Builder::new()
            .name("utrace-announce".into())
            .spawn(move || {
                let mut h = Holder {
                    listener,
                    session,
                    root,
                    held: Vec::new(),
                    unattached: 0,
                };
                h.run(&flag)
            })?;
        Ok(Announcement {
            stop,
            holder: Some(holder),
        })
    }

    /// End the waits (closing the session's ends) and say how many programs waited in
    /// vain: they gave up or were let go before the tracer had attached their binary, so
    /// their records never reached a drain.
    pub fn finish(mut self) -> u64 {
        self.end()
    }

    fn end(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.holder.take().map_or(0, |h| h.join().unwrap_or(0))
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        self.end();
    }
}

fn listen() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket just returned it; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(SESSION_SOCKET) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + SESSION_SOCKET.len()) as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_un of at least `len` bytes.
    if unsafe { libc::bind(sock.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a bound socket of ours.
    if unsafe { libc::listen(sock.as_raw_fd(), 1024) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// A connection being held: since when, and what its program said.
struct Held {
    fd: OwnedFd,
    since: Instant,
    attached: bool,
    gave_up: bool,
}

impl Held {
    /// A program that did not say its binary was attached (or said it gave up).
    fn lost(&self) -> bool {
        self.gave_up || !self.attached
    }
}

struct Holder {
    listener: Option<OwnedFd>,
    session: Option<OwnedFd>,
    root: Option<u32>,
    held: Vec<Held>,
    unattached: u64,
}

impl Holder {
    /// Until `stop`: accept connections and keep each until its program closes it or
    /// `HOLD` has passed; read the outcomes. Returns the programs that waited in vain.
    fn run(&mut self, stop: &AtomicBool) -> u64 {
        while !stop.load(Ordering::Relaxed) {
            let (expired, kept) = std::mem::take(&mut self.held)
                .into_iter()
                .partition(|h| h.since.elapsed() >= HOLD);
            self.held = kept;
            self.let_go(expired);
            let mut fds: Vec<libc::pollfd> = [&self.listener, &self.session]
                .into_iter()
                .map(|f| f.as_ref().map_or(-1, |f| f.as_raw_fd()))
                .chain(self.held.iter().map(|h| h.fd.as_raw_fd()))
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: fds is a valid array of fds.len() pollfd structs (a negative fd is
            // ignored).
            if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) } <= 0 {
                continue;
            }
            if fds[1].revents != 0 {
                self.read_session();
            }
            self.read_held(&fds[2..]);
            if fds[0].revents != 0 {
                self.accept();
            }
        }
        let rest = std::mem::take(&mut self.held);
        self.let_go(rest);
        if let Some(s) = self.session.take() {
            self.unattached += count_gave_up(&s).0;
        }
        self.unattached
    }

    fn let_go(&mut self, gone: Vec<Held>) {
        self.unattached += gone.iter().filter(|h| h.lost()).count() as u64;
    }

    /// The command's shared stream: only give-ups count (a program whose session end
    /// closed sends nothing).
    fn read_session(&mut self) {
        let Some(s) = &self.session else { return };
        let (gave_up, open) = count_gave_up(s);
        self.unattached += gave_up;
        if !open {
            self.session = None;
        }
    }

    fn read_held(&mut self, ready: &[libc::pollfd]) {
        let mut closed = Vec::new();
        for (h, p) in self.held.iter_mut().zip(ready) {
            if p.revents == 0 {
                continue;
            }
            let mut buf = [0u8; 64];
            // SAFETY: reading into a local buffer of its length from our descriptor.
            let n = unsafe { libc::read(h.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                closed.push(h.fd.as_raw_fd());
                continue;
            }
            for &b in &buf[..n as usize] {
                h.attached |= b == ATTACH_DONE;
                h.gave_up |= b == ATTACH_GAVE_UP;
            }
        }
        let (gone, kept) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| closed.contains(&h.fd.as_raw_fd()));
        self.held = kept;
        self.let_go(gone);
    }

    fn accept(&mut self) {
        let Some(l) = &self.listener else { return };
        loop {
            // SAFETY: accepting on our listening socket; the address is not wanted.
            let c = unsafe {
                libc::accept4(
                    l.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if c < 0 {
                break;
            }
            // SAFETY: accept4 just returned it; nothing else owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(c) };
            let ours = match self.root {
                None => true,
                Some(root) => peer_pid(&fd).is_some_and(|pid| descends(pid, root)),
            };
            if ours {
                self.held.push(Held {
                    fd,
                    since: Instant::now(),
                    attached: false,
                    gave_up: false,
                });
            }
        }
    }
}

/// Give-up bytes waiting on a nonblocking read of `s`, and whether it is still open.
fn count_gave_up(s: &OwnedFd) -> (u64, bool) {
    let mut n_gave_up = 0;
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into a local buffer of its length from our descriptor.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return (n_gave_up, false);
        }
        if n < 0 {
            return (n_gave_up, true);
        }
        n_gave_up += buf[..n as usize]
            .iter()
            .filter(|&&b| b == ATTACH_GAVE_UP)
            .count() as u64;
    }
}

/// The process at the other end of a Unix socket.
fn peer_pid(fd: &OwnedFd) -> Option<u32> {
    // SAFETY: ucred is plain data; all zeros is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for getsockopt(SO_PEERCRED) to fill.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

/// Whether `pid` is `root` or one of its descendants (by parent links in /proc).
fn descends(mut pid: u32, root: u32) -> bool {
    for _ in 0..MAX_DEPTH {
        if pid == root {
            return true;
        }
        match parent(pid) {
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

/// The parent of `pid`: the field after the state in /proc/PID/stat (the command name
/// before it may hold spaces and parentheses).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}
