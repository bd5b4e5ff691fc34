//! `tracer record --user -- CMD`: the user-space drain, no eBPF and no privileges.
//!
//! The command gets one end of a `SOCK_SEQPACKET` socket pair as descriptor
//! `USER_DRAIN_FD`. The injected code notices it at a thread's first record and then
//! sends every full buffer there (`sendmsg`, one message per ≤ 1024 records, a
//! `ChunkHeader` in front) instead of going through the flush uprobe, plus one
//! `CHUNK_KIND_SLOT` message per slot it claims. What is still buffered when a thread
//! exits is collected here: the tracer ptrace-seizes the command (its own child, so no
//! privilege is needed) with `PTRACE_O_TRACEEXIT`, and at each exit stop reads the
//! thread's slots with `process_vm_readv`, then tombstones them with
//! `process_vm_writev` so that a new thread reusing the thread pointer registers afresh.
//!
//! Everything runs on one thread: the socket is always emptied before an exit is
//! handled, so a thread's last records follow its earlier ones in the file.
//!
//! What the command sends is believed only as far as the kernel vouches for it (the
//! tracer may be root, the command another user's program): each message carries the
//! sender's pid in `SCM_CREDENTIALS` (`SO_PASSCRED`), which must be the pid its header
//! names and a process the tracer holds seized ([`Seized`]: the command and its
//! descendants, as ptrace reported them); a slot's thread must be one of its seized
//! threads. Memory is
//! read and written only in such threads' processes: a seized task is not reaped
//! until the tracer waits for it, so its id cannot name another process meanwhile.
//! A slot's buffer is read only as large as its binary's metadata makes buffers.
//! An exec drops every slot its process announced (the addresses were the old
//! image's), and a process that exec'ed an image its user may not read (setuid,
//! setgid, file capabilities, not dumpable) is sealed: nothing it sends is believed
//! and its memory is never read or written.
//!
//! A slot of a binary the command line did not name (qemu-user's guest program, a
//! `dlopen`ed library) makes the tracer look at the process's mappings and describe
//! the instrumented binaries it finds there, so `--binary` is only needed where the
//! mapping cannot be found.
//!
//! The runtime's side (discovery, the messages): `tracer-common/src/layout.rs`, "The
//! user-space drain". At an exit stop memory is accessed through the stopped thread, not the
//! process id: the group leader may be past `exit_mm`. When the thread is not leaving alone
//! (its `/proc/TID/syscall` is not `exit`: `exit_group`, a fatal signal, exec), the slots of
//! every other thread of the process are collected at the same stop, since the kernel skips
//! the exit stop of a thread with SIGKILL pending. A records message's tid is only a label
//! (a forked child flushes a buffer its parent's thread owns). Bounds: at most 256 slots per
//! thread and 4,096 mapping scans per session; refused messages are counted and the count
//! said at the end (`target_data.rs` `check_sender`, `slot_span_within`; tests
//! `trust_userdrain::*`).
//!
//! qemu-user: `tracer record --user -- qemu-aarch64 -L /usr/aarch64-linux-gnu ./prog.traced`
//! traces an AArch64 program on an x86-64 host. The command (qemu) is not instrumented; the
//! first slot of an unknown binary makes the tracer read the process's mappings and describe
//! the instrumented files mapped there (binary and load sections), and `--binary` names one
//! up front (its metadata goes into the trace file; a file without `.note.utrace` is an
//! error). qemu 7.2 maps the guest at guest_base 0, so guest addresses are host addresses for
//! `process_vm_readv`; guest threads are host threads (same tids), and the ptrace exit stops
//! of qemu's threads are the guest threads' exits. Time stamps are qemu's emulated
//! `cntvct_el0` converted with the host's TSC calibration: order within a thread holds,
//! absolute times mean little.
//!
//! Limits. Under qemu-user a guest `pthread_join` returns as soon as qemu clears the child
//! tid, before the host thread exits: glibc's stack cache can then give the joined thread's
//! thread pointer (and so its slot, still keyed by it) to a new thread before the tracer
//! has collected the old one at its exit stop, and that slot's records may be duplicated or
//! lost (natively the kernel clears the tid after the exit stop; the qemu churn test gives
//! each thread its own stack). Every signal delivered to the command is a ptrace
//! signal-delivery stop that this loop (a socket poll with a 5 ms timeout, then `waitpid`)
//! must resume, so a signal-heavy program (the SIGALRM storm of `tests/tests/signals.rs`)
//! crawls under `--user`; that test runs with eBPF only.
//!
//! Sealing: a process counts as having exec'ed an image its user may not read when its ids
//! are not all alike or it is not dumpable (its `/proc/PID` is not owned by its euid).

