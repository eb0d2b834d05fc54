//! `dlock`: run a command under a distributed lock, list and remove locks, and watch a ticket
//! sale oversell without a lock and not with one.

mod bench;
mod child;
mod demo;
mod elect;
mod exit;
mod hold;
mod list;
mod run;
mod signals;
mod store;
mod table;
mod take;

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

const AFTER_HELP: &str = "\
Store URLs: sqlite:///path/to/locks.db (shared by every process of the machine), mem:// (one \
process only). Without --url, $DLOCK_URL is used, else the SQLite file in your state directory \
(see `dlock info`).

Exit codes: 0 ok (run: the command's own status), 64 usage error, 69 store unreachable or store \
error, 75 lock not acquired (or -E N), 76 lock lost while the command ran, 126/127 command not \
executable / not found, 128+N command killed by signal N.";

/// Distributed locks from the command line.
#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    version,
    propagate_version = true,
    subcommand_required = true,
    arg_required_else_help = true,
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    Run(RunArgs),
    Elect(ElectArgs),
    Hold(HoldArgs),
    List(ListArgs),
    Info(InfoArgs),
    Unlock(UnlockArgs),
    Demo(DemoArgs),
    #[command(hide = true)]
    DemoBuyer(BuyerArgs),
    Bench(bench::BenchArgs),
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
    #[command(hide = true)]
    ReapGroup(ReapArgs),
}

/// How `dlock run` and `dlock hold` take the lock.
#[derive(Debug, Args)]
struct LockArgs {
    /// Store URL [default: $DLOCK_URL, else the SQLite file in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// How long a dlock that dies (killed, or its machine gone) keeps others out: the lease,
    /// renewed while dlock lives. On ZooKeeper the session timeout, which dlock asks for (the
    /// server may bound it; dlock warns then); in PostgreSQL/MySQL session mode a killed
    /// dlock's lock ends at once and one whose machine is gone after this long
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,
    /// Wait at most DUR for the lock, then exit 75 [default: wait forever]. A store that turns
    /// dlock away for now (too many clients, a restart) is tried again within DUR (30 s when
    /// waiting forever) before dlock exits 69
    #[arg(long, short = 'w', value_name = "DUR", value_parser = parse_duration, conflicts_with = "no_wait", allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held
    #[arg(long, short = 'n')]
    no_wait: bool,
    /// Grant the lock to waiters in arrival order
    #[arg(long)]
    fair: bool,
    /// Take a shared (read) lock of the read-write lock NAME: readers share, a writer (-x)
    /// excludes them
    #[arg(long, short = 's', conflicts_with_all = ["exclusive", "permits"])]
    shared: bool,
    /// Take the exclusive (write) lock of the read-write lock NAME, excluding readers (-s)
    /// [default without -s/-x/--permits: the mutex NAME]
    #[arg(long, short = 'x', conflicts_with = "permits")]
    exclusive: bool,
    /// Take one permit of the semaphore NAME of N permits (every user of NAME must say the same N)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// The exit code when the lock is not acquired (busy with --no-wait, or --wait ran out)
    #[arg(long, short = 'E', value_name = "N", default_value_t = exit::NOT_GRANTED, value_parser = clap::value_parser!(i32).range(0..=255))]
    conflict_exit_code: i32,
    /// Say on stderr what was taken, how long it took, the fencing token and the store
    #[arg(long, short = 'v')]
    verbose: bool,
    /// The lock name (1 to 255 bytes)
    #[arg(value_name = "NAME")]
    name: String,
}

impl LockArgs {
    fn into_opts(self) -> take::TakeOpts {
        let kind = match (self.shared, self.exclusive, self.permits) {
            (true, _, _) => take::Kind::Read,
            (_, true, _) => take::Kind::Write,
            (_, _, Some(n)) => take::Kind::Permit(n),
            _ => take::Kind::Mutex,
        };
        take::TakeOpts {
            url: self.url,
            ttl: self.ttl,
            wait: self.wait,
            no_wait: self.no_wait,
            fair: self.fair,
            kind,
            conflict_exit: self.conflict_exit_code,
            verbose: self.verbose,
            name: self.name,
        }
    }
}

