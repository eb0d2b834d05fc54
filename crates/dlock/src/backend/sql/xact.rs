//! PostgreSQL transaction locks: a lock taken inside the caller's own sqlx transaction
//! (`pg_advisory_xact_lock`) and released by the server when that transaction commits or rolls
//! back.
//!
//! - **The key** is session mode's (`?mode=session`): [`advisory_key`]`(table, name)`, the
//!   FNV-1a 64-bit hash of `<table>`, a NUL byte and the name, as a signed integer. A
//!   transaction lock and a session-mode hold of the same name and table exclude each other,
//!   in both directions. Lease mode (the default `mode=lease`) keeps its holds as rows and takes
//!   no advisory lock, so it is **not** excluded (see [`XactOptions::from_url`]).
//! - **The fencing token** is the name's row in `<table>_fences`, the counter session mode (and
//!   lease mode) bumps: `INSERT … ON CONFLICT (name) DO UPDATE SET fence = fence + 1 RETURNING
//!   fence`, in the caller's transaction. It commits or vanishes with that transaction, so
//!   tokens strictly increase over committed transactions and session-mode holds of the name.
//!   The fence row stays locked until the transaction ends: a **lease-mode** grant of the same
//!   name waits for it (up to its 5 s lock timeout).
//! - **The tables** are created in the transaction when `<table>_fences` is missing (the
//!   `_meta` and `_fences` tables of session mode's schema, under session mode's migration lock,
//!   which is then held to the end of the transaction); that needs `CREATE` on the schema.
//!   Connecting a dlock client to the URL once creates them too.
//! - **Nothing to renew, no `lost()`**: the transaction bounds the hold. A failed statement (a
//!   `statement_timeout` among them) aborts the transaction: the lock stays until the rollback
//!   and nothing more commits. `idle_in_transaction_session_timeout`, a killed backend or a lost
//!   connection end the transaction: the lock is freed and its writes are rolled back with it;
//!   only what the client does outside the database after that is unprotected.
//! - **Transaction pooling** (PgBouncer `pool_mode = transaction`) keeps one server session for
//!   the whole transaction, so these locks work behind it, unlike session mode.
//! - **Isolation**: use READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ or
//!   SERIALIZABLE the transaction's snapshot is taken at its first statement, possibly before the
//!   lock was granted, so it might not see the previous holder's writes; the token's
//!   `INSERT … ON CONFLICT` then fails with a serialization failure (SQLSTATE 40001, in
//!   [`Error::Backend`]) rather than go on with a stale snapshot: retry the transaction.
//! - **Savepoints**: a lock taken after a savepoint is released by `ROLLBACK TO` that savepoint
//!   (a rolled-back nested sqlx transaction); otherwise it lasts to the end of the outermost
//!   transaction. Taking a name twice in one transaction succeeds with a new token.
//! - **Dropping** a sqlx transaction rolls it back in the background (when its connection is
//!   next used or back in the pool), so the lock is free shortly after the drop, not at it;
//!   `rollback().await` frees it at once. A call whose future is dropped mid-wait leaves the
//!   connection mid-statement: drop the transaction too.

use super::config::{validate_table, Dialect, HoldMode, SqlConfig, DEFAULT_TABLE};
use super::server::{advisory_key, migration, ROWS, SCHEMA_VERSION};
use crate::error::{Error, Result};
use crate::name::LockName;
use sqlx::{Executor, PgConnection, Postgres, Row, Transaction};
use std::time::{Duration, Instant};

/// The savepoint around a bounded wait.
const SAVEPOINT: &str = "dlock_xact_lock";

/// A granted transaction lock. It is held until the transaction that took it commits or rolls
/// back; there is no early release (PostgreSQL has none for transaction locks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XactLock {
    name: LockName,
    key: i64,
    token: u64,
}

impl XactLock {
    /// The lock name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The PostgreSQL advisory-lock key: [`advisory_key`]`(table, name)`, the key of session
    /// mode. It shows in `pg_locks` as `(classid::bigint << 32) | objid::bigint` with
    /// `objsubid = 1`.
    pub fn key(&self) -> i64 {
        self.key
    }

    /// The fencing token: greater than every token of the name handed out before this
    /// transaction by committed transaction locks and by session-mode (and lease-mode) holds of
    /// the same table.
    ///
    /// It is written in this transaction, so use it for writes **in the same transaction** (for
    /// example to a table that session-mode holders also write, fenced): they commit or vanish
    /// together. Do not give it to another system before the transaction has committed: when the
    /// transaction rolls back, the next holder gets the same token again.
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// How the lock statement waits.
enum Wait {
    /// `pg_advisory_xact_lock`: until granted (bounded only by the session's own timeouts).
    Block,
    /// `pg_try_advisory_xact_lock`: not at all.
    Try,
    /// `pg_advisory_xact_lock` under a `lock_timeout` already set, restoring this value to it
    /// once granted.
    Restore(String),
}

/// Options of transaction locks: the table their keys and tokens belong to.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> dlock::Result<()> {
/// use dlock::backend::sql::xact::XactOptions;
/// // The URL the dlock session-mode clients use: same table, same keys, same tokens.
/// let locks = XactOptions::from_url("postgres://app@db/app?table=app_locks&mode=session")?;
/// let mut tx = pool.begin().await.map_err(dlock::Error::backend)?;
/// let lock = locks.xact_lock(&mut tx, "billing/run").await?;
/// println!("{} held with token {}", lock.name(), lock.token());
/// tx.commit().await.map_err(dlock::Error::backend)?; // releases it
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XactOptions {
    table: String,
}

impl Default for XactOptions {
    fn default() -> Self {
        XactOptions {
            table: DEFAULT_TABLE.to_string(),
        }
    }
}

impl XactOptions {
    /// The default table, `dlock_locks`: the keys of a session-mode URL without `table`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses `table` (the URL option `table` of the dlock clients to exclude).
    ///
    /// Errors: [`Error::InvalidConfig`] unless `table` is `[A-Za-z_][A-Za-z0-9_]{0,40}`.
    pub fn table(mut self, table: &str) -> Result<Self> {
        validate_table(table)?;
        self.table = table.to_string();
        Ok(self)
    }

