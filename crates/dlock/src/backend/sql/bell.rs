//! A name's bell on MySQL/MariaDB: how a mutex waiter learns of a release without polling, and
//! how a non-fair one is handed the lock.
//!
//! MySQL has no notification, but its user-level locks wake their waiters: `GET_LOCK(str, t)`
//! blocks while another session holds `str`, the server hands it to its waiters one at a time
//! in the order they asked, and a session that ends frees what it held. A name's bell is such a
//! lock ([`bell_key`]) on a connection of its own: a mutex waiter that was refused asks for
//! it and blocks; it gets it when the holder's release frees it, and keeps it while it holds the
//! lock, so that its own release wakes the next waiter. The bell only wakes and orders: who holds
//! the lock is decided by the rows alone, so a bell that is late, lost or held by the wrong
//! session costs at most the waiter's slice (the core re-checks every slice), never a second
//! holder.
//!
//! - A fair waiter asks with a plain `GET_LOCK` and attempts when it gets the bell (after the
//!   release deleted the hold's row).
//! - A non-fair waiter asks in the ring routine ([`Take`]; `fast.rs`), and its hold's release runs
//!   the unring routine on the bell's session ([`Bells::unring`]): the hold becomes a
//!   reservation, the bell is freed, and the ring the server wakes takes the reservation inside
//!   the server and answers the grant ([`Ring::Took`]). So the lock goes to the first waiter in
//!   the bell's line, and nobody can take it in between.
//! - A non-fair hold granted after a refusal but without the bell is released by the same
//!   routine on a pooled connection, which says whether a session holds the bell: then its
//!   client wakes none of its own waiters, and the bell's holder, polling, is next.
//! - A ring withdrawn while it may be taking a hold is interrupted at the server (`KILL QUERY`
//!   on its connection), and a hold it took is released and passed on.
//!
//! - A waiter that gets the bell and is still refused at the front of the queue (the lock is held
//!   by a holder without the bell, one granted before anybody waited) keeps it and polls: it is
//!   the name's one poller, and the waiters behind it stay blocked. A non-fair poller whose look
//!   finds only the fair queue in the way (that hold is gone) passes the bell on: the queue's
//!   head waits for it.
//! - A waiter that gets the bell with others ahead of it in the fair queue passes it on: frees it
//!   and asks again, at the back of the server's line, so that the one ahead is woken. If it comes
//!   straight back with nothing changed (the one ahead is not asking), it is passed again after a
//!   pause that doubles up to [`PASS_PAUSE_MAX`].
//! - A waiter granted the lock while it still asks for the bell (a re-check found the lock free)
//!   keeps asking for its hold: the bell it gets is freed by the hold's release.
//! - A hold's bell is freed by its release, by `expire_in` (the hold is left to expire and never
//!   released), or, for a hold kept past its first lease, by the client's next fair grant that
//!   keeps a bell: a forgotten hold keeps no bell for good.
//! - A backend opens at most [`MAX_BELLS`] bell connections; a waiter that gets none, or whose
//!   connection fails, polls. A reused idle connection that fails (the server closed it) is
//!   replaced by a new one once, and the other idle ones are closed.
//! - An idle bell connection is closed after [`IDLE_FOR`] without use, by a task that runs only
//!   while there are idle ones: a client whose waits are over keeps no connections for them.

use super::server::fnv1a64;
use futures_util::TryStreamExt;
use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, Connection, Row};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// The most bell connections one backend keeps open (asking, held or idle).
pub(super) const MAX_BELLS: usize = 32;
/// How long one `GET_LOCK` waits before it is asked again (a wait slice of the core ends sooner
/// and does not interrupt it).
const ASK_FOR_SECS: i64 = 30;
/// An idle bell connection unused for this long is closed (the server may close it too).
const IDLE_FOR: Duration = Duration::from_secs(60);
/// The first pause before a bell that came straight back is passed on again.
const PASS_PAUSE_MIN: Duration = Duration::from_millis(2);
/// The longest such pause.
pub(super) const PASS_PAUSE_MAX: Duration = Duration::from_millis(64);
/// How long after a refusal a name's waiters attempt in the ring routine.
const BUSY_FOR: Duration = Duration::from_secs(1);
/// The size of the busy names' map below which it is not purged.
const BUSY_PURGE_MIN: usize = 64;

