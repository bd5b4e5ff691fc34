//! Small helpers: paths, printing and running external commands.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

use anyhow::{Context, Result, bail};

/// The workspace root (the parent of this crate's directory).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// `target/release` of the workspace (honours `CARGO_TARGET_DIR`).
pub(crate) fn release_dir() -> PathBuf {
    target_dir().join("release")
}

pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                workspace_root().join(d)
            }
        }
        _ => workspace_root().join("target"),
    }
}

pub(crate) fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// `$CARGO_HOME`, default `~/.cargo`.
pub(crate) fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home_dir().join(".cargo"))
}

/// Where `cargo install` puts binaries (bpf-linker).
pub(crate) fn cargo_bin_dir() -> PathBuf {
    cargo_home().join("bin")
}

/// `PATH` with `~/.cargo/bin` in front, so that children (cargo, aya-build) find bpf-linker.
pub(crate) fn child_path() -> OsString {
    let bin = cargo_bin_dir();
    let old = std::env::var_os("PATH").unwrap_or_default();
    let mut parts: Vec<PathBuf> = vec![bin.clone()];
    parts.extend(std::env::split_paths(&old).filter(|p| *p != bin));
    std::env::join_paths(parts).unwrap_or(old)
}

/// A command whose `PATH` has `~/.cargo/bin` first.
pub(crate) fn cmd(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env("PATH", child_path());
    c
}

/// Find an executable on the children's `PATH`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&child_path())
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Shell-like rendering of a command (explicit env vars except PATH, program, args).
pub(crate) fn show(c: &Command) -> String {
    let mut s = String::new();
    for (k, v) in c.get_envs() {
        if k == "PATH" {
            continue;
        }
        if let Some(v) = v {
            s.push_str(&format!(
                "{}={} ",
                k.to_string_lossy(),
                quote(&v.to_string_lossy())
            ));
        }
    }
    if let Some(d) = c.get_current_dir() {
        s = format!("(cd {} && ", quote(&d.to_string_lossy())) + &s;
    }
    s.push_str(&quote(&c.get_program().to_string_lossy()));
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&quote(&a.to_string_lossy()));
    }
    if c.get_current_dir().is_some() {
        s.push(')');
    }
    s
}

fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:+,@%^".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

pub(crate) fn announce(c: &Command) {
    println!("$ {}", show(c));
}

/// Print and run; error on a non-zero exit.
pub(crate) fn run(c: &mut Command) -> Result<()> {
    let st = status(c)?;
    if !st.success() {
        bail!("command failed ({}): {}", describe(st), show(c));
    }
    Ok(())
}

/// Print and run; return the exit status (stdio inherited).
pub(crate) fn status(c: &mut Command) -> Result<ExitStatus> {
    announce(c);
    c.status()
        .with_context(|| format!("cannot run {}", show(c)))
}

/// Print and run with stdout/stderr captured.
pub(crate) fn output(c: &mut Command) -> Result<Output> {
    announce(c);
    c.stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", show(c)))
}

/// Print and run with output captured; error (showing stderr) on a non-zero exit.
pub(crate) fn output_ok(c: &mut Command) -> Result<String> {
    let o = output(c)?;
    if !o.status.success() {
        bail!(
            "command failed ({}): {}\n{}",
            describe(o.status),
            show(c),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

pub(crate) fn describe(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown status".into(),
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A fresh scratch directory `target/xtask/<name>` (emptied first).
pub(crate) fn scratch_dir(name: &str) -> Result<PathBuf> {
    let d = target_dir().join("xtask").join(name);
    if d.exists() {
        std::fs::remove_dir_all(&d).with_context(|| format!("cannot clear {}", d.display()))?;
    }
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}
