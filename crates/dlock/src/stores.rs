//! The URL table: which scheme opens which store. It sits above every store and the core (it
//! imports them; nothing imports it but the crate root), so adding a store is one folder under
//! `backend/` plus one entry here.

use crate::backend::Backend;
use crate::core::client::Client;
use crate::core::rules::check_lease;
use crate::core::rules::{ClientOptions, Outage, Wait};
use crate::error::{Error, Result};
use crate::url::{clip, redact_url};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

type Opening = Pin<Box<dyn Future<Output = Result<Arc<dyn Backend>>> + Send>>;

/// One store of the table.
struct Store {
    /// The URL schemes that name it.
    schemes: &'static [&'static str],
    /// The cargo feature that builds it.
    feature: &'static str,
    /// Whether this build has it.
    built: bool,
    /// Parses a URL of it without connecting.
    check: fn(&str) -> Result<()>,
    /// Connects to the store of a URL.
    open: fn(String) -> Opening,
}

fn opening<B, F>(f: F) -> Opening
where
    B: Backend,
    F: Future<Output = Result<B>> + Send + 'static,
{
    Box::pin(async move { Ok(Arc::new(f.await?) as Arc<dyn Backend>) })
}

#[allow(dead_code)] // for the stores a build leaves out
fn not_built(_: &str) -> Result<()> {
    Ok(())
}

#[allow(dead_code)] // for the stores a build leaves out
fn not_built_open(_: String) -> Opening {
    Box::pin(async { Err(Error::InvalidConfig("store not built".into())) })
}

macro_rules! store {
    ($feature:literal, [$($scheme:literal),+], $check:expr, $open:expr) => {{
        #[cfg(feature = $feature)]
        let s = Store {
            schemes: &[$($scheme),+],
            feature: $feature,
            built: true,
            check: $check,
            open: $open,
        };
        #[cfg(not(feature = $feature))]
        let s = Store {
            schemes: &[$($scheme),+],
            feature: $feature,
            built: false,
            check: not_built,
            open: not_built_open,
        };
        s
    }};
}

/// Every store dlock knows, built into this binary or not.
fn table() -> [Store; 8] {
    use crate::backend::memory::MemoryBackend;
    [
        Store {
            schemes: &["mem"],
            feature: "",
            built: true,
            check: |u| MemoryBackend::parse_url(u).map(drop),
            open: |u| opening(async move { MemoryBackend::connect(&u) }),
        },
        store!(
            "sqlite",
            ["sqlite"],
            |u| crate::backend::sql::sqlite::SqliteBackend::parse_url(u).map(drop),
            |u| opening(
                async move { crate::backend::sql::sqlite::SqliteBackend::connect(&u).await }
            )
        ),
        store!(
            "redis",
            [
                "redis",
                "rediss",
                "redis+sentinel",
                "redis+cluster",
                "rediss+sentinel",
                "rediss+cluster"
            ],
            |u| crate::backend::redis::RedisTarget::parse(u).map(drop),
            |u| opening(async move { crate::backend::redis::RedisBackend::connect(&u).await })
        ),
        store!(
            "redlock",
            ["redlock"],
            |u| crate::backend::redlock::RedlockConfig::parse(u).map(drop),
            |u| opening(async move { crate::backend::redlock::RedlockBackend::connect(&u).await })
        ),
        store!(
            "postgres",
            ["postgres", "postgresql"],
            |u| crate::backend::sql::SqlConfig::parse(u).map(drop),
            |u| Box::pin(async move { crate::backend::sql::open(&u).await })
        ),
        store!(
            "mysql",
            ["mysql", "mariadb"],
            |u| crate::backend::sql::SqlConfig::parse(u).map(drop),
            |u| Box::pin(async move { crate::backend::sql::open(&u).await })
        ),
        store!(
            "zookeeper",
            ["zk"],
            |u| crate::backend::zookeeper::url::parse(u).map(drop),
            |u| opening(
                async move { crate::backend::zookeeper::ZooKeeperBackend::connect(&u).await }
            )
        ),
        store!(
            "etcd",
            ["etcd", "etcds"],
            |u| crate::backend::etcd::url::parse(u).map(drop),
            |u| opening(async move { crate::backend::etcd::EtcdBackend::connect(&u).await })
        ),
    ]
}

