//! `dlock demo`: the ticket sale. Buyer processes race to buy one ticket each from one inventory
//! file, first without a lock (it oversells), then under a dlock mutex (it does not).
//!
//! The parent spawns `dlock demo-buyer` processes. Every buyer reports `ready` on a shared pipe
//! and then blocks reading its stdin, which is the read end of one shared "start" pipe; when all
//! are ready the parent closes the write end and every buyer sees end-of-file at the same moment.
//! A buyer then reads the inventory, thinks a few milliseconds, and if a ticket is left writes the
//! count minus one and appends a sale record. Results come back as lines on the shared pipe.

use crate::exit::{self, CliResult, Failure};
use crate::store;
use crate::table::{render, Align};
use rand::Rng;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The most buyers or tickets the demo accepts.
pub const MAX: u32 = 1000;
/// How long a buyer of the locked round waits for the lock before giving up: generous, and more
/// with more buyers (they queue behind each other).
fn buyer_wait(buyers: u32) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(100) * buyers
}
/// The lease of a buyer's hold.
const BUYER_LEASE: Duration = Duration::from_secs(10);

const INVENTORY: &str = "inventory";
const SALES: &str = "sales";

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let base = std::env::temp_dir();
        for _ in 0..16 {
            let p = base.join(format!(
                "dlock-demo-{}-{:08x}",
                std::process::id(),
                rand::thread_rng().gen::<u32>()
            ));
            match fs::create_dir(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other("no free temporary directory name"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Kills and reaps the buyers still running when dropped (an error path or a timeout).
struct Buyers(Vec<Child>);

impl Drop for Buyers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// What one round did.
#[derive(Debug, Default)]
struct Round {
    sold: u32,
    refused: u32,
    left: Option<u64>,
    elapsed: Duration,
    /// Fencing tokens of the sales, in sale order (locked round).
    tokens: Vec<u64>,
    /// Buyer failures: (exit code, message).
    errors: Vec<(i32, String)>,
}

impl Round {
    fn oversold(&self, tickets: u32) -> u32 {
        self.sold.saturating_sub(tickets)
    }

    fn count_consistent(&self, tickets: u32) -> bool {
        self.left == Some(u64::from(tickets.saturating_sub(self.sold))) && self.sold <= tickets
    }

    fn tokens_increasing(&self) -> bool {
        self.tokens.windows(2).all(|w| w[0] < w[1])
    }
}

fn inventory_line(remaining: u64, last_token: u64) -> String {
    format!("{remaining} {last_token}\n")
}

fn read_inventory(dir: &Path) -> std::io::Result<(u64, u64)> {
    let s = fs::read_to_string(dir.join(INVENTORY))?;
    let mut it = s.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(r)), Some(Ok(t))) => Ok((r, t)),
        _ => Err(std::io::Error::other(format!("garbled inventory {s:?}"))),
    }
}

