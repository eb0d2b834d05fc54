//! Leader election ([`Election`]) over a mutex of the election's name: the leader is the holder,
//! its term the hold's fencing token, its value stored with the hold.
//!
//! Written once above the store: a campaign is a mutex acquisition (woken by the store's
//! notifications like every waiter), the leadership's `lost()` is the hold's, and a campaign
//! after a loss is a new acquisition with a new owner, so nothing of the lost term is reused.

use super::client::Client;
use super::handles::{until, Guard};
use super::rules::{check_lease, Spec, Wait};
use crate::backend::{HoldStatus, HolderInfo, LockKind, Mode, MAX_VALUE_LEN};
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

    /// How often an [`Observer`] looks at the election when nothing in this process changed it
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
        let hold = self
            .client
            .inner
            .acquire(&self.spec(value.clone()), wait)
            .await?;
        Ok(Leadership {
            client: self.client.clone(),
            guard: Guard::new(hold),
            value: StdMutex::new(value),
        })
    }

    /// Waits until this client leads, publishing `value` as the leader's value (`""`: none).
    /// A value is at most [`MAX_VALUE_LEN`] bytes without NUL ([`Error::InvalidConfig`]); a
    /// store that cannot keep values ([`crate::Capabilities::values`]) takes only `""`
    /// ([`Error::Unsupported`]). A campaign after a lost term starts afresh.
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
                value: holder.meta.value.clone(),
                holder,
            }))
    }

    /// A follower's view: [`Observer::next`] answers the leader now, then each change of leader
    /// or of its value.
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            last: None,
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
#[derive(Debug)]
pub struct Observer {
    election: Election,
    /// What the last answer reported: owner and value of the leader, if any.
    last: Option<Option<(String, Option<String>)>>,
}

impl Observer {
    /// The first call answers the leader now (`None`: nobody leads); each later call waits until
    /// the leader or its value differs from the last answer. It looks at the store every
    /// [`Election::observe_every`], at once when a client of this process changes the election,
    /// and when the leader's lease would run out. A store error is returned; calling again goes
    /// on observing.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        let every = self.election.every;
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&every) {
            return Err(Error::InvalidConfig(format!(
                "observe_every({every:?}) is outside 10 ms ..= 1 hour"
            )));
        }
        let store = &self.election.client.inner.store;
        let signal = store.local.subscribe(self.election.name.as_str());
        loop {
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = self.election.leader().await?;
            let seen = now
                .as_ref()
                .map(|l| (l.holder.owner.clone(), l.value.clone()));
            if self.last.as_ref() != Some(&seen) {
                self.last = Some(seen);
                return Ok(now);
            }
            let mut wait = every;
            if let Some(left) = now.as_ref().and_then(|l| l.holder.lease_left_ms) {
                wait = wait.min(Duration::from_millis(left.saturating_add(5)));
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}
