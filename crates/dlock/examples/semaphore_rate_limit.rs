//! A semaphore of N permits around a rate-limited API: many callers, never more than N at once.
//!
//! The "API" accepts at most 3 requests in flight and fails any request beyond that (as a
//! third-party API with a concurrency limit would answer 429). Four workers (each its own client,
//! as separate processes or machines would be) run 6 tasks each, 24 calls in all; every call
//! takes one permit of the semaphore `apis/geocoder` (3 permits) for as long as it is in flight.
//! The example asserts that the API never saw more than 3 calls at once, and that it did see 3:
//! the permits were used, not just a mutex in disguise.
//!
//! Runs on the embedded SQLite store in a temporary directory, no set-up:
//!
//! ```sh
//! cargo run -p dlock-rs --example semaphore_rate_limit
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PERMITS: u32 = 3;
const WORKERS: usize = 4;
const TASKS_PER_WORKER: usize = 6;

/// A rate-limited API: refuses a call while `PERMITS` calls are in flight.
#[derive(Default)]
struct Api {
    in_flight: AtomicUsize,
    most: AtomicUsize,
    calls: AtomicUsize,
}

impl Api {
    async fn call(&self, who: &str) -> Result<(), String> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let answer = if now > PERMITS as usize {
            Err(format!(
                "429 too many requests ({now} in flight, from {who})"
            ))
        } else {
            tokio::time::sleep(Duration::from_millis(60)).await;
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        answer
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    println!("store: {url}");
    let api = Arc::new(Api::default());

    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let client = dlock::connect(&url).await?;
        let permits = client.semaphore("apis/geocoder", PERMITS)?;
        for t in 0..TASKS_PER_WORKER {
            let (permits, api) = (permits.clone(), api.clone());
            tasks.push(tokio::spawn(async move {
                let who = format!("worker {w} task {t}");
                let permit = permits.acquire_timeout(Duration::from_secs(10)).await?;
                let result = api.call(&who).await;
                permit.release().await?;
                Ok::<_, dlock::Error>(result)
            }));
        }
    }
    let mut refused = Vec::new();
    for t in tasks {
        if let Err(e) = t.await?? {
            refused.push(e);
        }
    }

    let (most, calls) = (
        api.most.load(Ordering::SeqCst),
        api.calls.load(Ordering::SeqCst),
    );
    println!("{calls} calls answered, at most {most} in flight at once (limit {PERMITS})");
    assert!(refused.is_empty(), "the API refused calls: {refused:?}");
    assert_eq!(calls, WORKERS * TASKS_PER_WORKER);
    assert!(
        most <= PERMITS as usize,
        "never more than {PERMITS} at once"
    );
    assert_eq!(most, PERMITS as usize, "all {PERMITS} permits were used");
    println!("ok: {calls} calls, never more than {PERMITS} at once");
    Ok(())
}
