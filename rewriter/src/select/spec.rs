//! The instrumentation spec: which sites, what they record, timestamps, buffers. Read
//! from a TOML file (`rewriter --spec FILE`); the command-line flags of the same
//! names override it.
//!
//! ```toml
//! functions = ["main", "work_*"]   # globs; absent or empty: every function
//! sites = ["entry", "exit"]        # site kinds
//! time = "coarse"                  # "record" (cycle counter per record) | "block"
//!                                  # (per basic block) | "coarse" (none)
//!
//! [values]                         # what a record's value is, per site kind
//! entry = "%rsi"                   # (default: first argument; exit: return value;
//! exit = "%rdx"                    #  block: its address), as a <sys/sdt.h> argument
//! block = "$7"                     #  spec of the binary's ISA: register, immediate,
//!                                  #  memory (`8@-16(%rbp)`, `8@[sp, 16]`)
//!
//! [buffer]
//! kind = "trace"                   # "trace" (flushed when full) | "circular" |
//!                                  # "fast-circular" (64 KiB rings, 2048 records)
//! records = 4096                   # records per thread buffer
//! slots = 256                      # threads that can trace at once
//! ```

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::{Options, SiteKind, TimeMode};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    functions: Option<Vec<String>>,
    sites: Option<Vec<String>>,
    time: Option<String>,
    values: Option<std::collections::BTreeMap<String, String>>,
    buffer: Option<BufferSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BufferSpec {
    kind: Option<String>,
    records: Option<u32>,
    slots: Option<u32>,
}

/// A site kind by its spec / CLI name.
pub fn parse_kind(name: &str) -> std::result::Result<SiteKind, String> {
    match name {
        "entry" => Ok(SiteKind::FunctionEntry),
        "exit" => Ok(SiteKind::FunctionExit),
        "block" => Ok(SiteKind::Block),
        "memory" => Ok(SiteKind::Memory),
        "usdt" => Ok(SiteKind::Usdt),
        "call" => Ok(SiteKind::Call),
        _ => Err(format!(
            "unknown site kind {name:?} (known: entry, exit, block, memory, usdt, call)"
        )),
    }
}

/// A site kind whose value can be chosen (`[values]`, `--value`).
pub fn value_kind(name: &str) -> std::result::Result<SiteKind, String> {
    match parse_kind(name)? {
        k @ (SiteKind::FunctionEntry | SiteKind::FunctionExit | SiteKind::Block) => Ok(k),
        _ => Err(format!(
            "the value of {name} records is fixed (values can be chosen for entry, exit and block)"
        )),
    }
}

/// `KIND=SPEC` of `--value`.
pub fn parse_value(s: &str) -> std::result::Result<(SiteKind, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: want KIND=SPEC, e.g. entry=%rsi"))?;
    Ok((value_kind(k)?, v.to_string()))
}

/// A buffer kind by its spec / CLI name.
pub fn parse_buf_kind(name: &str) -> std::result::Result<u32, String> {
    match name {
        "trace" => Ok(tracer_common::BUF_TRACE),
        "circular" => Ok(tracer_common::BUF_CIRCULAR),
        "fast-circular" => Ok(tracer_common::BUF_FAST_CIRCULAR),
        _ => Err(format!(
            "unknown buffer kind {name:?} (known: trace, circular, fast-circular)"
        )),
    }
}

/// Records of a buffer kind's buffers when not given: fast circular rings have one size.
pub fn default_records(buf_kind: u32) -> Option<u32> {
    (buf_kind == tracer_common::BUF_FAST_CIRCULAR)
        .then_some((tracer_common::FAST_RING_BYTES / tracer_common::RECORD_SIZE as u64) as u32)
}

/// A timestamp mode by its spec / CLI name.
pub fn parse_time(name: &str) -> std::result::Result<TimeMode, String> {
    match name {
        "record" => Ok(TimeMode::Record),
        "coarse" => Ok(TimeMode::Coarse),
        "block" => Ok(TimeMode::Block),
        _ => Err(format!(
            "unknown time mode {name:?} (known: record, block, coarse)"
        )),
    }
}

/// Apply a spec file's text (named `origin` in errors) on top of `opts`.
pub fn apply(origin: &str, text: &str, opts: &mut Options) -> Result<()> {
    let bad = |m: String| Error::Spec(origin.to_string(), m);
    let spec: SpecFile = toml::from_str(text).map_err(|e| bad(e.message().to_string()))?;
    if let Some(f) = spec.functions {
        opts.functions = f;
    }
    if let Some(kinds) = spec.sites {
        if kinds.is_empty() {
            return Err(bad("`sites` is empty".into()));
        }
        opts.kinds = kinds
            .iter()
            .map(|k| parse_kind(k))
            .collect::<std::result::Result<_, _>>()
            .map_err(bad)?;
    }
    if let Some(t) = spec.time {
        opts.time_mode = parse_time(&t).map_err(bad)?;
    }
    if let Some(values) = spec.values {
        for (kind, v) in values {
            opts.values.push((value_kind(&kind).map_err(bad)?, v));
        }
    }
    if let Some(b) = spec.buffer {
        if let Some(k) = b.kind {
            opts.buf_kind = parse_buf_kind(&k).map_err(bad)?;
            if let Some(r) = default_records(opts.buf_kind) {
                opts.buf_records = r;
            }
        }
        if let Some(r) = b.records {
            opts.buf_records = r;
        }
        if let Some(s) = b.slots {
            opts.nslots = s;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_spec() {
        let mut o = Options::default();
        apply(
            "t.toml",
            r#"
functions = ["main", "work_*"]
sites = ["entry", "exit"]
time = "coarse"
[buffer]
records = 2048
slots = 32
"#,
            &mut o,
        )
        .unwrap();
        assert_eq!(o.functions, ["main", "work_*"]);
        assert_eq!(o.kinds, [SiteKind::FunctionEntry, SiteKind::FunctionExit]);
        assert_eq!(o.time_mode, TimeMode::Coarse);
        assert_eq!((o.buf_records, o.nslots), (2048, 32));
        let mut o = Options::default();
        apply(
            "v.toml",
            "[values]\nentry = \"%rsi\"\nblock = \"$7\"\n",
            &mut o,
        )
        .unwrap();
        assert_eq!(
            o.values,
            [
                (SiteKind::Block, "$7".to_string()),
                (SiteKind::FunctionEntry, "%rsi".to_string())
            ]
        );
    }

    #[test]
    fn errors_name_the_problem() {
        for (text, needle) in [
            ("sites = [\"bogus\"]", "unknown site kind \"bogus\""),
            ("time = \"sometimes\"", "unknown time mode"),
            ("colour = 1", "unknown field `colour`"),
            ("sites = []", "`sites` is empty"),
            ("[buffer]\nrecords = -1", "invalid value"),
            ("functions = 3", "invalid type"),
            (
                "[values]\nmemory = \"%rax\"",
                "the value of memory records is fixed",
            ),
        ] {
            let e = apply("s.toml", text, &mut Options::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains("s.toml") && e.contains(needle), "{text}: {e}");
        }
    }
}
