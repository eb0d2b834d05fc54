//! What the SQL stores share: the SQLite store (`sqlite.rs`) and the PostgreSQL/MySQL store
//! (`sql/`) keep the same rows (holds, queue places, fences), so they read them, apply the grant
//! rule, keep fair queue places, list locks and wait for a change in one way. Each store keeps only
//! its SQL, its transactions and its error mapping.

use super::logic::{decide, Decision, LiveHold, LiveWaiter};
use super::*;
use crate::error::Error;
use crate::signal::{NameSignal, NameSignals};
use rand::Rng;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex as StdMutex, Weak};

/// A queue place is rewritten by a repeated `acquire` only once it is at least this old, so a
/// polling fair waiter does not cost a (synced) write on every attempt. Waiters repeat `acquire`
/// at least every `QUEUE_PLACE_TTL / 4`, so a place is refreshed long before it expires.
pub(crate) const QUEUE_REFRESH_AFTER: Duration = Duration::from_secs(1);

/// A duration in whole milliseconds, rounded up.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

/// The most holds one set-based `extend` statement carries (two placeholders each).
pub(crate) const EXTEND_CHUNK: usize = 500;

/// The groups in which the SQL stores extend `holds`: at most [`EXTEND_CHUNK`] holds of one lease
/// length (in ms) each, as indexes into `holds`. One `UPDATE … WHERE (name, owner) IN (…)` per
/// group (usually one group per chunk: a client's holds mostly share a lease).
pub(crate) fn extend_groups(holds: &[HoldRef<'_>]) -> Vec<(i64, Vec<usize>)> {
    let mut out = Vec::new();
    for first in (0..holds.len()).step_by(EXTEND_CHUNK) {
        let end = (first + EXTEND_CHUNK).min(holds.len());
        let mut by_lease: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
        for (i, h) in holds.iter().enumerate().take(end).skip(first) {
            by_lease.entry(ms(h.lease)).or_default().push(i);
        }
        out.extend(by_lease);
    }
    out
}

/// `(?, ?), (?, ?), …` for `n` (name, owner) pairs.
pub(crate) fn name_owner_pairs(n: usize) -> String {
    vec!["(?, ?)"; n].join(", ")
}

/// What an `extend` found of one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Live and extended.
    Live,
    /// Not there (expired, released, broken).
    Gone,
    /// Revoked by a forced release (`state` [`STATE_REVOKED`]).
    Revoked,
}

/// The `state` column of a hold: renewed by its holder.
pub(crate) const STATE_HELD: i64 = 0;
/// The `state` column of a hold that nobody renews any more (`Backend::detach`).
pub(crate) const STATE_DETACHED: i64 = 1;
/// The `state` column of a hold revoked by a forced release.
pub(crate) const STATE_REVOKED: i64 = 2;

