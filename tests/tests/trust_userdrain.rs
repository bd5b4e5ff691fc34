//! Issue 28, row 2: a traced program may not turn `sudo tracer record --user` against
//! another process.
//!
//! The attacker (`fixtures/trust_userdrain.c`, run by a root tracer as the
//! unprivileged `utrace-hostile` through `setpriv`) sends the drain socket messages
//! naming a victim: a sleeping program of `utrace-victim` holding 16 known records and,
//! at a known address, a slot that claims them for the attacker's thread.
//!
//! Against the old drain (it believed the header's pid): at the attacker's exit it read
//! the slot through the victim's pid (the address is unmapped in the attacker), put the
//! victim's 16 records into the trace (with the 2 sent in its name: 18 records of the
//! victim's pid), and wrote its 16-byte tombstone into the victim's memory (at
//! `VICTIM_PAGE + 0x800`); the slot of an unknown binary made it describe the victim's mappings, so the
//! victim's binary and its load bias landed in the trace.
//!
//! Now each message's pid must be its sender's (`SCM_CREDENTIALS`) and its thread one
//! the tracer holds seized: the trace holds none of the victim's values, no load bias of
//! the victim, the victim's page is byte for byte what it was, and the attacker's own
//! records are all there.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use tests::*;

const VICTIM_PAGE: u64 = 0x6f5e_0000_0000;
const SECRET_TAG: u64 = 0x5ec7;
const OWN_TAG: u64 = 0x0a77;
const OWN_N: u64 = 5;

/// The fixture compiled (`-D` `defines`) and rewritten (only `rec`, 64-record buffers).
fn build(tmp: &TempDir, name: &str, defines: &[&str]) -> PathBuf {
    let (orig, traced) = (tmp.join(name), tmp.join(format!("{name}.traced")));
    let mut flags = vec!["-O2"];
    flags.extend_from_slice(defines);
    compile("gcc", &[fixture("trust_userdrain.c")], &flags, &orig);
    rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "rec".as_ref(),
        "--buffer-records".as_ref(),
        "64".as_ref(),
    ])
    .ok();
    traced
}

fn read_line(r: &mut BufReader<ChildStdout>, what: &str) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    assert!(!l.is_empty(), "{what}: stdout closed");
    l.trim_end().to_string()
}

fn victim_page(pid: u32) -> Vec<u8> {
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, VICTIM_PAGE).unwrap();
    b
}

/// Start of the victim's mapping of `exe` (its load bias for a PIE), from /proc.
fn load_start(pid: u32, exe: &Path) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let exe = exe.to_str().unwrap();
    let line = maps
        .lines()
        .find(|l| l.ends_with(exe))
        .unwrap_or_else(|| panic!("{exe} not mapped:\n{maps}"));
    u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap()
}

fn spawn(c: &mut Command) -> Child {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", cmdline(c)))
}

#[test]
fn messages_naming_another_process_are_not_believed() {
    let _lock = tracing_lock();
    let tmp = TempDir::new("trust-userdrain");
    open_to_all(tmp.path());
    let attacker_exe = build(&tmp, "attacker", &[]);
    // Another build (another build-id): a binary the tracer does not know.
    let victim_exe = build(&tmp, "victim", &["-DVICTIM_BUILD=1"]);
    let (hostile, victim) = (LocalUser::hostile(), LocalUser::victim());

    let mut v = spawn(victim.command(&victim_exe).arg("victim"));
    let vpid = v.id();
    let mut vout = BufReader::new(v.stdout.take().unwrap());
    assert_eq!(read_line(&mut vout, "victim"), "page");
    let bias = load_start(vpid, &victim_exe);

    let trace = tmp.join("T");
    let mut t = spawn(
        Command::new(tracer_bin())
            .args(["record", "--user", "-o"])
            .arg(&trace)
            .arg("--")
            .arg("setpriv")
            .arg(format!("--reuid={}", hostile.uid))
            .arg(format!("--regid={}", hostile.gid))
            .args(["--clear-groups", "--"])
            .arg(&attacker_exe)
            .args(["attacker", &vpid.to_string()])
            .env("UTRACE_DEBUG_CACHE", ""),
    );
    let mut tout = BufReader::new(t.stdout.take().unwrap());
    let tid = read_line(&mut tout, "attacker");
    let tid = tid.strip_prefix("tid ").expect("tid line");
    // The victim's slot now names the attacker's thread as its owner.
    let mut vin = v.stdin.take().unwrap();
    writeln!(vin, "{tid}").unwrap();
    assert_eq!(read_line(&mut vout, "victim"), "ready");
    let before = victim_page(vpid);

    writeln!(t.stdin.take().unwrap(), "go").unwrap();
    assert_eq!(read_line(&mut tout, "attacker"), "sent");
    let mut err = String::new();
    t.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let st = t.wait().unwrap();
    assert!(st.success(), "tracer: {st}\n{err}");

    // The victim: its page unchanged (the old drain tombstoned the slot in it).
    let after = victim_page(vpid);
    assert!(
        before == after,
        "the victim's memory changed at {VICTIM_PAGE:#x}+{:#x}",
        before.iter().zip(&after).position(|(a, b)| a != b).unwrap()
    );
    drop(vin);
    v.wait().unwrap();

    // The trace: none of the victim's values, all of the attacker's own.
    let recs = dump(&trace);
    let secret: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.value >> 48 == SECRET_TAG)
        .collect();
    assert!(
        secret.is_empty(),
        "the victim's records are in the trace: {secret:?}"
    );
    assert!(
        recs.iter().all(|r| r.pid != vpid),
        "records in the victim's name"
    );
    let own: Vec<u64> = recs
        .iter()
        .filter(|r| r.value >> 48 == OWN_TAG && &*r.symbol == "rec")
        .map(|r| r.value & 0xffff)
        .collect();
    assert_eq!(own, (0..2 * OWN_N).collect::<Vec<_>>(), "{err}");

    // No load bias of the victim, no word of its binary.
    let bytes = std::fs::read(&trace).unwrap();
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(
        !has(&bias.to_le_bytes()),
        "the victim's load bias {bias:#x} is in the trace"
    );
    assert!(
        !has(victim_exe.to_str().unwrap().as_bytes()),
        "the victim's binary is described in the trace"
    );
    let refused = err
        .lines()
        .find(|l| l.contains("messages of the traced programs refused"))
        .unwrap_or_else(|| panic!("the refusals are not said: {err}"));
    eprintln!("{refused}");
    // Five forged messages: four name the victim's process, one (in the attacker's
    // own) a thread of the victim's as a slot's owner.
    assert!(
        refused.contains("5 messages of the traced programs refused: 4 naming another process")
            && refused.contains(" 1 from a process or thread not traced"),
        "{refused}"
    );
}

