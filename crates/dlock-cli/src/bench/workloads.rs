//! The workloads: U1 (uncontended, with the raw floor), C1/H1/F1 (contended, over worker
//! processes), S1 (many locks held by one client), E1 (election fail-over between candidate
//! processes), T1 (one name against a striped lock, over worker processes).

use super::peers::{Ext, U1Proc};
use super::stats::{jain, now_ns, us, Lat};
use super::store::{
    connections, counted_client, rss_bytes, CountSnap, Floor, Kind, Probe, Syncs, Target,
};
use super::worker::{etcd_lock_name, rslock_acquire, rslock_manager, EtcdPeer, Rec, WorkerOut};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// Sizes and limits of one run (`--quick` or full).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// U1: acquire + release pairs (and as many floor pairs).
    pub u1_iters: usize,
    /// U1: time limit for dlock and floor together.
    pub u1_secs: f64,
    /// C1: waiter counts.
    pub c1_waiters: Vec<u32>,
    /// C1: holds in milliseconds.
    pub c1_holds_ms: Vec<u64>,
    /// Worker processes the waiters are spread over.
    pub procs: u32,
    /// Seconds per contended configuration (C1, H1, F1).
    pub contended_secs: f64,
    /// S1: numbers of names held at once.
    pub s1_levels: Vec<usize>,
    /// S1: time limit for acquiring one level.
    pub s1_acquire_secs: f64,
    /// S1: the lease of the holds (short, so renewal happens).
    pub s1_lease_ms: u64,
    /// S1: the window over which renewal traffic is counted.
    pub s1_window_secs: f64,
    /// E1: fail-overs measured (each a SIGKILLed leader).
    pub e1_repeats: u32,
    /// E1: the term (the election's lease), ms.
    pub e1_term_ms: u64,
    /// T1: waiters (tasks over `procs` worker processes).
    pub t1_waiters: u32,
    /// T1: acquire/hold/release rounds per waiter.
    pub t1_rounds: u64,
    /// T1: the hold inside the lock, ms.
    pub t1_hold_ms: u64,
    /// T1: the stripes of the striped run.
    pub t1_stripes: u32,
    /// T1: the keys drawn from at random.
    pub t1_keys: u32,
    /// T1: time limit of one run, s.
    pub t1_limit_secs: f64,
    /// The workloads run (`--only`).
    pub only: Vec<String>,
    /// Where each contended run's acquisitions are written (`--records`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<std::path::PathBuf>,
}

impl Plan {
    /// The plan of `--quick` (a smoke test) or of a full run.
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                u1_iters: 200,
                u1_secs: 3.0,
                c1_waiters: vec![8, 64],
                c1_holds_ms: vec![0, 1],
                procs: 4,
                contended_secs: 0.8,
                s1_levels: vec![1, 10, 100, 1000],
                s1_acquire_secs: 10.0,
                s1_lease_ms: 2000,
                s1_window_secs: 2.0,
                e1_repeats: 2,
                e1_term_ms: 2000,
                t1_waiters: 64,
                t1_rounds: 5,
                t1_hold_ms: 1,
                t1_stripes: 64,
                t1_keys: 1024,
                t1_limit_secs: 30.0,
                only: Vec::new(),
                records: None,
            }
        } else {
            Plan {
                u1_iters: 2000,
                u1_secs: 25.0,
                c1_waiters: vec![8, 64],
                c1_holds_ms: vec![0, 1],
                procs: 4,
                contended_secs: 6.0,
                s1_levels: vec![1, 10, 100, 1000, 10_000, 100_000],
                s1_acquire_secs: 75.0,
                s1_lease_ms: 5000,
                s1_window_secs: 10.0,
                e1_repeats: 5,
                e1_term_ms: 2000,
                t1_waiters: 64,
                t1_rounds: 30,
                t1_hold_ms: 1,
                t1_stripes: 64,
                t1_keys: 1024,
                t1_limit_secs: 120.0,
                only: Vec::new(),
                records: None,
            }
        }
    }
}

/// The client library measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lib {
    /// dlock itself.
    Dlock,
    /// The `rslock` crate (Redlock), the peer on Redis.
    Rslock,
    /// etcd's own lock (the `Lock` RPC: v3lock, Go's `concurrency.Mutex`), the peer on etcd.
    #[serde(rename = "etcd-lock")]
    EtcdLock,
    /// redis-py's `Lock` (a Python process), a peer on Redis.
    #[serde(rename = "redis-py")]
    RedisPy,
    /// kazoo's `Lock` (a Python process), a peer on ZooKeeper.
    Kazoo,
    /// Apache Curator's `InterProcessMutex` (a Java process), a peer on ZooKeeper.
    Curator,
}

impl Lib {
    /// The name used on the worker's command line, in results.json and in the charts.
    pub fn name(self) -> &'static str {
        match self {
            Lib::Dlock => "dlock",
            Lib::Rslock => "rslock",
            Lib::EtcdLock => "etcd-lock",
            Lib::RedisPy => "redis-py",
            Lib::Kazoo => "kazoo",
            Lib::Curator => "curator",
        }
    }

    /// The name shown in the report's tables.
    pub fn label(self) -> &'static str {
        match self {
            Lib::EtcdLock => "etcd Lock RPC (v3lock, concurrency.Mutex)",
            Lib::RedisPy => "redis-py Lock",
            Lib::Kazoo => "kazoo Lock",
            Lib::Curator => "Curator InterProcessMutex",
            l => l.name(),
        }
    }
}

