//! What client processes report (one JSON object per line on stdout), what the fenced resource
//! records, and the clock they share.

use nix::time::{clock_gettime, ClockId};
use serde::{Deserialize, Serialize};

/// Microseconds of the machine's monotonic clock (`CLOCK_MONOTONIC`). Every process of a run is
/// on the same machine and reads the same clock, so these times order events across processes.
/// Nothing steps it: not a wall-clock step of the machine, and not the clock-step fault, which
/// fakes only the wall clock. (A per-process anchor of the wall clock read once would not do:
/// processes anchored on either side of a step, or preempted between the two reads, disagree
/// by that much.)
pub fn now_us() -> i64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() * 1_000_000 + t.tv_nsec() / 1_000)
        .unwrap_or(0)
}

/// One thing that happened in a client process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The process is connected and about to start its loop.
    Ready { at: i64, pid: u32 },
    /// A `--via-run` worker started `dlock run` (pid `pid`) for hold `hold`.
    Run { hold: u64, at: i64, pid: u32 },
    /// `acquire` returned a guard.
    Granted {
        hold: u64,
        at: i64,
        token: Option<u64>,
        /// The local deadline (`at + valid_for`) right after the grant.
        deadline: i64,
        /// How long the holder means to work between its read and its write, in ms.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        planned_ms: Option<u64>,
    },
    /// The hold's local deadline moved (a renewal), sampled while held.
    Deadline { hold: u64, at: i64, deadline: i64 },
    /// `lost()` resolved for this hold before it was released.
    Lost { hold: u64, at: i64, reason: String },
    /// The resource answered the write of this hold.
    Wrote {
        hold: u64,
        at: i64,
        accepted: bool,
        /// Whether the guard still said `is_held()` just before the write.
        held: bool,
    },
    /// The hold was lost before the write, so the (careful) worker did not write.
    Skipped { hold: u64, at: i64 },
    /// `release` was called at `at` and answered `result` at `done`.
    Released {
        hold: u64,
        at: i64,
        done: i64,
        result: ReleaseResult,
    },
    /// An acquisition (or the resource) failed with an error other than not-granted.
    Error { at: i64, what: String },
    /// The loop ended (count or time reached).
    Finished { at: i64, iterations: u64 },
}

/// How a release answered.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseResult {
    /// The store removed this owner's hold.
    Ok,
    /// The store no longer had this owner's hold.
    NotOwner,
    /// The hold had been lost already (nothing was sent).
    Lost,
    /// The store could not be reached.
    Error,
}

/// One read the fenced resource answered: the reading hold and its token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReadRecord {
    pub worker: u32,
    pub hold: u64,
    pub token: Option<u64>,
    pub at: i64,
}

/// One write the fenced resource received.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WriteRecord {
    /// The writing process (its worker index) and its hold number.
    pub worker: u32,
    pub hold: u64,
    /// The fencing token the writer presented (`None`: the store has no fencing).
    pub token: Option<u64>,
    /// The writer's claimed hold interval: from its grant to this write (resource's clock).
    pub claimed_from: i64,
    pub at: i64,
    /// The value the writer read before and the value it wrote.
    pub read: u64,
    pub value: u64,
    pub accepted: bool,
}
