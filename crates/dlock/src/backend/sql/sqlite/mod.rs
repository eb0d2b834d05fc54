//! The embedded SQLite store (`sqlite:///abs/path.db`, `sqlite:rel/path.db`): one database file
//! shared by every process of the machine. It is the default store of the CLI.
//!
//! # Tables
//!
//! Created at [`SqliteBackend::open`] by an idempotent migration (`CREATE TABLE IF NOT EXISTS`),
//! recorded as `schema_version` in `dlock_meta` so a later version can migrate an older file (and
//! this version refuses a file written by a newer schema):
//!
//! | table | columns | rows |
//! |---|---|---|
//! | `dlock_meta` | `key` PK, `value` | `('schema_version', 2)`, `('boot_id', <the boot the expiries count from>)` |
//! | `dlock_holds` | key (`name`, `owner`), `kind` (`mutex`/`rwlock`/`semaphore`), `permits` (0 unless semaphore), `mode` (`exclusive`/`shared`), `fence`, `expires_ms` (the machine clock, see *Clock*), `acquired_at_ms` (wall clock, for listings), `client_id`, `host`, `pid`, `state` (0 held, 1 detached, 2 revoked), `value` (the value the holder publishes, an election leader's; NULL for plain locks) | one per hold |
//! | `dlock_queue` | `seq` (`INTEGER PRIMARY KEY AUTOINCREMENT`: arrival order), `name`, `owner`, `mode`, `expires_ms`, `client_id`, `host`, `pid` | one per fair waiter |
//! | `dlock_fences` | `name` PK, `fence` | the last fencing token granted per name; **never deleted** |
//!
//! `dlock_holds` and `dlock_fences` are tables without row ids, stored in the order of their
//! keys, so a grant writes two B-trees (the fence and the hold) and a release one; queue places
//! are indexed by name. A row is *live* while `expires_ms` is in the
//! future; expired rows are ignored everywhere and deleted lazily (by the next `attempt` of the
//! name, and for all names when a backend opens the file). Names and tokens are always bound
//! parameters.
//!
//! # Transactions
//!
//! `attempt`, `extend` and `force_release` run in one write transaction started with
//! `BEGIN IMMEDIATE`, which takes the database's write lock *before* reading: two processes can
//! never both read "free" and both insert. `attempt` loads the live holds, queue places and fence
//! of the name, applies the shared grant rule (`logic::decide`) and commits. An exclusive request
//! that takes no queue place first tries the same transaction as one list of statements, sent to
//! the connection's thread at once (`step.rs`): it grants a name with no live hold or queue
//! place, and answers a refusal from the name's state; a regrant (or a fence at its end) goes on
//! to the full transaction. `release` and
//! `cancel` are single `DELETE` statements comparing the owner token. A waiter repeating `attempt`
//! keeps its queue place (same `seq`); the place's expiry (now + [`QUEUE_PLACE_TTL`]) is rewritten
//! only once it is more than a second old, so a polling fair waiter does not cost a synced write
//! on every attempt.
//!
//! Attempts of one backend that arrive while another of its attempts has its transaction under
//! way wait for that one and then share the next transaction (at most 64, decided in arrival
//! order, one `COMMIT`): a client taking many names at once pays one synced commit per batch
//! instead of one per name. An attempt with nothing under way runs its own transaction at once.
//! Each attempt of a batch gets its own answer: one refused with an error writes nothing, an SQL
//! error rolls the batch back and runs each of its attempts alone, and an attempt whose caller
//! went away while its batch ran has its hold and queue place removed again.
//!
//! # Clock
//!
//! Leases are absolute expiry times in milliseconds on a clock that **every process of the
//! machine shares and that wall-clock steps do not move**: on Linux `CLOCK_BOOTTIME` (time since
//! boot, counting suspend), corrected for a process's time namespace. A process whose wall clock
//! is off by minutes or hours (an NTP step, `date -s`, a container or `faketime` with a shifted
//! clock) reads the same expiries as every other process. The file records the boot its
//! expiries count from (`/proc/sys/kernel/random/boot_id`); the first backend that opens it after
//! a reboot drops every hold and queue place (their processes died with the boot). Only
//! `acquired_at_ms`, shown by `dlock list`, is wall-clock time.
//!
//! On other platforms (macOS, the BSDs) the expiries are on the wall clock: a step forward by `d`
//! shortens every running lease by `d` (a lock may then be granted to another process while its
//! holder still trusts it), a step backward lengthens them. Keep the clock slewed (NTP), not
//! stepped, there. Times are whole milliseconds; the core's safety margin (a tenth of the lease)
//! covers the rounding.
//!
//! The key-ordered layout of `dlock_holds` and `dlock_fences` came after version 2 without a new
//! version, like the `value` column below: the columns are the same, so an older dlock of
//! version 2 works on such a file.
//! A backend that opens a file whose two tables still have row ids (and `dlock_holds` its unique
//! owner and index by name) rebuilds them in its migration's transaction, keeping every row.
//!
//! The `value` column came after version 2 without a new version (a nullable column that older
//! dlock processes of version 2 never name, so they keep working on the file): a backend that
//! opens a version 2 file without it adds it (`ALTER TABLE … ADD COLUMN value TEXT`).
//!
//! A file written by schema version 1 (wall-clock expiries) is upgraded when a backend of this
//! version opens it: the expiries are moved to the machine clock (keeping what was left of each
//! lease) and the column is renamed, so a process of an older dlock that still has the file open
//! fails on its next statement (its holds are then lost and its commands stopped) instead of
//! misreading the new expiries.
//!
//! # Wake-ups
//!
//! SQLite has no notification of its own. After every commit that may let a waiter in (release,
//! cancel, force-release) the backend writes one byte to `<db>-wake`, a small file next to the
//! database, and each process watches the database's directory for writes to that file (inotify
//! on Linux, kqueue/FSEvents elsewhere, through the `notify` crate; one watch per file per
//! process, shared by every backend on it). A report sends the waiters straight to an attempt:
//! a refused attempt writes nothing, and the attempts of one backend that meet share write
//! transactions (below), so a report costs each process a transaction or two, however many of its
//! waiters it wakes. A look first (a read-only statement) would add a hand-over to the
//! connection's thread to every hand-off between processes, and the releasing process's next
//! waiter, woken in-process and attempting at once, would win nearly every race for the lock.
//! The byte is written after the commit, so the report never comes before the change is visible (a
//! commit's own `-wal` writes would: they precede its fsync and the WAL index update that publishes
//! it), and other commits (grants, renewals) wake nobody. A release by another process is thus
//! noticed at once (0.6–0.7 ms from the start of the release to the other process's grant, both
//! commits included, on this machine's disk, against up to 50 ms of polling), and
//! [`Capabilities::wakeups`] is [`Wakeups::Native`]. A waiter still re-reads every [`SAFETY_POLL`]
//! (250 ms) in case a change was not reported. If the watch cannot be set up (inotify instances
//! exhausted, a file system without change events) the store says [`Wakeups::Polling`] from
//! [`POLL_MIN`] (5 ms) to [`POLL_MAX`] (50 ms) and polls: a jittered interval that starts between 5
//! and 10 ms and doubles up to between 25 and 50 ms, bounded by
//! `until` and by the blocking lease running out.
//! Waiters in the **same process** do not depend on polling: every backend of the process opened
//! on the same file (by canonical path) shares a per-name notification, and a release, cancel or
//! force-release through any of them wakes the waiters at once.
//!
//! # Durability and settings
//!
//! The file is opened (created if missing) in WAL journal mode with `synchronous=FULL`, so a
//! committed grant — and with it the fencing counter — survives a crash or power loss: tokens never
//! go backwards. A release (and `set_value`, a hold's value) commits on a connection of its own
//! with `synchronous=NORMAL`: it goes to the WAL without waiting for the disk, and the next synced
//! commit (the next grant's) takes it to the disk with it, so a lock costs one disk sync, not two.
//! A release lost in a power cut costs nothing: on Linux the first backend that opens the file
//! after the reboot drops every hold anyway (see *Clock*); elsewhere the hold comes back and ends
//! with its lease, as the hold of a holder that died. A process that dies while its machine runs
//! loses no commit of either kind (it is in the system's page cache), and SQLite's checkpoints
//! sync the WAL and the database in both modes.
//!
//! The busy timeout is [`BUSY_TIMEOUT`] (5 s); a write lock not obtained in that time is
//! [`Error::Unavailable`]. While it waits for a lock another process holds, a
//! connection retries after 200 µs, doubling to at most 2 ms (dlock's own busy handler; SQLite's
//! default sleeps up to 100 ms at a time, so a release or grant that met another process's
//! brief write went through up to 100 ms after the lock was free). Each backend keeps a pool of at
//! most 4 connections, and one more for releases.
//!
//! # What it is for, and what breaks it
//!
//! The processes of **one machine**: cron jobs, services and scripts of one host, containers
//! sharing a local volume of one host. For locks between machines use a store that spans them
//! (`redis://`, `postgres://`, `mysql://`, `zk://`).
//!
//! - **A network file system** (NFS, SMB/CIFS, 9p, Ceph, Lustre, sshfs and other FUSE file
//!   systems that reach other machines): SQLite's file locks and WAL shared memory do not work
//!   across machines, and each machine has its own clock, so two processes (or two machines)
//!   could both be granted the lock. [`SqliteBackend::open`] refuses such a file (found with
//!   `statfs` and, for FUSE, the mount table) with [`Error::InvalidConfig`].
//! - Deleting or replacing the file (or its `-wal`/`-shm` companions) while it is in use: holds are
//!   lost and fencing tokens restart.
//! - On platforms other than Linux, stepping the wall clock (see *Clock*).

mod batch;
mod machine;
mod step;
mod watch;

use crate::backend::sql::common::{
    bind_hold, bind_waiter, extend_answers, extend_groups, grant, listing, name_owner_pairs,
    GrantWrites, HoldListing, Loaded, Renewed, Rows, StateRow, TxError, WaiterListing,
    STATE_REVOKED,
};
use crate::backend::*;
use crate::error::Error;
use machine::now_ms;
use rand::Rng;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::ConnectOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use watch::{file_watch_for, FileWatch};

/// The shortest interval between two polls of a waiter (see the module docs).
pub const POLL_MIN: Duration = Duration::from_millis(5);
/// The longest interval between two polls of a waiter (see the module docs).
pub const POLL_MAX: Duration = Duration::from_millis(50);
/// With the file watch up, a waiter still re-reads the lock this often (a write the watch did not
/// report).
pub const SAFETY_POLL: Duration = Duration::from_millis(250);
/// How long a statement waits for another connection's lock before the store is reported busy.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The schema version this build writes and understands.
const SCHEMA_VERSION: i64 = 2;
/// Marks the `Unavailable` message of a database whose write lock stayed busy (`attempt` turns it
/// into a busy answer).
const BUSY_MARK: &str = "is busy";
/// How often a release (or a `set_value`) is tried when the write lock stays busy for the whole
/// busy timeout.
const RELEASE_TRIES: u32 = 3;
/// Connections per backend.
const MAX_CONNECTIONS: u32 = 4;
/// Connections per backend for releases, which commit without a sync (see the module docs): one,
/// as the database has one writer at a time; concurrent releases of a backend wait for it in
/// order rather than for the write lock in the busy handler's pauses.
const RELEASE_CONNECTIONS: u32 = 1;
/// How long an operation waits for a free pooled connection.
const POOL_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the rows live, for messages about corrupt rows.
const ROWS: Rows = Rows("the dlock sqlite database");

/// The holds' table, stored in the order of its key (name, owner): a grant or a release
/// writes one B-tree, where a table with a row id, a unique owner and an index by name wrote
/// three.
const HOLDS_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_holds (
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        kind TEXT NOT NULL,
        permits INTEGER NOT NULL,
        mode TEXT NOT NULL,
        fence INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL,
        acquired_at_ms INTEGER NOT NULL,
        client_id TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        state INTEGER NOT NULL DEFAULT 0,
        value TEXT,
        PRIMARY KEY (name, owner)
    ) WITHOUT ROWID";