/// The answers of an `extend`, one per hold.
pub(crate) fn extend_answers(holds: &[HoldRef<'_>], found: &[Renewed]) -> Vec<Extended> {
    holds
        .iter()
        .zip(found)
        .map(|(h, f)| match f {
            Renewed::Live => Extended::Held { valid_for: h.lease },
            Renewed::Gone => Extended::Gone,
            Renewed::Revoked => Extended::Revoked,
        })
        .collect()
}

/// The expiry of a lease of `d` starting at `now` (milliseconds).
pub(crate) fn expiry(now: i64, d: Duration) -> i64 {
    now.saturating_add(ms(d))
}

/// What is left at `now` of a row expiring at `expires_at_ms` (zero once expired).
pub(crate) fn left(expires_at_ms: i64, now: i64) -> Duration {
    Duration::from_millis(u64::try_from(expires_at_ms.saturating_sub(now)).unwrap_or(0))
}

/// The `kind` and `permits` columns of a lock kind.
pub(crate) fn kind_columns(kind: LockKind) -> (&'static str, i64) {
    match kind {
        LockKind::Mutex => ("mutex", 0),
        LockKind::RwLock => ("rwlock", 0),
        LockKind::Semaphore { permits } => ("semaphore", i64::from(permits)),
    }
}

/// A granted fencing token as the `fence` column stores it.
pub(crate) fn fence_column(name: &str, token: u64) -> Result<i64> {
    i64::try_from(token)
        .map_err(|_| Error::InvalidConfig(format!("fencing counter of {name:?} is exhausted")))
}

/// A statement's arguments on `DB`.
type Query<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>;

/// Binds the columns of a new hold of `req` with fencing token `token`, granted at `now` (the
/// store's clock, which the lease counts on) and shown as granted at `acquired_at_ms`, in the
/// order `name, owner, kind, permits, mode, fence, expires_at_ms, acquired_at_ms, client_id, host,
/// pid`.
pub(crate) fn bind_hold<'q, DB>(
    q: Query<'q, DB>,
    req: &'q Request<'q>,
    token: i64,
    now: i64,
    acquired_at_ms: i64,
) -> Query<'q, DB>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let (kind, permits) = kind_columns(req.kind);
    q.bind(req.name.as_str())
        .bind(req.owner)
        .bind(kind)
        .bind(permits)
        .bind(req.mode.as_str())
        .bind(token)
        .bind(expiry(now, req.lease))
        .bind(acquired_at_ms)
        .bind(req.meta.client_id.as_str())
        .bind(req.meta.host.as_str())
        .bind(i64::from(req.meta.pid))
}

/// Binds the columns of a new queue place of `req` expiring at `expires_at_ms`, in the order
/// `name, owner, mode, expires_at_ms, client_id, host, pid`.
pub(crate) fn bind_waiter<'q, DB>(
    q: Query<'q, DB>,
    req: &'q Request<'q>,
    expires_at_ms: i64,
) -> Query<'q, DB>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    q.bind(req.name.as_str())
        .bind(req.owner)
        .bind(req.mode.as_str())
        .bind(expires_at_ms)
        .bind(req.meta.client_id.as_str())
        .bind(req.meta.host.as_str())
        .bind(i64::from(req.meta.pid))
}

/// Parses column values; `.0` names where the rows live, for messages about corrupt rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows(pub &'static str);

impl Rows {
    /// The error of a column value no dlock writes.
    pub(crate) fn corrupt(self, what: &str, value: &dyn std::fmt::Debug) -> Error {
        Error::backend(format!("unexpected {what} {value:?} in {}", self.0))
    }

    /// The `kind` and `permits` columns.
    pub(crate) fn kind(self, kind: &str, permits: i64) -> Result<LockKind> {
        match kind {
            "mutex" => Ok(LockKind::Mutex),
            "rwlock" => Ok(LockKind::RwLock),
            "semaphore" => u32::try_from(permits)
                .ok()
                .filter(|p| *p > 0)
                .map(|permits| LockKind::Semaphore { permits })
                .ok_or_else(|| self.corrupt("permits", &permits)),
            other => Err(self.corrupt("lock kind", &other)),
        }
    }

    /// The `mode` column.
    pub(crate) fn mode(self, mode: &str) -> Result<Mode> {
        match mode {
            "exclusive" => Ok(Mode::Exclusive),
            "shared" => Ok(Mode::Shared),
            other => Err(self.corrupt("mode", &other)),
        }
    }

    /// The `fence` column.
    pub(crate) fn token(self, fence: i64) -> Result<u64> {
        u64::try_from(fence).map_err(|_| self.corrupt("fencing token", &fence))
    }

    /// The `state` column of a hold.
    pub(crate) fn status(self, state: i64) -> Result<HoldStatus> {
        match state {
            STATE_HELD => Ok(HoldStatus::Held),
            STATE_DETACHED => Ok(HoldStatus::Detached),
            STATE_REVOKED => Ok(HoldStatus::Revoked),
            other => Err(self.corrupt("hold state", &other)),
        }
    }

    /// The `pid` column.
    fn pid(self, pid: i64) -> Result<u32> {
        u32::try_from(pid).map_err(|_| self.corrupt("pid", &pid))
    }