/// U1: one task, acquire + release, many times, interleaved with the raw floor.
#[derive(Debug, Clone, Serialize)]
pub struct U1 {
    /// The library.
    pub lib: Lib,
    /// acquire + release latency.
    pub lat: Lat,
    /// Pairs per second (1 / mean).
    pub ops_per_s: f64,
    /// The raw floor's latency (same run, interleaved).
    pub floor: Lat,
    /// What the floor is.
    pub floor_what: String,
    /// Two `SELECT 1` round trips (SQL stores).
    pub ping: Option<Lat>,
    /// p50 / floor p50.
    pub ratio_p50: f64,
    /// mean / floor mean.
    pub ratio_mean: f64,
    /// Target: ratio_p50 ≤ 1.2.
    pub target_met: bool,
    /// Backend calls per acquire + release (dlock).
    pub client_ops_per_pair: Option<f64>,
}

/// The client of U1.
enum L {
    D(dlock::Mutex, Arc<super::store::Counts>),
    R(rslock::LockManager),
    /// etcd's Lock RPC and the key name.
    E(Box<EtcdPeer>, String),
    /// A peer process (redis-py, kazoo, Curator), which times its own pairs.
    P(Box<U1Proc>),
}

/// One acquire + release.
async fn once(l: &L, name: &str) -> Result<(), String> {
    match l {
        L::D(m, _) => {
            let g = m
                .acquire_timeout(Duration::from_secs(10))
                .await
                .map_err(|e| format!("acquire: {e}"))?;
            g.release().await.map_err(|e| format!("release: {e}"))
        }
        L::R(lm) => match rslock_acquire(lm, name, now_ns() + 10_000_000_000).await? {
            Some(lock) => {
                lm.unlock(&lock).await;
                Ok(())
            }
            None => Err("rslock: not granted within 10 s".to_string()),
        },
        L::E(peer, key) => match peer.lock(key, now_ns() + 10_000_000_000).await? {
            Some(k) => peer.unlock(k).await,
            None => Err("etcd Lock: not granted within 10 s".to_string()),
        },
        L::P(_) => Err("a peer process times its own pairs".into()),
    }
}

/// `k` acquire + release pairs, each one's latency in µs: timed here, or by the peer process.
async fn block(l: &mut L, name: &str, k: usize) -> Result<Vec<f64>, String> {
    if let L::P(p) = l {
        return p.pairs(k).await;
    }
    let mut v = Vec::with_capacity(k);
    for _ in 0..k {
        let s = Instant::now();
        once(l, name).await?;
        v.push(us(s.elapsed()));
    }
    Ok(v)
}

/// Interleaves blocks of the measured operation and of the floor until the count or the time
/// limit is reached.
pub async fn u1(
    t: &Target,
    plan: &Plan,
    lib: Lib,
    run: &str,
    floor: &Floor,
    ext: Option<&Ext>,
) -> Result<U1, String> {
    let name = format!("dlockbench/{run}/u1/{}", lib.name());
    let mut l = match lib {
        Lib::Dlock => {
            let (c, counts) = super::store::limit(
                "connect",
                Duration::from_secs(30),
                counted_client(&t.u1_target(), dlock::DEFAULT_LEASE),
            )
            .await?;
            let m = c.mutex(name.clone()).map_err(|e| e.to_string())?;
            L::D(m, counts)
        }
        Lib::Rslock => L::R(rslock_manager(t).await?),
        Lib::EtcdLock => {
            let client = super::store::etcd_connect(t).await?;
            L::E(
                Box::new(EtcdPeer::new(&client).await?),
                etcd_lock_name(t, &name),
            )
        }
        Lib::RedisPy | Lib::Kazoo | Lib::Curator => {
            let ext = ext.ok_or_else(|| format!("peer {} not set up", lib.name()))?;
            L::P(Box::new(U1Proc::start(ext, &name).await?))
        }
    };
    let r = u1_loop(plan, &mut l, &name, floor).await;
    if let L::P(p) = l {
        p.quit().await;
    }
    let (a, f, p, client_ops_per_pair) = r?;
    let lat = Lat::of(&a);
    let fl = Lat::of(&f);
    let ratio_p50 = lat.p50_us / fl.p50_us.max(1e-9);
    Ok(U1 {
        lib,
        ops_per_s: 1e6 / lat.mean_us.max(1e-9),
        ratio_mean: lat.mean_us / fl.mean_us.max(1e-9),
        ratio_p50,
        target_met: ratio_p50 <= 1.2,
        lat,
        floor: fl,
        floor_what: super::store::floor_what(t),
        ping: (!p.is_empty()).then(|| Lat::of(&p)),
        client_ops_per_pair,
    })
}

/// U1's samples: the measured pairs, the floor's, the pings, and dlock's backend calls per
/// pair.
type U1Samples = (Vec<f64>, Vec<f64>, Vec<f64>, Option<f64>);

/// U1's measuring loop: blocks of 25 pairs, 25 floor pairs and 10 pings, until the count or
/// the time limit.
async fn u1_loop(plan: &Plan, l: &mut L, name: &str, floor: &Floor) -> Result<U1Samples, String> {
    // Warm up both.
    block(l, name, 20).await?;
    for _ in 0..20 {
        floor.once().await?;
    }
    let before = match &*l {
        L::D(_, c) => c.snap(),
        _ => CountSnap::default(),
    };
    let (mut a, mut f, mut p) = (Vec::new(), Vec::new(), Vec::new());
    let limit = Instant::now() + Duration::from_secs_f64(plan.u1_secs);
    while a.len() < plan.u1_iters && Instant::now() < limit {
        a.extend(block(l, name, 25).await?);
        for _ in 0..25 {
            let s = Instant::now();
            floor.once().await?;
            f.push(us(s.elapsed()));
        }
        for _ in 0..10 {
            let s = Instant::now();
            match floor.ping().await {
                Some(r) => r?,
                None => break,
            }
            p.push(us(s.elapsed()));
        }
    }
    let client_ops_per_pair = match &*l {
        L::D(_, c) => {
            let s = c.snap();
            let n = (s.store_calls() - before.store_calls()) as f64;
            Some(n / a.len().max(1) as f64)
        }
        _ => None,
    };
    if let L::E(peer, _) = &*l {
        peer.close().await;
    }
    Ok((a, f, p, client_ops_per_pair))
}

