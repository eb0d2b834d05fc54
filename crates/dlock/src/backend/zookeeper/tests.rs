//! Tests against a real three-server ensemble: the one named by `DLOCK_TEST_ZK_URL`
//! (`host:port,host:port,...` or a `zk://` URL), else one started for the test with
//! `scripts/zk-ensemble.sh`. Tests that kill servers always start their own. Never skipped: a
//! missing ZooKeeper is a failure.

use super::*;
use crate::backend::test_support::Blackhole;
use crate::{Client, ClientOptions};
use std::path::PathBuf;
use std::process::{Command, Stdio};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/zk-ensemble.sh");

/// An ensemble for one test; stopped (by pid) when dropped.
struct Ensemble {
    hosts: String,
    dir: Option<tempfile::TempDir>,
}

impl Ensemble {
    fn start() -> Ensemble {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("bash")
            .arg(SCRIPT)
            .arg("start")
            .arg(dir.path())
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        let hosts = String::from_utf8(out.stdout).unwrap().trim().to_string();
        if !out.status.success() || hosts.is_empty() {
            let _ = Command::new("bash")
                .arg(SCRIPT)
                .arg("stop")
                .arg(dir.path())
                .status();
            panic!("zk-ensemble.sh start failed: {:?}", out.status);
        }
        Ensemble {
            hosts,
            dir: Some(dir),
        }
    }

    /// The shared ensemble of the environment, or an own one.
    fn any() -> Ensemble {
        match std::env::var("DLOCK_TEST_ZK_URL") {
            Ok(u) if !u.trim().is_empty() => {
                let u = u.trim().trim_start_matches("zk://");
                let hosts = u.split(['/', '?']).next().unwrap_or(u).to_string();
                Ensemble { hosts, dir: None }
            }
            _ => Ensemble::start(),
        }
    }

    fn dir(&self) -> PathBuf {
        self.dir.as_ref().unwrap().path().to_path_buf()
    }

    fn script(&self, args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(SCRIPT)
            .args(args)
            .arg(self.dir())
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success(), "zk-ensemble.sh {args:?} failed");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// A backend under a chroot unique to `tag`.
    async fn backend(&self, chroot: &str, session_timeout: Duration) -> ZooKeeperBackend {
        ZooKeeperBackend::open(&ZkTarget {
            hosts: self.hosts.clone(),
            chroot: chroot.to_string(),
            session_timeout,
        })
        .await
        .unwrap()
    }

    async fn client(&self, chroot: &str) -> (Client, ZooKeeperBackend) {
        let b = self.backend(chroot, Duration::from_secs(4)).await;
        let c = Client::with_backend(Arc::new(b.clone()), "zk://test", ClientOptions::default())
            .unwrap();
        (c, b)
    }

    /// A raw session on the chroot, to look at the nodes.
    async fn raw(&self, chroot: &str) -> zk::Client {
        let c = zk::Client::connect(&self.hosts).await.unwrap();
        c.chroot(chroot.to_string()).unwrap()
    }

    /// A hold of `name` by a client with a session of its own on `hosts` (its session timeout
    /// `timeout`), and another client waiting for it.
    async fn contest(&self, hosts: String, root: &str, timeout: Duration, name: &str) -> Contest {
        let ab = ZooKeeperBackend::open(&ZkTarget {
            hosts,
            chroot: root.to_string(),
            session_timeout: timeout,
        })
        .await
        .unwrap();
        let a = Client::with_backend(Arc::new(ab), "zk://test", ClientOptions::default()).unwrap();
        let (b, _) = self.client(root).await;
        let holder = a.mutex(name).unwrap().acquire().await.unwrap();
        let lost = holder.lost();
        let lost = tokio::spawn(async move {
            lost.await;
            Instant::now()
        });
        let m = b.mutex(name).unwrap();
        let waiter = tokio::spawn(async move {
            let g = m.acquire().await.unwrap();
            (Instant::now(), g)
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished());
        Contest {
            _kept: (a, b, holder),
            lost,
            waiter,
        }
    }
}

/// See `Ensemble::contest`: when the holder's `lost()` fired, when the waiter was granted.
struct Contest {
    _kept: (Client, Client, crate::Guard),
    lost: tokio::task::JoinHandle<Instant>,
    waiter: tokio::task::JoinHandle<(Instant, crate::Guard)>,
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = Command::new("bash")
                .arg(SCRIPT)
                .arg("stop")
                .arg(d.path())
                .status();
        }
    }
}

