//! A deterministic simulation of the core (issue 22, "Reliability at scale").
//!
//! Real processes give realism (`dlock-chaos`); this gives coverage. The core (handles, holds,
//! the watchdog, the local line, `lost()`) runs over the in-memory store on tokio's paused clock
//! (`dlock` reads time through tokio's clock, so leases, deadlines and waits are virtual), one
//! current-thread runtime per seed, with seeded faults between each client and the store:
//! requests refused or delayed (a delayed request still reaches the store after its caller gave
//! up), replies delayed, lost after the store acted, or never sent; renewals failing for a while;
//! a whole client paused (its tasks and every call, the watchdog's included) past its lease; a
//! store clock up to 8 % fast. The names are mutexes, read-write locks and semaphores, some fair.
//!
//! The oracle is checked at every grant the store makes and at every guard a task receives:
//! in the store's order no two holds of a name overlap (when the store grants a name, no guard
//! that excludes the new hold may still say `is_held()`, and its `lost()` must have fired; a
//! semaphore counts its permits), the fencing tokens of a name only rise, and a careful writer
//! (`is_held()` just before the write) is never refused by the fenced resource. A violation
//! panics with the seed, the exact replay command and the last steps.
//!
//! `DLOCK_SIM_ACQUISITIONS` (default 50 000) sets the acquisitions, 1 000 per seed;
//! `DLOCK_SIM_SEED=N` replays one seed; `DLOCK_SIM_FIRST_SEED` moves the first seed. The full
//! run (docs/RELIABILITY.md):
//! `DLOCK_SIM_ACQUISITIONS=1000000 cargo nextest run --release -p dlock-rs --test simulation`.

use dlock::backend::memory::MemoryBackend;
use dlock::backend::{
    Acquisition, Attempt, Backend, Busy, Capabilities, Extended, Force, Forced, HoldRef, LockInfo,
    LockKind, Look, Mode, Released, Request, Watch,
};
use dlock::{Client, ClientOptions, Error, Guard, LockName};
use futures_util::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Acquisitions per seed.
const PER_SEED: u64 = 1_000;
/// Acquisitions of a run unless `DLOCK_SIM_ACQUISITIONS` says otherwise (CI's share).
const CI_ACQUISITIONS: u64 = 50_000;
/// Steps kept for the report of a violation.
const TAIL: usize = 60;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// What a lock name is used as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    RwLock,
    Semaphore(u32),
}

/// What one seed runs: drawn from the seed.
#[derive(Debug, Clone)]
struct Config {
    clients: usize,
    tasks: usize,
    /// Each name's primitive and whether its handles are fair (FIFO).
    names: Vec<(Kind, bool)>,
    lease: Duration,
    call_timeout: Duration,
    /// Whether the clients share in-process wake-ups (one process) or not (separate processes).
    shared_wakeups: bool,
    /// Scales every fault probability.
    intensity: f64,
    /// How much faster the store's clock runs than the clients': a lease of L it promises ends
    /// after L × (1 − drift) of the clients' time. Below the core's 10 % margin.
    drift: f64,
}

impl Config {
    fn draw(rng: &mut StdRng) -> Config {
        let lease = ms([100, 150, 250, 500, 1000, 2000][rng.gen_range(0..6)]);
        Config {
            clients: rng.gen_range(2..=6),
            tasks: rng.gen_range(1..=3),
            names: (0..rng.gen_range(1..=3))
                .map(|_| {
                    let kind = match rng.gen_range(0..4) {
                        0 | 1 => Kind::Mutex,
                        2 => Kind::RwLock,
                        _ => Kind::Semaphore(rng.gen_range(2..=3)),
                    };
                    (kind, rng.gen_bool(0.25))
                })
                .collect(),
            lease,
            call_timeout: lease.mul_f64(rng.gen_range(0.2..=1.5)),
            shared_wakeups: rng.gen_bool(0.5),
            intensity: rng.gen_range(0.2..=1.5),
            drift: rng.gen_range(0.0..=0.08),
        }
    }
}

