//! One process's store: idem-core's `MemoryStore` (a hash map with a deadline index) behind
//! a lock held only for one synchronous step, never across an await; or, sealed, records
//! held only as sealed bytes ([`sealed`]).

#[cfg(feature = "seal")]
mod sealed;

#[cfg(feature = "seal")]
use crate::seal::{Seal, Unreadable};
use idem_core::{
    encode_record, Applied, AsyncStore, MemoryStoreLimits, Record, RecordKey, Store, StoreFailure,
    UnixMillis, Write,
};
use std::fmt;
use std::future::{ready, Future};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// idem-core's `MemoryStore` for one process (tests, development, single-instance services).
/// When full it refuses new claims with 503 `store-full` after dropping what has expired; it
/// never evicts a live record (`IDEM-STORE-3`).
///
/// With `with_seal` (feature `seal`) it holds every record sealed
/// instead, so that a dump of the process's memory shows no response in clear.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<idem_core::MemoryStore>,
    /// The limits a sealed store keeps too.
    #[cfg(feature = "seal")]
    limits: MemoryStoreLimits,
    #[cfg(feature = "seal")]
    sealed: Option<Box<sealed::Sealed>>,
}

/// Why a memory store call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryStoreError {
    /// A new claim would pass the store's limits (`IDEM-STORE-3`): 503 `store-full`.
    Full(idem_core::MemoryStoreError),
    /// A sealed record this store cannot open with its keys now (`IDEM-SEAL-3`): 500
    /// `record-sealed`.
    #[cfg(feature = "seal")]
    Record(Unreadable),
}

impl fmt::Display for MemoryStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryStoreError::Full(e) => e.fmt(f),
            #[cfg(feature = "seal")]
            MemoryStoreError::Record(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for MemoryStoreError {}

impl From<idem_core::MemoryStoreError> for MemoryStoreError {
    fn from(e: idem_core::MemoryStoreError) -> Self {
        MemoryStoreError::Full(e)
    }
}

impl MemoryStore {
    /// A store with these limits.
    pub fn new(limits: MemoryStoreLimits) -> MemoryStore {
        MemoryStore {
            inner: Mutex::new(idem_core::MemoryStore::new(limits)),
            #[cfg(feature = "seal")]
            limits,
            #[cfg(feature = "seal")]
            sealed: None,
        }
    }

    /// Holds every record sealed with `seal`'s first key (`IDEM-SEAL-1`): AES-256-GCM with
    /// the record's storage key authenticated, as the Redis and Postgres stores seal them, so
    /// that no response is kept in clear in the process's memory (a core dump, a swapped
    /// page). Each write seals, each read opens; expiry and the limits work on the sealed
    /// bytes without opening them. A store without a seal pays nothing for this.
    ///
    /// Call it when the store is made: records it holds in clear are not carried over. On a
    /// store that is sealed already it replaces the keys, as
    /// [`replace_seal`](MemoryStore::replace_seal) does.
    #[cfg(feature = "seal")]
    pub fn with_seal(mut self, seal: Seal) -> MemoryStore {
        match &self.sealed {
            Some(sealed) => sealed.replace_seal(seal),
            None => {
                self.inner = Mutex::new(idem_core::MemoryStore::new(self.limits));
                self.sealed = Some(Box::new(sealed::Sealed::new(seal, self.limits)));
            }
        }
        self
    }

    /// Replaces a sealed store's keys while it runs, keeping its records: how a memory store
    /// rotates them (`IDEM-SEAL-2`), since its records do not outlive the process. Records
    /// sealed before open with whichever key of `seal` sealed them; a record whose key is no
    /// longer on the list is answered 500 `record-sealed` and never executed (`IDEM-SEAL-3`).
    /// Returns false, changing nothing, for a store made without [`with_seal`](MemoryStore::with_seal).
    #[cfg(feature = "seal")]
    pub fn replace_seal(&self, seal: Seal) -> bool {
        match &self.sealed {
            Some(sealed) => {
                sealed.replace_seal(seal);
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, idem_core::MemoryStore> {
        // Every write is one step of the map: a panic elsewhere leaves it whole.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sealed records, when the store seals.
    #[cfg(feature = "seal")]
    fn sealed(&self) -> Option<&sealed::Sealed> {
        self.sealed.as_deref()
    }

    /// Records held.
    pub fn len(&self) -> usize {
        #[cfg(feature = "seal")]
        if let Some(sealed) = self.sealed() {
            return sealed.len();
        }
        self.lock().stats().entries
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The record under `key` in the form this store holds it, for inspection: its sealed
    /// bytes in a sealed store (what a dump of the process's memory would show), else
    /// idem-core's encoding of the record.
    pub fn stored(&self, key: &RecordKey) -> Option<Vec<u8>> {
        #[cfg(feature = "seal")]
        if let Some(sealed) = self.sealed() {
            return sealed.stored(key);
        }
        self.lock().get(key).map(encode_record)
    }

    /// Runs `f` on the map under the store's lock: synchronous steps of a host that drives
    /// the request machine over idem-core's `Store` itself (never hold it across an await).
    ///
    /// # Panics
    ///
    /// On a sealed store, whose records are not in an idem-core `MemoryStore`.
    pub fn with_locked<R>(&self, f: impl FnOnce(&mut idem_core::MemoryStore) -> R) -> R {
        #[cfg(feature = "seal")]
        assert!(
            self.sealed.is_none(),
            "with_locked on a sealed MemoryStore: its records are sealed bytes"
        );
        f(&mut self.lock())
    }

    /// Applies expiry to every record due at `now`; returns how many changed.
    pub fn sweep(&self, now: UnixMillis) -> usize {
        #[cfg(feature = "seal")]
        if let Some(sealed) = self.sealed() {
            return sealed.sweep(now);
        }
        self.lock().sweep(now)
    }
}

impl AsyncStore for MemoryStore {
    type Error = MemoryStoreError;

    fn load(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<Record>, MemoryStoreError>> + Send {
        #[cfg(feature = "seal")]
        if let Some(sealed) = self.sealed() {
            return ready(sealed.load(key).map_err(MemoryStoreError::Record));
        }
        ready(Ok(self.lock().get(key).cloned()))
    }

    fn apply(
        &self,
        now: UnixMillis,
        write: Write,
    ) -> impl Future<Output = Result<Applied, MemoryStoreError>> + Send {
        #[cfg(feature = "seal")]
        if let Some(sealed) = self.sealed() {
            return ready(sealed.apply(now, write).map_err(|(entries, bytes)| {
                MemoryStoreError::Full(idem_core::MemoryStoreError::Full { entries, bytes })
            }));
        }
        ready(
            self.lock()
                .apply(now, write)
                .map_err(MemoryStoreError::Full),
        )
    }

    fn failure(error: &MemoryStoreError) -> StoreFailure {
        match error {
            MemoryStoreError::Full(e) => <idem_core::MemoryStore as Store>::failure(e),
            // As the Redis store maps them: a sealed record that does not open is refused
            // (500 record-sealed), anything else that is not a record is a failure.
            #[cfg(feature = "seal")]
            MemoryStoreError::Record(e) if e.is_sealed() => StoreFailure::Sealed,
            #[cfg(feature = "seal")]
            MemoryStoreError::Record(_) => StoreFailure::Unavailable,
        }
    }
}
