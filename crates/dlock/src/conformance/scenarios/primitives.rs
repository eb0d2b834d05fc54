//! Read-write locks, semaphores, fair queues, wake-ups.

use super::*;

// ---- 11 -----------------------------------------------------------------------------------------

/// Readers share, a writer excludes everyone, a handle holding the write lock may read, a handle
/// holding a read lock may not write, and a waiting writer blocks new readers.
pub async fn rwlock_shared_exclusive(s: Store) {
    let (c1, c2, c3) = (s.client().await, s.client().await, s.client().await);
    let name = s.name("rw");

    let mut readers = Vec::new();
    for (i, c) in [&c1, &c2, &c1].into_iter().enumerate() {
        let r = c.rwlock(&name).expect(NAME_OK);
        readers.push(
            must(
                format!("reader {i}: try_read while {i} reader(s) hold"),
                r.try_read(),
            )
            .await,
        );
    }
    let info = describe(&c3, &name).await.expect("described");
    assert_eq!(info.kind, LockKind::RwLock);
    assert_eq!(
        info.holders.len(),
        3,
        "three readers at once: {:?}",
        info.holders
    );
    assert!(info.holders.iter().all(|h| h.mode == Mode::Shared));
    let w = c2.rwlock(&name).expect(NAME_OK);
    while !readers.is_empty() {
        assert_err!(
            within(STEP, "try_write", w.try_write()).await,
            Error::Busy { .. },
            "a writer while {} reader(s) hold",
            readers.len()
        );
        must("release a reader", readers.remove(0).release()).await;
    }
    let gw = must("a writer after the last reader left", w.try_write()).await;
    assert_eq!(gw.mode(), Mode::Exclusive);
    assert_err!(
        within(
            STEP,
            "try_read",
            c1.rwlock(&name).expect(NAME_OK).try_read()
        )
        .await,
        Error::Busy { .. },
        "a reader while a writer holds"
    );
    assert_err!(
        within(
            STEP,
            "read_timeout",
            c3.rwlock(&name).expect(NAME_OK).read_timeout(ms(200))
        )
        .await,
        Error::Timeout { .. },
        "read_timeout(200ms) while a writer holds"
    );
    assert_err!(
        within(
            STEP,
            "try_write",
            c3.rwlock(&name).expect(NAME_OK).try_write()
        )
        .await,
        Error::Busy { .. },
        "a second writer while a writer holds"
    );

    // Reading through the handle that writes re-enters the write hold.
    let gr = must("read on the handle holding the write lock", w.read()).await;
    assert_eq!(
        gr.token(),
        gw.token(),
        "the read guard shares the write hold's token"
    );
    assert_eq!(
        gr.owner(),
        gw.owner(),
        "the read guard shares the write hold"
    );
    must("release the reentrant read guard", gr.release()).await;
    assert_err!(
        within(STEP, "try_read", c1.rwlock(&name).expect(NAME_OK).try_read()).await,
        Error::Busy { .. },
        "a reader after the writer's reentrant read guard was released (the write guard still holds)"
    );
    must("release the writer", gw.release()).await;

    // Upgrading a read hold to a write hold is refused (it would deadlock against itself).
    let h = c1.rwlock(&name).expect(NAME_OK);
    let hr = must("read", h.read()).await;
    assert_err!(
        within(STEP, "write on a reading handle", h.write()).await,
        Error::Unsupported(_),
        "write() on a handle that holds a read lock"
    );
    assert_err!(
        within(STEP, "try_write on a reading handle", h.try_write()).await,
        Error::Unsupported(_),
        "try_write() on a handle that holds a read lock"
    );
    assert_err!(
        within(
            STEP,
            "write_timeout on a reading handle",
            h.write_timeout(ms(200))
        )
        .await,
        Error::Unsupported(_),
        "write_timeout() on a handle that holds a read lock"
    );
    assert!(
        hr.is_held(),
        "the read hold was lost by the refused upgrade"
    );
    must("release the read guard", hr.release()).await;

    // A waiting writer blocks new readers (no writer starvation): in fair mode, and — as the
    // RwLock documentation promises without condition — in the default mode.
    waiting_writer_blocks_readers([&c1, &c2, &c3], &name, true).await;
    waiting_writer_blocks_readers([&c1, &c2, &c3], &name, false).await;
}

