//! `dlock bench-worker` (hidden): one process of a contended workload. It connects, prints
//! `ready`, waits for `go START_NS END_NS` on stdin, runs `--tasks` tasks that acquire and
//! release one lock name (with `--stripes`: the stripe of a random key of a striped lock) until
//! END_NS (CLOCK_REALTIME), and prints one JSON line with every acquisition's timestamps.
//!
//! With `--elect` it is one candidate of E1 instead: it campaigns for the election `--name` and
//! says so on stdout (`campaigning NS`, then `leading TERM NS`), then leads until its stdin ends
//! (it resigns) or it is killed.

use super::stats::now_ns;
use super::store::{counted_client, CountSnap, Target};
use crate::exit::{CliResult, Failure, OK};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// Arguments of one worker process (internal).
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The store URL.
    #[arg(long)]
    pub url: String,
    /// The lock name.
    #[arg(long)]
    pub name: String,
    /// Tasks (waiters) in this process.
    #[arg(long, default_value_t = 1)]
    pub tasks: u32,
    /// Time inside the lock, microseconds.
    #[arg(long, default_value_t = 0)]
    pub hold_us: u64,
    /// Time outside the lock after each release before the next request, microseconds.
    #[arg(long, default_value_t = 0)]
    pub pause_us: u64,
    /// Fair (FIFO) mode.
    #[arg(long)]
    pub fair: bool,
    /// `dlock`, `rslock` or `etcd-lock` (the other peers run as processes of their own).
    #[arg(long, default_value = "dlock")]
    pub lib: String,
    /// This process's index (reported back).
    #[arg(long, default_value_t = 0)]
    pub proc_index: u32,
    /// At most this many acquisitions per task.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_per_task: u64,
    /// T1: lock the stripe of a random key of `striped(name, stripes)` (0: the one name).
    #[arg(long, default_value_t = 0)]
    pub stripes: u32,
    /// T1: the number of keys drawn from (`k0` … `k{keys-1}`).
    #[arg(long, default_value_t = 1024)]
    pub keys: u32,
    /// E1: campaign for the election `--name` instead of taking the lock.
    #[arg(long)]
    pub elect: bool,
    /// The lease of the client's holds (E1: the term), ms [default: dlock's default lease].
    #[arg(long, default_value_t = 0)]
    pub lease_ms: u64,
}

/// One acquisition: process, task, request, grant, release start, release end (ns, realtime).
pub type Rec = [i64; 6];

/// What a worker prints.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WorkerOut {
    /// Every acquisition.
    pub records: Vec<Rec>,
    /// Failed acquisitions or releases (not counting the end of the window).
    pub errors: u64,
    /// The first error.
    pub first_error: Option<String>,
    /// Backend calls (dlock only; absent from a peer process's report).
    #[serde(default)]
    pub ops: CountSnap,
    /// The stripe of each record, in order (`--stripes`; empty otherwise).
    #[serde(default)]
    pub stripes: Vec<u32>,
}