/// Run a command while holding the lock NAME.
///
/// Waits for the lock (forever unless --wait or --no-wait), runs CMD with DLOCK_NAME and
/// DLOCK_TOKEN (the fencing token) in its environment, renews the lease while CMD runs, and
/// releases the lock when CMD ends. dlock exits with CMD's status (128+N if a signal N killed
/// it). SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are passed on to
/// CMD's process group (a terminal's Ctrl-C reaches CMD directly, once).
///
/// CMD runs in a process group of its own and dies with dlock: if dlock is killed (even with
/// SIGKILL), CMD and everything it started in its group are killed at once. Processes CMD
/// leaves running in its group when it exits are stopped (SIGTERM, SIGKILL after --kill-after)
/// before the lock is let go.
///
/// If the lock is not acquired, CMD is not run and dlock exits 75 (or -E N). If the lock is lost
/// while CMD runs (the store dropped the hold, an administrator revoked it, or it could not be
/// renewed in time), CMD's group gets SIGTERM, SIGKILL after --kill-after, and dlock exits 76.
#[derive(Debug, Args)]
#[command(
    override_usage = "dlock run [OPTIONS] <NAME> -- <CMD> [ARGS]...\n       dlock run [OPTIONS] <NAME> -c <STRING>",
    after_help = "Examples:\n  dlock run backups/nightly -- /usr/local/bin/backup --full\n  dlock run --no-wait --hold-at-least 1h reports/hourly -- ./report.sh\n  dlock run -s cache -c 'cat /srv/cache/*'      # readers share; `dlock run -x cache -- ./rebuild` excludes them\n\nExit codes: CMD's own, or 75 not acquired (-E N), 76 lock lost, 64 usage, 69 store error, 126/127 CMD not executable / not found."
)]
struct RunArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// Keep the lock until DUR after it was granted, even if CMD ends sooner (on a lease store
    /// dlock exits at once and the store's lease ends the hold; on ZooKeeper and in SQL session
    /// mode dlock stays, holding it)
    #[arg(long, value_name = "DUR", value_parser = parse_duration, allow_hyphen_values = true)]
    hold_at_least: Option<Duration>,
    /// After a lost lock, how long CMD has between SIGTERM and SIGKILL
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    kill_after: Duration,
    #[command(flatten)]
    cmd: CmdArgs,
}

/// Run a command only while this host leads the election NAME: a hot standby.
///
/// Campaigns for NAME (waiting while another dlock leads), runs CMD with DLOCK_NAME and
/// DLOCK_TOKEN = DLOCK_TERM (the term: a fencing token greater than every earlier term) in its
/// environment, and keeps the term renewed while CMD runs. When CMD ends by itself, dlock
/// resigns and exits with CMD's status. When the term is lost (the store dropped it, an
/// administrator revoked it, or it could not be renewed in time), CMD's group gets SIGTERM,
/// SIGKILL after --kill-after, and dlock campaigns again (with --once it exits 76 instead).
///
/// CMD is tied to dlock as under `dlock run`: it dies with dlock, and a dlock that is stopped
/// (SIGSTOP) or frozen past its term has CMD killed before the store can let another host lead.
/// A standby on another host takes over within --ttl of a leader's death.
#[derive(Debug, Args)]
#[command(
    override_usage = "dlock elect [OPTIONS] <NAME> -- <CMD> [ARGS]...\n       dlock elect [OPTIONS] <NAME> -c <STRING>",
    after_help = "Examples:\n  dlock elect --value \"$(hostname):8080\" services/scheduler -- ./scheduler\n  dlock elect --once --ttl 10s jobs/primary -c 'exec ./primary --token \"$DLOCK_TERM\"'\n\nSee who leads: dlock list services/scheduler (the VALUE column).\nExit codes: CMD's own, or 76 term lost (--once), 64 usage, 69 store error, 126/127 CMD not executable / not found."
)]
struct ElectArgs {
    /// Store URL [default: $DLOCK_URL, else the SQLite file in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// How long a leader that dies (killed, or its machine gone) keeps the standbys waiting: the
    /// term's lease, renewed while dlock lives (on ZooKeeper the session timeout, on etcd the
    /// lease TTL)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,
    /// The leader's value, shown to followers (`dlock list`, `Election::leader`): an address, a
    /// host name (at most 4096 bytes)
    #[arg(long, value_name = "VALUE", default_value = "")]
    value: String,
    /// Exit 76 when the term is lost instead of campaigning again
    #[arg(long)]
    once: bool,
    /// After a lost term, how long CMD has between SIGTERM and SIGKILL
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    kill_after: Duration,
    /// Say on stderr when this dlock leads (the term) and resigns
    #[arg(long, short = 'v')]
    verbose: bool,
    /// The election name (1 to 255 bytes)
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    cmd: CmdArgs,
}

