//! The reference store: a hash map with a deadline index.

use crate::key::RecordKey;
use crate::record::{Expiry, Precondition, Record, Write, WriteOp};
use crate::reply::StoreFailure;
use crate::store::{Applied, Store};
use crate::time::UnixMillis;
use alloc::borrow::Cow;
use alloc::collections::BTreeSet;
use alloc::sync::Arc;
use core::fmt;
use hashbrown::HashMap;

/// Capacity limits of a [`MemoryStore`] (`IDEM-STORE-3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStoreLimits {
    /// The most records kept at once. Default 1,000,000.
    pub max_entries: usize,
    /// The most bytes of keys and records kept at once, as counted by [`Record::size`].
    /// Default 256 MiB.
    pub max_bytes: usize,
}

impl Default for MemoryStoreLimits {
    fn default() -> Self {
        MemoryStoreLimits {
            max_entries: 1_000_000,
            max_bytes: 256 << 20,
        }
    }
}

/// Why a [`MemoryStore`] refused a write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryStoreError {
    /// A new claim would exceed the limits even after dropping everything expired. Live
    /// records are never evicted to make room: that would let their keys run again.
    Full {
        /// Records held.
        entries: usize,
        /// Bytes held.
        bytes: usize,
    },
}

impl fmt::Display for MemoryStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryStoreError::Full { entries, bytes } => {
                write!(
                    f,
                    "idempotency store full ({entries} records, {bytes} bytes)"
                )
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for MemoryStoreError {}

/// Counters for a [`MemoryStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStoreStats {
    /// Records held.
    pub entries: usize,
    /// Bytes counted against [`MemoryStoreLimits::max_bytes`].
    pub bytes: usize,
    /// Records deleted or compacted by expiry so far.
    pub expired: u64,
    /// Claims refused because the store was full.
    pub refused: u64,
}

struct Slot {
    record: Record,
    deadline: UnixMillis,
    size: usize,
}

/// An in-process [`Store`] for tests and single-process hosts.
///
/// * **Expiry** is driven by a deadline index ordered by [`Record::next_deadline`]: a sweep
///   touches only the records that are due, so its cost is proportional to what expires, not
///   to what is stored. Every write first sweeps up to 32 due records; [`MemoryStore::sweep`]
///   sweeps everything due.
/// * **When full** (`IDEM-STORE-3`), a write that would add a record sweeps everything due
///   and, if the store is still at its limit, fails with [`MemoryStoreError::Full`]: the claim
///   is refused (HTTP 503) and nothing runs. Writes to existing records (completions,
///   heartbeats, tombstones, releases) are always accepted, so an in-flight record can always
///   be completed; the byte limit can thus be exceeded by the responses of the requests in
///   flight when it was reached. No live record is ever evicted.
pub struct MemoryStore {
    map: HashMap<Arc<RecordKey>, Slot>,
    deadlines: BTreeSet<(UnixMillis, Arc<RecordKey>)>,
    limits: MemoryStoreLimits,
    stats: MemoryStoreStats,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(MemoryStoreLimits::default())
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("limits", &self.limits)
            .field("stats", &self.stats)
            .finish()
    }
}

/// Bytes counted per record beyond its key and [`Record::size`]: the map slot and the
/// deadline index entry.
const ENTRY_OVERHEAD: usize = 64;

impl MemoryStore {
    /// An empty store with these limits.
    pub fn new(limits: MemoryStoreLimits) -> MemoryStore {
        MemoryStore {
            map: HashMap::new(),
            deadlines: BTreeSet::new(),
            limits,
            stats: MemoryStoreStats::default(),
        }
    }

    /// The record for `key`, without copying it.
    pub fn get(&self, key: &RecordKey) -> Option<&Record> {
        self.map.get(key).map(|s| &s.record)
    }

    /// Counters.
    pub fn stats(&self) -> MemoryStoreStats {
        MemoryStoreStats {
            entries: self.map.len(),
            ..self.stats
        }
    }

    /// The earliest deadline of any record: when [`MemoryStore::sweep`] next has work.
    pub fn next_deadline(&self) -> Option<UnixMillis> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Applies expiry to every record that is due at `now`; returns how many changed.
    pub fn sweep(&mut self, now: UnixMillis) -> usize {
        self.sweep_at_most(now, usize::MAX)
    }

