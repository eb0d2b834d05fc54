//! The client: one per store connection, shared by every lock handle made from it. It runs the
//! acquisition loop, the batched renewal watchdog and the in-process wake-ups.

use crate::backend::{
    Attempt, Backend, Capabilities, Extended, Force, Forced, HoldRef, HolderMeta, LockInfo,
    LockKind, Mode, Request, Validity, Wakeups, Want, QUEUE_PLACE_TTL,
};
use crate::error::{Error, Result};
use crate::hold::{Hold, HoldState};
use crate::lock::{Mutex, RwLock, Semaphore};
use crate::name::LockName;
use crate::signal::NameSignals;
use crate::wait::{wait_for_turn, Calls, Waiter};
use rand::Rng;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The default lease of a hold: 30 s, renewed every 10 s while the guard lives.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease dlock accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest lease dlock accepts (a year).
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest a waiter sleeps between attempts on a store with native wake-ups when nothing
/// tells it to try again (a safety net for a lost notification).
const MAX_NATIVE_SLICE: Duration = Duration::from_secs(5);

/// Options for [`connect_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The lease of every hold unless a lock handle sets its own. Default 30 s.
    pub lease: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            lease: DEFAULT_LEASE,
        }
    }
}

impl ClientOptions {
    /// Sets the default lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::InvalidConfig(format!(
            "a lease must be between {MIN_LEASE:?} and {MAX_LEASE:?}, got {lease:?}"
        )));
    }
    Ok(())
}

/// The safety margin subtracted from every guarantee before it is trusted locally: a tenth of it.
/// `lost()` fires at `sent + valid_for - margin`, where `sent` is when the granting or renewing
/// request left this process, so it fires before the store can grant the lock to anyone else as
/// long as the clocks involved drift by less than 10 %.
pub(crate) fn margin(valid_for: Duration) -> Duration {
    valid_for / 10
}

