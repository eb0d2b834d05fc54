//! Bad input at the library and the CLI: malformed URLs, hostile lock names, absurd durations and
//! bad flags. Every one gets a clear error or works; none panics, none hangs (every call is
//! bounded), none corrupts another lock.
//!
//! The servers come from `scripts/test.sh` through `DLOCK_TEST_{REDIS,REDIS_SENTINEL,REDIS_CLUSTER,POSTGRES,MYSQL,ZK,REDLOCK}_URL`;
//! a missing variable fails the test (it never skips).

use dlock::{Client, ClientOptions, Error};
use std::ffi::OsString;
use std::future::Future;
use std::os::unix::ffi::OsStringExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");
/// The bound of one library call that must finish (connect, acquire a free lock, list, release).
const STEP: Duration = Duration::from_secs(15);
/// A password that must never show up in any output.
const SECRET: &str = "hunter2sekrit";

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {STEP:?} (a hang)"),
    }
}

fn env_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(u) if !u.trim().is_empty() => u,
        _ => panic!(
            "{var} is not set: run the tests through scripts/test.sh, which starts the server and \
             sets {var}"
        ),
    }
}

fn uniq() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// Every store the tests can reach: (backend, URL, shared between processes, has fencing).
fn stores(dir: &std::path::Path) -> Vec<(&'static str, String, bool, bool)> {
    vec![
        ("mem", format!("mem://bad-input-{}", uniq()), false, true),
        (
            "sqlite",
            format!("sqlite://{}", dir.join("locks.db").display()),
            true,
            true,
        ),
        ("redis", env_url("DLOCK_TEST_REDIS_URL"), true, true),
        (
            "redis-sentinel",
            env_url("DLOCK_TEST_REDIS_SENTINEL_URL"),
            true,
            true,
        ),
        (
            "redis-cluster",
            env_url("DLOCK_TEST_REDIS_CLUSTER_URL"),
            true,
            true,
        ),
        ("postgres", env_url("DLOCK_TEST_POSTGRES_URL"), true, true),
        ("mysql", env_url("DLOCK_TEST_MYSQL_URL"), true, true),
        ("zookeeper", env_url("DLOCK_TEST_ZK_URL"), true, true),
        ("etcd", env_url("DLOCK_TEST_ETCD_URL"), true, true),
        ("redlock", env_url("DLOCK_TEST_REDLOCK_URL"), true, false),
    ]
}

