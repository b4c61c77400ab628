//! WASM bindings of idem-core: the engine of the `idem-wasm` npm package.
//!
//! This layer has no idempotency logic of its own. Each method converts its JavaScript
//! arguments ([`interop`]), calls idem-core, and converts the answer back. Time and random
//! values come from JavaScript. Errors are real JavaScript errors (`RangeError` for bad
//! input) whose `code` property is the ID of the requirement in `spec/requirements.toml`
//! that the input broke; errors about an HTTP request also carry `status`, `type` and
//! `problem` (the `application/problem+json` body).
//!
//! The JavaScript API in `idem-wasm/src/js/` drives these classes: it reads the request,
//! loads the record from an async store, asks [`Engine::decide`], applies the returned
//! [`Write`] with the store's compare-and-set, runs the handler, and stores the outcome with
//! [`Engine::complete`] before the response leaves.

extern crate alloc;

pub mod interop;

use idem_core::{
    Attempt as CoreAttempt, Claim, Decision as CoreDecision, Event, Fingerprint,
    Lease as CoreLease, Outcome, RecordKey, RequestParts, StoredResponse, Write as CoreWrite,
};
use interop::{ErrorParts, KeyKind, Reply as ReplyParts, StoreWrite};
use wasm_bindgen::prelude::*;

type JsResult<T> = Result<T, JsValue>;

fn js(e: ErrorParts) -> JsValue {
    e.into_js()
}

/// The idempotency engine with its key and fingerprint settings.
#[wasm_bindgen]
pub struct Engine {
    engine: idem_core::Engine,
    key_kind: KeyKind,
    fingerprint: idem_core::FingerprintSpec,
}

#[wasm_bindgen]
impl Engine {
    /// An engine from the options JSON text (durations in milliseconds). Throws a
    /// `RangeError` (`IDEM-JS-1`, or `IDEM-TTL-2` when `keyTtl < responseTtl`).
    #[wasm_bindgen(constructor)]
    pub fn new(options: &str) -> JsResult<Engine> {
        let o = interop::parse_options(options).map_err(js)?;
        let engine = idem_core::Engine::new(o.config).map_err(|e| js(ErrorParts::config(&e)))?;
        Ok(Engine {
            engine,
            key_kind: o.key_kind,
            fingerprint: o.fingerprint,
        })
    }

    /// Identifies a request: parses the key header (`undefined` when absent), builds the
    /// scope from the principal, method and route, and fingerprints method, target, the
    /// selected headers (a flat `[name, value, …]` list) and the body. Throws a `RangeError`
    /// with the problem response for a missing or malformed key or an unusable body.
    #[allow(clippy::too_many_arguments)]
    pub fn attempt(
        &self,
        key: Option<String>,
        principal: &str,
        method: &str,
        route: &str,
        target: &str,
        content_type: Option<String>,
        headers: Vec<String>,
        body: &[u8],
    ) -> JsResult<Attempt> {
        let key = self
            .key_kind
            .parse(key.as_deref())
            .map_err(|e| js(ErrorParts::key(&e)))?;
        let pairs = interop::pairs(headers);
        let header_refs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        let fingerprint = self
            .fingerprint
            .fingerprint(&RequestParts {
                method,
                target,
                content_type: content_type.as_deref(),
                headers: &header_refs,
                body,
            })
            .map_err(|e| js(ErrorParts::fingerprint(&e)))?;
        let key = RecordKey::new(interop::scope(principal, method, route), key);
        Ok(Attempt::new(key, fingerprint))
    }

    /// Refuses a body of `length` bytes, announced by `Content-Length` before it is read,
    /// when it is larger than the fingerprint limit: throws the same `RangeError` (413,
    /// `IDEM-LIMIT-1`) as [`Engine::attempt`] would after reading it.
    #[wasm_bindgen(js_name = checkBodySize)]
    pub fn check_body_size(&self, length: f64) -> JsResult<()> {
        let max = self.fingerprint.max_body;
        if length.is_finite() && length > max as f64 {
            let e = idem_core::FingerprintError::BodyTooLarge {
                len: length as usize,
                max,
            };
            return Err(js(ErrorParts::fingerprint(&e)));
        }
        Ok(())
    }

