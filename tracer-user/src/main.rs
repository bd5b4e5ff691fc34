//! `tracer`: records traces of instrumented binaries (see the `record`, `report` and
//! `dump` commands) with the eBPF programs of crate `tracer-ebpf`; the stages are the
//! library's (`tracer_user`), this CLI uses them all.
//!
//! Commands: `record`, `filter`, `report`, `export`, `flamegraph`, `dump`.

use std::{
    ffi::OsString,
    io::{BufWriter, ErrorKind},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use tracer_common::ebpf::DEFAULT_RING_BYTES;

use tracer_user::{
    TimePoint, TimeRange, record,
    record::filters::FilterSpec,
    record::{OnFull, RecordOptions, Target},
    views,
};

#[derive(Parser)]
#[command(
    name = "tracer",
    version,
    about = "Trace instrumented binaries with eBPF"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command (`record -- CMD ARGS...`), attach to a process (`record -p PID`) or
    /// trace every process running an instrumented binary (`record --system-wide`) and
    /// record its instrumented binaries' records; exits with the command's status.
    Record(RecordArgs),
    /// Change the in-kernel filters of a running session (records are judged when they
    /// are drained: those still buffered by the new filter). Without filter options:
    /// show the session's filter.
    Filter {
        /// The session: its tracer's pid (default: the only running session).
        #[arg(long, value_name = "TRACER_PID")]
        session: Option<u32>,
        /// Remove every filter.
        #[arg(long)]
        clear: bool,
        #[command(flatten)]
        filter: FilterSpec,
    },
    /// Write a trace in another tool's format: `perfetto` (Perfetto's protobuf trace,
    /// for ui.perfetto.dev, any size) or `chrome` (trace event JSON for chrome://tracing,
    /// small traces): a slice per function call, instants for other records, a track
    /// per thread with its name, drops as counters; `parquet` (for SQL engines: a
    /// directory of records.parquet, a row per record (a memory pair: a row per
    /// access), and calls.parquet, a row per completed call).
    Export {
        file: PathBuf,
        #[arg(long, default_value = "perfetto")]
        format: String,
        /// Output file (a directory for `parquet`).
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        range: RangeArgs,
        #[command(flatten)]
        debug: DebugDirs,
    },
    /// Draw a flame graph (SVG) of the self time of each call stack, from the entry and
    /// exit records of a trace.
    Flamegraph {
        file: PathBuf,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        /// The graph's title.
        #[arg(long)]
        title: Option<String>,
        #[command(flatten)]
        range: RangeArgs,
        #[command(flatten)]
        debug: DebugDirs,
    },
    /// Summarize a trace: records per site (function, file:line, inlined frames), call
    /// times from entry/exit pairs (total, self, latency histograms), per-thread
    /// summaries, the books (delivered, filtered, dropped), binaries and their debug
    /// information.
    Report {
        /// The trace (with --diff: the old run's).
        file: PathBuf,
        /// With --diff: the new run's trace.
        #[arg(requires = "diff")]
        new: Option<PathBuf>,
        /// Compare two runs, `report --diff OLD NEW`: per function, calls, total and self
        /// time in each and their change, by the change of total time.
        #[arg(long, requires = "new", conflicts_with = "last")]
        diff: bool,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also list each thread's last N records, newest first (with circular
        /// buffers: what ran last before the thread exited or crashed).
        #[arg(long, value_name = "N")]
        last: Option<usize>,
        #[command(flatten)]
        range: RangeArgs,
        #[command(flatten)]
        debug: DebugDirs,
    },
    /// One tab-separated line per record, in delivery order:
    /// pid tid binary site symbol value aux time_ns flags.
    Dump {
        file: PathBuf,
        #[command(flatten)]
        range: RangeArgs,
    },
}

