//! A counting wrapper around the in-memory store, shared by the core's integration tests.

use async_trait::async_trait;
use dlock::backend::memory::MemoryBackend;
use dlock::backend::{
    Acquisition, Attempt, Backend, Busy, Capabilities, Extended, HoldRef, LockInfo, Look, Released,
    Request, Watch,
};
use dlock::LockName;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The in-memory store, counting `acquire` calls, recording the size of every `extend` call and
/// able to fail them.
#[derive(Debug)]
pub struct Counting {
    inner: MemoryBackend,
    /// The name of the in-memory store (`mem://<store>`).
    store: String,
    pub acquires: Arc<AtomicUsize>,
    pub batches: Mutex<Vec<usize>>,
    pub failing: AtomicBool,
    pub failed_calls: AtomicUsize,
    /// Milliseconds every `release` and `cancel` sleeps before it is sent (a slow store).
    pub slow_cleanup_ms: Arc<AtomicU64>,
    /// Milliseconds the next `set_value` stalls the store (renewals fail meanwhile); once.
    pub stall_set_value_ms: AtomicU64,
}

async fn slow(ms: &AtomicU64) {
    let ms = ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

#[async_trait]
impl Backend for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        Box::new(CountedAcquisition {
            inner: self.inner.begin(req),
            attempts: self.acquires.clone(),
            slow_cleanup_ms: self.slow_cleanup_ms.clone(),
        })
    }
    fn shared_key(&self) -> Option<String> {
        self.inner.shared_key()
    }
    async fn release(&self, hold: &HoldRef<'_>) -> dlock::Result<Released> {
        slow(&self.slow_cleanup_ms).await;
        self.inner.release(hold).await
    }
    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> dlock::Result<Vec<Extended>> {
        if detach {
            // `expire_in`: not a renewal batch.
            return self.inner.extend(holds, true).await;
        }
        if self.failing.load(Ordering::SeqCst) {
            self.failed_calls.fetch_add(1, Ordering::SeqCst);
            return Err(dlock::Error::Unavailable("test: store down".into()));
        }
        self.batches.lock().unwrap().push(holds.len());
        self.inner.extend(holds, false).await
    }
    async fn describe(&self, prefix: &str) -> dlock::Result<Vec<LockInfo>> {
        self.inner.describe(prefix).await
    }
    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> dlock::Result<Released> {
        let stall = self.stall_set_value_ms.swap(0, Ordering::SeqCst);
        if stall > 0 {
            self.failing.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(stall)).await;
            self.failing.store(false, Ordering::SeqCst);
        }
        self.inner.set_value(hold, value).await
    }
    async fn force_release(
        &self,
        name: &LockName,
        how: dlock::Force,
    ) -> dlock::Result<dlock::Forced> {
        self.inner.force_release(name, how).await
    }
    fn session_timeout(&self) -> Option<std::time::Duration> {
        self.inner.session_timeout()
    }
}

/// A counting wrapper around the in-memory store `mem://<store>`.
pub fn counting(store: &str) -> Arc<Counting> {
    Arc::new(Counting {
        inner: MemoryBackend::named(store),
        store: store.to_owned(),
        acquires: Arc::new(AtomicUsize::new(0)),
        batches: Mutex::new(Vec::new()),
        failing: AtomicBool::new(false),
        failed_calls: AtomicUsize::new(0),
        slow_cleanup_ms: Arc::new(AtomicU64::new(0)),
        stall_set_value_ms: AtomicU64::new(0),
    })
}

impl Counting {
    /// A client of this store with `options`.
    pub fn client(self: &Arc<Self>, options: dlock::ClientOptions) -> dlock::Client {
        dlock::Client::with_backend(self.clone(), format!("mem://{}", self.store), options)
            .expect("a client of the in-memory store")
    }
}

/// An acquisition of the in-memory store whose attempts are counted.
struct CountedAcquisition {
    inner: Box<dyn Acquisition>,
    attempts: Arc<AtomicUsize>,
    slow_cleanup_ms: Arc<AtomicU64>,
}

#[async_trait]
impl Acquisition for CountedAcquisition {
    async fn attempt(&mut self) -> dlock::Result<Attempt> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        self.inner.attempt().await
    }
    async fn changed(&mut self, busy: &Busy, until: Instant) -> dlock::Result<Watch> {
        self.inner.changed(busy, until).await
    }
    async fn look(&mut self) -> dlock::Result<Option<Look>> {
        self.inner.look().await
    }
    async fn cancel(&mut self) -> dlock::Result<()> {
        slow(&self.slow_cleanup_ms).await;
        self.inner.cancel().await
    }
}
