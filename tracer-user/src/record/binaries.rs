//! Which binaries of a command or process are instrumented, and their metadata
//! (the `.note.utrace` section the rewriter adds).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use object::{
    Endianness, Object, ObjectSection,
    elf::PT_INTERP,
    read::elf::{ElfFile64, ProgramHeader},
};
use tracer_common::meta::{META_SECTION, Metadata};

/// An instrumented binary.
#[derive(Clone, Debug)]
pub struct Instrumented {
    pub path: PathBuf,
    pub meta: Metadata,
    /// Raw contents of the note section (stored in the trace file).
    pub note: Vec<u8>,
    /// Not rewritten: traced by uprobes only (`record --uprobe/--usdt`); the metadata
    /// describes the original file, it has no flush function, RW area or anchors.
    pub untouched: bool,
    /// Where uprobes are attached: `path`, or for a binary found in a process's
    /// mappings `/proc/self/fd/N` of the very file mapped there (held open in `file`),
    /// so that a path swapped after the check cannot redirect the uprobes.
    pub attach: PathBuf,
    pub file: Option<std::sync::Arc<std::fs::File>>,
}

/// The metadata of `path` if it is an instrumented binary. Files that are not ELF or
/// have no note give None; a note that does not parse gives None and a warning.
pub fn read_instrumented(path: &Path) -> Result<Option<Instrumented>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    read_instrumented_file(f, path)
}

/// [`read_instrumented`] of an open file (named `path` in messages and traces).
fn read_instrumented_file(f: std::fs::File, path: &Path) -> Result<Option<Instrumented>> {
    // Read lazily: only the headers and the note (system-wide sessions look at every
    // file every process maps).
    let data = object::read::ReadCache::new(f);
    let Ok(file) = object::File::parse(&data) else {
        return Ok(None);
    };
    let Some(section) = file.section_by_name(META_SECTION) else {
        return Ok(None);
    };
    let note = section
        .data()
        .with_context(|| format!("{}: cannot read {META_SECTION}", path.display()))?;
    match Metadata::from_note_section(note) {
        Some(Ok(meta)) => Ok(Some(Instrumented {
            path: path.to_path_buf(),
            meta,
            note: note.to_vec(),
            untouched: false,
            attach: path.to_path_buf(),
            file: None,
        })),
        Some(Err(e)) => {
            log::warn!("{}: ignoring broken {META_SECTION}: {e}", path.display());
            Ok(None)
        }
        None => {
            log::warn!(
                "{}: {META_SECTION} holds no utrace note; ignoring",
                path.display()
            );
            Ok(None)
        }
    }
}

/// An untouched binary traced by uprobes only: the sites the rewriter would place
/// (function entries of `functions`, or its USDT probes with `usdt`), all as uprobes.
pub fn untouched(path: &Path, functions: &[String], usdt: bool) -> Result<Instrumented> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let kinds = if usdt {
        vec![rewriter::SiteKind::Usdt]
    } else {
        vec![rewriter::SiteKind::FunctionEntry]
    };
    let opts = rewriter::Options {
        functions: functions.to_vec(),
        kinds,
        ..Default::default()
    };
    let name = path.display().to_string();
    let note = rewriter::uprobe_metadata(&name, &data, &opts)?;
    let meta = Metadata::from_note_section(&note)
        .context("no utrace note")?
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    if meta.sites.is_empty() {
        bail!("{name}: nothing to probe (no USDT probes)");
    }
    Ok(Instrumented {
        path: path.to_path_buf(),
        meta,
        note,
        untouched: true,
        attach: path.to_path_buf(),
        file: None,
    })
}

use crate::record::credentials::RunAs;

/// Longest PT_INTERP read (a path).
const MAX_INTERP_BYTES: u64 = 4096;
/// Most output read from `ld.so --list` (the loader is the user's program: bounded).
const MAX_LD_LIST_BYTES: u64 = 1 << 20;
/// Most of its error output kept for the message.
const MAX_LD_ERR_BYTES: u64 = 16 << 10;

