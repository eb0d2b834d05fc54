//! One hold in the store, shared by the reentrant guards that use it, and the [`Store`] the
//! holds of one client share.

use super::rules::Spec;
use super::wait::{Calls, Settling};
use crate::backend::{Backend, Capabilities, HoldRef, LockKind, Mode, Validity};
use crate::name::LockName;
use crate::signal::NameSignals;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;
use tokio::sync::Notify;

/// What the holds of one client share: the backend, its call timeout, the holds the watchdog
/// renews and the in-process wake-ups. Dropped with the client and its last hold (the watchdog
/// then stops).
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) caps: Capabilities,
    /// Every call to the store goes through this (its timeout).
    pub(crate) calls: Calls,
    /// In-process wake-ups by lock name, shared with the clients of this process on the same
    /// store (see [`Backend::shared_key`]).
    pub(crate) local: Arc<NameSignals>,
    /// Live holds by [`Hold::seq`], for the watchdog (in grant order, so that a watchdog round
    /// goes through them in the same order every time: a seeded simulation replays).
    holds: StdMutex<BTreeMap<u64, Weak<Hold>>>,
    /// The next [`Hold::seq`].
    next_seq: AtomicU64,
    /// Wakes the watchdog.
    pub(crate) kick: Arc<Notify>,
    /// From grant to first renewal of the latest hold, ns (0: none yet): how soon an idle
    /// watchdog wakes (see [`Store::idle_wake`]).
    first_renewal_ns: AtomicU64,
    /// Releases and cancels of this client still running in the background, per name.
    pub(crate) settling: Arc<Settling>,
    /// Whether per-lock metrics carry the lock name ([`crate::ClientOptions::metrics_name_label`]).
    pub(crate) name_label: bool,
}

impl Store {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        caps: Capabilities,
        calls: Calls,
        local: Arc<NameSignals>,
        name_label: bool,
    ) -> Store {
        super::metrics::register(backend.name(), name_label);
        Store {
            backend,
            caps,
            calls,
            local,
            holds: StdMutex::new(BTreeMap::new()),
            next_seq: AtomicU64::new(0),
            kick: Arc::new(Notify::new()),
            first_renewal_ns: AtomicU64::new(0),
            settling: Arc::default(),
            name_label,
        }
    }

    /// The labels of a per-lock metric of `name` (the name only if opted in).
    pub(crate) fn labels(
        &self,
        name: &LockName,
        extra: Option<(&'static str, &'static str)>,
    ) -> Vec<metrics::Label> {
        let name = self.name_label.then_some(name);
        super::metrics::labels(self.backend.name(), name, extra)
    }

    /// One acquisition of `name` waiting, counted in `dlock_waiters` while it lives.
    pub(crate) fn waiting(&self, name: &LockName) -> super::metrics::Waiting {
        super::metrics::Waiting::new(self.backend.name(), self.name_label.then_some(name))
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Weak<Hold>>> {
        // The map stays consistent even if a holder panicked.
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands a new hold to the watchdog.
    pub(crate) fn keep(&self, hold: &Arc<Hold>) {
        if let HoldState::Held { renew_at, .. } = hold.state() {
            let first = renew_at.saturating_duration_since(crate::clock::now());
            let ns = u64::try_from(first.as_nanos()).unwrap_or(u64::MAX);
            self.first_renewal_ns.store(ns.max(1), Ordering::Relaxed);
        }
        self.holds().insert(hold.seq, Arc::downgrade(hold));
    }

    /// How long after a round without holds the watchdog wakes: the time from grant to first
    /// renewal of the latest hold. Released holds leave the watchdog's set before their release
    /// is sent, so without this an idle watchdog would sleep for an hour and every grant of an
    /// acquire/release loop would kick it (a task wake-up each time); waking this soon, it
    /// needs no kick for the next grant of the same lease, whose first renewal comes later.
    /// At least a second, so that a client idle after a hold of a short lease does not wake
    /// often for nothing (its grants kick the watchdog as before).
    pub(crate) fn idle_wake(&self) -> Option<Duration> {
        match self.first_renewal_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns).max(Duration::from_secs(1))),
        }
    }

    /// The live holds (forgetting those whose guards are all gone).
    pub(crate) fn live(&self) -> Vec<Arc<Hold>> {
        let mut map = self.holds();
        map.retain(|_, w| w.strong_count() > 0);
        map.values().filter_map(Weak::upgrade).collect()
    }

    pub(crate) fn forget(&self, hold: &Hold) {
        self.holds().remove(&hold.seq);
    }

    /// Wakes this process's tasks waiting on `name` (after a release in this process).
    pub(crate) fn wake_local(&self, name: &str) {
        self.local.wake(name);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // A hold whose guards let go without a release (`expire_in`) ends here.
        self.ended();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.kick.notify_one();
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HoldState {
    /// Trusted until `deadline` (local monotonic clock, margin already taken off); the watchdog
    /// renews at `renew_at`.
    Held {
        deadline: Instant,
        renew_at: Instant,
    },
    /// Can no longer be trusted.
    Lost(String),
    /// Released (or handed to the store's lease by `expire_in`).
    Released,
}

#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) store: Arc<Store>,
    pub(crate) name: LockName,
    pub(crate) kind: LockKind,
    pub(crate) mode: Mode,
    pub(crate) owner: String,
    /// This client's number of the hold, in grant order (the watchdog's key).
    seq: u64,
    pub(crate) token: Option<u64>,
    pub(crate) lease: Duration,
    pub(crate) acquired_at: SystemTime,
    /// When it was granted (monotonic), for `dlock_hold_seconds` and the release span.
    pub(crate) granted_at: Instant,
    /// Set once the hold's end was counted (`dlock_holds`, `dlock_hold_seconds`).
    ended: AtomicBool,
    /// Live guards of this hold (reentrancy count). 0 = the hold is being or has been released.
    pub(crate) guards: AtomicUsize,
    renew: AtomicBool,
    /// Set by `Guard::expire_in`: dropped guards no longer release the hold.
    detached: AtomicBool,
    /// A lost hold of a session store that this client must still end: revoked while its
    /// guards live. The watchdog releases it here, when its lease would have run out, unless
    /// the guards release it first (a session store keeps a hold as long as the session lives).
    end_at: std::sync::Mutex<Option<Instant>>,
    state: watch::Sender<HoldState>,
}