    /// The options of a dlock PostgreSQL session-mode URL
    /// (`postgres://…?mode=session&table=…`): pass the URL the dlock clients use, and the
    /// transaction locks share their keys. Nothing is connected; only the table is taken.
    ///
    /// Errors: [`Error::InvalidConfig`] for anything [`crate::connect`] would refuse, for a
    /// MySQL/MariaDB URL (transaction locks are PostgreSQL only), and for a URL without
    /// `mode=session`: lease-mode holds are rows, not advisory locks, and a transaction lock
    /// would not exclude them (use [`XactOptions::table`] for the table alone).
    ///
    /// ```
    /// use dlock::backend::sql::xact::XactOptions;
    /// let o = XactOptions::from_url("postgres://app@db/app?mode=session&table=app_locks")?;
    /// assert_eq!(o.table_name(), "app_locks");
    /// assert!(XactOptions::from_url("postgres://app@db/app").is_err()); // lease mode
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let cfg = SqlConfig::parse(url)?;
        if cfg.dialect != Dialect::Postgres {
            return Err(Error::InvalidConfig(format!(
                "{}: transaction locks are PostgreSQL only (pg_advisory_xact_lock)",
                cfg.shown
            )));
        }
        if cfg.mode != HoldMode::Session {
            return Err(Error::InvalidConfig(format!(
                "{}: transaction locks exclude only session-mode holds (?mode=session); \
                 lease-mode holds are table rows that a transaction lock does not see. Use \
                 mode=session in the clients' URL, or XactOptions::table for the table alone",
                cfg.shown
            )));
        }
        Ok(XactOptions { table: cfg.table })
    }

    /// The table name.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// The advisory-lock key of `name` ([`XactLock::key`]).
    ///
    /// Errors: [`Error::InvalidName`] for an invalid name.
    pub fn key(&self, name: &str) -> Result<i64> {
        Ok(advisory_key(&self.table, LockName::new(name)?.as_str()))
    }

    /// Takes the transaction lock `name` in `tx`, waiting as long as it takes
    /// (`pg_advisory_xact_lock`); see [`xact_lock`].
    pub async fn xact_lock(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        name: &str,
    ) -> Result<XactLock> {
        let name = LockName::new(name)?;
        let started = Instant::now();
        self.take(tx, &name, Wait::Block)
            .await?
            .ok_or_else(|| busy(&name))
            .map_err(|e| timeout_after(e, started))
    }

    /// Takes the transaction lock `name` in `tx` if it is free
    /// (`pg_try_advisory_xact_lock`); see [`try_xact_lock`].
    pub async fn try_xact_lock(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        name: &str,
    ) -> Result<XactLock> {
        let name = LockName::new(name)?;
        self.take(tx, &name, Wait::Try)
            .await?
            .ok_or_else(|| busy(&name))
    }

