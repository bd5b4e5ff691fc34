//! Memory pairs back into one record per access, as soon as a chunk is read.
//!
//! A stub before a run of memory instructions writes two accesses per record
//! (`FLAG_MEM_PAIR`: sites `s` and `s + 1`, both effective addresses, no instruction
//! address). Every reader calls [`expand`] on a chunk before anything else looks at it
//! (times, names, calls, counts, exports), so each view sees what one stub per
//! instruction would have recorded: the second access as its own record and `aux` the
//! instruction's run-time address, the site's file address plus the process's load bias
//! (0 while that bias is unknown). Books count records as the drains moved them; the
//! report counts both.

use tracer_common::{FLAG_MEM_PAIR, Record};

use crate::{read::names::Names, tracefile::Chunk};

/// Whether a record holds two memory accesses: flagged so, at a memory site (the flag
/// on any other record, e.g. one a program forged with random bits, is left as it is).
pub(crate) fn is_pair(rec: &Record, is_memory: impl Fn(u32) -> bool) -> bool {
    rec.flags & FLAG_MEM_PAIR != 0 && is_memory(rec.site)
}

/// Records a chunk turns into once its pairs are expanded (coarse times spread a
/// drain's time over these, as over an unbatched trace's records).
pub(crate) fn expanded_len(records: &[Record], is_memory: impl Fn(u32) -> bool) -> u64 {
    records.len() as u64 + records.iter().filter(|r| is_pair(r, &is_memory)).count() as u64
}

/// Learn the load bias chunk `c`'s records give away (never from a pair: its `aux` is
/// a data address), then replace each pair by its two accesses. Returns the number of
/// pairs expanded.
pub(crate) fn expand(c: &mut Chunk, names: &Names) -> u64 {
    let h = c.header;
    names.learn_from(h.pid, h.binary_id, &c.records);
    let is_memory = |site| names.is_memory(h.binary_id, site);
    let pairs = c.records.iter().filter(|r| is_pair(r, is_memory)).count();
    if pairs == 0 {
        return 0;
    }
    let bias = names.bias(h.pid, h.binary_id);
    let mut out = Vec::with_capacity(c.records.len() + pairs);
    for rec in &c.records {
        match rec.split_pair().filter(|_| is_pair(rec, is_memory)) {
            Some(accesses) => out.extend(accesses.map(|mut a| {
                a.aux = names.run_time_address(h.binary_id, a.site, bias);
                a
            })),
            None => out.push(*rec),
        }
    }
    c.records = out;
    pairs as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracefile::BinaryInfo;
    use tracer_common::{
        ChunkHeader, FLAG_MEM_READ, FLAG_MEM_SIZE_SHIFT, FLAG_MEM_WRITE, FLAG_RING,
        meta::{Metadata, Site, SiteKind, SiteMode},
        pair_flags,
    };

    const BIAS: u64 = 0x5555_0000_0000;

    fn names(ring: bool) -> Names {
        let site = |id: u32, kind| Site {
            id,
            vaddr: 0x1000 + 4 * u64::from(id),
            file_off: 0,
            name: "f".into(),
            kind,
            mode: SiteMode::Inline,
            nargs: 0,
        };
        let m = Metadata {
            binary_id: 9,
            flags: if ring {
                tracer_common::meta::META_FLAG_CIRCULAR
            } else {
                0
            },
            sites: vec![
                site(0, SiteKind::Memory),
                site(1, SiteKind::Memory),
                site(2, SiteKind::Memory),
                site(3, SiteKind::Block),
            ],
            ..Metadata::default()
        };
        let mut n = Names::new(&[]);
        n.add(&BinaryInfo {
            ordinal: 0,
            binary_id: 9,
            path: "/x/prog".into(),
            note: m.to_note(),
        });
        n
    }

    fn mem(site: u32, rw: u32, ea: u64) -> Record {
        Record {
            site,
            flags: rw | 8 << FLAG_MEM_SIZE_SHIFT,
            time: 5,
            value: ea,
            aux: 0x1000 + 4 * u64::from(site) + BIAS,
        }
    }

    fn pair(a: &Record, b: &Record) -> Record {
        Record {
            flags: pair_flags(a.flags, b.flags).unwrap() | (a.flags & FLAG_RING),
            aux: b.value,
            ..*a
        }
    }

    fn chunk(records: Vec<Record>) -> Chunk {
        Chunk {
            header: ChunkHeader {
                pid: 7,
                binary_id: 9,
                count: records.len() as u32,
                ..ChunkHeader::default()
            },
            records,
        }
    }

    /// A chunk of pairs expands into exactly the chunk of single records it was made
    /// of, once the bias is known (here: from the single record that follows).
    #[test]
    fn pairs_expand_into_the_records_a_stub_per_instruction_writes() {
        let n = names(false);
        let rw = FLAG_MEM_READ | FLAG_MEM_WRITE;
        let singles = vec![
            mem(0, FLAG_MEM_READ, 0x7000),
            mem(1, rw, 0x7008),
            mem(2, FLAG_MEM_WRITE, 0x9000),
        ];
        let mut c = chunk(vec![pair(&singles[0], &singles[1]), singles[2]]);
        assert_eq!(expanded_len(&c.records, |s| s < 3), 3);
        assert_eq!(expand(&mut c, &n), 1);
        assert_eq!(c.records, singles);
    }

    /// Without a bias the instruction address is 0, and the pair's data address never
    /// becomes a bias.
    #[test]
    fn a_pair_teaches_no_bias() {
        let n = names(false);
        // A data address that would look like a bias of a page-aligned site.
        let a = mem(0, FLAG_MEM_READ, 0x1000 + BIAS);
        let b = mem(1, FLAG_MEM_READ, 0x1004 + BIAS);
        let mut c = chunk(vec![pair(&a, &b)]);
        expand(&mut c, &n);
        assert_eq!(n.bias(7, 9), None);
        assert_eq!((c.records[0].aux, c.records[1].aux), (0, 0));
        n.loaded_at(7, 9, BIAS);
        let mut c = chunk(vec![pair(&a, &b)]);
        expand(&mut c, &n);
        assert_eq!(c.records, [a, b]);
    }

    /// In a circular buffer a pair keeps `FLAG_RING` in both halves, and never-written
    /// records (flags 0) stay as they are.
    #[test]
    fn ring_pairs_keep_their_ring_flag() {
        let n = names(true);
        let mut a = mem(0, FLAG_MEM_READ, 0x7000);
        let mut b = mem(1, FLAG_MEM_WRITE, 0x7010);
        a.flags |= FLAG_RING;
        b.flags |= FLAG_RING;
        let mut c = chunk(vec![Record::default(), pair(&a, &b), Record::default()]);
        n.loaded_at(7, 9, BIAS);
        expand(&mut c, &n);
        assert_eq!(c.records, [Record::default(), a, b, Record::default()]);
        assert!(c.records.iter().filter(|r| n.is_record(9, r)).eq([&a, &b]));
    }

    /// The pair flag on a record of another site (a block) or of no site is not a
    /// pair: such records stay as they came (a program may forge any bits).
    #[test]
    fn only_memory_sites_have_pairs() {
        let n = names(false);
        let flags = pair_flags(FLAG_MEM_READ, FLAG_MEM_READ).unwrap();
        let odd = |site| Record {
            site,
            flags,
            value: 1,
            aux: 2,
            ..Record::default()
        };
        let mut c = chunk(vec![odd(3), odd(99)]);
        assert_eq!(expand(&mut c, &n), 0);
        assert_eq!(c.records, [odd(3), odd(99)]);
    }
}
