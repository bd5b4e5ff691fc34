//! Memory pairs (`FLAG_MEM_PAIR`: two accesses in one record) read like the single
//! records a stub per instruction writes. Two trace files of the same run are written
//! through the trace writer (chunk groups packed as the consumer packs them, a load
//! section, stats): one with a record per access, one with the accesses of sites `s`,
//! `s + 1` paired. Every view must read them alike: the dump line for line, the report
//! but for its record counts, the exports and the flame graph byte for byte. Both time
//! modes that matter: `record` (a pair's accesses share its time) and `coarse` (times
//! spread over a drain's accesses, not its records).

use std::path::{Path, PathBuf};

use tracer_common::{
    CHUNK_HEADER_BYTES, CHUNK_KIND_RECORDS, ChunkHeader, FLAG_MEM_READ, FLAG_MEM_SIZE_SHIFT,
    FLAG_MEM_WRITE, RECORD_SIZE, Record,
    meta::{Metadata, Site, SiteKind, SiteMode, TimeMode},
    pair_flags,
};
use tracer_user::{
    tracefile::{
        BinaryInfo, ChunkGroup, FinalStats, SessionInfo, Writer,
        clock::{Anchor, Calibration},
        encode_chunk, encode_load,
    },
    views,
};

const BIAS: u64 = 0x5612_3400_0000;
const PID: u32 = 4242;
const BINARY: u64 = 77;

fn metadata(time_mode: TimeMode) -> Metadata {
    let site = |id: u32, kind: SiteKind| Site {
        id,
        vaddr: 0x1130 + 7 * u64::from(id),
        file_off: 0x130 + 7 * u64::from(id),
        name: "walk".into(),
        kind,
        mode: SiteMode::Inline,
        nargs: 0,
    };
    let mut sites = vec![
        site(0, SiteKind::FunctionEntry),
        site(1, SiteKind::FunctionExit),
    ];
    sites.extend((2..6).map(|id| site(id, SiteKind::Memory)));
    Metadata {
        record_version: tracer_common::RECORD_VERSION,
        record_size: RECORD_SIZE as u32,
        build_id: vec![0xab; 20],
        binary_id: BINARY,
        time_mode,
        sites,
        ..Metadata::default()
    }
}

/// One call of `walk` on thread `tid`: entry, accesses of sites 2..=5 then 2, 3, 4,
/// exit. Accesses at the same `time` as the access before them may be paired.
fn call(tid: u32, start: u64, coarse: bool) -> Vec<Record> {
    let t = |i: u64| if coarse { 3 } else { start + 10 * i };
    let mem = |site: u32, rw: u32, size: u32, ea: u64, time: u64| Record {
        site,
        flags: rw | size << FLAG_MEM_SIZE_SHIFT,
        time,
        value: ea,
        aux: 0x1130 + 7 * u64::from(site) + BIAS,
    };
    let heap = 0x7f00_0000_1000 + u64::from(tid) * 0x100;
    let rw = FLAG_MEM_READ | FLAG_MEM_WRITE;
    vec![
        Record {
            site: 0,
            time: t(0),
            value: u64::from(tid),
            aux: BIAS + 0x1500,
            ..Record::default()
        },
        mem(2, FLAG_MEM_READ, 8, heap, t(1)),
        mem(3, FLAG_MEM_WRITE, 4, heap + 8, t(1)),
        mem(4, rw, 1, heap + 0x40, t(2)),
        mem(5, FLAG_MEM_READ, 16, heap + 0x1000, t(2)),
        mem(2, FLAG_MEM_READ, 8, heap + 0x10, t(3)),
        mem(3, FLAG_MEM_WRITE, 4, heap + 0x18, t(3)),
        mem(4, rw, 1, heap + 0x41, t(4)),
        Record {
            site: 1,
            time: t(5),
            value: 0,
            aux: BIAS + 0x1500,
            ..Record::default()
        },
    ]
}