/// Runs one round with `buyers` buyer processes; `lock` is `Some` for the locked round.
fn round(
    exe: &Path,
    url: &str,
    lock: Option<&str>,
    buyers: u32,
    tickets: u32,
) -> Result<Round, Failure> {
    let soft = |what: &str, e: std::io::Error| Failure::new(exit::SOFTWARE, format!("{what}: {e}"));
    let dir = TempDir::new().map_err(|e| soft("cannot create a temporary directory", e))?;
    fs::write(dir.0.join(INVENTORY), inventory_line(u64::from(tickets), 0))
        .map_err(|e| soft("cannot write the inventory", e))?;
    fs::write(dir.0.join(SALES), "").map_err(|e| soft("cannot write the sales file", e))?;

    let (start_rd, start_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| soft("cannot make a pipe", e.into()))?;
    let (out_rd, out_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| soft("cannot make a pipe", e.into()))?;

    let mut children = Buyers(Vec::with_capacity(buyers as usize));
    for i in 0..buyers {
        let think = rand::thread_rng().gen_range(4..=8u64);
        let mut cmd = Command::new(exe);
        cmd.arg("demo-buyer")
            .arg("--dir")
            .arg(&dir.0)
            .args(["--index", &i.to_string()])
            .args(["--think-ms", &think.to_string()])
            .args(["--wait-ms", &buyer_wait(buyers).as_millis().to_string()])
            .env(store::URL_ENV, url)
            .stdin(Stdio::from(
                start_rd
                    .try_clone()
                    .map_err(|e| soft("cannot dup a pipe", e))?,
            ))
            .stdout(Stdio::from(
                out_wr
                    .try_clone()
                    .map_err(|e| soft("cannot dup a pipe", e))?,
            ))
            .stderr(Stdio::inherit());
        if let Some(l) = lock {
            cmd.args(["--lock", l]);
        }
        let child = cmd
            .spawn()
            .map_err(|e| soft(&format!("cannot start buyer {} ({})", i, exe.display()), e))?;
        children.0.push(child);
    }
    drop(start_rd);
    drop(out_wr);

    // Lines from the buyers, read on a thread so the parent can time out.
    let (tx, rx) = mpsc::channel::<String>();
    let out_rd: OwnedFd = out_rd;
    std::thread::spawn(move || {
        for line in BufReader::new(fs::File::from(out_rd)).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now()
        + Duration::from_secs(30)
        + Duration::from_millis(50) * buyers
        + if lock.is_some() {
            buyer_wait(buyers)
        } else {
            Duration::ZERO
        };
    let recv = |rx: &mpsc::Receiver<String>| -> Result<Option<String>, Failure> {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => Ok(Some(l)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(None),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(Failure::new(
                exit::SOFTWARE,
                "the buyers did not finish in time; stopped them",
            )),
        }
    };

    let mut r = Round::default();
    let mut reported = 0u32;
    let mut ready = 0u32;
    let mut start_wr = Some(start_wr);
    let mut started = Instant::now();
    loop {
        if ready + reported >= buyers {
            if let Some(w) = start_wr.take() {
                // All buyers are waiting (or already failed): let them go at once.
                started = Instant::now();
                drop(w);
            }
        }
        let Some(line) = recv(&rx)? else { break };
        let mut parts = line.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("ready"), _, _, _) => ready += 1,
            // Sales are counted from the sales file below, in sale order.
            (Some("sold"), _, _, _) => reported += 1,
            (Some("refused"), _, _, _) => {
                reported += 1;
                r.refused += 1;
            }
            (Some("error"), Some(i), code, msg) => {
                // A buyer that fails before the start counts as reported, not ready.
                reported += 1;
                let code = code.and_then(|c| c.parse().ok()).unwrap_or(exit::SOFTWARE);
                r.errors
                    .push((code, format!("buyer {i}: {}", msg.unwrap_or("failed"))));
            }
            _ => tracing::debug!(%line, "unexpected buyer output"),
        }
        if reported >= buyers {
            break;
        }
    }
    r.elapsed = started.elapsed();
    for (i, c) in children.0.iter_mut().enumerate() {
        match c.wait() {
            Ok(st) if st.success() => {}
            Ok(st) => {
                if r.errors.is_empty() || reported < buyers {
                    r.errors
                        .push((exit::SOFTWARE, format!("buyer {i} ended with {st}")));
                }
            }
            Err(e) => r.errors.push((exit::SOFTWARE, format!("buyer {i}: {e}"))),
        }
    }
    if reported < buyers {
        r.errors.push((
            exit::SOFTWARE,
            format!("only {reported} of {buyers} buyers reported"),
        ));
    }

    let sales = fs::read_to_string(dir.0.join(SALES)).map_err(|e| soft("cannot read sales", e))?;
    for line in sales.lines() {
        r.sold += 1;
        if let Some(Ok(t)) = line.split_whitespace().nth(2).map(str::parse::<u64>) {
            r.tokens.push(t);
        }
    }
    r.left = read_inventory(&dir.0).ok().map(|(left, _)| left);
    Ok(r)
}

