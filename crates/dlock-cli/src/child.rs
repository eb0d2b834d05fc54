//! The command of `dlock run`, tied to the lock.
//!
//! - It runs in a **process group of its own**, so every signal dlock sends it (passed on, or on
//!   loss of the lock) reaches what it started too (`sh -c 'worker & wait'`), and a signal sent
//!   to dlock's group (as `timeout(1)` sends it) reaches it once, through dlock.
//! - It **dies with dlock**: the kernel sends it SIGKILL when dlock dies (Linux
//!   `PR_SET_PDEATHSIG`, set in the child before `exec`; it fires when the thread that forked it
//!   ends, so the command is always spawned from the main thread, which lives as long as dlock),
//!   and a small sentinel process (`dlock reap-group`, in a group of its own) kills the rest of
//!   the command's group when dlock's end of a pipe closes without a word, which is what happens
//!   when dlock is killed.
//! - It **does not outlive the lock when dlock freezes**: dlock tells the sentinel every 100 ms
//!   until when its hold is still trusted (a time of the machine's monotonic clock, so that a
//!   word read late does not stretch it); a dlock that is stopped (SIGSTOP) or frozen stops
//!   telling, and the sentinel kills the group when the last trust runs out, which is before the
//!   store may grant the lock to anyone else. The sentinel starts with the trust of the hold at
//!   the command's start, so a dlock stopped before its first word is covered too; only a dlock
//!   stopped between starting the command and forking the sentinel (a fork's time) is not.
//! - When dlock is the foreground job of a terminal, the command's group gets the terminal while
//!   it runs (as a shell gives it to a job): Ctrl-C and Ctrl-\ reach the command directly, once,
//!   and Ctrl-Z stops it; dlock then stops too, so the shell sees the job stopped, and `fg`
//!   continues both.

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::io::{self, Write as _};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

/// The controlling terminal, when dlock had its foreground.
struct Tty {
    fd: OwnedFd,
    /// dlock's own process group.
    own: Pid,
}

/// The running command.
pub struct Child {
    /// Its pid, which is also its process group id.
    pid: Pid,
    tty: Option<Tty>,
    /// dlock ignores SIGTTOU while the command has the terminal (and did not before).
    restore_sigttou: bool,
    /// dlock's end of the sentinel's pipe (see [`reap_group`] for what dlock says on it).
    sentinel: Option<OwnedFd>,
    sigchld: tokio::signal::unix::Signal,
    exit: Option<Exit>,
}

