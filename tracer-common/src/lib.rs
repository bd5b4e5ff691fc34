//! Types shared by both sides of the tracer: the eBPF programs (`no_std`), the
//! `tracer` binary and the rewriter.
//!
//! Everything here is a wire or memory format; every struct is `#[repr(C)]` with
//! explicit padding so that the rewriter's machine code, the eBPF programs and the
//! user-space reader agree byte for byte. Change a layout → bump its version.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod books;
#[cfg(feature = "std")]
pub mod c_header;
pub mod chunk;
pub mod duration;
pub mod ebpf;
pub mod filter;
pub mod layout;
#[cfg(feature = "std")]
pub mod meta;
pub mod operand;
pub mod record;

pub use books::*;
pub use chunk::*;
pub use layout::*;
pub use record::*;