/// The `GET_LOCK` string of `name`'s bell: `<table>!<name>` when that is at most 64 characters
/// (the server's limit), else `<table>!#` and the 16 hex digits of [`fnv1a64`]. It never equals
/// a session-mode lock's string (`<table>:` or `<table>#`; table names are identifiers).
pub(super) fn bell_key(table: &str, name: &str) -> String {
    let direct = format!("{table}!{name}");
    if direct.chars().count() <= 64 {
        direct
    } else {
        format!("{table}!#{:016x}", fnv1a64(table, name))
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A bell connection, counted against [`MAX_BELLS`] while it is open.
struct Line {
    /// In a mutex only to be `Sync` (an acquisition is): it is used through `&mut` alone.
    conn: StdMutex<AnyConnection>,
    /// Its session's id at the server (`CONNECTION_ID()`), to interrupt a ring for a waiter
    /// that left.
    id: i64,
    _permit: OwnedSemaphorePermit,
}

impl Line {
    fn conn(&mut self) -> &mut AnyConnection {
        self.conn.get_mut().unwrap_or_else(|p| p.into_inner())
    }
}

/// A bell held: the connection whose session holds it.
pub(super) struct Bell {
    line: Line,
    key: String,
}

/// What a non-fair mutex waiter takes with its name's bell (the ring routine's arguments
/// besides the bell): the hold its release reserved for the bell's next holder, if any.
pub(super) struct Take {
    pub(super) name: String,
    pub(super) owner: String,
    pub(super) lease_ms: i64,
    pub(super) client_id: String,
    pub(super) host: String,
    pub(super) pid: i64,
    pub(super) value: Option<String>,
    /// The grant routine's `kind`, `permits` and `mode` of the request, for a ring that attempts
    /// first.
    pub(super) kind: &'static str,
    pub(super) permits: i64,
    pub(super) mode: &'static str,
}

/// The answer of the attempt a ring made first ([`Bells::try_ring`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tried {
    /// Granted, with its fencing token; the call ended there, without the bell.
    Granted(u64),
    /// Refused: the shortest live lease in the way ends in this many ms; the call goes on to
    /// the bell.
    Busy(i64),
    /// The grant routine's "full path" answer (the call ended): the waiter takes the full path.
    Full,
    /// No answer (no connection, an error): the waiter attempts the usual way.
    Failed,
}

/// What the ring routine found when it got the bell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ring {
    /// It took the hold reserved for the bell's next holder: its fencing token.
    Took(u64),
    /// Holders that reserved nothing are in the way: the waiter polls with the bell.
    Busy,
    /// Anything else (and every plain request): the waiter attempts.
    Attempt,
}

/// What one request for a bell came to.
pub(super) enum Rung {
    /// Held now, and what the ring found.
    Bell(Bell, Ring),
    /// Not within [`ASK_FOR_SECS`]: ask again.
    Timeout,
    /// No connection, or it failed: poll instead.
    Failed,
}

/// A request for a bell in progress, and its task; dropping it withdraws the request.
pub(super) struct Asking(oneshot::Receiver<Rung>, tokio::task::JoinHandle<()>);

/// Where a waiting mutex acquisition is with its name's bell (and, kept with a hold, where the
/// hold is with it).
pub(super) enum Ringing {
    /// Not asked for yet (or asked for again next).
    Idle,
    /// Asked for; the server answers when it is freed.
    Asking(Asking),
    /// Held.
    Held(Bell),
    /// No bell for this wait: it polls.
    Off,
}

