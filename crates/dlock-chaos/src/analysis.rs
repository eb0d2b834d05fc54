//! Turns what the client processes reported, what the resource recorded and what the harness did
//! into the figures of one scenario.
//!
//! Definitions (all times are microseconds of the monotonic clock of one machine):
//! - a **hold** lives from its grant until its release was sent, its process was killed, or the
//!   run ended;
//! - a write is **stale** when a hold granted after the writer's had already read or written the
//!   resource when the write arrived: the writer no longer held the lock, whatever it believed,
//!   and its write would undo the newer holder's view. This needs no token, so it also judges
//!   stores without fencing. (A late write that lands before the newer holder touched anything is
//!   serialised before it and harms nothing; a lock that wrongly let two hold shows up in
//!   "lost() first" and in the overlaps);
//! - an **overlap** is a pair of writes accepted by the resource, from different holds, whose
//!   claimed hold intervals (grant → write) intersect;
//! - a **token regression** is a grant whose token is not greater than every earlier grant's;
//! - a **foreign release** is a release that answered OK although another hold, granted after the
//!   releaser's grant, was live at that moment: the release removed someone else's lock;
//! - a hold is **taken over** when another hold is granted while it is live; `lost()` came first
//!   when the holder's `lost()` fired before that grant (for a paused process, which cannot run
//!   `lost()`, when its last known local deadline lay before that grant);
//! - the **takeover time** after a holder was killed is from the kill to the next grant;
//! - after a fault of a Redis fail-over deployment (`master-kill`, `master-pause`,
//!   `slot-migrate`), the **fail-over time** is from the fault to the moment the harness saw the
//!   store recovered (a new master named, a paused one continued, the slot moved), and the
//!   **time without a grant** is from the fault to the next grant.

use crate::event::{Event, ReadRecord, ReleaseResult, WriteRecord};
use serde::Serialize;
use std::collections::HashMap;

/// What the harness did to a client process or the store.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// `kill`, `pause`, `restart`, `conn-kill`, `delay`, `black-hole`, `redlock-2-down`, …
    pub kind: String,
    /// The client process it targeted (its worker index), if any.
    pub worker: Option<u32>,
    /// When it began and (for faults that last) ended.
    pub at: i64,
    pub until: Option<i64>,
    /// What was done, in words.
    pub detail: String,
}

/// Everything recorded in one scenario run.
pub struct RunData {
    /// Events per worker index.
    pub events: HashMap<u32, Vec<Event>>,
    /// Every write the resource received, in arrival order.
    pub writes: Vec<WriteRecord>,
    /// Every read the resource answered.
    pub reads: Vec<ReadRecord>,
    /// The resource's counter at the end.
    pub final_value: u64,
    pub faults: Vec<FaultRecord>,
    /// When the run ended (holds still open end here).
    pub end: i64,
}

/// The figures of one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Grants reported by the clients.
    pub acquisitions: u64,
    /// Acquisitions that failed with an error other than not-granted (store down).
    pub errors: u64,
    /// Writes that reached the resource.
    pub writes: u64,
    /// Writes a careful worker skipped because its hold had been lost.
    pub skipped_lost: u64,
    /// Pairs of accepted writes from different holds with intersecting claimed intervals.
    pub overlaps: u64,
    /// Stale writes (see the module docs), and how the resource answered them.
    pub stale_writes: u64,
    pub stale_rejected: u64,
    pub stale_accepted: u64,
    /// Writes of a live, newest hold that the resource refused (after a token regression).
    pub valid_rejected: u64,
    /// Accepted writes minus the counter's final value: increments lost to interleaving.
    pub lost_updates: i64,
    pub token_regressions: u64,
    pub foreign_releases: u64,
    /// Releases answered "not the owner any more" (a late holder; its successor's hold untouched).
    pub releases_not_owner: u64,
    /// Holds taken over while live, and how many of them saw `lost()` first.
    pub taken_over: u64,
    pub lost_first: u64,
    /// Takeover times after killed holders, in ms (sorted), and kills never taken over.
    pub takeover_ms: Vec<f64>,
    pub takeover_missing: u64,
    /// Kills that hit a process between two holds (no takeover to time).
    pub kills_between_holds: u64,
    /// From a paused holder's SIGSTOP to the next grant, in ms (sorted).
    pub pause_takeover_ms: Vec<f64>,
    /// Pauses during which another process was granted the lock.
    pub taken_over_during_pause: u64,
    /// Holds whose `lost()` fired before they were released.
    pub lost: u64,
    /// Acquisitions refused because too few replicas confirmed the grant (`WAIT`; rolled back).
    pub wait_refusals: u64,
    /// Faults of a Redis fail-over deployment, and how many of them found a hold live.
    pub failovers: u64,
    pub failovers_during_hold: u64,
    /// From each such fault to the store's recovery as the harness saw it, in ms (sorted).
    pub failover_ms: Vec<f64>,
    /// From each such fault to the next grant, in ms (sorted), and faults never followed by one.
    pub outage_ms: Vec<f64>,
    pub outage_missing: u64,
    /// Grants after the last fault was over (its end, or its start for an instant fault): the
    /// store serves again.
    pub grants_after_faults: u64,
}

