//! The client side (`IDEM-CLIENT-1` to `IDEM-CLIENT-8`): an outbox entry per logical request,
//! as a sans-IO state machine. It never reads a clock or draws random numbers; the caller
//! passes `now` and a random `u64` into every decision.
//!
//! One machine in one file: the entry, its states and the table of outcomes its methods
//! implement. The states and the transitions are read together; the entry's byte format is
//! in `format.rs`.

use crate::key::{KeyError, MAX_KEY_LEN};
use crate::request::KeyStatus;
use crate::time::UnixMillis;
use alloc::string::String;
use core::fmt;
use core::time::Duration;

mod format;
mod keys;

pub use format::{
    decode_entry, encode_entry, EntryDecodeError, ENTRY_FORMAT_VERSION, MAX_ENTRY_BYTES,
};
pub use keys::{uuid_v4_key, uuid_v7_key};

/// How an entry retries. See `spec/KINDS.md` for the reasons behind the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first backoff's upper bound (`IDEM-CLIENT-3`). Default 200 ms.
    pub base: Duration,
    /// The largest backoff's upper bound. Default 20 s.
    pub cap: Duration,
    /// The most sends, the first one included. Default 10.
    pub max_attempts: u32,
    /// How long after the first send the entry keeps retrying (`IDEM-CLIENT-4`). Default 10
    /// minutes, well inside the server's default 24-hour response retention, so every retry
    /// still finds the record.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_millis(200),
            cap: Duration::from_secs(20),
            max_attempts: 10,
            deadline: Duration::from_secs(600),
        }
    }
}

/// How a final response ended the interaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Completion {
    /// 2xx (or 3xx): the request took effect, or was replayed.
    Succeeded,
    /// A deterministic 4xx: the request was refused and will be refused again.
    Rejected,
}

/// Why an entry stopped retrying without a final response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum GiveUp {
    /// The deadline passed, or the next retry would come after it.
    Deadline,
    /// The attempt budget is spent.
    Budget,
    /// The server no longer knows the key (its response expired, the key is stale, the
    /// session or epoch is unknown), after an attempt that may have been processed.
    KeyForgotten,
    /// The client stopped (a crash, a restart) while an attempt was in flight or due, and
    /// the server could not tell what became of it (`IDEM-CLIENT-8`).
    Interrupted,
    /// A deterministic refusal (4xx) that is not the key's stored answer came after an
    /// attempt that may have been processed: something in front of the server (an expired
    /// credential, a proxy) refused this attempt, while an earlier one may have run.
    Refused,
}

/// Where an entry is. Entries in `Answered`, `Processed`, `Failed` and `Undetermined` are
/// final: nothing more will be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EntryState {
    /// Not sent yet.
    Created,
    /// A send is under way; its result has not been reported.
    Sent,
    /// Waiting to send again.
    Waiting {
        /// Not before this time.
        until: UnixMillis,
    },
    /// A final response arrived.
    Answered {
        /// Succeeded or rejected.
        class: Completion,
        /// Its status.
        status: u16,
    },
    /// The application has acted on the final response; the entry may be deleted.
    Processed {
        /// Succeeded or rejected.
        class: Completion,
        /// Its status.
        status: u16,
    },
    /// Given up, and no attempt can have been processed: nothing happened.
    Failed {
        /// Why.
        reason: GiveUp,
    },
    /// Given up, and an attempt may have been processed: the outcome is unknown until a
    /// status query reconciles it ([`OutboxEntry::on_status`]). Never reported as success or
    /// failure (`IDEM-CLIENT-4`).
    Undetermined {
        /// Why.
        reason: GiveUp,
    },
    /// A status query found the key in progress: ask again (`IDEM-CLIENT-8`).
    Asking {
        /// Not before this time.
        until: UnixMillis,
        /// Status queries answered so far.
        asks: u32,
    },
    /// A status query found that the request ran and its response is no longer at hand
    /// (gone from the server, or the payload to fetch its replay is gone here): it took
    /// effect, once (`IDEM-CLIENT-8`).
    Executed {
        /// The stored response's status, when the server still had it.
        status: Option<u16>,
    },
    /// A status query settled the key: the request never ran and never will; a new request
    /// with a new key is safe (`IDEM-CLIENT-8`).
    NotExecuted,
}