/// The terminal whose foreground process group dlock is in, if any.
fn foreground_tty() -> Option<Tty> {
    let fd = nix::fcntl::open(
        "/dev/tty",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NOCTTY,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    // SAFETY: `open` just returned this descriptor; nothing else owns it.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let own = nix::unistd::getpgrp();
    (nix::unistd::tcgetpgrp(fd.as_fd()).ok()? == own).then_some(Tty { fd, own })
}

/// Makes `group` the terminal's foreground group. dlock may be in the background when it does
/// (taking the terminal back), where the kernel would stop it with SIGTTOU: dlock ignores that
/// signal while a command has its terminal (the command gets the default back before `exec`).
fn give_terminal(tty: &Tty, group: Pid) {
    if let Err(e) = nix::unistd::tcsetpgrp(tty.fd.as_fd(), group) {
        tracing::debug!(error = %e, %group, "cannot hand over the terminal");
    }
}

/// Ignores SIGTTOU (`true`) or restores its default; answers whether it was ignored before.
fn ignore_sigttou(ignore: bool) -> bool {
    let how = if ignore {
        nix::sys::signal::SigHandler::SigIgn
    } else {
        nix::sys::signal::SigHandler::SigDfl
    };
    // SAFETY: sets a disposition (ignore or default); no handler code runs.
    let old = unsafe { nix::sys::signal::signal(Signal::SIGTTOU, how) };
    matches!(old, Ok(nix::sys::signal::SigHandler::SigIgn))
}

impl Child {
    /// Starts `program` with `args` and the extra `env`, in a process group of its own, tied to
    /// dlock's life (see the module docs), with the hold trusted for `trusted` from now. Call
    /// from the main thread.
    pub fn spawn(
        program: &OsString,
        args: &[OsString],
        env: &[(&str, Option<String>)],
        trusted: Duration,
    ) -> io::Result<Child> {
        // Taken before the command starts, so the sentinel's first deadline is never later
        // than the trust of the hold when the command began.
        let until = monotonic_now().map(|n| n + trusted);
        // The parent-death signal follows the forking thread: only the main thread lives as
        // long as dlock.
        #[cfg(target_os = "linux")]
        if nix::unistd::gettid() != nix::unistd::getpid() {
            return Err(io::Error::other(
                "the command must be started from dlock's main thread",
            ));
        }
        // Subscribed before the command exists, so its SIGCHLD is never missed.
        let sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        become_subreaper();
        let tty = foreground_tty();
        // The command gets SIGTTOU's default back unless dlock was started with it ignored.
        let restore_sigttou = tty.is_some() && !ignore_sigttou(true);
        #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
        let parent = std::process::id() as libc::pid_t;
        let tty_fd = tty.as_ref().map_or(-1, |t| t.fd.as_raw_fd());
        let mut cmd = std::process::Command::new(program);
        cmd.args(args);
        for (k, v) in env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (setpgid, signal, sigprocmask, tcsetpgrp, prctl, getppid,
        // kill, getpid).
        unsafe {
            cmd.pre_exec(move || {
                libc::setpgid(0, 0);
                // Inherited from dlock, which ignores it while a command has the terminal.
                if restore_sigttou {
                    libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                }
                if tty_fd >= 0 {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, libc::SIGTTOU);
                    let mut old: libc::sigset_t = std::mem::zeroed();
                    libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
                    libc::tcsetpgrp(tty_fd, libc::getpid());
                    libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                }
                #[cfg(target_os = "linux")]
                {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // dlock died before the line above: nothing would kill us later.
                    if libc::getppid() != parent {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                }
                Ok(())
            });
        }
        let std_child = cmd.spawn()?;
        let pid = Pid::from_raw(std_child.id() as i32);
        // The same from this side: whichever runs first, the group and the terminal are set
        // before either process relies on them.
        let _ = nix::unistd::setpgid(pid, pid);
        if let Some(t) = &tty {
            give_terminal(t, pid);
        }
        // The command is reaped here (waitpid), not by std's handle.
        drop(std_child);
        let sentinel = match spawn_sentinel(pid, until) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the process that stops the command's group if dlock dies; the command itself still dies with dlock");
                None
            }
        };
        Ok(Child {
            pid,
            tty,
            restore_sigttou,
            sentinel,
            sigchld,
            exit: None,
        })
    }

    /// Whether the command's group has the terminal (it then got the terminal's own signals).
    pub fn has_terminal(&self) -> bool {
        self.tty
            .as_ref()
            .is_some_and(|t| nix::unistd::tcgetpgrp(t.fd.as_fd()).ok() == Some(self.pid))
    }

    /// Sends `sig` to the command's whole process group.
    pub fn signal_group(&self, sig: Signal) {
        match kill(Pid::from_raw(-self.pid.as_raw()), sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                tracing::debug!(pid = %self.pid, ?sig, error = %e, "cannot signal the command's group")
            }
        }
    }

    /// Whether any process of the command's group is still there.
    pub fn group_alive(&self) -> bool {
        reap_others(self.pid);
        !matches!(
            kill(Pid::from_raw(-self.pid.as_raw()), None),
            Err(Errno::ESRCH)
        )
    }

    /// Waits until the command exits (cancel-safe: call again after a `select!` chose another
    /// branch). A command stopped from the terminal (Ctrl-Z) stops dlock too.
    pub async fn wait(&mut self) -> io::Result<Exit> {
        if let Some(e) = self.exit {
            return Ok(e);
        }
        loop {
            // Any child: the command, or an orphan of it that dlock (the subreaper) inherited.
            let flags = WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED;
            match waitpid(None, Some(flags)) {
                Ok(WaitStatus::Exited(p, code)) if p == self.pid => {
                    return Ok(self.exited(Exit::Code(code)))
                }
                Ok(WaitStatus::Signaled(p, sig, _)) if p == self.pid => {
                    return Ok(self.exited(Exit::Signal(sig as i32)))
                }
                Ok(WaitStatus::Stopped(p, _)) if p == self.pid => self.stopped(),
                Ok(WaitStatus::StillAlive) => {
                    self.sigchld.recv().await;
                }
                Ok(_) => {}
                Err(Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e)),
            }
        }
    }

    fn exited(&mut self, e: Exit) -> Exit {
        self.exit = Some(e);
        // The leader is gone: the terminal comes back to dlock's group (if the command had it).
        if let Some(t) = &self.tty {
            if nix::unistd::tcgetpgrp(t.fd.as_fd()).ok() == Some(self.pid) {
                give_terminal(t, t.own);
            }
        }
        e
    }

    /// The command stopped. If it had the terminal (Ctrl-Z), dlock takes the terminal back for
    /// its group and stops as well, so the shell sees its job stopped; once continued (`fg`,
    /// `bg`), it gives the terminal back if it is in the foreground again and continues the
    /// command. A command stopped by someone else (SIGSTOP) is left to them.
    fn stopped(&mut self) {
        let Some(t) = &self.tty else { return };
        if nix::unistd::tcgetpgrp(t.fd.as_fd()).ok() != Some(self.pid) {
            return;
        }
        give_terminal(t, t.own);
        let _ = kill(Pid::this(), Signal::SIGSTOP);
        // Continued.
        if nix::unistd::tcgetpgrp(t.fd.as_fd()).ok() == Some(t.own) {
            give_terminal(t, self.pid);
        }
        self.signal_group(Signal::SIGCONT);
    }

    /// After the command exited: the processes it left in its group are told to stop
    /// (SIGTERM, then SIGKILL after `kill_after`), and dlock waits until they are gone, so
    /// nothing the command started runs on after the lock is released. Members already dying
    /// (a signal reached the whole group) get a moment first. Returns how many rounds of
    /// signals were needed (0: nothing was left).
    pub async fn end_group(&self, kill_after: Duration) -> u32 {
        let gone_within = |d: Duration| async move {
            let deadline = Instant::now() + d;
            while self.group_alive() {
                if Instant::now() >= deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            true
        };
        if gone_within(Duration::from_millis(200)).await {
            return 0;
        }
        self.signal_group(Signal::SIGTERM);
        self.signal_group(Signal::SIGCONT);
        if gone_within(kill_after).await {
            return 1;
        }
        self.signal_group(Signal::SIGKILL);
        gone_within(Duration::from_secs(5)).await;
        2
    }

    fn tell(&self, word: &str) {
        if let Some(fd) = &self.sentinel {
            // A full pipe means the sentinel is behind; the next word will do.
            let _ = nix::unistd::write(fd, word.as_bytes());
        }
    }

    /// The hold is trusted for `v` from now: unless told again within `v`, the sentinel kills
    /// the command's group (dlock is stopped or frozen, and cannot stop it itself before the
    /// store may grant the lock to someone else). The word carries the end as a time of the
    /// machine's monotonic clock, not a span: a sentinel that reads it late (still starting, or
    /// starved of CPU) must not move the end later by its own delay.
    pub fn trust_for(&self, v: Duration) {
        if let Some(now) = monotonic_now() {
            self.tell(&format!("U{}\n", (now + v).as_micros()));
        }
    }

    /// dlock stops the command itself (the lock was lost): the sentinel no longer watches the
    /// time, only dlock's death.
    pub fn stand_down(&self) {
        self.tell("L\n");
    }

    /// dlock is done with the command (it exited and its group is empty): the sentinel leaves
    /// without killing anything.
    pub fn finish(mut self) {
        self.tell("done\n");
        self.sentinel = None;
        if self.restore_sigttou {
            ignore_sigttou(false);
        }
    }
}