/// The fences' table, stored in the order of its key (one B-tree, not a table and an index).
const FENCES_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_fences (
        name TEXT NOT NULL PRIMARY KEY,
        fence INTEGER NOT NULL
    ) WITHOUT ROWID";
/// Every column of `dlock_holds`, in the order of [`HOLDS_TABLE`].
const HOLDS_COLUMNS: &str = "name, owner, kind, permits, mode, fence, expires_ms, \
                             acquired_at_ms, client_id, host, pid, state, value";

/// The schema, version 2, for a new file.
const SCHEMA: &[&str] = &[
    HOLDS_TABLE,
    "CREATE TABLE IF NOT EXISTS dlock_queue (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        mode TEXT NOT NULL,
        expires_ms INTEGER NOT NULL,
        client_id TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS dlock_queue_name ON dlock_queue (name, seq)",
    FENCES_TABLE,
];

/// From version 1 (wall-clock `expires_at_ms`) to 2: the expiries move to the machine clock
/// (`?1`: the wall clock now, `?2`: the machine clock now), the column is renamed (an older
/// process's statements then fail instead of misreading them), holds get a `state`.
const V1_TO_V2: &[&str] = &[
    "UPDATE dlock_holds SET expires_at_ms = expires_at_ms - ?1 + ?2",
    "UPDATE dlock_queue SET expires_at_ms = expires_at_ms - ?1 + ?2",
    "ALTER TABLE dlock_holds RENAME COLUMN expires_at_ms TO expires_ms",
    "ALTER TABLE dlock_queue RENAME COLUMN expires_at_ms TO expires_ms",
    "ALTER TABLE dlock_holds ADD COLUMN state INTEGER NOT NULL DEFAULT 0",
];

/// The statement that reads the whole state of name `?1` (fence row, holds, queue places, live
/// or expired) as [`StateRow`]s.
macro_rules! state_of_name {
    () => {
        "SELECT 'f' AS part, '' AS owner, '' AS kind, 0 AS permits, '' AS mode, fence AS ord,
                0 AS expires_ms
         FROM dlock_fences WHERE name = ?1
         UNION ALL
         SELECT 'h', CASE WHEN state = 2 THEN '' ELSE owner END, kind, permits, mode, fence,
                expires_ms
         FROM dlock_holds WHERE name = ?1
         UNION ALL
         SELECT 'q', owner, '', 0, mode, seq, expires_ms
         FROM dlock_queue WHERE name = ?1
         ORDER BY part, ord"
    };
}
use state_of_name;

/// The whole state of `name` (fence row, holds, queue places, live or expired) in one statement.
async fn load_state(
    conn: &mut sqlx::SqliteConnection,
    name: &str,
    now: i64,
) -> std::result::Result<Result<Loaded>, sqlx::Error> {
    let rows: Vec<StateRow> = sqlx::query_as(state_of_name!())
        .bind(name)
        .fetch_all(&mut *conn)
        .await?;
    Ok(Loaded::split(ROWS, rows, now))
}

/// The embedded SQLite store. Obtain it with `dlock::connect("sqlite:///path/to/locks.db")`, or
/// [`SqliteBackend::open`] and [`crate::Client::with_backend`]. See the module docs for the
/// layout, the clock and what it needs from the filesystem.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    pool: SqlitePool,
    /// A connection with `synchronous=NORMAL`, for the owner writes whose loss in a power cut
    /// costs nothing (a release, a hold's value): see the module docs.
    releases: SqlitePool,
    /// The path as given, for messages.
    path: Arc<Path>,
    /// The canonical path: the store's name for the core's in-process wake-ups.
    key: Arc<Path>,
    /// Commits by other processes (a watch on the database's files), when it could be set up.
    watch: Arc<FileWatch>,
    /// Attempts waiting for the next write transaction (group commit, `batch.rs`).
    batch: Arc<batch::Queue>,
    /// Read-only looks of waiters (tests count them).
    #[cfg(test)]
    looks: Arc<std::sync::atomic::AtomicUsize>,
    /// Batches of queued attempts run (tests count them).
    #[cfg(test)]
    batches: Arc<std::sync::atomic::AtomicUsize>,
}

impl SqliteBackend {
    /// The file of a `sqlite:///abs/path.db` or `sqlite:rel/path.db` URL.
    pub(crate) fn parse_url(raw: &str) -> Result<PathBuf> {
        let u = crate::url::parse_plain(raw, "sqlite")?;
        let not_utf8 = || Error::InvalidConfig("sqlite path is not UTF-8".into());
        if !u.cannot_be_a_base() {
            match u.host_str() {
                None | Some("") | Some("localhost") => {}
                Some(h) => {
                    return Err(Error::InvalidConfig(format!(
                        "sqlite URL has a host ({}); write sqlite:///absolute/path.db or sqlite:relative/path.db",
                        crate::url::clip(h)
                    )))
                }
            }
        }
        let path = PathBuf::from(crate::url::percent_decode(u.path()).ok_or_else(not_utf8)?);
        if path.as_os_str().is_empty() || path == Path::new("/") {
            return Err(Error::InvalidConfig(
                "sqlite URL has no file path (example: sqlite:///var/lib/dlock/locks.db)".into(),
            ));
        }
        Ok(path)
    }

    /// Opens the database file of a `sqlite:` URL (see [`SqliteBackend::open`]).
    pub async fn connect(url: &str) -> Result<SqliteBackend> {
        Self::open(&Self::parse_url(url)?).await
    }

