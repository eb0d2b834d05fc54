//! Request builders the stores' own tests share.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A lease long enough that nothing expires during a test.
pub(crate) const LONG: Duration = Duration::from_secs(30);

pub(crate) fn meta(id: &str) -> HolderMeta {
    HolderMeta {
        client_id: id.into(),
        host: "testhost".into(),
        pid: 42,
        value: None,
    }
}

pub(crate) fn name(n: &str) -> LockName {
    LockName::new(n).unwrap()
}

/// A plain (unfair, try) mutex request with a long lease.
pub(crate) fn rq<'a>(name: &'a LockName, owner: &'a str, meta: &'a HolderMeta) -> Request<'a> {
    Request {
        name,
        kind: LockKind::Mutex,
        mode: Mode::Exclusive,
        owner,
        lease: LONG,
        fair: false,
        waiting: false,
        meta,
    }
}

/// The hold a request would make.
pub(crate) fn hr<'a>(r: &Request<'a>) -> HoldRef<'a> {
    r.hold()
}

/// [`rq`] of a request that waits (blocking or timed).
pub(crate) fn wait_rq<'a>(name: &'a LockName, owner: &'a str, meta: &'a HolderMeta) -> Request<'a> {
    Request {
        waiting: true,
        ..rq(name, owner, meta)
    }
}

/// The token of a grant; panics on busy.
pub(crate) fn token(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(g) => g.token.expect("a grant with a fencing token"),
        Attempt::Busy(b) => panic!("expected a grant, got busy {b:?}"),
    }
}

/// The busy answer; panics on a grant.
pub(crate) fn busy(a: Attempt) -> Busy {
    match a {
        Attempt::Busy(b) => b,
        Attempt::Granted(g) => panic!("expected busy, got {g:?}"),
    }
}

/// The stores' own tests drive a backend one call at a time, as the core does: one acquisition
/// per (backend, owner), kept between the calls of a waiting owner (its queue place, what it
/// saw) and dropped once it is granted, refused without waiting, or cancelled.
#[async_trait::async_trait]
pub(crate) trait Drive {
    /// One attempt of `req` (on the owner's acquisition).
    async fn acquire(&self, req: &Request<'_>) -> Result<Attempt>;
    /// The core's wait for a change after a busy attempt of `req`, until `until`.
    async fn wait(&self, req: &Request<'_>, busy: &Busy, until: Instant) -> Result<()>;
    /// The owner gives up waiting.
    async fn cancel(&self, req: &Request<'_>) -> Result<()>;
}

type Acquisitions =
    std::sync::Mutex<std::collections::HashMap<(usize, String), Box<dyn Acquisition>>>;

fn acquisitions() -> &'static Acquisitions {
    static A: std::sync::OnceLock<Acquisitions> = std::sync::OnceLock::new();
    A.get_or_init(Default::default)
}

fn take<B: Backend>(b: &B, req: &Request<'_>) -> Box<dyn Acquisition> {
    let key = (b as *const B as usize, req.owner.to_owned());
    let found = acquisitions()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key);
    found.unwrap_or_else(|| b.begin(req))
}

fn keep<B: Backend>(b: &B, req: &Request<'_>, acq: Box<dyn Acquisition>) {
    let key = (b as *const B as usize, req.owner.to_owned());
    acquisitions()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, acq);
}

#[async_trait::async_trait]
impl<B: Backend> Drive for B {
    async fn acquire(&self, req: &Request<'_>) -> Result<Attempt> {
        let mut acq = take(self, req);
        let a = acq.attempt().await;
        if req.waiting && matches!(a, Ok(Attempt::Busy(_))) {
            keep(self, req, acq);
        }
        a
    }

    async fn wait(&self, req: &Request<'_>, busy: &Busy, until: Instant) -> Result<()> {
        let mut acq = take(self, req);
        let calls = crate::core::wait::Calls::new(self, "test");
        let r = crate::core::wait::wait_for_turn(acq.as_mut(), &calls, busy, until).await;
        keep(self, req, acq);
        r
    }

    async fn cancel(&self, req: &Request<'_>) -> Result<()> {
        take(self, req).cancel().await
    }
}