/// The fault kinds of a Redis fail-over deployment.
pub const FAILOVER_KINDS: [&str; 3] = ["master-kill", "master-pause", "slot-migrate"];

impl Figures {
    /// Adds another lane's figures to these. `faults`: also its figures of the store's
    /// fail-overs (false for a lane that saw a store fault another lane injected, so that each
    /// fault counts once).
    pub fn absorb(&mut self, o: Figures, faults: bool) {
        fn merge(a: &mut Vec<f64>, b: Vec<f64>) {
            a.extend(b);
            a.sort_by(f64::total_cmp);
        }
        self.acquisitions += o.acquisitions;
        self.errors += o.errors;
        self.writes += o.writes;
        self.skipped_lost += o.skipped_lost;
        self.overlaps += o.overlaps;
        self.stale_writes += o.stale_writes;
        self.stale_rejected += o.stale_rejected;
        self.stale_accepted += o.stale_accepted;
        self.valid_rejected += o.valid_rejected;
        self.lost_updates += o.lost_updates;
        self.token_regressions += o.token_regressions;
        self.foreign_releases += o.foreign_releases;
        self.releases_not_owner += o.releases_not_owner;
        self.taken_over += o.taken_over;
        self.lost_first += o.lost_first;
        merge(&mut self.takeover_ms, o.takeover_ms);
        self.takeover_missing += o.takeover_missing;
        self.kills_between_holds += o.kills_between_holds;
        merge(&mut self.pause_takeover_ms, o.pause_takeover_ms);
        self.taken_over_during_pause += o.taken_over_during_pause;
        self.lost += o.lost;
        self.wait_refusals += o.wait_refusals;
        self.grants_after_faults += o.grants_after_faults;
        if faults {
            self.failovers += o.failovers;
            self.failovers_during_hold += o.failovers_during_hold;
            merge(&mut self.failover_ms, o.failover_ms);
            merge(&mut self.outage_ms, o.outage_ms);
            self.outage_missing += o.outage_missing;
        }
    }

    /// Median of the takeover times after kills.
    pub fn takeover_p50(&self) -> Option<f64> {
        percentile(&self.takeover_ms, 0.5)
    }

    /// Longest takeover time after a kill.
    pub fn takeover_max(&self) -> Option<f64> {
        self.takeover_ms.last().copied()
    }

    /// Share of taken-over holds that saw `lost()` before the next grant, in percent.
    pub fn lost_first_pct(&self) -> Option<f64> {
        (self.taken_over > 0).then(|| 100.0 * self.lost_first as f64 / self.taken_over as f64)
    }
}

/// The `q` quantile of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

#[derive(Debug, Clone)]
struct Hold {
    worker: u32,
    hold: u64,
    granted: i64,
    token: Option<u64>,
    /// (reported at, deadline) in order, the grant's first.
    deadlines: Vec<(i64, i64)>,
    lost: Option<i64>,
    release: Option<(i64, ReleaseResult)>,
    end: i64,
}

impl Hold {
    fn live_at(&self, t: i64) -> bool {
        self.granted < t && t < self.end
    }