    /// Opens (creating if missing) the database file at `path` and brings its schema up to date.
    ///
    /// Errors (each naming the path): [`Error::Backend`] if the directory does not exist, the
    /// path is a directory, the file is not a SQLite database or was written by a newer dlock,
    /// or it cannot be opened or written (permissions): permanent, so a waiting acquisition does
    /// not try again; [`Error::Unavailable`] for an I/O error or a file that stays busy longer
    /// than [`BUSY_TIMEOUT`]. A URL that names no file at all is [`Error::InvalidConfig`].
    pub async fn open(path: &Path) -> Result<SqliteBackend> {
        let shown = path.display();
        if path.as_os_str().is_empty() {
            return Err(Error::InvalidConfig("sqlite database path is empty".into()));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.is_dir() {
                return Err(Error::backend(format!(
                    "cannot open sqlite database {shown}: directory {} does not exist",
                    dir.display()
                )));
            }
        }
        if path.is_dir() {
            return Err(Error::backend(format!(
                "cannot open sqlite database {shown}: it is a directory"
            )));
        }
        machine::check_local(path)?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(false)
            .disable_statement_logging();
        // Switching a new file to WAL needs an exclusive lock, and SQLite answers SQLITE_BUSY at
        // once (without its busy handler) when another process is doing the same: retry that
        // for up to the busy timeout.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        let mut backoff = Duration::from_millis(2);
        let pool = loop {
            let attempt = pool_options(MAX_CONNECTIONS, 0)
                .connect_with(options.clone())
                .await;
            match attempt {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && Instant::now() + backoff < deadline => {
                    let pause = backoff.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
                    tokio::time::sleep(pause).await;
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
                Err(e) => return Err(map_err(path, e)),
            }
        };
        // Opened now and kept open, not at the first release: a process short of memory or
        // file descriptors fails here, holding nothing, rather than when it must release.
        let releases = pool_options(RELEASE_CONNECTIONS, RELEASE_CONNECTIONS)
            .connect_with(options.synchronous(SqliteSynchronous::Normal))
            .await;
        let releases = match releases {
            Ok(p) => p,
            Err(e) => {
                pool.close().await;
                return Err(match sqlite_code(&e) {
                    // The same file opened a moment ago on the other pool: what this one lacks
                    // is a descriptor (the check of `map_err` may find a few free once this
                    // connection's have been closed again).
                    Some(14) => Error::Unavailable(format!(
                        "cannot open sqlite database {shown}: this process is most likely at \
                         its open-file limit (see ulimit -n; SQLite said: {e})"
                    )),
                    _ => map_err(path, e),
                });
            }
        };
        let key = std::fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .unwrap_or_else(|_| path.to_path_buf());
        let backend = SqliteBackend {
            pool,
            releases,
            path: path.into(),
            watch: file_watch_for(&key),
            key: key.into(),
            batch: batch::queue(),
            #[cfg(test)]
            looks: Default::default(),
            #[cfg(test)]
            batches: Default::default(),
        };
        if let Err(e) = backend.migrate().await {
            backend.pool.close().await;
            backend.releases.close().await;
            return Err(e);
        }
        Ok(backend)
    }

    fn err(&self, e: sqlx::Error) -> Error {
        map_err(&self.path, e)
    }

    /// A write transaction that holds the database's write lock from its start (`BEGIN
    /// IMMEDIATE`): two processes can never both read "free" and both write.
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err(e))
    }

    /// Creates or upgrades the schema and drops expired rows of every name, in one transaction.
    async fn migrate(&self) -> Result<()> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS dlock_meta (
                key TEXT NOT NULL PRIMARY KEY,
                value INTEGER NOT NULL
            )",
        )
        .execute(&mut *tx)
        .await
        .map_err(|e| self.err(e))?;
        let version: Option<(i64,)> =
            sqlx::query_as("SELECT value FROM dlock_meta WHERE key = 'schema_version'")
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| match sqlite_code(&e) {
                    // SQLITE_ERROR: a `dlock_meta` table of another shape
                    Some(1) => Error::backend(format!(
                        "sqlite database {} has a dlock_meta table this dlock does not \
                         understand ({e}); use another file",
                        self.path.display()
                    )),
                    _ => self.err(e),
                })?;
        match version {
            None => {
                for stmt in SCHEMA {
                    sqlx::query(stmt)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| self.err(e))?;
                }
                sqlx::query("INSERT INTO dlock_meta (key, value) VALUES ('schema_version', ?)")
                    .bind(SCHEMA_VERSION)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            Some((1,)) => {
                for stmt in V1_TO_V2 {
                    let q = sqlx::query(stmt);
                    let q = if stmt.contains("?1") {
                        q.bind(machine::wall_ms()).bind(now_ms())
                    } else {
                        q
                    };
                    q.execute(&mut *tx).await.map_err(|e| self.err(e))?;
                }
                sqlx::query("UPDATE dlock_meta SET value = ? WHERE key = 'schema_version'")
                    .bind(SCHEMA_VERSION)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
                // Counted from this boot now.
                sqlx::query("INSERT OR REPLACE INTO dlock_meta (key, value) VALUES ('boot_id', ?)")
                    .bind(machine::boot_id()?)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            Some((v,)) if v == SCHEMA_VERSION => {}
            Some((v,)) => {
                return Err(Error::backend(format!(
                    "sqlite database {} has dlock schema version {v}; this dlock understands \
                     version {SCHEMA_VERSION} (upgrade dlock or use another file)",
                    self.path.display()
                )));
            }
        }
        // Files of version 2 made before holds had values: add the (nullable) column.
        let (has_value,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM pragma_table_info('dlock_holds') WHERE name = 'value'",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| self.err(e))?;
        if has_value == 0 {
            sqlx::query("ALTER TABLE dlock_holds ADD COLUMN value TEXT")
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
        }
        self.cluster_tables(&mut tx).await?;
        // Expiries count from one boot: after a reboot every hold and queue place belongs to a
        // process that is gone.
        let boot = machine::boot_id()?;
        let recorded: Option<(String,)> =
            sqlx::query_as("SELECT CAST(value AS TEXT) FROM dlock_meta WHERE key = 'boot_id'")
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
        if recorded.as_ref().map(|(b,)| b.as_str()) != Some(boot.as_str()) {
            if recorded.is_some() {
                tracing::info!(path = %self.path.display(), "the machine rebooted since the lock file was last used: its holds are dropped");
            }
            for stmt in ["DELETE FROM dlock_holds", "DELETE FROM dlock_queue"] {
                sqlx::query(stmt)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            sqlx::query("INSERT OR REPLACE INTO dlock_meta (key, value) VALUES ('boot_id', ?)")
                .bind(&boot)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
        }
        let now = now_ms();
        for stmt in [
            "DELETE FROM dlock_holds WHERE expires_ms <= ?",
            "DELETE FROM dlock_queue WHERE expires_ms <= ?",
        ] {
            sqlx::query(stmt)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    /// Rebuilds `dlock_holds` and `dlock_fences` of a file made before they were stored in the
    /// order of their keys ([`HOLDS_TABLE`], [`FENCES_TABLE`]), keeping every row, in the
    /// migration's transaction (the old table's index by name goes with it). The columns are
    /// the same, so a process of an older dlock that has the file open goes on working on it,
    /// and one that opens it later too (its migration creates tables only in a new file).
    async fn cluster_tables(&self, tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>) -> Result<()> {
        for (table, create, columns) in [
            ("dlock_holds", HOLDS_TABLE, HOLDS_COLUMNS),
            ("dlock_fences", FENCES_TABLE, "name, fence"),
        ] {
            let (clustered,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM sqlite_master
                 WHERE type = 'table' AND name = ? AND sql LIKE '%WITHOUT ROWID'",
            )
            .bind(table)
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| self.err(e))?;
            if clustered == 1 {
                continue;
            }
            let new = format!("{table}_clustered");
            for stmt in [
                format!("DROP TABLE IF EXISTS {new}"),
                // The same statement for the new table's name (its first word after `EXISTS`).
                create.replacen(table, &new, 1),
                format!("INSERT INTO {new} ({columns}) SELECT {columns} FROM {table}"),
                format!("DROP TABLE {table}"),
                format!("ALTER TABLE {new} RENAME TO {table}"),
            ] {
                sqlx::query(&stmt)
                    .execute(&mut **tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }

    /// Whether `req` would still be refused now (read-only; the acquisition's look). One
    /// statement, autocommitted: it reads one snapshot of the name (WAL), without a transaction
    /// around it that would cost two more hand-overs to the connection's thread.
    async fn still_busy(&self, req: &Request<'_>) -> Result<Look> {
        #[cfg(test)]
        self.looks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let now = now_ms();
        let loaded = load_state(&mut conn, req.name.as_str(), now)
            .await
            .map_err(|e| self.err(e))??;
        Ok(loaded.state.look(req, now))
    }

    /// Removes `req`'s queue place, if any (waking the other processes' waiters).
    async fn cancel_place(&self, req: &Request<'_>) -> Result<()> {
        self.remove_owner(req.name.as_str(), req.owner, false).await
    }

    /// Removes `owner`'s queue place of `name` and, with `hold`, its hold (each one
    /// autocommitted statement), waking the other processes' waiters when a row went.
    async fn remove_owner(&self, name: &str, owner: &str, hold: bool) -> Result<()> {
        let tables: &[&str] = if hold {
            &[
                "DELETE FROM dlock_queue WHERE name = ? AND owner = ?",
                "DELETE FROM dlock_holds WHERE name = ? AND owner = ?",
            ]
        } else {
            &["DELETE FROM dlock_queue WHERE name = ? AND owner = ?"]
        };
        let mut removed = 0;
        for sql in tables {
            removed += sqlx::query(sql)
                .bind(name)
                .bind(owner)
                .execute(&self.pool)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
        }
        if removed > 0 {
            self.watch.poke();
        }
        Ok(())
    }

    /// `r` (an attempt's answer), with a write lock that stayed taken under a herd answered as
    /// busy.
    fn busy_answer(r: Result<Attempt>) -> Result<Attempt> {
        match r {
            // The database's write lock stayed taken for the whole busy timeout: under a herd of
            // processes that is contention for the lock, not an unreachable store. Answer "busy"
            // so a waiter keeps waiting (and `try_acquire` reports Busy) instead of failing.
            Err(Error::Unavailable(why)) if why.contains(BUSY_MARK) => {
                let retry = Duration::from_millis(rand::thread_rng().gen_range(5..=50));
                tracing::debug!(%why, "sqlite write lock contended; answering busy");
                Ok(Attempt::Busy(Busy {
                    retry_in: Some(retry),
                }))
            }
            other => other,
        }
    }

    /// `req`'s attempt in a write transaction of its own.
    async fn acquire_alone(&self, req: &Request<'_>) -> Result<Attempt> {
        if step::fits(req) {
            if let Some(attempt) = self.attempt_in_one_step(req).await? {
                return Ok(attempt);
            }
        }
        let mut tx = self.begin_write().await?;
        // Read the clock only once the write lock is ours.
        let now = now_ms();
        let attempt = match self.grant_in(&mut tx, req, now).await {
            Ok(attempt) => attempt,
            Err(TxError::Sql(e)) => return Err(self.err(e)),
            Err(TxError::Dlock(e)) => return Err(e),
        };
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(attempt)
    }

    /// Decides `req` at `now` inside `tx` (which holds the write lock) and writes the decision.
    /// A [`TxError::Dlock`] comes before any write of `req` but the removal of its name's
    /// expired rows.
    async fn grant_in(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        req: &Request<'_>,
        now: i64,
    ) -> std::result::Result<Attempt, TxError> {
        let name = req.name.as_str();
        let Loaded {
            state,
            fence: stored,
            expired,
        } = load_state(tx, name, now).await??;
        if expired {
            for stmt in [
                "DELETE FROM dlock_holds WHERE name = ? AND expires_ms <= ?",
                "DELETE FROM dlock_queue WHERE name = ? AND expires_ms <= ?",
            ] {
                sqlx::query(stmt)
                    .bind(name)
                    .bind(now)
                    .execute(&mut **tx)
                    .await?;
            }
        }
        let stored = match stored {
            Some(f) => Some(ROWS.token(f)?),
            None => None,
        };
        let (attempt, _) = grant(&mut SqliteWrites(tx), &state, req, stored, now).await?;
        Ok(attempt)
    }
}

impl SqliteBackend {
    /// An owner's one-statement write (a release, a value), unsynced (see the module docs),
    /// retried while SQLite is busy (up to [`RELEASE_TRIES`] times); the watchers are woken when
    /// it changed a row.
    async fn owner_write<'q>(
        &self,
        statement: impl Fn() -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<Released> {
        let mut tries = 0;
        let changed = loop {
            tries += 1;
            // A repeat goes through the synced pool, as does a first try whose release
            // connection could not open (no file descriptor, thread or memory left).
            let own = match tries {
                1 => self.releases.acquire().await.ok(),
                _ => None,
            };
            let on_own = own.is_some();
            let done = match own {
                Some(mut conn) => statement().execute(&mut *conn).await,
                None => statement().execute(&self.pool).await,
            };
            match done {
                Ok(done) => break done.rows_affected(),
                // The statement failed on the release connection (a new connection short of
                // memory, say): nothing was written, and a synced connection tries it again.
                Err(e) if on_own => {
                    tracing::debug!(error = %e, "sqlite: the release connection failed; using a synced one");
                }
                Err(e) if is_busy(&e) && tries < RELEASE_TRIES => continue,
                // A new connection the pool could not open (out of file descriptors): the
                // connection the previous statement used is on its way back to the pool, and
                // the next try takes it.
                Err(e) if sqlite_code(&e) == Some(14) && tries < RELEASE_TRIES => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(self.err(e)),
            }
        };
        if changed > 0 {
            self.watch.poke();
            Ok(Released::Released)
        } else {
            Ok(Released::NotHeld)
        }
    }

    /// Extends `holds` in one write transaction, one `UPDATE` per group of at most 500 holds of
    /// one lease; `detach` marks them as renewed by nobody any more (see [`Backend::detach`]).
    async fn extend_holds(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        let now = now_ms();
        let mut found = vec![Renewed::Gone; holds.len()];
        let set_state = if detach { ", state = 1" } else { "" };
        for (lease_ms, idx) in extend_groups(holds) {
            let pairs = name_owner_pairs(idx.len());
            let update = format!(
                "UPDATE dlock_holds SET expires_ms = ?{set_state} \
                 WHERE expires_ms > ? AND state <> 2 AND (name, owner) IN (VALUES {pairs})"
            );
            let mut q = sqlx::query(&update)
                .persistent(false)
                .bind(now.saturating_add(lease_ms))
                .bind(now);
            for &i in &idx {
                q = q.bind(holds[i].name.as_str()).bind(holds[i].owner);
            }
            let changed = q
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
            if changed >= idx.len() as u64 {
                idx.iter().for_each(|&i| found[i] = Renewed::Live);
                continue;
            }
            // Some are gone or revoked: the live ones are those the update just pushed out.
            let select = format!(
                "SELECT name, owner, state FROM dlock_holds \
                 WHERE expires_ms > ? AND (name, owner) IN (VALUES {pairs})"
            );
            let mut q = sqlx::query_as::<_, (String, String, i64)>(&select)
                .persistent(false)
                .bind(now);
            for &i in &idx {
                q = q.bind(holds[i].name.as_str()).bind(holds[i].owner);
            }
            let rows: std::collections::HashMap<(String, String), i64> = q
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.err(e))?
                .into_iter()
                .map(|(n, o, st)| ((n, o), st))
                .collect();
            for &i in &idx {
                let key = (holds[i].name.as_str().to_owned(), holds[i].owner.to_owned());
                found[i] = match rows.get(&key) {
                    Some(&STATE_REVOKED) => Renewed::Revoked,
                    Some(_) => Renewed::Live,
                    None => Renewed::Gone,
                };
            }
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(extend_answers(holds, &found))
    }
}

/// The primary SQLite result code of a database error.
fn sqlite_code(e: &sqlx::Error) -> Option<i32> {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .map(|c| c & 0xff),
        _ => None,
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED.
/// The pause before the `n`-th retry (from 0) of a lock that another connection holds: 200 µs,
/// doubling to at most 2 ms. SQLite's own handler (what `busy_timeout` installs) sleeps 1, 2, 5,
/// 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms: a release or grant that met another
/// process's brief write transaction (a waiter's look-and-refuse takes ~50 µs) went through
/// up to 100 ms after the lock was free. (Shorter first pauses cost the connection that holds
/// the lock: 25 µs slowed 64 concurrent grants of one client by 20 %.)
fn busy_pause(n: u32) -> Duration {
    Duration::from_micros(200u64 << n.min(16)).min(Duration::from_millis(2))
}

/// The time the first `n` retries have slept (lower bound: a sleep lasts at least its pause).
fn busy_waited(n: u32) -> Duration {
    let growing: Duration = (0..n.min(16)).map(busy_pause).sum();
    growing + busy_pause(16) * n.saturating_sub(16)
}

/// SQLite's busy handler for every connection: called (on the connection's own worker thread)
/// when a lock it needs is held by another connection, with the number of times it was called
/// for this lock; returns 1 to retry after a short sleep, 0 to give up (`SQLITE_BUSY`) after
/// [`BUSY_TIMEOUT`].
extern "C" fn busy_handler(_: *mut std::ffi::c_void, n: std::ffi::c_int) -> std::ffi::c_int {
    let n = u32::try_from(n).unwrap_or(0);
    if busy_waited(n) >= BUSY_TIMEOUT {
        return 0;
    }
    std::thread::sleep(busy_pause(n));
    1
}

/// Whether a connection going back to the pool may serve again. A transaction that failed with
/// SQLITE_FULL or SQLITE_IOERR may have been rolled back by SQLite itself; sqlx's rollback then
/// fails and its count of open transactions stays at one, so every later `BEGIN` on the
/// connection would fail ("non-zero transaction depth") for good: such a connection is closed
/// (the pool opens a new one). A connection still counted in a transaction is first flushed
/// (the rollback of a dropped transaction is queued on its thread); committed ones cost nothing.
async fn still_usable(conn: &mut sqlx::SqliteConnection) -> std::result::Result<bool, sqlx::Error> {
    use sqlx::Connection;
    if !conn.is_in_transaction() {
        return Ok(true);
    }
    conn.ping().await?;
    Ok(!conn.is_in_transaction())
}

/// A pool of `max` connections (at least `min` kept open), each with dlock's busy handler and
/// checked as it comes back ([`still_usable`]).
fn pool_options(max: u32, min: u32) -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .after_connect(|conn, _| Box::pin(set_busy_handler(conn)))
        .after_release(|conn, _| Box::pin(still_usable(conn)))
        .max_connections(max)
        .min_connections(min)
        .acquire_timeout(POOL_ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
}

/// Installs [`busy_handler`] on a new connection (replacing the `busy_timeout` handler, which
/// covered the connection's opening).
async fn set_busy_handler(
    conn: &mut sqlx::SqliteConnection,
) -> std::result::Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle();
    // SAFETY: `db` is this connection's open handle, locked for the call; the handler is a plain
    // function without state (a null argument), valid for the life of the program.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_busy_handler(db.as_ptr(), Some(busy_handler), std::ptr::null_mut())
    };
    if rc == libsqlite3_sys::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "sqlite3_busy_handler failed with code {rc}"
        )))
    }
}

