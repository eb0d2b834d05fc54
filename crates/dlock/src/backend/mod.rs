//! The backend trait: the few operations a store must do atomically.
//!
//! Everything else (reentrancy, renewal scheduling, `lost()`, waiting and polling, in-process
//! wake-ups, per-call timeouts, guards) lives above this trait, in the core, written once. See
//! `docs/ARCHITECTURE.md` for how a lease-shaped store (SQLite, Redis, SQL) and a queue-shaped
//! store (ZooKeeper) both fit it.
//!
//! The protocol the core follows for one acquisition:
//!
//! 1. [`Backend::begin`] makes the [`Acquisition`] of one request (a fresh owner token). It owns
//!    the waiter's state in the store: its queue node, what it last saw of the store's change
//!    source.
//! 2. [`Acquisition::attempt`]: a lease store tries to grant; a queue store enqueues the owner
//!    (when `waiting`) and grants if the owner is at the front. Repeated attempts keep the
//!    waiter's place and are idempotent for a granted owner (same token).
//! 3. On [`Attempt::Busy`], if the caller waits, the core waits: on
//!    [`Acquisition::changed`], the store's own change source, or, where it answers
//!    [`Watch::Poll`], by polling [`Acquisition::look`] with back-off; then back to 2.
//! 4. If the caller gives up (or drops the acquisition half-way): [`Acquisition::cancel`]
//!    removes any queue place.
//! 5. While held: [`Backend::extend`] for all holds of a client in one call, and finally
//!    [`Backend::release`], which compares the owner token.
//!
//! # What each store can do
//!
#![doc = include_str!("capabilities.md")]

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
#[cfg(any(
    feature = "sqlite",
    feature = "zookeeper",
    feature = "etcd",
    feature = "postgres",
    feature = "mysql"
))]
pub(crate) mod group;
pub(crate) mod logic;
pub mod memory;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
pub(crate) mod queue;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "redlock")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
pub mod redlock;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod sql;
#[cfg(test)]
#[allow(dead_code)] // each store's tests use a different subset
pub(crate) mod test_support;
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub mod zookeeper;

use crate::error::Result;
use crate::name::LockName;

/// FNV-1a, 64 bits (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`): a hash that
/// every client computes alike, in any language, for keys the store sees (SQL session locks)
/// or choices all clients must agree on (Redlock's lead server, the stripe of a key in
/// [`crate::Striped`]).
pub(crate) fn fnv1a64_bytes(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, Instant};

/// How long a waiter's place in a fair queue lives without being refreshed. A waiting client
/// refreshes it (by repeating [`Acquisition::attempt`]) at least every quarter of this, so a waiter that
/// died blocks the queue for at most this long.
pub const QUEUE_PLACE_TTL: Duration = Duration::from_secs(5);

/// Whether `s` is a number as dlock writes one into a store: ASCII digits, no sign, no leading
/// zero. Stored numbers are read only in this form: `+5` or `005` in a store is not dlock's.
#[cfg(any(feature = "zookeeper", feature = "redis", feature = "postgres"))]
pub(crate) fn plain_decimal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

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
    /// A value the holder publishes with its hold: a leader's value in an election
    /// ([`crate::Election`]); `None` for plain locks. Stored where the store has
    /// [`Capabilities::values`], at most [`MAX_VALUE_LEN`] bytes, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// The longest value a hold may carry ([`HolderMeta::value`]), in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

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

impl<'a> Request<'a> {
    /// The hold this request makes when granted (to release or extend it).
    pub fn hold(&self) -> HoldRef<'a> {
        HoldRef {
            name: self.name,
            kind: self.kind,
            mode: self.mode,
            owner: self.owner,
            lease: self.lease,
        }
    }

    /// Whether a refused attempt of this request takes (or keeps) a place in the lock's queue:
    /// every waiting fair request, and every waiting **writer** of a read-write lock even when
    /// not fair, so that a waiting writer blocks new readers (no writer starvation). Queue places
    /// expire after [`QUEUE_PLACE_TTL`] unless the waiter repeats its attempt.
    pub fn takes_queue_place(&self) -> bool {
        self.waiting
            && (self.fair || (self.kind == LockKind::RwLock && self.mode == Mode::Exclusive))
    }
}

/// An owned copy of a [`Request`], for an [`Acquisition`] to keep.
#[derive(Debug, Clone)]
pub struct Want {
    /// The lock name.
    pub name: LockName,
    /// The primitive the name is used as.
    pub kind: LockKind,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The owner token of the hold.
    pub owner: String,
    /// The lease to grant.
    pub lease: Duration,
    /// Grant strictly in arrival order.
    pub fair: bool,
    /// The caller will wait if busy (see [`Request::waiting`]).
    pub waiting: bool,
    /// Stored with the hold.
    pub meta: HolderMeta,
}

