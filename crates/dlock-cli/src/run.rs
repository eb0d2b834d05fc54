//! `dlock run`: run a command while holding a lock.

use crate::child::{Child, Exit};
use crate::exit::{self, CliResult, Failure};
use crate::signals::{self, Received};
use crate::store;
use crate::take::{self, fmt_dur, TakeOpts, Taken};
use nix::sys::signal::Signal;
use std::ffi::OsString;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// How long the final release may take before dlock gives up on it (the lease ends the hold).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the sentinel is told how long the hold is trusted.
const TRUST_EVERY: Duration = Duration::from_millis(100);

/// The options of `dlock run`, parsed and validated by clap.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// How to take the lock.
    pub take: TakeOpts,
    /// `--hold-at-least`
    pub hold_at_least: Option<Duration>,
    /// `--kill-after`
    pub kill_after: Duration,
    /// CMD and its arguments (not empty; `sh -c STRING` for `-c STRING`).
    pub cmd: Vec<OsString>,
}

/// The next signal dlock received (never resolves if the signal thread is gone).
pub async fn next_signal(rx: &mut UnboundedReceiver<Received>) -> Received {
    match rx.recv().await {
        Some(r) => r,
        None => std::future::pending().await,
    }
}

/// Takes the lock, unless a signal comes first (then nothing runs).
pub async fn take_or_interrupted(
    o: &TakeOpts,
    url: &str,
    sigs: &mut UnboundedReceiver<Received>,
) -> Result<Taken, Failure> {
    tokio::select! {
        r = take::take(o, url) => r,
        r = next_signal(sigs) => {
            // Give the library a moment to withdraw the abandoned request.
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(Failure::new(
                exit::for_signal(r.signal as i32),
                format!("interrupted by {} while waiting for lock {:?}; command not run", r.signal.as_str(), o.name),
            ))
        }
    }
}

/// Installs the signal handlers, mapping a failure to exit 70.
pub fn catch_signals() -> Result<UnboundedReceiver<Received>, Failure> {
    signals::catch().map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("cannot install signal handlers: {e}"),
        )
    })
}

/// Runs `dlock run`. Runs on the main thread (the command is spawned from it: see `child`).
pub async fn run(o: RunOpts) -> CliResult {
    // Usage errors first, before touching the store.
    dlock::LockName::new(o.take.name.as_str()).map_err(|e| Failure::usage(e.to_string()))?;
    let url = store::resolve(o.take.url.as_deref())?;
    let mut sigs = catch_signals()?;
    let Taken {
        client,
        guard,
        granted,
    } = take_or_interrupted(&o.take, &url, &mut sigs).await?;
    let name = o.take.name.as_str();

    let token = guard.token().map(|t| t.to_string());
    let env = [
        ("DLOCK_NAME", Some(name.to_string())),
        ("DLOCK_TOKEN", token),
    ];
    let child = match start(&o.cmd, &env, &guard) {
        Ok(c) => c,
        Err(f) => {
            if let Ok(Err(e)) = tokio::time::timeout(RELEASE_TIMEOUT, guard.release()).await {
                tracing::warn!(error = %e, "release after a failed start");
            }
            return Err(f);
        }
    };
    let Ran {
        code,
        lost: was_lost,
    } = supervise(child, &guard, o.kill_after, &mut sigs).await;

    if was_lost {
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, guard.release()).await;
        return Ok(exit::LOST);
    }

    let ended = finish(&o, &client, guard, granted, &mut sigs).await;
    match ended {
        End::Kept | End::Released => Ok(code),
        End::Lost(e) => {
            eprintln!(
                "dlock: the lock was lost before the command finished: {}",
                exit::one_line(&e.to_string())
            );
            Ok(exit::LOST)
        }
    }
}

/// Starts CMD (`cmd[0]` with the rest as arguments) tied to dlock (see `child`) while `guard`
/// holds; a command that cannot be started is exit 127 (not found) or 126, and one whose lock is
/// no longer trusted is not started (exit 76).
pub fn start(
    cmd: &[OsString],
    env: &[(&str, Option<String>)],
    guard: &dlock::Guard,
) -> Result<Child, Failure> {
    let program = &cmd[0];
    // dlock may have been stopped or starved between the grant and here.
    let Some(trusted) = guard.valid_for() else {
        return Err(Failure::new(
            exit::LOST,
            "the lock was lost before the command could start; it did not run".to_string(),
        ));
    };
    Child::spawn(program, &cmd[1..], env, trusted).map_err(|e| {
        let (code, what) = match e.kind() {
            std::io::ErrorKind::NotFound => (exit::NOT_FOUND, "command not found".to_string()),
            std::io::ErrorKind::PermissionDenied => {
                (exit::CANNOT_EXECUTE, "permission denied".to_string())
            }
            _ => (exit::CANNOT_EXECUTE, format!("cannot execute: {e}")),
        };
        Failure::new(code, format!("{}: {what}", program.to_string_lossy()))
    })
}

/// How a supervised command ended.
pub struct Ran {
    /// Its exit code (128+N for signal N).
    pub code: i32,
    /// The lock was lost while it ran (it was then stopped).
    pub lost: bool,
}