fn is_busy(e: &sqlx::Error) -> bool {
    matches!(sqlite_code(e), Some(5 | 6))
}

/// The error of opening a descriptor now, if this process cannot open the few that SQLite needs
/// for a database (the file, its WAL and its shared-memory index) for want of descriptors
/// (EMFILE, or ENFILE for the whole system).
fn short_of_descriptors() -> Option<std::io::Error> {
    let mut held = Vec::with_capacity(3);
    for _ in 0..3 {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) if matches!(e.raw_os_error(), Some(23 | 24)) => return Some(e),
            Err(_) => return None,
        }
    }
    None
}

/// Maps a sqlx error to a dlock error naming the file.
fn map_err(path: &Path, e: sqlx::Error) -> Error {
    let shown = path.display();
    match &e {
        sqlx::Error::Database(db) => {
            match sqlite_code(&e).unwrap_or(-1) {
                // SQLITE_BUSY, SQLITE_LOCKED
                5 | 6 => Error::Unavailable(format!(
                    "sqlite database {shown} {BUSY_MARK}: another connection holds its lock \
                     ({db}; busy timeout {BUSY_TIMEOUT:?})"
                )),
                // SQLITE_CANTOPEN. With no descriptor to spare (SQLite's message does not name
                // EMFILE) it passes when one is closed; otherwise it is permanent until someone
                // changes the file or its directory: not tried again by a waiter.
                14 => match short_of_descriptors() {
                    Some(io) => Error::Unavailable(format!(
                        "cannot open sqlite database {shown}: this process is at its open-file \
                         limit ({io}; see ulimit -n; SQLite said: {db})"
                    )),
                    None => Error::backend(format!(
                        "cannot open sqlite database {shown}: {db} (check that its directory \
                         exists and that this user may read and write the file and its \
                         directory)"
                    )),
                },
                // SQLITE_NOTADB
                26 => Error::backend(format!(
                    "{shown} is not a SQLite database ({db}); point the store URL at a dlock \
                     database file or a path that does not exist yet"
                )),
                // SQLITE_PERM, SQLITE_READONLY, SQLITE_AUTH
                3 | 8 | 23 => Error::backend(format!(
                    "sqlite database {shown} cannot be written: {db} (permission denied or \
                     read-only filesystem; the file and its directory must be writable)"
                )),
                // SQLITE_CORRUPT
                11 => Error::backend(format!("sqlite database {shown} is corrupt: {db}")),
                // SQLITE_NOMEM: this process is short of memory, perhaps for a moment.
                7 => Error::Unavailable(format!(
                    "sqlite database {shown}: this process is out of memory ({db})"
                )),
                // SQLITE_IOERR, SQLITE_FULL, SQLITE_PROTOCOL
                10 | 13 | 15 => {
                    Error::Unavailable(format!("I/O error on sqlite database {shown}: {db}"))
                }
                _ => Error::backend(e),
            }
        }
        sqlx::Error::PoolTimedOut => Error::Unavailable(format!(
            "sqlite database {shown} {BUSY_MARK}: no connection became free within \
             {POOL_ACQUIRE_TIMEOUT:?}"
        )),
        // sqlx runs each connection on a thread of its own: EAGAIN or ENOMEM here is a thread
        // that could not start.
        sqlx::Error::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::OutOfMemory
            ) =>
        {
            Error::Unavailable(format!(
                "sqlite database {shown}: cannot start a connection's thread ({io}; out of memory \
                 or at the process's thread limit)"
            ))
        }
        sqlx::Error::Io(io) => {
            Error::Unavailable(format!("I/O error on sqlite database {shown}: {io}"))
        }
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            Error::Unavailable(format!("sqlite database {shown} is closed: {e}"))
        }
        _ => Error::backend(e),
    }
}

#[async_trait::async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            values: true,
            ..Capabilities::lease(if self.watch.is_up() {
                Wakeups::Native
            } else {
                Wakeups::Polling {
                    min: POLL_MIN,
                    max: POLL_MAX,
                }
            })
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        Box::new(SqliteAcquisition {
            store: self.clone(),
            want: Want::new(req),
            watch: None,
        })
    }

    fn shared_key(&self) -> Option<String> {
        Some(format!("sqlite:{}", self.key.display()))
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        let name = hold.name.as_str();
        // A release that loses to a herd of writers for the whole busy timeout is tried again
        // (up to RELEASE_TRIES times): a release that gives up leaves the lock held until its
        // lease ends, which stalls every waiter.
        self.owner_write(|| {
            sqlx::query("DELETE FROM dlock_holds WHERE name = ? AND owner = ? AND expires_ms > ?")
                .bind(name)
                .bind(hold.owner)
                .bind(now_ms())
        })
        .await
    }

    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        self.extend_holds(holds, detach).await
    }

    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        // One statement: the owner's live, unrevoked hold or nothing.
        self.owner_write(|| {
            sqlx::query(
                "UPDATE dlock_holds SET value = ?
                 WHERE name = ? AND owner = ? AND expires_ms > ? AND state <> 2",
            )
            .bind(value)
            .bind(hold.name.as_str())
            .bind(hold.owner)
            .bind(now_ms())
        })
        .await
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        let now = now_ms();
        // `substr`/`length` rather than LIKE: the prefix may contain `%` and `_`.
        let holds: Vec<HoldListing> = sqlx::query_as(
            "SELECT name, owner, kind, permits, mode, fence, expires_ms, acquired_at_ms,
                        client_id, host, pid, state, value
                 FROM dlock_holds
                 WHERE expires_ms > ? AND substr(name, 1, length(?)) = ?
                 ORDER BY name, fence",
        )
        .bind(now)
        .bind(prefix)
        .bind(prefix)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.err(e))?;
        let queue: Vec<WaiterListing> = sqlx::query_as(
            "SELECT name, owner, mode, client_id, host, pid
             FROM dlock_queue
             WHERE expires_ms > ? AND substr(name, 1, length(?)) = ?
             ORDER BY name, seq",
        )
        .bind(now)
        .bind(prefix)
        .bind(prefix)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.err(e))?;
        tx.commit().await.map_err(|e| self.err(e))?;
        listing(ROWS, prefix, now, holds, queue)
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let name = name.as_str();
        let mut tx = self.begin_write().await?;
        let now = now_ms();
        let run = |sql: &'static str| sqlx::query(sql).bind(name).bind(now);
        let removed = match how {
            Force::Break => run("DELETE FROM dlock_holds WHERE name = ? AND expires_ms > ?"),
            Force::Revoke => {
                run("DELETE FROM dlock_holds WHERE name = ? AND expires_ms > ? AND state = 1")
            }
        }
        .execute(&mut *tx)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected();
        for sql in [
            "DELETE FROM dlock_holds WHERE name = ? AND expires_ms <= ?",
            "UPDATE dlock_holds SET state = 2 WHERE name = ? AND expires_ms > ?",
        ] {
            run(sql).execute(&mut *tx).await.map_err(|e| self.err(e))?;
        }
        let (revoked, longest): (i64, Option<i64>) = sqlx::query_as(
            "SELECT COUNT(*), MAX(expires_ms) FROM dlock_holds WHERE name = ? AND state = 2",
        )
        .bind(name)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| self.err(e))?;
        // Breaking also drops every queue place (revoked holders' waiters keep theirs); the
        // fence row stays.
        if how == Force::Break {
            sqlx::query("DELETE FROM dlock_queue WHERE name = ?")
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        self.watch.poke();
        Ok(Forced {
            removed,
            revoked: u64::try_from(revoked).unwrap_or(0),
            revoked_lease_left_ms: longest.map(|e| u64::try_from(e - now).unwrap_or(0)),
        })
    }
}

/// The grant transaction's writes in SQLite's statements.
struct SqliteWrites<'a>(&'a mut sqlx::Transaction<'static, sqlx::Sqlite>);

type SqlResult = std::result::Result<(), sqlx::Error>;

#[async_trait::async_trait]
impl GrantWrites for SqliteWrites<'_> {
    async fn regrant(&mut self, name: &str, owner: &str, expires_ms: i64) -> SqlResult {
        let q = sqlx::query("UPDATE dlock_holds SET expires_ms = ? WHERE owner = ? AND name = ?");
        let q = q.bind(expires_ms).bind(owner).bind(name);
        q.execute(&mut **self.0).await.map(drop)
    }

    async fn set_fence(&mut self, name: &str, fence: i64, stored: bool) -> SqlResult {
        let sql = if stored {
            "UPDATE dlock_fences SET fence = ?1 WHERE name = ?2"
        } else {
            "INSERT INTO dlock_fences (fence, name) VALUES (?1, ?2)"
        };
        let q = sqlx::query(sql).bind(fence).bind(name);
        q.execute(&mut **self.0).await.map(drop)
    }

    async fn drop_place(&mut self, name: &str, owner: &str) -> SqlResult {
        let q = sqlx::query("DELETE FROM dlock_queue WHERE name = ? AND owner = ?");
        q.bind(name)
            .bind(owner)
            .execute(&mut **self.0)
            .await
            .map(drop)
    }

    async fn insert_hold(&mut self, req: &Request<'_>, fence: i64, now: i64) -> SqlResult {
        let insert = sqlx::query(
            "INSERT INTO dlock_holds (name, owner, kind, permits, mode, fence,
                 expires_ms, acquired_at_ms, client_id, host, pid, value)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        );
        let q = bind_hold(insert, req, fence, now, machine::wall_ms());
        q.execute(&mut **self.0).await.map(drop)
    }

    async fn refresh_place(&mut self, name: &str, owner: &str, expires_ms: i64) -> SqlResult {
        let q = sqlx::query("UPDATE dlock_queue SET expires_ms = ? WHERE name = ? AND owner = ?");
        let q = q.bind(expires_ms).bind(name).bind(owner);
        q.execute(&mut **self.0).await.map(drop)
    }

    async fn insert_place(&mut self, req: &Request<'_>, expires_ms: i64) -> SqlResult {
        let insert = sqlx::query(
            "INSERT INTO dlock_queue (name, owner, mode, expires_ms, client_id, host, pid)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        );
        let q = bind_waiter(insert, req, expires_ms);
        q.execute(&mut **self.0).await.map(drop)
    }
}

/// One acquisition on the SQLite file: the file watch as it was when its last attempt was sent.
struct SqliteAcquisition {
    store: SqliteBackend,
    want: Want,
    watch: Option<tokio::sync::watch::Receiver<bool>>,
}

