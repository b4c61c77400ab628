//! WASM bindings of idem-core: the engine of the `idem-wasm` npm package.
//!
//! This layer has no idempotency logic of its own. Each method converts its JavaScript
//! arguments ([`interop`]), calls idem-core (through [`host::Host`], which keeps each
//! request's attempt in a numbered slot), and converts the answer back. Time and random
//! values come from JavaScript. Errors are real JavaScript errors (`RangeError` for bad
//! input) whose `code` property is the ID of the requirement in `spec/requirements.toml`
//! that the input broke; a refused request is not an error but a reply
//! (`application/problem+json`).
//!
//! The JavaScript API (`idem-wasm/js/`) drives these classes. With the in-process store
//! ([`Records`]: idem-core's `MemoryStore`, inside the module) a request costs two calls
//! besides identifying it: [`Engine::claim_in`] and [`Engine::finish_in`]. With an
//! asynchronous store (a Durable Object, a database) the JavaScript side loads the record,
//! asks [`Engine::decide`], applies the returned compare-and-set write, runs the handler,
//! and stores the outcome with [`Engine::complete`] before the response leaves.

// In the module, std would only add its panic machinery (message formatting, hooks) to the
// binary: the module has no stderr to print to. Native builds (tests) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// A panic is a bug (the layer returns errors for every bad input): stop at once. The
/// module then traps, and the JavaScript side sees a `RuntimeError`.
#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

pub mod host;
pub mod interop;

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use host::{Host, Incoming};
use interop::ErrorParts;
use wasm_bindgen::prelude::*;

type JsResult<T> = Result<T, JsValue>;

fn js(e: ErrorParts) -> JsValue {
    e.into_js()
}

/// The idempotency engine with its key and fingerprint settings, and the attempts in
/// flight, each in a numbered slot (see [`host`]).
#[wasm_bindgen]
pub struct Engine {
    host: Host,
}

#[wasm_bindgen]
impl Engine {
    /// An engine from the option numbers (see [`interop::opt`]; durations in milliseconds,
    /// `NaN` for a default) and the fingerprint's header names and excluded fields as list
    /// texts. Throws a `RangeError` (`IDEM-JS-1`, or `IDEM-TTL-2` when
    /// `keyTtl < responseTtl`).
    #[wasm_bindgen(constructor)]
    pub fn new(numbers: &[f64], headers: &str, exclude: &str) -> JsResult<Engine> {
        let options = interop::options(numbers, headers, exclude).map_err(js)?;
        Ok(Engine {
            host: Host::new(options).map_err(js)?,
        })
    }

