//! Every input the fuzzer found a failure with (`fuzz/findings/rewrite_elf/`, one file
//! each, named for the bug) now gives a clear error and no panic.

use rewriter::{Options, SiteKind};

#[test]
fn fuzz_findings_are_clear_errors() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/findings/rewrite_elf");
    let opts = Options {
        kinds: SiteKind::ALL.to_vec(),
        ..Options::default()
    };
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the findings directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let e = rewriter::rewrite("finding", &data, &opts)
            .err()
            .unwrap_or_else(|| panic!("{} rewrote", path.display()));
        assert!(
            e.to_string().starts_with("finding:"),
            "{}: {e}",
            path.display()
        );
        n += 1;
    }
    assert!(n >= 1);
}
