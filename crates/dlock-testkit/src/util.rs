//! Bounded child processes and log tails.

use std::io::{self, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The last `lines` lines of the file at `path` (a note when it cannot be read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Runs `cmd` to completion with its output captured, killing it (by pid) after `limit`.
/// `what` names the command in errors.
pub(crate) fn run_bounded(cmd: &mut Command, limit: Duration, what: &str) -> io::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::other(format!("cannot run {what}: {e}")))?;
    let (tx, rx) = mpsc::channel::<(bool, Vec<u8>)>();
    if let Some(mut out) = child.stdout.take() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = out.read_to_end(&mut buf);
            let _ = tx.send((true, buf));
        });
    }
    if let Some(mut err) = child.stderr.take() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf);
            let _ = tx.send((false, buf));
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other(format!(
                "{what} did not finish within {limit:?} (killed)"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The pipes close when the process exits, unless something it started keeps them open:
    // take what arrives within a moment.
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let until = Instant::now() + Duration::from_secs(2);
    for _ in 0..2 {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((true, b)) => stdout = b,
            Ok((false, b)) => stderr = b,
            Err(_) => break,
        }
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Like [`run_bounded`], but a failed exit status is an error too (with its stderr); returns the
/// trimmed stdout.
pub(crate) fn run_ok(cmd: &mut Command, limit: Duration, what: &str) -> io::Result<String> {
    let out = run_bounded(cmd, limit, what)?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A temporary directory for a private server's data and logs (the servers of this crate, and
/// dlock-chaos's SQLite file), named `PREFIX…` in the system's temp dir. Removed when dropped,
/// unless `DLOCK_KEEP_SERVER_DIRS` is set (the scale run sets it, so that a server's log outlives
/// the run that needs reading); then its path goes to stderr.
pub fn server_dir(prefix: &str, what: &str) -> io::Result<tempfile::TempDir> {
    let keep = std::env::var_os("DLOCK_KEEP_SERVER_DIRS").is_some_and(|v| !v.is_empty());
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .disable_cleanup(keep)
        .tempdir()
        .map_err(|e| io::Error::other(format!("cannot create a temp dir for {what}: {e}")))?;
    if keep {
        eprintln!("{what}: data and logs kept in {}", dir.path().display());
    }
    Ok(dir)
}