/// A connection to one store. Cheap to clone (clones share the connection, the renewal task and
/// the in-process wake-ups). Make lock handles with [`Client::mutex`], [`Client::rwlock`] and
/// [`Client::semaphore`].
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) meta: HolderMeta,
    pub(crate) url: String,
    pub(crate) lease: Duration,
    caps: Capabilities,
    /// Live holds of this client by owner token, for the watchdog.
    holds: StdMutex<HashMap<String, Weak<Hold>>>,
    /// In-process wake-ups by lock name, shared with the clients of this process on the same
    /// store (see [`Backend::shared_key`]).
    local: Arc<NameSignals>,
    /// Every call to the store goes through this (its timeout).
    pub(crate) calls: Calls,
    /// This client's waiters per lock name, in arrival order (see [`LinePlace`]).
    lines: StdMutex<HashMap<String, Line>>,
    next_waiter: AtomicU64,
    kick: Arc<Notify>,
    /// When the watchdog wakes next, as nanoseconds after `epoch` plus one; 0 while it is
    /// working out its next round (see [`Inner::watchdog_wakes_after`]).
    watchdog_next: AtomicU64,
    epoch: Instant,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.kick.notify_one();
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps behind these mutexes stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Client {
    /// Makes a client over a backend you constructed yourself. Must be called inside a tokio
    /// runtime. `url` is only shown (it is redacted again here).
    pub fn with_backend(
        backend: Arc<dyn Backend>,
        url: impl AsRef<str>,
        options: ClientOptions,
    ) -> Result<Client> {
        check_lease(options.lease)?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidConfig("a dlock client must be created inside a tokio runtime".into())
        })?;
        let caps = backend.capabilities();
        let url = crate::url::redact_url(url.as_ref());
        let local = match backend.shared_key() {
            Some(key) => crate::signal::shared(key),
            None => Arc::new(NameSignals::default()),
        };
        let calls = Calls::new(backend.as_ref(), &url);
        let inner = Arc::new(Inner {
            meta: HolderMeta {
                client_id: uuid::Uuid::new_v4().to_string(),
                host: gethostname::gethostname().to_string_lossy().into_owned(),
                pid: std::process::id(),
            },
            url,
            lease: options.lease,
            caps,
            backend,
            holds: StdMutex::new(HashMap::new()),
            local,
            calls,
            lines: StdMutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(0),
            kick: Arc::new(Notify::new()),
            watchdog_next: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        rt.spawn(watchdog(Arc::downgrade(&inner), inner.kick.clone()));
        Ok(Client { inner })
    }

    /// A mutex handle for `name`. Fails with [`Error::InvalidName`] for a bad name.
    pub fn mutex(&self, name: impl Into<String>) -> Result<Mutex> {
        Ok(Mutex::new(self.clone(), LockName::new(name)?))
    }

    /// A read-write lock handle for `name`.
    pub fn rwlock(&self, name: impl Into<String>) -> Result<RwLock> {
        Ok(RwLock::new(self.clone(), LockName::new(name)?))
    }

    /// A semaphore handle for `name` with `permits` permits (≥ 1). Every user of the name must ask
    /// for the same number; a mismatch is reported as [`Error::InvalidConfig`] while the other
    /// side holds permits.
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Result<Semaphore> {
        let name = LockName::new(name)?;
        if permits == 0 {
            return Err(Error::InvalidConfig(
                "a semaphore needs at least one permit".into(),
            ));
        }
        Ok(Semaphore::new(self.clone(), name, permits))
    }

    /// Holders and known waiters of `name`, or `None` if nobody holds it.
    pub async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = LockName::new(name)?;
        Ok(self
            .inner
            .calls
            .timed(self.inner.backend.describe(name.as_str()))
            .await?
            .into_iter()
            .find(|i| i.name == name.as_str()))
    }

    /// Every held lock whose name starts with `prefix` ("" for all), sorted by name.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        if prefix.contains('\0') {
            return Err(Error::InvalidName("a prefix must not contain NUL".into()));
        }
        self.inner
            .calls
            .timed(self.inner.backend.describe(prefix))
            .await
    }

    /// An administrator's unlock of `name`, whoever holds it. Fencing counters are kept, so
    /// tokens keep increasing.
    ///
    /// - [`Force::Revoke`] (what `dlock unlock --force` does): each live hold's next renewal
    ///   answers that it was revoked, so its holder's `lost()` fires; nobody else is granted the
    ///   name until every revoked holder has released it (dropping or releasing the guard is the
    ///   acknowledgement) or its lease has run out. A hold that nobody renews any more (after
    ///   [`crate::Guard::expire_in`]) is removed at once. Waiters keep their places.
    /// - [`Force::Break`]: every hold and queue place is removed now. A holder that is still
    ///   working learns of it only at its next renewal, so two holders may work at once until
    ///   then.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::Force;
    /// let client = dlock::connect("mem://doc-revoke").await?;
    /// let guard = client.mutex("stuck-job")?.acquire().await?;
    /// let done = client.force_release("stuck-job", Force::Revoke).await?;
    /// assert_eq!(done.revoked, 1);
    /// // Still excluded: the holder has not acknowledged yet.
    /// assert!(client.mutex("stuck-job")?.try_acquire().await.is_err());
    /// drop(guard); // the holder lets go: its acknowledgement
    /// # tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    /// assert!(client.mutex("stuck-job")?.try_acquire().await.is_ok());
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, name: &str, how: Force) -> Result<Forced> {
        let name = LockName::new(name)?;
        let done = self
            .inner
            .calls
            .timed(self.inner.backend.force_release(&name, how))
            .await?;
        self.inner.wake_local(name.as_str());
        Ok(done)
    }

    /// For a store whose holds live with the client's session (ZooKeeper): how long the store
    /// keeps the holds of a client that died, as the server granted it. `None` where each hold's
    /// lease decides.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.inner.backend.session_timeout()
    }

    /// This client's id, stored with every hold it makes.
    pub fn id(&self) -> &str {
        &self.inner.meta.client_id
    }

    /// The store URL with any password redacted.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The backend's short name (`mem`, `sqlite`, ...).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// What the backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// The default lease of this client's holds.
    pub fn default_lease(&self) -> Duration {
        self.inner.lease
    }
}

