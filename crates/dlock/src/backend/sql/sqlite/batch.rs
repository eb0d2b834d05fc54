//! Group commit of attempts. While an attempt of a backend has its write transaction under way,
//! the attempts that arrive on that backend queue, and the next transaction decides them all (at
//! most [`BATCH_MAX`]) before its one `COMMIT`: a burst of acquisitions (a client taking
//! thousands of names at once) then costs one synced commit per batch instead of one each. An
//! attempt that finds no transaction of its backend under way runs its own at once, in its
//! caller's task, as without batching (the group commit of `backend/group.rs`, one slot per
//! backend, no per-name rule).
//!
//! A batch decides its attempts in arrival order, each against what the ones before it wrote, so
//! two attempts of one name in a batch exclude each other like two transactions would, and each
//! grant takes the next fence. Every attempt of a batch counts its lease from the batch's clock
//! read, taken once the write lock is held, which is after each of them was sent.
//!
//! An attempt the grant rule answers with an error (another kind of lock on the name, a row no
//! dlock writes) gets that error and wrote nothing. An SQL error inside the batch (a full disk,
//! say) rolls it back, and each of its attempts then runs in a transaction of its own, so each
//! gets its own answer. When the write lock could not be had at all, every attempt of the batch
//! gets that answer. An attempt whose caller went away before its batch started is left out; one
//! whose caller went away while its batch ran has what the batch wrote for it removed (its hold
//! and its queue place, by owner).

use super::{now_ms, SqliteBackend};
use crate::backend::group::{self, Batcher, Entered, Group, Job};
use crate::backend::sql::common::TxError;
use crate::backend::{Attempt, Request, Want};
use crate::error::{Error, Result};

/// The most attempts in one transaction (the write lock is held while they are decided).
pub(super) const BATCH_MAX: usize = 64;

/// The attempts of one backend: one write transaction of its own under way at a time.
pub(super) type Queue = Group<Want, Result<Attempt>>;

/// A new backend's queue.
pub(super) fn queue() -> std::sync::Arc<Queue> {
    std::sync::Arc::new(Group::new(1))
}

impl Batcher for SqliteBackend {
    type Item = Want;
    type Answer = Result<Attempt>;
    const LIMIT: usize = BATCH_MAX;

    fn group(&self) -> &Queue {
        &self.batch
    }

    async fn send(&self, batch: Vec<Job<Want, Result<Attempt>>>) {
        self.run_batch(batch).await
    }
}

impl SqliteBackend {
    /// `req`'s attempt: in a transaction of its own when none of this backend's is under way,
    /// else in the next batch.
    pub(super) async fn attempt_grouped(&self, req: &Request<'_>) -> Result<Attempt> {
        match group::enter(self, || Want::new(req)) {
            Entered::Queued(rx) => rx.await.unwrap_or_else(|_| {
                Err(Error::Unavailable(
                    "the sqlite store's batch of attempts ended without an answer (its runtime \
                     is shutting down)"
                        .into(),
                ))
            }),
            Entered::Alone(_turn, _) => Self::busy_answer(self.acquire_alone(req).await),
        }
    }

    /// Runs one batch and answers each of its attempts.
    async fn run_batch(&self, jobs: Vec<Job<Want, Result<Attempt>>>) {
        #[cfg(test)]
        self.batches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tx = match self.begin_write().await {
            Ok(tx) => tx,
            Err(e) => {
                for job in jobs {
                    let e = share(&e);
                    self.answer(job, Self::busy_answer(Err(e))).await;
                }
                return;
            }
        };
        let now = now_ms();
        let mut answers = Vec::with_capacity(jobs.len());
        let mut failed = false;
        for job in &jobs {
            match self.grant_in(&mut tx, &job.item.req(), now).await {
                Ok(a) => answers.push(Ok(a)),
                Err(TxError::Dlock(e)) => answers.push(Err(e)),
                Err(TxError::Sql(e)) => {
                    tracing::debug!(error = %e, "sqlite batch of attempts failed; each runs alone");
                    failed = true;
                    break;
                }
            }
        }
        if !failed {
            match tx.commit().await {
                Ok(()) => {
                    for (job, a) in jobs.into_iter().zip(answers) {
                        self.answer(job, a).await;
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "sqlite batch commit failed; each runs alone");
                }
            }
        } else {
            drop(tx); // rolled back
        }
        for job in jobs {
            if job.answer.is_closed() {
                continue;
            }
            let a = Self::busy_answer(self.acquire_alone(&job.item.req()).await);
            self.answer(job, a).await;
        }
    }

