//! PostgreSQL and MySQL/MariaDB in lease mode: [`SqlBackend`], one backend over a [`Dialect`].
//! Tables, options and wake-ups are described in the [module docs](super).

use super::batch;
use super::bell::{bell_key, BellWait, Bells, Ring, Ringing, Rung, Take, Tried};
use super::common::{
    bind_hold, bind_waiter, extend_answers, extend_groups, grant, kind_columns, listing, ms,
    name_owner_pairs, placeholders, GrantWrites, HoldListing, Loaded, NameState, Renewed, Rows,
    StateRow, TxError, WaiterListing, STATE_REVOKED,
};
use super::config::{Dialect, HoldMode, SqlConfig};
use super::fast;
use crate::backend::group;
use crate::backend::*;
use crate::error::bounded;
use crate::error::Error;
use crate::signal::NameSignals;
use rand::Rng;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyConnection, AnyPool};
use sqlx::{ConnectOptions, Connection, Executor, Row};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

/// The shortest poll interval of a waiter without notification.
pub const POLL_MIN: Duration = Duration::from_millis(10);
/// The longest poll interval of a waiter without notification.
pub const POLL_MAX: Duration = Duration::from_millis(100);
/// Pooled connections per backend.
pub const MAX_CONNECTIONS: u32 = 5;
/// A pooled connection idle at least this long is pinged before it is used; see
/// [`ping_when_idle`].
pub const PING_IDLE: Duration = Duration::from_millis(500);
/// The longest any single operation (including connecting) may take before it is
/// [`Error::Unavailable`].
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// The server-side statement and lock-wait timeout.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The schema version this build writes and understands.
pub(super) const SCHEMA_VERSION: i64 = 2;
/// Where the rows live, for messages about corrupt rows.
pub(super) const ROWS: Rows = Rows("the dlock tables");
/// The MySQL type of the holds' `value` column: a `VARCHAR` (a `TEXT` column reads back as a
/// blob through sqlx's `Any` driver), long enough for [`MAX_VALUE_LEN`] bytes.
const MYSQL_VALUE: &str = "VARCHAR(4096) CHARACTER SET utf8mb4 NULL";
/// The columns of a hold row as [`bind_hold`] binds them.
pub(super) const HOLD_COLUMNS: &str = "name, owner, kind, permits, mode, fence, expires_at_ms, \
                                       acquired_at_ms, client_id, host, pid, value";
/// The placeholders of one row of [`HOLD_COLUMNS`].
pub(super) const HOLD_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// How often a deadlocked or serialization-failed transaction is tried.
const TX_TRIES: u32 = 4;

/// FNV-1a, 64 bits, over `table`, a NUL byte and `name`: the session-mode key. Offset basis
/// `0xcbf29ce484222325`, prime `0x100000001b3`.
pub fn fnv1a64(table: &str, name: &str) -> u64 {
    crate::backend::fnv1a64_bytes(table.bytes().chain([0u8]).chain(name.bytes()))
}

/// The PostgreSQL advisory-lock key of `name` in session mode: [`fnv1a64`] as a signed 64-bit
/// integer (two's complement).
pub fn advisory_key(table: &str, name: &str) -> i64 {
    i64::from_ne_bytes(fnv1a64(table, name).to_ne_bytes())
}

/// The MySQL `GET_LOCK` string of `name` in session mode: `<table>:<name>` when that is at most
/// 64 characters (the server's limit), else `<table>#<16 hex digits of fnv1a64>`.
pub fn mysql_lock_name(table: &str, name: &str) -> String {
    let direct = format!("{table}:{name}");
    if direct.chars().count() <= 64 {
        direct
    } else {
        format!("{table}#{:016x}", fnv1a64(table, name))
    }
}

// ---------------------------------------------------------------------------------------------
// Statements

/// Every statement, built once per backend with the table names and placeholders filled in.
#[derive(Debug)]
pub(super) struct Stmts {
    pub(super) now: String,
    pub(super) ensure_fence: String,
    pub(super) lock_fence: String,
    pub(super) lock_fence_now: String,
    pub(super) load_all: String,
    pub(super) look_all: String,
    pub(super) set_fence: String,
    pub(super) bump_fence: String,
    pub(super) read_fence: String,
    pub(super) del_expired_holds: String,
    pub(super) del_expired_queue: String,
    pub(super) regrant: String,
    pub(super) del_queue_owner: String,
    pub(super) del_hold_owner: String,
    pub(super) insert_hold: String,
    pub(super) refresh_queue: String,
    pub(super) insert_queue: String,
    pub(super) release: String,
    pub(super) release_notify: Option<String>,
    pub(super) set_value: String,
    pub(super) set_value_notify: Option<String>,
    pub(super) release_fn: String,
    /// The name's wake lock, shared (PostgreSQL; see `fast::WAKE_KEY`): binds
    /// `fast::wake_key_text`.
    pub(super) wake_lock: Option<String>,
    pub(super) register: String,
    pub(super) unregister: String,
    pub(super) describe_holds: String,
    pub(super) describe_queue: String,
    pub(super) force_live: String,
    pub(super) force_detached: String,
    pub(super) revoke: String,
    pub(super) revoked: String,
    pub(super) del_name_holds: String,
    pub(super) del_name_queue: String,
}

impl Stmts {
    fn new(d: Dialect, t: &str) -> Stmts {
        let now = d.now_ms();
        let len = match d {
            Dialect::Postgres => "length",
            Dialect::MySql => "CHAR_LENGTH",
        };
        let s = |x: String| d.sql(&x);
        let unsynced = match d {
            Dialect::Postgres => " RETURNING set_config('synchronous_commit', 'off', true)",
            Dialect::MySql => "",
        };
        // Every row of the name, holds ('h', by fence) then queue ('q', by seq), live or
        // expired. A revoked hold is read with an empty owner: nobody's, yet in everyone's way.
        let state_rows = format!(
            "SELECT 'h' AS part, CASE WHEN state = 2 THEN '' ELSE owner END AS owner, kind, \
                    permits, mode, fence AS ord, expires_at_ms \
             FROM {t} WHERE name = ? \
             UNION ALL \
             SELECT 'q' AS part, owner, '' AS kind, 0 AS permits, mode, seq AS ord, \
                    expires_at_ms \
             FROM {t}_queue WHERE name = ?"
        );
        Stmts {
            now: format!("SELECT {now}"),
            ensure_fence: s(match d {
                Dialect::Postgres => format!(
                    "INSERT INTO {t}_fences (name, fence) VALUES (?, 0) ON CONFLICT (name) DO NOTHING"
                ),
                Dialect::MySql => format!(
                    "INSERT INTO {t}_fences (name, fence) VALUES (?, 0) \
                     ON DUPLICATE KEY UPDATE fence = fence"
                ),
            }),
            lock_fence: s(format!(
                "SELECT fence FROM {t}_fences WHERE name = ? FOR UPDATE"
            )),
            // Lock the fence row and read the clock in one statement. PostgreSQL creates the row
            // too (`RETURNING` runs once the row lock is ours; `clock_timestamp()` is read then);
            // MySQL needs the row to exist first (`ensure_fence`), and its `NOW(6)` is the
            // statement's start, before any lock wait. An early clock is safe: it can only judge
            // a hold that expired during the wait as still live (a refusal), and it ends the new
            // hold's lease no earlier than the request was sent, which is what the client counts
            // from.
            // PostgreSQL: the rest of the transaction is planned with plain index scans (see
            // `fast.rs`: a bitmap scan never marks the index entries of dead rows).
            lock_fence_now: s(match d {
                Dialect::Postgres => format!(
                    "INSERT INTO {t}_fences (name, fence) VALUES (?, 0) \
                     ON CONFLICT (name) DO UPDATE SET fence = {t}_fences.fence \
                     RETURNING fence, {now}, set_config('enable_bitmapscan', 'off', true)"
                ),
                Dialect::MySql => {
                    format!("SELECT fence, {now} FROM {t}_fences WHERE name = ? FOR UPDATE")
                }
            }),
            // The name's rows in one round trip; expired rows are deleted only when there are
            // any.
            load_all: s(format!("{state_rows} ORDER BY part, ord")),
            // The same with the server's clock as part 'n' (in `ord`): a look in one round trip.
            look_all: s(format!(
                "{state_rows} UNION ALL SELECT 'n' AS part, '', '', 0, '', {now}, 0 \
                 ORDER BY part, ord"
            )),
            set_fence: s(format!("UPDATE {t}_fences SET fence = ? WHERE name = ?")),
            bump_fence: s(match d {
                Dialect::Postgres => format!(
                    "INSERT INTO {t}_fences (name, fence) VALUES (?, 1) \
                     ON CONFLICT (name) DO UPDATE SET fence = {t}_fences.fence + 1"
                ),
                Dialect::MySql => format!(
                    "INSERT INTO {t}_fences (name, fence) VALUES (?, 1) \
                     ON DUPLICATE KEY UPDATE fence = fence + 1"
                ),
            }),
            read_fence: s(format!("SELECT fence FROM {t}_fences WHERE name = ?")),
            del_expired_holds: s(format!(
                "DELETE FROM {t} WHERE name = ? AND expires_at_ms <= ?"
            )),
            del_expired_queue: s(format!(
                "DELETE FROM {t}_queue WHERE name = ? AND expires_at_ms <= ?"
            )),
            regrant: s(format!(
                "UPDATE {t} SET expires_at_ms = ? WHERE owner = ? AND name = ?"
            )),
            del_queue_owner: s(format!(
                "DELETE FROM {t}_queue WHERE name = ? AND owner = ?"
            )),
            del_hold_owner: s(format!("DELETE FROM {t} WHERE name = ? AND owner = ?")),
            insert_hold: s(format!(
                "INSERT INTO {t} ({HOLD_COLUMNS}) VALUES {}",
                placeholders(HOLD_ROW, 1)
            )),
            // A queue place is written only by a refused attempt, and its transaction writes
            // nothing that keeps holders apart. PostgreSQL: that transaction's commit does not
            // wait for the WAL flush (it holds the name's fence row lock and wake lock until it
            // ends, and a release waits for both). A place a server crash loses costs the waiter
            // its turn, never exclusion; a later synced commit (any grant's) flushes it.
            refresh_queue: s(format!(
                "UPDATE {t}_queue SET expires_at_ms = ? WHERE name = ? AND owner = ?{unsynced}"
            )),
            insert_queue: s(format!(
                "INSERT INTO {t}_queue (name, owner, mode, expires_at_ms, client_id, host, pid)
                 VALUES (?, ?, ?, ?, ?, ?, ?){unsynced}"
            )),
            release: s(format!(
                "DELETE FROM {t} WHERE name = ? AND owner = ? AND expires_at_ms > {now}"
            )),
            // PostgreSQL: the delete and its NOTIFY in one statement, so one round trip and one
            // commit, and the notification goes out exactly when the delete commits. Answers
            // how many holds were removed (0 or 1).
            release_notify: match d {
                Dialect::Postgres => Some(s(format!(
                    "WITH d AS (DELETE FROM {t} \
                                WHERE name = ? AND owner = ? AND expires_at_ms > {now} \
                                RETURNING 1) \
                     SELECT count(*) FROM (SELECT pg_notify(?, ?) FROM d) n"
                ))),
                Dialect::MySql => None,
            },
            // The owner's live, unrevoked hold gets the value, or nothing changes.
            set_value: s(format!(
                "UPDATE {t} SET value = ? \
                 WHERE name = ? AND owner = ? AND expires_at_ms > {now} AND state <> 2"
            )),
            // PostgreSQL: the update and its NOTIFY in one statement (as `release_notify`).
            set_value_notify: match d {
                Dialect::Postgres => Some(s(format!(
                    "WITH u AS (UPDATE {t} SET value = ? \
                                WHERE name = ? AND owner = ? AND expires_at_ms > {now} \
                                  AND state <> 2 \
                                RETURNING 1) \
                     SELECT count(*) FROM (SELECT pg_notify(?, ?) FROM u) n"
                ))),
                Dialect::MySql => None,
            },
            release_fn: fast::release_sql(t),
            wake_lock: match d {
                Dialect::Postgres => Some(format!(
                    "SELECT pg_advisory_xact_lock_shared({})",
                    fast::WAKE_KEY
                )),
                Dialect::MySql => None,
            },
            register: fast::register_sql(
                t,
                [
                    "$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10", "$11",
                ],
            ),
            unregister: s(format!(
                "DELETE FROM {w} WHERE name = ? AND owner = ?",
                w = fast::waiters(t)
            )),
            describe_holds: s(format!(
                "SELECT name, owner, kind, permits, mode, fence, expires_at_ms, acquired_at_ms,
                        client_id, host, pid, state, value
                 FROM {t}
                 WHERE expires_at_ms > ? AND substr(name, 1, {len}(?)) = ? AND state <> 3
                 ORDER BY name, fence"
            )),
            describe_queue: s(format!(
                "SELECT name, owner, mode, client_id, host, pid FROM {t}_queue
                 WHERE expires_at_ms > ? AND substr(name, 1, {len}(?)) = ?
                 ORDER BY name, seq"
            )),
            force_live: s(format!(
                "DELETE FROM {t} WHERE name = ? AND expires_at_ms > ?"
            )),
            force_detached: s(format!(
                "DELETE FROM {t} WHERE name = ? AND expires_at_ms > ? AND state = 1"
            )),
            revoke: s(format!(
                "UPDATE {t} SET state = 2 WHERE name = ? AND expires_at_ms > ?"
            )),
            revoked: s(format!(
                "SELECT CAST(COUNT(*) AS {int}), MAX(expires_at_ms) FROM {t} \
                 WHERE name = ? AND state = 2 AND expires_at_ms > ?",
                int = match d {
                    Dialect::Postgres => "BIGINT",
                    Dialect::MySql => "SIGNED",
                }
            )),
            del_name_holds: s(format!("DELETE FROM {t} WHERE name = ?")),
            del_name_queue: s(format!("DELETE FROM {t}_queue WHERE name = ?")),
        }
    }
}

