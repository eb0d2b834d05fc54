//! The Redis store (`redis://[user:pass@]host:port[/db]`, `rediss://…` for TLS with the system's
//! root certificates), behind the cargo feature `redis`.
//!
//! # URL options
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `prefix` | `dlock:` | prepended to every key and channel; must not contain `{` or `}` |
//! | `hashtag` | `true` | wrap the lock name in `{…}` so every key of one name is in one cluster slot; `false` uses `prefix + name` verbatim (for interop with hand-written locks on exact key names) |
//! | `connect_timeout` | `3s` | how long connecting (TCP, TLS, AUTH, SELECT) may take |
//! | `timeout` | `2s` | how long one command or pipeline may take |
//!
//! Durations are `500ms`, `2s`, `1m` or a bare number of seconds. Any other option is
//! [`Error::InvalidConfig`].
//!
//! # Key layout
//!
//! `base` is `prefix + "{" + name + "}"` (or `prefix + name` with `hashtag=false`); the lock
//! name `jobs` with the default prefix has the base `dlock:{jobs}`.
//!
//! | key / channel | type | contents | expires |
//! |---|---|---|---|
//! | `base` (mutex) | string | the owner token of the holder | with the hold (`PX` lease) |
//! | `base` (rwlock, semaphore) | hash | `kind` (`rwlock`/`semaphore`), `permits`, and per holder `h:<owner>` = `<mode> <token>` | with the latest holder |
//! | `base:exp` | zset | holder owner → expiry (ms, Redis `TIME`) of rwlock/semaphore holders | with the latest holder |
//! | `base:meta:<owner>` | hash | `client_id`, `host`, `pid`, `acquired_at` (ms), `token`, `mode` of one hold | with that hold |
//! | `base:fence` | string | the fencing counter (`INCR`ed by every grant) | **never** |
//! | `base:q` | zset | waiter owner → arrival sequence | with the last waiter |
//! | `base:qexp` | zset | waiter owner → expiry of its place (ms) | with the last waiter |
//! | `base:qinfo` | hash | waiter owner → `mode \n client_id \n host \n pid` | with the last waiter |
//! | `base:qseq` | string | the arrival counter of the queue | with the last waiter |
//! | `base:released` | channel | published on release, cancel and force-release | — |
//!
//! Every kind of lock uses the **same** `base` key, so a mutex and a rwlock or semaphore of one
//! name collide: requesting a name held as another kind (or a semaphore with another number of
//! permits) is [`Error::InvalidConfig`] ("held as …"), as in the other stores. A `base` key of any
//! other Redis type (or a hash without `kind`, such as Redisson's) is not a dlock lock: acquiring
//! it is [`Error::InvalidConfig`] and it is never modified.
//!
//! ## Interop with `SET key token NX PX` locks
//!
//! A mutex hold is exactly the layout of redis-py's `Lock`, node-redlock and hand-written locks:
//! the key holds the owner token as a plain string with a `PX` expiry, taken with `SET NX PX`
//! semantics, released and extended by compare-and-delete / compare-and-pexpire. So a redis-py
//! `r.lock("dlock:{jobs}")` and a dlock `Mutex` named `jobs` exclude each other (with
//! `hashtag=false`, `Lock(r, "dlock:jobs")`). A foreign holder shows in `describe` with its token
//! as owner and no metadata; its grants do not advance the fencing counter.
//!
//! # The Lua contract
//!
//! Every state change is one Lua script (`EVALSHA`, loaded at connect and again after `NOSCRIPT`),
//! so it is atomic on the server: `acquire` prunes expired holders and queue places, then applies
//! the grant rule of `logic::decide` (its unit tests are the specification): regrant an owner
//! that holds (same token, lease refreshed), refuse another kind, let waiters ahead win (a
//! request without a place counts the whole queue as ahead; a shared request is blocked only by
//! exclusive waiters ahead; a semaphore needs holders + waiters ahead < n), and on a grant
//! `INCR base:fence` **in the same script**. A refused request takes or refreshes a queue place
//! when `Request::takes_queue_place` (fair waiters and waiting rwlock writers) for
//! [`QUEUE_PLACE_TTL`]. `release`, `cancel` and `force_release` `PUBLISH` on `base:released`.
//! Times come from the server's `TIME`, so only Redis's clock matters for expiry.
//!
//! # Connections and wake-ups
//!
//! One multiplexed connection per backend carries every command (it reconnects by itself after
//! an I/O error), plus one pub/sub connection serving all names. A waiter subscribes the name's
//! channel before its next attempt (the first `wait` of a name subscribes and returns at once), and
//! a per-name message counter read before each attempt is compared in `wait`, so a release between
//! the attempt and the wait is never missed. Subscriptions are dropped after 30 s without
//! waiters. If the pub/sub connection drops, waiters are woken, poll at most every second
//! (bounded by the holder's remaining lease, `Busy::retry_in`) and the connection is re-made.
//!
//! Every command has the `timeout`: a dead or paused server answers [`Error::Unavailable`], never
//! a hang. A wrong password is [`Error::InvalidConfig`] saying that authentication failed; the
//! password is never shown.
//!
//! `extend` sends one `EVALSHA` per hold in **one pipeline** (one round trip). `describe` walks
//! the keys with `SCAN MATCH … COUNT 1000` (never `KEYS`), escaping glob characters of the prefix.
//!
//! # Validity and clocks
//!
//! Grants and extensions answer `valid_for = lease`. Redis expires keys on its own clock, counted
//! from when it ran the script, which is after the request was sent; the core's 10 % margin
//! covers clock-rate differences between the client and the server.
//!
//! # What breaks it
//!
//! - **A Redis restart without persistence, or a failover to a replica that missed the write,
//!   loses both the lock and the fence counter**: another client may be granted the lock while the
//!   old holder still trusts it, and fencing tokens can go backwards. Configure AOF with
//!   `appendfsync always` for a single server; with replicas, a grant acknowledged before it
//!   reached a replica can still be lost on failover (Redis's `WAIT` would narrow that window;
//!   dlock does not issue `WAIT` today).
//! - Deleting or rewriting dlock's keys by hand (`FLUSHDB`, eviction under `maxmemory` with an
//!   `allkeys-*` policy — use `noeviction` or `volatile-*` with care).
//! - With `hashtag=false`, a lock name ending in one of the suffixes above (`:fence`, `:q`, …)
//!   overlaps the keys of another name; `describe` skips such keys.

mod url;
pub(crate) use url::RedisTarget;

use super::*;
use crate::error::Error;
use crate::signal::NameSignals;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use ::redis::{Cmd, ErrorKind, RedisError, Script, Value};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};

const COMMON: &str = include_str!("common.lua");

/// A script and its code (for `SCRIPT LOAD` at connect).
struct Lua {
    script: Script,
    code: String,
}

impl std::ops::Deref for Lua {
    type Target = Script;
    fn deref(&self) -> &Script {
        &self.script
    }
}

impl Lua {
    fn new(code: String) -> Lua {
        Lua {
            script: Script::new(&code),
            code,
        }
    }
}

/// The scripts, each with the shared helpers prepended.
struct Scripts {
    acquire: Lua,
    release: Lua,
    extend: Lua,
    cancel: Lua,
    force_release: Lua,
    describe: Lua,
}

impl Scripts {
    fn new() -> Scripts {
        let with = |body: &str| Lua::new(format!("{COMMON}\n{body}"));
        Scripts {
            acquire: with(include_str!("acquire.lua")),
            release: with(include_str!("release.lua")),
            extend: with(include_str!("extend.lua")),
            cancel: with(include_str!("cancel.lua")),
            force_release: with(include_str!("force_release.lua")),
            describe: with(include_str!("describe.lua")),
        }
    }

