//! One scenario: start the fenced resource and the client processes, inject a fault a few
//! times, stop everything, analyse, judge.

use crate::analysis::{analyze, FaultRecord, Figures, RunData};
use crate::event::{now_us, Event};
use crate::resource::{Mode, Resource};
use crate::stores::{Backend, ClientProxies, MasterTarget, StoreEnv};
use nix::sys::signal::Signal;
use serde::Serialize;
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// A fault the harness injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL the holder.
    Kill,
    /// SIGKILL the holder's `dlock run` process while its command works (the workers take each
    /// hold with `dlock run`; the command's work outlasts the lease).
    RunKill,
    /// SIGSTOP the holder between its read and its write for longer than the lease, then SIGCONT.
    Pause,
    /// Crash and restart the store (the ZooKeeper or etcd leader).
    Restart,
    /// Kill every client connection at the store (`CLIENT KILL`, `pg_terminate_backend`, `KILL`;
    /// etcd: a reset of every client's connections at its proxies).
    ConnKill,
    /// Delay the holder's store traffic through its proxy by a quarter of the lease.
    Delay,
    /// Black-hole the holder's store traffic for two leases.
    BlackHole,
    /// etcd: SIGSTOP the leader for two leases, then SIGCONT.
    MemberPause,
    /// Redlock: stop 2 of the 5 servers for three leases.
    Redlock2Down,
    /// Redlock: stop 3 of the 5 servers for two leases.
    Redlock3Down,
    /// Redis Sentinel / Cluster: SIGKILL the master (the Sentinel master, or the master of the
    /// lock's slot) while a hold is live, wait for the fail-over, start the node again and wait
    /// until it is a replica.
    MasterKill,
    /// Redis Sentinel / Cluster: SIGSTOP the master (black-holed: its sockets stay open) until
    /// the fail-over is over, then SIGCONT it and wait until it has been demoted to a replica.
    MasterPause,
    /// Redis Cluster: migrate the lock's slot and its keys to another master while it is held.
    SlotMigrate,
    /// SIGSTOP the store process for two leases, then SIGCONT: Redis, PostgreSQL (the server and
    /// every backend process), MariaDB, and ZooKeeper's leader (etcd's is `MemberPause`).
    StorePause,
    /// Step the holder's wall clock (libfaketime, the monotonic clocks left true): forward by ten
    /// leases, or back by an hour, in turn.
    ClockStep,
    /// Fill the file system of the SQLite file (a tmpfs of its own) for two leases, then free it.
    DiskFull,
    /// Leader election: the workers campaign for the name (each term one hold, the term its
    /// token); SIGKILL the leader.
    ElectKill,
    /// Leader election: SIGSTOP the leader between its read and its write for longer than the
    /// term, then SIGCONT (its late write carries the old term).
    ElectPause,
    /// Fair mode: the workers take a fair (FIFO) mutex, so they wait in the name's queue (and
    /// on MySQL/MariaDB for its bell); SIGKILL the holder.
    FairKill,
    /// Fair mode: kill every client connection at the store (on MySQL/MariaDB the waiters'
    /// bell connections too) while fair waiters queue.
    FairConnKill,
}

impl Fault {
    /// The name used in tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::RunKill => "run-kill",
            Fault::Pause => "pause",
            Fault::Restart => "restart",
            Fault::ConnKill => "conn-kill",
            Fault::Delay => "delay",
            Fault::BlackHole => "black-hole",
            Fault::MemberPause => "member-pause",
            Fault::Redlock2Down => "2-of-5-down",
            Fault::Redlock3Down => "3-of-5-down",
            Fault::MasterKill => "master-kill",
            Fault::MasterPause => "master-pause",
            Fault::SlotMigrate => "slot-migrate",
            Fault::StorePause => "store-pause",
            Fault::ClockStep => "clock-step",
            Fault::DiskFull => "disk-full",
            Fault::ElectKill => "elect-kill",
            Fault::ElectPause => "elect-pause",
            Fault::FairKill => "fair-kill",
            Fault::FairConnKill => "fair-conn-kill",
        }
    }

    /// A fault of the leader-election scenario (the workers campaign).
    pub fn election(self) -> bool {
        matches!(self, Fault::ElectKill | Fault::ElectPause)
    }

    /// A fault of the fair-mode scenarios (the workers take a fair mutex).
    pub fn fair(self) -> bool {
        matches!(self, Fault::FairKill | Fault::FairConnKill)
    }

    /// The fault this one injects: the election's are the lock's kill and pause, the fair
    /// mode's the kill and the connection kill.
    pub fn base(self) -> Fault {
        match self {
            Fault::ElectKill | Fault::FairKill => Fault::Kill,
            Fault::ElectPause => Fault::Pause,
            Fault::FairConnKill => Fault::ConnKill,
            f => f,
        }
    }

    /// Only in the full run: CI's bounded run keeps its length.
    pub fn full_only(self) -> bool {
        matches!(
            self,
            Fault::ElectPause | Fault::StorePause | Fault::ClockStep | Fault::DiskFull
        )
    }

    /// A fault of the store itself, which every lane of the scenario sees: lane 0 injects it.
    /// The others (a client process, its traffic or its clock) are injected by every lane on
    /// its own holder; etcd's conn-kill resets each lane's own proxies.
    pub fn store_wide(self, b: Backend) -> bool {
        match self.base() {
            Fault::Kill
            | Fault::RunKill
            | Fault::Pause
            | Fault::Delay
            | Fault::BlackHole
            | Fault::ClockStep => false,
            Fault::ConnKill => b != Backend::Etcd,
            _ => true,
        }
    }

    /// A fault of a Redis Sentinel or Cluster deployment (its figures include the fail-over).
    pub fn failover(self) -> bool {
        matches!(
            self,
            Fault::MasterKill | Fault::MasterPause | Fault::SlotMigrate
        )
    }
}