/// Slots a process announced before an exec are not read in the image that follows,
/// and an image the user may not read (setuid) is not read at all.
///
/// The attacker (`trust_userdrain.c exec`, run as `utrace-hostile` under a root
/// `record --user`) announces, in its own name, a slot at `STALE_PAGE + 0x800`, then
/// execs the same fixture installed setuid root. The kernel honours the setuid bit
/// (the tracer is root), and the new image holds, at that address, a slot owned by its
/// main thread whose buffer is 16 records `0x57a1…`; it also announces a slot of its
/// own at `+0xc00` (16 records `0x5e1f…`), as an instrumented setuid program would.
///
/// Against the old drain: at the main thread's exit it read both slots of the setuid
/// image into the hostile user's trace (32 of its records) and wrote its 16-byte
/// tombstones into its memory (the image saw its page "changed at 0x800").
/// Now an exec drops every slot of the process, and a process whose credentials after
/// an exec are not uniformly the user's (or whose image is not dumpable) is sealed:
/// its messages are refused, its memory never touched.
#[test]
fn slots_do_not_survive_an_exec_into_a_setuid_image() {
    let _lock = tracing_lock();
    let tmp = TempDir::new("trust-userdrain-exec");
    open_to_all(tmp.path());
    let attacker_exe = build(&tmp, "attacker", &[]);
    let suid = tmp.join("suid");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::copy(tmp.join("attacker"), &suid).unwrap();
        std::os::unix::fs::chown(&suid, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    }
    let hostile = LocalUser::hostile();
    let trace = tmp.join("T");
    let out = Command::new(tracer_bin())
        .args(["record", "--user", "-o"])
        .arg(&trace)
        .arg("--")
        .arg("setpriv")
        .arg(format!("--reuid={}", hostile.uid))
        .arg(format!("--regid={}", hostile.gid))
        .args(["--clear-groups", "--"])
        .arg(&attacker_exe)
        .arg("exec")
        .arg(&suid)
        .env("UTRACE_DEBUG_CACHE", "")
        .output()
        .unwrap();
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "tracer: {}\n{err}", out.status);
    // The setuid image's own verdict on its page (it really ran setuid: the kernel
    // mapped STALE_PAGE only in it).
    assert_eq!(stdout.trim(), "intact", "{err}");

    let recs = dump(&trace);
    let leaked: Vec<&Rec> = recs
        .iter()
        .filter(|r| matches!(r.value >> 48, 0x57a1 | 0x5e1f))
        .collect();
    assert!(
        leaked.is_empty(),
        "{} records of the setuid image are in the trace: {:?}",
        leaked.len(),
        &leaked[..leaked.len().min(4)]
    );
    // (The attacker's own records, still buffered at its exec, went with its old
    // image: an exec has no exit stop to collect them at.)
    let refused = err
        .lines()
        .find(|l| l.contains("messages of the traced programs refused"))
        .unwrap_or_else(|| panic!("the refusal is not said: {err}"));
    eprintln!("{refused}");
    assert!(
        refused.contains("1 messages of the traced programs refused")
            && refused.contains("1 from a process whose image the user may not read"),
        "{refused}"
    );
}
