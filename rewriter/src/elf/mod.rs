//! The ELF file: [`read`] parses and checks the input, [`write`] appends the new
//! segments, headers and metadata to an unmodified copy of it.

pub mod read;
pub mod write;