/// What the server's answer says about the key, beyond the status; read it from the
/// `application/problem+json` type with [`KeyAnswer::from_problem_type`], or set
/// [`KeyAnswer::Replayed`] for a response marked `Idempotent-Replayed: true`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum KeyAnswer {
    /// Nothing beyond the status.
    #[default]
    Unspecified,
    /// This attempt was refused before anything ran (a malformed key, a full store, a
    /// counter gap, …).
    NotProcessed,
    /// Another attempt with the key is running or its outcome is held: some attempt is
    /// (or was) processing it.
    KeyBusy,
    /// The server no longer knows what happened to the key, or cannot replay what did (a
    /// response it ran and did not keep): a status query tells which.
    Forgotten,
    /// The key's stored answer, replayed (`Idempotent-Replayed: true`): the request ran,
    /// and this is its outcome, whatever its status; a retry would get it again. A replay
    /// with an idem problem type is read by its type (a replayed `response-not-stored` is
    /// [`KeyAnswer::Forgotten`]).
    Replayed,
}

impl KeyAnswer {
    /// The answer for an idem problem type (`urn:idem:problem:…`); other types are
    /// [`KeyAnswer::Unspecified`].
    pub fn from_problem_type(type_uri: &str) -> KeyAnswer {
        let Some(slug) = type_uri.strip_prefix("urn:idem:problem:") else {
            return KeyAnswer::Unspecified;
        };
        match slug {
            "in-progress" | "outcome-unknown" | "superseded" => KeyAnswer::KeyBusy,
            "key-expired"
            | "key-stale"
            | "unknown-client"
            | "stale-epoch"
            | "unknown-epoch"
            | "token-unknown"
            | "token-expired"
            | "response-not-stored" => KeyAnswer::Forgotten,
            "missing-key"
            | "malformed-key"
            | "key-reuse-mismatch"
            | "key-collision"
            | "key-from-future"
            | "invalid-low-water"
            | "counter-gap"
            | "counter-window-full"
            | "token-forged"
            | "store-full"
            | "store-unavailable"
            | "body-too-large"
            | "invalid-json"
            | "key-settled" => KeyAnswer::NotProcessed,
            _ => KeyAnswer::Unspecified,
        }
    }
}

/// A response to one send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientResponse {
    /// The status, 200 to 599 (1xx responses are never final and are not reported); any
    /// other is no HTTP answer, as a send whose answer was lost.
    pub status: u16,
    /// `Retry-After` in seconds, if the response had one (convert an HTTP date first).
    pub retry_after_secs: Option<u64>,
    /// What the response says about the key.
    pub answer: KeyAnswer,
}

/// A send that got no response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NetworkError {
    /// Nothing left the client (the connection could not be opened): not processed.
    NotSent,
    /// The request may have reached the server (reset, timeout, abort): its effect is
    /// unknown.
    Lost,
}

/// What the entry should do next.
#[must_use = "a NextStep says whether to retry, and when"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// The interaction is complete with a final response (`IDEM-CLIENT-2`).
    Complete {
        /// Succeeded or rejected.
        class: Completion,
        /// The final status.
        status: u16,
    },
    /// Send again, with the same key and payload, at `at` (`IDEM-CLIENT-3`).
    Retry {
        /// Not before this time.
        at: UnixMillis,
    },
    /// Given up; nothing was processed.
    Failed {
        /// Why.
        reason: GiveUp,
    },
    /// Given up; an attempt may have been processed (`IDEM-CLIENT-4`).
    Undetermined {
        /// Why.
        reason: GiveUp,
    },
    /// Ask the server about the key again at `at` (`IDEM-CLIENT-8`).
    AskStatus {
        /// Not before this time.
        at: UnixMillis,
    },
    /// It ran, once; its response is not at hand (`IDEM-CLIENT-8`).
    Executed {
        /// The stored response's status, when the server still had it.
        status: Option<u16>,
    },
    /// It never ran and never will: safe to send again under a new key (`IDEM-CLIENT-8`).
    NotExecuted,
}

impl NextStep {
    /// The entry's state once it takes this step; `asks` counts the status queries.
    fn state(self, asks: u32) -> EntryState {
        match self {
            NextStep::Complete { class, status } => EntryState::Answered { class, status },
            NextStep::Retry { at } => EntryState::Waiting { until: at },
            NextStep::Failed { reason } => EntryState::Failed { reason },
            NextStep::Undetermined { reason } => EntryState::Undetermined { reason },
            NextStep::AskStatus { at } => EntryState::Asking { until: at, asks },
            NextStep::Executed { status } => EntryState::Executed { status },
            NextStep::NotExecuted => EntryState::NotExecuted,
        }
    }
}

