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
//!
//! Any local user can connect here (and any user could have bound the name first:
//! `record --system-wide` then refuses to start, naming who holds it, and the runtime
//! joins only a root or same-user listener). So connections are capped per user
//! (`SO_PEERCRED`) and overall, each refusal counted; running out of descriptors backs
//! off instead of spinning on a listener that stays readable; and a connection counts
//! as lost before attach only once, and only when its process maps an instrumented
//! binary (bare sockets sending `ATTACH_GAVE_UP` do not inflate the books).
//!
//! Figures: a connection is held as long as its program waits, 10 s at most; at most 64 per
//! user and 256 in all (`MAX_HELD_PER_UID`, `MAX_HELD`; refusals counted in the summary).
//! Whether a connection let go without its `ATTACH_DONE` maps an instrumented binary is
//! looked at when it gives up or is let go, never for one that said `ATTACH_DONE`: at most
//! 256 mappings, each opened `O_PATH` through `map_files`, reopened only if a regular file
//! of at most 4 GiB, only its headers and section names read; what a file is remembered by
//! `(st_dev, st_ino)`. The runtime's side of the wait: `tracer-common/src/layout.rs`. Tests:
//! `short_lived::a_system_wide_session_catches_programs_a_script_starts` (a fresh binary
//! each), `trust_runtime::a_squatted_session_name_is_refused_and_ignored`,
//! `a_connection_flood_does_not_blind_a_system_wide_session`,
//! `a_tracer_out_of_descriptors_rests_instead_of_spinning`,
//! `a_mapped_file_with_a_huge_symtab_is_not_read_by_the_announce_holder`.

use std::{
    collections::{HashMap, HashSet},
    fmt, io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tracer_common::{ATTACH_DONE, ATTACH_GAVE_UP, SESSION_SOCKET};

use super::{
    binaries::{self, FileId, HeldFile},
    procdir::ProcDir,
};

/// How often the holder looks for new connections and closed ones.
const POLL_MS: i32 = 20;
/// How long a connection is held: as long as a program waits (`ATTACH_POLLS`).
const HOLD: Duration = Duration::from_secs(10);
/// How far up the parent chain a connecting process is looked for in a command's family.
const MAX_DEPTH: usize = 64;
/// Connections held at once from one user (`SO_PEERCRED` uid): a program holds one
/// while it waits, and until it exits or `HOLD` passes.
pub(super) const MAX_HELD_PER_UID: usize = 64;
/// Connections held at once in all: far below the descriptors the tracer may open.
pub(super) const MAX_HELD: usize = 256;
/// Bytes one connection may send: one outcome per instrumented binary of the process
/// (a program with more than this many is not one we have met).
const MAX_OUTCOME_BYTES: usize = 64;
/// Connections taken per wake-up: one who connects as fast as we refuse does not keep
/// the holder from its other connections.
const ACCEPTS_PER_WAKE: usize = 256;
/// No descriptor left even to refuse a connection: the listener rests this long.
const BACKOFF: Duration = Duration::from_millis(200);
/// Mapped files remembered as instrumented or not, by `(st_dev, st_ino)`.
const MAX_CACHED_FILES: usize = 4096;
/// Mappings of one process looked at for an instrumented binary (the executable and
/// its libraries come first in `maps`; a process with 65k mappings is not looked at
/// whole, in the holder's thread).
const MAX_MAPPINGS_LOOKED: usize = 256;

/// How the programs' waits went, and what the caps turned away.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waits {
    /// Programs that waited in vain: their records never reached a drain.
    pub unattached: u64,
    /// Connections refused: over `MAX_HELD_PER_UID` or `MAX_HELD`, or accepted with no
    /// descriptor to spare (their programs did not wait).
    pub refused: u64,
    /// Of `refused`, those accepted with the spare descriptor (none left otherwise).
    pub refused_no_fd: u64,
}

