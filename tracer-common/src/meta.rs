//! The metadata the rewriter leaves in an instrumented binary, in a note section
//! named [`META_SECTION`] (note name [`META_NOTE_NAME`], type [`META_NOTE_TYPE`]).
//!
//! Descriptor layout (little-endian), version [`META_VERSION`]:
//!
//! ```text
//! 0    magic  "UTRCMETA"
//! 8    u32 version          12  u32 arch (ARCH_*)
//! 16   u32 record_version   20  u32 record_size
//! 24   u32 nsites           28  u32 strtab_len
//! 32   u32 build_id_len     36  [u8; 32] build_id of the ORIGINAL binary
//! 68   u32 nslots           72  u32 buf_records
//! 76   u32 flags (META_FLAG_*)
//! 80   u64 binary_id        88  u64 flush_vaddr      96  u64 flush_file_off
//! 104  u64 rw_vaddr         112 u64 rw_size          120 u64 text_vaddr
//! 128  u64 text_size        136 u64 original_size    144 u32 time_mode (TimeMode)
//! 148  u32 nsemaphores
//! 152  sites: nsites × 32 bytes:
//!        u64 vaddr, u64 file_off, u32 id, u32 name_off, u8 kind, u8 mode, u8 nargs,
//!        u8 reserved, u32 reserved
//! ...  strtab: NUL-terminated names, referenced by name_off
//! ...  (4-aligned) semaphores: nsemaphores × 16 bytes: u64 anchor_file_off,
//!        u64 semaphore_file_off (see [`Semaphore`])
//! ...  optional operand table (see [`SiteOperands`]): u32 nsets, then per set
//!        u32 site, u32 flags, u8 count, 3 × u8 reserved, count × 16-byte operands
//!        (u8 kind, u8 base, u8 index, u8 shift, u8 size, u8 flags, 2 × u8 reserved,
//!        i64 disp; see [`crate::operand::Operand`])
//! ...  optional fallback-reason table (see [`SiteReason`]), after the operand table
//!        (then always present, perhaps with no sets): u32 nreasons, then per reason
//!        u32 site, u32 code (`FallbackReason::code`), u64 addr, u32 text_len,
//!        text_len bytes of UTF-8, padding to 4
//! ```
//! `vaddr`s are link-time addresses; `file_off`s are offsets in the rewritten file.
//!
//! The operand table came after version 1 had shipped: its count is its own first word
//! rather than a header field, so the version stays 1 both ways. Metadata that ends
//! after the semaphores (older rewriters, or no uprobe site needing operands) has no
//! operand sets, and older tracers ignore the table (their uprobe memory and USDT
//! records then carry zeros, as before). The reason table came the same way: older
//! tracers stop reading after the operands, and metadata without it (older rewriters,
//! no uprobe site) gives every uprobe site the reason [`FallbackReason::Unknown`].
//!
//! The note holds the site table, the buffer geometry and, per uprobe site, why it is one
//! (`FallbackReason`: printed by `rewriter -v` and by `tracer report`, each uprobe site
//! hottest first). Decoding a note never makes more than it holds, names included, and at
//! most [`MAX_DECODED_BYTES`] in all, else `MetaError::TooLarge` (a hostile binary's note
//! cannot multiply in the tracer's memory: test `trust_limits`).

use std::fmt;

use crate::operand::{MAX_OPERANDS, Operand, OperandSet};
use crate::record::{le_u32, le_u64};

pub const META_SECTION: &str = ".note.utrace";
pub const META_NOTE_NAME: &[u8] = b"UTRACE";
pub const META_NOTE_TYPE: u32 = 0x5554_0001;
pub const META_MAGIC: [u8; 8] = *b"UTRCMETA";
pub const META_VERSION: u32 = 1;
const HEADER_LEN: usize = 152;
const SITE_LEN: usize = 32;

/// Most bytes one note may decode into (sites, their names, operand sets, reasons):
/// the tracer parses the notes of every binary it meets, as root, so a note is
/// refused before it could make the parser allocate more. A rewritten
/// librustc_driver (every entry and exit) decodes to well under a tenth of this.
pub const MAX_DECODED_BYTES: u64 = 1 << 30;

/// The binary is a static executable: its entry shim installs the pre-TLS TCB.
pub const META_FLAG_PRE_TLS: u32 = 1;
/// The binary is a shared library.
pub const META_FLAG_SHARED_LIB: u32 = 2;
/// The binary is position independent (PIE or shared library).
pub const META_FLAG_PIC: u32 = 4;
/// Circular buffers (`BUF_CIRCULAR`).
pub const META_FLAG_CIRCULAR: u32 = 8;
/// Fast circular 64 KiB rings (`BUF_FAST_CIRCULAR`).
pub const META_FLAG_FAST_CIRCULAR: u32 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum SiteKind {
    /// Record: first argument, return address.
    FunctionEntry = 1,
    /// A return, or a tail call that leaves the function. Record: return value
    /// (`rax` / `x0`), return address.
    FunctionExit = 2,
    /// The start of a basic block. Record: the block's run-time address, aux 0.
    Block = 3,
    /// A load or store. Record: effective address, the instruction's run-time address;
    /// flags `FLAG_MEM_READ` / `FLAG_MEM_WRITE` and the size (`mem_size`).
    Memory = 4,
    /// A USDT probe (`<sys/sdt.h>`), named `provider:name`. Record: arguments 1 and 2
    /// in value and aux; arguments 3.. follow in records of the same site flagged
    /// `FLAG_USDT_MORE` (two per record), reserved together with the first.
    Usdt = 5,
    /// A call instruction. Record: the call's target (where it goes), the return
    /// address (the instruction after the call).
    Call = 6,
    /// Control arrived where unwinding lands in its function: an exception's landing
    /// pad (catch or cleanup, from the LSDA) or the return of a `setjmp` call (a
    /// `longjmp` lands there). Every call of the thread above the function's innermost
    /// open call was left by unwinding and ends here. Record: the pad's address, aux 0.
    /// Planned with exits.
    Landing = 7,
    /// A call to `_Unwind_Resume`: the function's cleanup code ran and unwinding goes
    /// on past it, so its innermost open call (and any above) ends here, left by
    /// unwinding. Record: the call's address, aux 0. Planned with exits.
    Resume = 8,
}

