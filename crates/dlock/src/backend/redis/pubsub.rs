//! The pub/sub side: one connection per client, one subscription per name that has waiters
//! (dropped when idle), and the waits on a name's release channel.

use super::{lock, RedisBackend, Seen, Shared};
use crate::backend::Watch;
use crate::error::{Error, Result};
use ::redis::aio::PubSubSink;
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
/// While the pub/sub connection is down: the longest a waiter sleeps between attempts, and the
/// shortest interval between two attempts to reconnect it.
pub(super) const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// One subscribed channel.
#[derive(Debug)]
struct Sub {
    /// The pub/sub connection generation it was made on.
    generation: u64,
    /// Messages received on it.
    count: u64,
    /// Tasks waiting on it.
    waiters: usize,
    last_used: Instant,
}

#[derive(Debug, Default)]
pub(super) struct Subs {
    /// By lock name.
    by_name: HashMap<String, Sub>,
    /// Channel → lock name.
    names: HashMap<String, String>,
}

/// The live pub/sub connection.
pub(super) struct Link {
    generation: u64,
    /// The command connection's [`Conn::epoch`] when it was made: a Sentinel failover since means
    /// it listens to a server that is no longer the master.
    epoch: u64,
    sink: Sink,
    /// Dropping it stops the dispatcher and janitor of this link (and closes the connection).
    _stop: tokio::sync::watch::Sender<()>,
}

/// Where subscriptions are made: a pub/sub connection to one server, or (on a cluster) a
/// cluster connection whose RESP3 pushes carry the sharded messages.
enum Sink {
    Plain(PubSubSink),
    Sharded(ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Plain(s) => s.subscribe(channel).await,
            Sink::Sharded(c) => c.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Sink::Plain(s) => s.unsubscribe(channels).await,
            // One by one: the channels of different names are in different slots.
            Sink::Sharded(c) => {
                for ch in channels {
                    c.sunsubscribe(ch.as_str()).await?;
                }
                Ok(())
            }
        }
    }
}

/// What the dispatcher of a link reads.
enum Source {
    Plain(::redis::aio::PubSubStream),
    Sharded(tokio::sync::mpsc::UnboundedReceiver<PushInfo>),
}

/// One event of a link's source.
enum Event {
    /// A release message on this channel.
    Message(String),
    /// The server dropped this subscription (its slot moved to another node).
    Dropped(String),
    /// A cluster node connection dropped (redis-rs subscribes again when it is back; messages
    /// in between are lost).
    Gap,
    /// Nothing to do.
    Other,
    /// The connection is gone.
    Closed,
}

impl Source {
    async fn next(&mut self) -> Event {
        match self {
            Source::Plain(s) => match s.next().await {
                Some(m) => Event::Message(m.get_channel_name().to_owned()),
                None => Event::Closed,
            },
            Source::Sharded(rx) => {
                let Some(p) = rx.recv().await else {
                    return Event::Closed;
                };
                let channel = || match p.data.first() {
                    Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                };
                match p.kind {
                    PushKind::SMessage | PushKind::Message => {
                        channel().map_or(Event::Other, Event::Message)
                    }
                    PushKind::SUnsubscribe => channel().map_or(Event::Other, Event::Dropped),
                    PushKind::Disconnection => Event::Gap,
                    _ => Event::Other,
                }
            }
        }
    }
}

impl Shared {
    // ---- pub/sub ----

    /// The (generation, count) of `name`'s subscription, marking it used.
    fn sub_state(&self, name: &str) -> Option<(u64, u64)> {
        let mut subs = lock(&self.subs);
        subs.by_name.get_mut(name).map(|s| {
            s.last_used = Instant::now();
            (s.generation, s.count)
        })
    }

    fn on_message(&self, channel: &str) {
        let name = {
            let mut subs = lock(&self.subs);
            let Some(name) = subs.names.get(channel).cloned() else {
                return;
            };
            if let Some(s) = subs.by_name.get_mut(&name) {
                s.count = s.count.wrapping_add(1);
            }
            name
        };
        self.signals.wake(&name);
    }

