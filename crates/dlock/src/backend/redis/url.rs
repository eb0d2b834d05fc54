//! `redis://`, `rediss://`, `redis+sentinel://` and `redis+cluster://` URLs: where to connect
//! and the dlock options.

use crate::error::{Error, Result};
use crate::url::{clip, parse_duration_option, parse_host_list, percent_decode, redact_url};
use url::Url;

/// How the Redis servers of a URL are deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Deployment {
    /// One server (`redis://`, `rediss://`): [`RedisTarget::url`].
    Direct,
    /// The master that Sentinel names (`redis+sentinel://s1,s2,s3/MASTER`).
    Sentinel {
        /// `host:port` of every sentinel.
        sentinels: Vec<String>,
        /// The master's name in Sentinel (`sentinel monitor NAME …`).
        master: String,
        /// The database number (`db`, default 0).
        db: i64,
        /// Credentials for the sentinels (`sentinel_user`, `sentinel_password`; default: the
        /// URL's own).
        sentinel_user: Option<String>,
        sentinel_password: Option<String>,
    },
    /// A Redis Cluster (`redis+cluster://h1:p1,h2:p2`): `redis://host:port` of each seed node.
    Cluster {
        /// `redis://host:port` of each seed node.
        nodes: Vec<String>,
    },
}

/// A parsed Redis URL: where to connect and the dlock options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedisTarget {
    /// The URL handed to the Redis client (for [`Deployment::Direct`]): the given URL without
    /// dlock's query options.
    pub url: String,
    /// Where the servers are.
    pub deployment: Deployment,
    /// The user of the Redis servers (Sentinel and Cluster URLs; a direct URL carries it in `url`).
    pub user: Option<String>,
    /// The URL with the password redacted, for messages.
    pub shown: String,
    /// The password, if any, so messages from the server can be scrubbed of it.
    pub password: Option<String>,
    /// Prepended to every key (`prefix`, default `dlock:`).
    pub prefix: String,
    /// Wrap the lock name in `{}` so all keys of a name share a cluster slot (`hashtag`, default true).
    pub hashtag: bool,
    /// How long connecting may take (`connect_timeout`, default 3 s).
    pub connect_timeout: std::time::Duration,
    /// How long one command (or pipeline) may take (`timeout`, default 2 s).
    pub timeout: std::time::Duration,
    /// Replicas that must confirm every grant and renewal (`replicas`, default 0: no `WAIT`).
    pub replicas: u32,
    /// How long `WAIT` waits for them (`replicas_timeout`, default 500 ms, less than `timeout`).
    pub replicas_timeout: std::time::Duration,
    /// A released mutex is handed to its first registered waiter (see the module docs). Off
    /// with `replicas=N` (a hand-off is written by the release, which no `WAIT` confirms). On
    /// for Redlock's servers, where waiters register and releases hand on only on the name's
    /// lead server (see `backend::redlock`).
    pub handoffs: bool,
}

/// The default key prefix of the Redis store.
pub(crate) const REDIS_DEFAULT_PREFIX: &str = "dlock:";
/// The default connect timeout of the Redis store.
pub(crate) const REDIS_DEFAULT_CONNECT_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(3);
/// The default command timeout of the Redis store.
pub(crate) const REDIS_DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// The default time `WAIT` may take with `replicas=N`.
pub(crate) const REDIS_DEFAULT_REPLICAS_TIMEOUT: std::time::Duration =
    std::time::Duration::from_millis(500);

/// The options every Redis URL takes, and those only one kind takes.
const COMMON_OPTIONS: &str =
    "prefix, hashtag, connect_timeout, timeout, replicas, replicas_timeout";

