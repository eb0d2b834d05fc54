//! `dlock run` and `dlock hold` keep their promise of one holder at a time, through real
//! processes and real signals, on every store: SQLite, Redis, Redlock, PostgreSQL and MySQL in
//! lease and session mode, ZooKeeper.
//!
//! - a killed dlock (SIGKILL) takes its command and everything in the command's process group
//!   with it, and a paused dlock (SIGSTOP) keeps others out for its `--ttl`, no longer;
//! - a forced unlock revokes: the holder stops its command's whole group before anyone else is
//!   granted the lock; a hold nobody renews any more is removed at once;
//! - `--hold-at-least` keeps others out for the whole window on every store;
//! - a SIGTERM sent to dlock's whole process group (as `timeout(1)` sends it) reaches the
//!   command once, and the release after it is not reported as failed;
//! - `-s`/`-x`/`--permits` and `dlock hold`.
//!
//! Server-backed stores take their URLs from the environment `scripts/test.sh` sets (a test
//! fails, never skips, without them). Each test uses lock names of its own.

#[path = "support/mod.rs"]
mod support;

use nix::sys::signal::Signal;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Sqlite,
    Redis,
    Redlock,
    Postgres,
    PostgresSession,
    Mysql,
    MysqlSession,
    Zookeeper,
    Etcd,
}

impl Store {
    /// Holds live as long as the holder's session (a hold-at-least window is kept by a dlock
    /// that stays).
    fn session(self) -> bool {
        matches!(
            self,
            Store::PostgresSession | Store::MysqlSession | Store::Zookeeper | Store::Etcd
        )
    }

    /// Only mutexes (no read-write locks or semaphores).
    fn mutex_only(self) -> bool {
        matches!(
            self,
            Store::Redlock | Store::PostgresSession | Store::MysqlSession
        )
    }
}

/// One test's store: its URL, a scratch directory and a lock name of its own.
struct T {
    url: String,
    dir: tempfile::TempDir,
    name: String,
}

fn env(var: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

/// `url` with `key=value` among its query options.
fn with_option(url: &str, kv: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{kv}")
}

/// `url` without its `session_timeout` (ZooKeeper) or `ttl` (etcd) option, so that `--ttl` sets
/// it.
fn without_session_timeout(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.starts_with("session_timeout=") && !kv.starts_with("ttl="))
        .collect();
    if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    }
}

fn target(s: Store) -> T {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = match s {
        Store::Sqlite => format!("sqlite://{}", dir.path().join("locks.db").display()),
        Store::Redis => env("DLOCK_TEST_REDIS_URL"),
        Store::Redlock => env("DLOCK_TEST_REDLOCK_URL"),
        Store::Postgres => env("DLOCK_TEST_POSTGRES_URL"),
        Store::PostgresSession => with_option(&env("DLOCK_TEST_POSTGRES_URL"), "mode=session"),
        Store::Mysql => env("DLOCK_TEST_MYSQL_URL"),
        Store::MysqlSession => with_option(&env("DLOCK_TEST_MYSQL_URL"), "mode=session"),
        Store::Zookeeper => without_session_timeout(&env("DLOCK_TEST_ZK_URL")),
        Store::Etcd => without_session_timeout(&env("DLOCK_TEST_ETCD_URL")),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    T {
        url,
        dir,
        name: format!("safety/{}", &id[..12]),
    }
}

impl T {
    fn path(&self, f: &str) -> std::path::PathBuf {
        self.dir.path().join(f)
    }

    /// `dlock run --url URL OPTS... NAME -- sh -c SCRIPT`.
    fn run(&self, opts: &[&str], script: &str) -> std::process::Command {
        let mut args = vec!["run", "--url", &self.url];
        args.extend_from_slice(opts);
        args.extend_from_slice(&[&self.name, "--", "sh", "-c", script]);
        dlock(&args)
    }

    fn spawn_run(&self, opts: &[&str], script: &str) -> Proc {
        Proc::spawn(self.run(opts, script), self.dir.path())
    }

    fn exec_run(&self, opts: &[&str], script: &str) -> Out {
        exec(
            self.run(opts, script),
            self.dir.path(),
            Duration::from_secs(40),
        )
    }

    /// `dlock run --no-wait NAME -- true`: 0 if the lock was free, 75 if not.
    fn try_now(&self, opts: &[&str]) -> Out {
        let mut o = vec!["--no-wait"];
        o.extend_from_slice(opts);
        self.exec_run(&o, "true")
    }

    fn unlock(&self, how: &str) -> Out {
        exec(
            dlock(&["unlock", "--url", &self.url, how, &self.name]),
            self.dir.path(),
            Duration::from_secs(20),
        )
    }

    /// A script that writes "OVERLAP" to `result` if the process whose pid is in `pidfile` is
    /// still alive (a zombie is not), else "ok".
    fn overlap_check(&self, pidfile: &Path, result: &Path) -> String {
        format!(
            "w=$(cat {p}); st=$(cut -d' ' -f3 /proc/$w/stat 2>/dev/null); \
             if [ -n \"$st\" ] && [ \"$st\" != Z ]; then echo OVERLAP; else echo ok; fi > {r}",
            p = pidfile.display(),
            r = result.display()
        )
    }
}

/// Whether process `pid` is alive (a zombie is not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z"),
        Err(_) => false,
    }
}

