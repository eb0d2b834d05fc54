//! The capability table of the crate docs (`src/backend/capabilities.md`) against what a client
//! of each store answers: one row per store, every store the suite's servers provide (the URLs
//! `scripts/test.sh` sets; an unset one fails, it never skips).

use dlock::conformance::{env_url, with_option};
use dlock::{Capabilities, Validity, Wakeups};

const TABLE: &str = include_str!("../src/backend/capabilities.md");

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// A row of the table, as the store answers it.
fn row(store: &str, c: Capabilities) -> String {
    let wakeups = match c.wakeups {
        Wakeups::Native => "notification".to_owned(),
        Wakeups::Polling { min, max } => {
            format!("polling {}–{} ms", min.as_millis(), max.as_millis())
        }
    };
    let validity = match c.validity {
        Validity::Lease => "lease",
        Validity::Session => "session",
    };
    format!(
        "| {store} | {} | {wakeups} | {validity} | {} | {} | {} |",
        yes(c.fencing),
        yes(c.queues_waiters),
        yes(c.values),
        yes(c.hands_off)
    )
}

fn url(var: &str) -> String {
    env_url(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the suite through scripts/test.sh, which starts the server")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_capabilities_are_what_each_store_answers() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("caps.db").display());
    let (pg, my) = (url("DLOCK_TEST_POSTGRES_URL"), url("DLOCK_TEST_MYSQL_URL"));
    let stores = [
        ("`mem://`", "mem://caps".to_owned()),
        ("`sqlite://`", sqlite),
        ("`redis://`", url("DLOCK_TEST_REDIS_URL")),
        // The suite's URLs ask for grants confirmed by one replica (`replicas=1`).
        (
            "`redis+sentinel://…?replicas=1`",
            url("DLOCK_TEST_REDIS_SENTINEL_URL"),
        ),
        (
            "`redis+cluster://…?replicas=1`",
            url("DLOCK_TEST_REDIS_CLUSTER_URL"),
        ),
        ("`redlock://`", url("DLOCK_TEST_REDLOCK_URL")),
        ("`postgres://`", pg.clone()),
        (
            "`postgres://…?mode=session`",
            with_option(&pg, "mode=session"),
        ),
        ("`mysql://`", my.clone()),
        ("`mysql://…?mode=session`", with_option(&my, "mode=session")),
        ("`zk://`", url("DLOCK_TEST_ZK_URL")),
        ("`etcd://`", url("DLOCK_TEST_ETCD_URL")),
    ];
    let mut answered = Vec::new();
    for (store, u) in &stores {
        if store.contains("replicas=1") {
            assert!(u.contains("replicas=1"), "{u}");
        }
        let client = dlock::connect(u).await.unwrap();
        answered.push(row(store, client.capabilities()));
    }
    let documented: Vec<&str> = TABLE
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(str::trim_end)
        .collect();
    assert_eq!(
        documented,
        answered,
        "src/backend/capabilities.md differs from the stores' answers; the answers:\n{}",
        answered.join("\n")
    );
}
