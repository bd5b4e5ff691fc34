//! `rewriter::usdt::probes` on tests/fixtures/usdt.c built by gcc -O0, gcc -O2,
//! clang -O2 (x86-64) and aarch64-linux-gnu-gcc -O2, checked against binutils' reading
//! of the same notes (`readelf -n`: provider, name, location, semaphore, argument text)
//! and symbols (`readelf -s`), and against what the C source says about each argument
//! (count, size, signedness, the constants).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use iced_x86::Register;
use object::elf;
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use rewriter::usdt::{self, ArgError, ArgLoc, Probe, Reg, UsdtError};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/usdt.c");
const SDT_HEADERS: &str = "/usr/include/x86_64-linux-gnu/sys";

struct Build {
    name: &'static str,
    cc: &'static str,
    flags: &'static [&'static str],
    machine: u16,
    readelf: &'static str,
}

const BUILDS: &[Build] = &[
    Build {
        name: "gcc-O0",
        cc: "gcc",
        flags: &["-O0"],
        machine: elf::EM_X86_64,
        readelf: "readelf",
    },
    Build {
        name: "gcc-O2",
        cc: "gcc",
        flags: &["-O2"],
        machine: elf::EM_X86_64,
        readelf: "readelf",
    },
    Build {
        name: "clang-O2",
        cc: "clang",
        flags: &["-O2"],
        machine: elf::EM_X86_64,
        readelf: "readelf",
    },
    Build {
        name: "a64-gcc-O2",
        cc: "aarch64-linux-gnu-gcc",
        flags: &["-O2"],
        machine: elf::EM_AARCH64,
        readelf: "aarch64-linux-gnu-readelf",
    },
];

/// Every probe in the fixture with the sizes its C argument types give (negative:
/// signed). `char` is signed on x86-64 and unsigned on AArch64; that slot is `0` here
/// and checked per machine.
const EXPECTED: &[(&str, &[i8])] = &[
    ("start", &[]),
    ("int1", &[-4]),
    ("long2", &[-8, -8]),
    ("ptr3", &[8, -1, 1]),
    ("small4", &[-2, 2, -1, 0]),
    ("mem5", &[-8, -4, -2, -4, -8]),
    ("const6", &[-4, -4, -4, -4, -4, -8]),
    ("global1", &[-4]),
    ("guarded", &[-4, -8]),
    ("done", &[-4]),
];
const CONSTANTS: [i64; 6] = [0, 1, -1, 42, -100000, 0x1_2345_6789];

/// Whether `tool` runs; if not, the test fails unless the run allows it to skip
/// (`tests::skip`).
fn tool_exists(tool: &str) -> bool {
    tests::skip::require(tool, tests::skip::runs(tool), "rewriter USDT test")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tool output is UTF-8")
}

fn work_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("usdt")
        .join(name);
    std::fs::create_dir_all(&dir).expect("create work dir");
    dir
}

/// Compile the fixture. The cross compiler does not search the host's multiarch include
/// directory, so it gets a copy of the (architecture-independent) sdt headers.
fn compile(b: &Build) -> PathBuf {
    let dir = work_dir(b.name);
    let inc = dir.join("include");
    std::fs::create_dir_all(inc.join("sys")).expect("create include dir");
    for h in ["sdt.h", "sdt-config.h"] {
        std::fs::copy(Path::new(SDT_HEADERS).join(h), inc.join("sys").join(h))
            .expect("copy sdt header (is systemtap-sdt-dev installed?)");
    }
    let out = dir.join("usdt");
    let mut cmd = Command::new(b.cc);
    cmd.args(b.flags)
        .args(["-Wall", "-Wextra", "-o"])
        .arg(&out)
        .arg(FIXTURE);
    if b.machine == elf::EM_AARCH64 {
        cmd.arg("-I").arg(&inc);
    }
    run(&mut cmd);
    out
}

/// One `stapsdt` note as `readelf -n` prints it.
#[derive(Debug, Default)]
struct NoteText {
    provider: String,
    name: String,
    location: u64,
    base: u64,
    semaphore: u64,
    arguments: String,
}

fn hex(s: &str) -> u64 {
    let s = s.trim();
    u64::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16)
        .unwrap_or_else(|e| panic!("bad hex {s:?}: {e}"))
}

