//! Where things are: the workspace, the C fixtures, the release binaries built by
//! `cargo xtask build`, and scratch directories that outlive a failing test.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// `<workspace>/target/release/NAME` (or under `$CARGO_TARGET_DIR`, as cargo builds it).
fn release_bin(name: &str) -> PathBuf {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => workspace_root().join(d),
        _ => workspace_root().join("target"),
    };
    let p = target.join("release").join(name);
    assert!(
        p.is_file(),
        "{} does not exist: build it first (cargo xtask build, or run the tests with cargo xtask test)",
        p.display()
    );
    p
}

pub fn rewriter_bin() -> PathBuf {
    release_bin("rewriter")
}

pub fn tracer_bin() -> PathBuf {
    release_bin("tracer")
}

/// A scratch directory, removed on drop unless the test panicked or `UTRACE_KEEP_TMP`
/// is set.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("utrace-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
        TempDir(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("UTRACE_KEEP_TMP").is_some() {
            eprintln!("keeping {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
