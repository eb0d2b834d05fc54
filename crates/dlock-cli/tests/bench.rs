//! `dlock bench --quick` as a smoke test: against a temporary SQLite store, against the Redis
//! server of `scripts/test.sh` (`DLOCK_TEST_REDIS_URL`, with the rslock and redis-py peers),
//! against its Redis Sentinel topology and Redis Cluster (`DLOCK_TEST_REDIS_SENTINEL_URL`,
//! `DLOCK_TEST_REDIS_CLUSTER_URL`; each benched with and without `replicas=1`), against its
//! ZooKeeper ensemble (`DLOCK_TEST_ZK_URL`, U1/C1/H1 with the kazoo and Curator peers) and
//! against its etcd cluster (`DLOCK_TEST_ETCD_URL`, else one started for the test with
//! `scripts/etcd-cluster.sh`; with etcd's Lock RPC as the peer). It checks
//! that the run succeeds, that results.json has every workload with positive figures (a row
//! per peer, and dlock against the best peer), that a peer missing on the machine is a line of
//! the report, and that results.md and the charts exist. On PostgreSQL and MariaDB
//! (`DLOCK_TEST_POSTGRES_URL`, `DLOCK_TEST_MYSQL_URL`) it checks that the report names a
//! transaction held open during the run. No timing is asserted: performance is read from a
//! full run (docs/BENCHMARKS.md), never judged in CI.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dlock");

/// Runs `dlock bench --quick` with `args` into `out`, killing it after `limit` (a hang is a
/// failure, not a slow pass); checks that it succeeded and returns results.md and results.json.
fn run_bench(args: &[&str], out: &Path, limit: Duration) -> (String, Value) {
    let mut c = Command::new(BIN);
    c.args(["bench", "--quick", "--out"])
        .arg(out)
        .args(args)
        .env_remove("DLOCK_URL")
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start dlock bench");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dlock bench --quick did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "dlock bench failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        o.status
    );
    assert!(
        stdout.contains("## Targets"),
        "no Markdown on stdout:\n{stdout}"
    );
    let md = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    let json = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    (
        md,
        serde_json::from_str(&json).expect("results.json parses"),
    )
}

