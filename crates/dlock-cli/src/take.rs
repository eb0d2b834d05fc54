//! Taking the lock for `dlock run` and `dlock hold`: which primitive, how long to wait, and what
//! to say about it.

use crate::exit::{self, Failure};
use crate::store;
use std::time::{Duration, Instant};

/// How `dlock run` and `dlock hold` take their lock, as parsed by clap.
#[derive(Debug, Clone)]
pub struct TakeOpts {
    /// `--url`
    pub url: Option<String>,
    /// `--ttl`
    pub ttl: Duration,
    /// `--wait`
    pub wait: Option<Duration>,
    /// `--no-wait`
    pub no_wait: bool,
    /// `--fair`
    pub fair: bool,
    /// What to take.
    pub kind: Kind,
    /// `-E/--conflict-exit-code`: the exit code when the lock is not acquired.
    pub conflict_exit: i32,
    /// `-v/--verbose`
    pub verbose: bool,
    /// NAME
    pub name: String,
}

/// The primitive taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The mutex NAME (the default).
    Mutex,
    /// `-s/--shared`: a read lock of the read-write lock NAME.
    Read,
    /// `-x/--exclusive`: the write lock of the read-write lock NAME.
    Write,
    /// `--permits N`: one permit of the semaphore NAME of N permits.
    Permit(u32),
}

impl Kind {
    fn describe(self) -> String {
        match self {
            Kind::Mutex => "mutex".into(),
            Kind::Read => "read lock".into(),
            Kind::Write => "write lock".into(),
            Kind::Permit(n) => format!("permit of semaphore({n})"),
        }
    }
}

/// The lock, once taken.
pub struct Taken {
    /// The client that holds it.
    pub client: dlock::Client,
    /// The hold.
    pub guard: dlock::Guard,
    /// When it was granted.
    pub granted: Instant,
}