/// A call the entry refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// The key is not a valid idempotency key.
    InvalidKey(KeyError),
    /// The payload differs from the one the entry was created with (`IDEM-CLIENT-1`).
    PayloadChanged,
    /// The entry is not waiting to be sent (it is in flight or final).
    NotSendable(EntryState),
    /// The backoff has not ended.
    NotDue {
        /// When it ends.
        at: UnixMillis,
    },
    /// A result was reported for an entry that is not in flight.
    NothingInFlight(EntryState),
    /// [`OutboxEntry::mark_processed`] on an entry without a final response.
    NotAnswered(EntryState),
    /// [`OutboxEntry::on_status`] on an entry that was never sent or has a definite outcome.
    NothingToReconcile(EntryState),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::InvalidKey(e) => write!(f, "invalid idempotency key: {e}"),
            ClientError::PayloadChanged => f.write_str(
                "the payload differs from the first send; a retry must send the same payload",
            ),
            ClientError::NotSendable(s) => write!(f, "the entry cannot be sent in state {s:?}"),
            ClientError::NotDue { at } => write!(f, "the next send is due at {at}"),
            ClientError::NothingInFlight(s) => {
                write!(f, "no send is in flight (state {s:?})")
            }
            ClientError::NotAnswered(s) => write!(f, "no final response yet (state {s:?})"),
            ClientError::NothingToReconcile(s) => {
                write!(f, "nothing to ask the server about (state {s:?})")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ClientError {}

/// One logical request: its key, its payload digest, and where it is. Serialisable
/// ([`encode_entry`]), so pending keys survive a restart.
///
/// ```text
///            send               final response            mark_processed
///  created ───────▶ sent ───────────────────────▶ answered ──────────────▶ processed
///                   │  ▲
///     retryable     │  │ send (same key, same payload), not before `until`
///     result        ▼  │
///                 waiting ──── deadline or budget spent ──▶ undetermined (an attempt may
///                                                            have been processed)
///                                                         ▶ failed (none was)
/// ```
///
/// # Driving an entry
///
/// 1. [`OutboxEntry::new`] with the key (from [`uuid_v4_key`], or any valid key) and the
///    digest of the payload; persist it ([`encode_entry`]) before the first send, so a crash
///    cannot lose the key.
/// 2. Before each send call [`OutboxEntry::send`] with the digest of what is about to be
///    sent: a changed payload is refused (`IDEM-CLIENT-1`).
/// 3. Pass the result to [`OutboxEntry::on_result`]: a [`ClientResponse`] (status, `Retry-After`
///    in seconds, and the [`KeyAnswer`] read from the problem type) or a [`NetworkError`].
///    It answers [`NextStep`]: complete, retry at a time, failed, or undetermined. A final
///    response whose body broke off before it was read is reported again as
///    [`NetworkError::Lost`] (while answered): its answer was lost.
/// 4. After a restart, an entry found in [`EntryState::Sent`] lost its response: report
///    [`NetworkError::Lost`] for it, or ask the server about it (step 5).
/// 5. An entry that ends undetermined asks the server with a status query that settles
///    ([`OutboxEntry::next_ask`]); pass what it found to [`OutboxEntry::on_status`]. It
///    answers executed, not executed, retry now (to fetch a replay), ask again, or still
///    undetermined (`IDEM-CLIENT-8`).
///
/// [`OutboxEntry::decide`] is the same decision without changing the entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutboxEntry {
    key: String,
    payload: [u8; 32],
    state: EntryState,
    attempts: u32,
    first_sent: Option<UnixMillis>,
    maybe_processed: bool,
    last_status: Option<u16>,
}

/// Checks a client key: 1 to 255 characters of visible ASCII or space.
fn check_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    match key
        .bytes()
        .enumerate()
        .find(|(_, b)| !(0x20..=0x7e).contains(b))
    {
        Some((at, byte)) => Err(KeyError::InvalidByte { at, byte }),
        None => Ok(()),
    }
}

impl OutboxEntry {
    /// A new entry for one logical request with `key` and the digest of its payload (for
    /// example SHA-256 of the body, or [`Fingerprint::digest`](crate::Fingerprint)).
    pub fn new(key: impl Into<String>, payload: [u8; 32]) -> Result<OutboxEntry, ClientError> {
        let key = key.into();
        check_key(&key).map_err(ClientError::InvalidKey)?;
        Ok(OutboxEntry {
            key,
            payload,
            state: EntryState::Created,
            attempts: 0,
            first_sent: None,
            maybe_processed: false,
            last_status: None,
        })
    }

