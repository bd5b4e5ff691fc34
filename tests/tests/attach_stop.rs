//! `record -p PID` ended before the process (here `--duration`): what the process's
//! live threads still hold in their buffers is collected at the stop, exactly (the
//! stop drain, `record/stop_drain.rs`). The oracle is the values the program passed:
//! thread t calls serve(t << 32 | i) for i = 0, 1, 2, ... in order.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use tests::*;

const THREADS: u64 = 3;
/// Calls per thread before the server idles: fewer than a buffer holds (4096).
const N: u64 = 1000;

fn build(tmp: &TempDir) -> PathBuf {
    let (orig, traced) = (tmp.join("server"), tmp.join("server.traced"));
    compile("gcc", &[fixture("server.c")], &["-O2", "-pthread"], &orig);
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "serve".as_ref(),
    ])
    .ok();
    traced
}

/// The server, killed if the test fails before it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// The server started, its pid, and its stdout lines.
fn start(traced: &Path, dir: &Path) -> (Server, u32, Lines) {
    let mut server = Command::new(traced)
        .args([&THREADS.to_string(), &N.to_string()])
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let pid: u32 = first.strip_prefix("pid=").unwrap().parse().unwrap();
    (Server(server), pid, lines)
}

/// `tracer record -p PID --duration SECS`, once its session is set up.
fn attach(pid: u32, secs: &str, trace: &Path) -> Child {
    let tracer = Command::new(tracer_bin())
        .args(["record", "-p", &pid.to_string(), "--duration", secs, "-o"])
        .arg(trace)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_control_socket(&tracer);
    tracer
}

/// Per thread tag: the values of its serve() entries, in delivery order.
fn per_thread(trace: &Path) -> Vec<Vec<u64>> {
    let mut v = vec![Vec::new(); THREADS as usize];
    // Entries only are traced.
    for r in dump(trace).iter().filter(|r| &*r.symbol == "serve") {
        v[(r.value >> 32) as usize].push(r.value & 0xffff_ffff);
    }
    v
}

fn finish(tracer: Child) -> String {
    let out = tracer.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn buffers_of_a_running_process_are_collected_at_the_stop() {
    let tmp = TempDir::new("attach-stop");
    let traced = build(&tmp);
    let _g = tracing_lock();
    // Quiet: every call is still buffered when the session ends.
    let (mut server, pid, mut lines) = start(&traced, tmp.path());
    let trace = tmp.join("quiet.utrace");
    let tracer = attach(pid, "2", &trace);
    std::fs::write(tmp.join("go"), "").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "called");
    let err = finish(tracer);
    for (t, vals) in per_thread(&trace).iter().enumerate() {
        assert_eq!(*vals, (0..N).collect::<Vec<_>>(), "thread {t}: {err}");
    }
    let books = &report_json(&trace)["books"];
    assert_eq!(books["balanced"], true, "{books}");
    assert_eq!(books["delivered"], THREADS * N, "{books}");
    assert_eq!(
        books["at_stop"],
        THREADS * N,
        "every one collected at the stop: {books}"
    );
    // Busy: threads call on while the session ends (flushes, then the stop drain);
    // each thread's values run on without a gap or a repeat.
    let trace = tmp.join("busy.utrace");
    std::fs::write(tmp.join("busy"), "").unwrap();
    let tracer = attach(pid, "2", &trace);
    let err = finish(tracer);
    std::fs::write(tmp.join("stop"), "").unwrap();
    let counts: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(server.0.wait().unwrap().success());
    for (t, vals) in per_thread(&trace).iter().enumerate() {
        assert!(
            vals.len() > 4096,
            "thread {t}: {} records: {err}",
            vals.len()
        );
        let first = vals[0];
        let expect: Vec<u64> = (first..first + vals.len() as u64).collect();
        assert!(
            *vals == expect,
            "thread {t}: values with a gap or a repeat ({counts:?})"
        );
    }
    let books = &report_json(&trace)["books"];
    assert_eq!(books["balanced"], true, "{books}");
}
