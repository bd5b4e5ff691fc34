//! Real programs of the distribution, rewritten with every function (the default):
//! GNU `sort` (coreutils) and SQLite (`libsqlite3.so.0`, where the real code is, and the
//! `sqlite3` shell). Deterministic workloads give byte-identical stdout, stderr and exit
//! status with the original and the rewritten binaries, also under `tracer record`; and
//! the recorded entry counts of chosen functions equal the oracle's (kernel uprobes on
//! the original binaries, same workload).
//!
//! Both programs are stripped: the rewriter sees only their dynamic symbols. For `sort`
//! those are 6 exported obstack functions (reached through `--files0-from`); the
//! `sqlite3` shell exports no function at all and the rewriter refuses it, so the
//! original shell runs with the rewritten library (LD_LIBRARY_PATH).
//!
//! A missing program skips its test (with a message): they are Debian packages
//! (coreutils, sqlite3), not part of the repository.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tests::*;

const SORT: &str = "/usr/bin/sort";
const SQLITE3: &str = "/usr/bin/sqlite3";
const LIBSQLITE3: &str = "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0";

/// Coverage floors, measured when the test was written (sort: 6 sites, all inline;
/// libsqlite3 3.40.1: 1370 sites, all inline) minus a small margin.
const SORT_MIN_SITES: u64 = 6;
const SORT_MIN_INLINE: u64 = 6;
const LIBSQLITE3_MIN_SITES: u64 = 1370;
const LIBSQLITE3_MIN_INLINE: u64 = 1350;

fn present(paths: &[&str]) -> bool {
    let missing: Vec<&&str> = paths.iter().filter(|p| !Path::new(p).exists()).collect();
    if !missing.is_empty() {
        eprintln!("SKIPPED: {missing:?} not installed");
    }
    missing.is_empty()
}

fn print_coverage(what: &str, c: &SiteCounts, input: &Path, output: &Path) {
    let (a, b) = (
        std::fs::metadata(input).unwrap().len(),
        std::fs::metadata(output).unwrap().len(),
    );
    eprintln!(
        "coverage {what}: {} sites: {} inline, {} uprobe; {a} -> {b} bytes ({:.2}x)",
        c.total,
        c.inline,
        c.uprobe,
        b as f64 / a as f64
    );
}

