//! A `dlock run` short of memory (issue 22, `ulimit -v` low): whatever fails first (the
//! loader, the runtime, the store's threads, SQLite's allocations, the command's start), nothing
//! is left held: the next `dlock run` with enough memory gets the lock at once. A failure that
//! dlock's code sees is one `dlock:` line; three come before it can say anything: the dynamic
//! loader's (the binary cannot be mapped), a SIGSEGV when the stack cannot grow, and Rust's
//! allocation-failure abort ("memory allocation of N bytes failed"), which no stable Rust
//! program can turn into an error.

use std::process::Command;

#[test]
fn short_of_memory_nothing_is_left_held() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let dlock = env!("CARGO_BIN_EXE_dlock");
    let mut failed_at = Vec::new();
    // Address-space limits in KiB from too small to load the binary to enough for everything.
    let limits: Vec<u64> = (40_000..=124_000).step_by(2_000).collect();
    for &kb in &limits {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v {kb} && exec \"$0\" run --url \"$1\" --wait 2s mem/job -- true"
            ))
            .arg(dlock)
            .arg(&url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            failed_at.push(kb);
            let ours: Vec<&str> = stderr.lines().filter(|l| l.starts_with("dlock:")).collect();
            let segv = std::os::unix::process::ExitStatusExt::signal(&o.status) == Some(11);
            let before_dlock = stderr.contains("error while loading shared libraries")
                || stderr.contains("memory allocation of")
                || (segv && stderr.is_empty());
            assert!(
                ours.len() == 1 || (ours.is_empty() && before_dlock),
                "ulimit -v {kb}: {o:?}"
            );
            assert!(!stderr.contains("panicked"), "ulimit -v {kb}: {stderr}");
        }
        let next = Command::new(dlock)
            .args(["run", "--url", &url, "--no-wait", "mem/job", "--", "true"])
            .output()
            .unwrap();
        assert!(
            next.status.success(),
            "after ulimit -v {kb} ({:?}: {stderr}) the lock was left held: {next:?}",
            o.status.code()
        );
    }
    // Both sides are covered: limits too small to run, and enough to run.
    assert_eq!(failed_at.first(), limits.first(), "{failed_at:?}");
    assert!(failed_at.last() < limits.last(), "{failed_at:?}");
}
