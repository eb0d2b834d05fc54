//! Input validation, hostile names, describe and list.

use super::*;

// ---- 15 -----------------------------------------------------------------------------------------

/// `prefix` + as many `unit`s as fit + `x` padding + `tail`, exactly `len` bytes.
fn padded(prefix: &str, unit: &str, tail: &str, len: usize) -> String {
    let mut s = prefix.to_string();
    while s.len() + unit.len() + tail.len() <= len {
        s.push_str(unit);
    }
    while s.len() + tail.len() < len {
        s.push('x');
    }
    s.push_str(tail);
    assert_eq!(s.len(), len, "{s:?}");
    s
}

/// Bad names, leases, permits and URLs are refused with the right error; hostile but valid
/// names work and never meet each other (in acquisition, describe and list).
pub async fn bad_input(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);

    let long = "x".repeat(256);
    let long_utf8 = "é".repeat(128);
    for (label, bad) in [
        ("empty", ""),
        ("256-byte", long.as_str()),
        ("256-byte UTF-8", long_utf8.as_str()),
        ("NUL-containing", "a\0b"),
    ] {
        assert_err!(c1.mutex(bad), Error::InvalidName(_), "mutex({label} name)");
        assert_err!(
            c1.rwlock(bad),
            Error::InvalidName(_),
            "rwlock({label} name)"
        );
        assert_err!(
            c1.semaphore(bad, 2),
            Error::InvalidName(_),
            "semaphore({label} name)"
        );
        assert_err!(
            within(STEP, "describe", c1.describe(bad)).await,
            Error::InvalidName(_),
            "describe({label} name)"
        );
        assert_err!(
            within(
                STEP,
                "force_release",
                c1.force_release(bad, crate::Force::Revoke)
            )
            .await,
            Error::InvalidName(_),
            "force_release({label} name)"
        );
    }
    assert_err!(
        within(STEP, "list", c1.list("a\0")).await,
        Error::InvalidName(_),
        "list(prefix with NUL)"
    );

    let name = s.name("bad-lease");
    for (label, lease) in [
        ("0", Duration::ZERO),
        ("50 ms", ms(50)),
        ("over the maximum", crate::MAX_LEASE + secs(1)),
    ] {
        let m = c1.mutex(&name).expect(NAME_OK).lease(lease);
        assert_err!(
            within(STEP, "acquire", m.acquire()).await,
            Error::InvalidConfig(_),
            "mutex lease {label}: acquire"
        );
        assert_err!(
            within(STEP, "try_acquire", m.try_acquire()).await,
            Error::InvalidConfig(_),
            "mutex lease {label}: try_acquire"
        );
        assert_err!(
            within(STEP, "acquire_timeout", m.acquire_timeout(ms(100))).await,
            Error::InvalidConfig(_),
            "mutex lease {label}: acquire_timeout"
        );
        let rw = c1.rwlock(&name).expect(NAME_OK).lease(lease);
        assert_err!(
            within(STEP, "read", rw.read()).await,
            Error::InvalidConfig(_),
            "rwlock lease {label}: read"
        );
        assert_err!(
            within(STEP, "write", rw.write()).await,
            Error::InvalidConfig(_),
            "rwlock lease {label}: write"
        );
        let sem = c1.semaphore(&name, 2).expect(NAME_OK).lease(lease);
        assert_err!(
            within(STEP, "acquire", sem.acquire()).await,
            Error::InvalidConfig(_),
            "semaphore lease {label}: acquire"
        );
        assert_err!(
            within(
                STEP,
                "connect with a default lease",
                s.connect(ClientOptions::default().lease(lease))
            )
            .await,
            Error::InvalidConfig(_),
            "connect with default lease {label}"
        );
    }
    assert!(
        describe(&c1, &name).await.is_none(),
        "refused acquisitions left a hold behind"
    );
    assert_err!(
        c1.semaphore(&name, 0),
        Error::InvalidConfig(_),
        "semaphore with 0 permits"
    );
    for url in [
        "nope://x",
        "sqlite://host/x",
        "",
        "mem",
        "://x",
        "sqlite:///",
    ] {
        assert_err!(
            within(STEP, "connect", crate::connect(url)).await,
            Error::InvalidConfig(_),
            "connect({url:?})"
        );
    }

    // Hostile but valid names: each its own lock.
    let p = format!("conf/{}/", s.id);
    let mut names: Vec<String> = [
        "../x",
        "../../../../etc/passwd",
        "./x",
        "x/..",
        "/",
        "//",
        "%",
        "%%",
        "%41",
        "A",
        "a",
        "ab",
        "_",
        "a_c",
        "abc",
        "'",
        "\"",
        "'; DROP TABLE x; --",
        "\"; DROP TABLE locks; --",
        "\\",
        "\\'",
        "{a}",
        "{a}b",
        "*",
        "?",
        "[ab]",
        "lock",
        "LOCK",
        "lock ",
        " lock",
        "é",
        "e\u{301}",
        "🔒",
        "🔒🔑",
        "line\nbreak",
        "tab\tx",
        "\u{7f}",
        "$(touch x)",
        ";ls",
        "a:b",
        "a.b",
        "a b",
    ]
    .iter()
    .map(|n| format!("{p}{n}"))
    .collect();
    names.push(padded(&p, "a", "1", 255));
    names.push(padded(&p, "a", "2", 255));
    names.push(padded(&p, "🔒", "", 255));
    names.push(padded(&p, "é", "", 255));
    names.push(padded(&p, "é", "", 254));
    let distinct: BTreeSet<&String> = names.iter().collect();
    assert_eq!(
        distinct.len(),
        names.len(),
        "the test's own names must be distinct"
    );

    let mut guards = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let m = c1
            .mutex(n.as_str())
            .unwrap_or_else(|e| panic!("mutex({n:?}): {e:?}"));
        match within(STEP, format!("try_acquire({n:?})"), m.try_acquire()).await {
            Ok(g) => guards.push(g),
            Err(Error::Busy { .. }) => panic!(
                "{n:?} is busy although only other names are held: it collides with one of {:?}",
                &names[..i]
            ),
            Err(e) => panic!("try_acquire({n:?}): {e:?}"),
        }
    }
    for (n, g) in names.iter().zip(&guards) {
        assert_err!(
            within(
                STEP,
                "try_acquire",
                c2.mutex(n.as_str()).expect(NAME_OK).try_acquire()
            )
            .await,
            Error::Busy { .. },
            "another client's try_acquire({n:?}) while it is held"
        );
        let info = describe(&c2, n)
            .await
            .unwrap_or_else(|| panic!("describe({n:?}) of a held lock answered None"));
        assert_eq!(&info.name, n, "describe({n:?}) described another name");
        assert_eq!(
            info.holders.len(),
            1,
            "describe({n:?}) holders: {:?}",
            info.holders
        );
        assert_eq!(
            info.holders[0].owner,
            g.owner(),
            "describe({n:?}) shows another name's holder"
        );
        assert_eq!(info.holders[0].token, g.token(), "describe({n:?}) token");
    }
    let prefixes: Vec<String> = [
        "", "%", "_", "a_c", "[ab]", "*", "?", "lock", "'", "\\", "{a}", "..", "a", "é", "🔒",
    ]
    .iter()
    .map(|x| format!("{p}{x}"))
    .collect();
    for prefix in &prefixes {
        let listed: Vec<String> = must(format!("list({prefix:?})"), c2.list(prefix))
            .await
            .into_iter()
            .map(|i| i.name)
            .collect();
        let mut expected: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with(prefix.as_str()))
            .cloned()
            .collect();
        expected.sort();
        assert_eq!(
            listed, expected,
            "list({prefix:?}) must list exactly the names starting with it, sorted"
        );
    }
    for (n, g) in names.iter().zip(guards) {
        must(format!("release({n:?})"), g.release()).await;
    }
    let left = must("list after releasing everything", c2.list(&p)).await;
    assert!(
        left.is_empty(),
        "locks still listed after every release: {left:?}"
    );
    // A hostile name works for the other primitives too.
    let n = format!("{p}'; DROP TABLE x; --");
    if s.caps.mutex_only {
        assert_unsupported("rwlock", c1.rwlock(n.as_str()).expect(NAME_OK).read()).await;
        assert_unsupported(
            "semaphore",
            c1.semaphore(n.as_str(), 1).expect(NAME_OK).acquire(),
        )
        .await;
        return;
    }
    let r = must(
        "read on a hostile name",
        c1.rwlock(n.as_str()).expect(NAME_OK).read(),
    )
    .await;
    must("release", r.release()).await;
    let p1 = must(
        "permit on a hostile name",
        c1.semaphore(n.as_str(), 1).expect(NAME_OK).acquire(),
    )
    .await;
    must("release", p1.release()).await;
}