/// `tracer record`'s options.
#[derive(clap::Args)]
struct RecordArgs {
    /// Trace file to write.
    #[arg(short, long, default_value = record::default_output().as_os_str())]
    output: PathBuf,
    /// Write the trace in segments OUTPUT.1, OUTPUT.2, ..., a new one every SIZE bytes
    /// (suffixes K, M, G) or every TIME (suffixes s, m, h); each is readable on its own,
    /// and readers given OUTPUT read them all as one trace.
    #[arg(long, value_name = "SIZE|TIME", value_parser = parse_split)]
    split: Option<Split>,
    /// Keep the newest segments within SIZE (suffixes K, M, G): the oldest are removed
    /// whole and their records counted as "rotated out" (segments of a quarter of SIZE
    /// unless --split says).
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    max_size: Option<u64>,
    /// Size of the kernel ring buffer (power of two; suffixes K, M, G).
    #[arg(long, value_parser = parse_size, default_value_t = DEFAULT_RING_BYTES)]
    ring_bytes: u32,
    /// When the ring buffer has no room for a full buffer: `wait` (the thread waits
    /// until the tracer has caught up, at most about 5 s per buffer; nothing is lost)
    /// or `drop` (the records are dropped and counted; the program never waits).
    #[arg(long, value_enum, default_value_t = OnFull::Wait)]
    on_full: OnFull,
    /// Attach to this running process instead of running a command.
    #[arg(short, long, conflicts_with = "command")]
    pid: Option<u32>,
    /// Every process that runs an instrumented binary or library: those running now
    /// and those started later, until Ctrl-C or --duration.
    #[arg(short = 'a', long, conflicts_with_all = ["command", "pid"])]
    system_wide: bool,
    /// With -p or --system-wide: stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    #[command(flatten)]
    filter: FilterSpec,
    /// Also trace an untouched (not rewritten) binary by uprobes: its functions
    /// matching the globs (all when none), e.g. `--uprobe /usr/lib/libz.so.1:deflate*`
    /// (repeatable). Records are the same as a rewritten binary's.
    #[arg(long = "uprobe", value_name = "PATH[:GLOB,...]")]
    uprobes: Vec<String>,
    /// Also trace the USDT probes of an untouched binary by uprobes (repeatable).
    #[arg(long = "usdt", value_name = "PATH")]
    usdt: Vec<PathBuf>,
    /// User-space drain: no eBPF, no privileges; full buffers come over a socket
    /// and leftovers at thread exit are read with ptrace.
    #[arg(long, conflicts_with = "pid")]
    user: bool,
    /// A live view on the terminal while the session runs, redrawn every second:
    /// records per second, drops, top functions by records and by self time, the
    /// busiest threads (nothing when stderr is not a terminal).
    #[arg(long, conflicts_with = "user")]
    live: bool,
    /// Also trace this instrumented binary (repeatable): for a command that is not
    /// itself instrumented but runs one, e.g. `--user --binary ./prog.traced --
    /// qemu-aarch64 ./prog.traced`. Its metadata goes into the trace file.
    #[arg(long = "binary", value_name = "PATH", conflicts_with = "pid")]
    binaries: Vec<PathBuf>,
    /// Run the command (and the dynamic loader asked for its libraries) as this user:
    /// a name or uid, with an optional group (name or gid); the user's groups, no
    /// capability. The tracer itself stays root: it loads eBPF, attaches the uprobes
    /// and writes into the traced processes. Under sudo (the tracer is root and
    /// SUDO_UID is set) the default is the user who ran sudo; `--run-as root` keeps
    /// the command root.
    #[arg(long, value_name = "USER[:GROUP]", conflicts_with_all = ["pid", "system_wide"])]
    run_as: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true)]
    command: Vec<OsString>,
}