fn readelf_notes(readelf: &str, bin: &Path) -> Vec<NoteText> {
    let text = run(Command::new(readelf).arg("-nW").arg(bin));
    let mut notes: Vec<NoteText> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("stapsdt ") {
            notes.push(NoteText::default());
        }
        let Some(n) = notes.last_mut() else { continue };
        // With -W, readelf prints the provider on the note's own line, after a tab.
        if let Some((_, v)) = t.split_once("Provider: ") {
            n.provider = v.to_string();
        } else if let Some(v) = t.strip_prefix("Name: ") {
            n.name = v.to_string();
        } else if let Some(v) = t.strip_prefix("Location: ") {
            // "0x…, Base: 0x…, Semaphore: 0x…"
            let fields: Vec<&str> = v.split(", ").collect();
            assert_eq!(fields.len(), 3, "unexpected readelf line {line:?}");
            n.location = hex(fields[0]);
            n.base = hex(fields[1].trim_start_matches("Base: "));
            n.semaphore = hex(fields[2].trim_start_matches("Semaphore: "));
        } else if let Some(v) = t.strip_prefix("Arguments:") {
            n.arguments = v.strip_prefix(' ').unwrap_or(v).to_string();
        }
    }
    notes
}

/// Name → value of the defined symbols, from `readelf -s`.
fn readelf_symbols(readelf: &str, bin: &Path) -> HashMap<String, u64> {
    let text = run(Command::new(readelf).arg("-sW").arg(bin));
    let mut map = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Num: Value Size Type Bind Vis Ndx Name
        let numbered = f
            .first()
            .and_then(|n| n.strip_suffix(':'))
            .is_some_and(|n| n.parse::<u32>().is_ok());
        if f.len() == 8 && numbered && f[6] != "UND" {
            map.insert(f[7].to_string(), hex(f[1]));
        }
    }
    map
}

fn section_addr(readelf: &str, bin: &Path, name: &str) -> u64 {
    let text = run(Command::new(readelf).arg("-SW").arg(bin));
    let line = text
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == name))
        .unwrap_or_else(|| panic!("no section {name} in {}", bin.display()));
    // "[Nr] Name Type Address …" — the address follows the type.
    let after = line.split(']').nth(1).expect("section line has [Nr]");
    hex(after.split_whitespace().nth(2).expect("address column"))
}

/// The location an operand text denotes, derived independently of the parser (register
/// names through iced's own tables) for the forms the four builds produce; `None` for a
/// form this simple reading does not know.
fn expected_loc(op: &str, machine: u16, syms: &HashMap<String, u64>) -> Option<ArgLoc> {
    let num = |s: &str| s.parse::<i64>().ok();
    if machine == elf::EM_X86_64 {
        let x86 = |name: &str| -> Option<Reg> {
            // iced's names: r13b is R13L; the 64-bit parent is iced's full register.
            let name = name.strip_prefix('%')?.to_ascii_uppercase();
            let name = match name.strip_suffix('B') {
                Some(r) if r.starts_with('R') => format!("{r}L"),
                _ => name,
            };
            let reg = Register::values().find(|r| format!("{r:?}") == name)?;
            Some(Reg::X86 {
                reg: reg.full_register(),
                high8: matches!(
                    reg,
                    Register::AH | Register::BH | Register::CH | Register::DH
                ),
            })
        };
        if op.starts_with('%') {
            return x86(op).map(ArgLoc::Reg);
        }
        if let Some(imm) = op.strip_prefix('$') {
            return num(imm).map(ArgLoc::Imm);
        }
        let (disp, regs) = op.strip_suffix(')')?.split_once('(')?;
        if regs == "%rip" {
            let (sym, off) = match disp.split_once('+') {
                Some((a, b)) if num(a).is_some() => (b, num(a)?),
                Some((a, b)) => (a, num(b)?),
                None => (disp, 0),
            };
            let addr = syms.get(sym)?.wrapping_add(off as u64);
            return Some(ArgLoc::Static { addr });
        }
        let disp = if disp.is_empty() { 0 } else { num(disp)? };
        let parts: Vec<&str> = regs.split(',').collect();
        let base = Some(x86(parts[0])?);
        let index = match parts[1..] {
            [] => None,
            [i, s] => Some((x86(i)?, s.parse().ok()?)),
            _ => return None,
        };
        Some(ArgLoc::Mem { base, index, disp })
    } else {
        let a64 = |name: &str| -> Option<Reg> {
            if name == "sp" {
                return Some(Reg::A64(31));
            }
            let n: u8 = name.strip_prefix(['x', 'w'])?.parse().ok()?;
            Some(Reg::A64(n))
        };
        if let Some(inner) = op.strip_prefix('[') {
            let inner = inner.strip_suffix(']')?;
            let (base, disp) = match inner.split_once(", ") {
                Some((b, d)) => (b, num(d)?),
                None => (inner, 0),
            };
            return Some(ArgLoc::Mem {
                base: Some(a64(base)?),
                index: None,
                disp,
            });
        }
        a64(op)
            .map(ArgLoc::Reg)
            .or_else(|| num(op).map(ArgLoc::Imm))
    }
}

