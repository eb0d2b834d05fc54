//! The Markdown report (results.md and stdout).

use super::stats::{fmt_bytes, fmt_us, Lat};
use super::store::Syncs;
use super::workloads::{Contended, Lib};
use super::{Report, TargetReport};
use serde::Serialize;
use std::fmt::Write;

/// The unit of a compared figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Microseconds (a latency).
    Us,
    /// Acquisitions per second.
    PerS,
    /// Store commands per acquisition.
    Commands,
    /// Jain's index.
    Index,
}

impl Unit {
    fn show(self, v: f64) -> String {
        match self {
            Unit::Us => fmt_us(v),
            Unit::PerS => format!("{v:.0}/s"),
            Unit::Commands => format!("{v:.1}"),
            Unit::Index => format!("{v:.3}"),
        }
    }
}

/// dlock against the best peer on one figure of one store.
#[derive(Debug, Clone, Serialize)]
pub struct VsPeer {
    /// The figure (`U1 p50`, `C1 8 waiters, 1 ms hold: acq/s`, …).
    pub figure: String,
    /// Its unit.
    pub unit: Unit,
    /// Whether higher is better (acq/s, Jain) rather than lower (latencies, commands).
    pub higher_is_better: bool,
    /// dlock's value.
    pub dlock: f64,
    /// The peer with the best value.
    pub best_peer: Lib,
    /// Its value.
    pub best: f64,
    /// dlock / the best peer.
    pub ratio: f64,
    /// dlock is at least as good as the best peer.
    pub dlock_ahead: bool,
    /// Every peer's value.
    pub peers: Vec<(Lib, f64)>,
}

/// The figures of one store where dlock and at least one peer have a value, each with the best
/// peer's value and dlock's ratio to it.
pub fn vs_best_peer(t: &TargetReport) -> Vec<VsPeer> {
    let mut out = Vec::new();
    let mut add = |figure: String, unit: Unit, higher: bool, vals: Vec<(Lib, Option<f64>)>| {
        let Some(dlock) = vals
            .iter()
            .find(|(l, _)| *l == Lib::Dlock)
            .and_then(|(_, v)| *v)
        else {
            return;
        };
        let peers: Vec<(Lib, f64)> = vals
            .into_iter()
            .filter(|(l, _)| *l != Lib::Dlock)
            .filter_map(|(l, v)| Some((l, v.filter(|v| v.is_finite())?)))
            .collect();
        let better = |a: f64, b: f64| if higher { a > b } else { a < b };
        let Some(&(best_peer, best)) = peers
            .iter()
            .reduce(|a, b| if better(b.1, a.1) { b } else { a })
        else {
            return;
        };
        if best <= 0.0 {
            return;
        }
        out.push(VsPeer {
            figure,
            unit,
            higher_is_better: higher,
            dlock,
            best_peer,
            best,
            ratio: dlock / best,
            dlock_ahead: !better(best, dlock),
            peers,
        });
    };
    let lat = |l: &Lat, f: fn(&Lat) -> f64| (l.n > 0).then(|| f(l));
    let p50: fn(&Lat) -> f64 = |l| l.p50_us;
    let p99: fn(&Lat) -> f64 = |l| l.p99_us;
    let max: fn(&Lat) -> f64 = |l| l.max_us;
    for (what, f) in [("p50", p50), ("p99", p99)] {
        let vals = t.u1.iter().map(|u| (u.lib, lat(&u.lat, f))).collect();
        add(format!("U1 {what}"), Unit::Us, false, vals);
    }
    let mut configs: Vec<(u32, u64)> =
        t.c1.iter()
            .filter(|c| c.lib == Lib::Dlock)
            .map(|c| (c.waiters, c.hold_ms))
            .collect();
    configs.dedup();
    for (w, h) in configs {
        let runs: Vec<&Contended> =
            t.c1.iter()
                .filter(|c| c.waiters == w && c.hold_ms == h && !c.fair)
                .collect();
        let c1 = |what: &str| format!("C1 {w} waiters, {h} ms hold: {what}");
        let of = |f: &dyn Fn(&Contended) -> Option<f64>| -> Vec<(Lib, Option<f64>)> {
            runs.iter().map(|c| (c.lib, f(c))).collect()
        };
        add(c1("acq/s"), Unit::PerS, true, of(&|c| Some(c.acq_per_s)));
        for (what, f) in [("wait p50", p50), ("wait p99", p99), ("wait max", max)] {
            add(c1(what), Unit::Us, false, of(&|c| lat(&c.wait, f)));
        }
        add(
            c1("store cmds / acq"),
            Unit::Commands,
            false,
            of(&|c| c.store_cmds_per_acq.filter(|_| c.acquisitions > 0)),
        );
        add(
            c1("Jain"),
            Unit::Index,
            true,
            of(&|c| (c.acquisitions > 0).then_some(c.jain_acquisitions)),
        );
    }
    for (what, f) in [("p50", p50), ("p99", p99)] {
        let vals =
            t.h1.iter()
                .map(|h| (h.lib, lat(&h.run.handoff_cross, f)))
                .collect();
        add(format!("H1 hand-off {what}"), Unit::Us, false, vals);
    }
    out
}

