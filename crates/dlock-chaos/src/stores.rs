//! The stores a chaos run breaks: private servers started for the run (never the machine's
//! shared ones), their URLs (optionally through one fault proxy per endpoint and client), and the
//! store-side faults.

use crate::event::now_us;
use dlock_testkit::{
    Db, EtcdCluster, RedisCluster, RedisSentinel, RedisServer, SqlServer, TcpProxy, ZkEnsemble,
};
use nix::sys::signal::Signal;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A store configuration under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// The embedded SQLite file (processes of one machine).
    Sqlite,
    /// The SQLite file on a small tmpfs of its own that the harness mounts (root only), for
    /// the full-filesystem fault.
    SqliteTmpfs,
    /// One Redis server without persistence (the common deployment).
    Redis,
    /// One Redis server with AOF and `appendfsync always`.
    RedisAof,
    /// PostgreSQL, lease tables.
    Postgres,
    /// MariaDB, lease tables.
    Mysql,
    /// PostgreSQL, session mode (advisory locks: the hold lives with its connection).
    PostgresSession,
    /// MariaDB, session mode (`GET_LOCK`: the hold lives with its connection).
    MysqlSession,
    /// A three-server ZooKeeper ensemble.
    Zookeeper,
    /// A three-member etcd cluster.
    Etcd,
    /// Redlock over five independent Redis servers without persistence.
    Redlock,
    /// Redis Sentinel (`redis+sentinel://`): a master, two replicas, three sentinels; no `WAIT`.
    RedisSentinel,
    /// Redis Sentinel with every grant and renewal confirmed by a replica (`?replicas=1`).
    RedisSentinelWait,
    /// A six-node Redis Cluster (`redis+cluster://`, 3 masters with a replica each); no `WAIT`.
    RedisCluster,
    /// The Redis Cluster with every grant and renewal confirmed by a replica (`?replicas=1`).
    RedisClusterWait,
}

impl Backend {
    /// Every backend, in report order.
    pub const ALL: [Backend; 15] = [
        Backend::Sqlite,
        Backend::SqliteTmpfs,
        Backend::Redis,
        Backend::RedisAof,
        Backend::Postgres,
        Backend::Mysql,
        Backend::PostgresSession,
        Backend::MysqlSession,
        Backend::Zookeeper,
        Backend::Etcd,
        Backend::Redlock,
        Backend::RedisSentinel,
        Backend::RedisSentinelWait,
        Backend::RedisCluster,
        Backend::RedisClusterWait,
    ];

    /// The name used in tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::SqliteTmpfs => "sqlite-tmpfs",
            Backend::Redis => "redis",
            Backend::RedisAof => "redis-aof",
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::PostgresSession => "postgres-session",
            Backend::MysqlSession => "mysql-session",
            Backend::Zookeeper => "zookeeper",
            Backend::Etcd => "etcd",
            Backend::Redlock => "redlock",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::RedisSentinelWait => "redis-sentinel-wait",
            Backend::RedisCluster => "redis-cluster",
            Backend::RedisClusterWait => "redis-cluster-wait",
        }
    }

    /// A Redis deployment with fail-over (Sentinel or Cluster).
    pub fn redis_ha(self) -> bool {
        self.sentinel() || self.cluster()
    }

    /// Redis Sentinel, with or without `WAIT`.
    pub fn sentinel(self) -> bool {
        matches!(self, Backend::RedisSentinel | Backend::RedisSentinelWait)
    }

    /// Redis Cluster, with or without `WAIT`.
    pub fn cluster(self) -> bool {
        matches!(self, Backend::RedisCluster | Backend::RedisClusterWait)
    }

    /// Grants and renewals are confirmed by a replica (`replicas=1`: `WAIT 1`).
    pub fn waits(self) -> bool {
        matches!(self, Backend::RedisSentinelWait | Backend::RedisClusterWait)
    }

    /// Whether grants carry fencing tokens.
    pub fn fencing(self) -> bool {
        self != Backend::Redlock
    }
}

type Shared<T> = Arc<Mutex<T>>;

