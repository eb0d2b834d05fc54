//! Lock handles ([`Mutex`], [`RwLock`], [`Semaphore`]) and the [`Guard`] of a hold.

use super::client::Client;
use super::hold::{Hold, HoldState};
use super::rules::{check_lease, margin, Spec, Wait, MAX_LEASE};
use crate::backend::{Extended, LockKind, Mode, Released, Validity};
use crate::error::{Error, Result};
use crate::name::LockName;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, SystemTime};

/// Settings and identity shared by the three handle types.
#[derive(Debug, Clone)]
struct Core {
    client: Client,
    name: LockName,
    lease: Duration,
    renew: bool,
    fair: bool,
    /// The hold this handle currently has, for reentrancy. Clones of a handle share it.
    current: Arc<StdMutex<Weak<Hold>>>,
}

impl Core {
    fn new(client: Client, name: LockName) -> Core {
        let lease = client.inner.lease;
        Core {
            client,
            name,
            lease,
            renew: true,
            fair: false,
            current: Arc::new(StdMutex::new(Weak::new())),
        }
    }

    fn current(&self) -> Option<Arc<Hold>> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade()
    }

    fn spec(&self, kind: LockKind, mode: Mode) -> Spec {
        Spec {
            name: self.name.clone(),
            kind,
            mode,
            lease: self.lease,
            renew: self.renew,
            fair: self.fair,
            value: None,
        }
    }

    /// Reentrant when this handle holds already; otherwise a new hold.
    async fn acquire(
        &self,
        kind: LockKind,
        mode: Mode,
        wait: Wait,
        reentrant: bool,
    ) -> Result<Guard> {
        check_lease(self.lease)?;
        if reentrant {
            if let Some(h) = self.current() {
                if h.mode == Mode::Shared && mode == Mode::Exclusive && h.is_held() {
                    return Err(Error::Unsupported(format!(
                        "lock {:?}: this handle holds it for reading; upgrading to writing would deadlock (release the read guard first)",
                        self.name.as_str()
                    )));
                }
                if h.try_reenter() {
                    return Ok(Guard::new(h));
                }
            }
        }
        let hold = self
            .client
            .inner
            .acquire(&self.spec(kind, mode), wait)
            .await?;
        if reentrant {
            *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(&hold);
        }
        Ok(Guard::new(hold))
    }
}

pub(crate) fn until(d: Duration) -> Wait {
    match crate::clock::now().checked_add(d) {
        Some(t) => Wait::Until(t),
        None => Wait::Forever,
    }
}

/// The lease, renewal and fair-mode settings of a handle whose settings live in `self.$f`.
macro_rules! hold_settings {
    ($f:ident) => {
        /// Sets the lease of this handle's holds (default: the client's, 30 s). Checked when
        /// acquiring: 100 ms ..= 365 days, else [`Error::InvalidConfig`].
        pub fn lease(mut self, lease: Duration) -> Self {
            self.$f.lease = lease;
            self
        }

        /// Whether the client renews holds while their guards live (default `true`). Without
        /// renewal a hold simply ends when its lease does; `lost()` fires then.
        pub fn auto_renew(mut self, on: bool) -> Self {
            self.$f.renew = on;
            self
        }

        /// Fair (FIFO) mode: waiters are granted in arrival order (default `false`). A waiter
        /// that dies keeps its place for at most [`crate::QUEUE_PLACE_TTL`].
        pub fn fair(mut self, on: bool) -> Self {
            self.$f.fair = on;
            self
        }
    };
}
pub(crate) use hold_settings;

macro_rules! settings {
    () => {
        hold_settings!(core);

        /// The lock name.
        pub fn name(&self) -> &str {
            self.core.name.as_str()
        }
    };
}

impl Client {
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
}

