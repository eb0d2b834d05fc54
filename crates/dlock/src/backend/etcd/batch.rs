//! Group commit of the queue entries of one lease: while one transaction that puts entries is in
//! flight, the next ones queue, and go out together in one transaction once it is answered (a
//! client taking thousands of names at once then costs the cluster one raft entry per batch
//! instead of one per name).
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
use etcd_client as ec;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// etcd's default limit of operations in each part of a transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// The entries waiting for the next transaction of a lease.
#[derive(Debug, Default)]
pub(super) struct Queue {
    entries: VecDeque<Waiting>,
    /// A flusher task runs (it sends what queues until the queue is empty).
    flushing: bool,
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

struct Waiting {
    entry: Entry,
    answer: tokio::sync::oneshot::Sender<Answer>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.entry.fmt(f)
    }
}

/// Queues `entry` on the lease `s`, starting a flusher if none runs; the answer comes when its
/// transaction (joined or alone) was answered.
pub(super) fn submit(
    b: &EtcdBackend,
    s: &Arc<Session>,
    entry: Entry,
) -> tokio::sync::oneshot::Receiver<Answer> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let start = {
        let mut q = s.batch.lock().unwrap_or_else(|p| p.into_inner());
        q.entries.push_back(Waiting { entry, answer: tx });
        !std::mem::replace(&mut q.flushing, true)
    };
    if start {
        tokio::spawn(flush(b.clone(), s.clone()));
    }
    rx
}

/// Sends batches until the queue is empty.
async fn flush(b: EtcdBackend, s: Arc<Session>) {
    loop {
        let batch = take(&s);
        if batch.is_empty() {
            return;
        }
        send(&b, &s, batch).await;
    }
}

/// The next batch: entries in the order they came, at most one per name and at most
/// [`MAX_TXN_OPS`] operations. An entry whose acquisition is gone is dropped unsent (its key is
/// then never put, and the plain key it reserved is free again). Clears `flushing` when nothing
/// is left.
fn take(s: &Session) -> Vec<Waiting> {
    let mut gone = Vec::new();
    let batch = {
        let mut q = s.batch.lock().unwrap_or_else(|p| p.into_inner());
        pick(&mut q, &mut gone)
    };
    let mut plain = s.plain_keys.lock().unwrap_or_else(|p| p.into_inner());
    for e in gone.into_iter().filter(|e| e.plain) {
        plain.remove(&e.name);
    }
    batch
}

fn pick(q: &mut Queue, gone: &mut Vec<Entry>) -> Vec<Waiting> {
    let mut batch: Vec<Waiting> = Vec::new();
    let mut names = HashSet::new();
    let mut ops = 0;
    let mut kept = VecDeque::new();
    while let Some(w) = q.entries.pop_front() {
        if w.answer.is_closed() {
            gone.push(w.entry);
            continue;
        }
        let fits = batch.len() < MAX_TXN_OPS && ops + w.entry.then.len() <= MAX_TXN_OPS;
        if fits && !names.contains(&w.entry.dir) {
            ops += w.entry.then.len();
            names.insert(w.entry.dir.clone());
            batch.push(w);
        } else {
            kept.push_back(w);
        }
    }
    q.entries = kept;
    if batch.is_empty() {
        q.flushing = false;
    }
    batch
}

/// Sends one batch (a lone entry as its own transaction) and answers its entries.
async fn send(b: &EtcdBackend, s: &Session, batch: Vec<Waiting>) {
    if batch.len() > 1 {
        // The sweeper counts from the send: an entry's key may appear up to a call after it.
        for w in &batch {
            s.sending(&w.entry.name, &w.entry.owner);
        }
        let txn = ec::Txn::new()
            .when(
                batch
                    .iter()
                    .map(|w| w.entry.compare.clone())
                    .collect::<Vec<_>>(),
            )
            .and_then(
                batch
                    .iter()
                    .flat_map(|w| w.entry.then.iter().cloned())
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
                for w in batch {
                    let mine: Vec<_> = responses.by_ref().take(w.entry.then.len()).collect();
                    let _ = w.answer.send(Ok((true, rev, mine)));
                }
            }
            // A key existed: each entry alone, all at once.
            Ok(_) => {
                futures_util::future::join_all(batch.into_iter().map(|w| alone(b, s, w))).await;
            }
            // Each entry's answer is the error (its kind kept: the caller tells a lease that
            // is gone and an error that may have let the put through from the others), not a
            // second try that would take another call's time.
            Err(e) => {
                for w in batch {
                    let _ = w.answer.send(Err(copy(&e)));
                }
            }
        }
        return;
    }
    for w in batch {
        alone(b, s, w).await;
    }
}

/// Sends one entry as its own transaction and answers it.
async fn alone(b: &EtcdBackend, s: &Session, w: Waiting) {
    s.sending(&w.entry.name, &w.entry.owner);
    let txn = ec::Txn::new()
        .when([w.entry.compare.clone()])
        .and_then(w.entry.then.clone())
        .or_else(w.entry.otherwise.clone());
    let answer = b.call_txn(txn).await.map(|resp| {
        let rev = resp.header().map_or(0, |h| h.revision());
        (resp.succeeded(), rev, resp.op_responses())
    });
    let _ = w.answer.send(answer);
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

    fn entry(name: &str, ops: usize) -> (Waiting, tokio::sync::oneshot::Receiver<Answer>) {
        let (answer, rx) = tokio::sync::oneshot::channel();
        let key = format!("p/{name}/1");
        let entry = Entry {
            dir: format!("p/{name}/"),
            name: name.to_owned(),
            owner: "o".to_owned(),
            plain: true,
            compare: ec::Compare::create_revision(key.clone(), ec::CompareOp::Equal, 0),
            then: (0..ops)
                .map(|_| ec::TxnOp::get(key.clone(), None))
                .collect(),
            otherwise: Vec::new(),
        };
        (Waiting { entry, answer }, rx)
    }

    /// A batch takes entries in order, one per name and at most 128 operations; an entry
    /// whose acquisition is gone is set aside unsent; `flushing` ends with an empty queue.
    #[test]
    fn a_batch_is_one_entry_per_name_within_the_limit() {
        let mut q = Queue {
            flushing: true,
            ..Queue::default()
        };
        let mut rxs = Vec::new();
        for name in ["a", "b", "a", "gone"] {
            let (w, rx) = entry(name, 3);
            q.entries.push_back(w);
            rxs.push(rx);
        }
        drop(rxs.pop());
        for i in 0..50 {
            let (w, rx) = entry(&format!("n{i}"), 3);
            q.entries.push_back(w);
            rxs.push(rx);
        }
        let mut gone = Vec::new();
        let first = pick(&mut q, &mut gone);
        let names: Vec<&str> = first.iter().map(|w| w.entry.name.as_str()).collect();
        // a, b, then n0.. up to 42 entries of 3 operations (126 of 128).
        assert_eq!(names.len(), 42, "{names:?}");
        assert_eq!(&names[..3], ["a", "b", "n0"]);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].name, "gone");
        // The second "a" and the rest wait for the next batch, in order.
        let second = pick(&mut q, &mut gone);
        assert_eq!(second[0].entry.name, "a");
        assert_eq!(second.len(), 1 + 50 - 40);
        assert!(q.flushing);
        assert!(pick(&mut q, &mut gone).is_empty());
        assert!(!q.flushing, "an empty queue ends the flusher");
    }

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