/// The command of `dlock run` and `dlock elect`.
#[derive(Debug, Args)]
struct CmdArgs {
    /// Run STRING with `sh -c` instead of CMD
    #[arg(short = 'c', value_name = "STRING", conflicts_with = "cmd")]
    command: Option<OsString>,
    /// The command to run and its arguments (after `--`)
    #[arg(
        value_name = "CMD",
        required_unless_present = "command",
        trailing_var_arg = true
    )]
    cmd: Vec<OsString>,
}

impl CmdArgs {
    /// The program and its arguments: `sh -c STRING` for `-c STRING`.
    fn argv(self) -> Vec<OsString> {
        match self.command {
            Some(c) => vec!["sh".into(), "-c".into(), c],
            None => self.cmd,
        }
    }
}

/// Take the lock NAME and hold it, with no command.
///
/// Prints the fencing token on stdout (an empty line on a store without tokens) once the lock
/// is taken, then holds it, renewed, until dlock gets SIGINT, SIGTERM or SIGHUP, until its
/// standard input ends (a pipe, a FIFO, a socket or the terminal; not /dev/null), or until the
/// process that started it exits (Linux) — then releases it and exits 0. Exits 76 if the lock is
/// lost while held, 75 (or -E N) if it was not acquired. For scripts that hold a lock around
/// several steps:
///
///   coproc LOCK { dlock hold --no-wait deploy; }
///   read -r token <&"${LOCK[0]}" || exit 75     # the lock is ours
///   ./step1 && ./step2
///   kill "$LOCK_PID"; wait "$LOCK_PID"          # released
#[derive(Debug, Args)]
struct HoldArgs {
    #[command(flatten)]
    lock: LockArgs,
}

/// Kills a process group when stdin closes without a word (internal; see `dlock run`).
#[derive(Debug, Args)]
struct ReapArgs {
    pgid: i32,
    /// The first deadline, µs of the machine's monotonic clock.
    #[arg(long)]
    until: Option<u64>,
}

/// List the locks held now, with their holders and waiters.
///
/// Shows name, kind, mode, owner, host, pid, fencing token, lease left and when each hold was
/// acquired, as a table, or the full records as one JSON array with --json. Waiters are those
/// the store keeps in a queue: --fair waiters, and every waiter on ZooKeeper and etcd (a plain
/// waiter of the other stores is not in the store until it is granted).
///
/// --watch lists again every --interval, like watch(1), until Ctrl-C or SIGTERM (exit 0) or
/// --count rounds. On a terminal each round clears the screen and redraws a header line (store,
/// round, time) and the table; into a pipe or file each round is printed after the last one,
/// separated by an empty line, without escape codes. With --json each round is one JSON array on
/// one line (JSON Lines). A store that fails mid-watch does not end the watch: the round shows
/// the error (on stderr with --json, and no line for that round) and the next round tries again;
/// after --count rounds dlock exits 69 if the last round failed. A store that cannot be opened
/// at the start exits 69 (64 for a bad URL) as `dlock list` does.
#[derive(Debug, Args)]
struct ListArgs {
    /// Store URL [default: $DLOCK_URL, else the SQLite file in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Print one JSON array instead of a table (with --watch: one per line per round)
    #[arg(long)]
    json: bool,
    /// List again every --interval until interrupted, redrawing the view (see above)
    #[arg(long)]
    watch: bool,
    /// With --watch: the time between rounds, from 100ms to 1h
    #[arg(long, value_name = "DUR", default_value = "2s", requires = "watch", value_parser = parse_interval, allow_hyphen_values = true)]
    interval: Duration,
    /// With --watch: stop after N rounds (N at least 1) [default: until interrupted]
    #[arg(long, value_name = "N", requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Only locks whose name starts with PREFIX
    #[arg(value_name = "PREFIX", default_value = "")]
    prefix: String,
}

