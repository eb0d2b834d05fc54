//! Redlock over several independent Redis servers
//! (`redlock://[user:pass@]host1:port1,host2:port2,host3:port3[/db][?drift=0.01]`), behind the
//! cargo feature `redlock` (which implies `redis`).
//!
//! # The algorithm
//!
//! Each server is a full single-server [`RedisBackend`] (its
//! connection, its Lua scripts, its pub/sub wake-ups), and every server holds a mutex exactly as
//! the single-server store does: the key `prefix{name}` holds the owner token with a `PX` expiry.
//! So other Redlock clients on the same servers and key (redsync, node-redlock, rslock,
//! redlock-py) and dlock exclude each other.
//!
//! - **Acquire**: note the start on the monotonic clock, run the grant script (`SET NX PX`
//!   semantics, the same owner token) on all N servers **concurrently**, each bounded by a short
//!   per-server timeout (`min(timeout, lease/10)`). The hold is granted only if a majority
//!   (`N/2 + 1`) granted it **and** the validity `lease − elapsed − drift` is positive, where
//!   `drift = lease × drift_factor + 2 ms` (factor `0.01` by default, `?drift=`). The grant answers
//!   `valid_for = validity` (the core then subtracts its own 10 % margin). Otherwise the owner's
//!   key is deleted on **every** server, including those whose reply was lost, without waking
//!   anyone, and the attempt is `Busy`: after a split vote or unreachable servers a random
//!   5–50 ms, else when enough of the blocking keys expire (at most 1 s). A repeat attempt of an
//!   owner that holds is an idempotent re-grant on each server.
//! - **The lead server** of a name is the same for every client: FNV-1a of the name, modulo the
//!   number of servers, in URL order. A waiting request is refused there as on a single Redis:
//!   it **registers in the lead's waiter set** (`base:w`, see `backend::redis`). Repeat attempts
//!   of a waiter (its last attempt was refused), and first attempts on a name this client saw
//!   contended in the last second (a refusal, a release that handed the lock on), ask the lead
//!   first and the others only once the lead granted it; the lead decides any race, and its
//!   losers stop there. A waiting request's first attempt that asks every server at once and is
//!   refused by the lead is refused, whatever the others answer: the lead's key is then most
//!   likely a hand-off on its way to the others (a try, which does not wait, takes any
//!   majority). A waiter asks every server again within 250 ms of its last ask of
//!   every server when the lead alone refused it since, within a second when all did; then a
//!   majority without the lead counts, so a key the lead kept by mistake (a release that did
//!   not reach it) cannot keep the lock from a free majority for longer. If the lead is not
//!   connected or does not answer, the attempt asks every server.
//! - **Hand-offs: one wake per release.** The release on the lead server hands its key to the
//!   lead's first registered waiter whose client listens (as a single Redis's release does:
//!   the waiter's hold, `PX` its lease, and a message on its client's hand-off channel), and
//!   wakes nobody else. The woken waiter then asks the other servers, in one round trip: nobody
//!   else can take the lead's key, so there is no race to split the votes. Its validity counts
//!   the lead's lease from its last refused attempt (the hand-off came after it) and the
//!   others' from this attempt. A waiter whose client died is skipped (its channel has no
//!   listener); one that gives up removes its registration, and passes on a key handed to it
//!   meanwhile.
//! - **Renewal**: the compare-and-pexpire script on all N servers in parallel, all holds of a
//!   renewal batch (at most 500, see the core's watchdog) in one pipeline per server, each server
//!   given the per-server timeout plus 100 µs per hold (at most a third of the lease). A hold
//!   confirmed by fewer than a majority, or whose
//!   validity (`lease − elapsed − drift`) is gone, is answered `Gone` (its `lost()` fires) and
//!   its remaining keys are deleted in the background.
//! - **Release**: compare-and-delete on every server it can reach; `Released` if a majority had
//!   the hold (`HandedOff` if the lead handed it on). The servers other than the lead announce
//!   it on the name's channel, as before hand-offs: only a waiter whose lead is away listens.
//! - **Waiting**: a waiter refused by the lead waits on the lead alone (one pub/sub connection
//!   per server per client): for its hand-off, or for a release there that handed nothing on.
//!   A waiter whose lead did not answer subscribes the name's channel on **every** server, and
//!   any message is a reason to try again. The holder's remaining lease and jittered polling
//!   are the fallback.
//! - `describe` / `dlock list`: the holders seen on a majority of the servers that answered
//!   (best effort: a hold being granted or released right then may be missing), without tokens.
//!
//! Only **mutexes** (with reentrancy through the core) are offered: an rwlock or semaphore over
//! independent servers would need a quorum rule for every holder set and queue, and a fair queue
//! a single order of arrival; both answer [`Error::Unsupported`] at acquire.
//!
//! # No fencing token
//!
//! A majority of independent counters cannot give a strictly increasing token (two grants can see
//! disjoint-enough majorities whose counters disagree), so dlock does not fake one:
//! `capabilities().fencing` is false, [`crate::Guard::token`] is `None` and `dlock run` starts the
//! command without `DLOCK_TOKEN`. Martin Kleppmann argued ("How to do distributed locking", 2016)
//! that Redlock's timing assumptions (bounded pauses, network delays and clock drift) make it
//! unsafe for correctness without fencing; antirez answered ("Is Redlock safe?") that the
//! assumptions are reasonable and that a lock used for efficiency needs no more. If you need
//! fencing, use Redis with AOF and `appendfsync always` (`redis://`), PostgreSQL, SQLite or
//! ZooKeeper.
//!
//! # URL options
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `drift` | `0.01` | clock drift factor (`0.01` or `1%`, at most `0.5`); 2 ms are added |
//! | `prefix`, `hashtag` | `dlock:`, `true` | as for `redis://`, applied on every server |
//! | `timeout` | `250ms` | one command on one server; an acquire or renewal also stops waiting for a server after a tenth of the lease |
//! | `connect_timeout` | `3s` | connecting to one server |
//!
//! At least 3 servers, each `host:port` once (port 6379 if not given); an odd number is
//! recommended (an even N tolerates no more failures than N − 1). The user and password, and the
//! database path (`/db`), apply to every server. A majority must be reachable at connect; the
//! others are reconnected in the background (at most once a second).
//!
//! # What breaks it
//!
//! - A server restarted without persistence forgets its keys, and can then give the same lock to
//!   a second client; with N = 5, two such restarts inside one lease are enough. Run the servers
//!   with AOF (`appendfsync always`) or delay their restart by a lease (antirez's advice).
//! - A holder paused (GC, swap, SIGSTOP) past its validity keeps working after `lost()` should
//!   have stopped it: without fencing nothing stops it at the resource.
//! - Clocks of the servers running faster than the drift factor shortens leases.
//! - A waiter whose process is stopped (SIGSTOP) while it is registered on the lead server can be
//!   handed the lead's key, which then sits unused; the other waiters get the lock from the free
//!   majority at their next ask of every server (within a second).

