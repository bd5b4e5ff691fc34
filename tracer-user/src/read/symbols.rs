//! Code addresses → function, file and line, with inlined frames (DWARF through
//! addr2line), names demangled (C++ and Rust); debug files found by
//! [`crate::debuginfo`]. Each binary is loaded once and each address resolved once.

use std::{borrow::Cow, collections::HashMap, path::PathBuf, rc::Rc};

use object::Object;
use serde::Serialize;

use crate::debuginfo::{DebugSource, cache_dir, locate, map_regular};

/// One frame at a code address: the innermost (possibly inlined) function first.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Frame {
    pub function: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Inlined into the next frame.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

impl Frame {
    /// `file:line` (file name only), or "" when unknown.
    pub(crate) fn location(&self) -> String {
        match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{}:{l}", short(f)),
            (Some(f), None) => short(f).to_string(),
            _ => String::new(),
        }
    }
}

fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Demangle a C++ or Rust symbol name (others unchanged).
pub(crate) fn demangle(name: &str) -> Cow<'_, str> {
    present::demangle(name).map_or(Cow::Borrowed(name), Cow::Owned)
}

struct Loaded {
    loader: addr2line::Loader,
    source: DebugSource,
    /// Read from the same (build-id checked) file as the DWARF.
    layout: Layout,
}

/// Resolves code addresses of the binaries of one trace.
pub(crate) struct Symbolizer {
    dirs: Vec<PathBuf>,
    cache: Option<PathBuf>,
    binaries: HashMap<u64, Option<Rc<Loaded>>>,
    /// Where each binary (by binary id) is and which build-id it was recorded with.
    known: HashMap<u64, (PathBuf, Vec<u8>)>,
    memo: HashMap<(u64, u64), Rc<[Frame]>>,
}

/// What the ELF headers and symbol table of a binary say.
#[derive(Default)]
struct Layout {
    /// `ET_EXEC`: loaded at its link-time addresses.
    fixed: bool,
    /// File addresses of its code (executable `PT_LOAD`s).
    code: Vec<(u64, u64)>,
    /// Function symbols: (start, end, name), sorted; a symbol of size 0 covers only
    /// its address.
    functions: Vec<(u64, u64, String)>,
}

impl Layout {
    fn function_at(&self, vaddr: u64) -> Option<&str> {
        let i = self.functions.partition_point(|f| f.0 <= vaddr);
        // Symbols starting at or below vaddr, nearest first: the first that covers it
        // (a few: symbols nest only as aliases and local labels).
        self.functions[..i]
            .iter()
            .rev()
            .take(64)
            .find(|f| vaddr < f.1 || f.0 == vaddr)
            .map(|f| f.2.as_str())
    }
}

fn read_layout(data: &[u8]) -> Option<Layout> {
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::{ObjectSymbol, SymbolKind};
    let h = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let e = h.endian().ok()?;
    let code = h
        .program_headers(e, data)
        .ok()?
        .iter()
        .filter(|p| p.p_type(e) == object::elf::PT_LOAD && p.p_flags(e) & object::elf::PF_X != 0)
        .filter_map(|p| Some((p.p_vaddr(e), p.p_vaddr(e).checked_add(p.p_memsz(e))?)))
        .collect();
    let obj = object::File::parse(data).ok()?;
    let mut functions: Vec<(u64, u64, String)> = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter_map(|s| {
            let end = s.address().checked_add(s.size())?;
            Some((s.address(), end, s.name().ok()?.to_string()))
        })
        .collect();
    functions.sort();
    functions.dedup();
    Some(Layout {
        fixed: h.e_type(e) == object::elf::ET_EXEC,
        code,
        functions,
    })
}

impl Symbolizer {
    /// `dirs`: extra debug directories (`--debug-dir`), searched before
    /// `/usr/lib/debug`.
    pub(crate) fn new(dirs: &[PathBuf]) -> Symbolizer {
        Symbolizer {
            dirs: dirs.to_vec(),
            cache: cache_dir(),
            binaries: HashMap::new(),
            known: HashMap::new(),
            memo: HashMap::new(),
        }
    }

    pub(crate) fn add_binary(&mut self, binary_id: u64, path: &str, build_id: &[u8]) {
        self.known
            .insert(binary_id, (PathBuf::from(path), build_id.to_vec()));
    }

    /// Whether `binary_id` loads at its link-time addresses (ELF `ET_EXEC`: bias 0).
    pub(crate) fn fixed_address(&mut self, binary_id: u64) -> bool {
        self.loaded(binary_id).is_some_and(|l| l.layout.fixed)
    }

    /// Whether file address `vaddr` is in `binary_id`'s code.
    pub(crate) fn is_code(&mut self, binary_id: u64, vaddr: u64) -> bool {
        self.loaded(binary_id).is_some_and(|l| {
            l.layout
                .code
                .iter()
                .any(|&(lo, hi)| (lo..hi).contains(&vaddr))
        })
    }