async fn waiting_writer_blocks_readers(c: [&Client; 3], name: &str, fair: bool) {
    let mode = if fair { "fair" } else { "default (not fair)" };
    let rd = must(
        format!("{mode}: first reader"),
        c[0].rwlock(name).expect(NAME_OK).read(),
    )
    .await;
    let w = c[1].rwlock(name).expect(NAME_OK).fair(fair);
    let writer = tokio::spawn(async move {
        let r = w.write_timeout(secs(10)).await;
        (Instant::now(), r)
    });
    if fair {
        let (cc, n) = (c[0], name);
        eventually(
            secs(5),
            "the fair writer is listed as a waiter",
            || async move {
                describe(cc, n)
                    .await
                    .is_some_and(|i| i.waiters.iter().any(|w| w.mode == Mode::Exclusive))
            },
        )
        .await;
    } else {
        sleep(ms(300)).await; // its first attempt was refused; it waits now
    }
    assert!(
        !writer.is_finished(),
        "{mode}: the writer was granted (or failed) while a reader holds"
    );
    let late = c[2].rwlock(name).expect(NAME_OK);
    let r = within(STEP, "a new reader's try_read", late.try_read()).await;
    let late_reader = match r {
        Err(Error::Busy { .. }) => None,
        Ok(g) => Some(g),
        Err(e) => panic!("{mode}: a new reader while a writer waits: unexpected error {e:?}"),
    };
    let late_reader_granted = late_reader.is_some();
    must(format!("{mode}: release the first reader"), rd.release()).await;
    if let Some(g) = late_reader {
        must("release the late reader", g.release()).await;
    }
    let (_, r) = within(secs(12), format!("{mode}: the waiting writer"), writer)
        .await
        .expect("the writer task");
    let gw = r.unwrap_or_else(|e| panic!("{mode}: the waiting writer: {e:?}"));
    must(format!("{mode}: release the writer"), gw.release()).await;
    // Checked after the clean-up so that a failure here does not leave the writer hanging.
    assert!(
        !late_reader_granted,
        "{mode}: a new reader's try_read was granted while a writer was waiting for the lock \
         (readers can starve writers; RwLock promises \"Waiting writers block new readers\")"
    );
}

// ---- 12 -----------------------------------------------------------------------------------------

