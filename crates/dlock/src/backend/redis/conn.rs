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
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError,
    RedisFuture, RedisResult, Value,
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
                let s = SentinelConn::new(target)?;
                s.current().await.map_err(unavailable)?;
                Ok((Conn::Sentinel(Arc::new(s)), None))
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

/// A cluster client for `target`; `push` receives the RESP3 pushes (sharded pub/sub).
pub(super) fn cluster_client(
    target: &RedisTarget,
    push: Option<tokio::sync::mpsc::UnboundedSender<::redis::PushInfo>>,
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
    if let Some(tx) = push {
        b = b
            .use_protocol(::redis::ProtocolVersion::RESP3)
            .push_sender(tx);
    }
    b.build().map_err(|e| {
        Error::InvalidConfig(format!(
            "redis cluster URL {}: {}",
            target.shown,
            e.category()
        ))
    })
}

/// The connection to the master Sentinel names, found again when it fails.
pub(super) struct SentinelConn {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    now: StdMutex<Option<Master>>,
    config: AsyncConnectionConfig,
    connect_timeout: std::time::Duration,
    /// Counts the masters connected to.
    epoch: AtomicU64,
}

#[derive(Clone)]
struct Master {
    epoch: u64,
    conn: MultiplexedConnection,
    client: Client,
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
        let addrs = sentinels.iter().filter_map(|h| {
            let (host, port) = h.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some(ConnectionAddr::Tcp(host.to_owned(), port.parse().ok()?))
        });
        let bad = |e: RedisError| {
            Error::InvalidConfig(format!("sentinel URL {}: {}", target.shown, e.category()))
        };
        let mut b = SentinelClientBuilder::new(addrs, master.clone(), SentinelServerType::Master)
            .map_err(bad)?
            .set_client_to_redis_db(*db);
        if let Some(u) = &target.user {
            b = b.set_client_to_redis_username(u.clone());
        }
        if let Some(p) = &target.password {
            b = b.set_client_to_redis_password(p.clone());
        }
        if let Some(u) = sentinel_user.as_ref().or(target.user.as_ref()) {
            b = b.set_client_to_sentinel_username(u.clone());
        }
        if let Some(p) = sentinel_password.as_ref().or(target.password.as_ref()) {
            b = b.set_client_to_sentinel_password(p.clone());
        }
        Ok(SentinelConn {
            sentinel: tokio::sync::Mutex::new(b.build().map_err(bad)?),
            now: StdMutex::new(None),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(target.connect_timeout)
                .set_response_timeout(target.timeout),
            connect_timeout: target.connect_timeout,
            epoch: AtomicU64::new(0),
        })
    }

    /// The connection to the master, asking the sentinels for it if there is none.
    async fn current(&self) -> RedisResult<Master> {
        if let Some(m) = lock(&self.now).clone() {
            return Ok(m);
        }
        let mut sentinel = self.sentinel.lock().await;
        if let Some(m) = lock(&self.now).clone() {
            return Ok(m);
        }
        let find = async {
            // Asks the sentinels, then checks that the server answers ROLE as a master.
            let client = sentinel.async_get_client().await?;
            let conn = client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?;
            RedisResult::Ok((client, conn))
        };
        let (client, conn) = match tokio::time::timeout(self.connect_timeout, find).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(RedisError::from((
                    ErrorKind::IoError,
                    "the sentinels or the master they name did not answer in time",
                )))
            }
        };
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let m = Master {
            epoch,
            conn,
            client,
        };
        *lock(&self.now) = Some(m.clone());
        Ok(m)
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
