//! Memory layout of the RW area that the rewriter adds to every instrumented binary.
//!
//! The inline stubs, the injected register/flush code, the eBPF programs and the
//! tracer all address it by these offsets from its start (`rw_base`, the run-time
//! address of the new RW segment).
//!
//! ```text
//! rw_base + 0             RwHeader                  (in the file; the rest is bss)
//! rw_base + PRE_TLS_OFF   pre-TLS TCB: %fs points here in static executables until
//!                         libc installs the real thread pointer
//! rw_base + INDEX_OFF     index: [u32; INDEX_ENTRIES], h(tp) → byte offset of the
//!                         thread's Slot from SLOTS_OFF (0 = slot 0, which never matches)
//! rw_base + SLOTS_OFF     slots: [Slot; nslots]
//! rw_base + bufs_off      buffers: nslots × buf_stride(buf_bytes), area 64 KiB aligned
//! ```
//!
//! A thread's buffer is found from its thread pointer `tp` (`%fs:0` on x86-64,
//! `tpidr_el0` on AArch64): `h = (tp >> 16) & 0xffff` (a 16-bit load, no shift, so the
//! stub leaves the flags alone), `slot = SLOTS + index[h]`, hit when `slot.key == tp`.
//! Stubs of an executable without TLS of its own read the same offset from a
//! word of the thread's static TLS block instead (`rewriter::isa::SlotLookup`); the
//! index is kept either way.
//!
//! **Slot lookup by thread word.** A dynamically linked executable without TLS of its
//! own gets a `PT_TLS` of 8 bytes, which puts a word of every thread's static TLS block
//! at a fixed offset from the thread pointer (`%fs:-8`, TLS variant II; AArch64
//! `tpidr_el0 + 16`, variant I): zero in every new thread, stale only as another
//! thread's valid entry. It holds the slot's offset like an index entry, masked so that
//! any value names a slot, and `register` writes it. Whatever the word holds (zero in a
//! new thread, another thread's entry after a stack is reused, anything a thread with
//! its own TLS layout keeps there), the stub masks it to a slot and checks the slot's
//! key: a wrong word is a miss, never a store elsewhere (test `tests/tests/stress.rs`:
//! 2,000 short-lived threads on reused stacks, exact per thread, with the thread word
//! and, `_own_tls`, with the index; readelf and objdump say which). One `%fs`-relative
//! load replaces the hash and the index load (sqlite, stubs only, coarse time: 1.30 s →
//! 1.245 s, 0.26 ns a record). Libraries (their TLS block is not at a fixed offset),
//! static executables (the pre-TLS slot), executables with their own `PT_TLS` (a word
//! could only be prepended, moving their variables for debuggers) and slot counts that
//! are not a power of two use the index. `register` keeps the index in every case, for
//! the eBPF exit drains, which find a slot from the task's thread pointer. A thread
//! made by raw `clone` without `CLONE_SETTLS` shares its parent's thread pointer, and
//! so its slot.
//!
//! **Signals.** A handler that records while the interrupted code is inside a stub on
//! the same thread: the reservation is a single `xadd` (AArch64: an exclusive pair the
//! kernel's exception return makes fail and retry), so the two records never get the
//! same place. `Slot::inflight` is incremented before the reservation and decremented
//! after the last store; a flush (eBPF and user code alike) that sees it non-zero does
//! nothing, the buffer runs into its slack ([`BUF_SLACK_RECORDS`] = 8 records after
//! `end`, enough for 8 nested handlers) and the thread's next record flushes it. The
//! user-space reset in `flush` only happens while the buffer is still full, so a
//! handler that runs between the eBPF drain and that reset keeps its record. The
//! uprobe-site program also skips draining while `inflight != 0` and emits only its own
//! record, which then precedes the interrupted thread's buffered ones. Net: no record
//! is lost, torn or duplicated; a handler's records may come before the interrupted one
//! (buffer order is reservation order; timestamps are taken after it). Test
//! `signals::signal_handler_records`.
//!
//! **Buffer kinds** (`--buffer-kind`, `[buffer] kind`, `RwHeader::buf_kind`, metadata
//! flags). `trace`: a full buffer is flushed. `circular`: the stub resets `cur` to `start`
//! itself when the buffer is full (and bumps the epoch), so the buffer holds the newest
//! records. `fast-circular`: 64 KiB rings, 64 KiB aligned (the RW segment's `p_align` makes
//! the loader keep that), reserved with an `xadd` on the low 16 bits of `cur` (AArch64
//! `ldxrh`/`stxrh`) and `start + offset`, so the ring wraps with no check at all. A stub
//! that reserves several records (an entry and a block at one instruction, a USDT probe
//! of more than two arguments) stores them at `start + offset + 32j`, so it compares
//! once: a reservation that would cross the ring's end (into the next thread's ring)
//! takes a cold path that clears its records' flags (never written) and reserves again
//! from the ring's start; a ring then holds up to that many records fewer. Ring records
//! carry `FLAG_RING`; rings skip the `inflight` bracket and are never flushed: the eBPF
//! exit programs and `killed` (crash signals and SIGKILL, cause `CAUSE_CRASH`) deliver a
//! ring whole, oldest first (`[cur, end)` then `[start, cur)`), once per state (`DRAINED` remembers `cur` and
//! the record before it); the user-space drain reads and rotates it at the exit stop.
//! Readers skip never-written ring records (flags 0); `tracer report --last N` lists each
//! thread's last N records, newest first: after a crash, what ran last.
//!
//! **Static executables.** Before libc installs the thread pointer, `%fs` is 0 and
//! `%fs:0` would fault (AArch64: `tpidr_el0` is 0, which the stub skips). The rewriter
//! points `e_entry` at a shim that sets the thread pointer to a stand-in TCB at
//! `PRE_TLS_OFF` whose first word is its own address; records of that phase go to
//! slot 1. When the main thread's first record after libc's `arch_prctl(ARCH_SET_FS)`
//! registers a real slot, `register` flushes slot 1 and tombstones it (the user-space
//! drain is sent slot 1's records the same way).
//!
//! **The user-space drain** (`tracer record --user`, no eBPF; both backends inject the same
//! code). At the first registration in a binary (`RwHeader::user_state` = [`USER_UNKNOWN`])
//! `register` asks `getsockopt(USER_DRAIN_FD, SOL_SOCKET, SO_TYPE)`: `SOCK_SEQPACKET` →
//! [`USER_ON`], anything else → [`USER_OFF`]. Only a dumpable process
//! (`prctl(PR_GET_DUMPABLE)` = 1: not setuid, setgid or given file capabilities) joins, and
//! only a peer whose `SO_PEERCRED` uid is 0 or its own `geteuid`; anything refused is
//! `USER_OFF` with no wait, else whoever put a socket there would read a privileged
//! program's records. The decision is per binary and process; without a tracer it costs
//! `prctl` and `getsockopt` before the session socket is looked for. Messages are
//! `sendmsg(1021, [ChunkHeader, payload], MSG_NOSIGNAL)`, retried on EINTR; any other error
//! sets `USER_OFF`. A claimed slot is announced with `CHUNK_KIND_SLOT` (count 0,
//! `CAUSE_REGISTER`, payload = slot address and `rw_base`); `flush`, after the uprobe `nop`
//! and the `inflight` / still-full checks, sends `[start, cur)` as `CHUNK_KIND_RECORDS`
//! messages of at most `USER_MSG_RECORDS` (1024) records (pid = `getpid`, tid =
//! `slot.owner_tid`, seq = a fetch-add on `RwHeader::user_seq`, cause `CAUSE_FULL`), then
//! resets `cur`. `user_drain` blocks signals while it sends, so a handler cannot send the
//! same records twice.
//!
//! **Waiting for the session** ([`USER_SESSION`]). A program started under `record -- CMD`
//! finds the session's socket at 1021; one without it (a `close_fds` took it, or a
//! system-wide session) connects to the abstract socket `SESSION_SOCKET` (socket, connect,
//! close: three system calls when no session listens). After the same checks as above it
//! polls the socket 1 ms at a time, at most [`ATTACH_POLLS`] (10 s), until
//! `RwHeader::attached` says the tracer has attached its binary (the tracer writes
//! `ATTACHED` through `/proc/PID/mem`), then sends one byte (`ATTACH_DONE`, or
//! `ATTACH_GAVE_UP` when the time ran out; nothing when the other end closed) and turns
//! `USER_OFF`: one `sendto` per binary and process.
//!
//! **Back-pressure** (`--on-full wait`, the default; LTTng's blocking mode). The eBPF
//! side may not write user memory (lockdown), so the flush function and the drain talk
//! through the flush register and a signal ([`HOLD_SIGNAL`], `FLUSH_*`; code in the
//! rewriter's `isa/*/wait.rs` and `tracer-ebpf/src/programs/flush.rs`). Handshake:
//! `register`'s empty flush passes `FLUSH_HELLO` (signals blocked); a waiting tracer
//! answers with `HOLD_SIGNAL` (`bpf_send_signal_thread`), which `register` takes with a
//! zero-timeout `rt_sigtimedwait`, then sets `RwHeader::on_full` (a tracer attaching to
//! running processes writes `on_full` through `/proc/PID/mem`). No tracer, no answer:
//! no extra system call per flush. Armed, `flush` blocks every signal, passes
//! `FLUSH_ARMED` and takes `HOLD_SIGNAL` afterwards (3 system calls per flush); held,
//! it `sched_yield`s ([`FLUSH_YIELDS`] times) or sleeps [`FLUSH_WAIT_NS`] and flushes
//! again, from where the drain stopped; the last of [`FLUSH_TRIES`] (about 5 s) passes
//! `FLUSH_FINAL` and the drain drops what does not fit, counted. Signals stay blocked
//! while it waits, so no handler records into a waiting buffer; a signal the program
//! sent itself is queued again (`si_code` is not `SI_KERNEL`). Test
//! `backpressure::flood_into_small_ring_waits_and_loses_nothing` (64 threads into a 64
//! KiB ring, exact per thread; `--on-full drop` balances).