impl SiteKind {
    /// Every kind, in code order.
    pub const ALL: [SiteKind; 8] = [
        SiteKind::FunctionEntry,
        SiteKind::FunctionExit,
        SiteKind::Block,
        SiteKind::Memory,
        SiteKind::Usdt,
        SiteKind::Call,
        SiteKind::Landing,
        SiteKind::Resume,
    ];
}

/// How records get their `time`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum TimeMode {
    /// Every record reads the cycle counter (`rdtsc` / `cntvct_el0`).
    #[default]
    Record = 0,
    /// No clock read in the stubs: `time` is not written. Readers give each record a
    /// time interpolated between the clock samples of the drains around it (every
    /// chunk header carries one; a thread's first drain is its registration).
    Coarse = 1,
    /// Only basic-block stubs read the cycle counter; the other records of a block
    /// store the buffer epoch and readers give them the time of the block record
    /// before them on their thread.
    Block = 2,
}

impl TimeMode {
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(TimeMode::Record),
            1 => Some(TimeMode::Coarse),
            2 => Some(TimeMode::Block),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TimeMode::Record => "record",
            TimeMode::Coarse => "coarse",
            TimeMode::Block => "block",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SiteMode {
    /// An inline buffer-store stub.
    Inline = 1,
    /// A plain uprobe attached by the tracer, emitting the same record.
    Uprobe = 2,
    /// Neither: a stub or a trap there would break the program (the reason says why,
    /// e.g. inside an AArch64 exclusive load/store sequence). Never recorded.
    Untraced = 3,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub id: u32,
    pub vaddr: u64,
    pub file_off: u64,
    pub name: String,
    pub kind: SiteKind,
    pub mode: SiteMode,
    /// USDT sites: the probe's number of arguments (0 for other kinds).
    pub nargs: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Metadata {
    pub arch: u32,
    pub record_version: u32,
    pub record_size: u32,
    pub build_id: Vec<u8>,
    pub nslots: u32,
    pub buf_records: u32,
    pub flags: u32,
    pub binary_id: u64,
    pub flush_vaddr: u64,
    pub flush_file_off: u64,
    pub rw_vaddr: u64,
    pub rw_size: u64,
    pub text_vaddr: u64,
    pub text_size: u64,
    pub original_size: u64,
    pub time_mode: TimeMode,
    pub sites: Vec<Site>,
    pub semaphores: Vec<Semaphore>,
    /// Operand descriptors of the uprobe sites of kind memory and USDT, by site id
    /// (sorted, at most one per site).
    pub operands: Vec<SiteOperands>,
}

/// Where the values of a uprobe site's record are (the effective address of a memory
/// site, the arguments of a USDT probe), for the eBPF `site` program to compute what
/// the inline stub would have recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteOperands {
    pub site: u32,
    pub set: OperandSet,
}

/// A USDT semaphore (a `u16` the program tests before computing a probe's arguments)
/// and the anchor that enables it: a never-executed instruction of the rewriter's code
/// at which the tracer opens a uprobe with this reference counter, so the kernel raises
/// the semaphore in every process that maps the binary for as long as it is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Semaphore {
    pub anchor_file_off: u64,
    pub semaphore_file_off: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaError {
    Truncated(&'static str),
    BadMagic,
    UnsupportedVersion(u32),
    BadSite(u32),
    BadTimeMode(u32),
    /// Operand set `i` of the table is malformed.
    BadOperands(u32),
    /// Decoding would take more than the note holds or more than [`MAX_DECODED_BYTES`].
    TooLarge(TooLarge),
}

/// What made a note too large to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooLarge {
    /// The site names would take `bytes` (at least), more than the string table's
    /// `strtab` bytes: names that share bytes (every site pointing at one long name)
    /// would multiply the note in memory. A rewriter writes each name once.
    Names { bytes: u64, strtab: u64 },
    /// More operand sets or fallback reasons (`what`) than the note has sites: at most
    /// one per site.
    PerSite {
        what: &'static str,
        count: u64,
        sites: u64,
    },
    /// The decoded note would take `bytes`, more than [`MAX_DECODED_BYTES`].
    Decoded { bytes: u64 },
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TooLarge::Names { bytes, strtab } => write!(
                f,
                "site names would take at least {bytes} bytes from a {strtab}-byte string table"
            ),
            TooLarge::PerSite { what, count, sites } => {
                write!(f, "{count} {what} for {sites} sites")
            }
            TooLarge::Decoded { bytes } => write!(
                f,
                "it would decode into {bytes} bytes (at most {MAX_DECODED_BYTES})"
            ),
        }
    }
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaError::Truncated(what) => write!(f, "utrace metadata truncated ({what})"),
            MetaError::BadMagic => write!(f, "utrace metadata has a bad magic"),
            MetaError::UnsupportedVersion(v) => write!(
                f,
                "utrace metadata version {v} is not supported (this build reads {META_VERSION})"
            ),
            MetaError::BadSite(i) => write!(f, "utrace metadata: site {i} is malformed"),
            MetaError::BadTimeMode(m) => write!(f, "utrace metadata: unknown time mode {m}"),
            MetaError::BadOperands(i) => {
                write!(f, "utrace metadata: operand set {i} is malformed")
            }
            MetaError::TooLarge(why) => write!(f, "utrace metadata: note too large: {why}"),
        }
    }
}

