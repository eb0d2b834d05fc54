//! The scenarios of the conformance suite, one `pub async fn(Store)` each, generic over the store.
//!
//! Every scenario uses lock names of its own (`s.name(..)`) in a store of its own, bounds every
//! wait, and asserts the property itself: each would fail on a lock that lacks it. The numbers in
//! the section comments are the scenario numbers of the suite's specification (2, mutual
//! exclusion between processes, and the process parts of 5 and 14 are in the CLI's tests).

mod coordination;
mod exclusion;
mod holds;
mod inputs;
mod leases;
mod primitives;

pub use coordination::*;
pub use exclusion::*;
pub use holds::*;
pub use inputs::*;
pub use leases::*;
pub use primitives::*;

pub(crate) use super::harness::*;
pub(crate) use super::{assert_err, Store};
pub(crate) use crate::{Client, ClientOptions, Error, LockKind, Mode, Validity, Wakeups};
pub(crate) use rand::Rng;
pub(crate) use std::collections::BTreeSet;
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
pub(crate) use std::sync::{Arc, Mutex as StdMutex};
pub(crate) use std::time::{Duration, Instant, SystemTime};
pub(crate) use tokio::time::sleep;

/// The `expect` message of a handle the suite makes: its names (and permit counts) are valid.
const NAME_OK: &str = "a handle of a valid name and permit count";

/// Asserts that `m.try_acquire()` is refused with Busy (within [`STEP`]).
pub(crate) async fn assert_busy(m: &crate::Mutex, what: &str) {
    assert_err!(
        within(STEP, what, m.try_acquire()).await,
        Error::Busy { .. },
        "{what}"
    );
}