impl Want {
    /// A copy of `req`.
    pub fn new(req: &Request<'_>) -> Want {
        Want {
            name: req.name.clone(),
            kind: req.kind,
            mode: req.mode,
            owner: req.owner.to_owned(),
            lease: req.lease,
            fair: req.fair,
            waiting: req.waiting,
            meta: req.meta.clone(),
        }
    }

    /// The request, borrowed.
    pub fn req(&self) -> Request<'_> {
        Request {
            name: &self.name,
            kind: self.kind,
            mode: self.mode,
            owner: &self.owner,
            lease: self.lease,
            fair: self.fair,
            waiting: self.waiting,
            meta: &self.meta,
        }
    }
}

/// The answer to [`Acquisition::attempt`].
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

impl Grant {
    /// The grant a registered waiter takes without a round trip when a release handed it the
    /// lock with `token` ([`Released::HandedOff`]). `since` is when its latest registering
    /// attempt was sent and the highest token it saw then: a lower or equal token was handed
    /// before that attempt (and taken back since), so it is stale. The lease counts from that
    /// send; with less than half of it left, `None` (the next attempt's regrant renews it from
    /// now). A grant clears `since` and `registered` (the release consumed the registration).
    #[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
    pub(crate) fn handed(
        token: u64,
        since: &mut Option<(std::time::Instant, u64)>,
        registered: &mut bool,
        lease: Duration,
    ) -> Option<Grant> {
        let (sent, seen) = (*since)?;
        if token <= seen {
            return None;
        }
        let left = lease.checked_sub(sent.elapsed())?;
        if left < lease / 2 {
            return None;
        }
        *since = None;
        *registered = false;
        Some(Grant {
            token: Some(token),
            valid_for: left,
        })
    }
}

/// Why and for how long an attempt was refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Busy {
    /// When trying again may succeed even without a wake-up: the shortest remaining lease of the
    /// holds in the way (a dead holder's lease runs out silently); with only queued waiters in
    /// the way (fair requests, waiting rwlock writers), the request's own lease (the first is
    /// about to be granted, and a hold it takes also ends silently if its holder dies). `None`
    /// if unknown.
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
    /// The owner's hold was removed and the store handed the lock to one of its waiters,
    /// waking that one only: nobody else can take it now, so the core wakes none of its own.
    HandedOff,
    /// The owner did not hold the lock (any other holder was left untouched).
    NotHeld,
}

/// How a store wakes waiters in other processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeups {
    /// The store notifies (pub/sub, watch, NOTIFY, in-process signal).
    Native,
    /// The store has no notification: the core polls, with jittered back-off between these
    /// bounds (see [`Watch::Poll`]).
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
    /// attempt just to keep its place. A hold whose lease ran out without renewal is released
    /// by the core (the session would keep it).
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
    /// The store keeps every waiter in its own queue and wakes exactly the one whose turn it is
    /// (ZooKeeper: each waiter a node watching its predecessor). The core then lets each waiter
    /// wait for itself: no client-side line, no wake-up on the client's own releases.
    pub queues_waiters: bool,
    /// The store keeps a hold's [`HolderMeta::value`] (written with the grant, listed by
    /// [`Backend::describe`]) and replaces it with [`Backend::set_value`]: what an election's
    /// `campaign(value)` and `proclaim(value)` need.
    pub values: bool,
    /// A release of a mutex hands it to the store's first waiter and wakes only that one
    /// ([`Released::HandedOff`]; Redis, PostgreSQL, Redlock on a name's lead server): the core's
    /// next waiter of a client whose waiter was just granted registers in the store at once
    /// instead of waiting for this client's release.
    pub hands_off: bool,
}

impl Capabilities {
    /// A lease store with fencing tokens whose waiters are woken as `wakeups` says: what every
    /// store but ZooKeeper is (Redlock without fencing, SQL session mode with session validity).
    pub const fn lease(wakeups: Wakeups) -> Capabilities {
        Capabilities {
            fencing: true,
            wakeups,
            validity: Validity::Lease,
            queues_waiters: false,
            values: false,
            hands_off: false,
        }
    }
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

/// What a poll's look at a name found ([`Acquisition::look`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// The request may be granted now: attempt.
    Free,
    /// Still refused. `state` is a fingerprint of what stands in the way (the holds, and the
    /// waiters ahead in the fair queue): when it differs between two looks the lock changed
    /// hands, and the core's poll interval starts again from its shortest, so a waiter of a lock
    /// that moves often keeps looking often and one behind a long hold backs off.
    Busy {
        /// The fingerprint; 0 where the store tells nothing more.
        state: u64,
        /// The request's place in the fair queue (0: next), if it has one: waiters near the
        /// front poll sooner.
        place: Option<usize>,
    },
}

