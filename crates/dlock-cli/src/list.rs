//! `dlock list`, `dlock unlock` and `dlock info`.

use crate::exit::{self, CliResult, Failure};
use crate::store;
use crate::table::{cell, render, Align};
use std::time::{Duration, UNIX_EPOCH};

fn ms(d: Option<u64>) -> String {
    match d {
        Some(ms) => {
            // Whole milliseconds below 10 s, tenths of a second above: readable and stable.
            let d = if ms < 10_000 {
                Duration::from_millis(ms)
            } else {
                Duration::from_millis(ms / 100 * 100)
            };
            humantime::format_duration(d).to_string()
        }
        None => "-".into(),
    }
}

fn at(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn short(owner: &str) -> String {
    cell(&owner.chars().take(8).collect::<String>())
}

/// The text table of `dlock list`; a VALUE column (an election leader's value, clipped) when a
/// hold has one.
pub fn table(infos: &[dlock::LockInfo]) -> String {
    let values = infos
        .iter()
        .any(|i| i.holders.iter().any(|h| h.meta.value.is_some()));
    let mut rows = Vec::new();
    for info in infos {
        for h in &info.holders {
            rows.push(vec![
                cell(&info.name),
                info.kind.to_string(),
                h.mode.as_str().to_string(),
                h.status.as_str().to_string(),
                short(&h.owner),
                cell(&h.meta.host),
                h.meta.pid.to_string(),
                h.token.map_or_else(|| "-".into(), |t| t.to_string()),
                ms(h.lease_left_ms),
                at(h.acquired_at_ms),
            ]);
            if values {
                let v = h.meta.value.as_deref().unwrap_or("-");
                let clipped: String = v.chars().take(40).collect();
                if let Some(r) = rows.last_mut() {
                    r.push(cell(&clipped));
                }
            }
        }
        for w in &info.waiters {
            rows.push(vec![
                cell(&info.name),
                info.kind.to_string(),
                w.mode.as_str().to_string(),
                format!("waiting #{}", w.position + 1),
                short(&w.owner),
                cell(&w.meta.host),
                w.meta.pid.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
            if values {
                if let Some(r) = rows.last_mut() {
                    r.push("-".into());
                }
            }
        }
    }
    use Align::{Left as L, Right as R};
    let mut heads = vec![
        "NAME",
        "KIND",
        "MODE",
        "STATE",
        "OWNER",
        "HOST",
        "PID",
        "TOKEN",
        "LEASE LEFT",
        "ACQUIRED AT",
    ];
    let mut aligns = vec![L, L, L, L, L, L, R, R, R, L];
    if values {
        heads.push("VALUE");
        aligns.push(L);
    }
    render(&heads, &aligns, &rows)
}

/// Runs `dlock list` once.
pub async fn list(url: Option<&str>, json: bool, prefix: &str) -> CliResult {
    let url = store::resolve(url)?;
    let client = store::connect(&url).await?;
    let infos = client.list(prefix).await.map_err(|e| {
        Failure::new(
            exit::for_error(&e),
            format!("cannot list locks on {}: {e}", client.url()),
        )
    })?;
    if json {
        println!("{}", to_json(&infos)?);
    } else {
        print!("{}", view(&infos, prefix));
    }
    Ok(exit::OK)
}

fn to_json(infos: &[dlock::LockInfo]) -> Result<String, Failure> {
    serde_json::to_string(infos)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))
}

/// The table of `dlock list`, or the line saying there is nothing to show.
fn view(infos: &[dlock::LockInfo], prefix: &str) -> String {
    if !infos.is_empty() {
        table(infos)
    } else if prefix.is_empty() {
        "no locks held\n".to_string()
    } else {
        format!("no locks held under {prefix:?}\n")
    }
}

/// What `dlock list --watch` does.
#[derive(Debug, Clone)]
pub struct WatchOpts {
    /// The time between the starts of two rounds.
    pub interval: Duration,
    /// Stop after this many rounds (`None`: until interrupted).
    pub count: Option<u64>,
    /// One JSON array per line per round.
    pub json: bool,
}

/// Clears the screen and moves the cursor home (a terminal's redraw).
pub const CLEAR: &str = "\x1b[H\x1b[2J";
/// Hides the cursor while the view is redrawn.
pub const HIDE_CURSOR: &str = "\x1b[?25l";
/// Shows the cursor again (the terminal restored).
pub const SHOW_CURSOR: &str = "\x1b[?25h";

/// Shows the cursor again when the watch ends, however it ends.
struct CursorGuard;

impl Drop for CursorGuard {
    fn drop(&mut self) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{SHOW_CURSOR}");
        let _ = out.flush();
    }
}