/// Runs `dlock ARGS` with a time limit; returns (exit code, stdout, stderr). Fails on a panic
/// message or a hang.
fn cli(args: &[OsString], env: &[(&str, &str)]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(DLOCK);
    cmd.args(args)
        .env_remove("DLOCK_URL")
        .env("HOME", dir.path())
        .env("XDG_STATE_HOME", dir.path())
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start dlock");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dlock {args:?} did not finish within 30 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "dlock {args:?} panicked: {stderr}"
    );
    let code = out.status.code().unwrap_or_else(|| {
        panic!(
            "dlock {args:?} was killed by a signal ({:?}): {stderr}",
            out.status
        )
    });
    (code, stdout, stderr)
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Asserts `dlock ARGS` is a usage error (exit 64) with a one-line-ish message and no secret.
fn usage_error(args: &[OsString], env: &[(&str, &str)]) -> String {
    let (code, stdout, stderr) = cli(args, env);
    assert_eq!(
        code, 64,
        "dlock {args:?}: expected a usage error (64), got {code}\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.trim().is_empty(), "dlock {args:?}: no message");
    assert!(
        !stderr.contains(SECRET),
        "dlock {args:?} shows the password: {stderr}"
    );
    stderr
}

// ---------------------------------------------------------------------------------------------
// URLs

/// URLs that must be refused as configuration errors, without connecting anywhere.
fn bad_config_urls() -> Vec<String> {
    let pg = env_url("DLOCK_TEST_POSTGRES_URL");
    let my = env_url("DLOCK_TEST_MYSQL_URL");
    let zk = env_url("DLOCK_TEST_ZK_URL");
    let zk_hosts = zk
        .strip_prefix("zk://")
        .and_then(|r| r.split('/').next())
        .expect("DLOCK_TEST_ZK_URL is zk://HOSTS/…")
        .to_string();
    let q = |base: &str, opt: &str| {
        let sep = if base.contains('?') { '&' } else { '?' };
        format!("{base}{sep}{opt}")
    };
    let mut v: Vec<String> = [
        "",
        " ",
        "mem:// x",
        "nope",
        "://x",
        "foo://x",
        "etcd://",
        "etcd://h:0/x",
        "etcd://h/x?ttl=0s",
        "etcd://h/x?ttl=2h",
        "etcd://h/x?bogus=1",
        "etcd://:pw@h/x",
        "etcd://h/x?ca=/ca.pem",
        "http://example.com/",
        "redis://:99999",
        "redis://h:99999/",
        "redis://[::1",
        "redis://h:6379/notadb",
        "redis://h:6379/0#frag",
        "redis:///0",
        "redis://h/?bogus=1",
        "redis://h/?timeout=-1s",
        "redis://h/?timeout=1000years",
        "redis://h/?connect_timeout=NaN",
        "redis://h/?hashtag=maybe",
        "redis://h/?prefix=%7B",
        "redis://h/%zz",
        "postgres://",
        "postgresql://",
        "mysql://",
        "mariadb://",
        "zk://",
        "zk://h:0",
        "zk://h:99999",
        "zk://h,,k",
        "zk://[::1",
        "zk://h/a/../b",
        "zk://h/%ff",
        "redlock://",
        "redlock://127.0.0.1:6379",
        "redlock://127.0.0.1:6379,127.0.0.1:6380",
        "redlock://h:1,h:2,h:99999",
        "redlock://h:1,,h:3",
        "sqlite://",
        "sqlite:",
        "sqlite:///",
        "sqlite://host/x.db",
        "sqlite:///tmp/x.db?bogus=1",
        "sqlite:///tmp/%ff%fe.db",
        "mem://x?bogus=1",
        "%%%%",
        "%ff://x",
        "\u{0}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(format!("redis://h:6379/{}", "9".repeat(10_000)));
    v.push(format!("zk://{}", "h,".repeat(10_000)));
    v.push(format!("redlock://{}", "h:1,".repeat(10_000)));
    v.push("x".repeat(1_000_000));
    v.push(q(&pg, "table=x;drop"));
    v.push(q(&pg, "table=x%3Bdrop%20table%20y"));
    v.push(q(&pg, "mode=bogus"));
    v.push(q(&pg, "bogus=1"));
    v.push(q(&my, "table=a'b"));
    v.push(q(&my, "mode=bogus"));
    v.push(q(&my, &format!("table={}", "t".repeat(200))));
    v.push(format!("zk://{zk_hosts}/x?session_timeout=-1s"));
    v.push(format!("zk://{zk_hosts}/x?session_timeout=1000years"));
    v.push(format!("zk://{zk_hosts}/x?bogus=1"));
    // With a password: refused, and the password never shown.
    v.push(format!("redis://:{SECRET}@h/?bogus=1"));
    v.push(format!("redis://u:{SECRET}@h:99999/"));
    v.push(format!("redis://u:{SECRET}@[::1"));
    v.push(format!("postgres://u:{SECRET}@h/db?mode=bogus"));
    v.push(format!("mysql://u:{SECRET}@h/db?table=x;y"));
    v.push(format!("redlock://u:{SECRET}@h:1,h:2"));
    v.push(format!("zk://u:{SECRET}@h/x"));
    v.push(format!("foo://u:{SECRET}@h/x"));
    v.push(format!("u:{SECRET}@nowhere"));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_refuses_malformed_urls_clearly() {
    let mut failures = Vec::new();
    for url in bad_config_urls() {
        let shown: String = url.chars().take(80).collect();
        let r = within(&format!("connect({shown:?})"), dlock::connect(&url)).await;
        let e = match r {
            Ok(c) => {
                failures.push(format!("connect({shown:?}) was accepted as {}", c.url()));
                continue;
            }
            Err(e) => e,
        };
        if !matches!(e, Error::InvalidConfig(_)) {
            failures.push(format!(
                "connect({shown:?}): expected InvalidConfig, got {e:?}"
            ));
        }
        let msg = e.to_string();
        assert!(
            !msg.contains(SECRET),
            "connect({shown:?}) shows the password: {msg}"
        );
        assert!(
            msg.len() < 2_000,
            "connect({shown:?}): a {} byte message",
            msg.len()
        );
        let redacted = dlock::redact_url(&url);
        assert!(
            !redacted.contains(SECRET),
            "redact_url({shown:?}) = {redacted}"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Well formed but naming no reachable server: a clear Unavailable, quickly, message bounded.
    for url in [
        format!("redis://{}", "a".repeat(100_000)),
        // Leading and trailing spaces and C0 controls are not part of a URL (WHATWG URL).
        "redis://127.0.0.1:1/\0".to_string(),
    ] {
        let shown: String = url.chars().take(40).collect();
        let e = within(&shown, dlock::connect(&url)).await.unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{shown}: {e:?}");
        assert!(e.to_string().len() < 2_000, "{shown}: {e}");
    }
    let c = within("spaces", dlock::connect("  mem://  "))
        .await
        .unwrap();
    assert_eq!(c.url(), "mem://");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_unreachable_stores_fail_cleanly_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let redis = env_url("DLOCK_TEST_REDIS_URL");
    let redis_hostport = redis
        .strip_prefix("redis://")
        .and_then(|r| r.split('/').next())
        .expect("DLOCK_TEST_REDIS_URL is redis://HOST:PORT/")
        .to_string();
    let urls = [
        format!("sqlite://{}/nonexistent-dir/x.db", dir.path().display()),
        "sqlite:///nonexistent-dir-dlock/x.db".to_string(),
        format!("sqlite://{}", dir.path().display()), // a directory, not a file
        format!("redis://u:{SECRET}@127.0.0.1:1/?connect_timeout=1s"),
        // A server without a password, given one: refused without showing it.
        format!("redis://:{SECRET}@{redis_hostport}/"),
        format!("postgres://u:{SECRET}@127.0.0.1:1/db"),
        format!("mysql://u:{SECRET}@127.0.0.1:1/db"),
        format!("postgres://nosuchuser:{SECRET}@127.0.0.1:5432/nosuchdb"),
        format!("mysql://nosuchuser:{SECRET}@127.0.0.1:3306/nosuchdb"),
        format!("redlock://u:{SECRET}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
        "zk://127.0.0.1:1/x?session_timeout=1s".to_string(),
    ];
    for url in urls {
        let r = within(&format!("connect({url:?})"), async {
            match dlock::connect(&url).await {
                // Some stores connect lazily: the first operation must fail instead.
                Ok(c) => c.mutex("x")?.try_acquire().await.map(|_| ()),
                Err(e) => Err(e),
            }
        })
        .await;
        let e = r.expect_err(&url);
        assert!(
            matches!(
                e,
                Error::Unavailable(_) | Error::InvalidConfig(_) | Error::Backend(_)
            ),
            "{url}: {e:?}"
        );
        let msg = format!("{e} {e:?}");
        assert!(
            !msg.contains(SECRET),
            "{url}: the error shows the password: {msg}"
        );
    }
    assert!(
        !dir.path().join("nonexistent-dir").exists(),
        "a missing directory was created"
    );
}

// ---------------------------------------------------------------------------------------------
// Names

/// Names that are not lock names.
fn invalid_names() -> Vec<String> {
    vec![
        String::new(),
        "\0".into(),
        "a\0b".into(),
        "x".repeat(256),
        "é".repeat(128), // 256 bytes
        "x".repeat(10 * 1024),
    ]
}

/// Valid but hostile name suffixes, each an independent lock next to `a`.
fn hostile_suffixes() -> Vec<String> {
    let mut v: Vec<String> = [
        "a*",
        "a?",
        "a[a]",
        "a[",
        "a]",
        "a^",
        "a-",
        "{a}",
        "a}",
        "a{",
        "{a",
        "{}",
        "}",
        "a%",
        "a_",
        "%",
        "_",
        "a%s",
        "a'",
        "a\"",
        "a\\",
        "a'--",
        ";--",
        "' OR 1=1 --",
        "a; DROP TABLE x",
        "]]",
        "--[[",
        "a]]..[[",
        "%s%d",
        "a\n",
        "a\nb",
        "a\r\n",
        "a\t",
        "a ",
        " a",
        "A",
        "a/",
        "../a",
        "../../etc/passwd",
        ".",
        "..",
        "a:fence",
        "a:exp",
        "a:q",
        "a:released",
        "a:meta:x",
        "a}:fence",
        "naïve—日本語🔒",
        "\u{7f}",
        "\u{feff}a",
        "$1",
        "?1",
        "a$",
        "a`",
        "a#",
        "a&b=c",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("é".repeat(40));
    v
}

/// The full hostile names under `prefix`, plus names that fill 255 bytes exactly.
fn hostile_names(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = hostile_suffixes()
        .iter()
        .map(|s| format!("{prefix}{s}"))
        .collect();
    let room = 255 - prefix.len();
    v.push(format!("{prefix}{}", "z".repeat(room)));
    // Multibyte up to 255 bytes (one ASCII byte pads an odd remainder).
    let pad = if room % 2 == 1 { "y" } else { "" };
    v.push(format!("{prefix}{pad}{}", "é".repeat(room / 2)));
    for n in &v {
        assert!(n.len() <= 255, "{n:?}");
    }
    v
}

async fn assert_held_by(name: &str, owner: &str, by: &Client, other: &Client, ctx: &str) {
    let busy = within(ctx, async { other.mutex(name)?.try_acquire().await }).await;
    match busy {
        Err(Error::Busy { .. }) => {}
        other => panic!("{ctx}: {name:?} should still be held, try_acquire gave {other:?}"),
    }
    let info = within(ctx, by.describe(name))
        .await
        .unwrap_or_else(|e| panic!("{ctx}: describe {name:?}: {e}"));
    let info = info.unwrap_or_else(|| panic!("{ctx}: describe {name:?}: nobody holds it"));
    assert_eq!(info.name, name, "{ctx}");
    assert!(
        info.holders.iter().any(|h| h.owner == owner),
        "{ctx}: {name:?} is no longer held by its owner: {info:?}"
    );
}

/// The whole hostile-name check against one store URL.
async fn hostile_names_on(backend: &str, url: &str, fencing: bool) {
    let a_client = within("connect", dlock::connect(url))
        .await
        .unwrap_or_else(|e| panic!("{backend}: connect: {e}"));
    let b_client = within("connect", dlock::connect(url))
        .await
        .unwrap_or_else(|e| panic!("{backend}: connect: {e}"));
    let prefix = format!("bad-input/{}/", uniq());
    let a = format!("{prefix}a");

    for bad in invalid_names() {
        let shown: String = bad.chars().take(20).collect();
        for r in [
            a_client.mutex(bad.as_str()).map(|_| ()),
            a_client.rwlock(bad.as_str()).map(|_| ()),
            a_client.semaphore(bad.as_str(), 2).map(|_| ()),
        ] {
            let e = r.expect_err(&shown);
            assert!(
                matches!(e, Error::InvalidName(_)),
                "{backend} {shown:?}: {e:?}"
            );
        }
        let e = within("describe", a_client.describe(&bad))
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidName(_)),
            "{backend} {shown:?}: {e:?}"
        );
        let e = within(
            "force_release",
            a_client.force_release(&bad, dlock::Force::Revoke),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(e, Error::InvalidName(_)),
            "{backend} {shown:?}: {e:?}"
        );
    }
    let e = within("list", a_client.list("a\0")).await.unwrap_err();
    assert!(matches!(e, Error::InvalidName(_)), "{backend}: {e:?}");

    let a_guard = within("acquire a", async {
        a_client.mutex(a.as_str())?.try_acquire().await
    })
    .await
    .unwrap_or_else(|e| panic!("{backend}: acquire {a:?}: {e}"));
    let a_owner = a_guard.owner().to_string();
    let a_token = a_guard.token();
    assert_eq!(a_token.is_some(), fencing, "{backend}");

    // One at a time: each hostile name is a lock of its own, and `a` is untouched.
    let names = hostile_names(&prefix);
    for n in &names {
        let ctx = format!("{backend} {n:?}");
        let g = within(&ctx, async {
            b_client.mutex(n.as_str())?.try_acquire().await
        })
        .await
        .unwrap_or_else(|e| panic!("{ctx}: acquire: {e}"));
        assert_eq!(g.name(), n, "{ctx}");
        let d = within(&ctx, b_client.describe(n))
            .await
            .unwrap_or_else(|e| panic!("{ctx}: describe: {e}"))
            .unwrap_or_else(|| panic!("{ctx}: describe: not held"));
        assert_eq!(&d.name, n, "{ctx}");
        assert!(
            d.holders.iter().any(|h| h.owner == g.owner()),
            "{ctx}: {d:?}"
        );
        // Another contender is refused.
        let busy = within(&ctx, async {
            a_client.mutex(n.as_str())?.try_acquire().await
        })
        .await;
        assert!(matches!(busy, Err(Error::Busy { .. })), "{ctx}: {busy:?}");
        within(&ctx, g.release())
            .await
            .unwrap_or_else(|e| panic!("{ctx}: release: {e}"));
        assert_held_by(&a, &a_owner, &a_client, &b_client, &ctx).await;
        // Free again.
        let g = within(&ctx, async {
            a_client.mutex(n.as_str())?.try_acquire().await
        })
        .await
        .unwrap_or_else(|e| panic!("{ctx}: acquire after release: {e}"));
        within(&ctx, g.release()).await.unwrap();
    }

    // All at once: the listing shows exactly these names, and prefixes are literal.
    let mut guards = Vec::new();
    for n in &names {
        guards.push(
            within(n, async { b_client.mutex(n.as_str())?.try_acquire().await })
                .await
                .unwrap_or_else(|e| panic!("{backend} {n:?}: acquire (all held): {e}")),
        );
    }
    let mut expected: Vec<String> = names.clone();
    expected.push(a.clone());
    expected.sort();
    let listed: Vec<String> = within("list", b_client.list(&prefix))
        .await
        .unwrap_or_else(|e| panic!("{backend}: list: {e}"))
        .into_iter()
        .map(|i| i.name)
        .collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(listed_sorted, expected, "{backend}: list({prefix:?})");
    for p in [
        "a%", "a_", "%", "_", "a*", "a?", "a[", "a[a]", "{", "{a", "a\\", "'", "a'", "A", "a ",
        "..", "a:",
    ] {
        let full = format!("{prefix}{p}");
        let got: Vec<String> = within("list", b_client.list(&full))
            .await
            .unwrap_or_else(|e| panic!("{backend}: list({full:?}): {e}"))
            .into_iter()
            .map(|i| i.name)
            .collect();
        let mut want: Vec<String> = expected
            .iter()
            .filter(|n| n.starts_with(&full))
            .cloned()
            .collect();
        want.sort();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        assert_eq!(
            got_sorted, want,
            "{backend}: list({full:?}) must match literally"
        );
    }
    for g in guards {
        within("release", g.release()).await.unwrap();
    }
    assert_held_by(&a, &a_owner, &a_client, &b_client, backend).await;

    // Other primitives on a few hostile names, where the store has them.
    if fencing {
        for s in ["{a}", "a*", "a'--", "a%", "]]"] {
            let n = format!("{prefix}rw{s}");
            let r1 = within(&n, async { b_client.rwlock(n.as_str())?.try_read().await })
                .await
                .unwrap_or_else(|e| panic!("{backend} {n:?}: read: {e}"));
            let w = within(&n, async { a_client.rwlock(n.as_str())?.try_write().await }).await;
            assert!(
                matches!(w, Err(Error::Busy { .. })),
                "{backend} {n:?}: {w:?}"
            );
            within(&n, r1.release()).await.unwrap();
            let n = format!("{prefix}sem{s}");
            let s1 = within(&n, async {
                b_client.semaphore(n.as_str(), 1)?.try_acquire().await
            })
            .await
            .unwrap_or_else(|e| panic!("{backend} {n:?}: semaphore: {e}"));
            let s2 = within(&n, async {
                a_client.semaphore(n.as_str(), 1)?.try_acquire().await
            })
            .await;
            assert!(
                matches!(s2, Err(Error::Busy { .. })),
                "{backend} {n:?}: {s2:?}"
            );
            within(&n, s1.release()).await.unwrap();
        }
    }

    // Names that begin with hash-tag braces (Redis keys `dlock:{}…}` and the like).
    for s in ["}", "{}", "{", "}{", "{}{}", "*", "?", "%", "_", ".."] {
        let n = format!("{s}bad-input-{}", uniq());
        let g = within(&n, async {
            b_client.mutex(n.as_str())?.try_acquire().await
        })
        .await
        .unwrap_or_else(|e| panic!("{backend} {n:?}: acquire: {e}"));
        let busy = within(&n, async {
            a_client.mutex(n.as_str())?.try_acquire().await
        })
        .await;
        assert!(
            matches!(busy, Err(Error::Busy { .. })),
            "{backend} {n:?}: {busy:?}"
        );
        let listed = within(&n, b_client.list(&n)).await.unwrap();
        assert_eq!(
            listed.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            vec![n.as_str()],
            "{backend}: list({n:?})"
        );
        within(&n, g.release()).await.unwrap();
    }

    // `a` was never disturbed, and its token is unchanged.
    assert!(a_guard.is_held(), "{backend}: {a:?} was lost");
    assert_eq!(a_guard.token(), a_token);
    within("release a", a_guard.release())
        .await
        .unwrap_or_else(|e| panic!("{backend}: release {a:?}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_are_independent_locks_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (backend, url, _, fencing) in stores(dir.path()) {
        let r = tokio::spawn(async move { hostile_names_on(backend, &url, fencing).await }).await;
        if let Err(e) = r {
            let msg = e
                .into_panic()
                .downcast::<String>()
                .map(|s| *s)
                .unwrap_or_else(|_| "panic".into());
            eprintln!("{backend}: {msg}");
            failures.push(format!("{backend}: {msg}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Durations

async fn durations_on(backend: &str, url: &str, lease_store: bool) {
    for lease in [
        Duration::ZERO,
        Duration::from_nanos(1),
        dlock::MIN_LEASE - Duration::from_nanos(1),
        dlock::MAX_LEASE + Duration::from_nanos(1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ] {
        let e = within(
            "connect_with",
            dlock::connect_with(url, ClientOptions::default().lease(lease)),
        )
        .await
        .expect_err(&format!("{backend}: connect_with(lease {lease:?})"));
        assert!(
            matches!(e, Error::InvalidConfig(_)),
            "{backend} {lease:?}: {e:?}"
        );
    }
    let c = within("connect", dlock::connect(url)).await.unwrap();
    let other = within("connect", dlock::connect(url)).await.unwrap();
    let n = format!("bad-input/{}/durations", uniq());
    for lease in [Duration::ZERO, Duration::from_millis(99), Duration::MAX] {
        let m = c.mutex(n.as_str()).unwrap().lease(lease);
        for r in [
            within("try", m.try_acquire()).await,
            within("timeout", m.acquire_timeout(Duration::from_millis(10))).await,
        ] {
            let e = r.expect_err(&format!("{backend}: lease {lease:?}"));
            assert!(
                matches!(e, Error::InvalidConfig(_)),
                "{backend} {lease:?}: {e:?}"
            );
        }
        let e = within("rw", async {
            c.rwlock(n.as_str())?.lease(lease).try_write().await
        })
        .await
        .unwrap_err();
        assert!(
            matches!(e, Error::InvalidConfig(_) | Error::Unsupported(_)),
            "{backend} {lease:?}: {e:?}"
        );
    }
    // The longest lease works, and a held lock refuses others.
    let mut g = within("max lease", async {
        c.mutex(n.as_str())?
            .lease(dlock::MAX_LEASE)
            .acquire_timeout(Duration::MAX)
            .await
    })
    .await
    .unwrap_or_else(|e| panic!("{backend}: lease MAX_LEASE, wait Duration::MAX: {e}"));
    assert!(g.is_held());
    if let (true, Some(v)) = (lease_store, g.valid_for()) {
        // (ZooKeeper: bounded by the session timeout instead.)
        assert!(v > Duration::from_secs(3600), "{backend}: valid for {v:?}");
    }
    // Zero and tiny waits on a busy lock: Timeout at once, no panic.
    let om = other.mutex(n.as_str()).unwrap();
    for w in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
    ] {
        let t0 = Instant::now();
        let e = within("busy wait", om.acquire_timeout(w))
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::Timeout { .. }),
            "{backend} wait {w:?}: {e:?}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{backend}: {:?}",
            t0.elapsed()
        );
    }
    // An endless wait on a busy lock neither returns nor panics; dropping it leaves nothing.
    let waiting = tokio::time::timeout(
        Duration::from_millis(300),
        om.acquire_timeout(Duration::MAX),
    )
    .await;
    assert!(
        waiting.is_err(),
        "{backend}: a Duration::MAX wait on a busy lock returned {waiting:?}"
    );
    // expire_in: over the longest lease is refused; the guard is still held.
    for d in [dlock::MAX_LEASE + Duration::from_secs(1), Duration::MAX] {
        let e = within("expire_in", g.expire_in(d)).await.unwrap_err();
        assert!(
            matches!(e, Error::InvalidConfig(_) | Error::Unsupported(_)),
            "{backend} expire_in({d:?}): {e:?}"
        );
        assert!(g.is_held(), "{backend}: expire_in({d:?}) lost the hold");
    }
    if lease_store {
        within("expire_in max", g.expire_in(dlock::MAX_LEASE))
            .await
            .unwrap_or_else(|e| panic!("{backend}: expire_in(MAX_LEASE): {e}"));
        let e = within("busy", om.try_acquire()).await.unwrap_err();
        assert!(matches!(e, Error::Busy { .. }), "{backend}: {e:?}");
    }
    within("release", g.release()).await.unwrap();
    // Free now: a zero wait takes it.
    let g = within("zero wait", om.acquire_timeout(Duration::ZERO))
        .await
        .unwrap_or_else(|e| panic!("{backend}: acquire_timeout(0) on a free lock: {e}"));
    within("release", g.release()).await.unwrap();
    // Semaphores: 0 permits refused, u32::MAX permits fine.
    let e = c.semaphore(n.as_str(), 0).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{backend}: {e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_durations_are_refused_or_work_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (backend, url, _, _) in stores(dir.path()) {
        let lease_store = backend != "zookeeper" && backend != "etcd";
        let r = tokio::spawn(async move { durations_on(backend, &url, lease_store).await }).await;
        if let Err(e) = r {
            let msg = e
                .into_panic()
                .downcast::<String>()
                .map(|s| *s)
                .unwrap_or_else(|_| "panic".into());
            eprintln!("{backend}: {msg}");
            failures.push(format!("{backend}: {msg}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The CLI

#[test]
fn cli_refuses_bad_flags_and_durations() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("l.db").display());
    let u = url.as_str();
    let cases: Vec<Vec<&str>> = vec![
        vec!["--bogus"],
        vec!["bogus-subcommand"],
        vec!["run"],
        vec!["run", "--url", u, "x"],
        vec!["run", "--url", u, "--", "true"],
        vec!["run", "--url", u, "--bogus", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl", "-1s", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl=-1s", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl", "0s", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl", "0", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl", "1ns", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl", "1000years", "x", "--", "true"],
        vec![
            "run",
            "--url",
            u,
            "--ttl",
            "99999999999999999999999s",
            "x",
            "--",
            "true",
        ],
        vec!["run", "--url", u, "--ttl", "", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl", "banana", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl", "1s1", "x", "--", "true"],
        vec!["run", "--url", u, "--wait", "-1s", "x", "--", "true"],
        vec!["run", "--url", u, "--wait", "1000years", "x", "--", "true"],
        vec![
            "run",
            "--url",
            u,
            "--wait",
            "1s",
            "--no-wait",
            "x",
            "--",
            "true",
        ],
        vec![
            "run",
            "--url",
            u,
            "--hold-at-least",
            "1000years",
            "x",
            "--",
            "true",
        ],
        vec![
            "run",
            "--url",
            u,
            "--hold-at-least",
            "-5m",
            "x",
            "--",
            "true",
        ],
        vec!["run", "--url", u, "--kill-after", "soon", "x", "--", "true"],
        vec!["run", "--url", u, "--ttl"],
        vec!["run", "--url"],
        vec!["list", "--url", u, "--bogus"],
        vec!["list", "--url", u, "a", "b"],
        vec!["unlock", "--url", u],
        vec!["unlock", "--url", u, "x"], // without --force
        vec!["info", "--bogus"],
        vec!["demo", "--url", u, "--buyers", "0"],
        vec!["demo", "--url", u, "--buyers", "-1"],
        vec!["demo", "--url", u, "--tickets", "99999999999"],
        vec!["run", "--url", "", "x", "--", "true"],
        vec!["run", "--url", " ", "x", "--", "true"],
        vec!["run", "--url", "nope://x", "x", "--", "true"],
        vec!["run", "--url", "redis://:99999", "x", "--", "true"],
        vec!["run", "--url", "redis://[::1", "x", "--", "true"],
        vec!["run", "--url", "redlock://127.0.0.1:1", "x", "--", "true"],
        vec!["run", "--url", "zk://", "x", "--", "true"],
        vec!["run", "--url", "postgres://", "x", "--", "true"],
        vec!["run", "--url", "sqlite://", "x", "--", "true"],
        vec!["run", "--url", "sqlite:///", "x", "--", "true"],
        vec!["list", "--url", "%%%%"],
        vec!["list", "--url", "sqlite:///tmp/%ff.db"],
        vec!["unlock", "--force", "--url", "mem:// x", "x"],
    ];
    for args in cases {
        usage_error(&os(&args), &[]);
    }
    // Negative and huge durations say what is wrong (not clap's "unexpected argument '-1'").
    for flag in ["--ttl", "--wait", "--hold-at-least", "--kill-after"] {
        let stderr = usage_error(
            &os(&["run", "--url", u, flag, "-1s", "x", "--", "true"]),
            &[],
        );
        assert!(stderr.contains("negative"), "{flag} -1s: {stderr}");
        let stderr = usage_error(
            &os(&["run", "--url", u, flag, "1000years", "x", "--", "true"]),
            &[],
        );
        assert!(stderr.contains("too long"), "{flag} 1000years: {stderr}");
    }
    // A bad $DLOCK_URL is a usage error too.
    usage_error(&os(&["list"]), &[("DLOCK_URL", "nope://x")]);
    // Passwords in bad URLs are never shown.
    for bad in [
        format!("redis://u:{SECRET}@h:99999/"),
        format!("redis://:{SECRET}@h/?bogus=1"),
        format!("postgres://u:{SECRET}@h/db?mode=bogus"),
        format!("redlock://u:{SECRET}@h:1,h:2"),
        format!("foo://u:{SECRET}@h"),
    ] {
        usage_error(&os(&["list", "--url", &bad]), &[]);
        usage_error(&os(&["run", "--url", &bad, "x", "--", "true"]), &[]);
        usage_error(&os(&["list"]), &[("DLOCK_URL", &bad)]);
    }
    // An unreachable store with a password: 69, password not shown.
    let (code, _, stderr) = cli(
        &os(&[
            "list",
            "--url",
            &format!("redis://u:{SECRET}@127.0.0.1:1/?connect_timeout=1s"),
        ]),
        &[],
    );
    assert_eq!(code, 69, "{stderr}");
    assert!(!stderr.contains(SECRET), "{stderr}");
    // A missing directory: a clear store error, not a panic.
    let (code, _, stderr) = cli(
        &os(&["list", "--url", "sqlite:///nonexistent-dir-dlock/x.db"]),
        &[],
    );
    assert!(code == 69 || code == 64, "{code}: {stderr}");
    assert!(stderr.contains("dlock:"), "{stderr}");
    // Forms that work: the shortest lease, without `--`, a zero wait.
    for args in [
        vec!["run", "--url", u, "--ttl", "100ms", "x", "--", "true"],
        vec!["run", "--url", u, "x", "true"],
        vec!["run", "--url", u, "--wait", "0s", "x", "--", "true"],
        vec![
            "run",
            "--url",
            u,
            "--ttl",
            "365days",
            "--hold-at-least",
            "0s",
            "x",
            "--",
            "true",
        ],
    ] {
        let (code, _, stderr) = cli(&os(&args), &[]);
        assert_eq!(code, 0, "dlock {args:?}: {stderr}");
    }
}

#[test]
fn cli_refuses_invalid_names_and_invalid_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("l.db").display());
    let bad_utf8 = OsString::from_vec(vec![0xff, 0xfe]);
    let mixed = OsString::from_vec(b"jobs/\xc3\x28".to_vec());
    for name in [bad_utf8.clone(), mixed] {
        for args in [
            vec![
                "run".into(),
                "--url".into(),
                url.clone().into(),
                name.clone(),
                "--".into(),
                "true".into(),
            ],
            vec![
                "unlock".into(),
                "--force".into(),
                "--url".into(),
                url.clone().into(),
                name.clone(),
            ],
            vec![
                "list".into(),
                "--url".into(),
                url.clone().into(),
                name.clone(),
            ],
        ] {
            usage_error(&args, &[]);
        }
    }
    // Invalid UTF-8 in the URL and in a flag value.
    usage_error(
        &[
            "run".into(),
            "--url".into(),
            bad_utf8.clone(),
            "x".into(),
            "--".into(),
            "true".into(),
        ],
        &[],
    );
    usage_error(
        &[
            "run".into(),
            "--url".into(),
            url.clone().into(),
            "--ttl".into(),
            bad_utf8.clone(),
            "x".into(),
            "--".into(),
            "true".into(),
        ],
        &[],
    );
    // Invalid UTF-8 in the command's own arguments is fine: they are passed as they are.
    let (code, stdout, stderr) = cli(
        &[
            "run".into(),
            "--url".into(),
            url.clone().into(),
            "x".into(),
            "--".into(),
            "printf".into(),
            "%s".into(),
            bad_utf8,
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.as_bytes(),
        "\u{fffd}\u{fffd}".as_bytes(),
        "{stdout:?}"
    );
    for name in [
        "".to_string(),
        "x".repeat(256),
        "é".repeat(128),
        "x".repeat(10 * 1024),
    ] {
        let shown: String = name.chars().take(10).collect();
        let stderr = usage_error(&os(&["run", "--url", &url, &name, "--", "true"]), &[]);
        assert!(stderr.contains("name"), "{shown}: {stderr}");
        usage_error(&os(&["unlock", "--force", "--url", &url, &name]), &[]);
    }
}

/// Hostile names through `dlock run`, `list` and `unlock` on every store shared between
/// processes, while the library holds `a`: each works, `a` stays held by its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_hostile_names_do_not_touch_other_locks() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url, cross_process, _) in stores(dir.path()) {
        if !cross_process {
            continue; // mem:// lives inside one process: the CLI cannot share it
        }
        let holder = within("connect", dlock::connect(&url)).await.unwrap();
        let other = within("connect", dlock::connect(&url)).await.unwrap();
        let prefix = format!("bad-input-cli/{}/", uniq());
        let a = format!("{prefix}a");
        let ga = within("acquire a", async {
            holder.mutex(a.as_str())?.try_acquire().await
        })
        .await
        .unwrap();
        let owner = ga.owner().to_string();
        let suffixes = [
            "a*",
            "a?",
            "{a}",
            "a}",
            "a%",
            "a_",
            "a'--",
            "' OR 1=1 --",
            "]]",
            "--[[",
            "a\\",
            "../a",
            "a\nb",
            "-a",
            "--a",
            "naïve🔒",
        ];
        for s in suffixes {
            let n = format!("{prefix}{s}");
            let ctx = format!("{backend} {n:?}");
            // The command sees its own name and a token, while `a` is held by someone else. A
            // name that looks like a flag goes after `--`.
            let (code, stdout, stderr) = tokio::task::spawn_blocking({
                let (url, n) = (url.clone(), n.clone());
                move || {
                    let mut args = os(&["run", "--url", &url, "--no-wait"]);
                    if n.starts_with('-') {
                        args.extend(os(&["--", &n]));
                    } else {
                        args.extend(os(&[&n, "--"]));
                    }
                    args.extend(os(&[
                        "sh",
                        "-c",
                        "printf '%s|%s' \"$DLOCK_NAME\" \"$DLOCK_TOKEN\"",
                    ]));
                    cli(&args, &[])
                }
            })
            .await
            .unwrap();
            assert_eq!(code, 0, "{ctx}: {stderr}");
            let (got_name, token) = stdout
                .split_once('|')
                .unwrap_or_else(|| panic!("{ctx}: {stdout:?}"));
            assert_eq!(got_name, n, "{ctx}");
            if backend != "redlock" {
                assert!(token.parse::<u64>().is_ok(), "{ctx}: token {token:?}");
            }
            assert_held_by(&a, &owner, &holder, &other, &ctx).await;
        }
        // `list PREFIX` with LIKE / glob characters matches literally.
        let (code, stdout, stderr) = tokio::task::spawn_blocking({
            let (url, p) = (url.clone(), format!("{prefix}%"));
            move || cli(&os(&["list", "--json", "--url", &url, &p]), &[])
        })
        .await
        .unwrap();
        assert_eq!(code, 0, "{backend}: {stderr}");
        let v: serde_json::Value =
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{backend}: {e}: {stdout}"));
        assert_eq!(
            v.as_array().map(Vec::len),
            Some(0),
            "{backend}: list {prefix}% over-matched: {stdout}"
        );
        let (code, stdout, stderr) = tokio::task::spawn_blocking({
            let (url, p) = (url.clone(), prefix.clone());
            move || cli(&os(&["list", "--json", "--url", &url, &p]), &[])
        })
        .await
        .unwrap();
        assert_eq!(code, 0, "{backend}: {stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let names: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i.get("name").and_then(|n| n.as_str()))
            .collect();
        assert_eq!(names, vec![a.as_str()], "{backend}: {stdout}");
        // Force-unlocking a look-alike leaves `a` alone.
        for s in ["a*", "a%", "{a}", "a_", "A", "a "] {
            let n = format!("{prefix}{s}");
            let (code, _, stderr) = tokio::task::spawn_blocking({
                let (url, n) = (url.clone(), n.clone());
                move || cli(&os(&["unlock", "--force", "--url", &url, &n]), &[])
            })
            .await
            .unwrap();
            assert_eq!(code, 0, "{backend} unlock {n:?}: {stderr}");
            assert_held_by(
                &a,
                &owner,
                &holder,
                &other,
                &format!("{backend} unlock {n:?}"),
            )
            .await;
        }
        assert!(ga.is_held());
        within("release", ga.release()).await.unwrap();
    }
}

/// Redis with `hashtag=false` uses `prefix + name` verbatim: a name ending with one of the
/// layout's suffixes would be another lock's key (`a:fence` is `a`'s fencing counter). Such
/// names are refused; they must never reset or block `a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_verbatim_keys_do_not_collide() {
    let base = env_url("DLOCK_TEST_REDIS_URL");
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}hashtag=false&prefix=bad-input-{}:", uniq());
    let c = within("connect", dlock::connect(&url)).await.unwrap();
    let g = within("a", async { c.mutex("a")?.try_acquire().await })
        .await
        .unwrap();
    let t1 = g.token().expect("redis has tokens");
    within("release", g.release()).await.unwrap();
    let owner = "0b0e0c8e-5a7e-4c1b-9d5a-3b1f2a4c5d6e";
    for n in [
        "a:fence".to_string(),
        "a:exp".into(),
        "a:q".into(),
        "a:qexp".into(),
        "a:qinfo".into(),
        "a:qseq".into(),
        "a:w".into(),
        "a:obs".into(),
        format!("a:meta:{owner}"),
    ] {
        let e = within(&n, async { c.mutex(n.as_str())?.try_acquire().await })
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidName(_)), "{n}: {e:?}");
        assert!(e.to_string().contains("hashtag"), "{n}: {e}");
        let e = within(&n, c.force_release(&n, dlock::Force::Revoke))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidName(_)), "{n}: {e:?}");
    }
    // Names that only look alike are fine.
    for n in ["a:fences", "a:meta:x", "a:q2", "fence"] {
        let g = within(n, async { c.mutex(n)?.try_acquire().await })
            .await
            .unwrap_or_else(|e| panic!("{n}: {e}"));
        within(n, g.release()).await.unwrap();
    }
    // `a`'s fencing counter went on from where it was.
    let g = within("a", async { c.mutex("a")?.try_acquire().await })
        .await
        .unwrap();
    assert!(g.token().expect("token") > t1);
    within("release", g.release()).await.unwrap();
}
