//! Every input the fuzzer found a failure with (`fuzz/findings/rewrite_elf/`, one file
//! each, named for the bug) now gives a clear error, or a rewritten binary that the
//! rewriter then refuses as already rewritten; never a panic.

use rewriter::{Error, Options, SiteKind, elf::read::Input};

#[test]
fn fuzz_findings_are_clear_errors_or_valid_outputs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/findings/rewrite_elf");
    let opts = Options {
        kinds: SiteKind::ALL.to_vec(),
        ..Options::default()
    };
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the findings directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        match rewriter::rewrite("finding", &data, &opts) {
            Ok((out, _)) => assert!(
                matches!(Input::parse("out", &out), Err(Error::AlreadyRewritten(..))),
                "{}: its output is not refused as rewritten",
                path.display()
            ),
            Err(e) => assert!(
                e.to_string().starts_with("finding:"),
                "{}: {e}",
                path.display()
            ),
        }
        n += 1;
    }
    assert!(n >= 3);
}
