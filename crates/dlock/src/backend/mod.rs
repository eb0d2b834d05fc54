//! The backend trait: the few operations a store must do atomically.
//!
//! Everything else (reentrancy, renewal scheduling, `lost()`, timeouts, guards, local wake-ups)
//! lives above this trait, in the core, written once. See `docs/ARCHITECTURE.md` for how a
//! lease-shaped store (SQLite, Redis, SQL) and a queue-shaped store (ZooKeeper) both fit it.
//!
//! The protocol the core follows for one acquisition:
//!
//! 1. [`Backend::acquire`] with a fresh owner token. A lease store tries to grant; a queue store
//!    enqueues the owner (when `waiting`) and grants if the owner is at the front.
//! 2. On [`Attempt::Busy`], if the caller waits: [`Backend::wait`] until something may have changed
//!    (or the deadline of the current wait slice), then back to 1 with the **same** request. The
//!    backend must treat a repeated `acquire` of the same owner as "still waiting in my place" and,
//!    if the owner already holds, as an idempotent re-grant with the same token.
//! 3. If the caller gives up: [`Backend::cancel`] removes any queue place the owner has.
//! 4. While held: [`Backend::extend`] for all holds of a client in one call (lease stores), and
//!    finally [`Backend::release`], which compares the owner token.

pub(crate) mod logic;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod sql;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod sql_common;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "sqlite")]
mod sqlite_machine;
#[cfg(feature = "sqlite")]
mod sqlite_watch;
#[cfg(test)]
#[allow(dead_code)] // each store's tests use a different subset
pub(crate) mod test_support;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

use crate::error::Result;
use crate::name::LockName;

/// FNV-1a, 64 bits (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`): a hash that
/// every client computes alike, in any language, for keys the store sees (SQL session locks)
/// or choices all clients must agree on (Redlock's lead server).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redlock"))]
pub(crate) fn fnv1a64_bytes(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, Instant};

/// How long a waiter's place in a fair queue lives without being refreshed. A waiting client
/// refreshes it (by repeating [`Backend::acquire`]) at least every quarter of this, so a waiter that
/// died blocks the queue for at most this long.
pub const QUEUE_PLACE_TTL: Duration = Duration::from_secs(5);

/// What kind of primitive a lock name is used as. All holders of one name must agree
/// (a mismatch is [`crate::Error::InvalidConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum LockKind {
    /// One exclusive holder.
    Mutex,
    /// Many shared (read) holders or one exclusive (write) holder.
    RwLock,
    /// At most `permits` holders.
    Semaphore {
        /// The number of permits; every user of the name must use the same number.
        permits: u32,
    },
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockKind::Mutex => f.write_str("mutex"),
            LockKind::RwLock => f.write_str("rwlock"),
            LockKind::Semaphore { permits } => write!(f, "semaphore({permits})"),
        }
    }
}

/// How a hold shares the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Excludes every other hold (a mutex, a write lock).
    Exclusive,
    /// Shares with other shared holds (a read lock, a semaphore permit).
    Shared,
}

impl Mode {
    /// The stable short name used in stores and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

/// Who holds or waits: stored with the hold so `dlock list` can show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderMeta {
    /// The client that made the hold (one per [`crate::Client`]).
    pub client_id: String,
    /// Host name of the holder's machine.
    pub host: String,
    /// Process id of the holder.
    pub pid: u32,
}

/// One attempt to acquire, as the core hands it to a backend.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The lock name.
    pub name: &'a LockName,
    /// The primitive the name is used as.
    pub kind: LockKind,
    /// Exclusive or shared.
    pub mode: Mode,
    /// A token unique to this hold (a UUID); release and extend compare it.
    pub owner: &'a str,
    /// The lease to grant (lease stores).
    pub lease: Duration,
    /// Grant strictly in arrival order.
    pub fair: bool,
    /// The caller will wait if busy: a queue store, a fair request or a waiting rwlock writer
    /// keeps (or takes) a place in the queue (see [`Request::takes_queue_place`]). `false` for
    /// `try_acquire`: nothing may be left behind.
    pub waiting: bool,
    /// Stored with the hold.
    pub meta: &'a HolderMeta,
}

