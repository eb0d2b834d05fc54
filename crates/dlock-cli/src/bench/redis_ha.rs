//! Redis with fail-over for the bench: the master that Sentinel names (`redis+sentinel://`) and
//! the nodes of a Redis Cluster (`redis+cluster://`), found with the clients dlock's store uses
//! (redis-rs's `SentinelClient` and async `ClusterClient`), for the raw floor, the probes and
//! the rslock peer.

use super::store::{limit, Kind, Target};
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr};
use std::time::Duration;

/// dlock's Redis defaults: connecting may take 3 s, one command 2 s.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const TIMEOUT: Duration = Duration::from_secs(2);
const OP: Duration = Duration::from_secs(10);

/// The connection options of dlock's command connection (its default timeouts).
pub fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(CONNECT_TIMEOUT)
        .set_response_timeout(TIMEOUT)
}

/// `redis://[userinfo]host:port/db` of one server of `t`'s deployment.
pub fn server_url(t: &Target, host: &str, port: u16, db: i64) -> String {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    format!("redis://{}{host}:{port}/{db}", t.userinfo)
}

/// The master's name in a `redis+sentinel://…/NAME` URL.
pub fn master_name(t: &Target) -> String {
    let rest = &t.url[t.url.find("://").map(|i| i + 3).unwrap_or(0)..];
    let path = rest.split('?').next().unwrap_or("");
    let name = path.find('/').map(|i| &path[i + 1..]).unwrap_or("");
    super::store::pct_decode(name)
}

/// The database of a Sentinel URL (`db=N`, default 0).
fn sentinel_db(t: &Target) -> i64 {
    t.option("db").and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The current master of a Sentinel deployment, asked of the sentinels with redis-rs's
/// `SentinelClient` built as dlock's store builds it (the URL's credentials for the master and,
/// unless `sentinel_user`/`sentinel_password` say otherwise, for the sentinels): its client and
/// `(host, port)`.
pub async fn sentinel_master(t: &Target) -> Result<(redis::Client, (String, u16)), String> {
    let addrs: Vec<ConnectionAddr> = t
        .servers
        .iter()
        .map(|(h, p)| ConnectionAddr::Tcp(h.trim_matches(['[', ']']).to_string(), *p))
        .collect();
    let bad = |e: redis::RedisError| format!("{}: {e}", t.shown);
    let mut b = SentinelClientBuilder::new(addrs, master_name(t), SentinelServerType::Master)
        .map_err(bad)?
        .set_client_to_redis_db(sentinel_db(t));
    let (user, password) = t.credentials();
    if let Some(u) = &user {
        b = b.set_client_to_redis_username(u.clone());
    }
    if let Some(p) = &password {
        b = b.set_client_to_redis_password(p.clone());
    }
    if let Some(u) = t.option("sentinel_user").or(user) {
        b = b.set_client_to_sentinel_username(u);
    }
    if let Some(p) = t.option("sentinel_password").or(password) {
        b = b.set_client_to_sentinel_password(p);
    }
    let mut sentinel = b.build().map_err(bad)?;
    let client = limit(
        "the master from the sentinels",
        OP,
        sentinel.async_get_client(),
    )
    .await?;
    let addr = match &client.get_connection_info().addr {
        ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
        ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
        other => return Err(format!("the sentinels named a master at {other}")),
    };
    Ok((client, addr))
}

/// A node of a Redis Cluster, as `CLUSTER NODES` lists it.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    /// Its address.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// A master that serves slots (else a replica, or a master without slots).
    pub master: bool,
}

/// The nodes of a Redis Cluster, asked of the first seed of `t` that answers `CLUSTER NODES`.
pub async fn cluster_nodes(t: &Target) -> Result<Vec<ClusterNode>, String> {
    let mut last = String::from("no seed node");
    for (h, p) in &t.servers {
        let url = server_url(t, h, *p, 0);
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let text = limit("CLUSTER NODES", OP, async {
            let mut c = client
                .get_multiplexed_async_connection_with_config(&connection_config())
                .await?;
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut c)
                .await
        })
        .await;
        match text {
            Ok(text) => return parse_cluster_nodes(&text),
            Err(e) => last = format!("{h}:{p}: {e}"),
        }
    }
    Err(format!("{}: {last}", t.shown))
}

