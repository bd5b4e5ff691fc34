//! The one record that every site stores (inline stub or uprobe fallback).

/// Version of [`Record`]'s layout; stored in the metadata note and in trace files.
pub const RECORD_VERSION: u32 = 1;
/// Size of a record in bytes. A power of two, so buffers of whole records can wrap by
/// masking (the fast circular buffer of later site kinds).
pub const RECORD_SIZE: usize = 32;

/// One trace event, exactly as the inline stub writes it into the per-thread buffer.
///
/// | offset | field  | function-entry site                                  |
/// |--------|--------|------------------------------------------------------|
/// | 0      | site   | site id (index into the binary's site table)         |
/// | 4      | flags  | `FLAG_*` bits                                        |
/// | 8      | time   | `rdtsc` / `cntvct_el0`, or ktime ns if `FLAG_KTIME`   |
/// | 16     | value  | first argument register (`rdi` / `x0`)               |
/// | 24     | aux    | return address (caller): `[rsp]` / `x30`             |
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

/// `time` is `bpf_ktime_get_ns()` (CLOCK_MONOTONIC ns), not a cycle counter: the record
/// was produced by an eBPF uprobe (an unpatchable site), which cannot read the TSC.
pub const FLAG_KTIME: u32 = 1 << 0;
/// The record came from a uprobe site rather than an inline stub.
pub const FLAG_UPROBE: u32 = 1 << 1;

impl Record {
    /// Decode a record from its 32 little-endian bytes.
    pub fn from_bytes(b: &[u8; RECORD_SIZE]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        Record {
            site: u32_at(0),
            flags: u32_at(4),
            time: u64_at(8),
            value: u64_at(16),
            aux: u64_at(24),
        }
    }
}
