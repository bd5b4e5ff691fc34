//! The report's memory section: what the memory sites' accesses touched. Accesses per
//! site (the hottest, with their function and line), bytes per function, reads, writes
//! and modifies (an access flagged both read and write: `add %eax,(%rdi)`), and the
//! hottest 64-byte cache lines and 4 KiB pages, per process. Counted in the report's
//! second pass over records whose pairs are already expanded (`read/accesses.rs`).

use std::collections::HashMap;

use serde::Serialize;
use tracer_common::{FLAG_MEM_READ, FLAG_MEM_WRITE, Record, mem_size};

use crate::read::{names::Names, symbols::Frame};

/// Sites listed, hottest first.
pub(crate) const TOP_SITES: usize = 20;
/// Functions listed by bytes.
pub(crate) const TOP_FUNCTIONS: usize = 20;
/// Cache lines and pages listed.
pub(crate) const TOP_SPOTS: usize = 10;
const LINE_SHIFT: u32 = 6;
const PAGE_SHIFT: u32 = 12;

/// Reads, writes and modifies (read and write at once) of a site or of all.
#[derive(Serialize, Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Kinds {
    pub reads: u64,
    pub writes: u64,
    pub modifies: u64,
}

impl Kinds {
    fn add(&mut self, flags: u32) {
        match (flags & FLAG_MEM_READ != 0, flags & FLAG_MEM_WRITE != 0) {
            (true, true) => self.modifies += 1,
            (false, true) => self.writes += 1,
            // A record without either bit (a damaged one) counts as a read.
            _ => self.reads += 1,
        }
    }

    fn sum(&mut self, o: &Kinds) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.modifies += o.modifies;
    }
}

#[derive(Serialize)]
pub(crate) struct MemorySite {
    pub binary: String,
    pub site: u32,
    pub function: String,
    /// `file:line` of the instruction (innermost frame); empty without debug information.
    pub location: String,
    pub accesses: u64,
    pub bytes: u64,
    #[serde(flatten)]
    pub kinds: Kinds,
}

#[derive(Serialize)]
pub(crate) struct FunctionBytes {
    pub binary: String,
    pub function: String,
    pub accesses: u64,
    pub bytes: u64,
}

/// A cache line or page of one process and the accesses that touched it.
#[derive(Serialize, PartialEq, Eq, Debug)]
pub(crate) struct HotSpot {
    pub pid: u32,
    /// Its first byte.
    pub address: u64,
    pub accesses: u64,
}

/// `memory` of the report (only when the trace has memory accesses).
#[derive(Serialize)]
pub(crate) struct Memory {
    pub accesses: u64,
    pub bytes: u64,
    #[serde(flatten)]
    pub kinds: Kinds,
    /// The [`TOP_SITES`] sites with the most accesses.
    pub sites: Vec<MemorySite>,
    /// The [`TOP_FUNCTIONS`] functions that moved the most bytes.
    pub functions: Vec<FunctionBytes>,
    /// The [`TOP_SPOTS`] 64-byte lines and 4 KiB pages with the most accesses.
    pub lines: Vec<HotSpot>,
    pub pages: Vec<HotSpot>,
}

/// Per site: accesses, bytes, kinds.
#[derive(Default)]
struct SiteCount {
    accesses: u64,
    bytes: u64,
    kinds: Kinds,
}

/// What the second pass gathers.
#[derive(Default)]
pub(crate) struct MemoryCounts {
    sites: HashMap<(u64, u32), SiteCount>,
    lines: HashMap<(u32, u64), u64>,
    pages: HashMap<(u32, u64), u64>,
}

impl MemoryCounts {
    /// Count one access of process `pid`, binary `bin`.
    pub(crate) fn access(&mut self, pid: u32, bin: u64, rec: &Record) {
        let s = self.sites.entry((bin, rec.site)).or_default();
        s.accesses += 1;
        s.bytes += u64::from(mem_size(rec.flags));
        s.kinds.add(rec.flags);
        *self
            .lines
            .entry((pid, rec.value >> LINE_SHIFT))
            .or_default() += 1;
        *self
            .pages
            .entry((pid, rec.value >> PAGE_SHIFT))
            .or_default() += 1;
    }

    /// The section, or None without accesses.
    pub(crate) fn finish(self, names: &Names) -> Option<Memory> {
        if self.sites.is_empty() {
            return None;
        }
        let (mut accesses, mut bytes, mut kinds) = (0, 0, Kinds::default());
        let mut functions: HashMap<(u64, &str), (u64, u64)> = HashMap::new();
        for (&(bin, site), c) in &self.sites {
            accesses += c.accesses;
            bytes += c.bytes;
            kinds.sum(&c.kinds);
            let f = functions.entry((bin, names.symbol(bin, site))).or_default();
            f.0 += c.accesses;
            f.1 += c.bytes;
        }
        Some(Memory {
            accesses,
            bytes,
            kinds,
            sites: top_sites(&self.sites, names),
            functions: top_functions(functions, names),
            lines: hottest(&self.lines, LINE_SHIFT),
            pages: hottest(&self.pages, PAGE_SHIFT),
        })
    }
}

