//! Records, their lifecycle, and the compare-and-set writes that move them.
//!
//! ```text
//!            claim                 complete(final)            response_ttl
//!  absent ─────────▶ in-flight ──────────────────▶ completed ─────────────▶ tombstone
//!    ▲                │  ▲  │                                                   │
//!    │ release        │  └──┘ takeover after lease expiry (fence + 1)          │ key_ttl
//!    └────────────────┘     │                                                   ▼
//!    (retryable outcome)    └── complete(unknown, hold) ──▶ outcome-unknown   absent
//! ```
//!
//! Every record also disappears at `key_expires`, whatever its state, except that a record in
//! flight stays while its lease is live: a lease never outlives its key (`IDEM-LEASE-4`).

use crate::fingerprint::Fingerprint;
use crate::key::RecordKey;
use crate::response::StoredResponse;
use crate::session::CounterSession;
use crate::time::UnixMillis;
use alloc::sync::Arc;

/// The state of one (scope, key).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// Compare-and-set version. It starts at a random value chosen by the caller when the
    /// record is created and grows by one on every write, so a version never names two
    /// different incarnations of a key (a record released and claimed again starts afresh).
    pub version: u64,
    /// Fencing number of the current (or last) lease; grows by one on every takeover.
    pub fence: u64,
    /// Fingerprint of the request that created the record.
    pub fingerprint: Fingerprint,
    /// When the record was created.
    pub created: UnixMillis,
    /// When the key itself is forgotten (`IDEM-TTL-2`).
    pub key_expires: UnixMillis,
    /// Where the record is in its lifecycle.
    pub state: RecordState,
}

/// Lifecycle states of a [`Record`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RecordState {
    /// A handler holds the lease until `lease_expires` (`IDEM-LEASE-1`).
    InFlight {
        /// The lease ends here; after it another attempt may take over.
        lease_expires: UnixMillis,
    },
    /// The final response, replayed until `response_expires` (`IDEM-TTL-1`).
    Completed {
        /// The response to replay.
        response: Arc<StoredResponse>,
        /// When the response is dropped and the record becomes a tombstone.
        response_expires: UnixMillis,
    },
    /// The handler's outcome is unknown and the policy holds the key until the host
    /// reconciles it (`IDEM-OUT-3`).
    OutcomeUnknown {
        /// When the outcome became unknown.
        since: UnixMillis,
    },
    /// The response has expired; the key and fingerprint are remembered until
    /// `key_expires` so that a late retry is refused, not executed again (`IDEM-TTL-3`).
    Tombstone,
    /// A server-issued token that no request has presented yet (`IDEM-TOKEN-1`). The first
    /// matching request consumes it and the record becomes in-flight like any other.
    Issued {
        /// The token is refused after this time (also the record's `key_expires`).
        expires: UnixMillis,
    },
    /// The session of a counter-key client: its epoch, window and slots (`IDEM-CTR-12`).
    /// Its `fence` and `fingerprint` are unused: slots carry their own.
    Counter {
        /// The session.
        session: Arc<CounterSession>,
    },
    /// A key nobody had used, settled by a status query as never to run
    /// (`IDEM-STATUS-3`): every request with it is refused until the key expires. Its
    /// `fence` and `fingerprint` are unused.
    Settled,
}

/// What a store should do with a record at a given time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Nothing yet; look again at the deadline (if any).
    Keep(Option<UnixMillis>),
    /// Replace the record with this tombstone (the response is dropped).
    Tombstone(Record),
    /// Delete the record: its key has expired.
    Delete,
}

impl Record {
    /// Whether the record still counts at `now`: its key has not expired, or it is in flight
    /// under a live lease (`IDEM-LEASE-4`).
    pub fn is_live(&self, now: UnixMillis) -> bool {
        now < self.key_expires
            || matches!(self.state, RecordState::InFlight { lease_expires } if now < lease_expires)
    }

    /// Until when a store must keep this record: its key's expiry, or the end of its lease
    /// if that is later. A store that deletes records on a time-to-live of its own (Redis
    /// `PEXPIREAT`, a database sweep by age) takes it from here, never from the response's
    /// expiry: a record deleted when its response expires makes its key new again, and a
    /// retry would run again instead of getting 410 (`IDEM-TTL-3`, `IDEM-STORE-3`).
    pub fn retained_until(&self) -> UnixMillis {
        match self.state {
            RecordState::InFlight { lease_expires } => self.key_expires.max(lease_expires),
            _ => self.key_expires,
        }
    }

    /// The next time this record changes on its own: when its response or its key expires,
    /// and never before the lease of a record in flight ends. Stores set their alarm or sweep
    /// from this (`IDEM-TTL-4`).
    pub fn next_deadline(&self) -> UnixMillis {
        match &self.state {
            RecordState::Completed {
                response_expires, ..
            } => (*response_expires).min(self.key_expires),
            RecordState::InFlight { lease_expires } => self.key_expires.max(*lease_expires),
            _ => self.key_expires,
        }
    }

    /// What the passage of time does to this record at `now`. A record in flight under a
    /// live lease is kept, whatever its key's expiry says (`IDEM-STORE-3`).
    pub fn expire(&self, now: UnixMillis) -> Expiry {
        if !self.is_live(now) {
            return Expiry::Delete;
        }
        match &self.state {
            RecordState::Completed {
                response_expires, ..
            } if now >= *response_expires => Expiry::Tombstone(Record {
                version: self.version.wrapping_add(1),
                state: RecordState::Tombstone,
                ..self.clone()
            }),
            _ => Expiry::Keep(Some(self.next_deadline())),
        }
    }

    /// Approximate bytes this record occupies in memory (for store limits and statistics),
    /// not counting its key.
    pub fn size(&self) -> usize {
        let fields = self.fingerprint.fields.heap_size();
        let state = match &self.state {
            RecordState::Completed { response, .. } => response.size(),
            RecordState::Counter { session } => session.size(),
            _ => 0,
        };
        core::mem::size_of::<Record>() + fields + state
    }
}

/// The condition under which a store applies a [`Write`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Precondition {
    /// No record exists for the key.
    Absent,
    /// The stored record has exactly this version.
    Version(u64),
}

/// What a [`Write`] does when its precondition holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WriteOp {
    /// Store this record.
    Put(Record),
    /// Delete the record.
    Delete,
}

/// A compare-and-set write the engine asks the store to apply atomically: if the record
/// stored under `key` satisfies `precondition`, perform `op`; otherwise change nothing and
/// report a lost race. Dropping a `Write` unapplied loses a claim or a result.
#[must_use = "a Write does nothing until a store applies it"]
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Write {
    /// The record the write is for.
    pub key: RecordKey,
    /// The condition checked atomically with the write.
    pub precondition: Precondition,
    /// The change.
    pub op: WriteOp,
}

#[cfg(test)]
impl Write {
    /// Applies the write to `record`, the one record of its key, as a store applies it; the
    /// precondition must hold (the unit tests' one-record store).
    pub(crate) fn apply_to(self, record: &mut Option<Record>) {
        let holds = match (self.precondition, record.as_ref()) {
            (Precondition::Absent, None) => true,
            (Precondition::Version(v), Some(r)) => r.version == v,
            _ => false,
        };
        assert!(holds, "{:?} on {record:?}", self.precondition);
        *record = match self.op {
            WriteOp::Put(r) => Some(r),
            WriteOp::Delete => None,
        };
    }
}
