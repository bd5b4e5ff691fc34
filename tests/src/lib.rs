//! Support for the integration tests in `tests/tests/`: compile the C fixtures of
//! `tests/fixtures/`, run the rewriter and the tracer (`<workspace>/target/release/`,
//! built by `cargo xtask build`), parse `tracer dump` / `tracer report --json`, read the
//! metadata note of rewritten binaries, and an independent oracle (kernel uprobes via
//! tracefs) that checks what a fixture build really executes.
//!
//! Environment: `UTRACE_KEEP_TMP=1` keeps the temporary directories (they are always
//! kept when a test fails).

pub mod oracle;
pub mod site_checks;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
pub use tracer_common::meta::{META_SECTION, Metadata, Site, SiteMode};
pub use tracer_common::{FLAG_KTIME, FLAG_UPROBE};

/// Default timeout of a fixture run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// Timeout of a `tracer record` session or a `tracer dump`.
pub const TRACE_TIMEOUT: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------------------
// Paths

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// `<workspace>/target/release/NAME` (or under `$CARGO_TARGET_DIR`, as cargo builds it).
fn release_bin(name: &str) -> PathBuf {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => workspace_root().join(d),
        _ => workspace_root().join("target"),
    };
    let p = target.join("release").join(name);
    assert!(
        p.is_file(),
        "{} does not exist: build it first (cargo xtask build, or run the tests with cargo xtask test)",
        p.display()
    );
    p
}

pub fn rewriter_bin() -> PathBuf {
    release_bin("rewriter")
}

pub fn tracer_bin() -> PathBuf {
    release_bin("tracer")
}

