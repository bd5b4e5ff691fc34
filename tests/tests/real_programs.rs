//! Real programs of the distribution, rewritten with every function (the default):
//! GNU `sort` (coreutils) and SQLite (`libsqlite3.so.0`, where the real code is, and the
//! `sqlite3` shell). Deterministic workloads give byte-identical stdout, stderr and exit
//! status with the original and the rewritten binaries, also under `tracer record`; and
//! the recorded entry counts of chosen functions equal the oracle's (kernel uprobes on
//! the original binaries, same workload).
//!
//! Every site kind at once (`--sites entry,exit,block,memory`, with `record` and
//! `coarse` timestamps): the same workloads give the same output, also under the
//! tracer, where the records are checked (`check_all_kinds_records`: run-time addresses
//! of blocks and memory accesses, access kind and size of memory records, every entry
//! followed by its function's first block, exits never outnumber entries; per-site
//! counts against the oracle for chosen SQLite functions; entry counts against the
//! oracle for sort). The same for two more programs whose code lives in shared
//! libraries: `bzip2` (libbz2) and `jq` (libjq and libonig). The per-kind coverage is
//! printed and held to floors that binutils derive from each binary (`Derived`).
//!
//! Under the tracer, libraries are rewritten again with only the functions whose sites
//! are all inline plus a few chosen ones (`functions_for_tracing`): the tracer detaches
//! its uprobes one at a time when the command ends, 0.1-0.2 s each on this machine,
//! and every kind of libsqlite3 has over a thousand uprobe sites (minutes). Workloads
//! are smaller there, since every block and memory access makes a record (the main SQL
//! workload makes over 75 million with a fifth of the sites). `coarse` timestamps are
//! traced with SQLite only (a tracer session costs 3-4 s).
//!
//! Both programs are stripped: the rewriter sees only their dynamic symbols. For `sort`
//! those are 6 exported obstack functions (reached through `--files0-from`); the
//! `sqlite3` shell exports no function at all and the rewriter refuses it, so the
//! original shell runs with the rewritten library (LD_LIBRARY_PATH).
//!
//! The programs are Debian packages (coreutils, sqlite3, bzip2, jq) that `cargo xtask
//! setup` installs: a missing one fails its test (`tests::skip`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tests::*;
use tracer_common::meta::SiteKind;

const SORT: &str = "/usr/bin/sort";
const SQLITE3: &str = "/usr/bin/sqlite3";
const LIBSQLITE3: &str = "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0";

/// Every site kind.
const ALL_KINDS: &str = "entry,exit,block,memory";

/// Whether every path is installed; a missing one fails the test unless the run allows
/// it to skip (`tests::skip`, the tool named by the file's name).
fn present(paths: &[&str]) -> bool {
    paths.iter().all(|p| {
        let name = Path::new(p)
            .file_name()
            .map_or(*p, |n| n.to_str().unwrap_or(p));
        tests::skip::require(name, Path::new(p).exists(), &format!("{p} installed"))
    })
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

/// The rewriter's summary and per-kind lines.
fn print_kind_coverage(
    what: &str,
    c: &SiteCounts,
    kinds: &[(SiteKind, SiteCounts)],
    input: &Path,
    output: &Path,
) {
    print_coverage(what, c, input, output);
    for (k, c) in kinds {
        eprintln!(
            "coverage {what}: {:<6} {} sites: {} inline ({:.2}%), {} uprobe",
            k.name(),
            c.total,
            c.inline,
            100.0 * c.inline as f64 / c.total.max(1) as f64,
            c.uprobe
        );
    }
}

/// Every kind's sites against the floors binutils derive from `binary` (`Derived`).
fn check_kind_floors(what: &str, kinds: &[(SiteKind, SiteCounts)], binary: &Path) {
    let derived = Derived::of(binary);
    for kind in [
        SiteKind::FunctionEntry,
        SiteKind::FunctionExit,
        SiteKind::Block,
        SiteKind::Memory,
    ] {
        let c = kinds
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, c)| *c)
            .unwrap_or_else(|| panic!("{what}: no {} line: {kinds:?}", kind.name()));
        derived.check(what, kind, &c);
    }
}