#[derive(Default)]
struct Acc {
    records: Vec<Rec>,
    stripes: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

impl Acc {
    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}

/// Records one acquisition of a worker task (and its stripe, T1), and its release's error if
/// any.
fn record(acc: &StdMutex<Acc>, row: Rec, released: Result<(), String>, stripe: Option<u32>) {
    let mut acc = acc.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = released {
        acc.error(e);
    }
    acc.records.push(row);
    if let Some(s) = stripe {
        acc.stripes.push(s);
    }
}

/// What a dlock worker task locks: one mutex, or the stripe of a random key (T1).
enum Taker {
    Mutex(dlock::Mutex),
    Striped(dlock::Striped, u32),
}

impl Taker {
    /// One acquisition within `left`, and the stripe it took (striped only).
    async fn take(&self, left: Duration) -> (dlock::Result<dlock::Guard>, Option<u32>) {
        match self {
            Taker::Mutex(m) => (m.acquire_timeout(left).await, None),
            Taker::Striped(s, keys) => {
                let key = format!(
                    "k{}",
                    rand::Rng::gen_range(&mut rand::thread_rng(), 0..*keys)
                );
                let stripe = s.stripe_of(&key);
                (s.lock_timeout(&key, left).await, Some(stripe))
            }
        }
    }
}

/// Counts a failed acquisition: `true` once there were too many to go on, else after a short
/// pause before the next try.
async fn failed(acc: &StdMutex<Acc>, e: String) -> bool {
    let stop = {
        let mut acc = acc.lock().unwrap_or_else(|p| p.into_inner());
        acc.error(e);
        acc.errors > 100
    };
    if !stop {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop
}

async fn hold(us: u64) {
    if us == 0 {
        return;
    }
    let d = Duration::from_micros(us);
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::MultiThread
    {
        // A precise sleep of the holding thread (tokio's timer has 1 ms granularity).
        tokio::task::block_in_place(|| std::thread::sleep(d));
    } else {
        // The fallback runtime on this thread (threads were short): block_in_place would
        // panic there, and a blocked thread would stop every other task of the process.
        tokio::time::sleep(d).await;
    }
}

/// The Redlock peer's lock manager over the servers of `url` (one for redis://, N for
/// redlock://, the master Sentinel names now for redis+sentinel://; none on a cluster).
///
/// rslock 0.10 uses redis 1.x (not our 0.32) and does not re-export it, so it is given URLs;
/// its `LockManager::new` unwraps `Client::open`, so every URL is first checked with our redis
/// crate's parser and a bad one is an error here, never a panic there.
pub async fn rslock_manager(t: &Target) -> Result<rslock::LockManager, String> {
    let urls = super::redis_ha::rslock_urls(t).await?;
    for u in &urls {
        redis::Client::open(u.as_str()).map_err(|e| format!("rslock: bad URL {u:?}: {e}"))?;
    }
    Ok(rslock::LockManager::new(urls))
}

/// The lease the bench gives rslock's locks (it does not renew them).
pub const RSLOCK_TTL: Duration = Duration::from_secs(30);

/// One rslock acquisition: `lock` (3 tries, random 0–200 ms apart: the crate's defaults) until
/// granted or `end_ns`.
pub async fn rslock_acquire(
    lm: &rslock::LockManager,
    name: &str,
    end_ns: i64,
) -> Result<Option<rslock::Lock>, String> {
    loop {
        if now_ns() >= end_ns {
            return Ok(None);
        }
        let left = Duration::from_nanos(u64::try_from(end_ns - now_ns()).unwrap_or(0));
        match tokio::time::timeout(
            left + Duration::from_secs(5),
            lm.lock(name.as_bytes(), RSLOCK_TTL),
        )
        .await
        {
            Ok(Ok(l)) => return Ok(Some(l)),
            Ok(Err(rslock::LockError::Unavailable)) => continue,
            Ok(Err(e)) => return Err(format!("rslock: {e}")),
            Err(_) => return Err("rslock: no answer".into()),
        }
    }
}

/// The lease of each etcd peer waiter (dlock's default TTL on etcd), kept alive every third.
pub const ETCD_PEER_TTL_S: i64 = 10;

/// etcd's own lock, the peer on etcd: the `Lock` RPC of etcd's v3lock service, which runs Go's
/// `concurrency.Mutex` inside the member (what `etcdctl lock` and Go clients do), then `Unlock`
/// of the key it returned. Like a `concurrency.Session`, every waiter has a lease of its own
/// (waiters that shared one would share the key, i.e. hold the lock together), kept alive by
/// a task every third of its TTL; the waiters of a process share one `Client`.
pub struct EtcdPeer {
    client: etcd_client::Client,
    lease: i64,
    keeper: tokio::task::JoinHandle<()>,
}

impl EtcdPeer {
    /// Grants the waiter's lease and starts its keep-alives.
    pub async fn new(client: &etcd_client::Client) -> Result<EtcdPeer, String> {
        let mut c = client.clone();
        let lease = tokio::time::timeout(
            Duration::from_secs(10),
            c.lease_grant(ETCD_PEER_TTL_S, None),
        )
        .await
        .map_err(|_| "etcd lease grant: no answer".to_string())?
        .map_err(|e| format!("etcd lease grant: {e}"))?
        .id();
        let keeper = tokio::spawn(async move {
            let every = Duration::from_secs(ETCD_PEER_TTL_S as u64) / 3;
            let mut stream = None;
            loop {
                tokio::time::sleep(every).await;
                // Opening the stream sends the first keep-alive itself.
                let opened = stream.is_none();
                if opened {
                    stream = c.lease_keep_alive(lease).await.ok();
                }
                let Some((keeper, answers)) = stream.as_mut() else {
                    continue;
                };
                let ok = tokio::time::timeout(Duration::from_secs(5), async {
                    if !opened {
                        keeper.keep_alive().await?;
                    }
                    answers.message().await
                })
                .await;
                if !matches!(ok, Ok(Ok(Some(_)))) {
                    stream = None;
                }
            }
        });
        Ok(EtcdPeer {
            client: client.clone(),
            lease,
            keeper,
        })
    }

    /// `Lock` until granted (the key) or `end_ns` (`None`; the cancelled RPC makes the member
    /// delete the waiter's key, as `concurrency.Mutex` does when its context ends).
    pub async fn lock(&self, name: &str, end_ns: i64) -> Result<Option<Vec<u8>>, String> {
        let left = Duration::from_nanos(u64::try_from(end_ns - now_ns()).unwrap_or(0));
        if left.is_zero() {
            return Ok(None);
        }
        let mut c = self.client.clone();
        let opts = etcd_client::LockOptions::new().with_lease(self.lease);
        match tokio::time::timeout(left, c.lock(name, Some(opts))).await {
            Ok(Ok(r)) => Ok(Some(r.key().to_vec())),
            Ok(Err(e)) => Err(format!("etcd Lock: {e}")),
            Err(_) => Ok(None),
        }
    }

    /// `Unlock` of a key `lock` returned.
    pub async fn unlock(&self, key: Vec<u8>) -> Result<(), String> {
        let mut c = self.client.clone();
        match tokio::time::timeout(Duration::from_secs(10), c.unlock(key)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("etcd Unlock: {e}")),
            Err(_) => Err("etcd Unlock: no answer".into()),
        }
    }

    /// Revokes the lease (its keys go with it) and stops the keep-alives.
    pub async fn close(&self) {
        self.keeper.abort();
        let mut c = self.client.clone();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.lease_revoke(self.lease)).await;
    }
}

