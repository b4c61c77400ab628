//! The client's counter numbering: [`CounterSequence`], idem-core's, for counter keys.

use crate::interop::{self, ErrorParts};
use crate::{js, JsResult};
use alloc::string::String;
use alloc::vec::Vec;
use wasm_bindgen::prelude::*;

/// One client's numbering for counter keys (idem-core's `CounterSequence`): the next number
/// for each new logical request, and the low-water mark to send. Numbers cross as decimal
/// text: they may not fit a JavaScript number.
#[wasm_bindgen]
pub struct CounterSequence {
    inner: idem_core::CounterSequence,
}

#[wasm_bindgen]
impl CounterSequence {
    /// The numbering of `client` in session `epoch` (decimal text), `bits` wide, from
    /// `firstSeq` (decimal text). Throws a `RangeError` (`IDEM-CTR-1`).
    #[wasm_bindgen(constructor)]
    pub fn new(client: &str, epoch: &str, bits: u8, first_seq: &str) -> JsResult<CounterSequence> {
        let epoch = interop::decimal("epoch", epoch).map_err(js)?;
        let first = interop::decimal("firstSeq", first_seq).map_err(js)?;
        idem_core::CounterSequence::new(client, epoch, bits, first)
            .map(|inner| CounterSequence { inner })
            .map_err(|e| js(interop::sequence_error(&e)))
    }

    /// The client id.
    #[wasm_bindgen(getter)]
    pub fn client(&self) -> String {
        String::from(self.inner.client())
    }

    /// The session epoch, decimal.
    #[wasm_bindgen(getter)]
    pub fn epoch(&self) -> String {
        interop::decimal_text(self.inner.epoch())
    }

    /// The number for a new logical request, decimal.
    pub fn take(&mut self) -> String {
        interop::decimal_text(self.inner.take())
    }

    /// The key of number `seq`: `client:epoch:seq`.
    pub fn key(&self, seq: &str) -> JsResult<String> {
        Ok(self.inner.key(interop::decimal("seq", seq).map_err(js)?))
    }

    /// The low-water mark to send, decimal.
    #[wasm_bindgen(js_name = lowWater)]
    pub fn low_water(&self) -> String {
        interop::decimal_text(self.inner.low_water())
    }

    /// The answer for `seq` arrived (or it was given up for good).
    pub fn done(&mut self, seq: &str) -> JsResult<()> {
        self.inner.done(interop::decimal("seq", seq).map_err(js)?);
        Ok(())
    }

    /// The state, to persist after every change.
    pub fn encode(&self) -> Vec<u8> {
        self.inner.to_bytes()
    }

    /// A persisted state. Throws a `RangeError` (`IDEM-JS-2`) for bytes that are not one.
    #[wasm_bindgen(js_name = fromBytes)]
    pub fn from_bytes(bytes: &[u8]) -> JsResult<CounterSequence> {
        idem_core::CounterSequence::from_bytes(bytes)
            .map(|inner| CounterSequence { inner })
            .ok_or_else(|| {
                js(ErrorParts::range(
                    interop::CODE_WIRE,
                    "malformed counter sequence",
                ))
            })
    }
}