    /// Where the debug information of `binary_id` comes from (None: nothing usable).
    pub(crate) fn source(&mut self, binary_id: u64) -> Option<DebugSource> {
        self.loaded(binary_id).map(|l| l.source.clone())
    }

    fn loaded(&mut self, binary_id: u64) -> Option<Rc<Loaded>> {
        if let Some(l) = self.binaries.get(&binary_id) {
            return l.clone();
        }
        let l = self.known.get(&binary_id).and_then(|(path, build_id)| {
            let found = locate(path, build_id, self.cache.as_deref(), &self.dirs);
            let (file, how) = found?;
            let layout = map_regular(&file)
                .and_then(|m| read_layout(&m))
                .unwrap_or_default();
            match addr2line::Loader::new(&file) {
                Ok(loader) => {
                    log::debug!(
                        "{}: debug info from {} ({how})",
                        path.display(),
                        file.display()
                    );
                    Some(Rc::new(Loaded {
                        loader,
                        source: DebugSource {
                            path: file.to_string_lossy().into_owned(),
                            how,
                        },
                        layout,
                    }))
                }
                Err(e) => {
                    log::warn!("{}: cannot read {}: {e}", path.display(), file.display());
                    None
                }
            }
        });
        self.binaries.insert(binary_id, l.clone());
        l
    }

    /// The frames at file address `vaddr` of `binary_id`, innermost first; empty when
    /// nothing is known about it.
    pub(crate) fn frames(&mut self, binary_id: u64, vaddr: u64) -> Rc<[Frame]> {
        if let Some(f) = self.memo.get(&(binary_id, vaddr)) {
            return f.clone();
        }
        let frames: Rc<[Frame]> = match self.loaded(binary_id) {
            // No code lies there (a corrupt site table); addr2line would overflow.
            _ if vaddr >= tracer_common::USER_END => Rc::from([]),
            Some(l) => resolve(&l.loader, &l.layout, vaddr).into(),
            None => Rc::from([]),
        };
        self.memo.insert((binary_id, vaddr), frames.clone());
        frames
    }
}

fn resolve(loader: &addr2line::Loader, layout: &Layout, vaddr: u64) -> Vec<Frame> {
    let mut out = Vec::new();
    if let Ok(mut it) = loader.find_frames(vaddr) {
        while let Ok(Some(f)) = it.next() {
            let function = f
                .function
                .as_ref()
                .and_then(|n| n.demangle().ok())
                .map(|n| n.into_owned());
            let (file, line) = f
                .location
                .map_or((None, None), |l| (l.file.map(str::to_string), l.line));
            out.push(Frame {
                function: function.unwrap_or_default(),
                file,
                line,
                inlined: true,
            });
        }
    }
    if let Some(last) = out.last_mut() {
        last.inlined = false;
    }
    // No DWARF function (or no DWARF): the symbol that covers the address (by its
    // size: the nearest one below may be another function's) names the function.
    if (out.is_empty() || out.iter().all(|f| f.function.is_empty()))
        && let Some(name) = layout.function_at(vaddr)
    {
        let name = demangle(name).into_owned();
        match out.last_mut() {
            Some(last) => last.function = name,
            None => out.push(Frame {
                function: name,
                file: None,
                line: None,
                inlined: false,
            }),
        }
    }
    out
}

/// "function (file:line)" of the outermost frame, with the inlined ones inside it:
/// "inner (a.c:3) inlined in outer (b.c:9)".
pub(crate) fn describe(frames: &[Frame]) -> String {
    let one = |f: &Frame| {
        let loc = f.location();
        if loc.is_empty() {
            f.function.clone()
        } else {
            format!("{} ({loc})", f.function)
        }
    };
    frames
        .iter()
        .map(one)
        .collect::<Vec<_>>()
        .join(" inlined in ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_cover_their_size_only() {
        let l = Layout {
            functions: vec![
                (0x10, 0x20, "f".into()),
                (0x30, 0x30, "marker".into()),
                (0x40, 0x80, "g".into()),
                (0x40, 0x44, "g_alias".into()),
            ],
            ..Layout::default()
        };
        assert_eq!(l.function_at(0x18), Some("f"));
        assert_eq!(l.function_at(0x20), None, "past f's end");
        assert_eq!(l.function_at(0x30), Some("marker"));
        assert_eq!(l.function_at(0x31), None);
        assert_eq!(l.function_at(0x50), Some("g"));
        assert_eq!(l.function_at(0x8), None);
    }

    #[test]
    fn demangles_cpp_and_rust() {
        assert_eq!(demangle("_ZN2ns6Widget4stepEi"), "ns::Widget::step(int)");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("main"), "main");
    }
}
