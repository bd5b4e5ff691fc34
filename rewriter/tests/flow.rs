//! Control-flow recovery (`rewriter::flow`) against an independent oracle: the
//! compiler's own assembly. Each fixture is compiled to `.s`, assembled with local
//! labels kept (`-Wa,-L`), linked; the jump tables (label + `.long/.quad/.byte` of
//! label expressions) and LSDA call-site tables of the `.s` are resolved through the
//! symbol table and must equal what `recover` finds in the fixture's functions. Every
//! target and pad must also start an instruction in `objdump -d`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object as _, ObjectSymbol as _};
use rewriter::elf::read::Input;
use rewriter::flow::Flow;
use rewriter::recover_flow as recover;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Whether `tool` runs; if not, the test fails unless the run allows it to skip
/// (`tests::skip`).
fn have(tool: &str) -> bool {
    tests::skip::require(tool, tests::skip::runs(tool), "rewriter flow test")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Build {
    asm: String,
    bin: PathBuf,
    objdump: &'static str,
}

/// `cc flags -S src`, then assemble that `.s` keeping local labels, then link.
fn build(cc: &str, src: &str, tag: &str, cflags: &[&str], ldflags: &[&str]) -> Build {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flow");
    std::fs::create_dir_all(&dir).unwrap();
    let s = dir.join(format!("{tag}.s"));
    let o = dir.join(format!("{tag}.o"));
    let bin = dir.join(tag);
    run(Command::new(cc)
        .args(cflags)
        .arg("-S")
        .arg(fixture(src))
        .arg("-o")
        .arg(&s));
    run(Command::new(cc)
        .args(cflags)
        .args(["-c", "-Wa,-L"])
        .arg(&s)
        .arg("-o")
        .arg(&o));
    // The AArch64 linker drops `.L` symbols unless told not to.
    run(Command::new(cc)
        .args(ldflags)
        .arg("-Wl,--discard-none")
        .arg(&o)
        .arg("-o")
        .arg(&bin));
    Build {
        asm: std::fs::read_to_string(&s).unwrap(),
        bin,
        objdump: if cc.starts_with("aarch64") {
            "aarch64-linux-gnu-objdump"
        } else {
            "objdump"
        },
    }
}

/// Every symbol name (including kept `.L` labels) → address; names defined twice are
/// dropped (not ours to resolve). Plus function ranges by name.
struct Syms {
    addr: HashMap<String, Option<u64>>,
    funcs: HashMap<String, (u64, u64)>,
}

fn symbols(data: &[u8]) -> Syms {
    let file = object::File::parse(data).unwrap();
    let mut addr: HashMap<String, Option<u64>> = HashMap::new();
    let mut funcs = HashMap::new();
    for s in file.symbols() {
        let Ok(n) = s.name() else { continue };
        if n.is_empty() || s.is_undefined() {
            continue;
        }
        addr.entry(n.to_string())
            .and_modify(|a| *a = None)
            .or_insert(Some(s.address()));
        if s.kind() == object::SymbolKind::Text && s.size() != 0 {
            funcs.insert(n.to_string(), (s.address(), s.address() + s.size()));
        }
    }
    Syms { addr, funcs }
}

impl Syms {
    fn get(&self, label: &str) -> u64 {
        self.addr
            .get(label)
            .copied()
            .flatten()
            .unwrap_or_else(|| panic!("label {label} not (uniquely) in the symbol table"))
    }
}

fn first_label(operand: &str) -> Option<&str> {
    let i = operand.find(".L")?;
    let rest = &operand[i..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Directive and operand of a data line, if it is one.
fn data_line(line: &str) -> Option<(&str, &str)> {
    let t = line.trim();
    let (d, op) = t.split_once(char::is_whitespace)?;
    matches!(
        d,
        ".long"
            | ".quad"
            | ".byte"
            | ".2byte"
            | ".short"
            | ".word"
            | ".4byte"
            | ".8byte"
            | ".uleb128"
    )
    .then_some((d, op.trim()))
}

fn label_def(line: &str) -> Option<&str> {
    let l = line.trim_end().strip_suffix(':')?;
    (l.starts_with(".L") && !l.contains(char::is_whitespace)).then_some(l)
}

/// Jump tables of a `.s`: a label followed by label-valued data lines.
fn asm_tables(asm: &str) -> Vec<(String, Vec<String>)> {
    let lines: Vec<&str> = asm.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(name) = label_def(l) else { continue };
        if name.starts_with(".LLSDA")
            || name.starts_with(".Lcst_")
            || name.starts_with(".Lexception")
        {
            continue;
        }
        let entries: Vec<String> = lines[i + 1..]
            .iter()
            .map_while(|l| data_line(l).filter(|(d, _)| *d != ".uleb128"))
            .map_while(|(_, op)| first_label(op).map(str::to_string))
            .collect();
        if !entries.is_empty() {
            out.push((name.to_string(), entries));
        }
    }
    out
}

/// Landing-pad labels of every LSDA call-site table of a `.s` (gcc: `.LLSDACSB*` to
/// `.LLSDACSE*`; clang: `.Lcst_begin*` to `.Lcst_end*`; 4 values per call site, the
/// third is the pad or 0).
fn asm_pads(asm: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut vals: Option<Vec<&str>> = None;
    for l in asm.lines() {
        match label_def(l) {
            Some(n) if n.starts_with(".LLSDACSB") || n.starts_with(".Lcst_begin") => {
                vals = Some(Vec::new());
                continue;
            }
            Some(n) if n.starts_with(".LLSDACSE") || n.starts_with(".Lcst_end") => {
                let v = vals.take().expect("call-site table end without begin");
                assert_eq!(v.len() % 4, 0, "call-site table of {} values", v.len());
                out.extend(
                    v.chunks(4)
                        .filter_map(|c| first_label(c[2]).map(str::to_string)),
                );
                continue;
            }
            _ => {}
        }
        if let (Some(v), Some((_, op))) = (vals.as_mut(), data_line(l)) {
            v.push(op);
        }
    }
    out
}

/// Functions the `.s` defines (`.type X, @function` / `%function`).
fn asm_functions(asm: &str) -> Vec<String> {
    asm.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix(".type")?;
            let (name, kind) = rest.split_once(',')?;
            kind.contains("function").then(|| name.trim().to_string())
        })
        .collect()
}

