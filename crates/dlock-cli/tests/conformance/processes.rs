//! The conformance scenarios that need separate OS processes: `dlock run` processes of this
//! package's binary sharing the store with the test. One `pub async fn(Store)` each, on the
//! library's harness ([`dlock::conformance`]).

use super::{dlock_run, read_text, store_url, DLOCK_BIN};
use dlock::conformance::harness::{ms, secs};
use dlock::conformance::{assert_strictly_increasing, describe, join_all, must, within, Store};
use dlock::Wakeups;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::time::sleep;

// ---- 2 ------------------------------------------------------------------------------------------

/// 4 worker tasks each run `dlock run --ttl 5s NAME -- sh -c '<read counter; sleep; write +1;
/// log token>'` 8 times (4 processes at a time, 32 in all): the counter ends at 32, and the
/// tokens in the log, in append order, strictly increase.
pub async fn mutual_exclusion_processes(s: Store) {
    let url = store_url(&s).to_owned();
    let fencing = s.client().await.capabilities().fencing;
    let name = s.name("procs");
    let counter = s.dir.join("counter");
    let log = s.dir.join("tokens.log");
    std::fs::write(&counter, "0\n").expect("write the counter file");
    let script = r#"n=$(cat "$1"); sleep 0.02; echo $((n + 1)) > "$1"; echo "$DLOCK_TOKEN $DLOCK_NAME" >> "$2""#;
    let mut workers = Vec::new();
    for w in 0..4 {
        let url = url.clone();
        let name = name.clone();
        let counter = counter.to_str().expect("utf-8 temp path").to_owned();
        let log = log.to_str().expect("utf-8 temp path").to_owned();
        workers.push(tokio::spawn(async move {
            for k in 0..8 {
                let what = format!("worker {w} run {k}: `dlock run`");
                let cmd = ["sh", "-c", script, "sh", &counter, &log];
                let out = within(
                    secs(30),
                    &what,
                    dlock_run(&url, &["--ttl", "5s"], &name, &cmd).output(),
                )
                .await
                .unwrap_or_else(|e| panic!("{what}: cannot start {DLOCK_BIN}: {e}"));
                assert!(
                    out.status.success(),
                    "{what} exited with {} (75 = not acquired); stderr: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }));
    }
    within(
        secs(50),
        "32 `dlock run` processes, 4 at a time",
        join_all("mutual_exclusion_processes", workers),
    )
    .await;
    assert_eq!(
        read_text(&counter).trim(),
        "32",
        "the counter after 32 locked read-sleep-write runs in 4 concurrent processes \
         (less means two runs overlapped)"
    );
    let log = read_text(&log);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 32, "token log lines: {log:?}");
    let mut tokens = Vec::new();
    for line in &lines {
        let (token, got_name) = line.split_once(' ').unwrap_or((line, ""));
        assert_eq!(
            got_name, name,
            "DLOCK_NAME given to the command (line {line:?})"
        );
        if fencing {
            tokens.push(
                token
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("DLOCK_TOKEN {token:?} is not a number")),
            );
        }
    }
    if fencing {
        assert_strictly_increasing("DLOCK_TOKEN values in append order", &tokens);
    }
}
// ---- 5 (the process part; the in-process part is in the library) ------------------------------

/// A holder that vanishes without releasing, here a SIGKILLed `dlock run --ttl 2s NAME -- sleep
/// 60` (in its own process group, killed once it holds), blocks the lock until its last renewal's
/// lease runs out (at once where a hold ends with its holder's connection): a waiter gets it
/// then, no later and not much sooner.
pub async fn holder_killed_taken_over(s: Store) {
    let c = &s.client().await;
    use nix::sys::signal::{killpg, Signal};
    let name = s.name("killed");
    let lease = secs(2);
    let stderr_path = s.dir.join("killed-holder.stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("create a stderr file");
    let mut child = dlock_run(store_url(&s), &["--ttl", "2s"], &name, &["sleep", "60"])
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {DLOCK_BIN}: {e}"));
    let pid = child.id().expect("the child's pid");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            panic!(
                "`dlock run --ttl 2s {name} -- sleep 60` exited with {status} instead of holding; stderr: {}",
                read_text(&stderr_path)
            );
        }
        if let Some(info) = describe(c, &name).await {
            assert!(
                info.holders.iter().any(|h| h.meta.pid == pid),
                "the lock is held, but not by the `dlock run` process {pid}: {:?}",
                info.holders
            );
            break;
        }
        assert!(
            started.elapsed() < secs(10),
            "`dlock run` (pid {pid}) did not show up as the holder within 10 s; stderr: {}",
            read_text(&stderr_path)
        );
        sleep(ms(20)).await;
    }
    // Let it renew once or twice, then kill dlock and its command together.
    sleep(ms(900)).await;
    killpg(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL)
        .expect("SIGKILL the holder's process group");
    let killed = Instant::now();
    let g = must(
        "waiter: acquire after the holder process was killed",
        c.mutex(&name)
            .expect("a valid lock name")
            .acquire_timeout(secs(8)),
    )
    .await;
    let after = killed.elapsed();
    eprintln!("killed `dlock run` (2 s lease): taken over {after:?} after the kill");
    // The store keeps the hold for a lease from the last renewal, which was sent at most lease/3
    // (one renewal period) before the kill; a session lock ends with the killed connection.
    let earliest = if s.caps.ends_with_connection {
        Duration::ZERO
    } else {
        lease - lease / 3 - ms(200)
    };
    assert!(
        after >= earliest,
        "the waiter was granted {after:?} after the holder was killed; its last renewal was at most \
         {:?} before the kill, so its {lease:?} lease holds at least {earliest:?}",
        lease / 3
    );
    assert!(
        after <= lease + ms(1500),
        "the waiter was granted {after:?} after the holder was killed; expected within lease + 1.5 s"
    );
    let status = within(secs(5), "reap the killed `dlock run`", child.wait())
        .await
        .expect("wait for the child");
    assert!(
        !status.success(),
        "the killed `dlock run` exited with {status}"
    );
    let info = describe(c, &name).await.expect("the waiter's hold");
    assert_eq!(info.holders.len(), 1, "holders: {:?}", info.holders);
    assert_eq!(info.holders[0].owner, g.owner());
    assert_eq!(info.holders[0].meta.pid, std::process::id());
    must("waiter: release", g.release()).await;
}

// ---- 14 (the process part; the in-process part is in the library) -----------------------------

/// With a 30 s lease (so expiry cannot explain a grant) a `dlock run` waiting in another process
/// is woken when the lock is released: it gets the lock, runs `true` and exits within the
/// store's wake-up bound (500 ms, or its declared longest poll + 500 ms) + 500 ms.
pub async fn waiter_wakes_by_notification(s: Store) {
    let c1 = s.client_with_lease(secs(30)).await;
    let wakeups = c1.capabilities().wakeups;
    let bound = match wakeups {
        Wakeups::Native => ms(500),
        Wakeups::Polling { max, .. } => max + ms(500),
    };
    let name = s.name("wake");
    // A waiter in another process (`dlock run`) is woken too.
    let g = must(
        "holder: acquire",
        c1.mutex(&name).expect("a valid lock name").acquire(),
    )
    .await;
    let stderr_path = s.dir.join("waiter.stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("create a stderr file");
    let mut child = dlock_run(store_url(&s), &["--ttl", "30s"], &name, &["true"])
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {DLOCK_BIN}: {e}"));
    sleep(ms(1000)).await; // it starts, tries, and waits
    if let Some(status) = child.try_wait().expect("poll the child") {
        panic!(
            "`dlock run {name} -- true` finished ({status}) while the lock was held; stderr: {}",
            read_text(&stderr_path)
        );
    }
    let released = Instant::now();
    must("holder: release", g.release()).await;
    let status = within(secs(25), "the waiting `dlock run`", child.wait())
        .await
        .expect("wait for the child");
    let after = released.elapsed();
    eprintln!("waiter in another process: done {after:?} after the release");
    assert!(
        status.success(),
        "the waiting `dlock run` exited with {status}; stderr: {}",
        read_text(&stderr_path)
    );
    let pbound = bound + ms(500);
    assert!(
        after <= pbound,
        "the `dlock run` waiting in another process got the lock, ran `true` and exited {after:?} \
         after the release; expected within {pbound:?} (wakeups: {wakeups:?})"
    );
}

// ---- leader election through processes ---------------------------------------------------------

/// A `dlock elect --url URL --ttl 2s --value V NAME -- sh -c <heartbeat>` process; its command
/// appends `<term>/<its pid> <ns since the epoch>` to `log` every 20 ms while it runs (the pid
/// tells terms apart on a store without fencing tokens).
fn dlock_elect(
    url: &str,
    name: &str,
    value: &str,
    log: &Path,
    stderr: &Path,
) -> tokio::process::Child {
    let beat =
        r#"while :; do echo "${DLOCK_TERM:-none}/$$ $(date +%s%N)" >> "$1"; sleep 0.02; done"#;
    let stderr = std::fs::File::create(stderr).expect("create a stderr file");
    tokio::process::Command::new(DLOCK_BIN)
        .args([
            "elect",
            "-v",
            "--url",
            url,
            "--ttl",
            "2s",
            "--kill-after",
            "1s",
        ])
        .args(["--value", value, name, "--", "sh", "-c", beat, "sh"])
        .arg(log)
        .env_remove("DLOCK_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {DLOCK_BIN} elect: {e}"))
}

/// The heartbeats of each term, in the order the terms first appear: (term, first, last).
fn terms(log: &Path) -> Vec<(String, u128, u128)> {
    let mut out: Vec<(String, u128, u128)> = Vec::new();
    for line in read_text(log).lines() {
        let mut f = line.split(' ');
        let (Some(term), Some(Ok(t))) = (f.next(), f.next().map(str::parse::<u128>)) else {
            continue; // a line being written
        };
        match out.iter_mut().find(|(x, _, _)| x == term) {
            Some(e) => e.2 = e.2.max(t),
            None => out.push((term.to_owned(), t, t)),
        }
    }
    out
}

/// Waits until a term other than those in `seen` beats in `log`; answers it and how long that took.
async fn next_term(log: &Path, seen: &[String], limit: Duration, what: &str) -> (String, Duration) {
    let started = Instant::now();
    loop {
        if let Some((t, _, _)) = terms(log).into_iter().find(|(t, _, _)| !seen.contains(t)) {
            return (t, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "{what}: no new term within {limit:?}; log:\n{}",
            read_text(log)
        );
        sleep(ms(20)).await;
    }
}

/// Two `dlock elect` supervisors: the standby takes over within the 2 s term + a margin after
/// the leader is SIGKILLed, and again after the new leader is SIGSTOPped past its term (whose
/// command is then killed by its sentinel, before the standby leads); the commands of two terms
/// never run at once, and each term is greater than the one before. In SQL session mode a
/// stopped leader's connection keeps its server lock, so the SIGSTOP part is not run there (a
/// stopped holder there holds until its connection dies: docs/BACKENDS.md).
pub async fn elect_standby_takes_over(s: Store) {
    use nix::sys::signal::{kill, killpg, Signal};
    use nix::unistd::Pid;
    let url = store_url(&s).to_owned();
    let caps = s.client().await.capabilities();
    let fencing = caps.fencing;
    // A store without values takes only the empty value.
    let v = |x: &'static str| if caps.values { x } else { "" };
    let name = s.name("elect");
    let log = s.dir.join("terms.log");
    let err = |w: &str| s.dir.join(format!("elect-{w}.stderr"));
    let mut a = dlock_elect(&url, &name, v("a"), &log, &err("a"));
    let (ta, _) = next_term(&log, &[], secs(10), "the first supervisor leads").await;
    let mut b = dlock_elect(&url, &name, v("b"), &log, &err("b"));
    sleep(ms(800)).await;
    assert_eq!(
        terms(&log).len(),
        1,
        "the standby ran its command while the leader led:\n{}",
        read_text(&log)
    );

    // SIGKILL the leader (dlock and its command's group).
    let pid_a = a.id().expect("a's pid") as i32;
    killpg(Pid::from_raw(pid_a), Signal::SIGKILL).expect("SIGKILL the leader's group");
    let (tb, took) = next_term(
        &log,
        std::slice::from_ref(&ta),
        secs(10),
        "the standby leads after SIGKILL",
    )
    .await;
    eprintln!("dlock elect: SIGKILLed leader followed after {took:?}");
    assert!(
        took <= secs(2) + ms(2500),
        "the standby led {took:?} after the leader's SIGKILL (term 2 s)"
    );
    let _ = a.wait().await;

    let mut seen = vec![ta, tb];
    if !s.caps.ends_with_connection {
        // SIGSTOP the leader's dlock only: its command keeps running unless the sentinel ends it.
        let mut c = dlock_elect(&url, &name, v("c"), &log, &err("c"));
        sleep(ms(500)).await;
        let pid_b = b.id().expect("b's pid") as i32;
        kill(Pid::from_raw(pid_b), Signal::SIGSTOP).expect("SIGSTOP the leader");
        let (tc, took) = next_term(&log, &seen, secs(12), "the standby leads after SIGSTOP").await;
        eprintln!("dlock elect: SIGSTOPped leader followed after {took:?}");
        assert!(
            took <= secs(2) + ms(3000),
            "the standby led {took:?} after the leader's SIGSTOP (term 2 s)"
        );
        seen.push(tc);
        sleep(ms(300)).await;
        kill(Pid::from_raw(pid_b), Signal::SIGCONT).expect("SIGCONT the old leader");
        sleep(ms(800)).await;
        assert_eq!(
            terms(&log).len(),
            seen.len(),
            "the continued old leader ran its command again while another led:\n{}",
            read_text(&log)
        );
        let _ = killpg(
            Pid::from_raw(c.id().expect("c's pid") as i32),
            Signal::SIGKILL,
        );
        let _ = c.wait().await;
    }
    let _ = killpg(
        Pid::from_raw(b.id().map_or(0, |p| p as i32)),
        Signal::SIGKILL,
    );
    let _ = b.wait().await;

    let all = terms(&log);
    for w in all.windows(2) {
        assert!(
            w[0].2 < w[1].1,
            "term {} beat until {} ns, after term {} began at {} ns: two commands at once",
            w[0].0,
            w[0].2,
            w[1].0,
            w[1].1
        );
    }
    if fencing {
        let nums: Vec<u64> = all
            .iter()
            .map(|(t, _, _)| {
                let term = t.split('/').next().unwrap_or_default();
                term.parse()
                    .unwrap_or_else(|_| panic!("term {t:?} is not a number"))
            })
            .collect();
        assert_strictly_increasing("the terms in the order they led", &nums);
    }
}

// ---- multi-locks through processes -------------------------------------------------------------

/// The environment variable `name` of the child role, which the parent always sets.
fn child_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the multi-lock child needs {name}"))
}

/// The child role of the multi-lock scenarios: when a scenario's test re-executes itself with
/// `DLOCK_MULTI_CHILD` set, it takes the multi-lock `DLOCK_MULTI_NAMES` (comma-separated, in the
/// given order) on `DLOCK_MULTI_URL` `DLOCK_MULTI_ROUNDS` times (0: once, holding until killed),
/// appending `in <pid>` / `out <pid>` around each hold to `DLOCK_MULTI_LOG`.
async fn multi_child() {
    let url = child_var("DLOCK_MULTI_URL");
    let names: Vec<String> = child_var("DLOCK_MULTI_NAMES")
        .split(',')
        .map(str::to_owned)
        .collect();
    let rounds: u32 = child_var("DLOCK_MULTI_ROUNDS")
        .parse()
        .expect("a round count");
    let log = std::path::PathBuf::from(child_var("DLOCK_MULTI_LOG"));
    let append = |what: &str| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the log");
        writeln!(f, "{what} {}", std::process::id()).expect("append to the log");
    };
    let opts = dlock::ClientOptions::default().lease(secs(2));
    let client = dlock::connect_with(&url, opts).await.expect("connect");
    let m = client.multi(names).expect("valid names");
    if rounds == 0 {
        append("waiting");
        let g = m.acquire().await.expect("the multi-lock");
        append("in");
        std::future::pending::<()>().await;
        drop(g);
    }
    for _ in 0..rounds {
        let g = m.acquire().await.expect("the multi-lock");
        append("in");
        sleep(ms(10)).await;
        append("out");
        g.release().await.expect("release");
    }
}

/// Whether this process is a re-executed multi-lock child.
fn is_multi_child() -> bool {
    std::env::var_os("DLOCK_MULTI_CHILD").is_some()
}

/// A re-execution of this test binary, running only the test `test` (the scenario's own), in
/// the child role.
fn multi_child_process(
    test: &str,
    url: &str,
    names: &[String],
    rounds: u32,
    log: &Path,
) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env("DLOCK_MULTI_CHILD", "1")
        .env("DLOCK_MULTI_URL", url)
        .env("DLOCK_MULTI_NAMES", names.join(","))
        .env("DLOCK_MULTI_ROUNDS", rounds.to_string())
        .env("DLOCK_MULTI_LOG", log)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the multi-lock child")
}