/// The pid written to `p` (waits up to 10 s for it).
fn pid_in(p: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = std::fs::read_to_string(p) {
            if let Ok(pid) = s.trim().parse() {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "no pid in {}", p.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `f()` holds, at most `limit`; the time it took.
fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    t0.elapsed()
}

/// A command that records its pid and a worker's (a background child in its process group),
/// then waits (at most a minute).
fn leader_and_worker(t: &T) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let (leader, worker) = (t.path("leader"), t.path("worker"));
    let script = format!(
        "echo $$ > {l}.tmp && mv {l}.tmp {l}; sleep 60 & echo $! > {w}.tmp && mv {w}.tmp {w}; wait",
        l = leader.display(),
        w = worker.display()
    );
    (script, leader, worker)
}

// ---- the scenarios --------------------------------------------------------------------------

/// SIGKILL of `dlock run` itself: its command and the command's worker die at once, and the next
/// holder starts only after them, within the lease (`--ttl`) of the dead dlock.
fn killed_dlock_takes_its_command_group_with_it(s: Store) {
    let t = target(s);
    let (script, leader, worker) = leader_and_worker(&t);
    let holder = t.spawn_run(&["--ttl", "3s"], &script);
    let (l, w) = (pid_in(&leader), pid_in(&worker));
    holder.signal(Signal::SIGKILL);
    let killed = Instant::now();
    until(
        Duration::from_secs(3),
        "the command and its worker to die with dlock",
        || !alive(l) && !alive(w),
    );
    let result = t.path("result");
    let o = t.exec_run(&["--wait", "30s"], &t.overlap_check(&worker, &result));
    let took = killed.elapsed();
    assert_eq!(o.code, Some(0), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(&result).unwrap_or_default().trim(),
        "ok"
    );
    // A session store frees the lock when the session ends: at once for a killed process's
    // connection, after the session timeout (`--ttl`) on ZooKeeper.
    assert!(
        took < Duration::from_secs(3 + 4),
        "the next holder got the lock {took:?} after the kill; --ttl is 3s"
    );
    drop(holder);
}

/// A forced unlock revokes: the holder learns it at its next renewal, stops its command's whole
/// group (the worker too), and only then is the waiter granted the lock.
fn revoked_lock_stops_the_group_before_the_next_holder_runs(s: Store) {
    let t = target(s);
    let (script, _, worker) = leader_and_worker(&t);
    let holder = t.spawn_run(&["--ttl", "3s", "--kill-after", "5s"], &script);
    pid_in(&worker);
    let result = t.path("result");
    let waiter = t.spawn_run(&["--wait", "40s"], &t.overlap_check(&worker, &result));
    std::thread::sleep(Duration::from_millis(300));
    let o = t.unlock("--force");
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.stdout.contains("revoked 1 hold"), "{o:?}");
    let h = holder.wait(Duration::from_secs(10));
    assert_eq!(h.code, Some(76), "the revoked holder: {h:?}");
    assert!(h.stderr.contains("revoked"), "{h:?}");
    let w = waiter.wait(Duration::from_secs(20));
    assert_eq!(w.code, Some(0), "the waiter: {w:?}");
    assert_eq!(
        std::fs::read_to_string(&result).unwrap_or_default().trim(),
        "ok",
        "the next holder ran while the revoked holder's worker was alive"
    );
}

