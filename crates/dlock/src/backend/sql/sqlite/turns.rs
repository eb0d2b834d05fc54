//! Turns between processes on a contended lock of the SQLite store.
//!
//! A release wakes the releasing process's next waiter at once (the core's in-process wake-up),
//! while the other processes' waiters learn of it through the file watch and a look: the local
//! waiter nearly always takes the lock first, so one process can keep a contended lock for long
//! runs while the others' waiters wait. Here a process that has been granted a lock without a
//! break for [`TURN`] while a waiter of another process waits for it stands back once: its next
//! waiting attempt waits [`STAND_BACK`] first, which lets the other process's waiter in.
//!
//! Which names other processes wait for is read from record locks on the wake file: while an
//! acquisition of this process waits for a name on the store (after a refusal), the process holds
//! a shared `fcntl` lock on one byte of `<db>-wake` chosen by the name's hash; a test for a
//! conflicting lock on that byte (`F_GETLK`) reports other processes' locks only. A hash collision
//! only makes a process stand back once for nothing. The wake file stays open for as long as the
//! process uses the database (POSIX record locks end when any descriptor of the file is closed):
//! nothing else in the process opens it.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a process may keep a lock that another process's waiter waits for.
pub(crate) const TURN: Duration = Duration::from_millis(20);
/// How long its next waiting attempt then waits: about two hand-offs to another process.
pub(crate) const STAND_BACK: Duration = Duration::from_millis(2);

/// The most names whose runs are kept; beyond it the oldest half is dropped.
const MAX_RUNS: usize = 4096;

/// The turn-taking state of one database file in this process.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes of the wake file locked shared, by offset: how many waiting acquisitions of this
    /// process want a name of that byte.
    waiting: HashMap<i64, usize>,
    /// Per name: the last token granted in this process, and since when the grants of the name
    /// in this process have followed one another without a grant elsewhere between them.
    runs: HashMap<String, (u64, Instant)>,
}

/// The byte of the wake file for `name`.
fn slot(name: &str) -> i64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    // Past the byte the wake-ups write, within what every platform's `off_t` holds.
    1 + i64::try_from(h.finish() % (1 << 30)).unwrap_or(0)
}

impl Turns {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `name` as waited for by this process (until [`Turns::done_waiting`]).
    pub(crate) fn waiting(&self, file: &std::fs::File, name: &str) {
        let at = slot(name);
        let mut s = self.state();
        let n = s.waiting.entry(at).or_insert(0);
        *n += 1;
        if *n == 1 {
            record_lock(file, at, true);
        }
    }

    /// Ends one [`Turns::waiting`] of `name`.
    pub(crate) fn done_waiting(&self, file: &std::fs::File, name: &str) {
        let at = slot(name);
        let mut s = self.state();
        if let Some(n) = s.waiting.get_mut(&at) {
            *n -= 1;
            if *n == 0 {
                s.waiting.remove(&at);
                record_lock(file, at, false);
            }
        }
    }

    /// Records a grant of `name` with `token` in this process.
    pub(crate) fn granted(&self, name: &str, token: u64) {
        let now = Instant::now();
        let mut s = self.state();
        if s.runs.len() >= MAX_RUNS && !s.runs.contains_key(name) {
            let mut since: Vec<Instant> = s.runs.values().map(|r| r.1).collect();
            since.sort_unstable();
            let cut = since[since.len() / 2];
            s.runs.retain(|_, r| r.1 > cut);
        }
        match s.runs.get_mut(name) {
            Some(run) if run.0.checked_add(1) == Some(token) => run.0 = token,
            Some(run) => *run = (token, now),
            None => {
                s.runs.insert(name.to_owned(), (token, now));
            }
        }
    }

    /// Whether this process's next waiting attempt of `name` should wait [`STAND_BACK`] first:
    /// its grants of the name have followed one another for [`TURN`] and another process waits
    /// for it. A `true` starts the next turn.
    pub(crate) fn stand_back(&self, file: &std::fs::File, name: &str) -> bool {
        let now = Instant::now();
        let mut s = self.state();
        let Some(run) = s.runs.get_mut(name) else {
            return false;
        };
        if now.duration_since(run.1) < TURN || !others_wait(file, slot(name)) {
            return false;
        }
        run.1 = now;
        true
    }
}