/// The schema, version 2 (version 1 plus the holds' `state`: held, detached, revoked), with the
/// holds' nullable `value` (added to older version 2 tables by [`Sql::ensure_values`]).
pub(super) fn migration(d: Dialect, t: &str, collation: &str) -> Vec<String> {
    match d {
        Dialect::Postgres => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_meta (
                    meta_key TEXT NOT NULL PRIMARY KEY,
                    meta_value BIGINT NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    name TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    permits BIGINT NOT NULL,
                    mode TEXT NOT NULL,
                    fence BIGINT NOT NULL,
                    expires_at_ms BIGINT NOT NULL,
                    acquired_at_ms BIGINT NOT NULL,
                    client_id TEXT NOT NULL,
                    host TEXT NOT NULL,
                    pid BIGINT NOT NULL,
                    state BIGINT NOT NULL DEFAULT 0,
                    value TEXT,
                    CONSTRAINT {t}_name_owner UNIQUE (name, owner))"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_queue (
                    seq BIGSERIAL PRIMARY KEY,
                    name TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    mode TEXT NOT NULL,
                    expires_at_ms BIGINT NOT NULL,
                    client_id TEXT NOT NULL,
                    host TEXT NOT NULL,
                    pid BIGINT NOT NULL,
                    CONSTRAINT {t}_queue_name_owner UNIQUE (name, owner))"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_fences (
                    name TEXT NOT NULL PRIMARY KEY,
                    fence BIGINT NOT NULL)"
            ),
        ],
        Dialect::MySql => {
            let key = format!("VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation}");
            let value = MYSQL_VALUE;
            vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_meta (
                        meta_key VARCHAR(64) NOT NULL PRIMARY KEY,
                        meta_value BIGINT NOT NULL) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        name {key} NOT NULL,
                        owner {key} NOT NULL,
                        kind VARCHAR(16) NOT NULL,
                        permits BIGINT NOT NULL,
                        mode VARCHAR(16) NOT NULL,
                        fence BIGINT NOT NULL,
                        expires_at_ms BIGINT NOT NULL,
                        acquired_at_ms BIGINT NOT NULL,
                        client_id VARCHAR(255) NOT NULL,
                        host VARCHAR(255) NOT NULL,
                        pid BIGINT NOT NULL,
                        state BIGINT NOT NULL DEFAULT 0,
                        value {value},
                        UNIQUE KEY {t}_name_owner (name, owner)
                    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_queue (
                        seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                        name {key} NOT NULL,
                        owner {key} NOT NULL,
                        mode VARCHAR(16) NOT NULL,
                        expires_at_ms BIGINT NOT NULL,
                        client_id VARCHAR(255) NOT NULL,
                        host VARCHAR(255) NOT NULL,
                        pid BIGINT NOT NULL,
                        UNIQUE KEY {t}_queue_name_owner (name, owner)
                    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_fences (
                        name {key} NOT NULL PRIMARY KEY,
                        fence BIGINT NOT NULL
                    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                ),
            ]
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

/// The SQLSTATE / server error code of a database error.
fn db_code(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// The grant routine cannot be called: dropped after this backend created or found it, no
/// `EXECUTE` privilege, a MySQL definer that is gone. The backend then uses the full path.
fn is_missing_routine(e: &sqlx::Error) -> bool {
    // PostgreSQL undefined_function (also: a server older than 11, without procedures),
    // insufficient_privilege; MySQL ER_SP_DOES_NOT_EXIST and
    // ER_PROCACCESS_DENIED_ERROR (42000), ER_NO_SUCH_USER (HY000).
    matches!(
        db_code(e).as_deref(),
        Some("42883") | Some("42501") | Some("42000") | Some("HY000")
    ) && {
        let m = e.to_string();
        m.contains("grant_v") || m.contains("release_v") || m.contains("as a definer")
    }
}

/// A deadlock or serialization failure: the transaction may simply be tried again.
fn is_retryable(e: &sqlx::Error) -> bool {
    matches!(
        db_code(e).as_deref(),
        // PostgreSQL serialization_failure, deadlock_detected; MySQL ER_LOCK_DEADLOCK (SQLSTATE
        // 40001 as well), ER_LOCK_WAIT_TIMEOUT is *not* retried (it already waited).
        Some("40001" | "40P01")
    )
}

fn map_err(shown: &str, e: sqlx::Error) -> Error {
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::Unavailable(format!("{shown}: {e}")),
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            // PostgreSQL: connection exceptions (08…), operator intervention (57…: statement
            // timeout, admin shutdown, cannot connect now), lock_not_available (55P03),
            // insufficient resources (53…). MySQL (SQLSTATE): HY000 lock wait timeout and
            // max_statement_time are reported by message; 08S01 communication errors.
            let unavailable = code.starts_with("08")
                || code.starts_with("57")
                || code.starts_with("53")
                || code == "55P03"
                || code == "70100"
                // MySQL/MariaDB errors by number (the handshake's carry no SQLSTATE, and the
                // driver shows the number first): too many connections (1040), the user's
                // connection limit (1203), shutting down (1053).
                || matches!(
                    db.to_string().split([':', ' ']).next(),
                    Some("1040" | "1203" | "1053")
                )
                || db.message().contains("Lock wait timeout")
                || db.message().contains("max_statement_time")
                || db.message().contains("maximum statement execution time");
            if unavailable {
                Error::Unavailable(format!("{shown}: {db}"))
            } else {
                Error::backend(e)
            }
        }
        _ => Error::backend(e),
    }
}

// ---------------------------------------------------------------------------------------------
// Wake-ups and hand-offs

/// The state of the PostgreSQL listener, shared with its task.
#[derive(Debug)]
struct ListenerState {
    /// `true` while LISTEN is active; changes (both ways) wake every waiter.
    up: tokio::sync::watch::Sender<bool>,
    /// While it is up: the advisory lock its session holds, `(lk1, lk2)`, which also names
    /// this client's hand-off channel (see [`fast::handoff_channel`]).
    key: StdMutex<Option<(i32, i32)>>,
}

impl ListenerState {
    fn key(&self) -> Option<(i32, i32)> {
        *lock(&self.key)
    }
}

