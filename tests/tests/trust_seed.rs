//! Trust boundaries of seeding (issue 28, row 4), tried by a real unprivileged user
//! (`LocalUser::hostile`): the tracer (root) writes into a traced process's RW area
//! (`attached`, `on_full`) only through the `/proc/PID/mem` descriptor it checked the
//! area's magic through, opened relative to the held `/proc/PID` directory.
//!
//! - A process that execs between the check and the write, or between the read of its
//!   `maps` and the check: the new image's bytes are the same before and after (`mem`
//!   is opened before `maps` is read, and stays on the image it was opened on).
//! - A file on another filesystem with the same path and inode number as a file the
//!   session already knows is not taken for it (the cache is keyed by `(st_dev,
//!   st_ino)`): nothing is written into the process that maps it.
//! - A legitimate user's program on overlayfs (`maps` and `fstat` disagree on its
//!   device) is found and traced with `-p`.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use tests::*;
use tracer_common::{ATTACHED, RW_MAGIC, RWH_ATTACHED, RWH_ON_FULL};

/// Where process `pid` maps the file with inode `ino` at file offset 0.
fn base_of(pid: u32, ino: u64) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 6
            && f[4].parse::<u64>().ok()? == ino
            && u64::from_str_radix(f[2], 16).ok()? == 0)
            .then(|| u64::from_str_radix(f[0].split_once('-')?.0, 16).ok())?
    })
}

fn read_mem(pid: u32, addr: u64, len: usize) -> Vec<u8> {
    let mem = File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr).unwrap();
    buf
}