/// A distributed mutex: one holder at a time.
///
/// **Reentrancy is per handle**: acquiring through a handle (or a clone of it) that already holds
/// the lock returns another guard of the same hold (same fencing token) and increments a count; the
/// hold ends when the last of its guards is released. Two handles made by separate
/// [`Client::mutex`] calls are two contenders, even in one task — so give each task its own handle
/// when tasks must exclude each other. (It is not per thread: async tasks move between threads.)
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let client = dlock::connect("mem://doc-mutex").await?;
/// let m = client.mutex("orders/42")?;
/// let g1 = m.acquire().await?;
/// let g2 = m.acquire().await?;            // reentrant: same hold
/// assert_eq!(g1.token(), g2.token());
/// let other = client.mutex("orders/42")?; // another contender
/// assert!(other.try_acquire().await.unwrap_err().is_not_granted());
/// g2.release().await?;
/// g1.release().await?;                    // the hold ends here
/// assert!(other.try_acquire().await.is_ok());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    core: Core,
}

impl Mutex {
    pub(crate) fn new(client: Client, name: LockName) -> Self {
        Mutex {
            core: Core::new(client, name),
        }
    }

    settings!();

    /// Waits until the lock is granted.
    pub async fn acquire(&self) -> Result<Guard> {
        self.core
            .acquire(LockKind::Mutex, Mode::Exclusive, Wait::Forever, true)
            .await
    }

    /// Takes the lock if it is free now; [`Error::Busy`] otherwise. Leaves nothing behind.
    pub async fn try_acquire(&self) -> Result<Guard> {
        self.core
            .acquire(LockKind::Mutex, Mode::Exclusive, Wait::No, true)
            .await
    }

    /// Waits at most `timeout`; [`Error::Timeout`] after that (the queue place, if any, is removed).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Guard> {
        self.core
            .acquire(LockKind::Mutex, Mode::Exclusive, until(timeout), true)
            .await
    }
}

/// A distributed read-write lock: many readers or one writer.
///
/// Reentrant per handle like [`Mutex`]: a handle holding the write lock may also read (the read
/// guard shares the write hold); a handle holding only the read lock cannot take the write lock
/// ([`Error::Unsupported`], since that would deadlock against itself). Waiting writers block new
/// readers (no writer starvation).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let client = dlock::connect("mem://doc-rw").await?;
/// let r1 = client.rwlock("catalog")?.read().await?;
/// let r2 = client.rwlock("catalog")?.read().await?;   // readers share
/// assert!(client.rwlock("catalog")?.try_write().await.is_err());
/// drop((r1, r2));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    core: Core,
}

impl RwLock {
    pub(crate) fn new(client: Client, name: LockName) -> Self {
        RwLock {
            core: Core::new(client, name),
        }
    }

    settings!();

    /// Waits for a shared (read) hold.
    pub async fn read(&self) -> Result<Guard> {
        self.core
            .acquire(LockKind::RwLock, Mode::Shared, Wait::Forever, true)
            .await
    }

    /// Takes a read hold if possible now; [`Error::Busy`] otherwise.
    pub async fn try_read(&self) -> Result<Guard> {
        self.core
            .acquire(LockKind::RwLock, Mode::Shared, Wait::No, true)
            .await
    }

    /// Waits at most `timeout` for a read hold.
    pub async fn read_timeout(&self, timeout: Duration) -> Result<Guard> {
        self.core
            .acquire(LockKind::RwLock, Mode::Shared, until(timeout), true)
            .await
    }

    /// Waits for an exclusive (write) hold.
    pub async fn write(&self) -> Result<Guard> {
        self.core
            .acquire(LockKind::RwLock, Mode::Exclusive, Wait::Forever, true)
            .await
    }

    /// Takes the write hold if possible now; [`Error::Busy`] otherwise.
    pub async fn try_write(&self) -> Result<Guard> {
        self.core
            .acquire(LockKind::RwLock, Mode::Exclusive, Wait::No, true)
            .await
    }

    /// Waits at most `timeout` for the write hold.
    pub async fn write_timeout(&self, timeout: Duration) -> Result<Guard> {
        self.core
            .acquire(LockKind::RwLock, Mode::Exclusive, until(timeout), true)
            .await
    }