impl Drop for EtcdPeer {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The key of a lock name for etcd's `Lock` RPC: under the URL's prefix, the name escaped as
/// dlock's etcd store escapes it (`%` → `%25`, `/` → `%2F`), so both use one key layout.
pub fn etcd_lock_name(t: &Target, name: &str) -> String {
    format!(
        "{}/{}",
        t.etcd_prefix(),
        name.replace('%', "%25").replace('/', "%2F")
    )
}

/// One candidate of E1 (`--elect`): campaigns for `--name` with a term of `--lease-ms`, says
/// `campaigning NS` before and `leading TERM NS` once it leads (TERM `-` on stores without
/// fencing; NS CLOCK_REALTIME), then leads until its stdin ends (it resigns, exit 0) or the term
/// is lost (`lost NS`, exit 76). The bench SIGKILLs it to measure the fail-over.
async fn candidate(a: &WorkerArgs, t: &Target) -> CliResult {
    let lease = match a.lease_ms {
        0 => dlock::DEFAULT_LEASE,
        ms => Duration::from_millis(ms),
    };
    let (c, _) = counted_client(t, lease)
        .await
        .map_err(|e| Failure::unavailable(format!("candidate: {e}")))?;
    let election = c
        .election(a.name.as_str())
        .map_err(|e| Failure::usage(e.to_string()))?
        .lease(lease);
    println!("campaigning {}", now_ns());
    let leading = match tokio::time::timeout(Duration::from_secs(300), election.campaign("")).await
    {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Err(Failure::unavailable(format!("campaign: {e}"))),
        Err(_) => return Err(Failure::unavailable("campaign: not leading within 300 s")),
    };
    let led = now_ns();
    let term = leading
        .term()
        .map_or_else(|| "-".to_string(), |t| t.to_string());
    println!("leading {term} {led}");
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = String::new();
    // Until end of file (or an error reading it): the bench is done with this leader.
    let eof = async {
        while matches!(stdin.read_line(&mut line).await, Ok(n) if n > 0) {
            line.clear();
        }
    };
    tokio::select! {
        e = leading.lost() => {
            println!("lost {}", now_ns());
            return Err(Failure::new(crate::exit::LOST, format!("candidate: term lost: {e}")));
        }
        _ = eof => {}
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), leading.resign()).await;
    Ok(OK)
}