/// Runs `dlock bench --quick --plot` on `urls` (none: the default SQLite) into `out`, killing it
/// after `limit`: every workload, every chart.
fn bench(urls: &[&str], out: &Path, limit: Duration) -> Value {
    let mut args = vec!["--plot"];
    for u in urls {
        args.extend(["--url", *u]);
    }
    let (md, v) = run_bench(&args, out, limit);
    for section in [
        "## Targets",
        "## Per store: dlock, the raw floor and the peers side by side",
        "## U1",
        "## C1",
        "## H1",
        "## F1",
        "## S1",
        "## E1",
        "## T1",
    ] {
        assert!(md.contains(section), "results.md lacks {section}:\n{md}");
    }
    for svg in [
        "u1.svg",
        "c1.svg",
        "h1.svg",
        "s1-client.svg",
        "s1-store.svg",
    ] {
        let s = std::fs::read_to_string(out.join(svg)).expect(svg);
        assert!(s.contains("<svg"), "{svg} is not an SVG");
    }
    v
}

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for p in path.split('.') {
        cur = &cur[p];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

fn positive(v: &Value, path: &str) {
    let x = num(v, path);
    assert!(x > 0.0, "{path} = {x}, expected > 0 in {v}");
}

/// Checks one store's entry: every workload present with positive figures.
fn check_target(t: &Value, libs: &[&str], fair: bool) {
    let label = t["label"].as_str().unwrap_or("?");
    check_libs(t, libs);
    if fair {
        positive(&t["f1"], "run.acquisitions");
        positive(&t["f1"], "run.jain_acquisitions");
        positive(&t["f1"], "run.max_over_mean_wait");
    }
    let levels = t["s1"]["levels"].as_array().expect("s1 levels");
    assert_eq!(levels.len(), 4, "{label}: S1 levels 1, 10, 100, 1000");
    for l in levels {
        assert_eq!(l["held"], l["names"], "{label}: S1 level not complete: {l}");
        positive(l, "conns_after");
        positive(l, "holds_renewed_per_s");
    }
    check_e1(t);
    check_t1(t);
}

/// U1, C1 and H1 of one store: a row of each of `libs` (dlock and peers) with positive figures,
/// no error but what does not apply, and where a peer ran, dlock against the best peer.
fn check_libs(t: &Value, libs: &[&str]) {
    let label = t["label"].as_str().unwrap_or("?");
    let errors = t["errors"].as_array().expect("errors");
    for e in errors {
        let e = e.as_str().unwrap_or_default();
        assert!(e.contains("not supported"), "{label}: {e}");
    }
    for lib in libs {
        let u1 = t["u1"]
            .as_array()
            .expect("u1")
            .iter()
            .find(|u| u["lib"] == *lib)
            .unwrap_or_else(|| panic!("{label}: no U1 of {lib}"));
        for p in [
            "lat.p50_us",
            "lat.p99_us",
            "ops_per_s",
            "floor.p50_us",
            "ratio_p50",
        ] {
            positive(u1, p);
        }
        let c1: Vec<&Value> = t["c1"]
            .as_array()
            .expect("c1")
            .iter()
            .filter(|c| c["lib"] == *lib)
            .collect();
        assert_eq!(
            c1.len(),
            4,
            "{label}: C1 of {lib}: 8/64 waiters × hold 0/1 ms"
        );
        for c in c1 {
            positive(c, "acquisitions");
            positive(c, "acq_per_s");
            positive(c, "wait.p50_us");
            assert_eq!(num(c, "overlaps"), 0.0, "{label}: two holders at once: {c}");
        }
        let h1 = t["h1"]
            .as_array()
            .expect("h1")
            .iter()
            .find(|h| h["lib"] == *lib)
            .unwrap_or_else(|| panic!("{label}: no H1 of {lib}"));
        positive(h1, "rtt_us");
        positive(h1, "run.acquisitions");
    }
    // Every figure where a peer ran: U1 p50/p99, 6 per C1 run, H1 p50/p99 when hand-offs were
    // seen; each names a peer of this run and its ratio.
    let vs = t["vs_best_peer"].as_array().expect("vs_best_peer");
    let peers: Vec<&str> = libs.iter().copied().filter(|l| *l != "dlock").collect();
    if peers.is_empty() {
        assert!(vs.is_empty(), "{label}: {vs:?}");
        return;
    }
    for figure in ["U1 p50", "U1 p99", "C1 8 waiters, 1 ms hold: acq/s"] {
        let v = vs
            .iter()
            .find(|v| v["figure"] == figure)
            .unwrap_or_else(|| panic!("{label}: no {figure} against the best peer: {vs:?}"));
        let best = v["best_peer"].as_str().unwrap_or_default();
        assert!(peers.contains(&best), "{label}: {v}");
        positive(v, "ratio");
        assert_eq!(
            v["peers"].as_array().map(Vec::len),
            Some(peers.len()),
            "{label}: every peer's value: {v}"
        );
    }
    assert!(vs.len() >= 2 + 6 * 4, "{label}: {vs:?}");
}

/// E1 of one store: every fail-over of `--quick` measured, the terms increasing (where the store
/// fences). Sane figures, no timing judged.
fn check_e1(t: &Value) {
    let label = t["label"].as_str().unwrap_or("?");
    let e = &t["e1"];
    assert!(e.is_object(), "{label}: no E1 in {t}");
    assert_eq!(num(e, "term_ms"), 2000.0, "{label}: {e}");
    let repeats = num(e, "repeats");
    assert_eq!(repeats, 2.0, "{label}: --quick fails over twice: {e}");
    let samples = e["failover_ms"].as_array().expect("failover_ms");
    assert_eq!(samples.len() as f64, repeats, "{label}: {e}");
    for x in samples {
        assert!(x.as_f64().is_some_and(|x| x > 0.0), "{label}: {e}");
    }
    let (min, p50, max) = (num(e, "min_ms"), num(e, "p50_ms"), num(e, "max_ms"));
    assert!(0.0 < min && min <= p50 && p50 <= max, "{label}: {e}");
    let terms = e["terms"].as_array().expect("terms");
    assert_eq!(
        terms.len() as f64,
        repeats + 1.0,
        "every leader's term: {e}"
    );
    if terms.iter().all(Value::is_u64) {
        assert_eq!(e["terms_increasing"], true, "{label}: {e}");
    }
}

/// T1 of one store: both runs complete (64 waiters × 5 rounds), no name held twice at once, the
/// one-name run on one name and the striped run on several of its 64.
fn check_t1(t: &Value) {
    let label = t["label"].as_str().unwrap_or("?");
    let x = &t["t1"];
    assert!(x.is_object(), "{label}: no T1 in {t}");
    assert_eq!(num(x, "waiters"), 64.0, "{label}: {x}");
    for run in ["one_name", "striped"] {
        let r = &x[run];
        assert_eq!(num(r, "acquisitions"), 64.0 * 5.0, "{label}: {run}: {r}");
        assert_eq!(r["complete"], true, "{label}: {run}: {r}");
        positive(r, "acq_per_s");
        positive(r, "span_s");
        assert_eq!(
            num(r, "overlaps"),
            0.0,
            "{label}: {run}: two holders at once: {r}"
        );
    }
    assert_eq!(num(&x["one_name"], "names_used"), 1.0, "{label}: {x}");
    let used = num(&x["striped"], "names_used");
    assert!(1.0 < used && used <= 64.0, "{label}: {x}");
    assert_eq!(num(&x["striped"], "stripes"), 64.0, "{label}: {x}");
    positive(x, "ratio");
}

#[test]
fn quick_bench_on_the_default_sqlite_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = bench(&[], dir.path(), Duration::from_secs(300));
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0]["kind"], "sqlite");
    check_target(&targets[0], &["dlock"], true);
    assert_eq!(v["quick"], true);
    positive(&v, "machine.cpus");
    // The version the report names is the one Cargo.toml pins.
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
            .expect("the workspace Cargo.toml");
    let pin = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rslock = { version = \"="))
        .and_then(|rest| rest.split('"').next())
        .expect("rslock pinned with = in the workspace Cargo.toml");
    assert_eq!(v["versions"]["rslock (peer, pinned)"], pin);
}

