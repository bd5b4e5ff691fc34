//! Every site kind at once: per-kind rewriter lines, rewriting with raw arguments,
//! choosing functions for a session, the records check, and the oracle per process.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tracer_common::meta::{Metadata, Site, SiteMode};
use tracer_common::{FLAG_INTERPOLATED, FLAG_UPROBE};

use crate::checks::{by_tid, check_times_monotonic};
use crate::command::Out;
use crate::dump::Rec;
use crate::oracle;
use crate::rewriter::{SiteCounts, function_symbol, metadata, parse_site_counts, rewriter};

/// The rewriter's per-kind lines (`  block  51 sites: 44 inline (86.27%), 7 uprobe`), in
/// the order printed.
pub fn parse_kind_counts(stdout: &str) -> Vec<(tracer_common::meta::SiteKind, SiteCounts)> {
    use tracer_common::meta::SiteKind;
    let kinds = [
        SiteKind::FunctionEntry,
        SiteKind::FunctionExit,
        SiteKind::Block,
        SiteKind::Memory,
    ];
    stdout
        .lines()
        .filter_map(|l| {
            let first = l.split_whitespace().next()?;
            let kind = kinds.iter().find(|k| k.name() == first)?;
            Some((*kind, parse_site_counts(l)?))
        })
        .collect()
}

