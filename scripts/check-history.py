#!/usr/bin/env python3
"""An independent check of dlock-chaos's recorded histories (issue 22).

Reads the raw records `dlock-chaos --events DIR` writes (DIR/BACKEND.FAULT.MODE.json) and
recomputes each scenario's figures from the definitions in docs/RELIABILITY.md ("The figures"),
with code of its own: a bug in the harness's analysis (crates/dlock-chaos/src/analysis.rs) then
shows as a disagreement instead of hiding a bug in the lock.

    check-history.py [--report chaos.json] [--out table.md] DIR
    check-history.py --self-test

With --report, prints per scenario: figure | harness | checker, and exits 1 when a figure both
compute differs. It also judges the safety properties itself and exits 1 when one fails where
the scenario promises it (the report's checks say which scenarios do not: log-only resource,
documented rows, stores without fencing).
"""

import argparse
import json
import os
import sys

NA = "n/a"
KILLS = ("kill", "run-kill")
# The report names faults by serde's kebab-case; the record files by their label.
FAULT_LABEL = {"redlock2-down": "2-of-5-down", "redlock3-down": "3-of-5-down"}


class Hold:
    """One grant: from its `granted` event to its end (see `live`)."""

    def __init__(self, worker, ev):
        self.key = (worker, ev["hold"])
        self.worker = worker
        self.granted = ev["at"]
        self.token = ev.get("token")
        self.deadlines = [(ev["at"], ev["deadline"])]
        self.lost = None
        self.release = None  # (sent at, result)
        self.end = None

    def live(self, t):
        """Live from the grant (exclusive) until the release was sent, the process was killed
        or the run ended (exclusive)."""
        return self.granted < t < self.end

    def deadline_known(self, t):
        known = [d for at, d in self.deadlines if at <= t]
        return known[-1] if known else None


def build_holds(rec):
    kills = {}
    for f in rec["faults"]:
        if f["kind"] in KILLS and f.get("worker") is not None:
            kills.setdefault(f["worker"], []).append(f["at"])
    holds, grants_seen = [], 0
    for worker, events in rec["events"]:
        mine = {}
        for ev in events:
            kind = ev["ev"]
            if kind == "granted":
                grants_seen += 1
                mine[ev["hold"]] = Hold(worker, ev)
            elif ev.get("hold") in mine:
                h = mine[ev["hold"]]
                if kind == "deadline":
                    h.deadlines.append((ev["at"], ev["deadline"]))
                elif kind == "lost" and h.lost is None:
                    h.lost = ev["at"]
                elif kind == "released":
                    h.release = (ev["at"], ev["result"])
        for h in mine.values():
            ends = [rec["end"]]
            if h.release:
                ends.append(h.release[0])
            ends += [k for k in kills.get(worker, []) if k > h.granted]
            h.end = min(ends)
            holds.append(h)
    holds.sort(key=lambda h: (h.granted, h.worker, h.key[1]))
    return holds, grants_seen


