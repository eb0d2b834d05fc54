//! Redis with fail-over: a Sentinel topology and a Redis Cluster, through `scripts/redis-ha.sh`.
//!
//! Nodes are named as the script names them: the Sentinel topology's data nodes `n1`..`n3` (`n1`
//! is the first master) and sentinels `s1`..`s3`; the cluster's nodes `c1`..`c6` (three masters
//! with one replica each; which is which changes with every fail-over). Addresses are
//! `127.0.0.1:PORT` strings, as the script prints them.

use std::io;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{run_bounded, run_ok};

/// The fail-over script of the dlock repository.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/redis-ha.sh");
/// How long a start may take (the script may install redis-server with apt-get first, and waits
/// up to `REDIS_HA_WAIT_SECS` = 60 s for the topology itself).
const START_LIMIT: Duration = Duration::from_secs(300);
/// How long the script's waits may take (`master`, `master-of`, `start-one`, `wait-failover`,
/// `migrate-slot`: 60 s each in the script).
const WAIT_LIMIT: Duration = Duration::from_secs(90);
/// How long `kill` / `stop` / `pause` / `resume` / `node-of` may take.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// How long [`RedisSentinel::wait_replica`] / [`RedisCluster::wait_replica`] wait.
const REPLICA_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sentinel,
    Cluster,
}

/// What both topologies share (reached through [`RedisSentinel`] and [`RedisCluster`]): the
/// directory, the list the start printed, and the script's verbs on one node.
#[derive(Debug)]
pub struct RedisHa {
    kind: Kind,
    dir: tempfile::TempDir,
    hosts: String,
    stopped: bool,
}

impl RedisHa {
    fn start(kind: Kind) -> io::Result<RedisHa> {
        let (prefix, verb, count) = match kind {
            Kind::Sentinel => ("dlock-redis-sentinel-", "sentinel-start", 3),
            Kind::Cluster => ("dlock-redis-cluster-", "cluster-start", 6),
        };
        let dir = crate::util::server_dir(prefix, "redis")?;
        let mut ha = RedisHa {
            kind,
            dir,
            hosts: String::new(),
            stopped: false,
        };
        // On an error `ha` is dropped, which stops whatever was started (the script also stops
        // what a failed start had started).
        let out = ha.script(&[verb], START_LIMIT)?;
        ha.hosts = out.lines().last().unwrap_or_default().trim().to_string();
        if ha.hosts.split(',').filter(|h| h.contains(':')).count() != count {
            return Err(io::Error::other(format!(
                "scripts/redis-ha.sh {verb} printed no list of {count} addresses: {out:?}"
            )));
        }
        Ok(ha)
    }

    /// Runs `scripts/redis-ha.sh ARGS... DIR`; its trimmed stdout.
    fn script(&self, args: &[&str], limit: Duration) -> io::Result<String> {
        let what = format!("scripts/redis-ha.sh {}", args.join(" "));
        run_ok(
            Command::new("bash")
                .arg(SCRIPT)
                .args(args)
                .arg(self.dir.path()),
            limit,
            &what,
        )
    }

