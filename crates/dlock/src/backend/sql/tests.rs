//! Tests against the servers of this machine (they fail, never skip, when a server is missing):
//! PostgreSQL at `postgres://postgres@127.0.0.1:5432/test` and MariaDB/MySQL at
//! `mysql://root@127.0.0.1:3306/test`, overridable with `DLOCK_TEST_POSTGRES_URL` /
//! `DLOCK_TEST_MYSQL_URL`. Every test uses its own table and lock names with a random suffix.

use super::*;
use crate::backend::test_support::*;

fn base(d: Dialect) -> String {
    match d {
        Dialect::Postgres => std::env::var("DLOCK_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        Dialect::MySql => std::env::var("DLOCK_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
    }
}

fn url(d: Dialect, table: &str, extra: &str) -> String {
    let b = base(d);
    let sep = if b.contains('?') { '&' } else { '?' };
    format!("{b}{sep}table={table}{extra}")
}

/// A table of one test's own: `prefix` and a random suffix.
fn own_table(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

fn uniq(prefix: &str) -> String {
    format!("{prefix}/{}", uuid::Uuid::new_v4().simple())
}

async fn open(d: Dialect, table: &str) -> SqlBackend {
    SqlBackend::open(&url(d, table, "")).await.unwrap()
}

async fn open_session(d: Dialect, table: &str) -> super::super::SessionBackend {
    super::super::SessionBackend::open(&url(d, table, "&mode=session"))
        .await
        .unwrap()
}

/// A backend as if in another process: driven without a client, nothing in this process wakes
/// its waiters (the core's in-process wake-ups are a client's).
async fn open_isolated(d: Dialect, table: &str) -> SqlBackend {
    open(d, table).await
}

async fn stored_fence(b: &SqlBackend, n: &str) -> i64 {
    sqlx::query(&b.inner.st.read_fence)
        .bind(n)
        .fetch_one(&b.inner.pool)
        .await
        .unwrap()
        .try_get(0)
        .unwrap()
}

async fn exclusion_across_two_clients(d: Dialect) {
    let a = open(d, "dlt_exclusion").await;
    let b = open(d, "dlt_exclusion").await;
    assert_eq!(a.name(), d.name());
    let base = uniq("jobs");
    let n = name(&base);
    let (ma, mb) = (meta("A"), meta("B"));
    let ra = rq(&n, "owner-a", &ma);
    let rb = rq(&n, "owner-b", &mb);
    let t1 = token(a.acquire(&ra).await.unwrap());
    assert_eq!(t1, 1);
    let bz = busy(b.acquire(&rb).await.unwrap());
    let retry = bz.retry_in.unwrap();
    assert!(
        retry <= LONG && retry > LONG - Duration::from_secs(5),
        "{retry:?}"
    );
    // idempotent re-grant
    assert_eq!(token(a.acquire(&ra).await.unwrap()), t1);
    assert_eq!(token(b.acquire(&ra).await.unwrap()), t1);
    // b cannot release a's hold
    assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::NotHeld);
    let info = b.describe(&base).await.unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].holders.len(), 1);
    assert_eq!(info[0].holders[0].owner, "owner-a");
    assert_eq!(info[0].holders[0].meta, ma);
    assert_eq!(info[0].holders[0].token, Some(1));
    // names that differ by case or trailing space are other locks
    for other in [base.to_uppercase(), format!("{base} "), format!("{base}  ")] {
        let on = name(&other);
        let r = rq(&on, "owner-b", &mb);
        assert_eq!(token(b.acquire(&r).await.unwrap()), 1, "{other:?}");
        assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
    }
    // a name with SQL in it is just a name
    let evil = name(&format!("{base}'; DROP TABLE dlt_exclusion; --"));
    let r = rq(&evil, "owner-b", &mb);
    token(b.acquire(&r).await.unwrap());
    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
    assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::Released);
    assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::NotHeld);
    assert_eq!(token(b.acquire(&rb).await.unwrap()), 2);
    // extend many in one call
    let n2 = name(&format!("{base}/2"));
    let r2 = rq(&n2, "owner-b2", &mb);
    token(b.acquire(&r2).await.unwrap());
    let gone = rq(&n2, "nobody", &mb);
    assert_eq!(
        b.extend(&[hr(&rb), hr(&gone), hr(&r2)], false)
            .await
            .unwrap(),
        vec![
            Extended::Held { valid_for: LONG },
            Extended::Gone,
            Extended::Held { valid_for: LONG }
        ]
    );
    assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
    assert!(b.describe(&format!("{base}/")).await.unwrap().len() == 1);
    b.release(&hr(&r2)).await.unwrap();
    assert!(b.describe(&base).await.unwrap().is_empty());
    assert_eq!(stored_fence(&b, &base).await, 2);
}

/// `extend` of more holds than one statement carries, with two lease lengths, released,
/// expired and foreign entries mixed in: every answer is right and nothing gone comes back.
async fn extend_in_bulk(d: Dialect) {
    let b = open(d, "dlt_bulk").await;
    let base = uniq("bulk");
    let m = meta("bulk");
    const N: usize = 1_100;
    let names: Vec<LockName> = (0..N).map(|i| name(&format!("{base}/{i}"))).collect();
    let owners: Vec<String> = (0..N).map(|i| format!("owner-{i}")).collect();
    let lease = |i: usize| {
        if i % 3 == 0 {
            Duration::from_secs(20)
        } else {
            LONG
        }
    };
    let reqs: Vec<Request<'_>> = (0..N)
        .map(|i| Request {
            lease: if i % 97 == 5 {
                Duration::from_millis(150)
            } else {
                lease(i)
            },
            ..rq(&names[i], &owners[i], &m)
        })
        .collect();
    for chunk in reqs.chunks(100) {
        let grants = futures_util::future::join_all(chunk.iter().map(|r| b.acquire(r))).await;
        for g in grants {
            token(g.unwrap());
        }
    }
    // Released, expired (150 ms lease) and never-held (another owner) entries.
    for i in (0..N).filter(|i| i % 89 == 7) {
        assert_eq!(b.release(&hr(&reqs[i])).await.unwrap(), Released::Released);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let strangers: Vec<String> = (0..N).map(|i| format!("stranger-{i}")).collect();
    let mut refs: Vec<HoldRef<'_>> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| HoldRef {
            lease: lease(i),
            ..hr(r)
        })
        .collect();
    for i in (0..N).filter(|i| i % 101 == 3) {
        refs[i].owner = &strangers[i];
    }
    let gone = |i: usize| i % 89 == 7 || i % 97 == 5 || i % 101 == 3;
    let answers = b.extend(&refs, false).await.unwrap();
    assert_eq!(answers.len(), N);
    for (i, a) in answers.iter().enumerate() {
        let want = if gone(i) {
            Extended::Gone
        } else {
            Extended::Held {
                valid_for: lease(i),
            }
        };
        assert_eq!(*a, want, "hold {i}");
    }
    // The lease was set to each hold's own length, and nothing gone was revived.
    let info = b.describe(&format!("{base}/")).await.unwrap();
    let live: HashMap<String, u64> = info
        .iter()
        .map(|l| (l.name.clone(), l.holders[0].lease_left_ms.unwrap()))
        .collect();
    for (i, n) in names.iter().enumerate() {
        let left = live.get(n.as_str());
        if gone(i) && i % 101 != 3 {
            assert_eq!(left, None, "hold {i} came back");
        } else if !gone(i) {
            let left = *left.unwrap_or_else(|| panic!("hold {i} is missing"));
            let want = lease(i).as_millis() as u64;
            assert!(
                left <= want && left > want - 5_000,
                "hold {i}: {left} ms left"
            );
        }
    }
    // A stranger's extend did not touch the real owner's hold (still there, lease unchanged).
    for i in (0..N).filter(|i| i % 101 == 3 && i % 89 != 7 && i % 97 != 5) {
        assert!(live.contains_key(names[i].as_str()), "hold {i}");
    }
    for r in &reqs {
        b.release(&hr(r)).await.unwrap();
    }
}

async fn fence_increases_across_expiry_and_reconnect(d: Dialect) {
    let n = name(&uniq("fence"));
    let m = meta("x");
    let mut last = 0;
    for round in 0..3 {
        let a = open(d, "dlt_fence").await;
        let short = Request {
            lease: Duration::from_millis(200),
            ..rq(&n, "short", &m)
        };
        let owner = format!("short-{round}");
        let short = Request {
            owner: &owner,
            ..short
        };
        let t = token(a.acquire(&short).await.unwrap());
        assert!(t > last, "{t} after {last}");
        last = t;
        // the lease runs out; another owner gets a higher token
        tokio::time::sleep(Duration::from_millis(300)).await;
        let other = format!("other-{round}");
        let r = rq(&n, &other, &m);
        let t = token(a.acquire(&r).await.unwrap());
        assert!(t > last, "{t} after {last}");
        last = t;
        assert_eq!(a.release(&hr(&r)).await.unwrap(), Released::Released);
        a.inner.pool.close().await;
    }
    assert_eq!(last, 6);
}

async fn owner_only_release_after_expiry(d: Dialect) {
    let a = open(d, "dlt_owner").await;
    let b = open(d, "dlt_owner").await;
    let n = name(&uniq("owner"));
    let (ma, mb) = (meta("A"), meta("B"));
    let ra = Request {
        lease: Duration::from_millis(150),
        ..rq(&n, "a", &ma)
    };
    let rb = rq(&n, "b", &mb);
    token(a.acquire(&ra).await.unwrap());
    busy(b.acquire(&rb).await.unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(token(b.acquire(&rb).await.unwrap()), 2);
    assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::NotHeld);
    assert_eq!(
        a.extend(&[hr(&ra)], false).await.unwrap(),
        vec![Extended::Gone]
    );
    let info = a.describe(n.as_str()).await.unwrap();
    assert_eq!(info[0].holders.len(), 1);
    assert_eq!(info[0].holders[0].owner, "b");
    assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::Released);
}

async fn fair_order(d: Dialect) {
    let a = open(d, "dlt_fair").await;
    let b = open(d, "dlt_fair").await;
    let n = name(&uniq("fair"));
    let m = meta("m");
    let holder = rq(&n, "holder", &m);
    token(a.acquire(&holder).await.unwrap());
    let owners = ["w0", "w1", "w2"];
    let reqs: Vec<Request<'_>> = owners
        .iter()
        .map(|o| Request {
            fair: true,
            waiting: true,
            ..rq(&n, o, &m)
        })
        .collect();
    for r in &reqs {
        busy(b.acquire(r).await.unwrap());
    }
    // a plain request does not barge past the queue, even once the lock is free
    let plain = rq(&n, "plain", &m);
    a.release(&hr(&holder)).await.unwrap();
    // look again about a lease from now: when w0's hold ends (PostgreSQL hands the queue's head
    // the lock at the release) or would end if its holder died unreleased (MySQL: only the
    // queue is in the way)
    let about_a_lease = |b: Busy, lease: Duration| {
        let r = b.retry_in.unwrap();
        assert!(r <= lease && r > lease - Duration::from_secs(5), "{r:?}");
    };
    about_a_lease(busy(a.acquire(&plain).await.unwrap()), plain.lease);
    let info_waiters = {
        // the queue is listed only with holders; take w0 first
        busy(b.acquire(&reqs[2]).await.unwrap());
        busy(b.acquire(&reqs[1]).await.unwrap());
        let t0 = token(b.acquire(&reqs[0]).await.unwrap());
        let info = a.describe(n.as_str()).await.unwrap();
        assert_eq!(info[0].holders[0].owner, "w0");
        assert_eq!(t0, 2);
        info[0]
            .waiters
            .iter()
            .map(|w| w.owner.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(info_waiters, ["w1", "w2"]);
    b.release(&hr(&reqs[0])).await.unwrap();
    about_a_lease(busy(b.acquire(&reqs[2]).await.unwrap()), reqs[2].lease);
    assert_eq!(token(b.acquire(&reqs[1]).await.unwrap()), 3);
    b.release(&hr(&reqs[1])).await.unwrap();
    assert_eq!(token(b.acquire(&reqs[2]).await.unwrap()), 4);
    // a cancelled waiter leaves the queue
    let late = Request {
        fair: true,
        waiting: true,
        ..rq(&n, "late", &m)
    };
    busy(a.acquire(&late).await.unwrap());
    a.cancel(&late).await.unwrap();
    b.release(&hr(&reqs[2])).await.unwrap();
    assert_eq!(token(a.acquire(&plain).await.unwrap()), 5);
    a.release(&hr(&plain)).await.unwrap();
}

async fn rwlock_and_semaphore(d: Dialect) {
    let a = open(d, "dlt_rw").await;
    let n = name(&uniq("rw"));
    let m = meta("m");
    let read = |o: &'static str| Request {
        kind: LockKind::RwLock,
        mode: Mode::Shared,
        ..rq(&n, o, &m)
    };
    let (r1, r2, r3) = (read("r1"), read("r2"), read("r3"));
    token(a.acquire(&r1).await.unwrap());
    token(a.acquire(&r2).await.unwrap());
    let w = Request {
        kind: LockKind::RwLock,
        waiting: true,
        ..rq(&n, "w", &m)
    };
    busy(a.acquire(&w).await.unwrap());
    // the waiting writer blocks new readers
    busy(a.acquire(&r3).await.unwrap());
    a.release(&hr(&r1)).await.unwrap();
    a.release(&hr(&r2)).await.unwrap();
    token(a.acquire(&w).await.unwrap());
    busy(a.acquire(&r3).await.unwrap());
    // a mutex request on an rwlock name is a configuration error
    let wrong = rq(&n, "wrong", &m);
    assert!(matches!(
        a.acquire(&wrong).await,
        Err(Error::InvalidConfig(_))
    ));
    a.release(&hr(&w)).await.unwrap();
    token(a.acquire(&r3).await.unwrap());
    a.release(&hr(&r3)).await.unwrap();

    let s = name(&uniq("sem"));
    let k = LockKind::Semaphore { permits: 2 };
    let permit = |o: &'static str| Request {
        kind: k,
        mode: Mode::Shared,
        ..rq(&s, o, &m)
    };
    let (p1, p2, p3) = (permit("p1"), permit("p2"), permit("p3"));
    token(a.acquire(&p1).await.unwrap());
    token(a.acquire(&p2).await.unwrap());
    busy(a.acquire(&p3).await.unwrap());
    a.release(&hr(&p1)).await.unwrap();
    token(a.acquire(&p3).await.unwrap());
    let info = a.describe(s.as_str()).await.unwrap();
    assert_eq!(info[0].kind, k);
    assert_eq!(info[0].holders.len(), 2);
}