/// A waiting mutex acquisition's bell.
pub(super) struct BellWait {
    pub(super) state: Ringing,
    pub(super) key: String,
    /// A non-fair waiter's: what it takes with the bell (a fair waiter's queue decides its turn,
    /// and its release reserves nothing).
    pub(super) take: Option<Arc<Take>>,
    /// When the current request was sent: a reserved hold it takes has its lease from a later
    /// moment.
    pub(super) asked: Option<Instant>,
    /// The token of the reserved hold its ring took, and when that ring was sent.
    pub(super) taken: Option<(u64, Instant)>,
    /// The look's fingerprint when the bell was last passed on, when, and the pause before it is
    /// passed on again if nothing changed.
    passed: Option<(u64, Instant, Duration)>,
}

impl BellWait {
    pub(super) fn new(key: String, take: Option<Take>) -> BellWait {
        BellWait {
            state: Ringing::Idle,
            key,
            take: take.map(Arc::new),
            asked: None,
            taken: None,
            passed: None,
        }
    }

    /// When the bell, refused with `state` ahead of it, may be passed on (`None`: now).
    pub(super) fn pass_at(&mut self, state: u64) -> Option<Instant> {
        let now = crate::clock::now();
        match self.passed {
            Some((s, at, pause)) if s == state => {
                let next = (pause * 2).min(PASS_PAUSE_MAX);
                self.passed = Some((s, at + pause, next));
                Some(at + pause).filter(|t| *t > now)
            }
            _ => {
                self.passed = Some((state, now, PASS_PAUSE_MIN));
                None
            }
        }
    }
}

/// The bells of one MySQL backend: its bell connections, and the bells of its live holds.
///
/// Not a sqlx pool: a connection that holds a bell must never go back to a pool that would hand
/// it out (or keep it idle) still holding the bell; these connections leave only by
/// `RELEASE_LOCK` or by being closed.
pub(super) struct Bells {
    connect: AnyConnectOptions,
    /// The backend's pool: where a ring for a waiter that left is interrupted.
    pool: sqlx::AnyPool,
    /// The ring routine's call ([`super::fast::ring_call_sql`]).
    ring_call: String,
    /// The unring routine's call ([`super::fast::unring_call_sql`]).
    unring_call: String,
    permits: Arc<Semaphore>,
    idle: StdMutex<Idle>,
    /// How long an idle connection is kept ([`IDLE_FOR`]; tests shorten it).
    idle_for: StdMutex<Duration>,
    /// Holds granted while they held or asked for their name's bell, and non-fair holds granted
    /// without it after a refusal ([`Ringing::Off`]: a waiter of the bell's line may be polling
    /// with it), by owner token, with the end of their first lease and whether their release
    /// reserves the lock (non-fair).
    holds: StdMutex<HashMap<String, (Ringing, Instant, bool)>>,
    /// Names seen busy lately ([`Bells::busy_lately`]).
    busy: StdMutex<Busy>,
}

/// The bell keys of names whose waiters this client saw refused, with when; purged of those
/// older than [`BUSY_FOR`] when it reaches `purge_at` entries.
struct Busy {
    names: HashMap<String, Instant>,
    purge_at: usize,
}

/// The idle bell connections, with when each was put back, and whether the task that closes
/// them is running.
#[derive(Default)]
struct Idle {
    lines: Vec<(Instant, Line)>,
    closing: bool,
}

impl std::fmt::Debug for Bells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bells")
            .field("open", &(MAX_BELLS - self.permits.available_permits()))
            .field("holds", &lock(&self.holds).len())
            .finish()
    }
}