/// The figures of a run.
#[derive(Debug, Default, Clone)]
struct Stats {
    acquisitions: u64,
    /// Guards an acquisition returned already past their local deadline (a late grant reply).
    dead_on_arrival: u64,
    store_grants: u64,
    regrants: u64,
    busy: u64,
    timeouts: u64,
    caller_timeouts: u64,
    errors: u64,
    lost_in_hold: u64,
    released: u64,
    release_lost: u64,
    release_not_owner: u64,
    release_error: u64,
    dropped: u64,
    careful_writes: u64,
    careful_skipped: u64,
    careless_fenced: u64,
    careless_accepted: u64,
    /// Faults injected, by kind.
    faults: BTreeMap<&'static str, u64>,
    virtual_time: Duration,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        macro_rules! sum {
            ($($f:ident),*) => { $(self.$f += o.$f;)* };
        }
        sum!(
            acquisitions,
            dead_on_arrival,
            store_grants,
            regrants,
            busy,
            timeouts,
            caller_timeouts,
            errors,
            lost_in_hold,
            released,
            release_lost,
            release_not_owner,
            release_error,
            dropped,
            careful_writes,
            careful_skipped,
            careless_fenced,
            careless_accepted,
            virtual_time
        );
        for (k, v) in &o.faults {
            *self.faults.entry(k).or_default() += v;
        }
    }
}

/// A guard a task holds, as the oracle sees it.
struct Held {
    name: String,
    mode: Mode,
    token: u64,
    client: usize,
    guard: Arc<Guard>,
}

/// The simulated world of one seed: the fault source, the oracle's view, the history.
struct World {
    seed: u64,
    cfg: Config,
    start: Instant,
    rng: Mutex<StdRng>,
    state: Mutex<State>,
    /// Set once the budget of acquisitions is spent: tasks stop.
    done: AtomicBool,
    next_id: AtomicU64,
    /// The first violation (a panic in a task the store or the core spawned would be lost).
    violated: Mutex<Option<String>>,
}

#[derive(Default)]
struct State {
    /// Each name's primitive.
    kinds: BTreeMap<String, Kind>,
    held: BTreeMap<u64, Held>,
    /// Per name: the highest token the store granted.
    last_grant: BTreeMap<String, u64>,
    /// Every owner the store granted, with its token (a repeated attempt is granted again).
    owners: BTreeMap<String, u64>,
    /// The fenced resource: per name, the highest token written.
    resource: BTreeMap<String, u64>,
    stats: Stats,
    digest: u64,
    steps: u64,
    tail: VecDeque<String>,
}

impl World {
    fn now_ms(&self) -> f64 {
        (Instant::now() - self.start).as_secs_f64() * 1000.0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn draw<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        f(&mut self.rng.lock().unwrap())
    }

    /// Whether a fault of probability `p` (scaled by the seed's intensity) happens now.
    fn chance(&self, p: f64) -> bool {
        let p = (p * self.cfg.intensity).min(1.0);
        self.draw(|r| r.gen_bool(p))
    }

    fn fault(&self, kind: &'static str) {
        *self.lock().stats.faults.entry(kind).or_default() += 1;
    }

    /// Records one step of the history (digest and tail).
    fn step(&self, st: &mut State, what: std::fmt::Arguments<'_>) {
        let line = format!("{:>10.3} ms  {what}", self.now_ms());
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            st.digest = (st.digest ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        st.steps += 1;
        if st.tail.len() == TAIL {
            st.tail.pop_front();
        }
        st.tail.push_back(line);
    }

    fn event(&self, what: std::fmt::Arguments<'_>) {
        let mut st = self.lock();
        self.step(&mut st, what);
    }

    fn violation(&self, st: &mut State, what: String) -> ! {
        self.step(st, format_args!("VIOLATION: {what}"));
        let tail: Vec<&str> = st.tail.iter().map(String::as_str).collect();
        let report = format!(
            "simulation seed {} ({:?}): {what}\nreplay: DLOCK_SIM_SEED={} cargo nextest run -p dlock-rs --test simulation\nlast steps:\n{}",
            self.seed,
            self.cfg,
            self.seed,
            tail.join("\n")
        );
        self.violated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(report.clone());
        self.done.store(true, Ordering::Relaxed);
        panic!("{report}");
    }

    /// The first guard that says `is_held()` and excludes a hold of `name` in `mode` with
    /// `token` (for a semaphore: one of the guards that use up its permits), if any.
    fn in_the_way<'a>(
        st: &'a State,
        name: &str,
        mode: Mode,
        token: u64,
    ) -> Option<(u64, &'a Held)> {
        let others = || {
            st.held
                .iter()
                .filter(move |(_, h)| h.name == name && h.token != token)
        };
        match kind_of(name, st) {
            Kind::Semaphore(n) => {
                let held: Vec<(&u64, &Held)> =
                    others().filter(|(_, h)| h.guard.is_held()).collect();
                (held.len() >= n as usize).then(|| (*held[0].0, held[0].1))
            }
            _ => others()
                .find(|(_, h)| {
                    (mode == Mode::Exclusive || h.mode == Mode::Exclusive) && h.guard.is_held()
                })
                .map(|(id, h)| (*id, h)),
        }
    }