    fn check_node(&self, node: &str) -> io::Result<()> {
        let ok = match self.kind {
            Kind::Sentinel => matches!(node, "n1" | "n2" | "n3" | "s1" | "s2" | "s3"),
            Kind::Cluster => matches!(node, "c1" | "c2" | "c3" | "c4" | "c5" | "c6"),
        };
        if ok {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "no node {node:?} in a redis {} topology (nodes: {})",
                match self.kind {
                    Kind::Sentinel => "sentinel",
                    Kind::Cluster => "cluster",
                },
                match self.kind {
                    Kind::Sentinel => "n1-n3, s1-s3",
                    Kind::Cluster => "c1-c6",
                }
            )))
        }
    }

    fn node_script(&self, verb: &str, node: &str, limit: Duration) -> io::Result<()> {
        self.check_node(node)?;
        self.script(&[verb, node], limit).map(drop)
    }

    /// The list the start printed: the sentinels (`s1`..`s3`) or the cluster's nodes
    /// (`c1`..`c6`), `127.0.0.1:p1,…`, as written after the URL's scheme.
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The node (`n1`, `s2`, `c4`, …) whose port is `addr`'s.
    pub fn node_of(&self, addr: &str) -> io::Result<String> {
        self.script(&["node-of", addr], STOP_LIMIT)
    }

    /// SIGKILL to `node`, by its recorded pid; returns once it is gone.
    pub fn kill(&self, node: &str) -> io::Result<()> {
        self.node_script("kill", node, STOP_LIMIT)
    }

    /// Starts `node` again (same port, directory and config, as the sentinels rewrote it, or its
    /// `nodes.conf`) and waits (at most 60 s) until it answers PING. A killed Sentinel master
    /// comes back as an empty master until the sentinels make it a replica; a failed-over
    /// cluster master rejoins as a replica.
    pub fn start_one(&self, node: &str) -> io::Result<()> {
        self.node_script("start-one", node, WAIT_LIMIT)
    }

    /// SIGSTOP to `node`: it keeps its sockets open and answers nothing until [`Self::resume`].
    pub fn pause(&self, node: &str) -> io::Result<()> {
        self.node_script("pause", node, STOP_LIMIT)
    }

    /// SIGCONT to `node`.
    pub fn resume(&self, node: &str) -> io::Result<()> {
        self.node_script("resume", node, STOP_LIMIT)
    }

    /// The topology's temporary directory (`NODE/redis.log` or `NODE/sentinel.log`, `NODE/pid`,
    /// `NODE/port`, `NODE/redis.conf`, `NODE/sentinel.conf` or `NODE/nodes.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The port of `node`.
    pub fn port(&self, node: &str) -> io::Result<u16> {
        self.check_node(node)?;
        let p = self.dir.path().join(node).join("port");
        std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("no port recorded in {}", p.display())))
    }

    /// The first word of `node`'s `ROLE` answer: `master`, `slave` or `sentinel`.
    pub fn role(&self, node: &str) -> io::Result<String> {
        let out = cli(self.port(node)?, &["ROLE"])?;
        Ok(out.lines().next().unwrap_or_default().to_string())
    }

    /// The pid of `node` while it runs (as recorded by the script).
    pub fn pid(&self, node: &str) -> Option<u32> {
        self.check_node(node).ok()?;
        let pid: u32 = std::fs::read_to_string(self.dir.path().join(node).join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        crate::alive(pid).then_some(pid)
    }

    /// Waits until `node` is a replica whose link to its master is up and `ok(master's port)`
    /// holds; how long that took.
    fn wait_replica(&self, node: &str, ok: impl Fn(u16) -> bool) -> io::Result<Duration> {
        let port = self.port(node)?;
        let t = Instant::now();
        let mut last = String::new();
        while t.elapsed() < REPLICA_LIMIT {
            let role = cli(port, &["ROLE"]).unwrap_or_default();
            let info = cli(port, &["INFO", "replication"]).unwrap_or_default();
            let master_port = info_field(&info, "master_port").and_then(|p| p.parse().ok());
            if role.lines().next() == Some("slave")
                && info_field(&info, "master_link_status") == Some("up")
                && master_port.is_some_and(&ok)
            {
                return Ok(t.elapsed());
            }
            last = format!(
                "ROLE {:?}, master_link_status {:?}",
                role.lines().next().unwrap_or(""),
                info_field(&info, "master_link_status").unwrap_or("")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(io::Error::other(format!(
            "redis node {node} (127.0.0.1:{port}) did not become a replica with its link up \
             within {REPLICA_LIMIT:?} (last seen: {last})"
        )))
    }

    /// Stops every node (SIGTERM and SIGCONT, SIGKILL after 5 s; by recorded pid). Also done on
    /// drop.
    pub fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            let _ = self.script(&["stop"], STOP_LIMIT);
        }
    }
}