impl RedisTarget {
    /// Parses a Redis URL and its dlock options.
    pub(crate) fn parse(raw: &str) -> Result<RedisTarget> {
        for (scheme, sentinel) in [("redis+sentinel://", true), ("redis+cluster://", false)] {
            if let Some(rest) = raw.strip_prefix(scheme) {
                return Self::from_host_list(raw, rest, sentinel);
            }
        }
        if raw.starts_with("rediss+sentinel://") || raw.starts_with("rediss+cluster://") {
            return Err(Error::InvalidConfig(format!(
                "{}: TLS to Sentinel or Cluster deployments is not supported yet \
                 (redis+sentinel:// and redis+cluster:// connect without TLS)",
                redact_url(raw)
            )));
        }
        let u = Url::parse(raw).map_err(|e| {
            Error::InvalidConfig(format!("malformed redis URL {}: {e}", redact_url(raw)))
        })?;
        Self::from_url(raw, &u)
    }

    /// A target with the defaults, for the URL `u` (whose query options are read after).
    fn defaults(raw: &str, u: &Url, deployment: Deployment) -> Result<RedisTarget> {
        let shown = redact_url(raw);
        if u.fragment().is_some() {
            return Err(Error::InvalidConfig(format!(
                "redis URL {shown} has a fragment; dlock does not use it"
            )));
        }
        let mut plain = u.clone();
        plain.set_query(None);
        let decode = |s: &str| percent_decode(s).unwrap_or_else(|| s.to_string());
        Ok(RedisTarget {
            url: plain.to_string(),
            deployment,
            user: Some(decode(u.username())).filter(|s| !s.is_empty()),
            shown,
            password: u.password().map(decode),
            prefix: REDIS_DEFAULT_PREFIX.to_string(),
            hashtag: true,
            connect_timeout: REDIS_DEFAULT_CONNECT_TIMEOUT,
            timeout: REDIS_DEFAULT_TIMEOUT,
            replicas: 0,
            replicas_timeout: REDIS_DEFAULT_REPLICAS_TIMEOUT,
            handoffs: true,
        })
    }