// ---- 16 -----------------------------------------------------------------------------------------

/// describe shows who holds (owner, client, host, pid, token, mode, lease left) and what kind;
/// list(prefix) lists exactly the held locks under the prefix, sorted.
pub async fn describe_shows_holders(s: Store) {
    let (c1, c2) = (s.client().await, s.client().await);
    let validity = c1.capabilities().validity;
    let lease = secs(5);
    let m = s.name("described/m");
    let rw = s.name("described/rw");
    let sem = s.name("other/sem");
    assert!(
        describe(&c1, &m).await.is_none(),
        "a lock nobody took is described"
    );

    let g = must(
        "mutex acquire",
        c1.mutex(&m).expect(NAME_OK).lease(lease).acquire(),
    )
    .await;
    let info = describe(&c2, &m).await.expect("a held mutex is described");
    assert_eq!(info.name, m);
    assert_eq!(info.kind, LockKind::Mutex);
    assert!(info.waiters.is_empty(), "waiters: {:?}", info.waiters);
    assert_eq!(info.holders.len(), 1, "holders: {:?}", info.holders);
    let h = &info.holders[0];
    assert_eq!(h.owner, g.owner(), "holder owner");
    assert_eq!(h.meta.client_id, c1.id(), "holder client id");
    assert_eq!(h.meta.host, hostname(), "holder host");
    assert_eq!(h.meta.pid, std::process::id(), "holder pid");
    assert_eq!(h.token, g.token(), "holder token");
    assert_eq!(h.mode, Mode::Exclusive, "holder mode");
    match (validity, h.lease_left_ms) {
        (Validity::Lease, Some(left)) => assert!(
            left > 0 && left <= lease.as_millis() as u64,
            "lease_left_ms = {left}, expected in (0, {}]",
            lease.as_millis()
        ),
        (Validity::Lease, None) => panic!("a lease store describes a hold without lease_left_ms"),
        (Validity::Session, _) => {}
    }
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64;
    assert!(
        h.acquired_at_ms.abs_diff(now_ms) < 60_000,
        "acquired_at_ms = {} is not about now ({now_ms})",
        h.acquired_at_ms
    );

    let r1 = must("read 1", c1.rwlock(&rw).expect(NAME_OK).read()).await;
    let r2 = must("read 2", c2.rwlock(&rw).expect(NAME_OK).read()).await;
    let info = describe(&c1, &rw)
        .await
        .expect("a read-held rwlock is described");
    assert_eq!(info.kind, LockKind::RwLock);
    assert_eq!(info.holders.len(), 2, "holders: {:?}", info.holders);
    assert!(
        info.holders.iter().all(|h| h.mode == Mode::Shared),
        "modes: {:?}",
        info.holders
    );
    let owners: BTreeSet<&str> = info.holders.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(
        owners,
        BTreeSet::from([r1.owner(), r2.owner()]),
        "reader owners"
    );
    let clients: BTreeSet<&str> = info
        .holders
        .iter()
        .map(|h| h.meta.client_id.as_str())
        .collect();
    assert_eq!(
        clients,
        BTreeSet::from([c1.id(), c2.id()]),
        "reader clients"
    );

    let p = must("permit", c2.semaphore(&sem, 3).expect(NAME_OK).acquire()).await;
    let info = describe(&c1, &sem)
        .await
        .expect("a held semaphore is described");
    assert_eq!(info.kind, LockKind::Semaphore { permits: 3 });
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].mode, Mode::Shared);

    let root = format!("conf/{}/", s.id);
    let names = |v: Vec<crate::LockInfo>| v.into_iter().map(|i| i.name).collect::<Vec<_>>();
    assert_eq!(
        names(must("list(root)", c1.list(&root)).await),
        [m.as_str(), rw.as_str(), sem.as_str()]
    );
    assert_eq!(
        names(must("list(described/)", c2.list(&format!("{root}described/"))).await),
        [m.as_str(), rw.as_str()]
    );
    assert_eq!(
        names(must("list(other/)", c2.list(&format!("{root}other/"))).await),
        [sem.as_str()]
    );
    assert_eq!(
        names(must("list(described/r)", c2.list(&format!("{root}described/r"))).await),
        [rw.as_str()]
    );
    assert!(must("list(nothing/)", c2.list(&format!("{root}nothing/")))
        .await
        .is_empty());
    let everything = names(must("list(\"\")", c1.list("")).await);
    for n in [&m, &rw, &sem] {
        assert!(everything.contains(n), "list(\"\") misses {n:?}");
    }

    must("release", g.release()).await;
    assert!(
        describe(&c2, &m).await.is_none(),
        "a released lock is still described"
    );
    assert_eq!(
        names(must("list(described/)", c2.list(&format!("{root}described/"))).await),
        [rw.as_str()]
    );
    must("release", r1.release()).await;
    must("release", r2.release()).await;
    must("release", p.release()).await;
    assert!(must("list(root)", c1.list(&root)).await.is_empty());
}
