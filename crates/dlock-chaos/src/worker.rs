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
    /// The share of holds, in percent, that are long: their time between the read and the
    /// write draws from 0.5–1.5 times `long_ms` instead (0: none).
    #[arg(long, default_value_t = 0)]
    pub long_pct: u32,
    /// The mean of a long hold, in ms (see `long_pct`).
    #[arg(long, default_value_t = 0)]
    pub long_ms: u64,
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
    /// Take each hold with this `dlock` binary (`dlock run … -- dlock-chaos step …`) instead of
    /// the library: the holder the harness kills is then the `dlock run` process itself.
    #[arg(long, value_name = "DLOCK")]
    pub via_run: Option<std::path::PathBuf>,
    /// Take each hold as a term of the leader election of the name (campaign → work → resign),
    /// the term being the token.
    #[arg(long)]
    pub election: bool,
    /// Take the mutex in fair (FIFO) mode: waiters keep queue places, and on MySQL/MariaDB a
    /// waiter waits for its name's bell.
    #[arg(long)]
    pub fair: bool,
}

/// A hold of the loop: a mutex guard, or a term of the election.
enum Held {
    Lock(dlock::Guard),
    Lead(dlock::Leadership),
}

impl Held {
    fn guard(&self) -> &dlock::Guard {
        match self {
            Held::Lock(g) => g,
            Held::Lead(l) => l.guard(),
        }
    }

    async fn release(self) -> dlock::Result<()> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Lead(l) => l.resign().await,
        }
    }
}

/// Takes the next hold: the mutex, or a term of the election of the same name.
async fn take(
    mutex: &dlock::Mutex,
    election: Option<(&dlock::Election, bool)>,
    index: u32,
    wait: Duration,
) -> dlock::Result<Held> {
    match election {
        // A store without values (Redlock) takes only the empty value.
        Some((e, values)) => e
            .campaign_timeout(
                if values {
                    format!("worker {index}")
                } else {
                    String::new()
                },
                wait,
            )
            .await
            .map(Held::Lead),
        None => mutex.acquire_timeout(wait).await.map(Held::Lock),
    }
}

/// One hold's work as the command of `dlock run`: read, sleep, write, with the token from
/// `DLOCK_TOKEN`; reports `granted` and `wrote` like a worker (on the worker's stdout).
#[derive(Debug, Clone, clap::Args)]
pub struct StepArgs {
    /// Address of the fenced resource.
    #[arg(long)]
    pub resource: SocketAddr,
    /// The worker's index.
    #[arg(long)]
    pub index: u32,
    /// The hold's number in the worker.
    #[arg(long)]
    pub hold: u64,
    /// The shortest time between the read and the write, in ms (each hold draws from 1–1.5
    /// times this).
    #[arg(long)]
    pub hold_ms: u64,
    /// The lease, in ms (for the reported deadline).
    #[arg(long)]
    pub lease_ms: u64,
}

/// The mean of the next hold: `long_ms` for `long_pct` % of the holds, else `hold_ms`.
fn mean_hold(a: &WorkerArgs) -> u64 {
    if rand::random::<u32>() % 100 < a.long_pct {
        a.long_ms
    } else {
        a.hold_ms
    }
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
    // A store that is slow to answer while every lane's processes connect at once is tried
    // again (the harness waits 30 s for every process to be ready).
    let until = std::time::Instant::now() + Duration::from_secs(25);
    let client = dlock::connect_until(&a.url, opts, until)
        .await
        .map_err(|e| (69, format!("connect: {e}")))?;
    let mutex = client
        .mutex(a.name.clone())
        .map_err(|e| (64, format!("mutex: {e}")))?
        .fair(a.fair);
    let res = ResourceClient::connect(a.resource)
        .await
        .map_err(|e| (69, format!("resource: {e}")))?;
    Ok((client, mutex, res))
}

/// The harness closes stdin to say "finish the current iteration and stop".
fn stop_on_stdin_close() -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        let _ = stop_tx.send(true);
    });
    stop
}