    /// The store granted `token` of `name` to `owner` (its reply may yet be lost).
    fn on_grant(&self, name: &str, mode: Mode, token: u64, owner: &str, client: usize) {
        let mut st = self.lock();
        // A repeated attempt of an owner that still holds gets its token back; one whose hold
        // ran out meanwhile (its first grant's reply lost) gets a new hold, with a new token.
        match st.owners.get(owner) {
            Some(&t) if t == token => st.stats.regrants += 1,
            _ => {
                if let Some(&t) = st.last_grant.get(name) {
                    if token <= t {
                        self.violation(
                            &mut st,
                            format!("token of {name} did not rise: {token} granted after {t}"),
                        );
                    }
                }
                st.last_grant.insert(name.to_owned(), token);
                st.owners.insert(owner.to_owned(), token);
                st.stats.store_grants += 1;
            }
        }
        self.step(
            &mut st,
            format_args!("store grants {name} token {token} to client {client}"),
        );
        let mut bad = None;
        if let Some((id, h)) = Self::in_the_way(&st, name, mode, token) {
            bad = Some(format!(
                "the store granted {name} ({mode:?}) token {token} to client {client} while client \
                 {}'s guard {id} ({:?}) of token {} still says is_held() (valid for {:?} more)",
                h.client,
                h.mode,
                h.token,
                h.guard.valid_for()
            ));
        }
        let counted = matches!(kind_of(name, &st), Kind::Semaphore(_));
        for (id, h) in &st.held {
            if bad.is_some() || counted || h.name != name || h.token == token {
                continue;
            }
            let excludes = mode == Mode::Exclusive || h.mode == Mode::Exclusive;
            if excludes && h.guard.lost().now_or_never().is_none() {
                bad = Some(format!(
                    "the store granted {name} token {token} to client {client} before client \
                     {}'s guard {id} of token {} fired lost()",
                    h.client, h.token
                ));
                break;
            }
        }
        if let Some(b) = bad {
            self.violation(&mut st, b);
        }
    }

    /// A task received `guard`: it is held, and no other guard of the name is.
    fn register(&self, client: usize, task: usize, guard: Arc<Guard>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let name = guard.name().to_owned();
        let token = guard.token().expect("the in-memory store fences");
        let held = guard.is_held();
        let mut st = self.lock();
        st.stats.acquisitions += 1;
        if !held {
            st.stats.dead_on_arrival += 1;
        }
        self.step(
            &mut st,
            format_args!(
                "client {client} task {task} holds {name} token {token} (guard {id}){}",
                if held {
                    ""
                } else {
                    ", already past its deadline"
                }
            ),
        );
        if !held {
            // The core gives back a grant that arrives past its deadline (and tries again
            // while the caller waits): a guard handed out is held.
            self.violation(
                &mut st,
                format!(
                    "client {client} task {task} was handed guard {id} of {name} (token {token}) \
                     already past its deadline"
                ),
            );
        }
        let mode = guard.mode();
        let overlap = held
            .then(|| Self::in_the_way(&st, &name, mode, token))
            .flatten()
            .map(|(_, h)| (h.client, h.token, h.mode));
        if let Some((c, t, m)) = overlap {
            self.violation(
                &mut st,
                format!(
                    "client {client} holds {name} ({mode:?}) token {token} while client {c} \
                     holds token {t} ({m:?})"
                ),
            );
        }
        st.held.insert(
            id,
            Held {
                name,
                mode,
                token,
                client,
                guard,
            },
        );
        id
    }

    fn unregister(&self, id: u64) -> Arc<Guard> {
        self.lock().held.remove(&id).expect("registered").guard
    }

    /// A write of `token` to the fenced resource of `name`; `careful`: the writer checked
    /// `is_held()` just before.
    fn write(&self, name: &str, token: u64, careful: bool, client: usize) {
        let mut st = self.lock();
        let max = st.resource.get(name).copied().unwrap_or(0);
        if token < max {
            if careful {
                self.violation(
                    &mut st,
                    format!(
                        "client {client}'s careful write of {name} token {token} (is_held() \
                         just before) came after token {max} was written"
                    ),
                );
            }
            st.stats.careless_fenced += 1;
            self.step(
                &mut st,
                format_args!("client {client} write {name} token {token} fenced (seen {max})"),
            );
            return;
        }
        st.resource.insert(name.to_owned(), token);
        if careful {
            st.stats.careful_writes += 1;
        } else {
            st.stats.careless_accepted += 1;
        }
        self.step(
            &mut st,
            format_args!("client {client} writes {name} token {token}"),
        );
    }
}