impl Bells {
    pub(super) fn new(connect: AnyConnectOptions, pool: sqlx::AnyPool, table: &str) -> Arc<Bells> {
        Arc::new(Bells {
            connect,
            pool,
            ring_call: super::fast::ring_call_sql(table),
            unring_call: super::fast::unring_call_sql(table),
            permits: Arc::new(Semaphore::new(MAX_BELLS)),
            idle: StdMutex::new(Idle::default()),
            idle_for: StdMutex::new(IDLE_FOR),
            holds: StdMutex::new(HashMap::new()),
            busy: StdMutex::new(Busy {
                names: HashMap::new(),
                purge_at: BUSY_PURGE_MIN,
            }),
        })
    }

    /// An idle bell connection (`true`: reused), or a new one while fewer than [`MAX_BELLS`]
    /// are open.
    async fn line(&self) -> Option<(Line, bool)> {
        let reused = lock(&self.idle).lines.pop();
        if let Some((_, line)) = reused {
            return Some((line, true));
        }
        self.new_line().await.map(|l| (l, false))
    }

    /// A new bell connection, while fewer than [`MAX_BELLS`] are open.
    async fn new_line(&self) -> Option<Line> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        match tokio::time::timeout(
            super::OP_TIMEOUT,
            AnyConnection::connect_with(&self.connect),
        )
        .await
        {
            Ok(Ok(mut conn)) => {
                let id = sqlx::query("SELECT CAST(CONNECTION_ID() AS SIGNED)")
                    .fetch_one(&mut conn)
                    .await
                    .and_then(|r| r.try_get::<i64, _>(0));
                match id {
                    Ok(id) => Some(Line {
                        conn: StdMutex::new(conn),
                        id,
                        _permit: permit,
                    }),
                    Err(e) => {
                        tracing::debug!(error = %e, "no bell connection; the waiter polls");
                        None
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "no bell connection; the waiter polls");
                None
            }
            Err(_) => None,
        }
    }

    /// Keeps a connection that holds no bell for the next wait, and starts the task that closes
    /// idle ones if it is not running.
    fn put_back(self: &Arc<Self>, line: Line) {
        let mut idle = lock(&self.idle);
        idle.lines.push((Instant::now(), line));
        if !std::mem::replace(&mut idle.closing, true) {
            tokio::spawn(close_idle(Arc::downgrade(self)));
        }
    }

    /// Starts asking for the bell `key`; with `take`, in the ring routine, which takes the hold
    /// reserved for the bell's next holder.
    pub(super) fn ask(self: &Arc<Self>, key: String, take: Option<Arc<Take>>) -> Asking {
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(ask(self.clone(), key, take, None, tx));
        Asking(rx, task)
    }

    /// Attempts for `take` in the ring routine, which goes on to ask for the bell `key` when
    /// refused: the attempt's answer, and the request for the bell (over unless the answer is
    /// [`Tried::Busy`]). Dropping both withdraws the request, and releases a hold granted
    /// meanwhile.
    pub(super) fn try_ring(
        self: &Arc<Self>,
        key: String,
        take: Arc<Take>,
    ) -> (oneshot::Receiver<Tried>, Asking) {
        let (first_tx, first) = oneshot::channel();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(ask(self.clone(), key, Some(take), Some(first_tx), tx));
        (first, Asking(rx, task))
    }

    /// Whether this client saw a waiter of the bell `key`'s name refused within [`BUSY_FOR`]:
    /// then its next waiters attempt in the ring routine ([`Bells::try_ring`]).
    pub(super) fn busy_lately(&self, key: &str) -> bool {
        lock(&self.busy)
            .names
            .get(key)
            .is_some_and(|at| at.elapsed() < BUSY_FOR)
    }

    /// A waiter of the bell `key`'s name was refused just now.
    pub(super) fn saw_busy(&self, key: &str) {
        let mut busy = lock(&self.busy);
        let now = Instant::now();
        if let Some(at) = busy.names.get_mut(key) {
            *at = now;
            return;
        }
        if busy.names.len() >= busy.purge_at {
            busy.names.retain(|_, at| at.elapsed() < BUSY_FOR);
            busy.purge_at = (busy.names.len() * 2).max(BUSY_PURGE_MIN);
        }
        busy.names.insert(key.to_owned(), now);
    }

