//! Leases: expiry, takeover of a vanished holder, renewal, and the lost() signal.

use super::*;

// ---- 4 ------------------------------------------------------------------------------------------

/// A hold whose lease ran out and whose lock another took cannot be released by its old owner:
/// the release reports NotOwner/Lost and leaves the new holder's hold alone.
pub async fn owner_only_release_after_expiry(s: Store) {
    let (c1, c2, c3) = (s.client().await, s.client().await, s.client().await);
    let name = s.name("owner-only");
    let a = c1
        .mutex(&name)
        .expect(NAME_OK)
        .lease(ms(300))
        .auto_renew(false);
    let ga = must("A: acquire with a 300 ms lease, no renewal", a.acquire()).await;
    sleep(ms(600)).await;
    assert!(
        !ga.is_held(),
        "A's guard still claims the hold 600 ms into a 300 ms lease without renewal"
    );
    let gb = must(
        "B: acquire after A's lease ran out",
        c2.mutex(&name).expect(NAME_OK).acquire_timeout(secs(5)),
    )
    .await;
    if let (Some(ta), Some(tb)) = (ga.token(), gb.token()) {
        assert!(tb > ta, "B's token {tb} is not greater than A's {ta}");
    }
    let (e, _) = fails("A: release after B took over", ga.release()).await;
    assert!(
        matches!(e, Error::NotOwner { .. } | Error::Lost { .. }),
        "A's stale release: expected NotOwner or Lost, got {e:?}"
    );
    assert!(
        gb.is_held(),
        "B's guard is no longer held after A's stale release"
    );
    assert_err!(
        within(
            STEP,
            "try_acquire",
            c3.mutex(&name).expect(NAME_OK).try_acquire()
        )
        .await,
        Error::Busy { .. },
        "a third contender after A's stale release (B must still hold)"
    );
    let info = describe(&c3, &name)
        .await
        .expect("B's hold must still be in the store after A's stale release");
    assert_eq!(info.holders.len(), 1, "holders: {:?}", info.holders);
    let h = &info.holders[0];
    assert_eq!(h.owner, gb.owner(), "the holder is not B");
    assert_eq!(h.token, gb.token(), "the holder's token is not B's");
    assert_eq!(h.meta.client_id, c2.id(), "the holder's client is not B's");
    must("B: release", gb.release()).await;
}

// ---- 5 ------------------------------------------------------------------------------------------

/// A holder that vanishes without releasing (a forgotten guard) blocks the lock until its lease
/// runs out, no longer and not much less. (A SIGKILLed `dlock run` holder is the part of this
/// scenario in the CLI's conformance tests.)
pub async fn holder_killed_taken_over(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("vanished");
    let lease = secs(1);
    let t0 = Instant::now();
    let g = must(
        "acquire with a 1 s lease, no renewal",
        c1.mutex(&name)
            .expect(NAME_OK)
            .lease(lease)
            .auto_renew(false)
            .acquire(),
    )
    .await;
    // A holder that vanished: no release, no renewal.
    std::mem::forget(g);
    let w = c2.mutex(&name).expect(NAME_OK);
    assert_err!(
        within(STEP, "try_acquire", w.try_acquire()).await,
        Error::Busy { .. },
        "a contender right after the (now vanished) holder took the lock"
    );
    let g2 = must(
        "waiter: acquire after the holder vanished",
        w.acquire_timeout(secs(5)),
    )
    .await;
    let after = t0.elapsed();
    eprintln!("vanished holder (1 s lease): taken over {after:?} after it was taken");
    assert!(
        after >= ms(800),
        "the waiter was granted {after:?} after a 1 s lease was taken: the lease did not hold"
    );
    assert!(
        after <= lease + ms(1500),
        "the waiter was granted {after:?} after a 1 s lease was taken; expected within lease + 1.5 s"
    );
    must("waiter: release", g2.release()).await;
}

// ---- 6 ------------------------------------------------------------------------------------------

