//! Coordination beyond one lock: multi-locks, segmented (striped) locks, n permits at once,
//! leader election.

use super::*;

/// Whether nobody holds `name` (as `describe` sees it).
async fn free(c: &Client, name: &str) -> bool {
    describe(c, name)
        .await
        .map_or(true, |i| i.holders.is_empty())
}

/// A multi-lock is all or nothing: refused (try) or timed out while one of its names is held, it
/// leaves none of the others held; granted, it holds every name with a token each, and its
/// release frees them all. Read/write mode shares between readers and excludes a writer.
pub async fn multi_lock_all_or_nothing(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let names = [s.name("m-a"), s.name("m-b"), s.name("m-c")];
    let middle = must(
        "hold the middle name",
        c1.mutex(&names[1]).expect(NAME_OK).acquire(),
    )
    .await;
    let all = c2
        .multi([&names[2], &names[0], &names[1]].map(|n| n.to_string()))
        .expect(NAME_OK);
    assert_eq!(
        all.names().collect::<Vec<_>>(),
        names.iter().map(String::as_str).collect::<Vec<_>>(),
        "the canonical order is the names sorted"
    );
    assert_err!(
        within(STEP, "try_acquire", all.try_acquire()).await,
        Error::Busy { .. },
        "a multi-lock one of whose names is held"
    );
    assert_err!(
        within(STEP, "acquire_timeout", all.acquire_timeout(ms(300))).await,
        Error::Timeout { .. },
        "a timed multi-lock one of whose names is held"
    );
    for n in [&names[0], &names[2]] {
        assert!(
            free(&c1, n).await,
            "{n:?} is held after the multi-lock was refused"
        );
    }
    must("release the middle name", middle.release()).await;
    let g = must("the multi-lock once every name is free", all.try_acquire()).await;
    assert_eq!(g.len(), 3);
    assert!(g.is_held());
    if c2.capabilities().fencing {
        assert!(
            g.tokens().iter().all(Option::is_some),
            "a token per name: {:?}",
            g.tokens()
        );
    }
    for n in &names {
        assert_busy(&c1.mutex(n).expect(NAME_OK), "a name of a held multi-lock").await;
    }
    let lost = g.lost();
    must("release the multi-lock", g.release()).await;
    within(STEP, "lost() after the release", lost).await;
    for n in &names {
        drop(
            must(
                format!("{n:?} after the multi-lock's release"),
                c1.mutex(n).expect(NAME_OK).try_acquire(),
            )
            .await,
        );
    }

    // Read/write mode, over names of their own.
    let names = [s.name("rw-a"), s.name("rw-b")];
    let rw = c1.multi(names.clone()).expect(NAME_OK);
    if s.caps.mutex_only {
        assert_unsupported("a multi-lock of read-write locks", rw.try_read()).await;
        return;
    }
    let r1 = must("readers of every name", rw.try_read()).await;
    let r2 = must(
        "a second reader of every name",
        c2.multi(names.clone()).expect(NAME_OK).try_read(),
    )
    .await;
    assert_err!(
        within(
            STEP,
            "try_write",
            c2.multi(names.clone()).expect(NAME_OK).try_write()
        )
        .await,
        Error::Busy { .. },
        "a multi-writer while readers hold"
    );
    drop((r1, r2));
    let w = eventually(STEP, "the writer after the readers left", || async {
        c2.multi(names.clone())
            .expect(NAME_OK)
            .try_write()
            .await
            .is_ok()
    });
    w.await;
}

/// Two callers naming the same three names in opposite orders, over and over, from separate
/// clients: neither deadlocks and they never hold at once.
pub async fn multi_lock_opposite_orders(s: Store) {
    let names = [s.name("o-x"), s.name("o-y"), s.name("o-z")];
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..2 {
        let c = s.client().await;
        let mut order = names.clone();
        if i == 1 {
            order.reverse();
        }
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let m = c.multi(order).expect(NAME_OK);
            for round in 0..8 {
                let g = must(format!("caller {i} round {round}"), m.acquire()).await;
                assert_eq!(
                    inside.fetch_add(1, SeqCst),
                    0,
                    "caller {i} round {round}: two multi-locks of the same names at once"
                );
                sleep(ms(5)).await;
                inside.fetch_sub(1, SeqCst);
                must(format!("caller {i} round {round}: release"), g.release()).await;
            }
        }));
    }
    within(
        secs(40),
        "two callers x 8 rounds, opposite orders",
        join_all("multi_lock_opposite_orders", tasks),
    )
    .await;
}

