"""The Python peers of `dlock bench`: redis-py's `Lock` on one Redis server and kazoo's `Lock` on
ZooKeeper. `crates/dlock-cli/src/bench/peers.rs` embeds this file, writes it to a temporary
directory and drives it; it is not meant to be run by hand.

    peer.py LIB version          the library's version and Python's, one line
    peer.py LIB u1 OPTIONS       U1: says "ready", then answers each "pairs K" line with
                                 "ok US US ..." (K acquire + release pairs, microseconds each,
                                 timed here) until "quit" or the end of its input
    peer.py LIB worker OPTIONS   one process of C1/H1, with the protocol of `dlock bench-worker`:
                                 "ready", then "go START_NS END_NS" on stdin, then one JSON line
                                 with every acquisition's [process, task, request, grant,
                                 release start, release end] (CLOCK_REALTIME ns)

LIB is redis-py or kazoo. Each library keeps its defaults but the lease: redis-py's `timeout=`
(the key's TTL, --lease-ms) and kazoo's session timeout (--lease-ms). Waiters are threads, each
with a lock object of its own, reused; the threads of a process share one client (a redis-py
`Redis` with its connection pool, one kazoo session), as dlock's tasks share one client.
"""

import argparse
import json
import sys
import threading
import time


class RedisPy:
    """redis-py: `Redis.from_url(URL).lock(name, timeout=lease)`; waiting is the library's own
    (a retry every `sleep`, 0.1 s by default) until `blocking_timeout`."""

    def __init__(self, conn, lease_ms):
        import redis

        self.client = redis.Redis.from_url(conn)
        self.client.ping()
        self.lease_s = lease_ms / 1000.0

    def lock(self, name, ident):
        return self.client.lock(name, timeout=self.lease_s)

    @staticmethod
    def acquire(lock, timeout_s):
        return lock.acquire(blocking_timeout=timeout_s)

    @staticmethod
    def release(lock):
        lock.release()

    def close(self):
        self.client.close()


class Kazoo:
    """kazoo: `KazooClient(hosts, timeout=lease).Lock(path, identifier)`; waiting is the
    recipe's own (a watch on the predecessor) until `acquire(timeout=)`."""

    def __init__(self, conn, lease_ms):
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=conn, timeout=lease_ms / 1000.0)
        self.client.start(timeout=15)

    def lock(self, name, ident):
        return self.client.Lock(name, ident)

    @staticmethod
    def acquire(lock, timeout_s):
        from kazoo.exceptions import LockTimeout

        try:
            return lock.acquire(timeout=timeout_s)
        except LockTimeout:
            return False

    @staticmethod
    def release(lock):
        lock.release()

    def close(self):
        # The lock nodes the recipe made (persistent) are deleted by the bench after the run.
        self.client.stop()
        self.client.close()


LIBS = {"redis-py": RedisPy, "kazoo": Kazoo}
MODULES = {"redis-py": "redis", "kazoo": "kazoo"}


def describe(e):
    return f"{type(e).__name__}: {e}"


def pause(us):
    if us > 0:
        time.sleep(us / 1e6)


def version(lib):
    from importlib.metadata import version as dist_version

    mod = __import__(MODULES[lib])
    v = getattr(mod, "__version__", None) or dist_version(MODULES[lib])
    print(f"{v} (Python {sys.version.split()[0]})", flush=True)


def u1(peer, a):
    lock = peer.lock(a.name, "u1")
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            w = line.split()
            if not w or w[0] == "quit":
                break
            k = int(w[1])
            out = []
            try:
                for _ in range(k):
                    s = time.perf_counter_ns()
                    if not peer.acquire(lock, 10.0):
                        raise RuntimeError("not granted within 10 s")
                    peer.release(lock)
                    out.append((time.perf_counter_ns() - s) / 1e3)
            except Exception as e:  # noqa: BLE001 - reported to the bench
                print("err " + describe(e).replace("\n", " "), flush=True)
                break
            print("ok " + " ".join(f"{x:.3f}" for x in out), flush=True)
    finally:
        peer.close()


class Acc:
    def __init__(self):
        self.mu = threading.Lock()
        self.records = []
        self.errors = 0
        self.first_error = None

    def error(self, e):
        with self.mu:
            self.errors += 1
            if self.first_error is None:
                self.first_error = e
            return self.errors > 100


def worker(peer, a):
    warm = peer.lock(a.warm, "warm")
    if not peer.acquire(warm, 10.0):
        raise RuntimeError("warm-up: not granted within 10 s")
    peer.release(warm)
    print("ready", flush=True)
    w = sys.stdin.readline().split()
    if len(w) != 3 or w[0] != "go":
        raise RuntimeError(f"bad start line {w!r}")
    start, end = int(w[1]), int(w[2])
    pause((start - time.time_ns()) / 1e3)
    acc = Acc()
    pi = a.proc_index

    def task(t):
        lock = peer.lock(a.name, f"{pi}-{t}")
        n = 0
        while n < a.max_per_task:
            req = time.time_ns()
            if req >= end:
                break
            try:
                got = peer.acquire(lock, (end - req) / 1e9)
            except Exception as e:  # noqa: BLE001 - counted, as the bench's workers do
                if acc.error("acquire: " + describe(e)):
                    break
                time.sleep(0.02)
                continue
            if not got:
                break
            grant = time.time_ns()
            pause(a.hold_us)
            rs = time.time_ns()
            err = None
            try:
                peer.release(lock)
            except Exception as e:  # noqa: BLE001
                err = "release: " + describe(e)
            re_ = time.time_ns()
            if err is not None:
                acc.error(err)
            with acc.mu:
                acc.records.append([pi, t, req, grant, rs, re_])
            n += 1
            pause(a.pause_us)

    threads = [threading.Thread(target=task, args=(t,), daemon=True) for t in range(a.tasks)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out = {
        "records": acc.records,
        "errors": acc.errors,
        "first_error": acc.first_error,
    }
    peer.close()
    print(json.dumps(out, separators=(",", ":")), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("lib", choices=sorted(LIBS))
    p.add_argument("mode", choices=["version", "u1", "worker"])
    p.add_argument("--conn", help="a redis:// URL or a ZooKeeper connect string")
    p.add_argument("--name", help="the key (Redis) or the lock node's path (ZooKeeper)")
    p.add_argument("--warm", help="the warm-up lock's key or path")
    p.add_argument("--lease-ms", type=int, default=30000)
    p.add_argument("--tasks", type=int, default=1)
    p.add_argument("--proc-index", type=int, default=0)
    p.add_argument("--hold-us", type=int, default=0)
    p.add_argument("--pause-us", type=int, default=0)
    p.add_argument("--max-per-task", type=int, default=1_000_000)
    a = p.parse_args()
    if a.mode == "version":
        version(a.lib)
        return
    peer = LIBS[a.lib](a.conn, a.lease_ms)
    if a.mode == "u1":
        u1(peer, a)
    else:
        worker(peer, a)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - one line for the bench's report
        print(f"peer.py: {describe(e)}", file=sys.stderr, flush=True)
        sys.exit(1)
