//! The renewal watchdog of one client: wakes when the earliest hold is due, renews every hold
//! that is due (or nearly due) in one `extend` call, and fires `lost()` on holds the store no
//! longer has or whose local deadline passed.

use super::hold::{Hold, HoldState, Store};
use super::metrics::{store_error, RENEW_BATCHES_TOTAL, RENEW_FAILURES_TOTAL};
use super::rules::margin;
use crate::backend::{Extended, HoldRef, Validity};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// When the watchdog wakes next, shared by the watchdog (which publishes it) and the
/// acquisitions (which kick it only when a new hold is due before that, saying when).
#[derive(Debug)]
pub(crate) struct Schedule {
    /// Nanoseconds after `epoch` plus one; 0 while the watchdog is working out its next round.
    next: AtomicU64,
    /// The earliest time a kick asked for since the watchdog last looked (same encoding;
    /// `u64::MAX`: none), so that a kick moves the next round earlier without a round of its
    /// own: a round reads every hold, and a client granting thousands of holds while a round
    /// runs would otherwise kick it into one round after another.
    asked: AtomicU64,
    epoch: Instant,
}

impl Schedule {
    pub(crate) fn new() -> Schedule {
        Schedule {
            next: AtomicU64::new(0),
            asked: AtomicU64::new(u64::MAX),
            epoch: crate::clock::now(),
        }
    }

    fn encode(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX - 2)
            .min(u64::MAX - 2)
            + 1
    }

    /// Asks for a round at or before `t` (the caller then kicks the watchdog).
    pub(crate) fn ask(&self, t: Instant) {
        self.asked.fetch_min(self.encode(t), Ordering::SeqCst);
    }

    /// The earliest time asked for since the last call.
    fn take_asked(&self) -> Option<Instant> {
        match self.asked.swap(u64::MAX, Ordering::SeqCst) {
            u64::MAX => None,
            n => Some(self.epoch + Duration::from_nanos(n - 1)),
        }
    }

    /// Whether the watchdog's next wake-up comes after `t` (or is being worked out). A hold
    /// registered before this is asked is always seen: the watchdog marks "working out" before
    /// it reads the holds and publishes its next wake-up after, so either its read includes the
    /// hold, or this sees the mark or a wake-up computed without the hold (then `t` decides).
    pub(crate) fn wakes_after(&self, t: Instant) -> bool {
        match self.next.load(Ordering::SeqCst) {
            0 => true,
            n => t < self.epoch + Duration::from_nanos(n - 1),
        }
    }

    /// Publishes the watchdog's next wake-up (`None`: working it out).
    fn publish(&self, next: Option<Instant>) {
        let v = next.map_or(0, |t| self.encode(t));
        self.next.store(v, Ordering::SeqCst);
    }
}

/// The renewal watchdog of one client: wakes when the earliest hold is due, renews every hold
/// that is due (or nearly due) in **one** `extend` call, and fires `lost()` on holds the store no
/// longer has or whose local deadline passed. Exits when the client is dropped.
///
/// A kick only brings the next round forward to the time it asked for ([`Schedule::ask`]); a
/// round runs when that time comes. Every hold kept before a round starts is in its reading, and
/// a hold kept later kicks unless the published wake-up already comes before it is due.
pub(crate) async fn watchdog(store: Weak<Store>, schedule: Arc<Schedule>) {
    // When the next round is due; `None`: now.
    let mut due: Option<Instant> = None;
    loop {
        let Some(store) = store.upgrade() else {
            return;
        };
        let mut next = match due {
            Some(at) if at > crate::clock::now() => at,
            _ => {
                schedule.publish(None);
                renew_due(&store).await
            }
        };
        if let Some(asked) = schedule.take_asked() {
            next = next.min(asked);
        }
        schedule.publish(Some(next));
        due = Some(next);
        let kick = store.kick.clone();
        drop(store);
        tokio::select! {
            biased; // deterministic under a seeded simulation (tests/simulation.rs)
            _ = tokio::time::sleep_until(next.into()) => due = None,
            _ = kick.notified() => {}
        }
    }
}

/// Watchdog rounds run in this process (each reads every hold of its client).
#[cfg(test)]
static ROUNDS: AtomicU64 = AtomicU64::new(0);

