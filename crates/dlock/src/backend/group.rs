//! Group commit, written once for the stores that batch writes (SQLite's attempts, ZooKeeper's
//! creates under new lock nodes, etcd's key puts of one lease, the SQL servers' grants of new
//! names).
//!
//! A store's group has a number of slots (how many of its calls may be in flight at once: one
//! for a session's transactions, a pool's size for SQL). A call that finds a slot free takes it
//! and runs alone, in its caller's task, as without batching ([`Entered::Alone`]). A call that
//! finds every slot taken queues ([`Entered::Queued`]). When a slot's call ends (its [`Turn`]
//! dropped, the caller's future dropped included), the slot goes to a flusher task that sends
//! what has queued meanwhile, batch after batch, until the queue is empty; then the slot is free
//! again. So a burst (a client taking thousands of names at once) costs the store one
//! transaction per batch, and a lone call costs what it cost without the group.
//!
//! A batch takes queued items in the order they came, at most [`Batcher::LIMIT`] of cost, and
//! at most one per [`Batcher::key`] (the items of one transaction share its revision, zxid or
//! fence-row lock, so two items of one name go in two batches, in order). An item whose caller
//! went away before its batch is left out ([`Batcher::left`]); one that the store can answer
//! without sending is answered at once ([`Batcher::settled`]).

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::Mutex as StdMutex;
use tokio::sync::oneshot;

/// What a store batches and how it sends a batch. Cloned into the flusher task (a handle of the
/// store and of the group's owner).
pub(crate) trait Batcher: Clone + Send + Sync + 'static {
    /// One queued call.
    type Item: Send + 'static;
    /// Its answer.
    type Answer: Send + 'static;
    /// The most cost in one batch.
    const LIMIT: usize;
    /// The group the calls queue in.
    fn group(&self) -> &Group<Self::Item, Self::Answer>;
    /// Two items of one key never share a batch (`None`: no such rule).
    fn key<'a>(&self, _item: &'a Self::Item) -> Option<&'a str> {
        None
    }
    /// What the item counts against [`Batcher::LIMIT`].
    fn cost(&self, _item: &Self::Item) -> usize {
        1
    }
    /// An answer the item gets without being sent (what the store knows by now makes its call
    /// go another way).
    fn settled(&self, _item: &Self::Item) -> Option<Self::Answer> {
        None
    }
    /// An item whose caller went away before its batch was taken: it is not sent.
    fn left(&self, _item: Self::Item) {}
    /// Sends one batch and answers each of its jobs.
    fn send(&self, batch: Vec<Job<Self::Item, Self::Answer>>) -> impl Future<Output = ()> + Send;
}

/// The queue and the slots of one store (or session).
#[derive(Debug)]
pub(crate) struct Group<T, A> {
    state: StdMutex<State<T, A>>,
    slots: usize,
}

#[derive(Debug)]
struct State<T, A> {
    jobs: VecDeque<Job<T, A>>,
    /// Slots taken: calls running alone, and flushers.
    busy: usize,
}

/// A queued item and where its answer goes.
#[derive(Debug)]
pub(crate) struct Job<T, A> {
    pub(crate) item: T,
    pub(crate) answer: oneshot::Sender<A>,
}

impl<T, A> Group<T, A> {
    /// A group of `slots` calls in flight at once (at least one).
    pub(crate) fn new(slots: usize) -> Group<T, A> {
        Group {
            state: StdMutex::new(State {
                jobs: VecDeque::new(),
                busy: 0,
            }),
            slots: slots.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T, A>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many items wait for a batch.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.lock().jobs.len()
    }

    /// How many slots are taken.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.lock().busy
    }
}

/// Where a call goes.
pub(crate) enum Entered<B: Batcher, F> {
    /// A slot was free: the caller sends its own call, and holds the turn until it is answered.
    /// The item was not built: the maker is given back, for a caller that needs the item.
    Alone(Turn<B>, F),
    /// Every slot was taken: the answer comes from a batch (an error when the batch's task
    /// ended without one: the runtime is shutting down).
    Queued(oneshot::Receiver<B::Answer>),
}