/// What a waiting mutex acquisition was handed: the highest fence token of a hand-off to it,
/// and a wake-up for its wait.
#[derive(Debug, Default)]
struct Slot {
    token: StdMutex<Option<u64>>,
    handed: tokio::sync::Notify,
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the LISTEN connection of one backend until the backend is dropped (then the task is
/// aborted). Reconnects with backoff; while down, waiters poll. Each connection takes a new
/// random advisory lock, held for the session, and listens on the table's channel and on the
/// hand-off channel that lock names.
#[cfg(feature = "postgres")]
async fn listen_loop(
    url: String,
    sql: std::sync::Weak<Sql>,
    state: Arc<ListenerState>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(100);
    let Some((channel, signals)) = sql.upgrade().map(|s| (s.table.clone(), s.signals.clone()))
    else {
        return;
    };
    loop {
        let (lk1, lk2): (i32, i32) = rand::random();
        let handoffs = fast::handoff_channel(&channel, lk1, lk2);
        let attempt = async {
            let opts = sqlx::postgres::PgConnectOptions::from_str(&url)?
                .disable_statement_logging()
                .application_name("dlock-listener");
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(OP_TIMEOUT)
                .connect_lazy_with(opts);
            let mut l = sqlx::postgres::PgListener::connect_with(&pool).await?;
            l.eager_reconnect(false);
            l.listen_all([channel.as_str(), handoffs.as_str()]).await?;
            let held: bool = sqlx::query("SELECT pg_try_advisory_lock($1, $2)")
                .bind(lk1)
                .bind(lk2)
                .fetch_one(&mut l)
                .await?
                .try_get(0)?;
            if !held {
                return Err(sqlx::Error::Protocol(
                    "the listener's advisory lock is taken".into(),
                ));
            }
            Ok::<_, sqlx::Error>(l)
        };
        match tokio::time::timeout(OP_TIMEOUT, attempt).await {
            Ok(Ok(mut l)) => {
                backoff = Duration::from_millis(100);
                *lock(&state.key) = Some((lk1, lk2));
                state.up.send_replace(true);
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
                // `Ok(None)` or an error: the connection is gone.
                while let Ok(Some(n)) = l.try_recv().await {
                    if n.channel() == handoffs {
                        handed(&sql, n.payload());
                    } else {
                        signals.wake(n.payload());
                    }
                }
                tracing::warn!(%channel, "postgres LISTEN connection lost; waiters poll until it is back");
                *lock(&state.key) = None;
                state.up.send_replace(false);
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "postgres LISTEN connection failed; retrying");
                ready.take();
            }
            Err(_) => {
                tracing::warn!("postgres LISTEN connection timed out; retrying");
                ready.take();
            }
        }
        let pause = backoff.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// The parts of a hand-off message `"token owner name"`: the token in plain decimal, a non-empty
/// owner, and the rest as the lock name; `None` for anything else (handed to nobody).
#[cfg(feature = "postgres")]
pub(super) fn parse_handed(payload: &str) -> Option<(u64, &str, &str)> {
    let mut parts = payload.splitn(3, ' ');
    let (token, owner, name) = (parts.next()?, parts.next()?, parts.next()?);
    if !plain_decimal(token) || owner.is_empty() {
        return None;
    }
    Some((token.parse().ok()?, owner, name))
}

/// A hand-off message, `"token owner name"`: given to the waiting acquisition of that owner. A
/// lock handed to an owner that no longer waits here is passed on at once.
#[cfg(feature = "postgres")]
fn handed(sql: &std::sync::Weak<Sql>, payload: &str) {
    let Some(sql) = sql.upgrade() else {
        return;
    };
    let Some((token, owner, name)) = parse_handed(payload) else {
        return;
    };
    if let Some(slot) = lock(&sql.slots)
        .get(owner)
        .and_then(std::sync::Weak::upgrade)
    {
        let mut t = lock(&slot.token);
        *t = Some(t.map_or(token, |old| old.max(token)));
        slot.handed.notify_one();
        return;
    }
    // The owner holds it: its attempt met the handed hold before this message came (its release
    // hands the lock on).
    if lock(&sql.granted).contains_key(owner) {
        return;
    }
    let (name, owner) = (name.to_owned(), owner.to_owned());
    tokio::spawn(async move {
        if let Err(e) = sql.release_owner(&name, &owner, true).await {
            tracing::debug!(error = %e, %name, "could not pass on a lock handed to a waiter that left");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The backend

/// The PostgreSQL and MySQL/MariaDB store. Obtain it with `dlock::connect("postgres://…")` /
/// `dlock::connect("mysql://…")`, or [`SqlBackend::open`] and [`crate::Client::with_backend`].
/// See the module docs for tables, options, wake-ups and session mode.
#[derive(Debug)]
pub struct SqlBackend {
    inner: Arc<Sql>,
}

/// The state of one [`SqlBackend`], shared with its acquisitions.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(super) dialect: Dialect,
    mode: HoldMode,
    pub(super) table: String,
    pub(super) shown: String,
    pub(super) pool: AnyPool,
    pub(super) connect: AnyConnectOptions,
    pub(super) st: Stmts,
    notify: Option<String>,
    /// Fans the listener's notifications out to this backend's waiters.
    signals: Arc<NameSignals>,
    /// The store's name for the core's in-process wake-ups (URL, table, mode).
    pub(super) key: String,
    listener: Option<Arc<ListenerState>>,
    /// The listener's task (aborted when the backend goes).
    listener_task: StdMutex<Option<tokio::task::JoinHandle<()>>>,
    /// Whether the one-round-trip grant routine (`fast.rs`) is there to call.
    fast: AtomicBool,
    /// Whether releases hand a mutex to a registered waiter (PostgreSQL with the waiters'
    /// table and the release function, see `fast.rs`).
    handoffs: AtomicBool,
    /// The waiting mutex acquisitions of this backend that may be handed the lock, by owner
    /// token: where the listener leaves what it was handed.
    slots: StdMutex<HashMap<String, std::sync::Weak<Slot>>>,
    /// Owners of this backend that were granted a mutex while they could be handed it, until
    /// their release (with when): a hand-off message to one of them may arrive after its own
    /// attempt already took the handed hold (a regrant), and must not pass that hold on.
    granted: StdMutex<HashMap<String, Instant>>,
    /// Its call.
    fast_call: String,
    /// Answers of the routine: granted, refused, "take the full path".
    fast_answers: [AtomicU64; 3],
    /// Looks of waiters (`still_busy`) so far.
    looks: AtomicU64,
    /// Grant routine calls that wait for a pooled connection's slot, batched (MySQL, `batch.rs`).
    pub(super) grants: batch::Grants,
    /// Batches of more than one grant sent, and the grants they made.
    pub(super) batched: [AtomicU64; 2],
    /// The names' bells (MySQL in lease mode, see `bell.rs`).
    bells: Option<Arc<Bells>>,
    /// Whether non-fair mutex waiters wait for their name's bell and a bell holder's release
    /// reserves the lock for the bell's next holder (MySQL with the ring routines, `bell.rs`).
    rings: AtomicBool,
}

impl Drop for Sql {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.listener_task).take() {
            task.abort();
        }
    }
}

impl SqlBackend {
    /// Connects to the store at `url` (see the module docs for the options), creates or checks
    /// its tables, and on PostgreSQL starts the LISTEN connection.
    ///
    /// Errors: [`Error::InvalidConfig`] for a bad URL or option, [`Error::Unavailable`] when the
    /// server cannot be reached within [`OP_TIMEOUT`] or its tables belong to a newer dlock.
    pub async fn open(url: &str) -> Result<SqlBackend> {
        Self::open_config(SqlConfig::parse(url)?).await
    }

    /// [`SqlBackend::open`] with a parsed URL.
    ///
    /// A `?mode=session` URL is [`Error::InvalidConfig`] here: session mode is
    /// [`super::SessionBackend`].
    pub async fn open_config(cfg: SqlConfig) -> Result<SqlBackend> {
        if cfg.mode == HoldMode::Session {
            return Err(Error::InvalidConfig(format!(
                "{}: ?mode=session is a store of its own: open it with dlock::connect or \
                 SessionBackend::open",
                cfg.shown
            )));
        }
        #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
        let mut backend = Sql::open(&cfg).await?;
        #[cfg(feature = "postgres")]
        if backend.dialect == Dialect::Postgres {
            let (up, _) = tokio::sync::watch::channel(false);
            let state = Arc::new(ListenerState {
                up,
                key: StdMutex::new(None),
            });
            backend.listener = Some(state.clone());
            let backend = Arc::new(backend);
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(listen_loop(
                cfg.driver_url,
                Arc::downgrade(&backend),
                state,
                tx,
            ));
            *lock(&backend.listener_task) = Some(task);
            // Wait for LISTEN to be active so no release after `open` returns is missed; if it
            // cannot start, waiters poll until it does.
            let _ = tokio::time::timeout(OP_TIMEOUT, rx).await;
            return Ok(SqlBackend { inner: backend });
        }
        Ok(SqlBackend {
            inner: Arc::new(backend),
        })
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// PostgreSQL or MySQL.
    pub fn dialect(&self) -> Dialect {
        self.inner.dialect
    }
}

impl Sql {
    /// Connects to the server of `cfg` and creates or checks its tables.
    pub(super) async fn open(cfg: &SqlConfig) -> Result<Sql> {
        let key = format!("sql:{}|{}|{:?}", cfg.driver_url, cfg.table, cfg.mode);
        let signals = Arc::new(NameSignals::default());
        sqlx::any::install_default_drivers();
        let shown = cfg.shown.clone();
        let connect = AnyConnectOptions::from_str(&cfg.driver_url)
            .map_err(|e| Error::InvalidConfig(format!("{shown}: {e}")))?
            .disable_statement_logging();
        let dialect = cfg.dialect;
        let pool = AnyPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .min_connections(0)
            .acquire_timeout(OP_TIMEOUT)
            .idle_timeout(Duration::from_secs(60))
            .after_connect(move |conn, _| Box::pin(async move { setup(dialect, conn).await }));
        let pool = ping_when_idle(pool).connect_lazy_with(connect.clone());
        // Fail fast (and clearly) when the server is not there, instead of retrying until the
        // pool's acquire timeout.
        match tokio::time::timeout(OP_TIMEOUT, AnyConnection::connect_with(&connect)).await {
            Ok(Ok(c)) => {
                let _ = c.close().await;
            }
            Ok(Err(e)) => return Err(map_err(&shown, e)),
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "{shown}: no connection within {OP_TIMEOUT:?}"
                )))
            }
        }
        let collation = match dialect {
            Dialect::Postgres => String::new(),
            Dialect::MySql => bounded(OP_TIMEOUT, &shown, mysql_collation(&pool, &shown)).await?,
        };
        let notify =
            (dialect == Dialect::Postgres).then(|| d_sql(dialect, "SELECT pg_notify(?, ?)"));
        let fast_call = fast::call_sql(dialect, &cfg.table);
        let bell_pool = pool.clone();
        let backend = Sql {
            dialect,
            mode: cfg.mode,
            st: Stmts::new(dialect, &cfg.table),
            table: cfg.table.clone(),
            shown: shown.clone(),
            pool,
            notify,
            signals,
            key,
            listener: None,
            listener_task: StdMutex::new(None),
            fast: AtomicBool::new(false),
            handoffs: AtomicBool::new(false),
            rings: AtomicBool::new(false),
            slots: StdMutex::new(HashMap::new()),
            granted: StdMutex::new(HashMap::new()),
            fast_call,
            fast_answers: Default::default(),
            looks: AtomicU64::new(0),
            grants: batch::Grants::new(MAX_CONNECTIONS as usize),
            batched: Default::default(),
            bells: (dialect == Dialect::MySql && cfg.mode == HoldMode::Lease)
                .then(|| Bells::new(connect.clone(), bell_pool, &cfg.table)),
            connect,
        };
        if let Err(e) = bounded(OP_TIMEOUT, &shown, backend.migrate(&collation)).await {
            backend.pool.close().await;
            return Err(e);
        }
        Ok(backend)
    }

    pub(super) fn err(&self, e: sqlx::Error) -> Error {
        map_err(&self.shown, e)
    }

    async fn migrate(&self, collation: &str) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        // The common case, a table set up before: a few reads, no migration lock (a fleet that
        // connects at once would otherwise queue on it past the statement timeout).
        if self.up_to_date(&mut conn).await {
            return Ok(());
        }
        let lock_name = format!("dlock-migrate:{}", self.table);
        // Serialize concurrent migrations (CREATE TABLE IF NOT EXISTS races on PostgreSQL).
        match self.dialect {
            Dialect::Postgres => {
                sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(advisory_key("dlock-migrate", &self.table))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            Dialect::MySql => {
                sqlx::query("SELECT CAST(COALESCE(GET_LOCK(?, 10), 0) AS SIGNED)")
                    .bind(&lock_name)
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.err(e))?;
            }
        }
        let result = async {
            // Set up by the client that held the lock before this one.
            if self.up_to_date(&mut conn).await {
                return Ok(SCHEMA_VERSION);
            }
            for stmt in migration(self.dialect, &self.table, collation) {
                sqlx::query(&stmt).execute(&mut *conn).await?;
            }
            let insert = match self.dialect {
                Dialect::Postgres => format!(
                    "INSERT INTO {}_meta (meta_key, meta_value) VALUES ('schema_version', $1)
                     ON CONFLICT (meta_key) DO NOTHING",
                    self.table
                ),
                Dialect::MySql => format!(
                    "INSERT INTO {}_meta (meta_key, meta_value) VALUES ('schema_version', ?)
                     ON DUPLICATE KEY UPDATE meta_value = meta_value",
                    self.table
                ),
            };
            sqlx::query(&insert)
                .bind(SCHEMA_VERSION)
                .execute(&mut *conn)
                .await?;
            let mut v: i64 = sqlx::query(&format!(
                "SELECT meta_value FROM {}_meta WHERE meta_key = 'schema_version'",
                self.table
            ))
            .fetch_one(&mut *conn)
            .await?
            .try_get(0)?;
            if v == 1 {
                self.upgrade_v1(&mut conn).await?;
                v = SCHEMA_VERSION;
            }
            if v == SCHEMA_VERSION {
                self.ensure_values(&mut conn).await?;
            }
            if v == SCHEMA_VERSION && self.mode == HoldMode::Lease {
                self.ensure_fast(&mut conn, collation).await;
            }
            Ok::<i64, sqlx::Error>(v)
        }
        .await;
        let unlock = match self.dialect {
            Dialect::Postgres => {
                sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(advisory_key("dlock-migrate", &self.table))
                    .execute(&mut *conn)
                    .await
            }
            Dialect::MySql => {
                sqlx::query("SELECT CAST(COALESCE(RELEASE_LOCK(?), 0) AS SIGNED)")
                    .bind(&lock_name)
                    .execute(&mut *conn)
                    .await
            }
        };
        let v = result.map_err(|e| self.err(e))?;
        unlock.map_err(|e| self.err(e))?;

        if v != SCHEMA_VERSION {
            return Err(Error::Unavailable(format!(
                "{}: table {} has dlock schema version {v}; this dlock understands version \
                 {SCHEMA_VERSION} (upgrade dlock or use another table)",
                self.shown, self.table
            )));
        }
        Ok(())
    }

