//! The fuzz targets' properties (`fuzz/checks.rs`) on stable: every file of the seed corpus
//! (`fuzz/corpus/<target>/`) plus a few thousand random and mutated inputs per target. The real
//! fuzzing is `scripts/fuzz.sh` (cargo-fuzz, nightly); this catches regressions in CI. The
//! store-data targets (`zk_node`, `etcd_key`, `redis_meta`, `sql_rows`) need the `__fuzz` feature
//! (not API; on in a workspace run through dlock-cli's dev-dependency, and with `--all-features`).

#[path = "../../../fuzz/checks.rs"]
mod checks;

use rand::{Rng, SeedableRng};
use std::path::PathBuf;

/// Random inputs per target, on top of the corpus.
const RANDOM_INPUTS: usize = 4000;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    assert!(
        inputs.len() >= 10,
        "{}: seed corpus too small",
        dir.display()
    );
    inputs
}

/// Pieces that make mutations interesting for URL and name parsers.
const TOKENS: &[&str] = &[
    "://",
    ":",
    "@",
    "/",
    "?",
    "&",
    "=",
    "#",
    "%",
    "%00",
    "%ff",
    "%zz",
    "[",
    "]",
    "::1",
    ",",
    "{",
    "}",
    "*",
    "\0",
    "\u{e9}",
    "\u{1f512}",
    "redis",
    "rediss",
    "redis+sentinel",
    "redis+cluster",
    "replicas=",
    "sentinel_password=",
    "redlock",
    "postgres",
    "mysql",
    "mariadb",
    "zk",
    "sqlite",
    "mem",
    "table=",
    "mode=",
    "session",
    "prefix=",
    "hashtag=",
    "timeout=",
    "session_timeout=",
    "drift=",
    "99999",
    "-1s",
    "0",
    "..",
    "zookeeper",
    "pw",
    // Store data: node names, keys, values, messages.
    "\n",
    "_c_",
    "lock-",
    "__lock__",
    "__READ__",
    "__WRIT__",
    "semaphore-3-",
    "0000000001",
    "9223372036854775807",
    "{\"owner\":\"o\",\"client_id\":\"c\",\"host\":\"h\",\"pid\":1}",
    "\"revoked\":true",
    "\"lock\":\"semaphore\"",
    "\"permits\":0",
    "__REVOKE__",
    ":meta:",
    ":fence",
    "dlock/",
    "dlock:",
    "mutex",
    "rwlock",
    "semaphore",
    "shared",
    "exclusive",
];

fn mutate(rng: &mut impl Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..rng.gen_range(1..6) {
        let at = rng.gen_range(0..=v.len());
        match rng.gen_range(0..5) {
            0 => v.insert(at, rng.gen()),
            1 if at < v.len() => {
                v.remove(at);
            }
            2 => {
                let t = TOKENS[rng.gen_range(0..TOKENS.len())].as_bytes();
                v.splice(at..at, t.iter().copied());
            }
            3 => {
                let n = rng.gen_range(0..300);
                let b = rng.gen_range(b'a'..=b'z');
                v.splice(at..at, std::iter::repeat(b).take(n));
            }
            _ => v.truncate(at),
        }
    }
    v
}

fn run(target: &str, check: fn(&[u8])) {
    let seeds = corpus(target);
    for s in &seeds {
        check(s);
    }
    let seed: u64 = rand::thread_rng().gen();
    eprintln!(
        "{target}: {} corpus files, {RANDOM_INPUTS} random inputs, seed {seed}",
        seeds.len()
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for i in 0..RANDOM_INPUTS {
        let input = if i % 4 == 0 {
            let n = rng.gen_range(0..300);
            (0..n).map(|_| rng.gen()).collect()
        } else {
            let pick = rng.gen_range(0..seeds.len());
            mutate(&mut rng, &seeds[pick])
        };
        let r = std::panic::catch_unwind(|| check(&input));
        if r.is_err() {
            panic!(
                "{target}: input {:?} (seed {seed}) broke a property; add it to fuzz/corpus/{target}/",
                String::from_utf8_lossy(&input)
            );
        }
    }
}

#[test]
fn url_inputs() {
    run("url", checks::url);
}

#[test]
fn name_inputs() {
    run("name", checks::name);
}

#[test]
fn redact_inputs() {
    run("redact", checks::redact);
}

#[cfg(all(feature = "__fuzz", feature = "zookeeper"))]
#[test]
fn zk_node_inputs() {
    run("zk_node", checks::zk_node);
}

#[cfg(all(feature = "__fuzz", feature = "etcd"))]
#[test]
fn etcd_key_inputs() {
    run("etcd_key", checks::etcd_key);
}

#[cfg(all(feature = "__fuzz", feature = "redis"))]
#[test]
fn redis_meta_inputs() {
    run("redis_meta", checks::redis_meta);
}

#[cfg(all(
    feature = "__fuzz",
    any(feature = "postgres", feature = "mysql", feature = "sqlite")
))]
#[test]
fn sql_rows_inputs() {
    run("sql_rows", checks::sql_rows);
}