impl Request<'_> {
    /// Whether a refused attempt of this request takes (or keeps) a place in the lock's queue:
    /// every waiting fair request, and every waiting **writer** of a read-write lock even when
    /// not fair, so that a waiting writer blocks new readers (no writer starvation). Queue places
    /// expire after [`QUEUE_PLACE_TTL`] unless the waiter repeats its attempt.
    pub fn takes_queue_place(&self) -> bool {
        self.waiting
            && (self.fair || (self.kind == LockKind::RwLock && self.mode == Mode::Exclusive))
    }
}

/// The answer to [`Backend::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The hold is granted.
    Granted(Grant),
    /// Not granted now.
    Busy(Busy),
}

/// A granted hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token: strictly increasing per name across all grants. `None` only on stores
    /// that cannot give one (Redlock).
    pub token: Option<u64>,
    /// How long the hold is guaranteed, counted from when the request was **sent** (the lease for
    /// a lease store; the session's remaining guarantee for a session store).
    pub valid_for: Duration,
}

/// Why and for how long an attempt was refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Busy {
    /// When trying again may succeed even without a wake-up: the shortest remaining lease of the
    /// holds in the way (a dead holder's lease runs out silently). `None` if unknown.
    pub retry_in: Option<Duration>,
}

/// A hold to extend or release.
#[derive(Debug, Clone)]
pub struct HoldRef<'a> {
    /// The lock name.
    pub name: &'a LockName,
    /// The primitive the name is used as.
    pub kind: LockKind,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The owner token of the hold.
    pub owner: &'a str,
    /// The new lease (for [`Backend::extend`]).
    pub lease: Duration,
}

/// The result of extending one hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extended {
    /// Still held; guaranteed for `valid_for` from when the request was sent.
    Held {
        /// The guarantee, counted from when the request was sent.
        valid_for: Duration,
    },
    /// The store no longer has this owner's hold (expired, taken over, removed).
    Gone,
    /// The hold was revoked by a forced release ([`Force::Revoke`]): it is no longer the
    /// owner's, but the store keeps everyone else out until the owner releases it (its
    /// acknowledgement) or its lease runs out.
    Revoked,
}

/// The answer of an `extend` of one hold (a missing answer: gone).
pub(crate) fn sole(mut answers: Vec<Extended>) -> Extended {
    answers.pop().unwrap_or(Extended::Gone)
}

/// How a forced release ([`Backend::force_release`]) treats holders that may still be working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Force {
    /// Revoke: every live hold's next renewal answers [`Extended::Revoked`], and nobody else is
    /// granted the name until each revoked holder has released (acknowledged) or its lease has
    /// run out. Holds that nobody renews any more ([`HoldStatus::Detached`]: the rest of a
    /// `--hold-at-least` window) are removed at once. Waiters keep their places.
    Revoke,
    /// Break: remove every hold and queue place now. A holder still working learns of it only
    /// at its next renewal, so two holders may work at once until then: for emergencies (a
    /// holder that is gone for good, with a long lease).
    Break,
}

/// What a forced release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Forced {
    /// Holds removed at once (every live hold with [`Force::Break`]; detached holds with
    /// [`Force::Revoke`]).
    pub removed: u64,
    /// Holds revoked: they end when their holders acknowledge, at the latest when their leases
    /// run out.
    pub revoked: u64,
    /// The longest lease left of the revoked holds (`None` when nothing was revoked or the store
    /// bounds holds by sessions).
    pub revoked_lease_left_ms: Option<u64>,
}

/// Where a hold stands, as listed by [`Backend::describe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldStatus {
    /// Held and renewed by its holder.
    #[default]
    Held,
    /// Kept by its lease alone, renewed by nobody (`Guard::expire_in`, `dlock run
    /// --hold-at-least` after the command ended).
    Detached,
    /// Revoked by a forced release; waiting for its holder's acknowledgement or its lease.
    Revoked,
}

impl HoldStatus {
    /// The stable short name used in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldStatus::Held => "held",
            HoldStatus::Detached => "detached",
            HoldStatus::Revoked => "revoked",
        }
    }
}

/// The result of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The owner's hold was removed.
    Released,
    /// The owner did not hold the lock (any other holder was left untouched).
    NotHeld,
}

/// How a store wakes waiters in other processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeups {
    /// The store notifies (pub/sub, watch, NOTIFY, in-process signal).
    Native,
    /// The store has no notification: waiters poll with jittered backoff between these bounds.
    Polling {
        /// Shortest poll interval.
        min: Duration,
        /// Longest poll interval.
        max: Duration,
    },
}

