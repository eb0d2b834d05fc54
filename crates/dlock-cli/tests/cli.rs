//! End-to-end tests of the `dlock` binary against a temporary SQLite store (one file per test).
//!
//! Every process a test starts is wrapped in a guard that stops it (SIGTERM, then SIGKILL) if the
//! test fails half-way, and every command a test runs in a `dlock run` ends by itself within
//! seconds even if nobody stops it.

#[path = "support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// A temporary directory with a SQLite store in it.
struct Store {
    dir: tempfile::TempDir,
    url: String,
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        Store { dir, url }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Starts `dlock run` holding `name` with a command that touches `started` and then runs until
/// SIGTERM (recording it in `termed`) or for at most 10 s.
fn hold(store: &Store, name: &str, extra: &[&str]) -> (Proc, PathBuf, PathBuf) {
    let started = store.path(&format!("{}-started", name.replace('/', "_")));
    let termed = store.path(&format!("{}-termed", name.replace('/', "_")));
    let script = format!(
        "trap 'touch {t}; exit 143' TERM; touch {s}; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done",
        t = termed.display(),
        s = started.display()
    );
    let mut args = vec!["run", "--url", &store.url];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[name, "--", "sh", "-c", &script]);
    let p = Proc::spawn(dlock(&args), store.dir.path());
    assert!(
        wait_for_file(&started, Duration::from_secs(10)),
        "the holder's command did not start"
    );
    (p, started, termed)
}

fn run_quick(store: &Store, extra: &[&str], name: &str, cmd: &[&str]) -> Out {
    let mut args = vec!["run", "--url", &store.url];
    args.extend_from_slice(extra);
    args.push(name);
    args.push("--");
    args.extend_from_slice(cmd);
    exec(dlock(&args), store.dir.path(), Duration::from_secs(20))
}

#[test]
fn run_passes_exit_codes_through() {
    let s = Store::new();
    assert_eq!(run_quick(&s, &[], "codes", &["true"]).code, Some(0));
    let o = run_quick(&s, &[], "codes", &["sh", "-c", "exit 3"]);
    assert_eq!(o.code, Some(3), "{o:?}");
    assert!(o.stderr.is_empty(), "{o:?}");
    // Killed by a signal: 128 + N, like a shell.
    let o = run_quick(&s, &[], "codes", &["sh", "-c", "kill -KILL $$"]);
    assert_eq!(o.code, Some(128 + 9), "{o:?}");
    let o = run_quick(&s, &[], "codes", &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.code, Some(128 + 15), "{o:?}");
    // And the lock was released every time.
    assert_eq!(
        run_quick(&s, &["--no-wait"], "codes", &["true"]).code,
        Some(0)
    );
}