use std::{
    collections::{HashMap, HashSet},
    io,
    os::fd::{AsRawFd, OwnedFd},
};

use anyhow::{Context, Result};
use tracer_common::{
    BUF_TRACE, CAUSE_THREAD_EXIT, CHUNK_HEADER_BYTES, CHUNK_KIND_RECORDS, ChunkHeader,
    KEY_TOMBSTONE, RECORD_SIZE, RWH_BUF_KIND, SLOT_SIZE, Slot, USER_MSG_RECORDS,
};

use super::{
    duration::{DurationCounts, DurationFilter},
    remote::{event_msg, ptrace, read_mem, write_mem},
    target_data::{
        Message, Refused, SlotSpan, check_sender, check_slot_owner, encode_records, parse_message,
        slot_span_within,
    },
};
use crate::{
    record::host::clock,
    tracefile::{BinaryInfo, Writer, encode_load},
};

/// Largest message: header + USER_MSG_RECORDS records (bigger means a bad sender).
const MAX_MSG: usize = CHUNK_HEADER_BYTES + USER_MSG_RECORDS as usize * RECORD_SIZE;
/// Slots one thread may have listed: one per binary it records in, far fewer than this.
const MAX_SLOTS_PER_THREAD: usize = 256;
/// Looks at a process's mappings for binaries of unknown ids, per session.
const MAX_MAPPING_SCANS: usize = 4096;

/// A slot a thread announced: (process, slot address).
type SlotRef = (u32, u64);

/// The tasks the tracer holds ptrace-seized (the command and its descendants): thread
/// id → process id. A task enters when ptrace first reports it and leaves when the
/// tracer reaps it, so an id listed here is never another process's.
#[derive(Default)]
struct Seized(HashMap<u32, u32>);

impl Seized {
    /// Task `tid`, reported by ptrace (stopped, or at its first stop).
    fn add(&mut self, tid: u32) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.0.entry(tid) {
            e.insert(tgid_of(tid).unwrap_or(tid));
        }
    }
    fn tgid(&self, tid: u32) -> Option<u32> {
        self.0.get(&tid).copied()
    }
    /// Whether process `pid` is held: its leader is, since the kernel reports a group
    /// leader's exit (and lets it be reaped) only after every other thread's.
    fn holds_process(&self, pid: u32) -> bool {
        self.tgid(pid) == Some(pid)
    }
}

/// Messages not believed, by reason (see [`Refused`]).
#[derive(Default)]
struct RefusedCount {
    no_credentials: u64,
    not_the_sender: u64,
    not_seized: u64,
    /// Slots past [`MAX_SLOTS_PER_THREAD`] of one thread.
    too_many_slots: u64,
    /// From a process whose image the user may not read ([`State::sealed`]).
    sealed: u64,
}

impl RefusedCount {
    fn add(&mut self, why: Refused) {
        match why {
            Refused::NoCredentials => self.no_credentials += 1,
            Refused::NotTheSender => self.not_the_sender += 1,
            Refused::NotSeized => self.not_seized += 1,
        }
    }
    fn total(&self) -> u64 {
        self.no_credentials
            + self.not_the_sender
            + self.not_seized
            + self.too_many_slots
            + self.sealed
    }
}

struct State {
    writer: Writer,
    /// How to find the instrumented binaries a process maps.
    mapped_in: FindMapped,
    /// Binaries the file describes (`binary_id`), in ordinal order: those the command
    /// names, then those found mapped when a slot of an unknown one registers (the
    /// guest program of qemu-user).
    binaries: Vec<u64>,
    /// binary_id → bytes of one of its buffers (its metadata's geometry).
    buf_bytes: HashMap<u64, u64>,
    /// tid → the slots it registered.
    slots: HashMap<u32, Vec<SlotRef>>,
    seized: Seized,
    /// Processes whose image, since their last exec, the user may not read (setuid,
    /// setgid, file capabilities, not dumpable): their messages are refused and their
    /// memory is never read or written. A root tracer's ptrace would let it.
    sealed: HashSet<u32>,
    /// (process, binary id) pairs whose mappings were looked at.
    scanned: HashSet<(u32, u64)>,
    refused: RefusedCount,
    /// `--min-duration`.
    duration: Option<DurationFilter>,
    /// Records taken out of buffers (before the duration filter).
    produced: u64,
    records: u64,
    chunks: u64,
    bad: u64,
    threads: HashSet<(u32, u32)>,
    buf: Vec<u8>,
}

