//! Transient refusals inside a wait (issue 22): 120 `dlock run --wait 60s` processes at once
//! against a store that admits 100 connections. A process the store turns away while it connects
//! or attempts (PostgreSQL "sorry, too many clients already", MariaDB "Too many connections",
//! Redis "max number of clients reached") tries again until its --wait runs out, so every one of
//! them runs its command, one at a time.
//!
//! Connections a `dlock run` process opens: PostgreSQL 2 (the pool's, which one acquisition
//! uses at a time, and the LISTEN connection); MariaDB 1 (the pool's; it polls); Redis 2 (the
//! multiplexed command connection and, while it waits, the pub/sub connection).
//!
//! Each test starts a private server (the machine's shared ones are never limited) and checks
//! that the server did turn clients away, so the retry path was taken.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use dlock_testkit::{Db, RedisServer, SqlServer};
use sqlx::Connection;

const CROWD: usize = 120;
const LIMIT: u32 = 100;

/// Runs the crowd against `url`; every process must exit 0 within its --wait. The command
/// takes a directory as its "in the critical section" mark: a second holder finds it taken and
/// exits 99.
async fn crowd(url: &str, scratch: &Path) {
    let mark = scratch.join("inside");
    let script = format!(
        "mkdir '{m}' 2>/dev/null || exit 99; sleep 0.02; rmdir '{m}'",
        m = mark.display()
    );
    let started = Instant::now();
    let mut children = Vec::new();
    for _ in 0..CROWD {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args([
                "run",
                "--url",
                url,
                "--wait",
                "60s",
                "crowd/job",
                "-c",
                &script,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("dlock run starts");
        children.push(child);
    }
    let mut failed = Vec::new();
    for c in children {
        let out = tokio::time::timeout(Duration::from_secs(90), c.wait_with_output())
            .await
            .expect("a dlock run hung past its --wait")
            .unwrap();
        if !out.status.success() {
            failed.push(format!(
                "{:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {CROWD} failed (99 = two holders at once):\n{}",
        failed.len(),
        failed.join("\n")
    );
    eprintln!(
        "{CROWD} processes entered one at a time in {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crowd_past_max_connections_all_enter() {
    let mut server = SqlServer::start(Db::Postgres).expect("a private PostgreSQL");
    let base = server.base_url();
    let mut c = sqlx::PgConnection::connect(&base).await.unwrap();
    let limit: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&mut c)
        .await
        .unwrap();
    if limit != LIMIT.to_string() {
        sqlx::query(&format!("ALTER SYSTEM SET max_connections = {LIMIT}"))
            .execute(&mut c)
            .await
            .unwrap();
        drop(c);
        tokio::task::block_in_place(|| server.restart()).unwrap();
    } else {
        drop(c);
    }
    let scratch = tempfile::tempdir().unwrap();
    crowd(&server.url(""), scratch.path()).await;
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap();
    let refused = log.matches("too many clients already").count();
    assert!(refused > 0, "the server never turned a client away");
    eprintln!("PostgreSQL turned {refused} connections away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_crowd_past_max_connections_all_enter() {
    let server = SqlServer::start(Db::MariaDb).expect("a private MariaDB");
    let base = server.base_url();
    let mut c = sqlx::MySqlConnection::connect(&base).await.unwrap();
    sqlx::query(&format!("SET GLOBAL max_connections = {LIMIT}"))
        .execute(&mut c)
        .await
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    crowd(&server.url(""), scratch.path()).await;
    let (_, refused): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Connection_errors_max_connections'")
            .fetch_one(&mut c)
            .await
            .unwrap();
    let refused: u64 = refused.parse().unwrap();
    assert!(refused > 0, "the server never turned a client away");
    eprintln!("MariaDB turned {refused} connections away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_crowd_past_maxclients_all_enter() {
    let limit = LIMIT.to_string();
    let server = RedisServer::start(&["--maxclients", &limit, "--save", "", "--appendonly", "no"])
        .expect("a private redis-server");
    let scratch = tempfile::tempdir().unwrap();
    crowd(&server.url(), scratch.path()).await;
    let stats = server.cli(&["INFO", "stats"]);
    let refused: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("rejected_connections:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(refused > 0, "the server never turned a client away");
    eprintln!("Redis turned {refused} connections away");
}
