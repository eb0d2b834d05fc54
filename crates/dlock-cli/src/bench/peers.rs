//! The peers that run in processes of their own language: redis-py's `Lock` and kazoo's `Lock`
//! (`peers/peer.py`, run with `python3`) and Apache Curator's `InterProcessMutex`
//! (`peers/CuratorPeer.java`, compiled at bench time against Debian's jars in /usr/share/java
//! and run with `java`). Both files are embedded in the binary and written to a temporary
//! directory of the run, so `dlock bench` finds them from any directory, and nothing is left
//! behind. A peer that cannot run on this machine (no python3 module, no JDK, no jars) is a line
//! of the report saying why; installing them is `scripts/bench.sh`'s job.
//!
//! Each peer process speaks the protocol of `dlock bench-worker` for C1/H1 (`ready`, `go START
//! END`, one JSON line of records, in CLOCK_REALTIME ns), so its rows are aggregated by the same
//! code as dlock's; for U1 it answers `pairs K` with K acquire + release latencies timed in the
//! peer process, which lets the bench interleave them with the raw floor as for the other libs.

use super::store::{limit, Kind, Target};
use super::workloads::Lib;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const PEER_PY: &str = include_str!("peers/peer.py");
const CURATOR_JAVA: &str = include_str!("peers/CuratorPeer.java");

/// Where Debian installs Java libraries.
const JARS: &str = "/usr/share/java";

/// Curator's jars and what they need (Debian's names; all required).
const CURATOR_JARS: &[&str] = &[
    "curator-client",
    "curator-framework",
    "curator-recipes",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
];

/// Jars added when present: slf4j-nop silences the client's logging.
const OPTIONAL_JARS: &[&str] = &["slf4j-nop", "failureaccess"];

/// The lease the bench gives redis-py's locks: rslock's (neither renews).
const REDIS_PY_LEASE: Duration = super::worker::RSLOCK_TTL;

/// The session timeout of a `zk://` URL as dlock asks for it (`session_timeout`, default 10 s):
/// kazoo's and Curator's session timeout, their "lease".
fn zk_session(t: &Target) -> Duration {
    t.option("session_timeout")
        .and_then(|v| humantime::parse_duration(v.trim()).ok())
        .unwrap_or(Duration::from_secs(10))
}

/// The chroot of a `zk://` URL (`""` for none).
fn zk_chroot(t: &Target) -> String {
    let rest = &t.url[t.url.find("://").map(|i| i + 3).unwrap_or(0)..];
    let path = rest.split('?').next().unwrap_or("");
    let path = path.find('/').map(|i| &path[i..]).unwrap_or("");
    super::store::pct_decode(path.trim_end_matches('/'))
}

/// One peer ready to run on one store: how to start its processes.
#[derive(Debug, Clone)]
pub struct Ext {
    /// The library.
    pub lib: Lib,
    program: String,
    /// The arguments before the mode (`peer.py LIB`, `-cp CP CuratorPeer`).
    lead: Vec<String>,
    /// A `redis://` URL or a ZooKeeper connect string.
    conn: String,
    lease_ms: u64,
    /// ZooKeeper: names are lock nodes under this chroot (as dlock's store lays them out).
    chroot: Option<String>,
    /// ZooKeeper lock nodes used, deleted by `cleanup`.
    used: Arc<Mutex<Vec<String>>>,
}

impl Ext {
    /// The key (Redis) or lock node path (ZooKeeper) of a lock name.
    pub fn lock_name(&self, name: &str) -> String {
        match &self.chroot {
            Some(root) => {
                let p = format!("{root}/{}", dlock::backend::zookeeper::escape_name(name));
                self.used
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(p.clone());
                p
            }
            None => name.to_string(),
        }
    }

    /// The connect string of a peer process in `mode`: on ZooKeeper, U1 goes through the first
    /// server only, as dlock's and the raw floor's U1 sessions do (`Target::u1_target`).
    fn conn_for(&self, mode: &str) -> &str {
        match (&self.chroot, mode) {
            (Some(_), "u1") => self.conn.split(',').next().unwrap_or(&self.conn),
            _ => &self.conn,
        }
    }

