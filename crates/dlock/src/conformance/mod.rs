//! # The conformance suite (cargo feature `conformance`)
//!
//! One suite that every store must pass, generic over the store: each scenario is an
//! `async fn(`[`Store`]`)` in [`scenarios`], and the [`conformance!`](crate::conformance!) macro
//! turns every scenario into one `#[test]` per store, named `<backend>::<scenario>`. A scenario
//! gets its clients from a [`Factory`], so a store needs no URL scheme in dlock to run the suite:
//! a store written outside this crate passes a function that returns its backend.
//!
//! dlock runs it on each of its own stores in `crates/dlock/tests/conformance.rs`:
//!
//! ```text
//! cargo nextest run -p dlock-rs --features conformance,redis,redlock,zookeeper,postgres,mysql \
//!     --test conformance                                   # every store
//! cargo nextest run … --test conformance -E 'test(/^sqlite::/)'   # one store
//! cargo nextest run … --test conformance fair_fifo_order          # one scenario
//! ```
//!
//! The scenarios that need separate OS processes (`dlock run` processes sharing a store: mutual
//! exclusion between processes, a SIGKILLed holder taken over, a waiter in another process woken)
//! are not here: they need the `dlock` binary and live in `crates/dlock-cli/tests/conformance.rs`,
//! which uses this module's [`Store`], [`run_test`] and [`harness`].
//!
//! ## How to run the suite on your store
//!
//! Add dlock with the feature to your crate's dev-dependencies
//! (`dlock = { package = "dlock-rs", version = "…", features = ["conformance"] }`) and write one line per
//! configuration of your store in a test file (`tests/conformance.rs`):
//!
//! ```
//! use dlock::backend::{memory::MemoryBackend, Backend};
//! use dlock::conformance::{Ctx, Factory};
//! use std::sync::Arc;
//!
//! /// A store of its own for each test: here an in-process store named by the test's unique id.
//! /// A server-backed store would connect to its server instead (with lock names of its own,
//! /// which every scenario already uses: `conf/<id>/…`).
//! fn my_store(t: &Ctx) -> Factory {
//!     let id = t.id().to_owned();
//!     Factory::backend(format!("mystore://{id}"), move || {
//!         let id = id.clone();
//!         async move { Ok(Arc::new(MemoryBackend::named(&id)) as Arc<dyn Backend>) }
//!     })
//! }
//!
//! // One `#[test]` per scenario: `my_store::mutual_exclusion_tasks`, `my_store::bad_input`, …
//! dlock::conformance!(my_store, my_store);
//! // A mutex-only store (no rwlock, semaphore or fair mode) leaves out the scenarios about them:
//! dlock::conformance!(my_mutex_store, my_store, Caps { mutex_only: true });
//!
//! // One scenario by hand, e.g. while writing the store:
//! # fn main() {
//! dlock::conformance::run_test(
//!     "my_store",
//!     "reentrancy_counts",
//!     dlock::conformance::Caps::default(),
//!     my_store,
//!     dlock::conformance::scenarios::reentrancy_counts,
//! );
//! # }
//! ```
//!
//! `conformance!(NAME, SETUP, Caps { .. })`:
//!
//! - `NAME`: the store's short name (the test module, e.g. `redis`).
//! - `SETUP`: a function or closure that gets the test's [`Ctx`] and answers anything
//!   [`IntoFactory`]: a [`Factory`], a URL `String` (the store is then reached through
//!   [`connect_with`](crate::connect_with)), or an `Option` of either, where `None` means "not
//!   configured here": the store's tests then fail with a message saying how to provide it
//!   (never skip). `t` displays as an id unique to the test (`[a-z0-9_-]`; use it for an
//!   in-process store name, a database or key prefix) and `t.path("file")` is a file in a
//!   temporary directory of the test. A server-backed store takes its URL from the environment:
//!   `dlock::conformance!(redis, |_| env_url("DLOCK_TEST_REDIS_URL"));`.
//! - `Caps { .. }` (optional, fields `true`/`false`, the rest `false`): see [`Caps`].
//!
//! The generated tests are plain `#[test]` functions that start their own tokio runtime
//! ([`run_test`]), so the calling crate needs no tokio features. Your store is done when every
//! test passes; the stores of dlock pass them all.
//!
//! ## Adding a scenario
//!
//! Write `pub async fn my_scenario(s: Store)` in `conformance/scenarios/` (real assertions;
//! every wait bounded through [`within`]/[`must`]/
//! [`eventually`]; lock names from [`Store::name`]), and add its name to
//! the lists in the macro. Time bounds are generous: they prove a mechanism (a renewal, a
//! wake-up, an expiry), not a speed. One store's whole suite should stay under about a minute of
//! wall time.