/// A binary the drain's file describes, as the drain needs it.
pub(crate) struct Found {
    /// What the file says of it (the drain sets its ordinal).
    pub info: BinaryInfo,
    /// The bytes of one of its buffers (its metadata's geometry).
    pub buf_bytes: u64,
}

/// The instrumented binaries process `pid` maps, each with its load bias: the session's
/// discovery, handed in so that the drain stays below the session.
pub(crate) type FindMapped = Box<dyn FnMut(u32) -> Vec<(Found, u64)>>;

/// What the drain took out of the buffers, for the file's stats and the summary.
pub(crate) struct Drained {
    pub writer: Writer,
    /// Records taken out of buffers; `records` of them were written.
    pub produced: u64,
    /// What the duration filter counted (all 0 without one).
    pub duration: DurationCounts,
    pub records: u64,
    pub chunks: u64,
    pub bad_entries: u64,
    pub threads: HashSet<(u32, u32)>,
    /// The command's exit code.
    pub exit_code: i32,
}

/// The user drain of one command, from before it runs until every task it made is gone.
pub(crate) struct UserDrain {
    st: State,
}

impl UserDrain {
    /// A drain writing to `writer`, which describes `known` binaries already ((binary id,
    /// buffer bytes), in ordinal order), through the duration filter if any.
    pub(crate) fn new(
        writer: Writer,
        known: &[(u64, u64)],
        mapped_in: FindMapped,
        duration: Option<DurationFilter>,
    ) -> UserDrain {
        let st = State {
            writer,
            mapped_in,
            binaries: known.iter().map(|&(id, _)| id).collect(),
            buf_bytes: known.iter().copied().collect(),
            slots: HashMap::new(),
            seized: Seized::default(),
            sealed: HashSet::new(),
            scanned: HashSet::new(),
            refused: RefusedCount::default(),
            duration,
            produced: 0,
            records: 0,
            chunks: 0,
            bad: 0,
            threads: HashSet::new(),
            buf: vec![0u8; MAX_MSG + 1],
        };
        UserDrain { st }
    }

    /// The command `pid`, [`seize`]d before it runs: held from the start.
    pub(crate) fn hold(&mut self, pid: u32) {
        self.st.seized.add(pid);
    }

    /// Serve `sock` and the ptrace stops until every task of the command `main` is gone.
    pub(crate) fn serve(self, sock: &OwnedFd, main: u32) -> Result<Drained> {
        let mut st = self.st;
        let exit_code = run(&mut st, sock, main)?;
        st.drain_socket(sock)?;
        if !st.slots.is_empty() {
            // Threads whose exit the tracer never saw with their memory still readable
            // (e.g. killed from outside, which skips every exit stop).
            eprintln!(
                "utrace: warning: the records left in the buffers of {} threads at their exit could not be collected",
                st.slots.len()
            );
        }
        st.report_refused();
        Ok(Drained {
            writer: st.writer,
            produced: st.produced,
            duration: st.duration.map(|d| d.counts).unwrap_or_default(),
            records: st.records,
            chunks: st.chunks,
            bad_entries: st.bad,
            threads: st.threads,
            exit_code,
        })
    }
}

/// Have the kernel attach the sender's credentials to every message read from `sock`.
pub(crate) fn pass_credentials(sock: &OwnedFd) -> Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a valid int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error()).context("setsockopt(SO_PASSCRED)");
    }
    Ok(())
}