fn insn_starts(objdump: &str, bin: &Path) -> BTreeSet<u64> {
    let out = Command::new(objdump)
        .args(["-d", "--no-show-raw-insn"])
        .arg(bin)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (a, rest) = l.trim_start().split_once(":\t")?;
            (!rest.trim().is_empty()).then_some(())?;
            u64::from_str_radix(a, 16).ok()
        })
        .collect()
}

struct Checked {
    flow: Flow,
    ranges: Vec<(u64, u64)>,
    own: Vec<(u64, u64)>,
    starts: BTreeSet<u64>,
}

fn recover_checked(b: &Build) -> Checked {
    let data = std::fs::read(&b.bin).unwrap();
    let input = Input::parse(&b.bin.display().to_string(), &data).unwrap();
    let flow = recover(&input).unwrap_or_else(|e| panic!("{}: {e}", b.bin.display()));
    let syms = symbols(&data);
    let names = asm_functions(&b.asm);
    let ranges: Vec<(u64, u64)> = names
        .iter()
        .filter_map(|f| syms.funcs.get(f).copied())
        .collect();
    // The fixture's own functions (not compiler helpers like `__clang_call_terminate`).
    let own: Vec<(u64, u64)> = names
        .iter()
        .filter(|f| f.contains("eh_") || f.contains("sw_"))
        .filter_map(|f| syms.funcs.get(f).copied())
        .collect();
    assert!(
        !ranges.is_empty(),
        "{}: no fixture functions",
        b.bin.display()
    );
    Checked {
        flow,
        ranges,
        own,
        starts: insn_starts(b.objdump, &b.bin),
    }
}

