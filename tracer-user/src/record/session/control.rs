//! The control socket of a running session (`tracer filter` talks to it).
//!
//! `/run/utrace/<tracer pid>.sock`, a Unix stream socket in a 0700 directory (only
//! root, who runs sessions, can change their filters). One request per connection: a
//! JSON line `{"filter": FilterSpec}` (replace the filter) or `{"show": true}`, and a
//! JSON line back `{"ok": bool, "message": "..."}`. The socket dies with the tracer;
//! a stale file of a dead tracer is removed by the next session, and `tracer filter`
//! only talks to live ones.
//!
//! `parse_request` checks a request line (bounded) before anything acts on it.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::{
        fs::{DirBuilderExt, PermissionsExt},
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::record::session::filters::FilterSpec;

pub const DIR: &str = "/run/utrace";

#[derive(Serialize, Deserialize, Debug)]
pub struct Request {
    #[serde(default)]
    pub filter: Option<FilterSpec>,
    #[serde(default)]
    pub show: bool,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Reply {
    pub ok: bool,
    pub message: String,
}

fn path_of(pid: u32) -> PathBuf {
    Path::new(DIR).join(format!("{pid}.sock"))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The listening side, owned by the session.
pub struct Control {
    listener: UnixListener,
    path: PathBuf,
}

impl Control {
    pub fn open() -> Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(DIR)
            .with_context(|| format!("cannot create {DIR}"))?;
        std::fs::set_permissions(DIR, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {DIR} private"))?;
        // Sockets of sessions that died (SIGKILL) stay behind: clear them.
        if let Ok(dir) = std::fs::read_dir(DIR) {
            for e in dir.flatten() {
                let name = e.file_name();
                let stale = name
                    .to_str()
                    .and_then(|n| n.strip_suffix(".sock"))
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|pid| !alive(pid));
                if stale {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let path = path_of(std::process::id());
        let _ = std::fs::remove_file(&path);
        let listener =
            UnixListener::bind(&path).with_context(|| format!("cannot bind {}", path.display()))?;
        listener.set_nonblocking(true)?;
        Ok(Control { listener, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serve the requests waiting now (never blocks for long: a client has 1 s in all
    /// to send its line, of at most 64 KiB). `handle` answers one request.
    pub fn serve(&self, mut handle: impl FnMut(Request) -> Reply) {
        while let Ok((stream, _)) = self.listener.accept() {
            let reply = match read_request(&stream) {
                Ok(line) => match parse_request(&line) {
                    Ok(req) => handle(req),
                    Err(message) => Reply { ok: false, message },
                },
                Err(e) => Reply {
                    ok: false,
                    message: format!("cannot read the request: {e}"),
                },
            };
            let mut w = &stream;
            if let Ok(mut s) = serde_json::to_string(&reply) {
                s.push('\n');
                let _ = w.write_all(s.as_bytes());
            }
        }
    }
}

/// A request as a client sent it: one UTF-8 JSON line (the newline and anything after
/// it are ignored), whose filter must be valid without the binaries. The reason is
/// the reply's message.
pub fn parse_request(bytes: &[u8]) -> Result<Request, String> {
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line).map_err(|_| "request is not UTF-8".to_string())?;
    let req: Request = serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))?;
    if let Some(f) = &req.filter {
        f.validate().map_err(|e| format!("{e:#}"))?;
    }
    Ok(req)
}

/// One request line, read within a deadline (the session loop waits meanwhile).
fn read_request(stream: &UnixStream) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    const MAX: usize = 64 << 10;
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    stream.set_nonblocking(false)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.contains(&b'\n') {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || buf.len() > MAX {
            return Err(std::io::Error::other(
                "no complete request line within 1 s / 64 KiB",
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = (&*stream).read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(buf)
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The live sessions (tracer pids with a control socket).
pub fn sessions() -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir(DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".sock")?
                .parse::<u32>()
                .ok()
        })
        .filter(|&pid| alive(pid))
        .collect();
    out.sort_unstable();
    out
}

/// Send one request to session `pid` (or the only live session) and return the reply.
pub fn request(pid: Option<u32>, req: &Request) -> Result<Reply> {
    let pid = match pid {
        Some(p) => p,
        None => match sessions().as_slice() {
            [one] => *one,
            [] => bail!("no recording session is running (no socket in {DIR})"),
            many => bail!(
                "{} sessions are running (tracer pids {}): name one with --session PID",
                many.len(),
                many.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    let path = path_of(pid);
    let stream = UnixStream::connect(&path)
        .with_context(|| format!("no session with tracer pid {pid} ({})", path.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    (&stream).write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .with_context(|| format!("session {pid} did not answer"))?;
    serde_json::from_str(&reply).with_context(|| format!("session {pid}: bad reply {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_before_they_reach_the_session() {
        let req = parse_request(b"{\"filter\": {\"pids\": [3]}}\ntrailing").unwrap();
        assert_eq!(req.filter.unwrap().pids, [3]);
        assert!(parse_request(b"{\"show\": true}").unwrap().show);
        for (bad, why) in [
            (&b"\xff{}"[..], "not UTF-8"),
            (b"{\"filter\": 3}", "bad request"),
            (b"{\"filter\": {\"sample\": 0}}", "--sample 0"),
            (b"{\"filter\": {\"functions\": [\"[\"]}}", "--functions"),
        ] {
            let e = parse_request(bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }
}
