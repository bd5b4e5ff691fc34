//! Trust boundaries of the files a root tracer parses and attaches to (issue 28, rows
//! 3, 5 and 7), tried by a real unprivileged user (`LocalUser::hostile`) against
//! another (`LocalUser::victim`):
//!
//! - a library in a directory the hostile user owns, swapped for a symlink to libc
//!   between the tracer's parse and its attach, puts no breakpoint and raises no
//!   semaphore in libc (the victim's libc bytes are the same during the session);
//! - one user loading 70 instrumented libraries during a system-wide session takes at
//!   most half of the session's binaries; a victim's program started after is traced
//!   exactly, and the summary counts the refusals;
//! - a file carrying the victim's binary_id with other contents is not taken for the
//!   victim's binary: the victim's records carry the victim's names and exact counts,
//!   the hostile process's records are not attributed to the victim's binary.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use tests::*;

/// Where file offset `off` of the file with inode `ino` is mapped in process `pid`.
fn mapped_at(pid: u32, ino: u64, off: u64) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[4].parse::<u64>().ok()? != ino {
            return None;
        }
        let (s, e) = f[0].split_once('-')?;
        let (s, e) = (
            u64::from_str_radix(s, 16).ok()?,
            u64::from_str_radix(e, 16).ok()?,
        );
        let moff = u64::from_str_radix(f[2], 16).ok()?;
        (moff <= off && off < moff + (e - s)).then(|| s + (off - moff))
    })
}

/// `len` bytes of process `pid` at the place file offset `off` of inode `ino` is mapped.
fn bytes_at(pid: u32, ino: u64, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let addr = mapped_at(pid, ino, off)
        .unwrap_or_else(|| panic!("offset {off:#x} of inode {ino} not mapped in {pid}"));
    let mem = File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr).unwrap();
    buf
}