use super::redis::RedisTarget;
use super::redis::{RedisBackend, Seen};
use super::*;
use crate::error::Error;
use futures_util::future::{join, join_all, select_all};
use rand::Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

/// The default clock drift factor: 1 % of the lease (plus 2 ms).
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Added to the drift of every lease (Redis expires keys with a millisecond of slack).
const DRIFT_FIXED: Duration = Duration::from_millis(2);
/// The default command timeout on one server (`timeout`).
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// The shortest per-server wait of an acquire or renewal.
const MIN_OP_TIMEOUT: Duration = Duration::from_millis(10);
/// How often a server that is not connected is tried again.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// The longest `retry_in` of a refused attempt (waiters are woken by releases anyway).
const MAX_RETRY: Duration = Duration::from_secs(1);
/// A waiter whose repeat attempts go to the lead server alone asks every server at least this
/// often (see `attempt`).
const ASK_ALL_EVERY: Duration = Duration::from_millis(250);
/// How long a refusal or a hand-off of a name makes this client's first attempts on it ask the
/// lead server first.
const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// The most names whose contention a client remembers.
const CONTENDED_MAX: usize = 4096;

/// A parsed `redlock://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedlockConfig {
    /// One Redis target per server, in URL order.
    pub(crate) servers: Vec<RedisTarget>,
    /// The clock drift factor in parts per million.
    pub(crate) drift_ppm: u32,
    /// The URL with the password redacted.
    pub(crate) shown: String,
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `0.01` or `1%` → parts per million, at most half.
fn parse_drift(v: &str) -> Option<u32> {
    let f = match v.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().ok()? / 100.0,
        None => v.trim().parse::<f64>().ok()?,
    };
    if !f.is_finite() || !(0.0..=0.5).contains(&f) {
        return None;
    }
    Some((f * 1_000_000.0).round() as u32)
}

/// `host:port`, `[v6]:port` or `host` (port 6379).
fn split_host_port(h: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{v6}]"), port)
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (h.to_owned(), None),
        }
    };
    let bad_char = |c: char| c.is_whitespace() || "/?#@[]".contains(c);
    if host.is_empty() || (!host.starts_with('[') && host.contains(bad_char)) {
        return None;
    }
    let port = match port {
        None => 6379,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
    };
    Some((host, port))
}

impl RedlockConfig {
    /// Parses `redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db][?options]`.
    pub(crate) fn parse(raw: &str) -> Result<RedlockConfig> {
        let shown = crate::url::redact_url(raw);
        let bad = |why: String| Error::InvalidConfig(format!("redlock URL {shown}: {why}"));
        let rest = raw
            .strip_prefix("redlock://")
            .ok_or_else(|| bad("must start with redlock://".into()))?;
        if rest.contains('#') {
            return Err(bad("has a fragment; dlock does not use it".into()));
        }
        let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (auth, hosts_db) = match main.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, main),
        };
        let (hosts, db) = hosts_db.split_once('/').unwrap_or((hosts_db, ""));
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(bad(format!(
                "the path must be a database number, got {}",
                crate::url::clip(db)
            )));
        }
        let mut seen = HashSet::new();
        let mut addrs = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = split_host_port(h).ok_or_else(|| {
                bad(format!(
                    "bad server {} (expected host:port with a port from 1 to 65535)",
                    crate::url::clip(h)
                ))
            })?;
            if !seen.insert((host.to_ascii_lowercase(), port)) {
                return Err(bad(format!(
                    "server {host}:{port} is listed twice; every server must be independent"
                )));
            }
            addrs.push((host, port));
        }
        if addrs.len() < 3 {
            return Err(bad(format!(
                "Redlock needs at least 3 independent servers, got {}",
                addrs.len()
            )));
        }
        let mut drift_ppm = (DEFAULT_DRIFT_FACTOR * 1_000_000.0) as u32;
        let mut pass = url::form_urlencoded::Serializer::new(String::new());
        let mut timeout_given = false;
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "drift" => {
                    drift_ppm = parse_drift(&v).ok_or_else(|| {
                        bad(format!(
                            "option drift={}: expected a factor from 0 to 0.5 (0.01 or 1%)",
                            crate::url::clip(&v)
                        ))
                    })?;
                }
                "prefix" | "hashtag" | "timeout" | "connect_timeout" => {
                    timeout_given |= k == "timeout";
                    pass.append_pair(&k, &v);
                }
                other => {
                    return Err(bad(format!(
                    "unknown option {} (known: drift, prefix, hashtag, timeout, connect_timeout)",
                    crate::url::clip(other)
                )))
                }
            }
        }
        let pass = pass.finish();
        let mut servers = Vec::new();
        for (host, port) in addrs {
            let url = format!(
                "redis://{}{host}:{port}/{db}{}{pass}",
                auth.map(|a| format!("{a}@")).unwrap_or_default(),
                if pass.is_empty() { "" } else { "?" }
            );
            let mut t = RedisTarget::parse(&url)?;
            // Waiters register and releases hand on only on a name's lead server (see
            // `RedlockBackend::release`); the other servers announce every release.
            t.handoffs = true;
            if !timeout_given {
                t.timeout = DEFAULT_TIMEOUT;
            }
            servers.push(t);
        }
        Ok(RedlockConfig {
            servers,
            drift_ppm,
            shown,
        })
    }
}

/// One server: its single-server backend once connected.
struct Slot {
    target: RedisTarget,
    conn: StdMutex<Option<Arc<RedisBackend>>>,
    next_try: StdMutex<Instant>,
    connecting: AtomicBool,
}