fn chroot() -> String {
    format!("/dlock-test-{}", uuid::Uuid::new_v4().simple())
}

/// The children of `name`'s node as the ensemble's leader has them: the raw client may talk to
/// a follower that is behind, so it syncs first.
async fn children(raw: &zk::Client, name: &str) -> Vec<String> {
    let path = format!("/{}", escape_name(name));
    match raw.sync(&path).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => panic!("{e}"),
    }
    match raw.list_children(&path).await {
        Ok(v) => v,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("{e}"),
    }
}

/// The data of the lock node `kid` of `name`, read after a `sync` for the same reason.
async fn node_data(raw: &zk::Client, name: &str, kid: &str) -> Vec<u8> {
    let path = format!("/{}/{}", escape_name(name), kid);
    raw.sync(&path).await.unwrap();
    raw.get_data(&path).await.unwrap().0
}

async fn within<T>(d: Duration, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(d, f).await.expect("timed out")
}

#[test]
fn escaping_is_injective_and_safe() {
    let names = [
        "a",
        "A",
        "a b",
        "a/b",
        "a%2Fb",
        "../x",
        "..",
        ".",
        "zookeeper",
        "Zookeeper",
        "é",
        "a_b-c",
        "%",
        "%25",
        "x/../y",
    ];
    let mut seen = std::collections::HashSet::new();
    for n in names {
        let e = escape_name(n);
        assert!(seen.insert(e.clone()), "{n} collides as {e}");
        assert!(
            e.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"%-_".contains(&b)),
            "{e}"
        );
        assert!(e != "zookeeper" && e != "." && e != "..");
        assert_eq!(unescape_name(&e).as_deref(), Some(n));
    }
    assert_eq!(escape_name("a/b"), "a%2Fb");
    assert_eq!(escape_name("../x"), "%2E%2E%2Fx");
    assert_eq!(escape_name("zookeeper"), "%7Aookeeper");
    assert_eq!(
        unescape_name("a%2fb"),
        None,
        "lower-case hex is not canonical"
    );
    assert_eq!(unescape_name("a.b"), None);
    assert_eq!(unescape_name("zookeeper"), None);
}