async fn concurrent_tasks_never_share_the_mutex(d: Dialect) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(Arc::new(open_isolated(d, "dlt_contended").await));
    }
    let base = uniq("contended");
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..6usize {
        let b = backends[t % 3].clone();
        let inside = inside.clone();
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let n = name(&base);
            let m = meta(&format!("task{t}"));
            let mut last = 0;
            for i in 0..8 {
                let owner = format!("t{t}-{i}");
                let r = Request {
                    fair: t % 2 == 1,
                    waiting: true,
                    ..rq(&n, &owner, &m)
                };
                let tok = loop {
                    match b.acquire(&r).await.unwrap() {
                        Attempt::Granted(g) => break g.token.unwrap(),
                        Attempt::Busy(bz) => b
                            .wait(&r, &bz, Instant::now() + Duration::from_secs(1))
                            .await
                            .unwrap(),
                    }
                };
                assert!(tok > last);
                last = tok;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                let released = b.release(&hr(&r)).await.unwrap();
                assert!(
                    matches!(released, Released::Released | Released::HandedOff),
                    "{released:?}"
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(stored_fence(&backends[0], &base).await, 48);
}

/// Through clients: the grants of a new name count from 1.
async fn a_new_name_counts_from_one(d: Dialect) {
    let u = url(d, "dlt_client", "");
    let c1 = crate::connect(&u).await.unwrap();
    let c2 = crate::connect(&u).await.unwrap();
    assert_eq!(c1.backend_name(), d.name());
    let n = uniq("e2e");
    for (c, token) in [(&c1, 1), (&c2, 2)] {
        let g = c.mutex(n.as_str()).unwrap().try_acquire().await.unwrap();
        assert_eq!(g.token(), Some(token));
        g.release().await.unwrap();
    }
    assert!(c1.list(&n).await.unwrap().is_empty());
}

async fn table_name_is_validated(d: Dialect) {
    for bad in [
        "x;%20DROP%20TABLE%20y",
        "x%3B%20DROP%20TABLE%20y",
        "1x",
        "a%22b",
    ] {
        let u = url(d, bad, "");
        let e = SqlBackend::open(&u).await.unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
        let e = crate::connect(&u).await.unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
    }
    let e = crate::connect(&url(d, "ok", "&nope=1")).await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
}

async fn dead_database_is_unavailable_quickly(d: Dialect) {
    let u = match d {
        Dialect::Postgres => "postgres://postgres@127.0.0.1:1/test",
        Dialect::MySql => "mysql://root@127.0.0.1:1/test",
    };
    let start = Instant::now();
    let e = SqlBackend::open(u).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// The holder's server session id in session mode.
async fn holder_pid(b: &super::super::SessionBackend, owner: &str) -> i64 {
    b.server_pid(owner).unwrap()
}

/// Ends server session `pid`, as an administrator would.
async fn kill(d: Dialect, pid: i64) {
    let sql = match d {
        Dialect::Postgres => format!("SELECT pg_terminate_backend({pid})"),
        Dialect::MySql => format!("KILL CONNECTION {pid}"),
    };
    let admin = open(d, "dlt_session").await;
    (&admin.inner.pool).execute(sql.as_str()).await.unwrap();
}

async fn session_mode_exclusion_and_kill(d: Dialect) {
    let a = open_session(d, "dlt_session").await;
    let b = open_session(d, "dlt_session").await;
    let base = uniq("sess");
    let n = name(&base);
    let (ma, mb) = (meta("A"), meta("B"));
    let ra = rq(&n, "a", &ma);
    let rb = rq(&n, "b", &mb);
    let t1 = token(a.acquire(&ra).await.unwrap());
    busy(b.acquire(&rb).await.unwrap());
    assert_eq!(token(a.acquire(&ra).await.unwrap()), t1);
    assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::NotHeld);
    assert_eq!(
        a.extend(&[hr(&ra)], false).await.unwrap(),
        vec![Extended::Held { valid_for: LONG }]
    );
    let info = b.describe(&base).await.unwrap();
    assert_eq!(info[0].holders[0].owner, "a");
    // other kinds and fair queues are refused
    let rw = Request {
        kind: LockKind::RwLock,
        ..rq(&n, "c", &mb)
    };
    assert!(matches!(b.acquire(&rw).await, Err(Error::Unsupported(_))));
    let fair = Request {
        fair: true,
        ..rq(&n, "c", &mb)
    };
    assert!(matches!(b.acquire(&fair).await, Err(Error::Unsupported(_))));
    // long names work (hashed on MySQL)
    let long = name(&format!("{base}/{}", "x".repeat(200)));
    let rl = rq(&long, "l", &mb);
    let tl = token(b.acquire(&rl).await.unwrap());
    busy(a.acquire(&rq(&long, "l2", &ma)).await.unwrap());
    assert_eq!(b.release(&hr(&rl)).await.unwrap(), Released::Released);
    assert!(token(a.acquire(&rq(&long, "l2", &ma)).await.unwrap()) > tl);

    // release, then b gets it with a higher token
    assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::Released);
    let t2 = token(b.acquire(&rb).await.unwrap());
    assert!(t2 > t1);
    // the server kills b's connection: extend reports Gone, a waiter gets in
    let bz = busy(a.acquire(&ra).await.unwrap());
    let pid = holder_pid(&b, "b").await;
    kill(d, pid).await;
    let start = Instant::now();
    a.wait(&ra, &bz, start + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let t3 = token(a.acquire(&ra).await.unwrap());
    assert!(t3 > t2);
    assert_eq!(
        b.extend(&[hr(&rb)], false).await.unwrap(),
        vec![Extended::Gone]
    );
    assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::NotHeld);
    let info = b.describe(&base).await.unwrap();
    assert_eq!(info[0].holders[0].owner, "a");
    assert_eq!(info[0].holders[0].token, Some(t3));
    // an administrator's unlock ends the holder's session
    assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
    assert_eq!(
        a.extend(&[hr(&ra)], false).await.unwrap(),
        vec![Extended::Gone]
    );
    let t4 = token(b.acquire(&rb).await.unwrap());
    assert!(t4 > t3);
    b.release(&hr(&rb)).await.unwrap();
}

/// A break returns once the server has freed the broken session's lock: the name can be taken
/// at once (the kill alone returns before the session has ended).
async fn session_mode_break_frees_the_lock_at_once(d: Dialect) {
    let a = open_session(d, "dlt_session").await;
    let b = open_session(d, "dlt_session").await;
    let base = uniq("brk");
    let n = name(&base);
    let (ma, mb) = (meta("A"), meta("B"));
    // The race is rare (about 1 round in 60 on PostgreSQL without the wait): many rounds.
    for i in 0..200 {
        let (oa, ob) = (format!("a{i}"), format!("b{i}"));
        let ra = rq(&n, &oa, &ma);
        let rb = rq(&n, &ob, &mb);
        token(a.acquire(&ra).await.unwrap());
        assert_eq!(b.force_release(&n, Force::Break).await.unwrap().removed, 1);
        match b.acquire(&rb).await.unwrap() {
            Attempt::Granted(_) => {}
            other => panic!("round {i}: the broken lock was not free at once: {other:?}"),
        }
        b.release(&hr(&rb)).await.unwrap();
    }
}

async fn session_mode_lost_fires_on_kill(d: Dialect) {
    let u = url(d, "dlt_session_client", "&mode=session");
    let opts = crate::ClientOptions::default().lease(Duration::from_secs(3));
    let c1 = crate::connect_with(&u, opts.clone()).await.unwrap();
    let c2 = crate::connect_with(&u, opts).await.unwrap();
    let n = uniq("lost");
    let g = c1.mutex(n.as_str()).unwrap().acquire().await.unwrap();
    let t1 = g.token().unwrap();
    let lost = g.lost();
    let waiter = {
        let c2 = c2.clone();
        let n = n.clone();
        tokio::spawn(async move {
            c2.mutex(n.as_str())
                .unwrap()
                .acquire_timeout(Duration::from_secs(10))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let admin = open(d, "dlt_session_client").await;
    let pid: i64 = match d {
        Dialect::Postgres => sqlx::query(
            "SELECT pid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1",
        )
        .bind(advisory_key("dlt_session_client", &n)),
        Dialect::MySql => sqlx::query("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
            .bind(mysql_lock_name("dlt_session_client", &n)),
    }
    .fetch_one(&admin.inner.pool)
    .await
    .unwrap()
    .try_get(0)
    .unwrap();
    let killed = Instant::now();
    kill(d, pid).await;
    let why = tokio::time::timeout(Duration::from_secs(3), lost)
        .await
        .expect("lost() did not fire after the holder's connection was killed");
    assert!(matches!(why, Error::Lost { .. }), "{why:?}");
    let g2 = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    // well before the core's 5 s safety net: the waiter polls the server lock
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "{:?}",
        killed.elapsed()
    );
    assert!(g2.token().unwrap() > t1);
    g2.release().await.unwrap();
    let _ = g.release().await;
}

async fn dropped_holder_frees_session_lock(d: Dialect) {
    let n = name(&uniq("drop"));
    let m = meta("m");
    let t1 = {
        // A holder that stops renewing: the server ends its idle session after its lease (the
        // core's own rule releases it sooner in a live process; this is a process that stopped).
        let a = open_session(d, "dlt_session").await;
        let short = Request {
            lease: Duration::from_secs(1),
            ..rq(&n, "a", &m)
        };
        let t = token(a.acquire(&short).await.unwrap());
        let b = open_session(d, "dlt_session").await;
        let started = Instant::now();
        let mut t2 = None;
        while started.elapsed() < Duration::from_secs(6) {
            if let Attempt::Granted(g) = b.acquire(&rq(&n, "b", &m)).await.unwrap() {
                t2 = g.token;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let took = started.elapsed();
        let t2 = t2.unwrap_or_else(|| panic!("an idle session lock was not freed in {took:?}"));
        assert!(
            took >= Duration::from_millis(700),
            "freed {took:?} after a grant with a 1 s lease"
        );
        assert!(t2 > t);
        assert_eq!(
            a.extend(&[hr(&short)], false).await.unwrap(),
            vec![Extended::Gone]
        );
        t2
    };
    // b was dropped with its hold: its connection closes, the lock is free again
    let c = open_session(d, "dlt_session").await;
    let rc = rq(&n, "c", &m);
    let mut got = None;
    for _ in 0..50 {
        if let Attempt::Granted(g) = c.acquire(&rc).await.unwrap() {
            got = g.token;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(got.unwrap() > t1);
    c.release(&hr(&rc)).await.unwrap();
}

#[cfg(feature = "postgres")]
async fn postgres_notify_wakes_well_before_polling() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_notify").await;
    let b = open_isolated(d, "dlt_notify").await;
    assert_eq!(b.capabilities().wakeups, Wakeups::Native);
    let n = name(&uniq("notify"));
    let (ma, mb) = (meta("A"), meta("B"));
    for round in 0..3 {
        let ho = format!("h{round}");
        let wo = format!("w{round}");
        let h = rq(&n, &ho, &ma);
        let w = Request {
            waiting: true,
            ..rq(&n, &wo, &mb)
        };
        token(a.acquire(&h).await.unwrap());
        let bz = busy(b.acquire(&w).await.unwrap());
        assert!(bz.retry_in.unwrap() > Duration::from_secs(20));
        let (released_tx, released_rx) = tokio::sync::oneshot::channel();
        let releaser = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let at = Instant::now();
            assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
            let _ = released_tx.send(at);
        };
        let start = Instant::now();
        let (r, ()) = tokio::join!(b.wait(&w, &bz, start + Duration::from_secs(20)), releaser);
        r.unwrap();
        let woke = Instant::now();
        let released = released_rx.await.unwrap();
        let after = woke.saturating_duration_since(released);
        assert!(
            after < Duration::from_millis(100),
            "round {round}: woke {after:?} after the release"
        );
        token(b.acquire(&w).await.unwrap());
        b.release(&hr(&w)).await.unwrap();
    }
}

/// A release racing a new waiter's attempt still reaches it: the waiter's transaction has looked
/// at the name (held) and is writing its queue place and registration (held up here by a lock on
/// the queue table) when the holder releases. The release must not decide "nobody waits" on a
/// look that misses that uncommitted place: it waits for the waiter's transaction (the name's
/// wake lock) and then hands it the lock (it heads the fair queue), instead of leaving it asleep
/// until its own deadline.
#[cfg(feature = "postgres")]
async fn postgres_a_release_racing_a_new_waiter_wakes_it() {
    let d = Dialect::Postgres;
    let table = own_table("dlt_race");
    let a = open_isolated(d, &table).await;
    let b = open_isolated(d, &table).await;
    let n = name(&uniq("race"));
    let (ma, mb) = (meta("A"), meta("B"));
    let h = rq(&n, "holder", &ma);
    let w = Request {
        waiting: true,
        fair: true,
        ..rq(&n, "waiter", &mb)
    };
    token(a.acquire(&h).await.unwrap());
    let mut blocker = sqlx::PgConnection::connect(&base(d)).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query(&format!("LOCK TABLE {table}_queue IN EXCLUSIVE MODE"))
        .execute(&mut blocker)
        .await
        .unwrap();
    // The waiter's transaction gets stuck on its place's insert; then the holder releases, and
    // a moment later the insert may go on.
    let mut probe = sqlx::PgConnection::connect(&base(d)).await.unwrap();
    let stuck = format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND query LIKE '%{table}_queue%'"
    );
    let control = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: i64 = sqlx::query(&stuck)
                .fetch_one(&mut probe)
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the waiter's place insert never waited"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let unblock = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
        };
        let held = hr(&h);
        tokio::join!(a.release(&held), unblock).0
    };
    let (attempt, released) = tokio::join!(b.acquire(&w), control);
    let bz = busy(attempt.unwrap());
    assert_eq!(released.unwrap(), Released::HandedOff);
    let start = Instant::now();
    b.wait(&w, &bz, start + Duration::from_secs(5))
        .await
        .unwrap();
    let woke = start.elapsed();
    assert!(
        woke < Duration::from_secs(1),
        "the waiter slept {woke:?}: the release did not tell it"
    );
    token(b.acquire(&w).await.unwrap());
    b.release(&hr(&w)).await.unwrap();
}

/// The wake lock the full path takes with its `BEGIN` (a literal in a simple query) is the one
/// the routines take from the bound text, whatever the name holds.
#[cfg(feature = "postgres")]
async fn postgres_wake_lock_key_survives_any_name() {
    let d = Dialect::Postgres;
    let table = own_table("dlt_wakekey");
    let b = open(d, &table).await;
    let mut probe = sqlx::PgConnection::connect(&base(d)).await.unwrap();
    for nasty in [
        "plain",
        "it's",
        "back\\slash\\'",
        "é/ü ' OR 1=1 --",
        "$dlock$ \" x",
    ] {
        let tx = b
            .inner
            .pool
            .begin_with(fast::begin_wake_sql(&table, nasty))
            .await
            .unwrap();
        let held: i64 = sqlx::query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND mode = 'ShareLock' \
             AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)",
        )
        .bind(fast::wake_key_text(&table, nasty))
        .fetch_one(&mut probe)
        .await
        .unwrap()
        .get(0);
        assert_eq!(held, 1, "name {nasty:?}");
        tx.rollback().await.unwrap();
    }
}

/// Notifications on `channel` (PostgreSQL) within `within` of now.
#[cfg(feature = "postgres")]
async fn notifications(l: &mut sqlx::postgres::PgListener, within: Duration) -> Vec<String> {
    let mut got = Vec::new();
    let until = Instant::now() + within;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until.into(), l.recv()).await {
        got.push(n.payload().to_owned());
    }
    got
}

