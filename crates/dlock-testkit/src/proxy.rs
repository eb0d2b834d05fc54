//! A fault-injecting TCP proxy.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;

/// How long connecting to the upstream may take before the accepted client is closed.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);
/// Chunks read but not yet forwarded, per direction, before reading pauses.
const QUEUE: usize = 1024;

/// A TCP proxy on 127.0.0.1 (tokio) in front of one upstream, with faults switchable at run time:
/// a delay on every chunk ([`TcpProxy::set_delay`]), a black hole ([`TcpProxy::black_hole`]) and
/// resets of every connection ([`TcpProxy::reset`]).
///
/// Cheap to share: it is a handle (`Clone`; every method takes `&self`). The proxy runs as tasks
/// on the tokio runtime that called [`TcpProxy::start`]; it stops (stops accepting and closes every
/// connection) on [`TcpProxy::stop`] or when the last handle is dropped.
///
/// Each accepted connection gets its own upstream connection; data is forwarded chunk by chunk
/// (as read, at most 16 KiB), in order, in both directions, and a half-close (EOF) is passed on
/// once everything before it was forwarded. A connection whose upstream refuses is closed at once.
#[derive(Clone)]
pub struct TcpProxy {
    handle: Arc<Handle>,
}

/// Stops the proxy when the last [`TcpProxy`] goes away (the tasks hold only [`Shared`]).
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.stop();
    }
}

struct Shared {
    addr: SocketAddr,
    ctl: Mutex<Ctl>,
    /// Woken when the delay changes (chunks waiting out the old delay re-check it).
    delay_changed: Notify,
    stop: watch::Sender<bool>,
}

struct Ctl {
    delay: Duration,
    black_hole: bool,
    stopped: bool,
    next_id: u64,
    /// The open connections; removing one closes it (its task sees the sender dropped).
    conns: HashMap<u64, Conn>,
}

struct Conn {
    /// It lost bytes to the black hole.
    lost: bool,
    _close: oneshot::Sender<()>,
}

impl Shared {
    fn ctl(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `true` when a chunk of connection `id` is to be dropped (the black hole is on); marks the
    /// connection as having lost bytes.
    fn swallow(&self, id: u64) -> bool {
        let mut ctl = self.ctl();
        if !ctl.black_hole {
            return false;
        }
        if let Some(c) = ctl.conns.get_mut(&id) {
            c.lost = true;
        }
        true
    }

    fn delay(&self) -> Duration {
        self.ctl().delay
    }

    fn stop(&self) {
        let mut ctl = self.ctl();
        ctl.stopped = true;
        ctl.conns.clear();
        drop(ctl);
        self.stop.send_replace(true);
    }
}

impl std::fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ctl = self.shared().ctl();
        f.debug_struct("TcpProxy")
            .field("addr", &self.shared().addr)
            .field("delay", &ctl.delay)
            .field("black_hole", &ctl.black_hole)
            .field("connections", &ctl.conns.len())
            .field("stopped", &ctl.stopped)
            .finish()
    }
}

