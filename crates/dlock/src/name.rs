//! Lock names.

use crate::error::{Error, Result};
use std::fmt;

/// Maximum length of a lock name in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// A validated lock name: UTF-8, 1..=255 bytes, no NUL.
///
/// Every backend accepts every valid name; a store whose key space is narrower maps names
/// deterministically (documented per backend) and never truncates silently.
///
/// ```
/// use dlock::LockName;
/// assert!(LockName::new("jobs/nightly-report").is_ok());
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("a\0b").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::InvalidName("a lock name must not be empty".into()));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Error::InvalidName(format!(
                "a lock name is at most {MAX_NAME_LEN} bytes, this one has {}",
                name.len()
            )));
        }
        if name.contains('\0') {
            return Err(Error::InvalidName(
                "a lock name must not contain NUL bytes".into(),
            ));
        }
        Ok(LockName(name))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert!(LockName::new("x".repeat(255)).is_ok());
        assert!(matches!(
            LockName::new("x".repeat(256)),
            Err(Error::InvalidName(_))
        ));
        assert!(matches!(LockName::new(""), Err(Error::InvalidName(_))));
        assert!(matches!(LockName::new("a\0"), Err(Error::InvalidName(_))));
        assert!(LockName::new("../%'\";--{x}").is_ok());
    }
}