/// A scratch directory, removed on drop unless the test panicked or `UTRACE_KEEP_TMP`
/// is set.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("utrace-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
        TempDir(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("UTRACE_KEEP_TMP").is_some() {
            eprintln!("keeping {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Running commands

/// What a finished command did.
#[derive(Debug, Clone)]
pub struct Out {
    pub cmdline: String,
    /// Exit code, or None when killed by a signal.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Out {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// Exit status as one comparable value: the code, or 128 + signal.
    pub fn status(&self) -> i32 {
        self.code.unwrap_or(128 + self.signal.unwrap_or(0))
    }
    /// Panic (with the command's output) unless it exited with code 0.
    pub fn ok(self) -> Out {
        if !self.success() {
            panic!("command failed: {}", self.describe());
        }
        self
    }
    pub fn describe(&self) -> String {
        format!(
            "{}\n  status: {}\n  stdout: {}\n  stderr: {}",
            self.cmdline,
            match (self.code, self.signal) {
                (Some(c), _) => format!("exit code {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                _ => "?".into(),
            },
            tail(&self.stdout_str(), 2000),
            tail(&self.stderr_str(), 4000)
        )
    }
}

fn tail(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut i = s.len() - n;
        while !s.is_char_boundary(i) {
            i += 1;
        }
        format!("...{}", &s[i..])
    }
}

pub fn cmdline(c: &Command) -> String {
    let mut s = String::new();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&c.get_program().to_string_lossy());
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run with stdin closed, capturing stdout and stderr. The command gets its own process
/// group; after `timeout` that group (the command and what it started, e.g. the program
/// under `tracer record`) is killed and the test panics.
pub fn run(c: &mut Command, timeout: Duration) -> Out {
    let mut stdout = Vec::new();
    let mut out = run_streaming(c, timeout, |line| stdout.extend_from_slice(line));
    out.stdout = stdout;
    out
}

/// Like [`run`], but hands stdout to `on_line` line by line (each with its '\n')
/// instead of storing it.
pub fn run_streaming(
    c: &mut Command,
    timeout: Duration,
    mut on_line: impl FnMut(&[u8]) + Send,
) -> Out {
    use std::os::unix::process::CommandExt;
    let line = cmdline(c);
    let mut child = c
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {line}: {e}"));
    let pid = child.id();
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (stderr, status) = std::thread::scope(|s| {
        let err = s.spawn(move || {
            let mut v = Vec::new();
            let _ = se.read_to_end(&mut v);
            v
        });
        let watchdog = s.spawn(|| {
            let start = Instant::now();
            while !done.load(Ordering::Relaxed) {
                if start.elapsed() > timeout {
                    // Only the process group of the child we started.
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        });
        let mut r = BufReader::with_capacity(1 << 20, &mut so);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => on_line(&buf),
            }
        }
        let status = child.wait().expect("wait");
        done.store(true, Ordering::Relaxed);
        let timed_out = watchdog.join().unwrap();
        let stderr = err.join().unwrap();
        if timed_out {
            panic!(
                "timed out after {timeout:?}: {line}\n  stderr: {}",
                tail(&String::from_utf8_lossy(&stderr), 4000)
            );
        }
        (stderr, status)
    });
    use std::os::unix::process::ExitStatusExt;
    Out {
        cmdline: line,
        code: status.code(),
        signal: status.signal(),
        stdout: Vec::new(),
        stderr,
    }
}

// ---------------------------------------------------------------------------------------
// Compiling fixtures

/// Compile `sources` with `cc` and `flags` into `out` (fixtures/ is on the include path;
/// `-l...` flags go after the sources, where the linker needs them).
pub fn compile(cc: &str, sources: &[PathBuf], flags: &[&str], out: &Path) {
    let (libs, flags): (Vec<&str>, Vec<&str>) = flags.iter().partition(|f| f.starts_with("-l"));
    let mut c = Command::new(cc);
    c.args(flags)
        .arg("-I")
        .arg(fixture(""))
        .arg("-o")
        .arg(out)
        .args(sources)
        .args(libs);
    run(&mut c, RUN_TIMEOUT).ok();
}

/// Is `cc` installed and able to link a program with `flags`?
pub fn can_link(cc: &str, flags: &[&str], dir: &Path) -> bool {
    let src = dir.join("can_link.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    Command::new(cc)
        .args(flags)
        .arg("-o")
        .arg(dir.join("can_link"))
        .arg(&src)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------------
// The rewriter

/// `N sites: I inline, U uprobe` from the rewriter's stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteCounts {
    pub total: u64,
    pub inline: u64,
    pub uprobe: u64,
}

pub fn parse_site_counts(stdout: &str) -> Option<SiteCounts> {
    for line in stdout.lines() {
        let Some(i) = line.find(" sites: ") else {
            continue;
        };
        let total = line[..i].split_whitespace().last()?.parse().ok()?;
        let rest = &line[i + " sites: ".len()..];
        let mut nums = rest
            .split(',')
            .map(|p| p.split_whitespace().collect::<Vec<_>>());
        let a = nums.next()?;
        let b = nums.next()?;
        if a.get(1) != Some(&"inline")
            || b.get(1)
                .map(|s| s.trim_end_matches(|c: char| !c.is_alphanumeric()))
                != Some("uprobe")
        {
            continue;
        }
        return Some(SiteCounts {
            total,
            inline: a[0].parse().ok()?,
            uprobe: b[0].parse().ok()?,
        });
    }
    None
}

/// Run the rewriter with raw arguments.
pub fn rewriter(args: &[&OsStr]) -> Out {
    let mut c = Command::new(rewriter_bin());
    c.args(args);
    run(&mut c, RUN_TIMEOUT)
}

/// Rewrite `input` into `output` (None: the default `INPUT.traced`, which is returned),
/// restricted to `functions` globs if any. Asserts success, the site-count line, that the
/// input file is unchanged and that the output has a metadata note agreeing with the line.
pub fn rewrite(
    input: &Path,
    output: Option<&Path>,
    functions: &[&str],
) -> (PathBuf, SiteCounts, Metadata) {
    let before = std::fs::read(input).unwrap();
    let mut args: Vec<&OsStr> = vec![input.as_os_str()];
    if let Some(o) = output {
        args.push("-o".as_ref());
        args.push(o.as_os_str());
    }
    for f in functions {
        args.push("--functions".as_ref());
        args.push(f.as_ref());
    }
    let out = rewriter(&args).ok();
    let path = match output {
        Some(o) => o.to_path_buf(),
        None => {
            let mut s = input.as_os_str().to_owned();
            s.push(".traced");
            PathBuf::from(s)
        }
    };
    assert!(
        path.is_file(),
        "the rewriter did not write {}: {}",
        path.display(),
        out.describe()
    );
    assert_eq!(
        std::fs::read(input).unwrap(),
        before,
        "the rewriter modified its input {}",
        input.display()
    );
    let counts = parse_site_counts(&out.stdout_str())
        .unwrap_or_else(|| panic!("no `N sites: I inline, U uprobe` line: {}", out.describe()));
    assert_eq!(
        counts.total,
        counts.inline + counts.uprobe,
        "site counts: {counts:?}"
    );
    let meta = metadata(&path);
    let n_inline = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Inline)
        .count() as u64;
    let n_uprobe = meta
        .sites
        .iter()
        .filter(|s| s.mode == SiteMode::Uprobe)
        .count() as u64;
    assert_eq!(
        (meta.sites.len() as u64, n_inline, n_uprobe),
        (counts.total, counts.inline, counts.uprobe),
        "the site table in {META_SECTION} of {} disagrees with the rewriter's summary line",
        path.display()
    );
    let mut ids: Vec<u32> = meta.sites.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        meta.sites.len(),
        "duplicate site ids in {}",
        path.display()
    );
    (path, counts, meta)
}

/// The metadata note of a rewritten binary.
pub fn metadata(path: &Path) -> Metadata {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data)
        .unwrap_or_else(|e| panic!("{} is not a readable ELF file: {e}", path.display()));
    let sec = file
        .section_by_name(META_SECTION)
        .unwrap_or_else(|| panic!("{} has no {META_SECTION} section", path.display()));
    let bytes = sec.data().unwrap();
    Metadata::from_note_section(bytes)
        .unwrap_or_else(|| panic!("no utrace note in {META_SECTION} of {}", path.display()))
        .unwrap_or_else(|e| panic!("bad utrace note in {}: {e}", path.display()))
}

/// A defined function symbol of an ELF file.
#[derive(Debug, Clone)]
pub struct FuncSym {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    /// File offset of the first byte.
    pub file_off: Option<u64>,
}

/// The defined function symbols (.symtab, else .dynsym) of an ELF file.
pub fn function_symbols(path: &Path) -> Vec<FuncSym> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let segs: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| (s.address(), s.file_range().0, s.file_range().1))
        .collect();
    let to_off = |addr: u64| {
        segs.iter()
            .find(|(va, _, sz)| addr >= *va && addr < va + sz)
            .map(|(va, off, _)| addr - va + off)
    };
    let mut syms: Vec<FuncSym> = Vec::new();
    let mut push = |s: object::Symbol<'_, '_>| {
        if s.kind() == SymbolKind::Text
            && s.is_definition()
            && s.address() != 0
            && let Ok(name) = s.name()
        {
            syms.push(FuncSym {
                name: name.to_string(),
                addr: s.address(),
                size: s.size(),
                file_off: to_off(s.address()),
            });
        }
    };
    if file.symbols().next().is_some() {
        file.symbols().for_each(&mut push);
    } else {
        file.dynamic_symbols().for_each(&mut push);
    }
    syms
}

pub fn function_symbol(path: &Path, name: &str) -> FuncSym {
    function_symbols(path)
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no function symbol {name} in {}", path.display()))
}

// ---------------------------------------------------------------------------------------
// The tracer

static TRACER_LOCK: Mutex<()> = Mutex::new(());

/// Serialises tracing sessions (and oracle runs) inside one test binary: they are
/// timing sensitive and share the machine's 2 cores.
pub fn tracing_lock() -> MutexGuard<'static, ()> {
    TRACER_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `tracer record -o TRACE -- PROG ARGS...` with extra environment for the tracer (and
/// so for PROG).
pub fn tracer_record(trace: &Path, prog: &Path, args: &[&str], env: &[(&str, &OsStr)]) -> Out {
    tracer_record_with(&[], trace, prog, args, env)
}

/// Whether qemu-aarch64 can run (else AArch64 tests skip, saying so).
pub fn have_qemu_aarch64(what: &str) -> bool {
    let ok = Command::new("qemu-aarch64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIP {what}: qemu-aarch64 not installed (apt-get install qemu-user)");
    }
    ok
}

/// The arm64 sysroot of Debian's cross toolchain, for qemu-aarch64 `-L`.
pub const A64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// An AArch64 program under qemu-user with the user-space drain: `tracer record --user
/// --binary PROG -o TRACE -- qemu-aarch64 -L A64_SYSROOT PROG ARGS` (binfmt is off, so
/// qemu is named; qemu itself is not instrumented).
pub fn tracer_record_qemu(trace: &Path, prog: &Path, args: &[&str]) -> Out {
    let p = prog.to_str().expect("UTF-8 temp path");
    let mut qargs = vec!["-L", A64_SYSROOT, p];
    qargs.extend(args);
    tracer_record_with(
        &["--user", "--binary", p],
        trace,
        Path::new("qemu-aarch64"),
        &qargs,
        &[],
    )
}

