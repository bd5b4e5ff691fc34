//! Booting the kernel under `qemu-system-aarch64 -M virt` and capturing the console.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::P_VM;
use crate::util::{self, cmd};

/// Boot, wait for poweroff (or kill qemu after `timeout`); the console text, also
/// saved to `log`.
pub(super) fn boot(
    kernel: &Path,
    initrd: &Path,
    cpu: &str,
    timeout: Duration,
    log: &Path,
) -> Result<String> {
    let mut c = cmd("qemu-system-aarch64");
    c.args(["-M", "virt", "-cpu", cpu, "-smp", "2", "-m", "1024"])
        .args(["-nic", "none", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            "console=ttyAMA0 rdinit=/init panic=-1 loglevel=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    util::announce(&c);
    let start = Instant::now();
    let mut child = c.spawn().context("cannot start qemu-system-aarch64")?;
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let out = reader.join().unwrap_or_default();
    let text = as_shown(&String::from_utf8_lossy(&out));
    std::fs::write(log, &text)?;
    println!(
        "arm64-vm: qemu -cpu {cpu}: {} after {:.1}s, {} console lines{}",
        util::describe(status),
        start.elapsed().as_secs_f64(),
        text.lines().count(),
        if timed_out {
            " (TIMED OUT, killed)"
        } else {
            ""
        }
    );
    if !err.trim().is_empty() {
        println!("arm64-vm: qemu stderr: {}", err.trim());
    }
    for l in text.lines().filter(|l| l.starts_with(P_VM)) {
        println!("  | {l}");
    }
    Ok(text)
}

/// `text` as a terminal shows it, line by line: a carriage return starts the line
/// over and control sequences (`ESC [ ... final byte`) are dropped. A progress bar drawn
/// on the console and cleared would otherwise start the next line.
fn as_shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let line = line.trim_end_matches(['\r', '\n']);
        let line = line.rsplit('\r').next().unwrap_or_default();
        push_without_escapes(&mut out, line);
        out.push('\n');
    }
    out
}

fn push_without_escapes(out: &mut String, line: &str) {
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            // Parameters and intermediates up to the final byte (0x40..=0x7e).
            for c in chars.by_ref() {
                if ('\x40'..='\x7e').contains(&c) {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cleared_bar_leaves_nothing() {
        let s = "x\r\nbar [==> ] 1/2\r\x1b[2K\x1b[1mUTRACE-VM: RESULT x ok\x1b[0m\r\n";
        assert_eq!(super::as_shown(s), "x\nUTRACE-VM: RESULT x ok\n");
    }
}