/// The first line of a round in the text view: the store, the prefix, the interval, the time.
fn header(url: &str, prefix: &str, interval: Duration, round: u64) -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let under = if prefix.is_empty() {
        String::new()
    } else {
        format!(" {prefix:?}")
    };
    format!(
        "dlock list{under} on {url}, every {}: round {round}, {now}",
        humantime::format_duration(interval)
    )
}

/// Runs `dlock list --watch`: one listing per round until `--count` rounds are done or SIGINT /
/// SIGTERM arrives (exit 0 then). A round whose listing fails shows the error in the view (on
/// stderr with `--json`) and the next round tries again; after `--count` rounds the exit code is
/// 69 if the last round failed, else 0.
pub async fn watch(url: Option<&str>, prefix: &str, opts: WatchOpts) -> CliResult {
    use std::io::{IsTerminal, Write};
    use tokio::signal::unix::{signal, SignalKind};

    let url = store::resolve(url)?;
    let client = store::connect(&url).await?;
    let shown_url = client.url().to_string();
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot catch SIGINT: {e}")))?;
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot catch SIGTERM: {e}")))?;
    let tty = !opts.json && std::io::stdout().is_terminal();
    let _cursor = if tty {
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{HIDE_CURSOR}");
        Some(CursorGuard)
    } else {
        None
    };
    let mut ticks = tokio::time::interval(opts.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round: u64 = 0;
    let mut last_failed;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = int.recv() => return Ok(exit::OK),
            _ = term.recv() => return Ok(exit::OK),
        }
        round += 1;
        let listed = tokio::select! {
            r = client.list(prefix) => r,
            _ = int.recv() => return Ok(exit::OK),
            _ = term.recv() => return Ok(exit::OK),
        };
        last_failed = listed.is_err();
        let mut text = String::new();
        if opts.json {
            match listed {
                Ok(infos) => {
                    text.push_str(&to_json(&infos)?);
                    text.push('\n');
                }
                Err(e) => eprintln!("dlock: cannot list locks on {shown_url}: {e} (trying again)"),
            }
        } else {
            if tty {
                text.push_str(CLEAR);
            } else if round > 1 {
                text.push('\n');
            }
            text.push_str(&header(&shown_url, prefix, opts.interval, round));
            text.push_str("\n\n");
            match listed {
                Ok(infos) => text.push_str(&view(&infos, prefix)),
                Err(e) => text.push_str(&format!(
                    "cannot list locks: {}\n(trying again every {})\n",
                    e.to_string().replace('\n', " "),
                    humantime::format_duration(opts.interval)
                )),
            }
        }
        {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        if opts.count.is_some_and(|n| round >= n) {
            break;
        }
    }
    Ok(if last_failed {
        exit::UNAVAILABLE
    } else {
        exit::OK
    })
}

/// Runs `dlock unlock`: revokes the holds of `name` (`--force`), or removes them at once
/// (`--break`).
pub async fn unlock(url: Option<&str>, name: &str, force: bool, brk: bool) -> CliResult {
    dlock::LockName::new(name).map_err(|e| Failure::usage(e.to_string()))?;
    if !force && !brk {
        return Err(Failure::usage(format!(
            "refusing to unlock {name:?} without --force (revoke: its holders are told to stop, \
             and nobody else gets it before they have) or --break (remove the holds now, while \
             their holders may still be working)"
        )));
    }
    let how = if brk {
        dlock::Force::Break
    } else {
        dlock::Force::Revoke
    };
    let url = store::resolve(url)?;
    let client = store::connect(&url).await?;
    let done = client.force_release(name, how).await.map_err(|e| {
        Failure::new(
            exit::for_error(&e),
            format!("cannot unlock {name:?} on {}: {e}", client.url()),
        )
    })?;
    println!("{}", unlock_report(name, &done, client.session_timeout()));
    Ok(exit::OK)
}

fn holds(n: u64) -> String {
    format!("{n} hold{}", if n == 1 { "" } else { "s" })
}