    /// Decides what to do with `attempt` given the stored record bytes (or `undefined`).
    /// `nonceHi`/`nonceLo` are 64 random bits that seed the version of a new record.
    pub fn decide(
        &self,
        now: f64,
        attempt: &Attempt,
        nonce_hi: u32,
        nonce_lo: u32,
        stored: Option<Vec<u8>>,
    ) -> JsResult<Decision> {
        let record = match stored {
            Some(bytes) => {
                Some(idem_core::decode_record(&bytes).map_err(|e| js(ErrorParts::record(&e)))?)
            }
            None => None,
        };
        let decision = self.engine.decide(
            interop::millis(now),
            &CoreAttempt {
                key: &attempt.key,
                fingerprint: &attempt.fingerprint,
                nonce: interop::u64_from_halves(nonce_hi, nonce_lo),
            },
            record.as_ref(),
        );
        Ok(Decision::from_core(decision))
    }

    /// The write that stores the handler's response under `lease`, classified by status
    /// (`IDEM-OUT-4`). `headers` is a flat `[name, value, …]` list.
    pub fn complete(
        &self,
        now: f64,
        lease: &Lease,
        status: u16,
        headers: Vec<String>,
        body: Vec<u8>,
    ) -> JsResult<Write> {
        let outcome = Outcome::classify(StoredResponse {
            status,
            headers: interop::pairs(headers),
            body,
        });
        self.finish(now, lease, outcome)
    }

    /// The write for a handler that threw: an unknown outcome, under the configured policy
    /// (`IDEM-OUT-3`).
    pub fn fail(&self, now: f64, lease: &Lease) -> JsResult<Write> {
        self.finish(now, lease, Outcome::Unknown(None))
    }

    /// The write for a handler that reports that nothing happened: the key is released
    /// (`IDEM-OUT-2`).
    pub fn release(&self, now: f64, lease: &Lease) -> JsResult<Write> {
        self.finish(now, lease, Outcome::Retryable)
    }

    fn finish(&self, now: f64, lease: &Lease, outcome: Outcome) -> JsResult<Write> {
        let write = self
            .engine
            .complete(interop::millis(now), &lease.lease, outcome)
            .map_err(|e| js(ErrorParts::complete(&e)))?;
        let event = interop::completion_event(&write);
        Ok(Write::new(&write, Some(event), None))
    }

    /// A heartbeat (`IDEM-LEASE-3`): the write that extends `lease`; once the store has
    /// applied it, `takeLease()` gives the extended lease. Throws a `RangeError`
    /// (`IDEM-LEASE-3`) after the lease has ended.
    pub fn extend(&self, now: f64, lease: &Lease) -> JsResult<Write> {
        let (next, write) = self
            .engine
            .extend(interop::millis(now), &lease.lease)
            .map_err(|e| js(ErrorParts::complete(&e)))?;
        Ok(Write::new(&write, Some(Event::Extended), Some(next)))
    }

    /// The lease duration in milliseconds.
    #[wasm_bindgen(getter, js_name = leaseMs)]
    pub fn lease_ms(&self) -> f64 {
        self.engine.config().lease.as_millis() as f64
    }
}

/// One request as the engine sees it: its record key and fingerprint.
#[wasm_bindgen]
pub struct Attempt {
    key: RecordKey,
    fingerprint: Fingerprint,
}

impl Attempt {
    fn new(key: RecordKey, fingerprint: Fingerprint) -> Attempt {
        Attempt { key, fingerprint }
    }
}

#[wasm_bindgen]
impl Attempt {
    /// The key the store keeps the record under (scope and key, length-prefixed).
    #[wasm_bindgen(getter, js_name = storageKey)]
    pub fn storage_key(&self) -> String {
        self.key.storage_key()
    }

    /// The idempotency key as parsed (a UUID in lowercase).
    #[wasm_bindgen(getter)]
    pub fn key(&self) -> String {
        self.key.key.clone()
    }

    /// The attempt as bytes, for the Durable Object that owns its key.
    pub fn encode(&self) -> Vec<u8> {
        interop::encode_attempt(&self.key, &self.fingerprint)
    }

    /// Reads an attempt sent by [`Attempt::encode`]. Throws a `RangeError` (`IDEM-JS-2`).
    pub fn decode(bytes: &[u8]) -> JsResult<Attempt> {
        let (key, fingerprint) = interop::decode_attempt(bytes).map_err(js)?;
        Ok(Attempt::new(key, fingerprint))
    }
}

/// What a decision tells the host to do.
#[wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionKind {
    /// Apply the write, then run the handler under the lease.
    Execute = 0,
    /// Send the stored response again.
    Replay = 1,
    /// Another attempt holds the lease: 409 with `Retry-After`.
    InProgress = 2,
    /// The key was used for a different request: 422.
    Mismatch = 3,
    /// Refused: the key's response expired (410) or its outcome is unknown (409).
    Rejected = 4,
}

