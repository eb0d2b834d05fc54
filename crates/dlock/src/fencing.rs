//! Fencing: making your own resource refuse writes from a holder that no longer holds the lock.
//!
//! # Why a lock alone is not enough
//!
//! A lease-based lock guarantees that at most one client *believes* it holds the lock only while
//! every client's clock and scheduler behave. A holder can be paused after it checked that it
//! still holds the lock and before its write reaches the resource — a GC pause, a swapped-out
//! process, a `SIGSTOP`, a slow network packet. Meanwhile its lease runs out, another client is
//! granted the lock and writes; then the paused holder wakes up and overwrites the newer data.
//! No check on the *client* side can close that gap, because the pause can happen right after the
//! check. (Martin Kleppmann, "How to do distributed locking", 2016.)
//!
//! The fix is on the *resource* side. Every grant carries a **fencing token**
//! ([`Guard::token`](crate::Guard::token)) that only grows: a later grant of the same lock always
//! has a larger token. The writer sends its token with every write, and the resource remembers
//! the largest token it has accepted and refuses any write with a smaller one. The paused holder's
//! write then arrives with an old token and is refused: the holder must stop.
//!
//! dlock accepts a write whose token is **equal** to the one stored (`fence <= token`): a token
//! belongs to exactly one grant, so an equal token is the same holder writing again under the
//! same grant, which must be allowed.
//!
//! Tokens come from every store except Redlock (`redlock://`, whose [`Guard::token`](crate::Guard::token) is `None`; see
//! `docs/BACKENDS.md`). Fence exclusive holds ([`Mutex`](crate::Mutex), a write lock): readers
//! and semaphore holders hold at the same time with different tokens.
//!
//! # In one process: [`Fenced`]
//!
//! [`Fenced<T>`] wraps a value inside one process (a cache, a file handle, a connection to a
//! server that cannot check tokens itself) so that a check and the write it allows happen under one
//! mutex:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dlock::fencing::Fenced;
//! let client = dlock::connect("mem://doc-fenced").await?;
//! let report = Fenced::new(String::new());
//!
//! let old = client.mutex("report")?.acquire().await?;
//! let old_token = old.token().expect("mem:// has fencing tokens");
//! drop(old); // say the holder was paused here and its lease ran out…
//!
//! let new = client.mutex("report")?.acquire().await?;
//! let new_token = new.token().expect("mem:// has fencing tokens");
//! report.write(new_token, |r| r.push_str("new"))?;
//!
//! // …the old holder wakes up: its write is refused and it must stop.
//! let stale = report.write(old_token, |r| r.push_str("old")).unwrap_err();
//! assert_eq!((stale.seen, stale.offered), (new_token, old_token));
//! assert_eq!(report.read(|r| r.clone()), "new");
//! # Ok(()) }
//! ```
//!
//! # In a SQL database: a `fence` column
//!
//! Give each row (or each row that one lock protects) a `fence BIGINT NOT NULL` column and make
//! every write conditional on it in the **same statement**:
//!
//! ```sql
//! -- PostgreSQL ($n), SQLite (?n or $n); MySQL/MariaDB: see below
//! UPDATE accounts SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3;
//! ```
//!
//! **0 rows affected means "stale: stop"** — a newer holder has written (or the row does not
//! exist; use the insert-or-update form when it may not). The condition is evaluated under the
//! row lock the `UPDATE` takes, so two writers cannot both pass it. A read-check-write in separate
//! statements is *not* fenced.
//!
//! When the row may not exist yet, insert or update in one statement:
//!
//! ```sql
//! -- PostgreSQL: 0 rows = stale
//! INSERT INTO accounts AS t (id, balance, fence) VALUES ($1, $2, $3)
//!   ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance, fence = EXCLUDED.fence
//!   WHERE t.fence <= EXCLUDED.fence;
//! -- SQLite (3.24+): 0 rows (changes()) = stale
//! INSERT INTO accounts (id, balance, fence) VALUES (?1, ?2, ?3)
//!   ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence = excluded.fence
//!   WHERE accounts.fence <= excluded.fence;
//! -- MySQL/MariaDB: assignments run left to right, so the fence is assigned last
//! INSERT INTO accounts (id, balance, fence) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE
//!   balance = IF(fence <= VALUES(fence), VALUES(balance), balance),
//!   fence = GREATEST(fence, VALUES(fence));
//! ```
//!
//! **MySQL/MariaDB caveat:** the upsert's affected-rows count is 1 for an insert, 2 for an update
//! and 0 for a refused (stale) write — but clients that set `CLIENT_FOUND_ROWS` (sqlx, and many
//! others) get 1 for a refused write too. With such a client, use the guarded `UPDATE` (whose
//! count is reliable: it counts rows *matching* `fence <= token`), then a plain `INSERT` when it
//! matched nothing, then the `UPDATE` once more if the `INSERT` failed with a duplicate key
//! (another writer created the row first). [`FencedWrite`] builds all of these statements.
//!
//! The fence column can live in the rows themselves (one lock per row) or in a row of its own
//! that every fenced write updates in the same transaction (one lock for many rows): the write
//! transaction first runs the guarded `UPDATE` of the fence row, stops on 0 rows, then writes.
//!
//! **Read-modify-write: fence the read too.** If the new holder only *reads* before it writes,
//! an old holder's late write can still land between that read and the new holder's write (the
//! fence has not moved yet), and the new holder's write then silently undoes it: a lost update.
//! `dlock-chaos` found exactly this with MySQL session locks after a paused holder resumed. Raise
//! the fence before reading — run the guarded `UPDATE … SET fence = $token WHERE … AND fence <=
//! $token` first (or read and write in one transaction that starts with it) — so the old holder's
//! write is refused from the moment the new holder starts.

