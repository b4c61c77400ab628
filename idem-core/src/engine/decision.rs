//! What the engine decides for a request (`Decision`, `RejectReason`), what a handler's
//! outcome is (`Outcome`), and why a completion is refused (`CompleteError`).

use super::*;

/// Why the engine refuses a request without running it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum RejectReason {
    /// The key's response has expired but the key is still remembered: a late retry, or a
    /// replay of a captured request. A security event (`IDEM-TTL-3`).
    KeyExpired,
    /// A previous attempt's outcome is unknown and the policy holds the key (`IDEM-OUT-3`).
    OutcomeUnknown,
    /// A status query settled the key as never to run before any request claimed it: a
    /// copy of the original arriving late is refused, never executed (`IDEM-STATUS-3`).
    Settled,
    /// The key names another request: a different payload under a time or counter key
    /// (including a counter that wrapped onto a slot still in flight or retained). Never
    /// replayed, never executed (`IDEM-TIME-4`, `IDEM-CTR-7`).
    Collision,
    /// The key is older than the server remembers: a time key past its maximum age, or a
    /// counter below the low-water mark. Never executed (`IDEM-TIME-3`, `IDEM-CTR-6`).
    Stale,
    /// A time key further in the future than the allowed clock skew (`IDEM-TIME-2`).
    FromFuture {
        /// How far ahead of the server's clock, in milliseconds.
        ahead_ms: u64,
    },
    /// A counter key from a client without a session (`IDEM-CTR-3`).
    UnknownClient,
    /// A counter key from an epoch older than the session's (`IDEM-CTR-4`).
    StaleEpoch,
    /// A counter key from an epoch newer than the session's, never opened (`IDEM-CTR-4`).
    UnknownEpoch,
    /// A sequence number or low-water mark that does not fit in the session's bits
    /// (`IDEM-CTR-1`).
    InvalidSequence,
    /// A low-water mark beyond the next sequence number (`IDEM-CTR-11`).
    InvalidLowWater,
    /// A sequence number that skips a whole window or more (`IDEM-CTR-9`). Retrying after
    /// the missing numbers have arrived can succeed.
    SequenceGap {
        /// The next sequence number the session expects.
        next: u64,
    },
    /// Taking the sequence number would slide the window over a slot still in flight or
    /// outcome-unknown (`IDEM-CTR-10`).
    WindowFull {
        /// Seconds until the blocking slot's lease ends, at least 1.
        retry_after_secs: u64,
    },
    /// A token this server did not issue for this scope (`IDEM-TOKEN-3`).
    TokenForged,
    /// An authentic token that was never stored, or was lost (`IDEM-TOKEN-4`).
    TokenUnknown,
    /// An authentic token presented after its expiry without having been consumed
    /// (`IDEM-TOKEN-4`).
    TokenExpired,
}

impl RejectReason {
    /// The event for this refusal (`IDEM-EVT-1`).
    pub fn event(&self) -> Event {
        match self {
            RejectReason::KeyExpired | RejectReason::Settled => Event::TombstoneHit,
            RejectReason::OutcomeUnknown => Event::OutcomeUnknownHit,
            RejectReason::Collision => Event::Collision,
            RejectReason::Stale => Event::Stale,
            RejectReason::TokenForged => Event::Forged,
            _ => Event::Rejected,
        }
    }

    /// The error response for this refusal.
    pub fn problem(&self) -> Problem {
        match self {
            RejectReason::KeyExpired => Problem::KEY_EXPIRED,
            RejectReason::OutcomeUnknown => Problem::OUTCOME_UNKNOWN,
            RejectReason::Settled => Problem::KEY_SETTLED,
            RejectReason::Collision => Problem::KEY_COLLISION,
            RejectReason::Stale => Problem::KEY_STALE,
            RejectReason::FromFuture { .. } => Problem::KEY_FROM_FUTURE,
            RejectReason::UnknownClient => Problem::UNKNOWN_CLIENT,
            RejectReason::StaleEpoch => Problem::STALE_EPOCH,
            RejectReason::UnknownEpoch => Problem::UNKNOWN_EPOCH,
            RejectReason::InvalidSequence => Problem::MALFORMED_KEY,
            RejectReason::InvalidLowWater => Problem::INVALID_LOW_WATER,
            RejectReason::SequenceGap { .. } => Problem::COUNTER_GAP,
            RejectReason::WindowFull { .. } => Problem::COUNTER_WINDOW_FULL,
            RejectReason::TokenForged => Problem::TOKEN_FORGED,
            RejectReason::TokenUnknown => Problem::TOKEN_UNKNOWN,
            RejectReason::TokenExpired => Problem::TOKEN_EXPIRED,
        }
    }

