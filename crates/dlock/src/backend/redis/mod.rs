//! The Redis store, behind the cargo feature `redis`:
//!
//! | URL | deployment |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]`, `rediss://…` | one server (`rediss`: TLS with the system's root certificates) |
//! | `redis+sentinel://[user:pass@]s1:26379,s2,s3/MASTER[?db=N]` | the master that Sentinel calls `MASTER`, found again after every fail-over |
//! | `redis+cluster://[user:pass@]h1:p1,h2:p2,…` | a Redis Cluster (the seed nodes; the rest are discovered) |
//!
//! The user and password of a Sentinel URL are those of the Redis servers, and of the sentinels
//! too unless `sentinel_user` / `sentinel_password` say otherwise; every password is redacted in
//! messages and listings. TLS to Sentinel or Cluster deployments is not supported yet
//! (`rediss+sentinel://`, `rediss+cluster://` are [`Error::InvalidConfig`] saying so).
//!
//! # URL options
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `prefix` | `dlock:` | prepended to every key and channel; must not contain `{` or `}` |
//! | `hashtag` | `true` | wrap the lock name in `{…}` so every key of one name is in one cluster slot; `false` uses `prefix + name` verbatim (for interop with hand-written locks on exact key names; not on a cluster) |
//! | `connect_timeout` | `3s` | how long connecting (TCP, TLS, AUTH, SELECT; asking the sentinels) may take |
//! | `timeout` | `2s` | how long one command or pipeline may take |
//! | `replicas` | `0` | `N` > 0: every grant and renewal must be confirmed by `N` replicas (`WAIT`, below) |
//! | `replicas_timeout` | `500ms` | how long `WAIT` waits for them; less than `timeout` |
//! | `db` | `0` | Sentinel URLs: the database number (a direct URL has it in its path) |
//! | `sentinel_user`, `sentinel_password` | the URL's | Sentinel URLs: the sentinels' credentials |
//!
//! Durations are `500ms`, `2s`, `1m` or a bare number of seconds. Any other option is
//! [`Error::InvalidConfig`].
//!
//! # Fail-over: Sentinel, Cluster and `replicas=N`
//!
//! - **Sentinel.** Commands go over one multiplexed connection to the master the first sentinel
//!   that answers names (`SENTINEL get-master-addr-by-name`, checked with `ROLE`). The sentinels
//!   are asked again every second (a deposed master that is back answers as a master until it is
//!   demoted, so a failing command alone would not tell) and after an I/O error, a dropped
//!   connection, `READONLY` or `MASTERDOWN`; a command refused by a deposed master or cut by its death is
//!   sent once more to the new one (every script is safe to repeat), a timed-out one is not. The
//!   pub/sub connection is made again on the new master.
//! - **Cluster.** redis-rs's cluster client routes each script to the master of the name's slot
//!   and follows `MOVED`/`ASK` and fail-overs. Wake-ups use sharded pub/sub (`SPUBLISH` in the
//!   scripts, `SSUBSCRIBE` over RESP3): a release message goes to the shard of the lock only. A
//!   subscription the server drops (its slot moved) is made again on the slot's new node; after
//!   a node connection drops, every waiter attempts again (messages in between are lost).
//!   `describe` scans every master.
//! - **`replicas=N`.** The grant or renewal script and `WAIT N replicas_timeout` go in one
//!   pipeline on the same connection (one round trip; on a cluster the pipeline goes to the
//!   name's master). A grant that fewer than `N` replicas confirmed is released again (quietly,
//!   without a wake-up) and the acquisition fails with [`Error::Unavailable`] saying how many
//!   confirmed; if that release fails too, the hold ends with its lease. A renewal that fewer
//!   confirmed is an error, not a renewal: the watchdog tries again, and `lost()` fires when the
//!   last confirmed renewal's lease runs out. The fencing counter is written by the grant script,
//!   so a confirmed grant's token is confirmed with it.
//!
//! What `WAIT` buys, in Redis's words, is "real world data safety", not consistency: replication
//! stays asynchronous, and a fail-over is a best-effort choice of the best replica. A grant
//! confirmed by `N` replicas survives a fail-over **if one of those replicas is promoted** (Sentinel
//! and Cluster promote the replica with the most recent replication offset, so with healthy
//! replicas that is the usual case); then the hold, its renewals and the fence counter are all
//! on the new master, nobody else is granted the lock, and the next token is higher. It does
//! not survive when the promoted replica had not received it (every replica that confirmed it
//! died or was cut off with the master, a replica was promoted by hand, or the write reached the
//! replica after it was promoted), nor a restart of a master without persistence that still
//! counts as master. Then the new master has no hold: the holder's next renewal answers that the
//! hold is gone and `lost()` fires; another client can be granted it before that, and **the
//! fence counter can go back** to the promoted replica's value, so a resource that checks
//! tokens may see an old value again. Without `replicas`, any grant acknowledged before it
//! reached a replica is exposed to that on every fail-over. docs/RELIABILITY.md has the counts
//! of both from the fault harness.
//!
//! # Key layout
//!
//! `base` is `prefix + "{" + name + "}"` (or `prefix + name` with `hashtag=false`); the lock
//! name `jobs` with the default prefix has the base `dlock:{jobs}`. Redis hashes the text
//! between the first `{` and the next `}`, so every key of a name is in one cluster slot; a name
//! that begins with `}` would leave that tag empty, so its base is `prefix + "{\0" + name + "}"`
//! (its tag is the NUL, which no lock name holds).
//!
//! | key / channel | type | contents | expires |
//! |---|---|---|---|
//! | `base` (mutex) | string | the hold: `owner \n token \n flag \n acquired_at \n client_id \n host \n pid \n` then `0`, or `1` and the hold's value; flag `-`, `r` (revoked) or `d` (detached) | with the hold (`PX` lease) |
//! | `base` (rwlock, semaphore) | hash | `kind` (`rwlock`/`semaphore`), `permits`, and per holder `h:<owner>` = `<mode> <token>` | with the latest holder |
//! | `base:exp` | zset | holder owner → expiry (ms, Redis `TIME`) of rwlock/semaphore holders | with the latest holder |
//! | `base:meta:<owner>` | hash | a rwlock or semaphore hold's `client_id`, `host`, `pid`, `acquired_at` (ms), `token`, `mode`, and `value` for a hold that has one (replaced by `set_value`); for a foreign `SET NX PX` lock only `revoked` (see `force_release`) | with that hold |
//! | `base:fence` | string | the fencing counter (`INCR`ed by every grant) | **never** |
//! | `base:q` | zset | waiter owner → arrival sequence | with the last waiter |
//! | `base:qexp` | zset | waiter owner → expiry of its place (ms) | with the last waiter |
//! | `base:qinfo` | hash | waiter owner → `mode \n client_id \n host \n pid` | with the last waiter |
//! | `base:qseq` | string | the arrival counter of the queue | with the last waiter |
//! | `base:w` | zset | the waiter set: a record per waiting request (below), scored by the holder's fence token when it arrived (the fence counter since that grant) | 60 s after the last registration, or with its last record |
//! | `base:obs` | string | `1`: a client observes the name (an election's follower that does not campaign) | 30 s after its observer last kept it (every 10 s while it observes) |
//! | `base:released` | channel | published on a release that did not hand the lock on (only if `base:w`, `base:q` or `base:obs` exists: see below), on the cancel of a queue place and on force-release: what may let a waiter in (it reaches only the clients that subscribed it) | — |
//! | `base:changed` | channel | published on a hand-off while `base:obs` exists, and on a hold's new value: what only an observer needs | — |
//! | `base:handoff:<client key>` | channel | "owner token": the lock was handed to that waiting owner of the client (a random key per backend) | — |
//!
//! A waiting mutex request (not fair) registers in `base:w` when it finds the name taken, with
//! the record `owner \n lease ms \n client key \n client_id \n host \n pid \n` followed by
//! `0`, or `1` and the hold's value. Waiting readers, writers and permits register their owner
//! token only (they are woken, never handed a hold).
//!
//! Every kind of lock uses the **same** `base` key, so a mutex and a rwlock or semaphore of one
//! name collide: requesting a name held as another kind (or a semaphore with another number of
//! permits) is [`Error::InvalidConfig`] ("held as …"), as in the other stores. A `base` key of any
//! other Redis type (or a hash without `kind`, such as Redisson's) is not a dlock lock: acquiring
//! it is [`Error::InvalidConfig`] and it is never modified.
//!
//! A mutex hold is one string key: its holder's metadata is in the same write as the hold, and
//! lives and dies with it (one `SET PX` grants, one `DEL` releases, one `PEXPIRE` renews).
//!
//! ## Interop with `SET key token NX PX` locks
//!
//! A mutex hold has the shape of redis-py's `Lock`, node-redlock and hand-written locks: one
//! string key with a `PX` expiry, taken only while the key is absent (`SET NX PX` semantics),
//! released and extended by compare-and-delete / compare-and-pexpire. So a redis-py
//! `r.lock("dlock:{jobs}")` and a dlock `Mutex` named `jobs` exclude each other (with
//! `hashtag=false`, `Lock(r, "dlock:jobs")`). dlock's value is its owner token followed by a
//! newline and the metadata; any other value is a foreign holder, shown in `describe` with the
//! value as its owner and no metadata, never released or extended by dlock; its grants do not
//! advance the fencing counter.
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
//! [`QUEUE_PLACE_TTL`]. A mutex request that takes no queue place runs the smaller `grab`
//! script first (`GET`, then `SET PX` of a free name: a grant, or the holder's time left and
//! the request's registration in `base:w`; anything else falls through to `acquire`). A release
//! that does not hand the lock on (where anyone may listen), `cancel` and `force_release`
//! `PUBLISH` on `base:released`; a hand-off (where an observer may listen) and `set_value` on
//! `base:changed`. Expiry is the server's (`PX`, and `TIME` for the expiries of
//! rwlock and semaphore holders), so only Redis's clock matters for it; a mutex's `acquired_at`
//! is the granting client's wall clock (the releasing client's, for a hand-off), shown by
//! `describe` only.
//!
//! # Hand-offs: one wake per release
//!
//! The release of a mutex whose name has no fair queue pops the first record of `base:w`
//! (lowest arrival score) and, in the same script, grants the lock to that waiter: `SET base
//! <hold> PX lease` (a new fence token, the waiter's metadata), then `PUBLISH
//! base:handoff:<client key> "owner token"`. `PUBLISH` answers how many connections received it; 0 means the waiter's
//! client is gone (its pub/sub connection closed), so the grant is undone and the next record
//! is tried. A release with no live record deletes the key and announces it on `base:released`
//! (subscribed only by clients with waiters or observers of the name) if anyone may listen: a
//! waiter registered or queued, or an observer's `base:obs` mark. A release that nobody waits
//! for or observes sends no message (its script runs `GET`, one `EXISTS` of those three keys and
//! `DEL`). An observer makes its mark when it subscribes, before it looks at the name, so no
//! release after its look goes unannounced; it keeps the mark while it observes, and if it ever
//! finds the mark gone (a pause of 30 s), it looks again. The waiter's backend
//! gives the message to the waiting acquisition of that owner, which takes the hold without
//! another round trip: its lease is counted from the send of its last busy attempt (the
//! hand-off happened after that attempt ran: the token is above the fence counter that attempt
//! saw), and after half a lease of waiting it asks the store again instead (a regrant, which
//! renews the lease from then). A hand-off message that was lost (a dropped pub/sub connection,
//! after which every waiter attempts again) is found by the next attempt, which regrants the
//! hold that is already the owner's. A waiter that gives up removes its record; if it was
//! handed the lock meanwhile, its cancel releases it and hands it on. Nobody can take a handed
//! lock, so waiters are served in arrival order and a release wakes exactly one of them.
//! An uncontended acquire and release run seven commands on the server (`GET`, `EXISTS` of the
//! fair queue, `INCR` of the fence, `SET PX`; `GET`, `EXISTS`, `DEL`); a contended acquisition
//! runs its busy attempt (`GET`, `PTTL`, the registration's `ZADD` and `PEXPIRE`, its arrival
//! score the holder's fence token, read from the value) and its share of the hand-off (`GET`,
//! `EXISTS`, `ZPOPMIN`, `INCR`, `SET PX`, `PUBLISH`).
//!
//! A waiter subscribes `base:released` and its client's hand-off channel only, so it is woken
//! by its own hand-off and by what may let it in, never by another waiter's hand-off; an
//! election's observer also subscribes `base:changed`.
//!
//! What breaks it: a waiter whose process stops (SIGSTOP) or whose host dies without closing
//! its connection still counts as listening; the lock handed to it is held by nobody until its
//! lease runs out, as a lock held by a paused holder is. **Versions before this layout** (a
//! mutex's metadata in a `base:meta:<owner>` hash, a plain owner token as the value) must not
//! share a server's names with this one: they still exclude each other (both take the key only
//! while it is absent), but each reads the other's holds as a foreign lock's (no release or
//! renewal of them, no hand-off to the other's waiters, which then attempt again when the
//! holder's lease would end, at most every 5 s). Upgrade every client of a prefix together, or
//! give the new version another `prefix`. Hand-offs
//! are off with `replicas=N` (the release that would write the grant is not followed by `WAIT`).
//! On Redlock's servers only a name's lead server registers its waiters and hands it on; the
//! others announce every release on `base:released` (see `backend::redlock`).
//!
//! # Connections and wake-ups
//!
//! One multiplexed connection per backend carries every command (it reconnects by itself after
//! an I/O error; Sentinel and Cluster: above), plus one pub/sub connection serving all names. The
//! pub/sub connection speaks RESP3 and its messages are handled on the connection's own task as
//! they are read (a hand-off reaches its waiter without passing through another task); a server
//! that answers `HELLO 3` with an error (before Redis 6) gets a RESP2 pub/sub connection, whose
//! messages a task of their own reads. A waiter subscribes the name's
//! channel and its client's hand-off channel of the name before its next attempt (the first wait of a name subscribes and returns at once), and
//! a per-name message counter read before each attempt is compared when it waits, so a release between
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
//! - **A Redis restart without persistence, or a fail-over to a replica that missed the write,
//!   loses both the lock and the fence counter**: another client may be granted the lock while the
//!   old holder still trusts it, and fencing tokens can go backwards. Configure AOF with
//!   `appendfsync always` for a single server; with replicas, use `replicas=N` (above), which
//!   narrows the window to a fail-over that promotes a replica without the write.
//! - Deleting or rewriting dlock's keys by hand (`FLUSHDB`, eviction under `maxmemory` with an
//!   `allkeys-*` policy — use `noeviction` or `volatile-*` with care).
//! - With `hashtag=false`, a lock name ending in one of the suffixes above (`:fence`, `:q`, …)
//!   overlaps the keys of another name; `describe` skips such keys.