impl Slot {
    /// The connected backend, or `None` (and a background reconnect, at most once a second).
    fn get(self: &Arc<Self>) -> Option<Arc<RedisBackend>> {
        if let Some(b) = lock(&self.conn).clone() {
            return Some(b);
        }
        let now = Instant::now();
        {
            let mut next = lock(&self.next_try);
            if now < *next {
                return None;
            }
            *next = now + RECONNECT_EVERY;
        }
        if !self.connecting.swap(true, Ordering::SeqCst) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let slot = self.clone();
                    rt.spawn(async move {
                        match RedisBackend::open(slot.target.clone()).await {
                            Ok(b) => *lock(&slot.conn) = Some(Arc::new(b)),
                            Err(e) => tracing::debug!(server = %slot.target.shown, error = %e, "redlock: reconnect failed"),
                        }
                        slot.connecting.store(false, Ordering::SeqCst);
                    });
                }
                Err(_) => self.connecting.store(false, Ordering::SeqCst),
            }
        }
        None
    }
}

/// The Redlock store. Obtain it with
/// `dlock::connect("redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")`, or
/// [`RedlockBackend::connect`] and [`crate::Client::with_backend`]. See the module docs for the
/// algorithm, the missing fencing token and what breaks it.
#[derive(Clone)]
pub struct RedlockBackend {
    slots: Vec<Arc<Slot>>,
    quorum: usize,
    drift_ppm: u32,
    timeout: Duration,
    shown: String,
    /// Names this client lately saw contended (a refusal, a release that handed the lock on),
    /// and when.
    contended: Arc<StdMutex<HashMap<String, Instant>>>,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("url", &self.shown)
            .field("servers", &self.slots.len())
            .field("quorum", &self.quorum)
            .finish()
    }
}

impl RedlockBackend {
    /// Connects to the servers of a `redlock://` URL (see the module docs).
    ///
    /// Errors: [`Error::InvalidConfig`] for a malformed URL (fewer than 3 servers, a server
    /// listed twice, a bad port, an unknown option) or a wrong password;
    /// [`Error::Unavailable`] if fewer than a majority of the servers can be reached.
    pub async fn connect(url: &str) -> Result<RedlockBackend> {
        Self::open(RedlockConfig::parse(url)?).await
    }

    pub(crate) async fn open(config: RedlockConfig) -> Result<RedlockBackend> {
        let n = config.servers.len();
        let quorum = n / 2 + 1;
        if n % 2 == 0 {
            tracing::warn!(
                servers = n,
                "redlock with an even number of servers tolerates no more failures than one server fewer"
            );
        }
        let opened = join_all(config.servers.iter().cloned().map(RedisBackend::open)).await;
        let mut slots = Vec::with_capacity(n);
        let mut up = 0;
        let mut first_err = None;
        for (target, r) in config.servers.into_iter().zip(opened) {
            let conn = match r {
                Ok(b) => {
                    up += 1;
                    Some(Arc::new(b))
                }
                Err(e @ Error::InvalidConfig(_)) => return Err(e),
                Err(e) => {
                    first_err.get_or_insert(e);
                    None
                }
            };
            slots.push(Arc::new(Slot {
                target,
                conn: StdMutex::new(conn),
                next_try: StdMutex::new(Instant::now() + RECONNECT_EVERY),
                connecting: AtomicBool::new(false),
            }));
        }
        if up < quorum {
            return Err(Error::Unavailable(format!(
                "redlock {}: only {up} of {n} redis servers reachable, a majority ({quorum}) is needed{}",
                config.shown,
                first_err.map(|e| format!(" ({e})")).unwrap_or_default()
            )));
        }
        let timeout = slots
            .iter()
            .map(|s| s.target.timeout)
            .max()
            .unwrap_or(DEFAULT_TIMEOUT);
        Ok(RedlockBackend {
            slots,
            quorum,
            drift_ppm: config.drift_ppm,
            timeout,
            shown: config.shown,
            contended: Arc::default(),
        })
    }

    /// The number of servers that must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The clock drift allowed for a lease: `lease × drift factor + 2 ms`.
    pub fn drift(&self, lease: Duration) -> Duration {
        lease.mul_f64(f64::from(self.drift_ppm) / 1_000_000.0) + DRIFT_FIXED
    }

    /// How long an acquire or renewal waits for one server.
    fn op_timeout(&self, lease: Duration) -> Duration {
        self.timeout.min((lease / 10).max(MIN_OP_TIMEOUT))
    }

    /// Runs `f` on every server concurrently, each bounded by `timeout`; one answer per server,
    /// in URL order (a server not connected answers `Unavailable`).
    async fn on_all<T, F, Fut>(&self, timeout: Duration, f: F) -> Vec<Result<T>>
    where
        F: Fn(Arc<RedisBackend>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.on_each(None, timeout, |_, b| f(b)).await
    }

    /// [`Self::on_all`] with each server's index given to `f`, without the `skip`-th server
    /// (its answer left out).
    async fn on_each<T, F, Fut>(
        &self,
        skip: Option<usize>,
        timeout: Duration,
        f: F,
    ) -> Vec<Result<T>>
    where
        F: Fn(usize, Arc<RedisBackend>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let slots = self.slots.iter().enumerate();
        let futs = slots.filter(|(i, _)| Some(*i) != skip).map(|(i, s)| {
            let fut = s.get().map(|b| f(i, b));
            let shown = s.target.shown.clone();
            async move {
                match fut {
                    None => Err(not_connected(&shown)),
                    Some(fut) => tokio::time::timeout(timeout, fut)
                        .await
                        .unwrap_or_else(|_| Err(no_answer(&shown, timeout))),
                }
            }
        });
        join_all(futs).await
    }

