//! The etcd store (`etcd://h1:2379,h2:2379,h3:2379/prefix?ttl=10s`, `etcds://…` with TLS).
//!
//! A queue store on etcd's own lock recipe, so that `etcdctl lock NAME`, etcd's `Lock` RPC and
//! Go's `concurrency.Mutex` exclude a dlock `Mutex` of the same name, both ways.
//!
//! # Layout (etcd's `concurrency.Mutex`)
//!
//! ```text
//! <prefix>/<escaped lock name>/<lease id in hex>            one acquisition of a client
//! <prefix>/<escaped lock name>/<lease id in hex>_<owner>    a second one of the same client
//! ```
//!
//! Every key is attached to its client's **one lease**. An acquisition puts its key if it does
//! not exist yet (a transaction on `create_revision == 0`), and the keys under a name, ordered
//! by **create revision**, are the lock's queue (etcd's Mutex grants "when no key under the
//! name has a lower create revision"). A client normally has one acquisition of a name at a
//! time, and its key is exactly etcd's; a second one at once (another handle of the same client
//! waiting, a second reader or permit) takes the `_<owner>` key, still under the name and still
//! ordered by create revision, so etcd's own clients see it too. The value is a small JSON
//! object: the holder's metadata (`owner`, `client_id`, `host`, `pid`, and `value` for a hold
//! that carries one: an election leader's), the primitive (`lock`, `mode`, `permits`) and, after
//! a forced release, `revoked`. An empty value (what etcd's own clients write) is a mutex.
//! The acquisitions of one client put their keys through one queue per lease (`batch.rs`):
//! while a transaction that puts keys is in flight, the next ones wait and then go out joined
//! in one transaction (every compare, every put and read), at most one key of a name in each,
//! since the keys of one transaction share its revision; a client taking many names at once
//! costs the cluster one raft entry per batch instead of one per name.
//! [`Backend::set_value`] rewrites the JSON in a transaction that compares the key's create
//! revision (the owner's hold) and mod revision (nothing written since it was read), keeping the
//! key's lease.
//!
//! Grant rules, over the keys sorted by create revision (see `backend::queue`):
//! - mutex and writer: granted when first; otherwise watch **only** the key with the next
//!   lower create revision for its deletion (no herd);
//! - reader: granted when no mutex or writer key is ahead; otherwise watch the nearest one;
//! - semaphore(n): granted while among the first n keys; a waiter watches the deletions under
//!   the name and tries again only when enough of the keys ahead of it are gone.
//!
//! A backend's waiters of one name share **one watch** of the deletions under the name, opened
//! by the first of them and kept while any waits and for 2 s after (`WATCH_LINGER`): etcd registers
//! a watch "from now" at the revision it read just before, and a write in between leaves the
//! new watch to the catch-up loop that runs every 100 ms (so would a watch that starts in the
//! past), which a waiter whose turn comes sooner would wait out. For its first 120 ms
//! (`WATCH_CATCH_UP`), while anyone waits, a new watch's waiters are also sent the name's keys as
//! read every 5 ms (until the watch reports a deletion itself), so a watch that lost that race
//! delays a hand-off by a few milliseconds, not by up to 100. A waiter reads the queue again
//! when the watch may have reported deletions before it subscribed. After the wake-up the
//! waiter reads the queue again before it holds: its own key may be gone too (a revoked lease,
//! `dlock unlock --break`), and a grant on the wake-up alone would then be a second holder.
//!
//! Grants are FIFO by construction (`Request::fair` is implied). A kind mismatch on one name
//! (mutex vs rwlock vs semaphore(n)) is [`Error::InvalidConfig`].
//!
//! # Lock names → keys
//!
//! A name is one key segment: `%` becomes `%25` and `/` becomes `%2F`, every other byte stays,
//! so the mapping is injective and no name's keys fall under another name's prefix (`a/b` →
//! `a%2Fb`). A name without `%` or `/` is its own segment: `etcdctl lock <prefix>/NAME` is the
//! same lock as dlock's `NAME`.
//!
//! # Fencing tokens
//!
//! The token of a hold is its key's create revision: etcd's revision is global to the cluster
//! and only grows, and a key created later is granted later, so tokens strictly increase per
//! name across the cluster's whole life.
//!
//! # The lease and `lost()`
//!
//! One lease per client (TTL `ttl`, default 10 s) carries every key of that client
//! (`Validity::Session`). The backend records the **send time** of the last keep-alive the
//! cluster confirmed (and of the lease grant): no member can expire the lease before that time
//! plus the TTL. A keep-alive counts as confirmed only when a linearizable read after it answers
//! in the same raft term: etcd does not replicate renewals, and a leader deposed while it was
//! paused may answer one from its own lessor before it steps down. [`Backend::extend`] of any number of holds sends at most one keep-alive (none
//! when one was confirmed in the last sixth of the TTL) and answers every hold with
//! `Held { valid_for: TTL − time since that send }`, so the core's watchdog fires `lost()` before
//! the lease can run out when keep-alives stop being confirmed. A keep-alive also goes out every
//! third of the TTL while the client waits or holds. Each held key is watched from its first
//! renewal on (all of a client's on one watch stream, replaying the key's history from its
//! grant; a hold released before it costs no watch): its deletion (`dlock unlock --break`, the
//! lease's expiry) or a forced revocation is the hold's `Gone` or `Revoked` at the renewal after. A lease that expired
//! is never reused: the next acquisition grants a new one.
//!
//! A hold is also bounded by its own lease: `valid_for` is `min(lease guarantee, hold lease)`,
//! and a hold whose lease ran out without renewal is released by the core. A holder *process*
//! that dies is bounded by the TTL, so choose `ttl` ≤ the leases you rely on for takeover.
//! `Guard::expire_in` is `Unsupported`: a key cannot outlive its client's lease.

use super::queue::{turn, Entry, Turn};
use super::*;
mod batch;
pub(crate) mod url;
use crate::error::Error;
use etcd_client as ec;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use url::EtcdTarget;

/// The pause before a request that failed on a [`transient`] error is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// How long a name's shared watch stays open after its last waiter (see the module docs), so
/// that a client that takes turns with others does not open a watch for every wait.
pub(crate) const WATCH_LINGER: Duration = Duration::from_secs(2);

/// How long a new watch may be left to etcd's catch-up loop (which runs every 100 ms), and how
/// often its waiters are sent the name's keys meanwhile (see the module docs).
const WATCH_CATCH_UP: Duration = Duration::from_millis(120);
const CATCH_UP_READ_EVERY: Duration = Duration::from_millis(5);

/// The etcd store. Obtain it with `dlock::connect("etcd://host:2379/prefix")`.
#[derive(Debug, Clone)]
pub struct EtcdBackend {
    shared: Arc<Shared>,
}

struct Shared {
    target: EtcdTarget,
    client: ec::Client,
    /// The current lease; replaced by a new one after it expired.
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// The keys of this backend's holds, by owner (for release and renewal).
    held: StdMutex<HashMap<String, HeldKey>>,
    /// The names' shared watches, by the name's key prefix; each is taken out by its own reader
    /// task when it ends.
    name_watches: StdMutex<HashMap<Vec<u8>, Arc<NameWatch>>>,
    /// Taken while a name's watch is opened (one watch per name).
    opening: tokio::sync::Mutex<()>,
    stats: Stats,
    /// Tests: the names' watches report nothing (a watch etcd serves late).
    #[cfg(test)]
    mute_watches: AtomicBool,
}

/// The watch of the deletions under one name, shared by a backend's waiters of that name.
struct NameWatch {
    tx: tokio::sync::broadcast::Sender<Departed>,
    /// Deletions up to this revision may have been sent already: a waiter that subscribes and
    /// read the queue at an older revision reads it again. Raised before the deletions of a
    /// revision are sent.
    sent_to: AtomicI64,
    broken: AtomicBool,
    /// It reported a deletion: etcd serves it at the write (a watch left to the catch-up loop
    /// joins the others once that loop has served it), so the reads of [`read_while_new`] stop.
    reported: AtomicBool,
    /// Acquisitions that use the watch (changed under the backend's map lock, see
    /// [`WatchUse`]); the watch ends [`WATCH_LINGER`] after this last falls to 0.
    users: AtomicUsize,
    /// Told when a user lets go.
    let_go: tokio::sync::Notify,
}

/// An acquisition's use of its name's watch.
struct WatchUse(Arc<NameWatch>);

impl std::ops::Deref for WatchUse {
    type Target = NameWatch;
    fn deref(&self) -> &NameWatch {
        &self.0
    }
}

impl Drop for WatchUse {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::SeqCst);
        self.0.let_go.notify_one();
    }
}