/// A multi-acquisition dropped while it waits for its last name lets go of the names it took.
pub async fn multi_lock_dropped_leaves_nothing(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let names = [s.name("d-1"), s.name("d-2"), s.name("d-3")];
    let last = must(
        "hold the last name",
        c1.mutex(&names[2]).expect(NAME_OK).acquire(),
    )
    .await;
    let m = c2.multi(names.clone()).expect(NAME_OK);
    let first_two = names[..2].to_vec();
    // Wait until the acquisition holds the first two names, then drop it.
    let mut waiting = Box::pin(m.acquire());
    let probe = c1.clone();
    tokio::select! {
        r = &mut waiting => panic!("the multi-lock was granted while its last name was held: {}", show(&r)),
        _ = eventually(STEP, "the waiting multi-lock holds its first two names", || {
            let (probe, first_two) = (probe.clone(), first_two.clone());
            async move {
                for n in &first_two {
                    if free(&probe, n).await {
                        return false;
                    }
                }
                true
            }
        }) => {}
    }
    drop(waiting);
    for n in &first_two {
        eventually(
            STEP,
            format!("{n:?} is free after the acquisition was dropped"),
            || async { free(&c1, n).await },
        )
        .await;
    }
    must("release the last name", last.release()).await;
    drop(
        must(
            "the whole set afterwards",
            c1.multi(names.clone()).expect(NAME_OK).try_acquire(),
        )
        .await,
    );
}

/// A striped lock maps keys to `base/<FNV-1a mod stripes>`: keys of one stripe exclude each
/// other, keys of different stripes do not; `lock_many` takes the distinct stripes.
pub async fn striped_keys_share_stripes(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let base = s.name("films");
    let st1 = c1.striped(&base, 8).expect(NAME_OK);
    let st2 = c2.striped(&base, 8).expect(NAME_OK);
    // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c; 0xaf63dc4c8601ec8c mod 8 = 4.
    assert_eq!(st1.stripe_of("a"), 4);
    assert_eq!(st1.name_of("a"), format!("{base}/4"));
    let keys: Vec<String> = (0..64).map(|i| format!("film-{i}")).collect();
    let k0 = &keys[0];
    let same = keys
        .iter()
        .find(|k| *k != k0 && st1.stripe_of(k) == st1.stripe_of(k0))
        .expect("64 keys over 8 stripes share one");
    let other = keys
        .iter()
        .find(|k| st1.stripe_of(k) != st1.stripe_of(k0))
        .expect("64 keys over 8 stripes use two");
    let g = must("lock a key", st1.lock(k0)).await;
    assert_eq!(g.name(), st1.name_of(k0));
    assert_err!(
        within(STEP, "try_lock", st2.try_lock(same)).await,
        Error::Busy { .. },
        "a key of the same stripe"
    );
    let g2 = must("a key of another stripe", st2.try_lock(other)).await;
    drop((g, g2));
    let distinct: BTreeSet<u32> = keys[..10].iter().map(|k| st1.stripe_of(k)).collect();
    let many = must("lock_many over ten keys", async {
        let m = st1.multi(&keys[..10]).expect(NAME_OK);
        m.acquire_timeout(STEP).await
    })
    .await;
    assert_eq!(many.len(), distinct.len(), "one hold per distinct stripe");
    for k in &keys[..10] {
        assert_err!(
            within(STEP, "try_lock", st2.try_lock(k)).await,
            Error::Busy { .. },
            "a key whose stripe lock_many holds"
        );
    }
    must("release", many.release()).await;
    assert_err!(
        c1.striped(&base, 0).map(|_| ()),
        Error::InvalidConfig(_),
        "zero stripes"
    );
    assert_err!(
        c1.striped("x".repeat(254), 10).map(|_| ()),
        Error::InvalidName(_),
        "a base that leaves no room for the stripe"
    );
}

/// `acquire_many(n)` takes n permits all or nothing: refused or timed out, it leaves none held;
/// two callers of several permits each never deadlock; a bad `n` is refused.
pub async fn semaphore_acquire_many(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("sem-many");
    let sem1 = c1.semaphore(&name, 3).expect(NAME_OK);
    let sem2 = c2.semaphore(&name, 3).expect(NAME_OK);
    if s.caps.mutex_only {
        assert_unsupported("acquire_many", sem1.try_acquire_many(2)).await;
        return;
    }
    let two = must("two permits", sem1.try_acquire_many(2)).await;
    assert_eq!(two.len(), 2);
    if c1.capabilities().fencing {
        let t = two.tokens();
        assert!(t[0].is_some() && t[0] != t[1], "a token per permit: {t:?}");
    }
    assert_err!(
        within(STEP, "try_acquire_many", sem2.try_acquire_many(2)).await,
        Error::Busy { .. },
        "two permits while one is free"
    );
    assert_err!(
        within(
            STEP,
            "acquire_many_timeout",
            sem2.acquire_many_timeout(2, ms(300))
        )
        .await,
        Error::Timeout { .. },
        "two permits while one is free, timed"
    );
    let holders = describe(&c1, &name).await.map_or(0, |i| i.holders.len());
    assert_eq!(holders, 2, "only the two granted permits are held");
    let one = must("the third permit", sem2.try_acquire()).await;
    drop(one);
    must("release two", two.release()).await;
    for (n, what) in [
        (0, "zero permits"),
        (4, "more permits than the semaphore has"),
    ] {
        assert_err!(
            sem1.try_acquire_many(n).await.map(|_| ()),
            Error::InvalidConfig(_),
            "{what}"
        );
    }

    // Two callers of two permits each (of three) and one of single permits, concurrently.
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let sem = [&sem1, &sem2, &sem1][i].clone();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let n = if i < 2 { 2 } else { 1 };
            for round in 0..6 {
                let g = must(format!("caller {i} round {round}"), sem.acquire_many(n)).await;
                let now = inside.fetch_add(n as usize, SeqCst) + n as usize;
                assert!(
                    now <= 3,
                    "caller {i} round {round}: {now} permits of 3 in use"
                );
                sleep(ms(5)).await;
                inside.fetch_sub(n as usize, SeqCst);
                must(format!("caller {i} round {round}: release"), g.release()).await;
            }
        }));
    }
    within(
        secs(40),
        "3 callers x 6 rounds of acquire_many",
        join_all("semaphore_acquire_many", tasks),
    )
    .await;
}

