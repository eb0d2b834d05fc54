//! What a scenario runs against: the store's client factory, its [`Caps`], and the per-test
//! context (a unique id and a scratch directory).

use super::harness::{must, SCENARIO_LIMIT};
use crate::backend::Backend;
use crate::{Client, ClientOptions, Result};
use std::fmt::{self, Display};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

/// What a store offers beyond what [`Client::capabilities`] reports, as the suite needs to know.
///
/// [`conformance!`](crate::conformance!) reads `mutex_only: true` from the literal it is given to
/// leave out the scenarios that are not about mutexes; each field must therefore be written as
/// `name: true` or `name: false` there. Fields left out are `false`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// The store offers only non-fair mutexes (Redlock, SQL session mode): scenarios run their
    /// mutex parts and check that rwlocks, semaphores and fair mode answer
    /// [`Error::Unsupported`](crate::Error::Unsupported) instead of running their own parts.
    pub mutex_only: bool,
    /// A hold ends as soon as its holder's connection closes (PostgreSQL and MySQL session
    /// mode): a killed holder is taken over at once rather than after its lease.
    pub ends_with_connection: bool,
}

type ConnectFn =
    dyn Fn(ClientOptions) -> Pin<Box<dyn Future<Output = Result<Client>> + Send>> + Send + Sync;

/// How the suite makes new clients of the store under test: each call to the factory must give
/// another client (another connection, another client id, another renewal watchdog) of the
/// *same* store, so that the clients' locks meet.
#[derive(Clone)]
pub struct Factory {
    shown: String,
    url: Option<String>,
    connect: Arc<ConnectFn>,
}

impl fmt::Debug for Factory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Factory")
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

impl Factory {
    /// Clients from `url` through [`connect_with`](crate::connect_with): for the stores of
    /// dlock's URL table.
    pub fn url(url: impl Into<String>) -> Factory {
        let url = url.into();
        let target = url.clone();
        Factory {
            shown: crate::redact_url(&url),
            url: Some(url),
            connect: Arc::new(move |options| {
                let target = target.clone();
                Box::pin(async move { crate::connect_with(&target, options).await })
            }),
        }
    }

    /// Clients over backends that `make` returns, one per call, through
    /// [`Client::with_backend`]: for a store that has no URL scheme in dlock (a store written
    /// outside the crate). `shown` names the store in messages and in the clients (it is redacted
    /// like a URL).
    pub fn backend<F, Fut>(shown: impl Into<String>, make: F) -> Factory
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn Backend>>> + Send + 'static,
    {
        let shown = crate::redact_url(&shown.into());
        let name = shown.clone();
        let make = Arc::new(make);
        Factory::new(shown, move |options| {
            let (make, name) = (make.clone(), name.clone());
            async move { Client::with_backend(make().await?, &name, options) }
        })
    }

    /// Clients from any async function of the [`ClientOptions`] the scenario asks for. `connect`
    /// must apply the options (a scenario checks that a bad default lease is refused with
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig)). `shown` names the store in messages.
    pub fn new<F, Fut>(shown: impl Into<String>, connect: F) -> Factory
    where
        F: Fn(ClientOptions) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Client>> + Send + 'static,
    {
        Factory {
            shown: shown.into(),
            url: None,
            connect: Arc::new(move |options| Box::pin(connect(options))),
        }
    }

    /// Another client of the store, with `options`.
    pub fn connect(&self, options: ClientOptions) -> impl Future<Output = Result<Client>> {
        (self.connect)(options)
    }
}

/// What a backend line's setup function may answer: a [`Factory`], a URL (`String` or `&str`,
/// made into [`Factory::url`]), or an `Option` of either, where `None` means "this store is not
/// configured here" (the test then fails with a message; it never skips).
pub trait IntoFactory {
    /// The factory, or `None` when the store is not configured.
    fn into_factory(self) -> Option<Factory>;
}

impl IntoFactory for Factory {
    fn into_factory(self) -> Option<Factory> {
        Some(self)
    }
}

impl IntoFactory for String {
    fn into_factory(self) -> Option<Factory> {
        Some(Factory::url(self))
    }
}

impl IntoFactory for &str {
    fn into_factory(self) -> Option<Factory> {
        Some(Factory::url(self))
    }
}

impl<T: IntoFactory> IntoFactory for Option<T> {
    fn into_factory(self) -> Option<Factory> {
        self.and_then(IntoFactory::into_factory)
    }
}

/// The per-test context a backend line's setup function gets. Its `Display` is an id unique to
/// this test run (`[a-z0-9_-]`, safe in URLs, file names, database names and lock names);
/// [`Ctx::path`] gives a file in a temporary directory that lives as long as the test.
#[derive(Debug)]
pub struct Ctx {
    id: String,
    dir: tempfile::TempDir,
}