/// `tracer record FLAGS -o TRACE -- PROG ARGS` (e.g. FLAGS = ["--user"]).
pub fn tracer_record_with(
    flags: &[&str],
    trace: &Path,
    prog: &Path,
    args: &[&str],
    env: &[(&str, &OsStr)],
) -> Out {
    let _g = tracing_lock();
    let mut c = Command::new(tracer_bin());
    c.arg("record")
        .args(flags)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(prog)
        .args(args);
    // Sessions cache debug information; the tests' go to a scratch cache, not root's.
    c.env(
        "UTRACE_DEBUG_CACHE",
        std::env::temp_dir().join("utrace-test-debug-cache"),
    );
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(&mut c, TRACE_TIMEOUT);
    assert!(
        trace.is_file(),
        "tracer record wrote no trace file {}: {}",
        trace.display(),
        out.describe()
    );
    out
}

/// One line of `tracer dump`.
#[derive(Debug, Clone)]
pub struct Rec {
    pub pid: u32,
    pub tid: u32,
    pub binary: Arc<str>,
    pub site: u32,
    pub symbol: Arc<str>,
    pub value: u64,
    pub aux: u64,
    pub time_ns: Option<u64>,
    pub flags: u32,
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn parse_flags(s: &str) -> Option<u32> {
    if let Some(v) = parse_u64(s) {
        return u32::try_from(v).ok();
    }
    // Also accept a symbolic rendering such as "ktime|uprobe" or "-".
    let l = s.to_ascii_lowercase();
    if l.chars()
        .all(|c| c.is_ascii_alphabetic() || "|,+- ".contains(c))
    {
        let mut f = 0;
        if l.contains("ktime") {
            f |= FLAG_KTIME;
        }
        if l.contains("uprobe") {
            f |= FLAG_UPROBE;
        }
        return Some(f);
    }
    None
}

/// Parse one dump line: `pid tid binary site symbol value aux time_ns flags`.
pub fn parse_dump_line(line: &str, intern: &mut HashMap<String, Arc<str>>) -> Result<Rec, String> {
    let f: Vec<&str> = line.trim_end_matches(['\n', '\r']).split('\t').collect();
    if f.len() != 9 {
        return Err(format!(
            "expected 9 tab-separated fields, got {}: {line:?}",
            f.len()
        ));
    }
    let mut get = |s: &str| -> Arc<str> {
        if let Some(a) = intern.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        intern.insert(s.to_string(), a.clone());
        a
    };
    let bad = |what: &str| format!("bad {what} in dump line {line:?}");
    let rec = Rec {
        pid: parse_u64(f[0])
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad("pid"))?,
        tid: parse_u64(f[1])
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad("tid"))?,
        binary: get(f[2]),
        site: parse_u64(f[3])
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad("site"))?,
        symbol: get(f[4]),
        value: parse_u64(f[5]).ok_or_else(|| bad("value"))?,
        aux: parse_u64(f[6]).ok_or_else(|| bad("aux"))?,
        time_ns: parse_u64(f[7]),
        flags: parse_flags(f[8]).ok_or_else(|| bad("flags"))?,
    };
    Ok(rec)
}

/// All records of a trace file, in delivery order (`tracer dump FILE`).
pub fn dump(trace: &Path) -> Vec<Rec> {
    let mut c = Command::new(tracer_bin());
    c.arg("dump").arg(trace);
    let mut recs = Vec::new();
    let mut intern = HashMap::new();
    let mut errors: Vec<String> = Vec::new();
    let out = run_streaming(&mut c, TRACE_TIMEOUT, |line| {
        let line = String::from_utf8_lossy(line);
        if line.trim().is_empty() {
            return;
        }
        match parse_dump_line(&line, &mut intern) {
            Ok(r) => recs.push(r),
            Err(e) => {
                if errors.len() < 5 {
                    errors.push(e)
                }
            }
        }
    });
    let out = out.ok();
    assert!(
        errors.is_empty(),
        "unparsable `tracer dump` output: {errors:#?}\n{}",
        out.describe()
    );
    recs
}

/// `tracer report FILE --json`.
#[derive(Debug, Clone)]
pub struct Report {
    pub records: u64,
    pub dropped: u64,
    /// (binary, symbol, site, count)
    pub functions: Vec<(String, String, u32, u64)>,
    /// (pid, tid, count)
    pub threads: Vec<(u32, u32, u64)>,
    pub raw: serde_json::Value,
}

impl Report {
    /// Sum of the counts of `symbol` over all binaries.
    pub fn count_of(&self, symbol: &str) -> u64 {
        self.functions
            .iter()
            .filter(|f| f.1 == symbol)
            .map(|f| f.3)
            .sum()
    }
}

/// `tracer report --json TRACE` as parsed JSON (the command must succeed).
pub fn report_json(trace: &Path) -> serde_json::Value {
    let mut c = Command::new(tracer_bin());
    c.arg("report").arg(trace).arg("--json");
    let out = run(&mut c, TRACE_TIMEOUT).ok();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("tracer report --json is not JSON ({e}): {}", out.describe()))
}

pub fn report(trace: &Path) -> Report {
    let v = report_json(trace);
    let num = |v: &serde_json::Value, k: &str| -> u64 {
        v.get(k)
            .and_then(|x| x.as_u64())
            .unwrap_or_else(|| panic!("report: missing number {k:?} in {v}"))
    };
    let arr = |k: &str| -> Vec<serde_json::Value> {
        v.get(k)
            .and_then(|x| x.as_array())
            .cloned()
            .unwrap_or_else(|| panic!("report: missing array {k:?}"))
    };
    let functions = arr("functions")
        .iter()
        .map(|f| {
            (
                f.get("binary")
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
                    .to_string(),
                f.get("symbol")
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
                    .to_string(),
                num(f, "site") as u32,
                num(f, "count"),
            )
        })
        .collect();
    let threads = arr("threads")
        .iter()
        .map(|t| (num(t, "pid") as u32, num(t, "tid") as u32, num(t, "count")))
        .collect();
    Report {
        records: num(&v, "records"),
        dropped: num(&v, "dropped"),
        functions,
        threads,
        raw: v,
    }
}

