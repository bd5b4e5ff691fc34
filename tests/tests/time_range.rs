//! `--since/--until` of `dump`, `report`, `export` and `flamegraph`, checked against the
//! full trace of the same run (tests/fixtures/diff_runs.c, 1,000,000 calls of fa(), then
//! fb() and fc()): the window is the middle third of the records' times, as absolute
//! CLOCK_MONOTONIC ns (`@NS`). `dump` prints exactly the full dump's lines inside the
//! window, and leaves sections of chunks outside it undecoded (its debug log says how
//! many, and how many the file's index let it pass over unread; the same file without
//! its index reads the same); `report` counts exactly those per site; Parquet's records table (read by
//! DuckDB) holds as many rows; the flame graph's fa() time is the sum of the fa() calls
//! that begin and end inside it. Relative bounds: from 0 s every record, from 1000 s none.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::process::Command;

use tests::*;

fn tracer(args: &[&OsStr]) -> Out {
    run(Command::new(tracer_bin()).args(args), TRACE_TIMEOUT)
}

/// The fields of a dump line (tab separated).
fn fields(line: &str) -> Vec<&str> {
    line.split('\t').collect()
}

/// `tracer dump TRACE RANGE...` with its debug log on stderr.
fn dump_with_log(trace: &OsStr, range: &[&OsStr]) -> Out {
    let mut c = Command::new(tracer_bin());
    c.arg("dump")
        .arg(trace)
        .args(range)
        .env("RUST_LOG", "debug");
    run(&mut c, TRACE_TIMEOUT).ok()
}

