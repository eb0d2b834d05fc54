//! `dlock demo`: the ticket sale. Act 1: buyer processes race to buy one ticket each from one
//! inventory file, first without a lock (it oversells), then under a dlock mutex (it does not).
//! Act 2: the same buyers buy tickets of several films, each film its own inventory file, first
//! under one mutex for the whole cinema, then under one lock per film (a striped lock): both sell
//! right, and the second lets buyers of different films work at once.
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

/// What one round of act 1 did.
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
        increasing(&self.tokens)
    }
}

fn increasing(tokens: &[u64]) -> bool {
    tokens.windows(2).all(|w| w[0] < w[1])
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

fn soft(what: &str, e: std::io::Error) -> Failure {
    Failure::new(exit::SOFTWARE, format!("{what}: {e}"))
}

/// Puts `tickets` on sale in `dir` (created if missing): the inventory and an empty sales file.
fn stock(dir: &Path, tickets: u32) -> Result<(), Failure> {
    fs::create_dir_all(dir).map_err(|e| soft("cannot create a directory", e))?;
    fs::write(dir.join(INVENTORY), inventory_line(u64::from(tickets), 0))
        .map_err(|e| soft("cannot write the inventory", e))?;
    fs::write(dir.join(SALES), "").map_err(|e| soft("cannot write the sales file", e))
}

/// What the files of `dir` say after a round: sales made, their fencing tokens in sale order,
/// and the count the inventory shows (`None` if garbled).
fn tally(dir: &Path) -> Result<(u32, Vec<u64>, Option<u64>), Failure> {
    let sales = fs::read_to_string(dir.join(SALES)).map_err(|e| soft("cannot read sales", e))?;
    let (mut sold, mut tokens) = (0, Vec::new());
    for line in sales.lines() {
        sold += 1;
        if let Some(Ok(t)) = line.split_whitespace().nth(2).map(str::parse::<u64>) {
            tokens.push(t);
        }
    }
    Ok((sold, tokens, read_inventory(dir).ok().map(|(left, _)| left)))
}

/// The lock a buyer takes around its sale.
#[derive(Debug, Clone)]
enum BuyerLock {
    /// No lock (act 1, round 1).
    None,
    /// The mutex of this name.
    Mutex(String),
    /// The stripe of `key` in `client.striped(base, stripes)`.
    Striped {
        base: String,
        stripes: u32,
        key: String,
    },
}

/// One buyer process to start: where its inventory is, how long it thinks, what it locks.
struct Spec {
    dir: PathBuf,
    think: Duration,
    lock: BuyerLock,
}

/// What the buyers of one round reported.
#[derive(Debug, Default)]
struct Ran {
    refused: u32,
    /// From the common start to the last report.
    elapsed: Duration,
    /// Buyer failures: (exit code, message).
    errors: Vec<(i32, String)>,
}

/// Starts one buyer process per spec, lets them go at once, and collects their reports. `wait`
/// is how long a buyer may wait for its lock.
fn run_buyers(exe: &Path, url: &str, specs: &[Spec], wait: Duration) -> Result<Ran, Failure> {
    let buyers = u32::try_from(specs.len()).unwrap_or(u32::MAX);
    let (start_rd, start_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| soft("cannot make a pipe", e.into()))?;
    let (out_rd, out_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| soft("cannot make a pipe", e.into()))?;

    let mut children = Buyers(Vec::with_capacity(specs.len()));
    for (i, spec) in specs.iter().enumerate() {
        let mut cmd = Command::new(exe);
        cmd.arg("demo-buyer")
            .arg("--dir")
            .arg(&spec.dir)
            .args(["--index", &i.to_string()])
            .args(["--think-ms", &spec.think.as_millis().to_string()])
            .args(["--wait-ms", &wait.as_millis().to_string()])
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
        match &spec.lock {
            BuyerLock::None => {}
            BuyerLock::Mutex(l) => {
                cmd.args(["--lock", l]);
            }
            BuyerLock::Striped { base, stripes, key } => {
                cmd.args(["--lock", base])
                    .args(["--stripes", &stripes.to_string()])
                    .args(["--key", key]);
            }
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
    let locked = specs.iter().any(|s| !matches!(s.lock, BuyerLock::None));
    let deadline = Instant::now()
        + Duration::from_secs(30)
        + Duration::from_millis(50) * buyers
        + if locked { wait } else { Duration::ZERO };
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

    let mut r = Ran::default();
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
            // Sales are counted from the sales files, in sale order.
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
    Ok(r)
}

/// Runs one round of act 1 with `buyers` buyer processes and one inventory; `lock` is `Some` for
/// the locked round.
fn round(
    exe: &Path,
    url: &str,
    lock: Option<&str>,
    buyers: u32,
    tickets: u32,
) -> Result<Round, Failure> {
    let dir = TempDir::new().map_err(|e| soft("cannot create a temporary directory", e))?;
    stock(&dir.0, tickets)?;
    let specs: Vec<Spec> = (0..buyers)
        .map(|_| Spec {
            dir: dir.0.clone(),
            think: Duration::from_millis(rand::thread_rng().gen_range(4..=8u64)),
            lock: lock.map_or(BuyerLock::None, |l| BuyerLock::Mutex(l.to_string())),
        })
        .collect();
    let ran = run_buyers(exe, url, &specs, buyer_wait(buyers))?;
    let (sold, tokens, left) = tally(&dir.0)?;
    Ok(Round {
        sold,
        refused: ran.refused,
        left,
        elapsed: ran.elapsed,
        tokens,
        errors: ran.errors,
    })
}

/// The films of act 2.
const FILMS: u32 = 8;
/// The stripes of act 2's segmented lock (more than the films, so most films get one of their
/// own; FNV-1a may still put two films on one stripe, and the demo says so).
const STRIPES: u32 = 64;
/// How long every buyer of act 2 thinks while holding its lock, in both rounds: a slow critical
/// section (a payment call), so the rounds differ by how many buyers wait for each other.
const FILM_THINK: Duration = Duration::from_millis(40);
/// Repeats act 2's draw of films: the seed the demo printed.
pub const SEED_ENV: &str = "DLOCK_DEMO_SEED";

/// How long a buyer of act 2 waits for its lock: every buyer may queue behind every other in
/// round A.
fn film_wait(buyers: u32) -> Duration {
    Duration::from_secs(30) + (FILM_THINK + Duration::from_millis(100)) * buyers
}

/// One film of act 2.
#[derive(Debug, Clone)]
struct Film {
    name: String,
    tickets: u32,
    /// Buyers who want a ticket of it.
    buyers: u32,
    /// Its stripe of round B's lock.
    stripe: u32,
}

/// Act 2's cinema: its films and the film each buyer wants.
#[derive(Debug, Clone)]
struct Cinema {
    films: Vec<Film>,
    /// The film (index) of each buyer.
    choice: Vec<usize>,
}

impl Cinema {
    /// `min(FILMS, tickets)` films, the tickets split as evenly as possible, and for each buyer a
    /// film drawn from `seed`. `stripe_of` gives a film's stripe.
    fn new(buyers: u32, tickets: u32, seed: u64, stripe_of: impl Fn(&str) -> u32) -> Cinema {
        use rand::SeedableRng;
        let n = FILMS.min(tickets).max(1);
        let mut films: Vec<Film> = (0..n)
            .map(|i| {
                let name = format!("film-{}", i + 1);
                Film {
                    stripe: stripe_of(&name),
                    name,
                    tickets: tickets / n + u32::from(i < tickets % n),
                    buyers: 0,
                }
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let choice: Vec<usize> = (0..buyers).map(|_| rng.gen_range(0..films.len())).collect();
        for &f in &choice {
            films[f].buyers += 1;
        }
        Cinema { films, choice }
    }

    /// The number of distinct stripes the films took.
    fn distinct_stripes(&self) -> usize {
        let mut s: Vec<u32> = self.films.iter().map(|f| f.stripe).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    }

    /// The most buyers that want one stripe (round B's longest queue).
    fn busiest_stripe(&self) -> u32 {
        let mut per = std::collections::BTreeMap::<u32, u32>::new();
        for f in &self.films {
            *per.entry(f.stripe).or_default() += f.buyers;
        }
        per.into_values().max().unwrap_or(0)
    }
}

/// What one film's files say after a round of act 2.
#[derive(Debug, Default)]
struct FilmSale {
    sold: u32,
    left: Option<u64>,
    tokens: Vec<u64>,
}

/// One round of act 2.
#[derive(Debug, Default)]
struct Sale {
    films: Vec<FilmSale>,
    ran: Ran,
}

impl Sale {
    fn sold(&self) -> u32 {
        self.films.iter().map(|f| f.sold).sum()
    }

    fn left(&self) -> Option<u64> {
        self.films.iter().map(|f| f.left).sum()
    }

    fn oversold(&self, c: &Cinema) -> u32 {
        self.films
            .iter()
            .zip(&c.films)
            .map(|(s, f)| s.sold.saturating_sub(f.tickets))
            .sum()
    }

    /// Tickets sold per second.
    fn per_s(&self) -> f64 {
        f64::from(self.sold()) / self.ran.elapsed.as_secs_f64().max(1e-6)
    }

    /// What went wrong, film by film: must be empty.
    fn problems(&self, c: &Cinema) -> Vec<String> {
        let mut p = Vec::new();
        for (s, f) in self.films.iter().zip(&c.films) {
            let expected = f.tickets.min(f.buyers);
            if s.sold > f.tickets {
                p.push(format!(
                    "{} OVERSOLD by {}",
                    f.name,
                    s.sold.saturating_sub(f.tickets)
                ));
            } else if s.sold != expected {
                p.push(format!("{}: {} sold, expected {expected}", f.name, s.sold));
            }
            if s.left != Some(u64::from(f.tickets.saturating_sub(s.sold))) {
                p.push(format!("{}: inventory count wrong", f.name));
            }
            if s.tokens.len() != s.sold as usize {
                p.push(format!("{}: a sale without a fencing token", f.name));
            }
            if !increasing(&s.tokens) {
                p.push(format!(
                    "{}: fencing tokens NOT strictly increasing in sale order",
                    f.name
                ));
            }
        }
        let buyers = u32::try_from(c.choice.len()).unwrap_or(u32::MAX);
        if self.sold() + self.ran.refused != buyers && self.ran.errors.is_empty() {
            p.push("buyers missing".into());
        }
        p
    }
}

/// Runs one round of act 2: a directory per film, each buyer buying from its film's, under the
/// lock `lock_of` gives its film.
fn film_round(
    exe: &Path,
    url: &str,
    cinema: &Cinema,
    lock_of: impl Fn(&Film) -> BuyerLock,
) -> Result<Sale, Failure> {
    let dir = TempDir::new().map_err(|e| soft("cannot create a temporary directory", e))?;
    for f in &cinema.films {
        stock(&dir.0.join(&f.name), f.tickets)?;
    }
    let specs: Vec<Spec> = cinema
        .choice
        .iter()
        .map(|&i| {
            let f = &cinema.films[i];
            Spec {
                dir: dir.0.join(&f.name),
                think: FILM_THINK,
                lock: lock_of(f),
            }
        })
        .collect();
    let buyers = u32::try_from(specs.len()).unwrap_or(u32::MAX);
    let ran = run_buyers(exe, url, &specs, film_wait(buyers))?;
    let mut films = Vec::with_capacity(cinema.films.len());
    for f in &cinema.films {
        let (sold, tokens, left) = tally(&dir.0.join(&f.name))?;
        films.push(FilmSale { sold, left, tokens });
    }
    Ok(Sale { films, ran })
}

/// Act 2's seed: `DLOCK_DEMO_SEED` if set (a usage error if it is not a number), else random.
fn seed() -> Result<u64, Failure> {
    match std::env::var(SEED_ENV) {
        Ok(v) => v.trim().parse::<u64>().map_err(|_| {
            Failure::usage(format!(
                "{SEED_ENV} must be a whole number from 0 to {}, got {v:?}",
                u64::MAX
            ))
        }),
        Err(std::env::VarError::NotPresent) => Ok(rand::thread_rng().gen_range(0..1_000_000)),
        Err(std::env::VarError::NotUnicode(v)) => Err(Failure::usage(format!(
            "{SEED_ENV} must be a whole number, got {v:?}"
        ))),
    }
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

/// Runs `dlock demo`: act 1 (no lock, then one mutex), then act 2 (one lock for the cinema, then
/// one lock per film through a striped lock).
pub async fn demo(url: Option<&str>, buyers: u32, tickets: u32) -> CliResult {
    for (what, n) in [("buyers", buyers), ("tickets", tickets)] {
        if n == 0 || n > MAX {
            return Err(Failure::usage(format!(
                "--{what} must be between 1 and {MAX}, got {n}"
            )));
        }
    }
    let seed = seed()?;
    let url = store::resolve(url)?;
    let client = store::connect(&url).await?;
    if client.backend_name() == "mem" {
        return Err(Failure::usage(format!(
            "the demo runs its buyers as separate processes, and {} is private to each process; use a shared store such as sqlite:///tmp/dlock-demo.db",
            client.url()
        )));
    }
    let shown_url = client.url().to_string();
    let run = format!("{:08x}", rand::thread_rng().gen::<u32>());
    // Act 2's locks: one mutex for the cinema, a striped lock for the films.
    let cinema_lock = format!("dlock-demo/cinema-{run}");
    let films_base = format!("dlock-demo/films-{run}");
    let striped = client
        .striped(films_base.as_str(), STRIPES)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot make the striped lock: {e}")))?;
    let cinema = Cinema::new(buyers, tickets, seed, |film| striped.stripe_of(film));
    drop(striped);
    drop(client);
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("cannot find the dlock executable: {e}"),
        )
    })?;
    let lock = format!("dlock-demo/tickets-{run}");
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
    act_one_report(buyers, tickets, &r1, &r2)?;

    print_act_two_intro(&cinema, seed, &cinema_lock, &films_base);
    let (a, b) = {
        let (exe, url, cinema) = (exe.clone(), url.clone(), cinema.clone());
        let (cinema_lock, films_base) = (cinema_lock.clone(), films_base.clone());
        tokio::task::spawn_blocking(move || {
            let a = film_round(&exe, &url, &cinema, |_| {
                BuyerLock::Mutex(cinema_lock.clone())
            })?;
            let b = film_round(&exe, &url, &cinema, |f| BuyerLock::Striped {
                base: films_base.clone(),
                stripes: STRIPES,
                key: f.name.clone(),
            })?;
            Ok::<_, Failure>((a, b))
        })
        .await
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("demo task failed: {e}")))??
    };
    act_two_report(&cinema, &a, &b)
}

/// Prints act 1's table and verdicts; an error if round 2 went wrong or a buyer failed.
fn act_one_report(buyers: u32, tickets: u32, r1: &Round, r2: &Round) -> Result<(), Failure> {
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
            &[row("1 no lock", r1), row("2 dlock mutex", r2)],
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

    for (round, r) in [(1, r1), (2, r2)] {
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
        Ok(())
    } else {
        println!("round 2, dlock mutex: FAILED: {}", problems.join("; "));
        Err(Failure::new(
            exit::FAILURE,
            format!("the locked round went wrong: {}", problems.join("; ")),
        ))
    }
}

/// `n` and the noun, singular or plural.
fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Prints what act 2 does: its films, their tickets, buyers and stripes.
fn print_act_two_intro(c: &Cinema, seed: u64, cinema_lock: &str, films_base: &str) {
    let tickets: u32 = c.films.iter().map(|f| f.tickets).sum();
    let (lo, hi) = c.films.iter().fold((u32::MAX, 0), |(lo, hi), f| {
        (lo.min(f.tickets), hi.max(f.tickets))
    });
    let per = if lo == hi {
        lo.to_string()
    } else {
        format!("{lo} or {hi}")
    };
    println!();
    println!("act 2: one lock per film");
    println!(
        "{}: each buys one ticket of one of {} ({}, {per} per film, each film its own inventory file).",
        count(c.choice.len() as u64, "buyer process", "buyer processes"),
        count(c.films.len() as u64, "film", "films"),
        count(tickets, "ticket", "tickets")
    );
    println!(
        "Each buyer's film is drawn at random (seed {seed}; {SEED_ENV}={seed} draws the same), the same in both rounds;"
    );
    println!(
        "every buyer thinks {} while holding its lock, in both rounds.",
        fmt_ms(FILM_THINK)
    );
    println!("  round A locks the whole cinema: client.mutex({cinema_lock:?})");
    println!(
        "  round B locks the film's stripe: client.striped({films_base:?}, {STRIPES}).lock_timeout(film, …); the {} took {}",
        count(c.films.len() as u64, "film", "films"),
        count(c.distinct_stripes() as u64, "distinct stripe", "distinct stripes")
    );
    println!();
    let rows: Vec<Vec<String>> = c
        .films
        .iter()
        .map(|f| {
            vec![
                f.name.clone(),
                f.tickets.to_string(),
                f.buyers.to_string(),
                f.stripe.to_string(),
            ]
        })
        .collect();
    use Align::{Left as L, Right as R};
    print!(
        "{}",
        render(
            &["FILM", "TICKETS", "BUYERS", "STRIPE"],
            &[L, R, R, R],
            &rows
        )
    );
    let _ = std::io::stdout().flush();
}

/// Prints act 2's table and verdicts; an error if a round sold wrong or a buyer failed.
fn act_two_report(c: &Cinema, a: &Sale, b: &Sale) -> CliResult {
    let buyers = u32::try_from(c.choice.len()).unwrap_or(u32::MAX);
    let tickets: u32 = c.films.iter().map(|f| f.tickets).sum();
    let row = |name: &str, lock: String, s: &Sale| {
        vec![
            name.to_string(),
            lock,
            buyers.to_string(),
            tickets.to_string(),
            s.sold().to_string(),
            s.ran.refused.to_string(),
            s.oversold(c).to_string(),
            s.left().map_or_else(|| "?".into(), |l| l.to_string()),
            fmt_ms(s.ran.elapsed),
            format!("{:.1}", s.per_s()),
        ]
    };
    use Align::{Left as L, Right as R};
    println!();
    print!(
        "{}",
        render(
            &[
                "ROUND",
                "LOCKS",
                "BUYERS",
                "TICKETS",
                "SOLD",
                "REFUSED",
                "OVERSOLD",
                "LEFT",
                "ELAPSED",
                "TICKETS/S"
            ],
            &[L, L, R, R, R, R, R, R, R, R],
            &[
                row("A one cinema lock", "1 mutex".into(), a),
                row(
                    "B lock per film",
                    format!("{} of {STRIPES} stripes", c.distinct_stripes()),
                    b
                ),
            ],
        )
    );
    println!();

    for (round, s) in [("A", a), ("B", b)] {
        for (_, e) in s.ran.errors.iter().take(5) {
            eprintln!("dlock: demo round {round}: {e}");
        }
        if s.ran.errors.len() > 5 {
            eprintln!(
                "dlock: demo round {round}: … and {} more buyer errors",
                s.ran.errors.len() - 5
            );
        }
    }
    if let Some((code, e)) = a.ran.errors.first().or(b.ran.errors.first()) {
        return Err(Failure::new(
            *code,
            format!("demo failed: a buyer could not finish ({e})"),
        ));
    }
    // Each round's lower bound: its longest queue of buyers, each thinking in turn.
    let queue = |n: u32| {
        format!(
            "{} × {} = {}",
            count(n, "buyer", "buyers"),
            fmt_ms(FILM_THINK),
            fmt_ms(FILM_THINK * n)
        )
    };
    let (pa, pb) = (a.problems(c), b.problems(c));
    let verdict = |p: &[String]| {
        if p.is_empty() {
            "every film sold right, none oversold: OK".to_string()
        } else {
            format!("FAILED: {}", p.join("; "))
        }
    };
    println!(
        "round A, cinema mutex: one buyer at a time in the whole cinema (longest queue {}); {}",
        queue(buyers),
        verdict(&pa)
    );
    println!(
        "round B, striped lock: buyers of films on different stripes did not wait for each other (longest queue {}); {}",
        queue(c.busiest_stripe()),
        verdict(&pb)
    );
    if !pa.is_empty() || !pb.is_empty() {
        let mut all: Vec<String> = pa.iter().map(|p| format!("round A: {p}")).collect();
        all.extend(pb.iter().map(|p| format!("round B: {p}")));
        return Err(Failure::new(
            exit::FAILURE,
            format!("act 2 went wrong: {}", all.join("; ")),
        ));
    }
    let ratio = a.ran.elapsed.as_secs_f64() / b.ran.elapsed.as_secs_f64().max(1e-6);
    println!(
        "a lock per film sold {ratio:.1}× the tickets per second of one cinema lock ({} against {}): the same buyers, films and think time, only the lock's granularity differs",
        fmt_ms(b.ran.elapsed),
        fmt_ms(a.ran.elapsed)
    );
    Ok(exit::OK)
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
    /// The lock to take (locked rounds): a mutex, or with `stripes` the base of a striped lock.
    pub lock: Option<String>,
    /// The stripes of the striped lock `lock` (act 2, round B).
    pub stripes: Option<u32>,
    /// The key whose stripe to take (with `stripes`).
    pub key: Option<String>,
}

/// What a buyer of a locked round takes: a mutex, or a key's stripe of a striped lock.
enum Lock {
    Mutex(dlock::Mutex),
    Striped(dlock::Striped, String),
}

impl Lock {
    async fn acquire_timeout(&self, timeout: Duration) -> dlock::Result<dlock::Guard> {
        match self {
            Lock::Mutex(m) => m.acquire_timeout(timeout).await,
            Lock::Striped(s, key) => s.lock_timeout(key, timeout).await,
        }
    }
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
async fn acquire(m: &Lock, deadline: Instant) -> dlock::Result<dlock::Guard> {
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
        None if o.stripes.is_some() || o.key.is_some() => {
            return report(exit::USAGE, "--stripes and --key need --lock");
        }
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
            let lock = match (o.stripes, &o.key) {
                (None, None) => client
                    .mutex(name.as_str())
                    .map(|m| Lock::Mutex(m.lease(BUYER_LEASE))),
                (Some(n), Some(key)) => client
                    .striped(name.as_str(), n)
                    .map(|s| Lock::Striped(s.lease(BUYER_LEASE), key.clone())),
                _ => return report(exit::USAGE, "--stripes and --key go together"),
            };
            match lock {
                Ok(l) => Some((client, l)),
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
