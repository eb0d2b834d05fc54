//! `dlock bench`: latency, throughput, hand-off, fairness and scale of dlock on each store,
//! side by side with the store's raw floor (the same client library without lock logic) and
//! with the peers (the `rslock` crate and redis-py's `Lock` on Redis, kazoo's `Lock` and
//! Curator's `InterProcessMutex` on ZooKeeper, etcd's own `Lock` RPC on etcd), all measured in
//! the same run and reported as ratios, with dlock against the best peer of every figure.
//!
//! Workloads (see `docs/BENCHMARKS.md`): U1 uncontended, C1 contended (8 and 64 waiters over
//! worker processes, hold 0 and 1 ms), H1 hand-off latency, F1 fairness, S1 many locks held by
//! one client, E1 election fail-over (a SIGKILLed leader process), T1 one name against a striped
//! lock. Every workload has a count and a time limit; a store that goes away is an error
//! in the report, never a hang.

mod peers;
mod plot;
mod redis_ha;
mod report;
mod stats;
mod store;
mod worker;
mod workloads;

pub use worker::{worker, WorkerArgs};

use crate::exit::{CliResult, Failure, OK, UNAVAILABLE};
use serde::Serialize;
use std::path::PathBuf;
use store::{Floor, Kind, Probe, Target};
use workloads::{Contended, Lib, Plan, E1, F1, H1, S1, T1, U1};

