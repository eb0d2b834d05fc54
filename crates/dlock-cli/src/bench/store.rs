//! What the bench knows about a store: its URL and kind, a dlock client whose backend calls are
//! counted, the raw floor (the same client library without lock logic), and probes of the
//! store's own counters (commands, memory) and of this process's connections to it.

use dlock::backend::{
    Acquisition, Attempt, Backend, Busy, Capabilities, Extended, HoldRef, LockInfo, Look, Released,
    Request, Watch,
};
use dlock::{Client, ClientOptions, LockName};
use serde::Serialize;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The kind of store behind a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `sqlite:`
    Sqlite,
    /// `redis://`, `rediss://`
    Redis,
    /// `redlock://`
    Redlock,
    /// `postgres://`
    Postgres,
    /// `mysql://`, `mariadb://`
    Mysql,
    /// `zk://`
    Zk,
    /// `etcd://`, `etcds://`
    Etcd,
    /// `redis+sentinel://`: the master Sentinel names.
    #[serde(rename = "redis-sentinel")]
    RedisSentinel,
    /// `redis+cluster://`: a Redis Cluster.
    #[serde(rename = "redis-cluster")]
    RedisCluster,
}

impl Kind {
    /// The short name shown in tables.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sqlite => "sqlite",
            Kind::Redis => "redis",
            Kind::Redlock => "redlock",
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
            Kind::Zk => "zookeeper",
            Kind::Etcd => "etcd",
            Kind::RedisSentinel => "redis-sentinel",
            Kind::RedisCluster => "redis-cluster",
        }
    }

    /// A Redis URL that takes dlock's `replicas=N` (each grant and renewal then `WAIT`s).
    pub fn takes_replicas(self) -> bool {
        matches!(self, Kind::Redis | Kind::RedisSentinel | Kind::RedisCluster)
    }
}

/// One store to bench.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL given (or made) for dlock, with the bench's own table option added for SQL.
    pub url: String,
    /// The URL without its password, for reports.
    pub shown: String,
    /// The kind of store.
    pub kind: Kind,
    /// `host:port` of every server (empty for SQLite).
    pub servers: Vec<(String, u16)>,
    /// Userinfo (`user:pass@`) of the URL, reused for raw connections.
    pub userinfo: String,
    /// The SQLite file.
    pub sqlite_path: Option<PathBuf>,
    /// Tables the bench created and drops at the end (SQL stores, when it chose the table).
    pub own_tables: bool,
}

/// The table the bench uses on SQL stores unless the URL names one.
pub const BENCH_TABLE: &str = "dlock_bench";