    /// Generic form: `acquire(Mode::Shared)` is [`RwLock::read`], `Mode::Exclusive` is
    /// [`RwLock::write`].
    pub async fn acquire(&self, mode: Mode) -> Result<Guard> {
        self.core
            .acquire(LockKind::RwLock, mode, Wait::Forever, true)
            .await
    }
}

/// A distributed counting semaphore: at most `permits` holds at once.
///
/// Not reentrant: every acquire takes one more permit, also through the same handle. Every user of
/// a name must use the same number of permits.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let client = dlock::connect("mem://doc-sem").await?;
/// let sem = client.semaphore("gpu-slots", 2)?;
/// let a = sem.acquire().await?;
/// let b = sem.acquire().await?;
/// assert!(sem.try_acquire().await.is_err());
/// drop((a, b));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    core: Core,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(client: Client, name: LockName, permits: u32) -> Self {
        Semaphore {
            core: Core::new(client, name),
            permits,
        }
    }

    settings!();

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn kind(&self) -> LockKind {
        LockKind::Semaphore {
            permits: self.permits,
        }
    }

    /// Waits for a permit.
    pub async fn acquire(&self) -> Result<Guard> {
        self.core
            .acquire(self.kind(), Mode::Shared, Wait::Forever, false)
            .await
    }

    /// Takes a permit if one is free now; [`Error::Busy`] otherwise.
    pub async fn try_acquire(&self) -> Result<Guard> {
        self.core
            .acquire(self.kind(), Mode::Shared, Wait::No, false)
            .await
    }

    /// Waits at most `timeout` for a permit.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Guard> {
        self.core
            .acquire(self.kind(), Mode::Shared, until(timeout), false)
            .await
    }

    /// What a multi-acquisition of permits needs (`core/multi.rs`): the client, the name, the
    /// lease, renewal and fair mode.
    pub(crate) fn parts(&self) -> (&Client, &LockName, Duration, bool, bool) {
        let c = &self.core;
        (&c.client, &c.name, c.lease, c.renew, c.fair)
    }
}

/// A granted hold. Dropping it releases the hold in the background (on the tokio runtime the guard
/// is dropped on; without a runtime nothing can be sent, renewal stops and the hold ends when its
/// lease runs out). [`Guard::release`] releases and reports errors.
#[derive(Debug)]
#[must_use = "the lock is released when the guard is dropped"]
pub struct Guard {
    hold: Arc<Hold>,
    done: bool,
}

impl Guard {
    pub(crate) fn new(hold: Arc<Hold>) -> Self {
        Guard { hold, done: false }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        self.hold.name.as_str()
    }

    /// The fencing token of this hold: strictly greater than every token granted earlier for this
    /// name, by any client. Pass it to the resource you protect and have it reject writes carrying
    /// a smaller token than one it has seen. `None` only on stores that cannot fence (Redlock).
    pub fn token(&self) -> Option<u64> {
        self.hold.token
    }

    /// Exclusive or shared.
    pub fn mode(&self) -> Mode {
        self.hold.mode
    }

    /// The primitive the lock is used as.
    pub fn kind(&self) -> LockKind {
        self.hold.kind
    }

    /// The owner token stored with the hold (shown by `dlock list`).
    pub fn owner(&self) -> &str {
        &self.hold.owner
    }

    /// When the hold was granted (local wall clock).
    pub fn acquired_at(&self) -> SystemTime {
        self.hold.acquired_at
    }

    /// True while the hold can be trusted: not lost, not released, local deadline not reached.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// How long the hold is trusted from now without another renewal, `None` if it is not held.
    pub fn valid_for(&self) -> Option<Duration> {
        match self.hold.state() {
            HoldState::Held { deadline, .. } => {
                deadline.checked_duration_since(crate::clock::now())
            }
            _ => None,
        }
    }

