//! Which store to use: `--url`, else `$DLOCK_URL`, else the embedded SQLite file in the user's
//! state directory.

use crate::exit::Failure;
use std::path::{Path, PathBuf};

/// The environment variable naming the default store.
pub const URL_ENV: &str = "DLOCK_URL";

/// The value of `$DLOCK_URL`, if set and not empty.
pub fn env_url() -> Option<String> {
    std::env::var(URL_ENV).ok().filter(|s| !s.trim().is_empty())
}

/// The directory holding the default store: `dirs::state_dir()`, else `dirs::data_local_dir()`,
/// else `$HOME/.local/state`, joined with `dlock`.
pub fn default_dir() -> Option<PathBuf> {
    dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("state"))
        })
        .map(|d| d.join("dlock"))
}

/// The file of the default store.
pub fn default_path() -> Option<PathBuf> {
    default_dir().map(|d| d.join("locks.db"))
}

/// The `sqlite:` URL of a file path, percent-encoding what a URL cannot carry as is.
pub fn sqlite_url(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let mut out = String::from(if path.is_absolute() {
        "sqlite://"
    } else {
        "sqlite:"
    });
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The URL of the default store (without creating anything).
pub fn default_url() -> Option<String> {
    default_path().map(|p| sqlite_url(&p))
}

/// The URL a command uses: `flag`, else `$DLOCK_URL`, else the default store, whose directory is
/// created here.
pub fn resolve(flag: Option<&str>) -> Result<String, Failure> {
    if let Some(u) = flag {
        return Ok(u.to_string());
    }
    if let Some(u) = env_url() {
        return Ok(u);
    }
    let dir = default_dir().ok_or_else(|| {
        Failure::unavailable(
            "cannot find a state directory for the default store (no $HOME); pass --url or set DLOCK_URL",
        )
    })?;
    std::fs::create_dir_all(&dir).map_err(|e| {
        Failure::unavailable(format!(
            "cannot create the default store's directory {}: {e}",
            dir.display()
        ))
    })?;
    Ok(sqlite_url(&dir.join("locks.db")))
}

/// Whether `raw` is a well-formed `sqlite:` URL, so that a failure to open it is the store's
/// fault (exit 69: a missing directory, a file that is not a database), not the URL's (exit 64).
/// The library reports both as `InvalidConfig`; this mirrors its URL rules to tell them apart
/// (the library's message is shown either way). Other schemes cannot fail that way.
pub fn well_formed(raw: &str) -> bool {
    let Some((scheme, rest)) = raw.split_once(':') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("sqlite") || !dlock::enabled_backends().contains(&"sqlite") {
        return false;
    }
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let path = match rest.split_once('?') {
        Some((_, q)) if !q.is_empty() => return false,
        Some((p, _)) => p,
        None => rest,
    };
    let path = match path.strip_prefix("//") {
        Some(after) => {
            let (host, path) = after.find('/').map_or((after, ""), |i| after.split_at(i));
            if !(host.is_empty() || host.eq_ignore_ascii_case("localhost")) {
                return false;
            }
            path
        }
        None => path,
    };
    match percent_decode(path) {
        Some(p) => !p.is_empty() && p != "/",
        None => false,
    }
}

/// Decodes `%XX` escapes; `None` if the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Connects to `url`, mapping errors to exit codes (bad URL → 64, store trouble → 69). The
/// message names the store by its redacted URL.
pub async fn connect(url: &str) -> Result<dlock::Client, Failure> {
    dlock::connect(url).await.map_err(|e| {
        let mut code = crate::exit::for_error(&e);
        if code == crate::exit::USAGE && well_formed(url) {
            code = crate::exit::UNAVAILABLE;
        }
        let what = if code == crate::exit::USAGE {
            "bad store URL"
        } else {
            "cannot open store"
        };
        Failure::new(code, format!("{what} {}: {e}", dlock::redact_url(url)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_paths() {
        assert_eq!(
            sqlite_url(Path::new("/home/a b/x%y.db")),
            "sqlite:///home/a%20b/x%25y.db"
        );
        assert_eq!(sqlite_url(Path::new("rel/x.db")), "sqlite:rel/x.db");
        assert_eq!(
            sqlite_url(Path::new("/tmp/a#b?c")),
            "sqlite:///tmp/a%23b%3Fc"
        );
    }

    #[test]
    fn tells_bad_urls() {
        for good in [
            "sqlite:///tmp/x.db",
            "sqlite:///tmp/a%20b.db",
            "sqlite:rel/x.db",
            "sqlite://localhost/tmp/x.db",
            "sqlite:///nonexistent-dir/x/y.db",
        ] {
            assert!(well_formed(good), "{good}");
        }
        for bad in [
            "",
            "nope",
            "foo://x",
            "redis://h",
            "mem://",
            "sqlite://host/x.db",
            "sqlite:///",
            "sqlite:///x.db?bogus=1",
            "sqlite:///x%FF.db",
        ] {
            assert!(!well_formed(bad), "{bad}");
        }
    }
}
