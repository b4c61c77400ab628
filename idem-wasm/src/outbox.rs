//! The client's bindings: [`Outbox`], the core's outbox entry that `idempotentFetch` drives,
//! and [`Next`], what it says to do after a result.
//!
//! One binding per method of the core's outbox entry, each a few lines: the file is as long
//! as that API.

use crate::interop::{self, ErrorParts, FetchOutcome, NextKind, OutboxState};
use crate::{js, JsResult};
use alloc::string::String;
use alloc::vec::Vec;
use wasm_bindgen::prelude::*;

/// One logical client request: the core's outbox entry (`IDEM-CLIENT-1` to
/// `IDEM-CLIENT-8`) with its retry policy. `idempotentFetch` drives it.
#[wasm_bindgen]
pub struct Outbox {
    entry: idem_core::OutboxEntry,
    policy: idem_core::RetryPolicy,
}

/// What the outbox says to do after a result.
#[wasm_bindgen]
pub struct Next {
    next: idem_core::NextStep,
}

#[wasm_bindgen]
impl Next {
    /// Complete, retry, failed, undetermined, ask again, executed or not executed.
    #[wasm_bindgen(getter)]
    pub fn kind(&self) -> NextKind {
        NextKind::of(&self.next)
    }

    /// The outcome the interaction ends with (`undefined` for a retry): for `Complete`,
    /// whether the final response was a success (2xx/3xx) or a deterministic refusal (4xx).
    #[wasm_bindgen(getter)]
    pub fn outcome(&self) -> Option<FetchOutcome> {
        FetchOutcome::of_next(&self.next)
    }

    /// For `executed`: the stored response's status, when the server still had it.
    #[wasm_bindgen(getter)]
    pub fn status(&self) -> Option<u16> {
        match self.next {
            idem_core::NextStep::Executed { status } => status,
            _ => None,
        }
    }

    /// For `failed` and `undetermined`: `deadline`, `budget` or `key-forgotten`.
    #[wasm_bindgen(getter)]
    pub fn reason(&self) -> Option<String> {
        match self.next {
            idem_core::NextStep::Failed { reason }
            | idem_core::NextStep::Undetermined { reason } => {
                Some(String::from(interop::give_up_name(reason)))
            }
            _ => None,
        }
    }
}

#[wasm_bindgen]
impl Outbox {
    /// A new entry for `key` and the payload digest (32 bytes, from [`Outbox::digest`]), with
    /// the retry options `retry.base`, `retry.cap`, `retry.maxAttempts` and `retry.deadline`
    /// (ms; each `undefined` for its default) as plain numbers.
    #[wasm_bindgen(constructor)]
    pub fn new(
        key: &str,
        payload: &[u8],
        base: Option<f64>,
        cap: Option<f64>,
        max_attempts: Option<f64>,
        deadline: Option<f64>,
    ) -> JsResult<Outbox> {
        let policy = retry_policy(base, cap, max_attempts, deadline)?;
        let entry = idem_core::OutboxEntry::new(key, digest32(payload)?)
            .map_err(|e| js(interop::client_error(&e)))?;
        Ok(Outbox { entry, policy })
    }

    /// Restores an entry saved with [`Outbox::encode`], with the retry options as for
    /// [`Outbox::new`]. Throws a `RangeError` (`IDEM-CLIENT-6`) for bytes that are not an
    /// entry.
    #[wasm_bindgen(js_name = fromBytes)]
    pub fn from_bytes(
        bytes: &[u8],
        base: Option<f64>,
        cap: Option<f64>,
        max_attempts: Option<f64>,
        deadline: Option<f64>,
    ) -> JsResult<Outbox> {
        let policy = retry_policy(base, cap, max_attempts, deadline)?;
        let entry =
            idem_core::decode_entry(bytes).map_err(|e| js(interop::entry_decode_error(&e)))?;
        Ok(Outbox { entry, policy })
    }

    /// The entry as bytes, to persist before each send.
    pub fn encode(&self) -> Vec<u8> {
        idem_core::encode_entry(&self.entry)
    }

