//! # The conformance suite's multi-process scenarios
//!
//! The conformance suite lives in the library ([`dlock::conformance`], cargo feature
//! `conformance`) and runs on every store in `crates/dlock/tests/conformance.rs`. The scenarios
//! here are the ones that need separate OS processes: they start `dlock run` processes of this
//! package's binary against the store the test uses, so they run only on stores that processes
//! share (not `mem://`):
//!
//! - `mutual_exclusion_processes`: 32 `dlock run` read-sleep-write rounds, 4 processes at a time;
//! - `holder_killed_taken_over`: a SIGKILLed `dlock run` holder is taken over after its lease
//!   (the in-process part, a forgotten guard, is the library's scenario of the same name);
//! - `waiter_wakes_by_notification`: a `dlock run` waiting in another process is woken (the
//!   in-process waiters are the library's scenario of the same name);
//! - `elect_standby_takes_over`: two `dlock elect` supervisors; the standby leads after the
//!   leader is SIGKILLed, and after the new leader is SIGSTOPped past its term, and the commands
//!   of two terms never run at once;
//! - `multi_lock_processes`, `multi_lock_killed_waiter_leaves_nothing`: multi-locks of three
//!   names in two processes (the scenario's test re-executes itself as the second process), in
//!   opposite orders, and a waiting one SIGKILLed;
//! - `observer_sees_other_processes`: an election's observer sees a leader of another process
//!   come and go, by the store's notification where it has one.
//!
//! Each store line generates one `#[test]` per scenario, named `<backend>::<scenario>`, on the
//! library's harness ([`dlock::conformance::run_test`], [`Store`](dlock::conformance::Store)):
//!
//! ```text
//! cargo nextest run -p dlock-cli --test conformance                         # every backend
//! cargo nextest run -p dlock-cli --test conformance -E 'test(/^sqlite::/)'  # one backend
//! ```
//!
//! A store line is `processes!(NAME, SETUP, Caps { .. })` as in the library's `conformance!`,
//! except that `SETUP` must answer a URL (the processes connect to it): a server-backed store
//! takes it from the environment (`DLOCK_TEST_*_URL`, set by `scripts/test.sh`; unset fails the
//! test, it never skips), and the store must be in the `dlock` binary.

#[path = "conformance/processes.rs"]
mod processes;

use dlock::conformance::{env_url, with_option, Store};
use std::path::Path;

/// The `dlock` binary of this package.
pub const DLOCK_BIN: &str = env!("CARGO_BIN_EXE_dlock");

/// The URL of the store, which the `dlock` processes connect to.
pub fn store_url(s: &Store) -> &str {
    s.url()
        .expect("the multi-process scenarios need a store URL that `dlock run` can connect to")
}

/// A `dlock run --url URL OPTS... NAME -- CMD...` command (the child is killed if the test drops
/// it; stdin is closed; `DLOCK_URL` is not inherited).
pub fn dlock_run(url: &str, opts: &[&str], name: &str, cmd: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(DLOCK_BIN);
    c.arg("run")
        .args(["--url", url])
        .args(opts)
        .args([name, "--"])
        .args(cmd)
        .env_remove("DLOCK_URL")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    c
}

/// Reads a file the test's child processes wrote ("" if it does not exist).
pub fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `processes!(backend, |t| url, Caps { .. })`: one test per multi-process scenario for this
/// store, in a module named `backend`.
macro_rules! processes {
    ($backend:ident, $setup:expr $(, Caps { $($field:ident : $value:tt),* $(,)? })? $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            processes!(@tests $backend, $setup,
                dlock::conformance::Caps { $($($field: $value,)*)? ..Default::default() };
                mutual_exclusion_processes,
                holder_killed_taken_over,
                waiter_wakes_by_notification,
                elect_standby_takes_over,
                multi_lock_processes,
                multi_lock_killed_waiter_leaves_nothing,
                observer_sees_other_processes,
            );
        }
    };
    (@tests $backend:ident, $setup:expr, $caps:expr; $($scenario:ident),+ $(,)?) => {
        $(
            #[test]
            #[allow(clippy::needless_update)] // `Caps { .. }` may name every field
            fn $scenario() {
                dlock::conformance::run_test(
                    stringify!($backend),
                    stringify!($scenario),
                    $caps,
                    $setup,
                    crate::processes::$scenario,
                );
            }
        )+
    };
}

// ---- the backends (every store the `dlock` binary has that processes share) ------------------

// Embedded SQLite: a fresh database file per test, shared with the `dlock run` processes.
processes!(sqlite, |t| format!(
    "sqlite://{}",
    t.path("locks.db").display()
));

// ZooKeeper: the three-server ensemble `scripts/test.sh` starts (DLOCK_TEST_ZK_URL, with a 2 s
// session timeout: a dead holder is taken over after the session timeout, not the lease).
processes!(zookeeper, |_| env_url("DLOCK_TEST_ZK_URL"));

// etcd: the three-member cluster `scripts/test.sh` starts (DLOCK_TEST_ETCD_URL, with a 2 s lease
// TTL: a dead holder is taken over after the TTL).
processes!(etcd, |_| env_url("DLOCK_TEST_ETCD_URL"));

// Redis (one server; Sentinel and Cluster with replicas=1), Redlock (five private redis-servers), PostgreSQL and MariaDB (lease tables), as
// `scripts/test.sh` provides them.
processes!(redis, |_| env_url("DLOCK_TEST_REDIS_URL"));
processes!(redis_sentinel, |_| env_url("DLOCK_TEST_REDIS_SENTINEL_URL"));
processes!(redis_cluster, |_| env_url("DLOCK_TEST_REDIS_CLUSTER_URL"));
processes!(
    redlock,
    |_| env_url("DLOCK_TEST_REDLOCK_URL"),
    Caps { mutex_only: true }
);
processes!(postgres, |_| env_url("DLOCK_TEST_POSTGRES_URL"));
processes!(mysql, |_| env_url("DLOCK_TEST_MYSQL_URL"));

// PostgreSQL and MariaDB in session mode: a hold ends with its holder's connection, so a killed
// holder is taken over at once.
processes!(
    postgres_session,
    |_| env_url("DLOCK_TEST_POSTGRES_URL").map(|u| with_option(&u, "mode=session")),
    Caps {
        mutex_only: true,
        ends_with_connection: true
    }
);
processes!(
    mysql_session,
    |_| env_url("DLOCK_TEST_MYSQL_URL").map(|u| with_option(&u, "mode=session")),
    Caps {
        mutex_only: true,
        ends_with_connection: true
    }
);