/// The report agrees with the dump: total, per-thread and per-function counts.
pub fn check_report_matches_dump(rep: &Report, recs: &[Rec]) {
    assert_eq!(
        rep.records,
        recs.len() as u64,
        "report.records vs dump lines"
    );
    let mut per_tid: HashMap<(u32, u32), u64> = HashMap::new();
    let mut per_sym_arc: HashMap<(Arc<str>, u32), u64> = HashMap::new();
    for r in recs {
        *per_tid.entry((r.pid, r.tid)).or_default() += 1;
        // Per site: events (a USDT probe's extra argument records do not count).
        if r.flags & tracer_common::FLAG_USDT_MORE == 0 {
            *per_sym_arc.entry((r.symbol.clone(), r.site)).or_default() += 1;
        }
    }
    let per_sym: HashMap<(String, u32), u64> = per_sym_arc
        .into_iter()
        .map(|((s, id), c)| ((s.to_string(), id), c))
        .collect();
    let rep_tid: HashMap<(u32, u32), u64> = rep.threads.iter().map(|t| ((t.0, t.1), t.2)).collect();
    assert_eq!(rep_tid, per_tid, "report.threads vs dump");
    let mut rep_sym: HashMap<(String, u32), u64> = HashMap::new();
    for f in &rep.functions {
        *rep_sym.entry((f.1.clone(), f.2)).or_default() += f.3;
    }
    rep_sym.retain(|_, c| *c > 0);
    assert_eq!(rep_sym, per_sym, "report.functions vs dump");
}

/// Every record names a site of `meta` by id, with that site's symbol.
pub fn check_sites_valid(recs: &[Rec], meta: &[&Metadata]) {
    let mut names: HashMap<u32, Vec<&str>> = HashMap::new();
    for m in meta {
        for s in &m.sites {
            names.entry(s.id).or_default().push(&s.name);
        }
    }
    for (i, r) in recs.iter().enumerate() {
        let ok = names.get(&r.site).is_some_and(|n| n.contains(&&*r.symbol));
        assert!(
            ok,
            "record #{i} has site {} / symbol {:?}, which is not a site of the binary: {r:?}",
            r.site, r.symbol
        );
    }
}

/// Per-thread records in delivery order.
pub fn by_tid<'a>(recs: impl IntoIterator<Item = &'a Rec>) -> Vec<(u32, Vec<&'a Rec>)> {
    let mut order: Vec<u32> = Vec::new();
    let mut m: HashMap<u32, Vec<&'a Rec>> = HashMap::new();
    for r in recs {
        m.entry(r.tid).or_insert_with(|| {
            order.push(r.tid);
            Vec::new()
        });
        m.get_mut(&r.tid).unwrap().push(r);
    }
    order
        .into_iter()
        .map(|t| (t, m.remove(&t).unwrap()))
        .collect()
}

/// Records of many short-lived threads, values `k << 32 | i` (thread tag k, call i):
/// exactly tags 0..k_threads, thread k under one tid with values 0..base+k in order,
/// and under each tid (tids are reused) every thread's records form one run.
pub fn check_thread_runs<'a>(recs: impl IntoIterator<Item = &'a Rec>, k_threads: u64, base: u64) {
    let mut per_k: HashMap<u64, (Vec<u32>, Vec<u64>)> = HashMap::new();
    let mut per_tid: HashMap<u32, Vec<u64>> = HashMap::new();
    for r in recs {
        let k = r.value >> 32;
        let e = per_k.entry(k).or_default();
        if !e.0.contains(&r.tid) {
            e.0.push(r.tid);
        }
        e.1.push(r.value & 0xffff_ffff);
        let ks = per_tid.entry(r.tid).or_default();
        if ks.last() != Some(&k) {
            ks.push(k);
        }
    }
    let missing: Vec<u64> = (0..k_threads).filter(|k| !per_k.contains_key(k)).collect();
    assert!(missing.is_empty(), "no records of threads {missing:?}");
    let mut unexpected: Vec<u64> = per_k.keys().copied().filter(|k| *k >= k_threads).collect();
    unexpected.sort_unstable();
    assert!(
        unexpected.is_empty(),
        "unexpected thread tags {unexpected:?}"
    );
    for k in 0..k_threads {
        let (tids, vals) = &per_k[&k];
        assert_eq!(
            tids.len(),
            1,
            "records of thread {k} under several tids {tids:?}"
        );
        assert_seq_eq(
            vals,
            &(0..base + k).collect::<Vec<_>>(),
            &format!("thread {k}"),
        );
    }
    for (tid, ks) in &per_tid {
        let mut sorted = ks.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            ks.len(),
            "tid {tid}: records of threads {ks:?} interleaved"
        );
    }
}

/// Assert two sequences are equal, reporting the first difference with context.
pub fn assert_seq_eq<T: PartialEq + std::fmt::Debug>(actual: &[T], expected: &[T], what: &str) {
    let first = actual.iter().zip(expected).position(|(a, e)| a != e);
    if first.is_none() && actual.len() == expected.len() {
        return;
    }
    let i = first.unwrap_or(actual.len().min(expected.len()));
    let lo = i.saturating_sub(3);
    panic!(
        "{what}: sequences differ at index {i} (actual length {}, expected {}).\n  actual[{lo}..]:   {:?}\n  expected[{lo}..]: {:?}",
        actual.len(),
        expected.len(),
        &actual[lo..actual.len().min(i + 4)],
        &expected[lo..expected.len().min(i + 4)]
    );
}

/// Inline records (rdtsc based) of one thread carry non-decreasing times.
pub fn check_times_monotonic(recs: &[&Rec], what: &str) {
    let mut last: Option<(usize, u64)> = None;
    for (i, r) in recs.iter().enumerate() {
        if r.flags & FLAG_KTIME != 0 {
            continue;
        }
        let Some(t) = r.time_ns else { continue };
        if let Some((j, lt)) = last {
            assert!(
                t >= lt,
                "{what}: time goes backwards: record {j} at {lt} ns, record {i} at {t} ns ({r:?})"
            );
        }
        last = Some((i, t));
    }
}

// ---------------------------------------------------------------------------------------
// Real (distribution) programs: tests/tests/real_programs.rs

