//! Per-name in-process wake-ups, shared by the client (its own tasks) and by stores that wake
//! waiters of the same process (mem, SQLite).

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use tokio::sync::Notify;

/// A `Notify` per lock name, kept only while somebody waits on it.
#[derive(Debug, Default)]
pub(crate) struct NameSignals {
    names: StdMutex<HashMap<String, Weak<Notify>>>,
}

impl NameSignals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Notify>>> {
        // The map stays consistent even if a holder panicked.
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The signal of `name`. Create the `notified()` future and `enable()` it **before** looking
    /// at the lock again, so a wake between the look and the wait is not lost.
    pub(crate) fn subscribe(&self, name: &str) -> Arc<Notify> {
        let mut map = self.lock();
        if let Some(n) = map.get(name).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() >= 64 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(name.to_owned(), Arc::downgrade(&n));
        n
    }

    /// Wakes every task waiting on `name`.
    pub(crate) fn wake(&self, name: &str) {
        let mut map = self.lock();
        match map.get(name).map(Weak::upgrade) {
            Some(Some(n)) => n.notify_waiters(),
            Some(None) => {
                map.remove(name);
            }
            None => {}
        }
    }
}