    /// Takes the transaction lock `name` in `tx`, waiting at most `timeout`; see
    /// [`xact_lock_timeout`].
    pub async fn xact_lock_timeout(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        name: &str,
        timeout: Duration,
    ) -> Result<XactLock> {
        let name = LockName::new(name)?;
        let conn: &mut PgConnection = tx;
        let started = Instant::now();
        // lock_timeout has millisecond resolution and 0 means "no limit": at least 1 ms, at
        // most its maximum (i32::MAX ms, about 24.8 days).
        let ms = timeout
            .as_nanos()
            .div_ceil(1_000_000)
            .clamp(1, i32::MAX as u128);
        let outcome = self.bounded(conn, &name, ms).await;
        match outcome {
            Ok(Some(lock)) => Ok(lock),
            Ok(None) => Err(busy(&name)),
            Err(e) => {
                // Back to the state before the call: the lock, the token, the tables, the
                // lock_timeout. Fails only if the savepoint is not there (the error was its
                // own) or the connection is gone; the caller sees the first error either way.
                let undo =
                    format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}");
                let _ = Executor::execute(&mut *conn, undo.as_str()).await;
                Err(timeout_after(e, started))
            }
        }
    }

    /// The bounded wait: a savepoint, `lock_timeout` set to `ms` in it, the lock (which puts
    /// the old `lock_timeout` back once granted) and the token, then the savepoint released.
    /// On an error the caller rolls back to the savepoint.
    async fn bounded(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        ms: u128,
    ) -> Result<Option<XactLock>> {
        // The savepoint keeps the transaction usable after a timeout (an error aborts a
        // PostgreSQL transaction); the old lock_timeout is read to be put back once granted.
        let enter = format!(
            "SAVEPOINT {SAVEPOINT}; SELECT current_setting('lock_timeout'); \
             SET LOCAL lock_timeout = '{ms}ms'"
        );
        let rows = Executor::fetch_all(&mut *conn, enter.as_str())
            .await
            .map_err(sql_err)?;
        let old: String = rows
            .first()
            .ok_or_else(|| Error::Backend("SELECT current_setting answered no row".into()))?
            .try_get(0)
            .map_err(sql_err)?;
        let got = self.take(conn, name, Wait::Restore(old)).await?;
        let leave = format!("RELEASE SAVEPOINT {SAVEPOINT}");
        Executor::execute(&mut *conn, leave.as_str())
            .await
            .map_err(sql_err)?;
        Ok(got)
    }

    /// The lock statement, the tables if missing, then the token: `None` when `Wait::Try`
    /// found the lock taken (nothing done). A lock timeout is `Error::Timeout` with a zero wait
    /// (the caller knows how long it waited).
    async fn take(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        wait: Wait,
    ) -> Result<Option<XactLock>> {
        let t = &self.table;
        let key = advisory_key(t, name.as_str());
        let fences = format!("{t}_fences");
        // One round trip: the lock, and whether the fence table is there. A function in FROM
        // runs before the select list, so `set_config` restores lock_timeout only once granted.
        let q = match &wait {
            Wait::Block => sqlx::query(
                "SELECT true, to_regclass($2) IS NOT NULL FROM pg_advisory_xact_lock($1)",
            ),
            Wait::Try => {
                sqlx::query("SELECT pg_try_advisory_xact_lock($1), to_regclass($2) IS NOT NULL")
            }
            Wait::Restore(_) => sqlx::query(
                "SELECT true, to_regclass($2) IS NOT NULL, set_config('lock_timeout', $3, true) \
                 FROM pg_advisory_xact_lock($1)",
            ),
        };
        let mut q = q.bind(key).bind(&fences);
        if let Wait::Restore(old) = &wait {
            q = q.bind(old.as_str());
        }
        let row = q
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| sql_err_in(e, name))?;
        let got: bool = row.try_get(0).map_err(sql_err)?;
        if !got {
            return Ok(None);
        }
        if !row.try_get::<bool, _>(1).map_err(sql_err)? {
            self.create_tables(conn).await?;
        }
        // The next token; the WHERE keeps an exhausted counter (no row) from overflowing.
        let fence: Option<i64> = sqlx::query(&format!(
            "INSERT INTO {t}_fences AS f (name, fence) VALUES ($1, 1) \
             ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1 \
             WHERE f.fence < 9223372036854775807 RETURNING f.fence"
        ))
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| sql_err_in(e, name))?
        .map(|r| r.try_get(0))
        .transpose()
        .map_err(sql_err)?;
        let Some(fence) = fence else {
            return Err(Error::InvalidConfig(format!(
                "fencing counter of {:?} is exhausted",
                name.as_str()
            )));
        };
        Ok(Some(XactLock {
            name: name.clone(),
            key,
            token: ROWS.token(fence)?,
        }))
    }

    /// Creates the store's tables as a dlock client does (the same migration and schema
    /// version, under its migration lock), in the caller's transaction.
    async fn create_tables(&self, conn: &mut PgConnection) -> Result<()> {
        let t = &self.table;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(advisory_key("dlock-migrate", t))
            .execute(&mut *conn)
            .await
            .map_err(sql_err)?;
        // The collation matters on MySQL only.
        for ddl in migration(Dialect::Postgres, t, "") {
            Executor::execute(&mut *conn, ddl.as_str())
                .await
                .map_err(sql_err)?;
        }
        sqlx::query(&format!(
            "INSERT INTO {t}_meta (meta_key, meta_value) VALUES ('schema_version', $1)
             ON CONFLICT (meta_key) DO NOTHING"
        ))
        .bind(SCHEMA_VERSION)
        .execute(&mut *conn)
        .await
        .map_err(sql_err)?;
        let v: i64 = sqlx::query(&format!(
            "SELECT meta_value FROM {t}_meta WHERE meta_key = 'schema_version'"
        ))
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_err)?
        .try_get(0)
        .map_err(sql_err)?;
        // Version 1 differs only in the holds table.
        if v > SCHEMA_VERSION {
            return Err(Error::Unavailable(format!(
                "table {t} has dlock schema version {v}; this dlock understands version \
                 {SCHEMA_VERSION} (upgrade dlock or use another table)"
            )));
        }
        Ok(())
    }
}

/// `Busy` for `name`.
fn busy(name: &LockName) -> Error {
    Error::Busy {
        name: name.as_str().to_string(),
    }
}

/// Fills in how long a timed-out call waited.
fn timeout_after(e: Error, started: Instant) -> Error {
    match e {
        Error::Timeout { name, .. } => Error::Timeout {
            name,
            waited: started.elapsed(),
        },
        e => e,
    }
}