/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`
fn parse_cluster_nodes(text: &str) -> Result<Vec<ClusterNode>, String> {
    let mut nodes = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let flags: Vec<&str> = f[2].split(',').collect();
        if flags
            .iter()
            .any(|x| matches!(*x, "fail" | "noaddr" | "handshake"))
        {
            continue;
        }
        let addr = f[1].split(['@', ',']).next().unwrap_or("");
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        nodes.push(ClusterNode {
            host: host.trim_matches(['[', ']']).to_string(),
            port,
            master: flags.contains(&"master") && f.len() > 8,
        });
    }
    if !nodes.iter().any(|n| n.master) {
        return Err(format!("CLUSTER NODES lists no master with slots:\n{text}"));
    }
    Ok(nodes)
}

/// redis-rs's async cluster connection, built as dlock's store builds its command connection
/// (its timeouts, 2 retries, the URL's credentials; RESP2, no push sender).
pub async fn cluster_connection(
    t: &Target,
) -> Result<redis::cluster_async::ClusterConnection, String> {
    let nodes: Vec<String> = t
        .servers
        .iter()
        .map(|(h, p)| server_url(t, h, *p, 0))
        .collect();
    let mut b = redis::cluster::ClusterClientBuilder::new(nodes)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(TIMEOUT)
        .retries(2);
    let (user, password) = t.credentials();
    if let Some(u) = user {
        b = b.username(u);
    }
    if let Some(p) = password {
        b = b.password(p);
    }
    let client = b.build().map_err(|e| format!("{}: {e}", t.shown))?;
    limit("raw cluster connection", OP, client.get_async_connection()).await
}

/// `redis://` URLs of the servers the rslock peer locks on: every server of `redis://` and
/// `redlock://`, the current master of a Sentinel deployment (rslock has no Sentinel support,
/// so it is given the address Sentinel names now). Cluster: `Err` (rslock has no cluster client).
pub async fn rslock_urls(t: &Target) -> Result<Vec<String>, String> {
    match t.kind {
        Kind::RedisSentinel => {
            let (_, (h, p)) = sentinel_master(t).await?;
            Ok(vec![server_url(t, &h, p, sentinel_db(t))])
        }
        Kind::RedisCluster => Err(RSLOCK_NOT_ON_CLUSTER.into()),
        _ => Ok(t.redis_urls()),
    }
}

/// Why the rslock peer does not run on a cluster.
pub const RSLOCK_NOT_ON_CLUSTER: &str =
    "peer rslock: not supported on a Redis Cluster (rslock 0.10 locks on independent servers: no \
     slot routing, MOVED or ASK); dlock and the raw floor only";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_text() {
        let text = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n\
                    b2 127.0.0.1:7002@17002,host2 master - 0 1 2 connected 5461-10922\n\
                    c3 127.0.0.1:7003@17003 slave a1 0 1 1 connected\n\
                    d4 127.0.0.1:7004@17004 master,fail - 0 1 3 disconnected 10923-16383\n\
                    e5 127.0.0.1:7005@17005 master - 0 1 4 connected\n";
        let n = parse_cluster_nodes(text).unwrap();
        let masters: Vec<u16> = n.iter().filter(|n| n.master).map(|n| n.port).collect();
        assert_eq!(masters, vec![7001, 7002]);
        assert_eq!(n.len(), 4);
        assert!(parse_cluster_nodes("c3 127.0.0.1:7003@17003 slave a1 0 1 1 connected").is_err());
    }

    #[test]
    fn sentinel_urls() {
        let t =
            Target::parse("redis+sentinel://u:p%40w@s1:1,s2/my%20master?db=2&replicas=1").unwrap();
        assert_eq!(t.kind, Kind::RedisSentinel);
        assert_eq!(
            t.servers,
            vec![("s1".to_string(), 1), ("s2".to_string(), 26379)]
        );
        assert_eq!(master_name(&t), "my master");
        assert_eq!(sentinel_db(&t), 2);
        assert_eq!(t.label(), "redis-sentinel+wait");
        assert_eq!(t.wait(), Some((1, 500)));
        assert_eq!(
            t.credentials(),
            (Some("u".to_string()), Some("p@w".to_string()))
        );
        assert_eq!(server_url(&t, "h", 5, 2), "redis://u:p%40w@h:5/2");
        let t = Target::parse("redis+cluster://h1:7000,h2:7001/?replicas=2&replicas_timeout=0.1")
            .unwrap();
        assert_eq!(t.kind, Kind::RedisCluster);
        assert_eq!(t.label(), "redis-cluster+wait×2");
        assert_eq!(t.wait(), Some((2, 100)));
        let t = Target::parse("redis+cluster://h1:7000").unwrap();
        assert_eq!((t.label().as_str(), t.wait()), ("redis-cluster", None));
        let t = Target::parse("redis://h/?replicas=1&replicas_timeout=250ms").unwrap();
        assert_eq!(
            (t.label().as_str(), t.wait()),
            ("redis+wait", Some((1, 250)))
        );
        assert!(Target::parse("rediss+cluster://h1").is_err());
    }
}