impl Drop for RedisHa {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `redis-cli -h 127.0.0.1 -p PORT ARGS...` (bounded to 5 s); its trimmed stdout, error replies
/// included (redis-cli prints them and exits 0).
fn cli(port: u16, args: &[&str]) -> io::Result<String> {
    let what = format!("redis-cli -p {port} {}", args.join(" "));
    let out = run_bounded(
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args),
        Duration::from_secs(5),
        &what,
    )?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .trim()
        .replace('\r', ""))
}

/// The value of `name:value` in an `INFO` answer.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// How many replicas an `INFO replication` answer lists as online.
fn online_replicas(info: &str) -> usize {
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count()
}

/// The port of a `host:port` address.
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// A Sentinel topology on loopback: one master and two replicas (`n1`..`n3`, `n1` the first
/// master) and three sentinels (`s1`..`s3`, quorum 2, down-after 1000 ms, failover-timeout
/// 5000 ms) watching the master `dlockmaster`, in a temporary directory, run by
/// `scripts/redis-ha.sh`. Every node it started is stopped (by its recorded pid; a paused one is
/// continued first) by [`RedisSentinel::stop`] or when dropped.
#[derive(Debug)]
pub struct RedisSentinel(RedisHa);

/// The master's name in the sentinels' configuration.
pub const SENTINEL_MASTER_NAME: &str = "dlockmaster";

impl RedisSentinel {
    /// Starts the topology (installing redis-server with apt-get if it is missing) and waits until
    /// the replicas are online and every sentinel knows the master, both replicas and the other
    /// sentinels (at most 5 minutes). On failure every node started so far is stopped and the
    /// error carries the script's stderr (with the logs' tails).
    pub fn start() -> io::Result<RedisSentinel> {
        RedisHa::start(Kind::Sentinel).map(RedisSentinel)
    }

    /// `redis+sentinel://HOSTS/dlockmaster` followed by `query` (`""` or `"?replicas=1"`, …).
    pub fn url(&self, query: &str) -> String {
        format!(
            "redis+sentinel://{}/{SENTINEL_MASTER_NAME}{query}",
            self.hosts()
        )
    }

    /// `host:port` of the master the live sentinels report (waits up to 60 s for one to answer).
    pub fn master(&self) -> io::Result<String> {
        self.0.script(&["master"], WAIT_LIMIT)
    }

    /// The node that is the master now (`n1`..`n3`) and its address.
    pub fn master_node(&self) -> io::Result<(String, String)> {
        let addr = self.master()?;
        Ok((self.node_of(&addr)?, addr))
    }

    /// Waits (at most 60 s) until every live sentinel reports a master other than `old`
    /// (`host:port`) and that master answers ROLE as a master; returns its address.
    pub fn wait_failover(&self, old: &str) -> io::Result<String> {
        self.0.script(&["wait-failover", old], WAIT_LIMIT)
    }

    /// Waits (at most 60 s) until data node `node` is a replica of the master the sentinels
    /// report, with its link up, and that master lists both replicas online (so the next
    /// fail-over has a replica to promote); how long that took. After [`RedisSentinel::start_one`]
    /// of a killed master, or [`RedisSentinel::resume`] of a paused one, the sentinels take
    /// about 8–11 s to demote it.
    pub fn wait_replica(&self, node: &str) -> io::Result<Duration> {
        self.0.wait_replica(node, |mport| {
            self.master().ok().and_then(|m| port_of(&m)) == Some(mport)
                && cli(mport, &["INFO", "replication"]).is_ok_and(|i| online_replicas(&i) >= 2)
        })
    }
}

/// A six-node Redis Cluster on loopback (`c1`..`c6`: three masters with one replica each,
/// cluster-node-timeout 1000 ms) in a temporary directory, run by `scripts/redis-ha.sh`. Every
/// node it started is stopped (by its recorded pid; a paused one is continued first) by
/// [`RedisCluster::stop`] or when dropped.
#[derive(Debug)]
pub struct RedisCluster(RedisHa);

/// What [`RedisCluster::migrate_slot`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMove {
    pub slot: u16,
    /// `host:port` of the master that served the slot, and of the one that serves it now.
    pub from: String,
    pub to: String,
}