fn print_kind_records(what: &str, recs: &KindRecords) {
    let parts: Vec<String> = recs
        .iter()
        .map(|(k, i, u)| format!("{} {i} inline + {u} uprobe", k.name()))
        .collect();
    eprintln!("{what}: records: {}", parts.join(", "));
}

/// Entry records per function (only the entry sites of `meta`).
fn entry_counts(recs: &[Rec], meta: &Metadata) -> HashMap<String, u64> {
    let entry: HashMap<u32, &str> = meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::FunctionEntry)
        .map(|s| (s.id, &*s.name))
        .collect();
    let mut m: HashMap<String, u64> = HashMap::new();
    for r in recs {
        if let Some(n) = entry.get(&r.site) {
            *m.entry(n.to_string()).or_default() += 1;
        }
    }
    m
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
    Derived::of(sort).check("sort", SiteKind::FunctionEntry, &counts);
    // Every site kind, with both timestamp modes.
    let mut rewritten: Vec<(&str, PathBuf, Metadata)> =
        vec![("entries", traced.clone(), meta.clone())];
    for (label, file, time) in [
        ("all kinds", "sort-all", "record"),
        ("all kinds, coarse", "sort-coarse", "coarse"),
    ] {
        let out = tmp.join(file);
        let (c, kinds, m, _) = rewrite_args(sort, &out, &["--sites", ALL_KINDS, "--time", time]);
        let what = format!("sort ({label})");
        print_kind_coverage(&what, &c, &kinds, sort, &out);
        check_kind_floors(&what, &kinds, sort);
        rewritten.push((label, out, m));
    }

    // Under the tracer: the functions with a symbol (the obstack ones) — sort's hot
    // `sub_<address>` functions would make millions of records a run.
    let named_traced = tmp.join("sort-named");
    let (_, _, named_meta) = rewrite(sort, Some(&named_traced), &["_obstack*"]);
    let named_all = tmp.join("sort-named-all");
    let (_, _, named_all_meta, _) = rewrite_args(
        sort,
        &named_all,
        &["--sites", ALL_KINDS, "--functions", "_obstack*"],
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
    for (k, args) in variants.iter().enumerate() {
        let what = format!("sort {}", args.join(" "));
        let o = run_as(sort, "sort", args, tmp.path(), &[]);
        // The coarse rewrite differs only in its stubs, which only --files0-from
        // reaches: the first variant and the last three (-c, --files0-from, an error).
        let n = if k == 0 || k + 3 >= variants.len() {
            rewritten.len()
        } else {
            2
        };
        for (label, prog, _) in &rewritten[..n] {
            let t = run_as(prog, "sort", args, tmp.path(), &[]);
            assert_same_behaviour(&format!("rewritten ({label}) {what}"), &t, &o);
        }
        eprintln!(
            "sort {}: {} bytes out, {} bytes err, status {}: same ({n} rewrites)",
            args.join(" "),
            o.stdout.len(),
            o.stderr.len(),
            o.status(),
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
    // The oracle checks the functions with a symbol (sort is stripped: the others are
    // `sub_<address>` ranges from .eh_frame, covered by the identical outputs).
    let named: Vec<&str> = named_meta
        .sites
        .iter()
        .map(|s| &*s.name)
        .filter(|n| !n.starts_with("sub_"))
        .collect();
    let probes: Vec<(&Path, &str)> = named.iter().map(|n| (sort, *n)).collect();
    let (o, oracle) = oracle_counts(&probes, &mut c, RUN_TIMEOUT);
    assert!(o.success(), "{}", o.describe());
    let trace = tmp.join("sort.utrace");
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let r = tracer_record(&trace, &named_traced, &argv, &[("LC_ALL", "C".as_ref())]);
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
    check_counts("sort under tracer record", &rep, &oracle, &named);
    assert!(
        oracle.values().sum::<u64>() > 0,
        "sort --files0-from made no obstack call: the check is empty ({oracle:?})"
    );
    let recorded: u64 = rep.functions.iter().map(|f| f.3).sum();
    assert_eq!(recorded, rep.records, "sort: records of unknown functions");

    // Every kind (`record` timestamps; the `coarse` rewrite is traced in
    // sqlite_every_kind_same_output): same output, checked records, the oracle's entry
    // counts.
    let (label, prog, m) = ("all kinds, named functions", &named_all, &named_all_meta);
    let what = format!("sort ({label}) under tracer record");
    let trace = tmp.join("sort-all.utrace");
    let r = tracer_record_with(
        &["--ring-bytes", "256M"],
        &trace,
        prog,
        &argv,
        &[("LC_ALL", "C".as_ref())],
    );
    assert_same_behaviour(&what, &without_tracer_lines(&r), &plain);
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "{what}: dropped records");
    let recs = dump(&trace);
    check_report_matches_dump(&rep, &recs);
    check_sites_valid(&recs, &[m]);
    let name = prog.file_name().unwrap().to_string_lossy();
    let kinds = check_all_kinds_records(&recs, &name, m, false, &what);
    print_kind_records(&what, &kinds);
    let entries = entry_counts(&recs, m);
    for n in &named {
        let got = entries.get(*n).copied().unwrap_or(0);
        assert_eq!(got, oracle[*n], "{what}: {n}: entries vs the oracle");
    }
    for k in [SiteKind::FunctionExit, SiteKind::Block, SiteKind::Memory] {
        assert!(
            kinds.iter().any(|(kk, i, _)| *kk == k && *i > 0),
            "{what}: no inline {} record",
            k.name()
        );
    }
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

/// The shell's argument lists: the main script (`.read SCRIPT`), a failing statement
/// after a good one (message on stderr, exit code 1), one line of scalar functions.
fn sqlite_variants(script: &Path) -> Vec<Vec<String>> {
    let read = format!(".read {}", script.display());
    vec![
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
    ]
}

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
    Derived::of(lib).check("libsqlite3", SiteKind::FunctionEntry, &counts);

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
            msg.contains("no functions to instrument"),
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
    let variants = sqlite_variants(&script);
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
    let probes: Vec<(&Path, &str)> = chosen.iter().map(|n| (lib, *n)).collect();
    // Only this process's events: sqlite_every_kind_same_output may run the original
    // library at the same time.
    let (o, oracle) = oracle_counts_own(
        &probes,
        (shell, "sqlite3", args),
        tmp.path(),
        &[("LC_ALL", "C".as_ref())],
        RUN_TIMEOUT,
    );
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

/// Debian's libsqlite3 with every function's entry and exit traced (issue 13): the
/// shell gives the original's output under `tracer record`, nothing is dropped, and
/// every exit pairs with its entry on its thread (the report's call stacks end with
/// no unmatched exit and no call left open), with as many exits as entries.
#[test]
fn sqlite_entries_and_exits_pair() {
    if !present(&[SQLITE3, LIBSQLITE3]) {
        return;
    }
    let tmp = TempDir::new("real-sqlite-pairs");
    let lib = std::fs::canonicalize(LIBSQLITE3).unwrap();
    let ld = tmp.join("lib");
    std::fs::create_dir_all(&ld).unwrap();
    let tlib = ld.join("libsqlite3.so.0");
    let out = rewriter(&[
        lib.as_os_str(),
        "-o".as_ref(),
        tlib.as_os_str(),
        "--sites".as_ref(),
        "entry,exit".as_ref(),
    ])
    .ok();
    let meta = metadata(&tlib);
    let counts = parse_site_counts(&out.stdout_str()).expect("site counts");
    print_coverage("libsqlite3.so.0 entry,exit", &counts, &lib, &tlib);
    let script = tmp.join("work.sql");
    std::fs::write(&script, SQL).unwrap();
    let args = &sqlite_variants(&script)[0];
    let shell = Path::new(SQLITE3);
    let env: [(&str, &OsStr); 2] = [
        ("LD_LIBRARY_PATH", ld.as_os_str()),
        ("LC_ALL", "C".as_ref()),
    ];
    let want = run_as(
        shell,
        "sqlite3",
        args,
        tmp.path(),
        &[("LC_ALL", "C".as_ref())],
    );
    assert!(want.success(), "{}", want.describe());
    let trace = tmp.join("pairs.utrace");
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let r = tracer_record_with(&["--ring-bytes", "256M"], &trace, shell, &argv, &env);
    assert_same_behaviour(
        "libsqlite3 entry,exit under tracer record",
        &without_tracer_lines(&r),
        &want,
    );
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "dropped records");
    let calls = &rep.raw["calls"];
    assert_eq!(calls["unmatched_exits"], 0, "exits without their entry");
    assert_eq!(calls["unfinished"], 0, "calls with no exit");
    let kind: HashMap<u32, SiteKind> = meta.sites.iter().map(|s| (s.id, s.kind)).collect();
    let recs = dump(&trace);
    let (mut entries, mut exits) = (0u64, 0u64);
    for r in &recs {
        match kind.get(&r.site) {
            Some(SiteKind::FunctionEntry) => entries += 1,
            Some(SiteKind::FunctionExit) => exits += 1,
            // sqlite is C: no exception lands; a setjmp return may (none runs here).
            Some(SiteKind::Landing | SiteKind::Resume) => {}
            k => panic!("record of an unexpected site {k:?}: {r:?}"),
        }
    }
    eprintln!(
        "sqlite entry,exit: {entries} entries, {exits} exits, {} records",
        recs.len()
    );
    assert!(entries > 100_000, "only {entries} entries");
    assert_eq!(entries, exits, "entries and exits");
}

/// A shared library of a `LibCase`.
struct Lib<'a> {
    /// As the loader finds it.
    path: &'a str,
    /// Functions kept in the rewrite used under the tracer, whatever their uprobe sites.
    keep: &'a [&'a str],
}