    /// The digest that identifies a payload: idem-core's
    /// [`payload_digest`](idem_core::payload_digest) of the method, the URL and the body
    /// bytes, which this client serialised itself and sends unchanged on every retry.
    pub fn digest(method: &str, url: &str, body: &[u8]) -> Vec<u8> {
        idem_core::payload_digest(method, url, body).to_vec()
    }

    /// A new UUID v4 key from 128 random bits (four u32 values).
    #[wasm_bindgen(js_name = keyV4)]
    pub fn key_v4(a: u32, b: u32, c: u32, d: u32) -> String {
        idem_core::uuid_v4_key([
            interop::u64_from_halves(a, b),
            interop::u64_from_halves(c, d),
        ])
    }

    /// A new UUID v7 key from the time and 80 random bits (the first 10 bytes of `random`).
    #[wasm_bindgen(js_name = keyV7)]
    pub fn key_v7(now: f64, random: &[u8]) -> JsResult<String> {
        let bytes: [u8; 10] = random
            .get(..10)
            .and_then(|r| r.try_into().ok())
            .ok_or_else(|| js(ErrorParts::options("keyV7 needs 10 random bytes")))?;
        Ok(interop::uuid_v7_key(interop::millis(now), bytes))
    }

    /// The key.
    #[wasm_bindgen(getter)]
    pub fn key(&self) -> String {
        String::from(self.entry.key())
    }

    /// Where the entry stands.
    #[wasm_bindgen(getter)]
    pub fn state(&self) -> OutboxState {
        OutboxState::of(&self.entry.state())
    }

    /// The outcome of an entry that is over, or `undefined` while it is not.
    #[wasm_bindgen(getter)]
    pub fn outcome(&self) -> Option<FetchOutcome> {
        FetchOutcome::of_state(&self.entry.state())
    }

    /// Sends so far.
    #[wasm_bindgen(getter)]
    pub fn attempts(&self) -> u32 {
        self.entry.attempts()
    }

    /// When the entry next wants to be sent, or `undefined`.
    #[wasm_bindgen(js_name = nextSend)]
    pub fn next_send(&self, now: f64) -> Option<f64> {
        self.entry
            .next_send(interop::millis(now))
            .map(interop::to_ms)
    }

    /// The status of the last response, if any.
    #[wasm_bindgen(getter, js_name = lastStatus)]
    pub fn last_status(&self) -> Option<u16> {
        self.entry.last_status()
    }

    /// Throws a `RangeError` (`IDEM-CLIENT-1`) when `payload` is not the digest of the
    /// entry's payload: checked before anything about the request goes out.
    #[wasm_bindgen(js_name = checkPayload)]
    pub fn check_payload(&self, payload: &[u8]) -> JsResult<()> {
        self.entry
            .check_payload(&digest32(payload)?)
            .map_err(|e| js(interop::client_error(&e)))
    }

    /// Records a send of the payload with this digest; throws a `RangeError`
    /// (`IDEM-CLIENT-1` when the payload changed, `IDEM-CLIENT-7` when not sendable now).
    pub fn send(&mut self, now: f64, payload: &[u8]) -> JsResult<u32> {
        let digest = digest32(payload)?;
        self.entry
            .send(interop::millis(now), &digest)
            .map_err(|e| js(interop::client_error(&e)))
    }

