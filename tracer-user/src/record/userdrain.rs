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
//! A slot of a binary the command line did not name (qemu-user's guest program, a
//! `dlopen`ed library) makes the tracer look at the process's mappings and describe
//! the instrumented binaries it finds there, so `--binary` is only needed where the
//! mapping cannot be found.

use std::{
    collections::{HashMap, HashSet},
    ffi::OsString,
    io,
    os::fd::{AsRawFd, OwnedFd},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use tracer_common::{
    BUF_TRACE, CAUSE_THREAD_EXIT, CHUNK_HEADER_BYTES, CHUNK_KIND_RECORDS, ChunkHeader,
    KEY_TOMBSTONE, RECORD_SIZE, RECORD_VERSION, RWH_BUF_KIND, SLOT_SIZE, Slot, USER_MSG_RECORDS,
};

use crate::{
    record::gate::{self, GatedChild},
    record::host::clock,
    record::remote::{ptrace, read_mem, write_mem},
    record::{
        binaries,
        discover::{binary_info, binary_infos, discover_command},
        summary::print_summary,
        target::RecordOptions,
        target_data::{Message, SlotSpan, encode_records, parse_message, slot_span},
    },
    tracefile::{FinalStats, SessionInfo, Writer, encode_load},
};

/// Largest message: header + USER_MSG_RECORDS records (bigger means a bad sender).
const MAX_MSG: usize = CHUNK_HEADER_BYTES + USER_MSG_RECORDS as usize * RECORD_SIZE;

/// A slot a thread announced: (process, slot address).
type SlotRef = (u32, u64);

struct State {
    writer: Writer,
    /// Binaries the file describes (`binary_id`), in ordinal order: those the command
    /// names, then those found mapped when a slot of an unknown one registers (the
    /// guest program of qemu-user).
    binaries: Vec<u64>,
    /// tid → the slots it registered.
    slots: HashMap<u32, Vec<SlotRef>>,
    records: u64,
    chunks: u64,
    bad: u64,
    threads: HashSet<(u32, u32)>,
    buf: Vec<u8>,
}

pub fn record(opts: RecordOptions, argv: Vec<OsString>) -> Result<i32> {
    let run_as = opts.run_as.as_ref();
    let (binaries, exe) = discover_command(&argv, &opts.binaries, run_as)?;
    let (ours, theirs) = seqpacket_pair()?;
    let mut child = GatedChild::spawn_with_drain(&exe, &argv, Some(theirs.as_raw_fd()), run_as)?;
    drop(theirs);
    seize(child.pid)?;

    let session = SessionInfo {
        command: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pids: vec![child.pid],
        mode: "user".into(),
        arch: std::env::consts::ARCH.into(),
        record_version: RECORD_VERSION,
        ring_bytes: 0,
        write_user: false,
        clock: clock::calibrate(Duration::from_millis(20)),
        start_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let mut writer = Writer::create(&opts.output)?;
    writer.write_session(&session)?;
    for b in binary_infos(binaries.iter().map(|t| &t.binary)) {
        writer.write_binary(&b)?;
    }
    let mut st = State {
        writer,
        binaries: binaries.iter().map(|t| t.binary.meta.binary_id).collect(),
        slots: HashMap::new(),
        records: 0,
        chunks: 0,
        bad: 0,
        threads: HashSet::new(),
        buf: vec![0u8; MAX_MSG + 1],
    };

    gate::ignore_terminal_signals();
    child.release().with_context(|| exe.display().to_string())?;
    let exit_code = run(&mut st, &ours, child.pid)?;
    st.drain_socket(&ours)?;
    if !st.slots.is_empty() {
        // Threads whose exit the tracer never saw with their memory still readable
        // (e.g. killed from outside, which skips every exit stop).
        eprintln!(
            "utrace: warning: the records left in the buffers of {} threads at their exit could not be collected",
            st.slots.len()
        );
    }

    // Every record taken out of a buffer (sent, or read at a thread's exit) is
    // delivered: this drain neither filters nor drops.
    let stats = FinalStats {
        records_produced: st.records,
        records_delivered: st.records,
        chunks: st.chunks,
        records_received: st.records,
        chunks_received: st.chunks,
        bad_entries: st.bad,
        threads: st.threads.len() as u64,
        clock_end: Some(clock::anchor()),
        exit_code: Some(exit_code),
        ..Default::default()
    };
    let consumed = crate::record::consumer::Consumed {
        records: st.records,
        chunks: st.chunks,
        bad_entries: st.bad,
        threads: st.threads.clone(),
    };
    let path = st.writer.finish(&stats)?;
    print_summary(&consumed, &stats, &path);
    Ok(exit_code)
}

fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    let pair = super::gate::socket_pair(libc::SOCK_SEQPACKET).context("socketpair")?;
    let big: libc::c_int = 8 << 20;
    for (fd, opt) in [(&pair.0, libc::SO_RCVBUF), (&pair.1, libc::SO_SNDBUF)] {
        // SAFETY: a valid int option value of the right size. Best effort (capped by
        // net.core.*mem_max); a small buffer only makes senders wait.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&raw const big).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    Ok(pair)
}

fn seize(pid: u32) -> Result<()> {
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
                if tid == main {
                    exit_code = Some(if libc::WIFEXITED(status) {
                        libc::WEXITSTATUS(status)
                    } else {
                        128 + libc::WTERMSIG(status)
                    });
                }
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            let event = status >> 16;
            let r = if event == libc::PTRACE_EVENT_EXIT {
                // Its earlier messages are in the socket already (sendmsg returned).
                st.drain_socket(sock)?;
                st.collect_exiting(tid)?;
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
        }
    }
}

impl State {
    /// Read every message waiting in the socket.
    fn drain_socket(&mut self, sock: &OwnedFd) -> Result<()> {
        loop {
            // SAFETY: recv into our buffer of buf.len() bytes.
            let n = unsafe {
                libc::recv(
                    sock.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e).context("recv from the user-space drain"),
                }
            }
            if n == 0 {
                return Ok(()); // every sender is gone
            }
            let msg = self.buf[..n as usize].to_vec();
            self.message(&msg)?;
        }
    }

    fn message(&mut self, msg: &[u8]) -> Result<()> {
        match parse_message(msg) {
            Message::Slot(h, slot) => {
                let list = self.slots.entry(h.tid).or_default();
                if !list.contains(&(h.pid, slot)) {
                    list.push((h.pid, slot));
                }
                if !self.binaries.contains(&h.binary_id) {
                    self.find_mapped(h.pid)?;
                }
                Ok(())
            }
            Message::Records(mut h, records) => {
                // The drain's clock sample (see ChunkHeader::time): the moment it arrived.
                h.time = clock::monotonic_ns();
                self.records_out(h, records)
            }
            Message::Bad => {
                self.bad += 1;
                Ok(())
            }
        }
    }

    /// A slot of a binary the file does not describe yet registered in process `pid`:
    /// describe the instrumented binaries it maps (qemu-user maps its guest program
    /// like any file), each with its load bias.
    fn find_mapped(&mut self, pid: u32) -> Result<()> {
        let found = binaries::for_process(pid).unwrap_or_else(|e| {
            log::warn!("{e:#}");
            Vec::new()
        });
        for (b, bias) in found {
            let id = b.meta.binary_id;
            if self.binaries.contains(&id) {
                continue;
            }
            log::info!("found {} mapped in process {pid}", b.path.display());
            let info = binary_info(self.binaries.len() as u32, &b);
            self.writer.write_binary(&info)?;
            self.writer.write_raw(&encode_load(pid, id, bias))?;
            self.binaries.push(id);
        }
        Ok(())
    }

    /// Write records as chunk sections of at most CHUNK_RECORDS (what readers expect).
    fn records_out(&mut self, h: ChunkHeader, records: &[u8]) -> Result<()> {
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
        let Some(pid) = tgid_of(tid) else {
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
            let mut raw = [0u8; SLOT_SIZE as usize];
            let Some(through) = [via, pid]
                .into_iter()
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
            let (bytes, rotate) = match slot_span(&slot, tid, ring) {
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
        if !unread.is_empty() {
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

/// Thread group id of a thread, from /proc.
fn tgid_of(tid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