use core::mem::offset_of;

/// `RwHeader::magic`.
pub const RW_MAGIC: u64 = u64::from_le_bytes(*b"UTRCRW01");
pub const RW_VERSION: u32 = 2;

pub const PRE_TLS_OFF: u64 = 0x1000;
pub const INDEX_OFF: u64 = 0x2000;
pub const INDEX_ENTRIES: u64 = 1 << 16;
pub const SLOTS_OFF: u64 = INDEX_OFF + INDEX_ENTRIES * 4;
pub const SLOT_SIZE: u64 = 64;
/// Alignment of the buffer area.
pub const BUF_ALIGN: u64 = 0x10000;

/// `Slot::key` of a slot that was never used.
pub const KEY_FREE: u64 = 0;
/// `Slot::key` of a slot whose thread exited (drained and released by the tracer's
/// thread-exit program); free to claim again.
pub const KEY_TOMBSTONE: u64 = 1;
/// `Slot::key` while the register routine initialises a slot it has just claimed: it
/// matches no thread, so a signal handler's stub cannot use a half-made slot.
pub const KEY_CLAIMING: u64 = 2;

/// Records of room after `end` in every buffer. A signal handler that records while
/// the interrupted stub has taken the last record but not yet flushed reserves past
/// `end`; this slack absorbs up to this many nested handlers.
pub const BUF_SLACK_RECORDS: u64 = 8;