mod conn;
mod describe;
mod keys;
mod pubsub;
mod scripts;
mod url;
pub(crate) use url::RedisTarget;

use conn::Conn;
use url::Deployment;

use keys::check_verbatim_name;
use keys::{CHANGED, HANDOFF, OBSERVED, RELEASED};
use pubsub::{Link, Subs};
use scripts::{array, int, text, unexpected, Call, Scripts};

use super::*;
use crate::error::Error;
use crate::signal::NameSignals;
use ::redis::{ErrorKind, RedisError, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};

/// How long a name's waiter set lives without a waiter registering again (waiters register at
/// least every few seconds while they wait: each attempt does).
const WAITER_SET_TTL: Duration = Duration::from_secs(60);

struct Shared {
    conn: Conn,
    /// The client of a direct deployment's pub/sub connection.
    client: Option<::redis::Client>,
    /// A cluster: release messages go over sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`).
    sharded: bool,
    target: RedisTarget,
    scripts: Scripts,
    link: tokio::sync::Mutex<Option<Link>>,
    next_link_try: StdMutex<Option<Instant>>,
    generation: std::sync::atomic::AtomicU64,
    /// The server answered `HELLO 3` with an error: pub/sub links are RESP2 connections.
    resp2: std::sync::atomic::AtomicBool,
    subs: StdMutex<Subs>,
    /// Fans the pub/sub messages out to the waiters of their names.
    signals: NameSignals,
    /// Releases hand a mutex to its first registered waiter (see [`RedisTarget::handoffs`]).
    handoffs: bool,
    /// Names this backend's hand-off channels (a random hex id).
    client_key: String,
    /// The waiting mutex acquisitions of this backend that registered for hand-offs, by owner
    /// token: where the pub/sub side leaves what it was handed.
    slots: StdMutex<HashMap<String, Weak<Handoff>>>,
}

