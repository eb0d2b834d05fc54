//! The figures table (Markdown) and the JSON report of a chaos run.

use crate::analysis::percentile;
use crate::run::{Outcome, Settings, Status};
use serde::Serialize;

/// Where and how a run was made.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub date: String,
    pub cpus: usize,
    pub kernel: String,
    pub dlock_version: &'static str,
}

impl Machine {
    /// Reads this machine's description.
    pub fn here() -> Machine {
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!("Linux {}", s.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.to_string());
        Machine {
            date,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            dlock_version: env!("CARGO_PKG_VERSION"),
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub settings: Settings,
    pub command: String,
    pub outcomes: Vec<Outcome>,
    /// Backends whose servers could not be started, with the reason.
    pub setup_errors: Vec<(String, String)>,
}

impl Report {
    /// True when nothing failed.
    pub fn ok(&self) -> bool {
        self.setup_errors.is_empty() && self.outcomes.iter().all(|o| o.verdict() != "FAIL")
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.0}"))
}

/// The figures as a Markdown table, then the checks that did not pass.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let lanes = if r.settings.lanes > 1 {
        format!(" in each of {} lanes (lock names)", r.settings.lanes)
    } else {
        String::new()
    };
    let more = if r.settings.min_acquisitions > 0 {
        format!(
            " (more until {} acquisitions, at most {})",
            r.settings.min_acquisitions,
            u64::from(r.settings.faults) * 20
        )
    } else {
        String::new()
    };
    let long = if r.settings.long_share < 100 {
        format!(
            "{} % of the holds {} ms",
            r.settings.long_share,
            r.settings.long_hold.as_millis()
        )
    } else {
        format!("{} ms", r.settings.long_hold.as_millis())
    };
    s.push_str(&format!(
        "dlock-chaos on {} ({} CPUs, {}), {} client processes{lanes}, lease {} ms, mean hold {} ms ({long} in the store-side fault scenarios), {} faults per scenario{more}, {} ms before each\n\n",
        r.machine.date,
        r.machine.cpus,
        r.machine.kernel,
        r.settings.workers,
        r.settings.lease.as_millis(),
        r.settings.hold.as_millis(),
        r.settings.faults,
        r.settings.gap.as_millis(),
    ));
    s.push_str("| backend | fault | resource | faults | acquisitions | writes | overlaps | stale rejected | stale accepted | valid rejected | lost updates | token regressions | foreign releases | takeover p50 / max ms (of kills) | lost() first | verdict |\n");
    s.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for o in &r.outcomes {
        let x = &o.figures;
        let takeover = if x.takeover_ms.is_empty() && x.takeover_missing == 0 {
            "–".to_string()
        } else {
            format!(
                "{} / {} (of {}){}",
                opt(x.takeover_p50()),
                opt(x.takeover_max()),
                x.takeover_ms.len() as u64 + x.takeover_missing,
                if x.takeover_missing > 0 {
                    format!(" ({} never)", x.takeover_missing)
                } else {
                    String::new()
                }
            )
        };
        let lost = match x.lost_first_pct() {
            Some(p) => format!("{p:.0} % ({}/{})", x.lost_first, x.taken_over),
            None => "–".into(),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            o.backend.label(),
            o.fault.label(),
            o.mode,
            o.faults.len(),
            x.acquisitions,
            x.writes,
            x.overlaps,
            x.stale_rejected,
            x.stale_accepted,
            x.valid_rejected,
            x.lost_updates,
            x.token_regressions,
            x.foreign_releases,
            takeover,
            lost,
            o.verdict()
        ));
    }
    let failovers: Vec<&Outcome> = r
        .outcomes
        .iter()
        .filter(|o| o.figures.failovers > 0)
        .collect();
    if !failovers.is_empty() {
        s.push_str("\nRedis fail-overs: from each fault to the store's recovery as the harness saw it (Sentinel: every sentinel names another master that answers as one; Cluster: every node says cluster_state:ok and none gives the old master a slot; the paused master is continued then; the slot moved), and to the next grant (\"no grant\": the store unavailable, or the rest of a hold that outlived the fault, as a slot migration's do). Before the next fault, the killed or paused node is a replica again. Acquire errors include the attempts refused because no replica confirmed them (WAIT).\n\n");
        s.push_str("| backend | fault | faults (a hold live) | fail-over p50 / max ms | no grant p50 / max ms | acquire errors | of which WAIT refusals | holds lost |\n");
        s.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
        for o in failovers {
            let x = &o.figures;
            let pair =
                |v: &[f64]| format!("{} / {}", opt(percentile(v, 0.5)), opt(v.last().copied()));
            let never = if x.outage_missing > 0 {
                format!(" ({} never)", x.outage_missing)
            } else {
                String::new()
            };
            s.push_str(&format!(
                "| {} | {} | {} ({}) | {} | {}{never} | {} | {} | {} |\n",
                o.backend.label(),
                o.fault.label(),
                x.failovers,
                x.failovers_during_hold,
                pair(&x.failover_ms),
                pair(&x.outage_ms),
                x.errors,
                x.wait_refusals,
                x.lost
            ));
        }
    }
    let mut notes = String::new();
    for o in &r.outcomes {
        for c in &o.checks {
            let tag = match c.status {
                Status::Pass => continue,
                Status::Fail => "FAIL",
                Status::Documented => "documented",
            };
            notes.push_str(&format!(
                "- {} / {} / {}: {tag}: {} — {}\n",
                o.backend.label(),
                o.fault.label(),
                o.mode,
                c.what,
                c.detail
            ));
        }
        for e in &o.harness_errors {
            notes.push_str(&format!(
                "- {} / {} / {}: FAIL: harness: {e}\n",
                o.backend.label(),
                o.fault.label(),
                o.mode
            ));
        }
    }
    for (b, e) in &r.setup_errors {
        notes.push_str(&format!("- {b}: FAIL: servers did not start: {e}\n"));
    }
    if !notes.is_empty() {
        s.push_str("\nNot passed:\n\n");
        s.push_str(&notes);
    }
    for o in r.outcomes.iter().filter(|o| !o.timeline.is_empty()) {
        s.push_str(&format!(
            "\nTimeline of {} / {} / {} (ms from the first grant; the holds another grant \
             found live, and the faults):\n\n",
            o.backend.label(),
            o.fault.label(),
            o.mode
        ));
        for l in &o.timeline {
            s.push_str(&format!("- {l}\n"));
        }
    }
    s
}