/// What one acquisition asks for.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub name: LockName,
    pub kind: LockKind,
    pub mode: Mode,
    pub lease: Duration,
    pub renew: bool,
    pub fair: bool,
}

/// How long an acquisition may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    No,
    Until(Instant),
    Forever,
}

/// The waiters of one client for one lock name, in arrival order: (waiter id, its promotion
/// signal). The front is the head.
type Line = VecDeque<(u64, Arc<Promotion>)>;

/// How a waiter learns that it is the head of its line now.
#[derive(Debug, Default)]
struct Promotion {
    notify: Notify,
    /// The head before it left because it was granted the lock exclusively: only that hold's
    /// release (in this client) can let the new head in, so it waits for that instead of
    /// attempting at once.
    after_exclusive_grant: AtomicBool,
    /// This client's wake count of the name when that head left (a release since then moved it).
    wakes_at_grant: AtomicU64,
}

/// A waiter's place in its client's line for one lock name. Only the waiter at the head of the
/// line waits for the store's wake-up (and this client's own releases); the others wait until
/// they reach the head or their own wait slice ends. A release thus costs one attempt per
/// waiting *process*, not one per waiting task (no thundering herd inside a process). Leaving
/// the line (timed out, failed or dropped) hands the head to the next waiter, which attempts at
/// once; a head granted the lock exclusively hands it to a next waiter that first waits for this
/// client's release of the name; a reader of a read-write lock that was granted wakes the whole
/// line, since readers share.
struct LinePlace {
    client: Arc<Inner>,
    name: String,
    id: u64,
    promoted: Arc<Promotion>,
    wake_all: bool,
    granted_exclusive: bool,
}

impl LinePlace {
    /// Joins the back of the client's line for `name`; `true` with it if the line was empty
    /// (this waiter is the head).
    fn join(client: &Arc<Inner>, name: &str) -> (LinePlace, bool) {
        let id = client.next_waiter.fetch_add(1, Ordering::Relaxed);
        let promoted = Arc::new(Promotion::default());
        let head = {
            let mut lines = lock(&client.lines);
            let line = lines.entry(name.to_owned()).or_default();
            line.push_back((id, promoted.clone()));
            line.len() == 1
        };
        let place = LinePlace {
            client: client.clone(),
            name: name.to_owned(),
            id,
            promoted,
            wake_all: false,
            granted_exclusive: false,
        };
        (place, head)
    }

    fn is_head(&self) -> bool {
        lock(&self.client.lines)
            .get(&self.name)
            .and_then(|l| l.front())
            .is_some_and(|(id, _)| *id == self.id)
    }
}

impl Drop for LinePlace {
    fn drop(&mut self) {
        let mut lines = lock(&self.client.lines);
        let Some(line) = lines.get_mut(&self.name) else {
            return;
        };
        let was_head = line.front().is_some_and(|(id, _)| *id == self.id);
        line.retain(|(id, _)| *id != self.id);
        if self.wake_all {
            for (_, n) in line.iter() {
                n.notify.notify_one();
            }
        } else if was_head {
            if let Some((_, n)) = line.front() {
                if self.granted_exclusive {
                    let wakes = self.client.local.subscribe(&self.name).wakes();
                    n.wakes_at_grant.store(wakes, Ordering::SeqCst);
                }
                n.after_exclusive_grant
                    .store(self.granted_exclusive, Ordering::SeqCst);
                n.notify.notify_one();
            }
        }
        if line.is_empty() {
            lines.remove(&self.name);
        }
    }
}

