//! `describe`: the lock names under a prefix (`SCAN`), then each name's holders and waiters
//! (the `describe` script, in pipelines).

use super::keys::{glob_escape, name_of_key, NUL_TAG};
use super::scripts::{array, int, text, unexpected};
use super::{parse_kind, parse_mode, Conn, RedisBackend};
use crate::backend::*;
use crate::error::Result;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Cmd, Value};

/// The nodes whose keys `describe` scans: `[None]` (the one server) or, on a cluster, every
/// master that serves slots, as `(host, port)`.
type ScanNodes = Vec<Option<(String, u16)>>;

/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: usize = 1000;
/// How many `describe` scripts go in one pipeline.
const DESCRIBE_BATCH: usize = 100;

impl RedisBackend {
    async fn scan_nodes(&self) -> Result<ScanNodes> {
        let sh = &self.shared;
        if !sh.sharded {
            return Ok(vec![None]);
        }
        let nodes: String = ::redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut sh.conn.clone())
            .await
            .map_err(|e| sh.err(e))?;
        // `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <state> <slots>…`
        let mut out = Vec::new();
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(flags)) = (f.get(1), f.get(2)) else {
                continue;
            };
            if !flags.split(',').any(|x| x == "master") || flags.contains("fail") || f.len() < 9 {
                continue;
            }
            let hostport = addr.split(['@', ',']).next().unwrap_or("");
            if let Some((host, port)) = hostport.rsplit_once(':') {
                if let Ok(port) = port.parse() {
                    out.push(Some((host.to_owned(), port)));
                }
            }
        }
        Ok(out)
    }

    /// The locks whose name starts with `prefix`.
    pub(super) async fn describe_all(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let sh = &self.shared;
        let t = &sh.target;
        let pattern = if t.hashtag && prefix.starts_with('}') {
            format!(
                "{}{{{NUL_TAG}{}*",
                glob_escape(&t.prefix),
                glob_escape(prefix)
            )
        } else if t.hashtag {
            format!("{}{{{}*", glob_escape(&t.prefix), glob_escape(prefix))
        } else {
            format!("{}{}*", glob_escape(&t.prefix), glob_escape(prefix))
        };
        let mut names: Vec<String> = Vec::new();
        for node in self.scan_nodes().await? {
            let mut cursor: u64 = 0;
            loop {
                let mut c = Cmd::new();
                c.arg("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let v = match (&node, &sh.conn) {
                    (Some((host, port)), Conn::Cluster(cc)) => {
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        });
                        cc.clone().route_command(&c, route).await
                    }
                    _ => c.query_async::<Value>(&mut sh.conn.clone()).await,
                };
                let (next, keys): (u64, Vec<Vec<u8>>) = v
                    .and_then(|v| ::redis::from_redis_value(&v))
                    .map_err(|e| sh.err(e))?;
                for k in keys {
                    let Ok(k) = String::from_utf8(k) else {
                        continue;
                    };
                    if let Some(n) = name_of_key(&sh.target, &k).filter(|n| n.starts_with(prefix)) {
                        names.push(n);
                    }
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        names.sort();
        names.dedup();
        let mut out = Vec::new();
        for chunk in names.chunks(DESCRIBE_BATCH) {
            let calls: Vec<(Vec<String>, Vec<String>)> = chunk
                .iter()
                .map(|n| {
                    let base = sh.base(n);
                    (
                        vec![
                            base.clone(),
                            [&*base, ":exp"].concat(),
                            [&*base, ":q"].concat(),
                            [&*base, ":qexp"].concat(),
                            [&*base, ":qinfo"].concat(),
                        ],
                        vec![[&*base, ":meta:"].concat()],
                    )
                })
                .collect();
            let answers = sh.eval_pipeline(&sh.scripts.describe, &calls).await?;
            for (n, v) in chunk.iter().zip(answers) {
                if let Some(info) = parse_describe(n, &v)? {
                    out.push(info);
                }
            }
        }
        Ok(out)
    }
}

/// Decodes the answer of `describe.lua` for `name`.
pub(super) fn parse_describe(name: &str, v: &Value) -> Result<Option<LockInfo>> {
    let a = array(v).ok_or_else(|| unexpected("describe answer", v))?;
    if a.is_empty() {
        return Ok(None);
    }
    let bad = || unexpected("describe answer", v);
    let kind_s = a.first().and_then(text).ok_or_else(bad)?;
    let permits = a.get(1).and_then(int).unwrap_or(0);
    let Some(kind) = parse_kind(&kind_s, permits) else {
        return Ok(None);
    };
    let mut holders = Vec::new();
    for h in a.get(2).and_then(array).ok_or_else(bad)? {
        let raw = array(h).ok_or_else(bad)?;
        let f: Vec<String> = raw.iter().map(|x| text(x).unwrap_or_default()).collect();
        if f.len() < 9 {
            return Err(bad());
        }
        // Nil (or absent: an older script) for a hold without a value.
        let value = match raw.get(9) {
            None | Some(Value::Nil) => None,
            Some(v) => Some(text(v).ok_or_else(bad)?),
        };
        holders.push(HolderInfo {
            owner: f[0].clone(),
            meta: HolderMeta {
                client_id: f[3].clone(),
                host: f[4].clone(),
                pid: f[5].parse().unwrap_or(0),
                value,
            },
            mode: parse_mode(&f[1]),
            token: f[7].parse().ok(),
            acquired_at_ms: f[6].parse().unwrap_or(0),
            lease_left_ms: f[2].parse::<u64>().ok(),
            status: match f[8].as_str() {
                "revoked" => HoldStatus::Revoked,
                "detached" => HoldStatus::Detached,
                _ => HoldStatus::Held,
            },
        });
    }
    // Grant order, like the other stores.
    holders.sort_by_key(|h| h.token.unwrap_or(0));
    let mut waiters = Vec::new();
    for (i, w) in a.get(3).and_then(array).ok_or_else(bad)?.iter().enumerate() {
        let f = array(w).ok_or_else(bad)?;
        let owner = f.first().and_then(text).ok_or_else(bad)?;
        let info = f.get(1).and_then(text).unwrap_or_default();
        let mut parts = info.splitn(4, '\n');
        let mode = parse_mode(parts.next().unwrap_or(""));
        let client_id = parts.next().unwrap_or("").to_owned();
        let host = parts.next().unwrap_or("").to_owned();
        let pid = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        waiters.push(WaiterInfo {
            owner,
            meta: HolderMeta {
                client_id,
                host,
                pid,
                value: None,
            },
            mode,
            position: u32::try_from(i).unwrap_or(u32::MAX),
        });
    }
    Ok(Some(LockInfo {
        name: name.to_owned(),
        kind,
        holders,
        waiters,
    }))
}