/// The instruction bytes at a link-time address.
fn bytes_at(data: &[u8], addr: u64, len: usize) -> &[u8] {
    let file = object::File::parse(data).expect("parse ELF");
    for seg in file.segments() {
        let (off, size) = seg.file_range();
        if (seg.address()..seg.address() + size).contains(&addr) {
            let start = (off + addr - seg.address()) as usize;
            return &data[start..start + len];
        }
    }
    panic!("{addr:#x} is in no segment's file image");
}

fn check_build(b: &Build) {
    let bin = compile(b);
    let data = std::fs::read(&bin).expect("read binary");
    let probes =
        usdt::probes(&data, b.machine).unwrap_or_else(|e| panic!("{}: probes: {e}", b.name));
    let notes = readelf_notes(b.readelf, &bin);
    let syms = readelf_symbols(b.readelf, &bin);
    let base_sec = section_addr(b.readelf, &bin, ".stapsdt.base");

    assert_eq!(probes.len(), notes.len(), "{}: probe count", b.name);
    assert_eq!(probes.len(), EXPECTED.len(), "{}: probe count", b.name);
    for (p, n) in probes.iter().zip(&notes) {
        let what = format!("{} {}:{}", b.name, p.provider, p.name);
        assert_eq!((&p.provider, &p.name), (&n.provider, &n.name), "{what}");
        // No prelink here: the notes' base is the section's address, pc as written.
        assert_eq!(n.base, base_sec, "{what}: note base");
        assert_eq!(p.pc, n.location, "{what}: pc");
        assert_eq!(p.semaphore.unwrap_or(0), n.semaphore, "{what}: semaphore");
        assert_eq!(p.arg_text, n.arguments, "{what}: argument text");
    }

    let char_size: i8 = if b.machine == elf::EM_X86_64 { -1 } else { 1 };
    let mut report = Vec::new();
    for &(name, sizes) in EXPECTED {
        let found: Vec<&Probe> = probes.iter().filter(|p| p.name == name).collect();
        assert_eq!(found.len(), 1, "{}: fx:{name} sites", b.name);
        let p = found[0];
        assert_eq!(p.provider, "fx");
        let what = format!("{} fx:{name} `{}`", b.name, p.arg_text);
        let sizes: Vec<i8> = sizes
            .iter()
            .map(|&s| if s == 0 { char_size } else { s })
            .collect();
        let got: Vec<i8> = p
            .args
            .iter()
            .map(|a| {
                if a.signed {
                    -(a.size as i8)
                } else {
                    a.size as i8
                }
            })
            .collect();
        assert_eq!(got, sizes, "{what}: sizes");
        assert!(p.args.iter().all(|a| !a.float), "{what}: no float args");

        let ops: Vec<&str> = p.arg_text.split(' ').filter(|s| !s.is_empty()).collect();
        let texts = join_memory(&ops);
        assert_eq!(texts.len(), p.args.len(), "{what}: argument count");
        for (a, t) in p.args.iter().zip(&texts) {
            let op = t.split_once('@').expect("sized argument").1;
            let loc = expected_loc(op, b.machine, &syms).unwrap_or_else(|| {
                panic!("{what}: `{t}` is a form this test cannot read; extend expected_loc")
            });
            assert_eq!(a.loc, loc, "{what}: `{t}`");
        }

        // The instruction the probe marks.
        if b.machine == elf::EM_X86_64 {
            assert_eq!(bytes_at(&data, p.pc, 1), [0x90], "{what}: x86 nop");
        } else {
            let word = bytes_at(&data, p.pc, 4);
            assert_eq!(word, 0xd503201fu32.to_le_bytes(), "{what}: a64 nop");
        }
        report.push(format!("  fx:{name:<8} pc={:#x} {}", p.pc, p.arg_text));
    }

    let consts = probe(&probes, "const6");
    let imms: Vec<ArgLoc> = CONSTANTS.iter().map(|&v| ArgLoc::Imm(v)).collect();
    let locs: Vec<ArgLoc> = consts.args.iter().map(|a| a.loc).collect();
    assert_eq!(locs, imms, "{}: fx:const6", b.name);

    let guarded = probe(&probes, "guarded");
    assert_eq!(
        guarded.semaphore,
        Some(syms["fx_guarded_semaphore"]),
        "{}: fx:guarded semaphore",
        b.name
    );
    for p in probes.iter().filter(|p| p.name != "guarded") {
        assert_eq!(p.semaphore, None, "{}: {} semaphore", b.name, p.name);
    }
    println!(
        "{} ({} probes):\n{}",
        b.name,
        probes.len(),
        report.join("\n")
    );
}

/// Re-join AArch64 memory operands that `split(' ')` cut at `[x20, 8]`.
fn join_memory(parts: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for &p in parts {
        match out.last_mut() {
            Some(last) if last.contains('[') && !last.ends_with(']') => {
                last.push(' ');
                last.push_str(p);
            }
            _ => out.push(p.to_string()),
        }
    }
    out
}