impl TcpProxy {
    /// Listens on `127.0.0.1:0` and forwards every accepted connection to `upstream`; the accept
    /// loop and the connections run as tasks on the current tokio runtime.
    pub async fn start(upstream: SocketAddr) -> io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| io::Error::other(format!("proxy: cannot listen on 127.0.0.1: {e}")))?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            addr,
            ctl: Mutex::new(Ctl {
                delay: Duration::ZERO,
                black_hole: false,
                stopped: false,
                next_id: 0,
                conns: HashMap::new(),
            }),
            delay_changed: Notify::new(),
            stop,
        });
        tokio::spawn(accept_loop(shared.clone(), listener, upstream, stopped));
        Ok(TcpProxy {
            handle: Arc::new(Handle { shared }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// The address clients connect to (127.0.0.1 and the port the OS chose).
    pub fn addr(&self) -> SocketAddr {
        self.shared().addr
    }

    /// Every chunk, in both directions, is forwarded `d` after it was read (order kept;
    /// `Duration::ZERO` is pass-through). Applies to chunks already waiting, existing connections
    /// and new ones.
    pub fn set_delay(&self, d: Duration) {
        self.shared().ctl().delay = d;
        self.shared().delay_changed.notify_waiters();
    }

    /// On: every byte read in either direction (and every chunk still waiting to be forwarded) is
    /// dropped; connections stay open and new ones are accepted, and black-holed too. Off: every
    /// connection that lost bytes is closed (its stream is no longer coherent); the others, and
    /// new ones, forward normally.
    pub fn black_hole(&self, on: bool) {
        let mut ctl = self.shared().ctl();
        ctl.black_hole = on;
        if !on {
            ctl.conns.retain(|_, c| !c.lost);
        }
    }

    /// Closes every current connection now (both sides; the client sees a reset); returns how
    /// many there were.
    pub fn reset(&self) -> usize {
        let mut ctl = self.shared().ctl();
        let n = ctl.conns.len();
        ctl.conns.clear();
        n
    }

    /// How many connections are open.
    pub fn connections(&self) -> usize {
        self.shared().ctl().conns.len()
    }

    /// Stops accepting (the port is closed) and closes every connection. Also done when the last
    /// handle is dropped.
    pub fn stop(&self) {
        self.shared().stop();
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    upstream: SocketAddr,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = async { let _ = stopped.wait_for(|s| *s).await; } => return,
            r = listener.accept() => r,
        };
        let client = match accepted {
            Ok((c, _)) => c,
            Err(_) => {
                // Out of file descriptors or similar: do not spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let up = match tokio::time::timeout(CONNECT_LIMIT, TcpStream::connect(upstream)).await {
                Ok(Ok(up)) => up,
                _ => return, // dropping `client` closes it
            };
            let _ = client.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let (tx, rx) = oneshot::channel();
            let id = {
                let mut ctl = shared.ctl();
                if ctl.stopped {
                    return;
                }
                let id = ctl.next_id;
                ctl.next_id += 1;
                let lost = ctl.black_hole;
                ctl.conns.insert(id, Conn { lost, _close: tx });
                id
            };
            serve(&shared, id, client, up, rx).await;
            shared.ctl().conns.remove(&id);
        });
    }
}

/// Forwards both directions until both have ended, or until the connection is closed from the
/// proxy (its entry removed): then both sockets are reset.
async fn serve(
    shared: &Shared,
    id: u64,
    client: TcpStream,
    up: TcpStream,
    close: oneshot::Receiver<()>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = up.into_split();
    let closed = tokio::select! {
        _ = close => true,
        _ = async {
            tokio::join!(
                pump(shared, id, &mut cr, &mut uw),
                pump(shared, id, &mut ur, &mut cw)
            )
        } => false,
    };
    if closed {
        // Whole again (a dropped write half would send a FIN first) and with SO_LINGER 0: the
        // close sends only a reset, as a dropped connection would look.
        for (r, w) in [(cr, cw), (ur, uw)] {
            if let Ok(s) = r.reunite(w) {
                let _ = s.set_zero_linger();
            }
        }
    }
}

/// One direction: reads chunks from `r` and writes each to `w` once its delay has passed (or
/// drops it in the black hole); passes EOF on as a write shutdown.
async fn pump(shared: &Shared, id: u64, r: &mut OwnedReadHalf, w: &mut OwnedWriteHalf) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let at = Instant::now();
            if shared.swallow(id) {
                continue;
            }
            if tx.send((at, buf[..n].to_vec())).await.is_err() {
                break; // the writer failed
            }
        }
        // Dropping `tx` tells the writer: EOF after what is queued.
    };
    let writer = async move {
        while let Some((at, chunk)) = rx.recv().await {
            loop {
                let changed = shared.delay_changed.notified();
                let due = at + shared.delay();
                if Instant::now() >= due {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = changed => {}
                }
            }
            if shared.swallow(id) {
                continue;
            }
            if w.write_all(&chunk).await.is_err() {
                return; // dropping `rx` stops the reader
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}