/// A renewed 1 s lease held for 3 s (3 leases) stays exclusive and trusted throughout (each
/// renewal, sent every third of the lease, has the other two thirds to arrive on a loaded
/// machine).
pub async fn renewal_keeps_lock(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("renewed");
    let lease = ms(1000);
    let g = must(
        "acquire with a 1 s lease",
        c1.mutex(&name).expect(NAME_OK).lease(lease).acquire(),
    )
    .await;
    let lost = tokio::spawn(g.lost());
    let other = c2.mutex(&name).expect(NAME_OK);
    let start = Instant::now();
    let mut checks = 0;
    while start.elapsed() < secs(3) {
        sleep(ms(100)).await;
        let at = start.elapsed();
        assert_err!(
            within(STEP, "try_acquire", other.try_acquire()).await,
            Error::Busy { .. },
            "another contender {at:?} into a renewed {lease:?} lease"
        );
        assert!(
            g.is_held(),
            "is_held() turned false {at:?} into a {lease:?} lease renewed every {:?}",
            lease / 3
        );
        assert!(
            g.valid_for()
                .is_some_and(|v| v > Duration::ZERO && v <= lease),
            "valid_for() = {:?} {at:?} into a renewed {lease:?} lease",
            g.valid_for()
        );
        assert!(
            !lost.is_finished(),
            "lost() resolved {at:?} into a {lease:?} lease that is being renewed"
        );
        checks += 1;
    }
    assert!(checks >= 15, "only {checks} checks in 3 s");
    must("release", g.release()).await;
    let e = within(secs(2), "lost() after release", lost)
        .await
        .expect("the lost() task");
    assert!(
        matches!(e, Error::Lost { .. }),
        "lost() after release: {e:?}"
    );
    let g2 = must("the other contender after release", other.try_acquire()).await;
    must("release", g2.release()).await;
}

/// A task that resolves with when the guard's `lost()` fired, and its error.
fn lost_with_time(g: &crate::Guard) -> tokio::task::JoinHandle<(Instant, Error)> {
    let f = g.lost();
    tokio::spawn(async move {
        let e = f.await;
        (Instant::now(), e)
    })
}

// ---- 7 ------------------------------------------------------------------------------------------

/// When the store removes a hold (a forced release that breaks it, by another client), the
/// holder's lost() fires at its next renewal, is_held() turns false, and its release reports an
/// error without touching the next holder.
pub async fn lost_fires_when_store_removes_hold(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("removed");
    let lease = ms(900);
    let g = must(
        "acquire with a 900 ms lease",
        c1.mutex(&name).expect(NAME_OK).lease(lease).acquire(),
    )
    .await;
    let lost = lost_with_time(&g);
    sleep(ms(50)).await;
    let done = must(
        "force_release (break) from another client",
        c2.force_release(&name, crate::Force::Break),
    )
    .await;
    let forced = Instant::now();
    assert_eq!(
        (done.removed, done.revoked),
        (1, 0),
        "force_release should report the one hold it removed"
    );
    let (at, e) = within(secs(5), "lost() after force_release", lost)
        .await
        .expect("the lost() task");
    let after = at.saturating_duration_since(forced);
    eprintln!("force_release: lost() fired {after:?} later");
    assert!(
        matches!(e, Error::Lost { .. }),
        "lost() resolved with {e:?}"
    );
    let bound = lease / 3 + ms(500);
    assert!(
        after <= bound,
        "lost() fired {after:?} after the store removed the hold; expected within lease/3 + 500 ms = {bound:?}"
    );
    assert!(!g.is_held(), "is_held() is still true after lost() fired");
    let g2 = must(
        "another contender after force_release",
        c2.mutex(&name).expect(NAME_OK).try_acquire(),
    )
    .await;
    if let (Some(t1), Some(t2)) = (g.token(), g2.token()) {
        assert!(
            t2 > t1,
            "token {t2} after force_release is not greater than {t1}: fencing counters must survive it"
        );
    }
    let (e, _) = fails("release of the removed hold", g.release()).await;
    assert!(
        matches!(e, Error::Lost { .. } | Error::NotOwner { .. }),
        "release of the removed hold: expected Lost or NotOwner, got {e:?}"
    );
    assert!(g2.is_held(), "the new holder lost its hold");
    let info = describe(&c1, &name).await.expect("the new holder's hold");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, g2.owner());
    must("release", g2.release()).await;
}