pub(super) fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Target {
    /// Reads a store URL. Errors are messages for the user.
    pub fn parse(url: &str) -> Result<Target, String> {
        let (scheme, rest) = url
            .split_once(':')
            .ok_or_else(|| format!("{url:?} is not a store URL"))?;
        let kind = match scheme {
            "sqlite" => Kind::Sqlite,
            "redis" | "rediss" => Kind::Redis,
            "redlock" => Kind::Redlock,
            "postgres" | "postgresql" => Kind::Postgres,
            "mysql" | "mariadb" => Kind::Mysql,
            "zk" => Kind::Zk,
            "etcd" | "etcds" => Kind::Etcd,
            "redis+sentinel" => Kind::RedisSentinel,
            "redis+cluster" => Kind::RedisCluster,
            "rediss+sentinel" | "rediss+cluster" => {
                return Err(format!(
                    "{}: TLS to Sentinel or Cluster deployments is not supported by dlock yet \
                     (use redis+sentinel:// or redis+cluster://)",
                    dlock::redact_url(url)
                ))
            }
            "mem" => {
                return Err(
                    "mem:// lives in one process: bench a shared store (sqlite, redis, \
                     redis+sentinel, redis+cluster, redlock, postgres, mysql, zk, etcd)"
                        .into(),
                )
            }
            _ => return Err(format!("unknown store scheme {scheme:?} in --url")),
        };
        let shown = dlock::redact_url(url);
        if kind == Kind::Sqlite {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            let path = path.split('?').next().unwrap_or(path);
            return Ok(Target {
                url: url.to_string(),
                shown,
                kind,
                servers: Vec::new(),
                userinfo: String::new(),
                sqlite_path: Some(PathBuf::from(pct_decode(path))),
                own_tables: false,
            });
        }
        let rest = rest
            .strip_prefix("//")
            .ok_or_else(|| format!("{shown}: expected {scheme}://host…"))?;
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), authority),
        };
        let default_port = match kind {
            Kind::Redis | Kind::Redlock | Kind::RedisCluster => 6379,
            Kind::RedisSentinel => 26379,
            Kind::Postgres => 5432,
            Kind::Mysql => 3306,
            Kind::Zk => 2181,
            Kind::Etcd => 2379,
            Kind::Sqlite => 0,
        };
        let mut servers = Vec::new();
        for h in hosts.split(',').filter(|h| !h.is_empty()) {
            let (host, port) = match h.rsplit_once(':') {
                Some((host, p)) if !host.ends_with(']') || h.starts_with('[') => (
                    host.to_string(),
                    p.parse::<u16>()
                        .map_err(|_| format!("{shown}: bad port in {h:?}"))?,
                ),
                _ => (h.to_string(), default_port),
            };
            servers.push((host, port));
        }
        if servers.is_empty() {
            return Err(format!("{shown}: no server in the URL"));
        }
        let mut url = url.to_string();
        let mut own_tables = false;
        if matches!(kind, Kind::Postgres | Kind::Mysql) && !url.contains("table=") {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str("table=");
            url.push_str(BENCH_TABLE);
            own_tables = true;
        }
        Ok(Target {
            url,
            shown,
            kind,
            servers,
            userinfo,
            sqlite_path: None,
            own_tables,
        })
    }

    /// A short label for tables: the kind and, for several servers, their number; `+wait` when
    /// every grant and renewal waits for a replica (`replicas=1`; `+wait×N` for N).
    pub fn label(&self) -> String {
        let wait = match self.replicas() {
            0 => String::new(),
            1 => "+wait".into(),
            n => format!("+wait×{n}"),
        };
        match self.kind {
            Kind::Redlock => format!("redlock×{}", self.servers.len()),
            Kind::Zk => format!("zookeeper×{}", self.servers.len()),
            Kind::Etcd => format!("etcd×{}", self.servers.len()),
            k => format!("{}{wait}", k.name()),
        }
    }

    /// The target U1 runs on. ZooKeeper: the URL's first server only, for dlock's session, the
    /// raw floor's and the peers' alike. A client connects to a server of the connect string
    /// chosen at random, and a pair through the leader is faster than through a follower, so
    /// sessions on different servers would not compare like with like.
    pub fn u1_target(&self) -> Target {
        let mut t = self.clone();
        if self.kind != Kind::Zk || self.servers.len() < 2 {
            return t;
        }
        let (scheme, rest) = self.url.split_once("://").unwrap_or(("zk", &self.url));
        let rest = rest.split_once('@').map_or(rest, |(_, r)| r);
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (h, p) = &self.servers[0];
        t.url = format!("{scheme}://{}{h}:{p}{}", self.userinfo, &rest[end..]);
        t.servers.truncate(1);
        t
    }

    /// The value of the URL's query option `key`, percent-decoded.
    pub fn option(&self, key: &str) -> Option<String> {
        let query = self.url.split_once('?').map(|(_, q)| q)?;
        query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (pct_decode(k) == key).then(|| pct_decode(v))
        })
    }

    /// `replicas=N` of a Redis URL (0 without it, and on other stores).
    pub fn replicas(&self) -> u32 {
        if !self.kind.takes_replicas() {
            return 0;
        }
        self.option("replicas")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `replicas_timeout` of a Redis URL, in ms (dlock's default 500 ms): `500ms`, `1s`, or a bare
    /// number of seconds, as dlock reads it.
    pub fn replicas_timeout_ms(&self) -> u64 {
        self.option("replicas_timeout")
            .and_then(|v| {
                let v = v.trim();
                let d = match v.parse::<f64>() {
                    Ok(secs) if secs.is_finite() && (0.0..=86_400.0).contains(&secs) => {
                        Duration::from_secs_f64(secs)
                    }
                    _ => humantime::parse_duration(v).ok()?,
                };
                Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            })
            .unwrap_or(500)
    }

    /// `WAIT replicas timeout_ms` after each grant of a `replicas=N` URL, as dlock sends it.
    pub fn wait(&self) -> Option<(u32, u64)> {
        let n = self.replicas();
        (n > 0).then(|| (n, self.replicas_timeout_ms()))
    }

    /// The userinfo's user and password, percent-decoded (Sentinel and Cluster clients take
    /// them apart).
    pub fn credentials(&self) -> (Option<String>, Option<String>) {
        let Some(ui) = self.userinfo.strip_suffix('@') else {
            return (None, None);
        };
        let (u, p) = match ui.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (ui, None),
        };
        (
            Some(pct_decode(u)).filter(|u| !u.is_empty()),
            p.map(pct_decode),
        )
    }

    /// `redis://[userinfo]host:port/` of each Redis server (Redis and Redlock).
    pub fn redis_urls(&self) -> Vec<String> {
        let tls = self.url.starts_with("rediss://");
        let db = if self.kind == Kind::Redis {
            // Keep the database number of a single-server URL.
            let rest = &self.url[self.url.find("://").map(|i| i + 3).unwrap_or(0)..];
            rest.find('/')
                .map(|i| rest[i + 1..].split('?').next().unwrap_or("").to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        self.servers
            .iter()
            .map(|(h, p)| {
                format!(
                    "{}://{}{h}:{p}/{db}",
                    if tls { "rediss" } else { "redis" },
                    self.userinfo
                )
            })
            .collect()
    }

    /// `etcds://` (TLS).
    pub fn etcd_tls(&self) -> bool {
        self.url.starts_with("etcds://")
    }

    /// `http://host:port` (or `https://`) of every etcd member.
    pub fn etcd_endpoints(&self) -> Vec<String> {
        let scheme = if self.etcd_tls() { "https" } else { "http" };
        self.servers
            .iter()
            .map(|(h, p)| format!("{scheme}://{h}:{p}"))
            .collect()
    }

    /// The key prefix of an etcd URL (its path; dlock's default `dlock`).
    pub fn etcd_prefix(&self) -> String {
        let rest = &self.url[self.url.find("://").map(|i| i + 3).unwrap_or(0)..];
        let path = rest.split('?').next().unwrap_or("");
        let path = path.find('/').map(|i| &path[i..]).unwrap_or("");
        let prefix = pct_decode(path.trim_matches('/'));
        if prefix.is_empty() {
            "dlock".into()
        } else {
            prefix
        }
    }

    /// The URL without dlock's own query options (for sqlx).
    pub fn plain_sql_url(&self) -> String {
        self.url.split('?').next().unwrap_or(&self.url).to_string()
    }
}

/// Backend calls made by one client (client-side counts, exact).
#[derive(Debug, Default)]
pub struct Counts {
    /// `acquire` calls (attempts).
    pub acquire: AtomicU64,
    /// `wait` calls.
    pub wait: AtomicU64,
    /// `release` calls.
    pub release: AtomicU64,
    /// `extend` calls (one per renewal batch).
    pub extend: AtomicU64,
    /// Holds extended (summed over `extend` calls).
    pub extended: AtomicU64,
    /// `cancel` calls.
    pub cancel: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct CountSnap {
    /// `acquire` calls.
    pub acquire: u64,
    /// `wait` calls.
    pub wait: u64,
    /// `release` calls.
    pub release: u64,
    /// `extend` calls.
    pub extend: u64,
    /// Holds extended.
    pub extended: u64,
    /// `cancel` calls.
    pub cancel: u64,
}

impl Counts {
    /// The current values.
    pub fn snap(&self) -> CountSnap {
        CountSnap {
            acquire: self.acquire.load(Ordering::Relaxed),
            wait: self.wait.load(Ordering::Relaxed),
            release: self.release.load(Ordering::Relaxed),
            extend: self.extend.load(Ordering::Relaxed),
            extended: self.extended.load(Ordering::Relaxed),
            cancel: self.cancel.load(Ordering::Relaxed),
        }
    }
}

impl CountSnap {
    /// Calls that reach the store (acquire, release, extend, cancel; `wait` may not).
    pub fn store_calls(&self) -> u64 {
        self.acquire + self.release + self.extend + self.cancel
    }

    /// Adds another snapshot.
    pub fn add(&mut self, o: &CountSnap) {
        self.acquire += o.acquire;
        self.wait += o.wait;
        self.release += o.release;
        self.extend += o.extend;
        self.extended += o.extended;
        self.cancel += o.cancel;
    }
}

/// A backend that counts the calls the core makes and passes them on.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Backend>,
    counts: Arc<Counts>,
}

#[async_trait::async_trait]
impl Backend for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        Box::new(CountingAcquisition {
            inner: self.inner.begin(req),
            counts: self.counts.clone(),
        })
    }
    fn shared_key(&self) -> Option<String> {
        self.inner.shared_key()
    }
    fn call_timeout(&self) -> Option<std::time::Duration> {
        self.inner.call_timeout()
    }
    async fn release(&self, hold: &HoldRef<'_>) -> dlock::Result<Released> {
        self.counts.release.fetch_add(1, Ordering::Relaxed);
        self.inner.release(hold).await
    }
    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> dlock::Result<Vec<Extended>> {
        self.counts.extend.fetch_add(1, Ordering::Relaxed);
        self.counts
            .extended
            .fetch_add(holds.len() as u64, Ordering::Relaxed);
        self.inner.extend(holds, detach).await
    }
    async fn describe(&self, prefix: &str) -> dlock::Result<Vec<LockInfo>> {
        self.inner.describe(prefix).await
    }
    async fn force_release(
        &self,
        name: &LockName,
        how: dlock::Force,
    ) -> dlock::Result<dlock::Forced> {
        self.inner.force_release(name, how).await
    }
    fn session_timeout(&self) -> Option<std::time::Duration> {
        self.inner.session_timeout()
    }
}

/// An acquisition whose attempts, waits and cancels are counted (a wait's looks are part of it,
/// so the counts compare with earlier runs).
struct CountingAcquisition {
    inner: Box<dyn Acquisition>,
    counts: Arc<Counts>,
}

#[async_trait::async_trait]
impl Acquisition for CountingAcquisition {
    async fn attempt(&mut self) -> dlock::Result<Attempt> {
        self.counts.acquire.fetch_add(1, Ordering::Relaxed);
        self.inner.attempt().await
    }
    async fn changed(&mut self, busy: &Busy, until: Instant) -> dlock::Result<Watch> {
        self.counts.wait.fetch_add(1, Ordering::Relaxed);
        self.inner.changed(busy, until).await
    }
    async fn look(&mut self) -> dlock::Result<Option<Look>> {
        self.inner.look().await
    }
    async fn cancel(&mut self) -> dlock::Result<()> {
        self.counts.cancel.fetch_add(1, Ordering::Relaxed);
        self.inner.cancel().await
    }
}