    /// Extends `holds` on every server (`detach`: marked as renewed by nobody any more): held
    /// where a majority held them in time, revoked where a server says so, gone otherwise.
    async fn extend_holds(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        let shortest = holds.iter().map(|h| h.lease).min().unwrap_or(self.timeout);
        // A batch of many holds is one pipeline per server: allow it time in proportion (the
        // validity below subtracts whatever time it took, so waiting longer is safe).
        let per_hold = Duration::from_micros(100) * u32::try_from(holds.len()).unwrap_or(u32::MAX);
        let budget = (self.op_timeout(shortest) + per_hold)
            .min((shortest / 3).max(self.op_timeout(shortest)));
        let start = Instant::now();
        let answers = self
            .on_all(
                budget,
                |b| async move { b.extend_holds(holds, detach).await },
            )
            .await;
        let elapsed = start.elapsed();
        let mut out = Vec::with_capacity(holds.len());
        let mut gone = Vec::new();
        for (i, h) in holds.iter().enumerate() {
            let count = |f: fn(&Extended) -> bool| {
                answers
                    .iter()
                    .filter(|a| matches!(a, Ok(v) if v.get(i).is_some_and(f)))
                    .count()
            };
            let held = count(|e| matches!(e, Extended::Held { .. }));
            let revoked = count(|e| *e == Extended::Revoked);
            let validity = h
                .lease
                .checked_sub(elapsed + self.drift(h.lease))
                .filter(|v| !v.is_zero());
            match validity {
                Some(valid_for) if held >= self.quorum => out.push(Extended::Held { valid_for }),
                // Revoked: its keys stay until the owner releases them (the acknowledgement).
                _ if revoked > 0 => out.push(Extended::Revoked),
                _ => {
                    tracing::debug!(name = %h.name, held, quorum = self.quorum, "redlock: renewal did not reach a majority; the hold is lost");
                    gone.push((h.name.clone(), h.owner.to_owned()));
                    out.push(Extended::Gone);
                }
            }
        }
        if !gone.is_empty() {
            // Best effort: remove what is left of lost holds so they do not block others.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let slots = self.slots.clone();
                let timeout = self.timeout;
                rt.spawn(async move {
                    for (name, owner) in &gone {
                        for s in &slots {
                            if let Some(b) = s.get() {
                                let _ = tokio::time::timeout(timeout, b.release_quiet(name, owner))
                                    .await;
                            }
                        }
                    }
                });
            }
        }
        Ok(out)
    }

    /// Deletes `owner`'s key on every server without waking waiters; returns how many had it.
    async fn release_quietly(&self, name: &LockName, owner: &str) -> usize {
        self.on_all(self.timeout, |b| async move {
            b.release_quiet(name, owner).await
        })
        .await
        .iter()
        .filter(|r| matches!(r, Ok(Released::Released)))
        .count()
    }

    /// The name's lead server with its index, if it is connected (see [`lead_server`]).
    fn lead(&self, name: &LockName) -> Option<(usize, Arc<RedisBackend>)> {
        let i = lead_server(name.as_str(), self.slots.len())?;
        Some((i, self.slots.get(i)?.get()?))
    }

    /// Notes that `name` is contended now (see [`Self::contended_lately`]).
    fn note_contended(&self, name: &str) {
        let now = Instant::now();
        let mut seen = lock(&self.contended);
        if let Some(t) = seen.get_mut(name) {
            *t = now;
            return;
        }
        if seen.len() >= CONTENDED_MAX {
            seen.retain(|_, t| now.duration_since(*t) < CONTENDED_FOR);
        }
        if seen.len() < CONTENDED_MAX {
            seen.insert(name.to_owned(), now);
        }
    }

    /// Whether this client saw `name` contended within [`CONTENDED_FOR`].
    fn contended_lately(&self, name: &str) -> bool {
        lock(&self.contended)
            .get(name)
            .is_some_and(|t| t.elapsed() < CONTENDED_FOR)
    }

    /// One attempt on the lead server `i`: through the waiter's part there if it has one (which
    /// registers it when refused, and takes a hand-off without a round trip), else the plain
    /// grant script.
    async fn ask_lead(
        &self,
        i: usize,
        lead: Option<&mut LeadPart>,
        req: &Request<'_>,
        timeout: Duration,
    ) -> Result<Attempt> {
        let slot = self
            .slots
            .get(i)
            .ok_or_else(|| Error::backend(format!("redlock: no server {i}")))?;
        let Some(b) = slot.get() else {
            return Err(not_connected(&slot.target.shown));
        };
        let answer = match lead {
            Some(l) => {
                let a = tokio::time::timeout(timeout, l.acq.attempt()).await;
                l.answered = matches!(a, Ok(Ok(_)));
                a
            }
            None => tokio::time::timeout(timeout, b.attempt(req)).await,
        };
        answer.unwrap_or_else(|_| Err(no_answer(&slot.target.shown, timeout)))
    }
}

/// The error of a server whose connection is down.
fn not_connected(shown: &str) -> Error {
    Error::Unavailable(format!("redis at {shown} is not connected"))
}

/// The error of a server that did not answer within `timeout`.
fn no_answer(shown: &str, timeout: Duration) -> Error {
    Error::Unavailable(format!(
        "redis at {shown} did not answer within {timeout:?}"
    ))
}