#[test]
fn quick_bench_of_e1_and_t1_alone_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let out = dir.path().join("out");
    let (md, v) = run_bench(
        &["--only", "e1,t1", "--url", &url],
        &out,
        Duration::from_secs(180),
    );
    for section in ["## E1", "## T1"] {
        assert!(md.contains(section), "results.md lacks {section}:\n{md}");
    }
    let t = &v["targets"][0];
    assert_eq!(t["kind"], "sqlite", "{v}");
    assert_eq!(t["errors"].as_array().map(Vec::len), Some(0), "{t}");
    check_e1(t);
    check_t1(t);
    // Only what was asked for ran.
    assert_eq!(t["u1"].as_array().map(Vec::len), Some(0), "{t}");
    assert_eq!(t["c1"].as_array().map(Vec::len), Some(0), "{t}");
    assert!(t["s1"].is_null(), "{t}");
    assert!(md.contains("| sqlite | (b) striped(64) |"), "{md}");
}

#[test]
fn quick_bench_on_redis_with_the_rslock_and_redis_py_peers() {
    let url = std::env::var("DLOCK_TEST_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .expect("DLOCK_TEST_REDIS_URL is not set: run through scripts/test.sh");
    let dir = tempfile::tempdir().expect("tempdir");
    let v = bench(&[&url], dir.path(), Duration::from_secs(300));
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0]["kind"], "redis");
    check_target(&targets[0], &["dlock", "rslock", "redis-py"], true);
    // Store-side command counts exist on Redis.
    let c = &targets[0]["c1"][0];
    assert!(c["store_cmds_per_acq"].as_f64().is_some(), "{c}");
    let py = v["versions"]["redis-py (peer)"]
        .as_str()
        .unwrap_or_default();
    assert!(
        py.starts_with("5.") && py.contains("Python 3"),
        "{}",
        v["versions"]
    );
    let md = std::fs::read_to_string(dir.path().join("results.md")).expect("results.md");
    for row in [
        "## dlock against the best peer",
        "| redis | redis-py Lock | 8 | 1 ms |",
    ] {
        assert!(md.contains(row), "results.md lacks {row}:\n{md}");
    }
}

