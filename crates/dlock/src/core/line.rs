//! The local line: the waiters of one client for one lock name, so that a release costs one
//! attempt per waiting process, not one per waiting task.

use crate::signal::{NameSignal, NameSignals};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Instant;
use tokio::sync::Notify;

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The lines stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lines of one client, by lock name.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    lines: StdMutex<HashMap<String, Line>>,
    next_waiter: AtomicU64,
}

/// The waiters of one client for one lock name, in arrival order: (waiter id, its promotion
/// signal). The front is the head.
type Line = VecDeque<(u64, Arc<Promotion>)>;

/// How a waiter learns that it is the head of its line now.
#[derive(Debug, Default)]
struct Promotion {
    notify: Notify,
    /// The head before it left because it was granted the lock exclusively: only that hold's
    /// release (in this client) can let the new head in, so it waits for that instead of
    /// attempting at once.
    after_exclusive_grant: AtomicBool,
    /// This client's wake count of the name when that head left (a release since then moved it).
    wakes_at_grant: AtomicU64,
}

/// A waiter's place in its client's line for one lock name. Only the waiter at the head of the
/// line waits for the store's wake-up (and this client's own releases); the others wait until
/// they reach the head or their own wait slice ends. A release thus costs one attempt per
/// waiting *process*, not one per waiting task (no thundering herd inside a process). Leaving
/// the line (timed out, failed or dropped) hands the head to the next waiter, which attempts at
/// once; a head granted the lock exclusively hands it to a next waiter that first waits for this
/// client's release of the name; a reader of a read-write lock that was granted wakes the whole
/// line, since readers share.
pub(crate) struct LinePlace {
    lines: Arc<Lines>,
    local: Arc<NameSignals>,
    name: String,
    id: u64,
    promoted: Arc<Promotion>,
    pub(crate) wake_all: bool,
    pub(crate) granted_exclusive: bool,
}

impl LinePlace {
    /// Joins the back of the client's line for `name`; `true` with it if the line was empty
    /// (this waiter is the head).
    pub(crate) fn join(
        lines: &Arc<Lines>,
        local: &Arc<NameSignals>,
        name: &str,
    ) -> (LinePlace, bool) {
        let id = lines.next_waiter.fetch_add(1, Ordering::Relaxed);
        let promoted = Arc::new(Promotion::default());
        let head = {
            let mut map = lock(&lines.lines);
            let line = map.entry(name.to_owned()).or_default();
            line.push_back((id, promoted.clone()));
            line.len() == 1
        };
        let place = LinePlace {
            lines: lines.clone(),
            local: local.clone(),
            name: name.to_owned(),
            id,
            promoted,
            wake_all: false,
            granted_exclusive: false,
        };
        (place, head)
    }

    pub(crate) fn is_head(&self) -> bool {
        lock(&self.lines.lines)
            .get(&self.name)
            .and_then(|l| l.front())
            .is_some_and(|(id, _)| *id == self.id)
    }
}

impl Drop for LinePlace {
    fn drop(&mut self) {
        let mut lines = lock(&self.lines.lines);
        let Some(line) = lines.get_mut(&self.name) else {
            return;
        };
        let was_head = line.front().is_some_and(|(id, _)| *id == self.id);
        line.retain(|(id, _)| *id != self.id);
        if self.wake_all {
            for (_, n) in line.iter() {
                n.notify.notify_one();
            }
        } else if was_head {
            if let Some((_, n)) = line.front() {
                if self.granted_exclusive {
                    let wakes = self.local.subscribe(&self.name).wakes();
                    n.wakes_at_grant.store(wakes, Ordering::SeqCst);
                }
                n.after_exclusive_grant
                    .store(self.granted_exclusive, Ordering::SeqCst);
                n.notify.notify_one();
            }
        }
        if line.is_empty() {
            lines.remove(&self.name);
        }
    }
}

/// Waits, behind the head of this client's line, until this waiter is the head (or `until`).
/// Promoted right after the head was granted the lock exclusively, it then also waits for that
/// hold's release by this client: an attempt before it would be refused.
pub(crate) async fn wait_in_line(place: &LinePlace, local: &NameSignal, until: Instant) {
    let promoted = place.promoted.clone();
    tokio::select! {
        biased; // deterministic under a seeded simulation (tests/simulation.rs)
        _ = promoted.notify.notified() => {}
        _ = tokio::time::sleep_until(until.into()) => {}
    }
    if promoted.after_exclusive_grant.swap(false, Ordering::SeqCst) {
        // Unless the wake count says the release happened already; a hold lost without a
        // release is covered by `until`.
        let released = local.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if local.wakes() == promoted.wakes_at_grant.load(Ordering::SeqCst) {
            tokio::select! {
                biased; // deterministic under a seeded simulation (tests/simulation.rs)
                _ = released => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}
