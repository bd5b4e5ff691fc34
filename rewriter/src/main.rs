//! `rewriter INPUT [-o OUT] [--spec FILE] [--functions GLOB]... [--sites KIND,...]
//! [--time record|coarse] [--slots N] [--buffer-records N] [--force-uprobe] [--no-batch] [-v]`

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    version,
    about = "Insert inline trace stubs at function entries and exits of an ELF binary"
)]
struct Args {
    /// The binary to instrument (never modified).
    input: PathBuf,
    /// Output path (default: INPUT.traced, next to the input).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Instrumentation spec (TOML: functions, sites, time, [buffer] records/slots);
    /// the flags below override it.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Instrument only functions whose name matches one of these globs (default: all).
    #[arg(long = "functions", num_args = 1..)]
    functions: Vec<String>,
    /// Site kinds: entry, exit, block, memory, usdt, call (comma-separated; default:
    /// entry).
    #[arg(long, value_delimiter = ',', value_parser = rewriter::spec::parse_kind)]
    sites: Vec<rewriter::SiteKind>,
    /// Timestamps: `record` (cycle counter in every record), `block` (only in basic-block
    /// records; the others take their block's) or `coarse` (none in the stubs; times
    /// interpolated between buffer drains).
    #[arg(long, value_parser = rewriter::spec::parse_time)]
    time: Option<rewriter::TimeMode>,
    /// What entry, exit or block records carry as their value: KIND=SPEC, SPEC a
    /// <sys/sdt.h> argument spec of the binary's ISA (`entry=%rsi`, `block=$7`,
    /// `exit=8@-16(%rbp)`, `entry=x1`).
    #[arg(long = "value", value_parser = rewriter::spec::parse_value)]
    values: Vec<(rewriter::SiteKind, String)>,
    /// Per-thread buffer slots: threads that can trace at once (default: 1024).
    #[arg(long)]
    slots: Option<u32>,
    /// Records per thread buffer (default: 4096; fast-circular: 2048).
    #[arg(long)]
    buffer_records: Option<u32>,
    /// What a full buffer does: `trace` (flushed to the tracer), `circular` (wraps:
    /// the newest records, read at thread exit and on a crash), `fast-circular` (64 KiB
    /// rings that wrap with no check at all).
    #[arg(long, value_parser = rewriter::spec::parse_buf_kind)]
    buffer_kind: Option<u32>,
    /// Trace every selected site with a plain uprobe instead of an inline stub.
    #[arg(long)]
    force_uprobe: bool,
    /// One stub per memory instruction, each access its own record (no access runs).
    #[arg(long)]
    no_batch: bool,
    /// List every uprobe site with the reason it could not be patched inline.
    #[arg(short, long)]
    verbose: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    let output = args.output.clone().unwrap_or_else(|| {
        let mut s = args.input.clone().into_os_string();
        s.push(".traced");
        PathBuf::from(s)
    });
    let mut opts = match options(&args) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A progress bar over the functions of each stage (a terminal only, long jobs only).
    let bar = std::sync::Arc::new(std::sync::Mutex::new(present::progress::Bar::new(
        0,
        "{msg:>13} [{bar:40}] {pos}/{len} functions",
        String::new(),
    )));
    let b = bar.clone();
    opts.progress = rewriter::Progress::new(move |stage, done, total| {
        if let Ok(mut b) = b.lock() {
            if done == 0 {
                b.stage(total, stage);
            }
            b.set_position(done);
        }
    });
    let result = rewriter::rewrite_file(&args.input, &output, &opts);
    if let Ok(b) = bar.lock() {
        b.finish();
    }
    match result {
        Ok(r) => {
            print_report(&args, &output, &opts, &r);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The options: the spec file's, then the flags over them.
fn options(args: &Args) -> rewriter::Result<rewriter::Options> {
    let mut opts = rewriter::Options::default();
    if let Some(path) = &args.spec {
        std::fs::read_to_string(path)
            .map_err(|e| rewriter::Error::Read(path.clone(), e))
            .and_then(|text| {
                rewriter::spec::apply(&path.display().to_string(), &text, &mut opts)
            })?;
    }
    if !args.functions.is_empty() {
        opts.functions = args.functions.clone();
    }
    if !args.sites.is_empty() {
        opts.kinds = args.sites.clone();
    }
    opts.time_mode = args.time.unwrap_or(opts.time_mode);
    if let Some(k) = args.buffer_kind {
        opts.buf_kind = k;
        if let Some(r) = rewriter::spec::default_records(k) {
            opts.buf_records = r;
        }
    }
    opts.nslots = args.slots.unwrap_or(opts.nslots);
    opts.values.extend(args.values.iter().cloned());
    opts.buf_records = args.buffer_records.unwrap_or(opts.buf_records);
    opts.force_uprobe = args.force_uprobe;
    opts.batch &= !args.no_batch;
    Ok(opts)
}

/// What was done: totals, per site kind, and with `-v` each split-off part, uprobe
/// site and untraced site with its reason.
fn print_report(args: &Args, output: &Path, opts: &rewriter::Options, r: &rewriter::Report) {
    println!(
        "{} -> {} ({}): {} sites: {} inline, {} uprobe{}; {} -> {} bytes",
        args.input.display(),
        output.display(),
        r.kind,
        r.sites,
        r.inline,
        r.uprobe,
        untraced(r.untraced),
        r.input_size,
        r.output_size
    );
    for (kind, (inline, uprobe, not)) in &r.per_kind {
        let total = inline + uprobe + not;
        println!(
            "  {:<6} {total} sites: {inline} inline ({:.2}%), {uprobe} uprobe{}",
            kind.name(),
            100.0 * *inline as f64 / total.max(1) as f64,
            untraced(*not)
        );
    }
    println!(
        "  time: {}; buffers: {}; slot lookup: {}; split-off parts: {}",
        opts.time_mode.name(),
        ["trace", "circular", "fast-circular"][opts.buf_kind as usize % 3],
        r.slot_lookup.describe(),
        r.parts.len()
    );
    print_runs(&r.runs);
    if args.verbose {
        for (at, f) in &r.parts {
            println!("  split-off part at {at:#x} of {f}");
        }
        for (f, why) in &r.uprobe_reasons {
            println!("  uprobe site {f}: {why}");
        }
        for (f, why) in &r.untraced_reasons {
            println!("  untraced site {f}: {why}");
        }
    }
}

/// How many memory sites share a stub (access runs), and what ended runs early.
fn print_runs(runs: &rewriter::RunStats) {
    if runs.runs() == 0 {
        return;
    }
    let lens: Vec<String> = runs
        .by_len
        .iter()
        .map(|(l, n)| format!("{n}×{l}"))
        .collect();
    println!(
        "  memory runs: {} sites in {} runs ({}), {} alone",
        runs.batched(),
        runs.runs(),
        lens.join(" "),
        runs.alone
    );
    for (why, n) in &runs.ends {
        println!("    {n} runs stopped at {}", why.describe());
    }
}

/// `, N untraced` when sites were left untraced (none: nothing, the line as before).
fn untraced(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", {n} untraced")
    }
}
