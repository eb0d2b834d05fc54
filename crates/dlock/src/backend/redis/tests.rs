//! The Redis store's own tests (the conformance suite covers what every store shares).

use super::keys::{glob_escape, name_of_key};
use super::*;
use crate::backend::test_support::*;
use ::redis::AsyncCommands;
use futures_util::StreamExt;
use std::sync::atomic::{AtomicUsize, Ordering};

fn url() -> String {
    std::env::var("DLOCK_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

async fn backend() -> RedisBackend {
    RedisBackend::connect(&url())
        .await
        .unwrap_or_else(|e| panic!("the test Redis at {} is not reachable: {e}", url()))
}

async fn raw() -> ::redis::aio::MultiplexedConnection {
    raw_at(&url()).await
}

/// A plain connection to the server at `url`.
async fn raw_at(url: &str) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn uniq(tag: &str) -> LockName {
    LockName::new(format!("test/{tag}/{}", uuid::Uuid::new_v4())).unwrap()
}

#[test]
fn glob_escaping_and_key_names() {
    assert_eq!(glob_escape(r"a*b?[c]\d"), r"a\*b\?\[c\]\\d");
    let target = |hashtag| RedisTarget {
        prefix: "p:".into(),
        hashtag,
        ..RedisTarget::parse("redis://h/").unwrap()
    };
    let t = target(true);
    assert_eq!(name_of_key(&t, "p:{a/b}").as_deref(), Some("a/b"));
    assert_eq!(name_of_key(&t, "p:{x}}").as_deref(), Some("x}"));
    assert_eq!(name_of_key(&t, "p:{a}:fence"), None);
    assert_eq!(
        name_of_key(&t, "p:{a}:meta:0b9a3c6e-6b1d-4d3f-9a57-1f2e3d4c5b6a"),
        None
    );
    assert_eq!(name_of_key(&t, "q:{a}"), None);
    assert_eq!(name_of_key(&t, "p:{}"), None);
    // A name that begins with `}` has the NUL as its hash tag (see `Shared::base`).
    assert_eq!(name_of_key(&t, "p:{\0}x}").as_deref(), Some("}x"));
    assert_eq!(name_of_key(&t, "p:{\0}x}:fence"), None);
    assert_eq!(name_of_key(&t, "p:{\0x}"), None);
    assert_eq!(name_of_key(&t, "p:{}x}"), None);
    let f = target(false);
    assert_eq!(name_of_key(&f, "p:jobs").as_deref(), Some("jobs"));
    assert_eq!(name_of_key(&f, "p:jobs:fence"), None);
    assert_eq!(name_of_key(&f, "p:jobs:qseq"), None);
    assert_eq!(
        name_of_key(&f, "p:jobs:meta:0b9a3c6e-6b1d-4d3f-9a57-1f2e3d4c5b6a"),
        None
    );
    assert_eq!(
        name_of_key(&f, "p:jobs:meta:x").as_deref(),
        Some("jobs:meta:x")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_clients_exclude_and_the_hold_is_one_string_with_its_metadata() {
    let (a, b) = (backend().await, backend().await);
    let n = uniq("plain");
    let (ma, mb) = (meta("a"), meta("b"));
    let ra = rq(&n, "owner-a", &ma);
    let rb = rq(&n, "owner-b", &mb);
    let t = token(a.acquire(&ra).await.unwrap());
    let bz = busy(b.acquire(&rb).await.unwrap());
    let left = bz.retry_in.unwrap();
    assert!(left > Duration::from_secs(29) && left <= LONG, "{left:?}");
    // regrant: same token
    assert_eq!(token(a.acquire(&ra).await.unwrap()), t);
    let mut c = raw().await;
    let key = a.base_key(&n);
    assert_eq!(key, format!("dlock:{{{}}}", n.as_str()));
    let ty: String = ::redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(ty, "string");
    // owner \n token \n flag \n acquired_at \n client_id \n host \n pid \n 0 (no value)
    let v: String = c.get(&key).await.unwrap();
    let f: Vec<&str> = v.split('\n').collect();
    assert_eq!(f.len(), 8, "{v:?}");
    assert_eq!(f[..3], ["owner-a", &t.to_string(), "-"], "{v:?}");
    let at: u64 = f[3].parse().unwrap();
    let now = crate::clock::unix_ms();
    assert!(at <= now && at + 10_000 > now, "{at} {now}");
    assert_eq!(
        f[4..],
        [&*ma.client_id, &ma.host, &ma.pid.to_string(), "0"],
        "{v:?}"
    );
    let pttl: i64 = c.pttl(&key).await.unwrap();
    assert!(pttl > 29_000 && pttl <= 30_000, "{pttl}");
    let fence: u64 = c.get(format!("{key}:fence")).await.unwrap();
    assert_eq!(fence, t);
    let meta_exists: bool = c.exists(format!("{key}:meta:owner-a")).await.unwrap();
    assert!(!meta_exists, "a mutex hold has no key beside its own");
    assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::NotHeld);
    assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::Released);
    let exists: bool = c.exists(&key).await.unwrap();
    assert!(!exists);
    assert_eq!(token(b.acquire(&rb).await.unwrap()), t + 1);
    b.release(&hr(&rb)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_set_nx_px_and_dlock_exclude_each_other() {
    let b = backend().await;
    let mut c = raw().await;
    let n = uniq("interop");
    let key = b.base_key(&n);
    let m = meta("a");
    let r = rq(&n, "dlock-owner", &m);
    let set: Option<String> = ::redis::cmd("SET")
        .arg(&key)
        .arg("other")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let bz = busy(b.acquire(&r).await.unwrap());
    assert!(bz.retry_in.unwrap() <= Duration::from_secs(5));
    // describe shows the foreign holder by its token
    let info = b.describe(n.as_str()).await.unwrap();
    assert_eq!(info[0].holders[0].owner, "other");
    assert_eq!(info[0].holders[0].token, None);
    // dlock's release leaves the foreign key alone
    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::NotHeld);
    let v: String = c.get(&key).await.unwrap();
    assert_eq!(v, "other");
    let _: () = c.del(&key).await.unwrap();
    token(b.acquire(&r).await.unwrap());
    let set: Option<String> = ::redis::cmd("SET")
        .arg(&key)
        .arg("other")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(set, None, "SET NX must fail while dlock holds");
    b.release(&hr(&r)).await.unwrap();
    // the value begins with dlock's owner token and a newline (its metadata follows)
    token(b.acquire(&r).await.unwrap());
    let v: String = c.get(&key).await.unwrap();
    assert!(v.starts_with("dlock-owner\n"), "{v:?}");
    b.release(&hr(&r)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn release_of_an_expired_hold_leaves_the_next_holder_alone() {
    let (a, b) = (backend().await, backend().await);
    let n = uniq("expired");
    let (ma, mb) = (meta("a"), meta("b"));
    let ra = Request {
        lease: Duration::from_millis(150),
        ..rq(&n, "old", &ma)
    };
    let rb = rq(&n, "new", &mb);
    let t1 = token(a.acquire(&ra).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t2 = token(b.acquire(&rb).await.unwrap());
    assert!(t2 > t1);
    assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::NotHeld);
    assert_eq!(a.extend(&[hr(&ra)], false).await.unwrap(), [Extended::Gone]);
    let mut c = raw().await;
    assert_eq!(owner_of(&mut c, &b.base_key(&n)).await, "new");
    assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::Released);
}

#[tokio::test(flavor = "multi_thread")]
async fn fence_increases_across_expiry_and_force_release() {
    let b = backend().await;
    let n = uniq("fence");
    let m = meta("a");
    let short = Request {
        lease: Duration::from_millis(120),
        ..rq(&n, "o1", &m)
    };
    let t1 = token(b.acquire(&short).await.unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    let r2 = rq(&n, "o2", &m);
    let t2 = token(b.acquire(&r2).await.unwrap());
    assert!(t2 > t1);
    assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
    assert!(b.describe(n.as_str()).await.unwrap().is_empty());
    let r3 = rq(&n, "o3", &m);
    let t3 = token(b.acquire(&r3).await.unwrap());
    assert!(t3 > t2);
    assert_eq!(b.release(&hr(&r2)).await.unwrap(), Released::NotHeld);
    // rwlock and semaphore share the counter of the name
    b.release(&hr(&r3)).await.unwrap();
    let rw = Request {
        kind: LockKind::RwLock,
        mode: Mode::Shared,
        ..rq(&n, "o4", &m)
    };
    let t4 = token(b.acquire(&rw).await.unwrap());
    assert!(t4 > t3);
    assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
    let mut c = raw().await;
    let key = b.base_key(&n);
    let fence: u64 = c.get(format!("{key}:fence")).await.unwrap();
    assert_eq!(fence, t4);
    let ttl: i64 = c.pttl(format!("{key}:fence")).await.unwrap();
    assert_eq!(ttl, -1, "the fence never expires");
    let _: () = c.del(format!("{key}:fence")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn extend_of_mixed_live_and_gone_holds_in_one_call() {
    let b = backend().await;
    let m = meta("a");
    let (n1, n2, n3, n4) = (uniq("x1"), uniq("x2"), uniq("x3"), uniq("x4"));
    let live = rq(&n1, "live", &m);
    let dead = Request {
        lease: Duration::from_millis(100),
        ..rq(&n2, "dead", &m)
    };
    let reader = Request {
        kind: LockKind::RwLock,
        mode: Mode::Shared,
        ..rq(&n3, "reader", &m)
    };
    let permit = Request {
        kind: LockKind::Semaphore { permits: 2 },
        mode: Mode::Shared,
        ..rq(&n4, "permit", &m)
    };
    for r in [&live, &dead, &reader, &permit] {
        token(b.acquire(r).await.unwrap());
    }
    b.release(&hr(&permit)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let longer = Duration::from_secs(60);
    let holds: Vec<HoldRef<'_>> = [&live, &dead, &reader, &permit]
        .iter()
        .map(|r| HoldRef {
            lease: longer,
            ..hr(r)
        })
        .collect();
    let out = b.extend(&holds, false).await.unwrap();
    let held = Extended::Held { valid_for: longer };
    assert_eq!(out, [held.clone(), Extended::Gone, held, Extended::Gone]);
    let mut c = raw().await;
    let pttl: i64 = c.pttl(b.base_key(&n1)).await.unwrap();
    assert!(pttl > 59_000, "{pttl}");
    let pttl: i64 = c.pttl(b.base_key(&n3)).await.unwrap();
    assert!(pttl > 59_000, "{pttl}");
    for r in [&live, &reader] {
        assert_eq!(b.release(&hr(r)).await.unwrap(), Released::Released);
    }
    assert!(b.extend(&[], false).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn fair_waiters_are_granted_in_arrival_order_across_clients() {
    let (a, b) = (backend().await, backend().await);
    let n = uniq("fair");
    let (ma, mb) = (meta("a"), meta("b"));
    let h = rq(&n, "holder", &ma);
    token(a.acquire(&h).await.unwrap());
    let w1 = Request {
        fair: true,
        waiting: true,
        ..rq(&n, "w1", &mb)
    };
    let w2 = Request {
        fair: true,
        waiting: true,
        ..rq(&n, "w2", &ma)
    };
    busy(b.acquire(&w1).await.unwrap());
    busy(a.acquire(&w2).await.unwrap());
    let info = a.describe(n.as_str()).await.unwrap();
    let order: Vec<&str> = info[0].waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["w1", "w2"]);
    assert_eq!(info[0].waiters[0].meta, mb);
    a.release(&hr(&h)).await.unwrap();
    // w2 is behind w1; a plain request does not barge past the queue. With only waiters in the
    // way, both look again a lease from now (when w1's hold would end if its holder died).
    assert_eq!(busy(a.acquire(&w2).await.unwrap()).retry_in, Some(w2.lease));
    let plain = rq(&n, "plain", &mb);
    assert_eq!(
        busy(b.acquire(&plain).await.unwrap()).retry_in,
        Some(plain.lease)
    );
    token(b.acquire(&w1).await.unwrap());
    b.release(&hr(&w1)).await.unwrap();
    token(a.acquire(&w2).await.unwrap());
    // cancel removes a place
    let w3 = Request {
        fair: true,
        waiting: true,
        ..rq(&n, "w3", &mb)
    };
    busy(b.acquire(&w3).await.unwrap());
    b.cancel(&w3).await.unwrap();
    a.release(&hr(&w2)).await.unwrap();
    token(b.acquire(&plain).await.unwrap());
    b.release(&hr(&plain)).await.unwrap();
    let mut c = raw().await;
    let q: bool = c.exists(format!("{}:q", b.base_key(&n))).await.unwrap();
    assert!(!q, "an empty queue leaves no key");
}

#[tokio::test(flavor = "multi_thread")]
async fn rwlock_and_semaphore_rules() {
    let (a, b) = (backend().await, backend().await);
    let m = meta("a");
    let n = uniq("rw");
    let rd = |o: &'static str| Request {
        kind: LockKind::RwLock,
        mode: Mode::Shared,
        waiting: true,
        ..rq(&n, o, &m)
    };
    let (r1, r2) = (rd("r1"), rd("r2"));
    token(a.acquire(&r1).await.unwrap());
    token(b.acquire(&r2).await.unwrap());
    let w = Request {
        mode: Mode::Exclusive,
        ..rd("w")
    };
    busy(a.acquire(&w).await.unwrap());
    // a waiting writer blocks new readers, even when not fair
    busy(b.acquire(&rd("r3")).await.unwrap());
    // a mutex on an rwlock name is a configuration error
    let e = a.acquire(&rq(&n, "mx", &m)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(e.to_string().contains("held as rwlock"), "{e}");
    a.release(&hr(&r1)).await.unwrap();
    b.release(&hr(&r2)).await.unwrap();
    token(a.acquire(&w).await.unwrap());
    a.release(&hr(&w)).await.unwrap();

    let s = uniq("sem");
    let k = LockKind::Semaphore { permits: 2 };
    let p = |o: &'static str, lease| Request {
        kind: k,
        mode: Mode::Shared,
        lease,
        ..rq(&s, o, &m)
    };
    let dying = p("dying", Duration::from_millis(300));
    token(a.acquire(&dying).await.unwrap());
    token(b.acquire(&p("p2", LONG)).await.unwrap());
    let third = p("p3", LONG);
    let bz = busy(a.acquire(&third).await.unwrap());
    assert!(bz.retry_in.unwrap() <= Duration::from_millis(300));
    let e = a
        .acquire(&Request {
            kind: LockKind::Semaphore { permits: 3 },
            ..p("p4", LONG)
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("semaphore(2)"), "{e}");
    let e = a.acquire(&rq(&s, "mx", &m)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    // the dead holder's permit expires by itself
    tokio::time::sleep(Duration::from_millis(400)).await;
    token(a.acquire(&third).await.unwrap());
    let info = a.describe(s.as_str()).await.unwrap();
    assert_eq!(info[0].kind, k);
    let owners: Vec<&str> = info[0].holders.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(owners, ["p2", "p3"]);
    assert_eq!(a.release(&hr(&dying)).await.unwrap(), Released::NotHeld);
    assert_eq!(a.force_release(&s, Force::Break).await.unwrap().removed, 2);
    // an rwlock request on a mutex name
    let mx = uniq("mx");
    token(a.acquire(&rq(&mx, "m", &m)).await.unwrap());
    let e = b
        .acquire(&Request {
            kind: LockKind::RwLock,
            ..rq(&mx, "x", &m)
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("held as mutex"), "{e}");
    a.force_release(&mx, Force::Break).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn no_wakeup_is_lost_in_quick_hand_offs() {
    let (c1, c2) = (
        crate::connect(&url()).await.unwrap(),
        crate::connect(&url()).await.unwrap(),
    );
    let name = uniq("handoff").as_str().to_owned();
    let inside = Arc::new(AtomicUsize::new(0));
    let rounds = 60;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in [c1, c2] {
        let (name, inside) = (name.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let mx = c.mutex(name).unwrap().lease(LONG);
            let mut slowest = Duration::ZERO;
            for _ in 0..rounds {
                let t = Instant::now();
                let g = mx.acquire_timeout(Duration::from_secs(20)).await.unwrap();
                slowest = slowest.max(t.elapsed());
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
            slowest
        }));
    }
    for t in tasks {
        let slowest = t.await.unwrap();
        assert!(
            slowest < Duration::from_secs(2),
            "a waiter took {slowest:?}"
        );
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_is_woken_by_a_release_on_another_connection() {
    let (a, b) = (backend().await, backend().await);
    let n = uniq("wake");
    let (ma, mb) = (meta("a"), meta("b"));
    for round in 0..5 {
        let (ho, wo) = (format!("h{round}"), format!("w{round}"));
        let h = rq(&n, &ho, &ma);
        token(a.acquire(&h).await.unwrap());
        let w = Request {
            waiting: true,
            ..rq(&n, &wo, &mb)
        };
        let mut bz = busy(b.acquire(&w).await.unwrap());
        if round == 0 {
            // the first wait of a name subscribes and returns at once
            let t = Instant::now();
            b.wait(&w, &bz, Instant::now() + Duration::from_secs(10))
                .await
                .unwrap();
            assert!(t.elapsed() < Duration::from_secs(1));
            bz = busy(b.acquire(&w).await.unwrap());
        }
        let released = Arc::new(StdMutex::new(None));
        let rel = {
            let released = released.clone();
            let a_ref = &a;
            let h = hr(&h);
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                *lock(&released) = Some(Instant::now());
                a_ref.release(&h).await.unwrap();
            }
        };
        let waited = async {
            b.wait(&w, &bz, Instant::now() + Duration::from_secs(10))
                .await
                .unwrap();
            Instant::now()
        };
        let (woke, ()) = tokio::join!(waited, rel);
        let released_at = lock(&released).unwrap();
        let after = woke.saturating_duration_since(released_at);
        assert!(
            after < Duration::from_millis(200),
            "round {round}: {after:?}"
        );
        token(b.acquire(&w).await.unwrap());
        b.release(&hr(&w)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_scans_with_glob_characters_in_the_prefix() {
    let b = backend().await;
    let m = meta("describer");
    let root = format!("g-{}/", uuid::Uuid::new_v4());
    let names: Vec<LockName> = ["a*b", "a?c", "axb", "a[x]", "a\\d"]
        .iter()
        .map(|s| LockName::new(format!("{root}{s}")).unwrap())
        .collect();
    let owners: Vec<String> = (0..names.len()).map(|i| format!("o{i}")).collect();
    for (n, o) in names.iter().zip(&owners) {
        token(b.acquire(&rq(n, o, &m)).await.unwrap());
    }
    let got = |p: String| {
        let b = &b;
        async move {
            b.describe(&p)
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.name)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(got(format!("{root}a*")).await, [format!("{root}a*b")]);
    assert_eq!(got(format!("{root}a?")).await, [format!("{root}a?c")]);
    assert_eq!(got(format!("{root}a[")).await, [format!("{root}a[x]")]);
    assert_eq!(got(format!("{root}a\\")).await, [format!("{root}a\\d")]);
    assert_eq!(got(format!("{root}a")).await.len(), 5);
    assert!(got(format!("{root}zzz")).await.is_empty());
    let info = b.describe(&format!("{root}axb")).await.unwrap();
    let h = &info[0].holders[0];
    assert_eq!(h.owner, "o2");
    assert_eq!(h.meta, m);
    assert_eq!(h.mode, Mode::Exclusive);
    assert!(h.token.is_some());
    assert!(h.acquired_at_ms > 1_600_000_000_000);
    assert!(h.lease_left_ms.unwrap() > 29_000);
    for n in &names {
        b.force_release(n, Force::Break).await.unwrap();
    }
    assert!(got(root).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn hashtag_false_uses_names_verbatim() {
    let b = RedisBackend::connect(&format!(
        "{}?hashtag=false&prefix=dlt-{}:",
        url(),
        uuid::Uuid::new_v4()
    ))
    .await
    .unwrap();
    let n = LockName::new("jobs").unwrap();
    let key = b.base_key(&n);
    assert!(key.ends_with(":jobs") && !key.contains('{'), "{key}");
    let m = meta("a");
    let r = rq(&n, "o", &m);
    token(b.acquire(&r).await.unwrap());
    let mut c = raw().await;
    assert_eq!(owner_of(&mut c, &key).await, "o");
    let info = b.describe("").await.unwrap();
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0].name, "jobs");
    b.force_release(&n, Force::Break).await.unwrap();
    let _: () = c.del(format!("{key}:fence")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_key_is_not_a_lock() {
    let b = backend().await;
    let n = uniq("foreign");
    let mut c = raw().await;
    let key = b.base_key(&n);
    let _: () = c.rpush(&key, "x").await.unwrap();
    let m = meta("a");
    let e = b.acquire(&rq(&n, "o", &m)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(b.force_release(&n, Force::Break).await.is_err());
    let len: usize = c.llen(&key).await.unwrap();
    assert_eq!(len, 1);
    let _: () = c.del(&key).await.unwrap();
}

/// A private `redis-server` on a free loopback port, killed when dropped.
struct Server {
    child: std::process::Child,
    port: u16,
}

impl Server {
    async fn start(extra: &[&str]) -> Server {
        let port = free_port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Server { child, port }
    }

    fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread")]
async fn server_down_at_connect_is_unavailable_quickly() {
    let port = free_port();
    let t = Instant::now();
    let e = RedisBackend::connect(&format!("redis://127.0.0.1:{port}/?connect_timeout=1s"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    let e = crate::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_server_gives_unavailable_not_a_hang() {
    let srv = Server::start(&[]).await;
    let b = RedisBackend::connect(&format!(
        "redis://127.0.0.1:{}/?timeout=300ms&connect_timeout=300ms",
        srv.port
    ))
    .await
    .unwrap();
    let n = uniq("paused");
    let m = meta("a");
    let r = rq(&n, "o", &m);
    token(b.acquire(&r).await.unwrap());
    srv.signal("-STOP");
    let t = Instant::now();
    let e = b.acquire(&r).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    let e = b.extend(&[hr(&r)], false).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    let e = b.describe("").await.unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    let w = Request {
        waiting: true,
        ..rq(&n, "w", &m)
    };
    b.wait(
        &w,
        &Busy::default(),
        Instant::now() + Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    srv.signal("-CONT");
    // the connection recovers
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match b.acquire(&r).await {
            Ok(a) => {
                token(a);
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no recovery: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_password_is_a_clear_error_without_the_password() {
    let srv = Server::start(&["--requirepass", "right-horse-battery"]).await;
    for url in [
        format!("redis://:wrong-staple-42@127.0.0.1:{}/", srv.port),
        format!("redis://default:wrong-staple-42@127.0.0.1:{}/", srv.port),
        format!("redis://127.0.0.1:{}/", srv.port),
    ] {
        let e = crate::connect(&url).await.unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidConfig(_)), "{url}: {e:?}");
        assert!(msg.contains("authentication failed"), "{msg}");
        assert!(!msg.contains("wrong-staple-42"), "{msg}");
        assert!(!format!("{e:?}").contains("wrong-staple-42"), "{e:?}");
    }
    let b = RedisBackend::connect(&format!(
        "redis://:right-horse-battery@127.0.0.1:{}/3",
        srv.port
    ))
    .await
    .unwrap();
    let n = uniq("auth");
    let m = meta("a");
    token(b.acquire(&rq(&n, "o", &m)).await.unwrap());
    assert!(!format!("{b:?}").contains("right-horse-battery"));
}

/// Through clients: the first grants of a name count from 1, and once every hold is
/// released only the fence keys are left (what the conformance suite cannot see: the store's
/// own keys).
#[tokio::test(flavor = "multi_thread")]
async fn a_name_counts_from_one_and_leaves_only_its_fence() {
    let prefix = format!("e2e-{}:", uuid::Uuid::new_v4());
    let u = format!("{}?prefix={prefix}", url());
    let c1 = crate::connect(&u).await.unwrap();
    let c2 = crate::connect(&u).await.unwrap();
    assert_eq!(c1.backend_name(), "redis");
    let g = c1.mutex("e2e/job").unwrap().acquire().await.unwrap();
    assert_eq!(g.token(), Some(1));
    g.release().await.unwrap();
    let g = c2.mutex("e2e/job").unwrap().acquire().await.unwrap();
    assert_eq!(g.token(), Some(2));
    g.release().await.unwrap();
    let sem = c1.semaphore("e2e/sem", 2).unwrap();
    let (g1, g2) = (sem.acquire().await.unwrap(), sem.acquire().await.unwrap());
    g1.release().await.unwrap();
    g2.release().await.unwrap();
    assert!(c1.list("").await.unwrap().is_empty());
    let mut c = raw().await;
    let keys: Vec<String> = c.keys(format!("{prefix}*")).await.unwrap();
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("{prefix}{{e2e/job}}:fence"),
            format!("{prefix}{{e2e/sem}}:fence")
        ],
        "only the fences stay"
    );
    let _: () = c.del(&keys).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn set_value_replaces_the_holders_value_only() {
    let b = backend().await;
    check_values(&b, uniq("values").as_str(), true).await;
    // A mutex's value is the last field of its hold's string ('1' and the value; '0' for
    // none), and a new value keeps the hold's expiry.
    let n = uniq("values-raw");
    let (mv, mp) = (meta_value("v", "lead\ner"), meta("p"));
    let key = b.base_key(&n);
    let mut c = raw().await;
    let rv = rq(&n, "with-value", &mv);
    token(b.acquire(&rv).await.unwrap());
    let v: String = c.get(&key).await.unwrap();
    assert!(v.ends_with("\n1lead\ner"), "{v:?}");
    assert_eq!(
        b.set_value(&hr(&rv), "next").await.unwrap(),
        Released::Released
    );
    let v2: String = c.get(&key).await.unwrap();
    assert_eq!(v2, [v.strip_suffix("lead\ner").unwrap(), "next"].concat());
    let pttl: i64 = c.pttl(&key).await.unwrap();
    assert!(pttl > 29_000 && pttl <= 30_000, "{pttl}");
    b.release(&hr(&rv)).await.unwrap();
    let rp = rq(&n, "plain", &mp);
    token(b.acquire(&rp).await.unwrap());
    let v: String = c.get(&key).await.unwrap();
    assert!(v.ends_with("\n0"), "a plain hold writes no value: {v:?}");
    // A revoked hold is nobody's: no new value.
    b.force_release(&n, Force::Revoke).await.unwrap();
    assert_eq!(
        b.set_value(&hr(&rp), "late").await.unwrap(),
        Released::NotHeld
    );
    assert_eq!(value_of(&b, n.as_str(), "plain").await, Some(None));
    b.release(&hr(&rp)).await.unwrap();
    // Readers of a rwlock (the hash layout): each its own value.
    let rw = uniq("values-rw");
    let (m1, m2) = (meta_value("r1", "one"), meta("r2"));
    let shared = |owner, m| Request {
        kind: LockKind::RwLock,
        mode: Mode::Shared,
        ..rq(&rw, owner, m)
    };
    let (r1, r2) = (shared("reader-1", &m1), shared("reader-2", &m2));
    token(b.acquire(&r1).await.unwrap());
    token(b.acquire(&r2).await.unwrap());
    assert_eq!(
        b.set_value(&hr(&r2), "two").await.unwrap(),
        Released::Released
    );
    assert_eq!(
        value_of(&b, rw.as_str(), "reader-1").await,
        Some(Some("one".into()))
    );
    assert_eq!(
        value_of(&b, rw.as_str(), "reader-2").await,
        Some(Some("two".into()))
    );
    assert_eq!(b.release(&hr(&r2)).await.unwrap(), Released::Released);
    assert_eq!(
        b.set_value(&hr(&r2), "gone").await.unwrap(),
        Released::NotHeld
    );
    b.release(&hr(&r1)).await.unwrap();
}

/// With `replicas=N`, a new value that fewer replicas confirm is an error (the test server has
/// no replicas); a refused one is just not held.
#[tokio::test(flavor = "multi_thread")]
async fn set_value_waits_for_replicas() {
    let b = backend().await;
    let sep = if url().contains('?') { '&' } else { '?' };
    let strict = RedisBackend::connect(&format!("{}{sep}replicas=1&replicas_timeout=50ms", url()))
        .await
        .unwrap();
    let n = uniq("values-wait");
    let m = meta_value("v", "first");
    let r = rq(&n, "owner", &m);
    token(b.acquire(&r).await.unwrap());
    let e = strict.set_value(&hr(&r), "second").await.unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    assert!(e.to_string().contains("confirmed by 0 of the 1"), "{e}");
    let other = rq(&n, "other", &m);
    assert_eq!(
        strict.set_value(&hr(&other), "x").await.unwrap(),
        Released::NotHeld
    );
    b.release(&hr(&r)).await.unwrap();
}

/// The owner token of the mutex hold at `base` (the first line of its value).
async fn owner_of(r: &mut ::redis::aio::MultiplexedConnection, base: &str) -> String {
    let v: String = r.get(base).await.unwrap();
    v.split('\n').next().unwrap_or_default().to_owned()
}

/// A grant; panics on busy.
fn grant(a: Attempt) -> Grant {
    match a {
        Attempt::Granted(g) => g,
        Attempt::Busy(b) => panic!("expected a grant, got busy {b:?}"),
    }
}

/// A waiting request of `owner`, registered for hand-offs and subscribed: busy, waited once
/// (the first wait of a name subscribes and returns at once), busy again.
async fn registered_waiter(b: &RedisBackend, w: &Request<'_>) -> Busy {
    let bz = busy(b.acquire(w).await.unwrap());
    b.wait(w, &bz, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    busy(b.acquire(w).await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_hands_the_mutex_to_its_first_waiter_only() {
    let (a, b, c) = (backend().await, backend().await, backend().await);
    hands_to_the_first_waiter_only(&url(), a, b, c, 3).await;
}

/// A server that answers `HELLO` as one before Redis 6 did (an unknown command): the pub/sub
/// connection falls back to RESP2, and hand-offs and announcements reach their waiters as over
/// RESP3.
#[tokio::test(flavor = "multi_thread")]
async fn without_resp3_the_pubsub_connection_is_resp2() {
    let srv = Server::start(&["--rename-command", "HELLO", ""]).await;
    let u = format!("redis://127.0.0.1:{}/", srv.port);
    let connect = || async { RedisBackend::connect(&u).await.unwrap() };
    let (a, b, c) = (connect().await, connect().await, connect().await);
    hands_to_the_first_waiter_only(&u, a, b, c, 2).await;
}

/// The server closes the pub/sub connection of a waiting client: its waiters are woken, the next
/// wait opens a new connection, and a hand-off still reaches the waiter.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_pubsub_connection_is_opened_again_for_the_next_hand_off() {
    link_lost_and_opened_again(&[], 3).await;
}

/// The same over RESP2 (a server without `HELLO`).
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_resp2_pubsub_connection_is_opened_again() {
    link_lost_and_opened_again(&["--rename-command", "HELLO", ""], 2).await;
}

/// A waiter of a server started with `args`, whose pub/sub connection speaks RESP `resp`.
async fn link_lost_and_opened_again(args: &[&str], resp: u8) {
    let srv = Server::start(args).await;
    let u = format!("redis://127.0.0.1:{}/", srv.port);
    let (a, b) = (
        RedisBackend::connect(&u).await.unwrap(),
        RedisBackend::connect(&u).await.unwrap(),
    );
    let n = uniq("link-lost");
    let (ma, mb) = (meta("a"), meta("b"));
    let h = rq(&n, "holder", &ma);
    token(a.acquire(&h).await.unwrap());
    let w = Request {
        waiting: true,
        ..rq(&n, "waiter", &mb)
    };
    registered_waiter(&b, &w).await;
    assert_eq!(b.shared.link_resp().await, Some(resp));
    let mut r = raw_at(&u).await;
    let killed: i64 = ::redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let deadline = Instant::now() + Duration::from_secs(2);
    while b.shared.link_resp().await.is_some() {
        assert!(
            Instant::now() < deadline,
            "the lost connection was not noticed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let bz = registered_waiter(&b, &w).await;
    assert_eq!(b.shared.link_resp().await, Some(resp));
    let took = handed_while_waiting(&a, &h, &b, &w, &bz).await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    token(b.acquire(&w).await.unwrap());
}

/// `waiter`'s wait for request `w` (last answered `bz`) while `holder` releases its hold of
/// request `h` 50 ms in: the release hands the lock on and the wait ends. Returns how long the
/// wait took.
async fn handed_while_waiting(
    holder: &RedisBackend,
    h: &Request<'_>,
    waiter: &RedisBackend,
    w: &Request<'_>,
    bz: &Busy,
) -> Duration {
    let started = Instant::now();
    let waits = waiter.wait(w, bz, Instant::now() + Duration::from_secs(5));
    let releases = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        holder.release(&hr(h)).await.unwrap()
    };
    let (waited, released) = tokio::join!(waits, releases);
    waited.unwrap();
    assert_eq!(released, Released::HandedOff);
    started.elapsed()
}

/// Three clients of the server at `url`: `a` holds, `b` and `c` wait in that order; `b` and `c`
/// listen over RESP `resp` (2 or 3).
async fn hands_to_the_first_waiter_only(
    url: &str,
    a: RedisBackend,
    b: RedisBackend,
    c: RedisBackend,
    resp: u8,
) {
    let n = uniq("handoff-order");
    let base = a.base_key(&n);
    let (ma, mb, mc) = (meta("a"), meta("b"), meta("c"));
    let h = rq(&n, "holder", &ma);
    let t0 = token(a.acquire(&h).await.unwrap());
    let wb = Request {
        waiting: true,
        ..rq(&n, "first", &mb)
    };
    let wc = Request {
        waiting: true,
        ..rq(&n, "second", &mc)
    };
    let bzb = registered_waiter(&b, &wb).await;
    let bzc = registered_waiter(&c, &wc).await;
    assert_eq!(b.shared.link_resp().await, Some(resp));
    assert_eq!(c.shared.link_resp().await, Some(resp));
    // Nobody else is woken: the broadcast channel stays quiet.
    let client = ::redis::Client::open(url).unwrap();
    let mut ps = client.get_async_pubsub().await.unwrap();
    ps.subscribe(format!("{base}:released")).await.unwrap();
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    let mut r = raw_at(url).await;
    let holder = owner_of(&mut r, &base).await;
    assert_eq!(holder, "first", "handed to the first registered waiter");
    b.wait(&wb, &bzb, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let g = grant(b.acquire(&wb).await.unwrap());
    let t1 = g.token.unwrap();
    assert!(t1 > t0, "{t1} > {t0}");
    // Taken from the message, without a round trip: the lease counts from the busy attempt.
    assert!(g.valid_for < LONG, "{:?}", g.valid_for);
    // The second waiter is still waiting; its wait ends with the next hand-off.
    handed_while_waiting(&b, &wb, &c, &wc, &bzc).await;
    let t2 = token(c.acquire(&wc).await.unwrap());
    assert!(t2 > t1);
    let quiet = tokio::time::timeout(Duration::from_millis(300), ps.on_message().next()).await;
    assert!(quiet.is_err(), "a hand-off woke everybody: {quiet:?}");
    // Nobody waits any more: a plain release, and the waiter set is gone.
    assert_eq!(c.release(&hr(&wc)).await.unwrap(), Released::Released);
    let w: bool = r.exists(format!("{base}:w")).await.unwrap();
    assert!(!w, "the waiter set outlived its waiters");
    // Nobody waits or observes: the release sends nothing.
    let quiet = tokio::time::timeout(Duration::from_millis(300), ps.on_message().next()).await;
    assert!(quiet.is_err(), "a release that nobody waits for: {quiet:?}");
    // An observer's mark: a release is announced to it.
    let _: () = r.set_ex(format!("{base}:obs"), "1", 30).await.unwrap();
    token(c.acquire(&wc).await.unwrap());
    assert_eq!(c.release(&hr(&wc)).await.unwrap(), Released::Released);
    let announced = tokio::time::timeout(Duration::from_secs(2), ps.on_message().next()).await;
    assert!(matches!(announced, Ok(Some(_))), "{announced:?}");
    let _: () = r.del(format!("{base}:obs")).await.unwrap();
}

/// An observer (an election's follower) that does not campaign learns of a resignation nobody
/// waited for at once, not at its next look.
#[tokio::test(flavor = "multi_thread")]
async fn an_observer_learns_of_a_release_nobody_waited_for() {
    let client = |b: RedisBackend| {
        crate::Client::with_backend(Arc::new(b), url(), crate::ClientOptions::default()).unwrap()
    };
    let (c1, c2) = (client(backend().await), client(backend().await));
    let name = uniq("observed").as_str().to_owned();
    let e1 = c1.election(&name).unwrap().lease(LONG);
    let mut observer = c2.election(&name).unwrap().observe();
    assert!(observer.next().await.unwrap().is_none());
    let leader = e1.campaign("one").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(2), observer.next())
        .await
        .expect("the observer sees the leader")
        .unwrap();
    assert!(seen.is_some());
    let started = Instant::now();
    let next = tokio::spawn(async move { observer.next().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    leader.resign().await.unwrap();
    let after = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the observer looked again")
        .unwrap()
        .unwrap();
    assert!(after.is_none(), "{after:?}");
    // Its own look comes every 5 s (and the lease is long): only the announcement is sooner.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the observer learnt of the resignation after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_whose_client_is_gone_is_skipped() {
    let (a, b) = (backend().await, backend().await);
    let n = uniq("handoff-gone");
    let base = a.base_key(&n);
    let (ma, mb) = (meta("a"), meta("b"));
    let mut r = raw().await;
    // Only a record whose client listens nowhere: the release frees the lock.
    let ghost = "ghost\n30000\nnobody-listens\nclient\nhost\n1\n0";
    let h = rq(&n, "holder", &ma);
    token(a.acquire(&h).await.unwrap());
    let _: () = r.zadd(format!("{base}:w"), ghost, 0).await.unwrap();
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
    let free: bool = r.exists(&base).await.unwrap();
    assert!(!free, "handed to a client that is gone");
    // A ghost ahead of a live waiter: the live one gets it.
    token(a.acquire(&h).await.unwrap());
    let w = Request {
        waiting: true,
        ..rq(&n, "live", &mb)
    };
    registered_waiter(&b, &w).await;
    let _: () = r.zadd(format!("{base}:w"), ghost, -1).await.unwrap();
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    let holder = owner_of(&mut r, &base).await;
    assert_eq!(holder, "live");
    b.release(&hr(&w)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_that_gives_up_after_the_hand_off_passes_it_on() {
    let (a, b, c) = (backend().await, backend().await, backend().await);
    let n = uniq("handoff-cancel");
    let base = a.base_key(&n);
    let (ma, mb, mc) = (meta("a"), meta("b"), meta("c"));
    let h = rq(&n, "holder", &ma);
    token(a.acquire(&h).await.unwrap());
    let wb = Request {
        waiting: true,
        ..rq(&n, "quitter", &mb)
    };
    let wc = Request {
        waiting: true,
        ..rq(&n, "stayer", &mc)
    };
    registered_waiter(&b, &wb).await;
    registered_waiter(&c, &wc).await;
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    let mut r = raw().await;
    let holder = owner_of(&mut r, &base).await;
    assert_eq!(holder, "quitter");
    // It gives up instead of taking it: the lock goes on to the next waiter.
    b.cancel(&wb).await.unwrap();
    let holder = owner_of(&mut r, &base).await;
    assert_eq!(holder, "stayer");
    token(c.acquire(&wc).await.unwrap());
    assert_eq!(c.release(&hr(&wc)).await.unwrap(), Released::Released);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wait_dropped_while_the_pubsub_connection_opens_does_not_delay_the_next() {
    let a = backend().await;
    // b talks to Redis through a proxy that can stop forwarding: its pub/sub connection then
    // hangs while it opens.
    let server = url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = Blackhole::to(&server).await;
    let b = RedisBackend::connect(&format!("redis://{}/", proxy.addr))
        .await
        .unwrap();
    let n = uniq("dropped-open");
    let (ma, mb) = (meta("a"), meta("b"));
    let h = rq(&n, "holder", &ma);
    token(a.acquire(&h).await.unwrap());
    let w = Request {
        waiting: true,
        ..rq(&n, "waiter", &mb)
    };
    let bz = busy(b.acquire(&w).await.unwrap());
    // The first wait opens b's pub/sub connection, which hangs; its caller gives up (as a
    // waiter woken by a release in its own process does).
    proxy.cut.store(true, Ordering::SeqCst);
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        b.wait(&w, &bz, Instant::now() + Duration::from_secs(5)),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the wait was meant to be dropped half-way"
    );
    proxy.cut.store(false, Ordering::SeqCst);
    // The next wait opens the connection at once instead of polling for a second.
    let t = Instant::now();
    b.wait(&w, &bz, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(400) && b.is_subscribed(n.as_str()),
        "took {:?}, subscribed: {}",
        t.elapsed(),
        b.is_subscribed(n.as_str())
    );
    b.cancel(&w).await.unwrap();
    a.release(&hr(&h)).await.unwrap();
}

/// Resets the server's command statistics (`CONFIG RESETSTAT`).
async fn reset_stats(r: &mut ::redis::aio::MultiplexedConnection) {
    let _: () = ::redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(r)
        .await
        .unwrap();
}

/// How often the server ran `cmd` since its statistics were reset (`INFO commandstats`).
async fn calls_of(r: &mut ::redis::aio::MultiplexedConnection, cmd: &str) -> u64 {
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(r)
        .await
        .unwrap();
    let head = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&head))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A busy attempt of `w` on `b` that reads `gets` keys (`GET`s counted by the server): the
/// name's waiter set after it, one record with its score.
async fn busy_grab_scores(
    b: &RedisBackend,
    w: &Request<'_>,
    r: &mut ::redis::aio::MultiplexedConnection,
    gets: u64,
) -> Vec<(String, f64)> {
    reset_stats(r).await;
    busy(b.acquire(w).await.unwrap());
    assert_eq!(
        calls_of(r, "get").await,
        gets,
        "keys read by the busy attempt"
    );
    let scores: Vec<(String, f64)> = r
        .zrange_withscores(format!("{}:w", b.base_key(w.name)), 0, -1)
        .await
        .unwrap();
    assert_eq!(scores.len(), 1, "{scores:?}");
    scores
}

/// A waiter that finds a dlock hold registers with the holder's fence token as its arrival
/// score, read from the hold's value: its busy attempt reads no other key. A foreign lock's
/// value has no token, so the fence counter is read instead.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_grab_scores_its_waiter_by_the_holders_token() {
    let srv = Server::start(&[]).await;
    let u = format!("redis://127.0.0.1:{}/", srv.port);
    let (a, b) = (
        RedisBackend::connect(&u).await.unwrap(),
        RedisBackend::connect(&u).await.unwrap(),
    );
    let mut r = raw_at(&u).await;
    let n = uniq("grab-score");
    let base = a.base_key(&n);
    let (ma, mb) = (meta("a"), meta("b"));
    // Two grants: the holder's token is 2.
    let first = rq(&n, "first", &ma);
    token(a.acquire(&first).await.unwrap());
    assert_eq!(a.release(&hr(&first)).await.unwrap(), Released::Released);
    let h = rq(&n, "holder", &ma);
    assert_eq!(token(a.acquire(&h).await.unwrap()), 2);
    let w = Request {
        waiting: true,
        ..rq(&n, "waiter", &mb)
    };
    // Registered and listening for its hand-off (two busy attempts, one wait).
    registered_waiter(&b, &w).await;
    let scores = busy_grab_scores(&b, &w, &mut r, 1).await;
    assert!(scores[0].0.starts_with("waiter\n"), "{scores:?}");
    assert_eq!(scores[0].1, 2.0);
    // The hand-off still goes to it, with the next token.
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    let held: String = r.get(&base).await.unwrap();
    assert!(held.starts_with("waiter\n3\n"), "{held:?}");
    let _: () = r.del(&[base.clone(), format!("{base}:w")]).await.unwrap();
    // A foreign lock (a plain token, as redis-py writes it): scored by the fence counter (3).
    let _: () = r.set_ex(&base, "5f3a9c", 30).await.unwrap();
    let other = Request {
        waiting: true,
        ..rq(&n, "other", &mb)
    };
    let scores = busy_grab_scores(&b, &other, &mut r, 2).await;
    assert_eq!(scores[0].1, 3.0);
}
