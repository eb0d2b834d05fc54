//! Session mode of PostgreSQL and MySQL/MariaDB (`?mode=session`): [`SessionBackend`]. Each hold
//! is a server session lock on a connection of its own; the server frees it when that session
//! ends. See the [module docs](super) for the keys, the checks and what breaks it. A hold's row in
//! the table (its holder, fence and value) is written on the hold's connection at grant, and
//! `set_value` rewrites the value there only while that connection still holds the server lock.

use super::common::{bind_hold, expiry, STATE_REVOKED};
use super::config::{Dialect, HoldMode, SqlConfig};
use super::server::{
    advisory_key, mysql_lock_name, setup, Sql, OP_TIMEOUT, POLL_MAX, POLL_MIN, ROWS,
};
use crate::backend::*;
use crate::error::Error;
use sqlx::{AnyConnection, Connection, Executor, Row};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

/// How long a break waits for the killed session's lock to be freed (the call's own bound is
/// [`OP_TIMEOUT`]).
const BREAK_WAIT: Duration = Duration::from_secs(5);

/// One session-mode hold: the dedicated connection that owns the server lock.
#[derive(Debug)]
struct SessionHold {
    name: String,
    token: u64,
    /// The server session id at grant (`pg_backend_pid()` / `CONNECTION_ID()`).
    server_pid: i64,
    conn: tokio::sync::Mutex<Option<AnyConnection>>,
}

type SessionHolds = StdMutex<HashMap<String, Arc<SessionHold>>>;

/// The session-mode store: server session locks of PostgreSQL or MySQL/MariaDB. Obtain it with
/// `dlock::connect("postgres://…?mode=session")` (or `mysql://`), or [`SessionBackend::open`]
/// and [`crate::Client::with_backend`]. Only mutexes, without fair queueing.
#[derive(Debug)]
pub struct SessionBackend {
    inner: Arc<Session>,
}

/// What a [`SessionBackend`] shares with its acquisitions: the server, and its holds by owner.
#[derive(Debug)]
struct Session {
    sql: Sql,
    holds: SessionHolds,
}

impl SessionBackend {
    /// Connects to the server of `url` (which must say `mode=session`) and creates or checks
    /// the tables that hold the fencing tokens and the holders' metadata.
    ///
    /// Errors: [`Error::InvalidConfig`] for a bad URL or option (or a URL without
    /// `mode=session`), [`Error::Unavailable`] when the server cannot be reached within
    /// [`OP_TIMEOUT`] or its tables belong to a newer dlock.
    pub async fn open(url: &str) -> Result<SessionBackend> {
        let cfg = SqlConfig::parse(url)?;
        if cfg.mode != HoldMode::Session {
            return Err(Error::InvalidConfig(format!(
                "{}: a session-mode store needs ?mode=session",
                cfg.shown
            )));
        }
        Ok(SessionBackend {
            inner: Arc::new(Session {
                sql: Sql::open(&cfg).await?,
                holds: StdMutex::default(),
            }),
        })
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.inner.sql.table
    }

    /// PostgreSQL or MySQL.
    pub fn dialect(&self) -> Dialect {
        self.inner.sql.dialect
    }

    /// The server session id of `owner`'s hold (tests kill it).
    #[cfg(test)]
    pub(super) fn server_pid(&self, owner: &str) -> Option<i64> {
        self.inner.held(owner).map(|h| h.server_pid)
    }
}

impl Session {
    fn held(&self, owner: &str) -> Option<Arc<SessionHold>> {
        self.holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(owner)
            .cloned()
    }