/// What a name's watch reports to its waiters.
#[derive(Debug, Clone)]
enum Departed {
    /// A key under the name was deleted at this revision.
    Key(Vec<u8>, i64),
    /// The name's keys (with their create revisions) as read at this revision, while the watch
    /// is new (see the module docs).
    Keys(Arc<Vec<(Vec<u8>, i64)>>, i64),
    /// The watch ended: etcd cancelled it (`true`: the waiters read the queue again) or the
    /// stream failed (`false`: the wait fails, and is tried again with a new watch).
    Ended(bool),
}

/// Reads a name's watch and sends its deletions to the waiters, until etcd ends the watch or
/// nobody used it for [`WATCH_LINGER`]; then takes it out of the backend's map.
async fn forward_deletions(
    shared: Weak<Shared>,
    dir: Vec<u8>,
    w: Arc<NameWatch>,
    mut stream: ec::WatchStream,
) {
    let mut idle_since: Option<Instant> = None;
    let forget = |w: &Arc<NameWatch>| -> bool {
        let Some(shared) = shared.upgrade() else {
            return true;
        };
        let mut map = shared
            .name_watches
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Users join under this lock: one that joined since the check keeps the watch.
        if w.users.load(Ordering::SeqCst) > 0 && !w.broken.load(Ordering::SeqCst) {
            return false;
        }
        if map.get(&dir).is_some_and(|m| Arc::ptr_eq(m, w)) {
            map.remove(&dir);
        }
        true
    };
    loop {
        if w.users.load(Ordering::SeqCst) == 0 {
            idle_since.get_or_insert_with(Instant::now);
        } else {
            idle_since = None;
        }
        let linger = async {
            match idle_since {
                Some(t) => tokio::time::sleep_until((t + WATCH_LINGER).into()).await,
                None => std::future::pending().await,
            }
        };
        let msg = tokio::select! {
            m = stream.message() => m,
            _ = w.let_go.notified() => continue,
            _ = linger => {
                if forget(&w) {
                    return;
                }
                idle_since = None;
                continue;
            }
        };
        match msg {
            Ok(Some(resp)) if !resp.canceled() => {
                let rev = resp.header().map_or(0, |h| h.revision());
                w.sent_to.fetch_max(rev, Ordering::SeqCst);
                #[cfg(test)]
                if shared
                    .upgrade()
                    .is_some_and(|s| s.mute_watches.load(Ordering::SeqCst))
                {
                    continue;
                }
                for ev in resp.events() {
                    if let Some(kv) = ev.kv().filter(|_| ev.event_type() == ec::EventType::Delete) {
                        w.reported.store(true, Ordering::SeqCst);
                        let _ =
                            w.tx.send(Departed::Key(kv.key().to_vec(), kv.mod_revision()));
                    }
                }
            }
            other => {
                w.broken.store(true, Ordering::SeqCst);
                forget(&w);
                let canceled = matches!(other, Ok(Some(_)));
                let _ = w.tx.send(Departed::Ended(canceled));
                return;
            }
        }
    }
}

/// Sends a new watch's waiters the name's keys every [`CATCH_UP_READ_EVERY`] for
/// [`WATCH_CATCH_UP`], while anyone waits and until the watch reports a deletion itself: etcd registers a watch "from now" at the revision it
/// read just before, and a write in between leaves the watch to etcd's catch-up loop, which
/// reports deletions up to 100 ms late. A read that fails is skipped (the watch still reports).
async fn read_while_new(shared: Weak<Shared>, dir: Vec<u8>, w: Arc<NameWatch>, until: Instant) {
    let opts = ec::GetOptions::new().with_prefix().with_keys_only();
    loop {
        tokio::time::sleep(CATCH_UP_READ_EVERY).await;
        if Instant::now() >= until
            || w.broken.load(Ordering::SeqCst)
            || w.reported.load(Ordering::SeqCst)
            || w.users.load(Ordering::SeqCst) == 0
        {
            return;
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut c = shared.client.clone();
        let read = tokio::time::timeout(
            shared.target.timeout,
            c.get(dir.clone(), Some(opts.clone())),
        );
        shared.stats.catch_up_reads.fetch_add(1, Ordering::Relaxed);
        drop(shared);
        if let Ok(Ok(resp)) = read.await {
            let rev = resp.header().map_or(0, |h| h.revision());
            let keys = resp
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.create_revision()))
                .collect();
            let _ = w.tx.send(Departed::Keys(Arc::new(keys), rev));
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Counters for tests and benchmarks.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Keep-alives sent.
    pub(crate) keepalives: AtomicU64,
    /// Leases granted.
    pub(crate) leases: AtomicU64,
    /// Wait watches that reported the change their waiter waited for.
    pub(crate) wakeups: AtomicU64,
    /// Names' shared watches opened.
    pub(crate) name_watches: AtomicU64,
    /// Reads of a name's keys while its watch was new.
    pub(crate) catch_up_reads: AtomicU64,
    /// Transactions that put the queue entries of more than one acquisition (`batch.rs`), and
    /// the entries they put.
    pub(crate) joined: AtomicU64,
    pub(crate) joined_entries: AtomicU64,
}

/// One lease and what hangs on it.
struct Session {
    client: ec::Client,
    lease: i64,
    ttl: Duration,
    /// Expired or revoked: terminal.
    dead: AtomicBool,
    /// Send time of the last keep-alive (or the grant) the cluster confirmed.
    contact: StdMutex<Instant>,
    /// The keep-alive stream; one keep-alive in flight at a time.
    keeper: tokio::sync::Mutex<Option<(ec::LeaseKeeper, ec::LeaseKeepAliveStream)>>,
    /// Lock names whose plain `<lease hex>` key this lease uses now.
    plain_keys: StdMutex<HashSet<String>>,
    /// Keys of this lease that must go (by name and owner) although the request deleting them,
    /// or the put that made them, may not have gone through: its answer was lost, it timed out,
    /// it was dropped. The sweeper deletes them once such a request is surely over (a dead
    /// acquisition's key would otherwise block its name as long as this client lives).
    orphans: StdMutex<HashMap<(String, String), Instant>>,
    /// Queue entries waiting for the lease's next transaction (group commit, `batch.rs`).
    batch: batch::Queue,
    /// The watches of held keys, by watch id, and the stream they are on.
    watches: StdMutex<HashMap<i64, Arc<KeyWatch>>>,
    watch_tx: tokio::sync::Mutex<Option<ec::WatchRequestSender>>,
    next_watch: AtomicI64,
    timeout: Duration,
    stats: Weak<Shared>,
}

impl Session {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn touch(&self, sent: Instant) {
        let mut c = self.contact.lock().unwrap_or_else(|p| p.into_inner());
        if sent > *c {
            *c = sent;
        }
    }

    /// The owner's keys under `name` must be gone unless [`Session::settled`] follows.
    fn expect_gone(&self, name: &str, owner: &str) {
        self.orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((name.to_owned(), owner.to_owned()))
            .or_insert_with(Instant::now);
    }

    /// The request that [`Session::expect_gone`] covers is being sent now (it may have waited
    /// for a batch): the sweeper counts from here.
    fn sending(&self, name: &str, owner: &str) {
        self.orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((name.to_owned(), owner.to_owned()), Instant::now());
    }

    /// The request that [`Session::expect_gone`] covered went through.
    fn settled(&self, name: &str, owner: &str) {
        self.orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(name.to_owned(), owner.to_owned()));
    }

    fn contact(&self) -> Instant {
        *self.contact.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What remains of the lease's guarantee now (`None`: nothing).
    fn valid_for(&self) -> Option<Duration> {
        if self.is_dead() {
            return None;
        }
        self.ttl
            .checked_sub(self.contact().elapsed())
            .filter(|d| !d.is_zero())
    }

    /// Confirms the lease: one keep-alive unless one confirmed in the last sixth of the TTL
    /// (concurrent callers share one), and what remains of its guarantee.
    async fn confirm(&self) -> Option<Duration> {
        let fresh = |s: &Session| s.contact().elapsed() < s.ttl / 6;
        if self.is_dead() || fresh(self) {
            return self.valid_for();
        }
        let mut keeper = self.keeper.lock().await;
        if self.is_dead() || fresh(self) {
            return self.valid_for();
        }
        if let Some(stats) = self.stats.upgrade() {
            stats.stats.keepalives.fetch_add(1, Ordering::Relaxed);
        }
        let sent = Instant::now();
        let answer = tokio::time::timeout(self.timeout, async {
            if keeper.is_none() {
                let mut c = self.client.clone();
                *keeper = Some(c.lease_keep_alive(self.lease).await?);
            }
            let Some((k, stream)) = keeper.as_mut() else {
                return Ok(None);
            };
            k.keep_alive().await?;
            stream.message().await
        })
        .await;
        match answer {
            Ok(Ok(Some(r))) if r.ttl() > 0 => {
                // Renewals are not replicated: a leader that was deposed while paused may still
                // answer a keep-alive from its own lessor before it steps down, and the real
                // leader never sees it. The renewal counts only if the answer's term is still the
                // cluster's term after it (a linearizable read: only a leader with a quorum
                // serves it).
                let term = r.header().map_or(0, |h| h.raft_term());
                let mut c = self.client.clone();
                let probe = ec::GetOptions::new().with_count_only();
                match tokio::time::timeout(self.timeout, c.get(&b"\0"[..], Some(probe))).await {
                    Ok(Ok(g)) if g.header().is_some_and(|h| h.raft_term() == term) => {
                        self.touch(sent)
                    }
                    _ => {
                        tracing::debug!(
                            term,
                            "etcd: a keep-alive answered in a past term; not counted"
                        );
                        *keeper = None;
                    }
                }
            }
            Ok(Ok(Some(_))) => {
                tracing::warn!(
                    lease = format_args!("{:x}", self.lease),
                    "etcd lease expired"
                );
                self.dead.store(true, Ordering::Release);
            }
            Ok(Err(e)) if lease_gone(&e) => {
                self.dead.store(true, Ordering::Release);
            }
            // No answer in time or a broken stream: a new stream next time (a late answer on
            // this one must not count for a later keep-alive).
            _ => *keeper = None,
        }
        self.valid_for()
    }

    /// Watches a held key for its deletion or revocation, on the lease's one watch stream.
    async fn watch_key(self: &Arc<Self>, w: Arc<KeyWatch>) -> i64 {
        let id = self.next_watch.fetch_add(1, Ordering::Relaxed);
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, w.clone());
        let opts = ec::WatchOptions::new()
            .with_start_revision(w.revision + 1)
            .with_watch_id(id);
        let mut tx = self.watch_tx.lock().await;
        if let Some(sender) = tx.as_mut() {
            // A full request channel (a stream etcd stopped reading) counts as broken.
            let sent =
                tokio::time::timeout(self.timeout, sender.watch(w.key.clone(), Some(opts))).await;
            if matches!(sent, Ok(Ok(()))) {
                return id;
            }
        }
        *tx = None;
        drop(tx);
        match self.reopen_watches().await {
            Some(responses) => {
                let weak = Arc::downgrade(self);
                tokio::spawn(async move {
                    read_watches(weak.clone(), responses).await;
                    keep_watching(weak).await;
                });
            }
            None => {
                tokio::spawn(keep_watching(Arc::downgrade(self)));
            }
        }
        id
    }

    /// Stops watching a key that is no longer held: the watch is cancelled when its next
    /// event (the key's deletion) arrives, off the release's path.
    fn unwatch(&self, id: i64) {
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// Opens the watch stream again with every watched key (from its grant on, so nothing in
    /// between is missed); the caller reads the answers. `None`: not opened (nothing to watch,
    /// the lease is dead, another caller opened it, or etcd did not answer).
    async fn reopen_watches(&self) -> Option<ec::WatchResponseStream> {
        let mut tx = self.watch_tx.lock().await;
        if tx.is_some() || self.is_dead() {
            return None;
        }
        let all: Vec<(i64, Arc<KeyWatch>)> = self
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, w)| (*id, w.clone()))
            .collect();
        let ((id0, w0), rest) = all.split_first()?;
        let opts = |id: i64, w: &KeyWatch| {
            ec::WatchOptions::new()
                .with_start_revision(w.revision + 1)
                .with_watch_id(id)
        };
        let mut c = self.client.clone();
        let stream =
            tokio::time::timeout(self.timeout, c.watch(w0.key.clone(), Some(opts(*id0, w0))))
                .await
                .ok()?
                .ok()?;
        let (mut sender, responses) = stream.split();
        for (id, w) in rest {
            let sent = tokio::time::timeout(
                self.timeout,
                sender.watch(w.key.clone(), Some(opts(*id, w))),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                return None;
            }
        }
        *tx = Some(sender);
        Some(responses)
    }
}