use std::fmt;

/// A value that accepts writes only from the newest lock holder: a fenced resource inside one
/// process. See the [module documentation](self).
///
/// The highest token seen and the value are behind one mutex, so the check and the write it
/// allows are one step. Thread-safe; share it with an `Arc`.
#[derive(Debug, Default)]
pub struct Fenced<T> {
    inner: std::sync::Mutex<(u64, T)>,
}

/// A write refused by a fenced resource: its token is older than one already accepted. The
/// writer has lost its lock (even if it has not noticed yet) and must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleToken {
    /// The highest token the resource has accepted.
    pub seen: u64,
    /// The token of the refused write.
    pub offered: u64,
}

impl fmt::Display for StaleToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stale fencing token {}: the resource has accepted token {} (the lock was lost; stop)",
            self.offered, self.seen
        )
    }
}

impl std::error::Error for StaleToken {}

impl<T> Fenced<T> {
    /// Wraps `value`; no token has been seen yet (every token is accepted first).
    pub fn new(value: T) -> Self {
        Fenced {
            inner: std::sync::Mutex::new((0, value)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, T)> {
        // A panic inside a caller's closure poisons the mutex; the token bookkeeping is still
        // consistent (it is updated before the closure runs), so carry on.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the value if `token` is at least the highest token accepted so far (and records
    /// it); otherwise refuses with [`StaleToken`] without calling `f`.
    pub fn write<R>(&self, token: u64, f: impl FnOnce(&mut T) -> R) -> Result<R, StaleToken> {
        let mut g = self.lock();
        if token < g.0 {
            return Err(StaleToken {
                seen: g.0,
                offered: token,
            });
        }
        g.0 = token;
        Ok(f(&mut g.1))
    }

    /// Checks `token` and records it, as [`Fenced::write`] does, without touching the value.
    pub fn check(&self, token: u64) -> Result<(), StaleToken> {
        self.write(token, |_| ())
    }

    /// Runs `f` on the value (reads are not fenced).
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.lock().1)
    }

    /// The highest token accepted so far, `None` before the first write.
    pub fn highest_token(&self) -> Option<u64> {
        Some(self.lock().0).filter(|t| *t > 0)
    }

    /// Unwraps the value.
    pub fn into_inner(self) -> T {
        self.inner
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
    }
}

/// The SQL dialect a [`FencedWrite`] statement is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SqlDialect {
    /// PostgreSQL: `$1`, `$2`… placeholders.
    Postgres,
    /// MySQL and MariaDB: `?` placeholders.
    MySql,
    /// SQLite: `?1`, `?2`… placeholders.
    Sqlite,
}

