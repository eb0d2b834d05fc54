//! `dlock run`: run a command while holding a mutex.

use crate::exit::{self, CliResult, Failure};
use crate::signals::{self, Received};
use crate::store;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// How long the final release may take before dlock gives up on it (the lease ends the hold).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// The options of `dlock run`, parsed and validated by clap.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// `--url`
    pub url: Option<String>,
    /// `--ttl`
    pub ttl: Duration,
    /// `--wait`
    pub wait: Option<Duration>,
    /// `--no-wait`
    pub no_wait: bool,
    /// `--hold-at-least`
    pub hold_at_least: Option<Duration>,
    /// `--fair`
    pub fair: bool,
    /// `--kill-after`
    pub kill_after: Duration,
    /// NAME
    pub name: String,
    /// CMD and its arguments (not empty).
    pub cmd: Vec<OsString>,
}

/// The next signal dlock received (never resolves if the signal thread is gone).
async fn next_signal(rx: &mut UnboundedReceiver<Received>) -> Received {
    match rx.recv().await {
        Some(r) => r,
        None => std::future::pending().await,
    }
}

fn fmt_dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Describes who holds `name`, best effort, for the "busy" message.
async fn holder_of(client: &dlock::Client, name: &str) -> String {
    let info = tokio::time::timeout(Duration::from_secs(2), client.describe(name)).await;
    match info {
        Ok(Ok(Some(info))) => match info.holders.first() {
            Some(h) => format!(" (held by pid {} on {})", h.meta.pid, h.meta.host),
            None => String::new(),
        },
        _ => String::new(),
    }
}

/// Connects and acquires according to the options.
async fn acquire(o: &RunOpts, url: &str) -> Result<(dlock::Client, dlock::Guard), Failure> {
    let client = store::connect(url).await?;
    let mutex = client.mutex(o.name.as_str())?.lease(o.ttl).fair(o.fair);
    let r = if o.no_wait {
        mutex.try_acquire().await
    } else if let Some(w) = o.wait {
        mutex.acquire_timeout(w).await
    } else {
        mutex.acquire().await
    };
    match r {
        Ok(g) => Ok((client, g)),
        Err(dlock::Error::Busy { .. }) => {
            let who = holder_of(&client, &o.name).await;
            Err(Failure::new(
                exit::NOT_GRANTED,
                format!("lock {:?} is busy{who}; command not run", o.name),
            ))
        }
        Err(dlock::Error::Timeout { waited, .. }) => {
            let who = holder_of(&client, &o.name).await;
            Err(Failure::new(
                exit::NOT_GRANTED,
                format!(
                    "gave up waiting for lock {:?} after {}{who}; command not run",
                    o.name,
                    fmt_dur(Duration::from_millis(waited.as_millis() as u64))
                ),
            ))
        }
        Err(e) => Err(Failure::new(
            exit::for_error(&e),
            format!("cannot acquire lock {:?} on {}: {e}", o.name, client.url()),
        )),
    }
}

fn send(pid: Pid, sig: Signal) {
    if let Err(e) = kill(pid, sig) {
        tracing::debug!(%pid, ?sig, error = %e, "could not signal the command");
    }
}