    fn from_url(raw: &str, u: &Url) -> Result<RedisTarget> {
        let mut t = Self::defaults(raw, u, Deployment::Direct)?;
        let shown = &t.shown;
        if u.host_str().map_or(true, str::is_empty) {
            return Err(Error::InvalidConfig(format!(
                "redis URL {shown} has no host (example: redis://127.0.0.1:6379/0)"
            )));
        }
        let db = u.path().trim_start_matches('/');
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(Error::InvalidConfig(format!(
                "redis URL {shown}: the path must be a database number, got {db_shown}",
                db_shown = clip(db)
            )));
        }
        for (k, v) in u.query_pairs() {
            if !t.common_option(&k, &v)? {
                return Err(unknown_option(u.scheme(), &k, ""));
            }
        }
        t.check()?;
        Ok(t)
    }

    /// `redis+sentinel://[user:pw@]s1:26379,s2/MASTER?db=N…` or
    /// `redis+cluster://[user:pw@]h1:p1,h2:p2/…`.
    fn from_host_list(raw: &str, rest: &str, sentinel: bool) -> Result<RedisTarget> {
        let (store, example, default_port) = if sentinel {
            (
                "redis+sentinel",
                "redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster",
                26379,
            )
        } else {
            (
                "redis+cluster",
                "redis+cluster://h1:7000,h2:7001,h3:7002",
                6379,
            )
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        if hosts.is_empty() {
            return Err(Error::InvalidConfig(format!(
                "{store} URL {} has no host (example: {example})",
                redact_url(raw)
            )));
        }
        let hosts = parse_host_list(hosts, default_port, store, example)?;
        // The url crate reads the userinfo, path and query of a stand-in with one host.
        let stand_in = match userinfo {
            Some(u) => format!("redis://{u}@h{tail}"),
            None => format!("redis://h{tail}"),
        };
        let u = Url::parse(&stand_in).map_err(|e| {
            Error::InvalidConfig(format!("malformed {store} URL {}: {e}", redact_url(raw)))
        })?;
        let path = u.path().trim_start_matches('/');
        let deployment = if sentinel {
            if path.is_empty() || path.contains('/') {
                return Err(Error::InvalidConfig(format!(
                    "{store} URL {}: the path must be the master's name in Sentinel \
                     (example: {example})",
                    redact_url(raw)
                )));
            }
            Deployment::Sentinel {
                sentinels: hosts,
                master: percent_decode(path).unwrap_or_else(|| path.to_string()),
                db: 0,
                sentinel_user: None,
                sentinel_password: None,
            }
        } else {
            if !path.is_empty() {
                return Err(Error::InvalidConfig(format!(
                    "{store} URL {}: a cluster has no database or path (example: {example})",
                    redact_url(raw)
                )));
            }
            Deployment::Cluster {
                nodes: hosts.iter().map(|h| format!("redis://{h}")).collect(),
            }
        };
        let mut t = Self::defaults(raw, &u, deployment)?;
        t.url = String::new();
        t.shown = redact_url(raw);
        for (k, v) in u.query_pairs() {
            if t.common_option(&k, &v)? {
                continue;
            }
            let Deployment::Sentinel {
                db,
                sentinel_user,
                sentinel_password,
                ..
            } = &mut t.deployment
            else {
                return Err(unknown_option(store, &k, ""));
            };
            match &*k {
                "db" => {
                    *db = v.parse::<u32>().map(i64::from).map_err(|_| {
                        Error::InvalidConfig(format!(
                            "option db={}: expected a database number",
                            clip(&v)
                        ))
                    })?
                }
                "sentinel_user" => *sentinel_user = Some(v.into_owned()),
                "sentinel_password" => *sentinel_password = Some(v.into_owned()),
                _ => {
                    return Err(unknown_option(
                        store,
                        &k,
                        ", db, sentinel_user, sentinel_password",
                    ))
                }
            }
        }
        if !t.hashtag && !sentinel {
            return Err(Error::InvalidConfig(format!(
                "{store} URL {}: hashtag=false is not possible on a cluster (the keys of one \
                 lock must share a slot)",
                t.shown
            )));
        }
        t.check()?;
        Ok(t)
    }

    /// Applies an option every Redis URL takes; `Ok(false)` if `k` is not one.
    fn common_option(&mut self, k: &str, v: &str) -> Result<bool> {
        match k {
            "prefix" => {
                if v.contains('{') || v.contains('}') {
                    return Err(Error::InvalidConfig(format!(
                        "option prefix={}: must not contain {{ or }} (the lock name is the hash tag)",
                        clip(v)
                    )));
                }
                self.prefix = v.to_owned();
            }
            "hashtag" => {
                self.hashtag = match v {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    other => {
                        return Err(Error::InvalidConfig(format!(
                            "option hashtag={}: expected true or false",
                            clip(other)
                        )))
                    }
                }
            }
            "connect_timeout" => self.connect_timeout = parse_duration_option(k, v)?,
            "timeout" => self.timeout = parse_duration_option(k, v)?,
            "replicas" => {
                self.replicas = v.parse::<u32>().ok().filter(|n| *n <= 64).ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "option replicas={}: expected a number of replicas, 0 to 64",
                        clip(v)
                    ))
                })?
            }
            "replicas_timeout" => self.replicas_timeout = parse_duration_option(k, v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks the options against each other.
    fn check(&self) -> Result<()> {
        if self.replicas > 0 && self.replicas_timeout >= self.timeout {
            return Err(Error::InvalidConfig(format!(
                "redis URL {}: replicas_timeout ({:?}) must be less than timeout ({:?}): WAIT \
                 runs inside one command's time",
                self.shown, self.replicas_timeout, self.timeout
            )));
        }
        Ok(())
    }
}

