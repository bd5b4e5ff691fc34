//! A process's `/proc/PID` directory, opened once: what is read or written below it
//! (`maps`, `map_files/…`, `mem`, `stat`) is opened relative to it (`openat`), so it is
//! this process, never a later one that got its pid.

use std::{
    ffi::{CStr, CString},
    fs::File,
    io::Read,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::{Context, Result};

/// Most of a text file of `/proc/PID` read (`maps` of a process with 65k mappings is
/// a few MiB).
const MAX_TEXT_BYTES: u64 = 16 << 20;

pub(crate) struct ProcDir {
    pub(crate) pid: u32,
    dir: OwnedFd,
}

impl ProcDir {
    pub(crate) fn open(pid: u32) -> Result<Self> {
        let path = CString::new(format!("/proc/{pid}")).context("pid path")?;
        // SAFETY: a valid C string; the result is checked and owned below.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot open /proc/{pid} (is process {pid} alive?)"));
        }
        // SAFETY: a new descriptor we own.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ProcDir { pid, dir })
    }

    /// `name` in this process's directory, opened with `flags`.
    pub(crate) fn open_at(&self, name: &CStr, flags: libc::c_int) -> Result<File> {
        // SAFETY: a directory descriptor we hold and a valid C string; the result is
        // checked and owned below.
        let fd =
            unsafe { libc::openat(self.dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| {
                format!("cannot open /proc/{}/{}", self.pid, name.to_string_lossy())
            });
        }
        // SAFETY: a new descriptor we own.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `/proc/PID/mem` for reading and writing: bound to the address space the process
    /// has now (after an exec, it reaches nothing).
    pub(crate) fn mem(&self) -> Result<File> {
        self.open_at(c"mem", libc::O_RDWR)
    }

    /// The file mapped at `start..end`, opened as `O_PATH` through `map_files` (the
    /// mapped inode itself; nothing is opened for real: see `binaries::HeldFile`).
    pub(crate) fn map_file(&self, start: u64, end: u64) -> Result<File> {
        // Named without the zero padding of the maps file (`400000-401000`).
        let name = CString::new(format!("map_files/{start:x}-{end:x}")).context("map name")?;
        self.open_at(&name, libc::O_PATH | libc::O_NOCTTY)
    }

    /// A text file of the directory (at most `MAX_TEXT_BYTES` read).
    pub(crate) fn read(&self, name: &CStr) -> Result<String> {
        let mut text = String::new();
        self.open_at(name, libc::O_RDONLY)?
            .take(MAX_TEXT_BYTES)
            .read_to_string(&mut text)
            .with_context(|| {
                format!("cannot read /proc/{}/{}", self.pid, name.to_string_lossy())
            })?;
        Ok(text)
    }

    /// The process's start time (field 22 of `stat`, after the command's closing
    /// parenthesis): another process that got the pid has another.
    pub(crate) fn start_time(&self) -> Result<u64> {
        let stat = self.read(c"stat")?;
        let (_, rest) = stat.rsplit_once(')').context("stat without a command")?;
        rest.split_whitespace()
            .nth(19)
            .and_then(|f| f.parse().ok())
            .context("stat without a start time")
    }

    /// The process's real uid (`status`).
    pub(crate) fn real_uid(&self) -> Result<u32> {
        let status = self.read(c"status")?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .context("status without a Uid line")
    }
}
