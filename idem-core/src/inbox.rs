//! The engine as an inbox (`IDEM-INBOX-1` to `IDEM-INBOX-3`): a receiver that may get the
//! same message twice (webhook redelivery, at-least-once queues) processes the first
//! delivery and acknowledges the others without processing them.
//!
//! A message is identified by its source (the sender: a webhook provider, a queue) and the id
//! the source gives it. Its record lives in the inbox scope of the source, and goes through
//! the same lifecycle as any key: claimed before processing, stored as processed after,
//! released when processing failed in a way that did nothing.

use crate::engine::{Attempt, Decision, Engine, Lease, Outcome, RejectReason};
use crate::event::Event;
use crate::fingerprint::Fingerprint;
use crate::key::{KeyError, RecordKey, Scope, MAX_KEY_LEN};
use crate::kind::kind_scope;
use crate::record::StoredResponse;
use crate::store::{Claim, Finish, Store};
use crate::time::UnixMillis;
use alloc::string::String;
use alloc::vec::Vec;

/// What to do with one delivery.
#[must_use = "a Process decision holds a lease that must be finished"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The first delivery (or the first after a failure): process it, then
    /// [`Inbox::processed`] or [`Inbox::failed`]. `recovered` is true when an earlier
    /// delivery's processing was interrupted and may have done part of the work.
    Process {
        /// The lease.
        lease: Lease,
        /// Whether an earlier delivery may have started the work.
        recovered: bool,
    },
    /// Already processed: acknowledge it and do nothing else (`IDEM-INBOX-1`).
    Duplicate,
    /// Another delivery of the same message is being processed: do not acknowledge it, so
    /// that the source delivers it again later (`IDEM-INBOX-2`).
    InProgress {
        /// Seconds until the other delivery's lease ends.
        retry_after_secs: u64,
    },
    /// The same message id with a different payload: not processed; a bug at the source or a
    /// forgery, worth a security log line (`IDEM-INBOX-3`).
    Conflict {
        /// The top-level JSON fields that differ, when known.
        differing: Vec<String>,
    },
    /// An earlier delivery's outcome is unknown and held for reconciliation: not processed,
    /// not acknowledged.
    Held,
}

impl Delivery {
    /// The event to log or count.
    pub fn event(&self) -> Event {
        match self {
            Delivery::Process {
                recovered: false, ..
            } => Event::Executed,
            Delivery::Process {
                recovered: true,
                lease,
            } => Event::TookOver { fence: lease.fence },
            Delivery::Duplicate => Event::Duplicate,
            Delivery::InProgress { .. } => Event::InProgress,
            Delivery::Conflict { .. } => Event::Mismatch,
            Delivery::Held => Event::OutcomeUnknownHit,
        }
    }

    /// Whether the source should be told the message was received (and not send it again).
    pub fn acknowledge(&self) -> bool {
        matches!(self, Delivery::Duplicate | Delivery::Conflict { .. })
    }
}

/// An inbox over an [`Engine`]. The engine's key retention is how long a message id is
/// remembered: it must be longer than the source's redelivery horizon.
#[derive(Clone, Debug, Default)]
pub struct Inbox {
    engine: Engine,
}

impl Inbox {
    /// An inbox with `engine`'s lease and retention.
    pub fn new(engine: Engine) -> Inbox {
        Inbox { engine }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Where the record for message `id` from `source` lives: in the inbox scope of
    /// `source`. The id must be 1 to 255 visible ASCII characters (or spaces), like a key.
    pub fn message_key(&self, source: &str, id: &str) -> Result<RecordKey, KeyError> {
        if id.is_empty() {
            return Err(KeyError::Empty);
        }
        if id.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: id.len() });
        }
        if let Some((at, byte)) = id
            .bytes()
            .enumerate()
            .find(|(_, b)| !(0x20..=0x7e).contains(b))
        {
            return Err(KeyError::InvalidByte { at, byte });
        }
        Ok(RecordKey::new(
            kind_scope(&Scope::custom(source), "inbox"),
            id,
        ))
    }

    /// Decides a delivery whose `attempt.key` is [`Inbox::message_key`], given the record
    /// read for it.
    pub fn decide(
        &self,
        now: UnixMillis,
        attempt: &Attempt<'_>,
        stored: Option<&crate::record::Record>,
    ) -> Decision {
        self.engine.decide(now, attempt, stored)
    }

    /// Reads, decides and claims on `store` for one delivery of the message under `key`
    /// (from [`Inbox::message_key`]) with payload `fingerprint`.
    pub fn receive<S: Store + ?Sized>(
        &self,
        store: &mut S,
        now: UnixMillis,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        nonce: u64,
    ) -> Result<Delivery, S::Error> {
        let attempt = Attempt {
            key,
            fingerprint,
            nonce,
        };
        let claim = store.claim(&self.engine, now, &attempt)?;
        Ok(match claim {
            Claim::Execute { lease, recovered } => Delivery::Process {
                lease: *lease,
                recovered,
            },
            // A remembered id whose stored answer has expired was processed all the same.
            Claim::Done(Decision::Replay(_) | Decision::Rejected(RejectReason::KeyExpired)) => {
                Delivery::Duplicate
            }
            Claim::Done(Decision::InProgress { retry_after_secs }) => {
                Delivery::InProgress { retry_after_secs }
            }
            Claim::Done(Decision::Mismatch { differing }) => Delivery::Conflict { differing },
            Claim::Done(_) => Delivery::Held,
        })
    }

    /// Records that the message under `lease` was processed: later deliveries are
    /// duplicates.
    pub fn processed<S: Store + ?Sized>(
        &self,
        store: &mut S,
        now: UnixMillis,
        lease: &Lease,
    ) -> Result<Finish, S::Error> {
        let done = StoredResponse {
            status: 204,
            headers: Vec::new(),
            body: Vec::new(),
        };
        store.finish(&self.engine, now, lease, Outcome::Final(done))
    }

    /// Records that processing failed without effect: the next delivery processes the
    /// message again (`IDEM-INBOX-2`).
    pub fn failed<S: Store + ?Sized>(
        &self,
        store: &mut S,
        now: UnixMillis,
        lease: &Lease,
    ) -> Result<Finish, S::Error> {
        store.finish(&self.engine, now, lease, Outcome::Retryable)
    }
}
