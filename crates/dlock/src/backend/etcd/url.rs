//! `etcd://[user:password@]h1:2379,h2:2379/prefix?ttl=10s&timeout=5s` and `etcds://…` (TLS) URLs.

use crate::error::{Error, Result};
use crate::url::{clip, parse_duration_option, parse_host_list, percent_decode};
use std::time::Duration;

/// The lease TTL when the URL does not set `ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The bound of one request when the URL does not set `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The key prefix when the URL has no path.
pub const DEFAULT_PREFIX: &str = "dlock";

/// A parsed `etcd://` or `etcds://` URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct EtcdTarget {
    /// `http://h:p` or `https://h:p`, one per member.
    pub endpoints: Vec<String>,
    /// User and password (`etcd://user:password@…`), for etcd's own authentication.
    pub user: Option<(String, String)>,
    /// Every key of dlock starts with `<prefix>/`.
    pub prefix: String,
    /// The TTL of the client's lease, in whole seconds (etcd's unit).
    pub ttl: Duration,
    /// The bound of one request.
    pub timeout: Duration,
    /// TLS: a PEM file of the certificate authorities to trust instead of the system's (`ca=`).
    pub ca: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for EtcdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTarget")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(u, _)| (u, "***")))
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("ca", &self.ca)
            .finish()
    }
}

/// Parses an `etcd://` or `etcds://` URL.
pub(crate) fn parse(raw: &str) -> Result<EtcdTarget> {
    let bad = |why: String| Error::InvalidConfig(format!("bad etcd URL: {why}"));
    let (tls, rest) = if let Some(r) = raw.strip_prefix("etcds://") {
        (true, r)
    } else if let Some(r) = raw.strip_prefix("etcd://") {
        (false, r)
    } else {
        return Err(bad("must start with etcd:// or etcds://".into()));
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (u, p) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let u = percent_decode(u).ok_or_else(|| bad("the user is not UTF-8".into()))?;
            let p = percent_decode(p).ok_or_else(|| bad("the password is not UTF-8".into()))?;
            if u.is_empty() {
                return Err(bad(
                    "a password needs a user (etcd://user:password@host)".into()
                ));
            }
            (Some((u, p)), hosts)
        }
        None => (None, authority),
    };
    let scheme = if tls { "https" } else { "http" };
    let endpoints = parse_host_list(hosts, 2379, "etcd", "etcd://e1:2379,e2:2379,e3:2379/locks")?
        .into_iter()
        .map(|h| format!("{scheme}://{h}"))
        .collect();
    let prefix = percent_decode(path.trim_matches('/'))
        .ok_or_else(|| bad("the prefix is not UTF-8".into()))?;
    let prefix = if prefix.is_empty() {
        DEFAULT_PREFIX.to_owned()
    } else {
        prefix
    };
    if prefix.chars().any(char::is_control) {
        return Err(bad(format!(
            "the prefix {} has control characters",
            clip(&prefix)
        )));
    }
    let mut target = EtcdTarget {
        endpoints,
        user,
        prefix,
        ttl: DEFAULT_TTL,
        timeout: DEFAULT_TIMEOUT,
        ca: None,
    };
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "ttl" => {
                let d = parse_duration_option("ttl", &v)?;
                // etcd counts leases in whole seconds: round up.
                let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
                if !(1..=3600).contains(&secs) {
                    return Err(bad(format!(
                        "ttl={}: write a lease TTL between 1s and 1h, e.g. 10s",
                        clip(&v)
                    )));
                }
                target.ttl = Duration::from_secs(secs);
            }
            "timeout" => {
                let d = parse_duration_option("timeout", &v)?;
                if d > Duration::from_secs(600) {
                    return Err(bad(format!("timeout={}: at most 10m", clip(&v))));
                }
                target.timeout = d;
            }
            "ca" if tls => target.ca = Some(std::path::PathBuf::from(&*v)),
            "ca" => return Err(bad("ca= is for etcds:// (TLS) URLs".into())),
            k => {
                return Err(Error::InvalidConfig(format!(
                    "unknown option {} in etcd URL (known: ttl, timeout, ca)",
                    clip(k)
                )))
            }
        }
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_prefix_and_options() {
        let t = parse("etcd://a:1,b,[::1]:3/locks/x?ttl=2s&timeout=500ms").unwrap();
        assert_eq!(
            t.endpoints,
            ["http://a:1", "http://b:2379", "http://[::1]:3"]
        );
        assert_eq!(t.prefix, "locks/x");
        assert_eq!(t.ttl, Duration::from_secs(2));
        assert_eq!(t.timeout, Duration::from_millis(500));
        assert_eq!(t.user, None);
        let t = parse("etcds://u:p%40ss@h/?ttl=1500ms&ca=/etc/ca.pem").unwrap();
        assert_eq!(t.endpoints, ["https://h:2379"]);
        assert_eq!(t.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(t.prefix, DEFAULT_PREFIX);
        assert_eq!(t.ttl, Duration::from_secs(2), "rounded up to whole seconds");
        assert!(!format!("{t:?}").contains("p@ss"));
    }

    #[test]
    fn refuses_bad_urls_clearly() {
        for bad in [
            "etcd://",
            "etcd://h:0/x",
            "etcd://h:x/x",
            "etcd://h/x?ttl=0s",
            "etcd://h/x?ttl=2h",
            "etcd://h/x?bogus=1",
            "etcd://h/x?ca=/x.pem",
            "etcd://:pw@h/x",
            "etcd://a b/x",
            "http://h/x",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
    }
}
