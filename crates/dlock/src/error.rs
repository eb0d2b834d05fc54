//! The one error type of dlock.

use std::time::Duration;

/// Result alias used throughout dlock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, in kinds a caller can act on.
///
/// Messages never contain credentials: URLs are redacted before they are put into an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `try_acquire` found the lock held by someone else (or fair waiters ahead).
    #[error("lock {name:?} is busy")]
    Busy {
        /// The lock name.
        name: String,
    },
    /// `acquire_timeout` gave up waiting.
    #[error("timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The hold can no longer be trusted: the lease ran out, renewal failed, or the store dropped it.
    #[error("lock {name:?} was lost: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// Why the hold is considered lost.
        reason: String,
    },
    /// A release or extension found that this owner no longer holds the lock (it expired and may
    /// have been granted to someone else, whose hold was left untouched).
    #[error("lock {name:?} is not held by this owner (it expired or was taken over)")]
    NotOwner {
        /// The lock name.
        name: String,
    },
    /// The store could not be reached, did not answer in time, or turned the request away for a
    /// passing reason (too many clients, a restart, a lost connection). An acquisition that
    /// waits tries again until its deadline ([`UNAVAILABLE_PATIENCE`](crate::UNAVAILABLE_PATIENCE)
    /// without one) and reports this only then. A permanent refusal (wrong credentials, an
    /// unknown database) is [`Error::InvalidConfig`] or [`Error::Backend`] and is reported at once.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The lock name is not acceptable (empty, over 255 bytes, contains NUL).
    #[error("invalid lock name: {0}")]
    InvalidName(String),
    /// A URL, option or argument is not acceptable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The backend or primitive cannot do what was asked.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The store answered with an error dlock does not classify further.
    #[error("store error: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// Wraps any store error as [`Error::Backend`].
    pub fn backend<E>(e: E) -> Self
    where
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    {
        Error::Backend(e.into())
    }

    /// True for [`Error::Busy`] and [`Error::Timeout`]: the lock was simply not granted.
    pub fn is_not_granted(&self) -> bool {
        matches!(self, Error::Busy { .. } | Error::Timeout { .. })
    }
}

/// `fut`, or [`Error::Unavailable`] naming `shown` once `d` has passed.
pub(crate) async fn bounded<T>(
    d: std::time::Duration,
    shown: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(d, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Unavailable(format!(
            "{shown} did not answer within {d:?}"
        ))),
    }
}
