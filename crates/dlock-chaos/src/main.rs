//! `dlock-chaos`: dlock's fault-injection harness.
//!
//! For each backend it starts private servers on loopback ports, runs 2–8 client processes per
//! lane (a lane is one lock name; a scenario has 1–32) that loop acquire → read → sleep → write →
//! release against the lane's fenced resource, and
//! breaks things on purpose: SIGKILL or SIGSTOP of the holder, store restarts, killed store
//! connections, delayed or black-holed client traffic through a TCP proxy, a paused etcd leader,
//! Redlock majorities stopped, a Redis Sentinel or Cluster master killed or paused through its
//! fail-over, a Redis Cluster slot migrated. It prints a figures table, writes it as JSON, and
//! exits 1 if a property the backend promises did not hold. See docs/RELIABILITY.md.

mod analysis;
mod event;
mod report;
mod resource;
mod run;
mod stores;
mod worker;

use clap::{Parser, Subcommand};
use resource::Mode;
use run::{Fault, Settings};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stores::{Backend, StoreEnv};

/// Break dlock's stores on purpose and count what goes wrong.
#[derive(Debug, Parser)]
#[command(name = "dlock-chaos", version)]
struct Cli {
    #[command(subcommand)]
    worker: Option<WorkerCmd>,
    /// Backends to run (repeat; default: all)
    #[arg(long = "backend", value_enum)]
    backends: Vec<Backend>,
    /// Only these faults (repeat; default: every fault that applies)
    #[arg(long = "fault", value_enum)]
    faults: Vec<Fault>,
    /// The bounded run of CI: 4 clients, 1 fault per scenario (of the Redis fail-over
    /// deployments only one scenario of each that confirms with WAIT)
    #[arg(long)]
    quick: bool,
    /// Client processes at a time, per lane (2-8)
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=8))]
    workers: Option<u32>,
    /// Faults injected per scenario (1-1000): a fault of the store once for every lane, a fault
    /// of a client process by an eighth of the lanes at a time (at least one), in turn
    #[arg(long = "faults-per-scenario", value_parser = clap::value_parser!(u32).range(1..=1000))]
    per_scenario: Option<u32>,
    /// Independent lock names per scenario (1-32), each with its own fenced resource and
    /// client processes; every lane sees a fault of the store
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=32))]
    lanes: Option<u32>,
    /// After the faults asked for, go on injecting at the same pace until the lanes together
    /// have made this many acquisitions (at most 20 times the faults asked for)
    #[arg(long = "min-acquisitions", value_name = "N")]
    min_acquisitions: Option<u64>,
    /// Normal operation before each fault, in ms (100-10000; default 800 quick, 1500 full)
    #[arg(long = "gap-ms", value_parser = clap::value_parser!(u64).range(100..=10_000))]
    gap_ms: Option<u64>,
    /// Mean hold in the store-side fault scenarios, in ms (300-5000; default 2000): each hold
    /// lasts 0.5-1.5 times this, and one that outlasts a third of the lease renews
    #[arg(long = "long-hold-ms", value_parser = clap::value_parser!(u64).range(300..=5000))]
    long_hold_ms: Option<u64>,
    /// The share of long holds in the store-side fault scenarios, in percent (1-100; default
    /// 100): the others last the short mean hold, and a fault aimed at a holder picks a hold
    /// planned to outlast the lease
    #[arg(long = "long-share", value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100))]
    long_share: Option<u32>,
    /// Write the JSON report here
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Write the Markdown table here (it is printed in any case)
    #[arg(long, value_name = "PATH")]
    markdown: Option<PathBuf>,
    /// Write each scenario's raw record (client events, the resource's reads and writes, the
    /// faults) to DIR/BACKEND.FAULT.MODE.json
    #[arg(long, value_name = "DIR")]
    events: Option<PathBuf>,
    /// Backends run at a time (1-4), each on its own private servers; the scenarios of one
    /// backend run one after another
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4))]
    jobs: u32,
}

#[derive(Debug, Subcommand)]
enum WorkerCmd {
    /// One client process (started by the harness itself)
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// The command a `--via-run` worker runs under `dlock run`: one read, sleep, write
    #[command(hide = true)]
    Step(worker::StepArgs),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.exit_code() == 0 { 0 } else { 64 });
        }
    };
    if let Some(cmd) = cli.worker {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let code = match rt {
            Ok(rt) => rt.block_on(async move {
                match cmd {
                    WorkerCmd::Worker(a) => worker::run(a).await,
                    WorkerCmd::Step(a) => worker::step(a).await,
                }
            }),
            Err(e) => {
                eprintln!("dlock-chaos worker: {e}");
                70
            }
        };
        std::process::exit(code);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let code = match rt {
        Ok(rt) => rt.block_on(harness(cli)),
        Err(e) => {
            eprintln!("dlock-chaos: {e}");
            70
        }
    };
    std::process::exit(code);
}