/// Builds fenced SQL statements for one table: "write only if my token is the newest".
///
/// Every statement takes its parameters in the same order, each once: **the key, the value
/// columns in the order given, the token** (PostgreSQL and SQLite number their placeholders;
/// the MySQL statements are shaped so that their `?`s come in that order). Identifiers must be
/// plain (`[A-Za-z_][A-Za-z0-9_]*`, at most 64 bytes, optionally `schema.table` for the table);
/// they are used unquoted. See the [module documentation](self) for how to read the outcomes.
///
/// ```
/// use dlock::fencing::{FencedWrite, SqlDialect};
/// let w = FencedWrite::new("accounts", "id", "fence", &["balance"])?;
/// assert_eq!(
///     w.update_sql(SqlDialect::Postgres),
///     "UPDATE accounts SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3"
/// );
/// assert!(FencedWrite::new("accounts; DROP TABLE x", "id", "fence", &[]).is_err());
/// # Ok::<(), dlock::Error>(())
/// ```
///
/// Run on SQLite with sqlx (the `sqlite` feature, on by default):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use dlock::fencing::{FencedWrite, SqlDialect};
/// use sqlx::Connection;
/// let mut db = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
/// sqlx::query("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, fence BIGINT NOT NULL)")
///     .execute(&mut db).await?;
/// let w = FencedWrite::new("jobs", "id", "fence", &["state"])?;
/// let upsert = w.upsert_sql(SqlDialect::Sqlite);
/// let write = |state: &'static str, token: i64| {
///     sqlx::query(&upsert).bind("nightly").bind(state).bind(token)
/// };
/// assert_eq!(write("run by 5", 5).execute(&mut db).await?.rows_affected(), 1);
/// assert_eq!(write("run by 4", 4).execute(&mut db).await?.rows_affected(), 0); // stale: stop
/// assert_eq!(write("run by 6", 6).execute(&mut db).await?.rows_affected(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    table: String,
    key: String,
    fence: String,
    values: Vec<String>,
}

fn check_ident(what: &str, s: &str, dotted: bool) -> crate::Result<String> {
    let part_ok = |p: &str| {
        let mut c = p.chars();
        matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
            && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && p.len() <= 64
    };
    let ok = match s.split_once('.') {
        Some((schema, name)) if dotted => part_ok(schema) && part_ok(name),
        _ => part_ok(s),
    };
    if ok {
        Ok(s.to_string())
    } else {
        Err(crate::Error::InvalidConfig(format!(
            "{what} {s:?} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 bytes)"
        )))
    }
}

impl FencedWrite {
    /// Describes a table whose rows are found by `key_column`, carry their fence in
    /// `fence_column`, and get `value_columns` written. [`crate::Error::InvalidConfig`] when an
    /// identifier is not plain or a column is named twice.
    pub fn new(
        table: &str,
        key_column: &str,
        fence_column: &str,
        value_columns: &[&str],
    ) -> crate::Result<Self> {
        let w = FencedWrite {
            table: check_ident("table", table, true)?,
            key: check_ident("key column", key_column, false)?,
            fence: check_ident("fence column", fence_column, false)?,
            values: value_columns
                .iter()
                .map(|c| check_ident("value column", c, false))
                .collect::<crate::Result<_>>()?,
        };
        let mut all: Vec<String> = w.columns().map(str::to_ascii_lowercase).collect();
        all.sort();
        if all.windows(2).any(|p| p[0] == p[1]) {
            return Err(crate::Error::InvalidConfig(format!(
                "fenced write on {}: a column is named twice",
                w.table
            )));
        }
        Ok(w)
    }

