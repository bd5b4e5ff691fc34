//! Packed records: how `SECTION_CHUNK_PACKED` stores a chunk's records (format
//! versions 3 and 4), about a fifth of their 32 bytes on real programs.
//!
//! Each chunk is packed on its own (a reader needs nothing from earlier sections), in
//! record order, against two predictions: the previous record of the chunk, and what
//! the chunk last saw at the record's site (a table indexed by `site % N`, N = 256 in
//! format version 4 and 64 in version 3, holding the site, its flags, value, aux, and
//! the site that came after it). Per
//! record, one tag byte, then for each field the tag does not mark as predicted an
//! unsigned LEB128 varint:
//!
//! ```text
//! tag bit 0     site  = the successor the table holds for the previous record's site
//!                       (else: zigzag(site - previous site), 32-bit)
//! tag bit 1     flags = the table's flags for this site   (else: flags)
//! tag bits 2-3  value, bits 4-5 aux, each one of:
//!               0  zigzag(field - the table's field for this site, or - 0 if unseen)
//!               1  zigzag(field - the previous record's field)
//!               2  = the table's field for this site (no varint)
//!               3  = the previous record's field (no varint)
//! tag bit 6     time  = the previous record's (no varint; format version 6)
//! else          time: zigzag(time - previous time)  (the first record: from 0)
//! ```
//!
//! Differences are wrapping. Return addresses repeat per site and lie near the
//! previous record's, arguments are passed down call chains, timestamps grow by
//! little, sites follow each other in patterns: most records take 4 to 8 bytes.
//!
//! A chunk group (`SECTION_CHUNKS_PACKED`, version 5) codes its chunks as one such
//! stream with a 4,096-entry table; version 6 with a 65,536-entry table, and tag bit 6
//! in groups and single chunks alike (coarse timestamps repeat a drain's epoch: a byte
//! a record saved). A memory trace of sqlite (65,608 sites, coarse time) takes 6.2
//! bytes an access in version 5's groups of 8 chunks, 2.1 in version 6's groups of 64
//! (record time: 6.2 and 3.2), and the packer takes less time a record (fewer
//! misses, shorter varints). The packer (`encode.rs`, the consumer's hot loop) and the
//! readers' [`Model`] here compute the same predictions in two ways: the packer for
//! speed, the model for checked reading.

mod encode;

use thiserror::Error;
use tracer_common::Record;

use encode::Encoder;

/// Entries of the per-site table: format version 4 (sqlite: 6.2 bytes a record where
/// version 3's 64 entries, whose collisions hid half the sites, gave 6.8).
const TABLE: usize = 256;
/// Version 3's table.
const TABLE_V3: usize = 64;
const SITE: u8 = 1;
const FLAGS: u8 = 2;
/// Shift of the value's and the aux's 2-bit mode in the tag.
const VALUE_SHIFT: u8 = 2;
const AUX_SHIFT: u8 = 4;
const DELTA_SITE: u8 = 0;
const DELTA_PREV: u8 = 1;
const SAME_SITE: u8 = 2;
const SAME_PREV: u8 = 3;
/// The time is the previous record's (format version 6).
const TIME_SAME: u8 = 1 << 6;
/// The tag bits of versions 3 to 5, and of version 6.
const KNOWN_TAG_BITS_V5: u8 = 0x3f;
const KNOWN_TAG_BITS: u8 = 0x7f;

#[derive(Debug, Error, PartialEq, Eq)]
pub(super) enum PackError {
    #[error("packed records end inside record {0}")]
    Truncated(usize),
    #[error("packed record {0} has an overlong varint")]
    Overlong(usize),
    #[error("packed record {0} has unknown tag bits {1:#x}")]
    BadTag(usize, u8),
    #[error("packed record {0} predicts a site the chunk has not seen")]
    NoPrediction(usize),
    #[error("{0} bytes after the chunk's last record")]
    Trailing(usize),
}

/// What a chunk last saw at a site.
#[derive(Clone, Copy, Default)]
struct Seen {
    valid: bool,
    site: u32,
    flags: u32,
    value: u64,
    aux: u64,
    next: Option<u32>,
}

