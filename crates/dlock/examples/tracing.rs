//! Prints dlock's spans (see docs/METRICS.md, "Traces") with `tracing-subscriber`, on the
//! embedded SQLite store in a temporary directory: an acquisition, a contended one, renewals, a
//! release and a hold lost to a forced unlock. Exits by itself in about two seconds.
//!
//! ```text
//! cargo run -p dlock-rs --example tracing
//! RUST_LOG=dlock=trace cargo run -p dlock-rs --example tracing
//! ```

use dlock::Force;
use std::time::Duration;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("dlock=debug")),
        )
        .with_span_events(FmtSpan::CLOSE)
        .init();

    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let a = dlock::connect(&url).await?;
    let b = dlock::connect(&url).await?;

    // dlock.acquire (waited, token), then dlock.renew rounds: a 600 ms lease renews every 200 ms.
    let lease = Duration::from_millis(600);
    let guard = a.mutex("jobs/nightly")?.lease(lease).acquire().await?;
    let waiter = {
        let m = b.mutex("jobs/nightly")?.lease(lease);
        tokio::spawn(async move { m.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // dlock.release (held); the waiter's dlock.acquire closes with its wait.
    guard.release().await?;
    let second = waiter.await??;

    // dlock.lost: a forced unlock breaks the hold; its next renewal finds it gone.
    a.force_release("jobs/nightly", Force::Break).await?;
    let lost = tokio::time::timeout(Duration::from_secs(5), second.lost()).await;
    println!(
        "lost() answered: {}",
        lost.map_or("nothing".into(), |e| e.to_string())
    );
    drop(second);
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}
