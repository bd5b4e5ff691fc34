//! `rewriter INPUT [-o OUT] [--functions GLOB]...`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    version,
    about = "Insert inline trace stubs at function entries of an ELF binary"
)]
struct Args {
    /// The binary to instrument (never modified).
    input: PathBuf,
    /// Output path (default: INPUT.traced, next to the input).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Instrument only functions whose name matches one of these globs (default: all).
    #[arg(long = "functions", num_args = 1..)]
    functions: Vec<String>,
    /// Per-thread buffer slots: threads that can trace at once.
    #[arg(long, default_value_t = tracer_common::DEFAULT_SLOTS)]
    slots: u32,
    /// Records per thread buffer.
    #[arg(long, default_value_t = tracer_common::DEFAULT_BUF_RECORDS)]
    buffer_records: u32,
    /// Trace every selected site with a plain uprobe instead of an inline stub.
    #[arg(long)]
    force_uprobe: bool,
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
    let opts = rewriter::Options {
        functions: args.functions.clone(),
        nslots: args.slots,
        buf_records: args.buffer_records,
        force_uprobe: args.force_uprobe,
    };
    match rewriter::rewrite_file(&args.input, &output, &opts) {
        Ok(r) => {
            println!(
                "{} -> {} ({}): {} sites: {} inline, {} uprobe; {} -> {} bytes",
                args.input.display(),
                output.display(),
                r.kind,
                r.sites,
                r.inline,
                r.uprobe,
                r.input_size,
                r.output_size
            );
            if args.verbose {
                for (f, why) in &r.uprobe_reasons {
                    println!("  uprobe site {f}: {why}");
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