def figures(rec):
    """The checker's figures of one raw record, plus notes and its safety findings."""
    holds, grants_seen = build_holds(rec)
    by_key = {h.key: h for h in holds}
    writes, reads = rec["writes"], rec["reads"]
    notes, fig = [], {}
    if grants_seen != len(holds):
        notes.append(f"{grants_seen} granted events but {len(holds)} distinct holds")
    fig["acquisitions"] = len(holds)
    allev = [ev for _, evs in rec["events"] for ev in evs]
    fig["errors"] = sum(ev["ev"] == "error" for ev in allev)
    fig["skipped_lost"] = sum(ev["ev"] == "skipped" for ev in allev)
    fig["lost"] = sum(h.lost is not None for h in holds)
    fig["writes"] = len(writes)
    tokens = any(h.token is not None for h in holds)

    # Stale: when the write reached the resource, a hold granted after the writer's had already
    # read or written it (the resource's clock `at`).
    first_touch = {}
    for x in reads + writes:
        k = (x["worker"], x["hold"])
        first_touch[k] = min(first_touch.get(k, x["at"]), x["at"])
    touches = sorted((t, by_key[k].granted, k) for k, t in first_touch.items() if k in by_key)
    stale_acc = stale_rej = valid_rej = 0
    for w in writes:
        k = (w["worker"], w["hold"])
        g = by_key[k].granted if k in by_key else w["claimed_from"]
        stale = False
        for t, og, ok in touches:  # by time: only those before the write's arrival count
            if t >= w["at"]:
                break
            if og > g and ok != k:
                stale = True
                break
        if stale and w["accepted"]:
            stale_acc += 1
        elif stale:
            stale_rej += 1
        elif not w["accepted"]:
            valid_rej += 1
    fig["stale_writes"] = stale_acc + stale_rej
    fig["stale_accepted"], fig["stale_rejected"] = stale_acc, stale_rej
    fig["valid_rejected"] = valid_rej
    accepted = [w for w in writes if w["accepted"]]
    fig["lost_updates"] = len(accepted) - rec["final_value"]

    # Overlaps: pairs of accepted writes of different holds whose claimed intervals
    # (claimed_from, at) intersect; a sweep over the intervals by start.
    iv = sorted((w["claimed_from"], w["at"], (w["worker"], w["hold"])) for w in accepted)
    n = 0
    for i, (s1, e1, k1) in enumerate(iv):
        for s2, e2, k2 in iv[i + 1:]:
            if s2 >= e1:
                break
            n += k1 != k2
    fig["overlaps"] = n

    # Token regressions: grants in time order, each token above every earlier one.
    if tokens:
        top, n = None, 0
        for h in holds:
            if h.token is None:
                continue
            if top is not None and h.token <= top:
                n += 1
            top = h.token if top is None else max(top, h.token)
        fig["token_regressions"] = n
    else:
        fig["token_regressions"] = NA
        notes.append("no grant carries a token: token regressions and fencing not judged")

    # Releases: OK while a hold granted after the releaser's was live when it was sent.
    fig["releases_not_owner"] = sum(h.release is not None and h.release[1] == "not_owner" for h in holds)
    # (`holds` is sorted by grant: the holds granted after h follow it, up to its release.)
    foreign = 0
    for i, h in enumerate(holds):
        if not (h.release and h.release[1] == "ok"):
            continue
        for o in holds[i + 1:]:
            if o.granted >= h.release[0]:
                break
            if o.key != h.key and o.granted > h.granted and o.live(h.release[0]):
                foreign += 1
                break
    fig["foreign_releases"] = foreign

    # Takeovers: another grant while a hold is live; lost() first if it fired by that grant
    # (a paused process: its last known local deadline lay before it).
    pauses = [f for f in rec["faults"] if f["kind"] == "pause"]
    taken = first = 0
    for i, h in enumerate(holds):
        # The first grant of another hold inside h's life (holds are sorted by grant).
        g = None
        for o in holds[i + 1:]:
            if o.granted >= h.end:
                break
            if o.key != h.key and h.live(o.granted):
                g = o.granted
                break
        if g is None:
            continue
        taken += 1
        paused = any(
            p.get("worker") == h.worker and p["at"] <= g and (p.get("until") is None or g <= p["until"])
            for p in pauses
        )
        d = h.deadline_known(g)
        first += (h.lost is not None and h.lost <= g) or (paused and d is not None and d <= g)
    fig["taken_over"], fig["lost_first"] = taken, first

    # Takeover time: from SIGKILL of a holder (a hold live until this kill ended it) to the
    # next grant.
    grant_times = sorted(h.granted for h in holds)
    ms, missing, between = [], 0, 0
    for f in rec["faults"]:
        if f["kind"] not in KILLS:
            continue
        w, t = f.get("worker"), f["at"]
        holding = any(
            h.worker == w and h.granted < t <= h.end for h in holds
        )
        if not holding:
            between += 1
            continue
        nxt = [g for g in grant_times if g > t]
        if nxt:
            ms.append((nxt[0] - t) / 1000.0)
        else:
            missing += 1
    fig["takeover_ms"] = sorted(ms)
    fig["takeover_missing"], fig["kills_between_holds"] = missing, between

    # Safety, by the resource's order (`writes` is in arrival order; reads are placed among them
    # by `at`, which the resource takes just before its lock: a read and a write a microsecond
    # apart could be misordered, as they could in the stale figures of both analyses).
    safety = {}
    if tokens:
        bad, top = 0, None  # (token, hold) of the highest accepted write so far
        for w in accepted:
            t, k = w["token"], (w["worker"], w["hold"])
            if t is None:
                continue
            if top is not None and (t < top[0] or (t == top[0] and k != top[1])):
                bad += 1
            if top is None or t > top[0]:
                top = (t, k)
        safety["fencing monotonic among accepted writes"] = bad
        rt = sorted((r["at"], r["token"]) for r in reads if r["token"] is not None)
        bad = 0
        for w in accepted:
            if w["token"] is not None and any(a < w["at"] and t > w["token"] for a, t in rt):
                bad += 1
        safety["no write accepted after a newer holder's read"] = bad
    safety["no stale write accepted"] = stale_acc
    safety["no foreign release"] = fig["foreign_releases"]
    if any(b["at"] < a["at"] for a, b in zip(writes, writes[1:])):
        notes.append("the resource's write times are not in arrival order")
    return fig, safety, notes, tokens


