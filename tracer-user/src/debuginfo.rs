//! Finding a binary's debug information and keeping a copy: the binary itself (build-id
//! still the recorded one), the tracer's cache by build-id, `--debug-dir` and
//! `/usr/lib/debug` `.build-id`, `.gnu_debuglink`. Below `record` (fills the cache at
//! its end) and `read::symbols` (loads what it finds), so both may use it.
//!
//! The build-id cache is reached by `safe_dir`: its path walked from `/` by descriptor with
//! `O_NOFOLLOW`, every directory root's or the user's and not open to others unless sticky,
//! missing ones made 0700. At a session's end each binary's debug information is copied in:
//! every file read by descriptor with bounded reads, never mapped, at most 4 GiB, and as
//! root only files of root or its own (`trust_limits::the_debug_cache_follows_no_users_link`,
//! `the_debug_cache_reads_no_users_file_as_root`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use object::{Object, ObjectSection};
use serde::Serialize;

/// Where a binary's debug information came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct DebugSource {
    pub path: String,
    /// "binary", "cache", "build-id", "debuglink", or "symbols" (no DWARF found: names
    /// from the binary's symbol table only).
    pub how: &'static str,
}

/// The tracer's debug cache: `$XDG_CACHE_HOME/utrace/debug` or `~/.cache/utrace/debug`
/// (`UTRACE_DEBUG_CACHE` overrides, empty: none). As root, only if the part of its path
/// that exists passes the [`safe_dir`] walk: a reader run with another user's
/// environment (`sudo -E`) takes no debug files from a directory that user controls.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let dir = if let Some(d) = std::env::var_os("UTRACE_DEBUG_CACHE") {
        (!d.is_empty()).then(|| PathBuf::from(d))?
    } else {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        base.join("utrace").join("debug")
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0
        && let Err(why) = walk_dir(&dir, false)
    {
        log::info!("not using the debug cache {}: {why}", dir.display());
        return None;
    }
    Some(dir)
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
pub(crate) fn map_regular(path: &Path) -> Option<memmap2::Mmap> {
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

/// Largest file the cache step reads (the tracer's limit on a binary, `MAX_BINARY_BYTES`
/// in `record::binaries`): a debug file is no bigger than what it describes, give or take.
pub(crate) const MAX_CACHED_FILE_BYTES: u64 = 4 << 30;

/// How candidate files are read.
#[derive(Clone, Copy)]
enum Reading {
    /// Mapped ([`map_regular`]): readers, running as the user who reads the trace.
    Map,
    /// Read whole into memory through a descriptor, at most [`MAX_CACHED_FILE_BYTES`],
    /// and only files owned by root or the effective user when the tracer is root: the
    /// cache step at a session's end, where a root tracer handles files of every user
    /// it traced (a mapping of a file its owner truncates faults, killing root with
    /// SIGBUS; a sparse file of a terabyte would be checksummed whole).
    Bounded,
}

/// A candidate file's bytes, mapped or read.
enum Bytes {
    Map(memmap2::Mmap),
    Read(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Read(v) => v,
        }
    }
}

impl Reading {
    fn load(self, path: &Path) -> Option<Bytes> {
        match self {
            Reading::Map => map_regular(path).map(Bytes::Map),
            Reading::Bounded => match read_bounded(path, MAX_CACHED_FILE_BYTES) {
                Ok(v) => Some(Bytes::Read(v)),
                Err(why) => {
                    log::info!("{}: not read for the debug cache: {why}", path.display());
                    None
                }
            },
        }
    }
}

/// Why the cache step does not read a file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotRead {
    #[error("not a regular file")]
    NotRegular,
    #[error("{size} bytes, more than the {max} read")]
    TooBig { size: u64, max: u64 },
    #[error("owned by uid {0}, neither root nor us")]
    Foreign(u32),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// `path`'s bytes, read (never mapped) through one descriptor: opened `O_PATH` first
/// (a FIFO or device at the path is never opened for real), `fstat`ed regular, at most
/// `max` bytes and, as root, owned by root or the effective user; then reopened for
/// reading through `/proc/self/fd/N` and read with at most `max + 1` bytes asked for
/// (a file that grows meanwhile is refused, one that shrinks just reads short).
fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, NotRead> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)?;
    let m = held.metadata()?;
    if !m.is_file() {
        return Err(NotRead::NotRegular);
    }
    if m.len() > max {
        return Err(NotRead::TooBig { size: m.len(), max });
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 && m.uid() != 0 {
        return Err(NotRead::Foreign(m.uid()));
    }
    let fd_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&held));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(fd_path)?;
    let mut data = Vec::new();
    f.take(max + 1).read_to_end(&mut data)?;
    if data.len() as u64 > max {
        return Err(NotRead::TooBig {
            size: data.len() as u64,
            max,
        });
    }
    Ok(data)
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

