//! Mutual exclusion between tasks and processes, try/timeout, dropped guards.

use super::*;

// ---- 1 ------------------------------------------------------------------------------------------

/// 8 tasks (4 on each of two clients, each task its own handle) × 20 rounds of
/// read-sleep-write on a shared counter: no two tasks inside at once, no lost update, and the
/// fencing tokens in critical-section order strictly increase.
pub async fn mutual_exclusion_tasks(s: Store) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 20;
    let clients = [s.client().await, s.client().await];
    let fencing = clients[0].capabilities().fencing;
    let name = s.name("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let m = clients[i % 2].mutex(&name).expect("mutex handle");
        let (counter, inside, tokens) = (counter.clone(), inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let what = format!("task {i} round {round}");
                let g = must(format!("{what}: acquire"), m.acquire()).await;
                let others = inside.fetch_add(1, SeqCst);
                assert_eq!(
                    others, 0,
                    "{what}: entered the critical section while {others} other task(s) were in it"
                );
                tokens
                    .lock()
                    .expect("a test mutex poisoned by a failed task")
                    .push(g.token());
                let seen = counter.load(SeqCst);
                let pause = ms(rand::thread_rng().gen_range(1..=3));
                sleep(pause).await;
                counter.store(seen + 1, SeqCst);
                assert!(
                    g.is_held(),
                    "{what}: the guard is no longer held at the end of the critical section"
                );
                inside.fetch_sub(1, SeqCst);
                must(format!("{what}: release"), g.release()).await;
            }
        }));
    }
    within(
        secs(45),
        "8 tasks x 20 locked rounds",
        join_all("mutual_exclusion_tasks", tasks),
    )
    .await;
    assert_eq!(
        counter.load(SeqCst),
        (TASKS * ROUNDS) as u64,
        "lost updates: the read-sleep-write rounds overlapped"
    );
    let tokens = tokens
        .lock()
        .expect("a test mutex poisoned by a failed task")
        .clone();
    assert_eq!(tokens.len(), TASKS * ROUNDS);
    if fencing {
        let t: Vec<u64> = tokens
            .iter()
            .map(|t| t.expect("the store claims fencing but a grant had no token"))
            .collect();
        assert_strictly_increasing("fencing tokens in critical-section order", &t);
    }
}

// ---- 3 ------------------------------------------------------------------------------------------

/// try_acquire on a held lock is Busy at once; acquire_timeout gives up with Timeout after its
/// time (plain and fair); neither they nor a dropped acquisition leave anything behind.
pub async fn try_and_timeout(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("busy");
    let g = must("holder: acquire", c1.mutex(&name).expect(NAME_OK).acquire()).await;
    let other = c2.mutex(&name).expect(NAME_OK);

    let (e, took) = fails("try_acquire on a held lock", other.try_acquire()).await;
    assert!(
        matches!(e, Error::Busy { .. }) && e.is_not_granted(),
        "try_acquire on a held lock: expected Busy, got {e:?}"
    );
    assert!(
        took < secs(1),
        "try_acquire on a held lock took {took:?}; it must answer at once"
    );

    // On a mutex-only store (no fair mode) the "fair" steps run as plain ones, and fair mode must
    // be refused clearly.
    let fair = !s.caps.mutex_only;
    if !fair {
        assert_unsupported(
            "fair acquire",
            c2.mutex(&name).expect(NAME_OK).fair(true).acquire(),
        )
        .await;
    }
    for (label, m) in [
        ("acquire_timeout(300ms)", other.clone()),
        (
            "fair acquire_timeout(300ms)",
            c2.mutex(&name).expect(NAME_OK).fair(fair),
        ),
    ] {
        let (e, took) = fails(
            format!("{label} on a held lock"),
            m.acquire_timeout(ms(300)),
        )
        .await;
        match e {
            Error::Timeout { waited, .. } => assert!(
                waited >= ms(300),
                "{label}: Timeout reports waited = {waited:?}, less than the 300 ms asked for"
            ),
            e => panic!("{label} on a held lock: expected Timeout, got {e:?}"),
        }
        eprintln!("{label} on a held lock: Timeout after {took:?}");
        assert!(
            took >= ms(300) && took < secs(2),
            "{label} on a held lock gave up after {took:?}; expected between 300 ms and 2 s"
        );
    }
    assert_err!(
        within(
            STEP,
            "fair try_acquire",
            c2.mutex(&name).expect(NAME_OK).fair(fair).try_acquire()
        )
        .await,
        Error::Busy { .. },
        "fair try_acquire on a held lock"
    );

    // A fair acquisition abandoned by the caller's own timeout (the future is dropped while it
    // waits in the queue) removes its queue place too (in the background, so allow a moment).
    let dropper = c2.mutex(&name).expect(NAME_OK).fair(fair);
    let abandoned = tokio::time::timeout(ms(300), dropper.acquire()).await;
    assert!(
        abandoned.is_err(),
        "a fair acquire() on a held lock finished within 300 ms: {abandoned:?}"
    );
    let (c, n, id2) = (&c1, name.as_str(), c2.id());
    eventually(
        secs(2),
        "the queue place of a dropped acquisition future is removed",
        || async move {
            describe(c, n)
                .await
                .is_some_and(|i| i.waiters.iter().all(|w| w.meta.client_id != id2))
        },
    )
    .await;

    // Nothing of the waiters that gave up is left behind.
    let info = describe(&c1, &name)
        .await
        .expect("the held lock is described");
    assert_eq!(info.holders.len(), 1, "holders: {:?}", info.holders);
    let left: Vec<_> = info
        .waiters
        .iter()
        .filter(|w| w.meta.client_id == c2.id())
        .collect();
    assert!(
        left.is_empty(),
        "waiters that timed out or only tried left queue places behind: {left:?}"
    );

    must("holder: release", g.release()).await;
    // A queue place left behind would block this plain request (it may not barge past fair waiters).
    let t = Instant::now();
    let g2 = must(
        "try_acquire right after the release (after two timed-out waiters)",
        other.try_acquire(),
    )
    .await;
    assert!(
        t.elapsed() < secs(1),
        "try_acquire after release took {:?}",
        t.elapsed()
    );
    assert_err!(
        within(
            STEP,
            "try_acquire",
            c1.mutex(&name).expect(NAME_OK).try_acquire()
        )
        .await,
        Error::Busy { .. },
        "a third contender while the former waiter holds"
    );
    must("release", g2.release()).await;
    let g3 = must(
        "fair try_acquire of the free lock",
        c1.mutex(&name).expect(NAME_OK).fair(fair).try_acquire(),
    )
    .await;
    must("release", g3.release()).await;
}

