//! Everything that can go wrong with an input, each naming the problem.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: not an ELF file (bad magic)")]
    NotElf(String),
    #[error("{0}: truncated or malformed ELF: {1}")]
    Malformed(String, String),
    #[error("{0}: 32-bit ELF files are not supported (only ELF64)")]
    Elf32(String),
    #[error("{0}: big-endian ELF files are not supported")]
    BigEndian(String),
    #[error("{0}: unsupported machine {1:#x} (only x86-64 and AArch64)")]
    UnsupportedMachine(String, u16),
    #[error("{0}: unsupported ELF type {1} (need an executable or a shared library)")]
    UnsupportedType(String, u16),
    #[error(
        "{0}: already rewritten by utrace (it has a {1} section); rewrite the original instead"
    )]
    AlreadyRewritten(String, &'static str),
    #[error(
        "{0}: no functions to instrument (no symbols in .symtab or .dynsym, no .eh_frame FDEs)"
    )]
    NoSymbols(String),
    #[error("{path}: the glob(s) {globs} match no function")]
    NoMatch { path: String, globs: String },
    #[error("bad glob {0:?}: {1}")]
    BadGlob(String, String),
    #[error(
        "{0}: no room for the new segments: the input's segments reach {1:#x}, too close to the end of the user address space"
    )]
    NoRoom(String, u64),
    #[error("{0}: cannot encode the trampolines: {1}")]
    Encode(String, String),
    #[error("{0}: {1}")]
    Layout(String, String),
    #[error("{0}: bad instrumentation spec: {1}")]
    Spec(String, String),
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
