//! What the tracer knows about well-known USDT probes: which arguments are strings
//! (the drains read them while the process lives: `tracer-ebpf/src/strings.rs`), and
//! which probes open and close a call of the interpreted program, so that readers
//! show its functions (`read/lang.rs`). A layer below `record` (which tells the drains)
//! and `read` (which names the calls). E.g. `known("python:function__entry")` says its
//! arguments 1 and 2 are strings (file name, function name) and that it begins a call.

/// A USDT probe the tracer knows, by its site name (`provider:name`).
pub(crate) struct KnownProbe {
    pub site: &'static str,
    /// Bit i: argument i + 1 points at a NUL-terminated string.
    pub strings: u64,
    /// The probe begins or ends a call of the interpreted program.
    pub call: Option<CallProbe>,
}

/// Which arguments of a call probe say what is called (1-based argument numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallProbe {
    pub entry: bool,
    pub file: u8,
    pub function: u8,
    pub line: u8,
}

/// CPython's probes (`Include/pydtrace.d`; Debian's python3.11 has them):
/// `function__entry`/`function__return(filename, funcname, lineno)`, `line` likewise,
/// `import__find__load__start(modulename)`, `…__done(modulename, found)`,
/// `audit(event, args)`.
const KNOWN: &[KnownProbe] = &[
    KnownProbe {
        site: "python:function__entry",
        strings: 0b11,
        call: Some(CallProbe {
            entry: true,
            file: 1,
            function: 2,
            line: 3,
        }),
    },
    KnownProbe {
        site: "python:function__return",
        strings: 0b11,
        call: Some(CallProbe {
            entry: false,
            file: 1,
            function: 2,
            line: 3,
        }),
    },
    KnownProbe {
        site: "python:line",
        strings: 0b11,
        call: None,
    },
    KnownProbe {
        site: "python:import__find__load__start",
        strings: 0b1,
        call: None,
    },
    KnownProbe {
        site: "python:import__find__load__done",
        strings: 0b1,
        call: None,
    },
    KnownProbe {
        site: "python:audit",
        strings: 0b1,
        call: None,
    },
];

/// The known probe of a USDT site named `provider:name`.
pub(crate) fn known(site: &str) -> Option<&'static KnownProbe> {
    KNOWN.iter().find(|p| p.site == site)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_calls_name_file_function_line() {
        let r = known("python:function__return").unwrap();
        assert_eq!(
            r.call.map(|c| (c.entry, c.file, c.function, c.line)),
            Some((false, 1, 2, 3))
        );
        assert!(known("python:nothing").is_none());
        assert!(known("function__entry").is_none());
    }
}
