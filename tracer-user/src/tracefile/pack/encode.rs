//! The packer's side of [`super`]: the same bytes as the model the readers keep,
//! computed with the fewest instructions a record (the consumer packs every record
//! the program makes, on the core the program does not use).
//!
//! Where [`super::Model`] keeps a bitset of valid entries and `Option`s, an
//! [`Entry`] is valid when its key holds the stream's generation next to the site
//! (one compare), a new stream bumps the generation, and the previous record's fields
//! stay in locals across the loop rather than in the model (stores into the table would
//! otherwise force them to be read back from memory after every record).

use std::mem::MaybeUninit;

use tracer_common::Record;

use super::{
    AUX_SHIFT, DELTA_PREV, DELTA_SITE, FLAGS, SAME_PREV, SAME_SITE, SITE, TIME_SAME, VALUE_SHIFT,
};

/// The most bytes one record packs into: a tag and five varints.
pub(super) const MAX_PACKED: usize = 1 + 5 * 10;

/// `Entry::next` and the successor: a site is there when this bit is set.
const HAS: u64 = 1 << 32;

/// What the stream last saw at a site; `key` is `generation << 32 | site`.
#[derive(Clone, Copy, Default)]
struct Entry {
    key: u64,
    value: u64,
    aux: u64,
    flags: u32,
    /// `HAS | site` of the record that came after this site's last one, or 0.
    next: u64,
}

/// A packer's model: `T` entries (a power of two), and the last record.
pub(super) struct Encoder<const T: usize> {
    table: Vec<Entry>,
    /// Generation of the current stream (never 0: a zeroed entry is nobody's).
    generation: u64,
    prev: Record,
    /// `HAS | site` predicted for the next record, or 0 (none, or no record yet).
    succ: u64,
    started: bool,
}

impl<const T: usize> Encoder<T> {
    pub(super) fn new() -> Self {
        const { assert!(T.is_power_of_two()) };
        Encoder {
            table: vec![Entry::default(); T],
            generation: 1,
            prev: Record::default(),
            succ: 0,
            started: false,
        }
    }

    /// Forget everything: a new stream starts.
    pub(super) fn reset(&mut self) {
        self.generation += 1;
        if self.generation >> 32 != 0 {
            // Keys hold 32 bits of it: start over with a cleared table.
            self.table.fill(Entry::default());
            self.generation = 1;
        }
        self.prev = Record::default();
        self.succ = 0;
        self.started = false;
    }

    /// Append `records`, packed after the stream's earlier ones, to `out`.
    pub(super) fn pack(
        &mut self,
        records: impl ExactSizeIterator<Item = Record>,
        out: &mut Vec<u8>,
    ) {
        out.reserve(records.len() * MAX_PACKED);
        let mut o = Out {
            b: out.spare_capacity_mut(),
            n: 0,
        };
        let room = o.b.len() / MAX_PACKED;
        let gen_key = self.generation << 32;
        let table = &mut self.table[..];
        let mut records = records.take(room);
        if !self.started {
            // The stream's first record: no previous site to give a successor.
            let Some(r) = records.next() else {
                return;
            };
            let i = r.site as usize & (T - 1);
            let e = table[i];
            let hit = e.key == gen_key | u64::from(r.site);
            let next = if hit { e.next } else { 0 };
            record(&mut o, &r, &e, hit, &self.prev, self.succ);
            table[i] = entry(gen_key, &r, next);
            (self.prev, self.succ, self.started) = (r, next, true);
        }
        let (mut prev, mut succ) = (self.prev, self.succ);
        let mut prev_i = prev.site as usize & (T - 1);
        for r in records {
            let i = r.site as usize & (T - 1);
            let e = table[i];
            let hit = e.key == gen_key | u64::from(r.site);
            record(&mut o, &r, &e, hit, &prev, succ);
            // The model's update: the previous site's successor is this one; this
            // site's entry becomes the record (its own successor, if it repeats).
            table[prev_i].next = HAS | u64::from(r.site);
            let next = if r.site == prev.site {
                HAS | u64::from(r.site)
            } else if hit {
                e.next
            } else {
                0
            };
            table[i] = entry(gen_key, &r, next);
            (prev, succ, prev_i) = (r, next, i);
        }
        (self.prev, self.succ) = (prev, succ);
        let n = o.n;
        // SAFETY: `Out` wrote every one of the first `n` bytes of the spare capacity (a
        // tag and the varints after it, in order, for each record).
        unsafe { out.set_len(out.len() + n) };
    }
}

fn entry(gen_key: u64, r: &Record, next: u64) -> Entry {
    Entry {
        key: gen_key | u64::from(r.site),
        value: r.value,
        aux: r.aux,
        flags: r.flags,
        next,
    }
}

