//! The client: one per store connection, shared by every lock handle made from it, and the
//! acquisition loop that every handle's acquire runs.

use super::hold::{Hold, Store};
use super::line::{wait_in_line, LinePlace, Lines};
use super::rules::{check_lease, margin, ClientOptions, Outage, Spec, Wait};
use super::wait::{wait_for_turn, Calls, Waiter};
use super::watchdog::{watchdog, Schedule};
use crate::backend::{
    Attempt, Backend, Capabilities, Force, Forced, HoldRef, HolderMeta, LockInfo, LockKind, Mode,
    Request, Validity, Wakeups, Want, QUEUE_PLACE_TTL,
};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::signal::NameSignals;
use std::sync::Arc;
use std::time::Duration;

/// The longest a waiter sleeps between attempts on a store with native wake-ups when nothing
/// tells it to try again (a safety net for a lost notification).
const MAX_NATIVE_SLICE: Duration = Duration::from_secs(5);

/// A connection to one store. Cheap to clone (clones share the connection, the renewal task and
/// the in-process wake-ups). Make lock handles with [`Client::mutex`], [`Client::rwlock`] and
/// [`Client::semaphore`].
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    /// The store and what this client's holds share.
    pub(crate) store: Arc<Store>,
    pub(crate) meta: HolderMeta,
    pub(crate) url: String,
    pub(crate) lease: Duration,
    /// This client's waiters per lock name, in arrival order.
    lines: Arc<Lines>,
    schedule: Arc<Schedule>,
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
        let store = Arc::new(Store::new(
            backend,
            caps,
            calls,
            local,
            options.metrics_name_label,
        ));
        let schedule = Arc::new(Schedule::new());
        rt.spawn(watchdog(Arc::downgrade(&store), schedule.clone()));
        let inner = Arc::new(Inner {
            meta: HolderMeta {
                client_id: uuid::Uuid::new_v4().to_string(),
                host: gethostname::gethostname().to_string_lossy().into_owned(),
                pid: std::process::id(),
                value: None,
            },
            store,
            url,
            lease: options.lease,
            lines: Arc::default(),
            schedule,
        });
        Ok(Client { inner })
    }

    /// Holders and known waiters of `name`, or `None` if nobody holds it.
    pub async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = LockName::new(name)?;
        Ok(self
            .inner
            .store
            .calls
            .timed_listing(self.inner.store.backend.describe(name.as_str()))
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
            .store
            .calls
            .timed_listing(self.inner.store.backend.describe(prefix))
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
            .store
            .calls
            .timed(self.inner.store.backend.force_release(&name, how))
            .await?;
        self.inner.store.wake_local(name.as_str());
        Ok(done)
    }

    /// For a store whose holds live with the client's session (ZooKeeper): how long the store
    /// keeps the holds of a client that died, as the server granted it. `None` where each hold's
    /// lease decides.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.inner.store.backend.session_timeout()
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
        self.inner.store.backend.name()
    }

    /// What the backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.store.caps
    }

    /// The default lease of this client's holds.
    pub fn default_lease(&self) -> Duration {
        self.inner.lease
    }
}