    /// The last local deadline the holder knew of at `t`.
    fn deadline_at(&self, t: i64) -> Option<i64> {
        self.deadlines
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map(|(_, d)| *d)
    }
}

fn holds(data: &RunData) -> Vec<Hold> {
    // A worker whose `dlock run` is killed lives on, and may be killed again: each kill ends
    // the hold it found.
    let mut kills: HashMap<u32, Vec<i64>> = HashMap::new();
    for f in data
        .faults
        .iter()
        .filter(|f| f.kind == "kill" || f.kind == "run-kill")
    {
        if let Some(w) = f.worker {
            kills.entry(w).or_default().push(f.at);
        }
    }
    let mut out = Vec::new();
    for (&worker, events) in &data.events {
        let mut by_hold: HashMap<u64, Hold> = HashMap::new();
        for ev in events {
            match ev {
                Event::Granted {
                    hold,
                    at,
                    token,
                    deadline,
                    ..
                } => {
                    by_hold.insert(
                        *hold,
                        Hold {
                            worker,
                            hold: *hold,
                            granted: *at,
                            token: *token,
                            deadlines: vec![(*at, *deadline)],
                            lost: None,
                            release: None,
                            end: data.end,
                        },
                    );
                }
                Event::Deadline { hold, at, deadline } => {
                    if let Some(h) = by_hold.get_mut(hold) {
                        h.deadlines.push((*at, *deadline));
                    }
                }
                Event::Lost { hold, at, .. } => {
                    if let Some(h) = by_hold.get_mut(hold) {
                        h.lost.get_or_insert(*at);
                    }
                }
                Event::Released {
                    hold, at, result, ..
                } => {
                    if let Some(h) = by_hold.get_mut(hold) {
                        h.release = Some((*at, *result));
                        h.end = *at;
                    }
                }
                _ => {}
            }
        }
        for mut h in by_hold.into_values() {
            if h.release.is_none() {
                if let Some(k) = kills
                    .get(&worker)
                    .and_then(|ks| ks.iter().filter(|k| **k > h.granted).min())
                {
                    h.end = h.end.min(*k);
                }
            }
            out.push(h);
        }
    }
    out.sort_by_key(|h| (h.granted, h.worker, h.hold));
    out
}

