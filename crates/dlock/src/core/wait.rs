//! Waiting, written once for every store: the store's own change source when it has one, else
//! polling with back-off at the intervals it declares; the per-call timeout of every call to a
//! store; and the clean-up of an acquisition the caller dropped half-way.

use crate::backend::{Acquisition, Backend, Busy, Look, Want, Watch};
use crate::error::{bounded, Error, Result};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Bounds every call to a store by the store's [`Backend::call_timeout`].
#[derive(Debug, Clone)]
pub(crate) struct Calls {
    timeout: Option<Duration>,
    /// The store's URL, redacted, for the error message.
    shown: String,
    /// The backend's name, the `backend` label of the store-error metric.
    backend: &'static str,
}

impl Calls {
    pub(crate) fn new(backend: &dyn Backend, shown: &str) -> Calls {
        Calls {
            timeout: backend.call_timeout(),
            shown: shown.to_owned(),
            backend: backend.name(),
        }
    }

    /// `fut`, or [`Error::Unavailable`] once the call timeout has passed.
    pub(crate) async fn timed<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        let r = match self.timeout {
            Some(d) => bounded(d, &self.shown, fut).await,
            None => fut.await,
        };
        self.count(r)
    }

    /// Counts a failed call in `dlock_store_errors_total`.
    pub(crate) fn count<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            super::metrics::store_error(self.backend, e);
        }
        r
    }

    /// `fut` bounded by 20 call timeouts: a listing pages through many keys (Redis `SCAN`) in
    /// one call.
    pub(crate) async fn timed_listing<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        let r = match self.timeout {
            Some(d) => bounded(d * 20, &self.shown, fut).await,
            None => fut.await,
        };
        self.count(r)
    }

    /// The call timeout, if the store has one.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
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
        crate::clock::gen_range(lo..=hi)
    } else {
        hi
    };
    Duration::from_micros(us)
}

/// Waits until an attempt of `acq` is worth making, or `until`: on the store's change source
/// (checked with a look, where the store can look, before the attempt), or by polling.
pub(crate) async fn wait_for_turn(
    acq: &mut dyn Acquisition,
    calls: &Calls,
    busy: &Busy,
    until: Instant,
) -> Result<()> {
    loop {
        match calls.count(acq.changed(busy, until).await)? {
            Watch::Changed => return Ok(()),
            Watch::Recheck => {
                if crate::clock::now() >= until {
                    return Ok(());
                }
                match calls.timed(acq.look()).await? {
                    None | Some(Look::Free) => return Ok(()),
                    Some(Look::Busy { .. }) => {}
                }
            }
            Watch::Poll { min, max } => return poll(acq, calls, min, max, until).await,
        }
    }
}

/// Polls until a look finds the request may be granted, or `until`. The interval doubles while
/// the lock stays as it was and starts again from its shortest whenever a look finds it changed
/// hands (or the fair queue moved); a fair waiter near the front starts shorter still (the one at
/// place k at (k + 1) / 4 of the shortest interval). A store that cannot look is attempted again
/// after one interval.
async fn poll(
    acq: &mut dyn Acquisition,
    calls: &Calls,
    min: Duration,
    max: Duration,
    until: Instant,
) -> Result<()> {
    let mut step = 0u32;
    let mut seen: Option<u64> = None;
    let mut poll_min = min;
    loop {
        let now = crate::clock::now();
        if now >= until {
            return Ok(());
        }
        let wake_at = (now + poll_interval(step, poll_min, max)).min(until);
        step = step.saturating_add(1);
        tokio::time::sleep_until(wake_at.into()).await;
        match calls.timed(acq.look()).await? {
            None | Some(Look::Free) => return Ok(()),
            Some(Look::Busy { state, place }) => {
                if seen.is_some_and(|s| s != state) {
                    step = 0;
                }
                seen = Some(state);
                poll_min = match place {
                    Some(k) => min
                        .mul_f64(((k as f64 + 1.0) / 4.0).min(1.0))
                        .max(Duration::from_millis(1)),
                    None => min,
                };
            }
        }
    }
}

/// A client's clean-ups that run in the background (a dropped guard's release, a dropped
/// acquisition's cancel), counted per lock name, so that the client's next acquisition of the
/// name waits for them instead of meeting its own leftover (`drop(guard); try_acquire()` on the
/// same client must not find the name still taken by itself).
#[derive(Debug, Default)]
pub(crate) struct Settling {
    names: StdMutex<HashMap<String, (usize, Arc<Notify>)>>,
}

/// One background clean-up of a name; the name is settled when the last one is dropped.
#[derive(Debug)]
pub(crate) struct Unsettled {
    settling: Arc<Settling>,
    name: String,
}

impl Settling {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (usize, Arc<Notify>)>> {
        // The counts stay consistent even if a holder panicked.
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes a clean-up of `name` that is about to run in the background.
    pub(crate) fn begin(self: &Arc<Self>, name: &str) -> Unsettled {
        self.lock().entry(name.to_owned()).or_default().0 += 1;
        Unsettled {
            settling: self.clone(),
            name: name.to_owned(),
        }
    }