/// `records` with each access of site `s` followed by one of site `s + 1` at the same
/// time made one pair, as an access run's stub writes them.
fn paired(records: &[Record]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < records.len() {
        let (a, b) = (records[i], records.get(i + 1));
        let flags = b
            .filter(|b| a.flags != 0 && b.site == a.site + 1 && b.time == a.time && a.site >= 2)
            .and_then(|b| pair_flags(a.flags, b.flags));
        match (flags, b) {
            (Some(flags), Some(b)) => {
                out.push(Record {
                    flags,
                    aux: b.value,
                    ..a
                });
                i += 2;
            }
            _ => {
                out.push(a);
                i += 1;
            }
        }
    }
    out
}

/// A ring-buffer entry of records as eBPF delivers it.
fn entry(tid: u32, seq: u64, time: u64, records: &[Record]) -> Vec<u8> {
    let h = ChunkHeader {
        kind: CHUNK_KIND_RECORDS,
        count: records.len() as u32,
        pid: PID,
        tid,
        seq,
        binary_id: BINARY,
        time,
        ..ChunkHeader::default()
    };
    let mut e = Vec::with_capacity(CHUNK_HEADER_BYTES + records.len() * RECORD_SIZE);
    for w in [h.kind, h.count, h.pid, h.tid] {
        e.extend_from_slice(&w.to_le_bytes());
    }
    for w in [h.seq, h.binary_id] {
        e.extend_from_slice(&w.to_le_bytes());
    }
    e.extend_from_slice(&[0; 8]); // cause, pad
    e.extend_from_slice(&h.time.to_le_bytes());
    for r in records {
        for w in [r.site, r.flags] {
            e.extend_from_slice(&w.to_le_bytes());
        }
        for w in [r.time, r.value, r.aux] {
            e.extend_from_slice(&w.to_le_bytes());
        }
    }
    e
}

/// Write a trace of two threads, three drains each (two grouped, one single chunk),
/// pairing the accesses if `pairs`. Returns its path and its record count.
fn write_trace(dir: &Path, time_mode: TimeMode, pairs: bool) -> (PathBuf, u64) {
    let name = format!(
        "{}-{}.utrace",
        time_mode.name(),
        if pairs { "pairs" } else { "singles" }
    );
    let path = dir.join(name);
    let mut w = Writer::create(&path).unwrap();
    w.write_session(&SessionInfo {
        command: vec!["./walk".into()],
        pids: vec![PID],
        mode: "exec".into(),
        arch: "x86_64".into(),
        record_version: tracer_common::RECORD_VERSION,
        ring_bytes: 1 << 20,
        write_user: true,
        clock: Calibration {
            tsc_hz: 1e9,
            anchor: Anchor {
                tsc: 0,
                monotonic_ns: 1_000,
            },
        },
        start_unix_s: 0,
    })
    .unwrap();
    w.write_binary(&BinaryInfo {
        ordinal: 0,
        binary_id: BINARY,
        path: "/x/walk".into(),
        note: metadata(time_mode).to_note(),
    })
    .unwrap();
    let mut out = encode_load(PID, BINARY, BIAS);
    let (mut group, mut records, mut seq) = (ChunkGroup::default(), 0u64, 0);
    let coarse = time_mode == TimeMode::Coarse;
    for drain in 0..3u64 {
        for tid in [PID, PID + 1] {
            let mut recs: Vec<Record> = (0..20)
                .flat_map(|k| call(tid, 10_000 * drain + 100 * k, coarse))
                .collect();
            if pairs {
                recs = paired(&recs);
            }
            records += recs.len() as u64;
            seq += 1;
            let e = entry(tid, seq, 50_000 * (drain + 1), &recs);
            if drain == 2 {
                group.flush(&mut out);
                encode_chunk(&e, &mut out).unwrap();
            } else {
                group.add(&e, &mut out).unwrap();
            }
        }
    }
    group.flush(&mut out);
    w.write_raw(&out).unwrap();
    w.finish(&FinalStats {
        records_delivered: 1_000,
        records_produced: 1_000,
        records_received: 1_000,
        seq_issued: seq,
        chunks_received: seq,
        ..FinalStats::default()
    })
    .unwrap();
    (path, records)
}