/// Measure dlock on one or more stores against the raw store and the peer libraries.
///
/// Runs U1 (uncontended acquire + release vs the store's raw floor), C1 (one name, 8 and 64
/// waiters over 4 processes, hold 0 and 1 ms), H1 (hand-off latency between processes), F1
/// (fairness in fair mode), S1 (1 to 100 000 names held by one client), E1 (election fail-over:
/// the leader process SIGKILLed, a 2 s term, until a standby process leads) and T1 (64 waiters
/// on one name, then on the stripes of random keys of a striped lock of 64) on every --url, and
/// the peers: the rslock crate and redis-py's Lock on Redis URLs (on a Sentinel deployment's
/// master; not on a Cluster, nor with replicas=N), kazoo's Lock and Curator's InterProcessMutex
/// on ZooKeeper URLs (python3 with the redis and kazoo modules, a JDK and Debian's Curator jars;
/// a peer missing here is a line of the report), etcd's own Lock RPC on etcd URLs. A Redis URL with
/// ?replicas=N is its own row (label +wait) whose raw floor pipelines WAIT after its SET, as
/// dlock's grants do. On ZooKeeper and etcd each contended run also reads the servers' log
/// fsync timings; on ZooKeeper that resets every server's statistics (`srst`) before the run,
/// where the ensemble allows the word. Writes results.md and results.json (and SVG charts with --plot) to --out,
/// and prints the Markdown.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  dlock bench --quick\n  dlock bench --url redis://127.0.0.1:6379/ --url postgres://postgres@127.0.0.1/test --plot\n  dlock bench --only e1,t1 --url redis://127.0.0.1:6379/\n  dlock bench --only u1,c1,h1 --url redis+sentinel://127.0.0.1:26379/mymaster --url 'redis+sentinel://127.0.0.1:26379/mymaster?replicas=1'\n\n--quick takes under a minute per store (about 25 s for SQLite; Redis URLs add the rslock and redis-py peers, ZooKeeper URLs kazoo and Curator, etcd URLs etcd's Lock RPC). A full run takes a few minutes per store."
)]
pub struct BenchArgs {
    /// Store URL to bench; repeat for several [default: a SQLite file in a temporary directory]
    #[arg(long, value_name = "URL")]
    url: Vec<String>,
    /// Small counts and short windows: a smoke test, not a measurement
    #[arg(long)]
    quick: bool,
    /// Also write SVG charts
    #[arg(long)]
    plot: bool,
    /// Where to write the results [default: ./dlock-bench-<timestamp>/]
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Skip the peers (rslock and redis-py on Redis, kazoo and Curator on ZooKeeper, etcd's Lock
    /// RPC on etcd)
    #[arg(long)]
    no_peers: bool,
    /// Run only these workloads (comma-separated: u1, c1, h1, f1, s1, e1, t1) [default: all]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = ["u1", "c1", "h1", "f1", "s1", "e1", "t1"])]
    only: Vec<String>,
    /// S1: the numbers of names to hold at once [default: 1,10,100,1000,10000,100000; --quick: up
    /// to 1000]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    s1_names: Vec<u32>,
    /// Also write every C1, H1 and F1 run's acquisitions (process, waiter, request, grant,
    /// release start and end, in ms after the start) as CSV files under DIR/records/
    #[arg(long)]
    records: bool,
    /// S1: the lease of the holds (renewed every third of it) [default: 5s; --quick: 2s]
    #[arg(long, value_name = "DUR", value_parser = crate::parse_ttl)]
    s1_lease: Option<std::time::Duration>,
}

/// The pinned peer versions (Cargo.toml pins rslock with `=`).
pub const RSLOCK_VERSION: &str = "0.10.0";

/// Everything measured on one store.
#[derive(Debug, Serialize, Default)]
pub struct TargetReport {
    /// Short label (`redis`, `redlock×3`, …).
    pub label: String,
    /// The URL, password redacted.
    pub url: String,
    /// The kind of store.
    pub kind: String,
    /// The server's version.
    pub server: Option<String>,
    /// What "store commands" counts on this store.
    pub commands_what: String,
    /// What "store memory" measures.
    pub memory_what: String,
    /// What S1's "store keep-alives" counts (stores that count lease renewals).
    pub keepalives_what: Option<String>,
    /// What the C1, H1 and F1 runs' "store log syncs" read (ZooKeeper, etcd).
    pub syncs_what: Option<String>,
    /// Store commands per second before the workloads (other users of the server).
    pub background_cmds_per_s: f64,
    /// The SQL server's state that changes the figures, before and after the workloads (see
    /// [`Probe::sql_state`]).
    pub sql_state: Option<(String, String)>,
    /// U1 of dlock and of the peer.
    pub u1: Vec<U1>,
    /// C1 runs of dlock and of the peer.
    pub c1: Vec<Contended>,
    /// H1 of dlock and of the peer.
    pub h1: Vec<H1>,
    /// F1 (dlock; absent where fair mode is unsupported).
    pub f1: Option<F1>,
    /// S1 (dlock).
    pub s1: Option<S1>,
    /// E1 (dlock).
    pub e1: Option<E1>,
    /// T1 (dlock).
    pub t1: Option<T1>,
    /// dlock against the best peer, figure by figure (where a peer ran).
    pub vs_best_peer: Vec<report::VsPeer>,
    /// Workloads that failed or do not apply, with the reason.
    pub errors: Vec<String>,
}

/// The machine the bench ran on.
#[derive(Debug, Serialize)]
pub struct Machine {
    /// Logical CPUs.
    pub cpus: usize,
    /// CPU model.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Total memory, MiB.
    pub mem_mib: u64,
}

/// The whole report (results.json).
#[derive(Debug, Serialize)]
pub struct Report {
    /// dlock's version.
    pub dlock_version: String,
    /// When the run started (UTC, RFC 3339).
    pub date: String,
    /// The command line.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
    /// The sizes and limits used.
    pub plan: Plan,
    /// The machine.
    pub machine: Machine,
    /// Peer and client library versions.
    pub versions: std::collections::BTreeMap<String, String>,
    /// Seconds the run took.
    pub duration_s: f64,
    /// One entry per store.
    pub targets: Vec<TargetReport>,
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|s| s.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(0);
    Machine {
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        mem_mib,
    }
}

fn versions() -> std::collections::BTreeMap<String, String> {
    [
        ("dlock", env!("CARGO_PKG_VERSION")),
        ("rslock (peer, pinned)", RSLOCK_VERSION),
        ("redis (crate, dlock)", "0.32.7"),
        ("redis (crate, rslock: its own, separate)", "1.x"),
        ("sqlx (raw SQL floor, dlock)", "0.8"),
        ("zookeeper-client (raw ZooKeeper floor, dlock)", "0.11"),
        (
            "etcd-client (raw etcd floor, the etcd Lock RPC peer, dlock)",
            "0.21.1",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Removes the temporary SQLite directory when the bench ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `dlock bench`.
pub async fn bench(a: BenchArgs) -> CliResult {
    let started = std::time::Instant::now();
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let run = format!(
        "{}-{}",
        date.replace([':', '-'], "").trim_end_matches('Z'),
        std::process::id()
    );
    let mut temp = None;
    let mut urls = a.url.clone();
    if urls.is_empty() {
        let dir = std::env::temp_dir().join(format!("dlock-bench-{run}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::unavailable(format!("cannot create {}: {e}", dir.display())))?;
        urls.push(crate::store::sqlite_url(&dir.join("locks.db")));
        temp = Some(TempDir(dir));
    }
    let targets: Vec<Target> = urls
        .iter()
        .map(|u| Target::parse(u))
        .collect::<Result<_, _>>()
        .map_err(Failure::usage)?;
    let out_dir = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("dlock-bench-{run}")));
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| Failure::unavailable(format!("cannot create {}: {e}", out_dir.display())))?;
    let mut plan = Plan::new(a.quick);
    if !a.s1_names.is_empty() {
        plan.s1_levels = a.s1_names.iter().map(|&n| n as usize).collect();
    }
    if let Some(l) = a.s1_lease {
        plan.s1_lease_ms = u64::try_from(l.as_millis()).unwrap_or(u64::MAX);
        // Long enough to see renewal happen (every third of the lease).
        plan.s1_window_secs = plan.s1_window_secs.max(l.as_secs_f64() * 0.7);
    }
    if a.records {
        let dir = out_dir.join("records");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::unavailable(format!("cannot create {}: {e}", dir.display())))?;
        plan.records = Some(dir);
    }
    plan.only = if a.only.is_empty() {
        vec!["u1", "c1", "h1", "f1", "s1", "e1", "t1"]
            .into_iter()
            .map(String::from)
            .collect()
    } else {
        a.only.clone()
    };
    let mut reports = Vec::new();
    let mut peers = (!a.no_peers).then(|| peers::Peers::new(&run));
    for t in &targets {
        eprintln!("dlock bench: {} ({})", t.label(), t.shown);
        reports.push(bench_target(t, &plan, &run, peers.as_mut()).await);
    }
    let mut versions = versions();
    if let Some(p) = &peers {
        versions.extend(p.versions());
    }
    drop(peers);
    drop(temp);
    let report = Report {
        dlock_version: env!("CARGO_PKG_VERSION").into(),
        date,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        quick: a.quick,
        plan,
        machine: machine(),
        versions,
        duration_s: started.elapsed().as_secs_f64(),
        targets: reports,
    };
    let md = report::markdown(&report);
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| Failure::new(crate::exit::SOFTWARE, e.to_string()))?;
    let write = |name: &str, data: &str| {
        std::fs::write(out_dir.join(name), data).map_err(|e| {
            Failure::unavailable(format!(
                "cannot write {}: {e}",
                out_dir.join(name).display()
            ))
        })
    };
    write("results.md", &md)?;
    write("results.json", &json)?;
    if a.plot {
        plot::charts(&report, &out_dir).map_err(|e| {
            Failure::new(
                crate::exit::SOFTWARE,
                format!("cannot draw the charts: {e}"),
            )
        })?;
    }
    println!("{md}");
    eprintln!("dlock bench: results in {}", out_dir.display());
    let failed: Vec<&str> = report
        .targets
        .iter()
        .filter(|t| t.errors.iter().any(|e| !not_run(e)))
        .map(|t| t.label.as_str())
        .collect();
    if failed.is_empty() {
        Ok(OK)
    } else {
        Err(Failure::new(
            UNAVAILABLE,
            format!(
                "some workloads failed on {} (see the report)",
                failed.join(", ")
            ),
        ))
    }
}

/// A line of the report that says why something did not run, not that it failed: a workload or
/// peer that does not apply to the store, a peer this machine lacks.
fn not_run(e: &str) -> bool {
    e.contains("not supported") || (e.starts_with("peer ") && e.contains(": not available: "))
}

async fn bench_target(
    t: &Target,
    plan: &Plan,
    run: &str,
    mut ext_peers: Option<&mut peers::Peers>,
) -> TargetReport {
    let peers = ext_peers.is_some();
    let mut r = TargetReport {
        label: t.label(),
        url: t.shown.clone(),
        kind: t.kind.name().into(),
        commands_what: store::commands_what(t.kind).into(),
        memory_what: store::memory_what(t.kind).into(),
        keepalives_what: store::keepalives_what(t.kind).map(String::from),
        syncs_what: store::syncs_what(t.kind).map(String::from),
        ..TargetReport::default()
    };
    let probe = match Probe::open(t).await {
        Ok(p) => p,
        Err(e) => {
            r.errors.push(format!("store unreachable: {e}"));
            return r;
        }
    };
    r.server = probe.version().await;
    let floor = match Floor::open(&t.u1_target(), run).await {
        Ok(f) => f,
        Err(e) => {
            r.errors.push(format!("raw floor: {e}"));
            probe.cleanup(t, run).await;
            return r;
        }
    };
    let background = workloads::background_rate(&probe).await;
    r.background_cmds_per_s = background;
    let state_before = probe.sql_state().await;
    let mut libs: Vec<Lib> = match t.kind {
        // rslock sends no WAIT: on a `replicas=N` URL it would measure the row without it again
        // (and look cheaper than a floor that waits), so it runs on that row only.
        Kind::Redis | Kind::Redlock | Kind::RedisSentinel if peers && t.replicas() == 0 => {
            vec![Lib::Dlock, Lib::Rslock]
        }
        Kind::Etcd if peers => vec![Lib::Dlock, Lib::EtcdLock],
        _ => vec![Lib::Dlock],
    };
    if peers && t.kind == Kind::RedisCluster {
        r.errors.push(redis_ha::RSLOCK_NOT_ON_CLUSTER.into());
    } else if peers && t.replicas() > 0 {
        r.errors.push(format!(
            "peer rslock: not supported with replicas={} (rslock sends no WAIT: its figures are \
             those of the same deployment without replicas=, the row without +wait)",
            t.replicas()
        ));
    }
    let on = |w: &str| plan.only.iter().any(|o| o == w);
    // The peers in processes of their own (redis-py, kazoo, Curator), where they apply and run;
    // they take part in U1, C1 and H1 only.
    let exts = match ext_peers.as_mut() {
        Some(p) if on("u1") || on("c1") || on("h1") => {
            let (exts, lines) = p.for_target(t).await;
            r.errors.extend(lines);
            exts
        }
        _ => Vec::new(),
    };
    libs.extend(exts.iter().map(|e| e.lib));
    let ext_of = |lib: Lib| exts.iter().find(|e| e.lib == lib);
    let (mut floor_pair, mut ping) = (None, None);
    // C1, H1 and F1 need the floor of U1 for their ideal and round trips.
    for &lib in libs.iter().filter(|_| on("u1") || on("c1") || on("h1")) {
        eprintln!("  U1 {}", lib.name());
        match workloads::u1(t, plan, lib, run, &floor, ext_of(lib)).await {
            Ok(u) => {
                floor_pair.get_or_insert(u.floor.p50_us);
                if let Some(p) = u.ping {
                    ping.get_or_insert(p.p50_us / 2.0);
                }
                r.u1.push(u);
            }
            Err(e) => r.errors.push(format!("U1 {}: {e}", lib.name())),
        }
    }
    let contended =
        |lib: Lib, tag: String, waiters: u32, procs: u32, hold: u64, pause: u64, fair| {
            let name = format!("dlockbench/{run}/{}/{tag}", lib.name());
            let records = plan.records.as_ref().map(|d| {
                d.join(format!("{}-{}-{tag}.csv", t.label(), lib.name()).replace(['/', ' '], "_"))
            });
            let probe = &probe;
            async move {
                workloads::contended(
                    t,
                    lib,
                    ext_of(lib),
                    &name,
                    waiters,
                    procs,
                    hold,
                    pause,
                    fair,
                    plan.contended_secs,
                    probe,
                    background,
                    floor_pair,
                    records.as_deref(),
                )
                .await
            }
        };
    for &lib in &libs {
        for &w in plan.c1_waiters.iter().filter(|_| on("c1")) {
            for &h in &plan.c1_holds_ms {
                eprintln!("  C1 {} {w} waiters, hold {h} ms", lib.name());
                match contended(lib, format!("c1-{w}-{h}"), w, plan.procs, h, 0, false).await {
                    Ok(c) => r.c1.push(c),
                    Err(e) => r
                        .errors
                        .push(format!("C1 {} {w} waiters hold {h} ms: {e}", lib.name())),
                }
            }
        }
        if !on("h1") {
            continue;
        }
        eprintln!("  H1 {}", lib.name());
        match contended(lib, "h1".into(), 2, 2, 1, 300, false).await {
            Ok(c) => {
                let rtt = floor_pair.unwrap_or(0.0) / 2.0;
                let p50 = c.handoff_cross.p50_us / rtt.max(1e-9);
                let applies = matches!(
                    t.kind,
                    Kind::Redis | Kind::RedisSentinel | Kind::RedisCluster | Kind::Postgres
                ) && lib == Lib::Dlock;
                r.h1.push(H1 {
                    lib,
                    rtt_us: rtt,
                    p50_in_rtt: p50,
                    ping_rtt_us: ping,
                    p50_in_ping_rtt: ping.map(|p| c.handoff_cross.p50_us / p.max(1e-9)),
                    p99_in_rtt: c.handoff_cross.p99_us / rtt.max(1e-9),
                    target_met: (applies && c.handoff_cross.n > 0).then_some(p50 <= 2.0),
                    run: c,
                });
            }
            Err(e) => r.errors.push(format!("H1 {}: {e}", lib.name())),
        }
    }
    if on("f1") && t.kind == Kind::Redlock {
        r.errors
            .push("F1: fair mode is not supported on Redlock (mutex only)".into());
    } else if on("f1") {
        eprintln!("  F1 dlock");
        match contended(Lib::Dlock, "f1".into(), 8, plan.procs, 1, 0, true).await {
            Ok(run) => {
                let unfair =
                    r.c1.iter()
                        .find(|c| c.lib == Lib::Dlock && c.waiters == 8 && c.hold_ms == 1)
                        .cloned();
                r.f1 = Some(F1 { run, unfair });
            }
            Err(e) => r.errors.push(format!("F1: {e}")),
        }
    }
    if on("s1") {
        eprintln!("  S1 dlock");
        match workloads::s1(t, plan, run, &probe, background).await {
            Ok(s) => r.s1 = Some(s),
            Err(e) => r.errors.push(format!("S1: {e}")),
        }
    }
    if on("e1") {
        eprintln!("  E1 dlock");
        match workloads::e1(t, plan, run).await {
            Ok(e) => r.e1 = Some(e),
            Err(e) => r.errors.push(format!("E1: {e}")),
        }
    }
    if on("t1") {
        eprintln!("  T1 dlock");
        match workloads::t1(t, plan, run, &probe, background).await {
            Ok(x) => r.t1 = Some(x),
            Err(e) => r.errors.push(format!("T1: {e}")),
        }
    }
    for e in &exts {
        e.cleanup(t).await;
    }
    floor.cleanup().await;
    if let Some(before) = state_before {
        let after = probe.sql_state().await.unwrap_or_else(|| "not read".into());
        r.sql_state = Some((before, after));
    }
    probe.cleanup(t, run).await;
    r.vs_best_peer = report::vs_best_peer(&r);
    r
}
