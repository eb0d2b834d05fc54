//! Leader election ([`Election`]) over a mutex of the election's name: the leader is the holder,
//! its term the hold's fencing token, its value stored with the hold.
//!
//! Written once above the store: a campaign is a mutex acquisition (woken by the store's
//! notifications like every waiter), the leadership's `lost()` is the hold's, and a campaign
//! after a loss is a new acquisition with a new owner, so nothing of the lost term is reused.

use super::client::Client;
use super::handles::{until, Guard};
use super::rules::{check_lease, Spec, Wait};
use crate::backend::{
    Acquisition, Busy, HoldStatus, HolderInfo, LockKind, Mode, Request, Watch, MAX_VALUE_LEN,
};
use crate::error::{Error, Result};
use crate::name::LockName;
use std::future::Future;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

/// How often an [`Observer`] looks at the election by default.
pub const OBSERVE_EVERY: Duration = Duration::from_millis(500);

impl Client {
    /// A leader election named `name` (a lock name: [`Error::InvalidName`] for a bad one).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let client = dlock::connect("mem://doc-election").await?;
    /// let election = client.election("services/billing")?;
    /// let leading = election.campaign("10.0.0.7:8080").await?;   // waits until this client leads
    /// let term = leading.term();                                 // the fencing token of the term
    /// let now = election.leader().await?.expect("a leader");
    /// assert_eq!(now.value.as_deref(), Some("10.0.0.7:8080"));
    /// assert_eq!(now.term, term);
    /// leading.proclaim("10.0.0.7:9090").await?;                  // a new value, same term
    /// tokio::select! {
    ///     e = leading.lost() => eprintln!("no longer leading: {e}"),
    ///     _ = async { /* lead */ } => {}
    /// }
    /// leading.resign().await?;
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl Into<String>) -> Result<Election> {
        Ok(Election {
            client: self.clone(),
            name: LockName::new(name)?,
            lease: self.inner.lease,
            fair: false,
            every: OBSERVE_EVERY,
        })
    }
}

/// A leader election: [`Election::campaign`] to lead, [`Election::leader`] and
/// [`Election::observe`] to follow. See [`Client::election`].
///
/// The leader holds the mutex of the election's name (so `dlock list` shows it, with its value),
/// renewed while the [`Leadership`] lives. A leader whose renewals fail learns it from
/// [`Leadership::lost`] before the store can let anyone else lead, as with every hold.
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: LockName,
    lease: Duration,
    fair: bool,
    every: Duration,
}

impl Election {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The lease of a term (default: the client's). A leader that dies is followed after at most
    /// this long (on session stores: the session timeout). Checked when campaigning.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Candidates lead in the order they began to campaign (default `false`; ZooKeeper and etcd
    /// are always in order).
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// How often an [`Observer`] looks at the election on a store that cannot notify it
    /// (default [`OBSERVE_EVERY`]; 10 ms ..= 1 hour, else [`Error::InvalidConfig`] from
    /// [`Observer::next`]).
    pub fn observe_every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    fn spec(&self, value: Option<String>) -> Spec {
        Spec {
            name: self.name.clone(),
            kind: LockKind::Mutex,
            mode: Mode::Exclusive,
            lease: self.lease,
            renew: true,
            fair: self.fair,
            value,
        }
    }

    async fn run(&self, value: String, wait: Wait) -> Result<Leadership> {
        check_lease(self.lease)?;
        let value = checked_value(&self.client, value)?;
        loop {
            let hold = self
                .client
                .inner
                .acquire(&self.spec(value.clone()), wait)
                .await?;
            let guard = Guard::new(hold);
            // A grant sends no notification on the lease stores: the new term announces itself
            // by writing its value again, which wakes the followers' observers as a release does.
            if self.client.capabilities().values {
                if let Err(e) = guard.set_value(value.as_deref().unwrap_or("")).await {
                    tracing::debug!(error = %e, "announcing a new term");
                }
            }
            // A term lost while it was announced (a store too slow to renew it in time) is not
            // handed out: its caller could not have seen `lost()` before the next leader was
            // elected. The campaign goes on, within the same wait.
            if guard.is_held() {
                return Ok(Leadership {
                    client: self.client.clone(),
                    guard,
                    value: StdMutex::new(value),
                });
            }
            tracing::debug!(
                name = self.name.as_str(),
                term = ?guard.token(),
                "a term was lost before the campaign returned; campaigning again"
            );
            if let Err(e) = guard.release().await {
                tracing::debug!(error = %e, "giving back a term lost before it began");
            }
        }
    }

    /// Waits until this client leads, publishing `value` as the leader's value (`""`: none).
    /// A value is at most [`MAX_VALUE_LEN`] bytes without NUL ([`Error::InvalidConfig`]); a
    /// store that cannot keep values ([`crate::Capabilities::values`]) takes only `""`
    /// ([`Error::Unsupported`]). A campaign after a lost term starts afresh. It never returns a
    /// term that was lost before it returned (the store too slow to renew it while it was
    /// announced): such a term is given back and the campaign goes on.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        self.run(value.into(), Wait::Forever).await
    }