def figures_of_lanes(rec):
    """figures() of a record; a record of several lanes (independent lock names, each with its
    own resource: `{"lanes": [...]}`) is checked lane by lane and its figures added up."""
    if "lanes" not in rec:
        return figures(rec)
    total, safety, notes, tokens = {}, {}, [], False
    for i, lane in enumerate(rec["lanes"]):
        f, s, n, t = figures(lane)
        tokens = tokens or t
        for k, v in f.items():
            if v == NA or total.get(k) == NA:
                total[k] = NA
            elif isinstance(v, list):
                total[k] = sorted(total.get(k, []) + v)
            else:
                total[k] = total.get(k, 0) + v
        for k, v in s.items():
            safety[k] = safety.get(k, 0) + v
        notes += [f"lane {i}: {x}" for x in n]
    return total, safety, notes, tokens


def compare(a, b):
    if isinstance(a, list) or isinstance(b, list):
        return a is not None and b is not None and [round(x, 3) for x in a] == [round(x, 3) for x in b]
    return a == b


def fmt(v):
    if v is None:
        return "–"
    if isinstance(v, list):
        return "[" + ", ".join(f"{x:.0f}" for x in v) + "]" if len(v) <= 8 else f"{len(v)} values"
    return str(v)


def expected(prop, outcome, mode, tokens):
    """Whether the scenario promises a safety property (None: not judged here)."""
    checks = {c["what"]: c["status"] for c in (outcome or {}).get("checks", [])}
    if prop == "no foreign release":
        return checks.get("no foreign release") != "documented"
    if prop == "no stale write accepted":
        if mode != "enforcing" or not tokens:
            return False
        return checks.get("no stale write accepted", "pass") != "documented"
    # The resource's own orders: it keeps them in enforcing mode whatever the store does.
    return mode == "enforcing" and tokens


