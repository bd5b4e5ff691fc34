//! The memtrace recipe against an independent oracle (x86-64): a program rewritten with
//! `--sites memory --time coarse` (every function) and recorded; per memory site
//! (inline or uprobe), the accesses `tracer dump` shows (one line an access, however
//! the stubs packed them) equal the executions of that instruction that valgrind's
//! lackey counts on the ORIGINAL binary (`tests::lackey`); 0 lost, books balanced.
//! - `tests/fixtures/memwalk.c`: also the store of `buf[i] = i` hits exactly
//!   `buf + 4i` in order, and the list walk loads each node's two fields in order;
//! - the bench's sqlite3 (`tests::bench_sqlite`) on a 150-row script: also, at every
//!   RIP-relative site (globals, found by objdump), the multiset of effective addresses
//!   minus the load bias equals lackey's (heap and stack addresses differ under valgrind);
//! - differential: access runs (the default) and `--no-batch` give equal per-thread
//!   sequences of (site, address, read/write, size), both run without address
//!   randomisation (`setarch -R`); heap addresses are compared from the heap's start,
//!   which follows the end of each binary's image.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::bench_sqlite::{bench_sqlite3, sqlite_script};
use tests::lackey::{LackeyTrace, entry_and_image_end, have_valgrind, lackey_bias, lackey_trace};
use tests::*;
use tracer_common::meta::{Metadata, SiteKind};
use tracer_common::{FLAG_MEM_READ, FLAG_MEM_WRITE, mem_size};

/// Rewrite `orig` into `out`, every function's memory sites, coarse time.
fn rewrite_memory(orig: &Path, out: &Path, extra: &[&str]) -> (Metadata, String) {
    let mut c = Command::new(rewriter_bin());
    c.arg(orig)
        .arg("-o")
        .arg(out)
        .args(["--sites", "memory", "--time", "coarse", "-v"])
        .args(extra);
    let o = run(&mut c, RUN_TIMEOUT).ok();
    let line = o
        .stdout_str()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    (metadata(out), line)
}

/// What `tracer dump` showed of a memory trace, access by access.
#[derive(Default)]
struct Accesses {
    per_site: HashMap<u32, u64>,
    total: u64,
    /// `aux - vaddr` of the lines carrying an instruction address (all equal).
    bias: Option<u64>,
}

impl Accesses {
    fn add(&mut self, r: &Rec, meta: &Metadata, what: &str) {
        let site = meta
            .sites
            .get(r.site as usize)
            .unwrap_or_else(|| panic!("{what}: no site {} in the metadata: {r:?}", r.site));
        assert_eq!(
            site.kind,
            SiteKind::Memory,
            "{what}: not a memory site: {r:?}"
        );
        *self.per_site.entry(r.site).or_default() += 1;
        self.total += 1;
        if r.aux != 0 {
            let b = r.aux.wrapping_sub(site.vaddr);
            assert_eq!(*self.bias.get_or_insert(b), b, "{what}: aux of {r:?}");
        }
    }
}

/// 0 lost and the books balance (`tracer report --json`).
fn check_books(trace: &Path, what: &str) -> u64 {
    let rep = report(trace);
    let books = &rep.raw["books"];
    assert_eq!(rep.dropped, 0, "{what}: dropped");
    assert_eq!(books["balanced"], true, "{what}: books {books}");
    assert_eq!(books["dropped"], 0, "{what}: books {books}");
    assert_eq!(
        books["produced"], books["delivered"],
        "{what}: books {books}"
    );
    rep.records
}

/// Per memory site, utrace's accesses equal lackey's executions. Returns (sites compared,
/// sites executed).
fn check_counts(
    meta: &Metadata,
    got: &Accesses,
    lackey: &LackeyTrace,
    what: &str,
) -> (usize, usize) {
    let mut bad = Vec::new();
    let (mut sites, mut executed) = (0, 0);
    for s in meta.sites.iter().filter(|s| s.kind == SiteKind::Memory) {
        sites += 1;
        let u = got.per_site.get(&s.id).copied().unwrap_or(0);
        let l = lackey.executions.get(&s.vaddr).copied().unwrap_or(0);
        executed += usize::from(l > 0);
        if u != l {
            bad.push(format!(
                "site {} {} at {:#x} ({:?}): utrace {u}, lackey {l}",
                s.id, s.name, s.vaddr, s.mode
            ));
        }
    }
    let lackey_total: u64 = lackey.executions.values().sum();
    assert!(
        bad.is_empty(),
        "{what}: {} of {sites} memory sites differ from lackey (accesses: utrace {}, lackey {lackey_total}):\n  {}",
        bad.len(),
        got.total,
        bad.iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    assert_eq!(got.total, lackey_total, "{what}: total accesses");
    (sites, executed)
}

/// The value after `key ` on the line of `out` starting with it, as an address.
fn printed(out: &str, key: &str) -> Vec<u64> {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no line {key:?} in {out:?}"));
    line.split_whitespace()
        .map(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).unwrap())
        .collect()
}