/// Show the version, the default store and the enabled backends.
#[derive(Debug, Args)]
struct InfoArgs {
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Take the lock NAME away from whoever holds it (administrators only).
///
/// --force revokes: each holder's next renewal answers that the lock was revoked, so its
/// `lost()` fires (a `dlock run` holding it stops its command and exits 76), and nobody else is
/// granted NAME until every holder has let go or its lease has run out. A hold that nobody
/// renews any more (the rest of a --hold-at-least window) is removed at once.
///
/// --break removes every hold and waiter now: a holder that is still working keeps working
/// until its next renewal, next to the new holder. For a holder that is gone for good.
///
/// Fencing tokens keep increasing either way. Refuses to act without one of the two.
#[derive(Debug, Args)]
struct UnlockArgs {
    /// Store URL [default: $DLOCK_URL, else the SQLite file in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Revoke the holds (see above)
    #[arg(long)]
    force: bool,
    /// Remove the holds now, while their holders may still be working
    #[arg(long = "break")]
    brk: bool,
    /// The lock name
    #[arg(value_name = "NAME")]
    name: String,
}

/// Sell tickets with racing buyer processes, without and with a lock.
///
/// Round 1: BUYERS processes start at the same moment and each buys one ticket from an
/// inventory file (read the count, think a few ms, write count-1, record the sale) without a
/// lock: more tickets are sold than exist, or the count goes wrong. Round 2: the same under a
/// dlock mutex: exactly TICKETS are sold, the rest refused, and the fencing tokens of the sales
/// strictly increase. Act 2, segmented locks: the tickets are split over up to 8 films, each
/// buyer wants a ticket of one film (drawn from a printed seed; DLOCK_DEMO_SEED=N repeats it);
/// round A under one lock for the whole cinema, round B under a lock per film
/// (`client.striped`, 64 stripes), with the tickets per second of each. Exits 0 if every locked
/// round is right, 1 if not.
#[derive(Debug, Args)]
struct DemoArgs {
    /// Store URL (must be shared between processes) [default: $DLOCK_URL, else the SQLite file
    /// in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Number of buyer processes (1-1000)
    #[arg(long, value_name = "N", default_value_t = 10)]
    buyers: u32,
    /// Number of tickets for sale (1-1000)
    #[arg(long, value_name = "N", default_value_t = 8)]
    tickets: u32,
}

/// One buyer of `dlock demo` (internal).
#[derive(Debug, Args)]
struct BuyerArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    index: u32,
    #[arg(long, default_value_t = 5)]
    think_ms: u64,
    #[arg(long, default_value_t = 60_000)]
    wait_ms: u64,
    #[arg(long)]
    lock: Option<String>,
    #[arg(long)]
    stripes: Option<u32>,
    #[arg(long)]
    key: Option<String>,
}

/// Parses a humantime duration no longer than the longest lease.
fn parse_duration(s: &str) -> Result<Duration, String> {
    // Values may start with `-` (so `--ttl -1s` reaches this message, not clap's "unexpected
    // argument"): a negative number, or a flag given where the duration should be.
    if let Some(rest) = s.trim_start().strip_prefix('-') {
        return Err(
            if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                "a duration cannot be negative (examples: 500ms, 30s, 5m, 1h)".into()
            } else {
                format!("expected a duration such as 500ms, 30s, 5m or 1h, not the flag {s}")
            },
        );
    }
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (examples: 500ms, 30s, 5m, 1h)"))?;
    if d > dlock::MAX_LEASE {
        return Err(format!(
            "{s} is too long (at most {} days)",
            dlock::MAX_LEASE.as_secs() / 86_400
        ));
    }
    Ok(d)
}

/// The shortest and longest `dlock list --watch --interval`.
const WATCH_INTERVALS: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));

