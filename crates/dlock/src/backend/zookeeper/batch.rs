//! Group commit of the creates under lock nodes the backend has not seen (a burst of new names,
//! such as a client taking thousands of names at once): while one such `multi` is in flight, the
//! next ones queue, and go out together in one `multi` once it is answered. Many new names then
//! cost one transaction of the ensemble instead of one each.
//!
//! A batch holds at most one create per lock node: the nodes of one transaction share its zxid,
//! the fencing token, which must grow from one holder of a name to the next.

use super::{send_multi, MultiOutcome, Parent, Session, Via, ZooKeeperBackend};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use zookeeper_client as zk;

/// The most creates (of lock node and child each) in one `multi`.
const BATCH_MAX: usize = 64;

/// The creates waiting for the next `multi` of a session.
#[derive(Debug, Default)]
pub(super) struct Queue {
    ops: VecDeque<Op>,
    /// A flusher task runs (it sends what queues until the queue is empty).
    flushing: bool,
}

/// One create of a lock node and its child (the owner's node).
#[derive(Debug)]
struct Op {
    lock_path: String,
    child: String,
    data: Vec<u8>,
    answer: tokio::sync::oneshot::Sender<Answer>,
}

/// What became of a queued create.
#[derive(Debug)]
pub(super) enum Answer {
    /// Sent: the results of its two operations, or which one the server refused and why.
    Done(Result<MultiOutcome, zk::Error>),
    /// Not sent: the lock node is known by now, so the create goes under it.
    Again,
}

/// Queues the create of `lock_path` with the child `child` (a sequential path) in `s`, starting
/// a flusher if none runs.
pub(super) fn submit(
    b: &ZooKeeperBackend,
    s: &Arc<Session>,
    lock_path: &str,
    child: &str,
    data: Vec<u8>,
) -> tokio::sync::oneshot::Receiver<Answer> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let start = {
        let mut q = s.batch.lock().unwrap_or_else(|p| p.into_inner());
        q.ops.push_back(Op {
            lock_path: lock_path.to_owned(),
            child: child.to_owned(),
            data,
            answer: tx,
        });
        !std::mem::replace(&mut q.flushing, true)
    };
    if start {
        tokio::spawn(flush(b.clone(), s.clone()));
    }
    rx
}

/// Sends batches until the queue is empty.
async fn flush(b: ZooKeeperBackend, s: Arc<Session>) {
    loop {
        let ops = take(&b, &s);
        if ops.is_empty() {
            return;
        }
        send(&b, &s, ops).await;
    }
}

/// The next batch: at most [`BATCH_MAX`] creates, one per lock node. Creates whose acquisition
/// went away are dropped, and those under a lock node known by now are answered `Again`. An
/// empty batch ends the flusher (under the queue's lock, so a create queued later starts one).
fn take(b: &ZooKeeperBackend, s: &Session) -> Vec<Op> {
    let mut q = s.batch.lock().unwrap_or_else(|p| p.into_inner());
    let (mut ops, mut rest, mut paths) = (Vec::new(), VecDeque::new(), HashSet::new());
    for op in q.ops.drain(..) {
        if op.answer.is_closed() {
            continue;
        }
        if b.parent(&op.lock_path).is_some() {
            let _ = op.answer.send(Answer::Again);
            continue;
        }
        if ops.len() < BATCH_MAX && paths.insert(op.lock_path.clone()) {
            ops.push(op);
        } else {
            rest.push_back(op);
        }
    }
    q.ops = rest;
    if ops.is_empty() {
        q.flushing = false;
    }
    ops
}

fn add(m: &mut zk::MultiWriter<'_>, op: &Op) -> Result<(), zk::Error> {
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let child = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    m.add_create(&op.lock_path, &[], &container)?;
    m.add_create(&op.child, &op.data, &child)
}

/// Sends one batch as one `multi` and answers each create. When the server refuses one create
/// (its lock node was there, say), the transaction did nothing: that create gets the refusal,
/// and the others are sent again at once, each in a `multi` of its own.
async fn send(b: &ZooKeeperBackend, s: &Session, ops: Vec<Op>) {
    let mut m = s.client.new_multi_writer();
    for op in &ops {
        if let Err(e) = add(&mut m, op) {
            for op in ops {
                answer(b, s, op, Err(e.clone()));
            }
            return;
        }
    }
    match s.run(Via::Leader, send_multi(&mut m)).await {
        Ok(Ok(results)) => {
            let mut results = results.into_iter();
            for op in ops {
                let two = results.by_ref().take(2).collect();
                answer(b, s, op, Ok(Ok(two)));
            }
        }
        Ok(Err((i, e))) => {
            let (refused, mut others) = (i / 2, Vec::new());
            for (k, op) in ops.into_iter().enumerate() {
                if k == refused {
                    answer(b, s, op, Ok(Err((i % 2, e.clone()))));
                } else {
                    others.push(op);
                }
            }
            let alone = others.into_iter().map(|op| async move {
                let mut m = s.client.new_multi_writer();
                let r = match add(&mut m, &op) {
                    Ok(()) => s.run(Via::Leader, send_multi(&mut m)).await,
                    Err(e) => Err(e),
                };
                answer(b, s, op, r);
            });
            futures_util::future::join_all(alone).await;
        }
        Err(e) => {
            for op in ops {
                answer(b, s, op, Err(e.clone()));
            }
        }
    }
}

/// Notes what the answer says of the lock node (so that the creates queued behind it for the
/// same name go under it) and hands it over; a node created for an acquisition that went away
/// meanwhile is deleted again.
fn answer(b: &ZooKeeperBackend, s: &Session, op: Op, r: Result<MultiOutcome, zk::Error>) {
    match &r {
        Ok(Ok(_)) | Ok(Err((0, zk::Error::NodeExists))) => {
            b.note_parent(&op.lock_path, Some(Parent::Writable));
        }
        _ => {}
    }
    if let Err(Answer::Done(Ok(Ok(results)))) = op.answer.send(Answer::Done(r)) {
        for res in results {
            if let zk::MultiWriteResult::Create { path, .. } = res {
                if path != op.lock_path {
                    let client = s.client.clone();
                    tokio::spawn(async move {
                        let _ = client.delete(&path, None).await;
                    });
                }
            }
        }
    }
}
