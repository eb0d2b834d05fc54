//! The in-process conformance suite ([`dlock::conformance`]) on every store of dlock: one line
//! per store, one test per scenario, named `<store>::<scenario>`.
//!
//! ```text
//! cargo nextest run -p dlock-rs --features conformance,redis,redlock,zookeeper,postgres,mysql,etcd \
//!     --test conformance [-E 'test(/^sqlite::/)']
//! ```
//!
//! The server-backed stores take their URLs from the environment variables `scripts/test.sh`
//! sets (`DLOCK_TEST_REDIS_URL`, `DLOCK_TEST_REDLOCK_URL`, `DLOCK_TEST_POSTGRES_URL`,
//! `DLOCK_TEST_MYSQL_URL`, `DLOCK_TEST_ZK_URL`, `DLOCK_TEST_ETCD_URL`); without one, that store's tests fail with a
//! message (they never skip). Every scenario uses lock names under `conf/<unique id>/`, so tests
//! running in parallel against one server do not meet. The scenarios that need separate OS
//! processes (`dlock run`) are in `crates/dlock-cli/tests/conformance.rs`.

use dlock::backend::{memory::MemoryBackend, Backend};
use dlock::conformance::{env_url, with_option, Ctx, Factory};
use std::sync::Arc;

// In-process store: one store per test (the test's unique id as the store name).
dlock::conformance!(mem, |t| format!("mem://{t}"));

// The in-process store again, reached through a backend factory rather than a URL: the way a
// store written outside this crate runs the suite.
fn mem_backend(t: &Ctx) -> Factory {
    let name = t.id().to_owned();
    Factory::backend(format!("mem-backend://{name}"), move || {
        let name = name.clone();
        async move { Ok(Arc::new(MemoryBackend::named(&name)) as Arc<dyn Backend>) }
    })
}
dlock::conformance!(mem_factory, mem_backend);

// Embedded SQLite: a fresh database file per test.
dlock::conformance!(sqlite, |t| format!(
    "sqlite://{}",
    t.path("locks.db").display()
));

// ZooKeeper: the three-server ensemble `scripts/test.sh` starts (DLOCK_TEST_ZK_URL, with a 2 s
// session timeout: a dead holder is taken over after the session timeout, not the lease).
dlock::conformance!(zookeeper, |_| env_url("DLOCK_TEST_ZK_URL"));

// etcd: the three-member cluster `scripts/test.sh` starts (DLOCK_TEST_ETCD_URL, with a 2 s lease
// TTL: a dead holder is taken over after the TTL, not the hold's lease).
dlock::conformance!(etcd, |_| env_url("DLOCK_TEST_ETCD_URL"));

// Redis: the server `scripts/test.sh` starts (DLOCK_TEST_REDIS_URL).
dlock::conformance!(redis, |_| env_url("DLOCK_TEST_REDIS_URL"));

// Redis Sentinel (1 master, 2 replicas, 3 sentinels) and Redis Cluster (3 masters with a replica
// each) that `scripts/test.sh` starts with scripts/redis-ha.sh; every grant and renewal confirmed
// by one replica (`replicas=1`, WAIT).
dlock::conformance!(redis_sentinel, |_| env_url("DLOCK_TEST_REDIS_SENTINEL_URL"));
dlock::conformance!(redis_cluster, |_| env_url("DLOCK_TEST_REDIS_CLUSTER_URL"));

// Redlock: five private redis-servers `scripts/test.sh` starts (DLOCK_TEST_REDLOCK_URL); mutex
// only and no fencing token.
dlock::conformance!(
    redlock,
    |_| env_url("DLOCK_TEST_REDLOCK_URL"),
    Caps { mutex_only: true }
);

// PostgreSQL and MariaDB: the machine's servers (`scripts/test.sh` starts them when down); lease
// tables named `dlock_locks`, lock names unique per test.
dlock::conformance!(postgres, |_| env_url("DLOCK_TEST_POSTGRES_URL"));
dlock::conformance!(mysql, |_| env_url("DLOCK_TEST_MYSQL_URL"));

// PostgreSQL and MariaDB in session mode (advisory / GET_LOCK session locks on a connection per
// hold): mutexes only, no fair mode; fencing tokens from the fence table; a hold ends with its
// connection.
dlock::conformance!(
    postgres_session,
    |_| env_url("DLOCK_TEST_POSTGRES_URL").map(|u| with_option(&u, "mode=session")),
    Caps {
        mutex_only: true,
        ends_with_connection: true
    }
);
dlock::conformance!(
    mysql_session,
    |_| env_url("DLOCK_TEST_MYSQL_URL").map(|u| with_option(&u, "mode=session")),
    Caps {
        mutex_only: true,
        ends_with_connection: true
    }
);