/// Enters a call: [`Entered::Alone`] when a slot is free, else queues the item `make` builds
/// (so a call that runs alone, the common case, builds no item).
pub(crate) fn enter<B: Batcher, F: FnOnce() -> B::Item>(b: &B, make: F) -> Entered<B, F> {
    let mut st = b.group().lock();
    if st.busy < b.group().slots {
        st.busy += 1;
        return Entered::Alone(Turn(Some(b.clone())), make);
    }
    let (answer, rx) = oneshot::channel();
    st.jobs.push_back(Job {
        item: make(),
        answer,
    });
    Entered::Queued(rx)
}

/// A slot, taken by a call that runs alone. Dropped, it goes to a flusher when items queued.
pub(crate) struct Turn<B: Batcher>(Option<B>);

impl<B: Batcher> Drop for Turn<B> {
    fn drop(&mut self) {
        let Some(b) = self.0.take() else { return };
        {
            let mut st = b.group().lock();
            if st.jobs.is_empty() {
                st.busy -= 1;
                return;
            }
        }
        // The flusher's guard is made here and moved into the task, so a task that never runs
        // (a runtime shutting down) still gives the slot back.
        let flusher = Flusher(Some(b));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(flusher.run());
        }
    }
}

/// The task that holds a slot and sends batches until the queue is empty.
struct Flusher<B: Batcher>(Option<B>);

impl<B: Batcher> Flusher<B> {
    async fn run(mut self) {
        let Some(b) = self.0.clone() else { return };
        loop {
            let batch = take(&b);
            if batch.is_empty() {
                // `take` gave the slot back.
                self.0 = None;
                return;
            }
            b.send(batch).await;
        }
    }
}

impl<B: Batcher> Drop for Flusher<B> {
    /// Ended before the queue was empty (the runtime is shutting down): the slot is given back,
    /// and when no other slot is taken, the queued items are dropped (their callers get an
    /// error) since nobody would send them.
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            let mut st = b.group().lock();
            st.busy -= 1;
            if st.busy == 0 {
                st.jobs.clear();
            }
        }
    }
}