/// One contended configuration (C1, H1 and F1 are all made of these).
#[derive(Debug, Clone, Serialize)]
pub struct Contended {
    /// The library.
    pub lib: Lib,
    /// Waiters (tasks) in all.
    pub waiters: u32,
    /// Worker processes.
    pub procs: u32,
    /// Hold inside the lock, ms.
    pub hold_ms: u64,
    /// Fair mode.
    pub fair: bool,
    /// The measuring window, s.
    pub window_s: f64,
    /// Acquisitions in the window.
    pub acquisitions: usize,
    /// Acquisitions per second.
    pub acq_per_s: f64,
    /// Per-acquisition wait (request to grant).
    pub wait: Lat,
    /// Mean measured time inside the lock, µs.
    pub hold_mean_us: f64,
    /// When the request of the longest wait was made, seconds after the start.
    pub wait_max_at_s: f64,
    /// max wait / mean wait of the requests made from 0.5 s after the start on (without the
    /// cold start, when every waiter asks at once).
    pub max_over_mean_wait_after_start: Option<f64>,
    /// The store's own log syncs over the run (ZooKeeper, etcd; see `syncs_what`).
    pub store_syncs: Option<Syncs>,
    /// Hand-offs: release start of one holder → grant of a waiter that was waiting then.
    pub handoff: Lat,
    /// The same, only where the next holder is in another process (the store's wake-up).
    pub handoff_cross: Lat,
    /// 1 / (mean hold + the raw floor of a release and a grant), per second.
    pub ideal_acq_per_s: Option<f64>,
    /// acq_per_s / ideal, %.
    pub pct_of_ideal: Option<f64>,
    /// Target (1 ms hold): ≥ 95 % of ideal, Jain ≥ 0.98, wait max ≤ 10 × wait p50.
    pub target_met: Option<bool>,
    /// Store commands per acquisition (see `commands_what`), background-corrected.
    pub store_cmds_per_acq: Option<f64>,
    /// dlock backend calls per acquisition (client-side count).
    pub client_ops_per_acq: Option<f64>,
    /// max wait / mean wait.
    pub max_over_mean_wait: f64,
    /// Jain index of the acquisitions per waiter.
    pub jain_acquisitions: f64,
    /// Grants observed while the previous holder had not started releasing (must be 0; for
    /// rslock and Redlock a lease ending would show here).
    pub overlaps: usize,
    /// Errors reported by workers.
    pub errors: u64,
    /// The first of them.
    pub first_error: Option<String>,
}

/// The store's command rate with nothing of ours running (other users of a shared server).
pub async fn background_rate(probe: &Probe) -> f64 {
    let Ok(Some(a)) = probe.commands().await else {
        return 0.0;
    };
    let s = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let Ok(Some(b)) = probe.commands().await else {
        return 0.0;
    };
    // Minus the probe's own reads where they count (Redis INFO is excluded already).
    ((b - a) / s.elapsed().as_secs_f64()).max(0.0)
}

/// What the worker processes of one run reported.
struct Collected {
    /// Every acquisition.
    recs: Vec<Rec>,
    /// The stripe of each record, in the order of `recs` (T1's striped run; empty otherwise).
    stripes: Vec<u32>,
    /// Backend calls (dlock).
    ops: CountSnap,
    errors: u64,
    first_error: Option<String>,
    /// When the workers started, ns (CLOCK_REALTIME).
    start_ns: i64,
    /// The store's command counter before the start and after the reports.
    cmds: (Option<f64>, Option<f64>),
    /// The store's log syncs from just before the start to the reports.
    syncs: Option<Syncs>,
    /// Seconds from just before the start to the reports.
    elapsed_s: f64,
}