impl std::error::Error for MetaError {}

/// Why a site is traced by a uprobe instead of an inline stub: user-facing data, kept
/// per uprobe site in the metadata (see [`SiteReason`]) so that `rewriter -v` and
/// `tracer report` can say it. `Display` is the sentence the rewriter prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// Metadata written before reasons were kept.
    Unknown,
    /// `--force-uprobe`.
    Forced,
    /// The function symbol has no size.
    NoSize,
    /// The function does not start on an instruction boundary (AArch64: 4 bytes).
    Unaligned,
    /// The function is not in a file-backed segment.
    NotFileBacked,
    /// The function has no instructions.
    EmptyFunction,
    /// An instruction of the function could not be decoded.
    Undecodable { at: u64 },
    /// A memory site whose instruction turned out to access no memory.
    NotMemoryAccess,
    /// A site inside the function's landing pad (`endbr64`, `bti c`, `paciasp`).
    InLandingPad,
    /// The function has an indirect jump not explained as a jump table: branch targets
    /// inside it may be unknown.
    UnresolvedJump { at: u64 },
    /// The exception tables could not be read (the error): no function interior is
    /// trusted.
    ExceptionTables(String),
    /// A branch can land inside the instructions the patch would displace.
    BranchTargetInside { target: u64 },
    /// A site without a window of its own that no other window covers.
    NoWindow,
    /// Its window, merged with an overlapping one, was rejected (why).
    Overlapping(String),
    /// An instruction-set specific reason, as the backend words it (an instruction that
    /// cannot be moved, a function too short, a trampoline out of branch range, ...).
    Detail(String),
    /// (Untraced.) After the load-exclusive at `at` and up to its store-exclusive: a
    /// stub's stores or a trap there clear the exclusive monitor, so the store would
    /// fail on every retry.
    ExclusiveSequence { at: u64 },
    /// (Untraced.) A landing site with no room for a stub (why): not a uprobe either,
    /// as Rust code has tens of thousands of such pads (each uprobe costs its attach in
    /// every session); the calls it would end end at the function's next resume or
    /// exit.
    LandingNotPatched(String),
}

impl FallbackReason {
    /// The reason's number in the metadata's reason table.
    pub fn code(&self) -> u32 {
        match self {
            FallbackReason::Unknown => 0,
            FallbackReason::Forced => 1,
            FallbackReason::NoSize => 2,
            FallbackReason::Unaligned => 3,
            FallbackReason::NotFileBacked => 4,
            FallbackReason::EmptyFunction => 5,
            FallbackReason::Undecodable { .. } => 6,
            FallbackReason::NotMemoryAccess => 7,
            FallbackReason::InLandingPad => 8,
            FallbackReason::UnresolvedJump { .. } => 9,
            FallbackReason::ExceptionTables(_) => 10,
            FallbackReason::BranchTargetInside { .. } => 11,
            FallbackReason::NoWindow => 12,
            FallbackReason::Overlapping(_) => 13,
            FallbackReason::Detail(_) => 14,
            FallbackReason::ExclusiveSequence { .. } => 15,
            FallbackReason::LandingNotPatched(_) => 16,
        }
    }

    /// The address and text stored with the code (0 and empty when it has none).
    fn data(&self) -> (u64, &str) {
        match self {
            FallbackReason::Undecodable { at }
            | FallbackReason::UnresolvedJump { at }
            | FallbackReason::ExclusiveSequence { at } => (*at, ""),
            FallbackReason::BranchTargetInside { target } => (*target, ""),
            FallbackReason::ExceptionTables(t)
            | FallbackReason::Overlapping(t)
            | FallbackReason::Detail(t)
            | FallbackReason::LandingNotPatched(t) => (0, t),
            _ => (0, ""),
        }
    }