/// `--break` removes the hold now (the emergency path), and says so.
fn break_removes_the_hold_at_once(s: Store) {
    let t = target(s);
    let holder = t.spawn_run(&["--ttl", "30s"], "sleep 30");
    until(Duration::from_secs(10), "the holder to hold", || {
        t.try_now(&[]).code == Some(75)
    });
    let o = t.unlock("--break");
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.stdout.contains("removed 1 hold"), "{o:?}");
    let o = t.try_now(&[]);
    assert_eq!(o.code, Some(0), "right after --break: {o:?}");
    drop(holder);
}

/// `--hold-at-least` keeps others out for the whole window: a lease store keeps the hold after
/// dlock exits, a session store keeps the dlock process holding it.
fn hold_at_least_keeps_others_out_for_the_window(s: Store) {
    let t = target(s);
    let started = Instant::now();
    let holder = t.spawn_run(&["--ttl", "2s", "--hold-at-least", "5s"], "true");
    std::thread::sleep(Duration::from_millis(1500));
    let o = t.try_now(&[]);
    assert_eq!(o.code, Some(75), "a --no-wait run inside the window: {o:?}");
    let h = holder.wait(Duration::from_secs(10));
    assert_eq!(h.code, Some(0), "{h:?}");
    if s.session() {
        assert!(
            h.elapsed >= Duration::from_secs(4),
            "a session store's dlock must stay for the window: it exited after {:?}",
            h.elapsed
        );
    }
    let left = Duration::from_millis(5500).saturating_sub(started.elapsed());
    std::thread::sleep(left);
    until(
        Duration::from_secs(5),
        "the lock to be free after the window",
        || t.try_now(&[]).code == Some(0),
    );
}

/// A revoke removes a hold nobody renews any more (a `--hold-at-least` window after the command
/// ended) at once; on a session store the dlock that keeps the window learns of the revoke and
/// lets go.
fn revoke_ends_a_hold_at_least_window(s: Store) {
    let t = target(s);
    let holder = t.spawn_run(&["--ttl", "3s", "--hold-at-least", "60s"], "true");
    if !s.session() {
        let h = holder.wait(Duration::from_secs(10));
        assert_eq!(h.code, Some(0), "{h:?}");
        let o = t.unlock("--force");
        assert_eq!(o.code, Some(0), "{o:?}");
        assert!(
            o.stdout.contains("removed 1 hold"),
            "a detached hold is removed: {o:?}"
        );
        let o = t.try_now(&[]);
        assert_eq!(o.code, Some(0), "right after the revoke: {o:?}");
        return;
    }
    until(Duration::from_secs(10), "the window to be held", || {
        t.try_now(&[]).code == Some(75)
    });
    let o = t.unlock("--force");
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.stdout.contains("revoked 1 hold"), "{o:?}");
    until(Duration::from_secs(6), "the lock after the revoke", || {
        t.try_now(&[]).code == Some(0)
    });
    let h = holder.wait(Duration::from_secs(10));
    assert_eq!(h.code, Some(76), "{h:?}");
}

/// A paused dlock (SIGSTOP) keeps others out for about its `--ttl` (the lease; ZooKeeper's
/// session timeout; in SQL session mode the server ends the idle session), not for longer and
/// not for much less; its sentinel kills the command when the trust runs out, and says so;
/// continued, dlock finds the lock lost (exit 76).
fn paused_dlock_keeps_others_out_for_its_ttl(s: Store) {
    let t = target(s);
    let ready = t.path("ready");
    // Verbose, so that a failure shows what each process saw and when.
    let holder = t.spawn_run(
        &["-v", "--ttl", "3s", "--kill-after", "1s"],
        &format!("touch {}; sleep 60", ready.display()),
    );
    // Paused once its command runs under the sentinel's watch (a dlock stopped before it starts
    // the sentinel is the one case the sentinel cannot cover; see child.rs).
    assert!(
        wait_for_file(&ready, Duration::from_secs(10)),
        "the command did not start"
    );
    until(Duration::from_secs(5), "the sentinel to run", || {
        has_sentinel(holder.pid())
    });
    holder.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    let o = t.exec_run(&["-v", "--wait", "30s"], "true");
    let took = paused.elapsed();
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(3 + 4),
        "taken over {took:?} after the pause; --ttl is 3s: {o:?}"
    );
    holder.signal(Signal::SIGCONT);
    let h = holder.wait(Duration::from_secs(15));
    assert_eq!(h.code, Some(76), "{h:?}");
    // The sentinel says why the command died, and when.
    assert!(
        h.stderr.contains("did not vouch for the hold in time") && h.stderr.contains("[monotonic "),
        "{h:?}"
    );
}

