//! Support for the integration tests in `tests/tests/`: compile the C fixtures of
//! `tests/fixtures/`, run the rewriter and the tracer (`<workspace>/target/release/`,
//! built by `cargo xtask build`), parse `tracer dump` / `tracer report --json`, read the
//! metadata note of rewritten binaries, and an independent oracle (kernel uprobes via
//! tracefs) that checks what a fixture build really executes.
//!
//! Environment: `UTRACE_KEEP_TMP=1` keeps the temporary directories (they are always
//! kept when a test fails).
//!
//! A module per concern: `paths`, `command`, `compile`, `rewriter`, `tracer`, `dump`,
//! `report`, `checks`, `same_output` (a rewritten program alone and under the tracer),
//! `fixture_oracle` (what matrix.c and app_so.c must record), `own_slot`, `oracle` (kernel
//! uprobes on the original), `site_checks`, `real_programs`, `all_kinds`, `stats`,
//! `readers` (Perfetto protos through `tests/tools/perfetto_summary.py`, Parquet through
//! `duckdb_query.py`), `hostile_user` (`LocalUser`: a real unprivileged user, `useradd
//! --system`, `setpriv --reuid --regid --clear-groups`; each trust test's doc comment says
//! what its attack did before), `skip` (a missing tool fails a test unless `cargo xtask test
//! --allow-skip TOOL`), `derived` (site-count floors binutils derive from the binary under
//! test), `lackey` (valgrind's lackey: executions of memory sites on the original),
//! `bench_sqlite` (the bench's sqlite3 and a workload for it); `rewriter` also builds
//! diff_runs.c (two runs to compare, time ranges).
//!
//! The integration tests stay one binary per file, run one after another: system-wide
//! sessions, the tracer-kill, stress and signal tests would otherwise run at the same time
//! and see each other's processes. `python.rs` counts python3.11's functions by name against
//! bpftrace. The AArch64 signal and relocation tests read buffers in-process
//! (`tests/fixtures/inspect.c`).

pub mod bench_sqlite;
pub mod fixture_oracle;
pub mod lackey;
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
