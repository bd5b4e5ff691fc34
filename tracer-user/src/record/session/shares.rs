//! Fair shares of a system-wide session: one user cannot take every binary slot
//! (`MAX_BINARIES`) or every `TABLES` entry (`MAX_PROCESSES`) so that other users'
//! programs go untraced. A uid may take at most half of each; every refusal is counted
//! (once per file or process) and reported in the session summary.
//!
//! A binary is charged to the file's owner; root's files are not capped (no other user can
//! make one). A `TABLES` entry is charged to the process's real uid, on the eBPF side too
//! (`tracer-ebpf/src/tables.rs`: `TABLE_OWNERS`, `TABLE_UIDS`, `STAT_TABLE_SHARE`); a
//! process past its uid's share is not drained at exit. A refused binary's waiting program
//! is told to go on untraced. Tests `trust_files::one_user_filling_the_binary_slots_leaves_room_for_others`,
//! `trust_tables::one_user_cannot_fill_tables`.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{HashMap as EbpfHashMap, MapData},
};
use tracer_common::ebpf::{MAP_TABLE_OWNERS, MAP_TABLE_UIDS, MAX_BINARIES};

use crate::record::session::binaries::FileId;

/// Why an instrumented binary is not traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum BinaryRefusal {
    #[error("the session already traces {MAX_BINARIES} instrumented binaries")]
    SessionFull,
    #[error("the session already traces {MAX_BINARIES} copies of binaries")]
    TooManyCopies,
    #[error("its owner (uid {uid}) already has {cap} binaries traced, its share of the session")]
    UidShare { uid: u32, cap: u32 },
    #[error(
        "another file with binary_id {id:#x} but other contents is traced; \
         its records would be named after that file's sites"
    )]
    SameIdOtherContents { id: u64 },
}

impl BinaryRefusal {
    /// The kind of refusal, as the summary counts them.
    pub(super) fn kind(self) -> RefusalKind {
        match self {
            BinaryRefusal::SessionFull => RefusalKind::SessionFull,
            BinaryRefusal::TooManyCopies => RefusalKind::TooManyCopies,
            BinaryRefusal::UidShare { .. } => RefusalKind::UidShare,
            BinaryRefusal::SameIdOtherContents { .. } => RefusalKind::SameIdOtherContents,
        }
    }
}

/// A kind of [`BinaryRefusal`] (the summary's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum RefusalKind {
    SessionFull,
    TooManyCopies,
    UidShare,
    SameIdOtherContents,
}

impl std::fmt::Display for RefusalKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RefusalKind::SessionFull => "the session is full",
            RefusalKind::TooManyCopies => "the session has its share of copies",
            RefusalKind::UidShare => "their owner's share is full",
            RefusalKind::SameIdOtherContents => "another file has their binary_id",
        })
    }
}

/// Binaries a uid may have traced in a system-wide session.
pub(super) const BINARIES_PER_UID: u32 = MAX_BINARIES / 2;
/// Processes of one uid that the tracer puts in `TABLES` in a system-wide session (the
/// eBPF side's share, one definition for both).
pub(super) const TABLES_PER_UID: usize = tracer_common::ebpf::TABLES_PER_UID as usize;

/// What each uid has, and what was refused.
#[derive(Default)]
pub(super) struct Shares {
    /// Per-uid caps in force (system-wide sessions).
    capped: bool,
    binaries: HashMap<u32, u32>,
    /// Processes seeded into `TABLES`, per uid.
    tables: HashMap<u32, HashSet<u32>>,
    pub refused_binaries: BTreeMap<RefusalKind, u64>,
    refused_files: HashSet<(FileId, u64)>,
    refused_pids: HashSet<u32>,
    pub refused_tables: u64,
    /// Refused files still held (remembered, so that their next programs are released
    /// at once too); at most `MAX_HELD_REFUSED`.
    held_refused: HashSet<FileId>,
}

/// Refused files the session keeps open to release their programs (each is a
/// descriptor; past this, a refused file is forgotten and its later programs wait out
/// their time).
pub(super) const MAX_HELD_REFUSED: usize = 128;

impl Shares {
    pub(super) fn new(capped: bool) -> Self {
        Shares {
            capped,
            ..Default::default()
        }
    }

    /// Whether a binary owned by `uid` may be traced (one more file). Root's files are
    /// not capped: no other user can make a file root's, and the system's own binaries
    /// should not be limited to half the session.
    pub(super) fn may_add_binary(&self, uid: u32) -> Result<(), BinaryRefusal> {
        let have = self.binaries.get(&uid).copied().unwrap_or(0);
        if self.capped && uid != 0 && have >= BINARIES_PER_UID {
            return Err(BinaryRefusal::UidShare {
                uid,
                cap: BINARIES_PER_UID,
            });
        }
        Ok(())
    }

    pub(super) fn charge_binary(&mut self, uid: u32) {
        *self.binaries.entry(uid).or_default() += 1;
    }

    /// Count a refusal of file `file` (binary `id`) once; true the first time.
    pub(super) fn refuse_binary(&mut self, file: FileId, id: u64, why: BinaryRefusal) -> bool {
        if !self.refused_files.insert((file, id)) {
            return false;
        }
        *self.refused_binaries.entry(why.kind()).or_default() += 1;
        true
    }

    /// Whether refused file `file` stays held (remembered) or is forgotten.
    pub(super) fn keep_refused(&mut self, file: FileId) -> bool {
        self.held_refused.contains(&file)
            || (self.held_refused.len() < MAX_HELD_REFUSED && self.held_refused.insert(file))
    }

