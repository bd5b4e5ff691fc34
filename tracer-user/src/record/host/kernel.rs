//! Kernel prerequisites: tracefs, the locked-memory limit, tracepoint record formats.

use std::{ffi::CString, path::Path};

use anyhow::{Context, Result, bail};

pub(crate) const TRACEFS: &str = "/sys/kernel/tracing";

/// Mount tracefs at /sys/kernel/tracing unless its events are already visible there
/// (aya looks tracepoint ids up in it).
pub(crate) fn ensure_tracefs() -> Result<()> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    let target = CString::new(TRACEFS)?;
    // SAFETY: all pointers are valid NUL-terminated strings or null (no mount data).
    let r = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot mount tracefs on {TRACEFS}"));
    }
    log::info!("mounted tracefs on {TRACEFS}");
    Ok(())
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it (best effort).
pub(crate) fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: lim is a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        log::debug!(
            "cannot raise RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Offset of `field` in the records of tracepoint `category:name`, from its tracefs
/// format file; None if the tracepoint has no such field.
pub(crate) fn tracepoint_field_offset(
    category: &str,
    name: &str,
    field: &str,
) -> Result<Option<u32>> {
    let path = Path::new(TRACEFS)
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    parse_field_offset(&text, field).with_context(|| format!("{}: bad format", path.display()))
}

fn parse_field_offset(format: &str, field: &str) -> Result<Option<u32>> {
    for line in format.lines() {
        // "\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;"
        let mut decl = None;
        let mut offset = None;
        for part in line.split(';').map(str::trim) {
            if let Some(d) = part.strip_prefix("field:") {
                decl = Some(d);
            } else if let Some(o) = part.strip_prefix("offset:") {
                offset = Some(o);
            }
        }
        let (Some(decl), Some(offset)) = (decl, offset) else {
            continue;
        };
        // The name is the last word of the declaration, minus any array suffix.
        let last = decl.split_whitespace().last().unwrap_or("");
        let name = last.split('[').next().unwrap_or(last);
        if name == field {
            match offset.parse() {
                Ok(o) => return Ok(Some(o)),
                Err(_) => bail!("field {field}: bad offset {offset:?}"),
            }
        }
    }
    Ok(None)
}

/// Whether this kernel lets BPF programs call bpf_probe_write_user: kernels in lockdown
/// (integrity or confidentiality) refuse it. Asked by loading a six-instruction
/// kprobe program that calls it; cheaper than a failed load of the real programs.
pub(crate) fn probe_write_user_allowed() -> bool {
    // struct bpf_insn: code, dst:4 | src:4, off, imm.
    const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
        (code as u64)
            | (((dst | (src << 4)) as u64) << 8)
            | ((off as u16 as u64) << 16)
            | ((imm as u32 as u64) << 32)
    }
    const PROBE_WRITE_USER: i32 = 36;
    let insns: [u64; 8] = [
        insn(0x7a, 10, 0, -8, 0),              // *(u64 *)(r10 - 8) = 0
        insn(0xb7, 1, 0, 0, 0),                // r1 = 0
        insn(0xbf, 2, 10, 0, 0),               // r2 = r10
        insn(0x07, 2, 0, 0, -8),               // r2 += -8
        insn(0xb7, 3, 0, 0, 8),                // r3 = 8
        insn(0x85, 0, 0, 0, PROBE_WRITE_USER), // call bpf_probe_write_user
        insn(0xb7, 0, 0, 0, 0),                // r0 = 0
        insn(0x95, 0, 0, 0, 0),                // exit
    ];
    /// The leading fields of `union bpf_attr` for BPF_PROG_LOAD; the kernel treats
    /// the rest as zero.
    #[repr(C)]
    struct ProgLoadAttr {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
    }
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TYPE_KPROBE: u32 = 2;
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: c"GPL".as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
    };
    // SAFETY: attr is a valid BPF_PROG_LOAD attribute block of the given size whose
    // pointers (instructions, license) outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const ProgLoadAttr,
            size_of::<ProgLoadAttr>() as libc::c_uint,
        )
    };
    if fd < 0 {
        log::debug!(
            "bpf_probe_write_user probe: {}",
            std::io::Error::last_os_error()
        );
        return false;
    }
    // SAFETY: fd is the program descriptor the kernel just returned to us.
    unsafe { libc::close(fd as libc::c_int) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_user_probe_agrees_with_lockdown() {
        // The oracle: the lockdown mode securityfs shows (`none [integrity] ...`);
        // integrity and confidentiality both refuse bpf_probe_write_user.
        let file = Path::new("/sys/kernel/security/lockdown");
        if !file.exists() {
            let st = std::process::Command::new("mount")
                .args(["-t", "securityfs", "securityfs", "/sys/kernel/security"])
                .status()
                .unwrap();
            assert!(st.success(), "mount securityfs (the tests run as root)");
        }
        let modes = std::fs::read_to_string(file).unwrap();
        let locked = !modes.contains("[none]");
        assert_eq!(probe_write_user_allowed(), !locked, "lockdown: {modes}");
    }

    #[test]
    fn fork_format() {
        let f = "name: sched_process_fork\nformat:\n\
                 \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                 \tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
                 \tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;\n\
                 \tfield:char child_comm[16];\toffset:16;\tsize:16;\tsigned:0;\n\
                 \tfield:pid_t child_pid;\toffset:32;\tsize:4;\tsigned:1;\n";
        assert_eq!(parse_field_offset(f, "child_pid").unwrap(), Some(32));
        assert_eq!(parse_field_offset(f, "child_comm").unwrap(), Some(16));
        assert_eq!(parse_field_offset(f, "parent_comm").unwrap(), Some(8));
        assert_eq!(parse_field_offset(f, "group_dead").unwrap(), None);
    }
}