    fn all(&self) -> [&Lua; 6] {
        [
            &self.acquire,
            &self.release,
            &self.extend,
            &self.cancel,
            &self.force_release,
            &self.describe,
        ]
    }
}

/// Suffixes of the keys next to a base key (skipped by `describe` with `hashtag=false`).
const SUFFIXES: &[&str] = &[":fence", ":exp", ":q", ":qexp", ":qinfo", ":qseq"];
/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: usize = 1000;
/// How many `describe` scripts go in one pipeline.
const DESCRIBE_BATCH: usize = 100;
/// A subscription without waiters for this long is dropped.
const SUBSCRIPTION_IDLE: Duration = Duration::from_secs(30);
/// How often idle subscriptions are looked for.
const JANITOR_EVERY: Duration = Duration::from_secs(10);
/// While the pub/sub connection is down: the longest a waiter sleeps between attempts, and the
/// shortest interval between two attempts to reconnect it.
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// One subscribed channel.
#[derive(Debug)]
struct Sub {
    /// The pub/sub connection generation it was made on.
    generation: u64,
    /// Messages received on it.
    count: u64,
    /// Tasks inside `wait` for it.
    waiters: usize,
    last_used: Instant,
}

#[derive(Debug, Default)]
struct Subs {
    /// By lock name.
    by_name: HashMap<String, Sub>,
    /// Channel → lock name.
    names: HashMap<String, String>,
}

/// The live pub/sub connection.
struct Link {
    generation: u64,
    sink: PubSubSink,
    /// Dropping it stops the dispatcher and janitor of this link (and closes the connection).
    _stop: tokio::sync::watch::Sender<()>,
}

struct Shared {
    conn: ConnectionManager,
    client: ::redis::Client,
    target: RedisTarget,
    scripts: Scripts,
    link: tokio::sync::Mutex<Option<Link>>,
    next_link_try: StdMutex<Option<Instant>>,
    generation: std::sync::atomic::AtomicU64,
    subs: StdMutex<Subs>,
    /// Fans the pub/sub messages out to the waiters of their names.
    signals: NameSignals,
}

/// What a waiter saw of its name's subscription before its last attempt: the pub/sub
/// connection's generation and the count of messages (`None` if the name was not subscribed).
pub(crate) type Seen = Option<(u64, u64)>;

/// The Redis store. Obtain it with `dlock::connect("redis://127.0.0.1:6379/")`, or
/// [`RedisBackend::connect`] and [`crate::Client::with_backend`]. See the module docs for the key
/// layout, the scripts and what breaks the guarantees.
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.shared.target.shown)
            .field("prefix", &self.shared.target.prefix)
            .field("hashtag", &self.shared.target.hashtag)
            .finish()
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps behind these mutexes stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A duration in whole milliseconds, rounded up, at least 1.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

fn kind_args(kind: LockKind) -> (&'static str, u32) {
    match kind {
        LockKind::Mutex => ("mutex", 0),
        LockKind::RwLock => ("rwlock", 0),
        LockKind::Semaphore { permits } => ("semaphore", permits),
    }
}

fn parse_kind(kind: &str, permits: i64) -> Option<LockKind> {
    match kind {
        "mutex" => Some(LockKind::Mutex),
        "rwlock" => Some(LockKind::RwLock),
        "semaphore" => u32::try_from(permits)
            .ok()
            .filter(|p| *p > 0)
            .map(|permits| LockKind::Semaphore { permits }),
        _ => None,
    }
}

fn parse_mode(mode: &str) -> Mode {
    if mode == "shared" {
        Mode::Shared
    } else {
        Mode::Exclusive
    }
}

/// The lock name of a scanned key, if it is a base key.
fn name_of_key(target: &RedisTarget, key: &str) -> Option<String> {
    let rest = key.strip_prefix(target.prefix.as_str())?;
    let name = if target.hashtag {
        rest.strip_prefix('{')?.strip_suffix('}')?
    } else {
        if SUFFIXES.iter().any(|s| rest.ends_with(s)) {
            return None;
        }
        if let Some((_, owner)) = rest.rsplit_once(":meta:") {
            if uuid::Uuid::parse_str(owner).is_ok() {
                return None;
            }
        }
        rest
    };
    LockName::new(name).ok().map(|n| n.as_str().to_owned())
}

/// With `hashtag=false` the keys of lock `n` are `prefix + n + suffix`, so a name ending with a
/// suffix would be another lock's key (`a:fence` is the fencing counter of `a`): such names are
/// refused there rather than corrupting that lock.
fn check_verbatim_name(target: &RedisTarget, name: &str) -> Result<()> {
    if target.hashtag {
        return Ok(());
    }
    let meta = name
        .rsplit_once(":meta:")
        .is_some_and(|(_, owner)| uuid::Uuid::parse_str(owner).is_ok());
    match SUFFIXES.iter().find(|s| name.ends_with(*s)) {
        Some(s) => Err(Error::InvalidName(format!(
            "with hashtag=false a lock name must not end with {s:?}: its key would be another \
             lock's (use the default hashtag=true)"
        ))),
        None if meta => Err(Error::InvalidName(
            "with hashtag=false a lock name must not end with \":meta:<uuid>\": its key would be \
             another lock's (use the default hashtag=true)"
                .into(),
        )),
        None => Ok(()),
    }
}

/// Escapes Redis glob characters so `s` matches only itself in `SCAN MATCH`.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn unexpected(what: &str, v: &dyn fmt::Debug) -> Error {
    Error::backend(format!("unexpected {what} from redis: {v:?}"))
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Nil => Some(String::new()),
        _ => None,
    }
}

fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) => Some(a),
        _ => None,
    }
}

impl Shared {
    fn base(&self, name: &str) -> String {
        if self.target.hashtag {
            format!("{}{{{}}}", self.target.prefix, name)
        } else {
            format!("{}{}", self.target.prefix, name)
        }
    }

    fn channel(base: &str) -> String {
        format!("{base}:released")
    }

    fn err(&self, e: RedisError) -> Error {
        map_err(&self.target, e)
    }

    /// The error of a subscription that did not finish within the command timeout.
    fn timed_out(&self, what: &str) -> Error {
        Error::Unavailable(format!(
            "redis at {} did not answer {what} within {:?}",
            self.target.shown, self.target.timeout
        ))
    }