#[test]
fn a_time_range_reads_exactly_the_records_inside_it() {
    let tmp = TempDir::new("time-range");
    let (orig, traced, meta) = diff_runs_traced(tmp.path());
    let trace = tmp.join("t.utrace");
    let run_args = ["1000000", "300", "300"];
    let want = run(Command::new(&orig).args(run_args), RUN_TIMEOUT).ok();
    let got = tracer_record(&trace, &traced, &run_args, &[]);
    assert_eq!((got.stdout_str(), got.status()), (want.stdout_str(), 0));

    let t = trace.as_os_str();
    let full = tracer(&["dump".as_ref(), t]).ok().stdout_str();
    let lines: Vec<&str> = full.lines().collect();
    let time = |l: &str| -> u64 { fields(l)[7].parse().unwrap() };
    let mut times: Vec<u64> = lines.iter().map(|l| time(l)).collect();
    times.sort_unstable();
    assert!(times.len() > 2_000_000, "{} records", times.len());
    let (lo, hi) = (times[times.len() / 3], times[2 * times.len() / 3]);
    assert!(lo < hi, "no spread in time: {lo}");
    let inside: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| (lo..hi).contains(&time(l)))
        .collect();
    let (since, until) = (format!("@{lo}"), format!("@{hi}"));
    let range: [&OsStr; 4] = [
        "--since".as_ref(),
        since.as_ref(),
        "--until".as_ref(),
        until.as_ref(),
    ];

    let cut = dump_with_log(t, &range);
    assert_eq!(
        cut.stdout_str().lines().collect::<Vec<_>>(),
        inside,
        "dump of the range"
    );
    let skipped: u64 = cut
        .stderr_str()
        .lines()
        .find_map(|l| {
            l.split(" chunks outside the range not decoded")
                .next()?
                .rsplit(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no count of chunks not decoded: {}", cut.describe()));
    assert!(skipped > 0, "every chunk decoded: {}", cut.describe());
    let unread = |o: &Out| -> u64 {
        o.stderr_str()
            .lines()
            .find_map(|l| {
                l.split(" of them passed over unread by the file's index")
                    .next()?
                    .rsplit(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no count of chunks unread: {}", o.describe()))
    };
    assert!(
        unread(&cut) > 0,
        "the index passed nothing over: {}",
        cut.describe()
    );

    // The same trace without its index (the file cut where the index begins, as its
    // trailer says) reads the same: the range, and the whole report.
    let bytes = std::fs::read(&trace).unwrap();
    assert_eq!(&bytes[bytes.len() - 8..], b"UTRCINDX", "no index trailer");
    let at = u64::from_le_bytes(
        bytes[bytes.len() - 24..bytes.len() - 16]
            .try_into()
            .unwrap(),
    );
    let plain = tmp.join("plain.utrace");
    std::fs::write(&plain, &bytes[..at as usize]).unwrap();
    let cut_plain = dump_with_log(plain.as_os_str(), &range);
    assert_eq!(
        cut_plain.stdout_str(),
        cut.stdout_str(),
        "dump of the range without the index"
    );
    assert_eq!(unread(&cut_plain), 0, "{}", cut_plain.describe());
    let report = |p: &std::path::Path| {
        tracer(&["report".as_ref(), "--json".as_ref(), p.as_os_str()])
            .ok()
            .stdout_str()
    };
    assert_eq!(
        report(&plain).replace("plain.utrace", "t.utrace"),
        report(&trace),
        "report without the index"
    );

    let mut a: Vec<&OsStr> = vec!["report".as_ref(), "--json".as_ref(), t];
    a.extend(range);
    let v: serde_json::Value = serde_json::from_slice(&tracer(&a).ok().stdout).unwrap();
    assert_eq!(v["records"].as_u64(), Some(inside.len() as u64), "report");
    let mut per_site: HashMap<u64, u64> = HashMap::new();
    for l in &inside {
        *per_site.entry(fields(l)[3].parse().unwrap()).or_default() += 1;
    }
    let reported: HashMap<u64, u64> = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["site"].as_u64().unwrap(), f["count"].as_u64().unwrap()))
        .filter(|&(_, n)| n > 0)
        .collect();
    assert_eq!(reported, per_site, "report: records per site");

    let pq = tmp.join("pq");
    let mut a: Vec<&OsStr> = vec![
        "export".as_ref(),
        "--format".as_ref(),
        "parquet".as_ref(),
        t,
        "-o".as_ref(),
        pq.as_os_str(),
    ];
    a.extend(range);
    tracer(&a).ok();
    let rows = duckdb_rows(&format!(
        "select count(*) from '{}'",
        pq.join("records.parquet").display()
    ));
    assert_eq!(
        rows[0][0].as_u64(),
        Some(inside.len() as u64),
        "parquet rows"
    );

    // fa() calls wholly inside: each call's time its exit's minus its entry's (fa is a
    // leaf, and one thread runs).
    let kind: HashMap<u32, (&str, bool)> = meta
        .sites
        .iter()
        .map(|s| {
            let entry = s.kind == tracer_common::meta::SiteKind::FunctionEntry;
            (s.id, (s.name.as_str(), entry))
        })
        .collect();
    let (mut open, mut fa_ns) = (None, 0u64);
    for l in &inside {
        let f = fields(l);
        match kind[&f[3].parse::<u32>().unwrap()] {
            ("fa", true) => open = Some(time(l)),
            ("fa", false) => fa_ns += open.take().map_or(0, |t0| time(l) - t0),
            _ => {}
        }
    }
    let svg = tmp.join("fg.svg");
    let mut a: Vec<&OsStr> = vec!["flamegraph".as_ref(), t, "-o".as_ref(), svg.as_os_str()];
    a.extend(range);
    tracer(&a).ok();
    let frames = flamegraph_frames(&std::fs::read_to_string(&svg).unwrap());
    let drawn: u64 = frames
        .iter()
        .filter(|(name, _)| name == "fa")
        .map(|f| f.1)
        .sum();
    assert!(fa_ns > 0);
    assert_eq!(
        drawn, fa_ns,
        "flame graph: fa's time in the range ({frames:?})"
    );

    // Relative bounds, from the session's start.
    let dump_since = |s: &str| {
        tracer(&["dump".as_ref(), t, "--since".as_ref(), s.as_ref()])
            .ok()
            .stdout_str()
    };
    assert_eq!(dump_since("0"), full, "from the start");
    assert_eq!(dump_since("1000s"), "", "from 1000 s on");
    let bad = tracer(&["dump".as_ref(), t, "--since".as_ref(), "1.5m".as_ref()]);
    assert_ne!(bad.code, Some(0), "{}", bad.describe());
    assert!(bad.stderr_str().contains("1.5m"), "{}", bad.describe());
}
