//! The command connection of a Redis deployment: one server (`redis://`), the master that
//! Sentinel names (`redis+sentinel://`, found again after every failover), or a Cluster
//! (`redis+cluster://`, redis-rs's cluster client: slots, MOVED/ASK and failovers).

use super::url::{Deployment, RedisTarget};
use super::{lock, map_err};
use crate::error::{Error, Result};
use ::redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline,
    RedisConnectionInfo, RedisError, RedisFuture, RedisResult, Value,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

/// The connection every command goes through (cheap to clone: all clones share it).
#[derive(Clone)]
pub(super) enum Conn {
    /// One server; reconnects by itself after an I/O error.
    Direct(ConnectionManager),
    /// The current master of a Sentinel deployment.
    Sentinel(Arc<SentinelConn>),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl Conn {
    /// Connects as `target` says (bounded by its `connect_timeout`).
    pub(super) async fn open(target: &RedisTarget) -> Result<(Conn, Option<Client>)> {
        let timed_out = || {
            Error::Unavailable(format!(
                "redis at {} did not accept a connection within {:?}",
                target.shown, target.connect_timeout
            ))
        };
        let unavailable = |e: RedisError| match map_err(target, e) {
            Error::Backend(b) => Error::Unavailable(b.to_string()),
            other => other,
        };
        match &target.deployment {
            Deployment::Direct => {
                let client = Client::open(target.url.as_str()).map_err(|e| {
                    Error::InvalidConfig(format!("redis URL {}: {}", target.shown, e.category()))
                })?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(target.connect_timeout)
                    .set_response_timeout(target.timeout)
                    .set_number_of_retries(0);
                let cm = ConnectionManager::new_with_config(client.clone(), config);
                match tokio::time::timeout(target.connect_timeout, cm).await {
                    Ok(Ok(c)) => Ok((Conn::Direct(c), Some(client))),
                    Ok(Err(e)) => Err(unavailable(e)),
                    Err(_) => Err(timed_out()),
                }
            }
            Deployment::Sentinel { .. } => {
                let s = Arc::new(SentinelConn::new(target)?);
                s.current().await.map_err(unavailable)?;
                s.watch();
                Ok((Conn::Sentinel(s), None))
            }
            Deployment::Cluster { .. } => {
                let client = cluster_client(target, None)?;
                match tokio::time::timeout(target.connect_timeout, client.get_async_connection())
                    .await
                {
                    Ok(Ok(c)) => Ok((Conn::Cluster(c), None)),
                    Ok(Err(e)) => Err(unavailable(e)),
                    Err(_) => Err(timed_out()),
                }
            }
        }
    }

    /// A client of the server the commands go to now (for the pub/sub connection of a direct or
    /// Sentinel deployment; a cluster subscribes through its own cluster connection).
    pub(super) async fn pubsub_client(&self, direct: Option<&Client>) -> RedisResult<Client> {
        match self {
            Conn::Sentinel(s) => Ok(s.current().await?.client),
            _ => direct.cloned().ok_or_else(|| {
                RedisError::from((ErrorKind::ClientError, "no pub/sub client for a cluster"))
            }),
        }
    }

    /// Which master the commands go to: changes after a Sentinel failover (always 0 otherwise).
    pub(super) fn epoch(&self) -> u64 {
        match self {
            Conn::Sentinel(s) => s.epoch.load(Ordering::Acquire),
            _ => 0,
        }
    }
}

/// A cluster client for `target`; `push` takes the RESP3 pushes (sharded pub/sub).
pub(super) fn cluster_client(
    target: &RedisTarget,
    push: Option<super::pubsub::Pushes>,
) -> Result<::redis::cluster::ClusterClient> {
    let Deployment::Cluster { nodes } = &target.deployment else {
        return Err(Error::InvalidConfig(format!(
            "{} is not a cluster URL",
            target.shown
        )));
    };
    let mut b = ::redis::cluster::ClusterClientBuilder::new(nodes.clone())
        .connection_timeout(target.connect_timeout)
        .response_timeout(target.timeout)
        .retries(2);
    if let Some(u) = &target.user {
        b = b.username(u.clone());
    }
    if let Some(p) = &target.password {
        b = b.password(p.clone());
    }
    if let Some(push) = push {
        b = b
            .use_protocol(::redis::ProtocolVersion::RESP3)
            .push_sender(push);
    }
    b.build().map_err(|e| {
        Error::InvalidConfig(format!(
            "redis cluster URL {}: {}",
            target.shown,
            e.category()
        ))
    })
}

/// How often a Sentinel client asks a sentinel which server is the master, so that it leaves a
/// deposed master even while no command fails on it (a master continued after a pause, or
/// restarted empty, answers as a master until Sentinel demotes it, about ten seconds later).
const SENTINEL_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The connection to the master Sentinel names, found again when it fails or Sentinel names
/// another.
pub(super) struct SentinelConn {
    /// Each sentinel, in the URL's order.
    sentinels: Vec<ConnectionInfo>,
    /// The master's name in Sentinel.
    master: String,
    /// How to handshake with the Redis servers (database, credentials).
    node: RedisConnectionInfo,
    finding: tokio::sync::Mutex<()>,
    now: StdMutex<Option<Master>>,
    config: AsyncConnectionConfig,
    connect_timeout: std::time::Duration,
    /// Counts the masters connected to.
    epoch: AtomicU64,
}

#[derive(Clone)]
struct Master {
    epoch: u64,
    addr: (String, u16),
    conn: MultiplexedConnection,
    client: Client,
}

fn io_err(what: String) -> RedisError {
    RedisError::from(std::io::Error::other(what))
}

impl SentinelConn {
    fn new(target: &RedisTarget) -> Result<SentinelConn> {
        let Deployment::Sentinel {
            sentinels,
            master,
            db,
            sentinel_user,
            sentinel_password,
        } = &target.deployment
        else {
            return Err(Error::InvalidConfig(format!(
                "{} is not a sentinel URL",
                target.shown
            )));
        };
        let sentinel_redis = RedisConnectionInfo {
            username: sentinel_user.clone().or_else(|| target.user.clone()),
            password: sentinel_password
                .clone()
                .or_else(|| target.password.clone()),
            ..RedisConnectionInfo::default()
        };
        let sentinels = sentinels
            .iter()
            .filter_map(|h| {
                let (host, port) = h.rsplit_once(':')?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                Some(ConnectionInfo {
                    addr: ConnectionAddr::Tcp(host.to_owned(), port.parse().ok()?),
                    redis: sentinel_redis.clone(),
                })
            })
            .collect();
        Ok(SentinelConn {
            sentinels,
            master: master.clone(),
            node: RedisConnectionInfo {
                db: *db,
                username: target.user.clone(),
                password: target.password.clone(),
                ..RedisConnectionInfo::default()
            },
            finding: tokio::sync::Mutex::new(()),
            now: StdMutex::new(None),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(target.connect_timeout)
                .set_response_timeout(target.timeout),
            connect_timeout: target.connect_timeout,
            epoch: AtomicU64::new(0),
        })
    }