/// The engine's answer to one attempt.
#[wasm_bindgen]
pub struct Decision {
    kind: DecisionKind,
    event: Event,
    recovered: bool,
    lease: Option<CoreLease>,
    write: Option<CoreWrite>,
    claim: Option<Claim>,
}

impl Decision {
    fn from_core(d: CoreDecision) -> Decision {
        let event = d.event();
        match d {
            CoreDecision::Execute {
                lease,
                write,
                recovered,
            } => Decision {
                kind: DecisionKind::Execute,
                event,
                recovered,
                lease: Some(lease),
                write: Some(write),
                claim: None,
            },
            other => Decision::from_claim(Claim::Done(other)),
        }
    }

    fn from_claim(claim: Claim) -> Decision {
        let event = claim.event();
        let kind = match &claim {
            Claim::Execute { .. } => DecisionKind::Execute,
            Claim::Done(CoreDecision::Replay(_)) => DecisionKind::Replay,
            Claim::Done(CoreDecision::InProgress { .. }) => DecisionKind::InProgress,
            Claim::Done(CoreDecision::Mismatch { .. }) => DecisionKind::Mismatch,
            Claim::Done(_) => DecisionKind::Rejected,
        };
        match claim {
            Claim::Execute { lease, recovered } => Decision {
                kind,
                event,
                recovered,
                lease: Some(lease),
                write: None,
                claim: None,
            },
            done => Decision {
                kind,
                event,
                recovered: false,
                lease: None,
                write: None,
                claim: Some(done),
            },
        }
    }
}

#[wasm_bindgen]
impl Decision {
    /// What to do.
    #[wasm_bindgen(getter)]
    pub fn kind(&self) -> DecisionKind {
        self.kind
    }

    /// Whether an execute decision takes over from an attempt whose lease expired.
    #[wasm_bindgen(getter)]
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// The event name (`IDEM-EVT-1`).
    #[wasm_bindgen(getter)]
    pub fn event(&self) -> String {
        String::from(self.event.name())
    }

    /// The lease of an execute decision (once).
    #[wasm_bindgen(js_name = takeLease)]
    pub fn take_lease(&mut self) -> Option<Lease> {
        self.lease.take().map(|lease| Lease { lease })
    }

    /// The claim write of an execute decision (once); `undefined` for a decision that came
    /// from a Durable Object, which applied it already.
    #[wasm_bindgen(js_name = takeWrite)]
    pub fn take_write(&mut self) -> Option<Write> {
        self.write
            .take()
            .map(|w| Write::new(&w, Some(Event::Executed), None))
    }

    /// The HTTP reply of a decision that does not execute.
    pub fn reply(&self) -> Option<Reply> {
        match &self.claim {
            Some(Claim::Done(d)) => interop::decision_reply(d).map(Reply::from),
            _ => None,
        }
    }

    /// The decision as bytes for the worker that asked (a Durable Object calls this after it
    /// applied the claim write). Call before `takeLease()`.
    #[wasm_bindgen(js_name = encodeClaim)]
    pub fn encode_claim(&self) -> Vec<u8> {
        let claim = match (&self.lease, &self.claim) {
            (Some(lease), _) => Claim::Execute {
                lease: lease.clone(),
                recovered: self.recovered,
            },
            (None, Some(done)) => done.clone(),
            (None, None) => Claim::Done(CoreDecision::CONTENDED),
        };
        interop::encode_claim(&claim)
    }

    /// The answer after a claim lost the race several times in a row: the key is being
    /// fought over, and the honest answer is "in progress" (as [`idem_core::Store::claim`]
    /// answers).
    pub fn contended() -> Decision {
        Decision::from_core(CoreDecision::CONTENDED)
    }

    /// Reads a decision sent by [`Decision::encode_claim`]. Throws a `RangeError`
    /// (`IDEM-JS-2`).
    #[wasm_bindgen(js_name = decodeClaim)]
    pub fn decode_claim(bytes: &[u8]) -> JsResult<Decision> {
        Ok(Decision::from_claim(
            interop::decode_claim(bytes).map_err(js)?,
        ))
    }
}

/// The right to run the handler for one record, fenced (`IDEM-LEASE-1`, `IDEM-LEASE-2`).
#[wasm_bindgen]
pub struct Lease {
    lease: CoreLease,
}

