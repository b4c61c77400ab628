//! The engine as an inbox (`IDEM-INBOX-1` to `IDEM-INBOX-3`): a receiver that may get the
//! same message twice (webhook redelivery, at-least-once queues) processes the first
//! delivery and acknowledges the others without processing them.
//!
//! A message is identified by its source (the sender: a webhook provider, a queue) and the id
//! the source gives it. Its record lives in the inbox scope of the source, and goes through
//! the same lifecycle as any key: claimed before processing, stored as processed after,
//! left to a later delivery when processing failed. A delivery is one operation of the
//! request machine ([`Inbox::deliver`]), driven like any request; its result is a
//! [`Delivery`].

use crate::engine::{Engine, Outcome};
use crate::fingerprint::FingerprintSpec;
use crate::key::{KeyError, RecordKey, Scope, MAX_KEY_LEN};
use crate::kind::kind_scope;
use crate::response::StoredResponse;
use alloc::string::String;
use alloc::vec::Vec;

/// What became of one delivery ([`Request::delivery`](crate::Request::delivery)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery {
    /// The first delivery (or the first after a failure): it was processed now, and later
    /// deliveries are duplicates. `recovered` when an earlier delivery's processing was
    /// interrupted and may have done part of the work.
    Processed {
        /// Whether an earlier delivery may have started the work.
        recovered: bool,
    },
    /// Already processed: acknowledge it and do nothing else, also when the record's stored
    /// answer has expired while its id is still remembered (`IDEM-INBOX-1`).
    Duplicate,
    /// Another delivery of the same message is being processed: do not acknowledge it, so
    /// that the source delivers it again later (`IDEM-INBOX-2`).
    InProgress {
        /// Seconds until the source should deliver it again.
        retry_after_secs: u64,
    },
    /// The id of a message that was processed, with a different payload: not processed; a
    /// bug at the source or a forgery, worth a security log line (`IDEM-INBOX-3`).
    Conflict {
        /// The top-level JSON fields that differ, when known.
        differing: Vec<String>,
    },
    /// An earlier delivery's outcome is unknown and held for reconciliation: not processed,
    /// not acknowledged.
    Held,
    /// Processing failed, or its outcome could not be recorded: not acknowledged; a later
    /// delivery processes it again as a recovery.
    Failed,
    /// The delivery was refused before it was claimed: a malformed id or payload, the store
    /// failed, or the id of a message not processed yet (in flight, failed, or its outcome
    /// unknown) came with a different payload (the receipt says which; `IDEM-INBOX-3`).
    Refused,
}

impl Delivery {
    /// Whether the source should be told the message was received (and not send it again).
    pub fn acknowledge(&self) -> bool {
        matches!(
            self,
            Delivery::Processed { .. } | Delivery::Duplicate | Delivery::Conflict { .. }
        )
    }

    /// Its name in a receipt and in the JavaScript API: `processed`, `duplicate`,
    /// `in-progress`, `conflict`, `held`, `failed`, `refused`.
    pub fn name(&self) -> &'static str {
        match self {
            Delivery::Processed { .. } => "processed",
            Delivery::Duplicate => "duplicate",
            Delivery::InProgress { .. } => "in-progress",
            Delivery::Conflict { .. } => "conflict",
            Delivery::Held => "held",
            Delivery::Failed => "failed",
            Delivery::Refused => "refused",
        }
    }
}

/// An inbox over an [`Engine`]. The engine's key retention is how long a message id is
/// remembered: it must be longer than the source's redelivery horizon.
#[derive(Clone, Debug, Default)]
pub struct Inbox {
    engine: Engine,
    fingerprint: FingerprintSpec,
}

impl Inbox {
    /// An inbox with `engine`'s lease and retention.
    pub fn new(engine: Engine) -> Inbox {
        Inbox {
            engine,
            fingerprint: FingerprintSpec::default(),
        }
    }

    /// What goes into a payload's fingerprint (the body's size limit, fields a sender
    /// changes between deliveries of one message).
    pub fn with_fingerprint(mut self, spec: FingerprintSpec) -> Inbox {
        self.fingerprint = spec;
        self
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// What goes into a payload's fingerprint.
    pub fn fingerprint_spec(&self) -> &FingerprintSpec {
        &self.fingerprint
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
        // A long source enters as its digest, as a long route does; so does one that begins
        // as a digest does (`h:`), or it would name a long source's messages.
        let scope = Scope::custom(match crate::key::digest_if_long(source) {
            Some(digest) => digest,
            None if source.starts_with("h:") => crate::key::digest_of(source),
            None => source.into(),
        });
        Ok(RecordKey::new(kind_scope(&scope, "inbox"), id))
    }

    /// The outcome of a delivery whose processing is done: what
    /// [`Request::handle_outcome`](crate::Request::handle_outcome) takes for it.
    pub fn processed() -> Outcome {
        Outcome::Final(StoredResponse {
            status: 204,
            headers: Vec::new(),
            body: Vec::new(),
        })
    }
}