/// Deterministic pseudo-random numbers (64-bit LCG, high bits).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` lines `word number decimal key version`: mixed-case words, signed integers,
/// decimals, keys with many duplicates (for -u) and version-like strings (for -V).
fn sort_input(n: usize, seed: u64) -> String {
    let mut r = Lcg(seed);
    let mut s = String::with_capacity(n * 40);
    for _ in 0..n {
        let len = 3 + r.below(6);
        let word: String = (0..len)
            .map(|_| {
                let c = (b'a' + r.below(26) as u8) as char;
                if r.below(4) == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
        let num = r.below(2_000_001) as i64 - 1_000_000;
        let dec = r.below(1_000_000) as f64 / 1000.0 - 500.0;
        let key = r.below(5000);
        s.push_str(&format!(
            "{word} {num} {dec:.3} k{key:04} v{}.{}.{}\n",
            r.below(20),
            r.below(100),
            r.below(12)
        ));
    }
    s
}

/// Run `prog` (as `argv0`, so that messages name the same program) with `args` in `dir`.
fn run_as(prog: &Path, argv0: &str, args: &[String], dir: &Path, env: &[(&str, &OsStr)]) -> Out {
    let mut c = Command::new(prog);
    c.arg0(argv0).args(args).current_dir(dir).env("LC_ALL", "C");
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c, RUN_TIMEOUT)
}

/// Report counts of `names` vs the oracle's counts.
fn check_counts(what: &str, rep: &Report, oracle: &HashMap<String, u64>, names: &[&str]) {
    let mut bad = Vec::new();
    for n in names {
        let (got, want) = (rep.count_of(n), oracle[*n]);
        eprintln!("{what}: {n}: {got} records, oracle {want}");
        if got != want {
            bad.push(format!("{n}: {got} records, the oracle counted {want}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: recorded entry counts differ from the kernel's:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn sort_rewritten_same_output() {
    if !present(&[SORT]) {
        return;
    }
    let start = Instant::now();
    let tmp = TempDir::new("real-sort");
    let sort = Path::new(SORT);
    let traced = tmp.join("sort");
    let (_, counts, meta) = rewrite(sort, Some(&traced), &[]);
    print_coverage("sort", &counts, sort, &traced);
    assert!(
        counts.total >= SORT_MIN_SITES && counts.inline >= SORT_MIN_INLINE,
        "sort: coverage {counts:?} below the floor ({SORT_MIN_SITES} sites, {SORT_MIN_INLINE} inline)"
    );

    let input = tmp.join("in.txt");
    std::fs::write(&input, sort_input(200_000, 1)).unwrap();
    let small = tmp.join("small.txt");
    std::fs::write(&small, sort_input(1000, 2)).unwrap();
    // 300 NUL-separated names (the same small file): readtokens0 keeps them on an obstack.
    let list = tmp.join("files0");
    let mut names = Vec::new();
    for _ in 0..300 {
        names.extend_from_slice(small.as_os_str().as_encoded_bytes());
        names.push(0);
    }
    std::fs::write(&list, names).unwrap();
    let random = tmp.join("random-source");
    std::fs::write(&random, sort_input(2000, 3)).unwrap();
    let tdir = tmp.join("sort-tmp");
    std::fs::create_dir_all(&tdir).unwrap();

    let i = input.to_string_lossy().into_owned();
    let files0 = format!("--files0-from={}", list.display());
    let variants: Vec<Vec<String>> = [
        vec![i.as_str()],
        vec!["-n", "-k2,2", &i],
        vec!["-u", "-k4,4", &i],
        vec!["-r", &i],
        vec!["-g", "-s", "-k3,3", &i],
        vec!["-f", "-u", "-k1,1", &i],
        vec!["-V", "-k5,5", "-k1,1", &i],
        vec!["-k4,4", "-k2,2nr", "--parallel=2", "-S", "1M", "-T"]
            .into_iter()
            .chain([tdir.to_str().unwrap(), &i])
            .collect(),
        vec!["-R", "-k4,4"]
            .into_iter()
            .chain([format!("--random-source={}", random.display()).as_str(), &i])
            .collect(),
        vec!["-c", &i],
        vec!["-n", "-k2,2", &files0],
        vec!["-t", "v", "-k2,2n", &i, "/nonexistent-input"],
    ]
    .iter()
    .map(|v| v.iter().map(|s| s.to_string()).collect())
    .collect();
    for args in &variants {
        let what = format!("sort {}", args.join(" "));
        let o = run_as(sort, "sort", args, tmp.path(), &[]);
        let t = run_as(&traced, "sort", args, tmp.path(), &[]);
        assert_same_behaviour(&format!("rewritten {what}"), &t, &o);
        eprintln!(
            "sort {}: {} bytes out, {} bytes err, status {}: same",
            args.join(" "),
            o.stdout.len(),
            o.stderr.len(),
            o.status()
        );
    }
    // The error cases really are errors (and the normal ones not).
    let c = run_as(sort, "sort", &["-c".into(), i.clone()], tmp.path(), &[]);
    assert_eq!(c.status(), 1, "sort -c of unsorted input: {}", c.describe());

    // Under the tracer: the obstack functions (the only sites) against the oracle.
    let args: Vec<String> = vec!["-n".into(), "-k2,2".into(), files0.clone()];
    let mut c = Command::new(sort);
    c.arg0("sort")
        .args(&args)
        .current_dir(tmp.path())
        .env("LC_ALL", "C");
    let probes: Vec<(&Path, &str)> = meta.sites.iter().map(|s| (sort, &*s.name)).collect();
    let (o, oracle) = oracle_counts(&probes, &mut c, RUN_TIMEOUT);
    assert!(o.success(), "{}", o.describe());
    let trace = tmp.join("sort.utrace");
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let r = tracer_record(&trace, &traced, &argv, &[("LC_ALL", "C".as_ref())]);
    let mut plain = run_as(sort, "sort", &args, tmp.path(), &[]);
    // Under the tracer argv[0] is the rewritten file's path: no message names it here.
    plain.cmdline = "sort (original)".into();
    assert_same_behaviour(
        "rewritten sort under tracer record",
        &without_tracer_lines(&r),
        &plain,
    );
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "sort: dropped records");
    let names: Vec<&str> = meta.sites.iter().map(|s| &*s.name).collect();
    check_counts("sort under tracer record", &rep, &oracle, &names);
    assert!(
        oracle.values().sum::<u64>() > 0,
        "sort --files0-from made no obstack call: the check is empty ({oracle:?})"
    );
    let recorded: u64 = rep.functions.iter().map(|f| f.3).sum();
    assert_eq!(recorded, rep.records, "sort: records of unknown functions");
    eprintln!("sort: {:.1} s", start.elapsed().as_secs_f64());
}

/// The SQL workload: tables from a recursive CTE, indexes, joins, GROUP BY, window
/// functions, printf, JSON, updates, deletes, a rolled-back transaction; all in memory.
const SQL: &str = r#"
.headers on
CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, val REAL);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000)
INSERT INTO t SELECT x, x % 37, printf('n%05d-%s', x, hex(x * 7919 % 65536)), (x * 7919 % 1000) / 10.0 FROM c;
CREATE INDEX t_grp ON t(grp);
CREATE INDEX t_name ON t(name);
CREATE TABLE g(grp INTEGER PRIMARY KEY, label TEXT);
INSERT INTO g SELECT DISTINCT grp, 'group-' || grp FROM t;
SELECT g.label, count(*), sum(t.val), printf('%.3f', avg(t.val)), min(t.name), max(t.name)
  FROM t JOIN g USING (grp) GROUP BY g.label ORDER BY g.label;
SELECT json_group_array(json_object('id', id, 'name', name, 'val', val))
  FROM (SELECT id, name, val FROM t WHERE grp = 5 ORDER BY val DESC, id LIMIT 20);
SELECT json_extract('{"a":[1,2,{"b":"x"}]}', '$.a[2].b'), json_array_length('[1,2,3,4]'),
  json_set('{"k":1}', '$.m', json('[true,null]'));
CREATE TABLE u AS SELECT id, upper(name) AS uname, substr(name, 2, 3) AS s, length(name) AS l
  FROM t WHERE id % 3 = 0;
CREATE INDEX u_s ON u(s);
SELECT s, count(*), group_concat(id, ',') FROM (SELECT * FROM u WHERE s LIKE '00%' ORDER BY id LIMIT 200)
  GROUP BY s ORDER BY s;
SELECT id, val, rank() OVER (PARTITION BY grp ORDER BY val DESC, id) AS r,
  sum(val) OVER (PARTITION BY grp ORDER BY id ROWS 2 PRECEDING) AS w
  FROM t WHERE grp IN (1, 2) ORDER BY grp, r, id LIMIT 40;
UPDATE t SET val = val * 2 WHERE grp = 3;
DELETE FROM t WHERE id % 10 = 0;
BEGIN;
DELETE FROM t WHERE grp = 7;
SELECT count(*) FROM t;
ROLLBACK;
SELECT count(*), total(val), quote(max(name)), printf('%08.2f|%-6s|%x', total(val) / 1000, 'ab', 48879) FROM t;
SELECT a.grp, count(*), printf('%.2f', avg(b.l)) FROM t a JOIN u b ON a.id = b.id
  WHERE a.grp < 6 GROUP BY a.grp ORDER BY a.grp;
SELECT name FROM t WHERE name > 'n19990' ORDER BY name;
SELECT grp, count(*) FROM t WHERE id IN (SELECT id FROM u WHERE l > 10) GROUP BY grp HAVING count(*) > 170
  ORDER BY 2 DESC, 1 LIMIT 5;
.mode box
SELECT grp, label, (SELECT count(*) FROM t WHERE t.grp = g.grp) AS n FROM g ORDER BY grp LIMIT 6;
.mode json
SELECT id, name, val FROM t ORDER BY id LIMIT 3;
.mode list
PRAGMA integrity_check;
"#;

#[test]
fn sqlite_rewritten_same_output() {
    if !present(&[SQLITE3, LIBSQLITE3]) {
        return;
    }
    let start = Instant::now();
    let tmp = TempDir::new("real-sqlite");
    let lib = std::fs::canonicalize(LIBSQLITE3).unwrap();
    let lib = lib.as_path();
    let ld = tmp.join("lib");
    std::fs::create_dir_all(&ld).unwrap();
    // The rewritten library keeps its soname as file name.
    let tlib = ld.join("libsqlite3.so.0");
    let (_, counts, meta) = rewrite(lib, Some(&tlib), &[]);
    print_coverage("libsqlite3.so.0", &counts, lib, &tlib);
    assert!(
        counts.total >= LIBSQLITE3_MIN_SITES && counts.inline >= LIBSQLITE3_MIN_INLINE,
        "libsqlite3: coverage {counts:?} below the floor ({LIBSQLITE3_MIN_SITES} sites, {LIBSQLITE3_MIN_INLINE} inline)"
    );

    // The shell: stripped, no function symbol. The rewriter either refuses it cleanly
    // or instruments it; the rest of the test runs whatever it gives.
    let shell = Path::new(SQLITE3);
    let tshell = tmp.join("sqlite3");
    let r = rewriter(&[shell.as_os_str(), "-o".as_ref(), tshell.as_os_str()]);
    let shell_traced: PathBuf = if r.success() {
        let (_, c, _) = rewrite(shell, Some(&tshell), &[]);
        print_coverage("sqlite3", &c, shell, &tshell);
        tshell.clone()
    } else {
        assert!(
            !tshell.exists(),
            "the rewriter failed but wrote {}",
            tshell.display()
        );
        let msg = r.stderr_str() + &r.stdout_str();
        assert!(
            msg.contains("no function symbols"),
            "the rewriter refused {SQLITE3} for an unexpected reason: {}",
            r.describe()
        );
        eprintln!(
            "coverage sqlite3: refused by the rewriter ({}); the original shell runs with the rewritten library",
            msg.trim()
        );
        shell.to_path_buf()
    };

    let env: [(&str, &OsStr); 1] = [("LD_LIBRARY_PATH", ld.as_os_str())];
    // The loader picks the rewritten library...
    let list = loader_list(&shell_traced, &env);
    let found = list.iter().find(|(n, _)| n == "libsqlite3.so.0");
    assert_eq!(
        found.map(|f| f.1.as_path()),
        Some(tlib.as_path()),
        "ld.so --list with LD_LIBRARY_PATH={}: {list:?}",
        ld.display()
    );
    // ...and a running shell has it mapped (its own /proc/PID/maps, through `.shell`).
    let probe = run_as(
        &shell_traced,
        "sqlite3",
        &[
            ":memory:".into(),
            ".shell grep -F libsqlite3 /proc/$PPID/maps".into(),
        ],
        tmp.path(),
        &env,
    )
    .ok();
    let maps = probe.stdout_str();
    assert!(
        maps.contains(&*tlib.to_string_lossy()) && !maps.contains(&*lib.to_string_lossy()),
        "the running sqlite3 maps:\n{maps}"
    );
    // (The helper for a process we hold: our own maps list no sqlite.)
    assert!(
        !mapped_files(std::process::id())
            .iter()
            .any(|p| p.to_string_lossy().contains("libsqlite3"))
    );

    let script = tmp.join("work.sql");
    std::fs::write(&script, SQL).unwrap();
    let read = format!(".read {}", script.display());
    let variants: Vec<Vec<String>> = vec![
        vec![":memory:".into(), read.clone()],
        // A failing statement after a good one: message on stderr, exit code 1.
        vec![
            "-bail".into(),
            ":memory:".into(),
            "CREATE TABLE a(x); INSERT INTO a VALUES (1), (2); SELECT sum(x) FROM a;".into(),
            "SELECT * FROM nosuchtable;".into(),
            "SELECT 'not reached';".into(),
        ],
        vec![
            ":memory:".into(),
            "SELECT printf('%d %s %.4f', 42, 'x', pi()), hex(zeroblob(4)), typeof(1.0), abs(-7), \
             round(2.675, 2), json_valid('{'), instr('hello', 'll'), replace('aaa', 'a', 'bc');"
                .into(),
        ],
    ];
    let mut outs = Vec::new();
    for args in &variants {
        let what = format!("sqlite3 {}", args.join(" "));
        let o = run_as(shell, "sqlite3", args, tmp.path(), &[]);
        let t = run_as(&shell_traced, "sqlite3", args, tmp.path(), &env);
        assert_same_behaviour(&format!("rewritten {what}"), &t, &o);
        eprintln!(
            "{what}: {} bytes out, {} bytes err, status {}: same",
            o.stdout.len(),
            o.stderr.len(),
            o.status()
        );
        outs.push(o);
    }
    assert!(outs[0].success() && outs[0].stdout_str().contains("group-36"));
    assert_eq!(outs[1].status(), 1, "{}", outs[1].describe());
    assert!(outs[1].stderr_str().contains("nosuchtable"));

    // Under the tracer, the main workload; chosen functions against the oracle: API
    // entry points, the VDBE interpreter, inline and uprobe sites.
    let chosen = [
        "sqlite3_prepare_v2",
        "sqlite3_step",
        "sqlite3_finalize",
        "sqlite3_column_count",
        "sqlite3VdbeExec",
        "sqlite3VdbeRecordCompare",
        "sqlite3_value_int",
        "sqlite3_malloc",
        "sqlite3DbMallocZero",
    ];
    for n in chosen {
        assert!(
            meta.sites.iter().any(|s| s.name == n),
            "libsqlite3: no site {n}"
        );
    }
    let modes: Vec<String> = chosen
        .iter()
        .map(|n| {
            let s = meta.sites.iter().find(|s| s.name == *n).unwrap();
            format!("{n} {:?}", s.mode)
        })
        .collect();
    eprintln!("sqlite: chosen sites: {}", modes.join(", "));
    let args = &variants[0];
    let mut c = Command::new(shell);
    c.arg0("sqlite3")
        .args(args)
        .current_dir(tmp.path())
        .env("LC_ALL", "C");
    let probes: Vec<(&Path, &str)> = chosen.iter().map(|n| (lib, *n)).collect();
    let (o, oracle) = oracle_counts(&probes, &mut c, RUN_TIMEOUT);
    assert_same_behaviour("sqlite3 under the oracle's uprobes", &o, &outs[0]);

    let trace = tmp.join("sqlite.utrace");
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let t0 = Instant::now();
    // About 10 million records in 2-3 s: a ring buffer larger than the default 16 MB
    // keeps the consumer (on the same 2 cores) from dropping any.
    let r = tracer_record_with(
        &["--ring-bytes", "256M"],
        &trace,
        &shell_traced,
        &argv,
        &[
            ("LD_LIBRARY_PATH", ld.as_os_str()),
            ("LC_ALL", "C".as_ref()),
        ],
    );
    eprintln!(
        "sqlite: tracer record took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert_same_behaviour(
        "rewritten libsqlite3 under tracer record",
        &without_tracer_lines(&r),
        &outs[0],
    );
    let rep = report(&trace);
    eprintln!(
        "sqlite: {} records, {} dropped, {} functions with records",
        rep.records,
        rep.dropped,
        rep.functions.iter().filter(|f| f.3 > 0).count()
    );
    assert_eq!(rep.dropped, 0, "sqlite: dropped records");
    for f in &rep.functions {
        assert!(
            f.0.ends_with("libsqlite3.so.0") || f.3 == 0 || shell_traced == tshell,
            "sqlite: records of an unexpected binary: {f:?}"
        );
    }
    check_counts("sqlite under tracer record", &rep, &oracle, &chosen);
    eprintln!("sqlite: {:.1} s", start.elapsed().as_secs_f64());
}
