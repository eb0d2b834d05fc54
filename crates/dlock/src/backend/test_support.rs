//! Request builders the stores' own tests share.

use super::*;

/// A lease long enough that nothing expires during a test.
pub(crate) const LONG: Duration = Duration::from_secs(30);

pub(crate) fn meta(id: &str) -> HolderMeta {
    HolderMeta {
        client_id: id.into(),
        host: "testhost".into(),
        pid: 42,
    }
}

pub(crate) fn name(n: &str) -> LockName {
    LockName::new(n).unwrap()
}

/// A plain (unfair, try) mutex request with a long lease.
pub(crate) fn rq<'a>(name: &'a LockName, owner: &'a str, meta: &'a HolderMeta) -> Request<'a> {
    Request {
        name,
        kind: LockKind::Mutex,
        mode: Mode::Exclusive,
        owner,
        lease: LONG,
        fair: false,
        waiting: false,
        meta,
    }
}

/// The hold a request would make.
pub(crate) fn hr<'a>(r: &Request<'a>) -> HoldRef<'a> {
    HoldRef {
        name: r.name,
        kind: r.kind,
        mode: r.mode,
        owner: r.owner,
        lease: r.lease,
    }
}

/// The token of a grant; panics on busy.
pub(crate) fn token(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(g) => g.token.expect("a grant with a fencing token"),
        Attempt::Busy(b) => panic!("expected a grant, got busy {b:?}"),
    }
}

/// The busy answer; panics on a grant.
pub(crate) fn busy(a: Attempt) -> Busy {
    match a {
        Attempt::Busy(b) => b,
        Attempt::Granted(g) => panic!("expected busy, got {g:?}"),
    }
}