fn met(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "—",
    }
}

/// F1's cell of the targets table: max/mean wait (judged against the ≤ 2 unrounded) and Jain.
fn f1_cell(max_over_mean: f64, jain: f64) -> String {
    format!(
        "{max_over_mean:.2}, {jain:.3} {}",
        met(Some(max_over_mean <= F1_TARGET))
    )
}

/// F1's target: the longest fair wait at most this many times the mean.
const F1_TARGET: f64 = 2.0;

/// What an empty cell says: the workload failed, or was not asked for (`--only`).
fn missing(r: &Report, w: &str) -> String {
    if r.plan.only.iter().any(|o| o == w) {
        "error".into()
    } else {
        "not run".into()
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "n/a".into())
}

/// A run's store log syncs: count, mean, longest.
fn syncs(x: &Syncs) -> String {
    format!(
        "{}, {}, {}",
        x.count,
        opt(x.mean_ms, |v| format!("{v:.2} ms")),
        opt(x.max_ms, |v| format!(
            "{}{v:.0} ms",
            if x.max_is_bound { "≤ " } else { "" }
        ))
    )
}

fn c1_of(t: &TargetReport, lib: Lib, w: u32, h: u64) -> Option<&Contended> {
    t.c1.iter()
        .find(|c| c.lib == lib && c.waiters == w && c.hold_ms == h)
}

