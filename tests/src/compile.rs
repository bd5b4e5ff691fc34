//! Compiling fixtures with a given C compiler and flags.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::command::{RUN_TIMEOUT, run};
use crate::paths::fixture;

/// Compile `sources` with `cc` and `flags` into `out` (fixtures/ is on the include path;
/// `-l...` flags go after the sources, where the linker needs them).
pub fn compile(cc: &str, sources: &[PathBuf], flags: &[&str], out: &Path) {
    let (libs, flags): (Vec<&str>, Vec<&str>) = flags.iter().partition(|f| f.starts_with("-l"));
    let mut c = Command::new(cc);
    c.args(flags)
        .arg("-I")
        .arg(fixture(""))
        .arg("-o")
        .arg(out)
        .args(sources)
        .args(libs);
    run(&mut c, RUN_TIMEOUT).ok();
}

/// Is `cc` installed and able to link a program with `flags`?
pub fn can_link(cc: &str, flags: &[&str], dir: &Path) -> bool {
    let src = dir.join("can_link.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    Command::new(cc)
        .args(flags)
        .arg("-o")
        .arg(dir.join("can_link"))
        .arg(&src)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `-IDIR` for the AArch64 cross compiler to find `<sys/sdt.h>`: the header is
/// architecture-independent, but Debian installs it under the host's triplet, so it is
/// copied into `dir/inc`.
pub fn a64_sdt_include(dir: &Path) -> String {
    let inc = dir.join("inc");
    std::fs::create_dir_all(inc.join("sys")).unwrap();
    for h in ["sdt.h", "sdt-config.h"] {
        std::fs::copy(
            Path::new("/usr/include/x86_64-linux-gnu/sys").join(h),
            inc.join("sys").join(h),
        )
        .unwrap();
    }
    format!("-I{}", inc.display())
}
