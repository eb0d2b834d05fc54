//! The ZooKeeper store (`zk://host1:2181,host2:2181,host3:2181/chroot?session_timeout=10s`).
//!
//! A queue store: every acquisition is an `EPHEMERAL_SEQUENTIAL` node under the lock's node, and
//! the order of the sequence numbers is the order of the grants.
//!
//! # Layout (Apache Curator's)
//!
//! ```text
//! /<chroot>                                    PERSISTENT (created when missing)
//!   /<escaped lock name>                       CONTAINER (the server removes it once empty)
//!     /_c_<owner uuid>-lock-0000000007         a Mutex (Curator's InterProcessMutex)
//!     /_c_<owner uuid>-__READ__0000000008      a RwLock reader (Curator's InterProcessReadWriteLock)
//!     /_c_<owner uuid>-__WRIT__0000000009      a RwLock writer
//!     /_c_<owner uuid>-semaphore-3-0000000010  a Semaphore(3) permit (dlock's own layout)
//! ```
//!
//! The `_c_<uuid>-` prefix is Curator's *protected mode*: when the reply to a create is lost
//! (connection loss), the client lists the children and finds its node again by the prefix
//! before creating another one. dlock uses the hold's owner token (a UUID) as that uuid, so
//! `release` finds the node even without local state. A create the ensemble does only after that
//! look (it was slow, or the connection changed) leaves a *ghost*: a node of the client's own
//! session that nothing of the client claims. A waiter whose predecessor is such a node deletes
//! it (it reads the predecessor's `ephemeralOwner` when it sets its watch); otherwise it would
//! stay at the head of the queue until the session ends.
//!
//! Grant rules, over the children sorted by sequence number:
//! - mutex and writer: granted when first; otherwise watch **only the predecessor** (no herd);
//! - reader: granted when no writer node precedes it; otherwise watch the nearest writer ahead
//!   (Curator watches the first writer ahead; both are correct, the nearest wakes less often);
//! - semaphore(n): granted while among the first n children. A waiter watches the lock node's
//!   children (any departure ahead may let it in): semaphore waiters are woken together. This is
//!   **not** Curator's `InterProcessSemaphoreV2` layout (leases under `/leases` guarded by a
//!   lock); it is the simple "first n" recipe, so Curator semaphores and dlock semaphores do not
//!   interoperate.
//!
//! Grants are FIFO by construction (`Request::fair` is implied). Node names reveal the kind, so
//! a kind mismatch on one name (mutex vs rwlock vs semaphore(n) vs semaphore(m)) is
//! [`Error::InvalidConfig`] as soon as both sides have nodes.
//!
//! Each node's data is a small JSON object with the holder metadata (`client_id`, `host`, `pid`,
//! `owner`, and `value` for a hold that carries one: an election leader's, replaced by
//! [`Backend::set_value`] with a versioned `setData`). Curator's nodes carry the client's IP
//! address instead; [`Backend::describe`] shows such data as the host and leaves the rest empty.
//!
//! # Lock names → paths
//!
//! A name becomes one path component: ASCII letters, digits, `-` and `_` stay; every other byte
//! of the UTF-8 name (including `/`, `.`, `%`, space and non-ASCII) becomes `%XX` (upper-case
//! hex). `%` itself is always escaped, so decoding is unique and the mapping is injective
//! (`a/b` → `a%2Fb`, `../x` → `%2E%2E%2Fx`, `A b` → `A%20b`). The one component ZooKeeper
//! reserves at the root, `zookeeper`, is written `%7Aookeeper`. Names differing only in case stay
//! separate (ZooKeeper paths are case-sensitive). A 255-byte name is at most 765 characters.
//!
//! # Fencing tokens
//!
//! The token of a hold is the `czxid` of its node: the zxid of the transaction that created it.
//! Zxids are global to the ensemble and strictly increasing, and for one lock name a node created
//! later is granted later, so tokens strictly increase per name (they also increase across
//! names, with gaps).
//!
//! # Sessions and `lost()`
//!
//! One ZooKeeper session per client serves every lock of that client (`Validity::Session`).
//! The backend records the **send time** of the last request the ensemble's *leader* answered
//! (every write counts, plus a tiny `sync` heartbeat every sixth of the session timeout; a read
//! does not, since a follower answers it alone and keeps answering while the leader is stopped,
//! and only the leader expires sessions). The leader learns of a session's activity on a
//! follower from the follower's answer to its next ping, every half tick, so it cannot have
//! expired the session before `that time + session timeout − a quarter of the timeout` (a
//! session lasts at least two ticks unless the ensemble sets a lower `minSessionTimeout`).
//! `extend` makes no round trip; it answers `Held { valid_for: that deadline − now }`, and
//! `Gone` once the session expired or closed, once the hold's node was seen deleted (a watch on
//! every held node, e.g. `dlock unlock`), or when no guarantee is left.
//!
//! A hold is also bounded by its **lease**: `valid_for` is `min(session guarantee, lease)`, and
//! when a hold's lease runs out without renewal (a forgotten guard, `auto_renew(false)`) the
//! core's watchdog marks it lost and releases it here (the core does that for every session
//! store), so its node is deleted as on a lease store. A holder *process* that dies
//! is bounded by the session timeout instead (the ensemble deletes its ephemeral nodes when the
//! session expires), so choose `session_timeout` ≤ the leases you rely on for takeover.
//!
//! Policy for a disconnected (SUSPENDED) client: its holds are trusted only while the session
//! could not have expired — the core fires `lost()` at that deadline less its margin unless a
//! `sync` through a reconnected server refreshes the contact first. EXPIRED (or CLOSED): every
//! hold of the session is lost (`Gone` at the next watchdog round), and the next acquisition
//! opens a **new** session.
//! `Guard::expire_in` is `Unsupported`: an ephemeral node cannot outlive its session.

use super::queue::{turn, Entry, Turn};
use super::*;
mod batch;
pub(crate) mod url;
use crate::error::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use url::ZkTarget;
use zookeeper_client as zk;

/// The session timeout when the URL does not set `session_timeout`.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times an operation that lost its connection is tried before giving up.
const ATTEMPTS: usize = 5;

/// How many lock nodes a backend remembers (forgotten all at once beyond that).
const KNOWN_PARENTS: usize = 65_536;

/// The session's guarantee is the timeout less `timeout / LEADER_LAG` from the last contact.
/// Only the leader expires sessions, and a follower reports the sessions its clients touched
/// in its answers to the leader's pings, every half tick (at most a quarter of the session
/// timeout: the ensemble grants at least two ticks); the leader may not have counted the
/// touch of a request it answered, only the one a ping round before.
const LEADER_LAG: u32 = 4;