    /// Whether process `pid` of `uid` may get a `TABLES` entry from the tracer; a
    /// refusal is counted once per process.
    pub(super) fn may_seed(&mut self, pid: u32, uid: u32) -> bool {
        if !self.capped {
            return true;
        }
        let pids = self.tables.entry(uid).or_default();
        if pids.contains(&pid) {
            return true;
        }
        if pids.len() >= TABLES_PER_UID {
            // Processes that ended gave their entries back.
            pids.retain(|&p| alive(p));
        }
        if pids.len() >= TABLES_PER_UID {
            if self.refused_pids.insert(pid) {
                self.refused_tables += 1;
            }
            return false;
        }
        pids.insert(pid);
        true
    }

    /// Whether per-uid caps are in force (a system-wide session).
    pub(super) fn capped(&self) -> bool {
        self.capped
    }

    /// The summary's lines about refusals (none when nothing was refused).
    pub(super) fn summary_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (why, n) in &self.refused_binaries {
            lines.push(format!(
                "{n} instrumented binar{} not traced: {why}",
                if *n == 1 { "y" } else { "ies" }
            ));
        }
        if self.refused_tables > 0 {
            lines.push(format!(
                "{} processes not seeded into TABLES: their user's share ({TABLES_PER_UID}) is full",
                self.refused_tables
            ));
        }
        lines
    }
}

/// Whether process `pid` exists.
/// Charge process `pid`'s new `TABLES` entry (a seed) to `uid` in the counters the eBPF
/// side keeps for the entries it learns (`TABLE_OWNERS`, `TABLE_UIDS`), so that seeded
/// and learned entries share one count: false = the uid holds its share (capped
/// sessions only). Not atomic with the eBPF side's updates: a race may leave the count
/// off by one (it never wraps).
pub(super) fn charge_table(ebpf: &mut Ebpf, pid: u32, uid: u32, capped: bool) -> Result<bool> {
    if table_owners(ebpf)?.get(&pid, 0).is_ok() {
        return Ok(true);
    }
    let mut counts = table_uids(ebpf)?;
    let held = counts.get(&uid, 0).unwrap_or(0);
    if capped && held >= TABLES_PER_UID as u64 {
        return Ok(false);
    }
    counts.insert(uid, held + 1, 0)?;
    if table_owners(ebpf)?.insert(pid, uid, 0).is_err() {
        uncharge(ebpf, uid)?;
    }
    Ok(true)
}

/// Give back process `pid`'s charge (its seed was not added after all).
pub(super) fn uncharge_table(ebpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut owners = table_owners(ebpf)?;
    let Ok(uid) = owners.get(&pid, 0) else {
        return Ok(());
    };
    owners.remove(&pid)?;
    uncharge(ebpf, uid)
}

fn uncharge(ebpf: &mut Ebpf, uid: u32) -> Result<()> {
    let mut counts = table_uids(ebpf)?;
    let held = counts.get(&uid, 0).unwrap_or(0);
    Ok(counts.insert(uid, held.saturating_sub(1), 0)?)
}

fn table_owners(ebpf: &mut Ebpf) -> Result<EbpfHashMap<&mut MapData, u32, u32>> {
    let map = ebpf
        .map_mut(MAP_TABLE_OWNERS)
        .with_context(|| format!("no {MAP_TABLE_OWNERS} map"))?;
    Ok(EbpfHashMap::try_from(map)?)
}

fn table_uids(ebpf: &mut Ebpf) -> Result<EbpfHashMap<&mut MapData, u32, u64>> {
    let map = ebpf
        .map_mut(MAP_TABLE_UIDS)
        .with_context(|| format!("no {MAP_TABLE_UIDS} map"))?;
    Ok(EbpfHashMap::try_from(map)?)
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review item 6: root's files counted as uid 0 and were capped at half the
    /// session, so a system-wide session traced at most 32 system binaries.
    #[test]
    fn root_files_are_not_capped_other_users_are() {
        let mut s = Shares::new(true);
        for _ in 0..MAX_BINARIES {
            assert_eq!(s.may_add_binary(0), Ok(()));
            s.charge_binary(0);
        }
        for _ in 0..BINARIES_PER_UID {
            assert_eq!(s.may_add_binary(1000), Ok(()));
            s.charge_binary(1000);
        }
        assert_eq!(
            s.may_add_binary(1000),
            Err(BinaryRefusal::UidShare {
                uid: 1000,
                cap: BINARIES_PER_UID
            })
        );
    }

    /// Refusals are counted once per file, by kind, in the kinds' order.
    #[test]
    fn refusals_counted_once_by_kind_in_order() {
        let mut s = Shares::new(true);
        let file = |ino| FileId { dev: 1, ino };
        assert!(s.refuse_binary(file(3), 7, BinaryRefusal::SameIdOtherContents { id: 7 }));
        assert!(!s.refuse_binary(file(3), 7, BinaryRefusal::SameIdOtherContents { id: 7 }));
        assert!(s.refuse_binary(file(4), 8, BinaryRefusal::UidShare { uid: 5, cap: 32 }));
        assert!(s.refuse_binary(file(5), 9, BinaryRefusal::SessionFull));
        assert_eq!(
            s.summary_lines(),
            [
                "1 instrumented binary not traced: the session is full",
                "1 instrumented binary not traced: their owner's share is full",
                "1 instrumented binary not traced: another file has their binary_id",
            ]
        );
    }
}
