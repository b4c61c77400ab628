//! The transition logic. Every state change of a record is decided here and nowhere else.

use crate::event::Event;
use crate::fingerprint::Fingerprint;
use crate::key::RecordKey;
use crate::problem::Problem;
use crate::record::{Precondition, Record, RecordState, Write, WriteOp};
use crate::response::StoredResponse;
use crate::time::UnixMillis;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

mod config;
mod decision;

pub use config::{
    Config, ConfigError, UnknownOutcomePolicy, DEFAULT_MAX_RETRY_AFTER, RETRY_SOON_SECS,
};
pub(crate) use decision::SharedOutcome;
pub use decision::{CompleteError, Decision, Outcome, RejectReason};

/// One request as the engine sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt<'a> {
    /// The record it addresses.
    pub(crate) key: &'a RecordKey,
    /// Its fingerprint.
    pub(crate) fingerprint: &'a Fingerprint,
    /// A random value from the caller; it becomes the first version of a new record so that
    /// versions never repeat across incarnations of a key (see [`Record::version`]).
    pub(crate) nonce: u64,
}

/// The right to run the handler for one record, fenced: a [`Write`] built from a lease
/// applies only while the record is still the one this lease created (`IDEM-LEASE-2`).
/// Leases serialise (serde), so an asynchronous host can keep one across a suspension.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    /// The record.
    pub key: RecordKey,
    /// The version of the in-flight record this lease wrote.
    pub version: u64,
    /// The fencing number; grows on every takeover.
    pub fence: u64,
    /// When the lease ends.
    pub expires: UnixMillis,
    /// The fingerprint of the request being executed.
    pub fingerprint: Fingerprint,
    /// When the record was first created.
    pub created: UnixMillis,
    /// When the key expires (unless completion extends it).
    pub key_expires: UnixMillis,
}

/// The idempotency engine: a pure function of its [`Config`], the time and the record.
///
/// A host hands it to a [`Policy`](crate::Policy) (or an [`Inbox`](crate::Inbox)), whose
/// request machines take every step of a request by its rules: the claim, the completion
/// and the heartbeats. A store reads the passage of time from it ([`Engine::expire`],
/// [`Engine::next_deadline`]).
#[derive(Clone, Debug, Default)]
pub struct Engine {
    config: Config,
}