    /// Leads if nobody leads now; [`Error::Busy`] otherwise (nothing left behind).
    pub async fn try_campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        self.run(value.into(), Wait::No).await
    }

    /// Waits at most `timeout` to lead; [`Error::Timeout`] after that.
    pub async fn campaign_timeout(
        &self,
        value: impl Into<String>,
        timeout: Duration,
    ) -> Result<Leadership> {
        self.run(value.into(), until(timeout)).await
    }

    /// The current leader, `None` when nobody leads (a leader whose term was revoked by
    /// `dlock unlock --force` no longer leads). [`Error::InvalidConfig`] if the name is used as
    /// something other than a mutex.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let Some(info) = self.client.describe(self.name.as_str()).await? else {
            return Ok(None);
        };
        if info.kind != LockKind::Mutex {
            return Err(Error::InvalidConfig(format!(
                "{:?} is used as a {}, not as an election",
                self.name.as_str(),
                info.kind
            )));
        }
        Ok(info
            .holders
            .into_iter()
            .find(|h| h.status != HoldStatus::Revoked)
            .map(|holder| Leader {
                term: holder.token,
                // "" is no value (a term announced without one).
                value: holder.meta.value.clone().filter(|v| !v.is_empty()),
                holder,
            }))
    }

    /// A follower's view: [`Observer::next`] answers the leader now, then each change of leader
    /// or of its value.
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            last: None,
            watch: None,
        }
    }
}

/// An election's value, checked: `""` is none.
fn checked_value(client: &Client, value: String) -> Result<Option<String>> {
    if value.is_empty() {
        return Ok(None);
    }
    if value.len() > MAX_VALUE_LEN || value.contains('\0') {
        return Err(Error::InvalidConfig(format!(
            "a leader's value is at most {MAX_VALUE_LEN} bytes without NUL ({} bytes given)",
            value.len()
        )));
    }
    if !client.capabilities().values {
        return Err(Error::Unsupported(format!(
            "the {} store cannot keep a leader's value; campaign with \"\"",
            client.backend_name()
        )));
    }
    Ok(Some(value))
}

/// Who leads an election, as [`Election::leader`] and [`Observer::next`] see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The term: the fencing token of the leader's hold (`None` on stores without fencing).
    pub term: Option<u64>,
    /// The value the leader published (campaign or last proclaim).
    pub value: Option<String>,
    /// The leader's hold: client id, host, pid, owner token, since when, lease left.
    pub holder: HolderInfo,
}

/// This client leads: returned by [`Election::campaign`]. Dropping it resigns in the background;
/// [`Leadership::resign`] resigns and reports errors.
#[derive(Debug)]
#[must_use = "the leadership ends when it is dropped"]
pub struct Leadership {
    client: Client,
    guard: Guard,
    value: StdMutex<Option<String>>,
}

impl Leadership {
    /// The term: strictly greater than every earlier term of this election (its fencing token).
    /// Pass it to what the leader writes. `None` only on stores without fencing (Redlock).
    pub fn term(&self) -> Option<u64> {
        self.guard.token()
    }