/// Schemes of stores that are planned but not in this version.
const PLANNED: &[&str] = &[];

/// The schemes this build knows, for error messages and `dlock info`.
pub fn enabled_backends() -> Vec<&'static str> {
    table()
        .into_iter()
        .filter(|s| s.built)
        .flat_map(|s| s.schemes.iter().copied())
        .collect()
}

/// The table entry of `raw`'s scheme, or a clear error.
fn entry(raw: &str) -> Result<Store> {
    // As a URL parser reads it: leading spaces and C0 controls are not part of it.
    let scheme = raw
        .trim_start_matches(|c: char| c <= ' ')
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    let scheme = scheme.as_str();
    let enabled = || enabled_backends().join(", ");
    if scheme.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "malformed store URL {}: no scheme (examples: sqlite:///var/lib/dlock.db, mem://)",
            redact_url(raw)
        )));
    }
    match table().into_iter().find(|s| s.schemes.contains(&scheme)) {
        Some(s) if s.built => Ok(s),
        Some(s) => Err(Error::InvalidConfig(format!(
            "this build of dlock has no {} backend (cargo feature \"{}\"; enabled: {})",
            s.feature,
            s.feature,
            enabled()
        ))),
        None if PLANNED.contains(&scheme) => Err(Error::InvalidConfig(format!(
            "the {scheme} backend is not available in this version of dlock (enabled: {})",
            enabled()
        ))),
        None => Err(Error::InvalidConfig(format!(
            "unknown store URL scheme {} (enabled: {})",
            clip(scheme),
            enabled()
        ))),
    }
}

/// Checks a store URL without connecting: the scheme is one this build has, and the URL and its
/// options are well formed. For start-up checks and configuration validation; a URL that passes
/// may still fail to connect ([`crate::Error::Unavailable`], a wrong password…).
///
/// ```
/// assert!(dlock::validate_url("sqlite:///var/lib/app/locks.db").is_ok());
/// assert!(dlock::validate_url("mem://").is_ok());
/// assert!(matches!(dlock::validate_url("sqlite://"), Err(dlock::Error::InvalidConfig(_))));
/// assert!(dlock::validate_url("nope://x").is_err());
/// ```
pub fn validate_url(url: &str) -> Result<()> {
    (entry(url)?.check)(url)
}

/// Connects to the store named by `url` with default options.
///
/// | scheme | store |
/// |---|---|
/// | `mem://` or `mem://NAME` | in-process; all clients of one process with the same NAME share it |
/// | `sqlite:///abs/path.db`, `sqlite:rel/path.db` | embedded SQLite file, shared by every process of the machine |
/// | `postgres://user@host/db[?table=…&mode=session]` | PostgreSQL (feature `postgres`; module `backend::sql`) |
/// | `mysql://user@host/db[?table=…&mode=session]`, `mariadb://…` | MySQL/MariaDB (feature `mysql`; module `backend::sql`) |
/// | `redis://[user:pass@]host:6379[/db][?prefix=dlock:]`, `rediss://…` | one Redis server (feature `redis`; module `backend::redis`) |
/// | `redis+sentinel://[user:pass@]s1:26379,s2,s3/MASTER[?db=0]` | the master Redis Sentinel names, followed across fail-overs (feature `redis`) |
/// | `redis+cluster://[user:pass@]h1:7000,h2:7001,…` | a Redis Cluster (feature `redis`); `?replicas=N` on any Redis URL confirms grants with `WAIT` |
/// | `zk://host:2181,host2:2181/chroot[?session_timeout=10s]` | a ZooKeeper ensemble (feature `zookeeper`) |
/// | `etcd://[user:pass@]h1:2379,h2:2379/prefix[?ttl=10s]`, `etcds://…` | an etcd cluster (feature `etcd`; module `backend::etcd`) |
/// | `redlock://h1:6379,h2:6379,h3:6379[?drift=0.01]` | Redlock over independent Redis servers (feature `redlock`, mutex only, no fencing; module `backend::redlock`) |
///
/// Must be called inside a tokio runtime (the client runs a renewal task on it).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let client = dlock::connect("mem://").await?;
/// let guard = client.mutex("reports/daily")?.acquire().await?;
/// println!("fencing token {:?}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Client> {
    connect_with(url, ClientOptions::default()).await
}