    /// The key to send.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The payload digest.
    pub fn payload(&self) -> &[u8; 32] {
        &self.payload
    }

    /// The state.
    pub fn state(&self) -> EntryState {
        self.state
    }

    /// Sends so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// When the first send happened.
    pub fn first_sent(&self) -> Option<UnixMillis> {
        self.first_sent
    }

    /// Whether some attempt may have been processed by the server.
    pub fn maybe_processed(&self) -> bool {
        self.maybe_processed
    }

    /// The status of the last response, if any.
    pub fn last_status(&self) -> Option<u16> {
        self.last_status
    }

    /// Whether nothing more will be sent or asked, except a status query for an undetermined
    /// entry.
    pub fn is_final(&self) -> bool {
        !matches!(
            self.state,
            EntryState::Created
                | EntryState::Sent
                | EntryState::Waiting { .. }
                | EntryState::Asking { .. }
        )
    }

    /// When a status query about the key is due: at once for an entry whose outcome is
    /// undetermined, at the end of the wait for one asking, never otherwise. (An entry found
    /// [`EntryState::Sent`] after a restart may be asked about at once, too.)
    pub fn next_ask(&self, now: UnixMillis) -> Option<UnixMillis> {
        match self.state {
            EntryState::Undetermined { .. } => Some(now),
            EntryState::Asking { until, .. } => Some(until),
            _ => None,
        }
    }

    /// When the entry next wants to be sent: now for a new entry, the end of the backoff
    /// for a waiting one, never otherwise.
    pub fn next_send(&self, now: UnixMillis) -> Option<UnixMillis> {
        match self.state {
            EntryState::Created => Some(now),
            EntryState::Waiting { until } => Some(until),
            _ => None,
        }
    }

    /// The time after which it gives up, once it has been sent.
    pub fn deadline(&self, policy: &RetryPolicy) -> Option<UnixMillis> {
        self.first_sent.map(|t| t.saturating_add(policy.deadline))
    }

    /// Records a send of `payload` at `now` and returns its attempt number (1 for the
    /// first). Refused when the payload changed (`IDEM-CLIENT-1`), before the backoff ends,
    /// or when the entry is in flight or final.
    pub fn send(&mut self, now: UnixMillis, payload: &[u8; 32]) -> Result<u32, ClientError> {
        match self.state {
            EntryState::Created => {}
            EntryState::Waiting { until } if now < until => {
                return Err(ClientError::NotDue { at: until })
            }
            EntryState::Waiting { .. } => {}
            other => return Err(ClientError::NotSendable(other)),
        }
        self.check_payload(payload)?;
        self.state = EntryState::Sent;
        self.attempts = self.attempts.saturating_add(1);
        self.first_sent.get_or_insert(now);
        Ok(self.attempts)
    }

    /// Refuses a payload digest other than the entry's (`IDEM-CLIENT-1`): check it before
    /// anything about the request goes out, a status query included.
    pub fn check_payload(&self, payload: &[u8; 32]) -> Result<(), ClientError> {
        if payload != &self.payload {
            return Err(ClientError::PayloadChanged);
        }
        Ok(())
    }

    /// Decides what the result of the send in flight means, without changing the entry.
    /// `random` is a uniformly random `u64` for the jitter.
    pub fn decide(
        &self,
        policy: &RetryPolicy,
        now: UnixMillis,
        random: u64,
        result: Result<&ClientResponse, NetworkError>,
    ) -> Result<NextStep, ClientError> {
        self.evaluate(policy, now, random, result)
            .map(|(next, _)| next)
    }

    /// Reports the result of the send in flight and moves the entry on: the decision of
    /// [`OutboxEntry::decide`], applied.
    pub fn on_result(
        &mut self,
        policy: &RetryPolicy,
        now: UnixMillis,
        random: u64,
        result: Result<&ClientResponse, NetworkError>,
    ) -> Result<NextStep, ClientError> {
        let (next, maybe_processed) = self.evaluate(policy, now, random, result)?;
        self.maybe_processed = maybe_processed;
        // A status no HTTP answer has is no answer, and not kept (an entry holds 200-599).
        if let Ok(r) = result {
            if (200..=599).contains(&r.status) {
                self.last_status = Some(r.status);
            }
        }
        self.state = next.state(0);
        Ok(next)
    }

