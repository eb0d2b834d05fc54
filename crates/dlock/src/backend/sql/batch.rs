//! Group commit of grants (`backend/group.rs`): while every pooled connection has a grant
//! routine call in flight, the next calls queue, and a batch of them goes out as one transaction
//! of a few statements, whatever its size. A client taking thousands of names at once then costs
//! the server one transaction per batch instead of one routine call (with its own commit) per
//! name. A call that finds a connection's slot free calls the routine as without batching, and
//! so does a batch of one.
//!
//! A batch grants only what the routine would grant itself: an exclusive request (no queue
//! place) on a name with no row at all (no hold, live or expired, and no queue place) and a
//! fence below its end. Every other item of the batch, and every item of a batch that failed
//! (a deadlock with another client's transaction, say), is answered "undecided": its caller
//! calls the routine as it would have, and the routine refuses it, registers it as a waiter or
//! sends it to the full path. Each dialect keeps its routine's way of keeping grants apart:
//!
//! - MySQL/MariaDB: the names' fence rows are locked first (the missing ones created), in the
//!   names' byte order, so two batches lock in one order; one statement then reads whether the
//!   names have holds or queue places, at `READ COMMITTED` (a fresh snapshot: every grant
//!   committed before the locks is seen, as in the routine).
//! - PostgreSQL: one statement looks at the names' rows and fences without a lock; each free
//!   name is then granted by a compare-and-set of its fence row (the first insert of the row,
//!   or an update from the fence the look saw), as the routine grants. A name whose fence moved
//!   meanwhile lost a race and is undecided.
//!
//! The granted names get the next fence each and their holds in one `INSERT`. A grant whose
//! caller went away while its batch ran is released again at once.

use super::common::{bind_hold, placeholders};
use super::config::Dialect;
use super::server::{RegArgs, Sql, HOLD_COLUMNS, HOLD_ROW};
use crate::backend::group::{Batcher, Group, Job};
use crate::backend::{Attempt, Grant, Request, Want};
use sqlx::Row;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The most names in one batch.
const BATCH_MAX: usize = 64;

/// The answer to a queued grant routine call.
#[derive(Debug)]
pub(super) enum Grouped {
    /// Answered (by the batch, or by the routine for a batch of one): the attempt and the
    /// highest token of the holds in the way.
    Decided(Attempt, u64),
    /// Not granted by the batch: call the routine.
    Undecided,
    /// The routine's call (a batch of one) failed with this error.
    Failed(sqlx::Error),
}

/// One queued call: the request, and what it tells the routine about its waiter.
#[derive(Debug)]
pub(super) struct Ask {
    pub(super) want: Want,
    pub(super) reg: Option<RegArgs>,
}

/// The group of one backend: a slot per pooled connection.
pub(super) type Grants = Group<Ask, Grouped>;

/// The backend, as the flusher's handle.
#[derive(Clone)]
pub(super) struct Granting(pub(super) Arc<Sql>);

impl Batcher for Granting {
    type Item = Ask;
    type Answer = Grouped;
    const LIMIT: usize = BATCH_MAX;

    fn group(&self) -> &Grants {
        &self.0.grants
    }

    fn key<'a>(&self, item: &'a Ask) -> Option<&'a str> {
        Some(item.want.name.as_str())
    }

    async fn send(&self, batch: Vec<Job<Ask, Grouped>>) {
        let sql = &self.0;
        if let [_] = batch.as_slice() {
            // The routine's call, as its caller would have made it (a refused waiter registers).
            for job in batch {
                let Ask { want, reg } = &job.item;
                let a = match sql.fast_acquire(&want.req(), reg.as_ref()).await {
                    Ok(Some((a, seen))) => Grouped::Decided(a, seen),
                    Ok(None) => Grouped::Undecided,
                    Err(e) => Grouped::Failed(e),
                };
                self.answer(job, a);
            }
            return;
        }
        let items: Vec<&Want> = batch.iter().map(|j| &j.item.want).collect();
        let granted = match sql.dialect {
            Dialect::MySql => mysql_grant_many(sql, &items).await,
            Dialect::Postgres => pg_grant_many(sql, &items).await,
        };
        let tokens = match granted {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "a batch of grants failed; each calls the routine");
                vec![None; batch.len()]
            }
        };
        let granted = tokens.iter().flatten().count() as u64;
        sql.batched[0].fetch_add(1, Ordering::Relaxed);
        sql.batched[1].fetch_add(granted, Ordering::Relaxed);
        for (job, token) in batch.into_iter().zip(tokens) {
            let a = match token {
                Some(token) => Grouped::Decided(
                    Attempt::Granted(Grant {
                        token: Some(token),
                        valid_for: job.item.want.lease,
                    }),
                    0,
                ),
                None => Grouped::Undecided,
            };
            self.answer(job, a);
        }
    }
}