    /// Key, values, fence: the column order of the parameters.
    fn columns(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.key.as_str())
            .chain(self.values.iter().map(String::as_str))
            .chain(std::iter::once(self.fence.as_str()))
    }

    /// Placeholder of parameter `i` (1-based).
    fn p(d: SqlDialect, i: usize) -> String {
        match d {
            SqlDialect::Postgres => format!("${i}"),
            SqlDialect::Sqlite => format!("?{i}"),
            SqlDialect::MySql => "?".to_string(),
        }
    }

    /// The guarded update: writes the values and the token only where `key = ?` and the stored
    /// fence is at most the token. **0 rows affected = stale (or no such row): stop.**
    pub fn update_sql(&self, d: SqlDialect) -> String {
        let (t, k, f) = (&self.table, &self.key, &self.fence);
        let n = self.values.len();
        match d {
            SqlDialect::MySql => {
                // A derived table of the parameters keeps them in order, each used once.
                let params: Vec<String> = self.columns().map(|c| format!("? AS {c}")).collect();
                let sets: String = self
                    .values
                    .iter()
                    .chain(std::iter::once(f))
                    .map(|c| format!("t.{c} = w.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!(
                    "UPDATE {t} AS t JOIN (SELECT {}) AS w ON t.{k} = w.{k} SET {sets} WHERE t.{f} <= w.{f}",
                    params.join(", ")
                )
            }
            _ => {
                let token = Self::p(d, n + 2);
                let mut sets: Vec<String> = self
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{c} = {}", Self::p(d, i + 2)))
                    .collect();
                sets.push(format!("{f} = {token}"));
                format!(
                    "UPDATE {t} SET {} WHERE {k} = {} AND {f} <= {token}",
                    sets.join(", "),
                    Self::p(d, 1)
                )
            }
        }
    }

    /// A plain insert of a new row (key, values, token). Fails with a duplicate-key error when the
    /// row exists; part of the MySQL update → insert → update sequence.
    pub fn insert_sql(&self, d: SqlDialect) -> String {
        let cols: Vec<&str> = self.columns().collect();
        let ps: Vec<String> = (1..=cols.len()).map(|i| Self::p(d, i)).collect();
        format!(
            "INSERT INTO {} ({}) VALUES ({})",
            self.table,
            cols.join(", "),
            ps.join(", ")
        )
    }

    /// Insert-or-update in one statement. PostgreSQL and SQLite: **0 rows affected = stale**.
    /// MySQL/MariaDB: 0 rows = stale only for clients without `CLIENT_FOUND_ROWS` (with it, a
    /// refused write reports 1 like an insert; see the [module documentation](self)).
    pub fn upsert_sql(&self, d: SqlDialect) -> String {
        let (t, k, f) = (&self.table, &self.key, &self.fence);
        let insert = self.insert_sql(d);
        match d {
            SqlDialect::MySql => {
                let mut sets: Vec<String> = self
                    .values
                    .iter()
                    .map(|c| format!("{c} = IF({f} <= VALUES({f}), VALUES({c}), {c})"))
                    .collect();
                sets.push(format!("{f} = GREATEST({f}, VALUES({f}))"));
                format!("{insert} ON DUPLICATE KEY UPDATE {}", sets.join(", "))
            }
            SqlDialect::Postgres | SqlDialect::Sqlite => {
                let (alias, excluded, insert) = if d == SqlDialect::Postgres {
                    // `INSERT INTO t AS t`: the alias names the existing row in the WHERE.
                    let insert = insert.replacen(
                        &format!("INSERT INTO {t} "),
                        &format!("INSERT INTO {t} AS dlock_t "),
                        1,
                    );
                    ("dlock_t".to_string(), "EXCLUDED", insert)
                } else {
                    (t.clone(), "excluded", insert)
                };
                let sets: Vec<String> = self
                    .values
                    .iter()
                    .chain(std::iter::once(f))
                    .map(|c| format!("{c} = {excluded}.{c}"))
                    .collect();
                format!(
                    "{insert} ON CONFLICT ({k}) DO UPDATE SET {} WHERE {alias}.{f} <= {excluded}.{f}",
                    sets.join(", ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_refuses_older_tokens() {
        let f = Fenced::new(0u32);
        assert_eq!(f.highest_token(), None);
        assert_eq!(f.write(5, |v| *v = 5), Ok(()));
        assert_eq!(f.write(5, |v| *v += 1), Ok(())); // same grant writes again
        let e = f.write(4, |v| *v = 4).unwrap_err();
        assert_eq!(
            e,
            StaleToken {
                seen: 5,
                offered: 4
            }
        );
        assert!(e.to_string().contains("stale fencing token 4"), "{e}");
        assert_eq!(
            f.check(3),
            Err(StaleToken {
                seen: 5,
                offered: 3
            })
        );
        assert_eq!(f.write(6, |v| *v * 10), Ok(60));
        assert_eq!(f.highest_token(), Some(6));
        assert_eq!(f.read(|v| *v), 6);
        assert_eq!(f.into_inner(), 6);
    }

    #[test]
    fn fenced_is_one_step_across_threads() {
        // Many writers with random tokens: the sequence of applied tokens never goes down.
        let f = std::sync::Arc::new(Fenced::new(Vec::<u64>::new()));
        let hs: Vec<_> = (0..4u64)
            .map(|i| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for n in 0..500u64 {
                        let _ = f.write((n * 7 + i * 13) % 1000 + 1, |v| {
                            v.push((n * 7 + i * 13) % 1000 + 1)
                        });
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("writer thread");
        }
        let applied = f.read(|v| v.clone());
        assert!(!applied.is_empty());
        assert!(applied.windows(2).all(|w| w[0] <= w[1]), "{applied:?}");
    }

    #[test]
    fn statements() {
        let w = FencedWrite::new("app.jobs", "id", "fence", &["state", "owner"]).unwrap();
        assert_eq!(
            w.update_sql(SqlDialect::Sqlite),
            "UPDATE app.jobs SET state = ?2, owner = ?3, fence = ?4 WHERE id = ?1 AND fence <= ?4"
        );
        assert_eq!(
            w.update_sql(SqlDialect::MySql),
            "UPDATE app.jobs AS t JOIN (SELECT ? AS id, ? AS state, ? AS owner, ? AS fence) AS w \
             ON t.id = w.id SET t.state = w.state, t.owner = w.owner, t.fence = w.fence \
             WHERE t.fence <= w.fence"
        );
        assert_eq!(
            w.upsert_sql(SqlDialect::Postgres),
            "INSERT INTO app.jobs AS dlock_t (id, state, owner, fence) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, owner = EXCLUDED.owner, \
             fence = EXCLUDED.fence WHERE dlock_t.fence <= EXCLUDED.fence"
        );
        assert_eq!(
            w.upsert_sql(SqlDialect::MySql),
            "INSERT INTO app.jobs (id, state, owner, fence) VALUES (?, ?, ?, ?) ON DUPLICATE KEY \
             UPDATE state = IF(fence <= VALUES(fence), VALUES(state), state), \
             owner = IF(fence <= VALUES(fence), VALUES(owner), owner), \
             fence = GREATEST(fence, VALUES(fence))"
        );
        // No value columns: a pure fence row.
        let f = FencedWrite::new("fences", "name", "token", &[]).unwrap();
        assert_eq!(
            f.update_sql(SqlDialect::Postgres),
            "UPDATE fences SET token = $2 WHERE name = $1 AND token <= $2"
        );
        for (t, k, fc, v) in [
            ("", "id", "fence", vec![]),
            ("t;drop", "id", "fence", vec![]),
            ("t", "id id", "fence", vec![]),
            ("t", "id", "fence", vec!["a'"]),
            ("t", "id", "fence", vec!["ID"]),
            ("t", "id", "id", vec![]),
            ("a.b.c", "id", "fence", vec![]),
            ("t", "1id", "fence", vec![]),
            ("t", "id", "f\u{e9}nce", vec![]),
        ] {
            let e = FencedWrite::new(t, k, fc, &v).unwrap_err();
            assert!(
                matches!(e, crate::Error::InvalidConfig(_)),
                "{t} {k} {fc}: {e}"
            );
        }
        assert!(FencedWrite::new(&"x".repeat(65), "id", "fence", &[]).is_err());
    }
}

/// The documented statements run on the real stores: token 5 writes, 4 is refused, 6 writes, for
/// the guarded update and the insert-or-update form.
#[cfg(all(test, any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
mod store_tests {
    use super::*;
    #[allow(unused_imports)]
    use sqlx::{Connection, Executor};

    fn table() -> String {
        format!("dlock_fence_{}", uuid::Uuid::new_v4().simple())
    }

    #[allow(dead_code)]
    fn env_url(var: &str) -> String {
        match std::env::var(var) {
            Ok(u) if !u.trim().is_empty() => u,
            _ => panic!("{var} is not set: run the tests through scripts/test.sh, which starts the server and sets it"),
        }
    }

    /// Runs the update and upsert scenario; `exec` answers the rows affected by a statement with
    /// (key, value, token) bound.
    macro_rules! scenario {
        ($conn:expr, $d:expr, $t:expr) => {{
            let conn = $conn;
            let t: &str = $t;
            let w = FencedWrite::new(t, "id", "fence", &["v"]).unwrap();
            let up = w.update_sql($d);
            let ups = w.upsert_sql($d);
            let ins = w.insert_sql($d);
            macro_rules! run {
                ($sql:expr, $v:expr, $tok:expr) => {
                    sqlx::query($sql)
                        .bind("row1".to_string())
                        .bind($v.to_string())
                        .bind($tok as i64)
                };
            }
            let q = format!("SELECT v, fence FROM {t} WHERE id = 'row1'");
            macro_rules! read {
                ($c:expr) => {
                    sqlx::query_as::<_, (String, i64)>(&q)
                        .fetch_one($c)
                        .await
                        .unwrap()
                };
            }
            // The guarded update on a missing row: 0 rows; insert it with token 5.
            assert_eq!(
                run!(&up, "x", 5)
                    .execute(&mut *conn)
                    .await
                    .unwrap()
                    .rows_affected(),
                0
            );
            assert_eq!(
                run!(&ins, "five", 5)
                    .execute(&mut *conn)
                    .await
                    .unwrap()
                    .rows_affected(),
                1
            );
            assert!(
                run!(&ins, "again", 5).execute(&mut *conn).await.is_err(),
                "duplicate insert"
            );
            assert_eq!(
                run!(&up, "four", 4)
                    .execute(&mut *conn)
                    .await
                    .unwrap()
                    .rows_affected(),
                0,
                "stale update"
            );
            assert_eq!(read!(&mut *conn), ("five".to_string(), 5));
            assert_eq!(
                run!(&up, "five again", 5)
                    .execute(&mut *conn)
                    .await
                    .unwrap()
                    .rows_affected(),
                1
            );
            assert_eq!(
                run!(&up, "six", 6)
                    .execute(&mut *conn)
                    .await
                    .unwrap()
                    .rows_affected(),
                1
            );
            assert_eq!(read!(&mut *conn), ("six".to_string(), 6));
            // The upsert form, from an empty table.
            sqlx::query(&format!("DELETE FROM {t}"))
                .execute(&mut *conn)
                .await
                .unwrap();
            assert_eq!(
                run!(&ups, "five", 5)
                    .execute(&mut *conn)
                    .await
                    .unwrap()
                    .rows_affected(),
                1,
                "insert"
            );
            let stale = run!(&ups, "four", 4)
                .execute(&mut *conn)
                .await
                .unwrap()
                .rows_affected();
            if $d == SqlDialect::MySql {
                // sqlx sets CLIENT_FOUND_ROWS: a refused write reports 1 (documented caveat).
                assert!(stale <= 1, "{stale}");
            } else {
                assert_eq!(stale, 0, "stale upsert");
            }
            assert_eq!(read!(&mut *conn), ("five".to_string(), 5));
            assert!(
                run!(&ups, "six", 6)
                    .execute(&mut *conn)
                    .await
                    .unwrap()
                    .rows_affected()
                    >= 1
            );
            assert_eq!(read!(&mut *conn), ("six".to_string(), 6));
            let _ = run!(&ups, "five", 5).execute(&mut *conn).await.unwrap();
            assert_eq!(read!(&mut *conn), ("six".to_string(), 6));
        }};
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_statements() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("f.db").display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let t = table();
        c.execute(&*format!(
            "CREATE TABLE {t} (id TEXT PRIMARY KEY, v TEXT NOT NULL, fence BIGINT NOT NULL)"
        ))
        .await
        .unwrap();
        scenario!(&mut c, SqlDialect::Sqlite, &t);
    }

    /// Creates a fresh table, runs the scenario in a task, drops the table whatever happened.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    macro_rules! on_server {
        ($conn_ty:ty, $var:expr, $d:expr, $create:expr) => {{
            let url = env_url($var);
            let t = table();
            let (u2, t2) = (url.clone(), t.clone());
            let r = tokio::spawn(async move {
                let mut c = <$conn_ty>::connect(&u2).await.unwrap();
                c.execute(&*format!($create, t2)).await.unwrap();
                scenario!(&mut c, $d, &t2);
            })
            .await;
            let mut c = <$conn_ty>::connect(&url).await.unwrap();
            c.execute(&*format!("DROP TABLE IF EXISTS {t}"))
                .await
                .unwrap();
            if let Err(e) = r {
                std::panic::resume_unwind(e.into_panic());
            }
        }};
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_statements() {
        on_server!(
            sqlx::PgConnection,
            "DLOCK_TEST_POSTGRES_URL",
            SqlDialect::Postgres,
            "CREATE TABLE {} (id TEXT PRIMARY KEY, v TEXT NOT NULL, fence BIGINT NOT NULL)"
        );
    }

    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn mysql_statements() {
        on_server!(
            sqlx::MySqlConnection,
            "DLOCK_TEST_MYSQL_URL",
            SqlDialect::MySql,
            "CREATE TABLE {} (id VARCHAR(64) PRIMARY KEY, v TEXT NOT NULL, fence BIGINT NOT NULL)"
        );
    }
}
