//! Group commit of the queue entries of one lease: while one transaction that puts entries is in
//! flight, the next ones queue, and go out together in one transaction once it is answered (a
//! client taking thousands of names at once then costs the cluster one raft entry per batch
//! instead of one per name).
//!
//! The queue is the generic group commit (`backend/group.rs`) with one slot per lease: an
//! acquisition that finds no transaction of its lease in flight sends its own at once.
//!
//! A batch is the entries' transactions joined: every entry's compare (its key does not exist
//! yet) and every entry's operations (its put and the reads of its name's queue), which etcd
//! runs in order. A batch holds at most one entry per name: the keys of one transaction share
//! its revision, and a name's queue is ordered by the keys' create revisions. When the joined
//! compare fails (an entry's key exists: an earlier attempt whose answer was lost), each entry
//! is sent alone, as it would have been without the batch, and answered from its own
//! transaction. When the joined transaction fails, each entry is answered with an error of the
//! same kind ([`copy`]), not sent again: a second try would take another call's time.

use super::{transient, EtcdBackend, Session};
use crate::backend::group::{Batcher, Group, Job};
use etcd_client as ec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// etcd's default limit of operations in each part of a transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// The entries of one lease: one transaction in flight at a time.
pub(super) type Queue = Group<Entry, Answer>;

/// A new lease's queue.
pub(super) fn queue() -> Queue {
    Group::new(1)
}

/// One queue entry: an acquisition's transaction.
#[derive(Debug)]
pub(super) struct Entry {
    /// The name's directory (one entry per name in a batch).
    pub(super) dir: String,
    pub(super) name: String,
    pub(super) owner: String,
    /// The key is the lease's plain key of the name (reserved for this entry).
    pub(super) plain: bool,
    /// The key does not exist yet.
    pub(super) compare: ec::Compare,
    /// The put and the reads.
    pub(super) then: Vec<ec::TxnOp>,
    /// What the transaction does when the key exists.
    pub(super) otherwise: Vec<ec::TxnOp>,
}

/// The answer to one entry: whether its compare held, the revision of its transaction and the
/// responses of its operations (`then` or `otherwise`).
pub(super) type Answer = Result<(bool, i64, Vec<ec::TxnOpResponse>), ec::Error>;

/// A lease's queue with its backend, as the flusher's handle.
#[derive(Clone)]
pub(super) struct Lease(pub(super) EtcdBackend, pub(super) Arc<Session>);

impl Batcher for Lease {
    type Item = Entry;
    type Answer = Answer;
    const LIMIT: usize = MAX_TXN_OPS;

    fn group(&self) -> &Queue {
        &self.1.batch
    }

    fn key<'a>(&self, e: &'a Entry) -> Option<&'a str> {
        Some(&e.dir)
    }

    fn cost(&self, e: &Entry) -> usize {
        e.then.len()
    }

    /// The entry's key is never put: the plain key it reserved is free again.
    fn left(&self, e: Entry) {
        if e.plain {
            let mut plain = self.1.plain_keys.lock().unwrap_or_else(|p| p.into_inner());
            plain.remove(&e.name);
        }
    }

    async fn send(&self, batch: Vec<Job<Entry, Answer>>) {
        let (b, s) = (&self.0, &self.1);
        if let [_] = batch.as_slice() {
            for job in batch {
                let _ = job.answer.send(alone(b, s, &job.item).await);
            }
            return;
        }
        // The sweeper counts from the send: an entry's key may appear up to a call after it.
        for j in &batch {
            s.sending(&j.item.name, &j.item.owner);
        }
        let txn = ec::Txn::new()
            .when(
                batch
                    .iter()
                    .map(|j| j.item.compare.clone())
                    .collect::<Vec<_>>(),
            )
            .and_then(
                batch
                    .iter()
                    .flat_map(|j| j.item.then.iter().cloned())
                    .collect::<Vec<_>>(),
            );
        match b.call_txn(txn).await {
            Ok(resp) if resp.succeeded() => {
                let stats = &b.shared.stats;
                stats.joined.fetch_add(1, Ordering::Relaxed);
                stats
                    .joined_entries
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                let rev = resp.header().map_or(0, |h| h.revision());
                let mut responses = resp.op_responses().into_iter();
                for j in batch {
                    let mine: Vec<_> = responses.by_ref().take(j.item.then.len()).collect();
                    let _ = j.answer.send(Ok((true, rev, mine)));
                }
            }
            // A key existed: each entry alone, all at once.
            Ok(_) => {
                futures_util::future::join_all(batch.into_iter().map(|j| async move {
                    let _ = j.answer.send(alone(b, s, &j.item).await);
                }))
                .await;
            }
            // Each entry's answer is the error (its kind kept: the caller tells a lease that
            // is gone and an error that may have let the put through from the others), not a
            // second try that would take another call's time.
            Err(e) => {
                for j in batch {
                    let _ = j.answer.send(Err(copy(&e)));
                }
            }
        }
    }
}

/// Sends one entry as its own transaction.
pub(super) async fn alone(b: &EtcdBackend, s: &Session, e: &Entry) -> Answer {
    s.sending(&e.name, &e.owner);
    let txn = ec::Txn::new()
        .when([e.compare.clone()])
        .and_then(e.then.clone())
        .or_else(e.otherwise.clone());
    b.call_txn(txn).await.map(|resp| {
        let rev = resp.header().map_or(0, |h| h.revision());
        (resp.succeeded(), rev, resp.op_responses())
    })
}

/// An error of the same kind as `e` for another entry of its batch (etcd's errors are not
/// `Clone`): the same gRPC status, an I/O error for a transient one, the same message otherwise.
pub(super) fn copy(e: &ec::Error) -> ec::Error {
    match e {
        ec::Error::GRpcStatus(st) => ec::Error::GRpcStatus(st.clone()),
        ec::Error::LeaseKeepAliveError(m) => ec::Error::LeaseKeepAliveError(m.clone()),
        _ if transient(e) => ec::Error::IoError(std::io::Error::other(e.to_string())),
        _ => ec::Error::InvalidArgs(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::lease_gone;
    use super::*;

    /// (A gRPC status, the lease's "not found" among them, is checked against a real cluster in
    /// the store's tests.)
    #[test]
    fn a_copied_error_keeps_its_kind() {
        let down = ec::Error::IoError(std::io::Error::other("no answer"));
        assert!(transient(&copy(&down)) && !lease_gone(&copy(&down)));
        let other = ec::Error::InvalidArgs("bad".into());
        let c = copy(&other);
        assert!(!transient(&c) && !lease_gone(&c));
        assert!(c.to_string().contains("bad"), "{c}");
        let gone = ec::Error::LeaseKeepAliveError("lease not found".into());
        assert!(lease_gone(&copy(&gone)));
    }
}