/// The worker loop of `--via-run`: each hold is one `dlock run` of `dlock-chaos step`.
async fn run_via_dlock(a: WorkerArgs, dlock: std::path::PathBuf) -> i32 {
    emit(&Event::Ready {
        at: now_us(),
        pid: std::process::id(),
    });
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            emit(&Event::Error {
                at: now_us(),
                what: format!("own binary: {e}"),
            });
            return 70;
        }
    };
    let mut stop = stop_on_stdin_close();
    let end = tokio::time::Instant::now() + Duration::from_millis(a.run_ms);
    let mut hold = 0;
    while hold < a.iterations && tokio::time::Instant::now() < end && !*stop.borrow() {
        hold += 1;
        let child = tokio::process::Command::new(&dlock)
            .args([
                "run",
                "--url",
                &a.url,
                "--wait",
                "30s",
                "--kill-after",
                "1s",
            ])
            .args(["--ttl", &format!("{}ms", a.lease_ms), &a.name, "--"])
            .arg(&exe)
            .args(["step", "--resource", &a.resource.to_string()])
            .args(["--index", &a.index.to_string(), "--hold", &hold.to_string()])
            .args(["--hold-ms", &mean_hold(&a).to_string()])
            .args(["--lease-ms", &a.lease_ms.to_string()])
            .stdin(std::process::Stdio::null())
            // Read only for the sentinel's kill (its failures are reported by exit code below;
            // a waiting `dlock run` told to stop says so on stderr: not news).
            .stderr(std::process::Stdio::piped())
            .env_remove("DLOCK_URL")
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                emit(&Event::Error {
                    at: now_us(),
                    what: format!("dlock run: {e}"),
                });
                return 69;
            }
        };
        emit(&Event::Run {
            hold,
            at: now_us(),
            pid: child.id().unwrap_or(0),
        });
        let sentinel_kill = child.stderr.take().map(|e| tokio::spawn(sentinel_kill(e)));
        let mut stopping = false;
        let status = tokio::select! {
            s = child.wait() => s,
            _ = stop.changed() => {
                stopping = true;
                // Told to stop: a waiting `dlock run` gives up, a holding one stops its command
                // and releases.
                if let Some(pid) = child.id() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                child.wait().await
            }
        };
        let at = now_us();
        // The stderr pipe closes when the sentinel leaves too (at once after `dlock run`).
        let killed_at = match sentinel_kill {
            Some(t) => tokio::time::timeout(Duration::from_secs(2), t)
                .await
                .ok()
                .and_then(|r| r.ok())
                .flatten(),
            None => None,
        };
        match (status.ok().and_then(|s| s.code()), killed_at) {
            // The step reported the end of its hold; 75: not granted within the wait; no code:
            // killed by the harness.
            (Some(0 | 75) | None, _) => {}
            // The sentinel killed the command when a starved `dlock run` stopped vouching for
            // the hold: the hold ended then, not when `dlock run` exited.
            (Some(code), Some(killed)) => emit(&Event::Lost {
                hold,
                at: killed,
                reason: format!("the sentinel killed the command (dlock run exited {code})"),
            }),
            (Some(76), None) => emit(&Event::Lost {
                hold,
                at,
                reason: "dlock run exited 76".into(),
            }),
            (Some(_), None) if stopping => {}
            (Some(code), None) => emit(&Event::Error {
                at,
                what: format!("dlock run exited {code}"),
            }),
        }
    }
    emit(&Event::Finished {
        at: now_us(),
        iterations: hold,
    });
    0
}

/// Reads `dlock run`'s stderr to its end; the time (µs of `CLOCK_MONOTONIC`, as [`now_us`]) at
/// which its sentinel killed the command because `dlock run` stopped vouching for the hold
/// (`dlock: dlock did not vouch for … [monotonic S.US]`), if it did.
async fn sentinel_kill(stderr: tokio::process::ChildStderr) -> Option<i64> {
    use tokio::io::AsyncBufReadExt as _;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut at = None;
    while let Ok(Some(line)) = lines.next_line().await {
        if line.contains("did not vouch for the hold") {
            at = at.or_else(|| monotonic_stamp(&line));
        }
    }
    at
}

/// The `[monotonic S.US]` stamp at the end of a sentinel's line, in µs.
fn monotonic_stamp(line: &str) -> Option<i64> {
    let (_, rest) = line.rsplit_once("[monotonic ")?;
    let (secs, micros) = rest.strip_suffix(']')?.split_once('.')?;
    Some(secs.parse::<i64>().ok()? * 1_000_000 + micros.parse::<i64>().ok()?)
}

/// `dlock-chaos step`: one hold's read, sleep and write under `dlock run`.
///
/// `dlock run` tells its command of a lost lock with SIGTERM: that is the command's `lost()`, so
/// the step reports `lost` the moment it arrives and stops before its write (a well-behaved
/// command), instead of the worker reporting it when `dlock run` has exited.
pub async fn step(a: StepArgs) -> i32 {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            emit(&Event::Error {
                at: now_us(),
                what: format!("SIGTERM handler: {e}"),
            });
            return 70;
        }
    };
    tokio::select! {
        r = step_once(&a) => match r {
            Ok(()) => 0,
            Err(what) => {
                emit(&Event::Error { at: now_us(), what });
                69
            }
        },
        _ = term.recv() => {
            emit(&Event::Lost {
                hold: a.hold,
                at: now_us(),
                reason: "SIGTERM from dlock run".into(),
            });
            143
        }
    }
}

