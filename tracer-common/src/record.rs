//! The one record that every site stores (inline stub or uprobe fallback).
//!
//! This file is the only definition of the 32-byte `Record`, every record flag and the
//! field offsets; the offsets the stubs and the eBPF programs hard-code are derived
//! from the structs with `offset_of!` and pinned by `const` asserts.
//!
//! The `time` field by time mode (`meta::TimeMode`, named in the metadata and printed
//! by the report): `record` stores the cycle counter (`rdtsc`, `cntvct_el0`); `block`
//! reads it only in basic-block stubs; `coarse` stores no clock, only the buffer's
//! epoch (`Slot::generation`, bumped by every reset: the no-write drain,
//! `tracer-ebpf/src/slots.rs`, needs a stamp that changes when a buffer is refilled).
//! Every chunk header carries its drain's `CLOCK_MONOTONIC` sample, and readers spread
//! a thread's coarse records evenly between the samples of the drains before and after
//! them (`read/coarse.rs`; such records get `FLAG_KTIME` and flag `0x100`). Uprobe-site
//! records carry `FLAG_UPROBE | FLAG_KTIME` and `bpf_ktime_get_ns` (eBPF cannot read
//! the TSC).

/// Version of [`Record`]'s layout; stored in the metadata note and in trace files.
/// 2: memory pairs ([`FLAG_MEM_PAIR`]).
pub const RECORD_VERSION: u32 = 2;
/// Size of a record in bytes. A power of two, so buffers of whole records can wrap by
/// masking (the fast circular buffer of later site kinds).
pub const RECORD_SIZE: usize = 32;

/// One trace event, exactly as the inline stub writes it into the per-thread buffer.
///
/// | offset | field  | meaning                                                   |
/// |--------|--------|-----------------------------------------------------------|
/// | 0      | site   | site id (index into the binary's site table)              |
/// | 4      | flags  | `FLAG_*` bits (memory sites: read/write, size)            |
/// | 8      | time   | `rdtsc` / `cntvct_el0`, ktime ns if `FLAG_KTIME`, or the  |
/// |        |        | buffer epoch (coarse timestamps)                          |
/// | 16     | value  | entry: first argument (`rdi`/`x0`); exit: return value    |
/// |        |        | (`rax`/`x0`); block: its address; memory: effective address |
/// | 24     | aux    | entry/exit: return address (`[rsp]`/`x30`); memory: the   |
/// |        |        | instruction's address; block: 0; a memory pair           |
/// |        |        | ([`FLAG_MEM_PAIR`]): the second access's effective address |
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub site: u32,
    pub flags: u32,
    pub time: u64,
    pub value: u64,
    pub aux: u64,
}

const _: () = assert!(core::mem::size_of::<Record>() == RECORD_SIZE);

/// Offset of [`Record::time`] (the eBPF drain reads a record's stamp in user memory).
pub const RECORD_TIME_OFF: u64 = core::mem::offset_of!(Record, time) as u64;
// The table above, which the stubs of both ISAs write by.
const _: () = assert!(core::mem::offset_of!(Record, flags) == 4);
const _: () = assert!(RECORD_TIME_OFF == 8);
const _: () = assert!(core::mem::offset_of!(Record, value) == 16);
const _: () = assert!(core::mem::offset_of!(Record, aux) == 24);

/// `time` is `bpf_ktime_get_ns()` (CLOCK_MONOTONIC ns), not a cycle counter: the record
/// was produced by an eBPF uprobe (an unpatchable site), which cannot read the TSC.
pub const FLAG_KTIME: u32 = 1 << 0;
/// The record came from a uprobe site rather than an inline stub.
pub const FLAG_UPROBE: u32 = 1 << 1;
/// Memory site: the instruction reads memory.
pub const FLAG_MEM_READ: u32 = 1 << 2;
/// Memory site: the instruction writes memory.
pub const FLAG_MEM_WRITE: u32 = 1 << 3;
/// USDT site: this record carries arguments `2k+3` and `2k+4` (value, aux) of the
/// record before it, `k` in bits 24..32 of `flags`.
pub const FLAG_USDT_MORE: u32 = 1 << 4;
pub const FLAG_USDT_INDEX_SHIFT: u32 = 24;
/// Written into a circular buffer (an unused ring record has flags 0).
pub const FLAG_RING: u32 = 1 << 5;
/// Entry, landing and resume records of a function that unwinding can land in: bits
/// 16..32 of `flags` hold the low 16 bits of the frame's canonical frame address (the
/// stack pointer before the call that made it), so a landing finds its own frame among
/// the open calls of a recursive function.
pub const FLAG_FRAME: u32 = 1 << 6;
/// Where [`FLAG_FRAME`]'s address bits start.
pub const FLAG_FRAME_SHIFT: u32 = 16;

/// The frame address bits of a record flagged [`FLAG_FRAME`].
pub const fn frame_bits(flags: u32) -> Option<u16> {
    if flags & FLAG_FRAME != 0 {
        Some((flags >> FLAG_FRAME_SHIFT) as u16)
    } else {
        None
    }
}
/// The tracer interpolated `time` (coarse timestamps; next to `FLAG_KTIME`, which says
/// the time is CLOCK_MONOTONIC ns). Set by readers, never by a stub.
pub const FLAG_INTERPOLATED: u32 = 1 << 8;
/// Memory site: bytes accessed, in bits 16..32 of `flags`.
pub const FLAG_MEM_SIZE_SHIFT: u32 = 16;

/// Bytes accessed by a memory-site record (the first access of a pair).
pub const fn mem_size(flags: u32) -> u32 {
    if flags & FLAG_MEM_PAIR != 0 {
        (flags >> FLAG_MEM_SIZE_SHIFT) & 0xff
    } else {
        flags >> FLAG_MEM_SIZE_SHIFT
    }
}