/// Opens the backend of `url` the way `dlock::connect` does.
async fn open_backend(t: &Target) -> dlock::Result<Arc<dyn Backend>> {
    use dlock::backend as b;
    Ok(match t.kind {
        Kind::Sqlite => {
            let path = t
                .sqlite_path
                .as_ref()
                .ok_or_else(|| dlock::Error::InvalidConfig("no sqlite path".into()))?;
            Arc::new(b::sql::sqlite::SqliteBackend::open(path).await?)
        }
        Kind::Redis | Kind::RedisSentinel | Kind::RedisCluster => {
            Arc::new(b::redis::RedisBackend::connect(&t.url).await?)
        }
        Kind::Redlock => Arc::new(b::redlock::RedlockBackend::connect(&t.url).await?),
        Kind::Postgres | Kind::Mysql => Arc::new(b::sql::SqlBackend::open(&t.url).await?),
        Kind::Zk => Arc::new(b::zookeeper::ZooKeeperBackend::connect(&t.url).await?),
        Kind::Etcd => Arc::new(b::etcd::EtcdBackend::connect(&t.url).await?),
    })
}

/// A dlock client on `t` whose backend calls are counted.
pub async fn counted_client(t: &Target, lease: Duration) -> dlock::Result<(Client, Arc<Counts>)> {
    let counts = Arc::new(Counts::default());
    let backend = Arc::new(Counting {
        inner: open_backend(t).await?,
        counts: counts.clone(),
    });
    let client = Client::with_backend(backend, &t.url, ClientOptions::default().lease(lease))?;
    Ok((client, counts))
}

/// Runs `f` with a time limit; a store that does not answer is an error, never a hang.
pub async fn limit<T, E: std::fmt::Display>(
    what: &str,
    d: Duration,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(d, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {d:?}")),
    }
}

const OP: Duration = Duration::from_secs(10);

/// The raw floor of one acquire + release: the same client library, no lock logic.
pub enum Floor {
    /// Redis / Redlock: `SET` then `EVALSHA` of a no-op script on each server (the connection
    /// type dlock uses, `ConnectionManager`), the servers of Redlock in parallel; with
    /// `replicas=N` the `SET` is pipelined with `WAIT N replicas_timeout`, as dlock's grants are.
    Redis(
        Vec<redis::aio::ConnectionManager>,
        redis::Script,
        Option<(u32, u64)>,
    ),
    /// Redis Sentinel: the same pair on one `MultiplexedConnection` to the master redis-rs's
    /// `SentinelClient` names (what dlock's store holds).
    Sentinel(
        redis::aio::MultiplexedConnection,
        redis::Script,
        Option<(u32, u64)>,
    ),
    /// Redis Cluster: the same pair through redis-rs's async `ClusterConnection`, the no-op
    /// script given the key so that both go to the key's master (as dlock's scripts do).
    Cluster(
        redis::cluster_async::ClusterConnection,
        redis::Script,
        Option<(u32, u64)>,
    ),
    /// SQL stores and SQLite through sqlx `Any` (the driver dlock uses): one autocommitted
    /// `INSERT` and one `DELETE` of a row (a lock without rules), and `SELECT 1` pings.
    Sql {
        /// One connection.
        pool: sqlx::AnyPool,
        /// `$1` placeholders (PostgreSQL) or `?`.
        dollar: bool,
        /// The row name's prefix; every pair uses a new name (as dlock's holds have new owners),
        /// so the floor does not pile up dead versions of one key.
        key: String,
        /// Pairs done.
        seq: AtomicU64,
    },
    /// ZooKeeper: create and delete an ephemeral node with `zookeeper-client`.
    Zk {
        /// The session.
        client: zookeeper_client::Client,
        /// The node.
        path: String,
    },
    /// etcd: put a key with a lease, then delete it, with `etcd-client` (one `Client`, as
    /// dlock's store has, connected the same way).
    Etcd {
        /// The client (boxed: an `etcd_client::Client` is several KiB).
        client: Box<etcd_client::Client>,
        /// The floor's own lease (granted once, like dlock's one lease per client).
        lease: i64,
        /// The key.
        key: String,
    },
}

/// The lease of the etcd floor: long enough for a whole run without keep-alives (which would
/// show in S1's keep-alive count); revoked at the end.
const ETCD_FLOOR_LEASE_S: i64 = 3600;