/// A statement error of `name`'s lock or token: a lock timeout (SQLSTATE 55P03: our
/// `lock_timeout`, or the session's) is `Timeout`; the rest as [`sql_err`].
fn sql_err_in(e: sqlx::Error, name: &LockName) -> Error {
    match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03") => Error::Timeout {
            name: name.as_str().to_string(),
            waited: Duration::ZERO,
        },
        _ => sql_err(e),
    }
}

/// A driver error: connection trouble, a statement timeout or a server shutting down is
/// `Unavailable`; anything else (a serialization failure, no transaction block, a missing
/// privilege) is `Backend` with the sqlx error inside, whose SQLSTATE the caller can read.
fn sql_err(e: sqlx::Error) -> Error {
    let unavailable = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57") || c.starts_with("53")),
        _ => false,
    };
    if unavailable {
        Error::Unavailable(format!("PostgreSQL transaction lock: {e}"))
    } else {
        Error::backend(e)
    }
}

/// Takes the transaction lock `name` in `tx` with the default table (`dlock_locks`), waiting as
/// long as it takes (`pg_advisory_xact_lock`). The lock is released when `tx` commits or rolls
/// back; it excludes session-mode holds (`?mode=session`) of the same name and table. Use
/// [`XactOptions`] for another table.
///
/// The wait is bounded only by the session's own `lock_timeout` (then [`Error::Timeout`]) and
/// `statement_timeout` ([`Error::Unavailable`]); use [`xact_lock_timeout`] for a bound of your
/// own. Any error leaves the transaction aborted (as a failed statement does in PostgreSQL):
/// roll it back. Errors: [`Error::InvalidName`] (before anything is sent), [`Error::Timeout`],
/// [`Error::Unavailable`], [`Error::Backend`] (the sqlx error: a serialization failure under
/// REPEATABLE READ, a missing privilege).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use dlock::backend::sql::xact::xact_lock;
/// let mut tx = pool.begin().await?;
/// let lock = xact_lock(&mut tx, "accounts/42").await?;
/// sqlx::query("UPDATE accounts SET balance = balance - 10, fence = $1 WHERE id = 42")
///     .bind(lock.token() as i64)
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?; // releases the lock
/// # Ok(()) }
/// ```
pub async fn xact_lock(tx: &mut Transaction<'_, Postgres>, name: &str) -> Result<XactLock> {
    XactOptions::default().xact_lock(tx, name).await
}

/// Takes the transaction lock `name` in `tx` (default table) if it is free
/// (`pg_try_advisory_xact_lock`), as [`xact_lock`] otherwise.
///
/// Errors: [`Error::Busy`] when a transaction lock or a session-mode hold of the name is held
/// elsewhere: nothing was done and the transaction is usable as before. Other errors as
/// [`xact_lock`] (they leave the transaction aborted).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use dlock::backend::sql::xact::try_xact_lock;
/// let mut tx = pool.begin().await?;
/// match try_xact_lock(&mut tx, "reports/nightly").await {
///     Ok(_lock) => { /* this transaction runs the report */ }
///     Err(e) if e.is_not_granted() => println!("another transaction runs it"),
///     Err(e) => return Err(e.into()),
/// }
/// sqlx::query("SELECT 1").execute(&mut *tx).await?; // still usable after Busy
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn try_xact_lock(tx: &mut Transaction<'_, Postgres>, name: &str) -> Result<XactLock> {
    XactOptions::default().try_xact_lock(tx, name).await
}

