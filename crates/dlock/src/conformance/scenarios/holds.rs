//! Fencing tokens and reentrancy.

use super::*;

// ---- 9 ------------------------------------------------------------------------------------------

/// 30 acquisitions over 3 clients (one replaced by a newly connected client half-way, one taken
/// over after a lease ran out): every token strictly greater than the one before; reentrant
/// guards share their hold's token.
pub async fn fencing_tokens_increase(s: Store) {
    let mut clients = [s.client().await, s.client().await, s.client().await];
    let fencing = clients[0].capabilities().fencing;
    let name = s.name("fenced");
    let mut tokens = Vec::new();
    for i in 0..30 {
        if i == 15 {
            clients[0] = s.client().await; // a client connected mid-way
        }
        let c = &clients[i % 3];
        let what = format!("acquisition #{i} (client {})", i % 3);
        if i == 20 {
            // Never released: the next acquisition takes over when its lease runs out.
            let g = must(
                &what,
                c.mutex(&name)
                    .expect(NAME_OK)
                    .lease(ms(300))
                    .auto_renew(false)
                    .acquire(),
            )
            .await;
            tokens.push(g.token());
            std::mem::forget(g);
            continue;
        }
        let m = c.mutex(&name).expect(NAME_OK);
        let g = must(&what, m.acquire_timeout(secs(5))).await;
        if i == 10 {
            let again = must("reentrant try_acquire on the same handle", m.try_acquire()).await;
            let clone = must("reentrant acquire on a clone", m.clone().acquire()).await;
            assert_eq!(again.token(), g.token(), "a reentrant guard's token");
            assert_eq!(
                clone.token(),
                g.token(),
                "a clone's reentrant guard's token"
            );
            must("release reentrant guard", again.release()).await;
            must("release clone's guard", clone.release()).await;
        }
        tokens.push(g.token());
        must(format!("{what}: release"), g.release()).await;
    }
    assert_eq!(tokens.len(), 30);
    if !fencing {
        assert!(
            tokens.iter().all(Option::is_none),
            "a store without fencing gave tokens: {tokens:?}"
        );
        return;
    }
    let t: Vec<u64> = tokens
        .iter()
        .map(|t| t.expect("the store claims fencing but a grant had no token"))
        .collect();
    assert_strictly_increasing("fencing tokens of 30 acquisitions", &t);
}

// ---- 10 -----------------------------------------------------------------------------------------

/// A handle (and its clones) re-enters its own hold; the hold ends with the last guard.
/// Semaphores are not reentrant.
pub async fn reentrancy_counts(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("reentrant");
    let h = c1.mutex(&name).expect(NAME_OK);
    let same_client = c1.mutex(&name).expect(NAME_OK);
    let other_client = c2.mutex(&name).expect(NAME_OK);

    let g1 = must("acquire #1", h.acquire()).await;
    let g2 = must("acquire #2 (try) on the same handle", h.try_acquire()).await;
    let g3 = must(
        "acquire #3 (timeout) on the same handle",
        h.acquire_timeout(secs(1)),
    )
    .await;
    for g in [&g2, &g3] {
        assert_eq!(g.token(), g1.token(), "reentrant guards share the token");
        assert_eq!(g.owner(), g1.owner(), "reentrant guards share the hold");
    }
    let info = describe(&c1, &name).await.expect("described");
    assert_eq!(
        info.holders.len(),
        1,
        "reentry must not add holds: {:?}",
        info.holders
    );
    assert_busy(
        &same_client,
        "another handle of the same client while held 3x",
    )
    .await;
    assert_busy(&other_client, "a handle of another client while held 3x").await;
    must("release 1 of 3", g1.release()).await;
    assert_busy(&same_client, "another handle after release 1 of 3").await;
    must("release 2 of 3", g2.release()).await;
    assert_busy(&same_client, "another handle after release 2 of 3").await;
    assert_busy(&other_client, "another client after release 2 of 3").await;
    must("release 3 of 3", g3.release()).await;
    let g = must(
        "another handle of the same client after the third release",
        same_client.try_acquire(),
    )
    .await;
    must("release", g.release()).await;

    // A clone of a handle shares its reentrancy.
    let ga = must("acquire on the handle", h.acquire()).await;
    let (first_token, first_owner) = (ga.token(), ga.owner().to_owned());
    let gb = must("acquire on a clone of the handle", h.clone().try_acquire()).await;
    assert_eq!(gb.token(), ga.token(), "the clone's guard shares the token");
    assert_eq!(gb.owner(), ga.owner(), "the clone's guard shares the hold");
    must("release the handle's guard", ga.release()).await;
    assert_busy(
        &other_client,
        "another client while the clone's guard holds",
    )
    .await;
    let gc = must("another acquire on the clone", h.clone().acquire()).await;
    assert_eq!(gc.token(), gb.token());
    must("release", gb.release()).await;
    must("release", gc.release()).await;
    let g = must(
        "another client after the last guard",
        other_client.try_acquire(),
    )
    .await;
    must("release", g.release()).await;
    // After the hold ended, the handle makes a new hold.
    let gn = must("the handle again", h.acquire()).await;
    assert_ne!(
        gn.owner(),
        first_owner,
        "the handle re-entered a hold that had been released"
    );
    if let (Some(a), Some(b)) = (first_token, gn.token()) {
        assert!(b > a, "the new hold's token {b} is not greater than {a}");
    }
    must("release", gn.release()).await;

    // Semaphores: every acquire takes a permit, on the same handle and on clones.
    let sname = s.name("reentrant-sem");
    if s.caps.mutex_only {
        assert_unsupported(
            "semaphore",
            c1.semaphore(&sname, 2).expect(NAME_OK).acquire(),
        )
        .await;
        return;
    }
    let sem = c1.semaphore(&sname, 2).expect(NAME_OK);
    let p1 = must("permit 1", sem.acquire()).await;
    let p2 = must("permit 2 on the same handle", sem.acquire()).await;
    assert_ne!(
        p1.owner(),
        p2.owner(),
        "two permits of one handle share a hold"
    );
    if let (Some(a), Some(b)) = (p1.token(), p2.token()) {
        assert_ne!(a, b, "two permits share a token");
    }
    let info = describe(&c1, &sname).await.expect("described");
    assert_eq!(info.holders.len(), 2, "holders: {:?}", info.holders);
    assert_err!(
        within(STEP, "try_acquire", sem.try_acquire()).await,
        Error::Busy { .. },
        "a third permit of 2 on the same handle"
    );
    assert_err!(
        within(STEP, "try_acquire", sem.clone().try_acquire()).await,
        Error::Busy { .. },
        "a third permit of 2 on a clone"
    );
    must("release permit 1", p1.release()).await;
    let p3 = must("a permit after one was released", sem.try_acquire()).await;
    must("release", p2.release()).await;
    must("release", p3.release()).await;
}
