//! The bottom floor of store URLs, shared by every store's own URL parser: redaction of secrets,
//! clipping of values quoted in errors, percent-decoding and duration options.

use crate::error::{Error, Result};
use url::Url;

/// Returns `url` with any password replaced by `***`, for logs, errors and listings. A URL
/// longer than 256 characters is shortened (`…` and its length), so a garbage URL cannot flood a
/// log line.
///
/// ```
/// assert_eq!(dlock::redact_url("redis://u:secret@h:6379/0"), "redis://u:***@h:6379/0");
/// ```
pub fn redact_url(url: &str) -> String {
    const SHOWN_MAX: usize = 256;
    let shown = redact_full(url);
    match shown.char_indices().nth(SHOWN_MAX) {
        Some((cut, _)) => format!("{}…({} bytes)", &shown[..cut], url.len()),
        None => shown,
    }
}

fn redact_full(url: &str) -> String {
    // Redlock, etcd, Sentinel and Cluster URLs list several hosts (not a URL the url crate can
    // read): redact the userinfo and the values of secret query options.
    for scheme in [
        "redlock://",
        "etcd://",
        "etcds://",
        "redis+sentinel://",
        "redis+cluster://",
    ] {
        if let Some(rest) = url.strip_prefix(scheme) {
            let authority = rest.split(['/', '?']).next().unwrap_or("");
            let shown = match authority.rsplit_once('@') {
                Some((userinfo, _)) if userinfo.contains(':') => {
                    let user = userinfo.split(':').next().unwrap_or("");
                    format!("{scheme}{user}:***@{}", &rest[userinfo.len() + 1..])
                }
                _ => url.to_string(),
            };
            return redact_query(&shown);
        }
    }
    // ZooKeeper URLs carry no credentials (and are not URLs the url crate can read).
    if url.starts_with("zk://") && !url.contains('@') {
        return url.to_string();
    }
    match Url::parse(url) {
        // Not a store URL: only its scheme (the url crate reads `http:user:pw@h` and the like in
        // ways where the secret ends up outside the password).
        Ok(u) if !KNOWN_SCHEMES.contains(&u.scheme()) => format!("{}:…", u.scheme()),
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            // Query options that may carry a secret (`?password=`, `?token=`…): values hidden.
            if u.query_pairs().any(|(k, _)| secret_option(&k)) {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret_option(&k) {
                            "***".to_string()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            let shown = u.to_string();
            // An `@` the URL parser did not read as the end of a userinfo (no `//host` part, as
            // in `user:password@host` without a scheme): hide everything before it. (A file
            // path with an `@` is shown shortened too: better than a password in a log.)
            if u.host().is_none() {
                if let (Some((scheme, _)), Some((_, after))) =
                    (shown.split_once(':'), shown.rsplit_once('@'))
                {
                    return format!("{scheme}:***@{after}");
                }
            }
            shown
        }
        // Not a URL we can read: show only its scheme, never the rest.
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) if is_scheme(scheme) => format!("{scheme}://…"),
            _ => "<unparseable URL>".to_string(),
        },
    }
}

/// `url` with the values of its secret query options (see [`secret_option`]) replaced by `***`.
fn redact_query(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if secret_option(k) => format!("{k}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
}

/// Every scheme dlock knows, built in or not.
const KNOWN_SCHEMES: &[&str] = &[
    "mem",
    "sqlite",
    "redis",
    "rediss",
    "redis+sentinel",
    "redis+cluster",
    "redlock",
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "zk",
    "etcd",
    "etcds",
];

/// A query option whose value is not shown (passwords, tokens, keys).
fn secret_option(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth", "key", "cred"]
        .iter()
        .any(|s| k.contains(s))
}

/// `[A-Za-z][A-Za-z0-9+.-]*`, as a URL scheme.
fn is_scheme(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic())
        && c.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
        && s.len() <= 32
}

/// A value from a URL for an error message: quoted, and at most 64 characters of it.
pub(crate) fn clip(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((cut, _)) => format!("{:?}…({} bytes)", &s[..cut], s.len()),
        None => format!("{s:?}"),
    }
}

