//! What the fault tests share: free loopback ports and private redis-servers.
#![allow(dead_code)] // each test binary uses a different part

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private redis-server on a free loopback port (or on the `--tls-port` given in its
/// arguments), with its own data directory; killed by pid when dropped.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with extra `args` (e.g. `["--save", "", "--appendonly", "no"]`) and waits
    /// until it accepts connections.
    pub fn start(args: &[&str]) -> RedisServer {
        // A server listening only on its TLS port is waited for on that port.
        let port = args
            .iter()
            .position(|a| *a == "--tls-port")
            .and_then(|i| args.get(i + 1))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(free_port);
        let mut s = RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().unwrap(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn();
        s
    }

    /// Starts the server (again: same port, same data directory).
    pub fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1"]);
        if !self.args.iter().any(|a| a == "--tls-port") {
            cmd.args(["--port", &self.port.to_string()]);
        }
        let child = cmd
            .args(["--dir", self.dir.path().to_str().unwrap()])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL by pid (a crash: nothing flushed that was not already).
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Same as [`RedisServer::crash`].
    pub fn stop(&mut self) {
        self.crash();
    }

    /// Crash, then start again on the same port and data directory.
    pub fn restart(&mut self) {
        self.crash();
        self.spawn();
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `redis-cli` on this server; its trimmed output.
    pub fn cli(&self, args: &[&str]) -> String {
        let o = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.crash();
    }
}