/// `--since/--until`: only the records of a time range.
#[derive(clap::Args)]
struct RangeArgs {
    /// Only records at or after this time: seconds from the session's start (1.5, 1.5s,
    /// 250ms, 40us, 100ns) or @ and CLOCK_MONOTONIC ns (as `dump` prints times).
    #[arg(long, value_name = "TIME")]
    since: Option<TimePoint>,
    /// Only records before this time (the same forms as --since).
    #[arg(long, value_name = "TIME")]
    until: Option<TimePoint>,
}

impl RangeArgs {
    fn range(&self) -> TimeRange {
        TimeRange {
            since: self.since,
            until: self.until,
        }
    }
}

/// Where to look for debug information besides the binary, the tracer's cache and
/// `/usr/lib/debug`.
#[derive(clap::Args)]
struct DebugDirs {
    /// A directory of debug files (`.build-id/xx/yyyy.debug`, or files named by a
    /// binary's `.gnu_debuglink`); repeatable.
    #[arg(long = "debug-dir", value_name = "DIR")]
    dirs: Vec<PathBuf>,
}

/// `--split`: a size or a time.
#[derive(Clone, Copy, Debug)]
enum Split {
    Bytes(u64),
    Every(std::time::Duration),
}

fn parse_split(s: &str) -> Result<Split, String> {
    let time = [("s", 1.0), ("m", 60.0), ("h", 3600.0)]
        .iter()
        .find_map(|(unit, secs)| Some((s.strip_suffix(unit)?.parse::<f64>().ok()?, *secs)));
    match time {
        Some((v, secs)) if v > 0.0 && v.is_finite() => {
            Ok(Split::Every(std::time::Duration::from_secs_f64(v * secs)))
        }
        Some(_) => Err(format!("{s:?} is not a time above 0")),
        None => parse_bytes(s).map(Split::Bytes),
    }
}

/// A count of bytes with an optional suffix K, M or G.
fn bytes_with_suffix(s: &str) -> Option<u64> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// A size in bytes (suffixes K, M, G), at least 64 KiB.
fn parse_bytes(s: &str) -> Result<u64, String> {
    bytes_with_suffix(s)
        .filter(|&n| n >= 64 << 10)
        .ok_or_else(|| format!("{s:?} is not a size of at least 64K"))
}

fn parse_size(s: &str) -> Result<u32, String> {
    bytes_with_suffix(s)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("{s:?} is not a size below 4G"))
}

/// `tracer record`: the options checked, then an eBPF or a user-space session.
fn run_record(args: RecordArgs) -> Result<i32> {
    let RecordArgs {
        output,
        split,
        max_size,
        ring_bytes,
        on_full,
        pid,
        system_wide,
        duration,
        filter,
        uprobes,
        usdt,
        user,
        live,
        binaries,
        run_as,
        command,
    } = args;
    let rotation = tracer_user::tracefile::Rotation {
        split_bytes: match split {
            Some(Split::Bytes(b)) => Some(b),
            _ => None,
        },
        split_every: match split {
            Some(Split::Every(d)) => Some(d),
            _ => None,
        },
        max_bytes: max_size,
    };
    let mut untouched: Vec<record::Untouched> = uprobes
        .iter()
        .map(|spec| record::Untouched::parse_uprobe(spec))
        .collect();
    untouched.extend(usdt.into_iter().map(|path| record::Untouched {
        path,
        functions: Vec::new(),
        usdt: true,
    }));
    if user && !untouched.is_empty() {
        bail!("--uprobe/--usdt need eBPF: not with --user");
    }
    let duration = duration
        .map(Duration::try_from_secs_f64)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--duration: {e}"))?;
    if duration.is_some() && pid.is_none() && !system_wide {
        bail!("--duration is for -p PID or --system-wide (a command ends by itself)");
    }
    let run_as = if command.is_empty() {
        None
    } else {
        record::credentials::RunAs::for_record(run_as.as_deref())?
    };
    // The user drain has the duration filter only.
    let kernel_only = FilterSpec {
        min_duration: None,
        ..filter.clone()
    };
    if user && !kernel_only.is_empty() {
        bail!("filters run in the eBPF drain: not with --user (only --min-duration)");
    }
    if user {
        if command.is_empty() {
            bail!("--user needs a command: `tracer record --user -- CMD ARGS...`");
        }
        let opts = RecordOptions {
            output,
            rotation,
            ring_bytes,
            on_full,
            target: Target::Exec(command.clone()),
            binaries,
            filter,
            untouched,
            live: None,
            run_as,
        };
        return record::record_user(opts, command);
    }
    let target = match (pid, command.is_empty()) {
        _ if system_wide => Target::SystemWide { duration },
        (Some(pid), true) => Target::Attach { pid, duration },
        (None, false) => Target::Exec(command),
        _ => bail!("give a command (`tracer record -- CMD ARGS...`), -p PID or --system-wide"),
    };
    record::record(RecordOptions {
        output,
        rotation,
        ring_bytes,
        on_full,
        target,
        binaries,
        filter,
        untouched,
        live: if live { live_view()? } else { None },
        run_as,
    })
}