/// `tracer record -p PID --duration S` (with extra environment), stderr to `err`.
fn attach(pid: u32, secs: &str, trace: &Path, env: &[(&str, String)]) -> Child {
    let mut c = Command::new(tracer_bin());
    c.args(["record", "-p", &pid.to_string(), "--duration", secs, "-o"])
        .arg(trace)
        .env(
            "UTRACE_DEBUG_CACHE",
            std::env::temp_dir().join("utrace-test-debug-cache"),
        )
        .stdout(Stdio::null())
        .stderr(File::create(trace.with_extension("err")).unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn finish(mut t: Child, trace: &Path) -> String {
    let st = t.wait().unwrap();
    let err = std::fs::read_to_string(trace.with_extension("err")).unwrap();
    assert!(st.success(), "tracer: {err}");
    err
}

/// A program started as `u` with piped stdin/stdout, once it said "ready".
fn started(u: &LocalUser, prog: &Path) -> (Child, ChildStdin, BufReader<ChildStdout>) {
    let mut c = u
        .command(prog)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = c.stdin.take().unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    expect_line(&mut out, "ready\n");
    (c, stdin, out)
}

fn expect_line(out: &mut BufReader<ChildStdout>, want: &str) {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, want);
}

/// The hostile user's instrumented stage (trust_seed_exec.c, rewritten) and the image
/// it execs into (trust_seed_image.c), in a directory of theirs.
fn build(tmp: &TempDir, hostile: &LocalUser) -> (PathBuf, Metadata, PathBuf) {
    open_to_all(tmp.path());
    let dir = tmp.join("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    open_to_all(&dir);
    hostile.own(&dir);
    let orig = tmp.join("stage1.orig");
    compile("gcc", &[fixture("trust_seed_exec.c")], &["-O2"], &orig);
    let stage1 = dir.join("stage1");
    let (_, _, meta) = rewrite(&orig, Some(&stage1), &["seed_work"]);
    let image = dir.join("image");
    compile("gcc", &[fixture("trust_seed_image.c")], &["-O2"], &image);
    hostile.own(&stage1);
    hostile.own(&image);
    (stage1, meta, image)
}

/// Row 4 (exec). Before: seeding read the RW area's magic through one open of
/// `/proc/PID/mem` and wrote `on_full` and `attached` through another, opened by path
/// afterwards: a process that exec'd in between (here: when the test chose, the tracer
/// paused between the check and the write by `UTRACE_TEST_PAUSE=seed-checked`) had
/// root's two words written into its new image, unchecked. Now the check and the write
/// go through one descriptor, opened relative to the held `/proc/PID`: it stays on the
/// image it was opened on, so the write fails. The new image (a page of 0x5a with an
/// RW magic at the old RW area's address) is byte for byte the same after the session;
/// a first session without the exec shows that the tracer does write `attached` into
/// the image it checked.
#[test]
fn a_process_that_execs_between_check_and_write_gets_nothing_written() {
    let hostile = LocalUser::hostile();
    let tmp = TempDir::new("trust-seed-exec");
    let (stage1, meta, image) = build(&tmp, &hostile);
    let ino = std::fs::metadata(&stage1).unwrap().ino();
    let (mut p, stdin, out) = started(&hostile, &stage1);
    let pid = p.id();
    let rw_base = base_of(pid, ino).expect("stage1 mapped") + meta.rw_vaddr;
    assert_eq!(read_mem(pid, rw_base, 8), RW_MAGIC.to_le_bytes());

    let _g = tracing_lock();
    // Without the exec: the checked image gets `attached`.
    let trace = tmp.join("plain.utrace");
    finish(attach(pid, "1", &trace, &[]), &trace);
    assert_eq!(
        read_mem(pid, rw_base + RWH_ATTACHED, 4),
        ATTACHED.to_le_bytes(),
        "the tracer did not tell the checked image it is attached"
    );

    // With the exec between the check and the write.
    exec_while_paused("seed-checked", &tmp, &mut p, stdin, out, rw_base, &image);
}

/// Row 4 (exec), earlier: an exec between the tracer's read of `maps` and its check of
/// the RW area (here: `-p`, the tracer paused after finding and parsing the binaries by
/// `UTRACE_TEST_PAUSE=parsed`, before seeding). Before: `/proc/PID/mem` was opened only
/// at the check, on the new image, which holds an RW magic at the old RW area's
/// address: root wrote `attached` and `on_full` into it. Now `mem` is opened before
/// `maps` is read again through the same `/proc/PID`, and the binary must still be
/// mapped at the bias found: it is not (the process exec'd), so nothing is written;
/// the new image is byte for byte the same after the session.
#[test]
fn a_process_that_execs_between_maps_read_and_check_gets_nothing_written() {
    let hostile = LocalUser::hostile();
    let tmp = TempDir::new("trust-seed-exec-maps");
    let (stage1, meta, image) = build(&tmp, &hostile);
    let ino = std::fs::metadata(&stage1).unwrap().ino();
    let (mut p, stdin, out) = started(&hostile, &stage1);
    let pid = p.id();
    let rw_base = base_of(pid, ino).expect("stage1 mapped") + meta.rw_vaddr;
    assert_eq!(read_mem(pid, rw_base, 8), RW_MAGIC.to_le_bytes());

    let _g = tracing_lock();
    exec_while_paused("parsed", &tmp, &mut p, stdin, out, rw_base, &image);
}

/// A `-p` session of the hostile process `p` paused at `point` (`UTRACE_TEST_PAUSE`);
/// meanwhile `p` execs into `image`, which holds an RW magic at `rw_base` and 0x5a
/// around it; then the session goes on. Nothing may change in the new image (`on_full`
/// and `attached` above all). The caller holds [`tracing_lock`].
fn exec_while_paused(
    point: &str,
    tmp: &TempDir,
    p: &mut Child,
    mut stdin: ChildStdin,
    mut out: BufReader<ChildStdout>,
    rw_base: u64,
    image: &Path,
) {
    let pid = p.id();
    let fifo = tmp.join("pause");
    run(Command::new("mkfifo").arg(&fifo), RUN_TIMEOUT).ok();
    let trace = tmp.join("exec.utrace");
    let pause = ("UTRACE_TEST_PAUSE", format!("{point}:{}", fifo.display()));
    let mut t = attach(pid, "2", &trace, &[pause]);
    let gate = paused(&fifo, &mut t);
    writeln!(stdin, "{} {rw_base:x} {RW_MAGIC:x}", image.display()).unwrap();
    expect_line(&mut out, "ready\n");
    let page = rw_base & !0xfff;
    let before = read_mem(pid, page, 0x2000);
    assert_eq!(read_mem(pid, rw_base, 8), RW_MAGIC.to_le_bytes());
    drop(gate);
    let err = finish(t, &trace);
    let after = read_mem(pid, page, 0x2000);
    drop(stdin);
    let _ = p.wait();
    let off = (rw_base - page) as usize;
    for (what, at) in [("on_full", RWH_ON_FULL), ("attached", RWH_ATTACHED)] {
        let i = off + at as usize;
        assert_eq!(
            after[i..i + 4],
            [0x5a; 4],
            "root wrote {what} into the new image: {err}"
        );
    }
    assert!(after == before, "the new image's bytes changed: {err}");
}

/// Mounts made by a test, unmounted (innermost first) when it ends, passed or not.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn mount(&mut self, args: &[&str], at: &Path) {
        run(Command::new("mount").args(args).arg(at), RUN_TIMEOUT).ok();
        self.0.push(at.to_path_buf());
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for at in self.0.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(at).status();
        }
    }
}

