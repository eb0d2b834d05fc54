//! Serves dlock's metrics to Prometheus (see docs/METRICS.md) with `metrics-exporter-prometheus`,
//! after a few acquisitions on the embedded SQLite store in a temporary directory: granted,
//! contended (one waits), refused (`try_acquire`), timed out, and a hold lost to a forced unlock.
//!
//! ```text
//! cargo run -p dlock-rs --example prometheus              # serves until Ctrl-C
//! cargo run -p dlock-rs --example prometheus -- 10        # serves for 10 s, then exits
//! DLOCK_METRICS_ADDR=0.0.0.0:9898 cargo run -p dlock-rs --example prometheus
//! ```

use dlock::{Force, Guard};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

type BoxError = Box<dyn Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr: SocketAddr = std::env::var("DLOCK_METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9898".into())
        .parse()?;
    // Seconds to serve: the first argument or DLOCK_EXAMPLE_SECONDS; none = until Ctrl-C.
    let seconds: Option<u64> = match std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_EXAMPLE_SECONDS").ok())
    {
        Some(s) => Some(s.parse()?),
        None => None,
    };
    let dir = tempfile::tempdir()?;
    let (url, _held) = serve(addr, dir.path()).await?;
    println!("dlock metrics at {url}");
    match seconds {
        Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
        None => tokio::signal::ctrl_c().await?,
    }
    Ok(())
}

/// Installs the exporter's HTTP listener on `addr`, runs [`workload`] on a SQLite store in
/// `dir`, and returns the URL to scrape with the guard the workload keeps (one hold stays open
/// while the metrics are served).
pub async fn serve(addr: SocketAddr, dir: &Path) -> Result<(String, Guard), BoxError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    let held = workload(dir).await?;
    Ok((format!("http://{addr}/metrics"), held))
}

/// A few acquisitions by two clients of one SQLite store, so that every kind of metric moves.
pub async fn workload(dir: &Path) -> Result<Guard, BoxError> {
    let url = format!("sqlite://{}", dir.join("locks.db").display());
    let a = dlock::connect(&url).await?;
    let b = dlock::connect(&url).await?;

    // Granted at once, then refused to another client's try_acquire.
    let guard = a.mutex("jobs/nightly")?.acquire().await?;
    let refused = b.mutex("jobs/nightly")?.try_acquire().await;
    assert!(matches!(refused, Err(ref e) if e.is_not_granted()));
    // Timed out while held.
    let timed_out = b
        .mutex("jobs/nightly")?
        .acquire_timeout(Duration::from_millis(100))
        .await;
    assert!(matches!(timed_out, Err(ref e) if e.is_not_granted()));

    // Contended: b waits (dlock_waiters is 1) until a releases.
    let waiter = {
        let m = b.mutex("jobs/nightly")?;
        tokio::spawn(async move { m.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.release().await?;
    waiter.await??.release().await?;

    // Lost: a forced unlock breaks a hold; its next renewal finds it gone.
    let doomed = a
        .mutex("jobs/doomed")?
        .lease(Duration::from_millis(600))
        .acquire()
        .await?;
    b.force_release("jobs/doomed", Force::Break).await?;
    let lost = tokio::time::timeout(Duration::from_secs(5), doomed.lost()).await;
    println!(
        "jobs/doomed: {}",
        lost.map_or("not lost".into(), |e| e.to_string())
    );
    drop(doomed);

    // One hold stays open: dlock_holds is 1 while it is served.
    Ok(a.mutex("jobs/serving")?.acquire().await?)
}
