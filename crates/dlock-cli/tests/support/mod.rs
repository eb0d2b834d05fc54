//! What the CLI tests share: running `dlock` as a real process with a bounded wait, and
//! stopping whatever a failed test leaves behind.

#![allow(dead_code)] // each test file uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `dlock` binary of this package.
pub const BIN: &str = env!("CARGO_BIN_EXE_dlock");

/// The result of one finished `dlock` invocation.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// A `dlock` command with a clean environment for the store (no `DLOCK_URL`, default logging).
pub fn dlock(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).env_remove("DLOCK_URL").env_remove("RUST_LOG");
    c
}

/// A process the test started; stopped when dropped if still running.
pub struct Proc {
    pub child: Child,
    pub out: PathBuf,
    pub err: PathBuf,
    pub started: Instant,
}

impl Proc {
    pub fn spawn(mut cmd: Command, dir: &Path) -> Proc {
        let tag = format!("{:?}", Instant::now()).replace(|c: char| !c.is_alphanumeric(), "");
        let out = dir.join(format!("out-{tag}"));
        let err = dir.join(format!("err-{tag}"));
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"));
        let started = Instant::now();
        let child = cmd.spawn().expect("spawn dlock");
        Proc {
            child,
            out,
            err,
            started,
        }
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid(), sig).expect("kill");
    }

    /// Waits at most `timeout` for the process to end.
    pub fn wait(mut self, timeout: Duration) -> Out {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            if Instant::now() >= deadline {
                let stderr = std::fs::read_to_string(&self.err).unwrap_or_default();
                panic!("dlock did not finish within {timeout:?}; stderr so far: {stderr}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        Out {
            code: status.code(),
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
            elapsed,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first so dlock stops its command too, then SIGKILL.
            let _ = nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to completion (at most `timeout`).
pub fn exec(cmd: Command, dir: &Path, timeout: Duration) -> Out {
    Proc::spawn(cmd, dir).wait(timeout)
}

pub fn wait_for_file(p: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if p.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