fn facts(path: &Path, how: Reading) -> Option<FileFacts> {
    facts_of(&how.load(path)?)
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
pub(crate) fn locate(
    path: &Path,
    build_id: &[u8],
    cache: Option<&Path>,
    dirs: &[PathBuf],
) -> Option<(PathBuf, &'static str)> {
    locate_from(path, path, build_id, cache, dirs, Reading::Map)
}

/// [`locate`] for a binary named `path` whose own bytes are read at `own_bytes` (the
/// tracer's held descriptor, `/proc/self/fd/N`: not whatever is at the path by now);
/// the path still says where its debuglink and `/usr/lib/debug` files are.
fn locate_from(
    path: &Path,
    own_bytes: &Path,
    build_id: &[u8],
    cache: Option<&Path>,
    dirs: &[PathBuf],
    reading: Reading,
) -> Option<(PathBuf, &'static str)> {
    // No recorded build-id: any file at the path is taken, with a note.
    let same_build = |f: &FileFacts| build_id.is_empty() || f.build_id.as_deref() == Some(build_id);
    if build_id.is_empty() {
        log::info!(
            "{}: no build-id recorded; the file there now is taken as the traced one",
            path.display()
        );
    }
    let own = facts(own_bytes, reading).filter(|f| {
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
        return Some((own_bytes.to_path_buf(), "binary"));
    }
    let with_dwarf = |p: &Path| facts(p, reading).is_some_and(|f| f.dwarf && same_build(&f));
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
            return own.map(|_| (own_bytes.to_path_buf(), "symbols"));
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        let mut candidates = vec![dir.join(&name), dir.join(".debug").join(&name)];
        if let Ok(rel) = dir.strip_prefix("/") {
            candidates.push(Path::new("/usr/lib/debug").join(rel).join(&name));
        }
        candidates.extend(dirs.iter().map(|d| d.join(&name)));
        for c in candidates {
            if c != path
                && c != own_bytes
                && reading
                    .load(&c)
                    .is_some_and(|m| crc32(&m) == crc && facts_of(&m).is_some_and(|f| f.dwarf))
            {
                return Some((c, "debuglink"));
            }
        }
    }
    own.map(|_| (own_bytes.to_path_buf(), "symbols"))
}

/// CRC-32 (IEEE) as `.gnu_debuglink` uses it (table-driven: debug files are large).
fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Keep the debug information of a traced binary in the cache, under its build-id
/// (what `tracer record` does at the end of a session): the binary itself when it has
/// DWARF, else the debug file found for it. Nothing to do when already cached.
///
/// The cache's path comes from the environment, which `sudo -E` hands a root tracer
/// from the invoking user: it is walked from `/` one directory at a time by descriptor
/// ([`safe_dir`]), never through a symbolic link or a directory another user could
/// change, and what is missing is made 0700. A cache that fails the walk is not used.
///
/// `own_bytes` is where the binary's own bytes are read (the session's held descriptor
/// of it, so a file swapped in at `path` since it was traced is not cached under its
/// build-id); `path` says where its debuglink and `/usr/lib/debug` files are.
///
/// Every file looked at here (the binary, debug files) is read as [`Reading::Bounded`]
/// says: never mapped, at most [`MAX_CACHED_FILE_BYTES`], and, as root, only if owned
/// by root or the effective user (another user's debug file is not cached).
pub(crate) fn cache_debug_info(
    path: &Path,
    own_bytes: &Path,
    build_id: &[u8],
    dirs: &[PathBuf],
) -> Result<()> {
    let Some(cache) = cache_dir() else {
        return Ok(());
    };
    let Some(dest) = build_id_path(&cache, build_id) else {
        return Ok(());
    };
    let (Some(parent), Some(name)) = (dest.parent(), dest.file_name()) else {
        return Ok(());
    };
    let dir = match safe_dir(parent) {
        Ok(d) => d,
        Err(why) => {
            log::info!(
                "not caching debug information in {}: {why}",
                cache.display()
            );
            return Ok(());
        }
    };
    if dir_has(&dir, name) {
        return Ok(());
    }
    let Some((src, how)) = locate_from(path, own_bytes, build_id, None, dirs, Reading::Bounded)
    else {
        return Ok(());
    };
    if how == "symbols" {
        return Ok(());
    }
    // The bytes written are the bytes checked: the build-id again, on this copy.
    let data = Reading::Bounded
        .load(&src)
        .with_context(|| format!("cannot read {}", src.display()))?;
    if facts_of(&data).and_then(|f| f.build_id).as_deref() != Some(build_id) {
        return Ok(()); // changed since located
    }
    write_in(&dir, name, &data).with_context(|| format!("cannot write {}", dest.display()))
}

/// Why a cache directory is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnsafeDir {
    #[error("{0} is not an absolute path without '..'")]
    NotPlain(PathBuf),
    #[error("{0} is a symbolic link or not a directory")]
    NotDirectory(PathBuf),
    #[error("{path} is owned by uid {uid}, neither root nor us")]
    Foreign { path: PathBuf, uid: u32 },
    #[error("{0} is writable by others and not sticky")]
    OpenToOthers(PathBuf),
    #[error("cannot open or create {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// Directory `dir` opened one component at a time from `/` (`O_NOFOLLOW`), each
/// owned by root or the effective user and, if others may write in it, sticky (so no
/// one else can rename what is in it); components that are missing are created 0700.
pub(crate) fn safe_dir(dir: &Path) -> Result<std::os::fd::OwnedFd, UnsafeDir> {
    walk_dir(dir, true)?.ok_or_else(|| UnsafeDir::NotPlain(dir.into()))
}

/// The walk of [`safe_dir`]; without `create`, it stops (with None) at the first
/// component that does not exist.
fn walk_dir(dir: &Path, create: bool) -> Result<Option<std::os::fd::OwnedFd>, UnsafeDir> {
    use std::path::Component;
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        let cwd = std::env::current_dir().map_err(|e| UnsafeDir::Io(dir.into(), e))?;
        cwd.join(dir)
    };
    let mut at = PathBuf::from("/");
    let mut fd = open_dir(None, Path::new("/")).map_err(|e| UnsafeDir::Io(at.clone(), e))?;
    check_dir(&fd, &at)?;
    for c in dir.components() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => n,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(UnsafeDir::NotPlain(dir.clone()));
            }
        };
        at.push(name);
        fd = match open_dir(Some(&fd), Path::new(name)) {
            Ok(next) => next,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !create => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                make_dir(&fd, name).map_err(|e| UnsafeDir::Io(at.clone(), e))?;
                open_dir(Some(&fd), Path::new(name)).map_err(|e| UnsafeDir::Io(at.clone(), e))?
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                return Err(UnsafeDir::NotDirectory(at));
            }
            Err(e) => return Err(UnsafeDir::Io(at, e)),
        };
        check_dir(&fd, &at)?;
    }
    Ok(Some(fd))
}

