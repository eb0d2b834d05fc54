//! The pub/sub side: one connection per client, one subscription per name that has waiters
//! (dropped when idle), and the waits on a name's release channel.

use super::{lock, RedisBackend, Seen, Shared};
use crate::backend::Watch;
use crate::error::{Error, Result};
use ::redis::aio::{MultiplexedConnection, PubSubSink};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{PushInfo, PushKind, RedisResult, Value};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A subscription without waiters for this long is dropped.
const SUBSCRIPTION_IDLE: Duration = Duration::from_secs(30);
/// How often idle subscriptions are looked for.
const JANITOR_EVERY: Duration = Duration::from_secs(10);
/// How long an observer's mark on a name (`base:obs`) lives without being kept, and how often
/// an observer keeps it (an observer looks at least every 5 s: `election::NATIVE_SAFETY_NET`).
const OBSERVED_TTL: Duration = Duration::from_secs(30);
const OBSERVED_KEEP: Duration = Duration::from_secs(10);
/// While the pub/sub connection is down: the longest a waiter sleeps between attempts, and the
/// shortest interval between two attempts to reconnect it.
pub(super) const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// The subscription of one name's channels.
#[derive(Debug)]
struct Sub {
    /// The pub/sub connection generation it was made on.
    generation: u64,
    /// Messages that may let a waiter in: releases, cancels, force-releases (`base:released`)
    /// and hand-offs to this client's waiters.
    count: u64,
    /// Messages only an observer cares about (`base:changed`: a hand-off, a new value).
    changes: u64,
    /// Whether `base:changed` is subscribed too (an observer watches the name).
    observed: bool,
    /// Tasks waiting on it.
    waiters: usize,
    last_used: Instant,
    /// When this client last made or kept the name's observer mark.
    marked: Option<Instant>,
}

/// What a channel of a name carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chan {
    /// `base:released`.
    Released,
    /// `base:changed`.
    Changed,
    /// This client's `base:handoff:<client key>`.
    Handoff,
}

#[derive(Debug, Default)]
pub(super) struct Subs {
    /// By lock name.
    by_name: HashMap<String, Sub>,
    /// Channel → lock name, and what the channel carries.
    names: HashMap<String, (String, Chan)>,
}

/// The live pub/sub connection.
pub(super) struct Link {
    generation: u64,
    /// The command connection's [`Conn::epoch`] when it was made: a Sentinel failover since means
    /// it listens to a server that is no longer the master.
    epoch: u64,
    sink: Sink,
    /// Dropping it stops the janitor of this link and, on RESP2, the task reading its messages.
    _stop: tokio::sync::watch::Sender<()>,
}

/// Where subscriptions are made: a RESP3 connection whose pushes carry the messages (to one
/// server, or on a cluster the sharded ones of every node), or on a server without RESP3 a
/// RESP2 pub/sub connection.
enum Sink {
    Push(MultiplexedConnection),
    Sharded(ClusterConnection),
    Plain(PubSubSink),
}

impl Sink {
    async fn subscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Sink::Push(c) => per_channel(c, "SUBSCRIBE", channels).await,
            Sink::Sharded(c) => per_channel(c, "SSUBSCRIBE", channels).await,
            Sink::Plain(s) => s.subscribe(channels).await,
        }
    }

    async fn unsubscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Sink::Push(c) => per_channel(c, "UNSUBSCRIBE", channels).await,
            Sink::Sharded(c) => per_channel(c, "SUNSUBSCRIBE", channels).await,
            Sink::Plain(s) => s.unsubscribe(channels).await,
        }
    }
}

/// `verb` of each channel as a command of its own, all sent at once. Over RESP3 one command of
/// N channels is answered with N confirmations, of which redis-rs takes only the first as its
/// answer: the others would be taken as the answers of the commands after it.
async fn per_channel<C>(conn: &C, verb: &str, channels: &[String]) -> RedisResult<()>
where
    C: ::redis::aio::ConnectionLike + Clone,
{
    futures_util::future::try_join_all(channels.iter().map(|ch| {
        let mut c = conn.clone();
        async move { ::redis::cmd(verb).arg(ch).exec_async(&mut c).await }
    }))
    .await
    .map(|_| ())
}

/// One event of a link.
enum Event {
    /// A message on this channel, with its payload.
    Message(String, Vec<u8>),
    /// The server dropped this subscription (its slot moved to another node).
    Dropped(String),
    /// The connection is gone: on a cluster only one node's (redis-rs subscribes again when it
    /// is back; messages in between are lost), otherwise the whole link.
    Disconnected,
    /// Nothing to do.
    Other,
}

