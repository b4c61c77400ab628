//! The reference store: a hash map with a deadline index.

use crate::deadlines::{Deadlines, Due};
use crate::key::{RecordKey, Scope};
use crate::record::{Expiry, Precondition, Record, Write, WriteOp};
use crate::store::StoreFailure;
use crate::store::{Applied, Store};
use crate::time::UnixMillis;
use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use core::hash::BuildHasher;
use hashbrown::{DefaultHashBuilder, HashTable};

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

/// Bytes of a key kept inside its slot: UUIDs fit, quoted or not, so that finding a record
/// reads its slot and no other allocation.
const INLINE_KEY: usize = 38;

/// A key's bytes, inside the slot up to [`INLINE_KEY`] bytes, else on the heap.
enum KeyBytes {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl KeyBytes {
    fn new(key: alloc::string::String) -> KeyBytes {
        let b = key.as_bytes();
        if b.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..b.len()].copy_from_slice(b);
            KeyBytes::Inline {
                len: b.len() as u8,
                bytes,
            }
        } else {
            KeyBytes::Heap(key.into_bytes().into_boxed_slice())
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            KeyBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBytes::Heap(b) => b,
        }
    }
}

/// One record, in its slot.
struct Entry {
    /// Its scope, interned.
    scope: u32,
    /// Bumped each time the slot is freed, so that a deadline of an earlier occupant is
    /// never taken for this one's.
    generation: u32,
    key: KeyBytes,
    /// Expiry next looks at it at `record.next_deadline()`; the bytes it counts against the
    /// limit are computed from it when they change ([`entry_size`]).
    record: Record,
}

impl Entry {
    /// The bytes this slot counts against the limit when it holds `record` (its own or the
    /// one replacing it).
    fn size(&self, scopes: &[Option<Interned>], record: &Record) -> u32 {
        let scope = MemoryStore::scope_str(scopes, self.scope);
        entry_size(scope.len(), self.key.bytes().len(), record)
    }
}

enum Cell {
    Used(Entry),
    /// A free slot and the generation its next occupant gets.
    Free(u32),
}

/// A scope and how many records use it.
struct Interned {
    scope: Scope,
    users: u32,
}

/// An in-process [`Store`] for tests and single-process hosts.
///
/// * **Layout.** Records live in slots of one vector; a hash table of slot numbers finds
///   them by scope and key, and each scope is stored once however many keys use it.
/// * **Expiry** is driven by an index of [`Record::next_deadline`]s in a few ordered queues:
///   a sweep touches only the records that are due, so its cost is proportional to what
///   expires, not to what is stored, and for a store of two or three policies adding or
///   taking a deadline costs the same however many records there are. A deadline that moves
///   later keeps its place and is moved when it comes up, so most writes cost the index
///   nothing. Every write first sweeps up to 32 due records; [`MemoryStore::sweep`] sweeps
///   everything due.
/// * **When full** (`IDEM-STORE-3`), a write that would add a record sweeps everything due
///   and, if the store is still at its limit, fails with [`MemoryStoreError::Full`]: the claim
///   is refused (HTTP 503) and nothing runs. Writes to existing records (completions,
///   heartbeats, tombstones, releases) are always accepted, so an in-flight record can always
///   be completed; the byte limit can thus be exceeded by the responses of the requests in
///   flight when it was reached. No live record is ever evicted.
pub struct MemoryStore {
    hasher: DefaultHashBuilder,
    /// Slot numbers, by the hash of scope and key.
    index: HashTable<u32>,
    cells: Vec<Cell>,
    free: Vec<u32>,
    scopes: Vec<Option<Interned>>,
    /// Scope numbers, by the hash of the scope.
    scope_index: HashTable<u32>,
    free_scopes: Vec<u32>,
    /// At least one per record, at or before its deadline.
    deadlines: Deadlines,
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
            .field("stats", &self.stats())
            .finish()
    }
}

/// Bytes counted per record beyond its key and [`Record::size`]: the slot, the index and
/// the deadline index. A store that keeps records in another form (sealed, say) counts its
/// records against [`MemoryStoreLimits::max_bytes`] with the same overhead.
pub const ENTRY_OVERHEAD: usize = 64;

/// Due records a write expires before it is applied, in this store and in every in-process
/// store that expires records as it writes.
pub const SWEEP_PER_WRITE: usize = 32;

impl MemoryStore {
    /// An empty store with these limits.
    pub fn new(mut limits: MemoryStoreLimits) -> MemoryStore {
        // Slots are numbered with 32 bits.
        limits.max_entries = limits.max_entries.min(u32::MAX as usize);
        MemoryStore {
            hasher: DefaultHashBuilder::default(),
            index: HashTable::new(),
            cells: Vec::new(),
            free: Vec::new(),
            scopes: Vec::new(),
            scope_index: HashTable::new(),
            free_scopes: Vec::new(),
            deadlines: Deadlines::default(),
            limits,
            stats: MemoryStoreStats::default(),
        }
    }

