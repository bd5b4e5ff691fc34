//! `tracer dump` parsed into records.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use tracer_common::{FLAG_KTIME, FLAG_UPROBE};

use crate::command::run_streaming;
use crate::paths::tracer_bin;
use crate::tracer::TRACE_TIMEOUT;

/// One line of `tracer dump`.
#[derive(Debug, Clone)]
pub struct Rec {
    pub pid: u32,
    pub tid: u32,
    pub binary: Arc<str>,
    pub site: u32,
    pub symbol: Arc<str>,
    pub value: u64,
    pub aux: u64,
    pub time_ns: Option<u64>,
    pub flags: u32,
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn parse_flags(s: &str) -> Option<u32> {
    if let Some(v) = parse_u64(s) {
        return u32::try_from(v).ok();
    }
    // Also accept a symbolic rendering such as "ktime|uprobe" or "-".
    let l = s.to_ascii_lowercase();
    if l.chars()
        .all(|c| c.is_ascii_alphabetic() || "|,+- ".contains(c))
    {
        let mut f = 0;
        if l.contains("ktime") {
            f |= FLAG_KTIME;
        }
        if l.contains("uprobe") {
            f |= FLAG_UPROBE;
        }
        return Some(f);
    }
    None
}

/// Parse one dump line: `pid tid binary site symbol value aux time_ns flags`.
pub fn parse_dump_line(line: &str, intern: &mut HashMap<String, Arc<str>>) -> Result<Rec, String> {
    let f: Vec<&str> = line.trim_end_matches(['\n', '\r']).split('\t').collect();
    if f.len() != 9 {
        return Err(format!(
            "expected 9 tab-separated fields, got {}: {line:?}",
            f.len()
        ));
    }
    let mut get = |s: &str| -> Arc<str> {
        if let Some(a) = intern.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        intern.insert(s.to_string(), a.clone());
        a
    };
    let bad = |what: &str| format!("bad {what} in dump line {line:?}");
    let rec = Rec {
        pid: parse_u64(f[0])
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad("pid"))?,
        tid: parse_u64(f[1])
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad("tid"))?,
        binary: get(f[2]),
        site: parse_u64(f[3])
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad("site"))?,
        symbol: get(f[4]),
        value: parse_u64(f[5]).ok_or_else(|| bad("value"))?,
        aux: parse_u64(f[6]).ok_or_else(|| bad("aux"))?,
        time_ns: parse_u64(f[7]),
        flags: parse_flags(f[8]).ok_or_else(|| bad("flags"))?,
    };
    Ok(rec)
}

/// All records of a trace file, in delivery order (`tracer dump FILE`).
pub fn dump(trace: &Path) -> Vec<Rec> {
    let mut recs = Vec::new();
    dump_each(trace, |r| recs.push(r));
    recs
}

/// Every record of a trace file, in delivery order, handed to `f` as `tracer dump`
/// prints it (for traces too big to hold as [`Rec`]s).
pub fn dump_each(trace: &Path, mut f: impl FnMut(Rec) + Send) {
    let mut c = Command::new(tracer_bin());
    c.arg("dump").arg(trace);
    let mut intern = HashMap::new();
    let mut errors: Vec<String> = Vec::new();
    let out = run_streaming(&mut c, TRACE_TIMEOUT, |line| {
        let line = String::from_utf8_lossy(line);
        if line.trim().is_empty() {
            return;
        }
        match parse_dump_line(&line, &mut intern) {
            Ok(r) => f(r),
            Err(e) => {
                if errors.len() < 5 {
                    errors.push(e)
                }
            }
        }
    });
    let out = out.ok();
    assert!(
        errors.is_empty(),
        "unparsable `tracer dump` output: {errors:#?}\n{}",
        out.describe()
    );
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn dump_lines() {
        let mut intern = HashMap::new();
        let r = parse_dump_line(
            "12\t13\t/tmp/a.traced\t4\tfx_leaf\t0x1f\t0x5555\t1234\t0\n",
            &mut intern,
        )
        .unwrap();
        assert_eq!(
            (
                r.pid, r.tid, &*r.binary, r.site, &*r.symbol, r.value, r.aux, r.time_ns, r.flags
            ),
            (
                12,
                13,
                "/tmp/a.traced",
                4,
                "fx_leaf",
                31,
                0x5555,
                Some(1234),
                0
            )
        );
        let r2 = parse_dump_line(
            "12\t13\t/tmp/a.traced\t5\tfx_spin\t0x1\t0x0\t99\t0x3",
            &mut intern,
        )
        .unwrap();
        assert_eq!(r2.flags, FLAG_KTIME | FLAG_UPROBE);
        assert!(Arc::ptr_eq(&r.binary, &r2.binary), "interned");
        assert_eq!(parse_flags("ktime|uprobe"), Some(FLAG_KTIME | FLAG_UPROBE));
        assert_eq!(parse_flags("-"), Some(0));
        assert!(parse_dump_line("1\t2\t3", &mut intern).is_err());
        assert!(parse_dump_line("x\t13\tb\t4\ts\t0x1\t0x2\t3\t0", &mut intern).is_err());
    }
}
