//! The properties the fuzz targets check, shared by the cargo-fuzz targets (`fuzz/fuzz_targets`,
//! nightly) and by `crates/dlock/tests/fuzz_checks.rs` (stable, over the seed corpus and random
//! inputs), so CI catches a regression without nightly.
//!
//! Every function panics when a property is broken; a panic is what the fuzzer reports.
#![allow(dead_code)] // each fuzz target uses one of them

use dlock::{Error, LockName, MAX_NAME_LEN};

/// The longest message an error about an input may have: a bad URL must not flood a log.
const MESSAGE_MAX: usize = 4096;

/// The password of `s` if it is a URL with one that occurs nowhere else in it (so its absence
/// from an output means it was hidden), raw and percent-decoded.
fn password_of(s: &str) -> Vec<String> {
    let Ok(u) = url::Url::parse(s) else {
        return Vec::new();
    };
    let Some(p) = u.password() else {
        return Vec::new();
    };
    // What the URL says besides its password (the parser drops tabs and newlines, so the raw
    // input is not the reference).
    let mut rest = u.clone();
    if rest.set_password(None).is_err() {
        return Vec::new();
    }
    let rest = rest.to_string();
    // The password raw and decoded; neither may occur elsewhere, raw or decoded (the output may
    // re-encode other parts).
    let decode = |x: &str| {
        // Plain percent-decoding of the whole text (`%XX` → byte), lossy.
        let b = x.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            match (
                b[i],
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) {
                (b'%', Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                }
                (c, _, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    let rest_decoded = decode(&rest);
    let decoded = decode(p);
    let elsewhere = |x: &str| rest.contains(x) || rest_decoded.contains(x);
    // (A password with `*` or `…` can look like the redaction itself: `u\0` + `:***`,
    // `mariedb` + `:…`.)
    let marker = |x: &str| x.contains('*') || x.contains('…');
    if p.len() < 4 || marker(p) || marker(&decoded) || elsewhere(p) || elsewhere(&decoded) {
        return Vec::new();
    }
    let mut out = vec![p.to_string()];
    if decoded.len() >= 4 && decoded != p {
        out.push(decoded);
    }
    out
}

/// Store URL parsing (`dlock::validate_url`, which runs every backend's URL parser without
/// connecting): never panics; a refusal is `InvalidConfig` with a bounded message that does not
/// contain the URL's password; `redact_url` of an accepted URL hides its password too.
pub fn url(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    // A password that is one of the words a refusal carries by itself (the enabled schemes, as
    // in `postgreredisss://:postgres@h/`) is not shown by carrying them.
    let listed = dlock::enabled_backends().join(", ");
    let secrets: Vec<String> = password_of(s)
        .into_iter()
        .filter(|p| !listed.contains(p.as_str()))
        .collect();
    match dlock::validate_url(s) {
        Ok(()) => {}
        Err(Error::InvalidConfig(m)) => {
            assert!(
                m.len() <= MESSAGE_MAX,
                "a {} byte message for a {} byte URL",
                m.len(),
                s.len()
            );
            for p in &secrets {
                assert!(
                    !m.contains(p.as_str()),
                    "the message shows the password: {m}"
                );
            }
        }
        Err(e) => panic!("validate_url({s:?}): not InvalidConfig: {e:?}"),
    }
    redact(data);
}

/// Lock names: `LockName::new` accepts exactly 1..=255 bytes without NUL and keeps the name as
/// given; the ZooKeeper escaping (when built) is injective and yields a legal path component.
pub fn name(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let valid = !s.is_empty() && s.len() <= MAX_NAME_LEN && !s.contains('\0');
    match LockName::new(s) {
        Ok(n) => {
            assert!(valid, "accepted {s:?}");
            assert_eq!(n.as_str(), s);
            assert_eq!(n.to_string(), s);
        }
        Err(Error::InvalidName(m)) => {
            assert!(!valid, "refused {s:?}: {m}");
            assert!(m.len() <= MESSAGE_MAX);
        }
        Err(e) => panic!("LockName::new({s:?}): not InvalidName: {e:?}"),
    }
    #[cfg(feature = "zookeeper")]
    {
        use dlock::backend::zookeeper::{escape_name, unescape_name};
        if valid {
            let e = escape_name(s);
            assert!(
                e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_%".contains(&b)),
                "escape_name({s:?}) = {e:?}"
            );
            assert!(e != "zookeeper" && e != "." && e != "..", "{e:?}");
            assert_eq!(unescape_name(&e).as_deref(), Some(s), "round trip of {s:?}");
        }
        // Any path component: if it is the escape of a name, that name escapes back to it.
        if let Some(n) = unescape_name(s) {
            assert_eq!(escape_name(&n), s, "{s:?} decoded to {n:?}");
        }
    }
}

/// `redact_url`: never panics, output bounded, never contains the password of a URL — of the
/// input itself, and of URLs built from the input as `scheme://user:password@rest` for every
/// scheme dlock knows (and a bare `user:password@rest`).
pub fn redact(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let check = |url: &str, secrets: &[String]| {
        let out = dlock::redact_url(url);
        assert!(
            out.chars().count() <= 256 + 32,
            "redact_url gave {} characters",
            out.chars().count()
        );
        for p in secrets {
            assert!(
                !out.contains(p.as_str()),
                "redact_url({url:?}) = {out:?} shows the password {p:?}"
            );
        }
    };
    check(&s, &password_of(&s));

    // Structured: the first bytes choose a scheme, a user and a password; the rest is anything.
    let (head, rest) = s.split_at(s.char_indices().nth(12).map_or(s.len(), |(i, _)| i));
    let pick = head.bytes().next().unwrap_or(0) as usize;
    const SCHEMES: &[&str] = &[
        "redis://",
        "rediss://",
        "redlock://",
        "postgres://",
        "postgresql://",
        "mysql://",
        "mariadb://",
        "zk://",
        "sqlite://",
        "mem://",
        "foo://",
        "",
    ];
    let scheme = SCHEMES[pick % SCHEMES.len()];
    let alnum: String = head.chars().filter(char::is_ascii_alphanumeric).collect();
    let (user, pw_tail) = alnum.split_at(alnum.len() / 2);
    let user = if scheme.is_empty() && user.is_empty() {
        "u"
    } else {
        user
    };
    // A password that cannot occur anywhere else in the URL by chance.
    let pw = format!("Zq{pw_tail}Q9");
    let without_space: String = rest
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    if without_space.contains(pw.as_str()) || user.contains(pw.as_str()) {
        return;
    }
    let built = format!("{scheme}{user}:{pw}@{rest}");
    if scheme.is_empty() && !user.starts_with(|c: char| c.is_ascii_alphabetic()) {
        // `1x:pw@…` is no URL at all: only the no-panic property.
        check(&built, &[]);
        return;
    }
    check(&built, &[pw]);
}