/// Put record `r`'s tag and varints: `e` is its site's entry (valid if `hit`), `prev`
/// the record before it, `succ` the site predicted.
#[inline(always)]
fn record(o: &mut Out, r: &Record, e: &Entry, hit: bool, prev: &Record, succ: u64) {
    let at = o.n;
    o.n += 1;
    let site_known = succ == HAS | u64::from(r.site);
    if !site_known {
        let d = r.site.wrapping_sub(prev.site) as i32;
        o.varint(zigzag(i64::from(d) as u64));
    }
    let flags_known = hit & (e.flags == r.flags);
    if !flags_known {
        o.varint(u64::from(r.flags));
    }
    let (sv, sa) = if hit { (e.value, e.aux) } else { (0, 0) };
    let vmode = o.field(hit, r.value, sv, prev.value);
    let amode = o.field(hit, r.aux, sa, prev.aux);
    // The same time: its varint is one 0 byte, taken back (cheaper than a branch).
    let dt = zigzag(r.time.wrapping_sub(prev.time));
    o.varint(dt);
    let time_known = dt == 0;
    o.n -= usize::from(time_known);
    let tag = (u8::from(site_known) * SITE)
        | (u8::from(flags_known) * FLAGS)
        | (u8::from(time_known) * TIME_SAME)
        | vmode << VALUE_SHIFT
        | amode << AUX_SHIFT;
    o.set(at, tag);
}

fn zigzag(d: u64) -> u64 {
    let d = d as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

/// Packed bytes written straight into a `Vec`'s reserved spare room: no capacity
/// check or copy per record, no bounds check per byte.
struct Out<'a> {
    b: &'a mut [MaybeUninit<u8>],
    n: usize,
}

impl Out<'_> {
    #[inline(always)]
    fn set(&mut self, at: usize, v: u8) {
        debug_assert!(at < self.b.len());
        // SAFETY: a record is packed only while `MAX_PACKED` bytes are left for it
        // (`room` in `Encoder::pack`), and none writes more.
        unsafe { self.b.get_unchecked_mut(at).write(v) };
    }

    #[inline(always)]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.set(self.n, v as u8 | 0x80);
            self.n += 1;
            v >>= 7;
        }
        self.set(self.n, v as u8);
        self.n += 1;
    }

    /// A value or aux against its site's (`hit`: the site has an entry) and the
    /// previous record's: puts its varint if it needs one, returns its mode.
    #[inline(always)]
    fn field(&mut self, hit: bool, now: u64, site: u64, prev: u64) -> u8 {
        if hit && now == site {
            return SAME_SITE;
        }
        if now == prev {
            return SAME_PREV;
        }
        let (a, b) = (
            zigzag(now.wrapping_sub(site)),
            zigzag(now.wrapping_sub(prev)),
        );
        if a <= b {
            self.varint(a);
            DELTA_SITE
        } else {
            self.varint(b);
            DELTA_PREV
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracefile::pack::GroupUnpacker;

    /// Streams of the same sites with other values: an entry of an earlier stream
    /// must never predict (the reader's table starts empty), also when the generation
    /// wraps (stream 3 has stream 0's generation and sites).
    #[test]
    fn a_new_stream_forgets_the_last_one() {
        let stream = |k: u64| -> Vec<Record> {
            (0..300u64)
                .map(|i| Record {
                    // Streams 1 and 2 elsewhere in the table: stream 0's entries
                    // outlive them.
                    site: (i % 7) as u32 + (k % 3) as u32 * 100,
                    flags: (k % 3) as u32,
                    time: k * 1000 + i,
                    // Stream 3 repeats stream 0's values too.
                    value: k % 3 * 10 + i % 7,
                    aux: 0x5000 + k % 3,
                })
                .collect()
        };
        let mut e = Encoder::<{ super::super::GROUP_TABLE }>::new();
        let mut u = GroupUnpacker::for_version(super::super::super::FORMAT_VERSION);
        for (k, generation) in [(0, 1), (1, 2), (2, u64::from(u32::MAX)), (3, 0)] {
            if generation != 0 {
                e.generation = generation;
            }
            let recs = stream(k);
            let mut b = Vec::new();
            e.pack(recs[..100].iter().copied(), &mut b);
            e.pack(recs[100..].iter().copied(), &mut b);
            let back = u.unpack(&b, recs.len());
            assert!(back.as_ref() == Ok(&recs), "stream {k}: {:?}", back.err());
            e.reset();
            if k == 2 {
                assert_eq!(e.generation, 1, "wrapped");
            }
        }
    }
}