/// Entries of the per-site table of a chunk group (`SECTION_CHUNKS_PACKED`), format
/// version 5: a group's 4,096 records meet more sites than one chunk's 512 (a sqlite
/// trace: 5.1 bytes a record with 256 entries, 3.8 with 4,096).
const GROUP_TABLE_V5: usize = 4096;
/// Version 6: memory sites come by the ten thousand (sqlite's memory trace: 4.5 bytes
/// an access in groups of 64 chunks with 4,096 entries, 3.1 with 65,536, before the
/// time bit).
const GROUP_TABLE: usize = 65536;

/// The predictions both sides keep, updated after each record.
pub(super) struct Model<const T: usize> {
    /// `T` entries; one is valid when its bit in `valid` is set (a new stream clears
    /// the bits, not the entries).
    table: Vec<Seen>,
    valid: Vec<u64>,
    /// The tag bits of the format version being read.
    known: u8,
    prev: Record,
    /// A record came before: `prev` is real, and its table entry is its own (the
    /// update wrote it last), so it needs no lookup.
    started: bool,
}

impl<const T: usize> Model<T> {
    fn new(known: u8) -> Self {
        Model {
            table: vec![Seen::default(); T],
            valid: vec![0; T.div_ceil(64)],
            known,
            prev: Record::default(),
            started: false,
        }
    }

    /// Forget everything: a new stream starts.
    fn reset(&mut self) {
        self.valid.fill(0);
        self.prev = Record::default();
        self.started = false;
    }

    fn is_valid(&self, i: usize) -> bool {
        self.valid[i / 64] >> (i % 64) & 1 != 0
    }

    fn at(&self, site: u32) -> Option<&Seen> {
        let i = site as usize % T;
        let s = &self.table[i];
        (self.is_valid(i) && s.site == site).then_some(s)
    }

    fn successor(&self) -> Option<u32> {
        if !self.started {
            return None;
        }
        self.table[self.prev.site as usize % T].next
    }

    /// After record `r`, whose site's entry was `seen` (default if none). Returns the
    /// successor the next record's [`Model::successor`] sees.
    fn update(&mut self, r: &Record, seen: &Seen) -> Option<u32> {
        let prev = self.prev.site;
        if self.started {
            self.table[prev as usize % T].next = Some(r.site);
        }
        // The same site again: its entry is the one just given a successor.
        let next = if self.started && r.site == prev {
            Some(r.site)
        } else {
            seen.next
        };
        self.started = true;
        let i = r.site as usize % T;
        self.valid[i / 64] |= 1 << (i % 64);
        self.table[i] = Seen {
            valid: true,
            site: r.site,
            flags: r.flags,
            value: r.value,
            aux: r.aux,
            next,
        };
        self.prev = *r;
        next
    }
}

fn unzigzag(z: u64) -> u64 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

/// Append `records`, packed on their own, to `out`.
pub(super) fn pack(records: impl ExactSizeIterator<Item = Record>, out: &mut Vec<u8>) {
    Encoder::<TABLE>::new().pack(records, out)
}

/// Packs the records of several chunks as one stream (`SECTION_CHUNKS_PACKED`): the
/// predictions carry over from chunk to chunk, where a chunk packed on its own starts
/// cold (a sqlite trace: 6.2 bytes a record in chunks of 512, 3.8 in groups of 8).
/// Packs chunk groups (`SECTION_CHUNKS_PACKED`); one per packing thread.
pub struct GroupPacker(Encoder<GROUP_TABLE>);

impl Default for GroupPacker {
    fn default() -> Self {
        GroupPacker(Encoder::new())
    }
}

impl GroupPacker {
    /// Forget everything: a new group starts.
    pub(crate) fn start(&mut self) {
        self.0.reset();
    }

    /// Append `records`, packed after the group's earlier ones, to `out`.
    pub(crate) fn pack(
        &mut self,
        records: impl ExactSizeIterator<Item = Record>,
        out: &mut Vec<u8>,
    ) {
        self.0.pack(records, out)
    }
}

/// A cursor over packed bytes; errors name the record being read.
struct Bytes<'a> {
    b: &'a [u8],
    at: usize,
    record: usize,
}