/// The longest a held node goes unwatched after its grant (see `watch_held`).
const WATCH_HELD_AFTER: Duration = Duration::from_millis(200);

/// The ZooKeeper store. Obtain it with `dlock::connect("zk://host:2181/chroot")`.
#[derive(Debug, Clone)]
pub struct ZooKeeperBackend {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    hosts: String,
    chroot: String,
    session_timeout: Duration,
    /// The session timeout the server granted the last session, in ms (0 before the first).
    granted_timeout_ms: AtomicU64,
    /// The current session; replaced by a new one after it expired or closed.
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// The nodes of this backend's holds, by owner (for release and renewal).
    held: StdMutex<HashMap<String, NodeRec>>,
    /// The owners of this backend's acquisitions under way (how many of each).
    acquiring: StdMutex<HashMap<String, usize>>,
    /// What this backend's last create under a lock node saw of it (see `create_node`).
    parents: StdMutex<HashMap<String, Parent>>,
    stats: Stats,
}

/// Counters for tests and debugging.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// `getChildren` calls (each re-check of a queue position is one).
    pub(crate) lists: AtomicU64,
    /// Watches that fired while a waiter waited on them.
    pub(crate) wakeups: AtomicU64,
    /// Sessions opened.
    pub(crate) sessions: AtomicU64,
    /// Ghost nodes of this backend's own session deleted (see `is_ghost`).
    pub(crate) ghosts: AtomicU64,
}

struct Session {
    client: zk::Client,
    id: i64,
    timeout: Duration,
    /// Expired, closed or failed authentication: terminal.
    dead: AtomicBool,
    /// Send time of the last request the leader answered (`Via::Leader`).
    contact: StdMutex<Instant>,
    /// Creates under lock nodes not seen yet, waiting for the next group commit.
    batch: batch::Queue,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &format_args!("{:#x}", self.id))
            .field("timeout", &self.timeout)
            .field("dead", &self.dead.load(Ordering::Relaxed))
            .finish()
    }
}

impl Session {
    fn touch(&self, sent: Instant) {
        let mut c = self.contact.lock().unwrap_or_else(|p| p.into_inner());
        if sent > *c {
            *c = sent;
        }
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// What remains of the session's guarantee now (`None`: nothing): the session timeout less
    /// the leader's lag (`LEADER_LAG`), counted from the last contact.
    fn valid_for(&self) -> Option<Duration> {
        if self.is_dead() {
            return None;
        }
        let contact = *self.contact.lock().unwrap_or_else(|p| p.into_inner());
        (self.timeout - self.timeout / LEADER_LAG)
            .checked_sub(contact.elapsed())
            .filter(|d| !d.is_zero())
    }

    /// Runs one request, recording the session's death when the server answered that, and, for
    /// a request the leader answers (`Via::Leader`), the contact when the server answered (even
    /// with an error about the node).
    async fn run<T>(
        &self,
        via: Via,
        f: impl std::future::Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, zk::Error> {
        let sent = Instant::now();
        let r = match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(zk::Error::ConnectionLoss),
        };
        match &r {
            Ok(_)
            | Err(zk::Error::NoNode)
            | Err(zk::Error::NodeExists)
            | Err(zk::Error::NotEmpty)
            | Err(zk::Error::BadVersion)
                if via == Via::Leader =>
            {
                self.touch(sent)
            }
            Err(zk::Error::SessionExpired)
            | Err(zk::Error::ClientClosed)
            | Err(zk::Error::AuthFailed) => self.dead.store(true, Ordering::Release),
            _ => {}
        }
        r
    }

    /// Runs an idempotent request, trying again (every 100 ms) while the connection is lost but
    /// the session may still be alive, for at most the session timeout (a leader fail-over or a
    /// reconnect to another server takes that long at most).
    async fn retry<T, F, Fut>(&self, via: Via, mut f: F) -> Result<T, zk::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, zk::Error>>,
    {
        let started = Instant::now();
        loop {
            match self.run(via, f()).await {
                Err(zk::Error::ConnectionLoss | zk::Error::Timeout)
                    if !self.is_dead() && started.elapsed() < self.timeout =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                r => return r,
            }
        }
    }
}

/// Which server a request's answer comes from, as far as the session's guarantee goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// A write or a `sync`: the ensemble's leader took part before the answer.
    Leader,
    /// A read: the server the session is connected to answers alone, a follower included.
    Any,
}

/// One node of an owner.
#[derive(Debug, Clone)]
struct NodeRec {
    session: Arc<Session>,
    /// `/<escaped name>` (below the chroot).
    lock_path: String,
    /// The child's name.
    node: String,
    czxid: i64,
    granted: bool,
    /// Set by the watch on a held node when it is deleted (e.g. `dlock unlock --break`) and by
    /// `release` (which the core also calls when a hold's lease ran out without renewal).
    deleted: Arc<AtomicBool>,
    /// Set by the watch on a held node when a forced release marks it revoked.
    revoked: Arc<AtomicBool>,
    /// What to watch while waiting: a child name, or `None` for the children of the lock node.
    watch: Option<String>,
}

/// A node just created: its name, its `czxid`, and the lock's children right after the
/// create when they are known without another round trip (`None`: list them).
struct Created {
    node: String,
    czxid: i64,
    children: Option<Vec<String>>,
}

/// What this backend last saw of a lock node (`Shared::parents`; absent: nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parent {
    /// There, and its data may be written (the create's `multi` reads its stat by a `setData`).
    Writable,
    /// There, but its ACL refuses this session's `setData`: plain creates and a list.
    ReadOnly,
}

/// The outcome of a `multi` the server answered: its results, or the index of the operation it
/// refused (the whole transaction then did nothing) and why.
type MultiOutcome = Result<Vec<zk::MultiWriteResult>, (usize, zk::Error)>;

/// Sends a `multi` now; the future answers it (an error: the request itself failed).
fn send_multi<'a>(
    m: &mut zk::MultiWriter<'a>,
) -> impl std::future::Future<Output = Result<MultiOutcome, zk::Error>> + Send + 'a {
    let commit = m.commit();
    async move {
        match commit.await {
            Ok(v) => Ok(Ok(v)),
            Err(zk::MultiWriteError::OperationFailed { index, source }) => Ok(Err((index, source))),
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(source),
        }
    }
}

