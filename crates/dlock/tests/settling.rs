//! A client's own background clean-ups (a dropped guard's release, a dropped waiter's cancel)
//! finish before the same client acquires the name again, however slow the store is.

mod common;

use common::counting;
use dlock::{ClientOptions, Error};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SLOW: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_does_not_keep_its_own_client_out() {
    let backend = counting("settle-guard");
    let c = backend.client(ClientOptions::default());
    let m = c.mutex("job").unwrap();
    let g = m.acquire().await.unwrap();
    backend
        .slow_cleanup_ms
        .store(SLOW.as_millis() as u64, Ordering::SeqCst);
    let t0 = Instant::now();
    drop(g);
    // The release is still on its way; the same client's try (through another handle: the same
    // handle would re-enter the hold) waits for it and gets the lock.
    let g = c
        .mutex("job")
        .unwrap()
        .try_acquire()
        .await
        .expect("granted after the client's own release");
    assert!(
        t0.elapsed() >= SLOW - Duration::from_millis(20),
        "{:?}",
        t0.elapsed()
    );
    backend.slow_cleanup_ms.store(0, Ordering::SeqCst);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_fair_waiter_leaves_no_place_in_front_of_its_client() {
    let backend = counting("settle-waiter");
    let c = backend.client(ClientOptions::default());
    let holder = c.mutex("job").unwrap().acquire().await.unwrap();
    // A fair waiter takes a queue place, then its caller gives up (the future is dropped).
    backend
        .slow_cleanup_ms
        .store(SLOW.as_millis() as u64, Ordering::SeqCst);
    let fair = c.mutex("job").unwrap().fair(true);
    let waited = tokio::time::timeout(Duration::from_millis(100), fair.acquire()).await;
    assert!(waited.is_err(), "the holder still holds");
    backend.slow_cleanup_ms.store(0, Ordering::SeqCst);
    holder.release().await.unwrap();
    // Its queue place is still being removed: a try of the same client waits for that instead
    // of finding the name queued for.
    let g = c.mutex("job").unwrap().try_acquire().await;
    assert!(
        !matches!(g, Err(Error::Busy { .. })),
        "the client's own abandoned place kept it out: {g:?}"
    );
    g.unwrap().release().await.unwrap();
}