/// `record --live`: the view on stderr, if stderr is a terminal.
fn live_view() -> Result<Option<record::LiveFeed>> {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return Ok(None);
    }
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (view, tee) = views::top::start(dropped.clone())?;
    Ok(Some(record::LiveFeed {
        tee,
        dropped,
        done: Box::new(move || view.finish()),
    }))
}

fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Cmd::Record(args) => run_record(args),
        Cmd::Filter {
            session,
            clear,
            filter,
        } => {
            if clear && !filter.is_empty() {
                bail!("--clear removes every filter: give no filter options with it");
            }
            filter.validate()?;
            let req = record::control::Request {
                filter: (clear || !filter.is_empty()).then_some(filter),
                show: false,
            };
            let reply = record::control::request(session, &req)?;
            if !reply.ok {
                bail!("{}", reply.message);
            }
            println!("{}", reply.message);
            Ok(0)
        }
        Cmd::Report {
            file,
            new: Some(new),
            json,
            range,
            debug,
            ..
        } => {
            views::diff::report_diff(
                &file,
                &new,
                &range.range(),
                json,
                &debug.dirs,
                &mut BufWriter::new(std::io::stdout().lock()),
            )?;
            Ok(0)
        }
        Cmd::Report {
            file,
            json,
            last,
            range,
            debug,
            ..
        } => {
            views::report(
                &file,
                &range.range(),
                json,
                last.unwrap_or(0),
                &debug.dirs,
                &mut BufWriter::new(std::io::stdout().lock()),
            )?;
            Ok(0)
        }
        Cmd::Export {
            file,
            format,
            output,
            range,
            debug,
        } => {
            views::export::export(&file, &range.range(), &format, &output, &debug.dirs)?;
            Ok(0)
        }
        Cmd::Flamegraph {
            file,
            output,
            title,
            range,
            debug,
        } => {
            views::flamegraph::flamegraph(
                &file,
                &range.range(),
                &output,
                title.as_deref(),
                &debug.dirs,
            )?;
            Ok(0)
        }
        Cmd::Dump { file, range } => {
            views::dump::dump(
                &file,
                &range.range(),
                &mut BufWriter::new(std::io::stdout().lock()),
            )?;
            Ok(0)
        }
    }
}

/// What the tracer inherited (rlimits, signal mask and dispositions, nice), saved for
/// the commands it runs before anything changes it: from `.init_array`, since Rust's
/// runtime ignores SIGPIPE before `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static SAVE_INHERITED: extern "C" fn() = save_inherited;

extern "C" fn save_inherited() {
    record::credentials::save_inherited();
}

fn main() {
    // Saved already (above); again in case a platform skipped the constructor.
    record::credentials::save_inherited();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        // `tracer dump FILE | head` is not an error.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
            }) =>
        {
            0
        }
        Err(e) => {
            eprintln!("tracer: error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
