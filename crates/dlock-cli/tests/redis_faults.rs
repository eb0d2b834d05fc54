//! Redis under faults, and next to a client from another ecosystem. Each test that breaks a server
//! starts its own `redis-server` on a free loopback port (`dlock_testkit::RedisServer`, stopped by
//! pid when the test ends); the interop test uses the suite's server (`DLOCK_TEST_REDIS_URL`,
//! started by `scripts/test.sh`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::{free_port, RedisServer as Server};

fn unique(what: &str) -> String {
    format!("faults/{what}/{}", uuid::Uuid::new_v4())
}

fn lease() -> Duration {
    Duration::from_millis(1500)
}

async fn client(url: &str) -> dlock::Client {
    dlock::connect_with(url, dlock::ClientOptions::default().lease(lease()))
        .await
        .unwrap()
}

/// Without persistence a restart loses the lock **and** the fencing counter: the holder's `lost()`
/// fires (renewal finds the key gone), another client is granted the lock, and its token is not
/// greater than the old holder's — the documented limit of a non-persistent Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_fires_lost_and_shows_the_token_going_back() {
    let mut server =
        Server::start(&["--save", "", "--appendonly", "no"]).expect("a private redis-server");
    let url = server.url();
    let name = unique("nopersist");
    let a = client(&url).await;
    let mut last = 0;
    for _ in 0..3 {
        let g = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
        last = g.token().unwrap();
        g.release().await.unwrap();
    }
    let g = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let held_token = g.token().unwrap();
    assert!(held_token > last);
    server.restart().expect("redis-server restarts");
    let lost = tokio::time::timeout(lease() * 2, g.lost()).await;
    assert!(
        lost.is_ok(),
        "lost() did not fire after the server lost the key"
    );
    assert!(!g.is_held());
    let b = client(&url).await;
    let g2 = tokio::time::timeout(
        Duration::from_secs(5),
        b.mutex(name.as_str()).unwrap().acquire(),
    )
    .await
    .expect("the lock is free after the restart")
    .unwrap();
    let t2 = g2.token().unwrap();
    eprintln!("token before restart {held_token}, after restart {t2}");
    assert!(
        t2 <= held_token,
        "without persistence the fence restarts: expected a token ≤ {held_token}, got {t2}"
    );
}

/// With AOF and `appendfsync always` the lock and the fence survive a crash of the server: the
/// hold is renewed again once the server is back (its token still matches), and the next grant's
/// token is greater than every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_aof_always_keeps_the_lock_and_the_fence() {
    let mut server = Server::start(&[
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])
    .expect("a private redis-server");
    let url = server.url();
    let name = unique("aof");
    let a = client(&url).await;
    let g = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let t1 = g.token().unwrap();
    server.restart().expect("redis-server restarts");
    // Longer than the lease: the hold lives only if renewals reach the restarted server.
    tokio::time::sleep(lease() * 2).await;
    assert!(
        g.is_held(),
        "the hold did not survive the restart with AOF always"
    );
    let b = client(&url).await;
    assert!(b.mutex(name.as_str()).unwrap().try_acquire().await.is_err());
    g.release().await.unwrap();
    let g2 = b.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    assert!(g2.token().unwrap() > t1, "the fence went back despite AOF");
}