    /// The reason stored as (`code`, address, text); an unknown code (a newer
    /// rewriter's) is `Unknown`.
    pub fn from_parts(code: u32, addr: u64, text: &str) -> FallbackReason {
        match code {
            1 => FallbackReason::Forced,
            2 => FallbackReason::NoSize,
            3 => FallbackReason::Unaligned,
            4 => FallbackReason::NotFileBacked,
            5 => FallbackReason::EmptyFunction,
            6 => FallbackReason::Undecodable { at: addr },
            7 => FallbackReason::NotMemoryAccess,
            8 => FallbackReason::InLandingPad,
            9 => FallbackReason::UnresolvedJump { at: addr },
            10 => FallbackReason::ExceptionTables(text.into()),
            11 => FallbackReason::BranchTargetInside { target: addr },
            12 => FallbackReason::NoWindow,
            13 => FallbackReason::Overlapping(text.into()),
            14 => FallbackReason::Detail(text.into()),
            15 => FallbackReason::ExclusiveSequence { at: addr },
            16 => FallbackReason::LandingNotPatched(text.into()),
            _ => FallbackReason::Unknown,
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FallbackReason::Unknown => f.write_str("unknown (metadata without reasons)"),
            FallbackReason::Forced => f.write_str("--force-uprobe"),
            FallbackReason::NoSize => f.write_str("symbol has no size"),
            FallbackReason::Unaligned => f.write_str("function address not 4-byte aligned"),
            FallbackReason::NotFileBacked => f.write_str("not in a file-backed segment"),
            FallbackReason::EmptyFunction => f.write_str("empty function"),
            FallbackReason::Undecodable { at } => write!(f, "undecodable instruction at {at:#x}"),
            FallbackReason::NotMemoryAccess => f.write_str("not a memory access"),
            FallbackReason::InLandingPad => f.write_str("inside the landing pad"),
            FallbackReason::UnresolvedJump { at } => {
                write!(f, "indirect jump at {at:#x} not explained as a jump table")
            }
            FallbackReason::BranchTargetInside { target } => {
                write!(f, "branch target {target:#x} inside the displaced bytes")
            }
            FallbackReason::NoWindow => f.write_str("no window"),
            FallbackReason::Overlapping(why) => write!(f, "overlapping sites: {why}"),
            FallbackReason::ExceptionTables(t) | FallbackReason::Detail(t) => f.write_str(t),
            FallbackReason::ExclusiveSequence { at } => write!(
                f,
                "inside the exclusive load/store sequence from {at:#x} (a stub or trap would clear its monitor)"
            ),
            FallbackReason::LandingNotPatched(why) => write!(
                f,
                "a landing pad with no room for a stub ({why}); no uprobe: the calls it would end end at its function's next resume or exit"
            ),
        }
    }
}

/// The fallback reason of one uprobe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteReason {
    pub site: u32,
    pub reason: FallbackReason,
}

/// Append the reason table (see the module docs).
fn put_reasons(out: &mut Vec<u8>, reasons: &[SiteReason]) {
    out.extend_from_slice(&(reasons.len() as u32).to_le_bytes());
    for r in reasons {
        let (addr, text) = r.reason.data();
        out.extend_from_slice(&r.site.to_le_bytes());
        out.extend_from_slice(&r.reason.code().to_le_bytes());
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    }
}

/// The reason table at `at`; none when the descriptor ends there.
fn parse_reasons(b: &[u8], at: usize, nsites: usize) -> Result<Vec<SiteReason>, MetaError> {
    if b.len() <= at {
        return Ok(Vec::new());
    }
    let short = MetaError::Truncated("reasons");
    let n = le_u32(b.get(at..at + 4).ok_or(short.clone())?, 0) as usize;
    at_most_one_per_site("fallback reasons", n, nsites)?;
    decoded::<SiteReason>(n, 0)?;
    let mut o = at + 4;
    let mut out = Vec::with_capacity(n.min(b.len() / 20));
    for _ in 0..n {
        let head = b.get(o..o + 20).ok_or(short.clone())?;
        let len = le_u32(head, 16) as usize;
        let text = b.get(o + 20..o + 20 + len).ok_or(short.clone())?;
        let text = String::from_utf8_lossy(text);
        out.push(SiteReason {
            site: le_u32(head, 0),
            reason: FallbackReason::from_parts(le_u32(head, 4), le_u64(head, 8), &text),
        });
        o = (o + 20 + len).div_ceil(4) * 4;
    }
    Ok(out)
}

impl SiteKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(SiteKind::FunctionEntry),
            2 => Some(SiteKind::FunctionExit),
            3 => Some(SiteKind::Block),
            4 => Some(SiteKind::Memory),
            5 => Some(SiteKind::Usdt),
            6 => Some(SiteKind::Call),
            7 => Some(SiteKind::Landing),
            8 => Some(SiteKind::Resume),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            SiteKind::FunctionEntry => "entry",
            SiteKind::FunctionExit => "exit",
            SiteKind::Block => "block",
            SiteKind::Memory => "memory",
            SiteKind::Usdt => "usdt",
            SiteKind::Call => "call",
            SiteKind::Landing => "landing",
            SiteKind::Resume => "resume",
        }
    }
}

impl SiteMode {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(SiteMode::Inline),
            2 => Some(SiteMode::Uprobe),
            3 => Some(SiteMode::Untraced),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            SiteMode::Inline => "inline",
            SiteMode::Uprobe => "uprobe",
            SiteMode::Untraced => "untraced",
        }
    }
}

/// A table of `count` entries that may hold one per site at most.
fn at_most_one_per_site(what: &'static str, count: usize, sites: usize) -> Result<(), MetaError> {
    if count > sites {
        return Err(MetaError::TooLarge(TooLarge::PerSite {
            what,
            count: count as u64,
            sites: sites as u64,
        }));
    }
    Ok(())
}

/// What `count` values of `T` take in memory, checked against [`MAX_DECODED_BYTES`]
/// together with `more` bytes decoded besides.
fn decoded<T>(count: usize, more: u64) -> Result<u64, MetaError> {
    let bytes = (count as u64)
        .saturating_mul(size_of::<T>() as u64)
        .saturating_add(more);
    if bytes > MAX_DECODED_BYTES {
        return Err(MetaError::TooLarge(TooLarge::Decoded { bytes }));
    }
    Ok(bytes)
}