    /// A subscription the server dropped (its slot moved): forgets it and wakes its waiters,
    /// who subscribe again (on the slot's new node).
    fn on_dropped(&self, channel: &str) {
        let name = {
            let mut subs = lock(&self.subs);
            let Some(name) = subs.names.remove(channel) else {
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

    /// Makes sure `name`'s channel is subscribed. `Ok(true)` if this call subscribed it.
    async fn subscribe(self: &Arc<Self>, name: &str, until: Instant) -> Result<bool> {
        let deadline = until.min(Instant::now() + self.target.timeout);
        let mut link = match tokio::time::timeout_at(deadline.into(), self.link.lock()).await {
            Ok(l) => l,
            Err(_) => return Err(self.timed_out("a subscription")),
        };
        if lock(&self.subs).by_name.contains_key(name) {
            return Ok(false);
        }
        if link.is_none() {
            {
                let mut next = lock(&self.next_link_try);
                if next.is_some_and(|t| Instant::now() < t) {
                    return Err(Error::Unavailable(
                        "the redis pub/sub connection is down".into(),
                    ));
                }
                *next = Some(Instant::now() + FALLBACK_POLL);
            }
            *link = Some(self.open_link(deadline).await?);
        }
        let Some(l) = link.as_mut() else {
            return Err(Error::Unavailable(
                "the redis pub/sub connection is down".into(),
            ));
        };
        let base = self.base(name);
        let channel = Self::channel(&base);
        let generation = l.generation;
        match tokio::time::timeout_at(deadline.into(), l.sink.subscribe(channel.as_str())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                *link = None;
                *lock(&self.subs) = Subs::default();
                return Err(self.err(e));
            }
            Err(_) => return Err(self.timed_out("a subscription")),
        }
        let mut subs = lock(&self.subs);
        subs.names.insert(channel, name.to_owned());
        subs.by_name.insert(
            name.to_owned(),
            Sub {
                generation,
                count: 0,
                waiters: 0,
                last_used: Instant::now(),
            },
        );
        Ok(true)
    }

    /// Opens the pub/sub connection and starts its dispatcher and janitor.
    async fn open_link(self: &Arc<Self>, deadline: Instant) -> Result<Link> {
        let deadline = deadline.min(Instant::now() + self.target.connect_timeout);
        let epoch = self.conn.epoch();
        let open = async {
            if self.sharded {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let client = super::conn::cluster_client(&self.target, Some(tx))?;
                let c = client
                    .get_async_connection()
                    .await
                    .map_err(|e| self.err(e))?;
                Ok((Sink::Sharded(c), Source::Sharded(rx)))
            } else {
                let client = self
                    .conn
                    .pubsub_client(self.client.as_ref())
                    .await
                    .map_err(|e| self.err(e))?;
                let (sink, stream) = client
                    .get_async_pubsub()
                    .await
                    .map_err(|e| self.err(e))?
                    .split();
                Ok((Sink::Plain(sink), Source::Plain(stream)))
            }
        };
        let (sink, mut source) = match tokio::time::timeout_at(deadline.into(), open).await {
            Ok(r) => r?,
            Err(_) => return Err(self.timed_out("the pub/sub connection")),
        };
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let (stop, mut stopped) = tokio::sync::watch::channel(());
        *lock(&self.subs) = Subs::default();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    e = source.next() => e,
                    _ = stopped.changed() => return,
                };
                let Some(s) = weak.upgrade() else { return };
                match event {
                    Event::Message(ch) => s.on_message(&ch),
                    Event::Dropped(ch) => s.on_dropped(&ch),
                    Event::Gap => s.on_gap(),
                    Event::Other => {}
                    Event::Closed => break,
                }
            }
            if let Some(s) = weak.upgrade() {
                s.link_lost(generation).await;
            }
        });
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
                .filter(|(_, n)| idle.contains(n))
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
        self.shared.subscribe(name, until).await
    }

    /// What a waiter of `name` notes before its attempt (see [`Seen`]).
    pub(crate) fn seen(&self, name: &str) -> Seen {
        self.shared.sub_state(name)
    }

    /// Waits for a release message on `name`'s channel since `seen`, or `until`; subscribes the
    /// channel first if it is not (then the caller attempts again at once).
    pub(crate) async fn changed_since(
        &self,
        name: &str,
        seen: Seen,
        until: Instant,
    ) -> Result<Watch> {
        let sh = &self.shared;
        sh.drop_stale_link().await;
        let notify = sh.signals.subscribe(name);
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match sh.sub_state(name) {
            Some(now) => {
                if Some(now) != seen {
                    // Subscribed after the attempt, or a message came since: try again.
                    return Ok(Watch::Changed);
                }
                let _mark = WaiterMark::new(sh, name);
                Ok(
                    match tokio::time::timeout_at(until.into(), notified).await {
                        Ok(()) => Watch::Changed,
                        Err(_) => Watch::Recheck,
                    },
                )
            }
            None => match sh.subscribe(name, until).await {
                // Subscribed now: the caller tries again, and every release from here on wakes it.
                Ok(_) => Ok(Watch::Changed),
                Err(e) => {
                    tracing::debug!(error = %e, "redis pub/sub unavailable; polling");
                    Ok(Watch::Poll {
                        min: FALLBACK_POLL / 2,
                        max: FALLBACK_POLL,
                    })
                }
            },
        }
    }
}
