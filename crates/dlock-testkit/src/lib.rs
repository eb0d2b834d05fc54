//! Private store servers and a fault-injecting TCP proxy, for dlock's fault tests
//! (`crates/dlock-cli/tests/*_faults.rs`) and its chaos harness (`crates/dlock-chaos`).
//!
//! - [`RedisServer`]: a private `redis-server` on a free loopback port with its own directory.
//! - [`SqlServer`]: a private PostgreSQL or MariaDB server ([`Db`]) on a free loopback port.
//! - [`ZkEnsemble`]: a three-server ZooKeeper ensemble (wraps `scripts/zk-ensemble.sh`).
//! - [`EtcdCluster`]: a three-member etcd cluster (wraps `scripts/etcd-cluster.sh`).
//! - [`RedisSentinel`], [`RedisCluster`]: Redis with fail-over, a Sentinel topology (1 master,
//!   2 replicas, 3 sentinels) and a six-node Redis Cluster (wrap `scripts/redis-ha.sh`).
//! - [`TcpProxy`]: a TCP proxy on 127.0.0.1 whose delay, black hole and resets are switched at
//!   run time.
//! - [`free_port`], [`alive`], [`children`], [`signal`]: process and port helpers.
//!
//! Every server runs in a temporary directory, is stopped by pid when dropped (only processes this
//! crate started are ever signalled), and every wait is bounded. Errors are `std::io::Error`s with
//! a message that says what failed, including the tail of the server's log when a start fails;
//! nothing here panics on a missing binary or a server that does not come up.

mod etcd;
mod proxy;
mod redis;
mod redis_ha;
mod sql;
mod util;
mod zk;

pub use etcd::EtcdCluster;
pub use proxy::TcpProxy;
pub use redis::RedisServer;
pub use redis_ha::{RedisCluster, RedisHa, RedisSentinel, SlotMove, SENTINEL_MASTER_NAME};
pub use sql::{pg_bin, Db, SqlServer};
pub use util::server_dir;
pub use zk::ZkEnsemble;

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// A free TCP port on 127.0.0.1, below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, where outgoing connections take their local ports), so that a
/// server restarted on it does not find it taken by a client's connection (as `scripts/ports.sh`).
/// Bound once and released again, so another process may in principle take it before the caller
/// does.
pub fn free_port() -> io::Result<u16> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let low: u64 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .filter(|&l| l > 11_000)
        .unwrap_or(60_000);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    let mut x =
        nanos ^ (u64::from(std::process::id()) << 32) ^ CALLS.fetch_add(1, Ordering::Relaxed) | 1;
    for _ in 0..1000 {
        // xorshift64*: candidates spread over [10000, low).
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let port = 10_000 + x.wrapping_mul(0x2545_f491_4f6c_dd1d) % (low - 10_000);
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| io::Error::other(format!("cannot bind a free port on 127.0.0.1: {e}")))?;
    Ok(l.local_addr()?.port())
}

/// `true` while process `pid` exists and is not a zombie (read from `/proc`). A multi-threaded
/// process whose main thread has ended counts as alive until its last thread has.
pub fn alive(pid: u32) -> bool {
    fn running(stat: &str) -> bool {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    if running(&stat) {
        return true;
    }
    // The main thread is a zombie; others may still be exiting.
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| running(&s)))
}

/// The pids of `pid`'s direct children (from `/proc/PID/task/PID/children`; empty when the process
/// is gone or the kernel does not expose the list).
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Sends `sig` to process `pid`. Only pass pids of processes you started.
pub fn signal(pid: u32, sig: Signal) -> io::Result<()> {
    let raw = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| io::Error::other(format!("not a single process id: {pid}")))?;
    nix::sys::signal::kill(Pid::from_raw(raw), sig)
        .map_err(|e| io::Error::other(format!("kill -{sig} {pid}: {e}")))
}