    /// Brings a schema-1 table to schema 2 (under the migration lock): the holds get their
    /// `state` column. Clients that know only schema 1 refuse the table from then on; those
    /// already running keep working, ignore revocations, and their forced releases break.
    async fn upgrade_v1(&self, conn: &mut AnyConnection) -> std::result::Result<(), sqlx::Error> {
        let t = &self.table;
        if !self.has_column(conn, "state").await? {
            sqlx::query(&format!(
                "ALTER TABLE {t} ADD COLUMN state BIGINT NOT NULL DEFAULT 0"
            ))
            .execute(&mut *conn)
            .await?;
        }
        sqlx::query(&format!(
            "UPDATE {t}_meta SET meta_value = {SCHEMA_VERSION} WHERE meta_key = 'schema_version'"
        ))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Whether the tables are at this dlock's schema version with the `value` column, and (lease
    /// mode) the grant routines exist; then the routines are enabled. Any error: not known to be.
    async fn up_to_date(&self, conn: &mut AnyConnection) -> bool {
        let t = &self.table;
        let version = sqlx::query(&format!(
            "SELECT meta_value FROM {t}_meta WHERE meta_key = 'schema_version'"
        ))
        .fetch_optional(&mut *conn)
        .await
        .ok()
        .flatten()
        .and_then(|row| row.try_get::<i64, _>(0).ok());
        if version != Some(SCHEMA_VERSION) {
            return false;
        }
        let value_column = sqlx::query(&format!("SELECT value FROM {t} WHERE 1 = 0"))
            .execute(&mut *conn)
            .await;
        if value_column.is_err() {
            return false;
        }
        if self.mode == HoldMode::Lease {
            let have = sqlx::query(&fast::exists_sql(self.dialect, t))
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| row.try_get::<i64, _>(0));
            if !have.is_ok_and(|n| n >= fast::routine_count(self.dialect)) {
                return false;
            }
            self.enable_routines(true, true);
        }
        true
    }

    /// Which routines are there: `grant` (grants take the grant routine, and on PostgreSQL
    /// releases hand a mutex to a registered waiter) and `rings` (MySQL: a bell holder's release
    /// reserves the lock for the bell's next holder).
    fn enable_routines(&self, grant: bool, rings: bool) {
        self.fast.store(grant, Ordering::Relaxed);
        self.handoffs.store(
            grant && self.dialect == Dialect::Postgres,
            Ordering::Relaxed,
        );
        self.rings.store(
            rings && self.dialect == Dialect::MySql && self.bells.is_some(),
            Ordering::Relaxed,
        );
    }

    /// Whether the holds table has `column` (`information_schema`; PostgreSQL folds unquoted
    /// names to lower case).
    async fn has_column(
        &self,
        conn: &mut AnyConnection,
        column: &str,
    ) -> std::result::Result<bool, sqlx::Error> {
        let t = &self.table;
        let has: i64 = sqlx::query(&match self.dialect {
            Dialect::Postgres => format!(
                "SELECT CAST(count(*) AS BIGINT) FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = lower('{t}') \
                 AND column_name = '{column}'"
            ),
            Dialect::MySql => format!(
                "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{t}' \
                 AND COLUMN_NAME = '{column}'"
            ),
        })
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
        Ok(has > 0)
    }

    /// Adds the holds' `value` column to a version 2 table made before holds had values (under
    /// the migration lock). No new schema version: the column is nullable and older clients of
    /// version 2 never name it, so they keep working on the table. The column is looked up first
    /// so that an up-to-date table is never altered (an `ALTER TABLE` locks it).
    async fn ensure_values(
        &self,
        conn: &mut AnyConnection,
    ) -> std::result::Result<(), sqlx::Error> {
        let t = &self.table;
        if !self.has_column(conn, "value").await? {
            // MySQL 8 has no `ADD COLUMN IF NOT EXISTS`; the migration lock keeps it single.
            let add = match self.dialect {
                Dialect::Postgres => format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS value TEXT"),
                Dialect::MySql => format!("ALTER TABLE {t} ADD COLUMN value {MYSQL_VALUE}"),
            };
            if let Err(e) = sqlx::query(&add).execute(&mut *conn).await {
                tracing::error!(
                    store = %self.shown,
                    error = %e,
                    "table {t} has no `value` column and this user cannot add it; run `{add}` \
                     as the table's owner"
                );
                return Err(e);
            }
        }
        Ok(())
    }

    /// Creates the one-round-trip grant routine when it is missing (under the migration lock)
    /// and enables it. A failure (no privilege to create routines, say) is logged and leaves
    /// the full path only: slower, equally correct.
    async fn ensure_fast(&self, conn: &mut AnyConnection, collation: &str) {
        let r = async {
            let have: i64 = sqlx::query(&fast::exists_sql(self.dialect, &self.table))
                .fetch_one(&mut *conn)
                .await?
                .try_get(0)?;
            if have < fast::routine_count(self.dialect) {
                // MySQL: only the missing procedures (a table made by an older dlock has the
                // grant routine alone; `CREATE PROCEDURE` has no `IF NOT EXISTS` on MySQL 8.0).
                let existing = self.existing_routines(conn).await?;
                for (routine, ddl) in
                    fast::create_sql(self.dialect, &self.table, self.dialect.now_ms(), collation)
                {
                    if routine.is_some_and(|r| existing.iter().any(|e| e.eq_ignore_ascii_case(&r)))
                    {
                        continue;
                    }
                    conn.execute(ddl.as_str()).await?;
                }
            }
            Ok::<(), sqlx::Error>(())
        }
        .await;
        match r {
            Ok(()) => self.enable_routines(true, true),
            Err(e) => {
                // Those that exist (made by a user who could) are used.
                let existing = self.existing_routines(conn).await.unwrap_or_default();
                let has = |r: String| existing.iter().any(|e| e.eq_ignore_ascii_case(&r));
                let grant =
                    self.dialect == Dialect::MySql && has(fast::routine(self.dialect, &self.table));
                let rings = grant
                    && has(fast::ring_routine(&self.table))
                    && has(fast::unring_routine(&self.table));
                self.enable_routines(grant, rings);
                tracing::warn!(
                    store = %self.shown,
                    error = %e,
                    "cannot create the routines of table {}; {}",
                    self.table,
                    if grant {
                        "releases wake waiters without reserving the lock for one"
                    } else {
                        "every acquire takes the multi-statement path"
                    }
                );
            }
        }
    }

    /// The names of this table's routines that exist.
    async fn existing_routines(
        &self,
        conn: &mut AnyConnection,
    ) -> std::result::Result<Vec<String>, sqlx::Error> {
        Ok(sqlx::query(&fast::existing_sql(self.dialect, &self.table))
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .filter_map(|row| row.try_get::<String, _>(0).ok())
            .collect())
    }

    /// Whether the grant routine is called for `req`: exclusive requests that take no queue
    /// place only. The routine answers shared ones only on a free name, and everywhere else (a
    /// reader beside readers, a semaphore permit beside permits) they would pay its round trip
    /// and then the full transaction. MySQL's routine does not write values: a hold with one (an
    /// election's) takes the full path there.
    fn fast_eligible(&self, req: &Request<'_>) -> bool {
        self.routine_may_grant(req.lease)
            && self.fast.load(Ordering::Relaxed)
            && (req.meta.value.is_none() || self.dialect == Dialect::Postgres)
            && req.mode == Mode::Exclusive
            && !req.takes_queue_place()
    }

    /// Whether a routine may grant a hold of `lease` (lease mode, a lease its arithmetic holds).
    fn routine_may_grant(&self, lease: Duration) -> bool {
        self.mode == HoldMode::Lease && ms(lease) < (1 << 50)
    }

    /// [`Sql::fast_acquire`], batched with the calls that wait for a connection meanwhile
    /// (`batch.rs`). A waiter registered by an earlier attempt (PostgreSQL) calls the routine
    /// alone: its grant removes the registration, which a batch does not.
    async fn fast_grouped(
        self: &Arc<Self>,
        req: &Request<'_>,
        reg: Option<&RegArgs>,
    ) -> std::result::Result<Option<(Attempt, u64)>, sqlx::Error> {
        if reg.is_some_and(|r| r.registered) || !self.fast_eligible(req) {
            return self.fast_acquire(req, reg).await;
        }
        let ask = || batch::Ask {
            want: Want::new(req),
            reg: reg.copied(),
        };
        match group::enter(&batch::Granting(self.clone()), ask) {
            group::Entered::Alone(_turn, _) => self.fast_acquire(req, reg).await,
            group::Entered::Queued(rx) => match rx.await {
                Ok(batch::Grouped::Decided(a, seen)) => Ok(Some((a, seen))),
                Ok(batch::Grouped::Failed(e)) => Err(e),
                Ok(batch::Grouped::Undecided) | Err(_) => self.fast_acquire(req, reg).await,
            },
        }
    }

