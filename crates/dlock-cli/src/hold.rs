//! `dlock hold NAME`: take the lock with no command, print its fencing token, and hold it until a
//! signal, the end of standard input, or the exit of the process that started dlock.

use crate::exit::{self, CliResult, Failure};
use crate::run::{catch_signals, next_signal, released, take_or_interrupted};
use crate::store;
use crate::take::{TakeOpts, Taken};
use std::io::Write;

/// Why the hold ended.
enum Why {
    Signal(&'static str),
    StdinClosed,
    Lost(dlock::Error),
}

/// Whether the end of standard input should end the hold: a pipe, a FIFO, a socket, or the
/// terminal dlock is in the foreground of. Not `/dev/null` or a file (a script's background job
/// gets `/dev/null`, whose immediate end means nothing).
fn stdin_is_a_channel() -> bool {
    use nix::sys::stat::{fstat, SFlag};
    let Ok(st) = fstat(0) else { return false };
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFIFO || kind == SFlag::S_IFSOCK {
        return true;
    }
    let stdin = std::io::stdin();
    nix::unistd::isatty(0).unwrap_or(false)
        && nix::unistd::tcgetpgrp(&stdin).ok() == Some(nix::unistd::getpgrp())
}

/// Resolves when standard input reaches its end (never, if it is not a channel or reading it
/// fails, as it does from the background of a terminal).
async fn stdin_closed() {
    if !stdin_is_a_channel() {
        return std::future::pending().await;
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("dlock-stdin".into())
        .spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => {
                        let _ = tx.send(());
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // EIO from the background of a terminal: stop watching, keep holding.
                    Err(_) => return,
                }
            }
        });
    if spawned.is_err() || rx.await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Runs `dlock hold`.
pub async fn hold(o: TakeOpts) -> CliResult {
    dlock::LockName::new(o.name.as_str()).map_err(|e| Failure::usage(e.to_string()))?;
    let url = store::resolve(o.url.as_deref())?;
    let mut sigs = catch_signals()?;
    // Reading the terminal from the background must fail (EIO), not stop dlock while it holds.
    // SAFETY: sets a disposition (ignore); no handler code runs.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGTTIN,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    // The script that started dlock ends: so does the hold (its SIGTERM arrives like any other).
    #[cfg(target_os = "linux")]
    {
        let parent = nix::unistd::getppid();
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
        if nix::unistd::getppid() != parent {
            return Err(Failure::new(
                exit::SOFTWARE,
                "the process that started dlock hold is gone; nothing to hold the lock for",
            ));
        }
    }
    let Taken { guard, .. } = take_or_interrupted(&o, &url, &mut sigs).await?;
    let name = o.name.as_str();
    let token = guard.token().map(|t| t.to_string()).unwrap_or_default();
    {
        let mut out = std::io::stdout().lock();
        // A reader that went away (it only needed to know the lock was taken) is no reason to
        // let go: hold until told.
        let _ = writeln!(out, "{token}").and_then(|()| out.flush());
    }
    let why = {
        let lost = guard.lost();
        tokio::select! {
            r = next_signal(&mut sigs) => Why::Signal(r.signal.as_str()),
            _ = stdin_closed() => Why::StdinClosed,
            e = lost => Why::Lost(e),
        }
    };
    match why {
        Why::Lost(e) => {
            let _ = released(guard.release(), &mut sigs).await;
            eprintln!(
                "dlock: lock {name:?} was lost while held: {}",
                exit::one_line(&e.to_string())
            );
            Ok(exit::LOST)
        }
        Why::Signal(_) | Why::StdinClosed => {
            let what = match why {
                Why::Signal(s) => s.to_string(),
                _ => "the end of standard input".to_string(),
            };
            match released(guard.release(), &mut sigs).await {
                Ok(()) => {
                    if o.verbose {
                        eprintln!("dlock: released {name:?} on {what}");
                    }
                    Ok(exit::OK)
                }
                Err(e @ (dlock::Error::Lost { .. } | dlock::Error::NotOwner { .. })) => {
                    eprintln!(
                        "dlock: lock {name:?} was lost while held: {}",
                        exit::one_line(&e.to_string())
                    );
                    Ok(exit::LOST)
                }
                Err(e) => {
                    eprintln!(
                        "dlock: warning: could not release lock {name:?} ({}); its lease will end it",
                        exit::one_line(&e.to_string())
                    );
                    Ok(exit::OK)
                }
            }
        }
    }
}
