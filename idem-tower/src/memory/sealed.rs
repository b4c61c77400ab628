//! A sealed [`MemoryStore`](super::MemoryStore)'s records: sealed bytes under their storage
//! keys, so that a dump of the process's memory shows no response in clear (`IDEM-SEAL-1`).
//!
//! idem-core's `MemoryStore` holds records as they are, and expires them by reading them;
//! sealed bytes cannot be read without opening them. So these are held as the Redis store
//! holds them: each record beside its version and its retention (its key's expiry, or a live
//! lease's end), and a completed record's tombstone sealed beside it when the response
//! expires first ([`response_apart`]). Expiry then never opens a record: when the response
//! expires the tombstone takes its place (`IDEM-STORE-9`), when the retention ends the record
//! goes. Between the response's expiry and the sweep that drops it the engine reads the
//! completed record past its response's expiry and answers 410, as the tombstone would.
//!
//! Limits are idem-core's (`IDEM-STORE-3`): a new claim that would pass them sweeps what is
//! due and, if still over, is refused; writes to existing records are always taken; no live
//! record is evicted. Each write first sweeps up to 32 due records.

use crate::seal::{self, Seal, Unreadable};
use idem_core::stores::response_apart;
use idem_core::{
    Applied, MemoryStoreLimits, Precondition, Record, RecordKey, UnixMillis, Write, WriteOp,
    ENTRY_OVERHEAD, SWEEP_PER_WRITE,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

/// The seal and the records of a sealed memory store.
pub(super) struct Sealed {
    /// Replaced while the store runs to rotate its keys ([`Sealed::replace_seal`]).
    seal: RwLock<Seal>,
    records: Mutex<Records>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let records = self.lock();
        f.debug_struct("Sealed")
            .field("seal", &self.seal())
            .field("entries", &records.map.len())
            .field("bytes", &records.bytes)
            .finish()
    }
}

/// One record, sealed.
struct Entry {
    version: u64,
    /// The record as written.
    value: Vec<u8>,
    /// The record once its response has expired, and when that is.
    held: Option<(Vec<u8>, UnixMillis)>,
    /// When the record goes: its retention.
    expires: UnixMillis,
}

impl Entry {
    /// When it next changes on its own.
    fn deadline(&self) -> UnixMillis {
        self.held.as_ref().map_or(self.expires, |(_, at)| *at)
    }

    /// The bytes it counts against the limit under a key of `key_len` bytes.
    fn size(&self, key_len: usize) -> usize {
        key_len + self.value.len() + self.held.as_ref().map_or(0, |(b, _)| b.len()) + ENTRY_OVERHEAD
    }
}

struct Records {
    map: HashMap<Arc<str>, Entry>,
    /// At least one per record, at its deadline; others are stale and skipped.
    due: BinaryHeap<Reverse<(UnixMillis, Arc<str>)>>,
    limits: MemoryStoreLimits,
    bytes: usize,
}

impl Sealed {
    pub(super) fn new(seal: Seal, limits: MemoryStoreLimits) -> Sealed {
        Sealed {
            seal: RwLock::new(seal),
            records: Mutex::new(Records {
                map: HashMap::new(),
                due: BinaryHeap::new(),
                limits,
                bytes: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // Every write is one step of the map: a panic elsewhere leaves it whole.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn seal(&self) -> Seal {
        self.seal
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn replace_seal(&self, seal: Seal) {
        *self.seal.write().unwrap_or_else(PoisonError::into_inner) = seal;
    }

    pub(super) fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub(super) fn sweep(&self, now: UnixMillis) -> usize {
        self.lock().sweep(now, usize::MAX)
    }

    /// The sealed bytes under `key`.
    pub(super) fn stored(&self, key: &RecordKey) -> Option<Vec<u8>> {
        let records = self.lock();
        records
            .map
            .get(key.storage_key().as_str())
            .map(|e| e.value.clone())
    }

    /// The record under `key`, opened outside the lock.
    pub(super) fn load(&self, key: &RecordKey) -> Result<Option<Record>, Unreadable> {
        let storage_key = key.storage_key();
        let Some(bytes) = self
            .lock()
            .map
            .get(storage_key.as_str())
            .map(|e| e.value.clone())
        else {
            return Ok(None);
        };
        seal::decode(Some(&self.seal()), &storage_key, &bytes).map(Some)
    }

    /// Applies `write`, sealed outside the lock; `Err` with the counts when full.
    pub(super) fn apply(&self, now: UnixMillis, write: Write) -> Result<Applied, (usize, usize)> {
        let storage_key: Arc<str> = write.key.storage_key().into();
        let put = match &write.op {
            WriteOp::Put(record) => {
                let seal = self.seal();
                let sealed = |r: &Record| seal::encode(Some(&seal), &storage_key, r);
                Some(Entry {
                    version: record.version,
                    value: sealed(record),
                    held: response_apart(record).map(|(held, at)| (sealed(&held), at)),
                    expires: record.retained_until(),
                })
            }
            WriteOp::Delete => None,
        };
        self.lock().apply(now, storage_key, write.precondition, put)
    }
}

impl Records {
    fn apply(
        &mut self,
        now: UnixMillis,
        key: Arc<str>,
        precondition: Precondition,
        put: Option<Entry>,
    ) -> Result<Applied, (usize, usize)> {
        self.sweep(now, SWEEP_PER_WRITE);
        let current = self.map.get(&key).map(|e| e.version);
        let holds = match (precondition, current) {
            (Precondition::Absent, None) => true,
            (Precondition::Version(v), Some(c)) => v == c,
            _ => false,
        };
        if !holds {
            return Ok(Applied::Conflict);
        }
        let Some(entry) = put else {
            if let Some(gone) = self.map.remove(&key) {
                self.bytes -= gone.size(key.len());
            }
            return Ok(Applied::Applied);
        };
        let size = entry.size(key.len());
        let deadline = entry.deadline();
        if let Some(e) = self.map.get_mut(&key) {
            self.bytes = self.bytes - e.size(key.len()) + size;
            let before = e.deadline();
            *e = entry;
            if deadline != before {
                self.due.push(Reverse((deadline, key)));
            }
            return Ok(Applied::Applied);
        }
        if self.is_full(size) {
            self.sweep(now, usize::MAX);
            if self.is_full(size) {
                return Err((self.map.len(), self.bytes));
            }
        }
        self.bytes += size;
        self.due.push(Reverse((deadline, Arc::clone(&key))));
        self.map.insert(key, entry);
        Ok(Applied::Applied)
    }

    fn is_full(&self, extra: usize) -> bool {
        self.map.len() >= self.limits.max_entries || self.bytes + extra > self.limits.max_bytes
    }

    /// Expires up to `budget` due records: a response that expired gives way to its
    /// tombstone, a record whose retention ended goes. Never opens a record.
    fn sweep(&mut self, now: UnixMillis, budget: usize) -> usize {
        let mut done = 0;
        while done < budget {
            match self.due.peek() {
                Some(Reverse((at, _))) if *at <= now => {}
                _ => break,
            }
            let Some(Reverse((at, key))) = self.due.pop() else {
                break;
            };
            let Some(e) = self.map.get_mut(&key) else {
                continue;
            };
            if e.deadline() != at {
                continue;
            }
            let before = e.size(key.len());
            match e.held.take() {
                Some((tombstone, _)) => {
                    e.value = tombstone;
                    self.bytes = self.bytes - before + e.size(key.len());
                    self.due.push(Reverse((e.expires, key)));
                }
                None => {
                    self.map.remove(&key);
                    self.bytes -= before;
                }
            }
            done += 1;
        }
        done
    }
}