/// An `etcd-client` connection to the members of `t`, with the options dlock's etcd store uses
/// (its default 5 s timeouts, HTTP/2 keep-alive every 10 s while streams are open, require-leader, the URL's user and
/// TLS with the system's roots or `ca=`).
pub async fn etcd_connect(t: &Target) -> Result<etcd_client::Client, String> {
    let timeout = Duration::from_secs(5);
    let mut opts = etcd_client::ConnectOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout)
        .with_keep_alive(Duration::from_secs(10), timeout)
        .with_keep_alive_while_idle(false)
        .with_require_leader(true);
    if let Some(userinfo) = t.userinfo.strip_suffix('@') {
        let (u, p) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        opts = opts.with_user(pct_decode(u), pct_decode(p));
    }
    if t.etcd_tls() {
        let mut tls = etcd_client::TlsOptions::new().with_native_roots();
        let query = t.url.split_once('?').map(|(_, q)| q).unwrap_or("");
        if let Some(ca) = query.split('&').find_map(|kv| kv.strip_prefix("ca=")) {
            let path = pct_decode(ca);
            let pem = std::fs::read(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        opts = opts.with_tls(tls);
    }
    limit(
        "etcd connection",
        timeout * 2,
        etcd_client::Client::connect(t.etcd_endpoints(), Some(opts)),
    )
    .await
}

/// What the floor measures, for the report.
pub fn floor_what(t: &Target) -> String {
    let what = match t.kind {
        Kind::Redis => "SET + EVALSHA(no-op), 2 round trips",
        Kind::RedisSentinel => {
            "SET + EVALSHA(no-op), 2 round trips, one MultiplexedConnection to the master \
             redis-rs's SentinelClient names"
        }
        Kind::RedisCluster => {
            "SET + EVALSHA(no-op, with the key), 2 round trips to the key's master through \
             redis-rs's async ClusterConnection"
        }
        Kind::Redlock => "SET + EVALSHA(no-op) on every server in parallel, 2 rounds",
        Kind::Postgres | Kind::Mysql | Kind::Sqlite => {
            "INSERT + DELETE of one row, autocommit (2 statements); ping = 2× SELECT 1"
        }
        Kind::Zk => "create + delete of an ephemeral node; U1 through the URL's first server",
        Kind::Etcd => "put (with a lease) + delete of one key, one etcd-client Client",
    };
    match t.wait() {
        Some((n, ms)) => {
            format!("{what}; the SET pipelined with WAIT {n} {ms} (a confirmed grant)")
        }
        None => what.to_string(),
    }
}

/// The raw floor's key on Redis.
const REDIS_FLOOR_KEY: &str = "dlockbench:scratch";

/// `SET key 1 PX 10000`, with `WAIT n ms` in the same pipeline (its answer must be ≥ n, as
/// dlock takes back a grant fewer replicas confirm).
async fn redis_set<C: redis::aio::ConnectionLike + Send>(
    c: &mut C,
    wait: Option<(u32, u64)>,
) -> Result<(), String> {
    let mut set = redis::cmd("SET");
    set.arg(REDIS_FLOOR_KEY).arg("1").arg("PX").arg(10_000);
    let Some((n, ms)) = wait else {
        // One command, as dlock's grant without `replicas` is one EVALSHA.
        limit("SET", OP, set.query_async::<redis::Value>(c)).await?;
        return Ok(());
    };
    let mut pipe = redis::pipe();
    pipe.add_command(set).cmd("WAIT").arg(n).arg(ms);
    let out = limit("SET + WAIT", OP, pipe.query_async::<Vec<redis::Value>>(c)).await?;
    let got = match out.last() {
        Some(redis::Value::Int(i)) => *i,
        other => return Err(format!("WAIT: unexpected answer {other:?}")),
    };
    if got < i64::from(n) {
        return Err(format!(
            "WAIT: {got} of {n} replicas confirmed the SET within {ms} ms"
        ));
    }
    Ok(())
}

/// The floor's table on SQL stores.
const FLOOR_TABLE: &str = "dlock_bench_floor";

impl Floor {
    /// Connects the floor's client.
    pub async fn open(t: &Target, run: &str) -> Result<Floor, String> {
        match t.kind {
            Kind::Redis | Kind::Redlock => {
                let mut v = Vec::new();
                for u in t.redis_urls() {
                    let client = redis::Client::open(u.as_str()).map_err(|e| e.to_string())?;
                    v.push(
                        limit(
                            "raw redis connection",
                            OP,
                            redis::aio::ConnectionManager::new(client),
                        )
                        .await?,
                    );
                }
                Ok(Floor::Redis(v, redis::Script::new("return 1"), t.wait()))
            }
            Kind::RedisSentinel => {
                let (client, _) = super::redis_ha::sentinel_master(t).await?;
                let conn = limit(
                    "raw connection to the master",
                    OP,
                    client.get_multiplexed_async_connection_with_config(
                        &super::redis_ha::connection_config(),
                    ),
                )
                .await?;
                Ok(Floor::Sentinel(
                    conn,
                    redis::Script::new("return 1"),
                    t.wait(),
                ))
            }
            Kind::RedisCluster => Ok(Floor::Cluster(
                super::redis_ha::cluster_connection(t).await?,
                redis::Script::new("return 1"),
                t.wait(),
            )),
            Kind::Postgres | Kind::Mysql | Kind::Sqlite => {
                sqlx::any::install_default_drivers();
                let (url, dollar) = match t.kind {
                    Kind::Sqlite => {
                        let p = t.sqlite_path.as_ref().ok_or("no sqlite path")?;
                        (format!("sqlite://{}?mode=rwc", p.display()), false)
                    }
                    Kind::Postgres => (t.plain_sql_url(), true),
                    _ => (t.plain_sql_url(), false),
                };
                let options = sqlx::any::AnyPoolOptions::new()
                    .max_connections(1)
                    .min_connections(1);
                // As dlock's pools: SQLite's never pings, the servers' ping a connection only
                // after it sat idle.
                let options = match t.kind {
                    Kind::Sqlite => options.test_before_acquire(false),
                    _ => dlock::backend::sql::ping_when_idle(options),
                };
                let pool = limit("raw sql connection", OP, options.connect(&url)).await?;
                if t.kind == Kind::Sqlite {
                    // The settings dlock's SQLite store uses.
                    for p in [
                        "PRAGMA journal_mode=WAL",
                        "PRAGMA synchronous=FULL",
                        "PRAGMA busy_timeout=5000",
                    ] {
                        limit("sqlite pragma", OP, sqlx::query(p).execute(&pool)).await?;
                    }
                }
                let ddl = format!(
                    "CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (name VARCHAR(255) PRIMARY KEY, \
                     owner VARCHAR(64) NOT NULL, expires_ms BIGINT NOT NULL)"
                );
                limit("create floor table", OP, sqlx::query(&ddl).execute(&pool)).await?;
                Ok(Floor::Sql {
                    pool,
                    dollar,
                    key: format!("floor/{run}/"),
                    seq: AtomicU64::new(0),
                })
            }
            Kind::Zk => {
                let hosts: Vec<String> =
                    t.servers.iter().map(|(h, p)| format!("{h}:{p}")).collect();
                let client = limit(
                    "raw zookeeper session",
                    OP,
                    zookeeper_client::Client::connect(&hosts.join(",")),
                )
                .await?;
                Ok(Floor::Zk {
                    client,
                    path: format!("/dlock-bench-floor-{run}"),
                })
            }
            Kind::Etcd => {
                let mut client = etcd_connect(t).await?;
                let lease = limit(
                    "floor lease",
                    OP,
                    client.lease_grant(ETCD_FLOOR_LEASE_S, None),
                )
                .await?
                .id();
                Ok(Floor::Etcd {
                    client: Box::new(client),
                    lease,
                    key: format!("{}/dlock-bench-floor/{run}", t.etcd_prefix()),
                })
            }
        }
    }

    /// One raw acquire + release equivalent.
    pub async fn once(&self) -> Result<(), String> {
        match self {
            Floor::Redis(servers, noop, wait) => {
                let r = join(servers.iter().map(|c| {
                    let mut c = c.clone();
                    async move { redis_set(&mut c, *wait).await }
                }))
                .await;
                r.into_iter().collect::<Result<Vec<_>, String>>()?;
                let r =
                    join(servers.iter().map(|c| {
                        let mut c = c.clone();
                        let call = noop.prepare_invoke();
                        async move {
                            limit("EVALSHA", OP, call.invoke_async::<redis::Value>(&mut c)).await
                        }
                    }))
                    .await;
                r.into_iter().collect::<Result<Vec<_>, String>>()?;
                Ok(())
            }
            Floor::Sentinel(conn, noop, wait) => {
                let mut c = conn.clone();
                redis_set(&mut c, *wait).await?;
                let call = noop.prepare_invoke();
                limit("EVALSHA", OP, call.invoke_async::<redis::Value>(&mut c)).await?;
                Ok(())
            }
            Floor::Cluster(conn, noop, wait) => {
                let mut c = conn.clone();
                redis_set(&mut c, *wait).await?;
                let mut call = noop.prepare_invoke();
                call.key(REDIS_FLOOR_KEY);
                limit("EVALSHA", OP, call.invoke_async::<redis::Value>(&mut c)).await?;
                Ok(())
            }
            Floor::Sql {
                pool,
                dollar,
                key,
                seq,
            } => {
                let key = format!("{key}{}", seq.fetch_add(1, Ordering::Relaxed));
                let (ins, del) = if *dollar {
                    (
                        format!(
                            "INSERT INTO {FLOOR_TABLE} (name, owner, expires_ms) VALUES ($1, $2, $3)"
                        ),
                        format!("DELETE FROM {FLOOR_TABLE} WHERE name = $1 AND owner = $2"),
                    )
                } else {
                    (
                        format!(
                            "INSERT INTO {FLOOR_TABLE} (name, owner, expires_ms) VALUES (?, ?, ?)"
                        ),
                        format!("DELETE FROM {FLOOR_TABLE} WHERE name = ? AND owner = ?"),
                    )
                };
                let owner = "0123456789abcdef0123456789abcdef";
                limit(
                    "floor insert",
                    OP,
                    sqlx::query(&ins)
                        .bind(key.as_str())
                        .bind(owner)
                        .bind(30_000_i64)
                        .execute(pool),
                )
                .await?;
                limit(
                    "floor delete",
                    OP,
                    sqlx::query(&del)
                        .bind(key.as_str())
                        .bind(owner)
                        .execute(pool),
                )
                .await?;
                Ok(())
            }
            Floor::Zk { client, path } => {
                let opts = zookeeper_client::CreateMode::Ephemeral
                    .with_acls(zookeeper_client::Acls::anyone_all());
                limit("floor create", OP, client.create(path, b"", &opts)).await?;
                limit("floor delete", OP, client.delete(path, None)).await?;
                Ok(())
            }
            Floor::Etcd { client, lease, key } => {
                let mut c = (**client).clone();
                let put = etcd_client::PutOptions::new().with_lease(*lease);
                limit("floor put", OP, c.put(key.as_str(), "", Some(put))).await?;
                limit("floor delete", OP, c.delete(key.as_str(), None)).await?;
                Ok(())
            }
        }
    }

    /// Two `SELECT 1` round trips (SQL stores only).
    pub async fn ping(&self) -> Option<Result<(), String>> {
        match self {
            Floor::Sql { pool, .. } => Some(
                async {
                    for _ in 0..2 {
                        limit("ping", OP, sqlx::query("SELECT 1").execute(pool)).await?;
                    }
                    Ok(())
                }
                .await,
            ),
            _ => None,
        }
    }

    /// Drops the floor's table (SQL), revokes the floor's lease (etcd).
    pub async fn cleanup(&self) {
        if let Floor::Etcd { client, lease, .. } = self {
            let mut c = (**client).clone();
            let _ = limit("floor lease revoke", OP, c.lease_revoke(*lease)).await;
        }
        if let Floor::Sql { pool, .. } = self {
            let _ = limit(
                "drop floor table",
                OP,
                sqlx::query(&format!("DROP TABLE IF EXISTS {FLOOR_TABLE}")).execute(pool),
            )
            .await;
            pool.close().await;
        }
    }
}

/// Runs futures concurrently on the current task and collects their outputs in order.
pub async fn join<F: std::future::Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    let mut futs: Vec<Option<_>> = futs.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, slot) in futs.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        outs[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outs.into_iter().flatten().collect()
}

