//! **Not public API**: the decoders of store data, for dlock's fuzz targets (`fuzz/`) and their
//! stable test (`tests/fuzz_checks.rs`). Built only with the `__fuzz` feature; anything here may
//! change or go in any release.
//!
//! Each module wraps, for one store, what reads the store's data back: the names of keys and
//! nodes, holder metadata, `describe` answers and rows, hand-off messages.

/// ZooKeeper: child node names (sequence, kind) and node data.
#[cfg(feature = "zookeeper")]
pub mod zookeeper {
    pub use crate::backend::zookeeper::fuzz::*;
}

/// etcd: the key layout and key values.
#[cfg(feature = "etcd")]
pub mod etcd {
    pub use crate::backend::etcd::fuzz::*;
}

/// Redis: scanned keys, `describe` answers, hand-off messages.
#[cfg(feature = "redis")]
pub mod redis {
    pub use crate::backend::redis::fuzz::*;
}

/// SQL stores: rows read for a grant and for `describe`, PostgreSQL hand-off notifications.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub mod sql {
    pub use crate::backend::sql::common::fuzz::*;
}
