//! # The dlock conformance suite
//!
//! One suite, generic over the store URL, that every backend must pass. Each scenario is an
//! `async fn(Store)` in `conformance/scenarios/`; the [`conformance!`] macro below turns every
//! scenario into one `#[tokio::test]` per backend, named `<backend>::<scenario>`:
//!
//! ```text
//! cargo nextest run -p dlock-cli --test conformance                        # every backend
//! cargo nextest run -p dlock-cli --test conformance -E 'test(/^sqlite::/)' # one backend
//! cargo nextest run -p dlock-cli --test conformance fair_fifo_order         # one scenario
//! ```
//!
//! (The names are `sqlite::fair_fifo_order` rather than `sqlite_fair_fifo_order` because
//! `macro_rules!` cannot glue identifiers together without the `paste` crate; a module per
//! backend gives the same grouping and filtering.)
//!
//! ## Adding a backend: one line
//!
//! ```text
//! conformance!(NAME, URL_FN, Caps { cross_process: BOOL });
//! ```
//!
//! - `NAME`: the backend's short name (the test module, e.g. `redis`).
//! - `URL_FN`: `|t| ...` gets the test's [`harness::Ctx`] and returns the store URL as a `String`,
//!   or an `Option<String>` where `None` means "not configured here": the backend's tests then
//!   fail with a message saying to run them through `scripts/test.sh` (never skip). `t` displays
//!   as an id unique to the test (`[a-z0-9_-]`; use it for an in-process store name, a database or
//!   key prefix) and `t.path("file")` is a file in a temporary directory of the test.
//! - `cross_process`: whether separate OS processes with the same URL share locks. Only when true
//!   are the multi-process scenarios generated; they run `dlock run` processes against the URL
//!   (they need the backend in the `dlock` binary too).
//!
//! A server-backed store takes its URL from the environment; every scenario already uses lock
//! names under `conf/<unique id>/`, so tests running in parallel against one server do not meet:
//!
//! ```text
//! conformance!(redis, |_| env_url("DLOCK_TEST_REDIS_URL"), Caps { cross_process: true });
//! conformance!(postgres, |_| env_url("DLOCK_TEST_POSTGRES_URL"), Caps { cross_process: true });
//! ```
//!
//! ## Adding a scenario
//!
//! Write `pub async fn my_scenario(s: Store)` in `conformance/scenarios/` (real assertions;
//! every wait bounded through `within`/`must`/`eventually`; lock names from `s.name(..)`), and add
//! its name to the list in the macro below. Time bounds are generous: they prove a mechanism
//! (a renewal, a wake-up, an expiry), not a speed. One backend's whole suite should stay under
//! about a minute of wall time.

#[path = "conformance/harness.rs"]
mod harness;
#[path = "conformance/scenarios/mod.rs"]
mod scenarios;

#[allow(unused_imports)]
use harness::{env_url, Caps};