#[test]
fn node_names_parse_like_curator() {
    let c = parse_child("_c_1b0e1a7e-9a55-4a43-8d3a-2b9a0c4f2f11-lock-0000000012").unwrap();
    assert_eq!((c.seq, c.kind), (12, Entry::Lock));
    assert_eq!(parse_child("lock-0000000003").unwrap().kind, Entry::Lock);
    assert_eq!(
        parse_child("_c_x-__READ__0000000004").unwrap().kind,
        Entry::Read
    );
    assert_eq!(
        parse_child("_c_x-__WRIT__0000000005").unwrap().kind,
        Entry::Write
    );
    assert_eq!(
        parse_child("_c_x-semaphore-3-0000000006").unwrap().kind,
        Entry::Semaphore(3)
    );
    assert!(parse_child("leases").is_none());
    // Not dlock's (nor Curator's): skipped, never a place in the queue (issue 22, fuzz/zk_node).
    for foreign in [
        "_c_x-semaphore-0-0000000006",
        "_c_x-semaphore-+3-0000000006",
        "_c_x-semaphore-03-0000000006",
        "lock-00000000012",
        "lock-000000012",
    ] {
        assert!(parse_child(foreign).is_none(), "{foreign}");
    }
    assert_eq!(
        owner_of("_c_1b0e1a7e-9a55-4a43-8d3a-2b9a0c4f2f11-lock-0000000012"),
        Some("1b0e1a7e-9a55-4a43-8d3a-2b9a0c4f2f11")
    );
    let kids = sorted_children(vec![
        "_c_b-__READ__0000000002".into(),
        "_c_a-__WRIT__0000000001".into(),
        "_c_c-__READ__0000000003".into(),
        "_c_d-__WRIT__0000000004".into(),
        "_c_e-__READ__0000000005".into(),
    ]);
    assert_eq!(position(&kids, 0), (true, None));
    assert_eq!(position(&kids, 1), (false, Some(kids[0].name.clone())));
    assert_eq!(position(&kids, 4), (false, Some(kids[3].name.clone())));
    assert_eq!(position(&kids, 3), (false, Some(kids[2].name.clone())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_fifo_and_increasing_tokens() {
    let zk = Ensemble::any();
    let root = chroot();
    let (a, _) = zk.client(&root).await;
    let (b, _) = zk.client(&root).await;
    let (c, _) = zk.client(&root).await;
    let ga = a.mutex("jobs/x").unwrap().acquire().await.unwrap();
    assert_eq!(a.capabilities().validity, Validity::Session);
    assert!(matches!(
        b.mutex("jobs/x").unwrap().try_acquire().await,
        Err(Error::Busy { .. })
    ));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, cl) in [b.clone(), c.clone()].into_iter().enumerate() {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let g = cl.mutex("jobs/x").unwrap().acquire().await.unwrap();
            tx.send((i, g.token().unwrap())).unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            g.release().await.unwrap();
        }));
        // b's node is created before c's.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let t0 = ga.token().unwrap();
    ga.release().await.unwrap();
    let (first, t1) = within(Duration::from_secs(10), rx.recv()).await.unwrap();
    let (second, t2) = within(Duration::from_secs(10), rx.recv()).await.unwrap();
    assert_eq!((first, second), (0, 1), "FIFO");
    assert!(t0 < t1 && t1 < t2, "tokens {t0} {t1} {t2}");
    for t in tasks {
        t.await.unwrap();
    }
    // Names that differ by case or space, and ../ names, are separate locks.
    let g1 = a.mutex("Case").unwrap().try_acquire().await.unwrap();
    let g2 = b.mutex("case").unwrap().try_acquire().await.unwrap();
    let g3 = c.mutex("../x").unwrap().try_acquire().await.unwrap();
    let g4 = b.mutex("x").unwrap().try_acquire().await.unwrap();
    for g in [g1, g2, g3, g4] {
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_wakes_only_the_next_waiter() {
    let zk = Ensemble::any();
    let root = chroot();
    let (h, _) = zk.client(&root).await;
    let g = h.mutex("herd").unwrap().acquire().await.unwrap();
    let mut waiters = Vec::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..4 {
        let (c, b) = zk.client(&root).await;
        let tx = tx.clone();
        let task = tokio::spawn(async move {
            let g = c.mutex("herd").unwrap().acquire().await.unwrap();
            tx.send((i, Instant::now())).unwrap();
            // Hold until told to stop (the task is aborted at the end).
            std::future::pending::<()>().await;
            drop(g);
        });
        waiters.push((task, b));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before: Vec<(u64, u64)> = waiters
        .iter()
        .map(|(_, b)| {
            (
                b.stats().lists.load(Ordering::Relaxed),
                b.stats().wakeups.load(Ordering::Relaxed),
            )
        })
        .collect();
    let released = Instant::now();
    g.release().await.unwrap();
    let (who, at) = within(Duration::from_secs(5), rx.recv()).await.unwrap();
    assert_eq!(who, 0);
    eprintln!(
        "hand-off latency (release → next holder granted): {:?}",
        at - released
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, (_, b)) in waiters.iter().enumerate() {
        let now = (
            b.stats().lists.load(Ordering::Relaxed),
            b.stats().wakeups.load(Ordering::Relaxed),
        );
        if i == 0 {
            assert_eq!(now.1, before[i].1 + 1, "the next waiter's watch fired once");
        } else {
            assert_eq!(now, before[i], "waiter {i} was woken or re-listed");
        }
    }
    assert!(rx.try_recv().is_err(), "only one holder");
    for (t, _) in waiters {
        t.abort();
    }
}

/// Eight tasks of one client take turns on one mutex: a release wakes only the waiter whose
/// predecessor it was, not every waiting task of the client (which would each list the children
/// again and re-arm their watch).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_of_one_client_taking_turns_cost_few_lists_per_acquisition() {
    let zk = Ensemble::any();
    let root = chroot();
    let (c, b) = zk.client(&root).await;
    let rounds = 10;
    let tasks = 8;
    let mut joins = Vec::new();
    for _ in 0..tasks {
        let m = c.mutex("turns").unwrap();
        joins.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = within(Duration::from_secs(20), m.acquire()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                g.release().await.unwrap();
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
    let lists = b.stats().lists.load(Ordering::Relaxed) as f64;
    let per = lists / f64::from(tasks * rounds);
    eprintln!("{per:.2} children lists per acquisition");
    // Each acquisition lists once after creating its node and once more when its watch fires.
    assert!(per <= 3.0, "{per:.2} children lists per acquisition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn try_and_timeout_leave_no_node() {
    let zk = Ensemble::any();
    let root = chroot();
    let raw = zk.raw(&root).await;
    let (a, _) = zk.client(&root).await;
    let (b, _) = zk.client(&root).await;
    let g = a.mutex("t").unwrap().acquire().await.unwrap();
    assert_eq!(children(&raw, "t").await.len(), 1);
    assert!(matches!(
        b.mutex("t").unwrap().try_acquire().await,
        Err(Error::Busy { .. })
    ));
    assert_eq!(children(&raw, "t").await.len(), 1, "try left a node");
    let e = b
        .mutex("t")
        .unwrap()
        .acquire_timeout(Duration::from_millis(400))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert_eq!(children(&raw, "t").await.len(), 1, "timeout left a node");
    // A dropped acquisition (caller's own timeout) cleans up too.
    let _ = tokio::time::timeout(Duration::from_millis(300), b.mutex("t").unwrap().acquire()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        children(&raw, "t").await.len(),
        1,
        "abandoned acquisition left a node"
    );
    g.release().await.unwrap();
    assert!(children(&raw, "t").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_semaphore_kinds_and_describe() {
    let zk = Ensemble::any();
    let root = chroot();
    let (a, _) = zk.client(&root).await;
    let (b, _) = zk.client(&root).await;
    let r1 = a.rwlock("rw").unwrap().read().await.unwrap();
    let r2 = b.rwlock("rw").unwrap().read().await.unwrap();
    let bw = b.clone();
    let writer =
        tokio::spawn(async move { bw.rwlock("rw").unwrap().write().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A waiting writer blocks new readers.
    assert!(matches!(
        a.rwlock("rw").unwrap().try_read().await,
        Err(Error::Busy { .. })
    ));
    let info = a.describe("rw").await.unwrap().unwrap();
    assert_eq!(info.kind, LockKind::RwLock);
    assert_eq!(info.holders.len(), 2);
    assert_eq!(info.waiters.len(), 1);
    assert_eq!(info.waiters[0].mode, Mode::Exclusive);
    assert_eq!(info.holders[0].meta.client_id, a.id());
    assert_eq!(info.holders[0].token, r1.token());
    // Kind mismatch.
    let e = a.mutex("rw").unwrap().try_acquire().await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    within(Duration::from_secs(5), writer)
        .await
        .unwrap()
        .unwrap();

    let s1 = a.semaphore("sem", 2).unwrap().acquire().await.unwrap();
    let s2 = b.semaphore("sem", 2).unwrap().acquire().await.unwrap();
    assert!(matches!(
        a.semaphore("sem", 2).unwrap().try_acquire().await,
        Err(Error::Busy { .. })
    ));
    let e = a
        .semaphore("sem", 3)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    let ac = a.clone();
    let third =
        tokio::spawn(async move { ac.semaphore("sem", 2).unwrap().acquire().await.is_ok() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The second holder (not the first) leaves: the waiter must still get in.
    s2.release().await.unwrap();
    assert!(within(Duration::from_secs(5), third).await.unwrap());
    s1.release().await.unwrap();
    let all = a.list("").await.unwrap();
    assert!(all.iter().all(|i| i.name != "sem"), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_kill_keeps_holds_and_exclusion() {
    let zk = Ensemble::start();
    let root = chroot();
    let (a, _) = zk.client(&root).await;
    let (b, _) = zk.client(&root).await;
    let ga = a.mutex("l").unwrap().acquire().await.unwrap();
    let bc = b.clone();
    let waiter = tokio::spawn(async move {
        let g = bc.mutex("l").unwrap().acquire().await.unwrap();
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = zk.script(&["leader"]);
    zk.script(&["kill", &leader]);
    eprintln!("killed leader {leader}");
    // Requests made during the election wait for it (no Unavailable for a fail-over).
    let (c, _) = zk.client(&root).await;
    let t = Instant::now();
    let e = within(Duration::from_secs(10), c.mutex("l").unwrap().try_acquire())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Busy { .. }), "during the fail-over: {e}");
    eprintln!(
        "try_acquire during the fail-over answered Busy after {:?}",
        t.elapsed()
    );
    // Longer than the session timeout (4 s): the holds survive the fail-over.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(ga.is_held(), "the hold survived the leader's death");
        assert!(!waiter.is_finished(), "mutual exclusion kept");
    }
    let new_leader = zk.script(&["leader"]);
    assert_ne!(new_leader, leader);
    let released = Instant::now();
    ga.release().await.unwrap();
    let (at, g) = within(Duration::from_secs(10), waiter).await.unwrap();
    eprintln!("hand-off after fail-over: {:?}", at - released);
    assert!(g.token() > Some(0));
    g.release().await.unwrap();
    zk.script(&["start-one", &leader]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_session_lets_the_next_waiter_in_and_fires_lost() {
    let zk = Ensemble::any();
    let root = chroot();
    let ab = zk.backend(&root, Duration::from_secs(2)).await;
    let a =
        Client::with_backend(Arc::new(ab.clone()), "zk://test", ClientOptions::default()).unwrap();
    let (b, _) = zk.client(&root).await;
    let ga = a.mutex("s").unwrap().acquire().await.unwrap();
    let lost = ga.lost();
    let bc = b.clone();
    let waiter = tokio::spawn(async move {
        let g = bc.mutex("s").unwrap().acquire().await.unwrap();
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Expire a's session from outside: attach to it and close it.
    let (info, _) = ab.session_info().await.unwrap();
    let killed = Instant::now();
    let thief = zk::Client::connector()
        .with_session(info)
        .connect(&zk.hosts)
        .await
        .unwrap();
    drop(thief);
    let (at, gb) = within(Duration::from_secs(10), waiter).await.unwrap();
    eprintln!(
        "takeover after the holder's session was closed: {:?}",
        at - killed
    );
    within(Duration::from_secs(5), lost).await;
    let lost_at = killed.elapsed();
    eprintln!("lost() fired {lost_at:?} after the session was closed");
    assert!(!ga.is_held());
    assert!(matches!(
        ga.release().await,
        Err(Error::Lost { .. } | Error::NotOwner { .. })
    ));
    // A new session serves new acquisitions.
    gb.release().await.unwrap();
    let again = within(Duration::from_secs(10), a.mutex("s").unwrap().acquire())
        .await
        .unwrap();
    assert!(ab.stats().sessions.load(Ordering::Relaxed) >= 2);
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_interop_both_ways() {
    let zk = Ensemble::any();
    let root = chroot();
    let (a, _) = zk.client(&root).await;
    let classes = tempfile::tempdir().unwrap();
    let jars = [
        "curator-client",
        "curator-framework",
        "curator-recipes",
        "zookeeper",
        "zookeeper-jute",
        "guava",
        "slf4j-api",
        "slf4j-nop",
        "netty-handler",
        "netty-transport",
        "netty-common",
        "netty-buffer",
        "netty-codec",
        "netty-resolver",
        "netty-transport-native-epoll",
        "netty-transport-native-unix-common",
    ];
    let cp: Vec<String> = jars
        .iter()
        .map(|j| format!("/usr/share/java/{j}.jar"))
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    assert!(
        cp.iter().any(|p| p.contains("curator-recipes")),
        "Curator is not installed: apt-get install libcurator-recipes-java libcurator-framework-java"
    );
    let cp = cp.join(":");
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/backend/zookeeper/CuratorHold.java"
    );
    let st = Command::new("javac")
        .args(["-cp", &cp, "-d"])
        .arg(classes.path())
        .arg(src)
        .status()
        .unwrap();
    assert!(st.success(), "javac failed");
    let cp = format!("{cp}:{}", classes.path().display());
    let path = format!("{root}/{}", escape_name("interop/lock"));
    let java = |wait_ms: u64, hold_ms: u64| {
        let mut child = tokio::process::Command::new("java")
            .args(["-cp", &cp, "CuratorHold", &zk.hosts, &path])
            .arg(wait_ms.to_string())
            .arg(hold_ms.to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        (child, tokio::io::BufReader::new(out))
    };
    use tokio::io::AsyncBufReadExt;
    async fn line(r: &mut tokio::io::BufReader<tokio::process::ChildStdout>) -> String {
        let mut s = String::new();
        within(Duration::from_secs(30), r.read_line(&mut s))
            .await
            .unwrap();
        s.trim().to_string()
    }
    // Curator holds → dlock is excluded, then gets it after Curator's release.
    let (mut child, mut out) = java(5000, 1500);
    assert_eq!(line(&mut out).await, "READY");
    assert!(line(&mut out).await.starts_with("ACQUIRED"));
    let m = a.mutex("interop/lock").unwrap();
    assert!(matches!(m.try_acquire().await, Err(Error::Busy { .. })));
    let g = within(Duration::from_secs(10), m.acquire()).await.unwrap();
    assert!(line(&mut out).await.starts_with("RELEASED"));
    child.wait().await.unwrap();
    // dlock holds → Curator times out; a waiting Curator gets it after dlock's release.
    let (mut child, mut out) = java(1000, 0);
    assert_eq!(line(&mut out).await, "READY");
    assert_eq!(line(&mut out).await, "TIMEOUT");
    child.wait().await.unwrap();
    let (mut child, mut out) = java(20000, 500);
    assert_eq!(line(&mut out).await, "READY");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = a.describe("interop/lock").await.unwrap().unwrap();
    assert_eq!(
        info.waiters.len(),
        1,
        "Curator's node is shown as a waiter: {info:?}"
    );
    g.release().await.unwrap();
    assert!(line(&mut out).await.starts_with("ACQUIRED"));
    let info = a.describe("interop/lock").await.unwrap().unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].meta.client_id, "");
    assert!(line(&mut out).await.starts_with("RELEASED"));
    child.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_network_loss_fires_lost_before_the_takeover() {
    let zk = Ensemble::any();
    let root = chroot();
    let first = zk.hosts.split(',').next().unwrap().to_string();
    let proxy = Blackhole::to(&first).await;
    let timeout = Duration::from_secs(2);
    let c = zk.contest(proxy.addr.clone(), &root, timeout, "net").await;
    let cut = Instant::now();
    proxy.cut.store(true, Ordering::Release);
    let (taken, gb) = within(Duration::from_secs(15), c.waiter).await.unwrap();
    let lost_at = within(Duration::from_secs(1), c.lost).await.unwrap();
    eprintln!(
        "network cut: lost() after {:?}, next waiter granted after {:?} (session timeout {timeout:?})",
        lost_at - cut,
        taken - cut
    );
    assert!(
        lost_at < taken,
        "lost() must fire before anyone else can hold the lock"
    );
    assert!(
        taken - cut >= timeout / 2,
        "the takeover waited for the session to expire"
    );
    gb.release().await.unwrap();
}

#[test]
fn node_data_without_a_value_parses_and_plain_nodes_write_none() {
    // A node of an older dlock (or a plain lock's).
    let old = r#"{"owner":"o","client_id":"c","host":"h","pid":1,"created_at_ms":5}"#;
    let d: NodeData = serde_json::from_str(old).unwrap();
    assert_eq!(d.value, None);
    let json = serde_json::to_string(&d).unwrap();
    assert!(!json.contains("value"), "{json}");
    let with: NodeData =
        serde_json::from_str(r#"{"owner":"o","client_id":"c","host":"h","pid":1,"value":"v"}"#)
            .unwrap();
    assert_eq!(with.value.as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_value_replaces_the_holders_value_only() {
    use crate::backend::test_support::{check_values, hr, meta, meta_value, rq, token, Drive};
    let zk = Ensemble::any();
    let root = chroot();
    let b = zk.backend(&root, Duration::from_secs(4)).await;
    check_values(&b, "values", false).await;
    // The value is in the node's data, there only for a hold that has one.
    let raw = zk.raw(&root).await;
    let n = LockName::new("values-raw").unwrap();
    let (mv, mp) = (meta_value("v", "leader"), meta("p"));
    let rv = rq(&n, "0b9a3c6e-6b1d-4d3f-9a57-1f2e3d4c5b6a", &mv);
    token(b.acquire(&rv).await.unwrap());
    let kids = children(&raw, "values-raw").await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let data = node_data(&raw, "values-raw", &kids[0]).await;
    let d: NodeData = serde_json::from_slice(&data).unwrap();
    assert_eq!(d.value.as_deref(), Some("leader"));
    assert_eq!(
        b.set_value(&hr(&rv), "next").await.unwrap(),
        Released::Released
    );
    let data = node_data(&raw, "values-raw", &kids[0]).await;
    let d: NodeData = serde_json::from_slice(&data).unwrap();
    assert_eq!(d.value.as_deref(), Some("next"));
    // A revoked hold is nobody's: no new value.
    b.force_release(&n, Force::Revoke).await.unwrap();
    assert_eq!(
        b.set_value(&hr(&rv), "late").await.unwrap(),
        Released::NotHeld
    );
    assert_eq!(b.release(&hr(&rv)).await.unwrap(), Released::Released);
    // A plain hold's node has no value in its data.
    let rp = rq(&n, "1b9a3c6e-6b1d-4d3f-9a57-1f2e3d4c5b6a", &mp);
    token(b.acquire(&rp).await.unwrap());
    let kids = children(&raw, "values-raw").await;
    let data = node_data(&raw, "values-raw", &kids[0]).await;
    assert!(!String::from_utf8_lossy(&data).contains("value"));
    assert_eq!(b.release(&hr(&rp)).await.unwrap(), Released::Released);
}

/// A node of the backend's own session that nothing of the backend claims (a ghost: its create
/// was done by the server after the answer was lost) is deleted by the waiter behind it; a node
/// of another session is waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ghost_node_of_the_own_session_is_deleted() {
    let zk = Ensemble::any();
    let root = chroot();
    let (c, b) = zk.client(&root).await;
    let s = b.session().await.unwrap();
    let lock_path = format!("/{}", escape_name("ghosted"));
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let child = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    s.client.create(&lock_path, &[], &container).await.unwrap();
    let ghost = format!("{lock_path}/_c_{}-lock-", uuid::Uuid::new_v4());
    s.client.create(&ghost, b"{}", &child).await.unwrap();
    let g = c
        .mutex("ghosted")
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("granted behind its own session's ghost");
    assert_eq!(b.stats().ghosts.load(Ordering::Relaxed), 1);
    g.release().await.unwrap();
    // Another session's node is a holder like any other.
    let raw = zk.raw(&root).await;
    let other = format!("{lock_path}/_c_{}-lock-", uuid::Uuid::new_v4());
    raw.create(&lock_path, &[], &container).await.ok();
    raw.create(&other, b"{}", &child).await.unwrap();
    let e = c
        .mutex("ghosted")
        .unwrap()
        .acquire_timeout(Duration::from_millis(800))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert_eq!(b.stats().ghosts.load(Ordering::Relaxed), 1);
}

/// Sends SIGCONT to a stopped server when dropped (also when the test fails).
struct Resume(String);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_fires_lost_on_a_follower_before_the_takeover() {
    // The holder talks to a follower only; the follower keeps answering its reads while the
    // leader is stopped (syncLimit × tickTime = 2 s), but the leader, when it runs again, expires
    // the sessions whose touches it missed. The holder must count its session from answers the
    // leader took part in.
    let zk = Ensemble::start();
    let root = chroot();
    let leader: usize = zk.script(&["leader"]).parse().unwrap();
    let hosts: Vec<&str> = zk.hosts.split(',').collect();
    let follower = hosts[if leader == 1 { 1 } else { 0 }].to_string();
    let timeout = Duration::from_secs(1);
    let c = zk.contest(follower, &root, timeout, "pause").await;
    let pid = std::fs::read_to_string(zk.dir().join(format!("s{leader}/pid"))).unwrap();
    let pid = pid.trim().to_string();
    let paused = Instant::now();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let resume = Resume(pid);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    drop(resume);
    let (taken, gb) = within(Duration::from_secs(20), c.waiter).await.unwrap();
    let lost_at = within(Duration::from_secs(5), c.lost).await.unwrap();
    eprintln!(
        "leader paused 1.8 s: lost() after {:?}, next waiter granted after {:?} (session timeout {timeout:?})",
        lost_at - paused,
        taken - paused
    );
    assert!(
        lost_at < taken,
        "lost() must fire before anyone else can hold the lock"
    );
    gb.release().await.unwrap();
}