/// The scenarios of a backend: every fault that applies to it, and the paused holder in both
/// resource modes. `quick` (CI's bounded run) leaves out the Redis fail-over deployments but for
/// one scenario of each that confirms with `WAIT` (each fail-over takes 3–15 s there).
pub fn scenarios(b: Backend, quick: bool) -> Vec<(Fault, Mode)> {
    use Fault::*;
    if b.redis_ha() {
        if quick {
            return if b.waits() {
                vec![(MasterKill, Mode::Enforcing)]
            } else {
                vec![]
            };
        }
        // The holder's own faults are the single server's (the same scripts); the holder kill
        // stays, for the wake-ups (Sentinel: pub/sub on the master; Cluster: SPUBLISH).
        let mut v = vec![(Kill, Mode::Enforcing), (MasterKill, Mode::Enforcing)];
        v.push((MasterPause, Mode::Enforcing));
        if b.cluster() {
            v.push((SlotMigrate, Mode::Enforcing));
        }
        v.push((ClockStep, Mode::Enforcing));
        return v;
    }
    if b == Backend::SqliteTmpfs {
        return if quick {
            vec![]
        } else {
            vec![(DiskFull, Mode::Enforcing)]
        };
    }
    // RunKill in log-only mode: an orphaned command's late write would be accepted and show as
    // an overlap, which is what the scenario counts.
    let mut v = vec![
        (Kill, Mode::Enforcing),
        (RunKill, Mode::LogOnly),
        (Pause, Mode::LogOnly),
        (Pause, Mode::Enforcing),
    ];
    let extra: &[Fault] = match b {
        Backend::Sqlite => &[ClockStep],
        Backend::Redis | Backend::Postgres | Backend::Mysql => {
            &[Restart, ConnKill, Delay, BlackHole, StorePause, ClockStep]
        }
        Backend::PostgresSession | Backend::MysqlSession => {
            &[Restart, ConnKill, StorePause, ClockStep]
        }
        Backend::RedisAof => {
            v.clear();
            &[Restart, StorePause]
        }
        Backend::Zookeeper => &[Restart, Delay, BlackHole, StorePause, ClockStep],
        // ZooKeeper's list, and two faults of a cluster member that only etcd runs so far: every
        // client's connections reset at once (etcd has no command that ends client connections,
        // so the harness resets them at the clients' proxies), and the leader paused (SIGSTOP:
        // its sockets stay open and it answers nothing).
        Backend::Etcd => &[Restart, Delay, BlackHole, ConnKill, MemberPause, ClockStep],
        Backend::Redlock => &[Redlock2Down, Redlock3Down, ClockStep],
        Backend::SqliteTmpfs
        | Backend::RedisSentinel
        | Backend::RedisSentinelWait
        | Backend::RedisCluster
        | Backend::RedisClusterWait => &[],
    };
    v.extend(extra.iter().map(|f| (*f, Mode::Enforcing)));
    // Fair mode where it is a choice (ZooKeeper and etcd queue every waiter, so their kill is
    // fair already; Redlock and the session modes have none): a holder killed in front of a
    // queue, and the connections killed under queued waiters.
    let fair: &[Fault] = match b {
        Backend::Redis | Backend::Postgres | Backend::Mysql => &[FairKill, FairConnKill],
        Backend::Sqlite => &[FairKill],
        _ => &[],
    };
    v.extend(fair.iter().map(|f| (*f, Mode::Enforcing)));
    // The election over every store whose holders the harness can kill (not the AOF restart
    // line).
    if b != Backend::RedisAof {
        v.push((ElectKill, Mode::Enforcing));
        v.push((ElectPause, Mode::Enforcing));
    }
    if quick {
        v.retain(|(f, _)| !f.full_only());
    }
    v
}

/// Why the store does not promise the lock's properties through `fault`, if it does not: it
/// loses or ends the holds itself (what every guarantee rests on).
pub fn limitation(b: Backend, f: Fault) -> Option<&'static str> {
    match (b, f) {
        (Backend::Redis, Fault::Restart) => {
            Some("Redis without persistence forgets every hold and the fence on a restart")
        }
        (Backend::Redlock, Fault::Redlock3Down) => {
            Some("a Redlock majority restarted empty forgets the hold")
        }
        // Redis replicates asynchronously: without WAIT the master acknowledges a grant (its
        // fence INCR) or a renewal before any replica has it; and an old master that is back
        // (restarted empty without persistence, or continued after a pause) is a master with
        // its own copy until it is demoted (8-11 s under Sentinel), so clients that reach it
        // there are granted from that copy while others hold on the new master: split brain.
        // WAIT refuses those grants (the old master has no replica left to confirm them).
        (
            Backend::RedisSentinel | Backend::RedisCluster,
            Fault::MasterKill | Fault::MasterPause,
        ) => Some(
            "without WAIT (replicas=0) a grant or renewal can be lost with the master, and an old \
             master that is back (restarted empty, or continued) grants from its own copy until \
             it is demoted: split brain",
        ),
        (Backend::PostgresSession | Backend::MysqlSession, Fault::Restart | Fault::ConnKill) => {
            Some("a session lock ends with its connection, before the holder can be told")
        }
        // A server bug of the etcd the tests run (Debian's 3.4.23): a leader deposed while it
        // was paused still revokes the leases whose renewals it missed when it runs again, and
        // the new leader commits those revocations (etcd-io/etcd#15247, #12528; fixed upstream
        // by #16822, backported to 3.4 and 3.5).
        (Backend::Etcd, Fault::MemberPause) => Some(
            "etcd 3.4.23: a leader deposed while paused revokes live leases when it resumes \
             (etcd-io/etcd#15247)",
        ),
        _ => None,
    }
}

/// How big a run is.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Client processes at a time, per lane (2–8).
    pub workers: u32,
    /// Lease of every hold (and ZooKeeper's session timeout).
    #[serde(with = "ms")]
    pub lease: Duration,
    /// Mean time inside the lock between the read and the write (each hold draws from
    /// 0.5–1.5 times this). Faults aim at a hold granted in the last 30 ms, so they land between
    /// the holder's read and its write.
    #[serde(with = "ms")]
    pub hold: Duration,
    /// The mean hold in store-side fault scenarios (restart, connection kill, delay, black
    /// hole, Redlock servers down): longer than the lease, so the holder must keep renewing
    /// through the fault, and a holder that cannot must see `lost()` before anyone else is
    /// granted.
    #[serde(with = "ms")]
    pub long_hold: Duration,
    /// The share of holds, in percent, that are long (`long_hold`) in the store-side fault
    /// scenarios; the others are `hold`. Below 100, the faults aimed at a holder (delay, black
    /// hole, clock step, `dlock run` kill) pick a hold planned to outlast the lease.
    pub long_share: u32,
    /// Faults injected per scenario.
    pub faults: u32,
    /// Normal operation before each fault.
    #[serde(with = "ms")]
    pub gap: Duration,
    /// Acquisitions per client process at most.
    pub iterations: u64,
    /// Independent lock names per scenario, each with its own resource and client processes
    /// (`workers` each).
    pub lanes: u32,
    /// Faults go on at the same pace after `faults` until the lanes together have made this
    /// many acquisitions (at most 20 times `faults` in all).
    pub min_acquisitions: u64,
    /// Write each scenario's raw record (client events, the resource's reads and writes, the
    /// faults) to `DIR/BACKEND.FAULT.MODE.json`, for looking into a figure.
    #[serde(skip)]
    pub events_dir: Option<PathBuf>,
}

