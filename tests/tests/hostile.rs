//! Hostile input: a traced process that corrupts its own RW area (slot spans, start/end,
//! rw_base, key, index, records) cannot crash the tracer or make it write anything but
//! its trace file, and damaged trace files give `report`/`dump` a readable prefix or a
//! one-line error, never a panic (exit 101), a signal or a hang.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tests::own_slot::{build_rec_only, tag_value, values_in};
use tests::*;
use tracer_common::CHUNK_RECORDS;

// Value ranges and tags of tests/fixtures/hostile.c.
const GOOD_BASE: u64 = 0x60_0d00_0000;
const GOOD_N: u64 = 200;
const AFTER_BASE: u64 = 0xaf_7e00_0000;
const AFTER_N: u64 = 100;
const THREAD_BASE: u64 = 0x7e_ad00_0000;
const THREAD_N: u64 = 10;
const STUB_BASE: u64 = 0x57_ab00_0000;
const GARBAGE_SEED: u64 = 0x5eed_1234_abcd;
const GARBAGE_N: usize = 40;
/// Fixture cases in mode "all".
const CASES: usize = 20;

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The fixture's "garbage_records" case: (site, flags, value, aux) of each record.
fn garbage_records() -> Vec<(u32, u32, u64, u64)> {
    let mut s = GARBAGE_SEED;
    (0..GARBAGE_N)
        .map(|_| {
            let a = splitmix(&mut s);
            let _time = splitmix(&mut s);
            let (value, aux) = (splitmix(&mut s), splitmix(&mut s));
            (a as u32, (a >> 32) as u32, value, aux)
        })
        .collect()
}

/// hostile.c compiled and rewritten (only `rec`, 64-record buffers), and the address
/// of its flush function as the fixture's argument.
fn build_hostile(tmp: &TempDir) -> (PathBuf, String) {
    let (traced, flush, meta) = build_rec_only(tmp, "hostile", "64");
    assert!(
        meta.sites
            .iter()
            .any(|s| s.name == "rec" && s.mode == SiteMode::Inline),
        "rec has no inline site: {:?}",
        meta.sites
    );
    (traced, flush)
}

