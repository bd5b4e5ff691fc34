//! Unit tests of the x86-64 backend. Emitted bytes are checked against GNU objdump
//! (an independent decoder, run on a temporary file); flow and planning facts on small
//! hand-assembled functions in a made-up image ([`Image`]).

mod decode;
mod emit;
mod flow;
mod plan;
mod usdt;

use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::CodeAssembler;
use object::elf;

use crate::elf::read::{Function, Input, Kind, Phdr, Section};

/// Where the test image's code starts.
pub(super) const TEXT: u64 = 0x40_1000;
/// Read-only data (jump tables) of the test image.
pub(super) const RODATA: u64 = 0x40_2000;
/// The test image's `.got`.
pub(super) const GOT: u64 = 0x40_3000;
/// Writable data of the test image.
pub(super) const DATA: u64 = 0x40_3800;
/// Where the image ends.
const END: u64 = 0x40_4000;

/// Disassemble `bytes` (code at `base`) with GNU objdump: one "mnemonic operands"
/// string per instruction, whitespace collapsed, objdump's `# address` comment kept.
/// None when objdump is missing and the run allows that (`tests::skip`).
pub(super) fn objdump(bytes: &[u8], base: u64) -> Option<Vec<String>> {
    Some(objdump_at(bytes, base)?.into_iter().map(|l| l.1).collect())
}

/// [`objdump`] with each instruction's address.
pub(super) fn objdump_at(bytes: &[u8], base: u64) -> Option<Vec<(u64, String)>> {
    use std::process::Command;
    // A missing objdump fails the test unless the run allows the skip.
    if !::tests::skip::require(
        "objdump",
        ::tests::skip::runs("objdump"),
        "x86-64 unit tests",
    ) {
        return None;
    }
    // Tests run in parallel: one file per call.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let f = std::env::temp_dir().join(format!("utrace-x86t-{}-{seq}.bin", std::process::id()));
    std::fs::write(&f, bytes).ok()?;
    let out = Command::new("objdump")
        .args(["-D", "-b", "binary", "-mi386:x86-64", "--insn-width=16"])
        .arg(format!("--adjust-vma={base:#x}"))
        .arg(&f)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&f);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines = text
        .lines()
        .filter_map(|l| {
            // "  401000:\t48 8d 05 10 00 00 00   \tlea    0x10(%rip),%rax        # 0x401017"
            let mut parts = l.splitn(3, '\t');
            let addr = parts.next()?.trim().strip_suffix(':')?;
            let addr = u64::from_str_radix(addr, 16).ok()?;
            parts.next()?;
            let ins = parts.next()?;
            Some((addr, ins.split_whitespace().collect::<Vec<_>>().join(" ")))
        })
        .collect();
    Some(lines)
}

/// Skip a test where objdump is missing and the run allows that (`tests::skip`).
macro_rules! objdump_or_skip {
    ($bytes:expr, $base:expr) => {
        match super::objdump($bytes, $base) {
            Some(l) => l,
            None => {
                eprintln!("objdump not installed; skipped");
                return;
            }
        }
    };
}
pub(super) use objdump_or_skip;

/// Assemble `f`'s code at `at`.
pub(super) fn asm(
    at: u64,
    f: impl FnOnce(&mut CodeAssembler) -> Result<(), iced_x86::IcedError>,
) -> Vec<u8> {
    let mut a = CodeAssembler::new(64).unwrap();
    f(&mut a).unwrap();
    a.assemble(at).unwrap()
}

/// Assemble `f`'s code at `at`, with the addresses of the labels `f` returns.
pub(super) fn asm_labels(
    at: u64,
    f: impl FnOnce(
        &mut CodeAssembler,
    ) -> Result<Vec<iced_x86::code_asm::CodeLabel>, iced_x86::IcedError>,
) -> (Vec<u8>, Vec<u64>) {
    let mut a = CodeAssembler::new(64).unwrap();
    let labels = f(&mut a).unwrap();
    let r = a
        .assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .unwrap();
    let ips = labels.iter().map(|l| r.label_ip(l).unwrap()).collect();
    (r.inner.code_buffer, ips)
}

/// A made-up executable image: `.text` at [`TEXT`], `.rodata` at [`RODATA`], `.got`
/// at [`GOT`], `.data` at [`DATA`], one loaded segment, file offset = address − TEXT.
pub(super) struct Image {
    pub bytes: Vec<u8>,
    pub text_len: u64,
    /// `(address, size, name)`.
    pub functions: Vec<(u64, u64, &'static str)>,
    /// Extra sections `(name, address, size, executable)`.
    pub extra: Vec<(&'static str, u64, u64, bool)>,
}

impl Image {
    /// `code` at [`TEXT`], int3 after it, zeros elsewhere.
    pub(super) fn new(code: &[u8]) -> Self {
        let mut bytes = vec![0u8; (END - TEXT) as usize];
        bytes[..(RODATA - TEXT) as usize].fill(0xcc);
        bytes[..code.len()].copy_from_slice(code);
        Image {
            bytes,
            text_len: RODATA - TEXT,
            functions: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// One function over `[TEXT, TEXT + len)`.
    pub(super) fn function(code: &[u8]) -> Self {
        let mut img = Image::new(code);
        img.functions.push((TEXT, code.len() as u64, "f"));
        img
    }

    pub(super) fn put(&mut self, addr: u64, data: &[u8]) {
        let off = (addr - TEXT) as usize;
        self.bytes[off..off + data.len()].copy_from_slice(data);
    }

    pub(super) fn input(&self) -> Input<'_> {
        let section = |name: &str, addr: u64, size: u64, exec: bool| Section {
            name: name.into(),
            sh_type: elf::SHT_PROGBITS,
            flags: u64::from(elf::SHF_ALLOC)
                | if exec {
                    u64::from(elf::SHF_EXECINSTR)
                } else {
                    u64::from(elf::SHF_WRITE)
                },
            addr,
            offset: addr - TEXT,
            size,
        };
        let mut sections = vec![
            section(".text", TEXT, self.text_len, true),
            section(".rodata", RODATA, GOT - RODATA, false),
            section(".got", GOT, DATA - GOT, false),
            section(".data", DATA, END - DATA, false),
        ];
        sections.extend(self.extra.iter().map(|&(n, a, s, x)| section(n, a, s, x)));
        Input {
            name: "test".into(),
            data: &self.bytes,
            machine: elf::EM_X86_64,
            kind: Kind::Exec,
            entry: TEXT,
            phdrs: vec![Phdr {
                p_type: elf::PT_LOAD,
                p_flags: elf::PF_R | elf::PF_X,
                offset: 0,
                vaddr: TEXT,
                paddr: TEXT,
                filesz: END - TEXT,
                memsz: END - TEXT,
                align: 0x1000,
            }],
            phoff: 0,
            shoff: 0,
            shnum: 0,
            shstrndx: 0,
            sections,
            functions: self
                .functions
                .iter()
                .map(|&(addr, size, name)| Function {
                    addr,
                    size,
                    names: vec![name.into()],
                })
                .collect(),
            build_id: None,
        }
    }
}

/// The first function of `input`.
pub(super) fn func<'a>(input: &'a Input) -> &'a Function {
    &input.functions[0]
}