/// What a waiting mutex acquisition was handed: the highest fence token of a hand-off to it.
#[derive(Debug, Default)]
struct Handoff {
    token: StdMutex<Option<u64>>,
}

/// A waiting mutex acquisition's registration for hand-offs.
struct Registration {
    /// Its record in the name's waiter set (see grab.lua): a mutex's once an attempt
    /// registered it (until then each attempt writes it into its call), the owner for other
    /// kinds.
    record: Option<String>,
    slot: Arc<Handoff>,
    /// When the latest attempt that answered busy (and registered) was sent, and the fence
    /// counter it saw: a hand-off with a higher token happened after that send, so its lease
    /// is counted from it.
    since: Option<(Instant, u64)>,
    /// Whether an attempt registered it (its record may be in the waiter set).
    registered: bool,
    /// Whether a grab that registers it when busy went out and its answer was not read (the
    /// call failed, or its future was dropped): its record may be in the waiter set too.
    asked: bool,
    /// Whether its next busy attempt may register it (the core's [`Acquisition::may_register`]).
    allowed: bool,
}

/// The parts of a waiting mutex request's record in the waiter set (see grab.lua):
/// `owner \n lease ms \n client key \n client_id \n host \n pid \n ('0' | '1' value)`.
fn record_parts<'a>(
    req: &'a Request<'_>,
    client_key: &'a str,
    lease: &'a str,
    pid: &'a str,
) -> [&'a str; 14] {
    let [a, b, c, d, e, f, g, h] = holder_parts(req, pid);
    [
        req.owner, "\n", lease, "\n", client_key, "\n", a, b, c, d, e, f, g, h,
    ]
}