#[cfg_attr(
    not(any(feature = "sqlite", feature = "redis", feature = "zookeeper")),
    allow(dead_code)
)]
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// Reads `h1:p1,h2,[::1]:p3` (a list of members): each `host[:port]` with the port
/// `default_port` when absent. `store` and `example` name the URL in errors.
#[cfg(any(feature = "zookeeper", feature = "etcd", feature = "redis"))]
pub(crate) fn parse_host_list(
    hosts: &str,
    default_port: u16,
    store: &str,
    example: &str,
) -> Result<Vec<String>> {
    let bad = |why: String| Error::InvalidConfig(format!("bad {store} URL: {why}"));
    let mut list = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = match h.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(':') => (host, Some(port)),
            _ => (h, None),
        };
        let host_ok = if let Some(v6) = host.strip_prefix('[') {
            v6.strip_suffix(']')
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        } else {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
        };
        if !host_ok {
            return Err(bad(format!(
                "{} is not a host[:port] (example: {example})",
                clip(h)
            )));
        }
        let port: u16 = match port {
            None => default_port,
            Some(p) => p
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad(format!("bad port {}", clip(p))))?,
        };
        list.push(format!("{host}:{port}"));
    }
    Ok(list)
}

/// Parses `500ms`, `2s`, `1m` or a bare number of seconds (`5`, `0.5`).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn parse_duration_option(key: &str, v: &str) -> Result<std::time::Duration> {
    let bad = || {
        Error::InvalidConfig(format!(
            "option {key}={v_shown}: expected a duration such as 500ms, 2s or 5",
            v_shown = clip(v)
        ))
    };
    let d = if let Ok(secs) = v.parse::<f64>() {
        if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
            return Err(bad());
        }
        std::time::Duration::from_secs_f64(secs)
    } else {
        parse_unit_duration(v).ok_or_else(bad)?
    };
    if d.is_zero() {
        return Err(Error::InvalidConfig(format!(
            "option {key}={v_shown}: must be more than zero",
            v_shown = clip(v)
        )));
    }
    Ok(d)
}

/// `<number><unit>` with unit `ms`, `s` or `m`.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
fn parse_unit_duration(v: &str) -> Option<std::time::Duration> {
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = v.split_at(split);
    let num: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "ms" => num / 1000.0,
        "s" | "sec" => num,
        "m" | "min" => num * 60.0,
        _ => return None,
    };
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return None;
    }
    Some(std::time::Duration::from_secs_f64(secs))
}

/// Parses the URL of a store that takes no options (`mem`, `sqlite`), with a clear error for a
/// malformed URL or any query option.
pub(crate) fn parse_plain(raw: &str, scheme: &str) -> Result<Url> {
    let u = Url::parse(raw).map_err(|e| {
        Error::InvalidConfig(format!(
            "malformed store URL {}: {e} (examples: sqlite:///var/lib/dlock.db, mem://)",
            redact_url(raw)
        ))
    })?;
    if u.scheme() != scheme {
        return Err(Error::InvalidConfig(format!(
            "{} is not a {scheme} URL",
            redact_url(raw)
        )));
    }
    if let Some((k, _)) = u.query_pairs().next() {
        return Err(Error::InvalidConfig(format!(
            "unknown option {} in {scheme} URL",
            clip(&k)
        )));
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts() {
        assert_eq!(redact_url("redis://:pw@h:1/"), "redis://:***@h:1/");
        assert!(!redact_url("bad://user:pw@[").contains("pw"));
        // Found by fuzzing / the bad-input test: secrets outside a URL's password field.
        assert_eq!(redact_url("u:hunter2@nowhere"), "u:…");
        assert_eq!(redact_url("ws:hunter2@@where"), "ws:…");
        assert_eq!(redact_url("http://u:hunter2@h/"), "http:…");
        assert_eq!(redact_url("user:hunter2@host://x"), "user:…");
        assert_eq!(redact_url("us er:hunter2@h://x"), "<unparseable URL>");
        assert_eq!(redact_url("redis:u:hunter2@h"), "redis:***@h");
        assert_eq!(
            redact_url("postgres://h/db?password=hunter2&table=t"),
            "postgres://h/db?password=***&table=t"
        );
        assert_eq!(
            redact_url("sqlite:///tmp/a b.db"),
            "sqlite:///tmp/a%20b.db",
            "no credentials: shown"
        );
        assert_eq!(
            redact_url("redis+sentinel://u:hunter2@s1:26379,s2/m?sentinel_password=hunter3&db=1"),
            "redis+sentinel://u:***@s1:26379,s2/m?sentinel_password=***&db=1"
        );
        assert_eq!(
            redact_url("redis+cluster://:hunter2@h1:7000,h2:7001"),
            "redis+cluster://:***@h1:7000,h2:7001"
        );
        let long = format!("redis://h/?prefix={}", "x".repeat(10_000));
        let shown = redact_url(&long);
        assert!(shown.chars().count() < 300, "{shown}");
        assert!(shown.ends_with("…(10018 bytes)"), "{shown}");
    }
}