/// The store's own counters: commands (or transactions, statements, packets) served and memory
/// used, read from the server. `None` where the store has no such counter.
pub struct Probe {
    kind: Kind,
    /// Redis: one connection to each server whose `INFO` counts (Sentinel: the master; Cluster:
    /// every master).
    redis: Vec<redis::aio::MultiplexedConnection>,
    /// Servers found behind the URL's (Sentinel: the master; Cluster: every node), whose
    /// connections count as the store's too.
    nodes: Vec<(String, u16)>,
    /// What the report says of the deployment after the version.
    about: Option<String>,
    sql: Option<sqlx::AnyPool>,
    zk: Vec<(String, u16)>,
    /// The etcd members' client ports (their `/metrics`), when the URL is plain `etcd://`.
    etcd_http: Vec<(String, u16)>,
    etcd: Option<etcd_client::Client>,
    sqlite: Option<PathBuf>,
}

/// What [`Probe::commands`] counts on each kind of store.
pub fn commands_what(kind: Kind) -> &'static str {
    match kind {
        Kind::Redis | Kind::Redlock => {
            "commands (INFO commandstats summed over servers: every EVALSHA and every command \
             its Lua script runs, PUBLISH, SUBSCRIBE…; INFO excluded)"
        }
        Kind::RedisSentinel => {
            "commands on the master (INFO commandstats: every EVALSHA and every command its Lua \
             script runs, PUBLISH, SUBSCRIBE, WAIT…; INFO and REPLCONF, the replicas' \
             acknowledgements, excluded; the sentinels' PINGs and hellos are background)"
        }
        Kind::RedisCluster => {
            "commands (INFO commandstats summed over the masters: every EVALSHA and every \
             command its Lua script runs, SPUBLISH, SSUBSCRIBE, WAIT…; INFO, CLUSTER and \
             REPLCONF, the replicas' acknowledgements, excluded)"
        }
        Kind::Postgres => "transactions (pg_stat_database xact_commit+xact_rollback)",
        Kind::Mysql => "statements (SHOW GLOBAL STATUS Questions)",
        Kind::Zk => "packets received (mntr zk_packets_received, all servers)",
        Kind::Etcd => {
            "writes applied (/metrics etcd_mvcc_put_total + etcd_mvcc_delete_total, puts and \
             deletes inside transactions included; the highest of the members, each applies \
             every write; not measured on etcds://)"
        }
        Kind::Sqlite => "n/a (no server)",
    }
}

/// What [`Probe::syncs`] reads, where the store reports how long its log syncs take.
pub fn syncs_what(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Zk => Some(
            "transaction log fsyncs (mntr zk_cnt/sum/max_fsynctime of every server, reset with \
             srst before the run; without srst no longest)",
        ),
        Kind::Etcd => Some(
            "WAL fsyncs (/metrics etcd_disk_wal_fsync_duration_seconds of every member, the \
             difference over the run; the longest is the upper bound of its bucket)",
        ),
        _ => None,
    }
}

/// The store's log-sync counters at one moment (see [`syncs_what`]).
#[derive(Debug, Clone, Default)]
pub struct SyncSnap {
    count: f64,
    sum_ms: f64,
    /// ZooKeeper: the longest since the servers' statistics were reset.
    max_ms: Option<f64>,
    /// ZooKeeper: `srst` was answered by every server.
    reset: bool,
    /// etcd: the histogram, (upper bound ms, count at or below), summed over the members.
    buckets: Vec<(f64, f64)>,
}

impl SyncSnap {
    /// What happened between `self` (from [`Probe::syncs_start`]) and `later`.
    pub fn until(&self, later: &SyncSnap) -> Syncs {
        let count = (later.count - self.count).max(0.0);
        let max_ms = if later.buckets.is_empty() {
            later.max_ms.filter(|_| self.reset)
        } else {
            // The smallest bound that every sync of the run fell under.
            let mut b: Vec<(f64, f64)> = later
                .buckets
                .iter()
                .map(|&(le, n)| {
                    let before = self.buckets.iter().find(|x| x.0 == le).map_or(0.0, |x| x.1);
                    (le, n - before)
                })
                .collect();
            b.sort_by(|x, y| x.0.total_cmp(&y.0));
            b.iter().find(|x| x.1 >= count).map(|x| x.0)
        };
        Syncs {
            count: count as u64,
            mean_ms: (count > 0.0).then(|| (later.sum_ms - self.sum_ms) / count),
            max_ms: max_ms.filter(|m| count > 0.0 && m.is_finite()),
            max_is_bound: !later.buckets.is_empty(),
        }
    }
}

/// The store's own log syncs over a run (see [`syncs_what`]).
#[derive(Debug, Clone, Serialize)]
pub struct Syncs {
    /// Syncs, summed over the servers.
    pub count: u64,
    /// Their mean, ms.
    pub mean_ms: Option<f64>,
    /// The longest, ms (etcd: the upper bound of its histogram bucket).
    pub max_ms: Option<f64>,
    /// `max_ms` is a bucket's upper bound, not a measured time.
    pub max_is_bound: bool,
}

/// What [`Probe::keepalives`] counts (S1), where the store counts lease renewals.
pub fn keepalives_what(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Etcd => Some(
            "lease keep-alives served (/metrics etcd_debugging_lease_renewed_total, summed over \
             the members: only the leader counts them)",
        ),
        _ => None,
    }
}

/// What [`Probe::memory`] measures.
pub fn memory_what(kind: Kind) -> &'static str {
    match kind {
        Kind::Redis | Kind::Redlock => "INFO memory used_memory (sum over servers)",
        Kind::RedisSentinel => {
            "INFO memory used_memory of the master (each replica keeps a full copy)"
        }
        Kind::RedisCluster => {
            "INFO memory used_memory summed over the masters (each replica keeps a copy of its \
             master's slots)"
        }
        Kind::Postgres => "pg_total_relation_size of the dlock_bench tables",
        Kind::Mysql => "data_length + index_length of the dlock_bench tables (after ANALYZE)",
        Kind::Zk => "mntr zk_approximate_data_size (one server; each keeps a full copy)",
        Kind::Etcd => {
            "/metrics etcd_mvcc_db_total_size_in_use_in_bytes (one member; each keeps a full \
             copy, every revision since the last compaction)"
        }
        Kind::Sqlite => "file size of the database and its WAL",
    }
}

