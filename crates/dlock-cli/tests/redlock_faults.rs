//! Redlock over five real redis-servers on loopback, under faults and next to a Redlock client of
//! another ecosystem (redlock-py, installed by `scripts/test.sh`). Each test starts its own five
//! private servers on free ports (no persistence) and stops them by pid when it ends; keys are
//! checked directly with `redis-cli`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::RedisServer as Server;

fn five() -> Vec<Server> {
    (0..5)
        .map(|_| {
            Server::start(&["--save", "", "--appendonly", "no"]).expect("a private redis-server")
        })
        .collect()
}

fn url(servers: &[Server]) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    format!("redlock://{}", hosts.join(","))
}

fn unique(what: &str) -> String {
    format!("redlock-faults/{what}/{}", uuid::Uuid::new_v4())
}

fn key(name: &str) -> String {
    format!("dlock:{{{name}}}")
}

async fn client(url: &str, lease: Duration) -> dlock::Client {
    dlock::connect_with(url, dlock::ClientOptions::default().lease(lease))
        .await
        .unwrap()
}

/// With 2 of 5 servers stopped a majority is still there: acquire, exclusion and release work.
/// Also measures the acquire + release latency with all five up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_works_with_two_of_five_stopped() {
    let mut s = five();
    let url = url(&s);
    let (a, b) = (
        client(&url, Duration::from_secs(5)).await,
        client(&url, Duration::from_secs(5)).await,
    );
    assert!(!a.capabilities().fencing);
    let name = unique("two-down");
    let m = a.mutex(name.as_str()).unwrap();
    let t = Instant::now();
    const N: u32 = 50;
    for _ in 0..N {
        let g = m.acquire().await.unwrap();
        assert_eq!(g.token(), None, "redlock gives no fencing token");
        g.release().await.unwrap();
    }
    eprintln!(
        "acquire + release with 5 servers: {:?} on average",
        t.elapsed() / N
    );
    s[1].stop();
    s[3].stop();
    let t = Instant::now();
    let g = m.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    eprintln!("acquire with 2 of 5 stopped: {:?}", t.elapsed());
    for srv in [&s[0], &s[2], &s[4]] {
        assert_eq!(srv.cli(&["EXISTS", &key(&name)]), "1");
    }
    let e = b
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(e, dlock::Error::Busy { .. }), "{e:?}");
    g.release().await.unwrap();
    for srv in [&s[0], &s[2], &s[4]] {
        assert_eq!(srv.cli(&["EXISTS", &key(&name)]), "0");
    }
    let g = b
        .mutex(name.as_str())
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// With 3 of 5 stopped nobody can be granted: `acquire_timeout` answers `Timeout` within the
/// wait (no hang beyond it), and no partial hold is left on the two servers still up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_stopped_times_out_cleanly_without_partial_holds() {
    let mut s = five();
    let url = url(&s);
    let a = client(&url, Duration::from_secs(5)).await;
    let name = unique("three-down");
    s[0].stop();
    s[2].stop();
    s[4].stop();
    let wait = Duration::from_millis(1500);
    let t = Instant::now();
    let e = a
        .mutex(name.as_str())
        .unwrap()
        .acquire_timeout(wait)
        .await
        .unwrap_err();
    let took = t.elapsed();
    eprintln!("acquire_timeout({wait:?}) with 3 of 5 stopped: {e} after {took:?}");
    assert!(matches!(e, dlock::Error::Timeout { .. }), "{e:?}");
    assert!(took >= wait, "{took:?}");
    assert!(took < wait + Duration::from_millis(500), "{took:?}");
    for srv in [&s[1], &s[3]] {
        assert_eq!(srv.cli(&["EXISTS", &key(&name)]), "0", "a partial hold");
        assert_eq!(holds(srv), "", "keys left behind");
    }
    let e = a
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(e, dlock::Error::Busy { .. }), "{e:?}");
    for srv in [&s[1], &s[3]] {
        assert_eq!(holds(srv), "", "keys left behind");
    }
}

/// The dlock keys of a server other than the per-server fence counters (which the single-server
/// grant script keeps forever and Redlock ignores): holds and their metadata.
fn holds(srv: &Server) -> String {
    srv.cli(&["KEYS", "dlock:*"])
        .lines()
        .filter(|k| !k.ends_with(":fence"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A holder whose majority goes away (3 of 5 stopped while held) sees `lost()` before its
/// validity ends; once the servers are back (empty), another client takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_sees_lost_when_the_majority_is_lost_and_is_taken_over() {
    let mut s = five();
    let url = url(&s);
    let lease = Duration::from_millis(1500);
    let (a, b) = (client(&url, lease).await, client(&url, lease).await);
    let name = unique("majority-lost");
    let sent = Instant::now();
    let g = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    s[0].stop();
    s[1].stop();
    s[2].stop();
    let stopped = Instant::now();
    tokio::time::timeout(lease, g.lost())
        .await
        .expect("lost() fired within the lease");
    let lost_at = sent.elapsed();
    eprintln!(
        "lost() {lost_at:?} after the acquire was sent ({:?} after the majority stopped)",
        stopped.elapsed()
    );
    assert!(lost_at < lease, "{lost_at:?}");
    assert!(!g.is_held());
    for srv in &mut s[0..3] {
        srv.spawn().expect("redis-server starts again");
    }
    let t = Instant::now();
    let g2 = b
        .mutex(name.as_str())
        .unwrap()
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    eprintln!(
        "taken over {:?} after the servers came back, {:?} after the majority was lost",
        t.elapsed(),
        stopped.elapsed()
    );
    g2.release().await.unwrap();
    drop(g);
}

/// A raw `SET key other NX PX` on a majority of the servers blocks dlock; on a minority it does
/// not (dlock still gets the other three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_set_nx_px_on_a_majority_blocks_dlock() {
    let s = five();
    let url = url(&s);
    let a = client(&url, Duration::from_secs(5)).await;
    let name = unique("raw");
    for srv in &s[0..3] {
        assert_eq!(
            srv.cli(&["SET", &key(&name), "other", "NX", "PX", "1500"]),
            "OK"
        );
    }
    let e = a
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(e, dlock::Error::Busy { .. }), "{e:?}");
    for srv in &s[3..5] {
        assert_eq!(srv.cli(&["EXISTS", &key(&name)]), "0", "a partial hold");
    }
    // Waits until the raw holds expire, then gets it.
    let t = Instant::now();
    let g = a
        .mutex(name.as_str())
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        t.elapsed() > Duration::from_millis(1000),
        "{:?}",
        t.elapsed()
    );
    g.release().await.unwrap();
    // A minority of raw holds does not block.
    let name2 = unique("raw-minority");
    for srv in &s[0..2] {
        srv.cli(&["SET", &key(&name2), "other", "NX", "PX", "5000"]);
    }
    let g = a
        .mutex(name2.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    for srv in &s[0..2] {
        assert_eq!(srv.cli(&["GET", &key(&name2)]), "other", "left alone");
    }
    g.release().await.unwrap();
    for srv in &s[0..2] {
        assert_eq!(srv.cli(&["GET", &key(&name2)]), "other", "left alone");
    }
}

