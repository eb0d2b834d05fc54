//! Leader election: one leader at a time, followers that see its value, and a hand-over.
//!
//! Three candidates (each its own client, as three service instances would be) campaign in the
//! election `services/scheduler`, each publishing its address as the leader's value. One wins;
//! the others wait in their campaign. A follower (a fourth client that only observes, like a
//! load balancer) sees the leader and its value, then the new value the leader proclaims. The
//! leader steps down ([`Leadership::resign`](dlock::Leadership::resign)); a waiting candidate
//! takes over at once with a larger term (the term is a fencing token), and the follower sees the
//! new leader. The example asserts one leader at a time, growing terms and what the follower saw.
//!
//! Runs on the embedded SQLite store in a temporary directory, no set-up:
//!
//! ```sh
//! cargo run -p dlock-rs --example leader_election
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const CANDIDATES: usize = 3;
const TERMS: usize = 2;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    println!("store: {url}");

    // The follower: prints every change of leader or value.
    let watcher = dlock::connect(&url).await?;
    let mut observer = watcher.election("services/scheduler")?.observe();
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let follower = tokio::spawn(async move {
        loop {
            let leader = observer.next().await?;
            match &leader {
                Some(l) => println!(
                    "follower: the leader is {:?} (term {:?})",
                    l.value.as_deref().unwrap_or("-"),
                    l.term
                ),
                None => println!("follower: nobody leads"),
            }
            if seen_tx.send(leader).is_err() {
                return Ok::<(), dlock::Error>(());
            }
        }
    });
    // Nobody leads yet.
    assert_eq!(seen_rx.recv().await.ok_or("follower ended")?, None);

    // The candidates: each campaigns, leads until it has proclaimed a new value, then resigns.
    // At most TERMS candidates win a term; the rest give up when the example ends.
    let leading = Arc::new(AtomicUsize::new(0));
    let most_leading = Arc::new(AtomicUsize::new(0));
    let (term_tx, mut term_rx) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for c in 0..CANDIDATES {
        let client = dlock::connect(&url).await?;
        let (leading, most_leading, term_tx) =
            (leading.clone(), most_leading.clone(), term_tx.clone());
        candidates.push(tokio::spawn(async move {
            let election = client.election("services/scheduler")?;
            let address = format!("10.0.0.{}:8080", c + 1);
            let leadership = election.campaign(address.clone()).await?;
            let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
            most_leading.fetch_max(now, Ordering::SeqCst);
            println!("candidate {c}: leads, term {:?}", leadership.term());
            tokio::time::sleep(Duration::from_millis(200)).await;
            let moved = format!("10.0.0.{}:9090", c + 1);
            leadership.proclaim(moved.clone()).await?;
            println!("candidate {c}: proclaims {moved}");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let term = leadership.term();
            leading.fetch_sub(1, Ordering::SeqCst);
            println!("candidate {c}: steps down");
            leadership.resign().await?;
            let _ = term_tx.send((c, term, address, moved));
            Ok::<(), dlock::Error>(())
        }));
    }

    let mut last_term = None;
    for _ in 0..TERMS {
        let (c, term, address, moved) = term_rx.recv().await.ok_or("a candidate failed")?;
        assert!(term > last_term, "terms grow: {term:?} after {last_term:?}");
        last_term = term;
        // What the follower saw during that term: the leader with its first value, then its
        // proclaimed one (it may also have seen nobody lead between two terms).
        let mut values = Vec::new();
        while values.last() != Some(&moved) {
            let seen = tokio::time::timeout(Duration::from_secs(5), seen_rx.recv())
                .await?
                .ok_or("follower ended")?;
            if let Some(l) = seen {
                if l.term == term {
                    values.push(l.value.unwrap_or_default());
                }
            }
        }
        assert_eq!(values.first(), Some(&address), "candidate {c}: {values:?}");
        println!("term {term:?}: candidate {c}, the follower saw {values:?}");
    }
    for c in candidates {
        c.abort();
    }
    assert_eq!(
        most_leading.load(Ordering::SeqCst),
        1,
        "one leader at a time"
    );
    follower.abort();
    println!("ok: {TERMS} terms, one leader at a time, the follower saw each hand-over");
    Ok(())
}