/// The operand table at `at` (see the module docs); none when the descriptor ends there.
fn parse_operands(
    b: &[u8],
    at: usize,
    nsites: usize,
) -> Result<(Vec<SiteOperands>, usize), MetaError> {
    if b.len() <= at {
        return Ok((Vec::new(), at));
    }
    let short = MetaError::Truncated("operands");
    let n = le_u32(b.get(at..at + 4).ok_or(short.clone())?, 0) as usize;
    at_most_one_per_site("operand sets", n, nsites)?;
    let mut o = at + 4;
    let mut out = Vec::with_capacity(n.min(b.len() / 12));
    for i in 0..n {
        let head = b.get(o..o + 12).ok_or(short.clone())?;
        let count = head[8];
        if usize::from(count) > MAX_OPERANDS {
            return Err(MetaError::BadOperands(i as u32));
        }
        let mut set = OperandSet {
            count,
            flags: le_u32(head, 4),
            ..Default::default()
        };
        o += 12;
        for op in set.ops.iter_mut().take(usize::from(count)) {
            let e = b.get(o..o + 16).ok_or(short.clone())?;
            *op = Operand {
                kind: e[0],
                base: e[1],
                index: e[2],
                shift: e[3],
                size: e[4],
                flags: e[5],
                _pad: [0; 2],
                disp: le_u64(e, 8) as i64,
            };
            o += 16;
        }
        out.push(SiteOperands {
            site: le_u32(head, 0),
            set,
        });
    }
    Ok((out, o))
}

/// The magic, version and length of a descriptor's fixed header.
fn check_header(b: &[u8]) -> Result<(), MetaError> {
    if b.len() < 12 {
        return Err(MetaError::Truncated("header"));
    }
    if b[..8] != META_MAGIC {
        return Err(MetaError::BadMagic);
    }
    let version = le_u32(b, 8);
    if version != META_VERSION {
        return Err(MetaError::UnsupportedVersion(version));
    }
    if b.len() < HEADER_LEN {
        return Err(MetaError::Truncated("header"));
    }
    Ok(())
}

/// The `nsites` sites after the header, named from `strtab`, and the bytes their names
/// take.
fn parse_sites(b: &[u8], nsites: usize, strtab: &[u8]) -> Result<(Vec<Site>, u64), MetaError> {
    let strtab_len = strtab.len();
    decoded::<Site>(nsites, 0)?;
    let mut names = 0u64;
    let mut sites = Vec::with_capacity(nsites);
    for i in 0..nsites {
        let o = HEADER_LEN + i * SITE_LEN;
        let name_off = le_u32(b, o + 20) as usize;
        let bad = || MetaError::BadSite(i as u32);
        let name_bytes = strtab.get(name_off..).ok_or_else(bad)?;
        let end = name_bytes.iter().position(|&c| c == 0).ok_or_else(bad)?;
        // Each name is materialised: together they may not take more than the
        // table they come from (checked before the copy, so a refused note costs
        // at most two scans of its table).
        names += end as u64 + 1;
        if names > strtab_len as u64 {
            return Err(MetaError::TooLarge(TooLarge::Names {
                bytes: names,
                strtab: strtab_len as u64,
            }));
        }
        sites.push(Site {
            vaddr: le_u64(b, o),
            file_off: le_u64(b, o + 8),
            id: le_u32(b, o + 16),
            name: String::from_utf8_lossy(&name_bytes[..end]).into_owned(),
            kind: SiteKind::from_u8(b[o + 24]).ok_or_else(bad)?,
            mode: SiteMode::from_u8(b[o + 25]).ok_or_else(bad)?,
            nargs: b[o + 26],
        });
    }
    Ok((sites, names))
}

/// The semaphore table, 4-aligned after the string table that ends at `total`, and
/// where it ends.
fn parse_semaphores(b: &[u8], total: usize) -> Result<(Vec<Semaphore>, usize), MetaError> {
    let nsem = le_u32(b, 148) as usize;
    let sem_at = total.div_ceil(4) * 4;
    let sem_end = nsem
        .checked_mul(16)
        .and_then(|n| n.checked_add(sem_at))
        .ok_or(MetaError::Truncated("semaphores"))?;
    if b.len() < sem_end {
        return Err(MetaError::Truncated("semaphores"));
    }
    let semaphores = (0..nsem)
        .map(|i| Semaphore {
            anchor_file_off: le_u64(b, sem_at + 16 * i),
            semaphore_file_off: le_u64(b, sem_at + 16 * i + 8),
        })
        .collect();
    Ok((semaphores, sem_end))
}

impl Metadata {
    /// `BUF_*` of this binary's buffers.
    pub fn buf_kind(&self) -> u32 {
        if self.flags & META_FLAG_FAST_CIRCULAR != 0 {
            crate::BUF_FAST_CIRCULAR
        } else if self.flags & META_FLAG_CIRCULAR != 0 {
            crate::BUF_CIRCULAR
        } else {
            crate::BUF_TRACE
        }
    }