impl Probe {
    /// Connects the probe (its own connections, not counted as dlock's).
    pub async fn open(t: &Target) -> Result<Probe, String> {
        let mut p = Probe {
            kind: t.kind,
            redis: Vec::new(),
            nodes: Vec::new(),
            about: None,
            sql: None,
            zk: Vec::new(),
            etcd_http: Vec::new(),
            etcd: None,
            sqlite: t.sqlite_path.clone(),
        };
        match t.kind {
            Kind::Redis | Kind::Redlock => {
                for u in t.redis_urls() {
                    let c = redis::Client::open(u.as_str()).map_err(|e| e.to_string())?;
                    p.redis.push(
                        limit("redis probe", OP, c.get_multiplexed_async_connection()).await?,
                    );
                }
            }
            Kind::RedisSentinel => {
                let (c, (h, port)) = super::redis_ha::sentinel_master(t).await?;
                p.redis.push(
                    limit(
                        "redis probe of the master",
                        OP,
                        c.get_multiplexed_async_connection(),
                    )
                    .await?,
                );
                p.about = Some(format!("Sentinel, master {h}:{port}"));
                p.nodes.push((h, port));
            }
            Kind::RedisCluster => {
                let nodes = super::redis_ha::cluster_nodes(t).await?;
                for n in nodes.iter().filter(|n| n.master) {
                    let u = super::redis_ha::server_url(t, &n.host, n.port, 0);
                    let c = redis::Client::open(u.as_str()).map_err(|e| e.to_string())?;
                    p.redis.push(
                        limit(
                            "redis probe of a master",
                            OP,
                            c.get_multiplexed_async_connection(),
                        )
                        .await?,
                    );
                }
                let masters = nodes.iter().filter(|n| n.master).count();
                p.about = Some(format!(
                    "Cluster, {masters} masters, {} other nodes",
                    nodes.len() - masters
                ));
                p.nodes = nodes.into_iter().map(|n| (n.host, n.port)).collect();
            }
            Kind::Postgres | Kind::Mysql => {
                sqlx::any::install_default_drivers();
                p.sql = Some(
                    limit(
                        "sql probe",
                        OP,
                        sqlx::any::AnyPoolOptions::new()
                            .max_connections(1)
                            .connect(&t.plain_sql_url()),
                    )
                    .await?,
                );
            }
            Kind::Zk => p.zk = t.servers.clone(),
            Kind::Etcd => {
                p.etcd = Some(etcd_connect(t).await?);
                if !t.etcd_tls() {
                    p.etcd_http = t.servers.clone();
                }
            }
            Kind::Sqlite => {}
        }
        Ok(p)
    }

