//! Readable names of C++ and Rust symbols, so that globs (`shapes::*`) and reports
//! can use them.

/// The readable name of a C++ (Itanium ABI) or Rust (legacy or v0) symbol; None for
/// other names. Rust names without their hash; C++ names with their parameter types.
pub fn demangle(name: &str) -> Option<String> {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return Some(format!("{d:#}"));
    }
    if name.starts_with("_Z") {
        return cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|s| s.demangle(&Default::default()).ok());
    }
    None
}