/// Runs the started command to its end while `guard` holds: passes dlock's signals on, keeps
/// the sentinel told how long the hold is trusted (so a dlock that is stopped or frozen cannot
/// let the command outlive the lock), and on a loss stops the command's group (SIGTERM, SIGKILL
/// after `kill_after`). Returns once the command and everything left in its group are gone.
pub async fn supervise(
    mut child: Child,
    guard: &dlock::Guard,
    kill_after: Duration,
    sigs: &mut UnboundedReceiver<Received>,
) -> Ran {
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut was_lost = false;
    let mut kill_at: Option<Instant> = None;
    let mut tell = tokio::time::interval(TRUST_EVERY);
    tell.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            e = &mut lost, if !was_lost => {
                was_lost = true;
                child.stand_down();
                eprintln!(
                    "dlock: {}; stopping the command (SIGTERM now, SIGKILL in {})",
                    exit::one_line(&e.to_string()),
                    fmt_dur(kill_after)
                );
                child.signal_group(Signal::SIGTERM);
                child.signal_group(Signal::SIGCONT);
                kill_at = Some(Instant::now() + kill_after);
            }
            _ = tell.tick(), if !was_lost => {
                if let Some(v) = guard.valid_for() {
                    child.trust_for(v);
                }
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now).into()), if kill_at.is_some() => {
                kill_at = None;
                child.signal_group(Signal::SIGKILL);
            }
            r = next_signal(sigs) => {
                if r.needs_forwarding(child.has_terminal()) {
                    tracing::debug!(signal = r.signal.as_str(), "forwarding");
                    child.signal_group(r.signal);
                }
            }
        }
    };
    let code = match status {
        Ok(Exit::Code(c)) => c,
        Ok(Exit::Signal(s)) => exit::for_signal(s),
        Err(e) => {
            child.signal_group(Signal::SIGKILL);
            eprintln!("dlock: lost track of the command: {e}");
            exit::SOFTWARE
        }
    };
    // Nothing the command started may run on once the lock is let go.
    let left = if was_lost {
        kill_at.map_or(Duration::ZERO, |k| {
            k.saturating_duration_since(Instant::now())
        })
    } else {
        kill_after
    };
    if child.end_group(left).await > 0 {
        eprintln!(
            "dlock: the command left processes running in its process group; they were stopped \
             before the lock was let go"
        );
    }
    child.finish();
    Ran {
        code,
        // A command the sentinel killed because dlock froze past the trust ended with the lock.
        lost: was_lost || !guard.is_held(),
    }
}

/// How the hold ended after the command.
enum End {
    Released,
    Kept,
    Lost(dlock::Error),
}

/// Releases the hold, or with `--hold-at-least` keeps it for the rest of the period: handed to
/// the store's lease, or, on a store whose holds end with the holder's session, by staying alive
/// holding it. Store errors are reported and otherwise ignored (the lease ends the hold).
async fn finish(
    o: &RunOpts,
    client: &dlock::Client,
    mut guard: dlock::Guard,
    granted: Instant,
    sigs: &mut UnboundedReceiver<Received>,
) -> End {
    let name = o.take.name.as_str();
    let remaining = o
        .hold_at_least
        .map(|d| d.saturating_sub(granted.elapsed()))
        .unwrap_or_default();
    let result = if remaining.is_zero() {
        released(guard.release(), sigs).await
    } else if client.capabilities().validity == dlock::Validity::Session
        || remaining < dlock::MIN_LEASE
    {
        // A session store cannot keep a hold after its holder lets go, and a lease this short is
        // not worth a round trip: keep the guard (renewed) until the period is over.
        if o.take.verbose {
            eprintln!(
                "dlock: keeping {name:?} for the rest of --hold-at-least ({}) in this process",
                fmt_dur(remaining)
            );
        }
        let lost = guard.lost();
        tokio::select! {
            _ = tokio::time::sleep(remaining) => {}
            r = next_signal(sigs) => {
                eprintln!(
                    "dlock: {} ended the --hold-at-least period of {name:?} early",
                    r.signal.as_str()
                );
            }
            e = lost => return End::Lost(e),
        }
        released(guard.release(), sigs).await
    } else {
        tracing::debug!(remaining = ?remaining, "keeping the lock with the store's lease");
        match released(guard.expire_in(remaining), sigs).await {
            Ok(()) => {
                if o.take.verbose {
                    eprintln!(
                        "dlock: {name:?} stays held by the store's lease for {} (--hold-at-least)",
                        fmt_dur(remaining)
                    );
                }
                return End::Kept;
            }
            Err(e) => Err(e),
        }
    };
    match result {
        Ok(()) => {
            if o.take.verbose {
                eprintln!("dlock: released {name:?}");
            }
            End::Released
        }
        Err(e @ (dlock::Error::Lost { .. } | dlock::Error::NotOwner { .. })) => End::Lost(e),
        Err(e) => {
            eprintln!(
                "dlock: warning: could not release lock {name:?} ({}); its lease will end it",
                exit::one_line(&e.to_string())
            );
            End::Released
        }
    }
}

/// Runs a release-like step to its end, bounded by [`RELEASE_TIMEOUT`]. A first signal does not
/// cut it short (a SIGTERM sent to dlock's whole group arrives here after the command ended);
/// a second one does.
pub async fn released(
    f: impl std::future::Future<Output = dlock::Result<()>>,
    sigs: &mut UnboundedReceiver<Received>,
) -> dlock::Result<()> {
    let deadline = tokio::time::Instant::now() + RELEASE_TIMEOUT;
    tokio::pin!(f);
    let mut seen = 0;
    loop {
        tokio::select! {
            r = tokio::time::timeout_at(deadline, &mut f) => return match r {
                Ok(r) => r,
                Err(_) => Err(dlock::Error::Unavailable(format!(
                    "no answer from the store within {}",
                    fmt_dur(RELEASE_TIMEOUT)
                ))),
            },
            r = next_signal(sigs) => {
                seen += 1;
                if seen >= 2 {
                    return Err(dlock::Error::Unavailable(format!(
                        "interrupted by a second {} before the store answered",
                        r.signal.as_str()
                    )));
                }
            }
        }
    }
}
