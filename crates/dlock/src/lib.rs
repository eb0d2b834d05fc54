//! # dlock — distributed locks over the store you already run
//!
//! One API over many stores, with every property a lock should have written once above the store:
//! mutual exclusion, leases renewed by a watchdog, owner-only release, reentrancy, blocking / try /
//! timed acquire, waiting by notification, FIFO fairness, read-write locks, semaphores, fencing
//! tokens and a [`Guard::lost`] signal.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! use std::time::Duration;
//! let client = dlock::connect("mem://").await?;        // or "sqlite:///var/lib/app/locks.db"
//! let jobs = client.mutex("jobs/nightly")?.lease(Duration::from_secs(10));
//! match jobs.acquire_timeout(Duration::from_secs(1)).await {
//!     Ok(guard) => {
//!         let token = guard.token();                   // pass to the resource you write
//!         tokio::select! {
//!             e = guard.lost() => eprintln!("{e}"),     // stop before someone else gets it
//!             _ = async { /* work, fenced with `token` */ } => {}
//!         }
//!         guard.release().await?;
//!     }
//!     Err(e) if e.is_not_granted() => println!("someone else runs it"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
//!
//! See `docs/ARCHITECTURE.md` for the layers and the backend trait, and `docs/BACKENDS.md` for
//! what each store guarantees.
//!
//! # Metrics
//!
//! Emitted through the [`metrics`](https://docs.rs/metrics) facade (install any recorder), every
//! one labelled by `backend`: `dlock_acquire_total` (`result`), `dlock_acquire_wait_seconds`,
//! `dlock_acquire_busy_total`, `dlock_waiters`, `dlock_holds`, `dlock_hold_seconds`,
//! `dlock_lost_total`, `dlock_renew_batches_total`, `dlock_renew_failures_total` (`reason`) and
//! `dlock_store_errors_total` (`kind`). The lock name is a label only with
//! [`ClientOptions::metrics_name_label`]. Spans: `dlock.acquire`, `dlock.release`, `dlock.renew`,
//! and `dlock.lost` around the warning of a loss. `docs/METRICS.md` says what each one counts;
//! `examples/prometheus.rs` and `examples/tracing.rs` show them.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "__fuzz")]
#[doc(hidden)]
#[path = "fuzz_api.rs"]
pub mod __fuzz;
pub mod backend;
mod clock;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod core;
mod error;
pub mod fencing;
mod name;
mod signal;
mod stores;
mod url;

pub use crate::core::client::Client;
pub use crate::core::election::{
    Election, Leader, Leadership, Observer, NATIVE_SAFETY_NET, OBSERVE_EVERY,
};
pub use crate::core::handles::{Guard, Mutex, RwLock, Semaphore};
pub use crate::core::multi::{MultiGuard, MultiLock, Striped, MAX_STRIPES};
pub use crate::core::rules::{
    ClientOptions, DEFAULT_LEASE, MAX_LEASE, MIN_LEASE, UNAVAILABLE_PATIENCE,
};
pub use backend::{
    Capabilities, Force, Forced, HoldStatus, HolderInfo, HolderMeta, LockInfo, LockKind, Mode,
    Validity, WaiterInfo, Wakeups, MAX_VALUE_LEN, QUEUE_PLACE_TTL,
};
pub use error::{Error, Result};
pub use name::{LockName, MAX_NAME_LEN};
pub use stores::{connect, connect_until, connect_with, enabled_backends, validate_url};
pub use url::redact_url;

/// Hooks for the deterministic simulation of the core (`crates/dlock/tests/simulation.rs`). Not
/// part of the stable API.
#[doc(hidden)]
pub mod sim {
    pub use crate::clock::seed_jitter;
}

/// The README's code blocks run as doctests, so what it shows keeps working.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The crate's own README (the page crates.io shows) runs as doctests too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct CrateReadmeDoctests;
