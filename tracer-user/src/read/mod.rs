//! Reading a trace file back: site names and load biases, every record with its time,
//! coarse times, calls, code symbols. May use `tracefile` and `debuginfo`; `views`
//! builds on it.

pub mod calls;
pub mod coarse;
pub mod events;
pub mod names;
pub mod symbols;
