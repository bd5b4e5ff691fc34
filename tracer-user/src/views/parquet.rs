//! `export --format parquet -o DIR`: the trace as two Parquet tables for SQL engines
//! (DuckDB, Spark, Trino, BigQuery), `DIR/records.parquet` (a row per record; a memory
//! pair is a row per access) and `DIR/calls.parquet` (a row per completed call, from
//! entry/exit pairs as `report` pairs them). Both are written in one pass, a row group every [`ROWS_PER_GROUP`]
//! rows, so memory stays flat however long the trace; strings are dictionary-encoded,
//! pages snappy-compressed. Unsigned columns are Parquet `INTEGER(n, false)`.
//!
//! The columns are [`RECORDS`] and [`CALLS`]; README.md documents them with example
//! queries.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufWriter, Write},
    path::Path,
    sync::Arc,
};

use anyhow::{Context, Result, anyhow};
use parquet::{
    basic::Compression,
    data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type},
    file::{properties::WriterProperties, writer::SerializedFileWriter},
    schema::parser::parse_message_type,
};

use crate::read::{
    calls::{Calls, Slice},
    events::{Event, each_record},
    names::Names,
    range::TimeRange,
};

/// Rows buffered before they are written as a row group.
pub(crate) const ROWS_PER_GROUP: usize = 1 << 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Type {
    U32,
    U64,
    Str,
    /// A string that may be unknown (null).
    OptStr,
    OptU32,
    Bool,
}

/// `records.parquet`: a row per record (a memory pair: a row per access), in delivery order.
pub(crate) const RECORDS: &[(&str, Type)] = &[
    ("pid", Type::U32),
    ("tid", Type::U32),
    ("thread", Type::Str),
    ("binary", Type::Str),
    ("build_id", Type::Str),
    ("site", Type::U32),
    ("kind", Type::Str),
    ("function", Type::Str),
    ("file", Type::OptStr),
    ("line", Type::OptU32),
    ("time_ns", Type::U64),
    ("value", Type::U64),
    ("aux", Type::U64),
    ("flags", Type::U32),
];

/// `calls.parquet`: a row per completed call, in the order calls end.
pub(crate) const CALLS: &[(&str, Type)] = &[
    ("pid", Type::U32),
    ("tid", Type::U32),
    ("thread", Type::Str),
    ("binary", Type::Str),
    ("function", Type::Str),
    ("start_ns", Type::U64),
    ("duration_ns", Type::U64),
    ("self_ns", Type::U64),
    ("depth", Type::U32),
    ("caller", Type::OptStr),
    // Inside an open call of the same function: leave it out of total times.
    ("reentrant", Type::Bool),
];

/// One value of a row, in its column's [`Type`].
#[derive(Clone)]
enum Cell {
    U32(u32),
    U64(u64),
    Str(ByteArray),
    OptStr(Option<ByteArray>),
    OptU32(Option<u32>),
    Bool(bool),
}

/// A column's values not yet written, and its definition levels if it is optional.
enum Values {
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bytes(Vec<ByteArray>),
    Bool(Vec<bool>),
}

struct Column {
    values: Values,
    defs: Option<Vec<i16>>,
}

impl Column {
    fn new(t: Type) -> Column {
        let values = match t {
            Type::U32 | Type::OptU32 => Values::I32(Vec::new()),
            Type::U64 => Values::I64(Vec::new()),
            Type::Str | Type::OptStr => Values::Bytes(Vec::new()),
            Type::Bool => Values::Bool(Vec::new()),
        };
        let optional = matches!(t, Type::OptStr | Type::OptU32);
        Column {
            values,
            defs: optional.then(Vec::new),
        }
    }

    /// Parquet stores unsigned integers as the bits of signed ones.
    fn push(&mut self, cell: Cell) -> Result<()> {
        let present = !matches!(cell, Cell::OptStr(None) | Cell::OptU32(None));
        match (&mut self.values, cell) {
            (Values::I32(v), Cell::U32(x) | Cell::OptU32(Some(x))) => v.push(x as i32),
            (Values::I64(v), Cell::U64(x)) => v.push(x as i64),
            (Values::Bytes(v), Cell::Str(x) | Cell::OptStr(Some(x))) => v.push(x),
            (Values::Bool(v), Cell::Bool(x)) => v.push(x),
            (_, Cell::OptStr(None) | Cell::OptU32(None)) => {}
            _ => return Err(anyhow!("internal error: a cell of the wrong type")),
        }
        if let Some(d) = &mut self.defs {
            d.push(i16::from(present));
        }
        Ok(())
    }
}

