//! A three-member etcd cluster, through `scripts/etcd-cluster.sh`.

use std::io;
use std::process::Command;
use std::time::Duration;

use crate::util::run_ok;

/// The cluster script of the dlock repository.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/etcd-cluster.sh");
/// How long the script's `start` may take (it may install etcd with apt-get first, and waits up
/// to `ETCD_WAIT_SECS` = 60 s for the cluster itself).
const START_LIMIT: Duration = Duration::from_secs(300);
/// How long `leader` / `start-one` may take (the script waits up to 60 s itself).
const WAIT_LIMIT: Duration = Duration::from_secs(90);
/// How long `kill` / `stop` / `pause` / `resume` may take.
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// A three-member etcd cluster on loopback (free client and peer ports, heartbeat 50 ms, election
/// timeout 500 ms) in a temporary directory, run by `scripts/etcd-cluster.sh`; every member it
/// started is stopped (by its recorded pid; a paused one is continued first) by
/// [`EtcdCluster::stop`] or when dropped. Members are numbered 1..=3.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    hosts: String,
    stopped: bool,
}

fn script(args: &[&str], dir: &std::path::Path, limit: Duration) -> io::Result<String> {
    let what = format!("scripts/etcd-cluster.sh {}", args.join(" "));
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
            "etcd member index must be 1, 2 or 3, not {n}"
        )))
    }
}

impl EtcdCluster {
    /// Starts the three members (installing etcd with apt-get if it is missing) and waits until
    /// every one answers a health check and there is a leader (at most 5 minutes). On failure
    /// every member started so far is stopped and the error carries the script's stderr (with the
    /// members' log tails).
    pub fn start() -> io::Result<EtcdCluster> {
        let dir = crate::util::server_dir("dlock-etcd-", "etcd")?;
        let mut etcd = EtcdCluster {
            dir,
            hosts: String::new(),
            stopped: false,
        };
        // On an error `etcd` is dropped, which stops whatever was started.
        let out = script(&["start"], etcd.dir.path(), START_LIMIT)?;
        etcd.hosts = out.lines().last().unwrap_or_default().trim().to_string();
        if etcd.client_ports().len() != 3 {
            return Err(io::Error::other(format!(
                "scripts/etcd-cluster.sh start printed no endpoints: {out:?}"
            )));
        }
        Ok(etcd)
    }

    /// The client endpoints: `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3` (members 1, 2, 3), as
    /// written between `etcd://` and the prefix of a URL.
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The client ports of members 1, 2, 3.
    pub fn client_ports(&self) -> Vec<u16> {
        self.hosts
            .split(',')
            .filter_map(|h| h.rsplit_once(':')?.1.parse().ok())
            .collect()
    }

    /// The index (1..=3) of the current leader; waits (at most 60 s) until there is one. A paused
    /// member is never reported.
    pub fn leader(&self) -> io::Result<usize> {
        let out = script(&["leader"], self.dir.path(), WAIT_LIMIT)?;
        out.parse()
            .map_err(|_| io::Error::other(format!("etcd-cluster.sh leader printed {out:?}")))
    }

    /// SIGKILL to member `n` (1..=3), by its recorded pid; returns once it is gone.
    pub fn kill(&self, n: usize) -> io::Result<()> {
        script(&["kill", &index(n)?], self.dir.path(), STOP_LIMIT).map(|_| ())
    }

    /// Starts member `n` (1..=3) again (same ports and data) and waits (at most 60 s) until it
    /// answers a health check. Does nothing to a member that is running.
    pub fn start_one(&self, n: usize) -> io::Result<()> {
        script(&["start-one", &index(n)?], self.dir.path(), WAIT_LIMIT).map(|_| ())
    }

    /// SIGSTOP to member `n` (1..=3), by its recorded pid: it keeps its sockets open but answers
    /// nothing, to its peers or its clients, until [`EtcdCluster::resume`].
    pub fn pause(&self, n: usize) -> io::Result<()> {
        script(&["pause", &index(n)?], self.dir.path(), STOP_LIMIT).map(|_| ())
    }

    /// SIGCONT to member `n` (1..=3), by its recorded pid.
    pub fn resume(&self, n: usize) -> io::Result<()> {
        script(&["resume", &index(n)?], self.dir.path(), STOP_LIMIT).map(|_| ())
    }

    /// The pid of member `n` (1..=3) while it runs (as recorded by the script).
    pub fn pid(&self, n: usize) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.path().join(format!("m{n}/pid")))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        crate::alive(pid).then_some(pid)
    }

    /// The cluster's temporary directory (`mN/etcd.log`, `mN/stderr.log`, `mN/pid`, `mN/data`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops every member of the cluster (SIGTERM and SIGCONT, SIGKILL after 5 s; by recorded
    /// pid). Also done on drop.
    pub fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            let _ = script(&["stop"], self.dir.path(), STOP_LIMIT);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
