//! Access runs: the memory sites that one stub can record together.
//!
//! A run is a memory site (its head, which has a window of its own) and the memory sites
//! after it in the same basic block whose effective addresses are already known at the
//! head: no instruction from the head up to the member writes a register the member's
//! address uses, nothing branches in between (no known branch target after the head)
//! and nothing before the member leaves the straight line (a call, a jump, a system
//! call: only the run's last member may transfer control). The head's stub then
//! computes every member's address from the registers as they are at the head, reserves
//! all their records with one pointer bump and stores two accesses a record
//! (`FLAG_MEM_PAIR`); the members keep their own instructions where they are (inside the
//! window or not) and need no window of their own.
//!
//! What this costs in fidelity: the accesses of a run are recorded before its first
//! instruction runs, so a run left early (a fault or a signal that does not return inside
//! it) has records of accesses that never happened; a signal handler's records come after
//! the whole run's. The ISA backends decide what the register sets are (`RegSet`).
//!
//! ```text
//!   mov (%rdi),%rax      head: stub records (%rdi), 8(%rdi), (%rsi,%rdx,4)
//!   mov 8(%rdi),%rcx     member
//!   add %rcx,%rax
//!   mov %eax,(%rsi,%rdx,4)  member
//!   mov 8(%rax),%rdx     not a member: %rax was written after the head; a run starts here
//! ```

use std::collections::BTreeMap;

use super::PlacedSite;
use tracer_common::meta::SiteKind;
use tracer_common::pair_flags;

/// Registers (an ISA's numbering, one bit each; a thread-pointer base has its own bit).
pub(crate) type RegSet = u64;

/// What the run finder needs of one instruction of a function, in address order.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RunInsn {
    /// A known branch target: control may arrive here without passing the head.
    pub target: bool,
    /// Control may not fall through to the next instruction (or may leave first: calls,
    /// system calls, traps).
    pub leaves: bool,
    /// A memory site that a stub before it may record: its address registers (empty when
    /// it is no such site).
    pub member: Option<RegSet>,
    /// It may head a run (a memory site with its own window).
    pub head: bool,
    /// Registers it writes (explicitly or not; a partial write counts), but for `shift`.
    pub writes: RegSet,
    /// A register it moves by a known number of bytes and writes no other way (`add $8,
    /// %rdi`, a `push`'s %rsp): a later member's address through it still is known at
    /// the head, by that much (`Member::shifts`).
    pub shift: Option<(u32, i64)>,
}

/// Why a run ended (counted for `rewriter -v`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RunEnd {
    /// The next memory site's address uses a register written since the head.
    AddressWritten,
    /// A branch target: the next memory site may be reached without the head.
    BranchTarget,
    /// The run has as many accesses as a stub records at once.
    Cap,
}

impl RunEnd {
    pub fn describe(self) -> &'static str {
        match self {
            RunEnd::AddressWritten => "an address register written inside",
            RunEnd::BranchTarget => "a branch target",
            RunEnd::Cap => "the cap of accesses a stub records",
        }
    }
}

/// What batching did in one function, or a whole binary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Runs by their number of accesses (2 and more).
    pub by_len: BTreeMap<usize, usize>,
    /// Memory sites recorded alone (a run of one), by why the next access did not join.
    pub alone: usize,
    /// Runs (of any length, one included) that stopped before a later memory site of
    /// their block (a run ends with its block anyway), by why.
    pub ends: BTreeMap<RunEnd, usize>,
}

impl RunStats {
    pub fn add(&mut self, o: &RunStats) {
        for (k, v) in &o.by_len {
            *self.by_len.entry(*k).or_default() += v;
        }
        self.alone += o.alone;
        for (k, v) in &o.ends {
            *self.ends.entry(*k).or_default() += v;
        }
    }

    /// Memory sites recorded by a run of two or more.
    pub fn batched(&self) -> usize {
        self.by_len.iter().map(|(l, n)| l * n).sum()
    }

    pub fn runs(&self) -> usize {
        self.by_len.values().sum()
    }
}

/// A run's memory site: its instruction's index, and how far each register its address
/// uses has moved since the head (`RunInsn::shift`), as (register bit, bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub at: usize,
    pub shifts: Vec<(u32, i64)>,
}