    /// The `client_id`, `host` and `pid` columns.
    fn meta(self, client_id: String, host: String, pid: i64) -> Result<HolderMeta> {
        Ok(HolderMeta {
            client_id,
            host,
            pid: self.pid(pid)?,
        })
    }
}

/// A live hold row as loaded for a decision: `owner, kind, permits, mode, fence, expires_at_ms`.
pub(crate) type HoldColumns = (String, String, i64, String, i64, i64);
/// A live queue row, in queue order: `owner, mode, expires_at_ms`.
pub(crate) type WaiterColumns = (String, String, i64);
/// One row of a name's whole state read in one `UNION ALL`: `part` (`'f'` the fence row, `'h'` a
/// hold, `'q'` a queue place), `owner, kind, permits, mode`, `ord` (the fence of the fence row
/// or a hold, the sequence of a queue place) and `expires_at_ms`. Ordered by `part, ord`. A
/// revoked hold is read with an empty owner: nobody's (no re-grant), yet it keeps others out.
pub(crate) type StateRow = (String, String, String, i64, String, i64, i64);

/// A name's state as read in one statement.
pub(crate) struct Loaded {
    /// The live holds and queue places.
    pub state: NameState,
    /// The stored fence, when the statement read the fence row and it exists (SQLite).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub fence: Option<i64>,
    /// Whether expired holds or queue places were seen (they are then deleted).
    pub expired: bool,
}

impl Loaded {
    /// Splits the rows of one name at `now` into the live state, the fence and whether any
    /// expired rows are left to delete.
    pub(crate) fn split(rows: Rows, all: Vec<StateRow>, now: i64) -> Result<Loaded> {
        let mut holds: Vec<HoldColumns> = Vec::new();
        let mut queue: Vec<WaiterColumns> = Vec::new();
        let (mut fence, mut expired) = (None, false);
        for (part, owner, kind, permits, mode, ord, expires_at_ms) in all {
            match part.as_str() {
                "f" => fence = Some(ord),
                _ if expires_at_ms <= now => expired = true,
                "h" => holds.push((owner, kind, permits, mode, ord, expires_at_ms)),
                _ => queue.push((owner, mode, expires_at_ms)),
            }
        }
        Ok(Loaded {
            state: NameState::from_rows(rows, holds, queue)?,
            fence,
            expired,
        })
    }
}

/// A hold row as listed: `name, owner, kind, permits, mode, fence, expires_at_ms, acquired_at_ms,
/// client_id, host, pid, state`.
pub(crate) type HoldListing = (
    String,
    String,
    String,
    i64,
    String,
    i64,
    i64,
    i64,
    String,
    String,
    i64,
    i64,
);
/// A queue row as listed: `name, owner, mode, client_id, host, pid`.
pub(crate) type WaiterListing = (String, String, String, String, String, i64);

/// A live hold of one name as loaded inside a transaction.
pub(crate) struct HoldRow {
    pub owner: String,
    pub kind: LockKind,
    pub mode: Mode,
    pub token: u64,
    pub expires_at_ms: i64,
}

/// A live queue place of one name, in queue order.
pub(crate) struct WaiterRow {
    pub owner: String,
    pub mode: Mode,
    pub expires_at_ms: i64,
}

/// What a refused request that takes a queue place does to its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueuePlace {
    /// No place yet: insert one expiring at this time.
    Insert { expires_at_ms: i64 },
    /// The place is more than [`QUEUE_REFRESH_AFTER`] old: move its expiry to this time (the
    /// place, and its sequence, stay).
    Refresh { expires_at_ms: i64 },
    /// The place is fresh, or the request takes no place: no write.
    Keep,
}

/// What a waiter's look (`wait`'s re-read of a name) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// The request may be granted now: attempt.
    Free,
    /// Still refused. `state` is a fingerprint of what stands in the way (the holds, and the
    /// waiters ahead in the fair queue): when it differs between two looks the lock changed
    /// hands, and the poll interval starts again from its shortest, so a waiter of a lock that
    /// moves often keeps looking often (a fair queue's next head would otherwise find its turn
    /// only after a backed-off poll), and one behind a long hold backs off.
    Busy {
        /// The fingerprint; 0 where the store tells nothing more (session locks).
        state: u64,
        /// The request's place in the fair queue (0: next), if it has one.
        place: Option<usize>,
    },
}

