//! A private PostgreSQL or MariaDB server.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::util::{run_ok, tail};
use crate::{alive, children, signal};

/// How long a start (including retries while the old server's processes go away) may take.
const START_LIMIT: Duration = Duration::from_secs(30);
/// How long initializing a data directory may take.
const INIT_LIMIT: Duration = Duration::from_secs(120);
/// How long a clean stop may take before the server is killed.
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// How long one client call (`psql`, `mariadb`) may take.
const CLIENT_LIMIT: Duration = Duration::from_secs(15);

/// Which database server a [`SqlServer`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    /// PostgreSQL (`initdb` + `postgres` from [`pg_bin`]).
    Postgres,
    /// MariaDB (`mariadb-install-db` + `mariadbd` on `PATH`).
    MariaDb,
}

/// A private database server on a free loopback port, in its own temporary directory (data
/// directory `data/`, log `server.log`); stopped when dropped.
///
/// PostgreSQL trusts every local connection as `postgres`; MariaDB runs with
/// `--skip-grant-tables` (user `root`, no password). PostgreSQL refuses to run as root, so when
/// this process is root the server runs as the `postgres` OS user. Binaries: PostgreSQL's under
/// [`pg_bin`], MariaDB's `mariadb-install-db`/`mariadbd` on `PATH`; a missing one is an error
/// saying so.
#[derive(Debug)]
pub struct SqlServer {
    /// The server kind.
    pub db: Db,
    /// The loopback port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// `(uid, gid)` to run PostgreSQL as (when this process is root).
    run_as: Option<(u32, u32)>,
    /// Client connections the server admits, when not its default (PostgreSQL 100, MariaDB 151).
    max_connections: Option<u32>,
}

/// The directory of PostgreSQL's server binaries: `DLOCK_TEST_PG_BIN` when set, else the newest
/// installed version under `/usr/lib/postgresql/*/bin`.
pub fn pg_bin() -> io::Result<PathBuf> {
    if let Some(d) = std::env::var_os("DLOCK_TEST_PG_BIN") {
        return Ok(PathBuf::from(d));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).ok_or_else(|| {
        io::Error::other(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin \
             (install postgresql; scripts/test.sh does), nor DLOCK_TEST_PG_BIN set",
        )
    })
}

/// The uid and gid of the OS user `postgres`.
fn postgres_user() -> io::Result<(u32, u32)> {
    match nix::unistd::User::from_name("postgres") {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
        Ok(None) => Err(io::Error::other(
            "no OS user \"postgres\": PostgreSQL cannot run as root and needs it \
             (installing postgresql creates it)",
        )),
        Err(e) => Err(io::Error::other(format!(
            "cannot look up the OS user \"postgres\": {e}"
        ))),
    }
}

