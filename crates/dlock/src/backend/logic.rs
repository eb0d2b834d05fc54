//! The grant rule of lease-shaped stores that can read a lock's whole state inside one atomic step
//! (the in-memory store, SQLite; SQL stores reuse it inside a transaction). Stores that decide in a
//! script (Redis Lua) implement the same rule there; `decide`'s tests are its specification.

use super::{LockKind, Mode, Request};
use crate::error::{Error, Result};
use std::time::Duration;

/// A live (unexpired) hold as a store sees it.
#[derive(Debug, Clone)]
pub(crate) struct LiveHold<'a> {
    pub owner: &'a str,
    pub kind: LockKind,
    pub mode: Mode,
    pub token: Option<u64>,
    pub expires_in: Duration,
}

/// A live (unexpired) queue place, in queue order (lowest sequence first).
#[derive(Debug, Clone)]
pub(crate) struct LiveWaiter<'a> {
    pub owner: &'a str,
    pub mode: Mode,
}

/// What the store must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The owner already holds: refresh its lease, answer with its token.
    Regrant { token: Option<u64> },
    /// Grant a new hold with fencing token `token` (= the stored fence + 1): store the fence, insert
    /// the hold, remove the owner's queue place.
    Grant { token: u64 },
    /// Refuse. If `enqueue`, insert or refresh the owner's queue place.
    Busy {
        retry_in: Option<Duration>,
        enqueue: bool,
    },
}