/// Holds the listening socket and its connections while alive, and hears how the waits
/// went (`tracer_common::ATTACH_DONE`, `ATTACH_GAVE_UP`).
pub(super) struct Announcement {
    stop: Arc<AtomicBool>,
    holder: Option<JoinHandle<Waits>>,
}

impl Announcement {
    /// A system-wide session: listen under the session name (an error if another
    /// session already does) and hold every program that connects.
    pub(super) fn system_wide() -> io::Result<Self> {
        Self::start(Some(listen()?), None, None)
    }

    /// `record -- CMD`: read the outcomes the command's programs send on `session` (its
    /// end of their USER_DRAIN_FD), and, if the name is free, also hold the programs of
    /// the command's family (descendants of `root`) that lost that descriptor (a
    /// `close_fds` or `closefrom` on the way); anyone else is let go at once.
    pub(super) fn command(session: OwnedFd, root: u32) -> io::Result<Self> {
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
                    waits: Waits::default(),
                    spare: spare_fd(),
                    resting_until: None,
                    files: HashMap::new(),
                };
                h.run(&flag)
            })?;
        Ok(Announcement {
            stop,
            holder: Some(holder),
        })
    }

    /// End the waits (closing the session's ends) and say how many programs waited in
    /// vain (they gave up or were let go before the tracer had attached their binary, so
    /// their records never reached a drain) and how many connections were refused.
    pub(super) fn finish(mut self) -> Waits {
        self.end()
    }

    fn end(&mut self) -> Waits {
        self.stop.store(true, Ordering::Relaxed);
        self.holder
            .take()
            .map_or_else(Waits::default, |h| h.join().unwrap_or_default())
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        self.end();
    }
}

fn listen() -> io::Result<OwnedFd> {
    let sock = session_socket()?;
    let (addr, len) = session_addr();
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

/// A nonblocking, close-on-exec Unix stream socket.
fn session_socket() -> io::Result<OwnedFd> {
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
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The abstract address `SESSION_SOCKET` and its length.
fn session_addr() -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(SESSION_SOCKET) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + SESSION_SOCKET.len()) as libc::socklen_t;
    (addr, len)
}

/// A connection being held: whose, since when, and what its program said.
struct Held {
    fd: OwnedFd,
    uid: u32,
    pid: u32,
    since: Instant,
    /// Whether its process maps an instrumented binary: only such a connection can be
    /// a program that waited in vain. Looked at only for a connection that did not
    /// say its binary was attached, once (when it gives up, or is let go).
    instrumented: Option<bool>,
    attached: bool,
    gave_up: bool,
    /// Sent more than a program ever says: not one.
    babbled: bool,
    bytes: usize,
}

impl Held {
    /// Could be a program that waited in vain: it did not say its binary was attached
    /// (or said it gave up). Whether it is one is for its mappings to say.
    fn maybe_lost(&self) -> bool {
        !self.babbled && (self.gave_up || !self.attached)
    }
}

struct Holder {
    listener: Option<OwnedFd>,
    session: Option<OwnedFd>,
    root: Option<u32>,
    held: Vec<Held>,
    waits: Waits,
    /// Kept open to be given up when descriptors run out: one accept to refuse with.
    spare: Option<OwnedFd>,
    /// Out of descriptors: the listener is not polled until then.
    resting_until: Option<Instant>,
    /// Whether a mapped file (`(st_dev, st_ino)`) is instrumented.
    files: HashMap<FileId, bool>,
}