/// The run being built and what its instructions did to the registers.
#[derive(Default)]
struct Open {
    members: Vec<Member>,
    /// Registers written (other than by a known shift) since the head.
    written: RegSet,
    /// Each register's known shift since the head.
    shift: BTreeMap<u32, i64>,
}

impl Open {
    /// The shifts of the registers in `reads`, or None if one was written.
    fn shifts(&self, reads: RegSet) -> Option<Vec<(u32, i64)>> {
        if reads & self.written != 0 {
            return None;
        }
        Some(
            self.shift
                .iter()
                .filter(|(bit, d)| reads >> **bit & 1 == 1 && **d != 0)
                .map(|(&bit, &d)| (bit, d))
                .collect(),
        )
    }

    fn apply(&mut self, x: &RunInsn) {
        self.written |= x.writes;
        if let Some((bit, d)) = x.shift
            && self.written >> bit & 1 == 0
        {
            let s = self.shift.entry(bit).or_default();
            *s = s.wrapping_add(d);
        }
    }

    /// End the run (`why`: a later access of its block could not join).
    fn close(&mut self, why: Option<RunEnd>, runs: &mut Vec<Vec<Member>>, stats: &mut RunStats) {
        if let Some(why) = why.filter(|_| !self.members.is_empty()) {
            *stats.ends.entry(why).or_default() += 1;
        }
        match self.members.len() {
            0 => {}
            1 => stats.alone += 1,
            n => {
                *stats.by_len.entry(n).or_default() += 1;
                runs.push(std::mem::take(&mut self.members));
            }
        }
        *self = Open::default();
    }
}

/// The runs of two or more accesses among `insns` (head first), at most `cap` accesses
/// each, and what was found.
pub(crate) fn find(insns: &[RunInsn], cap: usize) -> (Vec<Vec<Member>>, RunStats) {
    let mut runs = Vec::new();
    let mut stats = RunStats::default();
    let mut open = Open::default();
    // The last instruction left the straight line: its run is complete.
    let mut ended = false;
    for (i, x) in insns.iter().enumerate() {
        if ended {
            open.close(None, &mut runs, &mut stats);
        }
        let joins = match x.member {
            _ if x.target => Err(RunEnd::BranchTarget),
            Some(_) if open.members.len() >= cap => Err(RunEnd::Cap),
            Some(reads) => open.shifts(reads).ok_or(RunEnd::AddressWritten),
            None => Ok(Vec::new()),
        };
        match joins {
            Err(why) => open.close(x.member.map(|_| why), &mut runs, &mut stats),
            Ok(shifts) if x.member.is_some() && !open.members.is_empty() => {
                open.members.push(Member { at: i, shifts })
            }
            Ok(_) => {}
        }
        if x.member.is_some() && open.members.is_empty() {
            if x.head {
                // What came before the head does not matter: addresses are taken here.
                open = Open::default();
                open.members.push(Member {
                    at: i,
                    shifts: Vec::new(),
                });
            } else {
                stats.alone += 1;
            }
        }
        open.apply(x);
        ended = x.leaves;
    }
    open.close(None, &mut runs, &mut stats);
    (runs, stats)
}