/// The child's name, its `czxid` and the lock node's number of children from the results of a
/// `multi` that created the child under `lock_path`. Every node a transaction creates or
/// changes carries its zxid, so when the child's own stat is empty (ZooKeeper 3.8 answers a
/// sequential create inside a multi without one: ZOOKEEPER-4026) the lock node's says it;
/// `-1` when none does.
fn created_by(lock_path: &str, results: Vec<zk::MultiWriteResult>) -> Option<(String, i64, i32)> {
    let (mut child, mut czxid, mut kids) = (None, -1, 0);
    for r in results {
        match r {
            zk::MultiWriteResult::Create { path, stat } => {
                let name = path
                    .strip_prefix(lock_path)
                    .and_then(|n| n.strip_prefix('/'));
                match name {
                    Some(n) => {
                        child = Some(n.to_owned());
                        if !stat.is_invalid() {
                            czxid = stat.czxid;
                        }
                    }
                    // The lock node, created by this transaction.
                    None if czxid <= 0 && !stat.is_invalid() => czxid = stat.czxid,
                    None => {}
                }
            }
            zk::MultiWriteResult::SetData { stat } => {
                kids = stat.num_children;
                if czxid <= 0 && !stat.is_invalid() {
                    czxid = stat.mzxid;
                }
            }
            _ => {}
        }
    }
    child.map(|c| (c, czxid, kids))
}

#[derive(Debug, Clone)]
struct Child {
    name: String,
    seq: i64,
    kind: Entry,
}

/// The kind marker of a node name for a request.
fn marker(kind: LockKind, mode: Mode) -> String {
    match (kind, mode) {
        (LockKind::Mutex, _) => "lock-".into(),
        (LockKind::RwLock, Mode::Shared) => "__READ__".into(),
        (LockKind::RwLock, Mode::Exclusive) => "__WRIT__".into(),
        (LockKind::Semaphore { permits }, _) => format!("semaphore-{permits}-"),
    }
}

/// Parses a child's name: its sequence number (the trailing 10 digits ZooKeeper appends, or 19)
/// and kind (the marker just before them). `None` for nodes that are not lock nodes: any other
/// count of trailing digits, no known marker, or a semaphore whose permit count is not a positive
/// number in plain decimal (`semaphore-0-`, `semaphore-+3-`, `semaphore-03-`: no dlock writes
/// them, and a zero-permit entry would stand for no lock kind at all).
fn parse_child(name: &str) -> Option<Child> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits != 10 && digits != 19 {
        return None;
    }
    let seq: i64 = name[name.len() - digits..].parse().ok()?;
    let head = &name[..name.len() - digits];
    let kind = if head.ends_with("__WRIT__") {
        Entry::Write
    } else if head.ends_with("__READ__") {
        Entry::Read
    } else if head.ends_with("lock-") || head.ends_with("__lock__") {
        Entry::Lock
    } else {
        let (before, n) = head.strip_suffix('-')?.rsplit_once('-')?;
        if !before.ends_with("semaphore") || !plain_decimal(n) {
            return None;
        }
        Entry::Semaphore(n.parse().ok().filter(|p| *p > 0)?)
    };
    Some(Child {
        name: name.to_owned(),
        seq,
        kind,
    })
}

/// The owner token in a protected-mode name (`_c_<uuid>-…`).
fn owner_of(node: &str) -> Option<&str> {
    let rest = node.strip_prefix("_c_")?;
    let uuid = rest.get(..36)?;
    (rest.as_bytes().get(36) == Some(&b'-')).then_some(uuid)
}

/// The lock nodes among `names`, in sequence order.
fn sorted_children(names: Vec<String>) -> Vec<Child> {
    let mut v: Vec<Child> = names.iter().filter_map(|n| parse_child(n)).collect();
    v.sort_by(|a, b| a.seq.cmp(&b.seq).then_with(|| a.name.cmp(&b.name)));
    v
}

/// Whether the child at `i` holds, and if not, what it should watch (`Some(None)` = the children
/// of the lock node: a semaphore permit, which any departure ahead may let in).
fn position(children: &[Child], i: usize) -> (bool, Option<String>) {
    let queue: Vec<Entry> = children.iter().map(|c| c.kind).collect();
    match turn(&queue, i) {
        Turn::Holds => (true, None),
        Turn::After(j) => (false, Some(children[j].name.clone())),
        Turn::Departures(_) => (false, None),
    }
}

/// Escapes a lock name into one ZooKeeper path component (see the module docs).
pub fn escape_name(name: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out == "zookeeper" {
        out.replace_range(..1, "%7A");
    }
    out
}

/// The lock name of an escaped path component; `None` if `s` is not the escape of any name.
pub fn unescape_name(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let name = String::from_utf8(out).ok()?;
    (escape_name(&name) == s && LockName::new(name.clone()).is_ok()).then_some(name)
}

fn unavailable(e: zk::Error) -> Error {
    match e {
        zk::Error::BadArguments(_) | zk::Error::InvalidAcl => Error::backend(e),
        // Permanent: the credentials or ACLs must change first (not tried again by a waiter).
        zk::Error::NoAuth | zk::Error::AuthFailed => {
            Error::InvalidConfig(format!("ZooKeeper refused access: {e}"))
        }
        _ => Error::Unavailable(format!("ZooKeeper: {e}")),
    }
}

