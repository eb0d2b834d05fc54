import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * The Curator peer of `dlock bench`: Apache Curator's InterProcessMutex on ZooKeeper.
 * crates/dlock-cli/src/bench/peers.rs embeds this file, compiles it against Debian's jars and
 * drives it, with the same protocol as peer.py:
 *
 *   CuratorPeer version           ZooKeeper's client version and the JDK's, one line
 *   CuratorPeer u1 OPTIONS        "ready", then "ok US US ..." for each "pairs K" line
 *   CuratorPeer worker OPTIONS    one process of C1/H1: "ready", "go START_NS END_NS" on stdin,
 *                                 then one JSON line of records (CLOCK_REALTIME ns)
 *
 * Options: --conn HOST:PORT,... --name PATH --warm PATH --lease-ms N (the session timeout)
 * --tasks N --proc-index N --hold-us N --pause-us N --max-per-task N. Curator's defaults but the
 * session timeout; the retry policy, which Curator requires, is its documented
 * ExponentialBackoffRetry(1000, 3). Waiters are threads, each with an InterProcessMutex of its
 * own, reused; the threads of a process share one CuratorFramework (one session).
 */
public class CuratorPeer {
    /** CLOCK_REALTIME in ns (comparable with the other processes' timestamps). */
    static long now() {
        Instant i = Instant.now();
        return i.getEpochSecond() * 1_000_000_000L + i.getNano();
    }

    /** A precise pause (Thread.sleep rounds below a millisecond up to one). */
    static void pause(long us) {
        if (us <= 0) {
            return;
        }
        long until = System.nanoTime() + us * 1000;
        long left;
        while ((left = until - System.nanoTime()) > 0) {
            LockSupport.parkNanos(left);
        }
    }

    static String describe(Throwable e) {
        String m = e.getMessage();
        return e.getClass().getSimpleName() + (m == null ? "" : ": " + m.replace('\n', ' '));
    }

    static String json(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static CuratorFramework connect(Map<String, String> o) throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.builder()
                .connectString(o.get("conn"))
                .sessionTimeoutMs(Integer.parseInt(o.getOrDefault("lease-ms", "10000")))
                .retryPolicy(new ExponentialBackoffRetry(1000, 3))
                .build();
        c.start();
        if (!c.blockUntilConnected(15, TimeUnit.SECONDS)) {
            throw new IllegalStateException("not connected to " + o.get("conn") + " within 15 s");
        }
        return c;
    }

    static void u1(Map<String, String> o, BufferedReader in) throws Exception {
        CuratorFramework c = connect(o);
        InterProcessMutex m = new InterProcessMutex(c, o.get("name"));
        System.out.println("ready");
        System.out.flush();
        try {
            String line;
            while ((line = in.readLine()) != null) {
                String[] w = line.trim().split("\\s+");
                if (w.length < 2 || !w[0].equals("pairs")) {
                    break;
                }
                int k = Integer.parseInt(w[1]);
                StringBuilder out = new StringBuilder("ok");
                try {
                    for (int i = 0; i < k; i++) {
                        long s = System.nanoTime();
                        if (!m.acquire(10, TimeUnit.SECONDS)) {
                            throw new IllegalStateException("not granted within 10 s");
                        }
                        m.release();
                        double us = (System.nanoTime() - s) / 1e3;
                        out.append(String.format(Locale.ROOT, " %.3f", us));
                    }
                } catch (Exception e) {
                    System.out.println("err " + describe(e));
                    System.out.flush();
                    break;
                }
                System.out.println(out);
                System.out.flush();
            }
        } finally {
            c.close();
        }
    }

