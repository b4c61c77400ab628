//! The rules every store must keep (`IDEM-STORE-1`, `IDEM-STORE-3`, `IDEM-STORE-4`,
//! `IDEM-STORE-5`, `IDEM-STORE-6`, `IDEM-STORE-9`, `IDEM-TTL-1`..`4`, `IDEM-LEASE-4`), as async checks to run
//! against a store: the same rules as the JavaScript `idem/store-tests`. Each check panics
//! with what it saw when the store breaks a rule.
//!
//! ```no_run
//! # async fn run() {
//! use idem_tower::{store_tests, MemoryStore};
//! // Two MemoryStores share no records: the races run on one.
//! let options = store_tests::Options { shared: false, ..Default::default() };
//! store_tests::run_all(|| async { MemoryStore::default() }, options).await;
//! # }
//! ```
//!
//! The checks use real time (a store with a time-to-live of its own cannot be given a
//! clock), with retention windows of a second or two.
//!
//! The checks of the compare-and-set contract ([`compare_and_set`], [`versions`]) apply the
//! engine's writes to the store directly; the others send requests through the layer on it.

mod requests;
mod writes;

use idem_core::{Applied, AsyncStore, Record, RecordKey, UnixMillis, Write};
use std::fmt;
use std::future::Future;

pub use requests::{concurrent_duplicates, expiry, failures, live_lease, size_limit};
pub use writes::{claims, compare_and_set, versions};

/// How the checks treat the store.
#[derive(Clone, Debug)]
pub struct Options {
    /// Whether two stores from `open` see the same records (two clients or pools of one
    /// server): the races then run over both.
    pub shared: bool,
    /// Whether the store deletes expired records on its own (a time-to-live): it must have
    /// deleted a record once its key expired.
    pub self_expiring: bool,
    /// The largest response the store keeps (default 1 MiB).
    pub max_response_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            shared: true,
            self_expiring: false,
            max_response_bytes: 1 << 20,
        }
    }
}

/// Runs every check against stores made by `open`.
pub async fn run_all<St, F, Fut>(open: F, options: Options)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    compare_and_set(&open, &options).await;
    versions(&open).await;
    concurrent_duplicates(&open, &options).await;
    expiry(&open, &options).await;
    live_lease(&open).await;
    failures(&open).await;
    size_limit(&open, &options).await;
}

pub(crate) fn unique(label: &str) -> String {
    format!("{label}-{:016x}", crate::drive::nonce())
}

async fn must<T, E: fmt::Display>(what: &str, r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: the store failed: {e}"),
    }
}

pub(crate) async fn load<St: AsyncStore>(store: &St, key: &RecordKey) -> Option<Record>
where
    St::Error: fmt::Display,
{
    must("load", store.load(key).await).await
}

pub(crate) async fn apply<St: AsyncStore>(store: &St, write: Write) -> Applied
where
    St::Error: fmt::Display,
{
    must("apply", store.apply(UnixMillis::now(), write).await).await
}