    /// Identifies a request: parses the key header (`undefined` when absent), builds the
    /// scope from the principal, method and route, and fingerprints method, target, the
    /// selected headers (a flat list text) and the body. Returns the slot, or `-1` for a
    /// missing or malformed key or an unusable body, whose problem `reply(-1)` renders.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &mut self,
        key: Option<String>,
        principal: &str,
        method: &str,
        route: &str,
        target: &str,
        content_type: Option<String>,
        headers: &str,
        body: &[u8],
    ) -> JsResult<i32> {
        let req = Incoming {
            key: key.as_deref(),
            principal,
            method,
            route,
            target,
            content_type: content_type.as_deref(),
            headers,
            body,
        };
        match self.host.begin(&req) {
            Ok(t) => Ok(t as i32),
            Err(e) if e.problem.is_some() => {
                self.host.fail_with(e);
                Ok(-1)
            }
            Err(e) => Err(js(e)),
        }
    }

    /// Opens a slot for an attempt sent by [`Engine::encode_attempt`] (a Durable Object
    /// does). Throws a `RangeError` (`IDEM-JS-2`).
    #[wasm_bindgen(js_name = beginEncoded)]
    pub fn begin_encoded(&mut self, bytes: &[u8]) -> JsResult<u32> {
        self.host.begin_encoded(bytes).map_err(js)
    }

    /// False for a body of `length` bytes, announced by `Content-Length` before it is read,
    /// that is larger than the fingerprint limit (413, `IDEM-LIMIT-1`; `reply(-1)`).
    #[wasm_bindgen(js_name = checkBodySize)]
    pub fn check_body_size(&mut self, length: f64) -> bool {
        match self.host.check_body_size(length) {
            Ok(()) => true,
            Err(e) => {
                self.host.fail_with(e);
                false
            }
        }
    }

    /// The requirement ID of the last refused request (`reply(-1)`).
    #[wasm_bindgen(js_name = problemCode)]
    pub fn problem_code(&self) -> String {
        String::from(self.host.problem_code())
    }

    /// Closes a slot.
    pub fn end(&mut self, slot: u32) {
        self.host.end(slot);
    }

    /// The key the store keeps the record under (scope and key, length-prefixed).
    #[wasm_bindgen(js_name = storageKey)]
    pub fn storage_key(&self, slot: u32) -> JsResult<String> {
        self.host.storage_key(slot).map_err(js)
    }

    /// The idempotency key as parsed (a UUID in lowercase).
    pub fn key(&self, slot: u32) -> JsResult<String> {
        self.host.key(slot).map(String::from).map_err(js)
    }

    /// The attempt as bytes, for the Durable Object that owns its key.
    #[wasm_bindgen(js_name = encodeAttempt)]
    pub fn encode_attempt(&self, slot: u32) -> JsResult<Vec<u8>> {
        self.host.encode_attempt(slot).map_err(js)
    }

    /// The lease's fencing number: it grows on every takeover.
    pub fn fence(&self, slot: u32) -> JsResult<f64> {
        self.host.fence(slot).map(|f| f as f64).map_err(js)
    }

    /// When the lease ends, in milliseconds since the epoch.
    pub fn expires(&self, slot: u32) -> JsResult<f64> {
        self.host.expires(slot).map(interop::to_ms).map_err(js)
    }

    /// Claims the key in the in-process store: a claim code (see [`interop`]). `nonceHi` and
    /// `nonceLo` are 64 random bits that seed the version of a new record.
    #[wasm_bindgen(js_name = claimIn)]
    pub fn claim_in(
        &mut self,
        store: &mut Records,
        slot: u32,
        now: f64,
        nonce_hi: u32,
        nonce_lo: u32,
    ) -> JsResult<u32> {
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host
            .claim_in(&mut store.store, slot, interop::millis(now), nonce)
            .map_err(js)
    }

    /// Decides given the stored record bytes (or `undefined`), for an asynchronous store: a
    /// claim code. On execute, `takeWrite()` gives the claim write; once the store applied
    /// it, `commit(slot)`. Throws a `RangeError` (`IDEM-REC-1`) for bytes that are not a
    /// record.
    pub fn decide(
        &mut self,
        slot: u32,
        now: f64,
        nonce_hi: u32,
        nonce_lo: u32,
        stored: Option<Vec<u8>>,
    ) -> JsResult<u32> {
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host
            .decide(slot, interop::millis(now), nonce, stored.as_deref())
            .map_err(js)
    }

    /// The store applied the claim write (or a heartbeat's write): the slot holds the lease.
    pub fn commit(&mut self, slot: u32) -> JsResult<()> {
        self.host.commit(slot).map_err(js)
    }

    /// The answer after a claim lost the race several times in a row: "in progress" (as
    /// idem-core's `Store::claim` answers).
    pub fn contended(&mut self, slot: u32) -> JsResult<u32> {
        self.host.contended(slot).map_err(js)
    }

    /// The claim as bytes for the worker that asked (a Durable Object calls this after it
    /// applied the claim write).
    #[wasm_bindgen(js_name = encodeClaim)]
    pub fn encode_claim(&self, slot: u32) -> JsResult<Vec<u8>> {
        self.host.encode_claim(slot).map_err(js)
    }

    /// Takes a claim sent by [`Engine::encode_claim`]: a claim code. Throws a `RangeError`
    /// (`IDEM-JS-2`).
    #[wasm_bindgen(js_name = claimEncoded)]
    pub fn claim_encoded(&mut self, slot: u32, bytes: &[u8]) -> JsResult<u32> {
        self.host.claim_encoded(slot, bytes).map_err(js)
    }

    /// Writes the reply bytes (see [`interop`]) of a claim that did not execute, or with
    /// `-1` of the last refused request, at `outPtr()` in the module's memory; returns their
    /// length. They stay there until the next call on this engine.
    pub fn reply(&mut self, slot: i32) -> u32 {
        self.host.reply(slot).len() as u32
    }

    /// Where `reply` wrote (an address in the module's memory).
    #[wasm_bindgen(js_name = outPtr)]
    pub fn out_ptr(&self) -> u32 {
        self.host.out_ptr() as u32
    }

    /// Stores the outcome in the in-process store: `ran` is 0 (answered with `status`,
    /// `headers` as a flat list text and `body`), 1 (threw) or 2 (nothing happened).
    /// Returns the event's index.
    #[wasm_bindgen(js_name = finishIn)]
    #[allow(clippy::too_many_arguments)]
    pub fn finish_in(
        &mut self,
        store: &mut Records,
        slot: u32,
        now: f64,
        ran: u8,
        status: u16,
        headers: &str,
        body: Vec<u8>,
    ) -> JsResult<u8> {
        let outcome = Host::outcome(ran, status, headers, body).map_err(js)?;
        self.host
            .finish_in(&mut store.store, slot, interop::millis(now), outcome)
            .map_err(js)
    }

    /// The completion write bytes (see [`Engine::finish_in`] for the arguments) for an
    /// asynchronous store.
    #[allow(clippy::too_many_arguments)]
    pub fn complete(
        &mut self,
        slot: u32,
        now: f64,
        ran: u8,
        status: u16,
        headers: &str,
        body: Vec<u8>,
    ) -> JsResult<Vec<u8>> {
        let outcome = Host::outcome(ran, status, headers, body).map_err(js)?;
        self.host
            .complete(slot, interop::millis(now), outcome)
            .map_err(js)?;
        Ok(self.host.take_write())
    }

    /// A heartbeat in the in-process store (`IDEM-LEASE-3`): false when the lease was taken
    /// over. Throws a `RangeError` (`IDEM-LEASE-3`) after the lease has ended.
    #[wasm_bindgen(js_name = extendIn)]
    pub fn extend_in(&mut self, store: &mut Records, slot: u32, now: f64) -> JsResult<bool> {
        self.host
            .extend_in(&mut store.store, slot, interop::millis(now))
            .map_err(js)
    }

    /// A heartbeat's write bytes for an asynchronous store; once applied, `commit(slot)`.
    pub fn extend(&mut self, slot: u32, now: f64) -> JsResult<Vec<u8>> {
        self.host.extend(slot, interop::millis(now)).map_err(js)?;
        Ok(self.host.take_write())
    }

    /// The claim write bytes of the last `decide`.
    #[wasm_bindgen(js_name = takeWrite)]
    pub fn take_write(&mut self) -> Vec<u8> {
        self.host.take_write()
    }
}