    static void worker(Map<String, String> o, BufferedReader in) throws Exception {
        CuratorFramework c = connect(o);
        InterProcessMutex warm = new InterProcessMutex(c, o.get("warm"));
        if (!warm.acquire(10, TimeUnit.SECONDS)) {
            throw new IllegalStateException("warm-up: not granted within 10 s");
        }
        warm.release();
        System.out.println("ready");
        System.out.flush();
        String line = in.readLine();
        String[] w = line == null ? new String[0] : line.trim().split("\\s+");
        if (w.length != 3 || !w[0].equals("go")) {
            throw new IllegalStateException("bad start line " + line);
        }
        long start = Long.parseLong(w[1]);
        long end = Long.parseLong(w[2]);
        pause((start - now()) / 1000);
        int tasks = Integer.parseInt(o.getOrDefault("tasks", "1"));
        long pi = Long.parseLong(o.getOrDefault("proc-index", "0"));
        long hold = Long.parseLong(o.getOrDefault("hold-us", "0"));
        long pauseUs = Long.parseLong(o.getOrDefault("pause-us", "0"));
        long max = Long.parseLong(o.getOrDefault("max-per-task", "1000000"));
        String name = o.get("name");
        List<long[]> records = new ArrayList<>();
        long[] errors = {0};
        String[] first = {null};
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < tasks; t++) {
            final long task = t;
            Thread th = new Thread(() -> {
                InterProcessMutex m = new InterProcessMutex(c, name);
                long n = 0;
                while (n < max) {
                    long req = now();
                    if (req >= end) {
                        break;
                    }
                    boolean got;
                    try {
                        got = m.acquire(end - req, TimeUnit.NANOSECONDS);
                    } catch (Exception e) {
                        boolean stop;
                        synchronized (records) {
                            errors[0]++;
                            if (first[0] == null) {
                                first[0] = "acquire: " + describe(e);
                            }
                            stop = errors[0] > 100;
                        }
                        if (stop) {
                            break;
                        }
                        pause(20_000);
                        continue;
                    }
                    if (!got) {
                        break;
                    }
                    long grant = now();
                    pause(hold);
                    long rs = now();
                    String err = null;
                    try {
                        m.release();
                    } catch (Exception e) {
                        err = "release: " + describe(e);
                    }
                    long re = now();
                    synchronized (records) {
                        if (err != null) {
                            errors[0]++;
                            if (first[0] == null) {
                                first[0] = err;
                            }
                        }
                        records.add(new long[] {pi, task, req, grant, rs, re});
                    }
                    n++;
                    pause(pauseUs);
                }
            });
            th.start();
            threads.add(th);
        }
        for (Thread th : threads) {
            th.join();
        }
        StringBuilder b = new StringBuilder("{\"records\":[");
        synchronized (records) {
            for (int i = 0; i < records.size(); i++) {
                long[] r = records.get(i);
                b.append(i == 0 ? "[" : ",[");
                for (int j = 0; j < r.length; j++) {
                    b.append(j == 0 ? "" : ",").append(r[j]);
                }
                b.append(']');
            }
            b.append("],\"errors\":").append(errors[0]);
            b.append(",\"first_error\":").append(json(first[0])).append('}');
        }
        c.close();
        System.out.println(b);
        System.out.flush();
    }

    public static void main(String[] a) {
        try {
            Map<String, String> o = new HashMap<>();
            for (int i = 1; i + 1 < a.length; i += 2) {
                o.put(a[i].replaceFirst("^--", ""), a[i + 1]);
            }
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            switch (a.length > 0 ? a[0] : "") {
                case "version":
                    System.out.println("ZooKeeper client "
                            + org.apache.zookeeper.Version.getFullVersion().split("[-, ]")[0]
                            + ", JDK " + System.getProperty("java.version"));
                    break;
                case "u1":
                    u1(o, in);
                    break;
                case "worker":
                    worker(o, in);
                    break;
                default:
                    throw new IllegalArgumentException("usage: CuratorPeer version|u1|worker OPTIONS");
            }
            System.out.flush();
            System.exit(0);
        } catch (Throwable e) {
            System.err.println("CuratorPeer: " + describe(e));
            System.exit(1);
        }
    }
}
