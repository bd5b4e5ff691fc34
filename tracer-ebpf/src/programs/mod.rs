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

pub mod exit;
pub mod flush;
pub mod process;
pub mod site;

use crate::maps::{SYSTEM_WIDE, TARGETS};

/// Whether process `tgid` is traced (every process in a system-wide session).
#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    SYSTEM_WIDE.load() != 0 || TARGETS.get_ptr(tgid).is_some()
}