/// Reaps the children of dlock that are not the command (orphans of the command that dlock, as
/// their subreaper, inherited; the sentinel), so they do not linger as zombies.
fn reap_others(command: Pid) {
    loop {
        // Children of the command's group only: the command itself is reaped by `wait`.
        match waitpid(Pid::from_raw(-command.as_raw()), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, _) | WaitStatus::Signaled(p, _, _)) if p != command => {}
            _ => return,
        }
    }
}

/// Makes dlock the subreaper of everything the command starts (Linux): an orphan of the
/// command is re-parented to dlock instead of init, so dlock can reap it.
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    {
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
}

/// Starts the sentinel: `dlock reap-group PGID --until µs`, reading a pipe whose write end only
/// dlock holds. Its first deadline comes with it, not as a word: a dlock stopped before its first
/// word must not leave the command unwatched.
fn spawn_sentinel(group: Pid, until: Option<Duration>) -> io::Result<OwnedFd> {
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // `/proc/self/exe` is dlock's own binary even if its file was replaced since it started.
    let exe = if cfg!(target_os = "linux") {
        std::path::PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe()?
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("reap-group").arg(group.as_raw().to_string());
    if let Some(u) = until {
        cmd.arg("--until").arg(u.as_micros().to_string());
    }
    cmd.stdin(std::process::Stdio::from(rd))
        .stdout(std::process::Stdio::null())
        .process_group(0);
    let child = cmd.spawn()?;
    // Reaped by init once dlock exits; it never outlives dlock by more than a kill.
    drop(child);
    Ok(wr)
}

/// The machine's monotonic clock (CLOCK_MONOTONIC, the same for every process), from its zero.
fn monotonic_now() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .ok()
        .map(Duration::from)
}