    /// The one-round-trip grant (`fast.rs`) when `req` is one it can answer: `None` means take
    /// the full path. With the answer, the highest token of the holds in the way (0 if none).
    pub(super) async fn fast_acquire(
        &self,
        req: &Request<'_>,
        reg: Option<&RegArgs>,
    ) -> std::result::Result<Option<(Attempt, u64)>, sqlx::Error> {
        if !self.fast_eligible(req) {
            return Ok(None);
        }
        let lease_ms = ms(req.lease);
        let (kind, permits) = kind_columns(req.kind);
        let q = sqlx::query(&self.fast_call)
            .bind(req.name.as_str())
            .bind(req.owner)
            .bind(kind)
            .bind(permits)
            .bind(req.mode.as_str())
            .bind(lease_ms)
            .bind(req.meta.client_id.as_str())
            .bind(req.meta.host.as_str())
            .bind(i64::from(req.meta.pid));
        let q = match self.dialect {
            Dialect::Postgres => {
                let register = reg.is_some_and(|r| r.register && r.handoff);
                let (lk1, lk2) = reg.map_or((0, 0), |r| r.key);
                q.bind(req.meta.value.as_deref())
                    .bind(true)
                    .bind(register)
                    .bind(reg.is_some_and(|r| r.registered))
                    .bind(fast::handoff_channel(&self.table, lk1, lk2))
                    .bind(lk1)
                    .bind(lk2)
            }
            Dialect::MySql => q.bind(true),
        };
        let rows = match q.fetch_all(&self.pool).await {
            Err(e) if is_missing_routine(&e) => {
                self.fast.store(false, Ordering::Relaxed);
                tracing::warn!(
                    store = %self.shown,
                    error = %e,
                    "the grant routine {} is gone; every acquire takes the multi-statement path",
                    fast::routine(self.dialect, &self.table)
                );
                return Ok(None);
            }
            r => r?,
        };
        let row = rows.first().ok_or_else(|| {
            sqlx::Error::Protocol(format!(
                "{} answered no row",
                fast::routine(self.dialect, &self.table)
            ))
        })?;
        let (answer, token, wait_ms): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let seen: i64 = match self.dialect {
            Dialect::Postgres => row.try_get::<Option<i64>, _>(3)?.unwrap_or(0),
            Dialect::MySql => 0,
        };
        let (slot, attempt) = match answer {
            fast::GRANTED => (
                0,
                Some(Attempt::Granted(Grant {
                    token: Some(u64::try_from(token).map_err(|_| {
                        sqlx::Error::Protocol(format!("grant routine answered token {token}"))
                    })?),
                    valid_for: req.lease,
                })),
            ),
            fast::BUSY => (
                1,
                Some(Attempt::Busy(Busy {
                    retry_in: Some(Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0))),
                })),
            ),
            _ => (2, None),
        };
        self.fast_answers[slot].fetch_add(1, Ordering::Relaxed);
        Ok(attempt.map(|a| (a, u64::try_from(seen).unwrap_or(0))))
    }

    /// Releases `owner`'s lease-mode hold of `name`.
    pub(super) async fn release_hold(&self, name: &str, owner: &str) -> Result<Released> {
        let removed = if self.handoffs.load(Ordering::Relaxed) {
            let answer = self.release_owner(name, owner, false).await;
            lock(&self.granted).remove(owner);
            match answer? {
                fast::HANDED_OFF => return Ok(Released::HandedOff),
                answer => answer == fast::RELEASED,
            }
        } else {
            // A hold with its bell in hand (MySQL) is released on the bell's session, which
            // frees the bell there and, for a non-fair mutex, reserves the lock for the bell's
            // next holder. A non-fair hold granted without the bell after a refusal is released
            // by the same routine on a pooled connection: when a waiter holds the bell (and
            // polls), that waiter is next, not this client's own.
            let kept = match (&self.bells, self.rings.load(Ordering::Relaxed)) {
                (Some(bells), true) => bells.take_for_release(owner).map(|k| (bells, k)),
                _ => None,
            };
            if let Some((bells, (bell, reserve))) = kept {
                let r = match bell {
                    Some(bell) => bells.unring(bell, name, owner, reserve).await,
                    None => {
                        let key = bell_key(&self.table, name);
                        bells.unbelled_release(&key, name, owner).await
                    }
                };
                match r {
                    Ok((false, _)) => return Ok(Released::NotHeld),
                    Ok((true, true)) => return Ok(Released::HandedOff),
                    Ok((true, false)) => {
                        self.signals.wake(name);
                        return Ok(Released::Released);
                    }
                    // The bell's connection is closed (which frees the bell): the plain release.
                    Err(e) => tracing::debug!(error = %e, "release in the unring routine failed"),
                }
            }
            let removed = self.release_plain(name, owner).await;
            // After the delete: the waiter the bell wakes finds the lock free.
            if let Some(bells) = &self.bells {
                bells.released(owner);
            }
            removed?
        };
        if !removed {
            return Ok(Released::NotHeld);
        }
        // This backend's own waiters (the store told the others, if any waited).
        self.signals.wake(name);
        Ok(Released::Released)
    }

    /// The release function (PostgreSQL with hand-offs): [`fast::NOT_HELD`],
    /// [`fast::RELEASED`] or [`fast::HANDED_OFF`]. `leaving`: the owner is a waiter that gives
    /// up (its registration goes, and a lock handed to it meanwhile is passed on).
    pub(super) async fn release_owner(
        &self,
        name: &str,
        owner: &str,
        leaving: bool,
    ) -> Result<i64> {
        let mut tries = 0;
        loop {
            tries += 1;
            let r = sqlx::query(&self.st.release_fn)
                .bind(name)
                .bind(owner)
                .bind(leaving)
                .fetch_one(&self.pool)
                .await
                .and_then(|r| r.try_get::<i64, _>(0));
            match r {
                Ok(answer) => return Ok(answer),
                // A deadlock with a grant that met the hold as expired: the release is redone.
                Err(e) if is_retryable(&e) && tries < TX_TRIES => continue,
                Err(e) if is_missing_routine(&e) => {
                    self.handoffs.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        store = %self.shown,
                        error = %e,
                        "the release function {} is gone; releases wake every waiter",
                        fast::release_routine(&self.table)
                    );
                    return self.release_plain(name, owner).await.map(|removed| {
                        if removed {
                            fast::RELEASED
                        } else {
                            fast::NOT_HELD
                        }
                    });
                }
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// Notes that `owner` (which could be handed the lock) was granted it. Entries of holds
    /// that were never released (a leaked guard, `expire_in`) go after an hour, once there are
    /// many: a hand-off message is never that late.
    fn note_granted(&self, owner: &str) {
        let mut granted = lock(&self.granted);
        if granted.len() >= 1024 {
            granted.retain(|_, at| at.elapsed() < Duration::from_secs(3600));
        }
        granted.insert(owner.to_owned(), Instant::now());
    }

    /// A release without the release function: the owner's hold goes, and every waiter is woken
    /// (PostgreSQL: by the same statement's `NOTIFY`). Answers whether a hold was removed.
    pub(super) async fn release_plain(&self, name: &str, owner: &str) -> Result<bool> {
        if let (Some(stmt), Some(_)) = (&self.st.release_notify, &self.notify) {
            let removed: i64 = sqlx::query(stmt)
                .bind(name)
                .bind(owner)
                .bind(self.table.as_str())
                .bind(name)
                .fetch_one(&self.pool)
                .await
                .and_then(|r| r.try_get(0))
                .map_err(|e| self.err(e))?;
            return Ok(removed > 0);
        }
        let removed = sqlx::query(&self.st.release)
            .bind(name)
            .bind(owner)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
        if removed > 0 {
            self.wake(name).await;
        }
        Ok(removed > 0)
    }

    /// Registers `req` to be woken (not handed the lock) by its name's releases: an election's
    /// observer, which never attempts.
    /// The registration is written under the name's wake lock (see `fast::WAKE_KEY`), and the
    /// observer looks again after it: a release either sees it or is over before that look.
    async fn register_watcher(&self, req: &Request<'_>, key: (i32, i32)) -> Result<()> {
        let r = async {
            let mut tx = self.pool.begin().await?;
            if let Some(stmt) = &self.st.wake_lock {
                sqlx::query(stmt)
                    .bind(fast::wake_key_text(&self.table, req.name.as_str()))
                    .execute(&mut *tx)
                    .await?;
            }
            let q = sqlx::query(&self.st.register);
            bind_registration(q, &self.table, req, false, key)
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        };
        r.await.map_err(|e| self.err(e))
    }

    /// Sends the wake-up of `name` to every listener (PostgreSQL; the core wakes this process's
    /// waiters).
    pub(super) async fn wake(&self, name: &str) {
        if let Some(sql) = &self.notify {
            let r = sqlx::query(sql)
                .bind(self.table.as_str())
                .bind(name)
                .execute(&self.pool)
                .await;
            if let Err(e) = r {
                // Waiters elsewhere still notice through their lease bound and safety net.
                tracing::debug!(error = %e, "NOTIFY failed");
            }
        }
    }

    /// Removes `req`'s queue place, if any.
    async fn cancel_place(&self, req: &Request<'_>) -> Result<()> {
        let name = req.name.as_str();
        let removed = sqlx::query(&self.st.del_queue_owner)
            .bind(name)
            .bind(req.owner)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
        if removed > 0 {
            self.wake(name).await;
        }
        Ok(())
    }

    /// Extends the lease-mode holds of `group` (all with a lease of `lease_ms`) in one `UPDATE`,
    /// autocommitted (`detach`: marked as renewed by nobody any more); answers what it found of
    /// each. Only when fewer rows changed than holds were asked for does a second statement read
    /// back which ones are live or revoked.
    async fn extend_group(
        &self,
        lease_ms: i64,
        group: &[&HoldRef<'_>],
        detach: bool,
    ) -> Result<Vec<Renewed>> {
        let t = &self.table;
        let now = self.dialect.now_ms();
        let pairs = name_owner_pairs(group.len());
        let set_state = if detach { ", state = 1" } else { "" };
        let update = self.dialect.sql(&format!(
            "UPDATE {t} SET expires_at_ms = {now} + ?{set_state} \
             WHERE expires_at_ms > {now} AND state <> 2 AND (name, owner) IN ({pairs})"
        ));
        let mut tries = 0;
        let changed = loop {
            tries += 1;
            let mut q = sqlx::query(&update).persistent(false).bind(lease_ms);
            for h in group {
                q = q.bind(h.name.as_str()).bind(h.owner);
            }
            match q.execute(&self.pool).await {
                Ok(r) => break r.rows_affected(),
                Err(e) if is_retryable(&e) && tries < TX_TRIES => continue,
                Err(e) => return Err(self.err(e)),
            }
        };
        if changed >= group.len() as u64 {
            return Ok(vec![Renewed::Live; group.len()]);
        }
        // Some are gone or revoked: read back which (the update just pushed every live one out).
        let select = self.dialect.sql(&format!(
            "SELECT name, owner, state FROM {t} \
             WHERE expires_at_ms > {now} AND (name, owner) IN ({pairs})"
        ));
        let mut q = sqlx::query(&select).persistent(false);
        for h in group {
            q = q.bind(h.name.as_str()).bind(h.owner);
        }
        let rows = q.fetch_all(&self.pool).await.map_err(|e| self.err(e))?;
        let mut found: HashMap<(String, String), i64> = HashMap::with_capacity(rows.len());
        for r in rows {
            let name: String = r.try_get(0).map_err(|e| self.err(e))?;
            let owner: String = r.try_get(1).map_err(|e| self.err(e))?;
            let state: i64 = r.try_get(2).map_err(|e| self.err(e))?;
            found.insert((name, owner), state);
        }
        Ok(group
            .iter()
            .map(
                |h| match found.get(&(h.name.as_str().to_owned(), h.owner.to_owned())) {
                    Some(&STATE_REVOKED) => Renewed::Revoked,
                    Some(_) => Renewed::Live,
                    None => Renewed::Gone,
                },
            )
            .collect())
    }

    /// Extends lease-mode holds, at most 500 of one lease per statement.
    async fn extend_leases(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        let mut found = vec![Renewed::Gone; holds.len()];
        for (lease_ms, idx) in extend_groups(holds) {
            let group: Vec<&HoldRef<'_>> = idx.iter().map(|&i| &holds[i]).collect();
            for (i, f) in idx
                .into_iter()
                .zip(self.extend_group(lease_ms, &group, detach).await?)
            {
                found[i] = f;
            }
        }
        Ok(extend_answers(holds, &found))
    }

    pub(super) async fn db_now(
        &self,
        conn: &mut AnyConnection,
    ) -> std::result::Result<i64, sqlx::Error> {
        sqlx::query(&self.st.now).fetch_one(conn).await?.try_get(0)
    }

    /// The live state of `name` at `now`, in one round trip. Deletes the name's expired rows
    /// when there are any and `cleanup` is set (inside a grant transaction); the flag says
    /// whether it did.
    async fn load_state(
        &self,
        conn: &mut AnyConnection,
        name: &str,
        now: i64,
        cleanup: bool,
    ) -> std::result::Result<(NameState, bool), TxError> {
        let rows: Vec<StateRow> = sqlx::query_as(&self.st.load_all)
            .bind(name)
            .bind(name)
            .fetch_all(&mut *conn)
            .await?;
        let Loaded { state, expired, .. } = Loaded::split(ROWS, rows, now)?;
        if expired && cleanup {
            for stmt in [&self.st.del_expired_holds, &self.st.del_expired_queue] {
                sqlx::query(stmt)
                    .bind(name)
                    .bind(now)
                    .execute(&mut *conn)
                    .await?;
            }
        }
        Ok((state, expired && cleanup))
    }

    /// `true` if `req` would still be refused now (read-only; the acquisition's look): the
    /// name's rows and the server's clock in one round trip.
    async fn still_busy(&self, req: &Request<'_>) -> Result<Look> {
        self.look_and_holds(req).await.map(|(look, _)| look)
    }

    /// [`Sql::still_busy`], and whether live holds of other owners are in the way (else only
    /// the fair queue refuses it).
    async fn look_and_holds(&self, req: &Request<'_>) -> Result<(Look, bool)> {
        self.looks.fetch_add(1, Ordering::Relaxed);
        let name = req.name.as_str();
        let mut rows: Vec<StateRow> = sqlx::query_as(&self.st.look_all)
            .bind(name)
            .bind(name)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let now = match rows.iter().position(|r| r.0 == "n") {
            Some(i) => rows.remove(i).5,
            None => return Err(ROWS.corrupt("server clock", &"no row")),
        };
        let Loaded { state, .. } = Loaded::split(ROWS, rows, now)?;
        let held = state.holds.iter().any(|h| h.owner != req.owner);
        Ok((state.look(req, now), held))
    }

    /// One attempt of `req`: the routine, else the full path. With the answer, the highest
    /// token of the holds that refused it (a hand-off with a higher one came after).
    /// `wake_lock`: the full path takes the name's wake lock (see `fast::WAKE_KEY`).
    async fn acquire_tx(
        self: &Arc<Self>,
        req: &Request<'_>,
        reg: Option<&RegArgs>,
        wake_lock: bool,
    ) -> Result<(Attempt, u64)> {
        match self.fast_grouped(req, reg).await {
            Ok(Some(a)) => return Ok(a),
            Ok(None) => {}
            // A deadlock or serialization failure: the full path retries.
            Err(e) if is_retryable(&e) => {}
            Err(e) => return Err(self.err(e)),
        }
        self.acquire_full(req, reg, wake_lock).await
    }

    /// The full path of [`Sql::acquire_tx`]: its transaction, tried again after a deadlock or
    /// serialization failure.
    async fn acquire_full(
        &self,
        req: &Request<'_>,
        reg: Option<&RegArgs>,
        wake_lock: bool,
    ) -> Result<(Attempt, u64)> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.acquire_once(req, reg, wake_lock).await {
                Err(TxError::Sql(e)) if is_retryable(&e) && tries < TX_TRIES => {
                    let pause = rand::thread_rng().gen_range(1..=10 * u64::from(tries));
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Err(TxError::Sql(e)) => return Err(self.err(e)),
                Err(TxError::Dlock(e)) => return Err(e),
                Ok(a) => return Ok(a),
            }
        }
    }

    async fn acquire_once(
        &self,
        req: &Request<'_>,
        reg: Option<&RegArgs>,
        wake_lock: bool,
    ) -> std::result::Result<(Attempt, u64), TxError> {
        let name = req.name.as_str();
        let st = &self.st;
        // The name's wake lock first, with the `BEGIN` (PostgreSQL, when asked): a place or
        // registration this transaction writes is seen by every release that has not looked
        // for waiters yet, and a release that has is waited for, so the look below sees the
        // hold it removed gone.
        let mut tx = match st.wake_lock {
            Some(_) if wake_lock => {
                self.pool
                    .begin_with(fast::begin_wake_sql(&self.table, name))
                    .await?
            }
            _ => self.pool.begin().await?,
        };
        // Lock the name: every grant of it passes through this row lock.
        if self.dialect == Dialect::MySql {
            sqlx::query(&st.ensure_fence)
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        let row = sqlx::query(&st.lock_fence_now)
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
        let (stored, now): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        let stored = ROWS.token(stored)?;
        // Whether the transaction changed anything but the row lock (else it rolls back).
        let (state, mut wrote) = self.load_state(&mut tx, name, now, true).await?;
        let seen = state.holds.iter().map(|h| h.token).max().unwrap_or(0);
        let mut writes = SqlWrites { tx: &mut tx, st };
        let (attempt, changed) = grant(&mut writes, &state, req, Some(stored), now).await?;
        wrote |= changed;
        match (&attempt, reg) {
            // Registered (PostgreSQL's waiters' table is unlogged: no disk flush for it).
            (Attempt::Busy(_), Some(r)) if r.register => {
                bind_registration(
                    sqlx::query(&st.register),
                    &self.table,
                    req,
                    r.handoff,
                    r.key,
                )
                .execute(&mut *tx)
                .await?;
                wrote = true;
            }
            (Attempt::Granted(_), Some(r)) if r.registered => {
                sqlx::query(&st.unregister)
                    .bind(name)
                    .bind(req.owner)
                    .execute(&mut *tx)
                    .await?;
            }
            _ => {}
        }
        // A refusal that changed nothing ends with ROLLBACK: no commit record to flush to disk,
        // so the waiters that lose a race for a released lock cost no fsync each.
        if wrote {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok((attempt, seen))
    }

    pub(super) async fn describe_rows(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let now = self.db_now(&mut conn).await.map_err(|e| self.err(e))?;
        let holds: Vec<HoldListing> = sqlx::query_as(&self.st.describe_holds)
            .bind(now)
            .bind(prefix)
            .bind(prefix)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.err(e))?;
        let queue: Vec<WaiterListing> = sqlx::query_as(&self.st.describe_queue)
            .bind(now)
            .bind(prefix)
            .bind(prefix)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.err(e))?;
        listing(ROWS, prefix, now, holds, queue)
    }
}

/// What an attempt tells the store about its waiter (PostgreSQL with hand-offs).
#[derive(Debug, Clone, Copy)]
pub(super) struct RegArgs {
    /// A refusal registers the waiter for a hand-off (a mutex waiter at the head of its
    /// client's line); else, for a waiting request that takes no queue place, to be woken.
    handoff: bool,
    /// Whether to register at all (a waiting request that takes no queue place).
    register: bool,
    /// It may be registered from an earlier attempt: a grant removes the registration.
    registered: bool,
    /// The advisory lock of this client's listener.
    key: (i32, i32),
}

/// Binds a registration of `req` ([`fast::register_sql`]'s parameters).
fn bind_registration<'q>(
    q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    table: &str,
    req: &'q Request<'q>,
    handoff: bool,
    (lk1, lk2): (i32, i32),
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    q.bind(req.name.as_str())
        .bind(req.owner)
        .bind(handoff)
        .bind(fast::handoff_channel(table, lk1, lk2))
        .bind(lk1)
        .bind(lk2)
        .bind(ms(req.lease))
        .bind(req.meta.client_id.as_str())
        .bind(req.meta.host.as_str())
        .bind(i64::from(req.meta.pid))
        .bind(req.meta.value.as_deref())
}