/// Semaphore(3): 8 tasks × 10 rounds never exceed 3 at once and do reach 3; a vanished permit
/// comes back when its lease runs out; a different permit count is refused.
pub async fn semaphore_limit(s: Store) {
    const PERMITS: u32 = 3;
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("sem");
    let now_in = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let rounds = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let sem = [&c1, &c2][i % 2].semaphore(&name, PERMITS).expect(NAME_OK);
        let (now_in, most, rounds) = (now_in.clone(), most.clone(), rounds.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..10 {
                let what = format!("task {i} round {round}");
                let g = must(format!("{what}: acquire a permit"), sem.acquire()).await;
                let n = now_in.fetch_add(1, SeqCst) + 1;
                most.fetch_max(n, SeqCst);
                assert!(
                    n <= PERMITS as usize,
                    "{what}: {n} permits of {PERMITS} held at once"
                );
                // Long enough that three holds overlap even when acquisitions are slow.
                let pause = ms(rand::thread_rng().gen_range(15..=25));
                sleep(pause).await;
                now_in.fetch_sub(1, SeqCst);
                rounds.fetch_add(1, SeqCst);
                must(format!("{what}: release"), g.release()).await;
            }
        }));
    }
    within(
        secs(45),
        "8 tasks x 10 rounds on Semaphore(3)",
        join_all("semaphore_limit", tasks),
    )
    .await;
    assert_eq!(rounds.load(SeqCst), 80);
    assert_eq!(
        most.load(SeqCst),
        PERMITS as usize,
        "the most permits observed in use at once (8 tasks competing for 3, holding 15-25 ms each)"
    );

    // A permit whose holder vanished comes back when its lease runs out.
    let sem = c1.semaphore(&name, PERMITS).expect(NAME_OK);
    let a = must("permit a", sem.acquire()).await;
    let b = must("permit b", sem.acquire()).await;
    let t0 = Instant::now();
    let f = must(
        "a permit with a 500 ms lease, no renewal",
        c2.semaphore(&name, PERMITS)
            .expect(NAME_OK)
            .lease(ms(500))
            .auto_renew(false)
            .acquire(),
    )
    .await;
    std::mem::forget(f);
    assert_err!(
        within(STEP, "try_acquire", sem.try_acquire()).await,
        Error::Busy { .. },
        "a fourth permit of {PERMITS}"
    );
    let c = must(
        "a permit after the vanished one's lease ran out",
        sem.acquire_timeout(secs(5)),
    )
    .await;
    let after = t0.elapsed();
    eprintln!("vanished permit (500 ms lease): back after {after:?}");
    assert!(
        after >= ms(400) && after <= ms(500) + ms(1500),
        "the vanished permit (500 ms lease) came back after {after:?}; expected 400 ms ..= lease + 1.5 s"
    );

    // Every user of the name must agree on the number of permits.
    let (e, _) = fails(
        "Semaphore(4) on a name held as Semaphore(3): try_acquire",
        c2.semaphore(&name, 4).expect(NAME_OK).try_acquire(),
    )
    .await;
    assert!(
        matches!(e, Error::InvalidConfig(_)),
        "Semaphore(4) vs (3): expected InvalidConfig, got {e:?}"
    );
    let (e, _) = fails(
        "Semaphore(4) on a name held as Semaphore(3): acquire_timeout",
        c2.semaphore(&name, 4)
            .expect(NAME_OK)
            .acquire_timeout(ms(300)),
    )
    .await;
    assert!(
        matches!(e, Error::InvalidConfig(_)),
        "Semaphore(4) vs (3), waiting: expected InvalidConfig, got {e:?}"
    );
    let (e, _) = fails(
        "a mutex on a name held as Semaphore(3)",
        c2.mutex(&name).expect(NAME_OK).try_acquire(),
    )
    .await;
    assert!(
        matches!(e, Error::InvalidConfig(_)),
        "mutex vs semaphore: expected InvalidConfig, got {e:?}"
    );
    for g in [a, b, c] {
        must("release a permit", g.release()).await;
    }
}

// ---- 13 -----------------------------------------------------------------------------------------

