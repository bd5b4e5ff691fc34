//! Debian's arm64 kernel and busybox: downloaded with a private apt configuration (the
//! host's dpkg architectures are not touched), unpacked and cached.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, ensure};

use super::{BUSYBOX_PACKAGE, KERNEL_META_PACKAGE};
use crate::util::{self, cmd};

/// An apt configuration of its own: architecture arm64, the host's sources, state and
/// cache under `dir`. Only used for `apt-get download`; nothing is installed.
fn apt_config(dir: &Path) -> Result<PathBuf> {
    for d in [
        "etc/apt.conf.d",
        "etc/preferences.d",
        "state/lists/partial",
        "cache/archives/partial",
    ] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    let status = dir.join("state/status");
    if !status.exists() {
        std::fs::write(&status, "")?;
    }
    let conf = dir.join("apt.conf");
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            "APT::Architecture \"arm64\";\n\
             APT::Architectures {{ \"arm64\"; }};\n\
             APT::Sandbox::User \"root\";\n\
             Dir::Etc \"{d}/etc\";\n\
             Dir::Etc::sourcelist \"/etc/apt/sources.list\";\n\
             Dir::Etc::sourceparts \"/etc/apt/sources.list.d\";\n\
             Dir::Etc::trusted \"/etc/apt/trusted.gpg\";\n\
             Dir::Etc::trustedparts \"/etc/apt/trusted.gpg.d\";\n\
             Dir::State \"{d}/state\";\n\
             Dir::State::status \"{d}/state/status\";\n\
             Dir::Cache \"{d}/cache\";\n"
        ),
    )?;
    Ok(conf)
}

fn find_deb(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with("_arm64.deb"))
        })
        .collect();
    v.sort();
    v.pop()
}

/// `(kernel Image, busybox)`, downloading and extracting the .debs on first use.
pub(super) fn kernel_and_busybox(cache: &Path) -> Result<(PathBuf, PathBuf)> {
    let kernel = cache.join("Image");
    let busybox = cache.join("busybox");
    if kernel.exists() && busybox.exists() {
        println!(
            "arm64-vm: cached kernel {} and busybox",
            std::fs::read_to_string(cache.join("Image.version"))
                .unwrap_or_default()
                .trim()
        );
        return Ok((kernel, busybox));
    }
    let (image_deb, busybox_deb) = debs(cache)?;
    extract(cache, &image_deb, &busybox_deb, &kernel, &busybox)?;
    Ok((kernel, busybox))
}

/// The kernel image and busybox .debs, downloaded into `cache/debs` unless there.
fn debs(cache: &Path) -> Result<(PathBuf, PathBuf)> {
    let apt = cache.join("apt");
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs)?;
    let conf = apt_config(&apt)?;
    let apt_cmd = |prog: &str| {
        let mut c = cmd(prog);
        c.env("APT_CONFIG", &conf).current_dir(&debs);
        c
    };
    let image_deb = find_deb(&debs, "linux-image-").filter(|p| {
        !p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("linux-image-arm64_")
    });
    let busybox_deb = find_deb(&debs, &format!("{BUSYBOX_PACKAGE}_"));
    Ok(match (image_deb, busybox_deb) {
        (Some(i), Some(b)) => (i, b),
        _ => {
            util::run(apt_cmd("apt-get").args(["update", "-q"]))?;
            // linux-image-arm64 depends on the versioned image package.
            let deps =
                util::output_ok(apt_cmd("apt-cache").args(["depends", KERNEL_META_PACKAGE]))?;
            let image = deps
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Depends: "))
                .find(|p| p.starts_with("linux-image-") && !p.contains("unsigned"))
                .with_context(|| {
                    format!(
                        "no image package in `apt-cache depends {KERNEL_META_PACKAGE}`:\n{deps}"
                    )
                })?
                .to_string();
            util::run(apt_cmd("apt-get").args(["download", &image, BUSYBOX_PACKAGE]))?;
            (
                find_deb(&debs, &format!("{image}_")).context("kernel .deb not downloaded")?,
                find_deb(&debs, &format!("{BUSYBOX_PACKAGE}_"))
                    .context("busybox .deb not downloaded")?,
            )
        }
    })
}

/// The kernel (`kernel`, its version beside it) and busybox (`busybox`) taken out of
/// their .debs.
fn extract(
    cache: &Path,
    image_deb: &Path,
    busybox_deb: &Path,
    kernel: &Path,
    busybox: &Path,
) -> Result<()> {
    let x = cache.join("extract");
    if x.exists() {
        std::fs::remove_dir_all(&x)?;
    }
    std::fs::create_dir_all(&x)?;
    for (deb, what) in [(image_deb, "./boot/"), (busybox_deb, "./bin/busybox")] {
        let tar = util::output(cmd("dpkg-deb").arg("--fsys-tarfile").arg(deb))?;
        ensure!(
            tar.status.success(),
            "dpkg-deb --fsys-tarfile {} failed",
            deb.display()
        );
        let mut c = cmd("tar");
        c.arg("-x")
            .arg("-C")
            .arg(&x)
            .arg(what)
            .stdin(Stdio::piped());
        util::announce(&c);
        let mut child = c.spawn().context("cannot run tar")?;
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&tar.stdout)?;
        ensure!(child.wait()?.success(), "tar failed on {}", deb.display());
    }
    let vmlinuz = std::fs::read_dir(x.join("boot"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .context("no /boot/vmlinuz-* in the kernel package")?;
    let version = vmlinuz.file_name().unwrap().to_string_lossy()["vmlinuz-".len()..].to_string();
    let data = std::fs::read(&vmlinuz)?;
    // Debian ships an uncompressed arm64 Image (older ones gzip it; qemu takes both).
    std::fs::write(kernel, &data)?;
    std::fs::write(cache.join("Image.version"), format!("{version}\n"))?;
    std::fs::copy(x.join("bin/busybox"), busybox)?;
    std::fs::remove_dir_all(&x).ok();
    println!(
        "arm64-vm: kernel {version} and busybox extracted into {}",
        cache.display()
    );
    Ok(())
}