    async fn acquire(&self, req: &Request<'_>) -> Result<Attempt> {
        if req.kind != LockKind::Mutex {
            return Err(Error::Unsupported(format!(
                "{} session mode supports only mutexes, not {}",
                self.sql.dialect.name(),
                req.kind
            )));
        }
        if req.fair {
            return Err(Error::Unsupported(format!(
                "{} session mode cannot queue fairly (use lease mode)",
                self.sql.dialect.name()
            )));
        }
        let name = req.name.as_str();
        let existing = self
            .holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(req.owner)
            .cloned();
        if let Some(h) = existing {
            return Ok(Attempt::Granted(Grant {
                token: Some(h.token),
                valid_for: req.lease,
            }));
        }
        let mut conn = AnyConnection::connect_with(&self.sql.connect)
            .await
            .map_err(|e| self.sql.err(e))?;
        if let Err(e) = setup(self.sql.dialect, &mut conn).await {
            return Err(self.sql.err(e));
        }
        // The server ends this session once it has been idle for a lease (the holder renews
        // every third of it): a holder whose machine died, or that stopped renewing, blocks
        // others for about a lease, as on a lease table.
        idle_limit(self.sql.dialect, &mut conn, req.lease).await;
        let got = self.try_lock(&mut conn, name).await;
        let got = match got {
            Ok(g) => g,
            Err(e) => {
                let _ = conn.close().await;
                return Err(self.sql.err(e));
            }
        };
        if !got {
            let _ = conn.close().await;
            return Ok(Attempt::Busy(Busy { retry_in: None }));
        }
        // Ours: any hold row of the name is a dead holder's leftover.
        let granted = async {
            let pid: i64 = sqlx::query(match self.sql.dialect {
                Dialect::Postgres => "SELECT pg_backend_pid()::bigint",
                Dialect::MySql => "SELECT CAST(CONNECTION_ID() AS SIGNED)",
            })
            .fetch_one(&mut conn)
            .await?
            .try_get(0)?;
            sqlx::query(&self.sql.st.bump_fence)
                .bind(name)
                .execute(&mut conn)
                .await?;
            let token: i64 = sqlx::query(&self.sql.st.read_fence)
                .bind(name)
                .fetch_one(&mut conn)
                .await?
                .try_get(0)?;
            let now = self.sql.db_now(&mut conn).await?;
            sqlx::query(&self.sql.st.del_name_holds)
                .bind(name)
                .execute(&mut conn)
                .await?;
            bind_hold(sqlx::query(&self.sql.st.insert_hold), req, token, now, now)
                .execute(&mut conn)
                .await?;
            Ok::<_, sqlx::Error>((pid, token))
        }
        .await;
        let (pid, token) = match granted {
            Ok(x) => x,
            Err(e) => {
                // Closing the connection frees the server lock.
                let _ = conn.close().await;
                return Err(self.sql.err(e));
            }
        };
        let token = ROWS.token(token)?;
        let hold = Arc::new(SessionHold {
            name: name.to_string(),
            token,
            server_pid: pid,
            conn: tokio::sync::Mutex::new(Some(conn)),
        });
        self.holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(req.owner.to_string(), hold);
        Ok(Attempt::Granted(Grant {
            token: Some(token),
            valid_for: req.lease,
        }))
    }

    async fn try_lock(
        &self,
        conn: &mut AnyConnection,
        name: &str,
    ) -> std::result::Result<bool, sqlx::Error> {
        match self.sql.dialect {
            Dialect::Postgres => sqlx::query("SELECT pg_try_advisory_lock($1)")
                .bind(advisory_key(&self.sql.table, name))
                .fetch_one(conn)
                .await?
                .try_get::<bool, _>(0),
            Dialect::MySql => Ok(
                sqlx::query("SELECT CAST(COALESCE(GET_LOCK(?, 0), 0) AS SIGNED)")
                    .bind(mysql_lock_name(&self.sql.table, name))
                    .fetch_one(conn)
                    .await?
                    .try_get::<i64, _>(0)?
                    == 1,
            ),
        }
    }