const REDLOCK_PY: &str = r#"
import sys, time
from redlock import Redlock
ports, resource, action = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
dlm = Redlock([{"host": "127.0.0.1", "port": int(p), "db": 0} for p in ports], retry_count=1)
lock = dlm.lock(resource, 4000)
if action == "try":
    print("locked" if lock else "refused")
    if lock:
        dlm.unlock(lock)
else:  # hold: report, then hold until stdin closes
    print("locked" if lock else "refused", flush=True)
    sys.stdin.read()
    if lock:
        dlm.unlock(lock)
"#;

fn ports(s: &[Server]) -> String {
    s.iter()
        .map(|s| s.port.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// redlock-py (PyPI `redlock-py`, the Python Redlock of the redis.io list) on the same five
/// servers and key (`dlock:{name}`): each side excludes the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_py_and_dlock_exclude_each_other() {
    let s = five();
    let url = url(&s);
    let a = client(&url, Duration::from_secs(5)).await;
    let name = unique("redlock-py");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("redlock_py.py");
    std::fs::write(&script, REDLOCK_PY).unwrap();

    // redlock-py holds: dlock is refused.
    let mut py = Command::new("python3")
        .arg(&script)
        .args([&ports(&s), &key(&name), "hold"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with redlock-py (scripts/test.sh installs it)");
    let mut line = String::new();
    {
        use std::io::BufRead;
        let out = py.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
    }
    assert_eq!(line.trim(), "locked", "redlock-py could not lock");
    let e = a
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(e, dlock::Error::Busy { .. }), "{e:?}");
    drop(py.stdin.take());
    assert!(py.wait().unwrap().success());

    // dlock holds: redlock-py is refused; after the release it locks.
    let g = a
        .mutex(name.as_str())
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap();
    let run = || {
        let o = Command::new("python3")
            .arg(&script)
            .args([&ports(&s), &key(&name), "try"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(run(), "refused");
    g.release().await.unwrap();
    assert_eq!(run(), "locked");
}

/// A release that reached every server but the name's lead (where a waiter's repeat attempts go
/// first) leaves a key there until it expires; the waiter must still get the lock from the free
/// majority soon, not when that key runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_left_on_the_lead_server_does_not_keep_a_waiter_out() {
    let s = five();
    let url = url(&s);
    let lease = Duration::from_secs(30);
    let (a, b) = (client(&url, lease).await, client(&url, lease).await);
    let name = unique("stale-lead");
    let held = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let m = b.mutex(name.as_str()).unwrap();
    let waiter = tokio::spawn(async move {
        let g = m.acquire_timeout(Duration::from_secs(20)).await;
        (Instant::now(), g)
    });
    // The waiter is refused; then wake-ups (as a release of another holder would send) make it
    // try again, which it does at the lead server alone, and wait on the lead alone.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lead = dlock::backend::redlock::lead_server(&name, s.len()).unwrap();
    let channel = format!("{}:released", key(&name));
    for _ in 0..3 {
        s[lead].cli(&["PUBLISH", &channel, "released"]);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let (mut freed, mut deleted) = (None, 0);
    for (i, srv) in s.iter().enumerate().filter(|(i, _)| *i != lead) {
        assert_eq!(srv.cli(&["DEL", &key(&name)]), "1", "server {i}");
        deleted += 1;
        if deleted == 3 {
            // A majority (3 of 5) is free from here on.
            freed = Some(Instant::now());
        }
    }
    let freed = freed.unwrap();
    let (at, g) = waiter.await.unwrap();
    let g = g.expect("the waiter never got the lock from the free majority");
    let late = at.saturating_duration_since(freed);
    eprintln!("granted {late:?} after a majority was free");
    assert!(
        late < Duration::from_millis(1500),
        "granted {late:?} after a majority was free"
    );
    assert_eq!(s[lead].cli(&["EXISTS", &key(&name)]), "1");
    g.release().await.unwrap();
    // The first holder's guard is gone from a majority: its release says so.
    assert!(held.release().await.is_err());
}
