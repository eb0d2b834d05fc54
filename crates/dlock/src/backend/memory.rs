//! The in-process store (`mem://` and `mem://NAME`).
//!
//! Every client of the same process that connects to the same `mem://NAME` shares one store
//! (`mem://` is the store named ""). Holds are leases on the monotonic clock; waiters are woken by
//! an in-process notification per name. Nothing survives the process. Meant for tests and for
//! locking between tasks of one process with the same API as the distributed stores.

use super::logic::{decide, Decision, LiveHold, LiveWaiter};
use super::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};

#[derive(Debug)]
struct MemHold {
    owner: String,
    kind: LockKind,
    mode: Mode,
    token: u64,
    expires: Instant,
    acquired_at_ms: u64,
    meta: HolderMeta,
    status: HoldStatus,
}

#[derive(Debug)]
struct MemWaiter {
    owner: String,
    mode: Mode,
    expires: Instant,
    meta: HolderMeta,
}

#[derive(Debug, Default)]
struct Entry {
    holds: Vec<MemHold>,
    /// Queue places by arrival sequence.
    queue: BTreeMap<u64, MemWaiter>,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<String, Entry>,
    fences: HashMap<String, u64>,
    next_seq: u64,
}

impl State {
    /// Extends `r` to its lease (`detach`: for the last time, see [`Backend::detach`]).
    fn extend(&mut self, r: &HoldRef<'_>, now: Instant, detach: bool) -> Extended {
        let found = self.locks.get_mut(r.name.as_str()).and_then(|e| {
            e.holds
                .iter_mut()
                .find(|h| h.owner == r.owner && h.expires > now)
        });
        match found {
            Some(h) if h.status == HoldStatus::Revoked => Extended::Revoked,
            Some(h) => {
                h.expires = now + r.lease;
                if detach {
                    h.status = HoldStatus::Detached;
                }
                Extended::Held { valid_for: r.lease }
            }
            None => Extended::Gone,
        }
    }

    fn prune(&mut self, name: &str, now: Instant) {
        if let Some(e) = self.locks.get_mut(name) {
            e.holds.retain(|h| h.expires > now);
            e.queue.retain(|_, w| w.expires > now);
            if e.holds.is_empty() && e.queue.is_empty() {
                self.locks.remove(name);
            }
        }
    }

    fn decide(&self, req: &Request<'_>, now: Instant) -> Result<Decision> {
        let fence = self.fences.get(req.name.as_str()).copied().unwrap_or(0);
        let Some(e) = self.locks.get(req.name.as_str()) else {
            return decide(req, &[], &[], fence);
        };
        let holds: Vec<LiveHold<'_>> = e
            .holds
            .iter()
            .filter(|h| h.expires > now)
            .map(|h| LiveHold {
                // A revoked hold is nobody's any more (no re-grant), yet it keeps others out.
                owner: if h.status == HoldStatus::Revoked {
                    ""
                } else {
                    &h.owner
                },
                kind: h.kind,
                mode: h.mode,
                token: Some(h.token),
                expires_in: h.expires - now,
            })
            .collect();
        let queue: Vec<LiveWaiter<'_>> = e
            .queue
            .values()
            .filter(|w| w.expires > now)
            .map(|w| LiveWaiter {
                owner: &w.owner,
                mode: w.mode,
            })
            .collect();
        decide(req, &holds, &queue, fence)
    }
}

/// The in-process store. Obtain it with `dlock::connect("mem://")`.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
}

/// One named store: its state (its waiters are woken by the core's in-process wake-ups).
#[derive(Debug, Default)]
struct Shared {
    name: String,
    state: StdMutex<State>,
}