/// Takes (`shared`) or drops this process's shared record lock on byte `at` of `file`.
#[cfg(unix)]
fn record_lock(file: &std::fs::File, at: i64, shared: bool) {
    use std::os::fd::AsRawFd;
    let kind = if shared {
        nix::libc::F_RDLCK
    } else {
        nix::libc::F_UNLCK
    };
    let fl = flock(kind, at);
    if let Err(e) = nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_SETLK(&fl)) {
        tracing::debug!(error = %e, "sqlite: could not mark a waited-for name");
    }
}

#[cfg(not(unix))]
fn record_lock(_: &std::fs::File, _: i64, _: bool) {}

/// Whether another process holds a record lock on byte `at` of `file`.
#[cfg(unix)]
fn others_wait(file: &std::fs::File, at: i64) -> bool {
    use std::os::fd::AsRawFd;
    let mut fl = flock(nix::libc::F_WRLCK, at);
    match nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut fl)) {
        Ok(_) => i32::from(fl.l_type) != nix::libc::F_UNLCK,
        Err(_) => false,
    }
}

#[cfg(not(unix))]
fn others_wait(_: &std::fs::File, _: i64) -> bool {
    false
}

/// A record lock of `kind` on the one byte at `at`.
#[cfg(unix)]
fn flock(kind: i32, at: i64) -> nix::libc::flock {
    // SAFETY: `flock` is a plain C struct of integers; all-zero is a valid value of it.
    let mut fl: nix::libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = nix::libc::SEEK_SET as _;
    fl.l_start = at as _;
    fl.l_len = 1;
    fl
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::path::Path;

    /// The file a child process marks (set: it runs as the child of the test below).
    const CHILD_FILE: &str = "DLOCK_SQLITE_TEST_TURNS_FILE";

    fn open(path: &Path) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    /// Runs only as the child process of `another_process_waiting_is_seen_and_its_own_is_not`:
    /// marks "wanted" as waited for, says so with `<file>.ready`, and keeps the mark until
    /// `<file>.done` exists.
    #[test]
    fn child_marks_a_name() {
        let Some(path) = std::env::var_os(CHILD_FILE) else {
            return;
        };
        let path = std::path::PathBuf::from(path);
        let file = open(&path);
        let turns = Turns::default();
        turns.waiting(&file, "wanted");
        std::fs::write(path.with_extension("ready"), b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !path.with_extension("done").exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        turns.done_waiting(&file, "wanted");
    }

    /// A process stands back once a turn for a name another process waits for, and never for
    /// its own waiters or for a name nobody else waits for.
    #[test]
    fn another_process_waiting_is_seen_and_its_own_is_not() {
        if std::env::var_os(CHILD_FILE).is_some() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db-wake");
        let file = open(&path);
        let turns = Turns::default();
        // Grants without a break for a turn; this process's own mark does not count.
        turns.granted("wanted", 7);
        turns.granted("other", 3);
        turns.waiting(&file, "wanted");
        std::thread::sleep(TURN + Duration::from_millis(5));
        turns.granted("wanted", 8);
        turns.granted("other", 4);
        assert!(!turns.stand_back(&file, "wanted"));
        turns.done_waiting(&file, "wanted");

        let exe = std::env::current_exe().unwrap();
        let worker = format!(
            "{}::child_marks_a_name",
            module_path!().trim_start_matches("dlock::")
        );
        let mut child = std::process::Command::new(exe)
            .args([worker.as_str(), "--exact", "--test-threads=1"])
            .env(CHILD_FILE, &path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !path.with_extension("ready").exists() {
            assert!(Instant::now() < deadline, "the child did not mark the name");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(others_wait(&file, slot("wanted")));
        assert!(!turns.stand_back(&file, "other"));
        // Once a turn, not at every attempt.
        assert!(turns.stand_back(&file, "wanted"));
        assert!(!turns.stand_back(&file, "wanted"));
        std::thread::sleep(TURN + Duration::from_millis(5));
        // A grant elsewhere in between (a token skipped) starts a new run.
        turns.granted("wanted", 10);
        assert!(!turns.stand_back(&file, "wanted"));
        std::fs::write(path.with_extension("done"), b"").unwrap();
        assert!(child.wait().unwrap().success());
        assert!(!others_wait(&file, slot("wanted")));
    }

    #[test]
    fn runs_are_bounded() {
        let turns = Turns::default();
        for i in 0..(MAX_RUNS as u64 * 2) {
            turns.granted(&format!("n{i}"), i);
        }
        assert!(turns.state().runs.len() <= MAX_RUNS);
    }
}