fn c_name(name: &std::ffi::OsStr) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(name.as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput.into())
}

/// `name` in directory `at` (or the absolute `name`) as a directory, no link followed.
fn open_dir(
    at: Option<&std::os::fd::OwnedFd>,
    name: &Path,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = c_name(name.as_os_str())?;
    let dirfd = at.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid NUL-terminated name and a directory descriptor we hold (or CWD).
    let fd = unsafe { libc::openat(dirfd, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Make directory `name` in `at`, 0700 (someone else making it first is found by
/// the checks that follow).
fn make_dir(at: &std::os::fd::OwnedFd, name: &std::ffi::OsStr) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let c = c_name(name)?;
    // SAFETY: a valid NUL-terminated name and a directory descriptor we hold.
    if unsafe { libc::mkdirat(at.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// The owner and mode rule of [`safe_dir`] for the open directory `fd` (at `path`).
fn check_dir(fd: &std::os::fd::OwnedFd, path: &Path) -> Result<(), UnsafeDir> {
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::File::from(fd.try_clone().map_err(|e| UnsafeDir::Io(path.into(), e))?);
    let m = f.metadata().map_err(|e| UnsafeDir::Io(path.into(), e))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if m.uid() != 0 && m.uid() != euid {
        return Err(UnsafeDir::Foreign {
            path: path.into(),
            uid: m.uid(),
        });
    }
    if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
        return Err(UnsafeDir::OpenToOthers(path.into()));
    }
    Ok(())
}

/// Whether `name` exists in `dir` (as anything: a link there is not followed).
fn dir_has(dir: &std::os::fd::OwnedFd, name: &std::ffi::OsStr) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(c) = c_name(name) else {
        return false;
    };
    // SAFETY: stat is plain data the call fills; valid name and directory descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        ) == 0
    }
}

/// `data` as file `name` in `dir`: written to a new temporary file there (never through
/// a link planted at its name), then renamed into place, both by the held descriptor.
fn write_in(
    dir: &std::os::fd::OwnedFd,
    name: &std::ffi::OsStr,
    data: &[u8],
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let (tmp, dest) = (c_name(&tmp_name)?, c_name(name)?);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // Readable by all: the debug information of a binary that was readable.
    // SAFETY: a valid NUL-terminated name and a directory descriptor we hold.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), tmp.as_ptr(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let written = f
        .write_all(data)
        .and_then(|()| f.sync_all())
        .and_then(|()| {
            // SAFETY: valid names, both in the directory we hold.
            let r = unsafe {
                libc::renameat(
                    dir.as_raw_fd(),
                    tmp.as_ptr(),
                    dir.as_raw_fd(),
                    dest.as_ptr(),
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    if written.is_err() {
        // SAFETY: a valid name in the directory we hold.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
    }
    written
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
    fn bounded_reads_refuse_fifos_and_big_files() {
        let base = std::env::temp_dir().join(format!("utrace-bounded-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let fifo = base.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer: opening it for reading would block; O_PATH does not.
        assert!(matches!(read_bounded(&fifo, 100), Err(NotRead::NotRegular)));
        let big = base.join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        assert!(matches!(
            read_bounded(&big, MAX_CACHED_FILE_BYTES),
            Err(NotRead::TooBig { size, .. }) if size == 1 << 40
        ));
        std::fs::write(&big, b"0123456789").unwrap();
        assert_eq!(read_bounded(&big, 10).unwrap(), b"0123456789");
        assert!(matches!(read_bounded(&big, 9), Err(NotRead::TooBig { .. })));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn build_id_paths() {
        assert_eq!(
            build_id_path(Path::new("/d"), &[0xab, 0xcd, 0xef]).unwrap(),
            PathBuf::from("/d/.build-id/ab/cdef.debug")
        );
        assert!(build_id_path(Path::new("/d"), &[]).is_none());
    }

    #[test]
    fn a_cache_path_through_a_link_or_a_foreign_directory_is_refused() {
        let base = std::env::temp_dir().join(format!("utrace-safe-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        std::os::unix::fs::symlink("/etc", base.join("link")).unwrap();
        assert!(matches!(
            safe_dir(&base.join("link/utrace/debug")),
            Err(UnsafeDir::NotDirectory(_))
        ));
        assert!(!Path::new("/etc/utrace").exists());
        // Missing parts are made, 0700.
        let made = base.join("a/b");
        safe_dir(&made).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(matches!(
            safe_dir(&base.join("a/../x")),
            Err(UnsafeDir::NotPlain(_))
        ));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
