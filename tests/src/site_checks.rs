//! Checks of what memory and USDT sites record, shared by the tests of inline stubs and
//! of uprobe sites (which must record the same): the array accesses of
//! `fixtures/memtrace.c` and the probe arguments of `fixtures/usdt.c` against what the
//! fixtures print.

use std::collections::HashMap;

use tracer_common::meta::{Metadata, SiteKind, SiteMode};
use tracer_common::{
    FLAG_MEM_READ, FLAG_MEM_WRITE, FLAG_USDT_INDEX_SHIFT, FLAG_USDT_MORE, mem_size,
};

use crate::checks::assert_seq_eq;
use crate::dump::Rec;

/// The `name address` pairs of the first line memtrace prints.
pub fn printed_addresses(stdout: &str) -> HashMap<String, u64> {
    let first = stdout.lines().next().unwrap_or_default();
    let words: Vec<&str> = first.split_whitespace().collect();
    words
        .chunks(2)
        .filter_map(|kv| {
            let v = u64::from_str_radix(kv.get(1)?.trim_start_matches("0x"), 16).ok()?;
            Some((kv[0].to_string(), v))
        })
        .collect()
}

/// The memory records of function `f` that touch `[base, base + n * elem)`: per
/// element, in order, the bytes read and written must be exactly `rw(i)`.
pub fn check_array(
    recs: &[&Rec],
    f: &str,
    (base, elem, n): (u64, u64, u64),
    rw: impl Fn(u64) -> (u64, u64),
    what: &str,
) {
    let mut per: Vec<(u64, u64)> = vec![(0, 0); n as usize];
    let mut last = 0u64;
    let mut seen = 0;
    for r in recs.iter().filter(|r| &*r.symbol == f) {
        if r.value < base || r.value >= base + n * elem {
            continue;
        }
        seen += 1;
        let i = (r.value - base) / elem;
        assert!(
            i >= last,
            "{what}: {f}: element {i} after element {last} ({r:?})"
        );
        last = i;
        let size = u64::from(mem_size(r.flags));
        assert!(
            r.value + size <= base + (i + 1) * elem,
            "{what}: {f}: access crosses elements: {r:?}"
        );
        if r.flags & FLAG_MEM_READ != 0 {
            per[i as usize].0 += size;
        }
        if r.flags & FLAG_MEM_WRITE != 0 {
            per[i as usize].1 += size;
        }
        assert!(
            r.flags & (FLAG_MEM_READ | FLAG_MEM_WRITE) != 0,
            "{what}: {f}: no access kind: {r:?}"
        );
    }
    assert!(seen > 0, "{what}: {f}: no record touches its array");
    for (i, &(r, w)) in per.iter().enumerate() {
        assert_eq!(
            (r, w),
            rw(i as u64),
            "{what}: {f}: bytes (read, written) of element {i}"
        );
    }
}

/// Every array access of memtrace.c's functions, element by element (a
/// read-modify-write is one instruction on x86-64, a load and a store on AArch64: the
/// same bytes). `addr`: [`printed_addresses`] of the run; `n`: its argument.
pub fn check_memtrace(recs: &[&Rec], addr: &HashMap<String, u64>, n: u64, what: &str) {
    let a = |name: &str, elem: u64| (addr[name], elem, n);
    check_array(recs, "store8", a("g8", 1), |_| (0, 1), what);
    check_array(recs, "store16", a("g16", 2), |_| (0, 2), what);
    check_array(recs, "store32", a("g32", 4), |_| (0, 4), what);
    check_array(recs, "store64", a("g64", 8), |_| (0, 8), what);
    check_array(recs, "load64", a("g64", 8), |_| (8, 0), what);
    check_array(recs, "rmw32", a("g32", 4), |_| (4, 4), what);
    // copy128: element i-1 is read whole and element i written whole, for i >= 1.
    check_array(
        recs,
        "copy128",
        a("g128", 16),
        |i| (if i + 1 < n { 16 } else { 0 }, if i > 0 { 16 } else { 0 }),
        what,
    );
    check_array(recs, "tls_sum", a("tls", 8), |_| (8, 8), what);
}