/// Review item 2 (a legitimate user's program on overlayfs, `-p`). `maps` shows the
/// overlay superblock's device, while `fstat` of the mapped file gives the lower
/// layer's pseudo device (layers on two filesystems: a tmpfs under an ext4 upper,
/// `xino=off`; btrfs subvolumes differ the same way). Before: the tracer required the
/// two devices equal, so the program's binary was never opened and `-p` ended in
/// "nothing to trace". Now the identity is `fstat`'s on both sides (the inode must
/// match `maps`): the binary is found, traced, and its RW area told it is attached
/// (read back through `/proc/PID/mem`).
#[test]
fn a_program_on_overlayfs_is_traced_with_p() {
    let victim = LocalUser::victim();
    let tmp = TempDir::new("trust-seed-overlay");
    let (stage1, meta, _) = build(&tmp, &victim);
    let (lower, upper, work, merged) = (
        tmp.join("lower"),
        tmp.join("upper"),
        tmp.join("work"),
        tmp.join("merged"),
    );
    for d in [&lower, &upper, &work, &merged] {
        std::fs::create_dir_all(d).unwrap();
        open_to_all(d);
    }
    let mut mounts = Mounts(Vec::new());
    mounts.mount(&["-t", "tmpfs", "tmpfs"], &lower);
    open_to_all(&lower);
    std::fs::copy(&stage1, lower.join("stage1")).unwrap();
    victim.own(&lower.join("stage1"));
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},xino=off",
        lower.display(),
        upper.display(),
        work.display()
    );
    mounts.mount(&["-t", "overlay", "overlay", "-o", &opts], &merged);
    let prog = merged.join("stage1");
    let st = std::fs::metadata(&prog).unwrap();
    let (mut p, stdin, _out) = started(&victim, &prog);
    let pid = p.id();
    let rw_base = base_of(pid, st.ino()).expect("stage1 mapped") + meta.rw_vaddr;
    // The kernel's two views of the file differ in the device (the case at hand).
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps
        .lines()
        .find(|l| l.ends_with("/merged/stage1"))
        .unwrap();
    let dev = line.split_whitespace().nth(3).unwrap().to_string();
    let shown = format!(
        "{:02x}:{:02x}",
        libc::major(st.dev()),
        libc::minor(st.dev())
    );
    assert_ne!(dev, shown, "maps and fstat agree on the device: {line}");

    let _g = tracing_lock();
    let trace = tmp.join("overlay.utrace");
    let err = finish(attach(pid, "1", &trace, &[]), &trace);
    let attached = read_mem(pid, rw_base + RWH_ATTACHED, 4);
    drop(stdin);
    let _ = p.wait();
    assert_eq!(
        attached,
        ATTACHED.to_le_bytes(),
        "the program on overlayfs was not traced: {err}"
    );
    drop(mounts);
}