/// The program interpreter (PT_INTERP) of an ELF executable, None for static ones.
/// Only the headers and the interpreter's name are read (lazily, bounded).
fn interpreter(exe: &Path) -> Result<Option<PathBuf>> {
    let f = std::fs::File::open(exe).with_context(|| format!("cannot read {}", exe.display()))?;
    if !f.metadata()?.is_file() {
        bail!("{}: not a regular file", exe.display());
    }
    let data = object::read::ReadCache::new(f);
    let elf = ElfFile64::<Endianness, _>::parse(&data)
        .with_context(|| format!("{} is not a 64-bit ELF file", exe.display()))?;
    let endian = elf.endian();
    let Some(ph) = elf
        .elf_program_headers()
        .iter()
        .find(|ph| ph.p_type(endian) == PT_INTERP)
    else {
        return Ok(None);
    };
    if ph.p_filesz(endian) > MAX_INTERP_BYTES {
        bail!("{}: PT_INTERP longer than a path", exe.display());
    }
    let raw = ph
        .data(endian, &data)
        .map_err(|()| anyhow::anyhow!("{}: bad PT_INTERP", exe.display()))?;
    let raw = raw.split(|&c| c == 0).next().unwrap_or(raw);
    let s = std::str::from_utf8(raw)
        .with_context(|| format!("{}: PT_INTERP is not UTF-8", exe.display()))?;
    Ok(Some(PathBuf::from(s)))
}

/// Parse `ld.so --list` output: the resolved path of every loaded object.
fn parse_ld_list(out: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for line in out.lines().map(str::trim) {
        let target = match line.split_once(" => ") {
            Some((name, rest)) => {
                if rest.starts_with("not found") {
                    log::warn!("{name}: not found by the dynamic loader");
                    continue;
                }
                rest
            }
            None => line,
        };
        if !target.starts_with('/') {
            continue; // vdso, or "statically linked" and the like
        }
        let path = target.rsplit_once(" (0x").map_or(target, |(p, _)| p);
        paths.push(PathBuf::from(path.trim_end()));
    }
    paths
}

/// The objects `exe` loads, resolved the way the dynamic loader does (it is asked:
/// `<PT_INTERP> --list exe`, honouring LD_LIBRARY_PATH and friends). The loader is
/// named by the file, so it is run as the command will be (`run_as`, no capability
/// unless root) and started as the command is (`credentials::Launch`); its output is
/// bounded.
fn shared_libraries(exe: &Path, run_as: Option<&RunAs>) -> Result<Vec<PathBuf>> {
    use std::{os::unix::process::CommandExt, process::Stdio};

    use crate::record::credentials::{ChildError, Launch};
    let Some(interp) = interpreter(exe)? else {
        return Ok(Vec::new());
    };
    let mut cmd = Command::new(&interp);
    cmd.arg("--list")
        .arg(exe)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let launch = Launch::new(run_as);
    // SAFETY: `Launch::apply` makes async-signal-safe calls only, on memory prepared
    // before the fork (what pre_exec requires).
    unsafe {
        cmd.pre_exec(move || launch.apply(None).map_err(ChildError::into_io));
    }
    let who = run_as.map_or(String::new(), |r| format!(" as {}", r.name));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {} --list{who}", interp.display()))?;
    let (out, err) = bounded_output(&mut child);
    let status = child.wait().context("waiting for the loader")?;
    let out = out.with_context(|| format!("{} --list {}", interp.display(), exe.display()))?;
    if !status.success() {
        bail!(
            "{} --list {} failed ({status}): {}",
            interp.display(),
            exe.display(),
            String::from_utf8_lossy(&err).trim()
        );
    }
    Ok(parse_ld_list(&String::from_utf8_lossy(&out)))
}

