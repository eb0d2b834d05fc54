//! The core: everything a lock does above the backend trait, written once for every store.
//!
//! From the bottom up (each file imports only those below it): `rules` (leases, the safety
//! margin, what one acquisition asks for), `wait` (waiting on a store's change source or by
//! polling, per-call timeouts, the clean-up of an abandoned acquisition), `hold` (one hold and
//! what a client's holds share), `line` (a client's waiters of one name), `watchdog` (batched
//! renewal and `lost()`), `client` (the client and the acquisition loop), `handles` (the lock
//! handles and guards users hold). `metrics` names the metrics all of them emit.

pub(crate) mod client;
pub(crate) mod election;
pub(crate) mod handles;
pub(crate) mod hold;
pub(crate) mod line;
pub(crate) mod metrics;
pub(crate) mod multi;
pub(crate) mod rules;
pub(crate) mod wait;
pub(crate) mod watchdog;