impl Inner {
    /// Whether the watchdog's next wake-up comes after `t` (or is being worked out). A hold
    /// registered before this is asked is always seen: the watchdog marks "working out" before
    /// it reads the holds and publishes its next wake-up after, so either its read includes the
    /// hold, or this sees the mark or a wake-up computed without the hold (then `t` decides).
    fn watchdog_wakes_after(&self, t: Instant) -> bool {
        match self.watchdog_next.load(Ordering::SeqCst) {
            0 => true,
            n => t < self.epoch + Duration::from_nanos(n - 1),
        }
    }

    /// Publishes the watchdog's next wake-up (`None`: working it out).
    fn publish_watchdog_next(&self, next: Option<Instant>) {
        let v = next.map_or(0, |t| {
            u64::try_from(t.saturating_duration_since(self.epoch).as_nanos())
                .unwrap_or(u64::MAX - 1)
                .saturating_add(1)
        });
        self.watchdog_next.store(v, Ordering::SeqCst);
    }

    /// Wakes this client's tasks waiting on `name` (after a release by this client).
    pub(crate) fn wake_local(&self, name: &str) {
        self.local.wake(name);
    }

    pub(crate) fn forget(&self, owner: &str) {
        lock(&self.holds).remove(owner);
    }

    /// The acquisition loop, the same for every store: attempt; if busy, wait for an in-process
    /// release, the store's wake-up, or the moment a blocking lease runs out; attempt again.
    pub(crate) async fn acquire(self: &Arc<Self>, spec: &Spec, wait: Wait) -> Result<Arc<Hold>> {
        use tracing::Instrument;
        let span = tracing::debug_span!("dlock.acquire", name = %spec.name, kind = %spec.kind, mode = spec.mode.as_str());
        self.acquire_inner(spec, wait).instrument(span).await
    }