/// A child's stdout (an error past `MAX_LD_LIST_BYTES`: the child is killed) and the
/// start of its stderr, read side by side so that neither pipe can fill and block it.
fn bounded_output(child: &mut std::process::Child) -> (Result<Vec<u8>>, Vec<u8>) {
    use std::io::Read;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (out, err) = std::thread::scope(|s| {
        let err = s.spawn(|| {
            let mut buf = Vec::new();
            if let Some(e) = stderr {
                let _ = e.take(MAX_LD_ERR_BYTES).read_to_end(&mut buf);
            }
            buf
        });
        let mut out = Vec::new();
        let read = match stdout {
            Some(o) => o
                .take(MAX_LD_LIST_BYTES + 1)
                .read_to_end(&mut out)
                .map(|_| ()),
            None => Ok(()),
        };
        (read.map(|()| out), err.join().unwrap_or_default())
    });
    let out = match out {
        Ok(out) if out.len() as u64 > MAX_LD_LIST_BYTES => {
            let _ = child.kill();
            Err(anyhow::anyhow!(
                "more than {MAX_LD_LIST_BYTES} bytes of output"
            ))
        }
        Ok(out) => Ok(out),
        Err(e) => Err(anyhow::Error::new(e).context("reading its output")),
    };
    (out, err)
}

/// The instrumented binaries among `exe` and the shared libraries it links (listed by
/// its loader run as `run_as`).
pub fn for_command(exe: &Path, run_as: Option<&RunAs>) -> Result<Vec<Instrumented>> {
    let mut candidates = vec![exe.to_path_buf()];
    candidates.extend(shared_libraries(exe, run_as)?);
    collect(candidates)
}

/// Binaries named on the command line (`tracer record --binary PATH`): each must be an
/// instrumented binary, since the user asked for it by name.
pub fn named(paths: &[PathBuf]) -> Result<Vec<Instrumented>> {
    let mut found = Vec::with_capacity(paths.len());
    for path in paths {
        match read_instrumented(path).with_context(|| format!("--binary {}", path.display()))? {
            Some(b) => found.push(b),
            None => bail!(
                "--binary {}: not an instrumented binary (no {META_SECTION} note; run the rewriter on it first)",
                path.display()
            ),
        }
    }
    Ok(found)
}

/// `extra` appended to `found`, skipping files already there (same path or same
/// binary_id).
pub fn merge(found: &mut Vec<Instrumented>, extra: Vec<Instrumented>) {
    let key = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    for b in extra {
        if let Some(other) = same_id(found, &b) {
            if key(&other.path) != key(&b.path) {
                warn_same_id(other, &b);
            }
            continue;
        }
        found.push(b);
    }
}

/// The binary of `found` with `b`'s binary_id (one binary_id is traced once).
fn same_id<'a>(found: &'a [Instrumented], b: &Instrumented) -> Option<&'a Instrumented> {
    found.iter().find(|o| o.meta.binary_id == b.meta.binary_id)
}

fn warn_same_id(other: &Instrumented, b: &Instrumented) {
    log::warn!(
        "{} and {} have the same binary_id {:#x}; tracing only the first",
        other.path.display(),
        b.path.display(),
        b.meta.binary_id
    );
}

fn collect(candidates: Vec<PathBuf>) -> Result<Vec<Instrumented>> {
    let mut seen = BTreeSet::new();
    let mut found: Vec<Instrumented> = Vec::new();
    for path in candidates {
        let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if !seen.insert(key) {
            continue;
        }
        if let Some(b) = read_instrumented(&path)? {
            if let Some(other) = same_id(&found, &b) {
                warn_same_id(other, &b);
                continue;
            }
            found.push(b);
        }
    }
    Ok(found)
}

/// A file mapping of a process.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub offset: u64,
    pub path: PathBuf,
    pub end: u64,
    pub inode: u64,
}

/// File-backed mappings from /proc/PID/maps.
pub fn process_mappings(pid: u32) -> Result<Vec<Mapping>> {
    let maps_path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&maps_path)
        .with_context(|| format!("cannot read {maps_path} (is process {pid} alive?)"))?;
    let mut maps = Vec::new();
    for line in text.lines() {
        // start-end perms offset dev inode path
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(inode), Some(path)) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = path.trim_start();
        if !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        let (Some((start, end)), Ok(offset)) = (
            range.split_once('-').and_then(|(s, e)| {
                Some((
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                ))
            }),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        maps.push(Mapping {
            start,
            offset,
            path: PathBuf::from(path),
            end,
            inode: inode.parse().unwrap_or(0),
        });
    }
    Ok(maps)
}

/// The instrumented binaries mapped into process `pid`, each with its load bias
/// (run-time address − link-time address).
pub fn for_process(pid: u32) -> Result<Vec<(Instrumented, u64)>> {
    for_process_cached(pid, &mut Default::default())
}