/// The in-process store: idem-core's `MemoryStore` (a hash map with a deadline index,
/// limits on entries and bytes), inside the module.
#[wasm_bindgen]
pub struct Records {
    store: idem_core::MemoryStore,
}

#[wasm_bindgen]
impl Records {
    /// A store that holds at most `maxEntries` records and `maxBytes` bytes of keys and
    /// records.
    #[wasm_bindgen(constructor)]
    pub fn new(max_entries: f64, max_bytes: f64) -> Records {
        Records {
            store: idem_core::MemoryStore::new(idem_core::MemoryStoreLimits {
                max_entries: max_entries as usize,
                max_bytes: max_bytes as usize,
            }),
        }
    }

    /// Records held.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> f64 {
        self.store.stats().entries as f64
    }

    /// Records expired so far.
    #[wasm_bindgen(getter)]
    pub fn expired(&self) -> f64 {
        self.store.stats().expired as f64
    }

    /// Bytes held, as counted against the byte limit.
    #[wasm_bindgen(getter)]
    pub fn bytes(&self) -> f64 {
        self.store.stats().bytes as f64
    }

    /// The earliest deadline of any record (ms since the epoch), or `undefined`.
    #[wasm_bindgen(getter, js_name = nextDeadline)]
    pub fn next_deadline(&self) -> Option<f64> {
        self.store.next_deadline().map(interop::to_ms)
    }

    /// Applies expiry to every record due at `now`; returns how many changed.
    pub fn sweep(&mut self, now: f64) -> f64 {
        self.store.sweep(interop::millis(now)) as f64
    }

    /// The encoded record under a storage key, or `undefined`.
    pub fn load(&self, key: &str) -> Option<Vec<u8>> {
        host::store_load(&self.store, key).map(|(_, value)| value)
    }

    /// The version of the record under a storage key, or `undefined`.
    pub fn version(&self, key: &str) -> Option<String> {
        host::store_load(&self.store, key).map(|(version, _)| version.to_string())
    }

    /// Applies a compare-and-set write under a storage key: 0 conflict, 1 applied, 2 full.
    /// Throws a `RangeError` (`IDEM-JS-1` for a key that is not a storage key, `IDEM-REC-1`
    /// for bytes that are not a record).
    pub fn apply(
        &mut self,
        key: &str,
        expect: Option<String>,
        value: Option<Vec<u8>>,
        now: f64,
    ) -> JsResult<u8> {
        host::store_apply(
            &mut self.store,
            interop::millis(now),
            key,
            expect.as_deref(),
            value.as_deref(),
        )
        .map(|a| a as u8)
        .map_err(js)
    }
}