/// Slot 0 is the sentinel every empty index entry points at (its key is never a thread
/// pointer). Slot 1 is reserved for the pre-TLS phase of static executables.
pub const SLOT_SENTINEL: u32 = 0;
pub const SLOT_PRE_TLS: u32 = 1;
pub const FIRST_FREE_SLOT: u32 = 2;

/// Default geometry chosen by the rewriter.
pub const DEFAULT_SLOTS: u32 = 1024;
/// 128 KiB per thread (as uftrace's buffers): a quarter of the flushes, each a uprobe
/// trap, of 1024-record buffers (sqlite, every entry and exit: 4.4 s -> 3.9 s under
/// `tracer record`); 8192 and more were slower (the buffer leaves L2).
pub const DEFAULT_BUF_RECORDS: u32 = 4096;
/// The largest per-thread buffer a rewriter makes (records; 512 MiB).
pub const MAX_BUF_RECORDS: u32 = 1 << 24;

/// End of a 48-bit user address space (x86-64 four-level paging, AArch64 48-bit VA):
/// no binary loads, and no site lies, at or above it.
pub const USER_END: u64 = 1 << 48;

/// Start of the RW area; the only part with file contents.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwHeader {
    pub magic: u64,
    pub version: u32,
    pub nslots: u32,
    /// Bytes per buffer (a multiple of `RECORD_SIZE`).
    pub buf_bytes: u64,
    /// Offset of the buffer area from `rw_base`.
    pub bufs_off: u64,
    /// Identity of this binary (first 8 bytes of its build-id, else a content hash);
    /// copied into every slot so that the eBPF drain can tag chunks.
    pub binary_id: u64,
    /// Records dropped because no slot was free (the table was full).
    pub no_slot_drops: u64,
    /// Threads that registered a slot (slow path).
    pub registrations: u64,
    /// 1 when the binary is a static executable and the pre-TLS TCB is in use.
    pub pre_tls: u64,
    /// User-space drain (`tracer record --user`) or a session that started the process
    /// (`USER_*`), decided once per process at the first registration by looking at
    /// descriptor [`USER_DRAIN_FD`].
    pub user_state: u32,
    pub user_fd: u32,
    /// Sequence number of the next chunk sent by the user-space drain.
    pub user_seq: u64,
    /// `BUF_*`: what the stubs do when a buffer is full.
    pub buf_kind: u32,
    /// [`ON_FULL_WAIT`] once a tracer that waits for room in its ring buffer has
    /// answered a registration (or written it on attach): the flush function then
    /// holds signals around the flush uprobe and waits while the drain holds the
    /// buffer (see [`HOLD_SIGNAL`]). 0 otherwise.
    pub on_full: u32,
    /// [`ATTACHED`] once a tracer has attached this binary (its flush uprobe carries
    /// the drain): written by the tracer through `/proc/PID/mem`, awaited by
    /// `register` in a [`USER_SESSION`]. (The probed instruction turning into a
    /// breakpoint is no such sign: the kernel writes it tens of milliseconds before
    /// the program is linked to the probe.)
    pub attached: u32,
}