/// The primitive `name` is used as.
fn kind_of(name: &str, st: &State) -> Kind {
    st.kinds.get(name).copied().unwrap_or(Kind::Mutex)
}

/// What the fault injector does to one client: pauses and failing renewals.
#[derive(Default)]
struct Ctl {
    paused_until: Mutex<Option<Instant>>,
    renewals_fail_until: Mutex<Option<Instant>>,
}

impl Ctl {
    /// Waits while the client is paused.
    async fn unpaused(&self) {
        loop {
            let until = *self.paused_until.lock().unwrap();
            match until {
                Some(t) if t > Instant::now() => tokio::time::sleep_until(t).await,
                _ => return,
            }
        }
    }

    fn renewals_fail(&self) -> bool {
        self.renewals_fail_until
            .lock()
            .unwrap()
            .is_some_and(|t| t > Instant::now())
    }
}

/// The network between one client and the store, with the seed's faults.
#[derive(Clone)]
struct Net {
    world: Arc<World>,
    ctl: Arc<Ctl>,
    client: usize,
}

impl Net {
    /// A lease of `lease` as the store's faster clock counts it (see [`Config::drift`]).
    fn drifted(&self, lease: Duration) -> Duration {
        lease.mul_f64(1.0 - self.world.cfg.drift)
    }

    /// Sends `act` to the store: refused, delayed on the way (it then reaches the store even if
    /// the caller gave up meanwhile), its reply delayed, lost, or never sent; nothing moves while
    /// the client is paused.
    async fn send<T: Send + 'static>(
        &self,
        act: impl Future<Output = dlock::Result<T>> + Send + 'static,
    ) -> dlock::Result<T> {
        let w = &self.world;
        self.ctl.unpaused().await;
        if w.chance(0.01) {
            w.fault("refused");
            return Err(Error::Unavailable("sim: refused".into()));
        }
        let lease = w.cfg.lease;
        let delay = if w.chance(0.05) {
            w.fault("request_delayed");
            lease.mul_f64(w.draw(|r| r.gen_range(0.0..=0.6)))
        } else {
            Duration::ZERO
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let _ = tx.send(act.await);
        });
        let r = rx
            .await
            .unwrap_or_else(|_| Err(Error::Unavailable("sim: the store call ended".into())));
        if w.chance(0.01) {
            w.fault("reply_lost");
            return Err(Error::Unavailable("sim: reply lost".into()));
        }
        if w.chance(0.003) {
            w.fault("reply_never");
            std::future::pending::<()>().await;
        }
        if w.chance(0.05) {
            w.fault("reply_delayed");
            let d = lease.mul_f64(w.draw(|r| r.gen_range(0.0..=0.6)));
            tokio::time::sleep(d).await;
        }
        self.ctl.unpaused().await;
        r
    }
}

/// The store as one client reaches it.
struct Faulty {
    inner: MemoryBackend,
    net: Net,
}

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Faulty(client {})", self.net.client)
    }
}

/// An owned hold reference, to send.
struct OwnedHold {
    name: LockName,
    kind: LockKind,
    mode: Mode,
    owner: String,
    lease: Duration,
}

impl OwnedHold {
    /// `h`, with its lease as the store's clock counts it.
    fn new(h: &HoldRef<'_>, net: &Net) -> OwnedHold {
        OwnedHold {
            name: h.name.clone(),
            kind: h.kind,
            mode: h.mode,
            owner: h.owner.to_owned(),
            lease: net.drifted(h.lease),
        }
    }
    fn as_ref(&self) -> HoldRef<'_> {
        HoldRef {
            name: &self.name,
            kind: self.kind,
            mode: self.mode,
            owner: &self.owner,
            lease: self.lease,
        }
    }
}