/// Opens the lease's watch stream of held keys (trying again every 200 ms while the lease
/// lives and keys are held) and reads it.
async fn keep_watching(session: Weak<Session>) {
    loop {
        let Some(s) = session.upgrade() else { return };
        if s.is_dead() || s.watch_tx.lock().await.is_some() {
            return;
        }
        if let Some(responses) = s.reopen_watches().await {
            drop(s);
            read_watches(session.clone(), responses).await;
            continue;
        }
        let nothing = s
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if nothing {
            return;
        }
        drop(s);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the watch of one held key reports.
#[derive(Debug)]
struct KeyWatch {
    key: Vec<u8>,
    /// The key's create revision (the hold's token).
    revision: i64,
    deleted: AtomicBool,
    revoked: AtomicBool,
}

/// Reads the lease's watch stream of held keys until it ends (then the stream is closed for
/// the next one to open).
async fn read_watches(session: Weak<Session>, mut responses: ec::WatchResponseStream) {
    loop {
        let msg = responses.message().await;
        let Some(s) = session.upgrade() else { return };
        let resp = match msg {
            Ok(Some(r)) => r,
            _ => {
                *s.watch_tx.lock().await = None;
                drop(s);
                tokio::time::sleep(Duration::from_millis(100)).await;
                return;
            }
        };
        let w = s
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&resp.watch_id())
            .cloned();
        let Some(w) = w else {
            if !resp.canceled() && !resp.events().is_empty() {
                if let Some(sender) = s.watch_tx.lock().await.as_mut() {
                    let _ = tokio::time::timeout(s.timeout, sender.cancel(resp.watch_id())).await;
                }
            }
            continue;
        };
        if resp.canceled() {
            // Compacted past the grant: look at the key itself.
            let mut c = s.client.clone();
            match c.get(w.key.clone(), None).await {
                Ok(r) => match r.kvs().first() {
                    Some(kv) if kv.create_revision() == w.revision => {
                        if KeyData::read(kv.value()).revoked {
                            w.revoked.store(true, Ordering::Release);
                        }
                    }
                    _ => w.deleted.store(true, Ordering::Release),
                },
                Err(_) => w.deleted.store(true, Ordering::Release),
            }
            continue;
        }
        for ev in resp.events() {
            match ev.event_type() {
                ec::EventType::Delete => w.deleted.store(true, Ordering::Release),
                ec::EventType::Put => {
                    if ev.kv().is_some_and(|kv| KeyData::read(kv.value()).revoked) {
                        w.revoked.store(true, Ordering::Release);
                    }
                }
            }
        }
    }
}

/// Deletes the orphaned keys of a lease (see `Session::orphans`) once the request that left
/// each one is surely over (`settle`: the longest a call may take), trying again every 250 ms.
/// Ends with the lease.
async fn sweep(shared: Weak<Shared>, session: Weak<Session>, settle: Duration) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (Some(shared), Some(s)) = (shared.upgrade(), session.upgrade()) else {
            return;
        };
        if s.is_dead() {
            return;
        }
        let due: Vec<(String, String)> = s
            .orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, since)| since.elapsed() >= settle)
            .map(|(k, _)| k.clone())
            .collect();
        let store = EtcdBackend { shared };
        for (name, owner) in due {
            match store.delete_owned(&s, &name, &owner).await {
                Ok(_) => {
                    tracing::debug!(name, owner, "etcd: deleted a key a failed request left");
                    s.settled(&name, &owner);
                }
                Err(e) => tracing::debug!(error = %e, name, "etcd: an orphaned key stays for now"),
            }
        }
    }
}

/// Keeps the lease alive while nobody renews (a keep-alive every third of the TTL unless one
/// was confirmed since). Ends with the session.
async fn heartbeat(session: Weak<Session>, ttl: Duration) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let Some(s) = session.upgrade() else { return };
        if s.is_dead() {
            return;
        }
        s.confirm().await;
    }
}

/// gRPC status codes etcd answers with.
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_NOT_FOUND: i32 = 5;
const GRPC_UNAVAILABLE: i32 = 14;
const GRPC_PERMISSION_DENIED: i32 = 7;
const GRPC_UNAUTHENTICATED: i32 = 16;

fn grpc_code(e: &ec::Error) -> Option<i32> {
    match e {
        ec::Error::GRpcStatus(st) => Some(i32::from(st.code())),
        _ => None,
    }
}

/// An error that passes: the cluster between leaders, a member or the connection to it down.
fn transient(e: &ec::Error) -> bool {
    matches!(e, ec::Error::TransportError(_) | ec::Error::IoError(_))
        || matches!(
            grpc_code(e),
            Some(GRPC_UNAVAILABLE | GRPC_DEADLINE_EXCEEDED)
        )
}

/// Whether etcd answered that the lease is gone (a request on it, or opening its keep-alive
/// stream).
fn lease_gone(e: &ec::Error) -> bool {
    grpc_code(e) == Some(GRPC_NOT_FOUND)
        || matches!(e, ec::Error::LeaseKeepAliveError(m) if m.contains("not found"))
}