/// Two processes take a multi-lock of the same three names, one naming them in reverse order,
/// 10 rounds each: neither deadlocks and they never hold at once.
pub async fn multi_lock_processes(s: Store) {
    if is_multi_child() {
        return multi_child().await;
    }
    let url = store_url(&s).to_owned();
    let names: Vec<String> = ["p-1", "p-2", "p-3"].iter().map(|n| s.name(n)).collect();
    let reversed: Vec<String> = names.iter().rev().cloned().collect();
    let log = s.dir.join("multi.log");
    let mut a = multi_child_process(&s.test, &url, &names, 10, &log);
    let mut b = multi_child_process(&s.test, &url, &reversed, 10, &log);
    for (what, c) in [("forward", &mut a), ("reverse", &mut b)] {
        let st = within(secs(40), format!("the {what} multi-lock process"), c.wait())
            .await
            .expect("wait for the child");
        assert!(
            st.success(),
            "the {what} multi-lock process exited with {st}"
        );
    }
    let text = read_text(&log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        40,
        "10 rounds of two processes, in and out:\n{text}"
    );
    for pair in lines.chunks(2) {
        let pid = pair[0]
            .strip_prefix("in ")
            .unwrap_or_else(|| panic!("{pair:?} in:\n{text}"));
        assert_eq!(
            pair[1],
            format!("out {pid}"),
            "two holders at once:\n{text}"
        );
    }
}

