//! Issue 28, rows 5 (the note's part) and 7 (but binary_id): what a hostile binary,
//! process or user can make a root tracer spend or lose, bounded and said.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tests::*;

/// The fuzz finding of row 5: a 4 MiB `.note.utrace` whose 65,536 site names all point
/// at one 2 MiB name (~128 GiB once every name is materialised).
fn huge_names_note() -> PathBuf {
    workspace_root().join("fuzz/findings/utrace_note/shared-site-names-128GiB")
}

/// `fixtures/trust_limits.c` compiled (-O2 -g) and rewritten with `rewriter_args`.
fn build(tmp: &TempDir, rewriter_args: &[&str]) -> PathBuf {
    let (orig, traced) = (tmp.join("limits"), tmp.join("limits.traced"));
    compile("gcc", &[fixture("trust_limits.c")], &["-O2", "-g"], &orig);
    let mut args: Vec<&std::ffi::OsStr> = vec![
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "rec".as_ref(),
    ];
    args.extend(rewriter_args.iter().map(|a| std::ffi::OsStr::new(*a)));
    rewriter(&args).ok();
    traced
}

/// `tracer ARGS` under `prlimit --as=2GiB` (an allocation past it fails, so a parser
/// that multiplies the note dies), with `UTRACE_DEBUG_CACHE` off.
fn tracer_limited(args: &[&std::ffi::OsStr]) -> Out {
    let mut c = Command::new("prlimit");
    c.arg(format!("--as={}", 2u64 << 30))
        .arg("--")
        .arg(tracer_bin())
        .args(args)
        .env("UTRACE_DEBUG_CACHE", "");
    run(&mut c, Duration::from_secs(120))
}

/// The sections of a trace file: (kind, payload).
fn sections(b: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut v = Vec::new();
    let mut o = 16;
    while o + 16 <= b.len() {
        let kind = u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let len = u64::from_le_bytes(b[o + 8..o + 16].try_into().unwrap()) as usize;
        v.push((kind, b[o + 16..o + 16 + len].to_vec()));
        o += 16 + len;
    }
    v
}