/// A program whose code lives in shared libraries, every kind of their sites traced.
struct LibCase<'a> {
    what: &'a str,
    prog: &'a Path,
    argv0: &'a str,
    libs: &'a [Lib<'a>],
    /// Argument lists (absolute paths): original and rewritten libraries give the same
    /// output.
    variants: Vec<Vec<String>>,
    /// The workload under the tracer (absolute paths).
    traced: Vec<String>,
    /// Uprobe sites allowed per library in the rewrite used under the tracer.
    uprobe_budget: usize,
    /// Functions (of the first library) whose every site the oracle counts during the
    /// traced workload (kernel uprobes at the same instructions of the original).
    oracle: &'a [&'a str],
    /// Also trace with `coarse` timestamps (a tracer session costs 3-4 s, most of it
    /// verifying the eBPF programs).
    trace_coarse: bool,
}

/// Rewrite every library with every kind (`record` and `coarse` timestamps), compare the
/// variants' behaviour with the originals, then trace the smaller workload with the
/// budgeted rewrites (`record`; `coarse` if asked) and check the records (and the
/// oracle's counts).
fn lib_all_kinds(case: &LibCase<'_>) {
    let start = Instant::now();
    let what = case.what;
    let tmp = TempDir::new(&format!("real-{what}"));
    let originals: Vec<PathBuf> = case
        .libs
        .iter()
        .map(|l| std::fs::canonicalize(l.path).unwrap())
        .collect();
    // Full rewrites (record, coarse) and the budgeted ones used under the tracer.
    let dirs = ["all", "coarse", "traced-all", "traced-coarse"].map(|d| {
        let p = tmp.join(d);
        std::fs::create_dir_all(&p).unwrap();
        p
    });
    let mut full_meta: Vec<Metadata> = Vec::new();
    for (lib, orig) in case.libs.iter().zip(&originals) {
        let soname = Path::new(lib.path).file_name().unwrap();
        for (dir, time) in [(&dirs[0], "record"), (&dirs[1], "coarse")] {
            let out = dir.join(soname);
            let (c, kinds, m, _) =
                rewrite_args(orig, &out, &["--sites", ALL_KINDS, "--time", time]);
            let w = format!("{} ({time})", soname.to_string_lossy());
            print_kind_coverage(&w, &c, &kinds, orig, &out);
            check_kind_floors(&w, &kinds, orig);
            if time == "record" {
                full_meta.push(m);
            }
        }
    }
    for args in &case.variants {
        let w = format!("{what} {}", args.join(" "));
        let o = run_as(case.prog, case.argv0, args, tmp.path(), &[]);
        for dir in &dirs[..2] {
            let env: [(&str, &OsStr); 1] = [("LD_LIBRARY_PATH", dir.as_os_str())];
            let t = run_as(case.prog, case.argv0, args, tmp.path(), &env);
            assert_same_behaviour(&format!("{w} (every kind, {})", dir.display()), &t, &o);
        }
        eprintln!(
            "{w}: {} bytes out, {} bytes err, status {}: same",
            o.stdout.len(),
            o.stderr.len(),
            o.status()
        );
    }
    eprintln!(
        "{what}: rewrites and variants: {:.1} s",
        start.elapsed().as_secs_f64()
    );

    // Under the tracer.
    let argv: Vec<&str> = case.traced.iter().map(|s| s.as_str()).collect();
    // Under the tracer argv[0] is the program's path.
    let prog_str = case.prog.to_str().unwrap();
    let want = run_as(case.prog, prog_str, &case.traced, tmp.path(), &[]);
    let mut oracle: Option<(Vec<u32>, HashMap<String, u64>)> = None;
    // With `coarse` timestamps only functions whose sites are all inline.
    let sessions = if case.trace_coarse { 2 } else { 1 };
    for (dir, time) in [(&dirs[2], "record"), (&dirs[3], "coarse")]
        .into_iter()
        .take(sessions)
    {
        let mut metas = Vec::new();
        for ((lib, orig), full) in case.libs.iter().zip(&originals).zip(&full_meta) {
            let soname = Path::new(lib.path).file_name().unwrap();
            let (keep, budget) = match time {
                "record" if metas.is_empty() => {
                    ([lib.keep, case.oracle].concat(), case.uprobe_budget)
                }
                "record" => (lib.keep.to_vec(), case.uprobe_budget),
                _ => (Vec::new(), 0),
            };
            let (names, uprobes) = functions_for_tracing(full, &keep, budget);
            let mut args = vec!["--sites", ALL_KINDS, "--time", time, "--functions"];
            args.extend(names.iter().map(|s| s.as_str()));
            let out = dir.join(soname);
            let (c, _, m, _) = rewrite_args(orig, &out, &args);
            assert_eq!(
                c.uprobe as usize,
                uprobes,
                "{what}: uprobe sites of {}",
                out.display()
            );
            eprintln!(
                "{what}: traced {} ({time}): {} of {} functions, {} sites, {} uprobe",
                soname.to_string_lossy(),
                names.len(),
                full.sites
                    .iter()
                    .filter(|s| s.kind == SiteKind::FunctionEntry)
                    .count(),
                c.total,
                c.uprobe
            );
            metas.push(m);
        }
        // The oracle: every site of the chosen functions, at the same instructions of
        // the original library, the same workload.
        if oracle.is_none() && !case.oracle.is_empty() {
            let sites: Vec<&Site> = metas[0]
                .sites
                .iter()
                .filter(|s| case.oracle.contains(&&*s.name))
                .collect();
            let probes: Vec<(&Path, String, u64)> = sites
                .iter()
                .map(|s| (originals[0].as_path(), s.id.to_string(), s.file_off))
                .collect();
            // Only this process's events: sqlite_rewritten_same_output may run the
            // original library at the same time.
            let (o, events) = oracle_own_process(
                &probes,
                (case.prog, prog_str, &case.traced),
                tmp.path(),
                &[("LC_ALL", "C".as_ref())],
                RUN_TIMEOUT,
            );
            assert_same_behaviour(&format!("{what} under the oracle's uprobes"), &o, &want);
            let mut counts: HashMap<String, u64> = HashMap::new();
            for e in &events {
                *counts.entry(e.symbol.clone()).or_default() += 1;
            }
            oracle = Some((sites.iter().map(|s| s.id).collect(), counts));
        }
        let w = format!("{what} (every kind, {time}) under tracer record");
        let trace = tmp.join(format!("{time}.utrace"));
        let env: [(&str, &OsStr); 2] = [
            ("LD_LIBRARY_PATH", dir.as_os_str()),
            ("LC_ALL", "C".as_ref()),
        ];
        let t0 = Instant::now();
        let r = tracer_record_with(&["--ring-bytes", "256M"], &trace, case.prog, &argv, &env);
        let secs = t0.elapsed().as_secs_f64();
        assert_same_behaviour(&w, &without_tracer_lines(&r), &want);
        let rep = report(&trace);
        assert_eq!(rep.dropped, 0, "{w}: dropped records");
        let recs = dump(&trace);
        check_report_matches_dump(&rep, &recs);
        let meta_refs: Vec<&Metadata> = metas.iter().collect();
        check_sites_valid(&recs, &meta_refs);
        eprintln!("{w}: {} records in {secs:.1} s", recs.len());
        for (lib, m) in case.libs.iter().zip(&metas) {
            let soname = Path::new(lib.path).file_name().unwrap().to_string_lossy();
            let kinds = check_all_kinds_records(&recs, &soname, m, time == "coarse", &w);
            print_kind_records(&format!("{w}: {soname}"), &kinds);
            assert!(
                kinds.iter().filter(|(_, i, _)| *i > 0).count() == 4,
                "{w}: {soname}: not every kind has inline records: {kinds:?}"
            );
        }
        if time == "record"
            && let Some((ids, counts)) = &oracle
        {
            let mut per_site: HashMap<u32, u64> = HashMap::new();
            for r in recs.iter().filter(|r| ids.contains(&r.site)) {
                *per_site.entry(r.site).or_default() += 1;
            }
            let mut bad = Vec::new();
            for id in ids {
                let s = &metas[0].sites.iter().find(|s| s.id == *id).unwrap();
                let (got, want) = (
                    per_site.get(id).copied().unwrap_or(0),
                    counts.get(&id.to_string()).copied().unwrap_or(0),
                );
                if got != want {
                    bad.push(format!(
                        "{} {} site {id} at {:#x} ({:?}): {got} records, oracle {want}",
                        s.name,
                        s.kind.name(),
                        s.vaddr,
                        s.mode
                    ));
                }
            }
            assert!(
                bad.is_empty(),
                "{w}: counts differ from the oracle's:\n  {}",
                bad.join("\n  ")
            );
            let hit = ids.iter().filter(|id| per_site.contains_key(id)).count();
            eprintln!(
                "{w}: {} sites of {:?} counted as the oracle ({hit} hit, {} records)",
                ids.len(),
                case.oracle,
                per_site.values().sum::<u64>()
            );
        }
    }
    eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
}