impl Hold {
    pub(crate) fn new(
        store: Arc<Store>,
        spec: &Spec,
        owner: String,
        token: Option<u64>,
        deadline: Instant,
        renew_at: Instant,
    ) -> Arc<Hold> {
        let (state, _) = watch::channel(HoldState::Held { deadline, renew_at });
        metrics::gauge!(super::metrics::HOLDS, store.labels(&spec.name, None)).increment(1.0);
        let seq = store.next_seq.fetch_add(1, Ordering::Relaxed);
        Arc::new(Hold {
            seq,
            store,
            name: spec.name.clone(),
            kind: spec.kind,
            mode: spec.mode,
            owner,
            token,
            lease: spec.lease,
            acquired_at: SystemTime::now(),
            granted_at: crate::clock::now(),
            ended: AtomicBool::new(false),
            guards: AtomicUsize::new(1),
            renew: AtomicBool::new(spec.renew),
            detached: AtomicBool::new(false),
            end_at: std::sync::Mutex::new(None),
            state,
        })
    }

    pub(crate) fn state(&self) -> HoldState {
        self.state.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<HoldState> {
        self.state.subscribe()
    }

    pub(crate) fn renews(&self) -> bool {
        self.renew.load(Ordering::Acquire)
    }

    pub(crate) fn stop_renewing(&self) {
        self.renew.store(false, Ordering::Release);
    }

    pub(crate) fn resume_renewing(&self) {
        self.renew.store(true, Ordering::Release);
    }

    pub(crate) fn detach(&self) {
        self.detached.store(true, Ordering::Release);
    }

    pub(crate) fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }

