//! Symbolized traces: C++ and Rust programs (built here) rewritten with demangled
//! function globs, traced, and reported with readable names, the right file:line per
//! function and per call site, and inlined frames; debug information found in the
//! binary, by `.gnu_debuglink`, by build-id under `--debug-dir`, and in the tracer's
//! cache after the binary is gone.

use std::{collections::HashMap, ffi::OsStr, path::Path, process::Command};

use tests::*;

const N: u64 = 50;

/// Calls per function name from `calls.functions` of a report, with their locations.
fn calls_of(v: &serde_json::Value) -> HashMap<String, (u64, String)> {
    v["calls"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["function"].as_str().unwrap().to_string(),
                (
                    f["calls"].as_u64().unwrap(),
                    f["location"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

fn report_with(trace: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Out {
    let mut c = Command::new(tracer_bin());
    c.arg("report").arg(trace).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c, TRACE_TIMEOUT).ok()
}

fn report_json_with(trace: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> serde_json::Value {
    let mut args = args.to_vec();
    args.push("--json".as_ref());
    let out = report_with(trace, &args, env);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.describe()))
}

/// The C++ fixture's functions: (demangled name, calls in `names N`, tag of its line).
fn cpp_expected() -> Vec<(&'static str, u64, u32)> {
    let l = |t| tagged_line("names.cpp", t);
    vec![
        ("shapes::Box<int>::grow(int)", N, l("grow")),
        ("shapes::Box<double>::grow(double)", N, l("grow")),
        ("shapes::area(int, int)", N, l("area_int")),
        ("shapes::area(double, double)", N, l("area_double")),
        ("shapes::count(int*, int)", 1, l("count")),
        ("main", 1, l("main")),
    ]
}

fn check_cpp_calls(v: &serde_json::Value) {
    let calls = calls_of(v);
    for (name, n, line) in cpp_expected() {
        assert_eq!(
            calls.get(name),
            Some(&(n, format!("names.cpp:{line}"))),
            "{name} in {calls:?}"
        );
    }
    assert_eq!(calls.len(), cpp_expected().len(), "{calls:?}");
}

/// The exit record of `shapes::count` among the `--last` records of a report.
fn exit_of_count(v: &serde_json::Value) -> &serde_json::Value {
    let last = v["last"][0]["records"].as_array().unwrap();
    last.iter()
        .find(|r| r["kind"] == "exit" && r["symbol"] == "_ZN6shapes5countEPii")
        .unwrap_or_else(|| panic!("no exit of count in {last:?}"))
}

fn build_cpp(tmp: &TempDir, flags: &[&str]) -> std::path::PathBuf {
    let orig = tmp.join("names");
    let mut all = vec!["-g", "-O2"];
    all.extend(flags);
    compile("g++", &[fixture("names.cpp")], &all, &orig);
    orig
}

/// `rewriter ORIG -o TRACED --sites SITES --functions F...`.
fn rewrite_with(orig: &Path, traced: &Path, sites: &str, functions: &[&str]) {
    let mut args: Vec<&OsStr> = vec![
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--sites".as_ref(),
        sites.as_ref(),
    ];
    for f in functions {
        args.extend(["--functions".as_ref(), OsStr::new(f)]);
    }
    rewriter(&args).ok();
}

/// Rewrite with demangled globs (`shapes::*` matches `_ZN6shapes...`).
fn rewrite_cpp(orig: &Path, traced: &Path) {
    rewrite_with(orig, traced, "entry,exit,memory", &["shapes::*", "main"]);
}

#[test]
fn cpp_names_lines_and_inlined_frames() {
    let tmp = TempDir::new("sym-cpp");
    let orig = build_cpp(&tmp, &[]);
    let traced = tmp.join("names.traced");
    rewrite_cpp(&orig, &traced);
    let trace = tmp.join("t.utrace");
    let out = tracer_record(&trace, &traced, &[&N.to_string()], &[]);
    assert_eq!(out.status(), 0, "{}", out.describe());

    let v = report_json_with(&trace, &["--last".as_ref(), "3".as_ref()], &[]);
    check_cpp_calls(&v);
    assert_eq!(
        v["binaries"][0]["debug"]["how"], "binary",
        "{}",
        v["binaries"]
    );

    // The inlined helper's memory accesses: inside `count`, each done N times.
    let touch = tagged_line("names.cpp", "touch");
    let count = tagged_line("names.cpp", "count");
    let inlined: Vec<&serde_json::Value> = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["kind"] == "memory" && f["frames"][0]["function"] == "shapes::detail::touch(int*)"
        })
        .collect();
    assert!(!inlined.is_empty(), "{}", v["functions"]);
    for f in &inlined {
        let frames = f["frames"].as_array().unwrap();
        assert_eq!(frames.len(), 2, "{f}");
        assert_eq!(frames[0]["line"], touch, "{f}");
        assert_eq!(frames[0]["inlined"], true, "{f}");
        assert_eq!(frames[1]["function"], "shapes::count(int*, int)", "{f}");
        assert_eq!(frames[1]["line"], count, "{f}");
        assert_eq!(f["count"], N, "{f}");
        assert_eq!(f["location"], format!("names.cpp:{touch}"), "{f}");
    }
    // Entry sites only in the functions the demangled globs chose.
    let mut chosen: Vec<&str> = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "entry")
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    chosen.sort();
    let mut want: Vec<&str> = cpp_expected().iter().map(|e| e.0).collect();
    want.sort();
    assert_eq!(chosen, want);

    // A return address symbolized: `count` returns to main's line that calls it.
    let call_line = tagged_line("names.cpp", "call_count");
    let exit = exit_of_count(&v);
    assert_eq!(
        exit["at"],
        format!("shapes::count(int*, int) (names.cpp:{count})")
    );
    assert_eq!(exit["other"], format!("main (names.cpp:{call_line})"));

    // The text report says the same.
    let text = report_with(&trace, &[], &[]).stdout_str();
    let area = tagged_line("names.cpp", "area_double");
    for want in [
        format!("shapes::area(double, double) (names.traced, names.cpp:{area})"),
        format!(
            "shapes::detail::touch(int*) (names.cpp:{touch}) inlined in shapes::count(int*, int) (names.cpp:{count})"
        ),
    ] {
        assert!(text.contains(&want), "{want:?} not in\n{text}");
    }

    // The Perfetto export carries names and source locations (read by Perfetto's protos).
    let pf = tmp.join("t.pftrace");
    run(
        Command::new(tracer_bin())
            .arg("export")
            .arg(&trace)
            .args(["--format", "perfetto", "-o"])
            .arg(&pf),
        TRACE_TIMEOUT,
    )
    .ok();
    let s = perfetto_summary(&pf);
    let slices: Vec<&serde_json::Value> = s["slices"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|v| v.as_array().unwrap())
        .collect();
    for (name, n, line) in cpp_expected() {
        let of: Vec<&&serde_json::Value> = slices.iter().filter(|x| x["name"] == name).collect();
        assert_eq!(of.len() as u64, n, "slices of {name}");
        for x in of {
            assert_eq!(x["location"]["line"], line, "{x}");
            assert!(
                x["location"]["file"]
                    .as_str()
                    .unwrap()
                    .ends_with("/names.cpp"),
                "{x}"
            );
        }
    }
}