fn dump(trace: &Path) -> String {
    let mut out = Vec::new();
    views::dump::dump(trace, &tracer_user::TimeRange::ALL, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn report(trace: &Path, json: bool) -> String {
    let mut out = Vec::new();
    views::report(trace, &tracer_user::TimeRange::ALL, json, 4, &[], &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// A file's bytes, or a directory's files' (Parquet) in name order.
fn contents(path: &Path) -> Vec<(String, Vec<u8>)> {
    if !path.is_dir() {
        return vec![(String::new(), std::fs::read(path).unwrap())];
    }
    let mut files: Vec<_> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            contents(f)
                .into_iter()
                .map(move |(n, b)| (format!("{name}/{n}"), b))
        })
        .collect()
}

/// An SVG without its fill colours (inferno picks them at random).
fn uncoloured(svg: &str) -> String {
    let mut out = String::new();
    let mut rest = svg;
    while let Some(i) = rest.find("fill=\"rgb(") {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        rest = &rest[rest.find(')').map_or(rest.len(), |j| j + 1)..];
    }
    out + rest
}

#[test]
fn pairs_read_as_the_single_records_they_hold() {
    let dir = std::env::temp_dir().join(format!("utrace-pairs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in [TimeMode::Record, TimeMode::Coarse] {
        let (singles, n_singles) = write_trace(&dir, mode, false);
        let (pairs, n_pairs) = write_trace(&dir, mode, true);
        // 120 calls of 7 accesses, 3 pairs each.
        assert_eq!((n_singles, n_pairs), (120 * 9, 120 * 6), "{mode:?}");

        let d = dump(&singles);
        assert_eq!(d.lines().count() as u64, n_singles);
        assert_eq!(dump(&pairs), d, "{mode:?}: dump");

        let (js, jp) = (report(&singles, true), report(&pairs, true));
        let mut js: serde_json::Value = serde_json::from_str(&js).unwrap();
        let mut jp: serde_json::Value = serde_json::from_str(&jp).unwrap();
        assert_eq!(
            (&js["records"], &js["accesses"]),
            (&n_singles.into(), &840.into())
        );
        assert_eq!(
            (&jp["records"], &jp["accesses"]),
            (&n_pairs.into(), &840.into())
        );
        assert_eq!(jp["inline"], n_pairs);
        // The pairs' records hold two accesses each: records + pairs = accesses + others.
        assert_eq!(jp["pairs"], n_singles - n_pairs, "{mode:?}");
        for j in [&mut js, &mut jp] {
            let o = j.as_object_mut().unwrap();
            o.remove("records");
            o.remove("inline");
            o.remove("pairs");
        }
        assert_eq!(jp, js, "{mode:?}: report --json");
        let text = report(&pairs, false);
        assert!(text.contains(&format!("records: {n_pairs} ")), "{text}");
        assert!(text.contains("memory accesses: 840 "), "{text}");

        for format in ["chrome", "perfetto", "parquet"] {
            let out = |t: &Path| {
                let file = dir.join(format!("{format}.out"));
                let _ = std::fs::remove_dir_all(&file);
                views::export::export(t, &tracer_user::TimeRange::ALL, format, &file, &[]).unwrap();
                contents(&file)
            };
            assert!(out(&pairs) == out(&singles), "{mode:?}: export {format}");
        }
        let svg = |t: &Path| {
            let file = dir.join("flame.svg");
            views::flamegraph::flamegraph(
                t,
                &tracer_user::TimeRange::ALL,
                &file,
                Some("walk"),
                &[],
            )
            .unwrap();
            uncoloured(&std::fs::read_to_string(&file).unwrap())
        };
        assert_eq!(svg(&pairs), svg(&singles), "{mode:?}: flame graph");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
