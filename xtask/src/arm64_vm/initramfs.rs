//! The initramfs (cpio, newc format): busybox, the tracer, the programs and the `/init`
//! that traces each and prints its dump on the console.

use std::path::Path;

use anyhow::Result;

use super::{CROSS_LIB, Program};

struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn new() -> Self {
        Cpio {
            out: Vec::new(),
            ino: 1,
        }
    }
    fn pad4(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.ino += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad4();
        self.out.extend_from_slice(data);
        self.pad4();
    }
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }
    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | mode, (0, 0), data);
    }
    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, (0, 0), target.as_bytes());
    }
    fn chardev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }
    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

fn init_script(programs: &[Program]) -> String {
    let mut s = String::from(
        r#"#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tracefs nodev /sys/kernel/tracing
mount -t tmpfs tmpfs /tmp
ulimit -l unlimited
# A progress bar drawn on the console would break its lines: draw any at once, so
# that a run does not depend on how slow the guest is.
export UTRACE_PROGRESS_AFTER_MS=0
# A hung test still ends the boot.
(sleep 200; echo "UTRACE-VM: TIMEOUT"; poweroff -f) &
echo "UTRACE-VM: START kernel $(uname -r) $(grep -m1 Features /proc/cpuinfo | tr -s ' \t' ' ')"
fails=0
"#,
    );
    for p in programs {
        let n = &p.name;
        let cmd = std::iter::once(format!("/progs/{}", p.binary))
            .chain(p.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        // A loosely checked program's records are too many for the serial console.
        // The readers' stderr goes into the pipes: on the console (a terminal) a slow
        // read would draw a progress bar whose clearing escape starts the next line.
        let head = if p.loose.is_some() { " | head -20" } else { "" };
        s.push_str(&format!(
            r#"echo "UTRACE-VM: RUN {n}"
/tracer record -o /tmp/{n}.utrace -- {cmd}
rc=$?
echo "UTRACE-VM: EXIT {n} $rc"
/tracer report /tmp/{n}.utrace 2>&1 | sed 's/^/UTRACE-REPORT {n} /'
/tracer dump /tmp/{n}.utrace 2>&1{head} | sed 's/^/UTRACE-DUMP {n} /'
if [ "$rc" = {code} ] && /tracer report /tmp/{n}.utrace 2>&1 | grep -q ", dropped: 0, read errors: 0"; then
    echo "UTRACE-VM: RESULT {n} ok"
else
    echo "UTRACE-VM: RESULT {n} bad"; fails=$((fails+1))
fi
"#,
            code = p.exit_code
        ));
    }
    s.push_str(
        r#"if [ $fails = 0 ]; then echo "UTRACE-VM: GUEST PASS"; else echo "UTRACE-VM: GUEST FAIL $fails"; fi
echo "UTRACE-VM: DONE"
poweroff -f
"#,
    );
    s
}

pub(super) fn write_initramfs(
    out: &Path,
    busybox: &Path,
    tracer: &Path,
    programs: &[Program],
) -> Result<()> {
    let mut c = Cpio::new();
    for d in ["bin", "dev", "proc", "sys", "tmp", "progs", "lib"] {
        c.dir(d);
    }
    c.chardev("dev/console", 5, 1);
    c.chardev("dev/null", 1, 3);
    c.file("bin/busybox", 0o755, &std::fs::read(busybox)?);
    c.symlink("bin/sh", "busybox");
    c.file("init", 0o755, init_script(programs).as_bytes());
    c.file("tracer", 0o755, &std::fs::read(tracer)?);
    // For dynamically linked fixtures (PT_INTERP /lib/ld-linux-aarch64.so.1).
    for lib in ["ld-linux-aarch64.so.1", "libc.so.6"] {
        let p = Path::new(CROSS_LIB).join(lib);
        if p.exists() {
            c.file(&format!("lib/{lib}"), 0o755, &std::fs::read(&p)?);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in programs {
        if seen.insert(p.binary.clone()) {
            c.file(
                &format!("progs/{}", p.binary),
                0o755,
                &std::fs::read(&p.host_path)?,
            );
        }
    }
    let bytes = c.finish();
    std::fs::write(out, &bytes)?;
    println!(
        "arm64-vm: initramfs {} ({} KiB)",
        out.display(),
        bytes.len() / 1024
    );
    Ok(())
}