def check_dir(dirname, report, out):
    outcomes = {}
    if report:
        for o in report["outcomes"]:
            outcomes[(o["backend"], FAULT_LABEL.get(o["fault"], o["fault"]), o["mode"])] = o
    if not os.path.isdir(dirname):
        print(f"check-history.py: no directory {dirname}", file=sys.stderr)
        return 1
    files = sorted(f for f in os.listdir(dirname) if f.endswith(".json"))
    mismatches = violations = 0
    lines = []
    p = lines.append
    for name in files:
        backend, fault, mode = name[: -len(".json")].split(".")
        with open(os.path.join(dirname, name)) as fh:
            rec = json.load(fh)
        fig, safety, notes, tokens = figures_of_lanes(rec)
        o = outcomes.get((backend, fault, mode))
        p(f"\n### {backend} {fault} {mode}" + (f" (harness: {verdict(o)})" if o else ""))
        p("")
        p("| figure | harness | checker | |")
        p("|---|---:|---:|---|")
        for k, v in fig.items():
            h = o["figures"].get(k) if o else None
            if o is None or h is None or v == NA:
                mark = "" if v != NA else "not computable"
            elif compare(h, v):
                mark = "="
            else:
                mark = "MISMATCH"
                mismatches += 1
            p(f"| {k} | {fmt(h)} | {fmt(v)} | {mark} |")
        if report and o is None:
            p("\n(no row of the report for this record)")
            mismatches += 1
        p("")
        for prop, bad in safety.items():
            exp = expected(prop, o, mode, tokens)
            if bad == 0:
                word = "holds"
            elif exp:
                word = f"VIOLATED ({bad})"
                violations += 1
            else:
                word = f"violated ({bad}), not promised here"
            p(f"- {prop}: {word}")
        for nt in notes:
            p(f"- note: {nt}")
    if report:
        seen = {tuple(f[: -len(".json")].split(".")) for f in files}
        for key, o in outcomes.items():
            if key not in seen:
                p(f"\n(report row {' '.join(key)} has no raw record in {dirname})")
                # Only a scenario the harness could not run (its errors FAIL it) lacks one.
                mismatches += not o.get("harness_errors")
    p(f"\n{len(files)} records, {mismatches} disagreements with the harness, {violations} promised properties violated")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if out:
        with open(out, "w") as fh:
            fh.write(f"# check-history.py {dirname}\n" + text)
    return 1 if mismatches or violations or not files else 0


def verdict(o):
    st = [c["status"] for c in o.get("checks", [])]
    if o.get("harness_errors") or "fail" in st:
        return "FAIL"
    return "documented" if "documented" in st else "pass"


# ---------------------------------------------------------------- self-test