impl Bytes<'_> {
    fn byte(&mut self) -> Result<u8, PackError> {
        let v = *self
            .b
            .get(self.at)
            .ok_or(PackError::Truncated(self.record))?;
        self.at += 1;
        Ok(v)
    }

    fn varint(&mut self) -> Result<u64, PackError> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(PackError::Overlong(self.record));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(PackError::Overlong(self.record))
    }

    /// A value or aux stored in `mode` (its low 2 bits) against the table's `site`
    /// and the previous record's `prev`.
    fn field(&mut self, mode: u8, site: u64, prev: u64) -> Result<u64, PackError> {
        Ok(match mode & 3 {
            DELTA_SITE => site.wrapping_add(unzigzag(self.varint()?)),
            DELTA_PREV => prev.wrapping_add(unzigzag(self.varint()?)),
            SAME_SITE => site,
            _ => prev,
        })
    }
}

/// [`unpack_version`] for this version's files (tests).
#[cfg(test)]
fn unpack(bytes: &[u8], count: usize) -> Result<Vec<Record>, PackError> {
    unpack_version(bytes, count, super::FORMAT_VERSION)
}

/// Exactly `count` records from `bytes` (all of them, nothing after), packed as format
/// `version` packs them (3: a 64-entry table; 6: the time bit).
pub(super) fn unpack_version(
    bytes: &[u8],
    count: usize,
    version: u32,
) -> Result<Vec<Record>, PackError> {
    let known = known_tag_bits(version);
    if version <= 3 {
        unpack_into(&mut Model::<TABLE_V3>::new(known), bytes, count)
    } else {
        unpack_into(&mut Model::<TABLE>::new(known), bytes, count)
    }
}

fn known_tag_bits(version: u32) -> u8 {
    if version >= 6 {
        KNOWN_TAG_BITS
    } else {
        KNOWN_TAG_BITS_V5
    }
}

/// Unpacks chunk groups (`SECTION_CHUNKS_PACKED`): [`GroupPacker`]'s counterpart for
/// the file's format version, its table reused from group to group.
pub(super) enum GroupUnpacker {
    V5(Model<GROUP_TABLE_V5>),
    V6(Model<GROUP_TABLE>),
}

impl GroupUnpacker {
    /// For a file of format `version` (5 or later: earlier ones have no groups).
    pub(super) fn for_version(version: u32) -> Self {
        if version >= 6 {
            GroupUnpacker::V6(Model::new(KNOWN_TAG_BITS))
        } else {
            GroupUnpacker::V5(Model::new(KNOWN_TAG_BITS_V5))
        }
    }

    /// Exactly `count` records from `bytes`, a group's stream.
    pub(super) fn unpack(&mut self, bytes: &[u8], count: usize) -> Result<Vec<Record>, PackError> {
        match self {
            GroupUnpacker::V5(m) => {
                m.reset();
                unpack_into(m, bytes, count)
            }
            GroupUnpacker::V6(m) => {
                m.reset();
                unpack_into(m, bytes, count)
            }
        }
    }
}