/// memwalk's output without its first two lines (addresses differ run to run).
fn tail(out: &str) -> String {
    out.lines().skip(2).collect::<Vec<_>>().join("\n")
}

fn build_memwalk(tmp: &TempDir) -> PathBuf {
    let orig = tmp.join("memwalk");
    compile(
        "gcc",
        &[fixture("memwalk.c")],
        &["-O2", "-g", "-fno-tree-vectorize"],
        &orig,
    );
    orig
}

#[test]
fn memwalk_accesses_match_lackey() {
    memwalk_case(&[], "memtrace memwalk gcc -O2");
}

/// The same with every site a uprobe (the eBPF `site` program computes the addresses).
#[test]
fn memwalk_uprobe_accesses_match_lackey() {
    memwalk_case(
        &["--force-uprobe"],
        "memtrace memwalk gcc -O2 --force-uprobe",
    );
}

fn memwalk_case(extra: &[&str], what: &str) {
    if !have_valgrind(what) {
        return;
    }
    let tmp = TempDir::new("memwalk");
    let orig = build_memwalk(&tmp);
    let (traced, trace) = (tmp.join("memwalk.traced"), tmp.join("t.utrace"));
    let (meta, line) = rewrite_memory(&orig, &traced, extra);
    let n = 1000u64;
    let ns = n.to_string();
    let want = run(Command::new(&orig).arg(&ns), RUN_TIMEOUT).ok();
    let out = tracer_record(&trace, &traced, &[&ns], &[]);
    assert_eq!(
        tail(&out.stdout_str()),
        tail(&want.stdout_str()),
        "{what}: output"
    );
    let (got, records) = check_memwalk_addresses(&trace, &meta, &out.stdout_str(), n, what);

    let bias = {
        let _g = tracing_lock();
        lackey_bias(&orig)
    };
    let watch = meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::Memory)
        .map(|s| (s.vaddr, false))
        .collect();
    let lackey = {
        let _g = tracing_lock();
        lackey_trace(&orig, &[&ns], bias, &watch)
    };
    assert_eq!(
        tail(&lackey.program.stderr_str()),
        tail(&want.stdout_str()),
        "{what}: output under lackey"
    );
    let (sites, executed) = check_counts(&meta, &got, &lackey, what);
    eprintln!(
        "{what}: {line}\n  {sites} memory sites ({executed} executed) equal to lackey; \
         {} accesses in {records} records; lackey bias {bias:#x}, {} instructions, {} data lines",
        got.total, lackey.instructions, lackey.data_lines
    );
}

/// memwalk's accesses from the dump: `buf[i] = i` stores exactly `buf + 4i` in order;
/// the walk loads each printed node's two fields in order. With 0 lost and balanced
/// books; returns the accesses and the records of the trace.
fn check_memwalk_addresses(
    trace: &Path,
    meta: &Metadata,
    stdout: &str,
    n: u64,
    what: &str,
) -> (Accesses, u64) {
    let buf = printed(stdout, "buf ")[0];
    let nodes = printed(stdout, "nodes ");
    let mut got = Accesses::default();
    let (mut fill, mut walk) = (Vec::new(), Vec::new());
    dump_each(trace, |r| {
        got.add(&r, meta, what);
        if &*r.symbol == "fill" && r.flags & FLAG_MEM_WRITE != 0 {
            fill.push(r.value);
        } else if &*r.symbol == "walk" {
            walk.push(r.value);
        }
    });
    let records = check_books(trace, what);
    let want_fill: Vec<u64> = (0..n).map(|i| buf + 4 * i).collect();
    assert_seq_eq(&fill, &want_fill, &format!("{what}: buf[i] = i stores"));
    // Each node: its ->v and ->next, in whichever order the compiler loads them.
    assert_eq!(walk.len(), 2 * nodes.len(), "{what}: walk loads {walk:#x?}");
    for (k, (pair, node)) in walk.chunks(2).zip(&nodes).enumerate() {
        let mut pair = pair.to_vec();
        pair.sort_unstable();
        assert_eq!(pair, [*node, node + 8], "{what}: loads of node {k}");
    }
    (got, records)
}