/// Connects as [`connect_with`] does, for a caller that will wait for its lock until `until`:
/// a passing refusal of the store ([`Error::Unavailable`]: too many clients, a server
/// restarting) is tried again with the back-off a waiting acquisition uses (50 ms doubling to
/// 2 s, jittered) and reported only when another try would end after `until`. A permanent error
/// (a bad URL, wrong credentials, an unknown database) is reported at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use std::time::{Duration, Instant};
/// let until = Instant::now() + Duration::from_secs(60);
/// let client = dlock::connect_until("mem://", dlock::ClientOptions::default(), until).await?;
/// let left = until.saturating_duration_since(Instant::now());
/// let _guard = client.mutex("jobs/nightly")?.acquire_timeout(left).await?;
/// # Ok(()) }
/// ```
pub async fn connect_until(
    url: &str,
    options: ClientOptions,
    until: std::time::Instant,
) -> Result<Client> {
    let mut outage = Outage::default();
    loop {
        match connect_with(url, options.clone()).await {
            Err(e) => match outage.pause(&e, Wait::Until(until)) {
                Some(pause) => {
                    tracing::debug!(error = %e, ?pause, "store unavailable; connecting again");
                    tokio::time::sleep(pause).await;
                }
                None => return Err(e),
            },
            ok => return ok,
        }
    }
}

/// Connects to the store named by `url` with `options`. See [`connect`].
pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Client> {
    check_lease(options.lease)?;
    let store = entry(url)?;
    let backend = (store.open)(url.to_owned()).await?;
    Client::with_backend(backend, redact_url(url), options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert!(validate_url("mem://").is_ok());
        assert!(validate_url("mem://t1").is_ok());
        // A block, not `if cfg!(…)`: the path below exists only with the feature.
        #[cfg(feature = "sqlite")]
        {
            use crate::backend::sql::sqlite::SqliteBackend;
            assert_eq!(
                SqliteBackend::parse_url("sqlite:///tmp/a%20b.db").unwrap(),
                std::path::PathBuf::from("/tmp/a b.db")
            );
            assert_eq!(
                SqliteBackend::parse_url("sqlite:rel/x.db").unwrap(),
                std::path::PathBuf::from("rel/x.db")
            );
            assert!(validate_url("sqlite://host/x.db").is_err());
            assert!(validate_url("sqlite:///").is_err());
            assert!(validate_url("sqlite:///x.db?bogus=1").is_err());
        }
        for bad in [
            "",
            "nope",
            "foo://x",
            "redis://:pw@h/x",
            "://x",
            "sqlite",
            "mem://x?bogus=1",
        ] {
            let e = validate_url(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
    }

    #[test]
    fn every_built_store_is_enabled() {
        let enabled = enabled_backends();
        assert!(enabled.contains(&"mem"));
        for (feature, scheme) in [
            (cfg!(feature = "sqlite"), "sqlite"),
            (cfg!(feature = "redis"), "rediss"),
            (cfg!(feature = "redlock"), "redlock"),
            (cfg!(feature = "postgres"), "postgresql"),
            (cfg!(feature = "mysql"), "mariadb"),
            (cfg!(feature = "zookeeper"), "zk"),
            (cfg!(feature = "etcd"), "etcds"),
        ] {
            assert_eq!(enabled.contains(&scheme), feature, "{scheme}");
            if !feature {
                let e = validate_url(&format!("{scheme}://h/x"))
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("this build of dlock has no"), "{e}");
            }
        }
    }

    #[test]
    fn error_values_are_clipped() {
        if cfg!(feature = "redis") {
            let e = validate_url(&format!("redis://h/{}", "9".repeat(10_000))).unwrap_err();
            assert!(e.to_string().len() < 600, "{e}");
        }
        let e = validate_url(&format!("{}://h", "x".repeat(10_000))).unwrap_err();
        assert!(e.to_string().len() < 600, "{e}");
        assert!(matches!(
            validate_url("nope://"),
            Err(Error::InvalidConfig(_))
        ));
    }
}
