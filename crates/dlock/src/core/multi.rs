//! Several holds as one: the multi-lock ([`MultiLock`]), segmented locks ([`Striped`]) and the
//! semaphore's n permits at once, all behind one [`MultiGuard`].
//!
//! Written once above the store: the names are taken one by one, in one canonical order (sorted
//! by their bytes), so two callers naming the same set in different orders cannot deadlock; a
//! refusal, a timeout or a dropped acquisition lets go of every name taken so far.

use super::client::Client;
use super::handles::{hold_settings, until, Guard, Mutex, Semaphore};
use super::rules::{check_lease, Spec, Wait};
use crate::backend::{fnv1a64_bytes, LockKind, Mode};
use crate::error::{Error, Result};
use crate::name::{LockName, MAX_NAME_LEN};
use std::future::Future;
use std::time::Duration;

/// The settings every hold of a multi-acquisition shares.
#[derive(Debug, Clone)]
pub(crate) struct Takes {
    pub(crate) client: Client,
    pub(crate) lease: Duration,
    pub(crate) renew: bool,
    pub(crate) fair: bool,
}

impl Takes {
    pub(crate) fn new(client: Client) -> Takes {
        let lease = client.inner.lease;
        Takes {
            client,
            lease,
            renew: true,
            fair: false,
        }
    }

    fn spec(&self, name: &LockName, kind: LockKind, mode: Mode) -> Spec {
        Spec {
            name: name.clone(),
            kind,
            mode,
            lease: self.lease,
            renew: self.renew,
            fair: self.fair,
            value: None,
        }
    }

    /// Takes one hold of `name`, as a guard at once (so that a dropped acquisition releases it).
    pub(crate) async fn one(
        &self,
        name: &LockName,
        kind: LockKind,
        mode: Mode,
        wait: Wait,
    ) -> Result<Guard> {
        let hold = self
            .client
            .inner
            .acquire(&self.spec(name, kind, mode), wait)
            .await?;
        Ok(Guard::new(hold))
    }

    /// Takes every name of `names` in their order, all or nothing: on any error the holds taken
    /// so far are released before the error is returned. A hold lost while the later names were
    /// waited for (its renewals failed) is not handed out: everything is let go and taken again,
    /// within the same wait, since nobody could have seen its `lost()` before another grant.
    pub(crate) async fn all(
        &self,
        names: &[LockName],
        kind: LockKind,
        mode: Mode,
        wait: Wait,
    ) -> Result<MultiGuard> {
        check_lease(self.lease)?;
        loop {
            let mut guards = Vec::with_capacity(names.len());
            for name in names {
                match self.one(name, kind, mode, wait).await {
                    Ok(g) => guards.push(g),
                    Err(e) => {
                        MultiGuard { guards }.let_go().await;
                        return Err(e);
                    }
                }
            }
            let taken = MultiGuard { guards };
            if taken.is_held() {
                return Ok(taken);
            }
            tracing::debug!("a hold was lost while the other names were taken; taking them again");
            taken.let_go().await;
        }
    }
}

/// The canonical order of a set of names: sorted by their bytes, each once.
fn canonical(names: impl IntoIterator<Item = impl Into<String>>) -> Result<Vec<LockName>> {
    let mut v = names
        .into_iter()
        .map(LockName::new)
        .collect::<Result<Vec<_>>>()?;
    v.sort();
    v.dedup();
    if v.is_empty() {
        return Err(Error::InvalidConfig(
            "a multi-lock needs at least one name".into(),
        ));
    }
    Ok(v)
}

