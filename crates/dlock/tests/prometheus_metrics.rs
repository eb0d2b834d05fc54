//! The metrics docs/METRICS.md documents are the ones dlock emits: runs the `prometheus`
//! example's own code, scrapes its endpoint over a raw HTTP GET and compares the `dlock_` metric
//! families with the doc's table, both ways.

#[allow(dead_code)] // its `main` is the example's, not the test's
#[path = "../examples/prometheus.rs"]
mod example;

use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The metrics of docs/METRICS.md's table: name → type (`counter`, `gauge`, `histogram`).
fn documented() -> BTreeMap<String, String> {
    let doc = include_str!("../../../docs/METRICS.md");
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        // | `dlock_name` | type | ...
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        if let Some(name) = cells[1]
            .strip_prefix("`dlock_")
            .and_then(|n| n.strip_suffix('`'))
        {
            out.insert(format!("dlock_{name}"), cells[2].to_string());
        }
    }
    out
}

async fn get(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_at(rest.find('/').expect("a path"));
    let mut s = tokio::net::TcpStream::connect(host).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("read");
    assert!(body.starts_with("HTTP/1.1 200"), "scrape answered: {body}");
    body
}

/// The value of the first sample line of `metric` whose labels contain `with`.
fn value(scrape: &str, metric: &str, with: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .find(|l| l.contains(with))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample of {metric} with {with:?} in:\n{scrape}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_example_exports_every_documented_metric() {
    let doc = documented();
    assert!(
        doc.len() >= 5,
        "docs/METRICS.md lists too few metrics: {doc:?}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = format!("127.0.0.1:{port}").parse().expect("address");
    let (url, _held) = example::serve(addr, dir.path()).await.expect("the example");

    // The listener starts in the background: try for a while.
    let mut scrape = String::new();
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            scrape = get(&url).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!scrape.is_empty(), "nothing listened on {url}");

    // Families in the scrape, from the `# TYPE name type` lines.
    let scraped: BTreeMap<String, String> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| n.starts_with("dlock_"))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    for (name, ty) in &doc {
        let got = scraped
            .get(name)
            .unwrap_or_else(|| panic!("{name} is documented but not exported:\n{scrape}"));
        // The exporter renders a histogram as a summary unless buckets are configured.
        let ok = got == ty || (ty == "histogram" && got == "summary");
        assert!(ok, "{name}: documented as {ty}, exported as {got}");
    }
    for name in scraped.keys() {
        assert!(
            doc.contains_key(name),
            "{name} is exported but not in docs/METRICS.md"
        );
    }

    // The workload moved what it did.
    assert!(value(&scrape, "dlock_acquire_busy_total", "backend=\"sqlite\"") >= 2.0);
    assert!(value(&scrape, "dlock_acquire_total", "result=\"busy\"") >= 1.0);
    assert!(value(&scrape, "dlock_acquire_total", "result=\"timeout\"") >= 1.0);
    assert!(value(&scrape, "dlock_acquire_total", "result=\"granted\"") >= 3.0);
    assert!(value(&scrape, "dlock_lost_total", "backend=\"sqlite\"") >= 1.0);
    assert!(value(&scrape, "dlock_renew_failures_total", "reason=\"gone\"") >= 1.0);
    assert!(value(&scrape, "dlock_hold_seconds_count", "backend=\"sqlite\"") >= 2.0);
    assert_eq!(value(&scrape, "dlock_holds", "backend=\"sqlite\""), 1.0);
    assert_eq!(value(&scrape, "dlock_waiters", "backend=\"sqlite\""), 0.0);
}

/// The lock name is a label only for a client that opts in.
#[test]
fn metrics_name_label_is_opt_in() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A thread-local recorder: everything runs on this thread's runtime.
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let plain = dlock::connect("mem://name-label").await.expect("client");
            let named = dlock::connect_with(
                "mem://name-label",
                dlock::ClientOptions::default().metrics_name_label(true),
            )
            .await
            .expect("client");
            let g = plain.mutex("jobs/plain").expect("name").acquire().await;
            g.expect("granted").release().await.expect("released");
            let g = named.mutex("jobs/named").expect("name").acquire().await;
            g.expect("granted").release().await.expect("released");
        })
    });
    let scrape = handle.render();
    assert!(
        value(&scrape, "dlock_acquire_total", "name=\"jobs/named\"") >= 1.0,
        "{scrape}"
    );
    assert!(value(&scrape, "dlock_hold_seconds_count", "name=\"jobs/named\"") >= 1.0);
    assert!(!scrape.contains("jobs/plain"), "{scrape}");
}
