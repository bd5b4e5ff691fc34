//! Trust boundaries of `TABLES` (issue 28, row 5), tried by a real unprivileged user
//! (`LocalUser::hostile`): the eBPF map of each process's RW areas (`MAX_PROCESSES`
//! entries), which the exit programs need to drain a thread's buffer when it exits.
//!
//! - One user's processes cannot take every entry: each uid holds at most
//!   `TABLES_PER_UID` (half), the tracer's seeds and the entries the eBPF side learns at
//!   flushes (and copies at fork) counted together, so another user's process started
//!   after still gets its entry and its records are delivered at its exit.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use tests::own_slot::build_rec_only;
use tests::*;
use tracer_common::ebpf::{MAX_PROCESSES, TABLES_PER_UID};

/// `traced` copied into a directory of `u`'s own, owned by `u`.
fn copy_for(tmp: &TempDir, u: &LocalUser, traced: &Path) -> PathBuf {
    let dir = tmp.join(&u.name);
    std::fs::create_dir_all(&dir).unwrap();
    open_to_all(&dir);
    u.own(&dir);
    let prog = dir.join("trust_tables");
    std::fs::copy(traced, &prog).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    u.own(&prog);
    prog
}

/// First value the victim records (its records are told apart by value).
const VICTIM_BASE: u64 = 0x7a9_0000_0000;
/// Records of the victim: fewer than a buffer (64), so only its exit drain delivers them.
const VICTIM_K: u64 = 10;

/// Row 5. Before: only the tracer's own seeds were counted per uid; the entries the
/// eBPF side learns at every flush (and copies at every fork) were not. The hostile
/// user's program forks `MAX_PROCESSES + 16` children that each record once (their
/// registration flush adds a `TABLES` entry) and then sleep: `TABLES` was full, and the
/// victim's program, started after, got no entry; its 10 records (fewer than a buffer,
/// left for its exit drain) were never drained: 0 of them in the trace. Now the eBPF
/// side charges every new entry to the process's uid (`TABLE_OWNERS`, `TABLE_UIDS`,
/// seeds included) and refuses past `TABLES_PER_UID`: the hostile user holds 2,048
/// entries, the victim's 10 records are in the trace exactly (against its own output),
/// and the summary counts the refused flushes.
#[test]
fn one_user_cannot_fill_tables() {
    let hostile = LocalUser::hostile();
    let victim = LocalUser::victim();
    let tmp = TempDir::new("trust_tables");
    open_to_all(tmp.path());
    let (traced, _, _) = build_rec_only(&tmp, "trust_tables", "64");
    let hog = copy_for(&tmp, &hostile, &traced);
    let prey = copy_for(&tmp, &victim, &traced);
    let trace = tmp.join("T");
    let mut session = system_wide_session(&trace);

    let n = MAX_PROCESSES as u64 + 16;
    let t0 = Instant::now();
    let mut h = hostile
        .command(&hog)
        .args(["hog", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let h_stdin = h.stdin.take().unwrap();
    let mut line = String::new();
    BufReader::new(h.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, format!("ready {n}\n"), "the hostile children");
    eprintln!("{n} hostile processes recorded in {:?}", t0.elapsed());

    let v = run(
        victim
            .command(&prey)
            .args(["victim", &VICTIM_K.to_string(), &VICTIM_BASE.to_string()]),
        RUN_TIMEOUT,
    );
    assert_eq!(v.code, Some(0), "{}", v.describe());
    let printed: Vec<u64> = v.stdout_str().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(printed.len() as u64, VICTIM_K, "{}", v.describe());

    drop(h_stdin);
    let hs = h.wait().unwrap();
    eprintln!("hostile processes ended after {:?}", t0.elapsed());
    run(
        Command::new("kill").args(["-INT", &session.id().to_string()]),
        RUN_TIMEOUT,
    )
    .ok();
    let st = session.wait().unwrap();
    let err = std::fs::read_to_string(trace.with_extension("err")).unwrap();
    assert!(hs.success(), "hostile: {hs}");
    assert!(st.success(), "session: {err}");

    let recs = dump(&trace);
    let got: Vec<u64> = recs
        .iter()
        .filter(|r| &*r.symbol == "rec" && r.value >= VICTIM_BASE)
        .map(|r| r.value)
        .collect();
    assert_eq!(got, printed, "the victim's records in the trace: {err}");
    let hostile_pids: std::collections::HashSet<u32> = recs
        .iter()
        .filter(|r| &*r.symbol == "rec" && r.value < n)
        .map(|r| r.pid)
        .collect();
    eprintln!(
        "hostile processes with records in the trace: {}",
        hostile_pids.len()
    );
    let refused = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("utrace: warning: ")?
                .split_once(" flushes of processes not drained at exit: their user's share")
                .map(|(k, _)| k.parse::<u64>().unwrap())
        })
        .unwrap_or_else(|| panic!("no refusal line in the summary: {err}"));
    // At least every child past the hostile user's share was refused (some of their
    // entries may be the tracer's seeds, counted in the same share).
    assert!(
        refused >= n - TABLES_PER_UID as u64,
        "{refused} refusals of {n} processes, share {TABLES_PER_UID}: {err}"
    );
    eprintln!("{err}");
}
