//! A private `redis-server`.

use std::fs::OpenOptions;
use std::io;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::util::{run_bounded, tail};

/// How long a start may take before it is reported as failed.
const START_LIMIT: Duration = Duration::from_secs(10);
/// How long one `redis-cli` call may take.
const CLI_LIMIT: Duration = Duration::from_secs(10);

/// A private `redis-server` on a free loopback port (or on the `--tls-port` given in its
/// arguments), with its own temporary data directory; killed by pid when dropped.
///
/// Its stdout/stderr go to `server.log` in that directory; a start that fails reports the log's
/// tail.
#[derive(Debug)]
pub struct RedisServer {
    /// The port clients connect to: the plain port, or the TLS port when the arguments give
    /// `--tls-port`.
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with extra `args` (e.g. `["--save", "", "--appendonly", "no"]` or
    /// `["--appendonly", "yes", "--appendfsync", "always"]`) and waits (at most 10 s) until it
    /// accepts connections. With `--tls-port P` in `args` the server is waited for on `P` and no
    /// `--port` is added (pass `--port 0` for a TLS-only server).
    pub fn start(args: &[&str]) -> io::Result<RedisServer> {
        let tls_port = match args.iter().position(|a| *a == "--tls-port") {
            Some(i) => Some(
                args.get(i + 1)
                    .and_then(|p| p.parse::<u16>().ok())
                    .ok_or_else(|| io::Error::other("--tls-port needs a port number after it"))?,
            ),
            None => None,
        };
        let port = match tls_port {
            Some(p) => p,
            None => crate::free_port()?,
        };
        let dir = crate::util::server_dir("dlock-redis-", "redis")?;
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn()?;
        Ok(s)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Starts the server (again: same port, same data directory) and waits (at most 10 s) until it
    /// accepts connections. Does nothing when it is already running (a server that exited on its
    /// own, or was killed through its pid, is started again).
    pub fn spawn(&mut self) -> io::Result<()> {
        if let Some(c) = &mut self.child {
            if !matches!(c.try_wait(), Ok(Some(_))) {
                return Ok(());
            }
            self.child = None;
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .map_err(|e| io::Error::other(format!("cannot open {}: {e}", self.log().display())))?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1"]);
        if !self.args.iter().any(|a| a == "--tls-port") {
            cmd.args(["--port", &self.port.to_string()]);
        }
        let mut child = cmd
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                io::Error::other(format!(
                    "cannot start redis-server ({e}); it must be installed (scripts/test.sh \
                     installs it)"
                ))
            })?;
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(st)) = child.try_wait() {
                return Err(io::Error::other(format!(
                    "redis-server on port {} exited ({st}) while starting; log {}:\n{}",
                    self.port,
                    self.log().display(),
                    tail(&self.log(), 30)
                )));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other(format!(
                    "redis-server did not accept connections on port {} within {START_LIMIT:?}; \
                     log {}:\n{}",
                    self.port,
                    self.log().display(),
                    tail(&self.log(), 30)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL by pid, then waits for the process (a crash: nothing is flushed that was not
    /// already). Does nothing when it is not running.
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server; the same as [`RedisServer::crash`] (SIGKILL, so a server with save
    /// points configured writes no snapshot on the way out).
    pub fn stop(&mut self) {
        self.crash();
    }

    /// Crash, then start again on the same port and data directory; returns how long the server
    /// was gone (from the kill until it accepts connections again).
    pub fn restart(&mut self) -> io::Result<Duration> {
        let t = Instant::now();
        self.crash();
        self.spawn()?;
        Ok(t.elapsed())
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The pid of the server process this handle started, until [`RedisServer::crash`] or
    /// [`RedisServer::stop`] (for [`crate::signal`], e.g. SIGSTOP/SIGCONT).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The server's data directory (also holds `server.log`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Runs `redis-cli -p PORT ARGS…` against this server (at most 10 s) and returns its trimmed
    /// stdout. When `redis-cli` cannot be run or does not finish, the answer is
    /// `ERR redis-cli: <why>` instead (so a comparison with an expected reply fails visibly).
    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-p", &self.port.to_string()]).args(args);
        match run_bounded(&mut cmd, CLI_LIMIT, "redis-cli") {
            Ok(o) => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            Err(e) => format!("ERR redis-cli: {e}"),
        }
    }

    /// Closes every client connection of the server except the one asking (`CLIENT KILL TYPE
    /// normal SKIPME yes`, then the same for `pubsub`); returns how many were closed. Needs a
    /// plain (non-TLS) port without a password.
    pub fn kill_client_connections(&self) -> io::Result<usize> {
        let mut n = 0;
        for kind in ["normal", "pubsub"] {
            let answer = self.cli(&["CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"]);
            n += answer.parse::<usize>().map_err(|_| {
                io::Error::other(format!(
                    "CLIENT KILL TYPE {kind} on port {}: unexpected answer {answer:?}",
                    self.port
                ))
            })?;
        }
        Ok(n)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.crash();
    }
}
