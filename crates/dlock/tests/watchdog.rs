//! The renewal watchdog batches: every hold of a client is extended in one `extend` call per
//! round (at most 500 holds per call), at about lease/3, and a failing store is retried without
//! spinning.

mod common;

use common::counting;
use dlock::ClientOptions;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_holds_of_a_client_are_renewed_in_one_call_per_round() {
    let backend = counting("watchdog-batch");
    let lease = Duration::from_millis(600);
    let client = backend.client(ClientOptions::default().lease(lease));
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(
            client
                .mutex(format!("n{i}"))
                .unwrap()
                .acquire()
                .await
                .unwrap(),
        );
    }
    // 3 leases: about 9 renewal rounds of lease/3 each.
    tokio::time::sleep(lease * 3).await;
    assert!(guards.iter().all(|g| g.is_held()));
    let batches = backend.batches.lock().unwrap().clone();
    eprintln!("extend calls (holds per call): {batches:?}");
    let renewed: usize = batches.iter().sum();
    // Every hold was renewed several times, in few calls carrying many holds each.
    assert!(renewed >= 50 * 6, "only {renewed} renewals in {batches:?}");
    assert!(
        batches.len() <= 16,
        "{} extend calls for 50 holds over 3 leases: not batched ({batches:?})",
        batches.len()
    );
    assert!(
        batches.contains(&50),
        "no call carried all 50 holds: {batches:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_retried_calmly_and_the_hold_is_lost_at_its_deadline() {
    let backend = counting("watchdog-fail");
    let lease = Duration::from_millis(1000);
    let client = backend.client(ClientOptions::default().lease(lease));
    let guard = client.mutex("x").unwrap().acquire().await.unwrap();
    let granted = Instant::now();
    backend.failing.store(true, Ordering::SeqCst);
    let lost = tokio::time::timeout(lease * 2, guard.lost()).await;
    let at = granted.elapsed();
    assert!(lost.is_ok(), "lost() did not fire while renewals failed");
    // Deadline = lease - lease/10 after the grant was sent.
    assert!(
        at >= Duration::from_millis(800) && at <= Duration::from_millis(1000),
        "lost() fired at {at:?}"
    );
    // Retries every min(lease/10, 1 s) = 100 ms between lease/3 and the deadline: a handful.
    let calls = backend.failed_calls.load(Ordering::SeqCst);
    eprintln!("lost() at {at:?} after {calls} failed renewal calls");
    assert!((2..=15).contains(&calls), "{calls} failed renewal calls");
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_holds_are_renewed_in_calls_of_at_most_500() {
    let backend = counting("watchdog-many");
    let lease = Duration::from_millis(1500);
    let client = backend.client(ClientOptions::default().lease(lease));
    let mut guards = Vec::new();
    for i in 0..1_700 {
        guards.push(
            client
                .mutex(format!("n{i}"))
                .unwrap()
                .try_acquire()
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(lease * 2).await;
    assert!(guards.iter().all(|g| g.is_held()), "a hold was lost");
    let batches = backend.batches.lock().unwrap().clone();
    let renewed: usize = batches.iter().sum();
    eprintln!("extend calls (holds per call): {batches:?}");
    assert!(
        renewed >= 1_700 * 3,
        "only {renewed} renewals in {batches:?}"
    );
    assert!(
        batches.iter().all(|&n| n <= 500),
        "an extend call carried more than 500 holds: {batches:?}"
    );
    assert!(
        batches.iter().filter(|&&n| n == 500).count() >= 3,
        "the 1 700 holds were not renewed in full calls of 500: {batches:?}"
    );
}

/// A grant wakes the watchdog only when the new hold's first renewal comes before the
/// watchdog's next round: a long-lease hold first (the watchdog sleeps towards its renewal), then
/// a short-lease hold that must be renewed long before that. Without the wake-up the short hold
/// would run out; with a wake-up per grant it would be renewed too, so this checks that the
/// skipped wake-ups never include a needed one (and the long hold is still renewed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_is_due_before_the_watchdog_wakes_it() {
    let backend = counting("watchdog-kick");
    let client = backend.client(ClientOptions::default());
    let long = client
        .mutex("long")
        .unwrap()
        .lease(Duration::from_secs(6))
        .acquire()
        .await
        .unwrap();
    // Let the watchdog go to sleep towards the long hold's renewal (~2 s away).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let short = client
        .mutex("short")
        .unwrap()
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    // A hold of the same length as the last one is due no earlier than the watchdog's next
    // round: no wake-up needed, and it must be renewed all the same.
    let short2 = client
        .mutex("short2")
        .unwrap()
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        short.is_held(),
        "the short hold ran out: no renewal in time"
    );
    assert!(short2.is_held(), "the second short hold ran out");
    assert!(long.is_held());
    let renewed: usize = backend.batches.lock().unwrap().iter().sum();
    // short and short2: renewed every ~200 ms for 1.5 s.
    assert!(renewed >= 10, "{renewed} renewals in {:?}", t.elapsed());
}

/// A campaign whose new term is lost while it is announced (the store stalls past the lease:
/// renewals fail meanwhile) does not return that term: nobody could see its `lost()` before the
/// next leader was elected. It campaigns again and returns a later term that holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_lost_before_the_campaign_returns_is_not_handed_out() {
    let backend = counting("watchdog-elect-late");
    let lease = Duration::from_millis(400);
    let client = backend.client(ClientOptions::default().lease(lease));
    let election = client.election("late").unwrap();
    backend.stall_set_value_ms.store(1200, Ordering::SeqCst);
    let started = Instant::now();
    let leadership = tokio::time::timeout(Duration::from_secs(10), election.campaign("v"))
        .await
        .expect("the campaign ended")
        .expect("the campaign led");
    assert!(
        leadership.is_leader(),
        "campaign returned a term already lost (term {:?}, after {:?})",
        leadership.term(),
        started.elapsed()
    );
    // The stalled first term was given up: this one came after it.
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert!(leadership.term() >= Some(2), "term {:?}", leadership.term());
    assert_eq!(backend.stall_set_value_ms.load(Ordering::SeqCst), 0);
    leadership.resign().await.unwrap();
}

/// A multi-lock whose first name is lost while it waits for the second (renewals fail
/// meanwhile) does not hand out that hold: it lets go of everything and takes the names again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_does_not_return_a_hold_lost_while_it_waited() {
    let lease = Duration::from_millis(400);
    let waiter_store = counting("watchdog-multi-late");
    let waiter = waiter_store.client(ClientOptions::default().lease(lease));
    let other = counting("watchdog-multi-late").client(ClientOptions::default().lease(lease));
    let b = other.mutex("b").unwrap().acquire().await.unwrap();
    waiter_store.failing.store(true, Ordering::SeqCst);
    let both = tokio::spawn(async move { waiter.multi(["a", "b"]).unwrap().acquire().await });
    // "a" is taken at once and lost at its deadline (its renewals fail) while "b" is waited for.
    tokio::time::sleep(lease * 2).await;
    waiter_store.failing.store(false, Ordering::SeqCst);
    b.release().await.unwrap();
    let both = tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .expect("the multi-lock was granted")
        .unwrap()
        .expect("the multi-lock was granted");
    assert!(
        both.is_held(),
        "a multi-lock returned with a lost hold: tokens {:?}",
        both.tokens()
    );
    both.release().await.unwrap();
}
