//! The operations beside the guarded request, each opened in a slot and driven like any
//! request: a token issued, a counter session opened, a message delivered to the inbox, a
//! status query answered, a body refused by its declared or read size.

use super::Engine;
use crate::interop::{self, DeliveryOutcome};
use crate::{js, JsResult};
use alloc::string::String;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
impl Engine {
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

    /// Opens the slot of a status query (`IDEM-STATUS-1`, a `GET` with `Idempotency-Status`)
    /// about the key in the key header value `key` (`undefined` when there is none) of the
    /// requests of `principal` to `route`; `field` is the `Idempotency-Status` value. Driven
    /// like any request, it answers 200 with the status document
    /// (`application/vnd.idem.key-status+json`), or the core's refusal. `client` is the
    /// client of a unix-time key that names none (`timeKeys.clientHeader`'s value), as
    /// `begin` takes it.
    #[allow(clippy::too_many_arguments)]
    pub fn status(
        &mut self,
        principal: Option<String>,
        route: &str,
        key: Option<String>,
        field: &str,
        client: Option<String>,
        nonce_hi: u32,
        nonce_lo: u32,
    ) -> u32 {
        self.host.status(
            principal.as_deref(),
            route,
            key.as_deref(),
            field,
            client.as_deref(),
            interop::u64_from_halves(nonce_hi, nonce_lo),
        )
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
}