/// Buffer kinds (`RwHeader::buf_kind`). Trace: a full buffer is flushed (drained
/// through the flush uprobe).
pub const BUF_TRACE: u32 = 0;
/// Circular: a full buffer wraps (the stub resets `cur` itself; the newest records
/// overwrite the oldest); read whole, oldest first, at thread exit and on a crash.
pub const BUF_CIRCULAR: u32 = 1;
/// Fast circular: a 64 KiB ring, 64 KiB aligned; the stub bumps only the low 16 bits
/// of `cur`, so it wraps by itself, with no check at all.
pub const BUF_FAST_CIRCULAR: u32 = 2;
/// Bytes of a fast circular ring.
pub const FAST_RING_BYTES: u64 = 0x10000;

/// Not looked at yet.
pub const USER_UNKNOWN: u32 = 0;
/// No user-space drain: full buffers go through the flush uprobe (or are discarded).
pub const USER_OFF: u32 = 1;
/// Full buffers are sent to [`USER_DRAIN_FD`] with `sendmsg`.
pub const USER_ON: u32 = 2;
/// A session started this process (`tracer record -- CMD`: descriptor
/// [`USER_DRAIN_FD`] is a `SOCK_STREAM` socket, the tracer holds the other end) and
/// drains it through the kernel: `register` waits, bounded, until the tracer has
/// attached the flush uprobe ([`RwHeader::attached`]), so that a
/// program that starts and ends before the tracer has looked at it still delivers
/// its records. Flushes behave as with [`USER_OFF`].
pub const USER_SESSION: u32 = 3;
/// Where `tracer record` puts its end of a socket pair in the command it starts
/// (`SOCK_SEQPACKET` for the user-space drain, `SOCK_STREAM` otherwise: see
/// [`USER_SESSION`]). The injected code uses it only if it is such a socket.
pub const USER_DRAIN_FD: u32 = 1021;
/// The abstract Unix socket name a system-wide session listens under
/// (`tracer-user/src/record/announce.rs`): a rewritten program that finds no session
/// descriptor connects there at its first record and, connected, waits like a
/// [`USER_SESSION`] process (the connection becomes its [`USER_DRAIN_FD`]).
pub const SESSION_SOCKET: &[u8; 15] = b"\0utrace-session";
/// How long `register` waits for the tracer to attach in a [`USER_SESSION`]: this many
/// polls of [`USER_DRAIN_FD`] of [`ATTACH_POLL_NS`] each (10 s), cut short when the
/// tracer's end closes. Not less: a uprobe attached to a file that a live process maps
/// takes ~0.3 s on the test VM, so a binary with a few uprobe sites that joins a
/// session takes seconds (2 s lost csmith programs with 9).
pub const ATTACH_POLLS: u32 = 10_000;
pub const ATTACH_POLL_NS: u32 = 1_000_000;
/// [`RwHeader::attached`] of a binary a tracer has attached.
pub const ATTACHED: u32 = 1;
/// What `register` of a [`USER_SESSION`] process sends the session (one byte on
/// [`USER_DRAIN_FD`], once per binary and process) when its binary is attached, with or
/// without waiting. The wait ending by the session's end closing sends nothing.
pub const ATTACH_DONE: u8 = b'A';
/// ... when the wait ran out before the tracer attached the binary: the process runs
/// on untraced in that binary (`FinalStats::unattached` counts such processes).
pub const ATTACH_GAVE_UP: u8 = b'L';
/// Records per message of the user-space drain (32 KiB, well under the socket's
/// send buffer).
pub const USER_MSG_RECORDS: u64 = 1024;