/// The next batch (see the module docs). An empty batch gives the flusher's slot back, under the
/// queue's lock, so a call entered later finds it free.
fn take<B: Batcher>(b: &B) -> Vec<Job<B::Item, B::Answer>> {
    let (mut batch, mut left, mut settled) = (Vec::new(), Vec::new(), Vec::new());
    {
        let mut st = b.group().lock();
        let mut keys = HashSet::new();
        let (mut cost, mut kept) = (0, VecDeque::new());
        while let Some(job) = st.jobs.pop_front() {
            if job.answer.is_closed() {
                left.push(job.item);
                continue;
            }
            if let Some(a) = b.settled(&job.item) {
                settled.push((job.answer, a));
                continue;
            }
            let c = b.cost(&job.item).max(1);
            let fresh = !matches!(b.key(&job.item), Some(k) if keys.contains(k));
            if fresh && cost + c <= B::LIMIT.max(1) {
                if let Some(k) = b.key(&job.item) {
                    keys.insert(k.to_owned());
                }
                cost += c;
                batch.push(job);
            } else {
                kept.push_back(job);
            }
        }
        st.jobs = kept;
        if batch.is_empty() {
            st.busy -= 1;
        }
    }
    for item in left {
        b.left(item);
    }
    for (answer, a) in settled {
        let _ = answer.send(a);
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A store whose batch answers each item with its own number and the batch's size, after a
    /// pause; items 1000 and over are answered without being sent, and key `d` costs 2.
    #[derive(Clone)]
    struct Fake(Arc<FakeInner>);

    struct FakeInner {
        group: Group<(String, u32), (u32, usize)>,
        sent: StdMutex<Vec<Vec<u32>>>,
        left: AtomicUsize,
    }

    impl Fake {
        fn new(slots: usize) -> Fake {
            Fake(Arc::new(FakeInner {
                group: Group::new(slots),
                sent: StdMutex::new(Vec::new()),
                left: AtomicUsize::new(0),
            }))
        }
    }

    impl Batcher for Fake {
        type Item = (String, u32);
        type Answer = (u32, usize);
        const LIMIT: usize = 4;
        fn group(&self) -> &Group<(String, u32), (u32, usize)> {
            &self.0.group
        }
        fn key<'a>(&self, item: &'a (String, u32)) -> Option<&'a str> {
            Some(&item.0)
        }
        fn cost(&self, item: &(String, u32)) -> usize {
            if item.0 == "d" {
                2
            } else {
                1
            }
        }
        fn settled(&self, item: &(String, u32)) -> Option<(u32, usize)> {
            (item.1 >= 1000).then_some((item.1, 0))
        }
        fn left(&self, _item: (String, u32)) {
            self.0.left.fetch_add(1, Ordering::Relaxed);
        }
        async fn send(&self, batch: Vec<Job<(String, u32), (u32, usize)>>) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let n = batch.len();
            self.0
                .sent
                .lock()
                .unwrap()
                .push(batch.iter().map(|j| j.item.1).collect());
            for j in batch {
                let _ = j.answer.send((j.item.1, n));
            }
        }
    }

    /// Enters `(key, n)` in `b`: the turn of a call that runs alone, or the receiver of a
    /// queued one.
    fn entered(b: &Fake, key: &str, n: u32) -> Result<Turn<Fake>, oneshot::Receiver<(u32, usize)>> {
        match enter(b, || (key.to_owned(), n)) {
            Entered::Alone(turn, _) => Ok(turn),
            Entered::Queued(rx) => Err(rx),
        }
    }

    /// Waits (at most 3 s) until no slot of `b` is taken: a flusher gives its slot back once it
    /// finds the queue empty, after it answered its last batch.
    async fn until_free(b: &Fake) {
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while b.0.group.busy() > 0 {
            assert!(std::time::Instant::now() < until, "a slot stays taken");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// While the slot's call runs, later calls queue; they go out in batches within the limit,
    /// one per key, in order; an item whose caller left is not sent; a settled item is answered
    /// unsent; the slot is free again at the end.
    #[tokio::test]
    async fn calls_that_queue_go_out_in_batches_of_distinct_keys() {
        let b = Fake::new(1);
        let Ok(turn) = entered(&b, "a", 0) else {
            panic!("the slot was free")
        };
        let mut rxs = Vec::new();
        for (i, key) in ["a", "b", "a", "c", "d", "e", "gone", "x"]
            .iter()
            .enumerate()
        {
            let n = if *key == "x" { 1000 } else { i as u32 + 1 };
            match entered(&b, key, n) {
                Err(rx) => rxs.push(rx),
                Ok(_) => panic!("the slot was taken"),
            }
        }
        assert_eq!(b.0.group.queued(), 8);
        drop(rxs.remove(6)); // "gone"'s caller goes away
        assert!(
            b.0.sent.lock().unwrap().is_empty(),
            "nothing sent while the slot is taken"
        );
        drop(turn);
        let mut answers = Vec::new();
        for rx in rxs {
            answers.push(rx.await.unwrap());
        }
        // 1 (a), 2 (b), 4 (c) and 6 (e) fill the limit of 4 (5, d, costs 2); 3 (the second a)
        // and 5 next.
        assert_eq!(
            *b.0.sent.lock().unwrap(),
            vec![vec![1, 2, 4, 6], vec![3, 5]]
        );
        assert_eq!(answers[5], (6, 4));
        assert_eq!(answers[6], (1000, 0), "settled without a send");
        assert_eq!(b.0.left.load(Ordering::Relaxed), 1);
        until_free(&b).await;
        assert!(entered(&b, "a", 7).is_ok(), "runs alone");
    }

    /// With two slots two calls run alone at once; a turn dropped with nothing queued frees its
    /// slot at once, and one dropped with calls queued hands them to a flusher.
    #[tokio::test]
    async fn slots_are_given_back_when_a_call_goes_away() {
        let b = Fake::new(2);
        let (Ok(one), Ok(two)) = (entered(&b, "a", 1), entered(&b, "b", 2)) else {
            panic!("two slots were free")
        };
        let Err(rx) = entered(&b, "c", 3) else {
            panic!("both slots are taken")
        };
        drop(one);
        assert_eq!(rx.await.unwrap(), (3, 1));
        drop(two);
        until_free(&b).await;
        assert_eq!(b.0.group.queued(), 0);
    }
}