/// How dlock's pools check a connection before they hand it out: one that sat idle for at least
/// [`PING_IDLE`] is pinged first (and replaced if the ping fails); one used more recently is
/// not. sqlx's default pings every time, which costs each statement a round trip of its own.
/// A connection that died within the window (the server restarted a moment ago) fails its
/// statement instead, as a statement cut off by the restart would: [`Error::Unavailable`], which
/// a waiting acquisition tries again and after which a release's hold ends with its lease.
/// `dlock bench`'s raw SQL floor uses the same check.
pub fn ping_when_idle<DB: sqlx::Database>(
    options: sqlx::pool::PoolOptions<DB>,
) -> sqlx::pool::PoolOptions<DB> {
    options
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

/// Session settings of every connection: server-side timeouts, and READ COMMITTED on MySQL.
pub(super) async fn setup(
    d: Dialect,
    conn: &mut AnyConnection,
) -> std::result::Result<(), sqlx::Error> {
    let secs = STATEMENT_TIMEOUT.as_secs();
    match d {
        Dialect::Postgres => {
            let set = format!(
                "SET statement_timeout = '{secs}s'; SET lock_timeout = '{secs}s'; \
                 SET idle_in_transaction_session_timeout = '{}s'",
                secs * 6
            );
            conn.execute(set.as_str()).await?;
        }
        Dialect::MySql => {
            sqlx::query(&format!("SET SESSION innodb_lock_wait_timeout = {secs}"))
                .execute(&mut *conn)
                .await?;
            sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await?;
            // MariaDB's statement timeout (MySQL has no equivalent for writes; the client-side
            // operation timeout covers it).
            let _ = sqlx::query(&format!("SET SESSION max_statement_time = {secs}"))
                .execute(&mut *conn)
                .await;
        }
    }
    Ok(())
}

/// The binary no-pad collation of this MySQL/MariaDB server.
async fn mysql_collation(pool: &AnyPool, shown: &str) -> Result<String> {
    let rows = sqlx::query(
        "SELECT CAST(COLLATION_NAME AS CHAR(64)) FROM information_schema.COLLATIONS
         WHERE COLLATION_NAME IN ('utf8mb4_0900_bin', 'utf8mb4_nopad_bin')",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| map_err(shown, e))?;
    let names: Vec<String> = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
    for c in ["utf8mb4_0900_bin", "utf8mb4_nopad_bin"] {
        if names.iter().any(|n| n == c) {
            return Ok(c.to_string());
        }
    }
    Err(Error::Unavailable(format!(
        "{shown}: the server has no binary no-pad utf8mb4 collation (needs MySQL 8 or \
         MariaDB 10.2 or newer)"
    )))
}

fn d_sql(d: Dialect, s: &str) -> String {
    d.sql(s)
}

#[async_trait::async_trait]
impl Backend for SqlBackend {
    fn name(&self) -> &'static str {
        self.inner.dialect.name()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            values: true,
            hands_off: self.inner.handoffs.load(Ordering::Relaxed)
                || self.inner.rings.load(Ordering::Relaxed),
            ..Capabilities::lease(match self.inner.dialect {
                Dialect::Postgres => Wakeups::Native,
                Dialect::MySql => Wakeups::Polling {
                    min: POLL_MIN,
                    max: POLL_MAX,
                },
            })
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        let sql = &self.inner;
        // Waiters register where releases hand a mutex on and wake only who waits: a mutex
        // waiter (fair or not) to be handed the lock, other waiters that take no queue place
        // to be woken (a queue place is seen by the release).
        let reg = (req.waiting && sql.handoffs.load(Ordering::Relaxed)).then(|| {
            let handoff = req.kind == LockKind::Mutex;
            let slot = Arc::new(Slot::default());
            if handoff {
                lock(&sql.slots).insert(req.owner.to_owned(), Arc::downgrade(&slot));
            }
            Registration {
                slot,
                handoff,
                since: None,
                registered: false,
                allowed: true,
            }
        });
        // A fair mutex waiter on MySQL waits for its name's bell; so does a non-fair one where
        // the ring routines are, and takes the hold a bell holder's release reserves for it.
        let fair = req.takes_queue_place();
        let rings = sql.rings.load(Ordering::Relaxed) && req.waiting && !fair;
        let bell = (sql.bells.is_some()
            && req.kind == LockKind::Mutex
            && req.mode == Mode::Exclusive
            && (fair || rings))
            .then(|| {
                let (kind, permits) = kind_columns(req.kind);
                let take = rings.then(|| Take {
                    kind,
                    permits,
                    mode: req.mode.as_str(),
                    name: req.name.as_str().to_owned(),
                    owner: req.owner.to_owned(),
                    lease_ms: ms(req.lease),
                    client_id: req.meta.client_id.clone(),
                    host: req.meta.host.clone(),
                    pid: i64::from(req.meta.pid),
                    value: req.meta.value.clone(),
                });
                BellWait::new(bell_key(&sql.table, req.name.as_str()), take)
            });
        Box::new(SqlAcquisition {
            store: sql.clone(),
            want: Want::new(req),
            since: None,
            reg,
            attempted: false,
            placed: false,
            bell,
        })
    }

    fn shared_key(&self) -> Option<String> {
        Some(self.inner.key.clone())
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(OP_TIMEOUT)
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        self.inner
            .release_hold(hold.name.as_str(), hold.owner)
            .await
    }

    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        let answers = self.inner.extend_leases(holds, detach).await?;
        // A hold left to expire (`expire_in`) is never released: its bell goes now.
        if let (true, Some(bells)) = (detach, &self.inner.bells) {
            for h in holds {
                bells.released(h.owner);
            }
        }
        Ok(answers)
    }

    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        let (name, sql) = (hold.name.as_str(), &self.inner);
        // One statement comparing the owner (PostgreSQL: with its NOTIFY).
        let changed = match (&sql.st.set_value_notify, &sql.notify) {
            (Some(stmt), Some(_)) => sqlx::query(stmt)
                .bind(value)
                .bind(name)
                .bind(hold.owner)
                .bind(sql.table.as_str())
                .bind(name)
                .fetch_one(&sql.pool)
                .await
                .and_then(|r| r.try_get::<i64, _>(0))
                .map(|n| u64::try_from(n).unwrap_or(0)),
            _ => sqlx::query(&sql.st.set_value)
                .bind(value)
                .bind(name)
                .bind(hold.owner)
                .execute(&sql.pool)
                .await
                .map(|r| r.rows_affected()),
        }
        .map_err(|e| sql.err(e))?;
        if changed == 0 {
            return Ok(Released::NotHeld);
        }
        sql.signals.wake(name);
        Ok(Released::Released)
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.describe_rows(prefix).await
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let name = name.as_str();
        let done = async {
            let r = async {
                let st = &self.inner.st;
                let mut tx = self.inner.pool.begin().await?;
                sqlx::query(&st.ensure_fence)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&st.lock_fence)
                    .bind(name)
                    .fetch_one(&mut *tx)
                    .await?;
                let now = self.inner.db_now(&mut tx).await?;
                let removed = sqlx::query(match how {
                    Force::Break => &st.force_live,
                    Force::Revoke => &st.force_detached,
                })
                .bind(name)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                let mut done = Forced {
                    removed,
                    ..Forced::default()
                };
                match how {
                    Force::Break => {
                        sqlx::query(&st.del_name_holds)
                            .bind(name)
                            .execute(&mut *tx)
                            .await?;
                    }
                    Force::Revoke => {
                        for stmt in [&st.del_expired_holds, &st.revoke] {
                            sqlx::query(stmt)
                                .bind(name)
                                .bind(now)
                                .execute(&mut *tx)
                                .await?;
                        }
                        let row = sqlx::query(&st.revoked)
                            .bind(name)
                            .bind(now)
                            .fetch_one(&mut *tx)
                            .await?;
                        let (n, longest): (i64, Option<i64>) = (row.try_get(0)?, row.try_get(1)?);
                        done.revoked = u64::try_from(n).unwrap_or(0);
                        done.revoked_lease_left_ms =
                            longest.map(|e| u64::try_from(e - now).unwrap_or(0));
                    }
                }
                if how == Force::Break {
                    sqlx::query(&st.del_name_queue)
                        .bind(name)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok::<_, sqlx::Error>(done)
            }
            .await;
            r.map_err(|e| self.inner.err(e))
        }
        .await?;
        self.inner.wake(name).await;
        Ok(done)
    }
}