/// Takes the transaction lock `name` in `tx` (default table), waiting at most `timeout`
/// (at least 1 ms; at most about 24.8 days, `lock_timeout`'s maximum).
///
/// The wait runs inside a savepoint under `SET LOCAL lock_timeout` (PostgreSQL interrupts
/// advisory-lock waits at `lock_timeout` with SQLSTATE 55P03). On **any** error, the timeout
/// included, it rolls back to that savepoint, so the transaction stays usable and is as it was
/// before the call; once granted, the transaction's `lock_timeout` is set back to what it was.
/// The session's `statement_timeout` still applies ([`Error::Unavailable`]).
///
/// Errors: [`Error::Timeout`] after `timeout`; others as [`xact_lock`], except that they leave
/// the transaction usable.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dlock::backend::sql::xact::xact_lock_timeout;
/// let mut tx = pool.begin().await?;
/// match xact_lock_timeout(&mut tx, "imports/daily", Duration::from_secs(2)).await {
///     Ok(lock) => println!("token {}", lock.token()),
///     Err(dlock::Error::Timeout { .. }) => println!("busy for 2 s; going on without it"),
///     Err(e) => return Err(e.into()),
/// }
/// sqlx::query("SELECT 1").execute(&mut *tx).await?; // usable either way
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn xact_lock_timeout(
    tx: &mut Transaction<'_, Postgres>,
    name: &str,
    timeout: Duration,
) -> Result<XactLock> {
    XactOptions::default()
        .xact_lock_timeout(tx, name, timeout)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::postgres::{PgPool, PgPoolOptions};
    use sqlx::Connection;

    /// The test server, as the other SQL tests find it (they fail, never skip, without it).
    fn base() -> String {
        std::env::var("DLOCK_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    /// A dlock URL of the test server with `table` and more options.
    fn url(table: &str, extra: &str) -> String {
        let b = base();
        let sep = if b.contains('?') { '&' } else { '?' };
        format!("{b}{sep}table={table}{extra}")
    }

    async fn pool() -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&base())
            .await
            .expect("the PostgreSQL test server (DLOCK_TEST_POSTGRES_URL)")
    }

    fn uniq(prefix: &str) -> String {
        format!("{prefix}/{}", uuid::Uuid::new_v4().simple())
    }

    const TABLE: &str = "dlt_xact";

    fn opts() -> XactOptions {
        XactOptions::new().table(TABLE).unwrap()
    }

    /// The stored fence of `name` in `table`.
    async fn stored_fence(pool: &PgPool, table: &str, name: &str) -> Option<i64> {
        sqlx::query(&format!("SELECT fence FROM {table}_fences WHERE name = $1"))
            .bind(name)
            .fetch_optional(pool)
            .await
            .unwrap()
            .map(|r| r.get(0))
    }

    async fn lock_timeout(tx: &mut Transaction<'_, Postgres>) -> String {
        sqlx::query("SELECT current_setting('lock_timeout')")
            .fetch_one(&mut **tx)
            .await
            .unwrap()
            .get(0)
    }

    /// The futures can be spawned (a generic sqlx executor in an `async fn` can make them
    /// `Send` only for one lifetime: `raw_sql(…).execute(&mut *conn)` did).
    #[allow(dead_code)]
    fn xact_futures_are_send(tx: &mut Transaction<'_, Postgres>) {
        fn is_send<T: Send>(_: T) {}
        is_send(xact_lock(tx, "n"));
        is_send(try_xact_lock(tx, "n"));
        is_send(xact_lock_timeout(tx, "n", Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn xact_try_is_busy_until_commit() {
        let pool = pool().await;
        let o = opts();
        let n = uniq("xact-commit");
        let mut a = pool.begin().await.unwrap();
        let la = o.try_xact_lock(&mut a, &n).await.unwrap();
        assert_eq!(la.name(), n);
        assert_eq!(la.key(), advisory_key(TABLE, &n));
        assert_eq!(la.key(), o.key(&n).unwrap());
        let mut b = pool.begin().await.unwrap();
        for _ in 0..3 {
            let e = o.try_xact_lock(&mut b, &n).await.unwrap_err();
            assert!(matches!(&e, Error::Busy { name } if *name == n), "{e}");
            // Busy leaves b's transaction usable.
            sqlx::query("SELECT 1").execute(&mut *b).await.unwrap();
        }
        // The key in pg_locks is the session-mode key, held by a's backend.
        let held: bool = sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
               AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1)",
        )
        .bind(la.key())
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
        assert!(held);
        a.commit().await.unwrap();
        let lb = o.try_xact_lock(&mut b, &n).await.unwrap();
        assert!(lb.token() > la.token(), "{lb:?} after {la:?}");
        b.commit().await.unwrap();
    }

    #[tokio::test]
    async fn xact_blocking_waits_for_commit() {
        let pool = pool().await;
        let o = opts();
        let n = uniq("xact-block");
        let mut a = pool.begin().await.unwrap();
        let la = o.xact_lock(&mut a, &n).await.unwrap();
        let (p, o2, n2) = (pool.clone(), o.clone(), n.clone());
        let waiter = tokio::spawn(async move {
            let mut b = p.begin().await.unwrap();
            let lb = o2.xact_lock(&mut b, &n2).await.unwrap();
            let at = Instant::now();
            b.commit().await.unwrap();
            (lb, at)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "granted while a holds it");
        let committed = Instant::now();
        a.commit().await.unwrap();
        let (lb, at) = waiter.await.unwrap();
        assert!(at >= committed);
        assert_eq!(lb.token(), la.token() + 1);
    }

    #[tokio::test]
    async fn xact_rollback_releases() {
        let pool = pool().await;
        let o = opts();
        let n = uniq("xact-rollback");
        let before = stored_fence(&pool, TABLE, &n).await;
        let mut a = pool.begin().await.unwrap();
        let la = o.xact_lock(&mut a, &n).await.unwrap();
        let mut b = pool.begin().await.unwrap();
        assert!(matches!(
            o.try_xact_lock(&mut b, &n).await,
            Err(Error::Busy { .. })
        ));
        a.rollback().await.unwrap();
        // The rolled-back token was never stored: the next holder gets it again.
        assert_eq!(stored_fence(&pool, TABLE, &n).await, before);
        let lb = o.try_xact_lock(&mut b, &n).await.unwrap();
        assert_eq!(lb.token(), la.token());
        b.commit().await.unwrap();
        // Dropping a transaction (sqlx rolls it back) releases it as well.
        let mut c = pool.begin().await.unwrap();
        o.try_xact_lock(&mut c, &n).await.unwrap();
        drop(c);
        let mut d = pool.begin().await.unwrap();
        let ld = o
            .xact_lock_timeout(&mut d, &n, Duration::from_secs(5))
            .await;
        assert!(ld.is_ok(), "{ld:?}");
        d.commit().await.unwrap();
    }

    #[tokio::test]
    async fn xact_timeout_keeps_the_transaction_usable() {
        let pool = pool().await;
        let o = opts();
        let n = uniq("xact-timeout");
        let mut a = pool.begin().await.unwrap();
        let la = o.xact_lock(&mut a, &n).await.unwrap();

        let mut b = pool.begin().await.unwrap();
        sqlx::query("CREATE TEMP TABLE xact_probe (v int) ON COMMIT DROP")
            .execute(&mut *b)
            .await
            .unwrap();
        sqlx::query("SET LOCAL lock_timeout = '7s'")
            .execute(&mut *b)
            .await
            .unwrap();
        let bound = Duration::from_millis(300);
        let t0 = Instant::now();
        let e = o.xact_lock_timeout(&mut b, &n, bound).await.unwrap_err();
        let took = t0.elapsed();
        match &e {
            Error::Timeout { name, waited } => {
                assert_eq!(*name, n);
                assert!(*waited >= bound && *waited <= took, "{waited:?}");
            }
            e => panic!("expected Timeout, got {e}"),
        }
        assert!(
            took >= bound && took < bound + Duration::from_secs(2),
            "{took:?}"
        );
        // b is usable: its earlier work is there, its lock_timeout is its own again, and it
        // commits.
        sqlx::query("SELECT 1").execute(&mut *b).await.unwrap();
        sqlx::query("INSERT INTO xact_probe VALUES (1)")
            .execute(&mut *b)
            .await
            .unwrap();
        assert_eq!(lock_timeout(&mut b).await, "7s");
        b.commit().await.unwrap();

        // A bounded wait that ends with a grant when the holder commits; lock_timeout restored.
        let (p, o2, n2) = (pool.clone(), o.clone(), n.clone());
        let waiter = tokio::spawn(async move {
            let mut c = p.begin().await.unwrap();
            sqlx::query("SET LOCAL lock_timeout = '9s'")
                .execute(&mut *c)
                .await
                .unwrap();
            let lc = o2
                .xact_lock_timeout(&mut c, &n2, Duration::from_secs(10))
                .await;
            let restored = lock_timeout(&mut c).await;
            c.commit().await.unwrap();
            (lc, restored)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        a.commit().await.unwrap();
        let (lc, restored) = waiter.await.unwrap();
        assert_eq!(lc.unwrap().token(), la.token() + 1);
        assert_eq!(restored, "9s");

        // Free: granted at once, the token stays after the savepoint is released.
        let mut d = pool.begin().await.unwrap();
        let ld = o
            .xact_lock_timeout(&mut d, &n, Duration::from_millis(1))
            .await
            .unwrap();
        assert_eq!(lock_timeout(&mut d).await, "0");
        d.commit().await.unwrap();
        assert_eq!(
            stored_fence(&pool, TABLE, &n).await,
            Some(ld.token() as i64)
        );
    }

    #[tokio::test]
    async fn xact_excludes_session_mode_both_ways_not_lease_mode() {
        let pool = pool().await;
        // The defaults: the free functions and a session-mode URL without `table`.
        let session = crate::connect(&format!(
            "{}{}mode=session",
            base(),
            if base().contains('?') { '&' } else { '?' }
        ))
        .await
        .unwrap();
        let n = uniq("xact-session");

        // A transaction lock keeps session mode out until it commits.
        let mut a = pool.begin().await.unwrap();
        let la = xact_lock(&mut a, &n).await.unwrap();
        assert_eq!(la.key(), advisory_key(DEFAULT_TABLE, &n));
        let e = session.mutex(&n).unwrap().try_acquire().await.unwrap_err();
        assert!(matches!(e, Error::Busy { .. }), "{e}");
        a.commit().await.unwrap();

        // A session-mode hold keeps transaction locks out until it is released.
        let g = session.mutex(&n).unwrap().try_acquire().await.unwrap();
        let tg = g.token().unwrap();
        assert!(tg > la.token(), "session token {tg} after {la:?}");
        let mut b = pool.begin().await.unwrap();
        assert!(matches!(
            try_xact_lock(&mut b, &n).await,
            Err(Error::Busy { .. })
        ));
        let e = xact_lock_timeout(&mut b, &n, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        g.release().await.unwrap();
        let lb = try_xact_lock(&mut b, &n).await.unwrap();
        assert!(lb.token() > tg, "{lb:?} after session token {tg}");
        b.commit().await.unwrap();

        // Lease mode (rows, no advisory lock) shares no key: a lease-mode hold does not keep a
        // transaction lock out...
        let lease = crate::connect(&url(TABLE, "")).await.unwrap();
        let o = opts();
        let m = uniq("xact-lease");
        let g = lease.mutex(&m).unwrap().try_acquire().await.unwrap();
        let mut c = pool.begin().await.unwrap();
        let lc = o.try_xact_lock(&mut c, &m).await.unwrap();
        assert!(lc.token() > g.token().unwrap());
        c.commit().await.unwrap();
        g.release().await.unwrap();
        // ...and a transaction lock does not refuse a lease-mode grant, which only waits for
        // the fence row the transaction bumped, until the transaction ends.
        let mut d = pool.begin().await.unwrap();
        let ld = o.try_xact_lock(&mut d, &m).await.unwrap();
        let m2 = m.clone();
        let grant = tokio::spawn(async move { lease.mutex(&m2).unwrap().try_acquire().await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!grant.is_finished(), "the fence row is locked by d");
        d.commit().await.unwrap();
        let g = grant.await.unwrap().unwrap();
        assert!(g.token().unwrap() > ld.token());
        g.release().await.unwrap();
    }

    #[tokio::test]
    async fn xact_session_mode_force_break_ends_the_transaction() {
        let pool = pool().await;
        let session = crate::connect(&url(TABLE, "&mode=session")).await.unwrap();
        let o = opts();
        let n = uniq("xact-break");
        let mut a = pool.begin().await.unwrap();
        o.xact_lock(&mut a, &n).await.unwrap();
        // Revoke marks rows only: the transaction keeps its lock.
        session
            .force_release(&n, crate::Force::Revoke)
            .await
            .unwrap();
        sqlx::query("SELECT 1").execute(&mut *a).await.unwrap();
        assert!(matches!(
            session.mutex(&n).unwrap().try_acquire().await,
            Err(Error::Busy { .. })
        ));
        // Break terminates the holder's backend: the transaction is gone, the lock free.
        let f = session
            .force_release(&n, crate::Force::Break)
            .await
            .unwrap();
        assert_eq!(f.removed, 1);
        assert!(sqlx::query("SELECT 1").execute(&mut *a).await.is_err());
        drop(a);
        let g = session.mutex(&n).unwrap().try_acquire().await.unwrap();
        g.release().await.unwrap();
    }

    #[tokio::test]
    async fn xact_repeatable_read_fails_loud_after_a_wait() {
        let pool = pool().await;
        let o = opts();
        let n = uniq("xact-rr");
        let mut a = pool.begin().await.unwrap();
        let la = o.xact_lock(&mut a, &n).await.unwrap();
        let (p, o2, n2) = (pool.clone(), o.clone(), n.clone());
        let waiter = tokio::spawn(async move {
            let mut b = p.begin().await.unwrap();
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *b)
                .await
                .unwrap();
            // The snapshot is taken here, before a's commit.
            sqlx::query("SELECT 1").execute(&mut *b).await.unwrap();
            let r = o2.xact_lock(&mut b, &n2).await;
            b.rollback().await.unwrap();
            r
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        a.commit().await.unwrap();
        let e = waiter.await.unwrap().unwrap_err();
        let code = match &e {
            Error::Backend(b) => b
                .downcast_ref::<sqlx::Error>()
                .and_then(|s| s.as_database_error())
                .and_then(|d| d.code())
                .map(|c| c.into_owned()),
            _ => None,
        };
        assert_eq!(code.as_deref(), Some("40001"), "{e}");
        // Nothing was stored: the next holder continues after a's token.
        let mut c = pool.begin().await.unwrap();
        assert_eq!(
            o.try_xact_lock(&mut c, &n).await.unwrap().token(),
            la.token() + 1
        );
        c.commit().await.unwrap();
    }

    #[tokio::test]
    async fn xact_tokens_strictly_increase() {
        let pool = pool().await;
        let o = opts();
        let session = crate::connect(&url(TABLE, "&mode=session")).await.unwrap();
        let n = uniq("xact-tokens");
        let mut last = 0u64;
        for round in 0..4 {
            for how in 0..3 {
                let mut tx = pool.begin().await.unwrap();
                let l = match how {
                    0 => o.xact_lock(&mut tx, &n).await,
                    1 => o.try_xact_lock(&mut tx, &n).await,
                    _ => {
                        o.xact_lock_timeout(&mut tx, &n, Duration::from_secs(1))
                            .await
                    }
                }
                .unwrap();
                assert!(
                    l.token() > last,
                    "round {round}: {} after {last}",
                    l.token()
                );
                last = l.token();
                tx.commit().await.unwrap();
            }
            // Session mode shares the counter.
            let g = session.mutex(&n).unwrap().try_acquire().await.unwrap();
            let t = g.token().unwrap();
            assert!(t > last, "session token {t} after {last}");
            last = t;
            g.release().await.unwrap();
        }
        // Twice in one transaction: PostgreSQL counts the lock, and each take is a new token.
        let mut tx = pool.begin().await.unwrap();
        let l1 = o.xact_lock(&mut tx, &n).await.unwrap();
        let l2 = o.try_xact_lock(&mut tx, &n).await.unwrap();
        assert!(l1.token() > last && l2.token() > l1.token());
        tx.commit().await.unwrap();
        assert_eq!(
            stored_fence(&pool, TABLE, &n).await,
            Some(l2.token() as i64)
        );
    }

    #[tokio::test]
    async fn xact_bad_name_and_bad_url() {
        let pool = pool().await;
        let o = opts();
        let mut tx = pool.begin().await.unwrap();
        let long = "x".repeat(256);
        for bad in ["", "a\0b", long.as_str()] {
            for e in [
                o.xact_lock(&mut tx, bad).await.unwrap_err(),
                o.try_xact_lock(&mut tx, bad).await.unwrap_err(),
                o.xact_lock_timeout(&mut tx, bad, Duration::from_secs(1))
                    .await
                    .unwrap_err(),
                xact_lock(&mut tx, bad).await.unwrap_err(),
            ] {
                assert!(matches!(e, Error::InvalidName(_)), "{bad:?}: {e}");
            }
            assert!(matches!(o.key(bad), Err(Error::InvalidName(_))));
        }
        // Nothing was sent: the transaction is fine.
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();

        let ok =
            XactOptions::from_url("postgresql://u:pw@h/db?mode=session&table=my_locks").unwrap();
        assert_eq!(ok.table_name(), "my_locks");
        assert_eq!(
            XactOptions::from_url("postgres://h/db?mode=session")
                .unwrap()
                .table_name(),
            DEFAULT_TABLE
        );
        assert_eq!(XactOptions::new().table_name(), DEFAULT_TABLE);
        for (bad, says) in [
            ("postgres://u:secret@h/db", "mode=session"),
            ("postgres://u:secret@h/db?mode=lease", "mode=session"),
            ("mysql://u:secret@h/db?mode=session", "PostgreSQL only"),
            ("postgres://h/db?mode=session&table=x;y", "table name"),
            ("postgres://h/db?mode=session&bogus=1", "unknown option"),
            ("postgres:///db?mode=session", "no host"),
            ("redis://h", "not a SQL store"),
            ("not a url", "malformed"),
        ] {
            let e = XactOptions::from_url(bad).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
            assert!(msg.contains(says), "{bad}: {msg}");
            assert!(!msg.contains("secret"), "{bad}: {msg}");
        }
        for bad in ["", "1abc", "a-b", "x; DROP TABLE y", &"a".repeat(42)] {
            assert!(matches!(
                XactOptions::new().table(bad),
                Err(Error::InvalidConfig(_))
            ));
        }
    }

    #[tokio::test]
    async fn xact_creates_the_fence_table_as_session_mode_does() {
        let pool = pool().await;
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..16];
        let (ours, theirs) = (format!("dlt_xnew_{suffix}"), format!("dlt_xref_{suffix}"));
        let o = XactOptions::new().table(&ours).unwrap();
        let n = uniq("xact-create");
        // A rolled-back first use leaves nothing behind; a committed one creates the tables.
        let mut tx = pool.begin().await.unwrap();
        assert_eq!(o.xact_lock(&mut tx, &n).await.unwrap().token(), 1);
        tx.rollback().await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let e = o
            .xact_lock_timeout(&mut tx, &n, Duration::from_secs(1))
            .await;
        assert_eq!(e.unwrap().token(), 1);
        tx.commit().await.unwrap();

        // Two first uses at once (other names, fresh tables): the second waits for the first's
        // migration lock, then finds the tables it committed.
        let (again, n1, n2) = (
            format!("dlt_xtwo_{suffix}"),
            uniq("xact-c1"),
            uniq("xact-c2"),
        );
        let o2 = XactOptions::new().table(&again).unwrap();
        let mut t1 = pool.begin().await.unwrap();
        o2.xact_lock(&mut t1, &n1).await.unwrap();
        let (p, o3) = (pool.clone(), o2.clone());
        let second = tokio::spawn(async move {
            let mut t2 = p.begin().await.unwrap();
            let l = o3.try_xact_lock(&mut t2, &n2).await;
            t2.commit().await.unwrap();
            l
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "waits for the migration lock");
        t1.commit().await.unwrap();
        assert_eq!(second.await.unwrap().unwrap().token(), 1);

        // Session mode opens it (schema version checked) and continues the counter.
        let session = crate::connect(&url(&ours, "&mode=session")).await.unwrap();
        let g = session.mutex(&n).unwrap().try_acquire().await.unwrap();
        assert_eq!(g.token(), Some(2));
        g.release().await.unwrap();

        // The same columns and version as the tables session mode creates itself.
        let _reference = crate::connect(&url(&theirs, "&mode=session"))
            .await
            .unwrap();
        let shape = |t: String| {
            let pool = pool.clone();
            async move {
                let mut out = Vec::new();
                for suffix in ["_fences", "_meta"] {
                    let cols: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
                        "SELECT column_name::text, data_type::text, is_nullable::text,
                                column_default::text
                         FROM information_schema.columns
                         WHERE table_name = $1 AND table_schema = current_schema()
                         ORDER BY ordinal_position",
                    )
                    .bind(format!("{t}{suffix}"))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                    out.push(format!("{suffix}: {cols:?}"));
                }
                let v: i64 = sqlx::query(&format!(
                    "SELECT meta_value FROM {t}_meta WHERE meta_key = 'schema_version'"
                ))
                .fetch_one(&pool)
                .await
                .unwrap()
                .get(0);
                out.push(format!("version {v}"));
                out
            }
        };
        let (a, b) = (shape(ours.clone()).await, shape(theirs.clone()).await);
        assert_eq!(a, b);
        assert!(a.last().unwrap().ends_with(&SCHEMA_VERSION.to_string()));
        drop(session);
        drop(_reference);
        for t in [&ours, &theirs, &again] {
            sqlx::raw_sql(&format!(
                "DROP TABLE IF EXISTS {t}, {t}_queue, {t}_fences, {t}_meta;
                 DROP PROCEDURE IF EXISTS {t}_grant_v1"
            ))
            .execute(&pool)
            .await
            .unwrap();
        }
    }

    #[tokio::test]
    async fn xact_outside_a_transaction_block_is_refused_by_the_timed_form() {
        // Only reachable by ending the sqlx transaction with raw SQL: the bounded form's
        // savepoint then fails, so no lock is taken and released at once unnoticed.
        let mut conn = sqlx::PgConnection::connect(&base()).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        (&mut *tx).execute("COMMIT").await.unwrap();
        let e = opts()
            .xact_lock_timeout(&mut tx, &uniq("xact-autocommit"), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("transaction block"), "{e}");
    }
}
