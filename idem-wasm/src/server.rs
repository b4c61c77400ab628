//! The server side of the module: the engine with its slots, the in-module store and the
//! record helpers the JavaScript stores use.

use crate::headroom;
use crate::host::{self, Host, Incoming};
use crate::interop::{
    self, DeliveryOutcome, EngineOptions, ErrorParts, HeartbeatState, Ran, StepKind,
};
use crate::{get, given, js, number, JsResult};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use js_sys::{Array, Object};
use wasm_bindgen::prelude::*;

fn text(object: &JsValue, name: &str) -> Result<Option<String>, ErrorParts> {
    let v = get(object, name);
    if !given(&v) {
        return Ok(None);
    }
    v.as_string()
        .map(Some)
        .ok_or_else(|| ErrorParts::options(alloc::format!("{name} must be a string")))
}

fn strings(object: &JsValue, name: &str, label: &str) -> Result<Option<Vec<String>>, ErrorParts> {
    let v = get(object, name);
    if !given(&v) {
        return Ok(None);
    }
    let bad = || ErrorParts::options(alloc::format!("{label} must be an array of strings"));
    if !Array::is_array(&v) {
        return Err(bad());
    }
    Array::from(&v)
        .iter()
        .map(|item| item.as_string().ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The engine options from the options object, by the names in
/// [`interop::ENGINE_OPTIONS`] (other members are the JavaScript side's).
fn engine_options(o: &JsValue) -> Result<EngineOptions, ErrorParts> {
    if !o.is_object() {
        return Err(ErrorParts::options("options must be an object"));
    }
    let f = get(o, "fingerprint");
    if given(&f) {
        if !f.is_object() {
            return Err(ErrorParts::options("options.fingerprint must be an object"));
        }
        for name in Object::keys(&Object::from(f.clone())).iter() {
            let name = name.as_string().unwrap_or_default();
            if !interop::FINGERPRINT_OPTIONS.contains(&name.as_str()) {
                return Err(ErrorParts::options(alloc::format!(
                    "unknown option \"fingerprint.{name}\""
                )));
            }
        }
    }
    let mut kinds = Vec::new();
    for (name, members) in interop::KIND_OPTIONS {
        let v = get(o, name);
        if given(&v) {
            if !v.is_object() || Array::is_array(&v) {
                return Err(ErrorParts::options(alloc::format!(
                    "options.{name} must be an object"
                )));
            }
            for member in Object::keys(&Object::from(v.clone())).iter() {
                let member = member.as_string().unwrap_or_default();
                if !members.contains(&member.as_str()) {
                    return Err(ErrorParts::options(alloc::format!(
                        "unknown option \"{name}.{member}\""
                    )));
                }
            }
        }
        kinds.push(v);
    }
    let member = |i: usize, name: &str| -> Result<Option<f64>, ErrorParts> {
        if given(&kinds[i]) {
            number(&kinds[i], name)
        } else {
            Ok(None)
        }
    };
    let time_keys = (member(0, "maxAhead")?, member(0, "maxAge")?);
    let counter = (member(1, "bits")?, member(1, "window")?);
    let token = (
        if given(&kinds[2]) {
            text(&kinds[2], "secret")?
        } else {
            None
        },
        member(2, "ttl")?,
    );
    let fallback = get(o, "keyFallback");
    let key_fallback =
        if !given(&fallback) {
            None
        } else if fallback.as_string().as_deref() == Some("derive") {
            Some(idem_core::KeyFallback::Derived)
        } else {
            match text(&fallback, "jsonPointer") {
                Ok(Some(p)) if fallback.is_object() && (p.is_empty() || p.starts_with('/')) => {
                    Some(idem_core::KeyFallback::JsonPointer(p))
                }
                _ => return Err(ErrorParts::options(
                    "options.keyFallback must be \"derive\" or { jsonPointer: \"/path/to/key\" }",
                )),
            }
        };
    let in_flight = get(o, "inFlight");
    let in_flight = if !given(&in_flight) || in_flight.as_string().as_deref() == Some("reject") {
        None
    } else if in_flight.is_object() && !Array::is_array(&in_flight) {
        let wait = number(&in_flight, "wait")?;
        let poll = number(&in_flight, "poll")?;
        Some((wait.unwrap_or(f64::NAN), poll))
    } else {
        return Err(ErrorParts::options(
            "options.inFlight must be \"reject\" or { wait: ms, poll?: ms }",
        ));
    };
    Ok(EngineOptions {
        response_ttl: number(o, "responseTtl")?,
        key_ttl: number(o, "keyTtl")?,
        lease: number(o, "lease")?,
        max_retry_after: number(o, "maxRetryAfter")?,
        unknown_outcome: text(o, "unknownOutcome")?,
        key_kind: text(o, "keyKind")?,
        time_keys,
        counter,
        token,
        key_fallback,
        headers: if given(&f) {
            strings(&f, "headers", "fingerprint.headers")?.unwrap_or_default()
        } else {
            Vec::new()
        },
        exclude: if given(&f) {
            strings(&f, "exclude", "fingerprint.exclude")?.unwrap_or_default()
        } else {
            Vec::new()
        },
        json: if given(&f) { text(&f, "json")? } else { None },
        max_body: if given(&f) {
            number(&f, "maxBody")?
        } else {
            None
        },
        in_flight,
        methods: strings(o, "methods", "options.methods")?,
        keys: text(o, "keys")?,
        max_response_bytes: number(o, "maxResponseBytes")?,
    })
}

/// The names of the engine options, comma-separated: the JavaScript side refuses any option
/// that is neither one of these nor one of its own (`IDEM-JS-1`).
#[wasm_bindgen(js_name = engineOptionNames)]
pub fn engine_option_names() -> String {
    interop::ENGINE_OPTIONS.join(",")
}

/// The idempotency engine with its policy, and the requests in flight, each in a numbered
/// slot (see [`host`]).
#[wasm_bindgen]
pub struct Engine {
    host: Host,
}

#[wasm_bindgen]
impl Engine {
    /// An engine from the options object (`responseTtl`, `keyTtl`, `lease`,
    /// `unknownOutcome`, `keyKind`, `fingerprint`, `inFlight`, `methods`, `keys`,
    /// `maxResponseBytes`). Throws a `RangeError` (`IDEM-JS-1`; `IDEM-TTL-2` when
    /// `keyTtl < responseTtl`; `IDEM-LEASE-4` when `lease > keyTtl`).
    #[wasm_bindgen(constructor)]
    pub fn new(options: &JsValue) -> JsResult<Engine> {
        let options = engine_options(options).map_err(js)?;
        Ok(Engine {
            host: Host::new(interop::policy(&options).map_err(js)?),
        })
    }

    /// Whether a request with this method is protected (its method is guarded, and it has
    /// a key or keys are required).
    pub fn protects(&self, method: &str, has_key: bool) -> bool {
        self.host.protects(method, has_key)
    }

    /// Identifies a request and opens its slot: the key header (`undefined` when absent),
    /// the principal (`undefined` for a single-tenant host), method, route, target,
    /// content type, the fingerprint headers as a flat list text, the body, and 64 random
    /// bits (the first version of a record it creates). A request that cannot be identified
    /// gets a slot whose first step is its refusal.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &mut self,
        key: Option<String>,
        principal: Option<String>,
        method: &str,
        route: &str,
        target: &str,
        content_type: Option<String>,
        headers: &str,
        body: &[u8],
        low_water: Option<String>,
        nonce_hi: u32,
        nonce_lo: u32,
    ) -> JsResult<u32> {
        let req = Incoming {
            key: key.as_deref(),
            principal: principal.as_deref(),
            method,
            route,
            target,
            content_type: content_type.as_deref(),
            headers,
            body,
            low_water: low_water.as_deref(),
        };
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host.begin(&req, nonce).map_err(js)
    }

    /// Opens the slot of the operation that issues a one-time token (`keyKind: "token"`)
    /// for the requests of `principal` (`undefined`: a single tenant) with `method` to
    /// `route`, from 128 random bits: driven like any request, it answers 201 with
    /// `{"expiresAt", "token", "ttl"}`, or its refusal (an empty principal, another key kind).
    #[allow(clippy::too_many_arguments)]
    #[wasm_bindgen(js_name = issueToken)]
    pub fn issue_token(
        &mut self,
        principal: Option<String>,
        method: &str,
        route: &str,
        now: f64,
        r0: u32,
        r1: u32,
        r2: u32,
        r3: u32,
    ) -> u32 {
        let random = [
            interop::u64_from_halves(r0, r1),
            interop::u64_from_halves(r2, r3),
        ];
        self.host.issue_token(
            principal.as_deref(),
            method,
            route,
            interop::millis(now),
            random,
        )
    }

    /// Opens the slot of the operation that opens (or moves to its next epoch) the counter
    /// session of `client` (`keyKind: "counter"`) for the requests of `principal` with
    /// `method` to `route`, starting at sequence number `firstSeq` (decimal text): driven
    /// like any request, it answers 201 with `{"client", "epoch", "firstSeq"}` (decimal
    /// text), or the core's refusal (`IDEM-SCOPE-3`, `IDEM-CTR-1`, `IDEM-CTR-12`).
    #[allow(clippy::too_many_arguments)]
    #[wasm_bindgen(js_name = openSession)]
    pub fn open_session(
        &mut self,
        principal: Option<String>,
        method: &str,
        route: &str,
        client: &str,
        first_seq: &str,
        nonce_hi: u32,
        nonce_lo: u32,
    ) -> u32 {
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host.open_session(
            principal.as_deref(),
            method,
            route,
            client,
            first_seq,
            nonce,
        )
    }

    /// Opens the slot of the session operation from the body of a session endpoint
    /// (`{"client": "…", "firstSeq": n}`): a body that is not one is answered 400.
    #[wasm_bindgen(js_name = openSessionFrom)]
    pub fn open_session_from(
        &mut self,
        principal: Option<String>,
        method: &str,
        route: &str,
        body: &[u8],
        nonce_hi: u32,
        nonce_lo: u32,
    ) -> u32 {
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host
            .open_session_from(principal.as_deref(), method, route, body, nonce)
    }

    /// Opens the slot of one delivery of message `id` from `source` with payload `body`
    /// (its media type `contentType`, if known) to this engine's inbox: driven like any
    /// request, its handler is the processing; `delivery` says what became of it, and its
    /// reply is the receipt.
    #[allow(clippy::too_many_arguments)]
    pub fn deliver(
        &mut self,
        source: &str,
        id: &str,
        content_type: Option<String>,
        body: &[u8],
        nonce_hi: u32,
        nonce_lo: u32,
    ) -> u32 {
        let message = idem_core::Message {
            source,
            id,
            content_type: content_type.as_deref(),
            body,
        };
        self.host
            .deliver(&message, interop::u64_from_halves(nonce_hi, nonce_lo))
    }

    /// What became of the delivery in `slot`, once it is over (`undefined` before).
    pub fn delivery(&self, slot: u32) -> JsResult<Option<DeliveryOutcome>> {
        Ok(self
            .host
            .delivery(slot)
            .map_err(js)?
            .map(|d| DeliveryOutcome::of(&d)))
    }

    /// A slot refusing a body of `length` bytes, announced by `Content-Length` before it is
    /// read, that is larger than the fingerprint accepts (413, `IDEM-LIMIT-1`); `undefined`
    /// when it may be read.
    #[wasm_bindgen(js_name = refuseBody)]
    pub fn refuse_body(&mut self, length: f64) -> Option<u32> {
        self.host.refuse_body(length)
    }

    /// Opens a slot for a ticket a worker sent, to claim for it (a Durable Object). Throws
    /// a `RangeError` (`IDEM-JS-2`).
    pub fn resume(&mut self, ticket: &[u8], nonce_hi: u32, nonce_lo: u32) -> JsResult<u32> {
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host.resume(ticket, nonce).map_err(js)
    }

    /// Closes a slot.
    pub fn end(&mut self, slot: u32) {
        self.host.end(slot);
    }

    /// The next step of the request.
    pub fn poll(&mut self, slot: u32, now: f64) -> JsResult<StepKind> {
        self.host.poll(slot, interop::millis(now)).map_err(js)
    }

    /// Runs the request's store steps in the in-process store; the next other step.
    #[wasm_bindgen(js_name = driveIn)]
    pub fn drive_in(&mut self, store: &mut Records, slot: u32, now: f64) -> JsResult<StepKind> {
        store
            .write(|records| self.host.drive_in(records, slot, interop::millis(now)))
            .map_err(js)
    }

    /// Writes the write of the last `Apply` step as write bytes (see [`interop`]) at
    /// `outPtr()`; returns their length. They stay there until the next call on this engine.
    #[wasm_bindgen(js_name = takeWrite)]
    pub fn take_write(&mut self, slot: u32) -> JsResult<u32> {
        let write = self.host.take_write(slot).map_err(js)?;
        Ok(self.host.write_out(&write).len() as u32)
    }

    /// The stored record bytes read for a `Claim` or `Load` step (`undefined`: none).
    /// Throws a `RangeError` (`IDEM-REC-1`) for bytes that are not a record.
    pub fn record(&mut self, slot: u32, now: f64, value: Option<Vec<u8>>) -> JsResult<()> {
        self.host
            .record(slot, interop::millis(now), value.as_deref())
            .map_err(js)
    }

    /// Whether the write of the last `Apply` step was applied.
    pub fn applied(&mut self, slot: u32, now: f64, applied: bool) -> JsResult<()> {
        self.host
            .applied(slot, interop::millis(now), applied)
            .map_err(js)
    }

    /// The store failed on the last step: full (`IDEM-STORE-3`) or unavailable.
    #[wasm_bindgen(js_name = storeFailed)]
    pub fn store_failed(&mut self, slot: u32, full: bool) -> JsResult<()> {
        self.host.store_failed(slot, full).map_err(js)
    }

    /// What a Durable Object claimed for a `Claim` step. Throws a `RangeError`
    /// (`IDEM-JS-2`).
    pub fn claimed(&mut self, slot: u32, now: f64, bytes: &[u8]) -> JsResult<()> {
        self.host
            .claimed(slot, interop::millis(now), bytes)
            .map_err(js)
    }

    /// What a Durable Object sends back after the claim of a resumed slot.
    #[wasm_bindgen(js_name = claimedBytes)]
    pub fn claimed_bytes(&self, slot: u32) -> JsResult<Vec<u8>> {
        self.host.claimed_bytes(slot).map_err(js)
    }

    /// The ticket a Durable Object needs to claim for this request.
    pub fn ticket(&self, slot: u32) -> JsResult<Vec<u8>> {
        self.host.ticket(slot).map_err(js)
    }

    /// The handler's outcome: it answered (`status`, `headers` as a flat list text,
    /// `body`), threw, or did nothing. Throws a `RangeError` (`IDEM-OUT-1`) for a status
    /// outside 100-599.
    pub fn outcome(
        &mut self,
        slot: u32,
        ran: Ran,
        status: u16,
        headers: &str,
        body: Vec<u8>,
    ) -> JsResult<()> {
        self.host
            .outcome(slot, ran, status, headers, body)
            .map_err(js)
    }

    /// Asks for a heartbeat (`IDEM-LEASE-3`): `Quiet` when its write is on its way,
    /// otherwise why it is refused.
    pub fn heartbeat(&mut self, slot: u32, now: f64) -> JsResult<HeartbeatState> {
        self.host.heartbeat(slot, interop::millis(now)).map_err(js)
    }

    /// Where the heartbeats stand.
    #[wasm_bindgen(js_name = heartbeatState)]
    pub fn heartbeat_state(&self, slot: u32) -> JsResult<HeartbeatState> {
        self.host.heartbeat_state(slot).map_err(js)
    }

    /// The index in `eventNames()` of the next event of the request, or -1.
    pub fn event(&mut self, slot: u32) -> JsResult<i32> {
        Ok(self
            .host
            .poll_event(slot)
            .map_err(js)?
            .and_then(interop::event_index)
            .map_or(-1, i32::from))
    }

    /// Writes the running handler's context bytes (see [`interop`]: fencing number, end of
    /// the lease, whether it recovers, the key) at `outPtr()` and returns their length: one
    /// call where a getter for each would cost four.
    pub fn context(&mut self, slot: u32) -> JsResult<u32> {
        self.host
            .context_out(slot)
            .map(|b| b.len() as u32)
            .map_err(js)
    }

    /// The lease's fencing number: it grows on every takeover.
    pub fn fence(&self, slot: u32) -> JsResult<f64> {
        self.host.context(slot).map(|c| c.fence as f64).map_err(js)
    }

    /// When the lease ends, in milliseconds since the epoch.
    #[wasm_bindgen(js_name = leaseExpires)]
    pub fn lease_expires(&self, slot: u32) -> JsResult<f64> {
        self.host
            .context(slot)
            .map(|c| interop::to_ms(c.lease_expires))
            .map_err(js)
    }

    /// When the last `WaitUntil` step asked to be polled again.
    #[wasm_bindgen(js_name = waitUntil)]
    pub fn wait_until(&self, slot: u32) -> JsResult<f64> {
        self.host.wait_until(slot).map(interop::to_ms).map_err(js)
    }

    /// The key the store keeps the record under.
    #[wasm_bindgen(js_name = storageKey)]
    pub fn storage_key(&self, slot: u32) -> JsResult<String> {
        self.host.storage_key(slot).map_err(js)
    }

    /// The idempotency key as parsed (a UUID in lowercase).
    pub fn key(&self, slot: u32) -> JsResult<String> {
        self.host.key(slot).map(String::from).map_err(js)
    }

    /// The requirement ID of the refusal that answered the request, if one did.
    #[wasm_bindgen(js_name = refusalCode)]
    pub fn refusal_code(&self, slot: u32) -> JsResult<Option<String>> {
        Ok(self
            .host
            .refusal(slot)
            .map_err(js)?
            .map(|r| r.requirement.to_string()))
    }

    /// Writes the reply bytes (see [`interop`]) of a request answered without its handler
    /// at `outPtr()` in the module's memory; returns their length. They stay there until
    /// the next call on this engine.
    pub fn reply(&mut self, slot: u32) -> u32 {
        self.host.reply(slot).len() as u32
    }

    /// Where `reply` wrote (an address in the module's memory).
    #[wasm_bindgen(js_name = outPtr)]
    pub fn out_ptr(&self) -> u32 {
        self.host.out_ptr() as u32
    }
}

/// The in-process store: idem-core's `MemoryStore` (a hash map with a deadline index,
/// limits on entries and bytes), inside the module.
#[wasm_bindgen]
pub struct Records {
    store: idem_core::MemoryStore,
}

impl Records {
    /// Every write to the store goes through here: a store that grows grows the module's
    /// memory, which then grows in a large step ([`headroom`]).
    fn write<T>(&mut self, f: impl FnOnce(&mut idem_core::MemoryStore) -> T) -> T {
        let out = f(&mut self.store);
        headroom::keep();
        out
    }
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
        self.write(|records| {
            host::store_apply(
                records,
                interop::millis(now),
                key,
                expect.as_deref(),
                value.as_deref(),
            )
        })
        .map(|a| a as u8)
        .map_err(js)
    }
}