impl Ctx {
    fn new(scenario: &str) -> Ctx {
        let uuid = uuid::Uuid::new_v4().simple().to_string();
        let id = format!("{scenario}-{}", &uuid[..12]);
        let dir = tempfile::Builder::new()
            .prefix("dlock-conformance-")
            .tempdir()
            .expect("create a temporary directory for the test");
        Ctx { id, dir }
    }

    /// The unique id of this test run.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `file` inside this test's own temporary directory (absolute).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

impl Display for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// What a scenario gets: a factory of clients of a store of its own (or of a shared server, with
/// lock names of its own), the store's [`Caps`], a unique id for lock names and a scratch
/// directory.
#[derive(Debug)]
pub struct Store {
    factory: Factory,
    /// What the store offers.
    pub caps: Caps,
    /// The unique id of this test run.
    pub id: String,
    /// A scratch directory of this test (for files shared with child processes).
    pub dir: PathBuf,
    /// The test's name, `<backend>::<scenario>` when [`run`] runs it (empty otherwise): a
    /// scenario that re-executes its own test binary as a child process names itself with it.
    pub test: String,
}

impl Store {
    /// A store for scenarios run by hand (outside [`run`]): clients from `factory`, lock names
    /// under `conf/<id>/`, scratch files in `dir`.
    pub fn new(factory: Factory, caps: Caps, id: impl Into<String>, dir: &Path) -> Store {
        Store {
            factory,
            caps,
            id: id.into(),
            dir: dir.to_owned(),
            test: String::new(),
        }
    }

    /// A new client of the store (each call is another client: another connection, another
    /// client id, another renewal watchdog). Panics if that fails or takes longer than a step.
    pub async fn client(&self) -> Client {
        must(
            format!("connect to {}", self.factory.shown),
            self.connect(ClientOptions::default()),
        )
        .await
    }

    /// A new client whose default lease is `lease`.
    pub async fn client_with_lease(&self, lease: std::time::Duration) -> Client {
        must(
            format!("connect to {} with lease {lease:?}", self.factory.shown),
            self.connect(ClientOptions::default().lease(lease)),
        )
        .await
    }

    /// A new client with `options`, or the factory's error (for scenarios that expect one).
    pub fn connect(&self, options: ClientOptions) -> impl Future<Output = Result<Client>> {
        self.factory.connect(options)
    }

    /// The URL the store's clients connect to, when it was given as one ([`Factory::url`]): the
    /// multi-process scenarios hand it to the `dlock` processes they start.
    pub fn url(&self) -> Option<&str> {
        self.factory.url.as_deref()
    }

    /// A lock name unique to this test: `conf/<id>/<what>`.
    pub fn name(&self, what: &str) -> String {
        format!("conf/{}/{what}", self.id)
    }
}

/// Runs one scenario against one store: makes the test's [`Ctx`], asks the backend line's
/// `setup` for the store's factory, and runs the scenario under [`SCENARIO_LIMIT`]. Panics (the
/// test fails) when `setup` answers `None`, when the scenario fails, or when it takes too long.
pub async fn run<U, R, S, F>(backend: &str, scenario: &str, caps: Caps, setup: U, body: S)
where
    U: FnOnce(&Ctx) -> R,
    R: IntoFactory,
    S: FnOnce(Store) -> F,
    F: Future<Output = ()>,
{
    let ctx = Ctx::new(scenario);
    let Some(factory) = setup(&ctx).into_factory() else {
        panic!(
            "backend {backend} is not configured (its setup function answered None, e.g. an \
             unset DLOCK_TEST_*_URL variable): run the suite through scripts/test.sh, which starts \
             the server and sets the URL"
        );
    };
    let mut store = Store::new(factory, caps, ctx.id(), ctx.dir.path());
    store.test = format!("{backend}::{scenario}");
    let started = Instant::now();
    if tokio::time::timeout(SCENARIO_LIMIT, body(store))
        .await
        .is_err()
    {
        panic!("{backend}::{scenario} did not finish within {SCENARIO_LIMIT:?} (a wait that never ends?)");
    }
    eprintln!("{backend}::{scenario} took {:?}", started.elapsed());
    drop(ctx);
}

/// [`run`] on a new multi-threaded tokio runtime (4 workers), for a plain `#[test]` function:
/// what [`conformance!`](crate::conformance!) generates, so that the calling crate needs no
/// tokio features of its own.
pub fn run_test<U, R, S, F>(backend: &str, scenario: &str, caps: Caps, setup: U, body: S)
where
    U: FnOnce(&Ctx) -> R,
    R: IntoFactory,
    S: FnOnce(Store) -> F,
    F: Future<Output = ()>,
{
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("build a tokio runtime for the scenario")
        .block_on(run(backend, scenario, caps, setup, body));
}