#[test]
fn run_accepts_the_command_without_double_dash() {
    let s = Store::new();
    let o = exec(
        dlock(&[
            "run",
            "--url",
            &s.url,
            "plain",
            "sh",
            "-c",
            "echo $DLOCK_NAME",
        ]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert_eq!(o.stdout.trim(), "plain");
}

#[test]
fn run_gives_the_child_name_and_token() {
    let s = Store::new();
    let get = || {
        let o = run_quick(
            &s,
            &[],
            "env/check",
            &["sh", "-c", "echo \"$DLOCK_NAME|${DLOCK_TOKEN-unset}\""],
        );
        assert_eq!(o.code, Some(0), "{o:?}");
        let line = o.stdout.trim().to_string();
        let (name, token) = line.split_once('|').expect("name|token");
        assert_eq!(name, "env/check");
        let token: u64 = token.parse().expect("DLOCK_TOKEN is an integer");
        assert!(token > 0);
        token
    };
    let (a, b) = (get(), get());
    assert!(b > a, "tokens increase: {a} then {b}");
}

#[test]
fn no_wait_on_a_held_lock_exits_75_without_running() {
    let s = Store::new();
    let (holder, _, _) = hold(&s, "busy", &[]);
    let marker = s.path("ran");
    let o = run_quick(
        &s,
        &["--no-wait"],
        "busy",
        &["touch", marker.to_str().expect("utf-8 path")],
    );
    assert_eq!(o.code, Some(75), "{o:?}");
    assert!(!marker.exists(), "the command must not run");
    assert_eq!(o.stderr.lines().count(), 1, "one line: {:?}", o.stderr);
    assert!(o.stderr.contains("busy"), "{o:?}");
    assert!(o.elapsed < Duration::from_secs(5), "{o:?}");
    drop(holder);
}

#[test]
fn wait_expires_with_75_after_the_wait() {
    let s = Store::new();
    let (holder, _, _) = hold(&s, "slow", &[]);
    let marker = s.path("ran");
    let o = run_quick(
        &s,
        &["--wait", "300ms"],
        "slow",
        &["touch", marker.to_str().expect("utf-8 path")],
    );
    assert_eq!(o.code, Some(75), "{o:?}");
    assert!(o.elapsed >= Duration::from_millis(300), "{o:?}");
    assert!(o.elapsed < Duration::from_secs(5), "{o:?}");
    assert!(!marker.exists(), "the command must not run");
    assert_eq!(o.stderr.lines().count(), 1, "one line: {:?}", o.stderr);
    drop(holder);
}

#[test]
fn lost_lock_terminates_the_command_and_exits_76() {
    let s = Store::new();
    let (holder, _, termed) = hold(&s, "doomed", &["--ttl", "1s", "--kill-after", "2s"]);
    let o = exec(
        dlock(&["unlock", "--url", &s.url, "doomed", "--force"]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.stdout.contains("revoked 1 hold"), "{o:?}");
    let t0 = Instant::now();
    let o = holder.wait(Duration::from_secs(10));
    assert_eq!(o.code, Some(76), "{o:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{o:?}");
    assert!(termed.exists(), "the command got SIGTERM");
    assert!(o.stderr.contains("lost"), "{o:?}");
}

#[test]
fn lost_lock_kills_a_command_that_ignores_sigterm() {
    let s = Store::new();
    let started = s.path("started");
    let script = format!(
        "trap '' TERM; touch {}; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done",
        started.display()
    );
    let holder = Proc::spawn(
        dlock(&[
            "run",
            "--url",
            &s.url,
            "--ttl",
            "1s",
            "--kill-after",
            "500ms",
            "stubborn",
            "--",
            "sh",
            "-c",
            &script,
        ]),
        s.dir.path(),
    );
    assert!(wait_for_file(&started, Duration::from_secs(10)));
    let o = exec(
        dlock(&["unlock", "--url", &s.url, "stubborn", "--force"]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    let t0 = Instant::now();
    let o = holder.wait(Duration::from_secs(10));
    assert_eq!(o.code, Some(76), "{o:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{o:?}");
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let s = Store::new();
    let (holder, _, termed) = hold(&s, "fwd", &[]);
    holder.signal(nix::sys::signal::Signal::SIGTERM);
    let o = holder.wait(Duration::from_secs(10));
    assert!(termed.exists(), "the command got SIGTERM");
    // The command's own status (it exits 143 from its trap).
    assert_eq!(o.code, Some(143), "{o:?}");
    let o = run_quick(&s, &["--no-wait"], "fwd", &["true"]);
    assert_eq!(o.code, Some(0), "the lock was released: {o:?}");
}

#[test]
fn sigint_and_sighup_are_forwarded() {
    let s = Store::new();
    for (sig, name) in [
        (nix::sys::signal::Signal::SIGINT, "INT"),
        (nix::sys::signal::Signal::SIGHUP, "HUP"),
    ] {
        let started = s.path(&format!("started-{name}"));
        let got = s.path(&format!("got-{name}"));
        let script = format!(
            "trap 'touch {g}; exit 5' {name}; touch {s}; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done",
            g = got.display(),
            s = started.display()
        );
        let p = Proc::spawn(
            dlock(&["run", "--url", &s.url, "sig", "--", "sh", "-c", &script]),
            s.dir.path(),
        );
        assert!(wait_for_file(&started, Duration::from_secs(10)));
        p.signal(sig);
        let o = p.wait(Duration::from_secs(10));
        assert_eq!(o.code, Some(5), "{name}: {o:?}");
        assert!(got.exists(), "{name} reached the command");
    }
}

#[test]
fn signal_while_waiting_aborts_without_running() {
    let s = Store::new();
    let (holder, _, _) = hold(&s, "queue", &[]);
    let marker = s.path("ran");
    let waiter = Proc::spawn(
        dlock(&[
            "run",
            "--url",
            &s.url,
            "queue",
            "--",
            "touch",
            marker.to_str().expect("utf-8 path"),
        ]),
        s.dir.path(),
    );
    std::thread::sleep(Duration::from_millis(500));
    waiter.signal(nix::sys::signal::Signal::SIGINT);
    let o = waiter.wait(Duration::from_secs(10));
    assert_eq!(o.code, Some(130), "{o:?}");
    assert!(!marker.exists());
    drop(holder);
}

#[test]
fn hold_at_least_keeps_the_lock_after_a_quick_command() {
    let s = Store::new();
    let t0 = Instant::now();
    let o = run_quick(&s, &["--hold-at-least", "2s"], "period", &["true"]);
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(
        o.elapsed < Duration::from_millis(1500),
        "exits at once: {o:?}"
    );
    let o = run_quick(&s, &["--no-wait"], "period", &["true"]);
    assert!(t0.elapsed() < Duration::from_secs(2), "too slow to check");
    assert_eq!(o.code, Some(75), "still held: {o:?}");
    std::thread::sleep(Duration::from_millis(2300).saturating_sub(t0.elapsed()));
    let o = run_quick(&s, &["--no-wait"], "period", &["true"]);
    assert_eq!(o.code, Some(0), "free after the period: {o:?}");
}

#[test]
fn hold_at_least_shorter_than_the_command_releases_at_once() {
    let s = Store::new();
    let o = run_quick(
        &s,
        &["--hold-at-least", "200ms"],
        "short-period",
        &["sleep", "0.4"],
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    let o = run_quick(&s, &["--no-wait"], "short-period", &["true"]);
    assert_eq!(o.code, Some(0), "{o:?}");
}

#[test]
fn missing_or_unexecutable_commands_exit_127_and_126_and_release() {
    let s = Store::new();
    let o = run_quick(&s, &[], "exec", &["/nonexistent/definitely-not-here"]);
    assert_eq!(o.code, Some(127), "{o:?}");
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
    let o = run_quick(&s, &[], "exec", &["dlock-no-such-command-anywhere"]);
    assert_eq!(o.code, Some(127), "{o:?}");
    let plain = s.path("not-executable");
    std::fs::write(&plain, "echo hi\n").expect("write");
    let o = run_quick(&s, &[], "exec", &[plain.to_str().expect("utf-8 path")]);
    assert_eq!(o.code, Some(126), "{o:?}");
    let o = run_quick(&s, &[], "exec", &[s.dir.path().to_str().expect("utf-8")]);
    assert_eq!(o.code, Some(126), "a directory: {o:?}");
    let o = run_quick(&s, &["--no-wait"], "exec", &["true"]);
    assert_eq!(o.code, Some(0), "released: {o:?}");
}

#[test]
fn usage_errors_exit_64() {
    let s = Store::new();
    let long = "x".repeat(300);
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", "--bogus", "n", "--", "true"],
        vec!["run", "--url", &s.url, "--ttl", "0s", "n", "--", "true"],
        vec!["run", "--url", &s.url, "--ttl", "banana", "n", "--", "true"],
        vec!["run", "--url", &s.url, "--ttl", "10ms", "n", "--", "true"],
        vec!["run", "--url", &s.url, "--wait", "-1s", "n", "--", "true"],
        vec![
            "run",
            "--url",
            &s.url,
            "--wait",
            "5000years",
            "n",
            "--",
            "true",
        ],
        vec![
            "run",
            "--url",
            &s.url,
            "--wait",
            "1s",
            "--no-wait",
            "n",
            "--",
            "true",
        ],
        vec!["run", "--url", &s.url, "", "--", "true"],
        vec!["run", "--url", &s.url, &long, "--", "true"],
        vec!["run", "--url", "foo://bar", "n", "--", "true"],
        vec!["run", "--url", "not a url", "n", "--", "true"],
        vec!["run", "--url", "sqlite://somehost/x.db", "n", "--", "true"],
        vec!["run", "--url", &s.url, "n"],
        vec!["run"],
        vec![],
        vec!["frobnicate"],
        vec!["list", "--url", "foo://bar"],
        vec!["unlock", "--url", &s.url, "n"],
        vec!["demo", "--url", &s.url, "--buyers", "0"],
        vec!["demo", "--url", &s.url, "--tickets", "1001"],
        vec!["demo", "--url", &s.url, "--buyers", "-3"],
        vec!["demo", "--url", "mem://"],
    ];
    for args in cases {
        let o = exec(dlock(&args), s.dir.path(), Duration::from_secs(20));
        assert_eq!(o.code, Some(64), "{args:?}: {o:?}");
        assert!(!o.stderr.is_empty(), "{args:?}: says why");
        assert!(!o.stderr.contains("panicked"), "{args:?}: {o:?}");
    }
}

#[test]
fn unreachable_store_exits_69_with_one_line() {
    let s = Store::new();
    let file = s.path("a-file");
    std::fs::write(&file, "not a database, not a directory").expect("write");
    let cases = [
        "sqlite:///nonexistent-dir/x/y.db".to_string(),
        format!("sqlite://{}/y.db", file.display()),
        format!("sqlite://{}", s.dir.path().display()),
        format!("sqlite://{}", file.display()),
    ];
    for url in &cases {
        let marker = s.path("ran");
        let o = run_quick(
            &Store {
                dir: tempfile::tempdir().expect("tempdir"),
                url: url.clone(),
            },
            &[],
            "n",
            &["touch", marker.to_str().expect("utf-8 path")],
        );
        assert_eq!(o.code, Some(69), "{url}: {o:?}");
        assert_eq!(o.stderr.trim().lines().count(), 1, "{url}: {o:?}");
        assert!(!marker.exists());
        let o = exec(
            dlock(&["list", "--url", url]),
            s.dir.path(),
            Duration::from_secs(20),
        );
        assert_eq!(o.code, Some(69), "list {url}: {o:?}");
    }
}

#[test]
fn list_json_shows_a_running_hold() {
    let s = Store::new();
    let (holder, _, _) = hold(&s, "jobs/listed", &[]);
    let o = exec(
        dlock(&["list", "--url", &s.url, "--json"]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("one JSON document");
    let arr = v.as_array().expect("an array");
    assert_eq!(arr.len(), 1, "{v}");
    assert_eq!(arr[0]["name"], "jobs/listed");
    assert_eq!(arr[0]["kind"], "mutex");
    let h = &arr[0]["holders"][0];
    assert_eq!(h["pid"].as_u64(), Some(u64::from(holder.child.id())), "{v}");
    assert!(h["token"].as_u64().is_some_and(|t| t > 0), "{v}");
    assert_eq!(h["mode"], "exclusive");

    // The table shows the same hold; a prefix filters.
    let o = exec(
        dlock(&["list", "--url", &s.url]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    let mut lines = o.stdout.lines();
    let header = lines.next().expect("header");
    for col in [
        "NAME",
        "KIND",
        "MODE",
        "OWNER",
        "HOST",
        "PID",
        "TOKEN",
        "LEASE LEFT",
        "ACQUIRED AT",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let row = lines.next().expect("row");
    assert!(row.starts_with("jobs/listed"), "{row}");
    assert!(row.contains(&holder.child.id().to_string()), "{row}");
    let o = exec(
        dlock(&["list", "--url", &s.url, "other/"]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert!(o.stdout.contains("no locks held"), "{o:?}");
    let o = exec(
        dlock(&["list", "--url", &s.url, "--json", "other/"]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.stdout.trim(), "[]", "{o:?}");
    drop(holder);
}

#[test]
fn list_empty_store() {
    let s = Store::new();
    let o = exec(
        dlock(&["list", "--url", &s.url]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert_eq!(o.stdout.trim(), "no locks held");
}

#[test]
fn unlock_refuses_without_force() {
    let s = Store::new();
    let (holder, _, _) = hold(&s, "precious", &[]);
    let o = exec(
        dlock(&["unlock", "--url", &s.url, "precious"]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(64), "{o:?}");
    assert!(o.stderr.contains("--force"), "{o:?}");
    let o = run_quick(&s, &["--no-wait"], "precious", &["true"]);
    assert_eq!(o.code, Some(75), "still held: {o:?}");
    drop(holder);
    let o = exec(
        dlock(&["unlock", "--url", &s.url, "--force", "nobody-holds-this"]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.stdout.contains("removed 0 holds"), "{o:?}");
}

#[test]
fn info_prints_the_default_url() {
    let home = tempfile::tempdir().expect("tempdir");
    let state = home.path().join("state");
    let mut c = dlock(&["info"]);
    c.env("HOME", home.path()).env("XDG_STATE_HOME", &state);
    let o = exec(c, home.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(0), "{o:?}");
    let want = format!("sqlite://{}", state.join("dlock/locks.db").display());
    assert!(o.stdout.contains(&want), "{want} in {o:?}");
    assert!(o.stdout.contains(env!("CARGO_PKG_VERSION")), "{o:?}");
    assert!(o.stdout.contains("sqlite"), "{o:?}");
    assert!(o.stdout.contains("not set"), "{o:?}");

    let mut c = dlock(&["info", "--json"]);
    c.env("HOME", home.path())
        .env("XDG_STATE_HOME", &state)
        .env("DLOCK_URL", "redis://user:hunter2@example.invalid/0");
    let o = exec(c, home.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(!o.stdout.contains("hunter2"), "redacted: {o:?}");
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["default_url"], want.as_str());
    assert!(
        v["env_url"].as_str().is_some_and(|u| u.contains("***")),
        "{v}"
    );
    assert!(v["enabled_backends"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
}

#[test]
fn default_store_and_dlock_url_are_used() {
    let home = tempfile::tempdir().expect("tempdir");
    let state = home.path().join("state");
    let mut c = dlock(&["run", "default-store", "--", "true"]);
    c.env("HOME", home.path()).env("XDG_STATE_HOME", &state);
    let o = exec(c, home.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(
        state.join("dlock/locks.db").exists(),
        "created the default store"
    );

    let s = Store::new();
    let (holder, _, _) = hold(&s, "via-env", &[]);
    let mut c = dlock(&["run", "--no-wait", "via-env", "--", "true"]);
    c.env("DLOCK_URL", &s.url);
    let o = exec(c, s.dir.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(75), "DLOCK_URL names the same store: {o:?}");
    drop(holder);
}

#[test]
fn demo_oversells_without_a_lock_and_not_with_one() {
    let s = Store::new();
    let mut c = dlock(&["demo", "--url", &s.url, "--buyers", "6", "--tickets", "4"]);
    c.env("DLOCK_DEMO_SEED", "7");
    let o = exec(c, s.dir.path(), Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.elapsed < Duration::from_secs(20), "{o:?}");
    let round1 = o
        .stdout
        .lines()
        .find(|l| l.starts_with("round 1"))
        .expect("round 1 verdict");
    assert!(
        round1.contains("OVERSOLD") || round1.contains("count wrong"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("exactly 4 sold, 2 refused"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("strictly increasing"), "{}", o.stdout);
    let row2: Vec<&str> = o
        .stdout
        .lines()
        .find(|l| l.starts_with("2 dlock mutex"))
        .expect("round 2 row")
        .split_whitespace()
        .collect();
    // ROUND(3 words) BUYERS TICKETS SOLD REFUSED OVERSOLD LEFT ELAPSED
    assert_eq!(&row2[3..9], &["6", "4", "4", "2", "0", "0"], "{}", o.stdout);

    // Act 2: 4 films of 1 ticket (min(8, --tickets)), the 6 buyers' films drawn from the seed.
    assert!(
        o.stdout.contains("act 2: one lock per film"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("seed 7;"),
        "the seed is reported: {}",
        o.stdout
    );
    assert!(
        o.stdout.contains("the 4 films took") && o.stdout.contains("distinct stripes"),
        "{}",
        o.stdout
    );
    // BUYERS TICKETS SOLD REFUSED OVERSOLD LEFT ELAPSED TICKETS/S: the row's last 8 fields.
    let act2 = |prefix: &str| -> Vec<String> {
        let words: Vec<String> = o
            .stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} row: {}", o.stdout))
            .split_whitespace()
            .map(String::from)
            .collect();
        words[words.len() - 8..].to_vec()
    };
    let (a, b) = (act2("A one cinema lock"), act2("B lock per film"));
    for r in [&a, &b] {
        assert_eq!(&r[0..2], &["6", "4"], "buyers, tickets: {}", o.stdout);
        assert_eq!(r[4], "0", "none oversold: {}", o.stdout);
        let (sold, refused): (u32, u32) = (r[2].parse().unwrap(), r[3].parse().unwrap());
        assert_eq!(sold + refused, 6, "every buyer reported: {}", o.stdout);
        assert_eq!(r[5], (4 - sold).to_string(), "left: {}", o.stdout);
        assert!(
            r[7].parse::<f64>().unwrap() > 0.0,
            "tickets/s: {}",
            o.stdout
        );
    }
    // The same buyers want the same films in both rounds: the same sales.
    assert_eq!(&a[2..6], &b[2..6], "{}", o.stdout);
    for verdict in ["round A, cinema mutex:", "round B, striped lock:"] {
        let l = o
            .stdout
            .lines()
            .find(|l| l.starts_with(verdict))
            .unwrap_or_else(|| panic!("no {verdict:?} line: {}", o.stdout));
        assert!(l.ends_with("none oversold: OK"), "{l}");
    }
    assert!(
        o.stdout
            .contains("× the tickets per second of one cinema lock"),
        "{}",
        o.stdout
    );
}

#[test]
fn demo_seed_must_be_a_number() {
    let s = Store::new();
    let mut c = dlock(&["demo", "--url", &s.url]);
    c.env("DLOCK_DEMO_SEED", "banana");
    let o = exec(c, s.dir.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(64), "{o:?}");
    assert!(o.stderr.contains("DLOCK_DEMO_SEED"), "{o:?}");
    assert!(o.stdout.is_empty(), "nothing ran: {o:?}");
}

#[test]
fn help_works_for_every_subcommand() {
    let dir = tempfile::tempdir().expect("tempdir");
    for sub in ["run", "list", "info", "unlock", "demo"] {
        let o = exec(dlock(&[sub, "--help"]), dir.path(), Duration::from_secs(20));
        assert_eq!(o.code, Some(0), "{sub}: {o:?}");
        assert!(
            o.stdout.contains(&format!("Usage: dlock {sub}")),
            "{sub}: {o:?}"
        );
        let o = exec(dlock(&["help", sub]), dir.path(), Duration::from_secs(20));
        assert_eq!(o.code, Some(0), "help {sub}: {o:?}");
    }
    let o = exec(dlock(&["--help"]), dir.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(!o.stdout.contains("demo-buyer"), "the buyer is hidden");
    let o = exec(dlock(&["--version"]), dir.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(0), "{o:?}");
    assert_eq!(
        o.stdout.trim(),
        format!("dlock {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn signals_ignored_at_start_stay_ignored_for_the_command() {
    let s = Store::new();
    // `nohup dlock run ...`: the command must still ignore SIGHUP.
    let script = format!(
        "trap '' HUP; exec {BIN} run --url {} nohup -- grep SigIgn /proc/self/status",
        s.url
    );
    let mut c = Command::new("sh");
    c.args(["-c", &script]).env_remove("DLOCK_URL");
    let o = exec(c, s.dir.path(), Duration::from_secs(20));
    assert_eq!(o.code, Some(0), "{o:?}");
    let mask = o
        .stdout
        .split_whitespace()
        .nth(1)
        .and_then(|m| u64::from_str_radix(m, 16).ok())
        .expect("SigIgn mask");
    assert_eq!(mask & 1, 1, "SIGHUP (bit 0) ignored: {o:?}");
}

/// The SQLite store refuses a file on a network file system (an sshfs mount that
/// `scripts/netfs.sh` makes on loopback), says which stores to use instead, and creates nothing
/// there.
#[test]
fn sqlite_refuses_a_file_on_a_network_file_system() {
    let dir = std::env::var("DLOCK_TEST_NETFS_DIR")
        .ok()
        .filter(|d| !d.is_empty())
        .expect("DLOCK_TEST_NETFS_DIR is not set: run the tests through scripts/test.sh");
    let db = std::path::Path::new(&dir).join(format!("locks-{}.db", std::process::id()));
    let url = format!("sqlite://{}", db.display());
    let scratch = tempfile::tempdir().expect("tempdir");
    let o = exec(
        dlock(&["run", "--url", &url, "cron/hourly", "--", "true"]),
        scratch.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(64), "{o:?}");
    assert!(
        o.stderr.contains("network file system (fuse.sshfs)"),
        "{o:?}"
    );
    assert!(
        o.stderr.contains("redis://") && o.stderr.contains("postgres://"),
        "{o:?}"
    );
    assert!(
        !db.exists(),
        "a database was created on the network file system"
    );
}

/// The SQLite store's leases do not follow a process's wall clock: a process whose wall clock
/// is 2 minutes ahead or an hour behind (`faketime`, monotonic clocks left alone) neither takes
/// a live hold nor loses its own, and a short lease still ends on time.
#[test]
fn sqlite_leases_ignore_a_process_wall_clock() {
    let s = Store::new();
    let faked = |offset: &str, args: &[&str]| {
        let mut c = Command::new("faketime");
        c.args(["-f", offset, BIN])
            .args(args)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env_remove("DLOCK_URL")
            .env_remove("RUST_LOG");
        c
    };
    let wall = |offset: &str| -> i64 {
        let mut c = Command::new("faketime");
        c.args(["-f", offset, "date", "+%s"])
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        let o = exec(c, s.dir.path(), Duration::from_secs(10));
        o.stdout.trim().parse().expect("date +%s")
    };
    // faketime runs dlock as its child: the holder's pid as its hold records it.
    let holder_pid = |name: &str| {
        let o = exec(
            dlock(&["list", "--url", &s.url, "--json", name]),
            s.dir.path(),
            Duration::from_secs(20),
        );
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("list --json");
        let pid = v[0]["holders"][0]["pid"]
            .as_i64()
            .expect("the holder's pid");
        nix::unistd::Pid::from_raw(pid as i32)
    };
    // faketime shifts the wall clock of what it runs (else this test would prove nothing).
    let now = wall("+0");
    assert!((wall("+2m") - now - 120).abs() <= 2);
    assert!((wall("-1h") - now + 3600).abs() <= 2);
    for (i, (holder, taker)) in [("+0", "+2m"), ("+0", "-1h"), ("+2m", "+0"), ("-1h", "+0")]
        .into_iter()
        .enumerate()
    {
        let name = format!("clock/{i}");
        let started = s.path(&format!("started-{i}"));
        let script = format!("touch {}; sleep 20", started.display());
        let h = Proc::spawn(
            faked(
                holder,
                &[
                    "run", "--url", &s.url, "--ttl", "30s", &name, "--", "sh", "-c", &script,
                ],
            ),
            s.dir.path(),
        );
        assert!(
            wait_for_file(&started, Duration::from_secs(10)),
            "holder {holder}"
        );
        let o = exec(
            faked(
                taker,
                &["run", "--url", &s.url, "--no-wait", &name, "--", "true"],
            ),
            s.dir.path(),
            Duration::from_secs(20),
        );
        assert_eq!(
            o.code,
            Some(75),
            "a process at {taker} took the live 30 s hold of a process at {holder}: {o:?}"
        );
        let _ = nix::sys::signal::kill(holder_pid(&name), nix::sys::signal::Signal::SIGTERM);
        let o = h.wait(Duration::from_secs(10));
        assert_eq!(
            o.code,
            Some(143),
            "the holder at {holder} ended by SIGTERM: {o:?}"
        );
    }
    // An hour behind, with a 2 s lease and no renewal (SIGSTOP): the lease ends after about
    // 2 s, not an hour early or late.
    let started = s.path("started-short");
    let script = format!("touch {}; sleep 20", started.display());
    let h = Proc::spawn(
        faked(
            "-1h",
            &[
                "run", "--url", &s.url, "--ttl", "2s", "short", "--", "sh", "-c", &script,
            ],
        ),
        s.dir.path(),
    );
    assert!(wait_for_file(&started, Duration::from_secs(10)));
    let holder = holder_pid("short");
    nix::sys::signal::kill(holder, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let t0 = Instant::now();
    let o = run_quick(&s, &["--wait", "10s"], "short", &["true"]);
    assert_eq!(o.code, Some(0), "{o:?}");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "a 2 s lease of a process an hour behind ended {took:?} after its last renewal"
    );
    let _ = nix::sys::signal::kill(holder, nix::sys::signal::Signal::SIGCONT);
    let o = h.wait(Duration::from_secs(15));
    assert_eq!(
        o.code,
        Some(76),
        "the paused holder found its lock lost: {o:?}"
    );
}

/// Starts `dlock run` waiting for `name` (held by someone else); its command, once it has the
/// lock, touches `<name>-got` and runs for at most 10 s. Returns when the store lists the waiter
/// (`--fair`: a lease store keeps only fair waiters in the store, so only those are listed).
fn wait_on(store: &Store, name: &str) -> (Proc, PathBuf) {
    let got = store.path(&format!("{}-got", name.replace('/', "_")));
    let script = format!(
        "touch {g}; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done",
        g = got.display()
    );
    let p = Proc::spawn(
        dlock(&[
            "run", "--url", &store.url, "--fair", name, "--", "sh", "-c", &script,
        ]),
        store.dir.path(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = exec(
            dlock(&["list", "--url", &store.url, "--json", name]),
            store.dir.path(),
            Duration::from_secs(20),
        );
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("list --json");
        if v[0]["waiters"].as_array().is_some_and(|w| {
            w.iter()
                .any(|w| w["pid"].as_u64() == Some(p.child.id().into()))
        }) {
            return (p, got);
        }
        assert!(Instant::now() < deadline, "the waiter never showed: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pids of a `dlock list --json` record's holders and waiters.
fn pids(v: &serde_json::Value, key: &str) -> Vec<u64> {
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l[key].as_array().cloned().unwrap_or_default())
        .filter_map(|h| h["pid"].as_u64())
        .collect()
}

/// Starts `dlock` with stdout on a pipe, each line sent to the returned channel.
fn spawn_lines(
    cmd: Command,
    dir: &std::path::Path,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut cmd = cmd;
    cmd.current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn dlock");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn wait_child(child: &mut std::process::Child, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dlock did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn list_watch_json_lines_show_a_release_between_rounds() {
    let s = Store::new();
    let (holder, _, _) = hold(&s, "jobs/stuck", &[]);
    let (waiter, got) = wait_on(&s, "jobs/stuck");
    let (holder_pid, waiter_pid) = (u64::from(holder.child.id()), u64::from(waiter.child.id()));
    let (mut watch, lines) = spawn_lines(
        dlock(&[
            "list",
            "--url",
            &s.url,
            "--watch",
            "--json",
            "--count",
            "3",
            "--interval",
            "700ms",
        ]),
        s.dir.path(),
    );
    let next = || {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a round within 10 s");
        serde_json::from_str::<serde_json::Value>(&line)
            .unwrap_or_else(|e| panic!("not one JSON document per line: {e}: {line}"))
    };
    let first = next();
    assert_eq!(pids(&first, "holders"), vec![holder_pid], "{first}");
    assert_eq!(pids(&first, "waiters"), vec![waiter_pid], "{first}");
    // The holder lets go; the waiter takes the lock before a later round.
    drop(holder);
    assert!(
        wait_for_file(&got, Duration::from_secs(10)),
        "the waiter never got the lock"
    );
    let _second = next();
    let third = next();
    assert_eq!(pids(&third, "holders"), vec![waiter_pid], "{third}");
    assert!(pids(&third, "waiters").is_empty(), "{third}");
    assert_eq!(wait_child(&mut watch, Duration::from_secs(10)), Some(0));
    assert!(
        lines.recv_timeout(Duration::from_secs(1)).is_err(),
        "three rounds, three lines"
    );
    drop(waiter);
}

#[test]
fn list_watch_into_a_pipe_prints_each_round_without_escape_codes() {
    let s = Store::new();
    let (holder, _, _) = hold(&s, "jobs/piped", &[]);
    let (waiter, _) = wait_on(&s, "jobs/piped");
    let o = exec(
        dlock(&[
            "list",
            "--url",
            &s.url,
            "--watch",
            "--count",
            "3",
            "--interval",
            "200ms",
        ]),
        s.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(!o.stdout.contains('\x1b'), "{o:?}");
    let heads: Vec<&str> = o
        .stdout
        .lines()
        .filter(|l| l.starts_with("dlock list on "))
        .collect();
    assert_eq!(heads.len(), 3, "{}", o.stdout);
    assert!(
        heads[0].contains(&s.url) && heads[0].contains("every 200ms"),
        "{}",
        heads[0]
    );
    assert!(heads[2].contains("round 3"), "{}", heads[2]);
    // Each round: the table with the holder and the waiter.
    let rounds: Vec<&str> = o.stdout.split("dlock list on ").skip(1).collect();
    for r in &rounds {
        assert!(r.contains("NAME"), "{r}");
        let (hp, wp) = (holder.child.id().to_string(), waiter.child.id().to_string());
        assert!(
            r.lines().any(|l| !l.contains("waiting") && l.contains(&hp)),
            "{r}"
        );
        let waiting = r
            .lines()
            .find(|l| l.contains("waiting #1"))
            .unwrap_or_default();
        assert!(waiting.contains(&wp), "{r}");
    }
    // An empty store says so in every round.
    let e = Store::new();
    let o = exec(
        dlock(&[
            "list",
            "--url",
            &e.url,
            "--watch",
            "--count",
            "2",
            "--interval",
            "100ms",
        ]),
        e.dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert_eq!(o.stdout.matches("no locks held").count(), 2, "{o:?}");
    drop(waiter);
    drop(holder);
}

#[test]
fn list_watch_usage_errors_exit_64() {
    let s = Store::new();
    for args in [
        vec!["--watch", "--interval", "0s"],
        vec!["--watch", "--interval", "10ms"],
        vec!["--watch", "--interval", "2h"],
        vec!["--watch", "--interval", "banana"],
        vec!["--watch", "--count", "0"],
        vec!["--interval", "1s"],
        vec!["--count", "3"],
    ] {
        let mut all = vec!["list", "--url", &s.url];
        all.extend_from_slice(&args);
        let o = exec(dlock(&all), s.dir.path(), Duration::from_secs(20));
        assert_eq!(o.code, Some(64), "{args:?}: {o:?}");
        assert!(!o.stderr.is_empty(), "{args:?}: says why");
    }
}

#[test]
fn list_watch_on_a_terminal_redraws_and_ends_cleanly_on_sigterm() {
    use std::io::Read;
    use std::os::fd::{AsFd, OwnedFd};
    let s = Store::new();
    let (holder, _, _) = hold(&s, "jobs/tty", &[]);
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let slave: OwnedFd = pty.slave;
    let mut cmd = dlock(&["list", "--url", &s.url, "--watch", "--interval", "200ms"]);
    cmd.current_dir(s.dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(
            slave.as_fd().try_clone_to_owned().expect("dup"),
        ))
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("spawn dlock");
    drop(cmd);
    drop(slave);
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut master = std::fs::File::from(pty.master);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // Ends with EIO once the child has exited and the last slave descriptor is closed.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    const CLEAR: &str = "\x1b[H\x1b[2J";
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while String::from_utf8_lossy(&seen).matches(CLEAR).count() < 3 {
        assert!(
            Instant::now() < deadline,
            "no three redraws: {:?}",
            String::from_utf8_lossy(&seen)
        );
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(100)) {
            seen.extend(b);
        }
    }
    let mut watch = Proc {
        child,
        out: PathBuf::new(),
        err: PathBuf::new(),
        started: Instant::now(),
    };
    watch.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        wait_child(&mut watch.child, Duration::from_secs(10)),
        Some(0)
    );
    while let Ok(b) = rx.recv_timeout(Duration::from_millis(500)) {
        seen.extend(b);
    }
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(
        text.starts_with("\x1b[?25l"),
        "the cursor is hidden: {text:?}"
    );
    assert!(
        text.ends_with("\x1b[?25h"),
        "the cursor is shown again: {text:?}"
    );
    let round = text.split(CLEAR).nth(2).unwrap_or_default();
    assert!(
        round.contains("dlock list on ") && round.contains("round 2"),
        "{round:?}"
    );
    assert!(round.contains(&holder.child.id().to_string()), "{round:?}");
    drop(holder);
}

/// A command for a sentinel to kill: `sleep 30` in a process group of its own.
fn group_to_reap(dir: &std::path::Path) -> Proc {
    let mut cmd = Command::new("sleep");
    std::os::unix::process::CommandExt::process_group(cmd.arg("30"), 0);
    Proc::spawn(cmd, dir)
}

/// `in_` from now, as a time of the machine's monotonic clock (what the sentinel is told).
fn monotonic_in(in_: Duration) -> Duration {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    Duration::from(now) + in_
}

/// `dlock reap-group` of `command`'s group with `extra` arguments, its stderr in
/// `dir/sentinel-err`, and the write end of its pipe (kept open: a closed pipe makes the sentinel
/// kill the group for another reason).
fn start_sentinel(
    command: &Proc,
    dir: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, std::process::ChildStdin) {
    let err = std::fs::File::create(dir.join("sentinel-err")).expect("stderr file");
    let mut sentinel = Command::new(BIN)
        .args(["reap-group", &command.pid().as_raw().to_string()])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stderr(err)
        .spawn()
        .expect("spawn the sentinel");
    let words = sentinel.stdin.take().expect("stdin");
    (sentinel, words)
}

/// The sentinel ended by itself (exit 0) and said it killed the group because dlock was silent.
fn assert_sentinel_killed_for_silence(mut sentinel: std::process::Child, dir: &std::path::Path) {
    assert_eq!(sentinel.wait().expect("sentinel").code(), Some(0));
    let said = std::fs::read_to_string(dir.join("sentinel-err")).unwrap_or_default();
    assert!(
        said.contains("did not vouch for the hold in time") && said.contains("[monotonic "),
        "{said}"
    );
}

/// The sentinel of `dlock run` (`dlock reap-group`) takes the end of the trust as a time of the
/// machine's monotonic clock: a word it reads late (the sentinel still starting, or starved of
/// CPU) does not give the command more time than dlock gave it.
#[test]
fn the_sentinel_does_not_extend_a_trust_it_reads_late() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let command = group_to_reap(dir.path());
    let until = monotonic_in(Duration::from_secs(2));
    // dlock wrote the word with 2 s of trust left; the sentinel reads it 2.2 s later.
    std::thread::sleep(Duration::from_millis(2200));
    let (sentinel, mut words) = start_sentinel(&command, dir.path(), &[]);
    let told = Instant::now();
    words
        .write_all(format!("U{}\n", until.as_micros()).as_bytes())
        .expect("write the word");
    let ended = command.wait(Duration::from_secs(5));
    let took = told.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the command was killed {took:?} after the sentinel read a trust that had run out: {ended:?}"
    );
    assert_sentinel_killed_for_silence(sentinel, dir.path());
    drop(words);
}

/// The sentinel starts with its first deadline (`--until`): a dlock stopped before it says a
/// word still has its command killed when the trust it had at the start runs out.
#[test]
fn the_sentinel_kills_at_its_first_deadline_without_a_word() {
    let dir = tempfile::tempdir().expect("tempdir");
    let command = group_to_reap(dir.path());
    let until = monotonic_in(Duration::from_millis(500));
    let started = Instant::now();
    // Open and silent, as the pipe of a stopped dlock is.
    let (sentinel, words) = start_sentinel(
        &command,
        dir.path(),
        &["--until", &until.as_micros().to_string()],
    );
    let ended = command.wait(Duration::from_secs(10));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "killed {took:?} after the start with 500 ms of trust: {ended:?}"
    );
    assert_sentinel_killed_for_silence(sentinel, dir.path());
    drop(words);
}