impl RedlockBackend {
    /// One attempt: the grant script on the servers, `refused` saying how the owner's last
    /// attempt was refused (updated here), `seen` what it saw of each server's channel, `lead`
    /// a waiting mutex's part on the name's lead server.
    async fn attempt(
        &self,
        req: &Request<'_>,
        refused: &mut Option<Refused>,
        seen: &mut [Seen],
        mut lead: Option<&mut LeadPart>,
    ) -> Result<Attempt> {
        if req.kind != LockKind::Mutex {
            return Err(Error::Unsupported(format!(
                "redlock offers only mutexes, not a {}: a quorum of independent servers cannot \
                 agree on a set of shared holders; use redis:// for rwlocks and semaphores",
                req.kind
            )));
        }
        if req.fair {
            return Err(Error::Unsupported(
                "redlock has no fair (FIFO) mode: independent servers see waiters in different \
                 orders; use redis://, zk:// or a SQL store for fair locks"
                    .into(),
            ));
        }
        let start = Instant::now();
        let timeout = self.op_timeout(req.lease);
        let name = req.name.as_str();
        let before = if req.waiting { *refused } else { None };
        if req.waiting {
            // Read before the attempt: the waits compare them with the counts then.
            for (s, slot) in seen.iter_mut().zip(&self.slots) {
                *s = slot.get().and_then(|b| b.seen(name));
            }
        }
        if let Some(l) = lead.as_deref_mut() {
            l.answered = false;
        }
        // The grant script on every server but `skip`, concurrently.
        let others = |skip| self.on_each(skip, timeout, |_, b| async move { b.attempt(req).await });
        // The lead first: a repeat attempt (the lock was taken: it is probably contended), or
        // a first attempt on a name this client saw contended lately. The lead's waiters are
        // handed the lock there one at a time, and the lead decides any race; its losers stop
        // there (see the module docs). At least every ASK_ALL_EVERY a waiter asks all servers:
        // a key the lead kept by mistake (a release that did not reach it) must not keep the
        // lock from a majority that is free.
        let lead_first = match before {
            Some(r) => start < r.asked_all + ASK_ALL_EVERY,
            None => self.contended_lately(name),
        };
        let lead_index = lead_server(name, self.slots.len());
        let answers = match lead_index {
            Some(i) if lead_first => {
                match self.ask_lead(i, lead.as_deref_mut(), req, timeout).await {
                    Ok(Attempt::Busy(b)) => {
                        self.note_contended(name);
                        let asked_all = before.map_or(start, |r| r.asked_all);
                        if req.waiting {
                            *refused = Some(Refused {
                                lead_only: Some(i),
                                asked_all,
                            });
                        }
                        let ask_all = (asked_all + ASK_ALL_EVERY).saturating_duration_since(start);
                        let retry = b.retry_in.unwrap_or(MAX_RETRY).min(MAX_RETRY);
                        return Ok(Attempt::Busy(Busy {
                            retry_in: Some(retry.min(ask_all)),
                        }));
                    }
                    Ok(granted @ Attempt::Granted(_)) => {
                        let mut rest = others(Some(i)).await;
                        rest.insert(i, Ok(granted));
                        rest
                    }
                    // The lead answered an error or nothing: ask everyone as usual.
                    _ => others(None).await,
                }
            }
            Some(i) => {
                let (at_lead, mut rest) =
                    join(self.ask_lead(i, lead, req, timeout), others(Some(i))).await;
                rest.insert(i, at_lead);
                rest
            }
            None => others(None).await,
        };
        let elapsed = start.elapsed();
        let n = self.slots.len();
        let at_lead = lead_index.and_then(|i| answers.get(i));
        // A hand-off on the lead counts its lease from the waiter's last refused attempt.
        let lead_valid = match at_lead {
            Some(Ok(Attempt::Granted(g))) => g.valid_for.min(req.lease),
            _ => req.lease,
        };
        // A waiting request's first attempt that the lead refused takes no majority of the
        // others: the lead's key is then most likely a hand-off to its first waiter, on its way
        // to the others, and the request waits its turn (a key the lead kept by mistake costs
        // it one ask-all interval). A try takes any majority.
        let vetoed =
            req.waiting && before.is_none() && matches!(at_lead, Some(Ok(Attempt::Busy(_))));
        let (mut granted, mut errors) = (0, 0);
        let mut left = Vec::new();
        let mut config_err = None;
        for a in answers {
            match a {
                Ok(Attempt::Granted(_)) => granted += 1,
                Ok(Attempt::Busy(b)) => left.push(b.retry_in.unwrap_or(MAX_RETRY)),
                Err(Error::InvalidConfig(m)) => config_err = Some(m),
                Err(e) => {
                    tracing::debug!(error = %e, "redlock: a server did not answer an acquire");
                    errors += 1;
                }
            }
        }
        let validity = lead_valid
            .checked_sub(elapsed + self.drift(req.lease))
            .filter(|v| !v.is_zero());
        if granted >= self.quorum && !vetoed {
            if let Some(valid_for) = validity {
                *refused = None;
                return Ok(Attempt::Granted(Grant {
                    token: None,
                    valid_for,
                }));
            }
        }
        if !left.is_empty() {
            self.note_contended(name);
        }
        // Not granted: remove the owner's key everywhere, also where the reply was lost.
        if granted > 0 || errors > 0 || validity.is_none() {
            self.release_quietly(req.name, req.owner).await;
        }
        if let Some(m) = config_err {
            *refused = None;
            return Err(Error::InvalidConfig(m));
        }
        if errors == n {
            *refused = None;
            return Err(Error::Unavailable(format!(
                "redlock {}: no redis server answered",
                self.shown
            )));
        }
        let retry_in = if granted > 0 || errors > 0 {
            // A split vote, a veto, servers away, or too slow: try again after a random short
            // delay.
            jitter(5, 50)
        } else {
            // Everything busy: a majority is free once the quorum-th soonest key expires.
            left.sort();
            left.get(self.quorum - 1)
                .copied()
                .unwrap_or(MAX_RETRY)
                .min(MAX_RETRY)
        };
        if req.waiting {
            *refused = Some(Refused {
                lead_only: None,
                asked_all: start,
            });
        }
        Ok(Attempt::Busy(Busy {
            retry_in: Some(retry_in),
        }))
    }

    /// Waits for a release message from any server (from the lead alone after a refusal by
    /// the lead alone), or `until`.
    async fn changed(
        &self,
        name: &str,
        refused: Option<Refused>,
        seen: &[Seen],
        until: Instant,
    ) -> Result<Watch> {
        let live: Vec<Arc<RedisBackend>> = self.slots.iter().filter_map(|s| s.get()).collect();
        // Subscribe the name's channel on every server first, so a release anywhere wakes us.
        let missing: Vec<&Arc<RedisBackend>> =
            live.iter().filter(|b| !b.is_subscribed(name)).collect();
        if !missing.is_empty() {
            let subscribed = join_all(missing.iter().map(|b| b.subscribe_name(name, until))).await;
            if subscribed.iter().any(|r| matches!(r, Ok(true))) {
                // Subscribed after the attempt: try again; every release from now on wakes us.
                return Ok(Watch::Changed);
            }
        }
        if live.is_empty() {
            // No server to listen to (they reconnect in the background): the core polls.
            return Ok(Watch::Poll {
                min: MAX_RETRY / 2,
                max: MAX_RETRY,
            });
        }
        // Refused by the lead alone: only the lead's wait knows what that attempt saw (the other
        // servers were not asked, so theirs would answer "try again" at once). Every release
        // reaches the lead too.
        let seen_of = |i: usize| seen.get(i).copied().flatten();
        if let Some((i, b)) = refused
            .and_then(|r| r.lead_only)
            .and_then(|i| Some((i, self.slots.get(i)?.get()?)))
        {
            return Ok(match b.changed_since(name, seen_of(i), until).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "redlock: the lead server's wait failed");
                    Watch::Changed
                }
            });
        }
        let waits = self.slots.iter().enumerate().filter_map(|(i, s)| {
            let b = s.get()?;
            Some(Box::pin(async move {
                b.changed_since(name, seen_of(i), until).await
            }))
        });
        let (r, _, _) = select_all(waits).await;
        Ok(match r {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(error = %e, "redlock: a server's wait failed");
                Watch::Changed
            }
        })
    }
}

