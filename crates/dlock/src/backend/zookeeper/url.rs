//! `zk://host:2181,host2:2181/chroot?session_timeout=10s` URLs.

use crate::error::{Error, Result};
use crate::url::{clip, parse_host_list, percent_decode};

/// A parsed `zk://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZkTarget {
    /// The connect string: `host:port,host:port` (port 2181 when not given).
    pub hosts: String,
    /// The chroot every lock lives under, `/` for none.
    pub chroot: String,
    /// The session timeout to ask the servers for (`session_timeout`, default 10 s).
    pub session_timeout: std::time::Duration,
}

/// `zk://host1:2181,host2:2181,host3:2181/chroot?session_timeout=10s` (after `zk://`).
pub(crate) fn parse(raw: &str) -> Result<ZkTarget> {
    let bad = |why: String| Error::InvalidConfig(format!("bad zk:// URL: {why}"));
    let rest = raw
        .strip_prefix("zk://")
        .ok_or_else(|| bad("must start with zk://".into()))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (hosts, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if hosts.contains('@') {
        return Err(bad("credentials in the URL are not supported".into()));
    }
    let list = parse_host_list(
        hosts,
        2181,
        "zk://",
        "zk://zk1:2181,zk2:2181,zk3:2181/locks",
    )?;
    let chroot = percent_decode(path.trim_end_matches('/'))
        .ok_or_else(|| bad("the chroot is not UTF-8".into()))?;
    let chroot = if chroot.is_empty() {
        "/".to_string()
    } else {
        for part in chroot[1..].split('/') {
            if part.is_empty() || part == "." || part == ".." {
                return Err(bad(format!(
                    "the chroot {chroot_shown} has an empty, \".\" or \"..\" component",
                    chroot_shown = clip(&chroot)
                )));
            }
            if part.chars().any(|c| {
                c.is_control() || ('\u{e000}'..='\u{f8ff}').contains(&c) || c >= '\u{fff0}'
            }) {
                return Err(bad(format!(
                    "the chroot {chroot_shown} has characters ZooKeeper forbids",
                    chroot_shown = clip(&chroot)
                )));
            }
        }
        if chroot == "/zookeeper" || chroot.starts_with("/zookeeper/") {
            return Err(bad("the chroot must not be inside /zookeeper".into()));
        }
        chroot
    };
    let mut session_timeout = std::time::Duration::from_secs(10);
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "session_timeout" => {
                session_timeout = parse_duration(&v)
                    .filter(|d| {
                        *d >= std::time::Duration::from_millis(100)
                            && *d <= std::time::Duration::from_secs(600)
                    })
                    .ok_or_else(|| {
                        bad(format!(
                        "session_timeout={v_shown}: write a duration between 100ms and 10m, e.g. 10s", v_shown = clip(&v)
                    ))
                    })?
            }
            k => {
                return Err(Error::InvalidConfig(format!(
                    "unknown option {k_shown} in zk URL", k_shown = clip(k)
                )))
            }
        }
    }
    Ok(ZkTarget {
        hosts: list.join(","),
        chroot,
        session_timeout,
    })
}

/// `250ms`, `10s`, `2m` (an integer and a unit).
fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let n: u64 = s[..digits].parse().ok()?;
    Some(match &s[digits..] {
        "ms" => std::time::Duration::from_millis(n),
        "s" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_secs(n.checked_mul(60)?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::url::redact_url;
    use std::time::Duration;

    #[test]
    fn parses_zk_urls() {
        let t = |u: &str| match parse(u) {
            Ok(t) => t,
            other => panic!("{u}: {other:?}"),
        };
        let a = t("zk://h1:2181,h2:2182,h3/locks/app?session_timeout=4s");
        assert_eq!(a.hosts, "h1:2181,h2:2182,h3:2181");
        assert_eq!(a.chroot, "/locks/app");
        assert_eq!(a.session_timeout, Duration::from_secs(4));
        let b = t("zk://127.0.0.1:1234");
        assert_eq!(
            (b.chroot.as_str(), b.session_timeout),
            ("/", Duration::from_secs(10))
        );
        assert_eq!(t("zk://[::1]:5/").chroot, "/");
        assert_eq!(
            t("zk://h/x?session_timeout=1500ms").session_timeout,
            Duration::from_millis(1500)
        );
        for bad in [
            "zk://",
            "zk://h:0",
            "zk://h:x",
            "zk://h,,k",
            "zk://u:pw@h/x",
            "zk://h/a//b",
            "zk://h/a/../b",
            "zk://h/zookeeper",
            "zk://h/x?bogus=1",
            "zk://h/x?session_timeout=10",
            "zk://h/x?session_timeout=1h",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
        assert_eq!(redact_url("zk://h:1,k:2/x"), "zk://h:1,k:2/x");
        assert!(!redact_url("zk://u:pw@h/x").contains("pw"));
    }
}