impl RedisCluster {
    /// Starts the six nodes (installing redis-server with apt-get if it is missing), creates the
    /// cluster with `redis-cli --cluster create` and waits until every node says
    /// `cluster_state:ok` and every master has a replica (at most 5 minutes). On failure every
    /// node started so far is stopped and the error carries the script's stderr.
    pub fn start() -> io::Result<RedisCluster> {
        RedisHa::start(Kind::Cluster).map(RedisCluster)
    }

    /// `redis+cluster://HOSTS/` followed by `query` (`""` or `"?replicas=1"`, …).
    pub fn url(&self, query: &str) -> String {
        format!("redis+cluster://{}/{query}", self.hosts())
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked of the first node that answers).
    pub fn key_slot(&self, key: &str) -> io::Result<u16> {
        let mut last = None;
        for n in 1..=6 {
            let node = format!("c{n}");
            match self
                .0
                .port(&node)
                .and_then(|p| cli(p, &["CLUSTER", "KEYSLOT", key]))
            {
                Ok(s) => match s.parse() {
                    Ok(slot) => return Ok(slot),
                    Err(_) => last = Some(format!("{node} answered {s:?}")),
                },
                Err(e) => last = Some(e.to_string()),
            }
        }
        Err(io::Error::other(format!(
            "no cluster node answered CLUSTER KEYSLOT {key:?} ({})",
            last.unwrap_or_default()
        )))
    }

    /// `host:port` of the master serving `key`'s slot, asked of the cluster (waits up to 60 s for
    /// one that owns it and says so itself).
    pub fn master_of(&self, key: &str) -> io::Result<String> {
        self.0.script(&["master-of", key], WAIT_LIMIT)
    }

    /// The node that serves `key`'s slot now and its address.
    pub fn master_node_of(&self, key: &str) -> io::Result<(String, String)> {
        let addr = self.master_of(key)?;
        Ok((self.node_of(&addr)?, addr))
    }

    /// Waits (at most 60 s) until every live node says `cluster_state:ok` and none gives `old`
    /// (`host:port`) a slot.
    pub fn wait_failover(&self, old: &str) -> io::Result<()> {
        self.0.script(&["wait-failover", old], WAIT_LIMIT).map(drop)
    }

    /// Waits (at most 60 s) until `node` is a replica with its link to its master up; how long
    /// that took.
    pub fn wait_replica(&self, node: &str) -> io::Result<Duration> {
        self.0.wait_replica(node, |_| true)
    }

    /// Moves `key`'s slot and its keys to another master (`CLUSTER SETSLOT … IMPORTING /
    /// MIGRATING`, `MIGRATE`, `SETSLOT … NODE`), and waits until every live node names the new
    /// owner.
    pub fn migrate_slot(&self, key: &str) -> io::Result<SlotMove> {
        let out = self.0.script(&["migrate-slot", key], WAIT_LIMIT)?;
        let mut w = out.lines().last().unwrap_or_default().split_whitespace();
        match (w.next().and_then(|s| s.parse().ok()), w.next(), w.next()) {
            (Some(slot), Some(from), Some(to)) => Ok(SlotMove {
                slot,
                from: from.to_string(),
                to: to.to_string(),
            }),
            _ => Err(io::Error::other(format!(
                "scripts/redis-ha.sh migrate-slot printed {out:?}"
            ))),
        }
    }
}

impl std::ops::Deref for RedisSentinel {
    type Target = RedisHa;
    fn deref(&self) -> &RedisHa {
        &self.0
    }
}

impl std::ops::DerefMut for RedisSentinel {
    fn deref_mut(&mut self) -> &mut RedisHa {
        &mut self.0
    }
}

impl std::ops::Deref for RedisCluster {
    type Target = RedisHa;
    fn deref(&self) -> &RedisHa {
        &self.0
    }
}

impl std::ops::DerefMut for RedisCluster {
    fn deref_mut(&mut self) -> &mut RedisHa {
        &mut self.0
    }
}