    /// A peer process in `mode` (`u1`, `worker`) on the lock `name` (and `warm`), stdin and
    /// stdout piped, its errors on ours.
    pub fn command(&self, mode: &str, name: &str, warm: Option<&str>) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.program);
        c.args(&self.lead)
            .arg(mode)
            .args(["--conn", self.conn_for(mode)])
            .args(["--lease-ms", &self.lease_ms.to_string()])
            .args(["--name", &self.lock_name(name)]);
        if let Some(w) = warm {
            c.args(["--warm", &self.lock_name(w)]);
        }
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        c
    }

    /// Deletes the lock nodes the ZooKeeper peers used (kazoo leaves them, persistent).
    pub async fn cleanup(&self, t: &Target) {
        let paths: Vec<String> =
            std::mem::take(&mut *self.used.lock().unwrap_or_else(|p| p.into_inner()));
        if self.chroot.is_none() || paths.is_empty() {
            return;
        }
        let hosts: Vec<String> = t.servers.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        let Ok(client) = limit(
            "zookeeper session",
            Duration::from_secs(10),
            zookeeper_client::Client::connect(&hosts.join(",")),
        )
        .await
        else {
            return;
        };
        let mut paths = paths;
        paths.sort();
        paths.dedup();
        for p in paths {
            let _ = limit("delete", Duration::from_secs(5), client.delete(&p, None)).await;
        }
    }
}

/// A peer process of U1: asked for blocks of acquire + release pairs.
pub struct U1Proc {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    lib: Lib,
}

impl U1Proc {
    /// Starts the peer on the lock `name` and waits until it is connected.
    pub async fn start(ext: &Ext, name: &str) -> Result<U1Proc, String> {
        let mut child = ext
            .command("u1", name, None)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", ext.program))?;
        let stdout = child.stdout.take().ok_or("peer without stdout")?;
        let stdin = child.stdin.take().ok_or("peer without stdin")?;
        let mut p = U1Proc {
            child,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
            lib: ext.lib,
        };
        match p.line(Duration::from_secs(60)).await? {
            l if l.trim() == "ready" => Ok(p),
            l => Err(format!("{} did not start: {l}", ext.lib.name())),
        }
    }

    async fn line(&mut self, d: Duration) -> Result<String, String> {
        let who = self.lib.name();
        match tokio::time::timeout(d, self.lines.next_line()).await {
            Ok(Ok(Some(l))) => Ok(l),
            Ok(Ok(None)) => Err(format!("{who} ended (see its error above)")),
            Ok(Err(e)) => Err(format!("{who}: {e}")),
            Err(_) => Err(format!("{who}: no answer within {d:?}")),
        }
    }

    /// `k` acquire + release pairs, each one's latency in µs as the peer timed it.
    pub async fn pairs(&mut self, k: usize) -> Result<Vec<f64>, String> {
        let who = self.lib.name();
        self.stdin
            .write_all(format!("pairs {k}\n").as_bytes())
            .await
            .map_err(|e| format!("{who} went away: {e}"))?;
        self.stdin.flush().await.map_err(|e| e.to_string())?;
        let l = self.line(Duration::from_secs(30 + 10 * k as u64)).await?;
        let mut w = l.split_whitespace();
        if w.next() != Some("ok") {
            return Err(format!("{who}: {}", l.trim_start_matches("err ")));
        }
        let v: Vec<f64> = w.filter_map(|x| x.parse().ok()).collect();
        if v.len() != k {
            return Err(format!("{who}: bad answer {l:?}"));
        }
        Ok(v)
    }

    /// Lets the peer end (it closes its client), killing it if it does not.
    pub async fn quit(mut self) {
        let _ = self.stdin.write_all(b"quit\n").await;
        let _ = self.stdin.flush().await;
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The peers' files and runtimes for one `dlock bench` run: found once, used on every store.
pub struct Peers {
    /// The run's directory for the script and the compiled classes (removed on drop).
    dir: PathBuf,
    /// Each Python peer's version, or why it cannot run.
    python: BTreeMap<&'static str, Result<String, String>>,
    /// Curator's classpath and version, or why it cannot run.
    curator: Option<Result<(String, String), String>>,
}

impl Drop for Peers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The output of a short command (`program args`), stdout on success, else a reason.
async fn output(program: &str, args: &[String], secs: u64) -> Result<String, String> {
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let o = match tokio::time::timeout(Duration::from_secs(secs), run).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("no {program} on PATH"))
        }
        Ok(Err(e)) => return Err(format!("cannot run {program}: {e}")),
        Err(_) => return Err(format!("{program} did not answer within {secs} s")),
    };
    if o.status.success() {
        return Ok(String::from_utf8_lossy(&o.stdout).trim().to_string());
    }
    // A traceback ends with its message, javac begins with it.
    let err = String::from_utf8_lossy(&o.stderr);
    let said: Vec<&str> = err
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    Err(match said.as_slice() {
        [] => format!("{program} failed ({})", o.status),
        [one] => one.to_string(),
        [first, .., last] => format!("{first} … {last}"),
    })
}

