//! Which store to use: `--url`, else `$DLOCK_URL`, else the embedded SQLite file in the user's
//! state directory.

use crate::exit::Failure;
use std::path::{Path, PathBuf};
use std::time::Instant;

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

/// Connects to `url`, mapping errors to exit codes (bad URL → 64, store trouble → 69). The
/// message names the store by its redacted URL.
pub async fn connect(url: &str) -> Result<dlock::Client, Failure> {
    dlock::connect(url).await.map_err(|e| open_failure(url, e))
}

/// Connects as [`connect`] does, for a caller that waits until `until`: a passing refusal of
/// the store is tried again until then ([`dlock::connect_until`]).
pub async fn connect_until(url: &str, until: Instant) -> Result<dlock::Client, Failure> {
    dlock::connect_until(url, dlock::ClientOptions::default(), until)
        .await
        .map_err(|e| open_failure(url, e))
}

fn open_failure(url: &str, e: dlock::Error) -> Failure {
    let code = crate::exit::for_error(&e);
    let what = if code == crate::exit::USAGE {
        "bad store URL"
    } else {
        "cannot open store"
    };
    Failure::new(code, format!("{what} {}: {e}", dlock::redact_url(url)))
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
}