/// The grant transaction's writes in this dialect's statements.
struct SqlWrites<'a> {
    tx: &'a mut sqlx::Transaction<'static, sqlx::Any>,
    st: &'a Stmts,
}

#[async_trait::async_trait]
impl GrantWrites for SqlWrites<'_> {
    async fn regrant(&mut self, name: &str, owner: &str, expires_ms: i64) -> SqlResult {
        let q = sqlx::query(&self.st.regrant).bind(expires_ms).bind(owner);
        q.bind(name).execute(&mut **self.tx).await.map(drop)
    }

    async fn set_fence(&mut self, name: &str, fence: i64, _stored: bool) -> SqlResult {
        // The fence row exists: the transaction began by locking it.
        let q = sqlx::query(&self.st.set_fence).bind(fence).bind(name);
        q.execute(&mut **self.tx).await.map(drop)
    }

    async fn drop_place(&mut self, name: &str, owner: &str) -> SqlResult {
        let q = sqlx::query(&self.st.del_queue_owner).bind(name).bind(owner);
        q.execute(&mut **self.tx).await.map(drop)
    }

    async fn insert_hold(&mut self, req: &Request<'_>, fence: i64, now: i64) -> SqlResult {
        let q = bind_hold(sqlx::query(&self.st.insert_hold), req, fence, now, now);
        q.execute(&mut **self.tx).await.map(drop)
    }

    async fn refresh_place(&mut self, name: &str, owner: &str, expires_ms: i64) -> SqlResult {
        let q = sqlx::query(&self.st.refresh_queue)
            .bind(expires_ms)
            .bind(name);
        q.bind(owner).execute(&mut **self.tx).await.map(drop)
    }

    async fn insert_place(&mut self, req: &Request<'_>, expires_ms: i64) -> SqlResult {
        let q = bind_waiter(sqlx::query(&self.st.insert_queue), req, expires_ms);
        q.execute(&mut **self.tx).await.map(drop)
    }
}

type SqlResult = std::result::Result<(), sqlx::Error>;

/// What a waiting attempt knew when it was sent: the count of the listener's wake-ups of its
/// name and the listener's state, so a notification between the attempt and the wait counts.
struct Since {
    signal: Arc<crate::signal::NameSignal>,
    wakes: u64,
    listener: Option<tokio::sync::watch::Receiver<bool>>,
}

/// A waiting acquisition's registration in `<table>_waiters` (PostgreSQL with hand-offs).
struct Registration {
    /// Where the listener leaves a hand-off to it.
    slot: Arc<Slot>,
    /// A mutex waiter: it registers to be handed the lock (else to be woken).
    handoff: bool,
    /// When the latest attempt that registered it for a hand-off was sent, and the highest
    /// token in its way then: a hand-off with a higher token happened after that send, so its
    /// lease is counted from it.
    since: Option<(Instant, u64)>,
    /// Whether its row may be in the table.
    registered: bool,
    /// Whether its next refused attempt may register it for a hand-off (the core's
    /// [`Acquisition::may_register`]: the head of its client's line only).
    allowed: bool,
}

/// One acquisition on PostgreSQL or MySQL: what it knew when its last attempt was sent, and on
/// PostgreSQL with hand-offs its registration.
struct SqlAcquisition {
    store: Arc<Sql>,
    want: Want,
    since: Option<Since>,
    reg: Option<Registration>,
    /// It attempted: a waiter. Until then it watches as an observer (an election's follower).
    attempted: bool,
    /// A waiting attempt was refused: its queue place or registration, if any, is committed
    /// and every release sees it, so later attempts need not take the name's wake lock.
    placed: bool,
    /// A fair mutex waiter's bell (MySQL).
    bell: Option<BellWait>,
}

impl SqlAcquisition {
    /// A hand-off to this acquisition that happened after its latest registering attempt was
    /// sent, with the part of its lease that is left, if enough is left to take it without a
    /// round trip.
    fn handed(&mut self) -> Option<Grant> {
        let reg = self.reg.as_mut()?;
        let token = lock(&reg.slot.token).take()?;
        Grant::handed(token, &mut reg.since, &mut reg.registered, self.want.lease)
    }

    /// The hold its ring took (MySQL, a non-fair waiter), as a grant counted from the ring's
    /// request, if at least half its lease is left; the bell is the hold's from now on.
    fn rung(&mut self) -> Option<Grant> {
        let w = self.bell.as_mut()?;
        let (token, asked) = w.taken.take()?;
        let left = self.want.lease.checked_sub(asked.elapsed())?;
        if left < self.want.lease / 2 {
            return None;
        }
        if let Some(bells) = self.store.bells.as_ref() {
            bells.granted(
                &self.want.owner,
                std::mem::replace(&mut w.state, Ringing::Idle),
                self.want.lease,
                true,
            );
        }
        Some(Grant {
            token: Some(token),
            valid_for: left,
        })
    }

    /// A non-fair mutex waiter of a name its client saw busy lately (MySQL with the ring
    /// routines), with no request for the bell out: attempts in the ring routine, which asks
    /// for the bell at once when refused, so the refusal and the wait are one call. `None`: not
    /// such a waiter (the usual attempt follows).
    async fn ring_first(&mut self) -> Option<Tried> {
        let bells = self.store.bells.clone()?;
        let w = self.bell.as_mut()?;
        let take = w.take.clone()?;
        if !matches!(w.state, Ringing::Idle)
            || !self.store.rings.load(Ordering::Relaxed)
            || !self.store.routine_may_grant(self.want.lease)
            || !bells.busy_lately(&w.key)
        {
            return None;
        }
        let asked = Instant::now();
        let (first, asking) = bells.try_ring(w.key.clone(), take);
        let tried = first.await.unwrap_or(Tried::Failed);
        if let Tried::Busy(_) = tried {
            w.asked = Some(asked);
            w.state = Ringing::Asking(asking);
        }
        Some(tried)
    }

    /// The listener's lock while it is up.
    fn listener_key(&self) -> Option<(i32, i32)> {
        self.store.listener.as_ref().and_then(|l| l.key())
    }

    /// A refused fair mutex waiter's wait on MySQL: for its name's bell (see `bell.rs`).
    async fn wait_for_bell(&mut self, until: Instant) -> Result<Watch> {
        let poll = Watch::Poll {
            min: POLL_MIN,
            max: POLL_MAX,
        };
        let (Some(bells), Some(w)) = (self.store.bells.clone(), self.bell.as_mut()) else {
            return Ok(poll);
        };
        loop {
            match &mut w.state {
                Ringing::Off => return Ok(poll),
                Ringing::Idle => {
                    w.asked = Some(Instant::now());
                    w.state = Ringing::Asking(bells.ask(w.key.clone(), w.take.clone()));
                }
                Ringing::Asking(asking) => {
                    // Asked by reference: a wait cut short (an in-process wake-up) keeps the
                    // request and its place in the server's line.
                    let rung = tokio::select! {
                        r = asking.answer() => r,
                        _ = tokio::time::sleep_until(until.into()) => return Ok(Watch::Recheck),
                    };
                    return Ok(match rung {
                        Rung::Bell(b, ring) => {
                            w.state = Ringing::Held(b);
                            match ring {
                                Ring::Took(token) => {
                                    w.taken = w.asked.map(|at| (token, at));
                                    Watch::Changed
                                }
                                // The ring looked: the name's poller, with nothing to attempt.
                                Ring::Busy => poll,
                                Ring::Attempt => Watch::Changed,
                            }
                        }
                        Rung::Timeout => {
                            w.state = Ringing::Idle;
                            Watch::Recheck
                        }
                        Rung::Failed => {
                            w.state = Ringing::Off;
                            poll
                        }
                    });
                }
                Ringing::Held(_) => {
                    // Refused with the bell: the name's poller, unless others are ahead.
                    let state = match self.store.still_busy(&self.want.req()).await? {
                        Look::Free => return Ok(Watch::Changed),
                        Look::Busy {
                            state,
                            place: Some(k),
                        } if k > 0 => state,
                        Look::Busy { .. } => return Ok(poll),
                    };
                    if let Some(at) = w.pass_at(state) {
                        if at >= until {
                            tokio::time::sleep_until(until.into()).await;
                            return Ok(Watch::Recheck);
                        }
                        tokio::time::sleep_until(at.into()).await;
                    }
                    if let Ringing::Held(b) = std::mem::replace(&mut w.state, Ringing::Idle) {
                        bells.free(b).await;
                    }
                }
            }
        }
    }
}