mod ms {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

impl Settings {
    /// The bounded run CI does (about 5 minutes for every backend on 2 cores, of which about 40 s
    /// for the two Redis fail-over deployments that confirm with `WAIT`).
    pub fn quick() -> Settings {
        Settings {
            workers: 4,
            lease: Duration::from_secs(1),
            hold: Duration::from_millis(100),
            long_hold: Duration::from_millis(2000),
            long_share: 100,
            faults: 1,
            gap: Duration::from_millis(800),
            iterations: 2_000,
            lanes: 1,
            min_acquisitions: 0,
            events_dir: None,
        }
    }

    /// The full run documented in docs/RELIABILITY.md.
    pub fn full() -> Settings {
        Settings {
            workers: 6,
            faults: 8,
            gap: Duration::from_millis(1500),
            iterations: 20_000,
            ..Settings::quick()
        }
    }

    /// The longest a killed holder may keep others out: its lease, plus 1 s for the waiters to
    /// notice (wake-up jitter, polling, ZooKeeper's session expiry ticks).
    pub fn takeover_bound(&self) -> Duration {
        self.lease + Duration::from_secs(1)
    }
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Holds.
    Pass,
    /// Must hold and does not.
    Fail,
    /// Does not hold, and the store does not promise it here (documented limitation).
    Documented,
}

/// One judged property of a scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub what: String,
    pub status: Status,
    pub detail: String,
}

/// The result of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub backend: Backend,
    pub fault: Fault,
    pub mode: Mode,
    pub seconds: f64,
    pub figures: Figures,
    pub faults: Vec<FaultRecord>,
    pub checks: Vec<Check>,
    /// Errors of the harness itself (a server that did not restart, a process that did not start).
    pub harness_errors: Vec<String>,
    /// Of a failed scenario: the holds another grant found live and the faults, in time order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<String>,
}

impl Outcome {
    /// `pass`, `documented` (a limitation showed) or `FAIL`.
    pub fn verdict(&self) -> &'static str {
        if !self.harness_errors.is_empty() || self.checks.iter().any(|c| c.status == Status::Fail) {
            "FAIL"
        } else if self.checks.iter().any(|c| c.status == Status::Documented) {
            "documented"
        } else {
            "pass"
        }
    }
}

/// Judges the figures of a scenario against what the backend promises.
pub fn judge(b: Backend, f: Fault, mode: Mode, x: &Figures, s: &Settings) -> Vec<Check> {
    // A leader killed or paused is judged as a holder killed or paused.
    let f = f.base();
    let kept = limitation(b, f).is_none();
    let why_not = limitation(b, f).unwrap_or("Redlock has no fencing token");
    let mut out = Vec::new();
    let mut check = |what: &str, ok: bool, promised: bool, detail: String| {
        out.push(Check {
            what: what.into(),
            status: match (ok, promised) {
                (true, _) => Status::Pass,
                (false, true) => Status::Fail,
                (false, false) => Status::Documented,
            },
            detail,
        })
    };
    check(
        "progress",
        x.acquisitions > 0,
        true,
        format!("{} acquisitions", x.acquisitions),
    );
    // A release answers OK only for the releaser's own hold, so one that meets a newer live hold
    // is a lock bug; but where a Redis fail-over left two masters serving at once (split brain),
    // each release is of its own master's copy and meets the other master's holds.
    let split = !kept && b.redis_ha();
    check(
        "no foreign release",
        x.foreign_releases == 0,
        !split,
        if split {
            format!("{} foreign releases; {why_not}", x.foreign_releases)
        } else {
            format!("{} foreign releases", x.foreign_releases)
        },
    );
    check(
        "tokens never go back",
        x.token_regressions == 0,
        kept,
        format!("{} regressions", x.token_regressions),
    );
    let lost_detail = format!(
        "{} of {} taken-over holds saw lost() first",
        x.lost_first, x.taken_over
    );
    check(
        "lost() before another grant",
        x.lost_first == x.taken_over,
        kept,
        if kept {
            lost_detail
        } else {
            format!("{lost_detail}; {why_not}")
        },
    );
    if mode == Mode::Enforcing {
        let fenced = b.fencing() && kept;
        check(
            "no stale write accepted",
            x.stale_accepted == 0,
            fenced,
            if fenced {
                format!(
                    "{} stale writes, {} rejected",
                    x.stale_writes, x.stale_rejected
                )
            } else {
                format!("{} stale writes accepted; {why_not}", x.stale_accepted)
            },
        );
    }
    if f == Fault::RunKill {
        check(
            "the command died with dlock run",
            x.overlaps == 0 && x.stale_accepted == 0,
            true,
            format!(
                "{} overlaps, {} stale writes accepted",
                x.overlaps, x.stale_accepted
            ),
        );
    }
    // The faults of the store itself end, and the store must serve again after them.
    if matches!(
        f,
        Fault::StorePause | Fault::DiskFull | Fault::ClockStep | Fault::MemberPause
    ) {
        check(
            "grants after the last fault",
            x.grants_after_faults > 0,
            true,
            format!("{} grants after the last fault", x.grants_after_faults),
        );
    }
    if f == Fault::ClockStep {
        check(
            "a wall-clock step loses no hold",
            x.lost == 0,
            true,
            format!("{} holds lost", x.lost),
        );
    }
    if f.failover() {
        check(
            "grants resume after each fault",
            x.outage_missing == 0 && x.outage_ms.len() as u64 == x.failovers,
            true,
            format!(
                "{} of {} faults followed by a grant",
                x.outage_ms.len(),
                x.failovers
            ),
        );
    }
    if matches!(f, Fault::Kill | Fault::RunKill) {
        let bound = s.takeover_bound().as_secs_f64() * 1000.0;
        check(
            "takeover within lease + 1 s",
            x.takeover_missing == 0 && x.takeover_max().is_some_and(|m| m <= bound),
            true,
            format!(
                "max {:.0} ms of {bound:.0} ms, {} kills never taken over",
                x.takeover_max().unwrap_or(f64::NAN),
                x.takeover_missing
            ),
        );
    }
    if f == Fault::Pause {
        match mode {
            Mode::LogOnly => check(
                "the pause shows an overlap (log-only)",
                x.overlaps > 0 && x.stale_accepted > 0,
                true,
                format!(
                    "{} overlaps, {} stale writes accepted",
                    x.overlaps, x.stale_accepted
                ),
            ),
            Mode::Enforcing => check(
                "fencing refuses the paused holder's write",
                x.stale_rejected > 0 && x.stale_accepted == 0,
                b.fencing(),
                format!(
                    "{} stale writes rejected, {} accepted",
                    x.stale_rejected, x.stale_accepted
                ),
            ),
        }
    }
    out
}

type Events = Arc<Mutex<HashMap<u32, Vec<Event>>>>;
/// Per `--via-run` worker: the pid of its current `dlock run`.
type Runs = Arc<Mutex<HashMap<u32, u32>>>;
/// Per worker: its current hold, when it was granted and how long it means to work.
type Holding = Arc<Mutex<HashMap<u32, (u64, i64, Option<u64>)>>>;

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    proxies: Option<ClientProxies>,
}