/// A listener on the table's channel, as another client's.
#[cfg(feature = "postgres")]
async fn table_listener(table: &str) -> sqlx::postgres::PgListener {
    let mut l = sqlx::postgres::PgListener::connect(&base(Dialect::Postgres))
        .await
        .unwrap();
    l.listen(table).await.unwrap();
    l
}

/// PostgreSQL: a waiting attempt that queued for a connection's slot and went out alone calls
/// the routine as its caller would have: refused, it registers, and the release hands it the lock.
#[cfg(feature = "postgres")]
async fn postgres_a_queued_waiter_alone_in_its_batch_registers() {
    let d = Dialect::Postgres;
    let table = own_table("dlt_batchreg");
    let a = Arc::new(open_isolated(d, &table).await);
    let other = open_isolated(d, &table).await;
    let (ma, mb) = (meta("A"), meta("B"));
    let n = name(&uniq("breg"));
    let h = rq(&n, "h", &ma);
    token(other.acquire(&h).await.unwrap());
    // Every slot taken, so the waiter's attempt queues.
    let g = batch::Granting(a.inner.clone());
    let turns: Vec<_> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let ask = || batch::Ask {
                want: Want::new(&h),
                reg: None,
            };
            match group::enter(&g, ask) {
                group::Entered::Alone(turn, _) => turn,
                group::Entered::Queued(_) => panic!("a slot was free"),
            }
        })
        .collect();
    let waiter = tokio::spawn({
        let (a, n) = (a.clone(), n.clone());
        async move {
            let w = Request {
                waiting: true,
                ..rq(&n, "w", &mb)
            };
            a.acquire(&w).await.unwrap()
        }
    });
    let until = Instant::now() + Duration::from_secs(3);
    while a.inner.grants.queued() == 0 {
        assert!(Instant::now() < until, "the attempt never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(turns);
    busy(waiter.await.unwrap());
    let registered: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table}_waiters WHERE owner = 'w'"
    ))
    .fetch_one(&a.inner.pool)
    .await
    .unwrap();
    assert_eq!(registered, 1, "the refused waiter registered");
    assert_eq!(other.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    drop_tables(&a, &table).await;
}

/// A release wakes only who waits: nobody (no `NOTIFY` at all), a reader (the name's channel),
/// a registered mutex waiter (handed the lock, told alone, and it takes the hold without a
/// statement).
#[cfg(feature = "postgres")]
async fn postgres_release_wakes_only_who_waits() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_wake").await;
    let b = open_isolated(d, "dlt_wake").await;
    assert!(b.capabilities().hands_off);
    let mut l = table_listener("dlt_wake").await;
    let (ma, mb) = (meta("A"), meta("B"));
    // Nobody waits: no NOTIFY.
    let n = name(&uniq("wake"));
    let h = rq(&n, "h", &ma);
    token(a.acquire(&h).await.unwrap());
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
    assert!(notifications(&mut l, Duration::from_millis(300))
        .await
        .is_empty());
    // A waiting reader (registered to be woken): the name's NOTIFY.
    let rw = |owner, mode, m| Request {
        kind: LockKind::RwLock,
        mode,
        waiting: true,
        ..rq(&n, owner, m)
    };
    let (w, r) = (
        rw("writer", Mode::Exclusive, &ma),
        rw("reader", Mode::Shared, &mb),
    );
    token(a.acquire(&w).await.unwrap());
    let bz = busy(b.acquire(&r).await.unwrap());
    assert_eq!(a.release(&hr(&w)).await.unwrap(), Released::Released);
    assert_eq!(
        notifications(&mut l, Duration::from_millis(300)).await,
        vec![n.as_str().to_owned()]
    );
    wakes_soon(&b, &r, &bz).await;
    token(b.acquire(&r).await.unwrap());
    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
    assert!(notifications(&mut l, Duration::from_millis(300))
        .await
        .is_empty());
    // A mutex waiter: handed the lock, told on its own channel only.
    let n = name(&uniq("wake"));
    let h = rq(&n, "h", &ma);
    let w = Request {
        waiting: true,
        ..rq(&n, "w", &mb)
    };
    let t1 = token(a.acquire(&h).await.unwrap());
    let bz = busy(b.acquire(&w).await.unwrap());
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    let info = a.describe(n.as_str()).await.unwrap();
    assert_eq!(info[0].holders[0].owner, "w");
    assert_eq!(info[0].holders[0].meta, mb);
    assert_eq!(takes_the_handed_lock(&b, &w, &bz).await, t1 + 1);
    assert_eq!(
        b.extend(&[hr(&w)], false).await.unwrap(),
        vec![Extended::Held { valid_for: LONG }]
    );
    assert!(notifications(&mut l, Duration::from_millis(300))
        .await
        .is_empty());
    assert_eq!(b.release(&hr(&w)).await.unwrap(), Released::Released);
}

/// `w`'s wait after the refusal `bz` ends within 200 ms (it was told, not polled).
#[cfg(feature = "postgres")]
async fn wakes_soon(b: &SqlBackend, w: &Request<'_>, bz: &Busy) {
    let t = Instant::now();
    b.wait(w, bz, t + Duration::from_secs(5)).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
}

/// `w`, handed the lock after the refusal `bz`, is woken soon and takes the hold without
/// sending anything: its token.
#[cfg(feature = "postgres")]
async fn takes_the_handed_lock(b: &SqlBackend, w: &Request<'_>, bz: &Busy) -> u64 {
    wakes_soon(b, w, bz).await;
    let before = fast_counts(b);
    let t = token(b.acquire(w).await.unwrap());
    assert_eq!(fast_counts(b), before, "the handed attempt sent nothing");
    t
}

/// Ends `victim`'s listener session at the server (found by the advisory lock it holds), through
/// `by`'s pool. `true` if it was there to end.
#[cfg(feature = "postgres")]
async fn kill_listener(victim: &SqlBackend, by: &SqlBackend) -> bool {
    let (lk1, lk2) = victim
        .inner
        .listener
        .as_ref()
        .and_then(|l| l.key())
        .unwrap();
    sqlx::query(
        "SELECT COALESCE(bool_or(pg_terminate_backend(pid)), false) FROM pg_locks \
         WHERE locktype = 'advisory' AND classid = ($1::bigint & 4294967295)::oid \
         AND objid = ($2::bigint & 4294967295)::oid AND objsubid = 2",
    )
    .bind(i64::from(lk1))
    .bind(i64::from(lk2))
    .fetch_one(&by.inner.pool)
    .await
    .unwrap()
    .try_get(0)
    .unwrap()
}