impl Client {
    /// A lock over several names at once, taken all-or-nothing in one canonical order (sorted by
    /// the names' bytes; duplicates count once): two callers naming the same set in different
    /// orders cannot deadlock. One [`MultiGuard`] holds them all. Every name must be valid
    /// ([`Error::InvalidName`]); an empty set is [`Error::InvalidConfig`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let client = dlock::connect("mem://doc-multi").await?;
    /// let transfer = client.multi(["accounts/17", "accounts/4"])?;
    /// let both = transfer.acquire().await?;
    /// assert_eq!(both.names().collect::<Vec<_>>(), ["accounts/17", "accounts/4"]);
    /// // A caller naming them the other way round waits for the same first name.
    /// let other = client.multi(["accounts/4", "accounts/17"])?;
    /// assert!(other.try_acquire().await.unwrap_err().is_not_granted());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn multi<I, S>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ok(MultiLock {
            takes: Takes::new(self.clone()),
            names: canonical(names)?,
        })
    }

    /// A segmented (striped) lock: `stripes` lock names `base/0` … `base/{stripes-1}` that any
    /// number of keys share, a key taking the stripe [`Striped::stripe_of`] gives it. Lets a
    /// million keys (films, accounts) share, say, 64 locks: keys of different stripes never wait
    /// for each other, keys of one stripe do. `stripes` is 1 ..= 65 536
    /// ([`Error::InvalidConfig`]); `base/{stripes-1}` must be a valid name ([`Error::InvalidName`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let client = dlock::connect("mem://doc-striped").await?;
    /// let films = client.striped("cinema/films", 64)?;
    /// let g = films.lock("film-2041").await?;
    /// assert_eq!(g.name(), films.name_of("film-2041"));
    /// // Several keys at once: their distinct stripes, all or nothing, in canonical order.
    /// drop(g);
    /// let gs = films.lock_many(["film-1", "film-2", "film-1"]).await?;
    /// assert!(gs.len() <= 2);
    /// # Ok(()) }
    /// ```
    pub fn striped(&self, base: impl Into<String>, stripes: u32) -> Result<Striped> {
        let base = base.into();
        if !(1..=MAX_STRIPES).contains(&stripes) {
            return Err(Error::InvalidConfig(format!(
                "a striped lock has 1 ..= {MAX_STRIPES} stripes, not {stripes}"
            )));
        }
        let last = format!("{base}/{}", stripes - 1);
        if base.is_empty() || last.len() > MAX_NAME_LEN {
            return Err(Error::InvalidName(format!(
                "the base of a striped lock must be a name that leaves room for \"/{}\" \
                 ({MAX_NAME_LEN} bytes in all)",
                stripes - 1
            )));
        }
        LockName::new(last)?;
        Ok(Striped {
            takes: Takes::new(self.clone()),
            base,
            stripes,
        })
    }
}

/// The most stripes a [`Striped`] lock may have.
pub const MAX_STRIPES: u32 = 65_536;

/// Several lock names taken as one, all-or-nothing, in canonical order: see [`Client::multi`].
/// Mutex mode ([`MultiLock::acquire`]) or read/write mode over read-write locks
/// ([`MultiLock::read`], [`MultiLock::write`]). Not reentrant: each acquisition takes new holds.
#[derive(Debug, Clone)]
pub struct MultiLock {
    takes: Takes,
    names: Vec<LockName>,
}

impl MultiLock {
    hold_settings!(takes);

    /// The names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(LockName::as_str)
    }

    async fn take(&self, kind: LockKind, mode: Mode, wait: Wait) -> Result<MultiGuard> {
        self.takes.all(&self.names, kind, mode, wait).await
    }

    /// Waits until every name is held (as mutexes).
    pub async fn acquire(&self) -> Result<MultiGuard> {
        self.take(LockKind::Mutex, Mode::Exclusive, Wait::Forever)
            .await
    }

    /// Takes every name if each is free now; otherwise [`Error::Busy`] (naming the first busy
    /// name) and nothing is left held.
    pub async fn try_acquire(&self) -> Result<MultiGuard> {
        self.take(LockKind::Mutex, Mode::Exclusive, Wait::No).await
    }

    /// Waits at most `timeout` for all of them; [`Error::Timeout`] after that, with nothing left
    /// held.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        self.take(LockKind::Mutex, Mode::Exclusive, until(timeout))
            .await
    }

    /// Waits for a read hold of every name (read-write locks).
    pub async fn read(&self) -> Result<MultiGuard> {
        self.take(LockKind::RwLock, Mode::Shared, Wait::Forever)
            .await
    }

    /// Read holds of every name if possible now; [`Error::Busy`] otherwise, nothing left held.
    pub async fn try_read(&self) -> Result<MultiGuard> {
        self.take(LockKind::RwLock, Mode::Shared, Wait::No).await
    }

    /// Waits at most `timeout` for read holds of every name.
    pub async fn read_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        self.take(LockKind::RwLock, Mode::Shared, until(timeout))
            .await
    }

    /// Waits for the write hold of every name (read-write locks).
    pub async fn write(&self) -> Result<MultiGuard> {
        self.take(LockKind::RwLock, Mode::Exclusive, Wait::Forever)
            .await
    }

    /// Write holds of every name if possible now; [`Error::Busy`] otherwise, nothing left held.
    pub async fn try_write(&self) -> Result<MultiGuard> {
        self.take(LockKind::RwLock, Mode::Exclusive, Wait::No).await
    }

    /// Waits at most `timeout` for the write holds of every name.
    pub async fn write_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        self.take(LockKind::RwLock, Mode::Exclusive, until(timeout))
            .await
    }
}