    /// Hands `a` to `job`'s caller; when it went away, removes what the attempt wrote for it.
    async fn answer(&self, job: Job<Want, Result<Attempt>>, a: Result<Attempt>) {
        let Job { item: want, answer } = job;
        if answer.send(a).is_err() {
            let r = self
                .remove_owner(want.name.as_str(), &want.owner, true)
                .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "removing an abandoned attempt's grant");
            }
        }
    }
}

/// `e` again, for the next attempt of a batch that all failed with it.
fn share(e: &Error) -> Error {
    match e {
        Error::Unavailable(s) => Error::Unavailable(s.clone()),
        Error::InvalidConfig(s) => Error::InvalidConfig(s.clone()),
        Error::Backend(inner) => Error::backend(inner.to_string()),
        other => Error::backend(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sql::sqlite::tests::refuse_holds;
    use crate::backend::test_support::*;
    use crate::backend::{Backend, LockKind, Mode};
    use std::path::Path;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    async fn open(path: &Path) -> SqliteBackend {
        SqliteBackend::open(path).await.unwrap()
    }

    /// Holds the file's write lock from another backend until dropped or rolled back.
    async fn blocker(path: &Path) -> sqlx::Transaction<'static, sqlx::Sqlite> {
        let a = open(path).await;
        let mut tx = a.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        tx
    }

    /// Waits (at most 3 s) until `ok` holds of `b`'s queue.
    async fn until_queue(b: &SqliteBackend, ok: impl Fn(&Queue) -> bool) {
        let end = Instant::now() + Duration::from_secs(3);
        while !ok(&b.batch) {
            assert!(Instant::now() < end, "the queue never got there");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A task attempting `n` as `owner` on `b` (a plain mutex, or `kind`).
    fn spawn_attempt(
        b: &SqliteBackend,
        n: &str,
        owner: &str,
        kind: LockKind,
    ) -> tokio::task::JoinHandle<Result<Attempt>> {
        let (b, n, owner) = (b.clone(), name(n), owner.to_owned());
        tokio::spawn(async move {
            let m = meta("batch");
            let mode = match kind {
                LockKind::Semaphore { .. } => Mode::Shared,
                _ => Mode::Exclusive,
            };
            let r = Request {
                kind,
                mode,
                ..rq(&n, &owner, &m)
            };
            b.attempt_grouped(&r).await
        })
    }

    async fn held_names(b: &SqliteBackend) -> Vec<String> {
        let all = b.describe("").await.unwrap();
        all.into_iter().map(|l| l.name).collect()
    }

    async fn fence_rows(b: &SqliteBackend, n: &str) -> Vec<i64> {
        sqlx::query_scalar("SELECT fence FROM dlock_fences WHERE name = ?")
            .bind(n)
            .fetch_all(&b.pool)
            .await
            .unwrap()
    }

    /// The first attempt takes the turn and waits for the write lock another backend holds; the
    /// attempts that arrive meanwhile queue, and then all go in one transaction.
    async fn first_and_queued(
        path: &Path,
        queued: &[(&str, &str, LockKind)],
    ) -> (
        SqliteBackend,
        Result<Attempt>,
        Vec<((String, String), Result<Attempt>)>,
    ) {
        let b = open(path).await;
        let block = blocker(path).await;
        let first = spawn_attempt(&b, "first", "o-first", LockKind::Mutex);
        until_queue(&b, |q| q.busy() == 1).await;
        let tasks: Vec<_> = queued
            .iter()
            .map(|(n, o, k)| ((n.to_string(), o.to_string()), spawn_attempt(&b, n, o, *k)))
            .collect();
        until_queue(&b, |q| q.queued() == queued.len()).await;
        block.rollback().await.unwrap();
        let first = first.await.unwrap();
        let mut answers = Vec::new();
        for (key, t) in tasks {
            answers.push((key, t.await.unwrap()));
        }
        until_queue(&b, |q| q.busy() == 0).await;
        (b, first, answers)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn attempts_that_arrive_during_a_transaction_share_the_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let owners: Vec<(String, String)> = (0..20)
            .map(|i| (format!("n{i}"), format!("o{i}")))
            .chain((0..2).map(|i| ("twice".to_owned(), format!("t{i}"))))
            .collect();
        let queued: Vec<_> = owners
            .iter()
            .map(|(n, o)| (n.as_str(), o.as_str(), LockKind::Mutex))
            .collect();
        let (b, first, answers) = first_and_queued(&path, &queued).await;
        assert_eq!(token(first.unwrap()), 1);
        assert_eq!(b.batches.load(Ordering::Relaxed), 1, "one batch for all 22");
        let mut twice = Vec::new();
        for ((n, _), a) in answers {
            match n.as_str() {
                "twice" => twice.push(a.unwrap()),
                _ => assert_eq!(token(a.unwrap()), 1, "{n}"),
            }
        }
        // Two attempts of one name in one batch: one grant, one refusal, one fence.
        let granted = twice
            .iter()
            .filter(|a| matches!(a, Attempt::Granted(_)))
            .count();
        assert_eq!(granted, 1, "{twice:?}");
        assert_eq!(fence_rows(&b, "twice").await, vec![1]);
        let info = b.describe("").await.unwrap();
        assert_eq!(info.len(), 22);
        assert!(info.iter().all(|l| l.holders.len() == 1));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_refused_kind_in_a_batch_answers_only_its_own_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let b = open(&path).await;
        let m = meta("m");
        let k = name("k");
        token(b.attempt_grouped(&rq(&k, "holder", &m)).await.unwrap());
        drop(b);
        let sem = LockKind::Semaphore { permits: 2 };
        let queued = [
            ("a", "oa", LockKind::Mutex),
            ("k", "ok", sem),
            ("c", "oc", LockKind::Mutex),
        ];
        let (b, _, answers) = first_and_queued(&path, &queued).await;
        assert_eq!(b.batches.load(Ordering::Relaxed), 1);
        for ((n, _), a) in answers {
            match n.as_str() {
                "k" => assert!(matches!(a, Err(Error::InvalidConfig(_))), "{a:?}"),
                _ => assert_eq!(token(a.unwrap()), 1, "{n}"),
            }
        }
        assert_eq!(fence_rows(&b, "k").await, vec![1]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_sql_error_in_a_batch_runs_each_attempt_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let b = open(&path).await;
        // The hold of one name cannot be written: its statement fails inside the batch.
        refuse_holds(&b, "NEW.name = 'boom'", "no holds of boom").await;
        drop(b);
        let queued = [
            ("a", "oa", LockKind::Mutex),
            ("boom", "ob", LockKind::Mutex),
            ("c", "oc", LockKind::Mutex),
        ];
        let (b, _, answers) = first_and_queued(&path, &queued).await;
        assert_eq!(b.batches.load(Ordering::Relaxed), 1);
        for ((n, _), a) in answers {
            match n.as_str() {
                "boom" => {
                    let e = a.unwrap_err();
                    assert!(e.to_string().contains("no holds of boom"), "{e}");
                }
                // The batch's writes were rolled back: each fence was taken once, alone.
                _ => assert_eq!(token(a.unwrap()), 1, "{n}"),
            }
        }
        assert!(fence_rows(&b, "boom").await.is_empty());
        assert_eq!(held_names(&b).await, ["a", "c", "first"]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_attempt_whose_caller_went_away_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let b = open(&path).await;
        // Gone while queued: left out of the batch.
        let block = blocker(&path).await;
        let first = spawn_attempt(&b, "first", "o-first", LockKind::Mutex);
        until_queue(&b, |q| q.busy() == 1).await;
        let gone = spawn_attempt(&b, "gone", "o-gone", LockKind::Mutex);
        let kept = spawn_attempt(&b, "kept", "o-kept", LockKind::Mutex);
        until_queue(&b, |q| q.queued() == 2).await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        block.rollback().await.unwrap();
        token(first.await.unwrap().unwrap());
        token(kept.await.unwrap().unwrap());
        until_queue(&b, |q| q.busy() == 0).await;
        assert!(
            fence_rows(&b, "gone").await.is_empty(),
            "it was never decided"
        );

        // Gone while its batch ran: granted, then removed.
        let (answer, rx) = tokio::sync::oneshot::channel();
        drop(rx);
        let m = meta("m");
        let n = name("late");
        let item = Want::new(&rq(&n, "o-late", &m));
        b.run_batch(vec![Job { item, answer }]).await;
        assert_eq!(fence_rows(&b, "late").await, vec![1], "it was granted");
        assert_eq!(held_names(&b).await, ["first", "kept"]);
    }
}