#[async_trait::async_trait]
impl Backend for Faulty {
    fn name(&self) -> &'static str {
        "sim"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        let drifted = Request {
            lease: self.net.drifted(req.lease),
            ..req.clone()
        };
        Box::new(FaultyAcq {
            inner: Arc::new(tokio::sync::Mutex::new(self.inner.begin(&drifted))),
            promised: req.lease,
            mode: req.mode,
            net: self.net.clone(),
            name: req.name.as_str().to_owned(),
            owner: req.owner.to_owned(),
        })
    }
    async fn release(&self, hold: &HoldRef<'_>) -> dlock::Result<Released> {
        let (inner, h) = (self.inner.clone(), OwnedHold::new(hold, &self.net));
        self.net
            .send(async move { inner.release(&h.as_ref()).await })
            .await
    }
    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> dlock::Result<Vec<Extended>> {
        if self.net.ctl.renewals_fail() {
            self.net.world.fault("renewal_failed");
            return Err(Error::Unavailable("sim: renewals failing".into()));
        }
        let inner = self.inner.clone();
        let hs: Vec<OwnedHold> = holds.iter().map(|h| OwnedHold::new(h, &self.net)).collect();
        let promised: Vec<Duration> = holds.iter().map(|h| h.lease).collect();
        self.net
            .send(async move {
                let refs: Vec<HoldRef<'_>> = hs.iter().map(OwnedHold::as_ref).collect();
                let answers = inner.extend(&refs, detach).await?;
                // The store promises the lease asked for, on its own (faster) clock.
                Ok(answers
                    .into_iter()
                    .zip(promised)
                    .map(|(a, lease)| match a {
                        Extended::Held { .. } => Extended::Held { valid_for: lease },
                        other => other,
                    })
                    .collect())
            })
            .await
    }
    async fn describe(&self, prefix: &str) -> dlock::Result<Vec<LockInfo>> {
        self.inner.describe(prefix).await
    }
    async fn force_release(&self, name: &LockName, how: Force) -> dlock::Result<Forced> {
        self.inner.force_release(name, how).await
    }
    fn shared_key(&self) -> Option<String> {
        if self.net.world.cfg.shared_wakeups {
            self.inner.shared_key()
        } else {
            None
        }
    }
    fn call_timeout(&self) -> Option<Duration> {
        Some(self.net.world.cfg.call_timeout)
    }
}

struct FaultyAcq {
    inner: Arc<tokio::sync::Mutex<Box<dyn Acquisition>>>,
    /// The lease the client asked for, which the store promises (see [`Config::drift`]).
    promised: Duration,
    mode: Mode,
    net: Net,
    name: String,
    owner: String,
}

#[async_trait::async_trait]
impl Acquisition for FaultyAcq {
    async fn attempt(&mut self) -> dlock::Result<Attempt> {
        let (inner, world) = (self.inner.clone(), self.net.world.clone());
        let (name, owner, client) = (self.name.clone(), self.owner.clone(), self.net.client);
        let (promised, mode) = (self.promised, self.mode);
        self.net
            .send(async move {
                let mut r = inner.lock().await.attempt().await;
                if let Ok(Attempt::Granted(g)) = &mut r {
                    let token = g.token.expect("the in-memory store fences");
                    world.on_grant(&name, mode, token, &owner, client);
                    g.valid_for = promised;
                }
                r
            })
            .await
    }
    async fn changed(&mut self, _busy: &Busy, until: std::time::Instant) -> dlock::Result<Watch> {
        // As the in-memory store: its changes are reported by the core's in-process wake-ups.
        tokio::time::sleep_until(until.into()).await;
        Ok(Watch::Recheck)
    }
    fn mark(&mut self) -> bool {
        true
    }
    async fn look(&mut self) -> dlock::Result<Option<Look>> {
        let inner = self.inner.clone();
        self.net
            .send(async move { inner.lock().await.look().await })
            .await
    }
    async fn cancel(&mut self) -> dlock::Result<()> {
        let inner = self.inner.clone();
        self.net
            .send(async move { inner.lock().await.cancel().await })
            .await
    }
}

