//! The metrics dlock emits through the `metrics` facade, named in one place (docs/METRICS.md
//! lists them). Every metric carries `backend` (a `&'static str`); the lock name is a label only
//! when a client opts in ([`crate::ClientOptions::metrics_name_label`]), since names are unbounded.

use crate::error::Error;
use crate::name::LockName;
use metrics::Label;

/// Acquisitions that ended, by `result` (`granted`, `busy`, `timeout`, `error`).
pub(crate) const ACQUIRE_TOTAL: &str = "dlock_acquire_total";
/// Seconds from an acquisition's start to its grant.
pub(crate) const ACQUIRE_WAIT_SECONDS: &str = "dlock_acquire_wait_seconds";
/// Attempts the store answered busy (every attempt, not only an acquisition's last).
pub(crate) const ACQUIRE_BUSY_TOTAL: &str = "dlock_acquire_busy_total";
/// Acquisitions of this process waiting now (found the lock busy and wait for it).
pub(crate) const WAITERS: &str = "dlock_waiters";
/// Holds of this process now.
pub(crate) const HOLDS: &str = "dlock_holds";
/// Seconds a hold was held, recorded when it ends (released, lost, or dropped after `expire_in`).
pub(crate) const HOLD_SECONDS: &str = "dlock_hold_seconds";
/// Holds lost (lease ran out, the store no longer had it, revoked).
pub(crate) const LOST_TOTAL: &str = "dlock_lost_total";
/// Renewal calls (`extend` of a batch of holds) sent by the watchdog.
pub(crate) const RENEW_BATCHES_TOTAL: &str = "dlock_renew_batches_total";
/// Renewals that failed, by `reason`.
pub(crate) const RENEW_FAILURES_TOTAL: &str = "dlock_renew_failures_total";
/// Failed calls to the store, by `kind` (see [`error_kind`]).
pub(crate) const STORE_ERRORS_TOTAL: &str = "dlock_store_errors_total";

/// The values of `dlock_renew_failures_total`'s `reason`.
pub(crate) const RENEW_REASONS: [&str; 5] = ["error", "deadline", "bad_answer", "gone", "revoked"];
/// The values of `dlock_store_errors_total`'s `kind`, one per variant of [`Error`].
pub(crate) const ERROR_KINDS: [&str; 9] = [
    "busy",
    "timeout",
    "lost",
    "not_owner",
    "unavailable",
    "invalid_name",
    "invalid_config",
    "unsupported",
    "backend",
];

/// The bounded `kind` label of an error.
pub(crate) fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Busy { .. } => "busy",
        Error::Timeout { .. } => "timeout",
        Error::Lost { .. } => "lost",
        Error::NotOwner { .. } => "not_owner",
        Error::Unavailable(_) => "unavailable",
        Error::InvalidName(_) => "invalid_name",
        Error::InvalidConfig(_) => "invalid_config",
        Error::Unsupported(_) => "unsupported",
        Error::Backend(_) => "backend",
    }
}

/// The labels of a per-lock metric: `backend`, `extra` (static), and `name` if opted in. One
/// allocation, as the facade's macros make for any non-literal label.
pub(crate) fn labels(
    backend: &'static str,
    name: Option<&LockName>,
    extra: Option<(&'static str, &'static str)>,
) -> Vec<Label> {
    let mut v = Vec::with_capacity(3);
    v.push(Label::from_static_parts("backend", backend));
    if let Some((k, val)) = extra {
        v.push(Label::from_static_parts(k, val));
    }
    if let Some(n) = name {
        v.push(Label::new("name", n.as_str().to_owned()));
    }
    v
}

/// Counts one failed store call.
pub(crate) fn store_error(backend: &'static str, e: &Error) {
    metrics::counter!(STORE_ERRORS_TOTAL, "backend" => backend, "kind" => error_kind(e))
        .increment(1);
}

/// Registers a new client's counters and gauges at zero, so that rates and alerts work before
/// the first event (Prometheus' advice for known label values). Per-name series (opt-in) appear
/// when they first move.
pub(crate) fn register(backend: &'static str, name_label: bool) {
    metrics::counter!(RENEW_BATCHES_TOTAL, "backend" => backend).increment(0);
    for reason in RENEW_REASONS {
        metrics::counter!(RENEW_FAILURES_TOTAL, "backend" => backend, "reason" => reason)
            .increment(0);
    }
    for kind in ERROR_KINDS {
        metrics::counter!(STORE_ERRORS_TOTAL, "backend" => backend, "kind" => kind).increment(0);
    }
    if !name_label {
        for result in ["granted", "busy", "timeout", "error"] {
            metrics::counter!(ACQUIRE_TOTAL, "backend" => backend, "result" => result).increment(0);
        }
        metrics::counter!(ACQUIRE_BUSY_TOTAL, "backend" => backend).increment(0);
        metrics::counter!(LOST_TOTAL, "backend" => backend).increment(0);
        metrics::gauge!(WAITERS, "backend" => backend).increment(0.0);
        metrics::gauge!(HOLDS, "backend" => backend).increment(0.0);
    }
}

/// One acquisition of this process waiting: counted in `dlock_waiters` while it lives (a
/// dropped acquisition future drops it too).
pub(crate) struct Waiting {
    gauge: metrics::Gauge,
}

impl Waiting {
    pub(crate) fn new(backend: &'static str, name: Option<&LockName>) -> Waiting {
        let gauge = metrics::gauge!(WAITERS, labels(backend, name, None));
        gauge.increment(1.0);
        Waiting { gauge }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}
