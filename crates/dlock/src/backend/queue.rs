//! The grant rules of a queue store (ZooKeeper, etcd): every acquisition is an entry in its
//! lock's queue, in the store's order (sequence number, create revision), and an entry holds or
//! waits by what stands ahead of it.

use super::{LockKind, Mode};

/// What one queue entry asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A mutex (Curator's `lock-`, etcd's `concurrency.Mutex`).
    Lock,
    /// A reader of a read-write lock.
    Read,
    /// A writer of a read-write lock.
    Write,
    /// A permit of a semaphore of this many permits.
    Semaphore(u32),
}

impl Entry {
    /// The entry a request makes.
    pub(crate) fn of(kind: LockKind, mode: Mode) -> Entry {
        match (kind, mode) {
            (LockKind::Mutex, _) => Entry::Lock,
            (LockKind::RwLock, Mode::Shared) => Entry::Read,
            (LockKind::RwLock, Mode::Exclusive) => Entry::Write,
            (LockKind::Semaphore { permits }, _) => Entry::Semaphore(permits),
        }
    }

    /// Whether two entries may share one lock name (the same primitive).
    pub(crate) fn compatible(self, other: Entry) -> bool {
        matches!(
            (self, other),
            (Entry::Lock, Entry::Lock) | (Entry::Read | Entry::Write, Entry::Read | Entry::Write)
        ) || matches!((self, other), (Entry::Semaphore(x), Entry::Semaphore(y)) if x == y)
    }

    /// The primitive the entry belongs to.
    pub(crate) fn kind(self) -> LockKind {
        match self {
            Entry::Lock => LockKind::Mutex,
            Entry::Read | Entry::Write => LockKind::RwLock,
            Entry::Semaphore(permits) => LockKind::Semaphore { permits },
        }
    }

    /// Exclusive or shared.
    pub(crate) fn mode(self) -> Mode {
        match self {
            Entry::Lock | Entry::Write => Mode::Exclusive,
            Entry::Read | Entry::Semaphore(_) => Mode::Shared,
        }
    }
}

/// Where the entry at `i` of a queue stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It holds.
    Holds,
    /// It waits for the entry at this index to leave (no herd: only that one): a mutex or a
    /// writer waits for the entry just ahead, a reader for the nearest writer ahead.
    After(usize),
    /// A semaphore permit waits for this many of the entries ahead of it to leave (any of them).
    Departures(usize),
}

/// The turn of the entry at `i` of `queue` (in the store's order).
pub(crate) fn turn(queue: &[Entry], i: usize) -> Turn {
    match queue[i] {
        Entry::Lock | Entry::Write => match i {
            0 => Turn::Holds,
            _ => Turn::After(i - 1),
        },
        Entry::Read => match queue[..i]
            .iter()
            .rposition(|e| matches!(e, Entry::Write | Entry::Lock))
        {
            None => Turn::Holds,
            Some(w) => Turn::After(w),
        },
        Entry::Semaphore(n) => match i.checked_sub(n as usize) {
            None => Turn::Holds,
            Some(over) => Turn::Departures(over + 1),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns() {
        use Entry::*;
        let q = [Write, Read, Read, Write, Read];
        let t: Vec<Turn> = (0..q.len()).map(|i| turn(&q, i)).collect();
        assert_eq!(
            t,
            [
                Turn::Holds,
                Turn::After(0),
                Turn::After(0),
                Turn::After(2),
                Turn::After(3)
            ]
        );
        let q = [Read, Read, Write];
        assert_eq!(turn(&q, 1), Turn::Holds);
        assert_eq!(turn(&q, 2), Turn::After(1));
        let q = [Semaphore(2); 5];
        assert_eq!(turn(&q, 1), Turn::Holds);
        assert_eq!(turn(&q, 2), Turn::Departures(1));
        assert_eq!(turn(&q, 4), Turn::Departures(3));
        assert!(Lock.compatible(Lock) && Read.compatible(Write));
        assert!(!Lock.compatible(Write) && !Semaphore(2).compatible(Semaphore(3)));
    }
}