/// The worker's main.
pub async fn worker(a: WorkerArgs) -> CliResult {
    let t = Target::parse(&a.url).map_err(Failure::usage)?;
    if a.elect {
        return candidate(&a, &t).await;
    }
    let acc = Arc::new(StdMutex::new(Acc::default()));
    enum Lib {
        Dlock(dlock::Client, Arc<super::store::Counts>),
        Rslock(rslock::LockManager),
        EtcdLock(Vec<Arc<EtcdPeer>>),
    }
    let lib = match a.lib.as_str() {
        "dlock" => {
            let (c, counts) = counted_client(&t, dlock::DEFAULT_LEASE)
                .await
                .map_err(|e| Failure::unavailable(format!("worker: {e}")))?;
            // Warm the connection (and scripts) on another name.
            let m = c
                .mutex(format!("{}/warm/{}", a.name, a.proc_index))
                .map_err(|e| Failure::usage(e.to_string()))?;
            let g = m
                .acquire_timeout(Duration::from_secs(10))
                .await
                .map_err(|e| Failure::unavailable(format!("worker warm-up: {e}")))?;
            let _ = g.release().await;
            Lib::Dlock(c, counts)
        }
        "rslock" => {
            let lm = rslock_manager(&t).await.map_err(Failure::unavailable)?;
            let warm = format!("{}/warm/{}", a.name, a.proc_index);
            match rslock_acquire(&lm, &warm, now_ns() + 10_000_000_000).await {
                Ok(Some(l)) => lm.unlock(&l).await,
                Ok(None) => return Err(Failure::unavailable("worker warm-up: timed out")),
                Err(e) => return Err(Failure::unavailable(format!("worker warm-up: {e}"))),
            }
            Lib::Rslock(lm)
        }
        "etcd-lock" => {
            let client = super::store::etcd_connect(&t)
                .await
                .map_err(|e| Failure::unavailable(format!("worker: {e}")))?;
            let mut peers = Vec::new();
            for _ in 0..a.tasks.max(1) {
                peers.push(Arc::new(
                    EtcdPeer::new(&client)
                        .await
                        .map_err(|e| Failure::unavailable(format!("worker: {e}")))?,
                ));
            }
            let warm = etcd_lock_name(&t, &format!("{}/warm/{}", a.name, a.proc_index));
            match peers[0].lock(&warm, now_ns() + 10_000_000_000).await {
                Ok(Some(k)) => peers[0]
                    .unlock(k)
                    .await
                    .map_err(|e| Failure::unavailable(format!("worker warm-up: {e}")))?,
                Ok(None) => return Err(Failure::unavailable("worker warm-up: timed out")),
                Err(e) => return Err(Failure::unavailable(format!("worker warm-up: {e}"))),
            }
            Lib::EtcdLock(peers)
        }
        other => return Err(Failure::usage(format!("unknown --lib {other}"))),
    };
    let before = match &lib {
        Lib::Dlock(_, c) => c.snap(),
        Lib::Rslock(_) | Lib::EtcdLock(_) => CountSnap::default(),
    };
    println!("ready");
    let mut line = String::new();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    match tokio::time::timeout(Duration::from_secs(300), stdin.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return Err(Failure::usage("worker: no `go` line on stdin")),
    }
    let mut it = line.split_whitespace();
    let (Some("go"), Some(start), Some(end)) = (it.next(), it.next(), it.next()) else {
        return Err(Failure::usage(format!("worker: bad start line {line:?}")));
    };
    let start: i64 = start.parse().map_err(|_| Failure::usage("bad start"))?;
    let end: i64 = end.parse().map_err(|_| Failure::usage("bad end"))?;
    let wait = start - now_ns();
    if wait > 0 {
        tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..a.tasks {
        let acc = acc.clone();
        let name = a.name.clone();
        let (hold_us, max, pi, fair) = (a.hold_us, a.max_per_task, a.proc_index, a.fair);
        let pause_us = a.pause_us;
        match &lib {
            Lib::Dlock(c, _) => {
                let taker = if a.stripes > 0 {
                    match c.striped(name, a.stripes) {
                        Ok(s) => Taker::Striped(s.fair(fair), a.keys.max(1)),
                        Err(e) => return Err(Failure::usage(e.to_string())),
                    }
                } else {
                    match c.mutex(name) {
                        Ok(m) => Taker::Mutex(m.fair(fair)),
                        Err(e) => return Err(Failure::usage(e.to_string())),
                    }
                };
                tasks.spawn(async move {
                    let mut n = 0;
                    while n < max {
                        let req = now_ns();
                        if req >= end {
                            break;
                        }
                        let left = Duration::from_nanos((end - req) as u64);
                        match taker.take(left).await {
                            (Ok(g), stripe) => {
                                let grant = now_ns();
                                hold(hold_us).await;
                                let rs = now_ns();
                                let r = g.release().await.map_err(|e| format!("release: {e}"));
                                let re = now_ns();
                                let row = [i64::from(pi), i64::from(task), req, grant, rs, re];
                                record(&acc, row, r.map(drop), stripe);
                                n += 1;
                                hold(pause_us).await;
                            }
                            (Err(e), _) if e.is_not_granted() => break,
                            (Err(e), _) => {
                                if failed(&acc, format!("acquire: {e}")).await {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
            Lib::Rslock(lm) => {
                let lm = lm.clone();
                tasks.spawn(async move {
                    let mut n = 0;
                    while n < max {
                        let req = now_ns();
                        match rslock_acquire(&lm, &name, end).await {
                            Ok(Some(l)) => {
                                let grant = now_ns();
                                hold(hold_us).await;
                                let rs = now_ns();
                                lm.unlock(&l).await;
                                let re = now_ns();
                                let row = [i64::from(pi), i64::from(task), req, grant, rs, re];
                                record(&acc, row, Ok(()), None);
                                n += 1;
                                hold(pause_us).await;
                            }
                            Ok(None) => break,
                            Err(e) => {
                                if failed(&acc, e).await {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
            Lib::EtcdLock(peers) => {
                let peer = peers[task as usize % peers.len()].clone();
                let name = etcd_lock_name(&t, &name);
                tasks.spawn(async move {
                    let mut n = 0;
                    while n < max {
                        let req = now_ns();
                        match peer.lock(&name, end).await {
                            Ok(Some(key)) => {
                                let grant = now_ns();
                                hold(hold_us).await;
                                let rs = now_ns();
                                let r = peer.unlock(key).await;
                                let re = now_ns();
                                let row = [i64::from(pi), i64::from(task), req, grant, rs, re];
                                record(&acc, row, r, None);
                                n += 1;
                                hold(pause_us).await;
                            }
                            Ok(None) => break,
                            Err(e) => {
                                if failed(&acc, e).await {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    let mut ops = match &lib {
        Lib::Dlock(_, c) => c.snap(),
        Lib::Rslock(_) | Lib::EtcdLock(_) => CountSnap::default(),
    };
    if let Lib::EtcdLock(peers) = &lib {
        for p in peers {
            p.close().await;
        }
    }
    ops.acquire -= before.acquire;
    ops.wait -= before.wait;
    ops.release -= before.release;
    ops.extend -= before.extend;
    ops.extended -= before.extended;
    ops.cancel -= before.cancel;
    let acc = std::mem::take(&mut *acc.lock().unwrap_or_else(|p| p.into_inner()));
    let out = WorkerOut {
        records: acc.records,
        errors: acc.errors,
        first_error: acc.first_error,
        ops,
        stripes: acc.stripes,
    };
    let json = serde_json::to_string(&out)
        .map_err(|e| Failure::new(crate::exit::SOFTWARE, e.to_string()))?;
    println!("{json}");
    Ok(OK)
}

#[cfg(test)]
mod tests {
    use super::hold;
    use std::time::{Duration, Instant};

    // The fallback runtime of a process short of threads is a current-thread one.
    #[tokio::test(flavor = "current_thread")]
    async fn a_hold_on_a_current_thread_runtime_sleeps() {
        let t = Instant::now();
        hold(3_000).await;
        assert!(t.elapsed() >= Duration::from_millis(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_on_a_multi_thread_runtime_sleeps() {
        let t = Instant::now();
        hold(300).await;
        assert!(t.elapsed() >= Duration::from_micros(300));
    }
}