enum Servers {
    Sqlite(PathBuf),
    SqliteTmpfs(Tmpfs),
    Redis(Shared<RedisServer>),
    Sql(Shared<SqlServer>),
    Zk(Shared<ZkEnsemble>),
    Etcd(Shared<EtcdCluster>),
    Redlock(Vec<Shared<RedisServer>>),
    Sentinel(Shared<RedisSentinel>),
    Cluster(Shared<RedisCluster>),
}

/// The private servers of one backend, started for a run and stopped when dropped.
pub struct StoreEnv {
    /// Which backend.
    pub backend: Backend,
    servers: Servers,
    lease: Duration,
    _dir: tempfile::TempDir,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl StoreEnv {
    /// Starts the private servers of `backend` (blocking: up to tens of seconds for databases,
    /// ZooKeeper, etcd and the Redis fail-over topologies).
    pub fn start(backend: Backend, lease: Duration) -> io::Result<StoreEnv> {
        let dir = dlock_testkit::server_dir("dlock-chaos-", backend.label())?;
        let no_persistence = ["--save", "", "--appendonly", "no"];
        let servers = match backend {
            Backend::Sqlite => Servers::Sqlite(dir.path().join("chaos.db")),
            Backend::SqliteTmpfs => Servers::SqliteTmpfs(Tmpfs::mount(&dir.path().join("fs"))?),
            Backend::Redis => {
                Servers::Redis(Arc::new(Mutex::new(RedisServer::start(&no_persistence)?)))
            }
            Backend::RedisAof => Servers::Redis(Arc::new(Mutex::new(RedisServer::start(&[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])?))),
            // Room for 32 lanes of 8 client processes with 2 connections each, and the ones
            // a killed process leaves until the server notices.
            Backend::Postgres | Backend::PostgresSession => {
                let mut s = SqlServer::start(Db::Postgres)?;
                s.set_max_connections(MAX_CONNECTIONS)?;
                Servers::Sql(Arc::new(Mutex::new(s)))
            }
            Backend::Mysql | Backend::MysqlSession => {
                let mut s = SqlServer::start(Db::MariaDb)?;
                s.set_max_connections(MAX_CONNECTIONS)?;
                Servers::Sql(Arc::new(Mutex::new(s)))
            }
            Backend::Zookeeper => Servers::Zk(Arc::new(Mutex::new(ZkEnsemble::start()?))),
            Backend::Etcd => Servers::Etcd(Arc::new(Mutex::new(EtcdCluster::start()?))),
            Backend::Redlock => Servers::Redlock(
                (0..5)
                    .map(|_| RedisServer::start(&no_persistence).map(|s| Arc::new(Mutex::new(s))))
                    .collect::<io::Result<_>>()?,
            ),
            Backend::RedisSentinel | Backend::RedisSentinelWait => {
                Servers::Sentinel(Arc::new(Mutex::new(RedisSentinel::start()?)))
            }
            Backend::RedisCluster | Backend::RedisClusterWait => {
                Servers::Cluster(Arc::new(Mutex::new(RedisCluster::start()?)))
            }
        };
        Ok(StoreEnv {
            backend,
            servers,
            lease,
            _dir: dir,
        })
    }

    /// The network endpoints of the store (none for SQLite; none for Redis Sentinel and Cluster,
    /// whose clients learn the data nodes' addresses from the servers, so a proxy in front of
    /// the addresses in the URL would not carry their traffic).
    pub fn endpoints(&self) -> Vec<SocketAddr> {
        match &self.servers {
            Servers::Sqlite(_)
            | Servers::SqliteTmpfs(_)
            | Servers::Sentinel(_)
            | Servers::Cluster(_) => vec![],
            Servers::Redis(s) => vec![loopback(lock(s).port)],
            Servers::Sql(s) => vec![loopback(lock(s).port)],
            Servers::Zk(z) => lock(z).client_ports().into_iter().map(loopback).collect(),
            Servers::Etcd(e) => lock(e).client_ports().into_iter().map(loopback).collect(),
            Servers::Redlock(v) => v.iter().map(|s| loopback(lock(s).port)).collect(),
        }
    }

    /// The store URL with `endpoints` in place of the servers' own addresses (one per
    /// [`StoreEnv::endpoints`], in the same order: the client's proxies).
    pub fn url(&self, endpoints: &[SocketAddr]) -> String {
        let hosts = endpoints
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        match (&self.servers, self.backend) {
            (Servers::Sqlite(p), _) => format!("sqlite://{}", p.display()),
            (Servers::SqliteTmpfs(t), _) => {
                format!("sqlite://{}", t.dir.join("chaos.db").display())
            }
            (Servers::Redis(_), _) => format!("redis://{hosts}/"),
            (Servers::Sql(_), Backend::Postgres) => {
                format!("postgres://postgres@{hosts}/postgres?table=dlock_chaos")
            }
            (Servers::Sql(_), Backend::PostgresSession) => {
                format!("postgres://postgres@{hosts}/postgres?table=dlock_chaos&mode=session")
            }
            (Servers::Sql(_), Backend::MysqlSession) => {
                format!("mysql://root@{hosts}/test?table=dlock_chaos&mode=session")
            }
            (Servers::Sql(_), _) => format!("mysql://root@{hosts}/test?table=dlock_chaos"),
            (Servers::Zk(_), _) => format!(
                "zk://{hosts}/dlock-chaos?session_timeout={}ms",
                self.lease.as_millis()
            ),
            // The lease TTL is the ZooKeeper session timeout's counterpart: the lease (etcd
            // counts whole seconds, so rounded up), with each request bounded by half of it.
            (Servers::Etcd(_), _) => {
                let ttl = self.lease.as_secs() + u64::from(self.lease.subsec_nanos() > 0);
                format!(
                    "etcd://{hosts}/dlock-chaos?ttl={ttl}s&timeout={}ms",
                    (ttl * 1000 / 2).max(100)
                )
            }
            (Servers::Redlock(_), _) => format!("redlock://{hosts}"),
            // The servers' own addresses (see `endpoints`), the default timeouts.
            (Servers::Sentinel(s), b) => lock(s).url(if b.waits() { "?replicas=1" } else { "" }),
            (Servers::Cluster(c), b) => lock(c).url(if b.waits() { "?replicas=1" } else { "" }),
        }
    }

    /// The master a fault of `key` aims at: the Sentinel master, or the master of `key`'s slot in
    /// the cluster (with the slot, after checking with `CLUSTER KEYSLOT` that `key` and `tag`,
    /// the lock name that is its hash tag, are both in it).
    pub fn master_of(&self, key: &str, tag: &str) -> io::Result<MasterTarget> {
        match &self.servers {
            Servers::Sentinel(s) => {
                let (node, addr) = lock(s).master_node()?;
                Ok(MasterTarget {
                    node,
                    addr,
                    slot: None,
                })
            }
            Servers::Cluster(c) => {
                let c = lock(c);
                let slot = c.key_slot(key)?;
                let of_tag = c.key_slot(tag)?;
                if slot != of_tag {
                    return Err(io::Error::other(format!(
                        "key {key:?} is in slot {slot}, its hash tag {tag:?} in slot {of_tag}"
                    )));
                }
                let (node, addr) = c.master_node_of(key)?;
                Ok(MasterTarget {
                    node,
                    addr,
                    slot: Some(slot),
                })
            }
            _ => Err(io::Error::other("not a Redis Sentinel or Cluster store")),
        }
    }

    /// Redis Sentinel / Cluster: SIGKILL the master `m`, wait until the fail-over is over, start
    /// the killed node again and wait until it is a replica (so that the next fault finds
    /// replicas again). Returns a description and when the fail-over was over.
    pub fn master_kill(&self, m: &MasterTarget) -> io::Result<(String, i64)> {
        self.master_down(m, false)
    }

    /// Redis Sentinel / Cluster: SIGSTOP the master `m` until the fail-over is over, then SIGCONT
    /// it and wait until it has been demoted to a replica. Returns a description and when it was
    /// continued.
    pub fn master_pause(&self, m: &MasterTarget) -> io::Result<(String, i64)> {
        self.master_down(m, true)
    }

    fn master_down(&self, m: &MasterTarget, pause: bool) -> io::Result<(String, i64)> {
        let t = std::time::Instant::now();
        let secs = |d: Duration| d.as_secs_f64();
        let slot = m.slot.map(|s| format!("slot {s}: ")).unwrap_or_default();
        let what = if pause { "SIGSTOP" } else { "SIGKILL" };
        let (promoted, over, back) = match &self.servers {
            Servers::Sentinel(s) => {
                let s = lock(s);
                if pause {
                    s.pause(&m.node)?;
                } else {
                    s.kill(&m.node)?;
                }
                let new = s.wait_failover(&m.addr);
                let over = now_us();
                let took = t.elapsed();
                if pause {
                    s.resume(&m.node)?;
                } else {
                    s.start_one(&m.node)?;
                }
                let new = new?;
                let node = s.node_of(&new).unwrap_or_default();
                let back = s.wait_replica(&m.node)?;
                (
                    format!("{node} ({new}) master after {:.1} s", secs(took)),
                    over,
                    back,
                )
            }
            Servers::Cluster(c) => {
                let c = lock(c);
                if pause {
                    c.pause(&m.node)?;
                } else {
                    c.kill(&m.node)?;
                }
                let done = c.wait_failover(&m.addr);
                let over = now_us();
                let took = t.elapsed();
                if pause {
                    c.resume(&m.node)?;
                } else {
                    c.start_one(&m.node)?;
                }
                done?;
                let back = c.wait_replica(&m.node)?;
                (
                    format!("its replica master after {:.1} s", secs(took)),
                    over,
                    back,
                )
            }
            _ => return Err(io::Error::other("not a Redis Sentinel or Cluster store")),
        };
        let again = if pause {
            "SIGCONT; "
        } else {
            "started again; "
        };
        Ok((
            format!(
                "{slot}master {} ({}) {what}; {promoted}; {again}{} a replica after {:.1} s more",
                m.node,
                m.addr,
                m.node,
                secs(back)
            ),
            over,
        ))
    }

    /// Redis Cluster: move `key`'s slot (and its keys) to another master while the lock is held.
    /// Returns a description and when the move was over.
    pub fn migrate_slot(&self, key: &str) -> io::Result<(String, i64)> {
        let Servers::Cluster(c) = &self.servers else {
            return Err(io::Error::other("not a Redis Cluster store"));
        };
        let t = std::time::Instant::now();
        let mv = lock(c).migrate_slot(key)?;
        Ok((
            format!(
                "slot {} moved from {} to {} in {:.1} s",
                mv.slot,
                mv.from,
                mv.to,
                t.elapsed().as_secs_f64()
            ),
            now_us(),
        ))
    }

    /// Crash the store and start it again (Redis, PostgreSQL, MariaDB: SIGKILL of the server;
    /// ZooKeeper and etcd: the leader, started again after `down`). Returns a description.
    pub fn restart(&self, down: Duration) -> io::Result<String> {
        match &self.servers {
            Servers::Redis(s) => {
                let mut s = lock(s);
                s.crash();
                std::thread::sleep(down);
                s.spawn()?;
                Ok("redis-server SIGKILL + start".into())
            }
            Servers::Sql(s) => {
                let mut s = lock(s);
                s.crash();
                std::thread::sleep(down);
                s.spawn()?;
                Ok(format!("{:?} SIGKILL + start", s.db))
            }
            Servers::Zk(z) => {
                let z = lock(z);
                let leader = z.leader()?;
                z.kill(leader)?;
                std::thread::sleep(down);
                z.start_one(leader)?;
                Ok(format!("leader (server {leader}) SIGKILL + start"))
            }
            Servers::Etcd(e) => {
                let e = lock(e);
                let leader = e.leader()?;
                e.kill(leader)?;
                std::thread::sleep(down);
                e.start_one(leader)?;
                Ok(format!("leader (member {leader}) SIGKILL + start"))
            }
            _ => Err(io::Error::other("no restart fault for this store")),
        }
    }

    /// Kill every client connection at the store (`CLIENT KILL`, `pg_terminate_backend`, `KILL`).
    /// etcd has no such command: the harness resets the clients' proxies instead
    /// ([`ClientProxies::reset`]).
    pub fn kill_connections(&self) -> io::Result<usize> {
        match &self.servers {
            Servers::Redis(s) => lock(s).kill_client_connections(),
            Servers::Sql(s) => lock(s).kill_client_connections(),
            _ => Err(io::Error::other("no connection-kill fault for this store")),
        }
    }

    /// SIGSTOP the store for `down`, then SIGCONT: the Redis server, the SQL server with every
    /// process it forked (a PostgreSQL backend serves its connection by itself), ZooKeeper's
    /// leader. Returns a description.
    pub fn pause_store(&self, down: Duration) -> io::Result<String> {
        let (pids, what) = match &self.servers {
            Servers::Redis(s) => (lock(s).pid().into_iter().collect(), "redis-server".into()),
            Servers::Sql(s) => {
                let s = lock(s);
                let root = s
                    .pid()
                    .ok_or_else(|| io::Error::other("the SQL server is not running"))?;
                let pids = with_descendants(root);
                let what = format!("{:?} ({} processes)", s.db, pids.len());
                (pids, what)
            }
            Servers::Zk(z) => {
                let z = lock(z);
                let leader = z.leader()?;
                (
                    z.pid(leader).into_iter().collect(),
                    format!("leader (server {leader})"),
                )
            }
            _ => return Err(io::Error::other("no store-pause fault for this store")),
        };
        if pids.is_empty() {
            return Err(io::Error::other(format!("{what} is not running")));
        }
        // The parent first, so it forks nothing new while its children stop. A child that
        // ended between the listing and its signal (a backend whose session closed) is skipped;
        // any other failure resumes what was stopped.
        let resume = |stopped: &[u32]| {
            let mut resumed = Ok(());
            for p in stopped.iter().rev() {
                if let Err(e) = dlock_testkit::signal(*p, Signal::SIGCONT) {
                    resumed = Err(e);
                }
            }
            resumed
        };
        let mut stopped = Vec::with_capacity(pids.len());
        for (i, p) in pids.iter().enumerate() {
            match dlock_testkit::signal(*p, Signal::SIGSTOP) {
                Ok(()) => stopped.push(*p),
                Err(_) if i > 0 && !dlock_testkit::alive(*p) => {}
                Err(e) => {
                    let _ = resume(&stopped);
                    return Err(e);
                }
            }
        }
        std::thread::sleep(down);
        resume(&stopped)?;
        Ok(format!(
            "{what} SIGSTOP {down:?} ({} stopped), SIGCONT",
            stopped.len()
        ))
    }

    /// SQLite on its tmpfs: fill the file system, wait `down`, free it again.
    pub fn fill_disk(&self, down: Duration) -> io::Result<String> {
        let Servers::SqliteTmpfs(t) = &self.servers else {
            return Err(io::Error::other("no disk-full fault for this store"));
        };
        let filled = t.fill()?;
        std::thread::sleep(down);
        t.free()?;
        Ok(format!(
            "{} filled ({filled} bytes more) for {down:?}, then freed",
            t.dir.display()
        ))
    }

    /// etcd: SIGSTOP the leader (a member that keeps its sockets open and answers nothing, to its
    /// peers or its clients), wait `down`, SIGCONT it.
    pub fn pause_leader(&self, down: Duration) -> io::Result<String> {
        let Servers::Etcd(e) = &self.servers else {
            return Err(io::Error::other("no member-pause fault for this store"));
        };
        let e = lock(e);
        let leader = e.leader()?;
        e.pause(leader)?;
        std::thread::sleep(down);
        e.resume(leader)?;
        Ok(format!(
            "leader (member {leader}) SIGSTOP {down:?}, SIGCONT"
        ))
    }

    /// Redlock: stop the first `n` of the five servers, wait `down`, start them again (empty).
    pub fn redlock_down(&self, n: usize, down: Duration) -> io::Result<String> {
        let Servers::Redlock(v) = &self.servers else {
            return Err(io::Error::other("not a Redlock store"));
        };
        for s in v.iter().take(n) {
            lock(s).stop();
        }
        std::thread::sleep(down);
        for s in v.iter().take(n) {
            lock(s).spawn()?;
        }
        Ok(format!(
            "{n} of 5 servers stopped for {down:?}, started again empty"
        ))
    }
}

/// The master a Redis Sentinel or Cluster fault aims at.
#[derive(Debug, Clone)]
pub struct MasterTarget {
    /// Its node name (`n1`..`n3`, `c1`..`c6`) and `host:port`.
    pub node: String,
    pub addr: String,
    /// The cluster slot of the lock's keys.
    pub slot: Option<u16>,
}

/// One client's proxies, one per store endpoint.
pub struct ClientProxies(pub Vec<TcpProxy>);

impl ClientProxies {
    /// A proxy in front of each endpoint.
    pub async fn start(endpoints: &[SocketAddr]) -> io::Result<ClientProxies> {
        let mut v = Vec::new();
        for e in endpoints {
            v.push(TcpProxy::start(*e).await?);
        }
        Ok(ClientProxies(v))
    }

