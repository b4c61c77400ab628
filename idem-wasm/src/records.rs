//! The in-process store's bindings: [`Records`], idem-core's `MemoryStore` inside the module,
//! and the record helpers the JavaScript stores use (expiry, a response kept apart, the Redis
//! key of a response).

use crate::headroom;
use crate::host;
use crate::interop;
use crate::{js, JsResult};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use wasm_bindgen::prelude::*;

/// The in-process store: idem-core's `MemoryStore` (a hash map with a deadline index,
/// limits on entries and bytes), inside the module.
#[wasm_bindgen]
pub struct Records {
    store: idem_core::MemoryStore,
}

impl Records {
    /// Every write to the store goes through here: a store that grows grows the module's
    /// memory, which then grows in a large step ([`headroom`]).
    pub(crate) fn write<T>(&mut self, f: impl FnOnce(&mut idem_core::MemoryStore) -> T) -> T {
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

/// What a sweep does with a due record it cannot open (sealed under a key the store does not
/// hold): `undefined` to delete it now, or the time (ms) it is due again, from `expires`, until
/// when it must be kept (idem-core's [`unopened_due`](idem_core::stores::unopened_due)).
#[wasm_bindgen(js_name = unopenedDue)]
pub fn unopened_due(now: f64, expires: f64) -> Option<f64> {
    idem_core::stores::unopened_due(interop::millis(expires), interop::millis(now))
        .map(interop::to_ms)
}

/// How long one call to a network store may take, in milliseconds, unless its host says
/// otherwise (idem-core's [`CALL_TIMEOUT`](idem_core::stores::CALL_TIMEOUT)).
#[wasm_bindgen(js_name = storeTimeoutMs)]
pub fn store_timeout_ms() -> f64 {
    idem_core::stores::CALL_TIMEOUT.as_millis() as f64
}

/// The Redis keys of the record with `storage_key` under `prefix` (`undefined`: idem-core's
/// default, `idem:`): the record's and its response's, as every Redis store names them
/// ([`idem_core::stores::redis_keys`]).
#[wasm_bindgen(js_name = redisKeys)]
pub fn redis_keys(prefix: Option<String>, storage_key: &str) -> Vec<String> {
    let prefix = prefix.as_deref().unwrap_or(idem_core::stores::REDIS_PREFIX);
    idem_core::stores::redis_keys(prefix, storage_key).to_vec()
}
