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