/// One task of one client: acquire in one of four ways, hold (watching `lost()`; an exclusive
/// hold writes to the fenced resource, carefully or not), then release or drop the guard.
async fn task(world: Arc<World>, ctl: Arc<Ctl>, client: Client, c: usize, t: usize) {
    let lease = world.cfg.lease;
    let budget_left = |w: &World| !w.done.load(Ordering::Relaxed);
    while budget_left(&world) {
        ctl.unpaused().await;
        let (i, how, wait, write) = world.draw(|r| {
            (
                r.gen_range(0..world.cfg.names.len()),
                r.gen_range(0..10u32),
                lease.mul_f64(r.gen_range(0.0..=3.0)),
                r.gen_bool(0.5),
            )
        });
        let name = format!("n{i}");
        let (kind, fair) = world.cfg.names[i];
        let m = match kind {
            Kind::Mutex => Handle::Mutex(client.mutex(name.clone()).unwrap().fair(fair)),
            Kind::RwLock => Handle::RwLock(client.rwlock(name.clone()).unwrap().fair(fair), write),
            Kind::Semaphore(n) => {
                Handle::Semaphore(client.semaphore(name.clone(), n).unwrap().fair(fair))
            }
        };
        let res = match how {
            0..=3 => m.acquire().await,
            4..=6 => m.try_acquire().await,
            7..=8 => m.acquire_timeout(wait).await,
            // The caller's own timeout drops the acquisition half-way.
            _ => match tokio::time::timeout(wait, m.acquire()).await {
                Ok(r) => r,
                Err(_) => {
                    world.lock().stats.caller_timeouts += 1;
                    world.event(format_args!("client {c} task {t} gave up on {name}"));
                    tokio::time::sleep(ms(1)).await;
                    continue;
                }
            },
        };
        let guard = match res {
            Ok(g) => Arc::new(g),
            Err(e) => {
                {
                    let mut st = world.lock();
                    match &e {
                        Error::Busy { .. } => st.stats.busy += 1,
                        Error::Timeout { .. } => st.stats.timeouts += 1,
                        _ => st.stats.errors += 1,
                    }
                    world.step(
                        &mut st,
                        format_args!("client {c} task {t} {name}: {}", short(&e)),
                    );
                }
                let pause = lease.mul_f64(world.draw(|r| r.gen_range(0.01..=0.3)));
                tokio::time::sleep(pause.max(ms(1))).await;
                continue;
            }
        };
        let token = guard.token().unwrap();
        let id = world.register(c, t, guard.clone());
        // Hold: one to three pieces of work, each followed by a write to the resource.
        let pieces = world.draw(|r| r.gen_range(1..=3));
        let mut lost = false;
        for _ in 0..pieces {
            let work = world.draw(|r| {
                if r.gen_bool(0.2) {
                    lease.mul_f64(r.gen_range(0.5..=2.0))
                } else {
                    lease.mul_f64(r.gen_range(0.0..=0.3))
                }
            });
            tokio::select! {
                biased;
                e = guard.lost() => {
                    world.lock().stats.lost_in_hold += 1;
                    world.event(format_args!("client {c} task {t} lost {name} token {token}: {}", short(&e)));
                    lost = true;
                }
                _ = tokio::time::sleep(work.max(ms(1))) => {}
            }
            if lost {
                break;
            }
            // A paused client stops here, between its work and its write, as a process would.
            ctl.unpaused().await;
            if guard.mode() == Mode::Shared {
                // Readers and permits share: they do not write the fenced resource.
                continue;
            }
            if world.draw(|r| r.gen_bool(0.1)) {
                // Careless: no look at the guard; the fence must catch a stale token.
                world.write(&name, token, false, c);
            } else if guard.is_held() {
                world.write(&name, token, true, c);
            } else {
                world.lock().stats.careful_skipped += 1;
            }
        }
        let registered = world.unregister(id);
        drop(guard);
        let guard = Arc::try_unwrap(registered).unwrap_or_else(|_| panic!("guard {id} shared"));
        if world.draw(|r| r.gen_bool(0.25)) {
            world.lock().stats.dropped += 1;
            world.event(format_args!(
                "client {c} task {t} drops {name} token {token}"
            ));
            drop(guard);
        } else {
            let r = guard.release().await;
            let mut st = world.lock();
            match &r {
                Ok(()) => st.stats.released += 1,
                Err(Error::Lost { .. }) => st.stats.release_lost += 1,
                Err(Error::NotOwner { .. }) => st.stats.release_not_owner += 1,
                Err(_) => st.stats.release_error += 1,
            }
            let how = match &r {
                Ok(()) => "ok".to_owned(),
                Err(e) => short(e),
            };
            world.step(
                &mut st,
                format_args!("client {c} task {t} releases {name} token {token}: {how}"),
            );
        }
        tokio::time::sleep(
            lease
                .mul_f64(world.draw(|r| r.gen_range(0.0..=0.2)))
                .max(ms(1)),
        )
        .await;
    }
}

/// A lock handle of any primitive (an rwlock's: for writing or reading).
enum Handle {
    Mutex(dlock::Mutex),
    RwLock(dlock::RwLock, bool),
    Semaphore(dlock::Semaphore),
}