/// Runs `dlock run`.
pub async fn run(o: RunOpts) -> CliResult {
    // Usage errors first, before touching the store.
    dlock::LockName::new(o.name.as_str()).map_err(|e| Failure::usage(e.to_string()))?;
    let url = store::resolve(o.url.as_deref())?;
    let mut sigs = signals::catch().map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("cannot install signal handlers: {e}"),
        )
    })?;

    // Connecting and waiting can be interrupted: then the command is not run.
    let (client, guard) = tokio::select! {
        r = acquire(&o, &url) => r?,
        r = next_signal(&mut sigs) => {
            // Give the library a moment to withdraw the abandoned request.
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Err(Failure::new(
                exit::for_signal(r.signal as i32),
                format!("interrupted by {} while waiting for lock {:?}; command not run", r.signal.as_str(), o.name),
            ));
        }
    };
    let granted = Instant::now();
    tracing::debug!(name = %o.name, token = ?guard.token(), "lock granted");

    let program = &o.cmd[0];
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&o.cmd[1..]).env("DLOCK_NAME", &o.name);
    match guard.token() {
        Some(t) => cmd.env("DLOCK_TOKEN", t.to_string()),
        None => cmd.env_remove("DLOCK_TOKEN"),
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (code, what) = match e.kind() {
                std::io::ErrorKind::NotFound => (exit::NOT_FOUND, "command not found".to_string()),
                std::io::ErrorKind::PermissionDenied => {
                    (exit::CANNOT_EXECUTE, "permission denied".to_string())
                }
                _ => (exit::CANNOT_EXECUTE, format!("cannot execute: {e}")),
            };
            if let Ok(Err(e)) = tokio::time::timeout(RELEASE_TIMEOUT, guard.release()).await {
                tracing::warn!(error = %e, "release after a failed start");
            }
            return Err(Failure::new(
                code,
                format!("{}: {what}", program.to_string_lossy()),
            ));
        }
    };
    let pid = Pid::from_raw(child.id().map(|p| p as i32).unwrap_or(-1));

    let lost = guard.lost();
    tokio::pin!(lost);
    let mut was_lost = false;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            e = &mut lost, if !was_lost => {
                was_lost = true;
                eprintln!(
                    "dlock: {}; stopping the command (SIGTERM now, SIGKILL in {})",
                    exit::one_line(&e.to_string()),
                    fmt_dur(o.kill_after)
                );
                send(pid, Signal::SIGTERM);
                kill_at = Some(Instant::now() + o.kill_after);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now).into()), if kill_at.is_some() => {
                kill_at = None;
                send(pid, Signal::SIGKILL);
            }
            r = next_signal(&mut sigs) => {
                if r.needs_forwarding(pid) {
                    tracing::debug!(signal = r.signal.as_str(), "forwarding");
                    send(pid, r.signal);
                }
            }
        }
    };
    let code = match status {
        Ok(st) => match (st.code(), st.signal()) {
            (Some(c), _) => c,
            (None, Some(s)) => exit::for_signal(s),
            (None, None) => exit::SOFTWARE,
        },
        Err(e) => {
            send(pid, Signal::SIGKILL);
            eprintln!("dlock: lost track of the command: {e}");
            exit::SOFTWARE
        }
    };

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

/// How the hold ended after the command.
enum End {
    Released,
    Kept,
    Lost(dlock::Error),
}

/// Releases the hold, or with `--hold-at-least` hands it to the store's lease for the rest of the
/// period. Store errors are reported and otherwise ignored (the lease ends the hold).
async fn finish(
    o: &RunOpts,
    client: &dlock::Client,
    mut guard: dlock::Guard,
    granted: Instant,
    sigs: &mut UnboundedReceiver<Received>,
) -> End {
    let remaining = o
        .hold_at_least
        .map(|d| d.saturating_sub(granted.elapsed()))
        .unwrap_or_default();
    let result = if remaining.is_zero() {
        bounded(guard.release(), sigs).await
    } else if client.capabilities().validity == dlock::Validity::Session
        || remaining < dlock::MIN_LEASE
    {
        // A session store cannot keep a hold after its holder lets go, and a lease this short is
        // not worth a round trip: keep the guard (renewed) until the period is over.
        tokio::select! {
            _ = tokio::time::sleep(remaining) => {}
            _ = next_signal(sigs) => {}
        }
        bounded(guard.release(), sigs).await
    } else {
        tracing::debug!(remaining = ?remaining, "keeping the lock with the store's lease");
        match bounded(guard.expire_in(remaining), sigs).await {
            Ok(()) => return End::Kept,
            Err(e) => Err(e),
        }
    };
    match result {
        Ok(()) => End::Released,
        Err(e @ (dlock::Error::Lost { .. } | dlock::Error::NotOwner { .. })) => End::Lost(e),
        Err(e) => {
            eprintln!(
                "dlock: warning: could not release lock {:?} ({}); its lease will end it",
                o.name,
                exit::one_line(&e.to_string())
            );
            End::Released
        }
    }
}

/// Runs a release-like step, giving up after [`RELEASE_TIMEOUT`] or on a signal.
async fn bounded(
    f: impl std::future::Future<Output = dlock::Result<()>>,
    sigs: &mut UnboundedReceiver<Received>,
) -> dlock::Result<()> {
    tokio::select! {
        r = tokio::time::timeout(RELEASE_TIMEOUT, f) => match r {
            Ok(r) => r,
            Err(_) => Err(dlock::Error::Unavailable(format!(
                "no answer from the store within {}",
                fmt_dur(RELEASE_TIMEOUT)
            ))),
        },
        r = next_signal(sigs) => Err(dlock::Error::Unavailable(format!(
            "interrupted by {}",
            r.signal.as_str()
        ))),
    }
}