/// The index (in URL order) of the server that a waiter's repeat attempts on lock `name` ask
/// first, among `servers` servers: FNV-1a 64 of the name's UTF-8 bytes, modulo `servers`. Every
/// client computes the same one, whatever its language. `None` for no servers.
pub fn lead_server(name: &str, servers: usize) -> Option<usize> {
    let n = u64::try_from(servers).ok().filter(|n| *n > 0)?;
    usize::try_from(super::fnv1a64_bytes(name.bytes()) % n).ok()
}

/// How a waiting owner's last attempt was refused.
#[derive(Debug, Clone, Copy)]
struct Refused {
    /// By the lead server alone (its index): the other servers were not asked.
    lead_only: Option<usize>,
    /// When the owner's last attempt that asked every server started.
    asked_all: Instant,
}

fn jitter(lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rand::thread_rng().gen_range(lo_ms..=hi_ms))
}

#[async_trait::async_trait]
impl Backend for RedlockBackend {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: false,
            hands_off: true,
            ..Capabilities::lease(Wakeups::Native)
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        // A waiting mutex registers on the name's lead server as that server's store would.
        let lead = (req.waiting && req.kind == LockKind::Mutex && !req.fair)
            .then(|| self.lead(req.name))
            .flatten()
            .map(|(_, b)| LeadPart {
                acq: b.begin(req),
                answered: false,
            });
        Box::new(RedlockAcquisition {
            store: self.clone(),
            want: Want::new(req),
            refused: None,
            seen: vec![None; self.slots.len()],
            lead,
        })
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        // The lead server hands the lock on to its first registered waiter (who then asks the
        // others); the other servers announce the release on the name's channel, which only a
        // waiter whose lead is away listens to.
        let lead = lead_server(hold.name.as_str(), self.slots.len());
        let answers = self
            .on_each(None, self.timeout, |i, b| async move {
                b.release_with(hold, Some(i) == lead).await
            })
            .await;
        let released = answers
            .iter()
            .filter(|r| matches!(r, Ok(Released::Released | Released::HandedOff)))
            .count();
        let handed = lead
            .and_then(|i| answers.get(i))
            .is_some_and(|r| matches!(r, Ok(Released::HandedOff)));
        let errors = answers.iter().filter(|r| r.is_err()).count();
        if released >= self.quorum {
            if handed {
                self.note_contended(hold.name.as_str());
                return Ok(Released::HandedOff);
            }
            Ok(Released::Released)
        } else if released + errors >= self.quorum {
            Err(Error::Unavailable(format!(
                "redlock {}: released on {released} servers, {errors} did not answer; \
                 the hold ends with its lease",
                self.shown
            )))
        } else {
            Ok(Released::NotHeld)
        }
    }

    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        self.extend_holds(holds, detach).await
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let answers = self
            .on_all(
                self.timeout * 20,
                |b| async move { b.describe(prefix).await },
            )
            .await;
        let ok = answers.iter().filter(|a| a.is_ok()).count();
        if ok < self.quorum {
            let why = answers
                .into_iter()
                .find_map(|a| a.err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Err(Error::Unavailable(format!(
                "redlock {}: only {ok} servers answered a listing, a majority ({}) is needed: {why}",
                self.shown, self.quorum
            )));
        }
        // name → (kind, owner → (servers listing it, its entry))
        let mut seen: BTreeMap<String, (LockKind, HashMap<String, (usize, HolderInfo)>)> =
            BTreeMap::new();
        for infos in answers.into_iter().flatten() {
            for info in infos {
                let e = seen
                    .entry(info.name.clone())
                    .or_insert_with(|| (info.kind, HashMap::new()));
                for h in info.holders {
                    let slot = e.1.entry(h.owner.clone()).or_insert((0, h.clone()));
                    slot.0 += 1;
                    slot.1.lease_left_ms = match (slot.1.lease_left_ms, h.lease_left_ms) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
        let mut out = Vec::new();
        for (name, (kind, holders)) in seen {
            let mut holders: Vec<HolderInfo> = holders
                .into_values()
                .filter(|(count, _)| *count >= self.quorum)
                .map(|(_, mut h)| {
                    h.token = None;
                    h
                })
                .collect();
            if holders.is_empty() {
                continue;
            }
            holders.sort_by_key(|h| h.acquired_at_ms);
            out.push(LockInfo {
                name,
                kind,
                holders,
                waiters: Vec::new(),
            });
        }
        Ok(out)
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let answers = self
            .on_all(
                self.timeout,
                |b| async move { b.force_release(name, how).await },
            )
            .await;
        let ok = answers.iter().filter(|a| a.is_ok()).count();
        if let Some(Err(e @ Error::InvalidConfig(_))) = answers.iter().find(|a| a.is_err()) {
            return Err(Error::InvalidConfig(e.to_string()));
        }
        if ok < self.quorum {
            return Err(Error::Unavailable(format!(
                "redlock {}: only {ok} servers answered the unlock, a majority ({}) is needed; \
                 the lock may still be held",
                self.shown, self.quorum
            )));
        }
        // One hold is a key on each server: report it once.
        let all: Vec<Forced> = answers.into_iter().flatten().collect();
        Ok(Forced {
            removed: all.iter().map(|f| f.removed).max().unwrap_or(0).min(1),
            revoked: all.iter().map(|f| f.revoked).max().unwrap_or(0).min(1),
            revoked_lease_left_ms: all.iter().filter_map(|f| f.revoked_lease_left_ms).max(),
        })
    }
}

/// A waiting mutex acquisition's part on the name's lead server: the single-server acquisition
/// there, which registers in the lead's waiter set when refused and takes the lead's key when a
/// release hands it on.
struct LeadPart {
    acq: Box<dyn Acquisition>,
    /// The acquisition's last attempt had the lead's answer through `acq`: it waits there.
    answered: bool,
}

/// One acquisition over the servers: how its last attempt was refused, what it saw of each
/// server's channel, and its part on the lead server. Giving up removes its registration there
/// (and hands on a lock handed to it meanwhile).
struct RedlockAcquisition {
    store: RedlockBackend,
    want: Want,
    refused: Option<Refused>,
    seen: Vec<Seen>,
    lead: Option<LeadPart>,
}

#[async_trait::async_trait]
impl Acquisition for RedlockAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        let req = self.want.req();
        self.store
            .attempt(&req, &mut self.refused, &mut self.seen, self.lead.as_mut())
            .await
    }

    async fn changed(&mut self, busy: &Busy, until: Instant) -> Result<Watch> {
        // Refused by the lead through its part there: its hand-off (or a release there that
        // handed nothing on) wakes it, and no other server's release does.
        if let Some(l) = self.lead.as_mut().filter(|l| l.answered) {
            return Ok(match l.acq.changed(busy, until).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "redlock: the lead server's wait failed");
                    Watch::Changed
                }
            });
        }
        self.store
            .changed(self.want.name.as_str(), self.refused, &self.seen, until)
            .await
    }

    fn may_register(&mut self, on: bool) {
        if let Some(l) = self.lead.as_mut() {
            l.acq.may_register(on);
        }
    }

    async fn cancel(&mut self) -> Result<()> {
        let Some(l) = self.lead.as_mut() else {
            return Ok(());
        };
        match tokio::time::timeout(self.store.timeout, l.acq.cancel()).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unavailable(format!(
                "redlock {}: the lead server did not answer a cancel within {:?}",
                self.store.shown, self.store.timeout
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redlock_urls() {
        let c = RedlockConfig::parse(
            "redlock://u:p%40ss@h1:7001,h2:7002,[::1]:7003/2?drift=2%25&prefix=app%3A&timeout=1s",
        )
        .unwrap();
        assert_eq!(c.servers.len(), 3);
        assert_eq!(c.drift_ppm, 20_000);
        assert_eq!(c.servers[0].url, "redis://u:p%40ss@h1:7001/2");
        assert_eq!(c.servers[2].url, "redis://u:p%40ss@[::1]:7003/2");
        assert_eq!(c.servers[1].prefix, "app:");
        assert_eq!(c.servers[1].timeout, Duration::from_secs(1));
        assert_eq!(c.servers[0].password.as_deref(), Some("p@ss"));
        assert!(!c.shown.contains("p%40ss"), "{}", c.shown);
        let d = RedlockConfig::parse("redlock://a:1,b:2,c").unwrap();
        assert_eq!(d.servers[2].url, "redis://c:6379/");
        assert_eq!(d.servers[0].timeout, DEFAULT_TIMEOUT);
        assert_eq!(d.drift_ppm, 10_000);
        assert_eq!(
            RedlockConfig::parse("redlock://a:1,b:2,c:3,d:4?drift=0.05")
                .unwrap()
                .drift_ppm,
            50_000
        );
        for bad in [
            "redlock://a:1,b:2",
            "redlock://a:1",
            "redlock://a:1,a:1,b:2",
            "redlock://a:1,A:1,b:2",
            "redlock://a:1,b:2,c:0",
            "redlock://a:1,b:2,c:99999",
            "redlock://a:1,b:2,c:x",
            "redlock://a:1,,c:3",
            "redlock://a:1,b:2,c:3?drift=0.9",
            "redlock://a:1,b:2,c:3?drift=much",
            "redlock://a:1,b:2,c:3?bogus=1",
            "redlock://a:1,b:2,c:3/x",
            "redlock://a:1,b:2,c:3#f",
            "redlock://:pw@a:1,b:2",
        ] {
            match RedlockConfig::parse(bad) {
                Err(Error::InvalidConfig(m)) => assert!(!m.contains("pw"), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert_eq!(
            crate::url::redact_url("redlock://u:secret@a:1,b:2,c:3?drift=0.01"),
            "redlock://u:***@a:1,b:2,c:3?drift=0.01"
        );
        assert!(crate::enabled_backends().contains(&"redlock"));
    }

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        let b = RedlockBackend {
            slots: Vec::new(),
            quorum: 3,
            drift_ppm: 10_000,
            timeout: DEFAULT_TIMEOUT,
            shown: String::new(),
            contended: Arc::default(),
        };
        assert_eq!(b.drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(b.op_timeout(Duration::from_secs(30)), DEFAULT_TIMEOUT);
        assert_eq!(
            b.op_timeout(Duration::from_millis(500)),
            Duration::from_millis(50)
        );
    }

    fn test_url() -> String {
        match std::env::var("DLOCK_TEST_REDLOCK_URL") {
            Ok(u) if !u.trim().is_empty() => u,
            _ => panic!(
                "DLOCK_TEST_REDLOCK_URL is not set: run the tests through scripts/test.sh, which \
                 starts the servers and sets it"
            ),
        }
    }

    /// The lease of the hand-off tests' holds: longer than any of them runs.
    const LEASE: Duration = Duration::from_secs(30);

    /// The test servers' configuration and `n` clients, each with its own backend (and so its
    /// own connections and hand-off channels, as separate processes have).
    async fn clients(n: usize) -> (RedlockConfig, Vec<crate::Client>) {
        let url = test_url();
        let config = RedlockConfig::parse(&url).unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            let b = Arc::new(RedlockBackend::open(config.clone()).await.unwrap());
            out.push(
                crate::Client::with_backend(b, &url, crate::ClientOptions::default()).unwrap(),
            );
        }
        (config, out)
    }

    /// A new test name under `tag`, its lead server's index and its base key.
    fn test_name(tag: &str, config: &RedlockConfig) -> (String, usize, String) {
        let name = format!("test/{tag}/{}", uuid::Uuid::new_v4());
        let lead = lead_server(&name, config.servers.len()).unwrap();
        let base = format!("dlock:{{{name}}}");
        (name, lead, base)
    }

    /// `EVALSHA` calls the server at `url` has answered so far.
    async fn script_calls(url: &str) -> u64 {
        let mut c = ::redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// A release hands the lead server's key to the first registered waiter and wakes no other:
    /// between the holder's release and the first waiter's grant the lead answers the release
    /// alone (the woken waiter asks only the other servers; a second waiter sleeps on).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_wakes_only_the_first_waiter() {
        let (config, c) = clients(3).await;
        let (name, lead, _) = test_name("handoff", &config);
        let lead_url = config.servers[lead].url.clone();
        let held = c[0].mutex(&name).unwrap().lease(LEASE).acquire().await;
        let held = held.unwrap();
        let (mb, mc) = (
            c[1].mutex(&name).unwrap().lease(LEASE),
            c[2].mutex(&name).unwrap().lease(LEASE),
        );
        let mut waiters = vec![tokio::spawn(async move { mb.acquire().await })];
        // Each waiter is refused once (and registered) well before its next timed attempt (a
        // second or more away).
        tokio::time::sleep(Duration::from_millis(50)).await;
        waiters.push(tokio::spawn(async move { mc.acquire().await }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = script_calls(&lead_url).await;
        held.release().await.unwrap();
        // Waiters that registered during one hold are handed the lock in their records' order.
        let started = Instant::now();
        while !waiters.iter().any(|w| w.is_finished()) {
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "no waiter was handed the lock"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let calls = script_calls(&lead_url).await - before;
        assert_eq!(
            calls, 1,
            "the lead answered {calls} scripts between the release and the grant: only the \
             release's was expected"
        );
        let i = waiters.iter().position(|w| w.is_finished()).unwrap();
        let other = waiters.remove(1 - i);
        let g = waiters.remove(0).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!other.is_finished(), "the other waiter got the lock too");
        g.release().await.unwrap();
        let g2 = tokio::time::timeout(Duration::from_millis(500), other)
            .await
            .expect("the other waiter was handed the lock next")
            .unwrap()
            .unwrap();
        g2.release().await.unwrap();
    }

    /// A waiter that was handed the lead's key and never comes for the rest (its process
    /// stopped: its client still listens) keeps only the lead: the next waiter gets the lock
    /// from the free majority within a second, without the lead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_waiter_handed_the_lead_does_not_keep_the_others_out() {
        let (config, c) = clients(2).await;
        let (name, lead, base) = test_name("stopped-waiter", &config);
        let raw = ::redis::Client::open(config.servers[lead].url.as_str()).unwrap();
        let mut r = raw.get_multiplexed_async_connection().await.unwrap();
        // The stopped waiter: a record ahead of every other, whose client's hand-off channel
        // has a listener that never acts.
        let mut listener = raw.get_async_pubsub().await.unwrap();
        listener
            .subscribe(format!("{base}:handoff:stopped"))
            .await
            .unwrap();
        let held = c[0].mutex(&name).unwrap().lease(LEASE).acquire().await;
        let held = held.unwrap();
        let _: () = ::redis::cmd("ZADD")
            .arg(format!("{base}:w"))
            .arg(-1)
            .arg("stopped\n30000\nstopped\nclient\nhost\n1\n0")
            .query_async(&mut r)
            .await
            .unwrap();
        let m = c[1].mutex(&name).unwrap().lease(LEASE);
        let waiter = tokio::spawn(async move {
            let g = m.acquire_timeout(Duration::from_secs(10)).await;
            (Instant::now(), g)
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let value: String = ::redis::cmd("GET")
            .arg(&base)
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(
            value.starts_with("stopped\n"),
            "the lead's key was not handed to the stopped waiter: {value:?}"
        );
        let (at, g) = waiter.await.unwrap();
        let g = g.expect("the waiter never got the lock from the free majority");
        let late = at.saturating_duration_since(released);
        assert!(
            late < Duration::from_millis(1500),
            "granted {late:?} after the release"
        );
        g.release().await.unwrap();
        let _: () = ::redis::cmd("DEL")
            .arg(&base)
            .arg(format!("{base}:w"))
            .query_async(&mut r)
            .await
            .unwrap();
    }

    /// A key on the lead server alone (a foreign lock, or a release that never reached it):
    /// a try takes the free majority at once; a waiting acquire is refused by the lead first
    /// and gets the free majority at its next ask of every server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_on_the_lead_alone_keeps_nobody_from_a_free_majority() {
        let (config, c) = clients(1).await;
        let mut raw = Vec::new();
        for s in &config.servers {
            let c = ::redis::Client::open(s.url.as_str()).unwrap();
            raw.push(c.get_multiplexed_async_connection().await.unwrap());
        }
        for waiting in [false, true] {
            let (name, lead, base) = test_name("lead-key", &config);
            let _: () = ::redis::cmd("SET")
                .arg(&base)
                .arg("foreign")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut raw[lead])
                .await
                .unwrap();
            let m = c[0].mutex(&name).unwrap();
            let started = Instant::now();
            let g = if waiting {
                m.acquire_timeout(Duration::from_secs(5)).await
            } else {
                m.try_acquire().await
            };
            let g = g.unwrap_or_else(|e| panic!("waiting {waiting}: {e}"));
            assert!(
                started.elapsed() < Duration::from_millis(1500),
                "waiting {waiting}: granted after {:?}",
                started.elapsed()
            );
            g.release().await.unwrap();
            let left: String = ::redis::cmd("GET")
                .arg(&base)
                .query_async(&mut raw[lead])
                .await
                .unwrap();
            assert_eq!(left, "foreign", "the foreign key was touched");
            let _: () = ::redis::cmd("DEL")
                .arg(&base)
                .query_async(&mut raw[lead])
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_majority_must_be_reachable_at_connect() {
        // Three distinct free ports: the listeners stay bound until all three are chosen (a
        // port freed at once may be handed out again), then close so that nothing answers.
        let listeners: Vec<std::net::TcpListener> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        drop(listeners);
        let url = format!(
            "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?connect_timeout=1s",
            ports[0], ports[1], ports[2]
        );
        let t = Instant::now();
        let e = RedlockBackend::connect(&url).await.unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}
