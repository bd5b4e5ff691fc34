//! `tracer report --json`: the report model as one JSON object and a newline.

use std::io::Write;

use anyhow::{Context, Result};

use crate::views::model::Report;

pub(crate) fn write(out: &mut impl Write, r: &Report) -> Result<()> {
    serde_json::to_writer(&mut *out, &r.summary).context("cannot write JSON")?;
    writeln!(out)?;
    Ok(())
}