/// A tmpfs mounted at `dir` (empty: its first file gets inode 2), unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "mode=755", "none"])
                .arg(dir),
            RUN_TIMEOUT,
        )
        .ok();
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    /// Unmounted once nothing holds its files (the session's teardown child holds the
    /// traced file for a moment after the tracer exits); lazily at last.
    fn drop(&mut self) {
        for _ in 0..50 {
            let st = Command::new("umount")
                .arg(&self.0)
                .stderr(Stdio::null())
                .status();
            if st.is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Row 4 (device). Before: the files a system-wide session had looked at were
/// remembered by (path, inode number), without the device. A hostile user's program in
/// another mount namespace, from a file at the same path with the same inode number (a
/// fresh tmpfs numbers its files 2, 3, ... in creation order) but other contents, was
/// taken for the known instrumented file: its RW area was computed from that file's
/// metadata (here: where this process keeps a page of 0x5a with an RW magic), and root
/// wrote `on_full` and `attached` there. Now the cache is keyed by `(st_dev, st_ino)`
/// and the path: the second file is opened and read for itself (not instrumented),
/// and nothing is written into its process, while the known file's process was told it
/// is attached.
#[test]
fn a_file_with_a_known_files_inode_on_another_device_is_not_taken_for_it() {
    let hostile = LocalUser::hostile();
    let tmp = TempDir::new("trust-seed-dev");
    let (stage1, meta, _) = build(&tmp, &hostile);
    let image = tmp.join("image.nopie");
    compile(
        "gcc",
        &[fixture("trust_seed_image.c")],
        &["-O2", "-no-pie", "-fno-pie"],
        &image,
    );
    let mnt = tmp.join("m");
    let fs = Tmpfs::mount(&mnt);
    let prog = mnt.join("prog");
    std::fs::copy(&stage1, &prog).unwrap();
    hostile.own(&prog);
    let known = std::fs::metadata(&prog).unwrap();
    assert_eq!(known.ino(), 2, "the first file of a fresh tmpfs");

    let _g = tracing_lock();
    let trace = tmp.join("sw.utrace");
    let mut session = system_wide_session(&trace);
    // The known file, run: the session looks at it (instrumented) and tells it.
    let (mut a, a_stdin, _a_out) = started(&hostile, &prog);
    let a_rw = base_of(a.id(), known.ino()).unwrap() + meta.rw_vaddr;
    let t0 = Instant::now();
    while read_mem(a.id(), a_rw + RWH_ATTACHED, 4) != ATTACHED.to_le_bytes() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the known file not attached"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The same path and inode number in another mount namespace: another tmpfs, the
    // non-instrumented image copied first. Where the old cache put the known file's RW
    // area in it (its bias: the non-PIE image's base), it keeps a page with the magic.
    let addr = 0x40_0000 + meta.rw_vaddr;
    let script = format!(
        "mount -t tmpfs -o mode=755 none {m} && cp {img} {m}/prog && chown {u} {m}/prog && \
         exec setpriv --reuid={u} --regid={g} --clear-groups -- {m}/prog {addr:x} {RW_MAGIC:x}",
        m = mnt.display(),
        img = image.display(),
        u = hostile.uid,
        g = hostile.gid,
    );
    let mut b = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let b_stdin = b.stdin.take().unwrap();
    let mut b_out = BufReader::new(b.stdout.take().unwrap());
    expect_line(&mut b_out, "ready\n");
    let bpid = b.id();
    let b_exe = std::fs::metadata(format!("/proc/{bpid}/exe")).unwrap();
    assert_eq!(b_exe.ino(), known.ino(), "same inode number");
    assert_ne!(b_exe.dev(), known.dev(), "another device");
    let page = addr & !0xfff;
    let before = read_mem(bpid, page, 0x2000);
    // The session looks at the process again at its executable mapping: some time for it.
    std::thread::sleep(Duration::from_millis(1500));
    let after = read_mem(bpid, page, 0x2000);
    run(
        Command::new("kill").args(["-INT", &session.id().to_string()]),
        RUN_TIMEOUT,
    )
    .ok();
    let st = session.wait().unwrap();
    let err = std::fs::read_to_string(trace.with_extension("err")).unwrap();
    drop((a_stdin, b_stdin));
    let _ = (a.wait(), b.wait());
    drop(fs);
    assert!(st.success(), "session: {err}");
    let off = (addr - page) as usize;
    for (what, at) in [("on_full", RWH_ON_FULL), ("attached", RWH_ATTACHED)] {
        let i = off + at as usize;
        assert_eq!(
            after[i..i + 4],
            [0x5a; 4],
            "root wrote {what} into the other file's process: {err}"
        );
    }
    assert!(after == before, "the other process's bytes changed: {err}");
}