// ---- 8 ------------------------------------------------------------------------------------------

/// Without renewal, lost() fires at sent + lease − lease/10, before anyone else can be granted.
pub async fn lost_fires_at_deadline_without_renewal(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("deadline");
    let lease = ms(500);
    let t0 = Instant::now();
    let g = must(
        "acquire with a 500 ms lease, no renewal",
        c1.mutex(&name)
            .expect(NAME_OK)
            .lease(lease)
            .auto_renew(false)
            .acquire(),
    )
    .await;
    let lost = lost_with_time(&g);
    let other = c2.mutex(&name).expect(NAME_OK);
    let waiter = tokio::spawn(async move {
        let r = other.acquire_timeout(secs(5)).await;
        (Instant::now(), r)
    });
    let (lost_at, e) = within(secs(3), "lost() of a 500 ms lease without renewal", lost)
        .await
        .expect("the lost() task");
    assert!(
        matches!(e, Error::Lost { .. }),
        "lost() resolved with {e:?}"
    );
    let fired = lost_at - t0;
    eprintln!("500 ms lease without renewal: lost() fired after {fired:?}");
    assert!(
        fired >= ms(300) && fired <= ms(1000),
        "lost() fired {fired:?} after acquiring a 500 ms lease; expected about 450 ms (300..=1000 ms)"
    );
    assert!(!g.is_held(), "is_held() is still true after lost() fired");
    let (granted_at, r) = within(secs(8), "the other contender", waiter)
        .await
        .expect("the waiter task");
    let g2 = r.unwrap_or_else(|e| panic!("the other contender: {e:?}"));
    assert!(
        granted_at > lost_at,
        "the other contender was granted {:?} before the holder's lost() fired",
        lost_at - granted_at
    );
    let (e, _) = fails("release after the lease ran out", g.release()).await;
    assert!(
        matches!(e, Error::Lost { .. } | Error::NotOwner { .. }),
        "release after the lease ran out: {e:?}"
    );
    must("release", g2.release()).await;
}

// ---- 7b -----------------------------------------------------------------------------------------