impl Inner {
    /// The acquisition loop, the same for every store: attempt; if busy, wait for an in-process
    /// release, the store's wake-up, or the moment a blocking lease runs out; attempt again.
    pub(crate) async fn acquire(self: &Arc<Self>, spec: &Spec, wait: Wait) -> Result<Arc<Hold>> {
        use tracing::Instrument;
        // `waited` and `token` are recorded at the grant.
        let span = tracing::debug_span!(
            "dlock.acquire",
            name = %spec.name,
            store = self.store.backend.name(),
            kind = %spec.kind,
            mode = spec.mode.as_str(),
            waited = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        self.acquire_inner(spec, wait, &span)
            .instrument(span.clone())
            .await
    }

    async fn acquire_inner(
        self: &Arc<Self>,
        spec: &Spec,
        wait: Wait,
        span: &tracing::Span,
    ) -> Result<Arc<Hold>> {
        use super::metrics::{ACQUIRE_BUSY_TOTAL, ACQUIRE_TOTAL, ACQUIRE_WAIT_SECONDS};
        check_lease(spec.lease)?;
        let owner = uuid::Uuid::new_v4().to_string();
        let valued;
        let meta = match &spec.value {
            None => &self.meta,
            Some(v) => {
                valued = HolderMeta {
                    value: Some(v.clone()),
                    ..self.meta.clone()
                };
                &valued
            }
        };
        let req = Request {
            name: &spec.name,
            kind: spec.kind,
            mode: spec.mode,
            owner: &owner,
            lease: spec.lease,
            fair: spec.fair,
            waiting: !matches!(wait, Wait::No),
            meta,
        };
        let started = crate::clock::now();
        // This client's own releases and cancels of the name still running in the background
        // finish first (each is one bounded call), so that it does not meet its own leftovers.
        let settle_bound = self
            .store
            .calls
            .timeout()
            .map_or(MAX_NATIVE_SLICE, |t| t.saturating_mul(2));
        self.store
            .settling
            .settled(spec.name.as_str(), started + settle_bound)
            .await;
        let local = self.store.local.subscribe(spec.name.as_str());
        let mut waiter = Waiter {
            acq: Some(self.store.backend.begin(&req)),
            backend: self.store.backend.clone(),
            want: Want::new(&req),
            calls: self.store.calls.clone(),
            // Armed once an attempt goes out (a waiter dropped before it asked nothing).
            armed: false,
            settling: self.store.settling.clone(),
        };
        let mut line: Option<LinePlace> = None;
        // Counted in `dlock_waiters` from the first busy answer of a waiting acquisition until
        // it ends (a dropped future too).
        let mut waiting: Option<super::metrics::Waiting> = None;
        // A waiting mutex request of a client that already has waiters of the name joins their
        // line before its first attempt: while a task of this client waits, that task's attempt
        // (made at once on this client's own release, and on the store's wake-up) is the
        // client's one attempt; a second would only race it — the same grant, twice the store
        // work, and the loser's round trip spent beside the winner's. (Readers and permits
        // share, so they attempt at once.)
        let mut first_in_line = false;
        let mut outage = Outage::default();
        if spec.kind == LockKind::Mutex
            && !matches!(wait, Wait::No)
            && !req.takes_queue_place()
            && !self.store.caps.queues_waiters
        {
            let (place, head) = LinePlace::join(&self.lines, &self.store.local, spec.name.as_str());
            first_in_line = !head;
            line = Some(place);
        }
        loop {
            if std::mem::take(&mut first_in_line) {
                // Behind this client's other waiters of the name: waiting already.
                waiting = Some(self.store.waiting(&spec.name));
                if let Some(place) = line.as_ref() {
                    let mut until = crate::clock::now() + MAX_NATIVE_SLICE;
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
            let sent = crate::clock::now();
            let attempt = {
                let calls = self.store.calls.clone();
                let head = line.as_ref().map_or(true, LinePlace::is_head);
                let acq = waiter.acq()?;
                acq.may_register(head);
                calls.timed(acq.attempt()).await
            };
            let busy = match attempt {
                Ok(Attempt::Granted(g)) => {
                    waiter.armed = false;
                    let deadline = sent + g.valid_for.saturating_sub(margin(g.valid_for));
                    if crate::clock::now() >= deadline {
                        // The answer came after the hold could be trusted (a slow reply, a
                        // paused client): it is given back, and the acquisition goes on as if
                        // the store had been unavailable. The release is awaited: a later
                        // attempt is made by the same owner.
                        let late = HoldRef {
                            name: &spec.name,
                            kind: spec.kind,
                            mode: spec.mode,
                            owner: owner.as_str(),
                            lease: spec.lease,
                        };
                        if let Err(e) = self
                            .store
                            .calls
                            .timed(self.store.backend.release(&late))
                            .await
                        {
                            tracing::debug!(error = %e, "releasing a grant that came too late");
                        }
                        let e = Error::Unavailable(format!(
                            "the grant of {:?} arrived {:?} after it was asked for, past the \
                             {:?} it could be trusted; it was given back",
                            spec.name.as_str(),
                            crate::clock::elapsed(sent),
                            deadline.saturating_duration_since(sent)
                        ));
                        if let Some(pause) = outage.pause(&e, wait) {
                            tracing::debug!(error = %e, ?pause, "trying again");
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                        return Err(e);
                    }
                    if let Some(place) = line.as_mut() {
                        place.wake_all = spec.kind == LockKind::RwLock && spec.mode == Mode::Shared;
                        // The next waiter of this client waits for this hold's release here,
                        // unless the store hands the lock on: then it registers in the store now.
                        place.granted_exclusive = spec.mode == Mode::Exclusive
                            && !(self.store.caps.hands_off && spec.kind == LockKind::Mutex);
                    }
                    let hold = Hold::new(
                        self.store.clone(),
                        spec,
                        owner.clone(),
                        g.token,
                        deadline,
                        sent + g.valid_for / 3,
                    );
                    self.store.keep(&hold);
                    // Wake the watchdog only if it would otherwise sleep past this hold's first
                    // renewal (each grant of an uncontended loop would wake it for nothing).
                    let first = (sent + g.valid_for / 3).min(deadline);
                    if self.schedule.wakes_after(first) {
                        self.schedule.ask(first);
                        self.store.kick.notify_one();
                    }
                    let waited = crate::clock::elapsed(started);
                    metrics::counter!(
                        ACQUIRE_TOTAL,
                        self.store.labels(&spec.name, Some(("result", "granted")))
                    )
                    .increment(1);
                    metrics::histogram!(ACQUIRE_WAIT_SECONDS, self.store.labels(&spec.name, None))
                        .record(waited.as_secs_f64());
                    span.record("waited", tracing::field::debug(waited));
                    if let Some(t) = g.token {
                        span.record("token", t);
                    }
                    tracing::debug!(token = ?g.token, ?waited, "granted");
                    return Ok(hold);
                }
                Ok(Attempt::Busy(b)) => {
                    metrics::counter!(ACQUIRE_BUSY_TOTAL, self.store.labels(&spec.name, None))
                        .increment(1);
                    b
                }
                Err(e) => {
                    // A passing refusal while the caller waits: tried again after a pause,
                    // reported only when the caller's patience is spent.
                    if let Some(pause) = outage.pause(&e, wait) {
                        tracing::debug!(error = %e, ?pause, "store unavailable; trying again");
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                    metrics::counter!(
                        ACQUIRE_TOTAL,
                        self.store.labels(&spec.name, Some(("result", "error")))
                    )
                    .increment(1);
                    return Err(e);
                }
            };
            outage = Outage::default();
            let now = crate::clock::now();
            let give_up = match wait {
                Wait::No => {
                    waiter.armed = false;
                    metrics::counter!(
                        ACQUIRE_TOTAL,
                        self.store.labels(&spec.name, Some(("result", "busy")))
                    )
                    .increment(1);
                    return Err(Error::Busy {
                        name: spec.name.to_string(),
                    });
                }
                Wait::Until(d) => Some(d),
                Wait::Forever => None,
            };
            if waiting.is_none() {
                waiting = Some(self.store.waiting(&spec.name));
            }
            if let Some(d) = give_up {
                if now >= d {
                    self.give_up(&mut waiter, &req).await;
                    metrics::counter!(
                        ACQUIRE_TOTAL,
                        self.store.labels(&spec.name, Some(("result", "timeout")))
                    )
                    .increment(1);
                    return Err(Error::Timeout {
                        name: spec.name.to_string(),
                        waited: crate::clock::elapsed(started),
                    });
                }
            }
            // The slice ends when trying again may succeed without any wake-up: a blocking lease
            // running out (plus a little jitter so waiters do not stampede), the fair queue place
            // needing a refresh, or the caller's deadline.
            let jitter = Duration::from_millis(crate::clock::gen_range(1..=20));
            let mut slice = match busy.retry_in {
                Some(r) => r + jitter,
                None => MAX_NATIVE_SLICE,
            };
            if let Wakeups::Native = self.store.caps.wakeups {
                slice = slice.min(MAX_NATIVE_SLICE);
            }
            if req.takes_queue_place() && self.store.caps.validity == Validity::Lease {
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
            if !req.takes_queue_place() && !self.store.caps.queues_waiters {
                let place = line.get_or_insert_with(|| {
                    LinePlace::join(&self.lines, &self.store.local, spec.name.as_str()).0
                });
                if !place.is_head() {
                    wait_in_line(place, &local, until).await;
                    continue;
                }
            }
            // Releases in this process wake its waiters at once, except where the store queues
            // them: there each waiter watches its predecessor, and the store wakes exactly the
            // one whose turn it is (a local wake would send every waiter of this client back to
            // the store for nothing).
            let local_wakes = !self.store.caps.queues_waiters;
            let calls = self.store.calls.clone();
            let acq = waiter.acq()?;
            tokio::select! {
                biased; // deterministic under a seeded simulation (tests/simulation.rs)
                _ = &mut notified, if local_wakes => {}
                r = wait_for_turn(acq, &calls, &busy, until) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "store wait failed; trying again");
                        tokio::time::sleep_until(until.min(crate::clock::now() + Duration::from_millis(50)).into()).await;
                    }
                }
            }
        }
    }

    /// A waiter gives up: its queue place goes, and in this process the waiters behind it may
    /// now be first.
    async fn give_up(&self, waiter: &mut Waiter, req: &Request<'_>) {
        if let Some(mut acq) = waiter.acq.take() {
            let _ = self.store.calls.timed(acq.cancel()).await;
        }
        waiter.armed = false;
        if req.takes_queue_place() {
            self.store.wake_local(req.name.as_str());
        }
    }
}