/// Exactly `count` records from `bytes`, against model `m` (fresh).
fn unpack_into<const T: usize>(
    m: &mut Model<T>,
    bytes: &[u8],
    count: usize,
) -> Result<Vec<Record>, PackError> {
    let mut c = Bytes {
        b: bytes,
        at: 0,
        record: 0,
    };
    // Every record takes at least two bytes: a hostile count cannot allocate more.
    let mut out = Vec::with_capacity(count.min(bytes.len() / 2));
    for k in 0..count {
        c.record = k;
        let tag = c.byte()?;
        if tag & !m.known != 0 {
            return Err(PackError::BadTag(k, tag));
        }
        let site = if tag & SITE != 0 {
            m.successor().ok_or(PackError::NoPrediction(k))?
        } else {
            m.prev.site.wrapping_add(unzigzag(c.varint()?) as u32)
        };
        let seen = m.at(site).copied().unwrap_or_default();
        let needs_seen = tag & FLAGS != 0
            || (tag >> VALUE_SHIFT) & 3 == SAME_SITE
            || (tag >> AUX_SHIFT) & 3 == SAME_SITE;
        if needs_seen && !seen.valid {
            return Err(PackError::NoPrediction(k));
        }
        let flags = if tag & FLAGS != 0 {
            seen.flags
        } else {
            c.varint()? as u32
        };
        let value = c.field(tag >> VALUE_SHIFT, seen.value, m.prev.value)?;
        let aux = c.field(tag >> AUX_SHIFT, seen.aux, m.prev.aux)?;
        let time = if tag & TIME_SAME != 0 {
            m.prev.time
        } else {
            m.prev.time.wrapping_add(unzigzag(c.varint()?))
        };
        let r = Record {
            site,
            flags,
            time,
            value,
            aux,
        };
        let _ = m.update(&r, &seen);
        out.push(r);
    }
    match bytes.len() - c.at {
        0 => Ok(out),
        n => Err(PackError::Trailing(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `packed_bytes_are_stable`'s records as version 3 packed them (as stop 20's
    /// packer did; the first record by hand: tag 0, zigzag site 10, flags 0, value +20
    /// (zigzag 10), aux 0x8000, time 2000).
    const GOLDEN_V3: &[u8] = &[
        0, 10, 0, 20, 128, 128, 2, 208, 15, 28, 128, 1, 2, 32, 20, 20, 127, 0, 2, 31, 40, 28, 4, 0,
        64, 2, 34, 0, 2, 2, 43, 16, 42, 3, 2, 43, 18,
    ];
    /// The same in version 4: the third record finds site 5's entry (35 bytes, not 37).
    const GOLDEN_V4: &[u8] = &[
        0, 10, 0, 20, 128, 128, 2, 208, 15, 28, 128, 1, 2, 32, 20, 34, 127, 2, 40, 28, 4, 0, 64, 2,
        34, 0, 2, 2, 43, 16, 42, 3, 2, 43, 18,
    ];

    /// Version 6: version 4's bytes, then site 5 again at the same time (tag: site
    /// predicted by 7's successor, flags and value and aux as the site's, time bit).
    const GOLDEN_V6: &[u8] = &[
        0, 10, 0, 20, 128, 128, 2, 208, 15, 28, 128, 1, 2, 32, 20, 34, 127, 2, 40, 28, 4, 0, 64, 2,
        34, 0, 2, 2, 43, 16, 42, 3, 2, 43, 18, 0x6b,
    ];

    fn splitmix(s: &mut u64) -> u64 {
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn round_trip(records: &[Record]) -> usize {
        let mut b = Vec::new();
        pack(records.iter().copied(), &mut b);
        assert_eq!(unpack(&b, records.len()).as_deref(), Ok(records));
        b.len()
    }

    #[test]
    fn extremes_and_random_records_round_trip() {
        let max = Record {
            site: u32::MAX,
            flags: u32::MAX,
            time: u64::MAX,
            value: u64::MAX,
            aux: u64::MAX,
        };
        round_trip(&[]);
        round_trip(&[Record::default(), max, Record::default(), max, max]);
        let mut s = 7;
        for n in [1, 2, 127, 128] {
            let recs: Vec<Record> = (0..n)
                .map(|_| Record {
                    // Few sites (collisions in the table), some wild.
                    site: if splitmix(&mut s).is_multiple_of(4) {
                        splitmix(&mut s) as u32
                    } else {
                        (splitmix(&mut s) % 200) as u32
                    },
                    flags: (splitmix(&mut s) % 3) as u32 * 0x101,
                    time: splitmix(&mut s) >> (splitmix(&mut s) % 64),
                    value: splitmix(&mut s) % 5,
                    aux: splitmix(&mut s) >> 40,
                })
                .collect();
            round_trip(&recs);
        }
    }

    /// The bytes of format versions 3 to 6, pinned: a round trip alone would not see
    /// a change made to both sides; old versions must still read as they were written. Sites 5 and 69 share an entry of version 3's
    /// table (69 % 64 = 5), not of version 4's; site 7 repeats.
    #[test]
    fn packed_bytes_are_stable() {
        let r = |site, flags, time, value, aux| Record {
            site,
            flags,
            time,
            value,
            aux,
        };
        let recs = [
            r(5, 0, 1000, 10, 0x4000),
            r(69, 2, 1010, 10, 0x4010),
            r(5, 0, 1030, 11, 0x4000),
            r(7, 0, 1031, 11, 0x4020),
            r(7, 0, 1032, 12, 0x4020),
            r(7, 0, 1040, 12, 0x4020),
            r(5, 0, 1041, 11, 0x4000),
            r(7, 0, 1050, 12, 0x4020),
        ];
        // Versions 3 to 5 as their packers wrote them (a group: the same stream).
        assert_eq!(
            unpack_version(GOLDEN_V3, recs.len(), 3).as_deref(),
            Ok(&recs[..])
        );
        for v in [4, 5] {
            assert_eq!(
                unpack_version(GOLDEN_V4, recs.len(), v).as_deref(),
                Ok(&recs[..])
            );
        }
        let mut u = GroupUnpacker::for_version(5);
        assert_eq!(u.unpack(GOLDEN_V4, recs.len()).as_deref(), Ok(&recs[..]));
        // Version 6: the same but for the time bit, which the last record (its time
        // repeated) takes instead of a varint 0.
        let mut recs = recs.to_vec();
        recs.push(r(5, 0, 1050, 11, 0x4000));
        let mut v6 = Vec::new();
        pack(recs.iter().copied(), &mut v6);
        assert_eq!(v6, GOLDEN_V6);
        assert_eq!(v6[..GOLDEN_V4.len()], *GOLDEN_V4);
        assert_eq!(unpack_version(&v6, recs.len(), 6).as_deref(), Ok(&recs[..]));
        // A group codes its records as one stream, the same way: split in two chunks
        // (the model carries over), the same bytes; its bigger table only matters where
        // sites collide in 256 entries.
        let mut g = GroupPacker::default();
        let mut u = GroupUnpacker::for_version(6);
        for _ in 0..2 {
            v6.clear();
            g.start();
            g.pack(recs[..4].iter().copied(), &mut v6);
            g.pack(recs[4..].iter().copied(), &mut v6);
            assert_eq!(v6, GOLDEN_V6);
            assert_eq!(
                u.unpack(&v6, recs.len()).as_deref(),
                Ok(&recs[..]),
                "reused"
            );
        }
    }

    #[test]
    fn a_call_pattern_packs_small() {
        // Entries and exits of a loop of two calls: sites, return addresses and flags
        // repeat, times grow by a little.
        let recs: Vec<Record> = (0..128u64)
            .map(|i| Record {
                site: [3, 4, 9, 10][i as usize % 4],
                flags: 0,
                time: 1_000_000 + 37 * i,
                value: i / 4,
                aux: 0x5555_0000 + (i % 4) * 16,
            })
            .collect();
        let n = round_trip(&recs);
        assert!(n <= 4 * recs.len(), "{n} bytes");
    }

    #[test]
    fn damaged_bytes_are_errors() {
        let recs: Vec<Record> = (0..10)
            .map(|i| Record {
                site: i % 3,
                time: u64::from(i) * 1000,
                ..Record::default()
            })
            .collect();
        let mut b = Vec::new();
        pack(recs.iter().copied(), &mut b);
        assert!(matches!(unpack(&b, 11), Err(PackError::Truncated(10))));
        assert_eq!(
            unpack(&b, 9),
            Err(PackError::Trailing(
                b.len() - {
                    let mut c = Vec::new();
                    pack(recs[..9].iter().copied(), &mut c);
                    c.len()
                }
            ))
        );
        assert_eq!(unpack(&[0x80], 1), Err(PackError::BadTag(0, 0x80)));
        // The time bit is version 6's: earlier versions never wrote it.
        assert_eq!(
            unpack_version(&[0x40], 1, 5),
            Err(PackError::BadTag(0, 0x40))
        );
        assert_eq!(unpack(&[SITE, 0], 1), Err(PackError::NoPrediction(0)));
        assert_eq!(
            unpack(&[SAME_SITE << VALUE_SHIFT, 0, 0], 1),
            Err(PackError::NoPrediction(0))
        );
        let overlong = [
            0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        assert_eq!(unpack(&overlong, 1), Err(PackError::Overlong(0)));
        // Every cut and every flipped byte: an error or other records, never a panic.
        for cut in 0..b.len() {
            let _ = unpack(&b[..cut], recs.len());
        }
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0xa5;
            let _ = unpack(&d, recs.len());
        }
    }
}