fn registry() -> &'static StdMutex<HashMap<String, Weak<Shared>>> {
    static R: OnceLock<StdMutex<HashMap<String, Weak<Shared>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl MemoryBackend {
    /// The process-wide store named `name` (created on first use, dropped with its last client).
    pub fn named(name: &str) -> Self {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shared) = reg.get(name).and_then(Weak::upgrade) {
            return MemoryBackend { shared };
        }
        reg.retain(|_, w| w.strong_count() > 0);
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            state: StdMutex::default(),
        });
        reg.insert(name.to_owned(), Arc::downgrade(&shared));
        MemoryBackend { shared }
    }

    /// The store name of a `mem://NAME` URL (`mem://` is the store named "").
    pub(crate) fn parse_url(raw: &str) -> Result<String> {
        let u = crate::url::parse_plain(raw, "mem")?;
        let mut name = u.host_str().unwrap_or("").to_string();
        name.push_str(u.path().trim_start_matches('/'));
        Ok(name)
    }

    /// The store of a `mem://NAME` URL.
    pub fn connect(url: &str) -> Result<Self> {
        Ok(Self::named(&Self::parse_url(url)?))
    }

    fn attempt_now(&self, req: &Request<'_>) -> Result<Attempt> {
        let now = crate::clock::now();
        let mut st = self.lock();
        let name = req.name.as_str();
        st.prune(name, now);
        let decision = st.decide(req, now)?;
        match decision {
            Decision::Regrant { token } => {
                if let Some(e) = st.locks.get_mut(name) {
                    for h in e.holds.iter_mut().filter(|h| h.owner == req.owner) {
                        h.expires = now + req.lease;
                    }
                }
                Ok(Attempt::Granted(Grant {
                    token,
                    valid_for: req.lease,
                }))
            }
            Decision::Grant { token } => {
                st.fences.insert(name.to_owned(), token);
                let e = st.locks.entry(name.to_owned()).or_default();
                e.queue.retain(|_, w| w.owner != req.owner);
                e.holds.push(MemHold {
                    owner: req.owner.to_owned(),
                    kind: req.kind,
                    mode: req.mode,
                    token,
                    expires: now + req.lease,
                    acquired_at_ms: crate::clock::unix_ms(),
                    meta: req.meta.clone(),
                    status: HoldStatus::Held,
                });
                Ok(Attempt::Granted(Grant {
                    token: Some(token),
                    valid_for: req.lease,
                }))
            }
            Decision::Busy { retry_in, enqueue } => {
                if enqueue {
                    let seq = st.next_seq;
                    let e = st.locks.entry(name.to_owned()).or_default();
                    let expires = now + QUEUE_PLACE_TTL;
                    let mut added = false;
                    match e.queue.values_mut().find(|w| w.owner == req.owner) {
                        Some(w) => w.expires = expires,
                        None => {
                            e.queue.insert(
                                seq,
                                MemWaiter {
                                    owner: req.owner.to_owned(),
                                    mode: req.mode,
                                    expires,
                                    meta: req.meta.clone(),
                                },
                            );
                            added = true;
                        }
                    }
                    if added {
                        st.next_seq += 1;
                    }
                }
                Ok(Attempt::Busy(Busy { retry_in }))
            }
        }
    }

    fn cancel_now(&self, req: &Request<'_>) {
        let mut st = self.lock();
        let name = req.name.as_str();
        if let Some(e) = st.locks.get_mut(name) {
            e.queue.retain(|_, w| w.owner != req.owner);
        }
        st.prune(name, crate::clock::now());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave State half-updated in a way that matters
        // more than losing the process, so a poisoned lock is used as is.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            values: true,
            ..Capabilities::lease(Wakeups::Native)
        }
    }

    fn begin(&self, req: &Request<'_>) -> Box<dyn Acquisition> {
        Box::new(MemAcquisition {
            store: self.clone(),
            want: Want::new(req),
        })
    }

    fn shared_key(&self) -> Option<String> {
        Some(format!("mem:{}", self.shared.name))
    }

    async fn release(&self, hold: &HoldRef<'_>) -> Result<Released> {
        let now = crate::clock::now();
        let mut st = self.lock();
        let name = hold.name.as_str();
        let released = match st.locks.get_mut(name) {
            Some(e) => {
                let before = e.holds.len();
                e.holds
                    .retain(|h| !(h.owner == hold.owner && h.expires > now));
                before != e.holds.len()
            }
            None => false,
        };
        st.prune(name, now);
        drop(st);
        if released {
            Ok(Released::Released)
        } else {
            Ok(Released::NotHeld)
        }
    }

    async fn set_value(&self, hold: &HoldRef<'_>, value: &str) -> Result<Released> {
        let now = crate::clock::now();
        let mut st = self.lock();
        // A revoked hold is nobody's any more: it gets no new value.
        let found = st.locks.get_mut(hold.name.as_str()).and_then(|e| {
            e.holds.iter_mut().find(|h| {
                h.owner == hold.owner && h.expires > now && h.status != HoldStatus::Revoked
            })
        });
        Ok(match found {
            Some(h) => {
                h.meta.value = Some(value.to_owned());
                Released::Released
            }
            None => Released::NotHeld,
        })
    }

    async fn extend(&self, holds: &[HoldRef<'_>], detach: bool) -> Result<Vec<Extended>> {
        let now = crate::clock::now();
        let mut st = self.lock();
        Ok(holds.iter().map(|r| st.extend(r, now, detach)).collect())
    }

    async fn describe(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let now = crate::clock::now();
        let st = self.lock();
        let mut out: Vec<LockInfo> = st
            .locks
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .filter_map(|(name, e)| {
                let holds: Vec<&MemHold> = e.holds.iter().filter(|h| h.expires > now).collect();
                let kind = holds.first().map(|h| h.kind)?;
                Some(LockInfo {
                    name: name.clone(),
                    kind,
                    holders: holds
                        .iter()
                        .map(|h| HolderInfo {
                            owner: h.owner.clone(),
                            meta: h.meta.clone(),
                            mode: h.mode,
                            token: Some(h.token),
                            acquired_at_ms: h.acquired_at_ms,
                            lease_left_ms: Some((h.expires - now).as_millis() as u64),
                            status: h.status,
                        })
                        .collect(),
                    waiters: e
                        .queue
                        .values()
                        .filter(|w| w.expires > now)
                        .enumerate()
                        .map(|(i, w)| WaiterInfo {
                            owner: w.owner.clone(),
                            meta: w.meta.clone(),
                            mode: w.mode,
                            position: i as u32,
                        })
                        .collect(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn force_release(&self, name: &LockName, how: Force) -> Result<Forced> {
        let now = crate::clock::now();
        let mut st = self.lock();
        st.prune(name.as_str(), now);
        let mut out = Forced::default();
        if let Some(e) = st.locks.get_mut(name.as_str()) {
            let before = e.holds.len() as u64;
            match how {
                Force::Break => {
                    e.holds.clear();
                    e.queue.clear();
                }
                Force::Revoke => {
                    e.holds.retain(|h| h.status != HoldStatus::Detached);
                    for h in &mut e.holds {
                        h.status = HoldStatus::Revoked;
                    }
                    out.revoked = e.holds.len() as u64;
                    out.revoked_lease_left_ms = e
                        .holds
                        .iter()
                        .map(|h| (h.expires - now).as_millis() as u64)
                        .max();
                }
            }
            out.removed = before - e.holds.len() as u64;
        }
        st.prune(name.as_str(), now);
        drop(st);
        Ok(out)
    }
}

/// One acquisition on the in-process store. Its waiters are woken by the core (every release
/// of the store happens in this process) or when the blocking lease runs out.
struct MemAcquisition {
    store: MemoryBackend,
    want: Want,
}

#[async_trait::async_trait]
impl Acquisition for MemAcquisition {
    async fn attempt(&mut self) -> Result<Attempt> {
        self.store.attempt_now(&self.want.req())
    }

    async fn changed(&mut self, _busy: &Busy, until: Instant) -> Result<Watch> {
        tokio::time::sleep_until(until.into()).await;
        Ok(Watch::Recheck)
    }

    /// Every change of the store happens in this process: the core's in-process wake-ups
    /// report it; `changed` only waits for the deadline.
    fn mark(&mut self) -> bool {
        true
    }

    async fn look(&mut self) -> Result<Option<Look>> {
        let free = !matches!(
            self.store
                .lock()
                .decide(&self.want.req(), crate::clock::now()),
            Ok(Decision::Busy { .. })
        );
        Ok(Some(if free {
            Look::Free
        } else {
            Look::Busy {
                state: 0,
                place: None,
            }
        }))
    }

    async fn cancel(&mut self) -> Result<()> {
        self.store.cancel_now(&self.want.req());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_support::check_values;

    #[tokio::test]
    async fn set_value_replaces_the_holders_value_only() {
        let b = MemoryBackend::named("test-set-value");
        check_values(&b, "mem-values", true).await;
    }
}
