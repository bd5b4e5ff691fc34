//! Site-count floors derived from the binary under test by binutils, independently of
//! the rewriter, so the real-program tests hold on whatever version Debian ships:
//! the functions its symbol tables name (`nm`, distinct addresses), and within them the
//! returns, conditional jumps and instructions with a memory operand (`objdump -d`).
//! The rewriter finds more functions than that (FDE ranges), never fewer.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use tracer_common::meta::SiteKind;

use crate::SiteCounts;

/// What binutils count in a binary's named functions.
#[derive(Debug, Clone, Copy)]
pub struct Derived {
    pub functions: u64,
    pub rets: u64,
    pub cond_jumps: u64,
    pub memory: u64,
}

/// The fraction of each kind's sites that must be inline: the project's coverage
/// targets, not one binary's measurement.
const INLINE_TARGET: &[(SiteKind, f64)] = &[
    (SiteKind::FunctionEntry, 0.99),
    (SiteKind::FunctionExit, 0.95),
    (SiteKind::Block, 0.85),
    (SiteKind::Memory, 0.80),
];

/// The rewriter may leave out a few memory operands binutils shows (`nop` forms,
/// prefetches, bound checks): a tenth at most.
const MEMORY_SHARE: f64 = 0.9;

impl Derived {
    pub fn of(binary: &Path) -> Derived {
        let funcs = function_ranges(binary);
        assert!(
            !funcs.is_empty(),
            "{}: nm names no function",
            binary.display()
        );
        let mut d = Derived {
            functions: funcs.len() as u64,
            rets: 0,
            cond_jumps: 0,
            memory: 0,
        };
        each_instruction(binary, |addr, mnemonic, operands| {
            let inside = funcs
                .range(..=addr)
                .next_back()
                .is_some_and(|(start, size)| addr < start + size);
            if inside {
                d.count(mnemonic, operands);
            }
        });
        d
    }

    fn count(&mut self, mnemonic: &str, operands: &str) {
        if mnemonic.starts_with("ret") {
            self.rets += 1;
        } else if mnemonic.starts_with('j') && !mnemonic.starts_with("jmp") {
            self.cond_jumps += 1;
        }
        let no_access = ["lea", "nop", "bnd", "prefetch"]
            .iter()
            .any(|p| mnemonic.starts_with(p));
        if operands.contains('(') && !no_access {
            self.memory += 1;
        }
    }

    /// The smallest site count of `kind` the rewriter may report.
    pub fn floor(&self, kind: SiteKind) -> u64 {
        match kind {
            SiteKind::FunctionEntry => self.functions,
            SiteKind::FunctionExit => self.rets,
            // Every conditional jump starts a block, and so does every function.
            SiteKind::Block => self.cond_jumps + self.functions,
            SiteKind::Memory => (self.memory as f64 * MEMORY_SHARE) as u64,
            _ => 0,
        }
    }

    /// Panics unless `kind`'s counts reach the floor and the inline target.
    pub fn check(&self, what: &str, kind: SiteKind, c: &SiteCounts) {
        let floor = self.floor(kind);
        assert!(
            c.total >= floor,
            "{what}: {} sites {c:?}, fewer than binutils' {floor} ({self:?})",
            kind.name()
        );
        let target = INLINE_TARGET
            .iter()
            .find(|t| t.0 == kind)
            .map_or(0.0, |t| t.1);
        assert!(
            c.inline as f64 >= c.total as f64 * target,
            "{what}: {} sites {c:?}, under {:.0} % inline",
            kind.name(),
            target * 100.0
        );
        eprintln!("{what}: {} {c:?} >= {floor} (binutils)", kind.name());
    }
}

/// Start → size of every sized function symbol, dynamic or not (`nm -S`).
fn function_ranges(binary: &Path) -> BTreeMap<u64, u64> {
    let mut funcs = BTreeMap::new();
    for dynamic in [true, false] {
        let mut c = Command::new("nm");
        c.args(["--defined-only", "-S"]);
        if dynamic {
            c.arg("-D");
        }
        let out = c.arg(binary).output().expect("nm (binutils)");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let [addr, size, kind, _] = line.split_whitespace().collect::<Vec<_>>()[..]
                && matches!(kind, "T" | "t" | "W" | "w" | "i")
                && let (Ok(a), Ok(s)) =
                    (u64::from_str_radix(addr, 16), u64::from_str_radix(size, 16))
                && s > 0
            {
                funcs.insert(a, s);
            }
        }
    }
    funcs
}

/// `f(address, mnemonic, operands)` for every instruction in `.text` (`objdump -d`).
fn each_instruction(binary: &Path, mut f: impl FnMut(u64, &str, &str)) {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-j", ".text"])
        .arg(binary)
        .output()
        .expect("objdump (binutils)");
    assert!(out.status.success(), "objdump -d {}", binary.display());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((addr, rest)) = line.split_once(":\t") else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr.trim(), 16) else {
            continue;
        };
        let rest = rest.trim();
        let (mnemonic, operands) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        f(addr, mnemonic, operands.trim());
    }
}
