//! Finding a binary's debug information and keeping a copy: the binary itself (build-id
//! still the recorded one), the tracer's cache by build-id, `--debug-dir` and
//! `/usr/lib/debug` `.build-id`, `.gnu_debuglink`. Below `record` (fills the cache at
//! its end) and `read::symbols` (loads what it finds), so both may use it.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use object::{Object, ObjectSection};
use serde::Serialize;

/// Where a binary's debug information came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DebugSource {
    pub path: String,
    /// "binary", "cache", "build-id", "debuglink", or "symbols" (no DWARF found: names
    /// from the binary's symbol table only).
    pub how: &'static str,
}

/// The tracer's debug cache: `$XDG_CACHE_HOME/utrace/debug` or `~/.cache/utrace/debug`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("UTRACE_DEBUG_CACHE") {
        return (!d.is_empty()).then(|| PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("utrace").join("debug"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `.build-id/xx/yyyy.debug` under `root`.
fn build_id_path(root: &Path, build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    Some(
        root.join(".build-id")
            .join(hex(&[*first]))
            .join(format!("{}.debug", hex(rest))),
    )
}

/// What a candidate file holds.
struct FileFacts {
    build_id: Option<Vec<u8>>,
    dwarf: bool,
    debuglink: Option<(Vec<u8>, u32)>,
}

/// `path` mapped read-only, if it is a regular file (not a FIFO or device a hostile
/// debuglink or trace could name).
pub fn map_regular(path: &Path) -> Option<memmap2::Mmap> {
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking: opening a FIFO for reading would wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        log::warn!("{}: not a regular file; ignored", path.display());
        return None;
    }
    // SAFETY: a read-only private mapping of a regular file; a file truncated by
    // someone else while mapped faults like any reader's would (addr2line maps the
    // same files the same way).
    unsafe { memmap2::Mmap::map(&f) }.ok()
}

fn facts_of(data: &[u8]) -> Option<FileFacts> {
    let obj = object::File::parse(data).ok()?;
    Some(FileFacts {
        build_id: obj.build_id().ok().flatten().map(<[u8]>::to_vec),
        dwarf: obj
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0),
        debuglink: obj
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(n, crc)| (n.to_vec(), crc)),
    })
}

fn facts(path: &Path) -> Option<FileFacts> {
    facts_of(&map_regular(path)?)
}

/// A `.gnu_debuglink` name is a file name: one normal path component (not absolute,
/// no `..`), else it could point anywhere.
fn debuglink_name(name: &[u8]) -> Option<PathBuf> {
    use std::path::Component;
    let p = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name));
    let mut c = p.components();
    match (c.next(), c.next()) {
        (Some(Component::Normal(_)), None) => Some(p.to_path_buf()),
        _ => None,
    }
}

/// The file to read `path`'s debug information from, and how it was found.
pub fn locate(
    path: &Path,
    build_id: &[u8],
    cache: Option<&Path>,
    dirs: &[PathBuf],
) -> Option<(PathBuf, &'static str)> {
    // No recorded build-id: any file at the path is taken, with a note.
    let same_build = |f: &FileFacts| build_id.is_empty() || f.build_id.as_deref() == Some(build_id);
    if build_id.is_empty() {
        log::info!(
            "{}: no build-id recorded; the file there now is taken as the traced one",
            path.display()
        );
    }
    let own = facts(path).filter(|f| {
        let ok = same_build(f);
        if !ok {
            log::warn!(
                "{}: not the binary that was traced (build-id differs); looking elsewhere",
                path.display()
            );
        }
        ok
    });
    if own.as_ref().is_some_and(|f| f.dwarf) {
        return Some((path.to_path_buf(), "binary"));
    }
    let with_dwarf = |p: &Path| facts(p).is_some_and(|f| f.dwarf && same_build(&f));
    if !build_id.is_empty() {
        if let Some(p) = cache.and_then(|c| build_id_path(c, build_id))
            && with_dwarf(&p)
        {
            return Some((p, "cache"));
        }
        for root in dirs
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new("/usr/lib/debug")])
        {
            if let Some(p) = build_id_path(root, build_id)
                && with_dwarf(&p)
            {
                return Some((p, "build-id"));
            }
        }
    }
    if let Some((name, crc)) = own.as_ref().and_then(|f| f.debuglink.clone()) {
        let Some(name) = debuglink_name(&name) else {
            log::warn!(
                "{}: ignoring debuglink {:?} (not a plain file name)",
                path.display(),
                String::from_utf8_lossy(&name)
            );
            return own.map(|_| (path.to_path_buf(), "symbols"));
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        let mut candidates = vec![dir.join(&name), dir.join(".debug").join(&name)];
        if let Ok(rel) = dir.strip_prefix("/") {
            candidates.push(Path::new("/usr/lib/debug").join(rel).join(&name));
        }
        candidates.extend(dirs.iter().map(|d| d.join(&name)));
        for c in candidates {
            if c != path
                && map_regular(&c)
                    .is_some_and(|m| crc32(&m) == crc && facts_of(&m).is_some_and(|f| f.dwarf))
            {
                return Some((c, "debuglink"));
            }
        }
    }
    own.map(|_| (path.to_path_buf(), "symbols"))
}

