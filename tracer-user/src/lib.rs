//! The tracer's stages, in the order a record travels: `record` → `tracefile` → `read`
//! → `views`; `tracefile`, `debuginfo`, `probes` and `wording` are the layers both ends
//! share. A module uses only its own stage and the layers below it. The `tracer` binary (`main.rs`) is the
//! CLI over them; the fuzz targets (`fuzz/`) drive the parsers directly.

#![warn(unreachable_pub)]

pub(crate) mod debuginfo;
pub(crate) mod probes;
pub(crate) mod read;
/// `--since/--until` of the readers.
pub use read::range::{TimePoint, TimeRange};
pub mod record;
pub mod tracefile;
pub mod views;
pub(crate) mod wording;
