//! The programs' bodies, one file per kind (as aya does): the entry points in `main.rs`
//! only wrap them. Each body is `#[inline(always)]`, so every program is verified as
//! one function plus the shared `#[inline(never)]` helpers, as before the split.

/// `aya_log_ebpf::error!` under the crate's log target: the tracer prints the target
/// with each eBPF log line, and it stays what it was before the programs moved here.
macro_rules! log_error {
    ($ctx:expr, $($arg:tt)+) => {
        aya_log_ebpf::error!($ctx, target: "tracer_ebpf", $($arg)+)
    };
}

pub(crate) mod exit;
pub(crate) mod flush;
pub(crate) mod process;
pub(crate) mod site;

use tracer_common::ebpf::TARGETS_ENDED;

use crate::maps::{SYSTEM_WIDE, TARGETS};

/// Whether process `tgid` is traced (every process in a system-wide session), until
/// the session ends.
#[inline(always)]
pub(crate) fn is_target(tgid: u32) -> bool {
    !ended() && (SYSTEM_WIDE.load() != 0 || TARGETS.get_ptr(tgid).is_some())
}

/// The session is over (`TARGETS_ENDED`).
#[inline(always)]
pub(crate) fn ended() -> bool {
    TARGETS.get_ptr(TARGETS_ENDED).is_some()
}