async fn step_once(a: &StepArgs) -> Result<(), String> {
    let granted = now_us();
    let token = std::env::var("DLOCK_TOKEN")
        .ok()
        .and_then(|t| t.parse::<u64>().ok());
    // 1–1.5 times the mean: the work outlasts the lease, so a command that outlived its killed
    // `dlock run` would write after the next holder read.
    let hold_ms = a.hold_ms + rand::random::<u64>() % (a.hold_ms / 2 + 1);
    emit(&Event::Granted {
        hold: a.hold,
        at: granted,
        token,
        deadline: granted + (a.lease_ms as i64) * 900,
        planned_ms: Some(hold_ms),
    });
    let resource = |e: std::io::Error| format!("resource: {e}");
    let mut res = ResourceClient::connect(a.resource)
        .await
        .map_err(resource)?;
    let read = res.read(a.index, a.hold, token).await.map_err(resource)?;
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    let w = Write {
        worker: a.index,
        hold: a.hold,
        token,
        claimed_from: granted,
        read,
        value: read + 1,
    };
    let accepted = res.write(&w).await.map_err(resource)?;
    emit(&Event::Wrote {
        hold: a.hold,
        at: now_us(),
        accepted,
        held: true,
    });
    // The command's hold ends here: `dlock run` releases as soon as it exits (its own release
    // comes a moment later, and nothing of this hold touches the resource after this).
    let at = now_us();
    emit(&Event::Released {
        hold: a.hold,
        at,
        done: at,
        result: ReleaseResult::Ok,
    });
    Ok(())
}

/// Runs the worker loop; returns the process exit code.
pub async fn run(a: WorkerArgs) -> i32 {
    if let Some(dlock) = a.via_run.clone() {
        return run_via_dlock(a, dlock).await;
    }
    let (client, mutex, mut res) = match setup(&a).await {
        Ok(x) => x,
        Err((code, what)) => {
            emit(&Event::Error { at: now_us(), what });
            return code;
        }
    };
    let election = if a.election {
        match client.election(a.name.clone()) {
            Ok(e) => Some(e.lease(Duration::from_millis(a.lease_ms))),
            Err(e) => {
                emit(&Event::Error {
                    at: now_us(),
                    what: format!("election: {e}"),
                });
                return 64;
            }
        }
    } else {
        None
    };
    let values = client.capabilities().values;
    emit(&Event::Ready {
        at: now_us(),
        pid: std::process::id(),
    });
    let mut stop = stop_on_stdin_close();
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_millis(a.run_ms);
    let mut iterations = 0;
    while iterations < a.iterations && tokio::time::Instant::now() < end && !*stop.borrow() {
        let wait = end
            .saturating_duration_since(tokio::time::Instant::now())
            .min(Duration::from_secs(5));
        let acquired = tokio::select! {
            r = take(&mutex, election.as_ref().map(|e| (e, values)), a.index, wait) => r,
            _ = stop.changed() => break,
        };
        let held = match acquired {
            Ok(h) => h,
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
        let token = held.guard().token();
        let mean = mean_hold(&a);
        let hold_ms = mean / 2 + rand::random::<u64>() % (mean + 1);
        emit(&Event::Granted {
            hold,
            at: granted,
            token,
            deadline: deadline_of(held.guard()),
            planned_ms: Some(hold_ms),
        });
        // Watch the hold: report renewals (the deadline moving) and lost().
        let held = Arc::new(held);
        let released = Arc::new(AtomicBool::new(false));
        let watcher = {
            let lost = held.guard().lost();
            let released = released.clone();
            let held = held.clone();
            tokio::spawn(async move {
                tokio::pin!(lost);
                let guard = held.guard();
                let mut last = deadline_of(guard);
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
                            let d = deadline_of(guard);
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
        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
        let still = held.guard().is_held();
        if !still && !a.naive {
            emit(&Event::Skipped { hold, at: now_us() });
        }
        let accepted = if !still && !a.naive {
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
        if still || a.naive {
            emit(&Event::Wrote {
                hold,
                at: now_us(),
                accepted,
                held: still,
            });
        }
        released.store(true, Ordering::SeqCst);
        watcher.abort();
        let _ = watcher.await;
        let at = now_us();
        let result = match Arc::try_unwrap(held) {
            Ok(held) => match held.release().await {
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

/// The hold's local deadline on the clock of `now_us` (`now` when it is no longer held).
fn deadline_of(g: &dlock::Guard) -> i64 {
    g.valid_for()
        .map(|v| now_us() + v.as_micros() as i64)
        .unwrap_or_else(now_us)
}

#[cfg(test)]
mod tests {
    use super::monotonic_stamp;

    #[test]
    fn the_sentinel_stamp_is_read_in_microseconds() {
        let line = "dlock: dlock did not vouch for the hold in time (stopped, or starved of CPU): \
                    killed the command's process group before its lease could end \
                    [monotonic 1234.000567]";
        assert_eq!(monotonic_stamp(line), Some(1_234_000_567));
        assert_eq!(monotonic_stamp("dlock: no stamp"), None);
        assert_eq!(monotonic_stamp("[monotonic 12.x]"), None);
    }
}
