//! What the SQL stores share: SQLite (`sqlite/`) and PostgreSQL/MySQL (`server.rs`,
//! `session.rs`) keep the same rows (holds, queue places, fences), so they grant in one
//! transaction ([`grant`]), read rows, keep fair queue places and list locks in one way. Each
//! store keeps only its statements, its connections and its error mapping.

use crate::backend::logic::{decide, Decision, LiveHold, LiveWaiter};
use crate::backend::*;
use crate::error::Error;
use std::hash::{Hash, Hasher};

/// A queue place is rewritten by a repeated `attempt` only once it is at least this old, so a
/// polling fair waiter does not cost a (synced) write on every attempt. Waiters repeat `attempt`
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
    placeholders("(?, ?)", n)
}

/// `n` times `one` (a placeholder or a row of them), comma-separated.
pub(crate) fn placeholders(one: &str, n: usize) -> String {
    vec![one; n].join(", ")
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
/// pid, value` (`value` NULL for a plain lock).
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
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
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
        .bind(req.meta.value.as_deref())
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

    /// The `client_id`, `host`, `pid` and (holds only) `value` columns.
    fn meta(
        self,
        client_id: String,
        host: String,
        pid: i64,
        value: Option<String>,
    ) -> Result<HolderMeta> {
        Ok(HolderMeta {
            client_id,
            host,
            pid: self.pid(pid)?,
            value,
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
/// client_id, host, pid, state, value`.
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
    Option<String>,
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

    /// A waiter's look at `now` (the acquisition's look; the fence only matters for the token of a grant,
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
    for (
        name,
        owner,
        kind,
        permits,
        mode,
        fence,
        expires,
        acquired,
        client_id,
        host,
        pid,
        state,
        value,
    ) in holds
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
            meta: rows.meta(client_id, host, pid, value)?,
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
            meta: rows.meta(client_id, host, pid, None)?,
            mode: rows.mode(&mode)?,
            position,
        });
    }
    Ok(locks.into_values().collect())
}

/// An error inside a transaction: SQL errors (some of which a store retries) told apart from
/// dlock's own.
pub(crate) enum TxError {
    Sql(sqlx::Error),
    Dlock(Error),
}

impl From<sqlx::Error> for TxError {
    fn from(e: sqlx::Error) -> Self {
        TxError::Sql(e)
    }
}

impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Dlock(e)
    }
}

