//! What the guest programs are built with: the sources of `xtask/arm64-vm/`, the cross
//! compiler, and reading an ELF file's symbols and sections.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSymbol};

use super::CROSS_GCC;
use crate::util::{self, cmd};

pub(super) fn src(name: &str) -> PathBuf {
    util::workspace_root().join("xtask/arm64-vm").join(name)
}

pub(super) struct Elf {
    pub data: Vec<u8>,
}

impl Elf {
    pub(super) fn read(path: &Path) -> Result<Self> {
        Ok(Elf {
            data: std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
        })
    }
    pub(super) fn file(&self) -> Result<object::File<'_>> {
        Ok(object::File::parse(&*self.data)?)
    }
    /// (address, size, file offset) of a symbol.
    pub(super) fn symbol(&self, name: &str) -> Result<(u64, u64, u64)> {
        let f = self.file()?;
        let s = f
            .symbols()
            .find(|s| s.name() == Ok(name))
            .with_context(|| format!("no symbol {name}"))?;
        let sec = f.section_by_index(s.section_index().context("undefined symbol")?)?;
        let (off, _) = sec.file_range().context("symbol in a NOBITS section")?;
        Ok((s.address(), s.size(), s.address() - sec.address() + off))
    }
    pub(super) fn word_at_file(&self, off: u64) -> Option<u32> {
        let b = self.data.get(off as usize..off as usize + 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }
    pub(super) fn is_pic(&self) -> Result<bool> {
        Ok(self.file()?.kind() != object::ObjectKind::Executable)
    }
}

/// `bti c`, `bti jc`, `paciasp`, `pacibsp`: landing pads a uprobe site goes after (as the
/// rewriter places them).
pub(super) const LANDING_PADS: &[u32] = &[0xd503_245f, 0xd503_24df, 0xd503_233f, 0xd503_237f];

pub(super) fn cross_gcc(out: &Path, source: &Path, flags: &[&str]) -> Result<()> {
    util::run(
        cmd(CROSS_GCC)
            .args(["-O2", "-g", "-pthread"])
            .args(flags)
            .arg(source)
            .arg("-o")
            .arg(out),
    )
}
