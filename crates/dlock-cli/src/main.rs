//! `dlock`: run a command under a distributed lock, list and remove locks, and watch a ticket
//! sale oversell without a lock and not with one.

mod bench;
mod demo;
mod exit;
mod list;
mod run;
mod signals;
mod store;
mod table;

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
error, 75 lock not acquired, 76 lock lost while the command ran, 126/127 command not executable / \
not found, 128+N command killed by signal N.";

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
    List(ListArgs),
    Info(InfoArgs),
    Unlock(UnlockArgs),
    Demo(DemoArgs),
    #[command(hide = true)]
    DemoBuyer(BuyerArgs),
    Bench(bench::BenchArgs),
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
}

/// Run a command while holding the mutex NAME.
///
/// Waits for the lock (forever unless --wait or --no-wait), runs CMD with DLOCK_NAME and
/// DLOCK_TOKEN (the fencing token) in its environment, renews the lease while CMD runs, and
/// releases the lock when CMD ends. dlock exits with CMD's status (128+N if a signal N killed
/// it). SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are passed on to
/// CMD (a terminal's Ctrl-C reaches CMD directly, once).
///
/// If the lock is not acquired, CMD is not run and dlock exits 75. If the lock is lost while
/// CMD runs (the store dropped the hold, or it could not be renewed in time), CMD gets SIGTERM,
/// SIGKILL after --kill-after, and dlock exits 76.
#[derive(Debug, Args)]
#[command(
    override_usage = "dlock run [OPTIONS] <NAME> -- <CMD> [ARGS]...",
    after_help = "Examples:\n  dlock run backups/nightly -- /usr/local/bin/backup --full\n  dlock run --no-wait --hold-at-least 1h reports/hourly -- ./report.sh\n\nExit codes: CMD's own, or 75 not acquired, 76 lock lost, 64 usage, 69 store error, 126/127 CMD not executable / not found."
)]
struct RunArgs {
    /// Store URL [default: $DLOCK_URL, else the SQLite file in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Lease of the lock, renewed while CMD runs (how long a crashed dlock blocks others)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,
    /// Wait at most DUR for the lock, then exit 75 [default: wait forever]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with = "no_wait", allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held
    #[arg(long)]
    no_wait: bool,
    /// Keep the lock until DUR after it was granted, even if CMD ends sooner (dlock exits at once;
    /// the store's lease ends the hold)
    #[arg(long, value_name = "DUR", value_parser = parse_duration, allow_hyphen_values = true)]
    hold_at_least: Option<Duration>,
    /// Grant the lock to waiters in arrival order
    #[arg(long)]
    fair: bool,
    /// After a lost lock, how long CMD has between SIGTERM and SIGKILL
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    kill_after: Duration,
    /// The lock name (1 to 255 bytes)
    #[arg(value_name = "NAME")]
    name: String,
    /// The command to run and its arguments (after `--`)
    #[arg(value_name = "CMD", required = true, trailing_var_arg = true)]
    cmd: Vec<OsString>,
}

/// List the locks held now, with their holders and waiters.
///
/// Shows name, kind, mode, owner, host, pid, fencing token, lease left and when each hold was
/// acquired, as a table, or the full records as one JSON array with --json.
#[derive(Debug, Args)]
struct ListArgs {
    /// Store URL [default: $DLOCK_URL, else the SQLite file in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Print one JSON array instead of a table
    #[arg(long)]
    json: bool,
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

/// Force-release the lock NAME, whoever holds it (administrators only).
///
/// Removes every hold and queue place of NAME. The holders are not asked: their `lost()` fires
/// at their next renewal (a `dlock run` holding it stops its command and exits 76). Fencing
/// tokens keep increasing. Refuses to act without --force.
#[derive(Debug, Args)]
struct UnlockArgs {
    /// Store URL [default: $DLOCK_URL, else the SQLite file in your state directory]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Really remove the holds
    #[arg(long)]
    force: bool,
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
/// strictly increase. Exits 0 if round 2 is right, 1 if not.
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
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn runtime(multi: bool) -> std::io::Result<tokio::runtime::Runtime> {
    if multi {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
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
    init_logging();
    if !matches!(cli.command, Cmd::Run(_)) {
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
                    url: a.url,
                    ttl: a.ttl,
                    wait: a.wait,
                    no_wait: a.no_wait,
                    hold_at_least: a.hold_at_least,
                    fair: a.fair,
                    kill_after: a.kill_after,
                    name: a.name,
                    cmd: a.cmd,
                })
                .await
            }
            Cmd::List(a) => list::list(a.url.as_deref(), a.json, &a.prefix).await,
            Cmd::Unlock(a) => list::unlock(a.url.as_deref(), &a.name, a.force).await,
            Cmd::Demo(a) => demo::demo(a.url.as_deref(), a.buyers, a.tickets).await,
            Cmd::DemoBuyer(a) => Ok(demo::buyer(demo::BuyerOpts {
                dir: a.dir,
                index: a.index,
                think: Duration::from_millis(a.think_ms),
                wait: Duration::from_millis(a.wait_ms),
                lock: a.lock,
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
        assert_eq!(a.cmd, vec![OsString::from("ls"), OsString::from("-l")]);
        let c = Cli::try_parse_from(["dlock", "run", "x", "ls", "--ttl", "1s"]).expect("parse");
        let Cmd::Run(a) = c.command else {
            panic!("not run")
        };
        assert_eq!(a.name, "x");
        assert_eq!(a.ttl, Duration::from_secs(30));
        assert_eq!(a.cmd.len(), 3);
        assert!(Cli::try_parse_from(["dlock", "run", "x", "--bogus"]).is_err());
        assert!(
            Cli::try_parse_from(["dlock", "run", "--wait", "1s", "--no-wait", "x", "true"])
                .is_err()
        );
    }
}