#[async_trait::async_trait]
impl Acquisition for SqliteAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        if self.want.waiting {
            self.mark();
        }
        self.store.attempt_grouped(&self.want.req()).await
    }

    fn mark(&mut self) -> bool {
        self.watch = Some(self.store.watch.subscribe());
        true
    }

    async fn changed(&mut self, _busy: &Busy, until: Instant) -> Result<Watch> {
        let poll = Watch::Poll {
            min: POLL_MIN,
            max: POLL_MAX,
        };
        let Some(watch) = self.watch.as_mut().filter(|_| self.store.watch.is_up()) else {
            return Ok(poll);
        };
        // A commit since the attempt was sent counts; the safety look catches one the watch
        // did not report.
        let mut reported = watch.has_changed().unwrap_or(true);
        if !reported {
            let safety = until.min(Instant::now() + SAFETY_POLL);
            reported = tokio::select! {
                r = watch.changed() => r.is_ok(),
                _ = tokio::time::sleep_until(safety.into()) => false,
            };
        }
        watch.borrow_and_update();
        // A report is a release, a cancel or a force-release, of this name or another: the
        // waiter attempts at once (a refusal writes nothing, and this backend's attempts under
        // way share one transaction). A look first would cost a second hand-over to the
        // connection's thread on the hand-off's path, and the processes' heads would then
        // race the releasing process's next waiter, which attempts without one, and lose.
        Ok(if reported {
            Watch::Changed
        } else {
            Watch::Recheck
        })
    }

    async fn look(&mut self) -> Result<Option<Look>> {
        self.store.still_busy(&self.want.req()).await.map(Some)
    }

    async fn cancel(&mut self) -> Result<()> {
        self.store.cancel_place(&self.want.req()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_support::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    async fn open(path: &Path) -> SqliteBackend {
        SqliteBackend::open(path).await.unwrap()
    }

    /// Makes every insert of a hold `when` (an SQL condition on `NEW`) fail with `why`, as a
    /// statement failing inside a grant transaction.
    pub(super) async fn refuse_holds(b: &SqliteBackend, when: &str, why: &str) {
        sqlx::query(&format!(
            "CREATE TRIGGER refuse BEFORE INSERT ON dlock_holds WHEN {when}
             BEGIN SELECT RAISE(ABORT, '{why}'); END"
        ))
        .execute(&b.pool)
        .await
        .unwrap();
    }

    /// The hold rows of the file, live or expired.
    async fn hold_rows(b: &SqliteBackend) -> i64 {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM dlock_holds")
            .fetch_one(&b.pool)
            .await
            .unwrap();
        n
    }

    async fn stored_fence(b: &SqliteBackend, n: &str) -> i64 {
        let (f,): (i64,) = sqlx::query_as("SELECT fence FROM dlock_fences WHERE name = ?")
            .bind(n)
            .fetch_one(&b.pool)
            .await
            .unwrap();
        f
    }

    /// The store's poll interval (the shared one with this store's bounds).
    fn poll_interval(step: u32) -> Duration {
        crate::core::wait::poll_interval(step, POLL_MIN, POLL_MAX)
    }

    #[test]
    fn futures_are_send() {
        fn assert_send<T: Send>(_: &T) {}
        let open = SqliteBackend::open(Path::new("/nonexistent/x.db"));
        assert_send(&open);
        assert_eq!(POLL_MIN, Duration::from_millis(5));
        for step in 0..10 {
            let d = poll_interval(step);
            assert!(d >= POLL_MIN && d <= POLL_MAX, "{step}: {d:?}");
        }
        assert!(poll_interval(0) <= Duration::from_millis(10));
        assert!(poll_interval(9) >= POLL_MAX / 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn two_backends_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let a = open(&path).await;
        let b = open(&path).await;
        assert_eq!(a.name(), "sqlite");
        let n = name("jobs/one");
        let (ma, mb) = (meta("A"), meta("B"));
        let ra = rq(&n, "owner-a", &ma);
        let rb = rq(&n, "owner-b", &mb);
        let t1 = token(a.acquire(&ra).await.unwrap());
        assert_eq!(t1, 1);
        let bz = busy(b.acquire(&rb).await.unwrap());
        let retry = bz.retry_in.unwrap();
        assert!(
            retry <= LONG && retry > LONG - Duration::from_secs(5),
            "{retry:?}"
        );
        // idempotent re-grant with the same token, from either backend object
        assert_eq!(token(a.acquire(&ra).await.unwrap()), t1);
        assert_eq!(token(b.acquire(&ra).await.unwrap()), t1);
        // b cannot release a's hold
        assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::NotHeld);
        let info = b.describe("").await.unwrap();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].holders.len(), 1);
        assert_eq!(info[0].holders[0].owner, "owner-a");
        assert_eq!(info[0].holders[0].meta, ma);
        assert_eq!(info[0].holders[0].token, Some(1));
        assert_eq!(info[0].kind, LockKind::Mutex);
        assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::Released);
        assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::NotHeld);
        assert_eq!(token(b.acquire(&rb).await.unwrap()), 2);
        let info = a.describe("jobs/").await.unwrap();
        assert_eq!(info[0].holders[0].owner, "owner-b");
        let left = info[0].holders[0].lease_left_ms.unwrap();
        assert!(left <= 30_000 && left > 25_000, "{left}");
        assert!(busy(a.acquire(&ra).await.unwrap()).retry_in.is_some());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn fence_increases_across_reopen_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.db");
        let m = meta("c");
        let n = name("fenced");
        let mut last = 0;
        for round in 0..3 {
            let b = open(&path).await;
            // granted and released
            let r = rq(&n, "released", &m);
            let owner_r = format!("rel-{round}");
            let r = Request {
                owner: &owner_r,
                ..r
            };
            let t = token(b.acquire(&r).await.unwrap());
            assert!(t > last, "{t} after {last}");
            last = t;
            assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
            // granted with a short lease and left to expire
            let owner_e = format!("exp-{round}");
            let short = Request {
                owner: &owner_e,
                lease: Duration::from_millis(60),
                ..rq(&n, "", &m)
            };
            let t = token(b.acquire(&short).await.unwrap());
            assert!(t > last);
            last = t;
            tokio::time::sleep(Duration::from_millis(100)).await;
            // taken over after expiry
            let owner_t = format!("take-{round}");
            let take = Request {
                owner: &owner_t,
                ..rq(&n, "", &m)
            };
            let t = token(b.acquire(&take).await.unwrap());
            assert!(t > last);
            last = t;
            // force release keeps the fence
            assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
            assert!(b.describe("").await.unwrap().is_empty());
            assert_eq!(stored_fence(&b, "fenced").await, last as i64);
            b.pool.close().await;
            drop(b);
        }
        assert_eq!(last, 9);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn expired_hold_is_taken_over_and_old_release_is_not_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let b = open(&path).await;
        let n = name("takeover");
        let (ma, mb) = (meta("A"), meta("B"));
        let old = Request {
            lease: Duration::from_millis(80),
            ..rq(&n, "old", &ma)
        };
        let new = rq(&n, "new", &mb);
        let t_old = token(a.acquire(&old).await.unwrap());
        let bz = busy(b.acquire(&new).await.unwrap());
        assert!(bz.retry_in.unwrap() <= Duration::from_millis(80));
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(a.describe("").await.unwrap().is_empty());
        let t_new = token(b.acquire(&new).await.unwrap());
        assert!(t_new > t_old);
        assert_eq!(a.release(&hr(&old)).await.unwrap(), Released::NotHeld);
        assert_eq!(
            a.extend(&[hr(&old)], false).await.unwrap(),
            vec![Extended::Gone]
        );
        // the old owner asking again is a new contender, not a re-grant
        assert!(matches!(a.acquire(&old).await.unwrap(), Attempt::Busy(_)));
        let info = a.describe("take").await.unwrap();
        assert_eq!(info[0].holders.len(), 1);
        assert_eq!(info[0].holders[0].owner, "new");
        assert_eq!(info[0].holders[0].token, Some(t_new));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn extend_mixes_live_and_gone_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let b = open(&path).await;
        let m = meta("m");
        let (nx, ny, nz, nw) = (name("x"), name("y"), name("z"), name("w"));
        let x = Request {
            lease: Duration::from_secs(1),
            ..rq(&nx, "ox", &m)
        };
        let y = Request {
            lease: Duration::from_millis(50),
            ..rq(&ny, "oy", &m)
        };
        let z = rq(&nz, "oz", &m);
        let w = Request {
            kind: LockKind::Semaphore { permits: 3 },
            mode: Mode::Shared,
            lease: Duration::from_secs(1),
            ..rq(&nw, "ow", &m)
        };
        token(a.acquire(&x).await.unwrap());
        token(a.acquire(&y).await.unwrap());
        token(a.acquire(&w).await.unwrap());
        tokio::time::sleep(Duration::from_millis(80)).await;
        // a hold of another owner on x must not count as ours
        let stranger = HoldRef {
            owner: "stranger",
            ..hr(&x)
        };
        let long = Duration::from_secs(60);
        let refs = [
            HoldRef {
                lease: long,
                ..hr(&x)
            },
            HoldRef {
                lease: long,
                ..hr(&y)
            },
            HoldRef {
                lease: long,
                ..hr(&z)
            },
            stranger,
            HoldRef {
                lease: long,
                ..hr(&w)
            },
        ];
        let got = b.extend(&refs, false).await.unwrap();
        assert_eq!(
            got,
            vec![
                Extended::Held { valid_for: long },
                Extended::Gone,
                Extended::Gone,
                Extended::Gone,
                Extended::Held { valid_for: long },
            ]
        );
        assert!(b.extend(&[], false).await.unwrap().is_empty());
        let info = a.describe("").await.unwrap();
        let names: Vec<&str> = info.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["w", "x"]);
        for i in &info {
            assert!(i.holders[0].lease_left_ms.unwrap() > 55_000);
        }
        assert_eq!(info[0].kind, LockKind::Semaphore { permits: 3 });
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn fair_queue_order_across_backends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let b = open(&path).await;
        let n = name("fifo");
        let (ma, mb) = (meta("A"), meta("B"));
        let fair = |owner: &'static str, m: &'static HolderMeta| Request {
            fair: true,
            waiting: true,
            ..rq(Box::leak(Box::new(n.clone())), owner, m)
        };
        let ma: &'static HolderMeta = Box::leak(Box::new(ma));
        let mb: &'static HolderMeta = Box::leak(Box::new(mb));
        let h = fair("h", ma);
        let (w1, w2, w3) = (fair("w1", mb), fair("w2", ma), fair("w3", mb));
        token(a.acquire(&h).await.unwrap());
        busy(b.acquire(&w1).await.unwrap());
        busy(a.acquire(&w2).await.unwrap());
        busy(b.acquire(&w3).await.unwrap());
        // repeating keeps the place
        busy(a.acquire(&w1).await.unwrap());
        let info = a.describe("fifo").await.unwrap();
        let order: Vec<(&str, u32)> = info[0]
            .waiters
            .iter()
            .map(|w| (w.owner.as_str(), w.position))
            .collect();
        assert_eq!(order, [("w1", 0), ("w2", 1), ("w3", 2)]);
        assert_eq!(info[0].waiters[1].meta, *ma);
        // a try (not queued) does not barge
        let plain = rq(&n, "plain", mb);
        assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
        busy(b.acquire(&plain).await.unwrap());
        // only waiters in the way: look again a lease from now (when w1's hold would end if its
        // holder died unreleased)
        assert_eq!(busy(b.acquire(&w2).await.unwrap()).retry_in, Some(w2.lease));
        busy(a.acquire(&w3).await.unwrap());
        let t1 = token(b.acquire(&w1).await.unwrap());
        let info = b.describe("").await.unwrap();
        let order: Vec<&str> = info[0].waiters.iter().map(|w| w.owner.as_str()).collect();
        assert_eq!(order, ["w2", "w3"]);
        assert_eq!(a.release(&hr(&w1)).await.unwrap(), Released::Released);
        // w2 gives up: w3 is next
        a.cancel(&w2).await.unwrap();
        let t3 = token(a.acquire(&w3).await.unwrap());
        assert!(t3 > t1);
        // w2 comes back at the end of the (now empty) queue and waits behind nobody but w3's hold
        busy(a.acquire(&w2).await.unwrap());
        b.release(&hr(&w3)).await.unwrap();
        token(b.acquire(&w2).await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rwlock_semaphore_and_kind_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let b = open(&path).await;
        let m = meta("m");
        let n = name("rw");
        let read = |o: &'static str| Request {
            kind: LockKind::RwLock,
            mode: Mode::Shared,
            ..rq(
                Box::leak(Box::new(n.clone())),
                o,
                Box::leak(Box::new(m.clone())),
            )
        };
        let write = Request {
            mode: Mode::Exclusive,
            ..read("w")
        };
        token(a.acquire(&read("r1")).await.unwrap());
        token(b.acquire(&read("r2")).await.unwrap());
        busy(b.acquire(&write).await.unwrap());
        let mutex = rq(&n, "m", &m);
        assert!(matches!(
            a.acquire(&mutex).await,
            Err(Error::InvalidConfig(_))
        ));
        a.release(&hr(&read("r1"))).await.unwrap();
        a.release(&hr(&read("r2"))).await.unwrap();
        token(b.acquire(&write).await.unwrap());

        let s = name("sem");
        let permit = |o: &'static str| Request {
            kind: LockKind::Semaphore { permits: 2 },
            mode: Mode::Shared,
            ..rq(
                Box::leak(Box::new(s.clone())),
                o,
                Box::leak(Box::new(m.clone())),
            )
        };
        token(a.acquire(&permit("p1")).await.unwrap());
        token(b.acquire(&permit("p2")).await.unwrap());
        busy(a.acquire(&permit("p3")).await.unwrap());
        let info = a.describe("sem").await.unwrap();
        assert_eq!(info[0].holders.len(), 2);
        assert_eq!(info[0].kind, LockKind::Semaphore { permits: 2 });
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn describe_prefix_is_literal() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(&dir.path().join("x.db")).await;
        let m = meta("m");
        let names = [
            "a%b/1",
            "axb/1",
            "a_c",
            "b'; DROP TABLE dlock_holds; --",
            "é/ü",
        ];
        for (i, n) in names.iter().enumerate() {
            let ln = name(n);
            let owner = format!("o{i}");
            token(b.acquire(&rq(&ln, &owner, &m)).await.unwrap());
        }
        let got = |p: &'static str| {
            let b = &b;
            async move {
                b.describe(p)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|i| i.name)
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(got("a%").await, ["a%b/1"]);
        assert_eq!(got("a_").await, ["a_c"]);
        assert_eq!(got("a").await, ["a%b/1", "a_c", "axb/1"]);
        assert_eq!(got("é").await, ["é/ü"]);
        assert_eq!(got("zzz").await, Vec::<String>::new());
        assert_eq!(got("").await.len(), 5);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn in_process_wakeup_is_immediate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = Arc::new(open(&path).await);
        let b = Arc::new(open(&path).await);
        let mut afters = Vec::new();
        for round in 0..5 {
            let holder = format!("h{round}");
            let n = name("wake");
            let m = meta("a");
            let h = rq(&n, &holder, &m);
            token(a.acquire(&h).await.unwrap());
            let (tx, rx) = tokio::sync::oneshot::channel();
            let waiter = {
                let b = b.clone();
                tokio::spawn(async move {
                    let n = name("wake");
                    let m = meta("b");
                    let owner = format!("w{round}");
                    let r = Request {
                        waiting: true,
                        ..rq(&n, &owner, &m)
                    };
                    let bz = busy(b.acquire(&r).await.unwrap());
                    let _ = tx.send(());
                    b.wait(&r, &bz, Instant::now() + Duration::from_secs(10))
                        .await
                        .unwrap();
                    let woke = Instant::now();
                    token(b.acquire(&r).await.unwrap());
                    b.release(&hr(&r)).await.unwrap();
                    woke
                })
            };
            rx.await.unwrap();
            // long enough for the waiter to reach its longest poll intervals
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
            // Measured from the end of the release (its synced DELETE may take a while on a
            // loaded machine): a notified waiter is already awake by then or wakes at once; a
            // polling one would wake up to a poll interval (25–50 ms by now) later.
            let released = Instant::now();
            let woke = waiter.await.unwrap();
            afters.push(woke.saturating_duration_since(released));
        }
        afters.sort();
        eprintln!("woke after the release: {afters:?}");
        assert!(
            afters[2] < Duration::from_millis(10),
            "median wake-up {:?} after the release: not a notification ({afters:?})",
            afters[2]
        );
        assert!(
            afters[4] < POLL_MAX,
            "a waiter woke {:?} after the release ({afters:?})",
            afters[4]
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn cross_backend_wait_polls_and_respects_until() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let b = open(&path).await;
        let n = name("poll");
        let (ma, mb) = (meta("a"), meta("b"));
        let h = rq(&n, "h", &ma);
        let w = rq(&n, "w", &mb);
        token(a.acquire(&h).await.unwrap());
        let bz = busy(b.acquire(&w).await.unwrap());
        // nothing changes: wait returns at `until`
        let start = Instant::now();
        b.wait(&w, &bz, start + Duration::from_millis(120))
            .await
            .unwrap();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(120) && took < Duration::from_millis(400),
            "{took:?}"
        );
        // a change made behind the in-process wake-ups' back (as by another process) is found
        // through the file watch
        sqlx::query("DELETE FROM dlock_holds WHERE owner = 'h'")
            .execute(&a.pool)
            .await
            .unwrap();
        let start = Instant::now();
        b.wait(&w, &bz, start + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(start.elapsed() < Duration::from_millis(200));
        // a short lease in the way: wait returns when it runs out
        let short = Request {
            owner: "short",
            lease: Duration::from_millis(100),
            ..rq(&n, "", &ma)
        };
        token(a.acquire(&short).await.unwrap());
        let bz = busy(b.acquire(&w).await.unwrap());
        let start = Instant::now();
        b.wait(&w, &bz, start + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(start.elapsed() < Duration::from_millis(300));
        token(b.acquire(&w).await.unwrap());
    }

    /// A waiter that only the file watch can wake (a backend without a client: nothing in this
    /// process wakes it, as in another process) does not poll: a second of waiting costs a handful of looks (the
    /// 250 ms safety net), not the ~25 of 5 → 50 ms polling, and a release (its wake file) wakes
    /// it at once.
    #[tokio::test(flavor = "multi_thread")]
    async fn another_process_release_wakes_through_the_file_watch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watched.db");
        let a = open(&path).await;
        let b = open(&path).await;
        assert_eq!(b.capabilities().wakeups, Wakeups::Native, "no file watch");
        let n = name("watched");
        let (ma, mb) = (meta("a"), meta("b"));
        let h = rq(&n, "h", &ma);
        let w = Request {
            waiting: true,
            ..rq(&n, "w", &mb)
        };
        token(a.acquire(&h).await.unwrap());
        let bz = busy(b.acquire(&w).await.unwrap());
        // Count the looks of a quiet second: one, four safety looks (and a little slack for a
        // slow machine); polling would take about 25.
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.looks.store(0, Ordering::Relaxed);
        let started = Instant::now();
        b.wait(&w, &bz, started + Duration::from_secs(1))
            .await
            .unwrap();
        let looks = b.looks.load(Ordering::Relaxed);
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert!(
            looks <= 8,
            "{looks} looks in a quiet second: the waiter polled"
        );
        let (woke, released) = tokio::join!(
            async {
                b.wait(&w, &bz, Instant::now() + Duration::from_secs(5))
                    .await
                    .unwrap();
                Instant::now()
            },
            async {
                tokio::time::sleep(Duration::from_millis(600)).await;
                let released = Instant::now();
                assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
                released
            }
        );
        let after = woke.saturating_duration_since(released);
        eprintln!("woken {after:?} after a release by another backend");
        assert!(
            after < Duration::from_millis(200),
            "woken {after:?} after the release"
        );
    }

    /// A report of the file watch (a release by another process) sends the waiter straight to
    /// an attempt, without a look on the hand-off's path; a wait that ends without one (its
    /// deadline, the safety look) looks first.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_release_by_another_process_sends_the_waiter_to_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let b = open(&path).await;
        let n = name("report");
        let (ma, mb) = (meta("a"), meta("b"));
        let h = rq(&n, "h", &ma);
        let w = wait_rq(&n, "w", &mb);
        token(a.acquire(&h).await.unwrap());
        let mut acq = b.begin(&w);
        let bz = busy(acq.attempt().await.unwrap());
        let quiet = Instant::now();
        let watch = acq.changed(&bz, quiet + Duration::from_millis(100)).await;
        assert_eq!(watch.unwrap(), Watch::Recheck);
        assert!(quiet.elapsed() >= Duration::from_millis(100));
        let (watch, released) = tokio::join!(
            acq.changed(&bz, Instant::now() + Duration::from_secs(5)),
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                a.release(&hr(&h)).await.unwrap()
            }
        );
        assert_eq!(released, Released::Released);
        assert_eq!(watch.unwrap(), Watch::Changed);
        token(acq.attempt().await.unwrap());
    }

    /// Grants commit with `synchronous=FULL` (a fencing token survives a power cut); releases
    /// go through a connection of their own with `synchronous=NORMAL` (see the module docs).
    #[tokio::test(flavor = "multi_thread")]
    async fn grants_are_synced_and_releases_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(&dir.path().join("x.db")).await;
        let n = name("synced");
        let m = meta("m");
        let r = rq(&n, "o", &m);
        token(b.acquire(&r).await.unwrap());
        assert_eq!(b.releases.size(), 1, "no release connection");
        // With the release connection taken, the release waits for it.
        let own = b.releases.acquire().await.unwrap();
        let release = tokio::spawn({
            let (b, n, m) = (b.clone(), n.clone(), m.clone());
            async move { b.release(&hr(&rq(&n, "o", &m))).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !release.is_finished(),
            "released without the release connection"
        );
        drop(own);
        assert_eq!(release.await.unwrap(), Released::Released);
        for (pool, level) in [(&b.pool, 2), (&b.releases, 1)] {
            let got: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(got, level);
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn not_a_database_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.txt");
        std::fs::write(&path, "these are my notes, not a database\n".repeat(200)).unwrap();
        let e = SqliteBackend::open(&path).await.unwrap_err();
        assert!(matches!(e, Error::Backend(_)), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("notes.txt") && msg.contains("not a SQLite database"),
            "{msg}"
        );
        // the file is left alone
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("these are"));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn missing_directory_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("locks.db");
        let e = SqliteBackend::open(&path).await.unwrap_err();
        assert!(matches!(e, Error::Backend(_)), "{e:?}");
        assert!(e.to_string().contains("no-such-dir"), "{e}");
        let e = SqliteBackend::open(dir.path()).await.unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
    }

    /// The schema of version 1 (wall-clock `expires_at_ms`), as dlock 0.1 wrote it.
    const V1: &[&str] = &[
        "CREATE TABLE dlock_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL)",
        "INSERT INTO dlock_meta VALUES ('schema_version', 1)",
        "CREATE TABLE dlock_holds (name TEXT NOT NULL, owner TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL, permits INTEGER NOT NULL, mode TEXT NOT NULL,
            fence INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,
            acquired_at_ms INTEGER NOT NULL, client_id TEXT NOT NULL, host TEXT NOT NULL,
            pid INTEGER NOT NULL)",
        "CREATE INDEX dlock_holds_name ON dlock_holds (name)",
        "CREATE TABLE dlock_queue (seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
            owner TEXT NOT NULL, mode TEXT NOT NULL, expires_at_ms INTEGER NOT NULL,
            client_id TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL)",
        "CREATE INDEX dlock_queue_name ON dlock_queue (name, seq)",
        "CREATE TABLE dlock_fences (name TEXT NOT NULL PRIMARY KEY, fence INTEGER NOT NULL)",
    ];

    #[tokio::test(flavor = "multi_thread")]
    async fn a_version_1_file_is_upgraded_keeping_what_is_left_of_each_lease() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            let opts = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            let pool = SqlitePool::connect_with(opts).await.unwrap();
            for stmt in V1 {
                sqlx::query(stmt).execute(&pool).await.unwrap();
            }
            let wall = machine::wall_ms();
            sqlx::query(
                "INSERT INTO dlock_holds VALUES ('old', 'owner-old', 'mutex', 0, 'exclusive', 7, ?,
                 ?, 'c', 'h', 1)",
            )
            .bind(wall + 20_000)
            .bind(wall)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query("INSERT INTO dlock_fences VALUES ('old', 7)")
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
        let b = open(&path).await;
        let (v,): (i64,) =
            sqlx::query_as("SELECT value FROM dlock_meta WHERE key = 'schema_version'")
                .fetch_one(&b.pool)
                .await
                .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        // A process of the old version fails on its next statement instead of misreading.
        let old = sqlx::query("SELECT expires_at_ms FROM dlock_holds")
            .fetch_all(&b.pool)
            .await;
        assert!(old.is_err(), "the old column is still there");
        let info = b.describe("").await.unwrap();
        let left = info[0].holders[0].lease_left_ms.unwrap();
        assert!(
            (15_000..=20_000).contains(&left),
            "{left} ms left after the upgrade"
        );
        assert_eq!(info[0].holders[0].status, HoldStatus::Held);
        let (m, n) = (meta("new"), name("old"));
        assert!(busy(b.acquire(&rq(&n, "owner-new", &m)).await.unwrap())
            .retry_in
            .is_some());
    }

    /// The tables of version 2 as dlock wrote them before they were stored in key order.
    const V2_WITH_ROW_IDS: &[&str] = &[
        "CREATE TABLE dlock_holds (name TEXT NOT NULL, owner TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL, permits INTEGER NOT NULL, mode TEXT NOT NULL,
            fence INTEGER NOT NULL, expires_ms INTEGER NOT NULL,
            acquired_at_ms INTEGER NOT NULL, client_id TEXT NOT NULL, host TEXT NOT NULL,
            pid INTEGER NOT NULL, state INTEGER NOT NULL DEFAULT 0, value TEXT)",
        "CREATE INDEX dlock_holds_name ON dlock_holds (name)",
        "CREATE TABLE dlock_fences (name TEXT NOT NULL PRIMARY KEY, fence INTEGER NOT NULL)",
    ];

    /// The tables of the database stored without row ids, and its indexes, by name.
    async fn layout(pool: &SqlitePool) -> (Vec<String>, Vec<String>) {
        let clustered: Vec<(String,)> = sqlx::query_as(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%WITHOUT ROWID'
             ORDER BY name",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let indexes: Vec<(String,)> = sqlx::query_as(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        (
            clustered.into_iter().map(|(n,)| n).collect(),
            indexes.into_iter().map(|(n,)| n).collect(),
        )
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_with_row_id_tables_is_rebuilt_in_key_order_keeping_holds_and_fences() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.db");
        let (m, n) = (meta("m"), name("kept"));
        // A version 2 file of today's columns, its holds and fences in tables with row ids.
        {
            let b = open(&path).await;
            for stmt in ["DROP TABLE dlock_holds", "DROP TABLE dlock_fences"]
                .iter()
                .chain(V2_WITH_ROW_IDS)
            {
                sqlx::query(stmt).execute(&b.pool).await.unwrap();
            }
            assert_eq!(token(b.acquire(&rq(&n, "holder", &m)).await.unwrap()), 1);
            let other = name("released");
            assert_eq!(token(b.acquire(&rq(&other, "o1", &m)).await.unwrap()), 1);
            let r = rq(&other, "o1", &m);
            assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
            assert_eq!(
                layout(&b.pool).await,
                (
                    vec![],
                    vec!["dlock_holds_name".into(), "dlock_queue_name".into()]
                )
            );
            b.pool.close().await;
        }
        let b = open(&path).await;
        assert_eq!(
            layout(&b.pool).await,
            (
                vec!["dlock_fences".into(), "dlock_holds".into()],
                vec!["dlock_queue_name".into()]
            )
        );
        // The hold is still held, and the fences go on from where they were.
        assert!(busy(b.acquire(&rq(&n, "other", &m)).await.unwrap())
            .retry_in
            .is_some());
        let info = b.describe("").await.unwrap();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].holders[0].status, HoldStatus::Held);
        let other = name("released");
        assert_eq!(token(b.acquire(&rq(&other, "o2", &m)).await.unwrap()), 2);
        // Opened again: nothing to rebuild, nothing lost.
        b.pool.close().await;
        let b = open(&path).await;
        assert_eq!(layout(&b.pool).await.0.len(), 2);
        assert_eq!(b.describe("").await.unwrap().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_last_used_in_another_boot_drops_its_holds_and_keeps_its_fences() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot.db");
        let (m, n) = (meta("m"), name("across-boots"));
        let b = open(&path).await;
        assert_eq!(token(b.acquire(&rq(&n, "before", &m)).await.unwrap()), 1);
        sqlx::query("UPDATE dlock_meta SET value = 'another-boot' WHERE key = 'boot_id'")
            .execute(&b.pool)
            .await
            .unwrap();
        b.pool.close().await;
        let b = open(&path).await;
        assert!(
            b.describe("").await.unwrap().is_empty(),
            "a hold of another boot survived"
        );
        assert_eq!(token(b.acquire(&rq(&n, "after", &m)).await.unwrap()), 2);
        // The same boot keeps its holds.
        b.pool.close().await;
        let b = open(&path).await;
        assert_eq!(b.describe("").await.unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let b = open(&path).await;
        sqlx::query("UPDATE dlock_meta SET value = 99 WHERE key = 'schema_version'")
            .execute(&b.pool)
            .await
            .unwrap();
        b.pool.close().await;
        let e = SqliteBackend::open(&path).await.unwrap_err();
        assert!(matches!(e, Error::Backend(_)), "{e:?}");
        assert!(e.to_string().contains("99"), "{e}");
    }

    /// Out of file descriptors, a release whose statement's connection is still on its way
    /// back to the pool (it would open a new one and cannot) waits for that connection instead
    /// of leaving the lock held. (nextest runs each test in a process of its own: the lowered
    /// limit stays in this one.)
    #[tokio::test(flavor = "multi_thread")]
    async fn release_short_of_file_descriptors_takes_the_returning_connection() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let b = open(&path).await;
        let n = name("fd/job");
        let m = meta("m");
        let r = rq(&n, "o", &m);
        token(b.acquire(&r).await.unwrap());
        // The acquire's connections go back to the pool by a spawned task: wait for all.
        let back_by = std::time::Instant::now() + Duration::from_secs(5);
        while b.pool.num_idle() == 0 || b.pool.num_idle() as u32 != b.pool.size() {
            assert!(
                std::time::Instant::now() < back_by,
                "no connection came back"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Every idle connection out of the pool; one comes back 10 ms from now.
        let mut out = Vec::new();
        while let Some(c) = b.pool.try_acquire() {
            out.push(c);
        }
        let back = out.pop().expect("a pooled connection");
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // The lowest free descriptor number becomes the limit: no file can be opened.
        let lowest_free = {
            use std::os::fd::AsRawFd;
            std::fs::File::open("/dev/null").unwrap().as_raw_fd() as u64
        };
        setrlimit(Resource::RLIMIT_NOFILE, lowest_free, hard).unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(back);
        });
        let released = b.release(&hr(&r)).await;
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        assert_eq!(released.unwrap(), Released::Released);
        drop(out);
    }

    /// A full disk fails writes inside a transaction, and SQLite may roll that transaction back
    /// itself; the connections that saw it must still serve once there is room again (they
    /// stayed counted as in a transaction, and every later `BEGIN` failed). The disk is made
    /// full with `max_page_count` at the file's size on every pooled connection.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_full_disk_leaves_every_connection_usable_once_there_is_room() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(&dir.path().join("x.db")).await;
        let m = meta("m");
        let set_limit = |pages: &'static str| {
            let pool = b.pool.clone();
            async move {
                let mut conns = Vec::new();
                for _ in 0..MAX_CONNECTIONS {
                    conns.push(pool.acquire().await.unwrap());
                }
                for c in &mut conns {
                    sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
                        .execute(&mut **c)
                        .await
                        .unwrap();
                }
            }
        };
        // The file's pages now, so any growth fails.
        let (pages,): (i64,) = sqlx::query_as("PRAGMA page_count")
            .fetch_one(&b.pool)
            .await
            .unwrap();
        let pages: &'static str = Box::leak(pages.to_string().into_boxed_str());
        set_limit(pages).await;
        let mut full = 0;
        for i in 0..200 {
            let n = name(&format!("full/{i}"));
            if b.acquire(&rq(&n, &format!("full{i}"), &m)).await.is_err() {
                full += 1;
            }
        }
        assert!(full > 0, "the store never filled up");
        set_limit("1073741823").await;
        for i in 0..20 {
            let n = name(&format!("room/{i}"));
            let owner = format!("room{i}");
            let r = rq(&n, &owner, &m);
            token(
                b.acquire(&r)
                    .await
                    .unwrap_or_else(|e| panic!("attempt {i} after the disk had room: {e}")),
            );
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn busy_database_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let mut blocker = a.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        sqlx::query("SELECT 1")
            .execute(&mut *blocker)
            .await
            .unwrap();
        // opening needs the write lock for the migration
        let e = SqliteBackend::open(&path).await.unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        assert!(e.to_string().contains("busy"), "{e}");
        blocker.rollback().await.unwrap();
    }

    #[test]
    fn the_busy_handler_pauses_briefly_and_gives_up_at_the_busy_timeout() {
        assert_eq!(busy_pause(0), Duration::from_micros(200));
        assert!((0..10_000).all(|n| busy_pause(n) <= Duration::from_millis(2)));
        assert_eq!(busy_waited(0), Duration::ZERO);
        assert_eq!(busy_waited(3), Duration::from_micros(200 + 400 + 800));
        assert_eq!(busy_waited(20), Duration::from_micros(3_000 + 16 * 2_000));
        let gives_up = (0..10_000u32)
            .find(|n| busy_waited(*n) >= BUSY_TIMEOUT)
            .unwrap();
        // 5 s at 2 ms per retry after the first 3 ms.
        assert!((2_490..=2_510).contains(&gives_up), "{gives_up}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_write_that_waited_for_the_lock_goes_soon_after_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let a = open(&path).await;
        let b = open(&path).await;
        let mut blocker = a.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        sqlx::query("SELECT 1")
            .execute(&mut *blocker)
            .await
            .unwrap();
        let n = name("busy");
        let m = meta("m");
        let waiting = tokio::spawn(async move {
            let r = rq(&n, "owner", &m);
            b.acquire(&r).await.unwrap();
            Instant::now()
        });
        // SQLite's own handler would be asleep for 100 ms at this point (its pauses reach
        // 100 ms after 228 ms) and take the lock ~100 ms late.
        tokio::time::sleep(Duration::from_millis(230)).await;
        blocker.rollback().await.unwrap();
        let freed = Instant::now();
        let got = waiting.await.unwrap();
        let late = got.saturating_duration_since(freed);
        assert!(
            late < Duration::from_millis(40),
            "granted {late:?} after the lock was free"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn concurrent_tasks_never_share_the_mutex() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut backends = Vec::new();
        for _ in 0..4 {
            backends.push(Arc::new(open(&path).await));
        }
        let inside = Arc::new(AtomicUsize::new(0));
        let grants = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for t in 0..8usize {
            let b = backends[t % 4].clone();
            let (inside, grants) = (inside.clone(), grants.clone());
            tasks.push(tokio::spawn(async move {
                let n = name("contended");
                let m = meta(&format!("task{t}"));
                let mut last = 0;
                for i in 0..20 {
                    let owner = format!("t{t}-{i}");
                    let r = Request {
                        lease: Duration::from_secs(10),
                        fair: t % 4 == 1,
                        waiting: t % 2 == 1,
                        ..rq(&n, &owner, &m)
                    };
                    let tok = loop {
                        match b.acquire(&r).await.unwrap() {
                            Attempt::Granted(g) => break g.token.unwrap(),
                            Attempt::Busy(bz) if r.waiting => b
                                .wait(&r, &bz, Instant::now() + Duration::from_secs(1))
                                .await
                                .unwrap(),
                            Attempt::Busy(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                        }
                    };
                    assert!(tok > last);
                    last = tok;
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    grants.fetch_add(1, Ordering::SeqCst);
                    if i % 5 == 0 {
                        let info = b.describe("contended").await.unwrap();
                        assert_eq!(info[0].holders.len(), 1);
                        assert_eq!(info[0].holders[0].owner, owner);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(grants.load(Ordering::SeqCst), 160);
        assert_eq!(stored_fence(&backends[0], "contended").await, 160);
        assert!(backends[0].describe("").await.unwrap().is_empty());
    }

    const CHILD_DB: &str = "DLOCK_SQLITE_TEST_CHILD_DB";
    const CHILD_ROUNDS: usize = 15;

    /// Runs only as a child process of `separate_processes_exclude_each_other`.
    #[tokio::test(flavor = "multi_thread")]
    async fn child_process_worker() {
        let Some(db) = std::env::var_os(CHILD_DB) else {
            return;
        };
        let db = PathBuf::from(db);
        let marker = db.with_extension("inside");
        let b = open(&db).await;
        let n = name("cross-process");
        let m = meta(&format!("pid{}", std::process::id()));
        let mut last = 0;
        for i in 0..CHILD_ROUNDS {
            let owner = format!("{}-{i}", std::process::id());
            let r = Request {
                waiting: true,
                fair: i % 2 == 0,
                ..rq(&n, &owner, &m)
            };
            let tok = loop {
                match b.acquire(&r).await.unwrap() {
                    Attempt::Granted(g) => break g.token.unwrap(),
                    Attempt::Busy(bz) => b
                        .wait(&r, &bz, Instant::now() + Duration::from_secs(1))
                        .await
                        .unwrap(),
                }
            };
            assert!(tok > last);
            last = tok;
            // Fails if another process is inside too.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&marker)
                .expect("another process holds the lock at the same time");
            tokio::time::sleep(Duration::from_millis(2)).await;
            std::fs::remove_file(&marker).unwrap();
            assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn separate_processes_exclude_each_other() {
        if std::env::var_os(CHILD_DB).is_some() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.db");
        let exe = std::env::current_exe().unwrap();
        let worker = format!(
            "{}::child_process_worker",
            module_path!().trim_start_matches("dlock::")
        );
        let children: Vec<_> = (0..3)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args([
                        worker.as_str(),
                        "--exact",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(CHILD_DB, &path)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = tokio::task::spawn_blocking(move || c.wait_with_output())
                .await
                .unwrap()
                .unwrap();
            assert!(
                out.status.success(),
                "child failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
        }
        let b = open(&path).await;
        assert_eq!(
            stored_fence(&b, "cross-process").await,
            3 * CHILD_ROUNDS as i64
        );
        assert!(b.describe("").await.unwrap().is_empty());
    }

    /// Through clients: the grants of a name in a new file count from 1.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_name_in_a_new_file_counts_from_one() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("e2e.db").display());
        let c1 = crate::connect(&url).await.unwrap();
        let c2 = crate::connect(&url).await.unwrap();
        assert_eq!(c1.backend_name(), "sqlite");
        for (c, token) in [(&c1, 1), (&c2, 2), (&c1, 3)] {
            let g = c.mutex("e2e/job").unwrap().try_acquire().await.unwrap();
            assert_eq!(g.token(), Some(token));
            g.release().await.unwrap();
        }
        assert!(c1.list("").await.unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn set_value_replaces_the_holders_value_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("values.db");
        let a = open(&path).await;
        check_values(&a, "values/one", true).await;
        // Another backend of the file sees what one wrote.
        let b = open(&path).await;
        let (m, n) = (meta_value("c", "seen"), name("values/two"));
        let r = rq(&n, "owner", &m);
        token(a.acquire(&r).await.unwrap());
        assert_eq!(
            value_of(&b, "values/two", "owner").await,
            Some(Some("seen".into()))
        );
        assert_eq!(
            b.set_value(&hr(&r), "v2").await.unwrap(),
            Released::Released
        );
        assert_eq!(
            value_of(&a, "values/two", "owner").await,
            Some(Some("v2".into()))
        );
    }

    /// A version 2 file made before holds had values (no `value` column) gets the column when
    /// opened, keeps its holds, and an older process's insert (without the column) still works.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_version_2_file_without_values_gets_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.db");
        let b = open(&path).await;
        let m = meta("old");
        let n = name("before-values");
        let r = rq(&n, "owner-old", &m);
        token(b.acquire(&r).await.unwrap());
        sqlx::query("ALTER TABLE dlock_holds DROP COLUMN value")
            .execute(&b.pool)
            .await
            .unwrap();
        b.pool.close().await;
        let b = open(&path).await;
        let (v,): (i64,) =
            sqlx::query_as("SELECT value FROM dlock_meta WHERE key = 'schema_version'")
                .fetch_one(&b.pool)
                .await
                .unwrap();
        assert_eq!(v, SCHEMA_VERSION, "no new version for the column");
        assert_eq!(value_of(&b, "before-values", "owner-old").await, Some(None));
        assert_eq!(
            b.set_value(&hr(&r), "later").await.unwrap(),
            Released::Released
        );
        assert_eq!(
            value_of(&b, "before-values", "owner-old").await,
            Some(Some("later".into()))
        );
        // What a version 2 process without values writes.
        sqlx::query(
            "INSERT INTO dlock_holds (name, owner, kind, permits, mode, fence, expires_ms,
                 acquired_at_ms, client_id, host, pid)
             VALUES ('old-writer', 'o', 'mutex', 0, 'exclusive', 1, ?, 0, 'c', 'h', 1)",
        )
        .bind(now_ms() + 20_000)
        .execute(&b.pool)
        .await
        .unwrap();
        assert_eq!(value_of(&b, "old-writer", "o").await, Some(None));
        // Opening again does not add it twice.
        b.pool.close().await;
        let b = open(&path).await;
        assert_eq!(b.describe("").await.unwrap().len(), 2);
    }

    /// The one-step attempt grants a free name with the stored fence plus one and the hold's
    /// columns as the full path writes them, takes over an expired hold, refuses with the
    /// holder's time left, and leaves to the full path what needs another write (a regrant, a
    /// fence at its end).
    #[tokio::test(flavor = "multi_thread")]
    async fn the_one_step_attempt_answers_as_the_grant_rule_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let (a, b) = (open(&path).await, open(&path).await);
        let n = name("step");
        let (ma, mb) = (meta("A"), meta("B"));
        let (ra, rb) = (rq(&n, "owner-a", &ma), wait_rq(&n, "owner-b", &mb));
        assert!(step::fits(&ra) && step::fits(&rb));
        sqlx::query("INSERT INTO dlock_fences (name, fence) VALUES ('step', 41)")
            .execute(&a.pool)
            .await
            .unwrap();
        let granted = a.attempt_in_one_step(&ra).await.unwrap().unwrap();
        assert_eq!(token(granted), 42);
        let info = b.describe("step").await.unwrap();
        let h = &info[0].holders[0];
        assert_eq!(
            (h.owner.as_str(), h.token, &h.meta),
            ("owner-a", Some(42), &ma)
        );
        assert_eq!(info[0].kind, LockKind::Mutex);
        let left = h.lease_left_ms.unwrap();
        assert!(left <= 30_000 && left > 25_000, "{left}");
        let retry = busy(b.attempt_in_one_step(&rb).await.unwrap().unwrap())
            .retry_in
            .unwrap();
        assert!(
            retry <= LONG && retry > LONG - Duration::from_secs(5),
            "{retry:?}"
        );
        // The owner's own hold is a regrant: a write the step leaves to the full path.
        assert!(a.attempt_in_one_step(&ra).await.unwrap().is_none());
        assert_eq!(token(a.acquire(&ra).await.unwrap()), 42);
        // An expired hold is deleted and the name granted.
        sqlx::query("UPDATE dlock_holds SET expires_ms = 0")
            .execute(&a.pool)
            .await
            .unwrap();
        assert_eq!(
            token(b.attempt_in_one_step(&rb).await.unwrap().unwrap()),
            43
        );
        assert_eq!(hold_rows(&a).await, 1);
        // A fair waiter's queue place keeps a plain request out, also when an expired hold was
        // deleted just before (the fence moves only when the step inserts its fence row).
        assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::Released);
        assert_eq!(
            token(b.attempt_in_one_step(&rb).await.unwrap().unwrap()),
            44
        );
        sqlx::query("UPDATE dlock_holds SET expires_ms = 0")
            .execute(&a.pool)
            .await
            .unwrap();
        let rc = Request {
            fair: true,
            ..wait_rq(&n, "owner-c", &mb)
        };
        assert!(!step::fits(&rc));
        sqlx::query(
            "INSERT INTO dlock_queue (name, owner, mode, expires_ms, client_id, host, pid)
             VALUES ('step', 'owner-c', 'exclusive', ?, 'c', 'h', 1)",
        )
        .bind(now_ms() + 60_000)
        .execute(&a.pool)
        .await
        .unwrap();
        assert!(busy(a.attempt_in_one_step(&ra).await.unwrap().unwrap())
            .retry_in
            .is_some());
        assert_eq!(stored_fence(&a, "step").await, 44);
        assert_eq!(hold_rows(&a).await, 0);
        // A fence at its end: the step writes nothing, the full path refuses with an error.
        let m = name("spent");
        let rm = rq(&m, "owner-m", &ma);
        sqlx::query("INSERT INTO dlock_fences (name, fence) VALUES ('spent', ?)")
            .bind(i64::MAX)
            .execute(&a.pool)
            .await
            .unwrap();
        assert!(a.attempt_in_one_step(&rm).await.unwrap().is_none());
        assert!(a.acquire(&rm).await.is_err());
        assert_eq!(stored_fence(&a, "spent").await, i64::MAX);
        assert!(a.describe("spent").await.unwrap().is_empty());
    }

    /// A step that fails after its `BEGIN IMMEDIATE` closes its connection: the transaction
    /// sqlx does not count is rolled back, so the write lock is free for everyone at once (not
    /// after the other processes' busy timeout) and the backend serves the next attempt.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_step_cut_short_leaves_no_transaction_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let (a, b) = (open(&path).await, open(&path).await);
        refuse_holds(&a, "NEW.owner = 'refused'", "refused by the test").await;
        let n = name("cut");
        let m = meta("A");
        let e = a
            .attempt_in_one_step(&rq(&n, "refused", &m))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("refused by the test"), "{e}");
        let started = Instant::now();
        let mut tx =
            tokio::time::timeout(Duration::from_secs(2), b.pool.begin_with("BEGIN IMMEDIATE"))
                .await
                .expect("the write lock stayed taken")
                .unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        tx.rollback().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        for _ in 0..MAX_CONNECTIONS + 1 {
            let r = rq(&n, "owner-a", &m);
            assert_eq!(token(a.acquire(&r).await.unwrap()), 1);
        }
    }
}
