//! Cross-process wake-ups for the SQLite store. After every commit that may let a waiter in (a
//! release, a cancelled queue place, a force-release) the backend writes one byte to `<db>-wake`,
//! a small file next to the database; a file-system watch on the database's directory (inotify on
//! Linux, kqueue or FSEvents elsewhere, through the `notify` crate) reports that write to the
//! waiters of every process, which then attempt instead of polling. The write comes after the
//! commit, so the report never arrives before the change is visible (the `-wal` writes of a
//! commit would: they precede its fsync and the WAL index update that publishes it). Other
//! commits (grants, renewals) wake nobody. One watch per database file per process, shared by
//! every backend opened on it. If the watch or the file cannot be set up (no inotify instances
//! left, an unsupported file system) the store polls as before.

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use tokio::sync::watch;

/// The watch of one database file: its value is `true` while the watch is up, and every write to
/// the wake file is sent (as `true` again) so that receivers' `changed()` fires.
pub(crate) struct FileWatch {
    changed: Arc<watch::Sender<bool>>,
    _watcher: Option<RecommendedWatcher>,
    /// `<db>-wake`, written after every commit that may let a waiter in.
    wake_file: Option<std::fs::File>,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch")
            .field("up", &*self.changed.borrow())
            .finish()
    }
}

impl FileWatch {
    /// Whether changes by other processes are being watched.
    pub(crate) fn is_up(&self) -> bool {
        *self.changed.borrow()
    }

    /// A receiver whose `changed()` fires on every write to the wake file.
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.changed.subscribe()
    }

    /// Tells the waiters of every process that a commit that may let them in is visible now.
    pub(crate) fn poke(&self) {
        if let Some(f) = &self.wake_file {
            #[cfg(unix)]
            let r = std::os::unix::fs::FileExt::write_at(f, b"w", 0).map(drop);
            #[cfg(not(unix))]
            let r = f.set_len(0);
            if let Err(e) = r {
                tracing::debug!(error = %e, "sqlite: could not write the wake file");
            }
        }
    }

    fn start(db: &Path) -> FileWatch {
        let changed = Arc::new(watch::channel(false).0);
        let wake_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(wake_path(db));
        let (watcher, wake_file) = match wake_file {
            Ok(f) => match watch_dir(db, changed.clone()) {
                Ok(w) => {
                    changed.send_replace(true);
                    (Some(w), Some(f))
                }
                Err(e) => {
                    tracing::debug!(path = %db.display(), error = %e, "sqlite: no file watch; waiters poll");
                    (None, Some(f))
                }
            },
            Err(e) => {
                tracing::debug!(path = %db.display(), error = %e, "sqlite: no wake file; waiters poll");
                (None, None)
            }
        };
        FileWatch {
            changed,
            _watcher: watcher,
            wake_file,
        }
    }
}

/// notify's inotify watcher panics instead of failing when its event thread could not start
/// (out of memory, or the process or cgroup at its thread limit), and panics again while that
/// panic unwinds (an abort). A thread like its own (the default stack) is tried first, so that
/// case falls back to polling.
fn watch_dir(db: &Path, changed: Arc<watch::Sender<bool>>) -> notify::Result<RecommendedWatcher> {
    let probe = std::thread::Builder::new()
        .name("dlock-sqlite-probe".into())
        .spawn(|| {})
        .and_then(|t| {
            t.join()
                .map_err(|_| std::io::Error::other("probe thread panicked"))
        });
    if let Err(e) = probe {
        return Err(notify::Error::io(e));
    }
    start_watch(db, changed)
}

fn start_watch(db: &Path, changed: Arc<watch::Sender<bool>>) -> notify::Result<RecommendedWatcher> {
    let dir = db
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let wake = wake_path(db)
        .file_name()
        .map(OsString::from)
        .unwrap_or_default();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        if !matches!(ev.kind, EventKind::Modify(_) | EventKind::Create(_)) {
            return;
        }
        if ev
            .paths
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == wake))
        {
            changed.send_replace(true);
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// `<db>-wake`, next to the database.
pub(crate) fn wake_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wake");
    PathBuf::from(p)
}

/// The watch of the database at canonical path `key`, started on first use and shared while any
/// backend of this process uses it.
pub(crate) fn file_watch_for(key: &Path) -> Arc<FileWatch> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Weak<FileWatch>>>> = OnceLock::new();
    let mut map = R
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(w) = map.get(key).and_then(Weak::upgrade) {
        return w;
    }
    map.retain(|_, w| w.strong_count() > 0);
    let w = Arc::new(FileWatch::start(key));
    map.insert(key.to_path_buf(), Arc::downgrade(&w));
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_poke_from_another_process_is_seen_and_other_commits_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("w.db");
        let mut conn = wal_connection(&db, "CREATE TABLE t (x INTEGER)").await;
        let key = std::fs::canonicalize(&db).unwrap();
        let w = file_watch_for(&key);
        assert!(w.is_up(), "no file watch on {}", db.display());
        let mut rx = w.subscribe();
        rx.borrow_and_update();
        // A commit that is not a release (a grant, a renewal) wakes nobody.
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut conn)
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), rx.changed())
                .await
                .is_err(),
            "a change was reported for a commit that was not a release"
        );
        // A poke from another process's watch (its own instance, not this registry's).
        let other = FileWatch::start(&key);
        other.poke();
        tokio::time::timeout(Duration::from_secs(2), rx.changed())
            .await
            .expect("a poke of the wake file was not reported")
            .unwrap();
        assert!(wake_path(&key).exists());
        // The same registry entry is shared while alive.
        let again = file_watch_for(&key);
        assert!(Arc::ptr_eq(&w, &again));
    }

    /// A WAL-mode connection to `db` that has run `sql`.
    async fn wal_connection(db: &Path, sql: &str) -> sqlx::SqliteConnection {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
        use sqlx::ConnectOptions;
        let mut c = SqliteConnectOptions::new()
            .filename(db)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .connect()
            .await
            .unwrap();
        sqlx::query(sql).execute(&mut c).await.unwrap();
        c
    }
}