/// Starts `procs` worker processes with `waiters` tasks in all, each with `args` besides the
/// store, name, library, task count and index; starts them together for `secs` (their `END`) and
/// collects their reports. The workers are `dlock bench-worker`s, or the processes of the peer
/// `ext` (which speak the same protocol).
#[allow(clippy::too_many_arguments)]
async fn run_workers(
    t: &Target,
    lib: Lib,
    ext: Option<&Ext>,
    name: &str,
    waiters: u32,
    procs: u32,
    args: &[String],
    secs: f64,
    probe: &Probe,
) -> Result<Collected, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the dlock binary: {e}"))?;
    let procs = procs.min(waiters).max(1);
    let mut children = Vec::new();
    for i in 0..procs {
        let tasks = waiters / procs + u32::from(i < waiters % procs);
        let mut cmd = match ext {
            Some(ext) => ext.command("worker", name, Some(&format!("{name}/warm/{i}"))),
            None => {
                let mut cmd = tokio::process::Command::new(&exe);
                cmd.arg("bench-worker")
                    .args(["--url", &t.url, "--name", name, "--lib", lib.name()])
                    .env(
                        "RUST_LOG",
                        std::env::var("DLOCK_BENCH_WORKER_LOG").unwrap_or_else(|_| "error".into()),
                    )
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::inherit())
                    .kill_on_drop(true);
                cmd
            }
        };
        cmd.args(["--tasks", &tasks.to_string()])
            .args(["--proc-index", &i.to_string()])
            .args(args);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start a worker: {e}"))?;
        let stdout = child.stdout.take().ok_or("worker without stdout")?;
        let stdin = child.stdin.take().ok_or("worker without stdin")?;
        children.push((child, tokio::io::BufReader::new(stdout).lines(), stdin));
    }
    for (i, (_, lines, _)) in children.iter_mut().enumerate() {
        match tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await {
            Ok(Ok(Some(l))) if l.trim() == "ready" => {}
            Ok(Ok(other)) => {
                return Err(format!(
                    "worker {i} did not start (said {other:?}; see its error above)"
                ))
            }
            _ => return Err(format!("worker {i} did not connect within 60 s")),
        }
    }
    let s0 = probe.syncs_start().await;
    let c0 = probe.commands().await.ok().flatten();
    let t0 = Instant::now();
    let start = now_ns() + 200_000_000;
    let end = start + (secs * 1e9) as i64;
    for (_, _, stdin) in children.iter_mut() {
        stdin
            .write_all(format!("go {start} {end}\n").as_bytes())
            .await
            .map_err(|e| format!("worker went away: {e}"))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
    }
    let mut c = Collected {
        recs: Vec::new(),
        stripes: Vec::new(),
        ops: CountSnap::default(),
        errors: 0,
        first_error: None,
        start_ns: start,
        cmds: (c0, None),
        syncs: None,
        elapsed_s: 0.0,
    };
    let limit = Duration::from_secs_f64(secs + 60.0);
    for (i, (child, lines, _)) in children.iter_mut().enumerate() {
        let out = match tokio::time::timeout(limit, lines.next_line()).await {
            Ok(Ok(Some(l))) => serde_json::from_str::<WorkerOut>(&l)
                .map_err(|e| format!("worker {i}: bad report: {e}"))?,
            Ok(_) => {
                let st = child.wait().await.ok();
                return Err(format!(
                    "worker {i} ended without a report ({st:?}; see its error above)"
                ));
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(format!(
                    "worker {i} did not finish within {limit:?}: is the store still up?"
                ));
            }
        };
        c.recs.extend(out.records);
        c.stripes.extend(out.stripes);
        c.ops.add(&out.ops);
        c.errors += out.errors;
        if c.first_error.is_none() {
            c.first_error = out.first_error;
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    }
    // PostgreSQL counts a backend's transactions when it ends: give it a moment.
    if t.kind == Kind::Postgres {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    c.cmds.1 = probe.commands().await.ok().flatten();
    if let Some(s0) = s0 {
        c.syncs = probe.syncs().await.map(|s1| s0.until(&s1));
    }
    c.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(c)
}

/// Store commands per acquisition over a run, less the background rate.
fn cmds_per_acq(c: &Collected, background: f64, n: usize) -> Option<f64> {
    match c.cmds {
        (Some(a), Some(b)) if n > 0 => {
            Some(((b - a) - background * c.elapsed_s).max(0.0) / n as f64)
        }
        _ => None,
    }
}

/// Writes a run's acquisitions (sorted by grant) as CSV: the process and waiter, the request,
/// grant, release start and release end in ms after the start, and the request's wall-clock
/// time (µs since the Unix epoch, to match with logs).
fn write_records(path: &Path, recs: &[Rec], start_ns: i64) -> Result<(), String> {
    use std::fmt::Write;
    let mut out = String::from(
        "process,waiter,request_ms,grant_ms,release_start_ms,release_end_ms,request_unix_us\n",
    );
    let ms = |t: i64| (t - start_ns) as f64 / 1e6;
    for r in recs {
        let _ = writeln!(
            out,
            "{},{},{:.3},{:.3},{:.3},{:.3},{}",
            r[0],
            r[1],
            ms(r[2]),
            ms(r[3]),
            ms(r[4]),
            ms(r[5]),
            r[2] / 1000
        );
    }
    std::fs::write(path, out).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Runs one contended configuration over worker processes.
#[allow(clippy::too_many_arguments)]
pub async fn contended(
    t: &Target,
    lib: Lib,
    ext: Option<&Ext>,
    name: &str,
    waiters: u32,
    procs: u32,
    hold_ms: u64,
    pause_us: u64,
    fair: bool,
    secs: f64,
    probe: &Probe,
    background: f64,
    floor_pair_us: Option<f64>,
    records: Option<&Path>,
) -> Result<Contended, String> {
    let procs = procs.min(waiters).max(1);
    let mut args: Vec<String> = vec![
        "--hold-us".into(),
        (hold_ms * 1000).to_string(),
        "--pause-us".into(),
        pause_us.to_string(),
    ];
    if fair {
        args.push("--fair".into());
    }
    let c = run_workers(t, lib, ext, name, waiters, procs, &args, secs, probe).await?;
    let store_cmds = cmds_per_acq(&c, background, c.recs.len());
    let (mut recs, ops, errors, first_error) = (c.recs, c.ops, c.errors, c.first_error);
    let window_s = secs;
    let n = recs.len();
    recs.sort_by_key(|r| r[3]);
    if let Some(path) = records {
        write_records(path, &recs, c.start_ns)?;
    }
    let waits: Vec<f64> = recs.iter().map(|r| (r[3] - r[2]) as f64 / 1e3).collect();
    let longest = recs.iter().max_by_key(|r| r[3] - r[2]);
    let later: Vec<f64> = recs
        .iter()
        .filter(|r| r[2] >= c.start_ns + 500_000_000)
        .map(|r| (r[3] - r[2]) as f64 / 1e3)
        .collect();
    let later = Lat::of(&later);
    let holds: Vec<f64> = recs.iter().map(|r| (r[4] - r[3]) as f64 / 1e3).collect();
    let (mut handoff, mut cross, mut overlaps) = (Vec::new(), Vec::new(), 0);
    for w in recs.windows(2) {
        let (p, c) = (&w[0], &w[1]);
        if c[3] < p[4] {
            overlaps += 1;
            continue;
        }
        if c[2] < p[4] {
            let h = (c[3] - p[4]) as f64 / 1e3;
            handoff.push(h);
            if c[0] != p[0] {
                cross.push(h);
            }
        }
    }
    let mut per_waiter = std::collections::HashMap::<(i64, i64), f64>::new();
    for r in &recs {
        *per_waiter.entry((r[0], r[1])).or_default() += 1.0;
    }
    let mut counts: Vec<f64> = per_waiter.into_values().collect();
    counts.resize(waiters as usize, 0.0);
    let wait = Lat::of(&waits);
    let hold_mean_us = Lat::of(&holds).mean_us;
    let acq_per_s = n as f64 / window_s;
    let ideal = match (hold_ms, floor_pair_us) {
        (h, Some(f)) if h > 0 => Some(1e6 / (hold_mean_us + f)),
        _ => None,
    };
    let pct = ideal.map(|i| 100.0 * acq_per_s / i);
    Ok(Contended {
        lib,
        waiters,
        procs,
        hold_ms,
        fair,
        window_s,
        acquisitions: n,
        acq_per_s,
        max_over_mean_wait: wait.max_us / wait.mean_us.max(1e-9),
        wait,
        hold_mean_us,
        wait_max_at_s: longest.map_or(0.0, |r| (r[2] - c.start_ns) as f64 / 1e9),
        max_over_mean_wait_after_start: (later.n > 0)
            .then(|| later.max_us / later.mean_us.max(1e-9)),
        store_syncs: c.syncs,
        handoff: Lat::of(&handoff),
        handoff_cross: Lat::of(&cross),
        ideal_acq_per_s: ideal,
        pct_of_ideal: pct,
        target_met: pct
            .filter(|_| hold_ms == 1)
            .map(|p| p >= 95.0 && jain(&counts) >= 0.98 && wait.max_us <= 10.0 * wait.p50_us),
        store_cmds_per_acq: store_cmds,
        client_ops_per_acq: (lib == Lib::Dlock && n > 0)
            .then(|| ops.store_calls() as f64 / n as f64),
        jain_acquisitions: jain(&counts),
        overlaps,
        errors,
        first_error,
    })
}

/// H1: hand-off latency between processes, in raw round trips.
#[derive(Debug, Clone, Serialize)]
pub struct H1 {
    /// The library.
    pub lib: Lib,
    /// The run it comes from (2 processes × 1 waiter taking turns: hold 1 ms, then 0.3 ms
    /// outside the lock, so every release has exactly one waiter, in the other process).
    pub run: Contended,
    /// One raw round trip: half the U1 floor.
    pub rtt_us: f64,
    /// Cross-process hand-off p50 / rtt.
    pub p50_in_rtt: f64,
    /// One `SELECT 1` round trip (SQL stores).
    pub ping_rtt_us: Option<f64>,
    /// Cross-process hand-off p50 / ping rtt.
    pub p50_in_ping_rtt: Option<f64>,
    /// Cross-process hand-off p99 / rtt.
    pub p99_in_rtt: f64,
    /// Target (Redis, PostgreSQL): p50 ≤ 2 round trips.
    pub target_met: Option<bool>,
}

/// F1: fairness in fair mode.
#[derive(Debug, Clone, Serialize)]
pub struct F1 {
    /// The fair run.
    pub run: Contended,
    /// The same without fair mode, for contrast.
    pub unfair: Option<Contended>,
}

/// One level of S1.
#[derive(Debug, Clone, Serialize)]
pub struct S1Level {
    /// Names asked for.
    pub names: usize,
    /// Names held at once.
    pub held: usize,
    /// Whether all were acquired within the time limit.
    pub complete: bool,
    /// Seconds to acquire them (concurrency 64).
    pub acquire_s: f64,
    /// Client RSS growth per hold, bytes.
    pub client_bytes_per_hold: f64,
    /// Store memory growth per hold, bytes (see `memory_what`).
    pub store_bytes_per_hold: Option<f64>,
    /// Connections to the store before acquiring (client connected, one lock used).
    pub conns_before: usize,
    /// Connections while holding all.
    pub conns_after: usize,
    /// `extend` calls per second while holding (renewal batches).
    pub extend_calls_per_s: f64,
    /// Holds renewed per second.
    pub holds_renewed_per_s: f64,
    /// Store commands per second while holding (see `commands_what`), background-corrected.
    pub store_cmds_per_s: Option<f64>,
    /// Lease keep-alives the store served per second while holding (see `keepalives_what`;
    /// etcd only). Not background-corrected: the bench's own floor and probe send none.
    pub store_keepalives_per_s: Option<f64>,
    /// Holds lost during the window (renewal not keeping up).
    pub lost: usize,
}

/// S1: many locks held by one client.
#[derive(Debug, Clone, Serialize)]
pub struct S1 {
    /// Lease of the holds, ms.
    pub lease_ms: u64,
    /// Levels measured.
    pub levels: Vec<S1Level>,
    /// Whether holding the names opened no connection, at every level.
    pub conns_constant: bool,
}

/// S1.
pub async fn s1(
    t: &Target,
    plan: &Plan,
    run: &str,
    probe: &Probe,
    background: f64,
) -> Result<S1, String> {
    let lease = Duration::from_millis(plan.s1_lease_ms);
    let mut levels = Vec::new();
    for &k in &plan.s1_levels {
        let (client, counts) =
            super::store::limit("connect", Duration::from_secs(30), counted_client(t, lease))
                .await?;
        // 64 locks used at once, each holder also listing the names (a read that no store
        // batches), so every connection the client keeps (a pool at its size) is open before
        // counting.
        let mut warm = tokio::task::JoinSet::new();
        let warm_prefix = format!("dlockbench/{run}/s1/warm{k}/");
        for i in 0..64 {
            let m = client
                .mutex(format!("{warm_prefix}{i}"))
                .map_err(|e| e.to_string())?;
            let (client, prefix) = (client.clone(), warm_prefix.clone());
            warm.spawn(async move {
                let g = m.acquire_timeout(Duration::from_secs(10)).await?;
                client.list(&prefix).await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                g.release().await
            });
        }
        while let Some(r) = warm.join_next().await {
            r.map_err(|e| e.to_string())?
                .map_err(|e| format!("S1 warm-up: {e}"))?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let conns_before = connections(t, probe);
        let mem0 = probe.memory().await?;
        let rss0 = rss_bytes();
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(plan.s1_acquire_secs);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let guards = Arc::new(std::sync::Mutex::new(Vec::with_capacity(k)));
        let first_err = Arc::new(std::sync::Mutex::new(None::<String>));
        let mut js = tokio::task::JoinSet::new();
        for _ in 0..64.min(k) {
            let (client, next, guards, first_err) = (
                client.clone(),
                next.clone(),
                guards.clone(),
                first_err.clone(),
            );
            let prefix = format!("dlockbench/{run}/s1/{k}/");
            js.spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= k || Instant::now() >= deadline {
                        break;
                    }
                    let m = match client.mutex(format!("{prefix}{i}")) {
                        Ok(m) => m,
                        Err(e) => {
                            first_err
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e.to_string());
                            break;
                        }
                    };
                    let left = deadline.saturating_duration_since(Instant::now());
                    match m.acquire_timeout(left.min(Duration::from_secs(15))).await {
                        Ok(g) => guards.lock().unwrap_or_else(|p| p.into_inner()).push(g),
                        Err(e) => {
                            first_err
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e.to_string());
                            break;
                        }
                    }
                }
            });
        }
        while js.join_next().await.is_some() {}
        let acquire_s = started.elapsed().as_secs_f64();
        let held = guards.lock().unwrap_or_else(|p| p.into_inner()).len();
        if held == 0 {
            let e = first_err.lock().unwrap_or_else(|p| p.into_inner()).clone();
            return Err(format!("S1: no hold acquired ({})", e.unwrap_or_default()));
        }
        let rss1 = rss_bytes();
        let mem1 = probe.memory().await?;
        let conns_after = connections(t, probe);
        // Renewal traffic over the window.
        let s0 = counts.snap();
        let c0 = probe.commands().await.ok().flatten();
        let k0 = probe.keepalives().await.ok().flatten();
        let w0 = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(plan.s1_window_secs)).await;
        let s1 = counts.snap();
        let c1 = probe.commands().await.ok().flatten();
        let k1 = probe.keepalives().await.ok().flatten();
        let win = w0.elapsed().as_secs_f64();
        let lost = guards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|g| !g.is_held())
            .count();
        let store_cmds_per_s = match (c0, c1) {
            (Some(a), Some(b)) => Some(((b - a) / win - background).max(0.0)),
            _ => None,
        };
        // Release everything (bounded), then the client goes.
        let all: Vec<dlock::Guard> =
            std::mem::take(&mut *guards.lock().unwrap_or_else(|p| p.into_inner()));
        let release_deadline = Duration::from_secs_f64(plan.s1_acquire_secs);
        let chunks: Vec<Vec<dlock::Guard>> = {
            let mut v: Vec<Vec<dlock::Guard>> = (0..64).map(|_| Vec::new()).collect();
            for (i, g) in all.into_iter().enumerate() {
                v[i % 64].push(g);
            }
            v
        };
        let mut js = tokio::task::JoinSet::new();
        for c in chunks {
            js.spawn(async move {
                for g in c {
                    let _ = g.release().await;
                }
            });
        }
        let _ = tokio::time::timeout(release_deadline, async {
            while js.join_next().await.is_some() {}
        })
        .await;
        js.abort_all();
        drop(client);
        levels.push(S1Level {
            names: k,
            held,
            complete: held == k,
            acquire_s,
            client_bytes_per_hold: (rss1 - rss0) / held as f64,
            store_bytes_per_hold: match (mem0, mem1) {
                (Some(a), Some(b)) => Some((b - a) / held as f64),
                _ => None,
            },
            conns_before,
            conns_after,
            extend_calls_per_s: (s1.extend - s0.extend) as f64 / win,
            holds_renewed_per_s: (s1.extended - s0.extended) as f64 / win,
            store_cmds_per_s,
            store_keepalives_per_s: match (k0, k1) {
                (Some(a), Some(b)) => Some((b - a).max(0.0) / win),
                _ => None,
            },
            lost,
        });
        if held < k {
            // A larger level would not finish either.
            break;
        }
    }
    // Holding k names must not open connections: at every level the count while holding is the
    // count before (the client connected, its pool warmed by 64 concurrent holds).
    let conns_constant = levels.iter().all(|l| l.conns_before == l.conns_after);
    Ok(S1 {
        lease_ms: plan.s1_lease_ms,
        levels,
        conns_constant,
    })
}