/// A revoked hold (a forced release by another client that revokes): the holder's lost() fires
/// at its next renewal, but nobody else is granted the name until the holder lets go (its
/// acknowledgement) — then a waiter gets it at once — or, without that, until the revoked hold's
/// lease runs out. A hold that nobody renews any more (`expire_in`) is removed at once.
pub async fn revoked_hold_keeps_others_out(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let name = s.name("revoked");
    let lease = ms(900);
    let m1 = c1.mutex(&name).expect(NAME_OK).lease(lease);
    let m2 = c2.mutex(&name).expect(NAME_OK).lease(lease);

    // 1. Revoked, then acknowledged by the holder's release.
    let g = must("acquire with a 900 ms lease", m1.acquire()).await;
    let lost = lost_with_time(&g);
    let waiter = {
        let m2 = m2.clone();
        tokio::spawn(async move {
            let g = m2.acquire_timeout(secs(20)).await;
            (Instant::now(), g)
        })
    };
    sleep(ms(100)).await;
    let done = must(
        "force_release (revoke) from another client",
        c2.force_release(&name, crate::Force::Revoke),
    )
    .await;
    let forced = Instant::now();
    assert_eq!(
        (done.removed, done.revoked),
        (0, 1),
        "a revoke should report the one hold it revoked: {done:?}"
    );
    let (lost_at, e) = within(secs(5), "lost() after a revoke", lost)
        .await
        .expect("the lost() task");
    let after = lost_at.saturating_duration_since(forced);
    assert!(
        matches!(e, Error::Lost { .. }),
        "lost() resolved with {e:?}"
    );
    assert!(
        e.to_string().contains("revoked"),
        "lost() should say the lock was revoked: {e}"
    );
    let bound = lease / 3 + ms(500);
    assert!(
        after <= bound,
        "lost() fired {after:?} after the revoke; expected within {bound:?}"
    );
    // The holder has not let go: still nobody else's, for longer than a lease would allow a
    // store that had simply dropped the hold.
    sleep(ms(300)).await;
    assert!(
        !waiter.is_finished(),
        "a waiter was granted a revoked hold's lock before its holder let go"
    );
    assert_busy(&m2, "try_acquire while the revoked holder has not let go").await;
    if let Some(info) = describe(&c2, &name).await {
        if let Some(h) = info.holders.first() {
            assert_eq!(
                h.status,
                crate::HoldStatus::Revoked,
                "describe of a revoked hold"
            );
        }
    }
    let t1 = g.token();
    let acked = Instant::now();
    let (e, _) = fails("release of the revoked hold", g.release()).await;
    assert!(
        matches!(e, Error::Lost { .. }),
        "release after a revoke: {e:?}"
    );
    let (granted_at, g2) = within(secs(25), "the waiter after the acknowledgement", waiter)
        .await
        .expect("the waiter task");
    let g2 = g2.unwrap_or_else(|e| panic!("the waiter after the acknowledgement: {e:?}"));
    let wait = granted_at.saturating_duration_since(acked);
    assert!(
        wait < secs(3),
        "the waiter was granted {wait:?} after the revoked holder let go"
    );
    assert!(
        granted_at >= lost_at,
        "granted before the revoked holder's lost() fired"
    );
    if let (Some(t1), Some(t2)) = (t1, g2.token()) {
        assert!(
            t2 > t1,
            "token {t2} after a revoke is not greater than {t1}"
        );
    }

    // 2. Revoked and never acknowledged: the lease ends it (a session store's client ends it
    // when the lease would have run out).
    let lost2 = tokio::spawn(g2.lost());
    let done = must(
        "second revoke",
        c1.force_release(&name, crate::Force::Revoke),
    )
    .await;
    assert_eq!(done.revoked, 1, "{done:?}");
    within(secs(5), "lost() after the second revoke", lost2)
        .await
        .expect("the lost() task");
    let started = Instant::now();
    let g3 = must(
        "the lock after an unacknowledged revoke's lease",
        m1.acquire_timeout(secs(10)),
    )
    .await;
    let took = started.elapsed();
    assert!(
        took <= lease + secs(2),
        "an unacknowledged revoked hold blocked the name for {took:?}, more than its lease"
    );
    drop(g2); // only now: its holder kept the guard all along
    must("release", g3.release()).await;

    // 3. A hold that nobody renews any more is removed at once.
    let mut g4 = must("acquire", m1.acquire()).await;
    match within(STEP, "expire_in(10s)", g4.expire_in(secs(10))).await {
        Ok(()) => {
            drop(g4);
            let done = must(
                "revoke of a detached hold",
                c2.force_release(&name, crate::Force::Revoke),
            )
            .await;
            assert_eq!(
                (done.removed, done.revoked),
                (1, 0),
                "a detached hold is removed, not revoked: {done:?}"
            );
            let g5 = must(
                "try_acquire after a detached hold was removed",
                m2.try_acquire(),
            )
            .await;
            must("release", g5.release()).await;
        }
        Err(Error::Unsupported(_)) => {
            assert_eq!(
                c1.capabilities().validity,
                Validity::Session,
                "only a session store may refuse expire_in"
            );
            must("release", g4.release()).await;
        }
        Err(e) => panic!("expire_in: {e:?}"),
    }
}
