//! A `dlock run` short of file descriptors (issue 22, `ulimit -n` low): whatever it runs out
//! of first (the runtime, the store's files, the command's start), it exits with one line saying
//! why, and leaves nothing held: the next `dlock run` with enough descriptors gets the lock at
//! once.

use std::process::Command;

#[test]
fn short_of_file_descriptors_nothing_is_left_held() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let dlock = env!("CARGO_BIN_EXE_dlock");
    let mut failed_at = Vec::new();
    // From too few for the runtime to enough for everything: every limit in between fails at
    // a different step.
    for n in 8..=28 {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {n} && exec \"$0\" run --url \"$1\" --wait 3s fd/job -- true"
            ))
            .arg(dlock)
            .arg(&url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            failed_at.push(n);
            let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("dlock:")).collect();
            assert_eq!(lines.len(), 1, "ulimit -n {n}: {o:?}");
        }
        // Nothing held: a well-supplied dlock takes the lock without waiting.
        let next = Command::new(dlock)
            .args(["run", "--url", &url, "--no-wait", "fd/job", "--", "true"])
            .output()
            .unwrap();
        assert!(
            next.status.success(),
            "after ulimit -n {n} ({:?}: {stderr}) the lock was left held: {next:?}",
            o.status.code()
        );
    }
    // The range covers both sides: limits too low to run, and enough to run.
    assert!(failed_at.first() == Some(&8), "{failed_at:?}");
    assert!(failed_at.last() < Some(&28), "{failed_at:?}");
}