/// A process that waits for a multi-lock while one of its names is held, having taken the
/// others, is SIGKILLed: the names it took are free again after its lease (at once where a
/// hold ends with its connection), and the whole set can be taken.
pub async fn multi_lock_killed_waiter_leaves_nothing(s: Store) {
    if is_multi_child() {
        return multi_child().await;
    }
    let c = s.client().await;
    let url = store_url(&s).to_owned();
    let names: Vec<String> = ["k-1", "k-2", "k-3"].iter().map(|n| s.name(n)).collect();
    let last = must(
        "hold the last name",
        c.mutex(&names[2]).expect("a name").acquire(),
    )
    .await;
    let log = s.dir.join("killed-multi.log");
    let mut w = multi_child_process(&s.test, &url, &names, 0, &log);
    let started = Instant::now();
    loop {
        let mut held = 0;
        for n in &names[..2] {
            held += describe(&c, n).await.is_some_and(|i| !i.holders.is_empty()) as usize;
        }
        if held == 2 {
            break;
        }
        assert!(
            started.elapsed() < secs(15),
            "the child never took the first two names; log: {}",
            read_text(&log)
        );
        sleep(ms(20)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(w.id().expect("the child's pid") as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL the waiting child");
    let _ = w.wait().await;
    let killed = Instant::now();
    for n in &names[..2] {
        dlock::conformance::eventually(
            secs(8),
            format!("{n:?} is free after the waiter was killed"),
            || async { describe(&c, n).await.map_or(true, |i| i.holders.is_empty()) },
        )
        .await;
    }
    eprintln!(
        "killed multi-lock waiter: its names free {:?} after the kill",
        killed.elapsed()
    );
    must("release the last name", last.release()).await;
    let all = must(
        "the whole set",
        c.multi(names.clone()).expect("names").try_acquire(),
    )
    .await;
    assert_eq!(all.len(), 3);
    must("release", all.release()).await;
}

/// A follower's observer in this process sees a leader elected in another process, and its
/// resignation, by the store's notification where the store has one for a watcher (SQLite,
/// Redis, PostgreSQL lease mode: within 1.5 s while the observer's own interval is 60 s);
/// elsewhere by its interval (300 ms).
pub async fn observer_sees_other_processes(s: Store) {
    use nix::sys::signal::{kill, Signal};
    let c = s.client().await;
    let caps = c.capabilities();
    let native = caps.wakeups == Wakeups::Native && !caps.queues_waiters && caps.values;
    let name = s.name("observed");
    let every = if native { secs(60) } else { ms(300) };
    let mut observer = c
        .election(&name)
        .expect("a name")
        .observe_every(every)
        .observe();
    assert!(must("nobody leads yet", observer.next()).await.is_none());
    let value = if caps.values { "there" } else { "" };
    let log = s.dir.join("observed.log");
    let mut leader = dlock_elect(
        store_url(&s),
        &name,
        value,
        &log,
        &s.dir.join("observed.stderr"),
    );
    let bound = if native { ms(1500) } else { every + ms(1500) };
    let started = Instant::now();
    let seen = within(
        secs(10) + bound,
        "the observer sees the new leader",
        observer.next(),
    )
    .await
    .expect("observe")
    .expect("a leader");
    let took = started.elapsed();
    assert_eq!(seen.holder.meta.pid, leader.id().expect("pid"));
    if caps.values {
        assert_eq!(seen.value.as_deref(), Some("there"));
    }
    // The leader's own start (connect, campaign) is in `took`; the notification is what makes
    // it fast: without one the observer would look only after `every`.
    assert!(took < secs(10), "observed the leader after {took:?}");
    sleep(ms(300)).await;
    kill(
        nix::unistd::Pid::from_raw(leader.id().expect("pid") as i32),
        Signal::SIGTERM,
    )
    .expect("SIGTERM the leader");
    let resigned = Instant::now();
    let gone = within(
        bound + secs(3),
        "the observer sees the resignation",
        observer.next(),
    )
    .await
    .expect("observe");
    let took = resigned.elapsed();
    assert!(gone.is_none(), "after the resignation: {gone:?}");
    assert!(
        took <= bound,
        "observed the resignation after {took:?} (bound {bound:?}, interval {every:?})"
    );
    let _ = leader.wait().await;
}
