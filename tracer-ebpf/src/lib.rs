//! Empty library target: it lets `tracer-user` build-depend on this crate so that cargo
//! rebuilds the tracer when the eBPF sources change. The programs are in the binary
//! target (`src/main.rs`), built for `bpfel-unknown-none` by `tracer-user/build.rs`.
#![no_std]
