//! The one-step attempt: the common cases of an exclusive request that takes no queue place,
//! in one call to the connection's thread.
//!
//! Every statement sent to SQLite through sqlx is a hand-over to the connection's own thread and
//! back, which costs about as much as the statement itself on a small machine. The full path
//! (`BEGIN IMMEDIATE`, the name's state, the fence, the hold, `COMMIT`) makes five of them; this
//! one sends the whole transaction as one list of statements:
//!
//! 1. `BEGIN IMMEDIATE` (the write lock, as on the full path);
//! 2. the name's expired holds and queue places are deleted (as the full path does);
//! 3. when no hold or queue place of the name is left, its fence moves on by one (or starts
//!    at 1), and the hold is inserted with that fence (its `RETURNING` row, part `'g'`, says so);
//! 4. the name's state, read as [`super::load_state`] reads it (for a refusal's answer);
//! 5. `COMMIT`.
//!
//! Step 3 grants exactly when the grant rule (`logic::decide`) would for such a request: an
//! exclusive request is granted when the name has no live hold and no live queue place ahead of
//! it, and one that takes no queue place has none of its own. Its token is the stored fence plus
//! one: no live hold is left whose token could be higher. Any other answer of the rule that
//! needs a write (a regrant of the owner's own hold) is left to the full path; a refusal that
//! writes nothing is answered from step 4.
//!
//! sqlx does not count a transaction that its statements begin and end themselves: a list cut
//! short (its caller went away, or a statement failed) may leave the connection inside the
//! transaction, holding the database's write lock. Such a connection is closed instead of going
//! back to the pool, which rolls the transaction back.

use super::{machine, now_ms, state_of_name, SqliteBackend, ROWS};
use crate::backend::sql::common::{expiry, kind_columns, Loaded, StateRow};
use crate::backend::{logic::Decision, Attempt, Busy, Grant, Mode, Request};
use crate::error::Result;
use sqlx::pool::PoolConnection;
use sqlx::{FromRow, Sqlite};

/// The transaction of one step. Parameters: `?1` name, `?2` now, `?3` owner, `?4` kind, `?5`
/// permits, `?6` mode, `?7` expiry, `?8` acquired at (wall clock), `?9` client id, `?10` host,
/// `?11` pid, `?12` value. Each statement uses every number up to its highest: sqlx binds a
/// number a statement skips as a positional parameter, which shifts the next statements'
/// arguments.
const ONE_STEP: &str = concat!(
    "BEGIN IMMEDIATE;
DELETE FROM dlock_holds WHERE name = ?1 AND expires_ms <= ?2;
DELETE FROM dlock_queue WHERE name = ?1 AND expires_ms <= ?2;
INSERT INTO dlock_fences (name, fence)
    SELECT ?1, 1
    WHERE NOT EXISTS (SELECT 1 FROM dlock_holds WHERE name = ?1)
      AND NOT EXISTS (SELECT 1 FROM dlock_queue WHERE name = ?1)
    ON CONFLICT (name) DO UPDATE SET fence = fence + 1 WHERE fence < 9223372036854775807;
INSERT INTO dlock_holds (name, owner, kind, permits, mode, fence, expires_ms, acquired_at_ms,
        client_id, host, pid, value)
    SELECT ?1, ?3, ?4, ?5, ?6, fence, ?7, ?8, ?9, ?10, ?11, ?12
    FROM dlock_fences
    WHERE name = ?1 AND changes() = 1
      AND NOT EXISTS (SELECT 1 FROM dlock_holds WHERE name = ?1 AND expires_ms > ?2)
    RETURNING 'g' AS part, owner, kind, permits, mode, fence AS ord, expires_ms;
",
    state_of_name!(),
    ";
COMMIT"
);

/// Whether `req` may take the one step: exclusive, and a refusal writes nothing for it.
pub(super) fn fits(req: &Request<'_>) -> bool {
    req.mode == Mode::Exclusive && !req.takes_queue_place()
}

/// A pooled connection that is closed, not reused, unless the step ran to its end.
struct Step {
    conn: PoolConnection<Sqlite>,
    done: bool,
}

impl Drop for Step {
    fn drop(&mut self) {
        if !self.done {
            self.conn.close_on_drop();
        }
    }
}

impl SqliteBackend {
    /// `req`'s attempt in one step (see the module docs): its answer, or `None` when the grant
    /// rule's answer needs a write the step does not make (the full path then decides).
    pub(super) async fn attempt_in_one_step(&self, req: &Request<'_>) -> Result<Option<Attempt>> {
        let conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let mut step = Step { conn, done: false };
        // After `sent` (the core's start of the lease), so the hold's expiry is never earlier
        // than the client's; a wait for the write lock only makes other holds look live longer.
        let now = now_ms();
        let (kind, permits) = kind_columns(req.kind);
        let q = sqlx::query(ONE_STEP)
            .bind(req.name.as_str())
            .bind(now)
            .bind(req.owner)
            .bind(kind)
            .bind(permits)
            .bind(req.mode.as_str())
            .bind(expiry(now, req.lease))
            .bind(machine::wall_ms())
            .bind(req.meta.client_id.as_str())
            .bind(req.meta.host.as_str())
            .bind(i64::from(req.meta.pid))
            .bind(req.meta.value.as_deref());
        let rows = q
            .fetch_all(&mut *step.conn)
            .await
            .map_err(|e| self.err(e))?;
        step.done = true;
        let mut state = Vec::with_capacity(rows.len());
        for row in &rows {
            let row = StateRow::from_row(row).map_err(|e| self.err(e))?;
            if row.0 == "g" {
                let token = ROWS.token(row.5)?;
                return Ok(Some(Attempt::Granted(Grant {
                    token: Some(token),
                    valid_for: req.lease,
                })));
            }
            state.push(row);
        }
        let Loaded {
            state,
            fence: stored,
            ..
        } = Loaded::split(ROWS, state, now)?;
        let stored = match stored {
            Some(f) => Some(ROWS.token(f)?),
            None => None,
        };
        Ok(match state.decide(req, state.fence(stored), now)? {
            Decision::Busy {
                retry_in,
                enqueue: false,
            } => Some(Attempt::Busy(Busy { retry_in })),
            _ => None,
        })
    }
}