/// Panic unless two runs behaved the same: exit status, stdout and stderr, byte for byte.
/// The message names the first differing byte, with the line around it.
pub fn assert_same_behaviour(what: &str, got: &Out, want: &Out) {
    fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
        let n = a.len().min(b.len());
        (0..n)
            .find(|&i| a[i] != b[i])
            .or((a.len() != b.len()).then_some(n))
    }
    fn line_at(s: &[u8], i: usize) -> String {
        let i = i.min(s.len());
        let lo = s[..i]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |p| p + 1);
        let hi = s[i..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(s.len(), |p| i + p);
        String::from_utf8_lossy(&s[lo..hi.min(lo + 300)]).into_owned()
    }
    let mut problems = Vec::new();
    if got.status() != want.status() {
        problems.push(format!(
            "exit status {} instead of {}",
            got.status(),
            want.status()
        ));
    }
    for (name, g, w) in [
        ("stdout", &got.stdout, &want.stdout),
        ("stderr", &got.stderr, &want.stderr),
    ] {
        if let Some(i) = first_diff(g, w) {
            problems.push(format!(
                "{name} differs at byte {i} (lengths {} and {}):\n    got:  {:?}\n    want: {:?}",
                g.len(),
                w.len(),
                line_at(g, i),
                line_at(w, i)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{what}: not the same behaviour as the original:\n  {}\n  run: {}\n  original: {}",
        problems.join("\n  "),
        got.describe(),
        want.describe()
    );
}

/// A `tracer record` run's output as the traced command's own: stderr without the
/// tracer's `utrace: ...` lines.
pub fn without_tracer_lines(out: &Out) -> Out {
    let mut o = out.clone();
    o.stderr = out
        .stderr
        .split_inclusive(|&c| c == b'\n')
        .filter(|l| !l.starts_with(b"utrace: "))
        .flatten()
        .copied()
        .collect();
    o
}

/// The program interpreter (PT_INTERP) of a dynamically linked ELF program.
pub fn interpreter(prog: &Path) -> Option<PathBuf> {
    let data = std::fs::read(prog).ok()?;
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    use object::read::elf::ProgramHeader;
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .find(|p| p.p_type(endian) == object::elf::PT_INTERP)
        .and_then(|p| p.data(endian, &*data).ok())
        .map(|d| {
            let d = d.split(|&c| c == 0).next().unwrap_or(d);
            PathBuf::from(String::from_utf8_lossy(d).into_owned())
        })
}

/// What the dynamic loader maps for `prog` with the extra environment `env`
/// (`ld.so --list PROG`): (name as needed, resolved path) per library found.
pub fn loader_list(prog: &Path, env: &[(&str, &OsStr)]) -> Vec<(String, PathBuf)> {
    let ld = interpreter(prog)
        .unwrap_or_else(|| panic!("{} has no program interpreter", prog.display()));
    let mut c = Command::new(ld);
    c.arg("--list").arg(prog);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(&mut c, RUN_TIMEOUT).ok();
    out.stdout_str()
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split(" (").next()?.trim();
            (!path.is_empty() && path != "not found")
                .then(|| (name.trim().to_string(), PathBuf::from(path)))
        })
        .collect()
}

/// The files mapped by a running process (`/proc/PID/maps`), each once.
pub fn mapped_files(pid: u32) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut v: Vec<PathBuf> = Vec::new();
    for l in maps.lines() {
        if let Some(p) = l.split_whitespace().nth(5).filter(|p| p.starts_with('/')) {
            let p = PathBuf::from(p);
            if !v.contains(&p) {
                v.push(p);
            }
        }
    }
    v
}

/// Entries per function of one run of `cmd`, counted by the oracle (kernel uprobes on
/// `probes`, functions of unmodified binaries); every probed function has an entry,
/// possibly 0.
pub fn oracle_counts(
    probes: &[(&Path, &str)],
    cmd: &mut Command,
    timeout: Duration,
) -> (Out, HashMap<String, u64>) {
    let (out, events) = oracle::run_with_probes(probes, cmd, timeout);
    let mut counts: HashMap<String, u64> = probes.iter().map(|p| (p.1.to_string(), 0)).collect();
    for e in &events {
        *counts.entry(e.symbol.clone()).or_default() += 1;
    }
    (out, counts)
}

// ---------------------------------------------------------------------------------------
// Every site kind at once (real_programs.rs)

/// The rewriter's per-kind lines (`  block  51 sites: 44 inline (86.27%), 7 uprobe`), in
/// the order printed.
pub fn parse_kind_counts(stdout: &str) -> Vec<(tracer_common::meta::SiteKind, SiteCounts)> {
    use tracer_common::meta::SiteKind;
    let kinds = [
        SiteKind::FunctionEntry,
        SiteKind::FunctionExit,
        SiteKind::Block,
        SiteKind::Memory,
    ];
    stdout
        .lines()
        .filter_map(|l| {
            let first = l.split_whitespace().next()?;
            let kind = kinds.iter().find(|k| k.name() == first)?;
            Some((*kind, parse_site_counts(l)?))
        })
        .collect()
}