/// Pair each memory site with the next when their ids follow each other (the reader
/// knows the second's from the first's) and both sizes fit (`pair_flags`): the index of
/// the partner, by site index.
pub(crate) fn pairs(sites: &[&PlacedSite]) -> Vec<Option<usize>> {
    let mut pair = vec![None; sites.len()];
    let mut i = 0;
    while i + 1 < sites.len() {
        let (a, b) = (sites[i], sites[i + 1]);
        let ok = a.kind == SiteKind::Memory
            && b.kind == SiteKind::Memory
            && b.id == a.id.wrapping_add(1)
            && pair_flags(a.flags, b.flags).is_some();
        if ok {
            pair[i] = Some(i + 1);
            i += 2;
        } else {
            i += 1;
        }
    }
    pair
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(reads: RegSet, writes: RegSet) -> RunInsn {
        RunInsn {
            member: Some(reads),
            head: true,
            writes,
            ..RunInsn::default()
        }
    }

    fn other(writes: RegSet) -> RunInsn {
        RunInsn {
            writes,
            ..RunInsn::default()
        }
    }

    fn at(runs: &[Vec<Member>]) -> Vec<Vec<usize>> {
        runs.iter()
            .map(|r| r.iter().map(|m| m.at).collect())
            .collect()
    }

    const RAX: RegSet = 1;
    const RCX: RegSet = 2;
    const RDI: RegSet = 4;

    #[test]
    fn an_address_register_written_after_the_head_splits_the_run() {
        // mov (%rdi),%rax; mov 8(%rdi),%rcx; add %rcx,%rax; mov 8(%rax),%rcx; mov (%rdi),%rcx
        let insns = [
            mem(RDI, RAX),
            mem(RDI, RCX),
            other(RAX),
            mem(RAX, RCX),
            mem(RDI, RCX),
        ];
        let (runs, stats) = find(&insns, 8);
        assert_eq!(at(&runs), vec![vec![0, 1], vec![3, 4]]);
        assert_eq!(stats.ends[&RunEnd::AddressWritten], 1);
        assert_eq!(stats.batched(), 4);
    }

    #[test]
    fn the_head_writing_a_members_register_splits_too() {
        // mov (%rdi),%rax; mov 8(%rax),%rcx
        let (runs, stats) = find(&[mem(RDI, RAX), mem(RAX, RCX)], 8);
        assert!(runs.is_empty());
        assert_eq!(stats.alone, 2);
    }

    #[test]
    fn branch_targets_and_transfers_end_runs_and_the_cap_holds() {
        let target = RunInsn {
            target: true,
            ..mem(RDI, 0)
        };
        let call = RunInsn {
            leaves: true,
            ..mem(RDI, 0)
        };
        let insns = [
            mem(RDI, 0),
            mem(RDI, 0),
            target,
            mem(RDI, 0),
            call,
            mem(RDI, 0),
            mem(RDI, 0),
            mem(RDI, 0),
        ];
        let (runs, stats) = find(&insns, 2);
        let runs = at(&runs);
        // The call would be a run's last member, but the cap closed [2, 3] first; the
        // cap splits the last three.
        assert_eq!(runs, vec![vec![0, 1], vec![2, 3], vec![5, 6]]);
        assert_eq!(stats.ends[&RunEnd::BranchTarget], 1);
        assert_eq!(stats.ends[&RunEnd::Cap], 2);
        assert_eq!(stats.alone, 2);
    }

    #[test]
    fn a_site_without_a_window_joins_but_never_heads() {
        let no_window = RunInsn {
            head: false,
            ..mem(RDI, 0)
        };
        let (runs, _) = find(&[no_window, mem(RDI, 0), no_window], 8);
        assert_eq!(at(&runs), vec![vec![1, 2]]);
    }

    #[test]
    fn a_register_moved_by_a_known_amount_shifts_the_later_addresses() {
        // mov (%rdi),%rax; add $0x20,%rdi; mov -0x18(%rdi),%rcx; add $8,%rdi;
        // mov (%rdi),%rdx; mov (%rcx),%rax
        let add = |d| RunInsn {
            shift: Some((2, d)),
            ..other(0)
        };
        let insns = [
            mem(RDI, RAX),
            add(0x20),
            mem(RDI, RCX),
            add(8),
            mem(RDI, 0),
            mem(RCX, RAX),
        ];
        let (runs, stats) = find(&insns, 8);
        assert_eq!(at(&runs), vec![vec![0, 2, 4]]);
        let shifts: Vec<_> = runs[0].iter().map(|m| m.shifts.clone()).collect();
        assert_eq!(shifts, [vec![], vec![(2, 0x20)], vec![(2, 0x28)]]);
        assert_eq!(stats.ends[&RunEnd::AddressWritten], 1);
        // Moves before the head do not count: the addresses are computed there.
        let insns = [add(8), other(RAX), mem(RDI, 0), mem(RDI | RAX, 0)];
        let (runs, _) = find(&insns, 8);
        assert_eq!(at(&runs), vec![vec![2, 3]]);
        assert!(runs[0].iter().all(|m| m.shifts.is_empty()));
        // A shift after a write of the register is no shift: the register is unknown.
        let insns = [mem(RDI, RDI), add(8), mem(RDI, 0)];
        assert!(find(&insns, 8).0.is_empty());
    }
}