/// E1: election fail-over. A leader process is SIGKILLed while a standby process campaigns;
/// the time from the kill to the standby's lead, repeated.
#[derive(Debug, Clone, Serialize)]
pub struct E1 {
    /// The term (the election's lease; ZooKeeper: the session timeout, etcd: the lease TTL), ms.
    pub term_ms: u64,
    /// Fail-overs asked for.
    pub repeats: u32,
    /// Each fail-over: SIGKILL of the leader → the standby leads, ms.
    pub failover_ms: Vec<f64>,
    /// Median fail-over, ms.
    pub p50_ms: f64,
    /// Longest fail-over, ms.
    pub max_ms: f64,
    /// Shortest fail-over, ms.
    pub min_ms: f64,
    /// p50 / term.
    pub p50_in_terms: f64,
    /// The term (fencing token) of each leader in order, the first leader's included (`None` on
    /// stores without fencing).
    pub terms: Vec<Option<u64>>,
    /// Whether every new term is greater than the one before (stores with fencing).
    pub terms_increasing: bool,
}

/// One E1 candidate process and its stdout.
struct Candidate {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// Kept open: the candidate leads until it ends.
    _stdin: tokio::process::ChildStdin,
}

impl Candidate {
    /// Starts candidate `i` (a `bench-worker --elect`) and waits until it campaigns.
    async fn start(
        exe: &std::path::Path,
        url: &str,
        name: &str,
        i: u32,
        term_ms: u64,
    ) -> Result<Candidate, String> {
        let mut child = tokio::process::Command::new(exe)
            .arg("bench-worker")
            .args(["--url", url, "--name", name, "--elect"])
            .args(["--lease-ms", &term_ms.to_string()])
            .args(["--proc-index", &i.to_string()])
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start candidate {i}: {e}"))?;
        let stdout = child.stdout.take().ok_or("candidate without stdout")?;
        let stdin = child.stdin.take().ok_or("candidate without stdin")?;
        let mut c = Candidate {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
            _stdin: stdin,
        };
        match c.next(Duration::from_secs(60)).await? {
            Some(w) if w.first().map(String::as_str) == Some("campaigning") => Ok(c),
            other => Err(format!(
                "candidate {i} did not campaign (said {other:?}; see its error above)"
            )),
        }
    }

