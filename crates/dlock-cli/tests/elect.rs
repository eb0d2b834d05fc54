//! `dlock elect` on the embedded store: the command's status and environment, the leader's value
//! in `dlock list`, a lost term, and bad input. The standby/fail-over scenarios on every store are
//! in the conformance suite's process part (`elect_standby_takes_over`).

mod support;

use std::time::Duration;
use support::*;

const T: Duration = Duration::from_secs(20);

fn url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("locks.db").display())
}

#[test]
fn the_command_runs_with_the_term_and_its_status_is_dlocks() {
    let d = tempfile::tempdir().expect("a temp dir");
    let u = url(&d);
    let out = exec(
        dlock(&[
            "elect",
            "--url",
            &u,
            "--value",
            "a:1",
            "svc",
            "-c",
            "echo \"$DLOCK_NAME $DLOCK_TERM $DLOCK_TOKEN\"; exit 3",
        ]),
        d.path(),
        T,
    );
    assert_eq!(out.code, Some(3), "{out:?}");
    assert_eq!(out.stdout.trim(), "svc 1 1", "{out:?}");
    // Resigned: the next term is granted at once, with a greater term.
    let out = exec(
        dlock(&[
            "elect",
            "--url",
            &u,
            "svc",
            "--",
            "sh",
            "-c",
            "echo $DLOCK_TERM",
        ]),
        d.path(),
        T,
    );
    assert_eq!((out.code, out.stdout.trim()), (Some(0), "2"), "{out:?}");
}

#[test]
fn the_leaders_value_is_listed_and_a_revoked_term_is_lost() {
    let d = tempfile::tempdir().expect("a temp dir");
    let u = url(&d);
    let leader = Proc::spawn(
        dlock(&[
            "elect",
            "--url",
            &u,
            "--once",
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "--value",
            "10.0.0.7:8080",
            "svc",
            "--",
            "sleep",
            "30",
        ]),
        d.path(),
    );
    let started = std::time::Instant::now();
    let listed = loop {
        let out = exec(dlock(&["list", "--url", &u]), d.path(), T);
        if out.stdout.contains("10.0.0.7:8080") {
            break out;
        }
        assert!(started.elapsed() < T, "the leader never showed up: {out:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        listed
            .stdout
            .lines()
            .next()
            .is_some_and(|h| h.ends_with("VALUE")),
        "{listed:?}"
    );
    let json = exec(dlock(&["list", "--url", &u, "--json"]), d.path(), T);
    assert!(
        json.stdout.contains(r#""value":"10.0.0.7:8080""#),
        "{json:?}"
    );
    let unlock = exec(
        dlock(&["unlock", "--url", &u, "--force", "svc"]),
        d.path(),
        T,
    );
    assert_eq!(unlock.code, Some(0), "{unlock:?}");
    let out = leader.wait(T);
    assert_eq!(
        out.code,
        Some(76),
        "--once exits 76 on a lost term: {out:?}"
    );
    assert!(out.stderr.contains("stopping the command"), "{out:?}");
}

#[test]
fn bad_input_is_refused_before_anything_runs() {
    let d = tempfile::tempdir().expect("a temp dir");
    let u = url(&d);
    let marker = d.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let long = "x".repeat(4097);
    for (args, what) in [
        (
            vec!["elect", "--url", &u, "--value", &long, "svc", "-c", &touch],
            "a value over 4096 bytes",
        ),
        (
            vec!["elect", "--url", &u, "", "-c", &touch],
            "an empty name",
        ),
        (vec!["elect", "--url", &u, "svc"], "no command"),
        (
            vec!["elect", "--url", "nosuch://x", "svc", "-c", &touch],
            "an unknown store",
        ),
        (
            vec!["elect", "--url", &u, "--ttl", "10ms", "svc", "-c", &touch],
            "a term under 100 ms",
        ),
    ] {
        let out = exec(dlock(&args), d.path(), T);
        assert_eq!(out.code, Some(64), "{what}: {out:?}");
        assert!(!out.stderr.trim().is_empty(), "{what}: says why");
    }
    assert!(!marker.exists(), "a command ran despite bad input");
}