/// Renders the report.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let m = &r.machine;
    let _ = writeln!(
        s,
        "# dlock bench{}\n",
        if r.quick {
            " (--quick: a smoke test, not a measurement)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "- date: {} · took {:.0} s · command: `{}`",
        r.date, r.duration_s, r.command
    );
    let _ = writeln!(
        s,
        "- machine: {} CPUs ({}), {} MiB, Linux {}",
        m.cpus, m.cpu_model, m.mem_mib, m.kernel
    );
    let v: Vec<String> = r.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(s, "- versions: {}", v.join(", "));
    for t in &r.targets {
        let _ = writeln!(
            s,
            "- store `{}`: {} ({})",
            t.label,
            t.url,
            t.server.as_deref().unwrap_or("version unknown")
        );
    }
    s.push('\n');

    s.push_str("## Targets\n\n");
    s.push_str(
        "| store | U1 p50: dlock / raw floor (≤ 1.2×) | C1 8 waiters, 1 ms hold: % of ideal (≥ 95 %, with Jain ≥ 0.98 and wait max ≤ 10 × p50) | C1 64 waiters, 1 ms hold | H1 hand-off p50 in raw round trips (≤ 2 on Redis, PostgreSQL) | F1 fair: max/mean wait (≤ 2), Jain | S1: most names held at once (100 000, none lost), connections constant |\n|---|---|---|---|---|---|---|\n",
    );
    for t in &r.targets {
        let u1 = t.u1.iter().find(|u| u.lib == Lib::Dlock);
        let u1s = u1
            .map(|u| {
                format!(
                    "{} / {} = {:.2}× {}",
                    fmt_us(u.lat.p50_us),
                    fmt_us(u.floor.p50_us),
                    u.ratio_p50,
                    met(Some(u.target_met))
                )
            })
            .unwrap_or_else(|| missing(r, "u1"));
        let c = |w| {
            c1_of(t, Lib::Dlock, w, 1)
                .map(|c| {
                    format!(
                        "{:.0}/s of {} = {}, Jain {:.3}, max {:.1} × p50 {}",
                        c.acq_per_s,
                        opt(c.ideal_acq_per_s, |v| format!("{v:.0}/s")),
                        opt(c.pct_of_ideal, |v| format!("{v:.0} %")),
                        c.jain_acquisitions,
                        c.wait.max_us / c.wait.p50_us.max(1e-9),
                        met(c.target_met)
                    )
                })
                .unwrap_or_else(|| missing(r, "c1"))
        };
        let h1 =
            t.h1.iter()
                .find(|h| h.lib == Lib::Dlock)
                .map(|h| {
                    format!(
                        "{} = {:.1} RTT (RTT {}) {}",
                        fmt_us(h.run.handoff_cross.p50_us),
                        h.p50_in_rtt,
                        fmt_us(h.rtt_us),
                        met(h.target_met)
                    )
                })
                .unwrap_or_else(|| missing(r, "h1"));
        let f1 =
            t.f1.as_ref()
                .map(|f| f1_cell(f.run.max_over_mean_wait, f.run.jain_acquisitions))
                .unwrap_or_else(|| "n/a".into());
        let s1 =
            t.s1.as_ref()
                .map(|x| {
                    let top = x.levels.iter().max_by_key(|l| l.held);
                    format!(
                        "{} held{}, {}",
                        top.map(|l| l.held).unwrap_or(0),
                        top.filter(|l| l.lost > 0)
                            .map(|l| format!(" (**{} lost**)", l.lost))
                            .unwrap_or_default(),
                        if x.conns_constant { "yes" } else { "**no**" }
                    )
                })
                .unwrap_or_else(|| missing(r, "s1"));
        let _ = writeln!(
            s,
            "| {} | {u1s} | {} | {} | {h1} | {f1} | {s1} |",
            t.label,
            c(8),
            c(64)
        );
    }
    s.push_str(
        "\nIdeal C1 throughput = 1 / (measured mean hold + the raw floor of U1, i.e. one release \
         and one grant at raw store speed). A raw round trip (RTT) = half the U1 floor. H1 counts \
         only hand-offs to a waiter in another process (the store's wake-up), from the moment \
         the holder starts releasing to the waiter's grant.\n\n",
    );

    s.push_str(&per_store(r));

    if r.targets.iter().any(|t| !t.vs_best_peer.is_empty()) {
        s.push_str("## dlock against the best peer\n\n");
        s.push_str("| store | figure | dlock | best peer | dlock / best peer | dlock ahead | every peer |\n|---|---|---|---|---|---|---|\n");
        for t in &r.targets {
            for v in &t.vs_best_peer {
                let every: Vec<String> = v
                    .peers
                    .iter()
                    .map(|(l, x)| format!("{} {}", l.name(), v.unit.show(*x)))
                    .collect();
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} {} | {:.2}× | {} | {} |",
                    t.label,
                    v.figure,
                    v.unit.show(v.dlock),
                    v.best_peer.name(),
                    v.unit.show(v.best),
                    v.ratio,
                    if v.dlock_ahead { "yes" } else { "**no**" },
                    every.join(", ")
                );
            }
        }
        s.push_str(
            "\nThe best peer of each figure is the one with the lowest latency or store commands, \
             or the highest acq/s or Jain index, on that store in this run; the ratio is dlock's \
             figure over it (below 1× is ahead for latencies and commands, above 1× for acq/s \
             and Jain).\n\n",
        );
    }

    s.push_str("## U1 uncontended (one task, acquire + release)\n\n");
    s.push_str("| store | client | p50 | p99 | pairs/s | raw floor p50 | floor p99 | p50 ratio | mean ratio | 2× SELECT 1 p50 | backend calls per pair | floor |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for t in &r.targets {
        for u in &t.u1 {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.0} | {} | {} | {:.2}× | {:.2}× | {} | {} | {} |",
                t.label,
                u.lib.label(),
                fmt_us(u.lat.p50_us),
                fmt_us(u.lat.p99_us),
                u.ops_per_s,
                fmt_us(u.floor.p50_us),
                fmt_us(u.floor.p99_us),
                u.ratio_p50,
                u.ratio_mean,
                u.ping
                    .map(|p| fmt_us(p.p50_us))
                    .unwrap_or_else(|| "—".into()),
                opt(u.client_ops_per_pair, |v| format!("{v:.2}")),
                u.floor_what
            );
        }
    }

    s.push_str("\n## C1 contended (one name, waiters over 4 processes)\n\n");
    s.push_str("| store | client | waiters | hold | acq/s | ideal | % ideal | wait p50 | wait p99 | wait max | hand-off p50 | store cmds / acq | backend calls / acq | Jain | overlaps | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for t in &r.targets {
        for c in &t.c1 {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} ms | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {} | {} |",
                t.label,
                c.lib.label(),
                c.waiters,
                c.hold_ms,
                c.acq_per_s,
                opt(c.ideal_acq_per_s, |v| format!("{v:.0}")),
                opt(c.pct_of_ideal, |v| format!("{v:.0} %")),
                fmt_us(c.wait.p50_us),
                fmt_us(c.wait.p99_us),
                fmt_us(c.wait.max_us),
                if c.handoff.n > 0 { fmt_us(c.handoff.p50_us) } else { "—".into() },
                opt(c.store_cmds_per_acq, |v| format!("{v:.1}")),
                opt(c.client_ops_per_acq, |v| format!("{v:.1}")),
                c.jain_acquisitions,
                c.overlaps,
                c.errors
            );
        }
    }

    s.push_str("\n## H1 hand-off latency (2 processes × 1 waiter taking turns: hold 1 ms, 0.3 ms outside)\n\n");
    s.push_str("| store | client | cross-process hand-offs | p50 | p99 | raw RTT | p50 in RTT | p99 in RTT | target | SELECT 1 RTT | p50 in SELECT 1 RTT |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for t in &r.targets {
        for h in &t.h1 {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {} |",
                t.label,
                h.lib.label(),
                h.run.handoff_cross.n,
                fmt_us(h.run.handoff_cross.p50_us),
                fmt_us(h.run.handoff_cross.p99_us),
                fmt_us(h.rtt_us),
                h.p50_in_rtt,
                h.p99_in_rtt,
                met(h.target_met),
                h.ping_rtt_us.map(fmt_us).unwrap_or_else(|| "—".into()),
                opt(h.p50_in_ping_rtt, |v| format!("{v:.1}"))
            );
        }
    }

    s.push_str("\n## F1 fairness (8 waiters over 4 processes, hold 1 ms)\n\n");
    s.push_str("| store | fair: acq/s | fair: max/mean wait | the longest wait's request, s after the start | fair: max/mean of the requests after the first 0.5 s | fair: Jain (acquisitions per waiter) | not fair: max/mean wait | not fair: Jain | the store's log syncs over the fair run: count, mean, longest |\n|---|---|---|---|---|---|---|---|---|\n");
    for t in &r.targets {
        if let Some(f) = &t.f1 {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.1} | {:.2} | {} | {:.3} | {} | {} | {} |",
                t.label,
                f.run.acq_per_s,
                f.run.max_over_mean_wait,
                f.run.wait_max_at_s,
                opt(f.run.max_over_mean_wait_after_start, |v| format!("{v:.1}")),
                f.run.jain_acquisitions,
                f.unfair
                    .as_ref()
                    .map(|u| format!("{:.1}", u.max_over_mean_wait))
                    .unwrap_or_else(|| "—".into()),
                f.unfair
                    .as_ref()
                    .map(|u| format!("{:.3}", u.jain_acquisitions))
                    .unwrap_or_else(|| "—".into()),
                f.run
                    .store_syncs
                    .as_ref()
                    .map(syncs)
                    .unwrap_or_else(|| "—".into()),
            );
        }
    }
    for t in r.targets.iter().filter(|t| t.f1.is_some()) {
        if let Some(w) = &t.syncs_what {
            let _ = writeln!(s, "\n{}: log syncs are {w}.", t.label);
        }
    }

    s.push_str("\n## S1 many locks held by one client\n\n");
    s.push_str("| store | names | held | acquire time | client RSS / hold | store memory / hold | connections before → holding | extend calls/s | holds renewed/s | store cmds/s | store keep-alives/s | lost |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for t in &r.targets {
        if let Some(x) = &t.s1 {
            for l in &x.levels {
                let _ = writeln!(
                    s,
                    "| {} | {} | {}{} | {:.2} s | {} | {} | {} → {} | {:.1} | {:.0} | {} | {} | {} |",
                    t.label,
                    l.names,
                    l.held,
                    if l.complete { "" } else { " (time limit)" },
                    l.acquire_s,
                    fmt_bytes(l.client_bytes_per_hold),
                    opt(l.store_bytes_per_hold, fmt_bytes),
                    l.conns_before,
                    l.conns_after,
                    l.extend_calls_per_s,
                    l.holds_renewed_per_s,
                    opt(l.store_cmds_per_s, |v| format!("{v:.0}")),
                    opt(l.store_keepalives_per_s, |v| format!("{v:.2}")),
                    l.lost
                );
            }
        }
    }
    if let Some(x) = r.targets.iter().find_map(|t| t.s1.as_ref()) {
        let _ = writeln!(
            s,
            "\nS1 holds use a {} ms lease (renewed every third of it, batched per client).",
            x.lease_ms
        );
    }

    if let Some(e) = r.targets.iter().find_map(|t| t.e1.as_ref()) {
        let _ = writeln!(
            s,
            "\n## E1 election fail-over (a leader process SIGKILLed, a standby process campaigning; term {} ms)\n",
            e.term_ms
        );
    } else {
        s.push_str("\n## E1 election fail-over (a leader process SIGKILLed, a standby process campaigning)\n\n");
    }
    s.push_str("| store | term | fail-overs | p50 | max | min | p50 / term | terms increasing |\n|---|---|---|---|---|---|---|---|\n");
    for t in &r.targets {
        if let Some(e) = &t.e1 {
            let _ = writeln!(
                s,
                "| {} | {} ms | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.2} | {} |",
                t.label,
                e.term_ms,
                e.failover_ms.len(),
                e.p50_ms,
                e.max_ms,
                e.min_ms,
                e.p50_in_terms,
                if e.terms.iter().all(Option::is_none) {
                    "— (no fencing)"
                } else if e.terms_increasing {
                    "yes"
                } else {
                    "**no**"
                }
            );
        }
    }
    s.push_str(
        "\nFail-over = from the SIGKILL of the leader to the standby's grant (both timestamps \
         CLOCK_REALTIME of one machine). A killed leader cannot resign: its lease (renewed every \
         third of it) must run out, so up to one term; a store that ends the hold with the \
         process's session (SQL session mode) hands over at once.\n",
    );

    if let Some(x) = r.targets.iter().find_map(|t| t.t1.as_ref()) {
        let _ = writeln!(
            s,
            "\n## T1 striped throughput ({} waiters over {} processes, {} rounds each, hold {} ms, random keys of {})\n",
            x.waiters, x.procs, x.rounds, x.hold_ms, x.keys
        );
    } else {
        s.push_str("\n## T1 striped throughput (one name against a striped lock)\n\n");
    }
    s.push_str("| store | lock | acquisitions | span | acq/s | b / a | wait p50 | wait p99 | names used | store cmds / acq | backend calls / acq | overlaps | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for t in &r.targets {
        if let Some(x) = &t.t1 {
            for (lock, run, ratio) in [
                ("(a) one name".to_string(), &x.one_name, "".to_string()),
                (
                    format!("(b) striped({})", x.striped.stripes),
                    &x.striped,
                    format!("{:.2}×", x.ratio),
                ),
            ] {
                let _ = writeln!(
                    s,
                    "| {} | {lock} | {}{} | {:.2} s | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    t.label,
                    run.acquisitions,
                    if run.complete { "" } else { " (time limit)" },
                    run.span_s,
                    run.acq_per_s,
                    if ratio.is_empty() { "—".into() } else { ratio },
                    fmt_us(run.wait.p50_us),
                    fmt_us(run.wait.p99_us),
                    run.names_used,
                    opt(run.store_cmds_per_acq, |v| format!("{v:.1}")),
                    opt(run.client_ops_per_acq, |v| format!("{v:.1}")),
                    run.overlaps,
                    run.errors
                );
            }
        }
    }

    s.push_str("\n## What the store-side figures count\n\n");
    for t in &r.targets {
        let _ = writeln!(
            s,
            "- {}: commands = {}; memory = {}{}; background before the run: {:.0}/s (subtracted)",
            t.label,
            t.commands_what,
            t.memory_what,
            t.keepalives_what
                .as_deref()
                .map(|k| format!("; keep-alives = {k}"))
                .unwrap_or_default(),
            t.background_cmds_per_s
        );
        if let Some((before, after)) = &t.sql_state {
            let _ = writeln!(
                s,
                "  - {}: the server before the workloads: {before}; after: {after} (a long \
                 transaction slows every grant of a busy name: docs/BACKENDS.md)",
                t.label
            );
        }
    }
    let errs: Vec<String> = r
        .targets
        .iter()
        .flat_map(|t| t.errors.iter().map(move |e| format!("- {}: {e}", t.label)))
        .collect();
    if !errs.is_empty() {
        s.push_str("\n## Not measured\n\n");
        s.push_str(&errs.join("\n"));
        s.push('\n');
    }
    s
}

