//! The client's side of the boundary: the retry options, the outbox entry's states, next
//! steps and outcomes as enums (and the outcome names JavaScript reports), the client's
//! errors. JavaScript reads the enums by name from `js/client-codes/`, which
//! `tests/client_codes.rs` writes from them and checks.

use super::options::{duration, whole};
use super::ErrorParts;

/// The client's retry options as read from JavaScript (`retry: { base, cap, maxAttempts,
/// deadline }`, ms), each `None` for the default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RetryOptions {
    /// `base`.
    pub base: Option<f64>,
    /// `cap`.
    pub cap: Option<f64>,
    /// `maxAttempts`.
    pub max_attempts: Option<f64>,
    /// `deadline`.
    pub deadline: Option<f64>,
}

/// The client's retry policy (`IDEM-JS-1` for a bad value).
pub fn retry_policy(o: &RetryOptions) -> Result<idem_core::RetryPolicy, ErrorParts> {
    let d = idem_core::RetryPolicy::default();
    let attempts = match o.max_attempts {
        None => d.max_attempts,
        Some(n) if whole(n) && (1.0..=1_000_000.0).contains(&n) => n as u32,
        Some(_) => {
            return Err(ErrorParts::options(
                "retry.maxAttempts must be a whole number from 1 to 1000000",
            ))
        }
    };
    Ok(idem_core::RetryPolicy {
        base: duration("retry.base", o.base, d.base)?,
        cap: duration("retry.cap", o.cap, d.cap)?,
        max_attempts: attempts,
        deadline: duration("retry.deadline", o.deadline, d.deadline)?,
    })
}

numbered! {
    /// What `idempotentFetch` resolves to, as JavaScript reads it: its result's `outcome` is
    /// `outcomes[outcome]` of `js/client-codes/names.js` ([`FetchOutcome::name`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum FetchOutcome {
        /// A final 2xx or 3xx.
        Completed = 0,
        /// A deterministic 4xx.
        Rejected = 1,
        /// Given up, and nothing can have been processed.
        Failed = 2,
        /// Given up, and some attempt may have been processed.
        Undetermined = 3,
        /// The server says it ran, and its response is not at hand (`IDEM-CLIENT-8`).
        Executed = 4,
        /// The server settled the key: it never ran and never will; a new key is safe.
        NotExecuted = 5,
    }
}

impl FetchOutcome {
    /// Its name in the result of `idempotentFetch`.
    pub fn name(self) -> &'static str {
        match self {
            FetchOutcome::Completed => "completed",
            FetchOutcome::Rejected => "rejected",
            FetchOutcome::Failed => "failed",
            FetchOutcome::Undetermined => "undetermined",
            FetchOutcome::Executed => "executed",
            FetchOutcome::NotExecuted => "not-executed",
        }
    }

    fn of_class(class: idem_core::Completion) -> FetchOutcome {
        match class {
            idem_core::Completion::Succeeded => FetchOutcome::Completed,
            idem_core::Completion::Rejected => FetchOutcome::Rejected,
        }
    }

    /// The outcome of an entry that is over, or `None` while it is not.
    pub fn of_state(s: &idem_core::EntryState) -> Option<FetchOutcome> {
        use idem_core::EntryState as S;
        match s {
            S::Answered { class, .. } | S::Processed { class, .. } => {
                Some(FetchOutcome::of_class(*class))
            }
            S::Failed { .. } => Some(FetchOutcome::Failed),
            S::Undetermined { .. } => Some(FetchOutcome::Undetermined),
            S::Executed { .. } => Some(FetchOutcome::Executed),
            S::NotExecuted => Some(FetchOutcome::NotExecuted),
            S::Created | S::Sent | S::Waiting { .. } | S::Asking { .. } => None,
        }
    }

    /// The outcome a next step ends the interaction with, or `None` for a retry or another
    /// status query.
    pub fn of_next(n: &idem_core::NextStep) -> Option<FetchOutcome> {
        use idem_core::NextStep as N;
        match n {
            N::Complete { class, .. } => Some(FetchOutcome::of_class(*class)),
            N::Failed { .. } => Some(FetchOutcome::Failed),
            N::Undetermined { .. } => Some(FetchOutcome::Undetermined),
            N::Executed { .. } => Some(FetchOutcome::Executed),
            N::NotExecuted => Some(FetchOutcome::NotExecuted),
            N::Retry { .. } | N::AskStatus { .. } => None,
        }
    }
}

numbered! {
    /// What the outbox says to do after a result ([`idem_core::NextStep`]), as JavaScript reads
    /// `Next.kind`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum NextKind {
        /// The interaction is complete: act on the response.
        Complete = 0,
        /// Send again after the backoff.
        Retry = 1,
        /// Given up, and nothing can have been processed.
        Failed = 2,
        /// Given up, and some attempt may have been processed.
        Undetermined = 3,
        /// Ask the server about the key again, at `Outbox.nextAsk`.
        AskStatus = 4,
        /// The server says it ran; its response is not at hand.
        Executed = 5,
        /// The server settled the key: it never ran.
        NotExecuted = 6,
    }
}