fn tracer(args: &[&std::ffi::OsStr]) -> Out {
    let mut c = Command::new(tracer_bin());
    c.args(args);
    run(&mut c, Duration::from_secs(60))
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn hostile_process() {
    let tmp = TempDir::new("hostile");
    let (traced, flush) = build_hostile(&tmp);
    // The fixture itself, untraced: its output is what the traced run must print.
    let want = run(Command::new(&traced).args(["all", &flush]), RUN_TIMEOUT).ok();
    assert!(
        want.stdout_str()
            .ends_with(&format!("hostile: {CASES} cases\n")),
        "{}",
        want.describe()
    );

    let outdir = tmp.join("out");
    std::fs::create_dir(&outdir).unwrap();
    let trace = outdir.join("T");
    let t0 = Instant::now();
    let out = tracer_record(&trace, &traced, &["all", &flush], &[]);
    eprintln!("record: {:?}", t0.elapsed());
    assert_eq!(out.status(), 0, "{}", out.describe());
    assert_eq!(out.stdout_str(), want.stdout_str(), "{}", out.describe());
    let mode = std::fs::metadata(&trace).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "trace file mode {mode:o}");
    assert_eq!(names_in(&outdir), ["T"], "files next to the trace");

    for args in [&["report"][..], &["report", "--json"], &["dump"]] {
        let mut a: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
        a.push(trace.as_os_str());
        let o = tracer(&a);
        assert_eq!(o.code, Some(0), "{}", o.describe());
    }
    let recs = dump(&trace);
    let rep = report(&trace);
    check_report_matches_dump(&rep, &recs);
    // Failed drains on the flush path alone: cur_far, cur_before_start, cur_misaligned,
    // span_unmapped, span_kernel (3), start_garbage (2), span_huge, span_partial,
    // slot_not_paged, stub_bad_start (2), stub_unreadable_start. The exit drains add
    // more (the worker, the main thread, the fake RW area).
    let read_errors = rep.raw["read_errors"].as_u64().unwrap();
    assert!(read_errors >= 15, "read_errors {read_errors}: {}", rep.raw);

    let pid = recs
        .iter()
        .find(|r| r.value == GOOD_BASE)
        .expect("first record")
        .pid;
    let main: Vec<&Rec> = recs.iter().filter(|r| r.tid == pid).collect();
    let rec_main: Vec<&Rec> = main
        .iter()
        .copied()
        .filter(|r| &*r.symbol == "rec")
        .collect();
    // Records written before each corruption arrive exactly once, in order.
    assert_seq_eq(
        &values_in(&rec_main, GOOD_BASE, GOOD_N),
        &(0..GOOD_N).collect::<Vec<_>>(),
        "records before the corruption",
    );
    assert_seq_eq(
        &values_in(&rec_main, AFTER_BASE, AFTER_N),
        &(0..AFTER_N).collect::<Vec<_>>(),
        "records after the slot was restored",
    );
    // Through the stub: only key_garbage's record (in the slot it registered anew);
    // the others went to flushes whose spans were rejected.
    assert_eq!(values_in(&rec_main, STUB_BASE, 4), [3], "stub-path records");
    let worker: Vec<&Rec> = recs.iter().filter(|r| r.tid != pid).collect();
    assert!(worker.iter().all(|r| r.pid == pid && &*r.symbol == "rec"));
    assert_seq_eq(
        &values_in(&worker, THREAD_BASE, THREAD_N),
        &(0..THREAD_N).collect::<Vec<_>>(),
        "worker records flushed before its slot was corrupted",
    );
    assert_eq!(worker.len() as u64, THREAD_N, "worker records");

    // Tagged records (site 0x7fff0000|tag: not a site of the binary): delivered where
    // the span was readable, whole or up to the unreadable page, and never elsewhere.
    let mut tagged: HashMap<u64, Vec<&Rec>> = HashMap::new();
    for r in &main {
        if r.value >> 48 == 0x7a9 {
            tagged.entry((r.value >> 32) & 0xffff).or_default().push(r);
        }
    }
    let expect: HashMap<u64, u64> =
        [(8, CHUNK_RECORDS as u64), (9, 2), (10, 2), (11, 2), (13, 3)].into();
    let mut got: Vec<(u64, u64)> = tagged.iter().map(|(t, v)| (*t, v.len() as u64)).collect();
    got.sort();
    let mut want_tags: Vec<(u64, u64)> = expect.iter().map(|(t, n)| (*t, *n)).collect();
    want_tags.sort();
    assert_eq!(got, want_tags, "tagged records per case (tag, count)");
    for (tag, rs) in &tagged {
        for (i, r) in rs.iter().enumerate() {
            let v = tag_value(*tag, i as u64);
            assert_eq!(
                (r.site, &*r.symbol, r.value, r.aux, r.flags),
                (0x7fff_0000 | *tag as u32, "?", v, !v, 0),
                "tag {tag} record {i}"
            );
            // fake_slot names a binary id that is not in the trace.
            let bin = if *tag == 13 { "?" } else { "hostile.traced" };
            assert_eq!(&*r.binary, bin, "tag {tag} binary");
        }
    }

    // Random site ids, flags and values: delivered as they were, site unknown.
    let garbage: Vec<(u32, u32, u64, u64)> = main
        .iter()
        .filter(|r| &*r.symbol == "?" && r.value >> 48 != 0x7a9)
        .map(|r| (r.site, r.flags, r.value, r.aux))
        .collect();
    assert_eq!(garbage, garbage_records(), "garbage records");
    assert_eq!(
        recs.len() as u64,
        GOOD_N + AFTER_N + 1 + THREAD_N + CHUNK_RECORDS as u64 + 9 + GARBAGE_N as u64,
        "total records"
    );
    // The report lists unknown sites as such.
    for f in rep.raw["functions"].as_array().unwrap() {
        if f["symbol"] != "rec" {
            assert!(f["symbol"] == "?" && f["kind"] == "?", "{f}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Damaged trace files

/// (offset, kind, payload length) of each section of a trace file.
/// The section kind of record chunks (packed, format versions 3 and 4).
/// A packed chunk, and a group of them (formats 5 and 6: `u32 n`, `u32` 0, `n` headers,
/// the records of all).
const CHUNK: u32 = 7;
const GROUP: u32 = 9;

/// Where the chunk headers of the section at `off` of `kind` are (none: not chunks).
fn chunk_headers(b: &[u8], off: usize, kind: u32) -> Vec<usize> {
    match kind {
        CHUNK => vec![off + 16],
        GROUP => {
            let n = u32::from_le_bytes(b[off + 16..off + 20].try_into().unwrap()) as usize;
            (0..n).map(|i| off + 16 + 8 + 48 * i).collect()
        }
        _ => Vec::new(),
    }
}

/// The record count in the chunk header at `h`.
fn count_at(b: &[u8], h: usize) -> usize {
    u32::from_le_bytes(b[h + 4..h + 8].try_into().unwrap()) as usize
}

/// The records of the section at `off` of `kind` (0: not chunks).
fn chunk_count(b: &[u8], off: usize, kind: u32) -> usize {
    chunk_headers(b, off, kind)
        .into_iter()
        .map(|h| count_at(b, h))
        .sum()
}

fn sections(b: &[u8]) -> Vec<(usize, u32, usize)> {
    let mut v = Vec::new();
    let mut o = 16;
    while o + 16 <= b.len() {
        let kind = u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let len = u64::from_le_bytes(b[o + 8..o + 16].try_into().unwrap()) as usize;
        v.push((o, kind, len));
        o += 16 + len;
    }
    assert_eq!(o, b.len(), "the valid trace does not parse");
    v
}

/// Dump lines without the time column (a truncated file has no end anchor, so its
/// times are computed with the start calibration only).
fn timeless(dump: &str) -> Vec<String> {
    dump.lines()
        .map(|l| {
            let mut f: Vec<&str> = l.split('\t').collect();
            if f.len() == 9 {
                f.remove(7);
            }
            f.join("\t")
        })
        .collect()
}

struct Verdict {
    /// report --json, report, dump: each exit code
    codes: [i32; 3],
    errors: Vec<String>,
    dump: String,
    json: Option<serde_json::Value>,
}

/// Run the three readers on `path`: exit 0 or 1, never a panic, signal or hang; on 1,
/// stderr ends with one `tracer: error: ` line.
fn read_all(path: &Path, what: &str) -> Verdict {
    let mut v = Verdict {
        codes: [0; 3],
        errors: Vec::new(),
        dump: String::new(),
        json: None,
    };
    let cmds: [&[&str]; 3] = [&["report", "--json"], &["report"], &["dump"]];
    for (i, args) in cmds.iter().enumerate() {
        let mut c = Command::new(tracer_bin());
        c.args(*args).arg(path).env("RUST_BACKTRACE", "0");
        let o = run(&mut c, Duration::from_secs(20));
        let code = o.code.unwrap_or_else(|| panic!("{what}: {}", o.describe()));
        assert!(code == 0 || code == 1, "{what}: {}", o.describe());
        let stderr = o.stderr_str();
        assert!(!stderr.contains("panicked"), "{what}: {}", o.describe());
        if code == 1 {
            let last = stderr.lines().last().unwrap_or_default();
            assert!(
                last.starts_with("tracer: error: ") && stderr.matches("tracer: error").count() == 1,
                "{what}: {}",
                o.describe()
            );
            assert!(o.stdout.is_empty() || i == 2, "{what}: {}", o.describe());
            v.errors.push(last["tracer: error: ".len()..].to_string());
        } else if i == 0 {
            v.json = Some(
                serde_json::from_slice(&o.stdout)
                    .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", o.describe())),
            );
        } else if i == 2 {
            v.dump = o.stdout_str();
        }
        v.codes[i] = code;
    }
    v
}

#[test]
fn damaged_trace_files() {
    let tmp = TempDir::new("hostile-files");
    let (traced, flush) = build_hostile(&tmp);
    let valid = tmp.join("valid.utrace");
    // A small trace with several chunks and random records in one of them.
    let out = tracer_record(&valid, &traced, &["garbage_records", &flush], &[]);
    assert_eq!(out.status(), 0, "{}", out.describe());
    let full = std::fs::read(&valid).unwrap();
    let secs = sections(&full);
    let kinds: Vec<u32> = secs.iter().map(|s| s.1).collect();
    assert_eq!(kinds.first(), Some(&1), "session first: {kinds:?}");
    // The stats, then the index (`SECTION_INDEX`, 11) ends the file.
    assert_eq!(
        kinds[kinds.len().saturating_sub(2)..],
        [4, 11],
        "stats, index last: {kinds:?}"
    );
    let chunks: usize = secs
        .iter()
        .map(|&(o, k, _)| chunk_headers(&full, o, k).len())
        .sum();
    assert!(
        kinds.contains(&2) && chunks >= 4,
        "{chunks} chunks: {kinds:?}"
    );
    assert!(kinds.contains(&GROUP), "no chunk group: {kinds:?}");
    let base = read_all(&valid, "the valid trace");
    assert_eq!(base.codes, [0, 0, 0]);
    let base_dump = timeless(&base.dump);
    // GOOD + garbage + AFTER records.
    assert_eq!(
        base_dump.len(),
        GOOD_N as usize + GARBAGE_N + AFTER_N as usize
    );

    let t0 = Instant::now();
    let mut n = 0;
    let mut errors: HashMap<String, usize> = HashMap::new();
    let bad = tmp.join("bad.utrace");
    let mut check = |bytes: &[u8], what: &str| -> Verdict {
        std::fs::write(&bad, bytes).unwrap();
        let v = read_all(&bad, what);
        for e in &v.errors {
            // Error texts name the file; the rest says what is wrong.
            let e = e.replace(&*bad.to_string_lossy(), "FILE");
            let e: String = e
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect();
            *errors.entry(e).or_default() += 1;
        }
        n += 1;
        v
    };

    // Truncations at and around every section boundary: a readable prefix (the
    // records of the complete chunks and chunk groups before the cut), flagged as
    // truncated.
    let mut records_before = 0;
    for (i, &(off, kind, len)) in secs.iter().enumerate() {
        for cut in [off, off + 1, off + 8, off + 16, off + 16 + len / 2] {
            if cut >= full.len() {
                continue;
            }
            let what = format!("truncated at {cut} (section {i}, kind {kind})");
            let v = check(&full[..cut], &what);
            if cut == off && i == 0 {
                // Nothing but the file header: readable, and empty.
                assert_eq!(v.codes, [0, 0, 0], "{what}");
            }
            if v.codes[2] == 0 {
                assert_eq!(
                    timeless(&v.dump),
                    base_dump[..records_before],
                    "{what}: dump is not the prefix"
                );
            }
            if let Some(j) = &v.json {
                assert_eq!(j["records"], records_before, "{what}");
                assert_eq!(j["truncated"], cut != off, "{what}");
            }
            assert_eq!(v.codes, [0, 0, 0], "{what}: {:?}", v.errors);
        }
        records_before += chunk_count(&full, off, kind);
    }
    // Random cuts, bit flips and byte garbage from a fixed seed.
    let mut seed = 0xdead_beef_u64;
    for _ in 0..25 {
        // After the file header (cuts inside it are refused; "7 bytes" below), which
        // packed traces, small and of run-dependent length, can put a cut into.
        let cut = 16 + (splitmix(&mut seed) % (full.len() as u64 - 16)) as usize;
        let v = check(&full[..cut], &format!("truncated at {cut}"));
        assert_eq!(v.codes, [0, 0, 0], "truncated at {cut}: {:?}", v.errors);
    }
    let header_bytes: Vec<usize> = (0..16)
        .chain(secs.iter().flat_map(|&(o, _, _)| o..o + 16))
        .collect();
    for k in 0..60 {
        let mut b = full.clone();
        let at = if k % 2 == 0 {
            header_bytes[(splitmix(&mut seed) % header_bytes.len() as u64) as usize]
        } else {
            (splitmix(&mut seed) % b.len() as u64) as usize
        };
        let bit = splitmix(&mut seed) % 8;
        b[at] ^= 1 << bit;
        check(&b, &format!("bit {bit} of byte {at} flipped"));
    }
    // Every section with an absurd length, and lengths just at and over the limit.
    for (i, &(off, _, _)) in secs.iter().enumerate() {
        for len in [1u64 << 63, u64::MAX, (1 << 30) + 1, 1 << 30] {
            let mut b = full.clone();
            b[off + 8..off + 16].copy_from_slice(&len.to_le_bytes());
            let what = format!("section {i} of length {len:#x}");
            let v = check(&b, &what);
            if len > 1 << 30 {
                assert!(v.codes.contains(&1), "{what}: accepted");
            }
        }
    }
    // Chunks whose count disagrees with their payload.
    let chunk = *secs
        .iter()
        .find(|s| chunk_count(&full, s.0, s.1) > 1)
        .unwrap();
    let count_of_chunk = chunk_count(&full, chunk.0, chunk.1);
    let head = *chunk_headers(&full, chunk.0, chunk.1)
        .iter()
        .find(|&&h| count_at(&full, h) > 1)
        .unwrap();
    let count_at_head = count_at(&full, head) as u32;
    for count in [u32::MAX, count_at_head + 1, count_at_head - 1, 0] {
        let mut b = full.clone();
        b[head + 4..head + 8].copy_from_slice(&count.to_le_bytes());
        let what = format!("chunk count {count}");
        let v = check(&b, &what);
        assert_eq!(v.codes, [1, 1, 1], "{what}: accepted");
    }
    // A chunk shorter than its header, an unknown section kind (skipped), a chunk
    // before any binary section, the stats section twice.
    let (coff, clen) = (chunk.0, chunk.2);
    let mut b = full[..coff].to_vec();
    b.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&full[coff..]);
    assert_eq!(check(&b, "chunk of 8 bytes").codes, [1, 1, 1]);
    let mut b = full.clone();
    b[coff] = 77;
    let v = check(&b, "unknown section kind");
    assert_eq!(v.codes, [0, 0, 0], "{:?}", v.errors);
    assert_eq!(timeless(&v.dump).len(), base_dump.len() - count_of_chunk);
    let bin = secs.iter().find(|s| s.1 == 2).unwrap();
    let mut b = full[..bin.0].to_vec();
    b.extend_from_slice(&full[coff..coff + 16 + clen]);
    b.extend_from_slice(&full[bin.0..]);
    let v = check(&b, "chunk before the binary section");
    assert_eq!(v.codes, [0, 0, 0], "{:?}", v.errors);
    // An index that is not believed (its trailer's magic spoilt) reads the same; one
    // whose first entry lies about its section's length fails clearly or reads.
    let mut b = full.clone();
    let n = b.len();
    b[n - 1] ^= 1;
    let v = check(&b, "index trailer spoilt");
    assert_eq!(v.codes, [0, 0, 0], "{:?}", v.errors);
    assert_eq!(timeless(&v.dump), base_dump);
    let index = secs.iter().find(|s| s.1 == 11).unwrap();
    let mut b = full.clone();
    b[index.0 + 16 + 8] ^= 0x10;
    check(&b, "index entry of a wrong length");
    let stats = secs.iter().find(|s| s.1 == 4).unwrap();
    let mut b = full.clone();
    b.extend_from_slice(&full[stats.0..]);
    assert_eq!(check(&b, "stats twice").codes, [0, 0, 0]);
    // Binary sections with a garbage note (random bytes, huge note sizes) and a path
    // longer than the section: the first is readable (sites unknown), the others
    // name the problem.
    let (boff, blen) = (bin.0 + 16, bin.2);
    let path_len = u32::from_le_bytes(full[boff + 4..boff + 8].try_into().unwrap()) as usize;
    let note = boff + 16 + path_len;
    let mut b = full.clone();
    for x in &mut b[note..boff + blen] {
        *x = splitmix(&mut seed) as u8;
    }
    let v = check(&b, "binary section with a random note");
    assert_eq!(v.codes, [0, 0, 0], "{:?}", v.errors);
    assert!(
        timeless(&v.dump)
            .iter()
            .all(|l| l.split('\t').nth(4) == Some("?"))
    );
    let mut b = full.clone();
    b[note..note + 8].copy_from_slice(&[0xff; 8]);
    assert_eq!(check(&b, "note sizes 2^32-1").codes, [0, 0, 0]);
    let mut b = full.clone();
    b[boff + 4..boff + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(check(&b, "binary path too long").codes, [1, 1, 1]);
    // Session and stats JSON that does not parse.
    let stats_at = secs.iter().position(|s| s.1 == 4).unwrap();
    for (i, what) in [(0, "session"), (stats_at, "stats")] {
        let mut b = full.clone();
        b[secs[i].0 + 16] = b'#';
        assert!(check(&b, &format!("bad {what} JSON")).codes.contains(&1));
    }
    // Not trace files at all: empty, random bytes, a valid header then random bytes,
    // another version.
    assert_eq!(check(b"", "empty file").codes, [1, 1, 1]);
    let random: Vec<u8> = (0..4096).map(|_| splitmix(&mut seed) as u8).collect();
    assert_eq!(check(&random, "random bytes").codes, [1, 1, 1]);
    let mut b = full[..16].to_vec();
    b.extend_from_slice(&random);
    check(&b, "header then random bytes");
    let mut b = full.clone();
    b[8] = 7;
    assert_eq!(check(&b, "format version 7").codes, [1, 1, 1]);
    let mut b = full.clone();
    b[8] = 1;
    assert_eq!(check(&b, "format version 1").codes, [1, 1, 1]);
    let mut b = full.clone();
    b.truncate(7);
    assert_eq!(check(&b, "7 bytes").codes, [1, 1, 1]);

    let mut errors: Vec<(String, usize)> = errors.into_iter().collect();
    errors.sort();
    eprintln!("{n} damaged files read in {:?}; errors:", t0.elapsed());
    for (e, k) in &errors {
        eprintln!("  {k:4}  {e}");
    }
    // Every error says where or what: the file, and the section or the reason.
    for (e, _) in &errors {
        assert!(e.contains("FILE"), "error without the file name: {e}");
    }
}