/// The live state of one name.
pub(crate) struct NameState {
    pub holds: Vec<HoldRow>,
    pub queue: Vec<WaiterRow>,
}

impl NameState {
    /// Parses the live rows of one name (holds ordered by fence, queue by sequence).
    pub(crate) fn from_rows(
        rows: Rows,
        holds: Vec<HoldColumns>,
        queue: Vec<WaiterColumns>,
    ) -> Result<NameState> {
        Ok(NameState {
            holds: holds
                .into_iter()
                .map(|(owner, kind, permits, mode, fence, expires_at_ms)| {
                    Ok(HoldRow {
                        owner,
                        kind: rows.kind(&kind, permits)?,
                        mode: rows.mode(&mode)?,
                        token: rows.token(fence)?,
                        expires_at_ms,
                    })
                })
                .collect::<Result<_>>()?,
            queue: queue
                .into_iter()
                .map(|(owner, mode, expires_at_ms)| {
                    Ok(WaiterRow {
                        owner,
                        mode: rows.mode(&mode)?,
                        expires_at_ms,
                    })
                })
                .collect::<Result<_>>()?,
        })
    }

    /// The grant rule over these rows at `now`, with `fence` the name's fencing counter.
    pub(crate) fn decide(&self, req: &Request<'_>, fence: u64, now: i64) -> Result<Decision> {
        let holds: Vec<LiveHold<'_>> = self
            .holds
            .iter()
            .map(|h| LiveHold {
                owner: &h.owner,
                kind: h.kind,
                mode: h.mode,
                token: Some(h.token),
                expires_in: left(h.expires_at_ms, now),
            })
            .collect();
        let queue: Vec<LiveWaiter<'_>> = self
            .queue
            .iter()
            .map(|w| LiveWaiter {
                owner: &w.owner,
                mode: w.mode,
            })
            .collect();
        decide(req, &holds, &queue, fence)
    }

    /// A waiter's look at `now` (for `wait`; the fence only matters for the token of a grant,
    /// not for whether it would be granted).
    pub(crate) fn look(&self, req: &Request<'_>, now: i64) -> Look {
        if !matches!(self.decide(req, 0, now), Ok(Decision::Busy { .. })) {
            return Look::Free;
        }
        // What moves when the lock changes hands: the holders' tokens (a new grant has a new
        // one) and the waiters ahead of `req` (a fair queue advancing).
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for hold in &self.holds {
            hold.token.hash(&mut h);
        }
        let place = self.queue.iter().position(|w| w.owner == req.owner);
        place.hash(&mut h);
        Look::Busy {
            state: h.finish(),
            place,
        }
    }

    /// The fencing counter to grant from: the stored fence, or higher if a live hold already
    /// carries a higher token (defensive: never hand out a token at or below a live one).
    pub(crate) fn fence(&self, stored: Option<u64>) -> u64 {
        self.holds
            .iter()
            .map(|h| h.token)
            .chain(stored)
            .max()
            .unwrap_or(0)
    }

    /// What a refused `owner` does to its queue row at `now`: nothing unless it `enqueue`s (takes
    /// a queue place, see `Decision::Busy`).
    pub(crate) fn queue_place(&self, owner: &str, enqueue: bool, now: i64) -> QueuePlace {
        let expires_at_ms = expiry(now, QUEUE_PLACE_TTL);
        match self.queue.iter().find(|w| w.owner == owner) {
            _ if !enqueue => QueuePlace::Keep,
            None => QueuePlace::Insert { expires_at_ms },
            Some(w) if w.expires_at_ms < expires_at_ms - ms(QUEUE_REFRESH_AFTER) => {
                QueuePlace::Refresh { expires_at_ms }
            }
            Some(_) => QueuePlace::Keep,
        }
    }
}