    /// Resolves when the hold can no longer be trusted: renewal kept failing until the local
    /// deadline, the deadline passed (a hold without renewal), or the store said the hold is gone.
    /// The local deadline lies a tenth of the lease before the store's expiry (measured from
    /// when the granting request was sent), so this fires **before** the store can grant the lock
    /// to anyone else, on every store that ends a hold only at its lease's end (not on etcd
    /// without etcd-io/etcd#16822, such as Debian's 3.4.23: a deposed leader can revoke a lease
    /// early; docs/BACKENDS.md). Also resolves once the hold is released. The future owns what
    /// it needs: spawn it or `select!` on it next to the work.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let client = dlock::connect("mem://doc-lost").await?;
    /// let guard = client.mutex("job")?.acquire().await?;
    /// tokio::select! {
    ///     reason = guard.lost() => eprintln!("stop: {reason}"),
    ///     _ = async { /* the work */ } => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = Error> + Send + 'static {
        let hold = self.hold.clone();
        let mut rx = hold.subscribe();
        async move {
            loop {
                let state = rx.borrow_and_update().clone();
                match state {
                    HoldState::Lost(reason) => {
                        return Error::Lost {
                            name: hold.name.to_string(),
                            reason,
                        }
                    }
                    HoldState::Released => {
                        return Error::Lost {
                            name: hold.name.to_string(),
                            reason: "released".into(),
                        }
                    }
                    HoldState::Held { deadline, .. } => {
                        tokio::select! {
                            biased; // deterministic under a seeded simulation (tests/simulation.rs)
                            _ = rx.changed() => {}
                            _ = tokio::time::sleep_until(deadline.into()) => {
                                hold.check_deadline();
                            }
                        }
                    }
                }
            }
        }
    }

    /// Releases this guard. The hold ends when the last guard of a reentrant hold is released;
    /// the store removes it only if this owner still holds it. Returns [`Error::Lost`] if the hold
    /// had been lost already, [`Error::NotOwner`] if the store no longer had it (it expired and
    /// may belong to someone else now, whose hold was not touched).
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        release_hold(self.hold.clone()).await
    }

    /// Stops renewing and sets the hold to expire `after` from now; dropping the guard then no
    /// longer releases it, so the lock stays held that long even if this process exits (a job
    /// that must not run twice in one period: `dlock run --hold-at-least`). An explicit
    /// [`Guard::release`] still ends it early. `Duration::ZERO` releases now. It applies to the
    /// hold, so to every reentrant guard of it.
    ///
    /// On error the guard is unchanged and still held (renewal resumes): a duration over
    /// [`crate::MAX_LEASE`] is [`Error::InvalidConfig`]; stores whose holds are sessions rather
    /// than leases (ZooKeeper) answer [`Error::Unsupported`] — keep the guard alive that long
    /// instead. If the store no longer had the hold: [`Error::NotOwner`], and the hold is lost.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let client = dlock::connect("mem://doc-expire").await?;
    /// let mut guard = client.mutex("hourly-report")?.acquire().await?;
    /// // ... the work finished quickly; keep others out for the rest of the period:
    /// guard.expire_in(Duration::from_secs(3)).await?;
    /// drop(guard);
    /// assert!(client.mutex("hourly-report")?.try_acquire().await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn expire_in(&mut self, after: Duration) -> Result<()> {
        let hold = self.hold.clone();
        if after.is_zero() {
            if self.done {
                return Ok(());
            }
            self.done = true;
            return release_hold(hold).await;
        }
        if after > MAX_LEASE {
            return Err(Error::InvalidConfig(format!(
                "expire_in({after:?}) is longer than the longest lease ({:?})",
                MAX_LEASE
            )));
        }
        if hold.store.backend.capabilities().validity == Validity::Session {
            return Err(Error::Unsupported(format!(
                "the {} store ends holds with the client's session; it cannot keep a hold after \
                 the holder lets go",
                hold.store.backend.name()
            )));
        }
        let renewing = hold.renews();
        hold.stop_renewing();
        let sent = crate::clock::now();
        let answer = match hold
            .store
            .calls
            .timed(
                hold.store
                    .backend
                    .extend(std::slice::from_ref(&hold.as_ref_with(after)), true),
            )
            .await
        {
            Ok(a) => crate::backend::sole(a),
            Err(e) => {
                if renewing {
                    hold.resume_renewing();
                }
                return Err(e);
            }
        };
        match answer {
            Extended::Held { valid_for } => {
                hold.confirmed(
                    sent + valid_for.saturating_sub(margin(valid_for)),
                    sent + valid_for,
                );
                hold.detach();
                Ok(())
            }
            Extended::Revoked => {
                hold.mark_lost("the lock was revoked by a forced unlock");
                Err(Error::NotOwner {
                    name: hold.name.to_string(),
                })
            }
            Extended::Gone => {
                hold.mark_lost("the store no longer had the hold when asked to keep it");
                Err(Error::NotOwner {
                    name: hold.name.to_string(),
                })
            }
        }
    }
}

