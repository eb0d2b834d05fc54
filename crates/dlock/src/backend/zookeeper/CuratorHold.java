import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;
import java.util.concurrent.TimeUnit;

/** CuratorHold CONNECT PATH WAIT_MS HOLD_MS: takes an InterProcessMutex on PATH (waiting at most WAIT_MS),
 *  prints ACQUIRED or TIMEOUT, holds HOLD_MS, releases and prints RELEASED. */
public class CuratorHold {
    public static void main(String[] a) throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.newClient(a[0], 10000, 5000, new RetryNTimes(3, 200));
        c.start();
        c.blockUntilConnected(10, TimeUnit.SECONDS);
        InterProcessMutex m = new InterProcessMutex(c, a[1]);
        System.out.println("READY");
        System.out.flush();
        if (!m.acquire(Long.parseLong(a[2]), TimeUnit.MILLISECONDS)) {
            System.out.println("TIMEOUT");
            System.out.flush();
            c.close();
            return;
        }
        System.out.println("ACQUIRED " + System.currentTimeMillis());
        System.out.flush();
        Thread.sleep(Long.parseLong(a[3]));
        m.release();
        System.out.println("RELEASED " + System.currentTimeMillis());
        System.out.flush();
        c.close();
    }
}