/// Builds `describe`'s answer from the listed rows (holds ordered by name and fence, queue by
/// name and sequence) at `now`: names starting with `prefix` that have live holds, with their
/// waiters in queue order.
pub(crate) fn listing(
    rows: Rows,
    prefix: &str,
    now: i64,
    holds: Vec<HoldListing>,
    queue: Vec<WaiterListing>,
) -> Result<Vec<LockInfo>> {
    let mut locks: std::collections::BTreeMap<String, LockInfo> = Default::default();
    for (name, owner, kind, permits, mode, fence, expires, acquired, client_id, host, pid, state) in
        holds
    {
        if !name.starts_with(prefix) {
            continue;
        }
        let kind = rows.kind(&kind, permits)?;
        let info = locks.entry(name.clone()).or_insert_with(|| LockInfo {
            name,
            kind,
            holders: Vec::new(),
            waiters: Vec::new(),
        });
        info.holders.push(HolderInfo {
            owner,
            meta: rows.meta(client_id, host, pid)?,
            mode: rows.mode(&mode)?,
            token: Some(rows.token(fence)?),
            acquired_at_ms: u64::try_from(acquired).unwrap_or(0),
            lease_left_ms: Some(u64::try_from(expires.saturating_sub(now)).unwrap_or(0)),
            status: rows.status(state)?,
        });
    }
    for (name, owner, mode, client_id, host, pid) in queue {
        // Only names with live holds are listed, as in the other stores.
        let Some(info) = locks.get_mut(&name) else {
            continue;
        };
        let position = u32::try_from(info.waiters.len()).unwrap_or(u32::MAX);
        info.waiters.push(WaiterInfo {
            owner,
            meta: rows.meta(client_id, host, pid)?,
            mode: rows.mode(&mode)?,
            position,
        });
    }
    Ok(locks.into_values().collect())
}

/// The in-process wake-ups of every backend of this process on one database, by key (a file's
/// canonical path, a URL and table): backends on the same key wake each other's waiters.
pub(crate) struct SignalRegistry<K>(StdMutex<HashMap<K, Weak<NameSignals>>>);

impl<K: Hash + Eq> SignalRegistry<K> {
    /// An empty registry (for a `static`).
    pub(crate) fn new() -> Self {
        SignalRegistry(StdMutex::new(HashMap::new()))
    }

    /// The wake-ups of `key` (created on first use, kept while a backend uses them).
    pub(crate) fn get(&self, key: K) -> Arc<NameSignals> {
        let mut reg = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = reg.get(&key).and_then(Weak::upgrade) {
            return w;
        }
        reg.retain(|_, w| w.strong_count() > 0);
        let w = Arc::new(NameSignals::default());
        reg.insert(key, Arc::downgrade(&w));
        w
    }
}

/// The jittered poll interval of the `step`-th poll of one wait: uniform in `[b/2, b]` (at least
/// `min`), where `b` doubles from `2 * min` and is capped at `max`.
pub(crate) fn poll_interval(step: u32, min: Duration, max: Duration) -> Duration {
    let base = min
        .saturating_mul(2u32.saturating_pow(step.saturating_add(1)))
        .min(max);
    let hi = u64::try_from(base.as_micros()).unwrap_or(u64::MAX);
    let lo = (hi / 2).max(u64::try_from(min.as_micros()).unwrap_or(0));
    let us = if lo < hi {
        rand::thread_rng().gen_range(lo..=hi)
    } else {
        hi
    };
    Duration::from_micros(us)
}