    /// The next line's words within `limit`; `None` at its end.
    async fn next(&mut self, limit: Duration) -> Result<Option<Vec<String>>, String> {
        match tokio::time::timeout(limit, self.lines.next_line()).await {
            Ok(Ok(l)) => Ok(l.map(|l| l.split_whitespace().map(String::from).collect())),
            Ok(Err(e)) => Err(format!("candidate output: {e}")),
            Err(_) => Err(format!("no word from a candidate within {limit:?}")),
        }
    }

    /// Waits for `leading TERM NS` within `limit`: the term and the time it began (ns).
    async fn leads(&mut self, limit: Duration) -> Result<(Option<u64>, i64), String> {
        match self.next(limit).await? {
            Some(w) if w.len() == 3 && w[0] == "leading" => {
                let ns = w[2]
                    .parse()
                    .map_err(|_| format!("bad candidate line {w:?}"))?;
                Ok((w[1].parse().ok(), ns))
            }
            other => Err(format!("a candidate said {other:?}, not that it leads")),
        }
    }
}

/// E1: `plan.e1_repeats` fail-overs between candidate processes on one election.
pub async fn e1(t: &Target, plan: &Plan, run: &str) -> Result<E1, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the dlock binary: {e}"))?;
    let term = Duration::from_millis(plan.e1_term_ms);
    // ZooKeeper's session timeout and etcd's lease TTL are the term there, as `dlock elect` asks.
    let url = crate::take::url_for(&t.url, term);
    let name = format!("dlockbench/{run}/e1");
    // A dead leader is followed once its lease runs out: the term, and slack for a busy machine.
    let limit = term * 3 + Duration::from_secs(30);
    let mut leader = Candidate::start(&exe, &url, &name, 0, plan.e1_term_ms).await?;
    let (first, _) = leader.leads(limit).await?;
    let mut terms = vec![first];
    let mut failover_ms = Vec::new();
    for i in 1..=plan.e1_repeats {
        let mut standby = Candidate::start(&exe, &url, &name, i, plan.e1_term_ms).await?;
        // Let its first attempt reach the store (it is waiting when the leader dies), then a
        // random part of a term more, so the kill falls anywhere between two renewals of the
        // leader's lease, not always just after its grant. A word from the standby now would be
        // a second leader.
        let settle = Duration::from_millis(
            300 + rand::Rng::gen_range(&mut rand::thread_rng(), 0..plan.e1_term_ms.max(1)),
        );
        match standby.next(settle).await {
            Err(_) => {}
            Ok(w) => return Err(format!("the standby spoke while the leader lived: {w:?}")),
        }
        let killed = now_ns();
        leader
            .child
            .start_kill()
            .map_err(|e| format!("cannot SIGKILL the leader: {e}"))?;
        let (term_no, led) = standby.leads(limit).await?;
        failover_ms.push((led - killed) as f64 / 1e6);
        terms.push(term_no);
        let _ = tokio::time::timeout(Duration::from_secs(10), leader.child.wait()).await;
        leader = standby;
    }
    // The last leader resigns when its stdin closes.
    let Candidate {
        mut child,
        lines,
        _stdin: stdin,
    } = leader;
    drop(stdin);
    drop(lines);
    if tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    let fenced: Vec<u64> = terms.iter().flatten().copied().collect();
    // Percentiles of milliseconds (Lat names its fields in µs).
    let l = Lat::of(&failover_ms);
    let min_ms = failover_ms.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(E1 {
        term_ms: plan.e1_term_ms,
        repeats: plan.e1_repeats,
        p50_ms: l.p50_us,
        max_ms: l.max_us,
        min_ms: if min_ms.is_finite() { min_ms } else { 0.0 },
        p50_in_terms: l.p50_us / plan.e1_term_ms.max(1) as f64,
        terms_increasing: fenced.len() == terms.len() && fenced.windows(2).all(|w| w[0] < w[1]),
        terms,
        failover_ms,
    })
}