/// The write bytes (see [`interop`]; the expected version is filled in by the store) that
/// apply the passage of time to a stored record at `now` (drop an expired response, delete an
/// expired key), or `undefined` when nothing is due (`IDEM-TTL-4`). Throws a `RangeError`
/// (`IDEM-REC-1`) for bytes that are not a record.
#[wasm_bindgen]
pub fn expire(now: f64, value: &[u8]) -> JsResult<Option<Vec<u8>>> {
    Ok(host::expire(interop::millis(now), value)
        .map_err(js)?
        .map(|w| {
            let mut out = Vec::new();
            w.encode_into(&mut out);
            out
        }))
}

/// For a store that drops a record's response when the response expires, apart from the
/// record (`IDEM-STORE-9`): the bytes of the record as it stands once its response has
/// expired (its tombstone, the same version), or `undefined` when the record holds no
/// response that expires before it. Throws a `RangeError` (`IDEM-REC-1`) for bytes that are
/// not a record.
#[wasm_bindgen(js_name = responseApart)]
pub fn response_apart(value: &[u8]) -> JsResult<Option<Vec<u8>>> {
    let record =
        idem_core::decode_record(value).map_err(|e| js(interop::ErrorParts::record(&e)))?;
    Ok(idem_core::stores::response_apart(&record).map(|(held, _)| idem_core::encode_record(&held)))
}