fn fmt_ms(d: Duration) -> String {
    if d < Duration::from_secs(10) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn fmt_tokens(t: &[u64]) -> String {
    let show = |s: &[u64]| s.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    if t.len() <= 30 {
        show(t)
    } else {
        format!(
            "{} … {} ({} tokens)",
            show(&t[..20]),
            show(&t[t.len() - 5..]),
            t.len()
        )
    }
}

/// Runs `dlock demo`.
pub async fn demo(url: Option<&str>, buyers: u32, tickets: u32) -> CliResult {
    for (what, n) in [("buyers", buyers), ("tickets", tickets)] {
        if n == 0 || n > MAX {
            return Err(Failure::usage(format!(
                "--{what} must be between 1 and {MAX}, got {n}"
            )));
        }
    }
    let url = store::resolve(url)?;
    let client = store::connect(&url).await?;
    if client.backend_name() == "mem" {
        return Err(Failure::usage(format!(
            "the demo runs its buyers as separate processes, and {} is private to each process; use a shared store such as sqlite:///tmp/dlock-demo.db",
            client.url()
        )));
    }
    let shown_url = client.url().to_string();
    drop(client);
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("cannot find the dlock executable: {e}"),
        )
    })?;
    let lock = format!("dlock-demo/tickets-{:08x}", rand::thread_rng().gen::<u32>());
    println!(
        "dlock demo: {buyers} buyer processes race for {tickets} tickets kept in one file; store {shown_url}, lock {lock:?}"
    );
    let _ = std::io::stdout().flush();

    let (r1, r2) = {
        let (exe, url, lock) = (exe.clone(), url.clone(), lock.clone());
        tokio::task::spawn_blocking(move || {
            let r1 = round(&exe, &url, None, buyers, tickets)?;
            let r2 = round(&exe, &url, Some(&lock), buyers, tickets)?;
            Ok::<_, Failure>((r1, r2))
        })
        .await
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("demo task failed: {e}")))??
    };

    let row = |name: &str, r: &Round| {
        let tokens = match (r.tokens.first(), r.tokens.last()) {
            (Some(a), Some(b)) if a != b => format!("{a}..{b}"),
            (Some(a), _) => a.to_string(),
            _ => "-".into(),
        };
        vec![
            name.to_string(),
            buyers.to_string(),
            tickets.to_string(),
            r.sold.to_string(),
            r.refused.to_string(),
            r.oversold(tickets).to_string(),
            r.left.map_or_else(|| "?".into(), |l| l.to_string()),
            fmt_ms(r.elapsed),
            tokens,
        ]
    };
    use Align::{Left as L, Right as R};
    println!();
    print!(
        "{}",
        render(
            &[
                "ROUND", "BUYERS", "TICKETS", "SOLD", "REFUSED", "OVERSOLD", "LEFT", "ELAPSED",
                "TOKENS"
            ],
            &[L, R, R, R, R, R, R, R, L],
            &[row("1 no lock", &r1), row("2 dlock mutex", &r2)],
        )
    );
    println!();

    // Round 1: what went wrong without the lock.
    let mut notes = Vec::new();
    if r1.oversold(tickets) > 0 {
        notes.push(format!(
            "OVERSOLD by {}: {} tickets sold, only {tickets} exist",
            r1.oversold(tickets),
            r1.sold
        ));
    }
    if !r1.count_consistent(tickets) {
        notes.push(format!(
            "inventory count wrong: it says {} left after {} sales of {tickets} (lost updates)",
            r1.left.map_or_else(|| "?".into(), |l| l.to_string()),
            r1.sold
        ));
    }
    if notes.is_empty() {
        notes.push(
            "the race did not show this time (run again, or use more buyers than tickets)".into(),
        );
    }
    println!("round 1, no lock:     {}", notes.join("; "));

    // Round 2: must be exact.
    let expected = tickets.min(buyers);
    let mut problems = Vec::new();
    if r2.oversold(tickets) > 0 {
        problems.push(format!("OVERSOLD by {}", r2.oversold(tickets)));
    }
    if r2.sold != expected {
        problems.push(format!("{} sold, expected {expected}", r2.sold));
    }
    if !r2.count_consistent(tickets) {
        problems.push("inventory count wrong".into());
    }
    if r2.tokens.len() != r2.sold as usize {
        problems.push("a sale without a fencing token".into());
    }
    if !r2.tokens_increasing() {
        problems.push("fencing tokens NOT strictly increasing in sale order".into());
    }
    if r2.sold + r2.refused != buyers && r2.errors.is_empty() {
        problems.push("buyers missing".into());
    }
    println!(
        "round 2, dlock mutex: fencing tokens in sale order: {} ({})",
        fmt_tokens(&r2.tokens),
        if r2.tokens_increasing() {
            "strictly increasing"
        } else {
            "NOT strictly increasing"
        }
    );

    for (round, r) in [(1, &r1), (2, &r2)] {
        for (_, e) in r.errors.iter().take(5) {
            eprintln!("dlock: demo round {round}: {e}");
        }
        if r.errors.len() > 5 {
            eprintln!(
                "dlock: demo round {round}: … and {} more buyer errors",
                r.errors.len() - 5
            );
        }
    }
    if let Some((code, e)) = r2.errors.first().or(r1.errors.first()) {
        return Err(Failure::new(
            *code,
            format!("demo failed: a buyer could not finish ({e})"),
        ));
    }
    if problems.is_empty() {
        println!(
            "round 2, dlock mutex: exactly {} sold, {} refused, none oversold: OK",
            r2.sold, r2.refused
        );
        Ok(exit::OK)
    } else {
        println!("round 2, dlock mutex: FAILED: {}", problems.join("; "));
        Err(Failure::new(
            exit::FAILURE,
            format!("the locked round went wrong: {}", problems.join("; ")),
        ))
    }
}