/// Rewrite `input` into `output` with raw extra rewriter arguments (`--sites`, `--time`,
/// `--functions`...). Asserts what `rewrite` asserts, and that the per-kind lines agree
/// with the site table of the metadata. Returns the summary line's counts, the per-kind
/// counts, the metadata and the rewriter's stdout.
pub fn rewrite_args(
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> (
    SiteCounts,
    Vec<(tracer_common::meta::SiteKind, SiteCounts)>,
    Metadata,
    String,
) {
    let before = std::fs::read(input).unwrap();
    let mut args: Vec<&OsStr> = vec![input.as_os_str(), "-o".as_ref(), output.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    let out = rewriter(&args).ok();
    assert_eq!(
        std::fs::read(input).unwrap(),
        before,
        "the rewriter modified its input {}",
        input.display()
    );
    let stdout = out.stdout_str();
    let counts = parse_site_counts(&stdout)
        .unwrap_or_else(|| panic!("no `N sites: I inline, U uprobe` line: {}", out.describe()));
    let kinds = parse_kind_counts(&stdout);
    let meta = metadata(output);
    let tally = |k: Option<tracer_common::meta::SiteKind>| {
        let of_kind: Vec<&Site> = meta
            .sites
            .iter()
            .filter(|s| k.is_none_or(|k| s.kind == k))
            .collect();
        let inline = of_kind
            .iter()
            .filter(|s| s.mode == SiteMode::Inline)
            .count() as u64;
        SiteCounts {
            total: of_kind.len() as u64,
            inline,
            uprobe: of_kind.len() as u64 - inline,
        }
    };
    assert_eq!(
        tally(None),
        counts,
        "{}: the site table disagrees with the summary line:\n{stdout}",
        output.display()
    );
    for (k, c) in &kinds {
        assert_eq!(
            tally(Some(*k)),
            *c,
            "{}: {} sites of the site table vs the rewriter's line:\n{stdout}",
            output.display(),
            k.name()
        );
    }
    let listed: u64 = kinds.iter().map(|(_, c)| c.total).sum();
    assert_eq!(
        listed,
        counts.total,
        "{}: per-kind lines do not add up:\n{stdout}",
        output.display()
    );
    (counts, kinds, meta, stdout)
}

/// The functions of `meta` to rewrite for a session under `tracer record`: every
/// function whose sites are all inline, `extra`, and then the functions with the fewest
/// uprobe sites (by name within a count) while the uprobe sites stay within `budget`.
/// (The tracer detaches its uprobes one by one when the command ends, about 0.1 s each:
/// a few hundred uprobe sites cost minutes.) Returns the names and their uprobe sites.
pub fn functions_for_tracing(
    meta: &Metadata,
    extra: &[&str],
    budget: usize,
) -> (Vec<String>, usize) {
    let mut uprobes: HashMap<&str, usize> = HashMap::new();
    // Functions with a symbol only: `sub_<address>` ranges (.eh_frame functions of a
    // stripped library) hold hot internals that would flood the ring buffer.
    for s in meta.sites.iter().filter(|s| !s.name.starts_with("sub_")) {
        *uprobes.entry(&s.name).or_default() += usize::from(s.mode == SiteMode::Uprobe);
    }
    let mut names: Vec<&str> = uprobes
        .iter()
        .filter(|(n, u)| **u == 0 || extra.contains(n))
        .map(|(n, _)| *n)
        .collect();
    let mut used: usize = names.iter().map(|n| uprobes[n]).sum();
    let mut rest: Vec<(usize, &str)> = uprobes
        .iter()
        .filter(|(n, u)| **u > 0 && !extra.contains(n))
        .map(|(n, u)| (*u, *n))
        .collect();
    rest.sort_unstable();
    for (u, n) in rest {
        if used + u > budget {
            break;
        }
        used += u;
        names.push(n);
    }
    names.sort_unstable();
    (names.into_iter().map(String::from).collect(), used)
}

/// Records per kind of one binary's trace: (kind, inline records, uprobe records).
pub type KindRecords = Vec<(tracer_common::meta::SiteKind, u64, u64)>;

/// Checks the records of binary `binary` (its file name in `tracer dump`), rewritten
/// with every site kind (`meta`), in a trace of complete runs, and returns the records
/// per kind:
/// - a block record's value is its block's run-time address (same load bias for every
///   record of a process), aux 0; a memory record's aux is its instruction's run-time
///   address; an inline memory record says read and/or write and a size of 1..=64 bytes
///   (a uprobe memory record's value and flags are not checked: the eBPF program does
///   not compute effective addresses yet);
/// - per thread, every entry of a function is immediately followed by its first block
///   (the block at the function's lowest address), so that block's count equals the
///   entry count;
/// - a function never has more exit records than entries;
/// - inline `record`-mode times do not go backwards within a thread; in `coarse` mode
///   every inline record's time is interpolated (flag 0x100).
pub fn check_all_kinds_records(
    recs: &[Rec],
    binary: &str,
    meta: &Metadata,
    coarse: bool,
    what: &str,
) -> KindRecords {
    use tracer_common::meta::SiteKind;
    use tracer_common::{FLAG_MEM_READ, FLAG_MEM_WRITE, mem_size};
    const FLAG_INTERPOLATED: u32 = 1 << 8;
    let sites: HashMap<u32, &Site> = meta.sites.iter().map(|s| (s.id, s)).collect();
    // The first block of each function, and its entry site.
    let mut first_block: HashMap<&str, &Site> = HashMap::new();
    for s in meta.sites.iter().filter(|s| s.kind == SiteKind::Block) {
        let e = first_block.entry(&s.name).or_insert(s);
        if s.vaddr < e.vaddr {
            *e = s;
        }
    }
    let recs: Vec<&Rec> = recs.iter().filter(|r| &*r.binary == binary).collect();
    let mut bias: HashMap<u32, u64> = HashMap::new();
    let mut per_kind: HashMap<SiteKind, (u64, u64)> = HashMap::new();
    let mut count: HashMap<u32, u64> = HashMap::new();
    for r in &recs {
        let s = sites
            .get(&r.site)
            .unwrap_or_else(|| panic!("{what}: record of an unknown site: {r:?}"));
        assert_eq!(&*r.symbol, s.name, "{what}: symbol of {r:?}");
        *count.entry(r.site).or_default() += 1;
        let uprobe = r.flags & FLAG_UPROBE != 0;
        assert_eq!(
            uprobe,
            s.mode == SiteMode::Uprobe,
            "{what}: {r:?} from a {:?} site",
            s.mode
        );
        let k = per_kind.entry(s.kind).or_default();
        if uprobe {
            k.1 += 1;
        } else {
            k.0 += 1;
        }
        if coarse && !uprobe {
            assert!(
                r.flags & FLAG_INTERPOLATED != 0,
                "{what}: coarse record without an interpolated time: {r:?}"
            );
        }
        let pc = match s.kind {
            SiteKind::Block => {
                assert_eq!(r.aux, 0, "{what}: aux of block record {r:?}");
                r.value
            }
            SiteKind::Memory => {
                if !uprobe {
                    let size = mem_size(r.flags);
                    assert!(
                        r.flags & (FLAG_MEM_READ | FLAG_MEM_WRITE) != 0 && (1..=64).contains(&size),
                        "{what}: memory record without access kind or size (flags {:#x}) from site {} at {:#x} of {}: {r:?}",
                        r.flags,
                        s.id,
                        s.vaddr,
                        s.name
                    );
                }
                r.aux
            }
            _ => continue,
        };
        let b = *bias.entry(r.pid).or_insert(pc.wrapping_sub(s.vaddr));
        assert_eq!(
            pc.wrapping_sub(b),
            s.vaddr,
            "{what}: run-time address of {r:?} (site at {:#x}, load bias {b:#x})",
            s.vaddr
        );
    }
    for (tid, rs) in by_tid(recs.iter().copied()) {
        for (i, r) in rs.iter().enumerate() {
            let s = sites[&r.site];
            if s.kind != SiteKind::FunctionEntry {
                continue;
            }
            let Some(fb) = first_block.get(&*s.name) else {
                continue;
            };
            let next = rs.get(i + 1);
            assert!(
                next.is_some_and(|n| n.site == fb.id),
                "{what}: tid {tid}: entry of {} (record {i}) not followed by its first block (site {} at {:#x}) but by {next:?}",
                s.name,
                fb.id,
                fb.vaddr
            );
        }
        if !coarse {
            check_times_monotonic(&rs, &format!("{what}: tid {tid}"));
        }
    }
    let mut entries: HashMap<&str, u64> = HashMap::new();
    let mut exits: HashMap<&str, u64> = HashMap::new();
    for s in &meta.sites {
        let c = count.get(&s.id).copied().unwrap_or(0);
        match s.kind {
            SiteKind::FunctionEntry => *entries.entry(&s.name).or_default() += c,
            SiteKind::FunctionExit => *exits.entry(&s.name).or_default() += c,
            _ => {}
        }
    }
    for (f, e) in &entries {
        if let Some(fb) = first_block.get(f) {
            let b = count.get(&fb.id).copied().unwrap_or(0);
            assert_eq!(
                b, *e,
                "{what}: {f}: {b} records of the first block, {e} entries"
            );
        }
        let x = exits.get(f).copied().unwrap_or(0);
        assert!(x <= *e, "{what}: {f}: {x} exits but {e} entries");
    }
    let mut v: KindRecords = per_kind.into_iter().map(|(k, (i, u))| (k, i, u)).collect();
    v.sort_unstable();
    v
}

/// The oracle (`oracle::run_with_probes_at`) for a single-threaded command, keeping
/// only the events of that command's process: kernel uprobes fire in every process
/// that maps the probed file, e.g. in the original library run by another test at the
/// same time. The command runs as `bash -c 'echo $$ > PIDFILE; exec -a ARGV0 PROG
/// ARGS...'` in `dir`, with `env`.
pub fn oracle_own_process(
    probes: &[(&Path, String, u64)],
    (prog, argv0, args): (&Path, &str, &[String]),
    dir: &Path,
    env: &[(&str, &OsStr)],
    timeout: Duration,
) -> (Out, Vec<oracle::Event>) {
    static N: AtomicU32 = AtomicU32::new(0);
    let pidfile = dir.join(format!(
        "oracle-{}-{}.pid",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(r#"echo $$ > "$0" && exec -a "$1" "${@:2}""#)
        .arg(&pidfile)
        .arg(argv0)
        .arg(prog)
        .args(args)
        .current_dir(dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let (out, events) = oracle::run_with_probes_at(probes, &mut c, timeout);
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}: {}", pidfile.display(), out.describe()));
    let _ = std::fs::remove_file(&pidfile);
    (out, events.into_iter().filter(|e| e.tid == pid).collect())
}

/// `oracle_counts` (entries per function, every probed function present) through
/// `oracle_own_process`.
pub fn oracle_counts_own(
    probes: &[(&Path, &str)],
    cmd: (&Path, &str, &[String]),
    dir: &Path,
    env: &[(&str, &OsStr)],
    timeout: Duration,
) -> (Out, HashMap<String, u64>) {
    let at: Vec<(&Path, String, u64)> = probes
        .iter()
        .map(|(bin, sym)| {
            let off = function_symbol(bin, sym)
                .file_off
                .unwrap_or_else(|| panic!("{sym} in {} is not in a loaded segment", bin.display()));
            (*bin, sym.to_string(), off)
        })
        .collect();
    let (out, events) = oracle_own_process(&at, cmd, dir, env, timeout);
    let mut counts: HashMap<String, u64> = probes.iter().map(|p| (p.1.to_string(), 0)).collect();
    for e in &events {
        *counts.entry(e.symbol.clone()).or_default() += 1;
    }
    (out, counts)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn site_counts_line() {
        let s = "wrote out.traced\n1154 sites: 1120 inline, 34 uprobe\n";
        assert_eq!(
            parse_site_counts(s),
            Some(SiteCounts {
                total: 1154,
                inline: 1120,
                uprobe: 34
            })
        );
        assert_eq!(
            parse_site_counts("rewriter: 2 sites: 1 inline, 1 uprobe (0.1 s)"),
            Some(SiteCounts {
                total: 2,
                inline: 1,
                uprobe: 1
            })
        );
        assert_eq!(parse_site_counts("no sites here"), None);
    }

    #[test]
    fn dump_lines() {
        let mut intern = HashMap::new();
        let r = parse_dump_line(
            "12\t13\t/tmp/a.traced\t4\tfx_leaf\t0x1f\t0x5555\t1234\t0\n",
            &mut intern,
        )
        .unwrap();
        assert_eq!(
            (
                r.pid, r.tid, &*r.binary, r.site, &*r.symbol, r.value, r.aux, r.time_ns, r.flags
            ),
            (
                12,
                13,
                "/tmp/a.traced",
                4,
                "fx_leaf",
                31,
                0x5555,
                Some(1234),
                0
            )
        );
        let r2 = parse_dump_line(
            "12\t13\t/tmp/a.traced\t5\tfx_spin\t0x1\t0x0\t99\t0x3",
            &mut intern,
        )
        .unwrap();
        assert_eq!(r2.flags, FLAG_KTIME | FLAG_UPROBE);
        assert!(Arc::ptr_eq(&r.binary, &r2.binary), "interned");
        assert_eq!(parse_flags("ktime|uprobe"), Some(FLAG_KTIME | FLAG_UPROBE));
        assert_eq!(parse_flags("-"), Some(0));
        assert!(parse_dump_line("1\t2\t3", &mut intern).is_err());
        assert!(parse_dump_line("x\t13\tb\t4\ts\t0x1\t0x2\t3\t0", &mut intern).is_err());
    }

    #[test]
    fn timeout_kills_the_whole_group() {
        let start = Instant::now();
        // The background sleep keeps stdout open: only killing the group ends the read.
        let r = std::panic::catch_unwind(|| {
            run(
                Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
                Duration::from_millis(300),
            )
        });
        let msg = r.expect_err("must time out");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("timed out"), "{msg}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        let o = run(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 7"]),
            RUN_TIMEOUT,
        );
        assert_eq!(
            (o.stdout_str().as_str(), o.stderr_str().as_str(), o.status()),
            ("out\n", "err\n", 7)
        );
    }

    #[test]
    fn sequences() {
        assert_seq_eq(&[1, 2, 3], &[1, 2, 3], "equal");
        let r = std::panic::catch_unwind(|| assert_seq_eq(&[1, 2, 4], &[1, 2, 3], "differ"));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| assert_seq_eq(&[1, 2], &[1, 2, 3], "shorter"));
        assert!(r.is_err());
    }

    #[test]
    fn report_vs_dump() {
        let mut intern = HashMap::new();
        let recs: Vec<Rec> = [
            "1\t1\tb\t0\tmain\t0x1\t0x0\t1\t0",
            "1\t2\tb\t1\tf\t0x1\t0x0\t2\t0",
            "1\t2\tb\t1\tf\t0x2\t0x0\t3\t0",
        ]
        .iter()
        .map(|l| parse_dump_line(l, &mut intern).unwrap())
        .collect();
        let raw: serde_json::Value = serde_json::from_str(
            r#"{"records":3,"dropped":0,
                "functions":[{"binary":"b","symbol":"main","site":0,"count":1},{"binary":"b","symbol":"f","site":1,"count":2},{"binary":"b","symbol":"g","site":2,"count":0}],
                "threads":[{"pid":1,"tid":1,"count":1},{"pid":1,"tid":2,"count":2}]}"#,
        )
        .unwrap();
        let rep = Report {
            records: 3,
            dropped: 0,
            functions: vec![
                ("b".into(), "main".into(), 0, 1),
                ("b".into(), "f".into(), 1, 2),
                ("b".into(), "g".into(), 2, 0),
            ],
            threads: vec![(1, 1, 1), (1, 2, 2)],
            raw,
        };
        check_report_matches_dump(&rep, &recs);
        assert_eq!(rep.count_of("f"), 2);
        let t = by_tid(&recs);
        assert_eq!(
            t.iter()
                .map(|(tid, rs)| (*tid, rs.len()))
                .collect::<Vec<_>>(),
            vec![(1, 1), (2, 2)]
        );
        let refs: Vec<&Rec> = recs.iter().collect();
        check_times_monotonic(&refs, "times");
    }
}

