//! One process's store: idem-core's `MemoryStore` (a hash map with a deadline index) behind
//! a lock held only for one synchronous step, never across an await.

use idem_core::{
    Applied, AsyncStore, MemoryStoreError, MemoryStoreLimits, Record, RecordKey, Store,
    StoreFailure, UnixMillis, Write,
};
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// idem-core's `MemoryStore` for one process (tests, development, single-instance services).
/// When full it refuses new claims with 503 `store-full` after dropping what has expired; it
/// never evicts a live record (`IDEM-STORE-3`).
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<idem_core::MemoryStore>,
}

impl MemoryStore {
    /// A store with these limits.
    pub fn new(limits: MemoryStoreLimits) -> MemoryStore {
        MemoryStore {
            inner: Mutex::new(idem_core::MemoryStore::new(limits)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, idem_core::MemoryStore> {
        // Every write is one step of the map: a panic elsewhere leaves it whole.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.lock().stats().entries
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the map under the store's lock: synchronous steps of a host that drives
    /// the request machine over idem-core's `Store` itself (never hold it across an await).
    pub fn with_locked<R>(&self, f: impl FnOnce(&mut idem_core::MemoryStore) -> R) -> R {
        f(&mut self.lock())
    }

    /// Applies expiry to every record due at `now`; returns how many changed.
    pub fn sweep(&self, now: UnixMillis) -> usize {
        self.lock().sweep(now)
    }
}

impl AsyncStore for MemoryStore {
    type Error = MemoryStoreError;

    fn load(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<Record>, MemoryStoreError>> + Send {
        let record = self.lock().get(key).cloned();
        async move { Ok(record) }
    }

    fn apply(
        &self,
        now: UnixMillis,
        write: Write,
    ) -> impl Future<Output = Result<Applied, MemoryStoreError>> + Send {
        let applied = self.lock().apply(now, write);
        async move { applied }
    }

    fn failure(error: &MemoryStoreError) -> StoreFailure {
        <idem_core::MemoryStore as Store>::failure(error)
    }
}