/// Row 5. Before: `tracer record` parsed such a note into 65,536 copies of the 2 MiB
/// name (~128 GiB; under the 2 GiB limit it died of SIGABRT, "memory allocation of
/// 2097152 bytes failed"), and so did `report` and `dump` of a trace carrying it. Now
/// the note is refused ("note too large": the names would take more than the table
/// they come from) in bounded memory, with no crash: `record --binary` fails, the
/// readers report without that binary's names and say why.
#[test]
fn a_note_that_multiplies_in_memory_is_refused() {
    let tmp = TempDir::new("trust-note");
    let note = huge_names_note();
    let prog = build(&tmp, &[]);

    // A binary carrying the note (made by the hostile user: any file can).
    let plain = tmp.join("plain");
    compile("gcc", &[fixture("trust_limits.c")], &["-O2"], &plain);
    let bad = tmp.join("bad");
    let o = run(
        Command::new("objcopy")
            .arg(format!("--add-section=.note.utrace={}", note.display()))
            .arg(&plain)
            .arg(&bad),
        RUN_TIMEOUT,
    );
    assert!(o.success(), "{}", o.describe());
    let trace = tmp.join("bad.utrace");
    let o = tracer_limited(&[
        "record".as_ref(),
        "--binary".as_ref(),
        bad.as_os_str(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        bad.as_os_str(),
        "plain".as_ref(),
        "1".as_ref(),
    ]);
    assert_eq!(o.signal, None, "{}", o.describe());
    assert_ne!(o.code, Some(0), "{}", o.describe());
    assert!(
        o.stderr_str().contains("note too large"),
        "{}",
        o.describe()
    );

    // A trace whose binary section carries the note: every reader refuses it.
    let _g = tracing_lock();
    let good = tmp.join("good.utrace");
    let o = run(
        Command::new(tracer_bin())
            .args(["record", "--user", "-o"])
            .arg(&good)
            .arg("--")
            .arg(&prog)
            .args(["plain", "10"])
            .env("UTRACE_DEBUG_CACHE", ""),
        RUN_TIMEOUT,
    );
    assert!(o.success(), "{}", o.describe());
    let bytes = std::fs::read(&good).unwrap();
    let huge = std::fs::read(&note).unwrap();
    let mut forged = bytes[..16].to_vec();
    for (kind, mut payload) in sections(&bytes) {
        if kind == 2 {
            let path_len = u32::from_le_bytes(payload[4..8].try_into().unwrap()) as usize;
            payload.truncate(16 + path_len);
            payload.extend_from_slice(&huge);
        }
        forged.extend_from_slice(&kind.to_le_bytes());
        forged.extend_from_slice(&0u32.to_le_bytes());
        forged.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        forged.extend_from_slice(&payload);
    }
    let forged_path = tmp.join("forged.utrace");
    std::fs::write(&forged_path, &forged).unwrap();
    // The readers go on without that binary's names (what they do with any metadata
    // they cannot parse): no crash, no name of it, the refusal said.
    for cmd in ["report", "dump"] {
        let o = tracer_limited(&[cmd.as_ref(), forged_path.as_os_str()]);
        assert_eq!(o.signal, None, "{cmd}: {}", o.describe());
        assert!(
            !o.stdout_str().contains("xxxxxxxx"),
            "{cmd}: a name of the note"
        );
        assert!(
            o.stderr_str().contains("note too large"),
            "{cmd}: {}",
            o.describe()
        );
    }
}

/// The hostile `-p` target, killed when the test ends.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Row 7, the stop drain. A process of the hostile user forges all 1,048,576 slots of
/// its RW area as its own thread's, each in the middle of a record that never ends and
/// holding 1 MiB. Before: the stop drain single-stepped the thread up to 100,000 times
/// per slot and buffered up to 512 MiB per slot (about 10^11 steps and a TiB): the
/// session was still running when the test's 120 s timeout killed it. Now the whole
/// session takes about 12 s (1 s traced, at most 5 s of stop drain) with a peak RSS
/// about 120 MiB, and says what it gave up (~1,000,000 slots, ~45,000 records being
/// written, ~47 GB of records).
#[test]
fn the_stop_drain_of_a_hostile_process_is_bounded() {
    let tmp = TempDir::new("trust-stop");
    open_to_all(tmp.path());
    let prog = build(&tmp, &["--slots", "1048576", "--buffer-records", "2"]);
    let hostile = LocalUser::hostile();
    let _g = tracing_lock();
    let mut child = hostile
        .command(&prog)
        .args(["forge", &(1u64 << 20).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let target = Target(child);
    let first = lines.next().unwrap().unwrap();
    assert!(first.ends_with("slots=1048576"), "{first}");
    let pid = target.0.id();

    let trace = tmp.join("T");
    let t0 = Instant::now();
    let o = run(
        Command::new("/usr/bin/time")
            .args(["-f", "maxrss_kib=%M"])
            .arg(tracer_bin())
            .args(["record", "-p", &pid.to_string(), "--duration", "1", "-o"])
            .arg(&trace)
            .env("UTRACE_DEBUG_CACHE", ""),
        Duration::from_secs(120),
    );
    let took = t0.elapsed();
    assert!(o.success(), "{}", o.describe());
    let err = o.stderr_str();
    // 1 s of session, setup, then the stop drain's 5 s at most.
    assert!(took < Duration::from_secs(20), "took {took:?}: {err}");
    let rss: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("maxrss_kib="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no maxrss: {err}"));
    assert!(rss < 1 << 20, "peak RSS {rss} KiB: {err}");
    let gave_up = err
        .lines()
        .find(|l| l.contains("the stop drain of process"))
        .unwrap_or_else(|| panic!("the give-ups are not said: {err}"));
    let count = |what: &str| -> u64 {
        let before = gave_up.split(what).next().unwrap();
        before
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count before {what:?}: {gave_up}"))
    };
    eprintln!("{gave_up}; took {took:?}, peak RSS {rss} KiB");
    // Every forged slot was either given up, or left without its record in progress.
    assert!(
        count(" slots,") + count(" records being written") >= 1_000_000,
        "{gave_up}"
    );
    assert!(count(" bytes of records") > 0, "{gave_up}");
}

/// Row 7, the trace's name. Before: a directory planted at the final name (by the
/// traced program itself, or any user who can write the directory) made the rename
/// fail at the end and the writer removed the finished trace. Now a directory there
/// already is refused before the session starts (the command never runs); during the
/// session the trace is at its name already (put there as the session starts), which
/// the traced hostile user can neither remove nor replace in a sticky directory: the
/// finished trace stays there, whole.
#[test]
fn a_directory_at_the_trace_name_loses_nothing() {
    let tmp = TempDir::new("trust-dir");
    let prog = build(&tmp, &[]);
    let hostile = LocalUser::hostile();
    let out = tmp.join("shared");
    std::fs::create_dir(&out).unwrap();
    // A directory every user may write in, as /tmp.
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    open_to_all(tmp.path());
    let _g = tracing_lock();

    let planted = out.join("early.utrace");
    let st = hostile.command("mkdir").arg(&planted).status().unwrap();
    assert!(st.success());
    let marker = tmp.join("ran");
    let o = run(
        Command::new(tracer_bin())
            .args(["record", "--user", "-o"])
            .arg(&planted)
            .args(["--", "touch"])
            .arg(&marker),
        RUN_TIMEOUT,
    );
    assert_ne!(o.code, Some(0), "{}", o.describe());
    assert!(
        o.stderr_str().contains("is a directory"),
        "{}",
        o.describe()
    );
    assert!(!marker.exists(), "the command ran before the error");

    // Planted while the session runs, by the traced command (the hostile user): the
    // trace is there already, root's, so the attempt fails and the program runs on.
    let late = out.join("late.utrace");
    let script = format!(
        "rm -rf {late} 2>/dev/null; mkdir {late} 2>/dev/null && exit 3; exec {prog} plain 10",
        late = late.display(),
        prog = prog.display()
    );
    let o = run(
        Command::new(tracer_bin())
            .args(["record", "--user", "-o"])
            .arg(&late)
            .arg("--")
            .arg("setpriv")
            .arg(format!("--reuid={}", hostile.uid))
            .arg(format!("--regid={}", hostile.gid))
            .args(["--clear-groups", "--", "sh", "-c", &script])
            .env("UTRACE_DEBUG_CACHE", ""),
        RUN_TIMEOUT,
    );
    assert_eq!(o.code, Some(0), "{}", o.describe());
    assert!(late.is_file(), "{}", o.describe());
    assert_eq!(trace_header_flags(&late), 0, "the trace is not complete");
    let values: Vec<u64> = dump(&late)
        .iter()
        .filter(|r| &*r.symbol == "rec")
        .map(|r| r.value & 0xffff)
        .collect();
    assert_eq!(values, (0..10).collect::<Vec<_>>());
}

/// Row 7, the debug cache. The hostile user's cache directory holds `utrace`, a link to
/// a root-owned directory. Before: a root `tracer record` run with that user's
/// environment (`sudo -E`: XDG_CACHE_HOME, HOME) followed the link, created
/// `debug/.build-id/..` in the root-owned directory and wrote the traced binary there
/// (the test found `debug` in it).
/// Now the cache path is walked by descriptor and refused at the first directory the
/// user owns: nothing is written through it.
#[test]
fn the_debug_cache_follows_no_users_link() {
    let tmp = TempDir::new("trust-cache");
    open_to_all(tmp.path());
    let prog = build(&tmp, &[]);
    let hostile = LocalUser::hostile();
    let home = tmp.join("home");
    std::fs::create_dir(&home).unwrap();
    hostile.own(&home);
    let cache = home.join("cache");
    let st = hostile.command("mkdir").arg(&cache).status().unwrap();
    assert!(st.success());
    // Root's directory, the target of the link.
    let rootdir = tmp.join("rootdir");
    std::fs::create_dir(&rootdir).unwrap();
    let st = hostile
        .command("ln")
        .arg("-s")
        .arg(&rootdir)
        .arg(cache.join("utrace"))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        std::fs::symlink_metadata(cache.join("utrace"))
            .unwrap()
            .uid(),
        hostile.uid
    );

    let _g = tracing_lock();
    let trace = tmp.join("T");
    let o = run(
        Command::new(tracer_bin())
            .args(["record", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&prog)
            .args(["plain", "10"])
            .env_remove("UTRACE_DEBUG_CACHE")
            .env("XDG_CACHE_HOME", &cache)
            .env("HOME", &home),
        RUN_TIMEOUT,
    );
    assert!(o.success(), "{}", o.describe());
    let values = dump(&trace).iter().filter(|r| &*r.symbol == "rec").count();
    assert_eq!(values, 10, "{}", o.describe());
    let inside: Vec<_> = std::fs::read_dir(&rootdir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(inside.is_empty(), "written through the link: {inside:?}");
}

/// Row 5 (review item 5), the debug cache at a session's end. The hostile user's
/// binary (no DWARF) has a `.gnu_debuglink` naming `limits.debug` beside it, and the
/// user makes that a sparse file of 1 TiB (or its real debug file, owned by the user).
/// Before: the root tracer mapped the candidate and computed its CRC-32 over the whole
/// terabyte at the end of the session (hours; a user truncating the mapped file
/// meanwhile killed root with SIGBUS), and cached the user's debug file under root's
/// cache. Now the cache step reads candidates by descriptor with bounded reads, none
/// past 4 GiB, and as root only files owned by root or itself: the session ends at
/// once and nothing of the user's is cached.
#[test]
fn the_debug_cache_reads_no_users_file_as_root() {
    let tmp = TempDir::new("trust-cache-debuglink");
    open_to_all(tmp.path());
    let hostile = LocalUser::hostile();
    let full = tmp.join("limits");
    compile("gcc", &[fixture("trust_limits.c")], &["-O2", "-g"], &full);
    let (debug, stripped, traced) = (
        tmp.join("limits.debug"),
        tmp.join("limits.stripped"),
        tmp.join("limits.traced"),
    );
    let objcopy =
        |args: &[&std::ffi::OsStr]| run(Command::new("objcopy").args(args), RUN_TIMEOUT).ok();
    objcopy(&[
        "--only-keep-debug".as_ref(),
        full.as_os_str(),
        debug.as_os_str(),
    ]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    objcopy(&[
        "--strip-debug".as_ref(),
        link.as_ref(),
        full.as_os_str(),
        stripped.as_os_str(),
    ]);
    rewriter(&[
        stripped.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "rec".as_ref(),
    ])
    .ok();
    let cache = tmp.join("cache");
    std::fs::create_dir(&cache).unwrap();

    let _g = tracing_lock();
    let session = |name: &str| {
        let trace = tmp.join(name);
        let t0 = Instant::now();
        let o = run(
            Command::new(tracer_bin())
                .args(["record", "-o"])
                .arg(&trace)
                .arg("--")
                .arg(&traced)
                .args(["plain", "10"])
                .env("UTRACE_DEBUG_CACHE", &cache),
            RUN_TIMEOUT,
        );
        let took = t0.elapsed();
        assert!(o.success(), "{}", o.describe());
        let values = dump(&trace).iter().filter(|r| &*r.symbol == "rec").count();
        assert_eq!(values, 10, "{}", o.describe());
        (took, walk_files(&cache))
    };
    // Control: root's own files are found by the debuglink and cached.
    let (_, cached) = session("T0");
    assert_eq!(cached.len(), 1, "root's debug file not cached: {cached:?}");
    assert_eq!(
        std::fs::read(&cached[0]).unwrap(),
        std::fs::read(&debug).unwrap()
    );
    std::fs::remove_file(&cached[0]).unwrap();
    hostile.own(&traced);
    hostile.own(&debug);
    // The user's real debug file (the CRC matches): not cached by root.
    let (took, cached) = session("T1");
    assert!(cached.is_empty(), "the user's file was cached: {cached:?}");
    eprintln!("with the user's debug file: {took:?}");
    // A sparse terabyte at the debuglink's name: not read at all.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&debug)
        .unwrap();
    f.set_len(1 << 40).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(&debug).unwrap().uid(), hostile.uid);
    let (took, cached) = session("T2");
    assert!(cached.is_empty(), "the user's file was cached: {cached:?}");
    eprintln!("with a sparse 1 TiB debug file: {took:?}");
    assert!(took < Duration::from_secs(30), "the session took {took:?}");
}

/// Every file under `dir`, recursively.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}