#[derive(Serialize, Deserialize)]
struct NodeData {
    owner: String,
    client_id: String,
    host: String,
    pid: u32,
    #[serde(default)]
    created_at_ms: u64,
    /// Set by a forced release ([`Force::Revoke`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    revoked: bool,
    /// The hold's value ([`HolderMeta::value`]); absent in plain locks' and older nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

/// Curator's revocation request (`Revoker.attemptRevoke`): the data a revoked Curator lock node
/// is set to. dlock writes it to nodes that are not its own when it revokes them.
const CURATOR_REVOKE: &[u8] = b"__REVOKE__";

/// Whether a node's data says it was revoked (dlock's flag or Curator's message).
fn revoked_data(data: &[u8]) -> bool {
    data == CURATOR_REVOKE || serde_json::from_slice::<NodeData>(data).is_ok_and(|d| d.revoked)
}

/// The owner and metadata `describe` shows for the node `name` with data `data`: dlock's JSON,
/// or for any other data (Curator stores the client's IP address) the owner token of the node's
/// protected prefix (else the node name) and the data as the host when it is short printable
/// text, empty otherwise.
fn node_holder(name: &str, data: &[u8]) -> (String, HolderMeta) {
    match serde_json::from_slice::<NodeData>(data) {
        Ok(d) => (
            d.owner,
            HolderMeta {
                client_id: d.client_id,
                host: d.host,
                pid: d.pid,
                value: d.value,
            },
        ),
        Err(_) => (
            owner_of(name).unwrap_or(name).to_owned(),
            HolderMeta {
                client_id: String::new(),
                host: std::str::from_utf8(data)
                    .ok()
                    .filter(|h| h.len() <= 255 && h.chars().all(|ch| !ch.is_control()))
                    .unwrap_or("")
                    .to_owned(),
                pid: 0,
                value: None,
            },
        ),
    }
}

impl ZooKeeperBackend {
    /// One attempt of `req` whose node (from an earlier attempt) is `node`: creates the node
    /// if there is none, grants if it is first among those it must wait for.
    async fn attempt(&self, req: &Request<'_>, node: &mut Option<NodeRec>) -> Result<Attempt> {
        let rec = match node.take() {
            // Its session expired or the node was removed: start over in a fresh session.
            Some(rec) if rec.session.is_dead() || rec.deleted.load(Ordering::Acquire) => None,
            other => other,
        };
        let (s, mut rec, listed) = match rec {
            Some(rec) => (rec.session.clone(), rec, None),
            None => {
                let s = self.session().await?;
                let lock_path = format!("/{}", escape_name(req.name.as_str()));
                let made = self.create_node(&s, req, &lock_path).await?;
                let rec = NodeRec {
                    session: s.clone(),
                    lock_path,
                    node: made.node,
                    czxid: made.czxid,
                    granted: false,
                    deleted: Arc::new(AtomicBool::new(false)),
                    revoked: Arc::new(AtomicBool::new(false)),
                    watch: None,
                };
                (s, rec, made.children)
            }
        };
        if rec.granted {
            let valid_for = s.valid_for();
            *node = Some(rec.clone());
            return Ok(match valid_for {
                Some(valid_for) => Attempt::Granted(Grant {
                    token: Some(rec.czxid as u64),
                    valid_for: valid_for.min(req.lease),
                }),
                None => Attempt::Busy(Busy::default()),
            });
        }
        let place = match self.check(&s, req, &rec, listed).await {
            Ok(p) => p,
            Err(e) => {
                if matches!(e, Error::InvalidConfig(_)) {
                    let _ = self.delete_node(&s, &rec.lock_path, &rec.node).await;
                } else {
                    *node = Some(rec);
                }
                return Err(e);
            }
        };
        let Some((granted, watch)) = place else {
            // Our node vanished (removed by an administrator): queue again next time.
            return Ok(Attempt::Busy(Busy {
                retry_in: Some(Duration::ZERO),
            }));
        };
        if granted {
            if let Some(valid_for) = s.valid_for() {
                rec.granted = true;
                rec.watch = None;
                self.held().insert(req.owner.to_owned(), rec.clone());
                self.watch_held(&rec, valid_for.min(req.lease));
                *node = Some(rec.clone());
                return Ok(Attempt::Granted(Grant {
                    token: Some(rec.czxid as u64),
                    valid_for: valid_for.min(req.lease),
                }));
            }
        }
        if !req.waiting {
            self.delete_node(&s, &rec.lock_path, &rec.node).await?;
            return Ok(Attempt::Busy(Busy::default()));
        }
        rec.watch = watch;
        *node = Some(rec);
        Ok(Attempt::Busy(Busy::default()))
    }

    /// Waits for the node `rec` waits behind (or the lock's children) to change, or `until`.
    async fn changed(&self, rec: Option<&NodeRec>, owner: &str, until: Instant) -> Result<Watch> {
        let Some(rec) = rec.cloned() else {
            return Ok(Watch::Changed);
        };
        let s = rec.session.clone();
        let watcher = match &rec.watch {
            Some(pred) => {
                let path = format!("{}/{}", rec.lock_path, pred);
                // A data watch (as Curator's): on a node already gone it leaves no watch behind,
                // where `exists` would watch for a creation that never comes.
                match s.run(Via::Any, s.client.get_and_watch_data(&path)).await {
                    Ok((_, stat, _)) if self.is_ghost(&s, pred, stat.ephemeral_owner, owner) => {
                        self.shared.stats.ghosts.fetch_add(1, Ordering::Relaxed);
                        self.delete_node(&s, &rec.lock_path, pred).await?;
                        return Ok(Watch::Changed);
                    }
                    Ok((_, _, w)) => w,
                    // Gone between our listing and the watch: look again at once.
                    Err(zk::Error::NoNode) => return Ok(Watch::Changed),
                    Err(e) => return Err(unavailable(e)),
                }
            }
            None => {
                self.shared.stats.lists.fetch_add(1, Ordering::Relaxed);
                match s
                    .run(Via::Any, s.client.list_and_watch_children(&rec.lock_path))
                    .await
                {
                    Ok((names, w)) => {
                        let children = sorted_children(names);
                        match children.iter().position(|c| c.name == rec.node) {
                            Some(i) if !position(&children, i).0 => w,
                            _ => return Ok(Watch::Changed),
                        }
                    }
                    Err(zk::Error::NoNode) => return Ok(Watch::Changed),
                    Err(e) => return Err(unavailable(e)),
                }
            }
        };
        if tokio::time::timeout_at(until.into(), watcher.changed())
            .await
            .is_err()
        {
            return Ok(Watch::Recheck);
        }
        self.shared.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        Ok(Watch::Changed)
    }

    /// Whether the node `pred` that the acquisition of `owner` waits behind is a ghost: a node of
    /// this very session (its `ephemeralOwner`) that no acquisition or hold of this backend
    /// claims, or an earlier node of `owner` itself. It comes from a create whose answer was
    /// lost after the server had done it (a timeout or a dropped connection, when the look for
    /// the node by its protected prefix came too early or failed); nobody would ever delete it
    /// before the session ends, and every waiter behind it, this session's own included, would
    /// wait for it for ever.
    fn is_ghost(&self, s: &Session, pred: &str, ephemeral_owner: i64, owner: &str) -> bool {
        if ephemeral_owner != s.id {
            return false;
        }
        let Some(of) = owner_of(pred) else {
            return false;
        };
        of == owner || (!self.acquiring().contains_key(of) && !self.held().contains_key(of))
    }

    /// Connects to the ensemble of a `zk://` URL (as [`crate::connect`] does), for callers that
    /// build the client themselves with [`crate::Client::with_backend`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::open(&url::parse(url)?).await
    }

