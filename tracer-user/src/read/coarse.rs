//! Times for the records of block-timestamp binaries (`TimeMode::Block`: a record takes
//! its basic block's time) and of coarse-timestamp binaries (`TimeMode::Coarse`): their stubs
//! read no clock, so each record gets a time interpolated between the clock samples of
//! the drains around it. Every chunk header carries its drain's sample (all chunks of a
//! drain the same); a thread's records between its drains at t0 and t1 are spread
//! evenly over (t0, t1]. A thread's first drain is its slot registration (kernel
//! drain: an empty flush), so its first records start after the thread did.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use tracer_common::{FLAG_INTERPOLATED, FLAG_KTIME, meta::TimeMode};

use crate::{
    read::accesses::expanded_len,
    tracefile::{Chunk, Next, Reader, Section},
};

type Key = (u32, u32, u64);

/// A first pass over the file: per thread and binary, each drain's (time, records).
pub(crate) struct Timeline {
    coarse: Vec<u64>,
    /// `TimeMode::Block` binaries: which of their site ids are basic blocks.
    block_mode: HashMap<u64, Vec<bool>>,
    /// Per thread and binary: the last basic-block record's time.
    last_block: HashMap<Key, u64>,
    drains: HashMap<Key, Vec<(u64, u64)>>,
    /// Per key: (drain index, records of it already timed).
    cursor: HashMap<Key, (usize, u64)>,
}

impl Timeline {
    pub(crate) fn scan(path: &Path) -> Result<Self> {
        let mut r = Reader::open(path)?;
        // By the file's index, the other sections of chunks are not even looked at.
        r.only(|e| e.interpolated());
        let mut coarse = Vec::new();
        let mut block_mode = HashMap::new();
        // Coarse binaries: which of their site ids are memory accesses (pairs).
        let mut memory: HashMap<u64, Vec<bool>> = HashMap::new();
        let mut drains: HashMap<Key, Vec<(u64, u64)>> = HashMap::new();
        // Only the chunks of coarse binaries are counted: the others are not decoded.
        while let Some(next) =
            r.next_section_unless(|hs| !hs.iter().any(|h| coarse.contains(&h.binary_id)))?
        {
            let Next::Section(section) = next else {
                continue;
            };
            match section {
                Section::Binary(b)
                    if b.metadata().is_ok_and(|m| m.time_mode == TimeMode::Block) =>
                {
                    let m = b.metadata()?;
                    let mut is_block = vec![false; m.sites.len()];
                    for s in &m.sites {
                        if let Some(v) = is_block.get_mut(s.id as usize) {
                            *v = s.kind == tracer_common::meta::SiteKind::Block;
                        }
                    }
                    block_mode.insert(b.binary_id, is_block);
                }
                Section::Binary(b)
                    if b.metadata().is_ok_and(|m| m.time_mode == TimeMode::Coarse) =>
                {
                    let m = b.metadata()?;
                    let mut is_memory = vec![false; m.sites.len()];
                    for s in &m.sites {
                        if let Some(v) = is_memory.get_mut(s.id as usize) {
                            *v = s.kind == tracer_common::meta::SiteKind::Memory;
                        }
                    }
                    memory.insert(b.binary_id, is_memory);
                    coarse.push(b.binary_id);
                }
                Section::Chunk(c) if coarse.contains(&c.header.binary_id) => {
                    let h = c.header;
                    if h.kind != tracer_common::CHUNK_KIND_RECORDS {
                        continue;
                    }
                    let list = drains.entry((h.pid, h.tid, h.binary_id)).or_default();
                    // Counted as accesses: `apply` sees the chunk with its pairs expanded.
                    let mem = memory.get(&h.binary_id);
                    let is_memory = |s: u32| mem.and_then(|m| m.get(s as usize)) == Some(&true);
                    let n = expanded_len(&c.records, is_memory);
                    match list.last_mut() {
                        Some((t, m)) if *t == h.time => *m += n,
                        _ => list.push((h.time, n)),
                    }
                }
                _ => {}
            }
        }
        Ok(Timeline {
            coarse,
            block_mode,
            last_block: HashMap::new(),
            drains,
            cursor: HashMap::new(),
        })
    }

    /// Whether the records of `binary` take their times from here (coarse, block).
    pub(crate) fn interpolated(&self, binary: u64) -> bool {
        self.coarse.contains(&binary) || self.block_mode.contains_key(&binary)
    }

    /// Give the records of `c` (the next chunk in file order, its pairs expanded) their
    /// times, if they come from a coarse binary.
    pub(crate) fn apply(&mut self, c: &mut Chunk) {
        let h = c.header;
        if let Some(is_block) = self.block_mode.get(&h.binary_id) {
            // Block timestamps: a record other than a block's takes the time of the
            // block record before it on its thread (0 before the first).
            let last = self
                .last_block
                .entry((h.pid, h.tid, h.binary_id))
                .or_default();
            for rec in &mut c.records {
                if rec.flags & FLAG_KTIME != 0 {
                    continue; // a uprobe record: its own kernel time
                }
                if is_block.get(rec.site as usize).copied().unwrap_or(false) {
                    *last = rec.time;
                } else {
                    rec.time = *last;
                    rec.flags |= FLAG_INTERPOLATED;
                }
            }
            return;
        }
        if h.kind != tracer_common::CHUNK_KIND_RECORDS || !self.coarse.contains(&h.binary_id) {
            return;
        }
        let key = (h.pid, h.tid, h.binary_id);
        let Some(list) = self.drains.get(&key) else {
            return;
        };
        let (mut d, mut done) = self.cursor.get(&key).copied().unwrap_or((0, 0));
        // The drain this chunk belongs to: the first from the cursor on with its time
        // and records left (empty drains, e.g. registrations, are passed over; their
        // times still bound the next drain's interval).
        let (t1, n) = loop {
            match list.get(d) {
                None => return,
                Some(&(t, n)) if t == h.time && done < n => break (t, n),
                _ => {
                    d += 1;
                    done = 0;
                }
            }
        };
        let t0 = if d == 0 { t1 } else { list[d - 1].0.min(t1) };
        for rec in &mut c.records {
            done += 1;
            rec.time = t0 + (u128::from(t1 - t0) * u128::from(done) / u128::from(n.max(1))) as u64;
            rec.flags |= FLAG_KTIME | FLAG_INTERPOLATED;
        }
        self.cursor.insert(key, (d, done));
    }
}