/// The grant rule. `holds` and `queue` must contain only live entries; `fence` is the name's
/// current fencing counter (0 if never granted).
///
/// - A request whose kind differs from the live holders' is an error (`InvalidConfig`).
/// - Waiters in the fair queue ahead of the request win: a request not in the queue counts every
///   queued waiter as ahead, so plain requests never barge past fair waiters.
/// - A refused request takes a queue place when [`Request::takes_queue_place`] says so (fair
///   waiters, and rwlock writers always).
/// - Exclusive: no holders and no waiter ahead. Shared (read): no exclusive holder and no
///   exclusive waiter ahead. Semaphore(n): holders + waiters ahead < n.
pub(crate) fn decide(
    req: &Request<'_>,
    holds: &[LiveHold<'_>],
    queue: &[LiveWaiter<'_>],
    fence: u64,
) -> Result<Decision> {
    if let Some(h) = holds.iter().find(|h| h.owner == req.owner) {
        return Ok(Decision::Regrant { token: h.token });
    }
    if let Some(h) = holds.iter().find(|h| h.kind != req.kind) {
        return Err(Error::InvalidConfig(format!(
            "lock {:?} is held as {}, requested as {}",
            req.name.as_str(),
            h.kind,
            req.kind
        )));
    }
    let ahead: &[LiveWaiter<'_>] = match queue.iter().position(|w| w.owner == req.owner) {
        Some(i) => &queue[..i],
        None => queue,
    };
    let free = match (req.kind, req.mode) {
        (_, Mode::Exclusive) => holds.is_empty() && ahead.is_empty(),
        (LockKind::Semaphore { permits }, Mode::Shared) => {
            (holds.len() + ahead.len()) < permits as usize
        }
        (_, Mode::Shared) => {
            holds.iter().all(|h| h.mode == Mode::Shared)
                && ahead.iter().all(|w| w.mode == Mode::Shared)
        }
    };
    if free {
        let token = fence.checked_add(1).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "fencing counter of {:?} is exhausted",
                req.name.as_str()
            ))
        })?;
        return Ok(Decision::Grant { token });
    }
    // Only waiters in the way: the first is about to be granted, and its hold, if its holder
    // dies without a release (nobody is told), ends about a lease from now.
    let retry_in = match holds.iter().map(|h| h.expires_in).min() {
        None => Some(req.lease),
        shortest => shortest,
    };
    Ok(Decision::Busy {
        retry_in,
        enqueue: req.takes_queue_place(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::HolderMeta;
    use crate::name::LockName;

    fn meta() -> HolderMeta {
        HolderMeta {
            client_id: "c".into(),
            host: "h".into(),
            pid: 1,
            value: None,
        }
    }

    fn req<'a>(
        name: &'a LockName,
        meta: &'a HolderMeta,
        owner: &'a str,
        kind: LockKind,
        mode: Mode,
    ) -> Request<'a> {
        Request {
            name,
            kind,
            mode,
            owner,
            lease: Duration::from_secs(1),
            fair: true,
            waiting: true,
            meta,
        }
    }

    fn hold(owner: &str, kind: LockKind, mode: Mode) -> LiveHold<'_> {
        LiveHold {
            owner,
            kind,
            mode,
            token: Some(7),
            expires_in: Duration::from_millis(500),
        }
    }

    #[test]
    fn mutex_rules() {
        let n = LockName::new("n").unwrap();
        let m = meta();
        let r = req(&n, &m, "a", LockKind::Mutex, Mode::Exclusive);
        assert_eq!(
            decide(&r, &[], &[], 4).unwrap(),
            Decision::Grant { token: 5 }
        );
        let h = [hold("b", LockKind::Mutex, Mode::Exclusive)];
        assert_eq!(
            decide(&r, &h, &[], 4).unwrap(),
            Decision::Busy {
                retry_in: Some(Duration::from_millis(500)),
                enqueue: true
            }
        );
        let mine = [hold("a", LockKind::Mutex, Mode::Exclusive)];
        assert_eq!(
            decide(&r, &mine, &[], 9).unwrap(),
            Decision::Regrant { token: Some(7) }
        );
        // a waiter ahead blocks a free lock; being first in the queue grants
        let q = [
            LiveWaiter {
                owner: "x",
                mode: Mode::Exclusive,
            },
            LiveWaiter {
                owner: "a",
                mode: Mode::Exclusive,
            },
        ];
        // (retried a lease from now: the waiter ahead is about to be granted, and its hold
        // ends silently if its holder dies)
        assert_eq!(
            decide(&r, &[], &q, 0).unwrap(),
            Decision::Busy {
                retry_in: Some(Duration::from_secs(1)),
                enqueue: true
            }
        );
        assert_eq!(
            decide(&r, &[], &q[1..], 0).unwrap(),
            Decision::Grant { token: 1 }
        );
        // not in the queue at all: every waiter is ahead
        let r2 = req(&n, &m, "z", LockKind::Mutex, Mode::Exclusive);
        assert!(matches!(
            decide(&r2, &[], &q[1..], 0).unwrap(),
            Decision::Busy { .. }
        ));
    }

    #[test]
    fn waiting_rwlock_writers_queue_even_when_not_fair() {
        let n = LockName::new("n").unwrap();
        let m = meta();
        let readers = [hold("b", LockKind::RwLock, Mode::Shared)];
        let mut w = req(&n, &m, "w", LockKind::RwLock, Mode::Exclusive);
        w.fair = false;
        assert!(matches!(
            decide(&w, &readers, &[], 1).unwrap(),
            Decision::Busy { enqueue: true, .. }
        ));
        w.waiting = false; // try_write leaves nothing behind
        assert!(matches!(
            decide(&w, &readers, &[], 1).unwrap(),
            Decision::Busy { enqueue: false, .. }
        ));
        let mut mx = req(&n, &m, "x", LockKind::Mutex, Mode::Exclusive);
        mx.fair = false;
        let held = [hold("b", LockKind::Mutex, Mode::Exclusive)];
        assert!(matches!(
            decide(&mx, &held, &[], 1).unwrap(),
            Decision::Busy { enqueue: false, .. }
        ));
    }

    #[test]
    fn rw_and_semaphore_rules() {
        let n = LockName::new("n").unwrap();
        let m = meta();
        let read = req(&n, &m, "a", LockKind::RwLock, Mode::Shared);
        let readers = [hold("b", LockKind::RwLock, Mode::Shared)];
        assert!(matches!(
            decide(&read, &readers, &[], 1).unwrap(),
            Decision::Grant { token: 2 }
        ));
        let writer_waiting = [LiveWaiter {
            owner: "w",
            mode: Mode::Exclusive,
        }];
        assert!(matches!(
            decide(&read, &readers, &writer_waiting, 1).unwrap(),
            Decision::Busy { .. }
        ));
        let write = req(&n, &m, "a", LockKind::RwLock, Mode::Exclusive);
        assert!(matches!(
            decide(&write, &readers, &[], 1).unwrap(),
            Decision::Busy { .. }
        ));

        let k = LockKind::Semaphore { permits: 2 };
        let s = req(&n, &m, "a", k, Mode::Shared);
        let one = [hold("b", k, Mode::Shared)];
        assert!(matches!(
            decide(&s, &one, &[], 1).unwrap(),
            Decision::Grant { .. }
        ));
        let two = [hold("b", k, Mode::Shared), hold("c", k, Mode::Shared)];
        assert!(matches!(
            decide(&s, &two, &[], 1).unwrap(),
            Decision::Busy { .. }
        ));
        let other = req(
            &n,
            &m,
            "a",
            LockKind::Semaphore { permits: 3 },
            Mode::Shared,
        );
        assert!(matches!(
            decide(&other, &one, &[], 1),
            Err(Error::InvalidConfig(_))
        ));
        let mutex = req(&n, &m, "a", LockKind::Mutex, Mode::Exclusive);
        assert!(matches!(
            decide(&mutex, &one, &[], 1),
            Err(Error::InvalidConfig(_))
        ));
    }
}