impl Granting {
    /// Hands `a` to `job`'s caller; a grant whose caller went away while its batch ran is
    /// released again (nobody would renew or release it).
    fn answer(&self, job: Job<Ask, Grouped>, a: Grouped) {
        let Job { item, answer } = job;
        if let Err(Grouped::Decided(Attempt::Granted(_), _)) = answer.send(a) {
            let sql = self.0.clone();
            tokio::spawn(async move {
                let (name, owner) = (item.want.name.as_str(), item.want.owner.as_str());
                if let Err(e) = sql.release_hold(name, owner).await {
                    tracing::debug!(error = %e, name, "releasing an abandoned batched grant");
                }
            });
        }
    }
}

/// Grants what it can of `items` (distinct names) in one MySQL transaction: the token of each
/// granted item, `None` for the others.
async fn mysql_grant_many(sql: &Sql, items: &[&Want]) -> Result<Vec<Option<u64>>, sqlx::Error> {
    let t = &sql.table;
    let mut names: Vec<&str> = items.iter().map(|w| w.name.as_str()).collect();
    names.sort_unstable();
    let mut tx = sql.pool.begin().await?;
    // Lock the names: every grant passes through its fence row's lock.
    let ensure = format!(
        "INSERT INTO {t}_fences (name, fence) VALUES {} ON DUPLICATE KEY UPDATE fence = fence",
        placeholders("(?, 0)", names.len())
    );
    let mut q = sqlx::query(&ensure).persistent(false);
    for n in &names {
        q = q.bind(*n);
    }
    q.execute(&mut *tx).await?;
    let look = format!(
        "SELECT f.name, f.fence, {now}, CAST(EXISTS (SELECT 1 FROM {t} h WHERE h.name = f.name) \
         OR EXISTS (SELECT 1 FROM {t}_queue q WHERE q.name = f.name) AS SIGNED) \
         FROM {t}_fences f WHERE f.name IN ({})",
        placeholders("?", names.len()),
        now = sql.dialect.now_ms(),
    );
    let mut q = sqlx::query(&look).persistent(false);
    for n in &names {
        q = q.bind(*n);
    }
    let mut free: HashMap<String, i64> = HashMap::with_capacity(names.len());
    let mut now = None;
    for row in q.fetch_all(&mut *tx).await? {
        let (name, fence, at, busy): (String, i64, i64, i64) = (
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
        );
        now = Some(at);
        if busy == 0 && fence < i64::MAX {
            free.insert(name, fence);
        }
    }
    let (Some(now), false) = (now, free.is_empty()) else {
        tx.rollback().await?;
        return Ok(vec![None; items.len()]);
    };
    let bump = format!(
        "UPDATE {t}_fences SET fence = fence + 1 WHERE name IN ({})",
        placeholders("?", free.len())
    );
    let mut q = sqlx::query(&bump).persistent(false);
    for n in names.iter().filter(|n| free.contains_key(**n)) {
        q = q.bind(*n);
    }
    q.execute(&mut *tx).await?;
    let tokens = insert_holds(sql, &mut tx, items, now, |n| free.get(n).map(|f| f + 1)).await?;
    tx.commit().await?;
    Ok(tokens)
}