/// A held key of an owner.
#[derive(Debug, Clone)]
struct HeldKey {
    session: Arc<Session>,
    place: Place,
    watch: Arc<KeyWatch>,
    /// The key's watch, from the hold's first renewal on (a hold released before it never
    /// costs one; the watch replays the key's history from its grant, so nothing is missed).
    watch_id: Option<i64>,
}

/// An acquisition's key in its lock's queue.
#[derive(Debug, Clone)]
struct Place {
    name: String,
    owner: String,
    key: Vec<u8>,
    revision: i64,
    /// The key is the plain `<lease hex>` one (freed for the name on release).
    plain: bool,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("lease", &format_args!("{:x}", self.lease))
            .field("ttl", &self.ttl)
            .field("dead", &self.is_dead())
            .finish()
    }
}

/// The data of a key.
#[derive(Debug, Default, Serialize, Deserialize)]
struct KeyData {
    #[serde(default)]
    owner: String,
    #[serde(default)]
    client_id: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    pid: u32,
    /// `mutex`, `rwlock` or `semaphore`; absent: a mutex (etcd's own keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lock: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "is_zero")]
    permits: u32,
    #[serde(default)]
    created_at_ms: u64,
    /// Set by a forced release ([`Force::Revoke`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    revoked: bool,
    /// The hold's value ([`HolderMeta::value`]); absent in plain locks' and older keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl KeyData {
    /// Reads a key's value; anything that is not dlock's JSON (etcd's empty value) is a mutex
    /// with no metadata.
    fn read(value: &[u8]) -> KeyData {
        serde_json::from_slice(value).unwrap_or_default()
    }

    /// The queue entry of the key. What dlock does not write is a mutex, as etcd's own keys are:
    /// an unknown `lock`, and a semaphore of zero permits (a corrupted key: as a permit it would
    /// stand for no lock kind at all, and as a mutex it keeps everyone else out until it goes).
    fn entry(&self) -> Entry {
        match (self.lock.as_deref(), self.mode) {
            (Some("rwlock"), Some(Mode::Shared)) => Entry::Read,
            (Some("rwlock"), _) => Entry::Write,
            (Some("semaphore"), _) if self.permits > 0 => Entry::Semaphore(self.permits),
            _ => Entry::Lock,
        }
    }
}

fn key_data(req: &Request<'_>) -> Result<Vec<u8>> {
    encode_key_data(
        req.kind,
        req.mode,
        req.owner,
        req.meta,
        crate::clock::unix_ms(),
    )
}

/// The value of a key of `owner`'s request for a `kind` lock in `mode`, granted at `created_at_ms`.
fn encode_key_data(
    kind: LockKind,
    mode: Mode,
    owner: &str,
    meta: &HolderMeta,
    created_at_ms: u64,
) -> Result<Vec<u8>> {
    let (lock, permits) = match kind {
        LockKind::Mutex => (None, 0),
        LockKind::RwLock => (Some("rwlock"), 0),
        LockKind::Semaphore { permits } => (Some("semaphore"), permits),
    };
    serde_json::to_vec(&KeyData {
        owner: owner.to_owned(),
        client_id: meta.client_id.clone(),
        host: meta.host.clone(),
        pid: meta.pid,
        lock: lock.map(str::to_owned),
        mode: lock.map(|_| mode),
        permits,
        created_at_ms,
        revoked: false,
        value: meta.value.clone(),
    })
    .map_err(Error::backend)
}

/// Escapes a lock name into one key segment (see the module docs).
pub fn escape_name(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The lock name of a key segment; `None` if `s` is not the escape of any name.
pub fn unescape_name(s: &str) -> Option<String> {
    let name = crate::url::percent_decode(s)?;
    (escape_name(&name) == s && LockName::new(name.clone()).is_ok()).then_some(name)
}

fn unavailable(e: ec::Error) -> Error {
    match (&e, grpc_code(&e)) {
        // Permanent: the credentials or roles must change first (not tried again by a waiter).
        (ec::Error::GRpcStatus(st), Some(GRPC_PERMISSION_DENIED | GRPC_UNAUTHENTICATED)) => {
            Error::InvalidConfig(format!("etcd refused access: {}", st.message()))
        }
        (ec::Error::InvalidArgs(_), _) => Error::backend(e),
        _ => Error::Unavailable(format!("etcd: {e}")),
    }
}

fn by_create(order: ec::SortOrder) -> ec::GetOptions {
    ec::GetOptions::new()
        .with_prefix()
        .with_sort(ec::SortTarget::Create, order)
}

/// The keys of one name ahead of (and including) an acquisition's key, in queue order.
struct Queue {
    kvs: Vec<ec::KeyValue>,
    entries: Vec<Entry>,
}

impl Queue {
    fn new(kvs: Vec<ec::KeyValue>) -> Queue {
        let entries = kvs
            .iter()
            .map(|kv| KeyData::read(kv.value()).entry())
            .collect();
        Queue { kvs, entries }
    }
}

/// What an [`EtcdBackend::enqueue`] did.
enum Queued {
    /// The key is in the queue: its place, the queue ahead of it, the revision read at.
    Placed(Place, Queue, i64),
    /// The lease expired (the session is marked dead).
    LeaseGone,
    /// The plain key of this lease under the name is another acquisition's.
    PlainTaken,
}

/// What a waiting acquisition watches.
#[derive(Debug, Clone)]
enum Plan {
    /// The deletion of this key (by name and create revision: a client that lets go and asks
    /// again puts the same name back, behind).
    Key(Vec<u8>, i64),
    /// The deletion of this many of these keys (name and create revision).
    Departures(HashMap<Vec<u8>, i64>, usize),
}

impl Plan {
    /// How many of its keys must go.
    fn needed(&self) -> usize {
        match self {
            Plan::Key(..) => 1,
            Plan::Departures(_, n) => *n,
        }
    }

    /// The create revision of `key`, if it is one of the plan's.
    fn created(&self, key: &[u8]) -> Option<i64> {
        match self {
            Plan::Key(k, c) => (k.as_slice() == key).then_some(*c),
            Plan::Departures(ahead, _) => ahead.get(key).copied(),
        }
    }

    /// The plan's keys missing from `present` (keys with their create revisions, as read at
    /// or after the plan was made).
    fn absent<'a>(&self, present: impl Iterator<Item = (&'a [u8], i64)>) -> Vec<Vec<u8>> {
        let present: HashSet<(&[u8], i64)> = present.collect();
        let missing =
            |(k, c): (&Vec<u8>, &i64)| (!present.contains(&(k.as_slice(), *c))).then(|| k.clone());
        match self {
            Plan::Key(k, c) => missing((k, c)).into_iter().collect(),
            Plan::Departures(ahead, _) => ahead.iter().filter_map(missing).collect(),
        }
    }
}

/// One acquisition: its key in the lock's queue (from its first attempt on) and what it
/// watches while it waits.
struct EtcdAcquisition {
    store: EtcdBackend,
    want: Want,
    place: Option<(Arc<Session>, Place)>,
    /// What to watch, and the revision the queue was read at.
    plan: Option<(Plan, i64)>,
    /// The name's shared watch, once the acquisition waited.
    watch: Option<WatchUse>,
}