fn probe<'a>(probes: &'a [Probe], name: &str) -> &'a Probe {
    probes
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no probe fx:{name}"))
}

#[test]
fn gcc_o0_x86_64() {
    check_build(&BUILDS[0]);
}

#[test]
fn gcc_o2_x86_64() {
    check_build(&BUILDS[1]);
}

#[test]
fn clang_o2_x86_64() {
    check_build(&BUILDS[2]);
}

#[test]
fn gcc_o2_aarch64() {
    let b = &BUILDS[3];
    if !tool_exists(b.cc) {
        return;
    }
    check_build(b);
}

/// gcc -O2 names the global in the note (`g_counter(%rip)`); the parser turns it into
/// the symbol's link-time address.
#[test]
fn rip_relative_global_resolves_through_symtab() {
    let b = &BUILDS[1];
    let bin = compile(&Build {
        name: "gcc-O2-rip",
        ..*b
    });
    let data = std::fs::read(&bin).expect("read binary");
    let syms = readelf_symbols(b.readelf, &bin);
    let probes = usdt::probes(&data, b.machine).expect("probes");
    let global = probe(&probes, "global1");
    assert_eq!(
        global.arg_text, "-4@g_counter(%rip)",
        "gcc -O2 output changed"
    );
    assert_eq!(
        global.args[0].loc,
        ArgLoc::Static {
            addr: syms["g_counter"]
        }
    );

    // Same length, a name the symbol table does not have: an error naming probe,
    // argument and symbol.
    let mut bad = data.clone();
    replace_once(&mut bad, b"g_counter(%rip)", b"g_counteX(%rip)");
    let err = usdt::probes(&bad, b.machine).expect_err("unknown symbol");
    let msg = err.to_string();
    assert!(
        matches!(&err, UsdtError::Arg(f) if f.arg == 1
            && f.source == ArgError::UnknownSymbol("g_counteX".into())),
        "{msg}"
    );
    assert!(
        msg.contains("fx:global1") && msg.contains("g_counteX"),
        "{msg}"
    );
}

/// A note whose `.stapsdt.base` moved (prelink): pc and semaphore move with it.
#[test]
fn prelinked_base_adjusts_pc_and_semaphore() {
    let b = &BUILDS[1];
    let bin = compile(&Build {
        name: "gcc-O2-prelink",
        ..*b
    });
    let data = std::fs::read(&bin).expect("read binary");
    let before = usdt::probes(&data, b.machine).expect("probes");

    // Move .stapsdt.base's sh_addr by 0x1000 in the section header table (ELF64 LE:
    // e_shoff at 0x28, e_shentsize at 0x3a, sh_addr at 16 within the header).
    let index = {
        let file = object::File::parse(&*data).expect("parse");
        file.section_by_name(".stapsdt.base")
            .expect(".stapsdt.base")
            .index()
            .0
    };
    let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap()) as usize;
    let shentsize = u16::from_le_bytes(data[0x3a..0x3c].try_into().unwrap()) as usize;
    let at = shoff + index * shentsize + 16;
    let mut moved = data.clone();
    let addr = u64::from_le_bytes(moved[at..at + 8].try_into().unwrap());
    moved[at..at + 8].copy_from_slice(&(addr + 0x1000).to_le_bytes());

    let after = usdt::probes(&moved, b.machine).expect("probes");
    assert_eq!(before.len(), after.len());
    for (x, y) in before.iter().zip(&after) {
        assert_eq!(y.pc, x.pc + 0x1000, "{}", x.name);
        assert_eq!(y.semaphore, x.semaphore.map(|s| s + 0x1000), "{}", x.name);
        assert_eq!(y.arg_text, x.arg_text);
    }
}

#[test]
fn inputs_without_probes_or_wrong_machine() {
    let dir = work_dir("plain");
    let src = dir.join("plain.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").expect("write source");
    let bin = dir.join("plain");
    run(Command::new("gcc").arg("-O2").arg("-o").arg(&bin).arg(&src));
    let data = std::fs::read(&bin).expect("read binary");
    assert_eq!(usdt::probes(&data, elf::EM_X86_64).expect("probes"), vec![]);
    assert!(matches!(
        usdt::probes(&data, elf::EM_AARCH64),
        Err(UsdtError::MachineMismatch {
            expected: elf::EM_AARCH64,
            actual: elf::EM_X86_64
        })
    ));
    assert!(usdt::probes(b"not an ELF file at all", elf::EM_X86_64).is_err());
    assert!(usdt::probes(&data[..100], elf::EM_X86_64).is_err());
}

fn replace_once(data: &mut [u8], from: &[u8], to: &[u8]) {
    let at = data
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern present");
    data[at..at + to.len()].copy_from_slice(to);
    assert!(
        !data[at + 1..].windows(from.len()).any(|w| w == from),
        "pattern appears more than once"
    );
}