    /// What `owner`'s release needs of its hold's bell, taken from the holds kept here: the bell
    /// when its session holds it (`Some`), or `None` for a non-fair hold granted without it; with
    /// whether the release reserves the lock. `None` for any other hold.
    pub(super) fn take_for_release(&self, owner: &str) -> Option<(Option<Bell>, bool)> {
        let mut holds = lock(&self.holds);
        match holds.get(owner) {
            Some((Ringing::Held(_), _, _)) | Some((Ringing::Off, _, true)) => {}
            _ => return None,
        }
        match holds.remove(owner) {
            Some((Ringing::Held(b), _, reserve)) => Some((Some(b), reserve)),
            Some((_, _, reserve)) => Some((None, reserve)),
            None => None,
        }
    }

    /// `owner`'s release of `name` in the unring routine on the session that holds its bell:
    /// `(released, handed)`. The bell is freed there; on success its connection is kept,
    /// otherwise it is closed (which frees the bell too).
    pub(super) async fn unring(
        self: &Arc<Self>,
        bell: Bell,
        name: &str,
        owner: &str,
        reserve: bool,
    ) -> std::result::Result<(bool, bool), sqlx::Error> {
        let Bell { mut line, key } = bell;
        let r = tokio::time::timeout(
            super::OP_TIMEOUT,
            self.unring_on(line.conn(), &key, name, owner, reserve),
        )
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut));
        if r.is_ok() {
            self.put_back(line);
        }
        r
    }

    /// The release of a non-fair hold granted without its bell `key`, in the unring routine on a
    /// pooled connection: `(released, handed)`, `handed` when a session holds the bell (the head
    /// of its line, which takes the lock at its next look, so this client's own waiters are not
    /// woken to take it back first).
    pub(super) async fn unbelled_release(
        &self,
        key: &str,
        name: &str,
        owner: &str,
    ) -> std::result::Result<(bool, bool), sqlx::Error> {
        self.unring_on(&self.pool, key, name, owner, false).await
    }

    /// The unring routine's call on `on`: `(released, handed)`.
    async fn unring_on<'e, E>(
        &self,
        on: E,
        key: &str,
        name: &str,
        owner: &str,
        reserve: bool,
    ) -> std::result::Result<(bool, bool), sqlx::Error>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        let row = sqlx::query(&self.unring_call)
            .bind(key)
            .bind(name)
            .bind(owner)
            .bind(reserve)
            .fetch_one(on)
            .await?;
        Ok((row.try_get::<i64, _>(0)? > 0, row.try_get::<i64, _>(1)? > 0))
    }

    /// Frees `bell` (the next waiter that asked for it gets it) and keeps its connection.
    pub(super) async fn free(self: &Arc<Self>, mut bell: Bell) {
        let freed = tokio::time::timeout(
            super::OP_TIMEOUT,
            sqlx::query("DO RELEASE_LOCK(?)")
                .bind(bell.key.as_str())
                .execute(bell.line.conn()),
        )
        .await;
        // Otherwise the connection is closed, which frees the bell too.
        if matches!(freed, Ok(Ok(_))) {
            self.put_back(bell.line);
        }
    }

    /// `owner` was granted the lock for `lease` while it held or asked for the bell: the bell is
    /// its hold's until [`Bells::released`]. The bells of holds granted more than a lease ago
    /// are freed here (a hold never released keeps no bell for good; one still renewed only
    /// loses its wake-up: the next waiter polls).
    pub(super) fn granted(
        self: &Arc<Self>,
        owner: &str,
        ringing: Ringing,
        lease: Duration,
        reserve: bool,
    ) {
        let unbelled = reserve && matches!(ringing, Ringing::Off);
        if !(unbelled || matches!(ringing, Ringing::Held(_) | Ringing::Asking(_))) {
            return;
        }
        let now = Instant::now();
        let stale: Vec<Ringing> = {
            let mut holds = lock(&self.holds);
            let old: Vec<String> = holds
                .iter()
                .filter(|(_, (_, until, _))| *until <= now)
                .map(|(o, _)| o.clone())
                .collect();
            holds.insert(owner.to_owned(), (ringing, now + lease, reserve));
            old.iter()
                .filter_map(|o| holds.remove(o).map(|(r, _, _)| r))
                .collect()
        };
        for r in stale {
            self.free_ringing(r);
        }
    }

    /// `owner`'s hold was released, found gone or left to expire: its bell, if any, is freed,
    /// which wakes the next waiter; a request still waiting is withdrawn.
    pub(super) fn released(self: &Arc<Self>, owner: &str) {
        let ringing = lock(&self.holds).remove(owner);
        if let Some((r, _, _)) = ringing {
            self.free_ringing(r);
        }
    }

    /// Frees a hold's bell in the background, or withdraws its request.
    fn free_ringing(self: &Arc<Self>, ringing: Ringing) {
        let bell = match ringing {
            Ringing::Held(b) => b,
            Ringing::Asking(mut a) => match a.0.try_recv() {
                Ok(Rung::Bell(b, _)) => b,
                _ => return,
            },
            _ => return,
        };
        let bells = self.clone();
        tokio::spawn(async move { bells.free(bell).await });
    }

    /// Bell connections open now (asking, held or idle).
    #[cfg(all(test, feature = "mysql"))]
    pub(super) fn open(&self) -> usize {
        MAX_BELLS - self.permits.available_permits()
    }

    /// The server's ids of the idle bell connections (for tests that kill them there). The
    /// lines are out of the idle list while they are asked: a closing task that found the list
    /// empty meanwhile has ended, so one is started again for them.
    #[cfg(all(test, feature = "mysql"))]
    pub(super) async fn idle_ids(self: &Arc<Self>) -> Vec<i64> {
        let mut lines = std::mem::take(&mut lock(&self.idle).lines);
        let mut ids = Vec::new();
        for (_, line) in &mut lines {
            let row = sqlx::query("SELECT CAST(CONNECTION_ID() AS SIGNED)")
                .fetch_one(line.conn())
                .await;
            ids.extend(row.and_then(|r| r.try_get::<i64, _>(0)));
        }
        let mut idle = lock(&self.idle);
        idle.lines.extend(lines);
        if !idle.lines.is_empty() && !std::mem::replace(&mut idle.closing, true) {
            tokio::spawn(close_idle(Arc::downgrade(self)));
        }
        ids
    }

    /// Shortens how long idle connections are kept (tests).
    #[cfg(all(test, feature = "mysql"))]
    pub(super) fn set_idle_for(&self, d: Duration) {
        *lock(&self.idle_for) = d;
    }
}