/// Whether `dlock` process `pid` has its sentinel (`dlock reap-group`) as a child.
fn has_sentinel(pid: nix::unistd::Pid) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let p = e.path();
        // `pid (comm) state ppid ...`: the parent is the second field after the comm.
        let parent = std::fs::read_to_string(p.join("stat")).ok().and_then(|st| {
            let rest = st.rsplit_once(')')?.1;
            rest.split_whitespace().nth(1)?.parse::<i32>().ok()
        });
        parent == Some(pid.as_raw())
            && std::fs::read(p.join("cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"reap-group"))
    })
}

/// A SIGTERM sent to dlock's whole process group (`timeout(1)`) reaches the command once, and a
/// release that went through is not reported as failed.
fn group_sigterm_reaches_the_command_once(s: Store) {
    let t = target(s);
    let terms = t.path("terms");
    let ready = t.path("ready");
    let script = format!(
        "trap 'echo TERM >> {x}' TERM; touch {r}; sleep 20 & wait; wait",
        x = terms.display(),
        r = ready.display()
    );
    // timeout(1) sends its signal to its child and to its whole process group.
    let mut cmd = std::process::Command::new("timeout");
    cmd.args([
        "-s", "TERM", "4", BIN, "run", "--url", &t.url, &t.name, "--",
    ])
    .args(["sh", "-c", &script])
    .env_remove("DLOCK_URL")
    .env_remove("RUST_LOG");
    let p = Proc::spawn(cmd, t.dir.path());
    assert!(
        wait_for_file(&ready, Duration::from_secs(4)),
        "the command did not start before timeout(1) fired"
    );
    let o = p.wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(124), "{o:?}");
    let n = std::fs::read_to_string(&terms)
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(n, 1, "the command got {n} SIGTERMs");
    assert!(!o.stderr.contains("could not release"), "{o:?}");
    let o = t.try_now(&[]);
    assert_eq!(o.code, Some(0), "released: {o:?}");
}

/// `-s` readers share and exclude a writer (`-x`); `--permits N` admits N. Mutex-only stores
/// say so clearly.
fn shared_exclusive_and_permits(s: Store) {
    let t = target(s);
    if s.mutex_only() {
        let o = t.try_now(&["-s"]);
        assert_eq!(o.code, Some(69), "{o:?}");
        assert!(
            o.stderr.contains("mutex"),
            "the refusal names what is supported: {o:?}"
        );
        return;
    }
    let r1 = t.spawn_run(&["-s"], "sleep 20");
    until(Duration::from_secs(10), "the first reader to hold", || {
        t.try_now(&["-x"]).code == Some(75)
    });
    assert_eq!(t.try_now(&["-s"]).code, Some(0), "a second reader shares");
    drop(r1);
    until(
        Duration::from_secs(10),
        "the writer after the reader",
        || t.try_now(&["-x"]).code == Some(0),
    );
    let t = target(s);
    let p1 = t.spawn_run(&["--permits", "2"], "sleep 20");
    let p2 = t.spawn_run(&["--permits", "2"], "sleep 20");
    until(Duration::from_secs(10), "two permits to be taken", || {
        t.try_now(&["--permits", "2"]).code == Some(75)
    });
    let o = t.try_now(&["--permits", "2", "-E", "9"]);
    assert_eq!(o.code, Some(9), "-E sets the exit code: {o:?}");
    drop((p1, p2));
}