/// A leader election: one leader at a time, followers see its value and term, a proclaimed value
/// reaches an observer, a resignation lets a waiting candidate lead with a greater term, and a
/// leader whose term is revoked learns it before anyone else leads and can campaign again.
pub async fn election_campaign_follow_again(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("leader");
    let e1 = c1.election(&name).expect(NAME_OK).lease(secs(2));
    let e2 = c2.election(&name).expect(NAME_OK).lease(secs(2));
    let values = c1.capabilities().values;
    let (v1, v2) = if values { ("one", "two") } else { ("", "") };
    if !values {
        assert_err!(
            within(STEP, "campaign with a value", e1.try_campaign("one")).await,
            Error::Unsupported(_),
            "a value on a store without values"
        );
    }
    assert!(must("no leader yet", e2.leader()).await.is_none());
    let mut observer = e2.clone().observe_every(ms(50)).observe();
    assert!(must("observe: nobody leads", observer.next())
        .await
        .is_none());

    let l1 = must("the first candidate leads", e1.campaign(v1)).await;
    assert!(l1.is_leader());
    assert_err!(
        within(STEP, "try_campaign", e2.try_campaign(v2)).await,
        Error::Busy { .. },
        "a second candidate while one leads"
    );
    let seen = must("observe the first leader", observer.next())
        .await
        .expect("a leader");
    assert_eq!(seen.term, l1.term());
    assert_eq!(seen.holder.meta.client_id, c1.id());
    if values {
        assert_eq!(seen.value.as_deref(), Some("one"));
        must("proclaim", l1.proclaim("one, again")).await;
        let seen = must("observe the proclaimed value", observer.next())
            .await
            .expect("a leader");
        assert_eq!(seen.value.as_deref(), Some("one, again"));
        assert_eq!(seen.term, l1.term(), "a proclaim keeps the term");
        assert_err!(
            l1.proclaim("x\0y").await,
            Error::InvalidConfig(_),
            "a value with NUL"
        );
    }

    // A waiting candidate leads once the leader resigns.
    let standby = tokio::spawn({
        let e2 = e2.clone();
        async move { e2.campaign(v2).await }
    });
    sleep(ms(200)).await;
    let t1 = l1.term();
    must("resign", l1.resign()).await;
    let l2 = within(STEP, "the standby leads after the resignation", standby)
        .await
        .expect("the standby task")
        .expect("the standby's campaign");
    if let (Some(a), Some(b)) = (t1, l2.term()) {
        assert!(b > a, "the new term {b} is greater than the old {a}");
    }
    let seen = must("observe the second leader", observer.next())
        .await
        .expect("a leader");
    assert_eq!(seen.holder.meta.client_id, c2.id());

    // A revoked leader learns it, lets go, and a campaign afterwards works again.
    let lost = l2.lost();
    let revoked = must(
        "revoke the term",
        c1.force_release(&name, crate::Force::Revoke),
    )
    .await;
    assert_eq!(revoked.revoked + revoked.removed, 1);
    within(secs(5), "the revoked leader's lost()", lost).await;
    assert!(!l2.is_leader());
    let e1_again = tokio::spawn({
        let e1 = e1.clone();
        async move { e1.campaign(v1).await }
    });
    sleep(ms(100)).await;
    drop(l2);
    let l3 = within(STEP, "a campaign after the revoked leader let go", e1_again)
        .await
        .expect("the campaign task")
        .expect("the campaign");
    let again = must("the loser campaigns again", async {
        let t = e2.campaign_timeout(v2, ms(300)).await;
        assert_err!(t, Error::Timeout { .. }, "a campaign while another leads");
        must("resign", l3.resign()).await;
        e2.campaign_timeout(v2, STEP).await
    })
    .await;
    assert!(
        again.is_leader(),
        "the candidate that lost its term leads again"
    );
    must("resign", again.resign()).await;
}