    /// The master's address as the first sentinel that answers says
    /// (`SENTINEL get-master-addr-by-name`, what Sentinel's client guide prescribes: unlike
    /// `SENTINEL MASTERS`, it names the new master as soon as the fail-over elected it).
    async fn ask(&self) -> RedisResult<(String, u16)> {
        let mut last = io_err("no sentinel in the URL".into());
        for s in &self.sentinels {
            let answer = async {
                let mut c = Client::open(s.clone())?
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?;
                ::redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut c)
                    .await
            };
            match answer.await {
                Ok(Some(addr)) => return Ok(addr),
                Ok(None) => {
                    last = io_err(format!(
                        "sentinel {:?} knows no master named {:?}",
                        s.addr.to_string(),
                        self.master
                    ))
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The connection to the master, asking the sentinels for it if there is none.
    async fn current(&self) -> RedisResult<Master> {
        if let Some(m) = lock(&self.now).clone() {
            return Ok(m);
        }
        let _finding = self.finding.lock().await;
        if let Some(m) = lock(&self.now).clone() {
            return Ok(m);
        }
        let find = async {
            let addr = self.ask().await?;
            let client = Client::open(ConnectionInfo {
                addr: ConnectionAddr::Tcp(addr.0.clone(), addr.1),
                redis: self.node.clone(),
            })?;
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?;
            // A server the sentinels name may not know it yet (or any more): ask it.
            let role: Vec<Value> = ::redis::cmd("ROLE").query_async(&mut conn).await?;
            let is_master = matches!(role.first(), Some(Value::BulkString(b)) if b == b"master");
            if !is_master {
                return Err(io_err(format!(
                    "{}:{} that the sentinels name as the master answers ROLE as a replica",
                    addr.0, addr.1
                )));
            }
            RedisResult::Ok((addr, client, conn))
        };
        let (addr, client, conn) = match tokio::time::timeout(self.connect_timeout, find).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io_err(
                    "the sentinels or the master they name did not answer in time".into(),
                ))
            }
        };
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let m = Master {
            epoch,
            addr,
            conn,
            client,
        };
        *lock(&self.now) = Some(m.clone());
        Ok(m)
    }