/// A TCP proxy to one server that can silently stop forwarding (a dead network, not a closed
/// socket): the client hears nothing and the server expires its session or lease after the
/// timeout.
pub(crate) struct Blackhole {
    pub(crate) addr: String,
    pub(crate) cut: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Blackhole {
    pub(crate) async fn to(server: &str) -> Blackhole {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let (server, c) = (server.to_string(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&server).await else {
                    continue;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::spawn(Self::pipe(ri, wo, c.clone()));
                tokio::spawn(Self::pipe(ro, wi, c.clone()));
            }
        });
        Blackhole { addr, cut, task }
    }

    async fn pipe(
        mut r: tokio::net::tcp::OwnedReadHalf,
        mut w: tokio::net::tcp::OwnedWriteHalf,
        cut: Arc<AtomicBool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 16384];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if !cut.load(Ordering::Acquire) && w.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A holder's meta with a published value (an election leader's).
pub(crate) fn meta_value(id: &str, value: &str) -> HolderMeta {
    HolderMeta {
        value: Some(value.into()),
        ..meta(id)
    }
}

/// The value `describe` lists for `owner`'s hold of `name`: `None` when the hold is not listed,
/// `Some(None)` for a hold without a value.
pub(crate) async fn value_of<B: Backend>(b: &B, name: &str, owner: &str) -> Option<Option<String>> {
    let locks = b.describe(name).await.unwrap();
    let lock = locks.into_iter().find(|l| l.name == name)?;
    let holder = lock.holders.into_iter().find(|h| h.owner == owner)?;
    Some(holder.meta.value)
}

/// A hold's value across grant, `describe`, `set_value` by its owner, by another owner and
/// after release; a plain hold lists none. `n` must be a fresh name on `b`. With `regrant`, a
/// repeated attempt of the holder (a fresh acquisition: not for queue stores, whose new
/// acquisition queues behind the owner's own node) keeps the hold and a value (the stored one or
/// the request's, as the store does).
pub(crate) async fn check_values<B: Backend>(b: &B, n: &str, regrant: bool) {
    assert!(b.capabilities().values, "{} keeps values", b.name());
    let lock = name(n);
    let (m1, m2) = (meta_value("c1", "first"), meta_value("c2", "intruder"));
    let r1 = rq(&lock, "owner-1", &m1);
    let r2 = rq(&lock, "owner-2", &m2);
    token(b.acquire(&r1).await.unwrap());
    assert_eq!(value_of(b, n, "owner-1").await, Some(Some("first".into())));

    assert_eq!(
        b.set_value(&hr(&r1), "second").await.unwrap(),
        Released::Released
    );
    assert_eq!(value_of(b, n, "owner-1").await, Some(Some("second".into())));
    // The same value again is still the owner's hold (a store counting changed rows says 0).
    assert_eq!(
        b.set_value(&hr(&r1), "second").await.unwrap(),
        Released::Released
    );
    // Another owner (refused, holding nothing) touches nothing.
    busy(b.acquire(&r2).await.unwrap());
    assert_eq!(
        b.set_value(&hr(&r2), "stolen").await.unwrap(),
        Released::NotHeld
    );
    assert_eq!(value_of(b, n, "owner-1").await, Some(Some("second".into())));
    if regrant {
        token(b.acquire(&r1).await.unwrap());
        let after = value_of(b, n, "owner-1").await;
        assert!(
            after == Some(Some("second".into())) || after == Some(Some("first".into())),
            "{after:?}"
        );
    }

    assert_eq!(b.release(&hr(&r1)).await.unwrap(), Released::Released);
    assert_eq!(
        b.set_value(&hr(&r1), "late").await.unwrap(),
        Released::NotHeld
    );
    assert_eq!(value_of(b, n, "owner-1").await, None);

    // A plain hold has no value; its owner may give it one.
    let plain = meta("c3");
    let r3 = rq(&lock, "owner-3", &plain);
    token(b.acquire(&r3).await.unwrap());
    assert_eq!(value_of(b, n, "owner-3").await, Some(None));
    assert_eq!(
        b.set_value(&hr(&r3), "now").await.unwrap(),
        Released::Released
    );
    assert_eq!(value_of(b, n, "owner-3").await, Some(Some("now".into())));
    assert_eq!(b.release(&hr(&r3)).await.unwrap(), Released::Released);
}