/// Computes the figures of one run.
pub fn analyze(data: &RunData) -> Figures {
    let holds = holds(data);
    let mut f = Figures {
        acquisitions: holds.len() as u64,
        ..Figures::default()
    };
    let count =
        |p: fn(&Event) -> bool| data.events.values().flatten().filter(|e| p(e)).count() as u64;
    f.errors = count(|e| matches!(e, Event::Error { .. }));
    f.skipped_lost = count(|e| matches!(e, Event::Skipped { .. }));
    f.wait_refusals = count(|e| matches!(e, Event::Error { what, .. } if what.contains("(WAIT)")));
    f.lost = holds.iter().filter(|h| h.lost.is_some()).count() as u64;
    let grants: Vec<i64> = holds.iter().map(|h| h.granted).collect();
    if let Some(over) = data.faults.iter().map(|x| x.until.unwrap_or(x.at)).max() {
        f.grants_after_faults = grants.iter().filter(|g| **g > over).count() as u64;
    }
    // When each hold first read or wrote the resource.
    let mut touched: HashMap<(u32, u64), i64> = HashMap::new();
    let touches = data
        .reads
        .iter()
        .map(|r| (r.worker, r.hold, r.at))
        .chain(data.writes.iter().map(|w| (w.worker, w.hold, w.at)));
    for (worker, hold, at) in touches {
        let t = touched.entry((worker, hold)).or_insert(at);
        *t = (*t).min(at);
    }
    let granted_of = |worker: u32, hold: u64, fallback: i64| {
        holds
            .iter()
            .find(|h| (h.worker, h.hold) == (worker, hold))
            .map_or(fallback, |h| h.granted)
    };

    // Writes: stale or not, and what the resource did.
    f.writes = data.writes.len() as u64;
    for w in &data.writes {
        let granted = granted_of(w.worker, w.hold, w.claimed_from);
        let stale = holds.iter().any(|o| {
            o.granted > granted
                && (o.worker, o.hold) != (w.worker, w.hold)
                && touched.get(&(o.worker, o.hold)).is_some_and(|t| *t < w.at)
        });
        match (stale, w.accepted) {
            (true, true) => f.stale_accepted += 1,
            (true, false) => f.stale_rejected += 1,
            (false, false) => f.valid_rejected += 1,
            (false, true) => {}
        }
        f.stale_writes += stale as u64;
    }
    let accepted = data.writes.iter().filter(|w| w.accepted).count() as i64;
    f.lost_updates = accepted - data.final_value as i64;

    // Overlaps among accepted writes' claimed intervals.
    let mut iv: Vec<(i64, i64, u32, u64)> = data
        .writes
        .iter()
        .filter(|w| w.accepted)
        .map(|w| (w.claimed_from, w.at, w.worker, w.hold))
        .collect();
    iv.sort();
    for (i, a) in iv.iter().enumerate() {
        for b in &iv[i + 1..] {
            if b.0 >= a.1 {
                break;
            }
            if (a.2, a.3) != (b.2, b.3) {
                f.overlaps += 1;
            }
        }
    }

    // Token regressions, in grant order.
    let mut highest: Option<u64> = None;
    for h in &holds {
        if let Some(t) = h.token {
            if highest.is_some_and(|m| t <= m) {
                f.token_regressions += 1;
            }
            highest = Some(highest.map_or(t, |m| m.max(t)));
        }
    }

    // Releases.
    for h in &holds {
        let Some((at, result)) = h.release else {
            continue;
        };
        match result {
            ReleaseResult::NotOwner => f.releases_not_owner += 1,
            ReleaseResult::Ok => {
                let foreign = holds.iter().any(|o| {
                    (o.worker, o.hold) != (h.worker, h.hold)
                        && o.granted > h.granted
                        && o.live_at(at)
                });
                f.foreign_releases += foreign as u64;
            }
            _ => {}
        }
    }

    // Takeovers of live holds: did the holder see lost() first?
    let pauses: Vec<&FaultRecord> = data.faults.iter().filter(|x| x.kind == "pause").collect();
    for h in &holds {
        let next = holds
            .iter()
            .filter(|o| (o.worker, o.hold) != (h.worker, h.hold))
            .map(|o| o.granted)
            .filter(|g| h.live_at(*g))
            .min();
        let Some(g) = next else {
            continue;
        };
        f.taken_over += 1;
        let paused = pauses
            .iter()
            .any(|p| p.worker == Some(h.worker) && p.at <= g && p.until.map_or(true, |u| g <= u));
        let first =
            h.lost.is_some_and(|l| l <= g) || (paused && h.deadline_at(g).is_some_and(|d| d <= g));
        f.lost_first += first as u64;
    }

    // Takeover times after kills of a holder and after pauses.
    for x in &data.faults {
        let holding = holds
            .iter()
            .any(|h| Some(h.worker) == x.worker && h.granted < x.at && x.at <= h.end);
        let kill = x.kind == "kill" || x.kind == "run-kill";
        if FAILOVER_KINDS.contains(&x.kind.as_str()) {
            f.failovers += 1;
            let live = holds.iter().any(|h| h.live_at(x.at));
            f.failovers_during_hold += live as u64;
            if let Some(u) = x.until {
                f.failover_ms.push((u - x.at) as f64 / 1000.0);
            }
            match grants.iter().find(|g| **g > x.at) {
                Some(g) => f.outage_ms.push((g - x.at) as f64 / 1000.0),
                None => f.outage_missing += 1,
            }
            continue;
        }
        if kill && !holding {
            f.kills_between_holds += 1;
            continue;
        }
        let next = grants.iter().find(|g| **g > x.at).copied();
        let ms = next.map(|g| (g - x.at) as f64 / 1000.0);
        match (x.kind.as_str(), ms) {
            (_, Some(ms)) if kill => f.takeover_ms.push(ms),
            (_, None) if kill => f.takeover_missing += 1,
            ("pause", Some(ms)) => {
                f.pause_takeover_ms.push(ms);
                let during = next.is_some_and(|g| x.until.is_some_and(|u| g < u));
                f.taken_over_during_pause += during as u64;
            }
            _ => {}
        }
    }
    f.takeover_ms.sort_by(f64::total_cmp);
    f.pause_takeover_ms.sort_by(f64::total_cmp);
    f.failover_ms.sort_by(f64::total_cmp);
    f.outage_ms.sort_by(f64::total_cmp);
    f
}

