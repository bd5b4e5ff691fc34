//! `cargo run --release -p rewriter --example flow -- FILE... [-v]`: run the control-flow
//! recovery over binaries and print what it found and how long it took.

use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let verbose = args.iter().any(|a| a == "-v");
    for path in args.iter().filter(|a| *a != "-v") {
        let data = std::fs::read(path)?;
        let input = rewriter::elf::read::Input::parse(path, &data)?;
        let t = Instant::now();
        let flow = rewriter::recover_flow(&input)?;
        let dt = t.elapsed();
        let bounded = flow.tables.iter().filter(|t| t.bounded).count();
        println!(
            "{path}: {} MB, {:.3} s: {} tables ({bounded} bounded), {} targets, \
             {} unresolved indirect jumps, {} landing pads, {} FDEs, {} warnings",
            data.len() >> 20,
            dt.as_secs_f64(),
            flow.tables.len(),
            flow.jump_table_targets.len(),
            flow.unresolved_indirect_jumps.len(),
            flow.landing_pads.len(),
            flow.fde_functions.len(),
            flow.warnings.len(),
        );
        if verbose {
            for t in &flow.tables {
                println!(
                    "  table {:#x} x{} dispatch {:#x} bounded {} targets {:x?}",
                    t.table, t.entry_size, t.dispatch, t.bounded, t.targets
                );
            }
            for u in &flow.unresolved_indirect_jumps {
                println!("  unresolved {u:#x}");
            }
            for w in &flow.warnings {
                println!("  warning: {w}");
            }
        }
    }
    Ok(())
}