    /// Waits until no clean-up of `name` is running, or `until`.
    pub(crate) async fn settled(&self, name: &str, until: Instant) {
        loop {
            let Some(notify) = self.lock().get(name).map(|(_, n)| n.clone()) else {
                return;
            };
            let done = notify.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            // Ended between the look and `enable`: its notification was sent before we listened.
            if !self
                .lock()
                .get(name)
                .is_some_and(|(_, n)| Arc::ptr_eq(n, &notify))
            {
                return;
            }
            if tokio::time::timeout_at(until.into(), done).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        let mut names = self.settling.lock();
        if let Some((count, notify)) = names.get_mut(&self.name) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                notify.notify_waiters();
                names.remove(&self.name);
            }
        }
    }
}

/// An acquisition in the core's hands. Dropped while armed (the caller's own timeout or
/// `select!` dropped the acquiring future after an attempt went out), it is cancelled in the
/// background, and a hold it may have been granted without an answer is released.
pub(crate) struct Waiter {
    pub(crate) acq: Option<Box<dyn Acquisition>>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) want: Want,
    pub(crate) calls: Calls,
    pub(crate) armed: bool,
    /// Where the background cancel of a dropped waiter is counted.
    pub(crate) settling: Arc<Settling>,
}

impl Waiter {
    pub(crate) fn acq(&mut self) -> Result<&mut (dyn Acquisition + 'static)> {
        self.acq
            .as_deref_mut()
            .ok_or_else(|| Error::Backend("the acquisition was already given up".into()))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (Some(mut acq), Ok(rt)) = (self.acq.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let backend = self.backend.clone();
        let want = self.want.clone();
        let calls = self.calls.clone();
        let unsettled = self.settling.begin(want.name.as_str());
        rt.spawn(async move {
            let _ = calls.timed(acq.cancel()).await;
            let _ = calls.timed(backend.release(&want.req().hold())).await;
            drop(unsettled);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Attempt;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// An acquisition that can only poll, whose `i`-th look answers `look(i)`.
    struct Polled<F> {
        looks: Arc<AtomicU64>,
        look: F,
    }

    #[async_trait::async_trait]
    impl<F: Fn(u64) -> Look + Send + Sync> Acquisition for Polled<F> {
        async fn attempt(&mut self) -> Result<Attempt> {
            Ok(Attempt::Busy(Busy::default()))
        }
        async fn changed(&mut self, _busy: &Busy, _until: Instant) -> Result<Watch> {
            Ok(Watch::Poll {
                min: Duration::from_millis(10),
                max: Duration::from_millis(100),
            })
        }
        async fn look(&mut self) -> Result<Option<Look>> {
            let i = self.looks.fetch_add(1, Ordering::SeqCst);
            Ok(Some((self.look)(i)))
        }
        async fn cancel(&mut self) -> Result<()> {
            Ok(())
        }
    }

    /// How many looks a waiter makes in `window` when every look answers busy with what `look`
    /// gives for the look's number.
    async fn looks_in(window: Duration, look: impl Fn(u64) -> Look + Send + Sync) -> u64 {
        let looks = Arc::new(AtomicU64::new(0));
        let mut acq = Polled {
            looks: looks.clone(),
            look,
        };
        let calls = Calls {
            timeout: None,
            shown: "test".into(),
            backend: "test",
        };
        let until = crate::clock::now() + window;
        wait_for_turn(&mut acq, &calls, &Busy::default(), until)
            .await
            .unwrap();
        looks.load(Ordering::SeqCst)
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

    #[tokio::test]
    async fn a_free_look_ends_the_wait_and_a_store_that_cannot_look_is_attempted_again() {
        let until = crate::clock::now() + Duration::from_secs(5);
        let calls = Calls {
            timeout: None,
            shown: "test".into(),
            backend: "test",
        };
        let looks = Arc::new(AtomicU64::new(0));
        let mut acq = Polled {
            looks: looks.clone(),
            look: |i| {
                if i < 2 {
                    Look::Busy {
                        state: 0,
                        place: None,
                    }
                } else {
                    Look::Free
                }
            },
        };
        let started = crate::clock::now();
        wait_for_turn(&mut acq, &calls, &Busy::default(), until)
            .await
            .unwrap();
        assert_eq!(looks.load(Ordering::SeqCst), 3);
        assert!(crate::clock::elapsed(started) < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_call_that_outlasts_the_timeout_is_unavailable() {
        let calls = Calls {
            timeout: Some(Duration::from_millis(20)),
            shown: "redis://h/".into(),
            backend: "test",
        };
        let e = calls
            .timed(async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("redis://h/ did not answer within 20ms"),
            "{e}"
        );
    }

    #[test]
    fn poll_intervals_back_off_with_jitter_within_bounds() {
        let (min, max) = (Duration::from_millis(5), Duration::from_millis(50));
        for step in 0..10 {
            let d = poll_interval(step, min, max);
            assert!(d >= min && d <= max, "step {step}: {d:?}");
        }
        assert!(poll_interval(0, min, max) <= Duration::from_millis(10));
        assert!(poll_interval(9, min, max) >= Duration::from_millis(25));
    }
}