/// `RwHeader::on_full`: full buffers wait for room in the tracer's ring buffer.
pub const ON_FULL_WAIT: u32 = 1;

/// Back-pressure without writing user memory (kernel lockdown forbids the eBPF side
/// to): the flush function tells the drain in a register what it may do, and the
/// drain answers with this signal, sent to the flushing thread while the flush
/// function has every signal blocked; the flush function takes it with a zero-timeout
/// `rt_sigtimedwait` (`si_code` `SI_KERNEL`: a signal the program sent itself is queued
/// again). At a registration the answer means "this tracer waits" (set `on_full`);
/// at a full buffer "not drained: no room, wait and flush again".
pub const HOLD_SIGNAL: u32 = 63;
/// `si_code` of a signal sent by the kernel (`bpf_send_signal_thread`).
pub const SI_KERNEL: i32 = 0x80;
/// The flush register (`FLUSH_MODE_REG` of the ISA) at the flush uprobe: the
/// function holds signals and waits if the drain holds the buffer.
pub const FLUSH_ARMED: u64 = 0x5554_5243_4152_4d44;
/// As `FLUSH_ARMED`, the last try: the drain drops (and counts) what finds no room.
pub const FLUSH_FINAL: u64 = 0x5554_5243_4649_4e4c;
/// A registration's flush, signals held: answer with `HOLD_SIGNAL` if the tracer waits.
pub const FLUSH_HELLO: u64 = 0x5554_5243_4845_4c4f;
/// Flushes an armed flush function makes before the drain's last try: the first few
/// after a `sched_yield`, the others after `FLUSH_WAIT_NS` of sleep (about 5 s in all).
pub const FLUSH_TRIES: u32 = 10_000;
pub const FLUSH_YIELDS: u32 = 8;
pub const FLUSH_WAIT_NS: u64 = 500_000;

/// Offsets of the [`RwHeader`] fields from `rw_base`.
pub const RWH_MAGIC: u64 = offset_of!(RwHeader, magic) as u64;
pub const RWH_NSLOTS: u64 = offset_of!(RwHeader, nslots) as u64;
pub const RWH_BUF_BYTES: u64 = offset_of!(RwHeader, buf_bytes) as u64;
pub const RWH_BUFS_OFF: u64 = offset_of!(RwHeader, bufs_off) as u64;
pub const RWH_BINARY_ID: u64 = offset_of!(RwHeader, binary_id) as u64;
pub const RWH_NO_SLOT_DROPS: u64 = offset_of!(RwHeader, no_slot_drops) as u64;
pub const RWH_REGISTRATIONS: u64 = offset_of!(RwHeader, registrations) as u64;
pub const RWH_USER_STATE: u64 = offset_of!(RwHeader, user_state) as u64;
pub const RWH_USER_FD: u64 = offset_of!(RwHeader, user_fd) as u64;
pub const RWH_USER_SEQ: u64 = offset_of!(RwHeader, user_seq) as u64;
pub const RWH_BUF_KIND: u64 = offset_of!(RwHeader, buf_kind) as u64;
pub const RWH_ON_FULL: u64 = offset_of!(RwHeader, on_full) as u64;
pub const RWH_ATTACHED: u64 = offset_of!(RwHeader, attached) as u64;

