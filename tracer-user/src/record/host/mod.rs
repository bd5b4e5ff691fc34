//! Facts about the host the session runs on: kernel BTF, tracefs and limits, the cycle
//! counter. Used by `record` only.

pub mod btf;
pub mod clock;
pub mod kernel;