/// Hand-offs go in arrival order to waiters whose client still listens; a waiter that gives up
/// after it was handed the lock passes it on.
#[cfg(feature = "postgres")]
async fn postgres_handoffs_skip_the_gone_and_pass_on() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_handoff").await;
    let b = open_isolated(d, "dlt_handoff").await;
    let c = open_isolated(d, "dlt_handoff").await;
    let gone = open_isolated(d, "dlt_handoff").await;
    let n = name(&uniq("handoff"));
    let m = meta("m");
    let waiting = |owner| Request {
        waiting: true,
        ..rq(&n, owner, &m)
    };
    let (h, wg, wb, wc) = (rq(&n, "h", &m), waiting("gone"), waiting("b"), waiting("c"));
    token(a.acquire(&h).await.unwrap());
    busy(gone.acquire(&wg).await.unwrap());
    let bb = busy(b.acquire(&wb).await.unwrap());
    let bc = busy(c.acquire(&wc).await.unwrap());
    // The first waiter's client is cut off (its listener's session ends, and with it the
    // advisory lock its registration names).
    assert!(kill_listener(&gone, &a).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    let holder = |info: Vec<LockInfo>| info[0].holders[0].owner.clone();
    assert_eq!(holder(a.describe(n.as_str()).await.unwrap()), "b");
    b.wait(&wb, &bb, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    // b gives up although it was handed the lock: c gets it.
    b.cancel(&wb).await.unwrap();
    assert_eq!(holder(a.describe(n.as_str()).await.unwrap()), "c");
    let t = Instant::now();
    c.wait(&wc, &bc, t + Duration::from_secs(5)).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    token(c.acquire(&wc).await.unwrap());
    // Nobody registered is left: the release only releases.
    assert_eq!(c.release(&hr(&wc)).await.unwrap(), Released::Released);
    assert!(a.describe(n.as_str()).await.unwrap().is_empty());
}

/// A waiter refused while its client's listener was down, whose wait finds it back, attempts
/// again at once: its refusal registered nothing, so no release would tell it.
#[cfg(feature = "postgres")]
async fn postgres_a_waiter_refused_while_the_listener_was_down_attempts_again() {
    let d = Dialect::Postgres;
    let a = open(d, "dlt_relisten").await;
    let b = open(d, "dlt_relisten").await;
    let state = b.inner.listener.clone().unwrap();
    let m = meta("m");
    let n = name(&uniq("relisten"));
    let h = rq(&n, "h", &m);
    let w = Request {
        waiting: true,
        ..rq(&n, "w", &m)
    };
    let registrations = || async {
        let c: i64 = sqlx::query(&format!(
            "SELECT count(*) FROM {} WHERE owner = 'w'",
            fast::waiters("dlt_relisten")
        ))
        .fetch_one(&a.inner.pool)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
        c
    };
    let until = |s| Instant::now() + Duration::from_secs(s);
    token(a.acquire(&h).await.unwrap());
    // b's listener connection is killed at the server, and b is refused while it is down (it
    // comes back after 50-100 ms; tried again if the refusal came too late and registered).
    let mut refused = None;
    for _ in 0..10 {
        assert!(kill_listener(&b, &a).await);
        let deadline = until(5);
        while state.key().is_some() {
            assert!(Instant::now() < deadline, "the listener did not notice");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let bz = busy(b.acquire(&w).await.unwrap());
        if registrations().await == 0 {
            refused = Some(bz);
            break;
        }
        b.cancel(&w).await.unwrap();
        let deadline = until(5);
        while state.key().is_none() {
            assert!(Instant::now() < deadline, "the listener did not come back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let bz = refused.expect("never refused while the listener was down");
    let deadline = until(5);
    while state.key().is_none() {
        assert!(Instant::now() < deadline, "the listener did not come back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    b.wait(&w, &bz, t + Duration::from_secs(3)).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let bz = busy(b.acquire(&w).await.unwrap());
    assert_eq!(registrations().await, 1);
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    b.wait(&w, &bz, until(5)).await.unwrap();
    token(b.acquire(&w).await.unwrap());
    assert_eq!(b.release(&hr(&w)).await.unwrap(), Released::Released);
}

/// A waiter's own attempt can take the hold a release handed it (a regrant) before its listener
/// delivers the hand-off message; that message, arriving after the acquisition is done, must
/// leave the hold alone (it was passed on as handed to a waiter that left, and the next waiter
/// was granted beside the holder: two holders, seen at scale in the delay and black-hole
/// chaos scenarios). Once the hold is released, such a message passes nothing on.
#[cfg(feature = "postgres")]
async fn postgres_a_late_handoff_message_leaves_the_hold_alone() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_late").await;
    let b = open_isolated(d, "dlt_late").await;
    let n = name(&uniq("late"));
    let m = meta("m");
    let (h, w, x) = (
        rq(&n, "h", &m),
        Request {
            waiting: true,
            ..rq(&n, "w", &m)
        },
        rq(&n, "x", &m),
    );
    let t1 = token(a.acquire(&h).await.unwrap());
    busy(b.acquire(&w).await.unwrap());
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    // Granted (by the message, or by its attempt meeting the handed hold); the acquisition is
    // over, as the core's is after a grant.
    assert_eq!(token(b.acquire(&w).await.unwrap()), t1 + 1);
    // The hand-off message, late.
    let late = format!("{} w {}", t1 + 1, n.as_str());
    super::handed(&Arc::downgrade(&b.inner), &late);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        b.extend(&[hr(&w)], false).await.unwrap(),
        vec![Extended::Held { valid_for: LONG }],
        "the late message passed the holder's lock on"
    );
    busy(a.acquire(&x).await.unwrap());
    assert_eq!(b.release(&hr(&w)).await.unwrap(), Released::Released);
    // After the release the same message finds nothing to pass on, and hands nothing to anyone.
    super::handed(&Arc::downgrade(&b.inner), &late);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(a.describe(n.as_str()).await.unwrap().is_empty());
    assert_eq!(token(a.acquire(&x).await.unwrap()), t1 + 2);
    assert_eq!(a.release(&hr(&x)).await.unwrap(), Released::Released);
}

/// Registers `r` for a hand-off under advisory lock `key`, as a refused attempt does.
#[cfg(feature = "postgres")]
async fn register(b: &SqlBackend, r: &Request<'_>, key: (i32, i32)) {
    bind_registration(
        sqlx::query(&b.inner.st.register),
        &b.inner.table,
        r,
        true,
        key,
    )
    .execute(&b.inner.pool)
    .await
    .unwrap();
}

/// An attempt of a waiter that raced the release handing it the lock registers it again once
/// that release commits. Its own release drops that registration: the lock is not handed back
/// to its releaser, and no fence token is spent. Nor is one spent on a waiter whose client is
/// gone.
#[cfg(feature = "postgres")]
async fn postgres_releases_spend_tokens_only_on_handoffs() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_spend").await;
    let b = open_isolated(d, "dlt_spend").await;
    let n = name(&uniq("spend"));
    let m = meta("m");
    let (h, w) = (
        rq(&n, "h", &m),
        Request {
            waiting: true,
            ..rq(&n, "w", &m)
        },
    );
    let t1 = token(a.acquire(&h).await.unwrap());
    let bz = busy(b.acquire(&w).await.unwrap());
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    // The racing attempt's registration, written after the hand-off.
    let key = b.inner.listener.as_ref().and_then(|l| l.key()).unwrap();
    register(&b, &w, key).await;
    b.wait(&w, &bz, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(token(b.acquire(&w).await.unwrap()), t1 + 1);
    assert_eq!(b.release(&hr(&w)).await.unwrap(), Released::Released);
    assert!(a.describe(n.as_str()).await.unwrap().is_empty());
    assert_eq!(stored_fence(&a, n.as_str()).await, 2);
    // A registration under an advisory lock nobody holds (its client is gone).
    let t3 = token(a.acquire(&h).await.unwrap());
    let ghost = rq(&n, "ghost", &m);
    register(&b, &ghost, (i32::MIN + 7, 11)).await;
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
    assert!(a.describe(n.as_str()).await.unwrap().is_empty());
    assert_eq!(stored_fence(&a, n.as_str()).await, 3);
    assert_eq!(token(a.acquire(&h).await.unwrap()), t3 + 1);
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
}

/// A release hands the lock to the fair queue's head, whose place becomes its hold, and tells
/// its client alone; the queue's others keep their places. A head whose client is gone is not
/// handed the lock (nor is anyone behind it): the name's waiters are woken instead.
#[cfg(feature = "postgres")]
async fn postgres_a_fair_queue_hands_the_lock_to_its_head() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_fairhand").await;
    let b = open_isolated(d, "dlt_fairhand").await;
    let c = open_isolated(d, "dlt_fairhand").await;
    let mut l = table_listener("dlt_fairhand").await;
    let n = name(&uniq("fairhand"));
    let (ma, mb, mc) = (meta("A"), meta("B"), meta("C"));
    let fair = |owner, m| Request {
        fair: true,
        waiting: true,
        ..rq(&n, owner, m)
    };
    let (h, wb, wc) = (fair("h", &ma), fair("b", &mb), fair("c", &mc));
    let t1 = token(a.acquire(&h).await.unwrap());
    let bb = busy(b.acquire(&wb).await.unwrap());
    busy(c.acquire(&wc).await.unwrap());
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::HandedOff);
    let info = a.describe(n.as_str()).await.unwrap();
    assert_eq!(info[0].holders.len(), 1);
    assert_eq!(info[0].holders[0].owner, "b");
    assert_eq!(info[0].holders[0].meta, mb);
    let places: Vec<_> = info[0].waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(places, ["c"]);
    assert!(
        notifications(&mut l, Duration::from_millis(300))
            .await
            .is_empty(),
        "the queue's others are not woken"
    );
    assert_eq!(takes_the_handed_lock(&b, &wb, &bb).await, t1 + 1);
    // c's client is cut off: its place stays until it expires, and nobody is handed the lock.
    assert!(kill_listener(&c, &a).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.release(&hr(&wb)).await.unwrap(), Released::Released);
    let info = a.describe(n.as_str()).await.unwrap();
    assert!(info.iter().all(|i| i.holders.is_empty()), "{info:?}");
    assert_eq!(
        notifications(&mut l, Duration::from_millis(300)).await,
        vec![n.as_str().to_owned()]
    );
    assert_eq!(
        stored_fence(&a, n.as_str()).await,
        i64::try_from(t1).unwrap() + 1
    );
    c.cancel(&wc).await.unwrap();
    assert!(a.describe(n.as_str()).await.unwrap().is_empty());
}

/// The session's `synchronous_commit`, as its transaction sees it.
#[cfg(feature = "postgres")]
const COMMIT_SETTING: &str = "SELECT current_setting('synchronous_commit')";

/// [`COMMIT_SETTING`]'s answer on `on` (a pool: a fresh session's, the server's default).
#[cfg(feature = "postgres")]
async fn commit_setting<'c, E: sqlx::Executor<'c, Database = sqlx::Any>>(on: E) -> String {
    sqlx::query(COMMIT_SETTING)
        .fetch_one(on)
        .await
        .unwrap()
        .try_get(0)
        .unwrap()
}

/// The release function in a transaction of the test's own: its answer, and the commit setting
/// it left for that transaction.
#[cfg(feature = "postgres")]
async fn release_in_own_transaction(b: &SqlBackend, name: &str, owner: &str) -> (i64, String) {
    let mut tx = b.inner.pool.begin().await.unwrap();
    let answer: i64 = sqlx::query(&b.inner.st.release_fn)
        .bind(name)
        .bind(owner)
        .bind(false)
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
    let commit = commit_setting(&mut *tx).await;
    tx.commit().await.unwrap();
    (answer, commit)
}

/// A release with nobody waiting commits without waiting for the WAL flush (it writes no
/// fence; a lost one leaves a hold that ends with its lease); a release that hands the lock on
/// writes the next fence and commits synced.
#[cfg(feature = "postgres")]
async fn postgres_only_releases_that_hand_nothing_on_skip_the_flush() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_flush").await;
    let b = open_isolated(d, "dlt_flush").await;
    let n = name(&uniq("flush"));
    let m = meta("m");
    let (h, w) = (
        rq(&n, "h", &m),
        Request {
            waiting: true,
            ..rq(&n, "w", &m)
        },
    );
    let server = commit_setting(&a.inner.pool).await;
    assert_ne!(server, "off", "the server does not sync commits at all");
    token(a.acquire(&h).await.unwrap());
    let (answer, commit) = release_in_own_transaction(&a, n.as_str(), "h").await;
    assert_eq!((answer, commit.as_str()), (fast::RELEASED, "off"));
    let t = token(a.acquire(&h).await.unwrap());
    busy(b.acquire(&w).await.unwrap());
    let (answer, commit) = release_in_own_transaction(&a, n.as_str(), "h").await;
    assert_eq!((answer, commit), (fast::HANDED_OFF, server));
    assert_eq!(
        stored_fence(&a, n.as_str()).await,
        i64::try_from(t).unwrap() + 1
    );
    b.wait(
        &w,
        &Busy::default(),
        Instant::now() + Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(token(b.acquire(&w).await.unwrap()), t + 1);
    assert_eq!(b.release(&hr(&w)).await.unwrap(), Released::Released);
}

/// The commit setting that `statements` leave for the transaction they run in (then rolled
/// back).
#[cfg(feature = "postgres")]
async fn commit_setting_after<'q>(
    b: &SqlBackend,
    statements: Vec<sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>>,
) -> String {
    let mut tx = b.inner.pool.begin().await.unwrap();
    for q in statements {
        q.execute(&mut *tx).await.unwrap();
    }
    let commit = commit_setting(&mut *tx).await;
    tx.rollback().await.unwrap();
    commit
}

/// A transaction that writes a queue place (a refused fair waiter's, or a waiting writer's)
/// commits without waiting for the WAL flush; the statements of a grant leave the server's
/// setting.
#[cfg(feature = "postgres")]
async fn postgres_queue_places_skip_the_flush() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_flush").await;
    let n = name(&uniq("placeflush"));
    let m = meta("m");
    let w = Request {
        waiting: true,
        fair: true,
        ..rq(&n, "w", &m)
    };
    let st = &a.inner.st;
    let server = commit_setting(&a.inner.pool).await;
    assert_ne!(server, "off", "the server does not sync commits at all");
    // The statements of a grant that removes the grantee's place.
    let grant = vec![
        sqlx::query(&st.lock_fence_now).bind(n.as_str()),
        sqlx::query(&st.bump_fence).bind(n.as_str()),
        sqlx::query(&st.del_queue_owner).bind(n.as_str()).bind("w"),
        bind_hold(sqlx::query(&st.insert_hold), &w, 1, 0, 0),
    ];
    assert_eq!(commit_setting_after(&a, grant).await, server);
    let insert = bind_waiter(sqlx::query(&st.insert_queue), &w, i64::MAX / 2);
    assert_eq!(commit_setting_after(&a, vec![insert]).await, "off");
    // A place that is there, moved on.
    bind_waiter(sqlx::query(&st.insert_queue), &w, i64::MAX / 2)
        .execute(&a.inner.pool)
        .await
        .unwrap();
    let refresh = sqlx::query(&st.refresh_queue)
        .bind(i64::MAX / 2)
        .bind(n.as_str())
        .bind("w");
    assert_eq!(commit_setting_after(&a, vec![refresh]).await, "off");
    a.cancel(&w).await.unwrap();
    assert!(a.describe(n.as_str()).await.unwrap().is_empty());
}

/// An observer (an election's follower: it watches without attempting) registers to be woken,
/// and a release with nobody else waiting wakes it.
#[cfg(feature = "postgres")]
async fn postgres_observers_are_woken() {
    let d = Dialect::Postgres;
    let a = open_isolated(d, "dlt_observe").await;
    let b = open_isolated(d, "dlt_observe").await;
    let n = name(&uniq("observe"));
    let m = meta("m");
    let h = rq(&n, "h", &m);
    token(a.acquire(&h).await.unwrap());
    let w = Request {
        waiting: true,
        ..rq(&n, "observer", &m)
    };
    let mut acq = b.begin(&w);
    assert!(acq.mark());
    let busy = Busy::default();
    let first = acq
        .changed(&busy, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(first, Watch::Recheck, "registered, then it looks");
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let at = Instant::now();
        assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
        at
    };
    let (watch, released) = tokio::join!(
        acq.changed(&busy, Instant::now() + Duration::from_secs(5)),
        releaser
    );
    assert_eq!(watch.unwrap(), Watch::Changed);
    let after = released.elapsed();
    assert!(after < Duration::from_millis(150), "woke {after:?} after");
    drop(acq);
    // Its registration goes with it: the next release wakes nobody.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut l = table_listener("dlt_observe").await;
    token(a.acquire(&h).await.unwrap());
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
    assert!(notifications(&mut l, Duration::from_millis(300))
        .await
        .is_empty());
}

/// The index of the holds does not keep the entries of released holds (issue 20: on a server
/// without autovacuum, a table that has grown makes the planner read a name's holds with a
/// bitmap scan, which never marks the entries of dead rows, so every look of a hot name read
/// every hold it ever had): 1 000 grants of one name leave the index no bigger than two pages
/// more.
#[cfg(feature = "postgres")]
async fn postgres_released_holds_leave_the_index() {
    let d = Dialect::Postgres;
    let table = own_table("dlt_churn");
    let setup = open(d, &table).await;
    // A table grown by earlier churn (dead rows of other names, never vacuumed).
    for stmt in [
        format!(
            "INSERT INTO {table} (name, owner, kind, permits, mode, fence, expires_at_ms, \
             acquired_at_ms, client_id, host, pid) SELECT 'old/' || i, 'o' || i, 'mutex', 0, \
             'exclusive', 1, 0, 0, 'c', 'h', 1 FROM generate_series(1, 20000) i"
        ),
        format!("DELETE FROM {table} WHERE name LIKE 'old/%'"),
    ] {
        sqlx::query(&stmt).execute(&setup.inner.pool).await.unwrap();
    }
    let index_size = |b: &SqlBackend| {
        let (pool, table) = (b.inner.pool.clone(), table.clone());
        async move {
            sqlx::query(&format!(
                "SELECT pg_relation_size('{table}_name_owner')::bigint"
            ))
            .fetch_one(&pool)
            .await
            .unwrap()
            .try_get::<i64, _>(0)
            .unwrap()
        }
    };
    let before = index_size(&setup).await;
    // A new client: its sessions plan their statements against the grown table.
    let a = open(d, &table).await;
    let n = name(&uniq("churn"));
    let m = meta("m");
    for i in 0..1_000 {
        let owner = format!("o{i}");
        let r = rq(&n, &owner, &m);
        token(a.acquire(&r).await.unwrap());
        assert_eq!(a.release(&hr(&r)).await.unwrap(), Released::Released);
    }
    let grown = index_size(&a).await - before;
    drop_tables(&a, &table).await;
    for stmt in fast::drop_sql(d, &table) {
        sqlx::query(&stmt).execute(&a.inner.pool).await.unwrap();
    }
    assert!(grown <= 16 * 1024, "the index grew by {grown} bytes");
}

/// The grant routine's compare-and-set: an attempt that looked at a free name while another
/// transaction was granting it (the fence row locked, a hold inserted, not yet committed) waits
/// for that transaction and then refuses; it never grants beside it. Both the name's first
/// grant (the fence row's insert) and a later one (its update).
#[cfg(feature = "postgres")]
async fn postgres_a_grant_in_progress_wins_the_race() {
    let d = Dialect::Postgres;
    let table = own_table("dlt_cas");
    let a = Arc::new(open(d, &table).await);
    let m = meta("m");
    let (used, fresh) = (name(&uniq("used")), name(&uniq("fresh")));
    // `used` has a fence row (fence 1); `fresh` has none.
    let r0 = rq(&used, "first", &m);
    assert_eq!(token(a.acquire(&r0).await.unwrap()), 1);
    assert_eq!(a.release(&hr(&r0)).await.unwrap(), Released::Released);
    for (n, take_fence) in [
        (
            &used,
            format!("UPDATE {table}_fences SET fence = fence + 1 WHERE name = '{used}'"),
        ),
        (
            &fresh,
            format!("INSERT INTO {table}_fences (name, fence) VALUES ('{fresh}', 1)"),
        ),
    ] {
        let mut tx = a.inner.pool.begin().await.unwrap();
        sqlx::query(&take_fence).execute(&mut *tx).await.unwrap();
        sqlx::query(&format!(
            "INSERT INTO {table} (name, owner, kind, permits, mode, fence, expires_at_ms, \
             acquired_at_ms, client_id, host, pid) VALUES ('{n}', 'granting', 'mutex', 0, \
             'exclusive', 99, floor(extract(epoch from clock_timestamp()) * 1000)::bigint \
             + 60000, 0, 'c', 'h', 1)"
        ))
        .execute(&mut *tx)
        .await
        .unwrap();
        let before = fast_counts(&a);
        let attempt = tokio::spawn({
            let (a, n, m) = (a.clone(), n.clone(), m.clone());
            async move { a.acquire(&rq(&n, "racer", &m)).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !attempt.is_finished(),
            "the attempt saw {n} free and waits for the grant in progress"
        );
        tx.commit().await.unwrap();
        let retry = busy(attempt.await.unwrap().unwrap()).retry_in.unwrap();
        assert!(retry > Duration::from_secs(50), "{retry:?}");
        let after = fast_counts(&a);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1, after.2 - before.2),
            (0, 1, 0),
            "refused by the routine itself, after its second look"
        );
    }
    drop_tables(&a, &table).await;
    for stmt in fast::drop_sql(d, &table) {
        sqlx::query(&stmt).execute(&a.inner.pool).await.unwrap();
    }
}

/// Grants of many new names at once go in batches (`batch.rs`) while every connection's slot is
/// taken: each name is granted once with the next fence, a name that is held or has an expired
/// hold is left to the routine (refused, or granted by the full path with the next fence), and
/// the tokens of a second burst on the same names go on from the first.
async fn grants_of_many_names_go_in_batches(d: Dialect) {
    let table = own_table("dlt_batch");
    let a = Arc::new(open(d, &table).await);
    let other = open(d, &table).await;
    let base = uniq("batch");
    let m = meta("m");
    let held = name(&format!("{base}/held"));
    let expired = name(&format!("{base}/expired"));
    token(other.acquire(&rq(&held, "other", &m)).await.unwrap());
    let short = Request {
        lease: Duration::from_millis(50),
        ..rq(&expired, "other", &m)
    };
    token(other.acquire(&short).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let names: Vec<LockName> = (0..120)
        .map(|i| name(&format!("{base}/{i}")))
        .chain([held.clone(), expired.clone()])
        .collect();
    let burst = |round: u64| {
        let tasks: Vec<_> = names
            .iter()
            .map(|n| {
                let (a, n, m) = (a.clone(), n.clone(), m.clone());
                tokio::spawn(async move {
                    let owner = format!("o{round}-{n}");
                    a.acquire(&rq(&n, &owner, &m)).await.unwrap()
                })
            })
            .collect();
        async move {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        }
    };
    let first = burst(1).await;
    let [batches, batched] = &a.inner.batched;
    let (batches, batched) = (
        batches.load(Ordering::Relaxed),
        batched.load(Ordering::Relaxed),
    );
    assert!(
        batches >= 1 && batched >= 2,
        "batches {batches}, grants in them {batched}"
    );
    for (n, at) in names.iter().zip(&first) {
        match n {
            n if *n == held => assert!(matches!(at, Attempt::Busy(_)), "{at:?}"),
            n if *n == expired => assert_eq!(token(at.clone()), 2),
            _ => assert_eq!(token(at.clone()), 1, "{n}"),
        }
    }
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as(&format!("SELECT name, owner, fence FROM {table}"))
            .fetch_all(&a.inner.pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), names.len(), "one hold per name");
    for (n, owner, fence) in &rows {
        let want = if *n == held.as_str() {
            "other".to_owned()
        } else {
            format!("o1-{n}")
        };
        assert_eq!(owner, &want);
        assert_eq!(
            *fence,
            if *n == held.as_str() {
                1
            } else if *n == expired.as_str() {
                2
            } else {
                1
            }
        );
    }
    // Released, and taken again in a burst: the next fence of each name.
    sqlx::query(&format!("DELETE FROM {table} WHERE owner LIKE 'o1-%'"))
        .execute(&a.inner.pool)
        .await
        .unwrap();
    let second = burst(2).await;
    for (n, at) in names.iter().zip(second) {
        match n {
            n if *n == held => assert!(matches!(at, Attempt::Busy(_))),
            n if *n == expired => assert_eq!(token(at), 3),
            _ => assert_eq!(token(at), 2, "{n}"),
        }
    }
    assert!(a.inner.batched[0].load(Ordering::Relaxed) > batches);
    // A batch whose callers went away while it ran: its grants are released again.
    let gone: Vec<LockName> = (0..2).map(|i| name(&format!("{base}/gone{i}"))).collect();
    let jobs = gone
        .iter()
        .map(|n| {
            let (answer, rx) = tokio::sync::oneshot::channel();
            drop(rx);
            let item = batch::Ask {
                want: Want::new(&rq(n, "o-gone", &m)),
                reg: None,
            };
            group::Job { item, answer }
        })
        .collect();
    group::Batcher::send(&batch::Granting(a.inner.clone()), jobs).await;
    let (fences, holds) = (
        stored_fence(&a, gone[0].as_str()).await,
        format!("SELECT COUNT(*) FROM {table} WHERE owner = 'o-gone'"),
    );
    assert_eq!(fences, 1, "granted by the batch");
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let left: i64 = sqlx::query_scalar(&holds)
            .fetch_one(&a.inner.pool)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < until, "{left} abandoned grants still held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop_tables(&a, &table).await;
}

#[cfg(feature = "mysql")]
async fn mysql_polls_and_respects_until() {
    let d = Dialect::MySql;
    let a = open_isolated(d, "dlt_poll").await;
    let b = open_isolated(d, "dlt_poll").await;
    assert!(matches!(b.capabilities().wakeups, Wakeups::Polling { .. }));
    let n = name(&uniq("poll"));
    let (ma, mb) = (meta("a"), meta("b"));
    let h = rq(&n, "h", &ma);
    let w = rq(&n, "w", &mb);
    token(a.acquire(&h).await.unwrap());
    let bz = busy(b.acquire(&w).await.unwrap());
    let start = Instant::now();
    b.wait(&w, &bz, start + Duration::from_millis(150))
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_millis(600),
        "{took:?}"
    );
    a.release(&hr(&h)).await.unwrap();
    let start = Instant::now();
    b.wait(&w, &bz, start + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_millis(300));
    token(b.acquire(&w).await.unwrap());
}