/// One thread's buffer descriptor. 64 bytes, one cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// Owner's thread pointer, or `KEY_FREE` / `KEY_TOMBSTONE`.
    pub key: u64,
    /// Next free record (absolute address). The stub reserves by storing `cur + 32`
    /// before it writes the record.
    pub cur: u64,
    /// End of the buffer (absolute); `cur == end` after a reservation → flush.
    pub end: u64,
    /// Start of the buffer (absolute).
    pub start: u64,
    /// Run-time address of the RW area this slot lives in.
    pub rw_base: u64,
    /// Copy of `RwHeader::binary_id`.
    pub binary_id: u64,
    /// Thread id of the thread that claimed the slot (raw `gettid`).
    pub owner_tid: u32,
    /// Incremented every time the slot is claimed.
    pub generation: u32,
    /// Stubs of this thread between `inflight += 1` (before reserving) and
    /// `inflight -= 1` (after the record is written): non-zero means a record is being
    /// written by code that a signal handler interrupted, so a drain now would read it
    /// half-written. Flush and uprobe-site drains skip while it is non-zero.
    pub inflight: u64,
}

/// Offsets of the [`Slot`] fields from the slot's address.
pub const SLOT_KEY: u64 = offset_of!(Slot, key) as u64;
pub const SLOT_CUR: u64 = offset_of!(Slot, cur) as u64;
pub const SLOT_END: u64 = offset_of!(Slot, end) as u64;
pub const SLOT_START: u64 = offset_of!(Slot, start) as u64;
pub const SLOT_RW_BASE: u64 = offset_of!(Slot, rw_base) as u64;
pub const SLOT_BINARY_ID: u64 = offset_of!(Slot, binary_id) as u64;
pub const SLOT_OWNER_TID: u64 = offset_of!(Slot, owner_tid) as u64;
pub const SLOT_GENERATION: u64 = offset_of!(Slot, generation) as u64;
pub const SLOT_INFLIGHT: u64 = offset_of!(Slot, inflight) as u64;

const _: () = assert!(core::mem::size_of::<Slot>() as u64 == SLOT_SIZE);
// The offsets the rewriter's stubs and injected code hard-code into every rewritten
// binary (its ABI: a change needs RW_VERSION bumped).
const _: () = assert!(RWH_MAGIC == 0);
const _: () = assert!(RWH_NSLOTS == 12);
const _: () = assert!(RWH_BUF_BYTES == 16);
const _: () = assert!(RWH_BUFS_OFF == 24);
const _: () = assert!(RWH_BINARY_ID == 32);
const _: () = assert!(RWH_NO_SLOT_DROPS == 40);
const _: () = assert!(RWH_REGISTRATIONS == 48);
const _: () = assert!(RWH_USER_STATE == 64);
const _: () = assert!(RWH_USER_FD == 68);
const _: () = assert!(RWH_USER_SEQ == 72);
const _: () = assert!(RWH_BUF_KIND == 80);
const _: () = assert!(RWH_ON_FULL == 84);
const _: () = assert!(RWH_ATTACHED == 88);
const _: () = assert!(SLOT_KEY == 0);
const _: () = assert!(SLOT_CUR == 8);
const _: () = assert!(SLOT_END == 16);
const _: () = assert!(SLOT_START == 24);
const _: () = assert!(SLOT_RW_BASE == 32);
const _: () = assert!(SLOT_BINARY_ID == 40);
const _: () = assert!(SLOT_OWNER_TID == 48);
const _: () = assert!(SLOT_GENERATION == 52);
const _: () = assert!(SLOT_INFLIGHT == 56);

/// Offset of the buffer area for `nslots` slots.
pub const fn bufs_off(nslots: u32) -> u64 {
    let end = SLOTS_OFF + nslots as u64 * SLOT_SIZE;
    (end + BUF_ALIGN - 1) & !(BUF_ALIGN - 1)
}

/// Distance between two buffers: the records plus the slack, cache-line aligned; fast
/// rings are back to back (they never pass their end), so each stays 64 KiB aligned.
pub const fn buf_stride(buf_kind: u32, buf_bytes: u64) -> u64 {
    if buf_kind == BUF_FAST_CIRCULAR {
        return FAST_RING_BYTES;
    }
    (buf_bytes + BUF_SLACK_RECORDS * crate::RECORD_SIZE as u64 + 63) & !63
}

/// Total size of the RW area.
pub const fn rw_size(buf_kind: u32, nslots: u32, buf_bytes: u64) -> u64 {
    bufs_off(nslots) + nslots as u64 * buf_stride(buf_kind, buf_bytes)
}

/// Index entry for a thread pointer.
pub const fn index_of(tp: u64) -> u64 {
    (tp >> 16) & 0xffff
}

/// Arch codes used in metadata and trace files.
pub const ARCH_X86_64: u32 = 1;
pub const ARCH_AARCH64: u32 = 2;