    /// Reconciles the entry with what a status query about its key found (`IDEM-CLIENT-8`):
    /// `found` is [`KeyStatus::from_document`] of the answer, `None` when the server does not
    /// answer status queries. Ask with `settle`, so that an unknown key is settled and a
    /// late copy of the request can never run. `can_resend` says whether the payload is
    /// still at hand to send again.
    ///
    /// | found                          | can resend       | cannot resend          |
    /// |--------------------------------|------------------|------------------------|
    /// | completed, replayable, final status | retry now: the same key fetches the replay | executed (its status) |
    /// | completed, no longer replayed  | executed (its status) | executed (its status) |
    /// | expired                        | executed         | executed               |
    /// | not-executed (settled)         | not executed     | not executed           |
    /// | in-progress                    | ask again after `Retry-After`, backoff-bounded, at most [`MAX_STATUS_ASKS`] asks, none after a wait longer than the deadline (then undetermined) | the same |
    /// | released, held, unknown, none  | undetermined     | undetermined           |
    ///
    /// Allowed once the entry was sent and while its outcome is open: sent (a response lost
    /// in a crash), waiting, undetermined or asking. A key found released ran an attempt
    /// that recorded nothing: a retry would run it again, so it is left to the caller.
    pub fn on_status(
        &mut self,
        policy: &RetryPolicy,
        now: UnixMillis,
        random: u64,
        found: Option<&KeyStatus>,
        can_resend: bool,
    ) -> Result<NextStep, ClientError> {
        let (asks, reason) = match self.state {
            EntryState::Sent | EntryState::Waiting { .. } => (0, GiveUp::Interrupted),
            EntryState::Undetermined { reason } => (0, reason),
            EntryState::Asking { asks, .. } => (asks, GiveUp::Budget),
            other => return Err(ClientError::NothingToReconcile(other)),
        };
        let asks = asks.saturating_add(1);
        let next = match found {
            // The replay completes the entry, whatever its status (`KeyAnswer::Replayed`).
            Some(KeyStatus::Completed {
                replayable: true, ..
            }) if can_resend => NextStep::Retry { at: now },
            Some(KeyStatus::Completed { status, .. }) => NextStep::Executed {
                status: Some(*status),
            },
            Some(KeyStatus::Expired) => NextStep::Executed { status: None },
            Some(KeyStatus::NotExecuted) => NextStep::NotExecuted,
            Some(KeyStatus::InProgress { .. }) if asks >= MAX_STATUS_ASKS => {
                NextStep::Undetermined {
                    reason: GiveUp::Budget,
                }
            }
            // A wait longer than the whole deadline is not waited for: the outcome stays
            // open for a later reconciliation (`IDEM-CLIENT-4`).
            Some(KeyStatus::InProgress { retry_after_secs }) => {
                let wait = Duration::from_millis(backoff_ms(
                    policy,
                    asks,
                    random,
                    Some(*retry_after_secs),
                ));
                if wait > policy.deadline {
                    NextStep::Undetermined {
                        reason: GiveUp::Deadline,
                    }
                } else {
                    NextStep::AskStatus {
                        at: now.saturating_add(wait),
                    }
                }
            }
            Some(KeyStatus::Released | KeyStatus::Held | KeyStatus::Unknown) | None => {
                NextStep::Undetermined { reason }
            }
        };
        match next {
            NextStep::Executed { .. } => self.maybe_processed = true,
            NextStep::NotExecuted => self.maybe_processed = false,
            _ => {}
        }
        self.state = next.state(asks);
        Ok(next)
    }

