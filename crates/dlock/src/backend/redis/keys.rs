//! The key layout (see the module docs): a lock's base key, the keys next to it, its release
//! channel, and how scanned keys map back to lock names.
//!
//! The keys of a script call are written straight into its command (`scripts::Call::joined`);
//! keys kept elsewhere are joined with `[base, ":suffix"].concat()` (one allocation of the exact
//! size) rather than `format!`, which grows its string as it writes.

use super::{RedisBackend, RedisTarget, Shared};
use crate::error::{Error, Result};
use crate::name::LockName;

/// Suffixes of the keys next to a base key (skipped by `describe` with `hashtag=false`).
pub(super) const SUFFIXES: &[&str] = &[
    ":fence", ":exp", ":q", ":qexp", ":qinfo", ":qseq", ":w", ":obs",
];
/// The suffixes of a base key's channels: releases, changes for observers, hand-offs (followed
/// by the waiting client's key), and of the observers' mark.
pub(super) const RELEASED: &str = ":released";
pub(super) const CHANGED: &str = ":changed";
pub(super) const HANDOFF: &str = ":handoff:";
pub(super) const OBSERVED: &str = ":obs";
/// The hash tag of the names that begin with `}` (see [`Shared::base`]). No lock name holds a NUL,
/// so these bases never meet another name's.
pub(super) const NUL_TAG: char = '\0';

/// The lock name of a scanned key, if it is a base key.
pub(super) fn name_of_key(target: &RedisTarget, key: &str) -> Option<String> {
    key_name(&target.prefix, target.hashtag, key)
}

/// The lock name whose base key under `prefix` (with or without hash tags) is `key`; `None` for
/// any other key: the keys next to a base key, and foreign keys.
pub(super) fn key_name(prefix: &str, hashtag: bool, key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?;
    let name = if hashtag {
        let tagged = rest.strip_prefix('{')?.strip_suffix('}')?;
        match tagged.strip_prefix(NUL_TAG) {
            Some(n) if n.starts_with('}') => n,
            Some(_) => return None,
            None if tagged.starts_with('}') => return None,
            None => tagged,
        }
    } else {
        if SUFFIXES.iter().any(|s| rest.ends_with(s)) {
            return None;
        }
        if let Some((_, owner)) = rest.rsplit_once(":meta:") {
            if uuid::Uuid::parse_str(owner).is_ok() {
                return None;
            }
        }
        rest
    };
    LockName::new(name).ok().map(|n| n.as_str().to_owned())
}

/// With `hashtag=false` the keys of lock `n` are `prefix + n + suffix`, so a name ending with a
/// suffix would be another lock's key (`a:fence` is the fencing counter of `a`): such names are
/// refused there rather than corrupting that lock.
pub(super) fn check_verbatim_name(target: &RedisTarget, name: &str) -> Result<()> {
    check_name(target.hashtag, name)
}

/// [`check_verbatim_name`] for a target with or without hash tags.
pub(super) fn check_name(hashtag: bool, name: &str) -> Result<()> {
    if hashtag {
        return Ok(());
    }
    let meta = name
        .rsplit_once(":meta:")
        .is_some_and(|(_, owner)| uuid::Uuid::parse_str(owner).is_ok());
    match SUFFIXES.iter().find(|s| name.ends_with(*s)) {
        Some(s) => Err(Error::InvalidName(format!(
            "with hashtag=false a lock name must not end with {s:?}: its key would be another \
             lock's (use the default hashtag=true)"
        ))),
        None if meta => Err(Error::InvalidName(
            "with hashtag=false a lock name must not end with \":meta:<uuid>\": its key would be \
             another lock's (use the default hashtag=true)"
                .into(),
        )),
        None => Ok(()),
    }
}

/// The base key of `name` under `prefix`, with or without hash tags (see [`Shared::base`]).
pub(super) fn base_key(prefix: &str, hashtag: bool, name: &str) -> String {
    if hashtag && name.starts_with('}') {
        format!("{prefix}{{{NUL_TAG}{name}}}")
    } else if hashtag {
        [prefix, "{", name, "}"].concat()
    } else {
        [prefix, name].concat()
    }
}

/// Escapes Redis glob characters so `s` matches only itself in `SCAN MATCH`.
pub(super) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Shared {
    /// The base key of `name`: `prefix{name}`. A name that begins with `}` would make the hash
    /// tag `{}` empty (Redis then hashes the whole key, and the keys of one lock land in
    /// different cluster slots), so its base is `prefix{\0name}`, whose hash tag is the NUL.
    pub(super) fn base(&self, name: &str) -> String {
        base_key(&self.target.prefix, self.target.hashtag, name)
    }

    /// The channel where releases of the name are announced.
    pub(super) fn channel(base: &str) -> String {
        [base, RELEASED].concat()
    }

    /// The channel of changes only an observer of the name cares about: a hand-off (the lock
    /// has a new holder) and a new value.
    pub(super) fn changed_channel(base: &str) -> String {
        [base, CHANGED].concat()
    }

    /// The key that says someone observes the name (an election's follower): while it exists,
    /// releases announce themselves even when no waiter is registered or queued.
    pub(super) fn observed_key(base: &str) -> String {
        [base, OBSERVED].concat()
    }

    /// Where the releases of `base`'s holders tell this backend's client that they handed it
    /// the lock: the hand-off prefix (the release script appends the client key of the
    /// waiter's record) and this client's key.
    pub(super) fn handoff_channel(&self, base: &str) -> String {
        [base, HANDOFF, &self.client_key].concat()
    }
}

impl RedisBackend {
    pub(super) fn hold_keys(&self, name: &str, owner: &str) -> (String, String, String) {
        let base = self.shared.base(name);
        let exp = [&*base, ":exp"].concat();
        let meta = [&*base, ":meta:", owner].concat();
        (base, exp, meta)
    }
}