impl Event {
    /// The event a RESP3 push is.
    fn of_push(p: PushInfo) -> Event {
        let channel = || match p.data.first() {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        };
        match p.kind {
            PushKind::SMessage | PushKind::Message => {
                let payload = match p.data.get(1) {
                    Some(Value::BulkString(b)) => b.clone(),
                    _ => Vec::new(),
                };
                channel().map_or(Event::Other, |c| Event::Message(c, payload))
            }
            PushKind::SUnsubscribe => channel().map_or(Event::Other, Event::Dropped),
            PushKind::Disconnection => Event::Disconnected,
            _ => Event::Other,
        }
    }
}

/// Where the RESP3 pushes of link `generation` go: handled on the connection's own task, so a
/// hand-off reaches its waiter without passing through another task.
pub(super) struct Pushes {
    shared: Weak<Shared>,
    generation: u64,
}

impl ::redis::aio::AsyncPushSender for Pushes {
    fn send(&self, info: PushInfo) -> std::result::Result<(), ::redis::aio::SendError> {
        let Some(s) = self.shared.upgrade() else {
            return Err(::redis::aio::SendError);
        };
        s.on_event(self.generation, Event::of_push(info));
        Ok(())
    }
}

impl Shared {
    // ---- pub/sub ----

    /// The (generation, count) of `name`'s subscription, marking it used; an `observer`
    /// counts the messages of `base:changed` too (`None` while that is not subscribed).
    fn sub_state(&self, name: &str, observer: bool) -> Option<(u64, u64)> {
        let mut subs = lock(&self.subs);
        let s = subs.by_name.get_mut(name)?;
        if observer && !s.observed {
            return None;
        }
        s.last_used = Instant::now();
        let count = if observer {
            s.count.wrapping_add(s.changes)
        } else {
            s.count
        };
        Some((s.generation, count))
    }

    /// A message on `channel`: counted for its name, whose waiting tasks look whether it
    /// concerns them. A hand-off ("owner token" on this client's hand-off channel) is given to
    /// the acquisition of that owner, and counts only if it is still waiting.
    fn on_message(&self, channel: &str, payload: &[u8]) {
        let Some((name, chan)) = lock(&self.subs).names.get(channel).cloned() else {
            return;
        };
        if chan == Chan::Handoff && !self.take_handoff(payload) {
            // Not for a waiting acquisition of ours: it gave up, and its cancel passes the lock on.
            return;
        }
        if let Some(s) = lock(&self.subs).by_name.get_mut(&name) {
            if chan == Chan::Changed {
                s.changes = s.changes.wrapping_add(1);
            } else {
                s.count = s.count.wrapping_add(1);
            }
        }
        self.signals.wake(&name);
    }

    /// A subscription the server dropped (its slot moved): forgets it and wakes its waiters,
    /// who subscribe again (on the slot's new node).
    fn on_dropped(&self, channel: &str) {
        let name = {
            let mut subs = lock(&self.subs);
            let Some((name, _)) = subs.names.remove(channel) else {
                return;
            };
            subs.by_name.remove(&name);
            name
        };
        self.signals.wake(&name);
    }

    /// Messages may have been lost: every waiter tries again.
    fn on_gap(&self) {
        let names: Vec<String> = {
            let mut subs = lock(&self.subs);
            for s in subs.by_name.values_mut() {
                s.count = s.count.wrapping_add(1);
            }
            subs.by_name.keys().cloned().collect()
        };
        for n in names {
            self.signals.wake(&n);
        }
    }

    /// Drops the pub/sub connection if the command connection has moved to another master
    /// since it was made (a Sentinel failover).
    async fn drop_stale_link(&self) {
        let epoch = self.conn.epoch();
        let generation = match self.link.try_lock() {
            Ok(l) => match l.as_ref() {
                Some(l) if l.epoch != epoch => l.generation,
                _ => return,
            },
            // Someone is (re)making or using it; they check again.
            Err(_) => return,
        };
        self.link_lost(generation).await;
    }

    /// Forgets every subscription of connection `generation` and wakes their waiters.
    async fn link_lost(&self, generation: u64) {
        let mut link = self.link.lock().await;
        if link.as_ref().map(|l| l.generation) != Some(generation) {
            return;
        }
        *link = None;
        let names: Vec<String> = {
            let mut subs = lock(&self.subs);
            let names = subs.by_name.keys().cloned().collect();
            *subs = Subs::default();
            names
        };
        drop(link);
        tracing::debug!("redis pub/sub connection lost; waiters poll until it is back");
        for n in names {
            self.signals.wake(&n);
        }
    }

