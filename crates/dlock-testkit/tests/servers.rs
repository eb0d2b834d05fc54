//! The private servers, each briefly: start, the fault operations, stop. They need the server
//! binaries `scripts/test.sh` installs (redis-server, PostgreSQL, MariaDB, ZooKeeper; the Redis
//! fail-over topologies install redis-server themselves when it is missing).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::{
    alive, Db, RedisCluster, RedisSentinel, RedisServer, SqlServer, TcpProxy, ZkEnsemble,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `PING` in the Redis protocol by hand; the reply.
async fn ping(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await??;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_behind_the_proxy() {
    let mut r = RedisServer::start(&["--save", "", "--appendonly", "no"]).expect("redis-server");
    let upstream = SocketAddr::from(([127, 0, 0, 1], r.port));
    let p = TcpProxy::start(upstream).await.unwrap();
    assert_eq!(ping(p.addr()).await.unwrap(), "+PONG\r\n");
    let cli = Command::new("redis-cli")
        .args(["-p", &p.addr().port().to_string(), "ping"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&cli.stdout).trim(), "PONG");
    assert_eq!(r.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(r.cli(&["GET", "k"]), "v");

    // Two idle clients through the proxy: the server closes them, the proxy passes that on.
    let mut a = TcpStream::connect(p.addr()).await.unwrap();
    let mut b = TcpStream::connect(upstream).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while r.cli(&["CLIENT", "LIST"]).lines().count() < 3 {
        assert!(Instant::now() < deadline, "clients never showed up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed = tokio::task::block_in_place(|| r.kill_client_connections()).unwrap();
    assert_eq!(killed, 2);
    let mut buf = [0u8; 16];
    for s in [&mut a, &mut b] {
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("closed by CLIENT KILL")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    // Killed behind the handle's back: spawn starts it again.
    let pid = r.pid().unwrap();
    dlock_testkit::signal(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while alive(pid) {
        assert!(Instant::now() < deadline, "SIGKILL did not end {pid}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::task::block_in_place(|| r.spawn()).unwrap();
    assert_ne!(r.pid(), Some(pid));
    assert_eq!(ping(p.addr()).await.unwrap(), "+PONG\r\n");

    // A restart: the same port and directory; gone for a short while.
    let pid = r.pid().unwrap();
    let gone = tokio::task::block_in_place(|| r.restart()).unwrap();
    assert!(gone < Duration::from_secs(10), "{gone:?}");
    assert!(!alive(pid));
    assert_ne!(r.pid(), Some(pid));
    assert_eq!(ping(p.addr()).await.unwrap(), "+PONG\r\n");
    assert_eq!(r.url(), format!("redis://127.0.0.1:{}/", r.port));
    r.stop();
    assert!(r.pid().is_none());
    assert!(ping(upstream).await.is_err());
    assert!(!alive(pid));
}

#[test]
fn redis_start_failure_is_an_error_with_the_log() {
    let e =
        RedisServer::start(&["--no-such-option", "x"]).expect_err("a bad option does not start");
    let msg = e.to_string();
    assert!(msg.contains("redis-server"), "{msg}");
    assert!(
        msg.contains("no-such-option"),
        "the log's tail is missing: {msg}"
    );
}

/// A client process with an open connection that waits on its stdin.
fn idle_client(db: Db, port: u16) -> Child {
    let mut c = match db {
        Db::Postgres => {
            let mut c = Command::new("psql");
            c.args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(["-U", "postgres", "-d", "postgres", "-X", "-A", "-t"]);
            c
        }
        Db::MariaDb => {
            let mut c = Command::new("mariadb");
            c.arg("--no-defaults")
                .args(["-h", "127.0.0.1", "-P", &port.to_string()])
                .args(["-u", "root", "-N", "-B", "--unbuffered"]);
            c
        }
    };
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Connected once it answers a query.
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(b"SELECT 42;\n").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "42");
    child
}

fn sql_server(db: Db) {
    let mut s = SqlServer::start(db).expect("server starts");
    assert!(s.dir().join("data").is_dir());
    match db {
        Db::Postgres => assert_eq!(
            s.base_url(),
            format!("postgres://postgres@127.0.0.1:{}/postgres", s.port)
        ),
        Db::MariaDb => assert_eq!(
            s.base_url(),
            format!("mysql://root@127.0.0.1:{}/test", s.port)
        ),
    }
    assert_eq!(
        s.url("&mode=session"),
        format!("{}?table=dlock_faults&mode=session", s.base_url())
    );
    let mut clients = [idle_client(db, s.port), idle_client(db, s.port)];
    assert_eq!(s.kill_client_connections().unwrap(), 2, "{db:?}");
    assert_eq!(s.kill_client_connections().unwrap(), 0, "{db:?}");
    for c in &mut clients {
        let _ = c.kill();
        let _ = c.wait();
    }
    let t = Instant::now();
    s.crash();
    let crashed = t.elapsed();
    s.spawn().expect("starts again");
    eprintln!(
        "{db:?}: crash took {crashed:?}, start {:?}",
        t.elapsed() - crashed
    );
    let gone = s.restart().expect("restarts");
    eprintln!("{db:?}: restart took {gone:?}");
    let mut c = idle_client(db, s.port);
    let _ = c.kill();
    let _ = c.wait();
    let pid = s.pid().unwrap();
    s.stop();
    assert!(!alive(pid));
}

#[test]
fn postgres_kill_connections_and_restart() {
    sql_server(Db::Postgres);
}

#[test]
fn mariadb_kill_connections_and_restart() {
    sql_server(Db::MariaDb);
}

#[test]
fn zookeeper_ensemble_kill_and_start_one() {
    let mut zk = ZkEnsemble::start().expect("ensemble starts");
    let ports = zk.client_ports();
    assert_eq!(ports.len(), 3);
    assert_eq!(
        zk.hosts(),
        ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let leader = zk.leader().unwrap();
    assert!((1..=3).contains(&leader));
    let pid = zk.pid(leader).expect("the leader's pid");
    assert!(alive(pid));
    zk.kill(leader).unwrap();
    assert!(!alive(pid));
    assert_eq!(zk.pid(leader), None);
    assert!(std::net::TcpStream::connect(("127.0.0.1", ports[leader - 1])).is_err());
    let next = zk.leader().unwrap();
    assert_ne!(next, leader);
    zk.start_one(leader).unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", ports[leader - 1])).is_ok());
    assert!(zk.kill(4).is_err());
    zk.stop();
    for p in ports {
        assert!(std::net::TcpStream::connect(("127.0.0.1", p)).is_err());
    }
}

/// `127.0.0.1:PORT` for every node of a started topology, in order.
fn addrs(hosts: &str) -> Vec<String> {
    hosts.split(',').map(str::to_string).collect()
}

#[test]
fn redis_sentinel_starts_and_names_its_master() {
    let mut s = RedisSentinel::start().expect("sentinel topology starts");
    let sentinels = addrs(s.hosts());
    assert_eq!(sentinels.len(), 3, "{}", s.hosts());
    for (i, a) in sentinels.iter().enumerate() {
        let node = format!("s{}", i + 1);
        assert_eq!(a, &format!("127.0.0.1:{}", s.port(&node).unwrap()));
        assert_eq!(s.node_of(a).unwrap(), node);
    }
    assert_eq!(
        s.url("?replicas=1"),
        format!("redis+sentinel://{}/dlockmaster?replicas=1", s.hosts())
    );
    // The first master is n1, and it has both replicas.
    let (node, master) = s.master_node().unwrap();
    assert_eq!(node, "n1");
    assert_eq!(master, format!("127.0.0.1:{}", s.port("n1").unwrap()));
    assert_eq!(s.role("n1").unwrap(), "master");
    assert_eq!(s.role("s1").unwrap(), "sentinel");
    s.wait_replica("n2").expect("n2 replicates the master");
    assert!(
        s.kill("c1").is_err(),
        "no cluster node in a sentinel topology"
    );
    let pids: Vec<u32> = ["n1", "n2", "n3", "s1", "s2", "s3"]
        .iter()
        .map(|n| s.pid(n).expect("running"))
        .collect();
    s.stop();
    for p in pids {
        assert!(!alive(p), "pid {p} outlived stop");
    }
}

#[test]
fn redis_cluster_starts_and_names_the_master_of_a_key() {
    let mut c = RedisCluster::start().expect("cluster starts");
    let nodes = addrs(c.hosts());
    assert_eq!(nodes.len(), 6, "{}", c.hosts());
    assert_eq!(
        c.url("?replicas=1"),
        format!("redis+cluster://{}/?replicas=1", c.hosts())
    );
    // dlock's keys of the lock `x` are `dlock:{x}`...: the slot of the hash tag.
    let slot = c.key_slot("dlock:{x}").unwrap();
    assert_eq!(slot, c.key_slot("x").unwrap());
    assert_eq!(slot, 16287);
    let (node, master) = c.master_node_of("dlock:{x}").unwrap();
    assert!(nodes.contains(&master), "{master} not in {nodes:?}");
    assert_eq!(master, format!("127.0.0.1:{}", c.port(&node).unwrap()));
    assert_eq!(c.role(&node).unwrap(), "master");
    let replicas: Vec<String> = (1..=6)
        .map(|n| format!("c{n}"))
        .filter(|n| c.role(n).unwrap() == "slave")
        .collect();
    assert_eq!(replicas.len(), 3, "three replicas: {replicas:?}");
    for r in &replicas {
        c.wait_replica(r).expect("a replica with its link up");
    }
    let pids: Vec<u32> = (1..=6)
        .map(|n| c.pid(&format!("c{n}")).expect("running"))
        .collect();
    c.stop();
    for p in pids {
        assert!(!alive(p), "pid {p} outlived stop");
    }
}
