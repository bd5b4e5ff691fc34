//! `cargo xtask bench`: ns per event, side by side, for
//! 1. the untraced loop (bench.c calling a noinline function N times),
//! 2. the rewritten loop (inline stubs, no tracer: the flush just resets the buffer),
//! 3. the rewritten loop under `tracer record`,
//! 4. a hand-written inline store of the same 32-byte record (bench.c -DHANDWRITTEN),
//! 5. a plain kernel uprobe + eBPF program on the same function (`rewriter
//!    --force-uprobe --functions hit`: the site is left untouched and the tracer attaches
//!    its `site` program there), with fewer iterations.
//!
//! Every fixture measures itself (clock_gettime around the loop); we take the best of
//! `--runs` runs.
//!
//! Then a very large real binary (`--large-only`: just this part; `--no-large`: skip
//! it): every function entry of the toolchain's own `librustc_driver-*.so` (~150 MB)
//! rewritten, wall time (best of `--large-runs`) and size against the goals (under 2 s
//! per 50 MB of input, under 1.3x the input size), the coverage line; then a private
//! copy of the sysroot (a copy of `bin/rustc`, the rewritten driver, symlinks to the
//! rest) must behave like the original: `rustc --version --verbose`, and a small program
//! compiled by each (compiler output and the program's output identical).
//! `--large-trace` also compiles it under `tracer record` (slow: see [`large::large_binary`]).
//!
//! Between the two: drain throughput (`drain/`): records per second through
//! flush → eBPF (filter) → ring buffer → tracer → trace file, 1 and 2 producing threads,
//! and the per-record cost of the in-kernel filters (`--no-drain`: skip it).
//!
//! Then the readers (`readers.rs`): `report`, `export --format perfetto` and
//! `flamegraph` of a trace of `--readers-records` records: time, records/s, peak memory;
//! `report` of a tenth of it by `--since/--until` (`--no-readers`: skip it).
//!
//! Then a real program (`real/`): the sqlite3 CLI with every function's entry and exit
//! traced, end to end under `tracer record`, side by side with uftrace in one run (wall,
//! slowdown, records, lost, bytes per record, the tracer's own CPU; `--real-rows`,
//! `--no-real`).
//!
//! Then Python (`real/python.rs`): python3.11 with its functions named by the tracer
//! (USDT strings read by the drains) beside bpftrace, ns per probe event (`--no-real`
//! skips it too).
//!
//! Then memtrace (`real/memtrace.rs`): the same sqlite3 with every memory access traced,
//! one stub an access (`--no-batch`) and access runs, alone and under `tracer record`,
//! beside valgrind's lackey (`--memtrace-rows`, `--memtrace-lackey-rows`; `--no-real`
//! skips it too).
//!
//! `--only events|drain|readers|real|python|memtrace|large` runs one section alone.

mod aarch64_smoke;
mod drain;
mod events;
mod large;
mod measure;
mod process;
mod readers;
mod real;
mod table;
mod usdt;
mod workload;

use anyhow::Result;