/// What the Redis key of a record's response adds to the record's key
/// ([`idem_core::stores::REDIS_RESPONSE_SUFFIX`]).
#[wasm_bindgen(js_name = redisResponseSuffix)]
pub fn redis_response_suffix() -> String {
    String::from(idem_core::stores::REDIS_RESPONSE_SUFFIX)
}

/// The module's memory, where `Engine.reply` leaves its bytes.
#[wasm_bindgen(js_name = wasmMemory)]
pub fn wasm_memory() -> JsValue {
    wasm_bindgen::memory()
}

/// The names of the delivery outcomes in index order, comma-separated (a
/// [`DeliveryOutcome`] is an index): the core's.
#[wasm_bindgen(js_name = deliveryNames)]
pub fn delivery_names() -> String {
    interop::delivery_names().0
}

/// The delivery outcomes whose sender is told the message was received, as a bit mask over
/// their indices.
#[wasm_bindgen(js_name = acknowledgedMask)]
pub fn acknowledged_mask() -> u32 {
    interop::delivery_names().1
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

/// The header a replay carries, lowercase (idem-core's
/// [`REPLAYED_HEADER`](idem_core::REPLAYED_HEADER)). JavaScript learns that a reply is a
/// replay from its [`ReplyFlag`](interop::ReplyFlag), never from its headers; this is for
/// the checks that both agree.
#[wasm_bindgen(js_name = replayedHeader)]
pub fn replayed_header() -> String {
    String::from(idem_core::REPLAYED_HEADER)
}

/// What every problem `type` of idem's own starts with (`urn:idem:problem:`): the core's
/// [`Problem`](idem_core::Problem) types, as one of them writes it.
#[wasm_bindgen(js_name = problemTypePrefix)]
pub fn problem_type_prefix() -> String {
    let p = idem_core::Problem::MISSING_KEY;
    String::from(p.type_uri.strip_suffix(p.slug).unwrap_or(p.type_uri))
}