impl Checked {
    fn ours(&self, a: u64) -> bool {
        self.ranges.iter().any(|r| r.0 <= a && a < r.1)
    }
}

fn check_switch(cc: &str, tag: &str, cflags: &[&str], ldflags: &[&str], expect_tables: bool) {
    let b = build(cc, "switch.c", tag, cflags, ldflags);
    let c = recover_checked(&b);
    let data = std::fs::read(&b.bin).unwrap();
    let syms = symbols(&data);
    let oracle: BTreeMap<u64, BTreeSet<u64>> = asm_tables(&b.asm)
        .into_iter()
        .map(|(t, e)| (syms.get(&t), e.iter().map(|l| syms.get(l)).collect()))
        .collect();
    let mut got: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for t in c.flow.tables.iter().filter(|t| c.ours(t.dispatch)) {
        got.entry(t.table).or_default().extend(&t.targets);
    }
    assert_eq!(
        got, oracle,
        "{tag}: recovered tables (left) vs the .s (right)"
    );
    if expect_tables {
        // AArch64 gcc uses tables only for the larger switches (case-values threshold).
        let min = if cc.starts_with("aarch64") { 1 } else { 8 };
        assert!(
            oracle.len() >= min,
            "{tag}: only {} tables in the .s",
            oracle.len()
        );
    } else {
        assert!(oracle.is_empty(), "{tag}: tables despite -fno-jump-tables");
    }
    for t in got.values().flatten() {
        assert!(
            c.ours(*t),
            "{tag}: target {t:#x} outside the fixture functions"
        );
        assert!(
            c.starts.contains(t),
            "{tag}: target {t:#x} is not an instruction start"
        );
    }
    let unresolved: Vec<_> = c
        .flow
        .unresolved_indirect_jumps
        .iter()
        .filter(|&&a| c.ours(a))
        .collect();
    assert!(unresolved.is_empty(), "{tag}: unresolved {unresolved:x?}");
}

fn check_eh(cc: &str, src: &str, tag: &str, cflags: &[&str], ldflags: &[&str]) {
    let b = build(cc, src, tag, cflags, ldflags);
    let c = recover_checked(&b);
    let data = std::fs::read(&b.bin).unwrap();
    let syms = symbols(&data);
    let oracle: BTreeSet<u64> = asm_pads(&b.asm).iter().map(|l| syms.get(l)).collect();
    let got: BTreeSet<u64> = c
        .flow
        .landing_pads
        .iter()
        .copied()
        .filter(|&p| c.ours(p))
        .collect();
    assert!(
        oracle.len() >= 3,
        "{tag}: only {} pads in the .s",
        oracle.len()
    );
    assert_eq!(
        got, oracle,
        "{tag}: recovered pads (left) vs the .s (right)"
    );
    for p in &got {
        assert!(
            c.starts.contains(p),
            "{tag}: pad {p:#x} is not an instruction start"
        );
    }
    // Every fixture function has an FDE.
    assert!(!c.own.is_empty());
    for &(s, e) in &c.own {
        assert!(
            c.flow
                .fde_functions
                .iter()
                .any(|&(fs, n)| fs == s && fs + n == e),
            "{tag}: no FDE for {s:#x}..{e:#x}"
        );
    }
}

const MODES: [(&str, &[&str], &[&str]); 4] = [
    ("pie", &["-fPIE"], &["-pie"]),
    ("nopie", &["-fno-pie"], &["-no-pie"]),
    ("static", &["-fno-pie"], &["-static"]),
    ("shared", &["-fPIC", "-DNO_MAIN"], &["-shared"]),
];