impl Handle {
    async fn acquire(&self) -> dlock::Result<Guard> {
        match self {
            Handle::Mutex(m) => m.acquire().await,
            Handle::RwLock(r, true) => r.write().await,
            Handle::RwLock(r, false) => r.read().await,
            Handle::Semaphore(s) => s.acquire().await,
        }
    }
    async fn try_acquire(&self) -> dlock::Result<Guard> {
        match self {
            Handle::Mutex(m) => m.try_acquire().await,
            Handle::RwLock(r, true) => r.try_write().await,
            Handle::RwLock(r, false) => r.try_read().await,
            Handle::Semaphore(s) => s.try_acquire().await,
        }
    }
    async fn acquire_timeout(&self, d: Duration) -> dlock::Result<Guard> {
        match self {
            Handle::Mutex(m) => m.acquire_timeout(d).await,
            Handle::RwLock(r, true) => r.write_timeout(d).await,
            Handle::RwLock(r, false) => r.read_timeout(d).await,
            Handle::Semaphore(s) => s.acquire_timeout(d).await,
        }
    }
}

/// The error's kind, for the history (messages carry no owner tokens or times).
fn short(e: &Error) -> String {
    match e {
        Error::Busy { .. } => "busy".into(),
        Error::Timeout { .. } => "timeout".into(),
        Error::Lost { reason, .. } => format!("lost ({reason})"),
        Error::NotOwner { .. } => "not owner".into(),
        Error::Unavailable(m) => format!("unavailable ({m})"),
        other => format!("{other}"),
    }
}

/// Pauses clients and fails their renewals, now and then.
async fn chaos(world: Arc<World>, ctls: Vec<Arc<Ctl>>) {
    let lease = world.cfg.lease;
    while !world.done.load(Ordering::Relaxed) {
        let gap = lease.mul_f64(world.draw(|r| r.gen_range(1.0..=20.0)) / world.cfg.intensity);
        tokio::time::sleep(gap).await;
        let (c, kind, len) = world.draw(|r| {
            (
                r.gen_range(0..ctls.len()),
                r.gen_bool(0.5),
                lease.mul_f64(r.gen_range(0.3..=2.5)),
            )
        });
        let until = Instant::now() + len;
        if kind {
            world.fault("client_paused");
            *ctls[c].paused_until.lock().unwrap() = Some(until);
            world.event(format_args!("client {c} paused for {len:?}"));
        } else {
            world.fault("renewals_failing");
            *ctls[c].renewals_fail_until.lock().unwrap() = Some(until);
            world.event(format_args!("client {c} renewals fail for {len:?}"));
        }
    }
}

/// One seed, to its budget of acquisitions: its figures and the digest of its history.
fn run_seed(seed: u64, acquisitions: u64, run: &str) -> (Stats, u64, u64) {
    dlock::sim::seed_jitter(Some(seed));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let out = rt.block_on(async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let cfg = Config::draw(&mut rng);
        let world = Arc::new(World {
            seed,
            cfg: cfg.clone(),
            start: Instant::now(),
            rng: Mutex::new(rng),
            state: Mutex::new(State {
                kinds: cfg
                    .names
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (format!("n{i}"), *k))
                    .collect(),
                ..State::default()
            }),
            done: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            violated: Mutex::new(None),
        });
        let store = MemoryBackend::named(&format!("sim-{run}-{seed}"));
        let mut ctls = Vec::new();
        let mut set = tokio::task::JoinSet::new();
        for c in 0..cfg.clients {
            let ctl = Arc::new(Ctl::default());
            ctls.push(ctl.clone());
            let backend = Arc::new(Faulty {
                inner: store.clone(),
                net: Net {
                    world: world.clone(),
                    ctl: ctl.clone(),
                    client: c,
                },
            });
            let client = Client::with_backend(
                backend,
                format!("mem://sim-{seed}/client-{c}"),
                ClientOptions::default().lease(cfg.lease),
            )
            .unwrap();
            for t in 0..cfg.tasks {
                set.spawn(task(world.clone(), ctl.clone(), client.clone(), c, t));
            }
        }
        set.spawn(chaos(world.clone(), ctls));
        // The budget, watched; and progress: an hour of virtual time without an acquisition is a
        // liveness failure.
        let watcher = {
            let world = world.clone();
            async move {
                let mut seen = 0;
                loop {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    let now = world.lock().stats.acquisitions;
                    if now == seen {
                        let mut st = world.lock();
                        world.violation(&mut st, format!("no acquisition in an hour of virtual time ({now} so far)"));
                    }
                    seen = now;
                }
            }
        };
        let budget = {
            let world = world.clone();
            async move {
                while world.lock().stats.acquisitions < acquisitions
                    && !world.done.load(Ordering::Relaxed)
                {
                    tokio::time::sleep(world.cfg.lease).await;
                }
                world.done.store(true, Ordering::Relaxed);
            }
        };
        tokio::select! {
            biased;
            _ = watcher => unreachable!(),
            _ = async {
                budget.await;
                while let Some(r) = set.join_next().await {
                    if let Err(e) = r {
                        if e.is_panic() && world.violated.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
                            std::panic::resume_unwind(e.into_panic());
                        }
                    }
                }
            } => {}
        }
        if let Some(v) = world.violated.lock().unwrap_or_else(|p| p.into_inner()).take() {
            panic!("{v}");
        }
        // Let the background releases finish.
        tokio::time::sleep(cfg.lease * 4).await;
        let mut st = world.lock();
        st.stats.virtual_time = Instant::now() - world.start;
        (st.stats.clone(), st.digest, st.steps)
    });
    drop(rt);
    dlock::sim::seed_jitter(None);
    out
}