impl NextKind {
    /// The kind of a core next step.
    pub fn of(n: &idem_core::NextStep) -> NextKind {
        use idem_core::NextStep as N;
        match n {
            N::Complete { .. } => NextKind::Complete,
            N::Failed { .. } => NextKind::Failed,
            N::Undetermined { .. } => NextKind::Undetermined,
            N::Retry { .. } => NextKind::Retry,
            N::AskStatus { .. } => NextKind::AskStatus,
            N::Executed { .. } => NextKind::Executed,
            N::NotExecuted => NextKind::NotExecuted,
        }
    }
}

numbered! {
    /// Where an outbox entry stands ([`idem_core::EntryState`]), as JavaScript reads
    /// `Outbox.state`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum OutboxState {
        /// Not sent yet.
        Created = 0,
        /// Sent, and no result reported: its effect is unknown.
        Sent = 1,
        /// Waiting to be sent again.
        Waiting = 2,
        /// A final response arrived.
        Answered = 3,
        /// The application acted on the final response.
        Processed = 4,
        /// Given up, and nothing can have been processed.
        Failed = 5,
        /// Given up, and some attempt may have been processed.
        Undetermined = 6,
        /// The server found the key in progress: ask it again.
        Asking = 7,
        /// The server says it ran; its response is not at hand.
        Executed = 8,
        /// The server settled the key: it never ran.
        NotExecuted = 9,
    }
}

impl OutboxState {
    /// The state of a core entry.
    pub fn of(s: &idem_core::EntryState) -> OutboxState {
        use idem_core::EntryState as S;
        match s {
            S::Created => OutboxState::Created,
            S::Sent => OutboxState::Sent,
            S::Waiting { .. } => OutboxState::Waiting,
            S::Answered { .. } => OutboxState::Answered,
            S::Processed { .. } => OutboxState::Processed,
            S::Failed { .. } => OutboxState::Failed,
            S::Undetermined { .. } => OutboxState::Undetermined,
            S::Asking { .. } => OutboxState::Asking,
            S::Executed { .. } => OutboxState::Executed,
            S::NotExecuted => OutboxState::NotExecuted,
        }
    }
}

/// The `code` of a client error: `IDEM-CLIENT-1` for a changed payload, `IDEM-KEY-1` for a
/// bad key, `IDEM-CLIENT-8` for a status answer the entry cannot take, `IDEM-CLIENT-7` for
/// another call in the wrong state. The message is fixed per error, without the values the
/// core's `Display` formats (the client's module has no formatting machinery).
pub fn client_error(e: &idem_core::ClientError) -> ErrorParts {
    use idem_core::ClientError as E;
    let (code, message) = match e {
        E::PayloadChanged => (
            "IDEM-CLIENT-1",
            "the payload differs from the first send; a retry must send the same payload",
        ),
        E::InvalidKey(_) => (
            "IDEM-KEY-1",
            "invalid idempotency key: 1 to 255 characters of visible ASCII or space",
        ),
        E::NothingToReconcile(_) => ("IDEM-CLIENT-8", "nothing to ask the server about"),
        E::NotDue { .. } => ("IDEM-CLIENT-7", "the backoff has not ended"),
        E::NothingInFlight(_) => ("IDEM-CLIENT-7", "no send is in flight"),
        E::NotAnswered(_) => ("IDEM-CLIENT-7", "no final response yet"),
        _ => ("IDEM-CLIENT-7", "the entry cannot be sent now"),
    };
    ErrorParts::range(code, message)
}

/// The `code` (`IDEM-CLIENT-6`) and a fixed message for bytes that are not an outbox entry.
pub fn entry_decode_error(e: &idem_core::EntryDecodeError) -> ErrorParts {
    use idem_core::EntryDecodeError as E;
    let message = match e {
        E::TooLarge { .. } => "outbox entry exceeds the size limit",
        E::NotAnEntry => "not an outbox entry (bad magic)",
        E::UnsupportedVersion(_) => "unsupported outbox entry format version",
        E::Invalid(why) => why,
        _ => "outbox entry is malformed",
    };
    ErrorParts::range("IDEM-CLIENT-6", message)
}

/// A counter numbering the core refuses (`IDEM-CTR-1`, as the server refuses such a key),
/// with a fixed message.
pub fn sequence_error(e: &idem_core::CounterError) -> ErrorParts {
    let message = match e {
        idem_core::CounterError::BadClientId => {
            "counter.client must be 1 to 64 characters of A-Z a-z 0-9 - . _ ~"
        }
        _ => "counter.bits must be 8 to 64, and counter.firstSeq fit in them",
    };
    ErrorParts::range("IDEM-CTR-1", message)
}

/// A give-up reason's name for JavaScript.
pub fn give_up_name(g: idem_core::GiveUp) -> &'static str {
    match g {
        idem_core::GiveUp::Deadline => "deadline",
        idem_core::GiveUp::Budget => "budget",
        idem_core::GiveUp::KeyForgotten => "key-forgotten",
        idem_core::GiveUp::Interrupted => "interrupted",
        idem_core::GiveUp::Refused => "refused",
    }
}