    async fn acquire_inner(self: &Arc<Self>, spec: &Spec, wait: Wait) -> Result<Arc<Hold>> {
        check_lease(spec.lease)?;
        let owner = uuid::Uuid::new_v4().to_string();
        let req = Request {
            name: &spec.name,
            kind: spec.kind,
            mode: spec.mode,
            owner: &owner,
            lease: spec.lease,
            fair: spec.fair,
            waiting: !matches!(wait, Wait::No),
            meta: &self.meta,
        };
        let started = Instant::now();
        let local = self.local.subscribe(spec.name.as_str());
        let mut waiter = Waiter {
            acq: Some(self.backend.begin(&req)),
            backend: self.backend.clone(),
            want: Want::new(&req),
            calls: self.calls.clone(),
            // Armed once an attempt goes out (a waiter dropped before it asked nothing).
            armed: false,
        };
        let mut line: Option<LinePlace> = None;
        // A waiting mutex request of a client that already has waiters of the name joins their
        // line before its first attempt: while a task of this client waits, that task's attempt
        // (made at once on this client's own release, and on the store's wake-up) is the
        // client's one attempt; a second would only race it — the same grant, twice the store
        // work, and the loser's round trip spent beside the winner's. (Readers and permits
        // share, so they attempt at once.)
        let mut first_in_line = false;
        if spec.kind == LockKind::Mutex
            && !matches!(wait, Wait::No)
            && !req.takes_queue_place()
            && !self.caps.queues_waiters
        {
            let (place, head) = LinePlace::join(self, spec.name.as_str());
            first_in_line = !head;
            line = Some(place);
        }
        loop {
            if std::mem::take(&mut first_in_line) {
                if let Some(place) = line.as_ref() {
                    let mut until = Instant::now() + MAX_NATIVE_SLICE;
                    if let Wait::Until(d) = wait {
                        until = until.min(d);
                    }
                    wait_in_line(place, &local, until).await;
                }
            }
            let notified = local.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            waiter.armed = true;
            let sent = Instant::now();
            let attempt = {
                let calls = self.calls.clone();
                let acq = waiter.acq()?;
                calls.timed(acq.attempt()).await
            };
            let busy = match attempt {
                Ok(Attempt::Granted(g)) => {
                    waiter.armed = false;
                    if let Some(place) = line.as_mut() {
                        place.wake_all = spec.kind == LockKind::RwLock && spec.mode == Mode::Shared;
                        place.granted_exclusive = spec.mode == Mode::Exclusive;
                    }
                    let deadline = sent + g.valid_for.saturating_sub(margin(g.valid_for));
                    let hold = Hold::new(
                        self.clone(),
                        spec,
                        owner.clone(),
                        g.token,
                        deadline,
                        sent + g.valid_for / 3,
                    );
                    lock(&self.holds).insert(owner.clone(), Arc::downgrade(&hold));
                    // Wake the watchdog only if it would otherwise sleep past this hold's first
                    // renewal (each grant of an uncontended loop would wake it for nothing).
                    if self.watchdog_wakes_after((sent + g.valid_for / 3).min(deadline)) {
                        self.kick.notify_one();
                    }
                    metrics::counter!("dlock_acquire_total", "backend" => self.backend.name(), "result" => "granted").increment(1);
                    metrics::histogram!("dlock_acquire_wait_seconds", "backend" => self.backend.name())
                        .record(started.elapsed().as_secs_f64());
                    tracing::debug!(token = ?g.token, waited = ?started.elapsed(), "granted");
                    return Ok(hold);
                }
                Ok(Attempt::Busy(b)) => b,
                Err(e) => {
                    metrics::counter!("dlock_acquire_total", "backend" => self.backend.name(), "result" => "error").increment(1);
                    return Err(e);
                }
            };
            let now = Instant::now();
            let give_up = match wait {
                Wait::No => {
                    waiter.armed = false;
                    metrics::counter!("dlock_acquire_total", "backend" => self.backend.name(), "result" => "busy").increment(1);
                    return Err(Error::Busy {
                        name: spec.name.to_string(),
                    });
                }
                Wait::Until(d) => Some(d),
                Wait::Forever => None,
            };
            if let Some(d) = give_up {
                if now >= d {
                    self.give_up(&mut waiter, &req).await;
                    metrics::counter!("dlock_acquire_total", "backend" => self.backend.name(), "result" => "timeout").increment(1);
                    return Err(Error::Timeout {
                        name: spec.name.to_string(),
                        waited: started.elapsed(),
                    });
                }
            }
            // The slice ends when trying again may succeed without any wake-up: a blocking lease
            // running out (plus a little jitter so waiters do not stampede), the fair queue place
            // needing a refresh, or the caller's deadline.
            let jitter = Duration::from_millis(rand::thread_rng().gen_range(1..=20));
            let mut slice = match busy.retry_in {
                Some(r) => r + jitter,
                None => MAX_NATIVE_SLICE,
            };
            if let Wakeups::Native = self.caps.wakeups {
                slice = slice.min(MAX_NATIVE_SLICE);
            }
            if req.takes_queue_place() && self.caps.validity == Validity::Lease {
                // Repeating the attempt is what keeps a lease store's queue place alive. A session
                // store's places live as long as the session (no refresh needed).
                slice = slice.min(QUEUE_PLACE_TTL / 4);
            }
            let mut until = now + slice;
            if let Some(d) = give_up {
                until = until.min(d);
            }
            // Waiters that keep a place in the store's queue wait each for themselves: their order
            // is the store's. So do the waiters of a store that queues them all (ZooKeeper: each
            // watches its predecessor).
            if !req.takes_queue_place() && !self.caps.queues_waiters {
                let place = line.get_or_insert_with(|| LinePlace::join(self, spec.name.as_str()).0);
                if !place.is_head() {
                    wait_in_line(place, &local, until).await;
                    continue;
                }
            }
            // Releases in this process wake its waiters at once, except where the store queues
            // them: there each waiter watches its predecessor, and the store wakes exactly the
            // one whose turn it is (a local wake would send every waiter of this client back to
            // the store for nothing).
            let local_wakes = !self.caps.queues_waiters;
            let calls = self.calls.clone();
            let acq = waiter.acq()?;
            tokio::select! {
                _ = &mut notified, if local_wakes => {}
                r = wait_for_turn(acq, &calls, &busy, until) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "store wait failed; trying again");
                        tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(50)).into()).await;
                    }
                }
            }
        }
    }

    /// A waiter gives up: its queue place goes, and in this process the waiters behind it may
    /// now be first.
    async fn give_up(&self, waiter: &mut Waiter, req: &Request<'_>) {
        if let Some(mut acq) = waiter.acq.take() {
            let _ = self.calls.timed(acq.cancel()).await;
        }
        waiter.armed = false;
        if req.takes_queue_place() {
            self.wake_local(req.name.as_str());
        }
    }
}