/// CRC-32 (IEEE) as `.gnu_debuglink` uses it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (!(crc & 1)).wrapping_add(1));
        }
    }
    !crc
}

/// Keep the debug information of a traced binary in the cache, under its build-id
/// (what `tracer record` does at the end of a session): the binary itself when it has
/// DWARF, else the debug file found for it. Nothing to do when already cached.
pub fn cache_debug_info(path: &Path, build_id: &[u8], dirs: &[PathBuf]) -> Result<()> {
    let Some(cache) = cache_dir() else {
        return Ok(());
    };
    let Some(dest) = build_id_path(&cache, build_id) else {
        return Ok(());
    };
    if dest.exists() {
        return Ok(());
    }
    let Some((src, how)) = locate(path, build_id, None, dirs) else {
        return Ok(());
    };
    if how == "symbols" {
        return Ok(());
    }
    let parent = dest.parent().context("cache path has no parent")?;
    if !safe_cache_dir(&cache, parent)? {
        return Ok(());
    }
    // The bytes written are the bytes checked: the build-id again, on this mapping.
    let data = map_regular(&src).with_context(|| format!("cannot read {}", src.display()))?;
    if facts_of(&data).and_then(|f| f.build_id).as_deref() != Some(build_id) {
        return Ok(()); // changed since located
    }
    let tmp = crate::tracefile::temporary_for(&dest)?;
    let written = (|| {
        use std::os::unix::fs::OpenOptionsExt;
        // A new file (never through a link planted at the name), readable by all: the
        // debug information of a binary that was readable.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        std::io::Write::write_all(&mut f, &data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &dest)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", dest.display()));
    }
    Ok(())
}

/// Make `dir` (inside `cache`) and check that nobody else could have steered it: the
/// cache must be ours (as root, a cache under another user's home is skipped: `sudo -E`
/// keeps `HOME`), and no directory on the way may be a symbolic link.
fn safe_cache_dir(cache: &Path, dir: &Path) -> Result<bool> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let mut existing = cache;
    while !existing.exists() {
        match existing.parent() {
            Some(p) => existing = p,
            None => break,
        }
    }
    if let Ok(m) = std::fs::metadata(existing)
        && m.uid() != euid
    {
        log::info!(
            "not caching debug information in {}: owned by uid {}, not {euid}",
            existing.display(),
            m.uid()
        );
        return Ok(false);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mut d = dir;
    while d.starts_with(cache) {
        let m = std::fs::symlink_metadata(d)?;
        if m.file_type().is_symlink() || m.uid() != euid {
            log::warn!(
                "not caching debug information: {} is a link or not ours",
                d.display()
            );
            return Ok(false);
        }
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn debuglink_names_are_plain_file_names() {
        assert_eq!(debuglink_name(b"x.debug"), Some(PathBuf::from("x.debug")));
        for bad in [&b"/dev/zero"[..], b"../x.debug", b"a/b.debug", b"..", b"."] {
            assert_eq!(
                debuglink_name(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn build_id_paths() {
        assert_eq!(
            build_id_path(Path::new("/d"), &[0xab, 0xcd, 0xef]).unwrap(),
            PathBuf::from("/d/.build-id/ab/cdef.debug")
        );
        assert!(build_id_path(Path::new("/d"), &[]).is_none());
    }
}