/// The lines that show what happened around the holds a failed check is about: every hold that
/// another grant found live, that hold's taker, and every fault, in time order, times in ms from
/// the first grant (at most `max` lines). For the report of a failed scenario.
pub fn timeline(data: &RunData, max: usize) -> Vec<String> {
    let holds = holds(data);
    let Some(t0) = holds.first().map(|h| h.granted) else {
        return Vec::new();
    };
    let ms = |t: i64| format!("{:+.1}", (t - t0) as f64 / 1000.0);
    let mut shown = vec![false; holds.len()];
    for (i, h) in holds.iter().enumerate() {
        if let Some(j) = holds
            .iter()
            .position(|o| (o.worker, o.hold) != (h.worker, h.hold) && h.live_at(o.granted))
        {
            shown[i] = true;
            shown[j] = true;
        }
    }
    let mut lines: Vec<(i64, String)> = holds
        .iter()
        .zip(&shown)
        .filter(|(_, s)| **s)
        .map(|(h, _)| {
            let token = h.token.map_or("-".into(), |t| t.to_string());
            let deadline = h.deadlines.last().map_or("-".into(), |(_, d)| ms(*d));
            let lost = h.lost.map_or("-".into(), ms);
            let release = h
                .release
                .map_or("none".into(), |(at, r)| format!("{} {r:?}", ms(at)));
            (
                h.granted,
                format!(
                    "{} ms: worker {} hold {} granted, token {token}; last deadline {deadline}, \
                     lost() {lost}, release {release}, end {}",
                    ms(h.granted),
                    h.worker,
                    h.hold,
                    ms(h.end)
                ),
            )
        })
        .collect();
    lines.extend(data.faults.iter().map(|f| {
        let until = f
            .until
            .map_or(String::new(), |u| format!(" until {}", ms(u)));
        (
            f.at,
            format!("{} ms: fault {}{until}: {}", ms(f.at), f.kind, f.detail),
        )
    }));
    lines.sort_by_key(|(t, _)| *t);
    lines.into_iter().take(max).map(|(_, l)| l).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(hold: u64, at: i64, token: u64, deadline: i64) -> Event {
        Event::Granted {
            hold,
            at,
            token: Some(token),
            deadline,
            planned_ms: None,
        }
    }

    fn released(hold: u64, at: i64, result: ReleaseResult) -> Event {
        Event::Released {
            hold,
            at,
            done: at + 1,
            result,
        }
    }

    fn write(worker: u32, hold: u64, token: u64, from: i64, at: i64, ok: bool) -> WriteRecord {
        WriteRecord {
            worker,
            hold,
            token: Some(token),
            claimed_from: from,
            at,
            read: 0,
            value: 1,
            accepted: ok,
        }
    }

    fn data(events: Vec<(u32, Vec<Event>)>, writes: Vec<WriteRecord>, value: u64) -> RunData {
        RunData {
            events: events.into_iter().collect(),
            writes,
            reads: vec![],
            final_value: value,
            faults: vec![],
            end: 1_000_000,
        }
    }

    #[test]
    fn clean_hand_offs_have_no_violations() {
        let d = data(
            vec![
                (
                    1,
                    vec![
                        granted(1, 100, 1, 1100),
                        released(1, 200, ReleaseResult::Ok),
                    ],
                ),
                (
                    2,
                    vec![
                        granted(1, 210, 2, 1210),
                        released(1, 300, ReleaseResult::Ok),
                    ],
                ),
            ],
            vec![
                write(1, 1, 1, 100, 150, true),
                write(2, 1, 2, 210, 250, true),
            ],
            2,
        );
        let f = analyze(&d);
        assert_eq!(f.acquisitions, 2);
        assert_eq!(
            (
                f.stale_writes,
                f.overlaps,
                f.token_regressions,
                f.foreign_releases,
                f.taken_over
            ),
            (0, 0, 0, 0, 0)
        );
        assert_eq!(f.lost_updates, 0);
    }

    #[test]
    fn a_paused_holder_is_stale_overlaps_and_is_counted_lost_first_by_its_deadline() {
        // Worker 1 is granted at 100 (deadline 900), paused 150..2000; worker 2 is granted at
        // 1000 and writes at 1050; worker 1 writes at 2010 (stale), then its release is refused.
        let mut d = data(
            vec![
                (
                    1,
                    vec![
                        granted(1, 100, 1, 900),
                        Event::Lost {
                            hold: 1,
                            at: 2001,
                            reason: "x".into(),
                        },
                        released(1, 2020, ReleaseResult::NotOwner),
                    ],
                ),
                (
                    2,
                    vec![
                        granted(1, 1000, 2, 1900),
                        released(1, 1100, ReleaseResult::Ok),
                    ],
                ),
            ],
            vec![
                write(2, 1, 2, 1000, 1050, true),
                write(1, 1, 1, 100, 2010, true),
            ],
            1,
        );
        d.faults.push(FaultRecord {
            kind: "pause".into(),
            worker: Some(1),
            at: 150,
            until: Some(2000),
            detail: String::new(),
        });
        let f = analyze(&d);
        assert_eq!((f.stale_writes, f.stale_accepted, f.overlaps), (1, 1, 1));
        assert_eq!(f.lost_updates, 1);
        assert_eq!((f.taken_over, f.lost_first), (1, 1));
        assert_eq!(f.releases_not_owner, 1);
        assert_eq!(f.pause_takeover_ms, vec![0.85]);
        assert_eq!(f.taken_over_during_pause, 1);
        // Enforcing: the same stale write refused is no overlap.
        d.writes[1].accepted = false;
        let f = analyze(&d);
        assert_eq!((f.stale_rejected, f.stale_accepted, f.overlaps), (1, 0, 0));
    }

    #[test]
    fn a_late_write_before_the_newer_holder_touched_anything_is_not_stale() {
        // Worker 2 is granted at 1000 but reads only at 1030; worker 1's late write lands at
        // 1010: serialised before worker 2's read, it harms nothing. At 1040 it would be stale.
        let mut d = data(
            vec![
                (
                    1,
                    vec![
                        granted(1, 100, 1, 900),
                        released(1, 1020, ReleaseResult::NotOwner),
                    ],
                ),
                (
                    2,
                    vec![
                        granted(1, 1000, 2, 1900),
                        released(1, 1100, ReleaseResult::Ok),
                    ],
                ),
            ],
            vec![
                write(1, 1, 1, 100, 1010, true),
                write(2, 1, 2, 1000, 1050, true),
            ],
            2,
        );
        d.reads.push(ReadRecord {
            worker: 2,
            hold: 1,
            token: Some(2),
            at: 1030,
        });
        assert_eq!(analyze(&d).stale_writes, 0);
        d.writes[0].at = 1040;
        assert_eq!(analyze(&d).stale_accepted, 1);
    }

    #[test]
    fn takeover_without_lost_a_token_regression_and_a_foreign_release_are_caught() {
        // Worker 1 holds from 100 (deadline 5000) and is never told; worker 2 is granted at 200
        // with a lower token; worker 1 then releases OK while worker 2 still holds.
        let d = data(
            vec![
                (
                    1,
                    vec![
                        granted(1, 100, 7, 5000),
                        released(1, 300, ReleaseResult::Ok),
                    ],
                ),
                (
                    2,
                    vec![
                        granted(1, 200, 3, 5000),
                        released(1, 400, ReleaseResult::Ok),
                    ],
                ),
            ],
            vec![],
            0,
        );
        let f = analyze(&d);
        assert_eq!((f.taken_over, f.lost_first), (1, 0));
        assert_eq!(f.token_regressions, 1);
        assert_eq!(f.foreign_releases, 1);
        // The report of the failure shows both holds, the taker after the one it found live.
        let t = timeline(&d, 10);
        assert_eq!(t.len(), 2, "{t:?}");
        assert!(
            t[0].starts_with("+0.0 ms: worker 1 hold 1 granted, token 7"),
            "{t:?}"
        );
        assert!(t[0].contains("release +0.2 Ok"), "{t:?}");
        assert!(
            t[1].starts_with("+0.1 ms: worker 2 hold 1 granted, token 3"),
            "{t:?}"
        );
        assert_eq!(timeline(&d, 1).len(), 1);
    }

    #[test]
    fn takeover_time_after_a_kill() {
        let mut d = data(
            vec![
                (1, vec![granted(1, 100, 1, 1100)]),
                (2, vec![granted(1, 1300, 2, 2300)]),
            ],
            vec![],
            0,
        );
        d.faults.push(FaultRecord {
            kind: "kill".into(),
            worker: Some(1),
            at: 200,
            until: None,
            detail: String::new(),
        });
        let f = analyze(&d);
        assert_eq!(f.takeover_ms, vec![1.1]);
        assert_eq!(f.taken_over, 0, "a killed holder ends at the kill");
        // A kill between two holds has no takeover to time.
        d.faults[0].at = 2400;
        d.faults[0].worker = Some(2);
        d.events
            .get_mut(&2)
            .unwrap()
            .push(released(1, 2350, ReleaseResult::Ok));
        let f = analyze(&d);
        assert!(f.takeover_ms.is_empty());
        assert_eq!(f.kills_between_holds, 1);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.0));
    }

    #[test]
    fn a_master_fault_times_the_failover_and_the_next_grant() {
        // A hold from 100 to 5000; the master is killed at 1000, the fail-over is over at 3000,
        // the next grant comes at 5200 after a refused one. A second fault at 6000 has no grant.
        let mut d = data(
            vec![
                (
                    1,
                    vec![
                        granted(1, 100, 1, 1100),
                        Event::Lost {
                            hold: 1,
                            at: 1100,
                            reason: "x".into(),
                        },
                        released(1, 5000, ReleaseResult::Lost),
                    ],
                ),
                (
                    2,
                    vec![
                        Event::Error {
                            at: 4000,
                            what: "redis at …: the grant of \"n\" was confirmed by 0 of the 1 \
                                   replicas asked for within 500ms (WAIT); it was rolled back"
                                .into(),
                        },
                        granted(1, 5200, 2, 6200),
                    ],
                ),
            ],
            vec![],
            0,
        );
        for (kind, at, until) in [("master-kill", 1000, 3000), ("slot-migrate", 6000, 6500)] {
            d.faults.push(FaultRecord {
                kind: kind.into(),
                worker: Some(1),
                at,
                until: Some(until),
                detail: String::new(),
            });
        }
        let f = analyze(&d);
        assert_eq!((f.failovers, f.failovers_during_hold), (2, 2));
        assert_eq!(f.failover_ms, vec![0.5, 2.0]);
        assert_eq!(f.outage_ms, vec![4.2]);
        assert_eq!(f.outage_missing, 1);
        assert_eq!((f.lost, f.wait_refusals, f.errors), (1, 1, 1));
        assert!(f.takeover_ms.is_empty(), "a master fault is no holder kill");
    }

    #[test]
    fn each_kill_of_a_workers_dlock_run_ends_the_hold_it_found() {
        // Worker 1 survives its `dlock run` being killed twice (holds 1 and 2).
        let mut d = data(
            vec![
                (1, vec![granted(1, 100, 1, 1100), granted(2, 2000, 3, 3000)]),
                (
                    2,
                    vec![
                        granted(1, 1300, 2, 2300),
                        released(1, 1900, ReleaseResult::Ok),
                        granted(2, 3300, 4, 4300),
                    ],
                ),
            ],
            vec![],
            0,
        );
        for at in [200, 2100] {
            d.faults.push(FaultRecord {
                kind: "run-kill".into(),
                worker: Some(1),
                at,
                until: None,
                detail: String::new(),
            });
        }
        let f = analyze(&d);
        assert_eq!(f.taken_over, 0, "both killed holds end at their kill");
        assert_eq!(f.takeover_ms, vec![1.1, 1.2]);
    }
}
