//! A three-server ZooKeeper ensemble, through `scripts/zk-ensemble.sh`.

use std::io;
use std::process::Command;
use std::time::Duration;

use crate::util::run_ok;

/// The ensemble script of the dlock repository.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/zk-ensemble.sh");
/// How long the script's `start` may take (it may install ZooKeeper with apt-get first, and waits
/// up to `ZK_WAIT_SECS` = 60 s per server itself).
const START_LIMIT: Duration = Duration::from_secs(300);
/// How long `leader` / `start-one` may take (the script waits up to 60 s itself).
const WAIT_LIMIT: Duration = Duration::from_secs(90);
/// How long `kill` / `stop` may take.
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// A three-server ZooKeeper ensemble on loopback (free ports, tickTime 200 ms) in a temporary
/// directory, run by `scripts/zk-ensemble.sh`; every server it started is stopped (by its recorded
/// pid) by [`ZkEnsemble::stop`] or when dropped. Servers are numbered 1..=3.
#[derive(Debug)]
pub struct ZkEnsemble {
    dir: tempfile::TempDir,
    hosts: String,
    stopped: bool,
}

fn script(args: &[&str], dir: &std::path::Path, limit: Duration) -> io::Result<String> {
    let what = format!("scripts/zk-ensemble.sh {}", args.join(" "));
    run_ok(
        Command::new("bash").arg(SCRIPT).args(args).arg(dir),
        limit,
        &what,
    )
}

fn index(n: usize) -> io::Result<String> {
    if (1..=3).contains(&n) {
        Ok(n.to_string())
    } else {
        Err(io::Error::other(format!(
            "ZooKeeper server index must be 1, 2 or 3, not {n}"
        )))
    }
}

impl ZkEnsemble {
    /// Starts the three servers (installing ZooKeeper with apt-get if it is missing) and waits
    /// until they form a quorum with one leader (at most 5 minutes). On failure every server
    /// started so far is stopped and the error carries the script's stderr (with the failing
    /// server's log tail).
    pub fn start() -> io::Result<ZkEnsemble> {
        let dir = crate::util::server_dir("dlock-zk-", "ZooKeeper")?;
        let mut zk = ZkEnsemble {
            dir,
            hosts: String::new(),
            stopped: false,
        };
        // On an error `zk` is dropped, which stops whatever was started.
        let out = script(&["start"], zk.dir.path(), START_LIMIT)?;
        zk.hosts = out.lines().last().unwrap_or_default().trim().to_string();
        if zk.client_ports().len() != 3 {
            return Err(io::Error::other(format!(
                "scripts/zk-ensemble.sh start printed no connect string: {out:?}"
            )));
        }
        Ok(zk)
    }

    /// The connect string: `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3` (servers 1, 2, 3).
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The client ports of servers 1, 2, 3.
    pub fn client_ports(&self) -> Vec<u16> {
        self.hosts
            .split(',')
            .filter_map(|h| h.rsplit_once(':')?.1.parse().ok())
            .collect()
    }

    /// The index (1..=3) of the current leader; waits (at most 60 s) until there is one.
    pub fn leader(&self) -> io::Result<usize> {
        let out = script(&["leader"], self.dir.path(), WAIT_LIMIT)?;
        out.parse()
            .map_err(|_| io::Error::other(format!("zk-ensemble.sh leader printed {out:?}")))
    }

    /// SIGKILL to server `n` (1..=3), by its recorded pid; returns once it is gone.
    pub fn kill(&self, n: usize) -> io::Result<()> {
        script(&["kill", &index(n)?], self.dir.path(), STOP_LIMIT).map(|_| ())
    }

    /// Starts server `n` (1..=3) again (same ports and data) and waits (at most 60 s) until it has
    /// joined the quorum. Does nothing to a server that is running.
    pub fn start_one(&self, n: usize) -> io::Result<()> {
        script(&["start-one", &index(n)?], self.dir.path(), WAIT_LIMIT).map(|_| ())
    }

    /// The pid of server `n` (1..=3) while it runs (as recorded by the script; for
    /// [`crate::signal`], e.g. SIGSTOP/SIGCONT).
    pub fn pid(&self, n: usize) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.path().join(format!("s{n}/pid")))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        crate::alive(pid).then_some(pid)
    }

    /// The ensemble's temporary directory (`sN/server.log`, `sN/zoo.cfg`, `sN/pid`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops every server of the ensemble (SIGTERM, SIGKILL after 3 s; by recorded pid). Also done
    /// on drop.
    pub fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            let _ = script(&["stop"], self.dir.path(), STOP_LIMIT);
        }
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        self.stop();
    }
}