/// How a store bounds a hold in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// A lease that the client must extend ([`Backend::extend`]).
    Lease,
    /// A session kept alive by the store client's heartbeats; `extend` only confirms it. Queue
    /// places (waiter nodes) live as long as the session, so the core does not repeat a waiting
    /// attempt just to keep its place. With [`Wakeups::Native`] the core also leaves the waking
    /// of its waiters to [`Backend::wait`] alone (no wake on the client's own releases): such a
    /// store wakes exactly the waiter whose turn it is.
    Session,
}

/// What a backend can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Grants carry strictly increasing fencing tokens.
    pub fencing: bool,
    /// Cross-process wake-ups.
    pub wakeups: Wakeups,
    /// Lease or session.
    pub validity: Validity,
}

/// A holder as listed by [`Backend::describe`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    /// The owner token of the hold.
    pub owner: String,
    /// Who holds it.
    #[serde(flatten)]
    pub meta: HolderMeta,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The fencing token of the hold.
    pub token: Option<u64>,
    /// When it was granted, in milliseconds since the Unix epoch (store clock where it has one).
    pub acquired_at_ms: u64,
    /// Lease left when described, in milliseconds (`None` for session stores).
    pub lease_left_ms: Option<u64>,
    /// Held, detached or revoked.
    #[serde(default)]
    pub status: HoldStatus,
}

/// A waiter as listed by [`Backend::describe`] (where the store knows its waiters: fair queues,
/// queue-shaped stores).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterInfo {
    /// The owner token the waiter will hold under.
    pub owner: String,
    /// Who waits.
    #[serde(flatten)]
    pub meta: HolderMeta,
    /// Exclusive or shared.
    pub mode: Mode,
    /// Position in the queue, 0 = next.
    pub position: u32,
}

/// The state of one lock name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The lock name.
    pub name: String,
    /// The primitive the holders use.
    #[serde(flatten)]
    pub kind: LockKind,
    /// Current holders.
    pub holders: Vec<HolderInfo>,
    /// Known waiters, in grant order.
    pub waiters: Vec<WaiterInfo>,
}

/// A store that can hold locks. Implemented once per store; see the module docs for the protocol.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// A short name: `mem`, `sqlite`, `redis`, ...
    fn name(&self) -> &'static str;

    /// What this store can do.
    fn capabilities(&self) -> Capabilities;

    /// Tries to grant `req`. Must be atomic in the store. Repeating the call for the same owner is
    /// idempotent: an owner that already holds gets the same token back (its lease refreshed); an
    /// owner that waits keeps its queue place.
    async fn acquire(&self, req: &Request<'_>) -> Result<Attempt>;

    /// Waits until the lock may have changed in a way that lets `req` succeed, or until `until`.
    /// May return early (spurious wake-ups are fine). A store without notification sleeps a
    /// jittered poll interval bounded by `busy.retry_in`.
    async fn wait(&self, req: &Request<'_>, busy: &Busy, until: Instant) -> Result<()>;

    /// The owner gives up waiting: remove its queue place, if any. Never touches holds.
    async fn cancel(&self, req: &Request<'_>) -> Result<()>;

    /// Releases the owner's hold if, and only if, the owner still holds it.
    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released>;

    /// Extends many holds in one round trip, each to its `lease`. The answer has one entry per
    /// hold, in order.
    async fn extend(&self, holds: &[HoldRef<'_>]) -> Result<Vec<Extended>>;

    /// Lists the locks whose name starts with `prefix` (all for ""), with holders and waiters.
    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>>;

    /// Extends one hold to `hold.lease` for the last time: nobody renews it after this
    /// (`Guard::expire_in`), so a forced release ([`Force::Revoke`]) may remove it at once. A
    /// store that cannot mark it keeps the default, a plain [`Backend::extend`].
    async fn detach(&self, hold: &HoldRef<'_>) -> Result<Extended> {
        Ok(sole(self.extend(std::slice::from_ref(hold)).await?))
    }

    /// An administrator's unlock of `name`, as `how` says. Fencing counters are kept.
    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced>;

    /// For a store whose holds live with the client's session: how long the store keeps the
    /// holds of a client that died (ZooKeeper: the session timeout the server granted). `None`
    /// where a hold's own lease decides.
    fn session_timeout(&self) -> Option<Duration> {
        None
    }
}