/// Attempts `r` and waits between attempts as the core does (a fair waiter's slice at most),
/// until it is granted; its token.
#[cfg(feature = "mysql")]
async fn wait_until_granted(b: &SqlBackend, r: &Request<'_>, within: Duration) -> u64 {
    let until = Instant::now() + within;
    loop {
        let bz = match b.acquire(r).await.unwrap() {
            Attempt::Granted(g) => return g.token.unwrap(),
            Attempt::Busy(bz) => bz,
        };
        assert!(
            Instant::now() < until,
            "{} not granted within {within:?}",
            r.owner
        );
        let slice = Instant::now() + QUEUE_PLACE_TTL / 4;
        b.wait(r, &bz, until.min(slice)).await.unwrap();
    }
}

/// Asserts that a grant came after `event`, and within 0.5 s of it (a waiter's slice is 1.25 s).
#[cfg(feature = "mysql")]
fn granted_soon_after(granted: Instant, event: Instant, what: &str) {
    let after = granted.saturating_duration_since(event);
    assert!(
        granted > event && after < Duration::from_millis(500),
        "{what}: granted {after:?} after it"
    );
}

/// The table of the bell tests.
#[cfg(feature = "mysql")]
const BELL_TABLE: &str = "dlt_bell";

/// Three clients of one MySQL table and a new name, which `a` holds with a fair hold while `b`
/// and then `c` wait for it in the fair queue.
#[cfg(feature = "mysql")]
struct FairThree {
    a: SqlBackend,
    b: SqlBackend,
    c: SqlBackend,
    n: LockName,
    metas: [HolderMeta; 3],
}

#[cfg(feature = "mysql")]
impl FairThree {
    async fn held(prefix: &str) -> FairThree {
        let d = Dialect::MySql;
        let t = FairThree {
            a: open_isolated(d, BELL_TABLE).await,
            b: open_isolated(d, BELL_TABLE).await,
            c: open_isolated(d, BELL_TABLE).await,
            n: name(&uniq(prefix)),
            metas: [meta("a"), meta("b"), meta("c")],
        };
        t.queue().await;
        t
    }

    /// `a` takes the hold, then `b` and `c` queue behind it.
    async fn queue(&self) {
        let (h, wb, wc) = self.reqs();
        token(self.a.acquire(&h).await.unwrap());
        busy(self.b.acquire(&wb).await.unwrap());
        busy(self.c.acquire(&wc).await.unwrap());
    }

    /// The fair requests of `a` (the holder), `b` and `c`.
    fn reqs(&self) -> (Request<'_>, Request<'_>, Request<'_>) {
        let fair = |owner, m| Request {
            fair: true,
            waiting: true,
            ..rq(&self.n, owner, m)
        };
        let [ma, mb, mc] = &self.metas;
        (fair("h", ma), fair("wb", mb), fair("wc", mc))
    }
}

/// MySQL: a fair waiter behind a holder that has its name's bell does not poll, and the
/// holder's release wakes it (`bell.rs`).
#[cfg(feature = "mysql")]
async fn mysql_fair_waiters_are_rung_not_polled() {
    let t = FairThree::held("bell").await;
    c_is_rung_behind_b(&t).await;
    assert!(t.b.inner.bells.as_ref().unwrap().open() >= 1);
}

/// The server's ids of `x`'s idle bell connections, once there are any (its bells are freed in
/// the background after a release).
#[cfg(feature = "mysql")]
async fn idle_bell_ids(x: &SqlBackend) -> Vec<i64> {
    let bells = x.inner.bells.as_ref().unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let ids = bells.idle_ids().await;
        if !ids.is_empty() {
            return ids;
        }
        assert!(Instant::now() < until, "no idle bell connection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// MySQL: a reused idle bell connection that the server has closed is replaced, so the next
/// waits are rung again instead of polling.
#[cfg(feature = "mysql")]
async fn mysql_dead_idle_bell_connections_are_replaced() {
    let t = FairThree::held("idle").await;
    c_is_rung_behind_b(&t).await;
    // b's and c's bells go back to idle connections (freed in the background): kill those at
    // the server.
    for x in [&t.b, &t.c] {
        for id in idle_bell_ids(x).await {
            sqlx::query(&format!("KILL {id}"))
                .execute(&t.a.inner.pool)
                .await
                .unwrap();
        }
    }
    t.queue().await;
    c_is_rung_behind_b(&t).await;
}

/// MySQL: idle bell connections are closed once unused for their idle time, with nothing else
/// going on in the client (a client whose waits are over keeps no connections for them).
#[cfg(feature = "mysql")]
async fn mysql_idle_bell_connections_are_closed() {
    let t = FairThree::held("idle-close").await;
    for x in [&t.b, &t.c] {
        x.inner
            .bells
            .as_ref()
            .unwrap()
            .set_idle_for(Duration::from_millis(600));
    }
    c_is_rung_behind_b(&t).await;
    let mut ids = idle_bell_ids(&t.b).await;
    ids.extend(idle_bell_ids(&t.c).await);
    // Closed some time after their idle time (a bell freed in the background goes idle later
    // than the snapshot above, and a loaded machine is slow): polled, within a bound that an
    // idle connection never closed does not meet.
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open: usize = [&t.b, &t.c]
            .iter()
            .map(|x| x.inner.bells.as_ref().unwrap().open())
            .sum();
        let left: i64 = sqlx::query(&format!(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.PROCESSLIST \
             WHERE ID IN ({list})"
        ))
        .fetch_one(&t.a.inner.pool)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
        if open == 0 && left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} bell connections open in the clients, {left} of {list} at the server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With `a` holding and `b`, `c` queued (FairThree::queue): `a` releases after 300 ms; `b`, which
/// asked for the bell first, holds the lock and the bell for 1.5 s while `c` waits. `c` looks at
/// most once in that time (the bell wakes it), and is granted soon after `b`'s release.
#[cfg(feature = "mysql")]
async fn c_is_rung_behind_b(t: &FairThree) {
    let (a, b, c) = (&t.a, &t.b, &t.c);
    let (h, wb, wc) = t.reqs();
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        a.release(&hr(&h)).await.unwrap();
    };
    // b asks for the bell first: nobody has it, so b takes it and polls behind a's hold; then b
    // holds the lock and the bell for 1.5 s while c waits.
    let b_turn = async {
        wait_until_granted(b, &wb, Duration::from_secs(10)).await;
        let looks = c.inner.looks.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let looked = c.inner.looks.load(Ordering::Relaxed) - looks;
        let at = Instant::now();
        assert_eq!(b.release(&hr(&wb)).await.unwrap(), Released::Released);
        (looked, at)
    };
    let c_turn = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        wait_until_granted(c, &wc, Duration::from_secs(10)).await;
        Instant::now()
    };
    let ((), (looked, released), granted) = tokio::join!(releaser, b_turn, c_turn);
    assert!(looked <= 1, "c looked {looked} times behind b's hold");
    granted_soon_after(granted, released, "c after b's release");
    c.release(&hr(&wc)).await.unwrap();
}

/// MySQL: a fair waiter that gets the bell while another is ahead of it in the queue passes it
/// on, so the one ahead polls behind a holder without the bell and is granted soon after the
/// release (instead of at the end of its slice).
#[cfg(feature = "mysql")]
async fn mysql_a_bell_out_of_turn_is_passed_on() {
    let t = FairThree::held("pass").await;
    let (a, b, c) = (&t.a, &t.b, &t.c);
    // The queue: wb, then wc; but wc asks for the bell first.
    let (h, wb, wc) = t.reqs();
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let at = Instant::now();
        a.release(&hr(&h)).await.unwrap();
        at
    };
    let b_turn = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        wait_until_granted(b, &wb, Duration::from_secs(10)).await;
        let granted = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let at = Instant::now();
        b.release(&hr(&wb)).await.unwrap();
        (granted, at)
    };
    let c_turn = async {
        wait_until_granted(c, &wc, Duration::from_secs(10)).await;
        Instant::now()
    };
    let (a_released, (b_granted, b_released), c_granted) = tokio::join!(releaser, b_turn, c_turn);
    granted_soon_after(b_granted, a_released, "b after a's release");
    granted_soon_after(c_granted, b_released, "c after b's release");
    c.release(&hr(&wc)).await.unwrap();
}

