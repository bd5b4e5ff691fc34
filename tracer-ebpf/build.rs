//! Fails early, with a clear message, when `bpf-linker` (needed to link the eBPF object)
//! is missing, and relinks when it changes.
fn main() {
    // BPF global functions (see src/slots.rs): bpf-linker internalizes the rest.
    println!(
        "cargo::rustc-link-arg=--export=drain_slot_sleepable,drain_slot_atomic,emit_chunk_sleepable,emit_chunk_atomic,name_string,duration_step"
    );
    // aya-build passes --cfg bpf_target_arch="<host arch>" when it builds us.
    println!("cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\"))");
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => panic!("bpf-linker not found on PATH ({e}); install it with `cargo xtask setup`"),
    }
}