/// Parses the interval of `dlock list --watch`: between 100 ms and an hour.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    let (min, max) = WATCH_INTERVALS;
    if d < min || d > max {
        return Err(format!(
            "the interval must be between {} and {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// Parses a lease: a duration between the library's shortest and longest lease.
fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < dlock::MIN_LEASE {
        return Err(format!(
            "a lease must be at least {}",
            humantime::format_duration(dlock::MIN_LEASE)
        ));
    }
    Ok(d)
}

fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // The library's own "lock lost" warning repeats what the command says on stderr.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,dlock::hold=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Worker threads of the multi-threaded runtime.
const WORKERS: usize = 2;

/// Whether `n` more threads (with the default stack, as tokio's workers) can run at once now.
fn threads_available(n: usize) -> bool {
    let mut held = Vec::new();
    let mut all = true;
    for _ in 0..n {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        match std::thread::Builder::new().spawn(move || {
            let _ = rx.recv();
        }) {
            Ok(h) => held.push((tx, h)),
            Err(_) => {
                all = false;
                break;
            }
        }
    }
    for (tx, h) in held {
        drop(tx);
        let _ = h.join();
    }
    all
}

fn runtime(multi: bool) -> std::io::Result<tokio::runtime::Runtime> {
    // Short of memory, or at the process's or the cgroup's thread limit, tokio either panics
    // (no worker thread starts) or hangs (a worker that did not start keeps its queue): then the
    // work goes on a runtime on this thread.
    if multi && threads_available(WORKERS) {
        // Only this thread runs yet, so the quiet panic hook meanwhile hides nothing.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let built = std::panic::catch_unwind(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKERS)
                .enable_all()
                .build()
        });
        std::panic::set_hook(hook);
        if let Ok(Ok(rt)) = built {
            return Ok(rt);
        }
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn real_main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // --help and --version exit 0; every other parse error is a usage error.
            return if e.exit_code() == 0 {
                exit::OK
            } else {
                exit::USAGE
            };
        }
    };
    if let Cmd::ReapGroup(a) = &cli.command {
        return child::reap_group(a.pgid, a.until);
    }
    init_logging();
    if !matches!(cli.command, Cmd::Run(_) | Cmd::Elect(_) | Cmd::Hold(_)) {
        // Printing commands end quietly when their reader goes away (`dlock list | head`), like
        // other command-line tools. `run` keeps SIGPIPE ignored: it must outlive a closed stderr
        // to stop its command and release the lock (its command gets the default disposition).
        // SAFETY: restores the default disposition; no handler is involved.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigDfl,
            )
        };
    }

    let cmd = cli.command;
    // A buyer of the demo is one of many processes: a single-threaded runtime is plenty.
    let rt = match runtime(!matches!(cmd, Cmd::DemoBuyer(_))) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start the async runtime: {e}");
            return exit::SOFTWARE;
        }
    };
    let result: exit::CliResult = rt.block_on(async move {
        match cmd {
            Cmd::Run(a) => {
                run::run(run::RunOpts {
                    take: a.lock.into_opts(),
                    hold_at_least: a.hold_at_least,
                    kill_after: a.kill_after,
                    cmd: a.cmd.argv(),
                })
                .await
            }
            Cmd::Elect(a) => {
                elect::elect(elect::ElectOpts {
                    url: a.url,
                    ttl: a.ttl,
                    value: a.value,
                    once: a.once,
                    kill_after: a.kill_after,
                    verbose: a.verbose,
                    name: a.name,
                    cmd: a.cmd.argv(),
                })
                .await
            }
            Cmd::Hold(a) => hold::hold(a.lock.into_opts()).await,
            Cmd::ReapGroup(_) => Ok(exit::SOFTWARE),
            Cmd::List(a) if a.watch => {
                let opts = list::WatchOpts {
                    interval: a.interval,
                    count: a.count,
                    json: a.json,
                };
                list::watch(a.url.as_deref(), &a.prefix, opts).await
            }
            Cmd::List(a) => list::list(a.url.as_deref(), a.json, &a.prefix).await,
            Cmd::Unlock(a) => list::unlock(a.url.as_deref(), &a.name, a.force, a.brk).await,
            Cmd::Demo(a) => demo::demo(a.url.as_deref(), a.buyers, a.tickets).await,
            Cmd::DemoBuyer(a) => Ok(demo::buyer(demo::BuyerOpts {
                dir: a.dir,
                index: a.index,
                think: Duration::from_millis(a.think_ms),
                wait: Duration::from_millis(a.wait_ms),
                lock: a.lock,
                stripes: a.stripes,
                key: a.key,
            })
            .await),
            Cmd::Info(a) => list::info(a.json),
            Cmd::Bench(a) => bench::bench(a).await,
            Cmd::BenchWorker(a) => bench::worker(a).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(f) => {
            eprintln!("dlock: {}", f.message);
            f.code
        }
    }
}

fn main() {
    let code = real_main();
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // Exit without waiting for background tasks (a hold handed to the store's lease needs none).
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_ttl("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_ttl("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_ttl("0s").is_err());
        assert!(parse_ttl("50ms").is_err());
        assert!(parse_ttl("banana").is_err());
        assert!(parse_ttl("1000years").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("-1s").unwrap_err().contains("negative"));
        assert!(parse_ttl("1000years").unwrap_err().contains("365 days"));
        let e = Cli::try_parse_from(["dlock", "run", "--ttl", "-1s", "x", "true"]).unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
        let e = Cli::try_parse_from(["dlock", "run", "--ttl", "--fair", "x", "true"]).unwrap_err();
        assert!(e.to_string().contains("not the flag --fair"), "{e}");
    }

    #[test]
    fn run_parses_both_command_forms() {
        let c = Cli::try_parse_from(["dlock", "run", "--ttl", "5s", "x", "--", "ls", "-l"])
            .expect("parse");
        let Cmd::Run(a) = c.command else {
            panic!("not run")
        };
        assert_eq!(a.cmd.cmd, vec![OsString::from("ls"), OsString::from("-l")]);
        let c = Cli::try_parse_from(["dlock", "run", "x", "ls", "--ttl", "1s"]).expect("parse");
        let Cmd::Run(a) = c.command else {
            panic!("not run")
        };
        assert_eq!(a.lock.name, "x");
        assert_eq!(a.lock.ttl, Duration::from_secs(30));
        assert_eq!(a.cmd.cmd.len(), 3);
        assert!(Cli::try_parse_from(["dlock", "run", "x", "--bogus"]).is_err());
        assert!(
            Cli::try_parse_from(["dlock", "run", "--wait", "1s", "--no-wait", "x", "true"])
                .is_err()
        );
    }

    #[test]
    fn run_and_hold_take_the_lock_flock_and_etcdctl_users_expect() {
        let run = |args: &[&str]| {
            let mut v = vec!["dlock", "run"];
            v.extend_from_slice(args);
            Cli::try_parse_from(v)
        };
        let Cmd::Run(a) = run(&["-s", "-E", "3", "-v", "x", "-c", "echo hi"])
            .expect("parse")
            .command
        else {
            panic!("not run")
        };
        assert_eq!(a.cmd.command, Some(OsString::from("echo hi")));
        assert!(a.cmd.cmd.is_empty());
        let o = a.lock.into_opts();
        assert_eq!(o.kind, take::Kind::Read);
        assert_eq!(o.conflict_exit, 3);
        assert!(o.verbose);
        let Cmd::Run(a) = run(&["--permits", "3", "x", "--", "true"])
            .expect("parse")
            .command
        else {
            panic!("not run")
        };
        assert_eq!(a.lock.into_opts().kind, take::Kind::Permit(3));
        let Cmd::Run(a) = run(&["-x", "x", "true"]).expect("parse").command else {
            panic!("not run")
        };
        assert_eq!(a.lock.into_opts().kind, take::Kind::Write);
        // Conflicting or missing pieces are usage errors.
        assert!(run(&["-s", "-x", "x", "true"]).is_err());
        assert!(run(&["-s", "--permits", "2", "x", "true"]).is_err());
        assert!(run(&["--permits", "0", "x", "true"]).is_err());
        assert!(run(&["-E", "256", "x", "true"]).is_err());
        assert!(run(&["x"]).is_err());
        assert!(run(&["x", "-c", "true", "--", "ls"]).is_err());
        let c =
            Cli::try_parse_from(["dlock", "hold", "-n", "--ttl", "2s", "deploy"]).expect("parse");
        let Cmd::Hold(a) = c.command else {
            panic!("not hold")
        };
        let o = a.lock.into_opts();
        assert!(o.no_wait);
        assert_eq!(o.kind, take::Kind::Mutex);
        assert_eq!(o.conflict_exit, exit::NOT_GRANTED);
    }
}