/// The schema of `columns` in Parquet's message syntax.
fn schema(name: &str, columns: &[(&str, Type)]) -> String {
    let fields: String = columns
        .iter()
        .map(|(n, t)| {
            let (rep, ty) = match t {
                Type::U32 => ("REQUIRED", "INT32 {} (INTEGER(32,false))"),
                Type::OptU32 => ("OPTIONAL", "INT32 {} (INTEGER(32,false))"),
                Type::U64 => ("REQUIRED", "INT64 {} (INTEGER(64,false))"),
                Type::Str => ("REQUIRED", "BYTE_ARRAY {} (STRING)"),
                Type::OptStr => ("OPTIONAL", "BYTE_ARRAY {} (STRING)"),
                Type::Bool => ("REQUIRED", "BOOLEAN {}"),
            };
            format!("  {rep} {};\n", ty.replace("{}", n))
        })
        .collect();
    format!("message {name} {{\n{fields}}}")
}

/// One Parquet file being written, a row group at a time.
struct Table<W: Write + Send> {
    writer: SerializedFileWriter<W>,
    columns: Vec<Column>,
    rows: usize,
}

impl<W: Write + Send> Table<W> {
    fn new(w: W, name: &str, columns: &[(&str, Type)]) -> Result<Table<W>> {
        let schema = Arc::new(parse_message_type(&schema(name, columns))?);
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by(format!("utrace {}", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Table {
            writer: SerializedFileWriter::new(w, schema, Arc::new(props))?,
            columns: columns.iter().map(|&(_, t)| Column::new(t)).collect(),
            rows: 0,
        })
    }

    fn push(&mut self, row: Vec<Cell>) -> Result<()> {
        for (c, cell) in self.columns.iter_mut().zip(row) {
            c.push(cell)?;
        }
        self.rows += 1;
        if self.rows >= ROWS_PER_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    /// The buffered rows as one row group.
    fn flush(&mut self) -> Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let mut group = self.writer.next_row_group()?;
        for c in &mut self.columns {
            let Some(mut w) = group.next_column()? else {
                return Err(anyhow!("internal error: more columns than the schema"));
            };
            let defs = c.defs.as_deref();
            match &mut c.values {
                Values::I32(v) => w.typed::<Int32Type>().write_batch(v, defs, None)?,
                Values::I64(v) => w.typed::<Int64Type>().write_batch(v, defs, None)?,
                Values::Bytes(v) => w.typed::<ByteArrayType>().write_batch(v, defs, None)?,
                Values::Bool(v) => w.typed::<BoolType>().write_batch(v, defs, None)?,
            };
            w.close()?;
            match &mut c.values {
                Values::I32(v) => v.clear(),
                Values::I64(v) => v.clear(),
                Values::Bytes(v) => v.clear(),
                Values::Bool(v) => v.clear(),
            }
            if let Some(d) = &mut c.defs {
                d.clear();
            }
        }
        group.close()?;
        self.rows = 0;
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.flush()?;
        self.writer.close()?;
        Ok(())
    }
}

/// The string columns of one site, made once.
struct SiteCells {
    binary: ByteArray,
    build_id: ByteArray,
    kind: ByteArray,
    function: ByteArray,
    file: Option<ByteArray>,
    line: Option<u32>,
}

fn site_cells(ev: &Event, names: &Names) -> SiteCells {
    let frames = names.site_frames(ev.binary_id, ev.rec.site);
    // The innermost frame: where the site's instruction is.
    let at = frames.first();
    SiteCells {
        binary: ev.binary.into(),
        build_id: names.build_id(ev.binary_id).into(),
        kind: ev.kind.into(),
        function: ev.symbol.into(),
        file: at.and_then(|f| f.file.as_deref()).map(ByteArray::from),
        line: at.and_then(|f| f.line),
    }
}

/// Both tables and what their rows repeat, interned.
struct Writer<W: Write + Send> {
    records: Table<W>,
    calls: Table<W>,
    sites: HashMap<(u64, u32), SiteCells>,
    threads: HashMap<(u32, u32), (String, ByteArray)>,
    /// Per function of [`Calls::functions`]: its binary and name.
    functions: Vec<Option<(ByteArray, ByteArray)>>,
}

impl<W: Write + Send> Writer<W> {
    fn thread(&mut self, ev: &Event) -> ByteArray {
        let e = self
            .threads
            .entry((ev.pid, ev.tid))
            .or_insert_with(|| (ev.comm.to_string(), ev.comm.into()));
        if e.0 != ev.comm {
            *e = (ev.comm.to_string(), ev.comm.into());
        }
        e.1.clone()
    }