impl Guard {
    /// Replaces the value stored with this hold (an election's `proclaim`): checked by the
    /// caller, sent only while the hold is held; a store that no longer has it loses the hold.
    pub(crate) async fn set_value(&self, value: &str) -> Result<()> {
        let hold = &self.hold;
        let reason = match hold.check_deadline() {
            HoldState::Held { .. } => None,
            HoldState::Lost(reason) => Some(reason),
            HoldState::Released => Some("released".into()),
        };
        if let Some(reason) = reason {
            return Err(Error::Lost {
                name: hold.name.to_string(),
                reason,
            });
        }
        let answer = hold
            .store
            .calls
            .timed(
                hold.store
                    .backend
                    .set_value(&hold.as_ref_with(hold.lease), value),
            )
            .await?;
        match answer {
            Released::Released | Released::HandedOff => {
                hold.store.wake_local(hold.name.as_str());
                Ok(())
            }
            Released::NotHeld => {
                hold.mark_lost("the store no longer had the hold when its value was set");
                Err(Error::NotOwner {
                    name: hold.name.to_string(),
                })
            }
        }
    }
}

async fn release_hold(hold: Arc<Hold>) -> Result<()> {
    if !hold.leave() {
        return Ok(()); // another reentrant guard still holds it
    }
    let before = hold.mark_released();
    hold.store.forget(&hold);
    let span = tracing::debug_span!(
        "dlock.release",
        name = %hold.name,
        store = hold.store.backend.name(),
        token = tracing::field::Empty,
        held = ?crate::clock::elapsed(hold.granted_at),
    );
    if let Some(t) = hold.token {
        span.record("token", t);
    }
    let r = {
        use tracing::Instrument;
        hold.store
            .calls
            .timed(hold.store.backend.release(&hold.as_ref_with(hold.lease)))
            .instrument(span)
            .await
    };
    // A store that handed the lock on woke the one waiter that has it now; this process's
    // waiters would only find it taken.
    if !matches!(r, Ok(Released::HandedOff)) {
        hold.store.wake_local(hold.name.as_str());
    }
    match (r?, before) {
        (_, HoldState::Lost(reason)) => Err(Error::Lost {
            name: hold.name.to_string(),
            reason,
        }),
        (Released::Released | Released::HandedOff, _) => Ok(()),
        (Released::NotHeld, _) => Err(Error::NotOwner {
            name: hold.name.to_string(),
        }),
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let hold = self.hold.clone();
        if hold.is_detached() {
            // `expire_in`: the store's lease ends the hold; nothing to send.
            if hold.leave() {
                hold.store.forget(&hold);
            }
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let unsettled = hold.store.settling.begin(hold.name.as_str());
                rt.spawn(async move {
                    if let Err(e) = release_hold(hold).await {
                        tracing::debug!(error = %e, "release of a dropped guard");
                    }
                    drop(unsettled);
                });
            }
            Err(_) => {
                // No runtime to send the release on: stop renewing; the lease ends the hold.
                if hold.leave() {
                    hold.mark_released();
                    hold.store.forget(&hold);
                }
            }
        }
    }
}