#[test]
fn quick_bench_on_zookeeper_with_the_kazoo_and_curator_peers() {
    let url = env_url("DLOCK_TEST_ZK_URL");
    let dir = tempfile::tempdir().expect("tempdir");
    let (md, v) = run_bench(
        &["--only", "u1,c1,h1", "--url", &url],
        dir.path(),
        Duration::from_secs(300),
    );
    let t = &v["targets"][0];
    assert_eq!(t["kind"], "zookeeper", "{v}");
    assert_eq!(t["errors"].as_array().map(Vec::len), Some(0), "{t}");
    check_libs(t, &["dlock", "kazoo", "curator"]);
    for (k, what) in [("kazoo (peer)", "Python 3"), ("Curator (peer)", "JDK")] {
        let found = v["versions"][k].as_str().unwrap_or_default();
        assert!(found.contains(what), "{k}: {}", v["versions"]);
    }
    for row in [
        "| kazoo Lock | 64 | 1 ms |",
        "| Curator InterProcessMutex | 64 | 1 ms |",
    ] {
        assert!(md.contains(row), "results.md lacks {row}:\n{md}");
    }
    // The ensemble's own fsyncs over each contended run (scripts/zk-ensemble.sh allows srst,
    // so the longest is the run's).
    for c in t["c1"].as_array().expect("c1") {
        let syncs = &c["store_syncs"];
        assert!(syncs["count"].as_u64().is_some_and(|n| n > 0), "{c}");
        assert!(syncs["max_ms"].as_f64().is_some(), "{c}");
        assert_eq!(syncs["max_is_bound"], false, "{c}");
    }
}

/// `--records` writes every contended run's acquisitions, one CSV per run.
#[test]
fn records_are_written_for_every_contended_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let out = dir.path().join("out");
    let (_, v) = run_bench(
        &["--only", "h1,f1", "--records", "--url", &url],
        &out,
        Duration::from_secs(180),
    );
    let t = &v["targets"][0];
    assert_eq!(t["errors"].as_array().map(Vec::len), Some(0), "{t}");
    for run in ["h1", "f1"] {
        let path = out.join("records").join(format!("sqlite-dlock-{run}.csv"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("process,waiter,request_ms,grant_ms,release_start_ms,release_end_ms,request_unix_us")
        );
        let rows: Vec<Vec<f64>> = lines
            .map(|l| l.split(',').map(|x| x.parse().expect("a number")).collect())
            .collect();
        assert!(!rows.is_empty(), "{path:?} has no acquisition");
        for r in &rows {
            assert!(r[2] <= r[3] && r[3] <= r[4] && r[4] <= r[5], "{r:?}");
        }
        // One line per acquisition of the run, in grant order.
        let n = if run == "f1" {
            t["f1"]["run"]["acquisitions"].as_u64()
        } else {
            t["h1"][0]["run"]["acquisitions"].as_u64()
        };
        assert_eq!(Some(rows.len() as u64), n, "{path:?}");
        assert!(rows.windows(2).all(|w| w[0][3] <= w[1][3]), "{path:?}");
    }
}

/// A peer that cannot run on the machine (here: no python3 on PATH) is a line of the report,
/// not a gap nor a failed run.
#[test]
fn a_missing_peer_is_a_line_of_the_report() {
    let url = env_url("DLOCK_TEST_REDIS_URL");
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty-path");
    std::fs::create_dir(&empty).expect("mkdir");
    let out = dir.path().join("out");
    let o = Command::new(BIN)
        .args(["bench", "--quick", "--only", "u1", "--url", &url, "--out"])
        .arg(&out)
        .env("PATH", &empty)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(o.status.success(), "{o:?}");
    let md = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    assert!(
        md.contains("- redis: peer redis-py: not available: no python3 on PATH"),
        "{md}"
    );
    // The other peer still ran.
    assert!(md.contains("| redis | rslock |"), "{md}");
}

/// The seconds after `label` in `text` (`"<label> 12 s"`); `None` when it says anything else.
fn seconds_after(text: &str, label: &str) -> Option<u64> {
    let rest = &text[text.find(label)? + label.len()..];
    rest.trim_start().split(' ').next()?.parse().ok()
}

