//! Where calls into other objects go: the dynamic relocations name the symbol that each
//! GOT slot is bound to (`JUMP_SLOT`, `GLOB_DAT`, or a plain address in data), and the
//! ISA maps each PLT entry to its slot (`Isa::plt_slots`). Site selection asks this for
//! the calls that unwinding lands after or leaves by (`setjmp`, `_Unwind_Resume`).

use std::collections::HashMap;

use object::read::elf::ElfFile64;
use object::{LittleEndian, Object, ObjectSymbol, ObjectSymbolTable, RelocationTarget};

use crate::elf::read::Input;

/// GOT slot (or data word) address → the symbol the dynamic linker writes there.
/// Empty for a static binary, or when the dynamic tables cannot be read (then no call
/// through them is named: a site not found, never a wrong one).
pub(crate) fn slot_symbols(input: &Input) -> HashMap<u64, String> {
    let mut out = HashMap::new();
    let Ok(file) = ElfFile64::<LittleEndian>::parse(input.data) else {
        return out;
    };
    let (Some(relocs), Some(symtab)) = (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return out;
    };
    for (at, r) in relocs {
        let RelocationTarget::Symbol(i) = r.target() else {
            continue;
        };
        if let Some(name) = symtab.symbol_by_index(i).ok().and_then(|s| s.name().ok())
            && !name.is_empty()
        {
            out.insert(at, name.to_string());
        }
    }
    out
}

/// The name a call at `target` goes by: the function symbol there, or the imported
/// symbol of the PLT entry or GOT slot it goes through.
pub(crate) struct Callees {
    names: HashMap<u64, String>,
}

impl Callees {
    /// `plt`: (entry, GOT slot) of every PLT entry (`Isa::plt_slots`).
    pub(crate) fn new(input: &Input, plt: &[(u64, u64)]) -> Callees {
        let slots = slot_symbols(input);
        let mut names: HashMap<u64, String> = HashMap::new();
        for f in &input.functions {
            if let Some(n) = f.names.first() {
                names.entry(f.addr).or_insert_with(|| n.clone());
            }
        }
        for &(entry, slot) in plt {
            if let Some(n) = slots.get(&slot) {
                names.insert(entry, n.clone());
            }
        }
        names.extend(slots);
        Callees { names }
    }

    /// The name of what a call to (or through) `addr` calls.
    pub(crate) fn name(&self, addr: u64) -> Option<&str> {
        self.names.get(&addr).map(String::as_str)
    }
}