/// Wait (at most 10 s) until `pid` maps inode `ino`.
fn wait_mapped(pid: u32, ino: u64) {
    let t0 = Instant::now();
    while mapped_at(pid, ino, 0).is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "process {pid} never mapped inode {ino}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A FIFO at `path` (root's), for `UTRACE_TEST_PAUSE`.
fn mkfifo(path: &Path) {
    run(Command::new("mkfifo").arg(path), RUN_TIMEOUT).ok();
}

/// Wait until session `t`'s control socket exists (the session is set up).
fn wait_session(t: &mut Child) {
    let sock = PathBuf::from(format!("/run/utrace/{}.sock", t.id()));
    let t0 = Instant::now();
    while !sock.exists() {
        if let Some(st) = t.try_wait().unwrap() {
            let out = t.stderr.take().map(std::io::read_to_string);
            panic!("the session ended before it started ({st}): {out:?} (stderr in *.err)");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "session did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// trust_files_lib.c built as a shared library with `VARIANT` = `variant`.
fn build_lib(dir: &Path, variant: u32) -> PathBuf {
    let out = dir.join(format!("lib{variant}.so"));
    let def = format!("-DVARIANT={variant}");
    compile(
        "gcc",
        &[fixture("trust_files_lib.c")],
        &["-O2", "-shared", "-fPIC", &def],
        &out,
    );
    out
}

/// `orig` rewritten into `out` with its entries and its USDT probe (whose semaphore the
/// tracer raises).
fn rewrite_lib(orig: &Path, out: &Path) -> Metadata {
    let args: [&std::ffi::OsStr; 5] = [
        orig.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
        "--sites".as_ref(),
        "entry,usdt".as_ref(),
    ];
    rewriter(&args).ok();
    metadata(out)
}

/// A user's directory in `tmp`, owned by `u`.
fn user_dir(tmp: &TempDir, u: &LocalUser, name: &str) -> PathBuf {
    let d = tmp.join(name);
    std::fs::create_dir_all(&d).unwrap();
    open_to_all(&d);
    u.own(&d);
    d
}

/// Row 3. Before: the tracer parsed `--binary DIR/libtrust.so` from one open and then
/// attached its flush uprobe, site uprobes and semaphore events **by path**; the hostile
/// user who owns DIR replaced the file by a symlink to libc in between, so root put a
/// breakpoint at the library's flush offset (and a reference-counter increment at its
/// semaphore offset) into libc, in every process on the host (the victim's `sleep`
/// included). Now the file is opened once and everything goes through that descriptor
/// (`/proc/self/fd/N`): the victim's libc bytes at those offsets are the same during the
/// session, while a hostile process that maps the parsed file shows the breakpoint and
/// the raised semaphore there (the uprobes did go on the parsed file).
#[test]
fn a_library_swapped_for_libc_after_parsing_puts_nothing_into_libc() {
    let (hostile, victim) = (LocalUser::hostile(), LocalUser::victim());
    let tmp = TempDir::new("trust-swap");
    open_to_all(tmp.path());
    let dir = user_dir(&tmp, &hostile, "hostile");
    let orig = build_lib(tmp.path(), 0);
    let lib = dir.join("libtrust.so");
    let meta = rewrite_lib(&orig, &lib);
    hostile.own(&lib);
    assert!(!meta.semaphores.is_empty(), "the library has a semaphore");
    let lib_ino = std::fs::metadata(&lib).unwrap().ino();
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let libc_ino = std::fs::metadata(libc).unwrap().ino();
    // Where the tracer puts a breakpoint (flush, uprobe sites, semaphore anchors), and
    // the semaphores it raises.
    let mut offsets = vec![meta.flush_file_off];
    offsets.extend(
        meta.sites
            .iter()
            .filter(|s| s.mode == SiteMode::Uprobe)
            .map(|s| s.file_off),
    );
    offsets.extend(meta.semaphores.iter().map(|s| s.anchor_file_off));
    let sems: Vec<u64> = meta
        .semaphores
        .iter()
        .map(|s| s.semaphore_file_off)
        .collect();

    let mut v = victim
        .command("sleep")
        .arg("120")
        .spawn()
        .expect("victim sleep");
    let mut w = hostile
        .command("env")
        .arg(format!("LD_PRELOAD={}", lib.display()))
        .args(["sleep", "120"])
        .spawn()
        .expect("witness sleep");
    wait_mapped(v.id(), libc_ino);
    wait_mapped(w.id(), lib_ino);
    let snapshot = |pid: u32, ino: u64| -> Vec<Vec<u8>> {
        let mut s: Vec<Vec<u8>> = offsets.iter().map(|&o| bytes_at(pid, ino, o, 1)).collect();
        s.extend(sems.iter().map(|&o| bytes_at(pid, ino, o, 2)));
        s
    };
    let libc_before = snapshot(v.id(), libc_ino);
    let lib_before = snapshot(w.id(), lib_ino);

    let fifo = tmp.join("pause");
    mkfifo(&fifo);
    let trace = tmp.join("t.utrace");
    let _g = tracing_lock();
    let mut t = Command::new(tracer_bin())
        .arg("record")
        .arg("--binary")
        .arg(&lib)
        .arg("-o")
        .arg(&trace)
        .args(["--", "/bin/sleep", "2"])
        .env("UTRACE_TEST_PAUSE", format!("parsed:{}", fifo.display()))
        .env("UTRACE_DEBUG_CACHE", scratch_debug_cache())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pause = paused(&fifo, &mut t);
    // The tracer has parsed the library; its owner swaps it for a symlink to libc.
    let ln = run(
        hostile.command("ln").arg("-sfn").arg(libc).arg(&lib),
        RUN_TIMEOUT,
    );
    assert!(ln.success(), "{}", ln.describe());
    assert!(std::fs::symlink_metadata(&lib).unwrap().is_symlink());
    drop(pause);
    wait_session(&mut t);
    std::thread::sleep(Duration::from_millis(300));
    let libc_during = snapshot(v.id(), libc_ino);
    let lib_during = snapshot(w.id(), lib_ino);
    let out = t.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = (v.kill(), w.kill(), v.wait(), w.wait());
    assert!(out.status.success(), "tracer: {stderr}");
    assert_eq!(
        libc_during, libc_before,
        "libc's bytes in the victim's process changed at {offsets:#x?} / semaphores {sems:#x?}"
    );
    // The parsed file got them: a breakpoint at its flush offset, its semaphore raised.
    assert_ne!(lib_before[0], [0xcc], "a breakpoint before the session");
    assert_eq!(
        lib_during[0],
        [0xcc],
        "no breakpoint at the parsed file's flush"
    );
    let sem_idx = offsets.len();
    assert_eq!(lib_before[sem_idx], [0, 0], "semaphore before");
    assert_eq!(
        lib_during[sem_idx],
        [1, 0],
        "semaphore of the parsed file not raised"
    );
}

/// An instrumented program `name`.c built and rewritten (functions `fns`) into `dir`,
/// owned by `owner`.
fn program(
    tmp: &TempDir,
    dir: &Path,
    owner: &LocalUser,
    src: &str,
    flags: &[&str],
    fns: &[&str],
    name: &str,
) -> (PathBuf, Metadata) {
    let orig = tmp.join(format!("{name}.orig"));
    compile("gcc", &[fixture(src)], flags, &orig);
    let out = dir.join(name);
    let (_, _, meta) = rewrite(&orig, Some(&out), fns);
    owner.own(&out);
    (out, meta)
}

/// End a session from [`system_wide`] (SIGINT): its stderr.
fn end_session(mut c: Child, trace: &Path) -> String {
    run(
        Command::new("kill").args(["-INT", &c.id().to_string()]),
        RUN_TIMEOUT,
    )
    .ok();
    let st = c.wait().unwrap();
    let err = std::fs::read_to_string(trace.with_extension("err")).unwrap();
    assert!(st.success(), "session: {err}");
    err
}

/// A program that waits with its stdin open, and says one line first.
fn started_waiting(mut c: Command) -> (Child, ChildStdin, String) {
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, stdin, line)
}

/// The victim's program run as the victim: its records in `recs` must be exactly its
/// calls (per site of victim_step: n, of victim_total: 1), under its own names.
fn check_victim(recs: &[Rec], pid: u32, n: u64, meta: &Metadata, what: &str) {
    let mine: Vec<&Rec> = recs.iter().filter(|r| r.pid == pid).collect();
    assert!(
        !mine.is_empty(),
        "{what}: the victim's program is not traced"
    );
    for s in meta.sites.iter().filter(|s| s.name.starts_with("victim_")) {
        let got = mine.iter().filter(|r| r.site == s.id).count() as u64;
        let want = if s.name == "victim_step" { n } else { 1 };
        assert_eq!(got, want, "{what}: site {} ({})", s.id, s.name);
    }
    for r in &mine {
        assert!(
            r.symbol.starts_with("victim_") && r.binary.ends_with("victim"),
            "{what}: a victim record named {} in {}",
            r.symbol,
            r.binary
        );
    }
}

/// Run the victim's program (`n` steps) as the victim; its pid, after checking its
/// output.
fn run_victim(victim: &LocalUser, prog: &Path, n: u64) -> u32 {
    let mut c = victim.command(prog);
    c.arg(n.to_string()).stdout(Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let want: u64 = (0..n).map(|i| i * 2 + 1).sum();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("victim {n} {want}\n")
    );
    pid
}

/// Row 5 (binaries). Before: a system-wide session traced at most 64 binaries
/// (`MAX_BINARIES`), first come first served: one user loading 70 instrumented
/// libraries took every slot and every later program of other users went untraced
/// ("already 64 instrumented binaries in this session"). Now a uid (the file's owner)
/// may have at most half: 32 of the hostile libraries are traced, 38 refused (counted in
/// the summary, and released at once instead of waiting for an attach), and the victim's
/// program started after them is traced exactly.
#[test]
fn one_user_filling_the_binary_slots_leaves_room_for_others() {
    const LIBS: u32 = 70;
    let (hostile, victim) = (LocalUser::hostile(), LocalUser::victim());
    let tmp = TempDir::new("trust-shares");
    open_to_all(tmp.path());
    let hdir = user_dir(&tmp, &hostile, "hostile");
    let vdir = user_dir(&tmp, &victim, "victim");
    let libs: Vec<PathBuf> = (1..=LIBS)
        .map(|i| {
            let orig = build_lib(tmp.path(), i);
            let out = hdir.join(format!("libtrust{i}.so"));
            rewrite_lib(&orig, &out);
            hostile.own(&out);
            out
        })
        .collect();
    let loader = tmp.join("loader");
    compile(
        "gcc",
        &[fixture("trust_files_loader.c")],
        &["-O2", "-ldl"],
        &loader,
    );
    let (vprog, vmeta) = program(
        &tmp,
        &vdir,
        &victim,
        "trust_files_victim.c",
        &["-O2"],
        &["victim_*"],
        "victim",
    );

    let trace = tmp.join("sw.utrace");
    let _g = tracing_lock();
    let session = system_wide_session(&trace);
    let mut c = hostile.command(&loader);
    c.args(&libs);
    let (mut l, stdin, line) = started_waiting(c);
    assert_eq!(line, format!("loaded {LIBS}\n"));
    let n = 25;
    let vpid = run_victim(&victim, &vprog, n);
    drop(stdin);
    let _ = l.wait();
    let stderr = end_session(session, &trace);
    let recs = dump(&trace);
    check_victim(&recs, vpid, n, &vmeta, "victim after 70 hostile libraries");
    let hostile_libs: std::collections::HashSet<&str> = recs
        .iter()
        .filter(|r| r.binary.contains("libtrust"))
        .map(|r| &*r.binary)
        .collect();
    assert!(
        hostile_libs.len() <= 32,
        "{} hostile libraries traced",
        hostile_libs.len()
    );
    assert!(
        stderr.contains(&format!(
            "{} instrumented binaries not traced: their owner's share is full",
            LIBS - 32
        )),
        "{stderr}"
    );
}

/// `path` with every occurrence of `from`'s 8 bytes (little-endian) replaced by `to`'s:
/// a binary_id forged in the note and the RW image alike.
fn forge_id(path: &Path, from: u64, to: u64) {
    let mut data = std::fs::read(path).unwrap();
    let (f, t) = (from.to_le_bytes(), to.to_le_bytes());
    let mut n = 0;
    let mut i = 0;
    while i + 8 <= data.len() {
        if data[i..i + 8] == f {
            data[i..i + 8].copy_from_slice(&t);
            n += 1;
            i += 8;
        } else {
            i += 1;
        }
    }
    assert!(n >= 2, "binary_id found {n} times in {}", path.display());
    File::create(path).unwrap().write_all(&data).unwrap();
}

/// Row 7 (binary_id). Before: binaries were told apart by binary_id alone. A hostile
/// file carrying the victim's binary_id (its note and RW header patched) was taken for
/// the victim's binary once the victim's was traced: it got no uprobes but its process
/// was seeded into `TABLES`, so its exit drains delivered records under the victim's
/// binary_id, named after the victim's functions (and had the hostile file come first,
/// the victim's file would have been "known" and left without uprobes). Now binaries are
/// files (`(st_dev, st_ino)`): a second file with that binary_id and other contents is
/// refused (a warning, counted in the summary) and only released, so nothing of it is
/// attributed to the victim's binary; the victim's programs before and after it are
/// traced exactly under their own names. A true copy of the victim's program (same
/// note, another file) is traced too, as that binary (before: only the first file of
/// an id got uprobes; a copy's full buffers reached no drain, only its exits did).
#[test]
fn a_file_with_a_victims_binary_id_is_not_taken_for_it() {
    let (hostile, victim) = (LocalUser::hostile(), LocalUser::victim());
    let tmp = TempDir::new("trust-id");
    open_to_all(tmp.path());
    let hdir = user_dir(&tmp, &hostile, "hostile");
    let vdir = user_dir(&tmp, &victim, "victim");
    let (vprog, vmeta) = program(
        &tmp,
        &vdir,
        &victim,
        "trust_files_victim.c",
        &["-O2"],
        &["victim_*"],
        "victim",
    );
    // The hostile program: other functions (evil_*), other layout, the victim's id.
    let (hprog, hmeta) = program(
        &tmp,
        &hdir,
        &hostile,
        "trust_files_victim.c",
        &[
            "-O0",
            "-Dvictim_step=evil_step",
            "-Dvictim_total=evil_total",
        ],
        &["evil_*"],
        "evil",
    );
    assert_ne!(hmeta.binary_id, vmeta.binary_id);
    forge_id(&hprog, hmeta.binary_id, vmeta.binary_id);
    assert_eq!(metadata(&hprog).binary_id, vmeta.binary_id);

    let trace = tmp.join("sw.utrace");
    let _g = tracing_lock();
    let session = system_wide_session(&trace);
    let (n1, n2) = (12, 30);
    let v1 = run_victim(&victim, &vprog, n1);
    // The forged program, run as the hostile user while the session runs.
    let h = run(hostile.command(&hprog).arg("40"), RUN_TIMEOUT);
    let hpid_out = h.stdout_str();
    assert!(hpid_out.starts_with("victim 40 "), "{}", h.describe());
    // Once more: a refused binary's program is released at once, not left to wait out
    // its 10 s for an attach that never comes.
    let t0 = Instant::now();
    let h = run(hostile.command(&hprog).arg("40"), RUN_TIMEOUT);
    assert!(h.stdout_str().starts_with("victim 40 "), "{}", h.describe());
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the forged program waited {:?}",
        t0.elapsed()
    );
    let v2 = run_victim(&victim, &vprog, n2);
    // A true copy (same binary_id, same note, another file) is traced as that binary.
    let copy = hdir.join("copy");
    let cp = run(hostile.command("cp").arg(&vprog).arg(&copy), RUN_TIMEOUT);
    assert!(cp.success(), "{}", cp.describe());
    let n3 = 7;
    let v3 = run_victim(&hostile, &copy, n3);
    let stderr = end_session(session, &trace);
    let recs = dump(&trace);
    check_victim(&recs, v1, n1, &vmeta, "victim before the forged file");
    check_victim(&recs, v2, n2, &vmeta, "victim after the forged file");
    check_victim(&recs, v3, n3, &vmeta, "a copy of the victim's program");
    // Every record of the victim's binary is from the victim's processes or the copy.
    let strays: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.binary.ends_with("victim") && ![v1, v2, v3].contains(&r.pid))
        .collect();
    assert!(
        strays.is_empty(),
        "{} records attributed to the victim's binary from other processes, first {:?}",
        strays.len(),
        strays.first()
    );
    assert!(
        stderr.contains("1 instrumented binary not traced: another file has their binary_id"),
        "{stderr}"
    );
}
