//! The fault-injecting proxy against a tiny echo server.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_testkit::TcpProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server on 127.0.0.1; runs until the test's runtime ends.
async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

async fn proxy() -> TcpProxy {
    TcpProxy::start(echo_server().await).await.unwrap()
}

/// Sends `msg` and reads exactly its length back, failing after `within`.
async fn round_trip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Result<Vec<u8>, String> {
    s.write_all(msg).await.map_err(|e| e.to_string())?;
    let mut got = vec![0u8; msg.len()];
    match tokio::time::timeout(within, s.read_exact(&mut got)).await {
        Ok(Ok(_)) => Ok(got),
        Ok(Err(e)) => Err(format!("read failed: {e}")),
        Err(_) => Err("no reply".into()),
    }
}

/// Whether the peer closed `s` (EOF or a reset) within `within`, discarding anything read.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Waits (at most 2 s) until the proxy counts `n` connections.
async fn connections_become(p: &TcpProxy, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while p.connections() != n {
        assert!(
            Instant::now() < deadline,
            "{} connections, expected {n}",
            p.connections()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const SEC: Duration = Duration::from_secs(1);

#[tokio::test]
async fn passes_bytes_through_both_ways() {
    let p = proxy().await;
    assert_eq!(p.addr().ip().to_string(), "127.0.0.1");
    let mut a = TcpStream::connect(p.addr()).await.unwrap();
    let mut b = TcpStream::connect(p.addr()).await.unwrap();
    assert_eq!(round_trip(&mut a, b"hello", SEC).await.unwrap(), b"hello");
    assert_eq!(round_trip(&mut b, b"world", SEC).await.unwrap(), b"world");
    // Larger than one chunk, in order.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(&mut a, &big, 5 * SEC).await.unwrap(), big);
    connections_become(&p, 2).await;
    // A client's close ends its connection (EOF passed on, the upstream closes too).
    drop(a);
    connections_become(&p, 1).await;
}

#[tokio::test]
async fn delays_every_chunk_and_can_be_switched_off() {
    let p = proxy().await;
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    round_trip(&mut s, b"warm", SEC).await.unwrap();
    let d = Duration::from_millis(150);
    p.set_delay(d);
    let t = Instant::now();
    assert_eq!(round_trip(&mut s, b"slow", 5 * SEC).await.unwrap(), b"slow");
    let took = t.elapsed();
    // Delayed once on the way there and once on the way back.
    assert!(took >= 2 * d, "{took:?}");
    assert!(took < 2 * d + SEC, "{took:?}");
    // New connections are delayed too; several chunks keep their order.
    let mut s2 = TcpStream::connect(p.addr()).await.unwrap();
    let t = Instant::now();
    for part in [&b"a"[..], b"b", b"c"] {
        s2.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut got = [0u8; 3];
    tokio::time::timeout(5 * SEC, s2.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"abc");
    assert!(t.elapsed() >= 2 * d, "{:?}", t.elapsed());
    // Back to pass-through, also for a chunk already waiting out a long delay.
    p.set_delay(Duration::from_secs(30));
    s.write_all(b"x").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.set_delay(Duration::ZERO);
    let mut one = [0u8; 1];
    tokio::time::timeout(SEC, s.read_exact(&mut one))
        .await
        .expect("the waiting chunk was released when the delay went to zero")
        .unwrap();
    let t = Instant::now();
    round_trip(&mut s, b"fast", SEC).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn black_hole_drops_bytes_then_closes_what_lost_bytes() {
    let p = proxy().await;
    let mut busy = TcpStream::connect(p.addr()).await.unwrap();
    let mut idle = TcpStream::connect(p.addr()).await.unwrap();
    round_trip(&mut busy, b"before", SEC).await.unwrap();
    round_trip(&mut idle, b"before", SEC).await.unwrap();
    p.black_hole(true);
    assert_eq!(
        round_trip(&mut busy, b"lost", Duration::from_millis(300)).await,
        Err("no reply".into())
    );
    // New connections are accepted, and black-holed too.
    let mut new = TcpStream::connect(p.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut new, b"lost", Duration::from_millis(300)).await,
        Err("no reply".into())
    );
    connections_become(&p, 3).await;
    p.black_hole(false);
    // The connections that lost bytes are closed; the idle one still works.
    assert!(closed_within(&mut busy, SEC).await, "busy not closed");
    assert!(closed_within(&mut new, SEC).await, "new not closed");
    assert_eq!(
        round_trip(&mut idle, b"after", SEC).await.unwrap(),
        b"after"
    );
    let mut fresh = TcpStream::connect(p.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut fresh, b"after", SEC).await.unwrap(),
        b"after"
    );
    connections_become(&p, 2).await;
}

#[tokio::test]
async fn reset_closes_every_connection_and_new_ones_work() {
    let p = proxy().await;
    let mut a = TcpStream::connect(p.addr()).await.unwrap();
    let mut b = TcpStream::connect(p.addr()).await.unwrap();
    round_trip(&mut a, b"1", SEC).await.unwrap();
    round_trip(&mut b, b"2", SEC).await.unwrap();
    assert_eq!(p.reset(), 2);
    assert_eq!(p.connections(), 0);
    // A reset, not an orderly close.
    let mut buf = [0u8; 8];
    let r = tokio::time::timeout(SEC, a.read(&mut buf)).await.unwrap();
    assert_eq!(
        r.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset)
    );
    assert!(closed_within(&mut b, SEC).await);
    let mut c = TcpStream::connect(p.addr()).await.unwrap();
    assert_eq!(round_trip(&mut c, b"3", SEC).await.unwrap(), b"3");
    assert_eq!(p.reset(), 1);
}

#[tokio::test]
async fn stop_and_drop_close_the_port_and_the_connections() {
    let p = proxy().await;
    let addr = p.addr();
    let mut a = TcpStream::connect(addr).await.unwrap();
    round_trip(&mut a, b"1", SEC).await.unwrap();
    let clone = p.clone();
    drop(p); // a clone is still there: still running
    round_trip(&mut a, b"2", SEC).await.unwrap();
    clone.stop();
    assert!(closed_within(&mut a, SEC).await);
    assert_eq!(clone.connections(), 0);
    refused_soon(addr).await;

    let p = proxy().await;
    let addr = p.addr();
    let mut a = TcpStream::connect(addr).await.unwrap();
    round_trip(&mut a, b"1", SEC).await.unwrap();
    drop(p);
    assert!(closed_within(&mut a, SEC).await);
    refused_soon(addr).await;
}

async fn refused_soon(addr: SocketAddr) {
    let deadline = Instant::now() + SEC;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "{addr} still accepts");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_upstream_that_refuses_closes_the_client() {
    let port = dlock_testkit::free_port().unwrap(); // nothing listens there
    let p = TcpProxy::start(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    assert!(closed_within(&mut s, 2 * SEC).await);
    assert_eq!(p.connections(), 0);
}