    /// The decision and the new `maybe_processed`.
    fn evaluate(
        &self,
        policy: &RetryPolicy,
        now: UnixMillis,
        random: u64,
        result: Result<&ClientResponse, NetworkError>,
    ) -> Result<(NextStep, bool), ClientError> {
        // A final answer whose body broke off before the application had it is an answer
        // lost: the same key fetches its replay.
        let cut = matches!(self.state, EntryState::Answered { .. })
            && matches!(result, Err(NetworkError::Lost));
        if !matches!(self.state, EntryState::Sent) && !cut {
            return Err(ClientError::NothingInFlight(self.state));
        }
        let mut maybe = self.maybe_processed;
        let give_up = |reason, maybe: bool| {
            if maybe {
                NextStep::Undetermined { reason }
            } else {
                NextStep::Failed { reason }
            }
        };
        let retry_after = match result {
            Err(NetworkError::NotSent) => None,
            Err(NetworkError::Lost) => {
                maybe = true;
                None
            }
            // A status no HTTP answer has: the request reached the server, and what it did is
            // unknown, as when the answer is lost.
            Ok(r) if !(200..=599).contains(&r.status) => {
                maybe = true;
                None
            }
            Ok(r) => {
                let status = r.status;
                if r.answer == KeyAnswer::Replayed {
                    let class = if status < 400 {
                        Completion::Succeeded
                    } else {
                        Completion::Rejected
                    };
                    return Ok((NextStep::Complete { class, status }, true));
                }
                match final_class(status) {
                    // After an attempt that may have run, a refusal that is not the key's
                    // stored answer is this attempt's alone: the key's outcome is open.
                    Some(Completion::Rejected) if maybe && r.answer == KeyAnswer::Forgotten => {
                        return Ok((give_up(GiveUp::KeyForgotten, true), maybe));
                    }
                    Some(Completion::Rejected) if maybe && r.answer == KeyAnswer::Unspecified => {
                        return Ok((give_up(GiveUp::Refused, true), maybe));
                    }
                    Some(class) => return Ok((NextStep::Complete { class, status }, maybe)),
                    None => {}
                }
                maybe |= match status {
                    // Refused before processing, retrying is the remedy; unless the key is
                    // busy with an attempt that may be ours.
                    408 | 425 | 429 => r.answer == KeyAnswer::KeyBusy,
                    // 409: the key is held by another attempt (IETF draft §2.7), possibly
                    // ours; 5xx: it may have run.
                    _ => r.answer != KeyAnswer::NotProcessed,
                };
                r.retry_after_secs
            }
        };
        if self.attempts >= policy.max_attempts {
            return Ok((give_up(GiveUp::Budget, maybe), maybe));
        }
        let deadline = self
            .first_sent
            .unwrap_or(now)
            .saturating_add(policy.deadline);
        let at = now.saturating_add(Duration::from_millis(backoff_ms(
            policy,
            self.attempts,
            random,
            retry_after,
        )));
        if at > deadline {
            return Ok((give_up(GiveUp::Deadline, maybe), maybe));
        }
        Ok((NextStep::Retry { at }, maybe))
    }

    /// Records that the application acted on the final response.
    pub fn mark_processed(&mut self) -> Result<(), ClientError> {
        match self.state {
            EntryState::Answered { class, status } => {
                self.state = EntryState::Processed { class, status };
                Ok(())
            }
            other => Err(ClientError::NotAnswered(other)),
        }
    }
}

/// The most status queries an entry makes while the server finds its key in progress
/// (`IDEM-CLIENT-8`), each at least `Retry-After` after the last and backed off like a retry:
/// a key still in progress at the last one is left undetermined.
pub const MAX_STATUS_ASKS: u32 = 10;

/// How a response with `status` ends the interaction (`IDEM-CLIENT-2`): 2xx and 3xx
/// succeed, a deterministic 4xx rejects; `None` for what a retry may change (408, 409, 425,
/// 429 and 5xx, `IDEM-CLIENT-3`).
fn final_class(status: u16) -> Option<Completion> {
    match status {
        200..=399 => Some(Completion::Succeeded),
        408 | 409 | 425 | 429 => None,
        400..=499 => Some(Completion::Rejected),
        _ => None,
    }
}

/// The delay before the send that follows attempt number `attempt` (1-based): "full
/// jitter", uniform in `[0, min(cap, base * 2^(attempt-1))]`, and never less than
/// `Retry-After` (`IDEM-CLIENT-3`).
pub fn backoff_ms(
    policy: &RetryPolicy,
    attempt: u32,
    random: u64,
    retry_after_secs: Option<u64>,
) -> u64 {
    let base = u64::try_from(policy.base.as_millis()).unwrap_or(u64::MAX);
    let cap = u64::try_from(policy.cap.as_millis()).unwrap_or(u64::MAX);
    let exp = attempt.saturating_sub(1).min(63);
    let ceiling = base.saturating_mul(1u64 << exp).min(cap);
    // Scale the random value into [0, ceiling] without the bias of a modulo.
    let jitter = ((u128::from(random) * (u128::from(ceiling) + 1)) >> 64) as u64;
    let floor = retry_after_secs.map_or(0, |s| s.saturating_mul(1000));
    jitter.max(floor)
}