/// `dlock reap-group PGID [--until µs]`: the sentinel. `until` is its first deadline (as `U`
/// below); without it, it watches only for dlock's death until the first `U`. It reads what dlock
/// says on its stdin, one word per line: `U<µs>` (the hold is trusted until that time of the
/// machine's monotonic clock: if no later word comes by then, dlock is stopped or frozen, and the
/// group is killed), `L` (the lock was lost and dlock stops the command itself: no more
/// deadline), `done` (leave, killing nothing). If stdin closes without `done`, dlock died, and
/// every process left in group PGID is killed. A kill is reported on stderr with its reason and
/// the time of the machine's monotonic clock. Ignores the signals a terminal or a supervisor
/// sends to a group, so only dlock's words decide.
pub fn reap_group(pgid: i32, until: Option<u64>) -> i32 {
    let job_control = [
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
        Signal::SIGPIPE,
    ];
    for sig in crate::signals::FORWARDED.into_iter().chain(job_control) {
        // SAFETY: sets the disposition to "ignore"; no handler code runs.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
    if pgid <= 1 {
        return crate::exit::USAGE;
    }
    // On the monotonic clock (see `monotonic_now`).
    let mut deadline: Option<Duration> = until.map(Duration::from_micros);
    let mut line = Vec::new();
    let mut buf = [0u8; 256];
    let why = loop {
        if let Some(d) = deadline {
            let Some(now) = monotonic_now() else {
                break "the sentinel could not read the clock";
            };
            if now >= d {
                break "dlock did not vouch for the hold in time (stopped, or starved of CPU)";
            }
            // Rounded up, so that the wake is not before the deadline.
            let ms = (d - now).as_micros().div_ceil(1000);
            let ms = u16::try_from(ms).unwrap_or(u16::MAX);
            let fd = stdin_fd();
            let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
                Ok(0) | Err(Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => break "the sentinel could not watch dlock",
            }
        }
        // Unbuffered, so that `poll` sees every byte not yet read.
        let n = match nix::unistd::read(stdin_fd().as_raw_fd(), &mut buf) {
            Ok(0) => break "dlock ended while its command ran",
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(_) => break "the sentinel could not watch dlock",
        };
        for &b in &buf[..n] {
            if b != b'\n' {
                line.push(b);
                continue;
            }
            match line.as_slice() {
                b"done" => return 0,
                b"L" => deadline = None,
                [b'U', us @ ..] => {
                    if let Some(us) = std::str::from_utf8(us).ok().and_then(|u| u.parse().ok()) {
                        deadline = Some(Duration::from_micros(us));
                    }
                }
                _ => {}
            }
            line.clear();
        }
    };
    if kill(Pid::from_raw(-pgid), Signal::SIGKILL).is_err() {
        // Nobody was left in the group.
        return 0;
    }
    // The monotonic stamp lines the kill up with `journalctl -o short-monotonic` and with the
    // clocks of other processes on the machine. The fault harness's worker (dlock-chaos
    // `sentinel_kill`) reads this line by its reason text and stamp; run_safety pins both.
    let at = monotonic_now()
        .map(|t| format!(" [monotonic {}.{:06}]", t.as_secs(), t.subsec_micros()))
        .unwrap_or_default();
    // Not eprintln!: a reader that went away must not make the sentinel panic.
    let _ = writeln!(
        std::io::stderr(),
        "dlock: {why}: killed the command's process group before its lease could end{at}"
    );
    0
}

/// The sentinel's stdin, borrowed for `poll`.
fn stdin_fd() -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: descriptor 0 stays open for the sentinel's whole life (it only reads it).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(0) }
}