async fn harness(cli: Cli) -> i32 {
    let mut settings = if cli.quick {
        Settings::quick()
    } else {
        Settings::full()
    };
    if let Some(w) = cli.workers {
        settings.workers = w;
    }
    if let Some(n) = cli.per_scenario {
        settings.faults = n;
    }
    if let Some(n) = cli.lanes {
        settings.lanes = n;
    }
    if let Some(n) = cli.min_acquisitions {
        settings.min_acquisitions = n;
    }
    if let Some(ms) = cli.gap_ms {
        settings.gap = Duration::from_millis(ms);
    }
    if let Some(ms) = cli.long_hold_ms {
        settings.long_hold = Duration::from_millis(ms);
    }
    if let Some(pct) = cli.long_share {
        settings.long_share = pct;
    }
    settings.events_dir = cli.events.clone();
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("dlock-chaos: cannot find its own binary: {e}");
            return 70;
        }
    };
    let backends = if cli.backends.is_empty() {
        Backend::ALL.to_vec()
    } else {
        cli.backends.clone()
    };
    let report = report::Report {
        machine: report::Machine::here(),
        settings: settings.clone(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        outcomes: Vec::new(),
        setup_errors: Vec::new(),
    };
    // Backends run `--jobs` at a time (each on its own private servers); their rows keep the
    // order of `backends` in the report, and the report is saved after every scenario.
    let shared = Arc::new(Mutex::new(report));
    let jobs = Arc::new(tokio::sync::Semaphore::new(cli.jobs as usize));
    let cli = Arc::new(cli);
    let mut tasks = Vec::new();
    for b in backends {
        let plan: Vec<(Fault, Mode)> = run::scenarios(b, cli.quick)
            .into_iter()
            .filter(|(f, _)| cli.faults.is_empty() || cli.faults.contains(f))
            .collect();
        if plan.is_empty() {
            continue;
        }
        let (jobs, shared, cli, settings, exe) = (
            jobs.clone(),
            shared.clone(),
            cli.clone(),
            settings.clone(),
            exe.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let _permit = jobs.acquire_owned().await;
            run_backend(b, plan, &settings, exe, &cli, &shared).await
        }));
    }
    let mut outcomes = Vec::new();
    let mut setup_errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(mut done)) => outcomes.append(&mut done),
            Ok(Err(e)) => setup_errors.push(e),
            Err(e) => {
                setup_errors.push(("harness".into(), format!("a backend's task failed: {e}")))
            }
        }
    }
    let mut report = lock(&shared).clone();
    report.outcomes = outcomes;
    report.setup_errors = setup_errors;
    let md = report::markdown(&report);
    println!("{md}");
    if let Err(e) = save(&cli, &report) {
        eprintln!("dlock-chaos: {e}");
        return 70;
    }
    if report.ok() {
        0
    } else {
        1
    }
}

/// Starts `b`'s private servers and runs its scenarios one after another; returns their
/// outcomes (also added to `shared`, which is saved after each), or the servers' setup error.
async fn run_backend(
    b: Backend,
    plan: Vec<(Fault, Mode)>,
    settings: &Settings,
    exe: PathBuf,
    cli: &Cli,
    shared: &Mutex<report::Report>,
) -> Result<Vec<run::Outcome>, (String, String)> {
    eprintln!("dlock-chaos: {}: starting private servers", b.label());
    let lease = settings.lease;
    let env = match tokio::task::spawn_blocking(move || StoreEnv::start(b, lease)).await {
        Ok(Ok(env)) => env,
        Ok(Err(e)) => {
            eprintln!("dlock-chaos: {}: {e}", b.label());
            return Err((b.label().into(), e.to_string()));
        }
        Err(e) => return Err((b.label().into(), e.to_string())),
    };
    let mut outcomes = Vec::new();
    for (f, mode) in plan {
        eprintln!("dlock-chaos: {} / {} / {mode}", b.label(), f.label());
        let o = run::run(&env, f, mode, settings, exe.clone()).await;
        eprintln!(
            "dlock-chaos: {} / {} / {mode}: {} in {:.1} s ({} acquisitions)",
            b.label(),
            f.label(),
            o.verdict(),
            o.seconds,
            o.figures.acquisitions
        );
        // What failed, at once (the report comes at the end of the run).
        for c in o.checks.iter().filter(|c| c.status == run::Status::Fail) {
            eprintln!("dlock-chaos:   FAIL: {} — {}", c.what, c.detail);
        }
        for e in &o.harness_errors {
            eprintln!("dlock-chaos:   FAIL: harness: {e}");
        }
        // Written after every scenario, so that a long run stopped early keeps its rows.
        {
            let mut r = lock(shared);
            r.outcomes.push(o.clone());
            if let Err(e) = save(cli, &r) {
                eprintln!("dlock-chaos: {e}");
            }
        }
        outcomes.push(o);
    }
    // Servers stop on drop, which waits for them: off the async threads.
    let _ = tokio::task::spawn_blocking(move || drop(env)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(outcomes)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes the report to `--markdown` and `--json`, where asked.
fn save(cli: &Cli, report: &report::Report) -> Result<(), String> {
    if let Some(p) = &cli.markdown {
        std::fs::write(p, report::markdown(report))
            .map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    if let Some(p) = &cli.json {
        let json = serde_json::to_string_pretty(report).map_err(|e| format!("JSON: {e}"))?;
        std::fs::write(p, json).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}