/// The URL to connect to: on ZooKeeper the session timeout, on etcd the lease TTL is what keeps
/// others out after a dlock dies, so `--ttl` sets it unless the URL does.
pub(crate) fn url_for(url: &str, ttl: Duration) -> String {
    let option = if url.starts_with("zk://") {
        "session_timeout"
    } else if url.starts_with("etcd://") || url.starts_with("etcds://") {
        "ttl"
    } else {
        return url.to_string();
    };
    if url.contains(&format!("{option}=")) {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    if option == "ttl" {
        // etcd counts leases in whole seconds (up to an hour).
        let secs = ttl.as_millis().div_ceil(1000).clamp(1, 3600);
        return format!("{url}{sep}ttl={secs}s");
    }
    let ms = ttl.as_millis().clamp(100, 600_000);
    format!("{url}{sep}session_timeout={ms}ms")
}

/// Describes who holds `name`, best effort, for the "busy" message.
async fn holder_of(client: &dlock::Client, name: &str) -> String {
    let info = tokio::time::timeout(Duration::from_secs(2), client.describe(name)).await;
    match info {
        Ok(Ok(Some(info))) => match info.holders.first() {
            Some(h) => format!(" (held by pid {} on {})", h.meta.pid, h.meta.host),
            None => String::new(),
        },
        _ => String::new(),
    }
}

/// Connects and takes the lock as `o` says. Usage errors (a bad name) are found before the
/// store is touched by the caller.
pub async fn take(o: &TakeOpts, url: &str) -> Result<Taken, Failure> {
    let started = Instant::now();
    // A caller that waits for the lock also waits out a store that turns it away for now (a
    // crowd beyond its connection limit, a restart): within --wait, or without one for
    // dlock::UNAVAILABLE_PATIENCE, as the acquisition itself does.
    let url = url_for(url, o.ttl);
    let client = if o.no_wait {
        store::connect(&url).await?
    } else {
        let until = started + o.wait.unwrap_or(dlock::UNAVAILABLE_PATIENCE);
        store::connect_until(&url, until).await?
    };
    if let Some(granted) = client.session_timeout() {
        let off = granted.max(o.ttl) - granted.min(o.ttl);
        if off > o.ttl / 10 {
            eprintln!(
                "dlock: warning: the {} store keeps the locks of a dlock that died for its \
                 session timeout, {} here, not --ttl {}",
                client.backend_name(),
                fmt_dur(granted),
                fmt_dur(o.ttl)
            );
        }
    }
    let name = o.name.as_str();
    // --wait counts from the start, connecting included.
    let left = |w: Duration| w.saturating_sub(started.elapsed());
    let r = async {
        match o.kind {
            Kind::Mutex => {
                let m = client.mutex(name)?.lease(o.ttl).fair(o.fair);
                if o.no_wait {
                    m.try_acquire().await
                } else if let Some(w) = o.wait {
                    m.acquire_timeout(left(w)).await
                } else {
                    m.acquire().await
                }
            }
            Kind::Read | Kind::Write => {
                let l = client.rwlock(name)?.lease(o.ttl).fair(o.fair);
                match (o.kind == Kind::Read, o.no_wait, o.wait) {
                    (true, true, _) => l.try_read().await,
                    (true, false, Some(w)) => l.read_timeout(left(w)).await,
                    (true, false, None) => l.read().await,
                    (false, true, _) => l.try_write().await,
                    (false, false, Some(w)) => l.write_timeout(left(w)).await,
                    (false, false, None) => l.write().await,
                }
            }
            Kind::Permit(n) => {
                let s = client.semaphore(name, n)?.lease(o.ttl).fair(o.fair);
                if o.no_wait {
                    s.try_acquire().await
                } else if let Some(w) = o.wait {
                    s.acquire_timeout(left(w)).await
                } else {
                    s.acquire().await
                }
            }
        }
    }
    .await;
    match r {
        Ok(guard) => {
            if o.verbose {
                let token = guard
                    .token()
                    .map_or_else(|| "none".to_string(), |t| t.to_string());
                eprintln!(
                    "dlock: acquired the {} {name:?} on {} after {} (fencing token {token})",
                    o.kind.describe(),
                    client.url(),
                    fmt_dur(started.elapsed()),
                );
            }
            Ok(Taken {
                client,
                guard,
                granted: Instant::now(),
            })
        }
        Err(dlock::Error::Busy { .. }) => {
            let who = holder_of(&client, name).await;
            Err(Failure::new(
                o.conflict_exit,
                format!("lock {name:?} is busy{who}; command not run"),
            ))
        }
        Err(dlock::Error::Timeout { .. }) => {
            let who = holder_of(&client, name).await;
            Err(Failure::new(
                o.conflict_exit,
                format!(
                    "gave up waiting for lock {name:?} after {}{who}; command not run",
                    fmt_dur(started.elapsed())
                ),
            ))
        }
        Err(e @ dlock::Error::InvalidConfig(_)) => {
            let hint = match o.kind {
                Kind::Mutex => " (is it used as a read-write lock? then take it with -s or -x)",
                Kind::Read | Kind::Write => " (is it used as a mutex? then take it without -s/-x)",
                Kind::Permit(_) => "",
            };
            Err(Failure::new(
                exit::USAGE,
                format!("cannot take lock {name:?} on {}: {e}{hint}", client.url()),
            ))
        }
        Err(e) => Err(Failure::new(
            exit::for_error(&e),
            format!("cannot acquire lock {name:?} on {}: {e}", client.url()),
        )),
    }
}

/// A duration for messages, to the millisecond (`1s 500ms`).
pub(crate) fn fmt_dur(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_becomes_the_zookeeper_session_timeout_unless_the_url_sets_one() {
        let s = Duration::from_secs(3);
        assert_eq!(
            url_for("zk://h:2181/x", s),
            "zk://h:2181/x?session_timeout=3000ms"
        );
        assert_eq!(
            url_for("zk://h:2181/x?a=b", s),
            "zk://h:2181/x?a=b&session_timeout=3000ms"
        );
        assert_eq!(
            url_for("zk://h/x?session_timeout=2s", s),
            "zk://h/x?session_timeout=2s"
        );
        assert_eq!(url_for("redis://h/", s), "redis://h/");
        assert_eq!(
            url_for("zk://h/x", Duration::from_secs(86_400)),
            "zk://h/x?session_timeout=600000ms"
        );
        assert_eq!(url_for("etcd://h/x", s), "etcd://h/x?ttl=3s");
        assert_eq!(
            url_for("etcds://h/x?ttl=9s", Duration::from_millis(1500)),
            "etcds://h/x?ttl=9s"
        );
        assert_eq!(
            url_for("etcd://h/x?a=b", Duration::from_millis(1500)),
            "etcd://h/x?a=b&ttl=2s"
        );
    }
}