/// One T1 run: 64 waiters, each `rounds` acquire/hold/release rounds of random keys.
#[derive(Debug, Clone, Serialize)]
pub struct T1Run {
    /// Stripes of the lock: 0 for the one name.
    pub stripes: u32,
    /// Acquisitions asked for: waiters × rounds.
    pub planned: usize,
    /// Acquisitions made.
    pub acquisitions: usize,
    /// Whether all were made within the time limit.
    pub complete: bool,
    /// From the start to the last release, s.
    pub span_s: f64,
    /// Acquisitions per second over the span.
    pub acq_per_s: f64,
    /// Per-acquisition wait (request to grant).
    pub wait: Lat,
    /// Distinct lock names taken.
    pub names_used: usize,
    /// Grants of a name while its previous holder had not started releasing (must be 0).
    pub overlaps: usize,
    /// Store commands per acquisition (see `commands_what`), background-corrected.
    pub store_cmds_per_acq: Option<f64>,
    /// dlock backend calls per acquisition.
    pub client_ops_per_acq: Option<f64>,
    /// Errors reported by workers.
    pub errors: u64,
    /// The first of them.
    pub first_error: Option<String>,
}

/// T1: one name against `striped(base, stripes)`, the same waiters and rounds.
#[derive(Debug, Clone, Serialize)]
pub struct T1 {
    /// Waiters (tasks over the worker processes).
    pub waiters: u32,
    /// Worker processes.
    pub procs: u32,
    /// Rounds per waiter.
    pub rounds: u64,
    /// Hold inside the lock, ms.
    pub hold_ms: u64,
    /// Keys drawn from at random.
    pub keys: u32,
    /// (a) every waiter on one name.
    pub one_name: T1Run,
    /// (b) each round on the stripe of a random key.
    pub striped: T1Run,
    /// striped acq/s ÷ one-name acq/s.
    pub ratio: f64,
}