/// Runs `DLOCK_SIM_ACQUISITIONS` acquisitions (1 000 per seed), or one seed.
#[test]
fn the_core_keeps_its_promises_under_seeded_faults() {
    let wall = std::time::Instant::now();
    let total = env_u64("DLOCK_SIM_ACQUISITIONS").unwrap_or(CI_ACQUISITIONS);
    let seeds: Vec<(u64, u64)> = match env_u64("DLOCK_SIM_SEED") {
        Some(s) => vec![(s, total.min(PER_SEED))],
        None => {
            let first = env_u64("DLOCK_SIM_FIRST_SEED").unwrap_or(1);
            let n = total.div_ceil(PER_SEED).max(1);
            (first..first + n).map(|s| (s, PER_SEED)).collect()
        }
    };
    let mut sum = Stats::default();
    for &(seed, budget) in &seeds {
        let (stats, digest, steps) = run_seed(seed, budget, "main");
        if seeds.len() == 1 || std::env::var_os("DLOCK_SIM_VERBOSE").is_some() {
            eprintln!("seed {seed}: {steps} steps, digest {digest:016x}, {stats:?}");
        }
        sum.add(&stats);
    }
    let wall = wall.elapsed();
    eprintln!(
        "simulation: {} seeds ({}..={}), {} acquisitions ({} store grants, {} regrants, {} guards \
         already past their deadline when returned), {:.0} s of virtual time in {:.1} s of wall time",
        seeds.len(),
        seeds[0].0,
        seeds[seeds.len() - 1].0,
        sum.acquisitions,
        sum.store_grants,
        sum.regrants,
        sum.dead_on_arrival,
        sum.virtual_time.as_secs_f64(),
        wall.as_secs_f64()
    );
    eprintln!(
        "outcomes: busy {}, timeouts {}, caller timeouts {}, errors {}, lost while held {}, \
         released {}, release lost {}, release not owner {}, release error {}, dropped {}, \
         careful writes {} (skipped: not held {}), careless writes fenced {} / accepted {}",
        sum.busy,
        sum.timeouts,
        sum.caller_timeouts,
        sum.errors,
        sum.lost_in_hold,
        sum.released,
        sum.release_lost,
        sum.release_not_owner,
        sum.release_error,
        sum.dropped,
        sum.careful_writes,
        sum.careful_skipped,
        sum.careless_fenced,
        sum.careless_accepted
    );
    eprintln!("faults injected: {:?}", sum.faults);
    assert!(sum.acquisitions >= seeds.iter().map(|s| s.1).sum::<u64>());
    // The faults must actually have happened, or the run proves nothing.
    for kind in [
        "refused",
        "request_delayed",
        "reply_lost",
        "reply_never",
        "reply_delayed",
        "renewal_failed",
        "client_paused",
    ] {
        assert!(
            sum.faults.get(kind).copied().unwrap_or(0) > 0 || seeds.len() == 1,
            "no {kind} fault injected: {:?}",
            sum.faults
        );
    }
}

/// The same seed twice gives the same history, step by step (and another seed another one).
#[test]
fn a_seed_replays_the_same_history() {
    let mut digests = Vec::new();
    for seed in [7, 8] {
        let a = run_seed(seed, 300, "replay-a");
        let b = run_seed(seed, 300, "replay-b");
        assert_eq!(
            (a.1, a.2),
            (b.1, b.2),
            "seed {seed}: two runs differ (digest, steps)"
        );
        assert_eq!(a.0.acquisitions, b.0.acquisitions);
        digests.push(a.1);
    }
    assert_ne!(digests[0], digests[1], "two seeds, one history");
}
