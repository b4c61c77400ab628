//! One delivery of a message to an inbox (`IDEM-INBOX-1` to `IDEM-INBOX-3`) as an operation
//! of the machine: the guarded lifecycle (claim, run the processing, record it), with a typed
//! result ([`Delivery`]) and the receipt a receiver answers its sender with.

use super::*;
use crate::inbox::{Delivery, Inbox};

/// One delivery as the receiver got it: who sent it, the message's id, and its payload.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    /// The sender (a webhook provider, a queue): the message ids of one source share a
    /// scope.
    pub source: &'a str,
    /// The id the source gives the message: 1 to 255 visible ASCII characters or spaces.
    pub id: &'a str,
    /// The payload's media type, if known (a JSON payload is fingerprinted canonically, so
    /// that a sender that serialises it again differently is no conflict).
    pub content_type: Option<&'a str>,
    /// The payload: the same id with another payload is a conflict (`IDEM-INBOX-3`).
    pub body: &'a [u8],
}

impl Inbox {
    /// The machine for one delivery of `message`: it claims the message's record (under
    /// [`Inbox::message_key`], the same layout in every host), runs the processing once
    /// ([`Step::Run`]: process the message, then
    /// [`handle_outcome`](Request::handle_outcome) with [`Inbox::processed`], or with
    /// [`Outcome::Unknown`] when processing failed), and records it. Its result is
    /// [`Request::delivery`]; [`Request::reply`] is the receipt to answer the sender with,
    /// whatever the last step. `nonce` is random, as for [`Policy::request`].
    pub fn deliver(&self, message: &Message<'_>, nonce: u64) -> Request {
        let key = match self.message_key(message.source, message.id) {
            Ok(key) => key,
            Err(e) => return deliver_refused(Refusal::key(&e)),
        };
        let parts = RequestParts {
            method: "POST",
            target: "",
            content_type: message.content_type,
            headers: &[],
            body: message.body,
        };
        let fingerprint = match self.fingerprint_spec().fingerprint(&parts) {
            Ok(fingerprint) => fingerprint,
            Err(e) => return deliver_refused(Refusal::fingerprint(&e)),
        };
        let mut req = Request::with_rules(
            Rules::Record(self.engine().clone()),
            key,
            fingerprint,
            Subject::Record,
            nonce,
        );
        req.operation = Operation::Deliver;
        req
    }
}

/// A delivery refused before it could be claimed.
fn deliver_refused(refusal: Refusal) -> Request {
    let mut req = Request::refused(refusal);
    req.operation = Operation::Deliver;
    req
}

impl Request {
    /// What became of a delivery ([`Inbox::deliver`]) once it is over (`None` before, and
    /// for other operations): processed now, a duplicate to acknowledge (also one whose
    /// stored answer has expired while its id is remembered: `IDEM-INBOX-1`), in progress or
    /// held elsewhere (not acknowledged, so that the sender delivers it again:
    /// `IDEM-INBOX-2`), a conflicting payload (`IDEM-INBOX-3`), failed, or refused (another
    /// payload under the id of a message not processed yet among the refusals).
    pub fn delivery(&self) -> Option<Delivery> {
        if self.operation != Operation::Deliver {
            return None;
        }
        let of_answer = |answer: &Answer| match answer {
            Answer::Decision(
                Decision::Replay(_) | Decision::Rejected(RejectReason::KeyExpired),
            ) => Delivery::Duplicate,
            Answer::Decision(Decision::InProgress { retry_after_secs }) => Delivery::InProgress {
                retry_after_secs: *retry_after_secs,
            },
            // Another payload under the id of a message that was processed. Under one that
            // was not (in flight, failed, or its outcome unknown), it is refused and not
            // acknowledged: acknowledged, the message would never be processed.
            Answer::Decision(Decision::Mismatch {
                differing,
                processed: true,
            }) => Delivery::Conflict {
                differing: differing.clone(),
            },
            Answer::Decision(Decision::Rejected(RejectReason::OutcomeUnknown)) => Delivery::Held,
            _ => Delivery::Refused,
        };
        Some(match &self.state {
            // A processing that outlived its lease ran, and so did the delivery that took it
            // over: both say processed, so that the message processed twice shows.
            State::Superseded(Answer::Decision(Decision::Replay(_))) => Delivery::Processed {
                recovered: self.recovered,
            },
            State::Answered(answer) | State::Superseded(answer) => of_answer(answer),
            State::Finished(Finish::Stored) => Delivery::Processed {
                recovered: self.recovered,
            },
            State::Finished(_) => Delivery::Failed,
            _ => return None,
        })
    }

    /// The receipt of a delivery: 200 `{"outcome": …, "received": true}` for what the sender
    /// may stop delivering, the core's problem (with `Retry-After`) for what it must deliver
    /// again.
    pub(super) fn receipt(&self, delivery: &Delivery) -> Reply {
        let again = |refusal: Refusal| {
            Refusal {
                requirement: "IDEM-INBOX-2",
                ..refusal
            }
            .reply()
        };
        match delivery {
            Delivery::Processed { .. } | Delivery::Duplicate | Delivery::Conflict { .. } => {
                let mut body = Vec::with_capacity(48);
                body.extend_from_slice(b"{\"outcome\":");
                crate::canon::write_str(&mut body, delivery.name());
                body.extend_from_slice(b",\"received\":true}");
                Reply::document(200, body)
            }
            Delivery::InProgress { retry_after_secs } => again(
                Refusal::of_decision(&Decision::InProgress {
                    retry_after_secs: *retry_after_secs,
                })
                .unwrap_or_else(|| Refusal::store(StoreFailure::Unavailable)),
            ),
            Delivery::Held => again(Refusal::rejected(&RejectReason::OutcomeUnknown)),
            Delivery::Failed => Reply::plain(
                Plain::Internal,
                "the processing of the message failed, or its end was not recorded; deliver it again",
            ),
            Delivery::Refused => match &self.state {
                State::Answered(Answer::Refusal(r)) => r.reply(),
                State::Answered(Answer::Decision(d)) => Reply::of_decision(d)
                    .unwrap_or_else(|| Refusal::store(StoreFailure::Unavailable).reply()),
                _ => Refusal::store(StoreFailure::Unavailable).reply(),
            },
        }
    }
}