/// Rewrite `input` into `output` with raw extra rewriter arguments (`--sites`, `--time`,
/// `--functions`...). Asserts what `rewrite` asserts, and that the per-kind lines agree
/// with the site table of the metadata. Returns the summary line's counts, the per-kind
/// counts, the metadata and the rewriter's stdout.
pub fn rewrite_args(
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> (
    SiteCounts,
    Vec<(tracer_common::meta::SiteKind, SiteCounts)>,
    Metadata,
    String,
) {
    let before = std::fs::read(input).unwrap();
    let mut args: Vec<&OsStr> = vec![input.as_os_str(), "-o".as_ref(), output.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    let out = rewriter(&args).ok();
    assert_eq!(
        std::fs::read(input).unwrap(),
        before,
        "the rewriter modified its input {}",
        input.display()
    );
    let stdout = out.stdout_str();
    let counts = parse_site_counts(&stdout)
        .unwrap_or_else(|| panic!("no `N sites: I inline, U uprobe` line: {}", out.describe()));
    let kinds = parse_kind_counts(&stdout);
    let meta = metadata(output);
    let tally = |k: Option<tracer_common::meta::SiteKind>| {
        let of_kind: Vec<&Site> = meta
            .sites
            .iter()
            .filter(|s| k.is_none_or(|k| s.kind == k))
            .collect();
        let count = |m: SiteMode| of_kind.iter().filter(|s| s.mode == m).count() as u64;
        SiteCounts {
            total: of_kind.len() as u64,
            inline: count(SiteMode::Inline),
            uprobe: count(SiteMode::Uprobe),
            untraced: count(SiteMode::Untraced),
        }
    };
    assert_eq!(
        tally(None),
        counts,
        "{}: the site table disagrees with the summary line:\n{stdout}",
        output.display()
    );
    for (k, c) in &kinds {
        assert_eq!(
            tally(Some(*k)),
            *c,
            "{}: {} sites of the site table vs the rewriter's line:\n{stdout}",
            output.display(),
            k.name()
        );
    }
    let listed: u64 = kinds.iter().map(|(_, c)| c.total).sum();
    assert_eq!(
        listed,
        counts.total,
        "{}: per-kind lines do not add up:\n{stdout}",
        output.display()
    );
    (counts, kinds, meta, stdout)
}

/// The functions of `meta` to rewrite for a session under `tracer record`: every
/// function whose sites are all inline, `extra`, and then the functions with the fewest
/// uprobe sites (by name within a count) while the uprobe sites stay within `budget`.
/// (The tracer detaches its uprobes one by one when the command ends, about 0.1 s each:
/// a few hundred uprobe sites cost minutes.) Returns the names and their uprobe sites.
pub fn functions_for_tracing(
    meta: &Metadata,
    extra: &[&str],
    budget: usize,
) -> (Vec<String>, usize) {
    let mut uprobes: HashMap<&str, usize> = HashMap::new();
    // Functions with a symbol only: `sub_<address>` ranges (.eh_frame functions of a
    // stripped library) hold hot internals that would flood the ring buffer.
    for s in meta.sites.iter().filter(|s| !s.name.starts_with("sub_")) {
        *uprobes.entry(&s.name).or_default() += usize::from(s.mode == SiteMode::Uprobe);
    }
    let mut names: Vec<&str> = uprobes
        .iter()
        .filter(|(n, u)| **u == 0 || extra.contains(n))
        .map(|(n, _)| *n)
        .collect();
    let mut used: usize = names.iter().map(|n| uprobes[n]).sum();
    let mut rest: Vec<(usize, &str)> = uprobes
        .iter()
        .filter(|(n, u)| **u > 0 && !extra.contains(n))
        .map(|(n, u)| (*u, *n))
        .collect();
    rest.sort_unstable();
    for (u, n) in rest {
        if used + u > budget {
            break;
        }
        used += u;
        names.push(n);
    }
    names.sort_unstable();
    (names.into_iter().map(String::from).collect(), used)
}

/// Records per kind of one binary's trace: (kind, inline records, uprobe records).
pub type KindRecords = Vec<(tracer_common::meta::SiteKind, u64, u64)>;

/// Checks the records of binary `binary` (its file name in `tracer dump`), rewritten
/// with every site kind (`meta`), in a trace of complete runs, and returns the records
/// per kind:
/// - a block record's value is its block's run-time address (same load bias for every
///   record of a process), aux 0; a memory record's aux is its instruction's run-time
///   address; an inline memory record says read and/or write and a size of 1..=64 bytes
///   (a uprobe memory record's value and flags are not checked: the eBPF program does
///   not compute effective addresses yet);
/// - per thread, every entry of a function is immediately followed by its first block
///   (the block at the function's lowest address), so that block's count equals the
///   entry count;
/// - a function never has more exit records than entries;
/// - inline `record`-mode times do not go backwards within a thread; in `coarse` mode
///   every inline record's time is interpolated (flag 0x100).
pub fn check_all_kinds_records(
    recs: &[Rec],
    binary: &str,
    meta: &Metadata,
    coarse: bool,
    what: &str,
) -> KindRecords {
    use tracer_common::meta::SiteKind;
    let sites: HashMap<u32, &Site> = meta.sites.iter().map(|s| (s.id, s)).collect();
    // The first block of each function: the first at or after its entry (a split-off
    // `.cold` part has the function's name and may lie below it).
    let entry_at: HashMap<&str, u64> = meta
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::FunctionEntry)
        .map(|s| (s.name.as_str(), s.vaddr))
        .collect();
    let mut first_block: HashMap<&str, &Site> = HashMap::new();
    for s in meta.sites.iter().filter(|s| s.kind == SiteKind::Block) {
        if entry_at.get(s.name.as_str()).is_some_and(|&e| s.vaddr < e) {
            continue;
        }
        let e = first_block.entry(&s.name).or_insert(s);
        if s.vaddr < e.vaddr {
            *e = s;
        }
    }
    let recs: Vec<&Rec> = recs.iter().filter(|r| &*r.binary == binary).collect();
    let mut bias: HashMap<u32, u64> = HashMap::new();
    let mut per_kind: HashMap<SiteKind, (u64, u64)> = HashMap::new();
    let mut count: HashMap<u32, u64> = HashMap::new();
    for r in &recs {
        let s = sites
            .get(&r.site)
            .unwrap_or_else(|| panic!("{what}: record of an unknown site: {r:?}"));
        assert_eq!(&*r.symbol, s.name, "{what}: symbol of {r:?}");
        *count.entry(r.site).or_default() += 1;
        let uprobe = r.flags & FLAG_UPROBE != 0;
        assert_eq!(
            uprobe,
            s.mode == SiteMode::Uprobe,
            "{what}: {r:?} from a {:?} site",
            s.mode
        );
        let k = per_kind.entry(s.kind).or_default();
        if uprobe {
            k.1 += 1;
        } else {
            k.0 += 1;
        }
        if coarse && !uprobe {
            assert!(
                r.flags & FLAG_INTERPOLATED != 0,
                "{what}: coarse record without an interpolated time: {r:?}"
            );
        }
        let Some(pc) = run_time_pc(r, s, uprobe, what) else {
            continue;
        };
        let b = *bias.entry(r.pid).or_insert(pc.wrapping_sub(s.vaddr));
        assert_eq!(
            pc.wrapping_sub(b),
            s.vaddr,
            "{what}: run-time address of {r:?} (site at {:#x}, load bias {b:#x})",
            s.vaddr
        );
    }
    for (tid, rs) in by_tid(recs.iter().copied()) {
        for (i, r) in rs.iter().enumerate() {
            let s = sites[&r.site];
            if s.kind != SiteKind::FunctionEntry {
                continue;
            }
            let Some(fb) = first_block.get(&*s.name) else {
                continue;
            };
            let next = rs.get(i + 1);
            assert!(
                next.is_some_and(|n| n.site == fb.id),
                "{what}: tid {tid}: entry of {} (record {i}) not followed by its first block (site {} at {:#x}) but by {next:?}",
                s.name,
                fb.id,
                fb.vaddr
            );
        }
        if !coarse {
            check_times_monotonic(&rs, &format!("{what}: tid {tid}"));
        }
    }
    check_entry_counts(meta, &count, &first_block, what);
    let mut v: KindRecords = per_kind.into_iter().map(|(k, (i, u))| (k, i, u)).collect();
    v.sort_unstable();
    v
}

/// The run-time address a block or memory record carries (None for other kinds), its
/// block aux and inline memory flags checked.
fn run_time_pc(r: &Rec, s: &Site, uprobe: bool, what: &str) -> Option<u64> {
    use tracer_common::meta::SiteKind;
    use tracer_common::{FLAG_MEM_READ, FLAG_MEM_WRITE, mem_size};
    match s.kind {
        SiteKind::Block => {
            assert_eq!(r.aux, 0, "{what}: aux of block record {r:?}");
            Some(r.value)
        }
        SiteKind::Memory => {
            if !uprobe {
                let size = mem_size(r.flags);
                assert!(
                    r.flags & (FLAG_MEM_READ | FLAG_MEM_WRITE) != 0 && (1..=64).contains(&size),
                    "{what}: memory record without access kind or size (flags {:#x}) from site {} at {:#x} of {}: {r:?}",
                    r.flags,
                    s.id,
                    s.vaddr,
                    s.name
                );
            }
            Some(r.aux)
        }
        _ => None,
    }
}

/// Per function: its first block ran as often as it was entered, and it never has more
/// exits than entries.
fn check_entry_counts(
    meta: &Metadata,
    count: &HashMap<u32, u64>,
    first_block: &HashMap<&str, &Site>,
    what: &str,
) {
    use tracer_common::meta::SiteKind;
    let mut entries: HashMap<&str, u64> = HashMap::new();
    let mut exits: HashMap<&str, u64> = HashMap::new();
    for s in &meta.sites {
        let c = count.get(&s.id).copied().unwrap_or(0);
        match s.kind {
            SiteKind::FunctionEntry => *entries.entry(&s.name).or_default() += c,
            SiteKind::FunctionExit => *exits.entry(&s.name).or_default() += c,
            _ => {}
        }
    }
    for (f, e) in &entries {
        if let Some(fb) = first_block.get(f) {
            let b = count.get(&fb.id).copied().unwrap_or(0);
            assert_eq!(
                b, *e,
                "{what}: {f}: {b} records of the first block, {e} entries"
            );
        }
        let x = exits.get(f).copied().unwrap_or(0);
        assert!(x <= *e, "{what}: {f}: {x} exits but {e} entries");
    }
}

/// The oracle (`oracle::run_with_probes_at`) for a single-threaded command, keeping
/// only the events of that command's process: kernel uprobes fire in every process
/// that maps the probed file, e.g. in the original library run by another test at the
/// same time. The command runs as `bash -c 'echo $$ > PIDFILE; exec -a ARGV0 PROG
/// ARGS...'` in `dir`, with `env`.
pub fn oracle_own_process(
    probes: &[(&Path, String, u64)],
    (prog, argv0, args): (&Path, &str, &[String]),
    dir: &Path,
    env: &[(&str, &OsStr)],
    timeout: Duration,
) -> (Out, Vec<oracle::Event>) {
    static N: AtomicU32 = AtomicU32::new(0);
    let pidfile = dir.join(format!(
        "oracle-{}-{}.pid",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(r#"echo $$ > "$0" && exec -a "$1" "${@:2}""#)
        .arg(&pidfile)
        .arg(argv0)
        .arg(prog)
        .args(args)
        .current_dir(dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let (out, events) = oracle::run_with_probes_at(probes, &mut c, timeout);
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}: {}", pidfile.display(), out.describe()));
    let _ = std::fs::remove_file(&pidfile);
    (out, events.into_iter().filter(|e| e.tid == pid).collect())
}

/// `oracle_counts` (entries per function, every probed function present) through
/// `oracle_own_process`.
pub fn oracle_counts_own(
    probes: &[(&Path, &str)],
    cmd: (&Path, &str, &[String]),
    dir: &Path,
    env: &[(&str, &OsStr)],
    timeout: Duration,
) -> (Out, HashMap<String, u64>) {
    let at: Vec<(&Path, String, u64)> = probes
        .iter()
        .map(|(bin, sym)| {
            let off = function_symbol(bin, sym)
                .file_off
                .unwrap_or_else(|| panic!("{sym} in {} is not in a loaded segment", bin.display()));
            (*bin, sym.to_string(), off)
        })
        .collect();
    let (out, events) = oracle_own_process(&at, cmd, dir, env, timeout);
    let mut counts: HashMap<String, u64> = probes.iter().map(|p| (p.1.to_string(), 0)).collect();
    for e in &events {
        *counts.entry(e.symbol.clone()).or_default() += 1;
    }
    (out, counts)
}