/// A segmented lock: keys share `stripes` names (`base/<stripe>`); see [`Client::striped`].
///
/// The stripe of a key is `FNV-1a-64(key bytes) mod stripes` (offset basis
/// `0xcbf29ce484222325`, prime `0x100000001b3`), a hash any language computes alike, so
/// processes written in other languages can take the same stripes.
#[derive(Debug, Clone)]
pub struct Striped {
    takes: Takes,
    base: String,
    stripes: u32,
}

impl Striped {
    hold_settings!(takes);

    /// The number of stripes.
    pub fn stripes(&self) -> u32 {
        self.stripes
    }

    /// The stripe of `key`: FNV-1a 64 of its bytes, modulo the number of stripes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let client = dlock::connect("mem://doc-stripe-of").await?;
    /// // FNV-1a-64("a") = 0xaf63dc4c8601ec8c
    /// assert_eq!(client.striped("s", 1000)?.stripe_of("a"), (0xaf63dc4c8601ec8c_u64 % 1000) as u32);
    /// # Ok(()) }
    /// ```
    pub fn stripe_of(&self, key: impl AsRef<[u8]>) -> u32 {
        let h = fnv1a64_bytes(key.as_ref().iter().copied());
        // The remainder is below `stripes`, a u32.
        u32::try_from(h % u64::from(self.stripes)).unwrap_or(0)
    }

    /// The lock name of `key`'s stripe: `base/<stripe>`.
    pub fn name_of(&self, key: impl AsRef<[u8]>) -> String {
        format!("{}/{}", self.base, self.stripe_of(key))
    }

    fn lock_name(&self, key: impl AsRef<[u8]>) -> Result<LockName> {
        LockName::new(self.name_of(key))
    }

    /// A mutex handle of `key`'s stripe (reentrant per handle, like every [`Mutex`]).
    pub fn mutex(&self, key: impl AsRef<[u8]>) -> Result<Mutex> {
        let t = &self.takes;
        Ok(Mutex::new(t.client.clone(), self.lock_name(key)?)
            .lease(t.lease)
            .auto_renew(t.renew)
            .fair(t.fair))
    }

    /// Waits for `key`'s stripe.
    pub async fn lock(&self, key: impl AsRef<[u8]>) -> Result<Guard> {
        let name = self.lock_name(key)?;
        self.takes
            .one(&name, LockKind::Mutex, Mode::Exclusive, Wait::Forever)
            .await
    }

    /// Takes `key`'s stripe if it is free now; [`Error::Busy`] otherwise.
    pub async fn try_lock(&self, key: impl AsRef<[u8]>) -> Result<Guard> {
        let name = self.lock_name(key)?;
        self.takes
            .one(&name, LockKind::Mutex, Mode::Exclusive, Wait::No)
            .await
    }

    /// Waits at most `timeout` for `key`'s stripe.
    pub async fn lock_timeout(&self, key: impl AsRef<[u8]>, timeout: Duration) -> Result<Guard> {
        let name = self.lock_name(key)?;
        self.takes
            .one(&name, LockKind::Mutex, Mode::Exclusive, until(timeout))
            .await
    }

    /// The multi-lock of the distinct stripes of `keys` (see [`Client::multi`]).
    pub fn multi<I, K>(&self, keys: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<[u8]>,
    {
        Ok(MultiLock {
            takes: self.takes.clone(),
            names: canonical(keys.into_iter().map(|k| self.name_of(k)))?,
        })
    }

    /// Waits for the distinct stripes of `keys`, all or nothing, in canonical order.
    pub async fn lock_many<I, K>(&self, keys: I) -> Result<MultiGuard>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<[u8]>,
    {
        self.multi(keys)?.acquire().await
    }
}

/// The holds of a multi-acquisition ([`MultiLock`], [`Striped::lock_many`],
/// [`crate::Semaphore::acquire_many`]), each with its own fencing token. Dropping it releases
/// every hold in the background; [`MultiGuard::release`] releases and reports errors.
#[derive(Debug)]
#[must_use = "the locks are released when the guard is dropped"]
pub struct MultiGuard {
    guards: Vec<Guard>,
}

impl MultiGuard {
    /// The holds, in the order they were taken.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// The number of holds.
    pub fn len(&self) -> usize {
        self.guards.len()
    }

    /// Whether there are no holds (never, for a granted multi-acquisition).
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// The names, in the order they were taken (a semaphore's name once per permit).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(Guard::name)
    }