    pub(crate) fn as_ref_with(&self, lease: Duration) -> HoldRef<'_> {
        HoldRef {
            name: &self.name,
            kind: self.kind,
            mode: self.mode,
            owner: &self.owner,
            lease,
        }
    }

    /// True while held and the local deadline has not passed.
    pub(crate) fn is_held(&self) -> bool {
        match *self.state.borrow() {
            HoldState::Held { deadline, .. } => crate::clock::now() < deadline,
            _ => false,
        }
    }

    /// Adds a reentrant guard if the hold is still live. False if it is being released or lost.
    pub(crate) fn try_reenter(&self) -> bool {
        if !self.is_held() {
            return false;
        }
        let mut n = self.guards.load(Ordering::Acquire);
        loop {
            if n == 0 {
                return false;
            }
            match self
                .guards
                .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(cur) => n = cur,
            }
        }
    }

    /// Drops one guard; true if it was the last one.
    pub(crate) fn leave(&self) -> bool {
        self.guards.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Marks the hold lost; true if it was held until now.
    pub(crate) fn mark_lost(&self, reason: &str) -> bool {
        let changed = self.state.send_if_modified(|s| match s {
            HoldState::Held { .. } => {
                *s = HoldState::Lost(reason.to_string());
                true
            }
            _ => false,
        });
        if changed {
            self.ended();
            metrics::counter!(
                super::metrics::LOST_TOTAL,
                self.store.labels(&self.name, None)
            )
            .increment(1);
            let span = tracing::warn_span!(
                "dlock.lost",
                name = %self.name,
                store = self.store.backend.name(),
                token = tracing::field::Empty,
                reason,
            );
            if let Some(t) = self.token {
                span.record("token", t);
            }
            span.in_scope(|| tracing::warn!(name = %self.name, reason, "lock lost"));
        }
        changed
    }

    /// Counts the end of the hold once (released, lost, or dropped): `dlock_holds` down, its
    /// time held into `dlock_hold_seconds`.
    fn ended(&self) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        metrics::gauge!(super::metrics::HOLDS, self.store.labels(&self.name, None)).decrement(1.0);
        metrics::histogram!(
            super::metrics::HOLD_SECONDS,
            self.store.labels(&self.name, None)
        )
        .record(crate::clock::elapsed(self.granted_at).as_secs_f64());
    }

    /// Marks the hold lost if its local deadline has passed. Returns the state after.
    pub(crate) fn check_deadline(&self) -> HoldState {
        if let HoldState::Held { deadline, .. } = self.state() {
            if crate::clock::now() >= deadline {
                self.lease_ran_out(
                    "the lease deadline was reached on the local clock without a successful renewal",
                );
            }
        }
        self.state()
    }

    /// The hold's lease ran out without renewal: it is lost. A lease store ends it by itself; a
    /// session store would keep it as long as the session lives, so the hold is released there
    /// (in the background) — written once here for every session store, instead of a timer per
    /// hold in the backend.
    pub(crate) fn lease_ran_out(&self, reason: &str) {
        if self.mark_lost(reason) && self.store.backend.capabilities().validity == Validity::Session
        {
            self.end_in_background();
        }
    }

    /// When the watchdog must end this lost hold (see the field), if it must.
    pub(crate) fn end_at(&self) -> Option<Instant> {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the watchdog to end this lost hold at `at` unless its guards release it first.
    pub(crate) fn end_at_latest(&self, at: Instant) {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    /// Releases the hold in the store in the background (no runtime: nothing to do).
    pub(crate) fn end_in_background(&self) {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.store.backend.clone();
        let calls = self.store.calls.clone();
        let unsettled = self.store.settling.begin(self.name.as_str());
        let (name, kind, mode, owner, lease) = (
            self.name.clone(),
            self.kind,
            self.mode,
            self.owner.clone(),
            self.lease,
        );
        rt.spawn(async move {
            let hold = HoldRef {
                name: &name,
                kind,
                mode,
                owner: &owner,
                lease,
            };
            if let Err(e) = calls.timed(backend.release(&hold)).await {
                tracing::debug!(error = %e, "ending a lost session hold");
            }
            drop(unsettled);
        });
    }

    pub(crate) fn mark_released(&self) -> HoldState {
        let before = self.state();
        let changed = self.state.send_if_modified(|s| match s {
            HoldState::Held { .. } => {
                *s = HoldState::Released;
                true
            }
            _ => false,
        });
        if changed {
            self.ended();
        }
        before
    }

    pub(crate) fn confirmed(&self, deadline: Instant, renew_at: Instant) {
        self.state.send_if_modified(|s| match s {
            HoldState::Held { .. } => {
                *s = HoldState::Held { deadline, renew_at };
                true
            }
            _ => false,
        });
    }

    pub(crate) fn retry_renewal_at(&self, at: Instant) {
        self.state.send_if_modified(|s| match s {
            HoldState::Held { renew_at, .. } => {
                *renew_at = at;
                false
            }
            _ => false,
        });
    }
}
