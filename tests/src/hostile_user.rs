//! Real unprivileged users for the trust-boundary tests (`tests/tests/trust_*.rs`): a
//! system account made once per machine with `useradd --system`, and commands run as it
//! with `setpriv --reuid --regid --clear-groups` (no capability, no supplementary group).
//! The tests run as root; these users are what a hostile local user would be.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// A local account with no privilege.
#[derive(Debug, Clone)]
pub struct LocalUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

static MADE: Mutex<()> = Mutex::new(());

impl LocalUser {
    /// The hostile user (`utrace-hostile`), made if missing.
    pub fn hostile() -> LocalUser {
        LocalUser::named("utrace-hostile")
    }

    /// A second, innocent user (`utrace-victim`): the one whose programs a hostile user
    /// must not be able to disturb.
    pub fn victim() -> LocalUser {
        LocalUser::named("utrace-victim")
    }

    /// The account `name`, made with `useradd --system` if missing.
    pub fn named(name: &str) -> LocalUser {
        let _g = MADE.lock().unwrap_or_else(|e| e.into_inner());
        if id_of(name, "-u").is_none() {
            let st = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                ])
                .arg(name)
                .status()
                .expect("useradd (package passwd) must be installed");
            assert!(st.success(), "useradd --system {name}: {st}");
        }
        LocalUser {
            name: name.to_string(),
            uid: id_of(name, "-u").expect("uid of the new user"),
            gid: id_of(name, "-g").expect("gid of the new user"),
        }
    }

    /// `PROG ARGS...` as this user: `setpriv --reuid U --regid G --clear-groups --`.
    pub fn command(&self, prog: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--clear-groups")
            .arg("--")
            .arg(prog);
        c
    }

    /// Hand `path` (a file or directory the test made as root) to this user.
    pub fn own(&self, path: &Path) {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

/// Let every user enter `dir` and read what is in it (test temp dirs are root's).
pub fn open_to_all(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod 755 {}: {e}", dir.display()));
}

fn id_of(name: &str, flag: &str) -> Option<u32> {
    let o = Command::new("id").args([flag, name]).output().ok()?;
    if !o.status.success() {
        return None;
    }
    String::from_utf8_lossy(&o.stdout).trim().parse().ok()
}