/// `conformance!(backend, |t| url, Caps { .. })`: one test per scenario for this backend. The
/// multi-process scenarios are generated only for stores shared between processes (a scenario that
/// does not apply is not a test, rather than a test that passes without running).
macro_rules! conformance {
    // A mutex-only store without fencing (Redlock): the scenarios run their mutex parts and check
    // that fair mode, rwlocks and semaphores answer `Unsupported` (the fencing assertions accept
    // `token() == None` only because the store reports `fencing: false`). Not generated, one line
    // each:
    // - rwlock_shared_exclusive, semaphore_limit, fair_fifo_order: nothing of them is a mutex.
    // - describe_shows_holders: its listing assertions are built on held rwlocks and semaphores;
    //   Redlock's describe is covered by its own tests (holders seen on a majority, no token).
    ($backend:ident, $url:expr, Caps { cross_process: true, mutex_only: true } $(,)?) => {
        conformance!(@tests $backend, $url, Caps { cross_process: true, mutex_only: true };
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
            mutual_exclusion_processes,
        );
    };
    ($backend:ident, $url:expr, Caps { cross_process: true } $(,)?) => {
        conformance!(@all $backend, $url, Caps { cross_process: true, mutex_only: false }; mutual_exclusion_processes,);
    };
    ($backend:ident, $url:expr, Caps { cross_process: false } $(,)?) => {
        conformance!(@all $backend, $url, Caps { cross_process: false, mutex_only: false };);
    };
    (@all $backend:ident, $url:expr, $caps:expr; $($extra:ident,)*) => {
        conformance!(@tests $backend, $url, $caps;
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
            rwlock_shared_exclusive,
            semaphore_limit,
            fair_fifo_order,
            waiter_wakes_by_notification,
            bad_input,
            describe_shows_holders,
            dropped_guard_releases,
            $($extra,)*
        );
    };
    (@tests $backend:ident, $url:expr, $caps:expr; $($scenario:ident),+ $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    crate::harness::run(
                        stringify!($backend),
                        stringify!($scenario),
                        $caps,
                        $url,
                        crate::scenarios::$scenario,
                    )
                    .await;
                }
            )+
        }
    };
}

// ---- the backends ------------------------------------------------------------------------------

// In-process store: one store per test (the test's unique id as the store name). Not shared with
// other processes, so the multi-process scenarios are not generated for it (and
// `holder_killed_taken_over` simulates the dead holder in-process).
conformance!(
    mem,
    |t| format!("mem://{t}"),
    Caps {
        cross_process: false
    }
);

// Embedded SQLite: a fresh database file per test, shared with the `dlock run` processes the
// multi-process scenarios start.
conformance!(
    sqlite,
    |t| format!("sqlite://{}", t.path("locks.db").display()),
    Caps {
        cross_process: true
    }
);

// ZooKeeper: the three-server ensemble `scripts/test.sh` starts (DLOCK_TEST_ZK_URL, with a 2 s
// session timeout: a dead holder is taken over after the session timeout, not the lease).
conformance!(
    zookeeper,
    |_| env_url("DLOCK_TEST_ZK_URL"),
    Caps {
        cross_process: true
    }
);

// Redis: the server `scripts/test.sh` starts (its URL in DLOCK_TEST_REDIS_URL); every scenario
// uses lock names under `conf/<unique id>/`, so tests share the server without meeting.
conformance!(
    redis,
    |_| env_url("DLOCK_TEST_REDIS_URL"),
    Caps {
        cross_process: true
    }
);

// Redlock: five private redis-servers `scripts/test.sh` starts (DLOCK_TEST_REDLOCK_URL); mutex
// only and no fencing token: see the mutex-only arm above.
conformance!(
    redlock,
    |_| env_url("DLOCK_TEST_REDLOCK_URL"),
    Caps {
        cross_process: true,
        mutex_only: true
    }
);

// PostgreSQL and MariaDB: the machine's servers (`scripts/test.sh` starts them when down); lease
// tables named `dlock_locks`, lock names unique per test.
conformance!(
    postgres,
    |_| env_url("DLOCK_TEST_POSTGRES_URL"),
    Caps {
        cross_process: true
    }
);

conformance!(
    mysql,
    |_| env_url("DLOCK_TEST_MYSQL_URL"),
    Caps {
        cross_process: true
    }
);

// PostgreSQL and MariaDB in session mode (advisory / GET_LOCK session locks on a connection per
// hold): mutexes only, no fair mode, as the mutex-only arm checks; fencing tokens from the
// fence table.
conformance!(
    postgres_session,
    |_| env_url("DLOCK_TEST_POSTGRES_URL").map(|u| harness::with_option(&u, "mode=session")),
    Caps {
        cross_process: true,
        mutex_only: true
    }
);

conformance!(
    mysql_session,
    |_| env_url("DLOCK_TEST_MYSQL_URL").map(|u| harness::with_option(&u, "mode=session")),
    Caps {
        cross_process: true,
        mutex_only: true
    }
);