impl Peers {
    /// Nothing found yet: each runtime is looked at when a store first needs it.
    pub fn new(run: &str) -> Peers {
        Peers {
            dir: std::env::temp_dir().join(format!("dlock-bench-peers-{run}")),
            python: BTreeMap::new(),
            curator: None,
        }
    }

    /// Writes one embedded file into the run's directory.
    fn write(&self, file: &str, text: &str) -> Result<PathBuf, String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let p = self.dir.join(file);
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        Ok(p)
    }

    /// `python3 peer.py LIB` and the library's version, or why not.
    async fn python(&mut self, lib: &'static str) -> Result<(String, Vec<String>), String> {
        let script = self.dir.join("peer.py");
        if !script.exists() {
            self.write("peer.py", PEER_PY)?;
        }
        let lead = vec![script.display().to_string(), lib.to_string()];
        if !self.python.contains_key(lib) {
            let mut args = lead.clone();
            args.push("version".into());
            let (module, pip) = match lib {
                "kazoo" => ("kazoo", "'kazoo>=2.10,<3'"),
                _ => ("redis", "'redis>=5,<6'"),
            };
            let found = output("python3", &args, 60).await.map_err(|e| {
                format!(
                    "{e} (the Python module {module}: `python3 -m pip install {pip}`; \
                     scripts/bench.sh installs it)"
                )
            });
            self.python.insert(lib, found);
        }
        match &self.python[lib] {
            Ok(_) => Ok(("python3".into(), lead)),
            Err(e) => Err(e.clone()),
        }
    }

    /// Compiles the Curator peer once: the `java` arguments before the mode, or why not.
    async fn curator(&mut self) -> Result<(String, Vec<String>), String> {
        if self.curator.is_none() {
            let found = self.compile_curator().await;
            self.curator = Some(found);
        }
        match &self.curator {
            Some(Ok((cp, _))) => Ok((
                "java".into(),
                vec!["-cp".into(), cp.clone(), "CuratorPeer".into()],
            )),
            Some(Err(e)) => Err(e.clone()),
            None => Err("not compiled".into()),
        }
    }

    async fn compile_curator(&self) -> Result<(String, String), String> {
        let install = "apt-get install libcurator-recipes-java libcurator-framework-java \
                       default-jdk-headless; scripts/bench.sh installs them";
        let mut cp = Vec::new();
        for j in CURATOR_JARS {
            let p = format!("{JARS}/{j}.jar");
            if !std::path::Path::new(&p).exists() {
                return Err(format!("{p} is missing ({install})"));
            }
            cp.push(p);
        }
        for j in OPTIONAL_JARS {
            let p = format!("{JARS}/{j}.jar");
            if std::path::Path::new(&p).exists() {
                cp.push(p);
            }
        }
        let src = self.write("CuratorPeer.java", CURATOR_JAVA)?;
        let classes = self.dir.join("classes");
        let cp = cp.join(":");
        let javac = [
            "-nowarn".to_string(),
            "-cp".into(),
            cp.clone(),
            "-d".into(),
            classes.display().to_string(),
            src.display().to_string(),
        ];
        output("javac", &javac, 180)
            .await
            .map_err(|e| format!("cannot compile the Curator peer: {e} ({install})"))?;
        let cp = format!("{cp}:{}", classes.display());
        let runtime = output(
            "java",
            &[
                "-cp".into(),
                cp.clone(),
                "CuratorPeer".into(),
                "version".into(),
            ],
            60,
        )
        .await
        .map_err(|e| format!("cannot run the Curator peer: {e} ({install})"))?;
        // Debian links curator-recipes-VERSION.jar to curator-recipes.jar.
        let version = std::fs::read_dir(JARS)
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                let v = n.strip_prefix("curator-recipes-")?.strip_suffix(".jar")?;
                v.starts_with(|c: char| c.is_ascii_digit())
                    .then(|| v.to_string())
            })
            .max()
            .unwrap_or_else(|| "version unknown".into());
        Ok((cp, format!("{version} (Debian's jars; {runtime})")))
    }

    /// The peers that apply to `t`, each ready to run, and a line for each that cannot run
    /// (`peer X: not supported …` where the store is not the peer's, `peer X: not available …`
    /// where this machine lacks it).
    pub async fn for_target(&mut self, t: &Target) -> (Vec<Ext>, Vec<String>) {
        let (mut exts, mut lines) = (Vec::new(), Vec::new());
        match t.kind {
            Kind::Redis | Kind::RedisSentinel if t.replicas() > 0 => lines.push(format!(
                "peer redis-py: not supported with replicas={} (redis-py's Lock sends no WAIT: \
                 its figures are those of the row without +wait)",
                t.replicas()
            )),
            Kind::Redis | Kind::RedisSentinel => {
                let conn = match super::redis_ha::rslock_urls(t).await {
                    Ok(u) => u.into_iter().next().unwrap_or_default(),
                    Err(e) => {
                        lines.push(format!("peer redis-py: {e}"));
                        return (exts, lines);
                    }
                };
                match self.python("redis-py").await {
                    Ok((program, lead)) => exts.push(Ext {
                        lib: Lib::RedisPy,
                        program,
                        lead,
                        conn,
                        lease_ms: REDIS_PY_LEASE.as_millis() as u64,
                        chroot: None,
                        used: Arc::default(),
                    }),
                    Err(e) => lines.push(format!("peer redis-py: not available: {e}")),
                }
            }
            Kind::RedisCluster => lines.push(
                "peer redis-py: not supported on a Redis Cluster (the bench runs redis-py's \
                 single-server Lock, on one server as rslock's); dlock and the raw floor only"
                    .into(),
            ),
            Kind::Redlock => lines.push(
                "peer redis-py: not supported on Redlock (redis-py's Lock is a single-server \
                 lock, not a quorum of servers)"
                    .into(),
            ),
            Kind::Zk => {
                let conn: Vec<String> = t.servers.iter().map(|(h, p)| format!("{h}:{p}")).collect();
                let lease_ms = zk_session(t).as_millis() as u64;
                let chroot = Some(zk_chroot(t));
                let ext = |lib, (program, lead)| Ext {
                    lib,
                    program,
                    lead,
                    conn: conn.join(","),
                    lease_ms,
                    chroot: chroot.clone(),
                    used: Arc::default(),
                };
                match self.python("kazoo").await {
                    Ok(p) => exts.push(ext(Lib::Kazoo, p)),
                    Err(e) => lines.push(format!("peer kazoo: not available: {e}")),
                }
                match self.curator().await {
                    Ok(p) => exts.push(ext(Lib::Curator, p)),
                    Err(e) => lines.push(format!("peer curator: not available: {e}")),
                }
            }
            _ => {}
        }
        (exts, lines)
    }

    /// The versions of the peers that ran (for results.json's `versions`).
    pub fn versions(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .python
            .iter()
            .filter_map(|(lib, r)| Some((format!("{lib} (peer)"), r.as_ref().ok()?.clone())))
            .collect();
        if let Some(Ok((_, version))) = &self.curator {
            v.push(("Curator (peer)".into(), version.clone()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zk_paths_and_session() {
        let t = Target::parse("zk://h1:1,h2:2/a%20b/c/?session_timeout=2s").unwrap();
        assert_eq!(zk_chroot(&t), "/a b/c");
        assert_eq!(zk_session(&t), Duration::from_secs(2));
        let t = Target::parse("zk://h1:1").unwrap();
        assert_eq!(zk_chroot(&t), "");
        assert_eq!(zk_session(&t), Duration::from_secs(10));
        let ext = Ext {
            lib: Lib::Kazoo,
            program: "python3".into(),
            lead: Vec::new(),
            conn: "h1:1".into(),
            lease_ms: 10_000,
            chroot: Some("/x".into()),
            used: Arc::default(),
        };
        assert_eq!(ext.lock_name("a/b"), "/x/a%2Fb");
        assert_eq!(ext.used.lock().unwrap().len(), 1);
        // U1 through the first server, as dlock's and the floor's sessions; workers use all.
        let ext = Ext {
            conn: "h1:1,h2:2,h3:3".into(),
            ..ext
        };
        assert_eq!(ext.conn_for("u1"), "h1:1");
        assert_eq!(ext.conn_for("worker"), "h1:1,h2:2,h3:3");
    }
}