    /// Every [`SENTINEL_CHECK`] while the connection lives: if the sentinels name another
    /// master than the one connected to, forgets it (the next command finds the new one).
    fn watch(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SENTINEL_CHECK).await;
                let Some(s) = weak.upgrade() else { return };
                let Some((epoch, addr)) = lock(&s.now).as_ref().map(|m| (m.epoch, m.addr.clone()))
                else {
                    continue;
                };
                let named = tokio::time::timeout(s.connect_timeout, s.ask()).await;
                if let Ok(Ok(named)) = named {
                    if named != addr {
                        tracing::info!(
                            old = %format!("{}:{}", addr.0, addr.1),
                            new = %format!("{}:{}", named.0, named.1),
                            "redis sentinel names another master; switching"
                        );
                        let mut now = lock(&s.now);
                        if now.as_ref().is_some_and(|m| m.epoch == epoch) {
                            *now = None;
                        }
                    }
                }
            }
        });
    }

    /// Forgets master `epoch` after an error that says it may no longer be the master. `true` if
    /// the command is worth sending once more to the master the sentinels name now: the server
    /// refused it or the connection is gone (not after a timeout: the time is spent).
    fn check<T>(&self, epoch: u64, r: &RedisResult<T>) -> bool {
        let Err(e) = r else { return false };
        let moved = matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
            || e.is_connection_dropped()
            || e.is_connection_refusal();
        let stale = moved
            || e.is_io_error()
            || e.is_timeout()
            || e.is_unrecoverable_error()
            || e.code() == Some("LOADING");
        if stale {
            let mut now = lock(&self.now);
            if now.as_ref().is_some_and(|m| m.epoch == epoch) {
                *now = None;
            }
        }
        moved && !e.is_timeout()
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Direct(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(s) => Box::pin(async move {
                let mut m = s.current().await?;
                let r = m.conn.req_packed_command(cmd).await;
                if s.check(m.epoch, &r) {
                    // The master changed: once more on the one the sentinels name now (every
                    // script of the store is safe to repeat).
                    let mut m = s.current().await?;
                    let r = m.conn.req_packed_command(cmd).await;
                    s.check(m.epoch, &r);
                    return r;
                }
                r
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Direct(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Sentinel(s) => Box::pin(async move {
                let mut m = s.current().await?;
                let r = m.conn.req_packed_commands(cmd, offset, count).await;
                if s.check(m.epoch, &r) {
                    let mut m = s.current().await?;
                    let r = m.conn.req_packed_commands(cmd, offset, count).await;
                    s.check(m.epoch, &r);
                    return r;
                }
                r
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Direct(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(_) => 0,
        }
    }
}