    /// The `Retry-After` to send with the refusal, in seconds, for refusals that a later
    /// retry of the same request can overcome.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            RejectReason::WindowFull { retry_after_secs } => Some(*retry_after_secs),
            RejectReason::SequenceGap { .. } | RejectReason::OutcomeUnknown => {
                Some(RETRY_SOON_SECS)
            }
            _ => None,
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::KeyExpired => {
                f.write_str("the response for this key has expired; the key cannot be reused yet")
            }
            RejectReason::OutcomeUnknown => {
                f.write_str("the outcome of an earlier attempt with this key is being reconciled")
            }
            RejectReason::Settled => f.write_str(
                "this key was settled as never to run; nothing was executed, and nothing will be",
            ),
            RejectReason::Collision => {
                f.write_str("this key is already used by a request with a different payload")
            }
            RejectReason::Stale => {
                f.write_str("this key is older than the server remembers; it can never run")
            }
            RejectReason::FromFuture { ahead_ms } => write!(
                f,
                "the key's timestamp is {ahead_ms} ms ahead of the server's clock"
            ),
            RejectReason::UnknownClient => {
                f.write_str("the client has no session; open one before sending counter keys")
            }
            RejectReason::StaleEpoch => {
                f.write_str("the key's epoch is older than the session's current epoch")
            }
            RejectReason::UnknownEpoch => {
                f.write_str("the key's epoch was never opened for this session")
            }
            RejectReason::InvalidSequence => {
                f.write_str("the sequence number does not fit in the session's bits")
            }
            RejectReason::InvalidLowWater => {
                f.write_str("the low-water mark is beyond the next sequence number")
            }
            RejectReason::SequenceGap { next } => write!(
                f,
                "the sequence number skips a whole window; the next expected is {next}"
            ),
            RejectReason::WindowFull { .. } => f.write_str(
                "the window cannot move past an earlier request that is still in progress",
            ),
            RejectReason::TokenForged => f.write_str("the token was not issued by this server"),
            RejectReason::TokenUnknown => f.write_str("the token is not known to this server"),
            RejectReason::TokenExpired => f.write_str("the token has expired"),
        }
    }
}

/// The engine's answer to one attempt: what a request machine's claim ends with, when it does
/// not run the handler ([`Request::decision`](crate::Request::decision),
/// [`Claimed::Done`](crate::Claimed::Done)).
#[must_use = "a Decision must be acted on: an Execute carries a claim that must be applied"]
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Decision {
    /// Claim the key with `write`, then run the handler under `lease` (`IDEM-EXEC-1`).
    /// `recovered` is true when this attempt takes over from one whose lease expired: the
    /// handler should reconcile with whatever that attempt may have done (`IDEM-LEASE-1`).
    ///
    /// The lease and the write are boxed so that every decision stays small: a decision is
    /// moved through several returns on its way to the host, and the other answers (a
    /// replay above all) should not pay for copying the largest one.
    Execute {
        /// The lease to complete or extend.
        lease: Box<Lease>,
        /// The claim to apply; a lost race means decide again.
        write: Box<Write>,
        /// Whether an earlier attempt may have started the work.
        recovered: bool,
    },
    /// Send this stored response again (`IDEM-REPLAY-1`).
    Replay(Arc<StoredResponse>),
    /// Another attempt holds the lease; retry after this many seconds (`IDEM-CONC-1`).
    InProgress {
        /// Seconds until the lease ends, at least 1.
        retry_after_secs: u64,
    },
    /// The key was used for a different request (`IDEM-FP-1`); `differing` lists the
    /// top-level JSON fields that differ, when known (`IDEM-FP-4`).
    Mismatch {
        /// Sorted field names.
        differing: Vec<String>,
        /// Whether the key's record holds what its request came to (completed, or expired
        /// since): false while it is in flight, after a failed attempt, or with its outcome
        /// unknown. An inbox acknowledges another payload under a message id only when its
        /// message was processed (`IDEM-INBOX-3`).
        processed: bool,
    },
    /// Refused.
    Rejected(RejectReason),
}