/// SQLite with every kind: the variants of `sqlite_rewritten_same_output`; under the
/// tracer the main script with 300 rows instead of 20000.
#[test]
fn sqlite_every_kind_same_output() {
    if !present(&[SQLITE3, LIBSQLITE3]) {
        return;
    }
    let tmp = TempDir::new("real-sqlite-scripts");
    let script = tmp.join("work.sql");
    std::fs::write(&script, SQL).unwrap();
    let small = tmp.join("small.sql");
    let small_sql = SQL.replace("x < 20000", "x < 300");
    assert_ne!(small_sql, SQL);
    std::fs::write(&small, small_sql).unwrap();
    let variants = sqlite_variants(&script);
    lib_all_kinds(&LibCase {
        what: "sqlite",
        prog: Path::new(SQLITE3),
        argv0: "sqlite3",
        libs: &[Lib {
            path: LIBSQLITE3,
            // sqlite3VdbeMemGrow: a memory access at a branch target before an indirect
            // call through memory (`mov 0x8(%rbx),%rdi; call *0x30(%rbx)` at 0xfaf70),
            // run 300 times by the traced workload.
            keep: &[
                "sqlite3_mutex_enter",
                "sqlite3_mutex_leave",
                "sqlite3StrICmp",
                "sqlite3StatusHighwater",
                "sqlite3VdbeMemGrow",
            ],
        }],
        variants,
        traced: vec![":memory:".into(), format!(".read {}", small.display())],
        uprobe_budget: 0,
        // Inline and uprobe sites of every kind but memory (a uprobe memory site is
        // counted, its address is not computed).
        oracle: &[
            "sqlite3_column_count",
            "sqlite3DbMallocZero",
            "sqlite3BtreeLeave",
            "sqlite3_value_int",
        ],
        trace_coarse: true,
    });
}

