//! A read-write lock around a cache: readers share it, a refresher takes it alone.
//!
//! The cache is a file (`cache.txt` in a temporary directory) of lines `version=N key=value`
//! that the refresher rewrites in place, slowly, line by line: a reader that read it half-way
//! through a refresh would see two versions mixed. Four readers (each its own client, as separate
//! processes would be) read it under the *read* lock of `caches/prices`, so they read at the
//! same time; the refresher rewrites it under the *write* lock, which waits for the readers to
//! let go and keeps them out while it writes. The example asserts that no reader ever saw a mixed
//! file, that no reader held the lock while the refresher did, and that readers did share it.
//!
//! Runs on the embedded SQLite store in a temporary directory, no set-up:
//!
//! ```sh
//! cargo run -p dlock-rs --example rwlock_cache
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const READERS: usize = 4;
const REFRESHES: u32 = 3;
const KEYS: usize = 5;

/// What the tasks record, to check the lock's promises afterwards.
#[derive(Default)]
struct Seen {
    readers_now: AtomicUsize,
    most_readers: AtomicUsize,
    writing: AtomicBool,
    reads: AtomicUsize,
}

async fn refresh(path: &Path, version: u32) -> std::io::Result<()> {
    // Line by line, with a pause between lines: not atomic on purpose.
    let mut text = String::new();
    for k in 0..KEYS {
        text.push_str(&format!(
            "version={version} key{k}={}\n",
            version * 100 + k as u32
        ));
        tokio::fs::write(path, &text).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Reads the cache and returns its version; panics on a file with two versions in it.
async fn read(path: &Path) -> std::io::Result<u32> {
    let text = tokio::fs::read_to_string(path).await?;
    let versions: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        versions.len(),
        KEYS,
        "a reader saw a half-written cache:\n{text}"
    );
    assert!(
        versions.windows(2).all(|w| w[0] == w[1]),
        "a reader saw two versions mixed:\n{text}"
    );
    Ok(versions[0]
        .trim_start_matches("version=")
        .parse()
        .unwrap_or_default())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let cache: PathBuf = dir.path().join("cache.txt");
    println!("store: {url}");
    refresh(&cache, 0).await?;
    let seen = Arc::new(Seen::default());
    let done = Arc::new(AtomicBool::new(false));

    let mut readers = Vec::new();
    for r in 0..READERS {
        let client = dlock::connect(&url).await?;
        let (cache, seen, done) = (cache.clone(), seen.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let lock = client.rwlock("caches/prices")?;
            let mut last = 0;
            while !done.load(Ordering::SeqCst) {
                let guard = lock.read().await?;
                let now = seen.readers_now.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most_readers.fetch_max(now, Ordering::SeqCst);
                assert!(
                    !seen.writing.load(Ordering::SeqCst),
                    "a reader next to the writer"
                );
                let version = read(&cache)
                    .await
                    .map_err(|e| dlock::Error::Backend(Box::new(e)))?;
                if version != last {
                    println!("reader {r} sees version {version}");
                    last = version;
                }
                seen.reads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                seen.readers_now.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<(), dlock::Error>(())
        }));
    }

    let refresher = dlock::connect(&url).await?;
    let lock = refresher.rwlock("caches/prices")?;
    for version in 1..=REFRESHES {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let guard = lock.write().await?;
        seen.writing.store(true, Ordering::SeqCst);
        assert_eq!(
            seen.readers_now.load(Ordering::SeqCst),
            0,
            "the writer next to a reader"
        );
        println!(
            "refresher writes version {version} (token {:?})",
            guard.token()
        );
        refresh(&cache, version).await?;
        seen.writing.store(false, Ordering::SeqCst);
        guard.release().await?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    done.store(true, Ordering::SeqCst);
    for r in readers {
        r.await??;
    }

    let most = seen.most_readers.load(Ordering::SeqCst);
    let reads = seen.reads.load(Ordering::SeqCst);
    println!("{reads} reads, at most {most} readers at once, {REFRESHES} refreshes");
    assert!(most >= 2, "readers share the lock");
    assert_eq!(read(&cache).await?, REFRESHES);
    println!("ok: readers shared the cache and never saw a refresh half-way");
    Ok(())
}