    /// Connects: opens the session and creates the chroot when missing.
    pub(crate) async fn open(target: &ZkTarget) -> Result<Self> {
        let b = ZooKeeperBackend {
            shared: Arc::new(Shared {
                hosts: target.hosts.clone(),
                chroot: target.chroot.clone(),
                session_timeout: target.session_timeout,
                granted_timeout_ms: AtomicU64::new(0),
                session: tokio::sync::Mutex::new(None),
                held: StdMutex::new(HashMap::new()),
                acquiring: StdMutex::new(HashMap::new()),
                parents: StdMutex::new(Default::default()),
                stats: Stats::default(),
            }),
        };
        b.session().await?;
        Ok(b)
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// The id of the current session (for tests and logs).
    #[cfg(test)]
    pub(crate) async fn session_info(&self) -> Option<(zk::SessionInfo, i64)> {
        let s = self.shared.session.lock().await;
        s.as_ref().map(|s| (s.client.session().clone(), s.id))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeRec>> {
        self.shared.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn acquiring(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.shared
            .acquiring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The live session, opening a new one if there is none or it expired.
    async fn session(&self) -> Result<Arc<Session>> {
        let mut cur = self.shared.session.lock().await;
        if let Some(s) = cur.as_ref() {
            if !s.is_dead() {
                return Ok(s.clone());
            }
        }
        let s = self.open_session().await?;
        *cur = Some(s.clone());
        Ok(s)
    }

    async fn open_session(&self) -> Result<Arc<Session>> {
        let sh = &self.shared;
        let sent = Instant::now();
        let connect = zk::Client::connector()
            .with_session_timeout(sh.session_timeout)
            .connect(&sh.hosts);
        let client = match tokio::time::timeout(sh.session_timeout * 2, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(Error::Unavailable(format!(
                    "cannot open a ZooKeeper session with {}: {e}",
                    sh.hosts
                )))
            }
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "no ZooKeeper server of {} answered within {:?}",
                    sh.hosts,
                    sh.session_timeout * 2
                )))
            }
        };
        if sh.chroot != "/" {
            let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            client.mkdir(&sh.chroot, &opts).await.map_err(unavailable)?;
        }
        let timeout = client.session_timeout();
        sh.granted_timeout_ms.store(
            u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let id = client.session_id().0;
        let client = client
            .chroot(sh.chroot.clone())
            .map_err(|_| Error::InvalidConfig(format!("bad ZooKeeper chroot {:?}", sh.chroot)))?;
        let session = Arc::new(Session {
            client,
            id,
            timeout,
            dead: AtomicBool::new(false),
            contact: StdMutex::new(sent),
            batch: batch::queue(),
        });
        sh.stats.sessions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            session = format_args!("{id:#x}"),
            ?timeout,
            "ZooKeeper session opened"
        );
        tokio::spawn(heartbeat(
            Arc::downgrade(&session),
            session.client.state_watcher(),
            timeout,
        ));
        Ok(session)
    }

    /// Creates the chroot again after it was removed under us (from the root).
    async fn ensure_chroot(&self, s: &Session) -> Result<()> {
        if self.shared.chroot == "/" {
            return Err(Error::Unavailable(
                "ZooKeeper: the root node is missing".into(),
            ));
        }
        let root = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let unrooted = s
            .client
            .clone()
            .chroot("/")
            .map_err(|_| Error::InvalidConfig("cannot address the ZooKeeper root".into()))?;
        s.run(Via::Leader, unrooted.mkdir(&self.shared.chroot, &root))
            .await
            .map_err(unavailable)
    }

    async fn list(&self, s: &Session, lock_path: &str) -> Result<Vec<String>, zk::Error> {
        s.retry(Via::Any, || {
            self.shared.stats.lists.fetch_add(1, Ordering::Relaxed);
            s.client.list_children(lock_path)
        })
        .await
    }

    fn parent(&self, lock_path: &str) -> Option<Parent> {
        self.parents().get(lock_path).copied()
    }

    fn note_parent(&self, lock_path: &str, seen: Option<Parent>) {
        let mut p = self.parents();
        match seen {
            None => {
                p.remove(lock_path);
            }
            Some(state) => {
                if p.len() >= KNOWN_PARENTS && !p.contains_key(lock_path) {
                    p.clear();
                }
                p.insert(lock_path.to_owned(), state);
            }
        }
    }

    fn parents(&self) -> std::sync::MutexGuard<'_, HashMap<String, Parent>> {
        self.shared
            .parents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Creates the owner's node (protected mode) in one round trip that also tells whether
    /// anyone else is queued, so an uncontended grant costs one write and no read:
    /// - a lock node not seen before is created together with the owner's node in one `multi`
    ///   (the owner's node is then alone), through the session's group commit (`batch.rs`:
    ///   new names created at once share a transaction); if it was there, the `multi` is
    ///   refused and
    /// - under a lock node seen before, a `multi` creates the owner's node and sets the lock
    ///   node's (empty) data, whose answer carries the lock node's number of children just
    ///   after the create: 1 means the owner's node is alone, otherwise its children are listed
    ///   next;
    /// - under a lock node whose data this session may not write (its ACL), a plain create
    ///   with a list sent right behind it (a session's requests are answered in order, so the
    ///   list sees the new node).
    ///
    /// A lock node that vanished (the server removes an empty container) is created again at
    /// once; after a lost connection, the node is looked for by its protected prefix.
    async fn create_node(
        &self,
        s: &Arc<Session>,
        req: &Request<'_>,
        lock_path: &str,
    ) -> Result<Created> {
        let prefix = format!("_c_{}-", req.owner);
        let path = format!("{lock_path}/{prefix}{}", marker(req.kind, req.mode));
        let data = serde_json::to_vec(&NodeData {
            owner: req.owner.to_owned(),
            client_id: req.meta.client_id.clone(),
            host: req.meta.host.clone(),
            pid: req.meta.pid,
            created_at_ms: crate::clock::unix_ms(),
            revoked: false,
            value: req.meta.value.clone(),
        })
        .map_err(Error::backend)?;
        let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (mut losses, mut turns) = (0, 0);
        loop {
            // What the lock node turned out to be sends the next turn another way; a few turns
            // settle it unless it keeps appearing and vanishing.
            turns += 1;
            if turns > 4 * ATTEMPTS {
                return Err(Error::Unavailable(format!(
                    "ZooKeeper: the lock node {lock_path} kept appearing and vanishing"
                )));
            }
            let parent = self.parent(lock_path);
            let outcome = match parent {
                None => {
                    let op = batch::Op {
                        lock_path: lock_path.to_owned(),
                        child: path.clone(),
                        data: data.clone(),
                    };
                    match group::enter(&batch::Creates(self.clone(), s.clone()), || op) {
                        group::Entered::Alone(_turn, op) => batch::alone(self, s, &op()).await,
                        group::Entered::Queued(rx) => match rx.await {
                            Ok(batch::Answer::Done(r)) => r,
                            Ok(batch::Answer::Again) => continue,
                            // The group commit's task went away (the runtime is shutting down).
                            Err(_) => Err(zk::Error::ClientClosed),
                        },
                    }
                }
                Some(Parent::Writable) => {
                    let mut m = s.client.new_multi_writer();
                    m.add_create(&path, &data, &opts).map_err(unavailable)?;
                    m.add_set_data(lock_path, &[], None).map_err(unavailable)?;
                    s.run(Via::Leader, send_multi(&mut m)).await
                }
                Some(Parent::ReadOnly) => {
                    let create = s.client.create(&path, &data, &opts);
                    self.shared.stats.lists.fetch_add(1, Ordering::Relaxed);
                    let listed = s.client.list_children(lock_path);
                    let (made, listed) =
                        tokio::join!(s.run(Via::Leader, create), s.run(Via::Any, listed));
                    match made {
                        Ok((stat, seq)) => {
                            let node = format!("{prefix}{}{seq}", marker(req.kind, req.mode));
                            let czxid = self.czxid_of(s, lock_path, &node, stat.czxid).await?;
                            return Ok(Created {
                                node,
                                czxid,
                                children: listed.ok(),
                            });
                        }
                        Err(zk::Error::NoNode) => {
                            self.note_parent(lock_path, None);
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            let e = match outcome {
                Ok(Ok(results)) => {
                    let Some((node, czxid, kids)) = created_by(lock_path, results) else {
                        return Err(Error::backend(zk::Error::UnexpectedError(
                            "a multi create answered without the node".into(),
                        )));
                    };
                    self.note_parent(lock_path, Some(Parent::Writable));
                    let czxid = self.czxid_of(s, lock_path, &node, czxid).await?;
                    // Alone: the lock node is new, or has this one child.
                    let alone = parent.is_none() || kids == 1;
                    let children = alone.then(|| vec![node.clone()]);
                    return Ok(Created {
                        node,
                        czxid,
                        children,
                    });
                }
                // The new lock node was there already: create under it.
                Ok(Err((0, zk::Error::NodeExists))) if parent.is_none() => {
                    self.note_parent(lock_path, Some(Parent::Writable));
                    continue;
                }
                // The new lock node has no parent: the chroot was removed under us.
                Ok(Err((0, zk::Error::NoNode))) if parent.is_none() => {
                    self.ensure_chroot(s).await?;
                    continue;
                }
                // The lock node is gone (an empty container removed by the server).
                Ok(Err((0, zk::Error::NoNode))) => {
                    self.note_parent(lock_path, None);
                    continue;
                }
                // Its data may not be written here: plain creates from now on.
                Ok(Err((1, zk::Error::NoAuth))) if parent.is_some() => {
                    self.note_parent(lock_path, Some(Parent::ReadOnly));
                    continue;
                }
                Ok(Err((_, e))) | Err(e) => e,
            };
            if !matches!(e, zk::Error::ConnectionLoss | zk::Error::Timeout) {
                return Err(unavailable(e));
            }
            // The create may have happened: find our node by its protected prefix.
            if let Ok(names) = self.list(s, lock_path).await {
                if let Some(n) = names.iter().find(|n| n.starts_with(&prefix)) {
                    let stat = s
                        .run(Via::Any, s.client.check_stat(&format!("{lock_path}/{n}")))
                        .await
                        .map_err(unavailable)?;
                    if let Some(stat) = stat {
                        return Ok(Created {
                            node: n.clone(),
                            czxid: stat.czxid,
                            children: Some(names),
                        });
                    }
                }
            }
            losses += 1;
            if losses >= ATTEMPTS || s.is_dead() {
                return Err(unavailable(e));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `czxid` a create answered, or (a server that does not say: 3.4's create) the node's.
    async fn czxid_of(&self, s: &Session, lock_path: &str, node: &str, czxid: i64) -> Result<i64> {
        if czxid > 0 {
            return Ok(czxid);
        }
        let path = format!("{lock_path}/{node}");
        match s.retry(Via::Any, || s.client.check_stat(&path)).await {
            Ok(Some(stat)) => Ok(stat.czxid),
            Ok(None) => Err(Error::Unavailable(format!(
                "ZooKeeper: the node {path} vanished right after its create"
            ))),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Places `rec` among the lock's children: those `listed` right after its create when they
    /// include it, else listed now. `Ok(None)`: the node is gone.
    async fn check(
        &self,
        s: &Session,
        req: &Request<'_>,
        rec: &NodeRec,
        listed: Option<Vec<String>>,
    ) -> Result<Option<(bool, Option<String>)>> {
        let names = match listed.filter(|n| n.contains(&rec.node)) {
            Some(n) => n,
            None => match self.list(s, &rec.lock_path).await {
                Ok(n) => n,
                Err(zk::Error::NoNode) => return Ok(None),
                Err(e) => return Err(unavailable(e)),
            },
        };
        let children = sorted_children(names);
        let Some(i) = children.iter().position(|c| c.name == rec.node) else {
            return Ok(None);
        };
        let mine = Entry::of(req.kind, req.mode);
        if let Some(other) = children.iter().find(|c| !mine.compatible(c.kind)) {
            return Err(Error::InvalidConfig(format!(
                "lock {:?} is used as a {} by another holder, not as a {}",
                req.name.as_str(),
                other.kind.kind(),
                req.kind
            )));
        }
        Ok(Some(position(&children, i)))
    }

    async fn delete_node(&self, s: &Session, lock_path: &str, node: &str) -> Result<bool> {
        let path = format!("{lock_path}/{node}");
        match s.retry(Via::Leader, || s.client.delete(&path, None)).await {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => Ok(false),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Watches a held node so that `extend` learns of its deletion or revocation without a
    /// round trip.
    /// The watch is set a little after the grant (an eighth of the hold's validity, at most
    /// [`WATCH_HELD_AFTER`]): a hold released sooner never pays for its read, and a deletion or
    /// revocation in the meantime is seen by that first read, so `lost()` (fired by the
    /// watchdog's `extend` rounds, every third of the validity) comes at most that much later.
    fn watch_held(&self, rec: &NodeRec, valid_for: Duration) {
        let s = rec.session.clone();
        let (deleted, revoked) = (rec.deleted.clone(), rec.revoked.clone());
        let path = format!("{}/{}", rec.lock_path, rec.node);
        let after = (valid_for / 8).min(WATCH_HELD_AFTER);
        tokio::spawn(async move {
            let weak = Arc::downgrade(&s);
            drop(s);
            tokio::time::sleep(after).await;
            if deleted.load(Ordering::Acquire) {
                return;
            }
            loop {
                let Some(s) = weak.upgrade() else { return };
                let (data, watcher) = match s.client.get_and_watch_data(&path).await {
                    Ok((data, _, watcher)) => (data, watcher),
                    Err(zk::Error::NoNode) => {
                        deleted.store(true, Ordering::Release);
                        return;
                    }
                    // The connection or the session: the session's own checks decide.
                    Err(_) => return,
                };
                if revoked_data(&data) {
                    revoked.store(true, Ordering::Release);
                    return;
                }
                drop(s);
                let ev = watcher.changed().await;
                match ev.event_type {
                    zk::EventType::NodeDeleted => {
                        deleted.store(true, Ordering::Release);
                        return;
                    }
                    // Read the new data (and watch again).
                    zk::EventType::NodeDataChanged => {}
                    zk::EventType::Session => {
                        if let Some(s) = weak.upgrade() {
                            if ev.session_state.is_terminated() {
                                s.dead.store(true, Ordering::Release);
                            }
                        }
                        return;
                    }
                    _ => {}
                }
            }
        });
    }

    /// Replaces the value in the data of the owner's held node: read, then `setData` with the
    /// version read (so nothing written in between is lost), again when the version moved.
    /// `NotHeld` when the node is gone, revoked or not this backend's grant.
    async fn set_node_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        let lock_path = format!("/{}", escape_name(hold.name.as_str()));
        let rec = self.held().get(hold.owner).cloned();
        let Some(rec) = rec.filter(|r| r.lock_path == lock_path) else {
            return Ok(Released::NotHeld);
        };
        let s = &rec.session;
        if !rec.granted || s.is_dead() || rec.deleted.load(Ordering::Acquire) {
            return Ok(Released::NotHeld);
        }
        let path = format!("{}/{}", rec.lock_path, rec.node);
        let gone = |e: &zk::Error| {
            matches!(
                e,
                zk::Error::NoNode | zk::Error::SessionExpired | zk::Error::ClientClosed
            )
        };
        for _ in 0..ATTEMPTS {
            let (data, stat) = match s.retry(Via::Any, || s.client.get_data(&path)).await {
                Ok(d) => d,
                Err(e) if gone(&e) => return Ok(Released::NotHeld),
                Err(e) => return Err(unavailable(e)),
            };
            let mut d = serde_json::from_slice::<NodeData>(&data).map_err(Error::backend)?;
            if d.revoked {
                return Ok(Released::NotHeld);
            }
            d.value = Some(value.to_owned());
            let new = serde_json::to_vec(&d).map_err(Error::backend)?;
            match s
                .run(
                    Via::Leader,
                    s.client.set_data(&path, &new, Some(stat.version)),
                )
                .await
            {
                Ok(_) => return Ok(Released::Released),
                Err(e) if gone(&e) => return Ok(Released::NotHeld),
                // Changed under us (a revocation, say): read it again.
                Err(zk::Error::BadVersion) => continue,
                Err(e) => return Err(unavailable(e)),
            }
        }
        Err(Error::Unavailable(format!(
            "ZooKeeper: the data of {path} kept changing; its value was not replaced"
        )))
    }

    /// Revokes a holder's node: dlock's own nodes get `revoked` in their data, other nodes
    /// (Curator's) get Curator's revocation message. `false` if the node is gone.
    async fn revoke_node(&self, s: &Session, path: &str) -> Result<bool> {
        loop {
            let (data, stat) = match s.run(Via::Any, s.client.get_data(path)).await {
                Ok(d) => d,
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(unavailable(e)),
            };
            let new = match serde_json::from_slice::<NodeData>(&data) {
                Ok(mut d) => {
                    d.revoked = true;
                    serde_json::to_vec(&d).map_err(Error::backend)?
                }
                Err(_) => CURATOR_REVOKE.to_vec(),
            };
            match s
                .run(
                    Via::Leader,
                    s.client.set_data(path, &new, Some(stat.version)),
                )
                .await
            {
                Ok(_) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(false),
                // Changed under us: read it again.
                Err(zk::Error::BadVersion) => continue,
                Err(e) => return Err(unavailable(e)),
            }
        }
    }
}

/// Keeps the session's contact time fresh (a tiny `sync` every sixth of the timeout) and
/// marks the session dead on a terminal state. Ends with the session.
async fn heartbeat(session: Weak<Session>, mut states: zk::StateWatcher, timeout: Duration) {
    let every = timeout / 6;
    loop {
        tokio::select! {
            st = states.changed() => {
                let Some(s) = session.upgrade() else { return };
                tracing::debug!(session = format_args!("{:#x}", s.id), state = %st, "ZooKeeper session state");
                if st.is_terminated() {
                    s.dead.store(true, Ordering::Release);
                    return;
                }
            }
            _ = tokio::time::sleep(every) => {
                let Some(s) = session.upgrade() else { return };
                if s.is_dead() {
                    return;
                }
                let _ = s.run(Via::Leader, s.client.sync("/")).await;
            }
        }
    }
}

#[async_trait::async_trait]
impl Backend for ZooKeeperBackend {
    fn name(&self) -> &'static str {
        "zk"
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
        *self.acquiring().entry(req.owner.to_owned()).or_default() += 1;
        Box::new(ZkAcquisition {
            store: self.clone(),
            want: Want::new(req),
            rec: None,
        })
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        // The record stays until the node is gone: meanwhile a waiter of this session behind it
        // must not take the node for a ghost (`is_ghost`).
        let rec = self.held().get(hold.owner).cloned();
        match rec {
            Some(rec) => {
                if rec.session.is_dead() || rec.deleted.swap(true, Ordering::AcqRel) {
                    self.held().remove(hold.owner);
                    return Ok(Released::NotHeld);
                }
                match self
                    .delete_node(&rec.session, &rec.lock_path, &rec.node)
                    .await
                {
                    Ok(deleted) => {
                        self.held().remove(hold.owner);
                        Ok(if deleted {
                            Released::Released
                        } else {
                            Released::NotHeld
                        })
                    }
                    Err(e) => {
                        rec.deleted.store(false, Ordering::Release);
                        Err(e)
                    }
                }
            }
            None => {
                // No local record (an acquisition abandoned mid-create): find the node by its
                // protected prefix in the current session.
                let s = self.session().await?;
                let lock_path = format!("/{}", escape_name(hold.name.as_str()));
                let prefix = format!("_c_{}-", hold.owner);
                let names = match self.list(&s, &lock_path).await {
                    Ok(n) => n,
                    Err(zk::Error::NoNode) => return Ok(Released::NotHeld),
                    Err(e) => return Err(unavailable(e)),
                };
                let mut released = Released::NotHeld;
                for n in names.iter().filter(|n| n.starts_with(&prefix)) {
                    if self.delete_node(&s, &lock_path, n).await? {
                        released = Released::Released;
                    }
                }
                Ok(released)
            }
        }
    }

    /// A node cannot be marked detached (`expire_in` is refused on a session store).
    async fn extend(&self, holds: &[HoldRef<'_>], _detach: bool) -> Result<Vec<Extended>> {
        let nodes = self.held();
        Ok(holds
            .iter()
            .map(|h| match nodes.get(h.owner) {
                Some(rec) if rec.granted && rec.revoked.load(Ordering::Acquire) => {
                    Extended::Revoked
                }
                Some(rec) if rec.granted && !rec.deleted.load(Ordering::Acquire) => {
                    match rec.session.valid_for() {
                        Some(valid_for) => Extended::Held {
                            valid_for: valid_for.min(h.lease),
                        },
                        None => Extended::Gone,
                    }
                }
                _ => Extended::Gone,
            })
            .collect())
    }

    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        self.set_node_value(hold, value).await
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let s = self.session().await?;
        // The session's server (a follower, perhaps) catches up with the leader first, so the
        // listing shows every grant committed before it, other clients' included. Tried again
        // while the connection is lost, as the listing's reads are.
        s.retry(Via::Leader, || s.client.sync("/"))
            .await
            .map_err(unavailable)?;
        let tops = match self.list(&s, "/").await {
            Ok(n) => n,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(unavailable(e)),
        };
        let mut out = Vec::new();
        for top in tops {
            if self.shared.chroot == "/" && top == "zookeeper" {
                continue;
            }
            let Some(name) = unescape_name(&top) else {
                continue;
            };
            if !name.starts_with(prefix) {
                continue;
            }
            let lock_path = format!("/{top}");
            let children = match self.list(&s, &lock_path).await {
                Ok(n) => sorted_children(n),
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(unavailable(e)),
            };
            let Some(first) = children.first() else {
                continue;
            };
            let kind = first.kind.kind();
            let mut info = LockInfo {
                name,
                kind,
                holders: Vec::new(),
                waiters: Vec::new(),
            };
            for (i, c) in children.iter().enumerate() {
                let path = format!("{lock_path}/{}", c.name);
                let (data, stat) = match s.run(Via::Any, s.client.get_data(&path)).await {
                    Ok(d) => d,
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(unavailable(e)),
                };
                let (owner, meta) = node_holder(&c.name, &data);
                if position(&children, i).0 {
                    info.holders.push(HolderInfo {
                        owner,
                        meta,
                        mode: c.kind.mode(),
                        token: Some(stat.czxid as u64),
                        acquired_at_ms: stat.ctime as u64,
                        lease_left_ms: None,
                        status: if revoked_data(&data) {
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
                        mode: c.kind.mode(),
                        position,
                    });
                }
            }
            if !info.holders.is_empty() {
                out.push(info);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let s = self.session().await?;
        let lock_path = format!("/{}", escape_name(name.as_str()));
        let children = match self.list(&s, &lock_path).await {
            Ok(n) => sorted_children(n),
            Err(zk::Error::NoNode) => return Ok(Forced::default()),
            Err(e) => return Err(unavailable(e)),
        };
        let mut done = Forced::default();
        for (i, c) in children.iter().enumerate() {
            let held = position(&children, i).0;
            match how {
                // The holder deletes its node when it lets go (its acknowledgement), or the
                // ensemble does when its session ends; waiters keep their places.
                Force::Revoke if held => {
                    let path = format!("{lock_path}/{}", c.name);
                    if self.revoke_node(&s, &path).await? {
                        done.revoked += 1;
                    }
                }
                Force::Revoke => {}
                Force::Break => {
                    if self.delete_node(&s, &lock_path, &c.name).await? && held {
                        done.removed += 1;
                    }
                }
            }
        }
        Ok(done)
    }

    fn session_timeout(&self) -> Option<Duration> {
        let ms = self.shared.granted_timeout_ms.load(Ordering::Relaxed);
        Some(if ms == 0 {
            self.shared.session_timeout
        } else {
            Duration::from_millis(ms)
        })
    }
}

/// One acquisition: its node in the lock's queue (from its first attempt on) and what it
/// watches while it waits.
struct ZkAcquisition {
    store: ZooKeeperBackend,
    want: Want,
    rec: Option<NodeRec>,
}

impl Drop for ZkAcquisition {
    fn drop(&mut self) {
        let mut acquiring = self.store.acquiring();
        if let Some(n) = acquiring.get_mut(&self.want.owner) {
            *n -= 1;
            if *n == 0 {
                acquiring.remove(&self.want.owner);
            }
        }
    }
}

#[async_trait::async_trait]
impl Acquisition for ZkAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        let req = self.want.req();
        self.store.attempt(&req, &mut self.rec).await
    }

    async fn changed(&mut self, _busy: &Busy, until: Instant) -> Result<Watch> {
        let owner = self.want.owner.clone();
        self.store.changed(self.rec.as_ref(), &owner, until).await
    }

    async fn cancel(&mut self) -> Result<()> {
        match self.rec.take() {
            Some(rec) if !rec.granted => {
                self.store
                    .delete_node(&rec.session, &rec.lock_path, &rec.node)
                    .await?;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The decoders of node names and node data, for the fuzz targets (`dlock::__fuzz`; not API).
#[cfg(feature = "__fuzz")]
pub(crate) mod fuzz {
    use super::*;

    /// A child node's name as the grant rules read it: sequence number, kind and mode; `None`
    /// for a node that is not a lock node (skipped).
    pub fn parse_child(name: &str) -> Option<(i64, LockKind, Mode)> {
        super::parse_child(name).map(|c| (c.seq, c.kind.kind(), c.kind.mode()))
    }

    /// The name of the node dlock creates for `owner`'s request, once ZooKeeper appended `seq`.
    pub fn node_name(owner: &str, kind: LockKind, mode: Mode, seq: i64) -> String {
        format!("_c_{owner}-{}{seq:010}", marker(kind, mode))
    }

    /// The owner token of a protected-mode node name.
    pub fn owner_of(name: &str) -> Option<&str> {
        super::owner_of(name)
    }

    /// What `describe` shows of a node: owner and metadata.
    pub fn node_holder(name: &str, data: &[u8]) -> (String, HolderMeta) {
        super::node_holder(name, data)
    }

    /// Whether a node's data marks it revoked.
    pub fn revoked(data: &[u8]) -> bool {
        revoked_data(data)
    }

    /// The data dlock writes to a node (as `create_node`, and `force_release` for `revoked`).
    pub fn node_data(owner: &str, meta: &HolderMeta, revoked: bool) -> Vec<u8> {
        serde_json::to_vec(&NodeData {
            owner: owner.to_owned(),
            client_id: meta.client_id.clone(),
            host: meta.host.clone(),
            pid: meta.pid,
            created_at_ms: 1,
            revoked,
            value: meta.value.clone(),
        })
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