impl Holder {
    /// Until `stop`: accept connections and keep each until its program closes it or
    /// `HOLD` has passed; read the outcomes. Returns the programs that waited in vain.
    fn run(&mut self, stop: &AtomicBool) -> Waits {
        while !stop.load(Ordering::Relaxed) {
            let (expired, kept) = std::mem::take(&mut self.held)
                .into_iter()
                .partition(|h| h.since.elapsed() >= HOLD);
            self.held = kept;
            self.let_go(expired);
            if self.resting_until.is_some_and(|t| Instant::now() >= t) {
                self.resting_until = None;
            }
            let listener = match self.resting_until {
                Some(_) => None,
                None => self.listener.as_ref(),
            };
            let mut fds: Vec<libc::pollfd> = [listener, self.session.as_ref()]
                .into_iter()
                .map(|f| f.map_or(-1, |f| f.as_raw_fd()))
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
            self.waits.unattached += count_gave_up(&s).0;
        }
        self.waits
    }

    fn let_go(&mut self, gone: Vec<Held>) {
        for mut h in gone {
            if self.lost(&mut h) {
                self.waits.unattached += 1;
            }
        }
    }

    /// Whether `h` is a program that waited in vain (its mappings looked at the first
    /// time this is asked, and only if it did not say its binary was attached).
    fn lost(&mut self, h: &mut Held) -> bool {
        if !h.maybe_lost() {
            return false;
        }
        *h.instrumented
            .get_or_insert_with(|| maps_instrumented(h.pid, &mut self.files))
    }

    /// The command's shared stream: only give-ups count (a program whose session end
    /// closed sends nothing).
    fn read_session(&mut self) {
        let Some(s) = &self.session else { return };
        let (gave_up, open) = count_gave_up(s);
        self.waits.unattached += gave_up;
        if !open {
            self.session = None;
        }
    }

    fn read_held(&mut self, ready: &[libc::pollfd]) {
        let mut closed = Vec::new();
        let mut held = std::mem::take(&mut self.held);
        for (h, p) in held.iter_mut().zip(ready) {
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
            // More than a program ever says: not one, let go (and not counted lost).
            h.bytes += n as usize;
            if h.bytes > MAX_OUTCOME_BYTES {
                h.babbled = true;
                closed.push(h.fd.as_raw_fd());
            } else if h.gave_up {
                // While its process is surely there: it just gave up.
                self.lost(h);
            }
        }
        let (gone, kept) = held
            .into_iter()
            .partition(|h| closed.contains(&h.fd.as_raw_fd()));
        self.held = kept;
        self.let_go(gone);
    }

    /// Take every pending connection: hold the ones within the caps (the command's
    /// family only, for `record -- CMD`), refuse the others at once. Out of descriptors,
    /// the spare one refuses a connection; if even that fails, the listener rests.
    fn accept(&mut self) {
        let Some(l) = &self.listener else { return };
        let l = l.as_raw_fd();
        for _ in 0..ACCEPTS_PER_WAKE {
            let fd = match accept_one(l) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) if out_of_descriptors(&e) => {
                    self.refuse_with_spare(l);
                    break;
                }
                Err(_) => break, // EAGAIN: none left
            };
            let Some(cred) = peer_cred(&fd) else {
                continue;
            };
            if let Some(root) = self.root
                && !descends(cred.pid as u32, root)
            {
                continue; // not the command's: let go at once
            }
            if !self.within_caps(cred.uid) {
                self.waits.refused += 1;
                continue;
            }
            self.held.push(Held {
                fd,
                uid: cred.uid,
                pid: cred.pid as u32,
                since: Instant::now(),
                instrumented: None,
                attached: false,
                gave_up: false,
                babbled: false,
                bytes: 0,
            });
        }
    }

    fn within_caps(&self, uid: u32) -> bool {
        self.held.len() < MAX_HELD
            && self.held.iter().filter(|h| h.uid == uid).count() < MAX_HELD_PER_UID
    }

    /// No descriptor left: give up the spare one to accept (and so refuse) one
    /// connection, then take it back; when that fails too, rest the listener.
    fn refuse_with_spare(&mut self, listener: i32) {
        if self.spare.take().is_some() {
            if accept_one(listener).is_ok() {
                self.waits.refused += 1;
                self.waits.refused_no_fd += 1;
            }
            self.spare = spare_fd();
        }
        if self.spare.is_none() {
            log::warn!("session socket: out of descriptors; not accepting for {BACKOFF:?}");
        }
        self.resting_until = Some(Instant::now() + BACKOFF);
    }
}

