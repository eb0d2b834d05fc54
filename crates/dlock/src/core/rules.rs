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
