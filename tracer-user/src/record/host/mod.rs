//! Facts about the host the session runs on: kernel BTF, tracefs and limits, the cycle
//! counter. Used by `record` only.

pub(crate) mod btf;
pub(crate) mod clock;
pub(crate) mod kernel;