    /// The proxies' addresses, in endpoint order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.0.iter().map(|p| p.addr()).collect()
    }

    /// Delays the client's traffic by `d` (zero: none).
    pub fn set_delay(&self, d: Duration) {
        for p in &self.0 {
            p.set_delay(d);
        }
    }

    /// Black-holes the client's traffic (or ends that).
    pub fn black_hole(&self, on: bool) {
        for p in &self.0 {
            p.black_hole(on);
        }
    }

    /// Closes every connection of the client now (it sees a reset); returns how many there were.
    pub fn reset(&self) -> usize {
        self.0.iter().map(TcpProxy::reset).sum()
    }
}

/// `root` and every process it forked, transitively, parents before children (from /proc).
fn with_descendants(root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            // Field 4 of /proc/PID/stat, after the command name in parentheses.
            let ppid = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|st| {
                    let rest = st.rsplit_once(')')?.1.to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                });
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// A tmpfs the harness mounted (root only), unmounted when dropped.
pub struct Tmpfs {
    dir: PathBuf,
}

/// The size of the SQLite file system: room for the lock table and its WAL, small enough to
/// fill in a moment.
const TMPFS_SIZE: &str = "16m";

impl Tmpfs {
    fn mount(dir: &std::path::Path) -> io::Result<Tmpfs> {
        std::fs::create_dir_all(dir)?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_SIZE}"), "tmpfs"])
            .arg(dir)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "cannot mount a tmpfs on {} for the full-filesystem fault (it needs root): {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }

    fn filler(&self) -> PathBuf {
        self.dir.join("filler")
    }

    /// Writes a filler file until the file system is full; returns the bytes written.
    fn fill(&self) -> io::Result<u64> {
        use std::io::Write;
        let mut f = std::fs::File::create(self.filler())?;
        let chunk = vec![0u8; 64 * 1024];
        let mut n = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => return Ok(n),
                Ok(k) => n += k as u64,
                // ENOSPC (io::ErrorKind::StorageFull is newer than the MSRV).
                Err(e) if e.raw_os_error() == Some(28) => return Ok(n),
                Err(e) => return Err(e),
            }
        }
    }

    fn free(&self) -> io::Result<()> {
        std::fs::remove_file(self.filler())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(&self.dir)
            .status();
    }
}

/// Client connections the private PostgreSQL and MariaDB servers admit.
const MAX_CONNECTIONS: u32 = 600;

/// The Redis Cluster slot of the lock name `name` (its keys are `dlock:{NAME}…`, the name their
/// hash tag): CRC16/XMODEM of the name, modulo 16384.
pub fn cluster_slot(name: &str) -> u16 {
    let mut crc: u16 = 0;
    for b in name.bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod slot_tests {
    #[test]
    fn cluster_slots_are_redis_own() {
        // The CRC16/XMODEM check value, and `CLUSTER KEYSLOT foo` / `bar` of a Redis server.
        assert_eq!(super::cluster_slot("123456789"), 0x31C3);
        assert_eq!(super::cluster_slot("foo"), 12182);
        assert_eq!(super::cluster_slot("bar"), 5061);
    }
}