struct Harness<'a> {
    env: &'a StoreEnv,
    exe: PathBuf,
    name: String,
    resource: std::net::SocketAddr,
    hold: Duration,
    /// Long holds among the others: their mean and their share in percent.
    long: Option<(Duration, u32)>,
    /// Faults aimed at a holder pick a hold planned to outlast the lease.
    aim_long: bool,
    /// Workers write without checking `is_held()` (the paused-holder scenario).
    naive: bool,
    /// Workers take their holds with this `dlock` binary (`dlock run`).
    via_run: Option<PathBuf>,
    /// Workers take each hold as a term of the election of the name.
    election: bool,
    /// Workers take a fair mutex.
    fair: bool,
    runs: Runs,
    settings: &'a Settings,
    events: Events,
    holding: Holding,
    workers: HashMap<u32, Worker>,
    next_index: u32,
    /// The clock-step scenario: each worker's libfaketime offset file is `DIR/clock-INDEX`.
    clocks: Option<Clocks>,
    /// Grants reported by the workers of every lane.
    grants: Arc<AtomicU64>,
}

/// The wall clocks of the clock-step scenario's workers (libfaketime, the monotonic clocks left
/// true) and how many steps were made.
struct Clocks {
    dir: tempfile::TempDir,
    lib: PathBuf,
    steps: u32,
}

impl Clocks {
    fn new() -> io::Result<Clocks> {
        Ok(Clocks {
            dir: tempfile::Builder::new()
                .prefix("dlock-chaos-clock-")
                .tempdir()?,
            lib: libfaketime()?,
            steps: 0,
        })
    }

    fn file(&self, worker: u32) -> PathBuf {
        self.dir.path().join(format!("clock-{worker}"))
    }
}