    /// Makes sure `name`'s channels are subscribed (an `observer`'s: with `base:changed`).
    /// `Ok(true)` if this call subscribed them.
    async fn subscribe(
        self: &Arc<Self>,
        name: &str,
        until: Instant,
        observer: bool,
    ) -> Result<bool> {
        let deadline = until.min(Instant::now() + self.target.timeout);
        let mut link = match tokio::time::timeout_at(deadline.into(), self.link.lock()).await {
            Ok(l) => l,
            Err(_) => return Err(self.timed_out("a subscription")),
        };
        let had = match lock(&self.subs).by_name.get(name) {
            Some(sub) if sub.observed || !observer => return Ok(false),
            Some(_) => true,
            None => false,
        };
        if link.is_none() {
            if lock(&self.next_link_try).is_some_and(|t| Instant::now() < t) {
                return Err(Error::Unavailable(
                    "the redis pub/sub connection is down".into(),
                ));
            }
            // Only a failed attempt delays the next one: a caller that stops waiting drops this
            // future half-way (a release in its process woke it), and the next caller opens the
            // connection at once.
            match self.open_link(deadline).await {
                Ok(l) => *link = Some(l),
                Err(e) => {
                    *lock(&self.next_link_try) = Some(Instant::now() + FALLBACK_POLL);
                    return Err(e);
                }
            }
        }
        let Some(l) = link.as_mut() else {
            return Err(Error::Unavailable(
                "the redis pub/sub connection is down".into(),
            ));
        };
        let base = self.base(name);
        let mut chans = Vec::new();
        if !had {
            chans.push((Self::channel(&base), Chan::Released));
            if self.handoffs {
                chans.push((self.handoff_channel(&base), Chan::Handoff));
            }
        }
        if observer {
            chans.push((Self::changed_channel(&base), Chan::Changed));
        }
        let generation = l.generation;
        // The link routes the channels' messages from the moment the server subscribes
        // them (a hand-off may come before the confirmation is read); the name counts as
        // subscribed once it is confirmed.
        {
            let mut subs = lock(&self.subs);
            for (c, chan) in &chans {
                subs.names.insert(c.clone(), (name.to_owned(), *chan));
            }
        }
        let channels: Vec<String> = chans.into_iter().map(|(c, _)| c).collect();
        match tokio::time::timeout_at(deadline.into(), l.sink.subscribe(&channels)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                *link = None;
                *lock(&self.subs) = Subs::default();
                return Err(self.err(e));
            }
            Err(_) => return Err(self.timed_out("a subscription")),
        }
        let mut subs = lock(&self.subs);
        let sub = subs.by_name.entry(name.to_owned()).or_insert(Sub {
            generation,
            count: 0,
            changes: 0,
            observed: false,
            waiters: 0,
            last_used: Instant::now(),
            marked: None,
        });
        sub.observed |= observer;
        Ok(true)
    }

    /// Keeps the observer mark of `name` (`base:obs`) while this client observes it, where
    /// releases announce themselves only to someone who may listen (hand-offs on). `Ok(true)` if
    /// the mark had to be made again: a release since the caller last looked may have gone
    /// unannounced.
    async fn keep_observed(&self, name: &str) -> Result<bool> {
        if !self.handoffs {
            return Ok(false);
        }
        let due = lock(&self.subs).by_name.get(name).map_or(true, |s| {
            s.marked.map_or(true, |t| t.elapsed() >= OBSERVED_KEEP)
        });
        if !due {
            return Ok(false);
        }
        let key = Self::observed_key(&self.base(name));
        let ttl = super::ms(OBSERVED_TTL);
        let mut conn = self.conn.clone();
        let kept: i64 = ::redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(ttl)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err(e))?;
        if kept == 0 {
            ::redis::cmd("SET")
                .arg(&key)
                .arg("1")
                .arg("PX")
                .arg(ttl)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| self.err(e))?;
        }
        if let Some(s) = lock(&self.subs).by_name.get_mut(name) {
            s.marked = Some(Instant::now());
        }
        Ok(kept == 0)
    }

    /// What `generation`'s link does with an event.
    fn on_event(self: &Arc<Self>, generation: u64, event: Event) {
        match event {
            Event::Message(ch, payload) => self.on_message(&ch, &payload),
            Event::Dropped(ch) => self.on_dropped(&ch),
            // redis-rs reconnects a cluster's node and subscribes again by itself.
            Event::Disconnected if self.sharded => self.on_gap(),
            Event::Disconnected => {
                let s = self.clone();
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move { s.link_lost(generation).await });
                }
            }
            Event::Other => {}
        }
    }

    /// Opens the pub/sub connection (its messages are handled on the connection's own task, or
    /// on a RESP2 server by a task that reads them) and starts its janitor.
    async fn open_link(self: &Arc<Self>, deadline: Instant) -> Result<Link> {
        let deadline = deadline.min(Instant::now() + self.target.connect_timeout);
        let epoch = self.conn.epoch();
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let pushes = Pushes {
            shared: Arc::downgrade(self),
            generation,
        };
        let open = async {
            if self.sharded {
                let client = super::conn::cluster_client(&self.target, Some(pushes))?;
                let c = client
                    .get_async_connection()
                    .await
                    .map_err(|e| self.err(e))?;
                return Ok((Sink::Sharded(c), None));
            }
            let client = self
                .conn
                .pubsub_client(self.client.as_ref())
                .await
                .map_err(|e| self.err(e))?;
            if !self.resp2.load(std::sync::atomic::Ordering::Relaxed) {
                let mut info = client.get_connection_info().clone();
                info.redis.protocol = ::redis::ProtocolVersion::RESP3;
                let config = ::redis::AsyncConnectionConfig::new().set_push_sender(pushes);
                let resp3 = ::redis::Client::open(info).map_err(|e| self.err(e))?;
                match resp3
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                {
                    Ok(c) => return Ok((Sink::Push(c), None)),
                    // An answer to `HELLO 3` that is not a lost connection: a server without
                    // RESP3 (before Redis 6). Its links are RESP2 pub/sub connections from now on.
                    Err(e)
                        if !(e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error()) =>
                    {
                        tracing::debug!(error = %e, "redis: no RESP3 for pub/sub; using RESP2");
                        self.resp2.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => return Err(self.err(e)),
                }
            }
            let (sink, stream) = client
                .get_async_pubsub()
                .await
                .map_err(|e| self.err(e))?
                .split();
            Ok((Sink::Plain(sink), Some(stream)))
        };
        let (sink, stream) = match tokio::time::timeout_at(deadline.into(), open).await {
            Ok(r) => r?,
            Err(_) => return Err(self.timed_out("the pub/sub connection")),
        };
        let (stop, mut stopped) = tokio::sync::watch::channel(());
        *lock(&self.subs) = Subs::default();
        if let Some(mut stream) = stream {
            // RESP2: a task reads the messages the connection's task forwards.
            let weak = Arc::downgrade(self);
            tokio::spawn(async move {
                loop {
                    let msg = tokio::select! {
                        m = stream.next() => m,
                        _ = stopped.changed() => return,
                    };
                    let Some(s) = weak.upgrade() else { return };
                    let event = match msg {
                        Some(m) => Event::Message(
                            m.get_channel_name().to_owned(),
                            m.get_payload_bytes().to_vec(),
                        ),
                        None => Event::Disconnected,
                    };
                    let gone = matches!(event, Event::Disconnected);
                    s.on_event(generation, event);
                    if gone {
                        return;
                    }
                }
            });
        }
        let weak: Weak<Shared> = Arc::downgrade(self);
        let mut stopped = stop.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(JANITOR_EVERY) => {}
                    _ = stopped.changed() => return,
                }
                let Some(s) = weak.upgrade() else { return };
                s.drop_idle(generation).await;
            }
        });
        Ok(Link {
            generation,
            epoch,
            sink,
            _stop: stop,
        })
    }

    /// The RESP version of the pub/sub connection, if it is open.
    #[cfg(test)]
    pub(super) async fn link_resp(&self) -> Option<u8> {
        self.link.lock().await.as_ref().map(|l| match l.sink {
            Sink::Plain(_) => 2,
            Sink::Push(_) | Sink::Sharded(_) => 3,
        })
    }

    /// Unsubscribes channels that had no waiters for [`SUBSCRIPTION_IDLE`].
    async fn drop_idle(&self, generation: u64) {
        let mut link = self.link.lock().await;
        let Some(l) = link.as_mut().filter(|l| l.generation == generation) else {
            return;
        };
        let channels: Vec<String> = {
            let mut subs = lock(&self.subs);
            let idle: Vec<String> = subs
                .by_name
                .iter()
                .filter(|(_, s)| s.waiters == 0 && s.last_used.elapsed() > SUBSCRIPTION_IDLE)
                .map(|(n, _)| n.clone())
                .collect();
            for n in &idle {
                subs.by_name.remove(n);
            }
            let channels: Vec<String> = subs
                .names
                .iter()
                .filter(|(_, (n, _))| idle.contains(n))
                .map(|(c, _)| c.clone())
                .collect();
            for c in &channels {
                subs.names.remove(c);
            }
            channels
        };
        if channels.is_empty() {
            return;
        }
        let r = tokio::time::timeout(self.target.timeout, l.sink.unsubscribe(&channels)).await;
        if !matches!(r, Ok(Ok(()))) {
            // Unsure what the server still sends us: start over with a new connection.
            *link = None;
            *lock(&self.subs) = Subs::default();
        }
    }
}