    /// Serialise to the note descriptor described in the module docs.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_bytes_with(&[])
    }

    /// Serialise with the fallback reasons of the uprobe sites (none: the bytes older
    /// rewriters wrote).
    pub fn to_bytes_with(&self, reasons: &[SiteReason]) -> Vec<u8> {
        let mut strtab = Vec::new();
        let mut name_offs = Vec::with_capacity(self.sites.len());
        for s in &self.sites {
            name_offs.push(strtab.len() as u32);
            strtab.extend_from_slice(s.name.as_bytes());
            strtab.push(0);
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.sites.len() * SITE_LEN + strtab.len());
        self.put_header(&mut out, strtab.len());
        for (s, name_off) in self.sites.iter().zip(name_offs) {
            out.extend_from_slice(&s.vaddr.to_le_bytes());
            out.extend_from_slice(&s.file_off.to_le_bytes());
            out.extend_from_slice(&s.id.to_le_bytes());
            out.extend_from_slice(&name_off.to_le_bytes());
            out.push(s.kind as u8);
            out.push(s.mode as u8);
            out.push(s.nargs);
            out.extend_from_slice(&[0u8; 5]);
        }
        out.extend_from_slice(&strtab);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        for m in &self.semaphores {
            out.extend_from_slice(&m.anchor_file_off.to_le_bytes());
            out.extend_from_slice(&m.semaphore_file_off.to_le_bytes());
        }
        // Left out when empty: such metadata is byte for byte what older rewriters
        // wrote. The reason table follows the operand table, so that one is then there.
        if !self.operands.is_empty() || !reasons.is_empty() {
            self.put_operands(&mut out);
        }
        if !reasons.is_empty() {
            put_reasons(&mut out, reasons);
        }
        out
    }

    /// The fixed header: magic, counts, build-id, geometry, addresses.
    fn put_header(&self, out: &mut Vec<u8>, strtab_len: usize) {
        out.extend_from_slice(&META_MAGIC);
        for v in [
            META_VERSION,
            self.arch,
            self.record_version,
            self.record_size,
            self.sites.len() as u32,
            strtab_len as u32,
            self.build_id.len().min(32) as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let mut bid = [0u8; 32];
        let n = self.build_id.len().min(32);
        bid[..n].copy_from_slice(&self.build_id[..n]);
        out.extend_from_slice(&bid);
        for v in [self.nslots, self.buf_records, self.flags] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.binary_id,
            self.flush_vaddr,
            self.flush_file_off,
            self.rw_vaddr,
            self.rw_size,
            self.text_vaddr,
            self.text_size,
            self.original_size,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.time_mode as u32).to_le_bytes());
        out.extend_from_slice(&(self.semaphores.len() as u32).to_le_bytes());
        debug_assert_eq!(out.len(), HEADER_LEN);
    }

    /// The operand table: its count, then each site's operand set.
    fn put_operands(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.operands.len() as u32).to_le_bytes());
        for so in &self.operands {
            let n = usize::from(so.set.count).min(MAX_OPERANDS);
            out.extend_from_slice(&so.site.to_le_bytes());
            out.extend_from_slice(&so.set.flags.to_le_bytes());
            out.extend_from_slice(&[n as u8, 0, 0, 0]);
            for op in &so.set.ops[..n] {
                out.extend_from_slice(&[
                    op.kind, op.base, op.index, op.shift, op.size, op.flags, 0, 0,
                ]);
                out.extend_from_slice(&op.disp.to_le_bytes());
            }
        }
    }

    /// The fallback reasons stored in a note descriptor (empty for metadata written
    /// before they were kept: then every uprobe site's reason is
    /// [`FallbackReason::Unknown`]).
    pub fn reasons(b: &[u8]) -> Result<Vec<SiteReason>, MetaError> {
        let at = Self::operands_at(b)?;
        let nsites = le_u32(b, 24) as usize;
        let (_, end) = parse_operands(b, at, nsites)?;
        parse_reasons(b, end, nsites)
    }

    /// Where the operand table of a descriptor starts (after the semaphores).
    fn operands_at(b: &[u8]) -> Result<usize, MetaError> {
        if b.len() < HEADER_LEN {
            return Err(MetaError::Truncated("header"));
        }
        let total = (le_u32(b, 24) as usize)
            .checked_mul(SITE_LEN)
            .and_then(|n| n.checked_add(HEADER_LEN + le_u32(b, 28) as usize))
            .ok_or(MetaError::Truncated("strtab"))?;
        (le_u32(b, 148) as usize)
            .checked_mul(16)
            .and_then(|n| n.checked_add(total.div_ceil(4) * 4))
            .ok_or(MetaError::Truncated("semaphores"))
    }

    /// Parse a note descriptor.
    pub fn parse(b: &[u8]) -> Result<Self, MetaError> {
        check_header(b)?;
        let nsites = le_u32(b, 24) as usize;
        let strtab_len = le_u32(b, 28) as usize;
        let bid_len = (le_u32(b, 32) as usize).min(32);
        let sites_end = nsites
            .checked_mul(SITE_LEN)
            .and_then(|n| n.checked_add(HEADER_LEN))
            .ok_or(MetaError::Truncated("sites"))?;
        let total = sites_end
            .checked_add(strtab_len)
            .ok_or(MetaError::Truncated("strtab"))?;
        if b.len() < total {
            return Err(MetaError::Truncated("sites"));
        }
        let (sites, names) = parse_sites(b, nsites, &b[sites_end..total])?;
        let (semaphores, sem_end) = parse_semaphores(b, total)?;
        let (operands, _) = parse_operands(b, sem_end, nsites)?;
        decoded::<SiteOperands>(operands.len(), decoded::<Site>(nsites, names)?)?;
        Ok(Metadata {
            arch: le_u32(b, 12),
            record_version: le_u32(b, 16),
            record_size: le_u32(b, 20),
            build_id: b[36..36 + bid_len].to_vec(),
            nslots: le_u32(b, 68),
            buf_records: le_u32(b, 72),
            flags: le_u32(b, 76),
            binary_id: le_u64(b, 80),
            flush_vaddr: le_u64(b, 88),
            flush_file_off: le_u64(b, 96),
            rw_vaddr: le_u64(b, 104),
            rw_size: le_u64(b, 112),
            text_vaddr: le_u64(b, 120),
            text_size: le_u64(b, 128),
            original_size: le_u64(b, 136),
            time_mode: TimeMode::from_u32(le_u32(b, 144))
                .ok_or(MetaError::BadTimeMode(le_u32(b, 144)))?,
            sites,
            semaphores,
            operands,
        })
    }

    /// Find the descriptor of our note inside the raw contents of an SHT_NOTE
    /// section (a sequence of 4-aligned notes).
    pub fn from_note_section(data: &[u8]) -> Option<Result<Self, MetaError>> {
        note_desc(data).map(Self::parse)
    }

    /// The fallback reasons of the note in the raw contents of an SHT_NOTE section
    /// (see [`Metadata::reasons`]).
    pub fn reasons_from_note_section(data: &[u8]) -> Option<Result<Vec<SiteReason>, MetaError>> {
        note_desc(data).map(Self::reasons)
    }

    /// Encode as a complete ELF note (namesz, descsz, type, name, desc, padding).
    pub fn to_note(&self) -> Vec<u8> {
        self.to_note_with(&[])
    }

    /// [`Metadata::to_note`] with the uprobe sites' fallback reasons.
    pub fn to_note_with(&self, reasons: &[SiteReason]) -> Vec<u8> {
        let desc = self.to_bytes_with(reasons);
        let mut out = Vec::with_capacity(desc.len() + 32);
        let name_len = META_NOTE_NAME.len() + 1;
        out.extend_from_slice(&(name_len as u32).to_le_bytes());
        out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        out.extend_from_slice(&META_NOTE_TYPE.to_le_bytes());
        out.extend_from_slice(META_NOTE_NAME);
        out.push(0);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out.extend_from_slice(&desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }
}

