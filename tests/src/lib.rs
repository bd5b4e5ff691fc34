//! Support for the integration tests in `tests/tests/`: compile the C fixtures of
//! `tests/fixtures/`, run the rewriter and the tracer (`<workspace>/target/release/`,
//! built by `cargo xtask build`), parse `tracer dump` / `tracer report --json`, read the
//! metadata note of rewritten binaries, and an independent oracle (kernel uprobes via
//! tracefs) that checks what a fixture build really executes.
//!
//! Environment: `UTRACE_KEEP_TMP=1` keeps the temporary directories (they are always
//! kept when a test fails).

pub mod fixture_oracle;
pub mod oracle;
pub mod own_slot;
pub mod site_checks;
pub mod skip;

mod all_kinds;
mod checks;
mod command;
mod compile;
mod derived;
mod dump;
mod hostile_user;
mod paths;
mod readers;
mod real_programs;
mod report;
mod rewriter;
mod same_output;
mod stats;
mod tracer;

pub use all_kinds::*;
pub use checks::*;
pub use command::*;
pub use compile::*;
pub use derived::*;
pub use dump::*;
pub use hostile_user::*;
pub use paths::*;
pub use readers::*;
pub use real_programs::*;
pub use report::*;
pub use rewriter::*;
pub use same_output::*;
pub use stats::*;
pub use tracer::*;
pub use tracer_common::meta::{META_SECTION, Metadata, Site, SiteMode};
pub use tracer_common::{FLAG_KTIME, FLAG_UPROBE};