    /// Reports a response: status, `Retry-After` seconds, the problem `type` (if the body
    /// was `application/problem+json`), and whether the host marked it as not processed.
    #[wasm_bindgen(js_name = onResponse)]
    #[allow(clippy::too_many_arguments)]
    pub fn on_response(
        &mut self,
        now: f64,
        random_hi: u32,
        random_lo: u32,
        status: u16,
        retry_after_secs: Option<f64>,
        problem_type: Option<String>,
        not_processed: bool,
    ) -> JsResult<Next> {
        let answer = if not_processed {
            idem_core::KeyAnswer::NotProcessed
        } else {
            problem_type.as_deref().map_or(
                idem_core::KeyAnswer::Unspecified,
                idem_core::KeyAnswer::from_problem_type,
            )
        };
        let response = idem_core::ClientResponse {
            status,
            retry_after_secs: retry_after_secs
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| s as u64),
            answer,
        };
        self.result(now, random_hi, random_lo, Ok(&response))
    }

    /// Reports a send that got no response: `lost` when the request may have reached the
    /// server (a reset, a timeout), otherwise nothing left the client.
    #[wasm_bindgen(js_name = onNetworkError)]
    pub fn on_network_error(
        &mut self,
        now: f64,
        random_hi: u32,
        random_lo: u32,
        lost: bool,
    ) -> JsResult<Next> {
        let e = if lost {
            idem_core::NetworkError::Lost
        } else {
            idem_core::NetworkError::NotSent
        };
        self.result(now, random_hi, random_lo, Err(e))
    }

    fn result(
        &mut self,
        now: f64,
        hi: u32,
        lo: u32,
        result: Result<&idem_core::ClientResponse, idem_core::NetworkError>,
    ) -> JsResult<Next> {
        let next = self
            .entry
            .on_result(
                &self.policy,
                interop::millis(now),
                interop::u64_from_halves(hi, lo),
                result,
            )
            .map_err(|e| js(interop::client_error(&e)))?;
        Ok(Next { next })
    }

    /// When a status query about the key is due (`IDEM-CLIENT-8`): now for an undetermined
    /// entry, the end of the wait for one asking again, `undefined` otherwise.
    #[wasm_bindgen(js_name = nextAsk)]
    pub fn next_ask(&self, now: f64) -> Option<f64> {
        self.entry
            .next_ask(interop::millis(now))
            .map(interop::to_ms)
    }

    /// The `Idempotency-Status` field of a status query about this entry's request, made
    /// with `method`: it asks to settle the key if the server never saw it.
    #[wasm_bindgen(js_name = statusField)]
    pub fn status_field(method: &str) -> String {
        idem_core::StatusQuery::field(method, true)
    }

    /// Reports the answer to a status query about the key (`IDEM-CLIENT-8`): the body of a
    /// status document (a 200 of the status media type), or `undefined` when the answer was
    /// not one (the server does not answer status queries). `canResend`: whether the payload
    /// is at hand, so that a completed key's replay can be fetched with the same key.
    #[wasm_bindgen(js_name = onStatus)]
    pub fn on_status(
        &mut self,
        now: f64,
        random_hi: u32,
        random_lo: u32,
        document: Option<Vec<u8>>,
        can_resend: bool,
    ) -> JsResult<Next> {
        let found = document
            .as_deref()
            .and_then(idem_core::KeyStatus::from_document);
        let next = self
            .entry
            .on_status(
                &self.policy,
                interop::millis(now),
                interop::u64_from_halves(random_hi, random_lo),
                found.as_ref(),
                can_resend,
            )
            .map_err(|e| js(interop::client_error(&e)))?;
        Ok(Next { next })
    }

    /// Records that the application acted on the final response.
    #[wasm_bindgen(js_name = markProcessed)]
    pub fn mark_processed(&mut self) -> JsResult<()> {
        self.entry
            .mark_processed()
            .map_err(|e| js(interop::client_error(&e)))
    }
}

/// The retry policy (`IDEM-JS-1` for a value that is not a whole number in range; the
/// JavaScript side passes any value that is not a number as `NaN`).
fn retry_policy(
    base: Option<f64>,
    cap: Option<f64>,
    max_attempts: Option<f64>,
    deadline: Option<f64>,
) -> JsResult<idem_core::RetryPolicy> {
    interop::retry_policy(&interop::RetryOptions {
        base,
        cap,
        max_attempts,
        deadline,
    })
    .map_err(js)
}

fn digest32(bytes: &[u8]) -> JsResult<[u8; 32]> {
    bytes
        .try_into()
        .map_err(|_| js(ErrorParts::options("a payload digest has 32 bytes")))
}
