//! The drains: what takes records out of the traced threads' buffers and into the
//! trace file. `consumer.rs` the kernel ring buffer's consumer and writer threads;
//! `userdrain.rs` the `--user` drain (socket messages and exit stops, no eBPF) with
//! `target_data.rs`, what a traced program hands it, checked before it is believed, and
//! `duration.rs`, its `--min-duration` filter;
//! `stop_drain.rs` what a `-p` session's process still buffers at the end; `remote.rs`
//! another process's memory and ptrace requests. Below the session: a drain uses
//! `record::host` and `tracefile`, never a session module.

pub(crate) mod consumer;
pub(crate) mod duration;
mod packers;
mod remote;
pub(crate) mod stop_drain;
pub mod target_data;
pub(crate) mod userdrain;
