//! One client process of a chaos run: loops acquire → read → sleep → write → release on one lock
//! name for a bounded count and time, and reports every step as a JSON line on stdout.
//!
//! A careful worker checks `Guard::is_held()` just before it writes and skips the write when the
//! hold was lost: then a write that arrives after someone else's grant means the lock itself was
//! wrong. A `--naive` worker writes without that check, which is what a process paused between
//! its check and its write (SIGSTOP, a long GC pause) amounts to: only the resource's fencing
//! check can refuse its late write.

use crate::event::{now_us, Event, ReleaseResult};
use crate::resource::{ResourceClient, Write};
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What one worker process is told to do.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Store URL.
    #[arg(long)]
    pub url: String,
    /// Lock name.
    #[arg(long)]
    pub name: String,
    /// Address of the fenced resource.
    #[arg(long)]
    pub resource: SocketAddr,
    /// This worker's index (written with every write).
    #[arg(long)]
    pub index: u32,
    /// Mean time spent inside the lock between the read and the write, in ms (each hold draws
    /// from 0.5–1.5 times this).
    #[arg(long)]
    pub hold_ms: u64,
    /// The lease, in ms.
    #[arg(long)]
    pub lease_ms: u64,
    /// At most this many acquisitions.
    #[arg(long)]
    pub iterations: u64,
    /// Stop starting acquisitions after this many ms.
    #[arg(long)]
    pub run_ms: u64,
    /// Write without checking that the hold is still valid.
    #[arg(long)]
    pub naive: bool,
}

fn emit(ev: &Event) {
    if let Ok(line) = serde_json::to_string(ev) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Connects to the store and the resource; on failure the exit code and what failed.
async fn setup(
    a: &WorkerArgs,
) -> Result<(dlock::Client, dlock::Mutex, ResourceClient), (i32, String)> {
    let opts = dlock::ClientOptions::default().lease(Duration::from_millis(a.lease_ms));
    let client = dlock::connect_with(&a.url, opts)
        .await
        .map_err(|e| (69, format!("connect: {e}")))?;
    let mutex = client
        .mutex(a.name.clone())
        .map_err(|e| (64, format!("mutex: {e}")))?;
    let res = ResourceClient::connect(a.resource)
        .await
        .map_err(|e| (69, format!("resource: {e}")))?;
    Ok((client, mutex, res))
}

/// Runs the worker loop; returns the process exit code.
pub async fn run(a: WorkerArgs) -> i32 {
    let (_client, mutex, mut res) = match setup(&a).await {
        Ok(x) => x,
        Err((code, what)) => {
            emit(&Event::Error { at: now_us(), what });
            return code;
        }
    };
    emit(&Event::Ready {
        at: now_us(),
        pid: std::process::id(),
    });
    // The harness closes stdin to say "finish the current iteration and stop".
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        let _ = stop_tx.send(true);
    });
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_millis(a.run_ms);
    let mut iterations = 0;
    while iterations < a.iterations && tokio::time::Instant::now() < end && !*stop.borrow() {
        let wait = end
            .saturating_duration_since(tokio::time::Instant::now())
            .min(Duration::from_secs(5));
        let acquired = tokio::select! {
            r = mutex.acquire_timeout(wait) => r,
            _ = stop.changed() => break,
        };
        let guard = match acquired {
            Ok(g) => g,
            Err(e) if e.is_not_granted() => continue,
            Err(e) => {
                emit(&Event::Error {
                    at: now_us(),
                    what: e.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        iterations += 1;
        let hold = iterations;
        let granted = now_us();
        let token = guard.token();
        emit(&Event::Granted {
            hold,
            at: granted,
            token,
            deadline: deadline_of(&guard),
        });
        // Watch the hold: report renewals (the deadline moving) and lost().
        let guard = Arc::new(guard);
        let released = Arc::new(AtomicBool::new(false));
        let watcher = {
            let lost = guard.lost();
            let released = released.clone();
            let guard = guard.clone();
            tokio::spawn(async move {
                tokio::pin!(lost);
                let mut last = deadline_of(&guard);
                loop {
                    tokio::select! {
                        e = &mut lost => {
                            if !released.load(Ordering::SeqCst) {
                                emit(&Event::Lost { hold, at: now_us(), reason: e.to_string() });
                            }
                            return;
                        }
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {
                            if !guard.is_held() {
                                continue;
                            }
                            let d = deadline_of(&guard);
                            if (d - last).abs() > 5_000 {
                                last = d;
                                emit(&Event::Deadline { hold, at: now_us(), deadline: d });
                            }
                        }
                    }
                }
            })
        };
        let read = match res.read(a.index, hold, token).await {
            Ok(v) => v,
            Err(e) => {
                emit(&Event::Error {
                    at: now_us(),
                    what: format!("resource: {e}"),
                });
                return 69;
            }
        };
        let hold_ms = a.hold_ms / 2 + rand::random::<u64>() % (a.hold_ms + 1);
        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
        let held = guard.is_held();
        if !held && !a.naive {
            emit(&Event::Skipped { hold, at: now_us() });
        }
        let accepted = if !held && !a.naive {
            false
        } else {
            let w = Write {
                worker: a.index,
                hold,
                token,
                claimed_from: granted,
                read,
                value: read + 1,
            };
            match res.write(&w).await {
                Ok(ok) => ok,
                Err(e) => {
                    emit(&Event::Error {
                        at: now_us(),
                        what: format!("resource: {e}"),
                    });
                    return 69;
                }
            }
        };
        if held || a.naive {
            emit(&Event::Wrote {
                hold,
                at: now_us(),
                accepted,
                held,
            });
        }
        released.store(true, Ordering::SeqCst);
        watcher.abort();
        let _ = watcher.await;
        let at = now_us();
        let result = match Arc::try_unwrap(guard) {
            Ok(guard) => match guard.release().await {
                Ok(()) => ReleaseResult::Ok,
                Err(dlock::Error::NotOwner { .. }) => ReleaseResult::NotOwner,
                Err(dlock::Error::Lost { .. }) => ReleaseResult::Lost,
                Err(_) => ReleaseResult::Error,
            },
            Err(_) => ReleaseResult::Error,
        };
        emit(&Event::Released {
            hold,
            at,
            done: now_us(),
            result,
        });
        let pause = rand::random::<u64>() % 5;
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    emit(&Event::Finished {
        at: now_us(),
        iterations,
    });
    0
}

/// The hold's local deadline as wall-clock microseconds (`now` when it is no longer held).
fn deadline_of(g: &dlock::Guard) -> i64 {
    g.valid_for()
        .map(|v| now_us() + v.as_micros() as i64)
        .unwrap_or_else(now_us)
}