/// MySQL: a holder that leaves its hold to expire (`expire_in`: renewed once with `detach`, never
/// released) frees its bell then, so the next waiter polls for the hold's end instead of sleeping
/// through it to the end of its slice.
#[cfg(feature = "mysql")]
async fn mysql_a_hold_left_to_expire_frees_its_bell() {
    let t = FairThree::held("expire").await;
    let (a, b, c) = (&t.a, &t.b, &t.c);
    let (h, wb, wc) = t.reqs();
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        a.release(&hr(&h)).await.unwrap();
    };
    // b is granted with the bell; it leaves its hold to expire in 400 ms.
    let b_turn = async {
        wait_until_granted(b, &wb, Duration::from_secs(10)).await;
        let left = Duration::from_millis(400);
        let hold = HoldRef {
            lease: left,
            ..hr(&wb)
        };
        let answer = b.extend(std::slice::from_ref(&hold), true).await.unwrap();
        assert!(matches!(answer[..], [Extended::Held { .. }]), "{answer:?}");
        Instant::now() + left
    };
    let c_turn = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        wait_until_granted(c, &wc, Duration::from_secs(10)).await;
        Instant::now()
    };
    let ((), expires, granted) = tokio::join!(releaser, b_turn, c_turn);
    let after = granted.saturating_duration_since(expires);
    assert!(
        after < Duration::from_millis(400),
        "c granted {after:?} after b's hold expired"
    );
    c.release(&hr(&wc)).await.unwrap();
}

