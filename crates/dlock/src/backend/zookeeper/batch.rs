//! Group commit of the creates under lock nodes the backend has not seen (a burst of new names,
//! such as a client taking thousands of names at once): while one such `multi` is in flight, the
//! next ones queue, and go out together in one `multi` once it is answered. Many new names then
//! cost one transaction of the ensemble instead of one each.
//!
//! The queue is the generic group commit (`backend/group.rs`) with one slot per session: a
//! create that finds no `multi` of its session in flight sends its own at once.
//!
//! A batch holds at most one create per lock node: the nodes of one transaction share its zxid,
//! the fencing token, which must grow from one holder of a name to the next.

use super::{send_multi, MultiOutcome, Parent, Session, Via, ZooKeeperBackend};
use crate::backend::group::{Batcher, Group, Job};
use std::sync::Arc;
use zookeeper_client as zk;

/// The most creates (of lock node and child each) in one `multi`.
const BATCH_MAX: usize = 64;

/// The creates of one session: one `multi` of them in flight at a time.
pub(super) type Queue = Group<Op, Answer>;

/// A new session's queue.
pub(super) fn queue() -> Queue {
    Group::new(1)
}

/// One create of a lock node and its child (the owner's node).
#[derive(Debug)]
pub(super) struct Op {
    pub(super) lock_path: String,
    pub(super) child: String,
    pub(super) data: Vec<u8>,
}

/// What became of a queued create.
#[derive(Debug)]
pub(super) enum Answer {
    /// Sent: the results of its two operations, or which one the server refused and why.
    Done(Result<MultiOutcome, zk::Error>),
    /// Not sent: the lock node is known by now, so the create goes under it.
    Again,
}

/// A session's queue with its backend, as the flusher's handle.
#[derive(Clone)]
pub(super) struct Creates(pub(super) ZooKeeperBackend, pub(super) Arc<Session>);

impl Batcher for Creates {
    type Item = Op;
    type Answer = Answer;
    const LIMIT: usize = BATCH_MAX;

    fn group(&self) -> &Queue {
        &self.1.batch
    }

    fn key<'a>(&self, op: &'a Op) -> Option<&'a str> {
        Some(&op.lock_path)
    }

    fn settled(&self, op: &Op) -> Option<Answer> {
        self.0.parent(&op.lock_path).map(|_| Answer::Again)
    }

    async fn send(&self, batch: Vec<Job<Op, Answer>>) {
        send(&self.0, &self.1, batch).await
    }
}

fn add(m: &mut zk::MultiWriter<'_>, op: &Op) -> Result<(), zk::Error> {
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let child = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    m.add_create(&op.lock_path, &[], &container)?;
    m.add_create(&op.child, &op.data, &child)
}

/// Sends one create in a `multi` of its own.
async fn one(s: &Session, op: &Op) -> Result<MultiOutcome, zk::Error> {
    let mut m = s.client.new_multi_writer();
    match add(&mut m, op) {
        Ok(()) => s.run(Via::Leader, send_multi(&mut m)).await,
        Err(e) => Err(e),
    }
}

/// [`one`], for a caller that runs alone; notes what the answer says of the lock node.
pub(super) async fn alone(
    b: &ZooKeeperBackend,
    s: &Session,
    op: &Op,
) -> Result<MultiOutcome, zk::Error> {
    let r = one(s, op).await;
    note(b, op, &r);
    r
}

/// Sends one batch as one `multi` and answers each create. When the server refuses one create
/// (its lock node was there, say), the transaction did nothing: that create gets the refusal,
/// and the others are sent again at once, each in a `multi` of its own.
async fn send(b: &ZooKeeperBackend, s: &Session, ops: Vec<Job<Op, Answer>>) {
    let mut m = s.client.new_multi_writer();
    for j in &ops {
        if let Err(e) = add(&mut m, &j.item) {
            for j in ops {
                answer(b, s, j, Err(e.clone()));
            }
            return;
        }
    }
    match s.run(Via::Leader, send_multi(&mut m)).await {
        Ok(Ok(results)) => {
            let mut results = results.into_iter();
            for j in ops {
                let two = results.by_ref().take(2).collect();
                answer(b, s, j, Ok(Ok(two)));
            }
        }
        Ok(Err((i, e))) => {
            let (refused, mut others) = (i / 2, Vec::new());
            for (k, j) in ops.into_iter().enumerate() {
                if k == refused {
                    answer(b, s, j, Ok(Err((i % 2, e.clone()))));
                } else {
                    others.push(j);
                }
            }
            let each = others.into_iter().map(|j| async move {
                let r = one(s, &j.item).await;
                answer(b, s, j, r);
            });
            futures_util::future::join_all(each).await;
        }
        Err(e) => {
            for j in ops {
                answer(b, s, j, Err(e.clone()));
            }
        }
    }
}

/// Notes what a create's answer says of its lock node: the creates queued behind it for the
/// same name go under it.
fn note(b: &ZooKeeperBackend, op: &Op, r: &Result<MultiOutcome, zk::Error>) {
    if let Ok(Ok(_)) | Ok(Err((0, zk::Error::NodeExists))) = r {
        b.note_parent(&op.lock_path, Some(Parent::Writable));
    }
}

/// Notes what the answer says of the lock node and hands it over; a node created for an
/// acquisition that went away meanwhile is deleted again.
fn answer(
    b: &ZooKeeperBackend,
    s: &Session,
    j: Job<Op, Answer>,
    r: Result<MultiOutcome, zk::Error>,
) {
    note(b, &j.item, &r);
    if let Err(Answer::Done(Ok(Ok(results)))) = j.answer.send(Answer::Done(r)) {
        for res in results {
            if let zk::MultiWriteResult::Create { path, .. } = res {
                if path != j.item.lock_path {
                    let client = s.client.clone();
                    tokio::spawn(async move {
                        let _ = client.delete(&path, None).await;
                    });
                }
            }
        }
    }
}