#[test]
fn switch_tables_x86_64() {
    for cc in ["gcc", "clang"] {
        if !have(cc) {
            continue;
        }
        for opt in ["-O0", "-O2", "-O3"] {
            for (mode, cf, lf) in MODES {
                let tag = format!("switch-{cc}{opt}-{mode}");
                let cflags: Vec<&str> = [opt].iter().chain(cf).copied().collect();
                check_switch(cc, &tag, &cflags, lf, true);
            }
        }
        let tag = format!("switch-{cc}-cet");
        check_switch(
            cc,
            &tag,
            &["-O2", "-fPIE", "-fcf-protection=full"],
            &["-pie"],
            true,
        );
        let tag = format!("switch-{cc}-nojt");
        check_switch(
            cc,
            &tag,
            &["-O2", "-fPIE", "-fno-jump-tables"],
            &["-pie"],
            false,
        );
    }
}

#[test]
fn switch_tables_aarch64() {
    let cc = "aarch64-linux-gnu-gcc";
    if !have(cc) {
        return;
    }
    for opt in ["-O2", "-O0"] {
        for (mode, cf, lf) in [MODES[0], MODES[2]] {
            let tag = format!("switch-a64{opt}-{mode}");
            let cflags: Vec<&str> = [opt].iter().chain(cf).copied().collect();
            check_switch(cc, &tag, &cflags, lf, true);
        }
    }
}

#[test]
fn landing_pads_x86_64() {
    for cc in ["g++", "clang++"] {
        if !have(cc) {
            continue;
        }
        for opt in ["-O0", "-O2"] {
            for (mode, cf, lf) in MODES {
                let tag = format!("eh-{cc}{opt}-{mode}");
                let cflags: Vec<&str> = [opt].iter().chain(cf).copied().collect();
                check_eh(cc, "eh.cpp", &tag, &cflags, lf);
            }
        }
    }
    check_eh(
        "gcc",
        "eh_cleanup.c",
        "ehc-gcc",
        &["-O2", "-fexceptions"],
        &[],
    );
}

/// No aarch64 C++ cross compiler here: C cleanups under `-fexceptions` give LSDAs.
#[test]
fn landing_pads_aarch64() {
    let cc = "aarch64-linux-gnu-gcc";
    if !have(cc) {
        return;
    }
    for (mode, cf, lf) in [MODES[0], MODES[2]] {
        let tag = format!("ehc-a64-{mode}");
        let cflags: Vec<&str> = ["-O2", "-fexceptions"].iter().chain(cf).copied().collect();
        check_eh(cc, "eh_cleanup.c", &tag, &cflags, lf);
    }
}

/// Garbage and truncations never panic.
#[test]
fn truncated_inputs_do_not_panic() {
    let b = build(
        "gcc",
        "switch.c",
        "switch-trunc",
        &["-O2", "-fPIE"],
        &["-pie"],
    );
    let data = std::fs::read(&b.bin).unwrap();
    let mut copy = data.clone();
    for (i, byte) in copy.iter_mut().enumerate().skip(64) {
        if i % 7 == 0 {
            *byte ^= 0x5a;
        }
    }
    for d in [&data[..data.len() / 2], &copy[..]] {
        if let Ok(input) = Input::parse("x", d) {
            let _ = recover(&input);
        }
    }
}

/// Addresses of the indirect jumps (`jmp *…`) in `objdump -d` of `bin` inside `ranges`.
fn indirect_jumps(objdump: &str, bin: &Path, ranges: &[(u64, u64)]) -> BTreeSet<u64> {
    let out = Command::new(objdump)
        .args(["-d", "--no-show-raw-insn"])
        .arg(bin)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (a, rest) = l.trim_start().split_once(":\t")?;
            let rest = rest.trim().trim_start_matches("notrack ");
            let indirect = rest.starts_with("jmp") && rest.contains('*');
            let a64 = rest.starts_with("br\t") || rest.starts_with("br ");
            (indirect || a64).then_some(())?;
            let a = u64::from_str_radix(a, 16).ok()?;
            ranges.iter().any(|r| r.0 <= a && a < r.1).then_some(a)
        })
        .collect()
}