const BZIP2: &str = "/usr/bin/bzip2";
const LIBBZ2: &str = "/lib/x86_64-linux-gnu/libbz2.so.1.0";

/// bzip2: the compressor is libbz2 (`BZ2_compressBlock`, `BZ2_blockSort`, ... are
/// exported); `bzip2` itself is stripped. Compression, decompression, test, an error.
#[test]
fn bzip2_every_kind_same_output() {
    if !present(&[BZIP2, LIBBZ2]) {
        return;
    }
    let tmp = TempDir::new("real-bzip2-data");
    let data = tmp.join("data.txt");
    std::fs::write(&data, sort_input(5000, 4)).unwrap();
    let small = tmp.join("small.txt");
    std::fs::write(&small, sort_input(400, 5)).unwrap();
    let packed = tmp.join("data.txt.bz2");
    let o = run_as(
        Path::new(BZIP2),
        "bzip2",
        &["-c".into(), data.to_string_lossy().into_owned()],
        tmp.path(),
        &[],
    )
    .ok();
    std::fs::write(&packed, &o.stdout).unwrap();
    let (d, p) = (
        data.to_string_lossy().into_owned(),
        packed.to_string_lossy().into_owned(),
    );
    let variants: Vec<Vec<String>> = [
        vec!["-c", &d],
        vec!["-1", "-c", &d],
        vec!["-dc", &p],
        vec!["-ds", "-c", &p],
        vec!["-tvv", &p],
        // Not a bzip2 file: a message and exit status 2.
        vec!["-dc", &d],
    ]
    .iter()
    .map(|v| v.iter().map(|s| s.to_string()).collect())
    .collect();
    lib_all_kinds(&LibCase {
        what: "bzip2",
        prog: Path::new(BZIP2),
        argv0: "bzip2",
        libs: &[Lib {
            path: LIBBZ2,
            keep: &[],
        }],
        variants,
        traced: vec!["-c".into(), small.to_string_lossy().into_owned()],
        uprobe_budget: 12,
        oracle: &[],
        trace_coarse: false,
    });
}

