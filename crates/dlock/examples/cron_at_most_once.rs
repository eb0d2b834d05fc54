//! A scheduled job that runs at most once per tick, however many hosts are scheduled to run it.
//!
//! Four "hosts" (each its own [`dlock::Client`], as separate machines would have) wake up at every
//! tick of a 500 ms schedule, each a little late by a random clock skew of up to 100 ms, and race
//! to run the job. Each one *tries* the lock without waiting: the winner runs the job, the others
//! skip the tick. The job itself is quick (20 ms): if the winner released the lock when done, a
//! host whose clock runs late would find it free and run the job a second time in the same tick.
//! So the winner keeps the lock for the rest of the skew window with
//! [`Guard::expire_in`](dlock::Guard::expire_in) — the hold stays in the store after the guard is
//! gone and ends by itself (what `dlock run --hold-at-least 250ms` does). The example asserts that
//! every tick ran the job exactly once.
//!
//! Runs on the embedded SQLite store in a temporary directory, no set-up:
//!
//! ```sh
//! cargo run -p dlock-rs --example cron_at_most_once
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const HOSTS: usize = 4;
const TICKS: usize = 4;
const PERIOD: Duration = Duration::from_millis(500);
/// How late a host's clock may be: the hold lasts at least this long after the job started.
const MAX_SKEW: Duration = Duration::from_millis(100);
const HOLD_AT_LEAST: Duration = Duration::from_millis(250);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    println!("store: {url}");
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..TICKS).map(|_| AtomicU32::new(0)).collect());
    let start = Instant::now() + Duration::from_millis(200);

    let mut hosts = Vec::new();
    for host in 0..HOSTS {
        let client = dlock::connect(&url).await?;
        let runs = runs.clone();
        hosts.push(tokio::spawn(async move {
            let job = client.mutex("cron/hourly-report")?;
            for tick in 0..TICKS {
                let skew =
                    Duration::from_millis(rand::random::<u64>() % MAX_SKEW.as_millis() as u64);
                tokio::time::sleep_until(start + PERIOD * tick as u32 + skew).await;
                match job.try_acquire().await {
                    Ok(mut guard) => {
                        let started = Instant::now();
                        runs[tick].fetch_add(1, Ordering::SeqCst);
                        println!(
                            "tick {tick}: host {host} runs the job (token {:?}, {skew:?} late)",
                            guard.token()
                        );
                        // The job.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        // Keep others out until HOLD_AT_LEAST after the start; then the store
                        // ends the hold by itself.
                        let left = HOLD_AT_LEAST.saturating_sub(started.elapsed());
                        guard.expire_in(left).await?;
                        drop(guard);
                    }
                    Err(e) if e.is_not_granted() => {
                        println!(
                            "tick {tick}: host {host} skips: another host has it ({skew:?} late)"
                        )
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok::<(), dlock::Error>(())
        }));
    }
    for h in hosts {
        h.await??;
    }

    let counts: Vec<u32> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    println!("runs per tick: {counts:?}");
    assert!(
        counts.iter().all(|&n| n == 1),
        "every tick must run the job exactly once: {counts:?}"
    );
    println!("ok: {TICKS} ticks, {HOSTS} hosts, the job ran exactly once per tick");
    Ok(())
}