pub mod harness;
pub mod scenarios;
mod store;

pub use harness::{
    assert_err, assert_strictly_increasing, assert_unsupported, describe, env_url, eventually,
    fails, join_all, must, show, with_option, within, SCENARIO_LIMIT, STEP,
};
pub use store::{run, run_test, Caps, Ctx, Factory, IntoFactory, Store};

/// `conformance!(backend, setup, Caps { .. })`: one `#[test]` per scenario of the in-process
/// conformance suite for this store, in a module named `backend` (tests `backend::scenario`).
/// See [the module documentation](mod@crate::conformance) for the arguments and an example.
///
/// With `Caps { mutex_only: true, .. }` the scenarios that are about something other than a
/// mutex are not generated (a scenario that does not apply is not a test, rather than a test that
/// passes without running): `rwlock_shared_exclusive`, `semaphore_limit` and `fair_fifo_order`
/// (nothing of them is a mutex), and `describe_shows_holders` (its listing assertions are built
/// on held rwlocks and semaphores). The others run their mutex parts and check that fair mode,
/// rwlocks and semaphores answer `Unsupported` (the fencing assertions accept `token() == None`
/// only where the store reports `fencing: false`).
#[macro_export]
macro_rules! conformance {
    ($backend:ident, $setup:expr $(,)?) => {
        $crate::conformance!(@select $backend, $setup, $crate::conformance::Caps::default(); );
    };
    ($backend:ident, $setup:expr, Caps { $($field:ident : $value:tt),* $(,)? } $(,)?) => {
        $crate::conformance!(@select $backend, $setup,
            $crate::conformance::Caps { $($field: $value,)* ..$crate::conformance::Caps::default() };
            $($field: $value,)*);
    };
    (@select $backend:ident, $setup:expr, $caps:expr; mutex_only: true, $($rest:tt)*) => {
        $crate::conformance!(@mutex $backend, $setup, $caps; );
    };
    (@select $backend:ident, $setup:expr, $caps:expr; $field:ident : $value:tt, $($rest:tt)*) => {
        $crate::conformance!(@select $backend, $setup, $caps; $($rest)*);
    };
    (@select $backend:ident, $setup:expr, $caps:expr; ) => {
        $crate::conformance!(@mutex $backend, $setup, $caps;
            rwlock_shared_exclusive,
            semaphore_limit,
            fair_fifo_order,
            describe_shows_holders,
        );
    };
    // The scenarios every store runs (a mutex-only store their mutex parts), then `$extra`.
    (@mutex $backend:ident, $setup:expr, $caps:expr; $($extra:ident,)*) => {
        $crate::conformance!(@tests $backend, $setup, $caps;
            mutual_exclusion_tasks,
            try_and_timeout,
            owner_only_release_after_expiry,
            holder_killed_taken_over,
            renewal_keeps_lock,
            lost_fires_when_store_removes_hold,
            revoked_hold_keeps_others_out,
            lost_fires_at_deadline_without_renewal,
            fencing_tokens_increase,
            reentrancy_counts,
            waiter_wakes_by_notification,
            bad_input,
            dropped_guard_releases,
            multi_lock_all_or_nothing,
            multi_lock_opposite_orders,
            multi_lock_dropped_leaves_nothing,
            striped_keys_share_stripes,
            semaphore_acquire_many,
            election_campaign_follow_again,
            $($extra,)*
        );
    };
    (@tests $backend:ident, $setup:expr, $caps:expr; $($scenario:ident),+ $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                #[allow(clippy::needless_update)]
                fn $scenario() {
                    $crate::conformance::run_test(
                        stringify!($backend),
                        stringify!($scenario),
                        $caps,
                        $setup,
                        $crate::conformance::scenarios::$scenario,
                    );
                }
            )+
        }
    };
}