const JQ: &str = "/usr/bin/jq";
const LIBJQ: &str = "/lib/x86_64-linux-gnu/libjq.so.1";
const LIBONIG: &str = "/lib/x86_64-linux-gnu/libonig.so.5";

/// `n` JSON objects `{"id", "name", "v", "tags"}` in an array.
fn jq_input(n: usize, seed: u64) -> String {
    let mut r = Lcg(seed);
    let items: Vec<String> = (0..n)
        .map(|i| {
            let len = 3 + r.below(7);
            let name: String = (0..len)
                .map(|_| b"abcxyzC"[r.below(7) as usize] as char)
                .collect();
            let tags: Vec<String> = (0..r.below(5))
                .map(|_| format!("{:?}", ["a", "b", "c", "dd"][r.below(4) as usize]))
                .collect();
            format!(
                r#"{{"id":{i},"name":"{name}","v":{}.{:03},"tags":[{}]}}"#,
                r.below(100),
                r.below(1000),
                tags.join(",")
            )
        })
        .collect();
    format!("[{}]\n", items.join(",\n"))
}

/// The jq program: selection with a regular expression (libonig), string functions,
/// grouping, sorting, arithmetic, formatting.
const JQ_PROGRAM: &str = r#"[.[] | select(.name | test("^[ab].*c"; "i"))
  | {id, n: (.name | ascii_upcase | sub("C+"; "-")), t: (.tags | join(",")),
     v: (.v * 100 | floor), m: (.name | [scan("[xyz]+")] | length)}]
  | group_by(.t) | map({t: .[0].t, c: length, s: (map(.v) | add), m: (map(.m) | max)})
  | sort_by(-.c, .t)"#;