/// What [`Acquisition::changed`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// The store reported a change that may let the request in (a release, its queue moving):
    /// the core attempts at once.
    Changed,
    /// The wait ended without such a report (the deadline, a periodic re-check, the change
    /// source going down or up): the core looks first where the store can look, and attempts
    /// only if the look finds the request may be granted.
    Recheck,
    /// The store has no change source for this wait (none at all, or it is down now): the core
    /// polls between these bounds until the deadline.
    Poll {
        /// Shortest poll interval.
        min: Duration,
        /// Longest poll interval.
        max: Duration,
    },
}

/// One acquisition in progress: made by [`Backend::begin`], it owns the waiter's state in the
/// store. The core drives it (see the module docs) and cancels it when the caller gives up or
/// drops the acquisition; a store keeps no map of its waiters.
#[async_trait::async_trait]
pub trait Acquisition: Send + Sync {
    /// Tries to grant the request. Must be atomic in the store. Repeating it is idempotent: an
    /// owner that holds gets the same token back (its lease refreshed); a waiting owner keeps
    /// its queue place.
    async fn attempt(&mut self) -> Result<Attempt>;

    /// Waits until the store reports a change that may let the request in (a release, an
    /// expiry it knows of, the queue moving), or until `until`; spurious wake-ups are fine. A
    /// change since the last attempt was sent counts. Answers [`Watch::Poll`] at once when the
    /// store cannot watch for this wait.
    async fn changed(&mut self, busy: &Busy, until: Instant) -> Result<Watch>;

    /// A read-only look at whether an attempt may succeed now, for polling and for checking a
    /// wake-up before a (costlier) attempt. `None`: the store cannot look more cheaply than it
    /// attempts.
    async fn look(&mut self) -> Result<Option<Look>> {
        Ok(None)
    }

    /// The owner gives up waiting: remove its queue place, if any. Never touches holds.
    async fn cancel(&mut self) -> Result<()>;

    /// Notes the store's change source now, as a waiting attempt does before it is sent, so
    /// that a later [`Acquisition::changed`] reports what came after this moment, for an
    /// observer that watches the name without attempting (an election's follower). `true` if
    /// the acquisition can watch so; `false` (the default) where `changed` needs an attempt
    /// first (queue stores: a node of their own): the observer then polls.
    fn mark(&mut self) -> bool {
        false
    }

    /// Whether this acquisition's busy attempts may register it as the store's next waiter, on a
    /// store that hands a released mutex on ([`Capabilities::hands_off`]). The core allows it
    /// for the first waiter of its client's line only: a waiter behind that one would be handed
    /// the lock while it waits for its turn in the line. Set before each attempt; ignored
    /// elsewhere.
    fn may_register(&mut self, _on: bool) {}
}

/// A store that can hold locks. Implemented once per store; see the module docs for the protocol.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// A short name: `mem`, `sqlite`, `redis`, ...
    fn name(&self) -> &'static str;

    /// What this store can do.
    fn capabilities(&self) -> Capabilities;

    /// Starts one acquisition of `req` (nothing is sent yet).
    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition>;

    /// Releases the owner's hold if, and only if, the owner still holds it.
    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released>;

    /// Extends many holds in one round trip, each to its `lease`. The answer has one entry per
    /// hold, in order. With `detach` the extension is the last one: nobody renews these holds
    /// after it (`Guard::expire_in`), so a forced release ([`Force::Revoke`]) may remove them at
    /// once ([`HoldStatus::Detached`]); a store that cannot mark a hold so extends it plainly.
    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>>;

    /// Lists the locks whose name starts with `prefix` (all for ""), with holders and waiters.
    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>>;

    /// An administrator's unlock of `name`, as `how` says. Fencing counters are kept.
    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced>;

    /// Replaces the value stored with the owner's hold ([`HolderMeta::value`]) if, and only if,
    /// the owner still holds it (an election's `proclaim`), and wakes whoever watches the name
    /// as a release would. `NotHeld` leaves everything untouched. Stores without
    /// [`Capabilities::values`] answer [`crate::Error::Unsupported`].
    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        let _ = (hold, value);
        Err(crate::Error::Unsupported(format!(
            "the {} store does not keep values with its holds",
            self.name()
        )))
    }

    /// For a store whose holds live with the client's session: how long the store keeps the
    /// holds of a client that died (ZooKeeper: the session timeout the server granted). `None`
    /// where a hold's own lease decides.
    fn session_timeout(&self) -> Option<Duration> {
        None
    }

    /// Names the store this backend reaches, for backends of one process that see the same
    /// locks through separate connections (the same file, database and table, in-process store):
    /// the core wakes the waiters of all of them on a release in this process. `None` where the
    /// store's own change source already reaches every connection at once.
    fn shared_key(&self) -> Option<String> {
        None
    }

    /// How long one call to the store (an attempt, a look, a cancel, a release, an extend, a
    /// describe, a forced release) may take before the core gives up on it with
    /// [`crate::Error::Unavailable`]. `None`: the store bounds its calls itself.
    fn call_timeout(&self) -> Option<Duration> {
        None
    }
}