/// The options of the hidden `demo-buyer` subcommand.
#[derive(Debug, Clone)]
pub struct BuyerOpts {
    /// The round's directory.
    pub dir: PathBuf,
    /// The buyer's number.
    pub index: u32,
    /// How long to think between reading and writing the inventory.
    pub think: Duration,
    /// How long to wait for the lock (and a busy store) in all.
    pub wait: Duration,
    /// The lock to take (locked round).
    pub lock: Option<String>,
}

enum Outcome {
    Sold(Option<u64>),
    Refused,
}

/// Reads, thinks, writes: the critical section.
fn buy(o: &BuyerOpts, token: Option<u64>) -> std::io::Result<Outcome> {
    let (remaining, last_token) = read_inventory(&o.dir)?;
    std::thread::sleep(o.think);
    if remaining == 0 {
        return Ok(Outcome::Refused);
    }
    let mut last = last_token;
    if let Some(t) = token {
        // The inventory is a fenced resource: it refuses a writer older than one it has seen.
        if t <= last_token {
            return Err(std::io::Error::other(format!(
                "fenced off: token {t} is not newer than {last_token}"
            )));
        }
        last = t;
    }
    let tmp = o.dir.join(format!("{INVENTORY}.{}", std::process::id()));
    fs::write(&tmp, inventory_line(remaining - 1, last))?;
    fs::rename(&tmp, o.dir.join(INVENTORY))?;
    let rec = format!(
        "{} {} {}\n",
        o.index,
        std::process::id(),
        token.map_or_else(|| "-".into(), |t| t.to_string())
    );
    // One write(2) on an O_APPEND file: records never interleave.
    fs::OpenOptions::new()
        .append(true)
        .open(o.dir.join(SALES))?
        .write_all(rec.as_bytes())?;
    Ok(Outcome::Sold(token))
}

fn say(line: &str) {
    // One write per line on the shared pipe (short lines are written atomically).
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

fn wait_for_start() {
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// A short random pause before retrying a busy store.
fn jitter() -> Duration {
    Duration::from_millis(rand::thread_rng().gen_range(10..=50))
}

/// Waits for the lock until `deadline`, retrying when the store is momentarily unavailable
/// (busy): that is what an application does with a transient store error.
async fn acquire(m: &dlock::Mutex, deadline: Instant) -> dlock::Result<dlock::Guard> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match m.acquire_timeout(left).await {
            Err(dlock::Error::Unavailable(e)) if Instant::now() + jitter() < deadline => {
                tracing::debug!(error = %e, "store busy; retrying the acquire");
                tokio::time::sleep(jitter()).await;
            }
            r => return r,
        }
    }
}

