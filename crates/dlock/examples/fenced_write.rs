//! A fenced write: the resource itself refuses a write from a holder that lost the lock.
//!
//! The lock's fencing token ([`Guard::token`](dlock::Guard::token)) is stored with the data, and
//! every write carries the writer's token in the same statement:
//!
//! ```sql
//! UPDATE dlock_example_report SET body = $1, fence = $2 WHERE id = 1 AND fence <= $2
//! ```
//!
//! Holder A takes the lock with a short lease and no renewal, then "pauses" (a GC pause, a
//! SIGSTOP, a slow network) past its lease. Holder B is granted the lock with a larger token and
//! writes. When A wakes up and writes with its old token, the `UPDATE` matches no row: the write
//! is refused by the database, not by a check in A that could itself be late. (`fence <= token`,
//! not `<`: a token belongs to one grant, so the same holder may write again; see
//! `dlock::fencing`.)
//!
//! The resource is PostgreSQL when `DLOCK_EXAMPLE_POSTGRES_URL` is set (the example creates and
//! empties a table `dlock_example_report` there), else an SQLite database file in a temporary
//! directory, so it runs with no set-up. The locks are on the embedded SQLite store.
//!
//! ```sh
//! cargo run -p dlock-rs --example fenced_write
//! DLOCK_EXAMPLE_POSTGRES_URL=postgres://postgres@127.0.0.1/test cargo run -p dlock-rs --example fenced_write
//! ```

use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;
use std::time::Duration;

/// The fenced write: 1 row changed = written, 0 rows = refused (a newer holder has written).
async fn write(db: &AnyPool, body: &str, token: u64) -> Result<bool, sqlx::Error> {
    let token = i64::try_from(token).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let done = sqlx::query(
        "UPDATE dlock_example_report SET body = $1, fence = $2 WHERE id = 1 AND fence <= $2",
    )
    .bind(body)
    .bind(token)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    sqlx::any::install_default_drivers();
    let dir = tempfile::tempdir()?;
    let db_url = match std::env::var("DLOCK_EXAMPLE_POSTGRES_URL") {
        Ok(u) if !u.trim().is_empty() => u,
        _ => format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("resource.db").display()
        ),
    };
    let db = AnyPoolOptions::new()
        .max_connections(2)
        .connect(&db_url)
        .await?;
    println!("resource: {}", dlock::redact_url(&db_url));
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS dlock_example_report \
         (id BIGINT PRIMARY KEY, body TEXT NOT NULL, fence BIGINT NOT NULL)",
    )
    .execute(&db)
    .await?;
    sqlx::query("DELETE FROM dlock_example_report")
        .execute(&db)
        .await?;
    sqlx::query("INSERT INTO dlock_example_report (id, body, fence) VALUES (1, '', 0)")
        .execute(&db)
        .await?;

    let lock_url = format!("sqlite://{}", dir.path().join("locks.db").display());
    println!("locks:    {lock_url}");
    let (a, b) = (
        dlock::connect(&lock_url).await?,
        dlock::connect(&lock_url).await?,
    );

    // A: a 300 ms lease, not renewed, so a pause longer than that costs A the lock.
    let guard_a = a
        .mutex("reports/daily")?
        .lease(Duration::from_millis(300))
        .auto_renew(false)
        .acquire()
        .await?;
    let token_a = guard_a
        .token()
        .ok_or("the SQLite store has fencing tokens")?;
    println!("A holds the lock, token {token_a}; A pauses");

    // B waits for the lock, which it gets once A's lease has run out.
    let guard_b = b
        .mutex("reports/daily")?
        .acquire_timeout(Duration::from_secs(5))
        .await?;
    let token_b = guard_b
        .token()
        .ok_or("the SQLite store has fencing tokens")?;
    println!("B holds the lock, token {token_b}");
    assert!(token_b > token_a, "tokens only grow");
    assert!(
        write(&db, "written by B", token_b).await?,
        "B holds the newest token"
    );
    println!("B writes with token {token_b}: written");

    // A wakes up, unaware (it did not check `lost()`), and writes with its old token.
    let a_written = write(&db, "written by A, late", token_a).await?;
    println!(
        "A writes with token {token_a}: {}",
        if a_written {
            "written (!)"
        } else {
            "refused: A must stop"
        }
    );
    assert!(!a_written, "the stale holder's write must be refused");
    assert!(!guard_a.is_held(), "A's lease has run out");

    // B may write again under the same grant.
    assert!(write(&db, "written by B again", token_b).await?);
    let (body, fence): (String, i64) =
        sqlx::query_as("SELECT body, fence FROM dlock_example_report WHERE id = 1")
            .fetch_one(&db)
            .await?;
    println!("the row now: body = {body:?}, fence = {fence}");
    assert_eq!(body, "written by B again");
    assert_eq!(u64::try_from(fence)?, token_b);
    guard_b.release().await?;
    drop(guard_a);
    println!("ok: the resource refused the stale write");
    Ok(())
}