/// `dlock hold` prints the token, holds until its stdin ends or a signal, and ends when the
/// process that started it exits.
fn hold_holds_until_stdin_ends_a_signal_or_its_parent_exits(s: Store) {
    use std::io::BufRead;
    let t = target(s);
    let start_hold = || {
        std::process::Command::new(BIN)
            .args(["hold", "--url", &t.url, "--ttl", "3s", &t.name])
            .env_remove("DLOCK_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dlock hold")
    };
    let read_token = |c: &mut std::process::Child| {
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("read the token");
        line
    };
    let wait = |c: &mut std::process::Child| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = c.try_wait().expect("try_wait") {
                return st.code();
            }
            assert!(Instant::now() < deadline, "dlock hold did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // stdin ends
    let mut c = start_hold();
    let token = read_token(&mut c);
    assert!(token.ends_with('\n'), "{token:?}");
    if s != Store::Redlock {
        assert!(token.trim().parse::<u64>().is_ok(), "the token: {token:?}");
    }
    assert_eq!(t.try_now(&[]).code, Some(75), "held");
    drop(c.stdin.take());
    assert_eq!(wait(&mut c), Some(0));
    assert_eq!(t.try_now(&[]).code, Some(0), "released at the end of stdin");
    // a signal
    let mut c = start_hold();
    read_token(&mut c);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), Signal::SIGTERM)
        .expect("kill");
    assert_eq!(wait(&mut c), Some(0));
    assert_eq!(t.try_now(&[]).code, Some(0), "released on SIGTERM");
    // its parent exits (a script's background job: stdin is /dev/null)
    let tok = t.path("token");
    let script = format!(
        "{BIN} hold --url '{}' --ttl 3s '{}' > {} & sleep 2",
        t.url,
        t.name,
        tok.display()
    );
    let mut sh = std::process::Command::new("sh")
        .args(["-c", &script])
        .env_remove("DLOCK_URL")
        .spawn()
        .expect("spawn sh");
    until(
        Duration::from_secs(10),
        "the background hold to take the lock",
        || std::fs::read_to_string(&tok).is_ok_and(|s| s.ends_with('\n')),
    );
    assert_eq!(
        t.try_now(&[]).code,
        Some(75),
        "held by the script's background job"
    );
    let _ = sh.wait();
    until(
        Duration::from_secs(5),
        "the lock after the script exited",
        || t.try_now(&[]).code == Some(0),
    );
}

/// One test per scenario for one store, in a module named after the store.
macro_rules! scenarios_for {
    ($store:ident, $s:expr; $($scenario:ident),+ $(,)?) => {
        mod $store {
            use super::*;
            $(
                #[test]
                fn $scenario() {
                    super::$scenario($s)
                }
            )+
        }
    };
}

/// Every scenario on every store.
macro_rules! stores {
    ($($store:ident: $s:expr),+ $(,)?) => {
        $(
            scenarios_for!($store, $s;
                killed_dlock_takes_its_command_group_with_it,
                revoked_lock_stops_the_group_before_the_next_holder_runs,
                break_removes_the_hold_at_once,
                hold_at_least_keeps_others_out_for_the_window,
                revoke_ends_a_hold_at_least_window,
                paused_dlock_keeps_others_out_for_its_ttl,
                group_sigterm_reaches_the_command_once,
                shared_exclusive_and_permits,
                hold_holds_until_stdin_ends_a_signal_or_its_parent_exits,
            );
        )+
    };
}

stores!(
    sqlite: Store::Sqlite,
    redis: Store::Redis,
    redlock: Store::Redlock,
    postgres: Store::Postgres,
    postgres_session: Store::PostgresSession,
    mysql: Store::Mysql,
    mysql_session: Store::MysqlSession,
    zookeeper: Store::Zookeeper,
    etcd: Store::Etcd,
);

/// On ZooKeeper `--ttl` is the session timeout dlock asks for; when the ensemble grants another
/// one (its maxSessionTimeout is 20 s here), dlock says so.
#[test]
fn zookeeper_says_when_the_session_timeout_is_not_the_ttl() {
    let t = target(Store::Zookeeper);
    let o = t.exec_run(&["--ttl", "60s", "--no-wait"], "true");
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(
        o.stderr.contains("session timeout") && o.stderr.contains("20s"),
        "{o:?}"
    );
    let o = t.exec_run(&["--ttl", "3s", "--no-wait"], "true");
    assert!(!o.stderr.contains("session timeout"), "{o:?}");
}
