//! Bad input to the rewriter: each case exits non-zero, prints an `error:` line on stderr
//! that says what is wrong (a keyword), and creates no output file.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use tests::*;

/// A valid x86-64 executable to derive bad inputs from.
fn tiny(tmp: &TempDir) -> PathBuf {
    let p = tmp.join("tiny");
    compile("gcc", &[fixture("tiny.c")], &["-O2"], &p);
    p
}

fn default_output(input: &Path) -> PathBuf {
    let mut s = input.as_os_str().to_owned();
    s.push(".traced");
    PathBuf::from(s)
}

/// Rewrite `input` with `extra` arguments (once with an explicit -o, once with the default
/// output path); expect failure, an `error:` line and one of `keywords` (lower case).
fn expect_rejected(tmp: &TempDir, input: &Path, extra: &[&str], keywords: &[&str]) {
    let before = std::fs::read(input).ok();
    for explicit in [true, false] {
        let out_path = tmp.join("out.traced");
        let mut args: Vec<&OsStr> = vec![input.as_os_str()];
        if explicit {
            args.push("-o".as_ref());
            args.push(out_path.as_os_str());
        }
        args.extend(extra.iter().map(OsStr::new));
        let out = rewriter(&args);
        let stderr = out.stderr_str();
        assert!(
            out.code.is_some_and(|c| c != 0),
            "the rewriter accepted {}: {}",
            input.display(),
            out.describe()
        );
        assert!(
            stderr.lines().any(|l| l.starts_with("error:")),
            "no line starting with `error:` on stderr: {}",
            out.describe()
        );
        let lower = stderr.to_lowercase();
        assert!(
            keywords.iter().any(|k| lower.contains(k)),
            "stderr does not say what is wrong (expected one of {keywords:?}): {}",
            out.describe()
        );
        assert!(
            !out_path.exists(),
            "an output file was created: {}",
            out_path.display()
        );
        assert!(
            !default_output(input).exists(),
            "an output file was created: {}",
            default_output(input).display()
        );
        assert_eq!(std::fs::read(input).ok(), before, "the input was modified");
    }
}

#[test]
fn not_an_elf() {
    let tmp = TempDir::new("bad-notelf");
    let p = tmp.join("script.sh");
    std::fs::write(&p, "#!/bin/sh\necho this is not an ELF file\n").unwrap();
    expect_rejected(&tmp, &p, &[], &["elf", "magic"]);
}

#[test]
fn missing_file() {
    let tmp = TempDir::new("bad-missing");
    expect_rejected(
        &tmp,
        &tmp.join("does-not-exist"),
        &[],
        &["no such file", "not found", "cannot open", "does not exist"],
    );
}

#[test]
fn truncated_elf() {
    let tmp = TempDir::new("bad-trunc");
    let full = std::fs::read(tiny(&tmp)).unwrap();
    // Inside the program headers, and half the file (the section headers are at the end).
    for len in [100, full.len() / 2] {
        let p = tmp.join(format!("truncated-{len}"));
        std::fs::write(&p, &full[..len]).unwrap();
        expect_rejected(
            &tmp,
            &p,
            &[],
            &[
                "truncat",
                "too short",
                "too small",
                "out of bounds",
                "beyond",
                "past the end",
                "unexpected end",
                "eof",
                "malformed",
                "invalid",
                "corrupt",
            ],
        );
    }
}

/// A minimal i386 executable (ELF header, one PT_LOAD, `exit(0)`), for machines without
/// a 32-bit gcc.
fn handmade_elf32() -> Vec<u8> {
    let code: [u8; 12] = [0xb8, 1, 0, 0, 0, 0x31, 0xdb, 0xcd, 0x80, 0x90, 0x90, 0x90];
    let total = 52 + 32 + code.len() as u32;
    let base = 0x0804_8000u32;
    let mut v = vec![0x7f, b'E', b'L', b'F', 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let h16 = |v: &mut Vec<u8>, x: u16| v.extend_from_slice(&x.to_le_bytes());
    let h32 = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
    h16(&mut v, 2); // ET_EXEC
    h16(&mut v, 3); // EM_386
    h32(&mut v, 1);
    h32(&mut v, base + 84); // entry
    h32(&mut v, 52); // phoff
    h32(&mut v, 0); // shoff
    h32(&mut v, 0); // flags
    h16(&mut v, 52);
    h16(&mut v, 32);
    h16(&mut v, 1);
    h16(&mut v, 40);
    h16(&mut v, 0);
    h16(&mut v, 0);
    for x in [1, 0, base, base, total, total, 5, 0x1000] {
        h32(&mut v, x); // PT_LOAD
    }
    v.extend_from_slice(&code);
    assert_eq!(v.len() as u32, total);
    v
}

#[test]
fn elf32() {
    let tmp = TempDir::new("bad-elf32");
    let p = tmp.join("elf32");
    if can_link("gcc", &["-m32"], tmp.path()) {
        compile("gcc", &[fixture("tiny.c")], &["-m32", "-O2"], &p);
    } else {
        std::fs::write(&p, handmade_elf32()).unwrap();
    }
    assert_eq!(std::fs::read(&p).unwrap()[4], 1, "ELFCLASS32");
    expect_rejected(&tmp, &p, &[], &["32", "class", "elf64", "64-bit"]);
}

#[test]
fn big_endian_elf() {
    let tmp = TempDir::new("bad-be");
    let mut bytes = std::fs::read(tiny(&tmp)).unwrap();
    bytes[5] = 2; // EI_DATA = ELFDATA2MSB
    let p = tmp.join("big-endian");
    std::fs::write(&p, bytes).unwrap();
    expect_rejected(&tmp, &p, &[], &["endian", "big", "msb"]);
}

/// A machine the rewriter has no backend for (AArch64 and x86-64 have one): RISC-V,
/// made by patching `e_machine` of an x86-64 binary.
#[test]
fn unsupported_machine() {
    let tmp = TempDir::new("bad-machine");
    let p = tmp.join("riscv");
    let mut bytes = std::fs::read(tiny(&tmp)).unwrap();
    bytes[18..20].copy_from_slice(&243u16.to_le_bytes()); // e_machine = EM_RISCV
    std::fs::write(&p, bytes).unwrap();
    expect_rejected(&tmp, &p, &[], &["machine", "architecture", "risc"]);
}

#[test]
fn already_rewritten() {
    let tmp = TempDir::new("bad-twice");
    let orig = tiny(&tmp);
    let once = tmp.join("once");
    let (_, counts, _) = rewrite(&orig, Some(&once), &[]);
    assert!(counts.total >= 2, "{counts:?}");
    expect_rejected(&tmp, &once, &[], &["already", "rewritten", "instrumented"]);
}

#[test]
fn glob_matches_nothing() {
    let tmp = TempDir::new("bad-glob");
    let orig = tiny(&tmp);
    expect_rejected(
        &tmp,
        &orig,
        &["--functions", "no_such_function_*"],
        &["match", "no function"],
    );
}
