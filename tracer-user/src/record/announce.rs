//! The system-wide session's announcement: a listening Unix socket under the abstract
//! name `tracer_common::SESSION_SOCKET`. A rewritten program that was not started by a
//! session connects to it at its first record; connected (`USER_SESSION`), it waits
//! there until the tracer has attached its binary, so that a program which starts and
//! ends between two looks of the tracer still delivers its records. A connection is
//! held for at most `HOLD` (attaching takes milliseconds; a program the tracer cannot
//! attach, such as a guest of qemu-user, waits no longer than that); ending the
//! session closes them all, and an abstract name leaves nothing behind when the
//! tracer dies.

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

use tracer_common::SESSION_SOCKET;

/// How often the holder looks for new connections and closed ones.
const POLL_MS: i32 = 20;
/// How long a connection is held.
const HOLD: Duration = Duration::from_millis(500);

/// Holds the listening socket and its connections while alive.
pub struct Announcement {
    stop: Arc<AtomicBool>,
    holder: Option<JoinHandle<()>>,
}

impl Announcement {
    /// Listen under the session name; an error if another session already does.
    pub fn start() -> io::Result<Self> {
        let listener = listen()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let holder = std::thread::Builder::new()
            .name("utrace-announce".into())
            .spawn(move || hold(&listener, &flag))?;
        Ok(Announcement {
            stop,
            holder: Some(holder),
        })
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.holder.take() {
            let _ = h.join();
        }
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

/// Accept connections and keep each until its program closes it, `HOLD` has passed,
/// or `stop`.
fn hold(listener: &OwnedFd, stop: &AtomicBool) {
    let mut held: Vec<(OwnedFd, Instant)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        held.retain(|(_, since)| since.elapsed() < HOLD);
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener)
            .chain(held.iter().map(|(f, _)| f))
            .map(|f| libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of fds.len() pollfd structs.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) } <= 0 {
            continue;
        }
        // The programs never write: anything readable on a connection is its end.
        let mut i = 0;
        held.retain(|_| {
            i += 1;
            fds[i].revents == 0
        });
        if fds[0].revents != 0 {
            loop {
                // SAFETY: accepting on our listening socket; the address is not wanted.
                let c = unsafe {
                    libc::accept4(
                        listener.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                };
                if c < 0 {
                    break;
                }
                // SAFETY: accept4 just returned it; nothing else owns it.
                held.push((unsafe { OwnedFd::from_raw_fd(c) }, Instant::now()));
            }
        }
    }
}