    /// The fencing token of each hold, in order (`None` on stores without fencing).
    pub fn tokens(&self) -> Vec<Option<u64>> {
        self.guards.iter().map(Guard::token).collect()
    }

    /// The fencing token of the hold of `name` (the first, for a semaphore's permits).
    pub fn token(&self, name: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.name() == name)
            .and_then(Guard::token)
    }

    /// True while every hold can be trusted.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(Guard::is_held)
    }

    /// How long every hold is trusted from now without renewal (the shortest), `None` if one is
    /// not held.
    pub fn valid_for(&self) -> Option<Duration> {
        self.guards
            .iter()
            .map(Guard::valid_for)
            .try_fold(Duration::MAX, |m, v| v.map(|v| m.min(v)))
    }

    /// Resolves when any one of the holds can no longer be trusted (see [`Guard::lost`]), with
    /// that hold's reason.
    pub fn lost(&self) -> impl Future<Output = Error> + Send + 'static {
        let all: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if all.is_empty() {
                return std::future::pending().await;
            }
            futures_util::future::select_all(all).await.0
        }
    }

    /// Releases every hold (in reverse order). Returns the first error; the others are released
    /// anyway.
    pub async fn release(mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some(g) = self.guards.pop() {
            let r = g.release().await;
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Releases everything, ignoring errors (an acquisition that gives up).
    pub(crate) async fn let_go(self) {
        let _ = self.release().await;
    }
}

impl Semaphore {
    /// Waits for `n` permits at once, all or nothing: one [`MultiGuard`] with a hold (and a
    /// fencing token) per permit. `n` is 1 ..= [`Semaphore::permits`], else
    /// [`Error::InvalidConfig`].
    ///
    /// Callers that want several permits take them one after another while holding a gate (a
    /// mutex of their own, named after the semaphore), so two of them never each hold a part
    /// of what the other waits for; callers of one permit never wait while holding one. A
    /// dropped, refused or timed-out acquisition releases the permits it took.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let client = dlock::connect("mem://doc-many").await?;
    /// let gpus = client.semaphore("gpus", 4)?;
    /// let three = gpus.acquire_many(3).await?;
    /// assert_eq!(three.len(), 3);
    /// assert!(gpus.try_acquire_many(2).await.unwrap_err().is_not_granted());
    /// let one = gpus.try_acquire().await?; // the fourth
    /// # drop((three, one));
    /// # Ok(()) }
    /// ```
    pub async fn acquire_many(&self, n: u32) -> Result<MultiGuard> {
        self.many(n, Wait::Forever).await
    }

    /// Takes `n` permits if they are free now; [`Error::Busy`] otherwise, with none left held.
    pub async fn try_acquire_many(&self, n: u32) -> Result<MultiGuard> {
        self.many(n, Wait::No).await
    }

    /// Waits at most `timeout` for `n` permits; [`Error::Timeout`] after that, none left held.
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<MultiGuard> {
        self.many(n, until(timeout)).await
    }

    async fn many(&self, n: u32, wait: Wait) -> Result<MultiGuard> {
        let permits = self.permits();
        if n == 0 || n > permits {
            return Err(Error::InvalidConfig(format!(
                "semaphore {:?} has {} permits; acquire_many takes 1 ..= {} of them, not {n}",
                self.name(),
                permits,
                permits
            )));
        }
        let (client, name, lease, renew, fair) = self.parts();
        let takes = Takes {
            client: client.clone(),
            lease,
            renew,
            fair,
        };
        let kind = LockKind::Semaphore { permits };
        let names = vec![name.clone(); n as usize];
        if n == 1 {
            return takes.all(&names, kind, Mode::Shared, wait).await;
        }
        let gate = takes
            .one(&gate(name), LockKind::Mutex, Mode::Exclusive, wait)
            .await?;
        let taken = takes.all(&names, kind, Mode::Shared, wait).await;
        if let Err(e) = gate.release().await {
            tracing::debug!(error = %e, "release of a semaphore's gate (its lease ends it)");
        }
        taken
    }
}

/// The gate of the callers of several permits: the name plus `\u{1}many` (a control
/// character no one types), or for a name too long for that, `\u{1}many/` and the FNV-1a
/// of the name in hex.
fn gate(lock: &LockName) -> LockName {
    let name = lock.as_str();
    let long = format!("{name}\u{1}many");
    LockName::new(long).unwrap_or_else(|_| {
        let h = crate::backend::fnv1a64_bytes(name.bytes());
        LockName::new(format!("\u{1}many/{h:016x}")).unwrap_or_else(|_| lock.clone())
    })
}