/// One pending connection of `listener`, nonblocking and close-on-exec.
fn accept_one(listener: i32) -> io::Result<OwnedFd> {
    // SAFETY: accepting on a listening socket of ours; the address is not wanted.
    let c = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if c < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: accept4 just returned it; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(c) })
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// A descriptor held in reserve (on /dev/null).
fn spare_fd() -> Option<OwnedFd> {
    std::fs::File::open("/dev/null").ok().map(OwnedFd::from)
}

/// Whether process `pid` maps a file with the rewriter's note (`.note.utrace`). At
/// most `MAX_MAPPINGS_LOOKED` mappings are looked at; each file is opened as `O_PATH`
/// through `/proc/PID/map_files` (the mapped inode itself; a mapped device is never
/// opened for real) and, if a regular file of bounded size, only its headers and
/// section names are read, each bounded (`binaries::has_utrace_note`). What a file is
/// is remembered by `(st_dev, st_ino)`.
fn maps_instrumented(pid: u32, files: &mut HashMap<FileId, bool>) -> bool {
    let Ok(proc) = ProcDir::open(pid) else {
        return false;
    };
    let Ok(maps) = binaries::mappings_of(&proc) else {
        return false;
    };
    let mut looked = HashSet::new();
    for m in maps
        .iter()
        .filter(|m| m.inode != 0 && looked.insert((m.dev, m.inode)))
        .take(MAX_MAPPINGS_LOOKED)
    {
        let Ok(at) = proc.map_file(m.start, m.end) else {
            continue;
        };
        if instrumented_file(&at, files) {
            return true;
        }
    }
    false
}

/// Whether the file `at` (`O_PATH`) has the rewriter's note; remembered in `files`.
fn instrumented_file(at: &std::fs::File, files: &mut HashMap<FileId, bool>) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = at.metadata() else {
        return false;
    };
    let key = FileId {
        dev: md.dev(),
        ino: md.ino(),
    };
    if let Some(&known) = files.get(&key) {
        return known;
    }
    let known = HeldFile::reopen(at, binaries::MAX_BINARY_BYTES)
        .is_ok_and(|f| binaries::has_utrace_note(&f));
    if files.len() >= MAX_CACHED_FILES {
        files.clear();
    }
    files.insert(key, known);
    known
}

/// Who holds the session name: the credentials its listener had when it called
/// `listen`, and its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NameHolder {
    pub pid: u32,
    pub uid: u32,
    pub user: Option<String>,
    pub command: Option<String>,
}

impl fmt::Display for NameHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {}", self.pid)?;
        if let Some(c) = &self.command {
            write!(f, " ({c})")?;
        }
        write!(f, " of user {}", self.uid)?;
        if let Some(u) = &self.user {
            write!(f, " ({u})")?;
        }
        Ok(())
    }
}

/// Whoever listens under the session name, found by connecting to it (`SO_PEERCRED`).
pub(super) fn name_holder() -> Option<NameHolder> {
    let sock = session_socket().ok()?;
    let (addr, len) = session_addr();
    // SAFETY: addr is a valid sockaddr_un of at least `len` bytes.
    if unsafe { libc::connect(sock.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return None;
    }
    let cred = peer_cred(&sock)?;
    let pid = cred.pid as u32;
    Some(NameHolder {
        pid,
        uid: cred.uid,
        user: user_name(cred.uid),
        command: std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| c.trim_end().to_string()),
    })
}

/// The account name of `uid` in /etc/passwd.
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
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

/// The process at the other end of a Unix socket, and its effective uid (as it was
/// when that end was made).
fn peer_cred(fd: &OwnedFd) -> Option<libc::ucred> {
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
    (r == 0 && cred.pid > 0).then_some(cred)
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
