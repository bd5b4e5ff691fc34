//! Running a batch of programs from one shell script (so that one tracer session, or
//! one oracle, covers them all): each one's stdout and exit code land in files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// What a run of a program printed and how it ended (137: killed at its time limit).
#[derive(Clone, Debug)]
pub(super) struct Outcome {
    pub stdout: Vec<u8>,
    pub code: i32,
    pub millis: u64,
}

impl Outcome {
    /// Same output and exit code (the time is not compared).
    pub(super) fn same(&self, other: &Outcome) -> bool {
        (self.code, &self.stdout) == (other.code, &other.stdout)
    }

    pub(super) fn describe(&self) -> String {
        let out = String::from_utf8_lossy(&self.stdout);
        let last = out.lines().last().unwrap_or("");
        format!("exit {} after {:?}", self.code, last)
    }
}

/// A shell script running `exes` one after another (under `runner`, e.g. qemu-user),
/// each for at most `timeout_s`, its outcome kept as `EXE.STAGE.out` / `.rc` (exit
/// code and milliseconds).
pub(super) struct Script {
    pub path: PathBuf,
    runs: Vec<PathBuf>,
    stage: String,
}

impl Script {
    pub(super) fn new(
        dir: &Path,
        stage: &str,
        runner: &[&str],
        exes: &[PathBuf],
        timeout_s: u32,
    ) -> Result<Script> {
        let mut text = String::from("#!/bin/sh\n");
        for exe in exes {
            let e = exe.display();
            text.push_str(&format!(
                "t=$(date +%s%N); timeout -s KILL {timeout_s} {} {e} > {e}.{stage}.out 2>/dev/null; \
                 echo $? $((($(date +%s%N) - t) / 1000000)) > {e}.{stage}.rc\n",
                runner.join(" ")
            ));
        }
        let path = dir.join(format!("{stage}.sh"));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Script {
            path,
            runs: exes.to_vec(),
            stage: stage.to_string(),
        })
    }

    /// The command line that runs it.
    pub(super) fn argv(&self) -> Vec<String> {
        vec!["/bin/sh".into(), self.path.display().to_string()]
    }

    /// Each program's outcome, in order (none when it did not run at all).
    pub(super) fn outcomes(&self) -> Vec<Option<Outcome>> {
        self.runs
            .iter()
            .map(|exe| {
                let f = |ext: &str| {
                    std::fs::read(format!("{}.{}.{ext}", exe.display(), self.stage)).ok()
                };
                let rc = String::from_utf8_lossy(&f("rc")?).into_owned();
                let mut w = rc.split_whitespace().map(str::parse::<u64>);
                let (Some(Ok(code)), Some(Ok(millis))) = (w.next(), w.next()) else {
                    return None;
                };
                Some(Outcome {
                    stdout: f("out")?,
                    code: code as i32,
                    millis,
                })
            })
            .collect()
    }
}
