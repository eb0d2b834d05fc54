//! The scenarios of the conformance suite, one `pub async fn(Store)` each, generic over the store.
//!
//! Every scenario uses lock names of its own (`s.name(..)`) in a store of its own, bounds every
//! wait, and asserts the property itself: each would fail on a lock that lacks it. The numbers in
//! the section comments are the scenario numbers of the suite's specification.

mod exclusion;
mod holds;
mod inputs;
mod leases;
mod primitives;

pub use exclusion::*;
pub use holds::*;
pub use inputs::*;
pub use leases::*;
pub use primitives::*;

pub(crate) use crate::harness::*;
pub(crate) use dlock::{Client, ClientOptions, Error, LockKind, Mode, Validity, Wakeups};
pub(crate) use rand::Rng;
pub(crate) use std::collections::BTreeSet;
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
pub(crate) use std::sync::{Arc, Mutex as StdMutex};
pub(crate) use std::time::{Duration, Instant, SystemTime};
pub(crate) use tokio::time::sleep;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Asserts that `m.try_acquire()` is refused with Busy (within [`STEP`]).
pub(crate) async fn assert_busy(m: &dlock::Mutex, what: &str) {
    assert_err!(
        within(STEP, what, m.try_acquire()).await,
        Error::Busy { .. },
        "{what}"
    );
}
