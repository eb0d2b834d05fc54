//! Time-bounded waits and assertions for conformance scenarios.
//!
//! Every wait in the suite goes through [`within`], [`must`], [`fails`] or [`eventually`], so a
//! broken lock fails its test with a message saying what it was waiting for instead of hanging
//! the run. These are test machinery: they panic (with a message) when an expectation fails.

use crate::{Client, LockInfo};
use std::fmt::{self, Display};
use std::future::Future;
use std::time::{Duration, Instant};

/// How long one step that is expected to succeed (connect, an acquisition of a free lock, a
/// release, a describe) may take before the test fails. Generous: it catches hangs, not slowness.
pub const STEP: Duration = Duration::from_secs(10);

/// The hard limit of one scenario: a bug that makes a scenario wait forever fails it here.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A store URL from the environment variable `var`, `None` when it is unset or empty. For a
/// backend line whose server the test runner (`scripts/test.sh`) provides: with `None` the test
/// fails, saying how to provide the server (it never skips).
pub fn env_url(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|s| !s.trim().is_empty())
}

/// `url` with `key=value` (`kv`) added to its query options.
pub fn with_option(url: &str, kv: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{kv}")
}

/// Asserts that a primitive a mutex-only store does not offer is refused with
/// [`Error::Unsupported`](crate::Error::Unsupported) (within [`STEP`]).
pub async fn assert_unsupported<T: fmt::Debug>(
    what: &str,
    f: impl Future<Output = crate::Result<T>>,
) {
    match tokio::time::timeout(STEP, f).await {
        Ok(Err(crate::Error::Unsupported(_))) => {}
        other => panic!("{what} on a mutex-only store: expected Unsupported, got {other:?}"),
    }
}

/// This machine's host name, as a client records it with each hold.
pub fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// Awaits `fut` for at most `limit`; panics naming `what` if it takes longer.
pub async fn within<T>(limit: Duration, what: impl Display, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// Awaits a dlock operation expected to succeed within [`STEP`]; panics naming `what` otherwise.
pub async fn must<T>(what: impl Display, fut: impl Future<Output = crate::Result<T>>) -> T {
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
    fut: impl Future<Output = crate::Result<T>>,
) -> (crate::Error, Duration) {
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

/// `assert_err!(result, pattern, "context {}", args..)`: asserts that the
/// [`dlock::Result`](crate::Result) `result` is `Err(pattern)`; the panic message names the
/// context and what came instead (a guard shown by [`show`]).
///
/// ```
/// use dlock::conformance::assert_err;
/// let r: dlock::Result<()> = Err(dlock::Error::InvalidName("".into()));
/// assert_err!(r, dlock::Error::InvalidName(_), "mutex({:?})", "");
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_assert_err {
    ($r:expr, $pat:pat, $($ctx:tt)+) => {
        match $r {
            Err($pat) => {}
            other => panic!(
                "{}: expected Err({}), got {}",
                format_args!($($ctx)+),
                stringify!($pat),
                $crate::conformance::show(&other)
            ),
        }
    };
}
#[doc(inline)]
pub use crate::__conformance_assert_err as assert_err;

/// A short rendering of a result for failure messages: a guard as its name, token and owner (its
/// `Debug` drags in the whole client), anything else as its `Debug`, cut at 400 characters.
pub fn show<T: fmt::Debug + 'static>(r: &crate::Result<T>) -> String {
    match r {
        Err(e) => format!("Err({e:?})"),
        Ok(v) => match (v as &dyn std::any::Any).downcast_ref::<crate::Guard>() {
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