/// The report's memory section (`report --json`'s `memory`) against a count of the
/// dump's memory records (`recs`: every record of the trace, all of memory sites):
/// totals, reads/writes/modifies, accesses and bytes of the listed sites and
/// functions, the hottest lines and pages (their counts: ties may order differently).
/// With `n` elements at -O2, memtrace's known loops too.
pub fn check_memory_section(memory: &serde_json::Value, recs: &[&Rec], n: Option<u64>, what: &str) {
    let num = |v: &serde_json::Value, k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("{what}: no {k} in {v}"))
    };
    let mut sites: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut functions: HashMap<&str, u64> = HashMap::new();
    let (mut lines, mut pages) = (HashMap::new(), HashMap::new());
    let mut kinds = [0u64; 3];
    for r in recs {
        let size = u64::from(mem_size(r.flags));
        let s = sites.entry(r.site).or_default();
        s.0 += 1;
        s.1 += size;
        *functions.entry(&*r.symbol).or_default() += size;
        *lines.entry((r.pid, r.value >> 6)).or_insert(0u64) += 1;
        *pages.entry((r.pid, r.value >> 12)).or_insert(0u64) += 1;
        let (rd, wr) = (r.flags & FLAG_MEM_READ != 0, r.flags & FLAG_MEM_WRITE != 0);
        kinds[if rd && wr {
            2
        } else if wr {
            1
        } else {
            0
        }] += 1;
    }
    let total: u64 = sites.values().map(|s| s.1).sum();
    assert_eq!(
        num(memory, "accesses"),
        recs.len() as u64,
        "{what}: accesses"
    );
    assert_eq!(num(memory, "bytes"), total, "{what}: bytes");
    let got = [
        num(memory, "reads"),
        num(memory, "writes"),
        num(memory, "modifies"),
    ];
    assert_eq!(got, kinds, "{what}: reads, writes, modifies");
    let listed = memory["sites"].as_array().expect("memory.sites");
    assert_eq!(listed.len(), sites.len().min(20), "{what}: sites listed");
    for s in listed {
        let site = num(s, "site") as u32;
        assert_eq!(
            (num(s, "accesses"), num(s, "bytes")),
            sites[&site],
            "{what}: site {s}"
        );
    }
    let mut hot: Vec<u64> = sites.values().map(|s| s.0).collect();
    hot.sort_unstable_by(|a, b| b.cmp(a));
    let got: Vec<u64> = listed.iter().map(|s| num(s, "accesses")).collect();
    assert_eq!(got, hot[..listed.len()], "{what}: the hottest sites");
    for f in memory["functions"].as_array().expect("memory.functions") {
        let name = f["function"].as_str().unwrap_or_default();
        assert_eq!(num(f, "bytes"), functions[name], "{what}: function {f}");
    }
    for (key, counts) in [("lines", &lines), ("pages", &pages)] {
        let mut hot: Vec<u64> = counts.values().copied().collect();
        hot.sort_unstable_by(|a, b| b.cmp(a));
        let spots = memory[key].as_array().expect("memory lines/pages");
        for h in spots {
            let k = (
                num(h, "pid") as u32,
                num(h, "address") >> if key == "lines" { 6 } else { 12 },
            );
            assert_eq!(num(h, "accesses"), counts[&k], "{what}: {key} {h}");
        }
        let got: Vec<u64> = spots.iter().map(|h| num(h, "accesses")).collect();
        assert_eq!(got, hot[..spots.len().min(10)], "{what}: the hottest {key}");
    }
    if let Some(n) = n {
        // One instruction per element: bytes are element sizes times n (copy128 moves
        // n - 1 elements of 16 twice; tls_sum is left out: it also reads its thread
        // pointer, `mov %fs:0`).
        let want = [
            ("store8", n),
            ("store16", 2 * n),
            ("store32", 4 * n),
            ("store64", 8 * n),
            ("load64", 8 * n),
            ("rmw32", 4 * n),
            ("copy128", 32 * (n - 1)),
        ];
        for (f, bytes) in want {
            assert_eq!(functions.get(f).copied(), Some(bytes), "{what}: {f} bytes");
        }
        assert_eq!(
            num(memory, "modifies"),
            n,
            "{what}: rmw32's adds are the modifies"
        );
    }
}