/// Two memory accesses in one record, written by one stub before a run of memory
/// instructions (`rewriter`'s access runs): `site` is the first access's memory site and
/// the second's is `site + 1`; `value` and `aux` are their effective addresses (no
/// instruction address: readers know it from the site table). The first access's
/// read/write bits are [`FLAG_MEM_READ`]/[`FLAG_MEM_WRITE`] and its size bits 16..24; the
/// second's are [`FLAG_MEM2_READ`]/[`FLAG_MEM2_WRITE`] and bits 24..32. Readers expand a
/// pair into two single-access records ([`Record::accesses`]) before anything else.
pub const FLAG_MEM_PAIR: u32 = 1 << 7;
/// A pair's second access reads memory.
pub const FLAG_MEM2_READ: u32 = 1 << 9;
/// A pair's second access writes memory.
pub const FLAG_MEM2_WRITE: u32 = 1 << 10;
/// Where a pair's second size starts.
const FLAG_MEM2_SIZE_SHIFT: u32 = 24;
/// The bits every access of a pair shares (how the record was made and stored).
const PAIR_SHARED: u32 = FLAG_KTIME | FLAG_UPROBE | FLAG_RING | FLAG_INTERPOLATED;

/// The flags of a pair of the single-access memory flags `first` and `second` (the
/// read/write bits and the size, as a lone memory record has them), or `None` when a
/// size does not fit the pair's 8 bits (`fxsave`, `xsave`).
pub const fn pair_flags(first: u32, second: u32) -> Option<u32> {
    let (s1, s2) = (mem_size(first), mem_size(second));
    if s1 > 0xff || s2 > 0xff {
        return None;
    }
    let rw = FLAG_MEM_READ | FLAG_MEM_WRITE;
    Some(
        FLAG_MEM_PAIR
            | (first & rw)
            | (second & rw) << 7
            | s1 << FLAG_MEM_SIZE_SHIFT
            | s2 << FLAG_MEM2_SIZE_SHIFT,
    )
}

impl Record {
    /// The accesses of a memory pair as two single-access records (sites `site` and
    /// `site + 1`, `aux` 0: the instruction's address is the reader's to fill in), or
    /// `None` for any other record.
    pub fn split_pair(&self) -> Option<[Record; 2]> {
        if self.flags & FLAG_MEM_PAIR == 0 {
            return None;
        }
        let f = self.flags;
        let shared = f & PAIR_SHARED;
        let rw = FLAG_MEM_READ | FLAG_MEM_WRITE;
        let first = shared | (f & rw) | ((f >> FLAG_MEM_SIZE_SHIFT) & 0xff) << FLAG_MEM_SIZE_SHIFT;
        let second = shared | (f >> 7) & rw | (f >> FLAG_MEM2_SIZE_SHIFT) << FLAG_MEM_SIZE_SHIFT;
        let one = |site: u32, flags: u32, value: u64| Record {
            site,
            flags,
            time: self.time,
            value,
            aux: 0,
        };
        Some([
            one(self.site, first, self.value),
            one(self.site.wrapping_add(1), second, self.aux),
        ])
    }

    /// Decode a record from its 32 little-endian bytes. Inline: the consumer decodes
    /// every record of the ring (a call across crates cost a tenth of its time).
    #[inline]
    pub fn from_bytes(b: &[u8; RECORD_SIZE]) -> Self {
        Record {
            site: le_u32(b, 0),
            flags: le_u32(b, 4),
            time: le_u64(b, 8),
            value: le_u64(b, 16),
            aux: le_u64(b, 24),
        }
    }
}

/// The little-endian u32 at `b[o..o + 4]`.
#[inline]
pub(crate) fn le_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// The little-endian u64 at `b[o..o + 8]`.
#[inline]
pub(crate) fn le_u64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(rw: u32, size: u32) -> u32 {
        rw | size << FLAG_MEM_SIZE_SHIFT
    }

    #[test]
    fn a_pair_splits_into_the_two_records_it_was_made_of() {
        let (f1, f2) = (
            mem(FLAG_MEM_READ, 8),
            mem(FLAG_MEM_READ | FLAG_MEM_WRITE, 4),
        );
        let flags = pair_flags(f1, f2).unwrap() | FLAG_RING;
        assert_eq!(mem_size(flags), 8);
        let pair = Record {
            site: 41,
            flags,
            time: 7,
            value: 0x1000,
            aux: 0x2004,
        };
        let [a, b] = pair.split_pair().unwrap();
        assert_eq!(
            (a.site, a.flags, a.time, a.value, a.aux),
            (41, f1 | FLAG_RING, 7, 0x1000, 0)
        );
        assert_eq!(
            (b.site, b.flags, b.time, b.value, b.aux),
            (42, f2 | FLAG_RING, 7, 0x2004, 0)
        );
    }

    #[test]
    fn sizes_over_255_are_never_paired() {
        assert_eq!(
            pair_flags(mem(FLAG_MEM_WRITE, 512), mem(FLAG_MEM_READ, 8)),
            None
        );
        assert_eq!(
            pair_flags(mem(FLAG_MEM_READ, 8), mem(FLAG_MEM_READ, 256)),
            None
        );
        assert!(pair_flags(mem(FLAG_MEM_READ, 255), mem(FLAG_MEM_READ, 1)).is_some());
    }

    #[test]
    fn a_single_record_is_no_pair() {
        let r = Record {
            flags: mem(FLAG_MEM_READ, 8),
            ..Record::default()
        };
        assert_eq!(r.split_pair(), None);
    }
}