/// A waiting mutex request's record in the waiter set, as one string (see [`record_parts`]).
fn waiter_record(req: &Request<'_>, client_key: &str) -> String {
    let (lease, pid) = (ms(req.lease).to_string(), req.meta.pid.to_string());
    record_parts(req, client_key, &lease, &pid).concat()
}

/// What the scripts store of a hold's holder after its owner (and a grant's time):
/// `client_id \n host \n pid \n ('0' | '1' value)`.
fn holder_parts<'a>(req: &'a Request<'_>, pid: &'a str) -> [&'a str; 8] {
    let [c, n1, h, n2, p] = holder_id_parts(req, pid);
    let [v0, v1] = value_parts(req);
    [c, n1, h, n2, p, "\n", v0, v1]
}

/// Who holds, as the scripts store it: `client_id \n host \n pid`.
fn holder_id_parts<'a>(req: &'a Request<'_>, pid: &'a str) -> [&'a str; 5] {
    [&req.meta.client_id, "\n", &req.meta.host, "\n", pid]
}

/// A hold's value as the scripts store it: `'0'` for none, `'1'` and the value.
fn value_parts<'a>(req: &'a Request<'_>) -> [&'a str; 2] {
    match &req.meta.value {
        Some(v) => ["1", v],
        None => ["0", ""],
    }
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

impl Shared {
    /// The error of a subscription that did not finish within the command timeout.
    fn timed_out(&self, what: &str) -> Error {
        Error::Unavailable(format!(
            "redis at {} did not answer {what} within {:?}",
            self.target.shown, self.target.timeout
        ))
    }

    fn err(&self, e: RedisError) -> Error {
        map_err(&self.target, e)
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
        // `maxclients` reached: the server turns connections away until others close.
        || e.to_string().contains("max number of clients reached")
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
        let (mut conn, client) = Conn::open(&target).await?;
        let sharded = matches!(target.deployment, Deployment::Cluster { .. });
        let scripts = Scripts::new(sharded);
        // Proves the connection is authenticated and loads every script: one pipeline to one
        // server; on a cluster, `SCRIPT LOAD` goes to every master by itself.
        let load = async {
            if sharded {
                for s in scripts.all() {
                    ::redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(s.code.as_str())
                        .query_async::<Value>(&mut conn)
                        .await?;
                }
                Ok(())
            } else {
                let mut pipe = ::redis::pipe();
                pipe.cmd("PING");
                for s in scripts.all() {
                    pipe.cmd("SCRIPT").arg("LOAD").arg(s.code.as_str());
                }
                pipe.query_async::<Vec<Value>>(&mut conn).await.map(drop)
            }
        };
        match tokio::time::timeout(target.connect_timeout, load).await {
            Ok(Ok(())) => {}
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
                sharded,
                scripts,
                link: tokio::sync::Mutex::new(None),
                next_link_try: StdMutex::new(None),
                generation: std::sync::atomic::AtomicU64::new(0),
                resp2: std::sync::atomic::AtomicBool::new(false),
                subs: StdMutex::new(Subs::default()),
                signals: NameSignals::default(),
                handoffs: target.handoffs && target.replicas == 0,
                client_key: format!("{:016x}", rand::random::<u64>()),
                slots: StdMutex::new(HashMap::new()),
                target,
            }),
        })
    }

    /// The base key of lock `name` (see the key layout in the module docs), e.g. `dlock:{jobs}`.
    pub fn base_key(&self, name: &LockName) -> String {
        self.shared.base(name.as_str())
    }

    // ---- hooks for stores built of several Redis servers (Redlock) ----

    /// The release script for `owner`'s hold of `name`; `loud`: handed on to the first
    /// registered waiter where `hand_on`, else announced on the name's channel (a quiet release
    /// wakes nobody).
    async fn run_release(
        &self,
        name: &str,
        owner: &str,
        loud: bool,
        hand_on: bool,
    ) -> Result<Value> {
        let sh = &self.shared;
        let call = {
            let base = sh.base(name);
            // The release channel and the hand-off prefix, or '' for none.
            let on =
                |yes: bool, suffix: &'static str| if yes { [&*base, suffix] } else { ["", ""] };
            Call::new(&sh.scripts.release, 7)
                .suffixed(&base, &["", ":exp"])
                .joined([&base, ":meta:", owner])
                .suffixed(&base, &[":fence", ":w", ":q", OBSERVED])
                .arg(owner)
                .joined(on(loud, RELEASED))
                .joined(on(loud && hand_on, HANDOFF))
                .joined([&base, CHANGED])
                .arg(crate::clock::unix_ms())
        };
        sh.run(call).await
    }

    /// Compare-and-delete of a mutex hold **without** publishing a wake-up: Redlock's clean-up
    /// of a grant that did not reach a majority (waking waiters for it would make contenders
    /// take turns in a loop while a real holder keeps the lock).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) async fn release_quiet(&self, name: &LockName, owner: &str) -> Result<Released> {
        let v = self.run_release(name.as_str(), owner, false, false).await?;
        match int(&v) {
            Some(1) => Ok(Released::Released),
            Some(0) => Ok(Released::NotHeld),
            _ => Err(unexpected("release answer", &v)),
        }
    }

    /// The release of `hold`, handing a mutex on to the name's first registered waiter only
    /// where `hand_on` (Redlock: on the name's lead server, the only one where waiters
    /// register); elsewhere every release is announced on the name's channel.
    pub(crate) async fn release_with(&self, hold: &HoldRef<'_>, hand_on: bool) -> Result<Released> {
        let v = self
            .run_release(hold.name.as_str(), hold.owner, true, hand_on)
            .await?;
        match int(&v) {
            Some(2) => Ok(Released::HandedOff),
            Some(1) => Ok(Released::Released),
            Some(0) => Ok(Released::NotHeld),
            _ => Err(unexpected("release answer", &v)),
        }
    }

    /// One attempt of `req` (the grant script), without registering for hand-offs (Redlock's).
    #[cfg(any(feature = "redlock", test))]
    pub(crate) async fn attempt(&self, req: &Request<'_>) -> Result<Attempt> {
        self.attempt_with(req, None).await
    }

    /// One attempt of `req`. A waiting request with a registration (`reg`) registers in the
    /// name's waiter set when it is busy, and the attempt notes when it was sent.
    async fn attempt_with(
        &self,
        req: &Request<'_>,
        mut reg: Option<&mut Registration>,
    ) -> Result<Attempt> {
        let sh = &self.shared;
        let name = req.name.as_str();
        check_verbatim_name(&sh.target, name)?;
        let base = sh.base(name);
        let register = req.waiting && sh.handoffs && reg.as_ref().is_some_and(|r| r.allowed);
        if req.kind == LockKind::Mutex && !req.takes_queue_place() {
            let registered = reg.as_deref().is_some_and(|r| r.registered);
            let call = {
                let (lease, pid) = (ms(req.lease).to_string(), req.meta.pid.to_string());
                let parts = record_parts(req, &sh.client_key, &lease, &pid);
                // The record goes along only where the script may use it.
                let record: &[&str] = match reg.as_deref() {
                    Some(r) if register || r.registered => match &r.record {
                        Some(known) => &[known.as_str()],
                        None => &parts,
                    },
                    _ => &[],
                };
                Call::new(&sh.scripts.grab, 4)
                    .suffixed(&base, &["", ":fence", ":q", ":w"])
                    .arg(req.owner)
                    .arg(&lease)
                    .joined(
                        [&*crate::clock::unix_ms().to_string(), "\n"]
                            .into_iter()
                            .chain(holder_parts(req, &pid)),
                    )
                    .arg(if register { "1" } else { "0" })
                    .joined(record)
                    .arg(ms(WAITER_SET_TTL))
                    .arg(if registered { "1" } else { "0" })
            };
            let sent = Instant::now();
            if let Some(r) = reg.as_deref_mut().filter(|_| register) {
                r.asked = true;
            }
            let (v, confirmed) = sh.write(call).await?;
            if let Some(r) = reg.as_deref_mut() {
                r.asked = false;
            }
            let a = array(&v).ok_or_else(|| unexpected("grab answer", &v))?;
            match a.first().and_then(int) {
                Some(1) => {
                    if let Some(r) = reg {
                        r.registered = false;
                        r.since = None;
                    }
                    return self.granted(req, a, &v, confirmed).await;
                }
                Some(0) => {
                    let left = a.get(1).and_then(int).unwrap_or(-1);
                    if register {
                        if let Some(r) = reg {
                            let fence = a.get(2).and_then(int).unwrap_or(0);
                            r.registered = true;
                            r.record
                                .get_or_insert_with(|| waiter_record(req, &sh.client_key));
                            r.since = Some((sent, u64::try_from(fence).unwrap_or(0)));
                        }
                    }
                    return Ok(Attempt::Busy(Busy {
                        retry_in: u64::try_from(left).ok().map(Duration::from_millis),
                    }));
                }
                // The full rule below.
                Some(2) => {}
                _ => return Err(unexpected("grab answer", &v)),
            }
        }
        let (kind, permits) = kind_args(req.kind);
        // Readers and permits register by owner (a release wakes them all; only a mutex is
        // handed on).
        let register_owner = register && req.kind != LockKind::Mutex;
        let pid = req.meta.pid.to_string();
        let call = Call::new(&sh.scripts.acquire, 9)
            .suffixed(
                &base,
                &["", ":fence", ":exp", ":q", ":qexp", ":qinfo", ":qseq"],
            )
            .joined([&base, ":meta:", req.owner])
            .suffixed(&base, &[":w"])
            .arg(req.owner)
            .arg(kind)
            .arg(permits)
            .arg(req.mode.as_str())
            .arg(ms(req.lease))
            .arg(if req.takes_queue_place() { "1" } else { "0" })
            .arg(ms(QUEUE_PLACE_TTL))
            .arg(&req.meta.client_id)
            .arg(&req.meta.host)
            .arg(&pid)
            .joined(
                [req.mode.as_str(), "\n"]
                    .into_iter()
                    .chain(holder_id_parts(req, &pid)),
            )
            .joined(value_parts(req))
            .arg(if register_owner { "1" } else { "0" })
            .arg(ms(WAITER_SET_TTL));
        let (v, confirmed) = sh.write(call).await?;
        let a = array(&v).ok_or_else(|| unexpected("acquire answer", &v))?;
        let status = a.first().and_then(int);
        match status {
            Some(1) => {
                if let Some(r) = reg {
                    r.registered = false;
                    r.since = None;
                }
                self.granted(req, a, &v, confirmed).await
            }
            Some(0) => {
                if let Some(r) = reg.filter(|_| register_owner) {
                    r.registered = true;
                }
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

    /// A grant's answer `{1, token}` (`v`, as the array `a`), rolled back if too few replicas
    /// confirmed it.
    async fn granted(
        &self,
        req: &Request<'_>,
        a: &[Value],
        v: &Value,
        confirmed: Option<u32>,
    ) -> Result<Attempt> {
        let token = a
            .get(1)
            .and_then(int)
            .ok_or_else(|| unexpected("token", v))?;
        if let Some(n) = confirmed.filter(|n| *n < self.shared.target.replicas) {
            // Boxed: a rare path that would otherwise size every attempt's future.
            return Err(Box::pin(self.roll_back(req, n)).await);
        }
        Ok(Attempt::Granted(Grant {
            token: u64::try_from(token).ok().filter(|t| *t > 0),
            valid_for: req.lease,
        }))
    }

    /// Takes back a grant that too few replicas confirmed (`confirmed` of `replicas`), without a
    /// wake-up; the error the caller reports.
    async fn roll_back(&self, req: &Request<'_>, confirmed: u32) -> Error {
        let sh = &self.shared;
        let t = &sh.target;
        let what = format!(
            "redis at {}: the grant of {:?} was confirmed by {confirmed} of the {} replicas \
             asked for within {:?} (WAIT)",
            t.shown,
            req.name.as_str(),
            t.replicas,
            t.replicas_timeout
        );
        match self.release_quiet(req.name, req.owner).await {
            Ok(_) => Error::Unavailable(format!("{what}; it was rolled back")),
            Err(e) => Error::Unavailable(format!(
                "{what}; rolling it back failed ({e}), so it ends with its lease"
            )),
        }
    }

    /// Removes `req`'s queue place and waiter record (`record`, if it registered one); a lock
    /// that was handed to it meanwhile is released and handed on.
    pub(crate) async fn cancel_place(&self, req: &Request<'_>, record: Option<&str>) -> Result<()> {
        let sh = &self.shared;
        let base = sh.base(req.name.as_str());
        let call = Call::new(&sh.scripts.cancel, 7)
            .suffixed(
                &base,
                &[":q", ":qexp", ":qinfo", ":qseq", ":w", "", ":fence"],
            )
            .arg(req.owner)
            .joined([&base, RELEASED])
            .arg(record.unwrap_or_default())
            .joined([&base, HANDOFF])
            .joined([&base, CHANGED])
            .arg(crate::clock::unix_ms());
        sh.run(call).await?;
        Ok(())
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
        let (out, confirmed) = sh.eval_confirmed(&sh.scripts.extend, &calls).await?;
        if let Some(n) = confirmed.filter(|n| *n < sh.target.replicas) {
            // Not renewed as far as dlock is concerned: the lease counts from the last renewal
            // that was confirmed, and the watchdog tries again.
            return Err(Error::Unavailable(format!(
                "redis at {}: the renewal was confirmed by {n} of the {} replicas asked for \
                 within {:?} (WAIT)",
                sh.target.shown, sh.target.replicas, sh.target.replicas_timeout
            )));
        }
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
            values: true,
            hands_off: self.shared.handoffs,
            ..Capabilities::lease(Wakeups::Native)
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        let sh = &self.shared;
        let reg = (req.waiting && sh.handoffs).then(|| {
            let slot = Arc::new(Handoff::default());
            let record = if req.kind == LockKind::Mutex && !req.takes_queue_place() {
                lock(&sh.slots).insert(req.owner.to_owned(), Arc::downgrade(&slot));
                None
            } else {
                Some(req.owner.to_owned())
            };
            Registration {
                record,
                slot,
                since: None,
                registered: false,
                asked: false,
                allowed: true,
            }
        });
        Box::new(RedisAcquisition {
            store: self.clone(),
            want: Want::new(req),
            seen: None,
            reg,
            attempted: false,
        })
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.shared.target.timeout)
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        self.release_with(hold, self.shared.handoffs).await
    }

    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        self.extend_holds(holds, detach).await
    }

    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        let sh = &self.shared;
        let base = sh.base(hold.name.as_str());
        let call = Call::new(&sh.scripts.set_value, 3)
            .suffixed(&base, &["", ":exp"])
            .joined([&base, ":meta:", hold.owner])
            .arg(hold.owner)
            .arg(value)
            .joined([&base, CHANGED]);
        // A write like a renewal: with `replicas=N` it must be confirmed.
        let (v, confirmed) = sh.write(call).await?;
        let set = match int(&v) {
            Some(1) => Released::Released,
            Some(0) => Released::NotHeld,
            _ => return Err(unexpected("set_value answer", &v)),
        };
        if let Some(n) = confirmed.filter(|n| set == Released::Released && *n < sh.target.replicas)
        {
            return Err(Error::Unavailable(format!(
                "redis at {}: the new value of {:?} was confirmed by {n} of the {} replicas asked \
                 for within {:?} (WAIT)",
                sh.target.shown,
                hold.name.as_str(),
                sh.target.replicas,
                sh.target.replicas_timeout
            )));
        }
        Ok(set)
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.describe_all(prefix).await
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let sh = &self.shared;
        check_verbatim_name(&sh.target, name.as_str())?;
        let base = sh.base(name.as_str());
        let mode = match how {
            Force::Revoke => "revoke",
            Force::Break => "break",
        };
        let call = Call::new(&sh.scripts.force_release, 6)
            .suffixed(&base, &["", ":exp", ":q", ":qexp", ":qinfo", ":qseq"])
            .joined([&base, RELEASED])
            .joined([&base, ":meta:"])
            .arg(mode);
        let v = sh.run(call).await?;
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

/// One acquisition on one Redis server: what it saw of the name's channel before its last
/// attempt, and its registration for hand-offs.
struct RedisAcquisition {
    store: RedisBackend,
    want: Want,
    seen: Seen,
    reg: Option<Registration>,
    /// It attempted: a waiter. Until then it watches as an observer (an election's follower),
    /// woken by every change of the name.
    attempted: bool,
}

impl RedisAcquisition {
    /// A hand-off to this acquisition that happened after its latest busy attempt was sent,
    /// with the part of its lease that is left, if any is worth taking without a round trip.
    fn handed(&mut self) -> Option<Grant> {
        let reg = self.reg.as_mut()?;
        let token = lock(&reg.slot.token).take()?;
        Grant::handed(token, &mut reg.since, &mut reg.registered, self.want.lease)
    }
}

impl Drop for RedisAcquisition {
    fn drop(&mut self) {
        if self.reg.is_some() {
            lock(&self.store.shared.slots).remove(&self.want.owner);
        }
    }
}

#[async_trait::async_trait]
impl Acquisition for RedisAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        if let Some(g) = self.handed() {
            return Ok(Attempt::Granted(g));
        }
        self.attempted = true;
        if self.want.waiting {
            // Read before the attempt: `changed` compares it with the count then.
            self.mark();
        }
        self.store
            .attempt_with(&self.want.req(), self.reg.as_mut())
            .await
    }

    fn mark(&mut self) -> bool {
        let name = self.want.name.as_str();
        self.seen = if self.attempted {
            self.store.seen(name)
        } else {
            self.store.seen_as_observer(name)
        };
        true
    }

    fn may_register(&mut self, on: bool) {
        if let Some(r) = self.reg.as_mut() {
            r.allowed = on;
        }
    }

    async fn changed(&mut self, _busy: &Busy, until: Instant) -> Result<Watch> {
        self.store
            .changed_since_as(self.want.name.as_str(), self.seen, until, !self.attempted)
            .await
    }

    async fn cancel(&mut self) -> Result<()> {
        let record = self
            .reg
            .as_ref()
            .filter(|r| r.registered || r.asked || lock(&r.slot.token).is_some())
            .map(|r| {
                r.record.clone().unwrap_or_else(|| {
                    waiter_record(&self.want.req(), &self.store.shared.client_key)
                })
            });
        self.store
            .cancel_place(&self.want.req(), record.as_deref())
            .await
    }
}