/// Link-time addresses of the instructions with a RIP-relative operand (`objdump -d`).
fn rip_relative(bin: &Path) -> Vec<u64> {
    if !skip::require("objdump", skip::runs("objdump"), "RIP-relative sites") {
        return Vec::new();
    }
    let mut c = Command::new("objdump");
    c.args(["-d", "--no-show-raw-insn"]).arg(bin);
    let mut found = Vec::new();
    run_streaming(&mut c, RUN_TIMEOUT, |l| {
        let l = String::from_utf8_lossy(l);
        if let Some((addr, insn)) = l.split_once(":\t")
            && insn.contains("(%rip)")
            && let Ok(a) = u64::from_str_radix(addr.trim(), 16)
        {
            found.push(a);
        }
    })
    .ok();
    found
}

/// The bench's sqlite3, its 150-row workload in `tmp`, and the arguments running it.
fn sqlite_case(tmp: &TempDir, what: &str) -> Option<(PathBuf, Vec<String>)> {
    let bin = bench_sqlite3(what)?;
    let sql = tmp.join("workload.sql");
    std::fs::write(&sql, sqlite_script(150)).unwrap();
    Some((
        bin,
        vec![":memory:".into(), format!(".read {}", sql.display())],
    ))
}

#[test]
fn sqlite_accesses_match_lackey() {
    let what = "memtrace bench sqlite3, 150 rows";
    if !have_valgrind(what) {
        return;
    }
    let tmp = TempDir::new("memtrace-sqlite");
    let Some((orig, args)) = sqlite_case(&tmp, what) else {
        return;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (traced, trace) = (tmp.join("sqlite3.traced"), tmp.join("t.utrace"));
    let (meta, line) = rewrite_memory(&orig, &traced, &[]);
    let want = run(Command::new(&orig).args(&args), RUN_TIMEOUT).ok();
    let out = tracer_record(&trace, &traced, &args, &[]);
    assert_same_behaviour(what, &without_tracer_lines(&out), &want);

    let rip: std::collections::HashSet<u64> = rip_relative(&orig).into_iter().collect();
    let mem = || meta.sites.iter().filter(|s| s.kind == SiteKind::Memory);
    let rip_sites: HashMap<u32, u64> = mem()
        .filter(|s| rip.contains(&s.vaddr))
        .map(|s| (s.id, s.vaddr))
        .collect();
    let mut got = Accesses::default();
    // Per RIP-relative site, run-time effective address -> times.
    let mut eas: HashMap<u64, HashMap<u64, u64>> = HashMap::new();
    dump_each(&trace, |r| {
        got.add(&r, &meta, what);
        if let Some(v) = rip_sites.get(&r.site) {
            *eas.entry(*v).or_default().entry(r.value).or_default() += 1;
        }
    });
    let records = check_books(&trace, what);
    let ubias = got
        .bias
        .unwrap_or_else(|| panic!("{what}: no dump line carries an instruction address"));

    let lbias = {
        let _g = tracing_lock();
        lackey_bias(&orig)
    };
    let watch = mem().map(|s| (s.vaddr, rip.contains(&s.vaddr))).collect();
    let t0 = std::time::Instant::now();
    let lackey = {
        let _g = tracing_lock();
        lackey_trace(&orig, &args, lbias, &watch)
    };
    let lackey_s = t0.elapsed().as_secs_f64();
    assert_eq!(
        lackey.program.stderr, want.stdout,
        "{what}: output under lackey"
    );
    let (sites, executed) = check_counts(&meta, &got, &lackey, what);

    let compared = check_rip_addresses(&rip_sites, &eas, ubias, &lackey, what);
    eprintln!(
        "{what}: {line}\n  {sites} memory sites ({executed} executed) equal to lackey; \
         {} accesses in {records} records; {} RIP-relative sites executed, their {} \
         addresses equal to lackey's; lackey {lackey_s:.1} s, {} instructions, {} data lines",
        got.total, compared.0, compared.1, lackey.instructions, lackey.data_lines
    );
}

/// Per RIP-relative site (globals), the multiset of effective addresses minus the load
/// bias equals lackey's. Returns (sites compared, addresses compared).
fn check_rip_addresses(
    rip_sites: &HashMap<u32, u64>,
    eas: &HashMap<u64, HashMap<u64, u64>>,
    ubias: u64,
    lackey: &LackeyTrace,
    what: &str,
) -> (usize, u64) {
    let mut bad = Vec::new();
    let mut compared = (0usize, 0u64);
    for &vaddr in rip_sites.values() {
        let u: HashMap<u64, u64> = eas
            .get(&vaddr)
            .map(|m| m.iter().map(|(a, n)| (a.wrapping_sub(ubias), *n)).collect())
            .unwrap_or_default();
        let l = lackey.data.get(&vaddr).cloned().unwrap_or_default();
        if u.is_empty() && l.is_empty() {
            continue;
        }
        compared.0 += 1;
        compared.1 += u.values().sum::<u64>();
        if u != l {
            bad.push(format!("{vaddr:#x}: utrace {u:x?}, lackey {l:x?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} RIP-relative sites with other addresses than lackey's:\n  {}",
        bad.len(),
        bad.iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    compared
}

/// One access as the differential compares it: site, address (heap addresses from the
/// heap's start), read/write bits and size.
type Access = (u32, u64, u32);

/// Per thread (in order of first appearance), the accesses of a trace of `bin`.
fn accesses_by_thread(trace: &Path, bin: &Path, meta: &Metadata, what: &str) -> Vec<Vec<Access>> {
    let mut threads: Vec<(u32, Vec<Access>)> = Vec::new();
    let mut got = Accesses::default();
    dump_each(trace, |r| {
        got.add(&r, meta, what);
        let kind = r.flags & (FLAG_MEM_READ | FLAG_MEM_WRITE) | mem_size(r.flags) << 16;
        let i = match threads.iter().position(|t| t.0 == r.tid) {
            Some(i) => i,
            None => {
                threads.push((r.tid, Vec::new()));
                threads.len() - 1
            }
        };
        threads[i].1.push((r.site, r.value, kind));
    });
    let bias = got
        .bias
        .expect("no dump line carries an instruction address");
    // Without randomisation the heap (brk) starts at the page after the image.
    let heap = bias + entry_and_image_end(bin).1.next_multiple_of(4096);
    let norm = |v: u64| match v.checked_sub(heap) {
        Some(d) if d < 1 << 32 => (1 << 63) | d,
        _ => v,
    };
    threads
        .into_iter()
        .map(|(_, v)| v.into_iter().map(|(s, a, k)| (s, norm(a), k)).collect())
        .collect()
}

/// `setarch -R tracer record -o TRACE -- PROG ARGS`: no address randomisation.
fn record_fixed_layout(trace: &Path, prog: &Path, args: &[&str]) -> Out {
    let _g = tracing_lock();
    let mut c = Command::new("setarch");
    c.arg("-R")
        .arg(tracer_bin())
        .arg("record")
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(prog)
        .args(args)
        .env("UTRACE_DEBUG_CACHE", scratch_debug_cache());
    run(&mut c, TRACE_TIMEOUT).ok()
}

/// Batched and `--no-batch` rewrites of `orig`, each at `DIR/prog` (paths of one length:
/// the same stack layout), recorded; equal accesses per thread.
fn differential(tmp: &TempDir, orig: &Path, args: &[&str], what: &str) {
    let mut runs = Vec::new();
    for (dir, extra) in [("b", &[][..]), ("n", &["--no-batch"][..])] {
        std::fs::create_dir_all(tmp.join(dir)).unwrap();
        let prog = tmp.join(dir).join("prog");
        let trace = tmp.join(dir).join("t.utrace");
        let (meta, line) = rewrite_memory(orig, &prog, extra);
        let out = record_fixed_layout(&trace, &prog, args);
        check_books(&trace, what);
        let acc = accesses_by_thread(&trace, &prog, &meta, what);
        eprintln!(
            "{what} {extra:?}: {line}; {} accesses, size {}",
            acc.iter().map(Vec::len).sum::<usize>(),
            std::fs::metadata(&prog).unwrap().len()
        );
        runs.push((out.stdout, acc));
    }
    let (n, b) = (runs.pop().unwrap(), runs.pop().unwrap());
    assert_eq!(b.0, n.0, "{what}: output, batched and --no-batch");
    assert_eq!(b.1.len(), n.1.len(), "{what}: threads");
    for (k, (tb, tn)) in b.1.iter().zip(&n.1).enumerate() {
        assert_seq_eq(
            tb,
            tn,
            &format!("{what}: thread {k}, batched vs --no-batch"),
        );
    }
}

#[test]
fn batched_and_unbatched_accesses_are_equal() {
    if !skip::require("setarch", skip::runs("setarch"), "memtrace differential") {
        return;
    }
    let tmp = TempDir::new("memtrace-diff");
    let orig = build_memwalk(&tmp);
    differential(&tmp, &orig, &["1000"], "memtrace differential memwalk");
    let what = "memtrace differential bench sqlite3";
    let Some((sqlite, args)) = sqlite_case(&tmp, what) else {
        return;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tmp2 = TempDir::new("memtrace-diff-sqlite");
    differential(&tmp2, &sqlite, &args, what);
}