    /// The record for `key`, without copying it.
    pub fn get(&self, key: &RecordKey) -> Option<&Record> {
        let slot = self.find(key)?;
        self.entry(slot).map(|e| &e.record)
    }

    /// Counters.
    pub fn stats(&self) -> MemoryStoreStats {
        MemoryStoreStats {
            entries: self.index.len(),
            ..self.stats
        }
    }

    /// The earliest deadline of any record: when [`MemoryStore::sweep`] next has work.
    pub fn next_deadline(&self) -> Option<UnixMillis> {
        self.deadlines.peek().map(|due| due.at)
    }

    /// Applies expiry to every record that is due at `now`; returns how many changed.
    pub fn sweep(&mut self, now: UnixMillis) -> usize {
        self.sweep_at_most(now, usize::MAX)
    }

    fn entry(&self, slot: u32) -> Option<&Entry> {
        match self.cells.get(slot as usize) {
            Some(Cell::Used(e)) => Some(e),
            _ => None,
        }
    }

    fn scope_str(scopes: &[Option<Interned>], id: u32) -> &str {
        scopes
            .get(id as usize)
            .and_then(Option::as_ref)
            .map_or("", |s| s.scope.as_str())
    }

    fn hash(hasher: &DefaultHashBuilder, scope: &str, key: &[u8]) -> u64 {
        hasher.hash_one((scope, key))
    }

    fn key_hash(&self, key: &RecordKey) -> u64 {
        Self::hash(&self.hasher, key.scope.as_str(), key.key.as_bytes())
    }

    fn find(&self, key: &RecordKey) -> Option<u32> {
        self.find_hashed(key, self.key_hash(key))
    }

    fn find_hashed(&self, key: &RecordKey, hash: u64) -> Option<u32> {
        let (cells, scopes) = (&self.cells, &self.scopes);
        self.index
            .find(hash, |&slot| match cells.get(slot as usize) {
                Some(Cell::Used(e)) => {
                    e.key.bytes() == key.key.as_bytes()
                        && Self::scope_str(scopes, e.scope) == key.scope.as_str()
                }
                _ => false,
            })
            .copied()
    }

    /// The scope's number, interned for one more record.
    fn intern(&mut self, scope: &Scope) -> u32 {
        let hash = self.hasher.hash_one(scope.as_str());
        let scopes = &mut self.scopes;
        if let Some(&id) = self
            .scope_index
            .find(hash, |&id| Self::scope_str(scopes, id) == scope.as_str())
        {
            if let Some(Some(s)) = scopes.get_mut(id as usize) {
                s.users += 1;
            }
            return id;
        }
        let interned = Some(Interned {
            scope: scope.clone(),
            users: 1,
        });
        let id = match self.free_scopes.pop() {
            Some(id) => {
                scopes[id as usize] = interned;
                id
            }
            None => {
                scopes.push(interned);
                (scopes.len() - 1) as u32
            }
        };
        let hasher = &self.hasher;
        self.scope_index
            .insert_unique(hash, id, |&id| hasher.hash_one(Self::scope_str(scopes, id)));
        id
    }

    /// One record fewer uses the scope; the last one frees it.
    fn release_scope(&mut self, id: u32) {
        let Some(Some(s)) = self.scopes.get_mut(id as usize) else {
            return;
        };
        s.users -= 1;
        if s.users > 0 {
            return;
        }
        let hash = self.hasher.hash_one(s.scope.as_str());
        if let Ok(found) = self.scope_index.find_entry(hash, |&other| other == id) {
            found.remove();
        }
        self.scopes[id as usize] = None;
        self.free_scopes.push(id);
    }

    /// Adds a record for `key`, whose hash is `hash`.
    fn insert(&mut self, key: RecordKey, hash: u64, record: Record, size: u32) {
        let scope = self.intern(&key.scope);
        let deadline = record.next_deadline();
        let (slot, generation) = match self.free.pop() {
            Some(slot) => {
                let generation = match self.cells[slot as usize] {
                    Cell::Free(g) => g,
                    Cell::Used(_) => 0,
                };
                (slot, generation)
            }
            None => {
                self.cells.push(Cell::Free(0));
                ((self.cells.len() - 1) as u32, 0)
            }
        };
        self.cells[slot as usize] = Cell::Used(Entry {
            scope,
            generation,
            key: KeyBytes::new(key.key),
            record,
        });
        let (hasher, cells, scopes) = (&self.hasher, &self.cells, &self.scopes);
        self.index
            .insert_unique(hash, slot, |&s| match cells.get(s as usize) {
                Some(Cell::Used(e)) => {
                    Self::hash(hasher, Self::scope_str(scopes, e.scope), e.key.bytes())
                }
                _ => 0,
            });
        self.deadlines.push(Due {
            at: deadline,
            slot,
            generation,
        });
        self.stats.bytes += size as usize;
    }