/// The writes of a grant decision, in one store's SQL, inside its transaction.
#[async_trait::async_trait]
pub(crate) trait GrantWrites: Send {
    /// Moves the expiry of `owner`'s hold of `name` (a re-grant).
    async fn regrant(
        &mut self,
        name: &str,
        owner: &str,
        expires_ms: i64,
    ) -> Result<(), sqlx::Error>;
    /// Stores the name's new fence (`stored`: whether it had a fence row before).
    async fn set_fence(&mut self, name: &str, fence: i64, stored: bool) -> Result<(), sqlx::Error>;
    /// Removes `owner`'s queue place of `name`.
    async fn drop_place(&mut self, name: &str, owner: &str) -> Result<(), sqlx::Error>;
    /// Inserts the hold of `req` with fence `fence`, granted at `now`.
    async fn insert_hold(
        &mut self,
        req: &Request<'_>,
        fence: i64,
        now: i64,
    ) -> Result<(), sqlx::Error>;
    /// Moves the expiry of `owner`'s queue place of `name`.
    async fn refresh_place(
        &mut self,
        name: &str,
        owner: &str,
        expires_ms: i64,
    ) -> Result<(), sqlx::Error>;
    /// Inserts a queue place for `req`.
    async fn insert_place(&mut self, req: &Request<'_>, expires_ms: i64)
        -> Result<(), sqlx::Error>;
}

/// Decides `req` against `state` (at `now`, the stored fence `stored`) and writes the decision
/// with `w`: the one grant transaction of the SQL stores and SQLite. Answers the attempt and
/// whether anything was written (a refusal that wrote nothing can roll back).
pub(crate) async fn grant(
    w: &mut impl GrantWrites,
    state: &NameState,
    req: &Request<'_>,
    stored: Option<u64>,
    now: i64,
) -> Result<(Attempt, bool), TxError> {
    let name = req.name.as_str();
    let fence = state.fence(stored);
    Ok(match state.decide(req, fence, now)? {
        Decision::Regrant { token } => {
            w.regrant(name, req.owner, expiry(now, req.lease)).await?;
            let grant = Grant {
                token,
                valid_for: req.lease,
            };
            (Attempt::Granted(grant), true)
        }
        Decision::Grant { token } => {
            let token_i64 = fence_column(name, token)?;
            w.set_fence(name, token_i64, stored.is_some()).await?;
            if state.queue.iter().any(|q| q.owner == req.owner) {
                w.drop_place(name, req.owner).await?;
            }
            w.insert_hold(req, token_i64, now).await?;
            let grant = Grant {
                token: Some(token),
                valid_for: req.lease,
            };
            (Attempt::Granted(grant), true)
        }
        Decision::Busy { retry_in, enqueue } => {
            let wrote = match state.queue_place(req.owner, enqueue, now) {
                QueuePlace::Keep => false,
                QueuePlace::Refresh { expires_at_ms } => {
                    w.refresh_place(name, req.owner, expires_at_ms).await?;
                    true
                }
                QueuePlace::Insert { expires_at_ms } => {
                    w.insert_place(req, expires_at_ms).await?;
                    true
                }
            };
            (Attempt::Busy(Busy { retry_in }), wrote)
        }
    })
}

/// The decoders of rows, for the fuzz targets (`dlock::__fuzz`; not API).
#[cfg(feature = "__fuzz")]
pub(crate) mod fuzz {
    use super::*;

    /// One row of a name's state as the one-statement read gives it (see [`StateRow`]).
    pub type StateRow = super::StateRow;
    /// A hold row as `describe` lists it (see [`HoldListing`]).
    pub type HoldListing = super::HoldListing;
    /// A queue row as `describe` lists it (see [`WaiterListing`]).
    pub type WaiterListing = super::WaiterListing;

    /// A live hold as the grant rule reads it: owner, kind, mode, token.
    pub type Hold = (String, LockKind, Mode, u64);

    /// A name's rows at `now` as the grant rule reads them: the live holds, the live queue
    /// (owner, mode) and the stored fence; `Err` when a live row holds a value no dlock writes.
    #[allow(clippy::type_complexity)]
    pub fn load(
        rows: Vec<StateRow>,
        now: i64,
    ) -> Result<(Vec<Hold>, Vec<(String, Mode)>, Option<i64>)> {
        let l = Loaded::split(Rows("fuzz"), rows, now)?;
        Ok((
            l.state
                .holds
                .into_iter()
                .map(|h| (h.owner, h.kind, h.mode, h.token))
                .collect(),
            l.state
                .queue
                .into_iter()
                .map(|w| (w.owner, w.mode))
                .collect(),
            l.fence,
        ))
    }

    /// `describe`'s answer built from listed rows.
    pub fn listing(
        prefix: &str,
        now: i64,
        holds: Vec<HoldListing>,
        queue: Vec<WaiterListing>,
    ) -> Result<Vec<LockInfo>> {
        super::listing(Rows("fuzz"), prefix, now, holds, queue)
    }

    /// The `kind` and `permits` columns dlock writes for `kind`.
    pub fn kind_columns(kind: LockKind) -> (&'static str, i64) {
        super::kind_columns(kind)
    }

    /// The `state` column dlock writes for `status`.
    pub fn state_column(status: HoldStatus) -> i64 {
        match status {
            HoldStatus::Held => STATE_HELD,
            HoldStatus::Detached => STATE_DETACHED,
            HoldStatus::Revoked => STATE_REVOKED,
        }
    }

    /// A PostgreSQL hand-off notification's token, owner and lock name.
    #[cfg(feature = "postgres")]
    pub fn parse_handed(payload: &str) -> Option<(u64, &str, &str)> {
        super::super::server::parse_handed(payload)
    }
}