fn unknown_option(scheme: &str, k: &str, more: &str) -> Error {
    Error::InvalidConfig(format!(
        "unknown option {} in {scheme} URL (known: {COMMON_OPTIONS}{more})",
        clip(k)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis() {
        let Ok(t) = RedisTarget::parse("redis://u:p%40ss@h:6380/2") else {
            panic!("not redis")
        };
        assert_eq!(t.url, "redis://u:p%40ss@h:6380/2");
        assert_eq!(t.shown, "redis://u:***@h:6380/2");
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!(t.prefix, "dlock:");
        assert!(t.hashtag);
        assert_eq!(t.timeout, REDIS_DEFAULT_TIMEOUT);
        let Ok(t) = RedisTarget::parse(
            "rediss://h/?prefix=app%3Alocks%3A&hashtag=false&connect_timeout=250ms&timeout=1.5",
        ) else {
            panic!("not redis")
        };
        assert_eq!(t.url, "rediss://h/");
        assert_eq!(t.prefix, "app:locks:");
        assert!(!t.hashtag);
        assert_eq!(t.connect_timeout, std::time::Duration::from_millis(250));
        assert_eq!(t.timeout, std::time::Duration::from_millis(1500));
        for bad in [
            "redis://h/?bogus=1",
            "redis://h/?prefix=a%7Bb",
            "redis://h/?hashtag=maybe",
            "redis://h/?timeout=0",
            "redis://h/?timeout=soon",
            "redis://:pw@h/x",
            "redis:///0",
        ] {
            let e = RedisTarget::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
    }

    #[test]
    fn parses_sentinel_and_cluster() {
        let t = RedisTarget::parse(
            "redis+sentinel://u:p%40ss@s1:26379,s2,[::1]:26380/my%20master?db=3&replicas=1\
             &sentinel_password=sp&timeout=3s",
        )
        .unwrap();
        assert_eq!(
            t.deployment,
            Deployment::Sentinel {
                sentinels: vec!["s1:26379".into(), "s2:26379".into(), "[::1]:26380".into()],
                master: "my master".into(),
                db: 3,
                sentinel_user: None,
                sentinel_password: Some("sp".into()),
            }
        );
        assert_eq!(t.user.as_deref(), Some("u"));
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!(t.replicas, 1);
        assert_eq!(t.replicas_timeout, REDIS_DEFAULT_REPLICAS_TIMEOUT);
        assert!(
            !t.shown.contains("p%40ss") && !t.shown.contains("=sp"),
            "{}",
            t.shown
        );
        let t = RedisTarget::parse("redis+cluster://h1:7000,h2:7001/?prefix=x:").unwrap();
        assert_eq!(
            t.deployment,
            Deployment::Cluster {
                nodes: vec!["redis://h1:7000".into(), "redis://h2:7001".into()]
            }
        );
        assert_eq!(t.prefix, "x:");
        let t = RedisTarget::parse("redis://h/?replicas=2&replicas_timeout=100ms").unwrap();
        assert_eq!(
            (t.replicas, t.replicas_timeout),
            (2, std::time::Duration::from_millis(100))
        );
        for bad in [
            "redis+sentinel://s1,s2",
            "redis+sentinel://s1/m/x",
            "redis+sentinel://:pw@/m",
            "redis+sentinel://s1/m?db=x",
            "redis+sentinel://s1/m?bogus=1",
            "redis+sentinel://s1:0/m",
            "redis+cluster://h1/3",
            "redis+cluster://h1?db=1",
            "redis+cluster://:pw@h1?hashtag=false",
            "rediss+cluster://:pw@h1",
            "redis://h/?replicas=-1",
            "redis://h/?replicas=65",
            "redis://h/?replicas=1&replicas_timeout=2s",
        ] {
            let e = RedisTarget::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
    }

    #[test]
    fn error_values_are_clipped() {
        let e = RedisTarget::parse(&format!("redis://h/{}", "9".repeat(10_000))).unwrap_err();
        assert!(e.to_string().len() < 600, "{e}");
        let e =
            RedisTarget::parse(&format!("redis://h/?timeout={}", "x".repeat(10_000))).unwrap_err();
        assert!(e.to_string().len() < 600, "{e}");
    }
}
