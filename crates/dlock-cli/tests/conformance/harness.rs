//! The machinery of the conformance suite: the per-test store and context, time-bounded waits,
//! error assertions and the `dlock` CLI.
//!
//! Every wait in the suite goes through [`within`], [`must`] or [`eventually`], so a broken lock
//! fails its test with a message saying what it was waiting for instead of hanging the run.

use dlock::{Client, ClientOptions, LockInfo};
use std::fmt::{self, Display};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long one step that is expected to succeed (connect, an acquisition of a free lock, a
/// release, a describe) may take before the test fails. Generous: it catches hangs, not slowness.
pub const STEP: Duration = Duration::from_secs(10);

/// The hard limit of one scenario: a bug that makes a scenario wait forever fails it here.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

/// The `dlock` binary of this package.
pub const DLOCK_BIN: &str = env!("CARGO_BIN_EXE_dlock");

/// What a backend offers beyond what [`Client::capabilities`] reports.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Separate OS processes that connect to the same URL share its locks (`false` for `mem://`,
    /// whose store lives inside one process). The multi-process scenarios run only when true.
    pub cross_process: bool,
    /// The store offers only non-fair mutexes (Redlock): scenarios run their mutex parts and check
    /// that rwlocks, semaphores and fair mode answer `Unsupported` instead of their own parts.
    pub mutex_only: bool,
}

/// Asserts that a primitive a mutex-only store does not offer is refused clearly.
pub async fn assert_unsupported<T: std::fmt::Debug>(
    what: &str,
    f: impl std::future::Future<Output = dlock::Result<T>>,
) {
    match tokio::time::timeout(std::time::Duration::from_secs(10), f).await {
        Ok(Err(dlock::Error::Unsupported(_))) => {}
        other => panic!("{what} on a mutex-only store: expected Unsupported, got {other:?}"),
    }
}

/// The per-test context a backend's URL function gets. Its `Display` is an id unique to this test
/// run (`[a-z0-9_-]`, safe in URLs, file names, database names and lock names); [`Ctx::path`]
/// gives a file in a temporary directory that lives as long as the test.
pub struct Ctx {
    id: String,
    dir: tempfile::TempDir,
}

impl Ctx {
    fn new(scenario: &str) -> Ctx {
        let uuid = uuid::Uuid::new_v4().simple().to_string();
        let id = format!("{scenario}-{}", &uuid[..12]);
        let dir = tempfile::Builder::new()
            .prefix("dlock-conformance-")
            .tempdir()
            .expect("create a temporary directory for the test");
        Ctx { id, dir }
    }

    /// The unique id of this test run.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `file` inside this test's own temporary directory (absolute).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

impl Display for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// A store URL from the environment variable `var`, `None` when it is unset or empty (the test
/// then fails, telling how to provide the server). For backends whose server the test runner
/// (`scripts/test.sh`) provides.
#[allow(dead_code)] // used by the backend lines that read their URL from the environment
pub fn env_url(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|s| !s.trim().is_empty())
}

/// `url` with `key=value` added to its query options.
#[allow(dead_code)] // used by the session-mode backend lines
pub fn with_option(url: &str, kv: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{kv}")
}

/// What a scenario gets: the URL of a store of its own (or a shared server with names of its
/// own), the backend's [`Caps`], a unique id for lock names and a scratch directory.
pub struct Store {
    /// The store URL.
    pub url: String,
    /// What the backend offers.
    pub caps: Caps,
    /// Unique id of this test run.
    pub id: String,
    /// A scratch directory of this test (files shared with child processes).
    pub dir: PathBuf,
}

impl Store {
    /// A new client of the store (each call is another client: another connection, another
    /// client id, another renewal watchdog).
    pub async fn client(&self) -> Client {
        must(
            format!("connect to {}", dlock::redact_url(&self.url)),
            dlock::connect(&self.url),
        )
        .await
    }

    /// A new client whose default lease is `lease`.
    pub async fn client_with_lease(&self, lease: Duration) -> Client {
        must(
            format!(
                "connect to {} with lease {lease:?}",
                dlock::redact_url(&self.url)
            ),
            dlock::connect_with(&self.url, ClientOptions::default().lease(lease)),
        )
        .await
    }

    /// Whether a hold ends as soon as its holder's connection closes (PostgreSQL and MySQL
    /// session mode): a killed holder is taken over at once rather than after its lease.
    pub fn ends_with_connection(&self) -> bool {
        self.url.contains("mode=session")
    }

    /// A lock name unique to this test: `conf/<id>/<what>`.
    pub fn name(&self, what: &str) -> String {
        format!("conf/{}/{what}", self.id)
    }
}