    fn remove(&mut self, slot: u32) {
        let Some(Cell::Used(e)) = self.cells.get(slot as usize) else {
            return;
        };
        let hash = Self::hash(
            &self.hasher,
            Self::scope_str(&self.scopes, e.scope),
            e.key.bytes(),
        );
        if let Ok(found) = self.index.find_entry(hash, |&other| other == slot) {
            found.remove();
        }
        let next = e.generation.wrapping_add(1);
        if let Cell::Used(e) = core::mem::replace(&mut self.cells[slot as usize], Cell::Free(next))
        {
            self.stats.bytes -= e.size(&self.scopes, &e.record) as usize;
            self.release_scope(e.scope);
        }
        self.free.push(slot);
    }

    /// A record's deadline moved from `before`: a later one keeps its place in the index
    /// (it is moved when it comes up), an earlier one is added.
    fn reschedule(&mut self, slot: u32, before: UnixMillis) {
        let Some(e) = self.entry(slot) else {
            return;
        };
        let (deadline, generation) = (e.record.next_deadline(), e.generation);
        if deadline < before {
            self.deadlines.push(Due {
                at: deadline,
                slot,
                generation,
            });
        }
    }

    /// Drops deadlines that no longer name a record's deadline and moves the ones that came
    /// up early, until the earliest is a real deadline (so that `next_deadline` is exact);
    /// returns that one.
    fn settle(&mut self) -> Option<Due> {
        while let Some(due) = self.deadlines.peek() {
            match self
                .entry(due.slot)
                .map(|e| (e.generation, e.record.next_deadline()))
            {
                Some((g, deadline)) if g == due.generation && deadline == due.at => {
                    return Some(due)
                }
                Some((g, later)) if g == due.generation && later > due.at => {
                    self.deadlines.pop();
                    self.deadlines.push(Due { at: later, ..due });
                }
                _ => {
                    self.deadlines.pop();
                }
            }
        }
        None
    }

    /// Expires up to `budget` due records; the index is settled when it returns.
    fn sweep_at_most(&mut self, now: UnixMillis, budget: usize) -> usize {
        let mut done = 0;
        while let Some(Due { at, slot, .. }) = self.settle() {
            if at > now || done == budget {
                break;
            }
            self.deadlines.pop();
            let expiry = match self.entry(slot) {
                Some(e) => e.record.expire(now),
                None => continue,
            };
            let Some(Cell::Used(e)) = self.cells.get_mut(slot as usize) else {
                continue;
            };
            match expiry {
                Expiry::Delete => self.remove(slot),
                Expiry::Tombstone(t) => {
                    let before = e.size(&self.scopes, &e.record);
                    let size = e.size(&self.scopes, &t);
                    self.stats.bytes = self.stats.bytes - before as usize + size as usize;
                    self.deadlines.push(Due {
                        at: t.next_deadline(),
                        slot,
                        generation: e.generation,
                    });
                    e.record = t;
                }
                Expiry::Keep(_) => {
                    self.deadlines.push(Due {
                        at: e.record.next_deadline(),
                        slot,
                        generation: e.generation,
                    });
                    continue;
                }
            }
            self.stats.expired += 1;
            done += 1;
        }
        done
    }

    fn is_full(&self, extra: u32) -> bool {
        self.index.len() >= self.limits.max_entries
            || self.stats.bytes + extra as usize > self.limits.max_bytes
    }
}

/// Bytes counted for a record under a scope and key of these lengths.
fn entry_size(scope_len: usize, key_len: usize, record: &Record) -> u32 {
    // A record past 4 GiB cannot be stored anyway; the count only needs to be consistent.
    u32::try_from(scope_len + key_len + record.size() + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
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
        self.sweep_at_most(now, SWEEP_PER_WRITE);
        let hash = self.key_hash(&write.key);
        let slot = self.find_hashed(&write.key, hash);
        let current = slot.and_then(|s| self.entry(s)).map(|e| e.record.version);
        let holds = match (write.precondition, current) {
            (Precondition::Absent, None) => true,
            (Precondition::Version(v), Some(c)) => v == c,
            _ => false,
        };
        if !holds {
            return Ok(Applied::Conflict);
        }
        match (write.op, slot) {
            (WriteOp::Delete, Some(slot)) => self.remove(slot),
            (WriteOp::Delete, None) => {}
            (WriteOp::Put(record), Some(slot)) => {
                if let Some(Cell::Used(e)) = self.cells.get_mut(slot as usize) {
                    let deadline = e.record.next_deadline();
                    let before = e.size(&self.scopes, &e.record);
                    let size = e.size(&self.scopes, &record);
                    e.record = record;
                    self.stats.bytes = self.stats.bytes - before as usize + size as usize;
                    self.reschedule(slot, deadline);
                }
            }
            (WriteOp::Put(record), None) => {
                let size = entry_size(write.key.scope.as_str().len(), write.key.key.len(), &record);
                if self.is_full(size) {
                    self.sweep(now);
                    if self.is_full(size) {
                        self.stats.refused += 1;
                        return Err(MemoryStoreError::Full {
                            entries: self.index.len(),
                            bytes: self.stats.bytes,
                        });
                    }
                }
                self.insert(write.key, hash, record, size);
            }
        }
        self.settle();
        Ok(Applied::Applied)
    }
}

#[cfg(test)]
mod tests;