    /// `EVALSHA` of `script` (loading it after `NOSCRIPT`).
    async fn eval(&self, script: &Script, keys: &[&str], args: &[String]) -> Result<Value> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(a.as_str());
        }
        let mut conn = self.conn.clone();
        inv.invoke_async::<Value>(&mut conn)
            .await
            .map_err(|e| self.err(e))
    }

    /// Runs a pipeline of `EVALSHA`s of `script`, loading the script and retrying once after
    /// `NOSCRIPT` (the scripts are idempotent for a repeat).
    async fn eval_pipeline(
        &self,
        script: &Script,
        calls: &[(Vec<String>, Vec<String>)],
    ) -> Result<Vec<Value>> {
        let mut pipe = ::redis::pipe();
        for (keys, args) in calls {
            let mut c = Cmd::new();
            c.arg("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(args);
            pipe.add_command(c);
        }
        let mut conn = self.conn.clone();
        let run = async {
            match pipe.query_async::<Vec<Value>>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    script.prepare_invoke().load_async(&mut conn).await?;
                    pipe.query_async::<Vec<Value>>(&mut conn).await
                }
                other => other,
            }
        };
        let out = run.await.map_err(|e| self.err(e))?;
        if out.len() != calls.len() {
            return Err(unexpected("pipeline answer count", &out.len()));
        }
        Ok(out)
    }

    // ---- pub/sub ----

    /// The (generation, count) of `name`'s subscription, marking it used.
    fn sub_state(&self, name: &str) -> Option<(u64, u64)> {
        let mut subs = lock(&self.subs);
        subs.by_name.get_mut(name).map(|s| {
            s.last_used = Instant::now();
            (s.generation, s.count)
        })
    }

    fn on_message(&self, channel: &str) {
        let name = {
            let mut subs = lock(&self.subs);
            let Some(name) = subs.names.get(channel).cloned() else {
                return;
            };
            if let Some(s) = subs.by_name.get_mut(&name) {
                s.count = s.count.wrapping_add(1);
            }
            name
        };
        self.signals.wake(&name);
    }

    /// Forgets every subscription of connection `generation` and wakes their waiters.
    async fn link_lost(&self, generation: u64) {
        let mut link = self.link.lock().await;
        if link.as_ref().map(|l| l.generation) != Some(generation) {
            return;
        }
        *link = None;
        let names: Vec<String> = {
            let mut subs = lock(&self.subs);
            let names = subs.by_name.keys().cloned().collect();
            *subs = Subs::default();
            names
        };
        drop(link);
        tracing::debug!("redis pub/sub connection lost; waiters poll until it is back");
        for n in names {
            self.signals.wake(&n);
        }
    }

    /// Makes sure `name`'s channel is subscribed. `Ok(true)` if this call subscribed it.
    async fn subscribe(self: &Arc<Self>, name: &str, until: Instant) -> Result<bool> {
        let deadline = until.min(Instant::now() + self.target.timeout);
        let mut link = match tokio::time::timeout_at(deadline.into(), self.link.lock()).await {
            Ok(l) => l,
            Err(_) => return Err(self.timed_out("a subscription")),
        };
        if lock(&self.subs).by_name.contains_key(name) {
            return Ok(false);
        }
        if link.is_none() {
            {
                let mut next = lock(&self.next_link_try);
                if next.is_some_and(|t| Instant::now() < t) {
                    return Err(Error::Unavailable(
                        "the redis pub/sub connection is down".into(),
                    ));
                }
                *next = Some(Instant::now() + FALLBACK_POLL);
            }
            *link = Some(self.open_link(deadline).await?);
        }
        let Some(l) = link.as_mut() else {
            return Err(Error::Unavailable(
                "the redis pub/sub connection is down".into(),
            ));
        };
        let base = self.base(name);
        let channel = Self::channel(&base);
        let generation = l.generation;
        match tokio::time::timeout_at(deadline.into(), l.sink.subscribe(channel.as_str())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                *link = None;
                *lock(&self.subs) = Subs::default();
                return Err(self.err(e));
            }
            Err(_) => return Err(self.timed_out("a subscription")),
        }
        let mut subs = lock(&self.subs);
        subs.names.insert(channel, name.to_owned());
        subs.by_name.insert(
            name.to_owned(),
            Sub {
                generation,
                count: 0,
                waiters: 0,
                last_used: Instant::now(),
            },
        );
        Ok(true)
    }

    /// Opens the pub/sub connection and starts its dispatcher and janitor.
    async fn open_link(self: &Arc<Self>, deadline: Instant) -> Result<Link> {
        let pubsub = match tokio::time::timeout_at(
            deadline
                .min(Instant::now() + self.target.connect_timeout)
                .into(),
            self.client.get_async_pubsub(),
        )
        .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(self.err(e)),
            Err(_) => return Err(self.timed_out("the pub/sub connection")),
        };
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let (sink, mut stream) = pubsub.split();
        let (stop, mut stopped) = tokio::sync::watch::channel(());
        *lock(&self.subs) = Subs::default();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(m) => match weak.upgrade() {
                            Some(s) => s.on_message(m.get_channel_name()),
                            None => return,
                        },
                        None => break,
                    },
                    _ = stopped.changed() => return,
                }
            }
            if let Some(s) = weak.upgrade() {
                s.link_lost(generation).await;
            }
        });
        let weak: Weak<Shared> = Arc::downgrade(self);
        let mut stopped = stop.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(JANITOR_EVERY) => {}
                    _ = stopped.changed() => return,
                }
                let Some(s) = weak.upgrade() else { return };
                s.drop_idle(generation).await;
            }
        });
        Ok(Link {
            generation,
            sink,
            _stop: stop,
        })
    }

    /// Unsubscribes channels that had no waiters for [`SUBSCRIPTION_IDLE`].
    async fn drop_idle(&self, generation: u64) {
        let mut link = self.link.lock().await;
        let Some(l) = link.as_mut().filter(|l| l.generation == generation) else {
            return;
        };
        let channels: Vec<String> = {
            let mut subs = lock(&self.subs);
            let idle: Vec<String> = subs
                .by_name
                .iter()
                .filter(|(_, s)| s.waiters == 0 && s.last_used.elapsed() > SUBSCRIPTION_IDLE)
                .map(|(n, _)| n.clone())
                .collect();
            for n in &idle {
                subs.by_name.remove(n);
            }
            let channels: Vec<String> = subs
                .names
                .iter()
                .filter(|(_, n)| idle.contains(n))
                .map(|(c, _)| c.clone())
                .collect();
            for c in &channels {
                subs.names.remove(c);
            }
            channels
        };
        if channels.is_empty() {
            return;
        }
        let r = tokio::time::timeout(self.target.timeout, l.sink.unsubscribe(&channels)).await;
        if !matches!(r, Ok(Ok(()))) {
            // Unsure what the server still sends us: start over with a new connection.
            *link = None;
            *lock(&self.subs) = Subs::default();
        }
    }
}

/// Counts a task inside `wait` on a subscription, so the janitor keeps it.
struct WaiterMark<'a> {
    shared: &'a Shared,
    name: &'a str,
}

impl<'a> WaiterMark<'a> {
    fn new(shared: &'a Shared, name: &'a str) -> Self {
        if let Some(s) = lock(&shared.subs).by_name.get_mut(name) {
            s.waiters += 1;
            s.last_used = Instant::now();
        }
        WaiterMark { shared, name }
    }
}

impl Drop for WaiterMark<'_> {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.shared.subs).by_name.get_mut(self.name) {
            s.waiters = s.waiters.saturating_sub(1);
            s.last_used = Instant::now();
        }
    }
}

/// Maps a redis error to a dlock error; the password never appears.
fn map_err(target: &RedisTarget, e: RedisError) -> Error {
    let scrub = |m: String| match &target.password {
        Some(p) if !p.is_empty() => m.replace(p.as_str(), "***"),
        _ => m,
    };
    let shown = &target.shown;
    let code = e.code().unwrap_or("");
    if e.kind() == ErrorKind::AuthenticationFailed || matches!(code, "NOAUTH" | "WRONGPASS") {
        return Error::InvalidConfig(scrub(format!(
            "redis at {shown}: authentication failed ({}); check the user and password in the URL",
            e.detail().unwrap_or(e.category())
        )));
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::BusyLoadingError
                | ErrorKind::ReadOnly
                | ErrorKind::MasterDown
                | ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::Moved
                | ErrorKind::Ask
        )
        || matches!(code, "BUSY" | "LOADING" | "MASTERDOWN")
    {
        return Error::Unavailable(scrub(format!("redis at {shown}: {e}")));
    }
    Error::backend(scrub(format!("redis at {shown}: {e}")))
}

impl RedisBackend {
    /// Connects to the Redis server of `url` (see the module docs for the URL and its options).
    ///
    /// Errors: [`Error::InvalidConfig`] for a malformed URL, an unknown option or a wrong
    /// password; [`Error::Unavailable`] if the server cannot be reached within `connect_timeout`.
    pub async fn connect(url: &str) -> Result<RedisBackend> {
        Self::open(RedisTarget::parse(url)?).await
    }