/// Runs one buyer (`dlock demo-buyer`); its results go to stdout as one line.
pub async fn buyer(o: BuyerOpts) -> i32 {
    let i = o.index;
    let report = |code: i32, msg: &str| {
        say(&format!("error {i} {code} {}", exit::one_line(msg)));
        code
    };
    let deadline = Instant::now() + o.wait;
    let locked = match &o.lock {
        None => None,
        Some(name) => {
            let Some(url) = store::env_url() else {
                return report(exit::USAGE, "no store URL in DLOCK_URL");
            };
            let client = loop {
                match store::connect(&url).await {
                    Ok(c) => break c,
                    // Hundreds of buyers opening one file at once can find it busy: try again.
                    Err(f) if f.code == exit::UNAVAILABLE && Instant::now() < deadline => {
                        tracing::debug!(error = %f, "store busy; retrying the connect");
                        tokio::time::sleep(jitter()).await;
                    }
                    Err(f) => return report(f.code, &f.message),
                }
            };
            match client.mutex(name.as_str()) {
                Ok(m) => Some((client, m.lease(BUYER_LEASE))),
                Err(e) => return report(exit::for_error(&e), &e.to_string()),
            }
        }
    };
    say(&format!("ready {i}"));
    wait_for_start();
    let result = match &locked {
        None => buy(&o, None).map_err(|e| (exit::SOFTWARE, e.to_string())),
        Some((_client, m)) => match acquire(m, deadline).await {
            Err(e) => Err((exit::for_error(&e), e.to_string())),
            Ok(g) => {
                let r = if g.is_held() {
                    buy(&o, g.token()).map_err(|e| (exit::SOFTWARE, e.to_string()))
                } else {
                    Err((exit::LOST, "the lock was lost before the sale".into()))
                };
                match (r, g.release().await) {
                    (Ok(out), Ok(())) => Ok(out),
                    // The hold ended before the sale was done: the sale was not protected.
                    (
                        Ok(_),
                        Err(e @ (dlock::Error::Lost { .. } | dlock::Error::NotOwner { .. })),
                    ) => Err((
                        exit::LOST,
                        format!("the lock was lost during the sale: {e}"),
                    )),
                    (Ok(out), Err(e)) => {
                        // The sale was made under the lock; its lease ends the hold.
                        eprintln!("dlock: demo buyer {i}: release failed ({e}); the lease will end the hold");
                        Ok(out)
                    }
                    (Err(e), _) => Err(e),
                }
            }
        },
    };
    match result {
        Ok(Outcome::Sold(t)) => {
            say(&format!(
                "sold {i} {}",
                t.map_or_else(|| "-".into(), |t| t.to_string())
            ));
            exit::OK
        }
        Ok(Outcome::Refused) => {
            say(&format!("refused {i}"));
            exit::OK
        }
        Err((code, msg)) => report(code, &msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_checks() {
        let r = Round {
            sold: 4,
            refused: 2,
            left: Some(0),
            tokens: vec![3, 5, 6, 9],
            ..Round::default()
        };
        assert_eq!(r.oversold(4), 0);
        assert!(r.count_consistent(4));
        assert!(r.tokens_increasing());
        let bad = Round {
            sold: 6,
            left: Some(3),
            tokens: vec![1, 1],
            ..Round::default()
        };
        assert_eq!(bad.oversold(4), 2);
        assert!(!bad.count_consistent(4));
        assert!(!bad.tokens_increasing());
    }

    #[test]
    fn formats_tokens() {
        assert_eq!(fmt_tokens(&[1, 2, 3]), "1 2 3");
        let many: Vec<u64> = (1..=40).collect();
        assert!(fmt_tokens(&many).ends_with("(40 tokens)"));
    }
}
