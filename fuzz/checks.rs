//! The properties the fuzz targets check, shared by the cargo-fuzz targets (`fuzz/fuzz_targets`,
//! nightly) and by `crates/dlock/tests/fuzz_checks.rs` (stable, over the seed corpus and random
//! inputs), so CI catches a regression without nightly.
//!
//! Every function panics when a property is broken; a panic is what the fuzzer reports.
#![allow(dead_code)] // each fuzz target uses one of them

use dlock::{Error, LockName, MAX_NAME_LEN};

/// The longest message an error about an input may have: a bad URL must not flood a log.
const MESSAGE_MAX: usize = 4096;

/// Plain percent-decoding of a whole text (`%XX` → byte), lossy.
fn percent_decode_lossy(x: &str) -> String {
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
}

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
    let decode = percent_decode_lossy;
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
    // Compared as `redact` does: percent-decoded, the redaction `:***@` taken out.
    let password = password_of(s)
        .into_iter()
        .next()
        .map(|p| percent_decode_lossy(&p))
        .filter(|p| !listed.contains(p.as_str()));
    match dlock::validate_url(s) {
        Ok(()) => {}
        Err(Error::InvalidConfig(m)) => {
            assert!(
                m.len() <= MESSAGE_MAX,
                "a {} byte message for a {} byte URL",
                m.len(),
                s.len()
            );
            if let Some(p) = &password {
                let shown = percent_decode_lossy(&m.replace(":***@", "\0"));
                assert!(
                    !shown.contains(p.as_str()),
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
///
/// "Contains" is read on percent-decoded text, with the redaction `:***@` taken out: a password
/// shown raw or encoded decodes to itself, while text that only looks like it because of what
/// redaction or re-encoding put next to it does not (`:@cas` before the host `cash` is not
/// `:***@cash`'s; a password `00%EF%BF%BD` is not shown by `%40` + `0%EF%BF%BD`).
pub fn redact(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let check = |url: &str, password: Option<&str>| {
        let out = dlock::redact_url(url);
        assert!(
            out.chars().count() <= 256 + 32,
            "redact_url gave {} characters",
            out.chars().count()
        );
        if let Some(p) = password {
            let shown = percent_decode_lossy(&out.replace(":***@", "\0"));
            let p = percent_decode_lossy(p);
            assert!(
                !shown.contains(p.as_str()),
                "redact_url({url:?}) = {out:?} shows the password {p:?}"
            );
        }
    };
    // (`password_of` gives the raw password first.)
    check(&s, password_of(&s).first().map(String::as_str));

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
        check(&built, None);
        return;
    }
    check(&built, Some(&pw));
}

// ---------------------------------------------------------------------------------------------
// Store data: what a store hands back (names of keys and nodes, values, rows, answers, hand-off
// messages) may be corrupted or another program's. Each decoder must give a clear error or skip
// the item as foreign — never panic, and never decode to something dlock did not write (a place
// in a lock's queue, a holder, a token). Where dlock has an encoder, what it writes decodes back
// exactly. These need dlock's `__fuzz` feature (not API).

/// Reads structured values from the fuzzer's bytes; past the end, zeros and empty strings.
#[cfg(feature = "__fuzz")]
struct Cursor<'a>(&'a [u8]);

#[cfg(feature = "__fuzz")]
impl<'a> Cursor<'a> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn u64(&mut self) -> u64 {
        let b = self.bytes(8);
        let mut v = [0u8; 8];
        v[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(v)
    }
    fn i64(&mut self) -> i64 {
        self.u64() as i64
    }
    /// A string of up to `max` bytes (lossy UTF-8).
    fn text(&mut self, max: usize) -> String {
        let n = self.byte() as usize % (max + 1);
        String::from_utf8_lossy(self.bytes(n)).into_owned()
    }
    /// One of `words`, or (one time in four) any text: the values a store holds and a few
    /// others.
    fn word(&mut self, words: &[&str]) -> String {
        let b = self.byte() as usize;
        match words.get(b % (words.len() + words.len().div_ceil(3))) {
            Some(w) => (*w).to_owned(),
            None => self.text(12),
        }
    }
    /// A lock name dlock accepts (1..=255 bytes, no NUL), from the input.
    fn name(&mut self) -> String {
        let mut s: String = self.text(40).replace('\0', "");
        if s.is_empty() {
            s.push('n');
        }
        s
    }
    fn lock_kind(&mut self) -> dlock::LockKind {
        match self.byte() % 3 {
            0 => dlock::LockKind::Mutex,
            1 => dlock::LockKind::RwLock,
            _ => dlock::LockKind::Semaphore {
                permits: (self.u64() as u32).max(1),
            },
        }
    }
    fn mode(&mut self) -> dlock::Mode {
        if self.byte() % 2 == 0 {
            dlock::Mode::Exclusive
        } else {
            dlock::Mode::Shared
        }
    }
    fn uuid(&mut self) -> String {
        let b = self.bytes(16);
        let mut v = [0u8; 16];
        v[..b.len()].copy_from_slice(b);
        let h: String = v.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }
    fn meta(&mut self) -> dlock::HolderMeta {
        let value = (self.byte() % 2 == 0).then(|| self.text(30));
        dlock::HolderMeta {
            client_id: self.text(20),
            host: self.text(20),
            pid: self.u64() as u32,
            value,
        }
    }
}

/// A kind a lock can have (a semaphore has at least one permit).
#[cfg(feature = "__fuzz")]
fn valid_kind(k: dlock::LockKind) -> bool {
    !matches!(k, dlock::LockKind::Semaphore { permits: 0 })
}

/// The mode a queue entry of `kind` asked for in `mode` has (a mutex is exclusive, a permit
/// shared).
#[cfg(feature = "__fuzz")]
fn entry_mode(kind: dlock::LockKind, mode: dlock::Mode) -> dlock::Mode {
    match kind {
        dlock::LockKind::Mutex => dlock::Mode::Exclusive,
        dlock::LockKind::RwLock => mode,
        dlock::LockKind::Semaphore { .. } => dlock::Mode::Shared,
    }
}

/// Splits an input at its first newline: a name or key, then data.
#[cfg(feature = "__fuzz")]
fn line_and_rest(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Whether `n` is a count in plain decimal (no sign, no leading zero).
#[cfg(feature = "__fuzz")]
fn plain_decimal(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'))
}

/// The ZooKeeper child-name grammar, written independently of the backend: a known marker, then
/// exactly 10 (or 19) digits that fit an i64. What it gives, the backend must give.
#[cfg(all(feature = "__fuzz", feature = "zookeeper"))]
fn zk_grammar(name: &str) -> Option<(i64, dlock::LockKind, dlock::Mode)> {
    use dlock::{LockKind, Mode};
    let head = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &name[head.len()..];
    if digits.len() != 10 && digits.len() != 19 {
        return None;
    }
    let seq: i64 = digits.parse().ok()?;
    if head.ends_with("__WRIT__") {
        return Some((seq, LockKind::RwLock, Mode::Exclusive));
    }
    if head.ends_with("__READ__") {
        return Some((seq, LockKind::RwLock, Mode::Shared));
    }
    if head.ends_with("lock-") || head.ends_with("__lock__") {
        return Some((seq, LockKind::Mutex, Mode::Exclusive));
    }
    let rest = head.strip_suffix('-')?;
    let cut = rest.rfind('-')?;
    let (before, n) = (&rest[..cut], &rest[cut + 1..]);
    if !before.ends_with("semaphore") || !plain_decimal(n) {
        return None;
    }
    let permits: u32 = n.parse().ok().filter(|p| *p > 0)?;
    Some((seq, LockKind::Semaphore { permits }, Mode::Shared))
}

/// ZooKeeper node names and node data (`zk_node`): the first line is a child's name, the rest
/// its data. A name parses as a queue entry exactly when it has the layout's grammar (a
/// foreign node is skipped, never a place in the queue), its sequence number round-trips, and
/// the names dlock creates parse back to their request; node data decodes without panic, and
/// what dlock writes decodes back to its owner, metadata and revocation.
#[cfg(all(feature = "__fuzz", feature = "zookeeper"))]
pub fn zk_node(data: &[u8]) {
    use dlock::__fuzz::zookeeper as zk;
    let (name, node_data) = line_and_rest(data);
    let name = String::from_utf8_lossy(name);
    let parsed = zk::parse_child(&name);
    assert_eq!(parsed, zk_grammar(&name), "parse_child({name:?})");
    if let Some((seq, kind, _)) = parsed {
        assert!(valid_kind(kind), "{name:?} parsed as {kind:?}");
        assert!(seq >= 0);
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        assert_eq!(format!("{seq:0digits$}"), name[name.len() - digits..]);
    }
    if let Some(o) = zk::owner_of(&name) {
        assert!(name.starts_with(&format!("_c_{o}-")), "owner_of({name:?})");
    }
    let (owner, meta) = zk::node_holder(&name, node_data);
    let _ = zk::revoked(node_data);
    if !node_data.trim_ascii_start().starts_with(b"{") {
        // Not JSON: the name's owner, and the data as the host only when short and printable.
        assert_eq!(owner, zk::owner_of(&name).unwrap_or(&name));
        assert!(meta.host.len() <= 255 && !meta.host.chars().any(char::is_control));
        assert!(meta.client_id.is_empty() && meta.pid == 0 && meta.value.is_none());
    }
    assert!(zk::revoked(b"__REVOKE__"), "Curator's revocation");

    // dlock's own names and data, built from the input.
    let mut c = Cursor(data);
    let (owner, kind, mode) = (c.uuid(), c.lock_kind(), c.mode());
    let seq = i64::from(c.u64() as u32 & 0x7fff_ffff);
    let node = zk::node_name(&owner, kind, mode, seq);
    assert_eq!(
        zk::parse_child(&node),
        Some((seq, kind, entry_mode(kind, mode))),
        "dlock's own node {node:?}"
    );
    assert_eq!(zk::owner_of(&node), Some(owner.as_str()));
    let (meta, revoked) = (c.meta(), c.byte() % 2 == 0);
    let written = zk::node_data(&owner, &meta, revoked);
    assert_eq!(zk::node_holder(&node, &written), (owner, meta));
    assert_eq!(zk::revoked(&written), revoked);
}

/// etcd keys and values (`etcd_key`): the first line is a key under the prefix `dlock`, the
/// rest its value. A key decodes to a lock name only when it lies under that name's own
/// directory (escaping is injective: no key of one name reads as another's), the keys dlock
/// puts decode to their name, and any value gives a valid kind (what dlock does not write is a
/// mutex, as etcd's own keys); what dlock writes reads back exactly.
#[cfg(all(feature = "__fuzz", feature = "etcd"))]
pub fn etcd_key(data: &[u8]) {
    use dlock::__fuzz::etcd;
    const PREFIX: &str = "dlock";
    let (key, value) = line_and_rest(data);
    if let Some(n) = etcd::name_of_key(PREFIX, key) {
        assert!(dlock::LockName::new(n.as_str()).is_ok(), "{n:?}");
        let dir = format!("{PREFIX}/{}/", dlock::backend::etcd::escape_name(&n));
        assert!(
            key.starts_with(dir.as_bytes()),
            "{:?} read as {n:?}",
            String::from_utf8_lossy(key)
        );
    }
    let (kind, mode, _, _, _) = etcd::read_value(value);
    assert!(valid_kind(kind), "value read as {kind:?}");
    assert_eq!(mode, entry_mode(kind, mode));
    if value.is_empty() {
        assert_eq!(kind, dlock::LockKind::Mutex, "etcd's own (empty) value");
    }

    let mut c = Cursor(data);
    let name = c.name();
    let owner = c.uuid();
    let lease = c.i64();
    let second = c.byte() % 2 == 0;
    let k = etcd::key(PREFIX, &name, lease, second.then_some(owner.as_str()));
    assert_eq!(
        etcd::name_of_key(PREFIX, &k).as_deref(),
        Some(name.as_str())
    );
    let (kind, mode, meta) = (c.lock_kind(), c.mode(), c.meta());
    let v = etcd::write_value(kind, mode, &owner, &meta);
    assert_eq!(
        etcd::read_value(&v),
        (kind, entry_mode(kind, mode), owner, meta, false)
    );
}

/// A Redis value from the input: the shapes the scripts answer with, nested a few levels.
#[cfg(all(feature = "__fuzz", feature = "redis"))]
fn redis_value(c: &mut Cursor<'_>, depth: u32) -> dlock::__fuzz::redis::Value {
    use dlock::__fuzz::redis::Value;
    match c.byte() % 8 {
        0 => Value::Nil,
        1 => Value::Int(c.i64()),
        2 => Value::SimpleString(c.text(16)),
        3 | 4 if depth < 4 => {
            let n = c.byte() as usize % 12;
            Value::Array((0..n).map(|_| redis_value(c, depth + 1)).collect())
        }
        5 => Value::Okay,
        _ => Value::BulkString(
            c.word(&[
                "mutex",
                "rwlock",
                "semaphore",
                "exclusive",
                "shared",
                "held",
                "revoked",
                "detached",
                "-1",
                "0",
                "3",
                "4294967296",
            ])
            .into_bytes(),
        ),
    }
}

/// Redis keys, `describe` answers and hand-off messages (`redis_meta`). A scanned key decodes
/// to a lock name only if it is exactly that name's base key (never one of the keys next to
/// it, never a foreign key), with and without hash tags; a `describe` answer gives a lock of a
/// valid kind or a bounded `Backend` error, and a well-formed answer decodes to what it says;
/// a hand-off message is taken only in the form the release script publishes.
#[cfg(all(feature = "__fuzz", feature = "redis"))]
pub fn redis_meta(data: &[u8]) {
    use dlock::__fuzz::redis::{self as r, Value};
    const PREFIX: &str = "dlock:";
    let (line, _) = line_and_rest(data);
    let key = String::from_utf8_lossy(line);
    for hashtag in [true, false] {
        if let Some(n) = r::name_of_key(PREFIX, hashtag, &key) {
            assert_eq!(
                r::base_key(PREFIX, hashtag, &n),
                key,
                "{key:?} read as {n:?}"
            );
            assert!(r::name_allowed(hashtag, &n).is_ok(), "{n:?}");
        }
    }
    if let Some((owner, token)) = r::parse_handoff(line) {
        assert_eq!(format!("{owner} {token}").as_bytes(), line, "hand-off");
    }

    let mut c = Cursor(data);
    let name = c.name();
    for hashtag in [true, false] {
        let base = r::base_key(PREFIX, hashtag, &name);
        if r::name_allowed(hashtag, &name).is_ok() {
            assert_eq!(
                r::name_of_key(PREFIX, hashtag, &base).as_deref(),
                Some(name.as_str())
            );
        }
        let meta = format!("{base}:meta:{}", c.uuid());
        for k in [
            ":fence", ":exp", ":q", ":qexp", ":qinfo", ":qseq", ":w", ":obs",
        ]
        .iter()
        .map(|s| format!("{base}{s}"))
        .chain([meta])
        {
            assert_eq!(
                r::name_of_key(PREFIX, hashtag, &k),
                None,
                "{k:?} is not a lock"
            );
        }
    }
    let (owner, token) = (c.uuid(), c.u64());
    assert_eq!(
        r::parse_handoff(format!("{owner} {token}").as_bytes()),
        Some((owner.as_str(), token))
    );

    // Any answer.
    let v = redis_value(&mut c, 0);
    match r::parse_describe(&name, &v) {
        Ok(Some(info)) => {
            assert_eq!(info.name, name);
            assert!(valid_kind(info.kind), "{:?}", info.kind);
            assert!(info
                .holders
                .windows(2)
                .all(|w| w[0].token.unwrap_or(0) <= w[1].token.unwrap_or(0)));
            assert!(info
                .waiters
                .iter()
                .enumerate()
                .all(|(i, w)| w.position as usize == i));
        }
        Ok(None) => {}
        Err(dlock::Error::Backend(e)) => {
            assert!(
                e.to_string().len() <= 1024,
                "{} byte message",
                e.to_string().len()
            );
        }
        Err(e) => panic!("describe answer: not a Backend error: {e:?}"),
    }

    // A well-formed answer: what it says comes back.
    let kind = c.lock_kind();
    let (k, permits) = match kind {
        dlock::LockKind::Mutex => ("mutex", 0),
        dlock::LockKind::RwLock => ("rwlock", 0),
        dlock::LockKind::Semaphore { permits } => ("semaphore", permits),
    };
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let (h_owner, h_mode, h_meta, h_token) = (c.uuid(), c.mode(), c.meta(), c.u64() >> 1);
    let status = ["held", "detached", "revoked"][c.byte() as usize % 3];
    let holder = Value::Array(vec![
        bulk(&h_owner),
        bulk(h_mode.as_str()),
        bulk("1500"),
        bulk(&h_meta.client_id),
        bulk(&h_meta.host),
        bulk(&h_meta.pid.to_string()),
        bulk("1700000000000"),
        bulk(&h_token.to_string()),
        bulk(status),
        h_meta.value.as_deref().map_or(Value::Nil, bulk),
    ]);
    let (w_owner, w_mode, w_meta) = (c.uuid(), c.mode(), c.meta());
    let info = format!(
        "{}\n{}\n{}\n{}",
        w_mode.as_str(),
        w_meta.client_id,
        w_meta.host,
        w_meta.pid
    );
    let waiter = Value::Array(vec![bulk(&w_owner), bulk(&info)]);
    let answer = Value::Array(vec![
        bulk(k),
        Value::Int(i64::from(permits)),
        Value::Array(vec![holder]),
        Value::Array(vec![waiter]),
    ]);
    let got = r::parse_describe(&name, &answer)
        .unwrap_or_else(|e| panic!("well-formed answer refused: {e}"))
        .expect("a lock");
    assert_eq!(got.kind, kind);
    let h = &got.holders[0];
    assert_eq!(
        (&h.owner, h.mode, &h.meta, h.token, h.status.as_str()),
        (&h_owner, h_mode, &h_meta, Some(h_token), status)
    );
    assert_eq!(h.lease_left_ms, Some(1500));
    let w = &got.waiters[0];
    // The waiter's info has no value, and its fields are newline-separated: a host with a
    // newline is not expected back.
    if !w_meta.client_id.contains('\n') && !w_meta.host.contains('\n') {
        let want = dlock::HolderMeta {
            value: None,
            ..w_meta
        };
        assert_eq!((&w.owner, w.mode, &w.meta), (&w_owner, w_mode, &want));
    }
}

/// SQL rows (`sql_rows`): a name's rows as read for a grant, and the rows `describe` lists.
/// Rows are refused (`Backend` error, no decision taken) exactly when a live row holds a value
/// no dlock writes; accepted rows decode to what they say; the columns dlock writes decode back
/// to their kind; a PostgreSQL hand-off notification is taken only in the form dlock sends.
#[cfg(all(
    feature = "__fuzz",
    any(feature = "postgres", feature = "mysql", feature = "sqlite")
))]
pub fn sql_rows(data: &[u8]) {
    use dlock::__fuzz::sql;
    use dlock::{LockKind, Mode};
    const KINDS: &[&str] = &["mutex", "rwlock", "semaphore"];
    const MODES: &[&str] = &["exclusive", "shared"];
    let kind_of = |k: &str, permits: i64| match k {
        "mutex" => Some(LockKind::Mutex),
        "rwlock" => Some(LockKind::RwLock),
        "semaphore" => u32::try_from(permits)
            .ok()
            .filter(|p| *p > 0)
            .map(|permits| LockKind::Semaphore { permits }),
        _ => None,
    };
    let mode_of = |m: &str| match m {
        "exclusive" => Some(Mode::Exclusive),
        "shared" => Some(Mode::Shared),
        _ => None,
    };
    let small = |c: &mut Cursor<'_>| match c.byte() % 4 {
        0 => c.i64(),
        b => i64::from(b) * 1000 - 1500,
    };

    #[cfg(feature = "postgres")]
    {
        let line = String::from_utf8_lossy(line_and_rest(data).0);
        if let Some((token, owner, name)) = sql::parse_handed(&line) {
            assert_eq!(format!("{token} {owner} {name}"), line, "hand-off");
        }
    }

    let mut c = Cursor(data);
    let now = 1000;
    // A name's state.
    let n = c.byte() % 6;
    let mut rows: Vec<sql::StateRow> = Vec::new();
    for _ in 0..n {
        let part = c.word(&["f", "h", "q"]);
        let owner = c.uuid();
        let kind = c.word(KINDS);
        let permits = small(&mut c);
        let mode = c.word(MODES);
        let ord = small(&mut c);
        let expires = small(&mut c);
        rows.push((part, owner, kind, permits, mode, ord, expires));
    }
    let mut want_holds = Vec::new();
    let mut want_queue = Vec::new();
    let mut fence = None;
    let mut ok = true;
    for (part, owner, kind, permits, mode, ord, expires) in &rows {
        match part.as_str() {
            "f" => fence = Some(*ord),
            _ if *expires <= now => {}
            "h" => match (kind_of(kind, *permits), mode_of(mode), u64::try_from(*ord)) {
                (Some(k), Some(m), Ok(t)) => want_holds.push((owner.clone(), k, m, t)),
                _ => ok = false,
            },
            _ => match mode_of(mode) {
                Some(m) => want_queue.push((owner.clone(), m)),
                None => ok = false,
            },
        }
    }
    match sql::load(rows.clone(), now) {
        Ok(got) => {
            assert!(ok, "corrupt rows accepted: {rows:?}");
            assert_eq!(got, (want_holds, want_queue, fence));
        }
        Err(dlock::Error::Backend(e)) => {
            assert!(!ok, "rows refused: {rows:?}: {e}");
            assert!(e.to_string().len() <= 1024);
        }
        Err(e) => panic!("rows: not a Backend error: {e:?}"),
    }

    // The columns dlock writes read back.
    let (kind, mode) = (c.lock_kind(), c.mode());
    let (k, permits) = sql::kind_columns(kind);
    let row = (
        "h".to_owned(),
        "o".to_owned(),
        k.to_owned(),
        permits,
        mode.as_str().to_owned(),
        7,
        now + 1,
    );
    let got = sql::load(vec![row], now).expect("dlock's own row");
    assert_eq!(got.0, vec![("o".to_owned(), kind, mode, 7)]);

    // `describe`'s listing.
    let prefix = c.text(2);
    let names: Vec<String> = (0..3).map(|_| c.text(3)).collect();
    let mut holds: Vec<sql::HoldListing> = Vec::new();
    for _ in 0..c.byte() % 4 {
        let pick = c.byte() as usize % names.len();
        let status = [
            dlock::HoldStatus::Held,
            dlock::HoldStatus::Detached,
            dlock::HoldStatus::Revoked,
        ][c.byte() as usize % 3];
        let state = match c.byte() % 5 {
            0 => small(&mut c),
            _ => sql::state_column(status),
        };
        holds.push((
            names[pick].clone(),
            c.uuid(),
            c.word(KINDS),
            small(&mut c),
            c.word(MODES),
            small(&mut c),
            small(&mut c),
            small(&mut c),
            c.text(8),
            c.text(8),
            small(&mut c),
            state,
            (c.byte() % 2 == 0).then(|| c.text(8)),
        ));
    }
    let mut queue: Vec<sql::WaiterListing> = Vec::new();
    for _ in 0..c.byte() % 4 {
        let pick = c.byte() as usize % names.len();
        queue.push((
            names[pick].clone(),
            c.uuid(),
            c.word(MODES),
            c.text(8),
            c.text(8),
            small(&mut c),
        ));
    }
    let listed: Vec<&String> = holds
        .iter()
        .map(|h| &h.0)
        .filter(|n| n.starts_with(&prefix))
        .collect();
    let holds_ok = holds.iter().filter(|h| h.0.starts_with(&prefix)).all(|h| {
        kind_of(&h.2, h.3).is_some()
            && mode_of(&h.4).is_some()
            && h.5 >= 0
            && (0..=2).contains(&h.11)
            && u32::try_from(h.10).is_ok()
    });
    let queue_ok = queue
        .iter()
        .filter(|w| listed.contains(&&w.0))
        .all(|w| mode_of(&w.2).is_some() && u32::try_from(w.5).is_ok());
    // (A 13-column row has no Debug.)
    let shown: Vec<String> = holds
        .iter()
        .map(|h| {
            format!(
                "{:?}",
                (
                    (&h.0, &h.1, &h.2, h.3, &h.4, h.5),
                    (h.6, h.7, &h.8, &h.9, h.10, h.11, &h.12)
                )
            )
        })
        .collect();
    match sql::listing(&prefix, now, holds.clone(), queue.clone()) {
        Ok(locks) => {
            assert!(
                holds_ok && queue_ok,
                "corrupt listing accepted: {shown:?} {queue:?}"
            );
            let total: usize = locks.iter().map(|l| l.holders.len()).sum();
            assert_eq!(total, listed.len());
            for l in &locks {
                assert!(l.name.starts_with(&prefix) && valid_kind(l.kind));
                assert!(l.holders.iter().all(|h| h.token.is_some()));
            }
        }
        Err(dlock::Error::Backend(e)) => {
            assert!(
                !(holds_ok && queue_ok),
                "listing refused: {shown:?} {queue:?}: {e}"
            );
            assert!(e.to_string().len() <= 1024);
        }
        Err(e) => panic!("listing: not a Backend error: {e:?}"),
    }
}