impl Engine {
    /// An engine with a checked configuration.
    pub fn new(config: Config) -> Result<Engine, ConfigError> {
        for (name, d) in [
            ("response_ttl", config.response_ttl),
            ("key_ttl", config.key_ttl),
            ("lease", config.lease),
            ("max_retry_after", config.max_retry_after),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        if config.key_ttl < config.response_ttl {
            return Err(ConfigError::KeyTtlShorterThanResponseTtl);
        }
        if config.lease > config.key_ttl {
            return Err(ConfigError::LeaseLongerThanKeyTtl);
        }
        Ok(Engine { config })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Decides what to do with `attempt`, given the record the caller read for its key (or
    /// `None`). A record whose key has expired counts as absent, whether or not the store
    /// has swept it yet, unless it holds a live lease: a lease never outlives its key
    /// (`IDEM-LEASE-4`).
    pub(crate) fn decide(
        &self,
        now: UnixMillis,
        attempt: &Attempt<'_>,
        stored: Option<&Record>,
    ) -> Decision {
        let precondition =
            stored.map_or(Precondition::Absent, |r| Precondition::Version(r.version));
        let Some(record) = stored.filter(|r| r.is_live(now)) else {
            return self.claim(now, attempt, precondition, None);
        };
        match record.state {
            // A server-issued token: the first request consumes it (`IDEM-TOKEN-2`); the
            // record's version chain continues so that versions never repeat.
            RecordState::Issued { expires } if now >= expires => {
                return Decision::Rejected(RejectReason::TokenExpired);
            }
            RecordState::Issued { .. } => {
                let consume = Attempt {
                    nonce: record.version.wrapping_add(1),
                    ..*attempt
                };
                return self.claim(now, &consume, precondition, None);
            }
            // A counter session is not a key: whatever reached it under an engine scope
            // names another kind of record (`IDEM-KIND-1`).
            RecordState::Counter { .. } => return Decision::Rejected(RejectReason::Collision),
            // Settled as never to run, whatever the payload (`IDEM-STATUS-3`).
            RecordState::Settled => return Decision::Rejected(RejectReason::Settled),
            _ => {}
        }
        if !record.fingerprint.matches(attempt.fingerprint) {
            return Decision::Mismatch {
                differing: record.fingerprint.differing_fields(attempt.fingerprint),
                processed: matches!(
                    record.state,
                    RecordState::Completed { .. } | RecordState::Tombstone
                ),
            };
        }
        match &record.state {
            RecordState::InFlight { lease_expires } if now < *lease_expires => {
                Decision::InProgress {
                    retry_after_secs: self.config.retry_after(now, *lease_expires),
                }
            }
            RecordState::InFlight { .. } => self.claim(now, attempt, precondition, Some(record)),
            RecordState::Completed {
                response,
                response_expires,
            } if now < *response_expires => Decision::Replay(Arc::clone(response)),
            RecordState::Completed { .. } | RecordState::Tombstone => {
                Decision::Rejected(RejectReason::KeyExpired)
            }
            RecordState::OutcomeUnknown { .. } => Decision::Rejected(RejectReason::OutcomeUnknown),
            // Handled above, before the fingerprint comparison.
            RecordState::Issued { .. } | RecordState::Counter { .. } | RecordState::Settled => {
                Decision::Rejected(RejectReason::Collision)
            }
        }
    }

    /// A fresh claim, or a takeover of `previous` whose lease has ended.
    fn claim(
        &self,
        now: UnixMillis,
        attempt: &Attempt<'_>,
        precondition: Precondition,
        previous: Option<&Record>,
    ) -> Decision {
        let (version, fence, created) = match previous {
            Some(r) => (
                r.version.wrapping_add(1),
                r.fence.wrapping_add(1),
                r.created,
            ),
            None => (attempt.nonce, 1, now),
        };
        let lease = Lease {
            key: attempt.key.clone(),
            version,
            fence,
            expires: now.saturating_add(self.config.lease),
            fingerprint: attempt.fingerprint.clone(),
            created,
            key_expires: now.saturating_add(self.config.key_ttl),
        };
        let write = Write {
            key: attempt.key.clone(),
            precondition,
            op: WriteOp::Put(in_flight(&lease, lease.expires)),
        };
        Decision::Execute {
            lease: Box::new(lease),
            write: Box::new(write),
            recovered: previous.is_some(),
        }
    }

    /// The write that records the handler's outcome under `lease`, its response shared so
    /// that a completion can be rebuilt after a lost race without copying it. Apply it before
    /// the response leaves the host (`IDEM-OUT-5`). The store refuses it if the lease was
    /// fenced out, and then nothing changes (`IDEM-LEASE-2`).
    pub(crate) fn complete_shared(
        &self,
        now: UnixMillis,
        lease: &Lease,
        outcome: SharedOutcome,
    ) -> Result<Write, CompleteError> {
        let op = match outcome {
            SharedOutcome::Final(response) => self.completed(now, lease, response)?,
            SharedOutcome::Retryable => WriteOp::Delete,
            SharedOutcome::Unknown(response) => match (self.config.unknown_outcome, response) {
                (UnknownOutcomePolicy::Store, Some(response)) => {
                    self.completed(now, lease, response)?
                }
                (UnknownOutcomePolicy::Reexecute, _) => WriteOp::Put(Record {
                    version: lease.version.wrapping_add(1),
                    ..in_flight(lease, now)
                }),
                (UnknownOutcomePolicy::Hold | UnknownOutcomePolicy::Store, _) => {
                    WriteOp::Put(Record {
                        version: lease.version.wrapping_add(1),
                        state: RecordState::OutcomeUnknown { since: now },
                        ..in_flight(lease, now)
                    })
                }
            },
        };
        Ok(Write {
            key: lease.key.clone(),
            precondition: Precondition::Version(lease.version),
            op,
        })
    }

    fn completed(
        &self,
        now: UnixMillis,
        lease: &Lease,
        response: Arc<StoredResponse>,
    ) -> Result<WriteOp, CompleteError> {
        if !(100..=599).contains(&response.status) {
            return Err(CompleteError::InvalidStatus(response.status));
        }
        Ok(WriteOp::Put(Record {
            version: lease.version.wrapping_add(1),
            fence: lease.fence,
            fingerprint: lease.fingerprint.clone(),
            created: lease.created,
            key_expires: lease
                .key_expires
                .max(now.saturating_add(self.config.key_ttl)),
            state: RecordState::Completed {
                response,
                response_expires: now.saturating_add(self.config.response_ttl),
            },
        }))
    }

    /// A heartbeat: a new lease ending one lease period from `now`, and the write that
    /// records it (`IDEM-LEASE-3`). The key's retention moves with it, so that the key is
    /// remembered for a whole `key_ttl` after the last heartbeat and never ends before the
    /// lease (`IDEM-LEASE-4`). Refused once the lease has ended.
    pub(crate) fn extend(
        &self,
        now: UnixMillis,
        lease: &Lease,
    ) -> Result<(Lease, Write), CompleteError> {
        if now >= lease.expires {
            return Err(CompleteError::LeaseExpired);
        }
        let next = Lease {
            version: lease.version.wrapping_add(1),
            expires: now.saturating_add(self.config.lease),
            key_expires: lease
                .key_expires
                .max(now.saturating_add(self.config.key_ttl)),
            ..lease.clone()
        };
        let write = Write {
            key: lease.key.clone(),
            precondition: Precondition::Version(lease.version),
            op: WriteOp::Put(in_flight(&next, next.expires)),
        };
        Ok((next, write))
    }

    /// Reconciles a record held as outcome-unknown: a final outcome stores the response, a
    /// retryable one releases the key (`IDEM-OUT-3`).
    // No operation reconciles a held outcome yet; the rule is kept, and unit-tested, for it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn resolve(
        &self,
        now: UnixMillis,
        key: &RecordKey,
        record: &Record,
        outcome: Outcome,
    ) -> Result<Write, CompleteError> {
        if !matches!(record.state, RecordState::OutcomeUnknown { .. }) {
            return Err(CompleteError::NotOutcomeUnknown);
        }
        let lease = Lease {
            key: key.clone(),
            version: record.version,
            fence: record.fence,
            expires: now,
            fingerprint: record.fingerprint.clone(),
            created: record.created,
            key_expires: record.key_expires,
        };
        let op = match outcome {
            Outcome::Final(response) | Outcome::Unknown(Some(response)) => {
                self.completed(now, &lease, Arc::new(response))?
            }
            Outcome::Retryable | Outcome::Unknown(None) => WriteOp::Delete,
        };
        Ok(Write {
            key: key.clone(),
            precondition: Precondition::Version(record.version),
            op,
        })
    }

    /// When `record` next needs attention from the store (an alarm, a sweep).
    pub fn next_deadline(&self, record: &Record) -> UnixMillis {
        record.next_deadline()
    }

    /// The write that applies the passage of time to `record` at `now` (drop an expired
    /// response, delete an expired key), or `None` if nothing is due (`IDEM-TTL-4`).
    pub fn expire(&self, now: UnixMillis, key: &RecordKey, record: &Record) -> Option<Write> {
        let op = match record.expire(now) {
            crate::record::Expiry::Keep(_) => return None,
            crate::record::Expiry::Tombstone(t) => WriteOp::Put(t),
            crate::record::Expiry::Delete => WriteOp::Delete,
        };
        Some(Write {
            key: key.clone(),
            precondition: Precondition::Version(record.version),
            op,
        })
    }
}

fn in_flight(lease: &Lease, lease_expires: UnixMillis) -> Record {
    Record {
        version: lease.version,
        fence: lease.fence,
        fingerprint: lease.fingerprint.clone(),
        created: lease.created,
        key_expires: lease.key_expires,
        state: RecordState::InFlight { lease_expires },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &str) -> StoredResponse {
        StoredResponse {
            status: 200,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn apply(record: &mut Option<Record>, write: Write) {
        write.apply_to(record);
    }

    /// The record of a key claimed and its handler's outcome held as unknown, under
    /// `engine`.
    fn held(engine: &Engine, attempt: &Attempt<'_>, now: UnixMillis) -> Option<Record> {
        let mut record = None;
        let Decision::Execute { lease, write, .. } = engine.decide(now, attempt, None) else {
            panic!("a new key executes")
        };
        apply(&mut record, *write);
        let write = engine
            .complete_shared(now, &lease, Outcome::Unknown(None).into())
            .unwrap();
        apply(&mut record, write);
        record
    }

    /// A record held as outcome-unknown stays refused until it is reconciled: a final
    /// outcome is then replayed, a retryable one releases the key, and only a held record can
    /// be reconciled.
    #[test]
    fn a_held_outcome_is_reconciled_by_resolve() {
        // IDEM-OUT-3
        let engine = Engine::new(Config {
            unknown_outcome: UnknownOutcomePolicy::Hold,
            ..Config::default()
        })
        .unwrap();
        let now = UnixMillis(1_000_000);
        let later = UnixMillis(1_060_000);
        let key = RecordKey::new(crate::key::Scope::new("a", "POST", "/orders"), "k");
        let fingerprint = Fingerprint::from_digest([1; 32]);
        let attempt = Attempt {
            key: &key,
            fingerprint: &fingerprint,
            nonce: 7,
        };
        let mut record = held(&engine, &attempt, now);
        assert_eq!(
            engine.decide(later, &attempt, record.as_ref()),
            Decision::Rejected(RejectReason::OutcomeUnknown)
        );
        let held_record = record.clone().unwrap();
        let write = engine
            .resolve(later, &key, &held_record, Outcome::Final(ok("reconciled")))
            .unwrap();
        apply(&mut record, write);
        assert!(matches!(
            engine.decide(later, &attempt, record.as_ref()),
            Decision::Replay(r) if r.body == b"reconciled"
        ));
        assert_eq!(
            engine.resolve(later, &key, record.as_ref().unwrap(), Outcome::Retryable),
            Err(CompleteError::NotOutcomeUnknown)
        );

        let mut record = held(&engine, &attempt, now);
        let held_record = record.clone().unwrap();
        let write = engine
            .resolve(later, &key, &held_record, Outcome::Retryable)
            .unwrap();
        assert_eq!(write.op, WriteOp::Delete);
        apply(&mut record, write);
        assert!(record.is_none());
        assert!(matches!(
            engine.decide(later, &attempt, None),
            Decision::Execute {
                recovered: false,
                ..
            }
        ));
    }
}
