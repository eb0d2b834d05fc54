//! A `dlock run` short of file descriptors (`ulimit -n`) or memory (`ulimit -v`) (issue 22):
//! whatever it runs out of first (the loader, the runtime, the store's files or threads,
//! SQLite's allocations, the command's start), it leaves nothing held: the next `dlock run`
//! with enough of everything gets the lock at once. A failure that dlock's code sees is one
//! `dlock:` line. Short of memory, four come before it can say anything: the dynamic loader's
//! (the binary or its first thread's TLS cannot be mapped), a SIGSEGV when the stack cannot
//! grow, Rust's allocation-failure abort ("memory allocation of N bytes failed"), and std's
//! panic in a thread it starts when it cannot map that thread's signal stack ("failed to
//! allocate an alternative stack", followed by that abort), which no stable Rust program can
//! turn into an error. One more panic may come beside dlock's line: sqlx-sqlite 0.8's copy of
//! a row's value does not check for the null that `sqlite3_value_dup` answers when SQLite
//! cannot allocate (a debug build's precondition check panics there, in the connection's
//! thread; sqlx-sqlite 0.9 returns an error instead).

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

/// Runs `dlock run --wait WAIT NAME -- true` on a fresh SQLite store under `ulimit -FLAG V` for
/// every value, checks each failure with `speechless` (a failure dlock's code could not report)
/// or else for one `dlock:` line, and that nothing is left held after each. Returns the values
/// at which the run failed.
fn under_limits(
    flag: &str,
    values: &[u64],
    wait: &str,
    speechless: fn(&Output) -> bool,
) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let dlock = env!("CARGO_BIN_EXE_dlock");
    let mut failed_at = Vec::new();
    for &v in values {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -{flag} {v} && exec \"$0\" run --url \"$1\" --wait {wait} limits/job -- true"
            ))
            .arg(dlock)
            .arg(&url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            failed_at.push(v);
            let ours = stderr.lines().filter(|l| l.starts_with("dlock:")).count();
            assert!(
                ours == 1 || (ours == 0 && speechless(&o)),
                "ulimit -{flag} {v}: {o:?}"
            );
            // No panic but std's own when it cannot map a new thread's signal stack, and
            // sqlx-sqlite 0.8's on a value SQLite could not copy (module docs).
            assert!(
                stderr
                    .lines()
                    .filter(|l| l.contains("panicked at"))
                    .all(|l| l.contains("/std/src/sys/pal/unix/stack_overflow.rs")
                        || (l.contains("/sqlx-sqlite-0.8.") && l.contains("/src/value.rs:"))),
                "ulimit -{flag} {v}: {stderr}"
            );
            // SQLite's own words do not name the cause; dlock's must.
            assert!(
                !stderr.contains("unable to open database file")
                    || flag != "n"
                    || stderr.contains("open-file limit"),
                "ulimit -{flag} {v}: {stderr}"
            );
        }
        // Nothing held: a well-supplied dlock takes the lock without waiting.
        let next = Command::new(dlock)
            .args([
                "run",
                "--url",
                &url,
                "--no-wait",
                "limits/job",
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert!(
            next.status.success(),
            "after ulimit -{flag} {v} ({:?}: {stderr}) the lock was left held: {next:?}",
            o.status.code()
        );
    }
    failed_at
}

#[test]
fn short_of_file_descriptors_nothing_is_left_held() {
    // From too few for the runtime to enough for everything: every limit in between fails at
    // a different step.
    let limits: Vec<u64> = (8..=28).collect();
    let failed_at = under_limits("n", &limits, "3s", |_| false);
    // The range covers both sides: limits too low to run, and enough to run.
    assert_eq!(failed_at.first(), limits.first(), "{failed_at:?}");
    assert!(failed_at.last() < limits.last(), "{failed_at:?}");
}

#[test]
fn short_of_memory_nothing_is_left_held() {
    // Address-space limits in KiB from too small to load the binary to barely enough (where a
    // run may still fail, as glibc reserves 64 MiB per thread's heap as threads start), then
    // plenty.
    let mut limits: Vec<u64> = (40_000..=124_000).step_by(2_000).collect();
    limits.push(1_000_000);
    let failed_at = under_limits("v", &limits, "2s", |o| {
        let stderr = String::from_utf8_lossy(&o.stderr);
        stderr.contains("error while loading shared libraries")
            || stderr.contains("cannot allocate TLS data structures")
            || stderr.contains("failed to register TLS destructor")
            || stderr.contains("memory allocation of")
            || (o.status.signal() == Some(11) && stderr.is_empty())
    });
    assert_eq!(failed_at.first(), limits.first(), "{failed_at:?}");
    assert!(failed_at.last() < limits.last(), "{failed_at:?}");
}