#[test]
fn rust_names_and_lines() {
    let tmp = TempDir::new("sym-rust");
    let orig = tmp.join("names");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    run(
        Command::new(rustc)
            .args(["--edition", "2021", "-C", "opt-level=2", "-g"])
            .args(["-C", "symbol-mangling-version=v0", "-o"])
            .arg(&orig)
            .arg(fixture("names.rs")),
        RUN_TIMEOUT,
    )
    .ok();
    let traced = tmp.join("names.traced");
    // Demangled globs: v0 symbols `_RNv...` matched as `names::*` and `<names::*`.
    rewrite_with(&orig, &traced, "entry,exit", &["names::*", "<names::*"]);
    let trace = tmp.join("t.utrace");
    let out = tracer_record(&trace, &traced, &[&N.to_string()], &[]);
    assert_eq!(out.status(), 0, "{}", out.describe());
    let v = report_json_with(&trace, &["--last".as_ref(), "3".as_ref()], &[]);
    let calls = calls_of(&v);
    let l = |t| tagged_line("names.rs", t);
    for (name, n, line) in [
        (
            "<names::shapes::Circle as names::shapes::Area>::area",
            N * N,
            l("circle_area"),
        ),
        (
            "names::shapes::total::<names::shapes::Circle>",
            N,
            l("total"),
        ),
    ] {
        assert_eq!(
            calls.get(name),
            Some(&(n, format!("names.rs:{line}"))),
            "{name} in {calls:?}"
        );
    }
    assert_eq!(calls.get("names::main").map(|c| c.0), Some(1), "{calls:?}");
    for name in calls.keys() {
        assert!(
            name.starts_with("names::") || name.starts_with("<names::"),
            "{name}"
        );
    }
    // `total` returns into main's loop, on the line that calls it.
    let last = v["last"][0]["records"].as_array().unwrap();
    let exit = last
        .iter()
        .find(|r| {
            r["kind"] == "exit"
                && r["at"]
                    .as_str()
                    .unwrap()
                    .starts_with("names::shapes::total")
        })
        .unwrap_or_else(|| panic!("no exit of total in {last:?}"));
    assert_eq!(
        exit["other"],
        format!("names::main (names.rs:{})", l("call_total")),
        "{exit}"
    );
}