/// One message from `sock` into `buf`: its length (0: every sender is gone) and the
/// sending process as the kernel saw it (`SCM_CREDENTIALS`), or None when no message
/// is waiting.
fn recv_with_sender(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<(usize, Option<u32>)>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one SCM_CREDENTIALS, 8-aligned as cmsghdr wants.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    loop {
        // SAFETY: msg points at our iovec and control buffer, both live and sized.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(Some((n as usize, sender_of(&msg))));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// The pid of `SCM_CREDENTIALS` in a received message's control data.
fn sender_of(msg: &libc::msghdr) -> Option<u32> {
    // SAFETY: msg's control buffer was filled by recvmsg; the CMSG macros stay within
    // msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_CREDENTIALS
                && (*c).cmsg_len as usize
                    >= libc::CMSG_LEN(size_of::<libc::ucred>() as u32) as usize
            {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                // 0: the sender is outside our pid namespace or already gone.
                return (cred.pid > 0).then_some(cred.pid as u32);
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

/// Seize the command `pid` (before it runs), following what it starts.
pub(crate) fn seize(pid: u32) -> Result<()> {
    let opts = libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_TRACEEXIT
        | libc::PTRACE_O_EXITKILL;
    ptrace(libc::PTRACE_SEIZE, pid, opts as usize)
        .with_context(|| format!("cannot ptrace the command (pid {pid}); is ptrace restricted?"))
}

/// Serve the socket and the ptrace stops until every traced task is gone; returns the
/// command's exit code.
fn run(st: &mut State, sock: &OwnedFd, main: u32) -> Result<i32> {
    let mut exit_code = None;
    loop {
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. A timeout or EINTR just means "look again".
        unsafe { libc::poll(&mut p, 1, 5) };
        st.drain_socket(sock)?;
        st.writer.checkpoint_if_due()?;
        loop {
            let mut status = 0;
            // SAFETY: status is a valid out-pointer.
            let tid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if tid == 0 {
                break;
            }
            if tid < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ECHILD) {
                    return exit_code.context("the command's exit status was never seen");
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e).context("waitpid");
            }
            let tid = tid as u32;
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                // waitpid has reaped the task: its id is free, but the kernel hands
                // pids out cyclically, so not again at once. What it sent before dying
                // is in the socket already: read it while the id still counts as
                // seized, then forget the id.
                st.drain_socket(sock)?;
                st.seized.0.remove(&tid);
                if tid == main {
                    exit_code = Some(if libc::WIFEXITED(status) {
                        libc::WEXITSTATUS(status)
                    } else {
                        128 + libc::WTERMSIG(status)
                    });
                }
                continue;
            }
            if libc::WIFSTOPPED(status) {
                st.stopped(sock, tid, status)?;
            }
        }
    }
}

impl State {
    /// Task `tid` stopped (`status`): follow what it did, collect its slots at its
    /// exit, and let it go on.
    fn stopped(&mut self, sock: &OwnedFd, tid: u32, status: i32) -> Result<()> {
        self.seized.add(tid);
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if event == libc::PTRACE_EVENT_EXEC {
            // What the old image announced is in the socket already: take it in
            // before its slots are dropped, so none is listed after.
            self.drain_socket(sock)?;
        }
        self.follow(tid, event);
        let r = if event == libc::PTRACE_EVENT_EXIT {
            // Its earlier messages are in the socket already (sendmsg returned).
            self.drain_socket(sock)?;
            self.collect_exiting(tid)?;
            ptrace(libc::PTRACE_CONT, tid, 0)
        } else if event == libc::PTRACE_EVENT_STOP {
            match sig {
                libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => {
                    ptrace(libc::PTRACE_LISTEN, tid, 0)
                }
                _ => ptrace(libc::PTRACE_CONT, tid, 0),
            }
        } else if event != 0 {
            ptrace(libc::PTRACE_CONT, tid, 0)
        } else {
            // A signal on its way to the task: deliver it.
            ptrace(libc::PTRACE_CONT, tid, sig as usize)
        };
        // ESRCH: the task was killed meanwhile (SIGKILL, exit_group).
        if let Err(e) = r
            && e.raw_os_error() != Some(libc::ESRCH)
        {
            return Err(e).context(format!("ptrace(CONT) of {tid}"));
        }
        Ok(())
    }

    /// Keep [`Seized`] up to date at a ptrace event stop of `tid`.
    fn follow(&mut self, tid: u32, event: i32) {
        match event {
            libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                // The new task is seized already (auto-attached) and stays stopped
                // until the tracer has seen it; its id is ours from now on.
                if let Ok(new) = event_msg(tid) {
                    let new = new as u32;
                    self.seized.add(new);
                    // A new process shares its parent's image (and dumpability).
                    let parent = self.seized.tgid(tid).unwrap_or(tid);
                    if let Some(pid) = self.seized.tgid(new).filter(|&p| p != parent) {
                        if self.sealed.contains(&parent) {
                            self.sealed.insert(pid);
                        } else {
                            self.sealed.remove(&pid);
                        }
                    }
                }
            }
            libc::PTRACE_EVENT_EXEC => {
                // A thread other than the leader exec'ed: it took the leader's id and
                // its own is gone.
                if let Ok(former) = event_msg(tid)
                    && former as u32 != tid
                {
                    self.seized.0.remove(&(former as u32));
                }
                self.exec_done(self.seized.tgid(tid).unwrap_or(tid));
            }
            _ => {}
        }
    }

    /// Process `pid` (stopped at its exec event) runs a new image: every slot address
    /// it announced was the old image's, and may now point into anything (a setuid
    /// program's data). Forget them, and seal the process if the user may not read
    /// the new image.
    fn exec_done(&mut self, pid: u32) {
        let mut dropped = 0;
        self.slots.retain(|_, list| {
            let before = list.len();
            list.retain(|&(p, _)| p != pid);
            dropped += before - list.len();
            !list.is_empty()
        });
        self.scanned.retain(|&(p, _)| p != pid);
        if let Some(d) = self.duration.as_mut() {
            // The old image's open calls never return.
            d.forget_process(pid);
        }
        if dropped > 0 {
            log::debug!("process {pid} exec'ed: {dropped} slots of its old image dropped");
        }
        if image_readable_by_user(pid) {
            self.sealed.remove(&pid);
        } else {
            log::info!("process {pid} exec'ed an image its user may not read: not drained");
            self.sealed.insert(pid);
        }
    }

    /// Read every message waiting in the socket.
    fn drain_socket(&mut self, sock: &OwnedFd) -> Result<()> {
        loop {
            let Some((n, sender)) =
                recv_with_sender(sock, &mut self.buf).context("recv from the user-space drain")?
            else {
                return Ok(());
            };
            if n == 0 {
                return Ok(()); // every sender is gone
            }
            let msg = self.buf[..n].to_vec();
            self.message(&msg, sender)?;
        }
    }

    fn message(&mut self, msg: &[u8], sender: Option<u32>) -> Result<()> {
        let parsed = parse_message(msg);
        let header = match &parsed {
            Message::Slot(h, _) | Message::Records(h, _) => *h,
            Message::Bad => {
                self.bad += 1;
                return Ok(());
            }
        };
        let held = sender.is_some_and(|p| self.seized.holds_process(p));
        let believed = check_sender(&header, sender, held).and_then(|()| match parsed {
            Message::Slot(..) => check_slot_owner(&header, self.seized.tgid(header.tid)),
            _ => Ok(()),
        });
        if let Err(why) = believed {
            log::debug!(
                "refused a message naming {}/{} from pid {sender:?}: {why:?}",
                header.pid,
                header.tid
            );
            self.refused.add(why);
            return Ok(());
        }
        if self.sealed.contains(&header.pid) {
            self.refused.sealed += 1;
            return Ok(());
        }
        match parsed {
            Message::Slot(h, slot) => self.slot_claimed(h, slot),
            Message::Records(mut h, records) => {
                // The drain's clock sample (see ChunkHeader::time): the moment it arrived.
                h.time = clock::monotonic_ns();
                self.records_out(h, records)
            }
            Message::Bad => Ok(()),
        }
    }

    /// Seized thread `h.tid` of process `h.pid` claimed the slot at `slot`.
    fn slot_claimed(&mut self, h: ChunkHeader, slot: u64) -> Result<()> {
        let list = self.slots.entry(h.tid).or_default();
        if !list.contains(&(h.pid, slot)) {
            if list.len() >= MAX_SLOTS_PER_THREAD {
                self.refused.too_many_slots += 1;
                return Ok(());
            }
            list.push((h.pid, slot));
        }
        if !self.binaries.contains(&h.binary_id)
            && self.scanned.len() < MAX_MAPPING_SCANS
            && self.scanned.insert((h.pid, h.binary_id))
        {
            self.find_mapped(h.pid)?;
        }
        Ok(())
    }

    /// Say how many messages were not believed.
    fn report_refused(&self) {
        let r = &self.refused;
        if r.total() == 0 {
            return;
        }
        eprintln!(
            "utrace: warning: {} messages of the traced programs refused: {} naming another \
             process than their sender, {} from a process or thread not traced, {} without credentials, \
             {} slots past {MAX_SLOTS_PER_THREAD} per thread, {} from a process whose image the user may not read",
            r.total(),
            r.not_the_sender,
            r.not_seized,
            r.no_credentials,
            r.too_many_slots,
            r.sealed
        );
    }

    /// A slot of a binary the file does not describe yet registered in process `pid`:
    /// describe the instrumented binaries it maps (qemu-user maps its guest program
    /// like any file), each with its load bias.
    fn find_mapped(&mut self, pid: u32) -> Result<()> {
        for (found, bias) in (self.mapped_in)(pid) {
            let id = found.info.binary_id;
            if self.binaries.contains(&id) {
                continue;
            }
            log::info!("found {} mapped in process {pid}", found.info.path);
            self.buf_bytes.insert(id, found.buf_bytes);
            let info = BinaryInfo {
                ordinal: self.binaries.len() as u32,
                ..found.info
            };
            if let (Some(d), Ok(meta)) = (self.duration.as_mut(), info.metadata())
                && let Err(mode) = d.add_binary(id, &meta)
            {
                log::warn!(
                    "{}: rewritten with --time {}: --min-duration cannot judge its calls; they all pass",
                    info.path,
                    mode.name()
                );
            }
            self.writer.write_binary(&info)?;
            self.writer.write_raw(&encode_load(pid, id, bias))?;
            self.binaries.push(id);
        }
        Ok(())
    }

    /// Write records as chunk sections of at most CHUNK_RECORDS (what readers expect).
    fn records_out(&mut self, h: ChunkHeader, records: &[u8]) -> Result<()> {
        let whole = records.len() - records.len() % RECORD_SIZE;
        self.produced += (whole / RECORD_SIZE) as u64;
        let kept;
        let records = match self.duration.as_mut() {
            Some(d) => {
                let pid_tid = (u64::from(h.pid) << 32) | u64::from(h.tid);
                kept = d.filter(pid_tid, h.binary_id, &records[..whole]);
                &kept[..]
            }
            None => records,
        };
        let mut out = Vec::new();
        let n = encode_records(h, records, &mut out);
        self.records += n.records;
        self.chunks += n.chunks;
        self.bad += n.bad;
        self.threads.insert((h.pid, h.tid));
        self.writer.write_raw(&out)
    }

    /// Thread `tid` stopped on its way out: deliver what its slots still hold, then
    /// release them.
    ///
    /// When the thread is not leaving alone (exit_group, a fatal signal, exec), the
    /// other threads of its process are dying too, and they may never stop at their
    /// own exit: the kernel skips the exit stop of a thread with SIGKILL pending. Their
    /// slots are collected now, while this stopped thread keeps the memory mapped.
    /// This matters under qemu-user, where a guest `pthread_join` returns before the
    /// joined host thread has exited, so `exit_group` regularly overtakes it.
    fn collect_exiting(&mut self, tid: u32) -> Result<()> {
        self.collect_thread(tid, tid)?;
        if exits_alone(tid) {
            return Ok(());
        }
        log::debug!("thread {tid} takes its process with it: collecting the other threads");
        let Some(pid) = self.seized.tgid(tid) else {
            return Ok(());
        };
        let doomed: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, list)| list.iter().any(|&(p, _)| p == pid))
            .map(|(&t, _)| t)
            .collect();
        for t in doomed {
            self.collect_thread(t, tid)?;
        }
        Ok(())
    }

    /// Deliver and release the slots of thread `tid`, reading memory through thread
    /// `via` (stopped, same process) or else the process id. Not the process id first:
    /// the thread group leader may be past its exit_mm already while `via` still has
    /// the mm. And not `via` alone: a SIGKILL (another thread's exit_group) wakes a
    /// thread out of its exit stop, and it may then drop its mm before we read. A slot
    /// that cannot be read stays listed, for a later stop of another thread of the
    /// process (see `collect_exiting`).
    fn collect_thread(&mut self, tid: u32, via: u32) -> Result<()> {
        let Some(list) = self.slots.remove(&tid) else {
            return Ok(());
        };
        let mut unread = Vec::new();
        for (pid, addr) in list {
            if self.sealed.contains(&pid) {
                continue; // listed before the exec that sealed it: never touched
            }
            let mut raw = [0u8; SLOT_SIZE as usize];
            // Only through tasks still held, of the process that claimed the slot.
            let Some(through) = [via, pid]
                .into_iter()
                .filter(|&t| self.seized.tgid(t) == Some(pid))
                .find(|&t| read_mem(t, addr, &mut raw).is_ok())
            else {
                log::debug!("thread {tid}: cannot read its slot at {addr:#x} yet");
                unread.push((pid, addr));
                continue;
            };
            // SAFETY: Slot is repr(C) plain data of exactly SLOT_SIZE bytes.
            let slot: Slot = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
            // A circular buffer is collected whole, oldest record first.
            let mut kind = [0u8; 4];
            let ring = read_mem(through, slot.rw_base + RWH_BUF_KIND, &mut kind).is_ok()
                && u32::from_le_bytes(kind) != BUF_TRACE;
            // A binary the file does not describe has no geometry to believe.
            let max = self.buf_bytes.get(&slot.binary_id).copied().unwrap_or(0);
            let (bytes, rotate) = match slot_span_within(&slot, tid, ring, max) {
                SlotSpan::NotOwned => {
                    log::debug!(
                        "thread {tid}: slot {addr:#x} now owned by {}",
                        slot.owner_tid
                    );
                    continue; // claimed by another thread since
                }
                SlotSpan::Bad => {
                    self.bad += 1;
                    continue;
                }
                SlotSpan::Collect { bytes, rotate } => (bytes, rotate),
            };
            log::debug!(
                "thread {tid}: slot {addr:#x} holds {} records (read through {through})",
                bytes / RECORD_SIZE as u64
            );
            if bytes > 0 {
                let mut records = vec![0u8; bytes as usize];
                if let Err(e) = read_mem(through, slot.start, &mut records) {
                    log::debug!("thread {tid}: cannot read its buffer yet: {e}");
                    unread.push((pid, addr));
                    continue;
                }
                records.rotate_left(rotate as usize);
                let h = ChunkHeader::new(
                    CHUNK_KIND_RECORDS,
                    (u64::from(pid) << 32) | u64::from(tid),
                    slot.binary_id,
                    CAUSE_THREAD_EXIT,
                    clock::monotonic_ns(),
                );
                self.records_out(h, &records)?;
            }
            // Release: key = tombstone, cur = start (the first two words).
            let mut release = [0u8; 16];
            release[..8].copy_from_slice(&KEY_TOMBSTONE.to_le_bytes());
            release[8..].copy_from_slice(&slot.start.to_le_bytes());
            let _ = write_mem(through, addr, &release);
        }
        if unread.is_empty() {
            if let Some(d) = self.duration.as_mut() {
                d.forget_thread(tid);
            }
        } else {
            self.slots.insert(tid, unread);
        }
        Ok(())
    }
}