#[wasm_bindgen]
impl Lease {
    /// The fencing number: it grows on every takeover.
    #[wasm_bindgen(getter)]
    pub fn fence(&self) -> f64 {
        self.lease.fence as f64
    }

    /// When the lease ends, in milliseconds since the epoch.
    #[wasm_bindgen(getter)]
    pub fn expires(&self) -> f64 {
        interop::to_ms(self.lease.expires)
    }
}

/// A compare-and-set write for a store (`IDEM-STORE-1`).
#[wasm_bindgen]
pub struct Write {
    parts: StoreWrite,
    event: Option<Event>,
    lease: Option<CoreLease>,
}

impl Write {
    fn new(write: &CoreWrite, event: Option<Event>, lease: Option<CoreLease>) -> Write {
        Write {
            parts: StoreWrite::from_core(write),
            event,
            lease,
        }
    }
}

#[wasm_bindgen]
impl Write {
    /// The version the stored record must have, or `undefined` when no record may exist.
    #[wasm_bindgen(getter)]
    pub fn expect(&self) -> Option<String> {
        self.parts.expect.clone()
    }

    /// The encoded record to store, or `undefined` to delete it.
    #[wasm_bindgen(getter)]
    pub fn value(&self) -> Option<Vec<u8>> {
        self.parts.value.clone()
    }

    /// The stored record's version after the write (empty for a delete).
    #[wasm_bindgen(getter)]
    pub fn version(&self) -> String {
        self.parts.version.clone()
    }

    /// When the stored record next changes on its own (ms since the epoch; 0 for a delete):
    /// the time for an alarm or a sweep (`IDEM-TTL-4`).
    #[wasm_bindgen(getter)]
    pub fn deadline(&self) -> f64 {
        self.parts.deadline
    }

    /// The event once the write is applied (`IDEM-EVT-1`); `undefined` for expiry writes.
    #[wasm_bindgen(getter)]
    pub fn event(&self) -> Option<String> {
        self.event.map(|e| String::from(e.name()))
    }

    /// The extended lease of a heartbeat write (once, after the store applied it).
    #[wasm_bindgen(js_name = takeLease)]
    pub fn take_lease(&mut self) -> Option<Lease> {
        self.lease.take().map(|lease| Lease { lease })
    }
}

/// An HTTP reply: status, a flat header list and the body.
#[wasm_bindgen]
pub struct Reply {
    parts: ReplyParts,
}

impl From<ReplyParts> for Reply {
    fn from(parts: ReplyParts) -> Reply {
        Reply { parts }
    }
}

#[wasm_bindgen]
impl Reply {
    /// The status code.
    #[wasm_bindgen(getter)]
    pub fn status(&self) -> u16 {
        self.parts.status
    }

    /// The headers as a flat `[name, value, …]` list.
    #[wasm_bindgen(getter)]
    pub fn headers(&self) -> Vec<String> {
        interop::flatten(&self.parts.headers)
    }

    /// The body.
    #[wasm_bindgen(getter)]
    pub fn body(&self) -> Vec<u8> {
        self.parts.body.clone()
    }
}

/// The write that applies the passage of time to a stored record at `now` (drop an expired
/// response, delete an expired key), or `undefined` when nothing is due (`IDEM-TTL-4`).
/// Throws a `RangeError` (`IDEM-REC-1`) for bytes that are not a record.
#[wasm_bindgen]
pub fn expire(now: f64, value: &[u8]) -> JsResult<Option<Write>> {
    let record = idem_core::decode_record(value).map_err(|e| js(ErrorParts::record(&e)))?;
    // The write's key is not used by JS stores (they key by storage key), and expiry needs
    // no configuration.
    let key = RecordKey::new(idem_core::Scope::custom(String::new()), String::new());
    Ok(idem_core::Engine::default()
        .expire(interop::millis(now), &key, &record)
        .map(|w| Write::new(&w, None, None)))
}

/// The reply when the store fails: `store-full` (`IDEM-STORE-3`) or `store-unavailable`
/// (`IDEM-STORE-4`), both 503 with `Retry-After`.
#[wasm_bindgen(js_name = storeProblem)]
pub fn store_problem(full: bool, detail: &str) -> Reply {
    interop::store_reply(full, detail).into()
}

/// The names of the security-relevant events (`IDEM-EVT-1`).
#[wasm_bindgen(js_name = securityEvents)]
pub fn security_events() -> Vec<String> {
    interop::security_events()
        .iter()
        .map(|e| String::from(e.name()))
        .collect()
}

