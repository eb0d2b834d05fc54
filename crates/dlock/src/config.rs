//! Store URLs.

use crate::error::{Error, Result};
use std::path::PathBuf;
use url::Url;

/// The schemes this build knows, for error messages and `dlock info`.
pub fn enabled_backends() -> Vec<&'static str> {
    let mut v = vec!["mem"];
    if cfg!(feature = "sqlite") {
        v.push("sqlite");
    }
    v
}

/// Schemes that are planned but not in this build yet.
const PLANNED: &[&str] = &[
    "redis",
    "rediss",
    "redlock",
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "zk",
    "etcd",
];

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// `mem://NAME`
    Memory(String),
    /// `sqlite:///path` or `sqlite:relative/path`
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Sqlite(PathBuf),
}

/// Returns `url` with any password replaced by `***`, for logs, errors and listings.
///
/// ```
/// assert_eq!(dlock::redact_url("redis://u:secret@h:6379/0"), "redis://u:***@h:6379/0");
/// ```
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        // Not a URL we can read: show only its scheme-ish prefix, never the rest.
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://…"),
            None => "<unparseable URL>".to_string(),
        },
    }
}

pub(crate) fn parse(raw: &str) -> Result<Target> {
    let u = Url::parse(raw).map_err(|e| {
        Error::InvalidConfig(format!(
            "malformed store URL {}: {e} (examples: sqlite:///var/lib/dlock.db, mem://)",
            redact_url(raw)
        ))
    })?;
    let scheme = u.scheme();
    if let Some((k, _)) = u.query_pairs().next() {
        return Err(Error::InvalidConfig(format!(
            "unknown option {k:?} in {} URL",
            scheme
        )));
    }
    match scheme {
        "mem" => {
            let mut name = u.host_str().unwrap_or("").to_string();
            name.push_str(u.path().trim_start_matches('/'));
            Ok(Target::Memory(name))
        }
        "sqlite" => {
            if !cfg!(feature = "sqlite") {
                return Err(Error::InvalidConfig(
                    "this build of dlock has no sqlite backend (cargo feature \"sqlite\")".into(),
                ));
            }
            let path = if u.cannot_be_a_base() {
                PathBuf::from(
                    percent_decode(u.path())
                        .ok_or_else(|| Error::InvalidConfig("sqlite path is not UTF-8".into()))?,
                )
            } else {
                match u.host_str() {
                    None | Some("") | Some("localhost") => {}
                    Some(h) => {
                        return Err(Error::InvalidConfig(format!(
                            "sqlite URL has a host ({h:?}); write sqlite:///absolute/path.db or sqlite:relative/path.db"
                        )))
                    }
                }
                PathBuf::from(
                    percent_decode(u.path())
                        .ok_or_else(|| Error::InvalidConfig("sqlite path is not UTF-8".into()))?,
                )
            };
            if path.as_os_str().is_empty() || path == std::path::Path::new("/") {
                return Err(Error::InvalidConfig(
                    "sqlite URL has no file path (example: sqlite:///var/lib/dlock/locks.db)"
                        .into(),
                ));
            }
            Ok(Target::Sqlite(path))
        }
        s if PLANNED.contains(&s) => Err(Error::InvalidConfig(format!(
            "the {s} backend is not available in this version of dlock (enabled: {})",
            enabled_backends().join(", ")
        ))),
        s => Err(Error::InvalidConfig(format!(
            "unknown store URL scheme {s:?} (enabled: {})",
            enabled_backends().join(", ")
        ))),
    }
}

fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse("mem://").unwrap(), Target::Memory(String::new()));
        assert_eq!(parse("mem://t1").unwrap(), Target::Memory("t1".into()));
        if cfg!(feature = "sqlite") {
            assert_eq!(
                parse("sqlite:///tmp/a%20b.db").unwrap(),
                Target::Sqlite("/tmp/a b.db".into())
            );
            assert_eq!(
                parse("sqlite:rel/x.db").unwrap(),
                Target::Sqlite("rel/x.db".into())
            );
            assert!(parse("sqlite://host/x.db").is_err());
            assert!(parse("sqlite:///").is_err());
            assert!(parse("sqlite:///x.db?bogus=1").is_err());
        }
        for bad in ["", "nope", "foo://x", "redis://:pw@h", "://x", "sqlite"] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
    }

    #[test]
    fn redacts() {
        assert_eq!(redact_url("redis://:pw@h:1/"), "redis://:***@h:1/");
        assert!(!redact_url("bad://user:pw@[").contains("pw"));
    }
}