    pub(crate) async fn open(target: RedisTarget) -> Result<RedisBackend> {
        let client = ::redis::Client::open(target.url.as_str()).map_err(|e| {
            Error::InvalidConfig(format!("redis URL {}: {}", target.shown, e.category()))
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(target.connect_timeout)
            .set_response_timeout(target.timeout)
            .set_number_of_retries(0);
        let cm = ConnectionManager::new_with_config(client.clone(), config);
        let mut conn = match tokio::time::timeout(target.connect_timeout, cm).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                let e = map_err(&target, e);
                return Err(match e {
                    Error::Backend(b) => Error::Unavailable(b.to_string()),
                    other => other,
                });
            }
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "redis at {} did not accept a connection within {:?}",
                    target.shown, target.connect_timeout
                )))
            }
        };
        let scripts = Scripts::new();
        // One round trip: proves the connection is authenticated and loads every script.
        let mut pipe = ::redis::pipe();
        pipe.cmd("PING");
        for s in scripts.all() {
            pipe.cmd("SCRIPT").arg("LOAD").arg(s.code.as_str());
        }
        match tokio::time::timeout(
            target.connect_timeout,
            pipe.query_async::<Vec<Value>>(&mut conn),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(map_err(&target, e)),
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "redis at {} did not answer within {:?}",
                    target.shown, target.connect_timeout
                )))
            }
        }
        Ok(RedisBackend {
            shared: Arc::new(Shared {
                conn,
                client,
                target,
                scripts,
                link: tokio::sync::Mutex::new(None),
                next_link_try: StdMutex::new(None),
                generation: std::sync::atomic::AtomicU64::new(0),
                subs: StdMutex::new(Subs::default()),
                signals: NameSignals::default(),
            }),
        })
    }

    /// The base key of lock `name` (see the key layout in the module docs), e.g. `dlock:{jobs}`.
    pub fn base_key(&self, name: &LockName) -> String {
        self.shared.base(name.as_str())
    }

    // ---- hooks for stores built of several Redis servers (Redlock) ----

    /// Whether `name`'s release channel is subscribed on this server's pub/sub connection.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn is_subscribed(&self, name: &str) -> bool {
        lock(&self.shared.subs).by_name.contains_key(name)
    }

    /// Makes sure `name`'s release channel is subscribed (the pub/sub machinery of `wait`, without
    /// waiting). `Ok(true)` if this call subscribed it.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) async fn subscribe_name(&self, name: &str, until: Instant) -> Result<bool> {
        self.shared.subscribe(name, until).await
    }

    /// Compare-and-delete of a mutex hold **without** publishing a wake-up: Redlock's clean-up
    /// of a grant that did not reach a majority (waking waiters for it would make contenders
    /// take turns in a loop while a real holder keeps the lock).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) async fn release_quiet(&self, name: &LockName, owner: &str) -> Result<Released> {
        let sh = &self.shared;
        let (base, exp, meta) = self.hold_keys(name.as_str(), owner);
        let v = sh
            .eval(
                &sh.scripts.release,
                &[&base, &exp, &meta],
                &[owner.to_owned(), String::new()],
            )
            .await?;
        match int(&v) {
            Some(1) => Ok(Released::Released),
            Some(0) => Ok(Released::NotHeld),
            _ => Err(unexpected("release answer", &v)),
        }
    }

    /// One attempt of `req` (the grant script).
    pub(crate) async fn attempt(&self, req: &Request<'_>) -> Result<Attempt> {
        let sh = &self.shared;
        let name = req.name.as_str();
        check_verbatim_name(&sh.target, name)?;
        let (base, exp, meta) = self.hold_keys(name, req.owner);
        let keys = [
            base.clone(),
            format!("{base}:fence"),
            exp,
            format!("{base}:q"),
            format!("{base}:qexp"),
            format!("{base}:qinfo"),
            format!("{base}:qseq"),
            meta,
        ];
        let (kind, permits) = kind_args(req.kind);
        let info = format!(
            "{}\n{}\n{}\n{}",
            req.mode.as_str(),
            req.meta.client_id,
            req.meta.host,
            req.meta.pid
        );
        let args = [
            req.owner.to_owned(),
            kind.to_owned(),
            permits.to_string(),
            req.mode.as_str().to_owned(),
            ms(req.lease).to_string(),
            if req.takes_queue_place() { "1" } else { "0" }.to_owned(),
            ms(QUEUE_PLACE_TTL).to_string(),
            req.meta.client_id.clone(),
            req.meta.host.clone(),
            req.meta.pid.to_string(),
            info,
        ];
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let v = sh.eval(&sh.scripts.acquire, &key_refs, &args).await?;
        let a = array(&v).ok_or_else(|| unexpected("acquire answer", &v))?;
        let status = a.first().and_then(int);
        match status {
            Some(1) => {
                let token = a
                    .get(1)
                    .and_then(int)
                    .ok_or_else(|| unexpected("token", &v))?;
                Ok(Attempt::Granted(Grant {
                    token: u64::try_from(token).ok().filter(|t| *t > 0),
                    valid_for: req.lease,
                }))
            }
            Some(0) => {
                let retry = a.get(1).and_then(int).unwrap_or(-1);
                Ok(Attempt::Busy(Busy {
                    retry_in: u64::try_from(retry).ok().map(Duration::from_millis),
                }))
            }
            Some(-1) => {
                let held = a.get(1).and_then(text).unwrap_or_default();
                let permits = a.get(2).and_then(int).unwrap_or(0);
                let held = parse_kind(&held, permits)
                    .map(|k| k.to_string())
                    .unwrap_or(held);
                Err(Error::InvalidConfig(format!(
                    "lock {name:?} is held as {held}, requested as {}",
                    req.kind
                )))
            }
            Some(-2) => {
                let t = a.get(1).and_then(text).unwrap_or_default();
                Err(Error::InvalidConfig(format!(
                    "key {base:?} holds a redis {t} that is not a dlock lock; \
                     choose another name or prefix"
                )))
            }
            _ => Err(unexpected("acquire answer", &v)),
        }
    }

    /// What a waiter of `name` notes before its attempt (see [`Seen`]).
    pub(crate) fn seen(&self, name: &str) -> Seen {
        self.shared.sub_state(name)
    }

    /// Waits for a release message on `name`'s channel since `seen`, or `until`; subscribes the
    /// channel first if it is not (then the caller attempts again at once).
    pub(crate) async fn changed_since(
        &self,
        name: &str,
        seen: Seen,
        until: Instant,
    ) -> Result<Watch> {
        let sh = &self.shared;
        let notify = sh.signals.subscribe(name);
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match sh.sub_state(name) {
            Some(now) => {
                if Some(now) != seen {
                    // Subscribed after the attempt, or a message came since: try again.
                    return Ok(Watch::Woken);
                }
                let _mark = WaiterMark::new(sh, name);
                let _ = tokio::time::timeout_at(until.into(), notified).await;
                Ok(Watch::Woken)
            }
            None => match sh.subscribe(name, until).await {
                // Subscribed now: the caller tries again, and every release from here on wakes it.
                Ok(_) => Ok(Watch::Woken),
                Err(e) => {
                    tracing::debug!(error = %e, "redis pub/sub unavailable; polling");
                    Ok(Watch::Poll {
                        min: FALLBACK_POLL / 2,
                        max: FALLBACK_POLL,
                    })
                }
            },
        }
    }

    /// Removes `req`'s queue place, if any.
    pub(crate) async fn cancel_place(&self, req: &Request<'_>) -> Result<()> {
        let sh = &self.shared;
        let base = sh.base(req.name.as_str());
        let keys = [
            format!("{base}:q"),
            format!("{base}:qexp"),
            format!("{base}:qinfo"),
            format!("{base}:qseq"),
        ];
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        sh.eval(
            &sh.scripts.cancel,
            &key_refs,
            &[req.owner.to_owned(), Shared::channel(&base)],
        )
        .await?;
        Ok(())
    }

    fn hold_keys(&self, name: &str, owner: &str) -> (String, String, String) {
        let base = self.shared.base(name);
        let exp = format!("{base}:exp");
        let meta = format!("{base}:meta:{owner}");
        (base, exp, meta)
    }

    /// Extends `holds` in one pipeline (`detach`: marked as renewed by nobody any more).
    pub(crate) async fn extend_holds(
        &self,
        holds: &[HoldRef<'_>],
        detach: bool,
    ) -> Result<Vec<Extended>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        let sh = &self.shared;
        let flag = if detach { "1" } else { "0" };
        let calls: Vec<(Vec<String>, Vec<String>)> = holds
            .iter()
            .map(|h| {
                let (base, exp, meta) = self.hold_keys(h.name.as_str(), h.owner);
                (
                    vec![base, exp, meta],
                    vec![h.owner.to_owned(), ms(h.lease).to_string(), flag.to_owned()],
                )
            })
            .collect();
        let out = sh.eval_pipeline(&sh.scripts.extend, &calls).await?;
        holds
            .iter()
            .zip(out)
            .map(|(h, v)| match int(&v) {
                Some(1) => Ok(Extended::Held { valid_for: h.lease }),
                Some(0) => Ok(Extended::Gone),
                Some(2) => Ok(Extended::Revoked),
                _ => Err(unexpected("extend answer", &v)),
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: true,
            wakeups: Wakeups::Native,
            validity: Validity::Lease,
            queues_waiters: false,
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        Box::new(RedisAcquisition {
            store: self.clone(),
            want: Want::new(req),
            seen: None,
        })
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.shared.target.timeout)
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        let sh = &self.shared;
        let (base, exp, meta) = self.hold_keys(hold.name.as_str(), hold.owner);
        let channel = Shared::channel(&base);
        let v = sh
            .eval(
                &sh.scripts.release,
                &[&base, &exp, &meta],
                &[hold.owner.to_owned(), channel],
            )
            .await?;
        match int(&v) {
            Some(1) => Ok(Released::Released),
            Some(0) => Ok(Released::NotHeld),
            _ => Err(unexpected("release answer", &v)),
        }
    }

    async fn extend(&self, holds: &[HoldRef<'_>]) -> Result<Vec<Extended>> {
        self.extend_holds(holds, false).await
    }

    async fn detach(&self, hold: &HoldRef<'_>) -> Result<Extended> {
        Ok(sole(
            self.extend_holds(std::slice::from_ref(hold), true).await?,
        ))
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let sh = &self.shared;
        let t = &sh.target;
        let pattern = if t.hashtag {
            format!("{}{{{}*", glob_escape(&t.prefix), glob_escape(prefix))
        } else {
            format!("{}{}*", glob_escape(&t.prefix), glob_escape(prefix))
        };
        let mut names: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut c = Cmd::new();
            c.arg("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let mut conn = sh.conn.clone();
            let (next, keys): (u64, Vec<Vec<u8>>) =
                c.query_async(&mut conn).await.map_err(|e| sh.err(e))?;
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
                            format!("{base}:exp"),
                            format!("{base}:q"),
                            format!("{base}:qexp"),
                            format!("{base}:qinfo"),
                        ],
                        vec![format!("{base}:meta:")],
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

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let sh = &self.shared;
        check_verbatim_name(&sh.target, name.as_str())?;
        let base = sh.base(name.as_str());
        let keys = [
            base.clone(),
            format!("{base}:exp"),
            format!("{base}:q"),
            format!("{base}:qexp"),
            format!("{base}:qinfo"),
            format!("{base}:qseq"),
        ];
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mode = match how {
            Force::Revoke => "revoke",
            Force::Break => "break",
        };
        let v = sh
            .eval(
                &sh.scripts.force_release,
                &key_refs,
                &[
                    Shared::channel(&base),
                    format!("{base}:meta:"),
                    mode.to_owned(),
                ],
            )
            .await?;
        let a = array(&v).ok_or_else(|| unexpected("force_release answer", &v))?;
        let n = |i: usize| a.get(i).and_then(int);
        match (n(0), n(1), n(2)) {
            (Some(-1), _, _) => Err(Error::InvalidConfig(format!(
                "key {base:?} holds a redis {} that is not a dlock lock; it was left alone",
                a.get(1).and_then(text).unwrap_or_default()
            ))),
            (Some(removed), Some(revoked), Some(longest)) if removed >= 0 && revoked >= 0 => {
                Ok(Forced {
                    removed: u64::try_from(removed).unwrap_or(0),
                    revoked: u64::try_from(revoked).unwrap_or(0),
                    revoked_lease_left_ms: u64::try_from(longest).ok(),
                })
            }
            _ => Err(unexpected("force_release answer", &v)),
        }
    }
}

/// Decodes the answer of `describe.lua` for `name`.
fn parse_describe(name: &str, v: &Value) -> Result<Option<LockInfo>> {
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
        let f: Vec<String> = array(h)
            .ok_or_else(bad)?
            .iter()
            .map(|x| text(x).unwrap_or_default())
            .collect();
        if f.len() < 9 {
            return Err(bad());
        }
        holders.push(HolderInfo {
            owner: f[0].clone(),
            meta: HolderMeta {
                client_id: f[3].clone(),
                host: f[4].clone(),
                pid: f[5].parse().unwrap_or(0),
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

/// One acquisition on one Redis server: what it saw of the name's channel before its last
/// attempt.
struct RedisAcquisition {
    store: RedisBackend,
    want: Want,
    seen: Seen,
}

#[async_trait::async_trait]
impl Acquisition for RedisAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        if self.want.waiting {
            // Read before the attempt: `changed` compares it with the count then.
            self.seen = self.store.seen(self.want.name.as_str());
        }
        self.store.attempt(&self.want.req()).await
    }

    async fn changed(&mut self, _busy: &Busy, until: Instant) -> Result<Watch> {
        self.store
            .changed_since(self.want.name.as_str(), self.seen, until)
            .await
    }

    async fn cancel(&mut self) -> Result<()> {
        self.store.cancel_place(&self.want.req()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_support::*;
    use ::redis::AsyncCommands;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn url() -> String {
        std::env::var("DLOCK_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
    }

    async fn backend() -> RedisBackend {
        RedisBackend::connect(&url())
            .await
            .unwrap_or_else(|e| panic!("the test Redis at {} is not reachable: {e}", url()))
    }

    async fn raw() -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    fn uniq(tag: &str) -> LockName {
        LockName::new(format!("test/{tag}/{}", uuid::Uuid::new_v4())).unwrap()
    }

    #[test]
    fn glob_escaping_and_key_names() {
        assert_eq!(glob_escape(r"a*b?[c]\d"), r"a\*b\?\[c\]\\d");
        let target = |hashtag| RedisTarget {
            url: String::new(),
            shown: String::new(),
            password: None,
            prefix: "p:".into(),
            hashtag,
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        };
        let t = target(true);
        assert_eq!(name_of_key(&t, "p:{a/b}").as_deref(), Some("a/b"));
        assert_eq!(name_of_key(&t, "p:{x}}").as_deref(), Some("x}"));
        assert_eq!(name_of_key(&t, "p:{a}:fence"), None);
        assert_eq!(
            name_of_key(&t, "p:{a}:meta:0b9a3c6e-6b1d-4d3f-9a57-1f2e3d4c5b6a"),
            None
        );
        assert_eq!(name_of_key(&t, "q:{a}"), None);
        assert_eq!(name_of_key(&t, "p:{}"), None);
        let f = target(false);
        assert_eq!(name_of_key(&f, "p:jobs").as_deref(), Some("jobs"));
        assert_eq!(name_of_key(&f, "p:jobs:fence"), None);
        assert_eq!(name_of_key(&f, "p:jobs:qseq"), None);
        assert_eq!(
            name_of_key(&f, "p:jobs:meta:0b9a3c6e-6b1d-4d3f-9a57-1f2e3d4c5b6a"),
            None
        );
        assert_eq!(
            name_of_key(&f, "p:jobs:meta:x").as_deref(),
            Some("jobs:meta:x")
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn two_clients_exclude_and_the_key_is_a_plain_string() {
        let (a, b) = (backend().await, backend().await);
        let n = uniq("plain");
        let (ma, mb) = (meta("a"), meta("b"));
        let ra = rq(&n, "owner-a", &ma);
        let rb = rq(&n, "owner-b", &mb);
        let t = token(a.acquire(&ra).await.unwrap());
        let bz = busy(b.acquire(&rb).await.unwrap());
        let left = bz.retry_in.unwrap();
        assert!(left > Duration::from_secs(29) && left <= LONG, "{left:?}");
        // regrant: same token
        assert_eq!(token(a.acquire(&ra).await.unwrap()), t);
        let mut c = raw().await;
        let key = a.base_key(&n);
        assert_eq!(key, format!("dlock:{{{}}}", n.as_str()));
        let ty: String = ::redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(ty, "string");
        let v: String = c.get(&key).await.unwrap();
        assert_eq!(v, "owner-a");
        let pttl: i64 = c.pttl(&key).await.unwrap();
        assert!(pttl > 29_000 && pttl <= 30_000, "{pttl}");
        let fence: u64 = c.get(format!("{key}:fence")).await.unwrap();
        assert_eq!(fence, t);
        let meta_ttl: i64 = c.pttl(format!("{key}:meta:owner-a")).await.unwrap();
        assert!(meta_ttl > 29_000, "{meta_ttl}");
        assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::NotHeld);
        assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::Released);
        let exists: bool = c.exists(&key).await.unwrap();
        assert!(!exists);
        let meta_exists: bool = c.exists(format!("{key}:meta:owner-a")).await.unwrap();
        assert!(!meta_exists);
        assert_eq!(token(b.acquire(&rb).await.unwrap()), t + 1);
        b.release(&hr(&rb)).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn raw_set_nx_px_and_dlock_exclude_each_other() {
        let b = backend().await;
        let mut c = raw().await;
        let n = uniq("interop");
        let key = b.base_key(&n);
        let m = meta("a");
        let r = rq(&n, "dlock-owner", &m);
        let set: Option<String> = ::redis::cmd("SET")
            .arg(&key)
            .arg("other")
            .arg("NX")
            .arg("PX")
            .arg(5000)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(set.as_deref(), Some("OK"));
        let bz = busy(b.acquire(&r).await.unwrap());
        assert!(bz.retry_in.unwrap() <= Duration::from_secs(5));
        // describe shows the foreign holder by its token
        let info = b.describe(n.as_str()).await.unwrap();
        assert_eq!(info[0].holders[0].owner, "other");
        assert_eq!(info[0].holders[0].token, None);
        // dlock's release leaves the foreign key alone
        assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::NotHeld);
        let v: String = c.get(&key).await.unwrap();
        assert_eq!(v, "other");
        let _: () = c.del(&key).await.unwrap();
        token(b.acquire(&r).await.unwrap());
        let set: Option<String> = ::redis::cmd("SET")
            .arg(&key)
            .arg("other")
            .arg("NX")
            .arg("PX")
            .arg(5000)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(set, None, "SET NX must fail while dlock holds");
        b.release(&hr(&r)).await.unwrap();
        // a hand-written compare-and-delete sees dlock's token as the value
        token(b.acquire(&r).await.unwrap());
        let v: String = c.get(&key).await.unwrap();
        assert_eq!(v, "dlock-owner");
        b.release(&hr(&r)).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn release_of_an_expired_hold_leaves_the_next_holder_alone() {
        let (a, b) = (backend().await, backend().await);
        let n = uniq("expired");
        let (ma, mb) = (meta("a"), meta("b"));
        let ra = Request {
            lease: Duration::from_millis(150),
            ..rq(&n, "old", &ma)
        };
        let rb = rq(&n, "new", &mb);
        let t1 = token(a.acquire(&ra).await.unwrap());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t2 = token(b.acquire(&rb).await.unwrap());
        assert!(t2 > t1);
        assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::NotHeld);
        assert_eq!(a.extend(&[hr(&ra)]).await.unwrap(), [Extended::Gone]);
        let mut c = raw().await;
        let v: String = c.get(b.base_key(&n)).await.unwrap();
        assert_eq!(v, "new");
        assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::Released);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn fence_increases_across_expiry_and_force_release() {
        let b = backend().await;
        let n = uniq("fence");
        let m = meta("a");
        let short = Request {
            lease: Duration::from_millis(120),
            ..rq(&n, "o1", &m)
        };
        let t1 = token(b.acquire(&short).await.unwrap());
        tokio::time::sleep(Duration::from_millis(250)).await;
        let r2 = rq(&n, "o2", &m);
        let t2 = token(b.acquire(&r2).await.unwrap());
        assert!(t2 > t1);
        assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
        assert!(b.describe(n.as_str()).await.unwrap().is_empty());
        let r3 = rq(&n, "o3", &m);
        let t3 = token(b.acquire(&r3).await.unwrap());
        assert!(t3 > t2);
        assert_eq!(b.release(&hr(&r2)).await.unwrap(), Released::NotHeld);
        // rwlock and semaphore share the counter of the name
        b.release(&hr(&r3)).await.unwrap();
        let rw = Request {
            kind: LockKind::RwLock,
            mode: Mode::Shared,
            ..rq(&n, "o4", &m)
        };
        let t4 = token(b.acquire(&rw).await.unwrap());
        assert!(t4 > t3);
        assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
        let mut c = raw().await;
        let key = b.base_key(&n);
        let fence: u64 = c.get(format!("{key}:fence")).await.unwrap();
        assert_eq!(fence, t4);
        let ttl: i64 = c.pttl(format!("{key}:fence")).await.unwrap();
        assert_eq!(ttl, -1, "the fence never expires");
        let _: () = c.del(format!("{key}:fence")).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn extend_of_mixed_live_and_gone_holds_in_one_call() {
        let b = backend().await;
        let m = meta("a");
        let (n1, n2, n3, n4) = (uniq("x1"), uniq("x2"), uniq("x3"), uniq("x4"));
        let live = rq(&n1, "live", &m);
        let dead = Request {
            lease: Duration::from_millis(100),
            ..rq(&n2, "dead", &m)
        };
        let reader = Request {
            kind: LockKind::RwLock,
            mode: Mode::Shared,
            ..rq(&n3, "reader", &m)
        };
        let permit = Request {
            kind: LockKind::Semaphore { permits: 2 },
            mode: Mode::Shared,
            ..rq(&n4, "permit", &m)
        };
        for r in [&live, &dead, &reader, &permit] {
            token(b.acquire(r).await.unwrap());
        }
        b.release(&hr(&permit)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let longer = Duration::from_secs(60);
        let holds: Vec<HoldRef<'_>> = [&live, &dead, &reader, &permit]
            .iter()
            .map(|r| HoldRef {
                lease: longer,
                ..hr(r)
            })
            .collect();
        let out = b.extend(&holds).await.unwrap();
        let held = Extended::Held { valid_for: longer };
        assert_eq!(out, [held.clone(), Extended::Gone, held, Extended::Gone]);
        let mut c = raw().await;
        let pttl: i64 = c.pttl(b.base_key(&n1)).await.unwrap();
        assert!(pttl > 59_000, "{pttl}");
        let pttl: i64 = c.pttl(b.base_key(&n3)).await.unwrap();
        assert!(pttl > 59_000, "{pttl}");
        for r in [&live, &reader] {
            assert_eq!(b.release(&hr(r)).await.unwrap(), Released::Released);
        }
        assert!(b.extend(&[]).await.unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn fair_waiters_are_granted_in_arrival_order_across_clients() {
        let (a, b) = (backend().await, backend().await);
        let n = uniq("fair");
        let (ma, mb) = (meta("a"), meta("b"));
        let h = rq(&n, "holder", &ma);
        token(a.acquire(&h).await.unwrap());
        let w1 = Request {
            fair: true,
            waiting: true,
            ..rq(&n, "w1", &mb)
        };
        let w2 = Request {
            fair: true,
            waiting: true,
            ..rq(&n, "w2", &ma)
        };
        busy(b.acquire(&w1).await.unwrap());
        busy(a.acquire(&w2).await.unwrap());
        let info = a.describe(n.as_str()).await.unwrap();
        let order: Vec<&str> = info[0].waiters.iter().map(|w| w.owner.as_str()).collect();
        assert_eq!(order, ["w1", "w2"]);
        assert_eq!(info[0].waiters[0].meta, mb);
        a.release(&hr(&h)).await.unwrap();
        // w2 is behind w1; a plain request does not barge past the queue
        busy(a.acquire(&w2).await.unwrap());
        let plain = rq(&n, "plain", &mb);
        busy(b.acquire(&plain).await.unwrap());
        token(b.acquire(&w1).await.unwrap());
        b.release(&hr(&w1)).await.unwrap();
        token(a.acquire(&w2).await.unwrap());
        // cancel removes a place
        let w3 = Request {
            fair: true,
            waiting: true,
            ..rq(&n, "w3", &mb)
        };
        busy(b.acquire(&w3).await.unwrap());
        b.cancel(&w3).await.unwrap();
        a.release(&hr(&w2)).await.unwrap();
        token(b.acquire(&plain).await.unwrap());
        b.release(&hr(&plain)).await.unwrap();
        let mut c = raw().await;
        let q: bool = c.exists(format!("{}:q", b.base_key(&n))).await.unwrap();
        assert!(!q, "an empty queue leaves no key");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rwlock_and_semaphore_rules() {
        let (a, b) = (backend().await, backend().await);
        let m = meta("a");
        let n = uniq("rw");
        let rd = |o: &'static str| Request {
            kind: LockKind::RwLock,
            mode: Mode::Shared,
            waiting: true,
            ..rq(&n, o, &m)
        };
        let (r1, r2) = (rd("r1"), rd("r2"));
        token(a.acquire(&r1).await.unwrap());
        token(b.acquire(&r2).await.unwrap());
        let w = Request {
            mode: Mode::Exclusive,
            ..rd("w")
        };
        busy(a.acquire(&w).await.unwrap());
        // a waiting writer blocks new readers, even when not fair
        busy(b.acquire(&rd("r3")).await.unwrap());
        // a mutex on an rwlock name is a configuration error
        let e = a.acquire(&rq(&n, "mx", &m)).await.unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        assert!(e.to_string().contains("held as rwlock"), "{e}");
        a.release(&hr(&r1)).await.unwrap();
        b.release(&hr(&r2)).await.unwrap();
        token(a.acquire(&w).await.unwrap());
        a.release(&hr(&w)).await.unwrap();

        let s = uniq("sem");
        let k = LockKind::Semaphore { permits: 2 };
        let p = |o: &'static str, lease| Request {
            kind: k,
            mode: Mode::Shared,
            lease,
            ..rq(&s, o, &m)
        };
        let dying = p("dying", Duration::from_millis(300));
        token(a.acquire(&dying).await.unwrap());
        token(b.acquire(&p("p2", LONG)).await.unwrap());
        let third = p("p3", LONG);
        let bz = busy(a.acquire(&third).await.unwrap());
        assert!(bz.retry_in.unwrap() <= Duration::from_millis(300));
        let e = a
            .acquire(&Request {
                kind: LockKind::Semaphore { permits: 3 },
                ..p("p4", LONG)
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("semaphore(2)"), "{e}");
        let e = a.acquire(&rq(&s, "mx", &m)).await.unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        // the dead holder's permit expires by itself
        tokio::time::sleep(Duration::from_millis(400)).await;
        token(a.acquire(&third).await.unwrap());
        let info = a.describe(s.as_str()).await.unwrap();
        assert_eq!(info[0].kind, k);
        let owners: Vec<&str> = info[0].holders.iter().map(|h| h.owner.as_str()).collect();
        assert_eq!(owners, ["p2", "p3"]);
        assert_eq!(a.release(&hr(&dying)).await.unwrap(), Released::NotHeld);
        assert_eq!(a.force_release(&s, Force::Break).await.unwrap().removed, 2);
        // an rwlock request on a mutex name
        let mx = uniq("mx");
        token(a.acquire(&rq(&mx, "m", &m)).await.unwrap());
        let e = b
            .acquire(&Request {
                kind: LockKind::RwLock,
                ..rq(&mx, "x", &m)
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("held as mutex"), "{e}");
        a.force_release(&mx, Force::Break).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn no_wakeup_is_lost_in_quick_hand_offs() {
        let (c1, c2) = (
            crate::connect(&url()).await.unwrap(),
            crate::connect(&url()).await.unwrap(),
        );
        let name = uniq("handoff").as_str().to_owned();
        let inside = Arc::new(AtomicUsize::new(0));
        let rounds = 60;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in [c1, c2] {
            let (name, inside) = (name.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                let mx = c.mutex(name).unwrap().lease(LONG);
                let mut slowest = Duration::ZERO;
                for _ in 0..rounds {
                    let t = Instant::now();
                    let g = mx.acquire_timeout(Duration::from_secs(20)).await.unwrap();
                    slowest = slowest.max(t.elapsed());
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
                slowest
            }));
        }
        for t in tasks {
            let slowest = t.await.unwrap();
            assert!(
                slowest < Duration::from_secs(2),
                "a waiter took {slowest:?}"
            );
        }
        let took = started.elapsed();
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_waiter_is_woken_by_a_release_on_another_connection() {
        let (a, b) = (backend().await, backend().await);
        let n = uniq("wake");
        let (ma, mb) = (meta("a"), meta("b"));
        for round in 0..5 {
            let (ho, wo) = (format!("h{round}"), format!("w{round}"));
            let h = rq(&n, &ho, &ma);
            token(a.acquire(&h).await.unwrap());
            let w = Request {
                waiting: true,
                ..rq(&n, &wo, &mb)
            };
            let mut bz = busy(b.acquire(&w).await.unwrap());
            if round == 0 {
                // the first wait of a name subscribes and returns at once
                let t = Instant::now();
                b.wait(&w, &bz, Instant::now() + Duration::from_secs(10))
                    .await
                    .unwrap();
                assert!(t.elapsed() < Duration::from_secs(1));
                bz = busy(b.acquire(&w).await.unwrap());
            }
            let released = Arc::new(StdMutex::new(None));
            let rel = {
                let released = released.clone();
                let a_ref = &a;
                let h = hr(&h);
                async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    *lock(&released) = Some(Instant::now());
                    a_ref.release(&h).await.unwrap();
                }
            };
            let waited = async {
                b.wait(&w, &bz, Instant::now() + Duration::from_secs(10))
                    .await
                    .unwrap();
                Instant::now()
            };
            let (woke, ()) = tokio::join!(waited, rel);
            let released_at = lock(&released).unwrap();
            let after = woke.saturating_duration_since(released_at);
            assert!(
                after < Duration::from_millis(200),
                "round {round}: {after:?}"
            );
            token(b.acquire(&w).await.unwrap());
            b.release(&hr(&w)).await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn describe_scans_with_glob_characters_in_the_prefix() {
        let b = backend().await;
        let m = meta("describer");
        let root = format!("g-{}/", uuid::Uuid::new_v4());
        let names: Vec<LockName> = ["a*b", "a?c", "axb", "a[x]", "a\\d"]
            .iter()
            .map(|s| LockName::new(format!("{root}{s}")).unwrap())
            .collect();
        let owners: Vec<String> = (0..names.len()).map(|i| format!("o{i}")).collect();
        for (n, o) in names.iter().zip(&owners) {
            token(b.acquire(&rq(n, o, &m)).await.unwrap());
        }
        let got = |p: String| {
            let b = &b;
            async move {
                b.describe(&p)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|i| i.name)
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(got(format!("{root}a*")).await, [format!("{root}a*b")]);
        assert_eq!(got(format!("{root}a?")).await, [format!("{root}a?c")]);
        assert_eq!(got(format!("{root}a[")).await, [format!("{root}a[x]")]);
        assert_eq!(got(format!("{root}a\\")).await, [format!("{root}a\\d")]);
        assert_eq!(got(format!("{root}a")).await.len(), 5);
        assert!(got(format!("{root}zzz")).await.is_empty());
        let info = b.describe(&format!("{root}axb")).await.unwrap();
        let h = &info[0].holders[0];
        assert_eq!(h.owner, "o2");
        assert_eq!(h.meta, m);
        assert_eq!(h.mode, Mode::Exclusive);
        assert!(h.token.is_some());
        assert!(h.acquired_at_ms > 1_600_000_000_000);
        assert!(h.lease_left_ms.unwrap() > 29_000);
        for n in &names {
            b.force_release(n, Force::Break).await.unwrap();
        }
        assert!(got(root).await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn hashtag_false_uses_names_verbatim() {
        let b = RedisBackend::connect(&format!(
            "{}?hashtag=false&prefix=dlt-{}:",
            url(),
            uuid::Uuid::new_v4()
        ))
        .await
        .unwrap();
        let n = LockName::new("jobs").unwrap();
        let key = b.base_key(&n);
        assert!(key.ends_with(":jobs") && !key.contains('{'), "{key}");
        let m = meta("a");
        let r = rq(&n, "o", &m);
        token(b.acquire(&r).await.unwrap());
        let mut c = raw().await;
        let v: String = c.get(&key).await.unwrap();
        assert_eq!(v, "o");
        let info = b.describe("").await.unwrap();
        assert_eq!(info.len(), 1, "{info:?}");
        assert_eq!(info[0].name, "jobs");
        b.force_release(&n, Force::Break).await.unwrap();
        let _: () = c.del(format!("{key}:fence")).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_foreign_key_is_not_a_lock() {
        let b = backend().await;
        let n = uniq("foreign");
        let mut c = raw().await;
        let key = b.base_key(&n);
        let _: () = c.rpush(&key, "x").await.unwrap();
        let m = meta("a");
        let e = b.acquire(&rq(&n, "o", &m)).await.unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        assert!(b.force_release(&n, Force::Break).await.is_err());
        let len: usize = c.llen(&key).await.unwrap();
        assert_eq!(len, 1);
        let _: () = c.del(&key).await.unwrap();
    }

    /// A private `redis-server` on a free loopback port, killed when dropped.
    struct Server {
        child: std::process::Child,
        port: u16,
    }

    impl Server {
        async fn start(extra: &[&str]) -> Server {
            let port = free_port();
            let child = std::process::Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .args(extra)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("redis-server must be installed");
            let deadline = Instant::now() + Duration::from_secs(10);
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                assert!(Instant::now() < deadline, "redis-server did not start");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Server { child, port }
        }

        fn signal(&self, sig: &str) {
            let ok = std::process::Command::new("kill")
                .args([sig, &self.child.id().to_string()])
                .status()
                .unwrap()
                .success();
            assert!(ok);
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn free_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn server_down_at_connect_is_unavailable_quickly() {
        let port = free_port();
        let t = Instant::now();
        let e = RedisBackend::connect(&format!("redis://127.0.0.1:{port}/?connect_timeout=1s"))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
        let e = crate::connect(&format!("redis://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_paused_server_gives_unavailable_not_a_hang() {
        let srv = Server::start(&[]).await;
        let b = RedisBackend::connect(&format!(
            "redis://127.0.0.1:{}/?timeout=300ms&connect_timeout=300ms",
            srv.port
        ))
        .await
        .unwrap();
        let n = uniq("paused");
        let m = meta("a");
        let r = rq(&n, "o", &m);
        token(b.acquire(&r).await.unwrap());
        srv.signal("-STOP");
        let t = Instant::now();
        let e = b.acquire(&r).await.unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        let e = b.extend(&[hr(&r)]).await.unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        let e = b.describe("").await.unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        let w = Request {
            waiting: true,
            ..rq(&n, "w", &m)
        };
        b.wait(
            &w,
            &Busy::default(),
            Instant::now() + Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        srv.signal("-CONT");
        // the connection recovers
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match b.acquire(&r).await {
                Ok(a) => {
                    token(a);
                    break;
                }
                Err(e) => {
                    assert!(Instant::now() < deadline, "no recovery: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn wrong_password_is_a_clear_error_without_the_password() {
        let srv = Server::start(&["--requirepass", "right-horse-battery"]).await;
        for url in [
            format!("redis://:wrong-staple-42@127.0.0.1:{}/", srv.port),
            format!("redis://default:wrong-staple-42@127.0.0.1:{}/", srv.port),
            format!("redis://127.0.0.1:{}/", srv.port),
        ] {
            let e = crate::connect(&url).await.unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::InvalidConfig(_)), "{url}: {e:?}");
            assert!(msg.contains("authentication failed"), "{msg}");
            assert!(!msg.contains("wrong-staple-42"), "{msg}");
            assert!(!format!("{e:?}").contains("wrong-staple-42"), "{e:?}");
        }
        let b = RedisBackend::connect(&format!(
            "redis://:right-horse-battery@127.0.0.1:{}/3",
            srv.port
        ))
        .await
        .unwrap();
        let n = uniq("auth");
        let m = meta("a");
        token(b.acquire(&rq(&n, "o", &m)).await.unwrap());
        assert!(!format!("{b:?}").contains("right-horse-battery"));
    }

    /// Through clients: the first grants of a name count from 1, and once every hold is
    /// released only the fence keys are left (what the conformance suite cannot see: the store's
    /// own keys).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_name_counts_from_one_and_leaves_only_its_fence() {
        let prefix = format!("e2e-{}:", uuid::Uuid::new_v4());
        let u = format!("{}?prefix={prefix}", url());
        let c1 = crate::connect(&u).await.unwrap();
        let c2 = crate::connect(&u).await.unwrap();
        assert_eq!(c1.backend_name(), "redis");
        let g = c1.mutex("e2e/job").unwrap().acquire().await.unwrap();
        assert_eq!(g.token(), Some(1));
        g.release().await.unwrap();
        let g = c2.mutex("e2e/job").unwrap().acquire().await.unwrap();
        assert_eq!(g.token(), Some(2));
        g.release().await.unwrap();
        let sem = c1.semaphore("e2e/sem", 2).unwrap();
        let (g1, g2) = (sem.acquire().await.unwrap(), sem.acquire().await.unwrap());
        g1.release().await.unwrap();
        g2.release().await.unwrap();
        assert!(c1.list("").await.unwrap().is_empty());
        let mut c = raw().await;
        let keys: Vec<String> = c.keys(format!("{prefix}*")).await.unwrap();
        let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                format!("{prefix}{{e2e/job}}:fence"),
                format!("{prefix}{{e2e/sem}}:fence")
            ],
            "only the fences stay"
        );
        let _: () = c.del(&keys).await.unwrap();
    }
}