/// A transaction held open on another connection (a long report, a forgotten session) slows
/// every grant of a busy name, so the report names the SQL server's oldest open transaction
/// before and after the workloads, with PostgreSQL's autovacuum setting and MariaDB's purge
/// backlog.
#[test]
fn the_sql_servers_oldest_open_transaction_is_in_the_report() {
    sqlx::any::install_default_drivers();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for (var, label, open, what) in [
        (
            "DLOCK_TEST_POSTGRES_URL",
            "postgres",
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "autovacuum ",
        ),
        (
            "DLOCK_TEST_MYSQL_URL",
            "mysql",
            "START TRANSACTION WITH CONSISTENT SNAPSHOT",
            "history list ",
        ),
    ] {
        let url = env_url(var);
        let mut conn = rt.block_on(async {
            use sqlx::Connection;
            let mut c = sqlx::AnyConnection::connect(&url).await.expect("connect");
            sqlx::raw_sql(open).execute(&mut c).await.expect("open");
            sqlx::raw_sql("SELECT 1")
                .execute(&mut c)
                .await
                .expect("read");
            c
        });
        std::thread::sleep(Duration::from_secs(2));
        let dir = tempfile::tempdir().expect("tempdir");
        let (md, v) = run_bench(
            &["--only", "u1", "--no-peers", "--url", &url],
            dir.path(),
            Duration::from_secs(120),
        );
        rt.block_on(sqlx::raw_sql("ROLLBACK").execute(&mut conn))
            .expect("rollback");
        let line = md
            .lines()
            .find(|l| l.contains(&format!("- {label}: the server before the workloads: ")))
            .unwrap_or_else(|| panic!("no state line for {label}:\n{md}"));
        let state = &v["targets"][0]["sql_state"];
        let (before, after) = (
            state[0].as_str().expect("before"),
            state[1].as_str().expect("after"),
        );
        assert!(line.contains(before) && line.contains(after), "{line}");
        for s in [before, after] {
            assert!(s.starts_with(what), "{label}: {s}");
            let oldest = seconds_after(s, "oldest open transaction")
                .or_else(|| seconds_after(s, "oldest open transaction in the database"));
            assert!(
                oldest.is_some_and(|secs| secs >= 2),
                "{label}: the transaction held for 2 s is not reported: {s}"
            );
        }
    }
}

/// The URL in `var` (`scripts/test.sh` sets it); a missing one fails the test, never skips it.
fn env_url(var: &str) -> String {
    std::env::var(var)
        .ok()
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| panic!("{var} is not set: run through scripts/test.sh"))
}

/// `url` without its `replicas=` option, and with `replicas=1` (or the `replicas=N` it has).
fn without_and_with_wait(url: &str) -> (String, String) {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("replicas="))
        .collect();
    let plain = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let wait = if query.split('&').any(|kv| kv.starts_with("replicas=")) {
        url.to_string()
    } else {
        format!(
            "{plain}{}replicas=1",
            if rest.is_empty() { '?' } else { '&' }
        )
    };
    (plain, wait)
}

/// One Redis deployment with fail-over, benched without and with `replicas=N`: both rows
/// complete, the `+wait` row's floor waits like its grants, the peers rslock and redis-py run
/// where they can (`rslock`: on the row without `+wait`) and say why not elsewhere.
fn check_ha(var: &str, kind: &str, rslock: bool, about: &str) {
    let (plain, wait) = without_and_with_wait(&env_url(var));
    let dir = tempfile::tempdir().expect("tempdir");
    // F1, E1 and T1 go through the same Redis store code as on the single server, whose smoke
    // test runs them; these rows check what differs: the connection, WAIT, the peers, renewals
    // over slots.
    let (_, v) = run_bench(
        &["--only", "u1,c1,h1,s1", "--url", &plain, "--url", &wait],
        dir.path(),
        Duration::from_secs(600),
    );
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 2);
    for (i, t) in targets.iter().enumerate() {
        let label = t["label"].as_str().unwrap_or("?");
        assert_eq!(t["kind"], kind, "{t}");
        assert!(
            label.starts_with(kind) && label.contains("+wait") == (i == 1),
            "{label}"
        );
        let server = t["server"].as_str().unwrap_or_default();
        assert!(
            server.starts_with("Redis ") && server.contains(about),
            "{label}: {server}"
        );
        let libs: &[&str] = if rslock && i == 0 {
            &["dlock", "rslock", "redis-py"]
        } else {
            &["dlock"]
        };
        check_libs(t, libs);
        let levels = t["s1"]["levels"].as_array().expect("s1 levels");
        assert_eq!(levels.len(), 4, "{label}: S1 levels 1, 10, 100, 1000");
        let errors: Vec<&str> = t["errors"]
            .as_array()
            .expect("errors")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for peer in ["rslock", "redis-py"] {
            assert_eq!(
                errors
                    .iter()
                    .any(|e| e.contains(&format!("peer {peer}: not supported"))),
                libs.len() == 1,
                "{label}: {errors:?}"
            );
        }
        let floor = t["u1"][0]["floor_what"].as_str().unwrap_or_default();
        assert_eq!(floor.contains("WAIT"), i == 1, "{label}: {floor}");
        // Store-side command counts: the master (Sentinel) or every master (Cluster).
        let c = &t["c1"][0];
        assert!(c["store_cmds_per_acq"].as_f64().is_some(), "{c}");
        // Renewal keeps every S1 hold, whatever slots (Cluster) the names are in.
        for l in t["s1"]["levels"].as_array().expect("s1 levels") {
            assert_eq!(num(l, "lost"), 0.0, "{label}: S1 holds lost: {l}");
        }
    }
}