    /// True while this client can trust that it leads.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// The value this leader published last.
    pub fn value(&self) -> Option<String> {
        self.value.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The hold behind the leadership (token, owner, validity).
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Resolves when this client can no longer trust that it leads: before anyone else can be
    /// elected (see [`Guard::lost`]). Campaign again afterwards to stand for a new term.
    pub fn lost(&self) -> impl Future<Output = Error> + Send + 'static {
        self.guard.lost()
    }

    /// Publishes a new value for this term. [`Error::Lost`] if the leadership was lost already,
    /// [`Error::NotOwner`] if the store no longer had it (the leadership is then lost).
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        let checked = checked_value(&self.client, value.clone())?;
        self.guard.set_value(&value).await?;
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = checked;
        Ok(())
    }

    /// Ends the term now, so another candidate can lead at once.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

/// A follower's view of an election ([`Election::observe`]).
pub struct Observer {
    election: Election,
    /// What the last answer reported: owner and value of the leader, if any.
    last: Option<Option<(String, Option<String>)>>,
    /// The store's change source, watched without attempting (made at the first `next`).
    watch: Option<Box<dyn Acquisition>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

/// The longest an [`Observer`] waits for the store's notification before it looks anyway.
pub const NATIVE_SAFETY_NET: Duration = Duration::from_secs(5);

impl Observer {
    /// The first call answers the leader now (`None`: nobody leads); each later call waits until
    /// the leader or its value differs from the last answer. It is woken by the store's
    /// notifications where the store has them for a watcher that does not campaign (SQLite,
    /// Redis, PostgreSQL; a new term announces itself, a proclaim and a resignation notify),
    /// then looking again at least every [`NATIVE_SAFETY_NET`]; elsewhere (MySQL, ZooKeeper,
    /// etcd, Redlock) it looks every [`Election::observe_every`]. Changes made in this process
    /// wake it at once, and it looks when the leader's lease would run out. A store error is
    /// returned; calling again goes on observing.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        let every = self.election.every;
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&every) {
            return Err(Error::InvalidConfig(format!(
                "observe_every({every:?}) is outside 10 ms ..= 1 hour"
            )));
        }
        let client = &self.election.client;
        let store = &client.inner.store;
        let signal = store.local.subscribe(self.election.name.as_str());
        let mut watch = self.watch.take().unwrap_or_else(|| {
            let owner = uuid::Uuid::new_v4().to_string();
            store.backend.begin(&Request {
                name: &self.election.name,
                kind: LockKind::Mutex,
                mode: Mode::Exclusive,
                owner: &owner,
                lease: self.election.lease,
                fair: false,
                waiting: true,
                meta: &client.inner.meta,
            })
        });
        loop {
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let native = watch.mark();
            let now = match self.election.leader().await {
                Ok(now) => now,
                Err(e) => {
                    self.watch = Some(watch);
                    return Err(e);
                }
            };
            let seen = now
                .as_ref()
                .map(|l| (l.holder.owner.clone(), l.value.clone()));
            if self.last.as_ref() != Some(&seen) {
                self.last = Some(seen);
                self.watch = Some(watch);
                return Ok(now);
            }
            let mut wait = if native { NATIVE_SAFETY_NET } else { every };
            if let Some(left) = now.as_ref().and_then(|l| l.holder.lease_left_ms) {
                wait = wait.min(Duration::from_millis(left.saturating_add(5)));
            }
            let until = crate::clock::now() + wait;
            let busy = Busy::default();
            // `changed` ends by `until` itself; the bound is for a store that does not.
            let bound = (until + Duration::from_secs(1)).into();
            tokio::select! {
                biased; // deterministic under a seeded simulation (tests/simulation.rs)
                _ = &mut notified => {}
                r = tokio::time::timeout_at(bound, watch.changed(&busy, until)), if native => {
                    // No notification source after all (a listener down, MySQL): the interval.
                    if !matches!(r, Ok(Ok(Watch::Changed | Watch::Recheck))) {
                        tokio::time::sleep_until(until.min(crate::clock::now() + every).into()).await;
                    }
                }
                _ = tokio::time::sleep_until(until.into()), if !native => {}
            }
        }
    }
}