    fn record(&mut self, ev: &Event, names: &Names) -> Result<()> {
        let thread = self.thread(ev);
        let s = self
            .sites
            .entry((ev.binary_id, ev.rec.site))
            .or_insert_with(|| site_cells(ev, names));
        let row = vec![
            Cell::U32(ev.pid),
            Cell::U32(ev.tid),
            Cell::Str(thread),
            Cell::Str(s.binary.clone()),
            Cell::Str(s.build_id.clone()),
            Cell::U32(ev.rec.site),
            Cell::Str(s.kind.clone()),
            Cell::Str(s.function.clone()),
            Cell::OptStr(s.file.clone()),
            Cell::OptU32(s.line),
            Cell::U64(ev.time_ns),
            Cell::U64(ev.rec.value),
            Cell::U64(ev.rec.aux),
            Cell::U32(ev.rec.flags),
        ];
        self.records.push(row)
    }

    fn function(&mut self, calls: &Calls, f: usize) -> (ByteArray, ByteArray) {
        if self.functions.len() <= f {
            self.functions.resize(f + 1, None);
        }
        self.functions[f]
            .get_or_insert_with(|| {
                let t = &calls.functions[f];
                (t.binary.as_str().into(), t.function.as_str().into())
            })
            .clone()
    }

    fn call(&mut self, ev: &Event, calls: &Calls, s: &Slice) -> Result<()> {
        let thread = self.thread(ev);
        let (binary, function) = self.function(calls, s.function);
        let caller = s.caller.map(|c| self.function(calls, c).1);
        let row = vec![
            Cell::U32(s.pid),
            Cell::U32(s.tid),
            Cell::Str(thread),
            Cell::Str(binary),
            Cell::Str(function),
            Cell::U64(s.start_ns),
            Cell::U64(s.end_ns.saturating_sub(s.start_ns)),
            Cell::U64(s.self_ns),
            Cell::U32(s.depth),
            Cell::OptStr(caller),
            Cell::Bool(s.reentrant),
        ];
        self.calls.push(row)
    }
}

/// Write `trace`'s records and calls to `records` and `calls`.
pub(crate) fn write(
    trace: &Path,
    range: &TimeRange,
    names: &mut Names,
    records: &mut BufWriter<File>,
    calls_out: &mut BufWriter<File>,
) -> Result<()> {
    let mut w = Writer {
        records: Table::new(records, "records", RECORDS)?,
        calls: Table::new(calls_out, "calls", CALLS)?,
        sites: HashMap::new(),
        threads: HashMap::new(),
        functions: Vec::new(),
    };
    let mut calls = Calls::default();
    let mut err: Option<anyhow::Error> = None;
    each_record(trace, range, names, |ev, names| {
        if err.is_some() {
            return;
        }
        let mut step = || -> Result<()> {
            w.record(ev, names)?;
            let step = calls.event(ev);
            for s in step.completed.iter().chain(&step.unwound) {
                w.call(ev, &calls, s)?;
            }
            Ok(())
        };
        err = step().err();
    })?;
    if let Some(e) = err {
        return Err(e).context("cannot write the Parquet export");
    }
    w.records.finish()?;
    w.calls.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_parse() {
        for (name, cols) in [("records", RECORDS), ("calls", CALLS)] {
            let t = parse_message_type(&schema(name, cols)).unwrap();
            assert_eq!(t.get_fields().len(), cols.len());
        }
    }
}