#[test]
fn quick_bench_on_redis_sentinel_with_and_without_wait() {
    check_ha(
        "DLOCK_TEST_REDIS_SENTINEL_URL",
        "redis-sentinel",
        true,
        "Sentinel, master",
    );
}

#[test]
fn quick_bench_on_redis_cluster_with_and_without_wait() {
    check_ha(
        "DLOCK_TEST_REDIS_CLUSTER_URL",
        "redis-cluster",
        false,
        "Cluster, ",
    );
}

#[test]
fn bench_urls_without_and_with_wait() {
    assert_eq!(
        without_and_with_wait("redis+cluster://a:1,b:2/?replicas=1"),
        (
            "redis+cluster://a:1,b:2/".to_string(),
            "redis+cluster://a:1,b:2/?replicas=1".to_string()
        )
    );
    assert_eq!(
        without_and_with_wait("redis+sentinel://s:1/m?timeout=3s"),
        (
            "redis+sentinel://s:1/m?timeout=3s".to_string(),
            "redis+sentinel://s:1/m?timeout=3s&replicas=1".to_string()
        )
    );
}

/// The etcd cluster of `DLOCK_TEST_ETCD_URL`, or one started for the test (stopped, by pid,
/// when dropped).
struct Etcd {
    url: String,
    dir: Option<tempfile::TempDir>,
}

const ETCD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/etcd-cluster.sh");

impl Etcd {
    fn any() -> Etcd {
        if let Some(url) = std::env::var("DLOCK_TEST_ETCD_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
        {
            return Etcd {
                url: url.trim().to_string(),
                dir: None,
            };
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let o = Command::new("bash")
            .arg(ETCD_SCRIPT)
            .arg("start")
            .arg(dir.path())
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/etcd-cluster.sh");
        let hosts = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let e = Etcd {
            url: format!("etcd://{hosts}/dlock-test?ttl=2s"),
            dir: Some(dir),
        };
        assert!(
            o.status.success() && !hosts.is_empty(),
            "scripts/etcd-cluster.sh start failed: {:?}",
            o.status
        );
        e
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = Command::new("bash")
                .arg(ETCD_SCRIPT)
                .arg("stop")
                .arg(d.path())
                .status();
        }
    }
}

#[test]
fn quick_bench_on_etcd_with_the_lock_rpc_peer() {
    let etcd = Etcd::any();
    let dir = tempfile::tempdir().expect("tempdir");
    let v = bench(&[&etcd.url], dir.path(), Duration::from_secs(300));
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0]["kind"], "etcd");
    check_target(&targets[0], &["dlock", "etcd-lock"], true);
    // The members' /metrics give writes per acquisition and S1's lease keep-alives.
    if !etcd.url.starts_with("etcds://") {
        let c = &targets[0]["c1"][0];
        assert!(c["store_cmds_per_acq"].as_f64().is_some(), "{c}");
        let top = &targets[0]["s1"]["levels"][3];
        assert!(top["store_keepalives_per_s"].as_f64().is_some(), "{top}");
        // The members' WAL fsyncs over each contended run.
        let syncs = &c["store_syncs"];
        assert!(syncs["count"].as_u64().is_some_and(|n| n > 0), "{c}");
        assert_eq!(syncs["max_is_bound"], true, "{c}");
    }
}

#[test]
fn a_store_that_is_down_is_a_clear_error_not_a_hang() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A closed port on loopback: connecting fails at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let started = Instant::now();
    let o = Command::new(BIN)
        .args(["bench", "--quick", "--out"])
        .arg(dir.path())
        .args(["--url", &format!("redis://127.0.0.1:{port}/")])
        .env("RUST_LOG", "error")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(69), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("failed on redis"), "{err}");
    let md = std::fs::read_to_string(dir.path().join("results.md")).expect("results.md");
    assert!(md.contains("store unreachable"), "{md}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}