fn top_sites(sites: &HashMap<(u64, u32), SiteCount>, names: &Names) -> Vec<MemorySite> {
    let mut order: Vec<(&(u64, u32), &SiteCount)> = sites.iter().collect();
    order.sort_by(|a, b| b.1.accesses.cmp(&a.1.accesses).then(a.0.cmp(b.0)));
    order
        .into_iter()
        .take(TOP_SITES)
        .map(|(&(bin, site), c)| MemorySite {
            binary: names.binary(bin).to_string(),
            site,
            function: names.symbol(bin, site).to_string(),
            location: names
                .site_frames(bin, site)
                .first()
                .map(Frame::location)
                .unwrap_or_default(),
            accesses: c.accesses,
            bytes: c.bytes,
            kinds: c.kinds,
        })
        .collect()
}

fn top_functions(functions: HashMap<(u64, &str), (u64, u64)>, names: &Names) -> Vec<FunctionBytes> {
    let mut list: Vec<FunctionBytes> = functions
        .into_iter()
        .map(|((bin, function), (accesses, bytes))| FunctionBytes {
            binary: names.binary(bin).to_string(),
            function: function.to_string(),
            accesses,
            bytes,
        })
        .collect();
    list.sort_by(|a, b| {
        (b.bytes, b.accesses, &a.binary, &a.function).cmp(&(
            a.bytes,
            a.accesses,
            &b.binary,
            &b.function,
        ))
    });
    list.truncate(TOP_FUNCTIONS);
    list
}

/// The [`TOP_SPOTS`] keys with the most accesses (ties: lowest pid, then address).
fn hottest(counts: &HashMap<(u32, u64), u64>, shift: u32) -> Vec<HotSpot> {
    let mut list: Vec<(&(u32, u64), &u64)> = counts.iter().collect();
    list.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    list.into_iter()
        .take(TOP_SPOTS)
        .map(|(&(pid, n), &accesses)| HotSpot {
            pid,
            address: n << shift,
            accesses,
        })
        .collect()
}

/// A site's place for the text view: `function (file:line)`.
pub(crate) fn site_place(s: &MemorySite) -> String {
    if s.location.is_empty() {
        s.function.clone()
    } else {
        format!("{} ({})", s.function, s.location)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::FLAG_MEM_SIZE_SHIFT;

    fn rec(site: u32, rw: u32, size: u32, ea: u64) -> Record {
        Record {
            site,
            flags: rw | size << FLAG_MEM_SIZE_SHIFT,
            value: ea,
            ..Record::default()
        }
    }

    #[test]
    fn kinds_bytes_lines_and_pages() {
        let mut m = MemoryCounts::default();
        let rw = FLAG_MEM_READ | FLAG_MEM_WRITE;
        // Site 1 reads 8 bytes at 0x1000, 0x1008 .. 0x1038 (one line, one page).
        for i in 0..8 {
            m.access(7, 9, &rec(1, FLAG_MEM_READ, 8, 0x1000 + 8 * i));
        }
        // Site 2 writes 4 bytes on three lines of the next page; site 3 modifies once.
        for ea in [0x2000, 0x2040, 0x2080] {
            m.access(7, 9, &rec(2, FLAG_MEM_WRITE, 4, ea));
        }
        m.access(7, 9, &rec(3, rw, 1, 0x2081));
        // Another process at the same address is another line.
        m.access(8, 9, &rec(1, FLAG_MEM_READ, 8, 0x1000));
        let names = Names::new(&[]);
        let s = m.finish(&names).unwrap();
        assert_eq!((s.accesses, s.bytes), (13, 8 * 8 + 12 + 1 + 8));
        let kinds = Kinds {
            reads: 9,
            writes: 3,
            modifies: 1,
        };
        assert_eq!(s.kinds, kinds);
        let sites: Vec<(u32, u64, u64)> = s
            .sites
            .iter()
            .map(|s| (s.site, s.accesses, s.bytes))
            .collect();
        assert_eq!(sites, [(1, 9, 72), (2, 3, 12), (3, 1, 1)]);
        let spot = |pid, address, accesses| HotSpot {
            pid,
            address,
            accesses,
        };
        assert_eq!(
            s.lines[..3],
            [spot(7, 0x1000, 8), spot(7, 0x2080, 2), spot(7, 0x2000, 1)]
        );
        assert_eq!(
            s.pages,
            [spot(7, 0x1000, 8), spot(7, 0x2000, 4), spot(8, 0x1000, 1)]
        );
        assert_eq!(s.functions.len(), 1); // every site is "?" without a site table
        assert_eq!((s.functions[0].accesses, s.functions[0].bytes), (13, 85));
    }

    #[test]
    fn no_accesses_no_section() {
        assert!(MemoryCounts::default().finish(&Names::new(&[])).is_none());
    }
}