// ---------------------------------------------------------------------------------------
// Trace-file stats and kernel BPF objects

/// The JSON of the stats section (`FinalStats`, tracer-user/src/tracefile.rs) of a trace
/// file, or None when it has none (the recording did not finish). Walks the sections by
/// their length prefixes, so it needs no tracer code.
pub fn trace_stats(trace: &Path) -> Option<serde_json::Value> {
    use std::io::{Seek, SeekFrom};
    const SECTION_STATS: u32 = 4;
    let mut f = std::fs::File::open(trace)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", trace.display()));
    let mut header = [0u8; 16];
    f.read_exact(&mut header)
        .unwrap_or_else(|e| panic!("{}: no file header: {e}", trace.display()));
    assert_eq!(&header[..8], b"UTRCTRAC", "{}: magic", trace.display());
    let mut stats = None;
    loop {
        let mut h = [0u8; 16];
        if f.read_exact(&mut h).is_err() {
            return stats;
        }
        let kind = u32::from_le_bytes(h[..4].try_into().unwrap());
        let len = u64::from_le_bytes(h[8..].try_into().unwrap());
        if kind == SECTION_STATS {
            let mut payload = vec![0u8; len as usize];
            if f.read_exact(&mut payload).is_err() {
                return stats;
            }
            stats =
                Some(serde_json::from_slice(&payload).unwrap_or_else(|e| {
                    panic!("{}: stats section is not JSON: {e}", trace.display())
                }));
        } else {
            f.seek(SeekFrom::Current(len as i64)).unwrap();
        }
    }
}