/// What a waiting request's attempt knew when it was sent: the count of the name's wake-ups and
/// the state of the notification source. If neither changed by the time the waiter starts to
/// wait, the attempt's own look (which the store read after this was noted) is as fresh as a new
/// one, so `wait_for_change` skips its first look and goes straight to sleep.
pub(crate) struct Fresh {
    signal: Arc<NameSignal>,
    wakes: u64,
    listener: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Fresh {
    /// Notes the moment before an attempt of `name` is sent. `listener` is a new subscription
    /// to the store's notification source, if it has one.
    pub(crate) fn note(
        signals: &NameSignals,
        name: &str,
        listener: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Fresh {
        let signal = signals.subscribe(name);
        let wakes = signal.wakes();
        Fresh {
            signal,
            wakes,
            listener,
        }
    }
}

/// The [`Fresh`] notes of the busy attempts whose waits have not started, by owner token (one
/// per waiting request). Bounded: past [`FreshNotes::MAX`] entries (requests that were busy and
/// then never waited nor cancelled, e.g. dropped futures) it is cleared, which only costs those
/// waiters one extra look.
#[derive(Default)]
pub(crate) struct FreshNotes(StdMutex<HashMap<String, Fresh>>);

impl std::fmt::Debug for FreshNotes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshNotes").finish_non_exhaustive()
    }
}

impl FreshNotes {
    const MAX: usize = 4096;

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fresh>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `note` for the wait of `req` if the attempt was busy, forgets any older note of
    /// the owner otherwise.
    pub(crate) fn after_attempt(
        &self,
        req: &Request<'_>,
        note: Option<Fresh>,
        a: &Result<Attempt>,
    ) {
        // Only waiting attempts take notes; an attempt without one has nothing to keep or forget.
        if note.is_none() && !req.waiting {
            return;
        }
        let mut map = self.map();
        match (note, a) {
            (Some(n), Ok(Attempt::Busy(_))) => {
                if map.len() >= Self::MAX {
                    map.clear();
                }
                map.insert(req.owner.to_owned(), n);
            }
            _ => {
                map.remove(req.owner);
            }
        }
    }

    /// The note of `owner`'s last busy attempt, if any (taken: one wait uses it).
    pub(crate) fn take(&self, owner: &str) -> Option<Fresh> {
        self.map().remove(owner)
    }
}

/// How a waiter learns of changes besides polling.
pub(crate) struct WaitSources<'a> {
    /// The in-process wake-ups of the store.
    pub signals: &'a NameSignals,
    /// The poll interval bounds (see [`poll_interval`]).
    pub poll: (Duration, Duration),
    /// A notification connection's state (`true` while up): while it is up and `listening`,
    /// the waiter does not poll; any change of it wakes the waiter.
    pub listener: Option<tokio::sync::watch::Receiver<bool>>,
    /// Whether the listener's notifications cover this wait.
    pub listening: bool,
    /// While listening, still re-read the lock this often (a wake-up source that can miss
    /// changes); `None` trusts the listener.
    pub safety_poll: Option<Duration>,
    /// The note of the busy attempt this wait follows (see [`Fresh`]); its listener, when it has
    /// one, replaces `listener`.
    pub fresh: Option<Fresh>,
}