impl Shared {
    /// A hand-off message ("owner token"): given to the waiting acquisition of that owner.
    /// False if none of this backend's acquisitions waits under that owner.
    fn take_handoff(&self, payload: &[u8]) -> bool {
        let Some((owner, token)) = parse_handoff(payload) else {
            return false;
        };
        let Some(slot) = lock(&self.slots).get(owner).and_then(Weak::upgrade) else {
            return false;
        };
        let mut t = lock(&slot.token);
        *t = Some(t.map_or(token, |old| old.max(token)));
        true
    }
}

/// A hand-off message `"owner token"`: the owner and the token in plain decimal (what the
/// release script publishes); `None` for anything else, which hands nothing to anyone.
fn parse_handoff(payload: &[u8]) -> Option<(&str, u64)> {
    let (owner, token) = std::str::from_utf8(payload).ok()?.split_once(' ')?;
    if owner.is_empty() || !plain_decimal(token) {
        return None;
    }
    Some((owner, token.parse().ok()?))
}

/// The decoders of stored data and answers, for the fuzz targets (`dlock::__fuzz`; not API).
#[cfg(feature = "__fuzz")]
pub(crate) mod fuzz {
    use super::*;
    pub use ::redis::Value;

    /// The lock name of a scanned key under `prefix`, `None` for a key that is not a base key.
    pub fn name_of_key(prefix: &str, hashtag: bool, key: &str) -> Option<String> {
        keys::key_name(prefix, hashtag, key)
    }

    /// The base key of `name` under `prefix`.
    pub fn base_key(prefix: &str, hashtag: bool, name: &str) -> String {
        keys::base_key(prefix, hashtag, name)
    }

    /// Whether `name` may be used with or without hash tags (not another lock's key).
    pub fn name_allowed(hashtag: bool, name: &str) -> Result<()> {
        keys::check_name(hashtag, name)
    }

    /// The lock `describe` reads from the `describe` script's answer `v` for `name`.
    pub fn parse_describe(name: &str, v: &Value) -> Result<Option<LockInfo>> {
        describe::parse_describe(name, v)
    }

    /// A hand-off message's owner and token.
    pub fn parse_handoff(payload: &[u8]) -> Option<(&str, u64)> {
        super::parse_handoff(payload)
    }
}

#[cfg(test)]
mod ha_tests;
#[cfg(test)]
mod tests;
