//! The ELF file: [`read`] parses and checks the input, [`write`] appends the new
//! segments, headers and metadata to an unmodified copy of it; [`imports`] names
//! what calls into other objects go to.

pub(crate) mod imports;
pub mod read;
pub(crate) mod write;