impl Drop for SqlAcquisition {
    fn drop(&mut self) {
        // Dropped with a hold its ring took and never reported: released and passed on.
        if let (Some(w), Some(bells)) = (self.bell.as_mut(), self.store.bells.clone()) {
            if w.taken.take().is_some() {
                if let (Ringing::Held(b), Ok(rt)) = (
                    std::mem::replace(&mut w.state, Ringing::Off),
                    tokio::runtime::Handle::try_current(),
                ) {
                    let (name, owner) = (self.want.name.to_string(), self.want.owner.clone());
                    rt.spawn(async move {
                        let _ = bells.unring(b, &name, &owner, true).await;
                    });
                }
            }
        }
        let Some(r) = &self.reg else {
            return;
        };
        if r.handoff {
            lock(&self.store.slots).remove(&self.want.owner);
        }
        // An observer's registration (a waiter's goes with its grant or its cancel).
        if r.registered && !self.attempted {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (store, name, owner) = (
                    self.store.clone(),
                    self.want.name.to_string(),
                    self.want.owner.clone(),
                );
                rt.spawn(async move {
                    let _ = sqlx::query(&store.st.unregister)
                        .bind(name)
                        .bind(owner)
                        .execute(&store.pool)
                        .await;
                });
            }
        }
    }
}

#[async_trait::async_trait]
impl Acquisition for SqlAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        if let Some(g) = self.handed() {
            self.store.note_granted(&self.want.owner);
            return Ok(Attempt::Granted(g));
        }
        // Rung with the hold reserved for it: granted without a round trip while enough of its
        // lease is known to be left (counted from the ring's request); else the attempt below
        // meets the hold as its own and renews it.
        if let Some(g) = self.rung() {
            return Ok(Attempt::Granted(g));
        }
        self.attempted = true;
        if self.want.waiting {
            self.mark();
        }
        let key = self.listener_key();
        let takes_place = self.want.req().takes_queue_place();
        let args = self.reg.as_ref().map(|r| RegArgs {
            handoff: r.handoff,
            register: key.is_some() && if r.handoff { r.allowed } else { !takes_place },
            registered: r.registered,
            key: key.unwrap_or((0, 0)),
        });
        // The name's wake lock, while this waiter may write its first queue place or
        // registration (a place that expired, after 5 s without a refresh, comes back without it).
        let wake_lock = self.want.waiting
            && (!self.placed || args.as_ref().is_some_and(|a| a.register && !a.registered));
        let sent = Instant::now();
        let (attempt, seen) = match self.ring_first().await {
            Some(Tried::Granted(token)) => (
                Attempt::Granted(Grant {
                    token: Some(token),
                    valid_for: self.want.lease,
                }),
                0,
            ),
            Some(Tried::Busy(wait_ms)) => (
                Attempt::Busy(Busy {
                    retry_in: Some(Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0))),
                }),
                0,
            ),
            // The ring's attempt said "full path": the grant routine would say it again.
            Some(Tried::Full) => {
                self.store
                    .acquire_full(&self.want.req(), args.as_ref(), wake_lock)
                    .await?
            }
            Some(Tried::Failed) | None => {
                self.store
                    .acquire_tx(&self.want.req(), args.as_ref(), wake_lock)
                    .await?
            }
        };
        if self.want.waiting && matches!(attempt, Attempt::Busy(_)) {
            self.placed = true;
            if let (Some(w), Some(bells)) = (&self.bell, &self.store.bells) {
                if w.take.is_some() {
                    bells.saw_busy(&w.key);
                }
            }
        }
        // Granted while it held or asked for the bell: the bell is the hold's now.
        if let (Attempt::Granted(_), Some(w), Some(bells)) =
            (&attempt, self.bell.as_mut(), self.store.bells.as_ref())
        {
            w.taken = None;
            let ringing = match std::mem::replace(&mut w.state, Ringing::Idle) {
                Ringing::Held(b) => Ringing::Held(b),
                // A non-fair waiter's ring still asking is withdrawn now (dropped: interrupted
                // at the server), so that it never takes a reservation for a hold that is over;
                // refused before, its hold is kept as one without the bell.
                _ if w.take.is_some() && self.placed => Ringing::Off,
                Ringing::Asking(a) if w.take.is_none() => Ringing::Asking(a),
                _ => Ringing::Idle,
            };
            bells.granted(&self.want.owner, ringing, self.want.lease, w.take.is_some());
        }
        if let (Some(r), Some(a)) = (self.reg.as_mut(), args) {
            match &attempt {
                Attempt::Busy(_) if a.register => {
                    r.registered = true;
                    if r.handoff {
                        r.since = Some((sent, seen));
                    }
                }
                Attempt::Granted(_) => {
                    r.registered = false;
                    r.since = None;
                    // Only a registered waiter can be handed the lock (and get a late message).
                    if r.handoff && a.registered {
                        self.store.note_granted(&self.want.owner);
                    }
                }
                Attempt::Busy(_) => {}
            }
        }
        Ok(attempt)
    }

    fn mark(&mut self) -> bool {
        let signal = self.store.signals.subscribe(self.want.name.as_str());
        self.since = Some(Since {
            wakes: signal.wakes(),
            signal,
            listener: self.store.listener.as_ref().map(|s| s.up.subscribe()),
        });
        true
    }

    fn may_register(&mut self, on: bool) {
        if let Some(r) = self.reg.as_mut() {
            r.allowed = on;
        }
    }

    async fn changed(&mut self, _busy: &Busy, until: Instant) -> Result<Watch> {
        if self.bell.is_some() && self.attempted {
            return self.wait_for_bell(until).await;
        }
        let poll = Watch::Poll {
            min: POLL_MIN,
            max: POLL_MAX,
        };
        // MySQL has no notification.
        let Some(since) = self.since.as_mut() else {
            return Ok(poll);
        };
        let Some(listener) = since.listener.as_mut() else {
            return Ok(poll);
        };
        let slot = self.reg.as_ref().map(|r| r.slot.clone());
        // Handed the lock since the attempt: take it.
        if slot.as_ref().is_some_and(|s| lock(&s.token).is_some()) {
            return Ok(Watch::Changed);
        }
        // News of the listener (it went down or came back) since the attempt.
        if listener.has_changed().unwrap_or(true) {
            let up = *listener.borrow_and_update();
            if !up {
                return Ok(poll);
            }
            match self.reg.as_mut() {
                // Back under a new lock: a registration made under the old one no longer
                // counts, and a refusal while it was down registered nobody; a waiter registers
                // by attempting, an observer below.
                Some(_) if self.attempted => return Ok(Watch::Changed),
                Some(r) => r.registered = false,
                None => return Ok(Watch::Recheck),
            }
        }
        if !*listener.borrow() {
            return Ok(poll);
        }
        // An observer (it never attempts) on a store whose releases wake only who waits:
        // registered first, then it looks again.
        if !self.attempted {
            if let Some(r) = self.reg.as_mut().filter(|r| !r.registered) {
                let key = self.store.listener.as_ref().and_then(|l| l.key());
                if let Some(key) = key {
                    match self.store.register_watcher(&self.want.req(), key).await {
                        Ok(()) => r.registered = true,
                        Err(e) => tracing::debug!(error = %e, "could not register a watcher"),
                    }
                }
                return Ok(Watch::Recheck);
            }
        }
        let Some(since) = self.since.as_mut() else {
            return Ok(poll);
        };
        let Some(listener) = since.listener.as_mut() else {
            return Ok(poll);
        };
        let notified = since.signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let wakes = since.signal.wakes();
        if wakes != since.wakes {
            since.wakes = wakes;
            return Ok(Watch::Changed);
        }
        let handed = async {
            match &slot {
                Some(s) => s.handed.notified().await,
                None => std::future::pending().await,
            }
        };
        // A notification or a hand-off: attempt at once; the listener's news or the deadline:
        // look first.
        let watch = tokio::select! {
            _ = &mut notified => Watch::Changed,
            _ = handed => Watch::Changed,
            _ = listener.changed() => Watch::Recheck,
            _ = tokio::time::sleep_until(until.into()) => Watch::Recheck,
        };
        since.wakes = since.signal.wakes();
        Ok(watch)
    }

    async fn look(&mut self) -> Result<Option<Look>> {
        let (look, held) = self.store.look_and_holds(&self.want.req()).await?;
        // A non-fair waiter polling with its name's bell that only the fair queue refuses now:
        // the queue's head waits for that bell, so it is passed on (asked for again at the next
        // wait).
        if let (Look::Busy { place: None, .. }, false, Some(w), Some(bells)) =
            (&look, held, self.bell.as_mut(), &self.store.bells)
        {
            if w.take.is_some() && w.taken.is_none() && matches!(w.state, Ringing::Held(_)) {
                if let Ringing::Held(b) = std::mem::replace(&mut w.state, Ringing::Idle) {
                    bells.free(b).await;
                }
            }
        }
        Ok(Some(look))
    }

    async fn cancel(&mut self) -> Result<()> {
        // Registered (perhaps handed the lock meanwhile): the registration goes, and a lock
        // handed to it is passed on.
        let leaving = self
            .reg
            .as_ref()
            .is_some_and(|r| r.registered || lock(&r.slot.token).is_some());
        if leaving {
            let (name, owner) = (self.want.name.as_str(), self.want.owner.as_str());
            self.store.release_owner(name, owner, true).await?;
            if let Some(r) = self.reg.as_mut() {
                r.registered = false;
            }
        }
        let cancelled = self.store.cancel_place(&self.want.req()).await;
        // The bell goes once the queue place is gone, so that the waiter it wakes comes next; a
        // hold its ring took is released and passed on with it.
        if let (Some(w), Some(bells)) = (self.bell.as_mut(), self.store.bells.as_ref()) {
            let taken = w.taken.take();
            match std::mem::replace(&mut w.state, Ringing::Off) {
                Ringing::Held(b) if taken.is_some() => {
                    let (name, owner) = (self.want.name.as_str(), self.want.owner.as_str());
                    if let Err(e) = bells.unring(b, name, owner, true).await {
                        tracing::debug!(error = %e, %name, "could not pass on a lock taken for a waiter that left");
                    }
                }
                Ringing::Held(b) => bells.free(b).await,
                // Over at the server before the cancel returns: a ring never takes a
                // reservation for a waiter that left.
                Ringing::Asking(a) => a.withdraw().await,
                _ => {}
            }
        }
        cancelled
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