/// The multi-threaded libfaketime preload library (Debian's package `libfaketime`).
fn libfaketime() -> io::Result<PathBuf> {
    let found = ["/usr/lib", "/usr/local/lib", "/usr/lib64"]
        .iter()
        .flat_map(|root| {
            let direct = std::path::Path::new(root).join("faketime");
            let multiarch = std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("faketime"));
            std::iter::once(direct).chain(multiarch).collect::<Vec<_>>()
        })
        .map(|d| d.join("libfaketimeMT.so.1"))
        .find(|p| p.is_file());
    found.ok_or_else(|| {
        io::Error::other("libfaketimeMT.so.1 not found (Debian: apt-get install faketime)")
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Harness<'_> {
    async fn spawn_worker(&mut self) -> io::Result<u32> {
        let index = self.next_index;
        self.next_index += 1;
        let endpoints = self.env.endpoints();
        let proxies = if endpoints.is_empty() {
            None
        } else {
            Some(ClientProxies::start(&endpoints).await?)
        };
        let url = self
            .env
            .url(&proxies.as_ref().map(|p| p.addrs()).unwrap_or_default());
        let mut cmd = Command::new(&self.exe);
        if let Some(c) = &self.clocks {
            let file = c.file(index);
            std::fs::write(&file, "+0")?;
            // Only the wall clock is faked; the offset is read from the file at every call.
            cmd.env("LD_PRELOAD", &c.lib)
                .env("FAKETIME_TIMESTAMP_FILE", &file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = cmd
            .arg("worker")
            .args(["--url", &url, "--name", &self.name])
            .args(["--resource", &self.resource.to_string()])
            .args(["--index", &index.to_string()])
            .args(["--hold-ms", &self.hold.as_millis().to_string()])
            .args(self.long.iter().flat_map(|(mean, pct)| {
                [
                    "--long-ms".to_string(),
                    mean.as_millis().to_string(),
                    "--long-pct".to_string(),
                    pct.to_string(),
                ]
            }))
            .args(["--lease-ms", &self.settings.lease.as_millis().to_string()])
            .args(["--iterations", &self.settings.iterations.to_string()])
            .args(["--run-ms", "14400000"])
            .args(self.naive.then_some("--naive"))
            .args(self.election.then_some("--election"))
            .args(self.fair.then_some("--fair"))
            .args(
                self.via_run
                    .iter()
                    .flat_map(|d| [std::ffi::OsStr::new("--via-run"), d.as_os_str()]),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?;
        let stdin = child.stdin.take();
        let (events, holding, runs, grants) = (
            self.events.clone(),
            self.holding.clone(),
            self.runs.clone(),
            self.grants.clone(),
        );
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(ev) = serde_json::from_str::<Event>(&line) else {
                    continue;
                };
                match &ev {
                    Event::Granted {
                        hold,
                        at,
                        planned_ms,
                        ..
                    } => {
                        lock(&holding).insert(index, (*hold, *at, *planned_ms));
                        grants.fetch_add(1, Ordering::Relaxed);
                    }
                    Event::Run { pid, .. } => {
                        lock(&runs).insert(index, *pid);
                    }
                    Event::Lost { hold, .. } | Event::Released { hold, .. } => {
                        let mut h = lock(&holding);
                        if h.get(&index).is_some_and(|(k, _, _)| k == hold) {
                            h.remove(&index);
                        }
                    }
                    _ => {}
                }
                lock(&events).entry(index).or_default().push(ev);
            }
        });
        self.workers.insert(
            index,
            Worker {
                child,
                stdin,
                proxies,
            },
        );
        Ok(index)
    }

    fn ready(&self) -> usize {
        lock(&self.events)
            .values()
            .filter(|v| v.iter().any(|e| matches!(e, Event::Ready { .. })))
            .count()
    }

    /// A worker granted the lock in the last 30 ms, so still before its write (waits up to 5 s
    /// for one); with `aim_long`, one whose hold is planned to outlast the lease (waits up to
    /// 30 s: only some holds are long).
    async fn holder(&self) -> Option<u32> {
        let lease = self.settings.lease.as_millis() as u64;
        let tries = if self.aim_long { 15_000 } else { 2500 };
        for _ in 0..tries {
            let now = now_us();
            let fresh = lock(&self.holding)
                .iter()
                .find(|(_, (_, at, planned))| {
                    now - at < 30_000 && (!self.aim_long || planned.is_some_and(|p| p > lease))
                })
                .map(|(w, _)| *w);
            if fresh.is_some() {
                return fresh;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        None
    }

    /// The Redis base key of the lock (the default prefix; the name is the hash tag): every key
    /// and the release channel of the lock are in this key's cluster slot.
    fn base_key(&self) -> String {
        format!("dlock:{{{}}}", self.name)
    }

    fn pid(&self, w: u32) -> Option<u32> {
        self.workers.get(&w).and_then(|x| x.child.id())
    }

    async fn inject(&mut self, fault: Fault) -> io::Result<FaultRecord> {
        let lease = self.settings.lease;
        // The master to break, found before the holder (asking takes a moment).
        let target: Option<MasterTarget> =
            if matches!(fault, Fault::MasterKill | Fault::MasterPause) {
                let (env, key, tag): (&StoreEnv, _, _) =
                    (self.env, self.base_key(), self.name.clone());
                Some(tokio::task::block_in_place(|| env.master_of(&key, &tag))?)
            } else {
                None
            };
        let holder = self.holder().await;
        let rec =
            |kind: Fault, worker: Option<u32>, at: i64, until: Option<i64>, detail: String| {
                FaultRecord {
                    // The analysis knows a killed or paused leader as a killed or paused holder.
                    kind: kind.base().label().into(),
                    worker,
                    at,
                    until,
                    detail,
                }
            };
        let need = |h: Option<u32>| {
            h.ok_or_else(|| {
                io::Error::other(if self.aim_long {
                    "no hold planned to outlast the lease began in 30 s"
                } else {
                    "nobody held the lock for 5 s"
                })
            })
        };
        Ok(match fault.base() {
            Fault::Kill => {
                let w = need(holder)?;
                let pid = self.pid(w).ok_or_else(|| io::Error::other("worker gone"))?;
                let at = now_us();
                dlock_testkit::signal(pid, Signal::SIGKILL)?;
                if let Some(mut x) = self.workers.remove(&w) {
                    let _ = x.child.wait().await;
                }
                lock(&self.holding).remove(&w);
                self.spawn_worker().await?;
                rec(fault, Some(w), at, None, format!("SIGKILL pid {pid}"))
            }
            Fault::RunKill => {
                let w = need(holder)?;
                let pid = lock(&self.runs)
                    .get(&w)
                    .copied()
                    .ok_or_else(|| io::Error::other("no dlock run of the holder"))?;
                let at = now_us();
                dlock_testkit::signal(pid, Signal::SIGKILL)?;
                lock(&self.holding).remove(&w);
                rec(
                    fault,
                    Some(w),
                    at,
                    None,
                    format!("SIGKILL dlock run pid {pid}"),
                )
            }
            Fault::Pause => {
                let w = need(holder)?;
                let pid = self.pid(w).ok_or_else(|| io::Error::other("worker gone"))?;
                let at = now_us();
                dlock_testkit::signal(pid, Signal::SIGSTOP)?;
                let pause = lease * 3 / 2 + Duration::from_millis(300);
                tokio::time::sleep(pause).await;
                dlock_testkit::signal(pid, Signal::SIGCONT)?;
                rec(
                    fault,
                    Some(w),
                    at,
                    Some(now_us()),
                    format!("SIGSTOP {pause:?}, SIGCONT"),
                )
            }
            Fault::Restart => {
                let down = if matches!(self.env.backend, Backend::Zookeeper | Backend::Etcd) {
                    Duration::from_secs(2)
                } else {
                    Duration::from_millis(300)
                };
                let at = now_us();
                let env: &StoreEnv = self.env;
                let detail = tokio::task::block_in_place(|| env.restart(down))?;
                rec(fault, holder, at, Some(now_us()), detail)
            }
            Fault::ConnKill => {
                let at = now_us();
                let n = if self.env.backend == Backend::Etcd {
                    self.workers
                        .values()
                        .filter_map(|x| x.proxies.as_ref())
                        .map(ClientProxies::reset)
                        .sum()
                } else {
                    let env: &StoreEnv = self.env;
                    tokio::task::block_in_place(|| env.kill_connections())?
                };
                rec(fault, holder, at, None, format!("{n} connections killed"))
            }
            Fault::Delay | Fault::BlackHole => {
                let w = need(holder)?;
                let p = self
                    .workers
                    .get(&w)
                    .and_then(|x| x.proxies.as_ref())
                    .ok_or_else(|| io::Error::other("no proxy"))?;
                let at = now_us();
                let (detail, dur) = if fault == Fault::Delay {
                    p.set_delay(lease / 4);
                    (format!("+{:?} each way", lease / 4), lease * 3)
                } else {
                    p.black_hole(true);
                    ("traffic dropped".to_string(), lease * 2)
                };
                tokio::time::sleep(dur).await;
                if let Some(p) = self.workers.get(&w).and_then(|x| x.proxies.as_ref()) {
                    p.set_delay(Duration::ZERO);
                    p.black_hole(false);
                }
                rec(
                    fault,
                    Some(w),
                    at,
                    Some(now_us()),
                    format!("{detail} for {dur:?}"),
                )
            }
            Fault::MemberPause | Fault::StorePause | Fault::DiskFull => {
                let at = now_us();
                let env: &StoreEnv = self.env;
                let detail = tokio::task::block_in_place(|| match fault {
                    Fault::MemberPause => env.pause_leader(lease * 2),
                    Fault::StorePause => env.pause_store(lease * 2),
                    _ => env.fill_disk(lease * 2),
                })?;
                rec(fault, holder, at, Some(now_us()), detail)
            }
            Fault::ClockStep => {
                let w = need(holder)?;
                let c = self
                    .clocks
                    .as_mut()
                    .ok_or_else(|| io::Error::other("the workers' clocks are not faked"))?;
                // Forward past the lease, then back by an hour, in turn (each from the true time).
                let step = if c.steps % 2 == 0 {
                    format!("+{}s", (lease * 10).as_secs().max(1))
                } else {
                    "-1h".to_string()
                };
                c.steps += 1;
                let at = now_us();
                std::fs::write(c.file(w), &step)?;
                rec(fault, Some(w), at, None, format!("wall clock {step}"))
            }
            Fault::Redlock2Down | Fault::Redlock3Down => {
                let (n, down) = if fault == Fault::Redlock2Down {
                    (2, lease * 3)
                } else {
                    (3, lease * 2)
                };
                let at = now_us();
                let env: &StoreEnv = self.env;
                let detail = tokio::task::block_in_place(|| env.redlock_down(n, down))?;
                rec(fault, holder, at, Some(now_us()), detail)
            }
            Fault::MasterKill | Fault::MasterPause => {
                let m = target.ok_or_else(|| io::Error::other("no master to break"))?;
                let env: &StoreEnv = self.env;
                let at = now_us();
                let (detail, until) = tokio::task::block_in_place(|| {
                    if fault == Fault::MasterKill {
                        env.master_kill(&m)
                    } else {
                        env.master_pause(&m)
                    }
                })?;
                rec(fault, holder, at, Some(until), detail)
            }
            Fault::SlotMigrate => {
                let (env, key): (&StoreEnv, _) = (self.env, self.base_key());
                let at = now_us();
                let (detail, until) = tokio::task::block_in_place(|| env.migrate_slot(&key))?;
                rec(fault, holder, at, Some(until), detail)
            }
            Fault::ElectKill | Fault::ElectPause | Fault::FairKill | Fault::FairConnKill => {
                return Err(io::Error::other(
                    "an election or fair-mode fault is injected as its base fault",
                ))
            }
        })
    }

    /// Closes every worker's stdin (they finish their iteration and exit), waits up to `within`,
    /// then kills what is left.
    async fn finish(&mut self, within: Duration) {
        for w in self.workers.values_mut() {
            w.stdin.take();
        }
        let deadline = tokio::time::Instant::now() + within;
        for w in self.workers.values_mut() {
            if tokio::time::timeout_at(deadline, w.child.wait())
                .await
                .is_err()
            {
                let _ = w.child.start_kill();
                let _ = w.child.wait().await;
            }
        }
    }
}

/// The `dlock` binary built beside this one (`cargo build --workspace` builds both).
fn dlock_bin(exe: &std::path::Path) -> PathBuf {
    exe.with_file_name("dlock")
}

/// The raw record of one lane (see [`Settings::events_dir`]).
fn record(data: &RunData) -> serde_json::Value {
    let mut events: Vec<(&u32, &Vec<Event>)> = data.events.iter().collect();
    events.sort_by_key(|(w, _)| **w);
    serde_json::json!({
        "events": events,
        "reads": data.reads,
        "writes": data.writes,
        "faults": data.faults,
        "final_value": data.final_value,
        "end": data.end,
    })
}

/// Writes the raw record of a scenario to `dir`: one lane's record, or `{"lanes": [...]}`.
fn write_record(
    dir: &std::path::Path,
    b: Backend,
    f: Fault,
    mode: Mode,
    lanes: &[RunData],
) -> io::Result<()> {
    let record = match lanes {
        [one] => record(one),
        _ => serde_json::json!({ "lanes": lanes.iter().map(record).collect::<Vec<_>>() }),
    };
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.{}.{mode}.json", b.label(), f.label()));
    std::fs::write(path, serde_json::to_vec(&record)?)
}

/// The lock names of a scenario's lanes. On a Redis Cluster every name hashes to lane 0's slot,
/// so that a fault of that slot's master (or its migration) reaches every lane.
fn lane_names(b: Backend, fault: Fault, mode: Mode, lanes: u32) -> Vec<String> {
    let first = format!(
        "chaos/{}/{}/{}",
        fault.label(),
        mode,
        uuid::Uuid::new_v4().simple()
    );
    let slot = crate::stores::cluster_slot(&first);
    let mut names = vec![first.clone()];
    for lane in 1..lanes {
        let name = (0u32..)
            .map(|i| format!("{first}/{lane}-{i}"))
            .find(|n| !b.cluster() || crate::stores::cluster_slot(n) == slot)
            .unwrap_or_else(|| format!("{first}/{lane}"));
        names.push(name);
    }
    names
}

fn setup_failure(env: &StoreEnv, fault: Fault, mode: Mode, error: String) -> Outcome {
    Outcome {
        backend: env.backend,
        fault,
        mode,
        seconds: 0.0,
        figures: Figures::default(),
        faults: Vec::new(),
        checks: vec![],
        harness_errors: vec![error],
        timeline: Vec::new(),
    }
}

/// Runs one scenario on a started store.
pub async fn run(
    env: &StoreEnv,
    fault: Fault,
    mode: Mode,
    settings: &Settings,
    exe: PathBuf,
) -> Outcome {
    let started = std::time::Instant::now();
    let mut harness_errors = Vec::new();
    let via_run = (fault == Fault::RunKill).then(|| dlock_bin(&exe));
    if let Some(bin) = via_run.as_ref().filter(|b| !b.is_file()) {
        return setup_failure(
            env,
            fault,
            mode,
            format!(
                "{} is missing: this scenario runs `dlock run`; build it beside dlock-chaos \
                 (cargo build --release -p dlock-cli -p dlock-chaos)",
                bin.display()
            ),
        );
    }
    let grants = Arc::new(AtomicU64::new(0));
    // Short holds with a share of long ones (the store-side fault scenarios of a scale run).
    let mixed = settings.long_share < 100 && !matches!(fault.base(), Fault::Kill | Fault::Pause);
    let mut resources = Vec::new();
    let mut lanes = Vec::new();
    for (lane, name) in lane_names(env.backend, fault, mode, settings.lanes.max(1))
        .into_iter()
        .enumerate()
    {
        let resource = match Resource::start(mode).await {
            Ok(r) => r,
            Err(e) => return setup_failure(env, fault, mode, format!("resource: {e}")),
        };
        let mut h = Harness {
            env,
            exe: exe.clone(),
            name,
            resource: resource.addr(),
            hold: match (fault.base(), mixed) {
                (Fault::Kill | Fault::Pause, _) | (_, true) => settings.hold,
                _ => settings.long_hold,
            },
            long: mixed.then_some((settings.long_hold, settings.long_share)),
            aim_long: mixed && !fault.store_wide(env.backend),
            naive: fault.base() == Fault::Pause,
            election: fault.election(),
            fair: fault.fair(),
            via_run: via_run.clone(),
            runs: Arc::default(),
            settings,
            events: Arc::default(),
            holding: Arc::default(),
            workers: HashMap::new(),
            next_index: lane as u32 * 100_000 + 1,
            clocks: None,
            grants: grants.clone(),
        };
        if fault == Fault::ClockStep {
            match Clocks::new() {
                Ok(c) => h.clocks = Some(c),
                Err(e) => harness_errors.push(format!("clock-step: {e}")),
            }
        }
        resources.push(resource);
        lanes.push(h);
    }
    let mut started_workers = 0;
    for h in &mut lanes {
        for _ in 0..settings.workers {
            match h.spawn_worker().await {
                Ok(_) => started_workers += 1,
                Err(e) => harness_errors.push(format!("starting a client process: {e}")),
            }
        }
    }
    // Every process connected (bounded).
    let ready = |lanes: &[Harness]| lanes.iter().map(Harness::ready).sum::<usize>();
    let ready_by = tokio::time::Instant::now() + Duration::from_secs(30);
    while ready(&lanes) < started_workers && tokio::time::Instant::now() < ready_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if ready(&lanes) < started_workers {
        harness_errors.push(format!(
            "only {} of {started_workers} client processes connected within 30 s",
            ready(&lanes),
        ));
    }
    // A fault of the store is injected once (by lane 0) and recorded in every lane; a fault of
    // a client by an eighth of the lanes at once, in turn. After `faults`, the faults go on at
    // the same pace until `min_acquisitions` (bounded).
    let store_wide = fault.store_wide(env.backend);
    let wanted = u64::from(settings.faults);
    let cap = wanted * 20;
    let mut injected = 0u64;
    let mut round = 0usize;
    let mut shared: Vec<FaultRecord> = Vec::new();
    let mut own: Vec<Vec<FaultRecord>> = vec![Vec::new(); lanes.len()];
    while injected < cap
        && (injected < wanted || grants.load(Ordering::Relaxed) < settings.min_acquisitions)
    {
        tokio::time::sleep(settings.gap).await;
        if store_wide {
            injected += 1;
            match lanes[0].inject(fault).await {
                Ok(r) => shared.push(r),
                Err(e) => harness_errors.push(format!("{}: {e}", fault.label())),
            }
            continue;
        }
        // An eighth of the lanes each round (at least one), in turn: the others keep working.
        let per_round = lanes.len().div_ceil(8);
        let n = if injected < wanted {
            ((wanted - injected) as usize).min(per_round)
        } else {
            per_round
        };
        let first = (round * per_round) % lanes.len();
        round += 1;
        injected += n as u64;
        let chosen: Vec<usize> = (0..n).map(|i| (first + i) % lanes.len()).collect();
        let results = futures_util::future::join_all(
            lanes
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| chosen.contains(i))
                .map(|(i, h)| async move { (i, h.inject(fault).await) }),
        )
        .await;
        for (lane, r) in results {
            match r {
                Ok(r) => own[lane].push(r),
                Err(e) if lanes.len() > 1 => {
                    harness_errors.push(format!("{} (lane {lane}): {e}", fault.label()))
                }
                Err(e) => harness_errors.push(format!("{}: {e}", fault.label())),
            }
        }
    }
    // Recovery: normal operation for a while after the last fault (after a killed `dlock run`,
    // longer than its command's work, so that a command that outlived it would be seen writing).
    // After a fault of the store itself, long enough for a hold that began at its end (up to
    // 1.5 long holds) and the next grant: "grants after the last fault" is judged.
    let recovery = match fault {
        Fault::RunKill
        | Fault::StorePause
        | Fault::DiskFull
        | Fault::ClockStep
        | Fault::MemberPause => settings.gap + settings.lease + settings.long_hold * 2,
        _ => settings.gap + settings.lease,
    };
    tokio::time::sleep(recovery).await;
    let within = settings.lease * 3 + Duration::from_secs(5);
    futures_util::future::join_all(lanes.iter_mut().map(|h| h.finish(within))).await;
    let end = now_us();
    let mut figures = Figures::default();
    let mut faults = shared.clone();
    let mut data = Vec::new();
    for (lane, (h, resource)) in lanes.iter().zip(&resources).enumerate() {
        let (final_value, writes, reads) = resource.snapshot();
        let mut lane_faults = std::mem::take(&mut own[lane]);
        faults.extend(lane_faults.iter().cloned());
        lane_faults.extend(shared.iter().cloned());
        lane_faults.sort_by_key(|f| f.at);
        let d = RunData {
            events: std::mem::take(&mut *lock(&h.events)),
            writes,
            reads,
            final_value,
            faults: lane_faults,
            end,
        };
        // The fail-over figures of a store fault count each fault once: lane 0's.
        figures.absorb(analyze(&d), lane == 0 || !store_wide);
        data.push(d);
    }
    faults.sort_by_key(|f| f.at);
    if let Some(dir) = &settings.events_dir {
        if let Err(e) = write_record(dir, env.backend, fault, mode, &data) {
            harness_errors.push(format!("writing the raw record to {}: {e}", dir.display()));
        }
    }
    let checks = judge(env.backend, fault, mode, &figures, settings);
    let timeline = if checks.iter().any(|c| c.status == Status::Fail) {
        // The first lane that fails by itself (or lane 0).
        let failing = data.iter().position(|d| {
            judge(env.backend, fault, mode, &analyze(d), settings)
                .iter()
                .any(|c| c.status == Status::Fail)
        });
        let lane = failing.unwrap_or(0);
        let mut t = crate::analysis::timeline(&data[lane], 40);
        if data.len() > 1 {
            t.insert(0, format!("lane {lane} of {}", data.len()));
        }
        t
    } else {
        Vec::new()
    };
    Outcome {
        backend: env.backend,
        fault,
        mode,
        seconds: started.elapsed().as_secs_f64(),
        figures,
        faults,
        checks,
        harness_errors,
        timeline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(checks: &[Check], what: &str) -> Status {
        checks
            .iter()
            .find(|c| c.what == what)
            .unwrap_or_else(|| panic!("no check {what:?} in {checks:?}"))
            .status
    }

    #[test]
    fn etcd_runs_every_zookeeper_scenario() {
        let etcd = scenarios(Backend::Etcd, false);
        // ZooKeeper's paused leader is etcd's member-pause.
        for s in scenarios(Backend::Zookeeper, false) {
            let s = if s.0 == Fault::StorePause {
                (Fault::MemberPause, s.1)
            } else {
                s
            };
            assert!(etcd.contains(&s), "etcd lacks {s:?}");
        }
        for f in [Fault::ConnKill, Fault::MemberPause] {
            assert!(etcd.contains(&(f, Mode::Enforcing)));
        }
        assert_eq!(limitation(Backend::Etcd, Fault::ConnKill), None);
    }

    #[test]
    fn fair_mode_runs_where_it_is_a_choice_and_is_judged_as_its_base_fault() {
        for b in Backend::ALL {
            let quick = scenarios(b, true);
            let fair_kill = quick.contains(&(Fault::FairKill, Mode::Enforcing));
            let expected = matches!(
                b,
                Backend::Sqlite | Backend::Redis | Backend::Postgres | Backend::Mysql
            );
            assert_eq!(fair_kill, expected, "{b:?}");
            assert_eq!(
                quick.contains(&(Fault::FairConnKill, Mode::Enforcing)),
                expected && b != Backend::Sqlite,
                "{b:?}"
            );
        }
        assert_eq!(Fault::FairKill.base(), Fault::Kill);
        assert_eq!(Fault::FairConnKill.base(), Fault::ConnKill);
        assert!(Fault::FairConnKill.store_wide(Backend::Mysql));
        let slow = Figures {
            takeover_ms: vec![2500.0],
            ..Figures::default()
        };
        let c = judge(
            Backend::Redis,
            Fault::FairKill,
            Mode::Enforcing,
            &slow,
            &Settings::quick(),
        );
        assert_eq!(status(&c, "takeover within lease + 1 s"), Status::Fail);
    }

    #[test]
    fn the_redis_failover_deployments_break_their_masters_and_keep_ci_short() {
        for b in Backend::ALL {
            let full = scenarios(b, false);
            let quick = scenarios(b, true);
            let master = full.contains(&(Fault::MasterKill, Mode::Enforcing))
                && full.contains(&(Fault::MasterPause, Mode::Enforcing));
            assert_eq!(master, b.redis_ha(), "{b:?}");
            assert_eq!(
                full.contains(&(Fault::SlotMigrate, Mode::Enforcing)),
                b.cluster(),
                "{b:?}"
            );
            if b.redis_ha() {
                // At most one quick scenario, and only where WAIT makes a promise to check.
                assert!(quick.len() <= 1 && quick.iter().all(|s| full.contains(s)));
                assert_eq!(quick.is_empty(), !b.waits(), "{b:?}");
            } else {
                // The bounded run leaves out only the full run's own faults.
                let without: Vec<_> = full
                    .iter()
                    .filter(|(f, _)| !f.full_only())
                    .copied()
                    .collect();
                assert_eq!(quick, without, "{b:?}");
                assert!(!full.iter().any(|(f, _)| f.failover()), "{b:?}");
            }
        }
        // Without WAIT a fail-over may lose an acknowledged grant; with it that is a failure,
        // and a slot migration is one everywhere.
        let lost = Figures {
            acquisitions: 10,
            overlaps: 1,
            token_regressions: 1,
            taken_over: 1,
            stale_accepted: 1,
            failovers: 1,
            outage_ms: vec![3000.0],
            ..Figures::default()
        };
        let s = Settings::full();
        for (b, f, want) in [
            (
                Backend::RedisSentinel,
                Fault::MasterKill,
                Status::Documented,
            ),
            (
                Backend::RedisCluster,
                Fault::MasterPause,
                Status::Documented,
            ),
            (Backend::RedisSentinelWait, Fault::MasterKill, Status::Fail),
            (Backend::RedisClusterWait, Fault::MasterPause, Status::Fail),
            (Backend::RedisCluster, Fault::SlotMigrate, Status::Fail),
        ] {
            let c = judge(b, f, Mode::Enforcing, &lost, &s);
            assert_eq!(status(&c, "tokens never go back"), want, "{b:?} {f:?}");
            assert_eq!(status(&c, "no foreign release"), Status::Pass);
            assert_eq!(status(&c, "no stale write accepted"), want, "{b:?} {f:?}");
            assert_eq!(status(&c, "grants resume after each fault"), Status::Pass);
        }
        let stuck = Figures {
            acquisitions: 10,
            failovers: 2,
            outage_ms: vec![3000.0],
            outage_missing: 1,
            ..Figures::default()
        };
        let c = judge(
            Backend::RedisSentinel,
            Fault::MasterKill,
            Mode::Enforcing,
            &stuck,
            &s,
        );
        assert_eq!(status(&c, "grants resume after each fault"), Status::Fail);
        // Split brain: two masters, each release of its own copy.
        let split = Figures {
            foreign_releases: 2,
            ..lost
        };
        for (b, want) in [
            (Backend::RedisSentinel, Status::Documented),
            (Backend::RedisSentinelWait, Status::Fail),
        ] {
            let c = judge(b, Fault::MasterPause, Mode::Enforcing, &split, &s);
            assert_eq!(status(&c, "no foreign release"), want, "{b:?}");
        }
        let c = judge(Backend::Redis, Fault::Restart, Mode::Enforcing, &split, &s);
        assert_eq!(status(&c, "no foreign release"), Status::Fail);
    }

    #[test]
    fn a_store_that_loses_its_state_is_documented_not_failed() {
        let x = Figures {
            acquisitions: 10,
            token_regressions: 3,
            taken_over: 2,
            lost_first: 1,
            ..Figures::default()
        };
        let s = Settings::quick();
        let c = judge(Backend::Redis, Fault::Restart, Mode::Enforcing, &x, &s);
        assert_eq!(status(&c, "tokens never go back"), Status::Documented);
        assert_eq!(
            status(&c, "lost() before another grant"),
            Status::Documented
        );
        let c = judge(Backend::Postgres, Fault::Restart, Mode::Enforcing, &x, &s);
        assert_eq!(status(&c, "tokens never go back"), Status::Fail);
        assert_eq!(status(&c, "lost() before another grant"), Status::Fail);
    }

    #[test]
    fn slow_or_missing_takeovers_and_foreign_releases_fail() {
        let s = Settings::quick();
        let slow = Figures {
            acquisitions: 5,
            takeover_ms: vec![900.0, 2500.0],
            ..Figures::default()
        };
        let c = judge(Backend::Sqlite, Fault::Kill, Mode::Enforcing, &slow, &s);
        assert_eq!(status(&c, "takeover within lease + 1 s"), Status::Fail);
        let missing = Figures {
            acquisitions: 5,
            takeover_missing: 1,
            foreign_releases: 1,
            ..Figures::default()
        };
        let c = judge(Backend::Redlock, Fault::Kill, Mode::Enforcing, &missing, &s);
        assert_eq!(status(&c, "takeover within lease + 1 s"), Status::Fail);
        assert_eq!(status(&c, "no foreign release"), Status::Fail);
    }

    #[test]
    fn a_command_that_outlives_its_killed_dlock_run_fails_every_store() {
        let s = Settings::quick();
        let orphan = Figures {
            acquisitions: 5,
            overlaps: 1,
            stale_writes: 1,
            stale_accepted: 1,
            takeover_ms: vec![1000.0],
            ..Figures::default()
        };
        let clean = Figures {
            acquisitions: 5,
            takeover_ms: vec![1000.0],
            ..Figures::default()
        };
        for b in Backend::ALL {
            let c = judge(b, Fault::RunKill, Mode::LogOnly, &orphan, &s);
            assert_eq!(status(&c, "the command died with dlock run"), Status::Fail);
            let c = judge(b, Fault::RunKill, Mode::LogOnly, &clean, &s);
            assert_eq!(status(&c, "the command died with dlock run"), Status::Pass);
            assert_eq!(status(&c, "takeover within lease + 1 s"), Status::Pass);
        }
    }

    #[test]
    fn the_pause_must_demonstrate_fencing_where_there_is_fencing() {
        let s = Settings::quick();
        let nothing = Figures {
            acquisitions: 5,
            ..Figures::default()
        };
        let c = judge(Backend::Sqlite, Fault::Pause, Mode::LogOnly, &nothing, &s);
        assert_eq!(
            status(&c, "the pause shows an overlap (log-only)"),
            Status::Fail
        );
        let accepted = Figures {
            acquisitions: 5,
            stale_writes: 1,
            stale_accepted: 1,
            overlaps: 1,
            ..Figures::default()
        };
        let c = judge(
            Backend::Zookeeper,
            Fault::Pause,
            Mode::Enforcing,
            &accepted,
            &s,
        );
        assert_eq!(status(&c, "no stale write accepted"), Status::Fail);
        let c = judge(
            Backend::Redlock,
            Fault::Pause,
            Mode::Enforcing,
            &accepted,
            &s,
        );
        assert_eq!(status(&c, "no stale write accepted"), Status::Documented);
        // A session lock ends after a lease of idleness like a lease: fencing must refuse the
        // paused holder's late write there too.
        let c = judge(
            Backend::MysqlSession,
            Fault::Pause,
            Mode::Enforcing,
            &accepted,
            &s,
        );
        assert_eq!(status(&c, "no stale write accepted"), Status::Fail);
    }
}