/// A server that forgot dlock's scripts (`SCRIPT FLUSH`; a restart does the same) answers
/// `NOSCRIPT`: each call loads its script again and goes on — a waiter's grab, the holder's
/// release with its hand-off, and the full rule's script of a read lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_load_their_scripts_again_after_the_server_forgot_them() {
    let server =
        Server::start(&["--save", "", "--appendonly", "no"]).expect("a private redis-server");
    let url = server.url();
    let name = unique("noscript");
    let (a, b) = (client(&url).await, client(&url).await);
    let g = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let t1 = g.token().unwrap();
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let m = b.mutex(name.as_str()).unwrap();
    let waiter = tokio::spawn(async move { m.acquire().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    g.release().await.unwrap();
    let t2 = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was granted after the release")
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(t2 > t1, "token {t2} after {t1}");
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let rw = unique("noscript-rw");
    let r = a.rwlock(rw.as_str()).unwrap().read().await.unwrap();
    r.release().await.unwrap();
}

/// A waiting acquisition dropped while its first grab is on the way back (the server has
/// registered it as a waiter, the client has not read the answer) still takes its record out
/// of the waiter set: otherwise the next release hands the lock to that gone owner, and the
/// lock stays taken until its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_before_its_busy_answer_leaves_no_record_behind() {
    let server =
        Server::start(&["--save", "", "--appendonly", "no"]).expect("a private redis-server");
    let url = server.url();
    let upstream: std::net::SocketAddr = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let proxy = dlock_testkit::TcpProxy::start(upstream).await.unwrap();
    let name = unique("dropped-waiter");
    let waiters = format!("dlock:{{{name}}}:w");
    let a = client(&url).await;
    let b = dlock::connect_with(
        &format!("redis://{}/", proxy.addr()),
        dlock::ClientOptions::default().lease(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let g = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    // Every chunk between b and the server now takes 300 ms each way.
    proxy.set_delay(Duration::from_millis(300));
    let m = b.mutex(name.as_str()).unwrap();
    let waiter = tokio::spawn(async move { m.acquire().await.map(drop) });
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.cli(&["ZCARD", &waiters]) != "1" {
        assert!(Instant::now() < deadline, "the waiter never registered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Registered on the server; its answer is still on the way back.
    waiter.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.cli(&["EXISTS", &waiters]) != "0" {
        assert!(
            Instant::now() < deadline,
            "the dropped waiter's record stayed in the waiter set"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g.release().await.unwrap();
    let c = client(&url).await;
    let next = c.mutex(name.as_str()).unwrap().try_acquire().await;
    assert!(
        next.is_ok(),
        "the lock went to the dropped waiter: {next:?}"
    );
}

/// A server that is down at connect time is reported as unavailable, quickly, without a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_at_start_is_unavailable_quickly() {
    let port = free_port().expect("a free port"); // nothing listens there
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        dlock::connect(&format!("redis://127.0.0.1:{port}/")),
    )
    .await
    .expect("connect to a closed port must not hang");
    let e = r.expect_err("connecting to a closed port must fail");
    assert!(matches!(e, dlock::Error::Unavailable(_)), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// A wrong password gives a clear error that never contains the password, from the library
/// (`InvalidConfig`: retrying will not help) and from the CLI (exit 64, one line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_clear_and_never_printed() {
    let server = Server::start(&["--save", "", "--requirepass", "right-secret-123"])
        .expect("a private redis-server");
    let bad = format!("redis://:wrong-secret-456@127.0.0.1:{}/", server.port);
    let e = match dlock::connect(&bad).await {
        Ok(c) => c.mutex("x").unwrap().try_acquire().await.err().unwrap(),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(matches!(e, dlock::Error::InvalidConfig(_)), "{e:?}");
    assert!(!msg.contains("wrong-secret-456"), "{msg}");
    assert!(
        msg.to_lowercase().contains("auth") || msg.contains("password"),
        "{msg}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["list", "--url", &bad])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(!stderr.contains("wrong-secret-456"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    let good = format!("redis://:right-secret-123@127.0.0.1:{}/", server.port);
    let c = dlock::connect(&good).await.unwrap();
    let g = c.mutex(unique("auth")).unwrap().acquire().await.unwrap();
    assert!(g.token().is_some());
}

fn python_script(dir: &Path) -> PathBuf {
    let p = dir.join("interop.py");
    std::fs::write(
        &p,
        r#"
import sys, time, redis
url, key, mode = sys.argv[1], sys.argv[2], sys.argv[3]
r = redis.Redis.from_url(url)
lock = r.lock(key, timeout=10)
if mode == "hold":
    assert lock.acquire(blocking=True, blocking_timeout=10), "redis-py could not acquire"
    print("held", flush=True)
    sys.stdin.readline()          # hold until told
    lock.release()
    print("released", flush=True)
elif mode == "try":
    print("acquired" if lock.acquire(blocking=False) else "busy", flush=True)
"#,
    )
    .unwrap();
    p
}

/// A redis-py `Lock` (SET NX PX with a token, Lua release) on the key of a dlock Mutex and the dlock
/// Mutex exclude each other, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_lock_and_dlock_mutex_exclude_each_other() {
    use std::io::{BufRead, BufReader, Write};
    let url =
        std::env::var("DLOCK_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let dir = tempfile::tempdir().unwrap();
    let script = python_script(dir.path());
    let name = unique("interop");
    let key = format!("dlock:{{{name}}}");
    let c = dlock::connect(&url).await.unwrap();

    // redis-py holds → dlock is busy; redis-py releases → dlock gets it.
    let mut py = Command::new("python3")
        .arg(&script)
        .args([&url, &key, "hold"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with redis-py (scripts/test.sh installs it)");
    let mut out = BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "held");
    let m = c.mutex(name.as_str()).unwrap();
    assert!(m.try_acquire().await.unwrap_err().is_not_granted());
    let waiter = tokio::spawn({
        let m = c.mutex(name.as_str()).unwrap();
        async move { m.acquire_timeout(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    py.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "released");
    let g = waiter
        .await
        .unwrap()
        .expect("dlock gets the lock after redis-py released it");
    py.wait().unwrap();

    // dlock holds → redis-py is refused.
    let o = Command::new("python3")
        .arg(&script)
        .args([&url, &key, "try"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "busy");
    g.release().await.unwrap();
    let o = Command::new("python3")
        .arg(&script)
        .args([&url, &key, "try"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "acquired");
}

/// `dlock run` and `dlock list` work against Redis: a running hold is listed with its token, pid
/// and lease, found by a key-space scan under the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_run_and_list_work_on_redis() {
    let url =
        std::env::var("DLOCK_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let name = unique("cli");
    let mut run = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args([
            "run", "--url", &url, "--ttl", "5s", &name, "--", "sleep", "30",
        ])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["list", "--url", &url, "--json", &name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v.as_array().is_some_and(|a| !a.is_empty()) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the hold never showed up in dlock list"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // SIGTERM: dlock forwards it to `sleep`, releases the lock and exits (nothing left behind).
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = run.wait();
    let lock = &listed[0];
    assert_eq!(lock["name"], name.as_str());
    let holder = &lock["holders"][0];
    assert_eq!(holder["pid"], run.id());
    assert!(holder["token"].as_u64().is_some_and(|t| t >= 1), "{holder}");
    let left = holder["lease_left_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 5000, "{holder}");
}

/// `rediss://` speaks TLS and verifies the server against the system's roots: a server whose
/// (self-signed) certificate the roots do not hold is refused with a certificate error (exit 69),
/// and the same server is accepted once its certificate is a trusted root (`SSL_CERT_FILE`, which
/// the system OpenSSL reads for its default roots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_verifies_the_server_against_the_system_roots() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .expect("openssl must be installed (scripts/test.sh installs it)");
    assert!(made.success());
    let tls_port = free_port().expect("a free port");
    let server = Server::start(&[
        "--save",
        "",
        "--port",
        "0",
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--tls-ca-cert-file",
        cert.to_str().unwrap(),
        "--tls-auth-clients",
        "no",
    ])
    .expect("a private redis-server with TLS");
    let url = format!("rediss://localhost:{tls_port}/");
    let name = unique("tls");
    let dlock_run = |trust: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
        c.args(["run", "--url", &url, "--no-wait", &name, "--"])
            .args(["sh", "-c", "echo token=$DLOCK_TOKEN"]);
        if trust {
            c.env("SSL_CERT_FILE", &cert);
        } else {
            c.env_remove("SSL_CERT_FILE");
        }
        c.output().unwrap()
    };
    let refused = dlock_run(false);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(69), "{err}");
    assert!(err.contains("certificate"), "{err}");
    let ok = dlock_run(true);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "token=1");
    drop(server);
}

/// `dlock list --watch` outlives a store that goes away: the rounds while it is down show the
/// error, the next rounds show the locks again, and SIGTERM ends the watch with exit 0.
#[test]
fn list_watch_shows_a_store_that_went_away_and_tries_again() {
    use std::io::BufRead;
    let mut server = Server::start(&[]).unwrap();
    let mut watch = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args([
            "list",
            "--url",
            &server.url(),
            "--watch",
            "--interval",
            "200ms",
            "--count",
            "200",
        ])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let mut wait_for = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(l) => {
                    let found = l.contains(what);
                    seen.push(l);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no {what:?} within 15 s; the view so far:\n{}",
                    seen.join("\n")
                ),
            }
        }
    };
    wait_for("no locks held");
    server.stop();
    wait_for("cannot list locks");
    server.spawn().unwrap();
    wait_for("no locks held");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = watch.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the watch did not end on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    drop(server);
}