/// MySQL: a bell's connection killed at the server (while its holder polls as the waiter in
/// front, and again while it holds the lock) costs the waiters nothing but polling: no error,
/// and each is granted in turn.
#[cfg(feature = "mysql")]
async fn mysql_killed_bell_connections_fall_back_to_polling() {
    let t = FairThree::held("killed").await;
    let (a, b, c) = (&t.a, &t.b, &t.c);
    let (h, wb, wc) = t.reqs();
    let key = super::super::bell::bell_key(BELL_TABLE, t.n.as_str());
    // Kills the session that holds the bell.
    let kill_the_bell = || {
        let (pool, key) = (a.inner.pool.clone(), key.clone());
        async move {
            let id: i64 = sqlx::query("SELECT CAST(COALESCE(IS_USED_LOCK(?), 0) AS SIGNED)")
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap()
                .try_get(0)
                .unwrap();
            assert!(id > 0, "nobody holds the bell");
            sqlx::query(&format!("KILL {id}"))
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    let script = async {
        // b holds the bell and polls behind a's hold; c asks for it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        kill_the_bell().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.release(&hr(&h)).await.unwrap();
    };
    let b_turn = async {
        wait_until_granted(b, &wb, Duration::from_secs(10)).await;
        // b holds the lock; whoever holds the bell now loses it too.
        tokio::time::sleep(Duration::from_millis(100)).await;
        kill_the_bell().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let at = Instant::now();
        b.release(&hr(&wb)).await.unwrap();
        at
    };
    let c_turn = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        wait_until_granted(c, &wc, Duration::from_secs(10)).await;
        Instant::now()
    };
    let ((), released, granted) = tokio::join!(script, b_turn, c_turn);
    granted_soon_after(granted, released, "c after b's release");
    c.release(&hr(&wc)).await.unwrap();
}

/// Two clients of one MySQL table as two processes would be (their URLs differ in an option
/// that changes nothing here, so neither wakes the other's waiters in the process), and a new
/// name that `b` holds with its bell: `b` waited for it while `a` held it without one, so `b`
/// took the bell at once and polled, and holds both now.
#[cfg(feature = "mysql")]
async fn ring_pair(prefix: &str) -> (crate::Client, crate::Client, String, crate::Guard) {
    let a = crate::connect(&url(Dialect::MySql, "dlt_ring", "&ssl-mode=DISABLED"))
        .await
        .unwrap();
    let b = crate::connect(&url(Dialect::MySql, "dlt_ring", ""))
        .await
        .unwrap();
    let n = uniq(prefix);
    let first = a.mutex(n.as_str()).unwrap().acquire().await.unwrap();
    let b_turn = {
        let m = b.mutex(n.as_str()).unwrap();
        tokio::spawn(async move { m.acquire_timeout(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.release().await.unwrap();
    let held = b_turn.await.unwrap().unwrap();
    (a, b, n, held)
}

/// MySQL: the release of a non-fair hold that has its name's bell reserves the lock for the
/// bell's next holder, so a waiter of another client that asked first is granted before the
/// releasing client's own next waiter, and each grant takes the next fence.
#[cfg(feature = "mysql")]
async fn mysql_a_release_hands_the_lock_to_the_bells_next_holder() {
    let (a, b, n, b1) = ring_pair("ring").await;
    let spawn = |c: &crate::Client| {
        let m = c.mutex(n.as_str()).unwrap();
        tokio::spawn(async move {
            let g = m.acquire_timeout(Duration::from_secs(10)).await;
            (g, Instant::now())
        })
    };
    // a's waiter asks for the bell first, then b's own next waiter.
    let mut a1 = spawn(&a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut b2 = spawn(&b);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t1 = b1.token().unwrap();
    let released = Instant::now();
    b1.release().await.unwrap();
    let (a1, granted) = tokio::select! {
        a1 = &mut a1 => a1.unwrap(),
        _ = &mut b2 => panic!("b's own waiter took the lock back first"),
    };
    let a1 = a1.unwrap();
    granted_soon_after(granted, released, "a's waiter after b's release");
    assert_eq!(a1.token(), Some(t1 + 1));
    // a's waiter took the bell with the lock: its release hands it to b's waiter.
    a1.release().await.unwrap();
    let (b2, _) = b2.await.unwrap();
    let b2 = b2.unwrap();
    assert_eq!(b2.token(), Some(t1 + 2));
    b2.release().await.unwrap();
    assert!(a.list(&n).await.unwrap().is_empty());
}

/// MySQL: a bell holder's release that nobody waits for leaves no reservation behind (a try
/// right after it is granted), and neither does a waiter that gave up while it asked for the
/// bell.
#[cfg(feature = "mysql")]
async fn mysql_a_reservation_for_nobody_goes_at_once() {
    let (a, b, n, b1) = ring_pair("unrung").await;
    // a's waiter gives up while it waits for the bell behind b's hold.
    let e = a
        .mutex(n.as_str())
        .unwrap()
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    let t1 = b1.token().unwrap();
    b1.release().await.unwrap();
    let g = a.mutex(n.as_str()).unwrap().try_acquire().await.unwrap();
    assert_eq!(g.token(), Some(t1 + 1), "no fence spent on nobody");
    g.release().await.unwrap();
    assert!(b.list(&n).await.unwrap().is_empty());
}

/// MySQL: a non-fair hold granted after a refusal but without the bell (another client's waiter
/// had it and polled) is released without waking its own client's waiters: the release answers
/// `HandedOff` while a session holds the bell, and the bell's holder is granted next.
#[cfg(feature = "mysql")]
async fn mysql_a_holder_without_the_bell_leaves_the_lock_to_the_bells_holder() {
    let d = Dialect::MySql;
    let a = open_isolated(d, "dlt_ring").await;
    let b = open_isolated(d, "dlt_ring").await;
    let n = name(&uniq("unbelled"));
    let (ma, mb) = (meta("a"), meta("b"));
    let waiting = |owner, m| Request {
        waiting: true,
        ..rq(&n, owner, m)
    };
    let h = rq(&n, "h", &ma);
    let (wa, wb) = (waiting("wa", &ma), waiting("wb", &mb));
    token(a.acquire(&h).await.unwrap());
    // b's waiter takes the bell (nobody has it) and polls behind h; a's waiter asks for the
    // bell behind it.
    let bz = busy(b.acquire(&wb).await.unwrap());
    b.wait(&wb, &bz, Instant::now() + Duration::from_millis(200))
        .await
        .unwrap();
    let az = busy(a.acquire(&wa).await.unwrap());
    a.wait(&wa, &az, Instant::now() + Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
    // a's waiter is granted first (as a's own next waiter would be, woken in its process),
    // without the bell.
    token(a.acquire(&wa).await.unwrap());
    assert_eq!(
        a.release(&hr(&wa)).await.unwrap(),
        Released::HandedOff,
        "b's waiter holds the bell: a's release must not wake a's own waiters"
    );
    let granted = wait_until_granted(&b, &wb, Duration::from_secs(5)).await;
    assert!(granted > 0);
    b.release(&hr(&wb)).await.unwrap();
}

/// MySQL: a non-fair waiter of a name its client saw busy lately attempts in the ring routine,
/// not the grant routine. Refused there, it is in the bell's line at once and takes the lock
/// its holder's release reserves; on a free name it is granted there, without the bell; a
/// waiter that gives up in the line leaves no hold, reservation or spent fence behind.
#[cfg(feature = "mysql")]
async fn mysql_a_name_seen_busy_is_attempted_in_the_ring() {
    let d = Dialect::MySql;
    let a = open_isolated(d, "dlt_ring").await;
    let b = open_isolated(d, "dlt_ring").await;
    let n = name(&uniq("tried"));
    let (ma, mb) = (meta("a"), meta("b"));
    let waiting = |owner, m| Request {
        waiting: true,
        ..rq(&n, owner, m)
    };
    let (w1, w2, w3, w4) = (
        waiting("w1", &mb),
        waiting("w2", &mb),
        waiting("w3", &mb),
        waiting("w4", &mb),
    );
    let h = rq(&n, "h", &ma);
    let t0 = token(a.acquire(&h).await.unwrap());
    // b's first waiter is refused by the grant routine and takes the bell (it polls behind h).
    let bz = busy(b.acquire(&w1).await.unwrap());
    assert_eq!(fast_counts(&b), (0, 1, 0));
    b.wait(&w1, &bz, Instant::now() + Duration::from_millis(200))
        .await
        .unwrap();
    // Its second is refused in the ring routine, which asks for the bell behind w1.
    let bz2 = busy(b.acquire(&w2).await.unwrap());
    assert_eq!(
        fast_counts(&b),
        (0, 1, 0),
        "w2 must attempt in the ring routine"
    );
    assert!(bz2.retry_in.is_some_and(|r| r > Duration::from_secs(1)));
    assert_eq!(a.release(&hr(&h)).await.unwrap(), Released::Released);
    assert_eq!(
        wait_until_granted(&b, &w1, Duration::from_secs(5)).await,
        t0 + 1
    );
    // w1 has the bell: its release reserves the lock for w2, whose ring takes it.
    assert_eq!(b.release(&hr(&w1)).await.unwrap(), Released::HandedOff);
    assert_eq!(
        wait_until_granted(&b, &w2, Duration::from_secs(5)).await,
        t0 + 2
    );
    b.release(&hr(&w2)).await.unwrap();
    // A free name: granted in the ring routine, without a call of the grant routine.
    let before = fast_counts(&b);
    assert_eq!(token(b.acquire(&w3).await.unwrap()), t0 + 3);
    assert_eq!(fast_counts(&b), before);
    assert_eq!(b.release(&hr(&w3)).await.unwrap(), Released::Released);
    // A waiter that gives up in the line.
    let h2 = rq(&n, "h2", &ma);
    assert_eq!(token(a.acquire(&h2).await.unwrap()), t0 + 4);
    let bz4 = busy(b.acquire(&w4).await.unwrap());
    assert_eq!(fast_counts(&b), before);
    b.wait(&w4, &bz4, Instant::now() + Duration::from_millis(200))
        .await
        .unwrap();
    b.cancel(&w4).await.unwrap();
    a.release(&hr(&h2)).await.unwrap();
    let x = rq(&n, "x", &ma);
    assert_eq!(
        token(a.acquire(&x).await.unwrap()),
        t0 + 5,
        "nothing left behind"
    );
    // A fair waiter's queue place and no hold: the ring's attempt answers "full path", which
    // is taken at once, without the grant routine's call to say it again.
    let fair = Request {
        waiting: true,
        fair: true,
        ..rq(&n, "fair", &ma)
    };
    busy(a.acquire(&fair).await.unwrap());
    a.release(&hr(&x)).await.unwrap();
    let w5 = waiting("w5", &mb);
    busy(b.acquire(&w5).await.unwrap());
    assert_eq!(
        fast_counts(&b),
        before,
        "the full path after the ring's answer"
    );
    b.cancel(&w5).await.unwrap();
    a.cancel(&fair).await.unwrap();
    assert!(a.describe(n.as_str()).await.unwrap().is_empty());
}

/// MySQL: acquisitions dropped at any moment of an attempt in the ring routine (before it is
/// sent, while the server grants, while the answer comes back) leave no hold behind: the next
/// try of another client is granted at once, not after the 30 s lease.
///
/// The cuts spread over 0–1.25× an uncut attempt's median time, measured first on the same
/// path. They come from a thread's sleep, not tokio's timer, which rounds up to whole
/// milliseconds and so would let most attempts finish.
#[cfg(feature = "mysql")]
async fn mysql_a_dropped_ring_attempt_leaves_no_hold() {
    use rand::Rng;
    let (a, b, n, b1) = ring_pair("dropped").await;
    b1.release().await.unwrap();
    let (ma, mb) = (a.mutex(n.as_str()).unwrap(), b.mutex(n.as_str()).unwrap());
    // b sees the name busy, so its next waiter attempts in the ring routine.
    let seen_busy = || async {
        let g = ma.acquire().await.unwrap();
        let e = mb
            .acquire_timeout(Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        g.release().await.unwrap();
    };
    let mut uncut = Vec::new();
    for _ in 0..7 {
        seen_busy().await;
        let start = Instant::now();
        let g = mb.acquire().await.unwrap();
        uncut.push(start.elapsed());
        g.release().await.unwrap();
    }
    uncut.sort();
    let attempt = uncut[uncut.len() / 2];
    let span = u64::try_from((attempt * 5 / 4).as_micros()).unwrap();
    let mut granted = 0;
    for i in 0..30 {
        seen_busy().await;
        // b's waiter is dropped somewhere in its attempt on the free name.
        let cut = Duration::from_micros(rand::thread_rng().gen_range(0..=span));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            std::thread::sleep(cut);
            let _ = tx.send(());
        });
        tokio::select! {
            biased;
            g = mb.acquire() => {
                g.unwrap().release().await.unwrap();
                granted += 1;
            }
            _ = rx => {}
        }
        let start = Instant::now();
        let g = loop {
            match ma.try_acquire().await {
                Ok(g) => break g,
                Err(Error::Busy { .. }) if start.elapsed() < Duration::from_secs(3) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("round {i}: the name stayed held after a dropped attempt: {e}"),
            }
        };
        g.release().await.unwrap();
    }
    assert!(
        granted <= 27,
        "{granted} of 30 attempts finished before their cut (an uncut attempt: {attempt:?})"
    );
}

/// MySQL: a non-fair waiter that holds its name's bell while only the fair queue refuses it (no
/// hold in the way) passes the bell on, so the queue's head, which waits for that bell, is woken
/// by the release, not at the end of its wait slice.
#[cfg(feature = "mysql")]
async fn mysql_a_non_fair_bell_holder_lets_the_fair_head_in() {
    let d = Dialect::MySql;
    let a = open_isolated(d, "dlt_ring").await;
    let b = open_isolated(d, "dlt_ring").await;
    let c = open_isolated(d, "dlt_ring").await;
    let n = name(&uniq("mixed"));
    let (ma, mb, mc) = (meta("a"), meta("b"), meta("c"));
    let h = rq(&n, "h", &ma);
    token(a.acquire(&h).await.unwrap());
    // c's non-fair waiter takes the bell (nobody has it) and polls behind h.
    let plain = Request {
        waiting: true,
        ..rq(&n, "plain", &mc)
    };
    let pz = busy(c.acquire(&plain).await.unwrap());
    c.wait(&plain, &pz, Instant::now() + Duration::from_millis(200))
        .await
        .unwrap();
    // b's fair waiter queues and waits for the bell behind it; h is released meanwhile.
    let fair = Request {
        waiting: true,
        fair: true,
        ..rq(&n, "fair", &mb)
    };
    let fair_side = async {
        let t = wait_until_granted(&b, &fair, Duration::from_secs(10)).await;
        let at = Instant::now();
        b.release(&hr(&fair)).await.unwrap();
        (t, at)
    };
    let plain_side = async {
        let t = wait_until_granted(&c, &plain, Duration::from_secs(10)).await;
        c.release(&hr(&plain)).await.unwrap();
        t
    };
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let at = Instant::now();
        a.release(&hr(&h)).await.unwrap();
        at
    };
    let ((tf, granted), tp, released) = tokio::join!(fair_side, plain_side, release);
    granted_soon_after(granted, released, "the fair queue's head after h's release");
    assert!(tp > tf, "the queue's head first");
}

#[test]
fn bell_keys_fit_the_servers_limit() {
    assert_eq!(bell_key("dlock_locks", "jobs/1"), "dlock_locks!jobs/1");
    let long = bell_key("dlock_locks", &"x".repeat(100));
    assert!(
        long.starts_with("dlock_locks!#") && long.len() == 13 + 16,
        "{long}"
    );
    assert_ne!(bell_key("t", "a"), mysql_lock_name("t", "a"));
}

#[test]
fn hashes_are_stable() {
    // FNV-1a 64 of "" is the offset basis; of "a" a published value.
    assert_eq!(fnv1a64("", "").wrapping_sub(0), {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        h ^= 0;
        h.wrapping_mul(0x0100_0000_01b3)
    });
    assert_ne!(advisory_key("t", "a"), advisory_key("t", "A"));
    assert_ne!(advisory_key("t", "a"), advisory_key("u", "a"));
    assert_eq!(
        mysql_lock_name("dlock_locks", "jobs/1"),
        "dlock_locks:jobs/1"
    );
    let long = mysql_lock_name("dlock_locks", &"x".repeat(100));
    assert!(
        long.starts_with("dlock_locks#") && long.len() == 12 + 16,
        "{long}"
    );
    assert_eq!(
        Dialect::Postgres.sql("a = ? AND b = ?"),
        "a = $1 AND b = $2"
    );
    assert_eq!(Dialect::MySql.sql("a = ?"), "a = ?");
}

/// What a release answers while a waiter that registered with its refused attempt waits:
/// PostgreSQL hands the lock to it, MySQL wakes nobody (its waiters poll).
fn released_to_waiter(d: Dialect) -> Released {
    match d {
        Dialect::Postgres => Released::HandedOff,
        Dialect::MySql => Released::Released,
    }
}

/// Drops the tables of `table` (a test's own table).
async fn drop_tables(b: &SqlBackend, table: &str) {
    for t in ["", "_queue", "_fences", "_meta", "_waiters"] {
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}{t}"))
            .execute(&b.inner.pool)
            .await
            .unwrap();
    }
}

/// The routine's answers so far: (granted, refused, full path).
fn fast_counts(b: &SqlBackend) -> (u64, u64, u64) {
    let [g, r, f] = &b.inner.fast_answers;
    (
        g.load(Ordering::Relaxed),
        r.load(Ordering::Relaxed),
        f.load(Ordering::Relaxed),
    )
}

/// The one-round-trip grant routine answers a free name and a plain refusal of an exclusive
/// request itself, leaves everything else (re-grants, expired rows, queue places, other kinds)
/// to the full path, is not called for shared requests or fair waiters, and always agrees with
/// the full path.
async fn grant_routine_answers_the_common_cases(d: Dialect) {
    let a = open(d, "dlt_fast").await;
    let b = open(d, "dlt_fast").await;
    assert!(
        a.inner.fast.load(Ordering::Relaxed),
        "the routine was created"
    );
    let n = name(&uniq("fast"));
    let m = meta("m");
    let ra = rq(&n, "owner-a", &m);
    let rb = rq(&n, "owner-b", &m);
    assert_eq!(token(a.acquire(&ra).await.unwrap()), 1);
    assert_eq!(fast_counts(&a), (1, 0, 0));
    let retry = busy(b.acquire(&rb).await.unwrap()).retry_in.unwrap();
    assert!(
        retry <= LONG && retry > LONG - Duration::from_secs(5),
        "{retry:?}"
    );
    assert_eq!(fast_counts(&b), (0, 1, 0));
    // the holder again: a re-grant, judged by the full path
    assert_eq!(token(a.acquire(&ra).await.unwrap()), 1);
    assert_eq!(fast_counts(&a), (1, 0, 1));
    // another kind: the full path's error
    let rw = Request {
        kind: LockKind::RwLock,
        ..rq(&n, "owner-c", &m)
    };
    assert!(matches!(b.acquire(&rw).await, Err(Error::InvalidConfig(_))));
    // a fair waiter never calls the routine (it must take a queue place)
    let fair = Request {
        fair: true,
        waiting: true,
        ..rq(&n, "fair", &m)
    };
    busy(b.acquire(&fair).await.unwrap());
    assert_eq!(fast_counts(&b), (0, 1, 1));
    // b's counts from here on: the routine refused the plain request once more on PostgreSQL
    let b_counts = if d == Dialect::Postgres {
        // the release hands the lock to the fair queue's head: the routine refuses the plain
        // request, and the head's attempt takes what it was handed without a call
        assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::HandedOff);
        busy(b.acquire(&rb).await.unwrap());
        assert_eq!(fast_counts(&b), (0, 2, 1));
        |(g, r, f): (u64, u64, u64)| (g, r + 1, f - 1)
    } else {
        assert_eq!(a.release(&hr(&ra)).await.unwrap(), Released::Released);
        // free, but a queue place: the full path refuses the plain request
        busy(b.acquire(&rb).await.unwrap());
        assert_eq!(fast_counts(&b), (0, 1, 2));
        |c: (u64, u64, u64)| c
    };
    assert_eq!(token(b.acquire(&fair).await.unwrap()), 2);
    assert_eq!(b.release(&hr(&fair)).await.unwrap(), Released::Released);
    // an expired hold row: the full path cleans it up and grants
    let short = Request {
        lease: Duration::from_millis(100),
        ..rq(&n, "short", &m)
    };
    assert_eq!(token(a.acquire(&short).await.unwrap()), 3);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(token(b.acquire(&rb).await.unwrap()), 4);
    assert_eq!(fast_counts(&b), b_counts((0, 1, 3)));
    assert_eq!(b.release(&hr(&rb)).await.unwrap(), Released::Released);
    // readers and semaphore permits never call the routine
    let (r1, r2) = (
        Request {
            kind: LockKind::RwLock,
            mode: Mode::Shared,
            ..rq(&n, "r1", &m)
        },
        Request {
            kind: LockKind::RwLock,
            mode: Mode::Shared,
            ..rq(&n, "r2", &m)
        },
    );
    assert_eq!(token(a.acquire(&r1).await.unwrap()), 5);
    assert_eq!(token(b.acquire(&r2).await.unwrap()), 6);
    assert_eq!(fast_counts(&a), (2, 0, 1));
    assert_eq!(fast_counts(&b), b_counts((0, 1, 3)));
    for r in [&r1, &r2] {
        assert_eq!(a.release(&hr(r)).await.unwrap(), Released::Released);
    }
    // the row the routine wrote is the full path's row, its lease the requested one (on the
    // database clock)
    let lease = Request {
        lease: Duration::from_millis(150),
        ..rq(&n, "lease", &m)
    };
    assert_eq!(token(a.acquire(&lease).await.unwrap()), 7);
    assert_eq!(fast_counts(&a), (3, 0, 1));
    let info = a.describe(n.as_str()).await.unwrap();
    assert_eq!(info[0].kind, LockKind::Mutex);
    assert_eq!(info[0].holders.len(), 1);
    let h = &info[0].holders[0];
    assert_eq!(h.owner, "lease");
    assert_eq!(h.mode, Mode::Exclusive);
    assert_eq!(h.meta.client_id, "m");
    assert_eq!(h.meta.host, "testhost");
    assert_eq!(h.meta.pid, 42);
    assert_eq!(h.token, Some(7));
    assert!(h.lease_left_ms.unwrap() <= 150, "{:?}", h.lease_left_ms);
    busy(b.acquire(&rb).await.unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(token(b.acquire(&rb).await.unwrap()), 8);
    assert_eq!(stored_fence(&a, n.as_str()).await, 8);
}

/// A dropped routine is noticed and the backend carries on with the full path; the next backend
/// to open the table creates it again.
async fn missing_grant_routine_falls_back(d: Dialect) {
    let table = own_table("dlt_fastgone");
    let a = open(d, &table).await;
    assert!(a.inner.fast.load(Ordering::Relaxed));
    let drop = match d {
        Dialect::Postgres => format!("DROP FUNCTION {}", fast::routine(d, &table)),
        Dialect::MySql => format!("DROP PROCEDURE {}", fast::routine(d, &table)),
    };
    sqlx::query(&drop).execute(&a.inner.pool).await.unwrap();
    let n = name(&uniq("gone"));
    let m = meta("m");
    let r = rq(&n, "o", &m);
    assert_eq!(token(a.acquire(&r).await.unwrap()), 1);
    assert!(!a.inner.fast.load(Ordering::Relaxed), "the backend noticed");
    assert_eq!(fast_counts(&a), (0, 0, 0));
    assert_eq!(a.release(&hr(&r)).await.unwrap(), Released::Released);
    let b = open(d, &table).await;
    assert!(b.inner.fast.load(Ordering::Relaxed), "created again");
    assert_eq!(token(b.acquire(&r).await.unwrap()), 2);
    assert_eq!(fast_counts(&b), (1, 0, 0));
    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
    drop_tables(&a, &table).await;
    sqlx::query(&drop).execute(&a.inner.pool).await.unwrap();
}

/// A wait that follows a busy attempt does not repeat the attempt's look when nothing was
/// reported since it was sent, and still sees a release that happened in between.
async fn wait_after_a_busy_attempt_skips_the_repeat_look(d: Dialect) {
    let a = open_isolated(d, "dlt_fresh").await;
    let other = open_isolated(d, "dlt_fresh").await;
    let n = name(&uniq("fresh"));
    let m = meta("m");
    let holder = rq(&n, "holder", &m);
    token(other.acquire(&holder).await.unwrap());
    let w = Request {
        waiting: true,
        ..rq(&n, "waiter", &m)
    };
    // Nothing happens: PostgreSQL trusts its listener and never looks; MySQL polls, but not at
    // once.
    let b = busy(a.acquire(&w).await.unwrap());
    let looks = a.inner.looks.load(Ordering::Relaxed);
    let t = Instant::now();
    a.wait(&w, &b, t + Duration::from_millis(300))
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t.elapsed()
    );
    let looked = a.inner.looks.load(Ordering::Relaxed) - looks;
    match d {
        Dialect::Postgres => assert_eq!(looked, 0),
        Dialect::MySql => assert!((1..=15).contains(&looked), "{looked}"),
    }
    // A release in another process between the attempt and the wait.
    let b = busy(a.acquire(&w).await.unwrap());
    assert_eq!(
        other.release(&hr(&holder)).await.unwrap(),
        released_to_waiter(d)
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    a.wait(&w, &b, t + Duration::from_secs(5)).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    token(a.acquire(&w).await.unwrap());
    // A release by another backend of this process between the attempt and the wait: without
    // a client (whose in-process wake-ups are the core's) it reaches the waiter as a
    // notification, and the waiter attempts without a look (PostgreSQL), or once its ring for
    // the name's bell found the name free, which is no look either (MySQL).
    let same = open(d, "dlt_fresh").await;
    let same_holder = open(d, "dlt_fresh").await;
    let n2 = name(&uniq("fresh"));
    let h2 = rq(&n2, "holder", &m);
    token(same_holder.acquire(&h2).await.unwrap());
    let w2 = Request {
        waiting: true,
        ..rq(&n2, "waiter", &m)
    };
    let b = busy(same.acquire(&w2).await.unwrap());
    assert_eq!(
        same_holder.release(&hr(&h2)).await.unwrap(),
        released_to_waiter(d)
    );
    let looks = same.inner.looks.load(Ordering::Relaxed);
    let t = Instant::now();
    same.wait(&w2, &b, t + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        same.inner.looks.load(Ordering::Relaxed),
        looks,
        "looks before the attempt"
    );
    token(same.acquire(&w2).await.unwrap());
}

/// A MySQL account without `CREATE ROUTINE` (and without rights on a routine another account
/// created) still gets working locks, through the multi-statement path.
#[cfg(feature = "mysql")]
async fn mysql_without_routine_privileges_falls_back() {
    let root = open(Dialect::MySql, "dlt_priv_shared").await;
    for host in ["%", "localhost", "127.0.0.1"] {
        for stmt in [
            format!("CREATE USER IF NOT EXISTS 'dlt_noroutine'@'{host}'"),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, INDEX, ALTER, DROP \
                 ON test.* TO 'dlt_noroutine'@'{host}'"
            ),
        ] {
            sqlx::query(&stmt).execute(&root.inner.pool).await.unwrap();
        }
    }
    let mut u = url::Url::parse(&base(Dialect::MySql)).unwrap();
    u.set_username("dlt_noroutine").unwrap();
    u.set_password(None).unwrap();
    let restricted = |table: &str| {
        let mut v = u.clone();
        v.query_pairs_mut().append_pair("table", table);
        v.to_string()
    };
    // A table of its own: the routine cannot be created.
    let table = own_table("dlt_priv");
    let b = SqlBackend::open(&restricted(&table)).await.unwrap();
    assert!(
        !b.inner.fast.load(Ordering::Relaxed),
        "no routine without CREATE ROUTINE"
    );
    let n = name(&uniq("priv"));
    let m = meta("m");
    let (r1, r2) = (rq(&n, "one", &m), rq(&n, "two", &m));
    assert_eq!(token(b.acquire(&r1).await.unwrap()), 1);
    busy(b.acquire(&r2).await.unwrap());
    assert_eq!(b.release(&hr(&r1)).await.unwrap(), Released::Released);
    assert_eq!(token(b.acquire(&r2).await.unwrap()), 2);
    assert_eq!(fast_counts(&b), (0, 0, 0));
    // A table whose routine another account created: this account cannot see it (MySQL lists
    // only routines one may use), cannot create it, and locks through the full path.
    let shared = SqlBackend::open(&restricted("dlt_priv_shared"))
        .await
        .unwrap();
    assert!(!shared.inner.fast.load(Ordering::Relaxed));
    let n2 = name(&uniq("priv"));
    let r3 = rq(&n2, "three", &m);
    assert!(token(shared.acquire(&r3).await.unwrap()) >= 1);
    assert_eq!(shared.release(&hr(&r3)).await.unwrap(), Released::Released);
    assert_eq!(fast_counts(&shared), (0, 0, 0));
    drop_tables(&root, &table).await;
}

/// A waiter's look on the real store: a fair waiter learns its place in the queue, and the
/// fingerprint of what stands in its way changes when the lock changes hands (what the core's
/// polling uses to look often while a fair queue moves and to back off behind a long hold).
async fn a_look_tells_a_fair_waiter_its_place(d: Dialect) {
    let a = open_isolated(d, "dlt_look").await;
    let other = open_isolated(d, "dlt_look").await;
    let n = name(&uniq("look"));
    let m = meta("m");
    let holder = rq(&n, "holder", &m);
    token(other.acquire(&holder).await.unwrap());
    let fair = |owner| Request {
        fair: true,
        waiting: true,
        ..rq(&n, owner, &m)
    };
    let (w0, w1, w2) = (fair("w0"), fair("w1"), fair("w2"));
    for w in [&w0, &w1, &w2] {
        busy(a.acquire(w).await.unwrap());
    }
    let look = |l: Look| match l {
        Look::Busy { state, place } => (state, place),
        Look::Free => panic!("free"),
    };
    let (s0, p0) = look(a.inner.still_busy(&w0).await.unwrap());
    let (s1, p1) = look(a.inner.still_busy(&w1).await.unwrap());
    let (_, p2) = look(a.inner.still_busy(&w2).await.unwrap());
    assert_eq!((p0, p1, p2), (Some(0), Some(1), Some(2)));
    // Looking again with nothing changed gives the same fingerprint.
    assert_eq!(look(a.inner.still_busy(&w0).await.unwrap()), (s0, p0));
    // A plain waiter has no place.
    let plain = Request {
        waiting: true,
        ..rq(&n, "plain", &m)
    };
    assert_eq!(look(a.inner.still_busy(&plain).await.unwrap()).1, None);
    // The holder releases: the head may go; the others still wait, and see the change only
    // once the head has the lock. PostgreSQL's release hands it the lock at once (its place
    // becomes its hold).
    other.release(&hr(&holder)).await.unwrap();
    if d != Dialect::Postgres {
        assert_eq!(a.inner.still_busy(&w0).await.unwrap(), Look::Free);
        assert_eq!(look(a.inner.still_busy(&w1).await.unwrap()).1, Some(1));
    }
    token(a.acquire(&w0).await.unwrap());
    let (s1b, p1b) = look(a.inner.still_busy(&w1).await.unwrap());
    assert_eq!(p1b, Some(0));
    assert_ne!(s1b, s1);
    other.release(&hr(&w0)).await.unwrap();
    for w in [&w1, &w2, &plain] {
        a.cancel(w).await.unwrap();
    }
}

/// A hold's value in lease mode: written with the grant (PostgreSQL: by the grant routine, in
/// the same row; MySQL: by the full path, the routine only grants plain holds), listed,
/// replaced only by its owner.
async fn set_value_replaces_the_holders_value_only(d: Dialect) {
    let b = open(d, "dlt_values").await;
    check_values(&b, &uniq("values"), true).await;
    let before = fast_counts(&b);
    let n = name(&uniq("values"));
    let (mv, mp) = (meta_value("v", "leader"), meta("p"));
    let rv = rq(&n, "with-value", &mv);
    token(b.acquire(&rv).await.unwrap());
    let routine = match d {
        Dialect::Postgres => 1,
        Dialect::MySql => 0,
    };
    assert_eq!(
        fast_counts(&b),
        (before.0 + routine, before.1, before.2),
        "a hold with a value: the routine on PostgreSQL, the full path on MySQL"
    );
    assert_eq!(
        value_of(&b, n.as_str(), "with-value").await,
        Some(Some("leader".into()))
    );
    assert_eq!(b.release(&hr(&rv)).await.unwrap(), Released::Released);
    let rp = rq(&n, "plain", &mp);
    token(b.acquire(&rp).await.unwrap());
    assert_eq!(
        fast_counts(&b).0,
        before.0 + routine + 1,
        "a plain hold takes the routine"
    );
    assert_eq!(value_of(&b, n.as_str(), "plain").await, Some(None));
    // A revoked hold is nobody's: no new value.
    b.force_release(&n, Force::Revoke).await.unwrap();
    assert_eq!(
        b.set_value(&hr(&rp), "late").await.unwrap(),
        Released::NotHeld
    );
    assert_eq!(value_of(&b, n.as_str(), "plain").await, Some(None));
}

/// A hold's value in session mode: the hold's row, rewritten on its own connection.
async fn session_mode_values(d: Dialect) {
    let b = open_session(d, "dlt_session_values").await;
    check_values(&b, &uniq("values"), true).await;
}

/// A table made before holds had values (no `value` column) gets the column when a backend
/// opens it, keeps its holds and its schema version, and its routine's rows still work.
async fn a_table_without_values_gets_the_column(d: Dialect) {
    let table = own_table("dlt_novalue");
    let a = open(d, &table).await;
    let n = name(&uniq("old"));
    let m = meta("old");
    let r = rq(&n, "owner-old", &m);
    token(a.acquire(&r).await.unwrap());
    sqlx::query(&format!("ALTER TABLE {table} DROP COLUMN value"))
        .execute(&a.inner.pool)
        .await
        .unwrap();
    let b = open(d, &table).await;
    let v: i64 = sqlx::query(&format!(
        "SELECT meta_value FROM {table}_meta WHERE meta_key = 'schema_version'"
    ))
    .fetch_one(&b.inner.pool)
    .await
    .unwrap()
    .try_get(0)
    .unwrap();
    assert_eq!(v, SCHEMA_VERSION, "no new version for the column");
    assert_eq!(value_of(&b, n.as_str(), "owner-old").await, Some(None));
    assert_eq!(
        b.set_value(&hr(&r), "later").await.unwrap(),
        Released::Released
    );
    assert_eq!(
        value_of(&a, n.as_str(), "owner-old").await,
        Some(Some("later".into()))
    );
    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
    // A second open finds the column and leaves the table alone.
    let c = open(d, &table).await;
    check_values(&c, &uniq("values"), true).await;
    drop_tables(&c, &table).await;
    for stmt in fast::drop_sql(d, &table) {
        sqlx::query(&stmt).execute(&c.inner.pool).await.unwrap();
    }
}

/// A client opening a table that is set up already does not take the migration lock: while
/// another session holds it (a slow migration elsewhere, or a fleet opening at once), the open
/// still answers at once with the grant routine enabled.
async fn an_open_table_is_not_migrated_again(d: Dialect) {
    let table = own_table("dlt_nomigrate");
    let a = open(d, &table).await;
    let mut other = a.inner.pool.acquire().await.unwrap();
    match d {
        Dialect::Postgres => {
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(advisory_key("dlock-migrate", &table))
                .execute(&mut *other)
                .await
                .unwrap();
        }
        Dialect::MySql => {
            sqlx::query("SELECT GET_LOCK(?, 0)")
                .bind(format!("dlock-migrate:{table}"))
                .execute(&mut *other)
                .await
                .unwrap();
        }
    }
    let started = std::time::Instant::now();
    let b = tokio::time::timeout(Duration::from_secs(3), open(d, &table))
        .await
        .expect("the open waited for the migration lock");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(b.inner.fast.load(Ordering::Relaxed));
    let n = name(&uniq("nomigrate"));
    let m = meta("m");
    let r = rq(&n, "o", &m);
    assert_eq!(token(b.acquire(&r).await.unwrap()), 1);
    assert_eq!(b.release(&hr(&r)).await.unwrap(), Released::Released);
    match d {
        Dialect::Postgres => sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(advisory_key("dlock-migrate", &table))
            .execute(&mut *other)
            .await
            .map(|_| ()),
        Dialect::MySql => sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(format!("dlock-migrate:{table}"))
            .execute(&mut *other)
            .await
            .map(|_| ()),
    }
    .unwrap();
    drop(other);
    drop_tables(&a, &table).await;
    for stmt in fast::drop_sql(d, &table) {
        sqlx::query(&stmt).execute(&a.inner.pool).await.unwrap();
    }
}

macro_rules! tests {
    ($d:expr; $($t:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $t() {
                super::$t($d).await
            }
        )*
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    tests!(super::Dialect::Postgres;
        exclusion_across_two_clients,
        extend_in_bulk,
        fence_increases_across_expiry_and_reconnect,
        owner_only_release_after_expiry,
        fair_order,
        rwlock_and_semaphore,
        concurrent_tasks_never_share_the_mutex,
        a_new_name_counts_from_one,
        table_name_is_validated,
        dead_database_is_unavailable_quickly,
        session_mode_exclusion_and_kill,
        session_mode_break_frees_the_lock_at_once,
        session_mode_lost_fires_on_kill,
        dropped_holder_frees_session_lock,
        grant_routine_answers_the_common_cases,
        missing_grant_routine_falls_back,
        wait_after_a_busy_attempt_skips_the_repeat_look,
        a_look_tells_a_fair_waiter_its_place,
        set_value_replaces_the_holders_value_only,
        session_mode_values,
        a_table_without_values_gets_the_column,
        an_open_table_is_not_migrated_again,
        grants_of_many_names_go_in_batches,
    );

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn notify_wakes_well_before_polling() {
        super::postgres_notify_wakes_well_before_polling().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queued_waiter_alone_in_its_batch_registers() {
        super::postgres_a_queued_waiter_alone_in_its_batch_registers().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_wakes_only_who_waits() {
        super::postgres_release_wakes_only_who_waits().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fair_queue_hands_the_lock_to_its_head() {
        super::postgres_a_fair_queue_hands_the_lock_to_its_head().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_releases_that_hand_nothing_on_skip_the_flush() {
        super::postgres_only_releases_that_hand_nothing_on_skip_the_flush().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queue_places_skip_the_flush() {
        super::postgres_queue_places_skip_the_flush().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_refused_while_the_listener_was_down_attempts_again() {
        super::postgres_a_waiter_refused_while_the_listener_was_down_attempts_again().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_racing_a_new_waiter_wakes_it() {
        super::postgres_a_release_racing_a_new_waiter_wakes_it().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wake_lock_key_survives_any_name() {
        super::postgres_wake_lock_key_survives_any_name().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handoffs_skip_the_gone_and_pass_on() {
        super::postgres_handoffs_skip_the_gone_and_pass_on().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn releases_spend_tokens_only_on_handoffs() {
        super::postgres_releases_spend_tokens_only_on_handoffs().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_handoff_message_leaves_the_hold_alone() {
        super::postgres_a_late_handoff_message_leaves_the_hold_alone().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn observers_are_woken() {
        super::postgres_observers_are_woken().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn released_holds_leave_the_index() {
        super::postgres_released_holds_leave_the_index().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_in_progress_wins_the_race() {
        super::postgres_a_grant_in_progress_wins_the_race().await
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    tests!(super::Dialect::MySql;
        exclusion_across_two_clients,
        extend_in_bulk,
        fence_increases_across_expiry_and_reconnect,
        owner_only_release_after_expiry,
        fair_order,
        rwlock_and_semaphore,
        concurrent_tasks_never_share_the_mutex,
        a_new_name_counts_from_one,
        table_name_is_validated,
        dead_database_is_unavailable_quickly,
        session_mode_exclusion_and_kill,
        session_mode_break_frees_the_lock_at_once,
        session_mode_lost_fires_on_kill,
        dropped_holder_frees_session_lock,
        grant_routine_answers_the_common_cases,
        missing_grant_routine_falls_back,
        wait_after_a_busy_attempt_skips_the_repeat_look,
        a_look_tells_a_fair_waiter_its_place,
        set_value_replaces_the_holders_value_only,
        session_mode_values,
        a_table_without_values_gets_the_column,
        an_open_table_is_not_migrated_again,
        grants_of_many_names_go_in_batches,
    );

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polls_and_respects_until() {
        super::mysql_polls_and_respects_until().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_routine_privileges_falls_back() {
        super::mysql_without_routine_privileges_falls_back().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fair_waiters_are_rung_not_polled() {
        super::mysql_fair_waiters_are_rung_not_polled().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bell_out_of_turn_is_passed_on() {
        super::mysql_a_bell_out_of_turn_is_passed_on().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_left_to_expire_frees_its_bell() {
        super::mysql_a_hold_left_to_expire_frees_its_bell().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_idle_bell_connections_are_replaced() {
        super::mysql_dead_idle_bell_connections_are_replaced().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_bell_connections_are_closed() {
        super::mysql_idle_bell_connections_are_closed().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_bell_connections_fall_back_to_polling() {
        super::mysql_killed_bell_connections_fall_back_to_polling().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_hands_the_lock_to_the_bells_next_holder() {
        super::mysql_a_release_hands_the_lock_to_the_bells_next_holder().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reservation_for_nobody_goes_at_once() {
        super::mysql_a_reservation_for_nobody_goes_at_once().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_without_the_bell_leaves_the_lock_to_the_bells_holder() {
        super::mysql_a_holder_without_the_bell_leaves_the_lock_to_the_bells_holder().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_name_seen_busy_is_attempted_in_the_ring() {
        super::mysql_a_name_seen_busy_is_attempted_in_the_ring().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_ring_attempt_leaves_no_hold() {
        super::mysql_a_dropped_ring_attempt_leaves_no_hold().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_non_fair_bell_holder_lets_the_fair_head_in() {
        super::mysql_a_non_fair_bell_holder_lets_the_fair_head_in().await
    }
}