/// The functions of memtrace.c whose accesses [`check_memtrace`] checks.
pub const MEMTRACE_FUNCTIONS: [&str; 8] = [
    "store8", "store16", "store32", "store64", "load64", "rmw32", "copy128", "tls_sum",
];

/// One USDT probe event: its name and arguments (value/aux of its records, in order).
#[derive(Debug)]
pub struct UsdtEvent {
    pub probe: String,
    pub args: Vec<u64>,
    pub mode: SiteMode,
}

/// The probe events of a trace of USDT sites: argument records joined to the record
/// before them (same site, in order), arguments cut to the probe's count, every probe
/// with at least that many.
pub fn usdt_events(recs: &[Rec], meta: &Metadata) -> Vec<UsdtEvent> {
    let mut out: Vec<UsdtEvent> = Vec::new();
    for r in recs {
        let site = &meta.sites[r.site as usize];
        assert_eq!(site.kind, SiteKind::Usdt, "{r:?}");
        if r.flags & FLAG_USDT_MORE != 0 {
            let e = out
                .last_mut()
                .expect("an argument record with no probe record before it");
            assert_eq!(
                e.probe, site.name,
                "argument record of another probe: {r:?}"
            );
            let k = (r.flags >> FLAG_USDT_INDEX_SHIFT) as usize;
            assert_eq!(
                e.args.len(),
                2 * (k + 1),
                "argument record out of order: {r:?}"
            );
            e.args.extend([r.value, r.aux]);
        } else {
            out.push(UsdtEvent {
                probe: site.name.clone(),
                args: vec![r.value, r.aux],
                mode: site.mode,
            });
        }
    }
    for e in &mut out {
        let n = meta.sites.iter().find(|s| s.name == e.probe).unwrap().nargs as usize;
        assert!(e.args.len() >= n, "{e:?}: {n} arguments expected");
        e.args.truncate(n);
    }
    out
}

/// The events usdt.c's stdout announces (each probe prints its values first).
fn usdt_expected(stdout: &str) -> Vec<(String, Vec<i64>)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with("utrace:"))
        .map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next().unwrap().to_string();
            let mut v: Vec<i64> = w.map(|x| x.parse().unwrap()).collect();
            if name == "start" {
                v.clear();
            }
            (format!("fx:{name}"), v)
        })
        .collect()
}

/// The probe sequence and every argument against usdt.c's stdout (fx:ptr3's pointer,
/// printed as an offset from g_table, compared as offsets from its first value).
pub fn check_usdt_events(what: &str, evs: &[UsdtEvent], stdout: &str) {
    let want = usdt_expected(stdout);
    let names: Vec<&str> = evs.iter().map(|e| e.probe.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    assert_seq_eq(&names, &want_names, &format!("{what}: probe sequence"));
    let mut ptr0: Option<(u64, i64)> = None;
    for (e, (name, vals)) in evs.iter().zip(&want) {
        assert_eq!(e.args.len(), vals.len(), "{what}: {name} arguments: {e:?}");
        for (i, (&got, &w)) in e.args.iter().zip(vals).enumerate() {
            if name == "fx:ptr3" && i == 0 {
                let (p0, o0) = *ptr0.get_or_insert((got, w));
                assert_eq!(
                    got.wrapping_sub(p0) as i64,
                    w - o0,
                    "{what}: {name} pointer"
                );
                continue;
            }
            assert_eq!(got as i64, w, "{what}: {name} argument {}: {e:?}", i + 1);
        }
    }
}