impl Decision {
    /// The answer when a key's record keeps changing under the claim loop
    /// ([`crate::MAX_LOST_RACES`] lost races in a row): another attempt is busy with it.
    pub const CONTENDED: Decision = Decision::InProgress {
        retry_after_secs: RETRY_SOON_SECS,
    };

    /// The event a host should log or count for this decision (`IDEM-EVT-1`).
    pub fn event(&self) -> Event {
        match self {
            Decision::Execute {
                recovered: false, ..
            } => Event::Executed,
            Decision::Execute {
                recovered: true,
                lease,
                ..
            } => Event::TookOver { fence: lease.fence },
            Decision::Replay(_) => Event::Replayed,
            Decision::InProgress { .. } => Event::InProgress,
            Decision::Mismatch { .. } => Event::Mismatch,
            Decision::Rejected(reason) => reason.event(),
        }
    }

    /// The error response for decisions that refuse the request; `None` for
    /// [`Decision::Execute`] and [`Decision::Replay`].
    pub fn problem(&self) -> Option<Problem> {
        match self {
            Decision::Execute { .. } | Decision::Replay(_) => None,
            Decision::InProgress { .. } => Some(Problem::IN_PROGRESS),
            Decision::Mismatch { .. } => Some(Problem::MISMATCH),
            Decision::Rejected(reason) => Some(reason.problem()),
        }
    }
}

/// What the handler's result means for the record (`IDEM-OUT-1` to `IDEM-OUT-3`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A final answer (2xx, 3xx, deterministic 4xx): stored and replayed.
    Final(StoredResponse),
    /// Nothing happened and trying again is safe (for example 408, 425, 429, or a handler
    /// that rejected the request before acting): the key is released.
    Retryable,
    /// The effect is unknown (a crash, a timeout, most 5xx); the configured
    /// [`UnknownOutcomePolicy`] applies. The response, if any, is stored only under
    /// [`UnknownOutcomePolicy::Store`].
    Unknown(Option<StoredResponse>),
}

impl Outcome {
    /// The default classification of an HTTP response by status (`IDEM-OUT-4`): 408, 425
    /// and 429 are retryable; other 1xx–4xx are final; 5xx are unknown.
    pub fn classify(response: StoredResponse) -> Outcome {
        match response.status {
            408 | 425 | 429 => Outcome::Retryable,
            100..=499 => Outcome::Final(response),
            _ => Outcome::Unknown(Some(response)),
        }
    }
}

/// A stored outcome that can be rebuilt after a conflict without copying the response.
#[derive(Clone, Debug)]
pub(crate) enum SharedOutcome {
    Final(Arc<StoredResponse>),
    Retryable,
    Unknown(Option<Arc<StoredResponse>>),
}

impl From<Outcome> for SharedOutcome {
    fn from(o: Outcome) -> SharedOutcome {
        match o {
            Outcome::Final(r) => SharedOutcome::Final(Arc::new(r)),
            Outcome::Retryable => SharedOutcome::Retryable,
            Outcome::Unknown(r) => SharedOutcome::Unknown(r.map(Arc::new)),
        }
    }
}

/// Why a completion, heartbeat or resolution could not be built. A completion under a
/// stale lease is not an error here: its write carries the lease's version as precondition
/// and the store refuses it (`IDEM-LEASE-2`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompleteError {
    /// A response status outside 100–599.
    InvalidStatus(u16),
    /// A heartbeat after the lease ended: another attempt may already have taken over.
    LeaseExpired,
    /// A reconciliation was given a record that is not outcome-unknown.
    NotOutcomeUnknown,
}

impl fmt::Display for CompleteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompleteError::InvalidStatus(s) => write!(f, "invalid response status {s}"),
            CompleteError::LeaseExpired => f.write_str("the lease has expired"),
            CompleteError::NotOutcomeUnknown => f.write_str("the record is not outcome-unknown"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for CompleteError {}