/// One row of a store's side-by-side table: the figure, dlock's value, the raw floor's (or the
/// ideal), each peer's, and dlock against the best peer.
struct Row {
    figure: String,
    dlock: String,
    floor: String,
    peers: Vec<(Lib, String)>,
    vs_best: String,
}

/// "## Per store": for every store one table with dlock, the raw floor and every peer side by
/// side, figure by figure, and dlock against the best peer where a peer ran.
fn per_store(r: &Report) -> String {
    let mut s = String::from(
        "## Per store: dlock, the raw floor and the peers side by side\n\n\
         The raw floor is the same client library doing the same round trips without lock logic \
         (for C1 the ideal throughput it implies); \"dlock / best peer\" divides dlock's value by \
         the best peer's (below 1 is better for times and commands, above 1 for rates and Jain). \
         Figures without a peer row were run for dlock only.\n",
    );
    for t in &r.targets {
        let mut peers: Vec<Lib> = Vec::new();
        let libs =
            t.u1.iter()
                .map(|u| u.lib)
                .chain(t.c1.iter().map(|c| c.lib))
                .chain(t.h1.iter().map(|h| h.lib));
        for l in libs {
            if l != Lib::Dlock && !peers.contains(&l) {
                peers.push(l);
            }
        }
        let vs = |figure: &str| {
            t.vs_best_peer
                .iter()
                .find(|v| v.figure == figure)
                .map(|v| format!("{:.2} ({})", v.ratio, v.best_peer.name()))
                .unwrap_or_else(|| "—".into())
        };
        let mut rows = Vec::new();
        let peer_vals = |f: &dyn Fn(Lib) -> Option<String>| -> Vec<(Lib, String)> {
            peers
                .iter()
                .map(|l| (*l, f(*l).unwrap_or_else(|| "—".into())))
                .collect()
        };
        let u1 = |l: Lib| t.u1.iter().find(|u| u.lib == l && u.lat.n > 0);
        if let Some(d) = u1(Lib::Dlock) {
            let p50: fn(&Lat) -> f64 = |l| l.p50_us;
            let p99: fn(&Lat) -> f64 = |l| l.p99_us;
            for (what, f) in [("p50", p50), ("p99", p99)] {
                rows.push(Row {
                    figure: format!("U1 acquire + release {what}"),
                    dlock: format!(
                        "{} ({:.2}× floor)",
                        fmt_us(f(&d.lat)),
                        f(&d.lat) / f(&d.floor).max(1e-9)
                    ),
                    floor: fmt_us(f(&d.floor)),
                    peers: peer_vals(&|l| u1(l).map(|u| fmt_us(f(&u.lat)))),
                    vs_best: vs(&format!("U1 {what}")),
                });
            }
        }
        let mut configs: Vec<(u32, u64)> =
            t.c1.iter()
                .filter(|c| c.lib == Lib::Dlock && !c.fair)
                .map(|c| (c.waiters, c.hold_ms))
                .collect();
        configs.sort_by_key(|(w, h)| (std::cmp::Reverse(*h), *w));
        configs.dedup();
        for (w, h) in configs {
            let c = |l: Lib| {
                t.c1.iter()
                    .find(|c| c.lib == l && c.waiters == w && c.hold_ms == h && !c.fair)
            };
            let Some(d) = c(Lib::Dlock) else { continue };
            let head = format!("C1 {w} waiters, {h} ms hold");
            rows.push(Row {
                figure: format!("{head}: acq/s"),
                dlock: format!(
                    "{:.0}{}",
                    d.acq_per_s,
                    d.pct_of_ideal
                        .map(|p| format!(" ({p:.0} % of ideal)"))
                        .unwrap_or_default()
                ),
                floor: d
                    .ideal_acq_per_s
                    .map(|v| format!("{v:.0} (ideal)"))
                    .unwrap_or_default(),
                peers: peer_vals(&|l| c(l).map(|x| format!("{:.0}", x.acq_per_s))),
                vs_best: vs(&format!("{head}: acq/s")),
            });
            let waits = |x: &Contended| {
                format!(
                    "{} / {} ({:.0}×)",
                    fmt_us(x.wait.p50_us),
                    fmt_us(x.wait.max_us),
                    x.wait.max_us / x.wait.p50_us.max(1e-9)
                )
            };
            rows.push(Row {
                figure: format!("{head}: wait p50 / max"),
                dlock: waits(d),
                floor: String::new(),
                peers: peer_vals(&|l| c(l).map(waits)),
                vs_best: vs(&format!("{head}: wait max")),
            });
            rows.push(Row {
                figure: format!("{head}: Jain"),
                dlock: format!("{:.3}", d.jain_acquisitions),
                floor: String::new(),
                peers: peer_vals(&|l| c(l).map(|x| format!("{:.3}", x.jain_acquisitions))),
                vs_best: vs(&format!("{head}: Jain")),
            });
            if d.store_cmds_per_acq.is_some() {
                rows.push(Row {
                    figure: format!("{head}: store commands / acq"),
                    dlock: opt(d.store_cmds_per_acq, |v| format!("{v:.1}")),
                    floor: String::new(),
                    peers: peer_vals(&|l| {
                        c(l).and_then(|x| x.store_cmds_per_acq)
                            .map(|v| format!("{v:.1}"))
                    }),
                    vs_best: vs(&format!("{head}: store cmds / acq")),
                });
            }
        }
        let h1 = |l: Lib| {
            t.h1.iter()
                .find(|h| h.lib == l && h.run.handoff_cross.n > 0)
        };
        if let Some(d) = h1(Lib::Dlock) {
            rows.push(Row {
                figure: "H1 hand-off p50 (raw round trips)".into(),
                dlock: format!(
                    "{} ({:.1})",
                    fmt_us(d.run.handoff_cross.p50_us),
                    d.p50_in_rtt
                ),
                floor: format!("RTT {}", fmt_us(d.rtt_us)),
                peers: peer_vals(&|l| {
                    h1(l).map(|h| {
                        format!(
                            "{} ({:.1})",
                            fmt_us(h.run.handoff_cross.p50_us),
                            h.p50_in_rtt
                        )
                    })
                }),
                vs_best: vs("H1 hand-off p50"),
            });
        }
        let only = |figure: &str, dlock: String| Row {
            figure: figure.into(),
            dlock,
            floor: String::new(),
            peers: peer_vals(&|_| None),
            vs_best: "—".into(),
        };
        if let Some(f) = &t.f1 {
            rows.push(only(
                "F1 fair: max / mean wait, Jain",
                format!(
                    "{:.1}, {:.3}",
                    f.run.max_over_mean_wait, f.run.jain_acquisitions
                ),
            ));
        }
        if let Some(x) = &t.s1 {
            if let Some(top) = x.levels.iter().max_by_key(|l| l.held) {
                rows.push(only(
                    "S1 most names held at once",
                    format!(
                        "{} of {} in {:.1} s, {} lost, connections {}",
                        top.held,
                        top.names,
                        top.acquire_s,
                        top.lost,
                        if x.conns_constant {
                            "constant"
                        } else {
                            "**not constant**"
                        }
                    ),
                ));
            }
        }
        if let Some(e) = &t.e1 {
            rows.push(only(
                "E1 fail-over p50 / max",
                format!(
                    "{:.0} / {:.0} ms (term {} ms)",
                    e.p50_ms, e.max_ms, e.term_ms
                ),
            ));
        }
        if let Some(x) = &t.t1 {
            rows.push(only(
                "T1 striped(64) / one name",
                format!(
                    "{:.2}× ({:.0} / {:.0} acq/s)",
                    x.ratio, x.striped.acq_per_s, x.one_name.acq_per_s
                ),
            ));
        }
        if rows.is_empty() {
            continue;
        }
        let _ = write!(
            s,
            "\n### {}{}\n\n| figure | dlock | raw floor |",
            t.label,
            t.server
                .as_deref()
                .map(|v| format!(" ({v})"))
                .unwrap_or_default()
        );
        for p in &peers {
            let _ = write!(s, " {} |", p.name());
        }
        s.push_str(" dlock / best peer |\n|---|---|---|");
        for _ in &peers {
            s.push_str("---|");
        }
        s.push_str("---|\n");
        for row in rows {
            let _ = write!(s, "| {} | {} | {} |", row.figure, row.dlock, row.floor);
            for (_, v) in &row.peers {
                let _ = write!(s, " {v} |");
            }
            let _ = writeln!(s, " {} |", row.vs_best);
        }
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::workloads::U1;

    fn u1(lib: Lib, p50: f64) -> U1 {
        let lat = Lat {
            n: 10,
            p50_us: p50,
            p99_us: p50 * 2.0,
            max_us: p50 * 3.0,
            mean_us: p50,
        };
        U1 {
            lib,
            lat,
            ops_per_s: 1e6 / p50,
            floor: lat,
            floor_what: String::new(),
            ping: None,
            ratio_p50: 1.0,
            ratio_mean: 1.0,
            target_met: true,
            client_ops_per_pair: None,
        }
    }

    #[test]
    fn f1_is_judged_unrounded() {
        assert_eq!(f1_cell(2.0006, 1.0), "2.00, 1.000 **not met**");
        assert_eq!(f1_cell(2.0, 0.9994), "2.00, 0.999 met");
        assert_eq!(f1_cell(1.92, 1.0), "1.92, 1.000 met");
    }

    #[test]
    fn dlock_against_the_best_peer() {
        let mut t = TargetReport::default();
        assert!(vs_best_peer(&t).is_empty());
        t.u1 = vec![u1(Lib::Dlock, 150.0)];
        // No peer ran: no figure.
        assert!(vs_best_peer(&t).is_empty());
        t.u1.push(u1(Lib::Rslock, 100.0));
        t.u1.push(u1(Lib::RedisPy, 200.0));
        let v = vs_best_peer(&t);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].figure, "U1 p50");
        assert_eq!(v[0].best_peer, Lib::Rslock);
        assert!((v[0].ratio - 1.5).abs() < 1e-9);
        assert!(!v[0].dlock_ahead);
        assert_eq!(v[0].peers.len(), 2);
        t.u1[0] = u1(Lib::Dlock, 80.0);
        let v = vs_best_peer(&t);
        assert!(v[0].dlock_ahead && v[0].ratio < 1.0, "{v:?}");
    }
}
