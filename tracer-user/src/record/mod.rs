//! `tracer record`, stage 1: a [`session`] (find the binaries, attach, run or attach to
//! the target, serve, finish the file) and the [`drain`]s it runs (the kernel ring's
//! consumer, the `--user` drain, the stop drain of a `-p` session's end), over the
//! [`host`] facts both use. The session uses the drains; a drain uses neither the
//! session nor anything above `tracefile`. May use `tracefile`, `debuginfo` and
//! `probes`; never `read` or `views`.

pub mod drain;
pub(crate) mod host;
mod session;

pub use session::{
    LiveFeed, OnFull, RecordOptions, Target, Untouched, control, credentials, default_output,
    filters, record, user::record as record_user,
};
