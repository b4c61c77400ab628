//! The engine's bindings: [`Engine`], idem-core's policy with the requests in flight, each in
//! a numbered slot of the [`Host`]. Each method converts its arguments, calls the host, and
//! converts the answer: the slots and their steps are here; what JavaScript reports back is
//! in [`inputs`], what it reads in [`outputs`], and the operations beside the guarded request
//! (tokens, sessions, inbox deliveries, a body refused by its size) in [`operations`].

use crate::from_js::engine_options;
use crate::host::{Host, Incoming};
use crate::interop::{self, StepKind};
use crate::records::Records;
use crate::{js, JsResult};
use alloc::string::String;
use wasm_bindgen::prelude::*;

mod inputs;
mod operations;
mod outputs;

/// The idempotency engine with its policy, and the requests in flight, each in a numbered
/// slot (see [`host`](crate::host)).
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

    /// Whether a request with this method (and a key or not) needs its body to be identified:
    /// a host that reads bodies before routing leaves the others unread.
    #[wasm_bindgen(js_name = readsBody)]
    pub fn reads_body(&self, method: &str, has_key: bool) -> bool {
        self.host.reads_body(method, has_key)
    }

    /// Identifies a request and opens its slot: the key header (`undefined` when absent),
    /// the principal (`undefined` for a single-tenant host), method, route, target,
    /// content type, the fingerprint headers as a flat list text, the body, a counter
    /// client's low-water mark, the client of a unix-time key that names none
    /// (`timeKeys.clientHeader`'s value), and 64 random bits (the first version of a record
    /// it creates). A request that cannot be identified
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
        client: Option<String>,
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
            client: client.as_deref(),
        };
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host.begin(&req, nonce).map_err(js)
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
}

/// The module's memory, where `Engine.reply` leaves its bytes.
#[wasm_bindgen(js_name = wasmMemory)]
pub fn wasm_memory() -> JsValue {
    wasm_bindgen::memory()
}