/// The write bytes that apply the passage of time to a stored record at `now` (drop an
/// expired response, delete an expired key), or `undefined` when nothing is due
/// (`IDEM-TTL-4`). Throws a `RangeError` (`IDEM-REC-1`) for bytes that are not a record.
#[wasm_bindgen]
pub fn expire(now: f64, value: &[u8]) -> JsResult<Option<Vec<u8>>> {
    host::expire(interop::millis(now), value).map_err(js)
}

/// The reply bytes when the store fails: `store-full` (`IDEM-STORE-3`) or
/// `store-unavailable` (`IDEM-STORE-4`), both 503 with `Retry-After`.
#[wasm_bindgen(js_name = storeProblem)]
pub fn store_problem(full: bool, detail: &str) -> Vec<u8> {
    interop::store_reply(full, detail).encode()
}

/// The module's memory, where `Engine.reply` leaves its bytes.
#[wasm_bindgen(js_name = wasmMemory)]
pub fn wasm_memory() -> JsValue {
    wasm_bindgen::memory()
}

/// The event names in index order, comma-separated (`IDEM-EVT-1`).
#[wasm_bindgen(js_name = eventNames)]
pub fn event_names() -> String {
    interop::event_names()
}

/// The security-relevant events as a bit mask over event indices (`IDEM-EVT-1`).
#[wasm_bindgen(js_name = securityMask)]
pub fn security_mask() -> u32 {
    interop::security_mask()
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
    /// the retry options `[base, cap, maxAttempts, deadline]` (ms; `NaN` for a default).
    #[wasm_bindgen(constructor)]
    pub fn new(key: &str, payload: &[u8], retry: &[f64]) -> JsResult<Outbox> {
        let policy = interop::retry_policy(retry).map_err(js)?;
        let entry = idem_core::OutboxEntry::new(key, digest32(payload)?)
            .map_err(|e| js(interop::client_error(&e)))?;
        Ok(Outbox { entry, policy })
    }

    /// Restores an entry saved with [`Outbox::encode`]. Throws a `RangeError`
    /// (`IDEM-CLIENT-6`) for bytes that are not an entry.
    #[wasm_bindgen(js_name = fromBytes)]
    pub fn from_bytes(bytes: &[u8], retry: &[f64]) -> JsResult<Outbox> {
        let policy = interop::retry_policy(retry).map_err(js)?;
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
        let parts = idem_core::RequestParts {
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