/// Waits, behind the head of this client's line, until this waiter is the head (or `until`).
/// Promoted right after the head was granted the lock exclusively, it then also waits for that
/// hold's release by this client: an attempt before it would be refused.
async fn wait_in_line(place: &LinePlace, local: &crate::signal::NameSignal, until: Instant) {
    let promoted = place.promoted.clone();
    tokio::select! {
        _ = promoted.notify.notified() => {}
        _ = tokio::time::sleep_until(until.into()) => {}
    }
    if promoted.after_exclusive_grant.swap(false, Ordering::SeqCst) {
        // Unless the wake count says the release happened already; a hold lost without a
        // release is covered by `until`.
        let released = local.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if local.wakes() == promoted.wakes_at_grant.load(Ordering::SeqCst) {
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

/// The renewal watchdog of one client: wakes when the earliest hold is due, renews every hold
/// that is due (or nearly due) in **one** `extend` call, and fires `lost()` on holds the store no
/// longer has or whose local deadline passed. Exits when the client is dropped.
async fn watchdog(client: Weak<Inner>, kick: Arc<Notify>) {
    loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        inner.publish_watchdog_next(None);
        let next = renew_due(&inner).await;
        inner.publish_watchdog_next(Some(next));
        drop(inner);
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = kick.notified() => {}
        }
    }
}

/// One watchdog round; returns when the next round is due.
async fn renew_due(inner: &Arc<Inner>) -> Instant {
    let now = Instant::now();
    let mut next = now + Duration::from_secs(3600);
    let mut batch: Vec<Arc<Hold>> = Vec::new();
    let mut nearly: Vec<Arc<Hold>> = Vec::new();
    let mut due = false;
    let holds: Vec<Arc<Hold>> = {
        let mut map = lock(&inner.holds);
        map.retain(|_, w| w.strong_count() > 0);
        map.values().filter_map(Weak::upgrade).collect()
    };
    for h in holds {
        match h.state() {
            HoldState::Held { deadline, renew_at } => {
                if now >= deadline {
                    h.lease_ran_out("the lease ran out before it could be renewed");
                    inner.forget(&h.owner);
                    continue;
                }
                next = next.min(deadline);
                if h.renews() {
                    if renew_at <= now {
                        due = true;
                        batch.push(h);
                    } else {
                        next = next.min(renew_at);
                        // Due within the next sixth of its lease: rides along if a batch goes out.
                        if renew_at <= now + h.lease / 6 {
                            nearly.push(h);
                        }
                    }
                }
            }
            // A revoked hold of a session store stays until its guards release it, or until
            // its lease would have run out: then it is ended here.
            HoldState::Lost(_) => match h.end_at() {
                Some(at) if at > now => next = next.min(at),
                Some(_) => {
                    h.end_in_background();
                    inner.forget(&h.owner);
                }
                None => inner.forget(&h.owner),
            },
            HoldState::Released => inner.forget(&h.owner),
        }
    }
    if !due {
        return next;
    }
    batch.append(&mut nearly);
    // Most urgent first; at most RENEW_BATCH holds per `extend` call and RENEW_IN_FLIGHT calls at
    // once, so one slow or huge batch (tens of thousands of holds) neither outlasts the lease of
    // all of them nor opens more connections.
    batch.sort_by_key(|h| match h.state() {
        HoldState::Held { deadline, .. } => deadline,
        _ => now,
    });
    use futures_util::stream::StreamExt;
    futures_util::stream::iter(batch.chunks(RENEW_BATCH))
        .for_each_concurrent(RENEW_IN_FLIGHT, |chunk| renew_chunk(inner, chunk))
        .await;
    Instant::now()
}

/// The most holds the watchdog puts in one [`Backend::extend`] call.
pub(crate) const RENEW_BATCH: usize = 500;
/// How many `extend` calls of one watchdog round may be in flight at once.
const RENEW_IN_FLIGHT: usize = 4;

/// Renews one batch of holds in one `extend` call and applies the answers.
async fn renew_chunk(inner: &Arc<Inner>, batch: &[Arc<Hold>]) {
    let now = Instant::now();
    let refs: Vec<HoldRef<'_>> = batch.iter().map(|h| h.as_ref_with(h.lease)).collect();
    let earliest = batch
        .iter()
        .filter_map(|h| match h.state() {
            HoldState::Held { deadline, .. } => Some(deadline),
            _ => None,
        })
        .min()
        .unwrap_or(now + Duration::from_secs(1));
    let span = tracing::debug_span!("dlock.renew", holds = refs.len());
    let sent = Instant::now();
    let result = {
        use tracing::Instrument;
        let bound = match inner.calls.timeout() {
            Some(d) => earliest.min(Instant::now() + d),
            None => earliest,
        };
        tokio::time::timeout_at(bound.into(), inner.backend.extend(&refs))
            .instrument(span)
            .await
    };
    metrics::counter!("dlock_renew_batches_total", "backend" => inner.backend.name()).increment(1);
    match result {
        Ok(Ok(answers)) if answers.len() == batch.len() => {
            for (h, a) in batch.iter().zip(answers) {
                match a {
                    Extended::Held { valid_for } => h.confirmed(
                        sent + valid_for.saturating_sub(margin(valid_for)),
                        sent + valid_for / 3,
                    ),
                    Extended::Gone => {
                        h.mark_lost(
                            "the store no longer has this hold (expired, removed or taken over)",
                        );
                        inner.forget(&h.owner);
                    }
                    Extended::Revoked => {
                        // The store keeps others out until this hold is released: the guard's
                        // release (or drop) is the holder's acknowledgement. A lease store ends
                        // it at its lease anyway; a session store would keep it while the
                        // session lives, so the watchdog ends it when the lease would have.
                        let deadline = match h.state() {
                            HoldState::Held { deadline, .. } => Some(deadline),
                            _ => None,
                        };
                        h.mark_lost(
                            "the lock was revoked by a forced unlock; others are kept out until \
                             this holder lets go or its lease runs out",
                        );
                        match deadline {
                            Some(d) if inner.caps.validity == Validity::Session => {
                                h.end_at_latest(d + margin(h.lease));
                            }
                            _ => inner.forget(&h.owner),
                        }
                    }
                }
            }
        }
        other => {
            let why = match other {
                Ok(Ok(_)) => {
                    "the store answered a renewal with the wrong number of results".to_string()
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "renewal did not finish before the lease deadline".to_string(),
            };
            tracing::warn!(error = %why, holds = batch.len(), "renewal failed; retrying until the lease deadline");
            for h in batch {
                // Retry soon, but never later than the deadline allows.
                h.retry_renewal_at(Instant::now() + (h.lease / 10).min(Duration::from_secs(1)));
            }
        }
    }
}