/// Every indirect jump of the `tc_*` functions is a tail call or (`tc_switch`) a
/// jump-table dispatch, none is unresolved.
fn check_tail_calls(cc: &str, tag: &str, cflags: &[&str], ldflags: &[&str], min: usize) {
    let b = build(cc, "tailcall.c", tag, cflags, ldflags);
    let c = recover_checked(&b);
    let data = std::fs::read(&b.bin).unwrap();
    let syms = symbols(&data);
    let tc: Vec<(u64, u64)> = syms
        .funcs
        .iter()
        .filter(|(n, _)| n.starts_with("tc_"))
        .map(|(_, &r)| r)
        .collect();
    let jumps = indirect_jumps(b.objdump, &b.bin, &tc);
    assert!(
        jumps.len() >= min,
        "{tag}: only {} indirect jumps in tc_*: {jumps:x?}",
        jumps.len()
    );
    let tails: BTreeSet<u64> = c.flow.tail_calls.iter().copied().collect();
    let dispatches: BTreeSet<u64> = c.flow.tables.iter().map(|t| t.dispatch).collect();
    let switch = syms.funcs["tc_switch"];
    assert!(
        dispatches.iter().any(|d| (switch.0..switch.1).contains(d)),
        "{tag}: no jump table in tc_switch"
    );
    for j in jumps.iter().filter(|j| !dispatches.contains(j)) {
        assert!(
            tails.contains(j),
            "{tag}: indirect jump {j:#x} is not classified as a tail call"
        );
        assert!(
            !c.flow.unresolved_indirect_jumps.contains(j),
            "{tag}: tail call {j:#x} also unresolved"
        );
    }
    assert!(c.flow.tables.iter().all(|t| !tails.contains(&t.dispatch)));
}

#[test]
fn tail_calls_x86_64() {
    for cc in ["gcc", "clang"] {
        if !have(cc) {
            continue;
        }
        for (mode, cf, lf) in MODES {
            let tag = format!("tail-{cc}-{mode}");
            let cflags: Vec<&str> = ["-O2"].iter().chain(cf).copied().collect();
            check_tail_calls(cc, &tag, &cflags, lf, 5);
            // Calls into the shared libc through its GOT slot, not a PLT stub.
            if mode != "static" {
                let tag = format!("tail-{cc}-{mode}-noplt");
                let cflags: Vec<&str> = ["-O2", "-fno-plt"].iter().chain(cf).copied().collect();
                check_tail_calls(cc, &tag, &cflags, lf, 6);
            }
        }
    }
}

/// A switch's dispatch is never a tail call (the switch fixture has no indirect tail
/// calls at all, in any mode).
#[test]
fn switch_dispatch_is_never_a_tail_call() {
    for cc in ["gcc", "clang"] {
        if !have(cc) {
            continue;
        }
        for opt in ["-O0", "-O2", "-O3"] {
            for (mode, cf, lf) in [MODES[0], MODES[1], MODES[3]] {
                let tag = format!("switch-tc-{cc}{opt}-{mode}");
                let cflags: Vec<&str> = [opt].iter().chain(cf).copied().collect();
                let b = build(cc, "switch.c", &tag, &cflags, lf);
                let c = recover_checked(&b);
                let ours: Vec<_> = c.flow.tail_calls.iter().filter(|&&a| c.ours(a)).collect();
                assert!(ours.is_empty(), "{tag}: tail calls {ours:x?} in sw_*");
            }
        }
    }
}