/// [`for_process`] for sessions that look at many processes: what each file is
/// (instrumented or not) is remembered in `seen`, and files already there that are
/// instrumented are returned again (their bias differs per process).
pub fn for_process_cached(
    pid: u32,
    seen: &mut std::collections::HashMap<(PathBuf, u64), Option<Instrumented>>,
) -> Result<Vec<(Instrumented, u64)>> {
    let maps = process_mappings(pid)?;
    let mut out = Vec::new();
    let mut done = BTreeSet::new();
    for m in &maps {
        let key = (m.path.clone(), m.inode);
        if !done.insert(key.clone()) {
            continue;
        }
        let b = match seen.get(&key) {
            Some(b) => b.clone(),
            // Only what the file says is remembered: a mapping that changed under us
            // (exec still settling) is looked at again next time.
            None => match open_mapped(pid, m) {
                Ok(b) => {
                    seen.insert(key, b.clone());
                    b
                }
                Err(e) => {
                    log::debug!("{e:#}");
                    None
                }
            },
        };
        if let Some(b) = b {
            match load_bias(&b.attach, &b.path, &maps) {
                Ok(bias) => out.push((b, bias)),
                Err(e) => log::warn!("{} in process {pid}: {e:#}", b.path.display()),
            }
        }
    }
    Ok(out)
}

/// The file process `pid` maps at `m`, opened through `/proc/PID/map_files` (the
/// mapped file itself, not whatever its path names now; also right for processes in
/// other mount namespaces), if it is instrumented.
fn open_mapped(pid: u32, m: &Mapping) -> Result<Option<Instrumented>> {
    use std::os::unix::{fs::MetadataExt, io::AsRawFd};
    // Named without the zero padding of the maps file (`400000-401000`).
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let f = std::fs::File::open(&link).with_context(|| format!("cannot open {link}"))?;
    if f.metadata()?.ino() != m.inode {
        bail!("{link} is not inode {} any more", m.inode);
    }
    let held = f.try_clone()?;
    let Some(mut b) = read_instrumented_file(f, &m.path)? else {
        return Ok(None);
    };
    b.attach = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
    b.file = Some(std::sync::Arc::new(held));
    Ok(Some(b))
}

/// Load bias of `path` in a process: where its first PT_LOAD segment was mapped.
/// `file` is read (the file itself), `path` is its name in `maps`.
fn load_bias(file: &Path, path: &Path, maps: &[Mapping]) -> Result<u64> {
    let data = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let elf = ElfFile64::<Endianness>::parse(&*data).context("not a 64-bit ELF file")?;
    let endian = elf.endian();
    let first = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
        .min_by_key(|ph| ph.p_vaddr(endian))
        .context("no PT_LOAD segment")?;
    let page = 4096u64;
    let (vaddr, offset) = (first.p_vaddr(endian), first.p_offset(endian));
    let m = maps
        .iter()
        .find(|m| m.path == path && m.offset == offset & !(page - 1))
        .context("first segment not found in /proc/PID/maps")?;
    Ok(m.start.wrapping_sub(vaddr & !(page - 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ld_list_output() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd5c9f2000)\n\
                   \tlibtraced.so => /opt/lib/libtraced.so (0x00007f2a1c000000)\n\
                   \tlibmissing.so => not found\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2a1be00000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f2a1c200000)\n";
        assert_eq!(
            parse_ld_list(out),
            [
                "/opt/lib/libtraced.so",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn uninstrumented_system_binary() {
        let sh = Path::new("/bin/sh");
        if sh.exists() {
            assert!(read_instrumented(sh).unwrap().is_none());
            assert!(for_command(sh, None).unwrap().is_empty());
            assert!(!shared_libraries(sh, None).unwrap().is_empty());
        }
    }

    #[test]
    fn own_mappings() {
        let maps = process_mappings(std::process::id()).unwrap();
        assert!(!maps.is_empty());
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let bias = load_bias(&exe, &exe, &maps).unwrap();
        // PIE test binaries load high, non-PIE at bias 0.
        assert!(bias == 0 || bias > 0x1000);
    }
}
