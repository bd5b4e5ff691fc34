//! Builds the eBPF object (crate `tracer-ebpf`, target bpfel-unknown-none, nightly
//! toolchain, bpf-linker on PATH) into OUT_DIR/tracer-ebpf, where `src/session.rs`
//! embeds it.
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{manifest_dir} has no parent"))?
        .join("tracer-ebpf");
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom("nightly"),
    )
}