/// Whether thread `tid`, stopped at its exit, is leaving by the `exit` system call
/// (its process lives on) rather than by exit_group, a fatal signal or exec. Unknown
/// (no /proc entry) counts as alone.
fn exits_alone(tid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tid}/syscall")) else {
        return true;
    };
    // "NR arg1 ... sp pc", "-1 sp pc" outside a system call, or "running".
    text.split_whitespace()
        .next()
        .and_then(|nr| nr.parse::<i64>().ok())
        .is_none_or(|nr| nr == libc::SYS_exit)
}

/// Whether the user the command runs as may read process `pid`'s current image, as the
/// kernel would judge it for that user (a root tracer's ptrace is not limited so): all
/// its user ids alike and all its group ids alike (no setuid or setgid exec), and its
/// image dumpable, which /proc shows by owning the process's directory by its euid
/// rather than by root (a file-capabilities or unreadable executable). Unknown counts
/// as not readable.
fn image_readable_by_user(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let ids = |key: &str| -> Option<Vec<u32>> {
        let line = text.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    let uniform = |v: &Option<Vec<u32>>| {
        v.as_ref()
            .is_some_and(|v| v.len() == 4 && v.iter().all(|&x| x == v[0]))
    };
    let (uids, gids) = (ids("Uid:"), ids("Gid:"));
    if !uniform(&uids) || !uniform(&gids) {
        return false;
    }
    let euid = uids.map_or(0, |v| v[1]);
    // Looked up anew, so /proc revalidates the owner against the current image.
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == euid)
}

/// Thread group id of a thread, from /proc.
fn tgid_of(tid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
