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