pub(crate) use real::sqlite3;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Loop iterations of the untraced, inline and hand-written runs.
    #[arg(long, default_value_t = 20_000_000)]
    iterations: u64,
    /// Iterations of the run under `tracer record` (every one is delivered and stored).
    #[arg(long, default_value_t = 5_000_000)]
    tracer_iterations: u64,
    /// Iterations of the plain-uprobe run.
    #[arg(long, default_value_t = 200_000)]
    uprobe_iterations: u64,
    /// Runs per variant; the best is reported.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Only the large-binary part (rewriting the toolchain's librustc_driver).
    #[arg(long, conflicts_with = "no_large")]
    large_only: bool,
    /// Skip the large-binary part.
    #[arg(long)]
    no_large: bool,
    /// Rewrites of the large binary; the best time is reported.
    #[arg(long, default_value_t = 3)]
    large_runs: u32,
    /// Also compile with the rewritten rustc under `tracer record`.
    #[arg(long)]
    large_trace: bool,
    /// Run only this section.
    #[arg(long, value_enum, conflicts_with_all = ["large_only", "no_large", "no_drain", "no_readers", "no_real"])]
    only: Option<Section>,
    /// Skip the drain-throughput section.
    #[arg(long)]
    no_drain: bool,
    /// Records per session of the drain section (calls of the instrumented function,
    /// shared by the producing threads).
    #[arg(long, default_value_t = 20_000_000)]
    drain_records: u64,
    /// Skip the readers section.
    #[arg(long)]
    no_readers: bool,
    /// Single-row INSERTs of the real-program section's sqlite workload.
    #[arg(long, default_value_t = 200_000)]
    real_rows: u64,
    /// Runs of every real-program row, interleaved; the table shows each row's median.
    #[arg(long, default_value_t = 3)]
    real_rounds: usize,
    /// Also run the real-program section's `tracer record` rows with the rewriter and
    /// tracer in DIR (another build's `target/release`): before and after in one run.
    #[arg(long, value_name = "DIR")]
    real_baseline: Option<std::path::PathBuf>,
    /// After the real-program table, profile one more session of each mode (`perf
    /// record`) and print the ns a record of each stage of the record's path.
    #[arg(long)]
    real_profile: bool,
    /// Skip the real-program section.
    #[arg(long)]
    no_real: bool,
    /// Single-row INSERTs of the memtrace section's utrace rows.
    #[arg(long, default_value_t = 20_000)]
    memtrace_rows: u64,
    /// Single-row INSERTs of the memtrace section's lackey row (and its untraced run).
    #[arg(long, default_value_t = 1_000)]
    memtrace_lackey_rows: u64,
    /// Runs of every memtrace row, interleaved; the table shows each row's median.
    #[arg(long, default_value_t = 3)]
    memtrace_rounds: usize,
    /// Records of the trace the readers section reads.
    #[arg(long, default_value_t = 30_000_000)]
    readers_records: u64,
    /// Sessions per row of the drain section; the least disturbed one (least CPU on the
    /// record path) is reported.
    #[arg(long, default_value_t = 2)]
    drain_runs: u32,
}

/// The sections of the bench.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    /// ns per event of the stubs (and the other site kinds, USDT, the AArch64 smoke).
    Events,
    /// Drain throughput: records/s through flush, eBPF, ring buffer, tracer, file.
    Drain,
    /// Reading a big trace back: report, Perfetto export, flame graph.
    Readers,
    /// The large binary (librustc_driver).
    Large,
    /// A real program (sqlite3) with every function traced, side by side with uftrace.
    Real,
    /// Python's own functions by name (USDT strings), side by side with bpftrace.
    Python,
    /// sqlite3 with every memory access traced, side by side with valgrind's lackey.
    Memtrace,
}

/// `cargo xtask bench`: build, then the sections `args` selects, in order.
pub(crate) fn bench(args: &Args) -> Result<()> {
    crate::build()?;
    println!("== cargo xtask bench");
    let run = |s: Section| match args.only {
        Some(only) => only == s,
        None => match s {
            Section::Events => !args.large_only,
            Section::Drain => !args.large_only && !args.no_drain,
            Section::Readers => !args.large_only && !args.no_readers,
            Section::Large => !args.no_large,
            Section::Real | Section::Python | Section::Memtrace => {
                !args.large_only && !args.no_real
            }
        },
    };
    if run(Section::Events) {
        events::ns_per_event(args)?;
    }
    if run(Section::Drain) {
        drain::drain_throughput(&drain::Options {
            records: args.drain_records,
            runs: args.drain_runs,
        })?;
    }
    if run(Section::Readers) {
        readers::readers(args.readers_records)?;
    }
    if run(Section::Real) {
        real::real(
            args.real_rows,
            args.real_rounds,
            args.real_baseline.as_deref(),
            args.real_profile,
        )?;
    }
    if run(Section::Python) {
        real::python()?;
    }
    if run(Section::Memtrace) {
        real::memtrace(&real::MemtraceOptions {
            rows: args.memtrace_rows,
            lackey_rows: args.memtrace_lackey_rows,
            rounds: args.memtrace_rounds,
        })?;
    }
    if run(Section::Large) {
        large::large_binary(args)?;
    }
    Ok(())
}