/// One watchdog round; returns when the next round is due.
async fn renew_due(inner: &Arc<Store>) -> Instant {
    #[cfg(test)]
    ROUNDS.fetch_add(1, Ordering::Relaxed);
    let now = crate::clock::now();
    let holds = inner.live();
    // With no hold, not an hour: see `Store::idle_wake`.
    let idle = if holds.is_empty() {
        inner.idle_wake()
    } else {
        None
    };
    let mut next = now + idle.unwrap_or(Duration::from_secs(3600));
    // With each hold its deadline as read here, the order of the batch.
    let mut batch: Vec<(Instant, Arc<Hold>)> = Vec::new();
    let mut nearly: Vec<(Instant, Arc<Hold>)> = Vec::new();
    let mut due = false;
    for h in holds {
        match h.state() {
            HoldState::Held { deadline, renew_at } => {
                if now >= deadline {
                    h.lease_ran_out("the lease ran out before it could be renewed");
                    inner.forget(&h);
                    continue;
                }
                next = next.min(deadline);
                if h.renews() {
                    if renew_at <= now {
                        due = true;
                        batch.push((deadline, h));
                    } else {
                        next = next.min(renew_at);
                        // Due within the next sixth of its lease: rides along if a batch goes out.
                        if renew_at <= now + h.lease / 6 {
                            nearly.push((deadline, h));
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
                    inner.forget(&h);
                }
                None => inner.forget(&h),
            },
            HoldState::Released => inner.forget(&h),
        }
    }
    if !due {
        return next;
    }
    batch.append(&mut nearly);
    // Most urgent first; at most RENEW_BATCH holds per `extend` call and RENEW_IN_FLIGHT calls at
    // once, so one slow or huge batch (tens of thousands of holds) neither outlasts the lease of
    // all of them nor opens more connections.
    batch.sort_by_key(|(deadline, _)| *deadline);
    let batch: Vec<Arc<Hold>> = batch.into_iter().map(|(_, h)| h).collect();
    use futures_util::stream::StreamExt;
    futures_util::stream::iter(batch.chunks(RENEW_BATCH))
        .for_each_concurrent(RENEW_IN_FLIGHT, |chunk| renew_chunk(inner, chunk))
        .await;
    crate::clock::now()
}

/// The most holds the watchdog puts in one [`Backend::extend`] call.
pub(crate) const RENEW_BATCH: usize = 500;
/// How many `extend` calls of one watchdog round may be in flight at once.
const RENEW_IN_FLIGHT: usize = 4;

/// Renews one batch of holds in one `extend` call and applies the answers.
async fn renew_chunk(inner: &Arc<Store>, batch: &[Arc<Hold>]) {
    let now = crate::clock::now();
    let refs: Vec<HoldRef<'_>> = batch.iter().map(|h| h.as_ref_with(h.lease)).collect();
    let earliest = batch
        .iter()
        .filter_map(|h| match h.state() {
            HoldState::Held { deadline, .. } => Some(deadline),
            _ => None,
        })
        .min()
        .unwrap_or(now + Duration::from_secs(1));
    // `outcome`: `renewed` (every hold), `some_lost` (the store refused some), `failed`.
    let span = tracing::debug_span!(
        "dlock.renew",
        store = inner.backend.name(),
        holds = refs.len(),
        outcome = tracing::field::Empty,
    );
    let sent = crate::clock::now();
    let result = {
        use tracing::Instrument;
        let bound = match inner.calls.timeout() {
            Some(d) => earliest.min(crate::clock::now() + d),
            None => earliest,
        };
        tokio::time::timeout_at(bound.into(), inner.backend.extend(&refs, false))
            .instrument(span.clone())
            .await
    };
    let backend = inner.backend.name();
    metrics::counter!(RENEW_BATCHES_TOTAL, "backend" => backend).increment(1);
    let fail = |reason: &'static str| {
        metrics::counter!(RENEW_FAILURES_TOTAL, "backend" => backend, "reason" => reason)
            .increment(1);
    };
    match result {
        Ok(Ok(answers)) if answers.len() == batch.len() => {
            let refused = answers
                .iter()
                .filter(|a| !matches!(a, Extended::Held { .. }))
                .count();
            span.record(
                "outcome",
                if refused == 0 { "renewed" } else { "some_lost" },
            );
            for (h, a) in batch.iter().zip(answers) {
                match a {
                    Extended::Held { valid_for } => h.confirmed(
                        sent + valid_for.saturating_sub(margin(valid_for)),
                        sent + valid_for / 3,
                    ),
                    Extended::Gone => {
                        fail("gone");
                        h.mark_lost(
                            "the store no longer has this hold (expired, removed or taken over)",
                        );
                        inner.forget(h);
                    }
                    Extended::Revoked => {
                        fail("revoked");
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
                            _ => inner.forget(h),
                        }
                    }
                }
            }
        }
        other => {
            span.record("outcome", "failed");
            let (reason, why) = match other {
                Ok(Ok(_)) => (
                    "bad_answer",
                    "the store answered a renewal with the wrong number of results".to_string(),
                ),
                Ok(Err(e)) => {
                    store_error(backend, &e);
                    ("error", e.to_string())
                }
                Err(_) => (
                    "deadline",
                    "renewal did not finish before the lease deadline".to_string(),
                ),
            };
            fail(reason);
            span.in_scope(|| {
                tracing::warn!(error = %why, reason, holds = batch.len(), "renewal failed; retrying until the lease deadline");
            });
            for h in batch {
                // Retry soon, but never later than the deadline allows.
                h.retry_renewal_at(
                    crate::clock::now() + (h.lease / 10).min(Duration::from_secs(1)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ROUNDS;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    /// A client that keeps granting holds while its watchdog renews earlier ones runs a round
    /// when the earliest hold comes due, not one after every grant made during a round (each
    /// round reads every hold, so with tens of thousands held, rounds kicked by the grants made
    /// during the last one followed each other without end).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn granting_many_holds_does_not_run_a_round_per_grant() {
        let lease = Duration::from_millis(600);
        let client = crate::connect_with(
            "mem://watchdog-rounds",
            crate::ClientOptions::default().lease(lease),
        )
        .await
        .unwrap();
        let mut guards = Vec::new();
        let started = Instant::now();
        let rounds0 = ROUNDS.load(Ordering::Relaxed);
        while started.elapsed() < Duration::from_millis(1500) {
            let m = client.mutex(format!("n{}", guards.len())).unwrap();
            guards.push(m.try_acquire().await.unwrap());
        }
        let spent = started.elapsed();
        let rounds = ROUNDS.load(Ordering::Relaxed) - rounds0;
        eprintln!(
            "{} holds granted in {spent:?}: {rounds} rounds",
            guards.len()
        );
        assert!(guards.iter().all(|g| g.is_held()), "a hold was lost");
        // A round when the earliest hold is due (a third of its lease after its grant) takes
        // along those due within the next sixth, then one more reads what is due next: two
        // rounds per 100 ms after the first 200 ms, and a few for the first grants.
        let bound = (spent.as_secs_f64() / (lease.as_secs_f64() / 6.0) * 2.0) as u64 + 10;
        assert!(
            rounds <= bound,
            "{rounds} rounds in {spent:?} (at most {bound})"
        );
    }
}
