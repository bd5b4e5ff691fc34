//! Reading a trace file back: site names and load biases, every record with its time,
//! coarse times, calls (and those of interpreted programs, `lang`), code symbols. May use `tracefile` and `debuginfo`; `views`
//! builds on it.

pub mod calls;
pub mod coarse;
pub mod events;
pub mod lang;
pub mod names;
pub mod symbols;
