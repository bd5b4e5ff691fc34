//! Reading a trace file back: site names, every record with its time, coarse times,
//! calls, code symbols. May use `tracefile`; `views` builds on it.

pub mod calls;
pub mod coarse;
pub mod symbols;
