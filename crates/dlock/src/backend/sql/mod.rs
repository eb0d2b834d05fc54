//! The SQL stores: SQLite ([`sqlite`], the embedded default), PostgreSQL (`postgres://`,
//! `postgresql://`) and MySQL/MariaDB (`mysql://`, `mariadb://`).
//!
//! All three keep the same tables and grant a name in one transaction, written once
//! (`common::grant`: the grant rule `logic::decide` applied to the name's rows under a lock of
//! its fence row); each store supplies that transaction's statements in its own dialect.
//! PostgreSQL and MySQL are one backend, [`SqlBackend`], with a [`Dialect`] for the few places
//! where their SQL differs; session mode (`?mode=session`, server session locks) is a backend of
//! its own, [`SessionBackend`].
//!
//! # URL options
//!
//! | option | values | default |
//! |---|---|---|
//! | `table` | `[A-Za-z_][A-Za-z0-9_]{0,40}` (never quoted: anything else is refused) | `dlock_locks` |
//! | `mode` | `lease` (rows renewed by the client) or `session` (server session locks, see below) | `lease` |
//! | PostgreSQL only | `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `application_name` (passed to the driver) | |
//! | MySQL only | `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key` (passed to the driver) | |
//!
//! Any other option is [`Error::InvalidConfig`](crate::Error::InvalidConfig).
//!
//! # Tables (lease mode)
//!
//! Created on first use by an idempotent migration (`CREATE TABLE IF NOT EXISTS`, serialized
//! between clients by a server lock), recorded as `schema_version` in `<table>_meta`:
//!
//! | table | columns |
//! |---|---|
//! | `<table>` | `name`, `owner` (unique together), `kind`, `permits`, `mode`, `fence`, `expires_at_ms`, `acquired_at_ms`, `client_id`, `host`, `pid`, `state`, `value` (a hold's published value, NULL for plain locks; added to older tables when a backend opens them) |
//! | `<table>_queue` | `seq` (auto-increment: arrival order), `name`, `owner`, `mode`, `expires_at_ms`, `client_id`, `host`, `pid` |
//! | `<table>_fences` | `name` primary key, `fence`: the last fencing token per name; **rows are never deleted** |
//! | `<table>_meta` | `meta_key` primary key, `meta_value` |
//!
//! and the stored procedure `<table>_grant_v1`, the one-round-trip grant (see
//! [`fast`]); on MySQL/MariaDB also the procedures `<table>_ring_v2` and `<table>_unring_v1`
//! (a non-fair mutex waiter's wait for its name's bell, and a bell holder's release, see
//! Wake-ups), and on PostgreSQL `<table>_waiters` and the release function. They are created
//! when missing, which needs the `CREATE ROUTINE` privilege
//! on MySQL/MariaDB (PostgreSQL: `CREATE` on the schema, as for the tables) and PostgreSQL 11 or
//! newer; without it (or without `EXECUTE` on it) the backend logs a warning once and every
//! `attempt` takes the multi-statement path below, which is slower and equally correct. To
//! remove dlock from a database, drop the four tables and run
//! [`fast::drop_sql`]'s statements.
//!
//! MySQL stores names and owners as `VARCHAR(255) CHARACTER SET utf8mb4` with a binary **no-pad**
//! collation (`utf8mb4_nopad_bin` on MariaDB, `utf8mb4_0900_bin` on MySQL 8), so names that
//! differ by case or by trailing spaces are different locks (the plain `utf8mb4_bin` pads). Names
//! and owner tokens are always bound parameters.
//!
//! # Transactions and clock
//!
//! A lease-mode exclusive `attempt` that takes no queue place (a plain mutex, a `try_write`)
//! first calls the grant routine (one `CALL`): it grants a name that has no rows at all, and
//! refuses a request that meets live holds of other owners, inside the server; it answers "full
//! path" for everything else (a re-grant, expired rows, queue places, another kind). Shared
//! requests (readers, semaphore permits) and requests that take a queue place (fair waiters,
//! waiting rwlock writers) go straight to the full path. It follows the same
//! rule as below: the fence row lock, the clock read under it, a look that sees every grant
//! committed before the lock, `COMMIT` after a grant and `ROLLBACK` after a lost race.
//!
//! The full path is one transaction that serializes every grant of a name across all clients on
//! a row lock of the name's fence row, and reads the **database clock** with that lock.
//! PostgreSQL does both in one statement (`INSERT … ON CONFLICT (name) DO UPDATE SET fence =
//! fence RETURNING fence, clock`, with `clock_timestamp()`, read once the lock is held); MySQL
//! makes sure the row exists (`INSERT … ON DUPLICATE KEY UPDATE fence = fence`) and then runs
//! `SELECT fence, NOW(6) … FOR UPDATE`, whose clock is the statement's start, before any lock
//! wait. A clock read early is safe: it can only judge a hold that expired during the wait as
//! live (a refusal), and the new hold's lease still ends no earlier than `sent + lease`, which is
//! what the client counts from. Then the name's holds and queue are read in one `UNION ALL`
//! (expired rows are deleted only when there are any), `decide`, apply, and `COMMIT` — or
//! `ROLLBACK` when the attempt was refused and changed nothing, so a waiter that loses the race
//! for a released lock costs no commit flush. On PostgreSQL a refusal that writes a queue place
//! commits without waiting for the flush (the place statement sets `synchronous_commit = off`
//! for its transaction): a lost place costs a turn, never exclusion. On this path PostgreSQL's
//! free mutex costs `BEGIN`, the lock, the read, the fence update, the insert and `COMMIT`
//! (MySQL: one statement more); through the routine it is one round trip.
//! MySQL sessions run at `READ COMMITTED`. Deadlocks and serialization failures are retried.
//! `release` is one `DELETE` comparing the owner token (on PostgreSQL the same statement sends
//! the `NOTIFY`); `extend` of many holds is one set-based `UPDATE … WHERE expires_at_ms > now AND
//! (name, owner) IN (…)` per 500 holds of one lease length (autocommitted; a second `SELECT`
//! reads back which were live only when fewer rows changed than were asked for). Expiries are
//! milliseconds on the database clock, so client clocks do not matter; only the database's clock
//! stepping changes lease lengths.
//!
//! A released hold's row is deleted, and the dead row stays until no snapshot can see it. Every
//! grant reads the name's rows, so while a long transaction keeps an old snapshot open (a
//! `pg_dump`, a session idle in a transaction), each grant of a busy name reads past every hold
//! that name had since. Grants get slower, but exclusion is not affected (figures in
//! docs/BACKENDS.md).
//!
//! # Wake-ups
//!
//! PostgreSQL: a release that hands a mutex on (to the earliest registered waiter, or the fair
//! queue's head) tells that waiter's client alone, on its hand-off channel; any other release,
//! cancel or force-release that somebody waits for sends `NOTIFY` on the channel named like the
//! table with the lock name as payload (see [`fast`]). Each backend keeps one listener
//! connection (`PgListener`) that wakes the waiters of that name; a waiter subscribes before it
//! re-reads the lock, so a release is never missed. While the listener is down (it reconnects with
//! backoff) waiters poll as on MySQL. MySQL/MariaDB have no notification: waiters poll with a
//! jittered interval from [`POLL_MIN`] to [`POLL_MAX`], bounded by the blocking holder's remaining
//! lease. The interval doubles while the lock stays as it was and starts again from its shortest
//! whenever a look finds it changed hands (or the fair queue moved), so waiters of a lock that
//! moves often keep looking often and those behind a long hold back off. A fair waiter near the
//! front of the queue starts shorter still: the next one at a quarter of [`POLL_MIN`], the one
//! behind it at half, the third at three quarters, so the queue's next grants come without a
//! poll's delay (figures in docs/BENCHMARKS.md). Mutex waiters on MySQL/MariaDB do not
//! poll: each waits for its name's **bell**, a `GET_LOCK('<table>!<name>')` (over 64 characters:
//! `<table>!#<hash>`) that the holder of a contended hold keeps on a connection of its own
//! and frees with its release; the server wakes the bell's waiters one at a time, in the order
//! they asked. A fair waiter woken attempts at once. A non-fair waiter waits in the ring routine,
//! and a non-fair holder with the bell releases in the unring routine on the bell's session: it
//! turns the hold into a **reservation** (a hold row with an empty owner and `state` 3, which
//! every grant path meets as someone else's hold, for at most 500 ms) and frees the bell; the
//! ring woken takes the reservation inside the server (the next fence, its lease from then) and
//! answers the grant, so the waiter first in the bell's line is handed the lock and the
//! releasing client cannot take it back first. A reservation nobody asked for is deleted at
//! once. The bell only wakes and orders (the rows decide who holds): a waiter that finds the
//! holder without the bell keeps the bell and polls for the others, a fair one that gets it with
//! others ahead of it in the queue passes it on, and one without a bell connection (at most 32 a
//! backend) or whose connection failed polls. On both, waiters in
//! the **same process** (any backend on the same URL and table) are woken at once by an
//! in-process signal. A waiting attempt notes the name's wake count and
//! subscribes to the listener's state before it is sent; when neither moved by the time its wait
//! starts, the wait does not re-read the lock (the attempt just did) and goes straight to sleep.
//!
//! # Session mode (`?mode=session`)
//!
//! Each hold is a server session lock on a **dedicated connection** opened for that hold:
//! PostgreSQL `pg_try_advisory_lock(key)` where `key` is the FNV-1a 64-bit hash of the UTF-8
//! bytes of `<table>`, a NUL byte and the lock name (see [`advisory_key`]); MySQL
//! `GET_LOCK(str, 0)` where `str` is `<table>:<name>` when that is at most 64 characters, else
//! `<table>#` followed by the 16 hex digits of the same hash (see [`mysql_lock_name`]). A hash
//! collision makes two names exclude each other; it never lets two holders in. The server frees
//! the lock when the connection ends (client crash, `pg_terminate_backend`, `KILL`), so a dead
//! holder never blocks others for a lease. `extend` checks, on the dedicated connection, that it
//! is alive, is still the same server session (`pg_backend_pid()` / `CONNECTION_ID()` unchanged)
//! and still holds the lock (`pg_locks` / `IS_USED_LOCK(str) = CONNECTION_ID()`); otherwise the
//! hold is `Gone` and `lost()` fires. The store reports [`Validity::Session`](crate::backend::Validity):
//! a hold whose renewal is not confirmed within its lease is lost and the core releases it, and
//! `expire_in` is [`Error::Unsupported`](crate::Error::Unsupported). The fencing
//! token is the name's row in `<table>_fences`, bumped on the dedicated connection at grant time.
//! Only [`LockKind::Mutex`](crate::LockKind::Mutex) is supported in session mode, without fair queueing (a try-lock
//! cannot queue): RwLock, Semaphore and `fair` answer [`Error::Unsupported`](crate::Error::Unsupported). Session and lease
//! holds of one name do not exclude each other: use one mode per table.
//!
//! **Transaction-pooling proxies break session mode**: behind pgbouncer in transaction (or
//! statement) mode, consecutive statements of one client connection run on different server
//! sessions, so the advisory lock is taken by a server session the client no longer talks to
//! (and that the proxy hands to other clients), and the unlock runs elsewhere. The backend
//! records the server session id at grant and `extend` declares the hold `Gone` when it changes.
//! Use session pooling, or lease mode, behind such a proxy.
//!
//! # Timeouts
//!
//! At most [`MAX_CONNECTIONS`] pooled connections per backend; connecting and every operation are
//! bounded by [`OP_TIMEOUT`] on the client, and statements by a server-side timeout, so a dead
//! database is [`Error::Unavailable`](crate::Error::Unavailable) within seconds, never a hang.
//! A pooled connection is pinged before use only when it sat idle for [`PING_IDLE`] or longer
//! ([`ping_when_idle`]): a busy client spends no round trip on pings.

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod batch;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod bell;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub mod config;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub mod fast;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod server;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod xact;

pub(crate) mod common;

#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use config::{Dialect, HoldMode, SqlConfig};
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use server::{
    advisory_key, fnv1a64, mysql_lock_name, ping_when_idle, SqlBackend, MAX_CONNECTIONS,
    OP_TIMEOUT, PING_IDLE, POLL_MAX, POLL_MIN, STATEMENT_TIMEOUT,
};
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use session::SessionBackend;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use xact::{try_xact_lock, xact_lock, xact_lock_timeout, XactLock, XactOptions};

/// Opens the PostgreSQL or MySQL/MariaDB store of `url`: [`SqlBackend`], or [`SessionBackend`]
/// for `?mode=session`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn open(url: &str) -> crate::error::Result<std::sync::Arc<dyn super::Backend>> {
    Ok(match SqlConfig::parse(url)?.mode {
        HoldMode::Lease => std::sync::Arc::new(SqlBackend::open(url).await?),
        HoldMode::Session => std::sync::Arc::new(SessionBackend::open(url).await?),
    })
}