/// Grants what it can of `items` (distinct names) in one PostgreSQL transaction: the token of
/// each granted item, `None` for the others.
async fn pg_grant_many(sql: &Sql, items: &[&Want]) -> Result<Vec<Option<u64>>, sqlx::Error> {
    let (t, d) = (&sql.table, sql.dialect);
    // Plain index scans, as in the routines (`fast.rs`).
    let mut tx = sql
        .pool
        .begin_with("BEGIN; SET LOCAL enable_bitmapscan = off")
        .await?;
    let look = d.sql(&format!(
        "SELECT v.name, f.fence, {now}, CAST(CASE WHEN EXISTS (SELECT 1 FROM {t} h \
         WHERE h.name = v.name) OR EXISTS (SELECT 1 FROM {t}_queue q WHERE q.name = v.name) \
         THEN 1 ELSE 0 END AS BIGINT) \
         FROM (VALUES {}) AS v(name) LEFT JOIN {t}_fences f ON f.name = v.name",
        placeholders("(CAST(? AS TEXT))", items.len()),
        now = d.now_ms(),
    ));
    let mut q = sqlx::query(&look).persistent(false);
    for w in items {
        q = q.bind(w.name.as_str());
    }
    let (mut first, mut next, mut now) = (Vec::new(), Vec::new(), None);
    for row in q.fetch_all(&mut *tx).await? {
        let (name, fence, at, busy): (String, Option<i64>, i64, i64) = (
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
        );
        now = Some(at);
        match (busy, fence) {
            (0, None) => first.push(name),
            (0, Some(f)) if f < i64::MAX => next.push((name, f)),
            _ => {}
        }
    }
    // The compare-and-set of each free name's fence: what comes back was won.
    let mut won: HashMap<String, i64> = HashMap::new();
    if !first.is_empty() {
        let insert = d.sql(&format!(
            "INSERT INTO {t}_fences (name, fence) VALUES {} ON CONFLICT (name) DO NOTHING \
             RETURNING name, fence",
            placeholders("(?, 1)", first.len())
        ));
        let mut q = sqlx::query(&insert).persistent(false);
        for n in &first {
            q = q.bind(n.as_str());
        }
        for row in q.fetch_all(&mut *tx).await? {
            won.insert(row.try_get(0)?, row.try_get(1)?);
        }
    }
    if !next.is_empty() {
        let update = d.sql(&format!(
            "UPDATE {t}_fences f SET fence = f.fence + 1 FROM (VALUES {}) AS v(name, fence) \
             WHERE f.name = v.name AND f.fence = v.fence RETURNING f.name, f.fence",
            placeholders("(CAST(? AS TEXT), CAST(? AS BIGINT))", next.len())
        ));
        let mut q = sqlx::query(&update).persistent(false);
        for (n, f) in &next {
            q = q.bind(n.as_str()).bind(*f);
        }
        for row in q.fetch_all(&mut *tx).await? {
            won.insert(row.try_get(0)?, row.try_get(1)?);
        }
    }
    let (Some(now), false) = (now, won.is_empty()) else {
        tx.rollback().await?;
        return Ok(vec![None; items.len()]);
    };
    let tokens = insert_holds(sql, &mut tx, items, now, |n| won.get(n).copied()).await?;
    tx.commit().await?;
    Ok(tokens)
}

/// Inserts the holds of the granted `items` (those `token_of` gives a token, by name) in one
/// statement; the token of each item, `None` for the others.
async fn insert_holds(
    sql: &Sql,
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    items: &[&Want],
    now: i64,
    token_of: impl Fn(&str) -> Option<i64>,
) -> Result<Vec<Option<u64>>, sqlx::Error> {
    let tokens: Vec<Option<i64>> = items.iter().map(|w| token_of(w.name.as_str())).collect();
    let granted: Vec<(Request<'_>, i64)> = items
        .iter()
        .zip(&tokens)
        .filter_map(|(w, t)| t.map(|t| (w.req(), t)))
        .collect();
    let insert = sql.dialect.sql(&format!(
        "INSERT INTO {} ({HOLD_COLUMNS}) VALUES {}",
        sql.table,
        placeholders(HOLD_ROW, granted.len())
    ));
    let mut q = sqlx::query(&insert).persistent(false);
    for (req, token) in &granted {
        q = bind_hold(q, req, *token, now, now);
    }
    q.execute(&mut **tx).await?;
    Ok(tokens
        .into_iter()
        .map(|t| t.and_then(|t| u64::try_from(t).ok()))
        .collect())
}