/// Computed gotos over one 256-entry label table (cgoto.c, the shape of CPython's
/// ceval): the dispatches indexed by a byte are bounded by it, the one indexed by a
/// wider value takes their table's size; every one is a table whose targets are the
/// five labels, none is unresolved. Non-PIE only: a PIE's table holds its addresses in
/// relocations, not in the file.
#[test]
fn computed_gotos_x86_64() {
    for cc in ["gcc", "clang"] {
        if !have(cc) {
            continue;
        }
        let tag = format!("cgoto-{cc}");
        let b = build(cc, "cgoto.c", &tag, &["-O2", "-fno-pie"], &["-no-pie"]);
        let data = std::fs::read(&b.bin).unwrap();
        let input = Input::parse(&b.bin.display().to_string(), &data).unwrap();
        let flow = recover(&input).unwrap();
        let run = symbols(&data).funcs["cg_run"];
        let jumps = indirect_jumps(b.objdump, &b.bin, &[run]);
        assert!(jumps.len() >= 2, "{tag}: indirect jumps {jumps:x?}");
        for j in &jumps {
            let t = flow.tables.iter().find(|t| t.dispatch == *j);
            let t = t.unwrap_or_else(|| panic!("{tag}: jump {j:#x} is not a table dispatch"));
            assert!(t.bounded, "{tag}: {j:#x} unbounded");
            assert!(
                t.targets.len() == 5 && t.targets.iter().all(|a| (run.0..run.1).contains(a)),
                "{tag}: {j:#x} targets {:x?}",
                t.targets
            );
            assert!(!flow.unresolved_indirect_jumps.contains(j), "{tag}: {j:#x}");
        }
    }
}

/// A table with no bound whose entries reach the function's `.cold` part before its
/// last ones (coldtable.c): every label is a target, the one after the `.cold` entry
/// included.
#[test]
fn unbounded_table_through_a_cold_part() {
    if !have("gcc") {
        return;
    }
    let b = build("gcc", "coldtable.c", "coldtable", &["-O2"], &[]);
    let data = std::fs::read(&b.bin).unwrap();
    let input = Input::parse(&b.bin.display().to_string(), &data).unwrap();
    let flow = recover(&input).unwrap();
    let syms = symbols(&data);
    let label = |l: &str| syms.get(l);
    let t = flow
        .tables
        .iter()
        .find(|t| t.table == label(".Lct_table"))
        .unwrap_or_else(|| panic!("no table at .Lct_table: {:x?}", flow.tables));
    for l in [".Lct_0", ".Lct_1", ".Lct_2"] {
        assert!(
            t.targets.contains(&label(l)),
            "{l} missing: {:x?}",
            t.targets
        );
    }
    // A first entry in the `.cold` part.
    let t = flow
        .tables
        .iter()
        .find(|t| t.table == label(".Lcf_table"))
        .unwrap_or_else(|| panic!("no table at .Lcf_table: {:x?}", flow.tables));
    for l in [".Lcf_0", ".Lcf_1", ".Lcf_2"] {
        assert!(
            t.targets.contains(&label(l)),
            "{l} missing: {:x?}",
            t.targets
        );
    }
    // Function starts only: a jump through function pointers, not a table.
    let jump = syms.funcs["ct_jump"];
    assert!(
        !flow
            .tables
            .iter()
            .any(|t| (jump.0..jump.1).contains(&t.dispatch)),
        "ct_jump taken for a table dispatch: {:x?}",
        flow.tables
    );
    assert!(
        flow.unresolved_indirect_jumps
            .iter()
            .any(|j| (jump.0..jump.1).contains(j)),
        "ct_jump's jump is not unresolved"
    );
}

/// Indirect tail calls the data flow must see through (spilltail.c): a pointer spilled
/// across a call in a private frame, and a split-off part's call by its CFI; a frame
/// whose address went to the callee keeps its reload unknown.
#[test]
fn tail_calls_through_spills_and_parts() {
    let b = build("gcc", "spilltail.c", "spilltail", &["-O2"], &[]);
    let c = recover_checked(&b);
    let data = std::fs::read(&b.bin).unwrap();
    let syms = symbols(&data);
    for l in [".Lst_spill_jump", ".Lst_part_jump"] {
        let j = syms.get(l);
        assert!(
            c.flow.tail_calls.contains(&j),
            "{l} ({j:#x}) is not a tail call"
        );
        assert!(!c.flow.unresolved_indirect_jumps.contains(&j), "{l}");
    }
    let j = syms.get(".Lst_escape_jump");
    assert!(
        !c.flow.tail_calls.contains(&j),
        "st_escape's jump taken for a tail call"
    );
    assert!(
        c.flow.unresolved_indirect_jumps.contains(&j),
        "st_escape's jump"
    );
}