impl SqlServer {
    /// Initializes a data directory and starts the server on a free loopback port; waits (at most
    /// 30 s) until it accepts connections.
    pub fn start(db: Db) -> io::Result<SqlServer> {
        let run_as = if db == Db::Postgres && nix::unistd::geteuid().is_root() {
            Some(postgres_user()?)
        } else {
            None
        };
        let dir = crate::util::server_dir(
            match db {
                Db::Postgres => "dlock-postgres-",
                Db::MariaDb => "dlock-mariadb-",
            },
            &format!("{db:?}"),
        )?;
        let mut s = SqlServer {
            db,
            port: crate::free_port()?,
            dir,
            child: None,
            run_as,
            max_connections: None,
        };
        s.init()?;
        s.spawn()?;
        Ok(s)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The server's temporary directory (data directory `data/`, log `server.log`, socket).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The pid of the server process (PostgreSQL: the postmaster) this handle started, until
    /// [`SqlServer::crash`] or [`SqlServer::stop`].
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// MariaDB's own temp dir (`--tmpdir`), so servers of parallel tests never share `/tmp`
    /// temporary tables (a bootstrap once failed with "Could not remove temporary table").
    fn mariadb_tmpdir(&self) -> io::Result<String> {
        let d = self.dir.path().join("tmp");
        std::fs::create_dir_all(&d)?;
        Ok(format!("--tmpdir={}", d.display()))
    }

    fn as_owner(&self, cmd: &mut Command) {
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
    }

    fn init(&mut self) -> io::Result<()> {
        let mut cmd = match self.db {
            Db::Postgres => {
                if let Some((uid, gid)) = self.run_as {
                    nix::unistd::chown(
                        self.dir.path(),
                        Some(nix::unistd::Uid::from_raw(uid)),
                        Some(nix::unistd::Gid::from_raw(gid)),
                    )
                    .map_err(|e| {
                        io::Error::other(format!(
                            "chown of the PostgreSQL temp dir {} to postgres failed: {e}",
                            self.dir.path().display()
                        ))
                    })?;
                }
                let mut cmd = Command::new(pg_bin()?.join("initdb"));
                cmd.arg("-D")
                    .arg(self.data())
                    .args(["-A", "trust", "-U", "postgres", "--no-sync"]);
                self.as_owner(&mut cmd);
                cmd
            }
            Db::MariaDb => {
                let mut cmd = Command::new("mariadb-install-db");
                cmd.arg("--no-defaults")
                    .arg(format!("--datadir={}", self.data().display()))
                    .args(["--user=root", "--auth-root-authentication-method=normal"])
                    .arg(self.mariadb_tmpdir()?);
                cmd
            }
        };
        let what = match self.db {
            Db::Postgres => "initdb (scripts/test.sh installs postgresql)",
            Db::MariaDb => "mariadb-install-db (scripts/test.sh installs mariadb-server)",
        };
        run_ok(&mut cmd, INIT_LIMIT, what).map(|_| ())
    }

    /// How many times the log says the server is ready.
    fn readiness(&self) -> usize {
        let text = std::fs::read(self.log()).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let mark = match self.db {
            Db::Postgres => "database system is ready to accept connections",
            Db::MariaDb => "ready for connections",
        };
        text.matches(mark).count()
    }

    fn start_failed(&self, why: &str) -> io::Error {
        io::Error::other(format!(
            "{:?} on port {} {why}; log {}:\n{}",
            self.db,
            self.port,
            self.log().display(),
            tail(&self.log(), 40)
        ))
    }

    /// Starts the server (again: same directory and port) and waits until it accepts
    /// connections. A start that fails (the old server's processes are still going away) is
    /// retried, for at most 30 s in all. Does nothing when it is already running (a server that
    /// exited on its own, or was killed through its pid, is started again).
    pub fn spawn(&mut self) -> io::Result<()> {
        if let Some(c) = &mut self.child {
            if !matches!(c.try_wait(), Ok(Some(_))) {
                return Ok(());
            }
            self.child = None;
        }
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let before = self.readiness();
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.log())?;
            let mut cmd = match self.db {
                Db::Postgres => {
                    let mut c = Command::new(pg_bin()?.join("postgres"));
                    c.arg("-D")
                        .arg(self.data())
                        .args(["-p", &self.port.to_string(), "-k"])
                        .arg(self.dir.path())
                        .args(["-c", "listen_addresses=127.0.0.1"]);
                    if let Some(n) = self.max_connections {
                        c.args(["-c", &format!("max_connections={n}")]);
                    }
                    self.as_owner(&mut c);
                    c
                }
                Db::MariaDb => {
                    let mut c = Command::new("mariadbd");
                    c.arg("--no-defaults")
                        .arg(format!("--datadir={}", self.data().display()))
                        .arg(format!("--port={}", self.port))
                        .arg("--bind-address=127.0.0.1")
                        .arg(format!(
                            "--socket={}",
                            self.dir.path().join("sock").display()
                        ))
                        .args(["--user=root", "--skip-grant-tables"])
                        .arg(self.mariadb_tmpdir()?);
                    if let Some(n) = self.max_connections {
                        c.arg(format!("--max-connections={n}"));
                    }
                    c
                }
            };
            let mut child = cmd
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .map_err(|e| io::Error::other(format!("cannot start {:?}: {e}", self.db)))?;
            loop {
                if self.readiness() > before
                    && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                {
                    self.child = Some(child);
                    return Ok(());
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break; // it gave up: try again
                }
                if Instant::now() >= deadline {
                    self.child = Some(child);
                    self.crash();
                    return Err(self.start_failed(&format!("did not start within {START_LIMIT:?}")));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if Instant::now() >= deadline {
                return Err(self.start_failed(&format!(
                    "exited at every start attempt for {START_LIMIT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL to the server and every process it started (by pid): nothing is flushed that was
    /// not already. Returns once they are all gone (or after 10 s).
    pub fn crash(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let kids = children(c.id());
        let _ = c.kill();
        for k in &kids {
            let _ = signal(*k, Signal::SIGKILL);
        }
        let _ = c.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while kids.iter().any(|k| alive(*k)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Crash and start again on the same directory and port; returns how long the server was
    /// gone (from the kill until it accepts connections again).
    pub fn restart(&mut self) -> io::Result<Duration> {
        let t = Instant::now();
        self.crash();
        self.spawn()?;
        Ok(t.elapsed())
    }

    /// Admit `n` client connections from now on, restarts included (on the command line, so it
    /// overrides `ALTER SYSTEM`): restarts the server.
    pub fn set_max_connections(&mut self, n: u32) -> io::Result<()> {
        self.max_connections = Some(n);
        self.restart().map(|_| ())
    }

    /// A clean stop (so PostgreSQL leaves no shared memory behind): PostgreSQL gets SIGINT (its
    /// fast shutdown), MariaDB SIGTERM; SIGKILL after 10 s.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let sig = match self.db {
            Db::Postgres => Signal::SIGINT,
            Db::MariaDb => Signal::SIGTERM, // mariadbd ignores SIGINT
        };
        let _ = signal(c.id(), sig);
        let deadline = Instant::now() + STOP_LIMIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(c);
        self.crash();
    }

    /// The dlock URL of the server with table `dlock_faults` and `extra` appended to the query
    /// (e.g. `"&mode=session"`): `postgres://postgres@127.0.0.1:P/postgres?table=dlock_faults…`
    /// or `mysql://root@127.0.0.1:P/test?table=dlock_faults…`.
    pub fn url(&self, extra: &str) -> String {
        format!("{}?table=dlock_faults{extra}", self.base_url())
    }

    /// The server's URL without a query: `postgres://postgres@127.0.0.1:P/postgres` or
    /// `mysql://root@127.0.0.1:P/test`.
    pub fn base_url(&self) -> String {
        match self.db {
            Db::Postgres => format!("postgres://postgres@127.0.0.1:{}/postgres", self.port),
            Db::MariaDb => format!("mysql://root@127.0.0.1:{}/test", self.port),
        }
    }

    /// Closes every client connection of the server except the one asking; returns how many were
    /// closed. PostgreSQL: `pg_terminate_backend` of every client backend (through `psql`);
    /// MariaDB: `KILL CONNECTION` of every client thread in the process list (through `mariadb`).
    pub fn kill_client_connections(&self) -> io::Result<usize> {
        match self.db {
            Db::Postgres => {
                // The FILTER runs only on the rows the subquery kept (never on our own backend).
                let sql = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM \
                           (SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' \
                           AND pid <> pg_backend_pid() OFFSET 0) AS others";
                let out = run_ok(
                    self.psql().args(["-c", sql]),
                    CLIENT_LIMIT,
                    "psql (terminating client backends)",
                )?;
                out.parse().map_err(|_| {
                    io::Error::other(format!("psql: unexpected answer {out:?} to {sql}"))
                })
            }
            Db::MariaDb => {
                let sql = "SELECT ID FROM information_schema.PROCESSLIST \
                           WHERE ID <> CONNECTION_ID() AND COMMAND NOT IN ('Daemon', 'Killed') \
                           AND USER NOT IN ('system user', 'event_scheduler')";
                let ids = run_ok(
                    self.mariadb().args(["-e", sql]),
                    CLIENT_LIMIT,
                    "mariadb (listing connections)",
                )?;
                let ids: Vec<&str> = ids.split_whitespace().collect();
                if ids.is_empty() {
                    return Ok(0);
                }
                let kill: String = ids
                    .iter()
                    .map(|i| format!("KILL CONNECTION {i};"))
                    .collect();
                // --force: go on after a connection that ended on its own meanwhile (an error
                // per such connection on stderr).
                let out = crate::util::run_bounded(
                    self.mariadb().args(["--force", "-e", &kill]),
                    CLIENT_LIMIT,
                    "mariadb (killing connections)",
                )?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                let failed = stderr.lines().filter(|l| l.starts_with("ERROR")).count();
                if failed > 0 && !stderr.contains("Unknown thread id") {
                    return Err(io::Error::other(format!(
                        "mariadb: KILL CONNECTION failed: {}",
                        stderr.trim()
                    )));
                }
                Ok(ids.len().saturating_sub(failed))
            }
        }
    }

    fn psql(&self) -> Command {
        let mut c = Command::new("psql");
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-X", "-A", "-t", "-q"])
            .args(["-v", "ON_ERROR_STOP=1"])
            .env("PGCONNECT_TIMEOUT", "5");
        c
    }

    fn mariadb(&self) -> Command {
        let mut c = Command::new("mariadb");
        c.arg("--no-defaults")
            .args(["-h", "127.0.0.1", "-P", &self.port.to_string()])
            .args(["-u", "root", "-N", "-B", "--connect-timeout=5"]);
        c
    }
}

impl Drop for SqlServer {
    fn drop(&mut self) {
        self.stop();
    }
}