/// Runs one scenario against one backend: makes the test's context, asks the backend for its URL,
/// and runs the scenario under [`SCENARIO_LIMIT`].
pub async fn run<U, R, S, F>(backend: &'static str, scenario: &str, caps: Caps, url: U, body: S)
where
    U: FnOnce(&Ctx) -> R,
    R: Into<Option<String>>,
    S: FnOnce(Store) -> F,
    F: Future<Output = ()>,
{
    let ctx = Ctx::new(scenario);
    let Some(url) = url(&ctx).into() else {
        panic!(
            "backend {backend} is not configured (its URL function answered None): run the suite \
             through scripts/test.sh, which starts the server and sets the URL (see conformance.rs)"
        );
    };
    let store = Store {
        url,
        caps,
        id: ctx.id().to_owned(),
        dir: ctx.dir.path().to_owned(),
    };
    let started = Instant::now();
    if tokio::time::timeout(SCENARIO_LIMIT, body(store))
        .await
        .is_err()
    {
        panic!("{backend}::{scenario} did not finish within {SCENARIO_LIMIT:?} (a wait that never ends?)");
    }
    eprintln!("{backend}::{scenario} took {:?}", started.elapsed());
    drop(ctx);
}

/// Awaits `fut` for at most `limit`; panics naming `what` if it takes longer.
pub async fn within<T>(limit: Duration, what: impl Display, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// Awaits a dlock operation expected to succeed within [`STEP`]; panics naming `what` otherwise.
pub async fn must<T>(what: impl Display, fut: impl Future<Output = dlock::Result<T>>) -> T {
    match tokio::time::timeout(STEP, fut).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what}: unexpected error {e:?} ({e})"),
        Err(_) => panic!("{what}: did not finish within {STEP:?}"),
    }
}

/// Awaits a dlock operation expected to fail (within [`STEP`]) and returns the error and how
/// long it took; panics if it succeeds or hangs.
pub async fn fails<T: fmt::Debug + 'static>(
    what: impl Display,
    fut: impl Future<Output = dlock::Result<T>>,
) -> (dlock::Error, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(STEP, fut).await {
        Ok(Err(e)) => (e, started.elapsed()),
        Ok(r @ Ok(_)) => panic!("{what}: expected an error, got {}", show(&r)),
        Err(_) => panic!("{what}: did not finish within {STEP:?}"),
    }
}

/// Polls `probe` every 20 ms until it answers true; panics naming `what` if that takes longer
/// than `limit`. Returns how long it took.
pub async fn eventually<P, Fut>(limit: Duration, what: impl Display, mut probe: P) -> Duration
where
    P: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left.max(Duration::from_millis(1)), probe()).await {
            Ok(true) => return started.elapsed(),
            Ok(false) if started.elapsed() < limit => {}
            _ => panic!("{what}: not the case within {limit:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `client.describe(name)` within [`STEP`].
pub async fn describe(client: &Client, name: &str) -> Option<LockInfo> {
    must(format!("describe({name:?})"), client.describe(name)).await
}

/// Awaits spawned tasks, re-raising the first task's panic (with its own message) in the test.
pub async fn join_all<T>(what: &str, tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(v) => out.push(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("{what}: task {i} did not complete: {e}"),
        }
    }
    out
}

/// Asserts that the `dlock::Result` `$r` is `Err($pat)`; the message names the context and what
/// came instead.
macro_rules! assert_err {
    ($r:expr, $pat:pat, $($ctx:tt)+) => {
        match $r {
            Err($pat) => {}
            other => panic!(
                "{}: expected Err({}), got {}",
                format_args!($($ctx)+),
                stringify!($pat),
                $crate::harness::show(&other)
            ),
        }
    };
}
pub(crate) use assert_err;

/// A short rendering of a result for failure messages: a guard as its name, token and owner (its
/// `Debug` drags in the whole client), anything else as its `Debug`, cut at 400 characters.
pub fn show<T: fmt::Debug + 'static>(r: &dlock::Result<T>) -> String {
    match r {
        Err(e) => format!("Err({e:?})"),
        Ok(v) => match (v as &dyn std::any::Any).downcast_ref::<dlock::Guard>() {
            Some(g) => format!(
                "Ok(Guard {{ name: {:?}, token: {:?}, owner: {}, held: {} }})",
                g.name(),
                g.token(),
                g.owner(),
                g.is_held()
            ),
            None => {
                let s = format!("Ok({v:?})");
                match s.char_indices().nth(400) {
                    Some((i, _)) => format!("{}…", &s[..i]),
                    None => s,
                }
            }
        },
    }
}

/// Asserts that the values are strictly increasing, naming the first pair that is not.
#[track_caller]
pub fn assert_strictly_increasing(what: &str, values: &[u64]) {
    for (i, w) in values.windows(2).enumerate() {
        assert!(
            w[0] < w[1],
            "{what}: value #{} ({}) is not greater than value #{i} ({}); all: {values:?}",
            i + 1,
            w[1],
            w[0]
        );
    }
}

/// This machine's host name as the C library reports it (what dlock stores with a hold).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname writes at most that many.
    let rc = unsafe { nix::libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(rc, 0, "gethostname failed");
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A `dlock run --url URL OPTS... NAME -- CMD...` command (the child is killed if the test drops
/// it; stdin is closed; `DLOCK_URL` is not inherited).
pub fn dlock_run(url: &str, opts: &[&str], name: &str, cmd: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(DLOCK_BIN);
    c.arg("run")
        .args(["--url", url])
        .args(opts)
        .args([name, "--"])
        .args(cmd)
        .env_remove("DLOCK_URL")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    c
}

/// Reads a file the test's child processes wrote ("" if it does not exist).
pub fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