/// Fair mode grants in arrival order, also after waiting longer than a queue place lives
/// unrefreshed; a fair waiter that times out leaves the queue.
pub async fn fair_fifo_order(s: Store) {
    let clients = [s.client().await, s.client().await];
    let name = s.name("fifo");
    let holder = must(
        "holder: acquire",
        clients[0].mutex(&name).expect(NAME_OK).fair(true).acquire(),
    )
    .await;
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let queued_from = Instant::now();
    for i in 0..5 {
        let m = clients[i % 2].mutex(&name).expect(NAME_OK).fair(true);
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = must(
                format!("fair waiter {i}: acquire"),
                m.acquire_timeout(secs(30)),
            )
            .await;
            order
                .lock()
                .expect("a test mutex poisoned by a failed task")
                .push(i);
            sleep(ms(20)).await;
            must(format!("fair waiter {i}: release"), g.release()).await;
        }));
        let (c, n) = (&clients[0], name.as_str());
        eventually(
            secs(5),
            format!("fair waiter {i} is listed in the queue"),
            || async move {
                describe(c, n)
                    .await
                    .is_some_and(|info| info.waiters.len() == i + 1)
            },
        )
        .await;
    }
    let info = describe(&clients[0], &name).await.expect("described");
    let listed: Vec<(u32, &str)> = info
        .waiters
        .iter()
        .map(|w| (w.position, w.meta.client_id.as_str()))
        .collect();
    let expected: Vec<(u32, &str)> = (0..5).map(|i| (i as u32, clients[i % 2].id())).collect();
    assert_eq!(
        listed, expected,
        "the queue as described (position, client) in arrival order"
    );
    // Hold past the queue places' lifetime: waiting clients must refresh their places (every
    // QUEUE_PLACE_TTL/4 at most), so the queue and its order survive a long wait.
    let ttl = crate::QUEUE_PLACE_TTL;
    let hold_until = queued_from + ttl + secs(1);
    tokio::time::sleep_until(hold_until.into()).await;
    let info = describe(&clients[0], &name).await.expect("described");
    let listed: Vec<(u32, &str)> = info
        .waiters
        .iter()
        .map(|w| (w.position, w.meta.client_id.as_str()))
        .collect();
    assert_eq!(
        listed, expected,
        "the queue {ttl:?} + 1 s later (longer than a queue place lives without refresh)"
    );
    must("holder: release", holder.release()).await;
    within(secs(40), "5 fair waiters", join_all("fair waiters", tasks)).await;
    assert_eq!(
        *order
            .lock()
            .expect("a test mutex poisoned by a failed task"),
        [0, 1, 2, 3, 4],
        "grant order of 5 fair waiters that arrived in order 0..5"
    );

    // A fair waiter that gives up leaves the queue.
    let quitter_client = s.client().await;
    let holder = must(
        "holder again",
        clients[0].mutex(&name).expect(NAME_OK).fair(true).acquire(),
    )
    .await;
    let quitter = quitter_client.mutex(&name).expect(NAME_OK).fair(true);
    let q = tokio::spawn(async move { quitter.acquire_timeout(ms(1000)).await.map(|g| g.token()) });
    let (c, n, qid) = (&clients[0], name.as_str(), quitter_client.id());
    eventually(
        secs(5),
        "the fair waiter that will time out is queued",
        || async move {
            describe(c, n)
                .await
                .is_some_and(|i| i.waiters.iter().any(|w| w.meta.client_id == qid))
        },
    )
    .await;
    let r = within(secs(5), "the fair waiter that times out", q)
        .await
        .expect("the waiter task");
    assert_err!(
        r,
        Error::Timeout { .. },
        "a fair acquire_timeout(1s) on a held lock"
    );
    let info = describe(&clients[0], &name).await.expect("described");
    assert!(
        info.waiters.iter().all(|w| w.meta.client_id != qid),
        "the fair waiter that timed out is still queued: {:?}",
        info.waiters
    );
    must("holder: release", holder.release()).await;
    let t = Instant::now();
    let g = must(
        "a plain try_acquire after the timed-out fair waiter left",
        clients[1].mutex(&name).expect(NAME_OK).try_acquire(),
    )
    .await;
    assert!(t.elapsed() < secs(1));
    must("release", g.release()).await;
}

// ---- 14 -----------------------------------------------------------------------------------------

/// With a 30 s lease (so expiry cannot explain a grant) a waiter is granted within 500 ms of the
/// release: it was woken, on another client and on the same client. On a polling store the bound
/// is its declared longest poll + 500 ms. (A waiter in another process is the part of this
/// scenario in the CLI's conformance tests.)
pub async fn waiter_wakes_by_notification(s: Store) {
    let lease = secs(30);
    let (c1, c2) = (
        s.client_with_lease(lease).await,
        s.client_with_lease(lease).await,
    );
    let wakeups = c1.capabilities().wakeups;
    let bound = match wakeups {
        Wakeups::Native => ms(500),
        Wakeups::Polling { max, .. } => max + ms(500),
    };
    let name = s.name("wake");
    for (label, wc) in [("another client", &c2), ("the same client", &c1)] {
        let g = must("holder: acquire", c1.mutex(&name).expect(NAME_OK).acquire()).await;
        let w = wc.mutex(&name).expect(NAME_OK);
        let waiter = tokio::spawn(async move {
            let r = w.acquire_timeout(secs(20)).await;
            (Instant::now(), r)
        });
        sleep(ms(300)).await;
        assert!(
            !waiter.is_finished(),
            "the waiter on {label} finished while the lock was held"
        );
        let released = Instant::now();
        must("holder: release", g.release()).await;
        let (at, r) = within(secs(25), format!("the waiter on {label}"), waiter)
            .await
            .expect("the waiter task");
        let gw = r.unwrap_or_else(|e| panic!("the waiter on {label}: {e:?}"));
        let after = at.saturating_duration_since(released);
        eprintln!("waiter on {label}: granted {after:?} after the release");
        assert!(
            after <= bound,
            "the waiter on {label} was granted {after:?} after the release; expected within {bound:?} \
             (wakeups: {wakeups:?}); with a 30 s lease only a wake-up can explain a grant"
        );
        must("waiter: release", gw.release()).await;
    }
}
