//! In-kernel filters: what the eBPF drain keeps (see `tracer-ebpf/src/filter.rs`).
//!
//! A drain delivers one thread's records, so the per-thread tests (pid, tid, uid,
//! cgroup, process name) run once per drain and the per-record tests (site set, value
//! range, sampling) once per record. A record that fails a test is counted in
//! `STAT_RECORDS_FILTERED`: produced = delivered + filtered + dropped.
//!
//! The tracer changes filters while a session runs (`tracer filter`): `FILTER` has two
//! entries and `FILTER_ACTIVE` says which one the programs read; the tracer writes the
//! other one, then flips the index, so a program never sees half a configuration.
//! Site sets live in `FILTER_SITES`, keyed by generation (the entry's index), binary
//! id and 64-site word.
//!
//! Filters judge records when they are drained, not when made: records still buffered at a
//! change are judged by the new filter, sampling (1 in N) is counted per CPU, and a value
//! filter on a memory or USDT uprobe site sees the value before its operands are evaluated
//! (0). The filter ids (pids, tids) are not double-buffered like the configuration: for the
//! instant of a change a drain may see the new ids with the old configuration.
//!
//! A memory pair (`FLAG_MEM_PAIR`: the accesses of sites `s` and `s + 1` in one record) is
//! kept or dropped whole, and counted as one record: it passes the site test if `s` or
//! `s + 1` is selected and the value test if either effective address (`value`, `aux`)
//! is in range, so a filtered trace may hold an access of an unselected site beside its
//! selected partner; sampling takes or leaves both.

/// Keep only the pids (tgids) in `FILTER_IDS` (key `id_key(ID_PID, pid)`).
pub const F_PID: u32 = 1 << 0;
/// Keep only the tids in `FILTER_IDS` (key `id_key(ID_TID, tid)`).
pub const F_TID: u32 = 1 << 1;
/// Keep only threads whose real uid is `uid`.
pub const F_UID: u32 = 1 << 2;
/// Keep only threads in cgroup (v2) `cgroup`.
pub const F_CGROUP: u32 = 1 << 3;
/// Keep only threads whose name (`comm`) matches one of `comm`.
pub const F_COMM: u32 = 1 << 4;
/// Keep only records of the sites set in `FILTER_SITES` (a memory pair: either site).
pub const F_SITES: u32 = 1 << 5;
/// Keep only records with `value_min <= value <= value_max` (a memory pair: `value`
/// or `aux`).
pub const F_VALUE: u32 = 1 << 6;
/// Keep one record in `sample` (per CPU).
pub const F_SAMPLE: u32 = 1 << 7;
/// Keep only calls that lasted at least `min_duration` cycle-counter ticks (see
/// `duration`); entries wait for their exits in `CALL_STACKS`.
pub const F_DURATION: u32 = 1 << 8;
/// The tests that run once per drain.
pub const F_PER_THREAD: u32 = F_PID | F_TID | F_UID | F_CGROUP | F_COMM;
/// The tests that run once per record.
pub const F_PER_RECORD: u32 = F_SITES | F_VALUE | F_SAMPLE | F_DURATION;

/// Process-name patterns per filter.
pub const MAX_COMMS: usize = 4;
pub const COMM_LEN: usize = 16;

/// `FILTER_IDS` key kinds.
pub const ID_PID: u64 = 1;
pub const ID_TID: u64 = 2;

pub const fn id_key(kind: u64, id: u32) -> u64 {
    (kind << 32) | id as u64
}

/// `FILTER_SITES` key: `[binary_id, generation << 32 | site / 64]`; the value's bit
/// `site % 64` is set for a site that passes.
pub const fn site_key(binary_id: u64, generation: u32, site: u32) -> [u64; 2] {
    [binary_id, ((generation as u64) << 32) | (site / 64) as u64]
}

/// One filter configuration (a `FILTER` entry). All-zero = keep everything.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterConfig {
    /// `F_*` tests that are on (a record must pass all of them).
    pub flags: u32,
    pub uid: u32,
    pub cgroup: u64,
    pub value_min: u64,
    pub value_max: u64,
    /// Keep 1 in `sample` records (F_SAMPLE; 0 and 1 keep all).
    pub sample: u64,
    /// F_DURATION: the threshold in cycle-counter ticks (0: every call passes).
    pub min_duration: u64,
    /// Number of `comm` patterns in use.
    pub ncomm: u32,
    pub _pad: u32,
    /// Per pattern: the name as two little-endian words, and the bits that must match
    /// (a pattern `name*` masks its prefix; an exact name covers its NUL too). Words,
    /// not bytes: a byte loop costs the verifier too many states.
    pub comm: [[u64; 2]; MAX_COMMS],
    pub comm_mask: [[u64; 2]; MAX_COMMS],
}

const _: () = assert!(core::mem::size_of::<FilterConfig>() == 184);

impl FilterConfig {
    /// Whether thread name `comm` (NUL-padded, as the kernel keeps it) matches
    /// pattern `i`.
    #[inline(always)]
    pub fn comm_matches(&self, i: usize, comm: &[u64; 2]) -> bool {
        let (p, m) = (&self.comm[i], &self.comm_mask[i]);
        (comm[0] ^ p[0]) & m[0] == 0 && (comm[1] ^ p[1]) & m[1] == 0
    }

    /// Set pattern `i` to the first `len` bytes of `name` (`len` <= 16).
    pub fn set_comm(&mut self, i: usize, name: &[u8], len: usize) {
        let mut bytes = [0u8; COMM_LEN];
        let mut mask = [0u8; COMM_LEN];
        for k in 0..len.min(COMM_LEN) {
            bytes[k] = name.get(k).copied().unwrap_or(0);
            mask[k] = 0xff;
        }
        let word = |b: &[u8; COMM_LEN], w: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[w * 8..w * 8 + 8]);
            u64::from_le_bytes(a)
        };
        self.comm[i] = [word(&bytes, 0), word(&bytes, 1)];
        self.comm_mask[i] = [word(&mask, 0), word(&mask, 1)];
    }
}

// SAFETY: plain old data without padding holes, any bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for FilterConfig {}