def self_test():
    def g(hold, at, token, deadline=None):
        return {"ev": "granted", "hold": hold, "at": at, "token": token, "deadline": deadline or at + 1000}

    def rel(hold, at, result="ok"):
        return {"ev": "released", "hold": hold, "at": at, "done": at + 1, "result": result}

    def wr(worker, hold, token, frm, at, ok):
        return {"worker": worker, "hold": hold, "token": token, "claimed_from": frm, "at": at,
                "read": 0, "value": 1, "accepted": ok}

    def rd(worker, hold, token, at):
        return {"worker": worker, "hold": hold, "token": token, "at": at}

    def rec(events, writes, reads=(), faults=(), value=None):
        acc = sum(w["accepted"] for w in writes)
        return {"events": events, "writes": writes, "reads": list(reads), "faults": list(faults),
                "final_value": acc if value is None else value, "end": 100000}

    # Clean hand-off: nothing to report.
    clean = rec([[1, [g(1, 100, 1), rel(1, 200)]], [2, [g(1, 210, 2), rel(1, 300)]]],
                [wr(1, 1, 1, 100, 150, True), wr(2, 1, 2, 210, 250, True)],
                [rd(1, 1, 1, 120), rd(2, 1, 2, 220)])
    f, s, _, _ = figures(clean)
    assert f["acquisitions"] == 2 and f["overlaps"] == 0 and f["token_regressions"] == 0, f
    assert f["stale_writes"] == 0 and f["foreign_releases"] == 0 and f["taken_over"] == 0, f
    assert not any(s.values()), s

    # A paused holder (token 1) writes after holder 2 (token 2) read and wrote: enforcing
    # refuses it; log-only accepts it (stale accepted, an overlap, fencing out of order).
    pause = [{"kind": "pause", "worker": 1, "at": 120, "until": 2000, "detail": ""}]
    ev = [[1, [g(1, 100, 1, 1100), rel(1, 2100, "not_owner")]],
          [2, [g(1, 1200, 2), rel(1, 1500)]]]
    reads = [rd(1, 1, 1, 110), rd(2, 1, 2, 1250)]
    for ok in (False, True):
        r = rec(ev, [wr(2, 1, 2, 1200, 1300, True), wr(1, 1, 1, 100, 2050, ok)], reads, pause)
        f, s, _, _ = figures(r)
        assert f["stale_writes"] == 1 and f["stale_accepted"] == int(ok), f
        assert f["stale_rejected"] == int(not ok) and f["valid_rejected"] == 0, f
        assert f["overlaps"] == int(ok) and f["releases_not_owner"] == 1, f
        assert f["taken_over"] == 1 and f["lost_first"] == 1, f  # deadline 1100 < grant 1200
        assert s["fencing monotonic among accepted writes"] == int(ok), s
        assert s["no write accepted after a newer holder's read"] == int(ok), s

    # A violating history: token regression, a foreign release, a takeover without lost().
    bad = rec([[1, [g(1, 100, 5), rel(1, 300, "ok")]], [2, [g(1, 200, 3), rel(1, 400)]]],
              [wr(1, 1, 5, 100, 150, True), wr(2, 1, 3, 200, 250, True)])
    f, s, _, _ = figures(bad)
    assert f["token_regressions"] == 1 and f["foreign_releases"] == 1, f
    assert f["taken_over"] == 1 and f["lost_first"] == 0 and f["overlaps"] == 0, f
    assert s["fencing monotonic among accepted writes"] == 1, s

    # A kill of a holder: takeover time to the next grant; a kill between holds is not timed.
    kills = [{"kind": "kill", "worker": 1, "at": 500, "until": None, "detail": ""},
             {"kind": "run-kill", "worker": 1, "at": 1000, "until": None, "detail": ""},
             {"kind": "kill", "worker": 2, "at": 5000, "until": None, "detail": ""}]
    r = rec([[1, [g(1, 100, 1)]], [2, [g(1, 1600, 2), rel(1, 1700)]]], [], faults=kills)
    f, _, _, _ = figures(r)
    assert f["takeover_ms"] == [1.1] and f["kills_between_holds"] == 2, f
    assert f["taken_over"] == 0, f  # hold 1 ended with the kill at 500

    # Redlock: no tokens, so no token figure.
    f, s, notes, tokens = figures(rec([[1, [g(1, 100, None), rel(1, 200)]]], []))
    assert f["token_regressions"] == NA and not tokens and notes, (f, notes)

    # Lanes: each checked by itself (their holds never meet), the figures added up.
    f, s, _, _ = figures_of_lanes({"lanes": [clean, bad, r]})
    assert f["acquisitions"] == 6 and f["token_regressions"] == 1 and f["foreign_releases"] == 1, f
    assert f["takeover_ms"] == [1.1] and f["kills_between_holds"] == 2 and f["taken_over"] == 1, f
    assert s["fencing monotonic among accepted writes"] == 1, s

    # The comparison flags a harness figure that disagrees.
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "sqlite.pause.enforcing.json"), "w") as fh:
            json.dump(bad, fh)
        fb, _, _, _ = figures(bad)
        fb = dict(fb, token_regressions=0)
        report = {"outcomes": [{"backend": "sqlite", "fault": "pause", "mode": "enforcing",
                                "figures": fb, "checks": [], "harness_errors": []}]}
        stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
        try:
            rc = check_dir(d, report, None)
        finally:
            sys.stdout.close()
            sys.stdout = stdout
        assert rc == 1
    print("check-history self-test: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", help="the directory of raw records (dlock-chaos --events)")
    ap.add_argument("--report", help="the harness's JSON report (dlock-chaos --json) to compare with")
    ap.add_argument("--out", help="also write the tables to this file")
    ap.add_argument("--self-test", action="store_true", help="check the checker on synthetic histories")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.dir:
        ap.error("the directory of raw records is required")
    report = None
    if a.report:
        with open(a.report) as fh:
            report = json.load(fh)
    return check_dir(a.dir, report, a.out)


if __name__ == "__main__":
    sys.exit(main())