/// Closes idle bell connections once they have been idle for [`IDLE_FOR`], until none is left
/// (or the backend is gone, which closes them all).
async fn close_idle(bells: std::sync::Weak<Bells>) {
    loop {
        let (expired, next) = {
            let Some(b) = bells.upgrade() else {
                return;
            };
            let idle_for = *lock(&b.idle_for);
            let mut idle = lock(&b.idle);
            let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut idle.lines)
                .into_iter()
                .partition(|(at, _)| at.elapsed() >= idle_for);
            idle.lines = kept;
            let next = idle.lines.iter().map(|(at, _)| *at + idle_for).min();
            if next.is_none() {
                idle.closing = false;
            }
            (expired, next)
        };
        for (_, line) in expired {
            let conn = line.conn.into_inner().unwrap_or_else(|p| p.into_inner());
            let _ = tokio::time::timeout(super::OP_TIMEOUT, conn.close()).await;
        }
        match next {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => return,
        }
    }
}

/// Asks the server for the bell `key` on a bell connection (with `take`: in the ring routine;
/// with `first` too, attempting first and sending the attempt's answer there) and sends what
/// came of it. When nobody waits for the answer any more, a plain request is given up by closing
/// the connection (which withdraws it); a ring is interrupted at the server first (`KILL
/// QUERY`), and a hold it took meanwhile is released and passed on.
async fn ask(
    bells: Arc<Bells>,
    key: String,
    take: Option<Arc<Take>>,
    mut first: Option<oneshot::Sender<Tried>>,
    mut tx: oneshot::Sender<Rung>,
) {
    let Some((mut line, mut reused)) = bells.line().await else {
        if let Some(f) = first {
            let _ = f.send(Tried::Failed);
        }
        let _ = tx.send(Rung::Failed);
        return;
    };
    let secs = match &take {
        // A hold it takes counts its lease from the request: a request is renewed well within
        // the lease.
        Some(t) => (t.lease_ms / 4000).clamp(1, ASK_FOR_SECS),
        None => ASK_FOR_SECS,
    };
    let bound = Duration::from_secs(secs.unsigned_abs()) + super::OP_TIMEOUT;
    let answer = loop {
        let id = line.id;
        let asked = async {
            let q = match &take {
                Some(t) => sqlx::query(&bells.ring_call)
                    .bind(key.as_str())
                    .bind(secs)
                    .bind(t.name.as_str())
                    .bind(t.owner.as_str())
                    .bind(t.lease_ms)
                    .bind(t.client_id.as_str())
                    .bind(t.host.as_str())
                    .bind(t.pid)
                    .bind(t.value.as_deref())
                    .bind(first.is_some())
                    .bind(t.kind)
                    .bind(t.permits)
                    .bind(t.mode),
                None => sqlx::query(
                    "SELECT CAST(COALESCE(GET_LOCK(?, ?), -1) AS SIGNED), \
                     CAST(0 AS SIGNED), CAST(0 AS SIGNED), CAST(0 AS SIGNED)",
                )
                .bind(key.as_str())
                .bind(secs),
            };
            let mut rows = q.fetch(line.conn());
            loop {
                let row = rows.try_next().await?.ok_or_else(|| {
                    sqlx::Error::Protocol("the bell's request answered no row".into())
                })?;
                let (rung, answer, token, wait_ms) = (
                    row.try_get::<i64, _>(0)?,
                    row.try_get::<i64, _>(1)?,
                    row.try_get::<i64, _>(2)?,
                    row.try_get::<i64, _>(3)?,
                );
                if (rung, answer) == (super::fast::TRIED, super::fast::BUSY) {
                    // Refused: that answer now, the bell's when it comes.
                    if let Some(f) = first.take() {
                        let _ = f.send(Tried::Busy(wait_ms));
                    }
                    continue;
                }
                return Ok::<_, sqlx::Error>((rung, answer, token));
            }
        };
        let r = {
            tokio::pin!(asked);
            tokio::select! {
                r = tokio::time::timeout(bound, &mut asked) => Ok(r),
                _ = tx.closed() => {
                    if take.is_none() {
                        return;
                    }
                    // The waiter left while its ring may be taking a hold for it: interrupt
                    // the ring, then see what it came to.
                    let _ = tokio::time::timeout(
                        super::OP_TIMEOUT,
                        sqlx::query(&format!("KILL QUERY {id}")).execute(&bells.pool),
                    )
                    .await;
                    let late = tokio::time::timeout(super::OP_TIMEOUT, &mut asked).await;
                    Err(late.ok().and_then(Result::ok))
                }
            }
        };
        let r = match r {
            Err(Some((_, super::fast::GRANTED, _))) => {
                if let Some(t) = &take {
                    pass_on(&bells, Bell { line, key }, t).await;
                }
                return;
            }
            // An attempt dropped before its answer came, and no answer now (interrupted, or the
            // connection failed): it may have granted a hold before it ended, which nobody
            // knows of. The connection is closed (which frees a bell it got) and the owner's
            // hold released.
            Err(None) if first.is_some() => {
                drop(line);
                if let Some(t) = &take {
                    if let Err(e) = bells.unbelled_release(&key, &t.name, &t.owner).await {
                        tracing::debug!(error = %e, "could not release what a dropped attempt may have taken");
                    }
                }
                return;
            }
            Err(_) => return,
            Ok(r) => r,
        };
        match r {
            Ok(Ok(answer)) => break Some(answer),
            // A reused connection that fails was most likely closed by the server while idle
            // (its `wait_timeout`, a killed connection, a restart), and so were the others idle
            // with it: they are closed, and the bell is asked for on a new connection.
            Ok(Err(e)) if reused => {
                tracing::debug!(error = %e, "an idle bell connection failed; opening another");
                drop(std::mem::take(&mut *lock(&bells.idle)));
                match bells.new_line().await {
                    Some(l) => (line, reused) = (l, false),
                    None => break None,
                }
            }
            Ok(Err(_)) | Err(_) => break None,
        }
    };
    if let Some(f) = first {
        // The attempt's answer ended the call (or there was none).
        let tried = match answer {
            Some((super::fast::TRIED, super::fast::GRANTED, token)) => {
                u64::try_from(token).map_or(Tried::Failed, Tried::Granted)
            }
            Some((super::fast::TRIED, super::fast::FULL, _)) => Tried::Full,
            _ => Tried::Failed,
        };
        let sent = f.send(tried);
        match (answer, take) {
            // Granted to a waiter that left just now: released.
            (Some((_, super::fast::GRANTED, _)), Some(t)) if sent.is_err() => {
                pass_on(&bells, Bell { line, key }, &t).await;
            }
            (Some((super::fast::TRIED, _, _)), _) => bells.put_back(line),
            // Not the attempt's answer: the connection is closed (which frees a bell it got).
            _ => {}
        }
        return;
    }
    match answer {
        Some((1, answer, token)) => {
            let ring = match (answer, u64::try_from(token)) {
                (super::fast::GRANTED, Ok(token)) => Ring::Took(token),
                (super::fast::BUSY, _) => Ring::Busy,
                _ => Ring::Attempt,
            };
            if let Err(Rung::Bell(bell, ring)) = tx.send(Rung::Bell(Bell { line, key }, ring)) {
                match (ring, &take) {
                    // Taken for a waiter that left just now: released and passed on.
                    (Ring::Took(_), Some(t)) => pass_on(&bells, bell, t).await,
                    _ => bells.free(bell).await,
                }
            }
        }
        Some((0, _, _)) => {
            bells.put_back(line);
            let _ = tx.send(Rung::Timeout);
        }
        // NULL (an error in the server, the request killed) or a failed connection.
        _ => {
            let _ = tx.send(Rung::Failed);
        }
    }
}

/// Releases a hold taken for a waiter that left (on the session of `bell`, which that session
/// may hold), passing the lock on to the bell's next holder.
async fn pass_on(bells: &Arc<Bells>, bell: Bell, t: &Take) {
    if let Err(e) = bells.unring(bell, &t.name, &t.owner, true).await {
        tracing::debug!(error = %e, "could not pass on a lock taken for a waiter that left");
    }
}

impl Asking {
    /// The answer, when it comes (a dropped sender counts as a failure).
    pub(super) async fn answer(&mut self) -> Rung {
        (&mut self.0).await.unwrap_or(Rung::Failed)
    }

    /// Withdraws the request and waits until it is over at the server (a ring is interrupted
    /// there, and a hold it took meanwhile is released and passed on).
    pub(super) async fn withdraw(self) {
        let Asking(rx, task) = self;
        drop(rx);
        let _ = tokio::time::timeout(super::OP_TIMEOUT * 2, task).await;
    }
}
