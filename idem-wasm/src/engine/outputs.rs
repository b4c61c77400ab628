//! What JavaScript reads from a slot: the write of an `Apply` step, the bytes a Durable Object
//! exchanges, the events, the handler's context, the refusal, and the reply and context
//! bytes it reads in place at `outPtr()`.

use super::Engine;
use crate::interop::{self, HeartbeatState};
use crate::{js, JsResult};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
impl Engine {
    /// Writes the write of the last `Apply` step as write bytes (see [`interop`]) at
    /// `outPtr()`; returns their length. They stay there until the next call on this engine.
    #[wasm_bindgen(js_name = takeWrite)]
    pub fn take_write(&mut self, slot: u32) -> JsResult<u32> {
        let write = self.host.take_write(slot).map_err(js)?;
        Ok(self.host.write_out(&write).len() as u32)
    }

    /// The largest response body the store keeps (`IDEM-STORE-5`): a host holds no more of
    /// a response than this, and reports a longer one as `Ran.Oversized`.
    #[wasm_bindgen(getter, js_name = maxResponseBytes)]
    pub fn max_response_bytes(&self) -> u32 {
        // At most 16 MiB (idem-core's record limit).
        u32::try_from(self.host.policy().max_response_bytes()).unwrap_or(u32::MAX)
    }

    /// What a Durable Object sends back after the claim of a resumed slot.
    #[wasm_bindgen(js_name = claimedBytes)]
    pub fn claimed_bytes(&self, slot: u32) -> JsResult<Vec<u8>> {
        self.host.claimed_bytes(slot).map_err(js)
    }

    /// The ticket a Durable Object needs to claim for this request, which it claims with the
    /// nonce of these halves: a record its claim creates is withdrawn when its answer is lost.
    pub fn ticket(&mut self, slot: u32, nonce_hi: u32, nonce_lo: u32) -> JsResult<Vec<u8>> {
        let nonce = interop::u64_from_halves(nonce_hi, nonce_lo);
        self.host.ticket(slot, nonce).map_err(js)
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

    /// The record's digest for telemetry (32 hex digits: neither the key nor the
    /// principal), or undefined for a request refused before it had a key (`IDEM-EVT-2`).
    #[wasm_bindgen(js_name = keyDigest)]
    pub fn key_digest(&self, slot: u32) -> JsResult<Option<String>> {
        self.host.key_digest(slot).map_err(js)
    }

    /// The slot's operation, as an index into `telemetryNames().spans`.
    #[wasm_bindgen(js_name = operationIndex)]
    pub fn operation_index(&self, slot: u32) -> JsResult<u32> {
        self.host.operation_index(slot).map_err(js)
    }

    /// The telemetry's `error.type` for the slot's answer with `status`: the problem's slug
    /// for idem's own problems, the status for another answer of 500 or more, else
    /// undefined.
    #[wasm_bindgen(js_name = errorType)]
    pub fn error_type(&self, slot: u32, status: u16) -> JsResult<Option<String>> {
        self.host.error_type(slot, status).map_err(js)
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
