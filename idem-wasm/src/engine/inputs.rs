//! What JavaScript reports back for a slot's step: the record it read, whether its write was
//! applied, a store that failed, a Durable Object's claim, the handler's outcome, a heartbeat
//! asked for.

use super::Engine;
use crate::interop::{self, HeartbeatState, Ran};
use crate::{js, JsResult};
use alloc::vec::Vec;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
impl Engine {
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

    /// The store failed on the last step: unavailable, full (`IDEM-STORE-3`), or a sealed
    /// record it cannot open (`IDEM-SEAL-3`).
    #[wasm_bindgen(js_name = storeFailed)]
    pub fn store_failed(&mut self, slot: u32, failure: interop::StoreFailed) -> JsResult<()> {
        self.host.store_failed(slot, failure.into()).map_err(js)
    }

    /// The store let go of the handler's own writes, uncommitted, as the attempt ended
    /// ([`idem_core::Request::handle_writes_dropped`]): a request that finished with a store
    /// failure answers 503 instead of its handler's response (`IDEM-STORE-7`).
    #[wasm_bindgen(js_name = writesDropped)]
    pub fn writes_dropped(&mut self, slot: u32) -> JsResult<()> {
        self.host.writes_dropped(slot).map_err(js)
    }

    /// What a Durable Object claimed for a `Claim` step. Throws a `RangeError`
    /// (`IDEM-JS-2`).
    pub fn claimed(&mut self, slot: u32, now: f64, bytes: &[u8]) -> JsResult<()> {
        self.host
            .claimed(slot, interop::millis(now), bytes)
            .map_err(js)
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
}
