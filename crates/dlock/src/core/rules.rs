//! The rules every hold follows, shared by the core's files: lease bounds, the safety margin,
//! what one acquisition asks for and how long it may wait.

use crate::backend::{LockKind, Mode};
use crate::error::{Error, Result};
use crate::name::LockName;
use std::time::{Duration, Instant};

/// The default lease of a hold: 30 s, renewed every 10 s while the guard lives.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease dlock accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest lease dlock accepts (a year).
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long an acquisition that waits without a deadline (`acquire()`) tries again while the
/// store refuses it for a passing reason ([`Error::Unavailable`](crate::Error::Unavailable):
/// too many clients, a server restarting, a lost connection) before it reports the refusal. An
/// acquisition with a deadline tries again until its deadline; one that does not wait
/// (`try_acquire`) reports the refusal at once.
pub const UNAVAILABLE_PATIENCE: Duration = Duration::from_secs(30);

/// Options for [`crate::connect_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The lease of every hold unless a lock handle sets its own. Default 30 s.
    pub lease: Duration,
    /// Whether the per-lock metrics carry the lock name as a `name` label. Default off: names
    /// are unbounded, so each one is a new series (see docs/METRICS.md).
    pub metrics_name_label: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            lease: DEFAULT_LEASE,
            metrics_name_label: false,
        }
    }
}

impl ClientOptions {
    /// Sets the default lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Labels the per-lock metrics (acquisitions, waits, holds, losses) with the lock name too.
    /// Off by default: turn it on only where the set of names is small and fixed, since every
    /// name is a new series in the metrics backend.
    ///
    /// ```
    /// let options = dlock::ClientOptions::default().metrics_name_label(true);
    /// assert!(options.metrics_name_label);
    /// ```
    pub fn metrics_name_label(mut self, on: bool) -> Self {
        self.metrics_name_label = on;
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

/// What one acquisition asks for.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub name: LockName,
    pub kind: LockKind,
    pub mode: Mode,
    pub lease: Duration,
    pub renew: bool,
    pub fair: bool,
    /// Stored with the hold ([`crate::HolderMeta::value`]): an election's value.
    pub value: Option<String>,
}

/// How long an acquisition may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    No,
    Until(Instant),
    Forever,
}

/// The store's passing refusals ([`Error::Unavailable`]) of one waiting acquisition in a row:
/// when it began, and the pause before the next attempt (doubled each time, from 50 ms to 2 s).
#[derive(Debug, Default)]
pub(crate) struct Outage {
    since: Option<Instant>,
    pause: Duration,
}

impl Outage {
    const FIRST: Duration = Duration::from_millis(50);
    const MOST: Duration = Duration::from_secs(2);

    /// How long to pause before trying again after `e`, or `None` to report it: a permanent
    /// error, an acquisition that does not wait, a deadline too near for another attempt, or
    /// (without a deadline) refusals for [`UNAVAILABLE_PATIENCE`] already.
    pub(crate) fn pause(&mut self, e: &Error, wait: Wait) -> Option<Duration> {
        if !matches!(e, Error::Unavailable(_)) {
            return None;
        }
        let now = crate::clock::now();
        let since = *self.since.get_or_insert(now);
        let until = match wait {
            Wait::No => return None,
            Wait::Until(d) => d,
            Wait::Forever => since + UNAVAILABLE_PATIENCE,
        };
        self.pause = (self.pause * 2).clamp(Self::FIRST, Self::MOST);
        let jittered = self.pause.mul_f64(crate::clock::gen_range(0.5..=1.0));
        let left = until.checked_duration_since(now)?;
        // The last attempt goes out before the deadline, not after it.
        (left > Self::FIRST).then(|| jittered.min(left - Self::FIRST / 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down() -> Error {
        Error::Unavailable("too many clients".into())
    }

    #[test]
    fn an_outage_is_waited_out_only_by_a_waiter_and_only_while_it_may() {
        let mut o = Outage::default();
        // Permanent errors and callers that do not wait: reported at once.
        assert_eq!(
            o.pause(&Error::InvalidConfig("bad".into()), Wait::Forever),
            None
        );
        assert_eq!(o.pause(&down(), Wait::No), None);
        // A deadline too near for another attempt: reported.
        let soon = crate::clock::now() + Outage::FIRST / 2;
        assert_eq!(Outage::default().pause(&down(), Wait::Until(soon)), None);
        // Pauses double up to the most, jittered to [b/2, b], never past the deadline.
        let far = crate::clock::now() + Duration::from_secs(60);
        let mut o = Outage::default();
        let mut bound = Outage::FIRST;
        for _ in 0..8 {
            let p = o.pause(&down(), Wait::Until(far)).unwrap();
            assert!(p >= bound / 2 && p <= bound, "{p:?} of {bound:?}");
            bound = (bound * 2).min(Outage::MOST);
        }
        let near = crate::clock::now() + Duration::from_millis(200);
        let p = o.pause(&down(), Wait::Until(near)).unwrap();
        assert!(p < Duration::from_millis(200), "{p:?}");
        // Without a deadline: for UNAVAILABLE_PATIENCE from the first refusal.
        let mut o = Outage {
            since: Some(crate::clock::now() - UNAVAILABLE_PATIENCE),
            pause: Duration::ZERO,
        };
        assert_eq!(o.pause(&down(), Wait::Forever), None);
        let mut o = Outage::default();
        assert!(o.pause(&down(), Wait::Forever).is_some());
    }
}