/// One T1 run over worker processes (`stripes` 0: the one name).
async fn t1_run(
    t: &Target,
    plan: &Plan,
    name: &str,
    stripes: u32,
    probe: &Probe,
    background: f64,
) -> Result<T1Run, String> {
    let args: Vec<String> = [
        ("--hold-us", plan.t1_hold_ms * 1000),
        ("--max-per-task", plan.t1_rounds),
        ("--stripes", u64::from(stripes)),
        ("--keys", u64::from(plan.t1_keys)),
    ]
    .iter()
    .flat_map(|(k, v)| [k.to_string(), v.to_string()])
    .collect();
    let c = run_workers(
        t,
        Lib::Dlock,
        None,
        name,
        plan.t1_waiters,
        plan.procs,
        &args,
        plan.t1_limit_secs,
        probe,
    )
    .await?;
    let n = c.recs.len();
    let planned = plan.t1_waiters as usize * plan.t1_rounds as usize;
    // Group by lock name (the stripe; one group for the one name), each in grant order.
    let mut by_name = std::collections::HashMap::<u32, Vec<Rec>>::new();
    for (i, r) in c.recs.iter().enumerate() {
        let s = if stripes > 0 {
            c.stripes.get(i).copied().unwrap_or(u32::MAX)
        } else {
            0
        };
        by_name.entry(s).or_default().push(*r);
    }
    let mut overlaps = 0;
    for recs in by_name.values_mut() {
        recs.sort_by_key(|r| r[3]);
        overlaps += recs.windows(2).filter(|w| w[1][3] < w[0][4]).count();
    }
    let last = c.recs.iter().map(|r| r[5]).max().unwrap_or(c.start_ns);
    let span_s = ((last - c.start_ns) as f64 / 1e9).max(1e-9);
    let waits: Vec<f64> = c.recs.iter().map(|r| (r[3] - r[2]) as f64 / 1e3).collect();
    Ok(T1Run {
        stripes,
        planned,
        acquisitions: n,
        complete: n >= planned,
        span_s,
        acq_per_s: n as f64 / span_s,
        wait: Lat::of(&waits),
        names_used: by_name.len(),
        overlaps,
        store_cmds_per_acq: cmds_per_acq(&c, background, n),
        client_ops_per_acq: (n > 0).then(|| c.ops.store_calls() as f64 / n as f64),
        errors: c.errors,
        first_error: c.first_error,
    })
}

/// T1: (a) one name, (b) `striped(base, plan.t1_stripes)`, 64 waiters each doing
/// `plan.t1_rounds` rounds.
pub async fn t1(
    t: &Target,
    plan: &Plan,
    run: &str,
    probe: &Probe,
    background: f64,
) -> Result<T1, String> {
    let base = format!("dlockbench/{run}/t1");
    let one_name = t1_run(t, plan, &format!("{base}/one"), 0, probe, background).await?;
    let striped = t1_run(
        t,
        plan,
        &format!("{base}/striped"),
        plan.t1_stripes,
        probe,
        background,
    )
    .await?;
    Ok(T1 {
        waiters: plan.t1_waiters,
        procs: plan.procs.min(plan.t1_waiters).max(1),
        rounds: plan.t1_rounds,
        hold_ms: plan.t1_hold_ms,
        keys: plan.t1_keys,
        ratio: striped.acq_per_s / one_name.acq_per_s.max(1e-9),
        one_name,
        striped,
    })
}