    fn sweep_at_most(&mut self, now: UnixMillis, budget: usize) -> usize {
        let mut done = 0;
        while done < budget {
            let Some((deadline, _)) = self.deadlines.first() else {
                break;
            };
            if *deadline > now {
                break;
            }
            let Some((_, key)) = self.deadlines.pop_first() else {
                break;
            };
            let Some(slot) = self.map.get_mut(&key) else {
                continue;
            };
            match slot.record.expire(now) {
                Expiry::Delete => {
                    if let Some(slot) = self.map.remove(&key) {
                        self.stats.bytes -= slot.size;
                    }
                }
                Expiry::Tombstone(t) => {
                    let size = entry_size(&key, &t);
                    self.stats.bytes = self.stats.bytes - slot.size + size;
                    slot.deadline = t.next_deadline();
                    slot.size = size;
                    slot.record = t;
                    self.deadlines.insert((slot.deadline, key));
                }
                Expiry::Keep(next) => {
                    slot.deadline = next.unwrap_or(slot.record.key_expires);
                    self.deadlines.insert((slot.deadline, key));
                    continue;
                }
            }
            self.stats.expired += 1;
            done += 1;
        }
        done
    }

    fn is_full(&self, extra: usize) -> bool {
        self.map.len() >= self.limits.max_entries
            || self.stats.bytes + extra > self.limits.max_bytes
    }
}

fn entry_size(key: &RecordKey, record: &Record) -> usize {
    key.scope.as_str().len() + key.key.len() + record.size() + ENTRY_OVERHEAD
}

impl Store for MemoryStore {
    type Error = MemoryStoreError;

    fn load(&self, key: &RecordKey) -> Result<Option<Record>, MemoryStoreError> {
        Ok(self.get(key).cloned())
    }

    fn read(&self, key: &RecordKey) -> Result<Option<Cow<'_, Record>>, MemoryStoreError> {
        Ok(self.get(key).map(Cow::Borrowed))
    }

    /// A MemoryStore fails only when it is full.
    fn failure(_error: &MemoryStoreError) -> StoreFailure {
        StoreFailure::Full
    }

    fn apply(&mut self, now: UnixMillis, write: Write) -> Result<Applied, MemoryStoreError> {
        self.sweep_at_most(now, 32);
        let current = self.map.get(&write.key).map(|s| s.record.version);
        let holds = match (write.precondition, current) {
            (Precondition::Absent, None) => true,
            (Precondition::Version(v), Some(c)) => v == c,
            _ => false,
        };
        if !holds {
            return Ok(Applied::Conflict);
        }
        match write.op {
            WriteOp::Delete => {
                if let Some((k, slot)) = self.map.remove_entry(&write.key) {
                    self.deadlines.remove(&(slot.deadline, k));
                    self.stats.bytes -= slot.size;
                }
            }
            WriteOp::Put(record) => {
                let size = entry_size(&write.key, &record);
                let deadline = record.next_deadline();
                if let Some((k, slot)) = self.map.get_key_value_mut(&write.key) {
                    if slot.deadline != deadline {
                        self.deadlines.remove(&(slot.deadline, Arc::clone(k)));
                        self.deadlines.insert((deadline, Arc::clone(k)));
                    }
                    self.stats.bytes = self.stats.bytes - slot.size + size;
                    *slot = Slot {
                        record,
                        deadline,
                        size,
                    };
                } else {
                    if self.is_full(size) {
                        self.sweep(now);
                        if self.is_full(size) {
                            self.stats.refused += 1;
                            return Err(MemoryStoreError::Full {
                                entries: self.map.len(),
                                bytes: self.stats.bytes,
                            });
                        }
                    }
                    let key = Arc::new(write.key);
                    self.deadlines.insert((deadline, Arc::clone(&key)));
                    self.stats.bytes += size;
                    self.map.insert(
                        key,
                        Slot {
                            record,
                            deadline,
                            size,
                        },
                    );
                }
            }
        }
        Ok(Applied::Applied)
    }
}