/// The descriptor of our note in the raw contents of an SHT_NOTE section.
fn note_desc(data: &[u8]) -> Option<&[u8]> {
    let mut o = 0usize;
    while o + 12 <= data.len() {
        let namesz = le_u32(data, o) as usize;
        let descsz = le_u32(data, o + 4) as usize;
        let ty = le_u32(data, o + 8);
        let name_start = o + 12;
        let desc_start = name_start + namesz.div_ceil(4) * 4;
        let next = desc_start + descsz.div_ceil(4) * 4;
        if desc_start + descsz > data.len() {
            return None;
        }
        let name = &data[name_start..name_start + namesz];
        let name = name.strip_suffix(&[0]).unwrap_or(name);
        if ty == META_NOTE_TYPE && name == META_NOTE_NAME {
            return Some(&data[desc_start..desc_start + descsz]);
        }
        o = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let m = Metadata {
            arch: crate::ARCH_X86_64,
            record_version: 1,
            record_size: 32,
            build_id: vec![1, 2, 3, 4],
            nslots: 8,
            buf_records: 16,
            flags: META_FLAG_PIC,
            binary_id: 0x1122,
            flush_vaddr: 0x5000,
            flush_file_off: 0x4000,
            rw_vaddr: 0x9000,
            rw_size: 0x100000,
            text_vaddr: 0x8000,
            text_size: 0x100,
            original_size: 1234,
            time_mode: TimeMode::Coarse,
            sites: vec![
                Site {
                    id: 0,
                    vaddr: 0x1130,
                    file_off: 0x1130,
                    name: "main".into(),
                    kind: SiteKind::FunctionEntry,
                    mode: SiteMode::Inline,
                    nargs: 0,
                },
                Site {
                    id: 1,
                    vaddr: 0x1200,
                    file_off: 0x1200,
                    name: "f".into(),
                    kind: SiteKind::FunctionExit,
                    mode: SiteMode::Uprobe,
                    nargs: 0,
                },
                Site {
                    id: 2,
                    vaddr: 0x1300,
                    file_off: 0x1300,
                    name: "fx:probe".into(),
                    kind: SiteKind::Usdt,
                    mode: SiteMode::Inline,
                    nargs: 5,
                },
            ],
            semaphores: vec![Semaphore {
                anchor_file_off: 0x8010,
                semaphore_file_off: 0x3000,
            }],
            operands: Vec::new(),
        };
        let note = m.to_note();
        assert_eq!(Metadata::from_note_section(&note).unwrap().unwrap(), m);
        let bytes = m.to_bytes();
        for cut in [0, 11, 100, bytes.len() - 1] {
            assert!(Metadata::parse(&bytes[..cut]).is_err());
        }

        // With an operand table: it round-trips, and a cut inside it is an error.
        use crate::operand::*;
        let mut usdt = OperandSet {
            count: 3,
            ..Default::default()
        };
        usdt.ops[0] = Operand {
            kind: OP_REG,
            base: 7,
            index: REG_NONE,
            size: 4,
            flags: OPF_SIGNED,
            ..Default::default()
        };
        usdt.ops[1] = Operand {
            kind: OP_LOAD,
            base: X86_REG_PC,
            index: REG_NONE,
            size: 8,
            disp: -0x1234,
            ..Default::default()
        };
        usdt.ops[2] = Operand {
            kind: OP_IMM,
            disp: -5,
            ..Default::default()
        };
        let mut mem = OperandSet {
            count: 1,
            flags: crate::FLAG_MEM_READ | 8 << crate::FLAG_MEM_SIZE_SHIFT,
            ..Default::default()
        };
        mem.ops[0] = Operand {
            kind: OP_ADDR,
            base: 3,
            index: 1,
            shift: 3,
            flags: OPF_TP,
            disp: 0x10,
            ..Default::default()
        };
        let with = Metadata {
            operands: vec![
                SiteOperands { site: 1, set: mem },
                SiteOperands { site: 2, set: usdt },
            ],
            ..m.clone()
        };
        let bytes = with.to_bytes();
        assert_eq!(bytes.len(), m.to_bytes().len() + 4 + 12 + 16 + 12 + 3 * 16);
        assert_eq!(Metadata::parse(&bytes).unwrap(), with);
        let note = with.to_note();
        assert_eq!(Metadata::from_note_section(&note).unwrap().unwrap(), with);
        for cut in [m.to_bytes().len() + 2, bytes.len() - 1] {
            assert_eq!(
                Metadata::parse(&bytes[..cut]),
                Err(MetaError::Truncated("operands"))
            );
        }
        let mut bad = bytes.clone();
        bad[m.to_bytes().len() + 4 + 8] = 13;
        assert_eq!(Metadata::parse(&bad), Err(MetaError::BadOperands(0)));
    }

    #[test]
    fn reasons_roundtrip_and_older_metadata() {
        // At most one reason per site: three uprobe sites and an untraced one.
        let m = Metadata {
            sites: (3..7)
                .map(|id| Site {
                    id,
                    vaddr: 0x1000 + u64::from(id),
                    file_off: 0x1000 + u64::from(id),
                    name: format!("f{id}"),
                    kind: SiteKind::FunctionEntry,
                    mode: if id == 6 {
                        SiteMode::Untraced
                    } else {
                        SiteMode::Uprobe
                    },
                    nargs: 0,
                })
                .collect(),
            ..Default::default()
        };
        let reasons = vec![
            SiteReason {
                site: 3,
                reason: FallbackReason::BranchTargetInside { target: 0x1234 },
            },
            SiteReason {
                site: 4,
                reason: FallbackReason::Detail("call at 0x10: operand not re-created".into()),
            },
            SiteReason {
                site: 5,
                reason: FallbackReason::Forced,
            },
            SiteReason {
                site: 6,
                reason: FallbackReason::ExclusiveSequence { at: 0x1004 },
            },
        ];
        let bytes = m.to_bytes_with(&reasons);
        assert_eq!(Metadata::parse(&bytes).unwrap(), m);
        assert_eq!(Metadata::reasons(&bytes).unwrap(), reasons);
        assert_eq!(Metadata::reasons(&m.to_bytes()).unwrap(), vec![]);
        assert_eq!(m.to_bytes_with(&[]), m.to_bytes());
        assert_eq!(
            reasons[0].reason.to_string(),
            "branch target 0x1234 inside the displaced bytes"
        );
        assert_eq!(
            FallbackReason::from_parts(999, 0, ""),
            FallbackReason::Unknown
        );
    }

    /// The note of issue 28 row 5, small: every site names the one long name. Before,
    /// parsing materialised it once per site (64 K sites × 2 MiB: ~128 GiB).
    pub(crate) fn shared_name_note(nsites: usize, name_len: usize) -> Vec<u8> {
        let m = Metadata {
            sites: vec![
                Site {
                    id: 0,
                    vaddr: 0x1000,
                    file_off: 0x1000,
                    name: "x".repeat(name_len),
                    kind: SiteKind::FunctionEntry,
                    mode: SiteMode::Inline,
                    nargs: 0,
                };
                nsites
            ],
            ..Default::default()
        };
        let mut b = m.to_bytes();
        // Every name offset → 0, and the string table cut to the one name.
        for i in 0..nsites {
            let o = HEADER_LEN + i * SITE_LEN + 20;
            b[o..o + 4].copy_from_slice(&0u32.to_le_bytes());
        }
        let strtab = name_len + 1;
        b[28..32].copy_from_slice(&(strtab as u32).to_le_bytes());
        b.truncate((HEADER_LEN + nsites * SITE_LEN + strtab).div_ceil(4) * 4);
        b
    }

    #[test]
    fn names_sharing_bytes_are_refused_not_multiplied() {
        let b = shared_name_note(64, 4096);
        assert_eq!(
            Metadata::parse(&b),
            Err(MetaError::TooLarge(TooLarge::Names {
                bytes: 2 * 4097,
                strtab: 4097
            }))
        );
        assert!(
            Metadata::parse(&b)
                .unwrap_err()
                .to_string()
                .contains("note too large")
        );
        // One site using the name once is fine.
        assert_eq!(
            Metadata::parse(&shared_name_note(1, 4096))
                .unwrap()
                .sites
                .len(),
            1
        );
    }

    #[test]
    fn more_operand_sets_or_reasons_than_sites_are_refused() {
        let m = Metadata::default();
        let mut b = m.to_bytes();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&[0u8; 12]);
        assert_eq!(
            Metadata::parse(&b),
            Err(MetaError::TooLarge(TooLarge::PerSite {
                what: "operand sets",
                count: 1,
                sites: 0
            }))
        );
        let mut r = m.to_bytes();
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(
            Metadata::reasons(&r),
            Err(MetaError::TooLarge(TooLarge::PerSite { count: 1000, .. }))
        ));
    }

    /// Every past finding of the `utrace_note` fuzz target (`fuzz/findings/utrace_note`):
    /// a clear error, or metadata that reads back the same.
    #[test]
    fn fuzz_findings_are_errors_or_round_trip() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/findings/utrace_note");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("the findings directory") {
            let data = std::fs::read(e.unwrap().path()).unwrap();
            match Metadata::from_note_section(&data) {
                Some(Ok(m)) => {
                    let back = Metadata::from_note_section(&m.to_note()).unwrap().unwrap();
                    assert_eq!(back, m);
                }
                Some(Err(e)) => assert!(!e.to_string().is_empty()),
                None => {}
            }
            n += 1;
        }
        assert!(n > 0, "no findings in {}", dir.display());
    }
}
