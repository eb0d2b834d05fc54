//! Exit codes of the `dlock` command and the error type that carries one.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (`run`: the command's own status is passed through) |
//! | 1 | `demo`: the locked round went wrong (oversold, tokens not increasing) |
//! | 64 | usage error: bad flag, duration, lock name or URL |
//! | 69 | the store is unreachable or answered with an error |
//! | 70 | internal error (a demo buyer failed in an unexpected way) |
//! | 75 | the lock was not acquired (busy with `--no-wait`, or the wait expired) |
//! | 76 | the lock was lost while the command ran |
//! | 126 | the command could not be executed |
//! | 127 | the command was not found |
//! | 128+N | the command was killed by signal N (or dlock was interrupted by N while waiting) |

use std::fmt;

/// Everything went fine.
pub const OK: i32 = 0;
/// A check failed (`demo`).
pub const FAILURE: i32 = 1;
/// Command-line usage error (sysexits `EX_USAGE`).
pub const USAGE: i32 = 64;
/// The store is unavailable (sysexits `EX_UNAVAILABLE`).
pub const UNAVAILABLE: i32 = 69;
/// Internal software error (sysexits `EX_SOFTWARE`).
pub const SOFTWARE: i32 = 70;
/// The lock was not granted; try again later (sysexits `EX_TEMPFAIL`).
pub const NOT_GRANTED: i32 = 75;
/// The lock was lost while the command ran (sysexits `EX_PROTOCOL`).
pub const LOST: i32 = 76;
/// The command was found but could not be executed (like a shell).
pub const CANNOT_EXECUTE: i32 = 126;
/// The command was not found (like a shell).
pub const NOT_FOUND: i32 = 127;

/// The exit code of a process killed by signal `sig`, as a shell reports it.
pub fn for_signal(sig: i32) -> i32 {
    128 + sig
}

/// The exit code for a library error.
pub fn for_error(e: &dlock::Error) -> i32 {
    use dlock::Error as E;
    match e {
        E::Busy { .. } | E::Timeout { .. } => NOT_GRANTED,
        E::Lost { .. } | E::NotOwner { .. } => LOST,
        E::InvalidName(_) | E::InvalidConfig(_) => USAGE,
        // Unavailable, Unsupported, Backend and anything added later: the store could not do it.
        _ => UNAVAILABLE,
    }
}

/// A failure to report on stderr (one line) and exit with.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: i32,
    /// The message, without the `dlock: ` prefix.
    pub message: String,
}

impl Failure {
    /// A failure with an explicit code.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: one_line(&message.into()),
        }
    }

    /// A usage error (64).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure::new(USAGE, message)
    }

    /// A store failure (69).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Failure::new(UNAVAILABLE, message)
    }
}

impl From<dlock::Error> for Failure {
    fn from(e: dlock::Error) -> Self {
        Failure::new(for_error(&e), e.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a subcommand returns: the exit code on success paths, a [`Failure`] otherwise.
pub type CliResult = Result<i32, Failure>;

/// Folds a possibly multi-line message (store errors can have several lines) into one line.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for part in s
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        if !out.is_empty() {
            out.push_str(" | ");
        }
        out.push_str(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_errors() {
        assert_eq!(
            for_error(&dlock::Error::Busy { name: "x".into() }),
            NOT_GRANTED
        );
        assert_eq!(for_error(&dlock::Error::InvalidName("x".into())), USAGE);
        assert_eq!(
            for_error(&dlock::Error::Unavailable("x".into())),
            UNAVAILABLE
        );
        assert_eq!(for_error(&dlock::Error::backend("boom")), UNAVAILABLE);
        assert_eq!(for_signal(15), 143);
    }

    #[test]
    fn folds_lines() {
        assert_eq!(one_line("a\n b\r\n\nc"), "a | b | c");
        assert_eq!(one_line("plain"), "plain");
    }
}
