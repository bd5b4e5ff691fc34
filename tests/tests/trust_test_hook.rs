//! Review item 10: the tracer's test pause (`UTRACE_TEST_PAUSE=POINT:PATH`) in a root
//! tracer run with a user's environment (`sudo -E`).
//!
//! Before: the tracer opened PATH with `File::open` and read it to the end, whatever it
//! was: `/dev/zero` made root read forever, and a FIFO of the hostile user's made it
//! wait for as long as that user kept the FIFO's writing end unopened (the session
//! never attached). Now PATH is opened `O_PATH`, `fstat`ed, and used only if it is a
//! FIFO owned by root; anything else is ignored with a warning and the session runs.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tests::*;

fn build(tmp: &TempDir) -> PathBuf {
    let (orig, traced) = (tmp.join("limits"), tmp.join("limits.traced"));
    compile("gcc", &[fixture("trust_limits.c")], &["-O2"], &orig);
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "rec".as_ref(),
    ])
    .ok();
    traced
}

#[test]
fn a_users_pause_path_is_ignored() {
    let tmp = TempDir::new("trust-test-hook");
    open_to_all(tmp.path());
    let prog = build(&tmp);
    let hostile = LocalUser::hostile();
    let dir = tmp.join("hostile");
    std::fs::create_dir(&dir).unwrap();
    hostile.own(&dir);
    let fifo = dir.join("fifo");
    let st = hostile.command("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());

    let _g = tracing_lock();
    for (i, path) in [fifo.clone(), PathBuf::from("/dev/zero")]
        .iter()
        .enumerate()
    {
        let trace = tmp.join(format!("T{i}"));
        let t0 = Instant::now();
        let o = run(
            Command::new(tracer_bin())
                .args(["record", "-o"])
                .arg(&trace)
                .arg("--")
                .arg(&prog)
                .args(["plain", "10"])
                .env("UTRACE_DEBUG_CACHE", "")
                .env("UTRACE_TEST_PAUSE", format!("parsed:{}", path.display())),
            Duration::from_secs(60),
        );
        let took = t0.elapsed();
        assert!(o.success(), "{}: {}", path.display(), o.describe());
        let warning = format!(
            "utrace: warning: UTRACE_TEST_PAUSE ignored: {} is not a FIFO owned by root",
            path.display()
        );
        assert!(
            o.stderr_str().lines().any(|l| l == warning),
            "{}",
            o.describe()
        );
        let values = dump(&trace).iter().filter(|r| &*r.symbol == "rec").count();
        assert_eq!(values, 10, "{}", o.describe());
        eprintln!("{}: {took:?}", path.display());
        assert!(took < Duration::from_secs(30), "{took:?}");
    }
}