impl EtcdBackend {
    /// Connects to the cluster of an `etcd://` URL (as [`crate::connect`] does), for callers that
    /// build the client themselves with [`crate::Client::with_backend`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::open(url::parse(url)?).await
    }

    pub(crate) async fn open(target: EtcdTarget) -> Result<Self> {
        let mut opts = ec::ConnectOptions::new()
            .with_timeout(target.timeout)
            .with_connect_timeout(target.timeout)
            // etcd closes a connection that pings more often than every 5 s, or while it has no
            // stream ("too many pings"); a client always has its lease's keep-alive stream.
            .with_keep_alive(Duration::from_secs(10), target.timeout)
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        if let Some((u, p)) = &target.user {
            opts = opts.with_user(u.clone(), p.clone());
        }
        if target.endpoints.iter().any(|e| e.starts_with("https:")) {
            let mut tls = ec::TlsOptions::new().with_native_roots();
            if let Some(ca) = &target.ca {
                let pem = std::fs::read(ca).map_err(|e| {
                    Error::InvalidConfig(format!("cannot read the CA file {}: {e}", ca.display()))
                })?;
                tls = tls.ca_certificate(ec::Certificate::from_pem(pem));
            }
            opts = opts.with_tls(tls);
        }
        let shown = target.endpoints.join(",");
        let client = tokio::time::timeout(
            target.timeout * 2,
            ec::Client::connect(target.endpoints.clone(), Some(opts)),
        )
        .await
        .map_err(|_| {
            Error::Unavailable(format!(
                "no etcd member of {shown} answered within {:?}",
                target.timeout * 2
            ))
        })?
        .map_err(|e| Error::Unavailable(format!("cannot connect to etcd at {shown}: {e}")))?;
        let b = EtcdBackend {
            shared: Arc::new(Shared {
                target,
                client,
                session: tokio::sync::Mutex::new(None),
                held: StdMutex::new(HashMap::new()),
                name_watches: StdMutex::new(HashMap::new()),
                opening: tokio::sync::Mutex::new(()),
                stats: Stats::default(),
                #[cfg(test)]
                mute_watches: AtomicBool::new(false),
            }),
        };
        b.session().await?;
        Ok(b)
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// The id of the current lease (for tests).
    #[cfg(test)]
    pub(crate) async fn lease_id(&self) -> Option<i64> {
        self.shared.session.lock().await.as_ref().map(|s| s.lease)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, HeldKey>> {
        self.shared.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn client(&self) -> ec::Client {
        self.shared.client.clone()
    }

    /// A use of the shared watch of the deletions under `dir` (a name's key prefix), opened if
    /// none is.
    async fn name_watch(&self, dir: &[u8]) -> Result<WatchUse> {
        let join = || {
            let map = self
                .shared
                .name_watches
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let w = map.get(dir).filter(|w| !w.broken.load(Ordering::SeqCst))?;
            w.users.fetch_add(1, Ordering::SeqCst);
            Some(WatchUse(w.clone()))
        };
        if let Some(w) = join() {
            return Ok(w);
        }
        let _opening = self.shared.opening.lock().await;
        if let Some(w) = join() {
            return Ok(w);
        }
        let opts = ec::WatchOptions::new()
            .with_prefix()
            .with_filters([ec::WatchFilterType::NoPut]);
        let mut c = self.client();
        let (stream, created) = tokio::time::timeout(self.call_bound(), async {
            let mut stream = c.watch(dir.to_vec(), Some(opts)).await?;
            let created = stream.message().await?;
            Ok::<_, ec::Error>((stream, created))
        })
        .await
        .map_err(|_| Error::Unavailable("etcd did not open a watch in time".into()))?
        .map_err(unavailable)?;
        let Some(created) = created.filter(|r| r.created() && !r.canceled()) else {
            return Err(Error::Unavailable("etcd did not open a watch".into()));
        };
        self.shared
            .stats
            .name_watches
            .fetch_add(1, Ordering::Relaxed);
        let w = Arc::new(NameWatch {
            tx: tokio::sync::broadcast::channel(256).0,
            sent_to: AtomicI64::new(created.header().map_or(0, |h| h.revision())),
            broken: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            users: AtomicUsize::new(1),
            let_go: tokio::sync::Notify::new(),
        });
        self.shared
            .name_watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(dir.to_vec(), w.clone());
        tokio::spawn(forward_deletions(
            Arc::downgrade(&self.shared),
            dir.to_vec(),
            w.clone(),
            stream,
        ));
        tokio::spawn(read_while_new(
            Arc::downgrade(&self.shared),
            dir.to_vec(),
            w.clone(),
            Instant::now() + WATCH_CATCH_UP,
        ));
        Ok(WatchUse(w))
    }

    /// The longest one call may take (see [`EtcdBackend::call`]).
    fn call_bound(&self) -> Duration {
        self.shared.target.timeout * 2 + Duration::from_secs(1)
    }

    /// A transaction, through [`EtcdBackend::call`] (every transaction of this store is
    /// idempotent: a put on `create_revision == 0`, a delete on its revision, reads).
    async fn txn(&self, txn: ec::Txn) -> Result<ec::TxnResponse> {
        self.call_txn(txn).await.map_err(unavailable)
    }

    /// A transaction, through [`EtcdBackend::call`], with etcd's error.
    async fn call_txn(&self, txn: ec::Txn) -> Result<ec::TxnResponse, ec::Error> {
        self.call(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// A read, through [`EtcdBackend::call`].
    async fn get(&self, key: Vec<u8>, opts: ec::GetOptions) -> Result<ec::GetResponse> {
        self.call(|mut c| {
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.get(key, Some(opts)).await }
        })
        .await
        .map_err(unavailable)
    }

    /// Runs one idempotent request, again (every 100 ms) while the error is [`transient`], for
    /// at most the URL's `timeout`; each try is bounded by it too.
    async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, ec::Error>
    where
        F: FnMut(ec::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ec::Error>>,
    {
        let limit = self.shared.target.timeout;
        let started = Instant::now();
        loop {
            let r = match tokio::time::timeout(limit, f(self.client())).await {
                Ok(r) => r,
                Err(_) => Err(ec::Error::IoError(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {limit:?}"),
                ))),
            };
            match r {
                Err(e) if transient(&e) && started.elapsed() + RETRY_PAUSE < limit => {
                    tracing::debug!(error = %e, "etcd request failed; trying again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                r => return r,
            }
        }
    }

    /// `<prefix>/<escaped name>/`: the directory of a name's keys.
    fn dir(&self, name: &str) -> String {
        format!("{}/{}/", self.shared.target.prefix, escape_name(name))
    }

    /// The live lease, granting a new one if there is none or it expired.
    async fn session(&self) -> Result<Arc<Session>> {
        let mut cur = self.shared.session.lock().await;
        if let Some(s) = cur.as_ref() {
            if !s.is_dead() {
                return Ok(s.clone());
            }
        }
        let ttl = self.shared.target.ttl;
        let sent = Instant::now();
        let granted = self
            .call(|mut c| async move { c.lease_grant(ttl.as_secs() as i64, None).await })
            .await
            .map_err(unavailable)?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
        let s = Arc::new(Session {
            client: self.client(),
            lease: granted.id(),
            ttl,
            dead: AtomicBool::new(false),
            contact: StdMutex::new(sent),
            keeper: tokio::sync::Mutex::new(None),
            plain_keys: StdMutex::new(HashSet::new()),
            orphans: StdMutex::new(HashMap::new()),
            batch: batch::queue(),
            watches: StdMutex::new(HashMap::new()),
            watch_tx: tokio::sync::Mutex::new(None),
            next_watch: AtomicI64::new(1),
            timeout: self.shared.target.timeout,
            stats: Arc::downgrade(&self.shared),
        });
        self.shared.stats.leases.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            lease = format_args!("{:x}", s.lease),
            ?ttl,
            "etcd lease granted"
        );
        tokio::spawn(heartbeat(Arc::downgrade(&s), ttl));
        tokio::spawn(sweep(
            Arc::downgrade(&self.shared),
            Arc::downgrade(&s),
            self.call_bound(),
        ));
        *cur = Some(s.clone());
        Ok(s)
    }

    /// Puts the acquisition's key and reads the queue ahead of it in the same transaction.
    /// With `plain_ok`, the key is the plain `<lease hex>` one when this lease has no other.
    async fn enqueue(&self, s: &Arc<Session>, req: &Request<'_>, plain_ok: bool) -> Result<Queued> {
        let name = req.name.as_str().to_owned();
        let dir = self.dir(&name);
        let plain = plain_ok
            && s.plain_keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.clone());
        let key = if plain {
            format!("{dir}{:x}", s.lease)
        } else {
            format!("{dir}{:x}_{}", s.lease, req.owner)
        }
        .into_bytes();
        let data = key_data(req)?;
        let exclusive = matches!(Entry::of(req.kind, req.mode), Entry::Lock | Entry::Write);
        // The new key is the newest under the name: the first key, and (mutex, writer) the
        // newest two (this key and the one just ahead), or (reader, permit) all of them.
        let reads = if exclusive {
            vec![
                ec::TxnOp::get(
                    dir.clone(),
                    Some(by_create(ec::SortOrder::Ascend).with_limit(1)),
                ),
                ec::TxnOp::get(
                    dir.clone(),
                    Some(by_create(ec::SortOrder::Descend).with_limit(2)),
                ),
            ]
        } else {
            vec![ec::TxnOp::get(
                dir.clone(),
                Some(by_create(ec::SortOrder::Ascend)),
            )]
        };
        let mut then = vec![ec::TxnOp::put(
            key.clone(),
            data,
            Some(ec::PutOptions::new().with_lease(s.lease)),
        )];
        then.extend(reads);
        let entry = batch::Entry {
            dir,
            name: name.clone(),
            owner: req.owner.to_owned(),
            plain,
            compare: ec::Compare::create_revision(key.clone(), ec::CompareOp::Equal, 0),
            then,
            otherwise: vec![ec::TxnOp::get(key.clone(), None)],
        };
        s.expect_gone(&name, req.owner);
        let answer = match group::enter(&batch::Lease(self.clone(), s.clone()), || entry) {
            group::Entered::Alone(_turn, entry) => batch::alone(self, s, &entry()).await,
            group::Entered::Queued(rx) => rx.await.unwrap_or_else(|_| {
                Err(ec::Error::IoError(std::io::Error::other(
                    "the transaction's batch was dropped",
                )))
            }),
        };
        let (succeeded, rev, responses) = match answer {
            Ok(r) => r,
            Err(e) => {
                if lease_gone(&e) {
                    // Expired before a keep-alive told us: a new lease for the next try.
                    s.dead.store(true, Ordering::Release);
                    return Ok(Queued::LeaseGone);
                }
                // After a transient error the put may have happened: the sweeper (or the
                // core's clean-up of the failed acquisition) deletes the owner's key and frees
                // the plain key.
                if !transient(&e) {
                    s.settled(&name, req.owner);
                    if plain {
                        self.free_plain(s, &name);
                    }
                }
                return Err(unavailable(e));
            }
        };
        let mut gets = responses.into_iter().filter_map(|r| match r {
            ec::TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
            _ => None,
        });
        if !succeeded {
            // The key exists: this owner's, from an attempt whose answer was lost.
            let kv = gets.next().and_then(|mut k| k.pop());
            let Some(kv) = kv.filter(|kv| KeyData::read(kv.value()).owner == req.owner) else {
                // The plain key is still another acquisition's (one whose answer was lost and
                // whose clean-up has not run yet): this one takes its own key.
                s.settled(&name, req.owner);
                return Ok(Queued::PlainTaken);
            };
            let place = Place {
                name,
                owner: req.owner.to_owned(),
                key,
                revision: kv.create_revision(),
                plain,
            };
            s.settled(&place.name, req.owner);
            let (queue, rev) = self.read_queue(req, &place).await?;
            return Ok(Queued::Placed(
                place,
                queue.unwrap_or_else(|| Queue::new(Vec::new())),
                rev,
            ));
        }
        let place = Place {
            name,
            owner: req.owner.to_owned(),
            key,
            revision: rev,
            plain,
        };
        let kvs = if exclusive {
            let first = gets.next().unwrap_or_default();
            let mut newest = gets.next().unwrap_or_default();
            newest.reverse();
            // [first, …, just ahead, this key] without repeats.
            let mut kvs = first;
            for kv in newest {
                if kvs.iter().all(|k| k.key() != kv.key()) {
                    kvs.push(kv);
                }
            }
            kvs
        } else {
            gets.next().unwrap_or_default()
        };
        s.settled(&place.name, req.owner);
        Ok(Queued::Placed(place, Queue::new(kvs), rev))
    }

    /// Reads the queue of the name up to `place` (the first key and the one just ahead for a
    /// mutex or writer, every key ahead for a reader or permit). `None`: the key is gone.
    async fn read_queue(&self, req: &Request<'_>, place: &Place) -> Result<(Option<Queue>, i64)> {
        let dir = self.dir(&place.name);
        let exclusive = matches!(Entry::of(req.kind, req.mode), Entry::Lock | Entry::Write);
        let mut ops = vec![ec::TxnOp::get(place.key.clone(), None)];
        if exclusive {
            ops.push(ec::TxnOp::get(
                dir.clone(),
                Some(by_create(ec::SortOrder::Ascend).with_limit(1)),
            ));
            ops.push(ec::TxnOp::get(
                dir,
                Some(
                    by_create(ec::SortOrder::Descend)
                        .with_max_create_revision(place.revision - 1)
                        .with_limit(1),
                ),
            ));
        } else {
            ops.push(ec::TxnOp::get(
                dir,
                Some(by_create(ec::SortOrder::Ascend).with_max_create_revision(place.revision)),
            ));
        }
        let resp = self.txn(ec::Txn::new().and_then(ops)).await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            ec::TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
            _ => None,
        });
        let mine = gets.next().unwrap_or_default();
        let Some(mine) = mine
            .into_iter()
            .next()
            .filter(|kv| kv.create_revision() == place.revision)
        else {
            return Ok((None, rev));
        };
        let kvs = if exclusive {
            let mut kvs = gets.next().unwrap_or_default();
            let ahead = gets.next().unwrap_or_default();
            for kv in ahead {
                if kvs.iter().all(|k| k.key() != kv.key()) {
                    kvs.push(kv);
                }
            }
            if kvs.iter().all(|k| k.key() != mine.key()) {
                kvs.push(mine);
            }
            kvs
        } else {
            gets.next().unwrap_or_default()
        };
        Ok((Some(Queue::new(kvs)), rev))
    }

    fn free_plain(&self, s: &Session, name: &str) {
        s.plain_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    /// Deletes an acquisition's key if it is still that acquisition's. `true` if it was.
    async fn delete_key(&self, s: &Session, place: &Place) -> Result<bool> {
        s.expect_gone(&place.name, &place.owner);
        let txn = ec::Txn::new()
            .when([ec::Compare::create_revision(
                place.key.clone(),
                ec::CompareOp::Equal,
                place.revision,
            )])
            .and_then([ec::TxnOp::delete(place.key.clone(), None)]);
        let r = self.txn(txn).await?;
        s.settled(&place.name, &place.owner);
        if place.plain {
            self.free_plain(s, &place.name);
        }
        Ok(r.succeeded())
    }

    /// Deletes the keys of `owner` under `name` (found by their value), freeing the plain key
    /// of lease `s` if it was one of them. `true` if any was deleted.
    async fn delete_owned(&self, s: &Session, name: &str, owner: &str) -> Result<bool> {
        let resp = self
            .get(
                self.dir(name).into_bytes(),
                ec::GetOptions::new().with_prefix(),
            )
            .await?;
        let plain = format!("{}{:x}", self.dir(name), s.lease).into_bytes();
        let mut deleted = false;
        for kv in resp.kvs() {
            if KeyData::read(kv.value()).owner != owner {
                continue;
            }
            let txn = ec::Txn::new()
                .when([ec::Compare::mod_revision(
                    kv.key(),
                    ec::CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([ec::TxnOp::delete(kv.key(), None)]);
            deleted |= self.txn(txn).await?.succeeded();
            if kv.key() == plain.as_slice() {
                self.free_plain(s, name);
            }
        }
        Ok(deleted)
    }

    /// Lists every key under `<prefix>/<escaped start>`, a page at a time.
    async fn scan(&self, start: &str) -> Result<Vec<ec::KeyValue>> {
        const PAGE: i64 = 1000;
        let base = format!("{}/{}", self.shared.target.prefix, escape_name(start));
        let mut from = base.clone().into_bytes();
        let mut out = Vec::new();
        let range_end = prefix_end(base.as_bytes());
        loop {
            let resp = self
                .get(
                    from.clone(),
                    ec::GetOptions::new()
                        .with_range(range_end.clone())
                        .with_limit(PAGE),
                )
                .await?;
            let more = resp.more();
            let mut kvs = resp.kvs().to_vec();
            if let Some(last) = kvs.last() {
                from = last.key().to_vec();
                from.push(0);
            }
            out.append(&mut kvs);
            if !more {
                break;
            }
        }
        Ok(out)
    }

    /// The keys of every lock whose name starts with `start`, by name, in queue order.
    async fn queues(&self, start: &str) -> Result<Vec<(String, Vec<ec::KeyValue>)>> {
        let root = format!("{}/", self.shared.target.prefix);
        let mut by_name: HashMap<String, Vec<ec::KeyValue>> = HashMap::new();
        for kv in self.scan(start).await? {
            let Some(name) = name_of_key(root.as_bytes(), kv.key()) else {
                continue;
            };
            if name.starts_with(start) {
                by_name.entry(name).or_default().push(kv);
            }
        }
        let mut out: Vec<(String, Vec<ec::KeyValue>)> = by_name.into_iter().collect();
        for (_, kvs) in out.iter_mut() {
            kvs.sort_by_key(|kv| kv.create_revision());
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// The lock name of a key under `root` (`<prefix>/`): its first segment unescaped, when a
/// segment follows it (`<root><escaped name>/<lease hex>[_<owner>]`); `None` for any other key
/// (foreign: not a lock's).
fn name_of_key(root: &[u8], key: &[u8]) -> Option<String> {
    let rest = key.strip_prefix(root)?;
    let slash = rest.iter().position(|b| *b == b'/')?;
    std::str::from_utf8(&rest[..slash])
        .ok()
        .and_then(unescape_name)
}

/// The end of the key range of every key starting with `prefix` (etcd's convention).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdAcquisition {
    /// The acquisition's key holds: records the hold (unless the lease has no guarantee left).
    fn grant(&mut self, s: Arc<Session>, place: Place) -> Attempt {
        let Some(valid_for) = s.valid_for() else {
            self.place = Some((s, place));
            return Attempt::Busy(Busy::default());
        };
        let watch = Arc::new(KeyWatch {
            key: place.key.clone(),
            revision: place.revision,
            deleted: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
        });
        self.store.held().insert(
            self.want.owner.clone(),
            HeldKey {
                session: s.clone(),
                place: place.clone(),
                watch,
                watch_id: None,
            },
        );
        let token = place.revision as u64;
        self.plan = None;
        self.place = Some((s, place));
        Attempt::Granted(Grant {
            token: Some(token),
            valid_for: valid_for.min(self.want.lease),
        })
    }

    /// Places the acquisition in its queue: grants, or finds what to watch.
    async fn place(&mut self) -> Result<Attempt> {
        let req = self.want.req();
        let store = self.store.clone();
        if let Some((s, _)) = &self.place {
            if s.is_dead() {
                // Its lease expired with its key: queue again under a new lease.
                self.place = None;
            }
        }
        let (s, place, queue, rev) = match self.place.take() {
            Some((s, place)) => {
                let (queue, rev) = match store.read_queue(&req, &place).await {
                    Ok(q) => q,
                    Err(e) => {
                        self.place = Some((s, place));
                        return Err(e);
                    }
                };
                let Some(queue) = queue else {
                    // The key was removed (a forced release, the lease): queue again next time.
                    if place.plain {
                        store.free_plain(&s, &place.name);
                    }
                    return Ok(Attempt::Busy(Busy {
                        retry_in: Some(Duration::ZERO),
                    }));
                };
                (s, place, queue, rev)
            }
            None => {
                let mut s = store.session().await?;
                let mut queued = store.enqueue(&s, &req, true).await?;
                if let Queued::LeaseGone = queued {
                    s = store.session().await?;
                    queued = store.enqueue(&s, &req, true).await?;
                }
                if let Queued::PlainTaken = queued {
                    queued = store.enqueue(&s, &req, false).await?;
                }
                let Queued::Placed(place, queue, rev) = queued else {
                    return Err(Error::Unavailable(
                        "etcd: the lease expired twice while queueing".into(),
                    ));
                };
                (s, place, queue, rev)
            }
        };
        let mine = Entry::of(req.kind, req.mode);
        if let Some(other) = queue.entries.iter().find(|e| !mine.compatible(**e)) {
            let _ = store.delete_key(&s, &place).await;
            return Err(Error::InvalidConfig(format!(
                "lock {:?} is used as a {} by another holder, not as a {}",
                req.name.as_str(),
                other.kind(),
                req.kind
            )));
        }
        let Some(i) = queue.kvs.iter().position(|kv| kv.key() == place.key) else {
            return Ok(Attempt::Busy(Busy {
                retry_in: Some(Duration::ZERO),
            }));
        };
        match turn(&queue.entries, i) {
            Turn::Holds => Ok(self.grant(s, place)),
            _ if !req.waiting => {
                store.delete_key(&s, &place).await?;
                Ok(Attempt::Busy(Busy::default()))
            }
            Turn::After(j) => {
                let ahead = &queue.kvs[j];
                let plan = Plan::Key(ahead.key().to_vec(), ahead.create_revision());
                self.plan = Some((plan, rev));
                self.place = Some((s, place));
                Ok(Attempt::Busy(Busy::default()))
            }
            Turn::Departures(n) => {
                let ahead = queue.kvs[..i]
                    .iter()
                    .map(|kv| (kv.key().to_vec(), kv.create_revision()))
                    .collect();
                self.plan = Some((Plan::Departures(ahead, n), rev));
                self.place = Some((s, place));
                Ok(Attempt::Busy(Busy::default()))
            }
        }
    }
}

#[async_trait::async_trait]
impl Acquisition for EtcdAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        if let Some((_, place)) = &self.place {
            // Granted before (a repeated attempt): the same hold.
            let held = self.store.held().get(&self.want.owner).cloned();
            if let Some(h) = held.filter(|h| h.place.key == place.key) {
                return Ok(match h.session.valid_for() {
                    Some(v) if !h.watch.deleted.load(Ordering::Acquire) => {
                        Attempt::Granted(Grant {
                            token: Some(place.revision as u64),
                            valid_for: v.min(self.want.lease),
                        })
                    }
                    _ => Attempt::Busy(Busy::default()),
                });
            }
        }
        self.place().await
    }

    async fn changed(&mut self, _busy: &Busy, until: Instant) -> Result<Watch> {
        let Some((plan, rev)) = self.plan.clone() else {
            return Ok(Watch::Changed);
        };
        let Some((_, place)) = self.place.clone() else {
            return Ok(Watch::Changed);
        };
        let dir = self.store.dir(&place.name).into_bytes();
        let store = self.store.clone();
        let wait = async {
            if !matches!(&self.watch, Some(w) if !w.broken.load(Ordering::SeqCst)) {
                self.watch = None;
                self.watch = Some(store.name_watch(&dir).await?);
            }
            let Some(w) = self.watch.as_ref() else {
                return Ok(false);
            };
            let mut rx = w.tx.subscribe();
            let watched_at = w.sent_to.load(Ordering::SeqCst);
            if w.broken.load(Ordering::SeqCst) {
                return Ok(false);
            }
            // The planned keys known to be gone: absent from a read made at or after the plan's
            // (`rev`), or reported deleted after their creation.
            let mut gone: HashSet<Vec<u8>> = HashSet::new();
            if watched_at > rev {
                let still = match &plan {
                    Plan::Key(k, _) => store.get(k.clone(), ec::GetOptions::new().with_keys_only()),
                    Plan::Departures(..) => store.get(
                        dir.clone(),
                        ec::GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_max_create_revision(place.revision - 1),
                    ),
                }
                .await?;
                gone.extend(
                    plan.absent(
                        still
                            .kvs()
                            .iter()
                            .map(|kv| (kv.key(), kv.create_revision())),
                    ),
                );
            }
            while gone.len() < plan.needed() {
                match rx.recv().await {
                    Ok(Departed::Key(key, at)) => {
                        if plan.created(&key).is_some_and(|c| at > c) {
                            gone.insert(key);
                        }
                    }
                    Ok(Departed::Keys(keys, at)) if at >= rev => {
                        gone.extend(plan.absent(keys.iter().map(|(k, c)| (k.as_slice(), *c))));
                    }
                    Ok(Departed::Keys(..)) => {}
                    // Reports were lost: read the queue again.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return Ok(false),
                    Ok(Departed::Ended(true)) => return Ok(false),
                    Ok(Departed::Ended(false))
                    | Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Err(Error::Unavailable("etcd closed a watch".into()));
                    }
                }
            }
            Ok(true)
        };
        match tokio::time::timeout_at(until.into(), wait).await {
            Err(_) => {
                tracing::debug!(
                    name = %place.name,
                    revision = place.revision,
                    read_at = rev,
                    ?plan,
                    "etcd: no wake-up before the slice ended"
                );
                Ok(Watch::Recheck)
            }
            Ok(Err(e)) => Err(e),
            Ok(Ok(_)) => {
                self.store
                    .shared
                    .stats
                    .wakeups
                    .fetch_add(1, Ordering::Relaxed);
                Ok(Watch::Changed)
            }
        }
    }

    async fn cancel(&mut self) -> Result<()> {
        let granted = self.store.held().contains_key(&self.want.owner);
        match self.place.take() {
            Some((s, place)) if !granted => {
                self.store.delete_key(&s, &place).await?;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: true,
            wakeups: Wakeups::Native,
            validity: Validity::Session,
            queues_waiters: true,
            values: true,
            hands_off: false,
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        Box::new(EtcdAcquisition {
            watch: None,
            store: self.clone(),
            want: Want::new(req),
            place: None,
            plan: None,
        })
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        let rec = self.held().remove(hold.owner);
        match rec {
            Some(rec) => {
                if let Some(id) = rec.watch_id {
                    rec.session.unwatch(id);
                }
                if rec.session.is_dead() || rec.watch.deleted.load(Ordering::Acquire) {
                    if rec.place.plain {
                        self.free_plain(&rec.session, &rec.place.name);
                    }
                    return Ok(Released::NotHeld);
                }
                match self.delete_key(&rec.session, &rec.place).await {
                    Ok(true) => Ok(Released::Released),
                    Ok(false) => Ok(Released::NotHeld),
                    // The sweeper deletes the key (the core does not release twice).
                    Err(e) => Err(e),
                }
            }
            None => {
                // No local record (an acquisition abandoned mid-put): find the owner's keys.
                let Some(s) = self.shared.session.lock().await.clone() else {
                    return Ok(Released::NotHeld);
                };
                s.expect_gone(hold.name.as_str(), hold.owner);
                let deleted = self
                    .delete_owned(&s, hold.name.as_str(), hold.owner)
                    .await?;
                s.settled(hold.name.as_str(), hold.owner);
                Ok(if deleted {
                    Released::Released
                } else {
                    Released::NotHeld
                })
            }
        }
    }

    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        let rec = self.held().get(hold.owner).cloned();
        let Some(rec) = rec.filter(|r| r.place.name == hold.name.as_str()) else {
            return Ok(Released::NotHeld);
        };
        if rec.session.is_dead() || rec.watch.deleted.load(Ordering::Acquire) {
            return Ok(Released::NotHeld);
        }
        let key = rec.place.key.clone();
        // Read, then put only if the key is still the owner's (its create revision) and unchanged
        // since the read (a revocation in between is kept); again when only the latter failed.
        for _ in 0..5 {
            let resp = self.get(key.clone(), ec::GetOptions::new()).await?;
            let Some(kv) = resp
                .kvs()
                .first()
                .filter(|kv| kv.create_revision() == rec.place.revision)
            else {
                return Ok(Released::NotHeld);
            };
            let mut d = KeyData::read(kv.value());
            if d.revoked || d.owner != hold.owner {
                return Ok(Released::NotHeld);
            }
            d.value = Some(value.to_owned());
            let data = serde_json::to_vec(&d).map_err(Error::backend)?;
            let put = ec::TxnOp::put(
                key.clone(),
                data,
                Some(ec::PutOptions::new().with_lease(kv.lease())),
            );
            let txn = ec::Txn::new()
                .when([
                    ec::Compare::create_revision(
                        key.clone(),
                        ec::CompareOp::Equal,
                        rec.place.revision,
                    ),
                    ec::Compare::mod_revision(key.clone(), ec::CompareOp::Equal, kv.mod_revision()),
                ])
                .and_then([put]);
            if self.txn(txn).await?.succeeded() {
                return Ok(Released::Released);
            }
        }
        Err(Error::Unavailable(format!(
            "etcd: the key of {:?} kept changing; its value was not replaced",
            hold.name.as_str()
        )))
    }

    /// One keep-alive of the lease answers for every hold (see the module docs); a key cannot
    /// be marked detached (`expire_in` is refused on a session store).
    async fn extend(&self, holds: &[HoldRef<'_>], _detach: bool) -> Result<Vec<Extended>> {
        // The parts of each hold used here (not a clone of its key and names: a client may
        // renew tens of thousands a second).
        let recs: Vec<Option<(Arc<Session>, Arc<KeyWatch>, bool)>> = {
            let held = self.held();
            holds
                .iter()
                .map(|h| {
                    held.get(h.owner)
                        .map(|k| (k.session.clone(), k.watch.clone(), k.watch_id.is_some()))
                })
                .collect()
        };
        // One confirmation per lease in the batch (there is one, unless a lease expired).
        let mut confirmed: HashMap<i64, Option<Duration>> = HashMap::new();
        let mut out = Vec::with_capacity(holds.len());
        let mut unwatched = Vec::new();
        for (h, rec) in holds.iter().zip(recs) {
            let Some((session, watch, watched)) = rec else {
                out.push(Extended::Gone);
                continue;
            };
            if watch.revoked.load(Ordering::Acquire) {
                out.push(Extended::Revoked);
                continue;
            }
            if watch.deleted.load(Ordering::Acquire) {
                out.push(Extended::Gone);
                continue;
            }
            let valid = match confirmed.get(&session.lease) {
                Some(v) => *v,
                None => {
                    let v = session.confirm().await;
                    confirmed.insert(session.lease, v);
                    v
                }
            };
            out.push(match valid {
                Some(v) => {
                    if !watched {
                        unwatched.push((h.owner, session, watch));
                    }
                    Extended::Held {
                        valid_for: v.min(h.lease),
                    }
                }
                None => Extended::Gone,
            });
        }
        // Held keys get their watch at their first renewal.
        for (owner, session, watch) in unwatched {
            let id = session.watch_key(watch.clone()).await;
            let mut held = self.held();
            match held.get_mut(owner) {
                // The same grant (its watch is made for it).
                Some(h) if Arc::ptr_eq(&h.watch, &watch) => h.watch_id = Some(id),
                // Released meanwhile.
                _ => session.unwatch(id),
            }
        }
        Ok(out)
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let mut out = Vec::new();
        for (name, kvs) in self.queues(prefix).await? {
            let datas: Vec<KeyData> = kvs.iter().map(|kv| KeyData::read(kv.value())).collect();
            let entries: Vec<Entry> = datas.iter().map(KeyData::entry).collect();
            let Some(first) = entries.first() else {
                continue;
            };
            let mut info = LockInfo {
                name,
                kind: first.kind(),
                holders: Vec::new(),
                waiters: Vec::new(),
            };
            for (i, (kv, d)) in kvs.iter().zip(datas).enumerate() {
                let owner = if d.owner.is_empty() {
                    // etcd's own keys: the last segment (the lease id) names the holder.
                    let k = String::from_utf8_lossy(kv.key());
                    k.rsplit('/').next().unwrap_or("").to_owned()
                } else {
                    d.owner.clone()
                };
                let meta = HolderMeta {
                    client_id: d.client_id.clone(),
                    host: d.host.clone(),
                    pid: d.pid,
                    value: d.value.clone(),
                };
                if turn(&entries, i) == Turn::Holds {
                    info.holders.push(HolderInfo {
                        owner,
                        meta,
                        mode: entries[i].mode(),
                        token: Some(kv.create_revision() as u64),
                        acquired_at_ms: d.created_at_ms,
                        lease_left_ms: None,
                        status: if d.revoked {
                            HoldStatus::Revoked
                        } else {
                            HoldStatus::Held
                        },
                    });
                } else {
                    let position = info.waiters.len() as u32;
                    info.waiters.push(WaiterInfo {
                        owner,
                        meta,
                        mode: entries[i].mode(),
                        position,
                    });
                }
            }
            out.push(info);
        }
        Ok(out)
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let dir = self.dir(name.as_str());
        let resp = self
            .get(dir.into_bytes(), by_create(ec::SortOrder::Ascend))
            .await?;
        let kvs = resp.kvs();
        let entries: Vec<Entry> = kvs
            .iter()
            .map(|kv| KeyData::read(kv.value()).entry())
            .collect();
        let mut done = Forced::default();
        for (i, kv) in kvs.iter().enumerate() {
            let held = turn(&entries, i) == Turn::Holds;
            let same = ec::Compare::mod_revision(kv.key(), ec::CompareOp::Equal, kv.mod_revision());
            match how {
                // The holder deletes its key when it lets go (its acknowledgement), or the
                // cluster does when its lease ends; waiters keep their places.
                Force::Revoke if held => {
                    let mut d = KeyData::read(kv.value());
                    d.revoked = true;
                    let value = serde_json::to_vec(&d).map_err(Error::backend)?;
                    let put = ec::TxnOp::put(
                        kv.key(),
                        value,
                        Some(ec::PutOptions::new().with_lease(kv.lease())),
                    );
                    let txn = ec::Txn::new().when([same]).and_then([put]);
                    if self.txn(txn).await?.succeeded() {
                        done.revoked += 1;
                    }
                }
                Force::Revoke => {}
                Force::Break => {
                    let txn = ec::Txn::new()
                        .when([same])
                        .and_then([ec::TxnOp::delete(kv.key(), None)]);
                    if self.txn(txn).await?.succeeded() && held {
                        done.removed += 1;
                    }
                }
            }
        }
        Ok(done)
    }

    fn session_timeout(&self) -> Option<Duration> {
        Some(self.shared.target.ttl)
    }

    /// A call retries transient errors for up to `timeout`, each try bounded by `timeout`.
    fn call_timeout(&self) -> Option<Duration> {
        Some(self.call_bound())
    }
}

/// The decoders of keys and values, for the fuzz targets (`dlock::__fuzz`; not API).
#[cfg(feature = "__fuzz")]
pub(crate) mod fuzz {
    use super::*;

    /// The lock name of a key under `prefix` (the URL's), `None` for a foreign key.
    pub fn name_of_key(prefix: &str, key: &[u8]) -> Option<String> {
        super::name_of_key(format!("{prefix}/").as_bytes(), key)
    }

    /// The key dlock puts for an acquisition of `name` under `prefix` on lease `lease`: the plain
    /// one (etcd's own), or with `owner` the one of a second acquisition of the same lease.
    pub fn key(prefix: &str, name: &str, lease: i64, owner: Option<&str>) -> Vec<u8> {
        let dir = format!("{prefix}/{}/", escape_name(name));
        match owner {
            None => format!("{dir}{lease:x}"),
            Some(o) => format!("{dir}{lease:x}_{o}"),
        }
        .into_bytes()
    }

    /// A key's value as the queue and `describe` read it: kind, mode, owner, metadata, revoked.
    pub fn read_value(value: &[u8]) -> (LockKind, Mode, String, HolderMeta, bool) {
        let d = KeyData::read(value);
        let e = d.entry();
        let meta = HolderMeta {
            client_id: d.client_id,
            host: d.host,
            pid: d.pid,
            value: d.value,
        };
        (e.kind(), e.mode(), d.owner, meta, d.revoked)
    }

    /// The value dlock writes for `owner`'s request.
    pub fn write_value(kind: LockKind, mode: Mode, owner: &str, meta: &HolderMeta) -> Vec<u8> {
        encode_key_data(kind, mode, owner, meta, 1).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