    /// `GET path` of an etcd member's HTTP endpoint (its client port), the body. HTTP/1.0: the
    /// answer is the body up to the end of the connection, never chunked.
    async fn http_get(&self, host: &str, port: u16, path: &str) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let f = async {
            let mut s = tokio::net::TcpStream::connect((host, port)).await?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n").as_bytes())
                .await?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
        };
        let text = limit("etcd /metrics", OP, f).await?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        if !head.lines().next().is_some_and(|l| l.contains(" 200 ")) {
            return Err(format!(
                "etcd {host}:{port}{path}: {}",
                head.lines().next().unwrap_or("no answer")
            ));
        }
        Ok(body.to_string())
    }

    /// The sum of some counters of one member's `/metrics` (the first name it has of each
    /// alternative: etcd 3.5 renamed `etcd_debugging_mvcc_*` to `etcd_mvcc_*`).
    fn metric(text: &str, names: &[&[&str]]) -> f64 {
        names
            .iter()
            .map(|alts| {
                alts.iter()
                    .find_map(|n| {
                        text.lines().find_map(|l| {
                            let (k, v) = l.split_once(' ')?;
                            (k == *n).then(|| v.trim().parse::<f64>().ok())?
                        })
                    })
                    .unwrap_or(0.0)
            })
            .sum()
    }

    /// etcd: one figure of every member's `/metrics`.
    async fn etcd_metrics(&self, names: &[&[&str]]) -> Result<Vec<f64>, String> {
        let mut out = Vec::new();
        for (h, p) in &self.etcd_http {
            let text = self.http_get(h, *p, "/metrics").await?;
            out.push(Self::metric(&text, names));
        }
        Ok(out)
    }

    /// Lease keep-alives the store served so far (see [`keepalives_what`]); `None` where the
    /// store does not count them.
    pub async fn keepalives(&self) -> Result<Option<f64>, String> {
        if self.kind != Kind::Etcd || self.etcd_http.is_empty() {
            return Ok(None);
        }
        let v = self
            .etcd_metrics(&[&["etcd_debugging_lease_renewed_total"]])
            .await?;
        Ok(Some(v.iter().sum()))
    }

    async fn redis_info(&self, section: &str) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for c in &self.redis {
            let mut c = c.clone();
            let s: String = limit(
                "INFO",
                OP,
                redis::cmd("INFO")
                    .arg(section)
                    .query_async::<String>(&mut c),
            )
            .await?;
            out.push(s);
        }
        Ok(out)
    }

    async fn mntr(&self, host: &str, port: u16) -> Result<String, String> {
        self.four_letter(host, port, b"mntr").await
    }

    /// A ZooKeeper four-letter word's answer.
    async fn four_letter(&self, host: &str, port: u16, word: &[u8]) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let f = async {
            let mut s = tokio::net::TcpStream::connect((host, port)).await?;
            s.write_all(word).await?;
            let mut out = String::new();
            s.read_to_string(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        };
        limit("zookeeper four-letter word", OP, f).await
    }

    fn field(text: &str, key: &str) -> Option<f64> {
        text.lines().find_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix(key)?;
            let v = rest.trim_start_matches([':', '\t', ' ']);
            v.trim().parse::<f64>().ok()
        })
    }

    /// Commands served by the store so far (see [`commands_what`]).
    pub async fn commands(&self) -> Result<Option<f64>, String> {
        match self.kind {
            k @ (Kind::Redis | Kind::Redlock | Kind::RedisSentinel | Kind::RedisCluster) => {
                // Not commands of a client: the probe's INFO, a cluster's own CLUSTER traffic
                // and the replicas' REPLCONF ACKs (which WAIT asks for).
                let skip: &[&str] = match k {
                    Kind::Redis | Kind::Redlock => &["info:"],
                    _ => &["info:", "replconf:", "cluster|", "cluster:"],
                };
                let mut total = 0.0;
                for s in self.redis_info("commandstats").await? {
                    for l in s.lines() {
                        let Some(rest) = l.strip_prefix("cmdstat_") else {
                            continue;
                        };
                        if skip.iter().any(|p| rest.starts_with(p)) {
                            continue;
                        }
                        if let Some(calls) = rest
                            .split([':', ','])
                            .find_map(|kv| kv.strip_prefix("calls="))
                        {
                            total += calls.parse::<f64>().unwrap_or(0.0);
                        }
                    }
                }
                Ok(Some(total))
            }
            Kind::Postgres => {
                let pool = self.sql.as_ref().ok_or("no probe")?;
                let v: i64 = limit(
                    "pg_stat_database",
                    OP,
                    sqlx::query_scalar(
                        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                         WHERE datname = current_database()",
                    )
                    .fetch_one(pool),
                )
                .await?;
                Ok(Some(v as f64))
            }
            Kind::Mysql => {
                let pool = self.sql.as_ref().ok_or("no probe")?;
                let row: (String, String) = limit(
                    "SHOW GLOBAL STATUS",
                    OP,
                    sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'").fetch_one(pool),
                )
                .await?;
                Ok(row.1.parse::<f64>().ok())
            }
            Kind::Zk => {
                let mut total = 0.0;
                for (h, p) in &self.zk {
                    let s = self.mntr(h, *p).await?;
                    total += Self::field(&s, "zk_packets_received").unwrap_or(0.0);
                }
                Ok(Some(total))
            }
            Kind::Etcd => {
                if self.etcd_http.is_empty() {
                    return Ok(None);
                }
                let v = self
                    .etcd_metrics(&[
                        &["etcd_mvcc_put_total", "etcd_debugging_mvcc_put_total"],
                        &["etcd_mvcc_delete_total", "etcd_debugging_mvcc_delete_total"],
                    ])
                    .await?;
                Ok(v.into_iter().reduce(f64::max))
            }
            Kind::Sqlite => Ok(None),
        }
    }

    /// Starts reading the store's log syncs over a run (see [`syncs_what`]): ZooKeeper servers'
    /// statistics are reset (`srst`, so that their longest fsync is the run's), and the counters
    /// are read. `None` where the store reports no sync timings.
    pub async fn syncs_start(&self) -> Option<SyncSnap> {
        match self.kind {
            Kind::Zk => {
                let mut reset = true;
                for (h, p) in &self.zk {
                    reset &= self
                        .four_letter(h, *p, b"srst")
                        .await
                        .is_ok_and(|a| a.contains("reset"));
                }
                let mut s = self.syncs().await?;
                s.reset = reset;
                Some(s)
            }
            _ => self.syncs().await,
        }
    }

    /// The store's log-sync counters now (see [`Probe::syncs_start`]).
    pub async fn syncs(&self) -> Option<SyncSnap> {
        match self.kind {
            Kind::Zk => {
                let mut s = SyncSnap::default();
                for (h, p) in &self.zk {
                    let t = self.mntr(h, *p).await.ok()?;
                    s.count += Self::field(&t, "zk_cnt_fsynctime")?;
                    s.sum_ms += Self::field(&t, "zk_sum_fsynctime")?;
                    let max = Self::field(&t, "zk_max_fsynctime")?;
                    s.max_ms = Some(s.max_ms.map_or(max, |m: f64| m.max(max)));
                }
                Some(s)
            }
            Kind::Etcd if !self.etcd_http.is_empty() => {
                const H: &str = "etcd_disk_wal_fsync_duration_seconds";
                let mut s = SyncSnap::default();
                for (h, p) in &self.etcd_http {
                    let t = self.http_get(h, *p, "/metrics").await.ok()?;
                    s.count += Self::metric(&t, &[&[&format!("{H}_count")]]);
                    s.sum_ms += 1e3 * Self::metric(&t, &[&[&format!("{H}_sum")]]);
                    for l in t.lines() {
                        let Some(rest) = l.strip_prefix(&format!("{H}_bucket{{le=\"")) else {
                            continue;
                        };
                        let Some((le, n)) = rest.split_once("\"} ") else {
                            continue;
                        };
                        let le = if le == "+Inf" {
                            f64::INFINITY
                        } else {
                            le.parse::<f64>().ok()? * 1e3
                        };
                        let n = n.trim().parse::<f64>().ok()?;
                        match s.buckets.iter_mut().find(|b| b.0 == le) {
                            Some(b) => b.1 += n,
                            None => s.buckets.push((le, n)),
                        }
                    }
                }
                Some(s)
            }
            _ => None,
        }
    }

    /// Memory (or disk) the store uses for locks (see [`memory_what`]), in bytes.
    pub async fn memory(&self) -> Result<Option<f64>, String> {
        match self.kind {
            Kind::Redis | Kind::Redlock | Kind::RedisSentinel | Kind::RedisCluster => {
                let mut total = 0.0;
                for s in self.redis_info("memory").await? {
                    total += Self::field(&s, "used_memory").unwrap_or(0.0);
                }
                Ok(Some(total))
            }
            Kind::Postgres => {
                let pool = self.sql.as_ref().ok_or("no probe")?;
                let v: i64 = limit(
                    "table size",
                    OP,
                    sqlx::query_scalar(
                        "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::bigint \
                         FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE 'dlock\\_bench%'",
                    )
                    .fetch_one(pool),
                )
                .await?;
                Ok(Some(v as f64))
            }
            Kind::Mysql => {
                let pool = self.sql.as_ref().ok_or("no probe")?;
                for t in ["", "_queue", "_fences"] {
                    let _ = limit(
                        "ANALYZE TABLE",
                        OP,
                        sqlx::query(&format!("ANALYZE TABLE {BENCH_TABLE}{t}")).execute(pool),
                    )
                    .await;
                }
                let v: i64 = limit(
                    "table size",
                    OP,
                    sqlx::query_scalar(
                        "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) \
                         FROM information_schema.tables WHERE table_schema = DATABASE() \
                         AND table_name LIKE 'dlock\\_bench%'",
                    )
                    .fetch_one(pool),
                )
                .await?;
                Ok(Some(v as f64))
            }
            Kind::Zk => {
                let (h, p) = self.zk.first().ok_or("no server")?;
                let s = self.mntr(h, *p).await?;
                Ok(Self::field(&s, "zk_approximate_data_size"))
            }
            Kind::Etcd => {
                let Some((h, p)) = self.etcd_http.first() else {
                    return Ok(None);
                };
                let text = self.http_get(h, *p, "/metrics").await?;
                Ok(Some(Self::metric(
                    &text,
                    &[&[
                        "etcd_mvcc_db_total_size_in_use_in_bytes",
                        "etcd_mvcc_db_total_size_in_bytes",
                    ]],
                )))
            }
            Kind::Sqlite => {
                let Some(p) = &self.sqlite else {
                    return Ok(None);
                };
                let mut total = 0.0;
                for suffix in ["", "-wal"] {
                    let mut f = p.clone().into_os_string();
                    f.push(suffix);
                    if let Ok(m) = std::fs::metadata(&f) {
                        total += m.len() as f64;
                    }
                }
                Ok(Some(total))
            }
        }
    }

    /// What of a SQL server's state changes the figures, in words (`None` for other stores).
    /// Every grant reads the name's rows, and an open transaction's snapshot keeps the dead rows
    /// of released holds, so a long transaction on the server slows the grants of a busy name
    /// while the floor, which never reads a range, stays as it was (docs/BACKENDS.md).
    /// PostgreSQL: `autovacuum` and the oldest transaction open in the database (the horizon
    /// of its ordinary tables). MySQL/MariaDB: the purge backlog (`Innodb_history_list_length`,
    /// server-wide) and the oldest open transaction (`INNODB_TRX`, which needs the `PROCESS`
    /// privilege). What cannot be read says so.
    pub async fn sql_state(&self) -> Option<String> {
        let pool = self.sql.as_ref()?;
        let secs = |s: Option<f64>| match s {
            Some(s) => format!("{s:.0} s"),
            None => "none".into(),
        };
        match self.kind {
            Kind::Postgres => {
                let q = "SELECT current_setting('autovacuum'), \
                         (SELECT EXTRACT(EPOCH FROM max(clock_timestamp() - xact_start))::float8 \
                          FROM pg_stat_activity WHERE datname = current_database() \
                          AND pid <> pg_backend_pid() AND xact_start IS NOT NULL)";
                let row = sqlx::query_as::<_, (String, Option<f64>)>(q).fetch_one(pool);
                Some(match limit("sql state", OP, row).await {
                    Ok((autovacuum, oldest)) => format!(
                        "autovacuum {autovacuum}, oldest open transaction in the database {}",
                        secs(oldest)
                    ),
                    Err(e) => format!("not read ({e})"),
                })
            }
            Kind::Mysql => {
                let history = limit(
                    "SHOW GLOBAL STATUS",
                    OP,
                    sqlx::query_as::<_, (String, String)>(
                        "SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'",
                    )
                    .fetch_optional(pool),
                )
                .await;
                let history = match history {
                    Ok(Some((_, v))) => v,
                    Ok(None) => "not reported".into(),
                    Err(e) => format!("not read ({e})"),
                };
                let oldest = limit(
                    "INNODB_TRX",
                    OP,
                    sqlx::query_scalar::<_, Option<i64>>(
                        "SELECT CAST(MAX(TIMESTAMPDIFF(SECOND, trx_started, NOW())) AS SIGNED) \
                         FROM information_schema.INNODB_TRX",
                    )
                    .fetch_one(pool),
                )
                .await;
                let oldest = match oldest {
                    Ok(s) => secs(s.map(|s| s as f64)),
                    Err(e) => format!("not read ({e})"),
                };
                Some(format!(
                    "history list {history}, oldest open transaction {oldest}"
                ))
            }
            _ => None,
        }
    }

    /// The server's version, for the report.
    pub async fn version(&self) -> Option<String> {
        match self.kind {
            Kind::Redis | Kind::Redlock | Kind::RedisSentinel | Kind::RedisCluster => {
                let s = self.redis_info("server").await.ok()?;
                let v = s.first()?.lines().find_map(|l| {
                    l.trim()
                        .strip_prefix("redis_version:")
                        .map(|v| format!("Redis {v}"))
                })?;
                Some(match &self.about {
                    Some(a) => format!("{v}; {a}"),
                    None => v,
                })
            }
            Kind::Postgres | Kind::Mysql => {
                let pool = self.sql.as_ref()?;
                let q = if self.kind == Kind::Postgres {
                    "SELECT version()"
                } else {
                    "SELECT CONCAT('MySQL/MariaDB ', VERSION())"
                };
                let v: String = limit("version", OP, sqlx::query_scalar(q).fetch_one(pool))
                    .await
                    .ok()?;
                Some(v.split(" on ").next().unwrap_or(&v).to_string())
            }
            Kind::Zk => {
                let (h, p) = self.zk.first()?;
                let s = self.mntr(h, *p).await.ok()?;
                s.lines().find_map(|l| {
                    l.strip_prefix("zk_version")
                        .map(|v| format!("ZooKeeper {}", v.trim().split(',').next().unwrap_or("")))
                })
            }
            Kind::Etcd => {
                let mut c = self.etcd.clone()?;
                let st = limit("etcd status", OP, c.status()).await.ok()?;
                Some(format!("etcd {}", st.version()))
            }
            Kind::Sqlite => Some("SQLite (bundled with sqlx)".into()),
        }
    }

    /// Removes what the bench left in the store: Redis keys of this run (the fence counters
    /// never expire), the bench's SQL tables and grant routine.
    pub async fn cleanup(&self, t: &Target, run: &str) {
        for c in &self.redis {
            let mut c = c.clone();
            let pattern = format!("*dlockbench/{run}*");
            let mut cursor: u64 = 0;
            for _ in 0..100_000 {
                let r: Result<(u64, Vec<String>), String> = limit(
                    "SCAN",
                    OP,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async::<(u64, Vec<String>)>(&mut c),
                )
                .await;
                let Ok((next, keys)) = r else { break };
                if !keys.is_empty() {
                    // One key a command: the keys of a cluster node are in several slots.
                    let mut pipe = redis::pipe();
                    for k in &keys {
                        pipe.cmd("DEL").arg(k).ignore();
                    }
                    let _ = limit("DEL", OP, pipe.query_async::<()>(&mut c)).await;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        if let (Some(pool), true) = (&self.sql, t.own_tables) {
            for s in ["", "_queue", "_fences", "_meta"] {
                let _ = limit(
                    "DROP TABLE",
                    Duration::from_secs(30),
                    sqlx::query(&format!("DROP TABLE IF EXISTS {BENCH_TABLE}{s}")).execute(pool),
                )
                .await;
            }
            let dialect = match t.kind {
                Kind::Postgres => Some(dlock::backend::sql::Dialect::Postgres),
                Kind::Mysql => Some(dlock::backend::sql::Dialect::MySql),
                _ => None,
            };
            if let Some(d) = dialect {
                for drop in dlock::backend::sql::fast::drop_sql(d, BENCH_TABLE) {
                    let _ = limit("DROP ROUTINE", OP, sqlx::query(&drop).execute(pool)).await;
                }
            }
        }
        if let Some(pool) = &self.sql {
            pool.close().await;
        }
    }
}

/// This process's resident memory in bytes (`/proc/self/statm`).
pub fn rss_bytes() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map(|pages| pages * 4096.0)
        .unwrap_or(0.0)
}

/// Connections this process has open to the store: established TCP connections to its
/// servers' ports (the URL's and those `probe` found behind them: a Sentinel deployment's
/// master, a cluster's nodes; from `/proc/self/fd` and `/proc/net/tcp{,6}`), or for SQLite the
/// open file descriptors of the database file.
pub fn connections(t: &Target, probe: &Probe) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let links: Vec<PathBuf> = dir
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    if let Some(p) = &t.sqlite_path {
        let canon = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        return links.iter().filter(|l| **l == canon).count();
    }
    let inodes: HashSet<String> = links
        .iter()
        .filter_map(|l| {
            let s = l.to_string_lossy();
            s.strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .map(str::to_string)
        })
        .collect();
    let ports: HashSet<u16> = t
        .servers
        .iter()
        .chain(&probe.nodes)
        .map(|(_, p)| *p)
        .collect();
    let mut n = 0;
    for f in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 || cols[3] != "01" {
                continue;
            }
            let port = cols[2]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if port.is_some_and(|p| ports.contains(&p)) && inodes.contains(cols[9]) {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics() {
        let text = "# HELP etcd_mvcc_put_total x\n# TYPE etcd_mvcc_put_total counter\n\
                    etcd_mvcc_put_total 12\netcd_mvcc_put_total_x 99\n\
                    etcd_debugging_mvcc_delete_total 5\n";
        let v = Probe::metric(
            text,
            &[
                &["etcd_mvcc_put_total", "etcd_debugging_mvcc_put_total"],
                &["etcd_mvcc_delete_total", "etcd_debugging_mvcc_delete_total"],
            ],
        );
        assert_eq!(v, 17.0);
    }

    #[test]
    fn urls() {
        let t = Target::parse("redlock://a:1,b:2,c:3?drift=1%").unwrap();
        assert_eq!(t.kind, Kind::Redlock);
        assert_eq!(t.servers.len(), 3);
        assert_eq!(t.redis_urls()[1], "redis://b:2/");
        let t = Target::parse("redis://u:pw@127.0.0.1:6379/2").unwrap();
        assert_eq!(t.redis_urls(), vec!["redis://u:pw@127.0.0.1:6379/2"]);
        assert!(!t.shown.contains("pw"));
        let t = Target::parse("postgres://postgres@127.0.0.1/test").unwrap();
        assert_eq!(t.servers, vec![("127.0.0.1".to_string(), 5432)]);
        assert!(t.url.ends_with("?table=dlock_bench") && t.own_tables);
        let t = Target::parse("sqlite:///tmp/a%20b.db").unwrap();
        assert_eq!(t.sqlite_path, Some(PathBuf::from("/tmp/a b.db")));
        let t = Target::parse("etcd://a,b:2380,c:3/locks%2Fx?ttl=10s").unwrap();
        assert_eq!(t.kind, Kind::Etcd);
        assert_eq!(t.label(), "etcd×3");
        assert_eq!(
            t.etcd_endpoints(),
            vec!["http://a:2379", "http://b:2380", "http://c:3"]
        );
        assert_eq!(t.etcd_prefix(), "locks/x");
        let t = Target::parse("etcds://u:p%40w@h").unwrap();
        assert!(t.etcd_tls() && !t.shown.contains("p%40w"));
        assert_eq!(t.etcd_endpoints(), vec!["https://h:2379"]);
        assert_eq!(t.etcd_prefix(), "dlock");
        assert_eq!(t.userinfo, "u:p%40w@");
        assert!(Target::parse("mem://").is_err());
        assert!(Target::parse("ftp://x").is_err());
    }

    #[test]
    fn u1_runs_through_one_zookeeper_server() {
        let t = Target::parse("zk://u:p@h1:1,h2:2,h3/locks/x?session_timeout=2s").unwrap();
        let u = t.u1_target();
        assert_eq!(u.url, "zk://u:p@h1:1/locks/x?session_timeout=2s");
        assert_eq!(u.servers, vec![("h1".to_string(), 1)]);
        let t = Target::parse("zk://h1:1,h2:2?session_timeout=2s").unwrap();
        assert_eq!(t.u1_target().url, "zk://h1:1?session_timeout=2s");
        // Other stores keep every server (Redlock's floor and grants are on all of them).
        let t = Target::parse("redlock://a:1,b:2,c:3").unwrap();
        assert_eq!(t.u1_target().url, t.url);
        assert_eq!(t.u1_target().servers.len(), 3);
    }
}