/// `bpftool ... --json` (from /usr/sbin when it is not on PATH).
pub fn bpftool_json(args: &[&str]) -> serde_json::Value {
    let prog = if Path::new("/usr/sbin/bpftool").is_file() {
        "/usr/sbin/bpftool"
    } else {
        "bpftool"
    };
    let out = run(Command::new(prog).args(args).arg("--json"), RUN_TIMEOUT).ok();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bpftool output is not JSON ({e}): {}", out.describe()))
}

/// The kernel BPF objects a process holds descriptors of (from /proc/PID/fdinfo: a
/// program's or link's `prog_id`, a link's `link_id`, a map's `map_id`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BpfIds {
    pub progs: std::collections::BTreeSet<u64>,
    pub links: std::collections::BTreeSet<u64>,
    pub maps: std::collections::BTreeSet<u64>,
}

pub fn bpf_ids_of(pid: u32) -> BpfIds {
    let mut ids = BpfIds::default();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for e in dir.flatten() {
        // A descriptor closed meanwhile is simply not listed.
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for line in text.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let Ok(v) = v.trim().parse::<u64>() else {
                continue;
            };
            match k {
                "prog_id" => ids.progs.insert(v),
                "link_id" => ids.links.insert(v),
                "map_id" => ids.maps.insert(v),
                _ => false,
            };
        }
    }
    ids
}

// ---------------------------------------------------------------------------------------
// Readers independent of the tracer

/// What a Perfetto protobuf trace holds, read by Perfetto's own generated protos
/// (`tests/tools/perfetto_summary.py`, PyPI package `perfetto` installed by `cargo
/// xtask setup` into `target/xtask/python`).
pub fn perfetto_summary(trace: &Path) -> serde_json::Value {
    let py = workspace_root().join("target/xtask/python");
    assert!(
        py.join("perfetto").is_dir(),
        "{} has no perfetto package: run `cargo xtask setup`",
        py.display()
    );
    let mut c = Command::new("python3");
    c.arg(workspace_root().join("tests/tools/perfetto_summary.py"))
        .arg(trace)
        .env("PYTHONPATH", &py);
    let out = run(&mut c, RUN_TIMEOUT).ok();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "perfetto_summary.py printed no JSON ({e}): {}",
            out.describe()
        )
    })
}

/// The line of `fixture` whose text contains `// @tag` (1-based).
pub fn tagged_line(fixture_name: &str, tag: &str) -> u32 {
    let text = std::fs::read_to_string(fixture(fixture_name)).unwrap();
    let marker = format!("// @{tag}");
    let hits: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(&marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(hits.len(), 1, "{fixture_name}: tag {tag} on lines {hits:?}");
    hits[0] as u32
}