/// jq: the interpreter is libjq, regular expressions are libonig; both rewritten.
#[test]
fn jq_every_kind_same_output() {
    if !present(&[JQ, LIBJQ, LIBONIG]) {
        return;
    }
    let tmp = TempDir::new("real-jq-data");
    let big = tmp.join("big.json");
    std::fs::write(&big, jq_input(600, 6)).unwrap();
    let small = tmp.join("small.json");
    std::fs::write(&small, jq_input(20, 7)).unwrap();
    let bad = tmp.join("bad.json");
    std::fs::write(&bad, "[{\"a\": 1}, {\"b\": ]\n").unwrap();
    let (b, s, x) = (
        big.to_string_lossy().into_owned(),
        small.to_string_lossy().into_owned(),
        bad.to_string_lossy().into_owned(),
    );
    let variants: Vec<Vec<String>> = [
        vec!["-c", JQ_PROGRAM, &b],
        vec![".[:50]", &b],
        vec![
            "-r",
            r#".[:300][] | [.id, .name, (.tags | @csv), (.name | @base64), (.name | gsub("[ac]"; "_"))] | @tsv"#,
            &b,
        ],
        vec![
            "-c",
            "--arg",
            "k",
            "x",
            r#"[.[] | .name | capture("(?<a>[abc]+)(?<k>[xyz]*)") | select(.k | contains($k))] | unique | length, .[:5]"#,
            &b,
        ],
        vec![
            "-c",
            r#"([paths(type == "number")] | length), (map(.v) | add / length | . * 1000 | round), ([.[].name | splits("c+")] | map(select(length > 0)) | unique | length)"#,
            &b,
        ],
        // A parse error (exit 2) and a runtime error (exit 5).
        vec![".", &x],
        vec![r#".[0] | error("boom \(.id)")"#, &s],
    ]
    .iter()
    .map(|v| v.iter().map(|s| s.to_string()).collect())
    .collect();
    lib_all_kinds(&LibCase {
        what: "jq",
        prog: Path::new(JQ),
        argv0: "jq",
        libs: &[
            Lib {
                path: LIBJQ,
                keep: &["jq_next"],
            },
            Lib {
                path: LIBONIG,
                keep: &[],
            },
        ],
        variants,
        traced: vec!["-c".into(), JQ_PROGRAM.into(), s.clone()],
        uprobe_budget: 6,
        oracle: &[],
        trace_coarse: false,
    });
}
