//! `redis://` and `rediss://` URLs: where to connect and the dlock options.

use crate::error::{Error, Result};
use crate::url::{clip, parse_duration_option, percent_decode, redact_url};
use url::Url;

/// A parsed `redis://` / `rediss://` URL: where to connect and the dlock options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedisTarget {
    /// The URL handed to the Redis client: the given URL without dlock's query options.
    pub url: String,
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
}

/// The default key prefix of the Redis store.
pub(crate) const REDIS_DEFAULT_PREFIX: &str = "dlock:";
/// The default connect timeout of the Redis store.
pub(crate) const REDIS_DEFAULT_CONNECT_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(3);
/// The default command timeout of the Redis store.
pub(crate) const REDIS_DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl RedisTarget {
    /// Parses a `redis://` or `rediss://` URL and its dlock options.
    pub(crate) fn parse(raw: &str) -> Result<RedisTarget> {
        let u = Url::parse(raw).map_err(|e| {
            Error::InvalidConfig(format!("malformed redis URL {}: {e}", redact_url(raw)))
        })?;
        Self::from_url(raw, &u)
    }

    fn from_url(raw: &str, u: &Url) -> Result<RedisTarget> {
        let shown = redact_url(raw);
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
        if u.fragment().is_some() {
            return Err(Error::InvalidConfig(format!(
                "redis URL {shown} has a fragment; dlock does not use it"
            )));
        }
        let mut prefix = REDIS_DEFAULT_PREFIX.to_string();
        let mut hashtag = true;
        let mut connect_timeout = REDIS_DEFAULT_CONNECT_TIMEOUT;
        let mut timeout = REDIS_DEFAULT_TIMEOUT;
        for (k, v) in u.query_pairs() {
            match &*k {
                "prefix" => {
                    if v.contains('{') || v.contains('}') {
                        return Err(Error::InvalidConfig(format!(
                            "option prefix={v_shown}: must not contain {{ or }} (the lock name is the hash tag)", v_shown = clip(&v)
                        )));
                    }
                    prefix = v.into_owned();
                }
                "hashtag" => {
                    hashtag = match &*v {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        other => {
                            return Err(Error::InvalidConfig(format!(
                                "option hashtag={other_shown}: expected true or false", other_shown = clip(other)
                            )))
                        }
                    }
                }
                "connect_timeout" => connect_timeout = parse_duration_option(&k, &v)?,
                "timeout" => timeout = parse_duration_option(&k, &v)?,
                other => {
                    return Err(Error::InvalidConfig(format!(
                        "unknown option {other_shown} in {} URL (known: prefix, hashtag, connect_timeout, timeout)",
                        u.scheme(),
                        other_shown = clip(other)
                    )))
                }
            }
        }
        let mut plain = u.clone();
        plain.set_query(None);
        let password = u
            .password()
            .map(|p| percent_decode(p).unwrap_or_else(|| p.to_string()));
        Ok(RedisTarget {
            url: plain.to_string(),
            shown,
            password,
            prefix,
            hashtag,
            connect_timeout,
            timeout,
        })
    }
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
    fn error_values_are_clipped() {
        let e = RedisTarget::parse(&format!("redis://h/{}", "9".repeat(10_000))).unwrap_err();
        assert!(e.to_string().len() < 600, "{e}");
        let e =
            RedisTarget::parse(&format!("redis://h/?timeout={}", "x".repeat(10_000))).unwrap_err();
        assert!(e.to_string().len() < 600, "{e}");
    }
}