/// `Backend::wait` of the SQL stores: returns when `still_busy()` looks and finds the request may
/// be granted,
/// when an in-process wake-up of the name arrives, or at `until`. Between looks it sleeps for a
/// jittered poll interval (or, while a listener is up, until a wake-up), never past the end of the
/// blocking lease (`busy.retry_in`) or `until`.
pub(crate) async fn wait_for_change<F, Fut>(
    src: WaitSources<'_>,
    name: &str,
    busy: &Busy,
    until: Instant,
    mut still_busy: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Look>>,
{
    let started = Instant::now();
    let lease_end = busy.retry_in.and_then(|r| started.checked_add(r));
    let notify = src.signals.subscribe(name);
    let notified = notify.notified();
    tokio::pin!(notified);
    // Registered before the first look, so a release in this process between the caller's
    // attempt and here is seen either by that look or by the notification.
    notified.as_mut().enable();
    let mut listener = src.listener;
    // The attempt's look is still fresh when nothing was reported since it was sent: no wake of
    // the name (counted before it notifies, and `notified` is enabled above) and no news from the
    // notification source (its receiver was subscribed before the attempt).
    let mut skip_look = false;
    if let Some(f) = src.fresh {
        if f.signal.wakes() != f.wakes {
            return Ok(());
        }
        if let Some(l) = f.listener {
            skip_look = !l.has_changed().unwrap_or(true);
            listener = Some(l);
        } else {
            skip_look = listener.is_none();
        }
    }
    let mut step = 0u32;
    let mut seen: Option<u64> = None;
    let mut poll_min = src.poll.0;
    loop {
        // Mark the listener's news as seen *before* the look, so a change reported while the
        // look runs wakes the waiter again instead of being swallowed.
        let listening = src.listening && listener.as_mut().is_some_and(|l| *l.borrow_and_update());
        if Instant::now() >= until {
            return Ok(());
        }
        if !std::mem::take(&mut skip_look) {
            match still_busy().await? {
                Look::Free => return Ok(()),
                Look::Busy { state, place } => {
                    if seen.is_some_and(|s| s != state) {
                        step = 0;
                    }
                    seen = Some(state);
                    // A fair waiter near the front of the queue polls sooner: the next head
                    // starts at a quarter of the shortest interval, the one behind it at half,
                    // and so on (the waiter at place k at (k + 1) / 4 of it, never above it).
                    poll_min = match place {
                        Some(k) => src
                            .poll
                            .0
                            .mul_f64(((k as f64 + 1.0) / 4.0).min(1.0))
                            .max(Duration::from_millis(1)),
                        None => src.poll.0,
                    };
                }
            }
        }
        let now = Instant::now();
        let mut wake_at = if listening {
            src.safety_poll.map_or(until, |p| until.min(now + p))
        } else {
            now + poll_interval(step, poll_min, src.poll.1)
        };
        step = step.saturating_add(1);
        if let Some(t) = lease_end.filter(|t| *t > now) {
            wake_at = wake_at.min(t);
        }
        wake_at = wake_at.min(until);
        let listener_changed = async {
            match listener.as_mut() {
                Some(l) => {
                    let _ = l.changed().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = &mut notified => return Ok(()),
            _ = listener_changed => {}
            _ = tokio::time::sleep_until(wake_at.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// How many looks a waiter makes in `window` when every look answers busy with what `look`
    /// gives for the look's number.
    async fn looks_in(window: Duration, look: impl Fn(u64) -> Look) -> u64 {
        let signals = NameSignals::default();
        let n = AtomicU64::new(0);
        let src = WaitSources {
            signals: &signals,
            poll: (Duration::from_millis(10), Duration::from_millis(100)),
            listener: None,
            listening: false,
            safety_poll: None,
            fresh: None,
        };
        let busy = Busy { retry_in: None };
        let until = Instant::now() + window;
        wait_for_change(src, "n", &busy, until, || {
            let i = n.fetch_add(1, Ordering::SeqCst);
            let l = look(i);
            async move { Ok(l) }
        })
        .await
        .unwrap();
        n.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_lock_that_changes_hands_keeps_its_waiters_looking_often() {
        let window = Duration::from_millis(500);
        // Nothing moves: the interval backs off towards 100 ms.
        let still = looks_in(window, |_| Look::Busy {
            state: 7,
            place: None,
        })
        .await;
        // The lock changes hands between every two looks: the interval stays at its shortest.
        let moving = looks_in(window, |i| Look::Busy {
            state: i,
            place: None,
        })
        .await;
        assert!(still <= 12, "{still} looks of a lock that did not move");
        assert!(
            moving >= 2 * still,
            "{moving} looks of a moving lock, {still} of a still one"
        );
    }

    #[tokio::test]
    async fn the_next_fair_waiter_looks_sooner_than_those_behind_it() {
        let window = Duration::from_millis(500);
        let moving_at = |place: usize| {
            looks_in(window, move |i| Look::Busy {
                state: i,
                place: Some(place),
            })
        };
        let head = moving_at(0).await;
        let back = moving_at(7).await;
        // The head polls every 2.5–5 ms (100–200 looks), place 7 (like everyone from place 3
        // on) every 10–20 ms (25–50 looks).
        assert!(head >= 60, "{head} looks of the next fair waiter");
        assert!(
            head >= 2 * back,
            "{head} looks of the next fair waiter, {back} of the eighth"
        );
    }
}
