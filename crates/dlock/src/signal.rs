//! Per-name in-process wake-ups: the core's (the clients of one process on one store wake each
//! other's waiters on a release) and a store's fan-out of its own notifications to its waiters
//! (Redis pub/sub messages, PostgreSQL NOTIFY).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};
use tokio::sync::Notify;

/// The wake-up of one name: a `Notify`, and a count of the wakes sent while it existed (so a
/// waiter can tell whether anything happened since a moment it noted, without having listened).
#[derive(Debug, Default)]
pub(crate) struct NameSignal {
    notify: Notify,
    wakes: AtomicU64,
}

impl NameSignal {
    /// The wakes sent so far.
    pub(crate) fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::SeqCst)
    }
}

impl std::ops::Deref for NameSignal {
    type Target = Notify;
    fn deref(&self) -> &Notify {
        &self.notify
    }
}

/// A signal per lock name, kept only while somebody waits on it (or holds it to count wakes).
#[derive(Debug, Default)]
pub(crate) struct NameSignals {
    names: StdMutex<HashMap<String, Weak<NameSignal>>>,
}

impl NameSignals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<NameSignal>>> {
        // The map stays consistent even if a holder panicked.
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The signal of `name`. Create the `notified()` future and `enable()` it **before** looking
    /// at the lock again, so a wake between the look and the wait is not lost.
    pub(crate) fn subscribe(&self, name: &str) -> Arc<NameSignal> {
        let mut map = self.lock();
        if let Some(n) = map.get(name).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() >= 64 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(NameSignal::default());
        map.insert(name.to_owned(), Arc::downgrade(&n));
        n
    }

    /// Wakes every task waiting on `name`.
    pub(crate) fn wake(&self, name: &str) {
        let mut map = self.lock();
        match map.get(name).map(Weak::upgrade) {
            Some(Some(n)) => {
                // Counted before the notification: a waiter that enabled its `notified()` and
                // then read the count either sees the new count or is woken.
                n.wakes.fetch_add(1, Ordering::SeqCst);
                n.notify_waiters()
            }
            Some(None) => {
                map.remove(name);
            }
            None => {}
        }
    }
}

/// The in-process wake-ups of store `key` (see [`crate::backend::Backend::shared_key`]),
/// shared by every client of this process on that store; kept while a client uses them.
pub(crate) fn shared(key: String) -> Arc<NameSignals> {
    static STORES: OnceLock<StdMutex<HashMap<String, Weak<NameSignals>>>> = OnceLock::new();
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(w) = stores.get(&key).and_then(Weak::upgrade) {
        return w;
    }
    stores.retain(|_, w| w.strong_count() > 0);
    let w = Arc::new(NameSignals::default());
    stores.insert(key, Arc::downgrade(&w));
    w
}