// ---- 17 -----------------------------------------------------------------------------------------

/// Dropping a guard (instead of release()) frees the lock for another contender within 1 s
/// (leases are 30 s, so expiry cannot explain it); dropping one of two reentrant guards does not.
pub async fn dropped_guard_releases(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("dropped");
    let other = c2.mutex(&name).expect(NAME_OK);

    let g = must("acquire", c1.mutex(&name).expect(NAME_OK).acquire()).await;
    assert_busy(&other, "a contender while the guard lives").await;
    let t = Instant::now();
    drop(g);
    let g2 = must(
        "a contender after the guard was dropped",
        other.acquire_timeout(secs(5)),
    )
    .await;
    let after = t.elapsed();
    eprintln!("dropped guard: free after {after:?}");
    assert!(
        after <= secs(1),
        "the lock was free {after:?} after the guard was dropped; expected within 1 s"
    );
    must("release", g2.release()).await;

    // One of two reentrant guards dropped: still held.
    let h = c1.mutex(&name).expect(NAME_OK);
    let ga = must("acquire", h.acquire()).await;
    let gb = must("reentrant acquire", h.acquire()).await;
    drop(ga);
    sleep(ms(300)).await;
    assert!(
        gb.is_held(),
        "dropping one of two reentrant guards ended the hold"
    );
    assert_busy(
        &other,
        "a contender after one of two reentrant guards was dropped",
    )
    .await;
    let t = Instant::now();
    drop(gb);
    let g3 = must(
        "a contender after both guards were dropped",
        other.acquire_timeout(secs(5)),
    )
    .await;
    assert!(
        t.elapsed() <= secs(1),
        "free {:?} after the last guard was dropped",
        t.elapsed()
    );
    must("release", g3.release()).await;

    // Semaphore permits and rwlock guards too.
    let sname = s.name("dropped-sem");
    if s.caps.mutex_only {
        assert_unsupported(
            "semaphore",
            c1.semaphore(&sname, 1).expect(NAME_OK).acquire(),
        )
        .await;
        assert_unsupported("rwlock", c1.rwlock(&sname).expect(NAME_OK).write()).await;
        return;
    }
    let p = must("permit", c1.semaphore(&sname, 1).expect(NAME_OK).acquire()).await;
    let t = Instant::now();
    drop(p);
    let p2 = must(
        "a permit after the only one was dropped",
        c2.semaphore(&sname, 1)
            .expect(NAME_OK)
            .acquire_timeout(secs(5)),
    )
    .await;
    assert!(
        t.elapsed() <= secs(1),
        "the permit was free {:?} after its guard was dropped",
        t.elapsed()
    );
    must("release", p2.release()).await;
    let rname = s.name("dropped-rw");
    let w = must("write", c1.rwlock(&rname).expect(NAME_OK).write()).await;
    let t = Instant::now();
    drop(w);
    let r = must(
        "a reader after the write guard was dropped",
        c2.rwlock(&rname).expect(NAME_OK).read_timeout(secs(5)),
    )
    .await;
    assert!(
        t.elapsed() <= secs(1),
        "the rwlock was free {:?} after the write guard was dropped",
        t.elapsed()
    );
    must("release", r.release()).await;
}
