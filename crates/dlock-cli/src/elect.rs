//! `dlock elect`: a hot-standby supervisor. Runs the command only while this dlock leads the
//! election NAME; on a loss it stops the command and campaigns again.

use crate::exit::{self, CliResult, Failure};
use crate::run::{catch_signals, next_signal, start, supervise, Ran};
use crate::store;
use crate::take::{fmt_dur, url_for};
use std::ffi::OsString;
use std::time::{Duration, Instant};

/// How long a resignation may take before dlock gives up on it (the lease ends the term).
const RESIGN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long dlock waits before campaigning again after the store failed.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The options of `dlock elect`.
#[derive(Debug, Clone)]
pub struct ElectOpts {
    /// `--url`
    pub url: Option<String>,
    /// `--ttl`: the term's lease.
    pub ttl: Duration,
    /// `--value`
    pub value: String,
    /// `--once`
    pub once: bool,
    /// `--kill-after`
    pub kill_after: Duration,
    /// `-v`
    pub verbose: bool,
    /// NAME
    pub name: String,
    /// CMD and its arguments.
    pub cmd: Vec<OsString>,
}

/// Runs `dlock elect`.
pub async fn elect(o: ElectOpts) -> CliResult {
    let name = o.name.as_str();
    dlock::LockName::new(name).map_err(|e| Failure::usage(e.to_string()))?;
    let url = store::resolve(o.url.as_deref())?;
    let mut sigs = catch_signals()?;
    let url = url_for(&url, o.ttl);
    let client = tokio::select! {
        // A standby waits for its term: a store that turns it away for now is tried again.
        c = store::connect_until(&url, Instant::now() + dlock::UNAVAILABLE_PATIENCE) => c?,
        r = next_signal(&mut sigs) => return Ok(exit::for_signal(r.signal as i32)),
    };
    let election = client
        .election(name)
        .map_err(|e| Failure::usage(e.to_string()))?
        .lease(o.ttl);
    loop {
        let started = Instant::now();
        let campaign = tokio::select! {
            r = election.campaign(o.value.as_str()) => r,
            r = next_signal(&mut sigs) => {
                // Give the library a moment to withdraw the abandoned campaign.
                tokio::time::sleep(Duration::from_millis(50)).await;
                eprintln!("dlock: interrupted by {} while campaigning for {name:?}", r.signal.as_str());
                return Ok(exit::for_signal(r.signal as i32));
            }
        };
        let leading = match campaign {
            Ok(l) => l,
            Err(
                e @ (dlock::Error::InvalidConfig(_)
                | dlock::Error::InvalidName(_)
                | dlock::Error::Unsupported(_)),
            ) => {
                return Err(Failure::usage(format!(
                    "cannot campaign for {name:?} on {}: {e}",
                    client.url()
                )))
            }
            Err(e) => {
                eprintln!(
                    "dlock: campaign for {name:?} on {} failed: {}; trying again in {}",
                    client.url(),
                    exit::one_line(&e.to_string()),
                    fmt_dur(RETRY_AFTER)
                );
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_AFTER) => continue,
                    r = next_signal(&mut sigs) => return Ok(exit::for_signal(r.signal as i32)),
                }
            }
        };
        let term = leading.term().map(|t| t.to_string());
        if o.verbose {
            eprintln!(
                "dlock: leading {name:?} on {} after {} (term {})",
                client.url(),
                fmt_dur(started.elapsed()),
                term.as_deref().unwrap_or("none")
            );
        }
        let env = [
            ("DLOCK_NAME", Some(name.to_string())),
            ("DLOCK_TOKEN", term.clone()),
            ("DLOCK_TERM", term),
        ];
        let child = match start(&o.cmd, &env, leading.guard()) {
            Ok(c) => c,
            Err(f) => {
                let _ = tokio::time::timeout(RESIGN_TIMEOUT, leading.resign()).await;
                return Err(f);
            }
        };
        let Ran { code, lost } = supervise(child, leading.guard(), o.kill_after, &mut sigs).await;
        if !lost {
            // The command ended by itself: the term ends with it.
            match tokio::time::timeout(RESIGN_TIMEOUT, leading.resign()).await {
                Ok(Ok(())) => {
                    if o.verbose {
                        eprintln!("dlock: resigned {name:?}");
                    }
                }
                Ok(Err(e)) => eprintln!(
                    "dlock: warning: could not resign {name:?} ({}); its lease will end the term",
                    exit::one_line(&e.to_string())
                ),
                Err(_) => eprintln!(
                    "dlock: warning: no answer to the resignation of {name:?} within {}; its lease will end the term",
                    fmt_dur(RESIGN_TIMEOUT)
                ),
            }
            return Ok(code);
        }
        let _ = tokio::time::timeout(RESIGN_TIMEOUT, leading.resign()).await;
        if o.once {
            return Ok(exit::LOST);
        }
        eprintln!("dlock: campaigning for {name:?} again");
    }
}
