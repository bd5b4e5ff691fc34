//! Reading a trace file back: memory pairs expanded (`accesses`), site names and load biases, every record with its time,
//! coarse times, calls (and those of interpreted programs, `lang`), code symbols. May use `tracefile` and `debuginfo`; `views`
//! builds on it.

pub(crate) mod accesses;
pub(crate) mod calls;
pub(crate) mod coarse;
pub(crate) mod events;
pub(crate) mod lang;
pub(crate) mod names;
pub(crate) mod range;
pub(crate) mod symbols;