    async fn still_busy(&self, name: &str) -> Result<bool> {
        let q = match self.sql.dialect {
            Dialect::Postgres => sqlx::query(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                   AND objsubid = 1 AND database = (SELECT oid FROM pg_database
                                                      WHERE datname = current_database())
                   AND ((classid::bigint << 32) | objid::bigint) = $1)",
            )
            .bind(advisory_key(&self.sql.table, name)),
            Dialect::MySql => {
                sqlx::query("SELECT CAST(COALESCE(IS_FREE_LOCK(?), 1) = 0 AS SIGNED) = 1")
                    .bind(mysql_lock_name(&self.sql.table, name))
            }
        };
        let row = q
            .fetch_one(&self.sql.pool)
            .await
            .map_err(|e| self.sql.err(e))?;
        match self.sql.dialect {
            Dialect::Postgres => row.try_get::<bool, _>(0).map_err(|e| self.sql.err(e)),
            Dialect::MySql => row
                .try_get::<i64, _>(0)
                .map(|v| v == 1)
                .map_err(|e| self.sql.err(e)),
        }
    }

    /// Confirms one session hold on its own connection: alive, the same server session, still
    /// holding the server lock, and not revoked.
    async fn check(&self, h: &SessionHold, lease: Duration, owner: &str) -> Extended {
        let mut guard = h.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            return Extended::Gone;
        };
        let t = &self.sql.table;
        let check = async {
            let row = match self.sql.dialect {
                Dialect::Postgres => {
                    sqlx::query(&format!(
                        "SELECT pg_backend_pid()::bigint, EXISTS (SELECT 1 FROM pg_locks
                           WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
                             AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1),
                           (SELECT state FROM {t} WHERE name = $2 AND owner = $3)"
                    ))
                    .bind(advisory_key(&self.sql.table, &h.name))
                    .bind(h.name.as_str())
                    .bind(owner)
                    .fetch_one(&mut *conn)
                    .await?
                }
                Dialect::MySql => {
                    sqlx::query(&format!(
                        "SELECT CAST(CONNECTION_ID() AS SIGNED),
                            COALESCE(IS_USED_LOCK(?) = CONNECTION_ID(), 0) = 1,
                            (SELECT state FROM {t} WHERE name = ? AND owner = ?)"
                    ))
                    .bind(mysql_lock_name(&self.sql.table, &h.name))
                    .bind(h.name.as_str())
                    .bind(owner)
                    .fetch_one(&mut *conn)
                    .await?
                }
            };
            let pid: i64 = row.try_get(0)?;
            let held = match self.sql.dialect {
                Dialect::Postgres => row.try_get::<bool, _>(1)?,
                Dialect::MySql => row.try_get::<i64, _>(1)? == 1,
            };
            let revoked = row.try_get::<Option<i64>, _>(2)? == Some(STATE_REVOKED);
            if held && pid == h.server_pid && !revoked {
                let now = self.sql.db_now(conn).await?;
                sqlx::query(&self.sql.st.regrant)
                    .bind(expiry(now, lease))
                    .bind(owner)
                    .bind(h.name.as_str())
                    .execute(&mut *conn)
                    .await?;
            }
            Ok::<_, sqlx::Error>((pid, held, revoked))
        };
        match tokio::time::timeout(OP_TIMEOUT, check).await {
            // Revoked: still holding the server lock, which keeps others out until the holder
            // releases it (its acknowledgement) or the session ends.
            Ok(Ok((pid, true, true))) if pid == h.server_pid => Extended::Revoked,
            Ok(Ok((pid, true, false))) if pid == h.server_pid => {
                Extended::Held { valid_for: lease }
            }
            Ok(Ok((pid, _, _))) => {
                if pid != h.server_pid {
                    tracing::error!(
                        name = %h.name, granted_on = h.server_pid, now_on = pid,
                        "the dedicated connection of a session lock now talks to another server \
                         session: a transaction-pooling proxy (pgbouncer in transaction mode?) \
                         breaks session locks; the hold is treated as lost"
                    );
                }
                *guard = None;
                Extended::Gone
            }
            Ok(Err(e)) => {
                tracing::warn!(name = %h.name, error = %e, "session lock connection failed; hold lost");
                *guard = None;
                Extended::Gone
            }
            Err(_) => {
                *guard = None;
                Extended::Gone
            }
        }
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        let h = {
            let mut m = self.holds.lock().unwrap_or_else(|p| p.into_inner());
            match m.get(hold.owner) {
                Some(h) if h.name == hold.name.as_str() => m.remove(hold.owner),
                _ => None,
            }
        };
        let Some(h) = h else {
            return Ok(Released::NotHeld);
        };
        let Some(mut conn) = h.conn.lock().await.take() else {
            return Ok(Released::NotHeld);
        };
        let name = hold.name.as_str();
        let unlocked = async {
            let ok = match self.sql.dialect {
                Dialect::Postgres => sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(advisory_key(&self.sql.table, name))
                    .fetch_one(&mut conn)
                    .await?
                    .try_get::<bool, _>(0)?,
                Dialect::MySql => {
                    sqlx::query("SELECT CAST(COALESCE(RELEASE_LOCK(?), 0) AS SIGNED)")
                        .bind(mysql_lock_name(&self.sql.table, name))
                        .fetch_one(&mut conn)
                        .await?
                        .try_get::<i64, _>(0)?
                        == 1
                }
            };
            sqlx::query(&self.sql.st.del_hold_owner)
                .bind(name)
                .bind(hold.owner)
                .execute(&mut conn)
                .await?;
            Ok::<_, sqlx::Error>(ok)
        }
        .await;
        let _ = conn.close().await;
        match unlocked {
            Ok(true) => {
                self.sql.wake(name).await;
                Ok(Released::Released)
            }
            // A dead connection: the server already freed the lock.
            Ok(false) | Err(_) => Ok(Released::NotHeld),
        }
    }

    /// Replaces the value of `hold`'s row on its own connection, in one statement that also
    /// checks that this session still holds the server lock and that the hold is not revoked.
    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        let Some(h) = self
            .held(hold.owner)
            .filter(|h| h.name == hold.name.as_str())
        else {
            return Ok(Released::NotHeld);
        };
        let mut guard = h.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            return Ok(Released::NotHeld);
        };
        let (t, name) = (&self.sql.table, hold.name.as_str());
        let sql = match self.sql.dialect {
            Dialect::Postgres => format!(
                "UPDATE {t} SET value = $1 WHERE name = $2 AND owner = $3 AND state <> 2
                   AND EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
                     AND pid = pg_backend_pid() AND granted AND objsubid = 1
                     AND ((classid::bigint << 32) | objid::bigint) = $4)"
            ),
            Dialect::MySql => format!(
                "UPDATE {t} SET value = ? WHERE name = ? AND owner = ? AND state <> 2
                   AND IS_USED_LOCK(?) = CONNECTION_ID()"
            ),
        };
        let q = sqlx::query(&sql).bind(value).bind(name).bind(hold.owner);
        let q = match self.sql.dialect {
            Dialect::Postgres => q.bind(advisory_key(t, name)),
            Dialect::MySql => q.bind(mysql_lock_name(t, name)),
        };
        let changed = q
            .execute(&mut *conn)
            .await
            .map_err(|e| self.sql.err(e))?
            .rows_affected();
        drop(guard);
        if changed == 0 {
            return Ok(Released::NotHeld);
        }
        self.sql.wake(name).await;
        Ok(Released::Released)
    }

    /// The server sessions holding `name`'s session lock (PostgreSQL backend pids, MySQL
    /// connection ids).
    async fn lock_holders(&self, name: &str) -> Result<Vec<i64>> {
        Ok(match self.sql.dialect {
            Dialect::Postgres => sqlx::query(
                "SELECT pid::bigint FROM pg_locks
                 WHERE locktype = 'advisory' AND granted AND objsubid = 1
                   AND ((classid::bigint << 32) | objid::bigint) = $1",
            )
            .bind(advisory_key(&self.sql.table, name))
            .fetch_all(&self.sql.pool)
            .await
            .map_err(|e| self.sql.err(e))?
            .iter()
            .filter_map(|r| r.try_get(0).ok())
            .collect(),
            Dialect::MySql => {
                let id: Option<i64> = sqlx::query("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
                    .bind(mysql_lock_name(&self.sql.table, name))
                    .fetch_one(&self.sql.pool)
                    .await
                    .map_err(|e| self.sql.err(e))?
                    .try_get(0)
                    .map_err(|e| self.sql.err(e))?;
                id.into_iter().collect()
            }
        })
    }

    /// Session mode's forced release. Revoke marks the holder's row (its next renewal answers
    /// `Revoked`; the server lock keeps others out until the holder releases it or its session
    /// ends); break ends the holder's server session and waits (up to [`BREAK_WAIT`]) until the
    /// server has freed its lock, so the name can be taken as soon as this returns.
    async fn force_release(&self, name: &str, how: Force) -> Result<Forced> {
        let t = &self.sql.table;
        let holders = self.lock_holders(name).await?;
        let n = holders.len() as u64;
        match how {
            Force::Revoke => {
                let revoke = self
                    .sql
                    .dialect
                    .sql(&format!("UPDATE {t} SET state = 2 WHERE name = ?"));
                sqlx::query(&revoke)
                    .bind(name)
                    .execute(&self.sql.pool)
                    .await
                    .map_err(|e| self.sql.err(e))?;
                Ok(Forced {
                    removed: 0,
                    revoked: n,
                    revoked_lease_left_ms: None,
                })
            }
            Force::Break => {
                for id in &holders {
                    let kill = match self.sql.dialect {
                        Dialect::Postgres => format!("SELECT pg_terminate_backend({id})"),
                        Dialect::MySql => format!("KILL CONNECTION {id}"),
                    };
                    (&self.sql.pool)
                        .execute(kill.as_str())
                        .await
                        .map_err(|e| self.sql.err(e))?;
                }
                // The kill returns before the session has ended (PostgreSQL signals the
                // backend; MySQL flags the connection): wait for its lock to be freed.
                let until = Instant::now() + BREAK_WAIT;
                loop {
                    let left = self.lock_holders(name).await?;
                    if !left.iter().any(|id| holders.contains(id)) {
                        break;
                    }
                    if Instant::now() >= until {
                        tracing::warn!(
                            name,
                            "a broken session still held the lock {BREAK_WAIT:?} after its kill"
                        );
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                sqlx::query(&self.sql.st.del_name_holds)
                    .bind(name)
                    .execute(&self.sql.pool)
                    .await
                    .map_err(|e| self.sql.err(e))?;
                self.sql.wake(name).await;
                Ok(Forced {
                    removed: n,
                    ..Forced::default()
                })
            }
        }
    }
}

/// Makes the server end a session-lock connection that has been idle for `lease`
/// (PostgreSQL 14+ `idle_session_timeout`, MySQL/MariaDB `wait_timeout`). Best effort: an older
/// server keeps an idle session until TCP notices the client is gone.
async fn idle_limit(d: Dialect, conn: &mut AnyConnection, lease: Duration) {
    let set = match d {
        Dialect::Postgres => {
            let ms = lease.as_millis().clamp(1, i32::MAX as u128);
            format!("SET idle_session_timeout = {ms}")
        }
        Dialect::MySql => {
            let secs = lease.as_secs_f64().ceil().clamp(1.0, 31_536_000.0) as u64;
            format!("SET SESSION wait_timeout = {secs}")
        }
    };
    if let Err(e) = conn.execute(set.as_str()).await {
        tracing::debug!(error = %e, "cannot bound the idle time of a session lock's connection");
    }
}

#[async_trait::async_trait]
impl Backend for SessionBackend {
    fn name(&self) -> &'static str {
        self.inner.sql.dialect.name()
    }

    fn capabilities(&self) -> Capabilities {
        // A lock freed by a dying session sends no notification.
        Capabilities {
            validity: Validity::Session,
            values: true,
            ..Capabilities::lease(Wakeups::Polling {
                min: POLL_MIN,
                max: POLL_MAX,
            })
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        Box::new(SessionAcquisition {
            store: self.inner.clone(),
            want: Want::new(req),
        })
    }

    fn shared_key(&self) -> Option<String> {
        Some(self.inner.sql.key.clone())
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(OP_TIMEOUT)
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        self.inner.release(hold).await
    }

    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        if detach {
            // A session lock ends with its connection; the core never detaches one.
            return Err(Error::Unsupported(
                "a session lock cannot outlive its holder".into(),
            ));
        }
        let mut out = Vec::with_capacity(holds.len());
        for h in holds {
            let Some(s) = self
                .inner
                .held(h.owner)
                .filter(|s| s.name == h.name.as_str())
            else {
                out.push(Extended::Gone);
                continue;
            };
            let r = self.inner.check(&s, h.lease, h.owner).await;
            if r == Extended::Gone {
                let mut m = self.inner.holds.lock().unwrap_or_else(|p| p.into_inner());
                if m.get(h.owner).is_some_and(|x| Arc::ptr_eq(x, &s)) {
                    m.remove(h.owner);
                }
            }
            out.push(r);
        }
        Ok(out)
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.sql.describe_rows(prefix).await
    }

    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        self.inner.set_value(hold, value).await
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        self.inner.force_release(name.as_str(), how).await
    }
}

/// One session-mode acquisition: a try-lock on a fresh connection per attempt; the core polls.
struct SessionAcquisition {
    store: Arc<Session>,
    want: Want,
}

#[async_trait::async_trait]
impl Acquisition for SessionAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        self.store.acquire(&self.want.req()).await
    }

    async fn changed(&mut self, _busy: &Busy, _until: Instant) -> Result<Watch> {
        Ok(Watch::Poll {
            min: POLL_MIN,
            max: POLL_MAX,
        })
    }

    async fn look(&mut self) -> Result<Option<Look>> {
        let busy = self.store.still_busy(self.want.req().name.as_str()).await?;
        Ok(Some(if busy {
            Look::Busy {
                state: 0,
                place: None,
            }
        } else {
            Look::Free
        }))
    }

    async fn cancel(&mut self) -> Result<()> {
        Ok(())
    }
}
