//! What a trace shows to a person or another tool: the report, the dump, exports and
//! flame graphs. May use `read` and `tracefile`.

pub mod export;
pub mod perfetto;
pub mod report;