/// One logical client request: the core's outbox entry (`IDEM-CLIENT-1` to
/// `IDEM-CLIENT-7`) with its retry policy. `idempotentFetch` drives it.
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
    /// `complete`, `retry`, `failed` or `undetermined`.
    #[wasm_bindgen(getter)]
    pub fn kind(&self) -> String {
        String::from(match self.next {
            idem_core::NextStep::Complete { .. } => "complete",
            idem_core::NextStep::Retry { .. } => "retry",
            idem_core::NextStep::Failed { .. } => "failed",
            idem_core::NextStep::Undetermined { .. } => "undetermined",
        })
    }

    /// For `retry`: when to send again (ms since the epoch).
    #[wasm_bindgen(getter)]
    pub fn at(&self) -> Option<f64> {
        match self.next {
            idem_core::NextStep::Retry { at } => Some(interop::to_ms(at)),
            _ => None,
        }
    }

    /// For `complete`: whether the final response was a success (2xx/3xx) rather than a
    /// deterministic refusal (4xx).
    #[wasm_bindgen(getter)]
    pub fn succeeded(&self) -> bool {
        matches!(
            self.next,
            idem_core::NextStep::Complete {
                class: idem_core::Completion::Succeeded,
                ..
            }
        )
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
    /// the retry options JSON text (`base`, `cap`, `maxAttempts`, `deadline`; ms).
    #[wasm_bindgen(constructor)]
    pub fn new(key: &str, payload: &[u8], retry: &str) -> JsResult<Outbox> {
        let policy = interop::parse_retry(retry).map_err(js)?;
        let entry = idem_core::OutboxEntry::new(key, digest32(payload)?)
            .map_err(|e| js(interop::client_error(&e)))?;
        Ok(Outbox { entry, policy })
    }

    /// Restores an entry saved with [`Outbox::encode`]. Throws a `RangeError`
    /// (`IDEM-CLIENT-6`) for bytes that are not an entry.
    #[wasm_bindgen(js_name = fromBytes)]
    pub fn from_bytes(bytes: &[u8], retry: &str) -> JsResult<Outbox> {
        let policy = interop::parse_retry(retry).map_err(js)?;
        let entry = idem_core::decode_entry(bytes).map_err(|e| {
            js(ErrorParts {
                kind: interop::ErrorKind::Range,
                code: "IDEM-CLIENT-6",
                message: e.to_string(),
                problem: None,
            })
        })?;
        Ok(Outbox { entry, policy })
    }

    /// The entry as bytes, to persist before each send.
    pub fn encode(&self) -> Vec<u8> {
        idem_core::encode_entry(&self.entry)
    }

    /// The digest that identifies a payload: the request fingerprint (method, URL, body,
    /// with JSON bodies canonicalised), so a re-serialised body is not a change.
    pub fn digest(
        method: &str,
        url: &str,
        content_type: Option<String>,
        body: &[u8],
    ) -> JsResult<Vec<u8>> {
        let spec = idem_core::FingerprintSpec {
            max_body: usize::MAX,
            ..idem_core::FingerprintSpec::default()
        };
        let parts = RequestParts {
            method,
            target: url,
            content_type: content_type.as_deref(),
            headers: &[],
            body,
        };
        // A body labelled JSON that does not parse is hashed as bytes.
        let fp = spec.fingerprint(&parts).or_else(|_| {
            idem_core::FingerprintSpec {
                json: idem_core::JsonMode::Never,
                ..spec.clone()
            }
            .fingerprint(&parts)
        });
        fp.map(|f| f.digest.to_vec())
            .map_err(|e| js(ErrorParts::fingerprint(&e)))
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

    /// `created`, `sent`, `waiting`, `answered`, `processed`, `failed` or `undetermined`.
    #[wasm_bindgen(getter)]
    pub fn state(&self) -> String {
        String::from(interop::state_name(&self.entry.state()))
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

    /// Records that the application acted on the final response.
    #[wasm_bindgen(js_name = markProcessed)]
    pub fn mark_processed(&mut self) -> JsResult<()> {
        self.entry
            .mark_processed()
            .map_err(|e| js(interop::client_error(&e)))
    }
}

fn digest32(bytes: &[u8]) -> JsResult<[u8; 32]> {
    bytes
        .try_into()
        .map_err(|_| js(ErrorParts::options("a payload digest has 32 bytes")))
}
