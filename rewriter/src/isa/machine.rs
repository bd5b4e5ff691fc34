//! The instruction sets with a backend, by ELF `e_machine`: the only place that tells
//! ISAs apart by their ELF number. A leaf module, so that `elf::read` can refuse other
//! machines first (as its checks go) without importing the backends.

use object::elf;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Machine {
    X86_64,
    Aarch64,
}

impl Machine {
    /// The backend's instruction set for `e_machine`, or None when there is none.
    pub(crate) fn of(e_machine: u16) -> Option<Machine> {
        match e_machine {
            elf::EM_X86_64 => Some(Machine::X86_64),
            elf::EM_AARCH64 => Some(Machine::Aarch64),
            _ => None,
        }
    }
}