#[test]
fn debug_files_by_debuglink_build_id_and_cache() {
    let tmp = TempDir::new("sym-debug");
    let full = build_cpp(&tmp, &[]);
    let debug = tmp.join("names.debug");
    let stripped = tmp.join("names.stripped");
    let objcopy = |args: &[&OsStr]| run(Command::new("objcopy").args(args), RUN_TIMEOUT).ok();
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
    let traced = tmp.join("names.traced");
    rewrite_cpp(&stripped, &traced);
    let trace = tmp.join("t.utrace");
    let cache = tmp.join("cache");
    let out = tracer_record(
        &trace,
        &traced,
        &[&N.to_string()],
        &[("UTRACE_DEBUG_CACHE", cache.as_os_str())],
    );
    assert_eq!(out.status(), 0, "{}", out.describe());
    let no_cache: &[(&str, &OsStr)] = &[("UTRACE_DEBUG_CACHE", "".as_ref())];
    let how = |v: &serde_json::Value| {
        v["binaries"][0]["debug"]["how"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    };

    // 1. The stripped binary's .gnu_debuglink names the debug file next to it.
    let v = report_json_with(&trace, &[], no_cache);
    assert_eq!(how(&v), "debuglink", "{}", v["binaries"]);
    check_cpp_calls(&v);

    // 2. By build-id under --debug-dir (the debuglink file gone).
    let build_id = v["binaries"][0]["build_id"].as_str().unwrap().to_string();
    let dir = tmp.join("dbg/.build-id").join(&build_id[..2]);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::rename(&debug, dir.join(format!("{}.debug", &build_id[2..]))).unwrap();
    let dbg = tmp.join("dbg");
    let v = report_json_with(&trace, &["--debug-dir".as_ref(), dbg.as_os_str()], no_cache);
    assert_eq!(how(&v), "build-id", "{}", v["binaries"]);
    check_cpp_calls(&v);

    // 3. Nothing but the symbol table: names, no lines. A FIFO where the debuglink
    //    points is not read (it would block): only regular files are.
    let fifo = std::ffi::CString::new(debug.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let v = report_json_with(&trace, &[], no_cache);
    assert_eq!(how(&v), "symbols", "{}", v["binaries"]);
    let calls = calls_of(&v);
    assert_eq!(
        calls.get("shapes::area(int, int)"),
        Some(&(N, String::new())),
        "{calls:?}"
    );

    // 4. The session cached the debug file (under the build-id) it found by debuglink:
    //    the report still has lines after the binary is replaced by another one.
    let cached = cache
        .join(".build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..]));
    assert!(cached.is_file(), "{} not cached", cached.display());
    std::fs::remove_dir_all(tmp.join("dbg")).unwrap();
    std::fs::copy("/bin/true", &traced).unwrap();
    let with_cache: &[(&str, &OsStr)] = &[("UTRACE_DEBUG_CACHE", cache.as_os_str())];
    let out = report_with(
        &trace,
        &["--json".as_ref(), "--last".as_ref(), "3".as_ref()],
        with_cache,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(how(&v), "cache", "{}", v["binaries"]);
    check_cpp_calls(&v);
    // Return addresses too: the code ranges come from the cached file, not from
    // whatever is at the path now.
    let exit = exit_of_count(&v);
    assert_eq!(
        exit["other"],
        format!(
            "main (names.cpp:{})",
            tagged_line("names.cpp", "call_count")
        )
    );
    assert!(
        out.stderr_str().contains("build-id differs"),
        "{}",
        out.describe()
    );
}

#[test]
fn callers_in_a_static_pie_program_and_its_forked_child() {
    let tmp = TempDir::new("sym-callers");
    let orig = tmp.join("callers");
    compile(
        "gcc",
        &[fixture("callers.c")],
        &["-g", "-O2", "-static-pie"],
        &orig,
    );
    let traced = tmp.join("callers.traced");
    rewrite_with(&orig, &traced, "entry,exit", &["work"]);
    let trace = tmp.join("t.utrace");
    let out = tracer_record(&trace, &traced, &["100000"], &[]);
    assert_eq!(out.status(), 0, "{}", out.describe());
    let v = report_json_with(&trace, &["--last".as_ref(), "2".as_ref()], &[]);
    let threads = v["last"].as_array().unwrap();
    let pids: std::collections::BTreeSet<u64> =
        threads.iter().map(|t| t["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 2, "the program and its child: {threads:?}");
    let want = format!(
        "burst (callers.c:{})",
        tagged_line("callers.c", "call_work")
    );
    for t in threads {
        let recs = t["records"].as_array().unwrap();
        assert_eq!(recs.len(), 2, "{t}");
        for r in recs {
            assert_eq!(r["other"], want.as_str(), "pid {}: {r}", t["pid"]);
            assert!(
                r["at"].as_str().unwrap().starts_with("work (callers.c:"),
                "{r}"
            );
        }
    }
    // The child ran to its end (its first flush used to crash it: see the flush
    // function's 4-byte NOP), and each process delivered exactly its own calls (not
    // the parent's still buffered at the fork, copied with its memory).
    let sum = (0..100_000i64).map(|i| i * 7 + 1).sum::<i64>().to_string();
    assert_eq!(
        out.stdout_str().lines().filter(|l| *l == sum).count(),
        2,
        "{}",
        out.describe()
    );
    for t in v["threads"].as_array().unwrap() {
        assert_eq!(t["calls"].as_u64().unwrap(), 100_001, "{t}");
    }
    assert_eq!(v["dropped"], 0);
}
