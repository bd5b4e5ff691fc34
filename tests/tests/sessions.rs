//! Sessions beyond one command: in-kernel filters (set at the start and changed while
//! the session runs), exact books under a flood, system-wide sessions, two sessions at
//! once, and libraries loaded with dlopen.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tests::*;

/// The fixture built and rewritten (hot and cold traced), with `extra` rewriter flags.
fn build(tmp: &TempDir, extra: &[&str]) -> PathBuf {
    let (orig, traced) = (tmp.join("sessions"), tmp.join("sessions.traced"));
    compile(
        "gcc",
        &[fixture("sessions.c")],
        &["-O2", "-pthread", "-ldl"],
        &orig,
    );
    let mut args: Vec<&std::ffi::OsStr> = vec![
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "hot".as_ref(),
        "--functions".as_ref(),
        "cold".as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    rewriter(&args).ok();
    traced
}

fn record(trace: &Path, flags: &[&str], prog: &Path, args: &[&str]) -> Out {
    tracer_record_with(flags, trace, prog, args, &[])
}

/// `books` of `tracer report --json`.
fn books(trace: &Path) -> serde_json::Value {
    report_json(trace)["books"].clone()
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// Every record of `pid` (or all when None), by symbol: values in delivery order.
fn values(recs: &[Rec], pid: Option<u32>, symbol: &str) -> Vec<u64> {
    recs.iter()
        .filter(|r| pid.is_none_or(|p| r.pid == p) && &*r.symbol == symbol)
        .map(|r| r.value)
        .collect()
}

/// What `sessions count T N` calls: per thread t, hot(t<<32|i) for i < N and
/// cold(t<<32|i) for i % 10 == 0; sorted.
fn expected(t: u64, n: u64, symbol: &str) -> Vec<u64> {
    let mut v: Vec<u64> = (0..t)
        .flat_map(|t| {
            (0..n)
                .filter(move |i| symbol == "hot" || i % 10 == 0)
                .map(move |i| (t << 32) | i)
        })
        .collect();
    v.sort_unstable();
    v
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn filters_in_the_kernel() {
    let tmp = TempDir::new("filters");
    let traced = build(&tmp, &[]);
    let (t, calls) = (2u64, 3000u64);
    let all = t * calls + t * calls / 10; // hot, and cold every 10th call
    type Keep = Box<dyn Fn(&str, u64) -> bool>;
    let cases: [(&[&str], Keep); 5] = [
        (&["--functions", "cold"], Box::new(|s, _| s == "cold")),
        (&["--filter-value", "0..99"], Box::new(|_, v| v <= 99)),
        (
            &[
                "--functions",
                "hot",
                "--filter-value",
                "0x100000000..0x1000000ff",
            ],
            Box::new(|s, v| s == "hot" && (0x1_0000_0000..=0x1_0000_00ff).contains(&v)),
        ),
        (&["--filter-comm", "nomatch"], Box::new(|_, _| false)),
        (&["--filter-comm", "sessions.*"], Box::new(|_, _| true)),
    ];
    for (i, (flags, keep)) in cases.iter().enumerate() {
        let trace = tmp.join(format!("f{i}.utrace"));
        let out = record(&trace, flags, &traced, &["count", "2", "3000"]);
        assert_eq!(out.status(), 0, "{flags:?}: {}", out.describe());
        let recs = dump(&trace);
        for sym in ["hot", "cold"] {
            let want: Vec<u64> = expected(t, calls, sym)
                .into_iter()
                .filter(|&v| keep(sym, v))
                .collect();
            assert_seq_eq(
                &sorted(values(&recs, None, sym)),
                &want,
                &format!("{flags:?} {sym}"),
            );
        }
        let b = books(&trace);
        assert_eq!(n(&b, "produced"), all, "{flags:?}: {b}");
        assert_eq!(n(&b, "delivered"), recs.len() as u64, "{flags:?}: {b}");
        assert_eq!(n(&b, "filtered"), all - recs.len() as u64, "{flags:?}: {b}");
        assert_eq!(n(&b, "dropped"), 0, "{flags:?}: {b}");
        assert_eq!(b["balanced"], true, "{flags:?}: {b}");
    }
    // The per-thread tests that pass everything here, or nothing.
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let cgroup = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("cgroup v2");
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() }.to_string();
    let ours = ["--filter-uid", uid.as_str(), "--filter-cgroup", cgroup];
    let others = [
        "--filter-uid",
        "54321",
        "--filter-pid",
        "1",
        "--filter-tid",
        "1",
    ];
    for (flags, kept) in [(&ours[..], all), (&others[..], 0)] {
        let trace = tmp.join("ids.utrace");
        let _ = std::fs::remove_file(&trace);
        let out = record(&trace, flags, &traced, &["count", "2", "3000"]);
        assert_eq!(out.status(), 0, "{flags:?}: {}", out.describe());
        let b = books(&trace);
        assert_eq!(
            (n(&b, "produced"), n(&b, "delivered"), n(&b, "filtered")),
            (all, kept, all - kept),
            "{flags:?}: {b}"
        );
        assert_eq!(dump(&trace).len() as u64, kept, "{flags:?}");
    }
    // Sampling: 1 in 3 per CPU, so the count is within one of a third per CPU.
    let trace = tmp.join("sample.utrace");
    record(&trace, &["--sample", "3"], &traced, &["count", "2", "3000"]).ok();
    let recs = dump(&trace);
    let b = books(&trace);
    assert_eq!(n(&b, "produced"), all);
    assert_eq!(n(&b, "delivered") + n(&b, "filtered"), all, "{b}");
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get()) as u64;
    assert!(
        (recs.len() as u64).abs_diff(all / 3) <= cpus,
        "{} of {all} records kept with --sample 3",
        recs.len()
    );
    // Threads carry their names.
    let v = report_json(&trace);
    for th in v["threads"].as_array().unwrap() {
        assert_eq!(th["comm"], "sessions.traced", "{th}");
    }
}

/// A memory pair (two accesses, sites `s` and `s + 1`, one record) is kept or dropped
/// whole by the in-kernel filters: kept when either site is selected or either address
/// is in the value range. The pairs are written by the fixture itself into its buffer
/// (`fixtures/pairs.c`), where an access run's stub will write them.
#[test]
fn memory_pairs_are_filtered_whole() {
    use tracer_common::{FLAG_MEM_READ, FLAG_MEM_SIZE_SHIFT, FLAG_MEM_WRITE, pair_flags};
    let tmp = TempDir::new("pairfilter");
    tests::own_slot::check_layout_header();
    let (orig, traced) = (tmp.join("pairs"), tmp.join("pairs.traced"));
    compile("gcc", &[fixture("pairs.c")], &["-O2"], &orig);
    let mut args: Vec<&std::ffi::OsStr> = vec![orig.as_os_str(), "-o".as_ref()];
    args.push(traced.as_os_str());
    for a in [
        "--sites",
        "memory",
        "--functions",
        "rec",
        "--functions",
        "other",
    ] {
        args.push(a.as_ref());
    }
    rewriter(&args).ok();
    let meta = metadata(&traced);
    // Two neighbouring memory sites of the two functions.
    let s = meta
        .sites
        .windows(2)
        .find(|w| w[0].name != w[1].name && w[1].id == w[0].id + 1)
        .map(|w| w[0].clone())
        .expect("memory sites of rec and other, one after the other");
    let (first, second) = (&*s.name, &*meta.sites[s.id as usize + 1].name);
    let mem = |rw: u32| rw | 8 << FLAG_MEM_SIZE_SHIFT;
    let flags = pair_flags(mem(FLAG_MEM_READ), mem(FLAG_MEM_WRITE)).unwrap();
    let (flush, site, flags) = (
        format!("{:x}", meta.flush_vaddr),
        s.id.to_string(),
        flags.to_string(),
    );
    let (a, b) = (0xa000_0000u64, 0xb000_0000u64);
    // (filter, pairs kept, single records kept): 10 pairs, one single per function.
    let cases: [(&[&str], u64, u64); 5] = [
        (&[], 10, 2),
        (&["--functions", second], 10, 1),
        (&["--functions", first], 10, 1),
        (&["--filter-value", "0xb0000000..0xb0000004"], 5, 0),
        (&["--filter-value", "0xa0000000..0xa0000002"], 3, 0),
    ];
    for (i, (filter, pairs, singles)) in cases.into_iter().enumerate() {
        let trace = tmp.join(format!("p{i}.utrace"));
        let out = record(&trace, filter, &traced, &[&flush, &site, &flags, "10"]);
        assert_eq!(out.status(), 0, "{filter:?}: {}", out.describe());
        let recs = dump(&trace);
        let b_ = books(&trace);
        assert_eq!(n(&b_, "produced"), 12, "{filter:?}: {b_}");
        assert_eq!(n(&b_, "delivered"), pairs + singles, "{filter:?}: {b_}");
        assert_eq!(n(&b_, "filtered"), 12 - pairs - singles, "{filter:?}: {b_}");
        // Each pair reads as its two accesses, in order, whole.
        let got: Vec<(u32, u64)> = recs
            .iter()
            .filter(|r| (a..a + 10).contains(&r.value) || (b..b + 10).contains(&r.value))
            .map(|r| (r.site, r.value))
            .collect();
        let kept: Vec<u64> = match filter.last() {
            Some(&"0xb0000000..0xb0000004") => (0..5).collect(),
            Some(&"0xa0000000..0xa0000002") => (0..3).collect(),
            _ => (0..10).collect(),
        };
        let want: Vec<(u32, u64)> = kept
            .iter()
            .flat_map(|&k| [(s.id, a + k), (s.id + 1, b + k)])
            .collect();
        assert_eq!(got, want, "{filter:?}");
        assert_eq!(recs.len() as u64, 2 * pairs + singles, "{filter:?}");
        let j = report_json(&trace);
        assert_eq!(j["records"], pairs + singles, "{filter:?}");
        assert_eq!(j["accesses"], 2 * pairs + singles, "{filter:?}");
    }
}

#[test]
fn filter_changed_while_the_session_runs() {
    let tmp = TempDir::new("livefilter");
    // 64-record buffers and 640 calls: phase 1 ends exactly at a flush, so no phase-1
    // record is still buffered when the filter changes.
    let traced = build(&tmp, &["--buffer-records", "64"]);
    let (trace, go) = (tmp.join("t.utrace"), tmp.join("go"));
    let _g = tracing_lock();
    let mut tracer = Command::new(tracer_bin())
        .args(["record", "--functions", "hot", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&traced)
        .args(["phases", "640"])
        .arg(&go)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(tracer.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "phase1");
    wait_for_control_socket(&tracer);
    let out = run(
        Command::new(tracer_bin()).args([
            "filter",
            "--session",
            &tracer.id().to_string(),
            "--functions",
            "cold",
        ]),
        RUN_TIMEOUT,
    )
    .ok();
    assert!(
        out.stdout_str().contains("1 sites matched"),
        "{}",
        out.describe()
    );
    std::fs::write(&go, "").unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert!(tracer.wait().unwrap().success());
    let recs = dump(&trace);
    let got: Vec<(String, u64)> = recs
        .iter()
        .map(|r| (r.symbol.to_string(), r.value))
        .collect();
    let want: Vec<(String, u64)> = (0..640)
        .map(|i| ("hot".to_string(), i))
        .chain((0..640).map(|i| ("cold".to_string(), i)))
        .collect();
    assert_eq!(got, want, "hot before the change, cold after it");
    let b = books(&trace);
    assert_eq!(
        (n(&b, "produced"), n(&b, "delivered"), n(&b, "filtered")),
        (1920, 1280, 640),
        "{b}"
    );
    assert_eq!(n(&b, "filter_changes"), 1, "{b}");
}

#[test]
fn books_balance_under_a_flood() {
    let tmp = TempDir::new("flood");
    // A flush drains 1024 records (32 KiB) at once into a 16 KiB ring: it overflows
    // however fast the consumer is.
    let traced = build(&tmp, &["--buffer-records", "1024"]);
    let trace = tmp.join("t.utrace");
    let (t, calls) = (64u64, 20_000u64);
    let out = record(
        &trace,
        &["--ring-bytes", "16K"],
        &traced,
        &["count", "64", "20000"],
    );
    assert_eq!(out.status(), 0, "{}", out.describe());
    let produced = t * calls + t * calls / 10;
    let recs = dump(&trace);
    let b = books(&trace);
    assert_eq!(
        n(&b, "produced"),
        produced,
        "every record the threads wrote: {b}"
    );
    assert_eq!(n(&b, "delivered"), recs.len() as u64, "{b}");
    assert_eq!(n(&b, "received"), recs.len() as u64, "{b}");
    assert_eq!(n(&b, "filtered"), 0, "{b}");
    assert_eq!(n(&b, "delivered") + n(&b, "dropped"), produced, "{b}");
    assert!(n(&b, "dropped") > 0, "a 16 KiB ring must overflow: {b}");
    let per_cpu: u64 = b["dropped_per_cpu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(per_cpu, n(&b, "dropped"), "{b}");
    assert_eq!(b["balanced"], true, "{b}");
    // What was delivered is genuine: each thread's values rise, none twice.
    let mut last: std::collections::HashMap<(u32, u64), u64> = Default::default();
    for r in recs.iter().filter(|r| &*r.symbol == "hot") {
        let (tag, i) = (r.value >> 32, r.value & 0xffff_ffff);
        assert!(tag < t && i < calls, "{r:?}");
        if let Some(&prev) = last.get(&(r.tid, tag)) {
            assert!(i > prev, "thread {} value {i} after {prev}", r.tid);
        }
        last.insert((r.tid, tag), i);
    }
}

#[test]
fn system_wide_and_a_second_session_at_once() {
    let tmp = TempDir::new("systemwide");
    let traced = build(&tmp, &[]);
    let (sw, one, go) = (
        tmp.join("sw.utrace"),
        tmp.join("one.utrace"),
        tmp.join("go"),
    );
    let _g = tracing_lock();
    // A: running before the system-wide session starts (waits for `go`).
    let a = Command::new(&traced)
        .args(["count", "2", "5000"])
        .arg(&go)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let sw_session = start_session(&["--system-wide", "--duration", "8"], &sw);
    std::fs::write(&go, "").unwrap();
    // B: started later, by nobody's session in particular.
    let b = Command::new(&traced)
        .args(["count", "3", "4000"])
        .arg(&go)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // C: a second session on one command, at the same time (not `record`: it takes
    // the tracing lock, which this test holds).
    let c = run(
        Command::new(tracer_bin())
            .arg("record")
            .arg("-o")
            .arg(&one)
            .arg("--")
            .arg(&traced)
            .args(["count", "1", "7000"]),
        TRACE_TIMEOUT,
    );
    assert_eq!(c.status(), 0, "{}", c.describe());
    let (a_pid, b_pid) = (a.id(), b.id());
    for (mut p, what) in [(a, "A"), (b, "B")] {
        assert!(p.wait().unwrap().success(), "{what}");
    }
    finish_session(sw_session, "system-wide session");

    // The single-command session has its command's records and nothing else.
    let recs_one = dump(&one);
    let c_pid = recs_one.first().expect("records of C").pid;
    assert!(recs_one.iter().all(|r| r.pid == c_pid));
    for sym in ["hot", "cold"] {
        assert_seq_eq(
            &sorted(values(&recs_one, None, sym)),
            &expected(1, 7000, sym),
            &format!("C {sym} in its own session"),
        );
    }
    // The system-wide one has all three, exactly.
    let recs = dump(&sw);
    for (pid, t, calls, what) in [
        (a_pid, 2, 5000, "A"),
        (b_pid, 3, 4000, "B"),
        (c_pid, 1, 7000, "C"),
    ] {
        for sym in ["hot", "cold"] {
            assert_seq_eq(
                &sorted(values(&recs, Some(pid), sym)),
                &expected(t, calls, sym),
                &format!("{what} {sym} system-wide"),
            );
        }
    }
    let v = report_json(&sw);
    assert_eq!(v["books"]["balanced"], true, "{}", v["books"]);
    let bins = v["binaries"].as_array().unwrap();
    assert!(
        bins.iter()
            .any(|b| b["path"].as_str().unwrap().ends_with("sessions.traced")
                && b["build_id"].as_str().unwrap().len() == 40),
        "{bins:?}"
    );
}

#[test]
fn dlopen_library_joins_the_session() {
    let tmp = TempDir::new("dlopen");
    let traced = build(&tmp, &[]);
    let (lib, lib_traced) = (tmp.join("libfx.so"), tmp.join("libfx.traced.so"));
    compile(
        "gcc",
        &[fixture("libfx.c")],
        &["-O2", "-shared", "-fPIC"],
        &lib,
    );
    rewriter(&[lib.as_os_str(), "-o".as_ref(), lib_traced.as_os_str()]).ok();
    let trace = tmp.join("t.utrace");
    let out = record(
        &trace,
        &[],
        &traced,
        &["dlopen", lib_traced.to_str().unwrap(), "300"],
    );
    assert_eq!(out.status(), 0, "{}", out.describe());
    let recs = dump(&trace);
    assert_seq_eq(
        &values(&recs, None, "fxlib_square"),
        &(0..300).collect::<Vec<u64>>(),
        "fxlib_square calls of the dlopen'ed library",
    );
    assert!(recs.iter().all(|r| &*r.binary == "libfx.traced.so"));
}

#[test]
fn untouched_binaries_by_uprobe_next_to_rewritten_ones() {
    let tmp = TempDir::new("untouched");
    let traced = build(&tmp, &[]);
    let orig = tmp.join("sessions");
    let (trace, go) = (tmp.join("t.utrace"), tmp.join("go"));
    let _g = tracing_lock();
    // A rewritten and an untouched copy of the same program, in one system-wide session
    // that adds the untouched one's hot() by uprobe.
    let spawn = |prog: &Path, t: &str, n: &str| {
        Command::new(prog)
            .args(["count", t, n])
            .arg(&go)
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut a = spawn(&traced, "2", "3000");
    let mut b = spawn(&orig, "3", "2000");
    let spec = format!("{}:hot", orig.display());
    let session = start_session(
        &["--system-wide", "--duration", "5", "--uprobe", &spec],
        &trace,
    );
    std::fs::write(&go, "").unwrap();
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    finish_session(session, "session");
    let recs = dump(&trace);
    for sym in ["hot", "cold"] {
        assert_seq_eq(
            &sorted(values(&recs, Some(a.id()), sym)),
            &expected(2, 3000, sym),
            &format!("rewritten {sym}"),
        );
    }
    assert_seq_eq(
        &sorted(values(&recs, Some(b.id()), "hot")),
        &expected(3, 2000, "hot"),
        "untouched hot (uprobe)",
    );
    assert!(values(&recs, Some(b.id()), "cold").is_empty());
    let flags = |pid: u32| {
        recs.iter()
            .filter(move |r| r.pid == pid)
            .map(|r| r.flags & FLAG_UPROBE)
    };
    assert!(flags(a.id()).all(|f| f == 0), "rewritten: inline records");
    assert!(flags(b.id()).all(|f| f != 0), "untouched: uprobe records");
}

#[test]
fn untouched_usdt_probes() {
    let tmp = TempDir::new("untouched-usdt");
    let (orig, described, trace) = (
        tmp.join("usdt"),
        tmp.join("usdt.desc"),
        tmp.join("t.utrace"),
    );
    compile("gcc", &[fixture("usdt.c")], &["-O2"], &orig);
    // The rewriter's description of the same probes, all as uprobes: what the tracer
    // builds in memory for --usdt (same sites, ids and operands).
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        described.as_os_str(),
        "--sites".as_ref(),
        "usdt".as_ref(),
        "--force-uprobe".as_ref(),
    ])
    .ok();
    let meta = metadata(&described);
    let counts = ["4", "6", "5"];
    let want = run(Command::new(&orig).args(counts), RUN_TIMEOUT).ok();
    let got = record(&trace, &["--usdt", orig.to_str().unwrap()], &orig, &counts);
    assert_eq!(got.status(), 0, "{}", got.describe());
    let text = got.stdout_str();
    // The semaphore is raised in the untouched file too: the guarded probe runs.
    let stripped: String = text
        .lines()
        .filter(|l| !l.starts_with("guarded "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(stripped, want.stdout_str());
    assert!(text.lines().any(|l| l.starts_with("guarded ")), "{text}");
    let recs = dump(&trace);
    assert!(!recs.is_empty() && recs.iter().all(|r| r.flags & FLAG_UPROBE != 0));
    let evs = tests::site_checks::usdt_events(&recs, &meta);
    tests::site_checks::check_usdt_events("untouched usdt", &evs, &text);
}