/// Counts a task waiting on a subscription, so the janitor keeps it.
struct WaiterMark<'a> {
    shared: &'a Shared,
    name: &'a str,
}

impl<'a> WaiterMark<'a> {
    fn new(shared: &'a Shared, name: &'a str) -> Self {
        if let Some(s) = lock(&shared.subs).by_name.get_mut(name) {
            s.waiters += 1;
            s.last_used = Instant::now();
        }
        WaiterMark { shared, name }
    }
}

impl Drop for WaiterMark<'_> {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.shared.subs).by_name.get_mut(self.name) {
            s.waiters = s.waiters.saturating_sub(1);
            s.last_used = Instant::now();
        }
    }
}

impl RedisBackend {
    /// Whether `name`'s release channel is subscribed on this server's pub/sub connection.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn is_subscribed(&self, name: &str) -> bool {
        lock(&self.shared.subs).by_name.contains_key(name)
    }

    /// Makes sure `name`'s release channel is subscribed (the pub/sub machinery of a wait, without
    /// waiting). `Ok(true)` if this call subscribed it.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) async fn subscribe_name(&self, name: &str, until: Instant) -> Result<bool> {
        self.shared.subscribe(name, until, false).await
    }

    /// What a waiter of `name` notes before its attempt (see [`Seen`]).
    pub(crate) fn seen(&self, name: &str) -> Seen {
        self.shared.sub_state(name, false)
    }

    /// What an observer of `name` (which watches without attempting) notes.
    pub(crate) fn seen_as_observer(&self, name: &str) -> Seen {
        self.shared.sub_state(name, true)
    }

    /// Waits for a release message on `name`'s channel since `seen`, or `until`; subscribes the
    /// channel first if it is not (then the caller attempts again at once).
    #[cfg(feature = "redlock")]
    pub(crate) async fn changed_since(
        &self,
        name: &str,
        seen: Seen,
        until: Instant,
    ) -> Result<Watch> {
        self.changed_since_as(name, seen, until, false).await
    }

    /// [`RedisBackend::changed_since`]; an `observer` is woken by every change of the name
    /// (`base:changed` too: a hand-off, a new value), a waiter only by those that may let it in.
    pub(crate) async fn changed_since_as(
        &self,
        name: &str,
        seen: Seen,
        until: Instant,
        observer: bool,
    ) -> Result<Watch> {
        let sh = &self.shared;
        sh.drop_stale_link().await;
        let notify = sh.signals.subscribe(name);
        let mut _mark = None;
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match sh.sub_state(name, observer) {
                Some(now) => {
                    if Some(now) != seen {
                        // Subscribed after the attempt, or a message came since: try again.
                        return Ok(Watch::Changed);
                    }
                    if observer {
                        match sh.keep_observed(name).await {
                            Ok(false) => {}
                            Ok(true) => return Ok(Watch::Changed),
                            Err(e) => return Ok(poll_after(&e)),
                        }
                    }
                    if _mark.is_none() {
                        _mark = Some(WaiterMark::new(sh, name));
                    }
                    // Woken by a message of another kind (a waiter by `base:changed`): look again.
                    if tokio::time::timeout_at(until.into(), notified)
                        .await
                        .is_err()
                    {
                        return Ok(Watch::Recheck);
                    }
                }
                None => {
                    let subscribed = match sh.subscribe(name, until, observer).await {
                        Ok(_) if observer => sh.keep_observed(name).await.map(|_| ()),
                        r => r.map(|_| ()),
                    };
                    return match subscribed {
                        // Subscribed (and marked) now: the caller tries again, and every release
                        // from here on wakes it.
                        Ok(()) => Ok(Watch::Changed),
                        Err(e) => Ok(poll_after(&e)),
                    };
                }
            }
        }
    }
}

/// What a waiter does when the store cannot tell it of changes (`e`): it polls.
fn poll_after(e: &Error) -> Watch {
    tracing::debug!(error = %e, "redis pub/sub unavailable; polling");
    Watch::Poll {
        min: FALLBACK_POLL / 2,
        max: FALLBACK_POLL,
    }
}
