//! The clock and the jitter of the core and the in-memory store, in one place so that a
//! deterministic simulation can run them on virtual time with seeded jitter.
//!
//! `now()` is tokio's clock: the real monotonic clock, except in a runtime whose clock tokio's
//! `test-util` feature paused (then it moves only when the runtime sleeps or is advanced). The
//! core's timers (`tokio::time::sleep_until`) follow the same clock, so leases, deadlines, waits
//! and expiry agree. Without `test-util` (a release build) it is `std::time::Instant::now()`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The current instant on the runtime's clock (see the module docs).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The wall clock in milliseconds since the Unix epoch (0 before it): the time of a grant that
/// stores record for `describe`, never used for leases.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time since `since` on the same clock (zero if `since` lies ahead).
pub(crate) fn elapsed(since: Instant) -> Duration {
    now().saturating_duration_since(since)
}

thread_local! {
    /// The seeded jitter of this thread, if a simulation set one.
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Runs `f` with the jitter source of this thread: the seeded one if [`seed_jitter`] set it,
/// else the thread's entropy-seeded generator.
pub(crate) fn with_rng<T>(f: impl FnOnce(&mut dyn rand::RngCore) -> T) -> T {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => f(rng),
        None => f(&mut rand::thread_rng()),
    })
}

/// A uniform sample of `range` from [`with_rng`].
pub(crate) fn gen_range<T, R>(range: R) -> T
where
    T: rand::distributions::uniform::SampleUniform,
    R: rand::distributions::uniform::SampleRange<T>,
{
    with_rng(|rng| rng.gen_range(range))
}

/// Seeds the jitter of the core on this thread (`None`: back to entropy). For a deterministic
/// simulation on a current-thread runtime with a paused clock (`crates/dlock/tests/simulation.rs`):
/// with it, one seed replays one history. Not part of the stable API.
pub fn seed_jitter(seed: Option<u64>) {
    SEEDED.with(|s| *s.borrow_mut() = seed.map(StdRng::seed_from_u64));
}
