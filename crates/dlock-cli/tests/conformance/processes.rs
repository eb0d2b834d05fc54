//! The conformance scenarios that need separate OS processes: `dlock run` processes of this
//! package's binary sharing the store with the test. One `pub async fn(Store)` each, on the
//! library's harness ([`dlock::conformance`]).

use super::{dlock_run, read_text, store_url, DLOCK_BIN};
use dlock::conformance::harness::{ms, secs};
use dlock::conformance::{assert_strictly_increasing, describe, join_all, must, within, Store};
use dlock::Wakeups;
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