/// What `dlock unlock` did, in one or two sentences.
fn unlock_report(name: &str, done: &dlock::Forced, session: Option<Duration>) -> String {
    let mut out = format!("lock {name:?}: removed {}", holds(done.removed));
    if done.revoked > 0 {
        let until = match (done.revoked_lease_left_ms, session) {
            (Some(left), _) => format!("its lease runs out (at most {})", ms(Some(left))),
            (None, Some(t)) => format!(
                "its holder's session ends (a dead holder's within {})",
                humantime::format_duration(t)
            ),
            (None, None) => "its holder's session ends".to_string(),
        };
        out.push_str(&format!(
            ", revoked {}: each holder learns it at its next renewal and stops; nobody else \
             gets the lock until the holder has let go or {until}. `dlock unlock --break` \
             removes the holds now",
            holds(done.revoked)
        ));
    }
    out
}

/// What `dlock info --json` prints.
#[derive(Debug, serde::Serialize)]
struct Info {
    version: &'static str,
    default_url: Option<String>,
    default_path: Option<String>,
    env_url: Option<String>,
    url: Option<String>,
    enabled_backends: Vec<&'static str>,
}

/// Runs `dlock info`.
pub fn info(json: bool) -> CliResult {
    let default_path = store::default_path();
    let default_url = store::default_url();
    let env_url = store::env_url().map(|u| dlock::redact_url(&u));
    let info = Info {
        version: env!("CARGO_PKG_VERSION"),
        default_url: default_url.clone(),
        default_path: default_path.as_ref().map(|p| p.display().to_string()),
        url: env_url.clone().or(default_url),
        env_url,
        enabled_backends: dlock::enabled_backends(),
    };
    if json {
        let s = serde_json::to_string_pretty(&info)
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
        println!("{s}");
        return Ok(exit::OK);
    }
    let none = || "(none: no home directory)".to_string();
    println!("dlock {}", info.version);
    println!(
        "default store:    {}",
        info.default_url.clone().unwrap_or_else(none)
    );
    println!(
        "  file:           {}",
        info.default_path.clone().unwrap_or_else(none)
    );
    println!(
        "DLOCK_URL:        {}",
        info.env_url.as_deref().unwrap_or("(not set)")
    );
    println!(
        "store used:       {}{}",
        info.url.clone().unwrap_or_else(none),
        if info.env_url.is_some() {
            "  (from DLOCK_URL)"
        } else {
            "  (default; --url or DLOCK_URL override it)"
        }
    );
    println!("backends:         {}", info.enabled_backends.join(", "));
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lists_a_hold_from_memory() {
        let client = dlock::connect("mem://cli-list-test")
            .await
            .expect("connect");
        let g = client
            .mutex("jobs/a\nb")
            .expect("name")
            .acquire()
            .await
            .expect("acquire");
        let infos = client.list("").await.expect("list");
        let t = table(&infos);
        assert!(t.starts_with("NAME"), "{t}");
        assert!(t.contains("jobs/a\\nb"), "{t}");
        assert!(t.contains("mutex"), "{t}");
        assert!(t.contains(&std::process::id().to_string()), "{t}");
        assert_eq!(t.lines().count(), 2, "{t}");
        g.release().await.expect("release");
    }

    #[test]
    fn reports_what_an_unlock_did() {
        let broke = dlock::Forced {
            removed: 1,
            ..Default::default()
        };
        assert_eq!(
            unlock_report("a", &broke, None),
            "lock \"a\": removed 1 hold"
        );
        let revoked = dlock::Forced {
            removed: 0,
            revoked: 2,
            revoked_lease_left_ms: Some(29_000),
        };
        let r = unlock_report("a", &revoked, None);
        assert!(
            r.starts_with("lock \"a\": removed 0 holds, revoked 2 holds"),
            "{r}"
        );
        assert!(r.contains("at most 29s"), "{r}");
        let zk = dlock::Forced {
            revoked: 1,
            ..Default::default()
        };
        let r = unlock_report("a", &zk, Some(Duration::from_secs(4)));
        assert!(r.contains("within 4s"), "{r}");
    }

    #[test]
    fn formats_lease() {
        assert_eq!(ms(Some(1500)), "1s 500ms");
        assert_eq!(ms(Some(29_456)), "29s 400ms");
        assert_eq!(ms(None), "-");
    }
}
